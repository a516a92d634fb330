"""The claims this driver has prepared on the node: one small file per claim, made durable
before the kubelet hears "prepared" and removed only after the claim's CDI spec, so that what
the kubelet was told always outlives a crash or a reboot. A file per claim keeps a prepare's
cost the same however many claims the node holds.

What is recorded is only which claim (UID, namespace, name): nothing of a record is handed out
again on its own say, every prepare is made afresh from the API server and the node. The records
tell a restart which CDI specs of ours are live: one no record owns was written by a prepare
that was never answered, and is removed."""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from common.secret import masked
from common.userfiles import (
    TEMP_MARK,
    UnreadableError,
    read_text,
    remove_temps,
    shown,
    sync_dir,
    write_atomically,
)

logger = logging.getLogger(__name__)

# What Kubernetes allows in a namespace (a DNS label), a claim's name (a DNS subdomain) and a
# UID. They reach API paths and file names: anything else from a peer (`../`, a line break) is
# refused, never used.
LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
UID = re.compile(r"[A-Za-z0-9-]{1,128}")
# A record is a few hundred bytes; anything larger is not one.
_RECORD_MAX_BYTES = 4096
# The single-file checkpoint of earlier versions, read once into records and removed.
LEGACY = "checkpoint.json"


class ClaimNameError(ValueError):
    """A claim named as Kubernetes never names one (said, never used)."""


def _checked(what: str, value: str, form: re.Pattern[str], kind: str) -> None:
    if not form.fullmatch(value):
        raise ClaimNameError(f"the kubelet's {what} {shown(value)} is not {kind}: not used")
    if masked(value) != value:  # it would reach file names, CDI IDs and the records
        raise ClaimNameError(f"the kubelet's {what} holds the driver's API token: not used")


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it, checked: each part is one Kubernetes allows."""

    namespace: str
    uid: str
    name: str

    def __post_init__(self) -> None:
        _checked("claim namespace", self.namespace, LABEL, "a namespace (a DNS label)")
        _checked("claim UID", self.uid, UID, "a UID")
        _checked("claim name", self.name, SUBDOMAIN, "a name (a DNS subdomain)")

    @property
    def named(self) -> str:
        return f"{self.namespace}/{self.name}"


class Checkpoint:
    """The records in `directory` (the driver's own, under its lock): the only writer."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.claims: dict[str, ClaimRef] = {}

    def _path(self, uid: str) -> Path:
        return self.directory / f"{uid}.json"

    def load(self) -> dict[str, ClaimRef]:
        """The claims recorded, after removing what a write killed midway left (temp files)
        and reading an earlier version's single file into records."""
        self.directory.mkdir(parents=True, exist_ok=True)
        remove_temps(self.directory, lambda name: name.startswith(".") and TEMP_MARK in name)
        claims: dict[str, ClaimRef] = {}
        for entry in os.scandir(self.directory):
            uid = entry.name.removesuffix(".json")
            if entry.name.startswith(".") or uid == entry.name:
                continue
            try:
                claims[uid] = _record(uid, read_text(Path(entry.path), _RECORD_MAX_BYTES))
            except (UnreadableError, ValueError, RecursionError) as exc:
                logger.warning(
                    "checkpoint %s: %s is not a record of this driver (%s): left as is, its "
                    "claim is not counted as prepared", self.directory, shown(entry.name), exc,
                )  # fmt: skip
        self.claims = claims
        self._migrate(self.directory.parent / LEGACY)
        return dict(self.claims)

    def _migrate(self, legacy: Path) -> None:
        """Each claim of an earlier version's checkpoint becomes a record; the file goes."""
        try:
            doc: Any = json.loads(read_text(legacy, 64 << 20))
            listed = cast(dict[str, Any], doc["claims"])
            found = [ClaimRef(e["namespace"], u, e["name"]) for u, e in listed.items()]
        except UnreadableError as exc:
            if exc.missing:
                return
            found, why = [], str(exc)
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            found, why = [], f"not a checkpoint of this driver ({type(exc).__name__})"
        else:
            why = ""
        for claim in found:
            self.add(claim)
        try:
            legacy.unlink()
        except OSError as exc:
            logger.error("%s cannot be removed (%s)%s: move it away", legacy,
                         exc.strerror or exc, f", nor read ({why})" if why else "")  # fmt: skip
            return
        if why:
            logger.error("%s cannot be read (%s): removed; its claims are prepared again when "
                         "the kubelet asks", legacy, why)  # fmt: skip
        else:
            logger.info("%s: its %d claims moved into %s", legacy, len(found), self.directory)

    def add(self, claim: ClaimRef) -> None:
        """The claim recorded, durably once this returns."""
        if self.claims.get(claim.uid) == claim:
            return
        record = {"namespace": claim.namespace, "name": claim.name, "uid": claim.uid}
        write_atomically(self._path(claim.uid), json.dumps(record))
        self.claims[claim.uid] = claim

    def remove(self, uid: str) -> None:
        """The claim no longer recorded, durably once this returns (an unlink needs no room)."""
        self._path(uid).unlink(missing_ok=True)
        sync_dir(self.directory)
        self.claims.pop(uid, None)


def _record(uid: str, text: str) -> ClaimRef:
    doc: Any = json.loads(text)
    if not isinstance(doc, dict) or set(cast(dict[str, Any], doc)) != {"namespace", "name", "uid"}:
        raise ValueError("not a record of this shape")
    fields = cast(dict[str, Any], doc)
    if fields["uid"] != uid or not all(isinstance(v, str) for v in fields.values()):
        raise ValueError("its UID is not its file's name")
    return ClaimRef(fields["namespace"], uid, fields["name"])
