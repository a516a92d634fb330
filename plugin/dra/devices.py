"""Pure policy of the DRA front end: the devices a node publishes in its ResourceSlices, made
from the same pool views the device plugin lists, and the HCAs an allocated device grants.

The device model (resource.k8s.io/v1, GA features only):
- a shared pool publishes `maxAllocations` share devices, `<pool>-<i>`; each one granted gives
  every HCA of the pool that is usable at prepare time, as one `rdma/hca` ID does. A claim takes
  one; many pods on the node share the HCAs, at most `maxAllocations` of them at once. Counted
  devices (one device, many claims) would need DRAConsumableCapacity, an alpha gate that ACK's
  managed control plane does not let anyone turn on.
- an exclusive pool publishes one device per HCA, `<pool>-<ibdev>`, with the HCA's attributes
  and `resource.kubernetes.io/pcieRoot`, so a claim can ask for the HCA beside its GPU.
- a device that is not usable now is withdrawn from the slice: 1.34's slices carry no health
  (device taints are alpha), and a device in a slice is one the scheduler may hand out. A pod
  that already holds it keeps it; a share device is withdrawn only when no HCA of its pool is
  usable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from plugin.config import MAX_LABEL, label
from plugin.core.node import pools
from plugin.core.node.discovery.model import Hca

# What Kubernetes' deviceattribute package calls the PCIe root complex of a device.
PCIE_ROOT_ATTRIBUTE = "resource.kubernetes.io/pcieRoot"
# resource.k8s.io/v1: at most this many devices in one ResourceSlice.
MAX_DEVICES_PER_SLICE = 128

AttributeValue = str | int | bool


@dataclass(frozen=True)
class SliceDevice:
    """One device of a ResourceSlice, and what granting it gives."""

    name: str  # a DNS label, unique among the node's devices of this driver
    pool: str  # the config pool it comes from
    hcas: tuple[str, ...]  # for an exclusive device, its one HCA
    attributes: tuple[tuple[str, AttributeValue], ...]

    def as_api(self) -> dict[str, object]:
        """The device as resource.k8s.io/v1 spells it."""
        return {
            "name": self.name,
            "attributes": {k: _typed(v) for k, v in self.attributes},
        }


def _typed(value: AttributeValue) -> dict[str, object]:
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    return {"string": value}


def slice_devices(views: Sequence[pools.PoolView]) -> tuple[list[SliceDevice], list[str]]:
    """Every device the node publishes now, and why an HCA a pool selected has none."""
    devices: list[SliceDevice] = []
    skipped: list[str] = []
    for view in views:
        if view.pool.mode == "shared":
            devices += _shares(view)
        else:
            for hca in view.hcas:
                if hca.unhealthy_reason() is None:
                    devices.append(_exclusive(view, hca))
    owners: dict[str, str] = {}
    unique: list[SliceDevice] = []
    for device in devices:
        if (owner := owners.get(device.name)) is not None:
            fix = (
                "rename one of its HCAs, whose names read alike as a DNS label"
                if owner == device.pool
                else f"rename this pool or pool {owner}, which has a device of that name"
            )
            skipped.append(f"{device.pool}: device {device.name} is not published: {fix}")
        elif len(device.name) > MAX_LABEL or not device.name:
            skipped.append(
                f"{device.pool}: device {device.name or '(empty)'} is not a DNS label (at most "
                f"{MAX_LABEL} of a-z, 0-9, '-'): not published; give the pool a shorter name"
            )
        else:
            owners[device.name] = device.pool
            unique.append(device)
    return unique, skipped


def _shares(view: pools.PoolView) -> list[SliceDevice]:
    usable = tuple(h.name for h in view.hcas if h.unhealthy_reason() is None)
    if not usable:
        return []
    attributes: tuple[tuple[str, AttributeValue], ...] = (
        ("mode", "shared"),
        ("pool", view.pool.name),
        ("hcas", ",".join(usable)),
    )
    prefix = label(view.pool.name)
    return [
        SliceDevice(f"{prefix}-{i}", view.pool.name, usable, attributes)
        for i in range(view.pool.max_allocations)
    ]


def _exclusive(view: pools.PoolView, hca: Hca) -> SliceDevice:
    port = next((p for p in hca.ports if p.active), hca.ports[0] if hca.ports else None)
    attributes: list[tuple[str, AttributeValue]] = [
        ("mode", "exclusive"),
        ("pool", view.pool.name),
        ("ibdev", hca.name),
        ("vendor", hca.vendor),
        ("deviceID", hca.device_id),
        ("driver", hca.driver),
    ]
    if port is not None:
        attributes += [("linkLayer", port.link_layer), ("portState", port.state)]
        if port.netdevs:
            attributes.append(("netdev", port.netdevs[0]))
    if hca.numa_node is not None:
        attributes.append(("numaNode", hca.numa_node))
    if hca.pcie_root is not None:
        attributes.append((PCIE_ROOT_ATTRIBUTE, hca.pcie_root))
    name = f"{label(view.pool.name)}-{label(hca.name)}"
    return SliceDevice(name, view.pool.name, (hca.name,), tuple(attributes))


def slices(devices: Sequence[SliceDevice]) -> list[list[SliceDevice]]:
    """The devices split into ResourceSlices of at most MAX_DEVICES_PER_SLICE; one empty slice
    when there is none (a pool with no device still says so, at its generation)."""
    if not devices:
        return [[]]
    return [
        list(devices[i : i + MAX_DEVICES_PER_SLICE])
        for i in range(0, len(devices), MAX_DEVICES_PER_SLICE)
    ]


def device_class_name(driver: str, mode: str) -> str:
    return f"rdma-{mode}.{driver}"


def device_class(driver: str, mode: str) -> dict[str, object]:
    """The DeviceClass of one mode's devices: a claim asks `deviceClassName` for a share of
    every HCA (shared) or for one HCA (exclusive)."""
    expression = f'device.driver == "{driver}" && device.attributes["{driver}"].mode == "{mode}"'
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": device_class_name(driver, mode)},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }
