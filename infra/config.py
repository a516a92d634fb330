"""Stack config: THE ONLY module reading Pulumi config; returns one frozen, validated model."""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping, Set
from pathlib import Path
from typing import Annotated, Any, Literal, cast

import yaml
from pulumi.runtime import is_config_secret
from pulumi.runtime.config import CONFIG, get_config_env
from pydantic import BaseModel, BeforeValidator, ConfigDict, SecretStr, ValidationError
from pydantic.alias_generators import to_camel

from plugin.config import (
    DEFAULT_MAX_ALLOCATIONS,
    DEFAULT_RESOURCE_NAME,
    ConfigError,
    check_resource_name,
)

PROJECT = "lingjun-rdma"
PROJECT_DIR = Path(__file__).resolve().parent.parent  # Pulumi.yaml, stacks/
SAMPLE_JOBS = ("hps-benchmark", "perftest", "nccl-tests")
# Which config key holds each sample Job's image.
SAMPLE_IMAGE_KEYS = {
    "hps-benchmark": "hpsBenchmarkImage",
    "perftest": "perftestImage",
    "nccl-tests": "ncclTestsImage",
}


class StackConfigError(ValueError):
    """Stack config the program refuses; each line names the key and the command that fixes it."""


def _key(name: str) -> str:
    return f"{PROJECT}:{name}"


def _set(name: str, value: str) -> str:
    return f"(pulumi config set {_key(name)} {value})"


def _true_or_false(value: object) -> object:
    """Pulumi's `boolean` is the text true or false; pydantic alone would take yes, on, 1."""
    if isinstance(value, str) and value not in ("true", "false"):
        raise ValueError(f"{value!r} is not a boolean: use true or false")
    return value


Flag = Annotated[bool, BeforeValidator(_true_or_false)]
# At most the nodes of one ACK node pool (1000): a Lingjun node group holds tens; a slip like
# 100000000 fails here, before any resource is planned, not at the cloud API.
MAX_NODE_COUNT = 1000
# A Kubernetes namespace name is an RFC 1123 label.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class StackConfig(BaseModel):
    """Every key of the `lingjun-rdma` namespace; defaults live in Pulumi.yaml's schema."""

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
    lingjun_node_count: int
    non_host_network: Flag
    rdma_resource_name: str
    rdma_max_allocations: int
    rdma_pool_mode: Literal["shared", "exclusive"]
    namespace: str
    plugin_image: str | None = None
    plugin_image_build: Flag
    acr_instance_id: str | None = None
    registry_username: str | None = None
    registry_password: SecretStr | None = None
    sample_jobs: tuple[str, ...]
    hps_benchmark_image: str | None = None
    perftest_image: str | None = None
    nccl_tests_image: str | None = None
    job_await_timeout: str | None = None
    plugin_await_timeout: str

    @property
    def creates_cluster(self) -> bool:
        return self.cluster_mode == "create"

    @property
    def creates_eflo_group(self) -> bool:
        """No existing Lingjun node group given: the program creates the eflo cluster and group."""
        return self.creates_cluster and self.lingjun_node_group_id is None

    @property
    def job_deadline_seconds(self) -> int | None:
        """jobAwaitTimeout in seconds: the sample Jobs' activeDeadlineSeconds."""
        if self.job_await_timeout is None:
            return None
        return duration_seconds(self.job_await_timeout)

    def sample_image(self, job: str) -> str | None:
        return {
            "hps-benchmark": self.hps_benchmark_image,
            "perftest": self.perftest_image,
            "nccl-tests": self.nccl_tests_image,
        }[job]


