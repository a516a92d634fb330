"""The deploy driver and the `pulumi` CLI it runs: a missing, broken or silent CLI (or project,
or stack) is one line before anything runs; what it waits for is said; an engine's failure is
named with its code, its output relayed bounded and never waited on for ever; a stack config
render refuses is refused before any `pulumi` runs, or said where the program does not run."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.commands import deploy
from infra.stack.keys import PROJECT_DIR
from tests.infra.helpers import DEPLOY, _cli, _fake_pulumi, _preview


@pytest.mark.parametrize(
    ("setup", "args", "said"),
    [
        (lambda d: "/usr/bin:/bin", (), "deploy: no `pulumi` CLI on PATH: install the Pulumi CLI"),
        (lambda d: _fake_pulumi(d, "#!/bin/sh\necho v3.0.0\n"), (),
         "Minimum version requirement failed"),
        (lambda d: _fake_pulumi(d, "#!/bin/sh\nexit 3\n"), (), "`pulumi version` exited with 3"),
        (lambda d: _fake_pulumi(d, "not a program"), (), "cannot be run ("),
        (lambda d: (d / "pulumi").mkdir(parents=True) or f"{d}:/usr/bin:/bin", (),
         "pulumi: a directory, not the CLI"),
        (lambda d: d.mkdir() or (d / "pulumi").symlink_to("/nowhere") or f"{d}:/usr/bin:/bin",
         (), "pulumi: a symbolic link to nothing (or a loop), not the CLI"),
        (lambda d: _fake_pulumi(d, "#!/bin/sh\nprintf 'v3.2\\377\\n'\n"), (),
         "`pulumi version` printed bytes that are not text, not a version"),
        (lambda d: _fake_pulumi(d, "#!/nonexistent/sh\necho v3.277.0\n"), (),
         "cannot be run: the interpreter its first line (#!) names is missing"),
        (lambda d: _fake_pulumi(d, "#!/bin/sh\nprintf '\\033[1mv3\\033[0m\\nwarning\\n'\n"),
         (), "`pulumi version` printed text of 19 characters, not a version like v3.277.0"),
        (lambda d: _fake_pulumi(d, "#!/bin/sh\n"), (),
         "`pulumi version` printed empty text, not a version"),
        (lambda d: _fake_pulumi(d, "#!/bin/sh\necho v3.277.0\nsleep 600 &\n"), (),
         "--stack nope: no "),
        (lambda d: None, ("--project-dir", "/nonexistent"),
         "deploy: --project-dir /nonexistent: no Pulumi.yaml there"),
        (lambda d: None, ("--project-dir", "/etc/hostname"),
         "deploy: --project-dir /etc/hostname: not a directory"),
        (lambda d: None, ("--project-dir", ""), "argument --project-dir: empty: name this"),
        (lambda d: d.mkdir() or ((d / "Pulumi.yaml").write_text("name: other\n") and None),
         ("--project-dir", "bin"), "bin/Pulumi.yaml: not this project's (it needs name: "),
        (lambda d: None, ("--stack", "nope"), "deploy: --stack nope: no "),
    ],
    ids=["no-cli", "too-old", "broken", "not-a-program", "a-directory", "a-dangling-link",
         "not-utf8", "no-interpreter", "ansi-two-lines", "empty", "a-child-holds-stdout",
         "no-project", "project-a-file", "project-dir-empty", "another-project", "no-stack"],
)  # fmt: skip
def test_deploy_that_cannot_start_says_why_in_one_line(
    tmp_path: Path, setup: object, args: tuple[str, ...], said: str
) -> None:
    assert callable(setup)
    path = setup(tmp_path / "bin")
    stack = () if "--stack" in args else ("--stack", "nope" if "--stack nope" in said else "local")

    done = _cli(DEPLOY, "preview", *stack, *args, cwd=tmp_path, path=path)

    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert said in line


def test_deploy_with_a_pulumi_that_never_answers_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(deploy, "_VERSION_TIMEOUT", 2)  # its 20 s, made short to wait less
    path = _fake_pulumi(tmp_path / "bin", "#!/bin/sh\nexec sleep 3600\n")

    done = _cli(DEPLOY, "preview", "--stack", "local", cwd=tmp_path, path=path)

    assert done.returncode == 2
    waiting, line = done.stderr.splitlines()
    assert waiting == f"deploy: waiting for `{path.split(':')[0]}/pulumi version` to answer"
    assert "`pulumi version` did not answer within" in line


def test_deploy_with_a_pulumi_that_is_not_executable_says_so(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "pulumi").write_text("#!/bin/sh\n")

    done = _cli(DEPLOY, "preview", "--stack", "local", cwd=tmp_path,
                path=f"{tmp_path / 'bin'}:/usr/bin:/bin")  # fmt: skip

    assert done.returncode == 2
    assert f"{tmp_path / 'bin' / 'pulumi'}: not executable" in done.stderr


def test_a_version_check_a_child_keeps_open_is_not_run_again_unbounded(tmp_path: Path) -> None:
    """The bounded check read the version: the Automation API must not run `pulumi version`
    again and wait for the child that holds its pipe (it did: 40 s and more, silent)."""
    calls = tmp_path / "calls"
    path = _fake_pulumi(
        tmp_path / "bin",
        f'#!/bin/sh\necho "$1" >> {calls}\n'
        'case "$1" in version) echo v3.277.0; sleep 60 & ;; '
        '*) echo "error: no backend here" >&2; exit 7;; esac\n',
    )

    done = _cli(DEPLOY, "preview", "--stack", "local", cwd=tmp_path, path=path)

    assert done.returncode == 1, done.stderr
    assert "failed (code: 7)" in done.stderr
    assert calls.read_text().split()[:2] == ["version", "--non-interactive"]


def test_deploy_says_what_it_waits_for_before_the_engine_answers(tmp_path: Path) -> None:
    script = '#!/bin/sh\n[ "$1" = version ] && { echo v3.277.0; exit 0; }\nexec sleep 3600\n'
    path = _fake_pulumi(tmp_path / "bin", script)
    proc = _preview(tmp_path, path)
    assert proc.stdout is not None
    first = proc.stdout.readline()  # said at once, while the hung `pulumi` never answers
    time.sleep(1)
    proc.terminate()  # passed on to the `pulumi` it runs, as the SIGINT of a Ctrl-C
    _, stderr = proc.communicate(timeout=60)

    assert first.startswith(f"deploy: preview of stack local with {tmp_path / 'bin' / 'pulumi'}")
    assert proc.returncode == 143, stderr
    assert stderr.splitlines()[-1] == "deploy: stopped by SIGTERM"


def test_a_pulumi_subcommand_that_says_nothing_is_named_after_a_while(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = (
        '#!/bin/sh\n[ "$1" = version ] && { echo v3.277.0; exit 0; }\n'
        f"echo $$ >> {pids}; sleep 3600 & echo $! >> {pids}; wait\n"
    )
    path = _fake_pulumi(tmp_path / "bin", script)
    proc = _preview(tmp_path, path, stdout=subprocess.DEVNULL)
    assert proc.stderr is not None
    try:
        line = proc.stderr.readline()  # after the engine's first command was silent for 10 s
    finally:
        proc.kill()
        proc.communicate()
        for pid in pids.read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)

    assert re.fullmatch(r"deploy: `pulumi [a-z]+( [a-z]+)?` .*\n", line), line
    assert line.endswith(" has said nothing for 10 s; still waiting for it (Ctrl-C cancels)\n")


def test_a_failing_engine_command_is_named_with_its_code_and_last_stderr_lines(
    tmp_path: Path,
) -> None:
    script = (
        "#!/bin/sh\n"
        'if [ "$1" = version ]; then echo v3.277.0; exit 0; fi\n'
        'for i in $(seq 1 100); do echo "engine line $i" >&2; done\nexit 7\n'
    )
    path = _fake_pulumi(tmp_path / "bin", script)

    done = _cli(DEPLOY, "preview", "--stack", "local", cwd=tmp_path, path=path)

    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    assert "Traceback" not in done.stderr
    assert lines[0] == "deploy: preview --stack local: failed (code: 7)", lines
    assert lines[-1] == "engine line 100"
    assert "engine line 60" not in lines


def test_a_cli_killed_by_a_signal_is_said_by_the_signals_name(tmp_path: Path) -> None:
    path = _fake_pulumi(
        tmp_path / "bin",
        '#!/bin/sh\n[ "$1" = version ] && { echo v3.277.0; exit 0; }\nkill -KILL $$\n',
    )

    done = _cli(DEPLOY, "preview", "--stack", "local", cwd=tmp_path, path=path)

    assert done.returncode == 1, done.stderr
    assert "failed (`pulumi` was killed by SIGKILL)" in done.stderr


@pytest.mark.parametrize(
    "answer",
    ["head -c 100000 /dev/zero | tr '\\0' '\\377'; exit 3",
     "(sleep 300) & echo 'error: gone' >&2; exit 3",
     "head -c 3000000 /dev/zero | tr '\\0' x >&2; exit 3"],
    ids=["100-kb-not-utf8", "a-child-keeps-the-pipes", "a-3-mb-error-line"],
)  # fmt: skip
def test_what_a_failing_cli_says_is_read_and_bounded_never_waited_on(
    tmp_path: Path, answer: str
) -> None:
    """The Automation API read text (bytes not UTF-8 killed its reader, the CLI then blocked
    on a full pipe) until every holder of the pipes closed them: both hung deploy for ever."""
    path = _fake_pulumi(
        tmp_path / "bin",
        f'#!/bin/sh\n[ "$1" = version ] && {{ echo v3.277.0; exit 0; }}\n{answer}\n',
    )

    done = _cli(DEPLOY, "preview", "--stack", "local", cwd=tmp_path, path=path)

    assert done.returncode == 1, done.stderr
    assert "failed (code: 3)" in done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr) < 50_000


@pytest.mark.parametrize(
    "answer",
    ["exit 0\n", "printf '\\377\\376 not utf-8\\n'; exit 0\n"],
    ids=["no-events", "not-utf8"],
)
def test_a_pulumi_whose_answer_cannot_be_read_is_one_line(tmp_path: Path, answer: str) -> None:
    path = _fake_pulumi(
        tmp_path / "bin",
        f'#!/bin/sh\nif [ "$1" = version ]; then echo v3.277.0; exit 0; fi\n{answer}',
    )

    done = _cli(DEPLOY, "up", "--stack", "local", cwd=tmp_path, path=path)

    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert "`pulumi` gave an answer the Automation API cannot read" in line


def test_one_huge_line_of_the_engine_is_relayed_once_cut(tmp_path: Path) -> None:
    """A 10 MB line was relayed as 2.5 MB of 16 KiB lines."""
    path = _fake_pulumi(
        tmp_path / "bin",
        '#!/bin/sh\n[ "$1" = version ] && { echo v3.277.0; exit 0; }\n'
        'case "$*" in *preview*) ;; *) exit 0;; esac\n'
        # the line's end alone in a read, then the next line: both must be read as such
        "head -c 10000000 /dev/zero | tr '\\0' a; sleep 0.5; echo; sleep 0.5; echo after; "
        "exit 3\n",
    )

    done = _cli(DEPLOY, "preview", "--stack", "local", cwd=tmp_path, path=path)

    lines = done.stdout.splitlines()
    assert done.returncode == 1, done.stderr
    assert lines[1:] == ["a" * 16384 + " … (cut at 16 KiB)", "after"]


def test_a_deploy_whose_stdout_is_full_says_so_on_stderr(tmp_path: Path) -> None:
    path = _fake_pulumi(tmp_path / "bin", "#!/bin/sh\necho v3.277.0\n")
    env = {**os.environ, "PYTHONPATH": str(PROJECT_DIR), "PATH": path}
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", DEPLOY, "preview", "--stack", "local"],
            cwd=tmp_path, env=env, stdout=full, stderr=subprocess.PIPE, text=True,
            timeout=120, check=False,
        )  # fmt: skip

    assert "Traceback" not in done.stderr
    assert "deploy: stdout could not be written (No space left on device)" in done.stderr


def test_deploy_says_each_key_it_refuses_on_a_line_of_its_own(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "stacks").mkdir(parents=True)
    shutil.copy(PROJECT_DIR / "Pulumi.yaml", project)
    local = (PROJECT_DIR / "stacks/Pulumi.local.yaml").read_text()
    bad = "  lingjun-rdma:jobAwaitTimeout: forever\n  lingjun-rdma:pluginAwaitTimeout: never\n"
    (project / "stacks/Pulumi.local.yaml").write_text(local + bad)
    path = _fake_pulumi(tmp_path / "bin", "#!/bin/sh\necho v3.277.0\n")

    done = _cli(DEPLOY, "preview", "--stack", "local", "--project-dir", str(project),
                cwd=tmp_path, path=path)  # fmt: skip

    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 2, lines
    assert sorted(line.split(": ")[1] for line in lines) == [
        "lingjun-rdma:jobAwaitTimeout", "lingjun-rdma:pluginAwaitTimeout"]  # fmt: skip
    assert all(line.startswith("deploy: lingjun-rdma:") for line in lines)


def test_deploy_refuses_a_stack_render_refuses_before_any_pulumi_runs(tmp_path: Path) -> None:
    """It was left to the engine, whose program then ended in a traceback."""
    project = tmp_path / "project"
    (project / "stacks").mkdir(parents=True)
    shutil.copy(PROJECT_DIR / "Pulumi.yaml", project)
    local = (PROJECT_DIR / "stacks/Pulumi.local.yaml").read_text()
    plain = local.replace("client-key: /etc/kubernetes/pki/admin.key", "token: S3cretToken")
    assert plain != local
    (project / "stacks/Pulumi.local.yaml").write_text(plain)
    calls = tmp_path / "calls"
    path = _fake_pulumi(tmp_path / "bin", f'#!/bin/sh\necho "$@" >> {calls}\necho v3.277.0\n')

    done = _cli(DEPLOY, "preview", "--stack", "local", "--project-dir", str(project),
                cwd=tmp_path, path=path)  # fmt: skip

    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("deploy: lingjun-rdma:kubeconfig: ")
    assert "set it as a secret" in done.stderr
    assert "Traceback" not in done.stderr
    assert "S3cretToken" not in done.stderr
    assert not calls.exists()  # no pulumi ran


@pytest.mark.parametrize("action", ["destroy", "refresh"])
def test_deploy_says_a_refused_config_and_goes_on_where_the_program_does_not_run(
    tmp_path: Path, action: str
) -> None:
    """A stack whose config a newer check refuses must still be torn down as it is."""
    project = tmp_path / "project"
    (project / "stacks").mkdir(parents=True)
    shutil.copy(PROJECT_DIR / "Pulumi.yaml", project)
    local = (PROJECT_DIR / "stacks/Pulumi.local.yaml").read_text()
    (project / "stacks/Pulumi.local.yaml").write_text(
        local + "  lingjun-rdma:rdmaMaxAllocations: '0x10'\n"
    )
    calls = tmp_path / "calls"
    path = _fake_pulumi(tmp_path / "bin", f'#!/bin/sh\necho "$@" >> {calls}\necho v3.277.0\n')

    done = _cli(DEPLOY, action, "--stack", "local", "--project-dir", str(project),
                cwd=tmp_path, path=path)  # fmt: skip

    said = done.stderr.splitlines()
    assert said[0].startswith("deploy: lingjun-rdma:rdmaMaxAllocations: "), done.stderr
    assert said[1] == (
        f"deploy: {action} does not run the program: going on with the config as it is"
    )
    assert f" {action} " in calls.read_text()  # the engine's operation ran
