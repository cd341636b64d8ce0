"""XRC through the data engine, between two simulated VMs on one backend (and a bystander).

vm0 sends from an XRC initiator QP (a send queue and nothing else); vm1 receives through an XRC target QP (the
kernel's: an XRC domain and a QP number, no rings) into the XRC SRQs of that domain, which belong to its user
contexts. Every message names an SRQ by its number: the receive comes from that SRQ, completes on that SRQ's CQ,
and the rkeys the target honours are of that SRQ's PD. An SRQ number that is not of the target's domain is an
invalid request: both QPs go to the error state and nothing lands anywhere.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from backend_process import GID, BackendProcess, SimSide, pattern, start_side, wait_cqes

from vrdma.device import abi
from vrdma.testing.frontend import Frontend
from vrdma.testing.simulated_guest import CommandError, SimCq, SimMr, SimQp, SimSrq, SimVerbs

pytestmark = pytest.mark.backend

WR = {name: abi.const(f"VRDMA_WR_{name}") for name in ("SEND", "SEND_WITH_IMM", "RDMA_WRITE", "RDMA_READ",
                                                         "ATOMIC_FETCH_AND_ADD")}
WC = {name: abi.const(f"VRDMA_WC_{name}") for name in ("SUCCESS", "REM_ACCESS_ERR", "REM_INV_REQ_ERR",
                                                         "RETRY_EXC_ERR", "WR_FLUSH_ERR")}
RTS = abi.const("VRDMA_QPS_RTS")
ERR = abi.const("VRDMA_QPS_ERR")
BUSY = abi.const("VRDMA_STATUS_BUSY")
INVALID = abi.const("VRDMA_STATUS_INVALID")


@dataclass
class Target:
    """vm1: an XRC domain, the kernel's target QP in it, and a user context with an XRC SRQ (its CQ, PD, MR)."""

    kernel: SimVerbs
    verbs: SimVerbs
    xrcd: int
    tgt: SimQp
    pd: int
    cq: SimCq
    srq: SimSrq
    mr: SimMr


def initiator(fe: Frontend, backend: BackendProcess, name: str) -> SimSide:
    """A user context with an XRC initiator QP, its send CQ and an MR."""
    return start_side(fe, backend, name, GID[name], 64 << 10, qp_type="XRC_INI")


def target(fe: Frontend, backend: BackendProcess, name: str) -> Target:
    fe.start()
    kernel = SimVerbs(fe, backend.directory / f"{name}.doorbell", kernel=True)
    kernel.add_gid(0, GID[name])
    verbs = SimVerbs(fe, backend.directory / f"{name}.doorbell")
    xrcd = verbs.alloc_xrcd()
    pd = verbs.alloc_pd()
    cq = verbs.create_cq(64)
    srq = verbs.create_srq(pd, depth=32, xrcd=xrcd, cq=cq)
    return Target(kernel, verbs, xrcd, kernel.create_xrc_target(xrcd), pd, cq, srq, verbs.reg_mr(pd, 64 << 10))


def connect(a: SimSide, b: Target, b_name: str = "vm1", timeout: int = 14, retry_cnt: int = 7) -> None:
    a.verbs.connect(a.qp, b.tgt.qpn, GID[b_name], xrc="INI", timeout=timeout, retry_cnt=retry_cnt)
    b.kernel.connect(b.tgt, a.qp.qpn, GID["vm0"], xrc="TGT")


@pytest.fixture
def pair(backend: BackendProcess) -> Iterator[tuple[SimSide, Target]]:
    with backend.frontend("vm0") as fe0, backend.frontend("vm1") as fe1:
        a, b = initiator(fe0, backend, "vm0"), target(fe1, backend, "vm1")
        connect(a, b)
        yield a, b


def send(a: SimSide, opcode: int, payload: bytes, srqn: int, wr_id: int = 9, **kw: Any) -> Any:
    a.verbs.memory.write(a.mr.addr, payload)
    a.verbs.post_send(a.qp, opcode, [(a.mr.addr, len(payload), a.mr.lkey)], wr_id=wr_id, xrc_srqn=srqn, **kw)
    (sent,) = wait_cqes(a.verbs, a.cq, 1)
    return sent


def state(verbs: SimVerbs, qp: SimQp) -> int:
    return int(verbs.query_qp(qp).qp_state)


