"""Protection domains: the objects of one PD (MRs, QPs, SRQs, AHs) keep it alive (BUSY until they go)."""

from __future__ import annotations

from dataclasses import dataclass

from vrdma.device.pool import Pool
from vrdma.device.status import CommandFailed, Status
from vrdma.device.ucontext import UserContexts


@dataclass
class Pd:
    ucontext: int
    refs: int = 0


class ProtectionDomains:
    def __init__(self, limit: int, ucontexts: UserContexts) -> None:
        self.ucontexts = ucontexts
        self.pool: Pool[Pd] = Pool("pd", limit)

    def __len__(self) -> int:
        return len(self.pool)

    def get(self, handle: int) -> Pd:
        pd = self.pool.get(handle)
        if pd is None:
            raise CommandFailed(Status.INVALID, f"no PD {handle:#x}")
        return pd

    def alloc(self, ucontext: int) -> int:
        ctx = self.ucontexts.get(ucontext) if ucontext else None
        if self.pool.full():
            raise CommandFailed(Status.NO_RESOURCES, f"all {self.pool.limit} PDs in use")
        handle = self.pool.add(Pd(ucontext))
        if ctx is not None:
            ctx.pds.add(handle)
        return handle

    def dealloc(self, handle: int) -> None:
        pd = self.get(handle)
        if pd.refs:
            raise CommandFailed(Status.BUSY, f"PD {handle:#x} still has {pd.refs} objects")
        self.pool.remove(handle)
        ctx = self.ucontexts.pool.get(pd.ucontext)
        if ctx is not None:
            ctx.pds.discard(handle)

    def release(self, handle: int) -> None:
        """An object of PD ``handle`` went."""
        self.get(handle).refs -= 1

    def clear(self) -> None:
        self.pool.clear()
