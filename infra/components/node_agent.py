"""RdmaDevicePlugin: image, namespace, ServiceAccount, ConfigMap, DaemonSet on Lingjun nodes; with
rdmaApi: dra the DaemonSet runs the DRA driver instead, with its RBAC and DeviceClasses."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_docker_build as docker_build
import pulumi_kubernetes as k8s

from infra.components.alicloud import cs
from infra.stack.keys import StackConfigError
from infra.stack.model import BuiltImage, PinnedImage, RegistryLogin
from plugin.config import PluginConfig
from plugin.dra.devices import device_class, device_class_name
from plugin.launch import (
    DEFAULT_DEVICE_PLUGIN_DIR,
    EVENT_NAMESPACE,
    NODE_NAME_ENV,
    DraLaunchSpec,
    LaunchSpec,
)

# Relative to the project directory, where Pulumi runs the program: the plan stays the same on
# every clone.
BUILD_CONTEXT = "."
DOCKERFILE = "plugin/Dockerfile"
APP_LABEL = "app.kubernetes.io/name"


# The node an agent's token names (bound service-account tokens, Kubernetes 1.32 on; none for
# a token without one), and the object an operation is about (a DELETE has only the old one).
_ADMISSION_VARIABLES = {
    "node": "request.userInfo.?extra[?'authentication.kubernetes.io/node-name'][?0].orValue('')",
    "target": "request.operation == 'DELETE' ? oldObject : object",
}
_NO_NODE_IN_TOKEN = k8s.admissionregistration.v1.ValidationArgs(
    expression="variables.node != ''",
    message="the RDMA agent's token names no node: it writes only from its pod on a node",
    reason="Forbidden",
)
_NODE_EVENTS = (
    k8s.admissionregistration.v1.NamedRuleWithOperationsArgs(
        api_groups=[""], api_versions=["*"], operations=["CREATE", "UPDATE"], resources=["events"]
    ),
    [
        k8s.admissionregistration.v1.ValidationArgs(
            expression=(
                "object.involvedObject.kind == 'Node' && object.involvedObject.name == "
                "variables.node && (request.operation != 'UPDATE' || "
                "oldObject.involvedObject.name == variables.node)"
            ),
            message_expression=(
                "'the RDMA agent on node ' + variables.node + ' may post Events about that "
                "Node only'"
            ),
            reason="Forbidden",
        )
    ],
)


def _node_slices(
    driver: str,
) -> tuple[
    k8s.admissionregistration.v1.NamedRuleWithOperationsArgs,
    list[k8s.admissionregistration.v1.ValidationArgs],
]:
    """The DRA driver's ResourceSlices: its own node's, of its own driver, in every version."""
    return (
        k8s.admissionregistration.v1.NamedRuleWithOperationsArgs(
            api_groups=["resource.k8s.io"],
            api_versions=["*"],
            operations=["CREATE", "UPDATE", "DELETE"],
            resources=["resourceslices"],
        ),
        [
            k8s.admissionregistration.v1.ValidationArgs(
                # a slice's node and driver cannot change: the object written tells both
                expression="variables.target.spec.?nodeName.orValue('') == variables.node",
                message_expression=(
                    "'the RDMA agent on node ' + variables.node + ' may write the "
                    "ResourceSlices of that node only'"
                ),
                reason="Forbidden",
            ),
            k8s.admissionregistration.v1.ValidationArgs(
                expression=f"variables.target.spec.driver == '{driver}'",
                message=f"the RDMA agent may write only {driver}'s ResourceSlices",
                reason="Forbidden",
            ),
        ],
    )


@dataclass(frozen=True)
class DevicePluginArgs:
    namespace: str
    plugin_config: PluginConfig
    # The device plugin's flags, or the DRA driver's
    launch: LaunchSpec | DraLaunchSpec
    # Pinned, or built from plugin/Dockerfile and pushed to a repository created in an ACR
    # Enterprise Edition instance (the Personal Edition's resources are deprecated).
    image: PinnedImage | BuiltImage
    # The ACR namespace a built image goes to (one per stack).
    registry_namespace: str
    # How long `pulumi up` waits for the DaemonSet to roll out (a duration such as 10m).
    await_timeout: str
    # The nodes it runs on
    node_selector: Mapping[str, str]


class RdmaDevicePlugin(pulumi.ComponentResource):
    """Our RDMA node agent as a DaemonSet, the device plugin or the DRA driver (as the launch
    spec says); its ConfigMap is the plugin's own config model."""

    daemonset_name: pulumi.Output[str]
    nodes: pulumi.Output[int | None]
    image: pulumi.Output[str]
    pod_labels: dict[str, str]

    def __init__(
        self, name: str, args: DevicePluginArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("lingjun:rdma:DevicePlugin", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        pull_secrets: list[k8s.core.v1.LocalObjectReferenceArgs] = []
        namespace = k8s.core.v1.Namespace(
            f"{name}-ns",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=args.namespace),
            opts=child,
        )
        in_ns = pulumi.ResourceOptions(parent=self, depends_on=[namespace])
        if isinstance(args.image, BuiltImage):
            build = args.image
            # The instance's internet domain ("<instance name>-registry.<region>.cr.aliyuncs.com"):
            # the push runs on the deployer's machine, outside the VPC.
            registry = cs.get_registry_enterprise_instances_output(
                ids=[build.acr_instance_id], opts=pulumi.InvokeOutputOptions(parent=self)
            ).instances.apply(
                lambda found: registry_endpoint(
                    build.acr_instance_id, found[0].public_endpoints if found else []
                )
            )
            self.image = self._build_image(name, build, args.registry_namespace, registry, child)
            if build.login is not None:
                secret = self._pull_secret(name, args.namespace, registry, build.login, in_ns)
                pull_secrets.append(k8s.core.v1.LocalObjectReferenceArgs(name=secret))
        else:
            self.image = pulumi.Output.from_input(args.image.ref)
        labels = {APP_LABEL: name}
        self.pod_labels = labels  # what selects its pods (a PodMonitor)
        account = k8s.core.v1.ServiceAccount(
            f"{name}-sa",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=name, namespace=args.namespace, labels=labels),
            # mounted by the DaemonSet's pod alone (its RBAC: Events, and the DRA driver's)
            automount_service_account_token=False,
            opts=in_ns,
        )
        self._event_access(name, args.namespace, in_ns)
        driver = args.launch.driver_name if isinstance(args.launch, DraLaunchSpec) else None
        if driver is not None:
            self._dra_access(name, args.namespace, driver, in_ns)
        self._own_node_only(name, args.namespace, driver, in_ns)
        config_text = args.plugin_config.to_file()
        config_map = k8s.core.v1.ConfigMap(
            f"{name}-config",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=name, namespace=args.namespace, labels=labels),
            data={args.launch.config_path.name: config_text},
            opts=in_ns,
        )
        daemonset = k8s.apps.v1.DaemonSet(
            f"{name}-ds",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=name, namespace=args.namespace, labels=labels),
            spec=_daemonset_spec(
                args.launch,
                labels=labels,
                image=self.image,
                service_account=account.metadata.name,
                config_map=config_map.metadata.name,
                config_sha256=hashlib.sha256(config_text.encode()).hexdigest(),
                pull_secrets=pull_secrets,
                node_selector=args.node_selector,
            ),
            # The provider awaits the rollout on every node, 10 minutes unless told otherwise.
            opts=pulumi.ResourceOptions.merge(
                in_ns,
                pulumi.ResourceOptions(
                    custom_timeouts=pulumi.CustomTimeouts(
                        create=args.await_timeout, update=args.await_timeout
                    )
                ),
            ),
        )
        self.daemonset_name = daemonset.metadata.name
        # the nodes its selector matched when the rollout was awaited (0: it runs nowhere)
        self.nodes = daemonset.status.apply(lambda s: s.desired_number_scheduled if s else None)
        self.register_outputs(
            {"daemonset_name": self.daemonset_name, "image": self.image, "nodes": self.nodes}
        )

    def _event_access(self, name: str, namespace: str, opts: pulumi.ResourceOptions) -> None:
        """Warning Events on its Node for what it finds wrong: create and patch Events in the
        namespace the kubelet posts a Node's Events in, nothing else."""
        role = k8s.rbac.v1.Role(
            f"{name}-events",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=name, namespace=EVENT_NAMESPACE),
            rules=[
                k8s.rbac.v1.PolicyRuleArgs(
                    api_groups=[""], resources=["events"], verbs=["create", "patch"]
                )
            ],
            opts=opts,
        )
        k8s.rbac.v1.RoleBinding(
            f"{name}-events-binding",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=name, namespace=EVENT_NAMESPACE),
            role_ref=k8s.rbac.v1.RoleRefArgs(
                api_group="rbac.authorization.k8s.io", kind="Role", name=role.metadata.name
            ),
            subjects=[
                k8s.rbac.v1.SubjectArgs(kind="ServiceAccount", name=name, namespace=namespace)
            ],
            opts=opts,
        )

    def _own_node_only(
        self, name: str, namespace: str, driver: str | None, opts: pulumi.ResourceOptions
    ) -> None:
        """What RBAC cannot narrow to a node, admission does: the agent's writes are admitted
        only about the node named in its own token (bound service-account tokens carry it),
        so an agent taken over on one node cannot touch another node's slices or Events."""
        policies = {"events": _NODE_EVENTS}
        if driver is not None:
            policies["slices"] = _node_slices(driver)
        agent = f"system:serviceaccount:{namespace}:{name}"
        for what, (rules, validations) in policies.items():
            policy = k8s.admissionregistration.v1.ValidatingAdmissionPolicy(
                f"{name}-own-node-{what}",
                metadata=k8s.meta.v1.ObjectMetaArgs(name=f"{name}-own-node-{what}"),
                spec=k8s.admissionregistration.v1.ValidatingAdmissionPolicySpecArgs(
                    failure_policy="Fail",
                    match_constraints=k8s.admissionregistration.v1.MatchResourcesArgs(
                        resource_rules=[rules]
                    ),
                    match_conditions=[
                        k8s.admissionregistration.v1.MatchConditionArgs(
                            name="the-rdma-agent",
                            expression=f"request.userInfo.username == '{agent}'",
                        )
                    ],
                    variables=[
                        k8s.admissionregistration.v1.VariableArgs(name=n, expression=e)
                        for n, e in _ADMISSION_VARIABLES.items()
                    ],
                    validations=[_NO_NODE_IN_TOKEN, *validations],
                ),
                opts=opts,
            )
            k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
                f"{name}-own-node-{what}-binding",
                metadata=k8s.meta.v1.ObjectMetaArgs(name=f"{name}-own-node-{what}"),
                spec=k8s.admissionregistration.v1.ValidatingAdmissionPolicyBindingSpecArgs(
                    policy_name=policy.metadata.name, validation_actions=["Deny"]
                ),
                opts=opts,
            )

    def _dra_access(
        self, name: str, namespace: str, driver: str, opts: pulumi.ResourceOptions
    ) -> None:
        """What the DRA driver reads and writes in the API (its node's ResourceSlices, the
        claims it prepares and their pods), and the DeviceClasses pods ask by."""
        role = k8s.rbac.v1.ClusterRole(
            f"{name}-role",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=name),
            rules=[
                k8s.rbac.v1.PolicyRuleArgs(  # RBAC cannot narrow these to a node: see below
                    api_groups=["resource.k8s.io"],
                    resources=["resourceslices"],
                    verbs=["list", "watch", "create", "update", "delete"],
                ),
                k8s.rbac.v1.PolicyRuleArgs(
                    api_groups=["resource.k8s.io"], resources=["resourceclaims"], verbs=["get"]
                ),
                # whether a claim's pods are on the host network: then its CDI spec carries
                # NCCL's settings (the host's GIDs, known at prepare time)
                k8s.rbac.v1.PolicyRuleArgs(api_groups=[""], resources=["pods"], verbs=["get"]),
            ],
            opts=opts,
        )
        k8s.rbac.v1.ClusterRoleBinding(
            f"{name}-binding",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=name),
            role_ref=k8s.rbac.v1.RoleRefArgs(
                api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=role.metadata.name
            ),
            subjects=[
                k8s.rbac.v1.SubjectArgs(kind="ServiceAccount", name=name, namespace=namespace)
            ],
            opts=opts,
        )
        for mode in ("shared", "exclusive"):
            klass = device_class(driver, mode)
            # resource.k8s.io/v1 is newer than this SDK's types: the provider takes it as is
            k8s.apiextensions.CustomResource(
                f"{name}-class-{mode}",
                api_version=str(klass["apiVersion"]),
                kind=str(klass["kind"]),
                metadata=k8s.meta.v1.ObjectMetaArgs(name=device_class_name(driver, mode)),
                spec=klass["spec"],
                opts=opts,
            )

    def _build_image(
        self,
        name: str,
        build: BuiltImage,
        registry_namespace: str,
        registry: pulumi.Output[str],
        child: pulumi.ResourceOptions,
    ) -> pulumi.Output[str]:
        namespace = cs.RegistryEnterpriseNamespace(
            f"{name}-acr-ns",
            instance_id=build.acr_instance_id,
            name=registry_namespace,
            auto_create=False,
            default_visibility="PRIVATE",
            opts=child,
        )
        repo = cs.RegistryEnterpriseRepo(
            f"{name}-acr-repo",
            instance_id=build.acr_instance_id,
            name="rdma-device-plugin",
            namespace=namespace.name,
            repo_type="PRIVATE",
            summary="lingjun-rdma device plugin (built by Pulumi from plugin/Dockerfile)",
            opts=child,
        )
        image = docker_build.Image(
            f"{name}-image",
            push=True,
            context=docker_build.BuildContextArgs(location=BUILD_CONTEXT),
            dockerfile=docker_build.DockerfileArgs(location=DOCKERFILE),
            platforms=[docker_build.Platform.LINUX_AMD64],
            tags=[pulumi.Output.concat(registry, "/", namespace.name, "/", repo.name, ":latest")],
            registries=[
                docker_build.RegistryArgs(
                    address=registry,
                    username=build.login.username,
                    password=pulumi.Output.secret(build.login.password.get_secret_value()),
                )
            ]
            if build.login is not None
            else None,
            opts=child,
        )
        # `ref` carries the pushed digest: the DaemonSet pins it, so a rebuild rolls the pods.
        return image.ref

    def _pull_secret(
        self,
        name: str,
        namespace: str,
        registry: pulumi.Output[str],
        login: RegistryLogin,
        opts: pulumi.ResourceOptions,
    ) -> str:
        secret_name = f"{name}-pull"
        # secret from the password on: everything derived from it stays secret
        password = pulumi.Output.secret(login.password.get_secret_value())
        config = pulumi.Output.all(registry, password).apply(
            lambda v: json.dumps({"auths": {v[0]: {"username": login.username, "password": v[1]}}})
        )
        k8s.core.v1.Secret(
            f"{name}-pull",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=secret_name, namespace=namespace),
            type="kubernetes.io/dockerconfigjson",
            string_data={".dockerconfigjson": config},
            opts=opts,
        )
        return secret_name


