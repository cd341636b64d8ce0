"""What the pvrdma-lesson tests share: constants, a VM's end with its sentinel pattern, raw WQE writers, waits
and object-count helpers (the fixtures are in conftest.py)."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil
from backend_process import GID, BackendProcess, SimSide, query_device, settled_fds, start_side, wait_cqes
from polling import wait_until

from vrdma.device import abi
from vrdma.device.rings import CQE, RECV_WQE, SEND_WQE
from vrdma.testing.frontend import Frontend
from vrdma.testing.simulated_guest import PAGE, PBL, SGE, CommandError, SimCq, SimQp, SimVerbs
from vrdma.testing.simulated_guest import sge_bytes as sges

__all__ = [  # what the lesson files take with `from pvrdma_helpers import *`
    "CQ",
    "CQE",
    "EVENT",
    "GID",
    "LIMITS",
    "MR",
    "MR_SIZE",
    "OUTSIDE",
    "QP",
    "QPS_ERR",
    "RECV_WQE",
    "RESP_HDR",
    "SEND_WQE",
    "SENTINEL",
    "SIGNALED",
    "SRQ",
    "STATUS",
    "WC",
    "WR",
    "Side",
    "Vm",
    "aliased_pages",
    "connected_qp",
    "create_cq_fields",
    "create_qp",
    "create_qp_fields",
    "create_srq_fields",
    "device_answers",
    "engine",
    "events_ready",
    "make_side",
    "objects",
    "page_list",
    "pattern",
    "put_recv_wqe",
    "put_send_wqe",
    "qp_state",
    "recv_wqe",
    "round_trip",
    "rss",
    "settled_fds",
    "sges",
    "status_of",
    "wait_cqes",
    "wait_until",
]

STATUS = {name: abi.const(f"VRDMA_STATUS_{name}") for name in ("OK", "NOT_SUPPORTED", "INVALID", "NO_RESOURCES")}
WR = {name: abi.const(f"VRDMA_WR_{name}") for name in ("RDMA_WRITE", "SEND", "RDMA_READ")}
WC = {name: abi.const(f"VRDMA_WC_{name}") for name in ("SUCCESS", "LOC_LEN_ERR", "LOC_QP_OP_ERR", "LOC_PROT_ERR",
                                                         "WR_FLUSH_ERR", "REM_ACCESS_ERR", "REM_OP_ERR")}
EVENT = {name: abi.const(f"VRDMA_EVENT_{name}") for name in ("PORT_ACTIVE", "QP_FATAL", "CQ_ERR")}
QPS_ERR = abi.const("VRDMA_QPS_ERR")
SIGNALED = abi.const("VRDMA_SEND_SIGNALED")
RESP_HDR = abi.sizeof("vrdma_resp_hdr")
LIMITS = {"max_sge": 16, "max_cqe": 65536, "max_qp_wr": 32768, "max_mr_size": 1 << 30, "max_msg_size": 1 << 31,
          "max_translated_pages": 1 << 22}
MR_SIZE = 64 << 10
SENTINEL = 0xA5  # what the device must not have written over
OUTSIDE = 0x100000  # this far past the end of guest RAM: not a guest page
QP = ("VRDMA_CMD_CREATE_QP", "vrdma_cmd_create_qp", "vrdma_resp_create_qp")
CQ = ("VRDMA_CMD_CREATE_CQ", "vrdma_cmd_create_cq", "vrdma_resp_create_cq")
SRQ = ("VRDMA_CMD_CREATE_SRQ", "vrdma_cmd_create_srq", "vrdma_resp_create_srq")
MR = ("VRDMA_CMD_REG_MR", "vrdma_cmd_reg_mr", "vrdma_resp_reg_mr")


def pattern(name: str, size: int) -> bytes:
    """Bytes nobody would write by accident: the sentinel a victim's memory holds."""
    block = hashlib.sha256(name.encode()).digest()
    return (block * (size // len(block) + 1))[:size]


# -- a VM's end: context, PD, CQ, QP, MR ------------------------------------------------------------------------

@dataclass
class Side(SimSide):
    name: str = ""

    def fill(self) -> None:
        self.verbs.memory.write(self.mr.addr, pattern(self.name, MR_SIZE))

    def untouched(self) -> bool:
        return self.verbs.memory.read(self.mr.addr, MR_SIZE) == pattern(self.name, MR_SIZE)


def make_side(fe: Frontend, backend: BackendProcess, name: str) -> Side:
    base = start_side(fe, backend, name, GID[name], MR_SIZE)
    side = Side(base.verbs, base.pd, base.cq, base.qp, base.mr, name)
    side.fill()
    return side


@dataclass
class Vm:
    """vm0 connected and started, with one user context, on a backend shared by a module's command-level tests."""

    backend: BackendProcess
    fe: Frontend
    verbs: SimVerbs


def connected_qp(side: Side, peer: Side, peer_qp: SimQp, cq: SimCq | None = None, **kw: Any) -> SimQp:
    """A new QP of ``side`` in RTS towards ``peer_qp`` (which need not point back: RC writes only need the way in)."""
    qp = side.verbs.create_qp(side.pd, cq or side.cq, cq or side.cq, **kw)
    side.verbs.connect(qp, peer_qp.qpn, GID[peer.name])
    return qp


def engine(backend: BackendProcess, vm: str) -> dict[str, int]:
    return backend.counters(vm)["engine"]  # type: ignore[no-any-return]


def objects(backend: BackendProcess, vm: str) -> dict[str, int]:
    return backend.counters(vm)["objects"]  # type: ignore[no-any-return]


def qp_state(verbs: SimVerbs, qp: SimQp) -> int:
    return int(verbs.call("VRDMA_CMD_QUERY_QP", "vrdma_cmd_destroy", "vrdma_resp_query_qp",
                          handle=qp.handle).attr.qp_state)


def round_trip(side: Side, peer: Side, wr_id: int) -> None:
    """One healthy RDMA WRITE from ``side``'s QP into its peer's MR: proves the engine still serves (and has made
    at least one more pass over every QP of the process since the call began)."""
    side.verbs.post_send(side.qp, WR["RDMA_WRITE"], [(side.mr.addr, 8, side.mr.lkey)], wr_id=wr_id,
                         remote_addr=peer.mr.addr + MR_SIZE - 8, rkey=peer.mr.rkey)
    (done,) = wait_cqes(side.verbs, side.cq, 1)
    assert (done.wr_id, done.status) == (wr_id, WC["SUCCESS"])


def put_send_wqe(verbs: SimVerbs, qp: SimQp, body: bytes, **fields: int) -> None:
    """Write any send WQE (fields as given, not as a correct provider would set them) into the next slot."""
    verbs.put_wqe(qp.sq, abi.to_bytes(abi.new("vrdma_send_wqe", **fields)) + body)


def recv_wqe(wr_id: int, num_sge: int, body: bytes) -> bytes:
    return abi.to_bytes(abi.new("vrdma_recv_wqe", wr_id=wr_id, num_sge=num_sge)) + body


def put_recv_wqe(verbs: SimVerbs, qp: SimQp, srq: Any, wqe: bytes, producer: int) -> None:
    """Write a receive WQE into the first slot of the QP's receive queue (or of its SRQ) and store ``producer``,
    whatever it is, as that queue's producer index."""
    ring = srq.ring if srq is not None else qp.rq
    verbs.memory.write(ring.slot_gpa(0), wqe)
    verbs.ring(ring.db, producer)


def events_ready(verbs: SimVerbs) -> None:
    """Post event buffers and take the PORT_ACTIVE every device sends first."""
    verbs.post_event_buffers(8)
    assert [e.type for e in verbs.wait_events()] == [EVENT["PORT_ACTIVE"]]


def device_answers(fe: Frontend) -> bool:
    """A QUERY_DEVICE round trip succeeds: the VM is still served."""
    response: Any = query_device(fe)
    return int(response.hdr.status) == STATUS["OK"]


def rss(backend: BackendProcess) -> int:
    return int(psutil.Process(backend.proc.pid).memory_info().rss)


def aliased_pages(verbs: SimVerbs, npages: int) -> dict[str, int]:
    """A two-level page list of ``npages`` entries that all name one guest page: what a guest with three pages of
    RAM can hand the device to make it translate (and remember) a gigabyte."""
    data, table, directory = (verbs.alloc(PAGE).gpa for _ in range(3))
    verbs.memory.write(table, struct.pack(f"<{PBL}Q", *[data] * PBL))
    verbs.memory.write(directory, struct.pack(f"<{PBL}Q", *[table] * PBL))
    return {"addr": directory, "npages": npages, "levels": 2}


def page_list(verbs: SimVerbs, gpas: list[int]) -> dict[str, int]:
    """A page list naming exactly these guest addresses (whatever they are), one or two levels."""
    tables = []
    for i in range(0, len(gpas), PBL):
        table = verbs.alloc(PAGE).gpa
        verbs.memory.write(table, struct.pack(f"<{len(gpas[i:i + PBL])}Q", *gpas[i:i + PBL]))
        tables.append(table)
    if len(tables) == 1:
        return {"addr": tables[0], "npages": len(gpas), "levels": 1}
    directory = verbs.alloc(PAGE).gpa
    verbs.memory.write(directory, struct.pack(f"<{len(tables)}Q", *tables))
    return {"addr": directory, "npages": len(gpas), "levels": 2}


def status_of(call: Callable[[], object]) -> int:
    try:
        call()
    except CommandError as err:
        return err.status
    return STATUS["OK"]


def create_qp_fields(verbs: SimVerbs, pd: int, cq: int, *, sq_depth: int = 64, rq_depth: int = 64,
                     max_send_sge: int = 4, max_recv_sge: int = 4, srq: int = 0) -> dict[str, Any]:
    """A correct CREATE_QP (the provider's layout: header page, send queue, receive queue back to back)."""
    sq_stride = max(64, 1 << (SEND_WQE + max_send_sge * SGE - 1).bit_length())
    rq_stride = 0 if srq else max(32, 1 << (RECV_WQE + max_recv_sge * SGE - 1).bit_length())
    rq_depth, max_recv_sge = (0, 0) if srq else (rq_depth, max_recv_sge)
    sq_bytes = -(-sq_depth * sq_stride // PAGE) * PAGE
    buf = verbs.alloc(PAGE + sq_bytes + rq_depth * rq_stride)
    return {"ucontext": verbs.ucontext, "pd": pd, "send_cq": cq, "recv_cq": cq, "srq": srq,
            "qp_type": abi.const("VRDMA_QPT_RC"), "sq_depth": sq_depth, "rq_depth": rq_depth, "sq_stride": sq_stride,
            "rq_stride": rq_stride, "sq_offset": PAGE, "rq_offset": 0 if srq else PAGE + sq_bytes,
            "max_send_sge": max_send_sge, "max_recv_sge": max_recv_sge, "max_inline_data": 0,
            "ring": verbs.page_list(buf)}


def create_qp(verbs: SimVerbs, fields: dict[str, Any]) -> Any:
    return verbs.call("VRDMA_CMD_CREATE_QP", "vrdma_cmd_create_qp", "vrdma_resp_create_qp", **fields)


def create_cq_fields(verbs: SimVerbs, entries: int) -> dict[str, Any]:
    buf = verbs.alloc(PAGE + entries * CQE)
    return {"ucontext": verbs.ucontext, "entries": entries, "ring": verbs.page_list(buf)}


def create_srq_fields(verbs: SimVerbs, pd: int, depth: int = 16, max_sge: int = 4) -> dict[str, Any]:
    stride = max(32, 1 << (RECV_WQE + max_sge * SGE - 1).bit_length())
    buf = verbs.alloc(PAGE + depth * stride)
    return {"ucontext": verbs.ucontext, "pd": pd, "depth": depth, "stride": stride, "max_sge": max_sge,
            "srq_limit": 0, "ring": verbs.page_list(buf)}
