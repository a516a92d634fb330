"""The plugin from its CLI against a kubelet-like peer over real unix sockets."""

from __future__ import annotations

import asyncio
import random
import signal
import urllib.request
from pathlib import Path

import grpc
import pytest

from plugin.deviceplugin.api.v1beta1 import api_pb2
from tests.plugin.kubelet_peer import KubeletPeer
from tests.plugin.plugin_process import PluginProcess
from tests.plugin.sysfs_tree import SysfsTree

SOCKET = "lingjun-rdma-rdma_hca.sock"


async def assert_settles_at(kubelet: KubeletPeer, count: int) -> None:
    """Re-registration happens once, not in a loop (each one replaces the previous stream)."""
    await asyncio.sleep(1.0)
    assert len(kubelet.registrations) == count


async def test_registers_1000_healthy_ids_with_numa_topology(
    kubelet: KubeletPeer, plugin: PluginProcess
) -> None:
    await plugin.start()
    reg = await kubelet.wait_registrations(1)

    assert reg.request.version == "v1beta1"
    assert reg.request.resource_name == "rdma/hca"
    assert reg.request.endpoint == SOCKET
    assert reg.options.get_preferred_allocation_available
    devices = kubelet.devices()
    assert len(devices) == 1000
    assert len({d.ID for d in devices}) == 1000
    assert all(d.health == "Healthy" for d in devices)
    assert {tuple(n.ID for n in d.topology.nodes) for d in devices} == {(0, 1)}


async def test_allocate_returns_every_hca_char_device(
    kubelet: KubeletPeer, plugin: PluginProcess, tree: SysfsTree
) -> None:
    await plugin.start()
    reg = await kubelet.wait_registrations(1)

    response = await reg.stub.Allocate(
        api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["hca-7"])]
        )
    )

    (container,) = response.container_responses
    dev = tree.dev / "infiniband"
    assert [(s.container_path, s.host_path, s.permissions) for s in container.devices] == [
        (f"/dev/infiniband/{n}", str(dev / n), "rw")
        for n in ("rdma_cm", "uverbs0", "umad0", "uverbs1", "umad1")
    ]
    assert container.envs["LINGJUN_RDMA_HCAS"] == "mlx5_0,mlx5_1"


async def test_unknown_id_gets_an_error_naming_it(
    kubelet: KubeletPeer, plugin: PluginProcess
) -> None:
    await plugin.start()
    reg = await kubelet.wait_registrations(1)

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await reg.stub.Allocate(
            api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["hca-5000"])]
            )
        )

    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "'hca-5000' is unknown" in (err.value.details() or "")


async def test_port_down_makes_ids_unhealthy_and_up_heals_them(
    kubelet: KubeletPeer, plugin: PluginProcess, tree: SysfsTree
) -> None:
    await plugin.start()
    await kubelet.wait_registrations(1)

    tree.set_port("mlx5_0", 1, "DOWN")
    await asyncio.sleep(0.5)
    assert all(d.health == "Healthy" for d in kubelet.devices()), "one HCA still up"
    tree.set_port("mlx5_1", 1, "DOWN")
    await kubelet.wait_for(lambda: all(d.health == "Unhealthy" for d in kubelet.devices()))
    tree.set_port("mlx5_1", 1, "ACTIVE")
    await kubelet.wait_for(lambda: all(d.health == "Healthy" for d in kubelet.devices()))

    assert len(kubelet.devices()) == 1000


async def test_unhealthy_id_is_refused_with_the_reason(
    kubelet: KubeletPeer, plugin: PluginProcess, tree: SysfsTree
) -> None:
    await plugin.start()
    reg = await kubelet.wait_registrations(1)
    for hca in ("mlx5_0", "mlx5_1"):
        tree.set_port(hca, 1, "DOWN")
    await kubelet.wait_for(lambda: all(d.health == "Unhealthy" for d in kubelet.devices()))

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await reg.stub.Allocate(
            api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["hca-1"])]
            )
        )

    assert "'hca-1' is unhealthy: mlx5_0: no ACTIVE port (port 1 DOWN)" in (
        err.value.details() or ""
    )


async def test_reregisters_after_kubelet_restart(
    kubelet: KubeletPeer, plugin: PluginProcess, plugin_dir: Path
) -> None:
    await plugin.start()
    await kubelet.wait_registrations(1)

    await kubelet.restart()

    reg = await kubelet.wait_registrations(2)
    assert (plugin_dir / SOCKET).is_socket()
    assert len(reg.updates[-1][1]) == 1000
    await assert_settles_at(kubelet, 2)


