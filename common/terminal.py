"""What the project's programs print: help and output on stdout, one line per problem on
stderr, a peer's words quoted as one bounded line. Neither stream ends in a traceback when it
cannot take what is written (full, closed): the exit code still says what happened."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import logging
import os
import re
import signal
import sys
import weakref
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:  # asyncio only then: its import (~25 ms) delayed the stop signals' handlers
    import asyncio

    from _typeshed import SupportsWrite


def say(line: str) -> None:
    """One line on stderr, bounded as a peer's text is (a 5000 character path quoted in it made
    a 5107 character line), its control characters escaped (a path with a line break in it
    made two lines, the second looking like the program's own). A caller with several
    problems says each. If stderr can take it."""
    bounded = one_line(line, SAID_MAX, keep_end=True)
    if sys.stderr is not None:
        with contextlib.suppress(OSError):
            print(bounded, file=sys.stderr, flush=True)


def write_stdout(text: str) -> None:
    """`text` on stdout, or OSError. A stdout that failed is pointed at /dev/null: Python's
    flush at exit would otherwise print its own BrokenPipeError and exit 120. What a stdout
    cannot encode (PYTHONIOENCODING=ascii, a path with a 'ü') is backslash-escaped, as on
    stderr."""
    stdout = sys.stdout
    if stdout is None:
        raise OSError(errno.EBADF, "stdout is closed")
    try:
        encoding = stdout.encoding or "utf-8"
        stdout.write(text.encode(encoding, "backslashreplace").decode(encoding))
        stdout.flush()
    except OSError:
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), stdout.fileno())
        raise


# Control characters, and the Unicode line and paragraph separators: what would break a log
# line, or forge one.
# Control characters, line and paragraph separators, and the invisible ones that reorder or hide
# text on a terminal (bidi overrides and isolates, zero-width spaces and joiners, the BOM)
_CONTROL = re.compile(
    "[\x00-\x1f\x7f-\x9f\u2028\u2029\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2064"
    "\u2066-\u2069\ufeff]"
)
PEER_TEXT_MAX = 300
# A line this program says at most (a path the user gave is kept whole up to it).
SAID_MAX = 2000


def one_line(text: str, limit: int = PEER_TEXT_MAX, *, keep_end: bool = False) -> str:
    """Text a peer sent (a kubelet's refusal, an API server's message, a claim's name) as one
    bounded line: cut at `limit` characters, its control characters escaped. `keep_end` cuts
    in the middle instead, for a message whose reason comes after a long value."""
    if len(text) > limit:
        if keep_end:
            half = limit // 2
            text = f"{text[:half]}… ({len(text)} characters) …{text[-half:]}"
        else:
            text = f"{text[:limit]}… ({len(text)} characters)"
    return escaped(text)


def host_port(host: str, port: int) -> str:
    """An address as a message says it: an IPv6 host in brackets (`[::1]:443`)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def escaped(text: str) -> str:
    """`text` with its control and invisible characters escaped (`\\n`, `\\u202e`): one line,
    shown as it is, whatever it holds."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


class _OneLine(logging.Filter):
    """Each log record's message on one line: a path or a peer's words holding a line break
    forged a line of their own."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if (line := escaped(message)) != message:
            record.msg, record.args = line, None
        return True


def start_log(level: str) -> None:
    """The program's log on stderr, from now on: a time, a level, a module and one line."""
    logging.basicConfig(
        level=level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for handler in logging.getLogger().handlers:
        handler.addFilter(_OneLine())


# What a flag's name looks like: said back when argparse does not know it (a typo).
_FLAG = re.compile(r"--[a-z][a-z0-9-]{0,40}")
_ARGPARSE_QUOTED = re.compile(r"(invalid [a-z_]+ value|invalid choice): '.*?'(?= \(choose|$)", re.S)

# The signals that ask a program to stop, and every other whose default ends it (SIGQUIT,
# SIGUSR1, SIGPWR, SIGXCPU...: they mean nothing more here, and by their default they killed a
# program silently, its socket and child left behind): each is a clean stop. Real-time signals
# keep their default (the C library uses some of them itself).
STOPS = (
    signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
    signal.SIGALRM, signal.SIGVTALRM, signal.SIGPROF, signal.SIGPWR, signal.SIGXCPU,
    signal.SIGIO, signal.SIGSTKFLT,
)  # fmt: skip
_STOP_NUMBERS = frozenset(int(s) for s in STOPS)


# The first stop signal this process received: whichever handler takes one (this module's
# before a program takes them over, the program's after), the first decides. Python runs the
# handlers of signals pending together in signal-number order (SIGHUP before SIGTERM, however
# they came), so the order they came in is read from the wakeup fd, where the C handler writes
# each signal's number as it arrives.
_first: list[int] = []
_arrivals: list[int] = []  # the read end of the wakeup pipe, once set


def _watch_arrivals() -> None:
    if _arrivals:
        return
    read, write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    _arrivals.append(read)


def stopped(signum: int) -> int | None:
    """Note a stop signal: the signal that decides the exit code when this is the first one
    taken (the first to arrive, maybe not `signum`), else None (a burst: the first is said and
    decides the exit code, the rest are not)."""
    if _first:
        return None
    came = b""
    if _arrivals:
        with contextlib.suppress(BlockingIOError):
            came = os.read(_arrivals[0], 256)
    first = next((n for n in came if n in _STOP_NUMBERS), signum)
    _first.append(first)
    return first


def first_stop() -> int | None:
    return _first[0] if _first else None


def exit_on_signals(prog: str, before: str = "") -> None:
    """Until a program takes them over: each stop signal ends it with one line and 128+n
    (a signal's own default is a silent death, SIGINT's a traceback). `before` says what it
    had not yet done, e.g. "before serving"."""

    def stop(signum: int, frame: object) -> None:
        if (first := stopped(signum)) is None:
            return
        say(f"{prog}: stopped by {signal.Signals(first).name}" + (f" {before}" if before else ""))
        raise SystemExit(128 + first)

    def after_stop(kind: type[BaseException], value: BaseException, tb: object) -> None:
        if (first := first_stop()) is not None:  # the stop's SystemExit turned into another
            sys.stderr.flush()  # error as it unwound (raised inside the import machinery):
            os._exit(128 + first)  # the stop was said, it decides
        default_hook(kind, value, tb)  # pyright: ignore[reportArgumentType]

    default_hook = sys.excepthook
    sys.excepthook = after_stop
    _watch_arrivals()
    for sig in STOPS:
        signal.signal(sig, stop)
    # at the exit, whatever handler is then set: Python's finalization gives every handler of
    # its own the signal's default back, and a second signal there was a silent death (-15)
    atexit.register(ignore_stops)


def stop_on_signals(stop: asyncio.Event) -> None:
    """Each stop signal sets `stop` on the running loop; one that comes after the loop has
    ended is the program already stopping, ignored. (The loop's own signal handlers give the
    signal back its default when the loop closes: a second SIGTERM in the last milliseconds of
    a clean stop killed the process, silently.)"""
    import asyncio

    loop = asyncio.get_running_loop()

    def handler(signum: int, frame: object) -> None:
        stopped(signum)  # which one, for a program that says it (first_stop)
        with contextlib.suppress(RuntimeError):  # the loop is closed: stopping already
            loop.call_soon_threadsafe(stop.set)

    for sig in STOPS:
        signal.signal(sig, handler)


def ignore_stops() -> None:
    """Stop signals from now on are ignored: the program is ending on its own already. Python's
    finalization gives a signal with a handler its default back (a silent death, exit -15, for
    a second SIGTERM in a clean stop's last milliseconds); an ignored one stays ignored. (Not
    blocked: a mask is per thread, and grpc's threads would still take it.)"""
    for sig in STOPS:
        signal.signal(sig, signal.SIG_IGN)


class _Single(argparse.Action):
    """A flag that takes one value: given twice (`--stack dev --stack prod`), refused, where
    argparse silently keeps the last."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._given: list[weakref.ref[argparse.Namespace]] = []  # the parses that had it

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if any(given() is namespace for given in self._given):
            parser.error(f"{option_string}: given twice: keep one")
        self._given = [g for g in self._given if g() is not None] + [weakref.ref(namespace)]
        setattr(namespace, self.dest, values)


class Parser(argparse.ArgumentParser):
    """argparse with the program's docstring laid out as written, and no traceback from a
    help or an error that cannot be printed."""

    def __init__(self, prog: str, description: str | None) -> None:
        super().__init__(
            prog=prog,
            description=description,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            allow_abbrev=False,  # --rescan for --rescan-interval: a later flag would change it
        )
        # A value that starts with '-' and then a digit, '.', inf or nan is a (negative) number
        # given to a flag, not a flag: argparse's own rule (-5, -.5) said "expected one
        # argument" for -1e3 and -inf. No flag of ours starts so.
        self._negative_number_matcher = re.compile(r"-(\d|\.\d|inf|nan)", re.IGNORECASE)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        if args and str(args[0]).startswith("-") and kwargs.get("action", "store") == "store":
            kwargs["action"] = _Single
        return super().add_argument(*args, **kwargs)

    def print_help(self, file: SupportsWrite[str] | None = None) -> None:
        try:  # the help goes to stdout (argparse passes no other file for it)
            write_stdout(self.format_help())
        except OSError as exc:
            say(f"{self.prog}: cannot write the help to stdout ({exc.strerror or exc})")
            sys.exit(1)

    def error(self, message: str) -> NoReturn:
        """One line, `prog: error: ...` (no usage block: `--help` has it), and no value quoted
        back: a password typed into the wrong flag, or `--set KEY VALUE` typed for KEY=VALUE,
        would be echoed."""
        if message.startswith("unrecognized arguments:"):
            given = message.split(":", 1)[1].split()
            # a flag's name is said (a typo: --sett); a value never is, nor what follows '='
            flags = [f for a in given if _FLAG.fullmatch(f := a.split("=", 1)[0])]
            named = f" ({', '.join(flags[:3])} among them)" if flags else ""
            example = ", e.g. --set KEY=VALUE" if "--set" in self._option_string_actions else ""
            message = (
                f"{len(given)} argument(s) it does not take{named} (values not quoted back: one "
                f"may be a secret); each flag takes its value after '=' or as the next "
                f"argument{example}"
            )
        else:  # argparse's "invalid float value: 'x'", "invalid choice: 'x' (choose from ...)"
            message = _ARGPARSE_QUOTED.sub(r"\1", message)
        say(f"{self.prog}: error: {message} (--help lists the flags)")
        sys.exit(2)

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        if message:
            say(message.rstrip("\n"))
