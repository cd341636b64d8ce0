"""pvrdma lesson 4, loops that trust ring indices (CVE-2018-20216, CVE-2023-1544): garbage producer and consumer
indices in every ring a guest writes."""

from __future__ import annotations

import struct

import pytest
from backend_process import BackendProcess
from pvrdma_helpers import *  # the lessons' shared helpers (its __all__)

from vrdma.device import abi
from vrdma.testing.simulated_guest import PAGE

pytestmark = pytest.mark.backend


@pytest.mark.parametrize("producer", [65, 0x7FFF0000, 0xFFFFFFFF])
def test_garbage_send_producer_index_runs_nothing(backend: BackendProcess, pair: tuple[Side, Side],
                                                  producer: int) -> None:
    """CVE-2018-20216: pvrdma_qp_send/recv looped while pvrdma_idx_ring_has_data() was nonzero, and its -1 for an
    invalid index counted as "data": an infinite loop (fixed by "pvrdma: check return value from
    pvrdma_idx_ring_has_ routines"). CVE-2023-1544: an index past the ring made pvrdma_ring_next_elem_read read out
    of bounds.

    Here a 64-deep send queue, every slot holding a valid signaled RDMA WRITE into the victim, gets a producer index
    more than 64 ahead of the consumer. The engine runs none of them: the QP goes to the error state with one
    QP_FATAL event, no completion is written, the victim's memory keeps its sentinel, and both VMs are served."""
    victim, attacker = pair
    v = attacker.verbs
    events_ready(v)
    cq = v.create_cq(64)
    qp = connected_qp(attacker, victim, victim.qp, cq=cq)
    for i in range(qp.sq.depth):
        v.post_send(qp, WR["RDMA_WRITE"], [(attacker.mr.addr, 64, attacker.mr.lkey)], wr_id=i, ring=False,
                    remote_addr=victim.mr.addr + 64 * i, rkey=victim.mr.rkey)
    v.ring(qp.sq.db, producer)
    v.fe.wake()
    wait_until("QP_FATAL", lambda: engine(backend, "vm1")["qp_fatal"] == 1, timeout=10, interval=0.002)
    assert [(e.type, e.handle) for e in v.wait_events()] == [(EVENT["QP_FATAL"], qp.handle)]
    assert engine(backend, "vm1")["send_wqes"] == 0
    assert qp_state(v, qp) == QPS_ERR
    assert victim.untouched()
    round_trip(attacker, victim, wr_id=99)  # the engine passed over the broken QP again: still nothing from it
    assert v.poll_cq(cq) == []
    assert device_answers(victim.verbs.fe)


@pytest.mark.parametrize("queue", ["receive queue", "SRQ"])
def test_garbage_receive_producer_index_breaks_only_that_queue(backend: BackendProcess, pair: tuple[Side, Side],
                                                               queue: str) -> None:
    """CVE-2018-20216 on the receive side (pvrdma_qp_recv's loop) and CVE-2023-1544's out-of-ring read.

    A receive queue or SRQ whose producer index claims far more WQEs than it holds (its one real WQE names the
    receiver's MR): a SEND into it completes with REM_OP_ERR, the receiving QP is reported QP_FATAL, no receive
    completion is written and no byte lands in the receiver's memory."""
    sender, receiver = pair
    v = receiver.verbs
    events_ready(v)
    cq = v.create_cq(64)
    srq = v.create_srq(receiver.pd, depth=16) if queue == "SRQ" else None
    rqp = v.create_qp(receiver.pd, cq, cq, srq=srq)
    sqp = connected_qp(sender, receiver, rqp)
    v.connect(rqp, sqp.qpn, GID[sender.name])
    wqe = recv_wqe(1, 1, sges([(receiver.mr.addr, MR_SIZE, receiver.mr.lkey)]))
    put_recv_wqe(v, rqp, srq, wqe, 0x7FFF0000)
    sender.verbs.post_send(sqp, WR["SEND"], [(sender.mr.addr, 64, sender.mr.lkey)], wr_id=7)
    (sent,) = wait_cqes(sender.verbs, sender.cq, 1)
    assert (sent.wr_id, sent.status) == (7, WC["REM_OP_ERR"])
    fatal = [(e.type, e.handle) for e in v.wait_events()]
    assert fatal[0] == (EVENT["QP_FATAL"], rqp.handle)
    assert engine(backend, "vm1")["recv_wqes"] == 0
    assert receiver.untouched()
    assert all(c.status != WC["SUCCESS"] for c in v.poll_cq(cq))
    round_trip(receiver, sender, wr_id=99)


