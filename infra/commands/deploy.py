"""Run the program with Pulumi's Automation API, for a machine with the `pulumi` CLI but not its
Python language host plugin:

    python -m infra.commands.deploy {preview,up,refresh,destroy} --stack local [--diff]
        [--project-dir DIR]

The same program as `pulumi up`, with the same project (Pulumi.yaml), stack files (stacks/) and
state backend (`pulumi login`, PULUMI_BACKEND_URL); the CLI validates the config as it does for
`pulumi up`. The program runs in this process (an inline program), so the CLI needs no
`pulumi-language-python` plugin. Exit codes: 0 done, 1 the engine failed (its output above),
2 it could not start (no usable `pulumi` CLI, no project or stack file: one line says which).
"""

from __future__ import annotations

if __name__ == "__main__":  # before the imports below, which are most of a short run
    from infra.commands.interrupt import exit_quietly

    exit_quietly("deploy")

import argparse
import contextlib
import os
import re
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pulumi import automation as auto

# The Automation API's own version rule, applied to the version our bounded check read (its
# PulumiCommand() would run `pulumi version` a second time, without a bound).
from pulumi.automation._cmd import (  # pyright: ignore[reportPrivateUsage]
    _parse_and_validate_pulumi_version,  # pyright: ignore[reportPrivateUsage]
)
from pulumi.automation._env import (  # pyright: ignore[reportPrivateUsage]
    _SKIP_VERSION_CHECK_VAR,  # pyright: ignore[reportPrivateUsage]
)
from pulumi.automation._minimum_version import (  # pyright: ignore[reportPrivateUsage]
    _MINIMUM_VERSION,  # pyright: ignore[reportPrivateUsage]
)
from pulumi.automation.errors import create_command_error

from common.secret import RUN, Mask, hold, masked
from common.terminal import STOPS, Parser, escaped, one_line, say, write_stdout
from common.userfiles import UnreadableError, described, read_text
from infra.commands.interrupt import children, deferred, descendants
from infra.program import run as program
from infra.stack.files import (
    EscEnvironmentError,
    StackFileError,
    find_stack_file,
    stack_config,
    stack_help,
    stack_name,
)
from infra.stack.keys import PROJECT, PROJECT_DIR, StackConfigError
from infra.stack.model import parse_stack

ACTIONS = ("preview", "up", "refresh", "destroy")


def open_stack(
    stack: str,
    work_dir: Path = PROJECT_DIR,
    env: Mapping[str, str] | None = None,
    pulumi: auto.PulumiCommand | None = None,
) -> auto.Stack:
    """The stack (created when new) of the project in `work_dir`, running this program with
    the `pulumi` CLI on PATH, or `pulumi`."""
    return auto.create_or_select_stack(
        stack_name=stack,
        project_name=PROJECT,
        program=program,
        # work_dir holds Pulumi.yaml: the workspace reads it (and stacks/) as the CLI would
        opts=auto.LocalWorkspaceOptions(
            work_dir=str(work_dir),
            env_vars=dict(env) if env is not None else None,
            pulumi_command=pulumi,
        ),
    )


_lost_output: list[str] = []
_last_output = [time.monotonic()]
# A `pulumi` silent this long is named, once per silence: a hung subcommand says nothing else.
_SILENCE = 10.0


def _out(line: str) -> None:
    """One line of progress on stdout. One that cannot be written (a full disk, a closed pipe)
    is dropped: the engine's operation goes on, and the end says the output was lost."""
    _last_output[0] = time.monotonic()
    try:
        write_stdout(escaped(masked(line)) + "\n")
    except (OSError, ValueError) as exc:  # ValueError: stdout closed
        if not _lost_output:
            _lost_output.append(str(getattr(exc, "strerror", None) or exc))


def _say_when_silent(done: threading.Event) -> None:
    """Name the `pulumi` command that has said nothing for _SILENCE seconds (a hung `stack
    select`, a long step of `up`), once each time it falls silent, until `done`."""

    def watch() -> None:
        said_for = None
        while not done.wait(1):
            last = _last_output[0]
            if time.monotonic() - last >= _SILENCE and said_for != last:
                said_for = last
                then = "a second Ctrl-C kills it" if _stops else "Ctrl-C cancels"
                say(
                    f"deploy: {_running_command()} has said nothing for {_SILENCE:g} s; still "
                    f"waiting for it ({then})"
                )

    threading.Thread(target=watch, name="silence", daemon=True).start()


