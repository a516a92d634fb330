"""What the VM's init (vm/init) set up, and small helpers to look at and change it."""

from __future__ import annotations

import ipaddress
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SYS = Path("/sys")
DEV = Path("/dev")


@dataclass(frozen=True)
class Rxe:
    ibdev: str
    netdev: str
    ipv4: str
    ipv6: str

    @property
    def ipv4_gid(self) -> str:
        """The GID the kernel makes from an IPv4 address: IPv4-mapped IPv6."""
        return str(ipaddress.IPv6Address(f"::ffff:{self.ipv4}"))


# As vm/init creates them: two rxe devices over the two ends of one veth pair.
RXE0 = Rxe("rxe0", "veth0", "192.168.77.1", "fd77::1")
RXE1 = Rxe("rxe1", "veth1", "192.168.77.2", "fd77::2")
RXES = (RXE0, RXE1)


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """A command's result; its output goes into the assertion message when check fails."""
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(argv)} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
        )
    return result


@dataclass(frozen=True)
class SysfsGid:
    index: int
    gid: str
    type: str
    netdev: str


def sysfs_gids(ibdev: str, port: int = 1) -> list[SysfsGid]:
    """The port's non-empty GID table entries, straight from the kernel's sysfs files."""
    base = SYS / "class" / "infiniband" / ibdev / "ports" / str(port)
    found: list[SysfsGid] = []
    for entry in sorted((base / "gids").iterdir(), key=lambda p: int(p.name)):
        try:
            text = entry.read_text().strip()
            kind = (base / "gid_attrs" / "types" / entry.name).read_text().strip()
            netdev = (base / "gid_attrs" / "ndevs" / entry.name).read_text().strip()
        except OSError:  # an unused slot: its attributes cannot be read
            continue
        gid = ipaddress.IPv6Address(text)
        if gid != ipaddress.IPv6Address(0):
            found.append(SysfsGid(int(entry.name), str(gid), kind, netdev))
    return found


def gid_index(ibdev: str, gid: str, kind: str = "RoCE v2") -> int | None:
    for g in sysfs_gids(ibdev):
        if g.gid == str(ipaddress.IPv6Address(gid)) and g.type == kind:
            return g.index
    return None


def wait_gid(ibdev: str, gid: str, limit: float = 10.0) -> int | None:
    """The RoCE v2 GID index of `gid` once the kernel added it; None if it never appears."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        index = gid_index(ibdev, gid)
        if index is not None:
            return index
        time.sleep(0.05)
    return None


_DEVINFO_GID = re.compile(r"GID\[\s*(\d+)\]:\s+(\S+), (RoCE v\d)")


def devinfo_gids(ibdev: str) -> set[tuple[int, str, str]]:
    """(index, gid, type) as rdma-core's ibv_devinfo -v prints them: a third opinion."""
    out = run("ibv_devinfo", "-v", "-d", ibdev).stdout
    return {
        (int(i), str(ipaddress.IPv6Address(g)), "IB/RoCE v1" if t == "RoCE v1" else t)
        for i, g, t in _DEVINFO_GID.findall(out)
    }


def transfer_command(a: str, a_gid: int, b: str, b_gid: int, timeout: float = 10.0) -> list[str]:
    """argv of the RC QP program (rc_transfer.py) between a[a_gid] and b[b_gid]."""
    return [
        *("python3", "-m", "tests.plugin.rdma.rc_transfer"),
        *(f"{a}:{a_gid}", f"{b}:{b_gid}", str(timeout)),
    ]
