"""pvrdma lesson 5, commands before their buffers exist (CVE-2022-1050, CVE-2018-20191): commands and kicks that
arrive before the rings, memory or objects they name, or after they went."""

from __future__ import annotations

import select
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from backend_process import BackendProcess
from pvrdma_helpers import *  # the lessons' shared helpers (its __all__)

from vrdma.device import abi
from vrdma.device.constants import CommandOpcode
from vrdma.testing.frontend import VHOST_USER_F_PROTOCOL_FEATURES, VIRTIO_F_VERSION_1, Frontend, Virtqueue
from vrdma.testing.simulated_guest import PAGE, SimVerbs
from vrdma.vhost_user import protocol
from vrdma.vhost_user.protocol import Request

pytestmark = pytest.mark.backend


def test_queues_kicked_before_their_rings_exist_do_nothing_until_they_do(backend: BackendProcess) -> None:
    """CVE-2022-1050: pvrdma_exec_cmd ran a command the guest triggered before the shared command/response buffers
    (the DSR) were mapped, "Guest driver might execute HW commands when shared buffers are not yet allocated,
    potentially leading to a use-after-free" (fixed by "hw/pvrdma: Protect against buggy or malicious guest driver":
    no DSR, no command).

    Here vm0's control, event and wake queues are started and kicked with no ring addresses and no guest memory
    table at all. The device executes nothing, keeps the connection (this is an early kick, not a protocol error),
    holds its PORT_ACTIVE event, and serves vm1 meanwhile; once memory and rings exist, the first command completes
    and the held event arrives, once."""
    with backend.frontend("vm1") as bystander, backend.frontend("vm0") as fe:
        bystander.start()
        fe.get_u64(Request.GET_FEATURES)
        fe.send_raw(Request.SET_PROTOCOL_FEATURES, protocol.U64.pack(fe.get_u64(Request.GET_PROTOCOL_FEATURES)))
        fe.acked(Request.SET_OWNER)
        fe.acked(Request.SET_FEATURES, protocol.U64.pack(VIRTIO_F_VERSION_1 | VHOST_USER_F_PROTOCOL_FEATURES))
        for index in range(abi.const("VRDMA_NUM_QUEUES")):
            vq = Virtqueue(fe.memory, index, 64)
            fe.queues.append(vq)
            fe.acked(Request.SET_VRING_NUM, protocol.VRING_STATE.pack(index, 64))
            fe.acked(Request.SET_VRING_BASE, protocol.VRING_STATE.pack(index, 0))
            fe.acked(Request.SET_VRING_CALL, protocol.U64.pack(index), fds=[vq.call])
            fe.acked(Request.SET_VRING_KICK, protocol.U64.pack(index), fds=[vq.kick])
            fe.acked(Request.SET_VRING_ENABLE, protocol.VRING_STATE.pack(index, 1))
        # A command is already "posted" in the control ring's memory, though the device has not been told where.
        control = fe.queues[abi.const("VRDMA_QUEUE_CONTROL")]
        control.add([abi.to_bytes(abi.new("vrdma_cmd_query_device", hdr={
            "opcode": abi.const("VRDMA_CMD_QUERY_DEVICE"), "seq": 77}))], [abi.sizeof("vrdma_resp_query_device")])
        for vq in fe.queues:
            vq.notify()
        # The backend has read every kick once its eventfd is no longer readable.
        wait_until("the kicks to be read", lambda: not select.select([vq.kick for vq in fe.queues], [], [], 0)[0],
                   timeout=10, interval=0.002)
        counters = backend.counters("vm0")
        assert (counters["commands"], counters["events_pending"]) == (0, 1)
        assert counters["connection"]["state"] == "connected" and counters["connection"]["protocol_errors"] == 0
        assert device_answers(bystander)
        assert control.reap() == []
        fe.acked(Request.SET_MEM_TABLE, protocol.MEMORY_HEADER.pack(1, 0) + fe.memory.region(), fds=[fe.memory.fd])
        for vq in fe.queues:
            fe.acked(Request.SET_VRING_ADDR, vq.address_payload())
        control.notify()
        ((_, length),) = control.wait_used()
        assert length == abi.sizeof("vrdma_resp_query_device") and backend.counters("vm0")["commands"] == 1
        verbs_events = fe.queues[abi.const("VRDMA_QUEUE_EVENT")]
        for _ in range(2):
            verbs_events.add([], [abi.sizeof("vrdma_event")])
        verbs_events.notify()
        (desc, length), = verbs_events.wait_used()
        event = abi.from_bytes("vrdma_event", fe.memory.read(verbs_events.buffer_address(desc), length))
        assert event.type == EVENT["PORT_ACTIVE"]
        assert backend.counters("vm0")["events_pending"] == 0


