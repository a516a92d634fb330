"""Exclusive pools, NUMA, hot-plug, config errors and the nonHostNetwork check, from the CLI."""

from __future__ import annotations

import asyncio
import socket
import urllib.request
from pathlib import Path

import grpc
import pytest

from plugin.deviceplugin.api.v1beta1 import api_pb2
from tests.plugin.kubelet_peer import KubeletPeer
from tests.plugin.plugin_process import PluginProcess
from tests.plugin.sysfs_tree import PortSpec, SysfsTree

EXCLUSIVE = """
version: v1
pools:
  - name: hca
    mode: exclusive
    selector: {vendors: ["15b3"], linkLayers: [Ethernet]}
"""


async def test_exclusive_pool_has_one_id_per_hca_with_its_numa_node(
    kubelet: KubeletPeer, plugin: PluginProcess
) -> None:
    await plugin.start(plugin.write_config(EXCLUSIVE))
    await kubelet.wait_registrations(1)

    topo = {d.ID: [n.ID for n in d.topology.nodes] for d in kubelet.devices()}
    assert topo == {"mlx5_0": [0], "mlx5_1": [1]}


async def test_exclusive_port_down_marks_only_that_hca(
    kubelet: KubeletPeer, plugin: PluginProcess, tree: SysfsTree
) -> None:
    await plugin.start(plugin.write_config(EXCLUSIVE))
    await kubelet.wait_registrations(1)

    tree.set_port("mlx5_0", 1, "DOWN")

    await kubelet.wait_for(
        lambda: (
            {d.ID: d.health for d in kubelet.devices()}
            == {"mlx5_0": "Unhealthy", "mlx5_1": "Healthy"}
        )
    )


async def test_preferred_allocation_packs_on_the_numa_node_of_must_include(
    kubelet: KubeletPeer, plugin: PluginProcess, tree: SysfsTree
) -> None:
    for i, numa in ((2, 0), (3, 1)):
        tree.add_pci_hca(
            f"mlx5_{i}",
            pci=f"0000:{0x10 + i:02x}:00.0",
            numa=numa,
            ports=[PortSpec(netdev=f"eth{i}")],
        )
    await plugin.start(plugin.write_config(EXCLUSIVE))
    reg = await kubelet.wait_registrations(1)
    ids = [d.ID for d in kubelet.devices()]

    response = await reg.stub.GetPreferredAllocation(
        api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=ids, must_include_deviceIDs=["mlx5_1"], allocation_size=2
                )
            ]
        )
    )

    assert list(response.container_responses[0].deviceIDs) == ["mlx5_1", "mlx5_3"]


async def test_registers_with_zero_devices_and_picks_up_a_hotplugged_hca(
    kubelet: KubeletPeer, plugin: PluginProcess, tree: SysfsTree
) -> None:
    for name in ("mlx5_0", "mlx5_1"):  # driver not loaded yet: no ibdevs at all
        (tree.sys / "class" / "infiniband" / name).unlink()
    await plugin.start()
    reg = await kubelet.wait_registrations(1)
    assert kubelet.devices() == []

    tree.add_pci_hca("mlx5_4", pci="0000:20:00.0", numa=0, ports=[PortSpec(netdev="eth4")])

    await kubelet.wait_for(lambda: len(kubelet.devices()) == 1000)
    assert kubelet.current() is reg, "a device change is pushed on the open stream"


async def test_missing_uverbs_node_makes_the_hca_unhealthy(
    kubelet: KubeletPeer, plugin: PluginProcess, tree: SysfsTree
) -> None:
    await plugin.start(plugin.write_config(EXCLUSIVE))
    await kubelet.wait_registrations(1)

    tree.remove_device_node("uverbs1")

    await kubelet.wait_for(
        lambda: (
            {d.ID: d.health for d in kubelet.devices()}
            == {"mlx5_0": "Healthy", "mlx5_1": "Unhealthy"}
        )
    )


async def test_bad_config_exits_2_naming_the_field(plugin: PluginProcess) -> None:
    config = plugin.write_config("version: v1\npools:\n  - name: hca\n    maxAllocation: 10\n")
    await plugin.start(config)

    assert await plugin.wait() == 2
    assert "pools[0].maxAllocation: unknown key" in plugin.output()


async def test_non_host_network_without_ipv6_gids_is_reported_loudly(
    kubelet: KubeletPeer, plugin: PluginProcess
) -> None:
    await plugin.start(plugin.write_config("nonHostNetwork: true\n"))
    await kubelet.wait_registrations(1)
    await asyncio.sleep(0.3)

    log = plugin.output()
    assert "ERROR" in log
    assert "nonHostNetwork: true but mlx5_0 port 1 (eth0): no RoCE v2 GID for a global IPv6" in log


async def test_auto_discovery_falls_back_to_sysfs_without_usable_verbs(
    kubelet: KubeletPeer, plugin: PluginProcess
) -> None:
    await plugin.start(discovery="auto")  # this host has no RDMA device to open

    await kubelet.wait_registrations(1)

    log = plugin.output()
    assert "libibverbs finds no RDMA devices" in log, "auto asked verbs first"
    assert "discovery: sysfs" in log
    assert len(kubelet.devices()) == 1000


