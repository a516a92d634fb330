"""The watcher's fail-fast (plugin/health.py): a carrier loss reaches the endpoint while a scan
is still running in its thread, and the scan's stale view does not undo it. The discovery
here is a stand-in whose scan can be held; the endpoint (and its servicer) is the real one,
not serving."""

from __future__ import annotations

import asyncio
import dataclasses
import struct
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from plugin.config import PluginConfig, Pool
from plugin.core.metrics.exposition import Metrics
from plugin.core.node.discovery.model import CharDevices, Hca, Inventory, Port
from plugin.core.node.health import HealthWatcher
from plugin.core.node.pools import PoolView
from plugin.core.node.problems import NodeProblem
from plugin.deviceplugin.endpoint import Endpoint

RTM_NEWLINK, IFF_UP, IFF_LOWER_UP = 16, 0x1, 0x10000


def link_message(name: str, *, carrier: bool) -> bytes:
    flags = IFF_UP | (IFF_LOWER_UP if carrier else 0)
    payload = name.encode() + b"\0"
    attr = struct.pack("=HH", 4 + len(payload), 3) + payload  # IFLA_IFNAME
    body = struct.pack("=BxHiII", 0, 1, 2, flags, 0xFFFFFFFF) + attr + b"\0" * (-len(attr) % 4)
    return struct.pack("=IHHII", 16 + len(body), RTM_NEWLINK, 0, 0, 0) + body


class HeldDiscovery:
    """Every HCA up, as sysfs would say before it notices; `hold` makes the next scan wait."""

    name = "held"

    def __init__(self) -> None:
        self.hold = False
        self.scanning = threading.Event()
        self.release = threading.Event()
        self.inventory = Inventory(
            hcas=tuple(
                Hca(
                    name=f"mlx5_{i}",
                    vendor="15b3",
                    device_id="1017",
                    driver="mlx5_core",
                    numa_node=i,
                    ports=(Port(1, "ACTIVE", "Ethernet", (f"eth{i}",)),),
                    chardevs=CharDevices(uverbs=f"uverbs{i}"),
                )
                for i in (0, 1)
            ),
            rdma_cm=True,
            netns_mode="shared",
        )

    def scan(self) -> Inventory:
        if self.hold:
            self.scanning.set()
            assert self.release.wait(10), "the test never released the scan"
        return self.inventory


async def wait_until(predicate: object, what: str) -> None:
    assert callable(predicate)
    for _ in range(200):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not within 2 s: {what}")


def health(endpoint: Endpoint) -> set[bool]:
    return {d.healthy for d in endpoint.view.devices}


def watched(discovery: HeldDiscovery, metrics: Metrics) -> tuple[HealthWatcher, Endpoint]:
    endpoint = Endpoint(Pool(name="hca"), Path("/dev"), Path("/nonexistent"), metrics)

    async def publish(views: Sequence[PoolView]) -> None:
        (view,) = views
        await endpoint.update(view)

    return HealthWatcher(discovery, PluginConfig(), metrics, 600, publish), endpoint


async def test_carrier_loss_is_published_while_a_scan_runs_and_the_scan_keeps_it() -> None:
    discovery = HeldDiscovery()
    watcher, endpoint = watched(discovery, Metrics())
    await watcher.rescan()
    assert health(endpoint) == {True}

    discovery.hold = True
    rescan = asyncio.create_task(watcher.rescan())
    await asyncio.to_thread(discovery.scanning.wait, 10)
    # both ports' netdevs lose carrier (a shared pool stays up while one HCA is)
    watcher.on_link_message(link_message("eth0", carrier=False))
    watcher.on_link_message(link_message("eth1", carrier=False))

    await wait_until(lambda: health(endpoint) == {False}, "Unhealthy while the scan is held")
    assert not rescan.done()
    discovery.release.set()
    await rescan  # its view says ACTIVE, read before the loss: it must not heal
    assert health(endpoint) == {False}

    watcher.on_link_message(link_message("eth0", carrier=True))
    await watcher.rescan()  # carrier back: only a scan heals
    assert health(endpoint) == {True}


