"""Offline render: every stack to schema-checked YAML + plan.md, all or nothing."""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from infra.commands.offline import (
    OFFLINE_KUBECONFIG,
    SECRET,
    Registered,
    RenderError,
    RunResult,
    check_unique,
)
from infra.commands.render import (
    KUBERNETES_VERSION,
    KUSTOMIZATION,
    MARKER,
    OutputError,
    main,
    render,
    validate,
)
from infra.stack.files import StackFileError, stack_config
from infra.stack.keys import PROJECT_DIR
from tests.infra.conftest import STACKS, run
from tests.infra.helpers import RENDER, _cli


@pytest.mark.parametrize("stack", STACKS)
def test_every_stack_renders_schema_valid_manifests_and_a_plan(stack: str, tmp_path: Path) -> None:
    out = tmp_path / stack

    files = render(stack, out)

    manifests = [f for f in files if f.suffix == ".yaml" and f.name != KUSTOMIZATION]
    assert out / "plan.md" in files
    kustomization = yaml.safe_load((out / KUSTOMIZATION).read_text())
    assert kustomization["resources"] == sorted(f.name for f in manifests)  # kubectl apply -k
    assert {"DaemonSet", "ConfigMap", "ServiceAccount", "Namespace"} <= {
        yaml.safe_load(f.read_text())["kind"] for f in manifests
    }
    for path in manifests:
        kubernetes_validate.validate(
            yaml.safe_load(path.read_text()), KUBERNETES_VERSION, strict=True
        )


def test_registry_pull_secret_renders_schema_valid_and_hidden(tmp_path: Path) -> None:
    render("prod", tmp_path / "p", ["registryUsername=robot", "registryPassword=hunter2"])

    secret = yaml.safe_load(
        (tmp_path / "p" / "secret-lingjun-rdma-rdma-device-plugin-pull.yaml").read_text()
    )
    assert secret["stringData"] == {".dockerconfigjson": SECRET}
    assert not [f for f in (tmp_path / "p").iterdir() if "hunter2" in f.read_text()]
    kustomization = (tmp_path / "p" / KUSTOMIZATION).read_text()  # its value is not known here
    assert "- secret-lingjun-rdma-rdma-device-plugin-pull.yaml" not in kustomization
    assert "# not listed: secret-lingjun-rdma-rdma-device-plugin-pull.yaml holds a secret" in (
        kustomization
    )


@pytest.mark.parametrize("stack", STACKS)
def test_no_two_resources_share_a_name(stack: str) -> None:
    result = run(stack)
    names = Counter((r.type, r.name) for r in result.resources)

    assert [n for n, c in names.items() if c > 1] == []
    check_unique(result)


def test_duplicate_resource_names_are_refused() -> None:
    twice = Registered("alicloud:vpc/network:Network", "vpc", {}, custom=True)

    with pytest.raises(RenderError, match="duplicate names: alicloud:vpc/network:Network vpc"):
        check_unique(RunResult(resources=[twice, twice], outputs={}, timeouts={}))


def test_duplicate_kubernetes_objects_are_refused() -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "n"}}
    resources = [
        Registered("kubernetes:core/v1:ConfigMap", name, cm, custom=True) for name in ("x", "y")
    ]

    with pytest.raises(RenderError, match="Kubernetes object ConfigMap/n/a"):
        check_unique(RunResult(resources=resources, outputs={}, timeouts={}))


def test_schema_check_refuses_an_invalid_manifest() -> None:
    bad = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "p", "namespace": "n"},
        "spec": {"selector": {}, "template": {"spec": {"containers": [{"name": "c"}]}}, "x": 1},
    }

    with pytest.raises(RenderError, match="DaemonSet/n/p"):
        validate(bad)


def test_plan_lists_cloud_resources_and_hides_secrets(tmp_path: Path) -> None:
    render("dev", tmp_path / "dev")
    plan = (tmp_path / "dev" / "plan.md").read_text()

    assert "clusterSpec: ack.pro.small" in plan
    assert "type: lingjun" in plan
    assert f"| `kubeconfig` | `{SECRET}` |" in plan
    assert "offline render: ACK returns" not in plan
    assert OFFLINE_KUBECONFIG not in plan


def test_render_is_deterministic(tmp_path: Path) -> None:
    render("prod", tmp_path / "a")
    render("prod", tmp_path / "b")

    for path in sorted((tmp_path / "a").iterdir()):
        assert path.read_bytes() == (tmp_path / "b" / path.name).read_bytes(), path.name


def test_failed_render_leaves_the_previous_output_untouched(tmp_path: Path) -> None:
    out = tmp_path / "dev"
    render("dev", out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    with pytest.raises(Exception, match="nonHostNetwork"):
        render("dev", out, ["nonHostNetwork=true"])

    assert [p.name for p in tmp_path.iterdir()] == ["dev"]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_render_replaces_its_own_previous_output_as_a_whole(tmp_path: Path) -> None:
    out = tmp_path / "dev"
    dev = render("dev", out)

    files = render("local", out)

    assert {p.name for p in dev} - {p.name for p in files}  # dev's own extra files went
    assert (out / MARKER).is_file()
    assert "stack `local`" in (out / "plan.md").read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["dev"]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda out: (out / "notes.txt").write_text("mine"), "notes.txt"),
        (lambda out: (out / "keep").mkdir(), "keep"),
        (lambda out: (out / "plan.md").write_text("# my edits\n"), "plan.md"),
        (lambda out: (out / MARKER).write_text("{}"), "its .lingjun-render lists no files"),
    ],
    ids=["added-file", "added-dir", "edited-file", "emptied-list"],
)
def test_a_render_never_deletes_what_it_did_not_write(
    tmp_path: Path, change: Callable[[Path], object], named: str
) -> None:
    out = tmp_path / "dev"
    render("dev", out)
    change(out)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}

    done = _render_cli(tmp_path, "--out", "dev")

    assert done.returncode == 2, done.stderr
    assert named in done.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def _render_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _cli(RENDER, "--stack", "dev", *args, cwd=cwd)


