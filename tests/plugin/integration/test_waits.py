"""Every wait of the running plugin says at once what it waits for and why, and ends on its own
when the cause goes away: a kubelet.sock that is not the kubelet's, a device-plugins dir that
cannot hold a socket, another instance holding the dir."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from plugin.core.kube.instance import holder
from plugin.deviceplugin.api.v1beta1 import api_pb2, api_pb2_grpc
from plugin.launch import MAX_UNIX_PATH, socket_name
from tests.plugin.kubelet_peer import KubeletPeer
from tests.plugin.plugin_process import PluginProcess
from tests.plugin.sysfs_tree import SysfsTree

SOCKET = socket_name("rdma/hca")
# Well under the 15 s a connect to kubelet.sock may take: "at once" means before it.
AT_ONCE = 5.0


async def _a_kubelet_starting_is_registered_with(plugin_dir: Path) -> None:
    peer = KubeletPeer(plugin_dir)
    await peer.start()
    try:
        await peer.wait_registrations(1, limit=15)
    finally:
        await peer.stop()


def _regular_file(path: Path) -> None:
    path.write_text("")


def _directory(path: Path) -> None:
    path.mkdir()


def _dangling_symlink(path: Path) -> None:
    path.symlink_to(path.parent / "gone.sock")


def _stale_socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as s:  # bound, never listening: what a dead kubelet left
        s.bind(str(path))


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (_regular_file, "is a regular file, not a socket: something else made it; remove it"),
        (_directory, "is a directory, not a socket"),
        (_dangling_symlink, "is a dangling symlink: remove it"),
        (_stale_socket, "refuses connections: nothing listens on it"),
    ],
    ids=["regular-file", "directory", "dangling-symlink", "stale-socket"],
)
async def test_a_kubelet_sock_that_is_not_a_listening_kubelet_is_said_at_once_then_healed(
    plugin: PluginProcess, plugin_dir: Path, make: Callable[[Path], None], said: str
) -> None:
    kubelet_sock = plugin_dir / "kubelet.sock"
    make(kubelet_sock)
    await plugin.start()

    await plugin.said(f"waiting for the kubelet: {kubelet_sock} {said}", limit=AT_ONCE)

    # a kubelet starting there (it removes what is in its way) is registered with, unprompted
    if kubelet_sock.is_dir():
        kubelet_sock.rmdir()
    else:
        kubelet_sock.unlink()
    await _a_kubelet_starting_is_registered_with(plugin_dir)


async def test_no_kubelet_yet_is_said_at_once(plugin: PluginProcess, plugin_dir: Path) -> None:
    await plugin.start()

    await plugin.said(
        f"waiting for the kubelet: {plugin_dir / 'kubelet.sock'} does not exist yet",
        limit=AT_ONCE,
    )


async def test_a_device_plugins_dir_that_is_a_file_is_said_at_once_and_served_once_fixed(
    plugin: PluginProcess, plugin_dir: Path, short_tmp: Path
) -> None:
    os.rmdir(plugin_dir)
    _regular_file(plugin_dir)
    await plugin.start()

    await plugin.said(
        f"cannot serve {plugin_dir / SOCKET}: {plugin_dir} is a regular file, not a directory",
        limit=AT_ONCE,
    )

    os.unlink(plugin_dir)
    os.mkdir(plugin_dir)
    await _a_kubelet_starting_is_registered_with(plugin_dir)


async def test_a_missing_device_plugins_dir_is_said_at_once_and_served_once_made(
    plugin: PluginProcess, plugin_dir: Path
) -> None:
    os.rmdir(plugin_dir)
    await plugin.start()

    await plugin.said(f"cannot serve {plugin_dir / SOCKET}: {plugin_dir} does not exist")
    await plugin.said(f"cannot watch {plugin_dir} (No such file or directory)")

    os.mkdir(plugin_dir)
    await _a_kubelet_starting_is_registered_with(plugin_dir)


async def test_a_socket_path_exactly_at_the_limit_is_served_and_registered(
    short_tmp: Path, tree: SysfsTree
) -> None:
    pad = MAX_UNIX_PATH - len(f"{short_tmp}/") - len(f"/{SOCKET}")
    plugin_dir = short_tmp / ("p" * pad)
    plugin_dir.mkdir()
    assert len(os.fsencode(plugin_dir / SOCKET)) == MAX_UNIX_PATH
    peer = KubeletPeer(plugin_dir)
    await peer.start()
    plugin = PluginProcess(short_tmp, plugin_dir, sysfs=tree.sys, dev=tree.dev)
    try:
        await plugin.start()
        await peer.wait_registrations(1)
    finally:
        await plugin.close()
        await peer.stop()


async def test_a_short_symlink_to_a_long_device_plugins_dir_is_served(
    short_tmp: Path, tree: SysfsTree
) -> None:
    # the resolved path is far over a socket address; the path given is short
    long_dir = short_tmp / ("l" * 200) / ("m" * 200)
    long_dir.mkdir(parents=True)
    link = short_tmp / "dp-link"
    link.symlink_to(long_dir)
    peer = KubeletPeer(link)
    await peer.start()
    plugin = PluginProcess(short_tmp, link, sysfs=tree.sys, dev=tree.dev)
    try:
        await plugin.start()
        await peer.wait_registrations(1)
        assert (long_dir / SOCKET).exists()
    finally:
        await plugin.close()
        await peer.stop()


async def test_ctrl_c_on_an_instance_waiting_for_the_lock_is_one_line(
    kubelet: KubeletPeer, plugin: PluginProcess, plugin_dir: Path, short_tmp: Path, tree: SysfsTree
) -> None:
    await plugin.start()
    await kubelet.wait_registrations(1)
    second = plugin.twin(short_tmp / "second")
    await second.start()
    try:
        await second.said("waiting for it to stop")

        assert await second.terminate(signal.SIGINT) == 130
        output = second.output()
        assert "Traceback" not in output
        assert output.rstrip().endswith("rdma-device-plugin: stopped by SIGINT before serving")
    finally:
        await second.close()


async def test_grpc_refuses_a_socket_path_one_byte_over_the_limit(short_tmp: Path) -> None:
    # the limit is grpc-core's, stricter than sockaddr_un's: a grpc that moves it fails here
    path = short_tmp / ("s" * (MAX_UNIX_PATH + 1 - len(f"{short_tmp}/")))
    assert len(os.fsencode(path)) == MAX_UNIX_PATH + 1
    server = grpc.aio.server()

    with pytest.raises(RuntimeError, match="Failed to bind"):
        server.add_insecure_port(f"unix://{path}")


async def test_an_instance_answers_every_waiters_question_however_many_ask(
    kubelet: KubeletPeer, plugin: PluginProcess, plugin_dir: Path
) -> None:
    await plugin.start()
    await kubelet.wait_registrations(1)
    assert plugin.proc is not None

    # each waiter asks once a second; a lock that never accepted filled its backlog after ~9
    answers = [await asyncio.to_thread(holder, plugin_dir) for _ in range(30)]

    assert answers == [plugin.proc.pid] * 30


async def test_a_file_where_the_socket_goes_is_said_and_kept_until_moved(
    kubelet: KubeletPeer, plugin: PluginProcess, plugin_dir: Path
) -> None:
    (plugin_dir / SOCKET).write_text("someone's notes\n")

    await plugin.start()
    await plugin.said(
        f"cannot serve {plugin_dir / SOCKET}: {plugin_dir / SOCKET} is a regular file, not our "
        "socket: move it away (only a socket there is replaced)"
    )
    assert (plugin_dir / SOCKET).read_text() == "someone's notes\n"

    os.rename(plugin_dir / SOCKET, plugin_dir / "notes.txt")
    await kubelet.wait_registrations(1, limit=15)


async def test_a_relative_device_plugins_dir_is_served_from_where_the_plugin_starts(
    short_tmp: Path, tree: SysfsTree
) -> None:
    plugin_dir = short_tmp / "rel"
    plugin_dir.mkdir()
    peer = KubeletPeer(plugin_dir)
    await peer.start()
    plugin = PluginProcess(short_tmp, Path("rel"), sysfs=tree.sys, dev=tree.dev)
    try:
        proc = await asyncio.create_subprocess_exec(
            *plugin.argv(), cwd=short_tmp, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        plugin.proc = proc
        await peer.wait_registrations(1)
        assert await plugin.terminate() == 0
    finally:
        await plugin.close()
        await peer.stop()


async def test_a_hangup_while_waiting_for_the_lock_is_one_line(
    kubelet: KubeletPeer, plugin: PluginProcess, short_tmp: Path
) -> None:
    await plugin.start()
    await kubelet.wait_registrations(1)
    second = plugin.twin(short_tmp / "second")
    await second.start()
    try:
        await second.said("waiting for it to stop")

        assert await second.terminate(signal.SIGHUP) == 129
        assert second.output().rstrip().endswith("stopped by SIGHUP before serving")
    finally:
        await second.close()


async def test_a_burst_of_different_stop_signals_while_waiting_is_one_line(
    kubelet: KubeletPeer, plugin: PluginProcess, short_tmp: Path
) -> None:
    """Each signal of a burst said its own line (and, once, an interpreter dump with exit 1)."""
    await plugin.start()
    await kubelet.wait_registrations(1)
    second = plugin.twin(short_tmp / "second")
    await second.start()
    try:
        await second.said("waiting for it to stop")
        assert second.proc is not None
        for sig in (signal.SIGUSR2, signal.SIGTERM, signal.SIGQUIT, signal.SIGINT):
            second.proc.send_signal(sig)
        code = await second.wait()

        stops = [line for line in second.output().splitlines() if "stopped by" in line]
        (stop,) = stops
        assert stop.endswith(f"stopped by {signal.Signals(code - 128).name} before serving")
    finally:
        await second.close()


class _HungKubelet(api_pb2_grpc.RegistrationServicer):
    async def Register(
        self, request: api_pb2.RegisterRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.Empty:
        await asyncio.Event().wait()  # never answers
        return api_pb2.Empty()


async def test_a_kubelet_that_never_answers_register_is_said_as_hung(
    plugin: PluginProcess, plugin_dir: Path
) -> None:
    server = grpc.aio.server()
    api_pb2_grpc.add_RegistrationServicer_to_server(_HungKubelet(), server)
    server.add_insecure_port(f"unix://{plugin_dir / 'kubelet.sock'}")
    await server.start()
    try:
        await plugin.start()

        await plugin.said("waiting for the kubelet to answer Register", limit=AT_ONCE)
        await plugin.said("the kubelet did not answer Register within 15s (a hung kubelet?)", 30)
    finally:
        await server.stop(0)


async def test_a_kubelet_sock_that_accepts_but_never_speaks_is_said_at_once(
    plugin: PluginProcess, plugin_dir: Path
) -> None:
    with socket.socket(socket.AF_UNIX) as mute:  # listening, never accepting nor answering
        mute.bind(str(plugin_dir / "kubelet.sock"))
        mute.listen(16)
        await plugin.start()

        await plugin.said("to complete a gRPC connection (1s so far", limit=AT_ONCE)


async def test_a_config_that_becomes_unreadable_while_running_is_a_warning_not_a_stop(
    kubelet: KubeletPeer, plugin: PluginProcess
) -> None:
    conf_dir = plugin.root / "conf"
    conf_dir.mkdir()
    config = conf_dir / "plugin.yaml"
    config.write_text("pools:\n  - name: hca\n")
    await plugin.start(config)
    await kubelet.wait_registrations(1)

    os.rename(conf_dir, plugin.root / "conf.old")
    _regular_file(conf_dir)  # the config's dir is now a file: reading it fails (ENOTDIR)

    await plugin.said("config on disk changed and is invalid", limit=15)
    assert plugin.running()


class _BouncingKubelet(KubeletPeer):
    """A kubelet in trouble: it accepts each Register, then ends the ListAndWatch at once."""

    async def _watch(self, reg: Any) -> None:
        reg.stream = reg.stub.ListAndWatch(api_pb2.Empty())
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            async for response in reg.stream:
                reg.updates.append((0.0, list(response.devices)))
                reg.stream.cancel()
        await self._notify()


async def test_a_kubelet_that_ends_each_stream_at_once_gets_registers_later_and_later(
    plugin: PluginProcess, plugin_dir: Path
) -> None:
    bouncing = _BouncingKubelet(plugin_dir)
    await bouncing.start()
    try:
        await plugin.start()
        await bouncing.wait_registrations(5, limit=30)

        holds = re.findall(
            r"the kubelet ended ListAndWatch [0-9.]+s after the Register .*; looking again in "
            r"([0-9.]+)s",
            plugin.output(),
        )
        assert [float(h) for h in holds[:4]] == [0.1, 0.2, 0.4, 0.8], plugin.output()
    finally:
        await bouncing.stop()


async def test_a_kubelet_restarted_after_a_long_stream_is_registered_with_at_once(
    kubelet: KubeletPeer, plugin: PluginProcess
) -> None:
    await plugin.start()
    await kubelet.wait_registrations(1)

    await kubelet.restart()  # kubelet.sock made again: a new kubelet, no hold-off
    await kubelet.wait_registrations(2)

    assert "after the Register (under" not in plugin.output()


async def test_a_device_plugins_dir_with_percent_and_space_in_its_name_is_served(
    short_tmp: Path, tree: SysfsTree
) -> None:
    odd = short_tmp / "dp%41 x"  # grpc percent-decodes its unix addresses: %41 would be "A"
    odd.mkdir()
    peer = KubeletPeer(odd)
    await peer.start()
    plugin = PluginProcess(short_tmp, odd, sysfs=tree.sys, dev=tree.dev)
    try:
        await plugin.start()

        await peer.wait_registrations(1)
        assert (odd / SOCKET).is_socket()
    finally:
        await plugin.close()
        await peer.stop()


async def test_a_device_plugins_dir_made_again_is_served_anew_not_taken_for_a_flapping_kubelet(
    kubelet: KubeletPeer, plugin: PluginProcess, plugin_dir: Path
) -> None:
    """A kubelet killed (its socket left behind), its dir removed and made again: the new
    socket's Register is no flap to hold off (it was, twice, said as the kubelet ending the
    stream 5 s after the old Register, long after that stream was said to have ended)."""
    await plugin.start()
    await kubelet.wait_registrations(1)
    left = plugin_dir / "kubelet.sock.left"
    os.link(plugin_dir / "kubelet.sock", left)  # grpc unlinks its socket on stop; a kill does not
    await kubelet.stop()
    os.rename(left, plugin_dir / "kubelet.sock")
    await plugin.said("the kubelet ended ListAndWatch; registering again")

    shutil.rmtree(plugin_dir)
    await asyncio.sleep(2)
    os.mkdir(plugin_dir)
    serving = f"serving {plugin_dir / SOCKET}"
    for _ in range(150):
        if plugin.output().count(serving) == 2:
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(1)  # what it does next, with no kubelet there
    said = plugin.output()
    back = KubeletPeer(plugin_dir)
    await back.start()
    try:
        reg = await back.wait_registrations(1, limit=15)
    finally:
        await back.stop()

    assert len(reg.updates[-1][1]) == 1000
    gone = said.index(f"{plugin_dir} does not exist")
    assert "the kubelet ended ListAndWatch" not in said[gone:], said[gone:]


async def test_kubelet_restarts_in_quick_succession_are_each_registered_with_at_once(
    kubelet: KubeletPeer, plugin: PluginProcess
) -> None:
    """A kubelet restarted twice within the stable window was taken for one that flaps: its
    kubelet.sock, made again, got the same inode number back (ext4 gives it back at once), and
    the Register waited 0.1, 0.2, 0.4 s... A flapping kubelet (one that ends each stream, its
    socket the same) is still held off: the test above."""
    await plugin.start()
    await kubelet.wait_registrations(1)

    for n in range(2, 17):
        await kubelet.restart()
        await kubelet.wait_registrations(n)

    assert "after the Register (under" not in plugin.output()
