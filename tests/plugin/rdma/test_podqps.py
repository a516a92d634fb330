"""QPs per pod on real verbs: processes holding RC QPs on rxe, one in a cgroup shaped as the
kubelet makes a pod's (systemd driver), one outside any pod. The plugin's restrack reader
agrees with iproute2's `rdma res show qp` (the real peer), and its /metrics gives the pod's QPs
to the pod's UID, the host's to no pod, and drops them when the process ends."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from plugin.core.metrics.podqps import POD_QPS, families
from plugin.core.metrics.restrack import queue_pairs
from tests.plugin.kubelet_peer import KubeletPeer
from tests.plugin.plugin_process import PluginProcess
from tests.plugin.rdma.conftest import FIGURES, registered
from tests.plugin.rdma.guest import RXE0, run

pytestmark = pytest.mark.rdma

CGROUP_ROOT = Path("/sys/fs/cgroup")


@pytest.fixture(scope="module")
def cgroup2() -> Path:
    if not (CGROUP_ROOT / "cgroup.procs").exists():  # the VM's init mounts none
        run("mount", "-t", "cgroup2", "none", str(CGROUP_ROOT))
    return CGROUP_ROOT


@pytest.fixture
def pod_cgroup(cgroup2: Path) -> Iterator[tuple[str, Path]]:
    """A pod's container cgroup as the kubelet's systemd driver names it, and the pod's UID."""
    uid = str(uuid.uuid4())
    pod = (
        cgroup2 / "kubepods.slice" / "kubepods-besteffort.slice"
        / f"kubepods-besteffort-pod{uid.replace('-', '_')}.slice"
    )  # fmt: skip
    container = pod / f"cri-containerd-{uuid.uuid4().hex * 2}.scope"
    container.mkdir(parents=True)
    yield uid, container
    for path in (container, pod):
        path.rmdir()


class Holder:
    def __init__(self, count: int, cgroup: Path | None = None) -> None:
        argv = [sys.executable, "-m", "tests.plugin.rdma.qp_holder", RXE0.ibdev, str(count)]
        self.proc = subprocess.Popen(
            [*argv, *([str(cgroup)] if cgroup else [])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        assert line[:1] == ["ready"], f"qp_holder: {line}"
        self.qpns = {int(n) for n in line[1:]}

    def close(self) -> None:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.close()
        self.proc.wait(30)
        self.proc.stdout.close()


@pytest.fixture
def holders(pod_cgroup: tuple[str, Path]) -> Iterator[tuple[Holder, Holder]]:
    in_pod, on_host = Holder(3, pod_cgroup[1]), Holder(2)
    yield in_pod, on_host
    for h in (in_pod, on_host):
        if h.proc.poll() is None:
            h.close()


def test_restrack_agrees_with_iproute2_on_every_qp_and_its_pid(
    holders: tuple[Holder, Holder],
) -> None:
    ours = {(q.hca, q.qpn, q.pid) for q in queue_pairs()}
    theirs = {
        (q["ifname"], q["lqpn"], q.get("pid"))
        for q in json.loads(run("rdma", "-j", "res", "show", "qp").stdout)
    }

    assert ours == theirs
    for holder in holders:
        assert {(RXE0.ibdev, n, holder.proc.pid) for n in holder.qpns} <= ours


def _pod_qps(text: str) -> dict[tuple[str, str], float]:
    return {
        (s.labels["hca"], s.labels["uid"]): s.value
        for f in text_string_to_metric_families(text)
        if f.name == POD_QPS
        for s in f.samples
    }


async def test_metrics_give_a_pods_qps_to_its_uid_and_none_to_the_host(
    kubelet: KubeletPeer,
    plugin: PluginProcess,
    pod_cgroup: tuple[str, Path],
    holders: tuple[Holder, Holder],
) -> None:
    uid = pod_cgroup[0]
    await registered(kubelet, plugin, pod_qps="on")
    url = f"http://127.0.0.1:{plugin.metrics_port}/metrics"

    def scrape() -> str:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.read().decode()

    text = await asyncio.to_thread(scrape)
    assert _pod_qps(text) == {(RXE0.ibdev, uid): 3.0}
    total = {s.labels["hca"]: s.value for f in text_string_to_metric_families(text)
             if f.name == "rdma_qps" for s in f.samples}  # fmt: skip
    assert total[RXE0.ibdev] >= 5  # the pod's 3, the host process's 2 (and the kernel's)
    assert "not in the host's pid namespace" not in plugin.output()

    holders[0].close()
    assert _pod_qps(await asyncio.to_thread(scrape)) == {}


def test_200_qps_of_one_pod_are_counted_and_the_figure_printed(
    pod_cgroup: tuple[str, Path],
) -> None:
    uid, cgroup = pod_cgroup
    holder = Holder(200, cgroup)
    try:
        t0 = time.perf_counter()
        got = families(queue_pairs())
        took = time.perf_counter() - t0
    finally:
        holder.close()

    assert _pod_qps("".join(f.render() for f in got)) == {(RXE0.ibdev, uid): 200.0}
    FIGURES.append(f"pod QPs: restrack dump and cgroup lookups, 200 QPs: {took * 1e3:.1f} ms")
