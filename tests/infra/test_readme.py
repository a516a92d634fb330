"""The README's troubleshooting tables are the code's: every Event reason the node agent posts
and every alert of the pack has its row, with a cause and what to do."""

from __future__ import annotations

import re

from infra.components.alerts import alerts
from infra.stack.keys import PROJECT_DIR
from plugin.core.node import problems

README = (PROJECT_DIR / "README.md").read_text()


def _rows(heading: str) -> dict[str, list[str]]:
    """The table under the paragraph starting with `heading`: first-column names -> the row."""
    section = README[README.index(heading) :]
    table = section[: section.index("\n\n", section.index("\n|"))]
    rows: dict[str, list[str]] = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        for name in re.findall(r"`(Rdma\w+)`", cells[0]):
            rows[name] = cells[1:]
    return rows


def test_every_event_reason_has_its_cause_and_fix_in_the_readme() -> None:
    reasons = {v for k, v in vars(problems).items() if k.isupper() and k != "FIXES"}

    rows = _rows("**Events on the Node**")

    assert set(rows) == reasons
    assert reasons == set(problems.FIXES)
    assert all(len(cells) == 2 and all(cells) for cells in rows.values())


def test_every_alert_has_its_cause_and_fix_in_the_readme() -> None:
    pack = {a.name for a in alerts("j", 5, port_counters=True, non_host_network=True)}

    rows = _rows("**Alerts**")

    assert set(rows) == pack
    assert all(len(cells) == 2 and all(cells) for cells in rows.values())
