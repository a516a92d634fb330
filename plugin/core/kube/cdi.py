"""CDI (Container Device Interface) specs: what a container runtime injects for a CDI device
ID, written as one JSON file per owner (a claim) into the runtime's CDI dir. The same for
every front end."""

from __future__ import annotations

import errno
import json
import logging
import re
import stat
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any, cast

from common.userfiles import (
    UnreadableError,
    file_kind,
    read_text,
    remove_temps,
    shown,
    temp_of,
    why_not_made,
    why_not_writable,
    write_atomically,
)
from plugin.core.node.pools import CONTAINER_DEV, Allocation
from plugin.core.podnet.gidchoice import COMPUTED
from plugin.launch import HCAS_ENV

logger = logging.getLogger(__name__)

# The newest spec version these edits need is 0.3.0 (device nodes, env); 0.6.0 is what
# containerd 1.7 and 2.x all read. ACK's containerd 2.1 reads none newer than 1.0.0.
CDI_VERSION = "0.6.0"
# CDI's own grammar of a device name.
_CDI_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")


class CdiError(ValueError):
    """A spec that no runtime would read: said before it is written."""


def device_id(kind: str, name: str) -> str:
    """The fully qualified CDI device ID a runtime resolves: vendor.com/class=name."""
    return f"{kind}={name}"


def spec(kind: str, devices: Mapping[str, Allocation]) -> dict[str, object]:
    """A CDI spec of `kind` with one device per name: its device nodes and env."""
    for name in devices:
        if not _CDI_NAME.fullmatch(name):
            raise CdiError(f"{name!r} is not a CDI device name (letters, digits, _.:-)")
    return {
        "cdiVersion": CDI_VERSION,
        "kind": kind,
        "devices": [
            {
                "name": name,
                "containerEdits": {
                    "deviceNodes": [
                        {"path": d.container_path, "hostPath": d.host_path, "permissions": "rw"}
                        for d in allocation.devices
                    ],
                    "env": [f"{k}={v}" for k, v in sorted(allocation.envs.items())],
                },
            }
            for name, allocation in devices.items()
        ],
    }


def write_spec(cdi_dir: Path, file_name: str, content: Mapping[str, object]) -> None:
    """Written whole or not at all: a runtime may read the dir at any moment. CdiError naming
    the dir and why when it cannot be."""
    if (kind := other_kind(cdi_dir / file_name)) is not None:
        raise CdiError(
            f"--cdi-dir {cdi_dir}: {file_name} there is {kind}, not a spec: move it away"
        )
    try:
        cdi_dir.mkdir(parents=True, exist_ok=True)
        write_atomically(cdi_dir / file_name, json.dumps(content, indent=1, sort_keys=True))
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # no room, or no inode, left
            why = f"{exc.strerror}: free space in --cdi-dir"
        else:
            why = why_not_writable(cdi_dir) or exc.strerror or str(exc)
        raise CdiError(f"--cdi-dir {cdi_dir}: cannot write {file_name} there: {why}") from None


def dir_problem(cdi_dir: Path) -> str | None:
    """Why no spec can be written in `cdi_dir`, made if missing (as the runtime's often is on a
    new node): said at start, not at the first allocation that needs it."""
    try:
        if not cdi_dir.is_dir():
            cdi_dir.mkdir(parents=True)
            logger.info("--cdi-dir %s did not exist: made it", cdi_dir)
    except OSError as exc:
        return f"--cdi-dir {cdi_dir} {why_not_made(cdi_dir, exc)}"
    why = why_not_writable(cdi_dir)
    return None if why is None else f"--cdi-dir {cdi_dir} {why}"


def other_kind(path: Path) -> str | None:
    """What is at `path` when it is there but not a regular file (a directory, a FIFO, a
    symlink): never a spec of ours, never written over or removed."""
    try:
        mode = path.lstat().st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) else file_kind(mode)


# The character devices an allocation hands out (pool.allocation), by name.
_CHARDEV = re.compile(r"rdma_cm|(uverbs|umad|issm)[0-9]{1,4}")
# What a spec's env may set: the HCAs granted, NCCL's settings (DRA prepare), in visible ASCII.
_ENV = re.compile(
    "(" + "|".join(re.escape(k) for k in (HCAS_ENV, *COMPUTED)) + r")=[\x21-\x7e]{0,4096}"
)


