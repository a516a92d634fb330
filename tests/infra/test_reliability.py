"""What the offline render and the deploy driver promise whatever they are given: no secret's
value in any file or line they write, every number within its stated range, and one line (never
a traceback) for what keeps them from starting. Run as a user runs them: their CLIs."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib
import io
import json
import math
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from common.userfiles import MAX_DIGITS, MAX_FILE_BYTES
from infra.commands import deploy
from infra.commands.render import MARKER, OutputError, _remove_render, render
from infra.stack.credentials import kubeconfig_credential
from infra.stack.files import StackFileError, stack_config
from infra.stack.images import reference_problem
from infra.stack.keys import (
    DURATION_RANGES,
    PROJECT,
    PROJECT_DIR,
    StackConfigError,
    format_seconds,
    unknown_key_problems,
)
from infra.stack.keys import seconds as keys_seconds
from infra.stack.model import MAX_NODE_COUNT, StackConfig, parse, parse_stack
from infra.stack.samples import JOB_RANGES, JobSpecError, RdmaJobSpec
from plugin.config import MAX_ALLOCATIONS_LIMIT, MAX_DEVICE_IDS, MAX_POOLS
from plugin.deviceplugin.wire import KUBELET_MESSAGE_MAX
from plugin.launch import MAX_UNIX_PATH, RESCAN_INTERVAL_RANGE

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


def _written(root: Path) -> str:
    return "".join(p.read_text() for p in sorted(root.rglob("*")) if p.is_file())


KUBECONFIG_HEAD = """apiVersion: v1
kind: Config
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""
# Credentials an inline check of token/key/password fields misses: each must need --secret.
HIDDEN = {
    "oidc-client-secret": KUBECONFIG_HEAD
    + "clusters: [{name: c, cluster: {server: 'https://10.0.0.1:6443'}}]\n"
    + "users: [{name: u, user: {auth-provider: {name: oidc, config: "
    + f"{{client-id: k8s, client-secret: {SENTINEL}}}}}}}}}]\n",
    "exec-env": KUBECONFIG_HEAD
    + "clusters: [{name: c, cluster: {server: 'https://10.0.0.1:6443'}}]\n"
    + "users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1, "
    + f"command: get-token, env: [{{name: TOKEN, value: {SENTINEL}}}]}}}}}}]\n",
    "password-in-server-url": KUBECONFIG_HEAD
    + f"clusters: [{{name: c, cluster: {{server: 'https://admin:{SENTINEL}@10.0.0.1:6443'}}}}]\n"
    + "users: [{name: u, user: {client-certificate: /pki/a.crt, client-key: /pki/a.key}}]\n",
    # no scheme: urlsplit reads `admin` as the scheme and the rest as a path
    "password-in-a-server-without-scheme": KUBECONFIG_HEAD
    + f"clusters: [{{name: c, cluster: {{server: 'admin:{SENTINEL}@10.0.0.1:6443'}}}}]\n"
    + "users: [{name: u, user: {client-certificate: /pki/a.crt, client-key: /pki/a.key}}]\n",
}


@pytest.mark.parametrize("kubeconfig", list(HIDDEN.values()), ids=list(HIDDEN))
def test_a_kubeconfig_credential_in_plain_text_is_refused_without_quoting_it(
    kubeconfig: str,
) -> None:
    config, _ = stack_config("local")
    raw = {k.removeprefix(f"{PROJECT}:"): v for k, v in config.items() if v}

    with pytest.raises(StackConfigError) as caught:
        parse({**raw, "kubeconfig": kubeconfig}, secret=frozenset())

    assert "lingjun-rdma:kubeconfig: holds what may be a credential (" in str(caught.value)
    assert SENTINEL not in str(caught.value)
    assert isinstance(
        parse({**raw, "kubeconfig": kubeconfig}, frozenset({"kubeconfig"})), StackConfig
    )


@pytest.mark.parametrize("kubeconfig", list(HIDDEN.values()), ids=list(HIDDEN))
def test_a_kubeconfig_given_as_a_secret_reaches_no_rendered_file(
    tmp_path: Path, kubeconfig: str
) -> None:
    # --set on a credential key is stored as `pulumi config set --secret` would store it
    done = _cli(
        RENDER, "--stack", "local", "--out", "out", "--set", f"kubeconfig={kubeconfig}",
        cwd=tmp_path,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert SENTINEL not in done.stdout + done.stderr
    assert SENTINEL not in _written(tmp_path / "out")


@pytest.mark.parametrize(
    "key", ["pluginImage", "perftestImage", "hpsBenchmarkImage", "ncclTestsImage"]
)
@pytest.mark.parametrize(
    "image",
    [
        f"robot:{SENTINEL}@registry.example.com/rdma/plugin:1.0",
        f"https://robot:{SENTINEL}@registry.example.com/rdma/plugin:1.0",
        f"registry.example.com/rdma/plugin:1.0?token={SENTINEL}",
    ],
    ids=["userinfo", "url", "query"],
)
def test_an_image_reference_holding_a_login_is_refused_without_quoting_it(
    tmp_path: Path, key: str, image: str
) -> None:
    samples = '--set=sampleJobs=["hps-benchmark","perftest","nccl-tests"]'
    images = [f"--set={k}=registry.example.com/x:1" for k in
              ("perftestImage", "hpsBenchmarkImage", "ncclTestsImage") if k != key]  # fmt: skip
    done = _cli(
        RENDER, "--stack", "dev", "--out", "out", samples, *images, f"--set={key}={image}",
        cwd=tmp_path,
    )  # fmt: skip

    assert done.returncode == 1, done.stderr
    assert f"lingjun-rdma:{key}: not an image reference" in done.stderr
    assert SENTINEL not in done.stdout + done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "image",
    [
        "registry.cn-wulanchabu.aliyuncs.com/lingjun-rdma/rdma-device-plugin:0.1.0",
        "localhost:5000/plugin@sha256:" + "a" * 64,
        "reg.example.com/a/plugin:1@sha512:" + "0f" * 64,
        "busybox:1.36",
        "ghcr.io/a/b/c:v1.2.3-rc.1",
    ],
)
def test_image_references_of_every_form_pass(image: str) -> None:
    assert reference_problem(image) is None


@pytest.mark.parametrize(
    "image",
    ["registry.example.com/Rdma/plugin:1.0", "UPPER/x:1", "localhost:5000/A/b@sha256:" + "a" * 64],
)
def test_an_image_whose_repository_is_not_lower_case_says_so(image: str) -> None:
    assert reference_problem(image) == (
        "not an image reference ([registry[:port]/]repository[:tag][@sha256:digest]); its "
        "repository is in lower case only (a runtime refuses upper case there)"
    )


@pytest.mark.parametrize("image", ["registry.example.com/x y:1", "Reg.example.com/a b"])
def test_an_image_with_other_slips_gets_no_lower_case_hint(image: str) -> None:
    problem = reference_problem(image)

    assert problem is not None
    assert "lower case" not in problem


