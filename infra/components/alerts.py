"""What operators watch, as data: the alert pack (Prometheus rules), the Grafana dashboard and
the PodMonitor that scrapes the plugin. Pure: infra/components/monitoring.py makes them
resources, and tests run the rules through promtool. Every metric named here is one the plugin
exports."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from plugin.core.metrics.counters import STATE_METRIC
from plugin.core.metrics.podqps import OTHER

# The PodMonitor's job label takes the pods' name label: alerts select the plugin's `up` by it.
JOB_LABEL = "app.kubernetes.io/name"
# Where the scrape puts the node a pod runs on (the pods are on the host network: the instance
# is the node's IP, which an operator does not read at a glance).
NODE = "node"
SCRAPE_INTERVAL = "30s"
# kube-state-metrics' series of each pod (its namespace, name and uid), which the QPs per pod
# join for names: the plugin labels them by UID alone and reads no pod from the API.
KUBE_POD_INFO = "kube_pod_info"
PART_OF = {"app.kubernetes.io/part-of": "lingjun-rdma"}

# Thresholds, per port. Sustained rates, not single events: a fabric has bursts. Tune them to
# yours: the README says what each means.
CNP_STORM_PER_SECOND = 5000  # DCQCN at this rate means the port is congested most of the time
OUT_OF_BUFFER_PER_SECOND = 1  # packets dropped for want of a posted receive
RETRANSMIT_PER_SECOND = 10  # sequence-error NAKs and out-of-sequence packets: go-back-N resends
ACK_TIMEOUT_PER_SECOND = 1  # a QP's ACK timer expired: a packet (or its ACK) was lost
LINK_FLAPS = 2  # link downs in 30 minutes
# How long a gone HCA is remembered by the alert on it across restarts of the plugin
HCA_MEMORY = "1h"


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    duration: int  # minutes the expression must hold (`for`)
    severity: Literal["critical", "warning"]
    summary: str  # one line; {{ $labels.x }} and {{ $value }} are filled in
    description: str  # what it means and what to do

    def rule(self) -> dict[str, Any]:
        """As a Prometheus alerting rule."""
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": f"{self.duration}m",
            "labels": {"severity": self.severity},
            "annotations": {"summary": self.summary, "description": self.description},
        }


def alerts(
    job: str, rescan_interval: float, *, port_counters: bool, non_host_network: bool
) -> list[Alert]:
    """The alert pack for the plugin's pods (`job`): the port alerts only where the plugin
    exports its ports' counters (where node_exporter does, its own names apply), the network
    mode's only where the stack serves pods off the host network."""
    # A scan runs at least every interval (and on every kernel event): three missed, and at
    # least two minutes, is a watcher that stopped.
    stale = max(120, round(3 * rescan_interval))
    plugin = [
        Alert(
            "RdmaPluginDown",
            f'up{{job="{job}"}} == 0',
            5,
            "critical",
            "The RDMA plugin on {{ $labels.node }} does not answer its scrape",
            "Its pod is down, crash-looping or not ready: pods there get no new RDMA devices. "
            "kubectl -n <namespace> describe pod, and its log.",
        ),
        Alert(
            "RdmaPluginNotRegistered",
            "rdma_plugin_registered == 0",
            5,
            "critical",
            "{{ $labels.resource }} is not registered with the kubelet on {{ $labels.node }}",
            "The kubelet does not hold the plugin's registration: new pods asking for it stay "
            "Pending. The Node's Events (reason RdmaRegistrationFailing) say why.",
        ),
        Alert(
            "RdmaScansFailing",
            f"time() - rdma_plugin_last_scan_timestamp_seconds > {stale}",
            5,
            "warning",
            f"The RDMA plugin on {{{{ $labels.node }}}} has not scanned its HCAs for over {stale}s",
            "Health is not being refreshed: a port going down would not be noticed. The log "
            'says why each scan failed (rdma_plugin_errors_total{kind="scan"}).',
        ),
        Alert(
            "RdmaHcaUnhealthy",
            "rdma_plugin_hca_healthy == 0",
            2,
            "warning",
            "HCA {{ $labels.hca }} on {{ $labels.node }} is left out of {{ $labels.resource }}",
            "No port of it is ACTIVE, or it cannot be read: pods are not given it. The Node's "
            "Events (reason RdmaHcaUnhealthy) say which port and why.",
        ),
        Alert(
            "RdmaHcaGone",
            # the plugin holds a gone HCA's series at 0 (the alert above); this one covers a
            # plugin restarted since, which no longer knows it: a series of the last hour that
            # stopped while the plugin answers
            f"(max_over_time(rdma_plugin_hca_healthy[{HCA_MEMORY}]) unless on ({NODE}, resource, "
            f'hca) rdma_plugin_hca_healthy) and on ({NODE}) (up{{job="{job}"}} == 1)',
            2,
            "warning",
            "HCA {{ $labels.hca }} of {{ $labels.resource }} is gone from {{ $labels.node }}",
            "The plugin served it in the last hour and no longer sees it: unplugged, its driver "
            "unloaded, or renamed. The Node's Events (reason RdmaHcaGone) say when; dmesg why.",
        ),
        Alert(
            "RdmaNoHealthyDevice",
            'rdma_plugin_devices{health="Healthy"} == 0',
            2,
            "critical",
            "{{ $labels.resource }} has no healthy device on {{ $labels.node }}",
            "Every HCA of the pool is down or unreadable, or the pool matches none: no pod "
            "asking for it can start there.",
        ),
    ]
    if non_host_network:
        plugin.append(
            Alert(
                "RdmaNonHostNetworkNotReady",
                "rdma_plugin_non_host_network_ready == 0",
                5,
                "warning",
                "Pods off the host network cannot use RDMA on {{ $labels.node }}",
                "nonHostNetwork is on, but the node lacks an IPv6 RoCE v2 GID or the shared netns "
                "mode. The Node's Events (reason RdmaNonHostNetworkNotReady) say which.",
            )
        )
    if not port_counters:
        return plugin
    rate = "[5m]"
    return [
        *plugin,
        Alert(
            "RdmaPortDown",
            f"{STATE_METRIC} != 4",
            2,
            "critical",
            "RDMA port {{ $labels.hca }}/{{ $labels.port }} on {{ $labels.node }} is not ACTIVE",
            "Its state is {{ $value }} (1 DOWN, 2 INIT, 3 ARMED). Check the cable, the switch "
            "port and the netdev's carrier (ip link).",
        ),
        Alert(
            "RdmaLinkFlapping",
            f"increase(rdma_port_link_downed_total[30m]) > {LINK_FLAPS}",
            0,
            "warning",
            "RDMA port {{ $labels.hca }}/{{ $labels.port }} on {{ $labels.node }} went down "
            "{{ $value }} times in 30 minutes",
            "A flapping link resets every QP on it: jobs see timeouts. Check optics and cables.",
        ),
        Alert(
            "RdmaCnpStorm",
            f"rate(rdma_port_cnp_handled_total{rate}) > {CNP_STORM_PER_SECOND}"
            f" or rate(rdma_port_cnp_sent_total{rate}) > {CNP_STORM_PER_SECOND}",
            10,
            "warning",
            "RDMA port {{ $labels.hca }}/{{ $labels.port }} on {{ $labels.node }}: "
            "{{ $value }} CNPs per second",
            "Sustained congestion notifications (DCQCN): the fabric is congested at this port. "
            "Look for incast, an oversubscribed uplink or a PFC/ECN misconfiguration.",
        ),
        Alert(
            "RdmaCnpIgnored",
            f"increase(rdma_port_cnp_ignored_total{rate}) > 0",
            5,
            "warning",
            "RDMA port {{ $labels.hca }}/{{ $labels.port }} on {{ $labels.node }} ignores CNPs",
            "Congestion notifications arrive but the rate is not lowered: congestion control "
            "is off for this priority. Enable DCQCN (mlxconfig/sysfs roce_np_enable).",
        ),
        Alert(
            "RdmaOutOfBuffer",
            f"rate(rdma_port_out_of_buffer_total{rate}) > {OUT_OF_BUFFER_PER_SECOND}",
            10,
            "warning",
            "RDMA port {{ $labels.hca }}/{{ $labels.port }} on {{ $labels.node }} drops "
            "{{ $value }} packets per second: no receive buffer",
            "A receiver posts its receive WQEs too slowly: packets are dropped and resent. "
            "Usually an application (or a CPU-starved one) on this node.",
        ),
        Alert(
            "RdmaIcrcErrors",
            f"increase(rdma_port_icrc_errors_total{rate}) > 0",
            5,
            "warning",
            "RDMA port {{ $labels.hca }}/{{ $labels.port }} on {{ $labels.node }} receives "
            "packets with a bad ICRC",
            "RoCE packets are corrupted on the wire: a bad cable, optic or switch port.",
        ),
        Alert(
            "RdmaRetransmits",
            f"rate(rdma_port_packet_seq_errors_total{rate}) > {RETRANSMIT_PER_SECOND}"
            f" or rate(rdma_port_out_of_sequence_total{rate}) > {RETRANSMIT_PER_SECOND}",
            10,
            "warning",
            "RDMA port {{ $labels.hca }}/{{ $labels.port }} on {{ $labels.node }}: "
            "{{ $value }} retransmission triggers per second",
            "Packets are lost in the fabric (sequence NAKs, out-of-sequence arrivals), and "
            "every loss resends a window: throughput collapses. Check PFC and drops upstream.",
        ),
        Alert(
            "RdmaAckTimeouts",
            f"rate(rdma_port_local_ack_timeouts_total{rate}) > {ACK_TIMEOUT_PER_SECOND}",
            10,
            "warning",
            "RDMA port {{ $labels.hca }}/{{ $labels.port }} on {{ $labels.node }}: "
            "{{ $value }} ACK timeouts per second",
            "QPs wait out their ACK timer before resending: a packet or its ACK was lost. "
            "Jobs stall for the timeout each time.",
        ),
    ]


