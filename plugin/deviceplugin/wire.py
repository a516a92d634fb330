"""ListAndWatch's response encoded by hand: the one place that knows the wire format."""

from __future__ import annotations

from plugin.core.node import pools
from plugin.deviceplugin.api.v1beta1 import api_pb2

# The kubelet dials a device plugin with grpc-go's default receive limit (devicemanager's
# plugin/v1beta1/client.go, 1.34): a larger ListAndWatch response ends the stream, again after
# every Register (100000 IDs of 63 characters took 8 MiB).
KUBELET_MESSAGE_MAX = 4 << 20


def list_and_watch_response(
    view: pools.PoolView, limit: int = KUBELET_MESSAGE_MAX
) -> api_pb2.ListAndWatchResponse:
    """The kubelet's view of a pool: every ID with its health and NUMA nodes, as many as fit in
    `limit` bytes (the caller says what is left out).

    Encoded as wire bytes and parsed once in C: a pool has up to thousands of IDs that share a
    handful of (health, topology) tails, and 10 000 message constructors take ~4x longer."""
    tails: dict[tuple[bool, tuple[int, ...]], bytes] = {}
    chunks: list[bytes] = []
    size = 0
    for d in view.devices:
        key = (d.healthy, d.numa_nodes)
        tail = tails.get(key)
        if tail is None:
            tail = tails[key] = _device_tail(*key)
        ident = d.id.encode()
        ident_size = _length(len(ident))
        body = 1 + len(ident_size) + len(ident) + len(tail)
        body_size = _length(body)
        size += 1 + len(body_size) + body
        if size > limit:
            break
        chunks += (
            _FIELD_1,  # ListAndWatchResponse.devices
            body_size,
            _FIELD_1,  # Device.ID
            ident_size,
            ident,
            tail,
        )
    return api_pb2.ListAndWatchResponse.FromString(b"".join(chunks))


_FIELD_1 = bytes((1 << 3 | 2,))  # field number 1, wire type 2 (length-delimited)
_ONE_BYTE = [bytes((i,)) for i in range(128)]  # varints below 128


def _device_tail(healthy: bool, numa_nodes: tuple[int, ...]) -> bytes:
    """Device fields after ID: health and topology."""
    return api_pb2.Device(
        health=pools.HEALTHY if healthy else pools.UNHEALTHY,
        topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=n) for n in numa_nodes])
        if numa_nodes
        else None,
    ).SerializeToString()


def _length(value: int) -> bytes:
    """A length as a protobuf varint; lengths below 128 (every ID the pool makes: at most 63
    bytes) from a table."""
    return _ONE_BYTE[value] if value < 128 else _varint(value)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