def registry_endpoint(instance_id: str, endpoints: Sequence[str]) -> str:
    """The domain to push to; a missing instance (or one without an internet endpoint) is a
    config error, named as one."""
    if not endpoints:
        raise StackConfigError(
            f"lingjun-rdma:acrInstanceId: {instance_id!r}: no ACR Enterprise Edition instance "
            "with an internet endpoint in this region: enable its internet access or "
            "pulumi config set lingjun-rdma:acrInstanceId <the cri-… ID of one that has it>"
        )
    return endpoints[0]


def _host_path(name: str, path: str, kind: str = "Directory") -> k8s.core.v1.VolumeArgs:
    return k8s.core.v1.VolumeArgs(
        name=name, host_path=k8s.core.v1.HostPathVolumeSourceArgs(path=path, type=kind)
    )


def _probe(initial_delay: int) -> k8s.core.v1.ProbeArgs:
    return k8s.core.v1.ProbeArgs(
        http_get=k8s.core.v1.HTTPGetActionArgs(path="/healthz", port="metrics"),
        initial_delay_seconds=initial_delay,
        period_seconds=10,
        failure_threshold=3,
    )


def _node_paths(
    launch: LaunchSpec | DraLaunchSpec,
) -> tuple[list[k8s.core.v1.VolumeArgs], list[k8s.core.v1.VolumeMountArgs]]:
    """The kubelet's dirs the agent writes its sockets in (and the DRA driver's CDI dir), each
    mounted where the launch spec says: only those, read-write."""
    if isinstance(launch, LaunchSpec):  # the kubelet's: there before any plugin
        paths = {"device-plugins": (DEFAULT_DEVICE_PLUGIN_DIR, launch.device_plugin_dir)}
        kind = "Directory"
    else:
        own = launch.plugins_dir / launch.driver_name  # its socket and checkpoint, no other's
        paths = {
            "plugins-registry": (launch.plugins_registry_dir, launch.plugins_registry_dir),
            "plugin-dir": (own, own),
            "cdi": (launch.cdi_dir, launch.cdi_dir),
        }
        kind = "DirectoryOrCreate"
    volumes = [_host_path(n, str(host), kind) for n, (host, _) in paths.items()]
    mounts = [
        k8s.core.v1.VolumeMountArgs(name=n, mount_path=str(at)) for n, (_, at) in paths.items()
    ]
    return volumes, mounts


