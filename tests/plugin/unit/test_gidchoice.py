"""The GID a pod must use, on fixture GID tables (plugin/gidchoice.py)."""

from __future__ import annotations

import ipaddress

import pytest

from plugin.core.node.discovery.model import ROCE_V2, CharDevices, Gid, GidType, Hca, Port
from plugin.core.podnet.gidchoice import NoGidError, NsAddress, choose

V1: GidType = "IB/RoCE v1"
V2: GidType = ROCE_V2


def _gid(index: int, ip: str, kind: GidType = V2, netdev: str = "eth0") -> Gid:
    addr = ipaddress.ip_address(ip)
    text = str(ipaddress.IPv6Address(f"::ffff:{addr}")) if addr.version == 4 else str(addr)
    return Gid(index=index, gid=text, type=kind, netdev=netdev)


def _hca(name: str, *gids: Gid, state: str = "ACTIVE", link_layer: str = "Ethernet") -> Hca:
    port = Port(number=1, state=state, link_layer=link_layer, netdevs=("eth0",), gids=gids)
    return Hca(name, "15b3", "1017", "mlx5_core", 0, (port,), CharDevices(uverbs="uverbs0"))


def _addr(ip: str, ifname: str = "eth0") -> NsAddress:
    return NsAddress(ifname, ipaddress.ip_address(ip))


# A port's table in the kernel's shared netns mode: the host's GIDs, then two pods' (v1 + v2 each)
HOST_AND_TWO_PODS = (
    _gid(0, "fe80::1", V1),
    _gid(1, "fe80::1", V2),
    _gid(2, "10.0.0.2", V1),
    _gid(3, "10.0.0.2", V2),
    _gid(4, "2001:db8::2", V1),
    _gid(5, "2001:db8::2", V2),
    _gid(6, "fd77::10", V1),
    _gid(7, "fd77::10", V2),
    _gid(8, "fd77::11", V1),
    _gid(9, "fd77::11", V2),
)


@pytest.mark.parametrize(("pod_ip", "index"), [("fd77::10", 7), ("fd77::11", 9)])
def test_each_pod_gets_the_roce_v2_gid_of_its_own_address(pod_ip: str, index: int) -> None:
    pod = [_addr("fe80::1"), _addr(pod_ip), _addr("::1", "lo")]

    choice = choose([_hca("mlx5_0", *HOST_AND_TWO_PODS)], pod, "ipv6")

    assert choice.env() == {
        "NCCL_IB_HCA": "=mlx5_0:1",
        "NCCL_IB_GID_INDEX": str(index),
        "NCCL_SOCKET_IFNAME": "=eth0",
    }


def test_the_host_network_gets_the_hosts_ipv4_gid() -> None:
    host = [_addr("10.0.0.2", "eth0"), _addr("2001:db8::2", "eth0"), _addr("127.0.0.1", "lo")]

    choice = choose([_hca("mlx5_0", *HOST_AND_TWO_PODS)], host, "ipv4")

    assert choice.gid_index == 3


def test_the_host_network_finds_its_ipv4_gid_wherever_it_sits_not_at_a_fixed_3() -> None:
    # the IPv4 address came after an IPv6 one: its RoCE v2 GID is at 5
    hca = _hca(
        "mlx5_0",
        _gid(0, "fe80::1", V1),
        _gid(1, "fe80::1", V2),
        _gid(2, "2001:db8::2", V1),
        _gid(3, "2001:db8::2", V2),
        _gid(4, "10.0.0.2", V1),
        _gid(5, "10.0.0.2", V2),
    )

    assert choose([hca], [_addr("10.0.0.2"), _addr("2001:db8::2")], "ipv4").gid_index == 5


def test_a_link_local_address_is_never_matched() -> None:
    # an ipvlan child shares its parent's MAC: its fe80:: address and GID are the host's too
    with pytest.raises(NoGidError) as caught:
        choose([_hca("mlx5_0", *HOST_AND_TWO_PODS)], [_addr("fe80::1")], "ipv6")

    assert "no RoCE v2 GID for an ipv6 address of this network namespace on mlx5_0" in str(
        caught.value
    )