def test_ring_addresses_before_any_guest_memory_close_only_that_vm(backend: BackendProcess) -> None:
    """CVE-2022-1050, the vhost-user side: ring addresses given before the memory table that would translate them.
    They cannot be translated: the VM's connection is closed as a protocol error, nothing of it is kept (no
    objects, no doorbell pages), vm1 keeps being served, and vm0 can connect again and work."""
    with backend.frontend("vm1") as bystander:
        bystander.start()
        with backend.frontend("vm0") as fe:
            fe.send_raw(Request.SET_PROTOCOL_FEATURES,
                        protocol.U64.pack(fe.get_u64(Request.GET_PROTOCOL_FEATURES)))
            fe.acked(Request.SET_OWNER)
            vq = Virtqueue(fe.memory, 0, 64)
            fe.queues.append(vq)
            fe.acked(Request.SET_VRING_NUM, protocol.VRING_STATE.pack(0, 64))
            fe.send_raw(Request.SET_VRING_ADDR, vq.address_payload())
            connection = backend.wait_for_closed("vm0", 1)
        assert connection["protocol_errors"] == 1
        assert device_answers(bystander)
    counters = backend.counters("vm0")
    assert set(counters["objects"].values()) == {0} and counters["doorbell_pages"] == []
    with backend.frontend("vm0") as again:
        again.start()
        assert device_answers(again)


def command_with_sentinel(fe: Frontend, request: bytes, response_size: int) -> tuple[int, bytes]:
    """Post a command whose response buffer holds the sentinel; return (bytes the device says it wrote, buffer)."""
    vq = fe.queues[abi.const("VRDMA_QUEUE_CONTROL")]
    head, (gpa,) = vq.add([request], [response_size])
    # add() publishes the chain, but the device pops only when kicked: the sentinel is in place before it looks.
    fe.memory.write(gpa, bytes([SENTINEL]) * response_size)
    vq.notify()
    used = dict(vq.wait_used())
    return used[head], fe.memory.read(gpa, response_size)


@dataclass
class Handles:
    verbs: SimVerbs
    pd: int
    cq: int
    foreign_cq: int   # a CQ of another user context of the same VM
    stale_qp: int     # a QP that existed and was destroyed
    stale_mr: int


NOWHERE = 0x7777


def _qp(h: Handles, **change: int) -> dict[str, Any]:
    return {**create_qp_fields(h.verbs, h.pd, h.cq), **change}


