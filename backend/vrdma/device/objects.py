"""The object tables of one device, composed with their dependencies: what the command handlers act on.

Each kind lives in its own module (ucontext, pd, mr, cq, xrcd, srq, qp, ah, gid) and is given exactly the tables and
the engine seat it depends on, in dependency order; nothing here knows of commands, virtqueues or sockets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from vrdma.device.ah import AddressHandles
from vrdma.device.cq import CompletionQueues
from vrdma.device.gid import GidTable
from vrdma.device.mr import MemoryRegions
from vrdma.device.params import DeviceLimits
from vrdma.device.pd import ProtectionDomains
from vrdma.device.qp import QueuePairs
from vrdma.device.seat import EngineSeat
from vrdma.device.srq import SharedReceiveQueues
from vrdma.device.ucontext import UserContexts
from vrdma.device.xrcd import XrcDomains

# What counters_snapshot()["objects"] counts, per VM.
OBJECT_KINDS = ("gid", "ucontext", "pd", "mr", "cq", "xrcd", "srq", "qp", "ah")


@dataclass(frozen=True)
class Identity:
    """What QUERY_DEVICE says the device is."""

    fw_version: int
    node_guid: int


class DeviceObjects:
    def __init__(self, owner: str, seat: EngineSeat, limits: DeviceLimits, identity: Identity,
                 set_alive: Callable[[int, bool], None], route: Callable[[bytes], int]) -> None:
        self.limits = limits
        self.identity = identity
        # Answers that never change for this device (its limits and identity), by command opcode, made on first ask.
        self.fixed_answers: dict[int, bytes] = {}
        self.seat = seat
        self.gids = GidTable(owner, limits.gid_table_len, seat)
        self.ucontexts = UserContexts(limits.doorbell_pages, set_alive)
        self.pds = ProtectionDomains(limits.max_pd, self.ucontexts)
        self.mrs = MemoryRegions(seat, limits.max_mr, limits.max_mr_size, limits.max_fast_reg_pages, self.pds)
        self.cqs = CompletionQueues(seat, limits.max_cq, limits.max_cqe, self.ucontexts)
        self.xrcds = XrcDomains(limits.max_xrcd)
        self.srqs = SharedReceiveQueues(seat, limits.max_srq, limits.max_srq_wr, limits.max_srq_sge, self.ucontexts,
                                        self.pds, self.cqs, self.xrcds)
        self.qps = QueuePairs(owner, seat, limits, self.ucontexts, self.pds, self.cqs, self.srqs, self.xrcds,
                              self.gids, route)
        self.ahs = AddressHandles(limits.max_ah, self.pds, self.gids)

    def engine_counters(self) -> dict[str, int]:
        """The data engine's counters of this device (what QUERY_COUNTERS reports to the guest)."""
        return self.seat.engine.counters(self.seat.index)

    def counts(self) -> dict[str, int]:
        return {"gid": len(self.gids), "ucontext": len(self.ucontexts), "pd": len(self.pds), "mr": len(self.mrs),
                "cq": len(self.cqs), "xrcd": len(self.xrcds), "srq": len(self.srqs), "qp": len(self.qps),
                "ah": len(self.ahs)}

    def clear(self) -> None:
        """Forget every object (the engine forgot them already: the device closed its seat)."""
        for table in (self.gids, self.ucontexts, self.pds, self.mrs, self.cqs, self.xrcds, self.srqs, self.qps,
                      self.ahs):
            table.clear()
