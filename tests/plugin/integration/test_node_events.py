"""The device plugin's Events as its CLI is given API access: a kubeconfig without the node's
name is said to give no Events, and an API server that never answers does not hold a stop."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.plugin.plugin_process import PluginProcess

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
        "users": [{"name": "u", "user": {"token": "S3cret-0123456789"}}],
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

    t0 = time.monotonic()
    code = await plugin.terminate()
    took = time.monotonic() - t0

    assert code == 0
    # the post in flight waits up to the API timeout (15 s); the stop does not wait for it
    assert took < 10, f"the stop took {took:.1f} s: it waited for the hung post"
    assert "S3cret-0123456789" not in plugin.output()