def test_a_roce_v1_only_gid_does_not_count() -> None:
    with pytest.raises(NoGidError):
        choose([_hca("mlx5_0", _gid(0, "fd77::10", V1))], [_addr("fd77::10")], "ipv6")


def test_an_ipv4_mapped_gid_matches_only_the_ipv4_family() -> None:
    hca = _hca("mlx5_0", _gid(0, "fe80::1", V2), _gid(1, "10.0.0.7", V2))

    assert choose([hca], [_addr("10.0.0.7")], "ipv4").gid_index == 1
    with pytest.raises(NoGidError):
        choose([hca], [_addr("10.0.0.7")], "ipv6")


def test_empty_slots_between_gids_keep_the_kernels_indexes() -> None:
    # the kernel frees a slot when an address goes: later GIDs keep their index
    hca = _hca("mlx5_0", _gid(0, "fe80::1", V2), _gid(6, "fd77::10", V1), _gid(7, "fd77::10"))

    assert choose([hca], [_addr("fd77::10")], "ipv6").gid_index == 7


def test_hcas_with_the_gid_at_the_same_index_share_it() -> None:
    hcas = [
        _hca("mlx5_0", _gid(2, "fd77::10", netdev="eth0")),
        _hca("mlx5_1", _gid(2, "fd78::10", netdev="eth1")),
    ]
    pod = [_addr("fd77::10", "net1"), _addr("fd78::10", "net2")]

    assert choose(hcas, pod, "ipv6").env() == {
        "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1",
        "NCCL_IB_GID_INDEX": "2",
        "NCCL_SOCKET_IFNAME": "=net1,net2",
    }


def test_an_hca_whose_index_differs_from_its_neighbours_is_a_clear_error() -> None:
    hcas = [_hca("mlx5_0", _gid(3, "fd77::10")), _hca("mlx5_1", _gid(5, "fd78::10"))]
    pod = [_addr("fd77::10", "net1"), _addr("fd78::10", "net2")]

    with pytest.raises(NoGidError) as caught:
        choose(hcas, pod, "ipv6")

    message = str(caught.value)
    assert "mlx5_0 port 1: 3; mlx5_1 port 1: 5" in message
    assert "NCCL takes one NCCL_IB_GID_INDEX for all" in message


def test_the_lowest_index_valid_on_every_hca_wins() -> None:
    hcas = [
        _hca("mlx5_0", _gid(3, "fd77::10"), _gid(5, "fd77::20")),
        _hca("mlx5_1", _gid(5, "fd78::20"), _gid(7, "fd78::10")),
    ]
    pod = [_addr(ip) for ip in ("fd77::10", "fd77::20", "fd78::10", "fd78::20")]

    assert choose(hcas, pod, "ipv6").gid_index == 5


def test_an_allocated_hca_without_this_namespaces_gid_is_named() -> None:
    hcas = [_hca("mlx5_0", _gid(3, "fd77::10")), _hca("mlx5_1", _gid(3, "fd99::1"))]

    with pytest.raises(NoGidError) as caught:
        choose(hcas, [_addr("fd77::10")], "ipv6")

    message = str(caught.value)
    assert "on mlx5_1 (RoCE v2 GIDs: mlx5_1 port 1: 3=fd99::1)" in message
    assert "this namespace's addresses: eth0 fd77::10" in message
    assert "hostNetwork: true" in message


def test_a_port_that_is_down_is_not_used() -> None:
    with pytest.raises(NoGidError):
        choose([_hca("mlx5_0", _gid(3, "fd77::10"), state="DOWN")], [_addr("fd77::10")], "ipv6")


def test_no_hca_at_all_is_an_error() -> None:
    with pytest.raises(NoGidError, match=r"\(no HCA allocated\)"):
        choose([], [_addr("fd77::10")], "ipv6")
