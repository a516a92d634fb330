"""The plugin as a host process on a fixture sysfs tree whose /dev nodes are real char devices."""

from __future__ import annotations

import os
import signal
import stat
import sys
import urllib.error
import urllib.request
from pathlib import Path

from plugin.config import MAX_ALLOCATIONS_LIMIT, MAX_LABEL
from plugin.dra.devices import MAX_DEVICES_PER_SLICE
from plugin.launch import DRA_DRIVER, DraLaunchSpec, LaunchSpec
from tests.e2e.cluster import CDI_DIR, DEVICE_PLUGIN_DIR, NODE
from tests.e2e.procs import Proc, eventually
from tests.plugin.plugin_process import free_port
from tests.plugin.sysfs_tree import PortSpec, SysfsTree, two_mlx5

REPO = Path(__file__).resolve().parents[2]
SOCKET = DEVICE_PLUGIN_DIR / "lingjun-rdma-rdma_hca.sock"

# The kernel's numbers for these nodes (infiniband class major 231; rdma_cm is a misc device):
# containerd stats the host path of each DeviceSpec and creates the same node in the container.
_IB_MAJOR = 231


def _numbers(name: str) -> tuple[int, int]:
    for prefix, base in (("umad", 0), ("issm", 64), ("uverbs", 192)):
        if name.startswith(prefix):
            return _IB_MAJOR, base + int(name.removeprefix(prefix))
    if name == "rdma_cm":
        return 10, 58
    raise ValueError(f"no device numbers for {name}")


def make_char_devices(tree: SysfsTree) -> dict[str, tuple[int, int]]:
    """Replace the fixture's placeholder files in dev/infiniband with char device nodes."""
    numbers: dict[str, tuple[int, int]] = {}
    for path in sorted((tree.dev / "infiniband").iterdir()):
        major, minor = _numbers(path.name)
        path.unlink()
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        os.chmod(path, 0o666)  # as udev makes them; mknod applies the umask
        numbers[path.name] = (major, minor)
    return numbers


class Plugin:
    """`python -m plugin` as the DaemonSet would run it, on a two-HCA fixture node."""

    def __init__(self, root: Path, logs: Path, kubeconfig: Path | None = None) -> None:
        self.root = root
        self.kubeconfig = kubeconfig  # its Events on the Node go there
        self.tree = two_mlx5(root / "node")
        self.dev_numbers = make_char_devices(self.tree)
        self.metrics_port = free_port()
        self.config: Path | None = None
        self.cdi_dir: Path | None = None
        self.proc = Proc(
            "plugin",
            [],  # set per start: the config may change between scenarios
            logs / "plugin.log",
            cwd=REPO,
        )

    def argv(self) -> list[str]:
        return LaunchSpec(
            config=self.config,
            sysfs_root=self.tree.sys,
            dev_root=self.tree.dev,
            device_plugin_dir=DEVICE_PLUGIN_DIR,
            discovery="sysfs",
            rescan_interval=0.5,
            metrics_address=f"127.0.0.1:{self.metrics_port}",
            log_level="debug",
            cdi_dir=self.cdi_dir,
            kubeconfig=self.kubeconfig,
            node_name=NODE,
        ).command(sys.executable)

    def start(self, config_yaml: str | None = None) -> None:
        if config_yaml is None:
            self.config = None
        else:
            self.config = self.root / "plugin.yaml"
            self.config.write_text(config_yaml)
        self.proc.argv = self.argv()
        self.proc.start()

        def healthy() -> bool:
            self.proc.check_alive()
            url = f"http://127.0.0.1:{self.metrics_port}/healthz"
            with urllib.request.urlopen(url, timeout=2) as resp:
                return resp.status == 200

        eventually(healthy, 30, "the plugin's /healthz")

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        return self.proc.stop(sig)

    def running(self) -> bool:
        return self.proc.running()


DRA_CONFIG = """
version: v1
pools:
  - {name: hca, maxAllocations: 4, selector: {ibdevs: ["mlx5_[01]"]}}
  - {name: nic, mode: exclusive, selector: {ibdevs: ["mlx5_[23]"]}}
"""
# The fixture's PCIe roots: a shared pair and an exclusive pair, one of each under each root
PCIE_ROOTS = {"mlx5_0": "pci0000:17", "mlx5_1": "pci0000:97",
              "mlx5_2": "pci0000:17", "mlx5_3": "pci0000:97"}  # fmt: skip
