"""Which GID a pod's RDMA traffic must use, pure: the RoCE v2 GID whose value is an address of
the pod's own network namespace, on the HCAs Allocate gave it.

In the kernel's shared RDMA netns mode, a port's one GID table holds the host's GIDs and one per
address of every pod interface that is a child (ipvlan/macvlan) of the port's netdev. NCCL's own
choice (the first valid RoCE v2 GID of a family) knows nothing of namespaces; MLNX_OFED refuses a
QP whose source GID's netdev is in another namespace (ENODEV at MODIFY_QP to RTR).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from plugin.core.node.discovery.model import ROCE_V2, Gid, Hca
from plugin.launch import Family

IP = ipaddress.IPv4Address | ipaddress.IPv6Address
FIX = (
    "give the pod an address on the RDMA network: hostNetwork: true, or (off the host network) "
    "an IPv6 Lingjun compute network whose pod interfaces are children of the RDMA netdevs "
    "(stack config nonHostNetwork: true with computeNetworkIpv6: true)"
)


class NoGidError(RuntimeError):
    """No usable GID for this namespace: the message names the HCAs, the addresses and the fix."""


@dataclass(frozen=True)
class NsAddress:
    """An address of the caller's network namespace, on one of its interfaces."""

    ifname: str
    ip: IP


@dataclass(frozen=True)
class PortGids:
    """One port's GIDs that are addresses of this namespace: GID index -> the address."""

    hca: str
    port: int
    matches: dict[int, NsAddress]


# The variables a Choice sets: the pod's own, never given from outside.
COMPUTED = ("NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_SOCKET_IFNAME")


@dataclass(frozen=True)
class Choice:
    family: Family
    gid_index: int
    ports: tuple[PortGids, ...]

    def env(self) -> dict[str, str]:
        """NCCL's variables (COMPUTED): exact-match HCA:port list, the GID index, the
        interface(s)."""
        ifnames = dict.fromkeys(p.matches[self.gid_index].ifname for p in self.ports)
        values = (
            "=" + ",".join(f"{p.hca}:{p.port}" for p in self.ports),
            str(self.gid_index),
            "=" + ",".join(ifnames),
        )
        return dict(zip(COMPUTED, values, strict=True))


def usable(addresses: Sequence[NsAddress], family: Family) -> list[NsAddress]:
    """The addresses a RoCE v2 GID of `family` can carry: routable ones. A link-local IPv6
    address is left out: an ipvlan child shares its parent's MAC, so its fe80:: address (and
    GID) is the host's too."""
    found: list[NsAddress] = []
    for a in addresses:
        if a.ip.is_loopback or a.ip.is_link_local or a.ip.is_unspecified:
            continue
        if (family == "ipv4") == (a.ip.version == 4):
            found.append(a)
    return found


def _gid_ip(gid: Gid) -> IP:
    addr = ipaddress.IPv6Address(gid.gid)
    return addr.ipv4_mapped or addr


def port_gids(hca: Hca, addresses: Sequence[NsAddress], family: Family) -> list[PortGids]:
    """Each active Ethernet port of `hca` with its RoCE v2 GIDs that are `addresses`."""
    by_ip = {a.ip: a for a in usable(addresses, family)}
    found: list[PortGids] = []
    for port in hca.ports:
        if not port.active or port.link_layer != "Ethernet":
            continue
        matches = {
            g.index: by_ip[_gid_ip(g)]
            for g in port.gids
            if g.type == ROCE_V2 and _gid_ip(g) in by_ip
        }
        found.append(PortGids(hca.name, port.number, matches))
    return found


def choose(hcas: Sequence[Hca], addresses: Sequence[NsAddress], family: Family) -> Choice:
    """The GID index valid on every allocated HCA for this namespace, or NoGidError.

    NCCL takes one NCCL_IB_GID_INDEX for all HCAs: when the namespace's GID sits at different
    indexes on different HCAs, no single value is right, and that is an error, not a guess.
    """
    inactive = [r for h in hcas if (r := h.inactive_reason()) is not None]
    if inactive:
        raise NoGidError(
            f"{'; '.join(inactive)}: RDMA cannot use it now (the device plugin leaves such an "
            "HCA out of new allocations: restart the pod once its link is up)"
        )
    ports = [p for hca in hcas for p in port_gids(hca, addresses, family)]
    without = [h.name for h in hcas if not any(p.matches for p in ports if p.hca == h.name)]
    if not hcas or without:
        raise NoGidError(_no_gid(hcas, without, addresses, family))
    usable_ports = tuple(p for p in ports if p.matches)
    common = set(usable_ports[0].matches).intersection(*(p.matches for p in usable_ports[1:]))
    if not common:
        where = "; ".join(
            f"{p.hca} port {p.port}: {', '.join(map(str, sorted(p.matches)))}" for p in usable_ports
        )
        raise NoGidError(
            f"this namespace's RoCE v2 GID ({family}) sits at different indexes on the "
            f"allocated HCAs ({where}), and NCCL takes one NCCL_IB_GID_INDEX for all: run one "
            "rank per HCA (an exclusive pool, one HCA per pod) or give every RDMA netdev its "
            "addresses in the same order"
        )
    return Choice(family, min(common), usable_ports)


def _no_gid(
    hcas: Sequence[Hca], without: list[str], addresses: Sequence[NsAddress], family: Family
) -> str:
    shown = ", ".join(f"{a.ifname} {a.ip}" for a in addresses) or "none"
    names = ", ".join(without) or "(no HCA allocated)"
    gids = "; ".join(
        f"{h.name} port {p.number}: "
        + (", ".join(f"{g.index}={_gid_ip(g)}" for g in p.gids if g.type == ROCE_V2) or "none")
        for h in hcas
        if h.name in without
        for p in h.ports
    )
    unread = "; ".join(  # the GID entries discovery could not read (sysfs._read_gids)
        p for h in hcas if h.name in without for p in h.problems if "/gid" in p
    )
    found = (
        f"no RoCE v2 GID for an {family} address of this network namespace on {names} "
        f"(RoCE v2 GIDs: {gids or 'none'}); this namespace's addresses: {shown}"
    )
    if unread:  # the one it needs may be there: that, not the pod's network, is the first fix
        return f"{found}; not read there, which may hold it: {unread}"
    return f"{found}: {FIX}"
