"""The facts the nonHostNetwork (IPv6) mode rests on, on a real kernel: a pod's interface is an
ipvlan/macvlan child of the RDMA netdev in the pod's own network namespace; in RDMA netns mode
`shared` its address becomes a RoCE v2 GID of the parent's device, usable from that namespace."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterator

import pytest

from plugin.core.node.discovery.sysfs import SysfsDiscovery
from plugin.core.node.discovery.verbs import VerbsDiscovery
from tests.plugin.rdma.conftest import FIGURES
from tests.plugin.rdma.guest import (
    DEV,
    RXE0,
    RXE1,
    SYS,
    gid_index,
    run,
    sysfs_gids,
    transfer_command,
    wait_gid,
)

pytestmark = pytest.mark.rdma

NETNS = "pod"
CHILD = "eth0"  # what the pod sees
CHILD_IPV6 = "fd77::10"
CHILD_IPV4 = "192.168.77.10"
KINDS = {
    "ipvlan": ("type", "ipvlan", "mode", "l2"),
    "macvlan": ("type", "macvlan", "mode", "bridge"),
}


@pytest.fixture
def pod_netns() -> Iterator[str]:
    run("ip", "netns", "add", NETNS)
    yield NETNS
    run("ip", "netns", "delete", NETNS)  # takes the child netdev (and its GIDs) with it


def add_child(kind: str, *, ipv6: bool, ipv4: bool) -> None:
    """A child of rxe0's netdev, moved into the pod's namespace, addressed there."""
    run("ip", "link", "add", "link", RXE0.netdev, "name", "child", *KINDS[kind])
    run("ip", "link", "set", "child", "netns", NETNS)
    pod = ("ip", "netns", "exec", NETNS)
    run(*pod, "ip", "link", "set", "child", "name", CHILD)
    if not ipv6:  # not even a link-local address: the child has only IPv4
        run(*pod, "sysctl", "-qw", f"net.ipv6.conf.{CHILD}.disable_ipv6=1")
    if ipv6:
        run(*pod, "ip", "addr", "add", f"{CHILD_IPV6}/64", "dev", CHILD, "nodad")
    if ipv4:
        run(*pod, "ip", "addr", "add", f"{CHILD_IPV4}/24", "dev", CHILD)
    run(*pod, "ip", "link", "set", "lo", "up")
    run(*pod, "ip", "link", "set", CHILD, "up")


def transfer_from_pod(index: int, peer_gid: str, *, inbound: bool = False) -> tuple[int, str]:
    """rc_transfer inside the pod's netns between rxe0 with the child's GID index and rxe1;
    rxe0 is the requester (it writes and sends), or with `inbound` rxe1 is."""
    peer = gid_index(RXE1.ibdev, peer_gid)
    assert peer is not None
    ends = [(RXE0.ibdev, index), (RXE1.ibdev, peer)]
    if inbound:
        ends.reverse()
    (a, a_gid), (b, b_gid) = ends
    # 5 s: a transfer that works here takes well under 1 s; these are expected to time out.
    command = transfer_command(a, a_gid, b, b_gid, timeout=5.0)
    done = run("ip", "netns", "exec", NETNS, *command, check=False)
    return done.returncode, (done.stdout + done.stderr).strip().splitlines()[-1]


def packet_counts() -> dict[str, int]:
    """tx packets of each interface on the path, IPv6 UDP datagrams to no socket, and the
    packets each rxe device sent and took in: where the transfer's packets went."""
    counts = {
        dev: int((SYS / "class/net" / dev / "statistics/tx_packets").read_text())
        for dev in ("lo", RXE0.netdev, RXE1.netdev)
    }
    pod = run("ip", "netns", "exec", NETNS, "cat", f"/sys/class/net/{CHILD}/statistics/tx_packets")
    counts[f"{NETNS}/{CHILD}"] = int(pod.stdout)
    for netns in ("", NETNS):
        snmp = run(*(("ip", "netns", "exec", netns) if netns else ()), "cat", "/proc/net/snmp6")
        fields = dict(line.split() for line in snmp.stdout.splitlines() if line.strip())
        counts[f"{netns or 'host'} Udp6NoPorts"] = int(fields["Udp6NoPorts"])
    for rxe in (RXE0, RXE1):
        for counter in ("sent_pkts", "rcvd_pkts"):
            path = SYS / "class/infiniband" / rxe.ibdev / "ports/1/hw_counters" / counter
            counts[f"{rxe.ibdev} {counter}"] = int(path.read_text())
    return counts


def rxe_kernel_messages() -> list[str]:
    """What rxe told the kernel log after it came up (a failed route lookup would show)."""
    lines = [line.split("] ", 1)[-1] for line in run("dmesg").stdout.splitlines()]
    return [
        line
        for line in lines
        if "rxe" in line
        # port state changes of the health tests: 6.1 words them "set …", 7.x "Link …"
        and not line.endswith(("loaded", "veth0", "veth1", "set active", "set down"))
        and not line.endswith(("Link ACTIVE", "Link DOWN"))
    ]


