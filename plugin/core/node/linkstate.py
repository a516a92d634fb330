"""Carrier from rtnetlink, pure: which netdevs a link message says are up or down, and an
inventory with the ports of carrier-less netdevs marked down, so that a link loss reaches the
kubelet without waiting for a scan (a scan reads hundreds of sysfs files per port)."""

from __future__ import annotations

import dataclasses
import struct

from plugin.core.node.discovery.model import Inventory, Port
from plugin.core.node.rtnetlink import attributes, messages

_IFINFOMSG = struct.Struct("=BxHiII")  # family, device type, ifindex, flags, change mask
RTM_NEWLINK = 16
IFLA_IFNAME = 3
IFF_UP = 0x1
IFF_LOWER_UP = 0x10000
DOWN = "DOWN"


def carrier_changes(data: bytes) -> dict[str, bool]:
    """netdev -> has carrier (administratively up and lower layer up), for every RTM_NEWLINK
    in one rtnetlink datagram; a later message about the same netdev wins. Other messages
    (addresses, deleted links) and truncated ones are skipped: a scan follows every event."""
    changes: dict[str, bool] = {}
    for kind, body, end in messages(data):
        if kind != RTM_NEWLINK or body + _IFINFOMSG.size > end:
            continue
        flags = _IFINFOMSG.unpack_from(data, body)[3]
        for attr_type, payload in attributes(data, body + _IFINFOMSG.size, end):
            if attr_type == IFLA_IFNAME:
                name = payload.split(b"\0", 1)[0].decode(errors="replace")
                changes[name] = flags & (IFF_UP | IFF_LOWER_UP) == (IFF_UP | IFF_LOWER_UP)
                break
    return changes


def without_carrier(inventory: Inventory, down: frozenset[str]) -> Inventory:
    """`inventory` with every port whose netdevs are all in `down` marked DOWN. Ports without
    a netdev (InfiniBand without IPoIB) keep the state the kernel reported."""
    if not down:
        return inventory

    def port(p: Port) -> Port:
        if p.netdevs and down.issuperset(p.netdevs) and p.state != DOWN:
            return dataclasses.replace(p, state=DOWN)
        return p

    hcas = tuple(dataclasses.replace(h, ports=tuple(map(port, h.ports))) for h in inventory.hcas)
    return dataclasses.replace(inventory, hcas=hcas)