def _daemonset_spec(
    launch: LaunchSpec | DraLaunchSpec,
    *,
    labels: dict[str, str],
    image: pulumi.Input[str],
    service_account: pulumi.Input[str],
    config_map: pulumi.Input[str],
    config_sha256: str,
    pull_secrets: list[k8s.core.v1.LocalObjectReferenceArgs],
    node_selector: Mapping[str, str],
) -> k8s.apps.v1.DaemonSetSpecArgs:
    if launch.metrics_port is None:
        raise ValueError(
            "plugin launch: metrics_address is empty, but the DaemonSet's probes read /healthz "
            "there: give the LaunchSpec a HOST:PORT"
        )
    node_volumes, node_mounts = _node_paths(launch)
    container = k8s.core.v1.ContainerArgs(
        name="plugin",
        image=image,
        command=launch.command(),
        env=[
            k8s.core.v1.EnvVarArgs(
                name=NODE_NAME_ENV,
                value_from=k8s.core.v1.EnvVarSourceArgs(
                    field_ref=k8s.core.v1.ObjectFieldSelectorArgs(field_path="spec.nodeName")
                ),
            )
        ],
        ports=[
            k8s.core.v1.ContainerPortArgs(
                name="metrics", container_port=launch.metrics_port, protocol="TCP"
            )
        ],
        liveness_probe=_probe(initial_delay=10),
        readiness_probe=_probe(initial_delay=2),
        resources=k8s.core.v1.ResourceRequirementsArgs(
            requests={"cpu": "50m", "memory": "64Mi"},
            limits={"cpu": "500m", "memory": "256Mi"},
        ),
        # Root because the kubelet's device-plugins dir belongs to root: as its owner, uid 0
        # creates its socket there without CAP_DAC_OVERRIDE. Reading link state over netlink
        # and sysfs needs no capability either, so every capability is dropped. nonHostNetwork
        # adds no privilege here: pods off the host network get their RDMA through the kernel's
        # shared netns mode and the char devices Allocate hands out, not through this container.
        security_context=k8s.core.v1.SecurityContextArgs(
            run_as_user=0,
            run_as_non_root=False,
            privileged=False,
            allow_privilege_escalation=False,
            read_only_root_filesystem=True,
            capabilities=k8s.core.v1.CapabilitiesArgs(drop=["ALL"]),
            seccomp_profile=k8s.core.v1.SeccompProfileArgs(type="RuntimeDefault"),
        ),
        volume_mounts=[
            *node_mounts,
            k8s.core.v1.VolumeMountArgs(
                name="sys", mount_path=str(launch.sysfs_root), read_only=True
            ),
            k8s.core.v1.VolumeMountArgs(
                name="infiniband", mount_path=str(launch.dev_root / "infiniband"), read_only=True
            ),
            k8s.core.v1.VolumeMountArgs(
                name="config", mount_path=str(launch.config_path.parent), read_only=True
            ),
            k8s.core.v1.VolumeMountArgs(name="tmp", mount_path="/tmp"),
        ],
    )
    pod = k8s.core.v1.PodSpecArgs(
        # The health watcher follows the host's RDMA netdevs over netlink; those links exist only
        # in the host's network namespace.
        host_network=True,
        # restrack lists each QP with its creator's pid in the caller's pid namespace: only the
        # host's sees the QPs of every pod (and /proc/<pid>/cgroup names their pods)
        host_pid=launch.pod_qps == "on",
        dns_policy="ClusterFirstWithHostNet",
        priority_class_name="system-node-critical",
        service_account_name=service_account,
        # the DRA driver publishes ResourceSlices and reads claims: its token, and only its
        # Events on its Node; the DRA driver's slices and claims too (see the RBAC)
        automount_service_account_token=True,
        node_selector=dict(node_selector),
        tolerations=[k8s.core.v1.TolerationArgs(operator="Exists")],
        image_pull_secrets=pull_secrets or None,
        containers=[container],
        volumes=[
            *node_volumes,
            _host_path("sys", "/sys"),
            # Absent until the RDMA driver loads: the plugin must start anyway (zero devices) and
            # see the device nodes appear in this same directory.
            _host_path("infiniband", "/dev/infiniband", "DirectoryOrCreate"),
            k8s.core.v1.VolumeArgs(
                name="config", config_map=k8s.core.v1.ConfigMapVolumeSourceArgs(name=config_map)
            ),
            # Writable scratch for Python with a read-only root filesystem.
            k8s.core.v1.VolumeArgs(
                name="tmp", empty_dir=k8s.core.v1.EmptyDirVolumeSourceArgs(size_limit="16Mi")
            ),
        ],
    )
    return k8s.apps.v1.DaemonSetSpecArgs(
        selector=k8s.meta.v1.LabelSelectorArgs(match_labels=labels),
        update_strategy=k8s.apps.v1.DaemonSetUpdateStrategyArgs(
            type="RollingUpdate",
            rolling_update=k8s.apps.v1.RollingUpdateDaemonSetArgs(max_unavailable=1),
        ),
        template=k8s.core.v1.PodTemplateSpecArgs(
            metadata=k8s.meta.v1.ObjectMetaArgs(
                labels=labels,
                # A ConfigMap edit alone restarts no pod; this hash makes a config change roll them.
                annotations={"lingjun-rdma/config-sha256": config_sha256},
            ),
            spec=pod,
        ),
    )
