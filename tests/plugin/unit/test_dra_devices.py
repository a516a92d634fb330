"""The DRA front end's devices (plugin/dra/devices.py) from the core's pool views of a fixture
sysfs tree, and the CDI spec of an allocation (plugin/core/kube/cdi.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from plugin.config import PluginConfig, Pool, Selector
from plugin.core.kube import cdi
from plugin.core.node import pools
from plugin.core.node.discovery.sysfs import SysfsDiscovery
from plugin.dra.checkpoint import Checkpoint, ClaimRef
from plugin.dra.devices import MAX_DEVICES_PER_SLICE, PCIE_ROOT_ATTRIBUTE, slice_devices, slices
from tests.plugin.sysfs_tree import PortSpec, SysfsTree


def _tree(tmp_path: Path) -> SysfsTree:
    """Four HCAs under two PCIe roots, as on a GPU node: two beside each pair of GPUs."""
    tree = SysfsTree(tmp_path).rdma_cm()
    for i, (pci, root, numa) in enumerate(
        [
            ("0000:1a:00.0", "pci0000:17", 0),
            ("0000:1b:00.0", "pci0000:17", 0),
            ("0000:9a:00.0", "pci0000:97", 1),
            ("0000:9b:00.0", "pci0000:97", 1),
        ]
    ):
        port = PortSpec(netdev=f"eth{i}")
        tree.add_pci_hca(f"mlx5_{i}", pci=pci, numa=numa, pcie_root=root, ports=[port])
    return tree


def _views(tree: SysfsTree, *configured: Pool) -> list[pools.PoolView]:
    inventory = SysfsDiscovery(tree.sys, tree.dev).scan()
    views, conflicts = pools.assign(PluginConfig(pools=configured), inventory)
    assert conflicts == []
    return views


def test_a_shared_pool_publishes_its_share_devices_each_granting_every_hca(
    tmp_path: Path,
) -> None:
    devices, skipped = slice_devices(_views(_tree(tmp_path), Pool(name="hca", max_allocations=3)))

    assert skipped == []
    assert [d.name for d in devices] == ["hca-0", "hca-1", "hca-2"]
    assert {d.hcas for d in devices} == {("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3")}
    assert devices[0].as_api() == {
        "name": "hca-0",
        "attributes": {
            "mode": {"string": "shared"},
            "pool": {"string": "hca"},
            "hcas": {"string": "mlx5_0,mlx5_1,mlx5_2,mlx5_3"},
        },
    }


def test_an_exclusive_pool_publishes_one_device_per_hca_with_its_pcie_root(
    tmp_path: Path,
) -> None:
    devices, _ = slice_devices(_views(_tree(tmp_path), Pool(name="nic", mode="exclusive")))

    by_name = {d.name: d.as_api()["attributes"] for d in devices}
    assert sorted(by_name) == ["nic-mlx5-0", "nic-mlx5-1", "nic-mlx5-2", "nic-mlx5-3"]
    assert by_name["nic-mlx5-2"] == {
        "mode": {"string": "exclusive"},
        "pool": {"string": "nic"},
        "ibdev": {"string": "mlx5_2"},
        "vendor": {"string": "15b3"},
        "deviceID": {"string": "1017"},
        "driver": {"string": "mlx5_core"},
        "linkLayer": {"string": "Ethernet"},
        "portState": {"string": "ACTIVE"},
        "netdev": {"string": "eth2"},
        "numaNode": {"int": 1},
        PCIE_ROOT_ATTRIBUTE: {"string": "pci0000:97"},
    }


def test_an_hca_not_usable_now_is_withdrawn_and_shares_go_only_with_the_last_one(
    tmp_path: Path,
) -> None:
    tree = _tree(tmp_path)
    tree.set_port("mlx5_1", 1, "DOWN")
    configured = (
        Pool(name="nic", mode="exclusive", selector=Selector(ibdevs=("mlx5_[01]",))),
        Pool(name="hca", max_allocations=2, selector=Selector(ibdevs=("mlx5_[23]",))),
    )

    devices, _ = slice_devices(_views(tree, *configured))
    assert [d.name for d in devices] == ["nic-mlx5-0", "hca-0", "hca-1"]

    tree.set_port("mlx5_2", 1, "DOWN")
    devices, _ = slice_devices(_views(tree, *configured))
    assert [(d.name, d.hcas) for d in devices if d.pool == "hca"] == [
        ("hca-0", ("mlx5_3",)),
        ("hca-1", ("mlx5_3",)),
    ]

    tree.set_port("mlx5_3", 1, "DOWN")
    devices, _ = slice_devices(_views(tree, *configured))
    assert [d.name for d in devices] == ["nic-mlx5-0"]


def test_device_names_that_collide_as_dns_labels_are_skipped_and_said(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path).rdma_cm()
    tree.add_pci_hca("mlx5_0", pci="0000:1a:00.0")
    tree.add_pci_hca("mlx5-0", pci="0000:1b:00.0")

    devices, skipped = slice_devices(_views(tree, Pool(name="nic", mode="exclusive")))

    assert len(devices) == 1
    assert len(skipped) == 1
    assert skipped == [
        "nic: device nic-mlx5-0 is not published: rename one of its HCAs, whose names read alike "
        "as a DNS label"
    ]


def test_a_device_name_two_pools_make_names_the_other_pool(tmp_path: Path) -> None:
    """An exclusive pool x's mlx5_0 and a shared pool x-mlx5's first slot are both x-mlx5-0."""
    tree = SysfsTree(tmp_path).rdma_cm()
    tree.add_pci_hca("mlx5_0", pci="0000:1a:00.0")
    tree.add_pci_hca("mlx5_1", pci="0000:1b:00.0")
    configured = (
        Pool(name="x", mode="exclusive", selector=Selector(ibdevs=("mlx5_0",))),
        Pool(name="x-mlx5", max_allocations=2, selector=Selector(ibdevs=("mlx5_1",))),
    )

    devices, skipped = slice_devices(_views(tree, *configured))

    assert [(d.name, d.pool) for d in devices] == [("x-mlx5-0", "x"), ("x-mlx5-1", "x-mlx5")]
    assert skipped == [
        "x-mlx5: device x-mlx5-0 is not published: rename this pool or pool x, which has a "
        "device of that name"
    ]


@pytest.mark.parametrize(("count", "sizes"), [(0, [0]), (128, [128]), (1000, [128] * 7 + [104])])
def test_slices_hold_at_most_128_devices(tmp_path: Path, count: int, sizes: list[int]) -> None:
    tree = _tree(tmp_path)
    configured = (Pool(name="hca", max_allocations=max(count, 1)),)
    devices, _ = slice_devices(_views(tree, *configured))

    parts = slices(devices[:count])

    assert [len(p) for p in parts] == sizes
    assert max(sizes) <= MAX_DEVICES_PER_SLICE


def test_a_cdi_spec_holds_each_devices_nodes_and_env(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    (view,) = _views(tree, Pool(name="hca"))
    allocation = pools.allocation(view, ("mlx5_1",), Path("/dev"))

    spec = cdi.spec("rdma.lingjun-rdma.io/hca", {"uid-1-hca-0": allocation})
    cdi.write_spec(tmp_path / "cdi", "x.json", spec)

    assert json.loads((tmp_path / "cdi" / "x.json").read_text()) == {
        "cdiVersion": "0.6.0",
        "kind": "rdma.lingjun-rdma.io/hca",
        "devices": [
            {
                "name": "uid-1-hca-0",
                "containerEdits": {
                    "deviceNodes": [
                        {
                            "path": f"/dev/infiniband/{n}",
                            "hostPath": f"/dev/infiniband/{n}",
                            "permissions": "rw",
                        }
                        for n in ("rdma_cm", "uverbs1", "umad1")
                    ],
                    "env": ["LINGJUN_RDMA_HCAS=mlx5_1"],
                },
            }
        ],
    }
    with pytest.raises(cdi.CdiError, match="is not a CDI device name"):
        cdi.spec("rdma.lingjun-rdma.io/hca", {"-bad/name": allocation})


@pytest.mark.parametrize("dev_root", [Path("/dev"), Path("/tmp/node/dev")])
def test_every_spec_the_writer_makes_is_known_as_ours_where_the_nodes_dev_is(
    tmp_path: Path, dev_root: Path
) -> None:
    """The check that keeps a device someone else wrote out of a spec file of ours (a mount, a
    disk as a device node) passes every device cdi.spec writes, wherever the node's /dev is."""
    tree = _tree(tmp_path)
    (view,) = _views(tree, Pool(name="hca"))
    kind = "rdma.lingjun-rdma.io/hca"
    spec = cdi.spec(kind, {"u-1-hca-0": pools.allocation(view, ("mlx5_0", "mlx5_1"), dev_root)})
    (device,) = spec["devices"]  # type: ignore[misc]

    assert cdi.is_ours(device, "u-1-hca-0", dev_root / "infiniband")
    assert not cdi.is_ours(device, "u-1-hca-0", Path("/elsewhere/dev/infiniband"))


