"""Entry point of the DRA driver: flags into a DraLaunchSpec, logging, the config, the
discovery, the API server's credentials and the node's name, chosen once; the single-instance
lock; every refusal here is exit 2 with one line naming what to fix."""

from __future__ import annotations

import asyncio
import logging

from common.secret import hold
from common.terminal import exit_on_signals, ignore_stops, say, start_log
from plugin import launch
from plugin.config import ConfigError, dra_name_problem, load_config, token_in
from plugin.core.kube import instance
from plugin.core.kube.kubeapi import CredentialsError, KubeApi
from plugin.core.node.discovery.choose import choose_discovery
from plugin.core.node.discovery.model import DiscoveryError
from plugin.launch import DRA_PROG as PROG
from plugin.launch import NODE_NAME_ENV, DraLaunchSpec

logger = logging.getLogger("plugin")


def main(argv: list[str] | None = None) -> int:
    spec = launch.parse(
        argv,
        DraLaunchSpec,
        PROG,
        "Kubernetes DRA driver for RDMA HCAs (resource.k8s.io/v1): shared and exclusive",
    )
    start_log(spec.log_level)
    named = launch.with_node_name(spec)
    if isinstance(named, str):
        say(f"{PROG}: {named}")
        return 2
    spec = named
    node = spec.node_name
    if not node:
        say(f"{PROG}: no node name: pass --node-name, or set ${NODE_NAME_ENV}")
        return 2
    try:
        config = load_config(spec.config_path, explicit=spec.config is not None)
        api = (  # before discovery, which may log: a refusal is the one line said
            KubeApi.from_kubeconfig(spec.kubeconfig)
            if spec.kubeconfig is not None
            else KubeApi.in_cluster()
        )
        hold(api.mask)
        if (refused := token_in(config) or dra_name_problem(config)) is not None:
            raise refused
        discovery = choose_discovery(spec.discovery, spec.sysfs_root, spec.dev_root)
    except (ConfigError, DiscoveryError, CredentialsError, OSError) as exc:
        say(f"{PROG}: {exc}")
        return 2
    logger.info(
        "driver %s on node %s; discovery: %s; pools: %s",
        spec.driver_name,
        node,
        discovery.name,
        ", ".join(f"{p.name} ({p.mode})" for p in config.pools),
    )
    own = spec.plugins_dir / spec.driver_name  # its sockets, checkpoint and lock
    if own.exists() and not own.is_dir():
        say(f"{PROG}: --plugins-dir: {own} is not a directory: move it away")
        return 2
    exit_on_signals(PROG, "before serving")
    try:
        with instance.held(own):
            from plugin.dra import driver  # grpc's import: paid once the driver serves

            code = asyncio.run(driver.run(spec, node, config, discovery, api))
            ignore_stops()
            return code
    except instance.LockError as exc:
        say(f"{PROG}: --plugins-dir {exc}")
        return 2
