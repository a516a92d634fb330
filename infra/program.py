"""main(): wire the components together from the stack config and export the outputs; run():
main() under the engine."""

from __future__ import annotations

from typing import Any

import pulumi

from infra.components.alicloud import Provider as AlicloudProvider
from infra.components.cluster import Cluster, ExistingCluster
from infra.components.jobs import RdmaJob, RdmaJobArgs
from infra.components.monitoring import MonitoringArgs, RdmaMonitoring
from infra.components.network import Network
from infra.components.node_agent import DevicePluginArgs, RdmaDevicePlugin
from infra.stack import model as config
from infra.stack.keys import StackConfigError
from infra.stack.model import AckCluster, CreateCluster, StackConfig
from infra.stack.samples import SAMPLES, resolve_host_network
from plugin.dra.devices import device_class_name
from plugin.launch import DraLaunchSpec

NAME = "lingjun-rdma"


def main() -> dict[str, pulumi.Output[Any]]:
    """Build the stack; returns what it exported (the offline render reads it)."""
    cfg = config.load()
    # Every Job's network mode is decided, and refused if it cannot work, before the first
    # resource is planned.
    jobs = [
        (spec, resolve_host_network(spec, cfg.non_host_network))
        for spec in (SAMPLES[s.name].build(s.image) for s in cfg.samples)
    ]

    clouds: list[pulumi.ProviderResource] = (
        [AlicloudProvider("alicloud", region=cfg.region)] if cfg.needs_cloud else []
    )
    in_region = pulumi.ResourceOptions(providers=clouds)
    exports: dict[str, pulumi.Output[Any]] = {}
    cluster = cfg.cluster
    cluster_id: pulumi.Input[str] | None = None  # an ACK cluster's
    if isinstance(cluster, CreateCluster):
        network = Network(f"{NAME}-net", cluster.network, opts=in_region)
        created = Cluster(f"{NAME}-cluster", cluster, network, opts=in_region)
        provider, kubeconfig = created.provider, created.kubeconfig
        exports["clusterId"] = cluster_id = created.cluster_id
        exports["nodePoolId"] = created.node_pool_id
        exports["vpcId"] = network.vpc_id
    else:
        existing = ExistingCluster(f"{NAME}-cluster", cluster, opts=in_region)
        provider, kubeconfig = existing.provider, existing.kubeconfig
        cluster_id = cluster.cluster_id if isinstance(cluster, AckCluster) else None
        exports["clusterId"] = pulumi.Output.from_input(cluster_id or "")
    exports["kubeconfig"] = kubeconfig

    in_cluster = pulumi.ResourceOptions(providers=[*clouds, provider])
    # named after what it runs: its DaemonSet, ServiceAccount, ConfigMap and RBAC too
    agent = "rdma-dra-driver" if cfg.dra else "rdma-device-plugin"
    plugin = RdmaDevicePlugin(agent, _plugin_args(cfg), opts=in_cluster)
    exports["pluginDaemonSet"] = plugin.daemonset_name
    exports["agentNodeSelector"] = pulumi.Output.from_input(
        ",".join(f"{k}={v}" for k, v in cfg.node_selector.items())
    )
    exports["agentNodes"] = plugin.nodes
    exports["pluginImage"] = plugin.image
    if cfg.monitoring != "none":
        RdmaMonitoring(
            "rdma-monitoring",
            MonitoringArgs(
                mode=cfg.monitoring,
                namespace=cfg.namespace,
                pod_labels=plugin.pod_labels,
                rescan_interval=cfg.plugin_launch.rescan_interval,
                port_counters=cfg.plugin_launch.port_counters == "on",
                non_host_network=cfg.non_host_network,
                pod_qps=cfg.plugin_launch.pod_qps == "on",
                arms_cluster_id=cluster_id,
            ),
            opts=pulumi.ResourceOptions.merge(
                in_cluster, pulumi.ResourceOptions(depends_on=[plugin])
            ),
        )
    rdma_jobs = [
        RdmaJob(
            spec.name,
            RdmaJobArgs(
                spec=spec,
                namespace=cfg.namespace,
                resource_name=cfg.resource_name,
                host_network=host_network,
                plugin_image=plugin.image,
                deadline_seconds=cfg.job_deadline_seconds,
                device_class=_device_class(cfg),
            ),
            opts=pulumi.ResourceOptions.merge(
                in_cluster, pulumi.ResourceOptions(depends_on=[plugin])
            ),
        )
        for spec, host_network in jobs
    ]
    exports["jobNames"] = pulumi.Output.all(*[j.job_name for j in rdma_jobs])
    for key, value in exports.items():
        pulumi.export(key, value)
    return exports


def _plugin_args(cfg: StackConfig) -> DevicePluginArgs:
    return DevicePluginArgs(
        namespace=cfg.namespace,
        plugin_config=cfg.plugin,
        launch=cfg.plugin_launch,
        image=cfg.plugin_image,
        registry_namespace=f"{NAME}-{pulumi.get_stack()}",
        await_timeout=cfg.plugin_await_timeout,
        node_selector=cfg.node_selector,
    )


def _device_class(cfg: StackConfig) -> str | None:
    """DRA: the DeviceClass of the stack's pool mode, which the Jobs' claims ask."""
    launch = cfg.plugin_launch
    if not isinstance(launch, DraLaunchSpec):
        return None
    return device_class_name(launch.driver_name, cfg.plugin.pools[0].mode)


def run() -> None:
    """main() under the engine (`pulumi up`, deploy): a config refused there (a secret only
    the CLI decrypts is checked there) is its lines, as render says them, not a traceback."""
    try:
        main()
    except StackConfigError as exc:
        raise pulumi.RunError(str(exc)) from None
