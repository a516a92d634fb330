"""The engine level runs on the e2e harness's cluster: its fixtures, and the Pulumi engine."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from pulumi import automation as auto

from infra.commands.deploy import open_stack
from infra.stack.keys import PROJECT_DIR
from tests.e2e.conftest import (
    api,
    cluster,
    host_infiniband,
    image,
    lingjun_node,
    logs,
    node_root,
    node_sysfs,
    session_plugin,
)

__all__ = [
    "api",
    "cluster",
    "host_infiniband",
    "image",
    "lingjun_node",
    "logs",
    "node_root",
    "node_sysfs",
    "session_plugin",
]


@pytest.fixture(scope="session")
def engine_bin() -> Path:
    """The `pulumi` CLI and pulumi-resource-kubernetes that tests/engine/build.sh built.
    `make engine` always builds them: their absence is a failure, never a skip."""
    found = os.environ.get("LINGJUN_ENGINE_BIN")
    if not found or not (Path(found) / "pulumi").is_file():
        pytest.fail("LINGJUN_ENGINE_BIN: run `make engine` (it builds the Pulumi engine)")
    return Path(found)


@pytest.fixture(scope="session")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the project's Pulumi.yaml and stack files: the stacks the tests create write
    their encryption salt and test config there, never into the repo."""
    work = tmp_path_factory.mktemp("project")
    shutil.copy(PROJECT_DIR / "Pulumi.yaml", work)
    shutil.copytree(PROJECT_DIR / "stacks", work / "stacks")
    return work


@pytest.fixture(scope="session")
def engine_env(engine_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The CLI's environment: a local state backend, no download of any plugin (the provider
    comes from PATH), no update check."""
    state = tmp_path_factory.mktemp("state")
    return {
        "PATH": f"{engine_bin}:{os.environ['PATH']}",
        "PULUMI_HOME": str(tmp_path_factory.mktemp("pulumi-home")),
        "PULUMI_BACKEND_URL": f"file://{state}",
        "PULUMI_CONFIG_PASSPHRASE": "engine-level",
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
    }


@pytest.fixture(scope="session")
def open_engine_stack(
    workspace: Path, engine_env: dict[str, str], engine_bin: Path
) -> Callable[[str], auto.Stack]:
    """Opens (creating when new) a stack of the copied project, run by the built engine."""
    command = auto.PulumiCommand(root=str(engine_bin.parent))
    return lambda name: open_stack(name, workspace, engine_env, command)
