"""Entry point: flags into a LaunchSpec, logging, the config and the discovery chosen once,
the single-instance lock; every refusal here is exit 2 with one line naming what to fix."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from common.secret import hold
from common.terminal import exit_on_signals, ignore_stops, say, start_log
from plugin import launch
from plugin.config import ConfigError, PluginConfig, load_config, token_in
from plugin.core.kube import instance
from plugin.core.kube.kubeapi import CredentialsError, KubeApi
from plugin.core.node.discovery.choose import choose_discovery
from plugin.core.node.discovery.model import DiscoveryError
from plugin.launch import MAX_UNIX_PATH, socket_name

logger = logging.getLogger("plugin")


def check_socket_paths(plugin_dir: Path, config: PluginConfig) -> None:
    """Each pool's socket must fit a unix socket address, or bind fails later, obscurely."""
    for pool in config.pools:
        path = plugin_dir / socket_name(pool.resource_name)
        if len(os.fsencode(path)) > MAX_UNIX_PATH:
            raise ConfigError(
                f"--device-plugin-dir {plugin_dir}: the socket {path.name} there would be "
                f"{len(os.fsencode(path))} bytes long, over the {MAX_UNIX_PATH}-byte unix limit",
                fix="use a shorter directory (the kubelet's is /var/lib/kubelet/device-plugins) "
                "or a shorter resource name",
            )


def _api(spec: launch.LaunchSpec) -> KubeApi | None:
    """Where the node's Events go: --kubeconfig (refused when unusable), else the pod's service
    account when in a pod that names its node; None: problems are in the log only."""
    if spec.kubeconfig is not None:
        return KubeApi.from_kubeconfig(spec.kubeconfig)
    if not spec.node_name or not os.environ.get("KUBERNETES_SERVICE_HOST"):
        return None
    try:
        return KubeApi.in_cluster()
    except CredentialsError as exc:
        logger.warning("no Events on the Node: %s", exc)
        return None


def main(argv: list[str] | None = None) -> int:
    spec = launch.parse(argv, launch.LaunchSpec)
    start_log(spec.log_level)
    named = launch.with_node_name(spec)
    if isinstance(named, str):
        say(f"rdma-device-plugin: {named}")
        return 2
    spec = named
    try:
        config = load_config(spec.config_path, explicit=spec.config is not None)
        check_socket_paths(spec.device_plugin_dir, config)
        api = _api(spec)  # before discovery, which may log: a refusal is the one line said
        if api is not None:
            hold(api.mask)
        if (refused := token_in(config)) is not None:
            raise refused
        discovery = choose_discovery(spec.discovery, spec.sysfs_root, spec.dev_root)
    except (ConfigError, DiscoveryError, CredentialsError) as exc:
        say(f"rdma-device-plugin: {exc}")
        return 2
    logger.info(
        "discovery: %s; pools: %s",
        discovery.name,
        ", ".join(f"{p.resource_name} ({p.mode})" for p in config.pools),
    )
    # Until the loop's own handlers (a stop then removes the socket and exits 0): while waiting
    # for the lock, or during the first scan, a stop signal is one line and 128+n.
    exit_on_signals("rdma-device-plugin", "before serving")
    try:
        with instance.held(spec.device_plugin_dir):
            from plugin.deviceplugin import supervisor  # grpc's import: paid once it serves

            code = asyncio.run(supervisor.run(spec, config, discovery, api))
            ignore_stops()
            return code
    except instance.LockError as exc:
        say(f"rdma-device-plugin: --device-plugin-dir {exc}")
        return 2
