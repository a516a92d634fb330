"""A process that holds QPs, as a pod's would: joins a cgroup first (when one is given), then
opens an RDMA device and creates N RC QPs, says `ready`, and holds them until stdin closes.

    python3 -m tests.plugin.rdma.qp_holder DEVICE N [CGROUP_DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

from pyverbs import enums as e
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.pd import PD
from pyverbs.qp import QP, QPCap, QPInitAttr


def main(device: str, count: int, cgroup: Path | None) -> None:
    if cgroup is not None:  # before any QP: restrack keeps the creator, /proc its cgroup now
        (cgroup / "cgroup.procs").write_text("0")  # 0: the writing process itself
    ctx = Context(name=device)
    pd = PD(ctx)
    cq = CQ(ctx, 16)
    cap = QPCap(max_send_wr=1, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
    qps = [QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap)) for _ in range(count)]
    print("ready", " ".join(str(q.qp_num) for q in qps), flush=True)
    sys.stdin.read()  # held until the test closes stdin


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]) if len(sys.argv) > 3 else None)
