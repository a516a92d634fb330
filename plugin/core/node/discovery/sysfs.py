"""Discovery from the kernel's sysfs layout (root injectable for fixture trees)."""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import stat
from pathlib import Path

from common.userfiles import UnreadableError, decimal, described, file_kind, read_text, shown
from plugin.core.node.discovery.model import (
    IBDEV_NAME,
    CharDevices,
    Gid,
    GidType,
    Hca,
    Inventory,
    Port,
)

logger = logging.getLogger(__name__)

_ZERO_GID = ipaddress.IPv6Address(0)
UNREADABLE = "UNREADABLE"  # a port state: its state or link_layer file could not be read


# A sysfs attribute is at most a page.
_ATTRIBUTE_BYTES = 4096


def read(path: Path) -> str | None:
    """A sysfs attribute's text; None when absent, unreadable (e.g. an unused GID slot), not
    text, or not an attribute at all (a FIFO or a device is never read): one bad file makes one
    value unknown, never the scan fail or hang."""
    try:
        return read_text(path, _ATTRIBUTE_BYTES).strip()
    except UnreadableError:
        return None


class SysfsDiscovery:
    """Reads /sys/class/infiniband*, /sys/class/net and device nodes under dev_root."""

    name = "sysfs"

    def __init__(self, sysfs_root: Path, dev_root: Path, *, gids: bool = True) -> None:
        self.sysfs = sysfs_root
        self.dev_ib = dev_root / "infiniband"
        # The GID table is one file per slot (rxe: 1024 per port, mostly empty): a caller that
        # has the table from elsewhere (verbs) skips it.
        self.gids = gids

    def scan(self) -> Inventory:
        class_ib = self.sysfs / "class" / "infiniband"
        try:
            listed = sorted(os.listdir(class_ib)) if class_ib.is_dir() else []
        except OSError as exc:  # e.g. a --sysfs-root this user cannot search: nothing to scan
            return Inventory(errors=(
                f"{class_ib} cannot be read ({exc.strerror or exc}): --sysfs-root must name "
                "where sysfs is mounted (/sys), readable by this process",
            ))  # fmt: skip
        names = [n for n in listed if IBDEV_NAME.fullmatch(n)]
        verbs = self._chardev_owners("infiniband_verbs")
        mads = self._chardev_owners("infiniband_mad")
        hcas = [self._read_isolated(name, verbs, mads) for name in names]
        errors = tuple(  # never from the kernel: a name there goes to env vars and log lines
            f"{class_ib}: {shown(n)} is not an RDMA device name handed out here (letters, "
            "digits, _ . -): left out"
            for n in listed
            if n not in names
        )
        if not (self.sysfs / "class").is_dir():
            errors += (
                f"{self.sysfs / 'class'} does not exist: --sysfs-root must name where sysfs is "
                "mounted (/sys)",
            )
        if not os.path.isdir(self.dev_ib.parent):  # else every device node is "missing", unsaid why
            errors += (
                f"{self.dev_ib.parent} is not a directory: --dev-root must name where the host's "
                "/dev is mounted",
            )
        return Inventory(
            hcas=tuple(h for h in hcas if h is not None),
            errors=errors,
            rdma_cm=_is_device(self.dev_ib / "rdma_cm"),
            netns_mode=_netns_mode(
                read(self.sysfs / "module" / "ib_core" / "parameters" / "netns_mode")
            ),
        )

    def _read_isolated(
        self, name: str, verbs: dict[str, list[str]], mads: dict[str, list[str]]
    ) -> Hca | None:
        """One HCA that cannot be read at all is reported as such, with no usable port (its
        IDs go Unhealthy); the other HCAs are read and served as usual."""
        try:
            return self.read_hca(name, verbs, mads)
        except OSError as exc:  # its files: said in one line (with the HCA's problems)
            why = str(exc)
        except Exception as exc:  # a fault of ours: the traceback is for us
            logger.exception("%s: cannot be read", name)
            why = repr(exc)
        return Hca(
            name=name,
            vendor="",
            device_id="",
            driver="",
            numa_node=None,
            ports=(),
            chardevs=CharDevices(),
            problems=(f"{name}: cannot be read from sysfs ({why}): it is not served",),
            readable=False,
        )

    def read_hca(
        self, name: str, verbs: dict[str, list[str]], mads: dict[str, list[str]]
    ) -> Hca | None:
        base = self.sysfs / "class" / "infiniband" / name
        if not base.is_dir():
            if os.path.lexists(base):  # a link that loops or leads nowhere, a file
                raise NotADirectoryError(f"{base} is not a directory that can be read")
            return None  # removed between listdir and now
        problems: list[str] = []
        pci = base / "device"
        if pci.is_dir():
            vendor = _hex(read(pci / "vendor"))
            device_id = _hex(read(pci / "device"))
            driver = _link_name(pci / "driver")
            written = read(pci / "numa_node")
            numa = _numa(written)
            # -1: the kernel does not know; no file: a kernel without NUMA. Anything else there
            # (garbage, a FIFO) silently cost the HCA its NUMA-aware allocation.
            if numa is None and written != "-1" and os.path.lexists(pci / "numa_node"):
                what = "cannot be read as text" if written is None else described(written)
                problems.append(
                    f"{pci / 'numa_node'}: {what}, not a NUMA node: {name} is taken to have "
                    "none (no NUMA-aware allocation for it)"
                )
            pci_netdevs = _pci_netdevs(pci)
            parent = None
            address = os.path.basename(os.path.realpath(pci))
            pcie_root = pcie_root_of(self.sysfs, address)
        else:  # Soft-RoCE / siw: no PCI parent, `parent` names the netdev
            vendor = device_id = ""
            driver = _virtual_driver(name)
            numa = None
            pci_netdevs = {}
            parent = read(base / "parent")
            address = pcie_root = None
        ports = tuple(
            self._read_port(base / "ports" / p, int(p), pci_netdevs, parent, problems)
            for p in _numbered(base / "ports", problems)
        )
        uverbs = [u for u in verbs.get(name, []) if self._node_exists(u, problems)]
        umad = [m for m in mads.get(name, []) if m.startswith("umad")]
        issm = [m for m in mads.get(name, []) if m.startswith("issm")]
        if not verbs.get(name):
            problems.append(f"{name}: no uverbs in class/infiniband_verbs (ib_uverbs not loaded?)")
        if not umad:
            problems.append(f"{name}: no umad in class/infiniband_mad (ib_umad not loaded?)")
        return Hca(
            name=name,
            vendor=vendor,
            device_id=device_id,
            driver=driver,
            numa_node=numa,
            ports=ports,
            chardevs=CharDevices(
                uverbs=uverbs[0] if uverbs else None,
                umad=tuple(m for m in umad if self._node_exists(m, problems)),
                # issm is optional: only handed out when its node exists, never reported missing
                issm=tuple(m for m in issm if _is_device(self.dev_ib / m)),
            ),
            problems=tuple(problems),
            pci_address=address,
            pcie_root=pcie_root,
        )

    def _node_exists(self, chardev: str, problems: list[str]) -> bool:
        """The device node is there, and is a character device (what a pod is given)."""
        try:
            mode = (self.dev_ib / chardev).stat().st_mode
        except OSError:
            problems.append(f"{self.dev_ib / chardev} does not exist")
            return False
        if not stat.S_ISCHR(mode):
            problems.append(f"{self.dev_ib / chardev} is {file_kind(mode)}, not a device node")
            return False
        return True

    def _chardev_owners(self, cls: str) -> dict[str, list[str]]:
        """ibdev -> its character devices of one class (uverbsN, or umadN/issmN)."""
        owners: dict[str, list[str]] = {}
        base = self.sysfs / "class" / cls
        for chardev in sorted(_listdir(base), key=_natural):
            ibdev = read(base / chardev / "ibdev")
            if ibdev:
                owners.setdefault(ibdev, []).append(chardev)
        return owners

    def _read_port(
        self,
        base: Path,
        number: int,
        pci_netdevs: dict[str, int | None],
        parent: str | None,
        problems: list[str],
    ) -> Port:
        gids = tuple(_read_gids(base, problems)) if self.gids else ()
        if parent is not None:
            netdevs = (parent,)
        else:  # a PCI function's netdevs carry dev_port = port number - 1 (absent: single port)
            netdevs = tuple(
                n for n, dev_port in pci_netdevs.items() if dev_port in (None, number - 1)
            )
        state = read(base / "state") or None  # an empty file says no more than a missing one
        link_layer = read(base / "link_layer") or None
        if state is None or link_layer is None:
            # a port this scan cannot read is not Healthy (never the last state it had)
            unread = [
                f.name
                for f, v in ((base / "state", state), (base / "link_layer", link_layer))
                if v is None
            ]
            problems.append(f"{base}: {' and '.join(unread)} empty or not readable as text")
            return Port(number, UNREADABLE, link_layer or "unknown", netdevs, gids)
        return Port(
            number=number,
            state=state.partition(":")[2].strip() or state,
            link_layer=link_layer,
            netdevs=netdevs,
            gids=gids,
        )