async def test_metrics_port_in_use_exits_2_naming_the_flag(plugin: PluginProcess) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", plugin.metrics_port))
        busy.listen()
        await plugin.start()

        assert await plugin.wait() == 2
    said = plugin.output()
    assert f"--metrics-address: port {plugin.metrics_port} is in use" in said
    assert "pick a free port" in said


async def test_one_hcas_garbled_port_file_makes_only_it_unhealthy_while_running(
    kubelet: KubeletPeer, plugin: PluginProcess, tree: SysfsTree
) -> None:
    await plugin.start(plugin.write_config(EXCLUSIVE))
    await kubelet.wait_registrations(1)

    (tree.port_dir("mlx5_1") / "state").write_bytes(b"4: \xff\xfe\n")
    await kubelet.wait_for(
        lambda: (
            {d.ID: d.health for d in kubelet.devices()}
            == {"mlx5_0": "Healthy", "mlx5_1": "Unhealthy"}
        )
    )
    # the other HCA keeps being tracked: its port going down still reaches the kubelet
    tree.set_port("mlx5_0", 1, "DOWN")
    await kubelet.wait_for(lambda: {d.health for d in kubelet.devices()} == {"Unhealthy"})
    assert "port 1 UNREADABLE" in plugin.output()


async def test_a_shared_id_leaves_out_an_hca_whose_port_cannot_be_read_and_says_so(
    kubelet: KubeletPeer, plugin: PluginProcess, tree: SysfsTree
) -> None:
    await plugin.start()
    reg = await kubelet.wait_registrations(1)
    (tree.port_dir("mlx5_1") / "state").write_bytes(b"4: \xff\xfe\n")
    await plugin.said("rdma/hca: mlx5_1: no ACTIVE port (port 1 UNREADABLE): left out of")

    response = await reg.stub.Allocate(
        api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["hca-7"])]
        )
    )

    (answer,) = response.container_responses
    assert answer.envs["LINGJUN_RDMA_HCAS"] == "mlx5_0"
    assert not [d for d in answer.devices if d.host_path.endswith(("uverbs1", "umad1"))]
    assert f"{tree.port_dir('mlx5_1')}: state empty or not readable as text" in plugin.output()
    assert "\nrdma_plugin_problems 2.0\n" in await _metrics(plugin.metrics_port)


async def _metrics(port: int) -> str:
    def get() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return r.read().decode()

    return await asyncio.to_thread(get)


async def test_a_pool_whose_selector_matches_nothing_is_an_error_and_a_metric(
    kubelet: KubeletPeer, plugin: PluginProcess
) -> None:
    config = "pools:\n  - name: hca\n    selector: {ibdevs: ['cx7_*']}\n"
    await plugin.start(plugin.write_config(config))
    await kubelet.wait_registrations(1)

    assert kubelet.devices() == []
    assert (
        "ERROR plugin.core.node.health: rdma/hca: its selector matches none of this node's HCAs "
        "(mlx5_0, mlx5_1)" in plugin.output()
    )
    assert "\nrdma_plugin_problems 1.0\n" in await _metrics(plugin.metrics_port)


async def test_no_rdma_device_on_the_node_is_an_error_and_a_metric(
    kubelet: KubeletPeer, short_tmp: Path, plugin_dir: Path
) -> None:
    empty = SysfsTree(short_tmp / "bare")  # class/infiniband exists, with nothing in it
    bare = PluginProcess(short_tmp, plugin_dir, sysfs=empty.sys, dev=empty.dev)
    await bare.start()
    try:
        await kubelet.wait_registrations(1)

        assert "rdma/hca: no RDMA device on this node" in bare.output()
        assert "\nrdma_plugin_problems 1.0\n" in await _metrics(bare.metrics_port)
    finally:
        await bare.terminate()


async def test_a_config_changed_on_disk_is_reported_as_needing_a_restart(
    kubelet: KubeletPeer, plugin: PluginProcess
) -> None:
    config = plugin.write_config("pools:\n  - name: hca\n    maxAllocations: 10\n")
    await plugin.start(config)
    await kubelet.wait_registrations(1)

    config.write_text("pools:\n  - name: hca\n    maxAllocations: 20\n")
    wanted = f"config {config} changed on disk: restart the plugin to apply it"
    for _ in range(100):
        if wanted in plugin.output():
            break
        await asyncio.sleep(0.1)

    assert wanted in plugin.output()
    assert len(kubelet.devices()) == 10  # still the config it started with


async def test_a_config_that_expands_without_bound_on_disk_never_stalls_the_plugin(
    kubelet: KubeletPeer, plugin: PluginProcess
) -> None:
    config = plugin.write_config("pools:\n  - name: hca\n")
    await plugin.start(config)
    await kubelet.wait_registrations(1)
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"] + [
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)
    ]
    config.write_text("\n".join(levels) + "\nversion: *a8\n")  # 10^9 values in ~500 bytes

    await plugin.said("config on disk changed and is invalid", limit=15)

    assert "aliases expand to" in plugin.output()
    assert "rdma_plugin_devices" in await _metrics(plugin.metrics_port)
    assert await plugin.terminate() == 0


