"""What every object kind's table shares: its pool, a lookup that fails the command naming the kind, a check for
room, and the creation of the object's engine side with its rollback. The kind modules (mr, cq, srq, qp, ...)
add only their own rules."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from vrdma.device.pool import Pool
from vrdma.device.seat import EngineSeat, refused_as_status
from vrdma.device.status import CommandFailed, Status

T = TypeVar("T")
C = TypeVar("C")  # an engine configuration (vrdma.engine.api)


class ObjectTable(Generic[T]):
    def __init__(self, kind: str, what: str, limit: int) -> None:
        """``kind``: the pool's name (counters); ``what``: how a message names one object ("CQ", "user context")."""
        self.what = what
        self.pool: Pool[T] = Pool(kind, limit)

    def __len__(self) -> int:
        return len(self.pool)

    def get(self, handle: int) -> T:
        obj = self.pool.get(handle)
        if obj is None:
            raise CommandFailed(Status.INVALID, f"no {self.what} {handle:#x}")
        return obj

    def in_context(self, handle: int, ucontext: int) -> T:
        """Object ``handle``, which a queue of context ``ucontext`` may use only if it is that context's (its
        ``ucontext`` field: PDs, CQs, SRQs)."""
        obj = self.get(handle)
        if getattr(obj, "ucontext") != ucontext:  # noqa: B009 - any kind that belongs to a context
            raise CommandFailed(Status.INVALID, f"{self.what} {handle:#x} belongs to another context")
        return obj

    def check_room(self, plural: str | None = None) -> None:
        if self.pool.full():
            raise CommandFailed(Status.NO_RESOURCES, f"all {self.pool.limit} {plural or self.what + 's'} in use")

    def remove_unused(self, handle: int, users: str) -> T:
        """Take an object out unless something still uses it (BUSY): its ``refs`` count the ``users``."""
        obj = self.get(handle)
        refs = getattr(obj, "refs", 0)
        if refs:
            raise CommandFailed(Status.BUSY, f"{self.what} {handle:#x} is used by {refs} {users}")
        self.pool.remove(handle)
        return obj

    def add(self, obj: T) -> int:
        """Store a new object; one with a ``slot`` field gets its engine slot (the handle's) there."""
        handle = self.pool.add(obj)
        if hasattr(obj, "slot"):
            setattr(obj, "slot", self.pool.slot(handle))  # noqa: B010 - any kind with an engine side
        return handle

    def clear(self) -> None:
        self.pool.clear()


class EngineObjectTable(ObjectTable[T]):
    """A table of objects that also live in the data engine (MRs, CQs, SRQs, QPs): it holds the device's seat
    at the engine, and creates an object's engine side with the rollback of its handle."""

    def __init__(self, kind: str, what: str, limit: int, seat: EngineSeat) -> None:
        super().__init__(kind, what, limit)
        self.seat = seat

    def create_in_engine(self, handle: int, create: Callable[[int, int, C], None], slot: int, config: C,
                         undo: Callable[[], None] | None = None) -> None:
        """``create(seat.index, slot, config)``: the engine's side of a new object. If the engine refuses, the
        handle goes, ``undo`` gives back what the object took (doorbell slots), and the command fails with the
        engine's reason."""
        try:
            with refused_as_status():
                create(self.seat.index, slot, config)
        except CommandFailed:
            self.pool.remove(handle)
            if undo is not None:
                undo()
            raise
