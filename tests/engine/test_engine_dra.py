"""`rdmaApi: dra` by the real engine: a copy of the `local` stack deployed onto the e2e cluster
runs the DRA driver as the rendered DaemonSet (the plugin image, its own service account under
RBAC, the API reached at the `kubernetes` Service with the pod's token and the cluster's CA),
which registers with the kubelet and publishes the node's slices; the sample Job's pod is
allocated a device by the scheduler and gets the fixture node's device nodes through the CDI
spec the driver writes; destroy leaves no slice and no DeviceClass.

Runs after test_engine.py (file order), whose last test destroyed the `local` stack."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pulumi import automation as auto

from infra.stack.keys import PROJECT_DIR
from plugin.config import DEFAULT_MAX_ALLOCATIONS
from plugin.dra.devices import device_class_name
from plugin.launch import DRA_DRIVER
from tests.e2e.cluster import NODE, Cluster
from tests.e2e.kube import Api, ApiError
from tests.e2e.procs import eventually
from tests.engine.stacks import (
    NAMESPACE,
    OpenStack,
    assert_perftest_pod_got_the_fixture_devices,
    for_this_cluster,
    get,
    plugin_pods,
    set_config,
    up,
)

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

RESOURCE = "/apis/resource.k8s.io/v1"
MODES = ("shared", "exclusive")


@pytest.fixture(scope="module")
def local_dra(
    open_engine_stack: OpenStack, workspace: Path, cluster: Cluster, image: str
) -> Iterator[auto.Stack]:
    committed = PROJECT_DIR / "stacks" / "Pulumi.local.yaml"  # not the copy test_engine changed
    (workspace / "stacks" / "Pulumi.local-dra.yaml").write_text(committed.read_text())
    stack = open_engine_stack("local-dra")
    for_this_cluster(stack, cluster, image)
    set_config(stack, "rdmaApi", "dra")
    yield stack
    if stack.export_stack().deployment.get("resources"):  # a test failed midway
        stack.destroy(on_output=print)


def _slices(api: Api) -> list[dict[str, Any]]:
    selector = f"spec.nodeName={NODE},spec.driver={DRA_DRIVER}"
    return get(api, f"{RESOURCE}/resourceslices?fieldSelector={selector}")["items"]


@pytest.mark.usefixtures("lingjun_node", "host_infiniband", "node_sysfs")
def test_up_in_dra_mode_runs_the_driver_and_a_jobs_pod_gets_its_devices_through_cdi(
    local_dra: auto.Stack, api: Api, cluster: Cluster
) -> None:
    result, took = up(local_dra)
    print(f"engine: dra up: {took:.1f} s, {dict(result.summary.resource_changes or {})}")

    assert result.summary.result == "succeeded"
    (pod,) = plugin_pods(api, "rdma-dra-driver")
    assert pod["spec"]["nodeName"] == NODE
    # Ready: its /healthz answers 200 only once the kubelet registered the driver
    ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert ready["Ready"] == "True"
    for mode in MODES:
        get(api, f"{RESOURCE}/deviceclasses/{device_class_name(DRA_DRIVER, mode)}")

    # published with the pod's own token: its ClusterRole is all RBAC lets it use
    def devices() -> list[str]:
        return [x["name"] for s in _slices(api) for x in s["spec"]["devices"]]

    try:
        eventually(
            lambda: len(devices()) == DEFAULT_MAX_ALLOCATIONS,
            60,
            f"the default pool's {DEFAULT_MAX_ALLOCATIONS} share devices in the node's slices",
        )
    except AssertionError as exc:
        log = api.pod_log(pod["metadata"]["name"], NAMESPACE)
        raise AssertionError(f"{exc}: {len(devices())} devices; the driver's log:\n{log}") from None
    assert sorted(devices())[:2] == ["hca-0", "hca-1"]

    # perftest's pod 0: its claim allocated by the scheduler, prepared by the driver in the
    # DaemonSet's pod; containerd made the devices of the CDI spec in its init container
    job_pod = assert_perftest_pod_got_the_fixture_devices(api, cluster)
    (status,) = job_pod["status"]["resourceClaimStatuses"]
    claim = get(
        api,
        f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims/{status['resourceClaimName']}",
    )
    (allocated,) = claim["status"]["allocation"]["devices"]["results"]
    assert allocated["driver"] == DRA_DRIVER
    assert allocated["device"].startswith("hca-")
    assert [r["name"] for r in claim["status"]["reservedFor"]] == [job_pod["metadata"]["name"]]


@pytest.mark.usefixtures("lingjun_node", "host_infiniband", "node_sysfs")
def test_destroy_in_dra_mode_leaves_no_slice_and_no_device_class(
    local_dra: auto.Stack, api: Api
) -> None:
    local_dra.destroy(on_output=print)

    assert not local_dra.export_stack().deployment.get("resources")
    with pytest.raises(ApiError) as caught:
        get(api, f"/api/v1/namespaces/{NAMESPACE}")
    assert caught.value.status == 404
    for mode in MODES:
        with pytest.raises(ApiError) as caught:
            get(api, f"{RESOURCE}/deviceclasses/{device_class_name(DRA_DRIVER, mode)}")
        assert caught.value.status == 404
    # the kubelet wipes the slices of a driver that stays away (after its grace period)
    eventually(lambda: not _slices(api), 120, "the node's slices of the driver gone")
