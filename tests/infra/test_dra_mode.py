"""rdmaApi: dra under Pulumi mocks: the DRA driver's DaemonSet (least privilege, only the host
paths it writes), its RBAC and DeviceClasses, Jobs asking through ResourceClaimTemplates; and
the stacks preview refuses."""

from __future__ import annotations

from typing import Any

import pytest

from infra.stack.keys import StackConfigError
from infra.stack.model import parse
from plugin import launch
from plugin.dra.devices import device_class, device_class_name
from plugin.launch import DRA_DRIVER, DraLaunchSpec
from tests.infra.conftest import k8s_object, k8s_objects, run

DRA = (
    "rdmaApi=dra",
    'sampleJobs=["perftest", "hps-benchmark"]',
    "perftestImage=docker.io/library/busybox:1.36",
    "hpsBenchmarkImage=docker.io/library/busybox:1.36",
)


def _container(result: Any) -> dict[str, Any]:
    (ds,) = k8s_objects(result, "DaemonSet")
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    return container


def test_the_daemonset_runs_the_dra_driver_its_launch_spec_parses_back() -> None:
    container = _container(run("local", *DRA))

    command = container["command"]
    assert command[:3] == ["python", "-m", "plugin.dra"]
    spec = launch.parse(command[3:], DraLaunchSpec)
    assert (spec.driver_name, spec.discovery, spec.node_name) == (DRA_DRIVER, "sysfs", "")
    (env,) = container["env"]
    assert env == {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}


def test_the_driver_is_unprivileged_and_mounts_only_the_dirs_it_writes_and_reads() -> None:
    result = run("local", *DRA)
    pod = k8s_object(result, "DaemonSet", "rdma-dra-driver")["spec"]["template"]["spec"]
    container = _container(result)

    context = container["securityContext"]
    assert context["privileged"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"] == {"drop": ["ALL"]}
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host == {
        "plugins-registry": "/var/lib/kubelet/plugins_registry",
        "plugin-dir": f"/var/lib/kubelet/plugins/{DRA_DRIVER}",
        "cdi": "/var/run/cdi",
        "sys": "/sys",
        "infiniband": "/dev/infiniband",
    }
    writable = {m["name"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert writable == {"plugins-registry", "plugin-dir", "cdi", "tmp"}
    assert pod["automountServiceAccountToken"] is True


def test_its_rbac_is_its_slices_and_reading_claims_and_pods_only() -> None:
    result = run("local", *DRA)

    role = k8s_object(result, "ClusterRole", "rdma-dra-driver")
    assert role["rules"] == [
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceslices"],
            "verbs": ["list", "watch", "create", "update", "delete"],
        },
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
    ]
    binding = k8s_object(result, "ClusterRoleBinding", "rdma-dra-driver")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "rdma-dra-driver", "namespace": "lingjun-rdma"}
    ]


def test_the_device_classes_are_the_drivers_own() -> None:
    result = run("local", *DRA)

    for mode in ("shared", "exclusive"):
        got = k8s_object(result, "DeviceClass", device_class_name(DRA_DRIVER, mode))
        assert got["apiVersion"] == "resource.k8s.io/v1"
        assert got["spec"] == device_class(DRA_DRIVER, mode)["spec"]


@pytest.mark.parametrize(("mode", "count"), [("shared", 1), ("exclusive", 1)])
def test_jobs_ask_through_a_claim_template_of_the_stacks_mode(mode: str, count: int) -> None:
    result = run("local", *DRA, f"rdmaPoolMode={mode}")

    template = k8s_object(result, "ResourceClaimTemplate", "perftest-rdma")
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request == {
        "name": "rdma",
        "exactly": {"deviceClassName": device_class_name(DRA_DRIVER, mode), "count": count},
    }
    job = k8s_object(result, "Job", "perftest")
    pod = job["spec"]["template"]["spec"]
    assert pod["resourceClaims"] == [{"name": "rdma", "resourceClaimTemplateName": "perftest-rdma"}]
    for container in (pod["containers"][0], pod["initContainers"][0]):
        assert container["resources"]["claims"] == [{"name": "rdma"}]
        assert "rdma/hca" not in container["resources"].get("limits", {})


