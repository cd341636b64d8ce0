"""A simulated guest driver and provider on top of the simulated frontend: the data path without a VM.

It does over vhost-user what vrdma.ko and libvrdma do in a guest: commands on the control queue (GIDs, user
context, PD, MR with page lists, CQ, QP, modify), rings in guest memory, WQEs written into them and producer
indices stored into the context's doorbell page (the backend's doorbell region file, mapped here as QEMU maps it
for the guest). Tests use it to drive the data engine directly, and it can write anything a hostile guest could.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from vrdma.device import abi
from vrdma.device.rings import CQE, PAGE, PBL_ENTRIES, RECV_WQE, SEND_WQE, SGE
from vrdma.testing.frontend import SENTINEL, Frontend, FrontendError

# The ring layouts are the device's (vrdma.device.rings): this driver lays rings out as the device reads them.
PBL = PBL_ENTRIES
CQE_SIZE = CQE
U32 = struct.Struct("<I")
ALL_ACCESS = abi.const("VRDMA_ALL_ACCESS")  # an MR: local write, remote read, write and atomic, windows
REMOTE_ACCESS = abi.const("VRDMA_MW_ACCESS")  # a QP: remote read, write and atomic


def encode_command(struct: str, opcode: int, seq: int, **fields: Any) -> bytes:
    """A control command's bytes: ``struct`` with ``fields`` set (a dict value sets the fields of a nested struct)
    and its header's opcode and sequence number."""
    req = abi.new(struct, **{name: value for name, value in fields.items() if not isinstance(value, dict)})
    for name, sub in fields.items():
        if isinstance(sub, dict):
            for key, value in sub.items():
                setattr(getattr(req, name), key, value)
    req.hdr.opcode, req.hdr.seq = opcode, seq
    return abi.to_bytes(req)


class CommandError(FrontendError):
    def __init__(self, name: str, status: int) -> None:
        self.status = status
        super().__init__(f"{name} failed with status {status}")


def _pow2_at_least(value: int, minimum: int) -> int:
    result = minimum
    while result < value:
        result *= 2
    return result


def sge_bytes(sges: list[tuple[int, int, int]]) -> bytes:
    """struct vrdma_sge for each (addr, length, lkey), as a WQE carries them after its header."""
    return b"".join(abi.to_bytes(abi.new("vrdma_sge", addr=a, length=n, lkey=k)) for a, n, k in sges)


def recv_wqe_bytes(sges: list[tuple[int, int, int]], wr_id: int = 0) -> bytes:
    return abi.to_bytes(abi.new("vrdma_recv_wqe", wr_id=wr_id, num_sge=len(sges))) + sge_bytes(sges)


@dataclass
class Buffer:
    gpa: int
    size: int


@dataclass
class SimMr:
    handle: int
    lkey: int
    rkey: int
    buf: Buffer

    @property
    def addr(self) -> int:
        return self.buf.gpa  # iova = guest address, as a user MR has its user address


@dataclass
class SimCq:
    handle: int
    entries: int
    db: int  # doorbell index of its arm slot
    buf: Buffer
    cons: int = 0
    arm_seq: int = 0


@dataclass
class SimRing:
    """One work queue as the guest posts to it: ``depth`` WQE slots of ``stride`` bytes from guest address ``base``,
    the doorbell index of the slot the producer index goes to, and that index (free-running, as the device reads
    it)."""

    base: int
    depth: int
    stride: int
    db: int
    prod: int = 0

    def slot_gpa(self, index: int) -> int:
        return self.base + (index % self.depth) * self.stride


@dataclass
class SimSrq:
    handle: int
    buf: Buffer
    ring: SimRing
    srqn: int = 0  # an XRC SRQ's number


@dataclass
class SimQp:
    handle: int
    qpn: int
    buf: Buffer
    sq: SimRing
    rq: SimRing  # depth 0 when the QP receives from an SRQ


class Memory(Protocol):
    """Memory the device reaches, by its addresses (a guest's RAM; a container process's shared memfd)."""

    def alloc(self, size: int, align: int = 16) -> int: ...
    def read(self, address: int, length: int) -> bytes: ...
    def write(self, address: int, data: bytes) -> None: ...


