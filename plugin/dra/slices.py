"""The node's ResourceSlices, kept equal to its devices: the only writer of them. Each change of
the devices is a new pool generation; the slices in the API are reconciled to it (created,
replaced, deleted) on every change, on every registration with the kubelet, whenever anyone
else changes them (a watch: a starting kubelet wipes the node's slices in the background, after
the driver may have registered again) and periodically."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import time
from collections.abc import Sequence
from typing import Any, NamedTuple, cast

from plugin.config import label
from plugin.core.kube.kubeapi import KubeApi, KubeApiError, in_background
from plugin.dra.devices import SliceDevice, slices

logger = logging.getLogger(__name__)

RESOURCE_SLICES = "/apis/resource.k8s.io/v1/resourceslices"
_BACKOFF_START, _BACKOFF_MAX = 1.0, 30.0
_RECHECK = 60.0
# slices per list page: a node's slices at maxAllocations' top, listed whole, were over the
# 16 MiB an answer may be. 100 pages hold 6 times the most a node publishes (100000 shares in
# 782 slices, an exclusive device per HCA): a server that never ends its pages is said.
_PAGE, _MAX_PAGES = 50, 100
_PROGRESS = 10.0  # a reconcile still writing after this long says how far it is


def slice_name(node: str, driver: str, index: int) -> str:
    return f"{node}-{label(driver)}-{index}"


def desired(
    driver: str, node: str, generation: int, count: int, index: int, devices: Sequence[SliceDevice]
) -> dict[str, Any]:
    """ResourceSlice `index` of `count` (without metadata beyond the name), holding `devices`."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node, driver, index)},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
            "devices": [d.as_api() for d in devices],
        },
    }


class Listed(NamedTuple):
    """What the publisher keeps of a slice in the API: its spec as a digest, not as parsed JSON
    (a node's 100000 share devices took 94 MiB each as listed and as wanted)."""

    resource_version: str
    generation: int
    spec: bytes


def spec_digest(spec: object) -> bytes:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).digest()


