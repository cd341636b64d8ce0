"""Memory regions: REG_MR checks the request and hands the engine the page list it translates and keeps; ALLOC_MR
makes a fast-registration MR, which work requests of its PD's QPs map and unmap (the engine checks those).

An MR's lkey and rkey carry its engine slot above their low byte and random bits above and below it, so a key is
not guessable from another key; the low byte of a fast-registration MR's key is its consumer's to change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vrdma.device import abi, rings
from vrdma.device.constants import Access
from vrdma.device.pd import ProtectionDomains
from vrdma.device.seat import EngineSeat
from vrdma.device.status import CommandFailed, Status
from vrdma.device.table import EngineObjectTable
from vrdma.device.ucontext import KERNEL
from vrdma.engine.api import MrConfig

ACCESS_ALL = abi.const("VRDMA_ALL_ACCESS")
LOCAL_WRITE = Access.LOCAL_WRITE
REMOTE_WRITE = Access.REMOTE_WRITE
REMOTE_ATOMIC = Access.REMOTE_ATOMIC


@dataclass
class Mr:
    pd: int
    slot: int
    lkey: int
    rkey: int
    access: int
    iova: int
    length: int
    max_pages: int = 0  # a fast-registration MR's room


class MemoryRegions(EngineObjectTable[Mr]):
    def __init__(self, seat: EngineSeat, limit: int, max_mr_size: int, max_fast_reg_pages: int,
                 pds: ProtectionDomains) -> None:
        super().__init__("mr", "MR", limit, seat)
        self.max_mr_size = max_mr_size
        self.max_fast_reg_pages = max_fast_reg_pages
        self.pds = pds

    def allocate(self, req: Any) -> tuple[int, int]:
        """ALLOC_MR: a fast-registration MR of a PD with room for ``max_pages`` pages; its handle and its key."""
        pd = self.pds.get(int(req.pd))
        max_pages = int(req.max_pages)
        if pd.ucontext != KERNEL:
            # Its pages are guest-physical addresses a REG_MR work request names: only the guest's kernel may.
            raise CommandFailed(Status.INVALID, "fast-registration MRs are the kernel's (a PD of context 0)")
        if not 0 < max_pages <= self.max_fast_reg_pages:
            raise CommandFailed(Status.INVALID, f"a fast-registration MR of {max_pages} pages (1 to "
                                                f"{self.max_fast_reg_pages})")
        self.check_room()
        mr = Mr(int(req.pd), 0, 0, 0, 0, 0, 0, max_pages)
        handle = self.add(mr)
        mr.lkey = mr.rkey = self.pool.key(mr.slot)
        config: MrConfig = {"handle": handle, "pd": mr.pd, "lkey": mr.lkey, "rkey": mr.rkey, "access": 0,
                            "page_offset": 0, "iova": 0, "length": 0, "pages": {"addr": 0, "npages": 0, "levels": 0},
                            "max_pages": max_pages}
        self.create_in_engine(handle, self.seat.engine.create_mr, mr.slot, config)
        pd.refs += 1
        return handle, mr.lkey

    def register(self, req: Any) -> tuple[int, int, int]:
        pd = self.pds.get(int(req.pd))
        access, length, iova, offset = int(req.access), int(req.length), int(req.iova), int(req.page_offset)
        if req.reserved:
            raise CommandFailed(Status.INVALID, "reserved field of REG_MR is not zero")
        if access & ~ACCESS_ALL:
            raise CommandFailed(Status.INVALID, f"unknown access flags {access:#x}")
        if access & (REMOTE_WRITE | REMOTE_ATOMIC) and not access & LOCAL_WRITE:
            raise CommandFailed(Status.INVALID, "remote write or atomic access needs local write access")
        if not 0 < length <= self.max_mr_size:
            raise CommandFailed(Status.INVALID, f"MR length {length} (1 to {self.max_mr_size} bytes)")
        if offset >= rings.PAGE or iova + length > 2**64:
            raise CommandFailed(Status.INVALID, f"MR at {iova:#x} (page offset {offset}) of {length} bytes")
        pages = rings.page_list(req.pages, rings.pages_for(offset + length), "the MR")
        self.check_room()
        mr = Mr(int(req.pd), 0, 0, 0, access, iova, length)
        handle = self.add(mr)
        mr.lkey = self.pool.key(mr.slot)
        mr.rkey = self.pool.key(mr.slot, avoid=mr.lkey)
        config: MrConfig = {"handle": handle, "pd": int(req.pd), "lkey": mr.lkey, "rkey": mr.rkey, "access": access,
                            "page_offset": offset, "iova": iova, "length": length, "pages": pages}
        self.create_in_engine(handle, self.seat.engine.create_mr, mr.slot, config)
        pd.refs += 1
        return handle, mr.lkey, mr.rkey

    def deregister(self, handle: int) -> None:
        mr = self.pool.remove(handle)
        if mr is None:
            raise CommandFailed(Status.INVALID, f"no MR {handle:#x}")
        self.seat.engine.destroy_mr(self.seat.index, mr.slot)
        self.pds.release(mr.pd)
