"""Versioned plugin config: the one contract shared by the plugin and infra/ (ConfigMap, flags).

Plain dataclasses and a reader of its own: the plugin starts on every node, and a validation
library's import and model building would be a third of its start."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, TypeVar, cast, get_args

from common.secret import masked
from common.userfiles import (
    ParseError,
    UnreadableError,
    described,
    key_shown,
    parse_yaml,
    read_text,
    unknown_key,
)

logger = logging.getLogger(__name__)

DEFAULT_RESOURCE_NAME = "rdma/hca"
DEFAULT_MAX_ALLOCATIONS = 1000
MAX_ALLOCATIONS_LIMIT = 100_000
MAX_ID_LENGTH = 63
# Each pool is a socket and a grpc server: a node has at most a few tens of HCAs to split.
MAX_POOLS = 64
# Device IDs of all pools together: each is held and listed to the kubelet on every change.
MAX_DEVICE_IDS = MAX_ALLOCATIONS_LIMIT

Version = Literal["v1"]
Mode = Literal["shared", "exclusive"]
LinkLayer = Literal["Ethernet", "InfiniBand"]

# Kubernetes' qualified-name rules for an extended resource: DNS-1123 subdomain prefix, a name
# part of at most 63 alphanumerics/-_. chars, not in the kubernetes.io domain.
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NAME_PART = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
# A PCI vendor or device ID as sysfs writes it (0x15b3), with or without its 0x.
_PCI_ID = re.compile(r"(0x)?[0-9a-fA-F]{4}")
# Domains (and their subdomains) a pool or a DRA driver may not use: Kubernetes' own, and those
# of the other devices of a GPU node. A device plugin registering a resource of theirs would
# replace theirs at the kubelet (nvidia.com/gpu, aliyun.com/gpu-mem), a DRA driver theirs
# (gpu.nvidia.com).
_TAKEN_DOMAINS = {
    "kubernetes.io": "reserved by Kubernetes",
    "k8s.io": "reserved by Kubernetes",
    "nvidia.com": "NVIDIA's (its GPUs' device plugin and DRA driver)",
    "amd.com": "AMD's (its GPUs' device plugin and DRA driver)",
    "aliyun.com": "Alibaba Cloud's (ACK's GPU sharing)",
}

Loc = tuple[str | int, ...]


FIX_VALUE = "fix this value"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a config, as data: where (`("pools", 0, "maxAllocations")`), what,
    and the fix; `remove` when the fix is to remove the key (it does not apply). infra/ maps
    them to stack keys and fixes of its own without reading the text."""

    loc: Loc
    message: str
    fix: str = FIX_VALUE
    remove: bool = False

    def __str__(self) -> str:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in self.loc)
        return f"{where.lstrip('.') or '(top level)'}: {self.message}: {self.fix}"


class ConfigError(ValueError):
    """A config that the plugin (or infra/) must refuse. A refusal of one value carries it as
    data: `field` (the camelCase key), `why` and `fix`; one of a file read field by field holds
    every `problems` with its location."""

    def __init__(
        self,
        why: str,
        problems: tuple[Problem, ...] = (),
        *,
        field: str | None = None,
        fix: str = FIX_VALUE,
    ) -> None:
        super().__init__(f"{why}: {fix}" if not problems else why)
        self.problems, self.field, self.why, self.fix = problems, field, why, fix


def token_in(config: PluginConfig) -> ConfigError | None:
    """A pool whose resource name holds the process's API token (pasted there): it would reach
    the kubelet, the CDI spec, the checkpoint and the ResourceSlices, which carry names as
    they are."""
    for i, pool in enumerate(config.pools):
        if masked(pool.resource_name) != pool.resource_name:
            return ConfigError(
                f"pools[{i}]: its name or prefix holds the API token",
                field=f"pools[{i}].name",
                fix="name the pool something else (the token goes in the kubeconfig only)",
            )
    return None