def test_a_send_lands_in_the_srq_it_names_and_completes_on_that_srqs_cq(pair: tuple[SimSide, Target]) -> None:
    a, b = pair
    data = pattern(6000)
    b.verbs.post_srq_recv(b.srq, [(b.mr.addr, 8192, b.mr.lkey)], wr_id=1)
    assert send(a, WR["SEND_WITH_IMM"], data, b.srq.srqn, imm=0x4321).status == WC["SUCCESS"]
    (received,) = wait_cqes(b.verbs, b.cq, 1)
    assert (received.wr_id, received.status, received.byte_len, received.imm_data) == (1, WC["SUCCESS"], 6000, 0x4321)
    assert (received.qp_num, received.src_qp) == (b.tgt.qpn, a.qp.qpn)  # the target QP, from the initiator
    assert b.verbs.memory.read(b.mr.addr, 6000) == data


def test_rdma_and_atomics_use_the_named_srqs_pd(pair: tuple[SimSide, Target]) -> None:
    """The target has no PD: an rkey is good if its MR is in the PD of the SRQ the request names."""
    a, b = pair
    data = pattern(3000)
    assert send(a, WR["RDMA_WRITE"], data, b.srq.srqn, remote_addr=b.mr.addr + 100, rkey=b.mr.rkey).status == \
        WC["SUCCESS"]
    assert b.verbs.memory.read(b.mr.addr + 100, 3000) == data
    a.verbs.post_send(a.qp, WR["RDMA_READ"], [(a.mr.addr + 8192, 3000, a.mr.lkey)], remote_addr=b.mr.addr + 100,
                      rkey=b.mr.rkey, xrc_srqn=b.srq.srqn)
    assert wait_cqes(a.verbs, a.cq, 1)[0].status == WC["SUCCESS"]
    assert a.verbs.memory.read(a.mr.addr + 8192, 3000) == data
    b.verbs.memory.write(b.mr.addr + 4096, (40).to_bytes(8, "little"))
    a.verbs.post_send(a.qp, WR["ATOMIC_FETCH_AND_ADD"], [(a.mr.addr, 8, a.mr.lkey)], remote_addr=b.mr.addr + 4096,
                      rkey=b.mr.rkey, compare_add=2, xrc_srqn=b.srq.srqn)
    assert wait_cqes(a.verbs, a.cq, 1)[0].status == WC["SUCCESS"]
    assert b.verbs.memory.read(b.mr.addr + 4096, 8) == (42).to_bytes(8, "little")
    assert a.verbs.memory.read(a.mr.addr, 8) == (40).to_bytes(8, "little")
    # An MR of another PD of the same context: a remote access error, both QPs in error, nothing written.
    other = b.verbs.reg_mr(b.verbs.alloc_pd(), 4096)
    b.verbs.memory.write(other.addr, pattern(4096))
    failed = send(a, WR["RDMA_WRITE"], b"wrong PD", b.srq.srqn, remote_addr=other.addr, rkey=other.rkey)
    assert failed.status == WC["REM_ACCESS_ERR"]
    assert b.verbs.memory.read(other.addr, 4096) == pattern(4096)
    assert state(a.verbs, a.qp) == state(b.kernel, b.tgt) == ERR


def test_an_empty_srq_is_receiver_not_ready_until_a_receive_is_posted(pair: tuple[SimSide, Target]) -> None:
    a, b = pair
    a.verbs.memory.write(a.mr.addr, b"waits for a receive")
    a.verbs.post_send(a.qp, WR["SEND"], [(a.mr.addr, 19, a.mr.lkey)], wr_id=3, xrc_srqn=b.srq.srqn)
    assert a.verbs.poll_cq(a.cq) == []
    b.verbs.post_srq_recv(b.srq, [(b.mr.addr, 64, b.mr.lkey)], wr_id=4)
    assert wait_cqes(a.verbs, a.cq, 1)[0].status == WC["SUCCESS"]
    assert wait_cqes(b.verbs, b.cq, 1)[0].wr_id == 4
    assert b.verbs.memory.read(b.mr.addr, 19) == b"waits for a receive"


