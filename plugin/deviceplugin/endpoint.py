"""Registration that heals itself: serve -> check -> Register, and again whenever kubelet.sock
is re-created, our socket is deleted, or the kubelet ends ListAndWatch."""

from __future__ import annotations

import asyncio
import logging
import stat
from collections.abc import Awaitable
from pathlib import Path

import grpc

from common.terminal import one_line
from common.userfiles import file_kind
from plugin.config import Pool
from plugin.core.kube.cdi import SpecFile
from plugin.core.kube.sockets import (
    CHANNEL_OPTIONS,
    FileId,
    bind_problem,
    clear_stale_socket,
    connect_error,
    file_id,
    grpc_target,
)
from plugin.core.metrics.exposition import Metrics
from plugin.core.node import pools
from plugin.deviceplugin.api.v1beta1 import api_pb2, api_pb2_grpc
from plugin.deviceplugin.servicer import DevicePluginServicer
from plugin.launch import KUBELET_SOCKET, socket_name

logger = logging.getLogger(__name__)

API_VERSION = "v1beta1"
_BACKOFF_START, _BACKOFF_MAX = 0.1, 5.0
# Register is synchronous in the kubelet: it dials us back (up to 10 s) before answering. The
# connect before it gets as long: a kubelet.sock that never answers is retried with backoff.
_REGISTER_TIMEOUT = 15.0
# A kubelet answers a connection at once: one that has not after this long is said to be slow.
_SLOW = 1.0
# A ListAndWatch that lived this long was a working registration, not a kubelet bouncing us.
_STABLE = 10.0


