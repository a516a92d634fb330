"""Fixtures shared by the plugin's integration tests (host) and rdma tests (Soft-RoCE VM)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.plugin.kubelet_peer import KubeletPeer


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
async def kubelet(plugin_dir: Path) -> AsyncIterator[KubeletPeer]:
    peer = KubeletPeer(plugin_dir)
    await peer.start()
    yield peer
    await peer.stop()
