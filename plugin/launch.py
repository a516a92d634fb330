"""The contract between the plugin's programs and infra/: how each program is started (its
module and typed flags) and every path, port, socket name, limit and env var name that both
sides use. infra/ renders the DaemonSet's and the pods' commands from these specs; the programs
parse into them; tests build their command lines from them. A fact written here is written
nowhere else."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Literal, TypeVar, get_args

from common.terminal import Parser
from common.userfiles import decimal, described, file_kind
from plugin.config import but_for_case, taken_domain

# The programs, each run as `python -m MODULE`.
DEVICE_PLUGIN_MODULE = "plugin.deviceplugin"
DRA_MODULE = "plugin.dra"
PODENV_MODULE = "plugin.podenv"

# Paths and ports the DaemonSet and the device plugin agree on.
DEFAULT_CONFIG_PATH = Path("/etc/lingjun-rdma/plugin.yaml")
DEFAULT_DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_METRICS_PORT = 9460
KUBELET_SOCKET = "kubelet.sock"
# The longest unix socket path grpc-core binds ("Path name should not have more than 107
# characters" from 106 bytes on: it counts more than sockaddr_un's NUL); a test binds one of
# exactly this length and fails on one more, so a grpc that changes it is caught.
MAX_UNIX_PATH = 105

# The container env that names the HCAs an allocation gave; podenv reads it.
HCAS_ENV = "LINGJUN_RDMA_HCAS"

# The DRA driver: its name (the resource.k8s.io driver, and the CDI vendor), the kubelet's dirs
# it registers and serves in, the runtime's CDI dir, its metrics port (beside the device
# plugin's on a node that runs both while migrating).
DRA_DRIVER = "rdma.lingjun-rdma.io"
DEFAULT_PLUGINS_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
DEFAULT_PLUGINS_DIR = Path("/var/lib/kubelet/plugins")
DEFAULT_CDI_DIR = Path("/var/run/cdi")
DEFAULT_DRA_METRICS_PORT = 9461
# The env var the DaemonSet sets from spec.nodeName (the downward API).
NODE_NAME_ENV = "NODE_NAME"
# Where a Node's Events go (the kubelet posts its own there): the plugin's, and its RBAC's.
EVENT_NAMESPACE = "default"


def cdi_kind(driver: str) -> str:
    """The CDI kind (vendor/class) of the driver's devices."""
    return f"{driver}/hca"


# The DRA driver's program, as its refusals and Events name it.
DRA_PROG = "rdma-dra-driver"


def dra_socket(plugins_dir: Path, driver: str) -> Path:
    """Where the driver serves the kubelet's DRAPlugin service."""
    return plugins_dir / driver / "dra.sock"


def registration_socket(plugins_registry_dir: Path, driver: str) -> Path:
    """Where the kubelet's plugin watcher finds the driver."""
    return plugins_registry_dir / f"{driver}-reg.sock"


def socket_name(resource_name: str) -> str:
    """The device plugin's socket for one resource, in the device-plugins dir."""
    return "lingjun-rdma-" + resource_name.replace("/", "_") + ".sock"


def cdi_spec_name(resource_name: str) -> str:
    """The device plugin's CDI spec file for one resource, in the CDI dir."""
    return "lingjun-rdma-" + resource_name.replace("/", "_") + ".json"


DiscoveryKind = Literal["auto", "verbs", "sysfs"]
# Seconds between periodic scans: shorter keeps a core re-reading sysfs (hundreds of GID files
# per port), longer is no backstop at all.
RESCAN_INTERVAL_RANGE = (0.1, 3600.0)
LogLevel = Literal["debug", "info", "warning", "error"]
OnOff = Literal["on", "off"]


class LaunchError(ValueError):
    """A value the plugin refuses: `field` names it, `why` says what it must be."""

    def __init__(self, field: str, why: str) -> None:
        self.field, self.why = field, why
        super().__init__(why)


