"""Suite-wide policy: a skip is only acceptable when it names a missing optional peer."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# Tests that cannot run here must say which optional peer is missing, with this prefix;
# any other skip turns the run red so that nothing skips its way to green.
PEER_SKIP_PREFIX = "missing optional peer:"

_bad_skips: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else ""
        if PEER_SKIP_PREFIX not in reason:
            _bad_skips.append(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _bad_skips and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _bad_skips:
        terminalreporter.write_line(
            f"skips without '{PEER_SKIP_PREFIX} …' reason fail the run:", red=True
        )
        for line in _bad_skips:
            terminalreporter.write_line(f"  {line}", red=True)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A dir any user may write in, on a path any user may walk (pytest's tmp_path is root's):
    for what must run as `nobody` (CI runs as root, which reads and writes anywhere)."""
    shared = Path(tempfile.mkdtemp(prefix="lingjun-shared-"))
    shared.chmod(0o777)
    yield shared
    shutil.rmtree(shared, ignore_errors=True)
