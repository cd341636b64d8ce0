"""Completion queues: a ring of CQEs in the guest's memory with a doorbell slot for arming, and moderation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vrdma.device import rings
from vrdma.device.seat import EngineSeat, refused_as_status
from vrdma.device.status import CommandFailed, Status
from vrdma.device.table import EngineObjectTable
from vrdma.device.ucontext import UserContexts
from vrdma.engine.api import CqConfig


@dataclass
class Cq:
    ucontext: int
    slot: int
    entries: int
    db: int  # doorbell index of its arm slot
    refs: int = 0  # QPs and XRC SRQs completing on it


class CompletionQueues(EngineObjectTable[Cq]):
    def __init__(self, seat: EngineSeat, limit: int, max_cqe: int, ucontexts: UserContexts) -> None:
        super().__init__("cq", "CQ", limit, seat)
        self.max_cqe = max_cqe
        self.ucontexts = ucontexts

    def create(self, req: Any) -> tuple[int, int]:
        ctx = self.ucontexts.for_queue(int(req.ucontext), "a CQ")
        entries = int(req.entries)
        if not rings.pow2(entries) or entries > self.max_cqe:
            raise CommandFailed(Status.INVALID, f"CQ of {entries} entries (a power of two up to {self.max_cqe})")
        pages = rings.page_list(req.ring, rings.cq_ring_pages(entries), "the CQ ring")
        self.check_room()
        dbs = self.ucontexts.take_dbs(ctx, 1)
        cq = Cq(int(req.ucontext), 0, entries, dbs[0])
        handle = self.add(cq)
        config: CqConfig = {"handle": handle, "entries": entries, "db": cq.db, "ring": pages}
        self.create_in_engine(handle, self.seat.engine.create_cq, cq.slot, config,
                              undo=lambda: self.ucontexts.give_dbs(ctx, dbs))
        self.ucontexts.queue_created(ctx)
        return handle, cq.db

    def moderate(self, handle: int, count: int, period_us: int) -> None:
        """CQ moderation: one completion event per ``count`` completions or ``period_us`` after the first."""
        cq = self.get(handle)
        with refused_as_status():
            self.seat.engine.moderate_cq(self.seat.index, cq.slot, count, period_us)

    def destroy(self, handle: int) -> None:
        cq = self.remove_unused(handle, "QPs and XRC SRQs")
        self.seat.engine.destroy_cq(self.seat.index, cq.slot)
        self.ucontexts.queue_destroyed(cq.ucontext, [cq.db])
