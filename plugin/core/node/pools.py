"""Pure policy: which HCAs each pool takes, its device IDs, health, topology, preferred
allocation and the Allocate answer."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from functools import cached_property
from pathlib import Path

from common.userfiles import described
from plugin.config import MAX_ID_LENGTH, PluginConfig, Pool, Selector, shared_device_id
from plugin.core.node.discovery.model import Hca, Inventory
from plugin.launch import HCAS_ENV

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
CONTAINER_DEV = Path("/dev/infiniband")


class AllocationError(ValueError):
    """An Allocate the kubelet must refuse; the message says which ID and why."""


@dataclass(frozen=True)
class Device:
    """One device ID as the kubelet sees it."""

    id: str
    healthy: bool
    numa_nodes: tuple[int, ...]
    hcas: tuple[str, ...]
    reason: str | None = None  # why unhealthy


@dataclass(frozen=True)
class DeviceSpec:
    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass(frozen=True)
class Allocation:
    devices: tuple[DeviceSpec, ...]
    envs: dict[str, str]


@dataclass(frozen=True)
class PoolView:
    """A pool's state after one scan: what ListAndWatch sends and what Allocate reads."""

    pool: Pool
    hcas: tuple[Hca, ...]
    devices: tuple[Device, ...]
    rdma_cm: bool
    # Why an HCA the pool selected gives it no device ID (reported, never silently dropped).
    skipped: tuple[str, ...] = ()

    @cached_property
    def by_id(self) -> dict[str, Device]:
        return {d.id: d for d in self.devices}


def selects(selector: Selector, hca: Hca) -> bool:
    """Every non-empty selector field must match (globs for ibdevs and netdevs)."""
    return (
        (
            not selector.vendors
            or hca.vendor in {v.lower().removeprefix("0x") for v in selector.vendors}
        )
        and (
            not selector.device_ids
            or hca.device_id in {d.lower().removeprefix("0x") for d in selector.device_ids}
        )
        and (not selector.drivers or hca.driver in selector.drivers)
        and (not selector.ibdevs or any(fnmatchcase(hca.name, g) for g in selector.ibdevs))
        and (
            not selector.netdevs
            or any(fnmatchcase(n, g) for n in hca.netdevs for g in selector.netdevs)
        )
        and (not selector.link_layers or any(ll in selector.link_layers for ll in hca.link_layers))
    )


def assign(
    config: PluginConfig, inventory: Inventory, last: Sequence[PoolView] = ()
) -> tuple[list[PoolView], list[str]]:
    """Split the HCAs among pools. An HCA an exclusive pool selects belongs to the first pool
    (config order) that selects it; every other claim is reported as a conflict. A pool whose
    HCAs are as in `last` keeps its view there, the same object: its device IDs (up to 100000)
    are not made again on every scan, and what its users built of it stays good."""
    claims: dict[str, list[Pool]] = defaultdict(list)
    for hca in inventory.hcas:
        for pool in config.pools:
            if selects(pool.selector, hca):
                claims[hca.name].append(pool)
    conflicts: list[str] = []
    taken: dict[str, list[Hca]] = defaultdict(list)
    for hca in inventory.hcas:
        pools = claims[hca.name]
        if len(pools) > 1 and any(p.mode == "exclusive" for p in pools):
            names = ", ".join(p.name for p in pools)
            conflicts.append(
                f"{hca.name} is selected by pools {names} and one is exclusive: it goes to "
                f"{pools[0].name} only; make the selectors disjoint"
            )
            pools = pools[:1]
        for pool in pools:
            taken[pool.name].append(hca)
    kept = {v.pool.name: v for v in last}
    views: list[PoolView] = []
    for pool in config.pools:
        hcas = tuple(taken[pool.name])
        view = kept.get(pool.name)
        if view is None or (view.pool, view.hcas, view.rdma_cm) != (pool, hcas, inventory.rdma_cm):
            view = build_view(pool, hcas, inventory.rdma_cm)
        views.append(view)
    return views, conflicts


def build_view(pool: Pool, hcas: tuple[Hca, ...], rdma_cm: bool) -> PoolView:
    skipped: tuple[str, ...] = ()
    if pool.mode == "exclusive":
        devices = tuple(_device(h.name, (h,)) for h in hcas if len(h.name) <= MAX_ID_LENGTH)
        skipped = tuple(
            f"{h.name}: its name is {len(h.name)} characters, over the {MAX_ID_LENGTH} of a "
            "device ID: this exclusive pool cannot offer it; rename it "
            "(rdma dev set <dev> name <shorter>)"
            for h in hcas
            if len(h.name) > MAX_ID_LENGTH
        )
    elif hcas:
        template = _device("", hcas)
        devices = tuple(
            Device(
                shared_device_id(pool.name, i),
                template.healthy,
                template.numa_nodes,
                template.hcas,
                template.reason,
            )
            for i in range(pool.max_allocations)
        )
    else:  # no RDMA device (yet): register with zero devices, pick them up when they appear
        devices = ()
    return PoolView(pool=pool, hcas=hcas, devices=devices, rdma_cm=rdma_cm, skipped=skipped)


