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
import errno
import os
import re
import socket
import stat
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import get_args

from common.terminal import Parser, say, write_stdout
from common.userfiles import described, user_name, why_not_writable, write_atomically
from plugin.core.node.discovery.model import IBDEV_NAME, Hca
from plugin.core.node.discovery.sysfs import SysfsDiscovery
from plugin.core.podnet.gidchoice import COMPUTED, Choice, NoGidError, choose
from plugin.core.podnet.netaddrs import namespace_addresses
from plugin.launch import (
    HCAS_ENV,
    PODENV_MODULE,
    Family,
    FamilyChoice,
    PodenvSpec,
    family_for,
)


def auto_family(hcas: Sequence[Hca], ifnames: set[str]) -> Family:
    """The family for the network this namespace is on. sysfs shows a namespace only its own
    netdevs: in a pod's, an HCA's PCI function lists none and its netdev is not an interface."""
    return family_for(host_network=any(n in ifnames for h in hcas for n in h.netdevs))


def render(choice: Choice, extra: dict[str, str]) -> str:
    """KEY=VALUE lines, sourceable by sh (`set -a; . FILE; set +a`)."""
    env = {**extra, **choice.env()}
    return "".join(f"{k}={_quote(v)}\n" for k, v in env.items())


def _quote(value: str) -> str:
    safe = all(c.isalnum() or c in "=,:._-/" for c in value)
    return value if safe and value else "'" + value.replace("'", "'\\''") + "'"


def _read_hcas(sysfs_root: Path, names: list[str]) -> list[Hca]:
    class_ib = sysfs_root / "class" / "infiniband"
    discovery = SysfsDiscovery(sysfs_root, Path("/dev"))
    hcas: list[Hca] = []
    for name in names:
        try:
            hca = discovery.read_hca(name, {}, {})
        except Exception as exc:  # any fault of its files: this HCA's, said as such
            raise NoGidError(f"{name}: cannot be read from {class_ib / name} ({exc})") from None
        if hca is None:
            there = sorted(p.name for p in class_ib.iterdir()) if class_ib.is_dir() else []
            if there:  # a name mistyped, or an HCA gone since the allocation
                raise NoGidError(f"{name}: not in {class_ib} (there: {', '.join(there)})")
            raise NoGidError(
                f"{name}: not in {class_ib}: the RDMA devices are not visible in this network "
                "namespace (RDMA netns mode exclusive?), or the node's RDMA driver is not loaded"
            )
        hcas.append(hca)
    return hcas


# An environment variable sh can set: ASCII (str.isidentifier also takes 'é').
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep:  # not quoted back: it may be a value alone, a secret one
        raise argparse.ArgumentTypeError("expected KEY=VALUE, e.g. NCCL_IB_TC=136: it has no '='")
    if not _NAME.fullmatch(key):
        raise argparse.ArgumentTypeError(
            f"the key ({described(key)}) is not an ASCII variable name, e.g. NCCL_IB_TC"
        )
    if key in COMPUTED:
        raise argparse.ArgumentTypeError(
            f"{key}: podenv computes it for this pod ({', '.join(COMPUTED)}): drop --set {key}"
        )
    return key, value


def _out(text: str) -> Path:
    if not text:
        raise argparse.ArgumentTypeError("empty: name a file, or omit --out for stdout")
    return Path(text)


def _sysfs(text: str) -> Path:
    if not text:
        raise argparse.ArgumentTypeError("empty: name where sysfs is mounted, e.g. /sys")
    return Path(os.path.abspath(text))


def _hca_names(parser: argparse.ArgumentParser, given: str | None) -> list[str]:
    """The HCAs of --hcas, else of the device plugin's env var: a bad one is named by where it
    came from."""
    text = os.environ.get(HCAS_ENV, "") if given is None else given
    source = "--hcas" if given is not None else f"${HCAS_ENV} (set by the device plugin)"
    names = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names:
        parser.error(
            f"no HCAs: pass --hcas, or run in a container asking for the RDMA resource "
            f"(its Allocate sets {HCAS_ENV})"
        )
    for name in names:
        if not IBDEV_NAME.fullmatch(name):
            parser.error(
                f"{source}: {described(name)} is not an RDMA device name: at most 64 letters, "
                "digits, '_', '.', '-' (e.g. mlx5_0)"
            )
    return names


def main(argv: list[str] | None = None) -> int:
    p = Parser(f"python -m {PODENV_MODULE}", __doc__)
    p.add_argument("--sysfs-root", type=_sysfs, default=Path("/sys"))
    p.add_argument("--hcas", help=f"default ${HCAS_ENV}")
    p.add_argument("--family", choices=get_args(FamilyChoice), default=PodenvSpec().family)
    p.add_argument("--set", type=_key_value, action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", type=_out, help="write here (atomically) instead of stdout")
    args = p.parse_args(argv)
    names = _hca_names(p, args.hcas)
    if not (args.sysfs_root / "class").is_dir():  # a bad argument, not a node without a GID
        p.error(
            f"--sysfs-root {args.sysfs_root}: no class/ there: name where sysfs is mounted (/sys)"
        )
    extra: dict[str, str] = {}
    for key, value in args.set:
        if key in extra:
            p.error(f"--set {key}: given twice: keep one")
        extra[key] = value
    try:
        hcas = _read_hcas(args.sysfs_root, names)
        family: Family = (
            auto_family(hcas, {n for _, n in socket.if_nameindex()})
            if args.family == "auto"
            else args.family
        )
        choice = choose(hcas, namespace_addresses(), family)
    except NoGidError as exc:
        say(f"lingjun-rdma podenv: {exc}")
        return 1
    text = render(choice, extra)
    try:
        if args.out is None:
            write_stdout(text)
        else:
            write_atomically(args.out, text)
    except OSError as exc:
        where = "stdout" if args.out is None else f"--out {args.out}"
        say(f"lingjun-rdma podenv: {where}: {_why(exc, args.out)}")
        return 2
    return 0


def _why(exc: OSError, out: Path | None) -> str:
    if exc.errno == errno.EEXIST or out is None:
        return exc.strerror or str(exc)
    fix = "name a file in a writable directory"
    why = why_not_writable(out.parent)
    if why is not None:
        return f"{out.parent} {why}: {fix}"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # the dir takes files, not their bytes
        return (
            f"{out.parent} has no room for it ({exc.strerror}): free space there (an "
            "emptyDir's sizeLimit), or name a file on another file system"
        )
    if exc.errno == errno.EPERM and (sticky := _held_by_sticky_dir(out)) is not None:
        return (
            f"{out} is {sticky}'s, in a sticky directory (as /tmp is) where only its owner may "
            f"replace it: remove it as {sticky}, or name another file"
        )
    if exc.errno == errno.EPERM and out.exists():  # the dir takes new files: the file is held
        return (
            f"{out} cannot be replaced (Operation not permitted: immutable or append-only? "
            "lsattr shows it): name another file, or chattr -i it"
        )
    return f"cannot write in {out.parent} ({exc.strerror or exc}): {fix}"


def _held_by_sticky_dir(out: Path) -> str | None:
    """The owner of `out` when a sticky directory keeps this user from replacing it."""
    try:
        st, parent = out.lstat(), out.parent.stat()
    except OSError:
        return None
    me = os.geteuid()
    if not parent.st_mode & stat.S_ISVTX or me in (0, st.st_uid, parent.st_uid):
        return None
    return user_name(st.st_uid)


if __name__ == "__main__":
    sys.exit(main())
