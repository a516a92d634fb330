"""The typed spec of an RDMA Job (what it asks of a node, checked), and the sample Jobs the stack
may enable: what the stack model reads, apart from the component that renders it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from infra.stack.images import reference_problem

RDMA_CAPABILITIES = ("SYS_RESOURCE", "IPC_LOCK")  # raise the memlock limit; pin RDMA buffers
SHM_SIZE = "8Gi"
# Alibaba PAI's NCCL settings for Lingjun's RoCE fabric that hold on every node. Which HCAs,
# which GID index and which interface depend on the pod: `python -m plugin.podenv` resolves them.
LINGJUN_NCCL_ENV = {
    "NCCL_IB_TC": "136",
    "NCCL_IB_SL": "5",
    "NCCL_IB_TIMEOUT": "22",
    "NCCL_IB_QPS_PER_CONNECTION": "8",
}


class JobSpecError(ValueError):
    """An RdmaJob the stack cannot run; the message names the Job, the stack key and the fix."""


@dataclass(frozen=True)
class RdmaJobSpec:
    """What an RDMA Job asks for; rendered to a batch/v1 Job by `RdmaJob`."""

    name: str
    image: str
    command: tuple[str, ...]
    gpus: int = 0
    rdma: int = 1
    shm_size: str | None = SHM_SIZE
    capabilities: tuple[str, ...] = RDMA_CAPABILITIES
    # None follows the stack: hostNetwork unless the stack enables nonHostNetwork.
    host_network: bool | None = None
    parallelism: int = 1
    completions: int | None = None
    indexed: bool = False
    # Each pod on its own node (required anti-affinity), e.g. the two ends of a bandwidth test.
    one_per_node: bool = False
    # A headless Service of this name gives the pods stable DNS names (`<job>-<index>.<name>`).
    headless_service: bool = False
    env: Mapping[str, str] = field(default_factory=dict[str, str])
    # NCCL settings. With resolve_env they go into the resolved file beside the pod's own HCAs,
    # GID index and interface; without it, into the container's env.
    nccl: Mapping[str, str] = field(default_factory=dict[str, str])
    # Run `python -m plugin.podenv` in an init container and source its output before the
    # command (the command then runs under `sh`); False leaves the command as it is.
    resolve_env: bool = True
    working_dir: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict[str, str])
    tolerate_all: bool = True
    backoff_limit: int | None = None

    @property
    def nodes(self) -> int:
        """The nodes its pods need at once: one each when they must not share one."""
        return self.parallelism if self.one_per_node else 1

    def __post_init__(self) -> None:
        problem = reference_problem(self.image)
        if problem is not None:
            raise JobSpecError(f"Job {self.name}: image: {problem}")
        for name, (low, high) in JOB_RANGES.items():
            value: int | None = getattr(self, name)
            if value is not None and not low <= value <= high:
                raise JobSpecError(f"Job {self.name}: {name}: {value} is not within {low}-{high}")


# The range of each count of an RdmaJobSpec: a node's GPUs and RDMA units, a Job's pods.
JOB_RANGES = {
    "gpus": (0, 16),
    "rdma": (0, 64),
    "parallelism": (1, 10_000),
    "completions": (1, 100_000),
    "backoff_limit": (0, 1000),
}


def resolve_host_network(spec: RdmaJobSpec, non_host_network: bool) -> bool:
    """The Job's hostNetwork; a hostNetwork-only stack refuses a Job asking for pod networking."""
    if spec.host_network is None:
        return not non_host_network
    if not spec.host_network and not non_host_network:
        raise JobSpecError(
            f"Job {spec.name}: asks for pod networking (host_network=False) but the stack is "
            "hostNetwork-only, where RDMA works only in hostNetwork pods: leave host_network "
            "unset, or enable it (pulumi config set lingjun-rdma:computeNetworkIpv6 true; "
            "pulumi config set lingjun-rdma:nonHostNetwork true)"
        )
    return spec.host_network


def hps_benchmark(image: str) -> RdmaJobSpec:
    """The product doc's sample, field for field."""
    return RdmaJobSpec(
        name="hps-benchmark",
        image=image,
        command=("sh", "-c", "python /workspace/wdl_8gpu_outbrain.py\n"),
        gpus=8,
        rdma=1,
        working_dir="/root",
        parallelism=1,
    )


# Index 0 serves; index 1 retries until the server listens. -R uses rdma_cm, which picks the GID
# for the address it resolves, so the same command works on the host network and off it.
def _perftest_script(name: str) -> str:
    bw = "ib_write_bw -R -F --report_gbits -D 10"
    return (
        f'if [ "$JOB_COMPLETION_INDEX" = 0 ]; then exec {bw}; fi\n'
        "for i in $(seq 60); do\n"
        f"  {bw} {name}-0.{name} && exit 0\n"
        "  sleep 2\n"
        "done\n"
        "exit 1\n"
    )


def perftest(image: str) -> RdmaJobSpec:
    """An ib_write_bw server/client pair on two nodes: an Indexed Job with a headless Service."""
    name = "perftest"
    return RdmaJobSpec(
        name=name,
        image=image,
        command=("sh", "-c", _perftest_script(name)),
        parallelism=2,
        completions=2,
        indexed=True,
        one_per_node=True,
        headless_service=True,
        backoff_limit=0,
    )


def nccl_tests(image: str) -> RdmaJobSpec:
    """all_reduce_perf over 8 GPUs with Lingjun's NCCL RDMA settings; the HCAs, GID index and
    interface are the pod's own, resolved in its network namespace (on it or off it)."""
    return RdmaJobSpec(
        name="nccl-tests",
        image=image,
        command=("all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2", "-g", "8"),
        gpus=8,
        nccl={**LINGJUN_NCCL_ENV, "NCCL_DEBUG": "INFO"},
        backoff_limit=0,
    )


@dataclass(frozen=True)
class Sample:
    """A sample Job of the catalogue: the stack key of its image, and its builder."""

    image_key: str
    build: Callable[[str], RdmaJobSpec]


# The one list of samples: `sampleJobs` names, their image keys, validation and builders.
SAMPLES: Mapping[str, Sample] = {
    "hps-benchmark": Sample("hpsBenchmarkImage", hps_benchmark),
    "perftest": Sample("perftestImage", perftest),
    "nccl-tests": Sample("ncclTestsImage", nccl_tests),
}
