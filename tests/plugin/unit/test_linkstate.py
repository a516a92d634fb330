"""Parsing rtnetlink link messages and holding carrier-less ports down (plugin/linkstate.py).
The kernel's own messages are fed to the plugin in tests/plugin/integration/test_carrier.py."""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st

from plugin.core.node.discovery.model import CharDevices, Hca, Inventory, Port
from plugin.core.node.linkstate import carrier_changes, without_carrier

RTM_NEWLINK, RTM_DELLINK, RTM_NEWADDR = 16, 17, 20
UP, LOWER_UP = 0x1, 0x10000


def attr(kind: int, payload: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


def message(kind: int, flags: int, name: str | None, index: int = 7) -> bytes:
    """One netlink message as the kernel lays it out: nlmsghdr, ifinfomsg, then attributes.
    The kernel sends IFLA_IFNAME first; an MTU is put before it here so that the parser must
    walk the attributes rather than rely on that order."""
    body = struct.pack("=BxHiII", 0, 1, index, flags, 0xFFFFFFFF)
    body += attr(4, struct.pack("=I", 1500))  # IFLA_MTU
    if name is not None:
        body += attr(3, name.encode() + b"\0")  # IFLA_IFNAME
    return struct.pack("=IHHII", 16 + len(body), kind, 0, 0, 0) + body


def test_up_with_carrier_is_true_and_anything_less_is_false() -> None:
    data = (
        message(RTM_NEWLINK, UP | LOWER_UP, "eth0")
        + message(RTM_NEWLINK, UP, "eth1")  # up but no carrier (the veth peer is down)
        + message(RTM_NEWLINK, LOWER_UP, "eth2")  # administratively down
    )
    assert carrier_changes(data) == {"eth0": True, "eth1": False, "eth2": False}


def test_the_last_message_about_a_netdev_wins() -> None:
    data = message(RTM_NEWLINK, UP, "eth0") + message(RTM_NEWLINK, UP | LOWER_UP, "eth0")
    assert carrier_changes(data) == {"eth0": True}


def test_other_messages_and_nameless_links_are_skipped() -> None:
    data = (
        message(RTM_NEWADDR, 0, "eth0")
        + message(RTM_DELLINK, 0, "eth1")
        + message(RTM_NEWLINK, 0, None)
        + message(RTM_NEWLINK, UP, "eth3")
    )
    assert carrier_changes(data) == {"eth3": False}


def test_a_truncated_message_ends_the_parse_without_error() -> None:
    whole = message(RTM_NEWLINK, UP, "eth0")
    assert carrier_changes(whole + message(RTM_NEWLINK, UP, "eth1")[:-6]) == {"eth0": False}


@given(st.binary(max_size=512))
def test_any_bytes_parse_without_raising(data: bytes) -> None:
    assert isinstance(carrier_changes(data), dict)


def hca(name: str, *ports: tuple[str, tuple[str, ...]]) -> Hca:
    return Hca(
        name=name,
        vendor="15b3",
        device_id="1017",
        driver="mlx5_core",
        numa_node=0,
        ports=tuple(
            Port(number=i + 1, state=state, link_layer="Ethernet", netdevs=netdevs)
            for i, (state, netdevs) in enumerate(ports)
        ),
        chardevs=CharDevices(uverbs="uverbs0"),
    )


def states(inventory: Inventory) -> dict[str, list[str]]:
    return {h.name: [p.state for p in h.ports] for h in inventory.hcas}


def test_ports_whose_netdevs_all_lost_carrier_go_down_and_no_others() -> None:
    inventory = Inventory(
        hcas=(
            hca("mlx5_0", ("ACTIVE", ("eth0",)), ("ACTIVE", ("eth1",))),
            hca("mlx5_1", ("ACTIVE", ("eth2", "eth3"))),  # one of two netdevs down: still up
            hca("mlx5_ib", ("ACTIVE", ())),  # InfiniBand, no IPoIB: the kernel's word stands
        )
    )
    held = without_carrier(inventory, frozenset({"eth0", "eth2", "eth9"}))
    assert states(held) == {
        "mlx5_0": ["DOWN", "ACTIVE"],
        "mlx5_1": ["ACTIVE"],
        "mlx5_ib": ["ACTIVE"],
    }
    assert held.hcas[0].unhealthy_reason() is None  # its second port still carries it
    both = without_carrier(inventory, frozenset({"eth0", "eth1"}))
    assert both.hcas[0].unhealthy_reason() == "mlx5_0: no ACTIVE port (port 1 DOWN, port 2 DOWN)"


def test_nothing_held_down_returns_the_inventory_itself() -> None:
    inventory = Inventory(hcas=(hca("mlx5_0", ("ACTIVE", ("eth0",))),))
    assert without_carrier(inventory, frozenset()) is inventory
