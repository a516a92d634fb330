"""The pod GID resolver (`python -m plugin.podenv`) on a real kernel: two "pods" (network
namespaces, each with an ipvlan child of rxe0's netdev and its own global IPv6 address) share
rxe0's one GID table with the host. Each gets its own GID index; NCCL's automatic choice,
applied to the same table, does not."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterator

import pytest

from tests.plugin.rdma.conftest import FIGURES
from tests.plugin.rdma.guest import RXE0, RXE1, SysfsGid, gid_index, run, sysfs_gids, wait_gid

pytestmark = pytest.mark.rdma

PODS = {"poda": "fd77::10", "podb": "fd77::11"}
IPV4_POD = ("podc", "192.168.77.30")


def _pod(netns: str, *, ipv6: str | None = None, ipv4: str | None = None) -> None:
    """A pod's namespace: lo, and eth0, an ipvlan child of rxe0's netdev, with its address."""
    run("ip", "netns", "add", netns)
    run(
        "ip",
        "link",
        "add",
        "link",
        RXE0.netdev,
        "name",
        f"c-{netns}",
        "type",
        "ipvlan",
        "mode",
        "l2",
    )
    run("ip", "link", "set", f"c-{netns}", "netns", netns)
    pod = ("ip", "netns", "exec", netns)
    run(*pod, "ip", "link", "set", f"c-{netns}", "name", "eth0")
    if ipv6 is None:
        run(*pod, "sysctl", "-qw", "net.ipv6.conf.eth0.disable_ipv6=1")
    else:
        run(*pod, "ip", "addr", "add", f"{ipv6}/64", "dev", "eth0", "nodad")
    if ipv4 is not None:
        run(*pod, "ip", "addr", "add", f"{ipv4}/24", "dev", "eth0")
    run(*pod, "ip", "link", "set", "lo", "up")
    run(*pod, "ip", "link", "set", "eth0", "up")


@pytest.fixture
def two_pods() -> Iterator[dict[str, int]]:
    """poda and podb, with the GID index the kernel gave each pod's address on rxe0."""
    try:
        for netns, ip in PODS.items():
            _pod(netns, ipv6=ip)
        indexes = {netns: wait_gid(RXE0.ibdev, ip) for netns, ip in PODS.items()}
        assert None not in indexes.values(), sysfs_gids(RXE0.ibdev)
        yield {k: v for k, v in indexes.items() if v is not None}
    finally:
        for netns in PODS:
            run("ip", "netns", "delete", netns, check=False)


def podenv(netns: str, *args: str) -> tuple[int, dict[str, str], str]:
    """The resolver as the init container runs it, inside `netns`: (exit, variables, stderr)."""
    done = run(
        *("ip", "netns", "exec", netns, "python3", "-m", "plugin.podenv"),
        *("--sysfs-root", "/sys", "--hcas", RXE0.ibdev, *args),
        check=False,
    )
    env = dict(line.split("=", 1) for line in done.stdout.splitlines())
    return done.returncode, env, done.stderr.strip()


def _family(gid: SysfsGid) -> int:
    return 4 if ipaddress.IPv6Address(gid.gid).ipv4_mapped else 6


def nccl_auto_gid_index(gids: list[SysfsGid], family: int, prefix: str | None = None) -> int:
    """NCCL's own choice when NCCL_IB_GID_INDEX is unset (ncclIbGetGidIndex and
    ncclUpdateGidIndex, net_ib.cc): from index 0, a later GID of the wanted family replaces the
    current one of another family, or one of the same family whose RoCE version differs and is
    v2; NCCL_IB_ADDR_RANGE (`prefix`) filters candidates. Empty slots never win: left out."""
    table = {g.index: g for g in gids}
    version = {g.index: 2 if g.type == "RoCE v2" else 1 for g in gids}
    network = ipaddress.ip_network(prefix) if prefix else None
    current = 0
    for candidate in sorted(i for i in table if i > 0):
        c = table[candidate]
        in_range = network is None or ipaddress.ip_address(c.gid) in network
        wanted = _family(c) == family and in_range
        other_family = _family(c) != _family(table[current])
        if wanted and (other_family or version[current] != version[candidate] == 2):
            current = candidate
    return current


