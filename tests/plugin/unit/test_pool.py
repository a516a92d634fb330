"""Pool policy: IDs, health, topology, preferred allocation, Allocate specs."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugin.config import PluginConfig, Pool, Selector
from plugin.core.node import pools
from plugin.core.node.discovery.model import CharDevices, Gid, Hca, Inventory, Port
from plugin.core.node.discovery.sysfs import UNREADABLE
from plugin.core.node.netmode import non_host_network_problems
from plugin.deviceplugin.api.v1beta1 import api_pb2
from plugin.deviceplugin.wire import KUBELET_MESSAGE_MAX, list_and_watch_response
from plugin.launch import HCAS_ENV

DEV = Path("/host/dev")


def hca(
    name: str,
    numa: int | None = 0,
    *,
    active: bool = True,
    vendor: str = "15b3",
    netdev: str = "eth0",
    gids: tuple[Gid, ...] = (),
    index: int = 0,
) -> Hca:
    return Hca(
        name=name,
        vendor=vendor,
        device_id="1017",
        driver="mlx5_core",
        numa_node=numa,
        ports=(Port(1, "ACTIVE" if active else "DOWN", "Ethernet", (netdev,), gids),),
        chardevs=CharDevices(uverbs=f"uverbs{index}", umad=(f"umad{index}",)),
    )


def allocate(view: pools.PoolView, ids: list[str], dev: Path) -> pools.Allocation:
    """What the servicer answers for `ids`: their HCAs, checked, then those HCAs' devices."""
    return pools.allocation(view, pools.allocated_hcas(view, ids), dev)


def view(mode: str, hcas: list[Hca], **kw: int) -> pools.PoolView:
    pool = Pool(name="hca", mode=mode, **kw)  # type: ignore[arg-type]
    return pools.build_view(pool, tuple(hcas), rdma_cm=True)


def test_shared_ids_give_every_selected_hca() -> None:
    v = view("shared", [hca("mlx5_0", 0, index=0), hca("mlx5_1", 1, index=1)], max_allocations=3)

    assert [d.id for d in v.devices] == ["hca-0", "hca-1", "hca-2"]
    assert {d.numa_nodes for d in v.devices} == {(0, 1)}
    alloc = allocate(v, ["hca-2"], DEV)
    assert [s.host_path for s in alloc.devices] == [
        "/host/dev/infiniband/" + n for n in ("rdma_cm", "uverbs0", "umad0", "uverbs1", "umad1")
    ]
    assert {s.permissions for s in alloc.devices} == {"rw"}


def test_numa_unknown_gives_no_topology() -> None:
    v = view("exclusive", [hca("mlx5_0", None)])

    assert v.devices[0].numa_nodes == ()


def test_selector_fields_all_apply() -> None:
    cfg = PluginConfig(
        pools=(
            Pool(
                name="a",
                selector=Selector(vendors=("0x15B3",), ibdevs=("mlx5_*",), netdevs=("eth1",)),
            ),
        )
    )
    inv = Inventory(hcas=(hca("mlx5_0"), hca("mlx5_1", netdev="eth1"), hca("rxe0", vendor="")))

    views, conflicts = pools.assign(cfg, inv)

    assert [h.name for h in views[0].hcas] == ["mlx5_1"]
    assert conflicts == []


def test_hca_claimed_by_an_exclusive_and_another_pool_goes_to_the_first() -> None:
    cfg = PluginConfig(
        pools=(
            Pool(name="a", mode="exclusive", selector=Selector(ibdevs=("mlx5_0",))),
            Pool(name="b", mode="exclusive"),
        )
    )

    views, conflicts = pools.assign(cfg, Inventory(hcas=(hca("mlx5_0"), hca("mlx5_1"))))

    assert [[h.name for h in v.hcas] for v in views] == [["mlx5_0"], ["mlx5_1"]]
    assert conflicts == [
        "mlx5_0 is selected by pools a, b and one is exclusive: it goes to a only; "
        "make the selectors disjoint"
    ]


def test_a_pool_whose_hcas_did_not_change_keeps_its_view_and_the_others_are_made_anew() -> None:
    shared = Pool(name="s", selector=Selector(ibdevs=("mlx5_[01]",)), max_allocations=100_000)
    cfg = PluginConfig(pools=(shared, Pool(name="x", mode="exclusive")))
    inventory = Inventory(hcas=(hca("mlx5_0"), hca("mlx5_1"), hca("mlx5_2")))
    first, _ = pools.assign(cfg, inventory)

    again, _ = pools.assign(cfg, inventory, first)
    port_down, _ = pools.assign(
        cfg, Inventory(hcas=(hca("mlx5_0"), hca("mlx5_1"), hca("mlx5_2", active=False))), again
    )
    bigger = PluginConfig(pools=(Pool(name="s", max_allocations=99_999), cfg.pools[1]))
    reconfigured, _ = pools.assign(bigger, inventory, port_down)

    assert [a is b for a, b in zip(first, again, strict=True)] == [True, True]
    assert [a is b for a, b in zip(again, port_down, strict=True)] == [True, False]
    assert not port_down[1].devices[0].healthy
    assert reconfigured[0] is not port_down[0]
    assert len(reconfigured[0].devices) == 99_999