_NOT_LABEL = re.compile(r"[^a-z0-9-]+")
# A DRA device's name is a DNS label: a pool's devices are named `<its name as one>-<slot or HCA>`.
MAX_LABEL = 63


def label(text: str) -> str:
    """`text` as a DNS label's characters: mlx5_0 -> mlx5-0."""
    return _NOT_LABEL.sub("-", text.lower()).strip("-")


def dra_name_problem(config: PluginConfig) -> ConfigError | None:
    """Pools whose DRA devices cannot all be named: two pools whose names read alike as a DNS
    label (rdma_hca.v2 and rdma-hca-v2: one set of device names for both), or a name too long
    for its devices' (a shared pool's slots; an exclusive one's HCAs, whose shortest names the
    kernel gives are 4 characters: rxe0, mlx5_0 is 6)."""
    seen: dict[str, str] = {}
    for i, pool in enumerate(config.pools):
        prefix = label(pool.name)
        suffix = str(pool.max_allocations - 1) if pool.mode == "shared" else "rxe0"
        if not prefix or len(f"{prefix}-{suffix}") > MAX_LABEL:
            return ConfigError(
                f"pools[{i}]: {pool.name}: its DRA devices would be named {prefix or '(empty)'}-"
                f"{suffix} and alike, not DNS labels of at most {MAX_LABEL} of a-z, 0-9, '-'",
                field=f"pools[{i}].name",
                fix="a shorter name, of letters or digits",
            )
        if prefix in seen:
            return ConfigError(
                f"pools[{i}]: {pool.name} and {seen[prefix]} both name their DRA devices "
                f"{prefix}-…, which cannot tell them apart",
                field=f"pools[{i}].name",
                fix="rename one of them",
            )
        seen[prefix] = pool.name
    return None


def shared_device_id(pool_name: str, index: int) -> str:
    """ID of the index-th allocation slot of a shared pool."""
    return f"{pool_name}-{index}"


def taken_domain(name: str) -> str | None:
    """Why a resource prefix or a DRA driver name may not be `name`: a domain taken (above)."""
    domain = ".".join(name.split(".")[-2:])  # gpu.nvidia.com is nvidia.com's
    taken = _TAKEN_DOMAINS.get(domain)
    return None if taken is None else f"the {domain} domain is {taken}"


def but_for_case(name: str) -> bool:
    """Whether `name` would be a DNS subdomain in lower case: its capitals are the fault."""
    return _DNS_SUBDOMAIN.fullmatch(name.lower()) is not None


def check_resource_name(resource_name: str) -> None:
    """Refuse a resource name the kubelet's Register would refuse (field `name`)."""
    problems = resource_name_problems(resource_name)
    if problems:
        raise problems[0]


def resource_name_problems(resource_name: str) -> list[ConfigError]:
    """Every reason the kubelet's Register would refuse this resource name: its prefix's and
    its name's, each said (a config's reader lists them all at once)."""
    prefix, sep, name = resource_name.partition("/")
    if not sep:  # a Pool always has both parts: only a whole name given as one can lack them
        return [ConfigError("not <prefix>/<name>", field="name", fix="e.g. rdma/hca")]
    problems: list[ConfigError] = []
    fix = "e.g. rdma, as in rdma/hca"
    if len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix):
        why = "its prefix is not a DNS subdomain" + (
            " (it has capitals)" if but_for_case(prefix) else ""
        )
        problems.append(ConfigError(why, field="prefix", fix=fix))
    elif (taken := taken_domain(prefix)) is not None:
        problems.append(ConfigError(taken, field="prefix", fix=f"a domain of your own, {fix}"))
    elif prefix.startswith("requests."):  # the kubelet's IsExtendedResourceName refuses it
        problems.append(
            ConfigError(
                "a prefix starting requests. is a quota's name, not a resource's",
                field="prefix",
                fix=fix,
            )
        )
    if len(name) > 63 or not _NAME_PART.fullmatch(name):
        problems.append(
            ConfigError(
                "its name must be 1-63 letters, digits, '-', '_' or '.', starting and ending "
                "alphanumeric",
                field="name",
                fix="e.g. hca, as in rdma/hca",
            )
        )
    return problems


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
        check_resource_name(self.resource_name)
        if not 1 <= self.max_allocations <= MAX_ALLOCATIONS_LIMIT:
            raise ConfigError(
                f"{self.max_allocations} is not within 1-{MAX_ALLOCATIONS_LIMIT}",
                field="maxAllocations",
            )
        if self.mode == "shared":
            longest = len(shared_device_id(self.name, self.max_allocations - 1))
            if longest > MAX_ID_LENGTH:
                raise ConfigError(
                    f"device IDs would be {longest} characters (max {MAX_ID_LENGTH})",
                    field="name",
                    fix="shorten the pool name",
                )


