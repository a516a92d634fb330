"""The alert pack and the dashboard under the real promtool (built from the Prometheus module by
tests/monitoring/build.sh), and the monitoring objects against the Prometheus Operator's own
CRDs: `check rules` parses every expression and template; `test rules` shows each alert firing
on a synthetic series that should fire it and silent on a healthy one beside it."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from infra.components.alerts import alerts, dashboard, panels, pod_monitor, rule_groups

pytestmark = pytest.mark.monitoring

JOB = "rdma-device-plugin"
INTERVAL = 5.0  # the plugin's default rescan interval


@pytest.fixture(scope="module")
def built() -> Path:
    """promtool and the CRDs: `make monitoring` builds them; absent is a failure, not a skip."""
    found = os.environ.get("LINGJUN_MONITORING")
    if not found or not (Path(found) / "bin" / "promtool").is_file():
        pytest.fail("LINGJUN_MONITORING: run `make monitoring` (it builds promtool)")
    return Path(found)


def promtool(built: Path, *args: str, cwd: Path) -> str:
    done = subprocess.run(
        [str(built / "bin" / "promtool"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"promtool {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.parametrize("port_counters", [True, False])
def test_promtool_checks_the_rule_file(built: Path, tmp_path: Path, port_counters: bool) -> None:
    pack = alerts(JOB, INTERVAL, port_counters=port_counters, non_host_network=True)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_groups(pack)))

    said = promtool(built, "check", "rules", "rules.yaml", cwd=tmp_path)

    assert f"SUCCESS: {len(pack)} rules found" in said


@dataclass(frozen=True)
class Case:
    """A bad series (the alert fires on it, with these labels) beside a healthy one."""

    metric: str
    labels: str  # the series' labels but node
    bad: str  # promtool's expanding notation, one sample a minute
    good: str
    beside: str = ""  # a series of both nodes the alert also reads (its labels but node)
    beside_values: str = ""


_PORT = 'hca="mlx5_0",port="1"'
_POOL = 'resource="rdma/hca"'
CASES = {
    "RdmaPluginDown": Case("up", f'job="{JOB}"', "0x20", "1x20"),
    "RdmaPluginNotRegistered": Case("rdma_plugin_registered", _POOL, "0x20", "1x20"),
    # a scan timestamp frozen at 0 vs one following the clock (a scan every minute)
    "RdmaScansFailing": Case("rdma_plugin_last_scan_timestamp_seconds", "", "0x20", "0+60x20"),
    "RdmaHcaUnhealthy": Case("rdma_plugin_hca_healthy", f'{_POOL},hca="mlx5_1"', "0x20", "1x20"),
    # served for 5 minutes, then gone (a plugin restarted since has no series of it)
    "RdmaHcaGone": Case(
        "rdma_plugin_hca_healthy",
        f'{_POOL},hca="mlx5_1"',
        "1x5 _x15",
        "1x20",
        f'up{{job="{JOB}"}}',
        "1x20",
    ),
    "RdmaNoHealthyDevice": Case(
        "rdma_plugin_devices", f'{_POOL},health="Healthy"', "0x20", "1000x20"
    ),
    "RdmaNonHostNetworkNotReady": Case("rdma_plugin_non_host_network_ready", "", "0x20", "1x20"),
    "RdmaPortDown": Case("rdma_port_state", _PORT, "1x20", "4x20"),
    "RdmaLinkFlapping": Case("rdma_port_link_downed_total", _PORT, "0+1x20", "1x20"),
    # per minute: 400000 CNPs is 6667/s; 1000 is 17/s
    "RdmaCnpStorm": Case("rdma_port_cnp_handled_total", _PORT, "0+400000x20", "0+1000x20"),
    "RdmaCnpIgnored": Case("rdma_port_cnp_ignored_total", _PORT, "0+1x20", "5x20"),
    "RdmaOutOfBuffer": Case("rdma_port_out_of_buffer_total", _PORT, "0+600x20", "0+6x20"),
    "RdmaIcrcErrors": Case("rdma_port_icrc_errors_total", _PORT, "0+1x20", "3x20"),
    "RdmaRetransmits": Case("rdma_port_packet_seq_errors_total", _PORT, "0+1200x20", "0+60x20"),
    "RdmaAckTimeouts": Case("rdma_port_local_ack_timeouts_total", _PORT, "0+120x20", "0+6x20"),
}


def _series(case: Case, node: str) -> str:
    labels = [x for x in (case.labels, f'node="{node}"') if x]
    return case.metric + "{" + ",".join(labels) + "}"


def _beside(case: Case, node: str) -> str:
    name, _, labels = case.beside.partition("{")
    return f'{name}{{{labels.rstrip("}")},node="{node}"}}'


def _labels(case: Case, severity: str) -> dict[str, str]:
    pairs = re.findall(r'(\w+)="([^"]*)"', case.labels)
    return {**dict(pairs), "node": "bad", "severity": severity}


def test_every_alert_has_a_case() -> None:
    assert {
        a.name for a in alerts(JOB, INTERVAL, port_counters=True, non_host_network=True)
    } == set(CASES)


def test_each_alert_fires_on_its_bad_series_and_not_on_the_healthy_one(
    built: Path, tmp_path: Path
) -> None:
    pack = alerts(JOB, INTERVAL, port_counters=True, non_host_network=True)
    # The firing logic alone: the annotations' templates are checked by `check rules`.
    bare = [{k: v for k, v in a.rule().items() if k != "annotations"} for a in pack]
    (tmp_path / "rules.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "lingjun-rdma", "rules": bare}]})
    )
    tests: list[dict[str, Any]] = []
    for alert in pack:
        case = CASES[alert.name]
        tests.append(
            {
                "interval": "1m",
                "input_series": [
                    {"series": _series(case, "bad"), "values": case.bad},
                    {"series": _series(case, "good"), "values": case.good},
                    *(
                        {"series": _beside(case, node), "values": case.beside_values}
                        for node in ("bad", "good")
                        if case.beside
                    ),
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "15m",
                        "alertname": alert.name,
                        "exp_alerts": [{"exp_labels": _labels(case, alert.severity)}],
                    }
                ],
            }
        )
    (tmp_path / "test.yaml").write_text(
        yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests})
    )

    said = promtool(built, "test", "rules", "test.yaml", cwd=tmp_path)

    assert "SUCCESS" in said


def test_every_dashboard_expression_parses(built: Path, tmp_path: Path) -> None:
    """Each panel's query as a recording rule, Grafana's variables given values."""
    exprs = [expr for p in panels(port_counters=True, pod_qps=True) for expr, _ in p.exprs]
    rules = [
        {
            "record": f"panel_{i}",
            "expr": e.replace("$__rate_interval", "5m").replace("$node", ".*"),
        }
        for i, e in enumerate(exprs)
    ]
    (tmp_path / "rules.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]})
    )

    said = promtool(built, "check", "rules", "rules.yaml", cwd=tmp_path)

    assert f"SUCCESS: {len(rules)} rules found" in said
    assert dashboard(port_counters=True, pod_qps=True).count('"expr"') == len(exprs)


def _crd_schema(built: Path, plural: str) -> dict[str, Any]:
    crd = yaml.safe_load((built / "crds" / f"monitoring.coreos.com_{plural}.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return version["schema"]["openAPIV3Schema"]


def test_the_monitoring_objects_are_valid_under_the_operators_crds(built: Path) -> None:
    monitor = pod_monitor("rdma-monitoring", "lingjun-rdma", {"app.kubernetes.io/name": JOB})
    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "rdma-monitoring", "namespace": "lingjun-rdma"},
        "spec": rule_groups(alerts(JOB, INTERVAL, port_counters=True, non_host_network=True)),
    }
    # Draft 7 as is: the CRDs' patterns are Go's (RE2), which the metaschema check would refuse
    for obj, plural in ((monitor, "podmonitors"), (rule, "prometheusrules")):
        jsonschema.Draft7Validator(_crd_schema(built, plural)).validate(obj)

    broken = {**monitor, "spec": {**monitor["spec"], "podMetricsEndpoints": [{"port": 9100}]}}
    with pytest.raises(jsonschema.ValidationError):  # the schema does check: a number port
        jsonschema.Draft7Validator(_crd_schema(built, "podmonitors")).validate(broken)
