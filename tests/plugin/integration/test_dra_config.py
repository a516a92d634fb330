"""What the DRA driver refuses at its start, in one line that quotes no value back: a missing
or bad node name (flag or $NODE_NAME), a driver name or directory a socket path cannot hold,
and pools whose DRA devices cannot be named; devices a pool cannot name on this node are
problems on /metrics, not only warnings."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.plugin.dra_driver import SERVER, Driver, _kubeconfig
from tests.plugin.sysfs_tree import SysfsTree


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ((), "rdma-dra-driver: no node name: pass --node-name, or set $NODE_NAME"),
        (("--node-name", "n1", "--kubeconfig", "/nonexistent"),
         "rdma-dra-driver: --kubeconfig /nonexistent: No such file or directory: name a "
         "kubeconfig file (kubectl config view --minify --raw > FILE writes one)"),
        (("--node-name", "n1", "--kubeconfig", "/dev/zero"),
         "--kubeconfig /dev/zero: a character device, not a regular file: name a kubeconfig"),
        (("--node-name", "S3cret Value"),
         "--node-name text of 12 characters: must be a node's name (a DNS subdomain)"),
        (("--node-name", "n1", "--plugins-dir", "/tmp/" + "d" * 120),
         "over the 105-byte unix limit"),
        (("--node-name", "n1", "--driver-name", "a" * 60 + ".example.com",
          "--plugins-registry-dir", "/var/lib/kubelet/plugins_registry"),
         "-reg.sock would be 115 bytes, over the 105-byte unix limit: name a shorter directory, "
         "or give the driver a shorter name (it is 72 characters)"),
        (("--node-name", "n1", "--driver-name", "Rdma.Example.COM"),
         "--driver-name text of 16 characters: must be a DNS subdomain with a dot (in lower "
         "case: it has capitals)"),
        (("--node-name", "n1", "--driver-name", "gpu.nvidia.com"),
         "--driver-name text of 14 characters: the nvidia.com domain is NVIDIA's"),
    ],
    ids=["no-node", "no-kubeconfig", "kubeconfig-a-device", "bad-node-not-quoted",
         "socket-too-long", "driver-name-too-long-for-the-kubelets-dir", "driver-name-capitals",
         "nvidias-driver-name"],
)  # fmt: skip
def test_what_the_driver_refuses_is_one_line(args: tuple[str, ...], said: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
    done = subprocess.run(
        [sys.executable, "-m", "plugin.dra", "--discovery", "sysfs", *args],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip

    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert said in line
    assert "S3cret" not in done.stderr


def test_a_node_name_from_the_env_is_checked_as_the_flag_is() -> None:
    env = {**os.environ, "NODE_NAME": "S3cret Value\nINJECTED"}
    done = subprocess.run(
        [sys.executable, "-m", "plugin.dra", "--discovery", "sysfs"],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip

    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "rdma-dra-driver: $NODE_NAME text of 21 characters: must be a node's name (a DNS subdomain)"
    ]


@pytest.mark.parametrize(
    ("pools", "said"),
    [("[{name: rdma_hca.v2}, {name: rdma-hca-v2}]",
      "pools[1]: rdma-hca-v2 and rdma_hca.v2 both name their DRA devices rdma-hca-v2-…, which "
      "cannot tell them apart: rename one of them"),
     (f"[{{name: {'h' * 60}, mode: exclusive}}]",
      f"pools[0]: {'h' * 60}: its DRA devices would be named {'h' * 60}-rxe0 and alike, not DNS "
      "labels of at most 63 of a-z, 0-9, '-': a shorter name, of letters or digits")],
    ids=["two-pools-alike", "name-too-long"],
)  # fmt: skip
def test_pools_whose_devices_cannot_be_named_are_refused_at_start(
    tmp_path: Path, pools: str, said: str
) -> None:
    """They were warnings at run time, and a whole pool published nothing while the driver
    said it was healthy."""
    config = tmp_path / "config.yaml"
    config.write_text(f"version: v1\npools: {pools}\n")
    kubeconfig = tmp_path / "kubeconfig"
    cluster = {"server": SERVER, "insecure-skip-tls-verify": True}
    kubeconfig.write_text(json.dumps(_kubeconfig(cluster, {"token": "t"})))
    done = subprocess.run(
        [sys.executable, "-m", "plugin.dra", "--discovery", "sysfs", "--node-name", "n1",
         "--kubeconfig", str(kubeconfig), "--config", str(config)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip

    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"rdma-dra-driver: {said}"]


async def test_devices_a_pool_cannot_name_on_this_node_are_problems_not_only_warnings(
    short_tmp: Path, tree: SysfsTree
) -> None:
    """A 57-character exclusive pool passes the start check (room for rxe0), but mlx5_0's
    device name is 64 characters: nothing was published while the driver reported healthy."""
    name = "rdma-exclusive-hcas-for-distributed-training-jobs-lingjun"
    config = short_tmp / "config.yaml"
    config.write_text(f"version: v1\npools: [{{name: {name}, mode: exclusive}}]\n")
    driver = Driver(short_tmp, tree)
    driver.spec = dataclasses.replace(driver.spec, config=config)
    await driver.start()
    try:
        url = f"http://{driver.spec.metrics_address}/metrics"
        for _ in range(100):
            text = await asyncio.to_thread(lambda: urllib.request.urlopen(url).read().decode())
            if "rdma_plugin_problems 2.0" in text:
                break
            await asyncio.sleep(0.1)
    finally:
        assert await driver.stop() == 0

    assert "rdma_plugin_problems 2.0" in text
    said = driver.log.read_text()
    assert f"ERROR plugin.core.node.health: {name}: device {name}-mlx5-0 is not a DNS label" in said