LOW, HIGH = RESCAN_INTERVAL_RANGE


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("rdmaRescanInterval", "9" * 61, "a number of 61 digits (at most 20)"),
        ("rdmaRescanInterval", "9" * 19, f"must be 1-{HIGH:g} whole seconds"),
        ("rdmaRescanInterval", "0", f"must be 1-{HIGH:g} whole seconds"),
        ("jobAwaitTimeout", "99999999999999999h", "not within 1s..168h"),
        ("jobAwaitTimeout", "9" * 5000 + "s", "not within 1s..168h"),
        ("jobAwaitTimeout", "0s", "not within 1s..168h"),
        ("jobAwaitTimeout", "169h", "not within 1s..168h"),
        ("pluginAwaitTimeout", "25h", "not within 1s..24h"),
        ("lingjunNodeCount", "1001", "1001 is not 0..1000"),
        ("lingjunNodeCount", "9" * 20, "a number of 20 digits is not 0..1000"),
        ("lingjunNodeCount", "9" * 400, "a number of 400 digits (at most 20)"),
        ("lingjunNodeCount", "9" * 4301, "a number of 4301 digits (at most 20)"),
        ("rdmaMaxAllocations", "100001", "is not within 1-100000"),
        ("rdmaMaxAllocations", "9" * 5000, "a number of 5000 digits (at most 20)"),
    ],
)
def test_a_number_outside_its_range_is_refused_in_one_line_before_planning(
    tmp_path: Path, key: str, value: str, said: str
) -> None:
    done = _cli(
        RENDER,
        "--stack",
        "dev",
        "--out",
        "out",
        f"--set={key}={value}",
        cwd=tmp_path,
    )

    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if f"lingjun-rdma:{key}:" in ln]
    assert said in line
    assert len(line) < 300  # the value is not echoed at length
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("key", "seconds"), sorted(DURATION_RANGES.items()))
def test_each_durations_bounds_are_accepted(
    tmp_path: Path, key: str, seconds: tuple[int, int]
) -> None:
    for bound in seconds:
        done = _cli(
            RENDER, "--stack", "dev", "--out", f"out-{bound}",
            f"--set={key}={format_seconds(bound)}", cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr


def test_a_key_given_twice_in_a_stack_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "stacks").mkdir()
    (tmp_path / "Pulumi.yaml").write_text((PROJECT_DIR / "Pulumi.yaml").read_text())
    (tmp_path / "stacks" / "Pulumi.x.yaml").write_text(
        "config:\n  lingjun-rdma:nonHostNetwork: false\n  lingjun-rdma:nonHostNetwork: true\n"
    )
    with pytest.raises(
        StackFileError, match=r"line 3, column 3: lingjun-rdma:nonHostNetwork given twice"
    ):
        stack_config("x", project_dir=tmp_path)


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
    ("setting", "said"),
    [("lingjunNodeCount=-1", "lingjun-rdma:lingjunNodeCount: -1 is not 0..1000"),
     ("nonHostNetwork=maybe", "lingjun-rdma:nonHostNetwork: not a boolean: use true or false"),
     ("vpcCidr=10.0.0.0/08", "lingjun-rdma:vpcCidr: write it as 10.0.0.0/8"),
     ("region=cn-" + "a" * 300, "lingjun-rdma:region: not a region ID (got text of 303 ")],
    ids=["out-of-range", "not-a-boolean", "cidr-not-as-written", "region-too-long"],
)  # fmt: skip
def test_a_config_refusal_is_one_line_naming_stack_key_and_fix(
    tmp_path: Path, setting: str, said: str
) -> None:
    done = _cli(RENDER, "--stack", "dev", "--out", "out", "--set", setting, cwd=tmp_path)

    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"render: dev: error: {said}")
    assert "(--set " in line  # render's own fix
    assert "pulumi config" not in line


def test_the_config_docs_state_every_range_as_the_code_defines_it() -> None:
    readme = (PROJECT_DIR / "docs" / "config.md").read_text()
    low, high = RESCAN_INTERVAL_RANGE
    rows = {
        "`--rescan-interval`, `rdmaRescanInterval`": (
            f"{low:g}-{high:g} s (the stack key in whole seconds: {max(1, math.ceil(low))}-"
            f"{high:g})"
        ),
        "`maxAllocations`, `rdmaMaxAllocations`": (
            f"1-{MAX_ALLOCATIONS_LIMIT} (a device plugin's list also within the kubelet's "
            f"{KUBELET_MESSAGE_MAX >> 20} MiB)"
        ),
        "shared IDs of all pools together": f"{MAX_DEVICE_IDS}",
        "pools in the plugin config": f"1-{MAX_POOLS}",
        "a file the project reads; a number in it": (
            f"{MAX_FILE_BYTES >> 20} MiB; {MAX_DIGITS} digits"
        ),
        "socket path in `--device-plugin-dir`": f"{MAX_UNIX_PATH} bytes (grpc's limit)",
        "`lingjunNodeCount`": f"0-{MAX_NODE_COUNT}",
        **{
            f"`{key}`": f"{format_seconds(lo)}-{format_seconds(hi)}"
            for key, (lo, hi) in DURATION_RANGES.items()
        },
    }
    rows[", ".join(f"`{n}`" for n in JOB_RANGES).join(("`RdmaJobSpec` ", ""))] = ", ".join(
        f"{lo}-{hi}" for lo, hi in JOB_RANGES.values()
    )
    for value, stated in rows.items():
        assert f"  | {value} | {stated} |" in readme, value


@pytest.mark.parametrize(("field", "bounds"), sorted(JOB_RANGES.items()))
def test_an_rdma_job_spec_count_outside_its_range_is_refused(
    field: str, bounds: tuple[int, int]
) -> None:
    low, high = bounds
    RdmaJobSpec(name="j", image="busybox:1.36", command=("true",), **{field: high})

    for value in (low - 1, high + 1):
        with pytest.raises(JobSpecError, match=f"Job j: {field}: {value} is not within"):
            RdmaJobSpec(name="j", image="busybox:1.36", command=("true",), **{field: value})


def test_an_rdma_job_spec_with_a_login_in_its_image_is_refused_without_quoting_it() -> None:
    with pytest.raises(JobSpecError) as caught:
        RdmaJobSpec(name="j", image=f"u:{SENTINEL}@registry.example.com/x:1", command=("true",))

    assert "Job j: image: not an image reference" in str(caught.value)
    assert SENTINEL not in str(caught.value)


def test_removing_a_previous_render_deletes_only_its_listed_unchanged_files(
    tmp_path: Path,
) -> None:
    out = tmp_path / "dev"
    render("dev", out)
    (out / "mywork.txt").write_text("precious")  # saved there while a render ran
    (out / "plan.md").write_text("edited")

    kept = _remove_render(out)

    assert kept == out
    assert sorted(p.name for p in out.iterdir()) == ["mywork.txt", "plan.md"]
    assert (out / "mywork.txt").read_text() == "precious"


def test_a_file_saved_into_out_while_a_render_runs_survives(tmp_path: Path) -> None:
    render("local", tmp_path / "out")
    proc = subprocess.Popen(
        [sys.executable, "-m", RENDER, "--stack", "local", "--out", "out"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(PROJECT_DIR)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(1.5)  # about when the render checks --out, plans, and swaps it
    (tmp_path / "out" / "mywork.txt").write_text("precious")
    _, stderr = proc.communicate(timeout=180)

    survivors = [p for p in tmp_path.rglob("mywork.txt") if p.read_text() == "precious"]
    assert len(survivors) == 1, stderr
    assert proc.returncode in (0, 2), stderr
    if proc.returncode == 0:  # saved after the swap: in the new render's directory
        assert survivors[0].parent == tmp_path / "out"
    else:
        assert "Traceback" not in stderr


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


@pytest.mark.parametrize(
    ("setup", "said"),
    [
        (lambda d: "x" * 300, "File name too long"),
        (lambda d: "/".join(["y" * 200] * 25), "File name too long"),
        (lambda d: "/proc/newdir", "cannot write in /proc"),
    ],
    ids=["name-too-long", "path-too-long", "proc"],
)
def test_an_out_the_file_system_refuses_is_one_line(
    tmp_path: Path, setup: Callable[[Path], str], said: str
) -> None:
    done = _cli(RENDER, "--stack", "local", "--out", setup(tmp_path), cwd=tmp_path)

    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert said in line
    assert list(tmp_path.iterdir()) == []  # no staging dir left beside it


def test_a_render_whose_report_cannot_be_printed_is_still_a_render(tmp_path: Path) -> None:
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", RENDER, "--stack", "local", "--out", "out"],
            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(PROJECT_DIR)},
            stdout=full, stderr=subprocess.PIPE, text=True, timeout=180, check=False,
        )  # fmt: skip

    assert done.returncode == 0
    (line,) = done.stderr.splitlines()
    assert line.startswith("render: local: wrote ")
    assert line.endswith(" files to out (stdout: No space left on device)")
    assert (tmp_path / "out" / "plan.md").is_file()


def test_a_set_without_equals_never_quotes_what_may_be_a_password(tmp_path: Path) -> None:
    done = _cli(
        RENDER, "--stack", "prod", "--out", "out", f"--set=registryPassword:{SENTINEL}",
        cwd=tmp_path,
    )  # fmt: skip

    assert done.returncode == 2
    assert "--set number 1: expected KEY=VALUE" in done.stderr
    assert SENTINEL not in done.stderr


@pytest.mark.parametrize(
    ("users", "said"),
    [
        (f"users: [{{name: u, user: {{token:{SENTINEL}}}}}]", "a field not known to be safe"),
        (f"{SENTINEL}: x\nusers: []", "a field not known to be safe"),
        ("users: []\npreferences: {colors: true}", "(preferences)"),
    ],
    ids=["flow-typo-key", "secret-as-key", "preferences"],
)
def test_a_kubeconfig_location_never_quotes_an_unknown_key(users: str, said: str) -> None:
    kubeconfig = (
        KUBECONFIG_HEAD + "clusters: [{name: c, cluster: {server: 'https://10.0.0.1:6443'}}]\n"
    ) + users
    config, _ = stack_config("local")
    raw = {k.removeprefix(f"{PROJECT}:"): v for k, v in config.items() if v}

    with pytest.raises(StackConfigError) as caught:
        parse({**raw, "kubeconfig": kubeconfig})

    assert said in str(caught.value)
    assert SENTINEL not in str(caught.value)


