"""One user context of a device, for a transport with no kernel between its processes and the device.

In a VM the guest kernel stands between each process and the device: it gives a process its own user context,
names only that context's objects in the commands it sends for the process, builds the page lists of the process's
own pages, and destroys what a process leaves behind. A host process on the container channel
(vrdma.daemon.container) sends its commands itself, so ``ContextScope`` does that kernel's share of the checking:

- a process is given one user context when it connects; a command that would make or free one, change the
  device's GIDs (the backend sets a container's from its address) or make what only a kernel uses (a
  fast-registration MR, an XRC domain) is refused;
- every ``ucontext`` field must name the process's context, and every handle a command names must be one of the
  objects the process made (``RULES``: the fields of each command and the kind of object each names);
- every page list, and every page it lists, lies in the process's window of device addresses (the engine checks it
  as it reads the list, once: the process cannot change the list between a check and its use);
- the objects the process made are known, so its events reach it alone and what it leaves when it goes is
  destroyed, newest kind last (QPs before the SRQs and CQs they use, MRs and windows before their PDs).

It never touches sockets or descriptors: its caller hands it command bytes and takes back response bytes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from vrdma.device import abi
from vrdma.device.commands import CMD_HDR_SIZE, COMMANDS
from vrdma.device.constants import CommandOpcode, EventType
from vrdma.device.device import RdmaDevice
from vrdma.device.status import Status

log = logging.getLogger(__name__)

KINDS = ("pd", "mr", "mw", "cq", "srq", "qp", "ah")
# What a process leaves is destroyed in this order: what uses an object goes before it.
TEARDOWN = (("qp", "DESTROY_QP"), ("srq", "DESTROY_SRQ"), ("cq", "DESTROY_CQ"), ("mw", "DEALLOC_MW"),
            ("mr", "DEREG_MR"), ("ah", "DESTROY_AH"), ("pd", "DEALLOC_PD"))
EVENT_KINDS = {EventType.CQ_COMP: "cq", EventType.CQ_ERR: "cq", EventType.QP_FATAL: "qp",
               EventType.QP_REQ_ERR: "qp", EventType.QP_ACCESS_ERR: "qp", EventType.QP_LAST_WQE: "qp",
               EventType.SRQ_LIMIT: "srq"}  # any other event (the port's) is every process's


@dataclass(frozen=True)
class Rule:
    """What a command may name from one process: ``context``, a field that must be the process's user context;
    ``names``, fields that must be handles of the process's objects of a kind (``optional``: or 0); ``zero``,
    fields that must be 0; ``flagged``: (field, kind, flag) a field that names an object of the kind when the
    request's ``flags`` has the flag, and is 0 otherwise; ``creates``/``destroys``, the kind of object its success
    makes (its response's ``handle``) or frees (its request's ``handle``)."""

    context: str = ""
    names: dict[str, str] = field(default_factory=dict)
    optional: frozenset[str] = frozenset()
    zero: tuple[str, ...] = ()
    flagged: tuple[str, str, int] | None = None
    creates: str = ""
    destroys: str = ""


def _on(kind: str, destroys: bool = False) -> Rule:
    """A command naming one object of ``kind`` by its ``handle`` field."""
    return Rule(names={"handle": kind}, destroys=kind if destroys else "")


# Every command a process may send; any other is refused.
RULES: dict[CommandOpcode, Rule] = {
    CommandOpcode.QUERY_DEVICE: Rule(), CommandOpcode.QUERY_PORT: Rule(), CommandOpcode.QUERY_COUNTERS: Rule(),
    CommandOpcode.ALLOC_PD: Rule(context="ucontext", creates="pd"),
    CommandOpcode.DEALLOC_PD: _on("pd", destroys=True),
    CommandOpcode.REG_MR: Rule(names={"pd": "pd"}, creates="mr"),
    CommandOpcode.REREG_MR: Rule(names={"handle": "mr"}, flagged=("pd", "pd", abi.const("VRDMA_REREG_PD"))),
    CommandOpcode.DEREG_MR: _on("mr", destroys=True),
    CommandOpcode.ALLOC_MW: Rule(names={"pd": "pd"}, creates="mw"),
    CommandOpcode.DEALLOC_MW: _on("mw", destroys=True),
    CommandOpcode.CREATE_CQ: Rule(context="ucontext", creates="cq"),
    CommandOpcode.MODIFY_CQ: _on("cq"),
    CommandOpcode.DESTROY_CQ: _on("cq", destroys=True),
    CommandOpcode.CREATE_QP: Rule(context="ucontext", names={"pd": "pd", "send_cq": "cq", "recv_cq": "cq",
                                                             "srq": "srq"},
                                  optional=frozenset({"recv_cq", "srq"}), zero=("xrcd",), creates="qp"),
    CommandOpcode.MODIFY_QP: _on("qp"), CommandOpcode.QUERY_QP: _on("qp"),
    CommandOpcode.QUERY_QP_COUNTERS: _on("qp"),
    CommandOpcode.DESTROY_QP: _on("qp", destroys=True),
    CommandOpcode.CREATE_SRQ: Rule(context="ucontext", names={"pd": "pd"}, zero=("xrcd", "cq"), creates="srq"),
    CommandOpcode.MODIFY_SRQ: _on("srq"), CommandOpcode.QUERY_SRQ: _on("srq"),
    CommandOpcode.DESTROY_SRQ: _on("srq", destroys=True),
    CommandOpcode.CREATE_AH: Rule(names={"pd": "pd"}, creates="ah"),
    CommandOpcode.DESTROY_AH: _on("ah", destroys=True),
}


class ScopeError(Exception):
    """The device gave the process no user context (it has as many as it may hold)."""


class ContextScope:
    """One process's user context on ``device``, its objects, and its window of device addresses [lo, hi]."""

    def __init__(self, device: RdmaDevice, owner: str, window: tuple[int, int]) -> None:
        self.device = device
        self.owner = owner
        self.window = window
        self.seq = 0
        self.owned: dict[str, set[int]] = {kind: set() for kind in KINDS}
        response = self._internal("ALLOC_UCONTEXT", "vrdma_cmd_alloc_ucontext", "vrdma_resp_alloc_ucontext")
        if response is None:
            raise ScopeError(f"{owner}: the device has no user context left")
        self.ucontext, self.doorbell_page = int(response.handle), int(response.doorbell_page)
        self.closed = False

    def execute(self, request: bytes, capacity: int) -> bytes:
        """Run one of the process's commands if it keeps to the process's objects and memory; else refuse it."""
        if len(request) >= CMD_HDR_SIZE:
            hdr = abi.from_bytes("vrdma_cmd_hdr", request[:CMD_HDR_SIZE])
            opcode, seq = int(hdr.opcode), int(hdr.seq)
            command = COMMANDS.get(opcode)
            if command is not None and len(request) == abi.sizeof(command.request):
                rule = RULES.get(CommandOpcode(opcode))
                reason = (f"{command.name} is not for a container's process" if rule is None
                          else self._check(rule, abi.from_bytes(command.request, request)))
                if reason:
                    log.warning("%s: command refused: %s", self.owner, reason)
                    self.device.command_counters.command_errors += 1
                    return abi.to_bytes(abi.new("vrdma_resp_hdr", opcode=opcode, status=Status.INVALID, seq=seq))
                response = self.device.execute(request, capacity, self.window)
                if rule is not None:
                    self._record(rule, command.response, request, command.request, response)
                return response
        # What has no command's shape is the device's to refuse, with the status it gives a guest.
        return self.device.execute(request, capacity, self.window)

    def _check(self, rule: Rule, body: Any) -> str:
        """Why the command may not run for this process ("" if it may)."""
        if rule.context and int(getattr(body, rule.context)) != self.ucontext:
            return f"{rule.context} {int(getattr(body, rule.context))} is not the process's ({self.ucontext})"
        for name, kind in rule.names.items():
            handle = int(getattr(body, name))
            if not (handle == 0 and name in rule.optional) and handle not in self.owned[kind]:
                return f"{name} {handle} is no {kind} of the process's"
        for name in rule.zero:
            if int(getattr(body, name)):
                return f"{name} must be 0 for a container's process"
        if rule.flagged is not None:
            name, kind, flag = rule.flagged
            handle = int(getattr(body, name))
            if int(body.flags) & flag:
                if handle not in self.owned[kind]:
                    return f"{name} {handle} is no {kind} of the process's"
            elif handle:
                return f"{name} must be 0 unless the flags say it changes"
        return ""

    def _record(self, rule: Rule, response_struct: str, request: bytes, request_struct: str, response: bytes) -> None:
        if len(response) < abi.sizeof("vrdma_resp_hdr"):
            return
        if abi.from_bytes("vrdma_resp_hdr", response[:abi.sizeof("vrdma_resp_hdr")]).status != Status.OK:
            return
        if rule.creates and len(response) == abi.sizeof(response_struct):
            self.owned[rule.creates].add(int(abi.from_bytes(response_struct, response).handle))
        if rule.destroys:
            self.owned[rule.destroys].discard(int(abi.from_bytes(request_struct, request).handle))

    def owns(self, kind: str, handle: int) -> bool:
        """Whether ``handle`` is one of the process's objects of ``kind``."""
        return handle in self.owned[kind]

    def owns_event(self, event: bytes) -> bool:
        """Whether an event (struct vrdma_event) is about one of the process's objects, or the port's."""
        parsed = abi.from_bytes("vrdma_event", event)
        try:
            kind = EVENT_KINDS.get(EventType(int(parsed.type)))
        except ValueError:
            return False
        return kind is None or int(parsed.handle) in self.owned[kind]

    def objects(self) -> dict[str, int]:
        return {kind: len(handles) for kind, handles in self.owned.items()}

    def close(self) -> None:
        """The process went: every object it made is destroyed, users first, then its user context."""
        if self.closed:
            return
        self.closed = True
        for kind, command in TEARDOWN:
            for handle in sorted(self.owned[kind], reverse=True):
                if self._internal(command, "vrdma_cmd_destroy", "vrdma_resp_hdr", handle=handle) is None:
                    log.error("%s: %s of %s %d refused as the process went", self.owner, command, kind, handle)
            self.owned[kind].clear()
        if self._internal("DEALLOC_UCONTEXT", "vrdma_cmd_destroy", "vrdma_resp_hdr", handle=self.ucontext) is None:
            log.error("%s: its user context %d could not be freed", self.owner, self.ucontext)

    def _internal(self, opcode: str, request: str, response: str, **fields: int) -> Any | None:
        """A command of the backend's own for the process (its context made and freed, its leftovers destroyed):
        the response, or None if the device refused it (the reason is in the device's log)."""
        self.seq += 1
        req = abi.new(request, **fields)
        req.hdr.opcode, req.hdr.seq = CommandOpcode[opcode.removeprefix("VRDMA_CMD_")], self.seq
        raw = self.device.execute(abi.to_bytes(req), abi.sizeof(response))
        hdr = abi.from_bytes("vrdma_resp_hdr", raw[:abi.sizeof("vrdma_resp_hdr")])
        if hdr.status != Status.OK or len(raw) != abi.sizeof(response):
            return None
        return abi.from_bytes(response, raw)
