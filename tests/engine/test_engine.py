"""The real Pulumi engine (CLI v3.277.0 + pulumi-resource-kubernetes v4.25.0, built from the Go
module proxy) runs the project's own program, Pulumi.yaml and stack files, through the Automation
API (`infra.commands.deploy`), against the e2e harness's real cluster: kube-apiserver,
controller-manager, scheduler, kubelet and containerd v1.34.

The `local` stack is deployed, changed and destroyed in the order of the tests below (each one
starts from what the previous one left); the cloud stacks are previewed as far as the engine goes
without an Alibaba Cloud provider.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pulumi import automation as auto

from infra.stack.keys import PROJECT_DIR
from tests.e2e.cluster import BUSYBOX_IMAGE, NODE, Cluster
from tests.e2e.kube import Api, ApiError
from tests.e2e.scenario import node_resource, wait_allocatable
from tests.engine.stacks import (
    KEY,
    NAMESPACE,
    PLUGIN,
    OpenStack,
    assert_perftest_pod_got_the_fixture_devices,
    for_this_cluster,
    get,
    plugin_pods,
    set_config,
    set_list,
    up,
)

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

CLOUD_STACKS = ("dev", "staging", "prod")


def _daemonset(api: Api) -> dict[str, Any]:
    return get(api, f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/{PLUGIN}")


def _changes(stack: auto.Stack) -> dict[str, int]:
    """What a preview would do, by operation ("same", "update", "replace", ...)."""
    return {str(op): n for op, n in stack.preview().change_summary.items()}


@pytest.fixture(scope="module")
def local(open_engine_stack: OpenStack, cluster: Cluster, image: str) -> Iterator[auto.Stack]:
    """The committed local stack with what this cluster needs: its kubeconfig (a secret: it
    holds a token) and images the node has (nothing is pulled here)."""
    stack = open_engine_stack("local")
    for_this_cluster(stack, cluster, image)
    yield stack
    if stack.export_stack().deployment.get("resources"):  # a test failed midway
        stack.destroy(on_output=print)


def _deploy(
    action: str, stack: str, workspace: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """`python -m infra.commands.deploy` as a user runs it (`make deploy`), the built CLI on
    PATH. Every run that is to fail goes through it: when the engine stops a program midway, the
    SDK's inline program server leaves the program's event loop and sockets behind, which must not
    outlive a process of their own."""
    return subprocess.run(
        [sys.executable, "-m", "infra.commands.deploy", action, "--stack", stack,
         "--project-dir", str(workspace)],
        cwd=PROJECT_DIR, env={**os.environ, **env}, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip


def _failed(action: str, stack: str, workspace: Path, env: dict[str, str]) -> tuple[str, float]:
    """A `_deploy` that must fail with the engine's exit 1: its output, and how long it took."""
    t0 = time.monotonic()
    done = _deploy(action, stack, workspace, env)
    took = time.monotonic() - t0
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-3000:]
    return output, took


@pytest.mark.parametrize("name", CLOUD_STACKS)
def test_the_cli_accepts_every_cloud_stack_as_committed(
    workspace: Path, engine_env: dict[str, str], name: str
) -> None:
    """Nothing set: the CLI validates the stack file against Pulumi.yaml, the program's config
    check passes, and the engine stops only at the Alibaba Cloud provider it cannot load here."""
    output, _ = _failed("preview", name, workspace, engine_env)

    assert "validating stack config" not in output
    assert "StackConfigError" not in output
    assert "no resource plugin 'pulumi-resource-alicloud' found" in output, output[-3000:]
    # a new stack: `pulumi stack init` wrote its salt into the user's file, which is said
    assert f"deploy: the Pulumi CLI rewrote {workspace}/stacks/Pulumi.{name}.yaml as it " in (
        output
    )
    assert "encryptionsalt: " in (workspace / "stacks" / f"Pulumi.{name}.yaml").read_text()


def test_a_plain_text_kubeconfig_with_a_token_is_refused_before_the_engine_runs(
    open_engine_stack: OpenStack, workspace: Path, engine_env: dict[str, str], cluster: Cluster
) -> None:
    stacks = workspace / "stacks"
    (stacks / "Pulumi.local-plaintext.yaml").write_text((stacks / "Pulumi.local.yaml").read_text())
    set_config(open_engine_stack("local-plaintext"), "kubeconfig", cluster.kubeconfig.read_text())

    done = _deploy("preview", "local-plaintext", workspace, engine_env)

    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stderr.startswith(
        "deploy: lingjun-rdma:kubeconfig: holds what may be a credential (users[0].user.token)"
    )
    assert "pulumi config set --secret lingjun-rdma:kubeconfig" in done.stderr
    assert not done.stdout  # read as render reads it: no engine ran
    assert "Traceback" not in done.stderr


def test_a_secret_the_program_refuses_under_the_engine_is_said_without_a_traceback(
    open_engine_stack: OpenStack, workspace: Path, engine_env: dict[str, str]
) -> None:
    """Encrypted, only the CLI can read it: the program's refusal there is its line."""
    stacks = workspace / "stacks"
    (stacks / "Pulumi.local-badsecret.yaml").write_text((stacks / "Pulumi.local.yaml").read_text())
    stack = open_engine_stack("local-badsecret")
    set_config(stack, "kubeconfig", "not: [a, kubeconfig]", secret=True)

    output, _ = _failed("preview", "local-badsecret", workspace, engine_env)

    assert "lingjun-rdma:kubeconfig: " in output
    assert "Traceback" not in output
    assert "StackConfigError" not in output
    assert "kubernetes:core/v1:Namespace" not in output  # nothing planned


