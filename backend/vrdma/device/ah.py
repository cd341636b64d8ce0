"""Address handles: a destination GID and the source GID index it is sent from, checked against the GID table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vrdma.device.gid import GidTable
from vrdma.device.pd import ProtectionDomains
from vrdma.device.pool import Pool
from vrdma.device.status import CommandFailed, Status


@dataclass
class Ah:
    pd: int
    sgid_index: int
    dgid: bytes


class AddressHandles:
    def __init__(self, limit: int, pds: ProtectionDomains, gids: GidTable) -> None:
        self.pds = pds
        self.gids = gids
        self.pool: Pool[Ah] = Pool("ah", limit)

    def __len__(self) -> int:
        return len(self.pool)

    def create(self, req: Any) -> int:
        pd = self.pds.get(int(req.pd))
        if any(req.reserved):
            raise CommandFailed(Status.INVALID, "reserved bytes of CREATE_AH are not zero")
        if int(req.sgid_index) not in self.gids:
            raise CommandFailed(Status.INVALID, f"source GID index {int(req.sgid_index)} is not set")
        if self.pool.full():
            raise CommandFailed(Status.NO_RESOURCES, f"all {self.pool.limit} AHs in use")
        pd.refs += 1
        return self.pool.add(Ah(int(req.pd), int(req.sgid_index), bytes(req.dgid)))

    def destroy(self, handle: int) -> None:
        ah = self.pool.remove(handle)
        if ah is None:
            raise CommandFailed(Status.INVALID, f"no AH {handle:#x}")
        self.pds.release(ah.pd)

    def clear(self) -> None:
        self.pool.clear()