def test_out_dot_in_a_directory_of_other_files_is_refused_and_deletes_nothing(
    tmp_path: Path,
) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "src").mkdir()

    done = _render_cli(tmp_path, "--out", ".")

    assert done.returncode == 2
    assert "holds files a render did not write, or changed since (notes.txt, src)" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "src"]
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_render_without_the_list_of_what_it_wrote_is_refused_not_deleted(
    tmp_path: Path,
) -> None:
    old = tmp_path / "dev"
    old.mkdir()
    (old / "plan.md").write_text("# Plan: stack `dev` (offline render, Pulumi mocks)\n")
    (old / MARKER).write_text("written by python -m infra.commands.render --stack dev\n")

    with pytest.raises(OutputError, match=r"its \.lingjun-render is not JSON, so nothing there"):
        render("dev", old)

    assert sorted(p.name for p in old.iterdir()) == [MARKER, "plan.md"]


def test_a_directory_with_a_plan_md_of_its_own_is_not_taken_for_a_render(tmp_path: Path) -> None:
    (tmp_path / "plan.md").write_text("# my plan\n")
    (tmp_path / "x.yaml").write_text("a: 1\n")

    done = _render_cli(tmp_path, "--out", ".")

    assert done.returncode == 2
    assert (tmp_path / "plan.md").read_text() == "# my plan\n"


def test_out_naming_a_regular_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "out").write_text("a file")

    done = _render_cli(tmp_path, "--out", "out")

    assert done.returncode == 2
    assert f"--out {tmp_path / 'out'}: not a directory" in done.stderr
    assert (tmp_path / "out").read_text() == "a file"


def test_out_where_nothing_can_be_written_is_one_line_naming_the_path(tmp_path: Path) -> None:
    done = _render_cli(tmp_path, "--out", "/proc/lingjun-render")

    assert done.returncode == 2
    assert done.stderr.startswith("render: dev: error: --out /proc/lingjun-render: ")
    assert len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr


def test_out_naming_an_empty_directory_is_used(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()

    done = _render_cli(tmp_path, "--out", "empty")

    assert done.returncode == 0, done.stderr
    assert (tmp_path / "empty" / MARKER).is_file()
    assert (tmp_path / "empty").stat().st_mode & 0o755 == 0o755  # not mkdtemp's 0700


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("config:\n  lingjun-rdma:ipv6: [true\n", "line 3, column 1: "),
        ("- lingjun-rdma:ipv6\n", "a list, not a mapping with a `config:` key"),
        ("", "empty: it needs a `config:` mapping"),
        ("config: [a, b]\n", "`config:` is a list, not a mapping"),
        ("\xff\xfe", ""),
    ],
)
def test_a_bad_stack_file_is_one_line_naming_the_file(
    tmp_path: Path, text: str, problem: str
) -> None:
    shutil.copy(PROJECT_DIR / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "Pulumi.bad.yaml").write_bytes(text.encode("latin-1"))

    with pytest.raises(StackFileError) as caught:
        stack_config("bad", project_dir=tmp_path)

    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'stacks' / 'Pulumi.bad.yaml'}: {problem}")
    assert "\n" not in message


def test_cli_exits_non_zero_with_the_message_on_a_config_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["--stack", "dev", "--out", str(tmp_path / "o"), "--set", "nonHostNetwork=true"])

    assert code == 1
    assert "needs lingjun-rdma:computeNetworkIpv6: true" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_cli_names_the_known_stacks_for_an_unknown_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["--stack", "qa", "--out", str(tmp_path / "o")])

    assert code == 2
    assert "stacks: dev, local, prod, staging" in capsys.readouterr().err


def test_set_needs_key_equals_value() -> None:
    with pytest.raises(StackFileError, match="expected KEY=VALUE"):
        stack_config("dev", ["nonHostNetwork"])


def test_stack_config_layers_defaults_stack_file_and_overrides() -> None:
    config, _ = stack_config("dev", ["lingjunNodeCount=5"])

    assert config["lingjun-rdma:rdmaPoolMode"] == "shared"  # Pulumi.yaml default
    assert config["lingjun-rdma:vswitchCidrs"] == '["192.168.0.0/20"]'  # stack file, as JSON
    assert config["lingjun-rdma:lingjunNodeCount"] == "5"  # override


def test_secure_values_render_as_secrets(tmp_path: Path) -> None:
    shutil.copy(PROJECT_DIR / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "Pulumi.s.yaml").write_text(
        "config:\n  lingjun-rdma:kubeconfig:\n    secure: v1:abc\n"
    )

    config, secret_keys = stack_config("s", project_dir=tmp_path)

    assert config["lingjun-rdma:kubeconfig"] == SECRET
    assert secret_keys == ["lingjun-rdma:kubeconfig"]
