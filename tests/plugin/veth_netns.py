"""A network namespace holding a veth pair named like the fixture HCAs' netdevs (eth0, eth1),
for the plugin to run in: its link messages are the kernel's own (tests and benchmarks)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager


def ip(*argv: str) -> None:
    subprocess.run(("ip", *argv), check=True, capture_output=True, text=True)


@contextmanager
def veth_netns(name: str) -> Iterator[str]:
    """`name`, created with lo (the metrics port binds 127.0.0.1 there) and eth0<->eth1 up."""
    ip("netns", "add", name)
    try:
        ip("-n", name, "link", "set", "lo", "up")
        ip("-n", name, "link", "add", "eth0", "type", "veth", "peer", "name", "eth1")
        ip("-n", name, "link", "set", "eth0", "up")
        ip("-n", name, "link", "set", "eth1", "up")
        yield name
    finally:
        ip("netns", "delete", name)
