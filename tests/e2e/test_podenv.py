"""11: the NCCL env resolver of a typed RdmaJob off the host network, on the real kubelet. The
Job is the rendered `local` stack's perftest with `nonHostNetwork: true`: the controllers make
its pod, the scheduler binds it, Debian's CNI bridge plugin gives it a network namespace of its
own, and the plugin's Allocate names the HCAs to its init container. No RDMA device is visible
in that namespace here (this machine has none; the fixture node's exist only for the plugin), so
the resolver must fail: the pod's status says why, and the workload never starts."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
import yaml

from tests.e2e.cluster import BUSYBOX_IMAGE, POD_SUBNET, Cluster
from tests.e2e.kube import Api, ApiError
from tests.e2e.node import REPO, Plugin
from tests.e2e.procs import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

NAMESPACE = "lingjun-rdma"


def _render(cluster: Cluster, image: str) -> list[dict[str, Any]]:
    out = cluster.root / "rendered-pod-network"
    subprocess.run(
        [str(REPO / ".venv/bin/python"), "-m", "infra.commands.render", "--stack", "local",
         "--out", str(out), "--set", f"pluginImage={image}",
         "--set", "nonHostNetwork=true", "--set", "computeNetworkIpv6=true",
         "--set", 'sampleJobs=["perftest"]', "--set", f"perftestImage={BUSYBOX_IMAGE}"],
        cwd=REPO, check=True, timeout=300,
    )  # fmt: skip
    return [yaml.safe_load(f.read_text()) for f in sorted(out.glob("*.yaml"))]


def _pods(api: Api) -> list[dict[str, Any]]:
    selector = "batch.kubernetes.io/job-name=perftest"
    return api.get(f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={selector}")["items"]


def _namespace_gone(api: Api) -> bool:
    try:
        api.get(f"/api/v1/namespaces/{NAMESPACE}")
    except ApiError as exc:
        return exc.status == 404
    return False


def test_a_pod_off_the_host_network_gets_the_resolvers_message_not_a_workload_crash(
    api: Api, cluster: Cluster, plugin: Plugin, image: str
) -> None:
    objects = _render(cluster, image)
    order = ("Namespace", "Service", "Job")  # the namespace before what lives in it
    wanted = sorted(
        (o for o in objects if o["kind"] in order), key=lambda o: order.index(o["kind"])
    )
    (job,) = [o for o in wanted if o["kind"] == "Job"]
    assert job["spec"]["template"]["spec"]["hostNetwork"] is False
    manifest = cluster.root / "pod-network.yaml"
    manifest.write_text(yaml.safe_dump_all(wanted))
    cluster.kubectl("apply", "-f", str(manifest))
    try:

        def failed() -> dict[str, Any] | None:
            return next((p for p in _pods(api) if p["status"].get("phase") == "Failed"), None)

        pod = eventually(failed, 180, "a perftest pod to fail")
        (init,) = pod["status"]["initContainerStatuses"]
        terminated = init["state"]["terminated"]
        print(
            f"e2e podenv: pod {pod['metadata']['name']} at {pod['status'].get('podIP')}: "
            f"init container exit {terminated['exitCode']}: {terminated.get('message')!r}"
        )

        # its own network namespace, on the bridge plugin's range
        assert pod["spec"].get("hostNetwork") is not True
        assert pod["status"]["podIP"].startswith(POD_SUBNET.rsplit(".", 1)[0] + ".")
        assert init["name"] == "rdma-env"
        assert terminated["exitCode"] == 1
        message = terminated["message"]
        # Allocate named the fixture node's HCAs; in the pod's namespace there are none
        assert "lingjun-rdma podenv: mlx5_0: not in /sys/class/infiniband" in message
        assert "not visible in this network namespace" in message
        # the workload did not run: no crash of it, no misleading NCCL error
        (workload,) = pod["status"]["containerStatuses"]
        assert "terminated" not in workload["state"], workload
        assert workload.get("restartCount", 0) == 0
        events = api.get(
            f"/api/v1/namespaces/{NAMESPACE}/events?fieldSelector="
            f"involvedObject.name={pod['metadata']['name']}"
        )["items"]
        print("e2e podenv: events:", json.dumps([(e["reason"], e["message"]) for e in events]))
    finally:
        cluster.kubectl("delete", "-f", str(manifest), "--wait=false")
        eventually(lambda: _namespace_gone(api), 120, f"namespace {NAMESPACE} deleted")
