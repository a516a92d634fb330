"""The DRA driver as a subprocess from its CLI, met as the kubelet meets it: over real gRPC on
its registration and DRAPlugin sockets. No API server answers here (tests/e2e has the real
one): what the kubelet sees of the driver alone, and how it fails when the API server is
away."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from plugin.core.kube.sockets import CHANNEL_OPTIONS, grpc_target
from plugin.dra.api.dra.v1 import api_pb2 as v1
from plugin.dra.api.dra.v1 import api_pb2_grpc as v1_grpc
from plugin.dra.api.dra.v1beta1 import api_pb2 as v1beta1
from plugin.dra.api.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from plugin.dra.api.pluginregistration.v1 import api_pb2 as reg
from plugin.dra.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from plugin.dra.prepare import POD_READS_WITHIN, spec_file
from plugin.dra.servicer import STOPPING
from plugin.launch import DRA_DRIVER, dra_socket, registration_socket
from tests.plugin.dra_driver import TOKEN, Driver, OddApi, claim, prepare, unprepare
from tests.plugin.sysfs_tree import SysfsTree


@pytest.fixture
async def driver(short_tmp: Path, tree: SysfsTree) -> AsyncIterator[Driver]:
    d = Driver(short_tmp, tree)
    await d.start()
    yield d
    await d.stop()


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


async def test_a_claim_that_cannot_be_read_is_an_error_for_that_claim_and_the_driver_serves_on(
    driver: Driver,
) -> None:
    target = grpc_target(dra_socket(driver.spec.plugins_dir, DRA_DRIVER))
    claim = {"namespace": "default", "uid": "u-1", "name": "c"}
    async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
        first = await v1_grpc.DRAPluginStub(channel).NodePrepareResources(
            v1.NodePrepareResourcesRequest(claims=[v1.Claim(**claim)]), timeout=30
        )
        again = await v1beta1_grpc.DRAPluginStub(channel).NodePrepareResources(
            v1beta1.NodePrepareResourcesRequest(claims=[v1beta1.Claim(**claim)]), timeout=30
        )
        gone = await v1_grpc.DRAPluginStub(channel).NodeUnprepareResources(
            v1.NodeUnprepareResourcesRequest(claims=[v1.Claim(**claim)]), timeout=30
        )

    for answer in (first, again):
        assert answer.claims["u-1"].error.startswith("cannot read claim default/c: GET ")
        assert ": 127.0.0.1:" in answer.claims["u-1"].error  # where it dialled, refused
        assert not answer.claims["u-1"].devices
    assert gone.claims["u-1"].error == ""  # never prepared: already unprepared
    assert not list((driver.spec.cdi_dir).glob("*"))
    assert driver.proc is not None
    assert driver.proc.returncode is None


async def test_a_stop_removes_both_sockets_and_exits_0(driver: Driver) -> None:
    assert await driver.stop() == 0

    assert not registration_socket(driver.spec.plugins_registry_dir, DRA_DRIVER).exists()
    assert not dra_socket(driver.spec.plugins_dir, DRA_DRIVER).exists()


async def test_a_missing_cdi_dir_is_made_and_said(short_tmp: Path, tree: SysfsTree) -> None:
    driver = Driver(short_tmp, tree)
    cdi_dir = driver.spec.cdi_dir
    assert not cdi_dir.exists()

    await driver.start()
    assert await driver.stop() == 0

    assert cdi_dir.is_dir()
    assert f"--cdi-dir {cdi_dir} did not exist: made it" in driver.log.read_text()


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


def _driver_with(
    root: Path, cluster: dict[str, object], user: object
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The driver from its CLI with a kubeconfig of `cluster` and `user`, expected to stop."""
    kubeconfig = root / "kubeconfig"
    kubeconfig.write_text(json.dumps(_kubeconfig(cluster, user)))
    done = subprocess.run(
        [sys.executable, "-m", "plugin.dra", "--discovery", "sysfs", "--node-name", "n1",
         "--kubeconfig", str(kubeconfig)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return kubeconfig, done


def _kubeconfig(cluster: dict[str, object], user: object) -> dict[str, object]:
    return {
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }


SERVER = "https://127.0.0.1:6443"
B64_SECRET = base64.b64encode(b"S3cret but no PEM").decode()


@pytest.mark.parametrize(
    ("cluster", "user", "said"),
    [
        ({"server": SERVER, "certificate-authority-data": "not!!base64@@S3cret"}, {},
         "certificate-authority-data: not base64 of PEM text"),
        ({"server": SERVER, "certificate-authority-data": base64.b64encode(b"\xff\xfe").decode()},
         {}, "certificate-authority-data: not base64 of PEM text"),
        ({"server": SERVER, "certificate-authority-data": B64_SECRET}, {},
         "certificate-authority-data: not what TLS can use"),
        ({"server": SERVER, "certificate-authority": "/nonexistent/ca.crt"}, {},
         "certificate-authority: /nonexistent/ca.crt: No such file or directory"),
        ({"server": "https://127.0.0.1:99999", "insecure-skip-tls-verify": True}, {},
         "server's port is not a number within 1-65535: fix it"),
        ({"server": "https://127.0.0.1:0", "insecure-skip-tls-verify": True}, {},
         "server's port is not a number within 1-65535: fix it"),
        ({"server": "https://[::1", "insecure-skip-tls-verify": True}, {},
         "server text of 12 characters is not https://HOST[:PORT]"),
        ({"server": "https://exa mple:6443", "insecure-skip-tls-verify": True}, {},
         "server text of 21 characters is not https://HOST[:PORT]"),
        ({"server": "https://a..b", "insecure-skip-tls-verify": True}, {},
         "server text of 12 characters is not https://HOST[:PORT]"),
        ({"server": f"https://{'a' * 64}.example", "insecure-skip-tls-verify": True}, {},
         "server text of 80 characters is not https://HOST[:PORT]"),
        ({"server": "https://api\t.example", "insecure-skip-tls-verify": True}, {},
         "server text of 20 characters is not https://HOST[:PORT]"),
        ({"server": SERVER, "insecure-skip-tls-verify": True},
         {"client-certificate-data": "bad!!S3cret"}, "client-certificate-data: not base64"),
        ({"server": SERVER, "insecure-skip-tls-verify": True},
         {"client-certificate": "/nonexistent/c.crt", "client-key": "/nonexistent/c.key"},
         "client-certificate: /nonexistent/c.crt: No such file or directory"),
        ({"server": SERVER, "insecure-skip-tls-verify": True}, {"tokenFile": "FIFO"},
         "tokenFile: a FIFO, not a regular file"),
        ({"server": SERVER, "insecure-skip-tls-verify": True}, {"tokenFile": "/dev/zero"},
         "tokenFile: a character device, not a regular file"),
        ({"server": SERVER, "insecure-skip-tls-verify": True},
         {"tokenFile": "/nonexistent/token"}, "tokenFile: No such file or directory"),
        ({"server": SERVER, "insecure-skip-tls-verify": True}, {"token": ""},
         "token: empty: give the token, or remove the field for no login"),
        ({"server": SERVER, "insecure-skip-tls-verify": True}, {"tokenFile": "/dev/null"},
         "tokenFile: a character device, not a regular file"),
        ({"server": SERVER, "insecure-skip-tls-verify": True},
         {"exec": {"command": "/nonexistent/helper"}}, "exec is not supported here"),
        ({"server": SERVER, "insecure-skip-tls-verify": True},
         {"auth-provider": {"name": "oidc"}}, "auth-provider is not supported here"),
        ({"server": SERVER, "insecure-skip-tls-verify": True},
         {"username": "u", "password": "S3cret"}, "username is not supported here"),
        ({"server": SERVER, "insecure-skip-tls-verify": True, "proxy-url": "http://p:3128"},
         {"token": "S3cret"}, "the cluster's proxy-url is not supported here: remove it"),
        ({"server": SERVER, "insecure-skip-tls-verify": True}, {"token": "S3cret\nX-Evil: 1"},
         "token: text of 16 characters with a line break, a space or a character an HTTP "
         "header cannot carry"),
        ({"server": SERVER, "insecure-skip-tls-verify": True}, ["S3cret"],
         "users: the user named 'u': not there, or not as a kubeconfig has it"),
        ({"insecure-skip-tls-verify": True}, {},
         "clusters: the cluster named 'c': its server: not there, or not as a kubeconfig has it"),
        ({"server": SERVER, "insecure-skip-tls-verify": "false"}, {},
         "insecure-skip-tls-verify: text of 5 characters, not true or false"),
        ({"server": SERVER, "insecure-skip-tls-verify": True}, {"token": ["S3cret"]},
         "token: a list of 1, not text"),
        ({"server": SERVER, "insecure-skip-tls-verify": True}, {"token": "t", "as": "admin"},
         "as is not supported here"),
        ({"server": SERVER, "insecure-skip-tls-verify": True}, {"client-key": "ENCRYPTED"},
         "client-certificate and client-key: the client key is encrypted: give its unencrypted"),
        ({"server": "https://u:S3cret@127.0.0.1:6443", "insecure-skip-tls-verify": True}, {},
         "server has a login (USER:PASSWORD@) in it, which an API server does not take"),
        ({"server": "https://127.0.0.1:6443/?access_token=S3cret", "insecure-skip-tls-verify":
          True}, {}, "server has a query or a fragment (?…, #…), which this client does not send"),
        ({"server": SERVER, "certificate-authority": "FIFO"}, {},
         "certificate-authority: @FIFO: a FIFO, not a regular file"),
        ({"server": SERVER, "insecure-skip-tls-verify": True},
         {"client-certificate": "FIFO", "client-key": "FIFO"},
         "client-certificate: @FIFO: a FIFO, not a regular file"),
        ({"server": SERVER, "insecure-skip-tls-verify": True},
         {"client-certificate": "/etc/hostname", "client-key": "FIFO"},
         "client-key: @FIFO: a FIFO, not a regular file"),
    ],
    ids=["ca-not-base64", "ca-not-text", "ca-not-pem", "ca-file-missing", "port-out-of-range",
         "port-0",
         "bad-ipv6", "host-with-a-space", "host-empty-label", "host-label-over-63",
         "host-with-a-tab", "cert-not-base64", "cert-file-missing", "token-fifo", "token-dev-zero",
         "token-missing", "token-empty", "token-file-dev-null", "exec", "auth-provider",
         "basic-auth", "proxy", "token-newline",
         "user-a-list", "no-server", "tls-skip-as-text", "token-a-list", "impersonation",
         "key-encrypted", "server-login", "server-query", "ca-fifo", "cert-fifo", "key-fifo"],
)  # fmt: skip
def test_a_kubeconfig_field_that_cannot_be_used_is_named_in_one_line(
    tmp_path: Path, cluster: dict[str, object], user: object, said: str
) -> None:
    fifo = tmp_path / "fifo"  # a FIFO opened blocking waits for a writer for ever
    os.mkfifo(fifo)
    said = said.replace("@FIFO", str(fifo))
    cluster = {k: str(fifo) if v == "FIFO" else v for k, v in cluster.items()}
    if isinstance(user, dict):
        user = {k: str(fifo) if v == "FIFO" else v for k, v in user.items()}
    if isinstance(user, dict) and user.get("client-key") == "ENCRYPTED":  # OpenSSL would prompt
        key, cert = tmp_path / "c.key", tmp_path / "c.crt"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-days", "1", "-subj", "/CN=u",
             "-keyout", str(key), "-out", str(cert), "-passout", "pass:S3cret"],
            check=True, capture_output=True,
        )  # fmt: skip
        user = {"client-certificate": str(cert), "client-key": str(key)}
    kubeconfig, done = _driver_with(tmp_path, cluster, user)

    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"rdma-dra-driver: --kubeconfig {kubeconfig}: "), line
    assert said in line
    assert "S3cret" not in done.stderr


