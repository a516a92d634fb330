"""The stack's config keys: the catalogue (one typed model of every key of the namespace;
defaults live in Pulumi.yaml), how a user spells each key and the command that fixes it, and the
duration keys' ranges."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, SecretStr
from pydantic.alias_generators import to_camel

from common.userfiles import MAX_DIGITS, described, nearest_key
from infra.stack.samples import SAMPLES

PROJECT = "lingjun-rdma"
PROJECT_DIR = Path(__file__).resolve().parents[2]  # Pulumi.yaml, stacks/
# Which config key holds each sample Job's image, from the catalogue.
IMAGE_KEYS = {s.image_key: name for name, s in SAMPLES.items()}


class StackConfigError(ValueError):
    """Stack config the program refuses; each line names the key and the command that fixes it."""


def qualified(name: str) -> str:
    return f"{PROJECT}:{name}"


def config_set(name: str, value: str) -> str:
    return f"(pulumi config set {qualified(name)} {value})"


def config_set_items(name: str, items: Sequence[str] | None = None) -> str:
    """The fix for a list key: the CLI refuses a JSON string for an `array<string>` key, so
    the items are set one index at a time (render's --set takes the list as JSON). `items`: the
    list to set (none left: remove the key); else an example of one item."""
    if items is not None and not items:
        return f"(pulumi config rm {qualified(name)}; render: --set '{name}=[]')"
    shown = list(items) if items is not None else [LIST_KEYS[name]]
    paths = "; ".join(
        f"pulumi config set --path '{qualified(name)}[{i}]' {v}" for i, v in enumerate(shown)
    )
    then = ", then [1], ..." if items is None else ""
    rm = f"pulumi config rm {qualified(name)}; " if items is not None else ""
    return f"({rm}{paths}{then}; render: --set '{name}={json.dumps(shown)}')"


def _true_or_false(value: object) -> object:
    """Pulumi's `boolean` is the text true or false; pydantic alone would take yes, on, 1."""
    if isinstance(value, str) and value not in ("true", "false"):
        raise ValueError("not a boolean: use true or false")
    return value


Flag = Annotated[bool, BeforeValidator(_true_or_false)]


def _digits(value: object) -> object:
    """Pulumi's `integer` is written in decimal digits; Python's int() would also take 5_0,
    ' 5', '+5' and other scripts' digits."""
    digits = value.removeprefix("-") if isinstance(value, str) else "0"  # -1: out of range
    if not (digits.isascii() and digits.isdigit()):
        raise ValueError("not a whole number: write it in the digits 0-9 only")
    if len(digits) > MAX_DIGITS >= len(digits.lstrip("0")):  # 000…01: 1 to int(), a slip here
        raise ValueError(f"{len(digits)} digits, mostly leading zeros: write it without them")
    if len(digits) > MAX_DIGITS:  # past int64, and past 4300 Python's int() refuses in its words
        raise ValueError(f"a number of {len(digits)} digits (at most {MAX_DIGITS})")
    return value


Whole = Annotated[int, BeforeValidator(_digits)]


# What watches the plugin: nothing, a Prometheus Operator in the cluster, or ACK's ARMS.
Monitoring = Literal["none", "prometheusOperator", "arms"]


class Keys(BaseModel):
    """Every key of the `lingjun-rdma` namespace but the sample images, as typed values;
    defaults live in Pulumi.yaml's schema."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True
    )

    region: str
    cluster_mode: Literal["create", "existing"]
    cluster_id: str | None = None
    kubeconfig: SecretStr | None = None
    kubernetes_version: str | None = None
    zone_ids: tuple[str, ...]
    vpc_cidr: str
    vswitch_cidrs: tuple[str, ...]
    service_cidr: str
    ipv6: Flag
    compute_network_ipv6: Flag
    lingjun_cluster_id: str | None = None
    lingjun_node_group_id: str | None = None
    lingjun_machine_type: str | None = None
    lingjun_image_id: str | None = None
    lingjun_hpn_zone: str | None = None
    lingjun_node_count: Whole
    non_host_network: Flag
    rdma_resource_name: str
    rdma_max_allocations: Whole
    rdma_pool_mode: Literal["shared", "exclusive"]
    rdma_api: Literal["devicePlugin", "dra"]
    rdma_rescan_interval: Whole
    rdma_port_counters: Flag
    rdma_pod_qps: Flag
    rdma_monitoring: Monitoring
    agent_node_selector: str | None = None
    namespace: str
    plugin_image: str | None = None
    plugin_image_build: Flag
    acr_instance_id: str | None = None
    registry_username: str | None = None
    registry_password: SecretStr | None = None
    sample_jobs: tuple[str, ...]
    job_await_timeout: str | None = None
    plugin_await_timeout: str

    @property
    def creates_cluster(self) -> bool:
        return self.cluster_mode == "create"


# A duration of whole hours, minutes and seconds (1h30m): what Pulumi's custom timeouts (Go's
# durations) and activeDeadlineSeconds share.
_DURATION = re.compile(r"(?=[0-9])(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?")
# The range of each duration key, in seconds: a day for one DaemonSet rollout, a week for a
# sample Job (activeDeadlineSeconds); from 1 s, what a test of the deadline itself needs.
DURATION_RANGES = {"pluginAwaitTimeout": (1, 86400), "jobAwaitTimeout": (1, 7 * 86400)}


def seconds(key: str, text: str, example: str) -> tuple[int | None, list[str]]:
    """A duration key's value in seconds, or the problem with it."""
    low, high = DURATION_RANGES[key]
    match = _DURATION.fullmatch(text)
    if match is None:
        why = (
            f"not a duration like {example}: whole hours, minutes and seconds, in that order "
            f"(1h30m, not 1.5h) (got {described(text)})"
        )
    else:  # digits bounded before int(): Python refuses over 4300 of them
        parts = [(n or "0", size) for n, size in zip(match.groups(), (3600, 60, 1), strict=True)]
        too_long = any(len(n) > 9 for n, _ in parts)
        seconds = high + 1 if too_long else sum(int(n) * size for n, size in parts)
        if low <= seconds <= high:
            return seconds, []
        why = f"not within {format_seconds(low)}..{format_seconds(high)}"
    return None, [f"{qualified(key)}: {why} {config_set(key, example)}"]


def format_seconds(seconds: int) -> str:
    """The largest whole unit: 86400 -> 24h, 90 -> 90s."""
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


# The list keys, each with an example item for the fix of a refusal.
LIST_KEYS = {
    "zoneIds": "cn-wulanchabu-c",
    "vswitchCidrs": "192.168.0.0/20",
    "sampleJobs": "perftest",
}
KNOWN_KEYS = {f.alias or to_camel(n) for n, f in Keys.model_fields.items()} | set(IMAGE_KEYS)


def known_keys() -> frozenset[str]:
    """The keys of the namespace, as a user spells them (`rdmaPoolMode`)."""
    return frozenset(KNOWN_KEYS)


def _near(namespace: str, project: str) -> bool:
    """A misspelling of the project's name, in any letter case (Pulumi's keys are case-sensitive:
    `Lingjun-RDMA:` is another namespace)."""
    return difflib.SequenceMatcher(None, namespace.lower(), project.lower()).ratio() >= 0.75


# The providers the program makes explicitly: their own config namespaces are read by no one.
_PROVIDERS = {
    "alicloud": f"{qualified('region')} and the credentials in the environment "
    "(ALICLOUD_ACCESS_KEY, ALICLOUD_SECRET_KEY)",
    "kubernetes": f"the cluster this stack creates or adopts ({qualified('kubeconfig')}, "
    f"{qualified('clusterId')})",
}


def unknown_key_problems(keys: Iterable[str]) -> list[str]:
    """A line per key of the namespace that this project does not know (a misspelling)."""
    prefix = f"{PROJECT}:"
    keys = list(keys)
    problems: list[str] = []
    for key in sorted(keys):  # our key under a misspelt project name is silently nobody's
        namespace, sep, name = key.partition(":")
        if sep and namespace != PROJECT and name in KNOWN_KEYS and _near(namespace, PROJECT):
            problems.append(
                f"{qualified(name)}: given as {namespace}:{name}, a namespace this program does "
                f"not read: did you mean {qualified(name)}? (pulumi config rm {key})"
            )
        elif sep and namespace in _PROVIDERS:
            problems.append(
                f"{key}: not read: the program makes its {namespace} provider itself, from "
                f"{_PROVIDERS[namespace]} (pulumi config rm {key})"
            )
    unknown = sorted({k.removeprefix(prefix) for k in keys if k.startswith(prefix)} - KNOWN_KEYS)
    for key in unknown:
        near = nearest_key(key, KNOWN_KEYS)
        fix = f"did you mean {near}?" if near else f"known keys: {', '.join(sorted(KNOWN_KEYS))}"
        problems.append(f"{qualified(key)}: unknown key: {fix} (pulumi config rm {qualified(key)})")
    return problems


def describe(error: Any) -> str:
    loc = error["loc"]
    key = str(loc[0]) if loc else "(all)"
    item = "".join(f"[{i}]" for i in loc[1:] if isinstance(i, int))  # sampleJobs[1]
    if error["type"] == "missing":
        return f"{qualified(key)}: required: set it {config_set(key, '<value>')}"
    message = _PLAIN.get(error["type"], str(error["msg"]).removeprefix("Value error, "))
    fix = config_set_items(key) if key in LIST_KEYS else config_set(key, "<value>")
    return f"{qualified(key)}{item}: {message} {fix}"


# pydantic's words for a wrong type, as a stack's author reads them
_PLAIN = {
    "string_type": "must be text",
    "tuple_type": "must be a list of text",
    "list_type": "must be a list of text",
}
