"""A one-node cluster on loopback: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, containerd, kubelet, all owned by pid.

Everything lives in one short temp dir; teardown removes every container, process, mount,
cgroup and file the run made, and restores the sysctls the kubelet changes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from base64 import b64encode
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from plugin.launch import (
    DEFAULT_CDI_DIR,
    DEFAULT_DEVICE_PLUGIN_DIR,
    DEFAULT_PLUGINS_DIR,
    DEFAULT_PLUGINS_REGISTRY_DIR,
)
from tests.e2e import oci
from tests.e2e.kube import Api, ApiError
from tests.e2e.procs import Proc, eventually, run
from tests.plugin.plugin_process import free_port

NODE = "ljr-e2e"
RUN_PREFIX = "lje"  # /tmp/lje…: one dir per run
NODE_PREFIX = "ljn"  # /tmp/ljn…: the plugin's fixture node of a run
MADE_DIRS = "made-dirs"  # host dirs a run created, in its run dir
RUN_LOCK = Path("/run/lock/lingjun-rdma-e2e.lock")
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
BUSYBOX_IMAGE = "docker.io/library/busybox:e2e"
PLUGIN_IMAGE = "localhost/lingjun-rdma-plugin:e2e"  # plugin/Dockerfile, as `make image` builds it
LINGJUN_LABEL = "alibabacloud.com/lingjun-worker"  # the label the DaemonSet selects nodes by
# Hard-coded in the kubelet (v1beta1.DevicePluginPath), unlike every other path it uses: a
# per-run dir is bind-mounted here so the host's dir is neither read nor left dirty.
DEVICE_PLUGIN_DIR = DEFAULT_DEVICE_PLUGIN_DIR
# The DaemonSet of the DRA driver mounts the kubelet's plugin dirs at their default host paths:
# the run's kubelet root's own dirs are bind-mounted there the same way.
KUBELET_PLUGIN_DIRS = {"plugins_registry": DEFAULT_PLUGINS_REGISTRY_DIR,
                       "plugins": DEFAULT_PLUGINS_DIR}  # fmt: skip
# Where containerd 2 reads CDI specs (its default) and the DRA driver writes them: the run's
# own too, so a spec a killed run left is gone with its dir, never seen by the next run.
CDI_DIR = DEFAULT_CDI_DIR
HOST_DIRS = (DEVICE_PLUGIN_DIR, *KUBELET_PLUGIN_DIRS.values(), CDI_DIR)
# The `kubernetes` Service: the kubelet gives every pod KUBERNETES_SERVICE_HOST/PORT, the
# first address of the service range and 443. No kube-proxy runs: the address sits on lo for
# the run and the API server listens there, so a host-network pod (the DRA driver) reaches the
# API with its own token and the cluster's CA, as on any cluster.
SERVICE_RANGE = "10.97.77.0/24"
API_ADDRESS = "10.97.77.1"
API_PORT = 443
# Host sysctls the kubelet sets at start (protectKernelDefaults: false); restored at teardown.
KERNEL_TUNABLES = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")
# The pod network: Debian's CNI plugins (containernetworking-plugins), one bridge of the run's.
CNI_BIN = Path("/usr/lib/cni")
CNI_BRIDGE = "ljr-cni0"
POD_SUBNET = "10.244.77.0/24"


@dataclass(frozen=True)
class Peers:
    """The programs the run needs: built ones from the cache, the rest from Debian."""

    kubelet: Path
    apiserver: Path
    controller_manager: Path
    scheduler: Path
    kubectl: Path
    pause: Path
    etcd: Path
    # built too: containerd 2 (it applies CDI devices; Debian's 1.6 ignores them), its shim, ctr
    containerd: Path
    containerd_shim: Path
    ctr: Path
    busybox: Path
    runc: Path

    @staticmethod
    def find() -> Peers | str:
        """The peers, or a sentence naming the missing one."""
        bin_dir = os.environ.get("LINGJUN_E2E_BIN")
        if not bin_dir:
            return (
                "LINGJUN_E2E_BIN (kubelet, kube-apiserver, kubectl, pause, containerd: "
                "run `make e2e`)"
            )
        built = Path(bin_dir)
        paths = {
            "kubelet": built / "kubelet",
            "apiserver": built / "kube-apiserver",
            "controller_manager": built / "kube-controller-manager",
            "scheduler": built / "kube-scheduler",
            "kubectl": built / "kubectl",
            "pause": built / "pause",
            "containerd": built / "containerd",
            "containerd_shim": built / "containerd-shim-runc-v2",
            "ctr": built / "ctr",
        }
        for name in ("etcd", "busybox", "runc"):
            found = shutil.which(name)
            paths[name] = Path(found) if found else Path("/nonexistent") / name
        paths_checked = {**paths, "CNI bridge plugin": CNI_BIN / "bridge"}
        for name, path in paths_checked.items():
            if not os.access(path, os.X_OK):
                if path.parent == built:
                    return f"{name} ({path}: run tests/e2e/build_k8s.sh)"
                return (
                    f"{name} ({path}: apt-get install runc etcd-server busybox-static "
                    "containernetworking-plugins)"
                )
        return Peers(**paths)


def containerd_config(
    *,
    shim: Path,
    runc: Path,
    cni_bin: Path,
    cni_conf: Path,
    dirs: Path | None = None,
    sock: Path | None = None,
    no_pivot_root: bool = False,
) -> str:
    """containerd 2's config (version 3: the CRI's image and runtime parts are plugins of their
    own), the host's and the VM node's. `dirs` holds root, state and opt (default: containerd's
    own); NRI is off (it would listen on the host's /var/run/nri/nri.sock); `no_pivot_root` for
    a rootfs that is an initramfs, which cannot be pivoted away from."""
    runtimes = "plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes"
    own = f'root = "{dirs / "root"}"\nstate = "{dirs / "state"}"\n' if dirs else ""
    grpc = f'[grpc]\n  address = "{sock}"\n' if sock else ""
    opt = (
        f"[plugins.'io.containerd.internal.v1.opt']\n  path = \"{dirs / 'opt'}\"\n" if dirs else ""
    )
    return f"""version = 3
{own}disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.nri.v1.nri"]
{grpc}{opt}[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{PAUSE_IMAGE}"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  # pod sandboxes' netns mounts under the run's state dir: teardown's unmount frees them
  netns_mounts_under_state_dir = true
  # the CRI's CDI device names (a DRA driver's claims) resolved against these dirs' specs
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{cni_bin}"]
    conf_dir = "{cni_conf}"
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [{runtimes}.runc]
      runtime_type = "io.containerd.runc.v2"
      # the shim built with this containerd, not whichever one PATH has (Debian's 1.6)
      runtime_path = "{shim}"
      [{runtimes}.runc.options]
        SystemdCgroup = false
        NoPivotRoot = {str(no_pivot_root).lower()}
        BinaryName = "{runc}"
"""


class Cluster:
    def __init__(self, peers: Peers, logs: Path) -> None:
        self.peers = peers
        # short: unix socket paths under it must stay within 107 bytes
        self.root = Path(tempfile.mkdtemp(prefix=RUN_PREFIX, dir="/tmp"))
        self.logs = logs
        self.token = secrets.token_hex(16)
        self.kubelet_port = free_port()
        self.api = Api(f"https://{API_ADDRESS}:{API_PORT}", self.token)
        self.procs: dict[str, Proc] = {}
        self.mounted: list[Path] = []
        self.made_dirs: list[Path] = []
        self.tunables: dict[str, str] = {}

    # -- paths ----------------------------------------------------------------------------
    @property
    def containerd_sock(self) -> Path:
        return self.root / "ctd.sock"

    @property
    def pod_resources_sock(self) -> Path:
        return self.root / "kubelet" / "pod-resources" / "kubelet.sock"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def node_sysfs_file(self) -> Path:
        """Names the fixture tree that stands in for the node's /sys in containers (runc.py)."""
        return self.root / "node-sysfs"

    def use_node_sysfs(self, sysfs: Path | None) -> None:
        """From the next container on, a hostPath of /sys is `sysfs` (None: the real one)."""
        if sysfs is None:
            self.node_sysfs_file.unlink(missing_ok=True)
        else:
            self.node_sysfs_file.write_text(str(sysfs))

    # -- start ----------------------------------------------------------------------------
    def start(self) -> None:
        self.start_control_plane()
        self._host_dirs()  # before containerd, which watches the CDI dir from its start
        self._containerd()
        self._images()
        self._kubelet_config()
        self.start_kubelet()

    def start_control_plane(self) -> None:
        """etcd, the API server, the controllers and the scheduler: what a node joins."""
        self._pki()
        self._etcd()
        self._apiserver()
        self._controllers()

    def _proc(self, name: str, argv: list[str]) -> Proc:
        proc = Proc(name, argv, self.logs / f"{name}.log").start()
        self.procs[name] = proc
        return proc

    def _pki(self) -> None:
        """The run's CA, the API server's certificate for the Service address (what a pod's
        client checks), the service-account key pair and the admin's token."""
        pki = self.root / "pki"
        pki.mkdir()
        ssl_ = ["openssl", "req", "-nodes", "-newkey", "rsa:2048", "-days", "2"]
        run([*ssl_, "-x509", "-keyout", str(pki / "ca.key"), "-out", str(pki / "ca.crt"),
             "-subj", "/CN=lingjun-rdma-e2e-ca",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign"])  # fmt: skip
        run([*ssl_, "-keyout", str(pki / "apiserver.key"), "-out", str(pki / "apiserver.csr"),
             "-subj", "/CN=kube-apiserver"])  # fmt: skip
        names = f"IP:{API_ADDRESS},DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
        (pki / "apiserver.ext").write_text(
            f"subjectAltName={names}\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth\nsubjectKeyIdentifier=hash\n"
            "authorityKeyIdentifier=keyid,issuer\n"
        )
        run(["openssl", "x509", "-req", "-in", str(pki / "apiserver.csr"), "-days", "2",
             "-CA", str(pki / "ca.crt"), "-CAkey", str(pki / "ca.key"), "-CAcreateserial",
             "-extfile", str(pki / "apiserver.ext"),
             "-out", str(pki / "apiserver.crt")])  # fmt: skip
        run(["openssl", "genrsa", "-out", str(pki / "sa.key"), "2048"])
        run(["openssl", "rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub")])
        (pki / "tokens.csv").write_text(f'{self.token},e2e-admin,e2e-admin,"system:masters"\n')
        ca = b64encode((pki / "ca.crt").read_bytes()).decode()
        self.kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "e2e",
                            "cluster": {
                                "server": self.api.base,
                                "certificate-authority-data": ca,
                            },
                        }
                    ],
                    "users": [{"name": "e2e", "user": {"token": self.token}}],
                    "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "e2e"}}],
                    "current-context": "e2e",
                }
            )
        )

    def _etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        peer_url = f"http://127.0.0.1:{peer}"
        self._proc(
            "etcd",
            [
                str(self.peers.etcd),
                "--name=e2e",
                f"--data-dir={self.root / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=e2e={peer_url}",
            ],
        )

    def _apiserver(self) -> None:
        pki = self.root / "pki"
        add_api_address()
        proc = self._proc(
            "kube-apiserver",
            [
                str(self.peers.apiserver),
                f"--etcd-servers={self.etcd_url}",
                f"--bind-address={API_ADDRESS}",
                f"--advertise-address={API_ADDRESS}",
                f"--secure-port={API_PORT}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--token-auth-file={pki / 'tokens.csv'}",
                # RBAC as on ACK: a pod's service account has only what its ClusterRole grants
                # (the admin token and with it the kubelet and controllers: system:masters)
                "--authorization-mode=Node,RBAC",
                f"--service-cluster-ip-range={SERVICE_RANGE}",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                # the Service's address needs no Endpoints: nothing routes through a proxy
                "--endpoint-reconciler-type=none",
                "--kubelet-preferred-address-types=InternalIP",  # the node name does not resolve
                "--allow-privileged=true",
                "--profiling=false",
            ],
        )

        def ready() -> bool:
            proc.check_alive()
            return self.api.get("/readyz") == "ok"

        eventually(ready, 90, "kube-apiserver /readyz")

    def _controllers(self) -> None:
        """The controllers (DaemonSet, Job, garbage collector, namespace, ...) and the
        scheduler, so that what `pulumi up` creates is run as on any cluster."""
        pki = self.root / "pki"
        common = [f"--kubeconfig={self.kubeconfig}", "--leader-elect=false", "--secure-port=0"]
        self._proc(
            "kube-controller-manager",
            [
                str(self.peers.controller_manager),
                *common,
                f"--service-account-private-key-file={pki / 'sa.key'}",
                # published to every namespace as kube-root-ca.crt: a pod's token volume has it
                f"--root-ca-file={pki / 'ca.crt'}",
                # One node that this run alone starts and stops: no node lifecycle (it would
                # taint and evict whenever the kubelet restarts in a scenario).
                "--controllers=*,-node-lifecycle-controller",
            ],
        )
        self._proc("kube-scheduler", [str(self.peers.scheduler), *common])

        def service_account() -> bool:  # the ServiceAccount admission refuses pods before it
            try:
                return bool(self.api.get("/api/v1/namespaces/default/serviceaccounts/default"))
            except ApiError:
                return False

        eventually(service_account, 60, "the default ServiceAccount")

    def _containerd(self) -> None:
        ctd = self.root / "ctd"
        cni = self.root / "cni"
        (cni / "conf").mkdir(parents=True)
        (cni / "conf" / "10-e2e.conflist").write_text(json.dumps(self._pod_network(cni)))
        config = ctd / "config.toml"
        config.parent.mkdir()
        config.write_text(
            containerd_config(
                shim=self.peers.containerd_shim,
                runc=self._runc(),
                cni_bin=CNI_BIN,
                cni_conf=cni / "conf",
                dirs=ctd,
                sock=self.containerd_sock,
            )
        )
        proc = self._proc("containerd", [str(self.peers.containerd), "--config", str(config)])

        def up() -> bool:
            proc.check_alive()
            return bool(self.ctr("version"))

        eventually(up, 30, "containerd")

    @staticmethod
    def _pod_network(cni: Path) -> dict[str, object]:
        """Debian's bridge plugin: pods off the host network get a veth on a bridge of their
        own with an address from a range of their own; no NAT, no iptables rule."""
        return {
            "cniVersion": "1.0.0",
            "name": "e2e",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": CNI_BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_SUBNET}]],
                        "dataDir": str(cni / "ipam"),
                    },
                }
            ],
        }

    def _runc(self) -> Path:
        """runc behind a wrapper that can give containers a fixture sysfs for the node's."""
        wrapper = self.root / "runc"
        here = Path(__file__).resolve().parent
        wrapper.write_text(
            f"#!/bin/sh\nexec {sys.executable} -I -S {here / 'runc.py'} "
            f'{self.peers.runc} {self.node_sysfs_file} "$@"\n'
        )
        wrapper.chmod(0o755)
        return wrapper

    def kubectl(self, *args: str) -> str:
        return run([str(self.peers.kubectl), f"--kubeconfig={self.kubeconfig}", *args], 120)

    def ctr(self, *args: str, timeout: float = 60, check: bool = True) -> str:
        sock = str(self.containerd_sock)
        argv = [str(self.peers.ctr), "-a", sock, "-n", "k8s.io", *args]
        return run(argv, timeout=timeout, check=check)

    def _images(self) -> None:
        applets = run([str(self.peers.busybox), "--list"]).split()
        images = [
            oci.pause(PAUSE_IMAGE, self.peers.pause),
            oci.busybox(BUSYBOX_IMAGE, self.peers.busybox, applets),
        ]
        for i, image in enumerate(images):
            tar = oci.write_oci_archive(image, self.root / f"image{i}.tar")
            self.ctr("images", "import", str(tar))
            tar.unlink()

    def _host_dirs(self) -> None:
        """The run's own dirs at the kubelet's fixed host paths (bind mounts)."""
        ours = {DEVICE_PLUGIN_DIR: self.root / "device-plugins", CDI_DIR: self.root / "cdi-specs"}
        ours |= {host: self.root / "kubelet" / name for name, host in KUBELET_PLUGIN_DIRS.items()}
        missing = sorted(
            {p for host in HOST_DIRS for p in (host, *host.parents) if not p.exists()},
            key=lambda p: -len(p.parts),
        )
        self.made_dirs = missing  # deepest first: the order to remove them in
        # a run killed outright cannot remove them: the next run reads this (reap_stale_runs)
        (self.root / MADE_DIRS).write_text("\n".join(map(str, missing)))
        for host, here in ours.items():
            here.mkdir(parents=True)
            host.mkdir(parents=True, exist_ok=True)
            # as mountinfo names it (/var/run is /run): what teardown unmounts must match
            point = host.resolve()
            run(["mount", "--bind", str(here), str(point)])
            self.mounted.append(point)

    def _kubelet_config(self) -> None:
        (self.root / "manifests").mkdir()
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "cgroupDriver": "cgroupfs",
            "containerRuntimeEndpoint": f"unix://{self.containerd_sock}",
            "failSwapOn": False,
            "oomScoreAdj": 0,
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzPort": 0,
            "staticPodPath": str(self.root / "manifests"),
            "podLogsDir": str(self.root / "pod-logs"),
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            # report allocatable changes to the API server within a second or two
            "nodeStatusUpdateFrequency": "1s",
            "nodeStatusReportFrequency": "5s",
            "syncFrequency": "5s",
            "fileCheckFrequency": "5s",
            # a shared CI disk must not make the kubelet evict or refuse pods
            "evictionHard": {
                "memory.available": "10Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "resolvConf": "",
        }
        (self.root / "kubelet.json").write_text(json.dumps(config))

    def start_kubelet(self) -> None:
        self._save_tunables()
        proc = self._proc(
            "kubelet",
            [
                str(self.peers.kubelet),
                f"--config={self.root / 'kubelet.json'}",
                f"--kubeconfig={self.kubeconfig}",
                f"--root-dir={self.root / 'kubelet'}",
                f"--cert-dir={self.root / 'kubelet-pki'}",
                f"--hostname-override={NODE}",
                "--v=2",
            ],
        )

        def registered() -> bool:
            proc.check_alive()
            node = self.api.node(NODE)
            ready = {c["type"]: c["status"] for c in node["status"].get("conditions", [])}
            return bool(ready) and self.pod_resources_sock.exists()

        eventually(registered, 90, f"kubelet to register Node {NODE}")

    def stop_kubelet(self) -> None:
        self.procs["kubelet"].stop()

    def _save_tunables(self) -> None:
        for name in KERNEL_TUNABLES:
            path = Path("/proc/sys") / name
            if name not in self.tunables and path.exists():
                self.tunables[name] = path.read_text().strip()

    # -- teardown -------------------------------------------------------------------------
    def stop(self) -> None:
        """Undo everything `start` did, whatever state a failure left it in."""
        # kubelet first (or it restarts the containers), containerd after its containers
        order = [
            "kubelet",
            "remove containers",
            "containerd",
            "kube-scheduler",
            "kube-controller-manager",
            "kube-apiserver",
            "etcd",
        ]
        steps = [
            self._remove_containers
            if name == "remove containers"
            else (lambda name=name: self.procs[name].stop() if name in self.procs else None)
            for name in order
        ]
        steps += [
            self._kill_strays,
            self._unmount,
            remove_pod_bridge,
            remove_api_address,
            self._remove_cgroups,
            self._restore_tunables,
        ]
        errors: list[str] = []
        for step in steps:
            try:
                step()
            except Exception as exc:  # keep tearing down: one failure must not leak the rest
                errors.append(repr(exc))
        for d in self.made_dirs:
            with contextlib.suppress(OSError):
                d.rmdir()
        shutil.rmtree(self.root, ignore_errors=True)
        if errors:
            raise RuntimeError("teardown: " + "; ".join(errors))

    def _remove_containers(self) -> None:
        """Kill every container the kubelet started, through containerd, while both are up."""
        if not self.procs.get("containerd") or not self.procs["containerd"].running():
            return

        def tasks(status: str | None = None) -> list[str]:
            rows = [line.split() for line in self.ctr("tasks", "ls").splitlines()[1:]]
            return [r[0] for r in rows if status is None or r[-1] == status]

        # containerd's CRI reaps exited tasks itself: one may be gone by the time we name it
        for task in tasks("RUNNING"):
            self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
        deadline = time.monotonic() + 20
        while tasks("RUNNING") and time.monotonic() < deadline:
            time.sleep(0.2)
        for task in tasks():
            self.ctr("tasks", "delete", "-f", task, check=False)
        for container in self.ctr("containers", "ls", "-q").split():
            self.ctr("containers", "delete", container, check=False)
        left = self.ctr("containers", "ls", "-q").split()
        if left:
            raise RuntimeError(f"containerd still has containers {left}")

    def _kill_strays(self) -> None:
        kill_processes_of(self.root)
        kill_kubepods()

    def _unmount(self) -> None:
        unmount_under(self.root, self.mounted)

    def _remove_cgroups(self) -> None:
        remove_kubepods_cgroups()

    def _restore_tunables(self) -> None:
        for name, value in self.tunables.items():
            (Path("/proc/sys") / name).write_text(value + "\n")