@pytest.mark.usefixtures("pod_netns")
@pytest.mark.parametrize("kind", KINDS)
def test_a_child_with_a_global_ipv6_in_a_pod_netns_gets_a_roce_v2_gid(kind: str) -> None:
    assert (SYS / "module/ib_core/parameters/netns_mode").read_text().strip() == "Y"

    add_child(kind, ipv6=True, ipv4=False)
    index = wait_gid(RXE0.ibdev, CHILD_IPV6)

    assert index is not None, f"no RoCE v2 GID for {CHILD_IPV6}: {sysfs_gids(RXE0.ibdev)}"
    (entry,) = [g for g in sysfs_gids(RXE0.ibdev) if g.index == index]
    assert entry.netdev == CHILD
    # What the plugin's nonHostNetwork check reads, through both discoveries.
    for discovery in (VerbsDiscovery(SYS, DEV), SysfsDiscovery(SYS, DEV)):
        inventory = discovery.scan()
        assert inventory.netns_mode == "shared"
        (hca,) = [h for h in inventory.hcas if h.name == RXE0.ibdev]
        gids = {g.index: g for g in hca.ports[0].gids}
        assert (gids[index].gid, gids[index].netdev) == (CHILD_IPV6, CHILD)
        assert gids[index].is_global_ipv6
    FIGURES.append(
        f"netns: {kind} child of {RXE0.netdev} in netns {NETNS!r} with {CHILD_IPV6}: RoCE v2 "
        f"GID index {index} on {RXE0.ibdev}, ndev {entry.netdev!r} (netns mode shared)"
    )


@pytest.mark.usefixtures("pod_netns")
# ipvlan only: macvlan behaved the same way when tried (and each try costs ~25 s under TCG).
@pytest.mark.parametrize("kind", ["ipvlan"])
@pytest.mark.xfail(
    strict=True,  # the day a kernel carries it, this turns red: then drop the mark
    raises=AssertionError,
    # Observed (counters in the run's figures). 6.1: rxe routes in the initial netns, so the
    # pod's requests go out through lo there and are lost. 7.x (rxe routes in the GID
    # netdev's netns): the requests leave through the child and the bytes arrive, but every
    # response to the child's address is handed to the pod's netns by ipvlan/macvlan, and rxe
    # takes received packets only on its own netdev or a VLAN of it (rxe_udp_encap_recv,
    # rxe_chk_dgid): no completion, either way.
    reason="Soft-RoCE (rxe) does not receive RoCE v2 packets addressed to an ipvlan/macvlan "
    "child's GID; a RoCE HCA matches them to its GID table in hardware",
)
def test_rdma_from_a_pod_netns_over_its_childs_ipv6_gid(kind: str) -> None:
    add_child(kind, ipv6=True, ipv4=False)
    index = wait_gid(RXE0.ibdev, CHILD_IPV6)
    assert index is not None

    results: list[tuple[int, str]] = []
    for inbound in (False, True):  # both ways: which direction is lost tells why
        before = packet_counts()
        code, last = transfer_from_pod(index, RXE1.ipv6, inbound=inbound)
        after = packet_counts()
        delta = {k: after[k] - before[k] for k in after if after[k] != before[k]}
        way = f"{RXE1.ipv6} -> {CHILD_IPV6}" if inbound else f"{CHILD_IPV6} -> {RXE1.ipv6}"
        FIGURES.append(
            f"netns ({os.uname().release}): RC transfer in netns {NETNS!r} over the {kind} "
            f"child's GID {index} ({way}): "
            f"exit {code}: {last}; counters moved: {delta}; "
            f"rxe in the kernel log: {rxe_kernel_messages()}"
        )
        results.append((code, last))
    assert results == [(0, results[0][1]), (0, results[1][1])], results


@pytest.mark.usefixtures("pod_netns")
@pytest.mark.parametrize("kind", KINDS)
def test_a_child_with_only_ipv4_in_a_pod_netns_gets_an_ipv4_mapped_gid(kind: str) -> None:
    add_child(kind, ipv6=False, ipv4=True)
    mapped = f"::ffff:{CHILD_IPV4}"
    index = wait_gid(RXE0.ibdev, mapped)

    gids = [(g.index, g.gid, g.type) for g in sysfs_gids(RXE0.ibdev) if g.netdev == CHILD]
    outcome = "not tried"
    if index is not None:  # recorded, not asserted: the transfer test above says why it fails
        code, last = transfer_from_pod(index, RXE1.ipv4_gid)
        outcome = f"exit {code}: {last}"
    FIGURES.append(
        f"netns: {kind} child with only {CHILD_IPV4} (IPv6 disabled on it): its GIDs {gids}; "
        f"RC transfer from the netns over that GID -> {outcome}"
    )
    assert gids == [(index, str(ipaddress.IPv6Address(mapped)), "RoCE v2")]
