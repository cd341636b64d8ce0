"""The data engine driven through the simulated frontend: two VMs' memory, one backend process, no guests.

Each test plays vm0 and vm1 with vrdma.testing.simulated_guest (what vrdma.ko and libvrdma do, over vhost-user), so
it can post what a correct provider posts and what a hostile one could.
"""

from __future__ import annotations

import hashlib
import time
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from backend_process import GID, BackendProcess, connect_sides, query_device, start_side, two_vms, wait_cqes
from backend_process import SimSide as Side
from polling import wait_until

from vrdma.device import abi
from vrdma.testing.frontend import Frontend, FrontendError
from vrdma.testing.simulated_guest import CommandError

pytestmark = pytest.mark.backend

WR = {name: abi.const(f"VRDMA_WR_{name}") for name in ("SEND", "SEND_WITH_IMM", "RDMA_WRITE", "RDMA_WRITE_WITH_IMM",
                                                         "RDMA_READ", "ATOMIC_CMP_AND_SWP", "ATOMIC_FETCH_AND_ADD")}
WC = {name: abi.const(f"VRDMA_WC_{name}") for name in ("SUCCESS", "LOC_LEN_ERR", "LOC_PROT_ERR", "WR_FLUSH_ERR",
                                                         "REM_ACCESS_ERR", "REM_INV_REQ_ERR", "RETRY_EXC_ERR",
                                                         "RNR_RETRY_EXC_ERR", "LOC_QP_OP_ERR")}
OP = {name: abi.const(f"VRDMA_WC_OP_{name}") for name in ("SEND", "RDMA_WRITE", "RDMA_READ", "COMP_SWAP",
                                                           "FETCH_ADD", "RECV", "RECV_RDMA_WITH_IMM")}


def make_side(fe: Frontend, backend: BackendProcess, name: str) -> Side:
    return start_side(fe, backend, name, GID[name], 64 << 10)


@pytest.fixture
def pair(backend: BackendProcess) -> Iterator[tuple[Side, Side]]:
    with two_vms(backend, make_side, GID) as sides:
        yield sides


def write(side: Side, offset: int, data: bytes) -> None:
    side.verbs.memory.write(side.mr.addr + offset, data)


def read(side: Side, offset: int, length: int) -> bytes:
    return side.verbs.memory.read(side.mr.addr + offset, length)


def test_send_lands_in_the_posted_receive(pair: tuple[Side, Side]) -> None:
    a, b = pair
    a.verbs.post_recv(a.qp, [(a.mr.addr, 4096, a.mr.lkey)], wr_id=7)
    payload = bytes(range(256)) * 16
    write(b, 0, payload)
    b.verbs.post_send(b.qp, WR["SEND"], [(b.mr.addr, len(payload), b.mr.lkey)], wr_id=9)
    (sent,) = wait_cqes(b.verbs, b.cq, 1)
    (received,) = wait_cqes(a.verbs, a.cq, 1)
    assert (sent.wr_id, sent.status, sent.opcode) == (9, WC["SUCCESS"], OP["SEND"])
    assert (received.wr_id, received.status, received.opcode, received.byte_len) == (7, WC["SUCCESS"], OP["RECV"],
                                                                                      len(payload))
    assert received.qp_num == a.qp.qpn and received.src_qp == b.qp.qpn
    assert read(a, 0, len(payload)) == payload