@pytest.mark.parametrize(
    ("status", "body", "said"),
    [
        (200, b"<html>" + b"x" * 5000 + b"</html>", "200, but the answer is not JSON (5013 "),
        (500, json.dumps({"message": "m" * 200_000}).encode(), "… (200000 characters)"),
        (403, json.dumps({"message": f"token Bearer {TOKEN} may not"}).encode(),
         "403 token Bearer <token> may not"),
        (403, json.dumps({"message": f"Bearer {base64.b64encode(TOKEN.encode()).decode()}"})
         .encode(), "403 Bearer <token>"),
        (401, json.dumps({"message": f"bad token {TOKEN[3:]}"}).encode(),
         "401 bad token <token>"),
        (500, json.dumps({"message": f"bad {TOKEN.replace('-', '%2D')} and "
                                     f"{''.join(f'%{b:02x}' for b in TOKEN.encode())}"}).encode(),
         "500 bad <token> and <token>"),
        (403, json.dumps({"message": base64.b64encode(f"Bearer {TOKEN}".encode()).decode()})
         .encode(), "403 QmVhcmVyIF<token>"),  # "Bearer " alone is no secret
        (403, json.dumps({"message": f"bad {TOKEN.replace('-', '&#45;')}"}).encode(),
         "403 bad <token>"),
        (403, json.dumps({"message": f"bad {TOKEN.replace('-', '%252D')}"}).encode(),
         "403 bad <token>"),
        (200, b"[]", "the answer is not a list of ResourceSlices"),
        (200, b"[" * 100_000 + b"]" * 100_000, "the answer is not JSON"),
        (302, b"", "302 Found"),
        (500, json.dumps({"message": "one\nINJECTED two"}).encode(), "500 one\\nINJECTED two"),
        (200, b'{"items": "x"}', "the answer is not a list of ResourceSlices"),
        (200, b'{"items": [{"spec": {}}]}', "the answer is not a list of ResourceSlices"),
        (200, b'{"items": [], "metadata": {"continue": "again"}}',
         "the list of node-a's slices did not end within 100 pages of 50"),
    ],
    ids=["not-json", "huge-error", "echoes-the-token", "echoes-it-base64", "echoes-it-cut-short",
         "echoes-it-percent-encoded", "echoes-the-header-base64", "echoes-it-html-escaped",
         "echoes-it-percent-encoded-twice",
         "a-list", "nested-deep", "a-redirect", "line-break", "items-not-a-list",
         "items-without-metadata", "pages-without-end"],
)  # fmt: skip
async def test_an_odd_api_answer_is_one_bounded_line_and_the_driver_serves_on(
    short_tmp: Path, tree: SysfsTree, status: int, body: bytes, said: str
) -> None:
    api = OddApi(short_tmp, status, body)
    driver = Driver(short_tmp, tree, api.url)
    await driver.start()
    try:
        for _ in range(100):  # the slices' first attempt, then its retry with backoff
            if said in driver.log.read_text():
                break
            await asyncio.sleep(0.1)
        assert driver.proc is not None
        assert driver.proc.returncode is None  # still serving
    finally:
        code = await driver.stop()
        api.close()

    log = driver.log.read_text()
    assert said in log
    assert "Traceback" not in log
    assert TOKEN not in log
    assert max(len(line) for line in log.splitlines()) < 1000
    assert not [line for line in log.splitlines() if line.startswith("INJECTED")]
    assert code == 0


