"""Test hooks: spoil a VM's next command response on purpose, as a faulty device would send it.

The daemon carries none of this: `vrdma backend --test-hooks` adds the admin command "inject" (admin_commands)
that arms a ResponseSpoiler as the device's response filter:

    {"command": "inject", "vm": "vm0", "fault": F}  -> {"ok": true}

"doorbell-page-out-of-range" waits for the next successful ALLOC_UCONTEXT and names a page past the region; the
others spoil the very next response: "wrong-opcode", "wrong-seq", "short-response" (a header with status OK and
no body), "bad-status".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from vrdma.daemon.admin import AdminCommand, Served
from vrdma.device import abi
from vrdma.device.constants import CommandOpcode
from vrdma.device.device import RdmaDevice
from vrdma.device.status import Status

log = logging.getLogger(__name__)

FAULTS = ("wrong-opcode", "wrong-seq", "short-response", "bad-status", "doorbell-page-out-of-range")
RESP_HDR_SIZE = abi.sizeof("vrdma_resp_hdr")


def spoil(response: bytes, fault: str) -> bytes:
    """A response as a faulty device would send it."""
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


class ResponseSpoiler:
    """A device's response filter that spoils one response with ``fault``, then takes itself out."""

    def __init__(self, device: RdmaDevice, fault: str) -> None:
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r} (known: {', '.join(FAULTS)})")
        self.device = device
        self.fault = fault

    def __call__(self, response: bytes) -> bytes:
        if self.fault == "doorbell-page-out-of-range":
            hdr = abi.from_bytes("vrdma_resp_hdr", response[:RESP_HDR_SIZE])
            if hdr.opcode != CommandOpcode.ALLOC_UCONTEXT or hdr.status != Status.OK:
                return response
            self.device.response_filter = None
            spoiled = abi.from_bytes("vrdma_resp_alloc_ucontext", response)
            spoiled.doorbell_page = self.device.limits.doorbell_pages  # one past the last page
            return abi.to_bytes(spoiled)
        self.device.response_filter = None
        return spoil(response, self.fault)


def inject(device: RdmaDevice, fault: str) -> None:
    device.response_filter = ResponseSpoiler(device, fault)


def _inject_command(request: dict[str, Any], devices: Mapping[str, Served]) -> dict[str, Any]:
    vm, fault = request.get("vm"), request.get("fault")
    if not isinstance(vm, str) or vm not in devices:
        return {"ok": False, "error": f"unknown VM {vm!r}"}
    if fault not in FAULTS:
        return {"ok": False, "error": f"unknown fault {fault!r} (known: {', '.join(FAULTS)})"}
    inject(devices[vm].rdma, fault)
    log.warning("%s: test hook armed: %s on the next command response", vm, fault)
    return {"ok": True}


def admin_commands() -> dict[str, AdminCommand]:
    """What `vrdma backend --test-hooks` adds to the admin socket."""
    return {"inject": _inject_command}
