"""The contract between the plugin's programs and infra/: how each program is started (its
module and typed flags) and every path, port, socket name, limit and env var name that both
sides use. infra/ renders the DaemonSet's and the pods' commands from these specs; the programs
parse into them; tests build their command lines from them. A fact written here is written
nowhere else."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Literal, get_args

from plugin.core.terminal import Parser
from plugin.core.userfiles import decimal

# The programs, each run as `python -m MODULE`.
DEVICE_PLUGIN_MODULE = "plugin.deviceplugin"
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


def socket_name(resource_name: str) -> str:
    """The device plugin's socket for one resource, in the device-plugins dir."""
    return "lingjun-rdma-" + resource_name.replace("/", "_") + ".sock"


DiscoveryKind = Literal["auto", "verbs", "sysfs"]
# Seconds between periodic scans: shorter keeps a core re-reading sysfs (hundreds of GID files
# per port), longer is no backstop at all.
RESCAN_INTERVAL_RANGE = (0.1, 3600.0)
LogLevel = Literal["debug", "info", "warning", "error"]


class LaunchError(ValueError):
    """A value the plugin refuses: `field` names it, `why` says what it must be."""

    def __init__(self, field: str, why: str) -> None:
        self.field, self.why = field, why
        super().__init__(why)


@dataclass(frozen=True)
class LaunchSpec:
    """How one plugin process runs."""

    # None: DEFAULT_CONFIG_PATH if it exists, else the default config; a path given must exist.
    config: Path | None = None
    sysfs_root: Path = Path("/sys")
    dev_root: Path = Path("/dev")
    device_plugin_dir: Path = DEFAULT_DEVICE_PLUGIN_DIR
    discovery: DiscoveryKind = "auto"
    # Seconds between periodic scans, the backstop behind netlink and uevent events.
    rescan_interval: float = 5.0
    # HOST:PORT for /metrics and /healthz; "" disables them.
    metrics_address: str = f"0.0.0.0:{DEFAULT_METRICS_PORT}"
    log_level: LogLevel = "info"

    def __post_init__(self) -> None:
        low, high = RESCAN_INTERVAL_RANGE
        if not low <= self.rescan_interval <= high:  # NaN compares false: refused too
            raise LaunchError("rescan_interval", f"must be {low:g}-{high:g} seconds")
        if self.metrics_address and self.metrics_port is None:
            raise LaunchError(
                "metrics_address",
                "expected HOST:PORT with a port 0-65535, or an empty value to disable",
            )

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

    def command(self, python: str = "python") -> list[str]:
        """The command line that runs exactly this spec."""
        return [python, "-m", DEVICE_PLUGIN_MODULE, *self.argv()]

    def argv(self) -> list[str]:
        """The flags that launch exactly this spec, every one spelled out."""
        args: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                args += [_flag(f.name), str(value)]
        return args


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


_HELP = {
    "config": f"plugin config (default {DEFAULT_CONFIG_PATH}; absent: defaults)",
    "discovery": "auto: verbs when pyverbs finds devices, else sysfs",
    "rescan_interval": "periodic re-scan in seconds, the backstop behind netlink events",
    "metrics_address": "HOST:PORT for /metrics and /healthz; empty disables",
}
_CHOICES: dict[str, tuple[str, ...]] = {
    "discovery": get_args(DiscoveryKind),
    "log_level": get_args(LogLevel),
}


def _path(text: str) -> Path:
    """A path flag, made absolute: grpc reads `unix://dir/x` as a host named dir."""
    if not text:
        raise argparse.ArgumentTypeError("empty: name a path")
    return Path(os.path.abspath(text))


def parse(argv: list[str] | None) -> LaunchSpec:
    """The command line as a LaunchSpec; a bad flag exits 2 naming it (argparse's way)."""
    parser = Parser("rdma-device-plugin", "Kubernetes device plugin for RDMA HCAs (rdma/hca)")
    defaults = LaunchSpec()
    for f in fields(LaunchSpec):
        default = getattr(defaults, f.name)
        kind: Callable[[str], object] = (
            float if isinstance(default, float) else str if isinstance(default, str) else _path
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
        return LaunchSpec(**values)
    except LaunchError as exc:
        parser.error(f"{_flag(exc.field)} {values[exc.field]}: {exc.why}")


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
