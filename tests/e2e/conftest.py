"""Session fixtures: one cluster for the run, the plugin beside it, pods cleaned per test."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import PEER_SKIP_PREFIX
from tests.e2e.cluster import (
    NODE_PREFIX,
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


@pytest.fixture(scope="session")
def cluster(logs: Path) -> Iterator[Cluster]:
    peers = Peers.find()
    if isinstance(peers, str):
        pytest.skip(f"{PEER_SKIP_PREFIX} {peers}")
    if os.geteuid() != 0:
        pytest.skip(f"{PEER_SKIP_PREFIX} root (the kubelet and containerd need it)")
    # a SIGTERM (a CI timeout) must tear down too: make it unwind like Ctrl-C
    previous = signal.signal(signal.SIGTERM, _interrupt)
    with run_lock():
        for root in reap_stale_runs():
            print(f"e2e: cleaned up after a run killed outright: {root}")
        c = Cluster(peers, logs)
        try:
            c.start()
            yield c
        finally:
            c.stop()
            signal.signal(signal.SIGTERM, previous)


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
    plugin = Plugin(node_root, logs)
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