async def test_restarts_at_any_moment_each_get_exactly_one_register(
    kubelet: KubeletPeer, plugin: PluginProcess
) -> None:
    """A restart that lands between our look at our socket and our Register's connect would
    draw a second Register, sent to the new kubelet after it deleted our socket. Restarts at
    random moments hit that window in ~5% of restarts on a registrar that does not look again
    once connected (measured: 1-2 in 20); 100 of them nearly always do."""
    arrived: list[str] = []
    kubelet.on_register = lambda request: arrived.append(request.endpoint)
    await plugin.start()
    await kubelet.wait_registrations(1)
    rng = random.Random(13)

    for restart in range(1, 101):
        await asyncio.sleep(rng.uniform(0, 0.05))
        await kubelet.restart()
        await kubelet.wait_registrations(restart + 1)

    await assert_settles_at(kubelet, 101)
    assert len(arrived) == 101, f"{len(arrived) - 101} restarts drew a second Register"


async def test_reregisters_after_its_socket_is_deleted(
    kubelet: KubeletPeer, plugin: PluginProcess, plugin_dir: Path
) -> None:
    await plugin.start()
    await kubelet.wait_registrations(1)

    (plugin_dir / SOCKET).unlink()

    await kubelet.wait_registrations(2)
    assert (plugin_dir / SOCKET).is_socket()
    await assert_settles_at(kubelet, 2)


async def test_reregisters_when_the_kubelet_ends_the_stream(
    kubelet: KubeletPeer, plugin: PluginProcess
) -> None:
    await plugin.start()
    first = await kubelet.wait_registrations(1)

    assert first.stream is not None
    first.stream.cancel()

    await kubelet.wait_registrations(2)
    await assert_settles_at(kubelet, 2)


async def test_waits_for_a_kubelet_that_is_not_there_yet(
    plugin_dir: Path, plugin: PluginProcess
) -> None:
    await plugin.start()
    await asyncio.sleep(1.0)
    assert plugin.proc is not None
    assert plugin.proc.returncode is None, "must not crash without a kubelet"

    peer = KubeletPeer(plugin_dir)
    await peer.start()
    try:
        reg = await peer.wait_registrations(1)
        assert len(reg.updates[-1][1]) == 1000
    finally:
        await peer.stop()


async def test_sigterm_removes_its_socket_and_exits_zero(
    kubelet: KubeletPeer, plugin: PluginProcess, plugin_dir: Path
) -> None:
    await plugin.start()
    await kubelet.wait_registrations(1)

    code = await plugin.terminate(signal.SIGTERM)

    assert code == 0
    assert not (plugin_dir / SOCKET).exists()
    assert (plugin_dir / "kubelet.sock").exists(), "only its own socket is removed"


@pytest.mark.parametrize(
    "sig",
    [signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGPWR,
     signal.SIGALRM, signal.SIGVTALRM, signal.SIGXCPU],
)  # fmt: skip
async def test_other_stop_signals_stop_it_like_sigterm(
    kubelet: KubeletPeer, plugin: PluginProcess, plugin_dir: Path, sig: int
) -> None:
    await plugin.start()
    await kubelet.wait_registrations(1)

    code = await plugin.terminate(sig)

    assert code == 0
    assert not (plugin_dir / SOCKET).exists()


async def test_a_burst_of_stop_signals_is_one_clean_stop(
    kubelet: KubeletPeer, plugin: PluginProcess, plugin_dir: Path
) -> None:
    """A second SIGTERM in a clean stop's last milliseconds killed it (-15) once Python's
    finalization had given the signal its default back."""
    codes = []
    for registered in range(1, 6):
        await plugin.start()
        await kubelet.wait_registrations(registered)
        assert plugin.proc is not None
        plugin.proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.01)
        plugin.proc.send_signal(signal.SIGTERM)
        plugin.proc.send_signal(signal.SIGINT)
        codes.append(await plugin.wait())

    assert codes == [0] * 5
    assert not (plugin_dir / SOCKET).exists()


async def test_serves_healthz_and_metrics(kubelet: KubeletPeer, plugin: PluginProcess) -> None:
    await plugin.start()
    await kubelet.wait_registrations(1)
    base = f"http://127.0.0.1:{plugin.metrics_port}"

    def get(path: str) -> tuple[int, str]:
        with urllib.request.urlopen(base + path, timeout=5) as r:
            return r.status, r.read().decode()

    status, body = await asyncio.to_thread(get, "/healthz")
    assert (status, body) == (200, "ok\n")
    _, metrics = await asyncio.to_thread(get, "/metrics")
    assert 'rdma_plugin_devices{health="Healthy",resource="rdma/hca"} 1000.0' in metrics
    assert 'rdma_plugin_registrations_total{resource="rdma/hca",result="ok"} 1.0' in metrics
    assert 'rdma_plugin_registered{resource="rdma/hca"} 1.0' in metrics
    assert 'rdma_plugin_hca_healthy{hca="mlx5_1",resource="rdma/hca"} 1.0' in metrics

    await kubelet.stop()  # its socket gone: the registration it held is gone with it
    _, metrics = await asyncio.to_thread(get, "/metrics")
    assert 'rdma_plugin_registered{resource="rdma/hca"} 0.0' in metrics


