"""The CDI spec the DRA driver writes for a prepared claim: its NCCL settings from the pods
the claim is reserved for (none when a pod cannot be read, or the reads take too long, and the
claim still prepared), what is not our spec where one goes kept and said, a stale one of ours
written again, and one that cannot be removed named with --cdi-dir and why."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from plugin.dra.prepare import POD_READS_WITHIN, spec_file
from plugin.launch import DRA_DRIVER
from tests.plugin.dra_driver import Driver, OddApi, _prepared_against, claim, prepare, unprepare
from tests.plugin.sysfs_tree import SysfsTree


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
