"""The kubelet's prepare and unprepare of claims, and what the driver makes of the claim the
API server gives: a claim it cannot read, of another shape, not allocated, allocated what this
driver cannot honour, with odd request names, named as Kubernetes never names one, or answered
for another claim, is that claim's error (never quoting the token), and the driver serves on."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import grpc
import pytest

from plugin.core.kube.sockets import CHANNEL_OPTIONS, grpc_target
from plugin.dra.api.dra.v1 import api_pb2 as v1
from plugin.dra.api.dra.v1 import api_pb2_grpc as v1_grpc
from plugin.dra.api.dra.v1beta1 import api_pb2 as v1beta1
from plugin.dra.api.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from plugin.launch import DRA_DRIVER, dra_socket
from tests.plugin.dra_driver import TOKEN, Driver, OddApi, _prepared_against, claim, prepare
from tests.plugin.sysfs_tree import SysfsTree


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


def _record(driver: Driver, uid: str) -> Path:
    """Where the driver records claim `uid` as prepared."""
    return driver.spec.plugins_dir / DRA_DRIVER / "claims" / f"{uid}.json"


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
