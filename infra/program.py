"""main(): wire the components together from the stack config and export the outputs."""

from __future__ import annotations

from typing import Any

import pulumi

from infra import config
from infra.alicloud import Provider as AlicloudProvider
from infra.cluster import Cluster, ClusterArgs, ExistingCluster, LingjunGroup
from infra.config import StackConfig
from infra.device_plugin import DevicePluginArgs, ImageBuild, RdmaDevicePlugin
from infra.jobs import RdmaJob, RdmaJobArgs, resolve_host_network, sample
from infra.network import Network, NetworkArgs
from plugin.config import PluginConfig, Pool

NAME = "lingjun-rdma"


def main() -> dict[str, pulumi.Output[Any]]:
    """Build the stack; returns what it exported (the offline render reads it)."""
    cfg = config.load()
    # Every Job's network mode is checked before the first resource is planned.
    specs = [sample(job, _image(cfg, job)) for job in cfg.sample_jobs]
    for spec in specs:
        resolve_host_network(spec, cfg.non_host_network)

    # Only where something talks to Alibaba Cloud: an adopted kubeconfig needs no cloud account.
    needs_cloud = cfg.creates_cluster or cfg.cluster_id is not None or cfg.plugin_image_build
    clouds: list[pulumi.ProviderResource] = (
        [AlicloudProvider("alicloud", region=cfg.region)] if needs_cloud else []
    )
    in_region = pulumi.ResourceOptions(providers=clouds)
    exports: dict[str, pulumi.Output[Any]] = {}
    if cfg.creates_cluster:
        network = Network(f"{NAME}-net", _network_args(cfg), opts=in_region)
        cluster = Cluster(f"{NAME}-cluster", _cluster_args(cfg), network, opts=in_region)
        provider, kubeconfig = cluster.provider, cluster.kubeconfig
        exports["clusterId"] = cluster.cluster_id
        exports["nodePoolId"] = cluster.node_pool_id
        exports["vpcId"] = network.vpc_id
    else:
        existing = ExistingCluster(
            f"{NAME}-cluster",
            cluster_id=cfg.cluster_id,
            kubeconfig=cfg.kubeconfig.get_secret_value() if cfg.kubeconfig else None,
            opts=in_region,
        )
        provider, kubeconfig = existing.provider, existing.kubeconfig
        exports["clusterId"] = pulumi.Output.from_input(cfg.cluster_id or "")
    exports["kubeconfig"] = kubeconfig

    in_cluster = pulumi.ResourceOptions(providers=[*clouds, provider])
    plugin = RdmaDevicePlugin("rdma-device-plugin", _plugin_args(cfg), opts=in_cluster)
    exports["pluginDaemonSet"] = plugin.daemonset_name
    exports["pluginImage"] = plugin.image
    jobs = [
        RdmaJob(
            spec.name,
            RdmaJobArgs(
                spec=spec,
                namespace=cfg.namespace,
                resource_name=cfg.rdma_resource_name,
                non_host_network=cfg.non_host_network,
                plugin_image=plugin.image,
                deadline_seconds=cfg.job_deadline_seconds,
            ),
            opts=pulumi.ResourceOptions.merge(
                in_cluster, pulumi.ResourceOptions(depends_on=[plugin])
            ),
        )
        for spec in specs
    ]
    exports["jobNames"] = pulumi.Output.all(*[j.job_name for j in jobs])
    for key, value in exports.items():
        pulumi.export(key, value)
    return exports


def _image(cfg: StackConfig, job: str) -> str:
    image = cfg.sample_image(job)
    assert image is not None, "config.py requires an image for every enabled sample"
    return image


def _network_args(cfg: StackConfig) -> NetworkArgs:
    return NetworkArgs(
        vpc_cidr=cfg.vpc_cidr,
        vswitch_cidrs=cfg.vswitch_cidrs,
        zone_ids=cfg.zone_ids,
        ipv6=cfg.ipv6,
    )


def _cluster_args(cfg: StackConfig) -> ClusterArgs:
    group = None
    if cfg.creates_eflo_group:
        # config.py refuses create mode without these.
        assert cfg.lingjun_machine_type is not None
        assert cfg.lingjun_image_id is not None
        assert cfg.lingjun_hpn_zone is not None
        group = LingjunGroup(
            machine_type=cfg.lingjun_machine_type,
            image_id=cfg.lingjun_image_id,
            hpn_zone=cfg.lingjun_hpn_zone,
            zone_id=cfg.zone_ids[0],
            compute_network_ipv6=cfg.compute_network_ipv6,
        )
    return ClusterArgs(
        kubernetes_version=cfg.kubernetes_version,
        service_cidr=cfg.service_cidr,
        ipv6=cfg.ipv6,
        node_count=cfg.lingjun_node_count,
        lingjun_cluster_id=cfg.lingjun_cluster_id,
        lingjun_node_group_id=cfg.lingjun_node_group_id,
        create_group=group,
    )


def plugin_config(cfg: StackConfig) -> PluginConfig:
    """The plugin's own config model from the stack keys; plugin/config.py holds the defaults."""
    prefix, _, name = cfg.rdma_resource_name.partition("/")
    if cfg.rdma_pool_mode == "exclusive":
        # An exclusive pool has one ID per HCA; maxAllocations is refused there.
        pool = Pool(name=name, prefix=prefix, mode="exclusive")
    else:
        pool = Pool(name=name, prefix=prefix, max_allocations=cfg.rdma_max_allocations)
    return PluginConfig(non_host_network=cfg.non_host_network, pools=(pool,))


def _plugin_args(cfg: StackConfig) -> DevicePluginArgs:
    build = None
    if cfg.plugin_image_build:
        password = cfg.registry_password
        assert cfg.acr_instance_id is not None, "config.py requires acrInstanceId"
        build = ImageBuild(
            acr_instance_id=cfg.acr_instance_id,
            registry_namespace=f"{NAME}-{pulumi.get_stack()}",
            username=cfg.registry_username,
            password=password.get_secret_value() if password is not None else None,
        )
    return DevicePluginArgs(
        namespace=cfg.namespace,
        plugin_config=plugin_config(cfg),
        image=cfg.plugin_image,
        build=build,
        await_timeout=cfg.plugin_await_timeout,
    )
