"""What the DRA driver tells the kubelet is on disk first, and what a run stopped or killed midway
leaves behind is cleaned up by the next one: the driver run from its CLI, met over real gRPC,
stopped with real signals."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
from pathlib import Path

import grpc
import pytest

from plugin.core.kube.sockets import CHANNEL_OPTIONS, grpc_target
from plugin.dra.api.dra.v1 import api_pb2 as v1
from plugin.dra.api.dra.v1 import api_pb2_grpc as v1_grpc
from plugin.dra.prepare import spec_file
from plugin.dra.servicer import STOPPING
from plugin.launch import DRA_DRIVER, cdi_kind, dra_socket
from tests.plugin.dra_driver import Driver, OddApi, claim, prepare, unprepare
from tests.plugin.sysfs_tree import SysfsTree

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/"
RESULT = [{"driver": DRA_DRIVER, "pool": "node-a", "request": "r", "device": "hca-0"}]


def _api(root: Path, n: int, slow: float = 0.0) -> OddApi:
    """An API server with claims default/c1..cN (UIDs u-1..u-N), each allocated hca-0, each
    read taking `slow` seconds."""
    by_path = {f"{CLAIMS}c{i}": claim(RESULT, uid=f"u-{i}", name=f"c{i}") for i in range(1, n + 1)}
    return OddApi(root, 200, claim(RESULT), by_path=by_path, slow_under=(CLAIMS, slow))


def _request(uids_names: list[tuple[str, str]]) -> v1.NodePrepareResourcesRequest:
    return v1.NodePrepareResourcesRequest(
        claims=[v1.Claim(namespace="default", uid=u, name=n) for u, n in uids_names]
    )


def _send(driver: Driver, request: v1.NodePrepareResourcesRequest) -> asyncio.Task[object]:
    async def call() -> v1.NodePrepareResourcesResponse:
        target = grpc_target(dra_socket(driver.spec.plugins_dir, DRA_DRIVER))
        async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
            stub = v1_grpc.DRAPluginStub(channel)
            return await stub.NodePrepareResources(request, timeout=60)

    return asyncio.ensure_future(call())


def _record(driver: Driver, uid: str) -> Path:
    return driver.spec.plugins_dir / DRA_DRIVER / "claims" / f"{uid}.json"


def _spec(driver: Driver, uid: str) -> Path:
    return driver.spec.cdi_dir / spec_file(DRA_DRIVER, uid)


async def test_a_stop_during_a_request_answers_prepared_only_claims_on_disk(
    short_tmp: Path, tree: SysfsTree
) -> None:
    """SIGTERM while a request of 30 claims is prepared one at a time: every claim answered
    prepared has its spec and its record on disk; the rest are answered that the driver stops
    (the kubelet asks again)."""
    api = _api(short_tmp, 30, slow=0.05)
    driver = Driver(short_tmp, tree, api.url)
    await driver.start()
    try:
        sent = _send(driver, _request([(f"u-{i}", f"c{i}") for i in range(1, 31)]))
        for _ in range(1000):  # some claims prepared, most not yet
            if sum(a.startswith(CLAIMS) for a in api.asked) >= 5:
                break
            await asyncio.sleep(0.01)
        assert driver.proc is not None
        driver.proc.send_signal(signal.SIGTERM)
        answer = await sent
        assert await driver.stop() == 0
    finally:
        api.close()

    assert isinstance(answer, v1.NodePrepareResourcesResponse)
    prepared = [u for u, a in answer.claims.items() if a.devices]
    stopped = [u for u, a in answer.claims.items() if a.error == STOPPING]
    assert prepared
    assert stopped
    assert sorted(prepared + stopped) == sorted(f"u-{i}" for i in range(1, 31))
    for uid in prepared:
        assert _record(driver, uid).exists()
        assert _spec(driver, uid).exists()


async def test_a_uid_named_twice_with_two_names_is_refused_whole_and_nothing_of_it_done(
    short_tmp: Path, tree: SysfsTree
) -> None:
    """Answers are keyed by UID: one answer cannot tell two claims apart. It said "failed" for
    a claim it had prepared and recorded."""
    api = _api(short_tmp, 2)
    driver = Driver(short_tmp, tree, api.url)
    await driver.start()
    try:
        sent = _send(driver, _request([("u-1", "c1"), ("u-1", "c2"), ("u-2", "c2")]))
        answer = await sent
    finally:
        assert await driver.stop() == 0
        api.close()

    assert isinstance(answer, v1.NodePrepareResourcesResponse)
    assert answer.claims["u-1"].error == (
        "the kubelet names claim UID u-1 twice, as default/c1 and default/c2: neither is "
        "prepared or unprepared"
    )
    assert not answer.claims["u-1"].devices
    assert not _record(driver, "u-1").exists()
    assert not _spec(driver, "u-1").exists()
    assert answer.claims["u-2"].error == ""  # the request's other claims are served
    assert _record(driver, "u-2").exists()


async def test_a_uid_named_twice_alike_is_prepared_once(short_tmp: Path, tree: SysfsTree) -> None:
    api = _api(short_tmp, 1)
    driver = Driver(short_tmp, tree, api.url)
    await driver.start()
    try:
        answer = await _send(driver, _request([("u-1", "c1"), ("u-1", "c1")]))
    finally:
        assert await driver.stop() == 0
        api.close()

    assert isinstance(answer, v1.NodePrepareResourcesResponse)
    assert [d.device_name for d in answer.claims["u-1"].devices] == ["hca-0"]
    assert driver.log.read_text().count("prepared claim default/c1 (u-1)") == 1


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


async def test_an_unprepare_on_a_full_plugins_dir_removes_the_spec_and_the_record(
    short_tmp: Path, tree: SysfsTree
) -> None:
    """It answered "not unprepared" (the checkpoint could not be rewritten) while the spec was
    already gone. An unprepare now only removes files, which needs no room."""
    api = _api(short_tmp, 1)
    driver = Driver(short_tmp, tree, api.url)
    plugins = driver.spec.plugins_dir
    plugins.mkdir(parents=True)
    _run("mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(plugins))
    try:
        await driver.start()
        try:
            assert (await prepare(driver, "u-1", "c1")).error == ""
            fill = ["dd", "if=/dev/zero", f"of={plugins / 'filler'}", "bs=4k"]
            await asyncio.to_thread(subprocess.run, fill, check=False, capture_output=True)
            assert os.statvfs(plugins).f_bavail == 0
            answer = await unprepare(driver, "u-1")
        finally:
            assert await driver.stop() == 0
        assert answer.error == ""
        assert not _spec(driver, "u-1").exists()
        assert not _record(driver, "u-1").exists()
    finally:
        api.close()
        _run("umount", "-l", str(plugins))


def _spec_text(uid: str, kind: str = cdi_kind(DRA_DRIVER)) -> str:
    return json.dumps({"cdiVersion": "0.6.0", "kind": kind, "devices": [
        {"name": f"{uid}-hca-0", "containerEdits": {"deviceNodes": [], "env": []}}]})  # fmt: skip


async def test_what_a_killed_run_left_is_removed_at_start_and_nothing_else(
    short_tmp: Path, tree: SysfsTree
) -> None:
    """A spec of ours that no record holds was written by a prepare never answered; temp files
    named after our files are ours. Another driver's spec, a file of another kind at our name
    and someone's temp file stay."""
    driver = Driver(short_tmp, tree)
    cdi, records = driver.spec.cdi_dir, driver.spec.plugins_dir / DRA_DRIVER / "claims"
    cdi.mkdir(parents=True)
    records.mkdir(parents=True)
    (records / "u-1.json").write_text('{"namespace": "default", "name": "c1", "uid": "u-1"}')
    (records / ".u-2.json.tmp-k3x9q2ab").write_text('{"nam')
    kept = {
        spec_file(DRA_DRIVER, "u-1"): _spec_text("u-1"),  # recorded
        "nvidia.com-gpu-u-3.json": _spec_text("u-3", "nvidia.com/gpu"),
        spec_file(DRA_DRIVER, "u-4"): _spec_text("u-4", "vendor.example/nic"),
        ".tmp-someones": "x",
        "notes.txt": "x",
    }
    removed = {
        spec_file(DRA_DRIVER, "u-2"): _spec_text("u-2"),  # no record
        f".{spec_file(DRA_DRIVER, 'u-5')}.tmp-a81kq0z2": '{"cdiVe',
    }
    for name, text in {**kept, **removed}.items():
        (cdi / name).write_text(text)
    await driver.start()
    assert await driver.stop() == 0

    assert sorted(p.name for p in cdi.iterdir()) == sorted(kept)
    assert [p.name for p in records.iterdir()] == ["u-1.json"]
    assert f"--cdi-dir {cdi}: removed 1 specs of ours that no prepared claim holds" in (
        driver.log.read_text()
    )


