"""Stack config: THE ONLY module reading Pulumi config; returns one frozen, validated model whose
types say what is legal (create or adopt a cluster, pin or build the plugin image)."""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import Any

from pulumi.runtime import get_config, get_config_env, is_config_secret
from pydantic import SecretStr, ValidationError

from common.userfiles import described
from infra.stack.credentials import (
    CREDENTIAL_KEYS,
    KUBECONFIG,
    kubeconfig_problem,
    plaintext_problems,
)
from infra.stack.files import project_defaults
from infra.stack.images import is_pinned, reference_problem
from infra.stack.keys import (
    IMAGE_KEYS,
    KNOWN_KEYS,
    LIST_KEYS,
    Keys,
    Monitoring,
    StackConfigError,
    describe,
    seconds,
    unknown_key_problems,
)
from infra.stack.keys import config_set as _set
from infra.stack.keys import config_set_items as _set_items
from infra.stack.keys import qualified as _key
from infra.stack.plugin_bridge import plugin_config, plugin_launch
from infra.stack.samples import SAMPLES
from plugin.config import PluginConfig
from plugin.launch import DraLaunchSpec, LaunchSpec

# At most the nodes of one ACK node pool (1000): a Lingjun node group holds tens; a slip like
# 100000000 fails here, before any resource is planned, not at the cloud API.
MAX_NODE_COUNT = 1000
# A Kubernetes namespace name is an RFC 1123 label.
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


@dataclass(frozen=True)
class NetworkPlan:
    """The VPC and vSwitches a created cluster lives in."""

    vpc_cidr: str
    vswitch_cidrs: tuple[str, ...]
    zone_ids: tuple[str, ...]
    ipv6: bool
    service_cidr: str


@dataclass(frozen=True)
class NewLingjunGroup:
    """Create the eflo (Lingjun) cluster and node group."""

    machine_type: str
    image_id: str
    hpn_zone: str


@dataclass(frozen=True)
class AdoptedLingjunGroup:
    """An existing eflo cluster and node group, by id."""

    cluster_id: str
    node_group_id: str


@dataclass(frozen=True)
class CreateCluster:
    """VPC + ACK Pro + a Lingjun node pool on a new or adopted eflo node group."""

    network: NetworkPlan
    kubernetes_version: str | None
    group: NewLingjunGroup | AdoptedLingjunGroup
    node_count: int
    compute_network_ipv6: bool


@dataclass(frozen=True)
class KubeconfigCluster:
    """Any existing cluster, by its kubeconfig: no cloud account involved."""

    kubeconfig: SecretStr


@dataclass(frozen=True)
class AckCluster:
    """An existing ACK cluster by id: its kubeconfig comes from ACK."""

    cluster_id: str


@dataclass(frozen=True)
class PinnedImage:
    ref: str  # by digest, or a tag other than latest


@dataclass(frozen=True)
class RegistryLogin:
    username: str
    password: SecretStr


@dataclass(frozen=True)
class BuiltImage:
    """plugin/Dockerfile built and pushed to an ACR Enterprise Edition instance."""

    acr_instance_id: str
    # None: push with the deployer's `docker login`, pull with ACK's credential helper
    login: RegistryLogin | None


@dataclass(frozen=True)
class SampleJob:
    name: str  # a key of infra.components.jobs.SAMPLES
    image: str


@dataclass(frozen=True)
class StackConfig:
    """A stack, validated: each union says which of its legal shapes the stack has."""

    region: str
    cluster: CreateCluster | KubeconfigCluster | AckCluster
    plugin_image: PinnedImage | BuiltImage
    # The plugin's own model (one pool, the network mode): its rules are the plugin's.
    plugin: PluginConfig
    # How the DaemonSet launches the plugin (its flags): the plugin's own launch contract.
    plugin_launch: LaunchSpec | DraLaunchSpec
    namespace: str
    samples: tuple[SampleJob, ...]
    # jobAwaitTimeout in seconds: the sample Jobs' activeDeadlineSeconds; None: not awaited
    job_deadline_seconds: int | None
    plugin_await_timeout: str
    # The plugin's scrape, alerts and dashboard, for this monitoring (rdmaMonitoring)
    monitoring: Monitoring
    # The nodes the node agent's DaemonSet runs on (agentNodeSelector)
    node_selector: Mapping[str, str]

    @property
    def non_host_network(self) -> bool:
        return self.plugin.non_host_network

    @property
    def dra(self) -> bool:
        """Pods ask for RDMA through resource.k8s.io claims (rdmaApi: dra)."""
        return isinstance(self.plugin_launch, DraLaunchSpec)

    @property
    def resource_name(self) -> str:
        return self.plugin.pools[0].resource_name

    @property
    def needs_cloud(self) -> bool:
        """Anything talks to Alibaba Cloud (an adopted kubeconfig alone does not)."""
        return not isinstance(self.cluster, KubeconfigCluster) or isinstance(
            self.plugin_image, BuiltImage
        )


