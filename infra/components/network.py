"""VPC and vSwitches for the cluster, with IPv6 when the stack asks for it."""

from __future__ import annotations

import pulumi

from infra.components.alicloud import vpc
from infra.stack.model import NetworkPlan

# Alibaba hands each vSwitch a /64 out of the VPC's IPv6 block; the mask picks which one (0-255).
_IPV6_FIRST_SUBNET = 1


class Network(pulumi.ComponentResource):
    """A VPC and one vSwitch per (zone, CIDR)."""

    vpc_id: pulumi.Output[str]
    vswitch_ids: pulumi.Output[list[str]]

    def __init__(
        self, name: str, args: NetworkPlan, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("lingjun:network:Network", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        network = vpc.Network(
            f"{name}-vpc",
            vpc_name=name,
            cidr_block=args.vpc_cidr,
            enable_ipv6=args.ipv6,
            opts=child,
        )
        switches = [
            vpc.Switch(
                f"{name}-vsw-{i}",
                vswitch_name=f"{name}-{i}",
                vpc_id=network.id,
                cidr_block=cidr,
                zone_id=zone,
                enable_ipv6=args.ipv6,
                ipv6_cidr_block_mask=_IPV6_FIRST_SUBNET + i if args.ipv6 else None,
                opts=child,
            )
            for i, (cidr, zone) in enumerate(zip(args.vswitch_cidrs, args.zone_ids, strict=True))
        ]
        self.vpc_id = network.id
        self.vswitch_ids = pulumi.Output.all(*[s.id for s in switches])
        self.register_outputs({"vpc_id": self.vpc_id, "vswitch_ids": self.vswitch_ids})
