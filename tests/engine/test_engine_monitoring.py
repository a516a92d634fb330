"""`rdmaMonitoring: prometheusOperator` by the real engine: with the Prometheus Operator's own
CRDs (from its Go module) installed on the e2e API server, a copy of the `local` stack creates
the PodMonitor, the PrometheusRule and the dashboard ConfigMap, which the API server checks
against those CRDs; the PodMonitor selects the running plugin pod, whose real scrape carries
every plugin metric the alert pack names; destroy removes them.

Runs after test_engine_dra.py (file order), whose last test destroyed its stack."""

from __future__ import annotations

import json
import os
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from pulumi import automation as auto

from infra.components.alerts import alerts
from infra.stack.keys import PROJECT_DIR
from tests.e2e.cluster import Cluster
from tests.e2e.kube import Api, ApiError
from tests.e2e.procs import eventually
from tests.engine.stacks import (
    NAMESPACE,
    PLUGIN,
    OpenStack,
    for_this_cluster,
    get,
    plugin_pods,
    set_config,
    up,
)

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
MONITORING = f"/apis/monitoring.coreos.com/v1/namespaces/{NAMESPACE}"
NAME = "rdma-monitoring"


@pytest.fixture(scope="module")
def operator_crds(api: Api) -> Iterator[None]:
    """PodMonitor and PrometheusRule, as the operator's module ships them (make engine builds
    them with promtool: tests/monitoring/build.sh); absent is a failure, not a skip."""
    found = os.environ.get("LINGJUN_MONITORING")
    if not found or not (Path(found) / "crds").is_dir():
        pytest.fail("LINGJUN_MONITORING: run `make engine` (it takes the operator's CRDs)")
    names = []
    for path in sorted((Path(found) / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        api.call("POST", CRDS, crd)
        names.append(crd["metadata"]["name"])
    for name in names:
        eventually(
            lambda n=name: any(
                c["type"] == "Established" and c["status"] == "True"
                for c in get(api, f"{CRDS}/{n}").get("status", {}).get("conditions", [])
            ),
            30,
            f"CRD {name} established",
        )
    yield
    for name in names:
        api.call("DELETE", f"{CRDS}/{name}")


@pytest.fixture(scope="module")
def local_monitoring(
    open_engine_stack: OpenStack, workspace: Path, cluster: Cluster, image: str
) -> Iterator[auto.Stack]:
    committed = PROJECT_DIR / "stacks" / "Pulumi.local.yaml"
    (workspace / "stacks" / "Pulumi.local-monitoring.yaml").write_text(committed.read_text())
    stack = open_engine_stack("local-monitoring")
    for_this_cluster(stack, cluster, image)
    set_config(stack, "rdmaMonitoring", "prometheusOperator")
    set_config(stack, "rdmaPodQps", "true")
    yield stack
    if stack.export_stack().deployment.get("resources"):  # a test failed midway
        stack.destroy(on_output=print)


@pytest.mark.usefixtures("operator_crds", "lingjun_node", "host_infiniband", "node_sysfs")
def test_up_creates_the_monitoring_objects_that_select_the_running_plugin(
    local_monitoring: auto.Stack, api: Api
) -> None:
    result, took = up(local_monitoring)
    print(f"engine: monitoring up: {took:.1f} s, {dict(result.summary.resource_changes or {})}")

    assert result.summary.result == "succeeded"
    monitor = get(api, f"{MONITORING}/podmonitors/{NAME}")
    rule = get(api, f"{MONITORING}/prometheusrules/{NAME}")
    board = get(api, f"/api/v1/namespaces/{NAMESPACE}/configmaps/{NAME}-dashboard")
    (pod,) = plugin_pods(api)
    # the PodMonitor's selector and port are the plugin pod's own
    labels = pod["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    (port,) = [p for p in pod["spec"]["containers"][0]["ports"] if p["name"] == endpoint["port"]]
    names = [r["alert"] for r in rule["spec"]["groups"][0]["rules"]]
    assert names == [a.name for a in alerts(PLUGIN, 5, port_counters=True, non_host_network=False)]
    titles = [p["title"] for p in json.loads(board["data"]["lingjun-rdma.json"])["panels"]]
    assert "Queue pairs per pod" in titles
    # rdmaPodQps: the kubelet ran the plugin in the host's pid namespace, as its QPs need
    assert pod["spec"]["hostPID"] is True
    assert pod["status"]["phase"] == "Running"

    # what that PodMonitor scrapes: the running pod's /metrics carries each plugin metric the
    # pack names (the port counters' need driver files this node's fixture lacks)
    url = f"http://{pod['status']['podIP']}:{port['containerPort']}{endpoint['path']}"
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    named = {m for r in rule["spec"]["groups"][0]["rules"] for m in re.findall(
        r"rdma_plugin_[a-z_]+", r["expr"])}  # fmt: skip
    exported = set(re.findall(r"^(rdma_plugin_[a-z_]+)", text, re.MULTILINE))
    assert named - exported == set()
    assert re.search(r'^rdma_plugin_registered\{resource="rdma/hca"\} 1\.0$', text, re.MULTILINE)


@pytest.mark.usefixtures("operator_crds", "lingjun_node", "host_infiniband", "node_sysfs")
def test_destroy_removes_the_monitoring_objects(local_monitoring: auto.Stack, api: Api) -> None:
    local_monitoring.destroy(on_output=print)

    assert not local_monitoring.export_stack().deployment.get("resources")
    for kind in ("podmonitors", "prometheusrules"):
        with pytest.raises(ApiError) as caught:
            get(api, f"{MONITORING}/{kind}/{NAME}")
        assert caught.value.status == 404
