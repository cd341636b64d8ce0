"""Seed inputs for the data engine's libFuzzer harness (engine_fuzz.c): well-formed scenarios in its input format.

Coverage-guided mutation finds its way into deep states much faster from inputs that already get there: two VMs
with MRs, CQs, SRQs and connected QPs moving data by every opcode, then the ways that go wrong (bad keys, RNR,
flushes, CQ overflow, memory tables that change under live objects, device resets, moderation, two-level page
lists, misaligned memory). ``python -m fuzz.engine.seeds [DIR]`` writes them (default fuzz/corpus/engine/);
the encoder below mirrors the harness's decoder operation by operation (read engine_fuzz.c next to it).
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable
from pathlib import Path

PAGE = 4096
OP_COUNT = 23  # the length of engine_fuzz.c's ops[] (tests/unit/test_fuzz_seeds.py holds the two together)
(MR_CREATE, MR_DESTROY, CQ_CREATE, CQ_DESTROY, SRQ_CREATE, SRQ_DESTROY, QP_CREATE, QP_MODIFY, QP_DESTROY, POST_SEND,
 POST_RECV, POLL, MIGRATE, CQ_CONSUME, MEM_WRITE, DOORBELL, SET_MEMORY, SRQ_LIMIT, PARK, RESET, GID_SET,
 ROCE, PAGE_WINDOW) = range(OP_COUNT)
WR_RDMA_WRITE, WR_RDMA_WRITE_WITH_IMM, WR_SEND, WR_SEND_WITH_IMM, WR_RDMA_READ, WR_CMP_SWP, WR_FETCH_ADD = range(7)
SEND_SIGNALED, SEND_SOLICITED, SEND_INLINE = 2, 4, 8
RTS, ERR, RESET_STATE = 3, 6, 0
REGION_GPA_PAGE = 0x100          # guest RAM of both VMs starts at 1 MiB
DEFAULT_DIR = Path(__file__).resolve().parents[1] / "corpus" / "engine"

# Pages of each VM's guest memory (pick_page indices) the scenarios use.
LIST_MR, LIST_CQ, LIST_QP, LIST_SRQ, LIST_QP2 = 0, 1, 2, 3, 4
DATA_MR, RING_CQ, RING_QP, RING_SRQ, RING_QP2 = 8, 24, 28, 32, 36


class Input:
    """One harness input, built operation by operation."""

    def __init__(self, regions: list[bytes] | None = None, limits: bytes = b"\0") -> None:
        default = [self.region(REGION_GPA_PAGE, 0, 64)]
        self.data = bytearray()
        for _ in range(2):
            self.data += limits
            self.memory(regions if regions is not None else default)

    @staticmethod
    def region(gpa_page: int, first: int, npages: int, misalign: int = 0, short: int = 0) -> bytes:
        flags = (1 if misalign else 0) | (4 if short else 0)
        raw = struct.pack("<BHBB", flags, gpa_page, first, npages - 1)
        if misalign:
            raw += bytes([misalign - 1])
        if short:
            raw += struct.pack("<H", short)
        return raw

    def memory(self, regions: list[bytes]) -> None:
        self.data += bytes([len(regions)]) + b"".join(regions)

    def op(self, code: int, dev: int, operands: bytes = b"") -> Input:
        self.data += bytes([code + OP_COUNT * dev]) + operands
        return self

    # -- objects (slot 1 of each table; pd 0) --------------------------------------------------------------

    def mr(self, dev: int, slot: int = 1, access: int = 0xF, pages: int = 16, iova_page: int = 0x108,
           page_offset: int = 0, first: int = DATA_MR, list_page: int = LIST_MR) -> Input:
        """An MR of `pages` pages (raw page offset and length: flags 8 and 16)."""
        length = pages * PAGE - page_offset
        # keys as key_for reads them: a 16-bit multiple of the table above the slot, then the variable low byte
        raw = struct.pack("<BBHBHBHBBHQH", slot, 0x18, 0x10 + slot, 0, 0x1234, 0x12, 0x5678, 0x56, access,
                          page_offset, length, iova_page)
        raw += bytes([0, first, list_page])
        if pages > 512:
            raw += bytes([LIST_QP2 + 1])  # a directory: its list pages start here
        return self.op(MR_CREATE, dev, raw)

    def cq(self, dev: int, slot: int = 1, entries_log2: int = 6, db_slot: int = 1, moderate: bytes = b"") -> Input:
        flags = 8 if moderate else 0
        return self.op(CQ_CREATE, dev, struct.pack("<BBHBBH", slot, flags, 0x20 + slot, entries_log2, 0, db_slot)
                       + bytes([0, RING_CQ, LIST_CQ]) + moderate)

    def srq(self, dev: int, slot: int = 1, depth_log2: int = 4, limit: int = 2) -> Input:
        return self.op(SRQ_CREATE, dev, struct.pack("<BBHBBBBBBH", slot, 0, 0x30 + slot, 0, depth_log2, 2, 4, limit,
                                                    0, 10) + bytes([0, RING_SRQ, LIST_SRQ]))

    def qp(self, dev: int, slot: int = 1, cq: int = 1, srq: int | None = None, sig_all: int = 0,
           depth_log2: int = 4, db_slots: tuple[int, int] = (2, 3)) -> Input:
        flags = 2 if srq is not None else 0
        raw = struct.pack("<BHHBBHBB", slot, flags, 0x40 + slot, 0, sig_all, 0x99, cq, cq)
        if srq is not None:
            raw += bytes([srq, 4]) + struct.pack("<H", 64) + bytes([depth_log2])
        else:
            raw += bytes([4, 4]) + struct.pack("<H", 64) + bytes([depth_log2, depth_log2])
        raw += bytes([0]) + struct.pack("<HH", *db_slots)
        first, listp = (RING_QP2, LIST_QP2) if srq is not None else (RING_QP, LIST_QP)
        return self.op(QP_CREATE, dev, raw + bytes([0, first, listp]))

    def modify(self, dev: int, state: int, slot: int = 1, dest_dev: int = 0, dest_slot: int = 1,
               rnr_retry: int = 7, retry_cnt: int = 7, timeout: int = 14, access: int = 0xF) -> Input:
        raw = bytes([0, slot, state, access, dest_dev]) + (bytes([dest_slot]) if dest_dev < 2 else b"")
        return self.op(QP_MODIFY, dev, raw + bytes([1, rnr_retry, retry_cnt, timeout, 0]))  # Q_Key: the pool's first

    def connect(self, slot: int = 1, peer_slot: int = 1) -> Input:
        """Both VMs' QPs in `slot` to RTS, each pointing at the other."""
        return self.modify(0, RTS, slot, 1, peer_slot).modify(1, RTS, peer_slot, 0, slot)

    def setup(self, srq: bool = False) -> Input:
        for dev in (0, 1):
            self.mr(dev).cq(dev)
            if srq:
                self.srq(dev).qp(dev, srq=1)
            else:
                self.qp(dev)
        return self.connect()

    # -- the guest ---------------------------------------------------------------------------------------------

    @staticmethod
    def sge(mr_index: int = 1, offset: int = 0, length: int = 256) -> bytes:
        return bytes([(mr_index << 2)]) + struct.pack("<HH", offset, length)

    def send(self, dev: int, opcode: int, sges: list[bytes] | None = None, remote_offset: int = 0,
             inline: bytes | None = None, flags: int = SEND_SIGNALED, count: int = 1, qp: int = 1,
             align: bool = False, compare_add: int = 1, swap: int = 2) -> Input:
        sges = [self.sge()] if sges is None and inline is None else sges or []
        raw = bytes([qp, count - 1, 0])
        for i in range(count):
            wqe_flags = 2 if align else 0
            send_flags = flags | (SEND_INLINE if inline is not None else 0)
            raw += struct.pack("<BHBBBI", wqe_flags, 100 + i, opcode, send_flags, len(sges), 0xABCD0000 + i)
            raw += bytes([1 - dev, 1]) + struct.pack("<H", remote_offset) + bytes([compare_add, swap])
            if inline is not None:
                raw += struct.pack("<H", len(inline)) + inline
            else:
                raw += b"".join(sges)
        return self.op(POST_SEND, dev, raw)

    def recv(self, dev: int, sges: list[bytes] | None = None, count: int = 1, qp: int = 1) -> Input:
        sges = [self.sge(length=4096)] if sges is None else sges
        raw = bytes([qp, count - 1, 0])
        for i in range(count):
            raw += struct.pack("<HB", 200 + i, len(sges)) + b"".join(sges)
        return self.op(POST_RECV, dev, raw)

    def poll(self, times: int = 1, events: bool = True) -> Input:
        for _ in range(times):
            self.op(POLL, 0, bytes([63 | (2 if events else 0)]) + (struct.pack("<H", 511) if events else b""))
        return self

    def consume(self, dev: int, arm: int | None = None) -> Input:
        flags = 2 if arm is not None else 0
        return self.op(CQ_CONSUME, dev, bytes([flags, 1]) + (bytes([arm]) if arm is not None else b""))

    def doorbell(self, dev: int, page: int, slot: int, value: int) -> Input:
        return self.op(DOORBELL, dev, struct.pack("<BHI", page, slot, value))

    def write(self, dev: int, page: int, offset: int, data: bytes) -> Input:
        return self.op(MEM_WRITE, dev, struct.pack("<BHB", page, offset, len(data)) + data)

    def roce(self, payload: bytes, opcode: int = 0x04, v4: bool = True, damage: int | None = None,
             raw_bytes: bytes | None = None) -> Input:
        """A RoCE v2 packet (op_roce): built from fields and parsed back (then damaged at `damage`), or raw bytes."""
        flags = (1 if v4 else 0) | 8 | (16 if damage is not None else 0) | (2 if raw_bytes is not None else 0)
        raw = struct.pack("<HHHBBB", 49152, 0, 0x4000, flags, len(raw_bytes or b""), len(payload))
        src = bytes(10) + b"\xff\xff" + bytes([192, 0, 2, 1]) if v4 else bytes(range(16))
        dst = bytes(10) + b"\xff\xff" + bytes([192, 0, 2, 2]) if v4 else bytes(range(16, 32))
        for i in range(16):
            if not (v4 and 10 <= i < 12):  # the IPv4-mapped prefix's ones, which the harness fills in itself
                raw += bytes([src[i], dst[i]])
        if raw_bytes is not None:
            return self.op(ROCE, 0, raw + raw_bytes)
        raw += struct.pack("<BHIIQIIIIII", opcode, 0xFFFF, 0x1234, 7, 0x1000, 5, len(payload), 0, 0, 0, 0) + payload
        if damage is not None:
            raw += struct.pack("<HB", damage, 0x10)
        return self.op(ROCE, 0, raw)

    def bytes(self) -> bytes:
        return bytes(self.data)


