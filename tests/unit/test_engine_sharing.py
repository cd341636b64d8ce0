"""How the engine shares itself between VMs (engine/poll.c): messages in pieces, weights, limits, fairness by VM.

Several VMs on one engine in process (vrdma.testing.inprocess.LocalVms): the test takes the engine's turns itself
and moves its clock, so what each VM gets of the engine is counted exactly, with no timing in the test.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from vrdma.device import abi
from vrdma.device.qos import Qos
from vrdma.testing.inprocess import LocalVm, LocalVms, Side
from vrdma.testing.simulated_guest import Buffer, SimMr, SimQp

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
PAGE = 4096
PIECE = 64 * KIB  # DeviceLimits.piece_bytes: while another VM of the thread works
SMALL_PIECE = 16 * KIB  # DeviceLimits.small_piece_bytes: while another VM of the thread sends small messages
SOLO = 1 * MIB  # DeviceLimits.solo_bytes: while no other VM of the thread works
RECENT_WORK_NS = 1_000_000  # engine.h VRE_RECENT_WORK_NS: how long a VM's work sizes the other VMs' pieces
WRITE, SEND = abi.const("VRDMA_WR_RDMA_WRITE"), abi.const("VRDMA_WR_SEND")
SUCCESS = abi.const("VRDMA_WC_SUCCESS")


@pytest.fixture
def vms() -> Iterator[LocalVms]:
    with LocalVms(2, memory_size=64 << 20) as shared:
        yield shared



def cycled_mr(vm: LocalVm, pd: int, length: int, backing_pages: int, fill: bytes = b"") -> tuple[SimMr, Buffer]:
    """An MR of ``length`` bytes over ``backing_pages`` pages of guest memory named over and over (and those pages)."""
    backing = vm.verbs.alloc(backing_pages * PAGE)
    if fill:
        vm.verbs.memory.write(backing.gpa, fill)
    return vm.verbs.reg_mr_cycled(pd, length, backing), backing


@dataclass
class Flood:
    """A QP kept full of signaled WRITEs of ``size`` bytes to its peer's MR; ``done`` counts those completed."""

    side: Side
    qp: SimQp
    peer: Side
    size: int
    depth: int
    done: int = 0

    def start(self) -> Flood:
        for _ in range(self.depth):
            self.post()
        return self

    def post(self) -> None:
        s = self.side
        s.verbs.post_send(self.qp, WRITE, [(s.mr.addr, self.size, s.mr.lkey)], remote_addr=self.peer.mr.addr,
                          rkey=self.peer.mr.rkey)

    def pump(self) -> None:
        for cqe in self.side.verbs.poll_cq(self.side.cq):
            assert cqe.status == SUCCESS
            self.done += 1
            self.post()


def run(vms: LocalVms, floods: list[Flood], until: int, watch: list[Flood] | None = None) -> None:
    """Take engine turns, keeping every flood full, until one of ``watch`` (default: any) completed ``until`` more."""
    watch = watch or floods
    start = [f.done for f in watch]
    for _ in range(1_000_000):
        vms.poll()
        for f in floods:
            f.pump()
        if any(f.done - s >= until for f, s in zip(watch, start, strict=True)):
            return
    raise AssertionError("the floods did not get going")


def shares(vms: LocalVms, floods: list[Flood], until: int) -> list[int]:
    """Bytes each flood completed while the one that gets furthest completes ``until`` messages."""
    before = [f.done for f in floods]
    run(vms, floods, until)
    return [(f.done - was) * f.size for f, was in zip(floods, before, strict=True)]


