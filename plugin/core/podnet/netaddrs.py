"""The addresses of the caller's own network namespace, from an rtnetlink dump (RTM_GETADDR):
what the process sees, whichever namespace it was started in."""

from __future__ import annotations

import ipaddress
import socket
import struct

from plugin.core.node.rtnetlink import NLMSG_DONE, NLMSG_ERROR, NLMSGHDR, attributes, messages
from plugin.core.podnet.gidchoice import NsAddress

_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefix length, flags, scope, ifindex
RTM_NEWADDR = 20
RTM_GETADDR = 22
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300
IFA_ADDRESS = 1
IFA_LOCAL = 2
IFA_FLAGS = 8
# An address the kernel will not use as a source: duplicate detection failed or not done yet.
IFA_F_DADFAILED = 0x08
IFA_F_TENTATIVE = 0x40


def parse(data: bytes) -> list[tuple[int, ipaddress.IPv4Address | ipaddress.IPv6Address]]:
    """(ifindex, address) of each usable RTM_NEWADDR in a datagram of the dump."""
    found: list[tuple[int, ipaddress.IPv4Address | ipaddress.IPv6Address]] = []
    for kind, body, end in messages(data):
        if kind != RTM_NEWADDR or body + _IFADDRMSG.size > end:
            continue
        family, _, flags, _, ifindex = _IFADDRMSG.unpack_from(data, body)
        attrs = dict(attributes(data, body + _IFADDRMSG.size, end))
        if IFA_FLAGS in attrs:  # the 32-bit flags, when the kernel sends them
            flags = struct.unpack("=I", attrs[IFA_FLAGS][:4])[0]
        raw = attrs.get(IFA_LOCAL) or attrs.get(IFA_ADDRESS)  # LOCAL: ours on a p2p link
        if raw is None or flags & (IFA_F_DADFAILED | IFA_F_TENTATIVE):
            continue
        if family == socket.AF_INET and len(raw) == 4:
            found.append((ifindex, ipaddress.IPv4Address(raw)))
        elif family == socket.AF_INET6 and len(raw) == 16:
            found.append((ifindex, ipaddress.IPv6Address(raw)))
    return found


def _done(data: bytes) -> bool:
    return any(kind in (NLMSG_DONE, NLMSG_ERROR) for kind, _, _ in messages(data))


def namespace_addresses() -> list[NsAddress]:
    """Every usable address of this process's network namespace, with its interface name."""
    request = NLMSGHDR.pack(
        NLMSGHDR.size + _IFADDRMSG.size, RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP, 1, 0
    ) + _IFADDRMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
    found: list[tuple[int, ipaddress.IPv4Address | ipaddress.IPv6Address]] = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
        sock.bind((0, 0))  # the kernel picks the port id
        sock.sendall(request)
        while True:
            data = sock.recv(65536)
            found += parse(data)
            if not data or _done(data):
                break
    names = {index: name for index, name in socket.if_nameindex()}
    return [NsAddress(names.get(index, f"if{index}"), ip) for index, ip in found]