_CERT = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----\n"
_KEY = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49\n-----END PRIVATE KEY-----\n"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize(
    ("field", "data", "said"),
    [("client-certificate-data", _b64(_CERT + _KEY), "users[0].user.client-certificate-data"),
     ("certificate-authority-data", _b64(_KEY), "clusters[0].cluster.certificate-authority-data"),
     ("certificate-authority-data", "bm90IGEgY2VydA==", "clusters[0].cluster.certificate-"),
     ("certificate-authority-data", "%%%", "clusters[0].cluster.certificate-authority-data"),
     ("certificate-authority-data", _b64(_KEY.replace("PRIVATE KEY", "CERTIFICATE")),
      "clusters[0].cluster.certificate-authority-data"),
     ("client-certificate-data", _b64(_CERT + _CERT), None),
     ("certificate-authority-data", _b64(_CERT), None)],
    ids=["cert-and-key-bundle", "a-key-as-the-ca", "not-pem", "not-base64",
         "a-key-labelled-certificate", "a-chain", "a-ca"],
)  # fmt: skip
def test_inline_certificates_are_safe_only_as_certificates_alone(
    field: str, data: str, said: str | None
) -> None:
    cluster = {"server": "https://10.0.0.1:6443"}
    user = {"client-certificate": "/pki/a.crt", "client-key": "/pki/a.key"}
    (cluster if field.startswith("certificate-authority") else user)[field] = data
    kubeconfig = KUBECONFIG_HEAD + json.dumps(
        {"clusters": [{"name": "c", "cluster": cluster}], "users": [{"name": "u", "user": user}]}
    )[1:-1].replace('], "users"', ']\n"users"')

    where = kubeconfig_credential(kubeconfig)

    if said is None:
        assert where is None
    else:
        assert where is not None
        assert where.startswith(said), where
        assert where.endswith("(not PEM certificates alone)")


def test_a_server_url_with_a_query_needs_secret() -> None:
    kubeconfig = KUBECONFIG_HEAD + (
        f"clusters: [{{name: c, cluster: {{server: 'https://10.0.0.1/?access_token={SENTINEL}'}}}}]"
    )

    where = kubeconfig_credential(kubeconfig)

    assert where is not None
    assert where == "clusters[0].cluster.server (a login, query or fragment in the URL)"


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ('sampleJobs=["perftest","perftest"]', "sampleJobs: perftest is listed twice"),
        ("namespace=kube-system", "kube-system is the cluster's own"),
        ("pluginImage=UPPER/x:1", "not an image reference"),
        ("region=not a region", "region: not a region ID (got text of 12 characters)"),
        ("kubernetesVersion=banana", "kubernetesVersion: not a version as ACK spells it"),
    ],
)
def test_values_a_cloud_or_cluster_would_refuse_later_are_refused_at_once(
    tmp_path: Path, override: str, said: str
) -> None:
    extra = ["--set=perftestImage=registry.example.com/p:1"] if "sampleJobs" in override else []
    done = _cli(RENDER, "--stack", "dev", "--out", "out", f"--set={override}", *extra,
                cwd=tmp_path)  # fmt: skip

    assert done.returncode == 1, done.stderr
    assert said in done.stderr


def test_an_adopted_cluster_by_id_and_by_kubeconfig_at_once_is_refused(tmp_path: Path) -> None:
    done = _cli(RENDER, "--stack", "local", "--out", "out", "--set=clusterId=c123",
                cwd=tmp_path)  # fmt: skip

    assert done.returncode == 1
    assert "lingjun-rdma:clusterId: set together with lingjun-rdma:kubeconfig" in done.stderr


def test_a_key_left_blank_in_a_stack_file_is_unset(tmp_path: Path) -> None:
    (tmp_path / "stacks").mkdir()
    (tmp_path / "Pulumi.yaml").write_text((PROJECT_DIR / "Pulumi.yaml").read_text())
    local = (PROJECT_DIR / "stacks" / "Pulumi.local.yaml").read_text()
    (tmp_path / "stacks" / "Pulumi.local.yaml").write_text(
        local + "  lingjun-rdma:clusterId:\n  lingjun-rdma:jobAwaitTimeout:\n"
    )

    config, _ = stack_config("local", project_dir=tmp_path)

    assert config[f"{PROJECT}:clusterId"] == ""
    assert config[f"{PROJECT}:jobAwaitTimeout"] == ""


def test_a_stack_file_that_is_a_fifo_is_named_as_one(tmp_path: Path) -> None:
    (tmp_path / "stacks").mkdir()
    (tmp_path / "Pulumi.yaml").write_text((PROJECT_DIR / "Pulumi.yaml").read_text())
    os.mkfifo(tmp_path / "stacks" / "Pulumi.fifo.yaml")

    with pytest.raises(StackFileError, match=r"Pulumi\.fifo\.yaml: a FIFO, not a regular file"):
        stack_config("fifo", project_dir=tmp_path)


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


@pytest.mark.parametrize("listed", ["../../victim.txt", "ABSOLUTE"])
def test_a_render_list_naming_files_elsewhere_deletes_nothing_there(
    tmp_path: Path, listed: str
) -> None:
    out = tmp_path / "a" / "out"
    render("dev", out)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    name = str(victim) if listed == "ABSOLUTE" else listed
    marker = json.loads((out / MARKER).read_text())
    data = victim.read_bytes()
    marker["files"][name] = [len(data), hashlib.sha256(data).hexdigest()]
    (out / MARKER).write_text(json.dumps(marker))

    with pytest.raises(
        OutputError, match=r"\.lingjun-render names '.*'( \([0-9]+ characters\))?, a file a render"
    ):
        render("dev", out)

    assert victim.read_text() == "keep me"


def test_a_render_list_naming_a_file_a_render_never_names_deletes_nothing(
    tmp_path: Path,
) -> None:
    """The marker lists a user's file beside the render's, with its right size and digest (a
    forged or hand-edited list): render refuses the dir; the file stays."""
    out = tmp_path / "out"
    render("dev", out)
    precious = out / "precious.txt"
    precious.write_text("keep me")
    marker = json.loads((out / MARKER).read_text())
    data = precious.read_bytes()
    marker["files"]["precious.txt"] = [len(data), hashlib.sha256(data).hexdigest()]
    (out / MARKER).write_text(json.dumps(marker))

    with pytest.raises(OutputError, match=r"names 'precious\.txt', a file a render never writes"):
        render("dev", out)

    assert precious.read_text() == "keep me"


