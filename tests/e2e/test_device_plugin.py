"""The plugin against the real kubelet v1.34 and API server: the scenarios of Kubernetes' own
e2e_node device plugin tests, asserted on what the kubelet and the API server report."""

from __future__ import annotations

import json
import re
import signal
import time

import pytest

from plugin.core.node.problems import HCA_UNHEALTHY
from plugin.launch import EVENT_NAMESPACE, cdi_spec_name
from tests.e2e.cluster import NODE, Cluster
from tests.e2e.kube import Api, allocatable_ids, pod_devices
from tests.e2e.node import CDI_DIR, Plugin
from tests.e2e.procs import eventually
from tests.e2e.scenario import (
    RESOURCE,
    container_id,
    hex_numbers,
    node_resource,
    pod_manifest,
    pod_status,
    registrations,
    run_listing_pod,
    wait_allocatable,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SHARED_IDS = {f"hca-{i}" for i in range(1000)}
EXCLUSIVE = """
version: v1
pools:
  - name: hca
    mode: exclusive
"""


# 1 -----------------------------------------------------------------------------------------
def test_registration_shows_1k_on_the_node_and_ids_in_pod_resources(
    plugin: Plugin, api: Api, cluster: Cluster
) -> None:
    assert node_resource(api) == ("1k", "1k")

    ids = allocatable_ids(cluster.pod_resources_sock, RESOURCE)

    assert set(ids) == SHARED_IDS
    assert ids["hca-0"] == [0, 1]  # a shared ID spans both HCAs, so both NUMA nodes


# 2 -----------------------------------------------------------------------------------------
def test_host_network_pod_sees_exactly_the_allocated_device_nodes(
    plugin: Plugin, api: Api, cluster: Cluster, pods: list[str]
) -> None:
    seen, hcas = run_listing_pod(api, pods, "rdma-one")

    everything = ["rdma_cm", "umad0", "umad1", "uverbs0", "uverbs1"]
    assert seen == hex_numbers(plugin, everything)
    assert hcas == "mlx5_0,mlx5_1"
    assigned = pod_devices(cluster.pod_resources_sock, "rdma-one")
    assert len(assigned) == 1
    assert set(assigned) <= SHARED_IDS


# 3 -----------------------------------------------------------------------------------------
def test_pod_asking_more_than_allocatable_is_rejected_by_the_kubelet(
    plugin: Plugin, api: Api, pods: list[str]
) -> None:
    pods.append("rdma-greedy")
    api.create_pod(pod_manifest("rdma-greedy", 1001, "true"))

    status = eventually(
        lambda: (s := pod_status(api, "rdma-greedy")).get("phase") == "Failed" and s,
        60,
        "the kubelet to reject pod rdma-greedy",
    )

    # the device manager's admit handler runs before the resource-fit predicate in 1.34
    assert status["reason"] == "UnexpectedAdmissionError", status
    # Available can trail a just-deleted pod's release by a moment: 1000 or a little less
    m = re.search(
        r"requested number of devices unavailable for rdma/hca\. Requested: 1001, Available: (\d+)",
        str(status["message"]),
    )
    assert m, status
    assert 990 <= int(m.group(1)) <= 1000, status


# 4 -----------------------------------------------------------------------------------------
def test_kubelet_restart_plugin_registers_again_pod_keeps_its_devices(
    plugin: Plugin, api: Api, cluster: Cluster, pods: list[str]
) -> None:
    run_listing_pod(api, pods, "rdma-before")
    before = pod_devices(cluster.pod_resources_sock, "rdma-before")
    assert len(before) == 1
    container = container_id(api, "rdma-before")
    plugin_pid = plugin.proc.pid

    cluster.stop_kubelet()
    cluster.start_kubelet()

    # a restarted kubelet has no rdma/hca device until the plugin registers with it again
    eventually(
        lambda: set(allocatable_ids(cluster.pod_resources_sock, RESOURCE)) == SHARED_IDS,
        60,
        "the restarted kubelet to list the plugin's 1000 IDs",
    )
    assert plugin.running()
    assert plugin.proc.pid == plugin_pid  # the same process: it re-registered by itself
    assert registrations(api) >= 1  # (the kubelet counts attempts, failed ones included)
    wait_allocatable(api, "1k")
    assert pod_status(api, "rdma-before")["phase"] == "Running"
    assert container_id(api, "rdma-before") == container  # the same container, not restarted
    # the kubelet restores the assignment from its checkpoint (upstream's e2e_node test polls too)
    eventually(
        lambda: pod_devices(cluster.pod_resources_sock, "rdma-before") == before,
        30,
        f"pod-resources to map rdma-before to {before} again",
    )
    seen, _ = run_listing_pod(api, pods, "rdma-after")
    assert "uverbs0" in seen


# 5 -----------------------------------------------------------------------------------------
def test_plugin_restart_registers_again_allocations_stay_consistent(
    plugin: Plugin, api: Api, cluster: Cluster, pods: list[str]
) -> None:
    run_listing_pod(api, pods, "rdma-old")
    old = pod_devices(cluster.pod_resources_sock, "rdma-old")
    assert len(old) == 1
    count = registrations(api)

    assert plugin.stop(signal.SIGTERM) == 0
    plugin.start()

    eventually(lambda: registrations(api) > count, 60, "the kubelet to count a new registration")
    wait_allocatable(api, "1k")
    assert pod_devices(cluster.pod_resources_sock, "rdma-old") == old
    run_listing_pod(api, pods, "rdma-new")
    new = pod_devices(cluster.pod_resources_sock, "rdma-new")
    assert len(new) == 1
    assert set(new).isdisjoint(old)  # the kubelet still counts the old pod's ID as in use
    assert set(new) | set(old) <= SHARED_IDS


# 6 -----------------------------------------------------------------------------------------
def test_ports_down_drop_allocatable_and_up_restores_it(plugin: Plugin, api: Api) -> None:
    # a shared ID stays usable while any of its HCAs is up: take both down
    plugin.tree.set_port("mlx5_0", 1, "DOWN")
    time.sleep(3)  # several rescans and node status updates
    assert node_resource(api) == ("1k", "1k")
    plugin.tree.set_port("mlx5_1", 1, "DOWN")

    # capacity keeps the unhealthy IDs; allocatable counts only healthy ones
    assert wait_allocatable(api, "0") == ("1k", "0")

    plugin.tree.set_port("mlx5_0", 1, "ACTIVE")
    assert wait_allocatable(api, "1k") == ("1k", "1k")


def test_a_port_down_is_a_warning_event_on_the_node(plugin: Plugin, api: Api) -> None:
    plugin.tree.set_port("mlx5_1", 1, "DOWN")

    def events() -> list[dict[str, object]]:
        selector = f"involvedObject.kind=Node,involvedObject.name={NODE},reason={HCA_UNHEALTHY}"
        found = api.get(f"/api/v1/namespaces/{EVENT_NAMESPACE}/events?fieldSelector={selector}")
        return [e for e in found["items"] if "mlx5_1" in e["message"]]

    try:
        (event,) = eventually(events, 30, "a Warning Event of the port down on the Node")
    finally:
        plugin.tree.set_port("mlx5_1", 1, "ACTIVE")

    assert event["type"] == "Warning"
    assert event["source"] == {"component": "rdma-device-plugin", "host": NODE}
    assert event["message"].endswith(": left out of allocations")
    assert event["count"] == 1


def test_exclusive_port_down_drops_allocatable_by_one(plugin: Plugin, api: Api) -> None:
    plugin.stop()
    plugin.start(EXCLUSIVE)
    wait_allocatable(api, "2")

    plugin.tree.set_port("mlx5_1", 1, "DOWN")
    assert wait_allocatable(api, "1") == ("2", "1")

    plugin.tree.set_port("mlx5_1", 1, "ACTIVE")
    assert wait_allocatable(api, "2") == ("2", "2")


# 7 -----------------------------------------------------------------------------------------
def test_plugin_killed_resource_goes_unhealthy(plugin: Plugin, api: Api) -> None:
    plugin.stop(signal.SIGKILL)

    # the kubelet sees ListAndWatch end and marks every rdma/hca device unhealthy at once;
    # capacity stays for its 5-minute endpoint grace period
    assert wait_allocatable(api, "0") == ("1k", "0")


# 8 -----------------------------------------------------------------------------------------
def test_exclusive_pool_reports_numa_topology_per_pod(
    plugin: Plugin, api: Api, cluster: Cluster, pods: list[str]
) -> None:
    plugin.stop()
    plugin.start(EXCLUSIVE)
    wait_allocatable(api, "2")
    assert allocatable_ids(cluster.pod_resources_sock, RESOURCE) == {
        "mlx5_0": [0],
        "mlx5_1": [1],
    }
    own = {"mlx5_0": ["uverbs0", "umad0"], "mlx5_1": ["uverbs1", "umad1"]}

    for name in ("rdma-numa-a", "rdma-numa-b"):
        seen, hcas = run_listing_pod(api, pods, name)
        assigned = pod_devices(cluster.pod_resources_sock, name)

        assert list(assigned) == [hcas]  # the kubelet's ID is the HCA the plugin mounted
        assert assigned[hcas] == [int(hcas[-1])]  # mlx5_0 on NUMA 0, mlx5_1 on NUMA 1
        assert seen == hex_numbers(plugin, sorted(["rdma_cm", *own[hcas]]))
    together = set(pod_devices(cluster.pod_resources_sock, "rdma-numa-a")) | set(
        pod_devices(cluster.pod_resources_sock, "rdma-numa-b")
    )
    assert together == {"mlx5_0", "mlx5_1"}


# 9 -----------------------------------------------------------------------------------------
# 11 ----------------------------------------------------------------------------------------
def test_with_cdi_a_pod_gets_exactly_its_device_nodes_through_the_runtime(
    session_plugin: Plugin, api: Api, pods: list[str]
) -> None:
    plugin = session_plugin
    plugin.stop()
    plugin.cdi_dir = CDI_DIR
    spec = CDI_DIR / cdi_spec_name(RESOURCE)
    try:
        plugin.start()
        wait_allocatable(api, "1k")

        seen, hcas = run_listing_pod(api, pods, "rdma-cdi")

        assert seen == hex_numbers(plugin, ["rdma_cm", "umad0", "umad1", "uverbs0", "uverbs1"])
        assert hcas == "mlx5_0,mlx5_1"
        assert [d["name"] for d in json.loads(spec.read_text())["devices"]] == ["hca_mlx5_0_mlx5_1"]
    finally:
        plugin.stop()  # the next test's fixture starts it without CDI
        plugin.cdi_dir = None
        spec.unlink(missing_ok=True)
