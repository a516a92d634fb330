"""The DRA driver as the kubelet meets it, for the tests: the driver run from its CLI as a
subprocess, an HTTPS API server of fixed answers, a kubeconfig of one cluster and user, and the
kubelet's two calls."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc

from plugin.core.kube.sockets import CHANNEL_OPTIONS, grpc_target
from plugin.dra.api.dra.v1 import api_pb2 as v1
from plugin.dra.api.dra.v1 import api_pb2_grpc as v1_grpc
from plugin.launch import DRA_DRIVER, DraLaunchSpec, dra_socket, registration_socket
from tests.plugin.plugin_process import free_port
from tests.plugin.sysfs_tree import SysfsTree

TOKEN = "S3cret-token-0123456789"  # the driver's own: never in its log
SERVER = "https://127.0.0.1:6443"  # of a kubeconfig the driver refuses before dialling it


class Driver:
    def __init__(self, root: Path, tree: SysfsTree, server: str | None = None) -> None:
        kubeconfig = root / "kubeconfig"
        closed = free_port()  # nothing listens: the API server is away
        kubeconfig.write_text(
            json.dumps(
                {
                    "clusters": [
                        {
                            "name": "c",
                            "cluster": {
                                "server": server or f"https://127.0.0.1:{closed}",
                                "insecure-skip-tls-verify": True,
                            },
                        }
                    ],
                    "users": [{"name": "u", "user": {"token": TOKEN}}],
                    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                    "current-context": "x",
                }
            )
        )
        self.spec = DraLaunchSpec(
            sysfs_root=tree.sys,
            dev_root=tree.dev,
            discovery="sysfs",
            metrics_address=f"127.0.0.1:{free_port()}",
            log_level="debug",
            kubeconfig=kubeconfig,
            node_name="node-a",
            plugins_registry_dir=root / "registry",
            plugins_dir=root / "plugins",
            cdi_dir=root / "cdi",
        )
        self.log = root / "dra.log"
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                *self.spec.command(sys.executable), stdout=log, stderr=log
            )
        path = registration_socket(self.spec.plugins_registry_dir, DRA_DRIVER)
        for _ in range(200):  # served, not only there: a killed run leaves its socket file
            with socket.socket(socket.AF_UNIX) as probe, contextlib.suppress(OSError):
                probe.connect(str(path))
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{path} not served within 10 s:\n{self.log.read_text()}")

    async def refused(self, spec: DraLaunchSpec | None = None) -> int:
        """Run `spec` (default: its own), expected to stop at once: its exit code."""
        with self.log.open("ab") as log:
            proc = await asyncio.create_subprocess_exec(
                *(spec or self.spec).command(sys.executable), stdout=log, stderr=log
            )
        return await asyncio.wait_for(proc.wait(), 30)

    async def stop(self) -> int:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.terminate()
        return await asyncio.wait_for(self.proc.wait(), 10)


class OddApi:
    """An HTTPS server that gives every request the same answer (`by_path` excepted, or one
    without end): what a proxy in the way, or a failing API server, says."""

    def __init__(
        self,
        root: Path,
        status: int,
        body: bytes,
        by_path: dict[str, bytes] | None = None,
        endless: bool = False,
        slow_under: tuple[str, float] = ("", 0.0),
        drip: float = 0.0,
    ) -> None:
        self.asked: list[str] = []
        key, cert = root / "api.key", root / "api.crt"
        subprocess.run(
            ["openssl", "req", "-x509", "-nodes", "-newkey", "rsa:2048", "-days", "1",
             "-subj", "/CN=odd", "-keyout", str(key), "-out", str(cert)],
            check=True, capture_output=True,
        )  # fmt: skip

        class Answer(http.server.BaseHTTPRequestHandler):
            def do_GET(inner) -> None:  # noqa: N805 (self is the server's)
                self.asked.append(inner.path)
                if inner.path.startswith(slow_under[0]):
                    time.sleep(slow_under[1])
                inner.answer()

            def answer(self) -> None:
                answer = (by_path or {}).get(self.path.partition("?")[0], body)
                if endless:  # a chunked body without end, until the reader goes
                    self.send_response(status)
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    with contextlib.suppress(OSError):
                        while True:
                            self.wfile.write(b"10000\r\n" + b"x" * 0x10000 + b"\r\n")
                self.send_response(status)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                for at in range(0, len(answer), 1 if drip else len(answer) or 1):
                    self.wfile.write(answer[at : at + 1] if drip else answer)
                    self.wfile.flush()
                    time.sleep(drip)

            def do_POST(self) -> None:
                self.do_GET()

            def do_PUT(self) -> None:
                self.do_GET()

            def do_DELETE(self) -> None:
                self.do_GET()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(cert, key)
        self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def claim(results: object, status: object = None, uid: str = "u-1", name: str = "c") -> bytes:
    allocation = {"devices": {"results": results}}
    return json.dumps({
        "metadata": {"uid": uid, "name": name, "namespace": "default"},
        "status": status if status is not None else {"allocation": allocation},
    }).encode()  # fmt: skip


async def prepare(driver: Driver, uid: str, name: str = "c") -> v1.NodePrepareResourceResponse:
    target = grpc_target(dra_socket(driver.spec.plugins_dir, DRA_DRIVER))
    async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
        answer = await v1_grpc.DRAPluginStub(channel).NodePrepareResources(
            v1.NodePrepareResourcesRequest(
                claims=[v1.Claim(namespace="default", uid=uid, name=name)]
            ),
            timeout=30,
        )
    return answer.claims[uid]


async def unprepare(driver: Driver, uid: str) -> v1.NodeUnprepareResourceResponse:
    target = grpc_target(dra_socket(driver.spec.plugins_dir, DRA_DRIVER))
    async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
        answer = await v1_grpc.DRAPluginStub(channel).NodeUnprepareResources(
            v1.NodeUnprepareResourcesRequest(
                claims=[v1.Claim(namespace="default", uid=uid, name="c")]
            ),
            timeout=30,
        )
    return answer.claims[uid]


def _kubeconfig(cluster: dict[str, object], user: object) -> dict[str, object]:
    """A kubeconfig of `cluster` and `user`, in its one context, the current one."""
    return {
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }


async def _prepared_against(
    api: OddApi, root: Path, tree: SysfsTree
) -> tuple[Driver, v1.NodePrepareResourceResponse]:
    """A driver of `api` started, claim u-1 prepared, the driver stopped, `api` closed."""
    driver = Driver(root, tree, api.url)
    await driver.start()
    try:
        return driver, await prepare(driver, "u-1")
    finally:
        assert await driver.stop() == 0
        api.close()
