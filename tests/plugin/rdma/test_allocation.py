"""The plugin from its CLI with --discovery verbs: registration, IDs, Allocate, and that the
device specs it returns are all a container needs for RDMA."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path

import pytest

from plugin.deviceplugin.api.v1beta1 import api_pb2
from tests.plugin.kubelet_peer import KubeletPeer, Registration
from tests.plugin.plugin_process import PluginProcess
from tests.plugin.rdma.conftest import EXCLUSIVE_RXE, registered
from tests.plugin.rdma.guest import RXE0, RXE1, SYS, gid_index, transfer_command

pytestmark = pytest.mark.rdma


def kernel_chardevs(ibdev: str) -> list[str]:
    """The ibdev's uverbs, umad and issm names as the kernel lists them in sysfs."""
    names: list[str] = []
    for cls, prefixes in (("infiniband_verbs", ("uverbs",)), ("infiniband_mad", ("umad", "issm"))):
        for prefix in prefixes:
            for entry in sorted((SYS / "class" / cls).glob(f"{prefix}*")):
                if (entry / "ibdev").read_text().strip() == ibdev:
                    names.append(entry.name)
    return names


async def allocate(reg: Registration, *ids: str) -> api_pb2.ContainerAllocateResponse:
    response = await reg.stub.Allocate(
        api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=list(ids))]
        ),
        timeout=30,
    )
    (container,) = response.container_responses
    return container


async def in_container(container: api_pb2.ContainerAllocateResponse, *command: str) -> str:
    """Run `command` in a new mount namespace whose /dev/infiniband holds only the allocated
    nodes; its output, prefixed by that directory's listing. Raises when it fails."""
    specs = json.dumps(
        [
            {"container_path": d.container_path, "host_path": d.host_path,
             "permissions": d.permissions}
            for d in container.devices
        ]
    )  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        *("unshare", "--mount", "--propagation", "private"),
        *("python3", "-m", "tests.plugin.rdma.container", specs, "--"),
        *("sh", "-c", 'ls -1 /dev/infiniband && echo --- && exec "$@"', "sh", *command),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    text = out.decode()
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}:\n{text}")
    return text


async def test_registers_lists_ids_and_allocate_returns_the_rxe_device_nodes(
    kubelet: KubeletPeer, plugin: PluginProcess
) -> None:
    reg = await registered(kubelet, plugin)

    devices = kubelet.devices()
    assert reg.request.resource_name == "rdma/hca"
    assert len(devices) == 1000
    assert all(d.health == "Healthy" for d in devices)
    assert all(not d.topology.nodes for d in devices), "rxe has no NUMA node"

    container = await allocate(reg, devices[7].ID)

    expected = ["rdma_cm", *kernel_chardevs("rxe0"), *kernel_chardevs("rxe1")]
    assert [Path(d.container_path).name for d in container.devices] == expected
    for spec in container.devices:
        assert spec.container_path == spec.host_path
        assert spec.host_path.startswith("/dev/infiniband/")
        assert spec.permissions == "rw"
    assert all(stat.S_ISCHR(os.stat(d.host_path).st_mode) for d in container.devices)
    assert container.envs["LINGJUN_RDMA_HCAS"] == "rxe0,rxe1"


async def test_auto_discovery_picks_verbs_where_devices_open(
    kubelet: KubeletPeer, plugin: PluginProcess
) -> None:
    await plugin.start(discovery="auto", rescan_interval=5)

    await kubelet.wait_registrations(1, limit=120)

    assert "discovery: verbs" in plugin.output()


@pytest.mark.parametrize("family", ["ipv4", "ipv6"])
async def test_allocated_nodes_alone_carry_rdma_write_and_send_in_a_mount_namespace(
    kubelet: KubeletPeer, plugin: PluginProcess, family: str
) -> None:
    reg = await registered(kubelet, plugin)
    container = await allocate(reg, kubelet.devices()[0].ID)
    a, b = (gid_index(r.ibdev, r.ipv4_gid if family == "ipv4" else r.ipv6) for r in (RXE0, RXE1))
    assert a is not None
    assert b is not None

    out = await in_container(container, *transfer_command("rxe0", a, "rxe1", b))

    listing, _, result = out.partition("---\n")
    assert sorted(listing.split()) == sorted(Path(d.container_path).name for d in container.devices)
    assert f"ok: RDMA WRITE + SEND of 4096 bytes rxe0[{a}] -> rxe1[{b}]" in result


async def test_a_device_not_allocated_is_out_of_reach_in_the_mount_namespace(
    kubelet: KubeletPeer, plugin: PluginProcess
) -> None:
    reg = await registered(kubelet, plugin, "rdma/rxe", EXCLUSIVE_RXE)
    assert sorted(d.ID for d in kubelet.devices("rdma/rxe")) == ["rxe0", "rxe1"]
    container = await allocate(reg, "rxe0")
    a, b = gid_index("rxe0", RXE0.ipv6), gid_index("rxe1", RXE1.ipv6)
    assert a is not None
    assert b is not None

    with pytest.raises(RuntimeError) as failed:
        await in_container(container, *transfer_command("rxe0", a, "rxe1", b))

    listing = str(failed.value).partition("---\n")[0]
    assert "uverbs" in listing
    assert len([n for n in listing.split() if n.startswith("uverbs")]) == 1, listing
    assert "rxe1" in str(failed.value), "it fails opening rxe1, the device it was not given"


async def test_the_cdi_spec_made_for_rxe_alone_carries_rdma_write_and_send(
    kubelet: KubeletPeer, plugin: PluginProcess, short_tmp: Path
) -> None:
    """The core's CDI writer (the DRA driver's and the device plugin's --cdi-dir): a runtime
    applying the spec's edits gives a process what RDMA needs, and no more."""
    cdi_dir = short_tmp / "cdi"
    reg = await registered(kubelet, plugin, "rdma/rxe", EXCLUSIVE_RXE, cdi_dir=cdi_dir)
    answer = await allocate(reg, "rxe0", "rxe1")
    (cdi_device,) = answer.cdi_devices
    kind, _, name = cdi_device.name.partition("=")
    spec = json.loads((cdi_dir / "lingjun-rdma-rdma_rxe.json").read_text())
    assert spec["kind"] == kind
    (edits,) = [d["containerEdits"] for d in spec["devices"] if d["name"] == name]
    nodes = api_pb2.ContainerAllocateResponse(
        devices=[
            api_pb2.DeviceSpec(
                container_path=n["path"], host_path=n["hostPath"], permissions=n["permissions"]
            )
            for n in edits["deviceNodes"]
        ]
    )
    a, b = gid_index("rxe0", RXE0.ipv6), gid_index("rxe1", RXE1.ipv6)
    assert a is not None
    assert b is not None

    out = await in_container(nodes, *transfer_command("rxe0", a, "rxe1", b))

    listing, _, result = out.partition("---\n")
    assert sorted(listing.split()) == sorted(
        ["rdma_cm", *kernel_chardevs("rxe0"), *kernel_chardevs("rxe1")]
    )
    assert f"ok: RDMA WRITE + SEND of 4096 bytes rxe0[{a}] -> rxe1[{b}]" in result
    assert edits["env"] == ["LINGJUN_RDMA_HCAS=rxe0,rxe1"]
