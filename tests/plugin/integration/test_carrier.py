"""Carrier loss from the kernel's own rtnetlink messages: the plugin runs in a network namespace
where the fixture HCAs' netdevs (eth0, eth1) are a real veth pair, while the fixture's sysfs
keeps saying the ports are ACTIVE. Only the link messages can make the IDs Unhealthy."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.conftest import PEER_SKIP_PREFIX
from tests.plugin.kubelet_peer import KubeletPeer
from tests.plugin.plugin_process import PluginProcess
from tests.plugin.sysfs_tree import SysfsTree
from tests.plugin.veth_netns import ip, veth_netns


@pytest.fixture
def netns() -> Iterator[str]:
    if os.geteuid() != 0:
        pytest.skip(f"{PEER_SKIP_PREFIX} root (ip netns, veth)")
    with veth_netns(f"lingjun-carrier-{os.getpid()}") as name:
        yield name


@pytest.fixture
async def plugin_in_netns(
    short_tmp: Path, tree: SysfsTree, plugin_dir: Path, netns: str
) -> AsyncIterator[PluginProcess]:
    proc = PluginProcess(short_tmp, plugin_dir, sysfs=tree.sys, dev=tree.dev, netns=netns)
    yield proc
    await proc.close()


async def test_carrier_loss_makes_ids_unhealthy_before_sysfs_says_so(
    kubelet: KubeletPeer, plugin_in_netns: PluginProcess, netns: str, tree: SysfsTree
) -> None:
    # No periodic scan in the way: every change below comes from a link message.
    await plugin_in_netns.start(rescan_interval=600)
    await kubelet.wait_registrations(1)
    assert set(kubelet.health().values()) == {"Healthy"}

    ip("-n", netns, "link", "set", "eth0", "down")  # eth0 down, eth1 loses its carrier
    await kubelet.wait_for(lambda: set(kubelet.health().values()) == {"Unhealthy"})
    assert tree.port_dir("mlx5_0").joinpath("state").read_text().strip().endswith("ACTIVE"), (
        "the fixture still says ACTIVE: the plugin went by the link message"
    )

    ip("-n", netns, "link", "set", "eth0", "up")  # carrier back: the scan it triggers heals
    await kubelet.wait_for(lambda: set(kubelet.health().values()) == {"Healthy"})
    assert len(kubelet.devices()) == 1000
