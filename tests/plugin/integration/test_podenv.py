"""`python -m plugin.podenv` from its CLI inside a real network namespace (a pod's, with its own
addresses), reading the GID tables of a fixture sysfs tree: the addresses come from the kernel."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugin.launch import HCAS_ENV
from tests.conftest import PEER_SKIP_PREFIX
from tests.plugin.sysfs_tree import PortSpec, SysfsTree
from tests.plugin.veth_netns import ip, veth_netns

REPO = Path(__file__).resolve().parents[3]
POD_A, POD_B = "fd77::10", "fd77::11"
HOST_NETDEV = "ens1f0"  # the HCA's netdev: an interface of the host's namespace, not a pod's
# the port's one table in shared netns mode: the host's GIDs, then pod A's and pod B's
GIDS = [
    ("fe80::1", "IB/RoCE v1"),
    ("fe80::1", "RoCE v2"),
    ("10.0.0.2", "IB/RoCE v1"),
    ("10.0.0.2", "RoCE v2"),
    (POD_A, "IB/RoCE v1"),
    (POD_A, "RoCE v2"),
    (POD_B, "IB/RoCE v1"),
    (POD_B, "RoCE v2"),
]


@pytest.fixture
def tree(tmp_path: Path) -> SysfsTree:
    tree = SysfsTree(tmp_path / "node").rdma_cm()
    tree.add_pci_hca("mlx5_0", pci="0000:03:00.0", ports=[PortSpec(netdev=HOST_NETDEV, gids=GIDS)])
    return tree


@pytest.fixture
def pod_netns() -> Iterator[str]:
    """A namespace like a pod's: lo, and eth0 (a veth end, its peer eth1 beside it) with the
    addresses a test gives it."""
    if os.geteuid() != 0:
        pytest.skip(f"{PEER_SKIP_PREFIX} root (ip netns)")
    with veth_netns(f"lingjun-podenv-{os.getpid()}") as name:
        yield name


def _address(netns: str, cidr: str, dev: str = "eth0") -> None:
    ip("-n", netns, "addr", "add", cidr, "dev", dev, *(["nodad"] if ":" in cidr else []))


def podenv(
    netns: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", "netns", "exec", netns, sys.executable, "-m", "plugin.podenv", *args],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


@pytest.mark.parametrize(("pod_ip", "index"), [(POD_A, "5"), (POD_B, "7")])
def test_prints_the_gid_index_of_this_namespaces_own_address(
    tree: SysfsTree, pod_netns: str, pod_ip: str, index: str
) -> None:
    _address(pod_netns, f"{pod_ip}/64")

    done = podenv(
        pod_netns, "--sysfs-root", str(tree.sys), "--set", "NCCL_IB_TC=136",
        env={"LINGJUN_RDMA_HCAS": "mlx5_0"},
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "NCCL_IB_TC=136",
        "NCCL_IB_HCA==mlx5_0:1",
        f"NCCL_IB_GID_INDEX={index}",
        "NCCL_SOCKET_IFNAME==eth0",
    ]


def test_the_output_is_sourceable_by_sh(tree: SysfsTree, pod_netns: str, tmp_path: Path) -> None:
    _address(pod_netns, f"{POD_A}/64")
    out = tmp_path / "env"

    done = podenv(
        pod_netns, "--sysfs-root", str(tree.sys), "--hcas", "mlx5_0", "--out", str(out),
        "--set", "NCCL_DEBUG=INFO WARN",
    )  # fmt: skip
    shown = subprocess.run(
        ["sh", "-c", f'set -a; . {out}; set +a; echo "$NCCL_IB_GID_INDEX|$NCCL_DEBUG"'],
        capture_output=True, text=True, check=True,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert shown.stdout.strip() == "5|INFO WARN"


def test_an_ipv4_only_namespace_fails_with_the_hcas_addresses_and_fix(
    tree: SysfsTree, pod_netns: str
) -> None:
    _address(pod_netns, "192.168.77.10/24")

    done = podenv(pod_netns, "--sysfs-root", str(tree.sys), "--hcas", "mlx5_0", "--family", "ipv6")

    assert done.returncode == 1
    assert done.stdout == ""
    message = done.stderr
    assert "no RoCE v2 GID for an ipv6 address of this network namespace on mlx5_0" in message
    assert "eth0 192.168.77.10" in message
    assert "nonHostNetwork: true with computeNetworkIpv6: true" in message


def test_family_auto_is_ipv4_on_the_host_network_where_the_hcas_netdev_is(
    tree: SysfsTree, pod_netns: str
) -> None:
    # the namespace holds the HCA's own netdev, with the host's addresses: the host network
    ip("-n", pod_netns, "link", "set", "eth1", "name", HOST_NETDEV)
    _address(pod_netns, "10.0.0.2/24", HOST_NETDEV)
    _address(pod_netns, f"{POD_A}/64", HOST_NETDEV)

    done = podenv(pod_netns, "--sysfs-root", str(tree.sys), "--hcas", "mlx5_0")

    assert done.returncode == 0, done.stderr
    assert "NCCL_IB_GID_INDEX=3" in done.stdout.splitlines()
    assert f"NCCL_SOCKET_IFNAME=={HOST_NETDEV}" in done.stdout.splitlines()


def test_family_auto_is_ipv6_off_the_host_network(tree: SysfsTree, pod_netns: str) -> None:
    # a pod's namespace: its eth0 has an IPv4 address with a GID too, but is not the HCA's netdev
    _address(pod_netns, "10.0.0.2/24")
    _address(pod_netns, f"{POD_B}/64")

    done = podenv(pod_netns, "--sysfs-root", str(tree.sys), "--hcas", "mlx5_0")

    assert done.returncode == 0, done.stderr
    assert "NCCL_IB_GID_INDEX=7" in done.stdout.splitlines()


def test_no_hcas_is_a_usage_error_naming_the_env(tree: SysfsTree, pod_netns: str) -> None:
    done = podenv(pod_netns, "--sysfs-root", str(tree.sys), env={"LINGJUN_RDMA_HCAS": ""})

    assert done.returncode == 2
    assert "LINGJUN_RDMA_HCAS" in done.stderr


def test_an_hca_missing_from_sysfs_is_named(tree: SysfsTree, pod_netns: str) -> None:
    _address(pod_netns, f"{POD_A}/64")

    done = podenv(pod_netns, "--sysfs-root", str(tree.sys), "--hcas", "mlx5_0,mlx5_9")

    assert done.returncode == 1
    assert "mlx5_9: not in" in done.stderr


FIX = "name a file in a writable directory"


@pytest.mark.parametrize(
    ("out", "said"),
    [
        ("missing/nccl.env", "{parent} does not exist: " + FIX),
        ("adir", "is a directory, not a regular file: name a file to write"),
        ("ro/nccl.env", "{parent} is on a read-only file system: " + FIX),
        (
            "full/nccl.env",
            "{parent} has no room for it (No space left on device): free space "
            "there (an emptyDir's sizeLimit), or name a file on another file system",
        ),
    ],
    ids=["missing-dir", "a-directory", "read-only-fs", "full"],
)
def test_an_out_that_cannot_be_written_is_one_line_and_leaves_nothing_behind(
    tree: SysfsTree, pod_netns: str, tmp_path: Path, out: str, said: str
) -> None:
    _address(pod_netns, f"{POD_A}/64")
    work = tmp_path / "work"
    (work / "adir").mkdir(parents=True)
    (work / "ro").mkdir()
    (work / "full").mkdir()
    before = sorted(p.name for p in work.rglob("*"))
    target = work / out
    # the read-only and the full file systems are tmpfs mounted in a mount namespace of its own
    mounts = (
        f"mount -t tmpfs -o ro none {work / 'ro'} && mount -t tmpfs -o size=4k none "
        f"{work / 'full'} && dd if=/dev/zero of={work / 'full/fill'} bs=4k count=1 2>/dev/null"
    )
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", f'{mounts} && exec "$@"',
         "sh", "ip", "netns", "exec", pod_netns, sys.executable, "-m", "plugin.podenv",
         "--sysfs-root", str(tree.sys), "--hcas", "mlx5_0", "--out", str(target)],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip

    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"lingjun-rdma podenv: --out {target}: " + said.format(parent=target.parent)
    ]
    assert sorted(p.name for p in work.rglob("*")) == before


def test_an_out_that_is_immutable_is_named_not_its_directory(
    tree: SysfsTree, pod_netns: str, tmp_path: Path
) -> None:
    """The directory takes new files: the rename onto the held file is what fails (EPERM)."""
    _address(pod_netns, f"{POD_A}/64")
    (tmp_path / "work").mkdir()
    out = tmp_path / "work" / "nccl.env"
    out.write_text("A=1\n")
    subprocess.run(["chattr", "+i", str(out)], check=True)
    try:
        done = podenv(
            pod_netns, "--sysfs-root", str(tree.sys), "--hcas", "mlx5_0", "--out", str(out)
        )
    finally:
        subprocess.run(["chattr", "-i", str(out)], check=True)

    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"lingjun-rdma podenv: --out {out}: {out} cannot be replaced (Operation not permitted: "
        "immutable or append-only? lsattr shows it): name another file, or chattr -i it"
    ]
    assert out.read_text() == "A=1\n"
    assert [p.name for p in out.parent.iterdir()] == ["nccl.env"]


def test_an_out_another_user_holds_in_a_sticky_dir_is_said_so(
    pod_netns: str, shared_dir: Path
) -> None:
    """As nobody, root's nccl.env in a 1777 dir (as /tmp is): it was said to be immutable."""
    _address(pod_netns, f"{POD_A}/64")
    tree = SysfsTree(shared_dir / "node").rdma_cm()  # readable by nobody, unlike tmp_path
    tree.add_pci_hca("mlx5_0", pci="0000:03:00.0", ports=[PortSpec(netdev=HOST_NETDEV, gids=GIDS)])
    pod = shared_dir / "pod"
    pod.mkdir()
    pod.chmod(0o1777)
    out = pod / "nccl.env"
    out.write_text("A=1\n")

    done = subprocess.run(
        ["ip", "netns", "exec", pod_netns, "setpriv", "--reuid=nobody", "--regid=nogroup",
         "--clear-groups", sys.executable, "-m", "plugin.podenv", "--sysfs-root", str(tree.sys),
         "--hcas", "mlx5_0", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip

    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"lingjun-rdma podenv: --out {out}: {out} is root's, in a sticky directory (as /tmp "
        "is) where only its owner may replace it: remove it as root, or name another file"
    ]
    assert out.read_text() == "A=1\n"
    assert [p.name for p in pod.iterdir()] == ["nccl.env"]


def _special(kind: str, path: Path) -> None:
    if kind == "char-device":
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a /dev/null of our own
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        (path.parent / "target").write_text("the user's\n")
        path.symlink_to(path.parent / "target")


@pytest.mark.parametrize("kind", ["char-device", "fifo", "symlink"])
def test_an_out_that_is_not_a_regular_file_is_refused_and_left_as_it_is(
    tree: SysfsTree, pod_netns: str, tmp_path: Path, kind: str
) -> None:
    _address(pod_netns, f"{POD_A}/64")
    out = tmp_path / "out"
    _special(kind, out)
    before = out.lstat()

    done = podenv(pod_netns, "--sysfs-root", str(tree.sys), "--hcas", "mlx5_0", "--out", str(out))

    assert done.returncode == 2, done.stderr
    named = {"char-device": "a character device", "fifo": "a FIFO", "symlink": "a symbolic link"}
    assert done.stderr.splitlines() == [
        f"lingjun-rdma podenv: --out {out}: is {named[kind]}, not a regular file: name a file "
        "to write"
    ]
    assert (out.lstat().st_mode, out.lstat().st_ino) == (before.st_mode, before.st_ino)


def test_a_users_file_beside_out_is_never_taken_for_the_temporary_one(
    tree: SysfsTree, pod_netns: str, tmp_path: Path
) -> None:
    _address(pod_netns, f"{POD_A}/64")
    (tmp_path / ".nccl.env.tmp").write_text("user data\n")

    done = podenv(
        pod_netns, "--sysfs-root", str(tree.sys), "--hcas", "mlx5_0",
        "--out", str(tmp_path / "nccl.env"),
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert (tmp_path / ".nccl.env.tmp").read_text() == "user data\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".nccl.env.tmp", "nccl.env", "node"]


def test_a_port_that_is_down_is_named_not_a_missing_gid(tree: SysfsTree, pod_netns: str) -> None:
    _address(pod_netns, f"{POD_A}/64")
    tree.set_port("mlx5_0", 1, "DOWN")

    done = podenv(pod_netns, "--sysfs-root", str(tree.sys), "--hcas", "mlx5_0")

    assert done.returncode == 1
    assert done.stderr.startswith(
        "lingjun-rdma podenv: mlx5_0: no ACTIVE port (port 1 DOWN): RDMA cannot use it now"
    )


def test_a_fifo_in_sysfs_is_not_waited_on(tree: SysfsTree, pod_netns: str) -> None:
    _address(pod_netns, f"{POD_A}/64")
    state = tree.port_dir("mlx5_0") / "state"
    state.unlink()
    os.mkfifo(state)

    done = podenv(pod_netns, "--sysfs-root", str(tree.sys), "--hcas", "mlx5_0")

    assert done.returncode == 1
    assert "mlx5_0: no ACTIVE port (port 1 UNREADABLE)" in done.stderr


def test_a_ports_entry_that_cannot_be_listed_is_named(tree: SysfsTree, pod_netns: str) -> None:
    """Not "no ports", which sends the user to the link: the entry that could not be read."""
    _address(pod_netns, f"{POD_A}/64")
    ports = tree.port_dir("mlx5_0").parent.resolve()
    shutil.rmtree(ports)
    os.mkfifo(ports)

    done = podenv(pod_netns, "--sysfs-root", str(tree.sys), "--hcas", "mlx5_0")

    assert done.returncode == 1
    assert (
        "mlx5_0: no ACTIVE port (no ports read: "
        f"{tree.sys}/class/infiniband/mlx5_0/ports: cannot be listed (Not a directory))"
    ) in done.stderr


def _podenv_here(
    *args: str, stdout: int | None = subprocess.PIPE
) -> subprocess.CompletedProcess[str]:
    """podenv in this namespace: for what it refuses before it looks at any address."""
    return subprocess.run(
        [sys.executable, "-m", "plugin.podenv", *args], cwd=REPO, stdout=stdout,
        stderr=subprocess.PIPE, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--hcas", "../../etc"),
         "--hcas: text of 9 characters is not an RDMA device name: at most 64"),
        (("--hcas", "mlx5_0", "--set", "NCCL_IB_GID_INDEX=0"),
         "NCCL_IB_GID_INDEX: podenv computes it for this pod"),
        (("--hcas", "mlx5_0", "--set", "A=1", "--set", "A=2"), "--set A: given twice: keep one"),
        (("--hcas", "mlx5_0", "--set", "é=1"),
         "--set: the key (text of 1 character) is not an ASCII variable name"),
        (("--hcas", "mlx5_0", "--out", ""), "--out: empty: name a file, or omit --out"),
        (("--hcas", "mlx5_0", "--sysfs-root", "/nonexistent"),
         "--sysfs-root /nonexistent: no class/ there: name where sysfs is mounted"),
    ],
    ids=["hca-path", "computed-key", "key-twice", "non-ascii-key", "empty-out", "no-sysfs"],
)  # fmt: skip
def test_what_podenv_refuses_is_one_line(args: tuple[str, ...], said: str) -> None:
    done = _podenv_here(*args)

    assert done.returncode == 2, done.stderr  # bad arguments (1 is a node without a GID)
    assert "Traceback" not in done.stderr
    assert said in done.stderr.splitlines()[-1]


def test_a_bad_hca_from_the_device_plugins_variable_is_blamed_on_it(tree: SysfsTree) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "plugin.podenv", "--sysfs-root", str(tree.sys)], cwd=REPO,
        env={**os.environ, HCAS_ENV: "mlx5_0,x/y"}, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip

    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"python -m plugin.podenv: error: ${HCAS_ENV} (set by the device plugin): text of 3 "
        "characters is not an RDMA device name: at most 64 letters, digits, '_', '.', '-' (e.g. "
        "mlx5_0) (--help lists the flags)"
    ]


def test_an_hca_not_on_the_node_is_named_with_those_there(tree: SysfsTree) -> None:
    done = _podenv_here("--hcas", "mlx5_0,mlx5_9", "--sysfs-root", str(tree.sys))

    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"lingjun-rdma podenv: mlx5_9: not in {tree.sys}/class/infiniband (there: mlx5_0)"
    ]


def test_hca_names_are_trimmed_and_deduplicated(tree: SysfsTree, pod_netns: str) -> None:
    _address(pod_netns, f"{POD_A}/64")

    done = podenv(
        pod_netns, "--sysfs-root", str(tree.sys), env={"LINGJUN_RDMA_HCAS": " mlx5_0, mlx5_0 "}
    )

    assert done.returncode == 0, done.stderr
    assert "NCCL_IB_HCA==mlx5_0:1" in done.stdout.splitlines()