def _running_command() -> str:
    """`pulumi <subcommand>` of the CLI this process runs now (never its arguments: a value
    may be a secret)."""
    for pid in children():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        # the binary, or a script run by its interpreter (a version manager's shim)
        at = next((i for i, w in enumerate(argv[:2]) if Path(w).name == "pulumi"), None)
        if at is not None:
            words = [w for w in argv[at + 1 : at + 3] if w and not w.startswith("-")]
            return "`pulumi " + " ".join(words) + "`" if words else "`pulumi`"
    return "`pulumi`"


def _quiet_output_readers(args: threading.ExceptHookArgs) -> None:
    """The Automation API reads pulumi's output in threads named after `consumer`: one that
    fails on output it cannot decode must not print a traceback; the main thread then says, in
    one line, that pulumi's answer could not be read."""
    if args.thread is None or "consumer" not in args.thread.name:
        threading.__excepthook__(args)


def run(action: str, stack: auto.Stack, diff: bool = False) -> None:
    """One engine operation, its progress streamed to stdout."""
    if action == "preview":
        stack.preview(on_output=_out, diff=diff)
    elif action == "up":
        outputs = stack.up(on_output=_out, diff=diff).outputs
        if (nodes := outputs.get("agentNodes")) is not None and nodes.value == 0:
            selector = outputs["agentNodeSelector"].value
            say(
                f"deploy: warning: the RDMA node agent runs on no node: none carries {selector} "
                "(kubectl label node <node> LABEL=VALUE, or set lingjun-rdma:agentNodeSelector "
                "to the label your RDMA nodes carry)"
            )
    elif action == "refresh":
        stack.refresh(on_output=_out, diff=diff)
    elif action == "destroy":
        stack.destroy(on_output=_out, diff=diff)
    else:
        raise ValueError(f"unknown action {action!r}; one of {', '.join(ACTIONS)}")


INSTALL = (
    "install the Pulumi CLI: curl -fsSL https://get.pulumi.com | sh, then open a new shell "
    "(3.277 is the version tested; https://www.pulumi.com/docs/install/ lists other ways)"
)


# What `pulumi version` prints: v3.277.0 (a dev build adds -dev.0 and more).
_VERSION = re.compile(r"v?[0-9]+\.[0-9]+\.[0-9]+[0-9A-Za-z.+-]*")
_VERSION_MAX = 4096


class DeployError(RuntimeError):
    """What keeps a deploy from starting: one line naming it and the fix."""


# The most of a failed command's stderr said again (its whole stdout went by already).
_STDERR_LINES = 40
# After `pulumi` exits, what its pipes still hold is read for this long: a child it left behind
# holding them (a plugin, an update check) is not waited for.
_DRAIN_AFTER_EXIT = 2.0
# A line of `pulumi`'s output is cut at this many bytes (a CLI can print megabytes on one).
_LINE_MAX = 16384
_CUT = f" … (cut at {_LINE_MAX // 1024} KiB)".encode()
# `pulumi version` answers in well under a second; one that does not is not a usable CLI.
_VERSION_TIMEOUT = 20


