"""The engine's dirty log (vre_device_set_log, issue 28): while a VM migrates, every guest page the engine writes for
it is marked in that VM's log, a bit per 4 KiB page from guest address 0, whichever VM's work wrote it: the data of
a WRITE, a SEND or a READ, an atomic's target and its result, CQEs, and the ring headers whose consumer indexes the
engine moves. Pages it only reads are not marked; a page past the log is not marked (nor written past); without a
log nothing is marked.

Two VMs on one engine in process (vrdma.testing.inprocess.LocalVms): each log a buffer of this process, as the log
QEMU shares (VHOST_USER_SET_LOG_BASE) is a mapping of the backend's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from vrdma.device import abi
from vrdma.engine.api import EngineError
from vrdma.engine.native import ffi
from vrdma.testing.inprocess import LocalVm, LocalVms, Side

KIB, MIB, PAGE = 1 << 10, 1 << 20, 4096
MEMORY = 64 << 20
WRITE, SEND, READ = abi.const("VRDMA_WR_RDMA_WRITE"), abi.const("VRDMA_WR_SEND"), abi.const("VRDMA_WR_RDMA_READ")
FETCH_ADD = abi.const("VRDMA_WR_ATOMIC_FETCH_AND_ADD")
SUCCESS = abi.const("VRDMA_WC_SUCCESS")


@pytest.fixture
def vms() -> Iterator[LocalVms]:
    with LocalVms(2, memory_size=MEMORY) as shared:
        yield shared


class Log:
    """A dirty log for one VM of the engine, covering ``size`` bytes of bitmap (all of its memory by default)."""

    def __init__(self, vms: LocalVms, vm: LocalVm, size: int = MEMORY // PAGE // 8) -> None:
        self.bits = ffi.new("uint8_t[]", size)
        self.size = size
        vms.engine.set_dirty_log(vm.dev, int(ffi.cast("uintptr_t", self.bits)), size)

    def pages(self) -> set[int]:
        """The guest pages marked, and the log cleared (as QEMU's sync does)."""
        raw = bytes(ffi.buffer(self.bits, self.size))
        ffi.memmove(self.bits, bytes(self.size), self.size)
        return {i * 8 + bit for i, byte in enumerate(raw) if byte for bit in range(8) if byte >> bit & 1}


def pages(gpa: int, length: int) -> set[int]:
    return set(range(gpa // PAGE, (gpa + length - 1) // PAGE + 1))


def ring_header(side: Side) -> set[int]:
    return pages(side.qp.buf.gpa, 64)


def cq_pages(side: Side, index: int) -> set[int]:
    """The CQ's header page and the page of its CQE number ``index``."""
    return pages(side.cq.buf.gpa, 64) | pages(side.cq.buf.gpa + PAGE + index * abi.sizeof("vrdma_cqe"), 1)


def run(vms: LocalVms, side: Side, count: int = 1) -> list[Any]:
    done: list[Any] = []
    for _ in range(1000):
        vms.poll()
        done += side.completions()
        if len(done) >= count:
            break
    assert [c.status for c in done] == [SUCCESS] * count
    return done


def test_a_write_marks_the_pages_it_lands_in_and_the_senders_completion(vms: LocalVms) -> None:
    """vm0 WRITEs 40 KiB into vm1 from 1 KiB before a page boundary: vm1's log holds exactly the 11 pages written;
    vm0's holds its send queue's ring header and its CQ's header and CQE, not the pages the data was read from."""
    vm0, vm1 = vms.vms
    a, b = vms.pair(vm0, vm1)
    log0, log1 = Log(vms, vm0), Log(vms, vm1)
    start = b.mr.addr + 3 * PAGE - KIB
    a.verbs.post_send(a.qp, WRITE, [(a.mr.addr, 40 * KIB, a.mr.lkey)], wr_id=1, remote_addr=start, rkey=b.mr.rkey)
    run(vms, a)
    assert log1.pages() == pages(start, 40 * KIB)
    assert log0.pages() == ring_header(a) | cq_pages(a, 0)


def test_a_send_marks_the_receive_buffer_the_receivers_ring_and_completion(vms: LocalVms) -> None:
    vm0, vm1 = vms.vms
    a, b = vms.pair(vm0, vm1)
    log1 = Log(vms, vm1)
    b.verbs.post_recv(b.qp, [(b.mr.addr + 5 * PAGE, 2 * KIB, b.mr.lkey)], wr_id=9)
    a.verbs.post_send(a.qp, SEND, [(a.mr.addr, 2 * KIB, a.mr.lkey)], wr_id=1)
    run(vms, a)
    assert [c.wr_id for c in b.completions()] == [9]
    assert log1.pages() == pages(b.mr.addr + 5 * PAGE, 2 * KIB) | ring_header(b) | cq_pages(b, 0)


def test_a_read_marks_the_requesters_buffer_and_an_atomic_both_sides(vms: LocalVms) -> None:
    vm0, vm1 = vms.vms
    a, b = vms.pair(vm0, vm1)
    log0, log1 = Log(vms, vm0), Log(vms, vm1)
    a.verbs.post_send(a.qp, READ, [(a.mr.addr + 7 * PAGE, 3 * PAGE, a.mr.lkey)], wr_id=1, remote_addr=b.mr.addr,
                      rkey=b.mr.rkey)
    run(vms, a)
    assert log0.pages() == pages(a.mr.addr + 7 * PAGE, 3 * PAGE) | ring_header(a) | cq_pages(a, 0)
    assert log1.pages() == set()  # read, never written
    a.verbs.post_send(a.qp, FETCH_ADD, [(a.mr.addr + 12 * PAGE, 8, a.mr.lkey)], wr_id=2,
                      remote_addr=b.mr.addr + 9 * PAGE + 8, rkey=b.mr.rkey, compare_add=5)
    run(vms, a)
    assert log1.pages() == pages(b.mr.addr + 9 * PAGE, 1)
    assert log0.pages() == pages(a.mr.addr + 12 * PAGE, 8) | ring_header(a) | cq_pages(a, 1)


def test_no_log_marks_nothing_and_a_short_log_nothing_past_its_end(vms: LocalVms) -> None:
    """A log stopped (0, 0) is left alone; a log shorter than the guest's memory (QEMU sizes it to the highest
    region) marks the pages it covers and nothing past its end. A log without a size, or a size without a log, is
    refused."""
    vm0, vm1 = vms.vms
    a, b = vms.pair(vm0, vm1)
    log1 = Log(vms, vm1)
    vms.engine.set_dirty_log(vm1.dev, 0, 0)
    a.verbs.post_send(a.qp, WRITE, [(a.mr.addr, 4 * KIB, a.mr.lkey)], wr_id=1, remote_addr=b.mr.addr, rkey=b.mr.rkey)
    run(vms, a)
    assert log1.pages() == set()
    last = b.mr.addr // PAGE + 2  # the log covers vm1's memory up to the MR's third page
    guard = ffi.new("uint8_t[]", last // 8 + 1 + 64)
    vms.engine.set_dirty_log(vm1.dev, int(ffi.cast("uintptr_t", guard)), last // 8 + 1)
    a.verbs.post_send(a.qp, WRITE, [(a.mr.addr, 64 * KIB, a.mr.lkey)], wr_id=2, remote_addr=b.mr.addr,
                      rkey=b.mr.rkey)
    run(vms, a)
    marked = {i * 8 + bit for i in range(last // 8 + 1) for bit in range(8) if guard[i] >> bit & 1}
    assert pages(b.mr.addr, 3 * PAGE) <= marked <= set(range((last // 8 + 1) * 8))
    assert bytes(ffi.buffer(guard, len(guard)))[last // 8 + 1:] == bytes(64)
    for address, size in ((0x1000, 0), (0, 64)):
        with pytest.raises(EngineError, match="dirty log"):
            vms.engine.set_dirty_log(vm1.dev, address, size)
