"""Our /metrics text, read back by prometheus_client's own parser (the format's reference)."""

from __future__ import annotations

import asyncio
import threading

import pytest
from prometheus_client.parser import text_string_to_metric_families

from plugin.core.metrics.exposition import MetricFamily, Metrics, serve_http


def _samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
    }


def test_what_is_recorded_is_what_a_prometheus_parser_reads() -> None:
    m = Metrics()
    m.devices.labels("rdma/hca", "Healthy").set(1000)
    m.registrations.labels("rdma/hca", "ok").inc()
    m.registrations.labels(resource="rdma/hca", result="ok").inc()
    m.errors.labels(kind='odd "kind"\\\n').inc(2)
    m.problems.set(3)

    assert _samples(m) == {
        ("rdma_plugin_devices", (("health", "Healthy"), ("resource", "rdma/hca"))): 1000.0,
        ("rdma_plugin_registrations_total", (("resource", "rdma/hca"), ("result", "ok"))): 2.0,
        ("rdma_plugin_errors_total", (("kind", 'odd "kind"\\\n'),)): 2.0,
        ("rdma_plugin_problems", ()): 3.0,
        ("rdma_plugin_last_scan_timestamp_seconds", ()): 0.0,
        ("rdma_plugin_pool_conflicts", ()): 0.0,
    }


def test_every_family_is_declared_with_its_type_before_any_sample() -> None:
    families = {f.name: f.type for f in text_string_to_metric_families(Metrics().render().decode())}

    assert families["rdma_plugin_allocations"] == "counter"
    assert families["rdma_plugin_non_host_network_ready"] == "gauge"
    assert len(families) == 11


@pytest.mark.parametrize(
    ("values", "named"),
    [(("rdma/hca",), {}), ((), {"resource": "rdma/hca"}), (("rdma/hca",), {"health": "x"}),
     ((), {"resource": "rdma/hca", "health": "x", "extra": "y"})],
)  # fmt: skip
def test_a_sample_with_the_wrong_labels_is_refused(
    values: tuple[str, ...], named: dict[str, str]
) -> None:
    with pytest.raises(ValueError, match="rdma_plugin_devices"):
        Metrics().devices.labels(*values, **named)


def test_a_counter_only_goes_up() -> None:
    with pytest.raises(ValueError, match="only goes up"):
        Metrics().errors.labels("scan").inc(-1)


def test_the_scan_gauges_exist_before_any_scan_and_the_network_one_does_not() -> None:
    samples = _samples(Metrics())

    assert samples == {
        ("rdma_plugin_last_scan_timestamp_seconds", ()): 0.0,
        ("rdma_plugin_pool_conflicts", ()): 0.0,
        ("rdma_plugin_problems", ()): 0.0,
    }


def test_a_collector_that_fails_costs_its_families_only(caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics()

    def broken() -> list[MetricFamily]:
        raise OSError("the host changed under it")

    metrics.collect(broken)
    families = {f.name for f in text_string_to_metric_families(metrics.render().decode())}

    assert "rdma_plugin_problems" in families
    assert "a collector failed" in caplog.text


async def _ask(request: bytes) -> bytes:
    server = await serve_http("127.0.0.1", 0, Metrics(), lambda: True)
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        answer = await reader.read()
        writer.close()
        return answer
    finally:
        server.close()


async def test_a_scrape_with_a_query_string_is_a_scrape() -> None:
    answer = await _ask(b"GET /metrics?module=rdma HTTP/1.1\r\nHost: x\r\n\r\n")

    assert answer.startswith(b"HTTP/1.1 200 OK")
    assert b"rdma_plugin_problems 0.0" in answer


async def test_head_says_what_get_would_without_a_body() -> None:
    answer = await _ask(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")

    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0]) > 0
    assert body == b""


async def test_a_hung_host_read_costs_its_families_only_and_is_never_doubled() -> None:
    release = threading.Event()
    asked: list[int] = []

    def hung_driver() -> list[MetricFamily]:  # a counter read held by wedged firmware
        asked.append(1)
        release.wait(30)
        family = MetricFamily("rdma_port_x", "x", "gauge", ())
        family.set(1)
        return [family]

    metrics = Metrics(read_timeout=0.2)
    metrics.collect(hung_driver, reads_host=True)
    metrics.problems.set(2)
    loop_ticks = 0

    async def tick() -> None:  # the event loop stays free for the kubelet's calls meanwhile
        nonlocal loop_ticks
        while True:
            loop_ticks += 1
            await asyncio.sleep(0.01)

    ticker = asyncio.create_task(tick())
    first = (await metrics.scrape()).decode()
    second = (await metrics.scrape()).decode()
    reads_while_hung = len(asked)
    release.set()
    for _ in range(100):  # the one read in flight ends; the next scrape starts a fresh one
        third = (await metrics.scrape()).decode()
        if "rdma_port_x" in third:
            break
    ticker.cancel()

    assert "rdma_plugin_problems 2.0" in first
    assert "rdma_plugin_problems 2.0" in second
    assert "rdma_port_x" not in first + second
    assert "rdma_port_x 1.0" in third
    assert reads_while_hung == 1  # the hung read was waited for again, not started twice
    assert loop_ticks > 5


async def test_a_request_over_its_bound_is_answered_431_not_dropped() -> None:
    answer = await _ask(b"GET /metrics?" + b"q" * 70_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")

    assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large")
    assert answer.endswith(b"a request's line and headers: 64 KiB at most\n")


async def test_an_ipv6_listen_address_is_said_in_brackets(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    server = await serve_http("::1", 0, Metrics(), lambda: True)
    port = server.sockets[0].getsockname()[1]
    server.close()

    assert f"metrics and /healthz on [::1]:{port}" in caplog.text