# (opcode, request struct, response struct, fields, expected status)
Case = tuple[str, str, str, Callable[[Handles], dict[str, Any]], str]
NONEXISTENT: dict[str, Case] = {
    "CREATE_QP, send CQ never created": ("CREATE_QP", "vrdma_cmd_create_qp", "vrdma_resp_create_qp",
                                         lambda h: _qp(h, send_cq=NOWHERE), "INVALID"),
    "CREATE_QP, receive CQ never created": ("CREATE_QP", "vrdma_cmd_create_qp", "vrdma_resp_create_qp",
                                            lambda h: _qp(h, recv_cq=NOWHERE), "INVALID"),
    "CREATE_QP, CQ of another context": ("CREATE_QP", "vrdma_cmd_create_qp", "vrdma_resp_create_qp",
                                         lambda h: _qp(h, send_cq=h.foreign_cq, recv_cq=h.foreign_cq), "INVALID"),
    "CREATE_QP, SRQ never created": ("CREATE_QP", "vrdma_cmd_create_qp", "vrdma_resp_create_qp",
                                     lambda h: {**create_qp_fields(h.verbs, h.pd, h.cq, srq=NOWHERE)}, "INVALID"),
    "CREATE_QP, PD never allocated": ("CREATE_QP", "vrdma_cmd_create_qp", "vrdma_resp_create_qp",
                                      lambda h: _qp(h, pd=NOWHERE), "INVALID"),
    "CREATE_QP, context never allocated": ("CREATE_QP", "vrdma_cmd_create_qp", "vrdma_resp_create_qp",
                                           lambda h: _qp(h, ucontext=NOWHERE), "INVALID"),
    "CREATE_QP, kernel context with a user context's PD and CQs": (
        "CREATE_QP", "vrdma_cmd_create_qp", "vrdma_resp_create_qp", lambda h: _qp(h, ucontext=0), "INVALID"),
    "CREATE_CQ, context never allocated": ("CREATE_CQ", "vrdma_cmd_create_cq", "vrdma_resp_create_cq",
                                           lambda h: {**create_cq_fields(h.verbs, 16), "ucontext": NOWHERE},
                                           "INVALID"),
    "CREATE_SRQ, PD never allocated": ("CREATE_SRQ", "vrdma_cmd_create_srq", "vrdma_resp_create_srq",
                                       lambda h: {**create_srq_fields(h.verbs, NOWHERE)}, "INVALID"),
    "REG_MR, PD never allocated": ("REG_MR", "vrdma_cmd_reg_mr", "vrdma_resp_reg_mr",
                                   lambda h: {"pd": NOWHERE, "access": 0xF, "iova": 0x10000, "length": PAGE,
                                              "pages": h.verbs.page_list(h.verbs.alloc(PAGE))}, "INVALID"),
    "CREATE_AH, PD never allocated": ("CREATE_AH", "vrdma_cmd_create_ah", "vrdma_resp_create_ah",
                                      lambda h: {"pd": NOWHERE}, "INVALID"),
    "ALLOC_PD, context never allocated": ("ALLOC_PD", "vrdma_cmd_alloc_pd", "vrdma_resp_alloc_pd",
                                          lambda h: {"ucontext": NOWHERE}, "INVALID"),
    "MODIFY_QP, QP never created": ("MODIFY_QP", "vrdma_cmd_modify_qp", "vrdma_resp_hdr",
                                    lambda h: {"handle": NOWHERE, "attr_mask": 1, "attr": {"qp_state": 1}},
                                    "INVALID"),
    "MODIFY_QP, QP destroyed": ("MODIFY_QP", "vrdma_cmd_modify_qp", "vrdma_resp_hdr",
                                lambda h: {"handle": h.stale_qp, "attr_mask": 1, "attr": {"qp_state": 1}},
                                "INVALID"),
    "QUERY_QP, handle 0": ("QUERY_QP", "vrdma_cmd_destroy", "vrdma_resp_query_qp", lambda h: {"handle": 0},
                           "INVALID"),
    "QUERY_QP, QP destroyed": ("QUERY_QP", "vrdma_cmd_destroy", "vrdma_resp_query_qp",
                               lambda h: {"handle": h.stale_qp}, "INVALID"),
    "DESTROY_QP, handle 2^32 - 1": ("DESTROY_QP", "vrdma_cmd_destroy", "vrdma_resp_hdr",
                                    lambda h: {"handle": 0xFFFFFFFF}, "INVALID"),
    "MODIFY_CQ, CQ never created": ("MODIFY_CQ", "vrdma_cmd_modify_cq", "vrdma_resp_hdr",
                                    lambda h: {"handle": NOWHERE, "cq_count": 4}, "INVALID"),
    "DESTROY_CQ, CQ never created": ("DESTROY_CQ", "vrdma_cmd_destroy", "vrdma_resp_hdr",
                                     lambda h: {"handle": NOWHERE}, "INVALID"),
    "QUERY_SRQ, SRQ never created": ("QUERY_SRQ", "vrdma_cmd_destroy", "vrdma_resp_query_srq",
                                     lambda h: {"handle": NOWHERE}, "INVALID"),
    "MODIFY_SRQ, SRQ never created": ("MODIFY_SRQ", "vrdma_cmd_modify_srq", "vrdma_resp_hdr",
                                      lambda h: {"handle": NOWHERE, "attr_mask": abi.const("VRDMA_SRQ_LIMIT")},
                                      "INVALID"),
    "DESTROY_SRQ, SRQ never created": ("DESTROY_SRQ", "vrdma_cmd_destroy", "vrdma_resp_hdr",
                                       lambda h: {"handle": NOWHERE}, "INVALID"),
    "DEREG_MR, MR deregistered": ("DEREG_MR", "vrdma_cmd_destroy", "vrdma_resp_hdr",
                                  lambda h: {"handle": h.stale_mr}, "INVALID"),
    "DEALLOC_PD, PD never allocated": ("DEALLOC_PD", "vrdma_cmd_destroy", "vrdma_resp_hdr",
                                       lambda h: {"handle": NOWHERE}, "INVALID"),
    "DESTROY_AH, AH never created": ("DESTROY_AH", "vrdma_cmd_destroy", "vrdma_resp_hdr",
                                     lambda h: {"handle": NOWHERE}, "INVALID"),
    "DEALLOC_UCONTEXT, context never allocated": ("DEALLOC_UCONTEXT", "vrdma_cmd_destroy", "vrdma_resp_hdr",
                                                  lambda h: {"handle": NOWHERE}, "INVALID"),
}


@pytest.mark.parametrize("case", NONEXISTENT)
def test_commands_naming_objects_that_do_not_exist_are_refused(vm0: Vm, case: str) -> None:
    """CVE-2022-1050's class for objects: a command that names something which does not exist yet (or any more)
    must find nothing, never a half-made or freed object.

    Each command is refused with its status; only the response header is written (opcode and sequence echoed, the
    sentinel behind it intact), and no object is created or destroyed."""
    opcode, request, response, fields, status = NONEXISTENT[case]
    backend, fe, v = vm0.backend, vm0.fe, vm0.verbs
    other = SimVerbs(fe, backend.directory / "vm0.doorbell")
    pd = v.alloc_pd()
    cq = v.create_cq(16)
    stale_qp = v.create_qp(pd, cq, cq)
    v.call("VRDMA_CMD_DESTROY_QP", "vrdma_cmd_destroy", "vrdma_resp_hdr", handle=stale_qp.handle)
    stale_mr = v.reg_mr(pd, PAGE)
    v.call("VRDMA_CMD_DEREG_MR", "vrdma_cmd_destroy", "vrdma_resp_hdr", handle=stale_mr.handle)
    handles = Handles(v, pd, cq.handle, other.create_cq(16).handle, stale_qp.handle, stale_mr.handle)
    body = fields(handles)
    req = abi.new(request, **{k: x for k, x in body.items() if not isinstance(x, dict)})
    for name, sub in body.items():
        if isinstance(sub, dict):
            for key, x in sub.items():
                setattr(getattr(req, name), key, x)
    req.hdr.opcode, req.hdr.seq = abi.const(f"VRDMA_CMD_{opcode}"), 4242
    before = objects(backend, "vm0")
    size = abi.sizeof(response)
    written, raw = command_with_sentinel(fe, abi.to_bytes(req), size)
    hdr = abi.from_bytes("vrdma_resp_hdr", raw[:RESP_HDR])
    assert (hdr.opcode, hdr.seq, hdr.status) == (abi.const(f"VRDMA_CMD_{opcode}"), 4242, STATUS[status])
    assert written == RESP_HDR
    assert raw[RESP_HDR:] == bytes([SENTINEL]) * (size - RESP_HDR)
    assert objects(backend, "vm0") == before


@pytest.mark.parametrize("opcode", [0, max(CommandOpcode) + 1, 0xFFFF])
def test_command_the_device_has_no_handler_for_is_answered(vm0: Vm, opcode: int) -> None:
    """CVE-2018-20191: pvrdma's UAR region had a write handler but no read handler, so a guest read called a NULL
    function pointer ("does not implement a read operation (such as uar_read by analogy to uar_write)"; fixed by
    "pvrdma: add uar_read routine"). Here every opcode the device has no handler for gets a defined answer:
    STATUS_NOT_SUPPORTED in a header echoing opcode and sequence, nothing written behind it, and the device goes on
    serving commands."""
    fe = vm0.fe
    request = abi.to_bytes(abi.new("vrdma_cmd_hdr", opcode=opcode, seq=99))
    written, raw = command_with_sentinel(fe, request, 64)
    hdr = abi.from_bytes("vrdma_resp_hdr", raw[:RESP_HDR])
    assert (hdr.opcode, hdr.seq, hdr.status, written) == (opcode, 99, STATUS["NOT_SUPPORTED"], RESP_HDR)
    assert raw[RESP_HDR:] == bytes([SENTINEL]) * (64 - RESP_HDR)
    assert device_answers(fe)


def test_doorbells_rung_before_any_queue_exists_are_ignored(backend: BackendProcess, pair: tuple[Side, Side]) -> None:
    """CVE-2022-1050's class on the data path: doorbells rung before the queues behind them exist. Every slot of a
    fresh context's doorbell page holds garbage (producer indices far beyond any ring, arm requests) before it
    creates anything. The device ignores them: queues created afterwards start from zero, a transfer through them
    succeeds with exactly one completion, and no QP_FATAL, overflow or error completion appears."""
    victim, attacker = pair
    v = SimVerbs(attacker.verbs.fe, backend.directory / "vm1.doorbell")
    page = v.doorbell_page * abi.const("VRDMA_DOORBELL_PAGE_SIZE")
    v.doorbells[page:page + abi.const("VRDMA_DOORBELL_PAGE_SIZE")] = struct.pack("<I", 0x7FFF0003) * 1024
    before = engine(backend, "vm1")
    pd = v.alloc_pd()
    cq = v.create_cq(16)
    qp = v.create_qp(pd, cq, cq)
    mr = v.reg_mr(pd, PAGE)
    v.connect(qp, victim.qp.qpn, GID[victim.name])
    v.memory.write(mr.addr, b"after the garbage")
    v.post_send(qp, WR["RDMA_WRITE"], [(mr.addr, 17, mr.lkey)], wr_id=3, remote_addr=victim.mr.addr,
                rkey=victim.mr.rkey)
    (done,) = wait_cqes(v, cq, 1)
    assert (done.wr_id, done.status, done.byte_len) == (3, WC["SUCCESS"], 17)
    assert victim.verbs.memory.read(victim.mr.addr, 17) == b"after the garbage"
    after = engine(backend, "vm1")
    assert {k: after[k] - before[k] for k in ("qp_fatal", "cq_overflows", "error_cqes", "cqes", "send_wqes")} == {
        "qp_fatal": 0, "cq_overflows": 0, "error_cqes": 0, "cqes": 1, "send_wqes": 1}
