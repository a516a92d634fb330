"""The kubelet's two gRPC services of a DRA driver: Registration (found by the kubelet's plugin
watcher in plugins_registry) and DRAPlugin, v1 and v1beta1 (the same messages: the kubelet
uses the newest both sides speak). Thin: all the work is the Preparer's."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Iterable
from dataclasses import asdict
from typing import Any, TypeVar

import grpc

from common.secret import masked
from common.terminal import one_line
from plugin.core.kube.kubeapi import in_background
from plugin.dra.api.dra.v1 import api_pb2 as v1
from plugin.dra.api.dra.v1 import api_pb2_grpc as v1_grpc
from plugin.dra.api.dra.v1beta1 import api_pb2 as v1beta1
from plugin.dra.api.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from plugin.dra.api.pluginregistration.v1 import api_pb2 as reg
from plugin.dra.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from plugin.dra.checkpoint import ClaimNameError, ClaimRef
from plugin.dra.prepare import PreparedDevice, PrepareError, Preparer

logger = logging.getLogger(__name__)

# What the kubelet 1.34 matches in GetInfo's supported_versions.
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


T = TypeVar("T")
STOPPING = "the driver is stopping: the kubelet asks again once it is back"


class _Claims:
    """NodePrepareResources and NodeUnprepareResources, whatever the API version: claims are
    prepared one at a time, off the event loop in a daemon thread (a claim's read from the API
    server and its file writes block; a stop does not wait for them: each file is written
    atomically, and what a kill leaves is removed at the next start), under one lock (the
    specs and the checkpoint have one writer)."""

    def __init__(self, preparer: Preparer, lock: asyncio.Lock, stopping: asyncio.Event) -> None:
        self.preparer = preparer
        self.lock = lock
        self.stopping = stopping

    async def _unless_stopping(self, work: Callable[[], T], what: str) -> T:
        """`work()` in a daemon thread; CancelledError once the driver stops, so that each
        call in flight is answered before the server's grace ends (its own cancellation of a
        call still running is a logged traceback). When the kubelet gives up on the call (its
        deadline), the work still runs: it is waited for, the lock held (the checkpoint has one
        writer), and how it ended is logged in one line."""
        running = asyncio.ensure_future(in_background(work))
        stopped = asyncio.ensure_future(self.stopping.wait())
        try:
            await asyncio.wait({running, stopped}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            await asyncio.wait({running, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if running.done() and (error := running.exception()) is not None:
                logger.warning("%s, which the kubelet gave up waiting for: %s", what, error)
            raise
        finally:
            stopped.cancel()
            if not running.done():
                running.cancel()  # asked: the task is done only once the loop runs it again
        if not running.done():  # the driver stops
            raise asyncio.CancelledError
        return running.result()

    async def prepare(self, claims: Iterable[Any]) -> dict[str, tuple[PreparedDevice, ...] | str]:
        """Claim UID -> its devices, or why it cannot be prepared now. A claim is answered
        prepared only once its spec and its record are on disk; once the driver stops, the
        claims not done are answered so (a prepare left running may finish: the kubelet's
        retry finds it done)."""
        answers: dict[str, tuple[PreparedDevice, ...] | str] = {}
        refs, refused = _refs(claims)
        answers.update(refused)
        for ref in refs:
            if self.stopping.is_set():
                answers[ref.uid] = STOPPING
                continue
            try:
                async with self.lock:
                    answers[ref.uid] = await self._unless_stopping(
                        functools.partial(self.preparer.prepare, ref), f"prepare {ref.named}"
                    )
            except (PrepareError, OSError) as exc:
                logger.warning("prepare %s: %s", ref.named, exc)
                answers[ref.uid] = masked(str(exc))
            except asyncio.CancelledError:  # the driver stops: answered, not a grpc traceback
                answers[ref.uid] = STOPPING
        return answers

    async def unprepare(self, claims: Iterable[Any]) -> dict[str, str]:
        """Claim UID -> "" once its spec and record are gone, or why not."""
        answers: dict[str, str] = {}
        refs, refused = _refs(claims)
        answers.update(refused)
        for ref in refs:
            if self.stopping.is_set():
                answers[ref.uid] = STOPPING
                continue
            try:
                async with self.lock:
                    undo = functools.partial(self.preparer.unprepare, ref)
                    await self._unless_stopping(undo, f"unprepare {ref.named}")
                answers[ref.uid] = ""
            except (PrepareError, OSError) as exc:
                logger.warning("unprepare %s: %s", ref.named, exc)
                answers[ref.uid] = masked(str(exc))
            except asyncio.CancelledError:
                answers[ref.uid] = STOPPING
        return answers


def _refs(claims: Iterable[Any]) -> tuple[list[ClaimRef], dict[str, str]]:
    """The claims of a request, each UID once, checked; and the answers of those refused. The
    answer is keyed by UID: a UID named twice with two names would get one answer for two
    claims, so it is refused whole, and nothing of it is done."""
    refs: dict[str, ClaimRef] = {}
    refused: dict[str, str] = {}
    for claim in claims:
        uid = str(claim.uid)
        if uid in refused:
            continue
        try:
            ref = ClaimRef(claim.namespace, uid, claim.name)
        except ClaimNameError as exc:
            logger.warning("claim %s: %s", _named(claim), exc)
            refused[uid] = masked(str(exc))
            refs.pop(uid, None)
            continue
        if (seen := refs.get(uid)) is not None and seen != ref:
            refused[uid] = masked(
                f"the kubelet names claim UID {uid} twice, as {seen.named} and {ref.named}: "
                "neither is prepared or unprepared"
            )
            logger.warning("%s", refused[uid])
            del refs[uid]
            continue
        refs[uid] = ref
    return list(refs.values()), refused


def _named(claim: Any) -> str:
    """A claim as the kubelet named it, for a log line (its parts may not be checked yet)."""
    return one_line(f"{claim.namespace}/{claim.name}", 130)


class V1Servicer(v1_grpc.DRAPluginServicer):
    def __init__(self, claims: _Claims) -> None:
        self.claims = claims

    async def NodePrepareResources(
        self, request: v1.NodePrepareResourcesRequest, context: object
    ) -> v1.NodePrepareResourcesResponse:
        response = v1.NodePrepareResourcesResponse()
        for uid, answer in (await self.claims.prepare(request.claims)).items():
            if isinstance(answer, str):
                response.claims[uid].error = answer
            else:
                response.claims[uid].devices.extend(v1.Device(**asdict(d)) for d in answer)
        return response

    async def NodeUnprepareResources(
        self, request: v1.NodeUnprepareResourcesRequest, context: object
    ) -> v1.NodeUnprepareResourcesResponse:
        response = v1.NodeUnprepareResourcesResponse()
        for uid, error in (await self.claims.unprepare(request.claims)).items():
            response.claims[uid].error = error
        return response


class V1beta1Servicer(v1beta1_grpc.DRAPluginServicer):
    def __init__(self, claims: _Claims) -> None:
        self.claims = claims

    async def NodePrepareResources(
        self, request: v1beta1.NodePrepareResourcesRequest, context: object
    ) -> v1beta1.NodePrepareResourcesResponse:
        response = v1beta1.NodePrepareResourcesResponse()
        for uid, answer in (await self.claims.prepare(request.claims)).items():
            if isinstance(answer, str):
                response.claims[uid].error = answer
            else:
                response.claims[uid].devices.extend(v1beta1.Device(**asdict(d)) for d in answer)
        return response

    async def NodeUnprepareResources(
        self, request: v1beta1.NodeUnprepareResourcesRequest, context: object
    ) -> v1beta1.NodeUnprepareResourcesResponse:
        response = v1beta1.NodeUnprepareResourcesResponse()
        for uid, error in (await self.claims.unprepare(request.claims)).items():
            response.claims[uid].error = error
        return response


def add_dra_services(server: grpc.aio.Server, preparer: Preparer, stopping: asyncio.Event) -> None:
    """The DRAPlugin services; once `stopping` is set, every call in flight is answered that
    the driver is stopping."""
    claims = _Claims(preparer, asyncio.Lock(), stopping)
    v1_grpc.add_DRAPluginServicer_to_server(V1Servicer(claims), server)
    v1beta1_grpc.add_DRAPluginServicer_to_server(V1beta1Servicer(claims), server)


class RegistrationServicer(reg_grpc.RegistrationServicer):
    """Tells the kubelet's plugin watcher who we are and where DRAPlugin is served; hears back
    whether the kubelet took us (`on_status`)."""

    def __init__(self, driver: str, endpoint: str, on_status: Callable[[bool, str], None]) -> None:
        self.driver = driver
        self.endpoint = endpoint
        self.on_status = on_status

    async def GetInfo(self, request: reg.InfoRequest, context: object) -> reg.PluginInfo:
        return reg.PluginInfo(
            type="DRAPlugin",
            name=self.driver,
            endpoint=self.endpoint,
            supported_versions=SUPPORTED_VERSIONS,
        )

    async def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus, context: object
    ) -> reg.RegistrationStatusResponse:
        self.on_status(request.plugin_registered, request.error)
        return reg.RegistrationStatusResponse()
