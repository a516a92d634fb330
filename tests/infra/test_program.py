"""The program under Pulumi mocks: resolved inputs of every resource, for each stack and mode."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
import yaml
from pulumi.runtime.mocks import MockMonitor
from pulumi.runtime.settings import get_monitor

from infra.commands.offline import RunResult, manifests, normalize, run_program
from infra.components.jobs import JOB_CREATED, RDMA_ENV_FILE, job_spec
from infra.components.node_agent import registry_endpoint
from infra.stack.credentials import SECRET
from infra.stack.files import stack_config
from infra.stack.keys import StackConfigError
from infra.stack.samples import LINGJUN_NCCL_ENV, SAMPLES
from plugin import launch
from plugin.config import DEFAULT_MAX_ALLOCATIONS, parse_config
from plugin.launch import (
    DEFAULT_CONFIG_PATH,
    DEFAULT_DEVICE_PLUGIN_DIR,
    DEFAULT_METRICS_PORT,
    LaunchSpec,
)
from tests.infra.conftest import STACKS, k8s_object, k8s_objects, of_type, one, run

# (stack, nonHostNetwork): one stack per network mode.
MODES = [("dev", False), ("staging", True)]


def _pod(job: dict[str, Any]) -> dict[str, Any]:
    return job["spec"]["template"]["spec"]


def _plugin_config(result: RunResult) -> Any:
    data = k8s_object(result, "ConfigMap", "rdma-device-plugin")["data"]
    return parse_config(yaml.safe_load(data[DEFAULT_CONFIG_PATH.name]), "ConfigMap")


def _daemonset(result: RunResult) -> dict[str, Any]:
    return k8s_object(result, "DaemonSet", "rdma-device-plugin")


@pytest.mark.parametrize(("stack", "non_host_network"), MODES)
def test_configmap_is_the_plugins_own_config_with_the_network_mode(
    stack: str, non_host_network: bool
) -> None:
    config = _plugin_config(run(stack))

    assert config.non_host_network is non_host_network
    assert [p.resource_name for p in config.pools] == ["rdma/hca"]
    assert config.pools[0].mode == "shared"
    assert config.pools[0].max_allocations == DEFAULT_MAX_ALLOCATIONS


def test_exclusive_pool_config_omits_max_allocations_and_parses() -> None:
    result = run("prod")
    raw = yaml.safe_load(
        k8s_object(result, "ConfigMap", "rdma-device-plugin")["data"]["plugin.yaml"]
    )

    assert "maxAllocations" not in raw["pools"][0]
    assert _plugin_config(result).pools[0].mode == "exclusive"


def test_resource_name_override_reaches_configmap_and_job_limits() -> None:
    result = run("dev", "rdmaResourceName=example.com/roce")

    assert _plugin_config(result).pools[0].resource_name == "example.com/roce"
    for job in k8s_objects(result, "Job"):
        pod = _pod(job)
        for container in (pod["containers"][0], pod["initContainers"][0]):
            limits = container["resources"]["limits"]
            assert limits["example.com/roce"] == "1"
            assert "rdma/hca" not in limits


@pytest.mark.parametrize(("stack", "non_host_network"), MODES)
def test_jobs_host_network_follows_the_stack_mode(stack: str, non_host_network: bool) -> None:
    jobs = k8s_objects(run(stack), "Job")

    assert jobs
    assert {_pod(j)["hostNetwork"] for j in jobs} == {not non_host_network}


@pytest.mark.parametrize(("stack", "non_host_network"), MODES)
def test_jobs_ask_one_rdma_hca_8gi_memory_shm_and_rdma_capabilities(
    stack: str, non_host_network: bool
) -> None:
    jobs = k8s_objects(run(stack), "Job")

    assert jobs
    for job in jobs:
        pod = _pod(job)
        container = pod["containers"][0]
        assert container["resources"]["limits"]["rdma/hca"] == "1"
        assert {"name": "shm", "mountPath": "/dev/shm"} in container["volumeMounts"]
        assert {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}} in pod[
            "volumes"
        ]
        assert container["securityContext"]["capabilities"]["add"] == ["SYS_RESOURCE", "IPC_LOCK"]
        assert pod["tolerations"] == [{"operator": "Exists"}]
        assert pod["restartPolicy"] == "Never"


def _without_the_resolver(job: dict[str, Any]) -> dict[str, Any]:
    """The Job as it would be without the NCCL env resolver: no init container, no rdma-env
    volume, the command not wrapped in `sh -c 'source; exec "$@"'`."""
    job = copy.deepcopy(job)
    pod = _pod(job)
    del pod["initContainers"]
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] != "rdma-env"]
    container = pod["containers"][0]
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] != "rdma-env"]
    container["command"] = container["command"][4:]
    return job


def test_hps_benchmark_is_the_product_docs_job_plus_the_resolver() -> None:
    job = _without_the_resolver(k8s_object(run("dev"), "Job", "hps-benchmark"))
    doc = yaml.safe_load(HPS_BENCHMARK_FROM_THE_DOC)
    doc["spec"]["template"]["spec"]["containers"][0]["image"] = (
        "registry.cn-wulanchabu.aliyuncs.com/lingjun-rdma/hps-benchmark:0.1.0"
    )
    # Quantities are strings in the typed API; the doc writes them as YAML ints.
    limits = doc["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    doc["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] = {
        k: str(v) for k, v in limits.items()
    }

    assert job["spec"] == doc["spec"]
    assert job["metadata"]["name"] == doc["metadata"]["name"]


def test_perftest_is_an_indexed_pair_on_two_nodes_behind_a_headless_service() -> None:
    result = run("dev")
    job = k8s_object(result, "Job", "perftest")
    service = k8s_object(result, "Service", "perftest")
    pod = _pod(job)

    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 2
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"batch.kubernetes.io/job-name": "perftest"}
    assert pod["subdomain"] == "perftest"
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["topologyKey"] == "kubernetes.io/hostname"
    script = pod["containers"][0]["command"][-1]
    assert "ib_write_bw" in script
    assert "perftest-0.perftest" in script


def test_nccl_tests_runs_all_reduce_on_8_gpus_with_lingjun_nccl_settings_resolved() -> None:
    pod = _pod(k8s_object(run("dev"), "Job", "nccl-tests"))
    container, resolver = pod["containers"][0], pod["initContainers"][0]

    assert container["command"][4:] == [
        "all_reduce_perf",
        "-b",
        "8",
        "-e",
        "8G",
        "-f",
        "2",
        "-g",
        "8",
    ]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    # nothing pod-specific is hard-coded: HCAs, GID index and interface come from the resolver
    assert "env" not in container
    sets = dict(
        a.split("=", 1) for a in resolver["command"][resolver["command"].index("--set") :][1::2]
    )
    assert sets == {**LINGJUN_NCCL_ENV, "NCCL_DEBUG": "INFO"}


@pytest.mark.parametrize(("stack", "family"), [("dev", "ipv4"), ("staging", "ipv6")])
def test_every_job_resolves_its_nccl_env_in_its_own_namespace_first(
    stack: str, family: str
) -> None:
    result = run(stack)
    plugin_image = k8s_object(result, "DaemonSet", "rdma-device-plugin")["spec"]["template"][
        "spec"
    ]["containers"][0]["image"]

    jobs = k8s_objects(result, "Job")
    assert jobs
    for job in jobs:
        pod = _pod(job)
        (resolver,) = pod["initContainers"]
        container = pod["containers"][0]
        assert resolver["image"] == plugin_image
        command = resolver["command"]
        assert command[:3] == ["python", "-m", "plugin.podenv"]
        assert command[command.index("--family") + 1] == family
        assert command[command.index("--out") + 1] == RDMA_ENV_FILE
        # the same resource: Allocate names the HCAs to it, the workload reuses its devices
        assert resolver["resources"]["limits"] == {"rdma/hca": "1"}
        assert resolver["terminationMessagePolicy"] == "FallbackToLogsOnError"
        assert resolver["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert resolver["securityContext"]["runAsNonRoot"] is True
        assert container["command"][:2] == ["sh", "-c"]
        assert f". {RDMA_ENV_FILE}" in container["command"][2]
        assert {
            "name": "rdma-env",
            "mountPath": "/var/run/lingjun-rdma",
            "readOnly": True,
        } in container["volumeMounts"]
        assert {"name": "rdma-env", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}} in pod[
            "volumes"
        ]


def test_a_job_that_opts_out_runs_its_command_as_is_with_nccl_settings_in_its_env() -> None:
    spec = dataclasses.replace(SAMPLES["nccl-tests"].build("i:1"), resolve_env=False)

    pod = job_spec(
        spec, resource_name="rdma/hca", host_network=True, deadline_seconds=None, plugin_image="p:1"
    ).template.spec  # type: ignore[union-attr]

    assert pod.init_containers is None
    container = pod.containers[0]
    assert container.command[0] == "all_reduce_perf"
    assert {e.name: e.value for e in container.env} == {**LINGJUN_NCCL_ENV, "NCCL_DEBUG": "INFO"}


def test_every_configurable_sample_has_a_spec() -> None:
    for name, sample in SAMPLES.items():
        assert sample.build("i:1").name == name


def test_sample_jobs_are_awaited_only_to_creation_unless_the_stack_sets_a_timeout() -> None:
    dev_jobs = k8s_objects(run("dev"), "Job")
    prod_jobs = k8s_objects(run("prod"), "Job")

    # not skipAwait: a destroy must wait for the Jobs' pods before it removes the plugin
    assert all(
        j["metadata"]["annotations"] == {"pulumi.com/waitFor": JOB_CREATED} for j in dev_jobs
    )
    assert all("annotations" not in j["metadata"] for j in prod_jobs)


def test_without_a_job_timeout_jobs_have_no_deadline_and_no_await_timeout() -> None:
    result = run("dev")

    assert all("activeDeadlineSeconds" not in j["spec"] for j in k8s_objects(result, "Job"))
    assert [k for k in result.timeouts if k[0] == "kubernetes:batch/v1:Job"] == []


def test_job_timeout_is_the_jobs_deadline_and_the_await_ends_a_minute_later() -> None:
    result = run("prod")  # jobAwaitTimeout: 30m

    jobs = k8s_objects(result, "Job")
    assert jobs
    assert {j["spec"]["activeDeadlineSeconds"] for j in jobs} == {1800}
    awaited = [r for r in of_type(result, "kubernetes:batch/v1:Job")]
    for job in awaited:
        timeouts = result.timeouts[(job.type, job.name)]
        assert timeouts == {"create": "1860s", "update": "1860s"}


@pytest.mark.parametrize(("stack", "overrides", "expected"), [
    ("dev", (), "10m"),
    ("local", ("pluginAwaitTimeout=3m",), "3m"),
])  # fmt: skip
def test_the_daemonset_rollout_await_is_bounded_by_plugin_await_timeout(
    stack: str, overrides: tuple[str, ...], expected: str
) -> None:
    result = run(stack, *overrides)

    daemonset = one(result, "kubernetes:apps/v1:DaemonSet")
    assert result.timeouts[(daemonset.type, daemonset.name)] == {
        "create": expected,
        "update": expected,
    }


@pytest.mark.parametrize("stack", STACKS)
def test_configmaps_are_updated_in_place_not_replaced(stack: str) -> None:
    # Replacing the plugin's ConfigMap would replace the DaemonSet that names it too.
    provider = one(run(stack), "pulumi:providers:kubernetes")

    assert provider.inputs["enableConfigMapMutable"] == "true"  # provider config: as text


def test_cluster_is_ack_pro_small_ipv4_without_ipv6() -> None:
    ack = one(run("dev"), "alicloud:cs/managedKubernetes:ManagedKubernetes")

    assert ack.inputs["clusterSpec"] == "ack.pro.small"
    assert ack.inputs["ipStack"] == "ipv4"
    addons = [a["name"] for a in ack.inputs["addons"]]
    assert "ack-rdma-device-plugin" not in addons  # our DaemonSet replaces it
    # nodes pull the image we push without a Secret; the managed edition, for managed clusters
    assert "managed-aliyun-acr-credential-helper" in addons


def test_cluster_is_dual_stack_with_ipv6() -> None:
    ack = one(run("staging"), "alicloud:cs/managedKubernetes:ManagedKubernetes")

    assert ack.inputs["clusterSpec"] == "ack.pro.small"
    assert ack.inputs["ipStack"] == "dual"


@pytest.mark.parametrize("ipv6", [False, True])
def test_vpc_and_vswitches_get_ipv6_only_when_asked(ipv6: bool) -> None:
    result = run("dev", f"ipv6={str(ipv6).lower()}")
    network = one(result, "alicloud:vpc/network:Network")
    switches = of_type(result, "alicloud:vpc/switch:Switch")

    assert network.inputs["enableIpv6"] is ipv6
    assert switches
    for switch in switches:
        assert switch.inputs["enableIpv6"] is ipv6
        assert ("ipv6CidrBlockMask" in switch.inputs) is ipv6


def test_prod_vswitches_get_distinct_ipv6_subnets() -> None:
    masks = [
        s.inputs["ipv6CidrBlockMask"] for s in of_type(run("prod"), "alicloud:vpc/switch:Switch")
    ]

    assert len(masks) == 2
    assert len(set(masks)) == 2


def test_node_pool_is_lingjun_on_the_created_eflo_group() -> None:
    result = run("dev")
    pool = one(result, "alicloud:cs/nodePool:NodePool")
    eflo = one(result, "alicloud:eflo/cluster:Cluster")
    group = one(result, "alicloud:eflo/nodeGroup:NodeGroup")

    assert pool.inputs["type"] == "lingjun"
    # the node group's bare id, not its resource ID ("<cluster id>:<group id>")
    assert pool.inputs["efloNodeGroup"] == {
        "clusterId": f"{eflo.name}-id",
        "groupId": f"{group.name}-group",
    }
    assert pool.inputs["desiredSize"] == "2"
    assert eflo.inputs["networks"]["tailIpVersion"] == "ipv4"


def test_node_pool_adopts_an_existing_eflo_group() -> None:
    result = run("staging")
    pool = one(result, "alicloud:cs/nodePool:NodePool")

    assert pool.inputs["type"] == "lingjun"
    assert pool.inputs["efloNodeGroup"] == {
        "clusterId": "i118578141694745246541",
        "groupId": "i120341751696216227830",
    }
    assert not of_type(result, "alicloud:eflo/cluster:Cluster")


def test_created_eflo_cluster_has_an_ipv6_compute_network_when_asked() -> None:
    eflo = one(run("prod"), "alicloud:eflo/cluster:Cluster")

    assert eflo.inputs["networks"]["tailIpVersion"] == "ipv6"


@pytest.mark.parametrize("stack", ["dev", "local"])
def test_kubeconfig_is_a_secret_output_and_a_secret_provider_input(stack: str) -> None:
    result = run(stack)
    provider = one(result, "pulumi:providers:kubernetes")

    assert result.outputs["kubeconfig"][1] is True
    assert normalize(provider.inputs)["kubeconfig"] == SECRET


def test_existing_mode_by_kubeconfig_needs_no_cloud_account() -> None:
    result = run("local")
    cloud = [r.type for r in result.resources if r.custom and "alicloud" in r.type]

    assert cloud == []
    assert k8s_objects(result, "DaemonSet")


def test_existing_mode_by_cluster_id_fetches_the_kubeconfig_from_ack() -> None:
    result = run("local", "kubeconfig=", "clusterId=c123")

    assert one(result, "pulumi:providers:alicloud").inputs["region"] == "cn-wulanchabu"
    assert result.outputs["clusterId"] == ("c123", False)
    assert result.outputs["kubeconfig"][1] is True


def test_daemonset_runs_on_lingjun_nodes_unprivileged_with_all_capabilities_dropped() -> None:
    pod = _daemonset(run("dev"))["spec"]["template"]["spec"]
    container = pod["containers"][0]
    security = container["securityContext"]

    assert security["privileged"] is False
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert "add" not in security["capabilities"]
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["nodeSelector"] == {"alibabacloud.com/lingjun-worker": "true"}
    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["hostNetwork"] is True
    assert container["resources"]["requests"]
    assert container["resources"]["limits"]


def test_daemonset_mounts_only_what_the_plugin_needs() -> None:
    pod = _daemonset(run("dev"))["spec"]["template"]["spec"]
    mounts = {
        m["mountPath"]: m.get("readOnly", False) for m in pod["containers"][0]["volumeMounts"]
    }
    host_paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}

    assert host_paths == {str(DEFAULT_DEVICE_PLUGIN_DIR), "/sys", "/dev/infiniband"}
    assert mounts[str(DEFAULT_DEVICE_PLUGIN_DIR)] is False
    assert mounts["/sys"] is True
    assert mounts["/dev/infiniband"] is True
    assert mounts[str(DEFAULT_CONFIG_PATH.parent)] is True
    kinds = {
        v["hostPath"]["path"]: v["hostPath"]["type"] for v in pod["volumes"] if "hostPath" in v
    }
    assert kinds["/dev/infiniband"] == "DirectoryOrCreate", "a node whose driver is not loaded yet"


def test_daemonset_command_and_probes_use_the_plugins_paths_and_port() -> None:
    container = _daemonset(run("dev"))["spec"]["template"]["spec"]["containers"][0]
    command = container["command"]

    assert command[:3] == ["python", "-m", "plugin.deviceplugin"]
    assert command[command.index("--config") + 1] == str(DEFAULT_CONFIG_PATH)
    assert command[command.index("--metrics-address") + 1] == f"0.0.0.0:{DEFAULT_METRICS_PORT}"
    assert container["ports"] == [
        {"name": "metrics", "containerPort": DEFAULT_METRICS_PORT, "protocol": "TCP"}
    ]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}


@pytest.mark.parametrize(
    ("overrides", "interval", "counters"),
    [
        ((), 5.0, "on"),
        (("rdmaRescanInterval=30",), 30.0, "on"),
        (("rdmaPortCounters=false",), 5.0, "off"),
    ],
)
def test_daemonset_command_is_the_launch_spec_the_plugin_parses_back(
    overrides: tuple[str, ...], interval: float, counters: launch.OnOff
) -> None:
    command = _daemonset(run("dev", *overrides))["spec"]["template"]["spec"]["containers"][0][
        "command"
    ]

    assert launch.parse(command[3:], LaunchSpec) == LaunchSpec(
        config=DEFAULT_CONFIG_PATH,
        discovery="sysfs",
        rescan_interval=interval,
        port_counters=counters,
    )


def test_config_change_changes_the_pod_template() -> None:
    def template_hash(result: RunResult) -> str:
        annotations = _daemonset(result)["spec"]["template"]["metadata"]["annotations"]
        return annotations["lingjun-rdma/config-sha256"]

    assert template_hash(run("dev")) != template_hash(run("dev", "rdmaMaxAllocations=10"))


def test_built_plugin_image_is_pushed_to_acr_and_pinned_by_digest() -> None:
    result = run("prod")
    image = one(result, "docker-build:index:Image")
    container = _daemonset(result)["spec"]["template"]["spec"]["containers"][0]

    namespace = one(result, "alicloud:cs/registryEnterpriseNamespace:RegistryEnterpriseNamespace")
    repo = one(result, "alicloud:cs/registryEnterpriseRepo:RegistryEnterpriseRepo")

    assert image.inputs["push"] is True
    assert image.inputs["dockerfile"]["location"].endswith("plugin/Dockerfile")
    # an Enterprise Edition instance: the Personal Edition's cr.* resources are deprecated
    assert not [r for r in result.resources if r.type.startswith("alicloud:cr/")]
    assert namespace.inputs["instanceId"] == repo.inputs["instanceId"] == "cri-lingjunrdmaprod"
    assert repo.inputs["repoType"] == "PRIVATE"
    # pushed to the instance's own domain, as the provider reports it
    assert image.inputs["tags"] == [
        "cri-lingjunrdmaprod-registry.cr.aliyuncs.com/lingjun-rdma-prod/rdma-device-plugin:latest"
    ]
    assert "@sha256:" in container["image"]
    assert result.outputs["pluginImage"][0] == container["image"]


def test_registry_credentials_become_a_secret_pull_secret() -> None:
    result = run("prod", "registryUsername=robot", "registryPassword=hunter2")
    image = one(result, "docker-build:index:Image")
    pod = _daemonset(result)["spec"]["template"]["spec"]
    everything = yaml.safe_dump(manifests(result))

    assert pod["imagePullSecrets"] == [{"name": "rdma-device-plugin-pull"}]
    assert "hunter2" not in everything
    assert k8s_object(result, "Secret", "rdma-device-plugin-pull")["stringData"] == {
        ".dockerconfigjson": SECRET
    }
    assert normalize(image.inputs)["registries"][0]["password"] == SECRET


def test_components_use_lingjun_type_tokens() -> None:
    components = {r.type for r in run("dev").resources if not r.custom}

    assert {
        "lingjun:network:Network",
        "lingjun:cluster:Cluster",
        "lingjun:rdma:DevicePlugin",
        "lingjun:rdma:Job",
    } <= components


@pytest.mark.parametrize("stack", STACKS)
def test_outputs_name_cluster_plugin_and_jobs(stack: str) -> None:
    result = run(stack)
    job_names = sorted(m["metadata"]["name"] for m in k8s_objects(result, "Job"))

    assert set(result.outputs) >= {"clusterId", "kubeconfig", "pluginDaemonSet", "jobNames"}
    assert result.outputs["pluginDaemonSet"] == ("rdma-device-plugin", False)
    assert sorted(result.outputs["jobNames"][0]) == job_names


HPS_BENCHMARK_FROM_THE_DOC = """
apiVersion: batch/v1
kind: Job
metadata:
  name: hps-benchmark