def load() -> StackConfig:
    """Read and validate the stack's config through Pulumi's public config API.

    Unknown keys: the CLI hands the program every key in PULUMI_CONFIG, the one place a public
    API lists them; the offline render checks its stack files itself (infra/stack/files.py).
    """
    problems = unknown_key_problems(get_config_env())
    if problems:
        raise StackConfigError("\n".join(problems))
    # Raw strings, not pulumi.Config.get: that warns on secret keys, and the model wraps those
    # (kubeconfig, registryPassword) in SecretStr until a component marks them secret outputs.
    raw: dict[str, str] = {}
    for key in sorted(KNOWN_KEYS):
        value = get_config(_key(key))
        if value is not None and str(value) != "":
            raw[key] = str(value)
    secret = {k for k in CREDENTIAL_KEYS if is_config_secret(_key(k))}
    return parse(raw, secret)


def parse_stack(values: Mapping[str, str], secret: Set[str]) -> StackConfig:
    """parse() of a stack's config as infra/stack/files.py reads it (keys with their namespace),
    each key as load() reads it from the engine."""
    raw = {k: v for k in sorted(KNOWN_KEYS) if (v := values.get(_key(k))) is not None and v != ""}
    return parse(raw, {k for k in CREDENTIAL_KEYS if _key(k) in secret})


def parse(raw: Mapping[str, str], secret: Set[str] = frozenset()) -> StackConfig:
    """Validate raw strings (as Pulumi stores them) into the model, or raise with every fix.

    `secret`: the keys whose value the stack stores encrypted (`pulumi config set --secret`).
    """
    values: dict[str, Any] = {}
    images: dict[str, str] = {}
    problems = _plaintext_credentials(raw, secret)
    reference_problems: list[str] = []
    for key, value in raw.items():
        if key in IMAGE_KEYS:  # checked whether or not its sample is enabled
            images[key] = value
            problem = reference_problem(value)
            if problem is not None:
                reference_problems.append(f"{_key(key)}: {problem} {_set(key, '<image>:<tag>')}")
        elif key in LIST_KEYS:
            try:
                values[key] = json.loads(value)
            except json.JSONDecodeError:
                problems.append(
                    f"{_key(key)}: not a JSON list (got {described(value)}) {_set_items(key)}"
                )
            except RecursionError:
                problems.append(
                    f"{_key(key)}: JSON nested too deep to read (a list of plain items is "
                    f"expected) {_set_items(key)}"
                )
        else:
            values[key] = value
    if problems:
        raise StackConfigError("\n".join(problems))
    try:
        k = Keys.model_validate(values)
    except ValidationError as exc:
        raise StackConfigError("\n".join(describe(e) for e in exc.errors())) from None
    # Each part reads its keys into its type, or says why it cannot; all problems at once.
    cluster, cluster_problems = _cluster(k)
    image, image_problems = _plugin_image(k)
    plugin, plugin_problems = plugin_config(k)
    samples, sample_problems = _samples(k, images)
    deadline, timeout_problems = _timeouts(k)
    selector, selector_problems = _node_selector(k)
    launch, launch_problems = plugin_launch(k)
    problems = [
        *_unused(k, {key for key, value in raw.items() if value != project_defaults().get(key)}),
        *_check_network_mode(k),
        *_check_api(k),
        *_check_monitoring(k),
        *cluster_problems,
        *_check_names(k),
        *plugin_problems,
        *launch_problems,
        *image_problems,
        *reference_problems,
        *sample_problems,
        *_check_nodes(k, samples),
        *timeout_problems,
        *selector_problems,
    ]
    if problems or cluster is None or image is None or plugin is None or launch is None:
        raise StackConfigError("\n".join(problems))
    return StackConfig(
        region=k.region,
        cluster=cluster,
        plugin_image=image,
        plugin=plugin,
        plugin_launch=launch,
        namespace=k.namespace,
        samples=samples,
        job_deadline_seconds=deadline,
        plugin_await_timeout=k.plugin_await_timeout,
        monitoring=k.rdma_monitoring,
        node_selector=selector,
    )