def test_records_are_read_back_as_written_and_removed_for_good(tmp_path: Path) -> None:
    checkpoint = Checkpoint(tmp_path / "claims")
    assert checkpoint.load() == {}
    one, two = ClaimRef("default", "u-1", "c1"), ClaimRef("ns", "u-2", "c.2")
    checkpoint.add(one)
    checkpoint.add(two)
    checkpoint.remove("u-1")
    checkpoint.remove("u-9")  # never recorded: nothing to do

    assert Checkpoint(tmp_path / "claims").load() == {"u-2": two}
    assert sorted(p.name for p in (tmp_path / "claims").iterdir()) == ["u-2.json"]


@pytest.mark.parametrize(
    "text",
    ['{"namespace": "default", "name": "c", "uid": "u-other"}',
     '{"namespace": "../x", "name": "c", "uid": "u-1"}',
     '{"namespace": "default", "name": "c", "uid": "u-1", "spec": {}}',
     "[]", "{not json"],
    ids=["another-uid", "namespace-a-path", "more-fields", "a-list", "not-json"],
)  # fmt: skip
def test_a_file_among_the_records_that_is_not_one_is_not_counted(tmp_path: Path, text: str) -> None:
    (tmp_path / "claims").mkdir()
    (tmp_path / "claims" / "u-1.json").write_text(text)

    assert Checkpoint(tmp_path / "claims").load() == {}
    assert (tmp_path / "claims" / "u-1.json").read_text() == text  # kept as it is
