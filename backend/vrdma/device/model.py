"""One VM's RDMA device: identity, config space, command execution, pending events, counters.

Its data-path objects live in a DataPath (datapath.py) and run in the data engine of the fabric the device is
attached to (fabric.py); a device made on its own gets a fabric of its own.
"""

from __future__ import annotations

import collections
import logging
import mmap
import secrets
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from vrdma.device import abi
from vrdma.device.commands import (
    CMD_HDR_SIZE,
    COMMANDS,
    RESP_HDR_SIZE,
    STATUS_BAD_LENGTH,
    STATUS_INVALID,
    STATUS_NOT_SUPPORTED,
    STATUS_OK,
    CommandFailed,
)
from vrdma.device.datapath import DataPath
from vrdma.device.fabric import Fabric
from vrdma.device.objects import Gid
from vrdma.device.params import DEFAULT_LIMITS, DeviceLimits
from vrdma.engine import ffi as engine_ffi

log = logging.getLogger(__name__)

FW_VERSION = 1
DOORBELL_PAGE = abi.const("VRDMA_DOORBELL_PAGE_SIZE")
DB_SLOT_ALIVE = abi.const("VRDMA_DB_SLOT_ALIVE")
ALIVE_WORD = struct.Struct("<I")
# What counters_snapshot()["objects"] counts, per VM.
OBJECT_KINDS = ("gid", "ucontext", "pd", "mr", "cq", "srq", "qp", "ah")
# Test hooks (admin socket, `vrdma backend --test-hooks`): ways to spoil the next response on purpose.
# "doorbell-page-out-of-range" waits for the next successful ALLOC_UCONTEXT and names a page past the region.
FAULTS = ("wrong-opcode", "wrong-seq", "short-response", "bad-status", "doorbell-page-out-of-range")


@dataclass
class Counters:
    commands: int = 0
    command_errors: int = 0
    events_posted: int = 0
    events_dropped: int = 0
    by_opcode: dict[str, int] = field(default_factory=dict)


class ResponseTooSmall(Exception):
    """The driver gave less device-writable space than a response header: nothing can be said."""