def _device(device_id: str, hcas: tuple[Hca, ...]) -> Device:
    reasons = [r for r in (h.unhealthy_reason() for h in hcas) if r is not None]
    healthy = len(reasons) < len(hcas)
    return Device(
        id=device_id,
        healthy=healthy,
        numa_nodes=tuple(sorted({h.numa_node for h in hcas if h.numa_node is not None})),
        hcas=tuple(h.name for h in hcas),
        reason=None if healthy else "; ".join(reasons),
    )


def preferred(
    view: PoolView, available: list[str], must_include: list[str], size: int
) -> list[str]:
    """`size` IDs including `must_include`, only IDs of this pool that the kubelet offers.
    Exclusive pools pack onto the NUMA nodes of `must_include` first, then onto the nodes with
    the most free HCAs (fewest nodes)."""
    devices = view.by_id
    offered = [i for i in dict.fromkeys(available) if i in devices]
    chosen = [i for i in dict.fromkeys(must_include) if i in devices][:size]
    if len(chosen) >= size:
        return chosen
    picked = set(chosen)
    rest = [i for i in offered if i not in picked]
    if view.pool.mode == "shared":
        return chosen + rest[: size - len(chosen)]
    by_node: dict[int, list[str]] = defaultdict(list)
    for device_id in sorted(rest):
        nodes = devices[device_id].numa_nodes
        by_node[nodes[0] if nodes else -1].append(device_id)
    used = {n for i in chosen for n in devices[i].numa_nodes}
    order = sorted(by_node, key=lambda n: (n not in used, -len(by_node[n]), n))
    for node in order:
        chosen.extend(by_node[node][: size - len(chosen)])
        if len(chosen) == size:
            break
    return chosen


# What a device ID handed out here can look like (a pool's name and a number, an HCA's name).
_ID = re.compile(rf"[A-Za-z0-9_.-]{{1,{MAX_ID_LENGTH}}}")


def _quoted(device_id: str) -> str:
    """An ID from the kubelet, quoted if it could be one of ours: any other text is described
    (a clipped quote of a long one can hold what masking no longer sees whole)."""
    if _ID.fullmatch(device_id):
        return repr(device_id)
    return f"({described(device_id)}, not one this plugin gives out)"


def allocated_hcas(view: PoolView, ids: list[str]) -> tuple[str, ...]:
    """The usable HCAs behind `ids`, in the view's order; refuses an unknown or unhealthy ID.
    A shared ID is healthy while one of its HCAs is usable: an HCA that is not (a port down
    or unreadable, no uverbs node) is left out of the allocation, whose env then names only
    what the pod can use."""
    if not ids:
        raise AllocationError(
            f"{view.pool.resource_name}: a container request with no device ID: nothing to "
            "allocate (the kubelet sends one ID per unit the container asks for)"
        )
    seen: set[str] = set()  # not `i in ids[:n]`: 100000 IDs took 43 s on the event loop
    twice = next((i for i in ids if i in seen or seen.add(i)), None)
    if twice is not None:
        raise AllocationError(
            f"{view.pool.resource_name}: device ID {_quoted(twice)} is given twice: the kubelet "
            "sends each at most once; its state is stale, retry the pod"
        )
    devices = view.by_id
    hca_names: set[str] = set()
    for device_id in ids:
        device = devices.get(device_id)
        if device is None:
            raise AllocationError(
                f"{view.pool.resource_name}: device ID {_quoted(device_id)} is unknown to this "
                f"plugin ({_describe_ids(view)}); the kubelet's state is stale, retry the pod"
            )
        if not device.healthy:
            raise AllocationError(
                f"{view.pool.resource_name}: device ID {_quoted(device_id)} is unhealthy: "
                f"{device.reason}"
            )
        hca_names.update(device.hcas)
    return tuple(h.name for h in view.hcas if h.name in hca_names and h.unhealthy_reason() is None)


def allocation(view: PoolView, hca_names: tuple[str, ...], dev_root: Path) -> Allocation:
    """Device specs for rdma_cm and each of these HCAs' uverbs/umad(/issm), and the env naming
    them: the same for every ID that names them (the servicer caches it per view)."""
    hcas = [h for h in view.hcas if h.name in hca_names]
    names = (["rdma_cm"] if view.rdma_cm else []) + [
        n
        for h in hcas
        for n in ((h.chardevs.uverbs,) if h.chardevs.uverbs else ())
        + h.chardevs.umad
        + h.chardevs.issm
    ]
    host = dev_root / "infiniband"
    return Allocation(
        devices=tuple(DeviceSpec(str(CONTAINER_DEV / n), str(host / n)) for n in names),
        envs={HCAS_ENV: ",".join(h.name for h in hcas)},
    )


def _describe_ids(view: PoolView) -> str:
    if not view.devices:
        return "it has no devices"
    if view.pool.mode == "shared":
        return f"it has {view.devices[0].id}..{view.devices[-1].id}"
    return "it has " + ", ".join(d.id for d in view.devices)
