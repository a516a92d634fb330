"""CDI (Container Device Interface) specs: what a container runtime injects for a CDI device
ID, written as one JSON file per owner (a claim) into the runtime's CDI dir. The same for
every front end."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from plugin.core.pool import Allocation
from plugin.core.userfiles import UnreadableError, read_text, why_not_writable, write_atomically

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
    try:
        cdi_dir.mkdir(parents=True, exist_ok=True)
        write_atomically(cdi_dir / file_name, json.dumps(content, indent=1, sort_keys=True))
    except OSError as exc:
        why = why_not_writable(cdi_dir) or exc.strerror or str(exc)
        raise CdiError(f"--cdi-dir {cdi_dir}: cannot write {file_name} there: {why}") from None


class SpecFile:
    """One spec file whose devices are added as they are handed out and kept: a runtime
    resolves a CDI device again whenever it re-creates a container (a restart in the pod), so a
    name given out must resolve for as long as the file exists, across restarts of ours too
    (the devices of the file found at start are kept). A file at its name that is not a spec
    of ours is never overwritten: each allocation is refused, naming it, until it is moved."""

    def __init__(self, cdi_dir: Path, file_name: str, kind: str) -> None:
        self.cdi_dir = cdi_dir
        self.file_name = file_name
        self.kind = kind
        self._devices: dict[str, object] = {}
        self.problem = self._load()
        why = why_not_writable(cdi_dir) if cdi_dir.exists() else None
        for problem in (self.problem, why and f"--cdi-dir {cdi_dir} {why}: CDI allocations fail"):
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
            self._devices = {cast(str, d["name"]): d for d in entries}
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
            devices = {**self._devices, name: entry}
            content = {"cdiVersion": CDI_VERSION, "kind": self.kind}
            write_spec(self.cdi_dir, self.file_name, {**content, "devices": [*devices.values()]})
            self._devices = devices
        return device_id(self.kind, name)
