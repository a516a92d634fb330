"""Offline render: run the program under Pulumi's mock engine, write every manifest and plan.md.

    python -m infra.render --stack dev --out out/dev [--set KEY=VALUE]...

No Pulumi CLI and no credentials: the stack's YAML and Pulumi.yaml's defaults are loaded here
(mocks read neither), every Kubernetes object is checked against the Kubernetes 1.34 schema, and
the output directory is replaced only when everything succeeded.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import kubernetes_validate  # pyright: ignore[reportMissingTypeStubs]
import pulumi
import yaml
from kubernetes_validate.utils import (  # pyright: ignore[reportMissingTypeStubs]
    ValidationError as SchemaError,
)
from pulumi.runtime.mocks import MockMonitor

from infra.config import CREDENTIAL_KEYS, PROJECT, PROJECT_DIR, StackConfigError
from infra.jobs import JobSpecError
from infra.program import main as program_main
from plugin.config import ConfigError

KUBERNETES_VERSION = "1.34.0"
SECRET = "[secret]"
# How Pulumi's wire format marks a secret value inside resource inputs.
_SIG_KEY = "4dabf18193072939515e22adb298388d"
_SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"
# What the mocked ACK credential call returns in place of a real kubeconfig.
OFFLINE_KUBECONFIG = "apiVersion: v1\nkind: Config\n# offline render: ACK returns the real one\n"


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (scripts, the plugin's config file) as literal blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar(  # pyright: ignore[reportUnknownMemberType]
        "tag:yaml.org,2002:str", value, style=style
    )


_Dumper.add_representer(str, _str)


class RenderError(RuntimeError):
    """The render cannot produce a correct output; nothing was written."""


class InputError(RenderError):
    """A stack file or the output directory the command refuses (exit 2); nothing was written."""


# Written into every directory a render makes: only such a directory is ever replaced.
MARKER = ".lingjun-render"


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


def stack_config(
    stack: str, overrides: list[str] | None = None, project_dir: Path = PROJECT_DIR
) -> tuple[dict[str, str], list[str]]:
    """Pulumi.yaml defaults, then stacks/Pulumi.<stack>.yaml, then KEY=VALUE overrides."""
    stack_file = project_dir / "stacks" / f"Pulumi.{stack}.yaml"
    if not stack_file.is_file():
        known = sorted(p.name.split(".")[1] for p in (project_dir / "stacks").glob("Pulumi.*.yaml"))
        raise RenderError(f"--stack {stack}: no {stack_file}; stacks: {', '.join(known)}")
    defaults = _config_section(project_dir / "Pulumi.yaml", required=False)
    values = _config_section(stack_file, required=True)
    config: dict[str, str] = {}
    secret_keys: list[str] = []
    for key, schema in defaults.items():
        if isinstance(schema, dict) and "default" in schema:
            config[_qualify(key)] = _as_config_string(schema["default"])
    for key, value in values.items():
        if isinstance(value, dict) and "secure" in value:
            # Only the Pulumi CLI can decrypt; the render shows where a secret goes, not its value.
            config[_qualify(key)] = SECRET
            secret_keys.append(_qualify(key))
        else:
            config[_qualify(key)] = _as_config_string(value)
    for item in overrides or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise RenderError(f"--set {item!r}: expected KEY=VALUE, e.g. --set nonHostNetwork=true")
        config[_qualify(key)] = value
        if key in CREDENTIAL_KEYS and _qualify(key) not in secret_keys:
            # as `pulumi config set --secret` would store it
            secret_keys.append(_qualify(key))
    return config, secret_keys


def _config_section(path: Path, *, required: bool) -> dict[str, Any]:
    """The `config:` mapping of a Pulumi project or stack file, or InputError in one line."""
    where = path.relative_to(PROJECT_DIR) if path.is_relative_to(PROJECT_DIR) else path
    try:
        doc: Any = yaml.safe_load(path.read_text())
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise InputError(f"{where}: {at}{exc.problem or exc}") from None
    except (yaml.YAMLError, OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{where}: {exc}") from None
    if doc is None:
        if required:
            raise InputError(f"{where}: empty: it needs a `config:` mapping of the stack's keys")
        return {}
    if not isinstance(doc, dict):
        found = type(doc).__name__
        raise InputError(f"{where}: a {found}, not a mapping with a `config:` key")
    config: Any = cast(dict[str, Any], doc).get("config") or {}
    if not isinstance(config, dict):
        found = type(config).__name__
        raise InputError(f"{where}: `config:` is a {found}, not a mapping of keys to values")
    return cast(dict[str, Any], config)


def _qualify(key: str) -> str:
    return key if ":" in key else f"{PROJECT}:{key}"


def _as_config_string(value: Any) -> str:
    """Config values as the Pulumi CLI hands them to a program: strings, JSON for structures."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | dict):
        return json.dumps(value)
    return str(value)


def run_program(
    stack: str,
    config: dict[str, str],
    secret_keys: list[str],
    mocks: RecordingMocks | None = None,
) -> RunResult:
    """Run main() under the mock engine with this config; raises what main() raises."""
    mocks = mocks if mocks is not None else RecordingMocks()
    monitor = RecordingMonitor(mocks)
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
    objects = Counter(_object_id(r.inputs) for r in result.resources if r.is_kubernetes_object)
    dupes = [f"{t} {n}" for (t, n), c in urns.items() if c > 1]
    dupes += [f"Kubernetes object {o}" for o, c in objects.items() if c > 1]
    if dupes:
        raise RenderError("duplicate names: " + "; ".join(sorted(dupes)))


