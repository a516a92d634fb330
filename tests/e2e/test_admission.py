"""The node agent's writes held to its own node by the rendered ValidatingAdmissionPolicies, on
the real API server: as the agent's ServiceAccount with a token naming one node (the admin's
impersonation of its user and claims), writes about that node are admitted, about another
node refused, for ResourceSlices (create, update, delete) and Events alike."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from plugin.launch import DRA_DRIVER, EVENT_NAMESPACE
from tests.e2e.cluster import Cluster
from tests.e2e.kube import Api, ApiError
from tests.e2e.node import REPO
from tests.e2e.procs import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

NAMESPACE = "lingjun-rdma"
AGENT = f"system:serviceaccount:{NAMESPACE}:rdma-dra-driver"  # named after what it runs
NODE_CLAIM = "authentication.kubernetes.io/node-name"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
EVENTS = f"/api/v1/namespaces/{EVENT_NAMESPACE}/events"
# What the agent is given, applied as rendered: its identity, its rights and the policies.
KINDS = ("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
         "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")  # fmt: skip


@pytest.fixture(scope="module")
def applied(cluster: Cluster) -> Iterator[Path]:
    out = cluster.root / "rendered-admission"
    subprocess.run(
        [str(REPO / ".venv/bin/python"), "-m", "infra.commands.render", "--stack", "local",
         "--out", str(out), "--set", "rdmaApi=dra"],
        cwd=REPO, check=True, timeout=300,
    )  # fmt: skip
    objects = [yaml.safe_load(f.read_text()) for f in sorted(out.glob("*.yaml"))]
    wanted = sorted(
        (o for o in objects if o["kind"] in KINDS), key=lambda o: KINDS.index(o["kind"])
    )
    manifest = cluster.root / "admission.yaml"
    manifest.write_text(yaml.safe_dump_all(wanted))
    cluster.kubectl("apply", "-f", str(manifest))
    yield manifest
    cluster.kubectl("delete", "--wait=false", "--ignore-not-found", "-f", str(manifest))


def _slice(name: str, node: str, driver: str = DRA_DRIVER) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {"driver": driver, "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "hca-0"}]},
    }  # fmt: skip


def _event(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": EVENT_NAMESPACE},
        "involvedObject": {"kind": "Node", "name": node, "uid": node},
        "reason": "RdmaHcaGone",
        "message": "a test",
        "type": "Warning",
        "source": {"component": "rdma-dra-driver", "host": node},
    }


def _refused(call: Any) -> str:
    """What the API server said refusing `call` as admission's Deny does (Forbidden)."""
    with pytest.raises(ApiError) as refused:
        call()
    assert refused.value.status == 403, refused.value
    return str(refused.value)


@pytest.fixture
def agent_on_a(api: Api, applied: Path) -> Iterator[Api]:
    """The agent as its pod on node-a would call; node-b's slice made by the admin."""
    api.call("POST", SLICES, _slice("adm-node-b", "node-b"))
    agent = api.impersonating(AGENT, {NODE_CLAIM: "node-a"})
    # a policy is enforced once the API server has compiled it: a write about another node
    # is refused from then on
    eventually(lambda: _admitted_not(agent), 30, "the policies enforced")
    yield agent
    for name in ("adm-node-a", "adm-node-b", "adm-other-driver"):
        with contextlib.suppress(ApiError):
            api.call("DELETE", f"{SLICES}/{name}")


def _admitted_not(agent: Api) -> bool:
    try:
        agent.call("POST", SLICES, _slice("adm-probe", "node-b"))
    except ApiError as exc:
        return exc.status in (403, 422)
    agent.call("DELETE", f"{SLICES}/adm-probe")  # not yet: undone (the admin cleans up if not)
    return False


def test_the_agent_writes_only_its_own_nodes_slices(api: Api, agent_on_a: Api) -> None:
    said = _refused(lambda: agent_on_a.call("POST", SLICES, _slice("adm-x", "node-b")))
    assert "the RDMA agent on node node-a may write the ResourceSlices of that node only" in said

    mine = agent_on_a.call("POST", SLICES, _slice("adm-node-a", "node-a"))
    mine["spec"]["devices"] = [{"name": "hca-1"}]
    agent_on_a.call("PUT", f"{SLICES}/adm-node-a", mine)

    theirs = api.get(f"{SLICES}/adm-node-b")
    emptied = {**theirs, "spec": {**theirs["spec"], "devices": []}}
    _refused(lambda: agent_on_a.call("PUT", f"{SLICES}/adm-node-b", emptied))
    _refused(lambda: agent_on_a.call("DELETE", f"{SLICES}/adm-node-b"))
    assert api.get(f"{SLICES}/adm-node-b")["spec"]["devices"] == [{"name": "hca-0"}]

    agent_on_a.call("DELETE", f"{SLICES}/adm-node-a")


def test_the_agent_writes_only_its_own_drivers_slices(agent_on_a: Api) -> None:
    said = _refused(
        lambda: agent_on_a.call(
            "POST", SLICES, _slice("adm-other-driver", "node-a", "gpu.example.com")
        )
    )
    assert f"the RDMA agent may write only {DRA_DRIVER}'s ResourceSlices" in said


def test_the_agent_posts_events_about_its_own_node_only(api: Api, agent_on_a: Api) -> None:
    said = _refused(lambda: agent_on_a.call("POST", EVENTS, _event("adm-b", "node-b")))
    assert "the RDMA agent on node node-a may post Events about that Node only" in said

    agent_on_a.call("POST", EVENTS, _event("adm-a", "node-a"))
    api.call("DELETE", f"{EVENTS}/adm-a")


def test_a_token_naming_no_node_is_refused(api: Api, agent_on_a: Api) -> None:
    del agent_on_a  # the policies enforced
    nowhere = api.impersonating(AGENT, {})
    said = _refused(lambda: nowhere.call("POST", SLICES, _slice("adm-x", "node-a")))
    assert "the RDMA agent's token names no node" in said
