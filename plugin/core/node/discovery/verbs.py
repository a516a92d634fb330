"""Discovery through libibverbs (pyverbs): devices, port state and the GID table come from the
kernel's verbs interface; character-device names, NUMA and netdevs from sysfs.

The only module that imports pyverbs (Debian's python3-pyverbs, see README)."""

# pyverbs (Debian's, outside the venv) ships no type information: converted at this edge.
# pyright: reportUnknownMemberType=false, reportUnknownVariableType=false
# pyright: reportUnknownArgumentType=false, reportUnknownLambdaType=false

from __future__ import annotations

import dataclasses
import ipaddress
from pathlib import Path
from typing import Any

from pyverbs import device as verbs  # pyright: ignore[reportMissingImports]
from pyverbs import enums  # pyright: ignore[reportMissingImports]
from pyverbs.pyverbs_error import PyverbsError  # pyright: ignore[reportMissingImports]

from plugin.core.node.discovery.model import DiscoveryError, Gid, GidType, Hca, Inventory, Port
from plugin.core.node.discovery.sysfs import SysfsDiscovery, read

# query_gid_table numbers GID types its own way (not the sysfs numbering of query_gid_type).
_GID_TYPES: dict[int, GidType] = {
    enums.IBV_GID_TYPE_IB: "IB/RoCE v1",
    enums.IBV_GID_TYPE_ROCE_V1: "IB/RoCE v1",
    enums.IBV_GID_TYPE_ROCE_V2: "RoCE v2",
}
_LINK_LAYERS = {1: "InfiniBand", 2: "Ethernet"}  # IBV_LINK_LAYER_*; 0 (unspecified) = IB
# query_gid_table's output buffer travels as one uverbs ioctl attribute whose length is a u16:
# 65535 // 32-byte struct ibv_gid_entry = 2047 entries at most. libibverbs truncates a larger
# size silently (4096 entries -> length 0) and the kernel answers EINVAL (seen on rxe, 6.1).
_MAX_GIDS = 65535 // 32
# enum ibv_port_state, spelled as sysfs spells it ("4: ACTIVE")
_PORT_STATES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}


class VerbsDiscovery:
    name = "verbs"

    def __init__(self, sysfs_root: Path, dev_root: Path) -> None:
        # sysfs for what verbs does not tell (character devices, NUMA, netdevs); not its GID
        # table: that comes whole from one query_gid_table call.
        self.sysfs = SysfsDiscovery(sysfs_root, dev_root, gids=False)

    def device_names(self) -> list[str]:
        """ibdev names libibverbs sees; raises DiscoveryError when there is no RDMA at all."""
        try:
            return [d.name.decode() for d in verbs.get_device_list()]
        except PyverbsError as exc:  # raised (not []) when /sys/class/infiniband_verbs is absent
            raise DiscoveryError(
                f"libibverbs finds no RDMA devices ({exc}); it reads the kernel's own /sys, "
                "whatever --sysfs-root says"
            ) from exc

    def check_usable(self) -> None:
        """Raise DiscoveryError unless a device can be opened here: in a container without the
        device cgroup grant (the DaemonSet's case) libibverbs lists devices it cannot open."""
        names = self.device_names()
        if not names:
            raise DiscoveryError(
                "libibverbs lists no RDMA device (it reads the kernel's own /sys, whatever "
                "--sysfs-root says)"
            )
        try:
            with verbs.Context(name=names[0]):
                pass
        except PyverbsError as exc:
            raise DiscoveryError(f"libibverbs cannot open {names[0]}: {exc}") from exc

    def scan(self) -> Inventory:
        from_sysfs = self.sysfs.scan()
        try:
            names = self.device_names()
        except DiscoveryError as exc:  # driver not loaded (yet): zero devices, not a failure
            return dataclasses.replace(from_sysfs, hcas=(), errors=(str(exc),))
        by_name = {h.name: h for h in from_sysfs.hcas}
        hcas: list[Hca] = []
        for name in names:
            base = by_name.get(name)
            if base is None:  # gone from sysfs between the two reads: next scan settles it
                continue
            try:
                hcas.append(_with_verbs_ports(base, self.sysfs.sysfs))
            except PyverbsError as exc:
                hcas.append(dataclasses.replace(base, problems=(*base.problems, f"{name}: {exc}")))
        return dataclasses.replace(from_sysfs, hcas=tuple(hcas))


def _with_verbs_ports(base: Hca, sysfs_root: Path) -> Hca:
    with verbs.Context(name=base.name) as ctx:
        attr: Any = ctx.query_device()
        numbers = range(1, int(attr.phys_port_cnt) + 1)
        port_attrs: dict[int, Any] = {n: ctx.query_port(n) for n in numbers}
        # Room for every slot of every port (the kernel refuses a table it cannot fit whole).
        slots = sum(int(pa.gid_tbl_len) for pa in port_attrs.values())
        entries: list[Any] = list(ctx.query_gid_table(min(max(slots, 1), _MAX_GIDS)))
        ports: list[Port] = []
        for number in numbers:
            pa = port_attrs[number]
            sysfs_port = next((p for p in base.ports if p.number == number), None)
            attrs = sysfs_root / "class" / "infiniband" / base.name / "ports" / str(number)
            gids = tuple(
                Gid(
                    index=int(e.gid_index),
                    gid=str(ipaddress.IPv6Address(e.gid_str())),
                    type=_GID_TYPES.get(int(e.gid_type), "IB/RoCE v1"),
                    # by name from sysfs: the entry's ndev_ifindex may be another namespace's
                    netdev=read(attrs / "gid_attrs" / "ndevs" / str(int(e.gid_index))) or None,
                )
                for e in sorted(entries, key=lambda e: int(e.gid_index))
                if int(e.port_num) == number
            )
            ports.append(
                Port(
                    number=number,
                    state=_PORT_STATES.get(int(pa.state), f"UNKNOWN({int(pa.state)})"),
                    link_layer=_LINK_LAYERS.get(int(pa.link_layer), "InfiniBand"),
                    netdevs=sysfs_port.netdevs if sysfs_port else (),
                    gids=gids,
                )
            )
    # vendor and device id stay sysfs' PCI IDs: for a virtual device (rxe reports vendor_id
    # 0xffffff) verbs' IDs are no PCI IDs, and a `vendors` selector must select alike whichever
    # discovery runs.
    return dataclasses.replace(base, ports=tuple(ports))
