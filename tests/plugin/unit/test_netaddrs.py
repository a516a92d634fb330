"""Parsing an RTM_GETADDR dump (plugin/netaddrs.py) on messages built as the kernel lays them
out; the kernel's own dump is read in tests/plugin/integration/test_podenv.py."""

from __future__ import annotations

import ipaddress
import socket
import struct

from plugin.core.node.rtnetlink import NLMSG_DONE, NLMSGHDR
from plugin.core.podnet.netaddrs import (
    IFA_ADDRESS,
    IFA_F_TENTATIVE,
    IFA_FLAGS,
    IFA_LOCAL,
    RTM_NEWADDR,
    parse,
)


def _attr(kind: int, payload: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


def _msg(kind: int, body: bytes) -> bytes:
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), kind, 0, 1, 0) + body


def _addr(family: int, ifindex: int, *attrs: bytes, flags: int = 0) -> bytes:
    head = struct.pack("=BBBBI", family, 64, flags, 0, ifindex)
    return _msg(RTM_NEWADDR, head + b"".join(attrs))


def test_every_address_of_the_dump_with_its_interface() -> None:
    v6 = ipaddress.IPv6Address("fd77::10")
    v4 = ipaddress.IPv4Address("192.168.77.10")
    data = (
        _addr(socket.AF_INET6, 2, _attr(IFA_ADDRESS, v6.packed))
        + _addr(socket.AF_INET, 2, _attr(IFA_LOCAL, v4.packed), _attr(IFA_ADDRESS, v4.packed))
        + _msg(NLMSG_DONE, b"\0" * 4)
    )

    assert parse(data) == [(2, v6), (2, v4)]


def test_the_local_address_of_a_point_to_point_link_not_its_peer() -> None:
    local, peer = ipaddress.IPv4Address("10.1.0.1"), ipaddress.IPv4Address("10.1.0.2")
    data = _addr(socket.AF_INET, 3, _attr(IFA_ADDRESS, peer.packed), _attr(IFA_LOCAL, local.packed))

    assert parse(data) == [(3, local)]


def test_a_tentative_address_is_not_usable_yet() -> None:
    v6 = ipaddress.IPv6Address("fd77::10").packed
    in_header = _addr(socket.AF_INET6, 2, _attr(IFA_ADDRESS, v6), flags=IFA_F_TENTATIVE)
    in_attribute = _addr(
        socket.AF_INET6,
        2,
        _attr(IFA_ADDRESS, v6),
        _attr(IFA_FLAGS, struct.pack("=I", IFA_F_TENTATIVE)),
    )

    assert parse(in_header + in_attribute) == []


def test_a_truncated_message_ends_the_parse() -> None:
    v6 = ipaddress.IPv6Address("fd77::10")
    whole = _addr(socket.AF_INET6, 2, _attr(IFA_ADDRESS, v6.packed))

    assert parse(whole + whole[:-6]) == [(2, v6)]