@pytest.mark.parametrize("how", ["QP moved to the error state", "QP made fatal by a SEND"])
def test_garbage_receive_index_flushes_at_most_one_ring(backend: BackendProcess, pair: tuple[Side, Side],
                                                        how: str) -> None:
    """CVE-2018-20216: a loop bounded by a guest's ring index instead of by the ring.

    A QP in the error state flushes its posted receives; its 64-deep receive queue holds at most 64. Its producer
    index says 0x7FFF0000. Expected: at most 64 flushes, however many passes the engine makes (twenty round trips on
    another QP make at least twenty). Observed before the fix: 64 more on every pass (hundreds of millions a second,
    one core spinning until the consumer index reaches the garbage one, and a new store starts it again)."""
    victim, attacker = pair
    v = attacker.verbs
    cq = v.create_cq(64)
    if how == "QP moved to the error state":
        qp = v.create_qp(attacker.pd, cq, cq)
        v.modify_qp(qp, abi.const("VRDMA_QP_STATE"), qp_state=QPS_ERR)
        v.ring(qp.rq.db, 0x7FFF0000)
    else:
        qp = v.create_qp(attacker.pd, cq, cq)
        peer = connected_qp(victim, attacker, qp)
        v.connect(qp, peer.qpn, GID[victim.name])
        v.ring(qp.rq.db, 0x7FFF0000)
        victim.verbs.post_send(peer, WR["SEND"], [(victim.mr.addr, 8, victim.mr.lkey)], wr_id=7)
        assert wait_cqes(victim.verbs, victim.cq, 1)[0].status == WC["REM_OP_ERR"]
    for i in range(20):
        round_trip(attacker, victim, wr_id=100 + i)
    assert engine(backend, "vm1")["flushed"] <= qp.rq.depth


@pytest.mark.parametrize("consumer", [1, 0x80000000, 0xFFFFFF00])
def test_garbage_cq_consumer_index_never_writes_outside_the_ring(backend: BackendProcess, pair: tuple[Side, Side],
                                                                 consumer: int) -> None:
    """CVE-2023-1544's direction reversed (pvrdma wrote CQEs at an index the guest's ring state steered): a CQ
    whose consumer index (guest-written) is ahead of the producer, or further behind it than the ring holds.

    The next completion finds the ring "full": the CQ goes to the error state (overflow flag, CQ_ERR event,
    cq_overflows counted) and nothing is written into the ring or the rest of its buffer."""
    victim, attacker = pair
    v = attacker.verbs
    events_ready(v)
    cq = v.create_cq(16)
    qp = connected_qp(attacker, victim, victim.qp, cq=cq)
    entries = cq.buf.size - PAGE
    v.memory.write(cq.buf.gpa + PAGE, bytes([SENTINEL]) * entries)
    v.memory.write(cq.buf.gpa + 4, struct.pack("<I", consumer))
    v.post_send(qp, WR["RDMA_WRITE"], [(attacker.mr.addr, 8, attacker.mr.lkey)], wr_id=1,
                remote_addr=victim.mr.addr, rkey=victim.mr.rkey)
    wait_until("the CQ's overflow flag", lambda: v.cq_overflowed(cq), timeout=10, interval=0.002)
    assert [(e.type, e.handle) for e in v.wait_events()] == [(EVENT["CQ_ERR"], cq.handle)]
    assert engine(backend, "vm1")["cq_overflows"] == 1
    assert struct.unpack("<I", v.memory.read(cq.buf.gpa, 4))[0] == 0  # prod: no CQE was written
    assert v.memory.read(cq.buf.gpa + PAGE, entries) == bytes([SENTINEL]) * entries
