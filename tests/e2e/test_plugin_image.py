"""10: the plugin as it ships. The image built from plugin/Dockerfile (`make image`) runs as the
pod the DaemonSet controller would make from the rendered local stack, on the real kubelet,
under the rendered security context (not privileged, no capability, read-only root), and a pod
asking for an HCA gets its device nodes from it."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.cluster import NODE, PLUGIN_IMAGE, Cluster
from tests.e2e.kube import Api, allocatable_ids, pod_gone
from tests.e2e.node import REPO, Plugin
from tests.e2e.procs import eventually
from tests.e2e.scenario import container_id, hex_numbers, run_listing_pod, wait_allocatable

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def rendered(image: str, cluster: Cluster) -> dict[str, list[dict[str, Any]]]:
    """The local stack rendered with the image under test, by kind."""
    out = cluster.root / "rendered"
    subprocess.run(
        [str(REPO / ".venv/bin/python"), "-m", "infra.commands.render", "--stack", "local",
         "--out", str(out), "--set", f"pluginImage={image}"],
        cwd=REPO, check=True, timeout=300,
    )  # fmt: skip
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for f in sorted(out.rglob("*.yaml")):
        for doc in yaml.safe_load_all(f.read_text()):
            if isinstance(doc, dict):
                by_kind.setdefault(doc["kind"], []).append(doc)
    return by_kind


def daemon_pod(daemonset: dict[str, Any], plugin: Plugin) -> dict[str, Any]:
    """The pod the DaemonSet controller would create on this node (no controller runs here),
    with the node's /sys being the fixture's: this machine has no HCA."""
    template = copy.deepcopy(daemonset["spec"]["template"])
    spec = template["spec"]
    spec["nodeName"] = NODE
    (sys_volume,) = [v for v in spec["volumes"] if v["name"] == "sys"]
    sys_volume["hostPath"]["path"] = str(plugin.tree.sys)
    (dev_volume,) = [v for v in spec["volumes"] if v["name"] == "infiniband"]
    assert dev_volume["hostPath"]["path"] == "/dev/infiniband"
    name = f"{daemonset['metadata']['name']}-{NODE}"
    namespace = daemonset["metadata"]["namespace"]
    metadata = {**template["metadata"], "name": name, "namespace": namespace}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def proc_status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def root_mount_options(pid: int) -> list[str]:
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == "/":
            return fields[5].split(",")
    raise AssertionError(f"no / in /proc/{pid}/mountinfo")


@pytest.mark.usefixtures("lingjun_node", "host_infiniband")
def test_the_image_runs_as_the_rendered_daemonset_pod_unprivileged_and_serves_pods(
    api: Api,
    cluster: Cluster,
    session_plugin: Plugin,
    rendered: dict[str, list[dict[str, Any]]],
    pods: list[str],
) -> None:
    session_plugin.stop()  # the host-process plugin of the other scenarios
    # its devices gone first: the 1k below can only come from the containerized plugin
    wait_allocatable(api, "0")
    for kind in ("Namespace", "ServiceAccount", "ConfigMap"):
        for doc in rendered[kind]:
            path = cluster.root / f"{kind}.yaml"
            path.write_text(yaml.safe_dump(doc))
            cluster.kubectl("apply", "-f", str(path))
    (daemonset,) = rendered["DaemonSet"]
    pod = daemon_pod(daemonset, session_plugin)
    name, ns = pod["metadata"]["name"], pod["metadata"]["namespace"]
    api.create_pod(pod, ns=ns)
    try:

        def ready() -> bool:
            status = api.pod(name, ns)["status"]
            if status.get("phase") == "Failed":
                raise AssertionError(f"pod {name} failed: {status}")
            conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
            return conditions.get("Ready") == "True"  # its readiness probe: GET /healthz

        eventually(ready, 120, f"pod {name} Ready")
        wait_allocatable(api, "1k")
        ids = allocatable_ids(cluster.pod_resources_sock, "rdma/hca")
        assert len(ids) == 1000

        # What the kernel says of the plugin's process, not what the spec asked for.
        cid = container_id(api, name, ns).removeprefix("containerd://")
        pid = int(cluster.ctr("task", "ls").split(cid, 1)[1].split()[0])
        status = proc_status(pid)
        assert status["Uid"].split()[0] == "0"
        assert (status["CapEff"], status["CapPrm"]) == ("0" * 16, "0" * 16)
        assert status["NoNewPrivs"] == "1"
        assert status["Seccomp"] == "2"  # a filter: containerd's RuntimeDefault profile
        assert "ro" in root_mount_options(pid)
        # the kubelet's word for what runs: the image imported from `make image`
        (container,) = api.pod(name, ns)["status"]["containerStatuses"]
        assert container["image"] == PLUGIN_IMAGE
        assert "registered" in api.pod_log(name, ns)

        # A pod asking one HCA gets its device nodes from this plugin's Allocate.
        seen, hcas = run_listing_pod(api, pods, "rdma-via-image")
        everything = ["rdma_cm", "umad0", "umad1", "uverbs0", "uverbs1"]
        assert seen == hex_numbers(session_plugin, everything)
        assert hcas == "mlx5_0,mlx5_1"
    finally:
        api.delete_pod(name, ns)
        eventually(lambda: pod_gone(api, name, ns), 60, f"pod {name} deleted")
