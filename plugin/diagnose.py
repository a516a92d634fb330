"""A node's RDMA as the node agent sees it, for a person: each HCA with its ports, GIDs and
device nodes, the pools it falls into, what a pod asking for each pool gets, and what is wrong
with the fix. Run it where the agent runs:

    kubectl -n lingjun-rdma exec ds/rdma-device-plugin -- python -m plugin.diagnose

Exit 0: nothing wrong; 1: a problem is listed; 2: a bad flag or config."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from common.terminal import Parser, say, write_stdout
from plugin.config import ConfigError, PluginConfig, load_config
from plugin.core.node import pools
from plugin.core.node.discovery.model import Hca, Inventory
from plugin.core.node.discovery.sysfs import SysfsDiscovery
from plugin.core.node.health import node_problems
from plugin.core.node.netmode import non_host_network_problems
from plugin.core.node.problems import FIXES
from plugin.launch import DEFAULT_CONFIG_PATH

PROG = "python -m plugin.diagnose"


def _hca(hca: Hca, dev_root: Path) -> list[str]:
    ids = f"{hca.vendor}:{hca.device_id}" if hca.vendor else "virtual"
    where = ", ".join(
        p
        for p in (f"NUMA {hca.numa_node}" if hca.numa_node is not None else "", hca.pcie_root or "")
        if p
    )
    why = hca.unhealthy_reason()
    lines = [f"HCA {hca.name} ({ids}, {hca.driver}{', ' + where if where else ''}): "
             + ("usable" if why is None else f"NOT usable: {why}")]  # fmt: skip
    for port in hca.ports:
        gids = ", ".join(f"{g.index} {g.gid}" for g in port.gids if g.type == "RoCE v2")
        lines.append(
            f"  port {port.number}: {port.state}, {port.link_layer}, "
            f"netdevs {', '.join(port.netdevs) or 'none'}; RoCE v2 GIDs: {gids or 'none'}"
        )
    nodes = [n for n in (hca.chardevs.uverbs, *hca.chardevs.umad, *hca.chardevs.issm) if n]
    lines.append(
        f"  device nodes: {', '.join(str(dev_root / 'infiniband' / n) for n in nodes) or 'none'}"
    )
    return lines


def _pool(view: pools.PoolView, dev_root: Path) -> list[str]:
    pool = view.pool
    usable = tuple(h.name for h in view.hcas if h.unhealthy_reason() is None)
    lines = [
        f"pool {pool.resource_name} ({pool.mode}, {len(view.devices)} IDs): HCAs "
        f"{', '.join(h.name for h in view.hcas) or 'none'} ({len(usable)} usable)"
    ]
    if not usable:
        lines.append("  a pod asking for it: none can be given now")
        return lines
    granted = usable if pool.mode == "shared" else usable[:1]
    got = pools.allocation(view, granted, dev_root)
    said = "a pod asking for it gets" if pool.mode == "shared" else "a pod gets one HCA, e.g."
    lines.append(f"  {said}: {', '.join(d.container_path for d in got.devices)}; " + ", ".join(
        f"{k}={v}" for k, v in sorted(got.envs.items())
    ))  # fmt: skip
    return lines


def report(config: PluginConfig, inventory: Inventory, dev_root: Path) -> tuple[list[str], int]:
    """The lines said of one scan, and how many problems they list."""
    views, conflicts = pools.assign(config, inventory)
    net = (
        non_host_network_problems(inventory, tuple(h for v in views for h in v.hcas))
        if config.non_host_network
        else []
    )
    problems = node_problems(config, inventory, views, conflicts, non_host_network=net)
    lines = [f"RDMA netns mode: {inventory.netns_mode or 'unknown (ib_core not loaded)'}; "
             f"rdma_cm: {'present' if inventory.rdma_cm else 'missing'}"]  # fmt: skip
    for hca in inventory.hcas:
        lines += _hca(hca, dev_root)
    if not inventory.hcas:
        lines.append("no RDMA device on this node (sysfs class/infiniband missing or empty)")
    for view in views:
        lines += _pool(view, dev_root)
    lines.append(f"problems: {len(problems) or 'none'}")
    for problem in problems:
        lines += [
            f"  {problem.reason}: {problem.message}",
            f"    what to do: {FIXES[problem.reason]}",
        ]
    return lines, len(problems)


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(PROG, __doc__)
    parser.add_argument("--config", type=Path, default=None, help=f"default: {DEFAULT_CONFIG_PATH}")
    parser.add_argument("--sysfs-root", type=Path, default=Path("/sys"))
    parser.add_argument("--dev-root", type=Path, default=Path("/dev"))
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config or DEFAULT_CONFIG_PATH, explicit=args.config is not None)
    except ConfigError as exc:
        say(f"{PROG}: {exc}")
        return 2
    inventory = SysfsDiscovery(args.sysfs_root, args.dev_root).scan()
    lines, problems = report(config, inventory, args.dev_root)
    write_stdout("\n".join(lines) + "\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
