"""A whole node in one VM: the Soft-RoCE VM image (tests/plugin/rdma/vm/build.sh) booted under
TCG as a Kubernetes node of the e2e run's control plane, which stays on the host (the API
server under TCG was not ready in 12 minutes; the kubelet runs a pod 16 s after its start).

The guest (`vm_node_init`) has two rxe devices, containerd 2 and the kubelet of the e2e build,
and the images: pause, busybox and the plugin's (`make image`). It reaches the API server at
the `kubernetes` Service address through two forwarders (its own, and the host's loopback port
that qemu's user network maps 10.0.2.2 to); the plugin's /metrics is forwarded to the host. The
API server does not reach the kubelet (logs, exec): the guest prints its pods' logs on its
console, which the host keeps (`pod_log`).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.e2e import oci
from tests.e2e.cluster import (
    API_ADDRESS,
    API_PORT,
    BUSYBOX_IMAGE,
    PAUSE_IMAGE,
    Cluster,
    containerd_config,
)
from tests.e2e.node import REPO
from tests.e2e.procs import Proc, run
from tests.plugin.plugin_process import free_port

VM_NODE = "ljr-vmnode"
PERFTEST_IMAGE = "localhost/perftest:vm"  # built from infra/images/perftest.Dockerfile
METRICS_PORT = 9460  # the rendered DaemonSet's --metrics-address port, on the node's network
_CNI_PLUGINS = ("bridge", "host-local", "loopback")


class VmNode:
    def __init__(self, cluster: Cluster, image: Path, archives: list[Path], logs: Path) -> None:
        self.cluster = cluster
        self.image = image  # build.sh's output dir: vmlinuz, rootfs.cpio
        self.archives = archives  # images built on the host (the plugin's, perftest's)
        self.logs = logs
        self.work = cluster.root / "vm"
        self.api_forward_port = free_port()
        self.metrics_port = free_port()  # on the host's lo, forwarded to the guest's METRICS_PORT
        self.console = logs / "vm-node-console.log"

    def start(self) -> None:
        forward = [sys.executable, "-m", "tests.e2e.tcp_forward",
                   f"127.0.0.1:{self.api_forward_port}", f"{API_ADDRESS}:{API_PORT}"]  # fmt: skip
        self.forwarder = Proc("api-forward", forward, self.logs / "api-forward.log", REPO).start()
        initrd = self._initrd()
        nic = f"user,model=virtio-net-pci,hostfwd=tcp:127.0.0.1:{self.metrics_port}-:{METRICS_PORT}"
        qemu = [
            "qemu-system-x86_64", "-machine", "q35", "-accel", "tcg,tb-size=256", "-cpu", "max",
            "-smp", "2", "-m", "4096", "-display", "none", "-monitor", "none",
            "-serial", "stdio", "-no-reboot", "-nic", nic,
            "-kernel", str(self.image / "vmlinuz"), "-initrd", str(initrd),
            "-append", "console=ttyS0 rdinit=/init panic=-1 quiet loglevel=4",
        ]  # fmt: skip
        self.qemu = Proc("qemu", qemu, self.console).start()

    def stop(self) -> None:
        for proc in ("qemu", "forwarder"):
            if hasattr(self, proc):
                getattr(self, proc).stop()

    def _initrd(self) -> Path:
        """The cached rootfs with this run's files appended (the kernel unpacks both)."""
        root = self.work / "root"
        peers = self.cluster.peers
        files = {
            "init": REPO / "tests/e2e/vm_node_init",
            "opt/rxe-pair": REPO / "tests/plugin/rdma/vm/rxe-pair",
            "etc/vmnode/ca.crt": self.cluster.root / "pki" / "ca.crt",
            "src/tests/__init__.py": REPO / "tests/__init__.py",
            "src/tests/e2e/__init__.py": REPO / "tests/e2e/__init__.py",
            "src/tests/e2e/tcp_forward.py": REPO / "tests/e2e/tcp_forward.py",
            **{f"opt/images/built-{i}.tar": a for i, a in enumerate(self.archives)},
            "opt/k8s/runc": peers.runc,
            **{f"opt/k8s/{p.name}": p for p in (peers.kubelet, peers.containerd, peers.ctr)},
            "opt/k8s/containerd-shim-runc-v2": peers.containerd_shim,
            **{f"opt/cni/{n}": Path("/usr/lib/cni") / n for n in _CNI_PLUGINS},
        }
        for dest, src in files.items():
            (root / dest).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, root / dest)
        (root / "init").chmod(0o755)
        (root / "etc/containerd").mkdir(parents=True)
        (root / "etc/containerd/config.toml").write_text(
            containerd_config(
                shim=Path("/opt/k8s/containerd-shim-runc-v2"),
                runc=Path("/opt/k8s/runc"),
                cni_bin=Path("/opt/cni"),
                cni_conf=Path("/etc/cni/net.d"),
                no_pivot_root=True,  # the guest's rootfs is its initramfs
            )
        )
        applets = run([str(peers.busybox), "--list"]).split()
        images = (
            oci.pause(PAUSE_IMAGE, peers.pause),
            oci.busybox(BUSYBOX_IMAGE, peers.busybox, applets),
        )
        for i, image in enumerate(images):
            oci.write_oci_archive(image, root / f"opt/images/{i}.tar")
        (root / "etc/vmnode/env").write_text(
            f"NODE={VM_NODE}\nAPI_ADDRESS={API_ADDRESS}\n"
            f"API_FORWARD_PORT={self.api_forward_port}\n"
            f"TOKEN={self.cluster.token}\n"
        )
        code = self.work / "code.cpio"
        with code.open("wb") as out:
            listing = subprocess.run(
                ["find", ".", "-print0"], cwd=root, check=True, capture_output=True
            ).stdout
            subprocess.run(["cpio", "--null", "-o", "-H", "newc", "--quiet"], cwd=root,
                           input=listing, stdout=out, check=True)  # fmt: skip
        initrd = self.work / "initrd"
        with initrd.open("wb") as out:
            for part in (self.image / "rootfs.cpio", code):
                with part.open("rb") as f:
                    shutil.copyfileobj(f, out)
        code.unlink()
        shutil.rmtree(root)
        return initrd

    def pod_log(self, namespace: str, pod: str, container: str) -> str:
        """What the container wrote, as the guest printed it on its console."""
        tag = f"podlog {namespace}_{pod}_"
        lines = self.console.read_text(errors="replace").splitlines()
        return "\n".join(
            line.split(": ", 1)[1]
            for line in lines
            if line.startswith(tag) and f"/{container}/" in line.split(": ", 1)[0]
        )