def test_queues_in_a_second_doorbell_page_carry_traffic_and_wake_a_parked_engine(backend: BackendProcess) -> None:
    """A context whose first doorbell page is full gets a second one: CQs and a QP whose slots are there work as in
    the first, and the engine keeps the parked slot of that page too (a send rung there while it is parked wakes
    it)."""
    with two_vms(backend, make_side, GID, connect=False) as (a, b):
        slots = abi.const("VRDMA_DB_SLOTS")
        ring = b.verbs.page_list(b.verbs.alloc(2 * 4096))  # one ring the filler CQs share: none ever completes
        fillers = []
        while True:
            cq = b.verbs.call("VRDMA_CMD_CREATE_CQ", "vrdma_cmd_create_cq", "vrdma_resp_create_cq",
                              ucontext=b.verbs.ucontext, entries=1, ring=ring)
            if int(cq.db_index) // slots != b.verbs.doorbell_page:
                break
            fillers.append(int(cq.handle))
        assert len(fillers) == abi.const("VRDMA_DB_SLOT_ALIVE") - 1 - 3  # b's CQ, QP (2) and the fillers
        second_page = int(cq.db_index) // slots
        assert backend.counters("vm1")["doorbell_pages"] == sorted([b.verbs.doorbell_page, second_page])
        b.cq = b.verbs.create_cq(64)
        b.qp = b.verbs.create_qp(b.pd, b.cq, b.cq)
        assert b.cq.db // slots == b.qp.sq.db // slots == b.qp.rq.db // slots == second_page
        connect_sides(a, GID["vm0"], b, GID["vm1"])
        deadline = time.monotonic() + 10
        while not b.verbs.parked(b.qp.sq.db):  # the engine parks when idle, and flags every page with queues
            assert time.monotonic() < deadline, "the engine never parked, or left the second page unflagged"
            time.sleep(0.001)
        a.verbs.post_recv(a.qp, [(a.mr.addr, 4096, a.mr.lkey)], wr_id=1)
        b.verbs.post_recv(b.qp, [(b.mr.addr, 4096, b.mr.lkey)], wr_id=2)
        write(b, 0, b"second page" * 100)
        b.verbs.post_send(b.qp, WR["SEND"], [(b.mr.addr, 1100, b.mr.lkey)], wr_id=3)
        (sent,) = wait_cqes(b.verbs, b.cq, 1)
        (received,) = wait_cqes(a.verbs, a.cq, 1)
        assert (sent.wr_id, sent.status, received.status, received.byte_len) == (3, WC["SUCCESS"], WC["SUCCESS"], 1100)
        assert read(a, 0, 1100) == b"second page" * 100
        write(a, 0, b"and back")
        a.verbs.post_send(a.qp, WR["SEND"], [(a.mr.addr, 8, a.mr.lkey)], wr_id=4)
        wait_cqes(a.verbs, a.cq, 1)
        (back,) = wait_cqes(b.verbs, b.cq, 1)
        assert (back.wr_id, back.status, read(b, 0, 8)) == (2, WC["SUCCESS"], b"and back")


def test_scatter_gather_inline_and_immediate(pair: tuple[Side, Side]) -> None:
    a, b = pair
    # The receive scatters over three SGEs; the send gathers from two.
    a.verbs.post_recv(a.qp, [(a.mr.addr + 100, 10, a.mr.lkey), (a.mr.addr + 5000, 6000, a.mr.lkey),
                             (a.mr.addr + 20000, 100, a.mr.lkey)], wr_id=1)
    write(b, 0, b"x" * 3000)
    write(b, 40000, b"y" * 3000)
    b.verbs.post_send(b.qp, WR["SEND_WITH_IMM"], [(b.mr.addr, 3000, b.mr.lkey), (b.mr.addr + 40000, 3000, b.mr.lkey)],
                      imm=0x12345678)
    wait_cqes(b.verbs, b.cq, 1)
    (received,) = wait_cqes(a.verbs, a.cq, 1)
    assert received.byte_len == 6000 and received.imm_data == 0x12345678
    assert received.wc_flags == abi.const("VRDMA_WC_WITH_IMM")
    got = read(a, 100, 10) + read(a, 5000, 5990)
    assert got == b"x" * 3000 + b"y" * 3000
    # Inline data travels in the WQE itself.
    a.verbs.post_recv(a.qp, [(a.mr.addr, 64, a.mr.lkey)], wr_id=2)
    b.verbs.post_send(b.qp, WR["SEND"], [], inline=b"inline payload")
    wait_cqes(b.verbs, b.cq, 1)
    assert wait_cqes(a.verbs, a.cq, 1)[0].byte_len == 14 and read(a, 0, 14) == b"inline payload"


