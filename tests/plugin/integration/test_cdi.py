"""The device plugin's CDI option (--cdi-dir): Allocate answers with a CDI device whose spec it
wrote, over real gRPC to a kubelet-like peer; the names it gave out keep resolving across its
restarts (a runtime resolves them again when it re-creates a container)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import grpc
import pytest

from plugin.core.kube.cdi import SpecFile
from plugin.deviceplugin.api.v1beta1 import api_pb2
from plugin.launch import DRA_DRIVER, cdi_kind
from tests.plugin.kubelet_peer import KubeletPeer, Registration
from tests.plugin.plugin_process import PluginProcess
from tests.plugin.sysfs_tree import SysfsTree

EXCLUSIVE = "pools:\n  - {name: hca, mode: exclusive}\n"


async def _allocate(reg: Registration, *ids: str) -> api_pb2.ContainerAllocateResponse:
    response = await reg.stub.Allocate(
        api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=list(ids))]
        )
    )
    (answer,) = response.container_responses
    return answer


async def test_allocate_answers_with_a_cdi_device_whose_spec_holds_its_nodes(
    kubelet: KubeletPeer, plugin: PluginProcess, tree: SysfsTree, short_tmp: Path
) -> None:
    cdi_dir = short_tmp / "cdi"
    await plugin.start(plugin.write_config(EXCLUSIVE), cdi_dir=cdi_dir)
    reg = await kubelet.wait_registrations(1)

    answer = await _allocate(reg, "mlx5_1")

    kind = cdi_kind(DRA_DRIVER)
    assert [d.name for d in answer.cdi_devices] == [f"{kind}=hca_mlx5_1"]
    assert not answer.devices  # the runtime makes them from the spec
    assert answer.envs["LINGJUN_RDMA_HCAS"] == "mlx5_1"
    spec = json.loads((cdi_dir / "lingjun-rdma-rdma_hca.json").read_text())
    (device,) = spec["devices"]
    assert spec["kind"] == kind
    assert device["name"] == "hca_mlx5_1"
    assert [n["hostPath"] for n in device["containerEdits"]["deviceNodes"]] == [
        str(tree.dev / "infiniband" / n) for n in ("rdma_cm", "uverbs1", "umad1")
    ]


async def test_cdi_devices_given_out_before_a_restart_still_resolve_after_it(
    kubelet: KubeletPeer, plugin: PluginProcess, short_tmp: Path
) -> None:
    cdi_dir = short_tmp / "cdi"
    config = plugin.write_config(EXCLUSIVE)
    await plugin.start(config, cdi_dir=cdi_dir)
    await _allocate(await kubelet.wait_registrations(1), "mlx5_0")
    await plugin.terminate()

    await plugin.start(config, cdi_dir=cdi_dir)
    await _allocate(await kubelet.wait_registrations(2), "mlx5_1")

    spec = json.loads((cdi_dir / "lingjun-rdma-rdma_hca.json").read_text())
    assert sorted(d["name"] for d in spec["devices"]) == ["hca_mlx5_0", "hca_mlx5_1"]


async def test_a_cdi_dir_that_cannot_be_written_refuses_the_allocation_naming_why(
    kubelet: KubeletPeer, plugin: PluginProcess, short_tmp: Path
) -> None:
    blocked = short_tmp / "file"
    blocked.write_text("not a dir\n")
    await plugin.start(plugin.write_config(EXCLUSIVE), cdi_dir=blocked / "cdi")
    reg = await kubelet.wait_registrations(1)

    with pytest.raises(grpc.aio.AioRpcError, match="Not a directory") as refused:
        await _allocate(reg, "mlx5_0")

    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    await plugin.said("Allocate refused:")


SPEC = "lingjun-rdma-rdma_hca.json"


@pytest.mark.parametrize("found", ["other-kind", "fifo", "dev-zero"])
async def test_a_file_at_the_spec_name_that_is_not_ours_is_never_overwritten_nor_waited_on(
    kubelet: KubeletPeer, plugin: PluginProcess, short_tmp: Path, found: str
) -> None:
    cdi_dir = short_tmp / "cdi"
    cdi_dir.mkdir()
    theirs = cdi_dir / SPEC
    if found == "other-kind":
        theirs.write_text('{"cdiVersion": "0.6.0", "kind": "user.io/own", "devices": []}')
    elif found == "fifo":
        os.mkfifo(theirs)
    else:
        theirs.symlink_to("/dev/zero")
    before = theirs.lstat()
    await plugin.start(plugin.write_config(EXCLUSIVE), cdi_dir=cdi_dir)
    reg = await kubelet.wait_registrations(1)  # it serves: nothing blocked its start

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await _allocate(reg, "mlx5_0")

    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"{theirs}: " in str(refused.value.details())
    assert str(refused.value.details()).endswith(": move it away")
    after = theirs.lstat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert f"{theirs}: " in plugin.output()  # said at start too


async def test_a_read_only_cdi_dir_is_said_at_start_and_in_the_refusal(
    kubelet: KubeletPeer, plugin: PluginProcess, read_only_dir: Path
) -> None:
    cdi_dir = read_only_dir
    await plugin.start(plugin.write_config(EXCLUSIVE), cdi_dir=cdi_dir)
    reg = await kubelet.wait_registrations(1)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await _allocate(reg, "mlx5_0")

    said = f"--cdi-dir {cdi_dir} is on a read-only file system"
    assert str(refused.value.details()) == (
        f"--cdi-dir {cdi_dir}: cannot write {SPEC} there: is on a read-only file system"
    )
    assert said in plugin.output()


async def test_a_cdi_dir_that_refuses_files_is_said_at_start(
    kubelet: KubeletPeer, plugin: PluginProcess
) -> None:
    # root may write by its permissions, but /proc takes no new file: said before any Allocate
    await plugin.start(plugin.write_config(EXCLUSIVE), cdi_dir=Path("/proc"))
    await kubelet.wait_registrations(1)

    said = r"--cdi-dir /proc (refuses a new file \(.+\)|is not writable by this process): CDI"
    assert re.search(said + " allocations fail", plugin.output())


async def test_a_cdi_dir_that_cannot_be_made_is_said_at_start(
    kubelet: KubeletPeer, plugin: PluginProcess
) -> None:
    await plugin.start(plugin.write_config(EXCLUSIVE), cdi_dir=Path("/proc/no-cdi-here"))
    await kubelet.wait_registrations(1)

    assert re.search(
        r"--cdi-dir /proc/no-cdi-here cannot be made \(.+\): CDI allocations fail", plugin.output()
    )


async def test_a_cdi_dir_that_is_a_symlink_loop_is_said_as_one(
    kubelet: KubeletPeer, plugin: PluginProcess, short_tmp: Path
) -> None:
    """mkdir said "File exists", and the spec file in it was "to move away"."""
    (short_tmp / "a").symlink_to(short_tmp / "b")
    (short_tmp / "b").symlink_to(short_tmp / "a")
    await plugin.start(plugin.write_config(EXCLUSIVE), cdi_dir=short_tmp / "a")
    await kubelet.wait_registrations(1)

    errors = [ln for ln in plugin.output().splitlines() if " ERROR plugin.core.kube.cdi: " in ln]
    assert [ln.split(" ERROR plugin.core.kube.cdi: ")[1] for ln in errors] == [
        f"--cdi-dir {short_tmp / 'a'} is a symbolic link to nothing (or a loop): name a "
        "directory: CDI allocations fail"
    ]


async def test_a_device_in_its_spec_file_that_it_never_writes_is_dropped_and_said(
    kubelet: KubeletPeer, plugin: PluginProcess, tree: SysfsTree, short_tmp: Path
) -> None:
    cdi_dir = short_tmp / "cdi"
    await plugin.start(plugin.write_config(EXCLUSIVE), cdi_dir=cdi_dir)
    await _allocate(await kubelet.wait_registrations(1), "mlx5_0")
    await plugin.terminate()
    path = cdi_dir / SPEC
    spec = json.loads(path.read_text())
    (ours,) = spec["devices"]
    forged = {"name": "hca_mlx5_9", "containerEdits": {
        "deviceNodes": ours["containerEdits"]["deviceNodes"], "env": ["LD_PRELOAD=/x.so"],
        "mounts": [{"hostPath": "/", "containerPath": "/host"}]}}  # fmt: skip
    path.write_text(json.dumps({**spec, "devices": [ours, forged]}))

    await plugin.start(plugin.write_config(EXCLUSIVE), cdi_dir=cdi_dir)
    registered = await kubelet.wait_registrations(2)
    at_start = json.loads(path.read_text())  # removed at once, not at the next allocation
    await _allocate(registered, "mlx5_1")

    rewritten = json.loads(path.read_text())
    assert at_start["devices"] == [ours]
    assert [d["name"] for d in rewritten["devices"]] == ["hca_mlx5_0", "hca_mlx5_1"]
    assert rewritten["devices"][0] == ours  # what it wrote itself stays: it may be in use
    assert f"{path}: devices not as this plugin writes them, removed from it: 'hca_mlx5_9'" in (
        plugin.output()
    )


def test_temp_files_a_killed_write_left_of_its_spec_are_removed_and_only_those(
    tmp_path: Path,
) -> None:
    name = "rdma.lingjun-rdma.io-rdma-hca.json"
    (tmp_path / f".{name}.tmp-k2j4h6g8").write_text('{"cdiVer')  # ours, cut short by a kill
    (tmp_path / ".nvidia.com-gpu.json.tmp-a1b2c3d4").write_text("{")  # another writer's
    (tmp_path / f".{name}.notes").write_text("x")

    SpecFile(tmp_path, name, cdi_kind(DRA_DRIVER), tmp_path / "dev")

    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".nvidia.com-gpu.json.tmp-a1b2c3d4",
        f".{name}.notes",
    ]
