"""Memory regions and windows: REG_MR checks the request and hands the engine the page list it translates and keeps;
REREG_MR changes an MR's translation, PD or access in place; ALLOC_MR makes a fast-registration MR, which work
requests of its PD's QPs map and unmap (the engine checks those); ALLOC_MW makes a memory window, which BIND_MW work
requests point at a range of an MR (the engine checks those too). Windows and MRs share one table and key space.

An MR's lkey and rkey carry its engine slot above their low byte and random bits above and below it, so a key is
not guessable from another key; the low byte of a fast-registration MR's key is its consumer's to change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vrdma.device import abi, rings
from vrdma.device.constants import Access
from vrdma.device.pd import ProtectionDomains
from vrdma.device.seat import EngineSeat, refused_as_status
from vrdma.device.status import CommandFailed, Status
from vrdma.device.table import EngineObjectTable
from vrdma.device.ucontext import KERNEL
from vrdma.engine.api import MrConfig, PagesDesc

ACCESS_ALL = abi.const("VRDMA_ALL_ACCESS")
LOCAL_WRITE = Access.LOCAL_WRITE
REMOTE_WRITE = Access.REMOTE_WRITE
REMOTE_ATOMIC = Access.REMOTE_ATOMIC
REREG_TRANSLATION = abi.const("VRDMA_REREG_TRANSLATION")
REREG_PD = abi.const("VRDMA_REREG_PD")
REREG_ACCESS = abi.const("VRDMA_REREG_ACCESS")


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
    mw_type: int = 0  # 1 or 2: a memory window
    page_offset: int = 0

    @property
    def kind(self) -> str:
        return "memory window" if self.mw_type else "fast-registration MR" if self.max_pages else "MR"


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
                            "page_offset": 0, "iova": 0, "length": 0, "pages": rings.no_pages(),
                            "max_pages": max_pages}
        self.create_in_engine(handle, self.seat.engine.create_mr, mr.slot, config)
        pd.refs += 1
        return handle, mr.lkey

    @staticmethod
    def _check_access(access: int) -> None:
        if access & ~ACCESS_ALL:
            raise CommandFailed(Status.INVALID, f"unknown access flags {access:#x}")
        if access & (REMOTE_WRITE | REMOTE_ATOMIC) and not access & LOCAL_WRITE:
            raise CommandFailed(Status.INVALID, "remote write or atomic access needs local write access")

    def _translation(self, req: Any) -> tuple[int, int, int, PagesDesc]:
        """iova, length, page offset and page list of a REG_MR or REREG_MR request, checked."""
        length, iova, offset = int(req.length), int(req.iova), int(req.page_offset)
        if not 0 < length <= self.max_mr_size:
            raise CommandFailed(Status.INVALID, f"MR length {length} (1 to {self.max_mr_size} bytes)")
        if offset >= rings.PAGE or iova + length > 2**64:
            raise CommandFailed(Status.INVALID, f"MR at {iova:#x} (page offset {offset}) of {length} bytes")
        return iova, length, offset, rings.page_list(req.pages, rings.pages_for(offset + length), "the MR")

    def register(self, req: Any) -> tuple[int, int, int]:
        pd = self.pds.get(int(req.pd))
        access = int(req.access)
        if req.reserved:
            raise CommandFailed(Status.INVALID, "reserved field of REG_MR is not zero")
        self._check_access(access)
        iova, length, offset, pages = self._translation(req)
        self.check_room()
        mr = Mr(int(req.pd), 0, 0, 0, access, iova, length, page_offset=offset)
        handle = self.add(mr)
        mr.lkey = self.pool.key(mr.slot)
        mr.rkey = self.pool.key(mr.slot, avoid=mr.lkey)
        config: MrConfig = {"handle": handle, "pd": int(req.pd), "lkey": mr.lkey, "rkey": mr.rkey, "access": access,
                            "page_offset": offset, "iova": iova, "length": length, "pages": pages}
        self.create_in_engine(handle, self.seat.engine.create_mr, mr.slot, config)
        pd.refs += 1
        return handle, mr.lkey, mr.rkey

    def reregister(self, req: Any) -> tuple[int, int, int]:
        """REREG_MR: an MR of REG_MR gets a new translation, PD or access (flags say which); handle and keys stay."""
        handle, flags = int(req.handle), int(req.flags)
        mr = self.get(handle)
        if mr.kind != "MR":
            raise CommandFailed(Status.INVALID, f"{mr.kind} {handle:#x} cannot be reregistered")
        if req.reserved or not flags or flags & ~(REREG_TRANSLATION | REREG_PD | REREG_ACCESS):
            raise CommandFailed(Status.INVALID, f"REREG_MR flags {flags:#x} (reserved {int(req.reserved):#x})")
        pd, access, iova, length = mr.pd, mr.access, mr.iova, mr.length
        offset, pages = mr.page_offset, rings.no_pages()  # no pages: the engine keeps the MR's
        if flags & REREG_PD:
            pd = int(req.pd)
            if self.pds.get(pd).ucontext != self.pds.get(mr.pd).ucontext:
                raise CommandFailed(Status.INVALID, f"PD {pd:#x} belongs to another context than MR {handle:#x}")
        if flags & REREG_ACCESS:
            access = int(req.access)
            self._check_access(access)
        if flags & REREG_TRANSLATION:
            iova, length, offset, pages = self._translation(req)
        config: MrConfig = {"handle": handle, "pd": pd, "lkey": mr.lkey, "rkey": mr.rkey, "access": access,
                            "page_offset": offset, "iova": iova, "length": length, "pages": pages}
        with refused_as_status():
            self.seat.engine.rereg_mr(self.seat.index, mr.slot, config)
        if pd != mr.pd:
            self.pds.get(pd).refs += 1
            self.pds.release(mr.pd)
        mr.pd, mr.access, mr.iova, mr.length, mr.page_offset = pd, access, iova, length, offset
        return handle, mr.lkey, mr.rkey

    def allocate_window(self, req: Any) -> tuple[int, int]:
        """ALLOC_MW: a memory window of a PD, type 1 or 2, bound to nothing; its handle and its rkey."""
        pd = self.pds.get(int(req.pd))
        mw_type = int(req.type)
        if mw_type not in (1, 2):
            raise CommandFailed(Status.INVALID, f"memory window type {mw_type} (1 or 2)")
        self.check_room("MRs and memory windows")
        mw = Mr(int(req.pd), 0, 0, 0, 0, 0, 0, mw_type=mw_type)
        handle = self.add(mw)
        mw.rkey = self.pool.key(mw.slot)
        config: MrConfig = {"handle": handle, "pd": mw.pd, "lkey": 0, "rkey": mw.rkey, "access": 0,
                            "page_offset": 0, "iova": 0, "length": 0, "pages": rings.no_pages(),
                            "mw_type": mw_type}
        self.create_in_engine(handle, self.seat.engine.create_mr, mw.slot, config)
        pd.refs += 1
        return handle, mw.rkey

    def deregister(self, handle: int) -> None:
        """DEREG_MR: an MR of either kind."""
        self._remove(handle, windows=False)

    def deallocate_window(self, handle: int) -> None:
        """DEALLOC_MW."""
        self._remove(handle, windows=True)

    def _remove(self, handle: int, windows: bool) -> None:
        mr = self.pool.get(handle)
        if mr is None or bool(mr.mw_type) != windows:
            raise CommandFailed(Status.INVALID, f"no {'memory window' if windows else 'MR'} {handle:#x}")
        self.pool.remove(handle)
        self.seat.engine.destroy_mr(self.seat.index, mr.slot)
        self.pds.release(mr.pd)
