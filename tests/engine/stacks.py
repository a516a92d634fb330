"""What the engine-level tests do to a stack and read back from the cluster."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from pulumi import automation as auto

from tests.e2e.cluster import BUSYBOX_IMAGE, Cluster
from tests.e2e.kube import Api
from tests.e2e.procs import eventually

KEY = "lingjun-rdma"
NAMESPACE = "lingjun-rdma"
PLUGIN = "rdma-device-plugin"

OpenStack = Callable[[str], auto.Stack]


def set_config(stack: auto.Stack, key: str, value: str, secret: bool = False) -> None:
    stack.set_config(f"{KEY}:{key}", auto.ConfigValue(value, secret=secret))


def set_list(stack: auto.Stack, key: str, items: list[str]) -> None:
    """As the README says to: `pulumi config rm`, then `pulumi config set --path 'key[i]'`
    (a JSON string would be refused by the CLI: the key is typed array<string>)."""
    stack.remove_config(f"{KEY}:{key}")
    for i, item in enumerate(items):
        stack.set_config(f"{KEY}:{key}[{i}]", auto.ConfigValue(item), path=True)


def for_this_cluster(stack: auto.Stack, cluster: Cluster, image: str) -> None:
    """What a copy of the committed local stack needs here: this cluster's kubeconfig (a
    secret: it holds a token) and images the node has (nothing is pulled here)."""
    set_config(stack, "kubeconfig", cluster.kubeconfig.read_text(), secret=True)
    set_config(stack, "pluginImage", image)
    set_config(stack, "perftestImage", BUSYBOX_IMAGE)


def get(api: Api, path: str) -> dict[str, Any]:
    return api.get(path)


def pods(api: Api, selector: str) -> list[dict[str, Any]]:
    found = get(api, f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={selector}")
    return found["items"]


def plugin_pods(api: Api, agent: str = PLUGIN) -> list[dict[str, Any]]:
    """The node agent's pods (`rdma-dra-driver` in DRA mode: named after what it runs)."""
    return pods(api, f"app.kubernetes.io/name={agent}")


def up(stack: auto.Stack) -> tuple[auto.UpResult, float]:
    t0 = time.monotonic()
    result = stack.up(on_output=print)
    return result, time.monotonic() - t0


def assert_perftest_pod_got_the_fixture_devices(api: Api, cluster: Cluster) -> dict[str, Any]:
    """A perftest pod's init container ran with exactly the fixture node's device nodes and
    HCA names. A container's own sysfs on this machine has no RDMA device, so the resolver
    says so and the workload never starts; pod 1 wants another node and stays Pending.
    Returns the pod."""

    def resolved() -> list[dict[str, Any]]:
        return [
            p
            for p in pods(api, "batch.kubernetes.io/job-name=perftest")
            for c in p["status"].get("initContainerStatuses", [])
            if "terminated" in c["state"]
        ]

    (job_pod,) = eventually(resolved, 90, "a perftest pod's init container run by the kubelet")
    (init,) = job_pod["status"]["initContainerStatuses"]
    assert init["state"]["terminated"]["exitCode"] == 1
    assert (
        "lingjun-rdma podenv: mlx5_0: not in /sys/class/infiniband"
        in (init["state"]["terminated"]["message"])
    )
    (workload,) = job_pod["status"]["containerStatuses"]
    assert "terminated" not in workload["state"], workload
    spec = json.loads(cluster.ctr("containers", "info", init["containerID"].split("//")[1]))
    devices = sorted(d["path"] for d in spec["Spec"]["linux"]["devices"])
    assert devices == [
        "/dev/infiniband/rdma_cm",
        "/dev/infiniband/umad0",
        "/dev/infiniband/umad1",
        "/dev/infiniband/uverbs0",
        "/dev/infiniband/uverbs1",
    ]
    env = dict(e.split("=", 1) for e in spec["Spec"]["process"]["env"])
    assert env["LINGJUN_RDMA_HCAS"] == "mlx5_0,mlx5_1"
    return job_pod
