"""Address handles: a destination GID and the source GID index it is sent from, checked against the GID table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vrdma.device.gid import GidTable
from vrdma.device.pd import ProtectionDomains
from vrdma.device.status import CommandFailed, Status
from vrdma.device.table import ObjectTable


@dataclass
class Ah:
    pd: int
    sgid_index: int
    dgid: bytes


class AddressHandles(ObjectTable[Ah]):
    def __init__(self, limit: int, pds: ProtectionDomains, gids: GidTable) -> None:
        super().__init__("ah", "AH", limit)
        self.pds = pds
        self.gids = gids

    def create(self, req: Any) -> int:
        pd = self.pds.get(int(req.pd))
        if any(req.reserved):
            raise CommandFailed(Status.INVALID, "reserved bytes of CREATE_AH are not zero")
        if int(req.sgid_index) not in self.gids:
            raise CommandFailed(Status.INVALID, f"source GID index {int(req.sgid_index)} is not set")
        self.check_room()
        pd.refs += 1
        return self.add(Ah(int(req.pd), int(req.sgid_index), bytes(req.dgid)))

    def destroy(self, handle: int) -> None:
        ah = self.get(handle)
        self.pool.remove(handle)
        self.pds.release(ah.pd)
