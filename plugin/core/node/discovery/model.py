"""What discovery finds on a node: plain values, no I/O."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Literal, Protocol

# The RDMA device names this project hands out: what drivers and udev's RDMA naming give
# (mlx5_0, rxe0, erdma_0, rocep1s0f0), no more. The kernel allows any name without '/' or white
# space (`mlx5_$(id)`, `-rf`): such a name would reach env vars, NCCL's settings and shells, and
# is left out, said, by discovery and podenv alike.
IBDEV_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}")

ROCE_V2 = "RoCE v2"
GidType = Literal["IB/RoCE v1", "RoCE v2"]


class DiscoveryError(RuntimeError):
    """The node's RDMA stack could not be read at all (not: a device without RDMA)."""


@dataclass(frozen=True)
class Gid:
    index: int
    gid: str  # canonical IPv6 text form, e.g. "fe80::1" or "::ffff:192.168.1.1"
    type: GidType
    netdev: str | None

    @property
    def is_global_ipv6(self) -> bool:
        """A RoCE v2 GID made from a routable IPv6 address (what non-hostNetwork pods need)."""
        addr = ipaddress.IPv6Address(self.gid)
        return (
            self.type == ROCE_V2
            and addr.ipv4_mapped is None
            and not addr.is_link_local
            and not addr.is_loopback
            and not addr.is_unspecified
        )


@dataclass(frozen=True)
class Port:
    number: int
    state: str  # "ACTIVE", "DOWN", "INIT", ...
    link_layer: str  # "Ethernet" | "InfiniBand"
    netdevs: tuple[str, ...] = ()
    gids: tuple[Gid, ...] = ()

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"


@dataclass(frozen=True)
class CharDevices:
    """Names under /dev/infiniband whose sysfs entry and device node both exist."""

    uverbs: str | None = None
    umad: tuple[str, ...] = ()
    issm: tuple[str, ...] = ()


@dataclass(frozen=True)
class Hca:
    name: str
    vendor: str  # "15b3"; "" for virtual devices (rxe, siw)
    device_id: str  # "1017"; "" for virtual devices
    driver: str  # "mlx5_core"; for virtual devices the rdma link type ("rxe", "siw")
    numa_node: int | None  # None when the kernel reports -1 or there is no PCI parent
    ports: tuple[Port, ...]
    chardevs: CharDevices
    problems: tuple[str, ...] = ()  # why something expected is missing, for logs and errors
    readable: bool = True  # False: its sysfs entry could not be read at all
    pci_address: str | None = None  # "0000:3b:00.0"; None for virtual devices
    # The PCIe root complex ("pci0000:3a"), as Kubernetes' resource.kubernetes.io/pcieRoot
    pcie_root: str | None = None

    @property
    def netdevs(self) -> tuple[str, ...]:
        return tuple(n for p in self.ports for n in p.netdevs)

    @property
    def link_layers(self) -> tuple[str, ...]:
        return tuple(p.link_layer for p in self.ports)

    def unhealthy_reason(self) -> str | None:
        """None when a pod could use this HCA now; else why not."""
        if not self.readable:
            return f"{self.name}: cannot be read from sysfs"
        if self.chardevs.uverbs is None:
            return f"{self.name}: no uverbs device node"
        return self.inactive_reason()

    def inactive_reason(self) -> str | None:
        """None when a port of this HCA is ACTIVE; else the state of each."""
        if any(p.active for p in self.ports):
            return None
        unread = "; ".join(p for p in self.problems if "/ports" in p)  # sysfs._numbered
        states = ", ".join(f"port {p.number} {p.state}" for p in self.ports) or (
            f"no ports read: {unread}" if unread else "no ports"
        )
        return f"{self.name}: no ACTIVE port ({states})"


@dataclass(frozen=True)
class Inventory:
    """One scan of the node."""

    hcas: tuple[Hca, ...] = ()
    rdma_cm: bool = False  # /dev/infiniband/rdma_cm exists
    netns_mode: str | None = None  # "shared" | "exclusive"; None when ib_core is not loaded
    errors: tuple[str, ...] = ()


class Discovery(Protocol):
    """Reads the node's RDMA devices; one implementation per source (sysfs, verbs)."""

    name: str

    def scan(self) -> Inventory: ...
