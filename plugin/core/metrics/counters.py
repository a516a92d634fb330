"""Every RDMA port's counters as Prometheus counters, read from sysfs at each scrape (as
node_exporter's infiniband collector does): `ports/N/counters/*`, the IB PortCounters every
RDMA driver shows, and `ports/N/hw_counters/*`, the driver's own (mlx5: congestion, buffer,
retransmit and ICRC counters; rxe: packets, retries). One table names each file's metric, unit
and help; a driver counter the table does not name still appears, under its file name."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from common.userfiles import decimal
from plugin.core.metrics.exposition import MetricFamily

PREFIX = "rdma_port_"
LABELS = ("hca", "port")


@dataclass(frozen=True)
class Counter:
    name: str  # the metric is PREFIX + name (+ "_" + unit) + "_total"
    unit: str  # "" for a count of events or packets
    help: str
    scale: int = 1  # what one step of the file's value is worth in `unit`

    @property
    def metric(self) -> str:
        return PREFIX + self.name + (f"_{self.unit}" if self.unit else "")


# counters/: the IB PortCounters and PortCountersExtended (IBTA vol. 1, 16.1.3-4). The data
# counters count 4-octet words.
PORT_COUNTERS = {
    "port_xmit_data": Counter("transmitted", "bytes", "Data sent, all VLs", 4),
    "port_rcv_data": Counter("received", "bytes", "Data received, all VLs", 4),
    "port_xmit_packets": Counter("transmitted_packets", "", "Packets sent, errors included"),
    "port_rcv_packets": Counter("received_packets", "", "Packets received, errors included"),
    "unicast_xmit_packets": Counter("unicast_transmitted_packets", "", "Unicast packets sent"),
    "unicast_rcv_packets": Counter("unicast_received_packets", "", "Unicast packets received"),
    "multicast_xmit_packets": Counter(
        "multicast_transmitted_packets", "", "Multicast packets sent"
    ),
    "multicast_rcv_packets": Counter(
        "multicast_received_packets", "", "Multicast packets received"
    ),
    "port_rcv_errors": Counter("receive_errors", "", "Packets received with an error"),
    "port_xmit_discards": Counter(
        "transmit_discards", "", "Outbound packets discarded: port down or congested"
    ),
    "port_xmit_wait": Counter(
        "transmit_wait_ticks", "", "Ticks with data to send and none sent (back-pressure)"
    ),
    "symbol_error": Counter("symbol_errors", "", "Minor link errors on any lane"),
    "link_error_recovery": Counter(
        "link_error_recoveries", "", "Times the link recovered from an error state"
    ),
    "link_downed": Counter("link_downed", "", "Times the link failed to recover and went down"),
    "port_rcv_remote_physical_errors": Counter(
        "receive_remote_physical_errors", "", "Packets received marked bad by a remote port"
    ),
    "port_rcv_switch_relay_errors": Counter(
        "receive_switch_relay_errors", "", "Packets a switch could not relay"
    ),
    "port_xmit_constraint_errors": Counter(
        "transmit_constraint_errors", "", "Packets not sent: partition or raw constraints"
    ),
    "port_rcv_constraint_errors": Counter(
        "receive_constraint_errors", "", "Packets dropped: partition or raw constraints"
    ),
    "local_link_integrity_errors": Counter(
        "local_link_integrity_errors", "", "Times local physical errors passed their threshold"
    ),
    "excessive_buffer_overrun_errors": Counter(
        "excessive_buffer_overrun_errors", "", "Consecutive flow control update overruns"
    ),
    "VL15_dropped": Counter("vl15_dropped", "", "Subnet management packets dropped"),
}

# hw_counters/: the driver's own. mlx5's (RoCE congestion control, RNIC errors) and rxe's.
HW_COUNTERS = {
    # congestion (DCQCN): ECN marks seen, CNPs sent and handled
    "np_ecn_marked_roce_packets": Counter(
        "ecn_marked_roce_packets", "", "RoCEv2 packets received with an ECN mark (congestion)"
    ),
    "np_cnp_sent": Counter("cnp_sent", "", "CNPs sent back to senders of ECN-marked packets"),
    "rp_cnp_handled": Counter("cnp_handled", "", "CNPs received and acted on (rate lowered)"),
    "rp_cnp_ignored": Counter(
        "cnp_ignored", "", "CNPs received and ignored (congestion control off?)"
    ),
    # buffers and sequence
    "out_of_buffer": Counter(
        "out_of_buffer", "", "Packets dropped: no receive WQE posted (receiver too slow)"
    ),
    "out_of_sequence": Counter("out_of_sequence", "", "Out-of-sequence packets received"),
    "packet_seq_err": Counter("packet_seq_errors", "", "NAK sequence error packets received"),
    "implied_nak_seq_err": Counter(
        "implied_nak_seq_errors", "", "ACKs implying lost packets (a read response skipped)"
    ),
    "duplicate_request": Counter("duplicate_requests", "", "Duplicate requests received"),
    # retransmits and timeouts
    "local_ack_timeout_err": Counter(
        "local_ack_timeouts", "", "Times a QP's ACK timer expired (a retransmit follows)"
    ),
    "rnr_nak_retry_err": Counter(
        "rnr_nak_retry_errors", "", "RNR NAKs received past the retry limit"
    ),
    "roce_adp_retrans": Counter("adaptive_retransmits", "", "Adaptive retransmissions"),
    "roce_adp_retrans_to": Counter(
        "adaptive_retransmit_timeouts", "", "Adaptive retransmission timeouts"
    ),
    "roce_slow_restart": Counter("slow_restarts", "", "Slow restarts after a retransmit"),
    "roce_slow_restart_cnps": Counter("slow_restart_cnps", "", "CNPs sent during slow restarts"),
    "roce_slow_restart_trans": Counter(
        "slow_restart_transitions", "", "Times a QP went back to slow restart"
    ),
    # wire and completion errors
    "rx_icrc_encapsulated": Counter(
        "icrc_errors", "", "RoCE packets received with a bad ICRC (corruption on the wire)"
    ),
    "req_cqe_error": Counter("requester_cqe_errors", "", "Requester completions with an error"),
    "req_cqe_flush_error": Counter(
        "requester_cqe_flush_errors", "", "Requester completions flushed with an error"
    ),
    "resp_cqe_error": Counter("responder_cqe_errors", "", "Responder completions with an error"),
    "resp_cqe_flush_error": Counter(
        "responder_cqe_flush_errors", "", "Responder completions flushed with an error"
    ),
    "req_remote_access_errors": Counter(
        "requester_remote_access_errors", "", "Remote access errors the requester saw"
    ),
    "req_remote_invalid_request": Counter(
        "requester_remote_invalid_requests", "", "Remote invalid request errors the requester saw"
    ),
    "resp_remote_access_errors": Counter(
        "responder_remote_access_errors", "", "Remote access errors the responder saw"
    ),
    "resp_local_length_error": Counter(
        "responder_local_length_errors", "", "Responder completions with a length error"
    ),
    # operations received
    "rx_write_requests": Counter("write_requests_received", "", "RDMA WRITE requests received"),
    "rx_read_requests": Counter("read_requests_received", "", "RDMA READ requests received"),
    "rx_atomic_requests": Counter("atomic_requests_received", "", "Atomic requests received"),
    "rx_dct_connect": Counter("dct_connects_received", "", "DCT connect requests received"),
    # rxe (Soft-RoCE)
    "sent_pkts": Counter("rxe_sent_packets", "", "Packets sent (rxe)"),
    "rcvd_pkts": Counter("rxe_received_packets", "", "Packets received (rxe)"),
    "out_of_seq_request": Counter(
        "rxe_out_of_sequence_requests", "", "Out-of-sequence requests received (rxe)"
    ),
    "rcvd_seq_err": Counter("rxe_sequence_errors", "", "Sequence errors received (rxe)"),
    "rcvd_rnr_err": Counter("rxe_rnr_naks_received", "", "RNR NAKs received (rxe)"),
    "send_rnr_err": Counter("rxe_rnr_naks_sent", "", "RNR NAKs sent (rxe)"),
    "ack_deferred": Counter("rxe_acks_deferred", "", "ACKs deferred (rxe)"),
    "retry_exceeded_err": Counter("rxe_retries_exceeded", "", "Retry limits exceeded (rxe)"),
    "retry_rnr_exceeded_err": Counter(
        "rxe_rnr_retries_exceeded", "", "RNR retry limits exceeded (rxe)"
    ),
    "completer_retry_err": Counter("rxe_completer_retries", "", "Completer retries (rxe)"),
    "send_err": Counter("rxe_send_errors", "", "Send errors (rxe)"),
    "rdma_sends": Counter("rxe_rdma_sends", "", "RDMA sends (rxe)"),
    "rdma_recvs": Counter("rxe_rdma_receives", "", "RDMA receives (rxe)"),
    "link_downed": Counter("hw_link_downed", "", "Times the link went down (driver's count)"),
}
# Any other hw_counters file: one family, its file name as a label.
OTHER = Counter("hw_other", "", "A driver counter the table above does not name")
# Not a counter: how long (ms) the driver caches hw_counters between reads.
NOT_COUNTERS = frozenset({"lifespan"})
# Each port's logical state as a gauge (node_exporter: node_infiniband_state_id).
STATE_METRIC = PREFIX + "state"
STATE_HELP = "Port state: 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER"


def collect(sysfs_root: Path) -> list[MetricFamily]:
    """The families of every port of every RDMA device now; a file that cannot be read (a
    device going away, a counter the hardware refuses) is left out of this scrape."""
    families: dict[str, MetricFamily] = {}

    def family(counter: Counter, *extra: str) -> MetricFamily:
        if counter.metric not in families:
            families[counter.metric] = MetricFamily(
                counter.metric, counter.help, "counter", (*LABELS, *extra)
            )
        return families[counter.metric]

    states = MetricFamily(STATE_METRIC, STATE_HELP, "gauge", LABELS)
    for hca, port, state in _states(sysfs_root):
        states.labels(hca, port).set(state)
    for hca, port, kind, name, value in _files(sysfs_root):
        table = PORT_COUNTERS if kind == "counters" else HW_COUNTERS
        counter = table.get(name)
        if counter is not None:
            family(counter).labels(hca, port).inc(value * counter.scale)
        elif kind == "hw_counters" and name not in NOT_COUNTERS:
            family(OTHER, "counter").labels(hca, port, name).inc(value)
    return [states, *families.values()]


def _ports(sysfs_root: Path) -> Iterator[tuple[str, str, Path]]:
    base = sysfs_root / "class" / "infiniband"
    for hca in _listdir(base):
        for port in _listdir(base / hca / "ports"):
            yield hca, port, base / hca / "ports" / port


def _states(sysfs_root: Path) -> Iterator[tuple[str, str, int]]:
    """(hca, port, state number) of every port whose `state` reads like "4: ACTIVE"."""
    for hca, port, where in _ports(sysfs_root):
        text = _read_counter(where / "state")
        number = decimal(text.decode("ascii", "replace").partition(":")[0]) if text else None
        if number is not None and 0 <= number <= 7:  # the IB PortState field's width
            yield hca, port, number


def _files(sysfs_root: Path) -> Iterator[tuple[str, str, str, str, int]]:
    """(hca, port, counters|hw_counters, file, value) of every readable counter file."""
    for hca, port, path in _ports(sysfs_root):
        for kind in ("counters", "hw_counters"):
            where = path / kind
            for name in _listdir(where):
                text = _read_counter(where / name)
                if text is None:
                    continue
                value = decimal(text.decode("ascii", "replace").strip())
                if value is not None and value <= _U64_MAX and len(text) <= _MAX_TEXT:
                    yield hca, port, kind, name, value


# A counter file holds one u64 in decimal and a newline; anything else is not a counter's.
_U64_MAX = 2**64 - 1
_MAX_TEXT = 21


def _read_counter(path: Path) -> bytes | None:
    """A counter file's first bytes; None for anything but a regular file (this runs on the
    event loop: a FIFO opened plainly would block the whole plugin)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, _MAX_TEXT + 1)
    except OSError:
        return None
    finally:
        os.close(fd)


def _listdir(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []
