"""`python -m plugin.diagnose`, as a person runs it in the agent's pod: each HCA, its pools,
what a pod gets, what is wrong and what to do; its exit code says whether anything is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from plugin.core.node.problems import FIXES, HCA_UNHEALTHY
from tests.plugin.sysfs_tree import SysfsTree

REPO = Path(__file__).resolve().parents[3]


def _diagnose(tree: SysfsTree, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "plugin.diagnose", "--sysfs-root", str(tree.sys),
         "--dev-root", str(tree.dev), *flags],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_a_healthy_node_is_said_hca_by_hca_and_exits_0(tree: SysfsTree) -> None:
    done = _diagnose(tree)

    assert done.returncode == 0, done.stdout + done.stderr
    said = done.stdout.splitlines()
    assert "HCA mlx5_0 (15b3:1017, mlx5_core, NUMA 0, pci0000:00): usable" in said
    assert "pool rdma/hca (shared, 1000 IDs): HCAs mlx5_0, mlx5_1 (2 usable)" in said
    assert (
        "  a pod asking for it gets: /dev/infiniband/rdma_cm, /dev/infiniband/uverbs0, "
        "/dev/infiniband/umad0, /dev/infiniband/uverbs1, /dev/infiniband/umad1; "
        "LINGJUN_RDMA_HCAS=mlx5_0,mlx5_1"
    ) in said
    assert said[-1] == "problems: none"


def test_a_port_down_is_said_with_what_to_do_and_exits_1(tree: SysfsTree) -> None:
    tree.set_port("mlx5_1", 1, "DOWN")

    done = _diagnose(tree)

    assert done.returncode == 1
    said = done.stdout.splitlines()
    assert (
        "HCA mlx5_1 (15b3:1017, mlx5_core, NUMA 1, pci0000:00): NOT usable: mlx5_1: no "
        "ACTIVE port (port 1 DOWN)" in said
    )
    assert said[-2:] == [
        f"  {HCA_UNHEALTHY}: rdma/hca: mlx5_1: no ACTIVE port (port 1 DOWN): left out of "
        "allocations",
        f"    what to do: {FIXES[HCA_UNHEALTHY]}",
    ]


def test_a_config_that_cannot_be_read_is_one_line_and_exit_2(
    tree: SysfsTree, tmp_path: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("pools: [{name: hca, mode: sometimes}]\n")

    done = _diagnose(tree, "--config", str(config))

    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith("python -m plugin.diagnose: ")
