"""The attacker VM: its connection, its objects and its work requests (commands and messages: attacks.py)."""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from fuzz.campaign.attacks import CommandAttacks, MessageAttacks
from fuzz.campaign.common import (
    ATTACKER_TIMEOUT,
    CQ_ENTRIES,
    DRAIN_DEADLINE,
    GID,
    LOOPBACK_QPS,
    MAX_INLINE,
    MAX_SGE,
    MR_SIZE,
    OPS,
    RQ_DEPTH,
    SEND_INLINE,
    SEND_WQE,
    SGE,
    SIGNALED,
    SQ_DEPTH,
    SQ_STRIDE,
    VICTIM_QPS,
    VICTIM_TIMEOUT,
    WR,
    Peer,
)
from fuzz.campaign.process import Backend, CampaignFrontend
from fuzz.campaign.queues import drain_cq, post_receives, reconnect, ring_header
from fuzz.campaign.victim import Victim
from vrdma.device import abi
from vrdma.testing.frontend import FrontendError
from vrdma.testing.simulated_guest import SimCq, SimMr, SimQp, SimVerbs

# -- the attacker ---------------------------------------------------------------------------------------------------

@dataclass
class Counts:
    messages: int = 0
    commands: int = 0
    wqes: int = 0
    executed: int = 0          # send WQEs the engine executed (its counters, read before each disconnect)
    flushed: int = 0
    connections: int = 0
    batches: int = 0
    seconds: dict[str, float] = field(default_factory=dict)   # time spent per phase

    @contextlib.contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.monotonic() - start

    @property
    def inputs(self) -> int:
        return self.messages + self.commands + self.wqes


@dataclass
class AttackerState:
    fe: CampaignFrontend
    verbs: SimVerbs
    pd: int
    pd2: int
    mrs: list[SimMr]           # [0]: its PD, all access; [1]: the other PD; [2]: local write only
    cq: SimCq
    qps: list[tuple[SimQp, Peer]]
    handles: dict[str, list[int]] = field(default_factory=dict)
    broken: bool = False       # its own doing (a queue disabled, memory moved): connect again next batch

    @property
    def core(self) -> set[int]:
        """Handles of the working set it was connected with (the first of each kind's list)."""
        return {h for kind in ("ucontext", "pd", "mr", "cq", "qp") for h in self.handles.get(kind, [])[:6]}

    def peer_of(self, qp: SimQp) -> Peer:
        return next(peer for q, peer in self.qps if q is qp)


