"""The lessons of QEMU's removed pvrdma device (hw/rdma/vmw), one failure class at a time, against the real backend.

ARCHITECTURE.md §5 lists the classes of pvrdma's CVEs; each test below attacks the backend the way a hostile guest
would (through the simulated frontend and driver, over a real socket, with memfd guest memory) and names the CVE it
mirrors. The CVE descriptions were checked against the oss-security announcements and the upstream fixes posted to
qemu-devel (see each docstring):

| class (ARCHITECTURE.md §5)          | pvrdma CVEs mirrored                          | tests                     |
| ----------------------------------- | --------------------------------------------- | ------------------------- |
| unchecked SGE counts                | CVE-2018-20124                                | test_*sges*               |
| ring page counts and sizes          | CVE-2018-20125, CVE-2021-3607, CVE-2023-1544  | test_*ring*_refused       |
| integer overflow in addr/length     | CVE-2021-3582                                 | test_*wrap*, test_message*|
| loops that trust ring indices       | CVE-2018-20216, CVE-2023-1544                 | test_garbage_*            |
| commands before their buffers exist | CVE-2022-1050, CVE-2018-20191                 | test_*before*, test_comm* |
| leaks, half-made objects on errors  | CVE-2018-20123, CVE-2018-20126, CVE-2021-3608 | test_failed_*, test_qp_*  |

Every buffer the device could write holds a sentinel first, so "never written" cannot pass as success.
"""

from __future__ import annotations

import hashlib
import os
import select
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psutil
import pytest
from backend_process import BackendProcess, SimSide, connect_sides, query_device, start_side

from vrdma.device import abi
from vrdma.testing.frontend import VHOST_USER_F_PROTOCOL_FEATURES, VIRTIO_F_VERSION_1, Frontend, Virtqueue
from vrdma.testing.verbs import PAGE, PBL, SGE, CommandError, SimCq, SimQp, SimVerbs
from vrdma.vhost_user import protocol
from vrdma.vhost_user.protocol import Request

pytestmark = pytest.mark.backend

GID = {name: bytes.fromhex("00000000000000000000ffffa9fe64" + last) for name, last in (("vm0", "01"), ("vm1", "02"))}
STATUS = {name: abi.const(f"VRDMA_STATUS_{name}") for name in ("OK", "NOT_SUPPORTED", "INVALID", "NO_RESOURCES")}
WR = {name: abi.const(f"VRDMA_WR_{name}") for name in ("RDMA_WRITE", "SEND", "RDMA_READ")}
WC = {name: abi.const(f"VRDMA_WC_{name}") for name in ("SUCCESS", "LOC_LEN_ERR", "LOC_QP_OP_ERR", "LOC_PROT_ERR",
                                                         "WR_FLUSH_ERR", "REM_ACCESS_ERR", "REM_OP_ERR")}
EVENT = {name: abi.const(f"VRDMA_EVENT_{name}") for name in ("PORT_ACTIVE", "QP_FATAL", "CQ_ERR")}
QPS_ERR = abi.const("VRDMA_QPS_ERR")
SIGNALED = abi.const("VRDMA_SEND_SIGNALED")
SEND_WQE = abi.sizeof("vrdma_send_wqe")
RECV_WQE = abi.sizeof("vrdma_recv_wqe")
CQE = abi.sizeof("vrdma_cqe")
RESP_HDR = abi.sizeof("vrdma_resp_hdr")
LIMITS = {"max_sge": 16, "max_cqe": 65536, "max_qp_wr": 4096, "max_mr_size": 1 << 30, "max_msg_size": 1 << 31,
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


@pytest.fixture
def pair(backend: BackendProcess) -> Iterator[tuple[Side, Side]]:
    """(vm0, vm1) with their QPs connected to each other in RTS; each MR holds its sentinel pattern."""
    with backend.frontend("vm0") as fe0, backend.frontend("vm1") as fe1:
        a, b = make_side(fe0, backend, "vm0"), make_side(fe1, backend, "vm1")
        connect_sides(a, GID["vm0"], b, GID["vm1"])
        yield a, b


@dataclass
class Vm:
    """vm0 connected and started, with one user context, on a backend shared by a module's command-level tests."""

    backend: BackendProcess
    fe: Frontend
    verbs: SimVerbs


@pytest.fixture(scope="module")
def shared_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackendProcess]:
    process = BackendProcess(tmp_path_factory.mktemp("backend"))
    yield process
    assert process.stop() == 0, process.log_text()


@pytest.fixture
def vm0(shared_backend: BackendProcess) -> Iterator[Vm]:
    """A fresh vm0 connection: the device forgets everything of the last one when it closes, and the next test
    connects only once it has (the backend refuses a second connection while one is open)."""
    closed = shared_backend.connection("vm0")["closed"]
    with shared_backend.frontend("vm0") as fe:
        fe.start()
        yield Vm(shared_backend, fe, SimVerbs(fe, shared_backend.directory / "vm0.doorbell"))
    shared_backend.wait_for_closed("vm0", closed + 1)


def connected_qp(side: Side, peer: Side, peer_qp: SimQp, cq: SimCq | None = None, **kw: Any) -> SimQp:
    """A new QP of ``side`` in RTS towards ``peer_qp`` (which need not point back: RC writes only need the way in)."""
    qp = side.verbs.create_qp(side.pd, cq or side.cq, cq or side.cq, **kw)
    side.verbs.connect(qp, peer_qp.qpn, GID[peer.name])
    return qp


def wait_cqes(verbs: SimVerbs, cq: SimCq, count: int, timeout: float = 10.0) -> list[Any]:
    found: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(found) < count:
        found += verbs.poll_cq(cq)
        assert time.monotonic() < deadline, f"{len(found)} of {count} completions arrived"
        time.sleep(0.001)  # the engine runs in the backend process: poll what it wrote
    assert len(found) == count, f"{len(found)} completions, expected {count}"
    return found


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)


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


def sges(entries: list[tuple[int, int, int]]) -> bytes:
    return b"".join(abi.to_bytes(abi.new("vrdma_sge", addr=a, length=n, lkey=k)) for a, n, k in entries)


def put_send_wqe(verbs: SimVerbs, qp: SimQp, body: bytes, **fields: int) -> None:
    """Write any send WQE (fields as given, not as a correct provider would set them) into the next slot."""
    wqe = abi.to_bytes(abi.new("vrdma_send_wqe", **fields)) + body
    assert len(wqe) <= qp.sq_stride
    verbs.memory.write(qp.buf.gpa + qp.sq_offset + (qp.sq_prod % qp.sq_depth) * qp.sq_stride, wqe)
    qp.sq_prod += 1


def recv_wqe(wr_id: int, num_sge: int, body: bytes) -> bytes:
    return abi.to_bytes(abi.new("vrdma_recv_wqe", wr_id=wr_id, num_sge=num_sge)) + body


def put_recv_wqe(verbs: SimVerbs, qp: SimQp, srq: Any, wqe: bytes, producer: int) -> None:
    """Write a receive WQE into the first slot of the QP's receive queue (or of its SRQ) and store ``producer``,
    whatever it is, as that queue's producer index."""
    if srq is not None:
        verbs.memory.write(srq.buf.gpa + PAGE, wqe)
        verbs.ring(srq.db_slot, producer)
    else:
        verbs.memory.write(qp.buf.gpa + qp.rq_offset, wqe)
        verbs.ring(qp.rq_db_slot, producer)


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


def settled_fds(backend: BackendProcess, expected: int | None = None, timeout: float = 5.0) -> int:
    """The backend's open fd count, lowest of a few samples: an admin query leaves a connection behind for a moment,
    a leak stays."""
    directory = f"/proc/{backend.proc.pid}/fd"
    deadline = time.monotonic() + timeout
    lowest, samples = len(os.listdir(directory)), 1
    while time.monotonic() < deadline and (lowest != expected if expected is not None else samples < 20):
        time.sleep(0.01)
        lowest, samples = min(lowest, len(os.listdir(directory))), samples + 1
    return lowest


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


# == 1. unchecked SGE counts ==========================================================================================

@pytest.mark.parametrize(("qp_max_sge", "num_sge"), [(4, 5), (4, 255), (16, 17), (16, 255)])
def test_send_wqe_with_more_sges_than_its_qp_allows(backend: BackendProcess, pair: tuple[Side, Side],
                                                     qp_max_sge: int, num_sge: int) -> None:
    """CVE-2018-20124: pvrdma's generic RDMA back-end built the host scatter-gather array from a guest WQE's
    num_sge without checking it against the array (build_host_sge_array: out-of-bounds stack read/write; fixed by
    "rdma: check num_sge does not exceed MAX_SGE").

    Here a send WQE claims more SGEs than its QP was created with (the slot behind it full of valid SGEs, so reading
    past the limit would find something to use): it completes with LOC_QP_OP_ERR and nothing moved, the QP goes to
    the error state, the next WQE is flushed, and the peer's memory keeps its sentinel."""
    victim, attacker = pair
    qp = connected_qp(attacker, victim, victim.qp, max_sge=qp_max_sge)
    fit = (qp.sq_stride - SEND_WQE) // SGE
    body = sges([(attacker.mr.addr + 64 * i, 64, attacker.mr.lkey) for i in range(min(num_sge, fit))])
    put_send_wqe(attacker.verbs, qp, body, wr_id=0xBAD, opcode=WR["RDMA_WRITE"], send_flags=SIGNALED,
                 num_sge=num_sge, remote_addr=victim.mr.addr, rkey=victim.mr.rkey)
    attacker.verbs.post_send(qp, WR["SEND"], [(attacker.mr.addr, 8, attacker.mr.lkey)], wr_id=2)
    first, second = wait_cqes(attacker.verbs, attacker.cq, 2)
    assert (first.wr_id, first.status, first.byte_len) == (0xBAD, WC["LOC_QP_OP_ERR"], 0)
    assert (second.wr_id, second.status) == (2, WC["WR_FLUSH_ERR"])
    assert qp_state(attacker.verbs, qp) == QPS_ERR
    assert victim.untouched()
    assert engine(backend, "vm1")["bytes"] == 0