class RdmaDevice:
    def __init__(self, name: str, *, mac: bytes = bytes(6), limits: DeviceLimits = DEFAULT_LIMITS,
                 pairing_id: int | None = None, fabric: Fabric | None = None,
                 doorbells: mmap.mmap | None = None) -> None:
        """``doorbells``: the doorbell region as this process maps it (the engine polls it); a private one is
        made when none is given (a device model without guests, in tests)."""
        if len(mac) != 6:
            raise ValueError(f"a MAC address has 6 bytes, not {len(mac)}")
        self.name = name
        self.mac = mac
        self.limits = limits
        self.pairing_id = pairing_id if pairing_id is not None else secrets.randbits(64)
        self.epoch = secrets.randbits(64) or 1  # new whenever the device forgets its state (vrdma_config)
        self.node_guid = (secrets.randbits(64) & ~0xFF) | 0x02  # locally administered
        self.fw_version = FW_VERSION
        self.counters = Counters()
        self.events: collections.deque[bytes] = collections.deque()
        self.on_event: Callable[[], None] | None = None
        self.pending_fault: str | None = None
        self.gids: dict[int, Gid] = {}
        self.memory: list[tuple[int, int, int]] = []  # the memory table the engine has, kept across resets
        self.doorbells = doorbells if doorbells is not None else mmap.mmap(-1, self.doorbell_size)
        if len(self.doorbells) < self.doorbell_size:
            raise ValueError(f"doorbell region of {len(self.doorbells)} bytes, the device needs {self.doorbell_size}")
        self.clear_doorbell_pages()  # a restarted backend finds the last one's contexts' slots in the region
        self.fabric = fabric if fabric is not None else Fabric(1, limits)
        self.engine_index = self.fabric.attach(self)
        self._open_engine_device()
        self.datapath = DataPath(self)

    def _open_engine_device(self) -> None:
        limits = self.limits
        base = int(engine_ffi.cast("uintptr_t", engine_ffi.from_buffer(self.doorbells)))
        self.fabric.engine.open_device(self.engine_index, {
            "max_qp": limits.max_qp, "max_cq": limits.max_cq, "max_mr": limits.max_mr, "max_srq": limits.max_srq,
            "max_sge": limits.max_sge, "max_inline": limits.max_inline_data, "max_qp_wr": limits.max_qp_wr,
            "max_cqe": limits.max_cqe, "max_srq_wr": limits.max_srq_wr,
            "max_mr_pages": limits.max_mr_size // abi.const("VRDMA_PAGE_SIZE"),
            "doorbell_pages": limits.doorbell_pages, "max_pages_total": limits.max_translated_pages,
            "max_msg_size": limits.max_msg_size}, base)

    # -- config space and doorbell region -----------------------------------------------------------------

    def config_space(self) -> bytes:
        limits = self.limits
        config = abi.new("vrdma_config", abi_version=abi.const("VRDMA_ABI_VERSION"),
                         doorbell_page_size=abi.const("VRDMA_DOORBELL_PAGE_SIZE"), pairing_id=self.pairing_id,
                         doorbell_pages=limits.doorbell_pages, max_ucontext=limits.doorbell_pages - 1,
                         device_epoch=self.epoch)
        config.mac = list(self.mac)
        for name in ("max_qp", "max_qp_wr", "max_sge", "max_inline_data", "max_cq", "max_cqe", "max_mr", "max_pd",
                     "max_srq", "max_srq_wr", "max_ah", "max_mr_size"):
            setattr(config, name, getattr(limits, name))
        return abi.to_bytes(config)

    def doorbell_header(self) -> bytes:
        header = abi.new("vrdma_doorbell_header", magic=abi.const("VRDMA_DOORBELL_MAGIC"),
                         pairing_id=self.pairing_id, abi_version=abi.const("VRDMA_ABI_VERSION"),
                         page_size=abi.const("VRDMA_DOORBELL_PAGE_SIZE"), num_pages=self.limits.doorbell_pages)
        return abi.to_bytes(header)

    def set_alive(self, page: int, alive: bool) -> None:
        """Mark a context's doorbell page as known to the device (or not): the provider flushes on zero."""
        ALIVE_WORD.pack_into(self.doorbells, page * DOORBELL_PAGE + 4 * DB_SLOT_ALIVE,
                             abi.const("VRDMA_DB_ALIVE") if alive else 0)

    def clear_doorbell_pages(self) -> None:
        """Every context page back to zeros: no context is known, no index is pending, nothing is parked."""
        self.doorbells[DOORBELL_PAGE:self.doorbell_size] = bytes(self.doorbell_size - DOORBELL_PAGE)

    @property
    def doorbell_size(self) -> int:
        return self.limits.doorbell_pages * abi.const("VRDMA_DOORBELL_PAGE_SIZE")

    # -- control commands ---------------------------------------------------------------------------------

    def execute(self, request: bytes, capacity: int) -> bytes:
        """Run one command; return the response bytes (at most ``capacity``). ResponseTooSmall if none fits."""
        response = self._execute(request, capacity)
        fault = self.pending_fault
        if fault is None:
            return response
        if fault == "doorbell-page-out-of-range":
            hdr = abi.from_bytes("vrdma_resp_hdr", response[:RESP_HDR_SIZE])
            if hdr.opcode != abi.const("VRDMA_CMD_ALLOC_UCONTEXT") or hdr.status != STATUS_OK:
                return response
            spoiled = abi.from_bytes("vrdma_resp_alloc_ucontext", response)
            spoiled.doorbell_page = self.limits.doorbell_pages  # one past the last page
            self.pending_fault = None
            return abi.to_bytes(spoiled)
        self.pending_fault = None
        return _spoil(response, fault)

    def inject_fault(self, fault: str) -> None:
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}")
        self.pending_fault = fault

    def counters_snapshot(self) -> dict[str, object]:
        c = self.counters
        return {"commands": c.commands, "command_errors": c.command_errors, "events_posted": c.events_posted,
                "events_dropped": c.events_dropped, "events_pending": len(self.events),
                "by_opcode": dict(c.by_opcode),
                "objects": {"gid": len(self.gids), **self.datapath.counts()},
                "gids": {str(index): str(gid) for index, gid in sorted(self.gids.items())},
                "doorbell_pages": sorted(ctx.doorbell_page for ctx in self.datapath.ucontexts.objects.values()),
                "engine": self.fabric.engine.counters(self.engine_index)}

    # -- objects ------------------------------------------------------------------------------------------

    def add_gid(self, index: int, raw: bytes, gid_type: int) -> None:
        self.gids[index] = Gid(raw, gid_type)
        log.info("%s: GID %d = %s (RoCE v%d)", self.name, index, self.gids[index], gid_type)

    def del_gid(self, index: int) -> bool:
        gid = self.gids.pop(index, None)
        if gid is not None:
            log.info("%s: GID %d removed (%s)", self.name, index, gid)
        return gid is not None

    def has_gid(self, raw: bytes) -> bool:
        return any(gid.raw == raw for gid in self.gids.values())

    def set_memory(self, regions: list[tuple[int, int, int]]) -> None:
        """The guest's memory table (guest-physical start, size, host address): what the engine translates with."""
        self.fabric.engine.set_memory(self.engine_index, regions)
        self.memory = list(regions)

    def _execute(self, request: bytes, capacity: int) -> bytes:
        if capacity < RESP_HDR_SIZE:
            self.counters.command_errors += 1
            raise ResponseTooSmall(f"{capacity} device-writable bytes, a response needs at least {RESP_HDR_SIZE}")
        self.counters.commands += 1
        if len(request) < CMD_HDR_SIZE:
            return self._error(0, 0, STATUS_BAD_LENGTH, f"a {len(request)}-byte command has no header")
        hdr = abi.from_bytes("vrdma_cmd_hdr", request[:CMD_HDR_SIZE])
        opcode, seq = int(hdr.opcode), int(hdr.seq)
        command = COMMANDS.get(opcode)
        if command is None:
            return self._error(opcode, seq, STATUS_NOT_SUPPORTED, f"unknown command {opcode}")
        self.counters.by_opcode[command.name] = self.counters.by_opcode.get(command.name, 0) + 1
        if hdr.reserved:
            return self._error(opcode, seq, STATUS_INVALID,
                               f"{command.name}: reserved header field is {hdr.reserved}")
        expected = abi.sizeof(command.request)
        if len(request) != expected:
            return self._error(opcode, seq, STATUS_BAD_LENGTH,
                               f"{command.name} of {len(request)} bytes (expected {expected})")
        response_size = abi.sizeof(command.response)
        if capacity < response_size:
            return self._error(opcode, seq, STATUS_BAD_LENGTH,
                               f"{command.name} response needs {response_size} bytes, the driver gave {capacity}")
        body = abi.from_bytes(command.request, request)
        response = abi.new(command.response)
        # A command that answers with nothing but a header has vrdma_resp_hdr as its response struct.
        response_hdr = response if command.response == "vrdma_resp_hdr" else response.hdr
        response_hdr.opcode, response_hdr.seq = opcode, seq
        try:
            command.handler(self, body, response)
        except CommandFailed as err:
            return self._error(opcode, seq, err.status, f"{command.name}: {err}")
        response_hdr.status = STATUS_OK
        log.debug("%s: %s seq %d ok", self.name, command.name, seq)
        return abi.to_bytes(response)

    def _error(self, opcode: int, seq: int, status: int, reason: str) -> bytes:
        self.counters.command_errors += 1
        log.warning("%s: command refused (status %d): %s", self.name, status, reason)
        return abi.to_bytes(abi.new("vrdma_resp_hdr", opcode=opcode, status=status, seq=seq))

    # -- events -------------------------------------------------------------------------------------------

    def post_event(self, event_type: int, handle: int = 0, data: int = 0) -> None:
        """Queue an event for the driver; the oldest are dropped (and counted) past the limit."""
        if len(self.events) >= self.limits.max_pending_events:
            self.events.popleft()
            self.counters.events_dropped += 1
        self.events.append(abi.to_bytes(abi.new("vrdma_event", type=event_type, handle=handle, data=data)))
        self.counters.events_posted += 1
        if self.on_event is not None:
            self.on_event()

    def close(self) -> None:
        """Leave the fabric: the engine forgets the device (and the doorbell region may be unmapped after)."""
        self.fabric.engine.close_device(self.engine_index)
        self.fabric.detach(self)
        self.datapath.clear()

    def reset(self, keep_memory: bool = False) -> None:
        """The guest reset the device or went away: forget everything it owned.

        ``keep_memory``: the connection lives on (a driver reset), so the guest's memory table stays what it was:
        QEMU sends memory-table changes only as differences (CONFIGURE_MEM_SLOTS), never the same table again.
        """
        counts = self.datapath.counts()
        log.info("%s: device reset (%d pending events, %d GIDs, %s freed)", self.name, len(self.events),
                 len(self.gids), ", ".join(f"{n} {kind}" for kind, n in counts.items() if n) or "no objects")
        self.events.clear()
        self.gids.clear()
        # Every object of the VM goes at once, in the engine too (it forgets the guest's memory with them).
        self.fabric.engine.close_device(self.engine_index)
        self.clear_doorbell_pages()  # providers of the forgotten contexts see it and flush
        self._open_engine_device()
        if keep_memory and self.memory:
            self.set_memory(self.memory)
        else:
            self.memory = []
        self.datapath.clear()
        self.epoch = secrets.randbits(64) or 1


def _spoil(response: bytes, fault: str) -> bytes:
    """A response as a faulty device would send it (test hooks only)."""
    hdr = abi.from_bytes("vrdma_resp_hdr", response[:RESP_HDR_SIZE])
    if fault == "wrong-opcode":
        hdr.opcode = (hdr.opcode + 1) & 0xFFFF
    elif fault == "wrong-seq":
        hdr.seq = (hdr.seq + 1) & 0xFFFFFFFF
    elif fault == "bad-status":
        hdr.status = 0x77
    elif fault == "short-response":
        return abi.to_bytes(hdr)  # status OK, no body
    return abi.to_bytes(hdr) + response[RESP_HDR_SIZE:]
