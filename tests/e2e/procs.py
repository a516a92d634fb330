"""Processes the e2e run owns: started, waited for, stopped by pid, their logs kept."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def eventually(check: Callable[[], T], timeout: float, what: str, interval: float = 0.25) -> T:
    """Poll `check` until it returns a truthy value; fail naming `what` and the last value."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            last = check()
        except AssertionError:
            raise  # a verdict (a process died, a pod failed): no point waiting any longer
        except Exception as exc:  # a peer still starting answers with errors: keep polling
            last = exc
        else:
            if last:
                return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}: {last!r}")
        time.sleep(interval)


class Proc:
    """One child process with its output appended to `log`."""

    def __init__(self, name: str, argv: list[str], log: Path, cwd: Path | None = None) -> None:
        self.name = name
        self.argv = argv
        self.log = log
        self.cwd = cwd
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        assert self.popen is None or self.popen.poll() is not None, f"{self.name} is running"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            out.write(f"\n==== start: {' '.join(self.argv)}\n".encode())
            out.flush()
            # own session: a Ctrl-C on the test run reaches pytest, which then stops us in order
            self.popen = subprocess.Popen(
                self.argv, stdout=out, stderr=out, stdin=subprocess.DEVNULL, cwd=self.cwd,
                start_new_session=True,
            )  # fmt: skip
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def check_alive(self) -> None:
        if self.popen is not None and self.popen.poll() is not None:
            raise AssertionError(
                f"{self.name} exited with {self.popen.returncode}; its log ends:\n{self.tail()}"
            )

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int | None:
        """Signal the process by pid, wait; SIGKILL it if it outlives `timeout`."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            os.kill(self.popen.pid, sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)
        return self.popen.returncode

    def tail(self, lines: int = 40) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def run(argv: list[str], timeout: float = 60, check: bool = True) -> str:
    """A short command; its stderr goes into the error when it fails."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout
