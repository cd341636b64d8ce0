"""Per-VM object tables: handles the guest names objects by, with limits and ownership.

A handle is a table slot in its low bits and that slot's generation above them. Each reuse of a slot advances
its generation, so a stale or forged handle finds nothing (not a newer object in the same slot) until that slot has
been reused 2^(32 - slot bits) times, and the table's memory is bounded by its limit whatever a guest creates and
destroys (an earlier table remembered every handle it had issued: a guest looping on create/destroy grew the
backend without bound). Generations start at random values, so handles of one device life do not repeat the last.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

HANDLE_BITS = 32


class HandleTable(Generic[T]):
    def __init__(self, kind: str, limit: int) -> None:
        if not 0 < limit < 1 << (HANDLE_BITS - 1):
            raise ValueError(f"{kind} table of {limit} entries")
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
        """Store ``obj`` under a new handle. The caller checks full() first (a full table is a bug here)."""
        if self._free:
            slot = self._free.pop()
            generation = (self._generation[slot] + 1) & self.generation_mask or 1  # 0 would make handle 0
        elif self._never_used < self.limit:
            slot = self._never_used
            self._never_used += 1
            generation = secrets.randbits(HANDLE_BITS - self.slot_bits) or 1
            self._generation.append(0)
        else:
            raise RuntimeError(f"{self.kind} table full ({self.limit} entries): check full() before add()")
        self._generation[slot] = generation
        handle = generation << self.slot_bits | slot
        self.objects[handle] = obj
        return handle

    def get(self, handle: int) -> T | None:
        return self.objects.get(handle)

    def remove(self, handle: int) -> T | None:
        obj = self.objects.pop(handle, None)
        if obj is not None:
            self._free.append(handle & ((1 << self.slot_bits) - 1))
        return obj

    def clear(self) -> None:
        """Forget every object; slots keep their generations, so handles from before stay stale."""
        self._free.extend(handle & ((1 << self.slot_bits) - 1) for handle in self.objects)
        self.objects.clear()


@dataclass(frozen=True)
class Gid:
    raw: bytes
    type: int

    def __str__(self) -> str:
        words = [self.raw[i:i + 2].hex() for i in range(0, 16, 2)]
        return ":".join(words)