def _plaintext_credentials(raw: Mapping[str, str], secret: Set[str]) -> list[str]:
    """A credential stored in plain text in a stack file is refused. Pulumi.yaml cannot say
    `secret: true` for these keys: the CLI then requires them on every stack."""
    return [
        f"{_key(key)}: {why}: set it as a secret (pulumi config set --secret {_key(key)} "
        + ("< ~/.kube/config)" if key == KUBECONFIG else "<password>)")
        for key, why in plaintext_problems(raw, secret)
    ]


# The keys only a created cluster reads, and of those, the ones only a created node group reads.
_CREATE_ONLY = ("kubernetesVersion", "zoneIds", "vpcCidr", "vswitchCidrs", "serviceCidr", "ipv6",
                "lingjunClusterId", "lingjunNodeGroupId", "lingjunNodeCount")  # fmt: skip
_NEW_GROUP_ONLY = ("lingjunMachineType", "lingjunImageId", "lingjunHpnZone")


def _unused(k: Keys, chosen: Set[str]) -> list[str]:
    """A key the stack sets (to other than its default) that its mode ignores is refused: its
    author believes it applied. `chosen`: the keys set to other than Pulumi.yaml's default."""
    needs: dict[str, str] = {}
    if not k.creates_cluster:
        adopt = "this stack adopts its cluster"
        needs |= {key: adopt for key in (*_CREATE_ONLY, *_NEW_GROUP_ONLY)}
    elif k.lingjun_node_group_id is not None:
        needs |= {key: f"this stack adopts {_key('lingjunNodeGroupId')}" for key in _NEW_GROUP_ONLY}
    if k.rdma_api == "dra":
        needs["rdmaResourceName"] = (
            f"{_key('rdmaApi')} is dra: pods ask by claim, the DeviceClasses name the devices"
        )
    if not k.sample_jobs:
        needs["jobAwaitTimeout"] = f"{_key('sampleJobs')} deploys no Job"
    for key, sample in IMAGE_KEYS.items():
        if sample not in k.sample_jobs:
            needs[key] = f"{_key('sampleJobs')} does not enable {sample}"
    if k.creates_cluster and k.lingjun_node_group_id is None:
        needs["lingjunClusterId"] = (
            f"this stack creates its Lingjun cluster (it adopts one with a node group of it: "
            f"{_key('lingjunNodeGroupId')})"
        )
    return [
        f"{_key(key)}: not used: {why} (pulumi config rm {_key(key)})"
        for key, why in needs.items()
        if key in chosen
    ]


def _check_network_mode(k: Keys) -> list[str]:
    if k.non_host_network and not k.compute_network_ipv6:
        # The managed add-on accepts this and silently does nothing; we refuse it.
        return [
            f"{_key('nonHostNetwork')}: true needs {_key('computeNetworkIpv6')}: true: RDMA for "
            "pods off the host network works only on an IPv6 Lingjun compute network "
            f"{_set('computeNetworkIpv6', 'true')}, or keep hostNetwork-only pods "
            f"{_set('nonHostNetwork', 'false')}"
        ]
    return []


Cluster = CreateCluster | KubeconfigCluster | AckCluster
# resource.k8s.io/v1 (DRA, GA) is served from Kubernetes 1.34 on.
DRA_SINCE = (1, 34)


def _check_api(k: Keys) -> list[str]:
    """DRA on a cluster this stack creates needs its version said, and 1.34 or newer: an older
    one has no resource.k8s.io/v1, and the driver would publish into nothing."""
    if k.rdma_api != "dra" or not k.creates_cluster:
        return []
    version = _K8S_VERSION.fullmatch(k.kubernetes_version or "")
    fix = f"{_set('kubernetesVersion', '1.34.1-aliyun.1')}, or {_set('rdmaApi', 'devicePlugin')}"
    if version is None:
        return [f"{_key('rdmaApi')}: dra needs {_key('kubernetesVersion')} 1.34 or newer {fix}"]
    if (int(version["major"]), int(version["minor"])) < DRA_SINCE:
        return [
            f"{_key('rdmaApi')}: dra needs Kubernetes 1.34 or newer (resource.k8s.io/v1), not "
            f"{version['major']}.{version['minor']} {fix}"
        ]
    return []


