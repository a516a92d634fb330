"""Every render is `kubectl apply -k`-able: the rendered kustomization of the local stack, in
both modes, accepted whole by the real API server (a server-side dry run: every object
validated and admitted as it would be created; the namespace made first, as a dry run makes
nothing the objects in it could be checked in)."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.e2e.cluster import Cluster
from tests.e2e.node import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.mark.parametrize("api", ["devicePlugin", "dra"])
def test_a_render_is_applied_whole_by_kubectl_apply_k(cluster: Cluster, api: str) -> None:
    out = cluster.root / f"rendered-kustomize-{api}"
    subprocess.run(
        [str(REPO / ".venv/bin/python"), "-m", "infra.commands.render", "--stack", "local",
         "--out", str(out), "--set", f"rdmaApi={api}"],
        cwd=REPO, check=True, timeout=300,
    )  # fmt: skip
    listed = (out / "kustomization.yaml").read_text()
    cluster.kubectl("create", "namespace", "lingjun-rdma", "--save-config")
    try:
        done = subprocess.run(
            [str(cluster.peers.kubectl), f"--kubeconfig={cluster.kubeconfig}", "apply", "-k",
             str(out), "--dry-run=server"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    finally:
        cluster.kubectl("delete", "namespace", "lingjun-rdma", "--wait=true")

    assert done.returncode == 0, done.stderr
    assert not re.search(r"(?i)warning|error", done.stderr), done.stderr
    objects = [n for n in listed.splitlines() if n.startswith("- ")]
    assert objects
    applied = [line for line in done.stdout.splitlines() if "(server dry run)" in line]
    assert len(applied) == len(objects)