@pytest.mark.parametrize("num_sge", [5, 256, 0xFFFFFFFF])
@pytest.mark.parametrize("queue", ["receive queue", "SRQ"])
def test_receive_wqe_with_more_sges_than_its_queue_allows(backend: BackendProcess, pair: tuple[Side, Side],
                                                          queue: str, num_sge: int) -> None:
    """CVE-2018-20124 on the receive side (pvrdma's receive path built its SGE array the same way).

    A receive WQE (num_sge is 32 bits here) claims more SGEs than its receive queue or SRQ allows, its slot full of
    valid SGEs into the receiver's own MR. A SEND into it: the receiver's WQE completes with LOC_QP_OP_ERR and its
    QP goes to the error state, the sender's with REM_OP_ERR; not one byte lands in the receiver's MR."""
    sender, receiver = pair
    v = receiver.verbs
    srq = v.create_srq(receiver.pd, depth=16, max_sge=4) if queue == "SRQ" else None
    rqp = v.create_qp(receiver.pd, receiver.cq, receiver.cq, max_sge=4, srq=srq)
    sqp = connected_qp(sender, receiver, rqp)
    v.connect(rqp, sqp.qpn, GID[sender.name])
    stride = srq.stride if srq else rqp.rq_stride
    body = sges([(receiver.mr.addr + 256 * i, 256, receiver.mr.lkey) for i in range((stride - RECV_WQE) // SGE)])
    wqe = recv_wqe(0xBAD, num_sge, body)
    put_recv_wqe(v, rqp, srq, wqe, 1)
    sender.verbs.post_send(sqp, WR["SEND"], [(sender.mr.addr, 64, sender.mr.lkey)], wr_id=7)
    (received,) = wait_cqes(v, receiver.cq, 1)
    (sent,) = wait_cqes(sender.verbs, sender.cq, 1)
    assert (received.wr_id, received.status, received.byte_len) == (0xBAD, WC["LOC_QP_OP_ERR"], 0)
    assert (sent.wr_id, sent.status) == (7, WC["REM_OP_ERR"])
    assert qp_state(v, rqp) == QPS_ERR
    assert receiver.untouched()


@pytest.mark.parametrize("case", ["QP send SGEs above the device's", "QP receive SGEs above the device's",
                                  "QP send stride too small for its SGEs", "SRQ SGEs above the device's",
                                  "SRQ stride too small for its SGEs"])
def test_queue_with_more_sges_than_the_device_has_is_refused(vm0: Vm, case: str) -> None:
    """CVE-2018-20124's other half: the SGE limit is checked where a queue is created, so a WQE slot can always
    hold the SGEs its queue allows. Each bad CREATE is refused with STATUS_INVALID and creates nothing."""
    backend, v = vm0.backend, vm0.verbs
    pd, cq = v.alloc_pd(), v.create_cq(16)
    before = objects(backend, "vm0")
    too_many = LIMITS["max_sge"] + 1
    if case.startswith("QP"):
        fields = create_qp_fields(v, pd, cq.handle)
        if case == "QP send SGEs above the device's":
            fields.update(max_send_sge=too_many, sq_stride=1024)
        elif case == "QP receive SGEs above the device's":
            fields.update(max_recv_sge=too_many, rq_stride=1024)
        else:
            fields.update(max_send_sge=16)  # 64 + 16 * 16 bytes do not fit a 128-byte slot
        status = status_of(lambda: create_qp(v, fields))
    else:
        fields = create_srq_fields(v, pd)
        if case == "SRQ SGEs above the device's":
            fields.update(max_sge=too_many, stride=1024)
        else:
            fields.update(max_sge=16)
        status = status_of(lambda: v.call("VRDMA_CMD_CREATE_SRQ", "vrdma_cmd_create_srq",
                                          "vrdma_resp_create_srq", **fields))
    assert status == STATUS["INVALID"]
    assert objects(backend, "vm0") == before


# == 2. ring page counts and sizes ====================================================================================

RING_PAGE_LISTS = ["no pages", "one page short", "one page too many", "2^32 - 1 pages", "one level of 513 pages",
                   "three levels", "zero levels", "list not page-aligned"]


def _spoil_ring(ring: dict[str, int], case: str) -> dict[str, int]:
    spoiled = dict(ring)
    if case == "no pages":
        spoiled["npages"] = 0
    elif case == "one page short":
        spoiled["npages"] -= 1
    elif case == "one page too many":
        spoiled["npages"] += 1
    elif case == "2^32 - 1 pages":
        spoiled.update(npages=0xFFFFFFFF, levels=2)
    elif case == "one level of 513 pages":
        spoiled.update(npages=PBL + 1, levels=1)
    elif case == "three levels":
        spoiled["levels"] = 3
    elif case == "zero levels":
        spoiled["levels"] = 0
    else:
        spoiled["addr"] += 8
    return spoiled


@pytest.mark.parametrize("case", RING_PAGE_LISTS)
@pytest.mark.parametrize("kind", ["CQ", "QP", "SRQ"])
def test_ring_whose_page_list_does_not_match_its_size_is_refused(vm0: Vm, kind: str,
                                                                 case: str) -> None:
    """CVE-2018-20125: pvrdma_ring_init trusted the page count a guest gave for a CQ/QP ring (NULL dereference or a
    huge allocation; fixed by "pvrdma: check number of pages when creating rings"). CVE-2021-3607: a ring of zero
    pages (fixed by "pvrdma: Ensure correct input on ring init": "Check the guest passed a non zero page count").
    CVE-2023-1544: a page count larger than one page table holds, read out of bounds later.

    Here a ring's page list must describe exactly the pages its size needs, with 1 or 2 levels, at an aligned
    address: anything else is refused with STATUS_INVALID, creates nothing, and the backend's RSS does not jump."""
    backend, v = vm0.backend, vm0.verbs
    pd, cq = v.alloc_pd(), v.create_cq(16)
    if kind == "CQ":
        fields = create_cq_fields(v, 1024)  # 9 pages: header and 1024 CQEs
        command = CQ
    elif kind == "QP":
        fields = create_qp_fields(v, pd, cq.handle)
        command = QP
    else:
        fields = create_srq_fields(v, pd, depth=256)
        command = SRQ
    before, memory = objects(backend, "vm0"), rss(backend)
    fields["ring"] = _spoil_ring(fields["ring"], case)
    assert status_of(lambda: v.call(*command, **fields)) == STATUS["INVALID"]
    assert objects(backend, "vm0") == before
    assert rss(backend) - memory < 4 << 20


@pytest.mark.parametrize(("kind", "field", "value"), [
    ("CQ", "entries", 0), ("CQ", "entries", 48), ("CQ", "entries", LIMITS["max_cqe"] * 2), ("CQ", "entries", 1 << 31),
    ("QP", "sq_depth", 0), ("QP", "sq_depth", 96), ("QP", "sq_depth", LIMITS["max_qp_wr"] * 2),
    ("QP", "rq_depth", 1 << 31), ("QP", "sq_stride", 8192), ("QP", "rq_stride", 16),
    ("QP", "sq_offset", 0), ("QP", "sq_offset", PAGE + 8), ("QP", "rq_offset", PAGE),
    ("SRQ", "depth", 0), ("SRQ", "depth", 1 << 31), ("SRQ", "stride", 8192),
])
def test_ring_of_an_impossible_size_is_refused(vm0: Vm, kind: str, field: str, value: int) -> None:
    """CVE-2018-20125 / CVE-2023-1544, the sizes: pvrdma computed a ring's extent from guest numbers it did not
    bound. Here depths and entry counts are powers of two within the advertised limits, strides powers of two that
    fit a page, the queues of a QP page-aligned after its header page and apart from each other: a ring breaking any
    rule is refused with STATUS_INVALID and nothing is created. Where the extent asked for is small enough to back
    with guest memory, the page list matches it exactly, so only the size rule can be what refuses it."""
    backend, v = vm0.backend, vm0.verbs
    pd, cq = v.alloc_pd(), v.create_cq(16)
    if kind == "CQ":
        fields = create_cq_fields(v, 16)
        command = CQ
    elif kind == "QP":
        fields = create_qp_fields(v, pd, cq.handle)
        command = QP
    else:
        fields = create_srq_fields(v, pd)
        command = SRQ
    fields[field] = value
    if kind == "CQ":
        extent = PAGE + fields["entries"] * CQE
    elif kind == "QP":
        extent = max(fields["sq_offset"] + fields["sq_depth"] * fields["sq_stride"],
                     fields["rq_offset"] + fields["rq_depth"] * fields["rq_stride"])
    else:
        extent = PAGE + fields["depth"] * fields["stride"]
    if 0 < extent <= 256 * PAGE:
        fields["ring"] = v.page_list(v.alloc(extent))
    before = objects(backend, "vm0")
    assert status_of(lambda: v.call(*command, **fields)) == STATUS["INVALID"]
    assert objects(backend, "vm0") == before


QP_RING_GAPS = ["gap before the send queue", "gap before the receive queue", "unused receive offset with an SRQ"]


@pytest.mark.parametrize("case", QP_RING_GAPS)
def test_qp_ring_larger_than_its_queues_is_refused(backend: BackendProcess, case: str) -> None:
    """CVE-2023-1544: "a crafted guest driver [could] allocate and initialize a huge number of page tables to be
    used as a ring" (fixed by bounding a ring's pages by what one page table holds); CVE-2018-20125: excessive
    allocation when creating QP/CQ rings.

    A QP's queues here need 2 pages after the header (64 x 64-byte send WQEs, 64 x 32-byte receive WQEs), but an
    offset puts a gigabyte of unused pages between them; the page list (262144 entries naming one guest page, three
    pages of guest RAM in all) matches that inflated extent. Expected: refused with STATUS_INVALID, since a QP ring
    needs no more pages than its header and its queues (the provider lays them out back to back); and eight tries
    leave the backend's RSS where it was (each accepted one costs 4 MiB of translated page tables)."""
    with backend.frontend("vm0") as fe:
        fe.start()
        v = SimVerbs(fe, backend.directory / "vm0.doorbell")
        pd, cq = v.alloc_pd(), v.create_cq(16)
        npages = PBL * PBL
        fields = create_qp_fields(v, pd, cq.handle, max_send_sge=0, max_recv_sge=0)
        fields.update(sq_stride=64, rq_stride=32, ring=aliased_pages(v, npages))
        if case == "gap before the send queue":
            fields.update(sq_offset=(npages - 2) * PAGE, rq_offset=(npages - 1) * PAGE)
        elif case == "gap before the receive queue":
            fields.update(sq_offset=PAGE, rq_offset=(npages - 1) * PAGE)
        else:
            srq = v.create_srq(pd)
            fields.update(srq=srq.handle, rq_depth=0, rq_stride=0, max_recv_sge=0, sq_offset=PAGE,
                          rq_offset=npages * PAGE)
        before, memory = objects(backend, "vm0"), rss(backend)
        statuses = [status_of(lambda: create_qp(v, fields)) for _ in range(8)]
        assert statuses == [STATUS["INVALID"]] * 8
        assert objects(backend, "vm0") == before
        assert rss(backend) - memory < 4 << 20


def test_translated_pages_of_a_vm_are_bounded(backend: BackendProcess) -> None:
    """CVE-2023-1544's lesson for MRs: each page of an MR's list costs the backend a translation (16 bytes) whatever
    guest page it names, so three guest pages can ask for 4 MiB of backend memory per 1 GiB MR, and max_mr of them
    for 16 GiB. A VM's translated pages are bounded as an HCA's translation table is (max_translated_pages): MRs
    past it are refused with STATUS_NO_RESOURCES, the backend's RSS grows by at most the budget's worth, and a
    deregistration gives its pages back."""
    budget, per_mr = LIMITS["max_translated_pages"], LIMITS["max_mr_size"] // PAGE
    with backend.frontend("vm0") as fe:
        fe.start()
        v = SimVerbs(fe, backend.directory / "vm0.doorbell")
        pd, pages = v.alloc_pd(), aliased_pages(v, per_mr)
        memory = rss(backend)

        def reg() -> Any:
            return v.call(*MR, pd=pd, access=0xF, iova=0x1_0000_0000, length=per_mr * PAGE, page_offset=0,
                          pages=pages)

        mrs = [reg() for _ in range(budget // per_mr)]
        statuses = [status_of(reg) for _ in range(8)]
        assert statuses == [STATUS["NO_RESOURCES"]] * 8
        assert objects(backend, "vm0")["mr"] == len(mrs)
        assert rss(backend) - memory < budget * 16 + (8 << 20)
        v.call("VRDMA_CMD_DEREG_MR", "vrdma_cmd_destroy", "vrdma_resp_hdr", handle=mrs.pop().handle)
        mrs.append(reg())
        assert status_of(reg) == STATUS["NO_RESOURCES"]


# == 3. integer overflow in address/length arithmetic ================================================================

MR_RANGES = {
    # case: (iova, length, page_offset, npages)
    "iova + length wraps 2^64": (2**64 - PAGE, 2 * PAGE, 0, 2),
    "length 2^64 - 1": (0x10000, 2**64 - 1, 0, 2),
    "length beyond its pages": (0x10000, 3 * PAGE, 0, 2),
    "pages beyond its length": (0x10000, PAGE, 0, 2),
    "page offset pushes it past its last page": (0x10000, 2 * PAGE, 100, 2),
    "page offset of a whole page": (0x10000, PAGE, PAGE, 2),
    "length 0": (0x10000, 0, 0, 1),
    "length above max_mr_size": (0x10000, LIMITS["max_mr_size"] + PAGE, 0, 2),
}


@pytest.mark.parametrize("case", MR_RANGES)
def test_mr_whose_range_wraps_or_disagrees_with_its_pages_is_refused(vm0: Vm, case: str) -> None:
    """CVE-2021-3582: pvrdma_map_to_pdir mremap()ed the MR's first page to the guest's length without checking it
    against the number of pages it had (fixed by "hw/rdma: Fix possible mremap overflow": ROUND_UP(length) must
    equal nchunks * TARGET_PAGE_SIZE).

    Here an MR's [iova, iova + length) must not wrap 2^64, and page_offset + length must need exactly the pages of
    its list: REG_MR is refused with STATUS_INVALID and no MR is created."""
    iova, length, offset, npages = MR_RANGES[case]
    backend, v = vm0.backend, vm0.verbs
    pd = v.alloc_pd()
    pages = v.page_list(v.alloc(npages * PAGE))
    before = objects(backend, "vm0")
    status = status_of(lambda: v.call("VRDMA_CMD_REG_MR", "vrdma_cmd_reg_mr", "vrdma_resp_reg_mr", pd=pd,
                                      access=0xF, iova=iova, length=length, page_offset=offset, pages=pages))
    assert status == STATUS["INVALID"]
    assert objects(backend, "vm0") == before


HIGH_IOVA = 2**64 - 3 * PAGE  # an MR at the top of the address space: [HIGH_IOVA, 2^64 - PAGE)


@pytest.mark.parametrize("case", ["local SGE address wraps", "local SGE length runs past 2^64",
                                  "remote address wraps", "remote range runs past the MR's end",
                                  "remote address below the MR"])
@pytest.mark.parametrize("opcode", ["RDMA_WRITE", "RDMA_READ"])
def test_work_request_whose_range_wraps_is_refused(backend: BackendProcess, pair: tuple[Side, Side], case: str,
                                                   opcode: str) -> None:
    """CVE-2021-3582's arithmetic on the data path: every `addr + len` of an SGE or a remote access is checked in a
    way that cannot wrap. Both MRs sit at the top of the 64-bit address space, where a naive `addr + len <= end`
    wraps and passes.

    A bad local range completes with LOC_PROT_ERR, a bad remote one with REM_ACCESS_ERR; the QP goes to the error
    state; neither VM's memory changes."""
    victim, attacker = pair
    mrs = {}
    for side in (victim, attacker):
        buf = side.verbs.alloc(2 * PAGE)
        side.verbs.memory.write(buf.gpa, pattern(side.name + " high", 2 * PAGE))
        resp = side.verbs.call("VRDMA_CMD_REG_MR", "vrdma_cmd_reg_mr", "vrdma_resp_reg_mr", pd=side.pd, access=0xF,
                               iova=HIGH_IOVA, length=2 * PAGE, page_offset=0, pages=side.verbs.page_list(buf))
        mrs[side.name] = (buf.gpa, int(resp.lkey), int(resp.rkey))
    _, lkey, _ = mrs[attacker.name]
    _, _, rkey = mrs[victim.name]
    local, remote = (HIGH_IOVA, 64, lkey), HIGH_IOVA
    expected = WC["REM_ACCESS_ERR"]
    if case == "local SGE address wraps":
        local, expected = (2**64 - 16, 64, lkey), WC["LOC_PROT_ERR"]
    elif case == "local SGE length runs past 2^64":
        local, expected = (HIGH_IOVA + PAGE, 0xFFFFFFFF, lkey), WC["LOC_PROT_ERR"]
    elif case == "remote address wraps":
        remote = 2**64 - 16
    elif case == "remote range runs past the MR's end":
        remote = 2**64 - PAGE - 32  # 32 bytes left in the MR, 64 asked: the end is past it (and near 2^64)
    else:
        remote = HIGH_IOVA - 32
    attacker.verbs.post_send(attacker.qp, WR[opcode], [local], wr_id=0xBAD, remote_addr=remote, rkey=rkey)
    (done,) = wait_cqes(attacker.verbs, attacker.cq, 1)
    assert (done.wr_id, done.status, done.byte_len) == (0xBAD, expected, 0)
    assert qp_state(attacker.verbs, attacker.qp) == QPS_ERR
    for side in (victim, attacker):
        gpa = mrs[side.name][0]
        assert side.verbs.memory.read(gpa, 2 * PAGE) == pattern(side.name + " high", 2 * PAGE)
        assert side.untouched()


def test_message_whose_length_sum_exceeds_the_limit_is_refused(backend: BackendProcess,
                                                               pair: tuple[Side, Side]) -> None:
    """CVE-2021-3582's class, summed: three 1 GiB SGEs (each inside a 1 GiB MR built from three aliased guest
    pages) make a 3 GiB message, above max_msg_size (2 GiB). The sum is checked before anything is copied: the
    SEND completes with LOC_LEN_ERR, nothing moves and the receive WQE the peer posted is not consumed."""
    victim, attacker = pair
    gib = LIMITS["max_mr_size"]
    big = attacker.verbs.call("VRDMA_CMD_REG_MR", "vrdma_cmd_reg_mr", "vrdma_resp_reg_mr", pd=attacker.pd,
                              access=0xF, iova=0x1_0000_0000, length=gib, page_offset=0,
                              pages=aliased_pages(attacker.verbs, gib // PAGE))
    victim.verbs.post_recv(victim.qp, [(victim.mr.addr, MR_SIZE, victim.mr.lkey)], wr_id=5)
    attacker.verbs.post_send(attacker.qp, WR["SEND"], [(0x1_0000_0000, gib, int(big.lkey))] * 3, wr_id=0xBAD)
    (done,) = wait_cqes(attacker.verbs, attacker.cq, 1)
    assert (done.wr_id, done.status, done.byte_len) == (0xBAD, WC["LOC_LEN_ERR"], 0)
    assert engine(backend, "vm1")["bytes"] == engine(backend, "vm0")["recv_wqes"] == 0
    assert victim.untouched()


# == 4. loops that trust ring indices =================================================================================

@pytest.mark.parametrize("producer", [65, 0x7FFF0000, 0xFFFFFFFF])
def test_garbage_send_producer_index_runs_nothing(backend: BackendProcess, pair: tuple[Side, Side],
                                                  producer: int) -> None:
    """CVE-2018-20216: pvrdma_qp_send/recv looped while pvrdma_idx_ring_has_data() was nonzero, and its -1 for an
    invalid index counted as "data": an infinite loop (fixed by "pvrdma: check return value from
    pvrdma_idx_ring_has_ routines"). CVE-2023-1544: an index past the ring made pvrdma_ring_next_elem_read read out
    of bounds.

    Here a 64-deep send queue, every slot holding a valid signaled RDMA WRITE into the victim, gets a producer index
    more than 64 ahead of the consumer. The engine runs none of them: the QP goes to the error state with one
    QP_FATAL event, no completion is written, the victim's memory keeps its sentinel, and both VMs are served."""
    victim, attacker = pair
    v = attacker.verbs
    events_ready(v)
    cq = v.create_cq(64)
    qp = connected_qp(attacker, victim, victim.qp, cq=cq)
    for i in range(qp.sq_depth):
        v.post_send(qp, WR["RDMA_WRITE"], [(attacker.mr.addr, 64, attacker.mr.lkey)], wr_id=i, ring=False,
                    remote_addr=victim.mr.addr + 64 * i, rkey=victim.mr.rkey)
    v.ring(qp.sq_db_slot, producer)
    v.fe.queues[abi.const("VRDMA_QUEUE_WAKE")].notify()
    wait_for(lambda: engine(backend, "vm1")["qp_fatal"] == 1, "QP_FATAL")
    assert [(e.type, e.handle) for e in v.wait_events()] == [(EVENT["QP_FATAL"], qp.handle)]
    assert engine(backend, "vm1")["send_wqes"] == 0
    assert qp_state(v, qp) == QPS_ERR
    assert victim.untouched()
    round_trip(attacker, victim, wr_id=99)  # the engine passed over the broken QP again: still nothing from it
    assert v.poll_cq(cq) == []
    assert device_answers(victim.verbs.fe)


@pytest.mark.parametrize("queue", ["receive queue", "SRQ"])
def test_garbage_receive_producer_index_breaks_only_that_queue(backend: BackendProcess, pair: tuple[Side, Side],
                                                               queue: str) -> None:
    """CVE-2018-20216 on the receive side (pvrdma_qp_recv's loop) and CVE-2023-1544's out-of-ring read.

    A receive queue or SRQ whose producer index claims far more WQEs than it holds (its one real WQE names the
    receiver's MR): a SEND into it completes with REM_OP_ERR, the receiving QP is reported QP_FATAL, no receive
    completion is written and no byte lands in the receiver's memory."""
    sender, receiver = pair
    v = receiver.verbs
    events_ready(v)
    cq = v.create_cq(64)
    srq = v.create_srq(receiver.pd, depth=16) if queue == "SRQ" else None
    rqp = v.create_qp(receiver.pd, cq, cq, srq=srq)
    sqp = connected_qp(sender, receiver, rqp)
    v.connect(rqp, sqp.qpn, GID[sender.name])
    wqe = recv_wqe(1, 1, sges([(receiver.mr.addr, MR_SIZE, receiver.mr.lkey)]))
    put_recv_wqe(v, rqp, srq, wqe, 0x7FFF0000)
    sender.verbs.post_send(sqp, WR["SEND"], [(sender.mr.addr, 64, sender.mr.lkey)], wr_id=7)
    (sent,) = wait_cqes(sender.verbs, sender.cq, 1)
    assert (sent.wr_id, sent.status) == (7, WC["REM_OP_ERR"])
    fatal = [(e.type, e.handle) for e in v.wait_events()]
    assert fatal[0] == (EVENT["QP_FATAL"], rqp.handle)
    assert engine(backend, "vm1")["recv_wqes"] == 0
    assert receiver.untouched()
    assert all(c.status != WC["SUCCESS"] for c in v.poll_cq(cq))
    round_trip(receiver, sender, wr_id=99)


@pytest.mark.parametrize("how", ["QP moved to the error state", "QP made fatal by a SEND"])
def test_garbage_receive_index_flushes_at_most_one_ring(backend: BackendProcess, pair: tuple[Side, Side],
                                                        how: str) -> None:
    """CVE-2018-20216: a loop bounded by a guest's ring index instead of by the ring.

    A QP in the error state flushes its posted receives; its 64-deep receive queue holds at most 64. Its producer
    index says 0x7FFF0000. Expected: at most 64 flushes, however many passes the engine makes (twenty round trips on
    another QP make at least twenty). Observed before the fix: 64 more on every pass (hundreds of millions a second,
    one core spinning until the consumer index reaches the garbage one, and a new store starts it again)."""
    victim, attacker = pair
    v = attacker.verbs
    cq = v.create_cq(64)
    if how == "QP moved to the error state":
        qp = v.create_qp(attacker.pd, cq, cq)
        v.modify_qp(qp, abi.const("VRDMA_QP_STATE"), qp_state=QPS_ERR)
        v.ring(qp.rq_db_slot, 0x7FFF0000)
    else:
        qp = v.create_qp(attacker.pd, cq, cq)
        peer = connected_qp(victim, attacker, qp)
        v.connect(qp, peer.qpn, GID[victim.name])
        v.ring(qp.rq_db_slot, 0x7FFF0000)
        victim.verbs.post_send(peer, WR["SEND"], [(victim.mr.addr, 8, victim.mr.lkey)], wr_id=7)
        assert wait_cqes(victim.verbs, victim.cq, 1)[0].status == WC["REM_OP_ERR"]
    for i in range(20):
        round_trip(attacker, victim, wr_id=100 + i)
    assert engine(backend, "vm1")["flushed"] <= qp.rq_depth


@pytest.mark.parametrize("consumer", [1, 0x80000000, 0xFFFFFF00])
def test_garbage_cq_consumer_index_never_writes_outside_the_ring(backend: BackendProcess, pair: tuple[Side, Side],
                                                                 consumer: int) -> None:
    """CVE-2023-1544's direction reversed (pvrdma wrote CQEs at an index the guest's ring state steered): a CQ
    whose consumer index (guest-written) is ahead of the producer, or further behind it than the ring holds.

    The next completion finds the ring "full": the CQ goes to the error state (overflow flag, CQ_ERR event,
    cq_overflows counted) and nothing is written into the ring or the rest of its buffer."""
    victim, attacker = pair
    v = attacker.verbs
    events_ready(v)
    cq = v.create_cq(16)
    qp = connected_qp(attacker, victim, victim.qp, cq=cq)
    entries = cq.buf.size - PAGE
    v.memory.write(cq.buf.gpa + PAGE, bytes([SENTINEL]) * entries)
    v.memory.write(cq.buf.gpa + 4, struct.pack("<I", consumer))
    v.post_send(qp, WR["RDMA_WRITE"], [(attacker.mr.addr, 8, attacker.mr.lkey)], wr_id=1,
                remote_addr=victim.mr.addr, rkey=victim.mr.rkey)
    wait_for(lambda: v.cq_overflowed(cq), "the CQ's overflow flag")
    assert [(e.type, e.handle) for e in v.wait_events()] == [(EVENT["CQ_ERR"], cq.handle)]
    assert engine(backend, "vm1")["cq_overflows"] == 1
    assert struct.unpack("<I", v.memory.read(cq.buf.gpa, 4))[0] == 0  # prod: no CQE was written
    assert v.memory.read(cq.buf.gpa + PAGE, entries) == bytes([SENTINEL]) * entries


# == 5. commands before their buffers exist ===========================================================================

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
        wait_for(lambda: not select.select([vq.kick for vq in fe.queues], [], [], 0)[0], "the kicks to be read")
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
    "CREATE_QP, kernel context": ("CREATE_QP", "vrdma_cmd_create_qp", "vrdma_resp_create_qp",
                                  lambda h: _qp(h, ucontext=0), "NOT_SUPPORTED"),
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


@pytest.mark.parametrize("opcode", [0, abi.const("VRDMA_CMD_MODIFY_CQ") + 1, 0xFFFF])
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


# == 6. leaks and half-initialised objects on error paths =============================================================

@dataclass
class Failing:
    """A create that fails half-way, and the same create done right."""

    command: tuple[str, str, str]
    bad: dict[str, Any]
    good: dict[str, Any]
    status: str


def _big_qp(v: SimVerbs, pd: int, cq: int) -> dict[str, Any]:
    """521 pages (two levels): a leaked translation table would cost 8 KiB a failure, visible in RSS."""
    return create_qp_fields(v, pd, cq, sq_depth=4096, rq_depth=1024, max_send_sge=16, max_recv_sge=1)


def _ring_pages(v: SimVerbs, ring: dict[str, int]) -> list[int]:
    """The data pages a (correct) page list names."""
    tables = [ring["addr"]] if ring["levels"] == 1 else list(
        struct.unpack(f"<{-(-ring['npages'] // PBL)}Q", v.memory.read(ring["addr"], 8 * -(-ring["npages"] // PBL))))
    pages: list[int] = []
    for table in tables:
        n = min(PBL, ring["npages"] - len(pages))
        pages += struct.unpack(f"<{n}Q", v.memory.read(table, 8 * n))
    return pages


def _with_bad_page(v: SimVerbs, ring: dict[str, int], index: int) -> dict[str, int]:
    pages = _ring_pages(v, ring)
    pages[index] = v.memory.size + OUTSIDE
    return page_list(v, pages)


def _second_list_outside(v: SimVerbs, ring: dict[str, int]) -> dict[str, int]:
    directory = v.alloc(PAGE).gpa
    first = struct.unpack("<Q", v.memory.read(ring["addr"], 8))[0]
    v.memory.write(directory, struct.pack("<2Q", first, v.memory.size + OUTSIDE))
    return {**ring, "addr": directory}




def _qp_directory_outside(v: SimVerbs, pd: int, cq: int) -> Failing:
    good = _big_qp(v, pd, cq)
    return Failing(QP, {**good, "ring": {**good["ring"], "addr": v.memory.size + OUTSIDE}}, good, "INVALID")


def _qp_second_list_outside(v: SimVerbs, pd: int, cq: int) -> Failing:
    good = _big_qp(v, pd, cq)
    return Failing(QP, {**good, "ring": _second_list_outside(v, good["ring"])}, good, "INVALID")


def _qp_data_page_outside(v: SimVerbs, pd: int, cq: int) -> Failing:
    good = _big_qp(v, pd, cq)
    return Failing(QP, {**good, "ring": _with_bad_page(v, good["ring"], 300)}, good, "INVALID")


def _cq_data_page_outside(v: SimVerbs, pd: int, cq: int) -> Failing:
    good = create_cq_fields(v, LIMITS["max_cqe"])
    return Failing(CQ, {**good, "ring": _with_bad_page(v, good["ring"], 500)}, good, "INVALID")


def _srq_data_page_outside(v: SimVerbs, pd: int, cq: int) -> Failing:
    good = create_srq_fields(v, pd, depth=4096, max_sge=16)
    return Failing(SRQ, {**good, "ring": _with_bad_page(v, good["ring"], 510)}, good, "INVALID")


def _mr_page_outside(v: SimVerbs, pd: int, cq: int) -> Failing:
    good: dict[str, Any] = {"pd": pd, "access": 0xF, "iova": 0x10000, "length": 1024 * PAGE,
                            "pages": v.page_list(v.alloc(1024 * PAGE))}
    return Failing(MR, {**good, "pages": _with_bad_page(v, good["pages"], 1023)}, good, "INVALID")


FAILURES: dict[str, Callable[[SimVerbs, int, int], Failing]] = {
    "QP: page-list directory outside guest RAM": _qp_directory_outside,
    "QP: second page-list page outside guest RAM": _qp_second_list_outside,
    "QP: data page 300 of 521 outside guest RAM": _qp_data_page_outside,
    "CQ: data page 500 of 513 outside guest RAM": _cq_data_page_outside,
    "SRQ: data page 510 of 513 outside guest RAM": _srq_data_page_outside,
    "MR: page 1023 of 1024 outside guest RAM": _mr_page_outside,
}


@pytest.mark.parametrize("case", FAILURES)
def test_failed_creates_leave_nothing_behind(backend: BackendProcess, case: str) -> None:
    """CVE-2018-20126: create_cq_ring/create_qp_rings did not free the ring objects when creation failed ("memory
    leakage when creating cq/qp"; fixed by "pvrdma: release ring object in case of an error"). CVE-2021-3608:
    pvrdma_ring_init skipped a NULL page-table entry, left that slot of its page array uninitialised, and its error
    path unmapped it (fixed by "pvrdma: Fix the ring init error flow": g_malloc0).

    A create whose page list goes bad half-way (a directory, a second-level list, or one data page in the middle
    outside guest RAM: the device has taken a table slot, doorbell slots, a handle and translated part of the list
    by then) is refused 1000 times. Afterwards object counts, doorbell pages and the backend's fds are exactly what
    they were and its RSS is flat; nothing half-made remains: the PD, CQ and context the failed creates named are
    still free to go, and the same create done right succeeds (its table slot in the engine is free)."""
    with backend.frontend("vm0") as fe:
        fe.start()
        v = SimVerbs(fe, backend.directory / "vm0.doorbell")
        pd, cq = v.alloc_pd(), v.create_cq(16)
        failing = FAILURES[case](v, pd, cq.handle)
        for _ in range(100):  # warm-up: allocator arenas, log buffers, the first command's one-time work
            assert status_of(lambda: v.call(*failing.command, **failing.bad)) == STATUS[failing.status]
        counters = backend.counters("vm0")
        fds, memory = settled_fds(backend), rss(backend)
        statuses = {status_of(lambda: v.call(*failing.command, **failing.bad)) for _ in range(1000)}
        assert statuses == {STATUS[failing.status]}
        assert rss(backend) - memory < 1 << 20, "RSS grew over 1000 failed creates"
        after = backend.counters("vm0")
        assert (after["objects"], after["doorbell_pages"]) == (counters["objects"], counters["doorbell_pages"])
        assert settled_fds(backend, fds) == fds
        made = v.call(*failing.command, **failing.good)
        kind = failing.command[0].removeprefix("VRDMA_CMD_")
        destroy = {"CREATE_QP": "DESTROY_QP", "CREATE_CQ": "DESTROY_CQ", "CREATE_SRQ": "DESTROY_SRQ",
                   "REG_MR": "DEREG_MR"}[kind]
        for opcode, handle in ((destroy, int(made.handle)), ("DESTROY_CQ", cq.handle), ("DEALLOC_PD", pd),
                               ("DEALLOC_UCONTEXT", v.ucontext)):
            v.call(f"VRDMA_CMD_{opcode}", "vrdma_cmd_destroy", "vrdma_resp_hdr", handle=handle)
        final = backend.counters("vm0")
        assert set(final["objects"].values()) == {0} and final["doorbell_pages"] == []


def test_qp_create_that_runs_out_of_doorbell_slots_half_way_gives_back_the_first(backend: BackendProcess) -> None:
    """CVE-2018-20126 (a failed QP creation must release what it took) with resources exhausted half-way: a context
    whose doorbell page has exactly one free slot asks for a QP (two slots). Each of 1000 attempts is refused with
    STATUS_NO_RESOURCES and gives its first slot back: the last slot still serves a CQ afterwards, and then no slot
    is left."""
    with backend.frontend("vm0") as fe:
        fe.start()
        v = SimVerbs(fe, backend.directory / "vm0.doorbell")
        pd = v.alloc_pd()
        fields = create_cq_fields(v, 1)  # every filler CQ shares this ring: none will ever complete
        cqs = [v.call("VRDMA_CMD_CREATE_CQ", "vrdma_cmd_create_cq", "vrdma_resp_create_cq", **fields)
               for _ in range(abi.const("VRDMA_DB_SLOTS") - 3)]  # slots 1..1021 of 1..1022
        qp = create_qp_fields(v, pd, int(cqs[0].handle))
        statuses = {status_of(lambda: create_qp(v, qp)) for _ in range(1000)}
        assert statuses == {STATUS["NO_RESOURCES"]}
        assert objects(backend, "vm0")["qp"] == 0
        last = v.call("VRDMA_CMD_CREATE_CQ", "vrdma_cmd_create_cq", "vrdma_resp_create_cq", **fields)
        assert int(last.db_slot) == abi.const("VRDMA_DB_SLOTS") - 2
        assert status_of(lambda: v.call("VRDMA_CMD_CREATE_CQ", "vrdma_cmd_create_cq", "vrdma_resp_create_cq",
                                        **fields)) == STATUS["NO_RESOURCES"]


def test_failed_device_setup_leaks_nothing(backend: BackendProcess) -> None:
    """CVE-2018-20123: pvrdma_realize did not release what it had allocated when device initialisation failed
    ("memory leakage in device hotplug"; fixed by "pvrdma: release device resources in case of an error").

    Here a VM's device set-up fails half-way, repeatedly: queues started, a context, PD, CQ and QP created, then
    ring addresses outside guest memory (a protocol error that closes the connection). After 200 such cycles the
    backend's fds are exactly what they were, its RSS is flat, and the VM holds no objects and no doorbell page."""
    cycles = 0

    def half_setup() -> None:
        nonlocal cycles
        with backend.frontend("vm0") as fe:
            fe.start()
            v = SimVerbs(fe, backend.directory / "vm0.doorbell")
            pd = v.alloc_pd()
            cq = v.create_cq(16)
            v.create_qp(pd, cq, cq)
            v.doorbells.close()
            far = fe.memory.size + 0x10000
            fe.send_raw(Request.SET_VRING_ADDR, struct.pack("<IIQQQQ", 0, 0, far, far, far, 0))
            cycles += 1
            connection = backend.wait_for_closed("vm0", cycles)
        assert connection["protocol_errors"] == cycles

    for _ in range(50):  # warm-up, as in test_backend_hostile_vm
        half_setup()
    fds, memory = settled_fds(backend), rss(backend)
    for _ in range(200):
        half_setup()
    counters = backend.counters("vm0")
    assert set(counters["objects"].values()) == {0} and counters["doorbell_pages"] == []
    assert settled_fds(backend, fds) == fds
    assert rss(backend) - memory < 1 << 20, "RSS grew over 200 failed set-ups"
