"""Stack files and Pulumi.yaml read as the Pulumi CLI reads them: a file of the wrong shape, a
key given twice, another project's Pulumi.yaml, a key declared but not read are refused in one
line naming where; blank keys, shorthand values and numbers reach the checks as written."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from infra.stack.files import StackFileError, stack_config
from infra.stack.keys import PROJECT, PROJECT_DIR, StackConfigError
from infra.stack.model import parse_stack
from tests.infra.helpers import SENTINEL, _project_copy


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
