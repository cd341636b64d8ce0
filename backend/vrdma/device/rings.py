"""Ring layouts as the device reads them: how many pages a queue's ring spans and how its page list must look.

The provider lays a ring out (a page of producer/consumer indices for CQ and SRQ rings, then the entries; a QP's
send and receive queues at offsets of one buffer) and the driver describes its pages with a page list. The model
refuses a command whose page list does not describe exactly the ring it creates; the engine checks the same rules
again before it reads a byte (engine.h), the two from one description each in their own language.
"""

from __future__ import annotations

from typing import Any

from vrdma.device import abi
from vrdma.device.status import CommandFailed, Status
from vrdma.engine.api import PagesDesc

PAGE = abi.const("VRDMA_PAGE_SIZE")
PBL_ENTRIES = abi.const("VRDMA_PBL_ENTRIES")
CQE = abi.sizeof("vrdma_cqe")
SEND_WQE = abi.sizeof("vrdma_send_wqe")
RECV_WQE = abi.sizeof("vrdma_recv_wqe")
SGE = abi.sizeof("vrdma_sge")


def pow2(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def pages_for(nbytes: int) -> int:
    return (nbytes + PAGE - 1) // PAGE


def cq_ring_pages(entries: int) -> int:
    """A CQ ring: one page of indices, then the CQEs."""
    return pages_for(PAGE + entries * CQE)


def srq_ring_pages(depth: int, stride: int) -> int:
    """An SRQ ring: one page of indices, then the receive WQEs."""
    return pages_for(PAGE + depth * stride)


def qp_ring_pages(sq_offset: int, sq_depth: int, sq_stride: int, rq_offset: int, rq_depth: int,
                  rq_stride: int) -> int:
    """A QP's rings: the send and receive queues at their offsets in one buffer, up to the end of the later."""
    return pages_for(max(sq_offset + sq_depth * sq_stride, rq_offset + rq_depth * rq_stride))


def send_stride_ok(stride: int, max_sge: int, max_inline: int) -> bool:
    """A send WQE slot holds the WQE header and the larger of its SGEs and its inline data."""
    return pow2(stride) and SEND_WQE + max(max_sge * SGE, max_inline) <= stride <= PAGE


def recv_stride_ok(stride: int, max_sge: int) -> bool:
    return pow2(stride) and RECV_WQE + max_sge * SGE <= stride <= PAGE


def no_pages() -> PagesDesc:
    """The page list of an object with no guest memory of its own (yet): a window, a fast-registration MR, an XRC
    target QP; or, for REREG_MR, "keep the pages you have"."""
    return {"addr": 0, "npages": 0, "levels": 0}


def page_list(ring: Any, expected: int, what: str) -> PagesDesc:
    """The page list of a ring (struct vrdma_page_list) if it describes exactly ``expected`` pages."""
    npages, levels = int(ring.npages), int(ring.levels)
    if npages != expected:
        raise CommandFailed(Status.INVALID, f"{what} spans {expected} pages, the page list has {npages}")
    if levels not in (1, 2) or (levels == 1 and npages > PBL_ENTRIES):
        raise CommandFailed(Status.INVALID, f"{what}: page list of {npages} pages with {levels} levels")
    if int(ring.addr) % PAGE:
        raise CommandFailed(Status.INVALID, f"{what}: page list address {int(ring.addr):#x} is not aligned")
    return {"addr": int(ring.addr), "npages": npages, "levels": levels}
