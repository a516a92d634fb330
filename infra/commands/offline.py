"""The offline engine: the program run under Pulumi's mock engine, every registration recorded
with its inputs as the engine received them (the render's and the tests' source of truth)."""

from __future__ import annotations

import asyncio
import atexit
import functools
import hashlib
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, cast

import pulumi
from pulumi.runtime.mocks import MockMonitor

from infra.program import main as program_main
from infra.stack.credentials import SECRET
from infra.stack.keys import PROJECT

# How Pulumi's wire format marks a secret value inside resource inputs.
_SIG_KEY = "4dabf18193072939515e22adb298388d"
_SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"
# What the mocked ACK credential call returns in place of a real kubeconfig.
OFFLINE_KUBECONFIG = "apiVersion: v1\nkind: Config\n# offline render: ACK returns the real one\n"


class RenderError(RuntimeError):
    """The program's plan cannot be rendered correctly; nothing was written."""


@dataclass(frozen=True)
class Registered:
    """One resource the program registered, with its inputs as the engine received them."""

    type: str
    name: str
    inputs: dict[str, Any]
    custom: bool

    @property
    def is_kubernetes_object(self) -> bool:
        return self.custom and self.type.startswith("kubernetes:")


ACR_INSTANCES = "alicloud:cs/getRegistryEnterpriseInstances:getRegistryEnterpriseInstances"


@dataclass
class RecordingMocks(pulumi.runtime.Mocks):
    """Records every registration; echoes inputs as outputs, plus what a real provider adds."""

    resources: list[Registered] = field(default_factory=list[Registered])

    def new_resource(
        self, args: pulumi.runtime.MockResourceArgs
    ) -> tuple[str | None, dict[Any, Any]]:
        inputs = cast(
            dict[str, Any],
            args.inputs,  # pyright: ignore[reportUnknownMemberType]
        )
        self.resources.append(Registered(args.typ, args.name, inputs, bool(args.custom)))
        state = dict(inputs)
        if args.typ == "docker-build:index:Image":
            digest = hashlib.sha256(args.name.encode()).hexdigest()
            state["ref"] = f"{inputs['tags'][0]}@sha256:{digest}"
        if args.typ == "alicloud:eflo/nodeGroup:NodeGroup":
            # terraform-provider-alicloud: the ID is "<cluster id>:<group id>"; the bare group id
            # is the nodeGroupId output (resource_alicloud_eflo_node_group.go, SetId / Set)
            state["nodeGroupId"] = f"{args.name}-group"
            return f"{inputs['clusterId']}:{state['nodeGroupId']}", state
        return f"{args.name}-id", state

    def call(
        self, args: pulumi.runtime.MockCallArgs
    ) -> tuple[dict[Any, Any], list[tuple[str, str]] | None]:
        if args.token == "alicloud:cs/getClusterCredential:getClusterCredential":
            call_args = cast(
                dict[str, Any],
                args.args,  # pyright: ignore[reportUnknownMemberType]
            )
            cluster_id = str(call_args["clusterId"])
            return {"clusterId": cluster_id, "kubeConfig": OFFLINE_KUBECONFIG}, []
        if args.token == ACR_INSTANCES:
            call_args = cast(
                dict[str, Any],
                args.args,  # pyright: ignore[reportUnknownMemberType]
            )
            (instance_id,) = call_args["ids"]
            # offline stand-in for "<instance name>-registry.<region>.cr.aliyuncs.com"
            endpoint = f"{instance_id}-registry.cr.aliyuncs.com"
            instance = {"id": instance_id, "publicEndpoints": [endpoint], "vpcEndpoints": []}
            return {"ids": [instance_id], "instances": [instance]}, []
        return {}, []


class RecordingMonitor(MockMonitor):
    """The mock engine's monitor, keeping what mocks are not shown: custom timeouts."""

    def __init__(self, mocks: RecordingMocks) -> None:
        super().__init__(mocks)
        # (type, name) -> {"create": "10m", ...}, for resources that set any
        self.timeouts: dict[tuple[str, str], dict[str, str]] = {}

    def RegisterResource(self, request: Any) -> Any:  # noqa: N802 (the monitor's RPC name)
        t = request.customTimeouts
        chosen = {k: str(getattr(t, k)) for k in ("create", "update", "delete") if getattr(t, k)}
        if chosen:
            self.timeouts[(str(request.type), str(request.name))] = chosen
        return super().RegisterResource(request)  # pyright: ignore[reportUnknownMemberType]


