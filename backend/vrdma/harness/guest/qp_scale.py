"""Run inside a guest (by tests/vm/test_vm_scale.py and `vrdma bench`): many RC QPs in one process, as an MPI or
UCX job opens one per peer. Modes:

  connect DEVICE GID N   create N QPs on one CQ (each moved to INIT as it is made), connect them in pairs (2i with
                         2i+1) to RTS, send 8 bytes both ways on every pair and check each landed, destroy them all
  exhaust DEVICE         create QPs until the device refuses one; report how many and the errno
  rate DEVICE N          create N QPs, each moved to INIT, and destroy them (the create rate, for the bench)

GID is the index of the device's RoCE v2 IPv4 GID. Prints one JSON object, with the timings of each phase.
"""

import errno
import json
import struct
import sys
import time

import pyverbs.enums as e
from pyverbs.addr import AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.pyverbs_error import PyverbsRDMAError
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

MESSAGE = 8


def new_qp(pd, cq):
    """An RC QP of one send and one receive WQE, moved to INIT (what `ib_*_bw` and MPI do right after creating)."""
    qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq,
                           cap=QPCap(max_send_wr=1, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)))
    attr = QPAttr(qp_state=e.IBV_QPS_INIT)
    attr.pkey_index, attr.port_num, attr.qp_access_flags = 0, 1, 0
    qp.to_init(attr)
    return qp


def to_rts(qp, remote_qpn, gid, index):
    attr = QPAttr(qp_state=e.IBV_QPS_RTR)
    attr.path_mtu, attr.dest_qp_num, attr.rq_psn, attr.max_dest_rd_atomic, attr.min_rnr_timer = 3, remote_qpn, 0, 1, 12
    attr.ah_attr = AHAttr(gr=GlobalRoute(dgid=gid, sgid_index=index), is_global=1, port_num=1)
    qp.to_rtr(attr)
    attr = QPAttr(qp_state=e.IBV_QPS_RTS)
    attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.sq_psn, attr.max_rd_atomic = 14, 7, 7, 0, 1
    qp.to_rts(attr)


def create(pd, cq, count):
    started = time.monotonic()
    qps = [new_qp(pd, cq) for _ in range(count)]
    return qps, time.monotonic() - started


def connect(device, index, count):
    ctx = Context(name=device)
    gid = ctx.query_gid(1, index)
    pd = PD(ctx)
    cq = CQ(ctx, 2 * count)
    mr = MR(pd, 2 * count * MESSAGE, e.IBV_ACCESS_LOCAL_WRITE)
    qps, created = create(pd, cq, count)
    started = time.monotonic()
    for i in range(0, count, 2):
        to_rts(qps[i], qps[i + 1].qp_num, gid, index)
        to_rts(qps[i + 1], qps[i].qp_num, gid, index)
    connected = time.monotonic() - started
    # Every QP receives into its own 8 bytes of the second half of the MR and sends its number from the first.
    for i, qp in enumerate(qps):
        mr.write(struct.pack("<Q", qp.qp_num), MESSAGE, i * MESSAGE)
        qp.post_recv(RecvWR(wr_id=i, num_sge=1, sg=[SGE(mr.buf + (count + i) * MESSAGE, MESSAGE, mr.lkey)]))
    started = time.monotonic()
    for i, qp in enumerate(qps):
        qp.post_send(SendWR(wr_id=i, opcode=e.IBV_WR_SEND, num_sge=1,
                            sg=[SGE(mr.buf + i * MESSAGE, MESSAGE, mr.lkey)]))
    done, failed, deadline = 0, [], time.monotonic() + 300
    while done < 2 * count and time.monotonic() < deadline:
        n, wcs = cq.poll(64)
        for wc in wcs[:n]:
            done += 1
            if wc.status != e.IBV_WC_SUCCESS:
                failed.append((wc.wr_id, wc.status))
    traffic = time.monotonic() - started
    wrong = [i for i in range(count)
             if struct.unpack("<Q", mr.read(MESSAGE, (count + i) * MESSAGE))[0] != qps[i ^ 1].qp_num]
    distinct = len({qp.qp_num for qp in qps})  # before they go: a closed QP has no number to read
    started = time.monotonic()
    for qp in qps:
        qp.close()
    destroyed = time.monotonic() - started
    return {"qps": count, "distinct_qpn": distinct, "completions": done,
            "failed": failed[:10], "wrong_data": wrong[:10], "create_s": created, "connect_s": connected,
            "traffic_s": traffic, "destroy_s": destroyed}


def exhaust(device):
    ctx = Context(name=device)
    pd = PD(ctx)
    cq = CQ(ctx, 16)
    qps, error = [], None
    started = time.monotonic()
    while error is None:
        try:
            qps.append(new_qp(pd, cq))
        except PyverbsRDMAError as err:
            error = err.error_code
    created = time.monotonic() - started
    for qp in qps:
        qp.close()
    return {"created": len(qps), "errno": errno.errorcode.get(error, str(error)), "create_s": created}


def rate(device, count):
    ctx = Context(name=device)
    pd = PD(ctx)
    cq = CQ(ctx, 16)
    qps, created = create(pd, cq, count)
    for qp in qps:
        qp.close()
    return {"qps": count, "create_s": created, "per_s": count / created}


def main():
    mode, device = sys.argv[1], sys.argv[2]
    if mode == "connect":
        result = connect(device, int(sys.argv[3]), int(sys.argv[4]))
    elif mode == "exhaust":
        result = exhaust(device)
    else:
        result = rate(device, int(sys.argv[3]))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