def test_a_small_write_completes_between_the_pieces_of_another_vms_1gib_write(vms: LocalVms) -> None:
    """vm0 WRITEs 1 GiB to vm1; vm1's 8-byte WRITE to vm0, rung after it, completes in the first turn, while vm0's
    WRITE has moved one piece (a solo one: nothing else had worked); vm0's own second QP gets a turn between the
    pieces too; vm0's WRITE completes after 1,024 pieces with every page of it written."""
    vm0, vm1 = vms.vms
    big0, big1 = vm0.side(4 * KIB, cq_entries=64), vm1.side(4 * KIB, cq_entries=64)
    vms.connect(vm0, big0.qp, vm1, big1.qp)
    pattern = bytes((i * 131 + i // PAGE) % 256 for i in range(16 * PAGE))  # each of the 16 pages its own
    src, _ = cycled_mr(vm0, big0.pd, GIB, 16, fill=pattern)
    dst, dst_backing = cycled_mr(vm1, big1.pd, GIB, 16)
    vm0.verbs.post_send(big0.qp, WRITE, [(src.addr, GIB, src.lkey)], wr_id=1, remote_addr=dst.addr, rkey=dst.rkey)
    small1, small0 = vms.pair(vm1, vm0, 4 * KIB)
    small1.verbs.post_send(small1.qp, WRITE, [(small1.mr.addr, 8, small1.mr.lkey)], wr_id=2,
                           remote_addr=small0.mr.addr, rkey=small0.mr.rkey)
    vms.poll()
    assert [(c.wr_id, c.status) for c in small1.completions()] == [(2, SUCCESS)]
    assert big0.completions() == [], "the 1 GiB WRITE completed in one turn: it was not cut into pieces"
    vms.advance(RECENT_WORK_NS)  # vm1's small message no longer keeps vm0's pieces small (the next test's rule)
    # ... and vm0's own second QP gets its turn between the pieces too.
    own0, own1 = vms.pair(vm0, vm1, 4 * KIB)
    own0.verbs.post_send(own0.qp, WRITE, [(own0.mr.addr, 8, own0.mr.lkey)], wr_id=3, remote_addr=own1.mr.addr,
                         rkey=own1.mr.rkey)
    turns = 1
    while not (done := big0.completions()):
        vms.poll()
        turns += 1
        if turns == 3:
            assert [(c.wr_id, c.status) for c in own0.completions()] == [(3, SUCCESS)]
        assert turns <= GIB // SOLO + 1
    assert [(c.wr_id, c.status, c.byte_len) for c in done] == [(1, SUCCESS, GIB)]
    assert turns == GIB // SOLO  # a piece a turn, the small WRITE of vm0's other QP in one of them
    assert vm1.verbs.memory.read(dst_backing.gpa, 16 * PAGE) == pattern
    qos = vm0.device.qos_counters()
    assert qos["pieced_messages"] == 1
    assert qos["deferred_bytes"] == GIB - SOLO  # every piece but the first waited for a later turn
    assert vms.engine.counters(vm0.dev)["tx_bytes"] == GIB + 8


def test_a_vms_pieces_follow_what_the_other_vms_of_its_thread_do(vms: LocalVms) -> None:
    """vm0's 16 MiB WRITE moves a solo piece (1 MiB) a pass alone; once vm1 has sent an 8-byte WRITE, 16 KiB a pass
    (its turns and pieces small, so the next small message waits for less of it), even while vm0 sends small
    messages of its own between; 64 KiB a pass while vm1 moves a large message; 1 MiB again once vm1 has done
    nothing for a millisecond."""
    vm0, vm1 = vms.vms
    big0, big1 = vms.pair(vm0, vm1, 16 * MIB)
    small1, small0 = vms.pair(vm1, vm0, 4 * KIB)
    own0, own1 = vms.pair(vm0, vm1, 4 * KIB)
    large1, large0 = vms.pair(vm1, vm0, 1 * MIB)
    vm0.verbs.memory.write(big0.mr.buf.gpa, b"\xab" * 16 * MIB)
    written = 0

    def moved() -> int:
        nonlocal written
        vms.poll()
        was, written = written, vm1.verbs.memory.read(big1.mr.buf.gpa, 16 * MIB).count(b"\xab")
        return written - was

    def write(side: Side, peer: Side, length: int) -> None:
        side.verbs.post_send(side.qp, WRITE, [(side.mr.addr, length, side.mr.lkey)], remote_addr=peer.mr.addr,
                             rkey=peer.mr.rkey)

    write(big0, big1, 16 * MIB)
    assert [moved() for _ in range(2)] == [SOLO, SOLO]
    write(small1, small0, 8)
    assert moved() == SOLO  # vm0's turn came before vm1's in that pass
    assert [moved() for _ in range(3)] == [SMALL_PIECE] * 3
    write(own0, own1, 8)  # vm0's own small message hides nothing of vm1's
    vms.advance(RECENT_WORK_NS // 2)
    # (A piece costs its bytes and a work request, more than a small turn is worth: now and then vm0 sits a turn
    # out to pay its debt.)
    passes = [moved() for _ in range(12)]
    assert set(passes) == {0, SMALL_PIECE}, passes
    vms.advance(RECENT_WORK_NS // 2)
    write(large1, large0, MIB)
    assert [moved() for _ in range(3)] == [SOLO, PIECE, PIECE]  # vm0's turn came first in the pass vm1 began
    # (vm1's own pieces are small: vm0's small message is half a millisecond old.)
    passes = []
    while not large1.completions():
        passes.append(moved())
        assert len(passes) <= 2 * MIB // SMALL_PIECE, "vm1's 1 MiB WRITE did not complete"
    assert set(passes) == {0, PIECE}, passes  # a turn out now and then, for the debt
    vms.advance(RECENT_WORK_NS)
    assert moved() == SOLO
    assert small1.completions()[0].status == SUCCESS and own0.completions()[0].status == SUCCESS


def test_a_send_in_pieces_fills_one_receive(vms: LocalVms) -> None:
    vm0, vm1 = vms.vms
    a, b = vms.pair(vm0, vm1, 4 * MIB)
    payload = bytes(range(251)) * (3 * MIB // 251)
    vm0.verbs.memory.write(a.mr.addr, payload)
    b.verbs.post_recv(b.qp, [(b.mr.addr, 4 * MIB, b.mr.lkey)], wr_id=7)
    b.verbs.post_recv(b.qp, [(b.mr.addr, 4 * MIB, b.mr.lkey)], wr_id=8)
    a.verbs.post_send(a.qp, SEND, [(a.mr.addr, len(payload), a.mr.lkey)], wr_id=9)
    for _ in range(len(payload) // PIECE + 1):
        vms.poll()
    assert [(c.wr_id, c.status, c.byte_len) for c in b.completions()] == [(7, SUCCESS, len(payload))]
    assert [(c.wr_id, c.status) for c in a.completions()] == [(9, SUCCESS)]
    assert vm1.verbs.memory.read(b.mr.addr, len(payload)) == payload


def test_a_receiver_in_error_between_the_pieces_of_a_send_flushes_the_receive_it_was_filling(vms: LocalVms) -> None:
    vm0, vm1 = vms.vms
    a, b = vms.pair(vm0, vm1, 4 * MIB)
    b.verbs.post_recv(b.qp, [(b.mr.addr, 4 * MIB, b.mr.lkey)], wr_id=7)
    a.verbs.post_send(a.qp, SEND, [(a.mr.addr, 4 * MIB, a.mr.lkey)], wr_id=9)
    vms.poll()
    assert b.completions() == []
    b.verbs.modify_qp(b.qp, abi.const("VRDMA_QP_STATE"), qp_state=abi.const("VRDMA_QPS_ERR"))
    vms.poll()
    assert [(c.wr_id, c.status) for c in b.completions()] == [(7, abi.const("VRDMA_WC_WR_FLUSH_ERR"))]


def test_a_wqe_rewritten_between_its_pieces_fails_and_an_mr_gone_between_them_is_a_remote_access_error(
        vms: LocalVms) -> None:
    """Each piece checks the WQE and both sides' memory again: a guest that rewrites its WQE's length mid-message
    gets a local QP operation error; an MR deregistered by its VM between two pieces ends the WRITE with a remote
    access error (and nothing more is written into memory it no longer registers)."""
    vm0, vm1 = vms.vms
    a, b = vms.pair(vm0, vm1, 4 * MIB)
    a.verbs.post_send(a.qp, WRITE, [(a.mr.addr, 4 * MIB, a.mr.lkey)], wr_id=1, remote_addr=b.mr.addr,
                      rkey=b.mr.rkey)
    vms.poll()
    slot = a.qp.sq.slot_gpa(0)
    # The first SGE follows the WQE's header; struct vrdma_sge is addr (8 bytes), length, lkey.
    vm0.verbs.memory.write(slot + abi.sizeof("vrdma_send_wqe") + 8, struct.pack("<I", 2 * MIB))
    vms.poll()
    assert [(c.wr_id, c.status) for c in a.completions()] == [(1, abi.const("VRDMA_WC_LOC_QP_OP_ERR"))]

    c, d = vms.pair(vm0, vm1, 4 * MIB)
    vm1.verbs.memory.write(d.mr.addr, bytes(4 * MIB))
    vm0.verbs.memory.write(c.mr.addr, b"\xab" * 4 * MIB)
    c.verbs.post_send(c.qp, WRITE, [(c.mr.addr, 4 * MIB, c.mr.lkey)], wr_id=2, remote_addr=d.mr.addr,
                      rkey=d.mr.rkey)
    vms.poll()
    vm1.verbs.call("VRDMA_CMD_DEREG_MR", "vrdma_cmd_destroy", "vrdma_resp_hdr", handle=d.mr.handle)
    for _ in range(4):
        vms.poll()
    assert [(x.wr_id, x.status) for x in c.completions()] == [(2, abi.const("VRDMA_WC_REM_ACCESS_ERR"))]
    written = vm1.verbs.memory.read(d.mr.addr, 4 * MIB)  # one solo piece before the MR went, at most one after
    assert written[:SOLO] == b"\xab" * SOLO and written[2 * SOLO:] == bytes(2 * MIB)


def test_weights_share_the_engine_and_a_new_weight_takes_effect_at_once(vms: LocalVms) -> None:
    """Two VMs flooding each other with 1 MiB WRITEs: equal shares by default; vm0 at weight 300 against 100 then
    moves three times vm1's bytes, from the next turn on."""
    vm0, vm1 = vms.vms
    a, b = vms.pair(vm0, vm1, 1 * MIB, depth=16)
    c, d = vms.pair(vm1, vm0, 1 * MIB, depth=16)
    floods = [Flood(a, a.qp, b, MIB, 8).start(), Flood(c, c.qp, d, MIB, 8).start()]
    run(vms, floods, 4)
    equal = shares(vms, floods, 30)
    assert equal[0] / equal[1] == pytest.approx(1.0, rel=0.1)
    vm0.device.set_qos(Qos(weight=300))
    run(vms, floods, 2)
    weighted = shares(vms, floods, 60)
    assert weighted[0] / weighted[1] == pytest.approx(3.0, rel=0.1)


def test_a_low_latency_vm_gets_no_more_than_its_weight(vms: LocalVms) -> None:
    """vm0 at latency class low floods 1 MiB WRITEs against vm1's flood: its looks between vm1's pieces are paid from
    its own turn, so the bytes stay equal (and 3:1 at weight 300), and every WRITE completes. (When within a pass the
    looks come is not visible from here: the engine's turns are taken a pass at a time.)"""
    vm0, vm1 = vms.vms
    a, b = vms.pair(vm0, vm1, 1 * MIB, depth=16)
    c, d = vms.pair(vm1, vm0, 1 * MIB, depth=16)
    vm0.device.set_qos(Qos(latency=1))
    assert vm0.device.qos.as_table()["latency"] == "low"
    floods = [Flood(a, a.qp, b, MIB, 8).start(), Flood(c, c.qp, d, MIB, 8).start()]
    run(vms, floods, 4)
    equal = shares(vms, floods, 30)
    assert equal[0] / equal[1] == pytest.approx(1.0, rel=0.1)
    vm0.device.set_qos(Qos(latency=1, weight=300))
    run(vms, floods, 2)
    weighted = shares(vms, floods, 60)
    assert weighted[0] / weighted[1] == pytest.approx(3.0, rel=0.1)
    assert vm0.device.qos_counters()["turns"] > 0


def test_a_vm_with_eight_busy_qps_gets_its_weight_not_eight_shares(vms: LocalVms) -> None:
    vm0, vm1 = vms.vms
    many = []
    for _ in range(8):
        a, b = vms.pair(vm0, vm1, 1 * MIB, depth=8)
        many.append(Flood(a, a.qp, b, MIB, 4).start())
    c, d = vms.pair(vm1, vm0, 1 * MIB, depth=16)
    one = Flood(c, c.qp, d, MIB, 8).start()
    run(vms, [*many, one], 4)
    before = [f.done for f in many], one.done
    run(vms, [*many, one], 40, watch=[one])
    vm0_bytes = sum(f.done - was for f, was in zip(many, before[0], strict=True)) * MIB
    vm1_bytes = (one.done - before[1]) * MIB
    assert vm0_bytes / vm1_bytes == pytest.approx(1.0, rel=0.1)
    assert all(f.done > before[0][i] for i, f in enumerate(many))  # and its QPs share its turns


def test_a_byte_limit_holds_a_vm_to_its_rate_and_its_neighbour_runs_free(vms: LocalVms) -> None:
    """vm0 at 50 MB/s with a 256 KiB burst, flooding 64 KiB WRITEs for 0.2 s of engine clock: it moves its burst and
    its rate's worth (within 5%), is counted throttled, and lets the engine park until its bucket refills; vm1
    beside it, unlimited, is not held back."""
    vm0, vm1 = vms.vms
    vm0.device.set_qos(Qos(bytes_per_s=50_000_000, bytes_burst=256 * KIB))
    a, b = vms.pair(vm0, vm1, 1 * MIB, depth=64)
    c, d = vms.pair(vm1, vm0, 1 * MIB, depth=64)
    limited, free = Flood(a, a.qp, b, 64 * KIB, 32).start(), Flood(c, c.qp, d, 64 * KIB, 32).start()
    step, steps = 100_000, 2000
    for _ in range(steps):
        vms.poll()
        vms.advance(step)
        limited.pump()
        free.pump()
    expected = 256 * KIB + 50_000_000 * steps * step / 1e9
    assert limited.done * 64 * KIB == pytest.approx(expected, rel=0.05)
    assert free.done * 64 * KIB > 10 * expected
    qos = vm0.device.qos_counters()
    assert qos["throttled_ns"] > 0.8 * steps * step  # it had work waiting nearly all the time
    # Alone and held back, it leaves the engine free to park until its bucket has a byte again.
    c.verbs.reset_qp(c.qp)
    for _ in range(100):
        if not vms.poll():
            break
        limited.pump()
    deadline = vms.engine.next_deadline_ns()
    assert deadline is not None and vms.now < deadline <= vms.now + int(PIECE / 50_000_000 * 1e9) + 1
    assert vms.engine.park()


def test_a_work_request_limit_holds_a_vm_to_its_rate(vms: LocalVms) -> None:
    vm0, vm1 = vms.vms
    vm0.device.set_qos(Qos(wrs_per_s=20_000, wrs_burst=16))
    a, b = vms.pair(vm0, vm1, 4 * KIB, depth=64)
    flood = Flood(a, a.qp, b, 8, 32).start()
    step, steps = 100_000, 1000
    for _ in range(steps):
        vms.poll()
        vms.advance(step)
        flood.pump()
    assert flood.done == pytest.approx(16 + 20_000 * steps * step / 1e9, rel=0.05)


def test_qos_settings_are_checked() -> None:
    with pytest.raises(Exception, match="weight must be 1 to 1000"):
        Qos(weight=0)
    assert Qos().changed({"bytes-per-s": "1.5G", "wrs-burst": "4Ki"}, "test") == \
        Qos(bytes_per_s=1_500_000_000, wrs_burst=4096)
    assert Qos().changed({"latency": "low"}, "test") == Qos(latency=1)
    assert Qos(latency=1).changed({"latency": "normal"}, "test").as_table()["latency"] == "normal"
    for bad, message in (({"weight": "heavy"}, "weight must be a whole number"), ({"speed": 1}, "unknown QoS key"),
                         ({"latency": "fast"}, "latency must be 'normal' or 'low'"),
                         ({"latency": 1}, "latency must be 'normal' or 'low'"),
                         ({"bytes-per-s": -1}, "bytes-per-s must be 0"), ({"weight": True}, "must be a number"),
                         ({"bytes-burst": "1.5"}, "not a whole number")):
        with pytest.raises(Exception, match=message):
            Qos().changed(bad, "test")
