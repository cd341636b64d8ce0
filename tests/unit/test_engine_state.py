"""A device's state as data (engine/state.c): saved while suspended, loaded into an empty device, refused when bad.

Two VMs on one engine in process (vrdma.testing.inprocess.LocalVms). "Reopened" is what a backend that takes over
(an upgrade) or a destination (a migration) does with a state: the engine forgets the device and opens it again,
with the guest's memory and GIDs, then loads the state; traffic that was in flight goes on where it stopped.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import pytest

from vrdma.device import abi
from vrdma.device.params import engine_limits
from vrdma.engine.api import EngineError
from vrdma.engine.native import lib
from vrdma.testing.inprocess import LocalVm, LocalVms

KIB, MIB = 1 << 10, 1 << 20
WRITE, SEND = abi.const("VRDMA_WR_RDMA_WRITE"), abi.const("VRDMA_WR_SEND")
SUCCESS = abi.const("VRDMA_WC_SUCCESS")
HEADER = struct.Struct("<IIQ")  # struct vre_state_header's magic, version and length
RECORD = struct.Struct("<IIII")  # struct vre_state_record: kind, slot, bytes, npages
HEADER_SIZE = 296


@pytest.fixture
def vms() -> Iterator[LocalVms]:
    with LocalVms(2, memory_size=64 << 20) as shared:
        yield shared



def reopen(vms: LocalVms, vm: LocalVm) -> None:
    """The engine forgets vm's device and opens it again, with its memory and GIDs: empty, as a new backend's is."""
    engine, device = vms.engine, vm.device
    engine.close_device(vm.dev)
    engine.open_device(vm.dev, engine_limits(device.limits), device.doorbell_address())
    engine.set_memory(vm.dev, device.memory)
    for index, gid in device.objects.gids.entries.items():
        engine.set_gid(vm.dev, index, gid.raw, gid.type)


def saved(vms: LocalVms, vm: LocalVm) -> bytes:
    vms.engine.suspend_device(vm.dev, True)
    return vms.engine.save_device(vm.dev)


def records(state: bytes) -> list[tuple[int, int, int, int, int]]:
    """(offset, kind, slot, bytes, npages) of each record."""
    out, at = [], HEADER_SIZE
    while at < len(state):
        kind, slot, size, npages = RECORD.unpack_from(state, at)
        out.append((at, kind, slot, size, npages))
        at += size
    return out


def test_traffic_in_flight_goes_on_after_the_state_moves_into_a_new_device(vms: LocalVms) -> None:
    """vm0 is saved in the middle of a 4 MiB WRITE (moving in pieces) with SENDs queued behind it and completions
    unread, its device reopened empty and the state loaded: the WRITE finishes where it stopped, every SEND lands in
    the receive vm1 posted for it, the completions come in order, and the QP's counters go on from the source's."""
    vm0, vm1 = vms.vms
    a, b = vms.pair(vm0, vm1, 8 * MIB)
    # vm1 floods its own pair so that vm0's pieces are small (a WRITE alone would move whole): more passes in flight
    c, d = vms.pair(vm1, vm0, 1 * MIB)
    pattern = bytes((i * 7 + i // 4096) % 251 for i in range(4 * MIB))
    vm0.verbs.memory.write(a.mr.addr, pattern)
    for i in range(4):
        b.verbs.post_recv(b.qp, [(b.mr.addr + 6 * MIB + i * KIB, KIB, b.mr.lkey)], wr_id=100 + i)
    vm0.verbs.memory.write(a.mr.addr + 4 * MIB, b"S" * 4 * KIB)
    a.verbs.post_send(a.qp, WRITE, [(a.mr.addr, 4 * MIB, a.mr.lkey)], wr_id=1, remote_addr=b.mr.addr, rkey=b.mr.rkey)
    for i in range(4):
        a.verbs.post_send(a.qp, SEND, [(a.mr.addr + 4 * MIB + i * KIB, KIB, a.mr.lkey)], wr_id=10 + i)
    c.verbs.post_send(c.qp, WRITE, [(c.mr.addr, MIB, c.mr.lkey)], wr_id=50, remote_addr=d.mr.addr, rkey=d.mr.rkey)
    vms.poll()
    vms.poll()
    written = vm1.verbs.memory.read(b.mr.addr, 4 * MIB)
    assert 0 < sum(1 for i in range(0, 4 * MIB, 4096) if written[i:i + 4096] == pattern[i:i + 4096]) < 1024
    slot = vm0.device.objects.qps.get(a.qp.handle).slot
    counters_before = vms.engine.qp_counters(vm0.dev, slot)

    state = saved(vms, vm0)
    vms.poll()  # a suspended device is not run
    assert a.completions() == []
    reopen(vms, vm0)
    vms.engine.load_device(vm0.dev, state)
    assert vms.engine.qp_counters(vm0.dev, slot) == counters_before
    vms.engine.suspend_device(vm0.dev, False)
    done: list[tuple[int, int]] = []
    for _ in range(10_000):
        vms.poll()
        done += [(cqe.wr_id, cqe.status) for cqe in a.completions()]
        if len(done) == 5:
            break
    assert done == [(1, SUCCESS)] + [(10 + i, SUCCESS) for i in range(4)]
    assert vm1.verbs.memory.read(b.mr.addr, 4 * MIB) == pattern
    assert [(cqe.wr_id, cqe.status, cqe.byte_len) for cqe in b.completions()] == \
        [(100 + i, SUCCESS, KIB) for i in range(4)]
    assert vm1.verbs.memory.read(b.mr.addr + 6 * MIB, 4 * KIB) == b"S" * 4 * KIB
    assert vms.engine.qp_counters(vm0.dev, slot)["send_wqes"] == 5


def test_saving_asks_for_a_suspended_device_and_leaves_it_as_it_was(vms: LocalVms) -> None:
    """A running device's state would be stale at once: refused. A suspended one's is saved twice alike, and the
    device resumed after a save (a migration that failed) runs on as if nothing happened."""
    vm0, vm1 = vms.vms
    a, b = vms.pair(vm0, vm1)
    with pytest.raises(EngineError, match="suspend it"):
        vms.engine.save_device(vm0.dev)
    first = saved(vms, vm0)
    assert vms.engine.save_device(vm0.dev) == first
    magic, version, length = HEADER.unpack_from(first)
    assert (magic, version, length) == (lib.VRE_STATE_MAGIC, lib.VRE_STATE_VERSION, len(first))
    assert sorted({kind for _, kind, *_ in records(first)}) == [lib.VRE_STATE_MR, lib.VRE_STATE_CQ,
                                                                 lib.VRE_STATE_QP]
    a.verbs.post_send(a.qp, WRITE, [(a.mr.addr, 8, a.mr.lkey)], wr_id=7, remote_addr=b.mr.addr, rkey=b.mr.rkey)
    vms.poll()
    assert a.completions() == []
    vms.engine.suspend_device(vm0.dev, False)
    vms.poll()
    assert [(c.wr_id, c.status) for c in a.completions()] == [(7, SUCCESS)]


def test_a_sender_waits_for_a_suspended_destination_without_spending_its_retries(vms: LocalVms) -> None:
    """vm1 suspended (being saved, say) for far longer than vm0's QP would retry a peer that does not answer: vm0's
    WRITE waits, and completes once vm1 runs again."""
    vm0, vm1 = vms.vms
    a, b = vms.pair(vm0, vm1)
    vms.engine.suspend_device(vm1.dev, True)
    a.verbs.post_send(a.qp, WRITE, [(a.mr.addr, 8, a.mr.lkey)], wr_id=7, remote_addr=b.mr.addr, rkey=b.mr.rkey)
    for _ in range(200):
        vms.poll()
        vms.advance(100_000_000)  # 20 s in all: retry_cnt 7 of any timeout would be spent many times over
    assert a.completions() == []
    vms.engine.suspend_device(vm1.dev, False)
    vms.advance(100_000_000)
    vms.poll()
    assert [(c.wr_id, c.status) for c in a.completions()] == [(7, SUCCESS)]


def corrupt(state: bytes, offset: int, fmt: str, value: int) -> bytes:
    out = bytearray(state)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def test_a_bad_state_is_refused_and_the_device_stays_empty(vms: LocalVms) -> None:
    """Every refusal names what is wrong and leaves the device open and empty, so a good state loads after it; a
    check (what a destination does before it has the guest's memory) keeps nothing either."""
    vm0, vm1 = vms.vms
    vms.pair(vm0, vm1)
    state = saved(vms, vm0)
    reopen(vms, vm0)
    mr_at = next(at for at, kind, *_ in records(state) if kind == lib.VRE_STATE_MR)
    qp_at, _, _, qp_bytes, _ = next(r for r in records(state) if r[1] == lib.VRE_STATE_QP)
    attr_at = qp_at + RECORD.size + 96  # struct vre_state_qp: its config (96 bytes), then its attributes
    bad = {
        "not a device state": corrupt(state, 0, "<I", 0x12345678),
        "version": corrupt(state, 4, "<I", 99),
        "bytes given": state[:-8],
        "does not fit this device": corrupt(state, 20, "<I", 8),  # max_mr: tables of another size
        "says it has": corrupt(state, qp_at + 8, "<I", qp_bytes + 8),
        "kind": corrupt(state, mr_at, "<I", 9),
        "page-aligned": corrupt(state, mr_at + RECORD.size + 96, "<Q", 0x1001),
        "not a page of guest RAM": corrupt(state, mr_at + RECORD.size + 96, "<Q", 1 << 40),
        "attributes or runtime state": corrupt(state, attr_at, "<I", 7),  # QP state 7: none
        "unusable": corrupt(state, qp_at + 4, "<I", 3),  # a QP in a slot its QPN does not name
    }
    for reason, state_bad in bad.items():
        with pytest.raises(EngineError, match=reason):
            vms.engine.load_device(vm0.dev, state_bad)
    with pytest.raises(EngineError, match="not a page of guest RAM"):
        vms.engine.load_device(vm0.dev, bad["not a page of guest RAM"])
    vms.engine.load_device(vm0.dev, bad["not a page of guest RAM"], check_only=True)  # pages need no memory yet
    vms.engine.load_device(vm0.dev, state, check_only=True)
    vms.engine.load_device(vm0.dev, state)
    with pytest.raises(EngineError, match="has objects"):
        vms.engine.load_device(vm0.dev, state)