def _is_device_node(node: Any, host_dir: Path) -> bool:
    """A device node as `spec` writes it: an RDMA character device of `host_dir`, at its place
    in the container, read-write (a disk there was not written by us)."""
    if not isinstance(node, dict) or set(cast(dict[str, Any], node)) != {
        "path", "hostPath", "permissions"
    }:  # fmt: skip
        return False
    named = cast(dict[str, Any], node)
    name = PurePosixPath(str(named["path"])).name
    return (
        _CHARDEV.fullmatch(name) is not None
        and named["path"] == str(CONTAINER_DEV / name)
        and named["hostPath"] == str(host_dir / name)
        and named["permissions"] == "rw"
    )


def is_ours(device: Any, name: str, host_dir: Path) -> bool:
    """Whether a spec's device is one `spec` writes for `name`: RDMA device nodes of `host_dir`
    and our env, nothing else (a mount of the host, LD_PRELOAD: someone else wrote it)."""
    if not isinstance(device, dict) or set(cast(dict[str, Any], device)) != {
        "name", "containerEdits"
    }:  # fmt: skip
        return False
    named = cast(dict[str, Any], device)
    edits = named["containerEdits"]
    if not isinstance(edits, dict) or set(cast(dict[str, Any], edits)) != {"deviceNodes", "env"}:
        return False
    nodes: Any = cast(dict[str, Any], edits)["deviceNodes"]
    env: Any = cast(dict[str, Any], edits)["env"]
    return (
        named["name"] == name
        and isinstance(nodes, list)
        and all(_is_device_node(n, host_dir) for n in cast(list[Any], nodes))
        and isinstance(env, list)
        and all(isinstance(e, str) and _ENV.fullmatch(e) for e in cast(list[Any], env))
    )


class SpecFile:
    """One spec file whose devices are added as they are handed out and kept: a runtime
    resolves a CDI device again whenever it re-creates a container (a restart in the pod), so a
    name given out must resolve for as long as the file exists, across restarts of ours too
    (the devices of the file found at start are kept, those `spec` writes only). A file at its
    name that is not a spec of ours is never overwritten: each allocation is refused, naming
    it, until it is moved."""

    def __init__(self, cdi_dir: Path, file_name: str, kind: str, dev_root: Path) -> None:
        self.cdi_dir = cdi_dir
        self.file_name = file_name
        self.kind = kind
        self.host_dir = dev_root / "infiniband"
        self._devices: dict[str, object] = {}
        why = dir_problem(cdi_dir)
        if why is None:  # what a write killed midway left of this file (its owner runs alone)
            remove_temps(cdi_dir, lambda name: temp_of(file_name, name))
        # in a dir that is not one (a symlink loop), the file's own problem says nothing more
        self.problem = self._load() if why is None else None
        for problem in (self.problem, why and f"{why}: CDI allocations fail"):
            if problem:
                logger.error("%s", problem)

    @property
    def path(self) -> Path:
        return self.cdi_dir / self.file_name

    def _load(self) -> str | None:
        """The devices of a spec of ours found at start, or why the file there is not one."""
        try:
            found: Any = json.loads(read_text(self.path))
            if not isinstance(found, dict) or cast(dict[str, Any], found).get("kind") != self.kind:
                return f"{self.path}: not a CDI spec of {self.kind}: move it away"
            entries = cast(list[dict[str, object]], found["devices"])
            named = {d["name"]: d for d in entries if isinstance(d["name"], str)}
            self._devices = {n: d for n, d in named.items() if is_ours(d, n, self.host_dir)}
            if dropped := [shown(d["name"]) for d in entries if d not in self._devices.values()]:
                logger.warning(  # and the file written without them now, not at the next use
                    "%s: devices not as this plugin writes them, removed from it: %s",
                    self.path, ", ".join(dropped[:10]) + (" ..." if len(dropped) > 10 else ""),
                )  # fmt: skip
                self._write()
        except CdiError as exc:  # the file could not be written without them
            return str(exc)
        except UnreadableError as exc:
            return None if exc.missing else f"{self.path}: {exc}: move it away"
        except (ValueError, KeyError, TypeError):
            return f"{self.path}: not a CDI spec of {self.kind}: move it away"
        return None

    def add(self, name: str, allocation: Allocation) -> str:
        """The device's fully qualified ID, its edits in the file first."""
        if self.problem is not None:
            raise CdiError(self.problem)
        (entry,) = cast(list[object], spec(self.kind, {name: allocation})["devices"])
        if self._devices.get(name) != entry:
            before = self._devices
            self._devices = {**before, name: entry}
            try:
                self._write()
            except CdiError:
                self._devices = before
                raise
        return device_id(self.kind, name)

    def _write(self) -> None:
        content = {"cdiVersion": CDI_VERSION, "kind": self.kind}
        write_spec(self.cdi_dir, self.file_name, {**content, "devices": [*self._devices.values()]})
