"""Every committed stack file against Pulumi.yaml's schema, the way the Pulumi CLI checks it
before `pulumi preview`/`up` run the program (the real CLI checks the same files in `make engine`).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.commands.deploy import check_project
from infra.stack.files import EscEnvironmentError, StackFileError, stack_config
from infra.stack.keys import PROJECT, PROJECT_DIR, StackConfigError, known_keys
from plugin.config import DEFAULT_MAX_ALLOCATIONS, DEFAULT_RESOURCE_NAME
from plugin.launch import LaunchSpec
from tests.infra.conftest import STACKS
from tests.infra.pulumi_cli import project_errors, stack_errors


def _project() -> dict[str, Any]:
    return yaml.safe_load((PROJECT_DIR / "Pulumi.yaml").read_text())


def _stack(stack: str) -> dict[str, Any]:
    return yaml.safe_load(Path(PROJECT_DIR, "stacks", f"Pulumi.{stack}.yaml").read_text())


def test_pulumi_yaml_schema_is_valid() -> None:
    assert project_errors(_project()) == []


@pytest.mark.parametrize("stack", STACKS)
def test_the_cli_accepts_every_committed_stack_as_is(stack: str) -> None:
    assert stack_errors(_project(), stack, _stack(stack)) == []


def test_every_declared_key_has_a_default_so_no_stack_must_set_it() -> None:
    undeclared = {k for k, decl in _project()["config"].items() if "default" not in decl}

    assert undeclared == set()


def test_rdma_defaults_in_pulumi_yaml_are_the_plugins() -> None:
    config = _project()["config"]

    assert config["rdmaResourceName"]["default"] == DEFAULT_RESOURCE_NAME
    assert config["rdmaMaxAllocations"]["default"] == DEFAULT_MAX_ALLOCATIONS
    assert config["rdmaRescanInterval"]["default"] == LaunchSpec().rescan_interval
    assert config["rdmaPortCounters"]["default"] is (LaunchSpec().port_counters == "on")
    assert config["rdmaPodQps"]["default"] is (LaunchSpec().pod_qps == "on")


def test_a_key_without_default_is_required_on_every_stack_that_omits_it() -> None:
    project = copy.deepcopy(_project())
    for key in ("pluginImage", "clusterId", "acrInstanceId"):
        del project["config"][key]["default"]

    errors = stack_errors(project, "local", _stack("local"))

    # local sets pluginImage; it leaves the other two unset
    assert errors == [
        "Stack 'local' is missing configuration values 'acrInstanceId' and 'clusterId'"
    ]


def test_a_secret_key_with_a_default_is_refused_on_stacks_that_leave_it_unset() -> None:
    project = copy.deepcopy(_project())
    project["config"]["registryPassword"]["secret"] = True

    errors = stack_errors(project, "dev", _stack("dev"))

    assert errors == [
        "Stack 'dev' with configuration key 'registryPassword' must be encrypted as it's secret"
    ]


def test_a_secure_value_satisfies_a_secret_key() -> None:
    project = copy.deepcopy(_project())
    project["config"]["registryPassword"]["secret"] = True
    stack = _stack("prod")
    stack["config"][f"{PROJECT}:registryPassword"] = {"secure": "v1:AAAA"}

    assert stack_errors(project, "prod", stack) == []


@pytest.mark.parametrize(
    ("key", "value", "type_name"),
    [
        ("ipv6", "yes", "boolean"),
        ("lingjunNodeCount", "two", "integer"),
        ("zoneIds", "cn-wulanchabu-c", "array<string>"),
        ("sampleJobs", [1, 2], "array<string>"),
        ("region", ["cn-wulanchabu"], "string"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused(key: str, value: Any, type_name: str) -> None:
    stack = _stack("dev")
    stack["config"][f"{PROJECT}:{key}"] = value

    errors = stack_errors(_project(), "dev", stack)

    assert errors == [f"Stack 'dev' with configuration key '{key}' must be of type '{type_name}'"]


def test_yaml_scalars_of_other_types_pass_as_the_cli_reads_them() -> None:
    stack = _stack("dev")
    stack["config"].update(
        {f"{PROJECT}:ipv6": "false", f"{PROJECT}:lingjunNodeCount": "4", f"{PROJECT}:region": 7}
    )

    assert stack_errors(_project(), "dev", stack) == []


def test_a_default_of_the_wrong_type_is_refused() -> None:
    project = copy.deepcopy(_project())
    project["config"]["region"]["default"] = 1000

    assert project_errors(project) == [
        "The default value specified for configuration key 'region' is not of the expected "
        "type 'string'"
    ]


@pytest.mark.parametrize("stack", STACKS)
def test_stack_files_use_only_known_keys(stack: str) -> None:
    keys = {k.removeprefix(f"{PROJECT}:") for k in _stack(stack)["config"]}

    assert keys <= known_keys(), sorted(keys - known_keys())


def test_a_stack_importing_esc_environments_is_refused_by_render_and_left_to_the_cli(
    tmp_path: Path,
) -> None:
    """Render ignored `environment:` and then blamed a key the environment sets; deploy leaves
    it to the engine, which opens it."""
    (tmp_path / "Pulumi.yaml").write_text((PROJECT_DIR / "Pulumi.yaml").read_text())
    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "Pulumi.esc.yaml").write_text(
        "environment: [lingjun/prod]\nconfig:\n  lingjun-rdma:clusterMode: existing\n"
    )

    with pytest.raises(EscEnvironmentError) as caught:
        stack_config("esc", project_dir=tmp_path)
    check_project(tmp_path, "esc")  # not refused

    assert str(caught.value) == (
        f"{tmp_path / 'stacks' / 'Pulumi.esc.yaml'}: imports Pulumi ESC environments "
        "(`environment:`), whose values only the Pulumi CLI can open: render reads stack files "
        "alone, and would check this stack without them; give their keys under `config:` or "
        "with --set, or preview it with the CLI (make deploy ACTION=preview)"
    )


@pytest.mark.parametrize(
    ("text", "said"),
    [("config:\n  config:\n    lingjun-rdma:rdmaPoolMode: exclusive\n",
      "line 2, column 3: a `config:` inside `config:`: its keys go one level up: dedent them"),
     ("config:\n  lingjun-rdma:clusterMode: existing\n  alicloud:region: cn-beijing\n",
      "alicloud:region: not read: the program makes its alicloud provider itself, from "
      "lingjun-rdma:region and the credentials in the environment (ALICLOUD_ACCESS_KEY, "
      "ALICLOUD_SECRET_KEY) (pulumi config rm alicloud:region)")],
    ids=["config-nested", "a-providers-own-key"],
)  # fmt: skip
def test_a_stack_file_whose_keys_no_one_reads_is_refused_saying_where_they_go(
    tmp_path: Path, text: str, said: str
) -> None:
    """A nested block was `config: unknown key: did you mean kubeconfig?`; alicloud:region was
    ignored while the program's provider used lingjun-rdma:region."""
    (tmp_path / "Pulumi.yaml").write_text((PROJECT_DIR / "Pulumi.yaml").read_text())
    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "Pulumi.x.yaml").write_text(text)

    with pytest.raises((StackFileError, StackConfigError)) as refused:
        stack_config("x", project_dir=tmp_path)

    assert said in str(refused.value)