class DevicePort(Protocol):
    """How a simulated driver reaches its device: guest memory, the control queue, the wake-up kick. A vhost-user
    Frontend is one (a backend process); vrdma.testing.inprocess.LocalPort another (a device model in process)."""

    @property
    def memory(self) -> Memory: ...

    def command(self, request: bytes, response_size: int) -> bytes: ...
    def wake(self) -> None: ...


class SimVerbs:
    """One user context of one simulated guest, or (``kernel``) its kernel's objects: context 0, whose queues ring
    doorbell page 1 and whose work requests may use the local DMA lkey. ``doorbells``: the doorbell region's file
    (a backend process's), or the region itself (a device in process)."""

    def __init__(self, fe: DevicePort, doorbells: Path | mmap.mmap, kernel: bool = False,
                 context: tuple[int, int] | None = None) -> None:
        """``context``: the user context (handle, first doorbell page) a transport gave already (a container's
        process is given one when it connects)."""
        self.fe = fe
        self.memory = fe.memory
        self.seq = 0
        if isinstance(doorbells, mmap.mmap):
            self.doorbells = doorbells
        else:
            with open(doorbells, "r+b") as fd:  # the mapping outlives the file object
                self.doorbells = mmap.mmap(fd.fileno(), 0)
        if kernel:
            self.ucontext, self.doorbell_page = 0, abi.const("VRDMA_KERNEL_DOORBELL_PAGE")
        elif context is not None:
            self.ucontext, self.doorbell_page = context
        else:
            resp = self.call("VRDMA_CMD_ALLOC_UCONTEXT", "vrdma_cmd_alloc_ucontext", "vrdma_resp_alloc_ucontext")
            self.ucontext = int(resp.handle)
            self.doorbell_page = int(resp.doorbell_page)

    # -- plumbing -----------------------------------------------------------------------------------------------

    def call(self, opcode: str, request: str, response: str, **fields: Any) -> Any:
        """Send one command; return the response struct, raise CommandError on a bad status."""
        self.seq += 1
        raw = self.fe.command(encode_command(request, abi.const(opcode), self.seq, **fields), abi.sizeof(response))
        hdr = abi.from_bytes("vrdma_resp_hdr", raw[:abi.sizeof("vrdma_resp_hdr")])
        if hdr.status != 0:
            raise CommandError(opcode, int(hdr.status))
        if len(raw) != abi.sizeof(response):  # the device says how much it wrote: all of a good response
            raise FrontendError(f"{opcode}: the device wrote {len(raw)} bytes of a {abi.sizeof(response)}-byte "
                                "response")
        return abi.from_bytes(response, raw) if response != "vrdma_resp_hdr" else hdr

    def alloc(self, size: int) -> Buffer:
        """Page-aligned guest memory (fresh memfd pages: already zero, never handed out twice)."""
        size = (size + PAGE - 1) // PAGE * PAGE
        return Buffer(self.memory.alloc(size, PAGE), size)

    def page_list(self, buf: Buffer, first_page: int | None = None, npages: int | None = None) -> dict[str, int]:
        """Page-list pages (levels 1 or 2) for a buffer's pages, written into guest memory."""
        start = buf.gpa if first_page is None else first_page
        count = buf.size // PAGE if npages is None else npages
        pages = [start + i * PAGE for i in range(count)]
        lists = []
        for i in range(0, len(pages), PBL):
            page = self.memory.alloc(PAGE, PAGE)
            self.memory.write(page, struct.pack(f"<{len(pages[i:i + PBL])}Q", *pages[i:i + PBL]))
            lists.append(page)
        if len(lists) == 1:
            return {"addr": lists[0], "npages": count, "levels": 1}
        directory = self.memory.alloc(PAGE, PAGE)
        self.memory.write(directory, struct.pack(f"<{len(lists)}Q", *lists))
        return {"addr": directory, "npages": count, "levels": 2}

    def ring(self, db: int, value: int) -> None:
        """Store ``value`` into the slot of doorbell index ``db`` (the region's 32-bit word ``db``)."""
        self.doorbells[4 * db:4 * db + 4] = U32.pack(value & 0xFFFFFFFF)

    def parked(self, db: int | None = None) -> bool:
        """Whether the device's engine is parked, as the parked slot of the page of doorbell index ``db`` says
        (by default the context's first page)."""
        page = self.doorbell_page if db is None else db // abi.const("VRDMA_DB_SLOTS")
        offset = page * abi.const("VRDMA_DOORBELL_PAGE_SIZE")
        return bool(U32.unpack(self.doorbells[offset:offset + 4])[0])

    # -- objects ------------------------------------------------------------------------------------------------

    def add_gid(self, index: int, gid: bytes) -> None:
        self.call("VRDMA_CMD_ADD_GID", "vrdma_cmd_add_gid", "vrdma_resp_hdr", index=index,
                  type=abi.const("VRDMA_GID_TYPE_ROCE_V2"), gid=list(gid))

    def alloc_pd(self) -> int:
        return int(self.call("VRDMA_CMD_ALLOC_PD", "vrdma_cmd_alloc_pd", "vrdma_resp_alloc_pd",
                             ucontext=self.ucontext).handle)

    def reg_mr(self, pd: int, size: int, access: int = ALL_ACCESS, buf: Buffer | None = None) -> SimMr:
        buf = buf or self.alloc(size)
        resp = self.call("VRDMA_CMD_REG_MR", "vrdma_cmd_reg_mr", "vrdma_resp_reg_mr", pd=pd, access=access,
                         iova=buf.gpa, length=size, page_offset=0, pages=self.page_list(buf))
        return SimMr(int(resp.handle), int(resp.lkey), int(resp.rkey), buf)

    def reg_mr_cycled(self, pd: int, length: int, backing: Buffer, iova: int = 1 << 40) -> SimMr:
        """An MR of ``length`` bytes at ``iova`` whose pages are ``backing``'s pages named over and over (a page
        list may name one page many times): a 1 GiB MR without 1 GiB of guest memory."""
        count = backing.size // PAGE
        gpas = [backing.gpa + (i % count) * PAGE for i in range(length // PAGE)]
        lists = []
        for first in range(0, len(gpas), PBL):
            page = self.memory.alloc(PAGE, PAGE)
            chunk = gpas[first:first + PBL]
            self.memory.write(page, struct.pack(f"<{len(chunk)}Q", *chunk))
            lists.append(page)
        directory = self.memory.alloc(PAGE, PAGE)
        self.memory.write(directory, struct.pack(f"<{len(lists)}Q", *lists))
        resp = self.call("VRDMA_CMD_REG_MR", "vrdma_cmd_reg_mr", "vrdma_resp_reg_mr", pd=pd, access=ALL_ACCESS,
                         iova=iova, length=length, page_offset=0,
                         pages={"addr": directory, "npages": len(gpas), "levels": 2})
        return SimMr(int(resp.handle), int(resp.lkey), int(resp.rkey), Buffer(iova, length))

    def alloc_mr(self, pd: int, max_pages: int) -> tuple[int, int]:
        """A fast-registration MR (the kernel's): its handle and key."""
        resp = self.call("VRDMA_CMD_ALLOC_MR", "vrdma_cmd_alloc_mr", "vrdma_resp_alloc_mr", pd=pd,
                         max_pages=max_pages)
        return int(resp.handle), int(resp.key)

    def rereg_mr(self, mr: SimMr, flags: int, pd: int = 0, access: int = 0, buf: Buffer | None = None,
                 iova: int | None = None, length: int | None = None) -> None:
        """REREG_MR: ``flags`` (VRDMA_REREG_*) say which of pd, access and the translation (onto ``buf``) change."""
        fields: dict[str, Any] = {"handle": mr.handle, "flags": flags, "pd": pd, "access": access}
        if buf is not None:
            fields.update(iova=buf.gpa if iova is None else iova, length=buf.size if length is None else length,
                          page_offset=0, pages=self.page_list(buf))
        self.call("VRDMA_CMD_REREG_MR", "vrdma_cmd_rereg_mr", "vrdma_resp_reg_mr", **fields)
        mr.buf = buf or mr.buf

    def alloc_mw(self, pd: int, mw_type: int) -> tuple[int, int]:
        """A memory window: its handle and rkey."""
        resp = self.call("VRDMA_CMD_ALLOC_MW", "vrdma_cmd_alloc_mw", "vrdma_resp_alloc_mw", pd=pd, type=mw_type)
        return int(resp.handle), int(resp.rkey)

    def dealloc_mw(self, handle: int) -> None:
        self.call("VRDMA_CMD_DEALLOC_MW", "vrdma_cmd_destroy", "vrdma_resp_hdr", handle=handle)

    def post_bind_mw(self, qp: SimQp, mw_rkey: int, new_rkey: int, mr_lkey: int, addr: int, length: int,
                     access: int, wr_id: int = 0) -> None:
        """A BIND_MW work request: the window ``mw_rkey`` names, bound to [addr, addr + length) of the MR
        ``mr_lkey`` names with ``access``, known from now on as ``new_rkey``."""
        wqe = abi.new("vrdma_send_wqe", wr_id=wr_id, opcode=abi.const("VRDMA_WR_BIND_MW"),
                      send_flags=abi.const("VRDMA_SEND_SIGNALED"))
        wqe.bind.addr, wqe.bind.length, wqe.bind.mr_lkey = addr, length, mr_lkey
        wqe.bind.mw_rkey, wqe.bind.new_rkey, wqe.bind.access = mw_rkey, new_rkey, access
        self.put_wqe(qp.sq, abi.to_bytes(wqe))
        self.ring_send(qp)

    def create_cq(self, entries: int = 64) -> SimCq:
        buf = self.alloc(PAGE + entries * CQE_SIZE)
        # CQE slots start as a sentinel (the index page stays zero): a CQE the device never wrote cannot read as
        # a successful completion (status 0).
        self.memory.write(buf.gpa + PAGE, SENTINEL * (entries * CQE_SIZE))
        resp = self.call("VRDMA_CMD_CREATE_CQ", "vrdma_cmd_create_cq", "vrdma_resp_create_cq",
                         ucontext=self.ucontext, entries=entries, ring=self.page_list(buf))
        return SimCq(int(resp.handle), entries, int(resp.db_index), buf)

    def alloc_xrcd(self) -> int:
        return int(self.call("VRDMA_CMD_ALLOC_XRCD", "vrdma_cmd_alloc_xrcd", "vrdma_resp_alloc_xrcd").handle)

    def create_srq(self, pd: int, depth: int = 16, max_sge: int = 4, limit: int = 0, xrcd: int = 0,
                   cq: SimCq | None = None) -> SimSrq:
        """A basic SRQ, or (``xrcd``) an XRC SRQ of that domain completing on ``cq``."""
        stride = _pow2_at_least(RECV_WQE + max_sge * SGE, 32)
        buf = self.alloc(PAGE + depth * stride)
        resp = self.call("VRDMA_CMD_CREATE_SRQ", "vrdma_cmd_create_srq", "vrdma_resp_create_srq",
                         ucontext=self.ucontext, pd=pd, depth=depth, stride=stride, max_sge=max_sge,
                         srq_limit=limit, xrcd=xrcd, cq=cq.handle if cq else 0, ring=self.page_list(buf))
        return SimSrq(int(resp.handle), buf, SimRing(buf.gpa + PAGE, depth, stride, int(resp.db_index)),
                      int(resp.srq_num))

    def post_srq_recv(self, srq: SimSrq, sges: list[tuple[int, int, int]], wr_id: int = 0) -> None:
        self.put_wqe(srq.ring, recv_wqe_bytes(sges, wr_id))
        self.ring(srq.ring.db, srq.ring.prod)

    def create_qp(self, pd: int, send_cq: SimCq, recv_cq: SimCq | None, depth: int = 64, max_sge: int = 4,
                  max_inline: int = 64, sq_sig_all: int = 0, srq: SimSrq | None = None,
                  qp_type: str = "RC") -> SimQp:
        """An RC, UC, UD, GSI or XRC_INI QP (``qp_type``) with rings for ``depth`` WQEs (an XRC initiator, with
        no ``recv_cq``, has no receive queue)."""
        own_rq = srq is None and qp_type != "XRC_INI"
        sq_stride = _pow2_at_least(SEND_WQE + max(max_sge * SGE, max_inline), 64)
        rq_stride = _pow2_at_least(RECV_WQE + max_sge * SGE, 32) if own_rq else 0
        rq_depth = depth if own_rq else 0
        sq_offset = PAGE
        rq_offset = sq_offset + (depth * sq_stride + PAGE - 1) // PAGE * PAGE if own_rq else 0
        buf = self.alloc(max(sq_offset + depth * sq_stride, rq_offset + rq_depth * rq_stride))
        resp = self.call("VRDMA_CMD_CREATE_QP", "vrdma_cmd_create_qp", "vrdma_resp_create_qp",
                         ucontext=self.ucontext, pd=pd, send_cq=send_cq.handle,
                         recv_cq=recv_cq.handle if recv_cq else 0, srq=srq.handle if srq else 0,
                         qp_type=abi.const(f"VRDMA_QPT_{qp_type}"), sq_sig_all=sq_sig_all,
                         sq_depth=depth, rq_depth=rq_depth, sq_stride=sq_stride, rq_stride=rq_stride,
                         sq_offset=sq_offset, rq_offset=rq_offset, max_send_sge=max_sge,
                         max_recv_sge=max_sge if own_rq else 0, max_inline_data=max_inline,
                         ring=self.page_list(buf))
        return SimQp(int(resp.handle), int(resp.qpn), buf,
                     SimRing(buf.gpa + sq_offset, depth, sq_stride, int(resp.sq_db_index)),
                     SimRing(buf.gpa + rq_offset, rq_depth, rq_stride, int(resp.rq_db_index)))

    def create_xrc_target(self, xrcd: int) -> SimQp:
        """An XRC target QP of XRC domain ``xrcd``: no rings (the kernel's: a ``kernel`` SimVerbs creates it)."""
        resp = self.call("VRDMA_CMD_CREATE_QP", "vrdma_cmd_create_qp", "vrdma_resp_create_qp",
                         ucontext=self.ucontext, qp_type=abi.const("VRDMA_QPT_XRC_TGT"), xrcd=xrcd)
        none = SimRing(0, 0, 0, 0)
        return SimQp(int(resp.handle), int(resp.qpn), Buffer(0, 0), none, none)

    def query_qp(self, qp: SimQp) -> Any:
        """QUERY_QP's attributes (struct vrdma_qp_attr): the state is the device's, as it is now."""
        resp = self.call("VRDMA_CMD_QUERY_QP", "vrdma_cmd_destroy", "vrdma_resp_query_qp", handle=qp.handle)
        # A copy: `resp.attr` is a view into `resp`, whose memory goes with it (an ASan run read it freed).
        return abi.from_bytes("vrdma_qp_attr", bytes(abi.ffi.buffer(abi.ffi.addressof(resp, "attr"))))

    def modify_qp(self, qp: SimQp, mask: int, **attr: Any) -> None:
        self.call("VRDMA_CMD_MODIFY_QP", "vrdma_cmd_modify_qp", "vrdma_resp_hdr", handle=qp.handle,
                  attr_mask=mask, attr=attr)

    def reset_qp(self, qp: SimQp) -> None:
        """Back to RESET, which empties the QP's rings: their producer indexes start again, as a provider's do."""
        self.modify_qp(qp, abi.const("VRDMA_QP_STATE"), qp_state=abi.const("VRDMA_QPS_RESET"))
        for ring in (qp.sq, qp.rq):
            if ring.depth:  # (an SRQ's or an XRC QP's side has none)
                ring.prod = 0
                self.ring(ring.db, 0)

    def connect(self, qp: SimQp, dest_qpn: int, dgid: bytes, sgid_index: int = 0,
                access: int = REMOTE_ACCESS, rnr_retry: int = 7, min_rnr_timer: int = 1, uc: bool = False,
                xrc: str = "", timeout: int = 14, retry_cnt: int = 7, path_mtu: int = 3) -> None:
        """RESET -> INIT -> RTR -> RTS, the way ibv_rc_pingpong does it (``uc``: ibv_uc_pingpong, which gives
        none of the attributes of acknowledgements; ``xrc`` "INI" or "TGT": ibv_xsrq_pingpong's send and receive
        QPs, each with its half of RC's)."""
        def m(*names: str) -> int:
            return sum(abi.const(f"VRDMA_QP_{n}") for n in names)

        self.modify_qp(qp, m("STATE", "PKEY_INDEX", "PORT", "ACCESS_FLAGS"), qp_state=1, pkey_index=0, port_num=1,
                       qp_access_flags=access)
        rtr = m("STATE", "AV", "PATH_MTU", "DEST_QPN", "RQ_PSN")
        rts = m("STATE", "SQ_PSN")
        if not uc and xrc != "INI":
            rtr |= m("MAX_DEST_RD_ATOMIC", "MIN_RNR_TIMER")
        if not uc:
            rts |= m("TIMEOUT") if xrc == "TGT" else m("TIMEOUT", "RETRY_CNT", "RNR_RETRY", "MAX_QP_RD_ATOMIC")
        self.modify_qp(qp, rtr, qp_state=2, path_mtu=path_mtu, dest_qp_num=dest_qpn, rq_psn=0, max_dest_rd_atomic=1,
                       min_rnr_timer=min_rnr_timer, dgid=list(dgid), sgid_index=sgid_index, hop_limit=1)
        self.modify_qp(qp, rts, qp_state=3, sq_psn=0, timeout=timeout, retry_cnt=retry_cnt, rnr_retry=rnr_retry,
                       max_rd_atomic=1)

    def ud_ready(self, qp: SimQp, qkey: int, gsi: bool = False) -> None:
        """RESET -> INIT -> RTR -> RTS for a UD QP (or the GSI QP, which has no port to give)."""
        def m(*names: str) -> int:
            return sum(abi.const(f"VRDMA_QP_{n}") for n in names)

        init = m("STATE", "PKEY_INDEX", "QKEY") | (0 if gsi else m("PORT"))
        self.modify_qp(qp, init, qp_state=1, pkey_index=0, port_num=0 if gsi else 1, qkey=qkey)
        self.modify_qp(qp, m("STATE"), qp_state=2)
        self.modify_qp(qp, m("STATE", "SQ_PSN"), qp_state=3, sq_psn=0)

    def post_ud_send(self, qp: SimQp, sges: list[tuple[int, int, int]], dgid: bytes, remote_qpn: int,
                     remote_qkey: int, sgid_index: int = 0, wr_id: int = 0, imm: int | None = None,
                     hop_limit: int = 64) -> None:
        """A datagram to (dgid, remote_qpn), its address vector in the WQE as a provider writes it."""
        opcode = abi.const("VRDMA_WR_SEND" if imm is None else "VRDMA_WR_SEND_WITH_IMM")
        wqe = abi.new("vrdma_send_wqe", wr_id=wr_id, opcode=opcode, num_sge=len(sges), imm_data=imm or 0,
                      send_flags=abi.const("VRDMA_SEND_SIGNALED"),
                      ud={"dgid": list(dgid), "remote_qpn": remote_qpn, "remote_qkey": remote_qkey,
                          "sgid_index": sgid_index, "hop_limit": hop_limit})
        self.put_wqe(qp.sq, abi.to_bytes(wqe) + sge_bytes(sges))
        self.ring_send(qp)

    def loopback_qp(self, gid: bytes, cq_entries: int = 16) -> tuple[int, SimCq, SimQp]:
        """GID 0, a PD, a CQ and a QP on it in RTS, connected to itself: (pd, cq, qp)."""
        self.add_gid(0, gid)
        pd = self.alloc_pd()
        cq = self.create_cq(cq_entries)
        qp = self.create_qp(pd, cq, cq)
        self.connect(qp, qp.qpn, gid)
        return pd, cq, qp

    # -- posting and polling ------------------------------------------------------------------------------------

    def post_send(self, qp: SimQp, opcode: int, sges: list[tuple[int, int, int]], wr_id: int = 0,
                  signaled: bool = True, remote_addr: int = 0, rkey: int = 0, imm: int = 0,
                  compare_add: int = 0, swap: int = 0, inline: bytes | None = None, ring: bool = True,
                  xrc_srqn: int = 0) -> None:
        flags = abi.const("VRDMA_SEND_SIGNALED") if signaled else 0
        wqe = abi.new("vrdma_send_wqe", wr_id=wr_id, opcode=opcode, num_sge=len(sges), imm_data=imm,
                      rkey=rkey, remote_addr=remote_addr, compare_add=compare_add, swap=swap, xrc_srqn=xrc_srqn)
        body = sge_bytes(sges)
        if inline is not None:
            flags |= abi.const("VRDMA_SEND_INLINE")
            wqe.num_sge, wqe.inline_len, body = 0, len(inline), inline
        wqe.send_flags = flags
        self.put_wqe(qp.sq, abi.to_bytes(wqe) + body)
        if ring:
            self.ring_send(qp)

    def post_reg_mr(self, qp: SimQp, key: int, iova: int, length: int, pages: list[int], access: int = ALL_ACCESS,
                    wr_id: int = 0, page_list: int | None = None, npages: int | None = None) -> None:
        """A REG_MR work request mapping the fast-registration MR ``key`` names onto ``pages`` (guest-physical
        addresses), written as a page list into fresh guest memory unless ``page_list`` names one."""
        if page_list is None:
            buf = self.alloc(max(8 * len(pages), 8))
            self.memory.write(buf.gpa, struct.pack(f"<{len(pages)}Q", *pages))
            page_list = buf.gpa
        wqe = abi.new("vrdma_send_wqe", wr_id=wr_id, opcode=abi.const("VRDMA_WR_REG_MR"),
                      send_flags=abi.const("VRDMA_SEND_SIGNALED"))
        wqe.reg.iova, wqe.reg.length, wqe.reg.page_list = iova, length, page_list
        wqe.reg.key, wqe.reg.access = key, access
        wqe.reg.npages = len(pages) if npages is None else npages
        self.put_wqe(qp.sq, abi.to_bytes(wqe))
        self.ring_send(qp)

    def ring_send(self, qp: SimQp) -> None:
        """Store the send queue's producer index; wake the device if its engine is parked (as libvrdma does)."""
        self.ring(qp.sq.db, qp.sq.prod)
        if self.parked(qp.sq.db):
            self.fe.wake()

    def post_recv(self, qp: SimQp, sges: list[tuple[int, int, int]], wr_id: int = 0) -> None:
        self.put_wqe(qp.rq, recv_wqe_bytes(sges, wr_id))
        self.ring(qp.rq.db, qp.rq.prod)

    def put_wqe(self, ring: SimRing, wqe: bytes) -> None:
        """Write a WQE (any bytes, at most a slot) into the ring's next slot and count it; ring no doorbell."""
        if len(wqe) > ring.stride:
            raise ValueError(f"a {len(wqe)}-byte WQE does not fit a {ring.stride}-byte slot")
        self.memory.write(ring.slot_gpa(ring.prod), wqe)
        ring.prod += 1

    def cq_header(self, cq: SimCq) -> Any:
        """The CQ ring's header page as the device last wrote it (prod, cons, overflow)."""
        return abi.from_bytes("vrdma_cq_ring_hdr", self.memory.read(cq.buf.gpa, abi.sizeof("vrdma_cq_ring_hdr")))

    def poll_cq(self, cq: SimCq) -> list[Any]:
        hdr = self.cq_header(cq)
        found = []
        while cq.cons != hdr.prod:
            slot = cq.cons % cq.entries
            found.append(abi.from_bytes("vrdma_cqe", self.memory.read(cq.buf.gpa + PAGE + slot * CQE_SIZE,
                                                                      CQE_SIZE)))
            cq.cons += 1
        self.memory.write(cq.buf.gpa + 4, U32.pack(cq.cons))
        return found

    def cq_overflowed(self, cq: SimCq) -> bool:
        return bool(self.cq_header(cq).overflow)

    def _frontend(self) -> Frontend:
        if not isinstance(self.fe, Frontend):
            raise FrontendError("events travel on a virtqueue: this driver has no vhost-user frontend")
        return self.fe

    def post_event_buffers(self, count: int = 8) -> None:
        """Give the device event buffers, as the driver does."""
        vq = self._frontend().queues[abi.const("VRDMA_QUEUE_EVENT")]
        for _ in range(count):
            vq.add([], [abi.sizeof("vrdma_event")])
        vq.notify()

    def wait_events(self, timeout: float = 10.0) -> list[Any]:
        """The events the device wrote into posted event buffers, as the buffers come back used."""
        vq = self._frontend().queues[abi.const("VRDMA_QUEUE_EVENT")]
        size = abi.sizeof("vrdma_event")
        return [abi.from_bytes("vrdma_event", self.memory.read(vq.buffer_address(desc), size))
                for desc, length in vq.wait_used(timeout) if length == size]

    def arm_cq(self, cq: SimCq, solicited: bool = False) -> None:
        cq.arm_seq += 1
        kind = abi.const("VRDMA_CQ_ARM_SOLICITED") if solicited else abi.const("VRDMA_CQ_ARM_NEXT")
        self.ring(cq.db, (cq.arm_seq << abi.const("VRDMA_CQ_ARM_SEQ_SHIFT")) | kind)
