"""An RDMA WRITE and a SEND over an RC QP pair between two RDMA devices, bytes checked.

Run as a program (what a pod would run), both ends in this one process:
    python3 -m tests.plugin.rdma.rc_transfer rxe0:GID_INDEX rxe1:GID_INDEX [TIMEOUT_S]
    python3 -m tests.plugin.rdma.rc_transfer --rtr rxe0:GID_INDEX rxe1:GID_INDEX
(--rtr: only bring the first end's QP to RTR with that source GID, and print what happened: the
step where MLNX_OFED checks that the source GID's netdev is in the caller's namespace.)
Each end uses the given GID index as its source GID and the other end's GID as destination,
so the index picks the address (IPv4-mapped, IPv6, a child netdev's) the packets carry.
Exits 0 and prints `ok …` when both transfers arrived intact; otherwise raises.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

from pyverbs import enums as e
from pyverbs.addr import AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

PORT = 1
SIZE = 4096
ACCESS = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
# rxe under qemu TCG is slow (a transfer that works completes well within 1 s); a lost packet
# shows up as a timeout here.
POLL_LIMIT_S = 10.0


@dataclass
class End:
    """One side: its own context, PD, CQ, MR and RC QP."""

    ctx: Context
    gid_index: int
    pd: PD
    cq: CQ
    mr: MR
    qp: QP

    @classmethod
    def open(cls, device: str, gid_index: int) -> End:
        ctx = Context(name=device)
        pd = PD(ctx)
        cq = CQ(ctx, 16)
        mr = MR(pd, SIZE, ACCESS)
        cap = QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=1, max_recv_sge=1)
        qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap))
        return cls(ctx, gid_index, pd, cq, mr, qp)

    def connect(self, peer: End) -> None:
        """RESET -> INIT -> RTR -> RTS towards the peer's QP, addressed by GIDs (RoCE v2)."""
        attr = self.to_rtr(peer)
        attr.sq_psn = 0
        attr.timeout = 14
        attr.retry_cnt = 7
        attr.rnr_retry = 7
        attr.max_rd_atomic = 1
        self.qp.to_rts(attr)

    def to_rtr(self, peer: End) -> QPAttr:
        """RESET -> INIT -> RTR: the source GID (its index) is checked here."""
        attr = QPAttr(qp_state=e.IBV_QPS_INIT, cur_qp_state=e.IBV_QPS_RESET)
        attr.qp_access_flags = ACCESS  # before to_init: it is part of the INIT transition
        attr.port_num = PORT
        attr.pkey_index = 0
        self.qp.to_init(attr)
        route = GlobalRoute(
            dgid=peer.ctx.query_gid(PORT, peer.gid_index), sgid_index=self.gid_index
        )
        route.hop_limit = 64
        attr.ah_attr = AHAttr(gr=route, is_global=1, port_num=PORT)
        attr.path_mtu = e.IBV_MTU_1024
        attr.dest_qp_num = peer.qp.qp_num
        attr.rq_psn = 0
        attr.max_dest_rd_atomic = 1
        attr.min_rnr_timer = 12
        self.qp.to_rtr(attr)
        return attr

    def wait_completion(self, what: str) -> None:
        deadline = time.monotonic() + POLL_LIMIT_S
        while time.monotonic() < deadline:
            count, wcs = self.cq.poll(1)
            if count:
                status = wcs[0].status
                if status != e.IBV_WC_SUCCESS:
                    raise RuntimeError(f"{what}: completion status {status}")
                return
            time.sleep(0.001)
        raise TimeoutError(f"{what}: no completion within {POLL_LIMIT_S} s")


def transfer(a: End, b: End) -> None:
    """a writes into b's memory (RDMA WRITE), then sends to b's posted receive (SEND)."""
    payload = os.urandom(SIZE)
    a.mr.write(payload, SIZE)
    write = SendWR(opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[SGE(a.mr.buf, SIZE, a.mr.lkey)])
    write.set_wr_rdma(b.mr.rkey, b.mr.buf)
    a.qp.post_send(write)
    try:
        a.wait_completion("RDMA WRITE")
    except (RuntimeError, TimeoutError) as exc:
        # Which way was lost: did the request reach b, and only b's acknowledgement not a?
        arrived = "arrived" if b.mr.read(SIZE, 0) == payload else "did not arrive"
        raise RuntimeError(f"{exc}; the written bytes {arrived} at the target") from exc
    if b.mr.read(SIZE, 0) != payload:
        raise AssertionError("RDMA WRITE: the bytes at the target differ from the source")

    message = os.urandom(SIZE)
    b.qp.post_recv(RecvWR(num_sge=1, sg=[SGE(b.mr.buf, SIZE, b.mr.lkey)]))
    a.mr.write(message, SIZE)
    a.qp.post_send(SendWR(opcode=e.IBV_WR_SEND, num_sge=1, sg=[SGE(a.mr.buf, SIZE, a.mr.lkey)]))
    a.wait_completion("SEND")
    b.wait_completion("RECV")
    if b.mr.read(SIZE, 0) != message:
        raise AssertionError("SEND: the received bytes differ from the sent ones")


def parse(arg: str) -> tuple[str, int]:
    device, _, index = arg.partition(":")
    return device, int(index)


def main(argv: list[str]) -> int:
    global POLL_LIMIT_S
    if argv[0] == "--rtr":
        (dev_a, gid_a), (dev_b, gid_b) = parse(argv[1]), parse(argv[2])
        a, b = End.open(dev_a, gid_a), End.open(dev_b, gid_b)
        try:
            a.to_rtr(b)
        except Exception as exc:  # pyverbs raises PyverbsRDMAError with the errno
            print(f"RTR refused: {exc}")
            return 1
        print(f"RTR ok: {dev_a}[{gid_a}] -> {dev_b}[{gid_b}]")
        return 0
    (dev_a, gid_a), (dev_b, gid_b) = parse(argv[0]), parse(argv[1])
    if len(argv) > 2:
        POLL_LIMIT_S = float(argv[2])
    a, b = End.open(dev_a, gid_a), End.open(dev_b, gid_b)
    a.connect(b)
    b.connect(a)
    transfer(a, b)
    print(f"ok: RDMA WRITE + SEND of {SIZE} bytes {dev_a}[{gid_a}] -> {dev_b}[{gid_b}]")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