def test_shared_pool_stays_healthy_while_one_hca_is_active() -> None:
    v = view("shared", [hca("mlx5_0", active=False), hca("mlx5_1")], max_allocations=1)
    assert v.devices[0].healthy

    v = view(
        "shared", [hca("mlx5_0", active=False), hca("mlx5_1", active=False)], max_allocations=1
    )
    assert not v.devices[0].healthy
    with pytest.raises(pools.AllocationError, match="'hca-0' is unhealthy: mlx5_0: no ACTIVE"):
        allocate(v, ["hca-0"], DEV)


def test_issm_only_when_present_and_rdma_cm_only_when_present() -> None:
    h = Hca(
        "mlx5_0",
        "15b3",
        "1017",
        "mlx5_core",
        0,
        (Port(1, "ACTIVE", "InfiniBand"),),
        CharDevices("uverbs0", ("umad0",), ("issm0",)),
    )
    v = pools.build_view(Pool(name="hca", mode="exclusive"), (h,), rdma_cm=False)

    names = [s.container_path for s in allocate(v, ["mlx5_0"], DEV).devices]

    assert names == ["/dev/infiniband/uverbs0", "/dev/infiniband/umad0", "/dev/infiniband/issm0"]


def test_non_host_network_needs_global_ipv6_roce_v2_gid_and_shared_netns() -> None:
    v6 = (Gid(1, "fe80::1", "RoCE v2", "eth0"), Gid(2, "2001:db8::1", "RoCE v2", "eth0"))
    v4 = (Gid(1, "fe80::1", "RoCE v2", "eth0"), Gid(3, "::ffff:10.0.0.1", "RoCE v2", "eth0"))
    good, bad = hca("mlx5_0", gids=v6), hca("mlx5_1", gids=v4)

    assert non_host_network_problems(Inventory(netns_mode="shared"), (good,)) == []
    problems = non_host_network_problems(Inventory(netns_mode="exclusive"), (good, bad))
    assert problems[0].startswith("RDMA netns mode is exclusive, not shared")
    assert problems[1].startswith("mlx5_1 port 1 (eth0): no RoCE v2 GID for a global IPv6")
    assert len(problems) == 2


# -- properties ----------------------------------------------------------------------------
hca_lists = st.lists(
    st.tuples(st.sampled_from([None, 0, 1, 2, 3]), st.booleans()), min_size=1, max_size=12
).map(
    lambda specs: [hca(f"mlx5_{i}", numa, active=a, index=i) for i, (numa, a) in enumerate(specs)]
)


@settings(max_examples=60, deadline=None)
@given(
    hcas=hca_lists,
    mode=st.sampled_from(["shared", "exclusive"]),
    slots=st.integers(1, 2000),
    data=st.data(),
)
def test_ids_unique_short_and_allocate_covers_exactly_their_usable_hcas(
    hcas: list[Hca], mode: str, slots: int, data: st.DataObject
) -> None:
    kw = {"max_allocations": slots} if mode == "shared" else {}
    v = view(mode, hcas, **kw)
    ids = [d.id for d in v.devices]
    assert len(ids) == len(set(ids))
    assert all(len(i) <= 63 for i in ids)

    healthy = [d for d in v.devices if d.healthy]
    if not healthy:  # nothing a kubelet could ask for (an empty request is refused)
        return
    chosen = data.draw(
        st.lists(st.sampled_from(healthy), unique_by=lambda d: d.id, min_size=1, max_size=4)
    )
    alloc = allocate(v, [d.id for d in chosen], DEV)
    want = {h for d in chosen for h in d.hcas}
    usable = [h for h in hcas if h.name in want and h.unhealthy_reason() is None]
    got = {Path(s.host_path).name for s in alloc.devices} - {"rdma_cm"}
    assert got == {n for h in usable for n in (h.chardevs.uverbs, *h.chardevs.umad)}
    assert alloc.envs[HCAS_ENV] == ",".join(h.name for h in usable)


@settings(max_examples=100, deadline=None)
@given(hcas=hca_lists, mode=st.sampled_from(["shared", "exclusive"]), data=st.data())
def test_preferred_returns_size_ids_including_must_include(
    hcas: list[Hca], mode: str, data: st.DataObject
) -> None:
    v = view(mode, hcas, **({"max_allocations": 50} if mode == "shared" else {}))
    ids = [d.id for d in v.devices]
    available = data.draw(st.lists(st.sampled_from(ids), unique=True, min_size=1))
    must = data.draw(st.lists(st.sampled_from(available), unique=True))
    size = data.draw(st.integers(len(must) or 1, len(available)))

    result = pools.preferred(v, available, must, size)

    assert len(result) == size
    assert len(set(result)) == size
    assert set(must) <= set(result)
    assert set(result) <= set(available)


