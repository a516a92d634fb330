"""RdmaMonitoring: the plugin's scrape, alert pack and dashboard for the monitoring a stack
runs: the Prometheus Operator's CRs in the cluster, or ACK's managed Prometheus (ARMS) through
its API (it reads PrometheusRules only with a rule sync switched on, so rules go to it
directly)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import pulumi
import pulumi_kubernetes as k8s
import yaml

from infra.components.alerts import (
    JOB_LABEL,
    PART_OF,
    Alert,
    alerts,
    dashboard,
    pod_monitor,
    rule_groups,
)
from infra.components.alicloud import arms

# kube-prometheus-stack's Grafana sidecar loads a ConfigMap with this label as a dashboard.
GRAFANA_DASHBOARD_LABEL = {"grafana_dashboard": "1"}
# ARMS keeps the PodMonitors it is given in this namespace, and scrapes those it is told to.
ARMS_NAMESPACE = "arms-prom"
ARMS_DISCOVERY = {"arms.prometheus.io/discovery": "true"}

Mode = Literal["prometheusOperator", "arms"]


@dataclass(frozen=True)
class MonitoringArgs:
    mode: Mode
    namespace: str  # the plugin's
    pod_labels: dict[str, str]  # the plugin's pods' labels; the job label is among them
    rescan_interval: float
    port_counters: bool
    non_host_network: bool
    pod_qps: bool
    # arms: the managed Prometheus instance of the ACK cluster (its ID is the cluster's)
    arms_cluster_id: pulumi.Input[str] | None = None


class RdmaMonitoring(pulumi.ComponentResource):
    def __init__(
        self, name: str, args: MonitoringArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("lingjun:rdma:Monitoring", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        job = args.pod_labels[JOB_LABEL]
        pack = alerts(
            job,
            args.rescan_interval,
            port_counters=args.port_counters,
            non_host_network=args.non_host_network,
        )
        monitor = pod_monitor(name, args.namespace, args.pod_labels)
        # The dashboard as a ConfigMap in either mode: Grafana's sidecar loads it, and ARMS's
        # Grafana imports its JSON (kubectl get configmap -o jsonpath).
        k8s.core.v1.ConfigMap(
            f"{name}-dashboard",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=f"{name}-dashboard",
                namespace=args.namespace,
                labels={**PART_OF, **GRAFANA_DASHBOARD_LABEL},
            ),
            data={
                "lingjun-rdma.json": dashboard(
                    port_counters=args.port_counters, pod_qps=args.pod_qps
                )
            },
            opts=child,
        )
        if args.mode == "prometheusOperator":
            self._operator(name, args.namespace, monitor, pack, child)
        else:
            if args.arms_cluster_id is None:
                raise ValueError("monitoring: arms needs the ACK cluster's ID")
            self._arms(name, args.arms_cluster_id, monitor, pack, child)
        self.register_outputs({})

    def _operator(
        self,
        name: str,
        namespace: str,
        monitor: dict[str, Any],
        pack: list[Alert],
        opts: pulumi.ResourceOptions,
    ) -> None:
        k8s.apiextensions.CustomResource(
            f"{name}-podmonitor",
            api_version=str(monitor["apiVersion"]),
            kind=str(monitor["kind"]),
            metadata=monitor["metadata"],
            spec=monitor["spec"],
            opts=opts,
        )
        k8s.apiextensions.CustomResource(
            f"{name}-rules",
            api_version="monitoring.coreos.com/v1",
            kind="PrometheusRule",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=name, namespace=namespace, labels=PART_OF),
            spec=rule_groups(pack),
            opts=opts,
        )

    def _arms(
        self,
        name: str,
        cluster_id: pulumi.Input[str],
        monitor: dict[str, Any],
        pack: list[Alert],
        opts: pulumi.ResourceOptions,
    ) -> None:
        metadata = {
            **monitor["metadata"],
            "namespace": ARMS_NAMESPACE,
            "annotations": ARMS_DISCOVERY,
        }
        arms.PrometheusMonitoring(
            f"{name}-podmonitor",
            cluster_id=cluster_id,
            type="podMonitor",
            status="run",
            config_yaml=yaml.safe_dump({**monitor, "metadata": metadata}, sort_keys=False),
            opts=opts,
        )
        for alert in pack:
            arms.PrometheusAlertRule(
                f"{name}-{alert.name}",
                cluster_id=cluster_id,
                prometheus_alert_rule_name=alert.name,
                expression=alert.expr,
                duration=str(max(1, alert.duration)),  # minutes, 1-1440
                message=alert.summary,
                labels=[arms.PrometheusAlertRuleLabelArgs(name="severity", value=alert.severity)],
                annotations=[
                    arms.PrometheusAlertRuleAnnotationArgs(
                        name="description", value=alert.description
                    )
                ],
                notify_type="ALERT_MANAGER",
                opts=opts,
            )
