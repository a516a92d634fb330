"""The device plugin's Events as its CLI is given API access: a kubeconfig without the node's
name is said to give no Events, an API server that never answers does not hold a stop, and the
kubeconfig's token is never said back to the kubelet or in the log."""

from __future__ import annotations

import base64
import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from plugin.deviceplugin.api.v1beta1 import api_pb2
from tests.plugin.kubelet_peer import KubeletPeer
from tests.plugin.plugin_process import PluginProcess

TOKEN = "S3cret-probe-token-42xyz"
NOTHING = "pools:\n- name: hca\n  selector:\n    ibdevs: [nothing*]\n"  # a problem to post


@pytest.fixture
def silent_api() -> Iterator[int]:
    """A port that takes connections and never answers (a hung API server, a blackholed LB)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield listener.getsockname()[1]


def _kubeconfig(root: Path, port: int) -> Path:
    path = root / "kubeconfig"
    path.write_text(json.dumps({
        "clusters": [{"name": "c", "cluster": {
            "server": f"https://127.0.0.1:{port}", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": TOKEN}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }))  # fmt: skip
    return path


async def test_a_kubeconfig_without_the_nodes_name_is_said_to_give_no_events(
    plugin: PluginProcess, short_tmp: Path, silent_api: int
) -> None:
    await plugin.start(None, kubeconfig=_kubeconfig(short_tmp, silent_api), node_name="")

    await plugin.said("no Events: they are about this node, whose name is not given")
    assert "no API access" not in plugin.output()


async def test_a_stop_does_not_wait_for_an_api_server_that_never_answers(
    plugin: PluginProcess, short_tmp: Path, silent_api: int
) -> None:
    config = plugin.write_config(NOTHING)
    kubeconfig = _kubeconfig(short_tmp, silent_api)
    await plugin.start(config, kubeconfig=kubeconfig, node_name="n1")
    await plugin.said("its selector matches none of this node's HCAs")  # the Event is due now
    await plugin.said(": serving ")  # past its start: a stop now is a clean one

    t0 = time.monotonic()
    code = await plugin.terminate()
    took = time.monotonic() - t0

    assert code == 0
    # the post in flight waits up to the API timeout (15 s); the stop does not wait for it
    assert took < 10, f"the stop took {took:.1f} s: it waited for the hung post"
    assert TOKEN not in plugin.output()


@pytest.mark.parametrize(
    "echo",
    [TOKEN, TOKEN[:-1], base64.b64encode(TOKEN.encode()).decode(),
     "".join(f"\\x{b:02x}" for b in TOKEN.encode())],
    ids=["raw", "cut-short", "base64", "backslash-x"],
)  # fmt: skip
async def test_a_kubelet_echoing_the_token_hears_it_masked_and_the_log_has_it_masked(
    plugin: PluginProcess, kubelet: KubeletPeer, short_tmp: Path, silent_api: int, echo: str
) -> None:
    """A device ID the kubelet sends is quoted in Allocate's refusal, which the kubelet puts in
    the pod's Events; its own refusal of Register is quoted in the plugin's log."""
    kubelet.refusal = f"nope {echo}"
    await plugin.start(None, kubeconfig=_kubeconfig(short_tmp, silent_api), node_name="n1")
    await plugin.said("the kubelet refused Register")
    kubelet.refusal = None
    await kubelet.restart()
    reg = await kubelet.wait_registrations(1, limit=30)

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await reg.stub.Allocate(
            api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[echo])]
            )
        )

    details = caught.value.details() or ""
    # quoted (and masked) if it could be an ID of ours, else described: never a clipped quote
    assert re.match(
        r"rdma/hca: device ID ('<token>'|\(text of \d+ characters, not one this plugin gives "
        r"out\)) is unknown to this plugin",
        details,
    ), details
    assert await plugin.terminate() == 0
    said = plugin.output()
    assert "(FAILED_PRECONDITION: nope <token>)" in said
    assert echo not in said + details
    assert TOKEN[:8] not in said + details


async def test_a_pool_named_after_the_token_is_refused_at_start(
    plugin: PluginProcess, short_tmp: Path, silent_api: int
) -> None:
    """Its name would reach the kubelet (the resource), the CDI spec and the checkpoint, which
    carry names as they are: only the log was masked."""
    name = TOKEN[:20]  # a valid pool name, holding 20 of its characters
    config = plugin.write_config(f"pools: [{{name: {name}}}]\n")

    await plugin.start(config, kubeconfig=_kubeconfig(short_tmp, silent_api), node_name="n1")
    code = await plugin.wait()

    said = plugin.output()
    assert code == 2, said
    assert (
        "rdma-device-plugin: pools[0]: its name or prefix holds the API token: name the pool "
        in said
    )
    assert name not in said
