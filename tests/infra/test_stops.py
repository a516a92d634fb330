"""Signals and stops: a Ctrl-C, SIGTERM or a burst of stop signals during a render, a deploy (its
`pulumi version` check or its engine) or the program's imports is one stop, said in one line,
ending with that signal's code, leaving no half render and no `pulumi` running."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.commands.render import MARKER
from infra.stack.keys import PROJECT_DIR
from tests.infra.helpers import DEPLOY, RENDER, _fake_pulumi, _handling_signals, _preview


@pytest.mark.parametrize("delay", [0.3, 1.2, 2.0])
def test_ctrl_c_during_a_render_is_one_line_and_leaves_no_half_render(
    tmp_path: Path, delay: float
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", RENDER, "--stack", "local", "--out", "out"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(PROJECT_DIR)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    _handling_signals(proc)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)

    if proc.returncode == 0:  # it finished first: nothing to see
        return
    assert proc.returncode == 130, stderr
    assert stderr.splitlines() == ["render: stopped by SIGINT"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.")] == []


def test_a_sigterm_during_a_render_leaves_nothing_half_written(tmp_path: Path) -> None:
    for delay in (0.5, 1.6, 1.9, 2.1):
        out = tmp_path / f"out-{delay}"
        proc = subprocess.Popen(
            [sys.executable, "-m", RENDER, "--stack", "dev", "--out", str(out)],
            env={**os.environ, "PYTHONPATH": str(PROJECT_DIR)}, stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        _handling_signals(proc)
        time.sleep(delay)
        proc.terminate()
        _, stderr = proc.communicate(timeout=60)

        assert proc.returncode in (0, 143), stderr
        assert "Traceback" not in stderr
        if proc.returncode == 143:
            assert stderr.splitlines() == ["render: stopped by SIGTERM"]
            # none, or a whole one (the signal came after the swap): never a part
            assert not out.exists() or (out / MARKER).is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_burst_of_different_stop_signals_is_one_line_and_the_first_ones_code(
    tmp_path: Path,
) -> None:
    """Each signal of a burst said its own line, and a later one's SystemExit escaped as a
    traceback from inside the import machinery."""
    for _ in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-m", RENDER, "--stack", "dev", "--out", "out"],
            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(PROJECT_DIR)},
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        _handling_signals(proc)
        for sig in (signal.SIGUSR2, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGINT):
            proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)

        assert 128 < proc.returncode < 160, stderr
        assert stderr.splitlines() == [
            f"render: stopped by {signal.Signals(proc.returncode - 128).name}"
        ]


def test_stop_signals_a_few_ms_apart_are_one_stop_not_a_death_in_the_exit(
    tmp_path: Path,
) -> None:
    """The second, landing while the first unwinds the program, met the default that Python's
    finalization puts back: killed (-15) after saying it stopped by the first."""
    for _ in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-m", RENDER, "--stack", "dev", "--out", "out"],
            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(PROJECT_DIR)},
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        _handling_signals(proc)
        time.sleep(0.5)  # into its imports or its work
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
            time.sleep(0.02)
        _, stderr = proc.communicate(timeout=60)

        assert proc.returncode == 128 + signal.SIGINT, stderr
        assert stderr.splitlines() == ["render: stopped by SIGINT"]


def test_after_the_work_a_stop_signal_is_ignored_not_left_to_finalization(tmp_path: Path) -> None:
    # The interpreter's finalization puts SIG_DFL back for a handler written in Python: a
    # SIGTERM then, with the render written, killed it silently (-15). Ignored, it exits 0.
    program = (
        "import atexit, sys\n"
        "from infra.commands.interrupt import guard\n"
        "def show():\n"
        "    status = dict(l.split(':', 1) for l in open('/proc/self/status'))\n"
        "    print(int(status['SigIgn'], 16) >> 14 & 1, int(status['SigCgt'], 16) >> 14 & 1)\n"
        "atexit.register(show)\n"
        "guard(lambda: 0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=tmp_path, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(PROJECT_DIR)}, timeout=60, check=False,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "0"]  # SIGTERM (bit 14): ignored, not caught


_STOP_SWALLOWED = """
import os, signal
from infra.commands.interrupt import exit_quietly, guard
exit_quietly("prog")
try:
    os.kill(os.getpid(), signal.SIGTERM)
except SystemExit:
    pass  # swallowed, as code being imported may do
