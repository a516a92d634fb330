"""Prometheus metrics and the /healthz + /metrics HTTP endpoint (one port, asyncio)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

logger = logging.getLogger(__name__)


class Metrics:
    """The plugin's registry; one instance per process, passed to whoever records."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.devices = Gauge(
            "rdma_plugin_devices",
            "Device IDs advertised, by health",
            ["resource", "health"],
            registry=r,
        )
        self.hcas = Gauge("rdma_plugin_hcas", "HCAs behind each pool", ["resource"], registry=r)
        self.allocations = Counter(
            "rdma_plugin_allocations", "Successful Allocate calls", ["resource"], registry=r
        )
        self.registrations = Counter(
            "rdma_plugin_registrations",
            "Register calls to the kubelet",
            ["resource", "result"],
            registry=r,
        )
        self.errors = Counter("rdma_plugin_errors", "Errors by kind", ["kind"], registry=r)
        self.last_scan = Gauge(
            "rdma_plugin_last_scan_timestamp_seconds", "Unix time of the last scan", registry=r
        )
        self.scans = Counter("rdma_plugin_scans", "Scans by trigger", ["trigger"], registry=r)
        self.non_host_network_ready = Gauge(
            "rdma_plugin_non_host_network_ready",
            "1 when non-hostNetwork pods can use RDMA here (IPv6 RoCE v2 GIDs, shared netns "
            "mode); 0 when not; absent when nonHostNetwork is off",
            registry=r,
        )
        self.pool_conflicts = Gauge(
            "rdma_plugin_pool_conflicts", "HCAs claimed by more than one pool", registry=r
        )
        self.problems = Gauge(
            "rdma_plugin_problems",
            "Problems the last scan found (each logged at error when the set changes): pools "
            "matching nothing, no RDMA device, unhealthy HCAs, unreadable files, conflicts",
            registry=r,
        )


async def serve_http(
    host: str, port: int, metrics: Metrics, healthy: Callable[[], bool]
) -> asyncio.Server:
    """GET /metrics and GET /healthz (200 while the plugin serves its sockets, else 503)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
            path = request.split(b" ", 2)[1].decode() if request.count(b" ") >= 2 else ""
            if path == "/metrics":
                status, ctype, body = (
                    "200 OK",
                    CONTENT_TYPE_LATEST,
                    generate_latest(metrics.registry),
                )
            elif path == "/healthz":
                ok = healthy()
                status = "200 OK" if ok else "503 Service Unavailable"
                ctype, body = "text/plain", b"ok\n" if ok else b"not serving\n"
            else:
                status, ctype, body = "404 Not Found", "text/plain", b"try /metrics or /healthz\n"
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (TimeoutError, OSError, asyncio.IncompleteReadError, IndexError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, host or None, port)
    logger.info("metrics and /healthz on %s:%d", host, port)
    return server
