"""Event-driven health: re-scan on netlink link/address changes and on kernel uevents of RDMA
devices (driver loaded, `rdma link add/delete`, hot-plug), plus a periodic backstop, and push
every change to the servicers at once. A netdev losing carrier takes its ports down before the
scan it triggers (fail fast); only a scan brings them back (recover on evidence)."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import time

from plugin import pool as policy
from plugin.config import PluginConfig
from plugin.discovery.model import Discovery, Inventory
from plugin.linkstate import carrier_changes, without_carrier
from plugin.metrics import Metrics
from plugin.netmode import non_host_network_problems
from plugin.server import DevicePluginServicer

logger = logging.getLogger(__name__)

# rtnetlink multicast groups: link up/down, and address changes (they change the GID table)
_RTMGRP_LINK, _RTMGRP_IPV4_IFADDR, _RTMGRP_IPV6_IFADDR = 0x1, 0x10, 0x100
_RTNETLINK = (socket.NETLINK_ROUTE, _RTMGRP_LINK | _RTMGRP_IPV4_IFADDR | _RTMGRP_IPV6_IFADDR)
# kernel uevents (group 1): an ibdev or its uverbs/umad node appearing or going away
_UEVENTS = (15, 1)  # NETLINK_KOBJECT_UEVENT


class HealthWatcher:
    """Owns the scan loop: discovery -> pool views -> servicers and metrics."""

    def __init__(
        self,
        discovery: Discovery,
        config: PluginConfig,
        metrics: Metrics,
        interval: float,
    ) -> None:
        self.discovery = discovery
        self.config = config
        self.metrics = metrics
        self.interval = interval
        self.servicers: dict[str, DevicePluginServicer] = {}
        self._trigger = asyncio.Event()
        self._reported: tuple[str, ...] | None = None
        # netdevs rtnetlink last reported without carrier; they hold their ports down
        self._no_carrier: frozenset[str] = frozenset()
        self._inventory = Inventory()  # the last scan, as discovery read it
        self._fail_fast: asyncio.Task[None] | None = None

    def scan(self) -> list[policy.PoolView]:
        """One scan, logged and counted; raises DiscoveryError."""
        no_carrier = self._no_carrier  # this thread's snapshot; the loop replaces the set
        self._inventory = self.discovery.scan()
        self.metrics.last_scan.set(time.time())
        return self._views(no_carrier)

    def _views(self, no_carrier: frozenset[str]) -> list[policy.PoolView]:
        """The last scan's inventory with `no_carrier`'s ports held down, as pool views."""
        inventory = without_carrier(self._inventory, no_carrier)
        views, conflicts = policy.assign(self.config, inventory)
        self._report(inventory, views, conflicts)
        return views

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        socks = [s for s in (_netlink_socket(*_RTNETLINK), _netlink_socket(*_UEVENTS)) if s]
        for sock in socks:
            loop.add_reader(sock.fileno(), self._on_netlink, sock)
        try:
            while True:
                trigger = "event"
                try:
                    await asyncio.wait_for(self._trigger.wait(), timeout=self.interval)
                except TimeoutError:
                    trigger = "periodic"
                self._trigger.clear()
                self.metrics.scans.labels(trigger).inc()
                await self.rescan()
        finally:
            for sock in socks:
                loop.remove_reader(sock.fileno())
                sock.close()

    async def rescan(self) -> None:
        no_carrier = self._no_carrier
        try:
            # sysfs reads (hundreds of GID files per port) stay off the loop serving Allocate
            views = await asyncio.to_thread(self.scan)
        except Exception:  # keep serving the last good view; the next trigger retries
            self.metrics.errors.labels(kind="scan").inc()
            logger.exception("scan failed; keeping the previous devices")
            return
        if self._no_carrier != no_carrier:  # carrier changed while it ran: its view is stale
            views = self._views(self._no_carrier)
        await self._publish(views)

    async def _publish(self, views: list[policy.PoolView]) -> None:
        for view in views:
            servicer = self.servicers.get(view.pool.name)
            if servicer is not None:
                await servicer.update(view)

    def _on_netlink(self, sock: socket.socket) -> None:
        rtnetlink = sock.proto == socket.NETLINK_ROUTE
        relevant = rtnetlink
        try:
            while data := sock.recv(65536):
                if rtnetlink:
                    self.on_link_message(data)
                relevant = relevant or b"SUBSYSTEM=infiniband" in data  # uevents: RDMA only
        except BlockingIOError:
            pass
        except OSError as exc:
            if exc.errno != errno.ENOBUFS:
                raise
            # the kernel dropped messages: what they said is unknown, so a scan decides
            relevant = True
            self.metrics.errors.labels(kind="netlink_overrun").inc()
            logger.warning("netlink socket overran (protocol %d); re-scanning", sock.proto)
            if rtnetlink:
                self._no_carrier = frozenset()
        if relevant:
            self._trigger.set()

    def on_link_message(self, data: bytes) -> None:
        """An rtnetlink datagram: a netdev of the last scan losing carrier takes its ports
        down at once, without waiting for a scan (one may be running in its thread)."""
        changes = carrier_changes(data)
        down = {n for n, carrier in changes.items() if not carrier}
        lost = down - self._no_carrier
        self._no_carrier = frozenset((self._no_carrier - changes.keys()) | down)
        if lost & {n for h in self._inventory.hcas for n in h.netdevs}:
            views = self._views(self._no_carrier)
            # one at a time: a later loss publishes after the earlier one, never before
            self._fail_fast = asyncio.get_running_loop().create_task(
                self._publish_after(self._fail_fast, views)
            )

    async def _publish_after(
        self, previous: asyncio.Task[None] | None, views: list[policy.PoolView]
    ) -> None:
        if previous is not None:
            await previous
        await self._publish(views)

    def _report(
        self, inventory: Inventory, views: list[policy.PoolView], conflicts: list[str]
    ) -> None:
        self.metrics.pool_conflicts.set(len(conflicts))
        for view in views:
            resource = view.pool.resource_name
            healthy = sum(d.healthy for d in view.devices)
            self.metrics.devices.labels(resource, policy.HEALTHY).set(healthy)
            self.metrics.devices.labels(resource, policy.UNHEALTHY).set(len(view.devices) - healthy)
            self.metrics.hcas.labels(resource).set(len(view.hcas))
        problems = (
            list(inventory.errors)
            + list(conflicts)
            + [p for h in inventory.hcas for p in h.problems]
        )
        for view in views:  # shared IDs all carry the same reason: report each reason once
            reasons = dict.fromkeys(d.reason for d in view.devices if d.reason)
            problems += [f"{view.pool.resource_name}: {r}" for r in reasons]
            if not view.hcas:
                problems.append(f"{view.pool.resource_name}: {_why_empty(inventory)}")
        if self.config.non_host_network:
            hcas = tuple(h for v in views for h in v.hcas)
            net = non_host_network_problems(inventory, hcas)
            self.metrics.non_host_network_ready.set(0 if net else 1)
            problems += [f"nonHostNetwork: true but {p}" for p in net]
        self.metrics.problems.set(len(problems))
        # Loud but not noisy: log the whole set whenever it changes.
        if tuple(problems) != self._reported:
            self._reported = tuple(problems)
            for p in problems:
                logger.error("%s", p)
            summary = ", ".join(
                f"{v.pool.resource_name}={len(v.hcas)} HCAs/{len(v.devices)} IDs" for v in views
            )
            logger.info("scan (%s): %s", self.discovery.name, summary)


def _why_empty(inventory: Inventory) -> str:
    if not inventory.hcas:
        return (
            "no RDMA device on this node (sysfs class/infiniband missing or empty: is the RDMA "
            "driver loaded?): 0 devices until one appears"
        )
    names = ", ".join(h.name for h in inventory.hcas)
    return f"its selector matches none of this node's HCAs ({names}): 0 devices; fix the selector"


def _netlink_socket(protocol: int, groups: int) -> socket.socket | None:
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, protocol)
        sock.bind((0, groups))
        sock.setblocking(False)
    except OSError as exc:
        logger.warning(
            "no netlink events (protocol %d: %s): relying on the periodic re-scan", protocol, exc
        )
        return None
    return sock