async def test_a_server_whose_host_does_not_resolve_is_named_and_the_driver_serves_on(
    short_tmp: Path, tree: SysfsTree
) -> None:
    driver = Driver(short_tmp, tree, "https://api.nowhere.invalid:6443")
    await driver.start()
    try:
        said = "the server's host api.nowhere.invalid does not resolve ("
        for _ in range(100):
            if said in driver.log.read_text():
                break
            await asyncio.sleep(0.1)
        assert driver.proc is not None
        assert driver.proc.returncode is None  # still serving
    finally:
        assert await driver.stop() == 0

    log = driver.log.read_text()
    assert said in log
    assert "): fix the server; trying again in " in log
    assert "Traceback" not in log


async def test_an_answer_without_end_is_read_up_to_its_bound_and_the_driver_serves_on(
    short_tmp: Path, tree: SysfsTree
) -> None:
    api = OddApi(short_tmp, 200, b"", endless=True)
    driver = Driver(short_tmp, tree, api.url)
    await driver.start()
    try:
        for _ in range(300):
            if "the answer is over 16 MiB: not read further" in driver.log.read_text():
                break
            await asyncio.sleep(0.1)
        assert driver.proc is not None
        assert driver.proc.returncode is None
        status = await asyncio.to_thread(Path(f"/proc/{driver.proc.pid}/status").read_text)
    finally:
        assert await driver.stop() == 0
        api.close()

    assert "the answer is over 16 MiB: not read further" in driver.log.read_text()
    (rss,) = (int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    assert rss < 512 * 1024  # kB: the bound holds (unbounded, it grew by gigabytes)


async def test_a_server_path_prefixes_every_call_as_client_go_does(
    short_tmp: Path, tree: SysfsTree
) -> None:
    """A proxy's cluster path (Rancher's /k8s/clusters/<id>) was dropped: calls went to /apis."""
    api = OddApi(short_tmp, 200, b'{"items": [], "metadata": {"resourceVersion": "5"}}')
    driver = Driver(short_tmp, tree, api.url + "/k8s/clusters/c-abc/")
    await driver.start()
    try:
        for _ in range(100):
            if api.asked:
                break
            await asyncio.sleep(0.1)
    finally:
        assert await driver.stop() == 0
        api.close()

    assert api.asked
    assert all(p.startswith("/k8s/clusters/c-abc/apis/") for p in api.asked), api.asked


async def test_an_answer_that_drips_is_said_while_it_is_read_and_then_used(
    short_tmp: Path, tree: SysfsTree
) -> None:
    slices = b'{"items": []}'  # 13 bytes at 0.6 s each: past the 5 s after which it is said
    api = OddApi(short_tmp, 200, slices, drip=0.6)
    driver = Driver(short_tmp, tree, api.url)
    await driver.start()
    said = "the API server's answer is still coming after 5s ("
    try:
        for _ in range(100):
            if said in driver.log.read_text():
                break
            await asyncio.sleep(0.1)
        early = driver.log.read_text()
        for _ in range(100):  # the slices GET done, the driver goes on to write them
            if len(api.asked) > 1:
                break
            await asyncio.sleep(0.1)
    finally:
        assert await driver.stop() == 0
        api.close()

    assert said in early
    assert "read for up to 30s in all" in early
    assert "took over" not in driver.log.read_text()
    assert api.asked[0].startswith("/apis/resource.k8s.io/v1/resourceslices")
    assert len(api.asked) > 1


async def test_slices_that_cannot_be_watched_are_said_once_and_still_published(
    short_tmp: Path, tree: SysfsTree
) -> None:
    # lists and writes answered, but a watch gets a list too (a proxy that drops ?watch)
    api = OddApi(short_tmp, 200, b'{"items": [], "metadata": {"resourceVersion": "5"}}')
    driver = Driver(short_tmp, tree, api.url)
    await driver.start()
    said = "cannot be watched (GET /apis/resource.k8s.io/v1/resourceslices (watch): the "
    try:
        for _ in range(100):
            if said in driver.log.read_text():
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(4)  # its retries at 1, 2 s: not said again
    finally:
        assert await driver.stop() == 0
        api.close()

    log = driver.log.read_text()
    assert log.count(said) == 1
    assert "answer is not a watch event): a change by anyone else is mended within 60s" in log
    watches = [p for p in api.asked if "watch=true" in p]
    assert len(watches) >= 2  # tried again
    assert all("resourceVersion=5" in p for p in watches)
    assert any(p.startswith("/apis/resource.k8s.io/v1/resourceslices") and "watch" not in p
               for p in api.asked)  # fmt: skip


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


def test_an_empty_token_file_is_named_as_empty(tmp_path: Path) -> None:
    """A projected token not written yet: said as such, not as a token of bad characters."""
    token_file = tmp_path / "token"
    token_file.write_text("\n")

    kubeconfig, done = _driver_with(
        tmp_path,
        {"server": SERVER, "insecure-skip-tls-verify": True},
        {"tokenFile": str(token_file)},
    )

    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"rdma-dra-driver: --kubeconfig {kubeconfig}: tokenFile {token_file}: empty: it must hold "
        "the token"
    ]


