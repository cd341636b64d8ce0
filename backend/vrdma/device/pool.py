"""One pool per object kind: handles the guest names objects by, the engine table slot behind each, and keys.

A handle is the object's slot in its low bits and that slot's generation above them. The same slot is the
object's row in the engine's table of that kind, so a handle, its engine slot and (for MRs and QPs) the key or
QP number that carries the slot in its low bits are one allocation, not three.

Each reuse of a slot advances its generation, so a stale or forged handle finds nothing (not a newer object in
the same slot) until that slot has been reused 2^(32 - slot bits) times, and a pool's memory is bounded by its
limit whatever a guest creates and destroys (an earlier table remembered every handle it had issued: a guest
looping on create/destroy grew the backend without bound). Generations start at random values, so handles of one
device life do not repeat the last.
"""

from __future__ import annotations

import secrets
from typing import Generic, TypeVar

from vrdma.device import abi

T = TypeVar("T")

HANDLE_BITS = 32
KEY_BITS = 32
RESERVED_KEY = abi.const("VRDMA_LOCAL_DMA_LKEY")
KEY_SLOT_SHIFT = abi.const("VRDMA_KEY_SLOT_SHIFT")


class WireNumbers:
    """24-bit numbers peers name objects by (QP numbers, XRC SRQ numbers): the object's slot in the low bits and a
    rotating generation above them, so a number is not reused at once (a peer still naming the old object finds
    nothing) and the engine finds the slot without a lookup table. Generation 0 is never used: numbers 0 and 1
    (QP1, the GSI QP) stay free."""

    LIMIT = 1 << 24

    def __init__(self, slot_bits: int) -> None:
        self.slot_bits = slot_bits
        self.generations = self.LIMIT >> slot_bits
        self.generation = 1

    def number(self, slot: int) -> int:
        number = (self.generation << self.slot_bits) | slot
        self.generation = self.generation + 1 if self.generation + 1 < self.generations else 1
        return number

    def restore(self, generation: int) -> None:
        """The next generation a saved device would have given (device/state.py)."""
        if not 1 <= generation < self.generations:
            raise ValueError(f"number generation {generation} (1..{self.generations - 1})")
        self.generation = generation


class FreeSlots:
    """Free slots of a small fixed table, lowest first (a user context's doorbell slots)."""

    def __init__(self, size: int, first: int = 0) -> None:
        self._free = list(range(size - 1, first - 1, -1))

    def take(self) -> int | None:
        return self._free.pop() if self._free else None

    def give(self, slot: int) -> None:
        self._free.append(slot)


class Pool(Generic[T]):
    def __init__(self, kind: str, limit: int) -> None:
        if not 0 < limit < 1 << (HANDLE_BITS - 1):
            raise ValueError(f"{kind} pool of {limit} entries")
        self.kind = kind
        self.limit = limit
        self.slot_bits = max(1, (limit - 1).bit_length())
        self.generation_mask = (1 << (HANDLE_BITS - self.slot_bits)) - 1
        self.objects: dict[int, T] = {}
        self._free: list[int] = []       # slots given back, reused first
        self._never_used = 0             # slots >= this one have never been used
        self._generation: list[int] = []  # per used slot: the generation of its current or last handle

    def __len__(self) -> int:
        return len(self.objects)

    def full(self) -> bool:
        return len(self.objects) >= self.limit

    def add(self, obj: T) -> int:
        """Store ``obj`` under a new handle. The caller checks full() first (a full pool is a bug here)."""
        if self._free:
            slot = self._free.pop()
            generation = (self._generation[slot] + 1) & self.generation_mask or 1  # 0 would make handle 0
        elif self._never_used < self.limit:
            slot = self._never_used
            self._never_used += 1
            generation = secrets.randbits(HANDLE_BITS - self.slot_bits) or 1
            self._generation.append(0)
        else:
            raise RuntimeError(f"{self.kind} pool full ({self.limit} entries): check full() before add()")
        self._generation[slot] = generation
        handle = generation << self.slot_bits | slot
        self.objects[handle] = obj
        return handle

    def slot(self, handle: int) -> int:
        """The slot a handle names: the object's row in the engine's table of its kind."""
        return handle & ((1 << self.slot_bits) - 1)

    def get(self, handle: int) -> T | None:
        return self.objects.get(handle)

    def remove(self, handle: int) -> T | None:
        obj = self.objects.pop(handle, None)
        if obj is not None:
            self._free.append(self.slot(handle))
        return obj

    def generations(self) -> list[int]:
        """The generation of every slot used so far: what a restored pool needs so that its handles do not repeat
        those of the pool it was saved from (device/state.py)."""
        return list(self._generation)

    def restore(self, generations: list[int], objects: dict[int, T]) -> None:
        """An empty pool becomes a saved one: the generations of its used slots and its objects by handle, each
        handle naming a used slot by its current generation (ValueError saying what does not hold)."""
        if self.objects or self._generation:
            raise ValueError(f"{self.kind} pool in use")
        if len(generations) > self.limit or any(not 0 <= g <= self.generation_mask for g in generations):
            raise ValueError(f"{self.kind} pool: {len(generations)} slot generations for {self.limit} slots")
        for handle in objects:
            slot, generation = self.slot(handle), handle >> self.slot_bits
            if not 0 < handle < 1 << HANDLE_BITS or slot >= len(generations) or generation != generations[slot] or \
                    not generation:
                raise ValueError(f"{self.kind} handle {handle:#x} does not name a used slot by its generation")
        used = {self.slot(handle) for handle in objects}
        self.objects = dict(objects)
        self._generation = list(generations)
        self._never_used = len(generations)
        self._free = [slot for slot in range(len(generations) - 1, -1, -1) if slot not in used]

    def clear(self) -> None:
        """Forget every object; slots keep their generations, so handles from before stay stale."""
        self._free.extend(self.slot(handle) for handle in self.objects)
        self.objects.clear()

    def key(self, slot: int, avoid: int = -1) -> int:
        """A key naming ``slot`` (an MR's): the slot from bit KEY_SLOT_SHIFT up, random bits above it and in the
        low byte (which a fast-registration MR's consumer changes), so that one key does not reveal another. Never
        ``avoid`` and never RESERVED_KEY (the local DMA lkey, which names no object)."""
        high = KEY_BITS - KEY_SLOT_SHIFT - self.slot_bits
        while True:
            key = (secrets.randbits(high) << (KEY_SLOT_SHIFT + self.slot_bits) | slot << KEY_SLOT_SHIFT |
                   secrets.randbits(KEY_SLOT_SHIFT))
            if key not in (avoid, RESERVED_KEY):
                return key