@dataclass(frozen=True)
class PluginConfig:
    """The whole plugin config file (`version: v1`)."""

    version: Version = "v1"
    non_host_network: bool = False
    pools: tuple[Pool, ...] = (Pool(name="hca"),)

    def __post_init__(self) -> None:
        if not self.pools:
            raise ConfigError(
                "no pool", field="pools", fix="list at least one, or omit pools for rdma/hca"
            )
        if len(self.pools) > MAX_POOLS:
            raise ConfigError(
                f"{len(self.pools)} pools: at most {MAX_POOLS} (each is a socket and a server)",
                field="pools",
                fix="merge pools",
            )
        ids = sum(p.max_allocations for p in self.pools if p.mode == "shared")
        if ids > MAX_DEVICE_IDS:
            raise ConfigError(
                f"the shared pools' maxAllocations add up to {ids}: at most {MAX_DEVICE_IDS} "
                "device IDs in all (each is held and listed to the kubelet)",
                field="pools",
                fix="lower maxAllocations",
            )
        names = [p.name for p in self.pools]
        for j, name in enumerate(names):  # unique names keep resource and socket names unique
            if name in names[:j]:
                raise ConfigError(
                    f"pools {names.index(name)} and {j} have the same name",
                    field="pools",
                    fix="give each pool its own name",
                )
        pools = list(enumerate(self.pools))
        for i, a in pools:
            for j, b in pools[i + 1 :]:
                if a.mode == b.mode == "exclusive" and a.selector == b.selector:
                    raise ConfigError(
                        f"exclusive pools {i} and {j} select the same HCAs",
                        field="pools",
                        fix="make their selectors disjoint",
                    )

    def to_file(self) -> str:
        """The file the plugin reads, with every default spelled out. JSON, which is YAML too:
        a file that starts with `{` is read without importing a YAML parser (~35 ms of start)."""
        return json.dumps(_as_file(self), indent=2) + "\n"