def test_an_out_below_a_regular_file_says_so(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")

    done = _cli(RENDER, "--stack", "local", "--out", "afile/sub", cwd=tmp_path)

    assert done.returncode == 2
    assert f"--out {tmp_path / 'afile' / 'sub'}: {tmp_path / 'afile'} is not a directory" in (
        done.stderr
    )


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


def _project_copy(tmp_path: Path, stack_file: str) -> Path:
    (tmp_path / "stacks").mkdir()
    (tmp_path / "Pulumi.yaml").write_text((PROJECT_DIR / "Pulumi.yaml").read_text())
    (tmp_path / "stacks" / "Pulumi.x.yaml").write_text(stack_file)
    return tmp_path


@pytest.mark.parametrize(
    ("stack_file", "said"),
    [
        ("config:\n  123: x\n", "line 2, column 3: config key 123 is not a key"),
        ("config:\n  a: 1\n  ~: y\n", "line 3, column 3: config key None is not a key"),
        (  # an en dash pasted from a web page: its place, not its text (a value may be pasted)
            "config:\n  lingjun-rdma:region: cn-wulanchabu\n  lingjun\u2013rdma:rdmaPoolMode: x\n",
            "x.yaml: line 3, column 3: config key 'lingjun\u2013rdma:rdmaPoolMode' is not a key "
            "(region, or namespace:key; a look-alike character pasted in, such as an en dash for a "
            "hyphen",
        ),
        (
            "confg:\n  lingjun-rdma:region: cn-wulanchabu\n",
            "unknown top-level key, confg: did you mean config?",
        ),
        ("nothing: here\n", "unknown top-level key, nothing: remove it or fix its spelling"),
        (
            "lingjun-rdma:region: cn-wulanchabu\n",
            "unknown top-level key, lingjun-rdma:region: a config key: indent it under `config:`",
        ),
        (
            "config:\n  lingjun-rdma:region: !!binary Y24td3VsYW5jaGFidQ==\n",
            "x.yaml: line 2, column 3: lingjun-rdma:region: a binary value (YAML !!binary), not "
            "text: write the value itself",
        ),
        (  # in a list: json.dumps of it would raise
            "config:\n  lingjun-rdma:zoneIds: [!!binary eHl6]\n",
            "x.yaml: line 2, column 3: lingjun-rdma:zoneIds: a binary value (YAML !!binary)",
        ),
    ],
)
def test_a_stack_file_of_the_wrong_shape_is_one_line(
    tmp_path: Path, stack_file: str, said: str
) -> None:
    project = _project_copy(tmp_path, stack_file)

    with pytest.raises(StackFileError, match=re.escape(said)):
        stack_config("x", project_dir=project)


def test_a_pulumi_yaml_of_another_project_is_refused(tmp_path: Path) -> None:
    project = _project_copy(tmp_path, "config: {}\n")
    (project / "Pulumi.yaml").write_text("")

    with pytest.raises(StackFileError, match=r"Pulumi\.yaml: not this project's"):
        stack_config("x", project_dir=project)


def test_a_stack_config_dir_elsewhere_is_refused_not_silently_ignored(tmp_path: Path) -> None:
    project = _project_copy(tmp_path, "config: {}\n")
    text = (project / "Pulumi.yaml").read_text()
    (project / "Pulumi.yaml").write_text(
        text.replace("stackConfigDir: stacks", "stackConfigDir: nowhere")
    )

    with pytest.raises(StackFileError) as caught:
        stack_config("x", project_dir=project)

    assert "Pulumi.yaml: stackConfigDir is text of 7 characters, not stacks" in str(caught.value)


def test_a_key_pulumi_yaml_declares_but_the_program_does_not_read_is_named_there(
    tmp_path: Path,
) -> None:
    project = _project_copy(tmp_path, "config: {}\n")
    declared = (project / "Pulumi.yaml").read_text()
    (project / "Pulumi.yaml").write_text(declared + "  newKey:\n    type: string\n    default: x\n")

    with pytest.raises(StackFileError) as caught:
        stack_config("x", project_dir=project)

    assert str(caught.value) == (
        "Pulumi.yaml: declares newKey, which the program does not read: remove it from "
        "Pulumi.yaml, or give it a field in infra/stack/keys.py"
    )


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("registryUsername=robot", "lingjun-rdma:registryUsername: only used with"),
        ("lingjunMachineType=efg2\nrm", "lingjunMachineType: not an Alibaba Cloud ID or name"),
        ("lingjunImageId=" + "i" * 200, "lingjunImageId: "),
        ('zoneIds=["cn-a\\nx"]', "(pulumi config set --path 'lingjun-rdma:zoneIds[0]' <id>)"),
        ("sampleJobs=[1,2]", "lingjun-rdma:sampleJobs[1]: must be text (--set 'sampleJobs=["),
        (f"ncclTestsImage=u:{SENTINEL}@registry.example.com/n:1", "ncclTestsImage: not an image"),
    ],
    ids=[
        "username-without-build",
        "id-newline",
        "id-long",
        "list-item-newline",
        "list-index",
        "unused-image-login",
    ],
)
def test_stack_values_of_no_use_or_no_shape_are_refused(
    tmp_path: Path, override: str, said: str
) -> None:
    done = _cli(RENDER, "--stack", "dev", "--out", "out", f"--set={override}", cwd=tmp_path)

    assert done.returncode == 1, done.stderr
    assert said in done.stderr
    assert SENTINEL not in done.stderr


def test_a_set_key_that_is_no_key_is_refused(tmp_path: Path) -> None:
    done = _cli(RENDER, "--stack", "dev", "--out", "out", "--set=:=x", cwd=tmp_path)

    assert done.returncode == 2
    assert "--set number 1: expected KEY=VALUE with KEY a config key" in done.stderr


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


@pytest.mark.parametrize("kubeconfig", ["not: [valid", f"{SENTINEL}-just-a-string"])
def test_a_kubeconfig_given_as_a_secret_must_still_be_one(tmp_path: Path, kubeconfig: str) -> None:
    done = _cli(
        RENDER, "--stack", "local", "--out", "out", f"--set=kubeconfig={kubeconfig}",
        cwd=tmp_path,
    )  # fmt: skip

    assert done.returncode == 1
    assert "lingjun-rdma:kubeconfig: not " in done.stderr
    assert SENTINEL not in done.stderr


def test_an_encrypted_value_of_a_key_that_is_no_credential_is_refused(tmp_path: Path) -> None:
    project = _project_copy(tmp_path, "config:\n  lingjun-rdma:region:\n    secure: AAABAxyz\n")

    with pytest.raises(StackFileError, match=r"lingjun-rdma:region is encrypted \(secure:\), but "):
        stack_config("x", project_dir=project)


def test_an_encrypted_credential_is_taken_as_a_secret_without_its_value(tmp_path: Path) -> None:
    project = _project_copy(
        tmp_path,
        "config:\n  lingjun-rdma:clusterMode: existing\n"
        f"  lingjun-rdma:kubeconfig:\n    secure: {SENTINEL}\n",
    )

    config, secrets = stack_config("x", project_dir=project)

    assert secrets == [f"{PROJECT}:kubeconfig"]
    assert SENTINEL not in json.dumps(config)


def test_a_key_set_twice_on_the_command_line_is_refused(tmp_path: Path) -> None:
    twice = ("--set=nonHostNetwork=true", "--set=nonHostNetwork=false")
    done = _cli(RENDER, "--stack", "dev", "--out", "out", *twice, cwd=tmp_path)

    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1].endswith("--set nonHostNetwork: given twice: keep one")


def test_pulumi_yaml_values_in_shorthand_and_as_value_are_read(tmp_path: Path) -> None:
    project = _project_copy(tmp_path, "config: {}\n")
    declared = (
        "  namespace:\n    type: string\n    default: lingjun-rdma\n"
        "    description: namespace of the device plugin and the sample Jobs\n"
    )
    pulumi_yaml = (project / "Pulumi.yaml").read_text()
    assert declared in pulumi_yaml
    (project / "Pulumi.yaml").write_text(pulumi_yaml.replace(declared, "  namespace: rdma-a\n"))
    shorthand, _ = stack_config("x", project_dir=project)
    (project / "Pulumi.yaml").write_text(
        pulumi_yaml.replace(declared, "  namespace:\n    type: string\n    value: rdma-b\n")
    )
    valued, _ = stack_config("x", project_dir=project)

    assert shorthand[f"{PROJECT}:namespace"] == "rdma-a"
    assert valued[f"{PROJECT}:namespace"] == "rdma-b"


def test_a_resource_name_whose_socket_path_is_too_long_is_refused_before_planning(
    tmp_path: Path,
) -> None:
    name = "rdma." + "d" * 50 + ".example.com/hca"  # valid, but its socket path is 124 bytes

    done = _cli(RENDER, "--stack", "dev", "--out", "out",
                f"--set=rdmaResourceName={name}", cwd=tmp_path)  # fmt: skip

    assert done.returncode == 1, done.stderr
    assert "over the 105-byte limit of a unix socket" in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("api", "refused"), [("devicePlugin", True), ("dra", False)])
def test_shared_ids_over_the_kubelets_message_limit_are_refused_before_planning(
    tmp_path: Path, api: str, refused: bool
) -> None:
    """100000 IDs of 46 characters take 4.4 MiB without any NUMA node: the kubelet would end
    every ListAndWatch. The DRA driver publishes slices instead: no such bound."""
    # a name of 40 characters makes the IDs long; DRA names no resource (its key is refused)
    name = [f"--set=rdmaResourceName=rdma/{'s' * 40}"] if api == "devicePlugin" else []
    done = _cli(RENDER, "--stack", "dev", "--out", "out", f"--set=rdmaApi={api}",
                "--set=kubernetesVersion=1.34.1-aliyun.1", "--set=rdmaMaxAllocations=100000",
                *name, cwd=tmp_path)  # fmt: skip

    if refused:
        assert done.returncode == 1, done.stderr
        assert done.stderr.splitlines()[-1].endswith(
            "lingjun-rdma:rdmaMaxAllocations: 100000 IDs of up to 46 characters (the pool's name "
            "and a number) are over the 4 MiB the kubelet reads of a device list, even without "
            "NUMA nodes: at most 71278 fit (--set rdmaMaxAllocations=71278), or a shorter "
            "rdmaResourceName"
        )
        assert not (tmp_path / "out").exists()
    else:
        assert done.returncode == 0, done.stderr


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


