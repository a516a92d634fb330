"""Every metric the alert pack and the dashboard name (infra/components/alerts.py) is one the
running plugin exports: scraped from the plugin process, on a node whose ports have every counter
file they read."""

from __future__ import annotations

import asyncio
import re
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from infra.components.alerts import KUBE_POD_INFO, alerts, panels
from plugin.core.metrics.counters import HW_COUNTERS, PORT_COUNTERS
from plugin.core.metrics.podqps import POD_QPS
from tests.plugin.kubelet_peer import KubeletPeer
from tests.plugin.plugin_process import PluginProcess
from tests.plugin.sysfs_tree import SysfsTree

# Not the plugin's: Prometheus's scrape health, kube-state-metrics' pods (joined for names)
ELSEWHERE = {"up", KUBE_POD_INFO}


def named() -> set[str]:
    exprs = [
        a.expr for a in alerts("rdma-device-plugin", 5.0, port_counters=True, non_host_network=True)
    ]
    exprs += [e for p in panels(port_counters=True, pod_qps=True) for e, _ in p.exprs]
    # label matchers, ranges and groupings out: what is left names metrics
    bare = [re.sub(r"\{[^}]*\}|\[[^]]*\]|\b(by|on|group_left) \([^)]*\)", "", e) for e in exprs]
    names = {n for e in bare for n in re.findall(r"[a-z_:][a-z0-9_:]*", e)}
    # PromQL's own words the pack uses
    return names - {"rate", "increase", "time", "or", "sum", "max_over_time", "unless", "and"}


async def test_every_metric_an_alert_or_panel_names_is_exported(
    kubelet: KubeletPeer, plugin: PluginProcess, tree: SysfsTree
) -> None:
    files = {c.metric + "_total": (f, False) for f, c in PORT_COUNTERS.items()}
    files |= {c.metric + "_total": (f, True) for f, c in HW_COUNTERS.items()}
    # QPs need real verbs: tests/plugin/rdma/test_podqps.py scrapes that one in the VM
    wanted = named() - ELSEWHERE - {POD_QPS}
    for metric in wanted & files.keys():  # each counter file the pack reads, as a driver has it
        name, hw = files[metric]
        tree.set_counter("mlx5_0", 1, name, "1", hw=hw)
    config = plugin.write_config("nonHostNetwork: true\n")  # its readiness gauge is named too
    await plugin.start(config)
    await kubelet.wait_registrations(1)
    url = f"http://127.0.0.1:{plugin.metrics_port}/metrics"

    def scrape() -> str:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.read().decode()

    text = await asyncio.to_thread(scrape)
    exported = {s.name for f in text_string_to_metric_families(text) for s in f.samples}

    assert len(wanted) > 20  # the parse found the pack's names
    assert wanted - exported == set()
    assert POD_QPS in named()
