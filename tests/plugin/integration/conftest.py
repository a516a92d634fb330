"""The plugin and the DRA driver as subprocesses from their CLIs, a kubelet-like peer, a fixture
sysfs tree."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.plugin.dra_driver import Driver
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


@pytest.fixture
def read_only_dir(short_tmp: Path) -> Iterator[Path]:
    """An empty dir on a read-only mount (a bind mount of itself)."""
    path = short_tmp / "ro"
    path.mkdir()
    subprocess.run(["mount", "--bind", "-o", "ro", str(path), str(path)], check=True)
    yield path
    subprocess.run(["umount", str(path)], check=True)


@pytest.fixture
async def driver(short_tmp: Path, tree: SysfsTree) -> AsyncIterator[Driver]:
    d = Driver(short_tmp, tree)
    await d.start()
    yield d
    await d.stop()
