"""How a program ends on a stop signal (`terminal.exit_on_signals`), in a real process."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from common.terminal import escaped

REPO = Path(__file__).resolve().parents[3]

# A stop whose SystemExit becomes another error as it unwinds: CPython's import machinery did
# that to a SIGTERM landing in `from _thread import _ThreadHandle` (TypeError: expected a
# message argument), exit 1 with a traceback, once in ~10 test runs of a render stopped early.
_UNWOUND_BADLY = """
import os, signal
from common.terminal import exit_on_signals
exit_on_signals("prog")
try:
    os.kill(os.getpid(), signal.SIGTERM)
except SystemExit:
    raise TypeError("expected a message argument")
"""


def test_a_stop_that_unwinds_into_another_error_still_ends_as_the_stop() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _UNWOUND_BADLY], cwd=REPO, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip

    assert done.returncode == 143, done.stderr
    assert done.stderr.splitlines() == ["prog: stopped by SIGTERM"]


def test_an_error_without_a_stop_is_still_a_traceback() -> None:
    code = "from common.terminal import exit_on_signals\nexit_on_signals('p')\n1 / 0\n"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip

    assert done.returncode == 1
    assert "ZeroDivisionError" in done.stderr


# Busy in C (sum over a range runs no bytecode, so no signal handler) while a burst comes in:
# Python then runs the pending handlers in signal-number order, SIGHUP (1) before SIGTERM (15).
_BUSY_IN_C = """
from common.terminal import exit_on_signals
exit_on_signals("prog")
print("ready", flush=True)
sum(range(3 * 10**8))
"""


def test_a_burst_that_comes_while_busy_in_c_is_decided_by_the_first_to_arrive() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", _BUSY_IN_C], cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    ) as proc:  # fmt: skip
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        time.sleep(0.2)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            proc.send_signal(sig)
            time.sleep(0.05)
        _, stderr = proc.communicate(timeout=60)

    assert proc.returncode == 143, stderr
    assert stderr.splitlines() == ["prog: stopped by SIGTERM"]


def test_invisible_characters_that_reorder_or_hide_text_are_escaped_as_control_ones_are() -> None:
    """A bidi override or a zero-width space passed through to the terminal raw."""
    said = "bidi:\u202eevil\u202c zw:\u200b isolate:\u2066x\u2069 bom:\ufeff tab:\t"

    assert escaped(said) == (
        "bidi:\\u202eevil\\u202c zw:\\u200b isolate:\\u2066x\\u2069 bom:\\ufeff tab:\\t"
    )
    assert escaped("é 密码 Ω ok") == "é 密码 Ω ok"  # letters of any script are kept
