"""Queue pairs per pod in shared mode, where every pod opens the same devices: restrack's pid of
each QP (plugin/core/metrics/restrack.py), mapped to the pod whose cgroup holds that process. The
kubelet names each pod's cgroup after the pod's UID, with the systemd driver
(kubepods-besteffort-pod<uid with _>.slice) and the cgroupfs one (/kubepods/besteffort/pod<uid>)
alike. The UID is kube-state-metrics' `uid`: joined with kube_pod_info, it gives the namespace
and the name without any API access here."""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from pathlib import Path

from plugin.core.metrics.exposition import MetricFamily
from plugin.core.metrics.restrack import Qp, RestrackError, queue_pairs

logger = logging.getLogger(__name__)

PROC = Path("/proc")
_POD_UID = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
)
# Pods with series of their own on a node: more than a node runs (the kubelet's default max is
# 110); past it, the rest are summed under uid="other", so no pod churn can grow the scrape.
MAX_PODS = 250
OTHER = "other"
POD_QPS = "rdma_pod_qps"
_CGROUP_BYTES = 64 * 1024


def pod_uid(pid: int, proc: Path = PROC) -> str | None:
    """The UID of the pod whose cgroup holds `pid`; None for a process outside any pod (or
    gone since its QP was listed)."""
    try:
        fd = os.open(proc / str(pid) / "cgroup", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        text = os.read(fd, _CGROUP_BYTES).decode("ascii", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)
    found = _POD_UID.search(text)
    return found[1].replace("_", "-") if found else None


def families(qps: list[Qp], proc: Path = PROC) -> list[MetricFamily]:
    """rdma_qps{hca} (every QP this pid namespace sees) and rdma_pod_qps{hca,uid}."""
    owner = {pid: pod_uid(pid, proc) for pid in {q.pid for q in qps if q.pid is not None}}
    per_pod: Counter[tuple[str, str]] = Counter()
    for qp in qps:
        uid = owner.get(qp.pid) if qp.pid is not None else None
        if uid is not None:
            per_pod[qp.hca, uid] += 1
    held: Counter[str] = Counter()
    for (_, uid), count in per_pod.items():
        held[uid] += count
    # the pods holding the most QPs keep their own series
    named = {uid for uid, _ in sorted(held.items(), key=lambda u: (-u[1], u[0]))[:MAX_PODS]}
    total = MetricFamily(
        "rdma_qps", "Queue pairs on each HCA: pods', the host's and the kernel's", "gauge", ("hca",)
    )
    for hca, count in Counter(q.hca for q in qps).items():
        total.labels(hca).set(count)
    by_pod = MetricFamily(
        POD_QPS,
        f"Queue pairs a pod's processes hold, by HCA and pod UID (kube_pod_info's uid); pods past "
        f'{MAX_PODS} on a node are summed under uid="{OTHER}"',
        "gauge",
        ("hca", "uid"),
    )
    for (hca, uid), count in per_pod.items():
        by_pod.labels(hca, uid if uid in named else OTHER).inc(count)
    return [total, by_pod]


def collect() -> list[MetricFamily]:
    """The families now; a netlink failure leaves them out of this scrape (said at debug: it
    repeats at every scrape)."""
    try:
        qps = queue_pairs()
    except (RestrackError, OSError) as exc:
        logger.debug("pod QPs: %s", exc)
        return []
    return families(qps)
