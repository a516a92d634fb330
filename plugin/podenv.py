"""NCCL's RDMA settings for the network namespace this runs in: `python -m plugin.podenv`.

Run inside the pod (an init container of the same pod sees the same namespace and, asking the
same resource, the same HCAs): it matches the namespace's own addresses against the RoCE v2 GIDs
of the allocated HCAs and prints one sourceable KEY=VALUE line per variable:

    python -m plugin.podenv [--sysfs-root /sys] [--hcas mlx5_0,mlx5_1] [--family auto|ipv6|ipv4]
                            [--set NCCL_IB_TC=136 ...] [--out FILE]

HCAs default to LINGJUN_RDMA_HCAS (set by the device plugin's Allocate). Family `auto`: ipv4 on
the host network (an allocated HCA's netdev is an interface of this namespace), else ipv6 (the
only family a pod's own GID can have off the host network).
Exit codes: 0 printed, 1 no usable GID (the message names the HCAs, the addresses and the fix),
2 bad arguments or an --out that cannot be written.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from plugin.discovery.model import Hca
from plugin.discovery.sysfs import SysfsDiscovery
from plugin.gidchoice import Choice, Family, NoGidError, choose
from plugin.netaddrs import namespace_addresses
from plugin.pool import HCAS_ENV
from plugin.userfiles import why_not_writable

FAMILIES: tuple[Family, ...] = ("ipv6", "ipv4")


def auto_family(hcas: Sequence[Hca], ifnames: set[str]) -> Family:
    """ipv4 on the host network, ipv6 off it. sysfs shows a namespace only its own netdevs: in a
    pod's, an HCA's PCI function lists none and its netdev is not among the interfaces."""
    on_host = any(n in ifnames for h in hcas for n in h.netdevs)
    return "ipv4" if on_host else "ipv6"


def render(choice: Choice, extra: dict[str, str]) -> str:
    """KEY=VALUE lines, sourceable by sh (`set -a; . FILE; set +a`)."""
    env = {**extra, **choice.env()}
    return "".join(f"{k}={_quote(v)}\n" for k, v in env.items())


def _quote(value: str) -> str:
    safe = all(c.isalnum() or c in "=,:._-/" for c in value)
    return value if safe and value else "'" + value.replace("'", "'\\''") + "'"


def _read_hcas(sysfs_root: Path, names: list[str]) -> list[Hca]:
    discovery = SysfsDiscovery(sysfs_root, Path("/dev"))
    hcas: list[Hca] = []
    for name in names:
        hca = discovery.read_hca(name, {}, {})
        if hca is None:
            raise NoGidError(
                f"{name}: not in {sysfs_root / 'class' / 'infiniband'}: the RDMA devices are not "
                "visible in this network namespace (RDMA netns mode exclusive?)"
            )
        hcas.append(hca)
    return hcas


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE, e.g. NCCL_IB_TC=136")
    return key, value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m plugin.podenv", description=__doc__)
    p.add_argument("--sysfs-root", type=Path, default=Path("/sys"))
    p.add_argument("--hcas", default=os.environ.get(HCAS_ENV, ""), help=f"default ${HCAS_ENV}")
    p.add_argument("--family", choices=["auto", *FAMILIES], default="auto")
    p.add_argument("--set", type=_key_value, action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", type=Path, help="write here (atomically) instead of stdout")
    args = p.parse_args(argv)
    names = [n for n in args.hcas.split(",") if n]
    if not names:
        p.error(
            f"no HCAs: pass --hcas, or run in a container asking for the RDMA resource "
            f"(its Allocate sets {HCAS_ENV})"
        )
    try:
        hcas = _read_hcas(args.sysfs_root, names)
        family: Family = (
            auto_family(hcas, {n for _, n in socket.if_nameindex()})
            if args.family == "auto"
            else args.family
        )
        choice = choose(hcas, namespace_addresses(), family)
    except NoGidError as exc:
        print(f"lingjun-rdma podenv: {exc}", file=sys.stderr)
        return 1
    text = render(choice, dict(args.set))
    if args.out is None:
        sys.stdout.write(text)
        return 0
    try:
        write_atomically(args.out, text)
    except OSError as exc:
        print(f"lingjun-rdma podenv: --out {args.out}: {_why(exc, args.out)}", file=sys.stderr)
        return 2
    return 0


def write_atomically(path: Path, text: str) -> None:
    """`path` holds `text` whole, or is left as it was (no temporary file stays behind)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def _why(exc: OSError, path: Path) -> str:
    why = why_not_writable(path.parent)
    if why is not None and not isinstance(exc, IsADirectoryError):
        return f"{path.parent} {why}: name a file in a writable directory"
    return f"{exc.strerror or exc}: name a file in a writable directory"


if __name__ == "__main__":
    sys.exit(main())