def test_gpus_stay_limits_beside_the_claim() -> None:
    result = run("local", *DRA)

    container = k8s_object(result, "Job", "hps-benchmark")["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert container["resources"] == {
        "limits": {"nvidia.com/gpu": "8"},
        "claims": [{"name": "rdma"}],
    }


def test_the_device_plugin_stays_the_default_with_no_dra_object() -> None:
    result = run("local")

    assert _container(result)["command"][:3] == ["python", "-m", "plugin.deviceplugin"]
    assert [d["metadata"]["name"] for d in k8s_objects(result, "DaemonSet")] == [
        "rdma-device-plugin"
    ]
    for kind in ("DeviceClass", "ResourceClaimTemplate", "ClusterRole"):
        assert k8s_objects(result, kind) == []


def _dev_raw(**overrides: str) -> dict[str, str]:
    from infra.stack.files import stack_config

    config, _ = stack_config("dev", [f"{k}={v}" for k, v in overrides.items()])
    return {k.split(":", 1)[1]: v for k, v in config.items() if v != ""}


@pytest.mark.parametrize(
    ("version", "said"),
    [
        (None, "lingjun-rdma:rdmaApi: dra needs lingjun-rdma:kubernetesVersion 1.34 or newer"),
        ("1.33.3-aliyun.1", "dra needs Kubernetes 1.34 or newer (resource.k8s.io/v1), not 1.33"),
    ],
)
def test_preview_refuses_dra_on_a_created_cluster_older_than_1_34(
    version: str | None, said: str
) -> None:
    raw = _dev_raw(rdmaApi="dra")
    raw.pop("kubernetesVersion", None)
    if version is not None:
        raw["kubernetesVersion"] = version

    with pytest.raises(StackConfigError, match=said.replace("(", r"\(").replace(")", r"\)")):
        parse(raw)


def test_dra_on_a_created_cluster_of_1_34_is_taken() -> None:
    raw = _dev_raw(rdmaApi="dra", kubernetesVersion="1.34.1-aliyun.1")

    assert parse(raw).dra


@pytest.mark.parametrize("overrides", [(), DRA], ids=["device-plugin", "dra"])
def test_both_front_ends_may_post_events_on_their_node_and_nothing_more_in_default(
    overrides: tuple[str, ...],
) -> None:
    result = run("local", *overrides)
    agent = "rdma-dra-driver" if overrides else "rdma-device-plugin"  # named after what it runs

    role = k8s_object(result, "Role", agent)
    assert role["metadata"]["namespace"] == launch.EVENT_NAMESPACE
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}
    ]
    binding = k8s_object(result, "RoleBinding", agent)
    assert binding["metadata"]["namespace"] == launch.EVENT_NAMESPACE
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": agent, "namespace": "lingjun-rdma"}
    ]
    pod = k8s_object(result, "DaemonSet", agent)["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True
    (env,) = pod["containers"][0]["env"]
    assert env["name"] == launch.NODE_NAME_ENV


@pytest.mark.parametrize(("mode", "policies"), [((), ["events"]), (DRA, ["events", "slices"])])
def test_admission_holds_the_agents_writes_to_its_own_node(
    mode: tuple[str, ...], policies: list[str]
) -> None:
    """RBAC lets the agent write every node's slices and Events; a policy bound to Deny admits
    its writes only about the node its token names (proven on the real API server in e2e)."""
    result = run("local", *mode)
    agent = "rdma-dra-driver" if mode else "rdma-device-plugin"

    for what in policies:
        name = f"{agent}-own-node-{what}"
        policy = k8s_object(result, "ValidatingAdmissionPolicy", name)
        spec = policy["spec"]
        assert spec["failurePolicy"] == "Fail"
        assert spec["matchConditions"] == [{
            "name": "the-rdma-agent",
            "expression": "request.userInfo.username == "
                          f"'system:serviceaccount:lingjun-rdma:{agent}'",
        }]  # fmt: skip
        (rule,) = spec["matchConstraints"]["resourceRules"]
        assert rule["apiVersions"] == ["*"]  # resource.k8s.io/v1 too
        binding = k8s_object(result, "ValidatingAdmissionPolicyBinding", name)
        assert binding["spec"] == {"policyName": name, "validationActions": ["Deny"]}
    names = {o["metadata"]["name"] for o in k8s_objects(result, "ValidatingAdmissionPolicy")}
    assert names == {f"{agent}-own-node-{what}" for what in policies}