async def test_kills_during_prepares_leave_no_spec_without_its_record(
    short_tmp: Path, tree: SysfsTree
) -> None:
    """kill -9 at random moments of requests of 10 claims each, then a start: every spec of
    ours is a recorded claim's, and no temp file is left (20 kills left 35 specs no entry
    owned, and temp files, for good)."""
    api = _api(short_tmp, 10, slow=0.02)
    driver = Driver(short_tmp, tree, api.url)
    rng = random.Random(7)
    try:
        for _ in range(4):
            await driver.start()
            sent = _send(driver, _request([(f"u-{i}", f"c{i}") for i in range(1, 11)]))
            await asyncio.sleep(rng.uniform(0.05, 0.4))
            assert driver.proc is not None
            driver.proc.kill()
            await driver.proc.wait()
            with contextlib.suppress(grpc.aio.AioRpcError):  # killed: no answer
                await sent
        await driver.start()
        assert await driver.stop() == 0
    finally:
        api.close()

    records = driver.spec.plugins_dir / DRA_DRIVER / "claims"
    specs = [p.name for p in driver.spec.cdi_dir.iterdir()]
    assert all(not n.startswith(".") for n in specs + [p.name for p in records.iterdir()])
    owned = {spec_file(DRA_DRIVER, p.stem) for p in records.iterdir()}
    assert set(specs) <= owned