def test_unrecognized_arguments_are_refused_without_being_echoed(tmp_path: Path) -> None:
    done = _cli(RENDER, "--stack", "dev", "--out", "out", f"--password={SENTINEL}",
                cwd=tmp_path)  # fmt: skip

    assert done.returncode == 2
    assert "1 argument(s) it does not take (--password among them) (values not quoted back" in (
        done.stderr
    )
    assert "e.g. --set KEY=VALUE (--help lists the flags)" in done.stderr
    assert SENTINEL not in done.stderr


def test_a_program_without_set_gives_no_set_example(tmp_path: Path) -> None:
    done = _cli("plugin.deviceplugin", "--bogus-flag", cwd=tmp_path)

    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "rdma-device-plugin: error: 1 argument(s) it does not take (--bogus-flag among them) "
        "(values not quoted back: one may be a secret); each flag takes its value after '=' or "
        "as the next argument (--help lists the flags)"
    ]


@pytest.mark.parametrize(
    ("module", "args"),
    [
        ("plugin.deviceplugin", ("--discovery", SENTINEL)),
        ("plugin.deviceplugin", ("--rescan-interval", SENTINEL)),
        ("plugin.deviceplugin", ("--metrics-address", SENTINEL)),
        ("plugin.podenv", ("--hcas", "mlx5_0", "--family", SENTINEL)),
        (DEPLOY, (SENTINEL, "--stack", "dev")),
        (RENDER, ("--stack", f"{SENTINEL}!", "--out", "out")),
    ],
    ids=["choice", "float", "launch-spec", "podenv-choice", "deploy-action", "stack-name"],
)  # fmt: skip
def test_a_bad_flag_value_is_one_line_that_does_not_quote_it(
    tmp_path: Path, module: str, args: tuple[str, ...]
) -> None:
    done = _cli(module, *args, cwd=tmp_path)

    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.endswith("(--help lists the flags)")
    assert SENTINEL not in done.stderr


def test_a_list_nested_too_deep_in_set_is_one_line(tmp_path: Path) -> None:
    deep = "[" * 5000 + "]" * 5000

    done = _cli(RENDER, "--stack", "dev", "--out", "out", f"--set=zoneIds={deep}",
                cwd=tmp_path)  # fmt: skip

    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "lingjun-rdma:zoneIds: JSON nested too deep to read" in done.stderr


@pytest.mark.parametrize(
    ("stack_file", "said"),
    [
        ("config:\n  lingjun-rdma:region: cn-a\n  region: cn-b\n",
         "lingjun-rdma:region is given twice (with and without its namespace): keep one"),
        (f"config:\n  {SENTINEL}: a\n  {SENTINEL}: b\n",
         f"line 3, column 3: {SENTINEL} given twice: keep one"),
        ("config:\n  lingjun-rdma:zoneIds: '[\"cn-a\"]'\n",
         "lingjun-rdma:zoneIds: text of 8 characters, not a YAML list"),
        (f"config:\n  lingjun-rdma:{SENTINEL}: x\n",
         f"lingjun-rdma:{SENTINEL}: unknown key: known keys: acrInstanceId, "),
        ("config: []\n", "`config:` is a list, not a mapping of keys to values"),
    ],
    ids=["key-twice", "unknown-key-repeated", "list-as-text",
         "unknown-key-named", "config-an-empty-list"],
)  # fmt: skip
def test_a_stack_file_the_cli_would_read_otherwise_is_refused(
    tmp_path: Path, stack_file: str, said: str
) -> None:
    project = _project_copy(tmp_path, stack_file)

    with pytest.raises((StackFileError, StackConfigError)) as refused:
        stack_config("x", project_dir=project)

    assert said in str(refused.value)


def test_an_adopted_clusters_keys_on_a_stack_that_creates_one_are_refused(tmp_path: Path) -> None:
    done = _cli(RENDER, "--stack", "dev", "--out", "out", "--set=clusterId=c123",
                cwd=tmp_path)  # fmt: skip

    assert done.returncode == 1
    assert "lingjun-rdma:clusterId: only used with lingjun-rdma:clusterMode: existing" in (
        done.stderr
    )


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


@pytest.mark.parametrize(
    ("given", "passphrase"),
    [("env", "correct horse battery staple"), ("file", "correct horse battery staple"),
     ("env", "Ünïcödé-密码-паролька"), ("env", "P\udce4ssw\udcf6rd-battery-staple")],
    ids=["env", "file", "not-ascii", "not-utf-8"],  # the last: Latin-1 bytes, set in a shell
)  # fmt: skip
def test_the_passphrase_and_token_are_masked_and_controls_escaped_in_what_the_engine_says(
    tmp_path: Path, given: str, passphrase: str
) -> None:
    """A CLI or a plugin that prints its environment (a debug flag, a crash dump) must not put
    the stack's passphrase or the backend's token on the terminal or in a CI log."""
    token = "pul-0123456789abcdef0123456789abcdef"
    script = (
        '#!/bin/sh\nif [ "$1" = version ]; then echo v3.277.0; exit 0; fi\n'
        'case "$*" in *preview*) ;; *) exit 0;; esac\n'  # the stack is selected
        'p="$PULUMI_CONFIG_PASSPHRASE$(cat "$PULUMI_CONFIG_PASSPHRASE_FILE" 2>/dev/null)"\n'
        'echo "{\\"env\\": \\"$p\\"}"; printf "$PULUMI_ACCESS_TOKEN" | base64\n'
        "printf 'clear\\033[2J screen\\n'\n"
        'echo "error: passphrase is $p" >&2; exit 3\n'
    )
    path = _fake_pulumi(tmp_path / "bin", script)
    env = {"PULUMI_ACCESS_TOKEN": token}
    if given == "env":
        env["PULUMI_CONFIG_PASSPHRASE"] = passphrase
    else:
        (tmp_path / "phrase").write_text(passphrase + "\n")
        env["PULUMI_CONFIG_PASSPHRASE_FILE"] = str(tmp_path / "phrase")

    done = _cli(DEPLOY, "preview", "--stack", "local", cwd=tmp_path, path=path, env=env)

    said = done.stdout + done.stderr
    assert done.returncode == 1, done.stderr
    assert "error: passphrase is [secret]" in done.stderr
    assert "battery" not in said
    assert base64.b64encode(token.encode()).decode()[:12] not in said
    assert said.count("[secret]") >= 3
    assert "clear\\x1b[2J screen" in done.stdout  # a control character escaped, secret or not


def test_cloud_and_backend_credentials_are_masked_in_what_the_engine_says(tmp_path: Path) -> None:
    """The provider's credentials come from the environment too, under either spelling, and so
    do a state bucket's (s3:// on OSS, azblob://, gs://)."""
    names = ("ALICLOUD_ACCESS_KEY", "ALICLOUD_SECRET_KEY", "ALICLOUD_SECURITY_TOKEN",
             "ALIBABA_CLOUD_ACCESS_KEY_ID", "ALIBABA_CLOUD_ACCESS_KEY_SECRET",
             "ALIBABA_CLOUD_SECURITY_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
             "AWS_SESSION_TOKEN", "AZURE_STORAGE_KEY", "AZURE_STORAGE_SAS_TOKEN",
             "GOOGLE_OAUTH_ACCESS_TOKEN")  # fmt: skip
    credentials = {name: f"{i}-Zq8xR2vN7mK4pL9sT3wY6b" for i, name in enumerate(names)}
    script = (
        '#!/bin/sh\nif [ "$1" = version ]; then echo v3.277.0; exit 0; fi\n'
        'case "$*" in *preview*) ;; *) exit 0;; esac\n'
        "env | grep -E '^(ALI|AWS|AZURE|GOOGLE)' | sort\n"
        'echo "error: secret=$ALICLOUD_SECRET_KEY" >&2; exit 1\n'
    )
    path = _fake_pulumi(tmp_path / "bin", script)
    env = credentials

    done = _cli(DEPLOY, "preview", "--stack", "local", cwd=tmp_path, path=path, env=env)

    said = done.stdout + done.stderr
    assert done.returncode == 1, done.stderr
    assert "error: secret=[secret]" in done.stderr
    assert "Zq8xR2vN" not in said
    assert [ln for ln in done.stdout.splitlines() if "=[secret]" in ln] == [
        f"{name}=[secret]" for name in sorted(credentials)
    ]