def _read_gids(port: Path, problems: list[str]) -> list[Gid]:
    """The port's GIDs in use. An entry that cannot be read, or is not a GID, is left out and
    named in `problems`: it may be the one a pod needs (podenv says so, not only "none")."""
    gids: list[Gid] = []
    for index in _numbered(port / "gids", problems):
        try:
            text = read_text(port / "gids" / index, _ATTRIBUTE_BYTES).strip()
            addr = ipaddress.IPv6Address(text)
        except (UnreadableError, ValueError) as exc:
            why = exc if isinstance(exc, UnreadableError) else "not a GID"
            problems.append(f"{port / 'gids' / index}: cannot be read ({why}): left out")
            continue
        if addr == _ZERO_GID:  # an empty slot: skip before reading its (unreadable) attributes
            continue
        try:
            gid_type = read_text(port / "gid_attrs" / "types" / index, _ATTRIBUTE_BYTES).strip()
        except UnreadableError as exc:
            problems.append(f"{port / 'gid_attrs' / 'types' / index}: cannot be read ({exc}): "
                            "left out")  # fmt: skip
            continue
        if gid_type not in ("IB/RoCE v1", "RoCE v2"):
            continue
        kind: GidType = "RoCE v2" if gid_type == "RoCE v2" else "IB/RoCE v1"
        netdev = read(port / "gid_attrs" / "ndevs" / index)
        gids.append(Gid(index=int(index), gid=str(addr), type=kind, netdev=netdev or None))
    return gids


