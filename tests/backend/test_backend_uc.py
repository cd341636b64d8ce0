"""UC queue pairs through the data engine, between two simulated VMs on one backend (and a bystander).

UC is RC without acknowledgements: SEND and RDMA WRITE (with immediate) between two connected QPs, no READ or
atomics, and nothing the responder cannot take is ever reported to the requester: a message with no receive
posted, a bad rkey, a receive too small or a destination not ready is lost (counted in `uc_dropped`), the sender's
completion is a success, and both QPs carry on. What is wrong at the sender (its own keys, an opcode UC has not)
is the sender's error as on RC.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from backend_process import GID, BackendProcess, SimSide, pattern, start_side, two_vms, wait_cqes

from vrdma.device import abi
from vrdma.testing.frontend import Frontend
from vrdma.testing.simulated_guest import CommandError

pytestmark = pytest.mark.backend

WR = {name: abi.const(f"VRDMA_WR_{name}") for name in ("SEND", "SEND_WITH_IMM", "RDMA_WRITE", "RDMA_WRITE_WITH_IMM",
                                                         "RDMA_READ", "ATOMIC_FETCH_AND_ADD")}
WC = {name: abi.const(f"VRDMA_WC_{name}") for name in ("SUCCESS", "LOC_LEN_ERR", "LOC_PROT_ERR", "LOC_QP_OP_ERR",
                                                         "WR_FLUSH_ERR")}
OP = {name: abi.const(f"VRDMA_WC_OP_{name}") for name in ("RECV", "RECV_RDMA_WITH_IMM")}
RTS = abi.const("VRDMA_QPS_RTS")
ERR = abi.const("VRDMA_QPS_ERR")


def make_side(fe: Frontend, backend: BackendProcess, name: str) -> SimSide:
    return start_side(fe, backend, name, GID[name], 64 << 10, qp_type="UC")


def connect(a: SimSide, b: SimSide, a_name: str = "vm0", b_name: str = "vm1") -> None:
    a.verbs.connect(a.qp, b.qp.qpn, GID[b_name], uc=True)
    b.verbs.connect(b.qp, a.qp.qpn, GID[a_name], uc=True)


@pytest.fixture
def pair(backend: BackendProcess) -> Iterator[tuple[SimSide, SimSide]]:
    with two_vms(backend, make_side, GID, connect=False) as (a, b):
        connect(a, b)
        yield a, b


def dropped(backend: BackendProcess, vm: str) -> int:
    return int(backend.counters(vm)["engine"]["uc_dropped"])


def state(side: SimSide) -> int:
    return int(side.verbs.query_qp(side.qp).qp_state)


def send(side: SimSide, opcode: int, payload: bytes, wr_id: int = 9, **kw: Any) -> Any:
    side.verbs.memory.write(side.mr.addr, payload)
    side.verbs.post_send(side.qp, opcode, [(side.mr.addr, len(payload), side.mr.lkey)], wr_id=wr_id, **kw)
    (sent,) = wait_cqes(side.verbs, side.cq, 1)
    return sent


def test_send_write_and_their_immediates_land_as_on_rc(pair: tuple[SimSide, SimSide]) -> None:
    a, b = pair
    data = pattern(5000)
    b.verbs.post_recv(b.qp, [(b.mr.addr + 8192, 8192, b.mr.lkey)], wr_id=1)
    assert send(a, WR["SEND_WITH_IMM"], data, imm=0x1234).status == WC["SUCCESS"]
    (received,) = wait_cqes(b.verbs, b.cq, 1)
    assert (received.wr_id, received.status, received.opcode, received.byte_len, received.imm_data) == \
        (1, WC["SUCCESS"], OP["RECV"], 5000, 0x1234)
    assert b.verbs.memory.read(b.mr.addr + 8192, 5000) == data
    sent = send(a, WR["RDMA_WRITE"], data[::-1], remote_addr=b.mr.addr + 32768, rkey=b.mr.rkey)
    assert (sent.status, sent.byte_len) == (WC["SUCCESS"], 5000)
    assert b.verbs.memory.read(b.mr.addr + 32768, 5000) == data[::-1]
    b.verbs.post_recv(b.qp, [], wr_id=2)
    send(a, WR["RDMA_WRITE_WITH_IMM"], b"with imm", remote_addr=b.mr.addr + 100, rkey=b.mr.rkey, imm=7)
    (written,) = wait_cqes(b.verbs, b.cq, 1)
    assert (written.wr_id, written.opcode, written.imm_data, written.byte_len) == (2, OP["RECV_RDMA_WITH_IMM"], 7, 8)
    assert b.verbs.memory.read(b.mr.addr + 100, 8) == b"with imm"


def test_what_the_responder_cannot_take_is_lost_and_both_qps_carry_on(
        pair: tuple[SimSide, SimSide], backend: BackendProcess) -> None:
    """No receive posted (no RNR wait on UC), a bad rkey, a receive too small: each message is lost, the sender
    succeeds at once, nothing is written, and the next good message goes through on the same QPs."""
    a, b = pair
    before = dropped(backend, "vm0"), dropped(backend, "vm1")
    guard = pattern(4096)
    b.verbs.memory.write(b.mr.addr, guard)
    assert send(a, WR["SEND"], b"nobody listens").status == WC["SUCCESS"]
    assert send(a, WR["RDMA_WRITE"], b"bad rkey", remote_addr=b.mr.addr, rkey=b.mr.rkey ^ 0x100).status == \
        WC["SUCCESS"]
    assert send(a, WR["RDMA_WRITE"], b"past the end", remote_addr=b.mr.addr + (64 << 10) - 4,
                rkey=b.mr.rkey).status == WC["SUCCESS"]
    b.verbs.post_recv(b.qp, [(b.mr.addr, 4, b.mr.lkey)], wr_id=3)
    assert send(a, WR["SEND"], b"too long for four bytes").status == WC["SUCCESS"]
    (short,) = wait_cqes(b.verbs, b.cq, 1)  # the receive it consumed completes with the error
    assert (short.wr_id, short.status) == (3, WC["LOC_LEN_ERR"])
    assert b.verbs.memory.read(b.mr.addr, 4096) == guard
    assert (dropped(backend, "vm0") - before[0], dropped(backend, "vm1") - before[1]) == (4, 4)
    assert state(a) == state(b) == RTS
    b.verbs.post_recv(b.qp, [(b.mr.addr + 8192, 64, b.mr.lkey)], wr_id=4)
    send(a, WR["SEND"], b"still connected")
    (received,) = wait_cqes(b.verbs, b.cq, 1)
    assert (received.wr_id, received.status, received.byte_len) == (4, WC["SUCCESS"], 15)


def test_a_destination_not_ready_loses_the_message_without_retries(backend: BackendProcess) -> None:
    """RC would wait and retry (retry_cnt) for a peer still on its way to RTR; UC sends into the void at once."""
    with two_vms(backend, make_side, GID, connect=False) as (a, b):
        a.verbs.connect(a.qp, b.qp.qpn, GID["vm1"], uc=True)  # b stays in RESET
        before = dropped(backend, "vm0")
        assert send(a, WR["SEND"], b"into the void").status == WC["SUCCESS"]
        assert dropped(backend, "vm0") == before + 1 and state(a) == RTS


def test_reads_and_atomics_are_the_senders_error(pair: tuple[SimSide, SimSide]) -> None:
    a, b = pair
    guard = pattern(64)
    b.verbs.memory.write(b.mr.addr, guard)
    failed = send(a, WR["RDMA_READ"], bytes(8), remote_addr=b.mr.addr, rkey=b.mr.rkey)
    assert failed.status == WC["LOC_QP_OP_ERR"] and state(a) == ERR
    assert b.verbs.memory.read(b.mr.addr, 64) == guard and state(b) == RTS


def test_a_uc_qp_and_an_rc_qp_do_not_talk(backend: BackendProcess) -> None:
    """Each transport drops the other's packets: a UC sender aimed at an RC QP loses its message, and the RC QP
    sees nothing."""
    with two_vms(backend, make_side, GID, connect=False) as (a, b):
        rc = b.verbs.create_qp(b.pd, b.cq, b.cq)
        b.verbs.connect(rc, a.qp.qpn, GID["vm0"])
        a.verbs.connect(a.qp, rc.qpn, GID["vm1"], uc=True)
        b.verbs.post_recv(rc, [(b.mr.addr, 64, b.mr.lkey)], wr_id=1)
        before = dropped(backend, "vm0")
        assert send(a, WR["SEND"], b"wrong transport").status == WC["SUCCESS"]
        assert dropped(backend, "vm0") == before + 1 and b.verbs.poll_cq(b.cq) == []


def test_uc_modify_refuses_the_attributes_of_acknowledgements(backend: BackendProcess) -> None:
    with two_vms(backend, make_side, GID, connect=False) as (a, _b), pytest.raises(CommandError):
        a.verbs.connect(a.qp, 0x40, GID["vm1"])  # RC's RTR and RTS masks: timeout, retries, rd_atomic


def test_lost_messages_touch_no_bystander(tmp_path: Path) -> None:
    """vm0 sends vm1 everything a UC responder drops (no receive, bad rkeys, ranges past the MR, a receive too
    small, writes aimed at vm2's rkey) while vm2, on the same backend and connected to vm1 too, sees nothing: no
    completion, its memory and counters as they were; and vm1's QP with vm2 still works."""
    backend = BackendProcess(tmp_path, names=("vm0", "vm1", "vm2"))
    with backend.frontend("vm0") as fe0, backend.frontend("vm1") as fe1, backend.frontend("vm2") as fe2:
        a, b, c = make_side(fe0, backend, "vm0"), make_side(fe1, backend, "vm1"), make_side(fe2, backend, "vm2")
        connect(a, b)
        b_to_c = b.verbs.create_qp(b.pd, b.cq, b.cq, qp_type="UC")
        b.verbs.connect(b_to_c, c.qp.qpn, GID["vm2"], uc=True)
        c.verbs.connect(c.qp, b_to_c.qpn, GID["vm1"], uc=True)
        c.verbs.memory.write(c.mr.addr, pattern(64 << 10))
        bystander = backend.counters("vm2")
        for i in range(32):
            send(a, WR["SEND"], b"no receive", wr_id=i)
        for rkey, addr in ((b.mr.rkey ^ 0x100, b.mr.addr), (c.mr.rkey, c.mr.addr), (c.mr.rkey, b.mr.addr),
                           (b.mr.rkey, b.mr.addr + (64 << 10)), (b.mr.rkey, b.mr.addr - 8)):
            assert send(a, WR["RDMA_WRITE"], b"forged", remote_addr=addr, rkey=rkey).status == WC["SUCCESS"]
        assert c.verbs.poll_cq(c.cq) == [] and c.verbs.memory.read(c.mr.addr, 64 << 10) == pattern(64 << 10)
        after = backend.counters("vm2")
        assert after["engine"] == bystander["engine"] and after["objects"] == bystander["objects"]
        # vm1 serves vm2 as before.
        c.verbs.post_recv(c.qp, [(c.mr.addr, 64, c.mr.lkey)], wr_id=5)
        b.verbs.memory.write(b.mr.addr, b"to the bystander")
        b.verbs.post_send(b_to_c, WR["SEND"], [(b.mr.addr, 16, b.mr.lkey)], wr_id=6)
        (got,) = wait_cqes(c.verbs, c.cq, 1)
        assert (got.wr_id, got.status, c.verbs.memory.read(c.mr.addr, 16)) == (5, WC["SUCCESS"], b"to the bystander")
    assert backend.stop() == 0, backend.log_text()