@dataclass(frozen=True)
class CoreSpec:
    """What every front end of the core takes: the config, the node's trees, the scans, the
    metrics and the log."""

    # None: DEFAULT_CONFIG_PATH if it exists, else the default config; a path given must exist.
    config: Path | None = None
    sysfs_root: Path = Path("/sys")
    dev_root: Path = Path("/dev")
    discovery: DiscoveryKind = "auto"
    # Seconds between periodic scans, the backstop behind netlink and uevent events.
    rescan_interval: float = 5.0
    # HOST:PORT for /metrics and /healthz; "" disables them.
    metrics_address: str = f"0.0.0.0:{DEFAULT_METRICS_PORT}"
    log_level: LogLevel = "info"
    # every RDMA port's counters on /metrics ("off" where node_exporter already exports them)
    port_counters: OnOff = "on"
    # QPs per pod on /metrics, from rdma netlink's resource tracking ("on" needs the host's pid
    # namespace: the DaemonSet's hostPID)
    pod_qps: OnOff = "off"
    # the API server: None, the pod's service account (the device plugin: none outside a pod,
    # and its problems are then in its log only, not Events on the Node)
    kubeconfig: Path | None = None
    # "": the NODE_NAME env var (the DaemonSet sets it from spec.nodeName)
    node_name: str = ""

    def __post_init__(self) -> None:
        low, high = RESCAN_INTERVAL_RANGE
        if not low <= self.rescan_interval <= high:  # NaN compares false: refused too
            raise LaunchError("rescan_interval", f"must be {low:g}-{high:g} seconds")
        host, _, port = self.metrics_address.rpartition(":")
        digits = port.isascii() and port.isdigit() and len(port) <= 20
        if _HOST.fullmatch(host) and digits and int(port) > 65535:
            # the number alone is quoted: it is no secret, and a slip is easier fixed seen
            raise LaunchError("metrics_address", f"port {int(port)} is over 65535")
        if self.metrics_address and (self.metrics_port is None or not _HOST.fullmatch(host)):
            raise LaunchError(
                "metrics_address",
                "expected HOST:PORT with a port 0-65535, or an empty value to disable",
            )
        if self.node_name and not _DNS_SUBDOMAIN.fullmatch(self.node_name):
            raise LaunchError("node_name", "must be a node's name (a DNS subdomain)")

    @property
    def config_path(self) -> Path:
        return self.config or DEFAULT_CONFIG_PATH

    @property
    def metrics_host(self) -> str:
        return self.metrics_address.rpartition(":")[0].strip("[]")

    @property
    def metrics_port(self) -> int | None:
        _, sep, text = self.metrics_address.rpartition(":")
        port = decimal(text) if sep else None
        return port if port is not None and port <= 65535 else None

    module = ""  # the program's, each front end's own

    def command(self, python: str = "python") -> list[str]:
        """The command line that runs exactly this spec."""
        return [python, "-m", self.module, *self.argv()]

    def argv(self) -> list[str]:
        """The flags that launch exactly this spec, every one spelled out."""
        args: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                args += [_flag(f.name), str(value)]
        return args


@dataclass(frozen=True)
class LaunchSpec(CoreSpec):
    """How one device plugin process runs."""

    device_plugin_dir: Path = DEFAULT_DEVICE_PLUGIN_DIR
    # None: Allocate answers with device nodes (every runtime); a dir: with CDI devices whose
    # spec it writes there (containerd 1.7+ with CDI on, which 2.x is by default)
    cdi_dir: Path | None = None

    module = DEVICE_PLUGIN_MODULE


@dataclass(frozen=True)
class DraLaunchSpec(CoreSpec):
    """How one DRA driver process runs: the core's flags, and where it meets the kubelet, the
    API server and the runtime. Every path is a flag, so it runs outside a pod against any API
    server."""

    metrics_address: str = f"0.0.0.0:{DEFAULT_DRA_METRICS_PORT}"
    driver_name: str = DRA_DRIVER
    plugins_registry_dir: Path = DEFAULT_PLUGINS_REGISTRY_DIR
    plugins_dir: Path = DEFAULT_PLUGINS_DIR
    cdi_dir: Path = DEFAULT_CDI_DIR

    module = DRA_MODULE

    def __post_init__(self) -> None:
        super().__post_init__()
        if not _DNS_SUBDOMAIN.fullmatch(self.driver_name) or "." not in self.driver_name:
            case = " (in lower case: it has capitals)" if but_for_case(self.driver_name) else ""
            raise LaunchError(
                "driver_name", f"must be a DNS subdomain with a dot{case}, e.g. rdma.x.io"
            )
        if (taken := taken_domain(self.driver_name)) is not None:
            raise LaunchError("driver_name", f"{taken}: name one of your own, e.g. rdma.x.io")
        for path in (
            registration_socket(self.plugins_registry_dir, self.driver_name),
            dra_socket(self.plugins_dir, self.driver_name),
        ):
            if len(os.fsencode(path)) > MAX_UNIX_PATH:
                raise LaunchError(
                    "plugins_dir" if path.name == "dra.sock" else "plugins_registry_dir",
                    f"its socket {path} would be {len(os.fsencode(path))} bytes, over the "
                    f"{MAX_UNIX_PATH}-byte unix limit: name a shorter directory, or give the "
                    f"driver a shorter name (it is {len(self.driver_name)} characters)",
                )


def with_node_name(spec: S) -> S | str:
    """`spec` with the node's name from $NODE_NAME when no flag gave one, checked as the flag's
    is; unchanged when neither names it; or the refusal of the env's value (described, not
    quoted)."""
    node = spec.node_name or os.environ.get(NODE_NAME_ENV, "")
    try:
        return dataclasses.replace(spec, node_name=node)
    except LaunchError as exc:
        return f"${NODE_NAME_ENV} {described(node)}: {exc.why}"


# A listening address's host: a name, an IPv4 address, [an IPv6 one], or empty (every one).
_HOST = re.compile(r"[A-Za-z0-9.-]*|\[[0-9A-Fa-f:.]+\]")
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


