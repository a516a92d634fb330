"""Event sources, read on the event loop, each calling back whoever owns the state they concern:
the kernel's rtnetlink and RDMA uevents (the node's health) and inotify on the device-plugins
dir (the endpoints' sockets). They own their file descriptors and nothing else."""

from __future__ import annotations

import asyncio
import ctypes
import errno
import logging
import os
import socket
import struct
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

# how often DirWatcher looks again for a device-plugins dir that does not exist yet
_RETRY_START, _RETRY_MAX = 0.1, 5.0

# rtnetlink multicast groups: link up/down, and address changes (they change the GID table)
_RTMGRP_LINK, _RTMGRP_IPV4_IFADDR, _RTMGRP_IPV6_IFADDR = 0x1, 0x10, 0x100
_RTNETLINK = (socket.NETLINK_ROUTE, _RTMGRP_LINK | _RTMGRP_IPV4_IFADDR | _RTMGRP_IPV6_IFADDR)
# kernel uevents (group 1): an ibdev or its uverbs/umad node appearing or going away
_UEVENTS = (15, 1)  # NETLINK_KOBJECT_UEVENT


class KernelEvents:
    """rtnetlink link and address messages and RDMA uevents. `on_link` gets each rtnetlink
    datagram; `on_change` is called once per burst that may change what a scan reads;
    `on_overrun(rtnetlink)` when the kernel dropped messages (what they said is unknown)."""

    def __init__(
        self,
        on_link: Callable[[bytes], None],
        on_change: Callable[[], None],
        on_overrun: Callable[[bool], None],
    ) -> None:
        self.on_link = on_link
        self.on_change = on_change
        self.on_overrun = on_overrun

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        socks = [s for s in (_netlink_socket(*_RTNETLINK), _netlink_socket(*_UEVENTS)) if s]
        for sock in socks:
            loop.add_reader(sock.fileno(), self._read, sock)
        try:
            await asyncio.Event().wait()  # until cancelled
        finally:
            for sock in socks:
                loop.remove_reader(sock.fileno())
                sock.close()

    def _read(self, sock: socket.socket) -> None:
        rtnetlink = sock.proto == socket.NETLINK_ROUTE
        relevant = rtnetlink
        try:
            while data := sock.recv(65536):
                if rtnetlink:
                    self.on_link(data)
                relevant = relevant or b"SUBSYSTEM=infiniband" in data  # uevents: RDMA only
        except BlockingIOError:
            pass
        except OSError as exc:
            if exc.errno != errno.ENOBUFS:
                raise
            logger.warning("netlink socket overran (protocol %d); re-scanning", sock.proto)
            self.on_overrun(rtnetlink)
            relevant = True
        if relevant:
            self.on_change()


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


class DirWatcher:
    """inotify on the device-plugins dir: calls `on_change(name)` when a file appears or goes
    away there (kubelet.sock re-created, our socket deleted); re-arms if the dir is re-created.
    Renames count too: the kubelet rewrites its checkpoint through temp files, which only costs
    the endpoints a look at their state."""

    _IN_CREATE, _IN_DELETE, _IN_MOVED_TO, _IN_MOVED_FROM = 0x100, 0x200, 0x80, 0x40
    _IN_DELETE_SELF, _IN_MOVE_SELF, _IN_IGNORED = 0x400, 0x800, 0x8000

    def __init__(self, directory: Path, on_change: Callable[[str], None]) -> None:
        self.directory = directory
        self.on_change = on_change
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = -1

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self._fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        lost = asyncio.Event()
        loop.add_reader(self._fd, self._read, lost)
        try:
            while True:
                await self._arm()
                await lost.wait()
                lost.clear()
                self.on_change(str(self.directory))  # the dir came back: all in it is new
        finally:
            loop.remove_reader(self._fd)
            os.close(self._fd)

    async def _arm(self) -> None:
        mask = (
            self._IN_CREATE
            | self._IN_DELETE
            | self._IN_MOVED_TO
            | self._IN_MOVED_FROM
            | self._IN_DELETE_SELF
            | self._IN_MOVE_SELF
        )
        backoff = _RETRY_START
        said = None
        while self._libc.inotify_add_watch(self._fd, bytes(self.directory), mask) < 0:
            why = os.strerror(ctypes.get_errno())  # e.g. no such dir, or the inotify watch limit
            logger.log(
                logging.DEBUG if why == said else logging.WARNING,
                "cannot watch %s (%s): looking again in %.1fs",
                self.directory,
                why,
                backoff,
            )
            said = why
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _RETRY_MAX)

    def _read(self, lost: asyncio.Event) -> None:
        try:
            data = os.read(self._fd, 65536)
        except BlockingIOError:
            return
        offset = 0
        while offset + 16 <= len(data):
            _wd, mask, _cookie, length = struct.unpack_from("iIII", data, offset)
            name = os.fsdecode(data[offset + 16 : offset + 16 + length].rstrip(b"\0"))
            offset += 16 + length
            if mask & (self._IN_DELETE_SELF | self._IN_MOVE_SELF | self._IN_IGNORED):
                lost.set()
            else:
                self.on_change(name)