def pulumi_cli() -> auto.PulumiCommand:
    """The `pulumi` CLI on PATH, checked to run and to be new enough for the Automation API."""
    found = shutil.which("pulumi")
    if found is None:
        present = [d for d in os.get_exec_path() if os.path.lexists(os.path.join(d, "pulumi"))]
        if present:
            where = os.path.join(present[0], "pulumi")
            if os.path.isfile(where):
                raise DeployError(f"{where}: not executable (chmod +x it), or: {INSTALL}")
            what = (
                "a directory"
                if os.path.isdir(where)
                else "a symbolic link to nothing (or a loop)"
                if os.path.islink(where)
                else "not a file"
            )
            raise DeployError(f"{where}: {what}, not the CLI: {INSTALL}")
        raise DeployError(f"no `pulumi` CLI on PATH: {INSTALL}")
    try:  # first with a bound: the Automation API's own check would wait forever
        return _Cli(found, _version_within(found, _VERSION_TIMEOUT))
    except subprocess.TimeoutExpired:
        raise DeployError(
            f"{found}: `pulumi version` did not answer within {_VERSION_TIMEOUT}s: {INSTALL}"
        ) from None
    except auto.InvalidVersionError as exc:
        raise DeployError(f"{found}: {exc}: {INSTALL}") from None
    except subprocess.CalledProcessError as exc:
        raise DeployError(
            f"{found}: `pulumi version` exited with {exc.returncode}: {INSTALL}"
        ) from None
    except UnicodeDecodeError:  # the Automation API reads the version as UTF-8 text
        raise DeployError(
            f"{found}: `pulumi version` printed bytes that are not text, not a version: {INSTALL}"
        ) from None
    except FileNotFoundError:  # the file is there: what its #! line names is not
        raise DeployError(
            f"{found}: cannot be run: the interpreter its first line (#!) names is missing: "
            f"{INSTALL}"
        ) from None
    except (OSError, ValueError) as exc:
        raise DeployError(f"{found}: cannot be run ({exc}): {INSTALL}") from None


class _Cli(auto.PulumiCommand):
    """The CLI at `command`, of the version `_version_within` read. PulumiCommand's own
    constructor is not called: it runs `pulumi version` again with no bound, and waits for
    every child that keeps its pipe open (a shim's background update check) to end."""

    def __init__(self, command: str, version: str) -> None:
        self.command = command
        self.version = _parse_and_validate_pulumi_version(
            min_version=_MINIMUM_VERSION,
            current_version=version.removeprefix("v"),
            opt_out=os.getenv(_SKIP_VERSION_CHECK_VAR) is not None,
        )

    def run(
        self,
        args: list[str],
        cwd: str,
        additional_env: Mapping[str, str],
        on_output: Callable[[str], Any] | None = None,
        on_error: Callable[[str], Any] | None = None,
    ) -> auto.CommandResult:
        """PulumiCommand.run, reading what the CLI says as bytes. Its own reads text: output
        that is not UTF-8 killed its reader, the pipe filled and the CLI waited forever; and it
        waited for every child holding the pipes after the CLI had exited."""
        end = args.index("--") if "--" in args else len(args)
        if "--non-interactive" not in args[:end]:
            args = ["--non-interactive", *args]
        env = {**os.environ, **additional_env, "PULUMI_AUTOMATION_API": "true"}
        # the plugins beside the binary first, as PulumiCommand does
        env["PATH"] = os.pathsep.join([os.path.dirname(self.command), env.get("PATH", "")])
        # a stop signal is passed on to the CLI (pass_on) and takes effect once it has ended:
        # it cancels cleanly, saying so on these pipes; a second stop kills it
        with (
            deferred(),
            subprocess.Popen(
                [self.command, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd,
                env=env,
            ) as proc,
        ):  # fmt: skip
            out, err = _said(proc, on_output, on_error)
        result = auto.CommandResult(
            stdout="\n".join(out), stderr="\n".join(err), code=proc.returncode
        )
        if proc.returncode != 0:
            raise create_command_error(result)
        return result


def _said(
    proc: subprocess.Popen[bytes],
    on_output: Callable[[str], Any] | None,
    on_error: Callable[[str], Any] | None,
) -> tuple[list[str], list[str]]:
    """The lines `proc` writes on stdout and stderr, each passed to its callback as it comes:
    decoded with replacement, cut at _LINE_MAX bytes, read until both pipes end or
    _DRAIN_AFTER_EXIT after `proc` exits (a child it left may hold them for ever)."""
    assert proc.stdout is not None
    assert proc.stderr is not None
    out: list[str] = []
    err: list[str] = []
    lines_of: dict[int, tuple[list[str], Callable[[str], Any] | None, bytearray]] = {
        proc.stdout.fileno(): (out, on_output, bytearray()),
        proc.stderr.fileno(): (err, on_error, bytearray()),
    }
    deadline: float | None = None
    cut: set[int] = set()
    with selectors.DefaultSelector() as selector:
        for fd in lines_of:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            if deadline is None and proc.poll() is not None:
                deadline = time.monotonic() + _DRAIN_AFTER_EXIT
            wait = 0.5 if deadline is None else deadline - time.monotonic()
            if wait <= 0:
                break
            for key, _ in selector.select(wait):
                fd = key.fd
                chunk = os.read(fd, 65536)
                lines, callback, partial = lines_of[fd]
                ended = not chunk
                if fd in cut:  # the rest of a line already said, cut: up to its end
                    end = chunk.find(b"\n")
                    if end < 0 and not ended:
                        continue
                    cut.discard(fd)
                    chunk = chunk[end + 1 :]
                partial += chunk
                pieces: list[bytes] = [bytes(p) for p in partial.split(b"\n")]
                partial[:] = b"" if ended else pieces.pop()
                if ended:
                    selector.unregister(fd)
                if len(partial) > _LINE_MAX:  # said now, cut; the rest of it is dropped
                    pieces.append(bytes(partial))
                    partial.clear()
                    cut.add(fd)
                for piece in (p for p in pieces if p or not ended):
                    if len(piece) > _LINE_MAX:
                        piece = piece[:_LINE_MAX] + _CUT
                    line = piece.decode("utf-8", errors="replace").rstrip()
                    if callback is not None:
                        callback(line)
                    lines.append(line)
    proc.wait()
    return out, err


def _version_within(pulumi: str, seconds: float) -> str:
    """`pulumi version`, in a session of its own: a hung one is killed with all it started,
    and so is one a stop signal interrupts (it holds no state to cancel). Its answer goes to a
    file, read once it exits: a child it leaves behind holding a pipe open is not waited for.
    What it printed must be a version (the Automation API's own check calls anything else
    'probably an internal error')."""
    env = {**os.environ, "PULUMI_SKIP_UPDATE_CHECK": "true"}
    slow = threading.Timer(1.0, say, [f"deploy: waiting for `{pulumi} version` to answer"])
    slow.start()
    try:
        with (
            tempfile.TemporaryFile() as out,
            subprocess.Popen(
                [pulumi, "version"],
                stdout=out,
                stderr=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            ) as proc,
        ):
            _checking_version.set()
            try:
                proc.wait(timeout=seconds)
            except BaseException:  # the timeout, or a KeyboardInterrupt of a stop signal
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                raise
            finally:
                _checking_version.clear()
            out.seek(0)
            answer = out.read(_VERSION_MAX)
    finally:
        slow.cancel()
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, [pulumi, "version"])
    text = answer.decode()  # UnicodeDecodeError: said by the caller
    if not _VERSION.fullmatch(text.strip()):
        raise DeployError(
            f"{pulumi}: `pulumi version` printed {described(text)}, not a version like "
            f"v3.277.0: {INSTALL}"
        )
    return text.strip()


