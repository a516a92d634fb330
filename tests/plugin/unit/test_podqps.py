"""QPs per pod from restrack's QPs and a /proc tree whose cgroup files are as the kubelet's two
cgroup drivers name a pod's (real QPs: tests/plugin/rdma/test_podqps.py)."""

from __future__ import annotations

import uuid
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from plugin.core.metrics.podqps import MAX_PODS, OTHER, POD_QPS, families, pod_uid
from plugin.core.metrics.restrack import Qp

SYSTEMD = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{c}.scope\n"  # noqa: E501
CGROUPFS = "0::/kubepods/besteffort/pod{u}/{c}\n"


def _proc(root: Path, pid: int, cgroup: str) -> None:
    (root / str(pid)).mkdir(parents=True)
    (root / str(pid) / "cgroup").write_text(cgroup)


def _samples(root: Path, qps: list[Qp]) -> dict[str, dict[tuple[str, ...], float]]:
    text = "".join(f.render() for f in families(qps, root))
    return {
        f.name: {tuple(v for _, v in sorted(s.labels.items())): s.value for s in f.samples}
        for f in text_string_to_metric_families(text)
    }


def test_the_pod_uid_is_read_from_either_cgroup_drivers_path(tmp_path: Path) -> None:
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    _proc(tmp_path, 10, SYSTEMD.format(u=a.replace("-", "_"), c="ab" * 32))
    _proc(tmp_path, 11, CGROUPFS.format(u=b, c="cd" * 32))
    _proc(tmp_path, 12, "0::/system.slice/sshd.service\n")

    assert [pod_uid(pid, tmp_path) for pid in (10, 11, 12, 13)] == [a, b, None, None]


def test_qps_are_counted_per_hca_and_pod_and_the_host_and_kernel_only_in_the_total(
    tmp_path: Path,
) -> None:
    uid = str(uuid.uuid4())
    _proc(tmp_path, 10, CGROUPFS.format(u=uid, c="c"))
    _proc(tmp_path, 20, "0::/user.slice\n")
    qps = [
        Qp("mlx5_0", 1, 100, 10),
        Qp("mlx5_0", 1, 101, 10),
        Qp("mlx5_1", None, 102, 10),
        Qp("mlx5_0", 1, 103, 20),  # a host process
        Qp("mlx5_0", 1, 1, None),  # the kernel's
        Qp("mlx5_1", 1, 104, 30),  # its process is gone
    ]

    got = _samples(tmp_path, qps)

    assert got[POD_QPS] == {("mlx5_0", uid): 2.0, ("mlx5_1", uid): 1.0}
    assert got["rdma_qps"] == {("mlx5_0",): 4.0, ("mlx5_1",): 2.0}


def test_pods_past_the_bound_are_summed_under_other_the_biggest_kept(tmp_path: Path) -> None:
    qps: list[Qp] = []
    uids: list[str] = []
    for i in range(MAX_PODS + 2):
        uid = str(uuid.UUID(int=i + 1))
        uids.append(uid)
        _proc(tmp_path, 1000 + i, CGROUPFS.format(u=uid, c="c"))
        qps += [Qp("mlx5_0", 1, 10 * i + n, 1000 + i) for n in range(2 if i < MAX_PODS else 1)]

    got = _samples(tmp_path, qps)[POD_QPS]

    assert len(got) == MAX_PODS + 1
    assert got[("mlx5_0", OTHER)] == 2.0  # the two smallest, one QP each
    assert got[("mlx5_0", uids[0])] == 2.0