def _check_monitoring(k: Keys) -> list[str]:
    """ARMS is the managed Prometheus of an ACK cluster: one adopted by kubeconfig has no ID
    to give it."""
    if k.rdma_monitoring != "arms" or k.creates_cluster or k.kubeconfig is None:
        return []
    return [
        f"{_key('rdmaMonitoring')}: arms needs an ACK cluster's ID, and this stack adopts its "
        f"cluster by kubeconfig: adopt it by {_key('clusterId')}, or use your own Prometheus "
        f"{_set('rdmaMonitoring', 'prometheusOperator')}"
    ]


def _cluster(k: Keys) -> tuple[Cluster | None, list[str]]:
    if k.cluster_mode == "existing":
        # what only creating uses is still checked on its own: a slip is one either way, and
        # the stack may be switched to create
        if problems := _cidrs(k)[1] + _node_count(k):
            return None, problems
        if k.kubeconfig is not None and k.cluster_id is not None:
            return None, [
                f"{_key('clusterId')}: set together with {_key('kubeconfig')}; an existing "
                f"cluster is adopted by one of them (pulumi config rm {_key('clusterId')})"
            ]
        if k.kubeconfig is not None:
            problem = kubeconfig_problem(k.kubeconfig.get_secret_value())
            if problem is not None:
                return None, [
                    f"{_key('kubeconfig')}: {problem}: set your cluster's kubeconfig "
                    f"(pulumi config set --secret {_key('kubeconfig')} < ~/.kube/config)"
                ]
            return KubeconfigCluster(k.kubeconfig), []
        if k.cluster_id is not None:
            return AckCluster(k.cluster_id), []
        return None, [
            f"{_key('clusterMode')}: existing needs {_key('clusterId')} or "
            f"{_key('kubeconfig')} {_set('clusterId', '<ACK cluster id>')} or "
            f"(pulumi config set --secret {_key('kubeconfig')} < ~/.kube/config)"
        ]
    group, problems = _lingjun_group(k)
    network, cidr_problems = _network(k)
    problems += cidr_problems
    problems += [  # what adopts a cluster means nothing to one being created: said, not ignored
        f"{_key(key)}: only used with {_key('clusterMode')}: existing "
        f"(pulumi config rm {_key(key)}), or adopt that cluster {_set('clusterMode', 'existing')}"
        for key, value in (("clusterId", k.cluster_id), ("kubeconfig", k.kubeconfig))
        if value is not None
    ]
    problems += _node_count(k)
    if group is None or network is None or problems:
        return None, problems
    cluster = CreateCluster(
        network=network,
        kubernetes_version=k.kubernetes_version,
        group=group,
        node_count=k.lingjun_node_count,
        compute_network_ipv6=k.compute_network_ipv6,
    )
    return cluster, []


def _node_count(k: Keys) -> list[str]:
    if 0 <= k.lingjun_node_count <= MAX_NODE_COUNT:
        return []
    return [
        f"{_key('lingjunNodeCount')}: {_number(k.lingjun_node_count)} is not "
        f"0..{MAX_NODE_COUNT} (the nodes of one node pool) {_set('lingjunNodeCount', '2')}"
    ]


def _number(value: int) -> str:
    """A refused number, quoted while short enough to read (a slip of the keyboard), else
    described."""
    text = str(value)
    return text if len(text) <= 12 else f"a number of {len(text.lstrip('-'))} digits"


def _lingjun_group(k: Keys) -> tuple[NewLingjunGroup | AdoptedLingjunGroup | None, list[str]]:
    """An adopted node group (both ids), or the inputs to create one."""
    if k.lingjun_node_group_id is not None:
        if k.lingjun_cluster_id is None:
            return None, [
                f"{_key('lingjunNodeGroupId')}: needs the Lingjun cluster it belongs to "
                f"{_set('lingjunClusterId', '<eflo cluster id>')}"
            ]
        return AdoptedLingjunGroup(k.lingjun_cluster_id, k.lingjun_node_group_id), []
    if k.lingjun_machine_type and k.lingjun_image_id and k.lingjun_hpn_zone:
        return NewLingjunGroup(k.lingjun_machine_type, k.lingjun_image_id, k.lingjun_hpn_zone), []
    inputs = {
        "lingjunMachineType": k.lingjun_machine_type,
        "lingjunImageId": k.lingjun_image_id,
        "lingjunHpnZone": k.lingjun_hpn_zone,
    }
    return None, [
        f"{_key(key)}: required to create the Lingjun node group "
        f"{_set(key, '<value>')}, or adopt an existing one "
        f"{_set('lingjunNodeGroupId', '<eflo node group id>')}"
        for key, value in inputs.items()
        if value is None
    ]


