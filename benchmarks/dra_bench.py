"""DRA driver figures D1-D3 on the e2e cluster (the real kubelet, scheduler, API server and
containerd 2 of `make e2e`; root). Prints; asserts nothing. The two paths of D2 run in one
cluster, interleaved, so their ratio is measured under the same load.

    LINGJUN_E2E_BIN=$(tests/e2e/peers.sh | tail -n1) python -m benchmarks.dra_bench

D1  NodePrepareResources over the driver's gRPC socket, one claim a call as the kubelet sends
    them: a first prepare (read the claim, write its CDI spec and its record) and a repeat
    (idempotent: made afresh from the API, its spec and record already there). The claims are
    made and allocated through the API.
D2  pod create -> Running, scheduled by the scheduler: a claim of a shared device vs `rdma/hca: 1`
    of the device plugin, host network, the same busybox container.
D3  an exclusive HCA's port going down -> its device gone from the node's ResourceSlice, and back
    up -> published again (the fixture's sysfs: found by the rescan, every 0.5 s here; a real
    port is also followed over netlink).
D4  a shared pool at the top of maxAllocations, its device names as long as they may be (a
    second driver, unknown to the kubelet): start -> every slice in the API, a deleted slice ->
    written again (a list of the node's slices, a page at a time), and the driver's peak RSS
    against the DaemonSet's memory limit.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from benchmarks.plugin_bench import fmt_ms, mib, status_kib
from plugin.config import MAX_ALLOCATIONS_LIMIT
from plugin.core.kube.sockets import CHANNEL_OPTIONS, grpc_target
from plugin.dra.api.dra.v1 import api_pb2 as v1
from plugin.dra.api.dra.v1 import api_pb2_grpc as v1_grpc
from plugin.dra.devices import device_class, device_class_name
from plugin.launch import DRA_DRIVER, dra_socket
from tests.e2e.cluster import BUSYBOX_IMAGE, NODE, Cluster, Peers, reap_stale_runs, run_lock
from tests.e2e.kube import Api, ApiError
from tests.e2e.node import BIG_DRIVER, BIG_SLICES, DraDriver, Plugin, big_dra_driver
from tests.e2e.procs import eventually
from tests.e2e.scenario import RESOURCE as DP_RESOURCE
from tests.e2e.scenario import wait_allocatable

RESOURCE = "/apis/resource.k8s.io/v1"
NS = "default"
PREPARES = int(os.environ.get("BENCH_DRA_PREPARES", "200"))
PODS = int(os.environ.get("BENCH_DRA_PODS", "10"))
FLIPS = int(os.environ.get("BENCH_DRA_FLIPS", "10"))


def fmt(samples: list[float]) -> str:
    return f"{fmt_ms(samples)} (n={len(samples)})"


SHARED_CLAIM = {
    "devices": {
        "requests": [
            {
                "name": "rdma",
                "exactly": {"deviceClassName": device_class_name(DRA_DRIVER, "shared")},
            }
        ]
    }
}


def _allocate(api: Api, name: str, device: str) -> str:
    """What the scheduler writes: the claim's allocation of `device` on this node."""
    path = f"{RESOURCE}/namespaces/{NS}/resourceclaims/{name}"
    new = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"name": name}, "spec": SHARED_CLAIM}  # fmt: skip
    claim = api.call("POST", f"{RESOURCE}/namespaces/{NS}/resourceclaims", new)
    claim["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "rdma", "driver": DRA_DRIVER, "pool": NODE, "device": device}
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
                ]
            },
        }
    }
    api.call("PUT", f"{path}/status", claim)
    return claim["metadata"]["uid"]


async def d1(api: Api, driver: DraDriver) -> None:
    claims = [(f"bench-{i}", _allocate(api, f"bench-{i}", f"hca-{i % 4}")) for i in range(PREPARES)]
    target = grpc_target(dra_socket(driver.spec.plugins_dir, DRA_DRIVER))
    first: list[float] = []
    repeat: list[float] = []
    async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
        stub = v1_grpc.DRAPluginStub(channel)
        for samples in (first, repeat):
            for name, uid in claims:
                request = v1.NodePrepareResourcesRequest(
                    claims=[v1.Claim(namespace=NS, uid=uid, name=name)]
                )
                t0 = time.perf_counter()
                answer = await stub.NodePrepareResources(request, timeout=30)
                samples.append(time.perf_counter() - t0)
                if answer.claims[uid].error:
                    raise RuntimeError(answer.claims[uid].error)
        for name, uid in claims:
            await stub.NodeUnprepareResources(
                v1.NodeUnprepareResourcesRequest(
                    claims=[v1.Claim(namespace=NS, uid=uid, name=name)]
                ),
                timeout=30,
            )
    for name, _ in claims:
        api.call("DELETE", f"{RESOURCE}/namespaces/{NS}/resourceclaims/{name}")
    print(f"D1 NodePrepareResources, first: {fmt(first)}")
    print(f"D1 NodePrepareResources, repeat: {fmt(repeat)}")


