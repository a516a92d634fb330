"""The servicer's Allocate answers, called as grpc would call it (no socket needed here)."""

from __future__ import annotations

from pathlib import Path

from plugin.config import Pool
from plugin.core.metrics.exposition import Metrics
from plugin.core.node import pools
from plugin.deviceplugin.api.v1beta1 import api_pb2
from plugin.deviceplugin.servicer import DevicePluginServicer
from tests.plugin.unit.test_pool import hca


class NoStreams:
    def stream_opened(self) -> int:
        return 0

    def stream_ended(self, token: int) -> None:
        pass


def shared_view(first_uverbs: int) -> pools.PoolView:
    hcas = (hca("mlx5_0", 0, index=first_uverbs), hca("mlx5_1", 1, index=first_uverbs + 1))
    return pools.build_view(Pool(name="hca", max_allocations=4), hcas, rdma_cm=True)


async def allocated_paths(servicer: DevicePluginServicer, device_id: str) -> list[str]:
    request = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[device_id])]
    )
    (answer,) = (await servicer.Allocate(request, None)).container_responses  # type: ignore[arg-type]
    return [d.host_path for d in answer.devices]


async def test_an_update_with_new_char_devices_under_the_same_ids_changes_the_answer() -> None:
    """A driver reload renumbers uverbs while the shared IDs stay the same: the answer built
    for the previous view must not be reused."""
    servicer = DevicePluginServicer(shared_view(0), Path("/dev"), Metrics(), NoStreams())
    before = await allocated_paths(servicer, "hca-1")

    await servicer.update(shared_view(2))

    assert "/dev/infiniband/uverbs0" in before
    assert await allocated_paths(servicer, "hca-1") == [
        "/dev/infiniband/rdma_cm",
        "/dev/infiniband/uverbs2",
        "/dev/infiniband/umad2",
        "/dev/infiniband/uverbs3",
        "/dev/infiniband/umad3",
    ]


async def test_every_id_of_a_shared_pool_gets_the_same_answer() -> None:
    servicer = DevicePluginServicer(shared_view(0), Path("/dev"), Metrics(), NoStreams())

    assert await allocated_paths(servicer, "hca-0") == await allocated_paths(servicer, "hca-3")
