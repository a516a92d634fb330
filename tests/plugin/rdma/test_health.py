"""Health on a real kernel: link down/up and rdma link delete/add reach ListAndWatch while the
plugin keeps running; and the event path's latency (the plugin's P2 figure, measured only)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator

import pytest

from tests.plugin.kubelet_peer import KubeletPeer
from tests.plugin.plugin_process import PluginProcess
from tests.plugin.rdma.conftest import EXCLUSIVE_RXE, FIGURES, registered
from tests.plugin.rdma.guest import RXE0, RXE1, SYS, run

pytestmark = pytest.mark.rdma

RESOURCE = "rdma/rxe"
FLIPS = 20


@pytest.fixture
def restore_rxe0() -> Iterator[None]:
    """Whatever a test did to rxe0 and its netdev, the next test finds them as init left them."""
    yield
    run("ip", "link", "set", RXE0.netdev, "up")
    if not (SYS / "class/infiniband" / RXE0.ibdev).exists():
        run("rdma", "link", "add", RXE0.ibdev, "type", "rxe", "netdev", RXE0.netdev)


async def wait(
    kubelet: KubeletPeer, what: str, predicate: Callable[[], bool], limit: float = 30
) -> None:
    try:
        await kubelet.wait_for(predicate, limit)
    except TimeoutError:
        raise AssertionError(
            f"{what}: not seen within {limit} s; devices {kubelet.health(RESOURCE)}"
        ) from None


@pytest.mark.usefixtures("restore_rxe0")
async def test_link_and_rdma_link_changes_reach_the_stream_without_a_restart(
    kubelet: KubeletPeer, plugin: PluginProcess
) -> None:
    # No periodic re-scan within the test: every change must arrive as a kernel event
    # (rtnetlink for the link, a uevent for the rdma link).
    await registered(kubelet, plugin, RESOURCE, EXCLUSIVE_RXE, rescan_interval=600.0)
    assert kubelet.health(RESOURCE) == {"rxe0": "Healthy", "rxe1": "Healthy"}

    run("ip", "link", "set", RXE0.netdev, "down")
    await wait(
        kubelet, "rxe0 Unhealthy", lambda: kubelet.health(RESOURCE).get("rxe0") == "Unhealthy"
    )
    first = dict(kubelet.health(RESOURCE))
    # its veth peer loses carrier with it: rxe1 follows, from its own link message
    await wait(
        kubelet, "rxe1 Unhealthy", lambda: kubelet.health(RESOURCE).get("rxe1") == "Unhealthy"
    )
    FIGURES.append(
        f"health: {RXE0.netdev} down -> first update {first}, then rxe1 Unhealthy too "
        f"({RXE1.netdev} lost carrier)"
    )
    run("ip", "link", "set", RXE0.netdev, "up")
    await wait(
        kubelet, "both Healthy", lambda: set(kubelet.health(RESOURCE).values()) == {"Healthy"}
    )

    t0 = time.monotonic()
    run("rdma", "link", "delete", RXE0.ibdev)
    await wait(kubelet, "rxe0 gone", lambda: "rxe0" not in kubelet.health(RESOURCE))
    gone = time.monotonic() - t0
    run("rdma", "link", "add", RXE0.ibdev, "type", "rxe", "netdev", RXE0.netdev)
    await wait(kubelet, "rxe0 back", lambda: kubelet.health(RESOURCE).get("rxe0") == "Healthy")
    back = time.monotonic() - t0 - gone
    FIGURES.append(
        f"health: rdma link delete -> gone in {gone:.2f} s, add -> back in {back:.2f} s, "
        "on uevents (--rescan-interval 600)"
    )

    assert kubelet.health(RESOURCE) == {"rxe0": "Healthy", "rxe1": "Healthy"}
    assert plugin.running(), "the same plugin process saw it all"
    assert len(kubelet.registrations) == 1, "one stream carried every change"


def percentile(samples: list[float], p: float) -> float:
    """Nearest-rank percentile (with 20 samples p99 is the largest)."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


@pytest.mark.usefixtures("restore_rxe0")
@pytest.mark.timeout(600)
async def test_measures_link_down_to_update_at_the_peer(
    kubelet: KubeletPeer, plugin: PluginProcess
) -> None:
    # A periodic re-scan far beyond the figures: every update measured came from a netlink event.
    reg = await registered(kubelet, plugin, RESOURCE, EXCLUSIVE_RXE, rescan_interval=120.0)
    # One long-lived `ip -batch`: the clock starts when the command is written, not at a fork.
    ip = await asyncio.create_subprocess_exec("ip", "-batch", "-", stdin=subprocess.PIPE)
    assert ip.stdin is not None
    down: list[float] = []
    up: list[float] = []

    async def flip(state: str, want: str, into: list[float]) -> None:
        seen = len(reg.updates)
        t0 = time.perf_counter()
        assert ip.stdin is not None
        ip.stdin.write(f"link set {RXE0.netdev} {state}\n".encode())
        await ip.stdin.drain()

        def arrived() -> bool:
            return any(
                {d.ID: d.health for d in devices}.get("rxe0") == want
                for _, devices in reg.updates[seen:]
            )

        await wait(kubelet, f"rxe0 {want} after {state}", arrived)
        at = next(
            t
            for t, devices in reg.updates[seen:]
            if {d.ID: d.health for d in devices}.get("rxe0") == want
        )
        into.append(at - t0)

    try:
        for _ in range(FLIPS):
            await flip("down", "Unhealthy", down)
            await flip("up", "Healthy", up)
            await asyncio.sleep(0.05)
    finally:
        ip.stdin.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ip.wait(), 10)

    for name, samples in (("link down -> Unhealthy", down), ("link up -> Healthy", up)):
        FIGURES.append(
            f"P2 (real netlink event, rxe in qemu TCG): {name} at the peer over {len(samples)} "
            f"flips: p50 {statistics.median(samples) * 1000:.0f} ms, "
            f"p99 {percentile(samples, 99) * 1000:.0f} ms, min {min(samples) * 1000:.0f} ms"
        )
    assert len(down) == len(up) == FLIPS
    assert plugin.running()