async def test_a_repeated_loss_keeps_the_netdev_held() -> None:
    discovery = HeldDiscovery()
    watcher, endpoint = watched(discovery, Metrics())
    await watcher.rescan()
    for _ in range(2):  # the kernel sends a NEWLINK per change: down, then e.g. an MTU change
        watcher.on_link_message(link_message("eth0", carrier=False))
        watcher.on_link_message(link_message("eth1", carrier=False))
    await watcher.rescan()
    assert health(endpoint) == {False}


async def test_an_hca_no_pool_can_offer_is_a_problem_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    discovery = HeldDiscovery()
    long_hca = dataclasses.replace(discovery.inventory.hcas[0], name="mlx5_" + "x" * 60)
    discovery.inventory = dataclasses.replace(discovery.inventory, hcas=(long_hca,))
    metrics = Metrics()
    views: list[PoolView] = []

    async def publish(published: Sequence[PoolView]) -> None:
        views.extend(published)

    config = PluginConfig(pools=(Pool(name="hca", mode="exclusive"),))
    await HealthWatcher(discovery, config, metrics, 600, publish).rescan()

    assert views[0].devices == ()
    assert "rdma_plugin_problems 1.0" in metrics.render().decode()
    assert "over the 63 of a device ID" in caplog.text


def hca_health(metrics: Metrics) -> dict[str, float]:
    return {
        s.labels["hca"]: s.value
        for f in text_string_to_metric_families(metrics.render().decode())
        if f.name == "rdma_plugin_hca_healthy"
        for s in f.samples
    }


async def test_each_hcas_health_is_a_gauge_and_an_hca_gone_stays_at_0_said_until_back() -> None:
    """A vanished HCA's series simply went away: the alert on `== 0` never fired, no line, no
    Event, rdma_plugin_problems 0."""
    discovery = HeldDiscovery()
    metrics = Metrics()
    said: list[Sequence[NodeProblem]] = []
    watcher = HealthWatcher(discovery, PluginConfig(), metrics, 600, _ignore, said.append)
    await watcher.rescan()
    assert hca_health(metrics) == {"mlx5_0": 1.0, "mlx5_1": 1.0}

    watcher.on_link_message(link_message("eth1", carrier=False))
    await watcher.rescan()
    assert hca_health(metrics) == {"mlx5_0": 1.0, "mlx5_1": 0.0}

    both = discovery.inventory
    discovery.inventory = dataclasses.replace(both, hcas=both.hcas[:1])
    await watcher.rescan()
    assert hca_health(metrics) == {"mlx5_0": 1.0, "mlx5_1": 0.0}
    assert said[-1] == [
        NodeProblem(
            "RdmaHcaGone",
            "rdma/hca: mlx5_1: served before, now gone from this node (unplugged, its driver "
            "unloaded, or renamed): pods are not given it",
        )
    ]
    assert "rdma_plugin_problems 1.0" in metrics.render().decode()

    watcher.on_link_message(link_message("eth1", carrier=True))
    discovery.inventory = both
    await watcher.rescan()
    assert hca_health(metrics) == {"mlx5_0": 1.0, "mlx5_1": 1.0}
    assert said[-1] == []


async def _ignore(views: Sequence[PoolView]) -> None:
    del views


async def test_the_scan_summary_counts_the_hcas_a_pod_could_use(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Right after "not served" for an HCA, the summary said "3 HCAs"."""
    discovery = HeldDiscovery()
    down = dataclasses.replace(discovery.inventory.hcas[1], readable=False)
    discovery.inventory = dataclasses.replace(
        discovery.inventory, hcas=(discovery.inventory.hcas[0], down)
    )
    watcher, _ = watched(discovery, Metrics())
    caplog.set_level("INFO", logger="plugin.core.node.health")

    await watcher.rescan()

    summaries = [r.getMessage() for r in caplog.records if r.getMessage().startswith("scan (")]
    assert summaries == ["scan (held): rdma/hca=1 of 2 HCAs usable/1000 IDs"]
