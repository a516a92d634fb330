"""The DRA driver against the real kubelet v1.34, scheduler, controller-manager, API server
and containerd 2 (which applies CDI): slices published, claims allocated by the scheduler and
prepared by the driver, device nodes seen in the container, GPU alignment by pcieRoot,
restarts, uninstall."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plugin.config import MAX_ALLOCATIONS_LIMIT
from plugin.dra.devices import PCIE_ROOT_ATTRIBUTE, device_class, device_class_name
from plugin.launch import DRA_DRIVER
from tests.e2e.cluster import BUSYBOX_IMAGE, NODE, Cluster
from tests.e2e.kube import Api, ApiError, pod_gone
from tests.e2e.node import (
    BIG_DRIVER,
    BIG_SLICES,
    PCIE_ROOTS,
    ROCE_ADDRESS,
    DraDriver,
    big_dra_driver,
)
from tests.e2e.procs import eventually, run
from tests.e2e.scenario import LISTING, hex_numbers, read_listing

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

RESOURCE = "/apis/resource.k8s.io/v1"
GPU_DRIVER = "gpu.example.com"  # a test GPU driver's slice: only its pcieRoot attributes matter


@pytest.fixture(scope="module")
def dra(cluster: Cluster, node_root: Path, logs: Path, api: Api) -> Iterator[DraDriver]:
    for mode in ("shared", "exclusive"):
        api.call("POST", f"{RESOURCE}/deviceclasses", device_class(DRA_DRIVER, mode))
    driver = DraDriver(node_root / "dra", logs, cluster.root / "kubelet", cluster.kubeconfig)
    driver.start()
    yield driver
    driver.close()
    for mode in ("shared", "exclusive"):
        api.call("DELETE", f"{RESOURCE}/deviceclasses/{device_class_name(DRA_DRIVER, mode)}")


@pytest.fixture(autouse=True)
def every_claim_unprepared_after(dra: DraDriver) -> Iterator[None]:
    """Set up first, so checked last: after `pods` deleted the test's pods."""
    yield
    eventually(lambda: not dra.cdi_specs(), 60, "every claim unprepared (its CDI spec removed)")


def _slices(api: Api, driver: str = DRA_DRIVER) -> list[dict[str, Any]]:
    selector = f"spec.nodeName={NODE},spec.driver={driver}"
    return api.get(f"{RESOURCE}/resourceslices?fieldSelector={selector}")["items"]


def _devices(api: Api) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in _slices(api) for d in s["spec"]["devices"]}


