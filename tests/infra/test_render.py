"""Offline render: every stack to schema-checked YAML + plan.md, all or nothing."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from infra.render import (
    KUBERNETES_VERSION,
    OFFLINE_KUBECONFIG,
    PROJECT_DIR,
    SECRET,
    Registered,
    RenderError,
    RunResult,
    check_unique,
    main,
    render,
    stack_config,
    validate,
)
from tests.infra.conftest import STACKS, run


@pytest.mark.parametrize("stack", STACKS)
def test_every_stack_renders_schema_valid_manifests_and_a_plan(stack: str, tmp_path: Path) -> None:
    out = tmp_path / stack

    files = render(stack, out)

    manifests = [f for f in files if f.suffix == ".yaml"]
    assert out / "plan.md" in files
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
    out.mkdir()
    (out / "plan.md").write_text("previous")

    with pytest.raises(Exception, match="nonHostNetwork"):
        render("dev", out, ["nonHostNetwork=true"])

    assert [p.name for p in tmp_path.iterdir()] == ["dev"]
    assert (out / "plan.md").read_text() == "previous"


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

    assert code == 1
    assert "stacks: dev, local, prod, staging" in capsys.readouterr().err


def test_set_needs_key_equals_value() -> None:
    with pytest.raises(RenderError, match="expected KEY=VALUE"):
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