def test_a_passphrase_file_deploy_cannot_read_is_said_as_not_masked(tmp_path: Path) -> None:
    path = _fake_pulumi(tmp_path / "bin", "#!/bin/sh\necho v3.277.0\n")
    big = tmp_path / "phrase"
    big.write_text("x" * (2 << 20))
    env = {"PULUMI_CONFIG_PASSPHRASE_FILE": str(big)}

    done = _cli(DEPLOY, "preview", "--stack", "local", cwd=tmp_path, path=path, env=env)

    assert done.stderr.splitlines()[0] == (
        f"deploy: PULUMI_CONFIG_PASSPHRASE_FILE {big}: over 1024 KiB: the passphrase in it is "
        "not masked in the engine's output"
    )


def test_a_short_passphrase_is_said_to_be_masked_only_where_it_stands_alone(
    tmp_path: Path,
) -> None:
    path = _fake_pulumi(tmp_path / "bin", "#!/bin/sh\necho v3.277.0\n")
    env = {"PULUMI_CONFIG_PASSPHRASE": "Zq7Xw9K"}

    done = _cli(DEPLOY, "preview", "--stack", "local", cwd=tmp_path, path=path, env=env)

    assert done.stderr.splitlines()[0] == (
        "deploy: PULUMI_CONFIG_PASSPHRASE: fewer than 8 characters, masked in the engine's "
        "output only where it stands alone, not encoded: use a longer one"
    )
    assert "Zq7Xw9K" not in done.stdout + done.stderr


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


def test_a_render_marker_nested_too_deep_is_someone_elses_file_not_a_traceback(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / MARKER).write_text("[" * 100000 + "]" * 100000)

    with pytest.raises(OutputError, match=r"its \.lingjun-render is not JSON, so nothing there"):
        render("dev", out)


def test_a_key_given_twice_in_a_stack_file_is_named(tmp_path: Path) -> None:
    """A key's name is no secret: named, its author finds it."""
    project = _project_copy(
        tmp_path, f"config:\n  lingjun-rdma:{SENTINEL}: a\n  lingjun-rdma:{SENTINEL}: b\n"
    )

    with pytest.raises(StackFileError) as refused:
        stack_config("x", project_dir=project)

    assert str(refused.value).endswith(
        f"line 3, column 3: lingjun-rdma:{SENTINEL} given twice: keep one"
    )


@pytest.fixture
def mounted_out(tmp_path: Path) -> Iterator[Path]:
    """--out as a container's volume: a mount point, which no rename can move."""
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(out)], check=True)
    yield out
    subprocess.run(["umount", "-l", str(out)], check=True)


def test_an_out_that_is_a_mount_point_is_rendered_in_place(mounted_out: Path) -> None:
    render("dev", mounted_out)
    again = render("local", mounted_out)  # replaces dev's render, file by file

    assert os.path.ismount(mounted_out)
    assert sorted(mounted_out.iterdir()) == again
    assert "local" in (mounted_out / "plan.md").read_text()
    marker = json.loads((mounted_out / MARKER).read_text())
    assert sorted(marker["files"]) == sorted(p.name for p in again if p.name != MARKER)

    (mounted_out / "mywork.txt").write_text("precious")
    with pytest.raises(OutputError, match="holds files a render did not write"):
        render("dev", mounted_out)
    assert (mounted_out / "mywork.txt").read_text() == "precious"


def test_a_volume_too_full_for_a_render_keeps_the_previous_one_whole(tmp_path: Path) -> None:
    """A render in place needs room for its files beside the previous render's: when there is
    none, the previous render is left whole (it was left partial), and once there is room the
    next render goes through."""
    out = tmp_path / "vol"
    out.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=44k", "tmpfs", str(out)], check=True)
    try:
        small = render("local", out, ["sampleJobs=[]", "perftestImage="])
        before = {p.name: p.read_bytes() for p in small}
        with pytest.raises(OutputError) as refused:
            render("dev", out)
        left = {p.name: p.read_bytes() for p in out.iterdir()}
        # the room it names is enough: the volume grown by just that much takes the render
        needs = int(re.findall(r"needs (\d+) KiB free", str(refused.value))[0])
        fs = os.statvfs(out)
        used = (fs.f_blocks - fs.f_bfree) * fs.f_frsize
        size = used + needs * 1024
        subprocess.run(["mount", "-o", f"remount,size={size}", str(out)], check=True)
        again = render("dev", out)
        after = sorted(out.iterdir())
    finally:
        subprocess.run(["umount", "-l", str(out)], check=True)

    assert str(refused.value).startswith(
        f"--out {out}: cannot write in it (No space left on device): the previous render there "
        "is kept whole: this render needs "
    )
    assert left == before
    assert "job-lingjun-rdma-perftest.yaml" in [p.name for p in again]
    assert after == again


def test_a_volume_under_a_read_only_root_is_rendered_in_place(tmp_path: Path) -> None:
    """`docker run --read-only -v $PWD/out:/out`: the render cannot stage beside the volume."""
    root = tmp_path / "root"
    out = root / "vol"
    out.mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(root), str(root)], check=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(out)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(root)], check=True)
        with pytest.raises(OSError, match="Read-only file system"):
            (root / "probe").write_text("")  # the root is read-only indeed

        written = render("dev", out)
        again = render("dev", out)
    finally:
        subprocess.run(["umount", "-l", str(out)], check=True)
        subprocess.run(["umount", "-l", str(root)], check=True)

    assert written == again
    assert "plan.md" in [p.name for p in again]


def test_temp_files_a_killed_render_left_in_a_mount_point_are_removed_by_the_next(
    mounted_out: Path,
) -> None:
    """Every later render refused them as files it did not write, for good. A temp file of a
    name a render never writes is someone's: still refused."""
    render("dev", mounted_out)
    (mounted_out / ".plan.md.tmp-k2j4h6g8").write_text("# half")
    (mounted_out / f".{MARKER}.tmp-a1b2c3d4").write_text('{"fi')
    render("dev", mounted_out)
    (mounted_out / ".notes.txt.tmp-a1b2c3d4").write_text("mine")
    with pytest.raises(OutputError, match=r"\.notes\.txt\.tmp-a1b2c3d4"):
        render("dev", mounted_out)

    assert not [
        p.name for p in mounted_out.iterdir() if ".tmp-" in p.name and "notes" not in p.name
    ]


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_what_killed_renders_left_beside_out_is_removed_by_the_next_and_nothing_else(
    tmp_path: Path,
) -> None:
    """A staging dir and an old render's dir whose render is dead; a live render's staging dir
    and an old dir holding someone's file stay (9 dirs after 20 kills were left for good)."""
    out = tmp_path / "out"
    render("dev", out)
    dead, alive = _dead_pid(), os.getpid()
    staging = tmp_path / f".render-{dead}-abcd1234"
    staging.mkdir()
    (staging / "plan.md").write_text("# half")
    old = tmp_path / f".render-{dead}-abcd1234.old"
    shutil.copytree(out, old)
    kept_old = tmp_path / f".render-{dead}-efgh5678.old"
    shutil.copytree(out, kept_old)
    (kept_old / "mywork.txt").write_text("precious")
    running = tmp_path / f".render-{alive}-ijkl9012"
    running.mkdir()

    render("dev", out)

    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["out", kept_old.name, running.name]
    )
    assert [p.name for p in kept_old.iterdir()] == ["mywork.txt"]


def test_a_render_killed_while_renaming_into_a_mount_point_is_finished_by_the_next(
    mounted_out: Path, tmp_path: Path
) -> None:
    """SIGKILL (an OOM kill) after two of its files were renamed in, before its list: the next
    render refused them as files a render did not write, for good."""
    render("dev", mounted_out)
    killer = (
        "import os, signal, sys\n"
        "real, calls = os.replace, [0]\n"
        "def dying(*args, **kwargs):\n"
        "    calls[0] += 1\n"
        "    if calls[0] == 3:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return real(*args, **kwargs)\n"
        "os.replace = dying\n"
        "from infra.commands.render import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(PROJECT_DIR)}
    done = subprocess.run(
        [sys.executable, "-c", killer, "--stack", "dev", "--out", str(mounted_out),
         "--set", "namespace=lingjun-rdma-b"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert [p.name for p in mounted_out.iterdir() if ".tmp-" in p.name]  # it died midway

    again = render("dev", mounted_out)

    assert sorted(mounted_out.iterdir()) == again
    assert not [p.name for p in mounted_out.iterdir() if ".tmp-" in p.name]
    marker = json.loads((mounted_out / MARKER).read_text())
    assert sorted(marker["files"]) == sorted(p.name for p in again if p.name != MARKER)


def test_a_fresh_ext4_volume_as_out_is_rendered_and_its_lost_found_kept(tmp_path: Path) -> None:
    image, out = tmp_path / "vol.img", tmp_path / "out"
    subprocess.run(["truncate", "-s", "8M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", str(image)], check=True)
    out.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(out)], check=True)
    try:
        first = render("dev", out)
        again = render("dev", out)
        assert (out / "lost+found").is_dir()
        assert [p.name for p in first] == [p.name for p in again]
    finally:
        subprocess.run(["umount", "-l", str(out)], check=True)


def test_a_read_only_mount_point_as_out_says_so(mounted_out: Path, tmp_path: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(mounted_out)], check=True)

    done = _cli(RENDER, "--stack", "local", "--out", str(mounted_out), cwd=tmp_path)

    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"render: local: error: --out {mounted_out}: cannot write in it (Read-only file system)"
    ]


