"""XRC domains: what XRC SRQs and XRC target QPs belong to, so that a message from an XRC initiator reaches only an
SRQ of its target's domain.

An XRC domain is the device's, not a user context's: processes share one (ibv_open_xrcd on the same file) and the
guest kernel creates the target QPs of it on their behalf. It cannot go while SRQs or target QPs hold it (BUSY).
"""

from __future__ import annotations

from dataclasses import dataclass

from vrdma.device.table import ObjectTable


@dataclass
class Xrcd:
    refs: int = 0  # its XRC SRQs and XRC target QPs


class XrcDomains(ObjectTable[Xrcd]):
    def __init__(self, limit: int) -> None:
        super().__init__("xrcd", "XRC domain", limit)

    def alloc(self) -> int:
        self.check_room()
        return self.add(Xrcd())

    def dealloc(self, handle: int) -> None:
        self.remove_unused(handle, "XRC SRQs and target QPs")

    def release(self, handle: int) -> None:
        """An object of XRC domain ``handle`` went."""
        self.get(handle).refs -= 1
