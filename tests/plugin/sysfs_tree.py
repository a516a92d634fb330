"""Fixture sysfs trees in the real kernel layout (symlinks included), and mutations on them."""

from __future__ import annotations

import ipaddress
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class PortSpec:
    state: str = "ACTIVE"
    link_layer: str = "Ethernet"
    netdev: str | None = None
    # (gid text as an IP address, type) in table order from index 0
    gids: list[tuple[str, str]] = field(default_factory=list[tuple[str, str]])


_STATE_CODES = {"DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4}


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(target, link.parent))


def _device_node(path: Path) -> None:
    """A character device, as udev makes them (a copy of /dev/null's: harmless if opened)."""
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))


def _sysfs_gid(ip: str) -> str:
    return ipaddress.IPv6Address(
        ip if ":" in ip else f"::ffff:{ip}"
    ).exploded  # e.g. 0000:0000:0000:0000:0000:ffff:c0a8:0101


class SysfsTree:
    """Builds <root>/sys and <root>/dev like a node with RDMA drivers loaded."""

    def __init__(self, root: Path) -> None:
        self.sys = root / "sys"
        self.dev = root / "dev"
        (self.sys / "class" / "infiniband").mkdir(parents=True, exist_ok=True)
        (self.dev / "infiniband").mkdir(parents=True, exist_ok=True)
        self._uverbs = 0
        self._umad = 0

    def rdma_cm(self, netns_mode: str = "shared") -> SysfsTree:
        # a bool module parameter: the kernel shows Y (shared) or N (exclusive)
        flag = "Y" if netns_mode == "shared" else "N"
        _write(self.sys / "module" / "ib_core" / "parameters" / "netns_mode", flag)
        _device_node(self.dev / "infiniband" / "rdma_cm")
        return self

    def add_pci_hca(
        self,
        name: str,
        *,
        pci: str,
        numa: int = 0,
        vendor: str = "0x15b3",
        device: str = "0x1017",
        driver: str = "mlx5_core",
        ports: list[PortSpec] | None = None,
        umad: bool = True,
        issm: bool = False,
        pcie_root: str = "pci0000:00",
    ) -> SysfsTree:
        # as the kernel lays it out: devices/<root complex>/<bridge>/<function>, linked from
        # bus/pci/devices/<function>
        fn = self.sys / "devices" / pcie_root / f"{pcie_root[3:]}:02.0" / pci
        fn.mkdir(parents=True, exist_ok=True)
        _link(self.sys / "bus" / "pci" / "devices" / pci, fn)
        _write(fn / "vendor", vendor)
        _write(fn / "device", device)
        _write(fn / "numa_node", str(numa))
        drv = self.sys / "bus" / "pci" / "drivers" / driver
        drv.mkdir(parents=True, exist_ok=True)
        if not (fn / "driver").is_symlink():
            _link(fn / "driver", drv)
        ports = ports or [PortSpec()]
        for i, port in enumerate(ports):
            if port.netdev:
                _write(fn / "net" / port.netdev / "dev_port", str(i))
                _link(self.sys / "class" / "net" / port.netdev, fn / "net" / port.netdev)
        self._add_ibdev(name, fn, ports, umad=umad, issm=issm)
        return self

    def add_rxe(self, name: str, netdev: str, port: PortSpec | None = None) -> SysfsTree:
        port = port or PortSpec(netdev=netdev)
        virt = self.sys / "devices" / "virtual"
        _write(virt / "net" / netdev / "ifindex", "2")
        _link(self.sys / "class" / "net" / netdev, virt / "net" / netdev)
        self._add_ibdev(name, virt, [port], umad=True, issm=False, parent=netdev)
        return self

    def _add_ibdev(
        self,
        name: str,
        owner: Path,
        ports: list[PortSpec],
        *,
        umad: bool,
        issm: bool,
        parent: str | None = None,
    ) -> None:
        ib = owner / "infiniband" / name
        _link(self.sys / "class" / "infiniband" / name, ib)
        if parent is None:
            _link(ib / "device", owner)
        else:
            _write(ib / "parent", parent)
        _write(ib / "node_type", "1: CA")
        for n, port in enumerate(ports, start=1):
            self.set_port(name, n, port.state)
            base = ib / "ports" / str(n)
            _write(base / "link_layer", port.link_layer)
            for index, (ip, kind) in enumerate(port.gids):
                _write(base / "gids" / str(index), _sysfs_gid(ip))
                _write(base / "gid_attrs" / "types" / str(index), kind)
                _write(base / "gid_attrs" / "ndevs" / str(index), port.netdev or "")
            # unused GID slots read as zeros, their attributes are unreadable (EINVAL)
            _write(base / "gids" / str(len(port.gids)), _sysfs_gid("::"))
        self._chardev("infiniband_verbs", owner, f"uverbs{self._uverbs}", name)
        self._uverbs += 1
        if umad:
            for n in range(1, len(ports) + 1):
                names = [f"umad{self._umad}"] + ([f"issm{self._umad}"] if issm else [])
                for chardev in names:
                    self._chardev("infiniband_mad", owner, chardev, name, port=n)
                self._umad += 1

    def _chardev(self, cls: str, owner: Path, chardev: str, ibdev: str, port: int = 0) -> None:
        real = owner / cls / chardev
        _write(real / "ibdev", ibdev)
        if port:
            _write(real / "port", str(port))
        _link(self.sys / "class" / cls / chardev, real)
        _device_node(self.dev / "infiniband" / chardev)

    # -- mutations, as the kernel would show them ------------------------------------------
    def port_dir(self, ibdev: str, port: int = 1) -> Path:
        return self.sys / "class" / "infiniband" / ibdev / "ports" / str(port)

    def set_port(self, ibdev: str, port: int, state: str) -> None:
        base = self.port_dir(ibdev, port)
        _write(base / "state", f"{_STATE_CODES[state]}: {state}")
        _write(base / "phys_state", "5: LinkUp" if state == "ACTIVE" else "3: Disabled")

    def set_counter(self, ibdev: str, port: int, name: str, value: str, hw: bool = False) -> None:
        """A file of ports/N/counters (or hw_counters), as the driver shows it."""
        _write(self.port_dir(ibdev, port) / ("hw_counters" if hw else "counters") / name, value)

    def remove_device_node(self, chardev: str) -> None:
        (self.dev / "infiniband" / chardev).unlink()


def two_mlx5(root: Path) -> SysfsTree:
    """Two single-port ConnectX (RoCE) HCAs on NUMA 0 and 1 with IPv4 and IPv6 RoCE v2 GIDs."""
    tree = SysfsTree(root).rdma_cm()
    for i, numa in ((0, 0), (1, 1)):
        tree.add_pci_hca(
            f"mlx5_{i}",
            pci=f"0000:{3 + i:02x}:00.0",
            numa=numa,
            ports=[
                PortSpec(
                    netdev=f"eth{i}",
                    gids=[
                        (f"fe80::a{i}", "IB/RoCE v1"),
                        (f"fe80::a{i}", "RoCE v2"),
                        (f"10.0.{i}.2", "IB/RoCE v1"),
                        (f"10.0.{i}.2", "RoCE v2"),
                    ],
                )
            ],
        )
    return tree
