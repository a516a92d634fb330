"""11: a whole node in one VM (`make vm-node`). The VM (TCG) is a node of the run's control
plane with real RDMA devices (two rxe) under a real kubelet and containerd; the local stack's
rendered objects, applied as `pulumi up` would, make the DaemonSet controller run the plugin's
image there, and the node advertises rdma/hca from the VM's verbs devices."""

from __future__ import annotations

import copy
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from plugin.core.metrics.counters import HW_COUNTERS
from plugin.core.metrics.podqps import POD_QPS
from plugin.core.node.problems import HCA_UNHEALTHY
from tests.e2e.cluster import (
    BUSYBOX_IMAGE,
    LINGJUN_LABEL,
    PLUGIN_IMAGE,
    Cluster,
)
from tests.e2e.conftest import owned_cluster
from tests.e2e.node import REPO
from tests.e2e.procs import eventually
from tests.e2e.scenario import RESOURCE
from tests.e2e.vm_node import PERFTEST_IMAGE, VM_NODE, VmNode

pytestmark = [pytest.mark.vmnode, pytest.mark.timeout(2400)]

# The plugin's objects of the rendered stack (its sample Job needs two nodes and cluster DNS).
PLUGIN_KINDS = ("Namespace", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "DaemonSet")


@pytest.fixture(scope="module")
def control_plane(logs: Path) -> Iterator[Cluster]:
    start = Cluster.start_control_plane
    with owned_cluster(logs, start, "the API server listens on a lo address") as cluster:
        yield cluster


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
    perftest = control_plane.root / "perftest-image.tar"  # the sample's own Dockerfile
    subprocess.run(
        ["make", "sample-image", "SAMPLE=perftest", f"IMAGE={PERFTEST_IMAGE}",
         f"IMAGE_ARCHIVE={perftest}"],
        cwd=REPO, check=True, timeout=1800,
    )  # fmt: skip
    node = VmNode(control_plane, Path(image), [archive, perftest], logs)
    node.start()
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="module")
def rendered(control_plane: Cluster) -> dict[str, list[dict[str, Any]]]:
    """The local stack as `pulumi up` would apply it, with the images the VM has, and QPs per
    pod on (the DaemonSet then shares the host's pid namespace)."""
    out = control_plane.root / "rendered"
    subprocess.run(
        [str(REPO / ".venv/bin/python"), "-m", "infra.commands.render", "--stack", "local",
         "--out", str(out), "--set", f"pluginImage={PLUGIN_IMAGE}",
         "--set", f"perftestImage={PERFTEST_IMAGE}", "--set", "rdmaPodQps=true"],
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
    control_plane: Cluster, vm_node: VmNode, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    cluster = control_plane
    eventually(lambda: (vm_node.qemu.check_alive(), _ready(cluster))[1], 900,
               f"node {VM_NODE} Ready (console: {vm_node.console})", interval=5)  # fmt: skip
    cluster.kubectl("label", "node", VM_NODE, f"{LINGJUN_LABEL}=true", "--overwrite")
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


# The rendered script's ib_write_bw -R (rdma_cm) cannot join two rxe devices of one network
# namespace (the server's QP: "Couldn't create rdma old QP - Invalid argument"; the client:
# CM event 7, unreachable): here each side names its device, and the GID index its pod's
# podenv init container chose (the rendered wrapper loads it into the env).
_VM_SCRIPT = (
    'bw="ib_write_bw -x $NCCL_IB_GID_INDEX -F --report_gbits -n 2000"\n'
    'if [ "$JOB_COMPLETION_INDEX" = 0 ]; then exec $bw -d rxe0; fi\n'
    "for i in $(seq 60); do\n"
    "  $bw -d rxe1 perftest-0.perftest && exit 0\n"
    "  sleep 2\n"
    "done\n"
    "exit 1\n"
)


def _perftest_pod(job: dict[str, Any], index: int, server_ip: str) -> dict[str, Any]:
    """The pod the Job controller makes for `index` of the rendered perftest Job, on the one
    node there is: its anti-affinity (one pod per node) dropped, the headless Service's name of
    index 0 given as a host alias (no cluster DNS runs here), and the script _VM_SCRIPT."""
    template = copy.deepcopy(job["spec"]["template"])
    spec = template["spec"]
    del spec["affinity"]
    spec["nodeName"] = VM_NODE
    spec["hostAliases"] = [{"ip": server_ip, "hostnames": ["perftest-0.perftest"]}]
    for container in spec["containers"]:
        container.setdefault("env", []).append(
            {"name": "JOB_COMPLETION_INDEX", "value": str(index)}
        )
        assert container["command"][-2:-1] == ["-c"], container["command"]
        container["command"][-1] = _VM_SCRIPT
    name = f"perftest-{index}"
    metadata = {**template.get("metadata", {}), "name": name,
                "namespace": job["metadata"]["namespace"]}  # fmt: skip
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def _scrape(vm_node: VmNode) -> str:
    url = f"http://127.0.0.1:{vm_node.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=60) as answer:
        return answer.read().decode()


def test_the_rendered_perftest_pods_write_over_rxe_and_are_seen_on_metrics(
    control_plane: Cluster, vm_node: VmNode, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    cluster = control_plane
    (job,) = rendered["Job"]
    namespace = job["metadata"]["namespace"]
    before = _scrape(vm_node)
    for index in (0, 1):
        path = cluster.root / f"perftest-{index}.yaml"
        path.write_text(yaml.safe_dump(_perftest_pod(job, index, "192.168.77.1")))
        cluster.kubectl("apply", "-f", str(path))

    def phase(name: str) -> str:
        vm_node.qemu.check_alive()
        return cluster.api.pod(name, namespace)["status"].get("phase", "")

    uids = {i: cluster.api.pod(f"perftest-{i}", namespace)["metadata"]["uid"] for i in (0, 1)}

    def qps_of_both() -> str | None:
        text = _scrape(vm_node)
        rows = [line for line in text.splitlines() if line.startswith(POD_QPS + "{")]
        return text if all(any(f'uid="{u}"' in r for r in rows) for u in uids.values()) else None

    def finished() -> str:
        now = phase("perftest-1")
        return now if now in ("Succeeded", "Failed") else ""

    eventually(lambda: phase("perftest-0") == "Running", 900, "perftest-0 Running", interval=5)
    metrics = eventually(qps_of_both, 600, "QPs of both pods on /metrics", interval=1)
    done = eventually(finished, 900, "perftest-1 done", interval=5)

    # The guest copies pod logs to its console every 5 s: a client that failed to connect first
    # shows those lines before its successful run's result (CI once read only the failure).
    def logged() -> str | None:
        log = vm_node.pod_log(namespace, "perftest-1", "perftest")
        return log if log and (done != "Succeeded" or _result(log)) else None

    log = eventually(logged, 120, "perftest-1's log on the guest console", interval=5)
    print(f"vm-node: perftest-1 ({done}):\n{log}")
    assert done == "Succeeded", log
    result = _result(log)
    assert result, log
    iterations, gbits = result
    print(f"vm-node: ib_write_bw rxe1 -> rxe0 between the two pods: {gbits} Gb/s average")
    assert iterations == 2000, log  # (the figure itself: perftest's clock under a loaded TCG
    # can print 0.0 and warn of its CPU frequency's r^2)
    after = _scrape(vm_node)
    # rxe has no counters/ (port_xmit_data): its hw_counters count packets
    received = HW_COUNTERS["rcvd_pkts"].metric + "_total"
    assert _summed(after, received) > _summed(before, received) + 100, metrics


def _summed(metrics: str, name: str) -> float:
    """A metric's value summed over its series (the node's ports)."""
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.split("{")[0] == name
    )


def _result(log: str) -> tuple[int, float] | None:
    """Iterations and BW average [Gb/s] of ib_write_bw's result row (after its #bytes header),
    None while the log has no such row."""
    lines = log.splitlines()
    headers = [i for i, line in enumerate(lines) if line.strip().startswith("#bytes")]
    if len(headers) != 1 or len(lines) <= headers[0] + 1:
        return None
    row = lines[headers[0] + 1].split()
    return int(row[1]), float(row[3])


def test_a_port_taken_down_is_an_event_on_the_node_and_its_hca_unhealthy(
    control_plane: Cluster, vm_node: VmNode
) -> None:
    cluster = control_plane
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "link-down"},
        "spec": {
            "nodeName": VM_NODE,
            "hostNetwork": True,
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "containers": [{
                "name": "ip", "image": BUSYBOX_IMAGE,
                "command": ["ip", "link", "set", "veth0", "down"],
                "securityContext": {"privileged": True},
            }],
        },
    }  # fmt: skip
    cluster.api.create_pod(pod)

    def unhealthy_event() -> list[dict[str, Any]]:
        vm_node.qemu.check_alive()
        events = cluster.api.get("/api/v1/namespaces/default/events")["items"]
        return [
            e for e in events
            if e["involvedObject"].get("name") == VM_NODE and e["reason"] == HCA_UNHEALTHY
            and "rxe0:" in e["message"]
        ]  # fmt: skip

    # (the veth pair's other end loses its carrier too: rxe1 goes down with it)
    (event, *_) = eventually(unhealthy_event, 600, f"{HCA_UNHEALTHY} of rxe0", interval=5)
    print(f"vm-node: event {event['reason']}: {event['message']}")
    assert "port 1 DOWN" in event["message"]
    metrics = _scrape(vm_node)
    assert 'rdma_plugin_hca_healthy{hca="rxe0",resource="rdma/hca"} 0.0' in metrics
