"""User contexts: one per process that opened the device, each with its own doorbell page; and the kernel's.

A context owns a page of the doorbell region (mapped into that process only) and hands the slots of that page to
the queues it creates. It cannot go while it holds PDs or queues (BUSY). The guest kernel's own consumers are
context 0: always there, with doorbell page 1 (mapped into the kernel only), and the one context whose work requests
may use the local DMA lkey.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from vrdma.device import abi
from vrdma.device.pool import FreeSlots
from vrdma.device.status import CommandFailed, Status
from vrdma.device.table import ObjectTable

DB_SLOTS = abi.const("VRDMA_DB_SLOTS")
DB_SLOT_ALIVE = abi.const("VRDMA_DB_SLOT_ALIVE")
KERNEL = 0  # the context handle of the guest kernel's own objects
KERNEL_PAGE = abi.const("VRDMA_KERNEL_DOORBELL_PAGE")
FIRST_USER_PAGE = abi.const("VRDMA_FIRST_USER_DOORBELL_PAGE")  # the pages before it: the header and the kernel's


@dataclass
class UserContext:
    doorbell_page: int
    pds: set[int] = field(default_factory=set)
    queues: int = 0
    # Slot 0 (parked) and the last slot (alive) are the device's; the queues get the ones between.
    slots: FreeSlots = field(default_factory=lambda: FreeSlots(DB_SLOT_ALIVE, first=1))

    def take_slot(self) -> int:
        slot = self.slots.take()
        if slot is None:
            raise CommandFailed(Status.NO_RESOURCES, f"all {DB_SLOTS - 1} doorbell slots of the context in use")
        return slot

    def give_slots(self, slots: list[int]) -> None:
        for slot in slots:
            self.slots.give(slot)


class UserContexts(ObjectTable[UserContext]):
    def __init__(self, doorbell_pages: int, set_alive: Callable[[int, bool], None]) -> None:
        """``set_alive(page, alive)`` marks a doorbell page as known to the device (the provider flushes on 0)."""
        super().__init__("ucontext", "user context", doorbell_pages - FIRST_USER_PAGE)
        self.doorbell_pages = doorbell_pages
        self.set_alive = set_alive
        self.kernel = self._new_kernel_context()

    def for_queue(self, handle: int, what: str) -> UserContext:
        """The context a queue is created in: a user context, or the kernel's (handle 0)."""
        return self.kernel if handle == KERNEL else self.get(handle)

    def alloc(self) -> tuple[int, int]:
        used = {ctx.doorbell_page for ctx in self.pool.objects.values()}
        free = next((page for page in range(FIRST_USER_PAGE, self.doorbell_pages) if page not in used), None)
        if free is None or self.pool.full():
            raise CommandFailed(Status.NO_RESOURCES,
                                f"all {self.doorbell_pages - FIRST_USER_PAGE} user doorbell pages in use")
        handle = self.add(UserContext(free))
        self.set_alive(free, True)
        return handle, free

    def dealloc(self, handle: int) -> None:
        ctx = self.get(handle)
        if ctx.pds or ctx.queues:
            raise CommandFailed(Status.BUSY, f"user context {handle:#x} still has {len(ctx.pds)} PDs and "
                                             f"{ctx.queues} queues")
        self.pool.remove(handle)
        self.set_alive(ctx.doorbell_page, False)

    def queue_created(self, ctx: UserContext) -> None:
        ctx.queues += 1

    def queue_destroyed(self, handle: int, db_slots: list[int]) -> None:
        """A queue of context ``handle`` went: its doorbell slots come back (the context may be gone already)."""
        ctx = self.kernel if handle == KERNEL else self.pool.get(handle)
        if ctx is not None:
            ctx.give_slots(db_slots)
            ctx.queues -= 1

    def clear(self) -> None:
        """Forget every user context; the kernel's starts afresh (the device zeroed its page)."""
        super().clear()
        self.kernel = self._new_kernel_context()

    def _new_kernel_context(self) -> UserContext:
        self.set_alive(KERNEL_PAGE, True)
        return UserContext(KERNEL_PAGE)

    def doorbell_pages_held(self) -> list[int]:
        return sorted(ctx.doorbell_page for ctx in self.pool.objects.values())
