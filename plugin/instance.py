"""One plugin instance per kubelet dir on a node: a second one waits instead of taking the first
one's socket (the two would otherwise re-register in turn without end).

The lock is a listening unix socket in the abstract namespace, named after the device-plugins
dir: it needs no file (the kubelet deletes what it finds in that dir when it starts), goes with
the process however it ends, and tells a waiter who holds it (SO_PEERCRED).
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import socket
import struct
import time
from pathlib import Path

logger = logging.getLogger(__name__)

_UCRED = struct.Struct("3i")  # pid, uid, gid


class LockError(RuntimeError):
    """The lock cannot be taken for a reason other than another instance holding it."""


def _name(plugin_dir: Path) -> bytes:
    # A digest of the resolved path: one dir however it is spelt (a symlink to it, a trailing
    # slash), and a name of fixed length (an abstract address has sockaddr_un's 108 bytes too).
    digest = hashlib.sha256(os.fsencode(plugin_dir.resolve())).hexdigest()[:32]
    return b"\0lingjun-rdma-plugin:" + digest.encode()


def holder(plugin_dir: Path) -> int | None:
    """The pid of the instance that serves `plugin_dir`, or None when there is none."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(_name(plugin_dir))
        except OSError:
            return None
        pid, _, _ = _UCRED.unpack(probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        return int(pid)


def acquire(plugin_dir: Path, poll: float = 1.0) -> socket.socket:
    """Hold the lock of `plugin_dir` (waiting while another instance holds it); keep the
    returned socket open for as long as this process serves."""
    waiting_for: int | None = None
    while True:
        lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            lock.bind(_name(plugin_dir))
        except OSError as exc:
            lock.close()
            if exc.errno != errno.EADDRINUSE:
                raise LockError(
                    f"{plugin_dir}: cannot take its one-instance lock ({exc.strerror})"
                ) from None
            other = holder(plugin_dir)
            if other is not None and other != waiting_for:
                logger.warning(
                    "another rdma-device-plugin (pid %d) serves %s: waiting for it to stop "
                    "(two instances would take each other's socket)",
                    other,
                    plugin_dir,
                )
                waiting_for = other
            time.sleep(poll)
            continue
        lock.listen(8)
        if waiting_for is not None:
            logger.info("pid %d stopped: serving %s", waiting_for, plugin_dir)
        return lock