# Prefix lengths: a VPC's and a vSwitch's, as Alibaba Cloud's VPC takes them; the Services'
# ours, room for at least 256 Services and at most a /12's million.
CIDR_PREFIXES = {"vpcCidr": (8, 28), "vswitchCidrs": (16, 29), "serviceCidr": (12, 24)}
# vSwitches in one VPC, at most (its quota)
MAX_VSWITCHES = 150

_CIDR_EXAMPLES = {
    "vpcCidr": "192.168.0.0/16",
    "serviceCidr": "172.16.0.0/16",
    "vswitchCidrs": LIST_KEYS["vswitchCidrs"],
}


def _network(k: Keys) -> tuple[NetworkPlan | None, list[str]]:
    nets, problems = _cidrs(k)
    if problems:
        return None, problems
    if not k.vswitch_cidrs:
        problems.append(f"{_key('vswitchCidrs')}: list at least one {_set_items('vswitchCidrs')}")
    if len(k.vswitch_cidrs) > MAX_VSWITCHES:
        problems.append(
            f"{_key('vswitchCidrs')}: {len(k.vswitch_cidrs)} vSwitches, over a VPC's "
            f"{MAX_VSWITCHES} {_set_items('vswitchCidrs')}"
        )
        return None, problems  # their pairs are not checked for overlaps: that is n^2
    if len(k.zone_ids) != len(k.vswitch_cidrs):
        problems.append(
            f"{_key('zoneIds')}: one zone per vSwitch CIDR ({len(k.vswitch_cidrs)} CIDRs, "
            f"{len(k.zone_ids)} zones) {_set_items('zoneIds')}"
        )
    if _REGION.fullmatch(k.region):  # a zone ID is its region's and more: cn-wulanchabu-c
        problems += [  # described, not quoted: a value typed into the wrong key may be a secret
            f"{_key(f'zoneIds[{i}]')}: not a zone of {_key('region')} {k.region} (got "
            f"{described(zone)}): name one of its zones (pulumi config set --path "
            f"'{_key(f'zoneIds[{i}]')}' {k.region}-<zone>), or set the region the zone is in "
            f"{_set('region', '<region>')}"
            for i, zone in enumerate(k.zone_ids)
            if _CLOUD_ID.fullmatch(zone) and not (zone.startswith(k.region) and zone != k.region)
        ]
    vpc = nets["vpcCidr"]
    switches = [(key, n) for key, n in nets.items() if key.startswith("vswitchCidrs")]
    for key, net in switches:
        if not net.subnet_of(vpc):
            problems.append(
                f"{_key(key)}: {net} is outside {_key('vpcCidr')} {vpc} "
                f"{_set_items('vswitchCidrs')}"
            )
    for i, (ka, a) in enumerate(switches):
        for j, (kb, b) in enumerate(switches[i + 1 :], i + 1):
            if a.overlaps(b):
                fix = _moved(vpc, switches, j)
                problems.append(f"{_key(ka)}: {a} overlaps {_key(kb)} {b} {fix}")
    if nets["serviceCidr"].overlaps(vpc):
        problems.append(
            f"{_key('serviceCidr')}: {nets['serviceCidr']} overlaps {_key('vpcCidr')} {vpc}: "
            f"Service IPs must not collide with node IPs {_set('serviceCidr', '172.16.0.0/16')}"
        )
    plan = NetworkPlan(k.vpc_cidr, k.vswitch_cidrs, k.zone_ids, k.ipv6, k.service_cidr)
    return (None if problems else plan), problems


def _moved(
    vpc: ipaddress.IPv4Network, switches: list[tuple[str, ipaddress.IPv4Network]], j: int
) -> str:
    """The fix for vSwitch j overlapping another: the first range of its size in the VPC that
    none of the others overlaps (one suggestion of many), or that the VPC has none left."""
    key, net = switches[j]
    taken = [n for i, (_, n) in enumerate(switches) if i != j]
    free = _disjoint(vpc, max(net.prefixlen, vpc.prefixlen), taken)
    if free is None:
        return f"and {_key('vpcCidr')} has no /{net.prefixlen} left {_set_items('vswitchCidrs')}"
    values = [str(free) if i == j else str(n) for i, (_, n) in enumerate(switches)]
    return (
        f"(pulumi config set --path '{_key(key)}' {free}; "
        f"render: --set 'vswitchCidrs={json.dumps(values, separators=(',', ':'))}')"
    )


