"""What a front end's /metrics holds, as its CoreSpec says: its own metrics, every port's
counters (unless turned off: node_exporter may export them already) and the QPs per pod (when
turned on: that needs the host's pid namespace)."""

from __future__ import annotations

import logging

from plugin.core.metrics import counters, podqps
from plugin.core.metrics.exposition import Metrics
from plugin.core.metrics.restrack import host_pid_namespace
from plugin.launch import CoreSpec

logger = logging.getLogger(__name__)


def metrics_for(spec: CoreSpec) -> Metrics:
    metrics = Metrics()
    if spec.port_counters == "on":
        metrics.collect(lambda: counters.collect(spec.sysfs_root), reads_host=True)
    if spec.pod_qps == "on":
        if not host_pid_namespace():
            logger.warning(
                "--pod-qps on, but this process is not in the host's pid namespace: it sees only "
                "its own QPs, none of any pod's (run it with hostPID)"
            )
        metrics.collect(podqps.collect, reads_host=True)
    return metrics
