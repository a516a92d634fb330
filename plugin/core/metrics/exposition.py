"""Prometheus metrics and the /healthz + /metrics HTTP endpoint (one port, asyncio)."""

from __future__ import annotations

import asyncio
import errno
import logging
import math
import socket
from collections.abc import Callable, Mapping
from typing import Literal

from common.terminal import host_port

logger = logging.getLogger(__name__)

# The Prometheus text exposition format, version 0.0.4, written here: ten families of counters and
# gauges do not need a client library's import at every start.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _Sample:
    def __init__(
        self, values: dict[tuple[str, ...], float], key: tuple[str, ...], *, counter: bool
    ) -> None:
        self._values, self._key, self._counter = values, key, counter

    def inc(self, amount: float = 1.0) -> None:
        if self._counter and amount < 0:
            raise ValueError(f"a counter only goes up (got {amount})")
        self._values[self._key] = self._values.get(self._key, 0.0) + amount

    def set(self, value: float) -> None:
        self._values[self._key] = float(value)


class MetricFamily:
    """One metric family; a labelled sample appears once it is first recorded."""

    def __init__(
        self, name: str, help_text: str, kind: Literal["counter", "gauge"], labels: tuple[str, ...]
    ) -> None:
        self.name, self.help, self.kind, self.label_names = name, help_text, kind, labels
        self._values: dict[tuple[str, ...], float] = {}

    def labels(self, *values: str, **named: str) -> _Sample:
        """By position or by name, every label exactly once."""
        if (values and named) or (named and set(named) != set(self.label_names)):
            raise ValueError(f"{self.name}: labels {self.label_names}, got {values} {named}")
        key = values or tuple(named[n] for n in self.label_names)
        if len(key) != len(self.label_names):
            raise ValueError(f"{self.name}: labels {self.label_names}, got {key}")
        return _Sample(self._values, key, counter=self.kind == "counter")

    def inc(self, amount: float = 1.0) -> None:
        self.labels().inc(amount)

    def clear(self) -> None:
        """Forget every sample (a gauge whose label set is redrawn at each scan)."""
        self._values.clear()

    def set(self, value: float) -> None:
        self.labels().set(value)

    def render(self) -> str:
        sample = self.name + ("_total" if self.kind == "counter" else "")
        help_text = self.help.replace("\\", "\\\\").replace("\n", "\\n")
        lines = [f"# HELP {sample} {help_text}", f"# TYPE {sample} {self.kind}"]
        for key, value in sorted(self._values.items()):
            pairs = sorted(zip(self.label_names, key, strict=True))
            labels = ",".join(f'{n}="{_escape(v)}"' for n, v in pairs)
            lines.append(
                f"{sample}{{{labels}}} {_number(value)}" if labels else f"{sample} {_number(value)}"
            )
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


Collector = Callable[[], list["MetricFamily"]]
# How long a scrape waits for the host's counters (Prometheus's default scrape_timeout is 10 s).
READ_TIMEOUT = 5.0
# A request's line and headers at most (a scrape's are a few hundred bytes).
_REQUEST_MAX = 64 * 1024


