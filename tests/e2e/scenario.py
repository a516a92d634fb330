"""What the scenarios do to the cluster and read back from it: pods, Node status, metrics."""

from __future__ import annotations

import re
from typing import Any

from tests.e2e.cluster import BUSYBOX_IMAGE, NODE
from tests.e2e.kube import Api
from tests.e2e.node import DraDriver, Plugin
from tests.e2e.procs import eventually

RESOURCE = "rdma/hca"

# What the container reports: each device node it sees with its major:minor (hex, as stat
# prints them), the HCAs the plugin named in the env, then a marker that the listing is complete.
LISTING = (
    'for f in /dev/infiniband/*; do stat -c "%n %t:%T" "$f"; done; '
    'echo "hcas=$LINGJUN_RDMA_HCAS"; echo listed; exec sleep 3600'
)


def node_resource(api: Api) -> tuple[str | None, str | None]:
    status = api.node(NODE)["status"]
    return status["capacity"].get(RESOURCE), status["allocatable"].get(RESOURCE)


def wait_allocatable(api: Api, quantity: str, timeout: float = 60) -> tuple[str | None, ...]:
    return eventually(
        lambda: (r := node_resource(api))[1] == quantity and r,
        timeout,
        f"Node {NODE} allocatable {RESOURCE} == {quantity!r} (capacity, allocatable)",
    )


def pod_manifest(name: str, count: int | str, command: str) -> dict[str, Any]:
    """A hostNetwork busybox pod bound to the node (no scheduler runs) asking `count` HCAs."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": NODE,
            "hostNetwork": True,
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "c",
                    "image": BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", command],
                    "resources": {"limits": {RESOURCE: str(count)}},
                }
            ],
        },
    }


def registrations(api: Api) -> int:
    """The kubelet's own count of rdma/hca Register calls since it started (its /metrics);
    it counts a call before checking it, so this proves an attempt, not a success."""
    text = str(api.get(f"/api/v1/nodes/{NODE}/proxy/metrics"))
    m = re.search(
        r'^kubelet_device_plugin_registration_total\{resource_name="rdma/hca"\} (\d+)',
        text,
        re.M,
    )
    return int(m.group(1)) if m else 0


def pod_status(api: Api, name: str) -> dict[str, object]:
    return api.pod(name)["status"]


def run_listing_pod(api: Api, pods: list[str], name: str) -> tuple[dict[str, str], str]:
    """Start a pod asking one HCA; return the device nodes its container sees and its env."""
    pods.append(name)
    api.create_pod(pod_manifest(name, 1, LISTING))
    return read_listing(api, name)


def read_listing(api: Api, name: str, timeout: float = 90) -> tuple[dict[str, str], str]:
    """The device nodes a pod running LISTING sees (name -> major:minor in hex), and the HCAs
    its env names."""

    def listed() -> str | None:
        status = api.pod(name)["status"]
        if status.get("phase") == "Failed":
            raise AssertionError(f"pod {name} failed: {status}")
        if status.get("phase") != "Running":
            return None
        log = api.pod_log(name)
        return log if "listed" in log.splitlines() else None

    log = eventually(listed, timeout, f"pod {name} running and listing /dev/infiniband")
    seen: dict[str, str] = {}
    hcas = ""
    for line in log.splitlines():
        if line.startswith("/dev/infiniband/"):
            path, numbers = line.split()
            seen[path.removeprefix("/dev/infiniband/")] = numbers
        elif line.startswith("hcas="):
            hcas = line.removeprefix("hcas=")
    return seen, hcas


def hex_numbers(node: Plugin | DraDriver, names: list[str]) -> dict[str, str]:
    return {n: "{:x}:{:x}".format(*node.dev_numbers[n]) for n in names}


def container_id(api: Api, name: str, ns: str = "default") -> str:
    return str(api.pod(name, ns)["status"]["containerStatuses"][0]["containerID"])