def _as_file(value: object) -> object:
    """A config value as the file spells it: camelCase keys in field order, lists."""
    if isinstance(value, tuple):
        return [_as_file(v) for v in cast(tuple[object, ...], value)]
    if not isinstance(value, PluginConfig | Pool | Selector):
        return value
    data = {_camel(f.name): _as_file(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, Pool) and value.mode == "exclusive":
        del data["maxAllocations"]  # one ID per HCA: the slot count does not apply
    return data


# The most problems one refusal lists (a generated file can hold thousands).
_LISTED = 5


def _listed(problems: Sequence[object]) -> str:
    said = "; ".join(map(str, problems[:_LISTED]))
    more = len(problems) - _LISTED
    return said + (f"; and {more} more problem(s) like these" if more > 0 else "")


def parse_config(data: object, source: str) -> PluginConfig:
    """Read loaded YAML; every problem is reported at once, each naming its field
    (`pools[0].maxAllocations`) and the fix."""
    reader = _Reader()
    config = reader.config({} if data is None else data)
    if config is None:
        raise ConfigError(f"{source}: " + _listed(reader.problems), reader.problems)
    return config


def parse_pool(data: Mapping[str, object]) -> Pool:
    """One pool as the config file spells it (camelCase keys); problems are located in it."""
    reader = _Reader()
    pool = reader.pool(data, ())
    if pool is None:
        raise ConfigError(_listed(reader.problems), reader.problems)
    return pool


# The config files whose default pool was said (the plugin rereads its file every 2 s).
_SAID_DEFAULT: set[Path] = set()


def load_config(path: Path, *, explicit: bool) -> PluginConfig:
    """Read the config file; an absent default path means defaults, an absent explicit one fails."""
    try:
        text = read_text(path)
    except UnreadableError as exc:
        if exc.missing and not explicit:
            return PluginConfig()
        if exc.missing:
            raise ConfigError(
                f"--config {path}: no such file", fix="fix the path or omit --config"
            ) from None
        raise ConfigError(
            f"--config {path}: cannot be read ({exc})", fix="point it at the plugin's YAML file"
        ) from None
    try:
        data = parse_yaml(text)
    except ParseError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})", fix="fix the syntax") from None
    if data is None:  # a ConfigMap key left empty, a file truncated: not a wish for defaults
        raise ConfigError(
            f"{path}: holds no config (empty, or comments only)",
            fix="write at least `version: v1` for the defaults, or omit --config",
        )
    config = parse_config(data, str(path))
    if isinstance(data, dict) and "pools" not in data and path not in _SAID_DEFAULT:
        _SAID_DEFAULT.add(path)  # `version: v1` alone: said once, not at each reread (2 s)
        logger.info("%s lists no pools: serving the default pool %s", path, DEFAULT_RESOURCE_NAME)
    return config


_T = TypeVar("_T")


def _camel(name: str) -> str:
    """A field's key in the file: max_allocations -> maxAllocations."""
    head, *rest = name.split("_")
    return head + "".join(w.capitalize() for w in rest)


