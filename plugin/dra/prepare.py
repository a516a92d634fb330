"""Prepare and unprepare: a claim's allocation for this driver and node becomes a CDI spec in
the runtime's CDI dir, and the CDI device IDs the kubelet hands the runtime. The CDI dir,
/var/run/cdi, is a tmpfs: a claim prepared before a reboot gets its spec again when the kubelet
asks again.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from common.secret import masked
from common.userfiles import (
    TEMP_MARK,
    UnreadableError,
    read_text,
    remove_temps,
    shown,
    why_not_writable,
)
from plugin.core.kube import cdi
from plugin.core.kube.kubeapi import KubeApi, KubeApiError
from plugin.core.node import pools
from plugin.core.node.discovery.model import Hca
from plugin.core.podnet.gidchoice import NoGidError, choose
from plugin.core.podnet.netaddrs import namespace_addresses
from plugin.dra.checkpoint import SUBDOMAIN, UID, Checkpoint, ClaimRef
from plugin.dra.devices import SliceDevice, slice_devices
from plugin.launch import HCAS_ENV, family_for

logger = logging.getLogger(__name__)


class PrepareError(RuntimeError):
    """Why a claim cannot be prepared (or unprepared) now; the kubelet retries."""


# A request's name in an allocation result: a DNS label, or <request>/<subrequest>.
_REQUEST = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(/[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)?")
# How long the pods a claim is reserved for are read, in all (up to 256 of them, each read
# bounded on its own): past it the claim gets no NCCL settings, its pods' podenv has them, and
# the node's other prepares, which wait on this one, go on.
POD_READS_WITHIN = 5.0
# A spec of ours is a few KB; anything larger is not one.
_SPEC_MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class PreparedDevice:
    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]


@dataclass(frozen=True)
class Prepared:
    """What prepare writes for a claim: its answer to the kubelet and its CDI spec."""

    devices: tuple[PreparedDevice, ...]
    spec: dict[str, Any] = field(default_factory=dict[str, Any])


def spec_file(driver: str, uid: str) -> str:
    return f"{driver}-{uid}.json"


class Preparer:
    """The only writer of the claims' CDI specs and of the checkpoint. Every prepare, a repeat
    too, is made from the claim's allocation in the API server and the node's HCAs now: a
    claim is never answered from memory or from the checkpoint alone. Each claim's spec and
    record are on disk before it is answered, and removed before "unprepared" is."""

    def __init__(
        self,
        api: KubeApi,
        driver: str,
        node: str,
        cdi_kind: str,
        cdi_dir: Path,
        checkpoint_dir: Path,
        dev_root: Path,
    ) -> None:
        self.api = api
        self.driver = driver
        self.node = node
        self.cdi_kind = cdi_kind
        self.cdi_dir = cdi_dir
        self.checkpoint = Checkpoint(checkpoint_dir)
        self.dev_root = dev_root
        self._views: dict[str, pools.PoolView] = {}
        self._devices: dict[str, SliceDevice] = {}
        # why a device of the last views cannot be published (said with the node's problems)
        self.skipped: list[str] = []

    def recover(self) -> None:
        """At start, before serving (the instance lock held): the records read, and what a run
        killed midway left in the CDI dir removed: temp files of our specs, and specs of ours
        that no record holds (written by a prepare that was never answered)."""
        recorded = self.checkpoint.load()
        prefix = f"{self.driver}-"
        removed = 0
        try:
            entries = list(os.scandir(self.cdi_dir))
        except OSError:
            return  # a CDI dir that cannot be read is said at start (cdi.dir_problem)
        remove_temps(self.cdi_dir, lambda name: name.startswith(f".{prefix}") and TEMP_MARK in name)
        for entry in entries:
            path = Path(entry.path)
            uid = entry.name.removeprefix(prefix).removesuffix(".json")
            if (
                entry.name == spec_file(self.driver, uid)
                and UID.fullmatch(uid)
                and uid not in recorded
                and (_spec_there(path) or {}).get("kind") == self.cdi_kind
            ):
                path.unlink(missing_ok=True)
                removed += 1
        if removed:
            logger.info(
                "--cdi-dir %s: removed %d specs of ours that no prepared claim holds (their "
                "prepare was stopped before it was answered)", self.cdi_dir, removed,
            )  # fmt: skip

    def update(self, views: Sequence[pools.PoolView]) -> list[SliceDevice]:
        """The node's state after a scan; the devices it publishes now. Views that are the
        last ones (a scan that changed nothing keeps them) give the last devices: at the top
        of maxAllocations, making them again took 0.2 s of every scan."""
        if len(views) == len(self._views) and all(self._views.get(v.pool.name) is v for v in views):
            return list(self._devices.values())
        devices, self.skipped = slice_devices(views)
        self._views = {v.pool.name: v for v in views}
        self._devices = {d.name: d for d in devices}
        return devices

    def prepare(self, claim: ClaimRef) -> tuple[PreparedDevice, ...]:
        """Idempotent: the claim's spec written (again, if the node changed or it is gone) and
        the claim recorded, both on disk when this returns. A record that cannot be written
        leaves no spec of a claim new to this node."""
        fresh = self._fresh(claim, self._claim(claim))
        known = self.checkpoint.claims.get(claim.uid) == claim
        rewritten = self._write_spec(claim.uid, fresh)
        try:
            self.checkpoint.add(claim)
        except OSError as exc:
            if not known:
                self._remove_spec(claim.uid)
            raise PrepareError(self._checkpoint_problem(claim, exc)) from None
        devices = ", ".join(d.device_name for d in fresh.devices)
        if not known:
            logger.info("prepared claim %s (%s): %s", claim.named, claim.uid, devices)
        elif rewritten:
            logger.info(
                "claim %s (%s): its CDI spec written again (%s): the node's HCAs changed since "
                "it was prepared, or the spec was gone", claim.named, claim.uid, devices,
            )  # fmt: skip
        return fresh.devices

    def _checkpoint_problem(self, claim: ClaimRef, exc: OSError) -> str:
        why = exc.strerror or str(exc)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            why += ": free space in --plugins-dir"
        elif (there := why_not_writable(self.checkpoint.directory)) is not None:
            why += f": {self.checkpoint.directory} {there}"
        return (
            f"claim {claim.named} not prepared: cannot record it in {self.checkpoint.directory}: "
            f"{why} (the kubelet asks again)"
        )

    def _write_spec(self, uid: str, prepared: Prepared) -> bool:
        """The claim's spec in the CDI dir, unless it is there as it should be; whether it was
        written."""
        name = spec_file(self.driver, uid)
        found = _spec_there(self.cdi_dir / name)
        if found == prepared.spec:
            return False
        if found is not None and found.get("kind") != self.cdi_kind:
            raise PrepareError(  # never overwritten: it is not a spec of ours
                f"--cdi-dir {self.cdi_dir}: {name} there is not a CDI spec of {self.cdi_kind}: "
                "move it away"
            )
        try:  # gone, or ours but stale; a directory or a FIFO there is said by the write
            cdi.write_spec(self.cdi_dir, name, prepared.spec)
        except cdi.CdiError as exc:
            raise PrepareError(str(exc)) from None
        return True

    def _remove_spec(self, uid: str) -> None:
        """The claim's spec gone, when it is ours (someone else's file there is kept, said)."""
        name = spec_file(self.driver, uid)
        if (kind := cdi.other_kind(self.cdi_dir / name)) is not None:
            logger.warning("--cdi-dir %s: %s there is %s, not a spec: kept", self.cdi_dir, name,
                           kind)  # fmt: skip
            return
        found = _spec_there(self.cdi_dir / name)
        if found is not None and found.get("kind") != self.cdi_kind:
            logger.warning("--cdi-dir %s: %s there is not a CDI spec of %s: kept", self.cdi_dir,
                           name, self.cdi_kind)  # fmt: skip
            return
        try:
            (self.cdi_dir / name).unlink(missing_ok=True)
        except OSError as exc:  # the claim stays prepared: the kubelet asks again
            why = why_not_writable(self.cdi_dir) or exc.strerror or str(exc)
            raise PrepareError(
                f"--cdi-dir {self.cdi_dir}: cannot remove {name} there: {why}"
            ) from None

    def unprepare(self, claim: ClaimRef) -> None:
        """Idempotent: an unknown claim is already unprepared. The spec goes first, then the
        record (an unlink needs no room: a full disk cannot hold an unprepare back)."""
        self._remove_spec(claim.uid)
        known = claim.uid in self.checkpoint.claims
        self.checkpoint.remove(claim.uid)
        if known:
            logger.info("unprepared claim %s (%s)", claim.named, claim.uid)

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
                        f"claim {claim.named}: a request name the API server "
                        "gives is not a DNS label (or <request>/<subrequest>), or holds the "
                        "driver's API token: not used"
                    )
                if request in requests.get(device, []):  # the API never lists one twice
                    raise PrepareError(
                        f"claim {claim.named}: its allocation lists device "
                        f"{shown(device)} twice for request {request}: not used"
                    )
                requests.setdefault(device, []).append(request)
        except (KeyError, TypeError, AttributeError):
            raise PrepareError(
                f"claim {claim.named}: the API server's answer is not a "
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
        allocations: dict[str, pools.Allocation] = {}
        hcas: list[str] = []
        granted: dict[str, Hca] = {}
        for name, names in usable.items():
            view = self._views[self._devices[name].pool]
            allocations[f"{claim.uid}-{name}"] = pools.allocation(view, tuple(names), self.dev_root)
            hcas += [h for h in names if h not in hcas]
            granted |= {h.name: h for h in view.hcas if h.name in names}
        env = {HCAS_ENV: ",".join(hcas)}
        if host_network:
            env |= _nccl(claim, [granted[h] for h in hcas])
        # one env for the whole claim: each device sets it, to the same value
        allocations = {
            n: pools.Allocation(a.devices, {**a.envs, **env}) for n, a in allocations.items()
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
        return Prepared(devices, cdi.spec(self.cdi_kind, allocations))

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
                if not SUBDOMAIN.fullmatch(name):
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
                f"claim {claim.named} has UID {shown(found)}, not {claim.uid}: "
                "it was deleted and made again"
            )
        at[0] = "status"
        status = cast(dict[str, Any], obj.get("status") or {})
        if not status.get("allocation"):
            raise PrepareError(
                f"claim {claim.named} is not allocated (it has no "
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
                    f"claim {claim.named}: its devices' config passes "
                    f"{self.driver} parameters (from its {_source(config)}), and this driver "
                    "takes none: remove that config"
                )
        if not ours:
            raise PrepareError(
                f"claim {claim.named} allocates no device of {self.driver} on node {self.node}"
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


def _spec_there(path: Path) -> dict[str, Any] | None:
    """The spec a regular file at `path` holds; None when there is none to read (gone, not a
    regular file); {} for text that is no JSON object (someone's file, a torn write of theirs)."""
    try:
        found = json.loads(read_text(path, _SPEC_MAX_BYTES))
    except UnreadableError:
        return None
    except (ValueError, RecursionError):
        return {}
    return cast(dict[str, Any], found) if isinstance(found, dict) else {}