class Endpoint:
    """One pool's plugin socket, its grpc server and servicer, and its registration loop: the
    only writer of all of them. It starts with no device; `update` gives it each scan."""

    def __init__(
        self,
        pool: Pool,
        dev_root: Path,
        plugin_dir: Path,
        metrics: Metrics,
        cdi: SpecFile | None = None,
    ) -> None:
        empty = pools.build_view(pool, (), rdma_cm=False)
        self._servicer = DevicePluginServicer(empty, dev_root, metrics, streams=self, cdi=cdi)
        self.path = plugin_dir / socket_name(pool.resource_name)  # length checked by the CLI
        self.metrics = metrics
        self.kubelet = plugin_dir / KUBELET_SOCKET
        # Bumped before each Register and each new server: a stream of an older registration
        # ending is the kubelet replacing it, not the kubelet dropping us.
        self._generation = 0
        self._server: grpc.aio.Server | None = None
        self._socket_id: FileId | None = None
        self.served = False  # its socket has been served at least once
        # Level-triggered: a wake only says "look again"; what to do follows from this state, so
        # a burst of events (a kubelet restart gives three) leads to one registration.
        self._registered_with: FileId | None = None  # the kubelet.sock we registered with
        self._stream_lost = False
        self._wake = asyncio.Event()
        self._said: str | None = None  # what we last said we wait for (each reason said once)
        self._registered_at = 0.0  # loop time of the last Register the kubelet accepted
        self._flap_backoff = 0.0

    @property
    def view(self) -> pools.PoolView:
        return self._servicer.view

    @property
    def unlisted(self) -> str | None:
        """Why IDs of the pool are not advertised to the kubelet, if any are not."""
        return self._servicer.unlisted

    async def update(self, view: pools.PoolView) -> None:
        await self._servicer.update(view)

    def wake(self) -> None:
        """Look again at the socket and the registration (something changed in the dir)."""
        self._wake.set()

    def stream_opened(self) -> int:
        return self._generation

    def stream_ended(self, token: int) -> None:
        if token != self._generation:
            return  # a replaced registration's stream
        logger.warning("%s: the kubelet ended ListAndWatch; registering again", self.resource)
        self._stream_lost = True
        self._wake.set()

    @property
    def resource(self) -> str:
        return self._servicer.resource

    @property
    def serving(self) -> bool:
        return (
            self._server is not None
            and self._socket_id is not None
            and self._socket_id == file_id(self.path)
        )

    @property
    def registered(self) -> bool:
        return (
            self.serving
            and not self._stream_lost
            and self._registered_with is not None
            and self._registered_with == file_id(self.kubelet)
        )

    async def run(self) -> None:
        """Until cancelled: keep the socket served and the kubelet informed; never crash."""
        backoff = _BACKOFF_START
        while True:
            self._wake.clear()
            if not self.serving:
                try:
                    await self._restart_server()
                except (OSError, RuntimeError, grpc.aio.AioRpcError) as exc:
                    # e.g. the device-plugins dir is missing (said by _bind_problem), or a
                    # starting kubelet deleted the socket before it answered
                    self.metrics.errors.labels(kind="serve").inc()
                    self._waiting(f"cannot serve {self.path}: {exc}", backoff)
                    # not woken early: the dir's events are mostly our own tries at binding
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, _BACKOFF_MAX)
                    continue
                backoff = _BACKOFF_START
            self._said = None
            if self._stream_lost and self.serving:
                await self._hold_off_a_flapping_kubelet()
            if not self.registered and not await self._register():
                continue  # woken while backing off: look again at once
            await self._wake.wait()

    async def _hold_off_a_flapping_kubelet(self) -> None:
        """A kubelet that ends each ListAndWatch right after the Register gets its next Register
        later and later (up to _BACKOFF_MAX), not thousands a minute; one whose stream lived a
        while, or a new kubelet (kubelet.sock made again), gets it at once."""
        lived = asyncio.get_running_loop().time() - self._registered_at
        if lived >= _STABLE or file_id(self.kubelet) != self._registered_with:  # a new kubelet
            self._flap_backoff = 0.0
            return
        self._flap_backoff = min(max(self._flap_backoff * 2, _BACKOFF_START), _BACKOFF_MAX)
        self._waiting(
            f"the kubelet ended ListAndWatch {lived:.1f}s after the Register (under {_STABLE:.0f}s "
            "again and again means a kubelet in trouble)",
            self._flap_backoff,
        )
        await asyncio.sleep(self._flap_backoff)

    async def _register_unless_moot(self, target: FileId | None) -> bool:
        """One Register, sent only to the kubelet.sock we looked at (`target`) before we saw our
        socket served; False when abandoned, before it was sent or while it was in flight,
        because our socket went away or kubelet.sock was re-created. A starting kubelet deletes
        the sockets in its dir before it listens: one whose kubelet.sock is newer than `target`
        has deleted ours, and a Register sent to it would wait for its 10 s dial to fail."""
        request = api_pb2.RegisterRequest(
            version=API_VERSION,
            endpoint=self.path.name,
            resource_name=self.resource,
            options=api_pb2.DevicePluginOptions(get_preferred_allocation_available=True),
        )
        async with grpc.aio.insecure_channel(
            grpc_target(self.kubelet), options=CHANNEL_OPTIONS
        ) as channel:
            # connected, and to `target` only if it is still the file there
            slow = self._said_if_slow(f"waiting for {self.kubelet} to complete a gRPC connection")
            try:
                ready = self._connected(channel)
                if not await self._unless_moot(ready, target) or self._moot(target):
                    return False
            finally:
                slow.cancel()
            slow = self._said_if_slow(
                f"waiting for the kubelet to answer Register (it dials {self.path.name} back)"
            )
            try:
                call = api_pb2_grpc.RegistrationStub(channel).Register(
                    request, timeout=_REGISTER_TIMEOUT
                )
                if not await self._unless_moot(call, target):
                    return False
            finally:
                slow.cancel()
        self._wake.set()  # whatever woke us while the call ran: the run loop looks again
        return True

    def _moot(self, target: FileId | None) -> bool:
        """Our socket is gone or kubelet.sock is no longer `target`: a registration must start
        over."""
        if self.serving and file_id(self.kubelet) == target:
            return False
        logger.info(
            "%s: %s changed while registering: starting over",
            self.resource,
            self.path.name if not self.serving else KUBELET_SOCKET,
        )
        return True

    async def _unless_moot(self, work: Awaitable[object], target: FileId | None) -> bool:
        """Await `work`; False (and `work` cancelled) if, woken meanwhile, the registration
        turned moot. Raises what `work` raises."""
        task = asyncio.ensure_future(work)
        try:
            while not task.done():
                self._wake.clear()
                woken = asyncio.ensure_future(self._wake.wait())
                await asyncio.wait({task, woken}, return_when=asyncio.FIRST_COMPLETED)
                woken.cancel()
                if not task.done() and self._moot(target):
                    return False
            task.result()
            return True
        finally:
            task.cancel()

    async def _sleep_unless_woken(self, seconds: float) -> bool:
        """True when woken before `seconds` passed."""
        try:  # asyncio.timeout, not wait_for: 3.11's wait_for can lose a cancel (a SIGTERM)
            async with asyncio.timeout(seconds):
                await self._wake.wait()
        except TimeoutError:
            return False
        return True

    async def _connected(self, channel: grpc.aio.Channel) -> None:
        """Until `channel` to kubelet.sock is connected (TimeoutError after _REGISTER_TIMEOUT);
        at its first failure, UnreachableError saying why (grpc would otherwise retry quietly,
        with backoff, until the timeout)."""
        async with asyncio.timeout(_REGISTER_TIMEOUT):
            state = channel.get_state(try_to_connect=True)
            while state != grpc.ChannelConnectivity.READY:
                if state == grpc.ChannelConnectivity.TRANSIENT_FAILURE:
                    raise UnreachableError(connect_error(self.kubelet))
                await channel.wait_for_state_change(state)
                state = channel.get_state(try_to_connect=True)

    def _said_if_slow(self, waiting_for: str) -> asyncio.TimerHandle:
        """Say what we wait for if it takes longer than a kubelet ever does (cancel when done)."""
        return asyncio.get_running_loop().call_later(
            _SLOW,
            lambda: logger.warning(
                "%s: %s (%.0fs so far, waiting up to %.0fs)",
                self.resource,
                waiting_for,
                _SLOW,
                _REGISTER_TIMEOUT,
            ),
        )

    async def stop(self) -> None:
        await self._servicer.stop_streams()
        if self._server is not None:
            await self._server.stop(grace=1)
            self._server = None
        if self._socket_id is not None and file_id(self.path) == self._socket_id:
            self.path.unlink(missing_ok=True)

    async def _restart_server(self) -> None:
        # The old server deletes its socket by path when it stops: stop it before binding anew.
        self._generation += 1
        if self._server is not None:
            await self._server.stop(grace=0)
        clear_stale_socket(self.path)  # the run loop waits, saying why
        why = bind_problem(self.path)
        if why is not None:  # said plainly, and grpc's own error line never printed
            raise OSError(why)
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(self._servicer, server)
        server.add_insecure_port(grpc_target(self.path))
        await server.start()
        self._server, self._socket_id = server, file_id(self.path)
        self.served = True
        # the kubelet must dial the new socket; a stream lost on the old one is no kubelet
        # ending streams on this one, to be held off as a flap
        self._registered_with = None
        self._stream_lost = False
        async with grpc.aio.insecure_channel(grpc_target(self.path), options=CHANNEL_OPTIONS) as ch:
            await api_pb2_grpc.DevicePluginStub(ch).GetDevicePluginOptions(
                api_pb2.Empty(), timeout=5
            )
        logger.info("%s: serving %s", self.resource, self.path)

    @property
    def waiting_for(self) -> str | None:
        """What keeps it from serving the kubelet now (a registration failing), if anything."""
        return self._said

    def _waiting(self, why: str, backoff: float) -> None:
        """Say at once what we wait for and why; a reason already said goes to debug."""
        level = logging.DEBUG if why == self._said else logging.WARNING
        logger.log(level, "%s: %s; looking again in %.1fs", self.resource, why, backoff)
        self._said = why

    async def _register(self) -> bool:
        """Register, retrying with backoff; False when woken to start over."""
        backoff = _BACKOFF_START
        kubelet = self.kubelet
        while True:
            # kubelet.sock looked at before our socket is: see _register_unless_moot
            target = file_id(kubelet)
            if not self.serving:  # a kubelet starting up may delete our socket at any point
                return False
            why = _not_a_kubelet(kubelet)
            if why is None:
                self._generation += 1
                self._stream_lost = False
                self._registered_with = None
                try:
                    if not await self._register_unless_moot(target):
                        return False
                except (grpc.aio.AioRpcError, TimeoutError, UnreachableError) as exc:
                    self.metrics.registrations.labels(self.resource, "error").inc()
                    if isinstance(exc, grpc.aio.AioRpcError) and (
                        exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                    ):
                        why = (
                            f"the kubelet did not answer Register within "
                            f"{_REGISTER_TIMEOUT:.0f}s (a hung kubelet?)"
                        )
                    elif isinstance(exc, grpc.aio.AioRpcError):
                        why = (
                            f"the kubelet refused Register ({exc.code().name}: "
                            f"{one_line(exc.details() or '')})"
                        )
                    elif isinstance(exc, UnreachableError):
                        why = f"waiting for the kubelet: {kubelet} {exc}"
                    else:
                        why = (
                            f"waiting for the kubelet: {kubelet} completed no gRPC connection "
                            f"within {_REGISTER_TIMEOUT:.0f}s (a hung kubelet?)"
                        )
                else:
                    self._registered_with = target
                    self._registered_at = asyncio.get_running_loop().time()
                    self._said = None
                    self.metrics.registrations.labels(self.resource, "ok").inc()
                    logger.info("%s: registered with the kubelet", self.resource)
                    return True
            else:
                why = f"waiting for the kubelet: {kubelet} {why}"
            self._waiting(why, backoff)
            if await self._sleep_unless_woken(backoff):
                return False
            backoff = min(backoff * 2, _BACKOFF_MAX)


class UnreachableError(Exception):
    """kubelet.sock is a socket, but connecting to it fails; the message says how."""


def _not_a_kubelet(path: Path) -> str | None:
    """Why `path` cannot be a listening kubelet's socket, from its file alone (None: it can)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        if path.is_symlink():
            return "is a dangling symlink: remove it (the kubelet creates its socket there)"
        return "does not exist yet (the kubelet creates it when it starts)"
    except OSError as exc:
        return f"cannot be looked at ({exc.strerror})"
    if not stat.S_ISSOCK(mode):
        return (
            f"is {file_kind(mode)}, not a socket: something else made it; remove it so that "
            "the kubelet can listen there"
        )
    return None