@pytest.mark.parametrize("gone", ["its-hcas", "the-sysfs-root"])
async def test_a_repeat_prepare_after_the_hcas_are_gone_is_refused_not_answered_from_memory(
    short_tmp: Path, tree: SysfsTree, gone: str
) -> None:
    """A claim prepared in this run was answered again with its old devices, its spec naming
    device nodes that no longer exist."""
    api = _api(short_tmp, 1)
    driver = Driver(short_tmp, tree, api.url)
    driver.spec = dataclasses.replace(driver.spec, rescan_interval=0.2)
    await driver.start()
    try:
        first = await prepare(driver, "u-1", "c1")
        if gone == "its-hcas":
            for hca in (tree.sys / "class" / "infiniband").iterdir():
                shutil.rmtree(hca.resolve())
                hca.unlink()
        else:
            shutil.rmtree(tree.sys)
        for _ in range(50):  # the next scans see it
            again = await prepare(driver, "u-1", "c1")
            if again.error:
                break
            await asyncio.sleep(0.1)
    finally:
        assert await driver.stop() == 0
        api.close()

    assert first.error == ""
    assert not again.devices
    assert again.error == (
        "device 'hca-0' is not on this node now (withdrawn: its HCA is not usable, or the "
        "driver's config changed since the claim was allocated)"
    )


async def test_an_earlier_versions_checkpoint_becomes_records_and_its_specs_stay(
    short_tmp: Path, tree: SysfsTree
) -> None:
    driver = Driver(short_tmp, tree)
    own = driver.spec.plugins_dir / DRA_DRIVER
    own.mkdir(parents=True)
    entry = {"namespace": "default", "name": "c1", "devices": [], "spec": {}}
    (own / "checkpoint.json").write_text(json.dumps({"version": 1, "claims": {"u-1": entry}}))
    driver.spec.cdi_dir.mkdir(parents=True)
    _spec(driver, "u-1").write_text(_spec_text("u-1"))
    await driver.start()
    assert await driver.stop() == 0

    assert json.loads(_record(driver, "u-1").read_text()) == {
        "namespace": "default",
        "name": "c1",
        "uid": "u-1",
    }
    assert not (own / "checkpoint.json").exists()
    assert _spec(driver, "u-1").exists()  # a live claim's: not taken for a leftover


@pytest.mark.parametrize(
    ("there", "said"),
    [("garbage", "cannot be read (not a checkpoint of this driver (JSONDecodeError)): removed"),
     ("fifo", "cannot be read (a FIFO, not a regular file): removed"),
     ("dir", "cannot be removed (Is a directory), nor read (")],
)  # fmt: skip
async def test_an_earlier_checkpoint_that_cannot_be_read_is_said_and_the_driver_serves(
    short_tmp: Path, tree: SysfsTree, there: str, said: str
) -> None:
    driver = Driver(short_tmp, tree)
    legacy = driver.spec.plugins_dir / DRA_DRIVER / "checkpoint.json"
    legacy.parent.mkdir(parents=True)
    if there == "garbage":
        legacy.write_text("{not json")
    elif there == "fifo":
        os.mkfifo(legacy)
    else:
        legacy.mkdir()
    await driver.start()  # served: nothing blocked on it
    assert await driver.stop() == 0

    assert f"{legacy} {said}" in driver.log.read_text()
    assert legacy.exists() == (there == "dir")


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