def scenarios() -> dict[str, Callable[[], Input]]:
    def every_opcode() -> Input:
        s = Input().setup()
        s.recv(1, count=4).write(0, DATA_MR, 0, b"payload" * 9)
        s.send(0, WR_SEND).send(0, WR_SEND_WITH_IMM).send(0, WR_RDMA_WRITE_WITH_IMM, remote_offset=512)
        s.send(0, WR_RDMA_WRITE, remote_offset=4000).send(0, WR_RDMA_READ, remote_offset=8192)
        s.send(0, WR_CMP_SWP, [s.sge(length=8)], remote_offset=64, align=True)
        s.send(0, WR_FETCH_ADD, [s.sge(length=8)], remote_offset=128, align=True)
        s.send(0, WR_SEND, inline=b"inline!" * 4)
        return s.poll(3).consume(0, arm=1).consume(1, arm=2).poll()

    def scatter_gather() -> Input:
        s = Input().setup()
        s.recv(1, [s.sge(offset=100, length=10), s.sge(offset=5000, length=6000), s.sge(offset=20000, length=100)])
        s.send(0, WR_SEND, [s.sge(offset=0, length=3000), s.sge(offset=40000, length=3000)])
        return s.poll(2)

    def srq() -> Input:
        s = Input().setup(srq=True)
        s.recv(1, count=3).recv(0, count=3).send(0, WR_SEND, count=2).send(1, WR_SEND_WITH_IMM)
        return s.poll(2).op(SRQ_LIMIT, 1, bytes([1, 2])).recv(1).poll()

    def errors() -> Input:
        s = Input().setup()
        s.send(0, WR_SEND)                                    # no receive posted: RNR, forever
        s.poll().recv(1, [s.sge(length=16)]).poll()           # receive too small: both to error
        s.send(0, WR_RDMA_WRITE, remote_offset=0xFFF0).poll()  # flushed
        return s.modify(0, RESET_STATE).modify(1, RESET_STATE).connect().send(0, WR_RDMA_READ, remote_offset=0xFFFF)

    def remote_access() -> Input:
        s = Input()
        for dev in (0, 1):
            s.mr(dev, access=0x1).cq(dev).qp(dev)             # local write only: no remote access
        s.connect().send(0, WR_RDMA_WRITE).send(0, WR_RDMA_READ).send(0, WR_CMP_SWP, [s.sge(length=8)], align=True)
        return s.poll(2)

    def cq_overflow() -> Input:
        s = Input()
        for dev in (0, 1):
            s.mr(dev).cq(dev, entries_log2=1).qp(dev, sig_all=1)
        return s.connect().send(0, WR_RDMA_WRITE, count=6).poll(2).consume(0).poll()

    def garbage_producer() -> Input:
        s = Input().setup()
        return s.doorbell(0, 1, 2, 0x7FFF_FFFF).poll().doorbell(1, 1, 3, 0xFFFF_FFF0).send(1, WR_SEND).poll()

    def memory_change() -> Input:
        s = Input().setup().recv(1, count=2).send(0, WR_SEND).poll()
        # The VM's memory table loses the pages of its rings and MR; then it comes back elsewhere.
        s.op(SET_MEMORY, 1, bytes([1]) + Input.region(REGION_GPA_PAGE, 0, 8))
        s.send(0, WR_SEND).poll().modify(1, ERR).poll()
        s.op(SET_MEMORY, 1, bytes([2]) + Input.region(REGION_GPA_PAGE, 0, 32) + Input.region(0x200, 32, 32))
        return s.send(0, WR_RDMA_WRITE).poll()

    def migrate_mid_flight() -> Input:
        """Each VM saved and loaded (engine/state.c) with WQEs and receives in flight, and once with a damaged state
        (how: 1 load, 4 damage at `at`, 8 check only)."""
        s = Input().setup().recv(1, count=4).send(0, WR_SEND, count=2).send(0, WR_RDMA_WRITE, remote_offset=4096)
        s.poll().op(MIGRATE, 1, bytes([1, 0, 0, 0])).poll().op(MIGRATE, 0, bytes([1, 0, 0, 0]))
        s.send(0, WR_SEND, count=2).poll().op(MIGRATE, 0, bytes([0, 0, 0, 0])).poll()  # resumed as it was
        return s.op(MIGRATE, 1, bytes([5]) + struct.pack("<H", 400) + bytes([0x40])).send(0, WR_SEND).poll()

    def reset_mid_flight() -> Input:
        s = Input().setup().recv(1, count=4).send(0, WR_SEND, count=4)
        return s.op(RESET, 1).poll().send(0, WR_SEND).poll().mr(1).cq(1).qp(1).modify(1, RTS, dest_dev=0)

    def moderation_and_arm() -> Input:
        s = Input()
        for dev in (0, 1):
            s.mr(dev).cq(dev, moderate=bytes([3, 1])).qp(dev)
        s.connect().consume(1, arm=1).recv(1, count=4).send(0, WR_SEND, count=4, flags=SEND_SIGNALED | SEND_SOLICITED)
        return s.poll(3).consume(1, arm=2).send(0, WR_SEND).poll()

    def two_level_list() -> Input:
        s = Input()
        for dev in (0, 1):
            # 600 pages (the chooser wraps round the 64 there are): the list needs a directory.
            s.mr(dev, pages=600).cq(dev).qp(dev)
        return s.connect().recv(1).send(0, WR_SEND, [s.sge(offset=60000, length=4096)]).poll()

    def misaligned_memory() -> Input:
        # Guest RAM 7 bytes into its page (a frontend's mmap_offset need not be page-aligned) and an MR whose
        # first byte is 1 byte into its page: an aligned atomic target at the end of a page.
        s = Input(regions=[Input.region(REGION_GPA_PAGE, 0, 63, misalign=7)])
        for dev in (0, 1):
            s.mr(dev, page_offset=1).cq(dev).qp(dev)
        s.connect().recv(1).send(0, WR_SEND)
        s.send(0, WR_FETCH_ADD, [s.sge(length=8)], remote_offset=4088, align=True)
        return s.poll()

    def several_regions() -> Input:
        regions = [Input.region(REGION_GPA_PAGE, 0, 16), Input.region(0x400, 16, 16),
                   Input.region(0x800, 32, 32, short=100)]
        s = Input(regions=regions).setup().recv(1, count=2).send(0, WR_SEND).send(0, WR_RDMA_WRITE, remote_offset=60000)
        return s.poll(2)

    def park() -> Input:
        s = Input().setup().poll()
        return s.op(PARK, 0, b"\0").recv(1).send(0, WR_SEND).poll()

    def roce_packets() -> Input:
        s = Input().roce(b"hello").roce(b"x" * 64, opcode=0x0B, v4=False).roce(b"", opcode=0x11)
        s.roce(b"damaged", damage=20).roce(b"", raw_bytes=bytes([0x04, 0, 0xFF, 0xFF]) + bytes(12))
        return s

    return {name.replace("_", "-"): fn for name, fn in locals().items() if callable(fn)}


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else DEFAULT_DIR
    out.mkdir(parents=True, exist_ok=True)
    for name, make in scenarios().items():
        (out / f"seed-{name}").write_bytes(make().bytes())
    print(f"wrote {len(scenarios())} seeds to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