spec:
  parallelism: 1
  template:
    spec:
      containers:
      - name: hps-benchmark
        image: "**"
        command:
        - sh
        - -c
        - |
          python /workspace/wdl_8gpu_outbrain.py
        resources:
          limits:
            nvidia.com/gpu: 8
            rdma/hca: 1
        workingDir: /root
        volumeMounts:
          - name: shm
            mountPath: /dev/shm
        securityContext:
          capabilities:
            add:
            - SYS_RESOURCE
            - IPC_LOCK
      restartPolicy: Never
      volumes:
        - name: shm
          emptyDir:
            medium: Memory
            sizeLimit: 8Gi
      hostNetwork: true
      tolerations:
        - operator: Exists
"""


@pytest.mark.parametrize("stack", STACKS)
def test_every_resource_is_a_named_child_of_a_lingjun_component(stack: str) -> None:
    config, secret_keys = stack_config(stack)
    run_program(stack, config, secret_keys)
    monitor = get_monitor()
    assert isinstance(monitor, MockMonitor)
    # URN tail: "<parent type>$<type>::<name>"
    entries = [urn.split("::", 2)[2].rsplit("::", 1) for urn in monitor.resources]
    components = {
        name for qualified, name in entries if qualified.split("$")[-1].startswith("lingjun:")
    }

    for qualified, name in entries:
        parent, _, type_ = qualified.rpartition("$")
        if parent == "pulumi:pulumi:Stack":
            assert type_.startswith("lingjun:") or type_ == "pulumi:providers:alicloud", name
        else:
            assert parent.startswith("lingjun:"), name
            assert any(name.startswith(f"{c}-") for c in components), name


def test_an_acr_instance_without_an_internet_endpoint_is_a_config_error() -> None:
    with pytest.raises(StackConfigError, match=r"acrInstanceId: 'cri-x': no ACR Enterprise"):
        registry_endpoint("cri-x", [])
    assert registry_endpoint("cri-x", ["a.cr.aliyuncs.com", "b"]) == "a.cr.aliyuncs.com"


def test_pod_qps_runs_the_plugin_in_the_hosts_pid_namespace_only_when_asked() -> None:
    off = _daemonset(run("local"))["spec"]["template"]["spec"]
    on = _daemonset(run("local", "rdmaPodQps=true"))["spec"]["template"]["spec"]

    assert "hostPID" not in off or off["hostPID"] is False
    assert "--pod-qps" in off["containers"][0]["command"]
    assert on["hostPID"] is True
    command = on["containers"][0]["command"]
    assert command[command.index("--pod-qps") + 1] == "on"
    assert on["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}


@pytest.mark.parametrize(
    ("stack", "overrides", "selector"),
    [("dev", (), {"alibabacloud.com/lingjun-worker": "true"}),
     ("local", ("agentNodeSelector=rdma.example.com/nic=cx7",), {"rdma.example.com/nic": "cx7"})],
)  # fmt: skip
def test_the_agents_daemonset_runs_on_the_nodes_the_stack_names(
    stack: str, overrides: tuple[str, ...], selector: dict[str, str]
) -> None:
    result = run(stack, *overrides)

    daemonset = one(result, "kubernetes:apps/v1:DaemonSet")
    assert daemonset.inputs["spec"]["template"]["spec"]["nodeSelector"] == selector
    assert result.outputs["agentNodeSelector"][0] == ",".join(
        f"{k}={v}" for k, v in selector.items()
    )