def test_processes_sharing_a_domain_each_get_what_names_their_srq(pair: tuple[SimSide, Target],
                                                                  backend: BackendProcess) -> None:
    """A second user context of vm1 with an XRC SRQ in the same domain: one target QP serves both, each message
    goes to the SRQ (and CQ, and memory) of the context it names."""
    a, b = pair
    other = SimVerbs(b.verbs.fe, backend.directory / "vm1.doorbell")
    pd, cq = other.alloc_pd(), other.create_cq(16)
    srq, mr = other.create_srq(pd, depth=16, xrcd=b.xrcd, cq=cq), other.reg_mr(pd, 4096)
    assert srq.srqn != b.srq.srqn
    other.post_srq_recv(srq, [(mr.addr, 64, mr.lkey)], wr_id=20)
    b.verbs.post_srq_recv(b.srq, [(b.mr.addr, 64, b.mr.lkey)], wr_id=10)
    send(a, WR["SEND"], b"to the second process", srq.srqn)
    send(a, WR["SEND"], b"to the first process", b.srq.srqn)
    assert [c.wr_id for c in wait_cqes(other, cq, 1)] == [20]
    assert [c.wr_id for c in wait_cqes(b.verbs, b.cq, 1)] == [10]
    assert other.memory.read(mr.addr, 21) == b"to the second process"
    assert b.verbs.memory.read(b.mr.addr, 20) == b"to the first process"


@pytest.mark.parametrize("case", ["SRQ of another domain", "no such SRQ number", "a basic SRQ's slot"])
def test_an_srq_number_outside_the_targets_domain_is_an_invalid_request(
        pair: tuple[SimSide, Target], case: str) -> None:
    a, b = pair
    if case == "SRQ of another domain":
        foreign = b.verbs.create_srq(b.pd, depth=16, xrcd=b.verbs.alloc_xrcd(), cq=b.cq)
        srqn = foreign.srqn
        b.verbs.post_srq_recv(foreign, [(b.mr.addr, 64, b.mr.lkey)], wr_id=7)
    elif case == "no such SRQ number":
        srqn = b.srq.srqn ^ 0x800  # the same slot, another generation
    else:
        basic = b.verbs.create_srq(b.pd, depth=16)
        b.verbs.post_srq_recv(basic, [(b.mr.addr, 64, b.mr.lkey)], wr_id=8)
        srqn = basic.handle & 0xFFFF  # its slot: a basic SRQ has no number and takes no XRC message
    b.verbs.memory.write(b.mr.addr, pattern(4096))
    failed = send(a, WR["SEND"], b"nowhere to go", srqn)
    assert failed.status == WC["REM_INV_REQ_ERR"]
    assert b.verbs.poll_cq(b.cq) == [] and b.verbs.memory.read(b.mr.addr, 4096) == pattern(4096)
    assert state(a.verbs, a.qp) == state(b.kernel, b.tgt) == ERR


def test_an_initiator_and_an_rc_qp_do_not_talk(backend: BackendProcess) -> None:
    """An XRC initiator aimed at an RC QP finds no XRC target there: it retries in vain; the RC QP sees nothing."""
    with backend.frontend("vm0") as fe0, backend.frontend("vm1") as fe1:
        a, b = initiator(fe0, backend, "vm0"), target(fe1, backend, "vm1")
        rc = b.verbs.create_qp(b.pd, b.cq, b.cq)
        b.verbs.connect(rc, a.qp.qpn, GID["vm0"])
        b.verbs.post_recv(rc, [(b.mr.addr, 64, b.mr.lkey)], wr_id=1)
        a.verbs.connect(a.qp, rc.qpn, GID["vm1"], xrc="INI", timeout=1, retry_cnt=1)
        assert send(a, WR["SEND"], b"wrong transport", b.srq.srqn).status == WC["RETRY_EXC_ERR"]
        assert b.verbs.poll_cq(b.cq) == [] and state(b.verbs, rc) == RTS


def test_domains_and_cqs_stay_while_their_srqs_and_targets_do(pair: tuple[SimSide, Target]) -> None:
    _a, b = pair

    def refused(opcode: str, handle: int) -> int:
        with pytest.raises(CommandError) as err:
            b.verbs.call(opcode, "vrdma_cmd_destroy", "vrdma_resp_hdr", handle=handle)
        return err.value.status

    assert refused("VRDMA_CMD_DEALLOC_XRCD", b.xrcd) == BUSY       # its SRQ and its target QP
    assert refused("VRDMA_CMD_DESTROY_CQ", b.cq.handle) == BUSY    # the XRC SRQ completes on it
    b.verbs.call("VRDMA_CMD_DESTROY_SRQ", "vrdma_cmd_destroy", "vrdma_resp_hdr", handle=b.srq.handle)
    b.verbs.call("VRDMA_CMD_DESTROY_CQ", "vrdma_cmd_destroy", "vrdma_resp_hdr", handle=b.cq.handle)
    assert refused("VRDMA_CMD_DEALLOC_XRCD", b.xrcd) == BUSY       # the target QP still
    b.kernel.call("VRDMA_CMD_DESTROY_QP", "vrdma_cmd_destroy", "vrdma_resp_hdr", handle=b.tgt.handle)
    b.verbs.call("VRDMA_CMD_DEALLOC_XRCD", "vrdma_cmd_destroy", "vrdma_resp_hdr", handle=b.xrcd)


