"""Unix sockets for grpc, the same for every front end: the address grpc is given, the channel
options, and what a plain bind or connect says where grpc's own errors say nothing."""

from __future__ import annotations

import socket
import stat
from pathlib import Path
from urllib.parse import quote

from common.userfiles import file_kind, why_not_writable

# A fresh subchannel per channel: grpc-python otherwise shares subchannels between channels to
# the same address, and one that failed while its peer restarted answers from its reconnect
# backoff (seconds) instead of dialing the new socket.
CHANNEL_OPTIONS = [("grpc.default_authority", "localhost"), ("grpc.use_local_subchannel_pool", 1)]


def grpc_target(path: Path) -> str:
    """`path` as grpc's address: grpc percent-decodes it (a dir named `a%20b` is `a b` to it)."""
    return "unix://" + quote(str(path), safe="/")


def bind_problem(path: Path) -> str | None:
    """Why a unix socket cannot be bound at `path`, from the same bind made plainly (grpc says
    only "Failed to bind"); None when it can."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(str(path))
        except OSError as exc:
            where = why_not_writable(path.parent)
            if where is not None:
                return f"{path.parent} {where}"
            return f"a socket cannot be made there ({exc.strerror})"
    path.unlink(missing_ok=True)
    return None


def clear_stale_socket(path: Path) -> None:
    """`path` freed of a socket a previous server left; anything else there is someone's, and
    stays: OSError saying so."""
    try:
        mode = path.lstat().st_mode
    except OSError:
        return
    if not stat.S_ISSOCK(mode):
        raise OSError(
            f"{path} is {file_kind(mode)}, not our socket: move it away (only a socket there "
            "is replaced)"
        )
    path.unlink(missing_ok=True)


def connect_error(path: Path) -> str:
    """What a plain connect to `path` meets (non-blocking: a unix connect answers at once)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.setblocking(False)
        try:
            probe.connect(str(path))
        except BlockingIOError:
            return "has a full accept queue (its server is not accepting connections)"
        except ConnectionRefusedError:
            return "refuses connections: nothing listens on it (a server that stopped left it)"
        except OSError as exc:
            return f"cannot be connected to ({exc.strerror})"
    return "accepts connections, but grpc's connection failed"


# Which file is at a path: its inode and when it was made (a socket's mtime is its bind's: no
# rename or link changes it). A file made again there often gets the same inode number back
# (ext4 gives a freed one out at once): the time tells them apart.
FileId = tuple[int, int]


def file_id(path: Path) -> FileId | None:
    """Which socket file is at `path` now, or None."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns
