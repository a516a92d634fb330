"""Versioned plugin config: the one contract shared by the plugin and infra/ (ConfigMap, flags).

Plain dataclasses and a hand-written reader, not pydantic: the plugin starts on every node and
pydantic's import and model building cost it ~130 ms and ~8 MiB (`make bench`, P4)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar, cast, get_args

# Paths and ports the DaemonSet and the CLI must agree on.
DEFAULT_CONFIG_PATH = Path("/etc/lingjun-rdma/plugin.yaml")
DEFAULT_DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_METRICS_PORT = 9460
DEFAULT_RESOURCE_NAME = "rdma/hca"
DEFAULT_MAX_ALLOCATIONS = 1000
MAX_ALLOCATIONS_LIMIT = 100_000
MAX_ID_LENGTH = 63

Mode = Literal["shared", "exclusive"]
LinkLayer = Literal["Ethernet", "InfiniBand"]

# Kubernetes' qualified-name rules for an extended resource: DNS-1123 subdomain prefix, a name
# part of at most 63 alphanumerics/-_. chars, not in the kubernetes.io domain.
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME_PART = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")

Loc = tuple[str | int, ...]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a config, at `loc` (`("pools", 0, "maxAllocations")`)."""

    loc: Loc
    message: str

    def __str__(self) -> str:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in self.loc)
        return f"{where.lstrip('.') or '(top level)'}: {self.message}"


class ConfigError(ValueError):
    """A config that the plugin (or infra/) must refuse; the message names the field and the fix.
    `problems` holds each one with its location when the config was read field by field."""

    def __init__(self, message: str, problems: tuple[Problem, ...] = ()) -> None:
        super().__init__(message)
        self.problems = problems


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


@dataclass(frozen=True)
class Selector:
    """Which HCAs a pool takes; empty lists match everything, globs allowed in ibdevs/netdevs."""

    vendors: tuple[str, ...] = ()
    device_ids: tuple[str, ...] = ()
    drivers: tuple[str, ...] = ()
    ibdevs: tuple[str, ...] = ()
    netdevs: tuple[str, ...] = ()
    link_layers: tuple[LinkLayer, ...] = ()


@dataclass(frozen=True)
class Pool:
    """One extended resource `<prefix>/<name>` over the HCAs its selector picks. Constructing
    one checks it: an invalid Pool does not exist."""

    name: str
    prefix: str = "rdma"
    mode: Mode = "shared"
    max_allocations: int = DEFAULT_MAX_ALLOCATIONS  # shared pools only: slots per node
    selector: Selector = field(default_factory=Selector)

    @property
    def resource_name(self) -> str:
        return f"{self.prefix}/{self.name}"

    def __post_init__(self) -> None:
        check_resource_name(self.resource_name, field="name/prefix")
        if not 1 <= self.max_allocations <= MAX_ALLOCATIONS_LIMIT:
            raise ConfigError(
                f"maxAllocations {self.max_allocations} is not within 1-{MAX_ALLOCATIONS_LIMIT}"
            )
        if self.mode == "shared":
            longest = len(shared_device_id(self.name, self.max_allocations - 1))
            if longest > MAX_ID_LENGTH:
                raise ConfigError(
                    f"device IDs would be {longest} characters (max {MAX_ID_LENGTH}): "
                    "shorten the pool name"
                )


