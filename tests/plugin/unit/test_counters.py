"""Port counters from a fixture sysfs tree, read back by prometheus_client's parser."""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from plugin.core.metrics.counters import (
    HW_COUNTERS,
    OTHER,
    PORT_COUNTERS,
    STATE_METRIC,
    collect,
)
from plugin.core.metrics.scrape import metrics_for
from plugin.launch import LaunchSpec
from tests.plugin.sysfs_tree import two_mlx5

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _samples(text: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _scrape(sysfs: Path, *, states: bool = False) -> Samples:
    """The counters' samples (and the ports' states, when asked)."""
    got = _samples("".join(f.render() for f in collect(sysfs)))
    return {k: v for k, v in got.items() if states or k[0] != STATE_METRIC}


def test_each_ports_state_is_a_gauge_of_its_number(tmp_path: Path) -> None:
    tree = two_mlx5(tmp_path)
    tree.set_port("mlx5_1", 1, "DOWN")

    got = _scrape(tree.sys, states=True)

    assert got == {
        (STATE_METRIC, (("hca", "mlx5_0"), ("port", "1"))): 4.0,
        (STATE_METRIC, (("hca", "mlx5_1"), ("port", "1"))): 1.0,
    }


def test_a_state_that_is_not_a_port_state_is_left_out(tmp_path: Path) -> None:
    tree = two_mlx5(tmp_path)
    (tree.port_dir("mlx5_0") / "state").write_text("ACTIVE")  # no number
    (tree.port_dir("mlx5_1") / "state").write_text("9: ACTIVE")  # past the field's width

    assert _scrape(tree.sys, states=True) == {}


def test_each_file_is_its_tables_counter_per_hca_and_port(tmp_path: Path) -> None:
    tree = two_mlx5(tmp_path)
    tree.set_counter("mlx5_0", 1, "port_xmit_data", "1000")  # 4-octet words
    tree.set_counter("mlx5_0", 1, "link_downed", "2")
    tree.set_counter("mlx5_1", 1, "port_xmit_data", "5")
    tree.set_counter("mlx5_1", 1, "out_of_buffer", "7", hw=True)
    tree.set_counter("mlx5_1", 1, "np_cnp_sent", "18446744073709551615", hw=True)  # u64 max

    got = _scrape(tree.sys)

    mlx5_0 = (("hca", "mlx5_0"), ("port", "1"))
    mlx5_1 = (("hca", "mlx5_1"), ("port", "1"))
    assert got == {
        ("rdma_port_transmitted_bytes_total", mlx5_0): 4000.0,
        ("rdma_port_link_downed_total", mlx5_0): 2.0,
        ("rdma_port_transmitted_bytes_total", mlx5_1): 20.0,
        ("rdma_port_out_of_buffer_total", mlx5_1): 7.0,
        ("rdma_port_cnp_sent_total", mlx5_1): float(2**64 - 1),
    }


def test_a_driver_counter_the_table_does_not_name_is_kept_under_its_file_name(
    tmp_path: Path,
) -> None:
    tree = two_mlx5(tmp_path)
    tree.set_counter("mlx5_0", 1, "new_fw_counter", "3", hw=True)
    tree.set_counter("mlx5_0", 1, "lifespan", "10", hw=True)  # a setting (ms), not a counter

    got = _scrape(tree.sys)

    labels = (("counter", "new_fw_counter"), ("hca", "mlx5_0"), ("port", "1"))
    assert got == {(OTHER.metric + "_total", labels): 3.0}


def test_a_file_that_cannot_be_read_leaves_out_that_file_only(tmp_path: Path) -> None:
    tree = two_mlx5(tmp_path)
    tree.set_counter("mlx5_0", 1, "port_rcv_data", "not a number")
    tree.set_counter("mlx5_0", 1, "symbol_error", "-1")
    (tree.port_dir("mlx5_0") / "counters" / "port_xmit_data").mkdir()  # EISDIR
    tree.set_counter("mlx5_0", 1, "port_rcv_packets", "9")

    got = _scrape(tree.sys)

    assert got == {("rdma_port_received_packets_total", (("hca", "mlx5_0"), ("port", "1"))): 9.0}


def test_no_rdma_device_is_no_sample(tmp_path: Path) -> None:
    assert _scrape(tmp_path, states=True) == {}


def test_the_table_gives_every_file_its_own_valid_metric() -> None:
    metrics = [c.metric for c in [*PORT_COUNTERS.values(), *HW_COUNTERS.values(), OTHER]]

    assert len(set(metrics)) == len(metrics)
    families = text_string_to_metric_families(
        "".join(f"# TYPE {m}_total counter\n{m}_total 0\n" for m in metrics)
    )
    assert len(list(families)) == len(metrics)


def test_the_switch_turns_the_port_counters_off(tmp_path: Path) -> None:
    tree = two_mlx5(tmp_path)
    tree.set_counter("mlx5_0", 1, "port_rcv_packets", "9")

    on = metrics_for(LaunchSpec(sysfs_root=tree.sys)).render().decode()
    off = metrics_for(LaunchSpec(sysfs_root=tree.sys, port_counters="off")).render().decode()

    assert 'rdma_port_received_packets_total{hca="mlx5_0",port="1"} 9.0' in on
    assert "rdma_port_" not in off
    assert "rdma_plugin_problems" in off


def test_the_metrics_docs_name_every_counter_of_the_table() -> None:
    readme = (Path(__file__).resolve().parents[3] / "docs" / "metrics.md").read_text()

    for name, counter in [*PORT_COUNTERS.items(), *HW_COUNTERS.items()]:
        assert f"`{counter.metric}_total`" in readme, name


def test_a_counter_file_that_is_not_one_u64_in_digits_is_left_out_never_waited_on(
    tmp_path: Path,
) -> None:
    tree = two_mlx5(tmp_path)
    counters = tree.port_dir("mlx5_0") / "counters"
    tree.set_counter("mlx5_0", 1, "port_rcv_packets", "9")
    tree.set_counter("mlx5_0", 1, "unicast_xmit_packets", "1" * 200)
    tree.set_counter("mlx5_0", 1, "multicast_xmit_packets", "1_000")
    tree.set_counter("mlx5_0", 1, "port_xmit_packets", str(2**64))
    tree.set_counter("mlx5_0", 1, "rx_write_requests", "7" * 29, hw=True)
    os.mkfifo(counters / "port_xmit_data")  # opened plainly, it would block the event loop

    got = _scrape(tree.sys)

    assert got == {("rdma_port_received_packets_total", (("hca", "mlx5_0"), ("port", "1"))): 9.0}


def test_names_that_are_not_utf8_still_render_a_scrape(tmp_path: Path) -> None:
    tree = two_mlx5(tmp_path)
    hw = tree.port_dir("mlx5_0") / "hw_counters"
    hw.mkdir(exist_ok=True)
    (hw / os.fsdecode(b"odd\xff")).write_text("5\n")
    port = os.fsdecode(b"mlx5_1/ports/\xfe")
    (tree.sys / "class" / "infiniband" / port / "counters").mkdir(parents=True)
    (tree.sys / "class" / "infiniband" / port / "counters" / "port_rcv_data").write_text("1\n")

    text = metrics_for(LaunchSpec(sysfs_root=tree.sys)).render().decode()

    got = _samples(text)
    assert got[(OTHER.metric + "_total", (("counter", "odd?"), ("hca", "mlx5_0"), ("port", "1")))]
    assert got[("rdma_port_received_bytes_total", (("hca", "mlx5_1"), ("port", "?")))] == 4.0