@pytest.mark.parametrize(
    ("stdout", "said"),
    [("full", "No space left on device"), ("closed-pipe", "Broken pipe")],
)
def test_a_stdout_that_cannot_take_it_is_one_line(
    tree: SysfsTree, pod_netns: str, stdout: str, said: str
) -> None:
    _address(pod_netns, f"{POD_A}/64")
    if stdout == "full":
        out = os.open("/dev/full", os.O_WRONLY)
    else:  # `podenv | head -c0`: the reader is gone
        reader, out = os.pipe()
        os.close(reader)
    try:
        done = subprocess.run(
            ["ip", "netns", "exec", pod_netns, sys.executable, "-m", "plugin.podenv",
             "--sysfs-root", str(tree.sys), "--hcas", "mlx5_0"],
            cwd=REPO, stdout=out, stderr=subprocess.PIPE, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        os.close(out)

    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"lingjun-rdma podenv: stdout: {said}"]


@pytest.mark.parametrize("fault", ["fifo", "not-a-gid", "type-unreadable", "type-not-utf-8"])
def test_a_gid_entry_that_cannot_be_read_is_named_not_a_network_fix(
    tree: SysfsTree, pod_netns: str, fault: str
) -> None:
    """Pod A's RoCE v2 GID is at index 5: when that entry cannot be read, the fix is there, not
    in the pod's network mode (the message said only that)."""
    _address(pod_netns, f"{POD_A}/64")
    port = tree.port_dir("mlx5_0")
    broken = port / ("gid_attrs/types/5" if fault.startswith("type-") else "gids/5")
    broken = broken.resolve()
    broken.unlink()
    if fault == "not-a-gid":
        broken.write_text("junk\n")
    elif fault == "type-not-utf-8":
        broken.write_bytes(b"RoCE \xff2\n")
    else:
        os.mkfifo(broken)

    done = podenv(pod_netns, "--sysfs-root", str(tree.sys), "--hcas", "mlx5_0")

    assert done.returncode == 1
    assert "no RoCE v2 GID for an ipv6 address of this network namespace on mlx5_0" in done.stderr
    assert f"not read there, which may hold it: {port}/" in done.stderr
    entry = "gid_attrs/types/5: cannot be read" if fault.startswith("type-") else "gids/5"
    assert entry in done.stderr
    if fault == "type-not-utf-8":
        assert "gid_attrs/types/5: cannot be read (not UTF-8 text): left out" in done.stderr
    assert "nonHostNetwork: true with computeNetworkIpv6" not in done.stderr
