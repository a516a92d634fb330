"""rdmaMonitoring under Pulumi mocks: what each mode plans, resolved."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from infra.components.alerts import (
    ACK_TIMEOUT_PER_SECOND,
    CNP_STORM_PER_SECOND,
    LINK_FLAPS,
    OUT_OF_BUFFER_PER_SECOND,
    RETRANSMIT_PER_SECOND,
    alerts,
)
from infra.components.monitoring import ARMS_DISCOVERY, ARMS_NAMESPACE, GRAFANA_DASHBOARD_LABEL
from infra.stack.keys import PROJECT_DIR
from tests.infra.conftest import k8s_object, k8s_objects, of_type, one, run
from tests.infra.test_config import _error

ARMS_RULE = "alicloud:arms/prometheusAlertRule:PrometheusAlertRule"
ARMS_MONITOR = "alicloud:arms/prometheusMonitoring:PrometheusMonitoring"
PLUGIN_LABELS = {"app.kubernetes.io/name": "rdma-device-plugin"}


def _monitoring_types(stack: str, *overrides: str) -> set[str]:
    result = run(stack, *overrides)
    kinds = {m["kind"] for m in k8s_objects(result, "PodMonitor")}
    kinds |= {m["kind"] for m in k8s_objects(result, "PrometheusRule")}
    kinds |= {r.type for r in result.resources if r.type.startswith("alicloud:arms")}
    return kinds


@pytest.mark.parametrize("stack", ["dev", "local"])
def test_none_by_default_plans_no_monitoring(stack: str) -> None:
    assert _monitoring_types(stack) == set()
    assert not [c for c in k8s_objects(run(stack), "ConfigMap") if "dashboard" in str(c)]


def test_prometheus_operator_scrapes_the_plugins_pods_with_the_pack_and_a_dashboard() -> None:
    result = run("local", "rdmaMonitoring=prometheusOperator")
    monitor = k8s_object(result, "PodMonitor", "rdma-monitoring")
    rule = k8s_object(result, "PrometheusRule", "rdma-monitoring")
    board = k8s_object(result, "ConfigMap", "rdma-monitoring-dashboard")
    daemonset = k8s_object(result, "DaemonSet", "rdma-device-plugin")

    pod = daemonset["spec"]["template"]
    assert monitor["spec"]["selector"]["matchLabels"] == PLUGIN_LABELS
    assert PLUGIN_LABELS.items() <= pod["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in {p["name"] for p in pod["spec"]["containers"][0]["ports"]}
    assert monitor["metadata"]["namespace"] == daemonset["metadata"]["namespace"]
    names = [r["alert"] for r in rule["spec"]["groups"][0]["rules"]]
    assert names == [
        a.name for a in alerts("rdma-device-plugin", 5, port_counters=True, non_host_network=False)
    ]
    assert GRAFANA_DASHBOARD_LABEL.items() <= board["metadata"]["labels"].items()
    assert json.loads(board["data"]["lingjun-rdma.json"])["uid"] == "lingjun-rdma"
    assert not of_type(result, ARMS_RULE)


def test_without_port_counters_the_pack_leaves_the_port_alerts_out() -> None:
    result = run("local", "rdmaMonitoring=prometheusOperator", "rdmaPortCounters=false")
    rules = k8s_object(result, "PrometheusRule", "rdma-monitoring")["spec"]["groups"][0]["rules"]

    names = {r["alert"] for r in rules}
    assert "RdmaPluginNotRegistered" in names
    assert not [n for n in names if n.startswith(("RdmaPort", "RdmaCnp", "RdmaIcrc"))]
    assert not [r for r in rules if "rdma_port_" in r["expr"]]


def test_a_slower_rescan_makes_the_stale_scan_alert_wait_longer() -> None:
    result = run("local", "rdmaMonitoring=prometheusOperator", "rdmaRescanInterval=600")
    rules = k8s_object(result, "PrometheusRule", "rdma-monitoring")["spec"]["groups"][0]["rules"]

    (stale,) = [r["expr"] for r in rules if r["alert"] == "RdmaScansFailing"]
    assert stale.endswith("> 1800")


@pytest.mark.parametrize(
    ("stack", "overrides", "cluster_id"),
    [("dev", (), "lingjun-rdma-cluster-ack-id"),
     ("local", ("kubeconfig=", "clusterId=c123"), "c123")],
)  # fmt: skip
def test_arms_gets_the_podmonitor_and_each_alert_through_its_api(
    stack: str, overrides: tuple[str, ...], cluster_id: str
) -> None:
    result = run(stack, "rdmaMonitoring=arms", *overrides)
    monitor = one(result, ARMS_MONITOR).inputs
    rules = {r.inputs["prometheusAlertRuleName"]: r.inputs for r in of_type(result, ARMS_RULE)}

    assert monitor["clusterId"] == cluster_id
    assert monitor["type"] == "podMonitor"
    config = yaml.safe_load(monitor["configYaml"])
    assert config["metadata"]["namespace"] == ARMS_NAMESPACE
    assert config["metadata"]["annotations"] == ARMS_DISCOVERY
    assert config["spec"]["selector"]["matchLabels"] == PLUGIN_LABELS
    pack = alerts("rdma-device-plugin", 5, port_counters=True, non_host_network=False)
    assert set(rules) == {a.name for a in pack}
    for alert in pack:
        rule = rules[alert.name]
        assert rule["clusterId"] == cluster_id
        assert rule["expression"] == alert.expr
        assert rule["duration"] == str(max(1, alert.duration))
        assert rule["labels"] == [{"name": "severity", "value": alert.severity}]
    assert not k8s_objects(result, "PrometheusRule")
    assert k8s_object(result, "ConfigMap", "rdma-monitoring-dashboard")


def test_arms_on_a_cluster_adopted_by_kubeconfig_is_refused() -> None:
    message = _error("local", rdmaMonitoring="arms")

    assert "lingjun-rdma:rdmaMonitoring: arms needs an ACK cluster's ID" in message
    assert "(pulumi config set lingjun-rdma:rdmaMonitoring prometheusOperator)" in message


def test_an_unknown_monitoring_is_refused_naming_the_choices() -> None:
    message = _error(rdmaMonitoring="grafana")

    assert "lingjun-rdma:rdmaMonitoring:" in message
    assert "'prometheusOperator'" in message


def test_the_network_mode_alert_is_in_the_pack_of_a_stack_that_serves_it_only() -> None:
    def names(stack: str) -> set[str]:
        result = run(stack, "rdmaMonitoring=prometheusOperator")
        rule = k8s_object(result, "PrometheusRule", "rdma-monitoring")
        return {r["alert"] for r in rule["spec"]["groups"][0]["rules"]}

    assert "RdmaNonHostNetworkNotReady" in names("staging")  # nonHostNetwork: true
    assert "RdmaNonHostNetworkNotReady" not in names("dev")


def test_the_qps_per_pod_panel_is_on_the_dashboard_of_a_stack_that_exports_them() -> None:
    def titles(*overrides: str) -> list[str]:
        result = run("local", "rdmaMonitoring=prometheusOperator", *overrides)
        board = k8s_object(result, "ConfigMap", "rdma-monitoring-dashboard")
        return [p["title"] for p in json.loads(board["data"]["lingjun-rdma.json"])["panels"]]

    assert "Queue pairs per pod" in titles("rdmaPodQps=true")
    assert "Queue pairs per pod" not in titles()


def test_the_monitoring_docs_alert_table_is_the_pack_with_its_thresholds() -> None:
    readme = (PROJECT_DIR / "docs" / "monitoring.md").read_text()
    rows = {
        m["name"]: (m["when"], m["for"])
        for m in re.finditer(r"^\| `(?P<name>Rdma\w+)` \| (?P<when>[^|]+) \| (?P<for>[^|]+) \|$",
                             readme, re.M)
    }  # fmt: skip
    pack = {a.name: a for a in alerts("j", 5, port_counters=True, non_host_network=True)}
    thresholds = {
        "RdmaCnpStorm": CNP_STORM_PER_SECOND,
        "RdmaOutOfBuffer": OUT_OF_BUFFER_PER_SECOND,
        "RdmaRetransmits": RETRANSMIT_PER_SECOND,
        "RdmaAckTimeouts": ACK_TIMEOUT_PER_SECOND,
        "RdmaLinkFlapping": LINK_FLAPS,
    }

    assert rows.keys() == pack.keys()
    for name, alert in pack.items():
        when, duration = rows[name]
        assert duration.strip() == (f"{alert.duration}m" if alert.duration else "\u2013"), name
        if name in thresholds:
            assert f"> {thresholds[name]}" in alert.expr, name
            assert re.search(rf"\b{thresholds[name]}\b", when), (name, when)