def test_rdma_write_read_and_atomics(pair: tuple[Side, Side]) -> None:
    a, b = pair
    write(b, 0, b"written by vm1")
    b.verbs.post_send(b.qp, WR["RDMA_WRITE"], [(b.mr.addr, 14, b.mr.lkey)], remote_addr=a.mr.addr + 8192,
                      rkey=a.mr.rkey, wr_id=1)
    assert wait_cqes(b.verbs, b.cq, 1)[0].status == WC["SUCCESS"]
    assert read(a, 8192, 14) == b"written by vm1"
    write(a, 30000, b"read from vm0")
    b.verbs.post_send(b.qp, WR["RDMA_READ"], [(b.mr.addr + 1000, 13, b.mr.lkey)], remote_addr=a.mr.addr + 30000,
                      rkey=a.mr.rkey, wr_id=2)
    (done,) = wait_cqes(b.verbs, b.cq, 1)
    assert (done.status, done.opcode, done.byte_len) == (WC["SUCCESS"], OP["RDMA_READ"], 13)
    assert read(b, 1000, 13) == b"read from vm0"
    write(a, 4096, (5).to_bytes(8, "little"))
    b.verbs.post_send(b.qp, WR["ATOMIC_FETCH_AND_ADD"], [(b.mr.addr + 64, 8, b.mr.lkey)],
                      remote_addr=a.mr.addr + 4096, rkey=a.mr.rkey, compare_add=10)
    assert wait_cqes(b.verbs, b.cq, 1)[0].opcode == OP["FETCH_ADD"]
    assert read(b, 64, 8) == (5).to_bytes(8, "little") and read(a, 4096, 8) == (15).to_bytes(8, "little")
    b.verbs.post_send(b.qp, WR["ATOMIC_CMP_AND_SWP"], [(b.mr.addr + 72, 8, b.mr.lkey)],
                      remote_addr=a.mr.addr + 4096, rkey=a.mr.rkey, compare_add=15, swap=99)
    assert wait_cqes(b.verbs, b.cq, 1)[0].opcode == OP["COMP_SWAP"]
    assert read(b, 72, 8) == (15).to_bytes(8, "little") and read(a, 4096, 8) == (99).to_bytes(8, "little")
    # Write with immediate: the data goes to memory, the immediate to a receive completion.
    a.verbs.post_recv(a.qp, [], wr_id=5)
    b.verbs.post_send(b.qp, WR["RDMA_WRITE_WITH_IMM"], [(b.mr.addr, 14, b.mr.lkey)], remote_addr=a.mr.addr,
                      rkey=a.mr.rkey, imm=77)
    wait_cqes(b.verbs, b.cq, 1)
    (received,) = wait_cqes(a.verbs, a.cq, 1)
    assert (received.opcode, received.imm_data, received.byte_len) == (OP["RECV_RDMA_WITH_IMM"], 77, 14)
    assert read(a, 0, 14) == b"written by vm1"


PORT_DATA = ("tx_bytes", "rx_bytes", "tx_packets", "rx_packets")


def port_data(backend: BackendProcess, vm: str) -> tuple[int, ...]:
    engine = backend.counters(vm)["engine"]
    return tuple(engine[name] for name in PORT_DATA)


def test_port_data_counts_each_transfer_once_in_its_direction(backend: BackendProcess,
                                                               pair: tuple[Side, Side]) -> None:
    # What the guest's PMA PortCounters report (node_exporter's data): bytes that left and came into each VM's
    # memory, and the packets of the QP's path MTU (1024 here) a message would take on a wire.
    a, b = pair
    before = {vm: port_data(backend, vm) for vm in ("vm0", "vm1")}
    a.verbs.post_recv(a.qp, [(a.mr.addr, 4096, a.mr.lkey)], wr_id=7)
    b.verbs.post_send(b.qp, WR["SEND"], [(b.mr.addr, 3000, b.mr.lkey)], wr_id=1)      # vm1 -> vm0, 3 packets
    b.verbs.post_send(b.qp, WR["RDMA_WRITE"], [(b.mr.addr, 14, b.mr.lkey)], remote_addr=a.mr.addr + 8192,
                      rkey=a.mr.rkey, wr_id=2)                                           # vm1 -> vm0, 1 packet
    b.verbs.post_send(b.qp, WR["RDMA_READ"], [(b.mr.addr + 8192, 2500, b.mr.lkey)], remote_addr=a.mr.addr + 16384,
                      rkey=a.mr.rkey, wr_id=3)                                           # vm0 -> vm1, 3 packets
    b.verbs.post_send(b.qp, WR["ATOMIC_FETCH_AND_ADD"], [(b.mr.addr + 64, 8, b.mr.lkey)],
                      remote_addr=a.mr.addr + 4096, rkey=a.mr.rkey, compare_add=1, wr_id=4)  # not data
    assert [c.status for c in wait_cqes(b.verbs, b.cq, 4)] == [WC["SUCCESS"]] * 4
    assert wait_cqes(a.verbs, a.cq, 1)[0].byte_len == 3000
    moved = {vm: tuple(x - y for x, y in zip(port_data(backend, vm), before[vm], strict=True))
             for vm in ("vm0", "vm1")}
    assert moved == {"vm0": (2500, 3014, 3, 4), "vm1": (3014, 2500, 4, 3)}


