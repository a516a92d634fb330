"""The running DRA driver: the core's node state (the same HealthWatcher the device plugin
runs) feeding the Preparer and the ResourceSlices, the kubelet's two gRPC services on their
sockets, and the metrics server; stopped on a signal or a crash."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

import grpc

from common.terminal import one_line, say, stop_on_signals
from common.userfiles import why_not_made, why_not_writable
from plugin.config import PluginConfig
from plugin.core.kube import cdi
from plugin.core.kube.kubeapi import KubeApi
from plugin.core.kube.node_events import NodeEvents
from plugin.core.kube.sockets import bind_problem, clear_stale_socket, grpc_target
from plugin.core.metrics.exposition import listen_problem, serve_http
from plugin.core.metrics.scrape import metrics_for
from plugin.core.node import pools
from plugin.core.node.discovery.model import Discovery
from plugin.core.node.health import HealthWatcher
from plugin.core.node.problems import HCA_SKIPPED, REGISTRATION, NodeProblem
from plugin.dra.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from plugin.dra.prepare import Preparer
from plugin.dra.servicer import RegistrationServicer, add_dra_services
from plugin.dra.slices import SlicePublisher
from plugin.launch import DRA_PROG as PROG
from plugin.launch import DraLaunchSpec, cdi_kind, dra_socket, registration_socket

logger = logging.getLogger(__name__)


# The kubelet's dirs are root's: a driver run by another user cannot serve there.
_WRITABLE = "run the driver as root, as its DaemonSet does, or name a directory this user can write"


def _bind(path: Path, server: grpc.aio.Server) -> str | None:
    """None when `server` will listen at `path`, else why it cannot (never by deleting what is
    not a socket a crashed run left)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"{path.parent} {why_not_made(path.parent, exc)}"
    # before grpc binds: its own failure is a raw log line of grpc core's, then "Failed to bind"
    if (why := why_not_writable(path.parent)) is not None:
        return f"{path.parent} {why}: {_WRITABLE}"
    try:
        clear_stale_socket(path)
        server.add_insecure_port(grpc_target(path))
    except OSError as exc:
        return str(exc) if exc.strerror is None else f"{path.parent}: {exc.strerror}"
    except RuntimeError:  # grpc's "Failed to bind": the plain bind says why
        return bind_problem(path) or f"{path}: cannot be bound"
    return None


async def run(
    spec: DraLaunchSpec, node: str, config: PluginConfig, discovery: Discovery, api: KubeApi
) -> int:
    """Serve until SIGTERM, SIGINT or SIGHUP (0) or a crash (1); a metrics address that
    cannot be bound is a bad flag (2)."""
    driver = spec.driver_name
    metrics = metrics_for(spec)
    preparer = Preparer(
        api,
        driver,
        node,
        cdi_kind(driver),
        spec.cdi_dir,
        spec.plugins_dir / driver / "claims",
        spec.dev_root,
    )
    publisher = SlicePublisher(api, driver, node)
    if (why := cdi.dir_problem(spec.cdi_dir)) is not None:
        logger.error("%s: no claim can be prepared until it is fixed", why)
    registered = False
    events = NodeEvents(api, node, PROG)
    refused: list[NodeProblem] = []  # the kubelet's refusal of the registration, while it stands
    metrics.registration(lambda: {driver: registered})

    async def publish(views: Sequence[pools.PoolView]) -> None:
        publisher.update(preparer.update(views))

    def on_status(ok: bool, error: str) -> None:
        nonlocal registered
        registered = ok
        error = one_line(error)  # the kubelet's words
        refused[:] = (
            [] if ok else [NodeProblem(REGISTRATION, f"the kubelet refused {driver}: {error}")]
        )
        if ok:
            logger.info("registered with the kubelet as %s", driver)
            publisher.recheck()  # a starting kubelet wipes the node's slices
        else:
            logger.error("the kubelet refused the registration: %s", error)

    health = HealthWatcher(
        discovery,
        config,
        metrics,
        spec.rescan_interval,
        publish,
        events.report,
        lambda: [*refused, *(NodeProblem(HCA_SKIPPED, why) for why in preparer.skipped)],
    )
    await health.rescan()

    dra_path = dra_socket(spec.plugins_dir, driver)
    reg_path = registration_socket(spec.plugins_registry_dir, driver)
    stop = asyncio.Event()
    # from before the first socket: a stop the moment one exists is a clean one (exit 0)
    stop_on_signals(stop)
    dra_server = grpc.aio.server()
    add_dra_services(dra_server, preparer, stop)
    if (why := _bind(dra_path, dra_server)) is not None:
        say(f"{PROG}: --plugins-dir: {why}")
        return 2
    try:  # before the first prepare is served
        preparer.recover()
    except OSError as exc:
        records = preparer.checkpoint.directory
        say(f"{PROG}: --plugins-dir: {records} {why_not_made(records, exc)}")
        return 2
    await dra_server.start()
    reg_server = grpc.aio.server()
    reg_grpc.add_RegistrationServicer_to_server(
        RegistrationServicer(driver, str(dra_path), on_status), reg_server
    )
    if (why := _bind(reg_path, reg_server)) is not None:
        await dra_server.stop(grace=None)
        say(f"{PROG}: --plugins-registry-dir: {why}")
        return 2
    await reg_server.start()
    logger.info("serving %s; registration at %s", dra_path, reg_path)

    http = None
    if spec.metrics_port is not None:
        try:
            http = await serve_http(
                spec.metrics_host, spec.metrics_port, metrics, lambda: registered
            )
        except (OSError, ValueError) as exc:
            say(f"{PROG}: --metrics-address: {listen_problem(exc, spec.metrics_port)}")
            return 2

    code = 0
    tasks = [
        asyncio.create_task(health.run(), name="health"),
        asyncio.create_task(publisher.run(), name="slices"),
        asyncio.create_task(publisher.watch(), name="slices-watch"),
    ]
    stopper = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
    for task in done:
        if task is not stopper and task.exception() is not None:
            logger.error("%s crashed", task.get_name(), exc_info=task.exception())
            code = 1
    logger.info("stopping")
    for task in [*tasks, stopper]:
        task.cancel()
    # the registration socket first: the kubelet deregisters us, and wipes our slices if we
    # stay away (its grace period lets a restart keep them)
    await reg_server.stop(grace=None)
    reg_path.unlink(missing_ok=True)
    await dra_server.stop(grace=1)
    dra_path.unlink(missing_ok=True)
    if http is not None:
        http.close()
        await http.wait_closed()
    return code
