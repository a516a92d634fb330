"""The DRA driver met as the kubelet's plugin watcher meets it: who and where it is on its
registration socket, its registration status on /metrics, the sockets and directories it makes
(a file, a read-only mount or a symbolic link loop where they go is one line naming its flag),
and a stop, or a burst of stop signals, that removes both sockets and exits 0."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import urllib.request
from pathlib import Path

import grpc
import pytest

from plugin.core.kube.sockets import CHANNEL_OPTIONS, grpc_target
from plugin.dra.api.pluginregistration.v1 import api_pb2 as reg
from plugin.dra.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from plugin.launch import DRA_DRIVER, dra_socket, registration_socket
from tests.plugin.dra_driver import Driver
from tests.plugin.sysfs_tree import SysfsTree


async def test_the_kubelets_plugin_watcher_learns_who_and_where_the_driver_is(
    driver: Driver,
) -> None:
    path = registration_socket(driver.spec.plugins_registry_dir, DRA_DRIVER)
    async with grpc.aio.insecure_channel(grpc_target(path), options=CHANNEL_OPTIONS) as channel:
        info = await reg_grpc.RegistrationStub(channel).GetInfo(reg.InfoRequest(), timeout=5)

    assert info.type == "DRAPlugin"
    assert info.name == DRA_DRIVER
    assert info.endpoint == str(dra_socket(driver.spec.plugins_dir, DRA_DRIVER))
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]


async def test_registered_on_metrics_follows_the_kubelets_registration_status(
    driver: Driver,
) -> None:
    url = f"http://{driver.spec.metrics_address}/metrics"

    def registered() -> str:
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
        (line,) = (x for x in text.splitlines() if x.startswith("rdma_plugin_registered{"))
        return line

    path = registration_socket(driver.spec.plugins_registry_dir, DRA_DRIVER)
    sample = f'rdma_plugin_registered{{resource="{DRA_DRIVER}"}}'
    assert await asyncio.to_thread(registered) == f"{sample} 0.0"  # the kubelet has not said
    async with grpc.aio.insecure_channel(grpc_target(path), options=CHANNEL_OPTIONS) as channel:
        stub = reg_grpc.RegistrationStub(channel)
        await stub.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=True))
        assert await asyncio.to_thread(registered) == f"{sample} 1.0"
        await stub.NotifyRegistrationStatus(
            reg.RegistrationStatus(
                plugin_registered=False, error="version not supported\nINJECTED" + "x" * 5000
            )
        )
    assert await asyncio.to_thread(registered) == f"{sample} 0.0"
    lines = driver.log.read_text().splitlines()
    (said,) = (line for line in lines if "the kubelet refused the registration" in line)
    assert said.endswith(": version not supported\\nINJECTED" + "x" * 270 + "… (5030 characters)")
    assert not [line for line in lines if line.startswith("INJECTED")]


async def test_a_stop_removes_both_sockets_and_exits_0(driver: Driver) -> None:
    assert await driver.stop() == 0

    assert not registration_socket(driver.spec.plugins_registry_dir, DRA_DRIVER).exists()
    assert not dra_socket(driver.spec.plugins_dir, DRA_DRIVER).exists()


async def test_a_burst_of_stop_signals_is_one_clean_stop(short_tmp: Path, tree: SysfsTree) -> None:
    """The second SIGTERM came in the clean stop's last milliseconds, when Python's finalization
    had given the signal its default back: 4 runs in 5 died of it (-15), silently."""
    codes = []
    for run in range(5):
        (short_tmp / str(run)).mkdir()
        driver = Driver(short_tmp / str(run), tree)
        await driver.start()
        assert driver.proc is not None
        driver.proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.01)
        driver.proc.send_signal(signal.SIGTERM)
        driver.proc.send_signal(signal.SIGINT)
        codes.append(await asyncio.wait_for(driver.proc.wait(), 20))

    assert codes == [0] * 5


async def test_a_missing_cdi_dir_is_made_and_said(short_tmp: Path, tree: SysfsTree) -> None:
    driver = Driver(short_tmp, tree)
    cdi_dir = driver.spec.cdi_dir
    assert not cdi_dir.exists()

    await driver.start()
    assert await driver.stop() == 0

    assert cdi_dir.is_dir()
    assert f"--cdi-dir {cdi_dir} did not exist: made it" in driver.log.read_text()


@pytest.mark.parametrize("which", ["registration", "dra"])
async def test_a_file_where_a_socket_goes_is_kept_and_said(
    short_tmp: Path, tree: SysfsTree, which: str
) -> None:
    driver = Driver(short_tmp, tree)
    spec = driver.spec
    path = (
        registration_socket(spec.plugins_registry_dir, DRA_DRIVER)
        if which == "registration"
        else dra_socket(spec.plugins_dir, DRA_DRIVER)
    )
    path.parent.mkdir(parents=True)
    path.write_text("someone's notes\n")
    code = await driver.refused(spec)

    assert code == 2
    assert path.read_text() == "someone's notes\n"
    flag = "--plugins-registry-dir" if which == "registration" else "--plugins-dir"
    assert (
        f"rdma-dra-driver: {flag}: {path} is a regular file, not our socket: move it away"
        in driver.log.read_text()
    )


async def test_its_own_plugin_dir_taken_by_a_file_is_said_and_kept(
    short_tmp: Path, tree: SysfsTree
) -> None:
    driver = Driver(short_tmp, tree)
    own = driver.spec.plugins_dir / DRA_DRIVER
    own.parent.mkdir(parents=True)
    own.write_text("someone's notes\n")
    code = await driver.refused()

    assert code == 2
    assert own.read_text() == "someone's notes\n"
    said = [ln for ln in driver.log.read_text().splitlines() if ln.startswith("rdma-dra")]
    assert said == [f"rdma-dra-driver: --plugins-dir: {own} is not a directory: move it away"]


@pytest.mark.parametrize("flag", ["plugins_registry_dir", "plugins_dir"])
async def test_a_read_only_plugin_dir_is_one_line_naming_its_flag(
    short_tmp: Path, tree: SysfsTree, read_only_dir: Path, flag: str
) -> None:
    driver = Driver(short_tmp, tree)
    spec = dataclasses.replace(driver.spec, **{flag: read_only_dir})
    code = await driver.refused(spec)

    said = [ln for ln in driver.log.read_text().splitlines() if ln.startswith("rdma-dra-driver:")]
    assert code == 2
    assert len(said) == 1
    assert said[0].startswith(f"rdma-dra-driver: --{flag.replace('_', '-')}: {read_only_dir}")
    assert said[0].endswith(
        # the registry dir is there; the driver's own dir under --plugins-dir is to be made
        "is on a read-only file system: run the driver as root, as its DaemonSet does, or name a "
        "directory this user can write"
        if flag == "plugins_registry_dir"
        else f"{DRA_DRIVER} cannot be made (Read-only file system)"
    )
    assert "Traceback" not in driver.log.read_text()
    assert "add_port" not in driver.log.read_text()  # grpc core's own line, before ours


@pytest.mark.parametrize("flag", ["plugins_registry_dir", "plugins_dir"])
async def test_a_plugin_dir_that_is_a_symlink_loop_is_one_line_naming_its_flag(
    short_tmp: Path, tree: SysfsTree, flag: str
) -> None:
    """mkdir says "File exists" of a loop, and that was all the driver said."""
    driver = Driver(short_tmp, tree)
    (short_tmp / "a").symlink_to(short_tmp / "b")
    (short_tmp / "b").symlink_to(short_tmp / "a")
    spec = dataclasses.replace(driver.spec, **{flag: short_tmp / "a"})
    code = await driver.refused(spec)

    said = [ln for ln in driver.log.read_text().splitlines() if ln.startswith("rdma-dra-driver:")]
    assert code == 2
    (line,) = said
    assert line.startswith(f"rdma-dra-driver: --{flag.replace('_', '-')}")
    assert line.endswith(
        "is a symbolic link to nothing (or a loop): name a directory"
        if flag == "plugins_registry_dir"
        else f"{DRA_DRIVER} is a symbolic link loop: name a directory"  # its instance lock's
    )
