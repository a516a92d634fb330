"""What the offline render and the deploy driver promise whatever they are given: no secret's
value in any file or line they write, every number within its stated range, and one line (never
a traceback) for what keeps them from starting. Run as a user runs them: their CLIs."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from infra.config import (
    DURATION_RANGES,
    MAX_NODE_COUNT,
    PROJECT,
    PROJECT_DIR,
    StackConfig,
    StackConfigError,
    format_seconds,
    parse,
)
from infra.images import reference_problem
from infra.jobs import JOB_RANGES, JobSpecError, RdmaJobSpec
from infra.stackfiles import StackFileError, stack_config
from plugin.config import MAX_ALLOCATIONS_LIMIT, MAX_POOLS
from plugin.kubelet import MAX_UNIX_PATH
from plugin.launch import RESCAN_INTERVAL_RANGE
from plugin.userfiles import MAX_DIGITS, MAX_FILE_BYTES

SENTINEL = "s3cr3t-Zq9"  # a value that must never appear in what the project writes


def _cli(
    module: str, *args: str, cwd: Path, path: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(PROJECT_DIR)}
    if path is not None:
        env["PATH"] = path
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip


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
        "infra.render", "--stack", "local", "--out", "out", "--set", f"kubeconfig={kubeconfig}",
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
        "infra.render", "--stack", "dev", "--out", "out", samples, *images, f"--set={key}={image}",
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
        "busybox:1.36",
        "ghcr.io/a/b/c:v1.2.3-rc.1",
    ],
)
def test_image_references_of_every_form_pass(image: str) -> None:
    assert reference_problem(image) is None


LOW, HIGH = RESCAN_INTERVAL_RANGE


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("rdmaRescanInterval", "9" * 61, f"must be {LOW:g}-{HIGH:g} seconds"),
        ("rdmaRescanInterval", "0", f"must be {LOW:g}-{HIGH:g} seconds"),
        ("jobAwaitTimeout", "99999999999999999h", "is not within"),
        ("jobAwaitTimeout", "9" * 5000 + "s", "is not within"),
        ("jobAwaitTimeout", "0s", "is not within"),
        ("jobAwaitTimeout", "169h", "is not within"),
        ("pluginAwaitTimeout", "25h", "is not within"),
        ("lingjunNodeCount", "1001", "is not 0..1000"),
        ("rdmaMaxAllocations", "100001", "is not within 1-100000"),
        ("rdmaMaxAllocations", "9" * 5000, "rdmaMaxAllocations"),
    ],
)
def test_a_number_outside_its_range_is_refused_in_one_line_before_planning(
    tmp_path: Path, key: str, value: str, said: str
) -> None:
    done = _cli(
        "infra.render", "--stack", "dev", "--out", "out", f"--set={key}={value}", cwd=tmp_path
    )

    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if f"lingjun-rdma:{key}:" in ln]
    assert said in line
    assert len(line) < 400  # the value is not echoed at length
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("key", "seconds"), sorted(DURATION_RANGES.items()))
def test_each_durations_bounds_are_accepted(
    tmp_path: Path, key: str, seconds: tuple[int, int]
) -> None:
    for bound in seconds:
        done = _cli(
            "infra.render", "--stack", "dev", "--out", f"out-{bound}",
            f"--set={key}={format_seconds(bound)}", cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr


def test_a_key_given_twice_in_a_stack_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "stacks").mkdir()
    (tmp_path / "Pulumi.yaml").write_text((PROJECT_DIR / "Pulumi.yaml").read_text())
    (tmp_path / "stacks" / "Pulumi.x.yaml").write_text(
        "config:\n  lingjun-rdma:nonHostNetwork: false\n  lingjun-rdma:nonHostNetwork: true\n"
    )
    with pytest.raises(StackFileError, match="line 3, column 3: key 'lingjun-rdma:nonHostNet"):
        stack_config("x", project_dir=tmp_path)


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
        (lambda d: None, ("--project-dir", "/nonexistent"),
         "deploy: --project-dir /nonexistent: no Pulumi.yaml there"),
        (lambda d: None, ("--stack", "nope"), "deploy: --stack nope: no "),
    ],
    ids=["no-cli", "too-old", "broken", "not-a-program", "no-project", "no-stack"],
)  # fmt: skip
def test_deploy_that_cannot_start_says_why_in_one_line(
    tmp_path: Path, setup: object, args: tuple[str, ...], said: str
) -> None:
    assert callable(setup)
    path = setup(tmp_path / "bin")
    stack = () if "--stack" in args else ("--stack", "local")

    done = _cli("infra.deploy", "preview", *stack, *args, cwd=tmp_path, path=path)

    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert said in line


def test_the_readme_states_every_range_as_the_code_defines_it() -> None:
    readme = (PROJECT_DIR / "README.md").read_text()
    low, high = RESCAN_INTERVAL_RANGE
    rows = {
        "`--rescan-interval`, `rdmaRescanInterval`": f"{low:g}-{high:g} s",
        "`maxAllocations`, `rdmaMaxAllocations`": f"1-{MAX_ALLOCATIONS_LIMIT}",
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
