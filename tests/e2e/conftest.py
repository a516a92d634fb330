"""Session fixtures: one cluster for the run, the plugin beside it, pods cleaned per test."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import subprocess
import tempfile
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest

from tests.conftest import PEER_SKIP_PREFIX
from tests.e2e.cluster import (
    LINGJUN_LABEL,
    NODE,
    NODE_PREFIX,
    PLUGIN_IMAGE,
    Cluster,
    Peers,
    reap_stale_runs,
    run_lock,
)
from tests.e2e.kube import Api, pod_gone, pod_names
from tests.e2e.node import REPO, Plugin
from tests.e2e.procs import eventually
from tests.e2e.scenario import wait_allocatable


@pytest.fixture(scope="session")
def logs() -> Path:
    """Every process's log, kept after the run (out/ is what `make clean` removes)."""
    path = Path(os.environ.get("LINGJUN_E2E_LOGS", REPO / "out" / "e2e-logs"))
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


@contextlib.contextmanager
def owned_cluster(
    logs: Path, start: Callable[[Cluster], None], root_for: str
) -> Generator[Cluster]:
    """A cluster of this run, started by `start` and torn down whatever happens (a SIGTERM, a
    CI timeout, too: it unwinds like Ctrl-C); skipped, naming the peer, where it cannot run."""
    peers = Peers.find()
    if isinstance(peers, str):
        pytest.skip(f"{PEER_SKIP_PREFIX} {peers}")
    if os.geteuid() != 0:
        pytest.skip(f"{PEER_SKIP_PREFIX} root ({root_for})")
    previous = signal.signal(signal.SIGTERM, _interrupt)
    with run_lock():
        for root in reap_stale_runs():
            print(f"e2e: cleaned up after a run killed outright: {root}")
        c = Cluster(peers, logs)
        try:
            start(c)
            yield c
        finally:
            c.stop()
            signal.signal(signal.SIGTERM, previous)


@pytest.fixture(scope="session")
def cluster(logs: Path) -> Iterator[Cluster]:
    with owned_cluster(logs, Cluster.start, "the kubelet and containerd need it") as c:
        yield c


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def api(cluster: Cluster) -> Api:
    return cluster.api


@pytest.fixture(scope="session")
def node_root(cluster: Cluster) -> Iterator[Path]:  # after the cluster reaped stale runs
    path = Path(tempfile.mkdtemp(prefix=NODE_PREFIX, dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def session_plugin(cluster: Cluster, node_root: Path, logs: Path) -> Iterator[Plugin]:
    plugin = Plugin(node_root, logs, cluster.kubeconfig)
    yield plugin
    plugin.stop()


@pytest.fixture
def plugin(session_plugin: Plugin, api: Api) -> Plugin:
    """The plugin running with the default config (shared rdma/hca: 1k), its ports all up."""
    p = session_plugin
    for ibdev in ("mlx5_0", "mlx5_1"):
        p.tree.set_port(ibdev, 1, "ACTIVE")
    if not p.running() or p.config is not None:
        p.stop()
        p.start()
    wait_allocatable(api, "1k")
    return p


@pytest.fixture
def pods(api: Api, cluster: Cluster) -> Iterator[list[str]]:
    """Names of pods a test creates: deleted after it, and waited gone from the API server and
    from the kubelet's pod-resources (so the next test starts with every device free)."""
    names: list[str] = []
    yield names
    for name in names:
        api.delete_pod(name)
    for name in names:
        eventually(lambda name=name: pod_gone(api, name), 60, f"pod {name} deleted")
        eventually(
            lambda name=name: name not in pod_names(cluster.pod_resources_sock),
            60,
            f"the kubelet to forget pod {name}",
        )


@pytest.fixture(scope="session")
def image(cluster: Cluster) -> str:
    """plugin/Dockerfile built by `make image` (buildah here: no engine runs) and imported
    into the kubelet's containerd."""
    tar = cluster.root / "plugin-image.tar"
    subprocess.run(
        ["make", "image", f"IMAGE={PLUGIN_IMAGE}", f"IMAGE_ARCHIVE={tar}"],
        cwd=REPO, check=True, timeout=900,
    )  # fmt: skip
    cluster.ctr("images", "import", str(tar), timeout=300)
    tar.unlink()
    return PLUGIN_IMAGE


@pytest.fixture(scope="session")
def lingjun_node(cluster: Cluster) -> Iterator[None]:
    """The label the DaemonSet selects Lingjun nodes by (the kubelet checks it on admission)."""
    cluster.kubectl("label", "node", NODE, f"{LINGJUN_LABEL}=true", "--overwrite")
    yield
    cluster.kubectl("label", "node", NODE, f"{LINGJUN_LABEL}-")


@pytest.fixture(scope="session")
def host_infiniband(session_plugin: Plugin) -> Iterator[Path]:
    """The fixture node's RDMA char devices at the host's own /dev/infiniband, where the
    rendered DaemonSet mounts them from and where containerd finds what Allocate names."""
    host = Path("/dev/infiniband")
    wanted = session_plugin.dev_numbers
    if host.exists():  # only a run killed before its cleanup leaves exactly these
        rdev = {p.name: p.stat().st_rdev for p in host.iterdir()}
        found = {n: (os.major(r), os.minor(r)) for n, r in rdev.items()}
        assert found == wanted, f"{host} exists on this machine ({found}): not ours to replace"
    host.mkdir(exist_ok=True)
    for name, (major, minor) in wanted.items():
        node = host / name
        if not node.exists():
            os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
            os.chmod(node, 0o666)
    yield host
    for name in wanted:
        (host / name).unlink(missing_ok=True)
    host.rmdir()


@pytest.fixture(scope="session")
def node_sysfs(cluster: Cluster, session_plugin: Plugin) -> Iterator[Path]:
    """Containers mounting the node's /sys get the fixture node's tree (tests/e2e/runc.py):
    to the rendered DaemonSet, unchanged, this node has the fixture's two HCAs."""
    cluster.use_node_sysfs(session_plugin.tree.sys)
    yield session_plugin.tree.sys
    cluster.use_node_sysfs(None)
