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
import threading
import time
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path

logger = logging.getLogger(__name__)

_UCRED = struct.Struct("3i")  # pid, uid, gid


class LockError(RuntimeError):
    """The lock cannot be taken for a reason other than another instance holding it."""


def _name(plugin_dir: Path) -> bytes:
    # A digest of the resolved path: one dir however it is spelt (a symlink to it, a trailing
    # slash), and a name of fixed length (an abstract address has sockaddr_un's 108 bytes too).
    try:
        resolved = plugin_dir.resolve()
    except (OSError, RuntimeError):  # RuntimeError: Python before 3.13, for a loop
        raise LockError(f"{plugin_dir} is a symbolic link loop: name a directory") from None
    digest = hashlib.sha256(os.fsencode(resolved)).hexdigest()[:32]
    return b"\0lingjun-rdma-plugin:" + digest.encode()


def holder(plugin_dir: Path) -> int | None:
    """The pid of the instance that serves `plugin_dir`, or None when there is none (or it
    cannot be asked: the connect is bounded)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(_name(plugin_dir))
        except OSError:
            return None
        pid, _, _ = _UCRED.unpack(probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        return int(pid)


@contextmanager
def held(plugin_dir: Path) -> Generator[None]:
    """The lock of `plugin_dir`, held for the block (waiting first while another holds it)."""
    lock = _acquire(plugin_dir)
    try:
        yield
    finally:
        lock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept; close alone would not
        lock.close()


def _acquire(plugin_dir: Path, poll: float = 1.0) -> socket.socket:
    """The lock of `plugin_dir`, once no other instance holds it."""
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
            if other is None and waiting_for is None:
                logger.warning(
                    "another instance of this program holds %s (it does not say its pid yet): "
                    "waiting "
                    "for it to stop",
                    plugin_dir,
                )
                waiting_for = 0
            elif other is not None and other != waiting_for:
                logger.warning(
                    "another instance of this program (pid %d) serves %s: waiting for it to stop "
                    "(two instances would take each other's socket)",
                    other,
                    plugin_dir,
                )
                waiting_for = other
            time.sleep(poll)
            continue
        # Room for many waiters' questions while the accepting thread waits for its turn (a
        # loaded node can keep it from running for seconds)
        lock.listen(128)
        # Each waiter asks who holds the lock by connecting: accept and drop those connections,
        # or once the backlog is full the next waiter's connect blocks for good.
        threading.Thread(target=_answer, args=(lock,), name="instance-lock", daemon=True).start()
        if waiting_for is not None:
            other = f"pid {waiting_for}" if waiting_for else "the other instance"
            logger.info("%s stopped: serving %s", other, plugin_dir)
        return lock


def _answer(lock: socket.socket) -> None:
    """Accept and close every connection to the lock until it is closed."""
    while True:
        try:
            conn, _ = lock.accept()
        except OSError:  # the lock was closed: this process no longer serves
            return
        conn.close()