class Metrics:
    """The plugin's metrics; one instance per process, passed to whoever records."""

    def __init__(self, read_timeout: float = READ_TIMEOUT) -> None:
        self._families: list[MetricFamily] = []
        # families made fresh at each scrape: of the process's own state, and read from the
        # host (the port counters from sysfs, the QPs from netlink)
        self._collectors: list[Collector] = []
        self._readers: list[Collector] = []
        self._reading: asyncio.Future[list[MetricFamily]] | None = None
        self.read_timeout = read_timeout
        self.devices = self._family(
            "rdma_plugin_devices", "Device IDs advertised, by health", "gauge", "resource", "health"
        )
        self.hcas = self._family("rdma_plugin_hcas", "HCAs behind each pool", "gauge", "resource")
        self.hca_healthy = self._family(
            "rdma_plugin_hca_healthy",
            "1 when the HCA's ports are up and readable, 0 when it is left out of allocations",
            "gauge",
            "resource",
            "hca",
        )
        self.allocations = self._family(
            "rdma_plugin_allocations", "Successful Allocate calls", "counter", "resource"
        )
        self.registrations = self._family(
            "rdma_plugin_registrations",
            "Register calls to the kubelet",
            "counter",
            "resource",
            "result",
        )
        self.errors = self._family("rdma_plugin_errors", "Errors by kind", "counter", "kind")
        self.last_scan = self._family(
            "rdma_plugin_last_scan_timestamp_seconds", "Unix time of the last scan", "gauge"
        )
        self.scans = self._family("rdma_plugin_scans", "Scans by trigger", "counter", "trigger")
        self.non_host_network_ready = self._family(
            "rdma_plugin_non_host_network_ready",
            "1 when non-hostNetwork pods can use RDMA here (IPv6 RoCE v2 GIDs, shared netns "
            "mode); 0 when not; absent when nonHostNetwork is off",
            "gauge",
        )
        self.pool_conflicts = self._family(
            "rdma_plugin_pool_conflicts", "HCAs claimed by more than one pool", "gauge"
        )
        self.problems = self._family(
            "rdma_plugin_problems",
            "Problems the last scan found (each logged at error when the set changes): pools "
            "matching nothing, no RDMA device, unhealthy HCAs, unreadable files, conflicts",
            "gauge",
        )
        # present from the start, so that an alert on a scan that never succeeds can fire
        for gauge in (self.last_scan, self.pool_conflicts, self.problems):
            gauge.set(0)

    def _family(
        self, name: str, help_text: str, kind: Literal["counter", "gauge"], *labels: str
    ) -> MetricFamily:
        family = MetricFamily(name, help_text, kind, labels)
        self._families.append(family)
        return family

    def collect(self, collector: Collector, *, reads_host: bool = False) -> None:
        """Render `collector`'s families too, asking it at each scrape. One that `reads_host`
        is asked off the event loop by `scrape`: a wedged driver can hold a read of its
        counters (a firmware command on mlx5) for seconds, and the kubelet's calls must not
        wait for it."""
        (self._readers if reads_host else self._collectors).append(collector)

    def registration(self, state: Callable[[], Mapping[str, bool]]) -> None:
        """rdma_plugin_registered: 1 while the kubelet holds the registration of a resource (or
        DRA driver), read from `state` at each scrape, so it is never stale."""

        def collect() -> list[MetricFamily]:
            family = MetricFamily(
                "rdma_plugin_registered",
                "1 while the kubelet holds this resource's (or DRA driver's) registration",
                "gauge",
                ("resource",),
            )
            for name, registered in state().items():
                family.labels(name).set(1 if registered else 0)
            return [family]

        self.collect(collect)

    def render(self) -> bytes:
        """Every family, each collector asked on this thread."""
        return self._text(_asked(self._collectors) + _asked(self._readers))

    async def scrape(self) -> bytes:
        """Every family, the host's read in one thread at most (a read still running from an
        earlier scrape is waited for, not doubled), for at most `read_timeout` seconds: past
        that, this scrape has the process's own families only."""
        fresh = _asked(self._collectors)
        if self._readers:
            if self._reading is None or self._reading.done():
                self._reading = asyncio.ensure_future(asyncio.to_thread(_asked, self._readers))
            try:
                fresh += await asyncio.wait_for(asyncio.shield(self._reading), self.read_timeout)
            except TimeoutError:
                logger.warning(
                    "/metrics: reading the host's counters took over %gs (a hung driver?): "
                    "left out of this scrape",
                    self.read_timeout,
                )
        return self._text(fresh)

    def _text(self, fresh: list[MetricFamily]) -> bytes:
        text = "".join(f.render() for f in [*self._families, *fresh])
        # label values come from sysfs names, which need not be UTF-8 (surrogate escapes)
        return text.encode("utf-8", "replace")


def _asked(collectors: list[Collector]) -> list[MetricFamily]:
    fresh: list[MetricFamily] = []
    for collector in collectors:
        try:
            fresh += collector()
        except Exception:  # what the host shows is read here: a surprise costs its families
            logger.exception("/metrics: a collector failed; its families are left out")
    return fresh


async def serve_http(
    host: str, port: int, metrics: Metrics, healthy: Callable[[], bool]
) -> asyncio.Server:
    """GET /metrics and GET /healthz (200 while the plugin serves its sockets, else 503)."""

    async def answer(request: bytes) -> tuple[str, str, bytes]:
        # bytes compared as bytes: a path that is not UTF-8 is just not one of ours; a query
        # (a scrape config's params) does not change what is asked
        rest = request.partition(b" ")[2]
        path = rest.split(b" ", 1)[0].split(b"?", 1)[0] if b" " in rest else b""
        if path == b"/metrics":
            return "200 OK", CONTENT_TYPE, await metrics.scrape()
        if path == b"/healthz":
            ok = healthy()
            return (
                "200 OK" if ok else "503 Service Unavailable",
                "text/plain",
                b"ok\n" if ok else b"not serving\n",
            )
        return "404 Not Found", "text/plain", b"try /metrics or /healthz\n"

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                async with asyncio.timeout(5):
                    request = await reader.readuntil(b"\r\n\r\n")
                status, ctype, body = await answer(request)
                method = request.partition(b" ")[0]
            except asyncio.LimitOverrunError:  # answered, not dropped: the scraper says why
                method, status, ctype = b"GET", "431 Request Header Fields Too Large", "text/plain"
                body = f"a request's line and headers: {_REQUEST_MAX >> 10} KiB at most\n".encode()
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n".encode()
                + (b"" if method == b"HEAD" else body)  # HEAD: what GET would say, no body
            )
            await writer.drain()
        except (TimeoutError, OSError, asyncio.IncompleteReadError):
            pass  # a slow or broken request, or a scraper gone, gets no answer
        finally:
            writer.close()

    server = await asyncio.start_server(handle, host or None, port, limit=_REQUEST_MAX)
    bound = ", ".join(host_port(*s.getsockname()[:2]) for s in server.sockets)
    logger.info("metrics and /healthz on %s", bound)  # the port the kernel chose for :0
    return server


def listen_problem(exc: Exception, port: int) -> str:
    """Why --metrics-address cannot be listened on, in words, without its host (a slip there
    can be anything, a password typed into the wrong flag)."""
    if isinstance(exc, socket.gaierror):
        return "its host does not resolve here: give an IP address of this node, or its name"
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        return f"port {port} is in use (another instance, or another program): pick a free port"
    if isinstance(exc, OSError) and exc.errno == errno.EADDRNOTAVAIL:
        return "its host is not an address of this node: give one of this node's addresses"
    return f"cannot listen there ({exc.strerror if isinstance(exc, OSError) else exc})"