# Every fixture HCA's RoCE v2 GID 0 carries this address: where a test puts it on a host link,
# the driver (on the host network) finds the host's GID for host-network pods.
ROCE_ADDRESS = "10.250.77.1"


class DraDriver:
    """`python -m plugin.dra` as the DaemonSet would run it, on a four-HCA fixture node (two
    shared, two exclusive, under two PCIe roots), registered with the cluster's kubelet."""

    def __init__(
        self,
        root: Path,
        logs: Path,
        kubelet_root: Path,
        kubeconfig: Path,
        *,
        config: str = DRA_CONFIG,
        driver_name: str = DRA_DRIVER,
    ) -> None:
        self.root = root
        self.tree = SysfsTree(root / "dra-node").rdma_cm()
        for i, (name, pcie_root) in enumerate(PCIE_ROOTS.items()):
            self.tree.add_pci_hca(
                name,
                pci=f"0000:{0x1A + i:02x}:00.0",
                numa=i // 2,
                pcie_root=pcie_root,
                ports=[PortSpec(gids=[(ROCE_ADDRESS, "RoCE v2")])],
            )
        self.dev_numbers = make_char_devices(self.tree)
        self.config = root / "dra.yaml"
        self.config.write_text(config)
        self.metrics_port = free_port()
        self.spec = DraLaunchSpec(
            config=self.config,
            sysfs_root=self.tree.sys,
            dev_root=self.tree.dev,
            discovery="sysfs",
            rescan_interval=0.5,
            metrics_address=f"127.0.0.1:{self.metrics_port}",
            log_level="debug",
            kubeconfig=kubeconfig,
            node_name=NODE,
            plugins_registry_dir=kubelet_root / "plugins_registry",
            plugins_dir=kubelet_root / "plugins",
            cdi_dir=CDI_DIR,
            driver_name=driver_name,
        )
        log = logs / f"dra-{driver_name}.log"
        self.proc = Proc("dra-driver", self.spec.command(sys.executable), log, REPO)

    def start(self) -> None:
        self.proc.start()

        def registered() -> bool:
            self.proc.check_alive()
            url = f"http://127.0.0.1:{self.metrics_port}/healthz"
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    return resp.status == 200
            except urllib.error.HTTPError:
                return False

        eventually(registered, 60, "the kubelet to register the DRA driver")

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        return self.proc.stop(sig)

    def running(self) -> bool:
        return self.proc.running()

    def close(self) -> None:
        self.stop()

    def cdi_specs(self) -> list[Path]:
        return sorted(CDI_DIR.glob(f"{self.spec.driver_name}-*.json"))


# A shared pool at the top of maxAllocations, its device names as long as a DNS label lets them
# be: 782 slices whose list (~23 MB) is over the 16 MiB the driver reads of one answer.
BIG_DRIVER = "big.rdma.example.com"
BIG_POOL = "s" * (MAX_LABEL - len(f"-{MAX_ALLOCATIONS_LIMIT - 1}"))
BIG_SLICES = -(-MAX_ALLOCATIONS_LIMIT // MAX_DEVICES_PER_SLICE)


def big_dra_driver(node_root: Path, logs: Path, kubeconfig: Path) -> DraDriver:
    """A second driver publishing that pool on the node, in plugin dirs of its own: the kubelet
    does not know it, so the API holds its only trace (its slices, deleted by the caller)."""
    kubelet_root = node_root / "big-kubelet"
    for sub in ("plugins", "plugins_registry"):
        (kubelet_root / sub).mkdir(parents=True, exist_ok=True)
    pool = f"{{name: {BIG_POOL}, maxAllocations: {MAX_ALLOCATIONS_LIMIT}}}"
    config = f"version: v1\npools:\n  - {pool}\n"
    return DraDriver(
        node_root / "big", logs, kubelet_root, kubeconfig, config=config, driver_name=BIG_DRIVER
    )
