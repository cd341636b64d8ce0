"""Per-VM object tables: handles the guest names objects by, with limits and ownership.

Handles are random non-zero 32-bit values, never reused while the VM's device lives, so a stale or forged handle
from a guest finds nothing rather than someone else's object.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


class HandleTable(Generic[T]):
    def __init__(self, kind: str, limit: int) -> None:
        self.kind = kind
        self.limit = limit
        self.objects: dict[int, T] = {}
        self._issued: set[int] = set()

    def __len__(self) -> int:
        return len(self.objects)

    def full(self) -> bool:
        return len(self.objects) >= self.limit

    def add(self, obj: T) -> int:
        while True:
            handle = secrets.randbits(32)
            if handle and handle not in self._issued:
                break
        self._issued.add(handle)
        self.objects[handle] = obj
        return handle

    def get(self, handle: int) -> T | None:
        return self.objects.get(handle)

    def remove(self, handle: int) -> T | None:
        return self.objects.pop(handle, None)

    def clear(self) -> None:
        self.objects.clear()


@dataclass(frozen=True)
class Gid:
    raw: bytes
    type: int

    def __str__(self) -> str:
        words = [self.raw[i:i + 2].hex() for i in range(0, 16, 2)]
        return ":".join(words)
