"""pvrdma lesson 1, unchecked SGE counts (CVE-2018-20124): WQEs and queues with more scatter/gather entries than
allowed, against the real backend through the simulated frontend."""

from __future__ import annotations

import pytest
from backend_process import BackendProcess
from pvrdma_helpers import *  # the lessons' shared helpers (its __all__)

from vrdma.testing.simulated_guest import SGE

pytestmark = pytest.mark.backend


@pytest.mark.parametrize(("qp_max_sge", "num_sge"), [(4, 5), (4, 255), (16, 17), (16, 255)])
def test_send_wqe_with_more_sges_than_its_qp_allows(backend: BackendProcess, pair: tuple[Side, Side],
                                                     qp_max_sge: int, num_sge: int) -> None:
    """CVE-2018-20124: pvrdma's generic RDMA back-end built the host scatter-gather array from a guest WQE's
    num_sge without checking it against the array (build_host_sge_array: out-of-bounds stack read/write; fixed by
    "rdma: check num_sge does not exceed MAX_SGE").

    Here a send WQE claims more SGEs than its QP was created with (the slot behind it full of valid SGEs, so reading
    past the limit would find something to use): it completes with LOC_QP_OP_ERR and nothing moved, the QP goes to
    the error state, the next WQE is flushed, and the peer's memory keeps its sentinel."""
    victim, attacker = pair
    qp = connected_qp(attacker, victim, victim.qp, max_sge=qp_max_sge)
    fit = (qp.sq.stride - SEND_WQE) // SGE
    body = sges([(attacker.mr.addr + 64 * i, 64, attacker.mr.lkey) for i in range(min(num_sge, fit))])
    put_send_wqe(attacker.verbs, qp, body, wr_id=0xBAD, opcode=WR["RDMA_WRITE"], send_flags=SIGNALED,
                 num_sge=num_sge, remote_addr=victim.mr.addr, rkey=victim.mr.rkey)
    attacker.verbs.post_send(qp, WR["SEND"], [(attacker.mr.addr, 8, attacker.mr.lkey)], wr_id=2)
    first, second = wait_cqes(attacker.verbs, attacker.cq, 2)
    assert (first.wr_id, first.status, first.byte_len) == (0xBAD, WC["LOC_QP_OP_ERR"], 0)
    assert (second.wr_id, second.status) == (2, WC["WR_FLUSH_ERR"])
    assert qp_state(attacker.verbs, qp) == QPS_ERR
    assert victim.untouched()
    assert engine(backend, "vm1")["bytes"] == 0


@pytest.mark.parametrize("num_sge", [5, 256, 0xFFFFFFFF])
@pytest.mark.parametrize("queue", ["receive queue", "SRQ"])
def test_receive_wqe_with_more_sges_than_its_queue_allows(backend: BackendProcess, pair: tuple[Side, Side],
                                                          queue: str, num_sge: int) -> None:
    """CVE-2018-20124 on the receive side (pvrdma's receive path built its SGE array the same way).

    A receive WQE (num_sge is 32 bits here) claims more SGEs than its receive queue or SRQ allows, its slot full of
    valid SGEs into the receiver's own MR. A SEND into it: the receiver's WQE completes with LOC_QP_OP_ERR and its
    QP goes to the error state, the sender's with REM_OP_ERR; not one byte lands in the receiver's MR."""
    sender, receiver = pair
    v = receiver.verbs
    srq = v.create_srq(receiver.pd, depth=16, max_sge=4) if queue == "SRQ" else None
    rqp = v.create_qp(receiver.pd, receiver.cq, receiver.cq, max_sge=4, srq=srq)
    sqp = connected_qp(sender, receiver, rqp)
    v.connect(rqp, sqp.qpn, GID[sender.name])
    stride = srq.ring.stride if srq else rqp.rq.stride
    body = sges([(receiver.mr.addr + 256 * i, 256, receiver.mr.lkey) for i in range((stride - RECV_WQE) // SGE)])
    wqe = recv_wqe(0xBAD, num_sge, body)
    put_recv_wqe(v, rqp, srq, wqe, 1)
    sender.verbs.post_send(sqp, WR["SEND"], [(sender.mr.addr, 64, sender.mr.lkey)], wr_id=7)
    (received,) = wait_cqes(v, receiver.cq, 1)
    (sent,) = wait_cqes(sender.verbs, sender.cq, 1)
    assert (received.wr_id, received.status, received.byte_len) == (0xBAD, WC["LOC_QP_OP_ERR"], 0)
    assert (sent.wr_id, sent.status) == (7, WC["REM_OP_ERR"])
    assert qp_state(v, rqp) == QPS_ERR
    assert receiver.untouched()


@pytest.mark.parametrize("case", ["QP send SGEs above the device's", "QP receive SGEs above the device's",
                                  "QP send stride too small for its SGEs", "SRQ SGEs above the device's",
                                  "SRQ stride too small for its SGEs"])
def test_queue_with_more_sges_than_the_device_has_is_refused(vm0: Vm, case: str) -> None:
    """CVE-2018-20124's other half: the SGE limit is checked where a queue is created, so a WQE slot can always
    hold the SGEs its queue allows. Each bad CREATE is refused with STATUS_INVALID and creates nothing."""
    backend, v = vm0.backend, vm0.verbs
    pd, cq = v.alloc_pd(), v.create_cq(16)
    before = objects(backend, "vm0")
    too_many = LIMITS["max_sge"] + 1
    if case.startswith("QP"):
        fields = create_qp_fields(v, pd, cq.handle)
        if case == "QP send SGEs above the device's":
            fields.update(max_send_sge=too_many, sq_stride=1024)
        elif case == "QP receive SGEs above the device's":
            fields.update(max_recv_sge=too_many, rq_stride=1024)
        else:
            fields.update(max_send_sge=16)  # 64 + 16 * 16 bytes do not fit a 128-byte slot
        status = status_of(lambda: create_qp(v, fields))
    else:
        fields = create_srq_fields(v, pd)
        if case == "SRQ SGEs above the device's":
            fields.update(max_sge=too_many, stride=1024)
        else:
            fields.update(max_sge=16)
        status = status_of(lambda: v.call("VRDMA_CMD_CREATE_SRQ", "vrdma_cmd_create_srq",
                                          "vrdma_resp_create_srq", **fields))
    assert status == STATUS["INVALID"]
    assert objects(backend, "vm0") == before
