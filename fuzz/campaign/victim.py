"""The victim VM: memory the attacker must never change, QPs it talks to, a device that must keep answering."""

from __future__ import annotations

import hashlib
import random
import subprocess

from fuzz.campaign.common import (
    CANARY_SIZE,
    CQ_ENTRIES,
    GID,
    MR_SIZE,
    OK,
    QUERY_DEVICE,
    QUERY_QP_RESP,
    RESP_HDR,
    RQ_DEPTH,
    SRQ_DEPTH,
    VICTIM_TIMEOUT,
    CampaignFailure,
    Peer,
    cmd,
)
from fuzz.campaign.process import Backend, CampaignFrontend
from fuzz.campaign.queues import drain_cq, post_receives, reconnect, ring_header
from vrdma.device import abi
from vrdma.testing.simulated_guest import SimVerbs

# -- the victim -----------------------------------------------------------------------------------------------------

class Victim:
    """vm1: registered memory the attacker must never change, QPs (one with its own receive queue, one on an SRQ)
    the attacker's QPs talk to, and a device that must keep answering."""

    def __init__(self, backend: Backend, rng: random.Random) -> None:
        self.fe = CampaignFrontend(str(backend.sockets["vm1"]))
        self.fe.start()
        self.verbs = SimVerbs(self.fe, backend.directory / "vm1.doorbell")
        v = self.verbs
        v.add_gid(0, GID["vm1"])
        self.pd = v.alloc_pd()
        read_only = abi.const("VRDMA_ACCESS_LOCAL_WRITE") | abi.const("VRDMA_ACCESS_REMOTE_READ")
        self.protected = [v.reg_mr(self.pd, MR_SIZE, access=read_only), v.reg_mr(self.pd, MR_SIZE, access=0)]
        self.scratch = v.reg_mr(self.pd, MR_SIZE)  # receives, writes and atomics land here: the attacker may
        self.canary = v.alloc(CANARY_SIZE)         # never registered
        for mr in self.protected:
            v.memory.write(mr.addr, rng.randbytes(MR_SIZE))
        v.memory.write(self.canary.gpa, rng.randbytes(CANARY_SIZE))
        self.cq = v.create_cq(CQ_ENTRIES)
        self.srq = v.create_srq(self.pd, depth=SRQ_DEPTH, max_sge=1)
        self.qp = v.create_qp(self.pd, self.cq, self.cq, depth=RQ_DEPTH, max_sge=1)
        self.srq_qp = v.create_qp(self.pd, self.cq, self.cq, depth=RQ_DEPTH, max_sge=1, srq=self.srq)
        self.digest = self.hash()
        self.seq = 0
        self.timeout = VICTIM_TIMEOUT  # an answer slower than this is a hang

    def keys(self) -> list[tuple[int, int, int]]:
        """(rkey, iova, length) of the victim's MRs: what the attacker aims at."""
        return [(mr.rkey, mr.addr, MR_SIZE) for mr in (*self.protected, self.scratch)]

    def peers(self) -> list[Peer]:
        return [Peer(self.qp.qpn, GID["vm1"]), Peer(self.srq_qp.qpn, GID["vm1"])]

    def hash(self) -> str:
        digest = hashlib.sha256()
        for mr in self.protected:
            digest.update(self.verbs.memory.read(mr.addr, MR_SIZE))
        digest.update(self.verbs.memory.read(self.canary.gpa, CANARY_SIZE))
        return digest.hexdigest()

    def connect(self, attacker: Peer) -> None:
        if not reconnect(self.fe, self.verbs, [(self.qp, attacker), (self.srq_qp, attacker)], VICTIM_TIMEOUT):
            raise CampaignFailure("isolation", "the victim could not bring its QPs to RTS")
        self.refill()

    def refill(self) -> None:
        """Keep receives posted (into the scratch MR) on the RQ and the SRQ, so that the attacker's sends land."""
        v, sge = self.verbs, [(self.scratch.addr, MR_SIZE, self.scratch.lkey)]
        qp, srq = self.qp, self.srq
        room = RQ_DEPTH - ((qp.rq.prod - ring_header(v, qp.buf.gpa, 4)) & 0xFFFFFFFF)
        if 0 < room <= RQ_DEPTH:
            post_receives(v, qp.rq, room, sge)
        room = srq.ring.depth - ((srq.ring.prod - ring_header(v, srq.buf.gpa, 0)) & 0xFFFFFFFF)
        if 0 < room <= srq.ring.depth:
            post_receives(v, srq.ring, room, sge)
        drain_cq(v, self.cq)

    def check(self, backend: Backend, attacker: Peer) -> None:
        if not backend.alive():
            raise CampaignFailure("crash", f"the backend exited with status {backend.proc.poll()}")
        self.seq += 1
        queries = [(cmd("QUERY_DEVICE", "vrdma_cmd_query_device", self.seq), abi.sizeof("vrdma_resp_query_device"))]
        queries += [(cmd("QUERY_QP", "vrdma_cmd_destroy", self.seq, handle=qp.handle), QUERY_QP_RESP)
                    for qp in (self.qp, self.srq_qp)]
        answers = self.fe.commands(queries, self.timeout)
        if None in answers:
            # No answer: the connection closed under the victim (the process is dying: give it a moment to be
            # reaped) or the deadline passed with the process still there (a hang).
            try:
                status = backend.proc.wait(2)
            except subprocess.TimeoutExpired:
                raise CampaignFailure("hang", f"the victim's commands got no answer within {self.timeout:g} s "
                                              "and the backend is still running") from None
            raise CampaignFailure("crash", f"the backend exited with status {status}")
        hdr = abi.from_bytes("vrdma_resp_hdr", answers[0][:RESP_HDR])  # type: ignore[index]
        if (hdr.status, hdr.opcode, hdr.seq) != (OK, QUERY_DEVICE, self.seq & 0xFFFFFFFF):
            raise CampaignFailure("isolation", f"the victim's QUERY_DEVICE came back as {hdr.opcode}/{hdr.status}/"
                                               f"{hdr.seq}")
        if self.hash() != self.digest:
            raise CampaignFailure("isolation", "the victim's protected memory or canary changed")
        broken = [(qp, attacker) for qp, raw in zip((self.qp, self.srq_qp), answers[1:], strict=True)
                  if raw is None or len(raw) < QUERY_QP_RESP or
                  abi.from_bytes("vrdma_resp_query_qp", raw).attr.qp_state != abi.const("VRDMA_QPS_RTS")]
        # The attacker may legitimately put them in error (remote access errors end both sides).
        if broken and not reconnect(self.fe, self.verbs, broken, self.timeout):
            raise CampaignFailure("isolation", "the victim could not bring its QPs back to RTS")
        self.refill()

    def close(self) -> None:
        self.verbs.doorbells.close()
        self.fe.close()