def test_xrc_objects_are_checked_at_creation(pair: tuple[SimSide, Target], backend: BackendProcess) -> None:
    _a, b = pair
    other = SimVerbs(b.verbs.fe, backend.directory / "vm1.doorbell")
    cases = {
        "an XRC SRQ on another context's CQ": lambda: other.create_srq(other.alloc_pd(), xrcd=b.xrcd, cq=b.cq),
        "an XRC SRQ of no domain": lambda: b.verbs.create_srq(b.pd, xrcd=0x7777, cq=b.cq),
        "a basic SRQ with a CQ": lambda: b.verbs.create_srq(b.pd, cq=b.cq),
        "an RC QP on an XRC SRQ": lambda: b.verbs.create_qp(b.pd, b.cq, b.cq, srq=b.srq),
        "a target of no domain": lambda: b.kernel.create_xrc_target(0x7777),
        "a target of a user context": lambda: b.verbs.create_xrc_target(b.xrcd),
    }
    for what, create in cases.items():
        with pytest.raises(CommandError) as err:
            create()
        assert err.value.status == INVALID, what


def test_forged_srq_numbers_touch_no_bystander(tmp_path: Path) -> None:
    """vm0 names every SRQ number it can think of, vm2's XRC SRQ's among them, at vm1's target: vm2 (on the same
    backend, with its own XRC domain, target and SRQ) sees nothing, and its own XRC traffic still works."""
    backend = BackendProcess(tmp_path, names=("vm0", "vm1", "vm2"))
    with backend.frontend("vm0") as fe0, backend.frontend("vm1") as fe1, backend.frontend("vm2") as fe2:
        a, b, c = initiator(fe0, backend, "vm0"), target(fe1, backend, "vm1"), target(fe2, backend, "vm2")
        c.verbs.post_srq_recv(c.srq, [(c.mr.addr, 4096, c.mr.lkey)], wr_id=1)
        c.verbs.memory.write(c.mr.addr, pattern(64 << 10))
        bystander = backend.counters("vm2")
        # SRQ numbers are per device: vm2's numbers name vm1's SRQs at vm1 (its first SRQ has vm1's first's number).
        forged = [n for n in (c.srq.srqn + 1, c.srq.srqn ^ 1, 0, 1, 0xFFFFFF, b.srq.srqn + 1) if n != b.srq.srqn]
        for srqn in forged:
            connect(a, b, timeout=1, retry_cnt=1)
            assert send(a, WR["SEND"], b"forged", srqn).status == WC["REM_INV_REQ_ERR"]
            a.verbs.reset_qp(a.qp)
            b.kernel.reset_qp(b.tgt)
        assert c.verbs.poll_cq(c.cq) == [] and c.verbs.memory.read(c.mr.addr, 64 << 10) == pattern(64 << 10)
        after = backend.counters("vm2")
        assert after["engine"] == bystander["engine"] and after["objects"] == bystander["objects"]
        # vm2 is served as before: vm1 sends to it through an initiator of its own.
        sender = SimVerbs(fe1, backend.directory / "vm1.doorbell")
        spd, scq = sender.alloc_pd(), sender.create_cq(16)
        ini, smr = sender.create_qp(spd, scq, None, qp_type="XRC_INI"), sender.reg_mr(spd, 4096)
        sender.connect(ini, c.tgt.qpn, GID["vm2"], xrc="INI")
        c.kernel.connect(c.tgt, ini.qpn, GID["vm1"], xrc="TGT")
        sender.memory.write(smr.addr, b"to the bystander")
        sender.post_send(ini, WR["SEND"], [(smr.addr, 16, smr.lkey)], xrc_srqn=c.srq.srqn)
        assert wait_cqes(sender, scq, 1)[0].status == WC["SUCCESS"]
        (got,) = wait_cqes(c.verbs, c.cq, 1)
        assert (got.wr_id, got.status, c.verbs.memory.read(c.mr.addr, 16)) == (1, WC["SUCCESS"], b"to the bystander")
    assert backend.stop() == 0, backend.log_text()
