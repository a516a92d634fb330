"""Prepare and unprepare: a claim's allocation for this driver and node becomes a CDI spec in
the runtime's CDI dir, and the CDI device IDs the kubelet hands the runtime. The only writer of
the CDI specs and of the checkpoint that outlives a driver restart and a node reboot (the CDI
dir, /var/run/cdi, is a tmpfs: a claim prepared before a reboot gets its spec again).

A claim whose pods are all on the host network also gets NCCL's settings in its spec: their
GIDs are the host's, which the driver (itself on the host network) sees at prepare time. A pod
off the host network gets its own from `plugin.podenv` in its namespace."""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

from plugin.core import cdi
from plugin.core import pool as policy
from plugin.core.discovery.model import Hca
from plugin.core.gidchoice import NoGidError, choose
from plugin.core.kubeapi import KubeApi, KubeApiError
from plugin.core.netaddrs import namespace_addresses
from plugin.core.secret import masked
from plugin.core.userfiles import (
    UnreadableError,
    described,
    read_text,
    shown,
    why_not_writable,
    write_atomically,
)
from plugin.dra.devices import SliceDevice, slice_devices
from plugin.launch import HCAS_ENV, family_for

logger = logging.getLogger(__name__)

CHECKPOINT_VERSION = 1
# A node's prepared claims (about 1 KB each): room for tens of thousands.
CHECKPOINT_MAX_BYTES = 64 << 20


class PrepareError(RuntimeError):
    """Why a claim cannot be prepared (or unprepared) now; the kubelet retries."""


