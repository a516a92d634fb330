"""Ctrl-C in the infra commands: one line and exit 130 wherever it lands, in the imports too
(Pulumi's SDKs are most of a short run). Imported first by a command run as a program."""

from __future__ import annotations

import signal
import sys
from typing import NoReturn


def exit_quietly(prog: str) -> None:
    def stop(signum: int, frame: object) -> None:
        print(f"{prog}: interrupted", file=sys.stderr)
        raise SystemExit(130)  # unwinds like an error (a half-written render is removed)

    signal.signal(signal.SIGINT, stop)


def done(code: int) -> NoReturn:
    """Exit with `code`, ignoring a Ctrl-C from now on: Python puts the default handler back
    while it shuts down (Pulumi's threads make that take a while), and a late Ctrl-C would
    kill a finished run with a traceback-less -2."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(code)
