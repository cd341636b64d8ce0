"""The data-path objects of one device: MRs, CQs, SRQs, QPs and AHs, checked here and run by the data engine.

Every command field is checked before the engine sees it (the engine checks again what it relies on: it never
trusts its caller with guest memory either). Objects hold references the way the verbs require them to: a PD
with MRs, QPs, SRQs or AHs, a CQ with QPs, an SRQ with QPs, a user context with queues cannot go (BUSY). Keys
and QP numbers carry their table slot in their low bits and random or rotating bits above it, so a key is not
guessable from another key and a QP number is not reused at once.
"""

from __future__ import annotations

import errno
import logging
import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vrdma.device import abi, qp_states
from vrdma.device.commands import STATUS_BUSY, STATUS_INVALID, STATUS_NO_RESOURCES, STATUS_NOT_SUPPORTED, CommandFailed
from vrdma.device.objects import HandleTable
from vrdma.engine import NO_DEVICE, NO_SRQ, EngineError

if TYPE_CHECKING:
    from vrdma.device.model import RdmaDevice

log = logging.getLogger(__name__)

PAGE = abi.const("VRDMA_PAGE_SIZE")
PBL_ENTRIES = abi.const("VRDMA_PBL_ENTRIES")
ACCESS_ALL = 0xF
LOCAL_WRITE = abi.const("VRDMA_ACCESS_LOCAL_WRITE")
REMOTE_WRITE = abi.const("VRDMA_ACCESS_REMOTE_WRITE")
REMOTE_ATOMIC = abi.const("VRDMA_ACCESS_REMOTE_ATOMIC")
QPT_RC = abi.const("VRDMA_QPT_RC")
SEND_WQE = abi.sizeof("vrdma_send_wqe")
RECV_WQE = abi.sizeof("vrdma_recv_wqe")
SGE = abi.sizeof("vrdma_sge")
CQE = abi.sizeof("vrdma_cqe")
DB_SLOTS = abi.const("VRDMA_DB_SLOTS")
DB_SLOT_ALIVE = abi.const("VRDMA_DB_SLOT_ALIVE")
QPN_LIMIT = 1 << 24


