"""Fixtures for the tests marked `rdma`: they run inside the Soft-RoCE VM (`make test-rdma`),
against the kernel's real verbs stack and the plugin started from its CLI."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.plugin.kubelet_peer import KubeletPeer, Registration
from tests.plugin.plugin_process import plugin_argv
from tests.plugin.rdma.guest import DEV, SYS

# Figures the tests measure (never assert); printed at the end of the guest's pytest run.
FIGURES: list[str] = []


@pytest.fixture(autouse=True)
def _inside_the_vm() -> None:
    """On the host these tests are deselected (-m "not rdma"); run by hand they say where."""
    if os.environ.get("LINGJUN_RDMA_VM") != "1":
        pytest.fail("tests marked rdma run inside the Soft-RoCE VM: make test-rdma")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if FIGURES:
        terminalreporter.section("observed in the Soft-RoCE VM")
        for line in FIGURES:
            terminalreporter.write_line(line)


class VerbsPlugin:
    """`python -m plugin --discovery verbs` on the guest's real /sys and /dev."""

    def __init__(self, root: Path, plugin_dir: Path) -> None:
        self.root = root
        self.plugin_dir = plugin_dir
        self.log = root / "plugin.log"
        self.proc: asyncio.subprocess.Process | None = None

    async def start(
        self, config: str | None = None, rescan_interval: float = 5.0, discovery: str = "verbs"
    ) -> None:
        config_path = None
        if config is not None:
            config_path = self.root / "plugin.yaml"
            config_path.write_text(config)
        argv = plugin_argv(
            sysfs=SYS,
            dev=DEV,
            plugin_dir=self.plugin_dir,
            discovery=discovery,
            rescan_interval=rescan_interval,
            config=config_path,
        )
        with self.log.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(*argv, stdout=log, stderr=log)

    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else ""


@pytest.fixture
async def plugin(short_tmp: Path, plugin_dir: Path) -> AsyncIterator[VerbsPlugin]:
    proc = VerbsPlugin(short_tmp, plugin_dir)
    yield proc
    if proc.proc is not None and proc.proc.returncode is None:
        proc.proc.terminate()
        await asyncio.wait_for(proc.proc.wait(), 30)
    print(proc.output())  # captured: pytest shows it only when the test fails


async def registered(
    kubelet: KubeletPeer,
    plugin: VerbsPlugin,
    resource: str = "rdma/hca",
    config: str | None = None,
    rescan_interval: float = 5.0,
) -> Registration:
    """Start the plugin and wait for its registration and first device list. Generous limit:
    Python's imports alone take seconds under qemu TCG."""
    await plugin.start(config, rescan_interval)

    def listed() -> bool:
        reg = kubelet.current(resource)
        return reg is not None and bool(reg.updates)

    try:
        await kubelet.wait_for(listed, limit=90)
    except TimeoutError:
        raise AssertionError(f"no registration of {resource}:\n{plugin.output()}") from None
    reg = kubelet.current(resource)
    assert reg is not None
    return reg


EXCLUSIVE_RXE = """\
version: v1
pools:
  - name: rxe
    mode: exclusive
    selector: {drivers: [rxe]}
"""