# -- helpers shared by teardown and the recovery of a run killed outright ----------------------
def kill_processes_of(root: Path) -> None:
    """Shims outlive containerd by design: find ours by `root` in their command line (our
    containerd socket path), kill them by pid."""
    marker = str(root).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)


def kill_kubepods() -> None:
    """Container processes whose shim died with them: they are in the kubelet's cgroups, and
    only the e2e kubelet runs on this machine (the run lock guarantees one at a time)."""
    for procs in Path("/sys/fs/cgroup/pids/kubepods").rglob("cgroup.procs"):
        with contextlib.suppress(OSError):
            for pid in procs.read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)


def remove_pod_bridge() -> None:
    """The CNI bridge outlives its pods; the veths went with their netns."""
    subprocess.run(["ip", "link", "delete", CNI_BRIDGE], capture_output=True, check=False)


def add_api_address() -> None:
    add_address(API_ADDRESS)


def remove_api_address() -> None:
    remove_address(API_ADDRESS)


def add_address(address: str) -> None:
    remove_address(address)  # left by a run killed outright
    run(["ip", "address", "add", f"{address}/32", "dev", "lo"])


def remove_address(address: str) -> None:
    cmd = ["ip", "address", "delete", f"{address}/32", "dev", "lo"]
    subprocess.run(cmd, capture_output=True, check=False)


