"""The plugin as a subprocess from its CLI, a kubelet-like peer, a fixture sysfs tree."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.plugin.plugin_process import PluginProcess
from tests.plugin.sysfs_tree import SysfsTree, two_mlx5


@pytest.fixture
def tree(short_tmp: Path) -> SysfsTree:
    return two_mlx5(short_tmp / "node")


@pytest.fixture
async def plugin(
    short_tmp: Path, tree: SysfsTree, plugin_dir: Path
) -> AsyncIterator[PluginProcess]:
    proc = PluginProcess(short_tmp, plugin_dir, sysfs=tree.sys, dev=tree.dev)
    yield proc
    await proc.close()
