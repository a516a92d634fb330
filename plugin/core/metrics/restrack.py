"""Who holds the node's queue pairs: the kernel's RDMA resource tracking over rdma netlink
(RDMA_NLDEV_CMD_RES_QP_GET, what `rdma res show qp` reads), each QP with its device, port and
the pid that created it. Pids are the caller's pid namespace's: only the host's sees the QPs of
every pod (the DaemonSet's hostPID). Any driver tracks them: rxe and mlx5 alike."""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass

NETLINK_RDMA = 20
_NLDEV = 5  # RDMA_NL_NLDEV: the message type is the client << 10 | its command
_CMD_GET = 1
_CMD_RES_QP_GET = 10
# enum rdma_nldev_attr (include/uapi/rdma/rdma_netlink.h: ABI, never renumbered)
_DEV_INDEX, _DEV_NAME, _PORT_INDEX = 1, 2, 3
_RES_QP, _RES_QP_ENTRY, _RES_LQPN, _RES_PID = 19, 20, 21, 28
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED and NLA_F_NET_BYTEORDER
_HEADER = struct.Struct("=IHHII")
# The inode of the initial pid namespace (PROC_PID_INIT_INO), the one whose pids are the host's.
HOST_PID_NS_INODE = 0xEFFFFFFC
TIMEOUT = 2.0  # the kernel answers a dump at once; a bound, not a wait


class RestrackError(OSError):
    """rdma netlink could not be asked (no RDMA core, a refused or broken answer)."""


@dataclass(frozen=True)
class Qp:
    hca: str
    port: int | None  # None until the QP is bound to a port (state INIT)
    qpn: int
    pid: int | None  # None for a kernel QP (it carries a name instead)


def host_pid_namespace() -> bool:
    """Whether this process sees the host's pids (and so every pod's QPs)."""
    return os.stat("/proc/self/ns/pid").st_ino == HOST_PID_NS_INODE


def queue_pairs() -> list[Qp]:
    """Every QP of every RDMA device, as this pid namespace sees them. Blocking: a thread's
    work, or a scrape's (the kernel answers from memory)."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_RDMA) as sock:
        sock.settimeout(TIMEOUT)
        sock.bind((0, 0))
        devices: dict[int, str] = {}
        for attrs in _dump(sock, _CMD_GET, b"", seq=1):
            index, name = _u32(attrs.get(_DEV_INDEX)), _text(attrs.get(_DEV_NAME))
            if index is not None and name is not None:
                devices[index] = name
        qps: list[Qp] = []
        # The kernel dumps one device's resources per request (by its index).
        for seq, (index, name) in enumerate(sorted(devices.items()), start=2):
            request = _attr(_DEV_INDEX, struct.pack("=I", index))
            for attrs in _dump(sock, _CMD_RES_QP_GET, request, seq=seq):
                table = attrs.get(_RES_QP)
                for entry_type, entry in _attrs(table or b""):
                    if entry_type != _RES_QP_ENTRY:
                        continue
                    fields = dict(_attrs(entry))
                    qpn = _u32(fields.get(_RES_LQPN))
                    if qpn is not None:
                        port = _u32(fields.get(_PORT_INDEX))
                        qps.append(Qp(name, port, qpn, _u32(fields.get(_RES_PID))))
        return qps


def _dump(
    sock: socket.socket, command: int, payload: bytes, seq: int
) -> Iterator[dict[int, bytes]]:
    """Each answer's top-level attributes, until the dump is done."""
    kind = _NLDEV << 10 | command
    sock.send(_HEADER.pack(_HEADER.size + len(payload), kind, _NLM_F_REQUEST | _NLM_F_DUMP, seq, 0)
              + payload)  # fmt: skip
    while True:
        try:
            data = sock.recv(1 << 16)
        except TimeoutError:
            raise RestrackError(f"rdma netlink: no answer within {TIMEOUT:g}s") from None
        offset = 0
        while offset + _HEADER.size <= len(data):
            length, msg_type, _, msg_seq, _ = _HEADER.unpack_from(data, offset)
            if length < _HEADER.size or offset + length > len(data):
                raise RestrackError("rdma netlink: a truncated answer")
            body = data[offset + _HEADER.size : offset + length]
            offset += (length + 3) & ~3
            if msg_seq != seq:
                continue
            if msg_type == _NLMSG_DONE:
                return
            if msg_type == _NLMSG_ERROR:
                (code,) = struct.unpack_from("=i", body) if len(body) >= 4 else (-1,)
                if code == 0:
                    continue  # an acknowledgement
                raise RestrackError(f"rdma netlink: {os.strerror(-code)}")
            if msg_type == kind:
                yield dict(_attrs(body))


def _attrs(data: bytes) -> Iterator[tuple[int, bytes]]:
    """A netlink attribute stream: (type, payload), each padded to 4 bytes."""
    offset = 0
    while offset + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, offset)
        if length < 4 or offset + length > len(data):
            return  # malformed: the rest is not trusted
        yield kind & _NLA_TYPE_MASK, data[offset + 4 : offset + length]
        offset += (length + 3) & ~3


def _attr(kind: int, payload: bytes) -> bytes:
    data = struct.pack("=HH", 4 + len(payload), kind) + payload
    return data + b"\0" * (-len(data) % 4)


def _u32(payload: bytes | None) -> int | None:
    return struct.unpack("=I", payload)[0] if payload is not None and len(payload) == 4 else None


def _text(payload: bytes | None) -> str | None:
    if payload is None:
        return None
    return payload.split(b"\0", 1)[0].decode("ascii", "replace") or None
