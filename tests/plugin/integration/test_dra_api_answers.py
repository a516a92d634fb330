"""The DRA driver and an API server that answers oddly or not at all: an odd answer is one
bounded line with the token masked, an answer without end or one that drips is bounded and
said, a host that does not resolve or a server that stays silent is said while the driver serves
on (and a stop or the kubelet's deadline meanwhile stays clean); a server's path prefixes every
call; slices that cannot be watched are said once and still published."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from plugin.core.kube.sockets import CHANNEL_OPTIONS, grpc_target
from plugin.dra.api.dra.v1 import api_pb2 as v1
from plugin.dra.api.dra.v1 import api_pb2_grpc as v1_grpc
from plugin.dra.servicer import STOPPING
from plugin.launch import DRA_DRIVER, dra_socket
from tests.plugin.dra_driver import TOKEN, Driver, OddApi
from tests.plugin.sysfs_tree import SysfsTree


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