def test_each_pod_gets_its_own_gid_index_where_nccls_own_rule_does_not(
    two_pods: dict[str, int],
) -> None:
    gids = sysfs_gids(RXE0.ibdev)
    nccl = nccl_auto_gid_index(gids, 6)
    nccl_ranged = nccl_auto_gid_index(gids, 6, "fd77::/64")
    resolved: dict[str, int] = {}
    for netns, index in two_pods.items():
        code, env, err = podenv(netns)  # family auto: rxe0's netdev is not in a pod's netns
        assert code == 0, err
        assert env["NCCL_IB_HCA"] == f"={RXE0.ibdev}:1"
        assert env["NCCL_SOCKET_IFNAME"] == "=eth0"
        resolved[netns] = int(env["NCCL_IB_GID_INDEX"])
        FIGURES.append(
            f"podenv ({os.uname().release}): {netns} ({PODS[netns]}): resolver -> GID "
            f"{resolved[netns]} (the kernel's index for its address: {index}); NCCL's own "
            f"rule (AF_INET6) -> {nccl} ({gids_at(gids, nccl)}), with NCCL_IB_ADDR_RANGE="
            f"fd77::/64 -> {nccl_ranged} ({gids_at(gids, nccl_ranged)})"
        )

    assert resolved == two_pods
    assert resolved["poda"] != resolved["podb"]
    assert any(nccl != i for i in resolved.values())
    assert any(nccl_ranged != i for i in resolved.values())


def gids_at(gids: list[SysfsGid], index: int) -> str:
    (g,) = [g for g in gids if g.index == index]
    return f"{g.gid} {g.type} ndev {g.netdev}"


def test_a_qp_in_pod_a_reaches_rtr_with_its_own_gid(two_pods: dict[str, int]) -> None:
    peer = gid_index(RXE1.ibdev, RXE1.ipv6)
    assert peer is not None
    # the host's GID that NCCL's own rule would give the pod (its netdev's link-local one)
    host = nccl_auto_gid_index(sysfs_gids(RXE0.ibdev), 6)

    def rtr(index: int) -> str:
        done = run(
            *("ip", "netns", "exec", "poda", "python3", "-m", "tests.plugin.rdma.rc_transfer"),
            *("--rtr", f"{RXE0.ibdev}:{index}", f"{RXE1.ibdev}:{peer}"),
            check=False,
        )
        return (done.stdout + done.stderr).strip().splitlines()[-1]

    own = rtr(two_pods["poda"])
    # Recorded, not asserted: upstream rxe checks no namespace here and is expected to accept
    # both; MLNX_OFED's ib_core refuses them (ENODEV: the GID's netdev is not in poda's netns).
    with_podb, with_host = rtr(two_pods["podb"]), rtr(host)
    FIGURES.append(
        f"podenv ({os.uname().release}): a QP created in poda: with its own GID "
        f"{two_pods['poda']}: {own}; with podb's GID {two_pods['podb']}: {with_podb}; "
        f"with the host's GID {host}: {with_host}"
    )
    assert own.startswith("RTR ok"), own


def test_on_the_host_network_the_resolver_finds_the_hosts_ipv4_gid() -> None:
    expected = gid_index(RXE0.ibdev, RXE0.ipv4_gid)

    # family auto: rxe0's netdev is an interface of this namespace, the host's
    done = run("python3", "-m", "plugin.podenv", "--sysfs-root", "/sys", "--hcas", RXE0.ibdev)

    env = dict(line.split("=", 1) for line in done.stdout.splitlines())
    FIGURES.append(
        f"podenv ({os.uname().release}): host network, family auto: resolver -> "
        f"{env['NCCL_IB_GID_INDEX']} ({RXE0.ipv4} on {env['NCCL_SOCKET_IFNAME']})"
    )
    assert env["NCCL_IB_GID_INDEX"] == str(expected)
    assert env["NCCL_SOCKET_IFNAME"] == f"={RXE0.netdev}"


def test_an_ipv4_only_child_gets_the_resolvers_clear_failure() -> None:
    netns, ipv4 = IPV4_POD
    try:
        _pod(netns, ipv4=ipv4)
        assert wait_gid(RXE0.ibdev, f"::ffff:{ipv4}") is not None

        code, env, err = podenv(netns, "--family", "ipv6")  # what a Job off the host network runs
    finally:
        run("ip", "netns", "delete", netns, check=False)

    FIGURES.append(f"podenv ({os.uname().release}): {netns} with only {ipv4}: exit {code}: {err}")
    assert code == 1
    assert env == {}
    assert f"no RoCE v2 GID for an ipv6 address of this network namespace on {RXE0.ibdev}" in err
    assert f"eth0 {ipv4}" in err
