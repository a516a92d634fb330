"""A kubelet-like peer: serves the real Registration service on kubelet.sock and dials back
like the kubelet does (GetDevicePluginOptions inside Register, then ListAndWatch)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from plugin.core.kube.sockets import CHANNEL_OPTIONS, grpc_target
from plugin.deviceplugin.api.v1beta1 import api_pb2, api_pb2_grpc

# like the Go kubelet: no subchannel shared between channels
OPTIONS = CHANNEL_OPTIONS


@dataclass
class Registration:
    request: api_pb2.RegisterRequest
    options: api_pb2.DevicePluginOptions
    channel: grpc.aio.Channel
    stub: api_pb2_grpc.DevicePluginStub
    stream: grpc.aio.UnaryStreamCall[api_pb2.Empty, api_pb2.ListAndWatchResponse] | None = None
    updates: list[tuple[float, list[api_pb2.Device]]] = field(
        default_factory=list[tuple[float, list[api_pb2.Device]]]
    )


class KubeletPeer(api_pb2_grpc.RegistrationServicer):
    def __init__(self, plugin_dir: Path) -> None:
        self.dir = plugin_dir
        self.registrations: list[Registration] = []
        self._server: grpc.aio.Server | None = None
        self._changed = asyncio.Condition()
        self._tasks: set[asyncio.Task[None]] = set()
        # Runs as a Register arrives, before the dial back: what a starting kubelet does to the
        # dir at that moment (it deletes every socket there) can be staged here.
        self.on_register: Callable[[api_pb2.RegisterRequest], None] | None = None
        self.dial_timeout = 10.0
        self.refusal: str | None = None  # set: Register is refused with these words

    # -- the Registration service ----------------------------------------------------------
    async def Register(
        self,
        request: api_pb2.RegisterRequest,
        context: grpc.aio.ServicerContext[api_pb2.RegisterRequest, api_pb2.Empty],
    ) -> api_pb2.Empty:
        if request.version != "v1beta1":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "unsupported version")
        if self.refusal is not None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, self.refusal)
        if self.on_register is not None:
            self.on_register(request)
        channel = grpc.aio.insecure_channel(
            grpc_target(self.dir / request.endpoint), options=OPTIONS
        )
        stub = api_pb2_grpc.DevicePluginStub(channel)
        try:  # synchronous, as in kubelet 1.34: a plugin that does not answer fails Register;
            # the kubelet's dial blocks until the socket answers or its timeout (10 s)
            options = await stub.GetDevicePluginOptions(
                api_pb2.Empty(), timeout=self.dial_timeout, wait_for_ready=True
            )
        except grpc.aio.AioRpcError as exc:
            await channel.close()
            await context.abort(grpc.StatusCode.UNKNOWN, f"cannot dial plugin: {exc.details()}")
        old = self.current(request.resource_name)
        reg = Registration(request, options, channel, stub)
        self.registrations.append(reg)
        if old is not None and old.stream is not None:
            old.stream.cancel()  # the kubelet stops the replaced endpoint
        task = asyncio.create_task(self._watch(reg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        await self._notify()
        return api_pb2.Empty()

    async def _watch(self, reg: Registration) -> None:
        reg.stream = reg.stub.ListAndWatch(api_pb2.Empty())
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            async for response in reg.stream:
                reg.updates.append((time.perf_counter(), list(response.devices)))
                await self._notify()
        await self._notify()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # -- driving the peer ------------------------------------------------------------------
    async def start(self) -> None:
        server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(grpc_target(self.dir / "kubelet.sock"))
        await server.start()
        self._server = server

    async def stop(self) -> None:
        """Like a kubelet exiting: Registration goes away first, then every stream drops."""
        if self._server is not None:
            await self._server.stop(grace=0)
            self._server = None
        for reg in self.registrations:
            if reg.stream is not None:
                reg.stream.cancel()
            await reg.channel.close()

    async def restart(self) -> None:
        """What a kubelet restart does to the dir: every unix socket deleted, kubelet.sock anew."""
        await self.stop()
        for entry in os.scandir(self.dir):
            if stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
                os.unlink(entry.path)
        await self.start()

    def current(self, resource: str = "rdma/hca") -> Registration | None:
        regs = [r for r in self.registrations if r.request.resource_name == resource]
        return regs[-1] if regs else None

    def devices(self, resource: str = "rdma/hca") -> list[api_pb2.Device]:
        reg = self.current(resource)
        return reg.updates[-1][1] if reg is not None and reg.updates else []

    def health(self, resource: str = "rdma/hca") -> dict[str, str]:
        """Device ID -> Healthy/Unhealthy, as the last ListAndWatch update said."""
        return {d.ID: d.health for d in self.devices(resource)}

    async def wait_for(self, predicate: Callable[[], bool], limit: float = 10.0) -> None:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(predicate), limit)

    async def wait_registrations(
        self, count: int, resource: str = "rdma/hca", limit: float = 10.0
    ) -> Registration:
        """Wait until `count` registrations happened and the newest one has its first list."""

        def done() -> bool:
            regs = [r for r in self.registrations if r.request.resource_name == resource]
            return len(regs) >= count and bool(regs[-1].updates)

        await self.wait_for(done, limit)
        reg = self.current(resource)
        assert reg is not None
        return reg