def _project_dir(text: str) -> Path:
    if not text:  # Path("") is the current directory: a variable that expanded to nothing
        raise argparse.ArgumentTypeError("empty: name this project's checkout (or leave it out)")
    return Path(text)


# What runs the program: the others (destroy, refresh) work from the stack's state alone.
RUN_PROGRAM = ("preview", "up")


def check_project(project_dir: Path, stack: str, action: str = "up") -> None:
    """The project's files read as the program will read them: one line for what is wrong. A
    config the program would refuse is said, not refused, by an action that does not run it: a
    stack whose config a newer check refuses can still be destroyed as it is."""
    named = escaped(str(project_dir))  # one line: a DeployError's lines are each a problem
    if project_dir.exists() and not project_dir.is_dir():
        raise DeployError(f"--project-dir {named}: not a directory: name this project's checkout")
    if not (project_dir / "Pulumi.yaml").exists():
        raise DeployError(
            f"--project-dir {named}: no Pulumi.yaml there: name this project's checkout"
        )
    try:  # as render refuses it: before the engine, whose program would end in a traceback
        values, secret = stack_config(stack, project_dir=project_dir)
    except EscEnvironmentError:  # the engine opens them; the program checks what they give
        return
    except StackFileError as exc:
        raise DeployError(str(exc)) from None
    try:
        parse_stack(values, set(secret))
    except StackConfigError as exc:
        if action in RUN_PROGRAM:
            raise DeployError(str(exc)) from None
        for problem in str(exc).splitlines():
            say(f"deploy: {problem}")
        say(f"deploy: {action} does not run the program: going on with the config as it is")