def test_preferred_never_returns_an_id_the_pool_does_not_have() -> None:
    v = view("exclusive", [hca("mlx5_0", 0), hca("mlx5_1", 1, index=1)])

    assert pools.preferred(v, ["mlx5_0", "mlx5_1", "bogus"], ["bogus"], 1) == ["mlx5_0"]
    assert pools.preferred(v, ["mlx5_1", "other"], ["ghost", "mlx5_1"], 2) == ["mlx5_1"]


def test_an_hca_whose_port_cannot_be_read_is_not_handed_out_by_a_shared_id() -> None:
    unreadable = Hca(
        name="mlx5_0",
        vendor="15b3",
        device_id="1017",
        driver="mlx5_core",
        numa_node=0,
        ports=(Port(1, UNREADABLE, "unknown", ("eth0",)),),
        chardevs=CharDevices(uverbs="uverbs0", umad=("umad0",)),
    )
    v = view("shared", [unreadable, hca("mlx5_1", index=1)], max_allocations=2)

    alloc = allocate(v, ["hca-0"], DEV)

    assert alloc.envs == {HCAS_ENV: "mlx5_1"}
    assert [Path(s.host_path).name for s in alloc.devices] == ["rdma_cm", "uverbs1", "umad1"]


def test_preferred_packs_on_fewest_numa_nodes() -> None:
    hcas = [hca(f"mlx5_{i}", numa, index=i) for i, numa in enumerate([0, 1, 1, 1, 0])]
    v = view("exclusive", hcas)

    assert pools.preferred(v, [d.id for d in v.devices], [], 3) == ["mlx5_1", "mlx5_2", "mlx5_3"]
    assert pools.preferred(v, [d.id for d in v.devices], ["mlx5_0"], 2) == ["mlx5_0", "mlx5_4"]


@settings(max_examples=50, deadline=None)
@given(hcas=hca_lists, mode=st.sampled_from(["shared", "exclusive"]))
def test_list_and_watch_wire_encoding_equals_the_plain_messages(hcas: list[Hca], mode: str) -> None:
    v = view(mode, hcas, **({"max_allocations": 30} if mode == "shared" else {}))

    plain = api_pb2.ListAndWatchResponse(
        devices=[
            api_pb2.Device(
                ID=d.id,
                health="Healthy" if d.healthy else "Unhealthy",
                topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=n) for n in d.numa_nodes])
                if d.numa_nodes
                else None,
            )
            for d in v.devices
        ]
    )
    assert list_and_watch_response(v) == plain


def test_a_list_over_the_kubelets_message_limit_holds_the_ids_that_fit_and_no_more() -> None:
    """100000 IDs of 63 characters are over the 4 MiB the kubelet takes of one message."""
    hcas = [hca(f"mlx5_{i}", numa=i % 2, index=i) for i in range(8)]
    v = pools.build_view(Pool(name="s" * 57, max_allocations=100_000), tuple(hcas), True)

    listed = list_and_watch_response(v)
    one_more = list_and_watch_response(v, limit=1 << 30).devices[: len(listed.devices) + 1]

    assert 0 < len(listed.devices) < 100_000
    assert [d.ID for d in listed.devices] == [d.id for d in v.devices[: len(listed.devices)]]
    assert listed.ByteSize() <= KUBELET_MESSAGE_MAX
    assert api_pb2.ListAndWatchResponse(devices=one_more).ByteSize() > KUBELET_MESSAGE_MAX


def test_an_allocate_request_with_no_device_id_is_refused() -> None:
    (view,), _ = pools.assign(PluginConfig(), Inventory(hcas=(hca("mlx5_0"),)))

    with pytest.raises(pools.AllocationError, match="a container request with no device ID"):
        allocate(view, [], Path("/dev"))


def test_list_and_watch_encoding_holds_for_an_id_longer_than_127_bytes() -> None:
    # the pool makes no ID that long (it leaves out an HCA whose name exceeds 63 bytes): the
    # encoder must not depend on that, so this view is built by hand
    long_id = "x" * 150
    v = pools.PoolView(
        pool=Pool(name="hca"),
        hcas=(),
        devices=(pools.Device(id=long_id, healthy=False, numa_nodes=(1,), hcas=()),),
        rdma_cm=True,
    )

    (device,) = list_and_watch_response(v).devices

    assert (device.ID, device.health) == (long_id, "Unhealthy")
    assert [n.ID for n in device.topology.nodes] == [1]


def test_the_pool_leaves_out_an_hca_whose_name_is_too_long_for_an_id_and_says_why() -> None:
    long_name = "mlx5_" + "x" * 60
    v = view("exclusive", [hca(long_name, 1), hca("mlx5_1", 0)])

    assert [d.id for d in v.devices] == ["mlx5_1"]
    (why,) = v.skipped
    assert why.startswith(f"{long_name}: its name is 65 characters, over the 63 of a device ID")
