"""Verbs discovery (pyverbs) and sysfs discovery read the same two rxe devices alike."""

from __future__ import annotations

import pytest

from plugin.core.node.discovery.model import Hca
from plugin.core.node.discovery.sysfs import SysfsDiscovery
from plugin.core.node.discovery.verbs import VerbsDiscovery
from tests.plugin.rdma.guest import DEV, RXES, SYS, Rxe, devinfo_gids, sysfs_gids

pytestmark = pytest.mark.rdma


def by_name(hcas: tuple[Hca, ...]) -> dict[str, Hca]:
    return {h.name: h for h in hcas}


def test_verbs_and_sysfs_discovery_agree_on_both_rxe_devices() -> None:
    verbs = VerbsDiscovery(SYS, DEV).scan()
    sysfs = SysfsDiscovery(SYS, DEV).scan()

    assert verbs.errors == ()
    assert sorted(by_name(verbs.hcas)) == ["rxe0", "rxe1"]
    assert verbs == sysfs
    assert verbs.rdma_cm
    assert verbs.netns_mode == "shared"


@pytest.mark.parametrize("rxe", RXES, ids=lambda r: r.ibdev)
def test_verbs_discovery_reads_the_kernels_port_gids_and_chardevs(rxe: Rxe) -> None:
    hca = by_name(VerbsDiscovery(SYS, DEV).scan().hcas)[rxe.ibdev]

    (port,) = hca.ports
    assert (port.number, port.state, port.link_layer) == (1, "ACTIVE", "Ethernet")
    assert port.netdevs == (rxe.netdev,)
    assert hca.driver == "rxe"
    assert hca.numa_node is None
    v2 = {g.gid: (g.index, g.netdev) for g in port.gids if g.type == "RoCE v2"}
    kernel = {g.gid: (g.index, g.netdev) for g in sysfs_gids(rxe.ibdev) if g.type == "RoCE v2"}
    assert v2[rxe.ipv4_gid] == kernel[rxe.ipv4_gid]
    assert v2[rxe.ipv6] == kernel[rxe.ipv6]
    assert v2[rxe.ipv6][1] == rxe.netdev
    assert {(g.index, g.gid, g.type) for g in port.gids} == devinfo_gids(rxe.ibdev)
    uverbs = hca.chardevs.uverbs
    assert uverbs is not None
    assert (SYS / "class/infiniband_verbs" / uverbs / "ibdev").read_text().strip() == rxe.ibdev
    assert (DEV / "infiniband" / uverbs).is_char_device()
    assert all((DEV / "infiniband" / m).is_char_device() for m in hca.chardevs.umad)
    assert hca.problems == ()