# What Kubernetes allows in a namespace (a DNS label), a claim's or a pod's name (a DNS
# subdomain) and a UID. They reach API paths and file names: anything else from a peer (`../`,
# a line break) is refused, never used.
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
_UID = re.compile(r"[A-Za-z0-9-]{1,128}")
# A request's name in an allocation result: a DNS label, or <request>/<subrequest>.
_REQUEST = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(/[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)?")
# How long the pods a claim is reserved for are read, in all (up to 256 of them, each read
# bounded on its own): past it the claim gets no NCCL settings, its pods' podenv has them, and
# the node's other prepares, which wait on this one, go on.
POD_READS_WITHIN = 5.0


def _checked(what: str, value: str, form: re.Pattern[str], kind: str) -> None:
    if not form.fullmatch(value):
        raise PrepareError(f"the kubelet's {what} {shown(value)} is not {kind}: not used")
    if masked(value) != value:  # it would reach file names, CDI IDs and the checkpoint
        raise PrepareError(f"the kubelet's {what} holds the driver's API token: not used")


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it, checked: each part is one Kubernetes allows."""

    namespace: str
    uid: str
    name: str

    def __post_init__(self) -> None:
        _checked("claim namespace", self.namespace, _LABEL, "a namespace (a DNS label)")
        _checked("claim UID", self.uid, _UID, "a UID")
        _checked("claim name", self.name, _SUBDOMAIN, "a name (a DNS subdomain)")


@dataclass(frozen=True)
class PreparedDevice:
    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]


@dataclass(frozen=True)
class Prepared:
    """One prepared claim, as checkpointed: enough to answer again and to write its spec."""

    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]
    spec: dict[str, Any] = field(default_factory=dict[str, Any])


class CheckpointError(OSError):
    """The checkpoint could not be written: the message names it, why, the fix and the claims
    the request did not change."""


def spec_file(driver: str, uid: str) -> str:
    return f"{driver}-{uid}.json"


class Preparer:
    def __init__(
        self,
        api: KubeApi,
        driver: str,
        node: str,
        cdi_kind: str,
        cdi_dir: Path,
        checkpoint: Path,
        dev_root: Path,
    ) -> None:
        self.api = api
        self.driver = driver
        self.node = node
        self.cdi_kind = cdi_kind
        self.cdi_dir = cdi_dir
        self.checkpoint = checkpoint
        self.dev_root = dev_root
        self._views: dict[str, policy.PoolView] = {}
        self._devices: dict[str, SliceDevice] = {}
        self.claims: dict[str, Prepared] = load_checkpoint(checkpoint, cdi_kind, dev_root)
        # read back, not yet compared with what prepare would write for them on this node now
        self._unchecked = set(self.claims)
        self._unsaved = False
        # what this request prepared and unprepared (verb, claim, uid, devices), logged once saved
        self._said: list[tuple[str, str, str, str]] = []
        # the entries this request's prepares replaced (None: the claim was new), until saved
        self._before: dict[str, Prepared | None] = {}

    def update(self, views: Sequence[policy.PoolView]) -> list[SliceDevice]:
        """The node's state after a scan; the devices it publishes now. Views that are the
        last ones (a scan that changed nothing keeps them) give the last devices: at the top
        of maxAllocations, making them again took 0.2 s of every scan."""
        if len(views) == len(self._views) and all(self._views.get(v.pool.name) is v for v in views):
            return list(self._devices.values())
        devices, skipped = slice_devices(views)
        for reason in skipped:
            logger.warning("%s", reason)
        self._views = {v.pool.name: v for v in views}
        self._devices = {d.name: d for d in devices}
        return devices

    def prepare(self, claim: ClaimRef) -> tuple[PreparedDevice, ...]:
        """Idempotent: a claim prepared before (by this run or one before a restart or a
        reboot) gets the same answer, and its spec written again if it is gone. The checkpoint
        is written by `save`, once per request of the kubelet, before it is answered."""
        done = self.claims.get(claim.uid)
        if (
            done is None
            or claim.uid in self._unchecked
            or (done.namespace, done.name) != (claim.namespace, claim.name)  # read it as named
        ):
            # a read-back entry is used only if it is what prepare writes for the claim now,
            # from the API's allocation and the node's state, never on its own say
            fresh = self._fresh(claim, self._claim(claim))
            if fresh != done and done is not None:
                logger.warning(
                    "checkpoint %s: claim %s/%s (%s) is not what this driver writes for it on "
                    "this node now (an HCA's health or its pods' network changed since, or the "
                    "entry is forged): prepared afresh", self.checkpoint, claim.namespace,
                    claim.name, claim.uid,
                )  # fmt: skip
        else:
            fresh = done
        self._write_spec(claim.uid, fresh)  # first: a claim whose spec is not there is not kept
        self._unchecked.discard(claim.uid)
        if fresh != done:
            devices = ", ".join(d.device_name for d in fresh.devices)
            self._said.append(("prepared", f"{claim.namespace}/{claim.name}", claim.uid, devices))
            self._before.setdefault(claim.uid, done)
            self.claims[claim.uid] = fresh
            self._unsaved = True
        return fresh.devices

    def _write_spec(self, uid: str, prepared: Prepared) -> None:
        """The claim's spec in the CDI dir, unless it is there as it should be."""
        name = spec_file(self.driver, uid)
        found = _spec_there(self.cdi_dir / name)
        if found == prepared.spec:
            return
        if found is not None and found.get("kind") != self.cdi_kind:
            raise PrepareError(  # never overwritten: it is not a spec of ours
                f"--cdi-dir {self.cdi_dir}: {name} there is not a CDI spec of {self.cdi_kind}: "
                "move it away"
            )
        try:  # gone, or ours but stale; a directory or a FIFO there is said by the write
            cdi.write_spec(self.cdi_dir, name, prepared.spec)
        except cdi.CdiError as exc:
            raise PrepareError(str(exc)) from None

    def unprepare(self, claim: ClaimRef) -> None:
        """Idempotent: an unknown claim is already unprepared. Only a spec of ours is removed."""
        name = spec_file(self.driver, claim.uid)
        found = _spec_there(self.cdi_dir / name)
        if (kind := cdi.other_kind(self.cdi_dir / name)) is not None:
            logger.warning("--cdi-dir %s: %s there is %s, not a spec: kept", self.cdi_dir, name,
                           kind)  # fmt: skip
        elif found is not None and found.get("kind") != self.cdi_kind:
            logger.warning("--cdi-dir %s: %s there is not a CDI spec of %s: kept", self.cdi_dir,
                           name, self.cdi_kind)  # fmt: skip
        else:
            try:
                (self.cdi_dir / name).unlink(missing_ok=True)
            except OSError as exc:  # the claim stays prepared: the kubelet asks again
                why = why_not_writable(self.cdi_dir) or exc.strerror or str(exc)
                raise PrepareError(
                    f"--cdi-dir {self.cdi_dir}: cannot remove {name} there: {why}"
                ) from None
        self._unchecked.discard(claim.uid)
        if self.claims.pop(claim.uid, None) is not None:
            self._unsaved = True
            self._said.append(("unprepared", f"{claim.namespace}/{claim.name}", claim.uid, ""))

    def save(self) -> None:
        """The checkpoint, when a prepare or unprepare changed the claims: written whole once
        per request (per claim, 2000 claims wrote it 2000 times, each larger). One that cannot
        be written undoes the request's prepares (the kubelet hears they failed): a claim new
        to this node is dropped and its spec removed, which nothing would remove otherwise if
        its pod went away before a retry."""
        said, self._said = self._said, []
        if not self._unsaved:
            return
        try:
            save_checkpoint(self.checkpoint, self.claims)
        except OSError as exc:
            why = exc.strerror or str(exc)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                why += ": free space in --plugins-dir"
            elif (kind := cdi.other_kind(self.checkpoint)) is not None:  # its path is fixed
                why = f"is {kind}, not a regular file: remove it (only this driver writes it)"
            elif (there := why_not_writable(self.checkpoint.parent)) is not None:
                why += f": {self.checkpoint.parent} {there}"
            undone = ", ".join(f"{who} not {verb}" for verb, who, _, _ in said)
            for uid, before in self._before.items():
                if before is not None:
                    self.claims[uid] = before
                    continue
                self.claims.pop(uid, None)
                name = spec_file(self.driver, uid)
                if (spec := _spec_there(self.cdi_dir / name)) and spec.get("kind") == self.cdi_kind:
                    (self.cdi_dir / name).unlink(missing_ok=True)
            raise CheckpointError(  # claims already as saved are not undone, nor named
                f"cannot write the checkpoint {self.checkpoint}: {why} ("
                + (f"{undone}: " if undone else "")
                + "the kubelet asks again)"
            ) from None
        finally:
            self._before.clear()
        self._unsaved = False
        for verb, who, uid, devices in said:  # said once the checkpoint holds it
            logger.info("%s claim %s (%s)%s", verb, who, uid, f": {devices}" if devices else "")

    def _requests(self, claim: ClaimRef, obj: dict[str, Any]) -> dict[str, list[str]]:
        """The claim's devices of this driver on this node, each with its requests."""
        requests: dict[str, list[str]] = {}
        at = ["metadata"]  # the field being read: named when it is not as the API has it
        try:  # what is read of the claim, read here: an answer of another shape is its error
            for i, result in enumerate(self._allocated(claim, obj, at)):
                at[0] = f"status.allocation.devices.results[{i}]"
                device, request = result["device"], result["request"]
                if not isinstance(device, str) or not isinstance(request, str):
                    raise TypeError
                if not _REQUEST.fullmatch(request) or masked(request) != request:
                    raise PrepareError(  # it reaches the kubelet's answer and the checkpoint
                        f"claim {claim.namespace}/{claim.name}: a request name the API server "
                        "gives is not a DNS label (or <request>/<subrequest>), or holds the "
                        "driver's API token: not used"
                    )
                if request in requests.get(device, []):  # the API never lists one twice
                    raise PrepareError(
                        f"claim {claim.namespace}/{claim.name}: its allocation lists device "
                        f"{shown(device)} twice for request {request}: not used"
                    )
                requests.setdefault(device, []).append(request)
        except (KeyError, TypeError, AttributeError):
            raise PrepareError(
                f"claim {claim.namespace}/{claim.name}: the API server's answer is not a "
                f"ResourceClaim as resource.k8s.io/v1 has it (its {at[0]})"
            ) from None
        return requests

    def _fresh(self, claim: ClaimRef, obj: dict[str, Any]) -> Prepared:
        """What prepare writes for the claim now: the devices and requests its allocation in
        the API (`obj`) has, each with its HCAs usable now; NCCL settings if its pods are all
        on the host network."""
        requests = self._requests(claim, obj)
        usable: dict[str, tuple[str, ...]] = {}
        for name in requests:
            device = self._devices.get(name)
            if device is None:
                raise PrepareError(
                    f"device {shown(name)} is not on this node now (withdrawn: its HCA is not "
                    "usable, or the driver's config changed since the claim was allocated)"
                )
            view = self._views[device.pool]
            usable[name] = tuple(
                h.name for h in view.hcas if h.name in device.hcas and h.unhealthy_reason() is None
            )
            if not usable[name]:
                raise PrepareError(f"device {name}: none of its HCAs is usable now")
        return self._written(claim, requests, usable, self._host_network_only(claim, obj))

    def _written(
        self,
        claim: ClaimRef,
        requests: Mapping[str, Sequence[str]],
        usable: Mapping[str, Sequence[str]],
        host_network: bool,
    ) -> Prepared:
        """What prepare writes for a claim whose devices (with their requests) get these HCAs."""
        allocations: dict[str, policy.Allocation] = {}
        hcas: list[str] = []
        granted: dict[str, Hca] = {}
        for name, names in usable.items():
            view = self._views[self._devices[name].pool]
            allocations[f"{claim.uid}-{name}"] = policy.allocation(
                view, tuple(names), self.dev_root
            )
            hcas += [h for h in names if h not in hcas]
            granted |= {h.name: h for h in view.hcas if h.name in names}
        env = {HCAS_ENV: ",".join(hcas)}
        if host_network:
            env |= _nccl(claim, [granted[h] for h in hcas])
        # one env for the whole claim: each device sets it, to the same value
        allocations = {
            n: policy.Allocation(a.devices, {**a.envs, **env}) for n, a in allocations.items()
        }
        devices = tuple(
            PreparedDevice(
                request_names=tuple(requests[name]),
                pool_name=self.node,
                device_name=name,
                cdi_device_ids=(cdi.device_id(self.cdi_kind, f"{claim.uid}-{name}"),),
            )
            for name in usable
        )
        return Prepared(claim.namespace, claim.name, devices, cdi.spec(self.cdi_kind, allocations))

    def _claim(self, claim: ClaimRef) -> dict[str, Any]:
        path = f"/apis/resource.k8s.io/v1/namespaces/{claim.namespace}/resourceclaims/{claim.name}"
        try:
            obj = self.api.call("GET", path)
        except KubeApiError as exc:
            raise PrepareError(f"cannot read claim {claim.namespace}/{claim.name}: {exc}") from exc
        if not isinstance(obj, dict):
            raise PrepareError(
                f"cannot read claim {claim.namespace}/{claim.name}: the answer is a "
                f"{type(obj).__name__}, not a ResourceClaim"
            )
        return cast(dict[str, Any], obj)

    def _host_network_only(self, claim: ClaimRef, obj: dict[str, Any]) -> bool:
        """Whether every pod the claim is reserved for is on the host network. A pod that
        cannot be read counts as off it: its podenv init container still has the settings."""
        try:
            status = cast(dict[str, Any], obj.get("status") or {})
            consumers = cast(list[dict[str, str]], status.get("reservedFor") or [])
            pods = [c for c in consumers if c.get("resource") == "pods" and not c.get("apiGroup")]
        except AttributeError:  # of another shape: the pods' podenv has the settings
            return False
        if not pods or len(pods) != len(consumers):
            return False
        until = time.monotonic() + POD_READS_WITHIN
        for done, pod in enumerate(pods):
            if time.monotonic() > until:
                logger.warning(
                    "claim %s/%s: no NCCL settings in its spec: %d of the %d pods it is reserved "
                    "for read within %gs", claim.namespace, claim.name, done, len(pods),
                    POD_READS_WITHIN,
                )  # fmt: skip
                return False
            try:
                name = str(pod.get("name"))
                if not _SUBDOMAIN.fullmatch(name):
                    raise KubeApiError(f"the name {shown(name)} is not a DNS subdomain")
                path = f"/api/v1/namespaces/{claim.namespace}/pods/{name}"
                answer = self.api.call("GET", path)
                if not isinstance(answer, dict):
                    raise KubeApiError(f"GET {path}: the answer is not a Pod")
                pod_obj = cast(dict[str, Any], answer)
                found: Any = pod_obj.get("spec") or {}
                if not isinstance(found, dict):
                    raise KubeApiError(f"GET {path}: the answer's spec is not a mapping")
                spec = cast(dict[str, Any], found)
                meta: Any = pod_obj.get("metadata") or {}
                uid = cast(dict[str, Any], meta).get("uid") if isinstance(meta, dict) else None
                if uid != pod.get("uid"):  # made again under the name: not the claim's pod
                    raise KubeApiError(f"GET {path}: its UID is not the one the claim names")
                if spec.get("hostNetwork", False) not in (True, False):
                    raise KubeApiError(f"GET {path}: its hostNetwork is not true or false")
            except KubeApiError as exc:
                logger.warning(
                    "claim %s/%s: no NCCL settings in its spec: cannot read a pod it is "
                    "reserved for (%s)", claim.namespace, claim.name, exc,
                )  # fmt: skip
                return False
            if spec.get("hostNetwork") is not True:
                return False
        return True

    def _allocated(
        self, claim: ClaimRef, obj: dict[str, Any], at: list[str]
    ) -> list[dict[str, Any]]:
        """The allocation's results of this driver on this node; `at` follows what is read."""
        said = (obj["metadata"].get("namespace"), obj["metadata"].get("name"))
        if not all(isinstance(part, str) for part in said):  # said as its shape, not None/None
            raise TypeError
        if said != (claim.namespace, claim.name):
            raise PrepareError(
                f"the API server answered for claim {claim.namespace}/{claim.name} with "
                f"{shown('/'.join(map(str, said)))}: not used"
            )
        found = obj["metadata"].get("uid")
        if found != claim.uid:
            raise PrepareError(
                f"claim {claim.namespace}/{claim.name} has UID {shown(found)}, not {claim.uid}: "
                "it was deleted and made again"
            )
        at[0] = "status"
        status = cast(dict[str, Any], obj.get("status") or {})
        if not status.get("allocation"):
            raise PrepareError(
                f"claim {claim.namespace}/{claim.name} is not allocated (it has no "
                "status.allocation): the scheduler allocates a claim before its pod is bound"
            )
        at[0] = "status.allocation.devices"
        allocation = cast(dict[str, Any], status["allocation"])
        devices = cast(dict[str, Any], allocation.get("devices") or {})
        at[0] = "status.allocation.devices.results"
        results: Any = devices.get("results") or []
        if not isinstance(results, list):  # a mapping's keys would be read as results
            raise TypeError
        results = cast(list[dict[str, Any]], results)
        ours = [r for r in results if r.get("driver") == self.driver and r.get("pool") == self.node]
        at[0] = "status.allocation.devices.config"
        configs = cast(list[dict[str, Any]], devices.get("config") or [])
        for config in configs:  # a setting the user believes applied, which this driver ignores
            opaque = cast(dict[str, Any], config.get("opaque") or {})
            if opaque.get("driver") == self.driver:
                raise PrepareError(
                    f"claim {claim.namespace}/{claim.name}: its devices' config passes "
                    f"{self.driver} parameters (from its {_source(config)}), and this driver "
                    "takes none: remove that config"
                )
        if not ours:
            raise PrepareError(
                f"claim {claim.namespace}/{claim.name} allocates no device of {self.driver} on "
                f"node {self.node}"
            )
        return ours


def _source(config: dict[str, Any]) -> str:
    """Where an allocation's config came from, as the API says it (FromClaim, FromClass)."""
    return {"FromClass": "DeviceClass"}.get(str(config.get("source")), "claim")


def _nccl(claim: ClaimRef, hcas: list[Hca]) -> dict[str, str]:
    """NCCL's settings for host-network pods: the host's GID on the granted HCAs. None when
    there is no usable one: the pod's podenv says why, where its owner sees it."""
    try:
        return choose(hcas, namespace_addresses(), family_for(host_network=True)).env()
    except (NoGidError, OSError) as exc:
        logger.warning("claim %s/%s: no NCCL settings in its spec: %s", claim.namespace,
                       claim.name, exc)  # fmt: skip
        return {}


def load_checkpoint(path: Path, cdi_kind: str, dev_root: Path) -> dict[str, Prepared]:
    """The claims prepared before; none when there is no checkpoint. One that cannot be read is
    kept aside (never overwritten unread) and said: its claims are prepared again on demand."""
    try:
        doc = json.loads(read_text(path, CHECKPOINT_MAX_BYTES))
        if not isinstance(doc, dict):
            raise ValueError(f"a JSON {type(doc).__name__}, not this driver's checkpoint")
        doc = cast(dict[str, Any], doc)
        if type(doc.get("version")) is not int or doc["version"] != CHECKPOINT_VERSION:
            raise ValueError(f"version {doc.get('version')}, not {CHECKPOINT_VERSION}")
        if not isinstance(listed := doc.get("claims"), dict):
            raise ValueError(f"its claims are {described(listed)}, not a mapping of UIDs")
        claims: dict[str, Prepared] = {}
        for uid, entry in cast(dict[str, Any], listed).items():
            try:
                if not _UID.fullmatch(str(uid)):
                    raise ValueError("not a UID")
                claims[str(uid)] = _prepared(str(uid), entry, cdi_kind, dev_root)
            except (ValueError, KeyError, TypeError, AttributeError):
                # one claim's entry: that claim is prepared afresh when asked, the rest kept
                logger.warning("checkpoint %s: claim %s is not as this driver writes it: left out",
                               path, shown(uid))  # fmt: skip
        return claims
    except UnreadableError as exc:
        if exc.missing:
            return {}
        problem: Exception = exc  # a FIFO, a device: renamed aside, never read
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        problem = exc
    aside = path.with_suffix(".unreadable")
    try:
        os.replace(path, aside)
    except OSError as exc:  # e.g. a directory there, and an earlier file at the aside name
        logger.error(
            "checkpoint %s cannot be read (%s), nor be moved to %s (%s): move it away; until "
            "then no prepare can be checkpointed", path, problem, aside, exc.strerror or exc,
        )  # fmt: skip
        return {}
    logger.error("checkpoint %s cannot be read (%s): kept as %s", path, problem, aside)
    return {}


def _spec_there(path: Path) -> dict[str, Any] | None:
    """The spec a regular file at `path` holds; None when there is none to read (gone, not a
    regular file); {} for text that is no JSON object (someone's file, a torn write of theirs)."""
    try:
        found = json.loads(read_text(path, CHECKPOINT_MAX_BYTES))
    except UnreadableError:
        return None
    except (ValueError, RecursionError):
        return {}
    return cast(dict[str, Any], found) if isinstance(found, dict) else {}


def _texts(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in cast(list[Any], value)):
        raise ValueError("not a list of text")
    return tuple(cast(list[str], value))


def _prepared(uid: str, doc: Any, cdi_kind: str, dev_root: Path) -> Prepared:
    """A checkpoint entry, checked to be exactly what this driver writes: the claim named as
    Kubernetes names one, its devices each with the one CDI ID prepare gives it, and a spec of
    this driver's kind, version and nothing else. Anything more could reach the runtime: an ID
    of another vendor's device, a mount, an env of the loader."""
    if not isinstance(doc, dict) or set(cast(dict[str, Any], doc)) != {
        "namespace", "name", "devices", "spec"
    }:  # fmt: skip
        raise ValueError("not an entry of this driver")
    entry = cast(dict[str, Any], doc)
    try:
        claim = ClaimRef(str(entry["namespace"]), uid, str(entry["name"]))
    except PrepareError as exc:
        raise ValueError(str(exc)) from None
    if not isinstance(entry["namespace"], str) or not isinstance(entry["name"], str):
        raise ValueError("its claim's name is not text")
    listed: Any = entry["devices"]
    if not isinstance(listed, list) or not listed:
        raise ValueError("it lists no device")
    devices: list[PreparedDevice] = []
    for d in cast(list[Any], listed):
        if not isinstance(d, dict) or set(cast(dict[str, Any], d)) != {
            "request_names", "pool_name", "device_name", "cdi_device_ids"
        }:  # fmt: skip
            raise ValueError("a device of another shape")
        item = cast(dict[str, Any], d)
        name, pool = item["device_name"], item["pool_name"]
        if not isinstance(name, str) or not _LABEL.fullmatch(name) or not isinstance(pool, str):
            raise ValueError("a device not named as a slice names one")
        ids = _texts(item["cdi_device_ids"])
        if ids != (cdi.device_id(cdi_kind, f"{uid}-{name}"),):
            raise ValueError("a CDI ID prepare does not give")
        devices.append(PreparedDevice(_texts(item["request_names"]), pool, name, ids))
    spec: Any = entry["spec"]
    if (
        not isinstance(spec, dict)
        or set(cast(dict[str, Any], spec)) != {"cdiVersion", "kind", "devices"}
        or spec["cdiVersion"] != cdi.CDI_VERSION
        or spec["kind"] != cdi_kind
    ):
        raise ValueError(f"its CDI spec is not one of {cdi_kind} as this driver writes it")
    host_dir = dev_root / "infiniband"
    specs: Any = cast(dict[str, Any], spec)["devices"]
    names = [f"{uid}-{d.device_name}" for d in devices]
    if (
        not isinstance(specs, list)
        or len(cast(list[Any], specs)) != len(names)
        or not all(
            cdi.is_ours(d, n, host_dir) for d, n in zip(cast(list[Any], specs), names, strict=True)
        )
    ):
        raise ValueError("its CDI spec is not of its devices")
    return Prepared(claim.namespace, claim.name, tuple(devices), cast(dict[str, Any], spec))


def save_checkpoint(path: Path, claims: Mapping[str, Prepared]) -> None:
    """Written whole or not at all: a crash mid-write leaves the previous checkpoint."""
    content = {"version": CHECKPOINT_VERSION, "claims": {u: asdict(p) for u, p in claims.items()}}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(content))
