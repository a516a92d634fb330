"""rtnetlink wire format, pure: the messages of a datagram and the attributes of a message."""

from __future__ import annotations

import struct
from collections.abc import Iterator

NLMSGHDR = struct.Struct("=IHHII")  # length, type, flags, seq, pid
RTATTR = struct.Struct("=HH")  # length, type
NLMSG_DONE = 3
NLMSG_ERROR = 2


def _align(n: int) -> int:
    return (n + 3) & ~3


def messages(data: bytes) -> Iterator[tuple[int, int, int]]:
    """(type, body start, end) of each whole message in a datagram; a truncated one ends it."""
    offset = 0
    while offset + NLMSGHDR.size <= len(data):
        length, kind, _, _, _ = NLMSGHDR.unpack_from(data, offset)
        if length < NLMSGHDR.size or offset + length > len(data):
            return
        yield kind, offset + NLMSGHDR.size, offset + length
        offset += _align(length)


def attributes(data: bytes, start: int, end: int) -> Iterator[tuple[int, bytes]]:
    """(type, payload) of each attribute between start and end; a malformed one ends it."""
    while start + RTATTR.size <= end:
        length, kind = RTATTR.unpack_from(data, start)
        if length < RTATTR.size or start + length > end:
            return
        yield kind, data[start + RTATTR.size : start + length]
        start += _align(length)
