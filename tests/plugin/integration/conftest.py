"""The plugin as a subprocess from its CLI, a kubelet-like peer, a fixture sysfs tree."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.plugin.kubelet_peer import KubeletPeer
from tests.plugin.plugin_process import PluginProcess
from tests.plugin.sysfs_tree import SysfsTree, two_mlx5


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """Unix socket paths are limited to 107 bytes: keep the dir short."""
    path = Path(tempfile.mkdtemp(prefix="ljr", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def plugin_dir(short_tmp: Path) -> Path:
    d = short_tmp / "dp"
    d.mkdir()
    return d


@pytest.fixture
def tree(short_tmp: Path) -> SysfsTree:
    return two_mlx5(short_tmp / "node")


@pytest.fixture
async def kubelet(plugin_dir: Path) -> AsyncIterator[KubeletPeer]:
    peer = KubeletPeer(plugin_dir)
    await peer.start()
    yield peer
    await peer.stop()


@pytest.fixture
async def plugin(
    short_tmp: Path, tree: SysfsTree, plugin_dir: Path
) -> AsyncIterator[PluginProcess]:
    proc = PluginProcess(short_tmp, tree, plugin_dir)
    yield proc
    if proc.proc is not None and proc.proc.returncode is None:
        proc.proc.kill()
        await proc.proc.wait()
    print(proc.output())  # captured: pytest shows it only when the test fails
