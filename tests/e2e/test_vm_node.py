"""11: a whole node in one VM (`make vm-node`). The VM (TCG) is a node of the run's control
plane with real RDMA devices (two rxe) under a real kubelet and containerd; the local stack's
rendered objects, applied as `pulumi up` would, make the DaemonSet controller run the plugin's
image there, and the node advertises rdma/hca from the VM's verbs devices."""

from __future__ import annotations

import os
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from tests.conftest import PEER_SKIP_PREFIX
from tests.e2e.cluster import LINGJUN_LABEL, PLUGIN_IMAGE, Cluster, Peers, reap_stale_runs, run_lock
from tests.e2e.node import REPO
from tests.e2e.procs import eventually
from tests.e2e.scenario import RESOURCE
from tests.e2e.vm_node import VM_NODE, VmNode

pytestmark = [pytest.mark.vmnode, pytest.mark.timeout(2400)]

# The plugin's objects of the rendered stack (its sample Job needs two nodes and cluster DNS).
PLUGIN_KINDS = ("Namespace", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "DaemonSet")


@pytest.fixture(scope="module")
def control_plane(logs: Path) -> Iterator[Cluster]:
    peers = Peers.find()
    if isinstance(peers, str):
        pytest.skip(f"{PEER_SKIP_PREFIX} {peers}")
    if os.geteuid() != 0:
        pytest.skip(f"{PEER_SKIP_PREFIX} root (the API server listens on a lo address)")
    with run_lock():
        for root in reap_stale_runs():
            print(f"vm-node: cleaned up after a run killed outright: {root}")
        cluster = Cluster(peers, logs)
        try:
            cluster.start_control_plane()
            yield cluster
        finally:
            cluster.stop()


@pytest.fixture(scope="module")
def vm_node(control_plane: Cluster, logs: Path) -> Iterator[VmNode]:
    image = subprocess.run(
        ["tests/plugin/rdma/vm/build.sh"], cwd=REPO, check=True, timeout=1800,
        capture_output=True, text=True,
    ).stdout.splitlines()[-1]  # fmt: skip
    archive = control_plane.root / "plugin-image.tar"
    subprocess.run(
        ["make", "image", f"IMAGE={PLUGIN_IMAGE}", f"IMAGE_ARCHIVE={archive}"],
        cwd=REPO, check=True, timeout=1800,
    )  # fmt: skip
    node = VmNode(control_plane, Path(image), archive, logs)
    node.start()
    try:
        yield node
    finally:
        node.stop()


def _rendered(root: Path) -> dict[str, list[dict[str, Any]]]:
    out = root / "rendered"
    subprocess.run(
        [str(REPO / ".venv/bin/python"), "-m", "infra.render", "--stack", "local",
         "--out", str(out), "--set", f"pluginImage={PLUGIN_IMAGE}"],
        cwd=REPO, check=True, timeout=300,
    )  # fmt: skip
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for f in sorted(out.glob("*.yaml")):
        docs: list[Any] = list(yaml.safe_load_all(f.read_text()))
        for doc in docs:
            if isinstance(doc, dict):
                manifest = cast(dict[str, Any], doc)
                by_kind.setdefault(manifest["kind"], []).append(manifest)
    return by_kind


def _ready(cluster: Cluster) -> bool:
    conditions = cluster.api.node(VM_NODE)["status"].get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def test_the_vm_is_a_node_whose_rendered_plugin_advertises_its_rxe_devices(
    control_plane: Cluster, vm_node: VmNode
) -> None:
    cluster = control_plane
    eventually(lambda: (vm_node.qemu.check_alive(), _ready(cluster))[1], 900,
               f"node {VM_NODE} Ready (console: {vm_node.console})", interval=5)  # fmt: skip
    cluster.kubectl("label", "node", VM_NODE, f"{LINGJUN_LABEL}=true", "--overwrite")
    rendered = _rendered(cluster.root)
    for kind in PLUGIN_KINDS:
        for i, doc in enumerate(rendered[kind]):
            path = cluster.root / f"{kind}-{i}.yaml"
            path.write_text(yaml.safe_dump(doc))
            cluster.kubectl("apply", "-f", str(path))

    def allocatable() -> str | None:
        vm_node.qemu.check_alive()
        return cluster.api.node(VM_NODE)["status"]["allocatable"].get(RESOURCE)

    assert eventually(allocatable, 1200, f"{RESOURCE} on {VM_NODE}", interval=5) == "1k"
    url = f"http://127.0.0.1:{vm_node.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=60) as answer:
        metrics = answer.read().decode()
    assert 'hca="rxe0"' in metrics
    assert 'hca="rxe1"' in metrics