async def test_metrics_carry_each_ports_counters_read_at_each_scrape(
    kubelet: KubeletPeer, plugin: PluginProcess, tree: SysfsTree
) -> None:
    tree.set_counter("mlx5_0", 1, "port_rcv_data", "10")
    await plugin.start()
    await kubelet.wait_registrations(1)
    url = f"http://127.0.0.1:{plugin.metrics_port}/metrics"

    def scrape() -> str:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.read().decode()

    before = await asyncio.to_thread(scrape)
    tree.set_counter("mlx5_0", 1, "port_rcv_data", "25")  # traffic, as the driver counts it
    tree.set_counter("mlx5_0", 1, "np_ecn_marked_roce_packets", "3", hw=True)
    after = await asyncio.to_thread(scrape)

    assert 'rdma_port_received_bytes_total{hca="mlx5_0",port="1"} 40.0' in before
    assert 'rdma_port_received_bytes_total{hca="mlx5_0",port="1"} 100.0' in after
    assert 'rdma_port_ecn_marked_roce_packets_total{hca="mlx5_0",port="1"} 3.0' in after


async def test_waits_for_the_device_plugins_dir_to_appear(
    short_tmp: Path, plugin: PluginProcess
) -> None:
    late_dir = short_tmp / "late"
    plugin.plugin_dir = late_dir  # the kubelet has not created its dir yet
    await plugin.start()
    await asyncio.sleep(1.0)
    assert plugin.proc is not None
    assert plugin.proc.returncode is None, "must not crash without the dir"

    late_dir.mkdir()
    peer = KubeletPeer(late_dir)
    await peer.start()
    try:
        reg = await peer.wait_registrations(1, limit=15)
        assert len(reg.updates[-1][1]) == 1000
    finally:
        await peer.stop()


async def test_a_stop_while_it_waits_for_its_dir_is_a_stop_before_serving(
    short_tmp: Path, plugin: PluginProcess
) -> None:
    """As a stop in the wait for another instance is: it was "stopping" and exit 0."""
    plugin.plugin_dir = short_tmp / "late"  # never made
    await plugin.start()
    await plugin.said("does not exist")

    code = await plugin.terminate(signal.SIGINT)

    assert code == 128 + signal.SIGINT
    assert "rdma-device-plugin: stopped by SIGINT before serving" in plugin.output()


async def test_a_second_instance_on_the_same_dir_waits_and_takes_over_when_the_first_stops(
    kubelet: KubeletPeer,
    plugin: PluginProcess,
    plugin_dir: Path,
    short_tmp: Path,
    tree: SysfsTree,
) -> None:
    await plugin.start()
    await kubelet.wait_registrations(1)
    second = plugin.twin(short_tmp / "second")
    await second.start()
    try:
        assert plugin.proc is not None
        first_pid = plugin.proc.pid

        waiting = f"another instance of this program (pid {first_pid}) serves"
        for _ in range(100):  # its log, polled: Python's start takes a while
            if waiting in second.output():
                break
            await asyncio.sleep(0.1)
        assert waiting in second.output(), second.output()
        await asyncio.sleep(1.0)  # it keeps waiting: no registration, the socket untouched
        assert len(kubelet.registrations) == 1
        assert second.running()

        assert await plugin.terminate() == 0
        await kubelet.wait_registrations(2)
        assert f"pid {first_pid} stopped: serving" in second.output()
    finally:
        await second.close()


async def test_a_register_in_flight_when_its_socket_is_deleted_is_abandoned_at_once(
    kubelet: KubeletPeer, plugin: PluginProcess, plugin_dir: Path
) -> None:
    await plugin.start()
    await kubelet.wait_registrations(1)
    # As a restarting kubelet does when our Register reaches it: our socket is deleted first,
    # and its dial back waits (here: far longer than the wait below) for a socket to answer.
    kubelet.dial_timeout = 60.0
    staged: list[str] = []

    def delete_our_socket(request: api_pb2.RegisterRequest) -> None:
        if not staged:
            staged.append(request.endpoint)
            (plugin_dir / request.endpoint).unlink()

    kubelet.on_register = delete_our_socket
    await kubelet.restart()

    # re-served at the same path and registered well before that dial could time out
    await kubelet.wait_registrations(2, limit=15.0)
    assert staged == [SOCKET]
    assert "changed while registering: starting over" in plugin.output()


async def test_the_kubelets_refusal_is_quoted_as_one_bounded_line(
    kubelet: KubeletPeer, plugin: PluginProcess
) -> None:
    kubelet.refusal = "resource taken\nINJECTED line" + "x" * 5000

    await plugin.start()
    said = await plugin.said("the kubelet refused Register")

    assert "(FAILED_PRECONDITION: resource taken\\nINJECTED linexxx" in said
    assert "… (5028 characters)" in said
    lines = plugin.output().splitlines()
    assert not [line for line in lines if line.startswith("INJECTED")]
    assert max(len(line) for line in lines) < 1000
