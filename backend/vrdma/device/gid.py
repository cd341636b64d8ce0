"""The GID table of a device's port: the guest reports its GIDs (ADD_GID, DEL_GID); the engine's GID index holds
them too, and routes connections, packets and datagrams by them."""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass

from vrdma.device.constants import GidType
from vrdma.device.seat import EngineSeat, refused_as_status
from vrdma.device.status import CommandFailed, Status
from vrdma.engine.api import MAX_GIDS

log = logging.getLogger(__name__)

GID_TYPES = tuple(GidType)


def gid_of_address(address: str) -> bytes:
    """The RoCE v2 GID of an IP address (IPv4: mapped into IPv6); ValueError if it is none."""
    ip = ipaddress.ip_address(address)
    return (ipaddress.IPv6Address(f"::ffff:{ip}") if ip.version == 4 else ip).packed


def gid_text(raw: bytes) -> str:
    """A GID as sysfs and the log write it: eight groups of four hex digits."""
    return ":".join(raw[i:i + 2].hex() for i in range(0, 16, 2))


@dataclass(frozen=True)
class Gid:
    raw: bytes
    type: int

    def __str__(self) -> str:
        return gid_text(self.raw)


class GidTable:
    """The port's GIDs, also in the engine (it routes by them and stamps a sender's source from them)."""

    def __init__(self, owner: str, size: int, seat: EngineSeat) -> None:
        if size > MAX_GIDS:
            raise ValueError(f"a GID table of {size} entries (the engine holds {MAX_GIDS})")
        self.owner = owner
        self.size = size
        self.seat = seat
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
        with refused_as_status():
            self.seat.engine.set_gid(self.seat.index, index, raw, gid_type)
        self.entries[index] = Gid(raw, gid_type)
        log.info("%s: GID %d = %s (RoCE v%d)", self.owner, index, self.entries[index], gid_type)

    def remove(self, index: int) -> None:
        gid = self.entries.pop(index, None)
        if gid is None:
            raise CommandFailed(Status.INVALID, f"GID index {index} is not set")
        self.seat.engine.set_gid(self.seat.index, index, bytes(16), 0)
        log.info("%s: GID %d removed (%s)", self.owner, index, gid)

    def clear(self) -> None:
        self.entries.clear()

    def snapshot(self) -> dict[str, str]:
        return {str(index): str(gid) for index, gid in sorted(self.entries.items())}
