"""RdmaJob: a batch/v1 Job on RDMA nodes (and its headless Service) from a typed RdmaJobSpec."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_kubernetes as k8s

from infra.stack.samples import RdmaJobSpec
from plugin.launch import PodenvSpec, family_for

JOB_NAME_LABEL = "batch.kubernetes.io/job-name"

# How much longer than a Job's deadline `pulumi up` may wait for the Job controller to fail it.
AWAIT_BACKSTOP_SECONDS = 60

# Where the resolver's output lives in the pod, and the shell line that loads it.
RDMA_ENV_DIR = "/var/run/lingjun-rdma"
RDMA_ENV_FILE = f"{RDMA_ENV_DIR}/nccl.env"
_SOURCE_AND_EXEC = f'set -a && . {RDMA_ENV_FILE} && set +a && exec "$@"'


@dataclass(frozen=True)
class RdmaJobArgs:
    spec: RdmaJobSpec
    namespace: str
    resource_name: str
    # resolve_host_network's answer for this Job in the stack's mode
    host_network: bool
    # The device plugin's image: it carries the resolver the init container runs.
    plugin_image: pulumi.Input[str]
    # None: no deadline, and `pulumi up` does not wait (JOB_CREATED). Else Kubernetes
    # fails the Job after this many seconds, and `pulumi up` waits for it to complete or fail.
    deadline_seconds: int | None = None
    # DRA (rdmaApi: dra): the DeviceClass the pods' claim asks `rdma` devices of; None: the
    # device plugin's `resource_name` limits
    device_class: str | None = None


# A Job's readiness for `pulumi up` without a deadline: created, not completed. Not
# pulumi.com/skipAwait: on a Job it skips the delete's await too, and a destroy then removed
# the plugin while the Job's pods were still terminating (in DRA mode their claims were never
# unprepared: the pods, and with them the namespace, hung). The delete awaits the pods
# (foreground, the provider's default).
JOB_CREATED = "jsonpath={.metadata.uid}"
# The name of a pod's RDMA claim (its ResourceClaimTemplate is the Job's name + this).
RDMA_CLAIM = "rdma"


class RdmaJob(pulumi.ComponentResource):
    """A batch/v1 Job asking for RDMA (and GPUs), plus its headless Service when it has one."""

    job_name: pulumi.Output[str]

    def __init__(
        self, name: str, args: RdmaJobArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("lingjun:rdma:Job", name, None, opts)
        spec = args.spec
        host_network = args.host_network
        child = pulumi.ResourceOptions(parent=self)
        if spec.headless_service:
            k8s.core.v1.Service(
                f"{name}-svc",
                metadata=k8s.meta.v1.ObjectMetaArgs(name=spec.name, namespace=args.namespace),
                spec=k8s.core.v1.ServiceSpecArgs(
                    cluster_ip="None",
                    selector={JOB_NAME_LABEL: spec.name},
                    # Peers resolve each other while still starting, before any readiness.
                    publish_not_ready_addresses=True,
                ),
                opts=child,
            )
        template = None
        if args.device_class is not None:
            template = f"{spec.name}-{RDMA_CLAIM}"
            k8s.apiextensions.CustomResource(  # resource.k8s.io/v1: newer than this SDK's types
                f"{name}-claim",
                api_version="resource.k8s.io/v1",
                kind="ResourceClaimTemplate",
                metadata=k8s.meta.v1.ObjectMetaArgs(name=template, namespace=args.namespace),
                spec={
                    "spec": {
                        "devices": {
                            "requests": [
                                {
                                    "name": RDMA_CLAIM,
                                    "exactly": {
                                        "deviceClassName": args.device_class,
                                        "count": spec.rdma,
                                    },
                                }
                            ]
                        }
                    }
                },
                opts=child,
            )
        annotations: dict[str, str] = {}
        job_opts = child
        if args.deadline_seconds is None:
            # pulumi-kubernetes otherwise blocks `pulumi up` until the Job completes.
            annotations["pulumi.com/waitFor"] = JOB_CREATED
        else:
            # The provider's Job await re-arms its timer on every event it sees, so its timeout
            # alone never fires on a busy Job: Kubernetes enforces the deadline
            # (activeDeadlineSeconds) and the await ends when the Job fails. The await's own
            # timeout is the backstop, a little later, so the Job's own verdict comes first.
            backstop = f"{args.deadline_seconds + AWAIT_BACKSTOP_SECONDS}s"
            job_opts = pulumi.ResourceOptions.merge(
                child,
                pulumi.ResourceOptions(
                    custom_timeouts=pulumi.CustomTimeouts(create=backstop, update=backstop)
                ),
            )
        job = k8s.batch.v1.Job(
            f"{name}-job",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=spec.name, namespace=args.namespace, annotations=annotations or None
            ),
            spec=job_spec(
                spec,
                resource_name=args.resource_name,
                host_network=host_network,
                deadline_seconds=args.deadline_seconds,
                plugin_image=args.plugin_image,
                claim_template=template,
            ),
            opts=job_opts,
        )
        self.job_name = job.metadata.name
        self.register_outputs({"job_name": self.job_name})


def job_spec(
    spec: RdmaJobSpec,
    *,
    resource_name: str,
    host_network: bool,
    deadline_seconds: int | None,
    plugin_image: pulumi.Input[str],
    claim_template: str | None = None,
) -> k8s.batch.v1.JobSpecArgs:
    """The typed batch/v1 JobSpec for an RdmaJobSpec: its containers ask `resource_name` in
    their limits, or (DRA) share the pod's claim made from `claim_template`."""
    gpus = {"nvidia.com/gpu": str(spec.gpus)} if spec.gpus else {}
    mounts: list[k8s.core.v1.VolumeMountArgs] = []
    volumes: list[k8s.core.v1.VolumeArgs] = []
    if spec.shm_size is not None:
        # NCCL and MPI move data through /dev/shm; the runtime's default 64Mi is far too small.
        mounts.append(k8s.core.v1.VolumeMountArgs(name="shm", mount_path="/dev/shm"))
        volumes.append(_memory_volume("shm", spec.shm_size))
    env = dict(spec.env)
    command = list(spec.command)
    init_containers: list[k8s.core.v1.ContainerArgs] = []
    if spec.resolve_env:
        rdma = _requirements(spec, resource_name, claim_template)
        init_containers.append(_resolver(spec, rdma, host_network=host_network, image=plugin_image))
        mounts.append(
            k8s.core.v1.VolumeMountArgs(name="rdma-env", mount_path=RDMA_ENV_DIR, read_only=True)
        )
        volumes.append(_memory_volume("rdma-env", "1Mi"))
        command = ["sh", "-c", _SOURCE_AND_EXEC, spec.name, *command]
    else:
        env = {**spec.nccl, **env}
    container = k8s.core.v1.ContainerArgs(
        name=spec.name,
        image=spec.image,
        command=command,
        env=[k8s.core.v1.EnvVarArgs(name=k, value=v) for k, v in env.items()] or None,
        resources=_requirements(spec, resource_name, claim_template, gpus),
        working_dir=spec.working_dir,
        volume_mounts=mounts or None,
        security_context=k8s.core.v1.SecurityContextArgs(
            capabilities=k8s.core.v1.CapabilitiesArgs(add=list(spec.capabilities))
        )
        if spec.capabilities
        else None,
    )
    pod = k8s.core.v1.PodSpecArgs(
        resource_claims=[
            k8s.core.v1.PodResourceClaimArgs(
                name=RDMA_CLAIM, resource_claim_template_name=claim_template
            )
        ]
        if claim_template is not None
        else None,
        init_containers=init_containers or None,
        containers=[container],
        restart_policy="Never",
        volumes=volumes or None,
        host_network=host_network,
        # A hostNetwork pod resolves cluster names (its peers' Service) only with this policy.
        dns_policy="ClusterFirstWithHostNet" if host_network and spec.headless_service else None,
        subdomain=spec.name if spec.headless_service else None,
        tolerations=[k8s.core.v1.TolerationArgs(operator="Exists")] if spec.tolerate_all else None,
        node_selector=dict(spec.node_selector) or None,
        affinity=_one_per_node(spec.name) if spec.one_per_node else None,
    )
    return k8s.batch.v1.JobSpecArgs(
        parallelism=spec.parallelism,
        completions=spec.completions,
        completion_mode="Indexed" if spec.indexed else None,
        backoff_limit=spec.backoff_limit,
        active_deadline_seconds=deadline_seconds,
        template=k8s.core.v1.PodTemplateSpecArgs(spec=pod),
    )