def _claim_pod(name: str, mode: str) -> dict[str, Any]:
    """A pod off the host network, asking one device of `mode` through a claim template,
    scheduled by the scheduler (DRA allocates there)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            # the node keeps the kubelet's not-ready taint: no node lifecycle controller runs
            "tolerations": [{"operator": "Exists"}],
            "resourceClaims": [{"name": "rdma", "resourceClaimTemplateName": f"rdma-{mode}"}],
            "containers": [
                {
                    "name": "c",
                    "image": BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", LISTING],
                    "resources": {"claims": [{"name": "rdma"}]},
                }
            ],
        },
    }


@pytest.fixture(scope="module", autouse=True)
def templates(api: Api, dra: DraDriver) -> Iterator[None]:
    for mode in ("shared", "exclusive"):
        template = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": f"rdma-{mode}"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "rdma",
                                "exactly": {"deviceClassName": device_class_name(DRA_DRIVER, mode)},
                            }
                        ]
                    }
                }
            },
        }
        api.call("POST", f"{RESOURCE}/namespaces/default/resourceclaimtemplates", template)
    yield
    for mode in ("shared", "exclusive"):
        api.call("DELETE", f"{RESOURCE}/namespaces/default/resourceclaimtemplates/rdma-{mode}")


# 1 -----------------------------------------------------------------------------------------
def test_the_driver_publishes_share_devices_and_one_device_per_exclusive_hca(
    api: Api, dra: DraDriver
) -> None:
    devices = eventually(lambda: (d := _devices(api)) and len(d) == 6 and d, 30, "6 devices")

    assert sorted(devices) == ["hca-0", "hca-1", "hca-2", "hca-3", "nic-mlx5-2", "nic-mlx5-3"]
    attributes = devices["nic-mlx5-3"]["attributes"]
    assert attributes[PCIE_ROOT_ATTRIBUTE] == {"string": PCIE_ROOTS["mlx5_3"]}
    assert attributes["ibdev"] == {"string": "mlx5_3"}
    (slice_,) = _slices(api)
    assert slice_["spec"]["pool"]["name"] == NODE


# 2 -----------------------------------------------------------------------------------------
def test_a_shared_claim_is_allocated_prepared_and_its_pod_sees_exactly_its_device_nodes(
    api: Api, dra: DraDriver, pods: list[str]
) -> None:
    pods.append("dra-shared")
    api.create_pod(_claim_pod("dra-shared", "shared"))

    seen, hcas = read_listing(api, "dra-shared")

    assert seen == hex_numbers(dra, ["rdma_cm", "umad0", "umad1", "uverbs0", "uverbs1"])
    assert hcas == "mlx5_0,mlx5_1"
    (spec_file,) = dra.cdi_specs()
    spec = json.loads(spec_file.read_text())
    assert spec["kind"] == f"{DRA_DRIVER}/hca"


# 2b ----------------------------------------------------------------------------------------
ROCE_LINK = "ljr-roce0"


@pytest.fixture
def roce_link() -> Iterator[str]:
    """A host link (a veth: no dummy module in every kernel) with the address the fixture
    HCAs' RoCE v2 GID 0 carries: to the driver, the host's RDMA network."""
    delete = ["ip", "link", "delete", ROCE_LINK]
    subprocess.run(delete, capture_output=True, check=False)  # left by a run killed outright
    run(["ip", "link", "add", ROCE_LINK, "type", "veth", "peer", "name", f"{ROCE_LINK}p"])
    run(["ip", "address", "add", f"{ROCE_ADDRESS}/24", "dev", ROCE_LINK])
    run(["ip", "link", "set", ROCE_LINK, "up"])
    yield ROCE_LINK
    subprocess.run(delete, capture_output=True, check=False)


def _env(api: Api, name: str) -> dict[str, str]:
    def listed() -> str | None:
        if api.pod(name)["status"].get("phase") != "Running":
            return None
        log = api.pod_log(name)
        return log if "listed" in log.splitlines() else None

    log = eventually(listed, 90, f"pod {name} running and listing its env")
    return dict(line.split("=", 1) for line in log.splitlines() if "=" in line)


def test_a_host_network_pods_claim_carries_nccl_settings_and_a_pod_networks_does_not(
    api: Api, dra: DraDriver, pods: list[str], roce_link: str
) -> None:
    for name, host_network in (("dra-host", True), ("dra-podnet", False)):
        pod = _claim_pod(name, "shared")
        pod["spec"]["hostNetwork"] = host_network
        pod["spec"]["containers"][0]["command"] = ["sh", "-c", "env; echo listed; exec sleep 3600"]
        pods.append(name)
        api.create_pod(pod)

    host, podnet = _env(api, "dra-host"), _env(api, "dra-podnet")

    # the host's GID, found by the driver at prepare time: index 0 on both granted HCAs
    assert host["LINGJUN_RDMA_HCAS"] == "mlx5_0,mlx5_1"
    assert host["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1"
    assert host["NCCL_IB_GID_INDEX"] == "0"
    assert host["NCCL_SOCKET_IFNAME"] == f"={roce_link}"
    # its own namespace's GID is for its podenv to find: the driver sets none
    assert podnet["LINGJUN_RDMA_HCAS"] == "mlx5_0,mlx5_1"
    assert not [k for k in podnet if k.startswith("NCCL_")]


# 3 -----------------------------------------------------------------------------------------
def test_shared_claims_share_the_hcas_and_exclusive_ones_use_them_up(
    api: Api, dra: DraDriver, pods: list[str]
) -> None:
    for i in range(3):
        pods.append(f"dra-share-{i}")
        api.create_pod(_claim_pod(f"dra-share-{i}", "shared"))
    for i in range(3):
        pods.append(f"dra-nic-{i}")
        api.create_pod(_claim_pod(f"dra-nic-{i}", "exclusive"))

    shared = [read_listing(api, f"dra-share-{i}")[1] for i in range(3)]
    assert shared == ["mlx5_0,mlx5_1"] * 3
    nics = [f"dra-nic-{i}" for i in range(3)]

    def running() -> list[str] | None:  # the scheduler takes the three in no set order
        found = [n for n in nics if api.pod(n)["status"].get("phase") == "Running"]
        return found if len(found) == 2 else None

    placed = eventually(running, 90, "two of the three exclusive pods running")
    got = {read_listing(api, name)[1] for name in placed}
    assert got == {"mlx5_2", "mlx5_3"}
    (third,) = set(nics) - set(placed)

    def unschedulable() -> bool:
        conditions = api.pod(third)["status"].get("conditions", [])
        return any(
            c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions
        )

    eventually(unschedulable, 60, "the third exclusive pod to stay Pending, unschedulable")


# 4 -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpus(api: Api, dra: DraDriver) -> Iterator[list[str]]:
    """A test GPU driver's slice (one GPU under each PCIe root of the fixture) and class: only
    its pcieRoot attributes matter, no GPU driver runs."""
    roots = sorted(set(PCIE_ROOTS.values()))
    gpu_slice = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{NODE}-gpu"},
        "spec": {
            "driver": GPU_DRIVER,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": f"gpu-{i}",
                    "attributes": {PCIE_ROOT_ATTRIBUTE: {"string": root}, "index": {"int": i}},
                }
                for i, root in enumerate(roots)
            ],
        },
    }
    gpu_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": GPU_DRIVER},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{GPU_DRIVER}"'}}]},
    }
    api.call("POST", f"{RESOURCE}/resourceslices", gpu_slice)
    api.call("POST", f"{RESOURCE}/deviceclasses", gpu_class)
    yield roots
    api.call("DELETE", f"{RESOURCE}/deviceclasses/{GPU_DRIVER}")
    try:
        api.call("DELETE", f"{RESOURCE}/resourceslices/{NODE}-gpu")
    except ApiError as exc:  # a kubelet restart since wiped every slice of the node
        if exc.status != 404:
            raise


@pytest.mark.parametrize("gpu", [0, 1])
def test_a_claim_aligned_by_pcie_root_gets_the_hca_beside_its_gpu(
    api: Api, gpus: list[str], pods: list[str], gpu: int
) -> None:
    name = f"gpu{gpu}-and-nic"
    index = f'device.attributes["{GPU_DRIVER}"].index == {gpu}'
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": GPU_DRIVER,
                            "selectors": [{"cel": {"expression": index}}],
                        },
                    },
                    {
                        "name": "nic",
                        "exactly": {"deviceClassName": device_class_name(DRA_DRIVER, "exclusive")},
                    },
                ],
                "constraints": [{"matchAttribute": PCIE_ROOT_ATTRIBUTE}],
            }
        },
    }
    pod = _claim_pod(f"dra-{name}", "exclusive")
    pod["spec"]["resourceClaims"] = [{"name": "rdma", "resourceClaimName": name}]
    claims = f"{RESOURCE}/namespaces/default/resourceclaims"
    api.call("POST", claims, claim)
    pods.append(f"dra-{name}")
    try:
        api.create_pod(pod)  # scheduled, allocated; it never starts: no GPU driver prepares

        def allocated() -> list[dict[str, str]] | None:
            allocation = api.get(f"{claims}/{name}").get("status", {}).get("allocation")
            return allocation["devices"]["results"] if allocation else None

        results = eventually(allocated, 60, f"the scheduler to allocate claim {name}")
        by_request = {r["request"]: r["device"] for r in results}
        hca = by_request["nic"].removeprefix("nic-").replace("-", "_")
        assert by_request["gpu"] == f"gpu-{gpu}"
        assert PCIE_ROOTS[hca] == gpus[gpu]
    finally:
        api.delete_pod(f"dra-{name}")
        eventually(lambda: pod_gone(api, f"dra-{name}"), 90, f"pod dra-{name} deleted")
        api.call("DELETE", f"{claims}/{name}")


# 5 -----------------------------------------------------------------------------------------
def test_a_driver_restart_keeps_running_pods_and_lets_new_pods_start(
    api: Api, dra: DraDriver, pods: list[str]
) -> None:
    pods.append("dra-before")
    api.create_pod(_claim_pod("dra-before", "shared"))
    read_listing(api, "dra-before")

    assert dra.stop() == 0
    dra.start()
    pods.append("dra-after")
    api.create_pod(_claim_pod("dra-after", "shared"))

    assert read_listing(api, "dra-after")[1] == "mlx5_0,mlx5_1"
    assert api.pod("dra-before")["status"]["phase"] == "Running"
    assert len(dra.cdi_specs()) == 2


def test_a_kubelet_restart_keeps_running_pods_and_the_slices_come_back(
    api: Api, cluster: Cluster, dra: DraDriver, pods: list[str]
) -> None:
    pods.append("dra-steady")
    api.create_pod(_claim_pod("dra-steady", "shared"))
    read_listing(api, "dra-steady")

    cluster.stop_kubelet()
    cluster.start_kubelet()  # a starting kubelet wipes the node's slices, then registers us
    eventually(lambda: len(_devices(api)) == 6, 60, "the driver's 6 devices published again")
    pods.append("dra-next")
    api.create_pod(_claim_pod("dra-next", "shared"))

    assert read_listing(api, "dra-next")[1] == "mlx5_0,mlx5_1"
    assert api.pod("dra-steady")["status"]["phase"] == "Running"


# 6 -----------------------------------------------------------------------------------------
def test_a_slice_deleted_by_anyone_else_is_written_again_at_once(api: Api) -> None:
    """As a starting kubelet does, in the background, maybe after the driver registered again:
    the driver's watch mends it, not its 60 s recheck."""
    (before,) = eventually(lambda: _slices(api), 30, "the driver's slices")
    name = before["metadata"]["name"]

    api.call("DELETE", f"{RESOURCE}/resourceslices/{name}")
    gone = time.monotonic()
    (after,) = eventually(lambda: _slices(api), 10, "the driver's slice written again")

    assert after["metadata"]["name"] == name
    assert after["metadata"]["uid"] != before["metadata"]["uid"]  # a new object
    assert after["spec"]["devices"] == before["spec"]["devices"]
    print(f"slice written again {time.monotonic() - gone:.1f} s after its deletion")