class _Reader:
    """Reads YAML data into the types above, field by field, collecting every problem. Only the
    keys present are passed on: every default is the dataclass's. A part with a problem reads
    as None (its parent then does too)."""

    def __init__(self) -> None:
        self.problems: tuple[Problem, ...] = ()

    def _fail(self, loc: Loc, message: str, fix: str = FIX_VALUE, *, remove: bool = False) -> None:
        self.problems += (Problem(loc, message, fix, remove),)

    def _mapping(self, data: object, loc: Loc, cls: type) -> dict[str, object] | None:
        """`data`'s keys as `cls`'s field names; unknown keys are problems."""
        if not isinstance(data, dict):
            self._fail(loc, f"expected a mapping, got {described(data)}")
            return None
        names = {_camel(f.name): f.name for f in fields(cls)}
        read: dict[str, object] = {}
        for key, value in cast(dict[object, object], data).items():
            if isinstance(key, str) and key in names:
                read[names[key]] = value
            elif isinstance(key, str) and _camel(key) in names:
                self._fail((*loc, key), "unknown key", f"the file spells it {_camel(key)}")
            else:
                self._fail(
                    (*loc, key_shown(key)), "unknown key", unknown_key(key, names), remove=True
                )
        return read

    def _build(self, loc: Loc, make: Callable[[], _T]) -> _T | None:
        """A checked constructor's refusal, located at the field it names."""
        try:
            return make()
        except ConfigError as exc:
            self._fail((*loc, exc.field) if exc.field else loc, exc.why, exc.fix)
            return None

    def config(self, data: object) -> PluginConfig | None:
        read = self._mapping(data, (), PluginConfig)
        if read is None:
            return None
        kwargs: dict[str, Any] = {}
        if "version" in read:
            kwargs["version"] = self._choice(read["version"], ("version",), get_args(Version))
        if "non_host_network" in read:
            kwargs["non_host_network"] = self._bool(read["non_host_network"], ("nonHostNetwork",))
        if "pools" in read:
            raw = read["pools"]
            if isinstance(raw, list):
                items = cast(list[object], raw)
                kwargs["pools"] = tuple(self.pool(p, ("pools", i)) for i, p in enumerate(items))
            else:
                self._fail(("pools",), f"expected a list of pools, got {described(raw)}")
        if self.problems:
            return None
        return self._build((), lambda: PluginConfig(**kwargs))

    def pool(self, data: object, loc: Loc) -> Pool | None:
        read = self._mapping(data, loc, Pool)
        if read is None:
            return None
        before = len(self.problems)
        kwargs: dict[str, Any] = {"name": self._str(read.get("name"), (*loc, "name"))}
        if "prefix" in read:
            kwargs["prefix"] = self._str(read["prefix"], (*loc, "prefix"))
        if "mode" in read:
            kwargs["mode"] = self._choice(read["mode"], (*loc, "mode"), get_args(Mode))
        if "max_allocations" in read:
            where = (*loc, "maxAllocations")
            slots = read["max_allocations"]
            if isinstance(slots, bool) or not isinstance(slots, int):
                self._fail(where, f"not a whole number (got {described(slots)})")
            elif kwargs.get("mode") == "exclusive":
                self._fail(
                    where,
                    "applies to shared pools only (an exclusive pool has one ID per HCA)",
                    "remove it or set mode: shared",
                    remove=True,
                )
            kwargs["max_allocations"] = slots
        if "selector" in read:
            kwargs["selector"] = self._selector(read["selector"], (*loc, "selector"))
        if len(self.problems) > before:
            return None
        named = resource_name_problems(f"{kwargs.get('prefix', 'rdma')}/{kwargs['name']}")
        for problem in named:  # each said, not the first only (Pool's own check)
            self._fail((*loc, problem.field) if problem.field else loc, problem.why, problem.fix)
        return None if named else self._build(loc, lambda: Pool(**kwargs))

    def _selector(self, data: object, loc: Loc) -> Selector | None:
        read = self._mapping(data, loc, Selector)
        if read is None:
            return None
        before = len(self.problems)
        kwargs = {k: self._strs(v, (*loc, _camel(k))) for k, v in read.items()}
        for i, layer in enumerate(kwargs.get("link_layers") or ()):
            self._choice(layer, (*loc, "linkLayers", i), get_args(LinkLayer))
        for key, kind, example in (("vendors", "vendor", "15b3"), ("device_ids", "device", "1017")):
            for i, pci_id in enumerate(kwargs.get(key) or ()):
                if not _PCI_ID.fullmatch(pci_id):  # it would match nothing
                    self._fail((*loc, _camel(key), i), f"not a PCI {kind} ID", f"e.g. {example}")
        if len(self.problems) > before:
            return None
        return Selector(**cast(dict[str, Any], kwargs))

    def _str(self, value: object, loc: Loc) -> str | None:
        if isinstance(value, str):
            return value
        if value is None:
            self._fail(loc, "missing", "set it")
        else:
            self._fail(loc, f"not text (got {described(value)})")
        return None

    def _bool(self, value: object, loc: Loc) -> bool | None:
        if isinstance(value, bool):
            return value
        self._fail(loc, f"not true or false (got {described(value)})")
        return None

    def _strs(self, value: object, loc: Loc) -> tuple[str, ...] | None:
        if isinstance(value, list) and all(isinstance(v, str) for v in cast(list[object], value)):
            return tuple(cast(list[str], value))
        self._fail(loc, f"expected a list of text, got {described(cast(object, value))}")
        return None

    def _choice(self, value: object, loc: Loc, choices: tuple[str, ...]) -> str | None:
        if isinstance(value, str) and value in choices:
            return value
        self._fail(loc, f"not one of {', '.join(choices)} (got {described(value)})")
        return None