def _is_device(path: Path) -> bool:
    try:
        return stat.S_ISCHR(path.stat().st_mode)
    except OSError:
        return False


def _numbered(directory: Path, problems: list[str]) -> list[str]:
    """The entries named by a number (ports, GID slots), in order; anything else is skipped
    and named in `problems`, as is a directory that is there but cannot be listed."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    except OSError as exc:  # a file, a FIFO, no permission: "no ports" would blame the link
        problems.append(f"{directory}: cannot be listed ({exc.strerror or exc})")
        return []
    stray = sorted(n for n in names if decimal(n) is None)
    if stray:
        problems.append(f"{directory}: unexpected entries {shown(stray)} skipped")
    return sorted((n for n in names if decimal(n) is not None), key=int)


def _pci_netdevs(pci: Path) -> dict[str, int | None]:
    result: dict[str, int | None] = {}
    for netdev in sorted(_listdir(pci / "net")):
        result[netdev] = decimal(read(pci / "net" / netdev / "dev_port") or "")
    return result


_BDF = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]")


def pcie_root_of(sysfs: Path, address: str) -> str | None:
    """The PCIe root complex of a PCI function, as Kubernetes' deviceattribute package finds
    it (GetPCIeRootAttributeByPCIBusID): bus/pci/devices/<bdf> links into
    devices/pci<domain>:<bus>/.../<bdf>, whose first component is the root. None where that
    link is not so (a VM without a PCIe topology, a bad address)."""
    if not _BDF.fullmatch(address):
        return None
    link = sysfs / "bus" / "pci" / "devices" / address
    try:
        target = os.readlink(link)
    except OSError:
        return None
    target = os.path.normpath(os.path.join(link.parent, target))
    devices = str(sysfs / "devices")
    root = os.path.relpath(target, devices).split(os.sep)[0]
    if not root.startswith("pci") or os.path.basename(target) != address:
        return None
    return root


def _virtual_driver(name: str) -> str:
    for kind in ("rxe", "siw"):
        if name.startswith(kind):
            return kind
    return ""


def _listdir(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _link_name(path: Path) -> str:
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return ""


def _hex(text: str | None) -> str:
    return (text or "").lower().removeprefix("0x")


# Linux numbers NUMA nodes below its MAX_NUMNODES (1024); anything else in numa_node is not one.
MAX_NUMA_NODES = 1024


def _numa(text: str | None) -> int | None:
    """The NUMA node, or None when the kernel says -1 (unknown) or the file holds no node."""
    node = decimal(text or "")
    return node if node is not None and node < MAX_NUMA_NODES else None


def _netns_mode(text: str | None) -> str | None:
    """ib_core's netns_mode is a bool module parameter: the kernel writes Y (shared) or N."""
    return {"Y": "shared", "N": "exclusive"}.get(text or "", text)


def _natural(name: str) -> tuple[str, int]:
    stem = name.rstrip("0123456789")
    digits = name[len(stem) :]
    return (stem, int(digits) if digits else -1)
