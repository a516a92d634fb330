"""Ctrl-C and the other stop signals (terminal.STOPS) in the infra commands: one line, and exit
128+n of the first, wherever they land: in the imports (Pulumi's SDKs are most of a short run), in
the work (which unwinds, removing what it half wrote), in an asyncio loop (deferred to its end),
or in a callback that swallows the exception (remembered and said at the exit). Imported first by
a command run as a program."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Generator
from contextlib import contextmanager
from typing import Any, NoReturn

from common.terminal import STOPS, exit_on_signals, first_stop, say, stopped

_prog = ""
_received: int | None = None
_deferring = False


def exit_quietly(prog: str) -> None:
    """While the program imports: a signal ends it at once (nothing to clean up yet)."""
    global _prog
    _prog = prog
    exit_on_signals(prog)


def guard(main: Callable[[], int], *, on_signal: Callable[[int], None] | None = None) -> NoReturn:
    """Exit with main()'s code. A signal raises KeyboardInterrupt where it lands, after
    `on_signal(signum)` (e.g. to pass it on to a child process)."""

    def interrupt(signum: int, frame: object) -> None:
        global _received
        first = stopped(signum)  # one record with exit_quietly's: the first of a burst decides
        if first is not None:
            _received = first
        if on_signal is not None:
            on_signal(signum)
        if first is not None and not _deferring:
            raise KeyboardInterrupt

    for sig in STOPS:
        signal.signal(sig, interrupt)
    if _received is None and (earlier := first_stop()) is not None:
        # a stop in the imports, said, whose SystemExit something there swallowed: a later
        # signal of the burst would otherwise be taken for the first
        for sig in STOPS:
            signal.signal(sig, signal.SIG_IGN)
        sys.exit(128 + earlier)
    hook = sys.unraisablehook

    def quiet(unraisable: Any) -> None:  # a KeyboardInterrupt raised inside a callback
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            hook(unraisable)

    sys.unraisablehook = quiet
    try:
        code = main()
    except KeyboardInterrupt:
        code = -1

    # From here on a signal raises nothing: Python waits for the threads of the run (Pulumi's
    # read a child's output to its end) before it exits, and an exception would break that.
    # `on_signal` still runs: a second stop signal while a child is cancelling must reach it.
    # Without one the signal is ignored: the work is done, and the interpreter's finalization
    # puts back the default (a silent death) for any handler written in Python.
    def at_exit(signum: int, frame: object) -> None:
        if on_signal is not None:
            on_signal(signum)

    for sig in STOPS:
        signal.signal(sig, signal.SIG_IGN if on_signal is None else at_exit)
    if _received is not None and code != 128 + _received:
        _say(_received)
        code = 128 + _received
    sys.exit(code)


@contextmanager
def deferred() -> Generator[None]:
    """A block a signal must not break into (an asyncio loop: an exception raised inside its
    callbacks corrupts its tasks): the signal takes effect as the block ends."""
    global _deferring
    _deferring = True
    try:
        yield
    finally:
        _deferring = False
    if _received is not None:
        raise KeyboardInterrupt


def children(pid: int | None = None) -> list[int]:
    """The child processes of `pid` (default: this one), from /proc: no library needed."""
    parent = os.getpid() if pid is None else pid
    found: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent:
            found.append(int(entry))
    return found


def descendants() -> list[int]:
    """Every process this one started, and every one they started (plugins, shells' jobs)."""
    found: list[int] = []
    todo = children()
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children(pid)
    return found


def _say(signum: int) -> None:
    say(f"{_prog}: stopped by {signal.Signals(signum).name}")