@pytest.mark.parametrize("exists", [True, False])
def test_an_out_on_a_read_only_file_system_says_so_not_chmod(
    mounted_out: Path, tmp_path: Path, exists: bool
) -> None:
    """Not a mount point itself (that is rendered in place): a dir in one, or a new one there.
    The user is root, whom no chmod would help."""
    out = mounted_out / "prev"
    if exists:
        out.mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(mounted_out)], check=True)

    done = _cli(RENDER, "--stack", "local", "--out", str(out), cwd=tmp_path)

    where = f"{out}:" if exists else f"{out}: {mounted_out}"
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"render: local: error: --out {where} is on a read-only file system: name a directory "
        "on a writable one"
    ]


@pytest.mark.parametrize(
    ("prog", "args", "flag"),
    [(RENDER, ("--stack", "dev", "--stack=prod", "--out", "out"), "--stack"),
     (DEPLOY, ("preview", "--stack", "dev", "--stack", "prod"), "--stack"),
     ("plugin.podenv", ("--family", "ipv6", "--family", "ipv4"), "--family")],
    ids=["render", "deploy", "podenv"],
)  # fmt: skip
def test_a_flag_that_takes_one_value_given_twice_is_refused(
    tmp_path: Path, prog: str, args: tuple[str, ...], flag: str
) -> None:
    """argparse kept the last silently: `--stack dev --stack prod` rendered prod."""
    done = _cli(prog, *args, cwd=tmp_path)

    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"python -m {prog}: error: {flag}: given twice: keep one (--help lists the flags)"
    ]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("prog", "args"),
    [("plugin.deviceplugin", ("--config", "/tmp/bad\nINJECTED line")),
     ("plugin.deviceplugin", ("--kubeconfig", "/tmp/bad\nINJECTED line")),
     ("plugin.dra", ("--kubeconfig", "/tmp/bad\nINJECTED line", "--node-name", "n1")),
     ("plugin.podenv", ("--hcas", "mlx5_0", "--sysfs-root", "/tmp/bad\nINJECTED line")),
     (DEPLOY, ("preview", "--stack", "local", "--project-dir", "/tmp/bad\nINJECTED line"))],
    ids=["plugin-config", "plugin-kubeconfig", "dra-kubeconfig", "podenv-sysfs", "deploy-project"],
)  # fmt: skip
def test_a_line_break_in_a_path_is_escaped_in_its_flags_refusal(
    tmp_path: Path, prog: str, args: tuple[str, ...]
) -> None:
    """It made a second line, which deploy even prefixed as its own."""
    done = _cli(prog, *args, cwd=tmp_path)

    assert done.returncode == 2, done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if "INJECTED" in ln]
    assert "/tmp/bad\\nINJECTED line" in line
    assert not [ln for ln in done.stderr.splitlines() if ln.startswith(("INJECTED", "deploy: INJ"))]


def test_a_render_to_a_path_stdout_cannot_encode_is_said_escaped(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", RENDER, "--stack", "dev", "--out", "out-ü"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(PROJECT_DIR), "PYTHONIOENCODING": "ascii"},
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith(" files to out-\\xfc\n")


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


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        (
            "vpcCidr=192.168.1.0/16",
            "lingjun-rdma:vpcCidr: 192.168.1.0/16 has bits set past its prefix: the network is "
            "192.168.0.0/16 (--set vpcCidr=192.168.0.0/16)",
        ),
        (
            'vswitchCidrs=["10.0.0.0/33"]',
            "lingjun-rdma:vswitchCidrs[0]: not an IPv4 CIDR like 192.168.0.0/20 (got text of 11 "
            "characters) (--set 'vswitchCidrs=[\"192.168.0.0/20\"]')",
        ),
        (
            "zoneIds=[1]",
            "lingjun-rdma:zoneIds[0]: must be text (--set 'zoneIds=[\"cn-wulanchabu-c\"]')",
        ),
        (
            'zoneIds={"a": 1}',
            "lingjun-rdma:zoneIds: must be a list of text (--set 'zoneIds=[",
        ),
    ],
    ids=["host-bits", "list-item-cidr", "list-item-type", "list-shape"],
)
def test_a_list_or_cidr_key_refused_gets_renders_own_fix(
    tmp_path: Path, setting: str, said: str
) -> None:
    done = _cli(RENDER, "--stack", "dev", "--out", "out", f"--set={setting}", cwd=tmp_path)

    assert done.returncode == 1, done.stderr
    assert said in done.stderr
    assert "Input should be" not in done.stderr  # pydantic's words, not the user's


def test_an_out_that_is_a_link_to_nothing_is_refused_and_nothing_made_there(
    tmp_path: Path,
) -> None:
    (tmp_path / "out").symlink_to(tmp_path / "elsewhere")

    done = _cli(RENDER, "--stack", "dev", "--out", "out", cwd=tmp_path)

    assert done.returncode == 2, done.stderr
    assert "a symbolic link to nothing" in done.stderr
    assert not (tmp_path / "elsewhere").exists()


def test_an_out_with_a_line_break_is_said_on_one_line(tmp_path: Path) -> None:
    done = _cli(RENDER, "--stack", "local", "--out", "x\nINJECTED", cwd=tmp_path)

    assert done.returncode == 0, done.stderr
    (said,) = done.stdout.splitlines()
    assert re.fullmatch(r"render: local: wrote [0-9]+ files to x\\nINJECTED", said)
    assert (tmp_path / "x\nINJECTED").is_dir()


@pytest.mark.parametrize("out", ["loop/out", "loop"])
def test_an_out_under_or_at_a_symlink_loop_is_one_line(tmp_path: Path, out: str) -> None:
    (tmp_path / "loop").symlink_to(tmp_path / "loop")

    done = _cli(RENDER, "--stack", "dev", "--out", out, cwd=tmp_path)

    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert line.endswith("a symbolic link on its path leads back to itself: fix the link")


def test_an_empty_out_is_refused_not_taken_as_the_current_directory(tmp_path: Path) -> None:
    done = _cli(RENDER, "--stack", "dev", "--out", "", cwd=tmp_path)

    assert done.returncode == 2, done.stderr
    assert "argument --out: empty: name the directory to render into" in done.stderr
    assert not list(tmp_path.iterdir())


