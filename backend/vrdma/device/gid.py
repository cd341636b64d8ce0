"""The GID table of a device's port: the guest reports its GIDs (ADD_GID, DEL_GID), the fabric routes by them."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from vrdma.device.constants import GidType
from vrdma.device.status import CommandFailed, Status

log = logging.getLogger(__name__)

GID_TYPES = tuple(GidType)


@dataclass(frozen=True)
class Gid:
    raw: bytes
    type: int

    def __str__(self) -> str:
        words = [self.raw[i:i + 2].hex() for i in range(0, 16, 2)]
        return ":".join(words)


class GidTable:
    def __init__(self, owner: str, size: int) -> None:
        self.owner = owner
        self.size = size
        self.entries: dict[int, Gid] = {}

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, index: int) -> bool:
        return index in self.entries

    def add(self, index: int, raw: bytes, gid_type: int) -> None:
        if index >= self.size:
            raise CommandFailed(Status.INVALID, f"GID index {index} (the table has {self.size})")
        if gid_type not in GID_TYPES:
            raise CommandFailed(Status.INVALID, f"GID type {gid_type}")
        self.entries[index] = Gid(raw, gid_type)
        log.info("%s: GID %d = %s (RoCE v%d)", self.owner, index, self.entries[index], gid_type)

    def remove(self, index: int) -> None:
        gid = self.entries.pop(index, None)
        if gid is None:
            raise CommandFailed(Status.INVALID, f"GID index {index} is not set")
        log.info("%s: GID %d removed (%s)", self.owner, index, gid)

    def holds(self, raw: bytes) -> bool:
        return any(gid.raw == raw for gid in self.entries.values())

    def clear(self) -> None:
        self.entries.clear()

    def snapshot(self) -> dict[str, str]:
        return {str(index): str(gid) for index, gid in sorted(self.entries.items())}