def test_a_driver_gone_leaves_no_slice(api: Api, dra: DraDriver) -> None:
    eventually(lambda: _slices(api), 30, "the driver's slices")

    dra.stop()
    try:
        # the kubelet wipes a driver's slices 30 s after it deregistered
        eventually(lambda: not _slices(api), 90, "no ResourceSlice of the driver left")
    finally:
        dra.start()


# 7 -----------------------------------------------------------------------------------------
def test_a_pool_at_the_top_of_max_allocations_is_published_whole_and_mended(
    cluster: Cluster, node_root: Path, logs: Path, api: Api
) -> None:
    """100000 share devices named as long as they may be: the driver lists its slices a page
    at a time. A slice deleted by anyone else is written again, and no other is written."""
    big = big_dra_driver(node_root, logs, cluster.kubeconfig)

    def published() -> list[dict[str, Any]]:
        big.proc.check_alive()
        slices = _slices(api, BIG_DRIVER)
        return slices if len(slices) == BIG_SLICES else []

    big.proc.start()
    try:
        before = eventually(published, 240, f"the {BIG_SLICES} slices of the big pool")
        assert sum(len(s["spec"]["devices"]) for s in before) == MAX_ALLOCATIONS_LIMIT
        versions = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in before}
        deleted = before[BIG_SLICES // 2]["metadata"]["name"]

        api.call("DELETE", f"{RESOURCE}/resourceslices/{deleted}")
        after = eventually(
            lambda: [s for s in published() if s["metadata"]["name"] == deleted], 120,
            "the deleted slice written again",
        )  # fmt: skip

        assert after[0]["spec"]["pool"]["resourceSliceCount"] == BIG_SLICES
        written = {
            s["metadata"]["name"]
            for s in _slices(api, BIG_DRIVER)
            if versions[s["metadata"]["name"]] != s["metadata"]["resourceVersion"]
        }
        assert written == {deleted}
    finally:
        big.stop()
        api.call("DELETE", f"{RESOURCE}/resourceslices?fieldSelector=spec.driver={BIG_DRIVER}")
