"""grpc.aio DevicePlugin servicer for one pool: protobuf <-> pool, nothing else."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Protocol

import grpc

from common.secret import masked
from common.userfiles import shown
from plugin.core.kube.cdi import CdiError, SpecFile
from plugin.core.metrics.exposition import Metrics
from plugin.core.node import pools
from plugin.deviceplugin.api.v1beta1 import api_pb2, api_pb2_grpc
from plugin.deviceplugin.wire import KUBELET_MESSAGE_MAX, list_and_watch_response

logger = logging.getLogger(__name__)


class Streams(Protocol):
    """Who is told of ListAndWatch streams: the registrar that owns this servicer's socket."""

    def stream_opened(self) -> int:
        """A token naming the registration the new stream belongs to."""
        ...

    def stream_ended(self, token: int) -> None:
        """The kubelet ended the stream opened under `token` (we did not)."""
        ...


class DevicePluginServicer(api_pb2_grpc.DevicePluginServicer):
    """Serves one pool. `update` pushes a new scan; streams see every change at once."""

    def __init__(
        self,
        view: pools.PoolView,
        dev_root: Path,
        metrics: Metrics,
        streams: Streams,
        cdi: SpecFile | None = None,
    ) -> None:
        self.view = view
        self.dev_root = dev_root
        self.cdi = cdi
        self.metrics = metrics
        self.streams = streams
        self.resource = view.pool.resource_name
        # at 0 from the start: a rate over it (the dashboard's) has a series before the first pod
        metrics.allocations.labels(resource=self.resource).inc(0)
        self._stopping = False
        self._answers: dict[tuple[str, ...], api_pb2.ContainerAllocateResponse] = {}
        self.unlisted: str | None = None  # why IDs of the pool are not advertised, if any are not
        self._response = self._listed(view)
        self._changed = asyncio.Condition()
        self._version = 0

    def _listed(self, view: pools.PoolView) -> api_pb2.ListAndWatchResponse:
        """The response, and what it leaves out said (once per change)."""
        response = list_and_watch_response(view)
        listed, total = len(response.devices), len(view.devices)
        unlisted = None
        if listed < total:
            unlisted = (
                f"{self.resource}: only {listed} of the pool's {total} IDs are advertised: the "
                f"kubelet takes a device list of at most {KUBELET_MESSAGE_MAX >> 20} MiB; lower "
                f"maxAllocations to {listed} or less (or shorten the pool's name)"
            )
        if unlisted != self.unlisted and unlisted is not None:
            logger.error("%s", unlisted)
        self.unlisted = unlisted
        return response

    async def update(self, view: pools.PoolView) -> None:
        unchanged = view.devices == self.view.devices
        self.view = view
        self._answers = {}  # char devices may differ under the same device IDs
        if unchanged:
            return
        self._response = self._listed(view)
        async with self._changed:
            self._version += 1
            self._changed.notify_all()

    async def stop_streams(self) -> None:
        self._stopping = True
        async with self._changed:
            self._version += 1
            self._changed.notify_all()

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext[object, object]
    ) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(get_preferred_allocation_available=True)

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext[object, object]
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        token = self.streams.stream_opened()
        logger.info("%s: ListAndWatch opened", self.resource)
        try:
            while True:
                async with self._changed:
                    version = self._version
                if self._stopping:
                    return
                yield self._response
                async with self._changed:
                    while self._version == version:
                        await self._changed.wait()
        finally:
            if not self._stopping:
                self.streams.stream_ended(token)

    async def GetPreferredAllocation(
        self,
        request: api_pb2.PreferredAllocationRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> api_pb2.PreferredAllocationResponse:
        return api_pb2.PreferredAllocationResponse(
            container_responses=[
                api_pb2.ContainerPreferredAllocationResponse(
                    deviceIDs=pools.preferred(
                        self.view,
                        list(r.available_deviceIDs),
                        list(r.must_include_deviceIDs),
                        r.allocation_size,
                    )
                )
                for r in request.container_requests
            ]
        )

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> api_pb2.AllocateResponse:
        responses: list[api_pb2.ContainerAllocateResponse] = []
        if not request.container_requests:  # no device ID either: refused as that is
            logger.error("Allocate refused: %s: a request with no container", self.resource)
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{self.resource}: a request with no container: nothing to allocate (the "
                "kubelet sends one per container that asks for this resource)",
            )
        for r in request.container_requests:
            ids = list(r.devices_ids)
            try:
                hcas = pools.allocated_hcas(self.view, ids)
                answer = self._answer(hcas)
            except (pools.AllocationError, CdiError, OSError) as exc:
                self.metrics.errors.labels(kind="allocate").inc()
                logger.error("Allocate refused: %s", exc)
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, masked(str(exc)))
            responses.append(answer)
            self.metrics.allocations.labels(resource=self.resource).inc()
            logger.info("allocated %s %s -> %s", self.resource, shown(ids), ",".join(hcas))
        return api_pb2.AllocateResponse(container_responses=responses)

    def _answer(self, hcas: tuple[str, ...]) -> api_pb2.ContainerAllocateResponse:
        """The answer for these HCAs of the current view, built once per view: every ID of a
        shared pool names the same HCAs."""
        answer = self._answers.get(hcas)
        if answer is None:
            allocation = pools.allocation(self.view, hcas, self.dev_root)
            if self.cdi is not None:  # the runtime makes the nodes from the spec
                name = "_".join((self.view.pool.name, *hcas))
                answer = api_pb2.ContainerAllocateResponse(
                    envs=allocation.envs,
                    cdi_devices=[api_pb2.CDIDevice(name=self.cdi.add(name, allocation))],
                )
            else:
                answer = api_pb2.ContainerAllocateResponse(
                    envs=allocation.envs,
                    devices=[
                        api_pb2.DeviceSpec(
                            container_path=s.container_path,
                            host_path=s.host_path,
                            permissions=s.permissions,
                        )
                        for s in allocation.devices
                    ],
                )
            self._answers[hcas] = answer
        return answer

    async def PreStartContainer(
        self,
        request: api_pb2.PreStartContainerRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()