@dataclass(frozen=True)
class PluginConfig:
    """The whole plugin config file (`version: v1`)."""

    version: Literal["v1"] = "v1"
    non_host_network: bool = False
    pools: tuple[Pool, ...] = (Pool(name="hca"),)

    def __post_init__(self) -> None:
        if not self.pools:
            raise ConfigError("no pool: list at least one, or omit pools for the default rdma/hca")
        names = [p.name for p in self.pools]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:  # unique names also keep resource names and socket names unique
            raise ConfigError(f"duplicate pool name {dupes[0]!r}: give each pool its own name")
        exclusive = [p for p in self.pools if p.mode == "exclusive"]
        for i, a in enumerate(exclusive):
            for b in exclusive[i + 1 :]:
                if a.selector == b.selector:
                    raise ConfigError(
                        f"exclusive pools {a.name!r} and {b.name!r} select the same HCAs: "
                        "make their selectors disjoint"
                    )

    def to_file(self) -> str:
        """The file the plugin reads, with every default spelled out. JSON, which is YAML too:
        a file that starts with `{` is read without importing a YAML parser (~35 ms of start)."""
        data = {
            "version": self.version,
            "nonHostNetwork": self.non_host_network,
            "pools": [_pool_dict(p) for p in self.pools],
        }
        return json.dumps(data, indent=2) + "\n"


def _pool_dict(pool: Pool) -> dict[str, object]:
    data: dict[str, object] = {"name": pool.name, "prefix": pool.prefix, "mode": pool.mode}
    if pool.mode == "shared":  # one ID per HCA in an exclusive pool: the slot count does not apply
        data["maxAllocations"] = pool.max_allocations
    s = pool.selector
    data["selector"] = {
        "vendors": list(s.vendors),
        "deviceIds": list(s.device_ids),
        "drivers": list(s.drivers),
        "ibdevs": list(s.ibdevs),
        "netdevs": list(s.netdevs),
        "linkLayers": list(s.link_layers),
    }
    return data


def parse_config(data: object, source: str) -> PluginConfig:
    """Read loaded YAML; every problem is reported at once, each naming its field
    (`pools[0].maxAllocations`) and the fix."""
    reader = _Reader()
    config = reader.config({} if data is None else data)
    if config is None:
        raise ConfigError(f"{source}: " + "; ".join(map(str, reader.problems)), reader.problems)
    return config


def parse_pool(data: Mapping[str, object]) -> Pool:
    """One pool as the config file spells it (camelCase keys); problems are located in it."""
    reader = _Reader()
    pool = reader.pool(data, ())
    if pool is None:
        raise ConfigError("; ".join(map(str, reader.problems)), reader.problems)
    return pool


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
    if text.lstrip().startswith("{"):
        try:
            return parse_config(json.loads(text), str(path))
        except json.JSONDecodeError:
            pass  # YAML flow style can start with `{` too: the YAML parser decides
    import yaml  # here, not at the top: a file as rendered by to_file() needs no YAML parser

    try:
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc}): fix the syntax") from None
    return parse_config(data, str(path))


_T = TypeVar("_T")


