"""ACK Pro cluster with a Lingjun node pool (or an adopted cluster), and its Kubernetes provider."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

from infra.components.alicloud import cs, eflo
from infra.components.network import Network
from infra.stack.model import AckCluster, AdoptedLingjunGroup, CreateCluster, KubeconfigCluster

# Created with the cluster because ACK installs them only at creation (or by hand later).
# The managed `ack-rdma-device-plugin` is deliberately absent: our DaemonSet replaces it, and two
# plugins registering the same resource name would fight over the kubelet's socket.
# The ACR credential helper lets nodes pull the plugin image we push to ACR without a Secret; its
# managed edition is the one ACR's docs recommend for ACK managed clusters (1.22 and later).
CLUSTER_ADDONS = (
    "terway-eniip",
    "csi-plugin",
    "csi-provisioner",
    "managed-aliyun-acr-credential-helper",
)


class Cluster(pulumi.ComponentResource):
    """ACK Pro (`ack.pro.small`) + a `lingjun` node pool backed by an eflo node group."""

    cluster_id: pulumi.Output[str]
    node_pool_id: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]
    provider: k8s.Provider

    def __init__(
        self,
        name: str,
        args: CreateCluster,
        network: Network,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("lingjun:cluster:Cluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        ack = cs.ManagedKubernetes(
            f"{name}-ack",
            name=name,
            cluster_spec="ack.pro.small",
            version=args.kubernetes_version,
            ip_stack="dual" if args.network.ipv6 else "ipv4",
            vswitch_ids=network.vswitch_ids,
            pod_vswitch_ids=network.vswitch_ids,
            service_cidr=args.network.service_cidr,
            new_nat_gateway=True,
            # Pulumi applies the Kubernetes objects from outside the VPC.
            slb_internet_enabled=True,
            addons=[cs.ManagedKubernetesAddonArgs(name=a) for a in CLUSTER_ADDONS],
            opts=child,
        )
        eflo_cluster_id, group_id = self._lingjun_group(name, args, network, child)
        pool = cs.NodePool(
            f"{name}-lingjun",
            node_pool_name=f"{name}-lingjun",
            cluster_id=ack.id,
            type="lingjun",
            eflo_node_group=cs.NodePoolEfloNodeGroupArgs(
                cluster_id=eflo_cluster_id, group_id=group_id
            ),
            vswitch_ids=network.vswitch_ids,
            desired_size=str(args.node_count),
            opts=child,
        )
        self.cluster_id = ack.id
        self.node_pool_id = pool.id
        self.kubeconfig = _credential(ack.id, self)
        self.provider = kubernetes_provider(f"{name}-k8s", self.kubeconfig, self)
        self.register_outputs(
            {
                "cluster_id": self.cluster_id,
                "node_pool_id": self.node_pool_id,
                "kubeconfig": self.kubeconfig,
            }
        )

    @staticmethod
    def _lingjun_group(
        name: str, args: CreateCluster, network: Network, child: pulumi.ResourceOptions
    ) -> tuple[pulumi.Input[str], pulumi.Input[str]]:
        group = args.group
        if isinstance(group, AdoptedLingjunGroup):
            return group.cluster_id, group.node_group_id
        zone_id = args.network.zone_ids[0]
        lingjun = eflo.Cluster(
            f"{name}-eflo",
            cluster_name=name,
            cluster_type="Lite",
            hpn_zone=group.hpn_zone,
            networks=eflo.ClusterNetworksArgs(
                # The compute network's IP version is fixed at creation; nonHostNetwork RDMA
                # works only when it is IPv6 (the product doc's precondition).
                tail_ip_version="ipv6" if args.compute_network_ipv6 else "ipv4",
                vpc_id=network.vpc_id,
                vswitch_id=network.vswitch_ids[0],
                vswitch_zone_id=zone_id,
            ),
            opts=child,
        )
        node_group = eflo.NodeGroup(
            f"{name}-eflo-group",
            node_group_name=f"{name}-group",
            cluster_id=lingjun.id,
            az=zone_id,
            zone_id=zone_id,
            machine_type=group.machine_type,
            image_id=group.image_id,
            opts=child,
        )
        # its id is "<cluster id>:<group id>": the node pool wants the bare group id
        return lingjun.id, node_group.node_group_id


class ExistingCluster(pulumi.ComponentResource):
    """An adopted cluster: no cloud resource, only a provider from its kubeconfig."""

    kubeconfig: pulumi.Output[str]
    provider: k8s.Provider

    def __init__(
        self,
        name: str,
        args: KubeconfigCluster | AckCluster,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("lingjun:cluster:ExistingCluster", name, None, opts)
        if isinstance(args, KubeconfigCluster):
            self.kubeconfig = pulumi.Output.secret(args.kubeconfig.get_secret_value())
        else:
            self.kubeconfig = _credential(pulumi.Output.from_input(args.cluster_id), self)
        self.provider = kubernetes_provider(f"{name}-k8s", self.kubeconfig, self)
        self.register_outputs({"kubeconfig": self.kubeconfig})


def kubernetes_provider(
    name: str, kubeconfig: pulumi.Output[str], parent: pulumi.Resource
) -> k8s.Provider:
    """The provider of every Kubernetes object of the stack."""
    return k8s.Provider(
        name,
        kubeconfig=kubeconfig,
        # Without it a ConfigMap whose data changes is replaced, and so is everything that
        # names it: the plugin's DaemonSet would be deleted and recreated (every node losing
        # its plugin at once) instead of rolling one node at a time.
        enable_config_map_mutable=True,
        opts=pulumi.ResourceOptions(parent=parent),
    )


def _credential(cluster_id: pulumi.Output[str], parent: pulumi.Resource) -> pulumi.Output[str]:
    """The cluster's kubeconfig from ACK, as a secret output."""
    credential = cs.get_cluster_credential_output(
        cluster_id=cluster_id, opts=pulumi.InvokeOutputOptions(parent=parent)
    )
    return pulumi.Output.secret(credential.kube_config)