def _pow2(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def _pages_for(nbytes: int) -> int:
    return (nbytes + PAGE - 1) // PAGE


class SlotTable:
    """Free slots of one engine table (lowest first)."""

    def __init__(self, size: int, first: int = 0) -> None:
        self.free = list(range(size - 1, first - 1, -1))

    def take(self) -> int | None:
        return self.free.pop() if self.free else None

    def give(self, slot: int) -> None:
        self.free.append(slot)


@dataclass
class Pd:
    ucontext: int
    refs: int = 0


@dataclass
class Mr:
    pd: int
    slot: int
    lkey: int
    rkey: int
    access: int
    iova: int
    length: int


@dataclass
class Cq:
    ucontext: int
    slot: int
    entries: int
    db_slot: int
    refs: int = 0


@dataclass
class Srq:
    ucontext: int
    pd: int
    slot: int
    depth: int
    max_sge: int
    db_slot: int
    refs: int = 0


@dataclass
class Qp:
    ucontext: int
    pd: int
    slot: int
    qpn: int
    send_cq: int
    recv_cq: int
    srq: int
    caps: dict[str, int]
    db_slots: list[int]
    attr: dict[str, Any] = field(default_factory=dict)


@dataclass
class Ah:
    pd: int
    sgid_index: int
    dgid: bytes


@dataclass
class UserContext:
    """What a user context holds: its PDs and the doorbell slots its queues use."""

    doorbell_page: int
    pds: set[int] = field(default_factory=set)
    queues: int = 0
    # Slot 0 (parked) and the last slot (alive) are the device's; the queues get the ones between.
    slots: SlotTable = field(default_factory=lambda: SlotTable(DB_SLOT_ALIVE, first=1))


class DataPath:
    def __init__(self, device: RdmaDevice) -> None:
        self.device = device
        limits = device.limits
        self.limits = limits
        self.ucontexts: HandleTable[UserContext] = HandleTable("ucontext", limits.doorbell_pages - 1)
        self.pds: HandleTable[Pd] = HandleTable("pd", limits.max_pd)
        self.mrs: HandleTable[Mr] = HandleTable("mr", limits.max_mr)
        self.cqs: HandleTable[Cq] = HandleTable("cq", limits.max_cq)
        self.srqs: HandleTable[Srq] = HandleTable("srq", limits.max_srq)
        self.qps: HandleTable[Qp] = HandleTable("qp", limits.max_qp)
        self.ahs: HandleTable[Ah] = HandleTable("ah", limits.max_ah)
        self.qpn_generation = 1
        self._reset_slots()

    def _reset_slots(self) -> None:
        limits = self.limits
        self.mr_slots = SlotTable(limits.max_mr)
        self.cq_slots = SlotTable(limits.max_cq)
        self.srq_slots = SlotTable(limits.max_srq)
        self.qp_slots = SlotTable(limits.max_qp)

    def clear(self) -> None:
        for table in (self.ucontexts, self.pds, self.mrs, self.cqs, self.srqs, self.qps, self.ahs):
            table.clear()
        self._reset_slots()

    def counts(self) -> dict[str, int]:
        return {"ucontext": len(self.ucontexts), "pd": len(self.pds), "mr": len(self.mrs), "cq": len(self.cqs),
                "srq": len(self.srqs), "qp": len(self.qps), "ah": len(self.ahs)}

    # -- helpers ----------------------------------------------------------------------------------------------

    def _engine(self, call: str, *args: Any) -> None:
        device = self.device
        try:
            getattr(device.fabric.engine, call)(*args)
        except EngineError as err:
            status = STATUS_NO_RESOURCES if err.errno == errno.ENOMEM else STATUS_INVALID
            raise CommandFailed(status, str(err)) from err

    def _pd(self, handle: int) -> Pd:
        pd = self.pds.get(handle)
        if pd is None:
            raise CommandFailed(STATUS_INVALID, f"no PD {handle:#x}")
        return pd

    def _ucontext(self, handle: int, what: str) -> UserContext:
        if handle == 0:
            raise CommandFailed(STATUS_NOT_SUPPORTED, f"{what} for kernel consumers is not supported")
        ctx = self.ucontexts.get(handle)
        if ctx is None:
            raise CommandFailed(STATUS_INVALID, f"no user context {handle:#x}")
        return ctx

    @staticmethod
    def _pages(ring: Any, expected: int, what: str) -> dict[str, int]:
        npages, levels = int(ring.npages), int(ring.levels)
        if npages != expected:
            raise CommandFailed(STATUS_INVALID, f"{what} spans {expected} pages, the page list has {npages}")
        if levels not in (1, 2) or (levels == 1 and npages > PBL_ENTRIES):
            raise CommandFailed(STATUS_INVALID, f"{what}: page list of {npages} pages with {levels} levels")
        if int(ring.addr) % PAGE:
            raise CommandFailed(STATUS_INVALID, f"{what}: page list address {int(ring.addr):#x} is not aligned")
        return {"addr": int(ring.addr), "npages": npages, "levels": levels}

    def _key(self, slot: int, avoid: int = -1) -> int:
        bits = self.limits.max_mr.bit_length() - 1
        while True:
            key = (secrets.randbits(32 - bits) << bits) | slot
            if key != avoid:
                return key

    def _db_slot(self, ctx: UserContext) -> int:
        slot = ctx.slots.take()
        if slot is None:
            raise CommandFailed(STATUS_NO_RESOURCES, f"all {DB_SLOTS - 1} doorbell slots of the context in use")
        return slot

    # -- user contexts and PDs --------------------------------------------------------------------------------

    def alloc_ucontext(self) -> tuple[int, int]:
        used = {ctx.doorbell_page for ctx in self.ucontexts.objects.values()}
        free = next((page for page in range(1, self.limits.doorbell_pages) if page not in used), None)
        if free is None or self.ucontexts.full():
            raise CommandFailed(STATUS_NO_RESOURCES, f"all {self.limits.doorbell_pages - 1} doorbell pages in use")
        handle = self.ucontexts.add(UserContext(free))
        self.device.set_alive(free, True)
        return handle, free

    def dealloc_ucontext(self, handle: int) -> None:
        ctx = self.ucontexts.get(handle)
        if ctx is None:
            raise CommandFailed(STATUS_INVALID, f"no user context {handle:#x}")
        if ctx.pds or ctx.queues:
            raise CommandFailed(STATUS_BUSY, f"user context {handle:#x} still has {len(ctx.pds)} PDs and "
                                             f"{ctx.queues} queues")
        self.ucontexts.remove(handle)
        self.device.set_alive(ctx.doorbell_page, False)

    def alloc_pd(self, ucontext: int) -> int:
        ctx = self.ucontexts.get(ucontext) if ucontext else None
        if ucontext and ctx is None:
            raise CommandFailed(STATUS_INVALID, f"no user context {ucontext:#x}")
        if self.pds.full():
            raise CommandFailed(STATUS_NO_RESOURCES, f"all {self.limits.max_pd} PDs in use")
        handle = self.pds.add(Pd(ucontext))
        if ctx is not None:
            ctx.pds.add(handle)
        return handle

    def dealloc_pd(self, handle: int) -> None:
        pd = self._pd(handle)
        if pd.refs:
            raise CommandFailed(STATUS_BUSY, f"PD {handle:#x} still has {pd.refs} objects")
        self.pds.remove(handle)
        ctx = self.ucontexts.get(pd.ucontext)
        if ctx is not None:
            ctx.pds.discard(handle)

    # -- memory regions ---------------------------------------------------------------------------------------

    def reg_mr(self, req: Any) -> tuple[int, int, int]:
        pd = self._pd(int(req.pd))
        access, length, iova, offset = int(req.access), int(req.length), int(req.iova), int(req.page_offset)
        if req.reserved:
            raise CommandFailed(STATUS_INVALID, "reserved field of REG_MR is not zero")
        if access & ~ACCESS_ALL:
            raise CommandFailed(STATUS_INVALID, f"unknown access flags {access:#x}")
        if access & (REMOTE_WRITE | REMOTE_ATOMIC) and not access & LOCAL_WRITE:
            raise CommandFailed(STATUS_INVALID, "remote write or atomic access needs local write access")
        if not 0 < length <= self.limits.max_mr_size:
            raise CommandFailed(STATUS_INVALID, f"MR length {length} (1 to {self.limits.max_mr_size} bytes)")
        if offset >= PAGE or iova + length > 2**64:
            raise CommandFailed(STATUS_INVALID, f"MR at {iova:#x} (page offset {offset}) of {length} bytes")
        pages = self._pages(req.pages, _pages_for(offset + length), "the MR")
        slot = self.mr_slots.take()
        if slot is None or self.mrs.full():
            if slot is not None:
                self.mr_slots.give(slot)
            raise CommandFailed(STATUS_NO_RESOURCES, f"all {self.limits.max_mr} MRs in use")
        lkey = self._key(slot)
        rkey = self._key(slot, avoid=lkey)
        handle = self.mrs.add(Mr(int(req.pd), slot, lkey, rkey, access, iova, length))
        try:
            self._engine("create", "mr", self.device.engine_index, slot, {
                "handle": handle, "pd": int(req.pd), "lkey": lkey, "rkey": rkey, "access": access,
                "page_offset": offset, "iova": iova, "length": length, "pages": pages})
        except CommandFailed:
            self.mrs.remove(handle)
            self.mr_slots.give(slot)
            raise
        pd.refs += 1
        return handle, lkey, rkey

    def dereg_mr(self, handle: int) -> None:
        mr = self.mrs.remove(handle)
        if mr is None:
            raise CommandFailed(STATUS_INVALID, f"no MR {handle:#x}")
        self.device.fabric.engine.destroy("mr", self.device.engine_index, mr.slot)
        self.mr_slots.give(mr.slot)
        self.pds.objects[mr.pd].refs -= 1

    # -- completion queues ------------------------------------------------------------------------------------

    def create_cq(self, req: Any) -> tuple[int, int]:
        ctx = self._ucontext(int(req.ucontext), "a CQ")
        entries = int(req.entries)
        if not _pow2(entries) or entries > self.limits.max_cqe:
            raise CommandFailed(STATUS_INVALID, f"CQ of {entries} entries (a power of two up to "
                                                f"{self.limits.max_cqe})")
        pages = self._pages(req.ring, _pages_for(PAGE + entries * CQE), "the CQ ring")
        slot = self.cq_slots.take()
        if slot is None:
            raise CommandFailed(STATUS_NO_RESOURCES, f"all {self.limits.max_cq} CQs in use")
        try:
            db_slot = self._db_slot(ctx)
        except CommandFailed:
            self.cq_slots.give(slot)
            raise
        handle = self.cqs.add(Cq(int(req.ucontext), slot, entries, db_slot))
        try:
            self._engine("create", "cq", self.device.engine_index, slot, {
                "handle": handle, "entries": entries, "db_page": ctx.doorbell_page, "db_slot": db_slot,
                "ring": pages})
        except CommandFailed:
            self.cqs.remove(handle)
            self.cq_slots.give(slot)
            ctx.slots.give(db_slot)
            raise
        ctx.queues += 1
        return handle, db_slot

    def modify_cq(self, handle: int, count: int, period_us: int) -> None:
        """CQ moderation: one completion event per ``count`` completions or ``period_us`` after the first."""
        cq = self.cqs.get(handle)
        if cq is None:
            raise CommandFailed(STATUS_INVALID, f"no CQ {handle:#x}")
        self._engine("moderate_cq", self.device.engine_index, cq.slot, count, period_us)

    def destroy_cq(self, handle: int) -> None:
        cq = self.cqs.get(handle)
        if cq is None:
            raise CommandFailed(STATUS_INVALID, f"no CQ {handle:#x}")
        if cq.refs:
            raise CommandFailed(STATUS_BUSY, f"CQ {handle:#x} is used by {cq.refs} QPs")
        self.cqs.remove(handle)
        self.device.fabric.engine.destroy("cq", self.device.engine_index, cq.slot)
        self.cq_slots.give(cq.slot)
        self._release_queue(cq.ucontext, [cq.db_slot])

    def _release_queue(self, ucontext: int, db_slots: list[int]) -> None:
        ctx = self.ucontexts.get(ucontext)
        if ctx is not None:
            for slot in db_slots:
                ctx.slots.give(slot)
            ctx.queues -= 1

    # -- shared receive queues --------------------------------------------------------------------------------

    def create_srq(self, req: Any) -> tuple[int, int]:
        ctx = self._ucontext(int(req.ucontext), "an SRQ")
        pd = self._pd(int(req.pd))
        depth, stride, max_sge, limit = int(req.depth), int(req.stride), int(req.max_sge), int(req.srq_limit)
        if not _pow2(depth) or depth > self.limits.max_srq_wr:
            raise CommandFailed(STATUS_INVALID, f"SRQ depth {depth}")
        if not _pow2(stride) or not RECV_WQE + max_sge * SGE <= stride <= PAGE or max_sge > self.limits.max_srq_sge:
            raise CommandFailed(STATUS_INVALID, f"SRQ stride {stride} for {max_sge} SGEs")
        if limit >= depth:
            raise CommandFailed(STATUS_INVALID, f"SRQ limit {limit} is not below its depth {depth}")
        pages = self._pages(req.ring, _pages_for(PAGE + depth * stride), "the SRQ ring")
        slot = self.srq_slots.take()
        if slot is None:
            raise CommandFailed(STATUS_NO_RESOURCES, f"all {self.limits.max_srq} SRQs in use")
        try:
            db_slot = self._db_slot(ctx)
        except CommandFailed:
            self.srq_slots.give(slot)
            raise
        handle = self.srqs.add(Srq(int(req.ucontext), int(req.pd), slot, depth, max_sge, db_slot))
        try:
            self._engine("create", "srq", self.device.engine_index, slot, {
                "handle": handle, "pd": int(req.pd), "depth": depth, "stride": stride, "max_sge": max_sge,
                "limit": limit, "db_page": ctx.doorbell_page, "db_slot": db_slot, "ring": pages})
        except CommandFailed:
            self.srqs.remove(handle)
            self.srq_slots.give(slot)
            ctx.slots.give(db_slot)
            raise
        pd.refs += 1
        ctx.queues += 1
        return handle, db_slot

    def _srq(self, handle: int) -> Srq:
        srq = self.srqs.get(handle)
        if srq is None:
            raise CommandFailed(STATUS_INVALID, f"no SRQ {handle:#x}")
        return srq

    def modify_srq(self, req: Any) -> None:
        srq = self._srq(int(req.handle))
        mask = int(req.attr_mask)
        if mask & abi.const("VRDMA_SRQ_MAX_WR"):
            raise CommandFailed(STATUS_NOT_SUPPORTED, "resizing an SRQ is not supported")
        if mask & ~abi.const("VRDMA_SRQ_LIMIT"):
            raise CommandFailed(STATUS_INVALID, f"unknown SRQ attribute bits {mask:#x}")
        if mask and int(req.srq_limit) >= srq.depth:
            raise CommandFailed(STATUS_INVALID, f"SRQ limit {int(req.srq_limit)} is not below {srq.depth}")
        if mask:
            self._engine("set_srq_limit", self.device.engine_index, srq.slot, int(req.srq_limit))

    def query_srq(self, handle: int) -> tuple[int, int, int]:
        srq = self._srq(handle)
        limit = self.device.fabric.engine.srq_limit(self.device.engine_index, srq.slot)
        return srq.depth, srq.max_sge, limit

    def destroy_srq(self, handle: int) -> None:
        srq = self._srq(handle)
        if srq.refs:
            raise CommandFailed(STATUS_BUSY, f"SRQ {handle:#x} is used by {srq.refs} QPs")
        self.srqs.remove(handle)
        self.device.fabric.engine.destroy("srq", self.device.engine_index, srq.slot)
        self.srq_slots.give(srq.slot)
        self.pds.objects[srq.pd].refs -= 1
        self._release_queue(srq.ucontext, [srq.db_slot])

    # -- queue pairs ------------------------------------------------------------------------------------------

    def create_qp(self, req: Any) -> tuple[int, int, int, int]:
        ctx = self._ucontext(int(req.ucontext), "a QP")
        pd = self._pd(int(req.pd))
        if req.reserved1 or any(req.reserved0):
            raise CommandFailed(STATUS_INVALID, "reserved fields of CREATE_QP are not zero")
        if int(req.qp_type) != QPT_RC:
            raise CommandFailed(STATUS_NOT_SUPPORTED, f"QP type {int(req.qp_type)} (the device has RC QPs)")
        cqs = [self.cqs.get(int(req.send_cq)), self.cqs.get(int(req.recv_cq))]
        if None in cqs or any(cq.ucontext != int(req.ucontext) for cq in cqs if cq):
            raise CommandFailed(STATUS_INVALID, "the QP's CQs do not exist in its context")
        srq = self._srq(int(req.srq)) if req.srq else None
        limits = self.limits
        sq_depth, rq_depth = int(req.sq_depth), int(req.rq_depth)
        sq_stride, rq_stride = int(req.sq_stride), int(req.rq_stride)
        send_sge, recv_sge, inline = int(req.max_send_sge), int(req.max_recv_sge), int(req.max_inline_data)
        sq_offset, rq_offset = int(req.sq_offset), int(req.rq_offset)
        if not _pow2(sq_depth) or sq_depth > limits.max_qp_wr or send_sge > limits.max_sge or \
                inline > limits.max_inline_data or not _pow2(sq_stride) or \
                not SEND_WQE + max(send_sge * SGE, inline) <= sq_stride <= PAGE:
            raise CommandFailed(STATUS_INVALID, f"send queue: depth {sq_depth}, stride {sq_stride}, "
                                                f"{send_sge} SGEs, {inline} inline bytes")
        if srq is None and (not _pow2(rq_depth) or rq_depth > limits.max_qp_wr or recv_sge > limits.max_sge or
                            not _pow2(rq_stride) or not RECV_WQE + recv_sge * SGE <= rq_stride <= PAGE):
            raise CommandFailed(STATUS_INVALID, f"receive queue: depth {rq_depth}, stride {rq_stride}, "
                                                f"{recv_sge} SGEs")
        if srq is not None and (rq_depth or rq_stride or recv_sge):
            raise CommandFailed(STATUS_INVALID, "a QP with an SRQ has no receive queue of its own")
        end = max(sq_offset + sq_depth * sq_stride, rq_offset + rq_depth * rq_stride)
        pages = self._pages(req.ring, _pages_for(end), "the QP rings")
        slot = self.qp_slots.take()
        if slot is None:
            raise CommandFailed(STATUS_NO_RESOURCES, f"all {limits.max_qp} QPs in use")
        db_slots: list[int] = []
        try:
            for _ in range(1 if srq else 2):  # a loop, not a comprehension: a slot taken is in db_slots at once
                db_slots.append(self._db_slot(ctx))
        except CommandFailed:
            for db in db_slots:
                ctx.slots.give(db)
            self.qp_slots.give(slot)
            raise
        qpn = self._qpn(slot)
        caps = {"max_send_wr": sq_depth, "max_recv_wr": rq_depth if srq is None else 0,
                "max_send_sge": send_sge, "max_recv_sge": recv_sge, "max_inline_data": inline}
        qp = Qp(int(req.ucontext), int(req.pd), slot, qpn, int(req.send_cq), int(req.recv_cq), int(req.srq),
                caps, db_slots, {"qp_state": qp_states.RESET})
        handle = self.qps.add(qp)
        try:
            self._engine("create", "qp", self.device.engine_index, slot, {
                "handle": handle, "qpn": qpn, "pd": int(req.pd), "sq_sig_all": int(req.sq_sig_all),
                "send_cq": cqs[0].slot if cqs[0] else 0, "recv_cq": cqs[1].slot if cqs[1] else 0,
                "srq": srq.slot if srq else NO_SRQ, "sq_depth": sq_depth, "rq_depth": rq_depth,
                "sq_stride": sq_stride, "rq_stride": rq_stride, "sq_offset": sq_offset, "rq_offset": rq_offset,
                "max_send_sge": send_sge, "max_recv_sge": recv_sge, "max_inline": inline,
                "db_page": ctx.doorbell_page, "sq_db_slot": db_slots[0],
                "rq_db_slot": db_slots[1] if len(db_slots) > 1 else 0, "ring": pages})
        except CommandFailed:
            self.qps.remove(handle)
            self.qp_slots.give(slot)
            for db in db_slots:
                ctx.slots.give(db)
            raise
        pd.refs += 1
        for cq in cqs:
            assert cq is not None
            cq.refs += 1
        if srq is not None:
            srq.refs += 1
        ctx.queues += 1
        return handle, qpn, db_slots[0], db_slots[1] if len(db_slots) > 1 else 0

    def _qpn(self, slot: int) -> int:
        bits = self.limits.max_qp.bit_length() - 1
        generations = QPN_LIMIT >> bits
        qpn = (self.qpn_generation << bits) | slot
        self.qpn_generation = self.qpn_generation + 1 if self.qpn_generation + 1 < generations else 1
        return qpn

    def _qp(self, handle: int) -> Qp:
        qp = self.qps.get(handle)
        if qp is None:
            raise CommandFailed(STATUS_INVALID, f"no QP {handle:#x}")
        return qp

    def qp_state(self, qp: Qp) -> int:
        return self.device.fabric.engine.qp_state(self.device.engine_index, qp.slot)

    def modify_qp(self, req: Any) -> None:
        qp = self._qp(int(req.handle))
        mask = int(req.attr_mask)
        a = req.attr
        current = self.qp_state(qp)

        def bit(name: str) -> bool:
            return bool(mask & abi.const(f"VRDMA_QP_{name}"))

        try:
            target = qp_states.check_transition(current, mask, int(a.qp_state) if bit("STATE") else None,
                                                int(a.cur_qp_state) if bit("CUR_STATE") else None)
        except ValueError as err:
            raise CommandFailed(STATUS_INVALID, f"modify QP {qp.qpn:#x}: {err}") from err
        limits = self.limits
        checks = [
            (bit("ACCESS_FLAGS") and int(a.qp_access_flags) & ~ACCESS_ALL, "access flags"),
            (bit("PKEY_INDEX") and int(a.pkey_index) != 0, "pkey index (the table has 1 entry)"),
            (bit("PORT") and int(a.port_num) != 1, "port (the device has port 1)"),
            (bit("PATH_MTU") and not 1 <= int(a.path_mtu) <= 5, "path MTU"),
            (bit("DEST_QPN") and int(a.dest_qp_num) >= QPN_LIMIT, "destination QP number"),
            (bit("MIN_RNR_TIMER") and int(a.min_rnr_timer) > 31, "min RNR timer"),
            (bit("TIMEOUT") and int(a.timeout) > 31, "timeout"),
            (bit("RETRY_CNT") and int(a.retry_cnt) > 7, "retry count"),
            (bit("RNR_RETRY") and int(a.rnr_retry) > 7, "RNR retry"),
            (bit("MAX_QP_RD_ATOMIC") and int(a.max_rd_atomic) > limits.max_qp_rd_atom, "max_rd_atomic"),
            (bit("MAX_DEST_RD_ATOMIC") and int(a.max_dest_rd_atomic) > limits.max_qp_rd_atom, "max_dest_rd_atomic"),
            (bit("AV") and int(a.sgid_index) not in self.device.gids, "source GID index"),
            (bit("RQ_PSN") and int(a.rq_psn) >= 1 << 24, "RQ PSN"),
            (bit("SQ_PSN") and int(a.sq_psn) >= 1 << 24, "SQ PSN"),
        ]
        for bad, what in checks:
            if bad:
                raise CommandFailed(STATUS_INVALID, f"modify QP {qp.qpn:#x}: bad {what}")
        stored = qp.attr
        for name in ("qp_access_flags", "pkey_index", "port_num", "path_mtu", "dest_qp_num", "min_rnr_timer",
                     "timeout", "retry_cnt", "rnr_retry", "max_rd_atomic", "max_dest_rd_atomic", "rq_psn",
                     "sq_psn", "sgid_index", "hop_limit", "traffic_class", "flow_label", "en_sqd_async_notify"):
            stored.setdefault(name, 0)
        updates = {
            "ACCESS_FLAGS": ["qp_access_flags"], "PKEY_INDEX": ["pkey_index"], "PORT": ["port_num"],
            "PATH_MTU": ["path_mtu"], "DEST_QPN": ["dest_qp_num"], "MIN_RNR_TIMER": ["min_rnr_timer"],
            "TIMEOUT": ["timeout"], "RETRY_CNT": ["retry_cnt"], "RNR_RETRY": ["rnr_retry"],
            "MAX_QP_RD_ATOMIC": ["max_rd_atomic"], "MAX_DEST_RD_ATOMIC": ["max_dest_rd_atomic"],
            "RQ_PSN": ["rq_psn"], "SQ_PSN": ["sq_psn"], "EN_SQD_ASYNC_NOTIFY": ["en_sqd_async_notify"],
            "AV": ["sgid_index", "hop_limit", "traffic_class", "flow_label"],
        }
        for name, fields in updates.items():
            if bit(name):
                for f in fields:
                    stored[f] = int(getattr(a, f))
        if bit("AV"):
            stored["dgid"] = bytes(a.dgid)
        stored["qp_state"] = target
        dest_dev = self.device.fabric.route(stored["dgid"]) if "dgid" in stored else int(NO_DEVICE)
        self._engine("modify_qp", self.device.engine_index, qp.slot, {
            "state": target, "access_flags": stored["qp_access_flags"], "dest_dev": dest_dev,
            "dest_qpn": stored["dest_qp_num"], "min_rnr_timer": stored["min_rnr_timer"],
            "rnr_retry": stored["rnr_retry"], "retry_cnt": stored["retry_cnt"], "timeout": stored["timeout"]})
        if target == qp_states.RTR:
            log.info("%s: QP %#x -> QP %#x on %s", self.device.name, qp.qpn, stored["dest_qp_num"],
                     "an unknown GID" if dest_dev == NO_DEVICE else f"device {dest_dev}")

    def query_qp(self, handle: int, out: Any) -> None:
        qp = self._qp(handle)
        state = self.qp_state(qp)
        for name, value in qp.attr.items():
            if name == "dgid":
                out.dgid = list(value)
            elif name != "qp_state":
                setattr(out, name, value)
        out.qp_state = out.cur_qp_state = state
        for name, value in qp.caps.items():
            setattr(out, name, value)

    def destroy_qp(self, handle: int) -> None:
        qp = self._qp(handle)
        self.qps.remove(handle)
        self.device.fabric.engine.destroy("qp", self.device.engine_index, qp.slot)
        self.qp_slots.give(qp.slot)
        self.pds.objects[qp.pd].refs -= 1
        for cq_handle in (qp.send_cq, qp.recv_cq):
            self.cqs.objects[cq_handle].refs -= 1
        if qp.srq:
            self.srqs.objects[qp.srq].refs -= 1
        self._release_queue(qp.ucontext, qp.db_slots)

    # -- address handles --------------------------------------------------------------------------------------

    def create_ah(self, req: Any) -> int:
        pd = self._pd(int(req.pd))
        if any(req.reserved):
            raise CommandFailed(STATUS_INVALID, "reserved bytes of CREATE_AH are not zero")
        if int(req.sgid_index) not in self.device.gids:
            raise CommandFailed(STATUS_INVALID, f"source GID index {int(req.sgid_index)} is not set")
        if self.ahs.full():
            raise CommandFailed(STATUS_NO_RESOURCES, f"all {self.limits.max_ah} AHs in use")
        pd.refs += 1
        return self.ahs.add(Ah(int(req.pd), int(req.sgid_index), bytes(req.dgid)))

    def destroy_ah(self, handle: int) -> None:
        ah = self.ahs.remove(handle)
        if ah is None:
            raise CommandFailed(STATUS_INVALID, f"no AH {handle:#x}")
        self.pds.objects[ah.pd].refs -= 1