def checksum(side: Side) -> int:
    return zlib.crc32(read(side, 0, 64 << 10))


@pytest.mark.parametrize("attack", ["wrong rkey", "rkey of another PD", "past the end", "no remote access"])
@pytest.mark.parametrize("opcode", ["RDMA_WRITE", "RDMA_READ"])
def test_remote_access_is_checked_and_the_victim_untouched(backend: BackendProcess, pair: tuple[Side, Side],
                                                            attack: str, opcode: str) -> None:
    victim, attacker = pair
    write(victim, 0, hashlib.sha256(b"vm0").digest() * 2048)
    before = checksum(victim)
    target_key, target_addr, length = victim.mr.rkey, victim.mr.addr, 64
    if attack == "wrong rkey":
        target_key ^= 0x5A5A0000
    elif attack == "rkey of another PD":
        other = victim.verbs.reg_mr(victim.verbs.alloc_pd(), 4096)
        target_key, target_addr = other.rkey, other.addr
    elif attack == "past the end":
        target_addr, length = victim.mr.addr + (64 << 10) - 32, 64
    else:
        readonly = victim.verbs.reg_mr(victim.pd, 4096, access=abi.const("VRDMA_ACCESS_LOCAL_WRITE"))
        target_key, target_addr = readonly.rkey, readonly.addr
    attacker.verbs.post_send(attacker.qp, WR[opcode], [(attacker.mr.addr, length, attacker.mr.lkey)],
                             remote_addr=target_addr, rkey=target_key, wr_id=66)
    (done,) = wait_cqes(attacker.verbs, attacker.cq, 1)
    assert (done.wr_id, done.status) == (66, WC["REM_ACCESS_ERR"])
    assert checksum(victim) == before
    # Both VMs are still served.
    for fe in (victim.verbs.fe, attacker.verbs.fe):
        assert query_device(fe).hdr.status == 0
    assert "Traceback" not in backend.log_text()


def test_error_flushes_what_follows(pair: tuple[Side, Side]) -> None:
    a, b = pair
    b.verbs.post_recv(b.qp, [(b.mr.addr, 64, b.mr.lkey)], wr_id=50)
    b.verbs.post_send(b.qp, WR["RDMA_WRITE"], [(b.mr.addr, 8, b.mr.lkey ^ 0x100000)], remote_addr=a.mr.addr,
                      rkey=a.mr.rkey, wr_id=1, ring=False)  # a bad lkey: local protection error
    b.verbs.post_send(b.qp, WR["SEND"], [(b.mr.addr, 8, b.mr.lkey)], wr_id=2, signaled=False)
    completions = wait_cqes(b.verbs, b.cq, 3)
    by_id = {c.wr_id: c.status for c in completions}
    assert by_id == {1: WC["LOC_PROT_ERR"], 2: WC["WR_FLUSH_ERR"], 50: WC["WR_FLUSH_ERR"]}


def test_receiver_not_ready(backend: BackendProcess) -> None:
    with two_vms(backend, make_side, GID, connect=False) as (a, b):
        a.verbs.connect(a.qp, b.qp.qpn, GID["vm1"])
        b.verbs.connect(b.qp, a.qp.qpn, GID["vm0"], rnr_retry=7)
        # rnr_retry 7: the send waits until the receive is posted.
        b.verbs.post_send(b.qp, WR["SEND"], [(b.mr.addr, 16, b.mr.lkey)], wr_id=1)
        # The engine tried, found no receive, and tried again: the send is waiting, not lost and not failed.
        wait_until("the send to meet no receive twice",
                   lambda: backend.counters("vm1")["engine"]["rnr_waits"] >= 2, timeout=10, interval=0.005)
        assert b.verbs.poll_cq(b.cq) == []
        a.verbs.post_recv(a.qp, [(a.mr.addr, 16, a.mr.lkey)], wr_id=2)
        assert wait_cqes(b.verbs, b.cq, 1)[0].status == WC["SUCCESS"]
        assert wait_cqes(a.verbs, a.cq, 1)[0].wr_id == 2
        assert backend.counters("vm1")["engine"]["rnr_waits"] >= 1


