"""sysfs discovery on fixture trees in the real kernel layout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from plugin.core.node.discovery.model import Gid, Hca
from plugin.core.node.discovery.sysfs import SysfsDiscovery, pcie_root_of
from tests.plugin.sysfs_tree import PortSpec, SysfsTree, two_mlx5


def scan(tree: SysfsTree) -> dict[str, Hca]:
    inventory = SysfsDiscovery(tree.sys, tree.dev).scan()
    return {h.name: h for h in inventory.hcas}


def test_two_mlx5_hcas_on_numa_0_and_1_with_roce_v2_gids(tmp_path: Path) -> None:
    tree = two_mlx5(tmp_path)
    inventory = SysfsDiscovery(tree.sys, tree.dev).scan()
    hcas = {h.name: h for h in inventory.hcas}

    assert inventory.rdma_cm
    assert inventory.netns_mode == "shared"
    m0, m1 = hcas["mlx5_0"], hcas["mlx5_1"]
    assert (m0.vendor, m0.device_id, m0.driver, m0.numa_node) == ("15b3", "1017", "mlx5_core", 0)
    assert m1.numa_node == 1
    (port,) = m0.ports
    assert (port.number, port.state, port.link_layer, port.netdevs) == (
        1,
        "ACTIVE",
        "Ethernet",
        ("eth0",),
    )
    assert port.gids == (
        Gid(0, "fe80::a0", "IB/RoCE v1", "eth0"),
        Gid(1, "fe80::a0", "RoCE v2", "eth0"),
        Gid(2, "::ffff:a00:2", "IB/RoCE v1", "eth0"),
        Gid(3, "::ffff:a00:2", "RoCE v2", "eth0"),
    )
    assert (m0.chardevs.uverbs, m0.chardevs.umad, m0.chardevs.issm) == ("uverbs0", ("umad0",), ())
    assert m1.chardevs.uverbs == "uverbs1"
    assert m0.unhealthy_reason() is None
    assert m0.problems == ()


def test_infiniband_hca_with_issm(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path).add_pci_hca(
        "mlx5_ib0",
        pci="0000:41:00.0",
        numa=1,
        device="0x101b",
        ports=[PortSpec(link_layer="InfiniBand", netdev="ib0", gids=[("fe80::1:2", "IB/RoCE v1")])],
        issm=True,
    )

    hca = scan(tree)["mlx5_ib0"]

    assert hca.link_layers == ("InfiniBand",)
    assert hca.device_id == "101b"
    assert hca.ports[0].gids == (Gid(0, "fe80::1:2", "IB/RoCE v1", "ib0"),)
    assert (hca.chardevs.umad, hca.chardevs.issm) == (("umad0",), ("issm0",))


def test_soft_roce_without_pci_parent(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path).add_rxe(
        "rxe0", "veth0", PortSpec(netdev="veth0", gids=[("2001:db8::5", "RoCE v2")])
    )

    hca = scan(tree)["rxe0"]

    assert (hca.vendor, hca.device_id, hca.driver, hca.numa_node) == ("", "", "rxe", None)
    assert hca.netdevs == ("veth0",)
    assert hca.ports[0].gids[0].is_global_ipv6


def test_numa_minus_one_means_unknown(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path).add_pci_hca("mlx5_0", pci="0000:03:00.0", numa=-1)

    assert scan(tree)["mlx5_0"].numa_node is None


def test_missing_umad_is_a_problem_not_unhealthy(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path).add_pci_hca("mlx5_0", pci="0000:03:00.0", umad=False)

    hca = scan(tree)["mlx5_0"]

    assert hca.chardevs.umad == ()
    assert hca.unhealthy_reason() is None
    assert any("no umad" in p for p in hca.problems)


def test_port_down_is_unhealthy_with_reason(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path).add_pci_hca(
        "mlx5_0", pci="0000:03:00.0", ports=[PortSpec(state="DOWN", netdev="eth0")]
    )

    assert scan(tree)["mlx5_0"].unhealthy_reason() == "mlx5_0: no ACTIVE port (port 1 DOWN)"


def test_missing_device_node_is_unhealthy(tmp_path: Path) -> None:
    tree = two_mlx5(tmp_path)
    tree.remove_device_node("uverbs0")

    hca = scan(tree)["mlx5_0"]

    assert hca.unhealthy_reason() == "mlx5_0: no uverbs device node"
    assert any("uverbs0 does not exist" in p for p in hca.problems)


def test_dual_port_hca_splits_netdevs_by_dev_port(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path).add_pci_hca(
        "mlx5_0",
        pci="0000:03:00.0",
        ports=[PortSpec(netdev="eth0"), PortSpec(state="DOWN", netdev="eth1")],
    )

    hca = scan(tree)["mlx5_0"]

    assert [(p.number, p.netdevs, p.state) for p in hca.ports] == [
        (1, ("eth0",), "ACTIVE"),
        (2, ("eth1",), "DOWN"),
    ]
    assert hca.chardevs.umad == ("umad0", "umad1")


def test_no_rdma_at_all_is_an_empty_inventory(tmp_path: Path) -> None:
    inventory = SysfsDiscovery(tmp_path / "sys", tmp_path / "dev").scan()

    assert inventory.hcas == ()
    assert not inventory.rdma_cm
    assert inventory.netns_mode is None


def test_verbs_discovery_without_rdma_reports_zero_devices(tmp_path: Path) -> None:
    verbs = pytest.importorskip(
        "plugin.core.node.discovery.verbs", reason="missing optional peer: pyverbs"
    )
    discovery = verbs.VerbsDiscovery(tmp_path / "sys", tmp_path / "dev")
    if Path("/sys/class/infiniband_verbs").exists():
        pytest.skip("missing optional peer: a host without RDMA (this one has verbs devices)")

    inventory = discovery.scan()

    assert inventory.hcas == ()
    assert "libibverbs finds no RDMA devices" in inventory.errors[0]


def test_a_port_state_that_is_not_text_makes_that_port_unhealthy_not_the_scan_fail(
    tmp_path: Path,
) -> None:
    tree = two_mlx5(tmp_path)
    (tree.port_dir("mlx5_0") / "state").write_bytes(b"4: \xff\xfeACTIVE\n")

    hcas = scan(tree)

    (port,) = hcas["mlx5_0"].ports
    assert port.state == "UNREADABLE"
    assert hcas["mlx5_0"].unhealthy_reason() == "mlx5_0: no ACTIVE port (port 1 UNREADABLE)"
    assert hcas["mlx5_1"].unhealthy_reason() is None


def test_a_garbled_link_layer_makes_that_port_unhealthy(tmp_path: Path) -> None:
    tree = two_mlx5(tmp_path)
    (tree.port_dir("mlx5_1") / "link_layer").write_bytes(b"\xc3\x28\n")

    hcas = scan(tree)

    assert hcas["mlx5_1"].ports[0].state == "UNREADABLE"
    assert hcas["mlx5_1"].unhealthy_reason() is not None
    assert hcas["mlx5_0"].unhealthy_reason() is None


def test_stray_entries_in_ports_and_gids_are_skipped_and_named(tmp_path: Path) -> None:
    tree = two_mlx5(tmp_path)
    (tree.port_dir("mlx5_0").parent / "README").write_text("not a port\n")
    (tree.port_dir("mlx5_0") / "gids" / "lost+found").mkdir()

    hcas = scan(tree)

    assert [p.number for p in hcas["mlx5_0"].ports] == [1]
    assert len(hcas["mlx5_0"].ports[0].gids) == 4
    assert hcas["mlx5_0"].unhealthy_reason() is None
    assert any("unexpected entries ['README'] skipped" in p for p in hcas["mlx5_0"].problems)


def test_an_hca_whose_ports_are_not_a_directory_has_none_and_the_others_are_served(
    tmp_path: Path,
) -> None:
    tree = two_mlx5(tmp_path)
    ports = tree.port_dir("mlx5_0").parent
    shutil.rmtree(ports)
    ports.write_text("broken\n")

    hcas = scan(tree)

    assert hcas["mlx5_0"].ports == ()
    assert hcas["mlx5_0"].unhealthy_reason() == (
        f"mlx5_0: no ACTIVE port (no ports read: {tree.sys}/class/infiniband/mlx5_0/ports: "
        "cannot be listed (Not a directory))"
    )
    assert hcas["mlx5_1"].unhealthy_reason() is None


class _OneHcaFails(SysfsDiscovery):
    """A fault of one HCA that no file here can provoke: an I/O error of the kernel's (EIO from
    a driver in trouble) or a reader bug to come."""

    fault: Exception = RuntimeError("a reader bug")

    def read_hca(
        self, name: str, verbs: dict[str, list[str]], mads: dict[str, list[str]]
    ) -> Hca | None:
        if name == "mlx5_0":
            raise self.fault
        return super().read_hca(name, verbs, mads)


@pytest.mark.parametrize(
    ("fault", "said", "traceback"),
    [
        (RuntimeError("a reader bug"), "(RuntimeError('a reader bug'))", True),
        (OSError(5, "Input/output error"), "([Errno 5] Input/output error)", False),
    ],
    ids=["bug", "eio"],
)
def test_an_hca_whose_reading_fails_is_reported_unreadable_and_the_others_are_served(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    fault: Exception,
    said: str,
    traceback: bool,
) -> None:
    tree = two_mlx5(tmp_path)
    discovery = _OneHcaFails(tree.sys, tree.dev)
    discovery.fault = fault

    hcas = {h.name: h for h in discovery.scan().hcas}

    assert not hcas["mlx5_0"].readable
    assert hcas["mlx5_0"].unhealthy_reason() is not None
    assert f"mlx5_0: cannot be read from sysfs {said}" in hcas["mlx5_0"].problems[0]
    assert any(r.exc_info for r in caplog.records) == traceback
    assert hcas["mlx5_1"].unhealthy_reason() is None


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _zero(path: Path) -> None:
    path.unlink()
    path.symlink_to("/dev/zero")


@pytest.mark.parametrize("make", [_fifo, _zero], ids=["fifo", "endless"])
def test_an_attribute_that_is_not_a_file_is_unknown_never_waited_on_or_read_whole(
    tmp_path: Path, make: Callable[[Path], None]
) -> None:
    tree = two_mlx5(tmp_path)
    make(tree.port_dir("mlx5_0") / "state")
    make(tree.port_dir("mlx5_1") / "gids" / "3")

    hcas = scan(tree)  # the test's timeout would catch a read that blocks

    assert hcas["mlx5_0"].ports[0].state == "UNREADABLE"
    assert 3 not in {g.index for g in hcas["mlx5_1"].ports[0].gids}
    assert hcas["mlx5_1"].unhealthy_reason() is None


def test_entries_numbered_in_other_scripts_are_stray_not_numbers(tmp_path: Path) -> None:
    tree = two_mlx5(tmp_path)
    (tree.port_dir("mlx5_0").parent / "²").mkdir()  # '²'.isdigit() is True; int('²') fails
    (tree.port_dir("mlx5_0") / "gids" / "٣").write_text("fe80::1\n")  # int('٣') == 3

    hca = scan(tree)["mlx5_0"]

    assert [p.number for p in hca.ports] == [1]
    assert any("unexpected entries ['²'] skipped" in p for p in hca.problems)
    assert len(hca.ports[0].gids) == 4  # the GID slot '٣' is not taken for slot 3


def test_a_sysfs_root_without_class_says_so(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    inventory = SysfsDiscovery(tmp_path / "nowhere", tmp_path / "dev").scan()

    assert inventory.errors == (
        f"{tmp_path / 'nowhere' / 'class'} does not exist: --sysfs-root must name where sysfs "
        "is mounted (/sys)",
    )


def test_a_dev_root_that_is_not_a_directory_says_so(tmp_path: Path) -> None:
    tree = two_mlx5(tmp_path)

    inventory = SysfsDiscovery(tree.sys, tmp_path / "nowhere").scan()

    assert inventory.errors == (
        f"{tmp_path / 'nowhere'} is not a directory: --dev-root must name where the host's /dev "
        "is mounted",
    )


@pytest.mark.parametrize("text", ["9" * 30, "9223372036854775808", "1_0", "1024", "٣"])
def test_a_numa_node_that_is_not_one_is_unknown(tmp_path: Path, text: str) -> None:
    tree = two_mlx5(tmp_path)
    numa = tree.sys / "class" / "infiniband" / "mlx5_0" / "device" / "numa_node"
    numa.write_text(text + "\n")

    assert scan(tree)["mlx5_0"].numa_node is None


def test_an_hca_entry_that_loops_is_reported_not_dropped(tmp_path: Path) -> None:
    tree = two_mlx5(tmp_path)
    entry = tree.sys / "class" / "infiniband" / "mlx5_9"
    entry.symlink_to(entry)

    hcas = scan(tree)

    assert hcas["mlx5_9"].unhealthy_reason() is not None
    assert "is not a directory that can be read" in hcas["mlx5_9"].problems[0]
    assert hcas["mlx5_0"].unhealthy_reason() is None


def test_a_device_node_that_is_not_a_character_device_is_not_handed_out(tmp_path: Path) -> None:
    tree = two_mlx5(tmp_path)
    node = tree.dev / "infiniband" / "uverbs0"
    node.unlink()
    node.mkdir()

    hca = scan(tree)["mlx5_0"]

    assert hca.chardevs.uverbs is None
    assert f"{node} is a directory, not a device node" in hca.problems


def test_each_hca_carries_its_pci_address_and_pcie_root(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path).rdma_cm()
    tree.add_pci_hca("mlx5_0", pci="0000:3b:00.0", pcie_root="pci0000:3a")
    tree.add_pci_hca("mlx5_1", pci="0000:86:00.0", pcie_root="pci0000:85")
    tree.add_rxe("rxe0", "veth0")

    hcas = scan(tree)

    assert (hcas["mlx5_0"].pci_address, hcas["mlx5_0"].pcie_root) == ("0000:3b:00.0", "pci0000:3a")
    assert (hcas["mlx5_1"].pci_address, hcas["mlx5_1"].pcie_root) == ("0000:86:00.0", "pci0000:85")
    assert (hcas["rxe0"].pci_address, hcas["rxe0"].pcie_root) == (None, None)


_BDF = "0000:01:02.3"


def _bus_link(sysfs: Path, target: str) -> None:
    function = sysfs / "devices" / target
    function.parent.mkdir(parents=True)
    function.touch()
    link = sysfs / "bus" / "pci" / "devices" / _BDF
    link.parent.mkdir(parents=True)
    link.symlink_to(os.path.relpath(function, link.parent))


# The cases of Kubernetes' own test of it (deviceattribute/pci_linux_test.go, v0.34)
@pytest.mark.parametrize(
    ("target", "address", "root"),
    [
        (f"pci0000:01/0000:00:13.1/{_BDF}", _BDF, "pci0000:01"),
        (None, "", None),
        (None, "invalid-pci-id", None),
        (None, _BDF, None),
        (f"invalid-pci-root/0000:00:13.1/{_BDF}", _BDF, None),
        ("pci0000:01/0000:00:13.1/0000:01:02.4", _BDF, None),
    ],
    ids=["valid", "empty", "bad-format", "no-link", "bad-prefix", "bad-suffix"],
)
def test_the_pcie_root_is_found_as_kubernetes_finds_it(
    tmp_path: Path, target: str | None, address: str, root: str | None
) -> None:
    if target is not None:
        _bus_link(tmp_path, target)

    assert pcie_root_of(tmp_path, address) == root


@pytest.mark.parametrize(
    "name", ["rxe\nINJECTED", "rxe 1", "r" * 64, "rxé", "mlx5_$(id)", "-rf", ".hidden"]
)
def test_a_device_name_the_kernel_never_gives_is_left_out_and_said(
    tmp_path: Path, name: str
) -> None:
    tree = SysfsTree(tmp_path).add_rxe("rxe0", "veth0").add_rxe(name, "veth1")

    inventory = SysfsDiscovery(tree.sys, tree.dev).scan()

    assert [h.name for h in inventory.hcas] == ["rxe0"]
    (error,) = inventory.errors
    assert error.endswith(
        "is not an RDMA device name handed out here (letters, digits, _ . -): left out"
    )
    assert "\n" not in error


def test_a_sysfs_root_its_user_cannot_search_is_one_error_not_a_traceback(
    shared_dir: Path,
) -> None:
    """Run as nobody: the scan raised PermissionError, logged with a traceback at every rescan."""
    tree = two_mlx5(shared_dir)
    tree.sys.chmod(0o700)  # root's, as /root is
    program = (
        "from pathlib import Path; from plugin.core.node.discovery.sysfs import SysfsDiscovery\n"
        f"print(SysfsDiscovery(Path({str(tree.sys)!r}), Path({str(tree.dev)!r})).scan())\n"
    )

    done = subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
         sys.executable, "-c", program],
        cwd=shared_dir, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[3])},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert "hcas=()" in done.stdout
    assert (
        f"{tree.sys}/class/infiniband cannot be read (Permission denied): --sysfs-root must "
        "name where sysfs is mounted (/sys), readable by this process"
    ) in done.stdout


@pytest.mark.parametrize(
    ("written", "said"),
    [("-1", None), ("1", None),
     ("hunter2secretpw", "text of 15 characters, not a NUMA node: mlx5_0 is taken to have none "
                         "(no NUMA-aware allocation for it)"),
     ("4096", "text of 4 characters, not a NUMA node: mlx5_0 is taken to have none (no "
              "NUMA-aware allocation for it)"),
     ("FIFO", "cannot be read as text, not a NUMA node: mlx5_0 is taken to have none (no "
              "NUMA-aware allocation for it)"),
     ("ABSENT", None)],
    ids=["unknown-to-the-kernel", "a-node", "garbage", "past-max-numnodes", "a-fifo",
         "no-file"],
)  # fmt: skip
def test_a_numa_node_file_that_holds_no_node_is_said_and_not_quoted(
    tmp_path: Path, written: str, said: str | None
) -> None:
    """It was dropped without a word: the HCA silently lost NUMA-aware allocation."""
    tree = SysfsTree(tmp_path)
    tree.add_pci_hca("mlx5_0", pci="0000:03:00.0")
    numa_file = tree.sys / "bus" / "pci" / "devices" / "0000:03:00.0" / "numa_node"
    numa_file.unlink()
    if written == "FIFO":
        os.mkfifo(numa_file)  # read without blocking: refused as not a regular file
    elif written != "ABSENT":
        numa_file.write_text(written + "\n")

    hca = scan(tree)["mlx5_0"]

    found = [p for p in hca.problems if "numa_node" in p]
    named = tree.sys / "class" / "infiniband" / "mlx5_0" / "device" / "numa_node"  # as read
    assert found == ([] if said is None else [f"{named}: {said}"])
    assert hca.numa_node == (1 if written == "1" else None)
