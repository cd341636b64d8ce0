"""Run inside a guest (by `vrdma bench`): hold N connected, idle RC QPs on vrdma0 until killed.

  idle_qps.py N GID    GID: the index of vrdma0's RoCE v2 IPv4 GID (the host looks it up)


The QPs are connected in pairs to each other through the guest's own RoCE v2 IPv4 GID and moved to RTS, so the
backend's engine has N QPs to watch and nothing to do. Prints "ready N" once they are all in RTS.
"""

import signal
import sys

import pyverbs.enums as e
from pyverbs.addr import AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr


def main(count, index):
    ctx = Context(name="vrdma0")
    gid = ctx.query_gid(1, index)
    pd = PD(ctx)
    cq = CQ(ctx, 64)
    qps = [QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(max_send_wr=16, max_recv_wr=16)))
           for _ in range(count)]
    for i, qp in enumerate(qps):
        peer = qps[i ^ 1] if (i ^ 1) < count else qp
        attr = QPAttr(qp_state=e.IBV_QPS_INIT)
        attr.pkey_index, attr.port_num, attr.qp_access_flags = 0, 1, 0
        qp.to_init(attr)
        attr = QPAttr(qp_state=e.IBV_QPS_RTR)
        attr.path_mtu, attr.dest_qp_num, attr.rq_psn, attr.max_dest_rd_atomic = 3, peer.qp_num, 0, 1
        attr.min_rnr_timer = 12
        attr.ah_attr = AHAttr(gr=GlobalRoute(dgid=gid, sgid_index=index), is_global=1, port_num=1)
        qp.to_rtr(attr)
        attr = QPAttr(qp_state=e.IBV_QPS_RTS)
        attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.sq_psn, attr.max_rd_atomic = 14, 7, 7, 0, 1
        qp.to_rts(attr)
    print(f"ready {count}", flush=True)
    signal.pause()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