def rule_groups(pack: list[Alert]) -> dict[str, Any]:
    """The pack as a Prometheus rule file (and a PrometheusRule's spec)."""
    return {"groups": [{"name": "lingjun-rdma", "rules": [a.rule() for a in pack]}]}


def pod_monitor(name: str, namespace: str, pod_labels: dict[str, str]) -> dict[str, Any]:
    """A monitoring.coreos.com/v1 PodMonitor of the plugin's pods, their `metrics` port."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(PART_OF)},
        "spec": {
            "jobLabel": JOB_LABEL,
            "selector": {"matchLabels": pod_labels},
            "namespaceSelector": {"matchNames": [namespace]},
            "podMetricsEndpoints": [
                {
                    "port": "metrics",
                    "path": "/metrics",
                    "interval": SCRAPE_INTERVAL,
                    "relabelings": [
                        {
                            "sourceLabels": ["__meta_kubernetes_pod_node_name"],
                            "targetLabel": NODE,
                        }
                    ],
                }
            ],
        },
    }


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str  # Grafana's unit id
    exprs: tuple[tuple[str, str], ...]  # (PromQL, legend)


# $__rate_interval and $node are Grafana's: the dashboard's own variable and its rate window.
_PORT = '{node=~"$node"}'
_RATE = "[$__rate_interval]"


def panels(*, port_counters: bool, pod_qps: bool) -> list[Panel]:
    plugin = [
        Panel(
            "Registered with the kubelet",
            "none",
            (("rdma_plugin_registered" + _PORT, "{{node}} {{resource}}"),),
        ),
        Panel(
            "Healthy devices",
            "none",
            (('rdma_plugin_devices{health="Healthy",node=~"$node"}', "{{node}} {{resource}}"),),
        ),
        Panel(
            "Unhealthy HCAs",
            "none",
            (("rdma_plugin_hca_healthy" + _PORT + " == 0", "{{node}} {{hca}}"),),
        ),
        Panel(
            "Allocations per second",
            "ops",
            (("rate(rdma_plugin_allocations_total" + _PORT + _RATE + ")", "{{node}}"),),
        ),
        Panel("Problems", "none", (("rdma_plugin_problems" + _PORT, "{{node}}"),)),
    ]
    if pod_qps:  # the pod's namespace and name from kube-state-metrics, by the pod's UID
        plugin.append(
            Panel(
                "Queue pairs per pod",
                "none",
                (
                    (
                        "sum by (namespace, pod, hca) (rdma_pod_qps" + _PORT
                        + " * on (uid) group_left (namespace, pod) " + KUBE_POD_INFO + ")",
                        "{{namespace}}/{{pod}} {{hca}}",
                    ),
                    # past the plugin's bound, pods are summed under one uid the join drops
                    (
                        f'sum by (node, hca) (rdma_pod_qps{{uid="{OTHER}",node=~"$node"}})',
                        "{{node}} {{hca}}: other pods",
                    ),
                ),
            )
        )  # fmt: skip
    if not port_counters:
        return plugin
    port = "{{node}} {{hca}}/{{port}}"

    def per_second(metric: str, scale: str = "") -> tuple[str, str]:
        return f"rate({metric}{_PORT}{_RATE}){scale}", port

    return [
        *plugin,
        Panel("Port state (4 = ACTIVE)", "none", ((STATE_METRIC + _PORT, port),)),
        Panel(
            "Throughput",
            "bps",
            (
                per_second("rdma_port_transmitted_bytes_total", " * 8"),
                per_second("rdma_port_received_bytes_total", " * 8"),
            ),
        ),
        Panel(
            "Congestion (CNPs, ECN marks) per second",
            "pps",
            (
                per_second("rdma_port_cnp_sent_total"),
                per_second("rdma_port_cnp_handled_total"),
                per_second("rdma_port_ecn_marked_roce_packets_total"),
            ),
        ),
        Panel(
            "Drops and errors per second",
            "pps",
            (
                per_second("rdma_port_out_of_buffer_total"),
                per_second("rdma_port_icrc_errors_total"),
                per_second("rdma_port_receive_errors_total"),
            ),
        ),
        Panel(
            "Retransmits and timeouts per second",
            "pps",
            (
                per_second("rdma_port_packet_seq_errors_total"),
                per_second("rdma_port_out_of_sequence_total"),
                per_second("rdma_port_local_ack_timeouts_total"),
            ),
        ),
    ]


def dashboard(*, port_counters: bool, pod_qps: bool) -> str:
    """A Grafana dashboard (JSON model) of the panels, a node picker on top."""
    width, height = 12, 8
    body: list[dict[str, Any]] = [
        {
            "id": i + 1,
            "type": "timeseries",
            "title": p.title,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
            "gridPos": {"x": (i % 2) * width, "y": (i // 2) * height, "w": width, "h": height},
            "targets": [
                {"refId": chr(ord("A") + j), "expr": expr, "legendFormat": legend}
                for j, (expr, legend) in enumerate(p.exprs)
            ],
        }
        for i, p in enumerate(panels(port_counters=port_counters, pod_qps=pod_qps))
    ]
    return json.dumps(
        {
            "uid": "lingjun-rdma",
            "title": "RDMA (lingjun-rdma)",
            "tags": ["rdma", "lingjun-rdma"],
            "schemaVersion": 39,
            "time": {"from": "now-6h", "to": "now"},
            "templating": {
                "list": [
                    {"name": "datasource", "type": "datasource", "query": "prometheus"},
                    {
                        "name": NODE,
                        "type": "query",
                        "datasource": {"type": "prometheus", "uid": "${datasource}"},
                        "query": f"label_values(rdma_plugin_hcas, {NODE})",
                        "includeAll": True,
                        "multi": True,
                        "allValue": ".*",
                    },
                ]
            },
            "panels": body,
        },
        indent=1,
        sort_keys=True,
    )