def test_rnr_retry_exhausted(backend: BackendProcess) -> None:
    with two_vms(backend, make_side, GID, connect=False) as (a, b):
        a.verbs.connect(a.qp, b.qp.qpn, GID["vm1"])
        b.verbs.connect(b.qp, a.qp.qpn, GID["vm0"], rnr_retry=2)
        b.verbs.post_send(b.qp, WR["SEND"], [(b.mr.addr, 16, b.mr.lkey)], wr_id=1)
        assert wait_cqes(b.verbs, b.cq, 1)[0].status == WC["RNR_RETRY_EXC_ERR"]


def test_unknown_destination_retries_in_vain(backend: BackendProcess) -> None:
    with backend.frontend("vm1") as fe1:
        b = make_side(fe1, backend, "vm1")
        b.verbs.connect(b.qp, 0x4242, bytes(16))  # nobody holds that GID
        b.verbs.post_send(b.qp, WR["SEND"], [(b.mr.addr, 16, b.mr.lkey)], wr_id=1)
        assert wait_cqes(b.verbs, b.cq, 1)[0].status == WC["RETRY_EXC_ERR"]


def test_cq_overflow_is_an_error_never_an_overwrite(backend: BackendProcess, pair: tuple[Side, Side]) -> None:
    a, b = pair
    small = b.verbs.create_cq(4)
    qp = b.verbs.create_qp(b.pd, small, small)
    b.verbs.connect(qp, a.qp.qpn, GID["vm0"])
    for i in range(6):
        b.verbs.post_send(qp, WR["RDMA_WRITE"], [(b.mr.addr, 8, b.mr.lkey)], remote_addr=a.mr.addr,
                          rkey=a.mr.rkey, wr_id=i, ring=False)
    b.verbs.ring_send(qp)
    deadline = time.monotonic() + 10
    while not b.verbs.cq_overflowed(small):
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert [c.wr_id for c in b.verbs.poll_cq(small)] == [0, 1, 2, 3]  # the first four, intact
    assert backend.counters("vm1")["engine"]["cq_overflows"] == 1


