"""Tables of docs/ made from the repository's own data are that data."""

from __future__ import annotations

from benchmarks.record import docs_table, recorded
from infra.stack.keys import PROJECT_DIR


def test_the_performance_table_is_the_recorded_figures() -> None:
    text = (PROJECT_DIR / "docs" / "performance.md").read_text()

    assert docs_table(recorded()) in text
