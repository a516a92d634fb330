"""The plugin as a subprocess from its CLI, a kubelet-like peer, a fixture sysfs tree."""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.plugin.kubelet_peer import KubeletPeer
from tests.plugin.sysfs_tree import SysfsTree, two_mlx5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PluginProcess:
    """`python -m plugin …` with flags pointing at a fixture tree and a temp plugin dir."""

    def __init__(self, root: Path, tree: SysfsTree, plugin_dir: Path) -> None:
        self.root = root
        self.tree = tree
        self.plugin_dir = plugin_dir
        self.metrics_port = free_port()
        self.log = root / "plugin.log"
        self.proc: asyncio.subprocess.Process | None = None

    def argv(self, config: Path | None = None, *extra: str) -> list[str]:
        args = [
            sys.executable,
            "-m",
            "plugin",
            "--sysfs-root",
            str(self.tree.sys),
            "--dev-root",
            str(self.tree.dev),
            "--device-plugin-dir",
            str(self.plugin_dir),
            "--discovery",
            "sysfs",
            "--rescan-interval",
            "0.1",
            "--metrics-address",
            f"127.0.0.1:{self.metrics_port}",
            "--log-level",
            "debug",
        ]
        return args + (["--config", str(config)] if config else []) + list(extra)

    async def start(self, config: Path | None = None, *extra: str) -> None:
        with self.log.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv(config, *extra), stdout=log, stderr=log
            )

    async def terminate(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
        return await asyncio.wait_for(self.proc.wait(), 10)

    async def wait(self) -> int:
        assert self.proc is not None
        return await asyncio.wait_for(self.proc.wait(), 10)

    def write_config(self, text: str) -> Path:
        path = self.root / "plugin.yaml"
        path.write_text(text)
        return path

    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else ""


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