def _pod(name: str, dra: bool) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "c",
        "image": BUSYBOX_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sleep", "3600"],
    }
    spec: dict[str, Any] = {
        "hostNetwork": True,
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 0,
        # the node keeps the kubelet's not-ready taint: no node lifecycle controller runs
        "tolerations": [{"operator": "Exists"}],
        "containers": [container],
    }
    if dra:
        spec["resourceClaims"] = [{"name": "rdma", "resourceClaimTemplateName": "bench-shared"}]
        container["resources"] = {"claims": [{"name": "rdma"}]}
    else:
        container["resources"] = {"limits": {DP_RESOURCE: "1"}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _time_to_running(api: Api, pod: dict[str, Any]) -> float:
    name = pod["metadata"]["name"]
    t0 = time.perf_counter()
    api.create_pod(pod)
    while True:
        phase = api.pod(name)["status"].get("phase")
        if phase == "Running":
            return time.perf_counter() - t0
        if phase in ("Failed", "Succeeded"):
            raise RuntimeError(f"pod {name} {phase}")
        if time.perf_counter() - t0 > 120:
            raise RuntimeError(f"pod {name} not Running within 120 s")
        time.sleep(0.02)


def _delete(api: Api, name: str) -> None:
    api.delete_pod(name)
    eventually(lambda: _gone(api, f"/api/v1/namespaces/{NS}/pods/{name}"), 120, f"{name} gone")


def _gone(api: Api, path: str) -> bool:
    try:
        api.get(path)
    except ApiError as exc:
        return exc.status == 404
    return False


def d2(api: Api) -> None:
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "bench-shared"},
        "spec": {"spec": SHARED_CLAIM},
    }
    api.call("POST", f"{RESOURCE}/namespaces/{NS}/resourceclaimtemplates", template)
    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(PODS):
        for dra in (True, False):  # interleaved: the same load for both
            pod = _pod(f"bench-{'dra' if dra else 'dp'}-{i}", dra)
            times[dra].append(_time_to_running(api, pod))
            _delete(api, pod["metadata"]["name"])  # the fixture's pool has 4 shares
    api.call("DELETE", f"{RESOURCE}/namespaces/{NS}/resourceclaimtemplates/bench-shared")
    ratio = statistics.median(times[True]) / statistics.median(times[False])
    print(f"D2 pod create -> Running, claim (DRA): {fmt(times[True])}")
    print(f"D2 pod create -> Running, rdma/hca (device plugin): {fmt(times[False])}")
    print(f"D2 ratio of medians DRA / device plugin: {ratio:.2f}")


def _exclusive_published(api: Api, device: str) -> bool:
    selector = f"spec.nodeName={NODE},spec.driver={DRA_DRIVER}"
    slices = api.get(f"{RESOURCE}/resourceslices?fieldSelector={selector}")["items"]
    return any(d["name"] == device for s in slices for d in s["spec"]["devices"])


def d3(api: Api, driver: DraDriver) -> None:
    samples: dict[str, list[float]] = {"DOWN": [], "ACTIVE": []}
    for _ in range(FLIPS):
        for state, published in (("DOWN", False), ("ACTIVE", True)):
            t0 = time.perf_counter()
            driver.tree.set_port("mlx5_2", 1, state)
            while _exclusive_published(api, "nic-mlx5-2") != published:
                if time.perf_counter() - t0 > 60:
                    raise RuntimeError(f"port {state}: slice not updated within 60 s")
                time.sleep(0.01)
            samples[state].append(time.perf_counter() - t0)
    print(f"D3 port down -> device withdrawn from the slice: {fmt(samples['DOWN'])}")
    print(f"D3 port up -> device published again: {fmt(samples['ACTIVE'])}")


def d4(api: Api, big: DraDriver) -> None:
    selector = f"spec.nodeName={NODE},spec.driver={BIG_DRIVER}"

    def names() -> set[str]:
        items = api.get(f"{RESOURCE}/resourceslices?fieldSelector={selector}")["items"]
        return {s["metadata"]["name"] for s in items}

    def every_one() -> set[str]:
        found = names()
        return found if len(found) == BIG_SLICES else set()

    t0 = time.perf_counter()
    big.proc.start()
    try:
        everything = eventually(every_one, 600, "every slice")
        published = time.perf_counter() - t0
        deleted = sorted(everything)[0]
        api.call("DELETE", f"{RESOURCE}/resourceslices/{deleted}")
        t1 = time.perf_counter()
        eventually(lambda: deleted in names(), 120, "the deleted slice written again")
        mended = time.perf_counter() - t1
        peak = status_kib(big.proc.pid, "VmHWM")
    finally:
        big.stop()
        api.call("DELETE", f"{RESOURCE}/resourceslices?fieldSelector=spec.driver={BIG_DRIVER}")
    print(
        f"D4 {MAX_ALLOCATIONS_LIMIT} share devices ({BIG_SLICES} slices): published in "
        f"{published:.1f} s; a deleted one written again in {mended:.1f} s (the node's slices "
        f"listed a page at a time); driver peak RSS {mib(peak)}"
    )


def main() -> int:
    peers = Peers.find()
    if isinstance(peers, str):
        print(f"dra_bench: needs {peers}", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("dra_bench: needs root (the kubelet and containerd)", file=sys.stderr)
        return 2
    logs = Path(tempfile.mkdtemp(prefix="dra-bench-logs-"))
    with run_lock():
        reap_stale_runs()
        cluster = Cluster(peers, logs)
        node_root = Path(tempfile.mkdtemp(prefix="ljn", dir="/tmp"))
        stops: list[Callable[[], object]] = [cluster.stop]
        try:
            cluster.start()
            api = cluster.api
            for mode in ("shared", "exclusive"):
                api.call("POST", f"{RESOURCE}/deviceclasses", device_class(DRA_DRIVER, mode))
            driver = DraDriver(
                node_root / "dra", logs, cluster.root / "kubelet", cluster.kubeconfig
            )
            driver.start()
            stops.insert(0, driver.close)
            plugin = Plugin(node_root, logs)
            plugin.start()
            stops.insert(0, plugin.stop)
            wait_allocatable(api, "1k")
            eventually(lambda: _exclusive_published(api, "nic-mlx5-2"), 60, "the driver's slice")
            asyncio.run(d1(api, driver))
            d2(api)
            d3(api, driver)
            d4(api, big_dra_driver(node_root, logs, cluster.kubeconfig))
        finally:
            for stop in stops:
                stop()
    print(f"dra_bench: logs in {logs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
