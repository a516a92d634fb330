"""Plain HTTPS to the API server and gRPC to the kubelet's pod-resources socket."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import grpc

from tests.e2e.podresources import api_pb2, api_pb2_grpc

Obj = dict[str, Any]


class ApiError(RuntimeError):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status


class Api:
    """The few API calls the scenarios need, with a static bearer token."""

    def __init__(self, base: str, token: str, headers: dict[str, str] | None = None) -> None:
        self.base = base
        self.token = token
        self.headers = headers or {}
        # the API server's certificate is self-signed for this run only
        self.ctx = ssl.create_default_context()
        self.ctx.check_hostname = False
        self.ctx.verify_mode = ssl.CERT_NONE

    def call(self, method: str, path: str, body: Obj | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("Content-Type", "application/json")
        for name, value in self.headers.items():
            req.add_header(name, value)
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=30) as resp:
                text = resp.read().decode()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            exc.close()
            raise ApiError(exc.code, detail) from None
        ctype = resp.headers.get("Content-Type", "")
        return json.loads(text) if ctype.startswith("application/json") else text

    def impersonating(self, user: str, extra: dict[str, str]) -> Api:
        """The same API as `user` with these extra values (its token's claims), as the admin's
        impersonation makes them: what the server's authorization and admission then see."""
        headers = {"Impersonate-User": user}
        headers |= {f"Impersonate-Extra-{quote(k, safe='')}": v for k, v in extra.items()}
        return Api(self.base, self.token, headers)

    def get(self, path: str) -> Any:
        return self.call("GET", path)

    def node(self, name: str) -> Obj:
        return self.get(f"/api/v1/nodes/{name}")

    def pod(self, name: str, ns: str = "default") -> Obj:
        return self.get(f"/api/v1/namespaces/{ns}/pods/{name}")

    def create_pod(self, pod: Obj, ns: str = "default") -> Obj:
        return self.call("POST", f"/api/v1/namespaces/{ns}/pods", pod)

    def delete_pod(self, name: str, ns: str = "default") -> None:
        try:
            self.call("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}", {"gracePeriodSeconds": 0})
        except ApiError as exc:
            if exc.status != 404:
                raise

    def pod_log(self, name: str, ns: str = "default") -> str:
        # served by the API server proxying to the kubelet's /containerLogs
        return str(self.get(f"/api/v1/namespaces/{ns}/pods/{name}/log"))


def pod_gone(api: Api, name: str, ns: str = "default") -> bool:
    try:
        api.pod(name, ns)
    except ApiError as exc:
        return exc.status == 404
    return False


def extended(node: Obj, resource: str) -> tuple[str | None, str | None]:
    """(capacity, allocatable) of `resource` as the Node object reports them."""
    status = node.get("status", {})
    return status.get("capacity", {}).get(resource), status.get("allocatable", {}).get(resource)


@contextmanager
def pod_resources(socket: Path) -> Iterator[api_pb2_grpc.PodResourcesListerStub]:
    # the kubelet's gRPC server rejects the default authority grpc derives from a unix path
    options = [("grpc.default_authority", "localhost")]
    with grpc.insecure_channel(f"unix://{socket}", options=options) as channel:
        yield api_pb2_grpc.PodResourcesListerStub(channel)


def allocatable_ids(socket: Path, resource: str) -> dict[str, list[int]]:
    """Device IDs of `resource` the kubelet can allocate, each with its NUMA nodes."""
    with pod_resources(socket) as stub:
        resp = stub.GetAllocatableResources(api_pb2.AllocatableResourcesRequest(), timeout=10)
    return _by_id(d for d in resp.devices if d.resource_name == resource)


def pod_names(socket: Path, ns: str = "default") -> set[str]:
    """Pods the kubelet reports in pod-resources."""
    with pod_resources(socket) as stub:
        resp = stub.List(api_pb2.ListPodResourcesRequest(), timeout=10)
    return {p.name for p in resp.pod_resources if p.namespace == ns}


def pod_devices(socket: Path, pod: str, ns: str = "default") -> dict[str, list[int]]:
    """Device IDs the kubelet assigned to `pod` (all containers), each with its NUMA nodes."""
    with pod_resources(socket) as stub:
        resp = stub.List(api_pb2.ListPodResourcesRequest(), timeout=10)
    return _by_id(
        d
        for p in resp.pod_resources
        if p.name == pod and p.namespace == ns
        for c in p.containers
        for d in c.devices
    )


def _by_id(devices: Iterable[api_pb2.ContainerDevices]) -> dict[str, list[int]]:
    """The kubelet answers one entry per (NUMA node, IDs on it): an ID on two nodes is listed
    twice. Merge them back: each ID with all of its nodes."""
    nodes: dict[str, set[int]] = {}
    for d in devices:
        for i in d.device_ids:
            nodes.setdefault(i, set()).update(n.ID for n in d.topology.nodes)
    return {i: sorted(n) for i, n in nodes.items()}
