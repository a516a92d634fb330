"""Event-driven health: re-scan on netlink link/address changes and on kernel uevents of RDMA
devices (driver loaded, `rdma link add/delete`, hot-plug), plus a periodic backstop, and push
every change to the endpoints at once. A netdev losing carrier takes its ports down before the
scan it triggers (fail fast); only a scan brings them back (recover on evidence)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from plugin.config import PluginConfig
from plugin.core.metrics.exposition import Metrics
from plugin.core.node import pools
from plugin.core.node.discovery.model import Discovery, Inventory
from plugin.core.node.kernel_events import KernelEvents
from plugin.core.node.linkstate import carrier_changes, without_carrier
from plugin.core.node.netmode import non_host_network_problems
from plugin.core.node.problems import (
    HCA_GONE,
    HCA_SKIPPED,
    HCA_UNHEALTHY,
    HCA_UNREADABLE,
    NO_RDMA_CM,
    NON_HOST_NETWORK,
    POOL_CONFLICT,
    POOL_EMPTY,
    SCAN_ERROR,
    NodeProblem,
)

logger = logging.getLogger(__name__)

Publish = Callable[[Sequence[pools.PoolView]], Awaitable[None]]


class HealthWatcher:
    """The node's state: the only holder of the last inventory, the netdevs without carrier and
    the pool views made of them. Scans run in a thread that returns an Inventory and writes
    nothing; everything else runs on the event loop. Every new set of views goes to `publish`."""

    def __init__(
        self,
        discovery: Discovery,
        config: PluginConfig,
        metrics: Metrics,
        interval: float,
        publish: Publish,
        on_problems: Callable[[Sequence[NodeProblem]], None] = lambda problems: None,
        front_end: Callable[[], Sequence[NodeProblem]] = tuple,
    ) -> None:
        self.discovery = discovery
        self.config = config
        self.metrics = metrics
        self.interval = interval
        self.publish = publish
        self.on_problems = on_problems  # every scan's problems (the Node's Events)
        # the front end's own problems as of its last publish (a device it cannot name, the
        # kubelet refusing it): said, counted and evented with the node's
        self.front_end = front_end
        self._trigger = asyncio.Event()
        self._reported: tuple[NodeProblem, ...] | None = None
        # netdevs rtnetlink last reported without carrier; they hold their ports down
        self._no_carrier: frozenset[str] = frozenset()
        self._inventory = Inventory()  # the last scan, as discovery read it
        self._views: list[pools.PoolView] = []  # the last ones made, kept where unchanged
        # (pool's resource, HCA) each pool has held since start: one gone from the node since is
        # a problem, and its health series stays, at 0, for the alert on it
        self._served: set[tuple[str, str]] = set()
        self._fail_fast: asyncio.Task[None] | None = None
        self._made: tuple[Inventory, list[pools.PoolView], list[str]] = (Inventory(), [], [])

    def _make_views(self) -> list[pools.PoolView]:
        """The last scan's inventory with the ports of netdevs without carrier held down."""
        inventory = without_carrier(self._inventory, self._no_carrier)
        views, conflicts = pools.assign(self.config, inventory, self._views)
        self._views = views
        self._made = (inventory, views, conflicts)
        return views

    async def _publish(self, views: list[pools.PoolView]) -> None:
        """The views to the front end, then the problems they and its answer hold."""
        await self.publish(views)
        if views is self._views:  # not views a later change has replaced meanwhile
            self._report(*self._made)

    async def run(self) -> None:
        """Scan on every relevant kernel event and every `interval`, publishing each result."""
        events = KernelEvents(self.on_link_message, self._trigger.set, self._on_overrun)
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(events.run())
                while True:
                    trigger = "event"
                    try:  # asyncio.timeout, not wait_for: 3.11's wait_for can lose a cancel
                        async with asyncio.timeout(self.interval):
                            await self._trigger.wait()
                    except TimeoutError:
                        trigger = "periodic"
                    self._trigger.clear()
                    self.metrics.scans.labels(trigger).inc()
                    await self.rescan()
        finally:
            if self._fail_fast is not None:  # a publish still queued has no one to serve
                self._fail_fast.cancel()

    async def rescan(self) -> None:
        """One scan, published; a failed one keeps the last views (the next trigger retries)."""
        try:
            # sysfs reads (hundreds of GID files per port) stay off the loop serving Allocate
            inventory = await asyncio.to_thread(self.discovery.scan)
        except Exception:
            self.metrics.errors.labels(kind="scan").inc()
            logger.exception("scan failed; serving what the last good scan found, if any")
            return
        self._inventory = inventory
        self.metrics.last_scan.set(time.time())
        # carrier lost while the scan ran is still held: _make_views applies the current set
        await self._publish(self._make_views())

    def _on_overrun(self, rtnetlink: bool) -> None:
        self.metrics.errors.labels(kind="netlink_overrun").inc()
        if rtnetlink:  # which netdevs lost or regained carrier is unknown: the scan decides
            self._no_carrier = frozenset()

    def on_link_message(self, data: bytes) -> None:
        """An rtnetlink datagram: a netdev of the last scan losing carrier takes its ports
        down at once, without waiting for a scan (one may be running in its thread)."""
        changes = carrier_changes(data)
        down = {n for n, carrier in changes.items() if not carrier}
        lost = down - self._no_carrier
        self._no_carrier = frozenset((self._no_carrier - changes.keys()) | down)
        if lost & {n for h in self._inventory.hcas for n in h.netdevs}:
            views = self._make_views()
            # one at a time: a later loss publishes after the earlier one, never before
            self._fail_fast = asyncio.get_running_loop().create_task(
                self._publish_after(self._fail_fast, views)
            )

    async def _publish_after(
        self, previous: asyncio.Task[None] | None, views: list[pools.PoolView]
    ) -> None:
        if previous is not None:
            await previous
        await self._publish(views)

    def _report(
        self, inventory: Inventory, views: list[pools.PoolView], conflicts: list[str]
    ) -> None:
        self.metrics.pool_conflicts.set(len(conflicts))
        self.metrics.hca_healthy.clear()  # redrawn: an HCA gone is set to 0 below
        present = {(v.pool.resource_name, h.name) for v in views for h in v.hcas}
        self._served |= present
        gone = sorted(self._served - present)
        for resource, hca in gone:
            self.metrics.hca_healthy.labels(resource, hca).set(0)
        for view in views:
            resource = view.pool.resource_name
            healthy = sum(d.healthy for d in view.devices)
            self.metrics.devices.labels(resource, pools.HEALTHY).set(healthy)
            self.metrics.devices.labels(resource, pools.UNHEALTHY).set(len(view.devices) - healthy)
            self.metrics.hcas.labels(resource).set(len(view.hcas))
            for hca in view.hcas:
                ok = hca.unhealthy_reason() is None
                self.metrics.hca_healthy.labels(resource, hca.name).set(1 if ok else 0)
        net: list[str] = []
        if self.config.non_host_network:
            net = non_host_network_problems(inventory, tuple(h for v in views for h in v.hcas))
            self.metrics.non_host_network_ready.set(0 if net else 1)
        problems = [
            *node_problems(self.config, inventory, views, conflicts, gone, net),
            *self.front_end(),
        ]
        self.metrics.problems.set(len(problems))
        self.on_problems(problems)
        # Loud but not noisy: log the whole set whenever it changes.
        if tuple(problems) != self._reported:
            self._reported = tuple(problems)
            for p in problems:
                logger.error("%s", p.message)
            summary = ", ".join(
                f"{v.pool.resource_name}={_hcas(v)}/{len(v.devices)} IDs" for v in views
            )
            logger.info("scan (%s): %s", self.discovery.name, summary)


def node_problems(
    config: PluginConfig,
    inventory: Inventory,
    views: Sequence[pools.PoolView],
    conflicts: Sequence[str],
    gone: Sequence[tuple[str, str]] = (),
    non_host_network: Sequence[str] = (),
) -> list[NodeProblem]:
    """What is wrong on the node, each with its reason and what to do: of one scan's inventory
    and pool views, the HCAs served before and gone since (resource, HCA), and why pods off the
    host network could not use RDMA here."""
    problems: list[NodeProblem] = []
    if not inventory.rdma_cm and inventory.hcas:
        problems.append(NodeProblem(NO_RDMA_CM, "no rdma_cm device node (is rdma_ucm loaded?): "
                                    "pods get no RDMA connection manager"))  # fmt: skip
    problems += [NodeProblem(SCAN_ERROR, e) for e in inventory.errors]
    problems += [NodeProblem(POOL_CONFLICT, c) for c in conflicts]
    problems += [NodeProblem(HCA_UNREADABLE, p) for h in inventory.hcas for p in h.problems]
    problems += [
        NodeProblem(HCA_GONE, f"{resource}: {hca}: served before, now gone from this node "
                "(unplugged, its driver unloaded, or renamed): pods are not given it")
        for resource, hca in gone
    ]  # fmt: skip
    for view in views:  # each HCA's own reason: a shared ID stays healthy without it
        resource = view.pool.resource_name
        reasons = [r for h in view.hcas if (r := h.unhealthy_reason()) is not None]
        problems += [
            NodeProblem(HCA_UNHEALTHY, f"{resource}: {r}: left out of allocations") for r in reasons
        ]
        problems += [NodeProblem(HCA_SKIPPED, f"{resource}: {r}") for r in view.skipped]
        if not view.hcas:
            lost = [h for r, h in gone if r == resource]
            why = _why_empty(inventory, view, lost)
            problems.append(NodeProblem(POOL_EMPTY, f"{resource}: {why}"))
    if config.non_host_network:
        problems += [
            NodeProblem(NON_HOST_NETWORK, f"nonHostNetwork: true but {p}") for p in non_host_network
        ]
    return problems


def _hcas(view: pools.PoolView) -> str:
    """A pool's HCAs as the summary counts them: those a pod could use now, of all it took."""
    usable = sum(h.unhealthy_reason() is None for h in view.hcas)
    if usable == len(view.hcas):
        return f"{len(view.hcas)} HCAs"
    return f"{usable} of {len(view.hcas)} HCAs usable"


def _why_empty(inventory: Inventory, view: pools.PoolView, gone: list[str]) -> str:
    if gone:  # each said as gone already: the selector is not at fault
        return f"the HCAs it served ({', '.join(gone)}) are gone: 0 devices until they are back"
    if not inventory.hcas:
        return (
            "no RDMA device on this node (sysfs class/infiniband missing or empty: is the RDMA "
            "driver loaded?): 0 devices until one appears"
        )
    selected = [h.name for h in inventory.hcas if pools.selects(view.pool.selector, h)]
    if selected:  # each went to an exclusive pool listed before this one
        return (
            f"every HCA it selects ({', '.join(selected)}) goes to an exclusive pool listed "
            "before it: 0 devices; make the selectors disjoint"
        )
    names = ", ".join(h.name for h in inventory.hcas)
    return f"its selector matches none of this node's HCAs ({names}): 0 devices; fix the selector"
