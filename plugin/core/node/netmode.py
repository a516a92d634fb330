"""Can non-hostNetwork pods do RoCE on this node? (pure: reads an Inventory)."""

from __future__ import annotations

from plugin.core.node.discovery.model import Hca, Inventory


def non_host_network_problems(inventory: Inventory, hcas: tuple[Hca, ...]) -> list[str]:
    """Why pod-network RDMA cannot work with these HCAs; empty when it can.

    A pod's own interface can do RoCE only when the RDMA netns mode is shared (devices visible in
    every namespace) and the ports carry RoCE v2 GIDs for global IPv6 addresses — which is what
    a Lingjun compute network created in IPv6 mode gives.
    """
    fix = "create the Lingjun cluster's compute network in IPv6 mode, or set nonHostNetwork: false"
    problems: list[str] = []
    if inventory.netns_mode != "shared":
        problems.append(
            f"RDMA netns mode is {inventory.netns_mode or 'unknown (ib_core not loaded)'}, "
            "not shared: pods outside the host network namespace cannot see the HCAs"
        )
    if not hcas:
        problems.append("no RDMA device found")
    for hca in hcas:
        for port in hca.ports:
            if port.link_layer != "Ethernet":
                continue
            if not any(g.is_global_ipv6 for g in port.gids):
                problems.append(
                    f"{hca.name} port {port.number} ({', '.join(port.netdevs) or 'no netdev'}): "
                    f"no RoCE v2 GID for a global IPv6 address: {fix}"
                )
    return problems