def _object_id(manifest: dict[str, Any]) -> str:
    meta = manifest.get("metadata", {})
    ns = meta.get("namespace", "")
    return f"{manifest['kind']}/{ns + '/' if ns else ''}{meta.get('name', '')}"


def manifests(result: RunResult) -> list[dict[str, Any]]:
    """Every Kubernetes object, secrets redacted, in registration order."""
    return [_manifest(r.inputs) for r in result.resources if r.is_kubernetes_object]


def validate(manifest: dict[str, Any]) -> None:
    """Strict schema check against Kubernetes 1.34 (bundled schemas, no network)."""
    try:
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
    except SchemaError as exc:
        path = ".".join(str(p) for p in exc.path)
        raise RenderError(f"{_object_id(manifest)}: {path or '(top)'}: {exc.message}") from None


def file_name(manifest: dict[str, Any]) -> str:
    meta = manifest.get("metadata", {})
    parts = [manifest["kind"].lower(), meta.get("namespace"), meta.get("name")]
    return "-".join(p for p in parts if p) + ".yaml"


def plan_markdown(stack: str, result: RunResult, files: list[str]) -> str:
    """Cloud resources with their inputs, the Kubernetes files, and the stack outputs."""
    lines = [
        f"# Plan: stack `{stack}` (offline render, Pulumi mocks)",
        "",
        "## Cloud resources",
        "",
    ]
    # Registration order varies between runs (resources resolve concurrently): sort by name.
    cloud = sorted(
        (r for r in result.resources if r.custom and not r.is_kubernetes_object),
        key=lambda r: (r.name, r.type),
    )
    if not cloud:
        lines.append("(none: this stack adopts an existing cluster)")
    for r in cloud:
        lines += [f"### `{r.name}` ({r.type})", "", "```yaml"]
        lines.append(yaml.safe_dump(normalize(r.inputs), sort_keys=True).rstrip())
        lines += ["```", ""]
    lines += ["", "## Kubernetes objects", ""]
    lines += [f"- `{f}`" for f in sorted(files)]
    lines += ["", "## Outputs", "", "| output | value |", "| --- | --- |"]
    for key, (value, secret) in result.outputs.items():
        shown = SECRET if secret else json.dumps(value)
        lines.append(f"| `{key}` | `{shown}` |")
    return "\n".join(lines) + "\n"


def check_out(out: Path) -> None:
    """`out` must be new, empty, or a previous render's (it holds MARKER): render replaces it
    as a whole, and must never delete what it did not write."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise InputError(f"--out {out}: not a directory: name a new or empty directory")
    if out.is_dir():
        try:
            entries = sorted(p.name for p in out.iterdir())
        except OSError as exc:
            raise InputError(f"--out {out}: {exc.strerror}") from None
        if entries and MARKER not in entries:
            shown = ", ".join(entries[:3]) + (", …" if len(entries) > 3 else "")
            raise InputError(
                f"--out {out}: holds files a render did not write ({shown}): it would be "
                "replaced as a whole; name a new or empty directory, or one a render wrote"
            )


def render(stack: str, out: Path, overrides: list[str] | None = None) -> list[Path]:
    """Render the stack into `out` (replaced as a whole, only on success); returns the files."""
    out = out.resolve()
    check_out(out)
    config, secret_keys = stack_config(stack, overrides)
    result = run_program(stack, config, secret_keys)
    check_unique(result)
    objects = manifests(result)
    for manifest in objects:
        validate(manifest)
    try:
        _write(out, stack, result, objects)
    except OSError as exc:
        raise InputError(f"--out {out}: {exc.strerror}: {exc.filename or out}") from None
    return sorted(out.iterdir())


def _write(out: Path, stack: str, result: RunResult, objects: list[dict[str, Any]]) -> None:
    """Write into a new directory beside `out`, then swap it in: `out` holds either the old
    render or the new one, never a mix."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    old = staging.with_name(staging.name + ".old")
    try:
        names = [file_name(m) for m in objects]
        for name, manifest in zip(names, objects, strict=True):
            (staging / name).write_text(yaml.dump(manifest, Dumper=_Dumper, sort_keys=False))
        (staging / "plan.md").write_text(plan_markdown(stack, result, names))
        (staging / MARKER).write_text(f"written by python -m infra.render --stack {stack}\n")
        if out.exists():
            out.rename(old)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if old.exists() and not out.exists():
            old.rename(out)
        raise
    shutil.rmtree(old, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.render", description=__doc__)
    parser.add_argument("--stack", required=True, help="dev, staging, prod or local")
    parser.add_argument("--out", type=Path, required=True, help="directory to (re)write")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key of the stack, e.g. --set nonHostNetwork=true",
    )
    args = parser.parse_args(argv)
    try:
        files = render(args.stack, args.out, args.set)
    except InputError as exc:
        print(f"render: {args.stack}: error: {exc}", file=sys.stderr)
        return 2
    except (RenderError, StackConfigError, JobSpecError, ConfigError) as exc:
        print(f"render: {args.stack}: error:\n{exc}", file=sys.stderr)
        return 1
    print(f"render: {args.stack}: wrote {len(files)} files to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