def mount_points() -> list[str]:
    """Every mount point, stacked ones repeated (os.path.ismount misses same-fs bind mounts)."""
    return [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]


def unmount_under(root: Path, extra: list[Path]) -> None:
    """Unmount everything under `root`, and `extra` as many times as it is stacked."""
    prefix = str(root) + "/"
    points = [p for p in mount_points() if p.startswith(prefix) or Path(p) in extra]
    for point in sorted(points, key=lambda p: -len(Path(p).parts)):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def remove_kubepods_cgroups() -> None:
    """The kubelet leaves its kubepods hierarchy behind; remove it, deepest first."""
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        top = hierarchy / "kubepods"
        if not top.is_dir():
            continue
        dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
        for d in [*dirs, top]:
            with contextlib.suppress(OSError):
                d.rmdir()


@contextlib.contextmanager
def run_lock() -> Iterator[None]:
    """One e2e run per machine at a time: runs would share the kubelet's fixed device-plugins
    dir and its cgroups."""
    RUN_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with RUN_LOCK.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def reap_stale_runs() -> list[Path]:
    """A run killed outright (SIGKILL, a lost machine) leaves its dir, processes and mounts.
    Called with the run lock held, so every `/tmp/lje*` dir left is such a run's."""
    stale = sorted(
        p for prefix in (RUN_PREFIX, NODE_PREFIX) for p in Path("/tmp").glob(prefix + "*")
    )
    for root in stale:
        kill_processes_of(root)
    if stale:
        kill_kubepods()
        for root in stale:
            unmount_under(root, [])
        unmount_under(Path("/nonexistent"), [host.resolve() for host in HOST_DIRS])
        remove_kubepods_cgroups()
        remove_pod_bridge()
        remove_api_address()
        for root in stale:
            made = root / MADE_DIRS
            for d in made.read_text().split("\n") if made.exists() else []:
                with contextlib.suppress(OSError):
                    Path(d).rmdir()
            shutil.rmtree(root, ignore_errors=True)
    return stale