_HELP = {
    "config": f"plugin config (default {DEFAULT_CONFIG_PATH}; absent: defaults)",
    "discovery": "auto: verbs when pyverbs finds devices, else sysfs",
    "rescan_interval": "periodic re-scan in seconds, the backstop behind netlink events",
    "metrics_address": "HOST:PORT for /metrics and /healthz; empty disables",
    "kubeconfig": "API server credentials (default: the pod's service account)",
    "node_name": f"this node's name (default: ${NODE_NAME_ENV})",
    "port_counters": "every RDMA port's counters and hw_counters on /metrics",
    "pod_qps": "queue pairs per pod on /metrics (needs the host's pid namespace)",
    "cdi_dir": "where the container runtime reads CDI specs (device plugin: unset, device "
    "nodes in Allocate's answer; set, CDI devices)",
}
_CHOICES: dict[str, tuple[str, ...]] = {
    "discovery": get_args(DiscoveryKind),
    "log_level": get_args(LogLevel),
    "port_counters": get_args(OnOff),
    "pod_qps": get_args(OnOff),
}


_FLOAT = re.compile(r"[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|\.[0-9]+(?:[eE][-+]?[0-9]+)?")


class _Typed(float):
    """A number flag's value, and the text it was typed as: a range error quotes that (1e-400
    is 0.0 once a float)."""

    text = ""


def _float(text: str) -> float:
    """A number as written in ASCII decimal notation: float() alone would also take 1_0, other
    scripts' digits, spaces and nan (each range then speaks of what was not typed)."""
    if not _FLOAT.fullmatch(text.removeprefix("-")):  # 400 digits is a number (out of range)
        raise argparse.ArgumentTypeError("not a number like 5 or 0.5")
    value = _Typed(text)
    value.text = text
    return value


def _path(text: str) -> Path:
    """A path flag, made absolute: grpc reads `unix://dir/x` as a host named dir."""
    if not text:
        raise argparse.ArgumentTypeError("empty: name a path")
    try:  # a byte the shell passed that is not UTF-8: grpc addresses its sockets in UTF-8
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError("not UTF-8: name a path in UTF-8") from None
    return Path(os.path.abspath(text))


# The kubelet's own dir: whatever is there now, the plugin waits for it to become a directory
# (saying why), as for a kubelet not yet started.
_WAITED_FOR = {"device_plugin_dir"}


def _dir(text: str) -> Path:
    """A directory flag: one that may not exist yet (it is waited for, or made), but never a
    file (it would be read, or written into, as if it were a directory)."""
    path = _path(text)
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return path
    if not stat.S_ISDIR(mode):
        raise argparse.ArgumentTypeError(f"is {file_kind(mode)}, not a directory: name a directory")
    return path


S = TypeVar("S", bound=CoreSpec)


def parse(
    argv: list[str] | None,
    spec_type: type[S],
    prog: str = "rdma-device-plugin",
    description: str = "Kubernetes device plugin for RDMA HCAs (rdma/hca)",
) -> S:
    """The command line as a `spec_type`; a bad flag exits 2 naming it (argparse's way)."""
    parser = Parser(prog, description)
    defaults = spec_type()
    for f in fields(spec_type):
        default = getattr(defaults, f.name)
        kind: Callable[[str], object] = (
            _float
            if isinstance(default, float)
            else str
            if isinstance(default, str)
            else _dir
            if f.name.endswith(("_dir", "_root")) and f.name not in _WAITED_FOR
            else _path
        )
        parser.add_argument(
            _flag(f.name),
            dest=f.name,
            type=kind,
            default=default,
            choices=_CHOICES.get(f.name),
            help=_HELP.get(f.name),
        )
    values = vars(parser.parse_args(argv))
    try:
        return spec_type(**values)
    except LaunchError as exc:
        value = values[exc.field]  # a number or path is said; text may be a secret
        said = (
            (value.text if len(value.text) <= 24 else described(value.text))
            if isinstance(value, _Typed)
            else str(value)
            if isinstance(value, float | Path)
            else described(value)
        )
        parser.error(f"{_flag(exc.field)} {said}: {exc.why}")


Family = Literal["ipv6", "ipv4"]
FamilyChoice = Literal["auto", "ipv6", "ipv4"]


def family_for(host_network: bool) -> Family:
    """The IP family of a pod's own RoCE v2 GID: the host's IPv4 on the host network; off it,
    IPv6 (the only family a pod's own GID can have)."""
    return "ipv4" if host_network else "ipv6"


@dataclass(frozen=True)
class PodenvSpec:
    """How podenv runs in a pod's init container."""

    # "auto": family_for whether an allocated HCA's netdev is in the pod's namespace
    family: FamilyChoice = "auto"
    # None: print to stdout
    out: Path | None = None
    # extra KEY=VALUE lines to write beside the computed ones
    settings: Mapping[str, str] = field(default_factory=dict[str, str])

    def command(self, python: str = "python") -> list[str]:
        """The command line that runs exactly this spec."""
        out = ["--out", str(self.out)] if self.out is not None else []
        sets = [arg for k, v in self.settings.items() for arg in ("--set", f"{k}={v}")]
        return [python, "-m", PODENV_MODULE, "--family", self.family, *out, *sets]