def test_an_existing_empty_out_keeps_its_owner_group_and_mode(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    os.chown(out, 1234, 1234)  # the tests run as root, as CI does
    out.chmod(0o2770)  # a shared group's directory

    done = _cli(RENDER, "--stack", "dev", "--out", "out", cwd=tmp_path)

    assert done.returncode == 0, done.stderr
    kept = out.stat()
    assert (kept.st_uid, kept.st_gid, stat.S_IMODE(kept.st_mode)) == (1234, 1234, 0o2770)
    assert {p.stat().st_gid for p in out.iterdir()} == {1234}  # its files join its group


def test_a_render_again_keeps_each_files_mode(tmp_path: Path) -> None:
    """A file of the last render made 0600 went back to 0644 (podenv's --out keeps its)."""
    out = tmp_path / "out"
    render("dev", out)
    (out / "plan.md").chmod(0o600)

    render("dev", out, ["lingjunNodeCount=5"])

    assert "desiredSize: '5'" in (out / "plan.md").read_text()
    assert stat.S_IMODE((out / "plan.md").stat().st_mode) == 0o600
    assert {stat.S_IMODE(p.stat().st_mode) for p in out.iterdir() if p.name != "plan.md"} == {0o644}


@pytest.mark.parametrize("config", ["", "config: []\n"], ids=["none", "a-list"])
def test_a_pulumi_yaml_without_its_config_section_says_so_once(tmp_path: Path, config: str) -> None:
    project = _project_copy(tmp_path, "config: {}\n")
    text = (PROJECT_DIR / "Pulumi.yaml").read_text()
    (project / "Pulumi.yaml").write_text(text[: text.index("config:")] + config)

    with pytest.raises(StackFileError) as caught:
        stack_config("x", project_dir=project)

    assert str(caught.value) == (
        "Pulumi.yaml: no config section (the project's keys, their types and defaults): "
        "restore it (git checkout Pulumi.yaml)"
    )


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ("serviceCidr=172.16.0.1/32", "lingjun-rdma:serviceCidr: a /32, not /12 to /24"),
        ("vpcCidr=192.168.0.0/30", "lingjun-rdma:vpcCidr: a /30, not /8 to /28"),
        ("pluginImage=reg.example.com:99999/a/b:1", "its registry's port is not 1-65535"),
        ("pluginImage=reg.example.com/a/b@sha256:" + "A" * 64, "its digest is not sha256"),
        ("pluginImage=reg.example.com/a/b@sha256:" + "a" * 32, "its digest is not sha256"),
        ("pluginImage=reg.example.com/a/b@md5:" + "a" * 32, "its digest is not sha256"),
        (
            "vswitchCidrs=" + json.dumps([f"10.{i // 256}.{i % 256}.0/24" for i in range(151)]),
            "lingjun-rdma:vswitchCidrs: 151 vSwitches, over a VPC's 150",
        ),
    ],
    ids=[
        "service-cidr-a-host",
        "vpc-too-small",
        "registry-port",
        "digest-upper-case",
        "digest-short",
        "digest-md5",
        "vswitches-past-quota",
    ],
)
def test_a_value_the_cloud_would_refuse_later_is_refused_at_preview(
    tmp_path: Path, setting: str, said: str
) -> None:
    done = _cli(RENDER, "--stack", "dev", "--out", "out", f"--set={setting}", cwd=tmp_path)

    assert done.returncode == 1, done.stderr
    assert said in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_set_value_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", RENDER, "--stack", "dev", "--out", "out",
         b"--set=registryUsername=a\xffb"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(PROJECT_DIR)},
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip

    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().endswith(
        "--set registryUsername: its value is not UTF-8 text: retype it"
    )
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("namespace", ["lingjun-rmda", "Lingjun-RDMA"])
def test_a_key_under_a_misspelt_project_name_is_named_with_ours(
    tmp_path: Path, namespace: str
) -> None:
    done = _cli(
        RENDER, "--stack", "local", "--out", "out",
        f"--set={namespace}:rdmaPodQps=true", cwd=tmp_path,
    )  # fmt: skip

    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines()[-1].endswith(
        f"lingjun-rdma:rdmaPodQps: given as {namespace}:rdmaPodQps, a namespace this program "
        f"does not read: did you mean lingjun-rdma:rdmaPodQps? (render: drop --set "
        f"{namespace}:rdmaPodQps)"
    )  # the fix where the key was given: nothing to `pulumi config rm`


@pytest.mark.parametrize(
    ("given", "said"),
    [("lingjunNodeCont=3", "lingjun-rdma:lingjunNodeCont: unknown key: did you mean "
      "lingjunNodeCount? (render: drop --set lingjunNodeCont)"),
     ("registryPassword=hunter2hunter2", "lingjun-rdma:registryPassword: only used with "
      "lingjun-rdma:pluginImageBuild: true (render: drop --set registryPassword)")],
    ids=["misspelt", "unused"],
)  # fmt: skip
def test_a_key_given_with_set_is_removed_by_dropping_that_flag(
    tmp_path: Path, given: str, said: str
) -> None:
    """Its fix was `pulumi config rm`, of a key the stack never held."""
    done = _cli(RENDER, "--stack", "dev", "--out", "out", f"--set={given}", cwd=tmp_path)

    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [f"render: dev: error: {said}"]


def test_a_key_in_a_stack_file_is_removed_with_the_cli() -> None:
    (said,) = unknown_key_problems(["lingjun-rdma:rdmaPodQp"])

    assert said == (
        "lingjun-rdma:rdmaPodQp: unknown key: did you mean rdmaPodQps? "
        "(pulumi config rm lingjun-rdma:rdmaPodQp)"
    )


@pytest.mark.parametrize(("text", "seconds"), [("1h30m", 5400), ("2h0m5s", 7205), ("90s", 90)])
def test_a_duration_of_several_units_is_taken_as_go_writes_it(text: str, seconds: int) -> None:
    assert keys_seconds("jobAwaitTimeout", text, "30m") == (seconds, [])


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


@pytest.mark.parametrize(
    ("owner", "said"),
    [("nobody", "is not writable by this user: make it writable (chmod u+w), or name another "
                "directory"),
     ("root", "is root's and not writable by this user: render as root, or name another "
              "directory")],
)  # fmt: skip
def test_an_out_its_user_cannot_write_is_named_not_its_parent(
    shared_dir: Path, owner: str, said: str
) -> None:
    """Run as nobody (CI runs as root, which writes anywhere): a read-only --out was said as
    its parent being unwritable, where the render's copy of it had failed; chmod is the fix of
    its owner only."""
    shared = shared_dir
    out = shared / "ro"
    out.mkdir()
    shutil.chown(out, owner)
    out.chmod(0o555)

    done = subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
         sys.executable, "-m", RENDER, "--stack", "dev", "--out", str(out)],
        cwd=shared, env={**os.environ, "PYTHONPATH": str(PROJECT_DIR), "HOME": str(shared)},
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip

    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [f"render: dev: error: --out {out}: {said}"]
    assert not [p for p in shared.iterdir() if p.name.startswith(".render-")]


def test_an_out_of_ones_own_in_a_dir_one_cannot_write_is_rendered_in_place(
    shared_dir: Path,
) -> None:
    """Run as nobody: `--out` its own, its parent root's (nothing can be staged beside it) was
    `cannot write in <parent> (Permission denied)`, with no fix; the user can write the dir."""
    parent = shared_dir / "parent"
    out = parent / "out"
    out.mkdir(parents=True)
    shutil.chown(out, "nobody", "nogroup")
    parent.chmod(0o755)  # root's

    def render_as_nobody(*flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable,
             "-m", RENDER, "--stack", "dev", "--out", str(out), *flags],
            cwd=shared_dir, env={**os.environ, "PYTHONPATH": str(PROJECT_DIR),
                                 "HOME": str(shared_dir)},
            capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip

    first = render_as_nobody()
    second = render_as_nobody("--set", "lingjunNodeCount=7")

    assert (first.returncode, second.returncode) == (0, 0), first.stderr + second.stderr
    assert "desiredSize: '7'" in (out / "plan.md").read_text()  # the second one, whole
    assert (out / ".lingjun-render").exists()
    assert sorted(p.name for p in parent.iterdir()) == ["out"]


def test_an_out_under_a_dir_its_user_cannot_enter_names_that_dir(shared_dir: Path) -> None:
    """Run as nobody: it was `--out ...: Permission denied`, with no fix."""
    closed = shared_dir / "closed"
    closed.mkdir()
    closed.chmod(0o700)  # root's
    out = closed / "sub"

    done = subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
         sys.executable, "-m", RENDER, "--stack", "dev", "--out", str(out)],
        cwd=shared_dir, env={**os.environ, "PYTHONPATH": str(PROJECT_DIR), "HOME": str(shared_dir)},
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip

    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"render: dev: error: --out {out}: {closed} cannot be entered or written by this user: "
        "name a directory it can write in"
    ]


@pytest.mark.parametrize("written", ["0x10", "+5", "0o7", "1e1"])
def test_a_number_in_a_stack_file_reaches_the_checks_as_written(
    tmp_path: Path, written: str
) -> None:
    """As the Pulumi CLI hands the program a value's text: YAML's 0x10 was planned as 16 nodes,
    which `--set` (and the real preview) refuse."""
    dev = (PROJECT_DIR / "stacks/Pulumi.dev.yaml").read_text()
    counted = dev.replace("lingjunNodeCount: 2", f"lingjunNodeCount: {written}")
    assert counted != dev
    project = _project_copy(tmp_path, counted)

    config, _ = stack_config("x", project_dir=project)

    assert config["lingjun-rdma:lingjunNodeCount"] == written
    with pytest.raises(StackConfigError, match="lingjun-rdma:lingjunNodeCount: not a whole"):
        parse_stack(config, set())