def test_garbage_producer_index_fails_only_that_qp(backend: BackendProcess, pair: tuple[Side, Side]) -> None:
    a, b = pair
    b.verbs.ring(b.qp.sq.db, 0x7FFF0000)  # far more WQEs than the ring holds
    if b.verbs.parked(b.qp.sq.db):
        b.verbs.fe.wake()  # as a poster does when it finds the engine parked
    deadline = time.monotonic() + 10
    while backend.counters("vm1")["engine"]["qp_fatal"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    # Only that QP failed: a new pair of QPs between the same two VMs carries a WRITE, byte for byte (the target
    # holds a sentinel first, so bytes that were never written cannot pass).
    b.verbs.memory.write(b.mr.addr, b"\xa5" * 8)
    a.verbs.memory.write(a.mr.addr, b"fresh qp")
    b_qp = b.verbs.create_qp(b.pd, b.cq, b.cq)
    qp2 = a.verbs.create_qp(a.pd, a.cq, a.cq)
    a.verbs.connect(qp2, b_qp.qpn, GID["vm1"])
    b.verbs.connect(b_qp, qp2.qpn, GID["vm0"])
    a.verbs.post_send(qp2, WR["RDMA_WRITE"], [(a.mr.addr, 8, a.mr.lkey)], remote_addr=b.mr.addr, rkey=b.mr.rkey)
    assert wait_cqes(a.verbs, a.cq, 1)[0].status == WC["SUCCESS"]
    assert b.verbs.memory.read(b.mr.addr, 8) == b"fresh qp"
    # A QP that still names the failed one is answered by nobody: its retries run out.
    qp3 = a.verbs.create_qp(a.pd, a.cq, a.cq)
    a.verbs.connect(qp3, b.qp.qpn, GID["vm1"])
    a.verbs.post_send(qp3, WR["RDMA_WRITE"], [(a.mr.addr, 8, a.mr.lkey)], remote_addr=b.mr.addr, rkey=b.mr.rkey)
    assert wait_cqes(a.verbs, a.cq, 1)[0].status == WC["RETRY_EXC_ERR"]
    assert query_device(b.verbs.fe).hdr.status == 0


def test_objects_in_use_cannot_go_and_everything_goes_in_order(backend: BackendProcess) -> None:
    with backend.frontend("vm0") as fe:
        side = make_side(fe, backend, "vm0")
        v = side.verbs
        busy = abi.const("VRDMA_STATUS_BUSY")
        with pytest.raises(CommandError) as err:
            v.call("VRDMA_CMD_DESTROY_CQ", "vrdma_cmd_destroy", "vrdma_resp_hdr", handle=side.cq.handle)
        assert err.value.status == busy
        with pytest.raises(CommandError) as err:
            v.call("VRDMA_CMD_DEALLOC_PD", "vrdma_cmd_destroy", "vrdma_resp_hdr", handle=side.pd)
        assert err.value.status == busy
        for opcode, handle in (("DESTROY_QP", side.qp.handle), ("DESTROY_CQ", side.cq.handle),
                               ("DEREG_MR", side.mr.handle), ("DEALLOC_PD", side.pd),
                               ("DEALLOC_UCONTEXT", v.ucontext)):
            v.call(f"VRDMA_CMD_{opcode}", "vrdma_cmd_destroy", "vrdma_resp_hdr", handle=handle)
        objects = backend.counters("vm0")["objects"]
        assert {k: n for k, n in objects.items() if k != "gid"} == dict.fromkeys(
            ("ucontext", "pd", "mr", "cq", "xrcd", "srq", "qp", "ah"), 0)


@pytest.mark.parametrize(("what", "status"), [
    ("page outside guest RAM", "VRDMA_STATUS_INVALID"),
    ("page list outside guest RAM", "VRDMA_STATUS_INVALID"),
    ("wrong page count", "VRDMA_STATUS_INVALID"),
    ("remote write without local write", "VRDMA_STATUS_INVALID"),
    ("three levels", "VRDMA_STATUS_INVALID"),
    ("unknown PD", "VRDMA_STATUS_INVALID"),
])
def test_bad_memory_registrations_are_refused(backend: BackendProcess, what: str, status: str) -> None:
    with backend.frontend("vm0") as fe:
        side = make_side(fe, backend, "vm0")
        v = side.verbs
        buf = v.alloc(8192)
        pages = v.page_list(buf)
        fields: dict[str, Any] = {"pd": side.pd, "access": 0xF, "iova": buf.gpa, "length": 8192,
                                  "page_offset": 0, "pages": pages}
        if what == "page outside guest RAM":
            fields["pages"] = v.page_list(buf, first_page=fe.memory.size - 4096)
        elif what == "page list outside guest RAM":
            fields["pages"] = {**pages, "addr": 1 << 40}
        elif what == "wrong page count":
            fields["pages"] = {**pages, "npages": 3}
        elif what == "remote write without local write":
            fields["access"] = abi.const("VRDMA_ACCESS_REMOTE_WRITE")
        elif what == "three levels":
            fields["pages"] = {**pages, "levels": 3}
        else:
            fields["pd"] = 0x1234
        with pytest.raises(CommandError) as err:
            v.call("VRDMA_CMD_REG_MR", "vrdma_cmd_reg_mr", "vrdma_resp_reg_mr", **fields)
        assert err.value.status == abi.const(status)
        assert query_device(fe).hdr.status == 0


def test_srq_feeds_several_qps_and_signals_its_limit(backend: BackendProcess) -> None:
    with two_vms(backend, make_side, GID, connect=False) as (a, b):
        a.verbs.post_event_buffers()
        a.verbs.wait_events()  # PORT_ACTIVE, sent when the event queue starts
        srq = a.verbs.create_srq(a.pd, depth=16, limit=3)
        receivers = [a.verbs.create_qp(a.pd, a.cq, a.cq, srq=srq) for _ in range(2)]
        senders = [b.verbs.create_qp(b.pd, b.cq, b.cq) for _ in range(2)]
        for rq, sq in zip(receivers, senders, strict=True):
            a.verbs.connect(rq, sq.qpn, GID["vm1"])
            b.verbs.connect(sq, rq.qpn, GID["vm0"])
        for i in range(5):
            a.verbs.post_srq_recv(srq, [(a.mr.addr + 1024 * i, 1024, a.mr.lkey)], wr_id=100 + i)
        write(b, 0, b"through the SRQ")
        for sq in senders:  # two sends, through two QPs, into the one SRQ: 3 receives left, not below the limit
            b.verbs.post_send(sq, WR["SEND"], [(b.mr.addr, 15, b.mr.lkey)])
        received = wait_cqes(a.verbs, a.cq, 2)
        assert sorted(c.wr_id for c in received) == [100, 101]
        assert {c.qp_num for c in received} == {q.qpn for q in receivers}
        assert read(a, 0, 15) == read(a, 1024, 15) == b"through the SRQ"
        b.verbs.post_send(senders[0], WR["SEND"], [(b.mr.addr, 15, b.mr.lkey)])  # 2 left: below 3
        wait_cqes(a.verbs, a.cq, 1)
        (event,) = a.verbs.wait_events()
        assert (event.type, event.handle) == (abi.const("VRDMA_EVENT_SRQ_LIMIT"), srq.handle)
        limit = a.verbs.call("VRDMA_CMD_QUERY_SRQ", "vrdma_cmd_destroy", "vrdma_resp_query_srq", handle=srq.handle)
        assert (limit.max_wr, limit.srq_limit) == (16, 0)  # the limit disarmed itself


def test_sixteen_sges_each_way(pair: tuple[Side, Side]) -> None:
    a, b = pair
    qa = a.verbs.create_qp(a.pd, a.cq, a.cq, max_sge=16)
    qb = b.verbs.create_qp(b.pd, b.cq, b.cq, max_sge=16)
    a.verbs.connect(qa, qb.qpn, GID["vm1"])
    b.verbs.connect(qb, qa.qpn, GID["vm0"])
    a.verbs.post_recv(qa, [(a.mr.addr + 4096 * i, 100, a.mr.lkey) for i in range(16)], wr_id=1)
    pieces = [bytes([i]) * 100 for i in range(16)]
    for i, piece in enumerate(pieces):
        write(b, 2048 * i, piece)
    b.verbs.post_send(qb, WR["SEND"], [(b.mr.addr + 2048 * i, 100, b.mr.lkey) for i in range(16)])
    assert wait_cqes(b.verbs, b.cq, 1)[0].status == WC["SUCCESS"]
    assert wait_cqes(a.verbs, a.cq, 1)[0].byte_len == 1600
    assert [read(a, 4096 * i, 100) for i in range(16)] == pieces


def test_armed_cq_raises_one_completion_event(pair: tuple[Side, Side]) -> None:
    a, b = pair
    a.verbs.post_event_buffers()
    a.verbs.wait_events()  # PORT_ACTIVE
    a.verbs.arm_cq(a.cq)
    a.verbs.post_recv(a.qp, [(a.mr.addr, 64, a.mr.lkey)], wr_id=1)
    a.verbs.post_recv(a.qp, [(a.mr.addr, 64, a.mr.lkey)], wr_id=2)
    for _ in range(2):
        b.verbs.post_send(b.qp, WR["SEND"], [(b.mr.addr, 8, b.mr.lkey)])
    wait_cqes(a.verbs, a.cq, 2)
    (event,) = a.verbs.wait_events()  # one event for two completions: the arm is used up by the first
    assert (event.type, event.handle) == (abi.const("VRDMA_EVENT_CQ_COMP"), a.cq.handle)


def test_cq_moderation_by_count_and_by_period(pair: tuple[Side, Side]) -> None:
    a, b = pair
    a.verbs.post_event_buffers()
    a.verbs.wait_events()  # PORT_ACTIVE
    comp = (abi.const("VRDMA_EVENT_CQ_COMP"), a.cq.handle)

    def moderate(count: int, period_us: int) -> None:
        a.verbs.call("VRDMA_CMD_MODIFY_CQ", "vrdma_cmd_modify_cq", "vrdma_resp_hdr", handle=a.cq.handle,
                     cq_count=count, cq_period=period_us)

    def exchange(n: int) -> None:
        for _ in range(n):
            a.verbs.post_recv(a.qp, [(a.mr.addr, 64, a.mr.lkey)])
            b.verbs.post_send(b.qp, WR["SEND"], [(b.mr.addr, 8, b.mr.lkey)])
        wait_cqes(b.verbs, b.cq, n)
        wait_cqes(a.verbs, a.cq, n)

    moderate(3, 0)
    a.verbs.arm_cq(a.cq)
    exchange(2)  # two of three: held back
    with pytest.raises(FrontendError):
        a.verbs.wait_events(timeout=0.3)
    exchange(1)
    assert [(e.type, e.handle) for e in a.verbs.wait_events()] == [comp]
    moderate(100, 50_000)  # or 50 ms after the first
    a.verbs.arm_cq(a.cq)
    start = time.monotonic()
    exchange(1)
    assert [(e.type, e.handle) for e in a.verbs.wait_events()] == [comp]
    assert time.monotonic() - start >= 0.05
