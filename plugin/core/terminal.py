"""What the project's command-line programs print: help on stdout, one line per problem on
stderr. Neither ends in a traceback when its stream cannot take it (full, closed): the exit
code still says what happened."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _typeshed import SupportsWrite


def say(line: str) -> None:
    """One line on stderr, if stderr can take it."""
    if sys.stderr is not None:
        with contextlib.suppress(OSError):
            print(line, file=sys.stderr, flush=True)


class Parser(argparse.ArgumentParser):
    """argparse with the program's docstring laid out as written, and no traceback from a
    help or an error that cannot be printed."""

    def __init__(self, prog: str, description: str | None) -> None:
        super().__init__(
            prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
        )

    def print_help(self, file: SupportsWrite[str] | None = None) -> None:
        try:  # the help goes to stdout (argparse passes no other file for it)
            if sys.stdout is None:
                raise OSError("stdout is closed")
            sys.stdout.write(self.format_help())
            sys.stdout.flush()
        except OSError as exc:
            say(f"{self.prog}: cannot write the help to stdout ({exc.strerror or exc})")
            sys.exit(1)

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        if message:
            say(message.rstrip("\n"))