class Attacker(CommandAttacks, MessageAttacks):
    def __init__(self, backend: Backend, victim: Victim, rng: random.Random, counts: Counts) -> None:
        self.backend = backend
        self.victim = victim
        self.rng = rng
        self.counts = counts
        self.state: AttackerState | None = None
        self.record: list[dict[str, Any]] = []   # what it sent since it last connected (for a reproducer)
        self.seq = 0
        self._engine_seen: dict[str, int] = {}

    # -- connection --------------------------------------------------------------------------------------------

    def connect(self) -> AttackerState:
        self.disconnect()
        fe = CampaignFrontend(str(self.backend.sockets["vm0"]), timeout=VICTIM_TIMEOUT)
        fe.start()
        verbs = SimVerbs(fe, self.backend.directory / "vm0.doorbell")
        verbs.add_gid(0, GID["vm0"])
        pd, pd2 = verbs.alloc_pd(), verbs.alloc_pd()
        mrs = [verbs.reg_mr(pd, MR_SIZE), verbs.reg_mr(pd2, 16 << 10), verbs.reg_mr(pd, 16 << 10, access=0x1)]
        cq = verbs.create_cq(CQ_ENTRIES)
        qps = [verbs.create_qp(pd, cq, cq, depth=SQ_DEPTH, max_sge=MAX_SGE, max_inline=MAX_INLINE)
               for _ in range(len(VICTIM_QPS) + LOOPBACK_QPS)]
        peers = [self.victim.peers()[i] for i in VICTIM_QPS] + [Peer(qp.qpn, GID["vm0"]) for qp in qps[-LOOPBACK_QPS:]]
        pairs = list(zip(qps, peers, strict=True))
        if not reconnect(fe, verbs, pairs, VICTIM_TIMEOUT):
            raise FrontendError("the attacker's QPs did not reach RTS")
        self.victim.connect(Peer(qps[0].qpn, GID["vm0"]))
        verbs.post_event_buffers(16)
        self.state = AttackerState(fe, verbs, pd, pd2, mrs, cq, pairs, handles={
            "ucontext": [verbs.ucontext], "pd": [pd, pd2], "mr": [m.handle for m in mrs], "cq": [cq.handle],
            "qp": [qp.handle for qp in qps]})
        self.counts.connections += 1
        self.record = [{"connect": self.counts.connections}]
        self._engine_seen = {}
        return self.state

    def disconnect(self) -> None:
        if self.state is None:
            return
        self.sample_engine()
        with contextlib.suppress(OSError, ValueError):
            self.state.verbs.doorbells.close()
        self.state.fe.close()
        self.state = None

    def sample_engine(self) -> None:
        """Add what the engine did with the attacker's WQEs since the last look (its counters start from zero
        whenever the device is reset: a connection that ended takes its last counts with it)."""
        try:
            engine = self.backend.counters("vm0")["engine"]
        except (OSError, ValueError, KeyError):
            return
        for name, attr in (("send_wqes", "executed"), ("flushed", "flushed")):
            seen = self._engine_seen.get(name, 0)
            delta = engine[name] - seen if engine[name] >= seen else engine[name]
            setattr(self.counts, attr, getattr(self.counts, attr) + delta)
            self._engine_seen[name] = engine[name]

    def ensure(self) -> AttackerState:
        if self.state is None or self.state.broken:
            return self.connect()
        return self.state

    # -- work requests -----------------------------------------------------------------------------------------

    def _local(self, s: AttackerState, total: int, count: int, writable: bool) -> list[tuple[int, int, int]]:
        """SGEs over its own MR (the local-write one too when the op writes locally), ``total`` bytes in all."""
        rng = self.rng
        mr = s.mrs[0] if not writable or rng.randrange(4) else s.mrs[2]
        sges = []
        left = total
        for i in range(count):
            length = left if i == count - 1 else rng.randrange(left + 1)
            sges.append((mr.addr + rng.randrange(mr.buf.size - length + 1), length, mr.lkey))
            left -= length
        return sges

    def _wqe(self, s: AttackerState, qp: SimQp, hostile: bool) -> bytes:
        """A send WQE that is right (so the ones after it run too), or one wrong in one way."""
        rng = self.rng
        loopback = s.peer_of(qp).gid == GID["vm0"]
        op = rng.choice(OPS)
        flags = SIGNALED if rng.randrange(4) else 0
        imm = rng.getrandbits(32)
        rkey, remote, length = 0, 0, rng.choice([0, 1, 8, 64, 1000, 4096, 5000, 16384])
        if op in (WR["RDMA_WRITE"], WR["RDMA_WRITE_WITH_IMM"], WR["RDMA_READ"], WR["ATOMIC_CMP_AND_SWP"],
                  WR["ATOMIC_FETCH_AND_ADD"]):
            if loopback:
                target = (s.mrs[0].rkey, s.mrs[0].addr, MR_SIZE)
            elif op == WR["RDMA_READ"]:
                target = rng.choice(self.victim.keys()[::2])  # remote read: allowed on A and scratch
            else:
                target = self.victim.keys()[2]                 # write and atomics: only the scratch MR
            rkey, base, size = target
            if op in (WR["ATOMIC_CMP_AND_SWP"], WR["ATOMIC_FETCH_AND_ADD"]):
                length = 8
                remote = base + rng.randrange(size // 8) * 8
            else:
                length = min(length, size)
                remote = base + rng.randrange(size - length + 1)
        inline = op in (WR["SEND"], WR["SEND_WITH_IMM"], WR["RDMA_WRITE"], WR["RDMA_WRITE_WITH_IMM"]) and \
            length <= MAX_INLINE and rng.randrange(3) == 0
        nsge = 0 if inline else (1 if length == 8 and op >= WR["ATOMIC_CMP_AND_SWP"] else rng.randrange(1, 5))
        sges = [] if inline else self._local(s, length, nsge, op in (WR["RDMA_READ"], WR["ATOMIC_CMP_AND_SWP"],
                                                                   WR["ATOMIC_FETCH_AND_ADD"]))
        payload = rng.randbytes(length) if inline else b""
        if hostile:
            op, flags, nsge, rkey, remote, length, sges, payload = self._spoil(
                s, op, flags, nsge, rkey, remote, length, sges, payload)
            inline = bool(flags & SEND_INLINE)
        if inline:
            flags |= SEND_INLINE
        body = payload if inline else b"".join(SGE.pack(*sge) for sge in sges)
        header = SEND_WQE.pack(rng.getrandbits(16), op & 0xFF, flags & 0xFF, nsge & 0xFF, imm,
                               len(payload) if inline else 0, rkey & 0xFFFFFFFF, remote % (1 << 64),
                               rng.getrandbits(64), rng.getrandbits(64))
        return (header + body)[:qp.sq.stride]

    def _spoil(self, s: AttackerState, op: int, flags: int, nsge: int, rkey: int, remote: int, length: int,
               sges: list[tuple[int, int, int]], payload: bytes) -> tuple[int, int, int, int, int, int,
                                                                            list[tuple[int, int, int]], bytes]:
        """One thing wrong: what a hostile provider would try."""
        rng = self.rng
        victim_keys = self.victim.keys()
        how = rng.randrange(16)
        if how == 0:
            op = rng.choice([7, 8, 0x7F, 0xFF, rng.getrandbits(8)])
        elif how == 1:
            nsge = rng.choice([MAX_SGE + 1, 255, rng.getrandbits(8)])
            sges = [(s.mrs[0].addr, 1, s.mrs[0].lkey)] * min(nsge, (SQ_STRIDE - SEND_WQE.size) // SGE.size)
        elif how == 2:  # inline beyond its limit, or with a read
            flags |= SEND_INLINE
            payload = rng.randbytes(rng.choice([MAX_INLINE + 1, SQ_STRIDE - SEND_WQE.size, 16]))
            op = rng.choice([op, WR["RDMA_READ"], WR["ATOMIC_FETCH_AND_ADD"]])
        elif how == 3 and sges:  # a local key that is not its own MR in its PD
            i = rng.randrange(len(sges))
            sges[i] = (sges[i][0], sges[i][1], rng.choice([s.mrs[1].lkey, s.mrs[0].rkey, victim_keys[2][0],
                                                           rng.getrandbits(32), 0]))
        elif how == 4 and sges:  # local range past its MR, or wrapping
            i = rng.randrange(len(sges))
            mr = s.mrs[0]
            sges[i] = rng.choice([(mr.addr + mr.buf.size - 1, 2, mr.lkey), (mr.addr - 1, 1, mr.lkey),
                                  (2**64 - 1, 2, mr.lkey), (mr.addr, 0xFFFFFFFF, mr.lkey)])
        elif how == 5:  # write or atomic on memory it may only read, or not touch at all
            op = rng.choice([WR["RDMA_WRITE"], WR["RDMA_WRITE_WITH_IMM"], WR["ATOMIC_FETCH_AND_ADD"],
                             WR["ATOMIC_CMP_AND_SWP"]])
            rkey, base, _ = rng.choice(victim_keys[:2])
            remote = base + rng.randrange(MR_SIZE // 8) * 8
            length = 8
            sges, nsge, payload, flags = [(s.mrs[0].addr, 8, s.mrs[0].lkey)], 1, b"", flags & ~SEND_INLINE
        elif how == 6:  # read of memory that allows no remote access
            op, (rkey, base, _) = WR["RDMA_READ"], victim_keys[1]
            remote, sges, nsge, payload, flags = base, [(s.mrs[0].addr, 64, s.mrs[0].lkey)], 1, b"", \
                flags & ~SEND_INLINE
        elif how == 7:  # remote range at, past or around the edges of the victim's MRs
            rkey, base, size = rng.choice(victim_keys)
            remote = rng.choice([base - 1, base + size - length + 1, base + size, 2**64 - max(length, 1), 0])
        elif how == 8:  # atomics misaligned, or of the wrong size
            op = rng.choice([WR["ATOMIC_FETCH_AND_ADD"], WR["ATOMIC_CMP_AND_SWP"]])
            rkey, base, size = victim_keys[2]
            remote = base + rng.choice([1, 4, 7, size - 4])
            sges, nsge = [(s.mrs[0].addr, rng.choice([8, 4, 16]), s.mrs[0].lkey)], 1
            payload, flags = b"", flags & ~SEND_INLINE
        elif how == 9:  # a key of its own memory as the remote key of the victim's (and the reverse)
            rkey = rng.choice([s.mrs[0].rkey, s.mrs[0].lkey, victim_keys[2][0] ^ 1, rng.getrandbits(32)])
        elif how == 10:  # a message larger than any MR, or than the receive buffer
            sges = [(s.mrs[0].addr, MR_SIZE, s.mrs[0].lkey)] * 4
            nsge, payload, flags = 4, b"", flags & ~SEND_INLINE
        elif how == 11:  # SGE count says more than the WQE holds
            nsge = rng.randrange(len(sges) + 1, MAX_SGE + 1)
        elif how == 12:  # reserved bits and every flag
            flags = rng.getrandbits(8)
        else:  # random bytes in place of the header's numbers
            op, flags, nsge = rng.getrandbits(8), rng.getrandbits(8), rng.getrandbits(8)
            rkey, remote = rng.getrandbits(32), rng.getrandbits(64)
        return op, flags, nsge, rkey, remote, length, sges, payload

    def work_requests(self, s: AttackerState) -> None:
        """A burst on some of its QPs, each with at most one hostile WQE (the QP's later WQEs flush after it)."""
        rng = self.rng
        chosen = rng.sample(s.qps, rng.randrange(1, len(s.qps) + 1))
        posted: list[dict[str, Any]] = []
        garbage_qps = []
        for qp, peer in chosen:
            count = rng.randrange(1, SQ_DEPTH + 1)
            bad = rng.randrange(count) if rng.randrange(2) else -1
            wqes = [self._wqe(s, qp, i == bad) for i in range(count)]
            for wqe in wqes:
                s.verbs.put_wqe(qp.sq, wqe)
            if peer.gid == GID["vm0"]:  # receives for its own sends
                room = RQ_DEPTH - ((qp.rq.prod - ring_header(s.verbs, qp.buf.gpa, 4)) & 0xFFFFFFFF)
                if 0 < room <= RQ_DEPTH:
                    mr = s.mrs[0]
                    post_receives(s.verbs, qp.rq, room, [(mr.addr, MR_SIZE, mr.lkey)])
            garbage = rng.randrange(100) == 0
            doorbell = rng.getrandbits(32) if garbage else qp.sq.prod & 0xFFFFFFFF
            if garbage:
                garbage_qps.append(qp)
            s.verbs.ring(qp.sq.db, doorbell)
            self.counts.wqes += count
            posted.append({"qp": s.qps.index((qp, peer)), "wqes": [w.hex() for w in wqes], "doorbell": doorbell})
        self.record.append({"work requests": posted})
        if s.verbs.parked():
            s.fe.queues[abi.const("VRDMA_QUEUE_WAKE")].notify()
        self._settle(s, [qp for qp, _ in chosen], garbage_qps)

    def _settle(self, s: AttackerState, qps: list[SimQp], garbage: list[SimQp]) -> None:
        """Wait for the engine to take the burst (run or flush it); bring the QPs that failed back to RTS."""
        deadline = time.monotonic() + DRAIN_DEADLINE
        waiting = [qp for qp in qps if qp not in garbage]
        while waiting and time.monotonic() < deadline:
            waiting = [qp for qp in waiting if ring_header(s.verbs, qp.buf.gpa, 0) != qp.sq.prod & 0xFFFFFFFF]
            if waiting:
                time.sleep(0.0002)  # the engine runs in another process: poll its progress until the deadline
        completions = drain_cq(s.verbs, s.cq)
        failed = {qpn for status, qpn in completions if status != 0}
        broken = [qp for qp in qps if qp.qpn in failed or qp in waiting or qp in garbage]
        if broken and not reconnect(s.fe, s.verbs, [(qp, s.peer_of(qp)) for qp in broken], ATTACKER_TIMEOUT):
            s.broken = True

