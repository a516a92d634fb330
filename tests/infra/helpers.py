"""What the tests of the infra commands share: their CLIs run as a user runs them (in this
process, or as one of its own), a fake `pulumi` on PATH, a copy of the project with a stack
file of the test's, and a value that must never appear in what the project writes."""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from infra.stack.keys import PROJECT_DIR

SENTINEL = "s3cr3t-Zq9"  # a value that must never appear in what the project writes


RENDER, DEPLOY = "infra.commands.render", "infra.commands.deploy"


def _cli(
    module: str, *args: str, cwd: Path, path: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """A command's run. The infra commands run in this process (their main, as `python -m`
    calls it: the Pulumi SDK's import is most of a process's start) unless a test needs an
    environment of its own: what only a process shows (signals, an encoding) runs as one with
    `env`. The node agents' own CLIs, which set up their log, always run as processes."""
    if env is None and module in (RENDER, DEPLOY):
        return _in_process(module, args, cwd, path)
    env = {**os.environ, "PYTHONPATH": str(PROJECT_DIR), **(env or {})}
    if path is not None:
        env["PATH"] = path
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip


def _in_process(
    module: str, args: tuple[str, ...], cwd: Path, path: str | None
) -> subprocess.CompletedProcess[str]:
    main = importlib.import_module(module).main
    out, err = io.StringIO(), io.StringIO()
    here, searched = os.getcwd(), os.environ["PATH"]
    os.chdir(cwd)
    os.environ["PATH"] = searched if path is None else path
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:  # argparse's refusal of a flag
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        os.chdir(here)
        os.environ["PATH"] = searched
    return subprocess.CompletedProcess([module, *args], code, out.getvalue(), err.getvalue())


def _handling_signals(proc: subprocess.Popen[str]) -> None:
    """Wait until the program has installed its own stop handlers: a signal that lands while the
    interpreter itself starts (seconds on a loaded machine) meets only the system's default."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with open(f"/proc/{proc.pid}/status") as f:
            caught = next(line for line in f if line.startswith("SigCgt:"))
        if int(caught.split()[1], 16) & (1 << (signal.SIGTERM - 1)):
            return
        time.sleep(0.01)
    raise AssertionError("the program never installed its signal handlers")


def _preview(cwd: Path, path: str, stdout: int = subprocess.PIPE) -> subprocess.Popen[str]:
    """`python -m infra.commands.deploy preview --stack local`, PATH `path` (a fake `pulumi`)."""
    return subprocess.Popen(
        [sys.executable, "-m", DEPLOY, "preview", "--stack", "local"],
        cwd=cwd, env={**os.environ, "PYTHONPATH": str(PROJECT_DIR), "PATH": path},
        stdout=stdout, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _fake_pulumi(directory: Path, script: str) -> str:
    directory.mkdir()
    exe = directory / "pulumi"
    exe.write_text(script)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return f"{directory}:/usr/bin:/bin"


def _project_copy(tmp_path: Path, stack_file: str) -> Path:
    (tmp_path / "stacks").mkdir()
    (tmp_path / "Pulumi.yaml").write_text((PROJECT_DIR / "Pulumi.yaml").read_text())
    (tmp_path / "stacks" / "Pulumi.x.yaml").write_text(stack_file)
    return tmp_path
