"""Shared receive queues: a ring of receive WQEs in the guest's memory that QPs of the same context draw from.

An XRC SRQ belongs to an XRC domain as well, completes its receives on a CQ of its own, and has an SRQ number:
XRC initiators name it by that, and the XRC target QPs of its domain (of any context) deliver into it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vrdma.device import abi, rings
from vrdma.device.cq import CompletionQueues
from vrdma.device.pd import ProtectionDomains
from vrdma.device.pool import WireNumbers
from vrdma.device.seat import EngineSeat, refused_as_status
from vrdma.device.status import CommandFailed, Status
from vrdma.device.table import EngineObjectTable
from vrdma.device.ucontext import KERNEL, UserContexts
from vrdma.device.xrcd import XrcDomains
from vrdma.engine.api import SRQ_KERNEL, SrqConfig

SRQ_MAX_WR = abi.const("VRDMA_SRQ_MAX_WR")
SRQ_LIMIT = abi.const("VRDMA_SRQ_LIMIT")


@dataclass
class Srq:
    ucontext: int
    pd: int
    slot: int
    depth: int
    max_sge: int
    db: int  # doorbell index of its producer index
    refs: int = 0  # QPs drawing from it (an XRC SRQ has none: its domain's targets find it by number)
    xrcd: int = 0  # an XRC SRQ's domain, its CQ and its number
    cq: int = 0
    srqn: int = 0


class SharedReceiveQueues(EngineObjectTable[Srq]):
    def __init__(self, seat: EngineSeat, limit: int, max_wr: int, max_sge: int, ucontexts: UserContexts,
                 pds: ProtectionDomains, cqs: CompletionQueues, xrcds: XrcDomains) -> None:
        super().__init__("srq", "SRQ", limit, seat)
        self.max_wr = max_wr
        self.max_sge = max_sge
        self.ucontexts = ucontexts
        self.pds = pds
        self.cqs = cqs
        self.xrcds = xrcds
        self.numbers = WireNumbers(self.pool.slot_bits)

    def create(self, req: Any) -> tuple[int, int, int]:
        ctx = self.ucontexts.for_queue(int(req.ucontext), "an SRQ")
        pd = self.pds.in_context(int(req.pd), int(req.ucontext))
        xrcd = self.xrcds.get(int(req.xrcd)) if req.xrcd else None
        cq = self.cqs.in_context(int(req.cq), int(req.ucontext)) if xrcd is not None else None
        if xrcd is None and req.cq:
            raise CommandFailed(Status.INVALID, "a basic SRQ has no CQ of its own (its QPs' receive CQs take it)")
        depth, stride, max_sge, limit = int(req.depth), int(req.stride), int(req.max_sge), int(req.srq_limit)
        if not rings.pow2(depth) or depth > self.max_wr:
            raise CommandFailed(Status.INVALID, f"SRQ depth {depth}")
        if not rings.recv_stride_ok(stride, max_sge) or max_sge > self.max_sge:
            raise CommandFailed(Status.INVALID, f"SRQ stride {stride} for {max_sge} SGEs")
        if limit >= depth:
            raise CommandFailed(Status.INVALID, f"SRQ limit {limit} is not below its depth {depth}")
        pages = rings.page_list(req.ring, rings.srq_ring_pages(depth, stride), "the SRQ ring")
        self.check_room()
        dbs = self.ucontexts.take_dbs(ctx, 1)
        srq = Srq(int(req.ucontext), int(req.pd), 0, depth, max_sge, dbs[0], xrcd=int(req.xrcd), cq=int(req.cq))
        handle = self.add(srq)
        if xrcd is not None:
            srq.srqn = self.numbers.number(srq.slot)
        config: SrqConfig = {"handle": handle, "pd": int(req.pd), "depth": depth, "stride": stride,
                              "max_sge": max_sge, "limit": limit, "db": srq.db,
                              "flags": SRQ_KERNEL if srq.ucontext == KERNEL else 0, "xrcd": srq.xrcd,
                              "cq": cq.slot if cq is not None else 0, "srqn": srq.srqn, "ring": pages}
        self.create_in_engine(handle, self.seat.engine.create_srq, srq.slot, config,
                              undo=lambda: self.ucontexts.give_dbs(ctx, dbs))
        pd.refs += 1
        if xrcd is not None and cq is not None:
            xrcd.refs += 1
            cq.refs += 1
        self.ucontexts.queue_created(ctx)
        return handle, srq.db, srq.srqn

    def modify(self, req: Any) -> None:
        srq = self.get(int(req.handle))
        mask = int(req.attr_mask)
        if mask & SRQ_MAX_WR:
            raise CommandFailed(Status.NOT_SUPPORTED, "resizing an SRQ is not supported")
        if mask & ~SRQ_LIMIT:
            raise CommandFailed(Status.INVALID, f"unknown SRQ attribute bits {mask:#x}")
        if mask and int(req.srq_limit) >= srq.depth:
            raise CommandFailed(Status.INVALID, f"SRQ limit {int(req.srq_limit)} is not below {srq.depth}")
        if mask:
            with refused_as_status():
                self.seat.engine.set_srq_limit(self.seat.index, srq.slot, int(req.srq_limit))

    def query(self, handle: int) -> tuple[int, int, int]:
        srq = self.get(handle)
        return srq.depth, srq.max_sge, self.seat.engine.srq_limit(self.seat.index, srq.slot)

    def destroy(self, handle: int) -> None:
        srq = self.remove_unused(handle, "QPs")
        self.seat.engine.destroy_srq(self.seat.index, srq.slot)
        self.pds.release(srq.pd)
        if srq.xrcd:
            self.xrcds.release(srq.xrcd)
            self.cqs.get(srq.cq).refs -= 1
        self.ucontexts.queue_destroyed(srq.ucontext, [srq.db])