def _disjoint(
    vpc: ipaddress.IPv4Network, prefix: int, taken: list[ipaddress.IPv4Network]
) -> ipaddress.IPv4Network | None:
    """The lowest /prefix of vpc that overlaps none of taken: each candidate hit skips past
    the range hitting it, so at most len(taken) + 1 candidates are tried."""
    size = 1 << (32 - prefix)
    at, end = int(vpc.network_address), int(vpc.broadcast_address)
    while at + size - 1 <= end:
        candidate = ipaddress.IPv4Network((at, prefix))
        hit = next((t for t in taken if t.overlaps(candidate)), None)
        if hit is None:
            return candidate
        at = max(at + size, -(-(int(hit.broadcast_address) + 1) // size) * size)
    return None


def _cidrs(k: Keys) -> tuple[dict[str, ipaddress.IPv4Network], list[str]]:
    """Each CIDR key on its own: an IPv4 network, as written, of its prefix range."""
    problems: list[str] = []
    nets: dict[str, ipaddress.IPv4Network] = {}
    for key, value in (
        ("vpcCidr", k.vpc_cidr),
        ("serviceCidr", k.service_cidr),
        *((f"vswitchCidrs[{i}]", v) for i, v in enumerate(k.vswitch_cidrs)),
    ):
        base = key.split("[")[0]
        try:
            nets[key] = ipaddress.IPv4Network(value)
        except ValueError as exc:
            example = _CIDR_EXAMPLES[base]
            why = f"not an IPv4 CIDR like {example} (got {described(value)})"
            if "host bits set" in str(exc):  # an address in a network: name that network
                example = str(ipaddress.IPv4Network(value, strict=False))
                why = f"{value} has bits set past its prefix: the network is {example}"
            fix = _set_items(base) if base in LIST_KEYS else _set(base, example)
            problems.append(f"{_key(key)}: {why} {fix}")
            continue
        if str(nets[key]) != value:  # 10.0.0.0/08, 010.0.0.0/8: read, but not as written
            fix = _set_items(base) if base in LIST_KEYS else _set(base, str(nets[key]))
            problems.append(f"{_key(key)}: write it as {nets[key]} {fix}")
            del nets[key]
            continue
        low, high = CIDR_PREFIXES[base]
        if not low <= nets[key].prefixlen <= high:
            fix = _set_items(base) if base in LIST_KEYS else _set(base, _CIDR_EXAMPLES[base])
            problems.append(f"{_key(key)}: a /{nets[key].prefixlen}, not /{low} to /{high} {fix}")
    return nets, problems


# Namespaces of the cluster itself: the program owns its namespace (destroy deletes it).
_SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
# An Alibaba Cloud region ID, and a Kubernetes version as ACK spells it.
_REGION = re.compile(r"(?=.{4,32}$)[a-z]{2}(-[a-z0-9]+)+")  # cn-wulanchabu; the longest is 20
_CLOUD_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
_K8S_VERSION = re.compile(r"(?P<major>1)\.(?P<minor>[0-9]{1,2})\.[0-9]{1,3}(-aliyun\.[0-9]{1,3})?")


def _check_names(k: Keys) -> list[str]:
    problems: list[str] = []
    if not _REGION.fullmatch(k.region):
        problems.append(
            f"{_key('region')}: not a region ID (got {described(k.region)}) "
            f"{_set('region', 'cn-wulanchabu')}"
        )
    if k.kubernetes_version is not None and not _K8S_VERSION.fullmatch(k.kubernetes_version):
        problems.append(
            f"{_key('kubernetesVersion')}: not a version as "
            f"ACK spells it {_set('kubernetesVersion', '1.34.1-aliyun.1')}, or unset it for "
            f"ACK's default (pulumi config rm {_key('kubernetesVersion')})"
        )
    ids = {
        "clusterId": k.cluster_id,
        "lingjunClusterId": k.lingjun_cluster_id,
        "lingjunNodeGroupId": k.lingjun_node_group_id,
        "lingjunMachineType": k.lingjun_machine_type,
        "lingjunImageId": k.lingjun_image_id,
        "lingjunHpnZone": k.lingjun_hpn_zone,
        **{f"zoneIds[{i}]": z for i, z in enumerate(k.zone_ids)},
    }
    for key, value in ids.items():
        if value is not None and not _CLOUD_ID.fullmatch(value):
            fix = (  # a list's item is set by its path
                f"(pulumi config set --path '{_key(key)}' <id>)"
                if "[" in key
                else _set(key, "<id>")
            )
            problems.append(
                f"{_key(key)}: not an Alibaba Cloud ID or name (letters, "
                f"digits, '.', '_', ':', '-'; at most 128) {fix}"
            )
    if k.namespace in _SYSTEM_NAMESPACES:
        problems.append(
            f"{_key('namespace')}: {k.namespace} is the cluster's own: the program creates and "
            f"deletes its namespace {_set('namespace', 'lingjun-rdma')}"
        )
    if not _DNS_LABEL.fullmatch(k.namespace):
        problems.append(
            f"{_key('namespace')}: not a Kubernetes namespace name "
            "(lower case letters, digits and '-', at most 63, starting and ending with a letter "
            f"or digit) {_set('namespace', 'lingjun-rdma')}"
        )
    return problems


def _plugin_image(k: Keys) -> tuple[PinnedImage | BuiltImage | None, list[str]]:
    if k.plugin_image_build:
        return _built_image(k)
    build_only = {
        "acrInstanceId": k.acr_instance_id,
        "registryUsername": k.registry_username,
        "registryPassword": k.registry_password,
    }
    unused = [key for key, value in build_only.items() if value is not None]
    if unused:
        return None, [
            f"{_key(key)}: only used with {_key('pluginImageBuild')}: true "
            f"(pulumi config rm {_key(key)})"
            for key in unused
        ]
    if k.plugin_image is None:
        return None, [
            f"{_key('pluginImage')}: required unless {_key('pluginImageBuild')}: true "
            f"{_set('pluginImage', '<registry>/<repo>@sha256:<digest>')} or "
            f"{_set('pluginImageBuild', 'true')}"
        ]
    problem = reference_problem(k.plugin_image)
    if problem is not None:
        return None, [
            f"{_key('pluginImage')}: {problem} "
            f"{_set('pluginImage', '<registry>/<repo>@sha256:<digest>')}"
        ]
    if not is_pinned(k.plugin_image):
        return None, [
            f"{_key('pluginImage')}: not pinned: give a digest or a tag "
            f"other than latest {_set('pluginImage', '<registry>/<repo>@sha256:<digest>')}"
        ]
    return PinnedImage(k.plugin_image), []


def _built_image(k: Keys) -> tuple[BuiltImage | None, list[str]]:
    problems: list[str] = []
    if k.plugin_image is not None:
        problems.append(
            f"{_key('pluginImage')}: set together with {_key('pluginImageBuild')}: true; pick "
            f"one (pulumi config rm {_key('pluginImage')})"
        )
    if k.acr_instance_id is None:
        problems.append(
            f"{_key('acrInstanceId')}: required with {_key('pluginImageBuild')}: true, the ACR "
            "Enterprise Edition instance to push to (the Personal Edition is deprecated) "
            f"{_set('acrInstanceId', 'cri-<id>')}"
        )
    elif not re.fullmatch(r"cri-[a-z0-9]+", k.acr_instance_id):
        problems.append(
            f"{_key('acrInstanceId')}: not an ACR Enterprise "
            f"Edition instance ID {_set('acrInstanceId', 'cri-<id>')}"
        )
    user = k.registry_username
    if user is not None and not re.fullmatch(r"[\x21-\x39\x3b-\x7e]{1,256}", user):
        problems.append(  # `user:password` is what a login sends: a ':' in the user breaks it
            f"{_key('registryUsername')}: {described(user)}: a registry user name is 1-256 "
            "visible ASCII characters without ':' "
            f"{_set('registryUsername', '<user>')}"
        )
    login = None
    if k.registry_username is not None and k.registry_password is not None:
        login = RegistryLogin(k.registry_username, k.registry_password)
    elif (k.registry_username is None) != (k.registry_password is None):
        problems.append(
            f"{_key('registryUsername')}/{_key('registryPassword')}: give both, or neither "
            "to push with your own `docker login` "
            f"(pulumi config set --secret {_key('registryPassword')} <password>)"
        )
    if problems or k.acr_instance_id is None:
        return None, problems
    return BuiltImage(k.acr_instance_id, login), []


# ACK's label of its Lingjun nodes: what a created cluster's node pool carries.
LINGJUN_NODE_LABEL = ("alibabacloud.com/lingjun-worker", "true")
# A label's key ([prefix/]name) and value, as Kubernetes takes them.
_LABEL_KEY = re.compile(
    r"(?:(?=[^/]{1,253}/)[a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?(?=.{1,63}$)[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)
_LABEL_VALUE = re.compile(r"(?:(?=.{1,63}$)[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


def _node_selector(k: Keys) -> tuple[dict[str, str], list[str]]:
    """The agent's nodes: ACK's Lingjun label on a cluster the stack creates, unless the stack
    says otherwise; an adopted cluster's own choice (no node of it carries that label unless
    someone put it there)."""
    example = "=".join(LINGJUN_NODE_LABEL)
    fix = _set("agentNodeSelector", example)
    if not k.agent_node_selector:
        if k.creates_cluster:
            return dict([LINGJUN_NODE_LABEL]), []
        return {}, [
            f"{_key('agentNodeSelector')}: required on an adopted cluster: the label its RDMA "
            f"nodes carry (kubectl get nodes --show-labels), as LABEL=VALUE {fix}"
        ]
    selector: dict[str, str] = {}
    for i, pair in enumerate(k.agent_node_selector.split(",")):
        key, sep, value = pair.strip().partition("=")
        if not sep or not _LABEL_KEY.fullmatch(key) or not _LABEL_VALUE.fullmatch(value):
            return {}, [
                f"{_key('agentNodeSelector')}: its item {i + 1} is not LABEL=VALUE as Kubernetes "
                f"spells a label (got {described(pair)}) {fix}"
            ]
        selector[key] = value
    return selector, []


def _timeouts(k: Keys) -> tuple[int | None, list[str]]:
    """The Jobs' deadline in seconds (None: not awaited), after both durations are checked."""
    _, problems = seconds("pluginAwaitTimeout", k.plugin_await_timeout, "10m")
    if k.job_await_timeout is None:
        return None, problems
    deadline, job_problems = seconds("jobAwaitTimeout", k.job_await_timeout, "30m")
    return deadline, problems + [
        f"{p}, or unset it to skip awaiting (pulumi config rm {_key('jobAwaitTimeout')})"
        for p in job_problems
    ]


def _check_nodes(k: Keys, samples: tuple[SampleJob, ...]) -> list[str]:
    """A sample whose pods need more nodes than the stack creates would stay Pending."""
    if not k.creates_cluster or _node_count(k):
        return []  # an adopted cluster's nodes are not known before it is reached
    needs = {s.name: SAMPLES[s.name].build(s.image).nodes for s in samples}
    fits = [name for name, n in needs.items() if n <= k.lingjun_node_count]
    return [
        f"{_key('sampleJobs')}: {name} runs on {n} node{'s' if n > 1 else ''} at once, and "
        f"{_key('lingjunNodeCount')} is {k.lingjun_node_count}: its pods would stay Pending "
        f"{_set('lingjunNodeCount', str(n))}, or leave it out {_set_items('sampleJobs', fits)}"
        for name, n in needs.items()
        if n > k.lingjun_node_count
    ]


def _samples(k: Keys, images: Mapping[str, str]) -> tuple[tuple[SampleJob, ...], list[str]]:
    samples: list[SampleJob] = []
    problems: list[str] = []
    for name in sorted({n for n in k.sample_jobs if k.sample_jobs.count(n) > 1 and n in SAMPLES}):
        problems.append(f"{_key('sampleJobs')}: {name} is listed twice: list each sample once")
    for name in dict.fromkeys(k.sample_jobs):
        sample = SAMPLES.get(name)
        if sample is None:
            problems.append(
                f"{_key('sampleJobs')}: an unknown sample ({described(name)}); choose from "
                f"{', '.join(SAMPLES)} {_set_items('sampleJobs')}"
            )
        elif sample.image_key not in images:
            problems.append(
                f"{_key(sample.image_key)}: required because {_key('sampleJobs')} enables "
                f"{name} {_set(sample.image_key, '<image>:<tag>')}"
            )
        elif reference_problem(images[sample.image_key]) is not None:
            pass  # said with the keys
        elif not is_pinned(images[sample.image_key]):  # as the plugin's: a rerun gets the same
            problems.append(
                f"{_key(sample.image_key)}: not pinned: give a digest or a tag other than "
                f"latest {_set(sample.image_key, '<image>:<tag>')}"
            )
        else:
            samples.append(SampleJob(name, images[sample.image_key]))
    return tuple(samples), problems
