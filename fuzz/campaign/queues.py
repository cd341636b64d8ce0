"""Queue pairs, rings and completions, driven as a provider drives them."""

from __future__ import annotations

from typing import Any

from fuzz.campaign.common import COMMAND_SLOTS, CQE, PAGE, RESP_HDR, U32, Peer, cmd, mask
from fuzz.campaign.process import CampaignFrontend
from vrdma.device import abi
from vrdma.testing.simulated_guest import SimCq, SimQp, SimRing, SimVerbs, recv_wqe_bytes

# -- queue pairs, as a provider drives them ---------------------------------------------------------------------------

def connect_script(qp: SimQp, peer: Peer, seq: int) -> list[tuple[bytes, int]]:
    """RESET -> INIT -> RTR -> RTS as commands for one batch (the control queue runs them in order). Short retry
    and RNR budgets: a QP whose peer does not answer fails fast instead of stalling the campaign."""
    def modify(mask: int, **attr: Any) -> tuple[bytes, int]:
        return cmd("MODIFY_QP", "vrdma_cmd_modify_qp", seq, handle=qp.handle, attr_mask=mask, attr=attr), RESP_HDR

    return [
        modify(mask("STATE"), qp_state=abi.const("VRDMA_QPS_RESET")),
        modify(mask("STATE", "PKEY_INDEX", "PORT", "ACCESS_FLAGS"), qp_state=1, pkey_index=0, port_num=1,
               qp_access_flags=0xE),
        modify(mask("STATE", "AV", "PATH_MTU", "DEST_QPN", "RQ_PSN", "MAX_DEST_RD_ATOMIC", "MIN_RNR_TIMER"),
               qp_state=2, path_mtu=3, dest_qp_num=peer.qpn, rq_psn=0, max_dest_rd_atomic=1, min_rnr_timer=1,
               dgid=list(peer.gid), sgid_index=0, hop_limit=1),
        modify(mask("STATE", "SQ_PSN", "TIMEOUT", "RETRY_CNT", "RNR_RETRY", "MAX_QP_RD_ATOMIC"), qp_state=3,
               sq_psn=0, timeout=1, retry_cnt=1, rnr_retry=1, max_rd_atomic=1),
    ]


def reconnect(fe: CampaignFrontend, verbs: SimVerbs, qps: list[tuple[SimQp, Peer]], timeout: float) -> bool:
    """Put QPs (back) into RTS from any state, in one round trip; False if the device did not do it all."""
    batch: list[tuple[bytes, int]] = []
    for qp, peer in qps:
        # Doorbells to 0 first: the QP starts counting from 0 after RESET, and a stale (or garbage) producer index
        # would run old WQEs again (or break it once more) the moment it reaches RTS.
        verbs.ring(qp.sq.db, 0)
        if qp.rq.db:
            verbs.ring(qp.rq.db, 0)
        qp.sq.prod = qp.rq.prod = 0
        batch += connect_script(qp, peer, 0)
    ok = True
    for at in range(0, len(batch), COMMAND_SLOTS):
        for response in fe.commands(batch[at:at + COMMAND_SLOTS], timeout):
            ok &= response is not None and len(response) >= RESP_HDR and response[2:4] == bytes(2)
    return ok


def ring_header(verbs: SimVerbs, buf_gpa: int, offset: int) -> int:
    return int(U32.unpack(verbs.memory.read(buf_gpa + offset, 4))[0])


def drain_cq(verbs: SimVerbs, cq: SimCq) -> list[tuple[int, int]]:
    """Consume every completion the device wrote; return (status, qp_num) of each. Garbage in the ring (a
    device bug) shows as statuses and QP numbers that make no sense, not as an exception here."""
    prod = ring_header(verbs, cq.buf.gpa, 0)
    count = (prod - cq.cons) & 0xFFFFFFFF
    out = []
    for i in range(min(count, cq.entries)):
        slot = (cq.cons + i) % cq.entries
        fields = CQE.unpack(verbs.memory.read(cq.buf.gpa + PAGE + slot * CQE.size, CQE.size))
        out.append((fields[1], fields[6]))  # status, qp_num
    cq.cons = prod
    verbs.memory.write(cq.buf.gpa + 4, U32.pack(prod))
    return out


def post_receives(verbs: SimVerbs, ring: SimRing, count: int, sges: list[tuple[int, int, int]]) -> None:
    """Write ``count`` receive WQEs (each wr_id its index) and ring the doorbell once."""
    for _ in range(count):
        verbs.put_wqe(ring, recv_wqe_bytes(sges, ring.prod))
    verbs.ring(ring.db, ring.prod)