@pytest.mark.usefixtures("lingjun_node", "host_infiniband", "node_sysfs")
def test_up_runs_the_plugin_on_the_node_and_a_sample_jobs_pod_gets_its_devices(
    local: auto.Stack, api: Api, cluster: Cluster
) -> None:
    result, took = up(local)
    print(f"engine: first up: {took:.1f} s, {dict(result.summary.resource_changes or {})}")

    assert result.summary.result == "succeeded"
    # the DaemonSet controller made the pod, the scheduler bound it to the node
    (pod,) = plugin_pods(api)
    assert pod["spec"]["nodeName"] == NODE
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "DaemonSet"
    assert pod["status"]["phase"] == "Running"
    wait_allocatable(api, "1k")
    assert result.outputs["pluginDaemonSet"].value == PLUGIN
    assert result.outputs["kubeconfig"].secret is True

    # perftest: pod 0 is scheduled and admitted; its init container, which asks the same
    # resource, gets the devices Allocate named and runs the GID resolver.
    assert_perftest_pod_got_the_fixture_devices(api, cluster)


@pytest.mark.usefixtures("lingjun_node", "host_infiniband", "node_sysfs")
def test_a_second_up_changes_nothing(local: auto.Stack) -> None:
    assert set(_changes(local)) == {"same"}

    result = local.up(expect_no_changes=True)

    assert set(result.summary.resource_changes or {}) == {"same"}


@pytest.mark.usefixtures("lingjun_node", "host_infiniband", "node_sysfs")
def test_a_plugin_config_change_rolls_the_daemonset_in_place(local: auto.Stack, api: Api) -> None:
    before = _daemonset(api)
    (old_pod,) = plugin_pods(api)
    set_config(local, "rdmaMaxAllocations", "500")

    changes = _changes(local)
    result, took = up(local)
    print(f"engine: config change: preview {changes}, up {took:.1f} s")

    assert set(changes) == {"same", "update"}  # no replace
    assert changes["update"] == 2  # the ConfigMap and the DaemonSet
    after = _daemonset(api)
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["metadata"]["generation"] == before["metadata"]["generation"] + 1
    # `pulumi up` returned once the rollout was done: the new pod is the only one, and ready
    assert after["status"]["updatedNumberScheduled"] == 1
    assert after["status"]["numberReady"] == 1
    (new_pod,) = plugin_pods(api)
    assert new_pod["metadata"]["uid"] != old_pod["metadata"]["uid"]
    wait_allocatable(api, "500")
    assert result.summary.result == "succeeded"


@pytest.mark.usefixtures("lingjun_node", "host_infiniband", "node_sysfs")
def test_a_job_that_never_finishes_fails_at_its_deadline(
    local: auto.Stack, api: Api, workspace: Path, engine_env: dict[str, str]
) -> None:
    # 8 GPUs: no node has one, so its pod never starts and the Job never finishes
    set_list(local, "sampleJobs", ["hps-benchmark"])
    local.remove_config(f"{KEY}:perftestImage")  # a sample not enabled: its image is refused
    set_config(local, "hpsBenchmarkImage", BUSYBOX_IMAGE)
    set_config(local, "jobAwaitTimeout", "20s")

    output, took = _failed("up", "local", workspace, engine_env)
    print(f"engine: up with a 20 s Job deadline failed after {took:.1f} s")

    assert "hps-benchmark" in output
    job = get(api, f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs/hps-benchmark")
    assert job["spec"]["activeDeadlineSeconds"] == 20
    failed = [c for c in job["status"]["conditions"] if c["type"] == "Failed"]
    assert [c["reason"] for c in failed] == ["DeadlineExceeded"]


@pytest.mark.usefixtures("lingjun_node", "host_infiniband", "node_sysfs")
def test_the_daemonset_await_ends_at_plugin_await_timeout(
    local: auto.Stack, workspace: Path, engine_env: dict[str, str]
) -> None:
    set_list(local, "sampleJobs", [])
    for unused in ("hpsBenchmarkImage", "jobAwaitTimeout"):  # refused without their Job
        local.remove_config(f"{KEY}:{unused}")
    set_config(local, "pluginImage", "localhost/lingjun-rdma-plugin:absent")
    set_config(local, "pluginAwaitTimeout", "20s")

    output, took = _failed("up", "local", workspace, engine_env)
    print(f"engine: up of an image that cannot be pulled, 20 s await: failed after {took:.1f} s")

    assert f'"{NAMESPACE}/{PLUGIN}" failed to fully initialize' in output, output[-3000:]
    # not a speed check: unbounded, the provider would wait its default 10 minutes
    assert took < 300


@pytest.mark.usefixtures("lingjun_node", "host_infiniband", "node_sysfs")
def test_destroy_leaves_nothing_of_the_stack(local: auto.Stack, api: Api) -> None:
    local.destroy(on_output=print)

    assert not local.export_stack().deployment.get("resources")
    with pytest.raises(ApiError) as caught:
        get(api, f"/api/v1/namespaces/{NAMESPACE}")
    assert caught.value.status == 404
    pods = get(api, "/api/v1/pods")["items"]
    assert [p["metadata"]["name"] for p in pods if p["metadata"]["namespace"] == NAMESPACE] == []
    # the kubelet lost the plugin with its pod: nothing left to allocate
    wait_allocatable(api, "0")
    assert node_resource(api)[1] == "0"
