"""Entry point: flags, logging, signals, and wiring the pieces together."""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import signal
import sys
from pathlib import Path

from plugin import instance
from plugin.config import (
    DEFAULT_CONFIG_PATH,
    DEFAULT_DEVICE_PLUGIN_DIR,
    DEFAULT_METRICS_PORT,
    ConfigError,
    PluginConfig,
    load_config,
)
from plugin.discovery.model import Discovery, DiscoveryError, Inventory
from plugin.discovery.sysfs import SysfsDiscovery
from plugin.health import HealthWatcher
from plugin.kubelet import MAX_UNIX_PATH, DirWatcher, Endpoint, socket_name
from plugin.metrics import Metrics, serve_http
from plugin.pool import assign
from plugin.server import DevicePluginServicer

logger = logging.getLogger("plugin")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="rdma-device-plugin", description="Kubernetes device plugin for RDMA HCAs (rdma/hca)"
    )
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help=f"plugin config (default {DEFAULT_CONFIG_PATH}; absent: defaults)",
    )
    p.add_argument("--sysfs-root", type=Path, default=Path("/sys"))
    p.add_argument("--dev-root", type=Path, default=Path("/dev"))
    p.add_argument("--device-plugin-dir", type=Path, default=DEFAULT_DEVICE_PLUGIN_DIR)
    p.add_argument(
        "--discovery",
        choices=["auto", "verbs", "sysfs"],
        default="auto",
        help="auto: verbs when pyverbs finds devices, else sysfs",
    )
    p.add_argument(
        "--rescan-interval",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="periodic re-scan, the backstop behind netlink events",
    )
    p.add_argument(
        "--metrics-address",
        default=f"0.0.0.0:{DEFAULT_METRICS_PORT}",
        help="HOST:PORT for /metrics and /healthz; empty disables",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = p.parse_args(argv)
    if not (math.isfinite(args.rescan_interval) and args.rescan_interval > 0):
        p.error(f"--rescan-interval {args.rescan_interval}: must be a number of seconds > 0")
    if args.metrics_address:
        _, sep, port = args.metrics_address.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
            p.error(
                f"--metrics-address {args.metrics_address}: expected HOST:PORT with a port "
                "0-65535, or an empty value to disable"
            )
    return args


def check_socket_paths(plugin_dir: Path, config: PluginConfig) -> None:
    """Each pool's socket must fit a unix socket address, or bind fails later, obscurely."""
    for pool in config.pools:
        path = plugin_dir / socket_name(pool.resource_name)
        if len(os.fsencode(path)) > MAX_UNIX_PATH:
            raise ConfigError(
                f"--device-plugin-dir {plugin_dir}: the socket {path.name} there would be "
                f"{len(os.fsencode(path))} bytes long, over the {MAX_UNIX_PATH}-byte unix "
                "limit: use a shorter directory (the kubelet's is /var/lib/kubelet/device-plugins)"
            )


def choose_discovery(kind: str, sysfs_root: Path, dev_root: Path) -> Discovery:
    if kind == "sysfs":
        return SysfsDiscovery(sysfs_root, dev_root)
    try:
        from plugin.discovery.verbs import VerbsDiscovery
    except ImportError as exc:
        if kind == "verbs":
            raise DiscoveryError(f"--discovery verbs needs pyverbs ({exc})") from exc
        logger.info("pyverbs unavailable (%s): sysfs discovery", exc)
        return SysfsDiscovery(sysfs_root, dev_root)
    verbs = VerbsDiscovery(sysfs_root, dev_root)
    if kind == "verbs":
        return verbs
    try:
        verbs.check_usable()
    except DiscoveryError as exc:
        logger.info("%s: sysfs discovery", exc)
        return SysfsDiscovery(sysfs_root, dev_root)
    return verbs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = load_config(args.config or DEFAULT_CONFIG_PATH, explicit=args.config is not None)
        check_socket_paths(args.device_plugin_dir, config)
        discovery = choose_discovery(args.discovery, args.sysfs_root, args.dev_root)
    except (ConfigError, DiscoveryError) as exc:
        print(f"rdma-device-plugin: {exc}", file=sys.stderr)
        return 2
    logger.info(
        "discovery: %s; pools: %s",
        discovery.name,
        ", ".join(f"{p.resource_name} ({p.mode})" for p in config.pools),
    )
    with instance.acquire(args.device_plugin_dir):
        return asyncio.run(run(args, config, discovery))


async def watch_config(
    path: Path, running: PluginConfig, *, explicit: bool, every: float = 2.0
) -> None:
    """A config that changes on disk is not applied live: say so once per change, so that an
    edit nobody restarted for does not go unnoticed (the DaemonSet rolls on a ConfigMap change)."""
    said: PluginConfig | str | None = None
    while True:
        await asyncio.sleep(every)
        try:
            on_disk: PluginConfig | str = load_config(path, explicit=explicit)
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


async def run(args: argparse.Namespace, config: PluginConfig, discovery: Discovery) -> int:
    metrics = Metrics()
    watcher = HealthWatcher(discovery, config, metrics, args.rescan_interval)
    try:
        views = watcher.scan()
    except Exception:
        logger.exception("first scan failed; starting with no devices")
        views, _ = assign(config, Inventory())
    endpoints: list[Endpoint] = []
    for view in views:
        servicer = DevicePluginServicer(view, args.dev_root, metrics)
        watcher.servicers[view.pool.name] = servicer
        endpoints.append(Endpoint(servicer, args.device_plugin_dir, metrics))

    def on_dir_event(name: str) -> None:
        logger.debug("device-plugins dir: %s changed", name)
        for e in endpoints:
            e.wake()

    http = None
    if args.metrics_address:
        host, _, port = args.metrics_address.rpartition(":")
        try:
            http = await serve_http(
                host.strip("[]"), int(port), metrics, lambda: all(e.serving for e in endpoints)
            )
        except (OSError, ValueError) as exc:
            print(
                f"rdma-device-plugin: --metrics-address {args.metrics_address}: {exc}: "
                "use a free HOST:PORT, or an empty value to disable",
                file=sys.stderr,
            )
            return 2

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # SIGHUP stops like SIGTERM (socket removed, exit 0): a config change takes a restart, which
    # the DaemonSet's config-hash annotation rolls; a hangup never kills the plugin outright.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.create_task(e.run(), name=f"endpoint {e.path.name}") for e in endpoints]
    tasks.append(asyncio.create_task(watcher.run(), name="health"))
    config_path = args.config or DEFAULT_CONFIG_PATH
    tasks.append(
        asyncio.create_task(
            watch_config(config_path, config, explicit=args.config is not None),
            name="config watcher",
        )
    )
    tasks.append(
        asyncio.create_task(
            DirWatcher(args.device_plugin_dir, on_dir_event).run(), name="dir watcher"
        )
    )
    stopper = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
    code = 0
    for task in done:
        if task is not stopper and task.exception() is not None:
            logger.error("%s crashed", task.get_name(), exc_info=task.exception())
            code = 1
    logger.info("stopping")
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    stopper.cancel()
    for e in endpoints:
        await e.stop()
    if http is not None:
        http.close()
        await http.wait_closed()
    return code