def _exit(code: str) -> str:
    """The Automation API's `code: N` as a user reads it: a negative N is a signal's."""
    number = code.removeprefix("code: ")
    if number.startswith("-") and number[1:].isdigit() and int(number[1:]) in _SIGNALS:
        return f"`pulumi` was killed by {_SIGNALS[int(number[1:])]}"
    return code


_SIGNALS = {int(s): s.name for s in signal.Signals}


# What the engine's output must never show, should a CLI or plugin print its environment: the
# stack's passphrase, the backend's credentials (Pulumi Cloud's token; an S3, OSS, Azure Blob
# or GCS state bucket's keys) and the Alibaba Cloud credentials the provider reads (either
# spelling). GOOGLE_CREDENTIALS is a JSON document or a path: its runs would be ordinary text.
ENGINE_SECRETS = (
    "PULUMI_CONFIG_PASSPHRASE",
    "PULUMI_ACCESS_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AZURE_STORAGE_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "GOOGLE_OAUTH_ACCESS_TOKEN",
    "ALICLOUD_ACCESS_KEY",
    "ALICLOUD_SECRET_KEY",
    "ALICLOUD_SECURITY_TOKEN",
    "ALIBABA_CLOUD_ACCESS_KEY_ID",
    "ALIBABA_CLOUD_ACCESS_KEY_SECRET",
    "ALIBABA_CLOUD_SECURITY_TOKEN",
)


def _engine_secrets() -> list[str]:
    """The values of ENGINE_SECRETS, and the passphrase in the file
    PULUMI_CONFIG_PASSPHRASE_FILE names."""
    found = {name: os.environ.get(name, "") for name in ENGINE_SECRETS}
    if path := os.environ.get("PULUMI_CONFIG_PASSPHRASE_FILE"):
        try:
            found["the passphrase in PULUMI_CONFIG_PASSPHRASE_FILE"] = read_text(Path(path)).strip()
        except UnreadableError as exc:  # a missing one: the CLI says so
            if not exc.missing:
                say(
                    f"deploy: PULUMI_CONFIG_PASSPHRASE_FILE {path}: {exc}: the passphrase in it "
                    "is not masked in the engine's output"
                )
    if short := [name for name, value in found.items() if 0 < len(value) < RUN]:
        say(  # a short one is masked as a word of its own only
            f"deploy: {', '.join(short)}: fewer than {RUN} characters, masked in the engine's "
            "output only where it stands alone, not encoded: use a longer one"
        )
    return list(found.values())


