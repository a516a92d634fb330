"""Versioned plugin config: the one contract shared by the plugin and infra/ (ConfigMap, flags)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

# Paths and ports the DaemonSet and the CLI must agree on.
DEFAULT_CONFIG_PATH = Path("/etc/lingjun-rdma/plugin.yaml")
DEFAULT_DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_METRICS_PORT = 9460
DEFAULT_RESOURCE_NAME = "rdma/hca"
DEFAULT_MAX_ALLOCATIONS = 1000
MAX_ID_LENGTH = 63

# Kubernetes' qualified-name rules for an extended resource: DNS-1123 subdomain prefix, a name
# part of at most 63 alphanumerics/-_. chars, not in the kubernetes.io domain.
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME_PART = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class ConfigError(ValueError):
    """A config that the plugin (or infra/) must refuse; the message names the field and the fix."""


def shared_device_id(pool_name: str, index: int) -> str:
    """ID of the index-th allocation slot of a shared pool."""
    return f"{pool_name}-{index}"


def check_resource_name(resource_name: str, *, field: str) -> None:
    """Refuse a resource name the kubelet's Register would refuse; `field` names the config key."""
    prefix, sep, name = resource_name.partition("/")
    fix = "use <domain>/<name>, e.g. rdma/hca"
    if not sep or not prefix or not name:
        raise ConfigError(f"{field}: {resource_name!r} is not <prefix>/<name>: {fix}")
    if len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix):
        raise ConfigError(f"{field}: prefix {prefix!r} is not a DNS subdomain: {fix}")
    if prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io"):
        raise ConfigError(f"{field}: the kubernetes.io domain is reserved: {fix}")
    if len(name) > 63 or not _NAME_PART.match(name):
        raise ConfigError(
            f"{field}: name {name!r} must be 1-63 letters, digits, '-', '_' or '.', "
            f"starting and ending alphanumeric: {fix}"
        )


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True
    )


class Selector(_Model):
    """Which HCAs a pool takes; empty lists match everything, globs allowed in ibdevs/netdevs."""

    vendors: tuple[str, ...] = ()
    device_ids: tuple[str, ...] = ()
    drivers: tuple[str, ...] = ()
    ibdevs: tuple[str, ...] = ()
    netdevs: tuple[str, ...] = ()
    link_layers: tuple[Literal["Ethernet", "InfiniBand"], ...] = ()


class Pool(_Model):
    """One extended resource `<prefix>/<name>` over the HCAs its selector picks."""

    name: str
    prefix: str = "rdma"
    mode: Literal["shared", "exclusive"] = "shared"
    max_allocations: int = Field(default=DEFAULT_MAX_ALLOCATIONS, ge=1, le=100_000)
    selector: Selector = Selector()

    @property
    def resource_name(self) -> str:
        return f"{self.prefix}/{self.name}"

    @model_validator(mode="after")
    def _check(self) -> Pool:
        check_resource_name(self.resource_name, field="name/prefix")
        if self.mode == "exclusive" and "max_allocations" in self.model_fields_set:
            raise ValueError(
                "maxAllocations applies to shared pools only (an exclusive pool has one ID per "
                "HCA): remove it or set mode: shared"
            )
        if self.mode == "shared":
            longest = len(shared_device_id(self.name, self.max_allocations - 1))
            if longest > MAX_ID_LENGTH:
                raise ValueError(
                    f"device IDs would be {longest} characters (max {MAX_ID_LENGTH}): "
                    "shorten the pool name"
                )
        return self


class PluginConfig(_Model):
    """The whole plugin config file (`version: v1`)."""

    version: Literal["v1"] = "v1"
    non_host_network: bool = False
    pools: tuple[Pool, ...] = (Pool(name="hca"),)

    @field_validator("pools")
    @classmethod
    def _non_empty(cls, pools: tuple[Pool, ...]) -> tuple[Pool, ...]:
        if not pools:
            raise ValueError("no pool: list at least one, or omit pools for the default rdma/hca")
        return pools

    @model_validator(mode="after")
    def _check(self) -> PluginConfig:
        names = [p.name for p in self.pools]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:  # unique names also keep resource names and socket names unique
            raise ValueError(f"duplicate pool name {dupes[0]!r}: give each pool its own name")
        exclusive = [p for p in self.pools if p.mode == "exclusive"]
        for i, a in enumerate(exclusive):
            for b in exclusive[i + 1 :]:
                if a.selector == b.selector:
                    raise ValueError(
                        f"exclusive pools {a.name!r} and {b.name!r} select the same HCAs: "
                        "make their selectors disjoint"
                    )
        return self

    def to_yaml(self) -> str:
        """The file the plugin reads, with every default spelled out."""
        data = self.model_dump(mode="json", by_alias=True)
        for pool in data["pools"]:
            if pool["mode"] == "exclusive":  # one ID per HCA: the slot count does not apply
                del pool["maxAllocations"]
        return yaml.safe_dump(data, sort_keys=False)


def parse_config(data: Any, source: str) -> PluginConfig:
    """Validate loaded YAML; errors name the field (`pools[0].maxAllocations`) and the fix."""
    if data is None:
        data = {}
    try:
        return PluginConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: " + "; ".join(_describe(e) for e in exc.errors())) from None


def load_config(path: Path, *, explicit: bool) -> PluginConfig:
    """Read the config file; an absent default path means defaults, an absent explicit one fails."""
    if not path.exists():
        if explicit:
            raise ConfigError(f"--config {path}: no such file: fix the path or omit --config")
        return PluginConfig()
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(
            f"--config {path}: cannot be read ({why}): point it at the plugin's YAML file"
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc}): fix the syntax") from None
    return parse_config(data, str(path))


def _describe(error: Any) -> str:
    loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"]).lstrip(".")
    where = loc or "(top level)"
    kind = error["type"]
    if kind == "extra_forbidden":
        return f"{where}: unknown key: remove it or fix its spelling"
    msg = str(error["msg"]).removeprefix("Value error, ")
    if kind == "literal_error":
        return f"{where}: {msg}"
    return f"{where}: {msg}" + ("" if ":" in msg else ": fix this value")