def _memory_volume(name: str, size: str) -> k8s.core.v1.VolumeArgs:
    return k8s.core.v1.VolumeArgs(
        name=name,
        empty_dir=k8s.core.v1.EmptyDirVolumeSourceArgs(medium="Memory", size_limit=size),
    )


def _requirements(
    spec: RdmaJobSpec,
    resource_name: str,
    claim_template: str | None,
    limits: dict[str, str] | None = None,
) -> k8s.core.v1.ResourceRequirementsArgs:
    """A container's RDMA request (the device plugin's resource in its limits, or the pod's
    DRA claim), beside other `limits` (GPUs)."""
    if claim_template is not None:
        return k8s.core.v1.ResourceRequirementsArgs(
            limits=limits or None, claims=[k8s.core.v1.ResourceClaimArgs(name=RDMA_CLAIM)]
        )
    return k8s.core.v1.ResourceRequirementsArgs(
        limits={**(limits or {}), resource_name: str(spec.rdma)}
    )


def _resolver(
    spec: RdmaJobSpec,
    rdma: k8s.core.v1.ResourceRequirementsArgs,
    *,
    host_network: bool,
    image: pulumi.Input[str],
) -> k8s.core.v1.ContainerArgs:
    """The init container that writes the pod's NCCL settings, resolved in its own network
    namespace. It asks the same RDMA resource as the workload: the kubelet hands the workload
    the same devices (an init container's are reused), and Allocate names the HCAs to it."""
    podenv = PodenvSpec(
        family=family_for(host_network), out=Path(RDMA_ENV_FILE), settings=spec.nccl
    )
    return k8s.core.v1.ContainerArgs(
        name="rdma-env",
        image=image,
        command=podenv.command(),
        resources=rdma,
        volume_mounts=[k8s.core.v1.VolumeMountArgs(name="rdma-env", mount_path=RDMA_ENV_DIR)],
        # its stderr (why no GID fits) becomes the pod's status message when it fails
        termination_message_policy="FallbackToLogsOnError",
        # reads sysfs and the namespace's addresses (an unprivileged netlink dump): no privilege
        security_context=k8s.core.v1.SecurityContextArgs(
            run_as_user=65534,
            run_as_non_root=True,
            allow_privilege_escalation=False,
            read_only_root_filesystem=True,
            capabilities=k8s.core.v1.CapabilitiesArgs(drop=["ALL"]),
        ),
    )


def _one_per_node(job_name: str) -> k8s.core.v1.AffinityArgs:
    return k8s.core.v1.AffinityArgs(
        pod_anti_affinity=k8s.core.v1.PodAntiAffinityArgs(
            required_during_scheduling_ignored_during_execution=[
                k8s.core.v1.PodAffinityTermArgs(
                    label_selector=k8s.meta.v1.LabelSelectorArgs(
                        match_labels={JOB_NAME_LABEL: job_name}
                    ),
                    topology_key="kubernetes.io/hostname",
                )
            ]
        )
    )