async def _raw_http(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), 10)
    except ConnectionResetError:
        return b""
    finally:
        writer.close()


async def test_the_metrics_server_drops_bad_requests_quietly_and_keeps_serving(
    kubelet: KubeletPeer, plugin: PluginProcess
) -> None:
    await plugin.start()
    await kubelet.wait_registrations(1)

    huge = await _raw_http(plugin.metrics_port, b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 200_000)
    not_utf8 = await _raw_http(plugin.metrics_port, b"GET /\xff\xfe HTTP/1.1\r\n\r\n")

    assert huge == b""
    assert not_utf8.startswith(b"HTTP/1.1 404")
    assert "rdma_plugin_devices" in await _metrics(plugin.metrics_port)
    assert "Traceback" not in plugin.output()
    assert "exception was never retrieved" not in plugin.output()


@pytest.mark.parametrize(
    ("containers", "said"),
    [([["hca-1", "hca-2", "hca-1"]],
      "rdma/hca: device ID 'hca-1' is given twice: the kubelet sends each at most once; its "
      "state is stale, retry the pod"),
     ([], "rdma/hca: a request with no container: nothing to allocate (the kubelet sends one "
          "per container that asks for this resource)")],
    ids=["an-id-twice", "no-container"],  # no container: answered with nothing, said nothing
)  # fmt: skip
async def test_allocate_refuses_a_request_the_kubelet_never_sends(
    kubelet: KubeletPeer, plugin: PluginProcess, containers: list[list[str]], said: str
) -> None:
    await plugin.start()
    reg = await kubelet.wait_registrations(1)
    requests = [api_pb2.ContainerAllocateRequest(devices_ids=ids) for ids in containers]

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await reg.stub.Allocate(api_pb2.AllocateRequest(container_requests=requests))

    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.details() == said


async def test_a_pool_left_empty_by_an_exclusive_pool_before_it_says_so(
    kubelet: KubeletPeer, plugin: PluginProcess
) -> None:
    config = (
        "pools:\n"
        "  - {name: whole, mode: exclusive, selector: {vendors: ['15b3']}}\n"
        "  - {name: hca, selector: {vendors: ['15b3']}}\n"
    )
    await plugin.start(plugin.write_config(config))
    await kubelet.wait_registrations(1, "rdma/whole")
    await kubelet.wait_registrations(1)

    assert kubelet.devices() == []
    assert (
        "rdma/hca: every HCA it selects (mlx5_0, mlx5_1) goes to an exclusive pool listed before "
        "it: 0 devices; make the selectors disjoint" in plugin.output()
    )


async def test_a_node_without_rdma_cm_is_a_problem_and_still_serves_verbs(
    kubelet: KubeletPeer, short_tmp: Path, plugin_dir: Path
) -> None:
    tree = SysfsTree(short_tmp / "nocm")  # HCAs, but rdma_ucm not loaded
    tree.add_pci_hca("mlx5_0", pci="0000:3b:00.0")
    node = PluginProcess(short_tmp, plugin_dir, sysfs=tree.sys, dev=tree.dev)
    await node.start()
    try:
        reg = await kubelet.wait_registrations(1)
        (device, *_) = kubelet.devices()
        response = await reg.stub.Allocate(
            api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[device.ID])]
            )
        )

        (answer,) = response.container_responses
        assert Path(answer.devices[0].host_path).name == "uverbs0"
        assert "no rdma_cm device node (is rdma_ucm loaded?)" in node.output()
        assert "\nrdma_plugin_problems 1.0\n" in await _metrics(node.metrics_port)
    finally:
        await node.terminate()


async def test_a_pool_over_the_kubelets_message_limit_advertises_what_fits_and_says_so(
    kubelet: KubeletPeer, plugin: PluginProcess
) -> None:
    """The peer reads a message of at most 4 MiB, as the kubelet's grpc-go client does: the
    whole list of 100000 IDs of 63 characters ended each stream it opened, Register after
    Register, and nothing was ever advertised."""
    pool = "s" * 57
    config = f"pools:\n  - {{name: {pool}, maxAllocations: 100000}}\n"
    await plugin.start(plugin.write_config(config))
    await kubelet.wait_registrations(1, resource=f"rdma/{pool}", limit=60)
    await asyncio.sleep(2)  # a stream ended would be registered again by now

    devices = kubelet.devices(f"rdma/{pool}")
    assert len(kubelet.registrations) == 1
    assert 0 < len(devices) < 100_000
    assert (
        f"ERROR plugin.deviceplugin.servicer: rdma/{pool}: only {len(devices)} of the pool's "
        "100000 IDs are advertised: the kubelet takes a device list of at most 4 MiB; lower "
        f"maxAllocations to {len(devices)} or less (or shorten the pool's name)"
    ) in plugin.output()
