"""Queue pairs: CREATE_QP checks the rings and capabilities, MODIFY_QP walks the state table (qp_states.py) and
checks every attribute, and the engine runs the QP between state changes.

A QP number carries its engine slot in its low bits and a rotating generation above them, so a QP number is not
reused at once (a peer still naming the old QP finds nothing).

XRC: an initiator is an RC requester without a receive queue (its messages name an XRC SRQ at the target); a
target is the guest kernel's (the kernel creates it for the processes sharing an XRC domain), has an XRC domain
and nothing else: no PD, CQs, rings or doorbells.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vrdma.device import abi, qp_states, rings
from vrdma.device.constants import QpType
from vrdma.device.cq import CompletionQueues
from vrdma.device.gid import Gid, GidTable
from vrdma.device.mr import ACCESS_ALL
from vrdma.device.params import DeviceLimits
from vrdma.device.pd import ProtectionDomains
from vrdma.device.pool import WireNumbers
from vrdma.device.seat import EngineSeat, refused_as_status
from vrdma.device.srq import SharedReceiveQueues
from vrdma.device.status import CommandFailed, Status
from vrdma.device.table import EngineObjectTable
from vrdma.device.ucontext import UserContext, UserContexts
from vrdma.device.xrcd import XrcDomains
from vrdma.engine.api import (
    NO_DEVICE,
    NO_SRQ,
    QP_GSI,
    QP_KERNEL,
    QP_UC,
    QP_UD,
    QP_XRC_INI,
    QP_XRC_TGT,
    QpConfig,
)

log = logging.getLogger(__name__)

GSI_QPN = abi.const("VRDMA_GSI_QPN")
# The state table and the engine flags of each QP type.
TYPES: dict[int, tuple[dict[tuple[int, int], tuple[int, int]], int]] = {
    QpType.RC: (qp_states.TRANSITIONS, 0),
    QpType.UC: (qp_states.UC_TRANSITIONS, QP_UC),
    QpType.UD: (qp_states.UD_TRANSITIONS, QP_UD),
    QpType.GSI: (qp_states.GSI_TRANSITIONS, QP_UD | QP_GSI),
    QpType.XRC_INI: (qp_states.XRC_INI_TRANSITIONS, QP_XRC_INI),
    QpType.XRC_TGT: (qp_states.XRC_TGT_TRANSITIONS, QP_XRC_TGT),
}
CONNECTED = (QpType.RC, QpType.UC, QpType.XRC_INI, QpType.XRC_TGT)
QPN_LIMIT = WireNumbers.LIMIT
PSN_LIMIT = 1 << 24
# Attributes MODIFY_QP stores, by the mask bit (VRDMA_QP_<bit>) that carries them.
STORED: dict[str, tuple[str, ...]] = {
    "ACCESS_FLAGS": ("qp_access_flags",), "PKEY_INDEX": ("pkey_index",), "PORT": ("port_num",),
    "PATH_MTU": ("path_mtu",), "DEST_QPN": ("dest_qp_num",), "MIN_RNR_TIMER": ("min_rnr_timer",),
    "TIMEOUT": ("timeout",), "RETRY_CNT": ("retry_cnt",), "RNR_RETRY": ("rnr_retry",),
    "MAX_QP_RD_ATOMIC": ("max_rd_atomic",), "MAX_DEST_RD_ATOMIC": ("max_dest_rd_atomic",),
    "RQ_PSN": ("rq_psn",), "SQ_PSN": ("sq_psn",), "EN_SQD_ASYNC_NOTIFY": ("en_sqd_async_notify",),
    "AV": ("sgid_index", "hop_limit", "traffic_class", "flow_label"), "QKEY": ("qkey",),
}
MASK_BIT = {name: abi.const(f"VRDMA_QP_{name}") for name in (*STORED, "STATE", "CUR_STATE")}


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
    dbs: list[int]  # doorbell indexes: its send queue's, then its receive queue's unless it has an SRQ
    attr: dict[str, Any] = field(default_factory=dict)
    qp_type: int = QpType.RC
    xrcd: int = 0  # an XRC target's domain


class QueuePairs(EngineObjectTable[Qp]):
    def __init__(self, owner: str, seat: EngineSeat, limits: DeviceLimits, ucontexts: UserContexts,
                 pds: ProtectionDomains, cqs: CompletionQueues, srqs: SharedReceiveQueues, xrcds: XrcDomains,
                 gids: GidTable, route: Callable[[bytes], int]) -> None:
        """``route(dgid)``: the engine index of the device holding that GID, or NO_DEVICE (the fabric's)."""
        super().__init__("qp", "QP", limits.max_qp, seat)
        self.owner = owner
        self.limits = limits
        self.ucontexts = ucontexts
        self.pds = pds
        self.cqs = cqs
        self.srqs = srqs
        self.xrcds = xrcds
        self.gids = gids
        self.route = route
        self.numbers = WireNumbers(self.pool.slot_bits)

    def create(self, req: Any) -> tuple[int, int, int, int]:
        ctx = self.ucontexts.for_queue(int(req.ucontext), "a QP")
        if any(req.reserved0):
            raise CommandFailed(Status.INVALID, "reserved fields of CREATE_QP are not zero")
        qp_type = int(req.qp_type)
        if qp_type not in TYPES:
            raise CommandFailed(Status.NOT_SUPPORTED, f"QP type {qp_type} (the device has RC, UC, UD, GSI and XRC "
                                                      f"QPs)")
        if qp_type == QpType.GSI and (ctx is not self.ucontexts.kernel or self.gsi_taken()):
            raise CommandFailed(Status.INVALID, "the GSI QP is the kernel's, and the device has one")
        if qp_type == QpType.XRC_TGT:
            return self._create_xrc_target(ctx, req)
        if req.xrcd:
            raise CommandFailed(Status.INVALID, "only an XRC target QP has an XRC domain")
        pd = self.pds.in_context(int(req.pd), int(req.ucontext))
        send_cq = self.cqs.in_context(int(req.send_cq), int(req.ucontext))
        initiator = qp_type == QpType.XRC_INI
        if initiator and (req.recv_cq or req.srq or req.rq_depth or req.rq_stride or req.rq_offset or
                          req.max_recv_sge):
            raise CommandFailed(Status.INVALID, "an XRC initiator QP has no receive side (no receive CQ, SRQ or "
                                                "receive queue)")
        recv_cq = None if initiator else self.cqs.in_context(int(req.recv_cq), int(req.ucontext))
        srq = self.srqs.in_context(int(req.srq), int(req.ucontext)) if req.srq else None
        if srq is not None and srq.xrcd:
            raise CommandFailed(Status.INVALID, f"SRQ {int(req.srq):#x} is an XRC SRQ: only XRC targets of its "
                                                f"domain deliver into it")
        own_rq = srq is None and not initiator
        limits = self.limits
        sq_depth, rq_depth = int(req.sq_depth), int(req.rq_depth)
        sq_stride, rq_stride = int(req.sq_stride), int(req.rq_stride)
        send_sge, recv_sge, inline = int(req.max_send_sge), int(req.max_recv_sge), int(req.max_inline_data)
        sq_offset, rq_offset = int(req.sq_offset), int(req.rq_offset)
        if not rings.pow2(sq_depth) or sq_depth > limits.max_qp_wr or send_sge > limits.max_sge or \
                inline > limits.max_inline_data or not rings.send_stride_ok(sq_stride, send_sge, inline):
            raise CommandFailed(Status.INVALID, f"send queue: depth {sq_depth}, stride {sq_stride}, "
                                                f"{send_sge} SGEs, {inline} inline bytes")
        if own_rq and (not rings.pow2(rq_depth) or rq_depth > limits.max_qp_wr or recv_sge > limits.max_sge or
                            not rings.recv_stride_ok(rq_stride, recv_sge)):
            raise CommandFailed(Status.INVALID, f"receive queue: depth {rq_depth}, stride {rq_stride}, "
                                                f"{recv_sge} SGEs")
        if srq is not None and (rq_depth or rq_stride or recv_sge):
            raise CommandFailed(Status.INVALID, "a QP with an SRQ has no receive queue of its own")
        pages = rings.page_list(req.ring, rings.qp_ring_pages(sq_offset, sq_depth, sq_stride, rq_offset, rq_depth,
                                                              rq_stride), "the QP ring")
        self.check_room()
        dbs = self.ucontexts.take_dbs(ctx, 2 if own_rq else 1)
        caps = {"max_send_wr": sq_depth, "max_recv_wr": rq_depth if own_rq else 0,
                "max_send_sge": send_sge, "max_recv_sge": recv_sge, "max_inline_data": inline}
        qp = Qp(int(req.ucontext), int(req.pd), 0, 0, int(req.send_cq), int(req.recv_cq), int(req.srq), caps,
                dbs, {"qp_state": qp_states.RESET}, qp_type)
        handle = self.add(qp)
        qp.qpn = GSI_QPN if qp_type == QpType.GSI else self.numbers.number(qp.slot)
        rq_db = dbs[1] if len(dbs) > 1 else 0
        config: QpConfig = {
            "handle": handle, "qpn": qp.qpn, "pd": int(req.pd), "sq_sig_all": int(req.sq_sig_all),
            "send_cq": send_cq.slot, "recv_cq": recv_cq.slot if recv_cq else 0, "srq": srq.slot if srq else NO_SRQ,
            "sq_depth": sq_depth, "rq_depth": rq_depth, "sq_stride": sq_stride, "rq_stride": rq_stride,
            "sq_offset": sq_offset, "rq_offset": rq_offset, "max_send_sge": send_sge, "max_recv_sge": recv_sge,
            "max_inline": inline, "sq_db": dbs[0], "rq_db": rq_db,
            "flags": (QP_KERNEL if ctx is self.ucontexts.kernel else 0) | TYPES[qp_type][1], "xrcd": 0,
            "ring": pages}
        self.create_in_engine(handle, self.seat.engine.create_qp, qp.slot, config,
                              undo=lambda: self.ucontexts.give_dbs(ctx, dbs))
        pd.refs += 1
        send_cq.refs += 1
        if recv_cq is not None:
            recv_cq.refs += 1
        if srq is not None:
            srq.refs += 1
        self.ucontexts.queue_created(ctx)
        return handle, qp.qpn, dbs[0], rq_db

    def _create_xrc_target(self, ctx: UserContext, req: Any) -> tuple[int, int, int, int]:
        """An XRC target QP: the kernel's, an XRC domain and a QP number, every other field zero."""
        if ctx is not self.ucontexts.kernel:
            raise CommandFailed(Status.INVALID, "XRC target QPs are the kernel's (ucontext 0)")
        unused = ("pd", "send_cq", "recv_cq", "srq", "sq_sig_all", "sq_depth", "rq_depth", "sq_stride", "rq_stride",
                  "sq_offset", "rq_offset", "max_send_sge", "max_recv_sge", "max_inline_data")
        if any(getattr(req, name) for name in unused) or req.ring.addr or req.ring.npages or req.ring.levels:
            raise CommandFailed(Status.INVALID, "an XRC target QP has an XRC domain and nothing else (no PD, CQs, "
                                                "SRQ or rings)")
        xrcd = self.xrcds.get(int(req.xrcd))
        self.check_room()
        caps = dict.fromkeys(("max_send_wr", "max_recv_wr", "max_send_sge", "max_recv_sge", "max_inline_data"), 0)
        qp = Qp(0, 0, 0, 0, 0, 0, 0, caps, [], {"qp_state": qp_states.RESET}, QpType.XRC_TGT, int(req.xrcd))
        handle = self.add(qp)
        qp.qpn = self.numbers.number(qp.slot)
        config: QpConfig = {
            "handle": handle, "qpn": qp.qpn, "pd": 0, "sq_sig_all": 0, "send_cq": 0, "recv_cq": 0, "srq": NO_SRQ,
            "sq_depth": 0, "rq_depth": 0, "sq_stride": 0, "rq_stride": 0, "sq_offset": 0, "rq_offset": 0,
            "max_send_sge": 0, "max_recv_sge": 0, "max_inline": 0, "sq_db": 0, "rq_db": 0, "flags": QP_XRC_TGT,
            "xrcd": qp.xrcd, "ring": rings.no_pages()}
        self.create_in_engine(handle, self.seat.engine.create_qp, qp.slot, config)
        xrcd.refs += 1
        self.ucontexts.queue_created(ctx)
        return handle, qp.qpn, 0, 0

    def gsi_taken(self) -> bool:
        return any(qp.qp_type == QpType.GSI for qp in self.pool.objects.values())

    def state(self, qp: Qp) -> int:
        return self.seat.engine.qp_state(self.seat.index, qp.slot)

    def modify(self, req: Any) -> None:
        qp = self.get(int(req.handle))
        mask = int(req.attr_mask)
        a = req.attr

        def bit(name: str) -> bool:
            return bool(mask & MASK_BIT[name])

        try:
            target = qp_states.check_transition(self.state(qp), mask, int(a.qp_state) if bit("STATE") else None,
                                                int(a.cur_qp_state) if bit("CUR_STATE") else None,
                                                TYPES[qp.qp_type][0])
        except ValueError as err:
            raise CommandFailed(Status.INVALID, f"modify QP {qp.qpn:#x}: {err}") from err
        self._check_attributes(qp, bit, a)
        stored = qp.attr
        for names in STORED.values():
            for name in names:
                stored.setdefault(name, 0)
        for bit_name, names in STORED.items():
            if bit(bit_name):
                for name in names:
                    stored[name] = int(getattr(a, name))
        if bit("AV"):
            stored["dgid"] = bytes(a.dgid)
        stored["qp_state"] = target
        dest_dev = self.route(stored["dgid"]) if "dgid" in stored else NO_DEVICE
        sgid = self.gids.entries.get(stored["sgid_index"])
        with refused_as_status():
            self.seat.engine.modify_qp(self.seat.index, qp.slot, {
                "state": target, "access_flags": stored["qp_access_flags"], "dest_dev": dest_dev,
                "dest_qpn": stored["dest_qp_num"], "min_rnr_timer": stored["min_rnr_timer"],
                "rnr_retry": stored["rnr_retry"], "retry_cnt": stored["retry_cnt"], "timeout": stored["timeout"],
                "qkey": stored["qkey"], "path_mtu": stored["path_mtu"], "sq_psn": stored["sq_psn"],
                "rq_psn": stored["rq_psn"], "max_rd_atomic": stored["max_rd_atomic"],
                "max_dest_rd_atomic": stored["max_dest_rd_atomic"],
                "sgid": list(sgid.raw if sgid is not None else bytes(16)), "dgid": list(stored.get("dgid", bytes(16)))})
        if target == qp_states.RTR and qp.qp_type in CONNECTED:
            log.info("%s: QP %#x -> QP %#x on %s", self.owner, qp.qpn, stored["dest_qp_num"],
                     f"GID {Gid(stored['dgid'], 0)} (not here)" if dest_dev == NO_DEVICE else f"device {dest_dev}")

    def _check_attributes(self, qp: Qp, bit: Callable[[str], bool], a: Any) -> None:
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
            (bit("AV") and int(a.sgid_index) not in self.gids, "source GID index"),
            (bit("RQ_PSN") and int(a.rq_psn) >= PSN_LIMIT, "RQ PSN"),
            (bit("SQ_PSN") and int(a.sq_psn) >= PSN_LIMIT, "SQ PSN"),
        ]
        for bad, what in checks:
            if bad:
                raise CommandFailed(Status.INVALID, f"modify QP {qp.qpn:#x}: bad {what}")

    def counters(self, handle: int) -> dict[str, int]:
        """The QP's own counters, kept by the data engine from its creation on."""
        qp = self.get(handle)
        return self.seat.engine.qp_counters(self.seat.index, qp.slot)

    def query(self, handle: int, out: Any) -> None:
        qp = self.get(handle)
        state = self.state(qp)
        for name, value in qp.attr.items():
            if name == "dgid":
                out.dgid = list(value)
            elif name != "qp_state":
                setattr(out, name, value)
        out.qp_state = out.cur_qp_state = state
        for name, value in qp.caps.items():
            setattr(out, name, value)

    def destroy(self, handle: int) -> None:
        qp = self.get(handle)
        self.pool.remove(handle)
        self.seat.engine.destroy_qp(self.seat.index, qp.slot)
        if qp.pd:
            self.pds.release(qp.pd)
        for cq_handle in (qp.send_cq, qp.recv_cq):
            if cq_handle:
                self.cqs.get(cq_handle).refs -= 1
        if qp.srq:
            self.srqs.get(qp.srq).refs -= 1
        if qp.xrcd:
            self.xrcds.release(qp.xrcd)
        self.ucontexts.queue_destroyed(qp.ucontext, qp.dbs)