class SlicePublisher:
    def __init__(self, api: KubeApi, driver: str, node: str) -> None:
        self.api = api
        self.driver = driver
        self.node = node
        self.generation = 0
        self.published = 0  # generations reconciled into the API, for metrics and tests
        self._devices: tuple[SliceDevice, ...] | None = None
        self._trigger = asyncio.Event()
        self._listed: str | None = None  # the resourceVersion of the last list
        self._relisted = asyncio.Event()

    def update(self, devices: Sequence[SliceDevice]) -> None:
        """New devices: a new generation, reconciled as soon as the API lets us."""
        if tuple(devices) != self._devices:
            self._devices = tuple(devices)
            self.generation += 1
            self._trigger.set()

    def recheck(self) -> None:
        """Reconcile again at once (the kubelet registered us: it may have wiped the slices)."""
        self._trigger.set()

    async def run(self) -> None:
        backoff = _BACKOFF_START
        while True:
            try:
                async with asyncio.timeout(_RECHECK):
                    await self._trigger.wait()
            except TimeoutError:
                pass
            self._trigger.clear()
            if self._devices is None:
                continue
            try:
                existing, version = await in_background(self._existing)
                newest = max((s.generation for s in existing.values()), default=0)
                if not self.published and newest >= self.generation:
                    self.generation = newest + 1  # a restart: past what the last run published
                await in_background(
                    functools.partial(self._reconcile, existing, self.generation, self._devices)
                )
            except KubeApiError as exc:
                (logger.debug if exc.said else logger.warning)(
                    "ResourceSlices of %s: %s; trying again in %.0fs", self.node, exc, backoff
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX)
                self._trigger.set()
                continue
            backoff = _BACKOFF_START
            self._listed = version
            self._relisted.set()

    async def watch(self) -> None:
        """Reconcile as soon as the node's slices change after the last list; without a watch
        (RBAC, a proxy) the periodic recheck still does, said once."""
        backoff = _BACKOFF_START
        failing = False
        while True:
            since = self._listed
            if since is None:  # nothing listed yet
                self._relisted.clear()
                await self._relisted.wait()
                continue
            try:
                changed = await in_background(
                    functools.partial(self.api.changed, RESOURCE_SLICES, self._query(), since,
                                      _RECHECK)
                )  # fmt: skip
            except KubeApiError as exc:
                if not failing:
                    (logger.debug if exc.said else logger.warning)(
                        "ResourceSlices of %s cannot be watched (%s): a change by anyone else "
                        "is mended within %.0fs",
                        self.node, exc, _RECHECK,
                    )  # fmt: skip
                failing = True
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX)
                continue
            if failing:
                logger.info("ResourceSlices of %s: watched again", self.node)
            failing, backoff = False, _BACKOFF_START
            if changed and self._listed == since:  # else listed since: watch from there
                self._relisted.clear()
                self._trigger.set()
                await self._relisted.wait()

    def _query(self) -> dict[str, str]:
        return {"fieldSelector": f"spec.nodeName={self.node},spec.driver={self.driver}"}

    def _existing(self) -> tuple[dict[str, Listed], str | None]:
        """The node's slices of this driver, by name, and the list's resourceVersion: listed
        a page at a time."""
        found: dict[str, Listed] = {}
        query = {**self._query(), "limit": str(_PAGE)}
        for _ in range(_MAX_PAGES):
            listed = self.api.call("GET", RESOURCE_SLICES, query=query)
            items: Any = None
            meta: Any = None
            if isinstance(listed, dict):
                items = cast(dict[str, Any], listed).get("items") or []
                meta = cast(dict[str, Any], listed).get("metadata") or {}
            # what the rest reads of each, checked here once: an odd answer is retried, not a
            # crash
            if (
                not isinstance(items, list)
                or not isinstance(meta, dict)
                or not all(_is_slice(s) for s in cast(list[Any], items))
            ):
                raise KubeApiError(
                    f"GET {RESOURCE_SLICES}: the answer is not a list of ResourceSlices: is the "
                    "server an API server of 1.34 or newer?"
                )
            for s in cast(list[dict[str, Any]], items):
                found[s["metadata"]["name"]] = Listed(
                    s["metadata"]["resourceVersion"], _generation(s), spec_digest(s["spec"])
                )
            version: Any = cast(dict[str, Any], meta).get("resourceVersion")
            more: Any = cast(dict[str, Any], meta).get("continue")
            if not more or not isinstance(more, str):
                return found, version if isinstance(version, str) else None
            query = {**self._query(), "limit": str(_PAGE), "continue": more}
        raise KubeApiError(
            f"GET {RESOURCE_SLICES}: the list of {self.node}'s slices did not end within "
            f"{_MAX_PAGES} pages of {_PAGE}: is the server an API server?"
        )

    def _reconcile(
        self, existing: dict[str, Listed], generation: int, devices: Sequence[SliceDevice]
    ) -> None:
        """Each slice built, compared and written in turn: the whole set at once held every
        device's JSON twice."""
        parts = slices(devices)
        changed = 0
        said = time.monotonic()
        for index, part in enumerate(parts):
            item = desired(self.driver, self.node, generation, len(parts), index, part)
            name = item["metadata"]["name"]
            old = existing.pop(name, None)
            if old is None:
                self.api.call("POST", RESOURCE_SLICES, item)
                changed += 1
            elif old.spec != spec_digest(item["spec"]):
                item["metadata"]["resourceVersion"] = old.resource_version
                self.api.call("PUT", f"{RESOURCE_SLICES}/{name}", item)
                changed += 1
            if time.monotonic() - said > _PROGRESS:
                said = time.monotonic()
                logger.info(
                    "ResourceSlices of %s: generation %d, %d of %d slices reconciled so far",
                    self.node, generation, index + 1, len(parts),
                )  # fmt: skip
        for name in existing:
            self.api.call("DELETE", f"{RESOURCE_SLICES}/{name}")
            changed += 1
        if changed:
            logger.info(
                "ResourceSlices of %s: generation %d, %d devices in %d slices (%d written)",
                self.node,
                generation,
                len(devices),
                len(parts),
                changed,
            )
        self.published = generation


def _is_slice(item: Any) -> bool:
    """Shaped as what the publisher reads of a ResourceSlice: its name, resourceVersion, spec
    and pool generation."""
    try:
        meta, spec = item["metadata"], item["spec"]
        _generation(item)
    except (KeyError, TypeError, ValueError):
        return False
    return (
        isinstance(meta["name"], str)
        and isinstance(meta.get("resourceVersion"), str)
        and isinstance(spec, dict)
    )


def _generation(item: dict[str, Any]) -> int:
    return int(item["spec"]["pool"]["generation"])