# A duration in one whole unit: what Pulumi's custom timeouts and activeDeadlineSeconds share.
_DURATION = re.compile(r"^([1-9][0-9]*)(s|m|h)$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600}
# Values that carry a credential: stored as Pulumi secrets or refused.
CREDENTIAL_KEYS = ("kubeconfig", "registryPassword")


def duration_seconds(duration: str) -> int:
    """Seconds in a duration that config validation accepted (`30m` -> 1800)."""
    match = _DURATION.match(duration)
    if match is None:
        raise ValueError(f"not a duration: {duration!r}")
    return int(match[1]) * _UNIT_SECONDS[match[2]]


_LIST_KEYS = {"zoneIds", "vswitchCidrs", "sampleJobs"}
_KNOWN_KEYS = {f.alias or to_camel(n) for n, f in StackConfig.model_fields.items()}


def known_keys() -> frozenset[str]:
    """The keys of the namespace, as a user spells them (`rdmaPoolMode`)."""
    return frozenset(_KNOWN_KEYS)


def load() -> StackConfig:
    """Read and validate the stack's config (CLI env or set_all_config under mocks)."""
    merged: dict[str, Any] = {**get_config_env(), **CONFIG.get()}
    prefix = f"{PROJECT}:"
    present = {k.removeprefix(prefix) for k in merged if k.startswith(prefix)}
    unknown = sorted(present - _KNOWN_KEYS)
    if unknown:
        raise StackConfigError(
            "\n".join(
                f"{_key(k)}: unknown key: fix its spelling or remove it "
                f"(pulumi config rm {_key(k)}); known keys: {', '.join(sorted(_KNOWN_KEYS))}"
                for k in unknown
            )
        )
    # Raw strings, not pulumi.Config.get: that warns on secret keys, and the model wraps those
    # (kubeconfig, registryPassword) in SecretStr until a component marks them secret outputs.
    raw = {
        k.removeprefix(prefix): str(v)
        for k, v in merged.items()
        if k.startswith(prefix) and v is not None and str(v) != ""
    }
    secret = {k for k in CREDENTIAL_KEYS if is_config_secret(_key(k))}
    return parse(raw, secret)


def parse(raw: Mapping[str, str], secret: Set[str] = frozenset()) -> StackConfig:
    """Validate raw strings (as Pulumi stores them) into the model, or raise with every fix.

    `secret`: the keys whose value the stack stores encrypted (`pulumi config set --secret`).
    """
    values: dict[str, Any] = {}
    problems = _check_plaintext_credentials(raw, secret)
    for key, value in raw.items():
        if key in _LIST_KEYS:
            try:
                values[key] = json.loads(value)
            except json.JSONDecodeError:
                problems.append(f"{_key(key)}: {value!r} is not a JSON list {_set(key, '[...]')}")
        else:
            values[key] = value
    if problems:
        raise StackConfigError("\n".join(problems))
    try:
        model = StackConfig.model_validate(values)
    except ValidationError as exc:
        raise StackConfigError("\n".join(_describe(e) for e in exc.errors())) from None
    problems = _check(model)
    if problems:
        raise StackConfigError("\n".join(problems))
    return model


def _check_plaintext_credentials(raw: Mapping[str, str], secret: Set[str]) -> list[str]:
    """A credential stored in plain text in a stack file is refused. Pulumi.yaml cannot say
    `secret: true` for these keys: the CLI then requires them on every stack."""
    problems: list[str] = []
    password = raw.get("registryPassword")
    if password is not None and "registryPassword" not in secret:
        problems.append(
            f"{_key('registryPassword')}: stored in plain text: set it as a secret "
            f"(pulumi config set --secret {_key('registryPassword')} <password>)"
        )
    kubeconfig = raw.get("kubeconfig")
    if kubeconfig is not None and "kubeconfig" not in secret and _has_credential(kubeconfig):
        problems.append(
            f"{_key('kubeconfig')}: holds a credential (token, key or password) in plain text: "
            f"set it as a secret (pulumi config set --secret {_key('kubeconfig')} "
            "< ~/.kube/config)"
        )
    return problems


def _has_credential(kubeconfig: str) -> bool:
    """True when a user entry carries a secret inline (not a file path to one)."""
    try:
        doc: Any = yaml.safe_load(kubeconfig)
    except yaml.YAMLError:
        return True  # unreadable here: treat it as one, the secret path is always safe
    users: Any = cast(dict[str, Any], doc).get("users") if isinstance(doc, dict) else None
    for entry in cast(list[Any], users) if isinstance(users, list) else []:
        user: Any = cast(dict[str, Any], entry).get("user") if isinstance(entry, dict) else None
        if isinstance(user, dict) and _INLINE_CREDENTIALS & set(cast(dict[str, Any], user)):
            return True
    return False


_INLINE_CREDENTIALS = {"token", "client-key-data", "password"}


def _describe(error: Any) -> str:
    loc = error["loc"]
    key = str(loc[0]) if loc else "(all)"
    if error["type"] == "missing":
        return f"{_key(key)}: required: set it {_set(key, '<value>')}"
    return f"{_key(key)}: {error['msg']} {_set(key, '<value>')}"


def _check(c: StackConfig) -> list[str]:
    return [
        *_check_network_mode(c),
        *_check_cluster(c),
        *_check_cidrs(c),
        *_check_rdma(c),
        *_check_image(c),
        *_check_samples(c),
        *_check_timeouts(c),
    ]


def _check_network_mode(c: StackConfig) -> list[str]:
    if c.non_host_network and not c.compute_network_ipv6:
        # The managed add-on accepts this and silently does nothing; we refuse it.
        return [
            f"{_key('nonHostNetwork')}: true needs {_key('computeNetworkIpv6')}: true: RDMA for "
            "pods off the host network works only on an IPv6 Lingjun compute network "
            f"{_set('computeNetworkIpv6', 'true')}, or keep hostNetwork-only pods "
            f"{_set('nonHostNetwork', 'false')}"
        ]
    return []


def _check_cluster(c: StackConfig) -> list[str]:
    problems: list[str] = []
    if c.cluster_mode == "existing":
        if c.cluster_id is None and c.kubeconfig is None:
            problems.append(
                f"{_key('clusterMode')}: existing needs {_key('clusterId')} or "
                f"{_key('kubeconfig')} {_set('clusterId', '<ACK cluster id>')} or "
                f"(pulumi config set --secret {_key('kubeconfig')} < ~/.kube/config)"
            )
        return problems
    if c.lingjun_node_group_id is not None and c.lingjun_cluster_id is None:
        problems.append(
            f"{_key('lingjunNodeGroupId')}: needs the Lingjun cluster it belongs to "
            f"{_set('lingjunClusterId', '<eflo cluster id>')}"
        )
    if c.creates_eflo_group:
        for key, value in (
            ("lingjunMachineType", c.lingjun_machine_type),
            ("lingjunImageId", c.lingjun_image_id),
            ("lingjunHpnZone", c.lingjun_hpn_zone),
        ):
            if value is None:
                problems.append(
                    f"{_key(key)}: required to create the Lingjun node group "
                    f"{_set(key, '<value>')}, or adopt an existing one "
                    f"{_set('lingjunNodeGroupId', '<eflo node group id>')}"
                )
    if not 0 <= c.lingjun_node_count <= MAX_NODE_COUNT:
        problems.append(
            f"{_key('lingjunNodeCount')}: {c.lingjun_node_count} is not 0..{MAX_NODE_COUNT} "
            f"(the nodes of one node pool) {_set('lingjunNodeCount', '2')}"
        )
    return problems


def _check_cidrs(c: StackConfig) -> list[str]:
    if not c.creates_cluster:
        return []
    problems: list[str] = []
    nets: dict[str, ipaddress.IPv4Network] = {}
    for key, value in (
        ("vpcCidr", c.vpc_cidr),
        ("serviceCidr", c.service_cidr),
        *((f"vswitchCidrs[{i}]", v) for i, v in enumerate(c.vswitch_cidrs)),
    ):
        try:
            nets[key] = ipaddress.IPv4Network(value)
        except ValueError as exc:
            base = key.split("[")[0]
            problems.append(f"{_key(key)}: {value!r} is not an IPv4 CIDR ({exc}) {_set(base, '…')}")
    if problems:
        return problems
    if not c.vswitch_cidrs:
        problems.append(f"{_key('vswitchCidrs')}: list at least one {_set('vswitchCidrs', '[…]')}")
    if len(c.zone_ids) != len(c.vswitch_cidrs):
        problems.append(
            f"{_key('zoneIds')}: one zone per vSwitch CIDR ({len(c.vswitch_cidrs)} CIDRs, "
            f"{len(c.zone_ids)} zones) {_set('zoneIds', '[...]')}"
        )
    vpc = nets["vpcCidr"]
    switches = [(k, n) for k, n in nets.items() if k.startswith("vswitchCidrs")]
    for key, net in switches:
        if not net.subnet_of(vpc):
            problems.append(
                f"{_key(key)}: {net} is outside {_key('vpcCidr')} {vpc} {_set('vswitchCidrs', '…')}"
            )
    for i, (ka, a) in enumerate(switches):
        for kb, b in switches[i + 1 :]:
            if a.overlaps(b):
                problems.append(
                    f"{_key(ka)}: {a} overlaps {_key(kb)} {b} {_set('vswitchCidrs', '…')}"
                )
    if nets["serviceCidr"].overlaps(vpc):
        problems.append(
            f"{_key('serviceCidr')}: {nets['serviceCidr']} overlaps {_key('vpcCidr')} {vpc}: "
            f"Service IPs must not collide with node IPs {_set('serviceCidr', '172.16.0.0/16')}"
        )
    return problems


def _check_rdma(c: StackConfig) -> list[str]:
    problems: list[str] = []
    if not _DNS_LABEL.match(c.namespace):
        problems.append(
            f"{_key('namespace')}: {c.namespace!r} is not a Kubernetes namespace name (lower "
            "case letters, digits and '-', at most 63, starting and ending with a letter or "
            f"digit) {_set('namespace', 'lingjun-rdma')}"
        )
    try:
        check_resource_name(c.rdma_resource_name, field=_key("rdmaResourceName"))
    except ConfigError as exc:
        problems.append(f"{exc} {_set('rdmaResourceName', DEFAULT_RESOURCE_NAME)}")
    if c.rdma_pool_mode == "exclusive" and c.rdma_max_allocations != DEFAULT_MAX_ALLOCATIONS:
        problems.append(
            f"{_key('rdmaMaxAllocations')}: applies to shared pools only (an exclusive pool has "
            f"one ID per HCA) (pulumi config rm {_key('rdmaMaxAllocations')})"
        )
    if not 1 <= c.rdma_max_allocations <= 100_000:
        problems.append(
            f"{_key('rdmaMaxAllocations')}: must be 1..100000 "
            f"{_set('rdmaMaxAllocations', str(DEFAULT_MAX_ALLOCATIONS))}"
        )
    return problems


def is_pinned(image: str) -> bool:
    """True for `repo@sha256:…` or `repo:tag` (a colon after the last slash, so not a port)."""
    if "@sha256:" in image:
        return True
    last = image.rsplit("/", 1)[-1]
    return ":" in last and not last.endswith(":") and not image.endswith(":latest")


def _check_image(c: StackConfig) -> list[str]:
    if c.plugin_image_build:
        problems: list[str] = []
        if c.plugin_image is not None:
            problems.append(
                f"{_key('pluginImage')}: set together with {_key('pluginImageBuild')}: true; pick "
                f"one (pulumi config rm {_key('pluginImage')})"
            )
        if c.acr_instance_id is None:
            problems.append(
                f"{_key('acrInstanceId')}: required with {_key('pluginImageBuild')}: true, the ACR "
                "Enterprise Edition instance to push to (the Personal Edition is deprecated) "
                f"{_set('acrInstanceId', 'cri-<id>')}"
            )
        elif not re.fullmatch(r"cri-[a-z0-9]+", c.acr_instance_id):
            problems.append(
                f"{_key('acrInstanceId')}: {c.acr_instance_id!r} is not an ACR Enterprise "
                f"Edition instance ID {_set('acrInstanceId', 'cri-<id>')}"
            )
        if (c.registry_username is None) != (c.registry_password is None):
            problems.append(
                f"{_key('registryUsername')}/{_key('registryPassword')}: give both, or neither "
                "to push with your own `docker login` "
                f"(pulumi config set --secret {_key('registryPassword')} <password>)"
            )
        return problems
    if c.acr_instance_id is not None:
        return [
            f"{_key('acrInstanceId')}: only used with {_key('pluginImageBuild')}: true "
            f"(pulumi config rm {_key('acrInstanceId')})"
        ]
    if c.plugin_image is None:
        return [
            f"{_key('pluginImage')}: required unless {_key('pluginImageBuild')}: true "
            f"{_set('pluginImage', '<registry>/<repo>@sha256:<digest>')} or "
            f"{_set('pluginImageBuild', 'true')}"
        ]
    if not is_pinned(c.plugin_image):
        return [
            f"{_key('pluginImage')}: {c.plugin_image!r} is not pinned: give a digest or a tag "
            f"other than latest {_set('pluginImage', '<registry>/<repo>@sha256:<digest>')}"
        ]
    return []


def _check_timeouts(c: StackConfig) -> list[str]:
    problems: list[str] = []
    if not _DURATION.match(c.plugin_await_timeout):
        problems.append(
            f"{_key('pluginAwaitTimeout')}: {c.plugin_await_timeout!r} is not a duration like "
            f"10m or 1h {_set('pluginAwaitTimeout', '10m')}"
        )
    if c.job_await_timeout is not None and not _DURATION.match(c.job_await_timeout):
        problems.append(
            f"{_key('jobAwaitTimeout')}: {c.job_await_timeout!r} is not a duration like 30m or "
            f"2h {_set('jobAwaitTimeout', '30m')}, or unset it to skip awaiting "
            f"(pulumi config rm {_key('jobAwaitTimeout')})"
        )
    return problems


def _check_samples(c: StackConfig) -> list[str]:
    problems: list[str] = []
    for job in c.sample_jobs:
        if job not in SAMPLE_JOBS:
            problems.append(
                f"{_key('sampleJobs')}: unknown sample {job!r}; choose from "
                f"{', '.join(SAMPLE_JOBS)} {_set('sampleJobs', json.dumps(list(SAMPLE_JOBS)))}"
            )
        elif c.sample_image(job) is None:
            key = SAMPLE_IMAGE_KEYS[job]
            problems.append(
                f"{_key(key)}: required because {_key('sampleJobs')} enables {job} "
                f"{_set(key, '<image>:<tag>')}"
            )
    return problems