@pytest.mark.parametrize("where", ["token", "tokenFile"])
def test_a_token_pasted_as_the_current_context_is_not_said_back(tmp_path: Path, where: str) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    user = {"token": TOKEN} if where == "token" else {"tokenFile": str(token_file)}
    config = _kubeconfig({"server": SERVER}, user)
    kubeconfig.write_text(json.dumps({**config, "current-context": TOKEN}))

    done = subprocess.run(
        [sys.executable, "-m", "plugin.dra", "--discovery", "sysfs", "--node-name", "n1",
         "--kubeconfig", str(kubeconfig)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip

    assert done.returncode == 2
    assert "contexts: the context named '<token>': not there" in done.stderr
    assert TOKEN[:8] not in done.stderr


@pytest.mark.parametrize(("text", "said"), [("", "empty"), ("[1, 2]", "a list, not a mapping")])
def test_a_kubeconfig_that_is_not_a_mapping_says_what_it_is(
    tmp_path: Path, text: str, said: str
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(text)

    done = subprocess.run(
        [sys.executable, "-m", "plugin.dra", "--discovery", "sysfs", "--node-name", "n1",
         "--kubeconfig", str(kubeconfig)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip

    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"rdma-dra-driver: --kubeconfig {kubeconfig}: {said}: name a kubeconfig file"
    ]


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


@pytest.mark.parametrize(
    ("port", "said"),
    [
        ("443", "ca.crt: "),
        ("abc", "KUBERNETES_SERVICE_PORT: text of 3 characters, not a port"),
    ],
    ids=["no-service-account", "port-not-a-number"],
)
def test_in_a_pod_without_its_service_account_the_fix_is_to_mount_it(port: str, said: str) -> None:
    env = {**os.environ, "KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": port}
    done = subprocess.run(
        [sys.executable, "-m", "plugin.dra", "--discovery", "sysfs", "--node-name", "n1"],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip

    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert said in line
    assert "kubeconfig: " not in line
    assert "fix it in the kubeconfig" not in line
    if port == "443":
        assert line.endswith("mount it (automountServiceAccountToken: true), or pass --kubeconfig")


def test_a_cert_and_a_key_that_do_not_match_are_named_together(tmp_path: Path) -> None:
    for name in ("a", "b"):
        subprocess.run(
            ["openssl", "req", "-x509", "-nodes", "-newkey", "rsa:2048", "-days", "1",
             "-subj", f"/CN={name}", "-keyout", str(tmp_path / f"{name}.key"),
             "-out", str(tmp_path / f"{name}.crt")],
            check=True, capture_output=True,
        )  # fmt: skip
    user = {"client-certificate": str(tmp_path / "a.crt"), "client-key": str(tmp_path / "b.key")}
    cluster = {"server": SERVER, "insecure-skip-tls-verify": True}
    _, done = _driver_with(tmp_path, cluster, user)

    assert done.returncode == 2, done.stderr
    assert ": client-certificate and client-key: " in done.stderr


def test_a_client_certificate_without_its_key_says_the_key_is_missing(tmp_path: Path) -> None:
    subprocess.run(
        ["openssl", "req", "-x509", "-nodes", "-newkey", "rsa:2048", "-days", "1",
         "-subj", "/CN=u", "-keyout", str(tmp_path / "c.key"), "-out", str(tmp_path / "c.crt")],
        check=True, capture_output=True,
    )  # fmt: skip
    cluster = {"server": SERVER, "insecure-skip-tls-verify": True}
    _, done = _driver_with(tmp_path, cluster, {"client-certificate": str(tmp_path / "c.crt")})

    assert done.returncode == 2, done.stderr
    assert ": client-certificate: no client key beside it (client-key, or the key in the " in (
        done.stderr
    )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"{}", "metadata"),
        (b'{"metadata": "x"}', "metadata"),
        (b'{"metadata": {"uid": "u-1"}}', "metadata"),  # was "answered ... with 'None/None'"
        (claim([], status="x"), "status"),
        (claim({"a": 1}), "status.allocation.devices.results"),
        (claim(["a"]), "status.allocation.devices.results"),
        (claim([{"driver": DRA_DRIVER, "pool": "node-a", "request": "r"}]),
         "status.allocation.devices.results[0]"),
        (claim([{"driver": DRA_DRIVER, "pool": "node-a", "request": "r", "device": 5}]),
         "status.allocation.devices.results[0]"),
    ],
    ids=["no-metadata", "metadata-text", "metadata-without-name", "status-text",
         "results-mapping", "results-text", "result-without-device", "device-a-number"],
)  # fmt: skip
async def test_a_claim_of_another_shape_is_that_claims_error(
    short_tmp: Path, tree: SysfsTree, body: bytes, field: str
) -> None:
    api = OddApi(short_tmp, 200, body)
    driver = Driver(short_tmp, tree, api.url)
    await driver.start()
    try:
        target = grpc_target(dra_socket(driver.spec.plugins_dir, DRA_DRIVER))
        claim = v1.Claim(namespace="default", uid="u-1", name="c")
        async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
            answer = await v1_grpc.DRAPluginStub(channel).NodePrepareResources(
                v1.NodePrepareResourcesRequest(claims=[claim]), timeout=30
            )
    finally:
        assert await driver.stop() == 0
        api.close()

    error = answer.claims["u-1"].error
    assert error == (
        "claim default/c: the API server's answer is not a ResourceClaim as resource.k8s.io/v1 "
        f"has it (its {field})"
    )
    assert "Traceback" not in driver.log.read_text()


@pytest.mark.parametrize("status", [{}, {"allocation": None}], ids=["no-status", "null"])
async def test_a_claim_not_allocated_is_said_to_be_so(
    short_tmp: Path, tree: SysfsTree, status: dict[str, object]
) -> None:
    """It was said to allocate no device of this driver on this node: allocated elsewhere?"""
    api = OddApi(short_tmp, 200, claim([], status=status))
    _, answer = await _prepared_against(api, short_tmp, tree)

    assert answer.error == (
        "claim default/c is not allocated (it has no status.allocation): the scheduler "
        "allocates a claim before its pod is bound"
    )


_HCA_0 = {"driver": DRA_DRIVER, "pool": "node-a", "request": "r", "device": "hca-0"}


@pytest.mark.parametrize(
    ("allocation", "said"),
    [({"results": [_HCA_0] * 2},
      "claim default/c: its allocation lists device 'hca-0' twice for request r: not used"),
     ({"results": [_HCA_0], "config": [
         {"source": "FromClaim", "opaque": {"driver": DRA_DRIVER, "parameters": {"a": 1}}}]},
      f"claim default/c: its devices' config passes {DRA_DRIVER} parameters (from its claim), "
      "and this driver takes none: remove that config"),
     ({"results": [_HCA_0], "config": [
         {"source": "FromClass", "opaque": {"driver": DRA_DRIVER, "parameters": {}}}]},
      f"claim default/c: its devices' config passes {DRA_DRIVER} parameters (from its "
      "DeviceClass), and this driver takes none: remove that config")],
    ids=["a-result-twice", "config-from-the-claim", "config-from-the-class"],
)  # fmt: skip
async def test_an_allocation_this_driver_cannot_honour_is_that_claims_error_named(
    short_tmp: Path, tree: SysfsTree, allocation: dict[str, object], said: str
) -> None:
    """A device listed twice was "not a ResourceClaim"; parameters for this driver were
    dropped silently, a setting the user believed applied."""
    api = OddApi(short_tmp, 200, claim([], status={"allocation": {"devices": allocation}}))
    _, answer = await _prepared_against(api, short_tmp, tree)

    assert answer.error == said
    assert not answer.devices


async def test_parameters_for_another_driver_are_that_drivers(
    short_tmp: Path, tree: SysfsTree
) -> None:
    config = [{"source": "FromClaim", "opaque": {"driver": "gpu.example.com", "parameters": {}}}]
    allocation = {"results": [_HCA_0], "config": config}
    api = OddApi(short_tmp, 200, claim([], status={"allocation": {"devices": allocation}}))
    _, answer = await _prepared_against(api, short_tmp, tree)

    assert answer.error == ""
    assert [d.device_name for d in answer.devices] == ["hca-0"]


@pytest.mark.parametrize(
    "request_name", ["r\nINJECTED", f"r-{TOKEN}", f"r-{TOKEN.lower()}", "R", "r/s/t"]
)
async def test_a_request_name_that_is_no_dns_label_or_holds_the_token_is_that_claims_error(
    short_tmp: Path, tree: SysfsTree, request_name: str
) -> None:
    """A request's name reaches the kubelet's answer as it is."""
    result = [{"driver": DRA_DRIVER, "pool": "node-a", "request": request_name, "device": "hca-0"}]
    api = OddApi(short_tmp, 200, claim(result))
    driver, answer = await _prepared_against(api, short_tmp, tree)

    assert answer.error == (
        "claim default/c: a request name the API server gives is not a DNS label (or "
        "<request>/<subrequest>), or holds the driver's API token: not used"
    )
    assert not answer.devices
    assert not _record(driver, "u-1").exists()
    assert TOKEN.lower() not in driver.log.read_text().lower()


async def test_a_request_naming_its_subrequest_is_prepared(
    short_tmp: Path, tree: SysfsTree
) -> None:
    result = [{"driver": DRA_DRIVER, "pool": "node-a", "request": "nic/rdma", "device": "hca-0"}]
    api = OddApi(short_tmp, 200, claim(result))
    _, answer = await _prepared_against(api, short_tmp, tree)

    assert answer.error == ""
    assert [list(d.request_names) for d in answer.devices] == [["nic/rdma"]]


async def test_a_prepared_uid_asked_for_under_another_name_is_read_as_named(
    short_tmp: Path, tree: SysfsTree
) -> None:
    """The kubelet names u-1 as claim c2 after it was prepared as c: the answer for c is not
    given from memory; the API's c2 (another UID) makes it that claim's error."""
    result = [{"driver": DRA_DRIVER, "pool": "node-a", "request": "r", "device": "hca-0"}]
    api = OddApi(
        short_tmp,
        200,
        claim(result),
        by_path={"/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/c2":
                 claim(result, uid="u-c2", name="c2")},
    )  # fmt: skip
    driver = Driver(short_tmp, tree, api.url)
    await driver.start()
    try:
        first = await prepare(driver, "u-1")
        again = await prepare(driver, "u-1", "c2")
    finally:
        assert await driver.stop() == 0
        api.close()

    assert first.error == ""
    assert again.error == (
        "claim default/c2 has UID 'u-c2', not u-1: it was deleted and made again"
    )
    assert not again.devices


def _record(driver: Driver, uid: str) -> Path:
    """Where the driver records claim `uid` as prepared."""
    return driver.spec.plugins_dir / DRA_DRIVER / "claims" / f"{uid}.json"


async def test_a_prepare_whose_record_cannot_be_written_leaves_nothing_behind(
    short_tmp: Path, tree: SysfsTree
) -> None:
    """The claim is answered not prepared, its spec removed (nothing would remove it if its
    pod went away before a retry), nothing said prepared; a retry once the record can be
    written succeeds."""
    result = [{"driver": DRA_DRIVER, "pool": "node-a", "request": "r", "device": "hca-0"}]
    api = OddApi(short_tmp, 200, claim(result))
    driver = Driver(short_tmp, tree, api.url)
    record = _record(driver, "u-1")
    spec = driver.spec.cdi_dir / f"{DRA_DRIVER}-u-1.json"
    await driver.start()
    try:
        record.mkdir()  # a record that cannot be written (a full or read-only disk)
        failed = await prepare(driver, "u-1")
        spec_after_failure = spec.exists()
        said_after_failure = driver.log.read_text()
        record.rmdir()
        retried = await prepare(driver, "u-1")
    finally:
        assert await driver.stop() == 0
        api.close()

    assert failed.error == (
        f"claim default/c not prepared: cannot record it in {record.parent}: is a directory, "
        "not a regular file: name a file to write (the kubelet asks again)"
    )
    assert "prepared claim" not in said_after_failure
    assert not spec_after_failure
    assert retried.error == ""
    assert spec.exists()
    assert json.loads(record.read_text()) == {"namespace": "default", "name": "c", "uid": "u-1"}
    assert (
        "INFO plugin.dra.prepare: prepared claim default/c (u-1): hca-0" in driver.log.read_text()
    )


async def test_a_prepare_whose_spec_cannot_be_written_is_not_recorded(
    short_tmp: Path, tree: SysfsTree
) -> None:
    result = [{"driver": DRA_DRIVER, "pool": "node-a", "request": "r", "device": "hca-0"}]
    api = OddApi(short_tmp, 200, claim(result))
    driver = Driver(short_tmp, tree, api.url)
    await driver.start()
    try:
        (driver.spec.cdi_dir / f"{DRA_DRIVER}-u-1.json").mkdir()  # the spec cannot be written
        failed = await prepare(driver, "u-1")
    finally:
        assert await driver.stop() == 0
        api.close()

    assert "u-1.json there is a directory, not a spec: move it away" in failed.error
    assert not _record(driver, "u-1").exists()
    assert "prepared claim default/c (u-1)" not in driver.log.read_text()


async def test_an_unprepare_whose_spec_cannot_be_removed_names_the_cdi_dir_and_why(
    short_tmp: Path, tree: SysfsTree
) -> None:
    """As a prepare that cannot write it says: the flag and the cause, not "[Errno 30] ...";
    the claim stays prepared, so the kubelet's next unprepare removes the spec."""
    result = [{"driver": DRA_DRIVER, "pool": "node-a", "request": "r", "device": "hca-0"}]
    api = OddApi(short_tmp, 200, claim(result))
    driver = Driver(short_tmp, tree, api.url)
    cdi_dir = driver.spec.cdi_dir
    cdi_dir.mkdir(parents=True, exist_ok=True)
    _run("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(cdi_dir))
    await driver.start()
    try:
        assert not (await prepare(driver, "u-1")).error
        _run("mount", "-o", "remount,ro", str(cdi_dir))
        refused = await unprepare(driver, "u-1")
        _run("mount", "-o", "remount,rw", str(cdi_dir))
        again = await unprepare(driver, "u-1")
        left = list(cdi_dir.iterdir())
    finally:
        assert await driver.stop() == 0
        api.close()
        _run("umount", "-l", str(cdi_dir))

    assert refused.error == (
        f"--cdi-dir {cdi_dir}: cannot remove {DRA_DRIVER}-u-1.json there: is on a read-only "
        "file system"
    )
    assert again.error == ""
    assert left == []


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True)


async def test_an_answer_for_another_claim_of_the_same_uid_is_not_used(
    short_tmp: Path, tree: SysfsTree
) -> None:
    result = [{"driver": DRA_DRIVER, "pool": "node-a", "request": "r", "device": "hca-0"}]
    api = OddApi(short_tmp, 200, claim(result, name="someone-elses"))
    _, answer = await _prepared_against(api, short_tmp, tree)

    assert answer.error == (
        "the API server answered for claim default/c with 'default/someone-elses': not used"
    )
    assert not answer.devices


@pytest.mark.parametrize(
    "name",
    [f"echo-{TOKEN}", base64.b64encode(f"Bearer {TOKEN}".encode()).decode()],
    ids=["raw", "base64-of-the-header"],
)
async def test_a_claim_answer_echoing_the_token_is_masked_in_the_answer_and_the_log(
    short_tmp: Path, tree: SysfsTree, name: str
) -> None:
    result = [{"driver": DRA_DRIVER, "pool": "node-a", "request": "r", "device": "hca-0"}]
    api = OddApi(short_tmp, 200, claim(result, name=name))
    driver, answer = await _prepared_against(api, short_tmp, tree)

    assert answer.error.startswith("the API server answered for claim default/c with 'default/")
    assert answer.error.endswith("<token>': not used")
    log = driver.log.read_text()
    assert "<token>': not used" in log
    assert TOKEN not in log + answer.error
    assert name not in log + answer.error


@pytest.mark.parametrize(
    ("namespace", "uid", "name", "said"),
    [
        ("..", "u-1", "c", "the kubelet's claim namespace '..' is not a namespace (a DNS label)"),
        ("default", "../../x", "c", "the kubelet's claim UID '../../x' is not a UID"),
        ("default", "u-1", "c\nINJECTED", "the kubelet's claim name 'c\\nINJECTED' is not a name"),
        ("default", "u-1", "c" * 254, "' (254 characters) is not a name (a DNS subdomain)"),
        ("default", TOKEN, "c", "the kubelet's claim UID holds the driver's API token: not used"),
        (
            "default",
            "u-1",
            f"c-{TOKEN.lower()}",
            "the kubelet's claim name holds the driver's API token: not used",
        ),
    ],
    ids=[
        "namespace-dotdot",
        "uid-a-path",
        "name-line-break",
        "name-too-long",
        "uid-the-token",
        "name-holding-the-token",
    ],
)
async def test_a_claim_named_as_kubernetes_never_names_one_is_that_claims_error(
    short_tmp: Path, tree: SysfsTree, namespace: str, uid: str, name: str, said: str
) -> None:
    api = OddApi(short_tmp, 200, claim([]))  # never asked: the name is refused first
    driver = Driver(short_tmp, tree, api.url)
    await driver.start()
    named = v1.Claim(namespace=namespace, uid=uid, name=name)
    try:
        target = grpc_target(dra_socket(driver.spec.plugins_dir, DRA_DRIVER))
        async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
            stub = v1_grpc.DRAPluginStub(channel)
            prepared = await stub.NodePrepareResources(
                v1.NodePrepareResourcesRequest(claims=[named]), timeout=30
            )
            unprepared = await stub.NodeUnprepareResources(
                v1.NodeUnprepareResourcesRequest(claims=[named]), timeout=30
            )
    finally:
        assert await driver.stop() == 0
        api.close()

    assert said in prepared.claims[uid].error
    assert said in unprepared.claims[uid].error
    assert not prepared.claims[uid].devices
    written = await asyncio.to_thread(
        lambda: list(short_tmp.rglob(f"*{uid.rsplit('/')[-1][-4:]}.json"))
    )
    assert not written  # no file named after the UID anywhere
    log = driver.log.read_text()
    assert TOKEN.lower() not in log.lower()
    assert not [line for line in log.splitlines() if line.startswith("INJECTED")]
    assert "Traceback" not in log


@pytest.mark.parametrize(
    ("pod", "said"),
    [(b'{"spec": "x"}', "the answer's spec is not a mapping"),
     (b'{"spec": {"hostNetwork": true}}', "the name '../p' is not a DNS subdomain"),
     (b'{"metadata": {"uid": "p-2"}, "spec": {"hostNetwork": true}}',
      "its UID is not the one the claim names"),
     (b'{"metadata": {"uid": "p-1"}, "spec": {"hostNetwork": "true"}}',
      "its hostNetwork is not true or false")],
    ids=["spec-text", "pod-name-a-path", "pod-made-again", "host-network-as-text"],
)  # fmt: skip
async def test_a_pod_that_cannot_be_read_gives_its_claim_no_nccl_settings_and_the_claim_is_prepared(
    short_tmp: Path, tree: SysfsTree, pod: bytes, said: str
) -> None:
    name = "../p" if "../p" in said else "p"
    status = {
        "allocation": {"devices": {"results": [
            {"driver": DRA_DRIVER, "pool": "node-a", "request": "r", "device": "hca-0"}]}},
        "reservedFor": [{"resource": "pods", "name": name, "uid": "p-1"}],
    }  # fmt: skip
    api = OddApi(
        short_tmp, 200, claim([], status), by_path={"/api/v1/namespaces/default/pods/p": pod}
    )
    driver, answer = await _prepared_against(api, short_tmp, tree)

    assert answer.error == ""
    assert [d.device_name for d in answer.devices] == ["hca-0"]
    spec = json.loads((driver.spec.cdi_dir / spec_file(DRA_DRIVER, "u-1")).read_text())
    (env,) = {tuple(d["containerEdits"]["env"]) for d in spec["devices"]}
    assert [e for e in env if e.startswith("LINGJUN_RDMA_HCAS=")]
    assert not [e for e in env if e.startswith("NCCL_")]
    log = driver.log.read_text()
    assert (
        "claim default/c: no NCCL settings in its spec: cannot read a pod it is reserved for" in log
    )
    assert said in log
    assert "Traceback" not in log


async def test_pods_read_past_their_bound_give_no_nccl_settings_and_the_claim_is_prepared(
    short_tmp: Path, tree: SysfsTree
) -> None:
    """Each pod read is bounded; all of them are too (they were not: 12 pods answered in 3 s
    each kept the prepare, and every other prepare of the node, waiting 36 s)."""
    # one answer for every pod: each names the UID that answer has
    pods = [{"resource": "pods", "name": f"p{i}", "uid": "p-any"} for i in range(12)]
    status = {
        "allocation": {"devices": {"results": [
            {"driver": DRA_DRIVER, "pool": "node-a", "request": "r", "device": "hca-0"}]}},
        "reservedFor": pods,
    }  # fmt: skip
    api = OddApi(
        short_tmp, 200, b'{"metadata": {"uid": "p-any"}, "spec": {"hostNetwork": true}}',
        by_path={"/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/c":
                 claim([], status)},
        slow_under=("/api/v1/namespaces/default/pods/", POD_READS_WITHIN / 2),
    )  # fmt: skip
    driver, answer = await _prepared_against(api, short_tmp, tree)

    assert answer.error == ""
    assert [d.device_name for d in answer.devices] == ["hca-0"]
    read = [p for p in api.asked if "/pods/" in p]
    assert 2 <= len(read) <= 3, read  # the bound is 2 reads long: the 3rd starts inside it
    spec = json.loads((driver.spec.cdi_dir / spec_file(DRA_DRIVER, "u-1")).read_text())
    (env,) = {tuple(d["containerEdits"]["env"]) for d in spec["devices"]}
    assert not [e for e in env if e.startswith("NCCL_")]
    assert (
        f"claim default/c: no NCCL settings in its spec: {len(read)} of the 12 pods it is "
        f"reserved for read within {POD_READS_WITHIN:g}s"
    ) in driver.log.read_text()


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


def _api_allocating(root: Path, device: str = "hca-0") -> OddApi:
    """An API server that has claim default/c (u-1) allocated `device` of node-a."""
    result = [{"driver": DRA_DRIVER, "pool": "node-a", "request": "r", "device": device}]
    return OddApi(root, 200, claim(result))


@pytest.mark.parametrize(
    ("there", "said"),
    [("dir", "there is a directory, not a spec: move it away"),
     ("fifo", "there is a FIFO, not a spec: move it away"),
     ("notes", "is not a CDI spec of rdma.lingjun-rdma.io/hca")],
    ids=["a-directory", "a-fifo", "someones-file"],
)  # fmt: skip
async def test_what_is_not_our_spec_where_a_claims_spec_goes_is_that_claims_error(
    short_tmp: Path, tree: SysfsTree, there: str, said: str
) -> None:
    api = _api_allocating(short_tmp)
    driver = Driver(short_tmp, tree, api.url)
    path = driver.spec.cdi_dir / spec_file(DRA_DRIVER, "u-1")
    path.parent.mkdir(parents=True)
    if there == "dir":
        path.mkdir()
    elif there == "fifo":
        os.mkfifo(path)
    else:
        path.write_text("someone's notes\n")
    await driver.start()
    try:
        answer = await prepare(driver, "u-1")
        unprepared = await unprepare(driver, "u-1")
    finally:
        assert await driver.stop() == 0
        api.close()

    assert said in answer.error
    assert not answer.devices
    assert unprepared.error == ""  # the claim is done with: the kubelet moves on
    # kept as it was, by the prepare and by the unprepare
    kind = path.lstat().st_mode
    assert {"dir": stat.S_ISDIR, "fifo": stat.S_ISFIFO, "notes": stat.S_ISREG}[there](kind)
    assert there != "notes" or path.read_text() == "someone's notes\n"
    assert f"{path.name} there is " in driver.log.read_text()  # said when kept


async def test_a_stale_spec_of_ours_is_written_again(short_tmp: Path, tree: SysfsTree) -> None:
    api = _api_allocating(short_tmp)
    driver = Driver(short_tmp, tree, api.url)
    await driver.start()
    path = driver.spec.cdi_dir / spec_file(DRA_DRIVER, "u-1")
    try:
        assert (await prepare(driver, "u-1")).error == ""
        written = path.read_text()
        path.write_text(json.dumps({**json.loads(written), "devices": []}))
        answer = await prepare(driver, "u-1")
    finally:
        assert await driver.stop() == 0
        api.close()

    assert answer.error == ""
    assert path.read_text() == written
    assert "claim default/c (u-1): its CDI spec written again (hca-0)" in driver.log.read_text()


@contextlib.contextmanager
def _silent_api() -> Iterator[tuple[str, list[socket.socket]]]:
    """An API server that takes each connection and never answers (not even TLS): its URL and
    the connections it holds."""
    silent = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def take() -> None:
        with contextlib.suppress(OSError):  # closed at the end
            while True:
                held.append(silent.accept()[0])

    threading.Thread(target=take, daemon=True).start()
    try:
        yield f"https://127.0.0.1:{silent.getsockname()[1]}", held
    finally:
        silent.close()
        for connection in held:
            connection.close()


async def _logged(driver: Driver, said: str, seconds: float) -> bool:
    """Whether `said` is in the driver's log within `seconds`."""
    for _ in range(int(seconds * 10)):
        if said in driver.log.read_text():
            return True
        await asyncio.sleep(0.1)
    return said in driver.log.read_text()


async def test_a_silent_api_server_is_said_while_it_is_waited_for(
    short_tmp: Path, tree: SysfsTree
) -> None:
    """It takes the connection and never starts TLS: said after 5 s, not only at the 15 s
    timeout."""
    with _silent_api() as (url, _):
        driver = Driver(short_tmp, tree, url)
        await driver.start()
        said = f"{url.removeprefix('https://')} has not answered after 5s: waiting up to 15s in all"
        try:
            logged = await _logged(driver, said, 10)
        finally:
            assert await driver.stop() == 0

    assert logged


async def test_a_stop_during_a_prepare_waiting_on_a_silent_api_server_is_prompt_and_clean(
    short_tmp: Path, tree: SysfsTree
) -> None:
    with _silent_api() as (url, held):
        driver = Driver(short_tmp, tree, url)
        await driver.start()
        for _ in range(100):  # the slices' first list
            if held:
                break
            await asyncio.sleep(0.05)
        target = grpc_target(dra_socket(driver.spec.plugins_dir, DRA_DRIVER))
        async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
            call = asyncio.ensure_future(
                v1_grpc.DRAPluginStub(channel).NodePrepareResources(
                    v1.NodePrepareResourcesRequest(
                        claims=[v1.Claim(namespace="d", uid="u", name="c")]
                    ),
                    timeout=30,
                )
            )
            for _ in range(100):  # the prepare's read of the claim is waiting on the server
                if len(held) >= 2:
                    break
                await asyncio.sleep(0.05)
            assert len(held) >= 2
            assert driver.proc is not None
            driver.proc.terminate()
            # well inside the API call's 15 s timeout: the stop does not wait for it
            code = await asyncio.wait_for(driver.proc.wait(), 5)
            answer = await call  # answered, so the kubelet asks again once it is back

    assert code == 0
    assert answer.claims["u"].error == STOPPING
    log = driver.log.read_text()
    assert "Traceback" not in log, log[log.find("Traceback") - 500 :]


async def test_a_prepare_the_kubelet_gave_up_on_is_finished_and_said_in_one_line(
    short_tmp: Path, tree: SysfsTree
) -> None:
    """The kubelet's deadline passes while the claim's read waits on a silent API server: the
    read goes on (under the lock: one checkpoint writer) and its end is one log line, not an
    asyncio "Task exception was never retrieved" with two tracebacks."""
    said = "prepare d/c, which the kubelet gave up waiting for: cannot read claim d/c: "
    with _silent_api() as (url, _):
        driver = Driver(short_tmp, tree, url)
        await driver.start()
        try:
            target = grpc_target(dra_socket(driver.spec.plugins_dir, DRA_DRIVER))
            async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
                with pytest.raises(grpc.aio.AioRpcError) as gave_up:
                    await v1_grpc.DRAPluginStub(channel).NodePrepareResources(
                        v1.NodePrepareResourcesRequest(
                            claims=[v1.Claim(namespace="d", uid="u", name="c")]
                        ),
                        timeout=1,
                    )
                assert gave_up.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                await _logged(driver, said, 30)  # the API call's own timeout is 15 s
        finally:
            assert await driver.stop() == 0

    log = driver.log.read_text()
    assert said in log
    assert "never retrieved" not in log
    assert "Traceback" not in log, log[log.find("Traceback") - 500 :]


def test_a_context_naming_a_user_that_is_not_there_is_refused_not_anonymous(
    tmp_path: Path,
) -> None:
    config = _kubeconfig({"server": SERVER, "insecure-skip-tls-verify": True}, {"token": "t"})
    config["users"] = [{"name": "someone-else", "user": {"token": "t"}}]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps(config))

    done = subprocess.run(
        [sys.executable, "-m", "plugin.dra", "--discovery", "sysfs", "--node-name", "n1",
         "--kubeconfig", str(kubeconfig)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip

    assert done.returncode == 2, done.stderr
    assert "users: the user named 'u': not there" in done.stderr


async def _one_run(
    driver: Driver, request: v1.NodePrepareResourcesRequest
) -> v1.NodePrepareResourcesResponse:
    """Start the driver, send it `request`, stop it."""
    await driver.start()
    try:
        target = grpc_target(dra_socket(driver.spec.plugins_dir, DRA_DRIVER))
        async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
            return await v1_grpc.DRAPluginStub(channel).NodePrepareResources(request, timeout=30)
    finally:
        assert await driver.stop() == 0


async def test_the_claims_of_one_request_are_recorded_and_answered_after_a_restart(
    short_tmp: Path, tree: SysfsTree
) -> None:
    """Each claim is recorded before the answer: a restarted driver keeps their specs and
    answers the same (each made afresh from the API), and says none prepared anew."""
    result = [{"driver": DRA_DRIVER, "pool": "node-a", "request": "r", "device": "hca-0"}]
    claims = {f"u-{i}": f"c{i}" for i in range(1, 4)}
    path = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/"
    by_path = {path + name: claim(result, uid=uid, name=name) for uid, name in claims.items()}
    api = OddApi(short_tmp, 200, b"{}", by_path=by_path)
    driver = Driver(short_tmp, tree, api.url)
    request = v1.NodePrepareResourcesRequest(
        claims=[v1.Claim(namespace="default", uid=u, name=n) for u, n in claims.items()]
    )
    try:
        first = await _one_run(driver, request)
        again = await _one_run(driver, request)
    finally:
        api.close()

    assert driver.log.read_text().count("prepared claim ") == 3  # the first run's only
    assert all(_record(driver, u).exists() for u in claims)
    assert all((driver.spec.cdi_dir / spec_file(DRA_DRIVER, u)).exists() for u in claims)
    for answer in (first, again):
        got = {u: (a.error, [d.device_name for d in a.devices]) for u, a in answer.claims.items()}
        assert got == {u: ("", ["hca-0"]) for u in claims}


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
