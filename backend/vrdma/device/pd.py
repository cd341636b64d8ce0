"""Protection domains: the objects of one PD (MRs, QPs, SRQs, AHs) keep it alive (BUSY until they go)."""

from __future__ import annotations

from dataclasses import dataclass

from vrdma.device.table import ObjectTable
from vrdma.device.ucontext import UserContexts


@dataclass
class Pd:
    ucontext: int
    refs: int = 0


class ProtectionDomains(ObjectTable[Pd]):
    def __init__(self, limit: int, ucontexts: UserContexts) -> None:
        super().__init__("pd", "PD", limit)
        self.ucontexts = ucontexts

    def alloc(self, ucontext: int) -> int:
        ctx = self.ucontexts.get(ucontext) if ucontext else None
        self.check_room()
        handle = self.add(Pd(ucontext))
        if ctx is not None:
            ctx.pds.add(handle)
        return handle

    def dealloc(self, handle: int) -> None:
        pd = self.remove_unused(handle, "objects (MRs, QPs, SRQs, AHs)")
        ctx = self.ucontexts.pool.get(pd.ucontext)
        if ctx is not None:
            ctx.pds.discard(handle)

    def release(self, handle: int) -> None:
        """An object of PD ``handle`` went."""
        self.get(handle).refs -= 1