class _Reader:
    """Reads YAML data into the types above, field by field, collecting every problem; a part
    with a problem reads as None (its parent then does too)."""

    def __init__(self) -> None:
        self.problems: tuple[Problem, ...] = ()

    def _fail(self, loc: Loc, message: str) -> None:
        self.problems += (Problem(loc, message),)

    def _mapping(self, data: object, loc: Loc, keys: tuple[str, ...]) -> dict[str, object] | None:
        if not isinstance(data, dict):
            self._fail(loc, f"expected a mapping, got {data!r}: fix this value")
            return None
        mapping = cast(dict[object, object], data)
        for key in mapping:
            if key not in keys:
                self._fail((*loc, str(key)), "unknown key: remove it or fix its spelling")
        return {k: v for k, v in mapping.items() if isinstance(k, str)}

    def _build(self, loc: Loc, make: Callable[[], _T]) -> _T | None:
        try:
            return make()
        except ConfigError as exc:
            message = str(exc)
            self._fail(loc, message if ": " in message else f"{message}: fix this value")
            return None

    def config(self, data: object) -> PluginConfig | None:
        fields = self._mapping(data, (), ("version", "nonHostNetwork", "pools"))
        if fields is None:
            return None
        if fields.get("version", "v1") != "v1":
            self._fail(("version",), f"{fields['version']!r}: the only version is v1")
        non_host = fields.get("nonHostNetwork", False)
        if not isinstance(non_host, bool):
            self._fail(("nonHostNetwork",), f"{non_host!r} is not true or false: fix this value")
        raw_pools = fields.get("pools", [{"name": "hca"}])
        if not isinstance(raw_pools, list):
            self._fail(("pools",), f"expected a list of pools, got {raw_pools!r}: fix this value")
            return None
        pools = [self.pool(p, ("pools", i)) for i, p in enumerate(cast(list[object], raw_pools))]
        if self.problems:
            return None
        return self._build(
            (), lambda: PluginConfig(non_host_network=bool(non_host), pools=_present(pools))
        )

    def pool(self, data: object, loc: Loc) -> Pool | None:
        keys = ("name", "prefix", "mode", "maxAllocations", "selector")
        fields = self._mapping(data, loc, keys)
        if fields is None:
            return None
        before = len(self.problems)
        name = self._str(fields.get("name"), (*loc, "name"))
        prefix = self._str(fields.get("prefix", "rdma"), (*loc, "prefix"))
        mode = self._choice(fields.get("mode", "shared"), (*loc, "mode"), get_args(Mode))
        slots = fields.get("maxAllocations", DEFAULT_MAX_ALLOCATIONS)
        if isinstance(slots, bool) or not isinstance(slots, int):
            self._fail((*loc, "maxAllocations"), f"{slots!r} is not a whole number: fix this value")
        elif mode == "exclusive" and "maxAllocations" in fields:
            self._fail(
                (*loc, "maxAllocations"),
                "applies to shared pools only (an exclusive pool has one ID per HCA): remove it "
                "or set mode: shared",
            )
        selector = self._selector(fields.get("selector", {}), (*loc, "selector"))
        if len(self.problems) > before or name is None or prefix is None or selector is None:
            return None
        return self._build(
            loc,
            lambda: Pool(
                name=name,
                prefix=prefix,
                mode=cast(Mode, mode),
                max_allocations=cast(int, slots),
                selector=selector,
            ),
        )

    def _selector(self, data: object, loc: Loc) -> Selector | None:
        keys = ("vendors", "deviceIds", "drivers", "ibdevs", "netdevs", "linkLayers")
        fields = self._mapping(data, loc, keys)
        if fields is None:
            return None
        before = len(self.problems)
        lists = {k: self._strs(fields.get(k, []), (*loc, k)) for k in keys}
        layers = lists["linkLayers"] or ()
        for i, layer in enumerate(layers):
            self._choice(layer, (*loc, "linkLayers", i), get_args(LinkLayer))
        if len(self.problems) > before:
            return None
        return Selector(
            vendors=lists["vendors"] or (),
            device_ids=lists["deviceIds"] or (),
            drivers=lists["drivers"] or (),
            ibdevs=lists["ibdevs"] or (),
            netdevs=lists["netdevs"] or (),
            link_layers=cast(tuple[LinkLayer, ...], layers),
        )

    def _str(self, value: object, loc: Loc) -> str | None:
        if isinstance(value, str):
            return value
        self._fail(loc, "missing: set it" if value is None else f"{value!r} is not text")
        return None

    def _strs(self, value: object, loc: Loc) -> tuple[str, ...] | None:
        if isinstance(value, list) and all(isinstance(v, str) for v in cast(list[object], value)):
            return tuple(cast(list[str], value))
        self._fail(loc, f"expected a list of text, got {value!r}: fix this value")
        return None

    def _choice(self, value: object, loc: Loc, choices: tuple[str, ...]) -> str | None:
        if isinstance(value, str) and value in choices:
            return value
        self._fail(loc, f"{value!r} is not one of {', '.join(choices)}: fix this value")
        return None


def _present(items: list[_T | None]) -> tuple[_T, ...]:
    return tuple(i for i in items if i is not None)
