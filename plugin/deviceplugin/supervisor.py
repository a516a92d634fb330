"""The running plugin: builds the owners (node state, one endpoint per pool, event sources,
the metrics server), runs them as one task group, and stops them on a signal or a crash."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Coroutine, Sequence
from pathlib import Path

from common.terminal import first_stop, say, stop_on_signals
from plugin.config import ConfigError, PluginConfig, Pool, load_config
from plugin.core.kube.cdi import SpecFile
from plugin.core.kube.kubeapi import KubeApi
from plugin.core.kube.node_events import NodeEvents
from plugin.core.metrics.exposition import listen_problem, serve_http
from plugin.core.metrics.scrape import metrics_for
from plugin.core.node import pools
from plugin.core.node.discovery.model import Discovery
from plugin.core.node.health import HealthWatcher
from plugin.core.node.kernel_events import DirWatcher
from plugin.core.node.problems import POOL_TOO_LARGE, REGISTRATION, NodeProblem
from plugin.deviceplugin.endpoint import Endpoint
from plugin.launch import DRA_DRIVER, LaunchSpec, cdi_kind, cdi_spec_name

logger = logging.getLogger(__name__)

PROG = "rdma-device-plugin"


class _StopSignalError(Exception):
    """Raised into the task group by a stop signal, to cancel every task."""


class _TaskCrashedError(Exception):
    """A task of the group raised; its message is the task's name, its cause what it raised."""


async def _named(name: str, work: Coroutine[object, object, None]) -> None:
    try:
        await work
    except Exception as exc:
        raise _TaskCrashedError(name) from exc


async def run(
    spec: LaunchSpec, config: PluginConfig, discovery: Discovery, api: KubeApi | None = None
) -> int:
    """Serve until SIGTERM, SIGINT or SIGHUP (0), or until a task crashes (1); a metrics
    address that cannot be bound is a bad flag (2)."""
    metrics = metrics_for(spec)
    endpoints = {
        p.name: Endpoint(p, spec.dev_root, spec.device_plugin_dir, metrics, _cdi(spec, p))
        for p in config.pools
    }
    metrics.registration(lambda: {e.resource: e.registered for e in endpoints.values()})

    async def publish(views: Sequence[pools.PoolView]) -> None:
        for view in views:
            await endpoints[view.pool.name].update(view)

    def wake_endpoints(name: str) -> None:
        logger.debug("device-plugins dir: %s changed", name)
        for e in endpoints.values():
            e.wake()

    events = NodeEvents(api, spec.node_name, PROG)

    def own_problems() -> list[NodeProblem]:
        waits = [NodeProblem(REGISTRATION, f"{e.resource}: {w}") for e in endpoints.values()
                 if (w := e.waiting_for) is not None]  # fmt: skip
        unlisted = [NodeProblem(POOL_TOO_LARGE, u) for e in endpoints.values()
                    if (u := e.unlisted) is not None]  # fmt: skip
        return [*waits, *unlisted]

    health = HealthWatcher(
        discovery, config, metrics, spec.rescan_interval, publish, events.report, own_problems
    )
    await health.rescan()  # the first views, before any socket is served
    http = None
    if spec.metrics_port is not None:
        try:
            http = await serve_http(
                spec.metrics_host,
                spec.metrics_port,
                metrics,
                lambda: all(e.serving for e in endpoints.values()),
            )
        except (OSError, ValueError) as exc:
            say(
                f"rdma-device-plugin: --metrics-address: {listen_problem(exc, spec.metrics_port)} "
                "(or an empty value to disable)"
            )
            return 2

    stop = asyncio.Event()
    # SIGHUP stops like SIGTERM (socket removed, exit 0): a config change takes a restart, which
    # the DaemonSet's config-hash annotation rolls; a hangup never kills the plugin outright.
    stop_on_signals(stop)
    code = 0
    try:
        async with asyncio.TaskGroup() as tasks:
            for e in endpoints.values():
                tasks.create_task(_named(f"endpoint {e.path.name}", e.run()))
            tasks.create_task(_named("health", health.run()))
            tasks.create_task(
                _named(
                    "config watcher",
                    watch_config(spec.config_path, config, explicit=spec.config is not None),
                )
            )
            tasks.create_task(
                _named("dir watcher", DirWatcher(spec.device_plugin_dir, wake_endpoints).run())
            )
            await stop.wait()
            raise _StopSignalError
    except* _StopSignalError:
        pass
    except* _TaskCrashedError as crashed:
        for exc in crashed.exceptions:
            logger.error("%s crashed", exc, exc_info=exc.__cause__)
        code = 1
    logger.info("stopping")
    for e in endpoints.values():
        await e.stop()
    first = first_stop()
    if code == 0 and first is not None and not any(e.served for e in endpoints.values()):
        # still waiting (a missing dir), as in the wait for another instance: one line, 128+n
        say(f"{PROG}: stopped by {signal.Signals(first).name} before serving")
        code = 128 + first
    if http is not None:
        http.close()
        await http.wait_closed()
    return code


async def watch_config(
    path: Path, running: PluginConfig, *, explicit: bool, every: float = 2.0
) -> None:
    """A config that changes on disk is not applied live: say so once per change, so that an
    edit nobody restarted for does not go unnoticed (the DaemonSet rolls on a ConfigMap change)."""
    said: PluginConfig | str | None = None
    while True:
        await asyncio.sleep(every)
        try:  # off the loop: whatever the file holds, the servers keep answering meanwhile
            on_disk: PluginConfig | str = await asyncio.to_thread(
                load_config, path, explicit=explicit
            )
        except ConfigError as exc:
            on_disk = str(exc)
        if on_disk != running and on_disk != said:
            if isinstance(on_disk, str):
                logger.warning(
                    "config on disk changed and is invalid (%s): still running the one loaded "
                    "at start",
                    on_disk,
                )
            else:
                logger.warning(
                    "config %s changed on disk: restart the plugin to apply it (running the "
                    "one loaded at start)",
                    path,
                )
        said = on_disk


def _cdi(spec: LaunchSpec, pool: Pool) -> SpecFile | None:
    if spec.cdi_dir is None:
        return None
    kind = cdi_kind(DRA_DRIVER)
    return SpecFile(spec.cdi_dir, cdi_spec_name(pool.resource_name), kind, spec.dev_root)
