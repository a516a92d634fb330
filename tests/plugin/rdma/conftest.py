"""Fixtures for the tests marked `rdma`: they run inside the Soft-RoCE VM (`make test-rdma`),
against the kernel's real verbs stack and the plugin started from its CLI."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.plugin.kubelet_peer import KubeletPeer, Registration
from tests.plugin.plugin_process import PluginProcess
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


@pytest.fixture
async def plugin(short_tmp: Path, plugin_dir: Path) -> AsyncIterator[PluginProcess]:
    """The device plugin with `--discovery verbs` on the guest's real /sys and /dev."""
    proc = PluginProcess(short_tmp, plugin_dir, sysfs=SYS, dev=DEV, discovery="verbs")
    yield proc
    await proc.close()


async def registered(
    kubelet: KubeletPeer,
    plugin: PluginProcess,
    resource: str = "rdma/hca",
    config: str | None = None,
    rescan_interval: float = 5.0,
    **overrides: Any,
) -> Registration:
    """Start the plugin (`overrides`: LaunchSpec fields) and wait for its registration and
    first device list. Generous limit: Python's imports alone take seconds under qemu TCG."""
    config_path = plugin.write_config(config) if config is not None else None
    await plugin.start(config_path, rescan_interval=rescan_interval, **overrides)

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