@dataclass(frozen=True)
class RunResult:
    resources: list[Registered]
    # export name -> (value, is_secret)
    outputs: dict[str, tuple[Any, bool]]
    # (type, name) -> custom timeouts, for resources that set any
    timeouts: dict[tuple[str, str], dict[str, str]]


def run_program(
    stack: str,
    config: dict[str, str],
    secret_keys: list[str],
    mocks: RecordingMocks | None = None,
) -> RunResult:
    """Run main() under the mock engine with this config; raises what main() raises."""
    mocks = mocks if mocks is not None else RecordingMocks()
    monitor = RecordingMonitor(mocks)
    # before set_mocks, which binds futures to the current loop; pytest-asyncio leaves none set
    asyncio.set_event_loop(_mock_engine_loop())
    pulumi.runtime.set_mocks(mocks, project=PROJECT, stack=stack, preview=False, monitor=monitor)
    pulumi.runtime.set_all_config(config, secret_keys)
    outputs: dict[str, tuple[Any, bool]] = {}

    async def collect(exports: dict[str, pulumi.Output[Any]]) -> None:
        for key, output in exports.items():
            outputs[key] = (await output.future(), await output.is_secret())

    def program() -> Any:
        return collect(program_main())

    pulumi.runtime.test(program)()  # pyright: ignore[reportUnknownMemberType]
    return RunResult(
        resources=list(mocks.resources), outputs=outputs, timeouts=dict(monitor.timeouts)
    )


@functools.cache
def _mock_engine_loop() -> asyncio.AbstractEventLoop:
    """The one event loop of every mocked run in this process (Pulumi keeps Outputs across runs
    that stay bound to the loop they began on), closed at exit with the loop of each worker
    thread the mock monitor's calls run on: Pulumi sets one on each and never closes it, and an
    unclosed loop left to the garbage collector is reported inside whatever runs then."""
    worker_loops: list[asyncio.AbstractEventLoop] = []

    def give_worker_a_loop() -> None:
        worker_loops.append(worker_loop := asyncio.new_event_loop())
        asyncio.set_event_loop(worker_loop)

    loop = asyncio.new_event_loop()
    executor = ThreadPoolExecutor(initializer=give_worker_a_loop)
    loop.set_default_executor(executor)

    @atexit.register
    def close() -> None:  # pyright: ignore[reportUnusedFunction]
        executor.shutdown()
        for each in (*worker_loops, loop):
            each.close()

    return loop


def normalize(value: Any) -> Any:
    """Engine inputs as plain data: secrets as [secret], keys sorted, whole numbers as int.

    The engine's wire format (protobuf Struct) carries every number as a double and no key order.
    """
    if isinstance(value, dict):
        d = cast(dict[str, Any], value)
        if d.get(_SIG_KEY) == _SECRET_SIG:
            return _hide(normalize(d["value"]))
        return {k: normalize(d[k]) for k in sorted(d)}
    if isinstance(value, list):
        return [normalize(v) for v in cast(list[Any], value)]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _hide(value: Any) -> Any:
    """A secret's shape with every value replaced, so a hidden Secret still passes the schema."""
    if isinstance(value, dict):
        return {k: _hide(v) for k, v in cast(dict[str, Any], value).items()}
    if isinstance(value, list):
        return [_hide(v) for v in cast(list[Any], value)]
    return SECRET


def _manifest(inputs: dict[str, Any]) -> dict[str, Any]:
    """A Kubernetes object in the usual order: apiVersion, kind, metadata, then the rest."""
    body = normalize(inputs)
    head = {k: body.pop(k) for k in ("apiVersion", "kind", "metadata") if k in body}
    return {**head, **body}


def check_unique(result: RunResult) -> None:
    """Mocks accept duplicate URNs and the real engine refuses them: check names here."""
    urns = Counter((r.type, r.name) for r in result.resources)
    objects = Counter(object_id(r.inputs) for r in result.resources if r.is_kubernetes_object)
    dupes = [f"{t} {n}" for (t, n), c in urns.items() if c > 1]
    dupes += [f"Kubernetes object {o}" for o, c in objects.items() if c > 1]
    if dupes:
        raise RenderError("duplicate names: " + "; ".join(sorted(dupes)))


def object_id(manifest: dict[str, Any]) -> str:
    meta = manifest.get("metadata", {})
    ns = meta.get("namespace", "")
    return f"{manifest['kind']}/{ns + '/' if ns else ''}{meta.get('name', '')}"


def manifests(result: RunResult) -> list[dict[str, Any]]:
    """Every Kubernetes object, secrets redacted, in registration order."""
    return [_manifest(r.inputs) for r in result.resources if r.is_kubernetes_object]