def _bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = Parser("python -m infra.commands.deploy", __doc__)
    parser.add_argument("action", choices=ACTIONS)
    parser.add_argument("--stack", required=True, type=stack_name, help=stack_help())
    parser.add_argument("--diff", action="store_true", help="show each resource's diff")
    parser.add_argument(
        "--project-dir",
        type=_project_dir,
        default=PROJECT_DIR,
        help="where Pulumi.yaml and stacks/ are (default: this checkout)",
    )
    args = parser.parse_args(argv)
    threading.excepthook = _quiet_output_readers
    hold(Mask(*_engine_secrets(), label="[secret]"))  # Pulumi's own word for a masked value
    done = threading.Event()
    try:
        check_project(args.project_dir, args.stack, args.action)
        pulumi = pulumi_cli()
        _out(  # what the engine's first output may be a while coming for
            f"deploy: {args.action} of stack {args.stack} with "
            f"{shutil.which(pulumi.command) or pulumi.command} "
            f"{pulumi.version}; the engine's output follows"
        )
        _say_when_silent(done)
        stack_file = find_stack_file(args.stack, args.project_dir)
        before = _bytes(stack_file)
        stack = open_stack(args.stack, args.project_dir, pulumi=pulumi)
        if _bytes(stack_file) != before:  # `pulumi stack init` writes its salt into the file
            _out(
                f"deploy: the Pulumi CLI rewrote {stack_file} as it created the stack (its "
                "encryptionsalt added, values written as text): commit it, or git checkout it "
                "if this stack is a throwaway"
            )
        run(args.action, stack, diff=args.diff)
    except DeployError as exc:
        for problem in str(exc).splitlines():  # a line per key refused, each a whole message
            say(f"deploy: {problem}")
        return 2
    except auto.CommandError as exc:
        # its stdout went by already (on_output): name the command, and show what it said on
        # stderr, which nothing showed yet (its last lines: a failing engine can say megabytes)
        code, _, rest = str(exc).partition("\n stdout: ")
        stderr = rest.rpartition("\n stderr: ")[2].strip().splitlines()
        say(f"deploy: {args.action} --stack {args.stack}: failed ({_exit(code.strip())})")
        for line in stderr[-_STDERR_LINES:]:
            say(one_line(masked(line), 1000, keep_end=True))
        return 1
    except (RuntimeError, ValueError) as exc:  # the Automation API reading what pulumi said
        say(
            f"deploy: {args.action} --stack {args.stack}: `pulumi` gave an answer the Automation "
            f"API cannot read ({type(exc).__name__}): is it the Pulumi CLI? {INSTALL}"
        )
        return 1
    finally:
        done.set()
        if _lost_output:
            say(f"deploy: stdout could not be written ({_lost_output[0]}): the progress was lost")
    return 0


_stops = 0
_checking_version = threading.Event()


def pass_on(signum: int) -> None:
    """A stop signal that reached only this process (a SIGTERM, a SIGHUP, a `kill -INT`): the
    `pulumi` it runs gets the SIGINT a Ctrl-C would have sent it (it cancels the operation
    cleanly), not left running unsupervised. A Ctrl-C at the terminal reached it already: a
    second one would make it stop at once, leaving the stack locked. Said at once, since the
    cancel may take minutes (a cluster being created finishes its step); a second stop signal
    kills what still runs."""
    global _stops
    if _checking_version.is_set():  # `pulumi version` is killed as the signal unwinds
        return
    if _stops and _in_burst():
        return
    _stops += 1
    _first_stop.append(time.monotonic())
    running = children()
    if _stops > 1:
        _kill_pulumi()
    elif running:
        if signum != signal.SIGINT or not _from_terminal():
            for child in running:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGINT)
        say(
            "deploy: asked `pulumi` to cancel; waiting for it to end (a second signal kills "
            "it, which may leave the stack locked: `pulumi cancel` releases it)"
        )
        _watch_for_a_second_stop()


_killed = threading.Event()
# Stop signals this soon after the first are the same stop (a supervisor's SIGTERM and SIGHUP,
# one `kill` of several signals), not a second one: that kills `pulumi`, which may leave the
# stack locked, and takes a person's second Ctrl-C.
_BURST = 1.0
_first_stop: list[float] = []


def _in_burst() -> bool:
    return bool(_first_stop) and time.monotonic() - _first_stop[0] < _BURST


def _kill_pulumi() -> None:
    """All of it: what pulumi started holds its output open, and deploy reads to its end."""
    if _killed.is_set():
        return
    _killed.set()
    for pid in descendants():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    say("deploy: killed `pulumi`")


def _watch_for_a_second_stop() -> None:
    """Python runs signal handlers in the main thread only, and the Automation API may block it
    where no handler can run (closing a pipe another thread reads): the C-level handler's
    wakeup fd reaches a thread of ours instead."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end)
    stops = {int(s) for s in STOPS}

    def watch() -> None:
        while not _killed.is_set():
            if any(b in stops for b in os.read(read_end, 64)) and not _in_burst():
                _kill_pulumi()

    threading.Thread(target=watch, name="second-stop", daemon=True).start()


def _from_terminal() -> bool:
    """This process group is the terminal's foreground one: a Ctrl-C went to all of it."""
    try:
        with open("/dev/tty") as tty:
            return os.tcgetpgrp(tty.fileno()) == os.getpgrp()
    except OSError:
        return False


if __name__ == "__main__":
    from infra.commands.interrupt import guard

    guard(main, on_signal=pass_on)