guard(lambda: 0)
"""


def test_a_stop_said_in_the_imports_whose_exit_was_swallowed_still_ends_as_that_stop(
    tmp_path: Path,
) -> None:
    """The program ran on after the stop was said, and exited 0."""
    done = subprocess.run(
        [sys.executable, "-c", _STOP_SWALLOWED], cwd=PROJECT_DIR, capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip

    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    assert done.stderr.splitlines() == ["prog: stopped by SIGTERM"]


def _alive(pid: int) -> bool:
    """Running: not gone, and not a zombie (an orphan's, which this machine's init may leave
    unreaped a while)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP])
def test_a_stop_while_pulumi_version_hangs_kills_it_and_leaves_nothing_running(
    tmp_path: Path, sig: signal.Signals
) -> None:
    pids = tmp_path / "pids"
    script = f"#!/bin/sh\necho $$ >> {pids}; sleep 3600 & echo $! >> {pids}; wait\n"
    path = _fake_pulumi(tmp_path / "bin", script)
    proc = _preview(tmp_path, path)
    assert proc.stderr is not None
    assert "deploy: waiting for" in proc.stderr.readline()  # after 1 s of no answer
    proc.send_signal(sig)
    _, rest = proc.communicate(timeout=60)

    assert proc.returncode == 128 + sig, rest
    assert rest.splitlines() == [f"deploy: stopped by {sig.name}"]
    started = [int(pid) for pid in pids.read_text().split()]
    assert len(started) == 2  # `pulumi version` and what it started
    assert [pid for pid in started if _alive(pid)] == []


def test_a_stop_during_the_engine_is_said_at_once_and_a_second_stop_kills_it(
    tmp_path: Path,
) -> None:
    # a `pulumi` whose operation ignores the SIGINT it is sent (a step that must finish)
    script = (
        '#!/bin/sh\nif [ "$1" = version ]; then echo v3.277.0; exit 0; fi\n'
        "trap '' INT\nsleep 300 & wait\n"
    )
    path = _fake_pulumi(tmp_path / "bin", script)
    env = {**os.environ, "PYTHONPATH": str(PROJECT_DIR), "PATH": path}
    with subprocess.Popen(
        [sys.executable, "-m", DEPLOY, "preview", "--stack", "local"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) as proc:  # fmt: skip
        assert proc.stdout is not None
        assert proc.stderr is not None
        try:
            assert "the engine's output follows" in proc.stdout.readline()
            time.sleep(1)  # into the engine's first command
            proc.send_signal(signal.SIGTERM)
            time.sleep(2)
            assert proc.poll() is None  # waiting for pulumi to cancel, as it should
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=30)
        finally:
            proc.kill()
        stderr = proc.stderr.read()

    assert code == 128 + signal.SIGTERM, stderr
    assert "deploy: asked `pulumi` to cancel; waiting for it to end" in stderr
    assert "deploy: killed `pulumi`" in stderr


def test_a_burst_of_stop_signals_during_the_engine_is_one_stop_not_a_kill(
    tmp_path: Path,
) -> None:
    """TERM, INT, HUP... back to back (a supervisor, one `kill` of several) killed `pulumi`,
    which may leave the stack locked: they are the first stop, and `pulumi` cancels."""
    script = (
        '#!/bin/sh\nif [ "$1" = version ]; then echo v3.277.0; exit 0; fi\n'
        "trap 'exit 130' INT\nsleep 300 & wait\n"
    )
    path = _fake_pulumi(tmp_path / "bin", script)
    env = {**os.environ, "PYTHONPATH": str(PROJECT_DIR), "PATH": path}
    with subprocess.Popen(
        [sys.executable, "-m", DEPLOY, "preview", "--stack", "local"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) as proc:  # fmt: skip
        assert proc.stdout is not None
        try:
            assert "the engine's output follows" in proc.stdout.readline()
            time.sleep(1)  # into the engine's first command
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
                proc.send_signal(sig)
            _, stderr = proc.communicate(timeout=60)
        finally:
            proc.kill()

    sent = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1}
    assert proc.returncode - 128 in sent, stderr  # the first the process took
    assert (
        stderr.splitlines()[-1]
        == f"deploy: stopped by {signal.Signals(proc.returncode - 128).name}"
    )
    assert stderr.count("deploy: asked `pulumi` to cancel") == 1
    assert "killed" not in stderr
