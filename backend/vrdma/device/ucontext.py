"""User contexts: one per process that opened the device, each with doorbell pages of its own; and the kernel's.

A context starts with one page of the doorbell region (mapped into that process only) and hands the slots of its
pages to the queues it creates, taking another page from the region when they are full: a process is bounded by
the device's object limits, not by one page's 1022 slots. A page stays with its context until the context goes,
so a page another process may still map never carries someone else's queues. A context cannot go while it holds
PDs or queues (BUSY). The guest kernel's own consumers are context 0: always there, starting at doorbell page 1
(mapped into the kernel only), and the one context whose work requests may use the local DMA lkey.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

from vrdma.device import abi
from vrdma.device.status import CommandFailed, Status
from vrdma.device.table import ObjectTable

DB_SLOTS = abi.const("VRDMA_DB_SLOTS")
DB_SLOT_ALIVE = abi.const("VRDMA_DB_SLOT_ALIVE")
KERNEL = 0  # the context handle of the guest kernel's own objects
KERNEL_PAGE = abi.const("VRDMA_KERNEL_DOORBELL_PAGE")
FIRST_USER_PAGE = abi.const("VRDMA_FIRST_USER_DOORBELL_PAGE")  # the pages before it: the header and the kernel's


def page_indexes(page: int) -> list[int]:
    """The doorbell indexes a page gives queues, last first (they are taken from the end): slot 0 (parked) and
    the last slot (alive) are the device's."""
    return [page * DB_SLOTS + slot for slot in range(DB_SLOT_ALIVE - 1, 0, -1)]


@dataclass
class UserContext:
    pages: list[int]  # its doorbell pages, the first one first (the one ALLOC_UCONTEXT answered)
    pds: set[int] = field(default_factory=set)
    queues: int = 0
    free_dbs: list[int] = field(default_factory=list)  # doorbell indexes of its pages no queue has

    @property
    def doorbell_page(self) -> int:
        return self.pages[0]


class UserContexts(ObjectTable[UserContext]):
    def __init__(self, doorbell_pages: int, set_alive: Callable[[int, bool], None]) -> None:
        """``set_alive(page, alive)`` marks a doorbell page as known to the device (the provider flushes on 0)."""
        super().__init__("ucontext", "user context", doorbell_pages - FIRST_USER_PAGE)
        self.doorbell_pages = doorbell_pages
        self.set_alive = set_alive
        self._free_pages = self._all_pages()
        self.kernel = self._new_kernel_context()

    def _all_pages(self) -> list[int]:
        return list(range(FIRST_USER_PAGE, self.doorbell_pages))  # a heap: the lowest free page is taken first

    def _take_page(self, ctx: UserContext | None) -> int:
        if not self._free_pages:
            raise CommandFailed(Status.NO_RESOURCES, f"all {self.doorbell_pages - FIRST_USER_PAGE} pages of the "
                                                     f"doorbell region in use")
        page = heapq.heappop(self._free_pages)
        if ctx is not None:
            ctx.pages.append(page)
            ctx.free_dbs[:0] = page_indexes(page)  # under the free indexes left: those go first
        self.set_alive(page, True)
        return page

    def for_queue(self, handle: int, what: str) -> UserContext:
        """The context a queue is created in: a user context, or the kernel's (handle 0)."""
        return self.kernel if handle == KERNEL else self.get(handle)

    def alloc(self) -> tuple[int, int]:
        if self.pool.full():
            raise CommandFailed(Status.NO_RESOURCES, f"all {self.pool.limit} user contexts in use")
        page = self._take_page(None)
        handle = self.add(UserContext([page], free_dbs=page_indexes(page)))
        return handle, page

    def dealloc(self, handle: int) -> None:
        ctx = self.get(handle)
        if ctx.pds or ctx.queues:
            raise CommandFailed(Status.BUSY, f"user context {handle:#x} still has {len(ctx.pds)} PDs and "
                                             f"{ctx.queues} queues")
        self.pool.remove(handle)
        self._give_pages(ctx)

    def _give_pages(self, ctx: UserContext) -> None:
        for page in ctx.pages:
            self.set_alive(page, False)
        for page in ctx.pages:
            heapq.heappush(self._free_pages, page)

    def take_dbs(self, ctx: UserContext, count: int) -> list[int]:
        """``count`` doorbell indexes for one queue's rings, from the context's pages or a new one; all or none."""
        while len(ctx.free_dbs) < count:
            self._take_page(ctx)
        return [ctx.free_dbs.pop() for _ in range(count)]

    def give_dbs(self, ctx: UserContext, dbs: list[int]) -> None:
        ctx.free_dbs.extend(dbs)

    def queue_created(self, ctx: UserContext) -> None:
        ctx.queues += 1

    def queue_destroyed(self, handle: int, dbs: list[int]) -> None:
        """A queue of context ``handle`` went: its doorbell slots come back (the context may be gone already)."""
        ctx = self.kernel if handle == KERNEL else self.pool.get(handle)
        if ctx is not None:
            self.give_dbs(ctx, dbs)
            ctx.queues -= 1

    def clear(self) -> None:
        """Forget every user context; the kernel's starts afresh (the device zeroed the region)."""
        super().clear()
        self._free_pages = self._all_pages()
        self.kernel = self._new_kernel_context()

    def _new_kernel_context(self) -> UserContext:
        self.set_alive(KERNEL_PAGE, True)
        return UserContext([KERNEL_PAGE], free_dbs=page_indexes(KERNEL_PAGE))

    def doorbell_pages_held(self) -> list[int]:
        """Every page the user contexts hold (the kernel's not included)."""
        return sorted(page for ctx in self.pool.objects.values() for page in ctx.pages)
