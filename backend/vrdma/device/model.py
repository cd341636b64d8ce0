"""One VM's RDMA device: identity, config space, command execution, pending events, counters."""

from __future__ import annotations

import collections
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

from vrdma.device import abi
from vrdma.device.commands import (
    CMD_HDR_SIZE,
    COMMANDS,
    RESP_HDR_SIZE,
    STATUS_BAD_LENGTH,
    STATUS_BUSY,
    STATUS_INVALID,
    STATUS_NO_RESOURCES,
    STATUS_NOT_SUPPORTED,
    STATUS_OK,
    CommandFailed,
)
from vrdma.device.objects import Gid, HandleTable, ProtectionDomain, UContext
from vrdma.device.params import DEFAULT_LIMITS, DeviceLimits

log = logging.getLogger(__name__)

FW_VERSION = 1
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
                 pairing_id: int | None = None) -> None:
        if len(mac) != 6:
            raise ValueError(f"a MAC address has 6 bytes, not {len(mac)}")
        self.name = name
        self.mac = mac
        self.limits = limits
        self.pairing_id = pairing_id if pairing_id is not None else secrets.randbits(64)
        self.node_guid = (secrets.randbits(64) & ~0xFF) | 0x02  # locally administered
        self.fw_version = FW_VERSION
        self.counters = Counters()
        self.events: collections.deque[bytes] = collections.deque()
        self.on_event: Callable[[], None] | None = None
        self.pending_fault: str | None = None
        self.gids: dict[int, Gid] = {}
        self.ucontexts: HandleTable[UContext] = HandleTable("ucontext", limits.doorbell_pages - 1)
        self.pds: HandleTable[ProtectionDomain] = HandleTable("pd", limits.max_pd)

    # -- config space and doorbell region -----------------------------------------------------------------

    def config_space(self) -> bytes:
        limits = self.limits
        config = abi.new("vrdma_config", abi_version=abi.const("VRDMA_ABI_VERSION"),
                         doorbell_page_size=abi.const("VRDMA_DOORBELL_PAGE_SIZE"), pairing_id=self.pairing_id,
                         doorbell_pages=limits.doorbell_pages, max_ucontext=limits.doorbell_pages - 1)
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
                "objects": {"gid": len(self.gids), "ucontext": len(self.ucontexts), "pd": len(self.pds)},
                "gids": {str(index): str(gid) for index, gid in sorted(self.gids.items())},
                "doorbell_pages": sorted(ctx.doorbell_page for ctx in self.ucontexts.objects.values())}

    # -- objects ------------------------------------------------------------------------------------------

    def add_gid(self, index: int, raw: bytes, gid_type: int) -> None:
        self.gids[index] = Gid(raw, gid_type)
        log.info("%s: GID %d = %s (RoCE v%d)", self.name, index, self.gids[index], gid_type)

    def del_gid(self, index: int) -> bool:
        gid = self.gids.pop(index, None)
        if gid is not None:
            log.info("%s: GID %d removed (%s)", self.name, index, gid)
        return gid is not None

    def alloc_ucontext(self) -> tuple[int, int]:
        used = {ctx.doorbell_page for ctx in self.ucontexts.objects.values()}
        free = next((page for page in range(1, self.limits.doorbell_pages) if page not in used), None)
        if free is None or self.ucontexts.full():
            raise CommandFailed(STATUS_NO_RESOURCES, f"all {self.limits.doorbell_pages - 1} doorbell pages in use")
        return self.ucontexts.add(UContext(free)), free

    def dealloc_ucontext(self, handle: int) -> None:
        ctx = self.ucontexts.get(handle)
        if ctx is None:
            raise CommandFailed(STATUS_INVALID, f"no user context {handle:#x}")
        if ctx.pds:
            raise CommandFailed(STATUS_BUSY, f"user context {handle:#x} still has {len(ctx.pds)} PDs")
        self.ucontexts.remove(handle)

    def alloc_pd(self, ucontext: int) -> int:
        ctx = self.ucontexts.get(ucontext) if ucontext else None
        if ucontext and ctx is None:
            raise CommandFailed(STATUS_INVALID, f"no user context {ucontext:#x}")
        if self.pds.full():
            raise CommandFailed(STATUS_NO_RESOURCES, f"all {self.limits.max_pd} PDs in use")
        handle = self.pds.add(ProtectionDomain(ucontext))
        if ctx is not None:
            ctx.pds.add(handle)
        return handle

    def dealloc_pd(self, handle: int) -> None:
        pd = self.pds.remove(handle)
        if pd is None:
            raise CommandFailed(STATUS_INVALID, f"no PD {handle:#x}")
        ctx = self.ucontexts.get(pd.ucontext)
        if ctx is not None:
            ctx.pds.discard(handle)

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

    def reset(self) -> None:
        """The guest reset the device or went away: forget everything it owned."""
        log.info("%s: device reset (%d pending events, %d PDs, %d user contexts, %d GIDs freed)", self.name,
                 len(self.events), len(self.pds), len(self.ucontexts), len(self.gids))
        self.events.clear()
        self.pds.clear()
        self.ucontexts.clear()
        self.gids.clear()


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
