"""Memory windows (type 1 and 2) and MR reregistration through the data engine.

vm0 and vm1 are user processes with connected RC QPs. vm0 registers an MR with MW_BIND access, allocates a window
(ALLOC_MW) and binds it to part of the MR with a BIND_MW work request; vm1 reaches exactly that part, with the
window's rights, by the window's rkey. Type 2 windows are freed by LOCAL_INV and SEND_WITH_INV and belong to the
QP that bound them; type 1 windows are bound again (zero length: to nothing). A window whose MR went, or was
reregistered, reaches nothing. REREG_MR changes an MR's pages, PD or access in place. Every malformed bind fails
with a bind error, touches nothing, and a bystander VM on the same backend sees nothing of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from backend_process import GID, BackendProcess, Bystander, SimSide, pattern, start_side, wait_cqes

from vrdma.device import abi
from vrdma.testing.simulated_guest import CommandError

pytestmark = pytest.mark.backend

PAGE = abi.const("VRDMA_PAGE_SIZE")
WR = {name: abi.const(f"VRDMA_WR_{name}") for name in ("SEND", "SEND_WITH_INV", "RDMA_WRITE", "RDMA_READ",
                                                         "LOCAL_INV", "ATOMIC_FETCH_AND_ADD")}
WC = {name: abi.const(f"VRDMA_WC_{name}") for name in ("SUCCESS", "LOC_PROT_ERR", "LOC_QP_OP_ERR", "REM_ACCESS_ERR",
                                                         "REM_OP_ERR", "REM_INV_REQ_ERR", "MW_BIND_ERR",
                                                         "OP_BIND_MW", "OP_LOCAL_INV", "OP_RECV", "WITH_INV")}
ACCESS = {name: abi.const(f"VRDMA_ACCESS_{name}") for name in ("LOCAL_WRITE", "REMOTE_WRITE", "REMOTE_READ",
                                                                 "REMOTE_ATOMIC", "MW_BIND")}
REREG = {name: abi.const(f"VRDMA_REREG_{name}") for name in ("TRANSLATION", "PD", "ACCESS")}
RW = ACCESS["REMOTE_WRITE"] | ACCESS["REMOTE_READ"]
ERR = abi.const("VRDMA_QPS_ERR")
INVALID = abi.const("VRDMA_STATUS_INVALID")
MR_SIZE = 4 * PAGE
WINDOW = (PAGE + 100, 2 * PAGE)  # (offset into vm0's MR, length)


def next_key(key: int) -> int:
    """ibv_inc_rkey: the same window, the low byte one further."""
    return (key & ~0xFF) | ((key + 1) & 0xFF)


@pytest.fixture
def pair(backend: BackendProcess) -> Iterator[tuple[SimSide, SimSide]]:
    with backend.frontend("vm0") as fe0, backend.frontend("vm1") as fe1:
        a, b = start_side(fe0, backend, "vm0", GID["vm0"], MR_SIZE), start_side(fe1, backend, "vm1", GID["vm1"],
                                                                                MR_SIZE)
        a.verbs.connect(a.qp, b.qp.qpn, GID["vm1"])
        b.verbs.connect(b.qp, a.qp.qpn, GID["vm0"])
        yield a, b


def bind(side: SimSide, mw_rkey: int, access: int = RW, window: tuple[int, int] = WINDOW, lkey: int | None = None,
         new_rkey: int | None = None, wr_id: int = 0xB1D) -> tuple[int, Any]:
    """Bind the window to ``window`` of the side's MR; the window's new key and the bind's completion."""
    new_rkey = next_key(mw_rkey) if new_rkey is None else new_rkey
    side.verbs.post_bind_mw(side.qp, mw_rkey, new_rkey, side.mr.lkey if lkey is None else lkey,
                            side.mr.addr + window[0], window[1], access, wr_id=wr_id)
    return new_rkey, wait_cqes(side.verbs, side.cq, 1)[0]


def bound(side: SimSide, mw_type: int, access: int = RW) -> tuple[int, int]:
    """A window of the side's PD bound to WINDOW of its MR: its handle and rkey."""
    handle, rkey = side.verbs.alloc_mw(side.pd, mw_type)
    rkey, done = bind(side, rkey, access)
    assert (done.wr_id, done.status, done.opcode) == (0xB1D, WC["SUCCESS"], WC["OP_BIND_MW"])
    return handle, rkey


def write(side: SimSide, remote: int, rkey: int, data: bytes, opcode: str = "RDMA_WRITE") -> int:
    """An RDMA WRITE (or READ of len(data) bytes) from the side's MR; its completion status."""
    side.verbs.memory.write(side.mr.addr, data)
    side.verbs.post_send(side.qp, WR[opcode], [(side.mr.addr, len(data), side.mr.lkey)], wr_id=1,
                         remote_addr=remote, rkey=rkey)
    return int(wait_cqes(side.verbs, side.cq, 1)[0].status)


def reconnect(a: SimSide, b: SimSide) -> None:
    """Both QPs from ERR back to RTS (through RESET), as rdma-core's tests do after an expected failure."""
    for side, peer, gid in ((a, b, GID["vm1"]), (b, a, GID["vm0"])):
        side.verbs.reset_qp(side.qp)
        side.verbs.connect(side.qp, peer.qp.qpn, gid)


@pytest.mark.parametrize("mw_type", [1, 2])
def test_a_bound_window_reaches_its_range_of_the_mr_and_nothing_else(pair: tuple[SimSide, SimSide],
                                                                       mw_type: int) -> None:
    a, b = pair
    _, rkey = bound(a, mw_type)
    start = a.mr.addr + WINDOW[0]
    data = pattern(WINDOW[1])
    assert write(b, start, rkey, data) == WC["SUCCESS"]
    assert a.verbs.memory.read(start, WINDOW[1]) == data
    assert write(b, start + 10, rkey, b"x" * 100, "RDMA_READ") == WC["SUCCESS"]
    assert b.verbs.memory.read(b.mr.addr, 100) == data[10:110]
    # A byte before the window, a byte past its end: the MR has them, the window does not.
    assert write(b, start - 1, rkey, b"before") == WC["REM_ACCESS_ERR"]
    assert a.verbs.memory.read(start - 1, 1) == b"\0"
    end = start + WINDOW[1]
    for at, length in ((end - 4, 5), (end, 1)):  # its last bytes and one more; the first byte after it
        for opcode in ("RDMA_WRITE", "RDMA_READ"):
            reconnect(a, b)
            assert write(b, at, rkey, b"p" * length, opcode) == WC["REM_ACCESS_ERR"], (opcode, at - start, length)
    assert a.verbs.memory.read(end - 4, 5) == data[-4:] + b"\0", "nothing written at or past the end"
    reconnect(a, b)
    assert write(b, end - 4, rkey, b"last") == WC["SUCCESS"], "up to its last byte: the window's"
    assert a.verbs.memory.read(end - 4, 5) == b"last\0"


def test_a_window_grants_its_own_rights_not_its_mrs(pair: tuple[SimSide, SimSide]) -> None:
    a, b = pair
    _, rkey = bound(a, 2, access=ACCESS["REMOTE_READ"])
    start = a.mr.addr + WINDOW[0]
    assert write(b, start, rkey, b"read me", "RDMA_READ") == WC["SUCCESS"]
    assert write(b, start, rkey, b"but not write") == WC["REM_ACCESS_ERR"]


def test_a_window_key_is_no_local_key(pair: tuple[SimSide, SimSide]) -> None:
    a, _ = pair
    _, rkey = bound(a, 2)
    a.verbs.post_send(a.qp, WR["SEND"], [(a.mr.addr + WINDOW[0], 8, rkey)], wr_id=3)
    assert wait_cqes(a.verbs, a.cq, 1)[0].status == WC["LOC_PROT_ERR"]


def test_a_type_2_window_is_freed_by_local_invalidation(pair: tuple[SimSide, SimSide]) -> None:
    a, b = pair
    _, rkey = bound(a, 2)
    a.verbs.post_send(a.qp, WR["LOCAL_INV"], [], wr_id=7, imm=rkey)
    done = wait_cqes(a.verbs, a.cq, 1)[0]
    assert (done.wr_id, done.status, done.opcode) == (7, WC["SUCCESS"], WC["OP_LOCAL_INV"])
    assert write(b, a.mr.addr + WINDOW[0], rkey, b"after") == WC["REM_ACCESS_ERR"]
    # Free again, it binds again (under a new key).
    reconnect(a, b)
    rkey, done = bind(a, rkey)
    assert done.status == WC["SUCCESS"]
    assert write(b, a.mr.addr + WINDOW[0], rkey, b"bound again") == WC["SUCCESS"]


def test_a_type_2_window_is_freed_by_send_with_invalidate(pair: tuple[SimSide, SimSide]) -> None:
    a, b = pair
    _, rkey = bound(a, 2)
    a.verbs.post_recv(a.qp, [(a.mr.addr, 64, a.mr.lkey)], wr_id=9)
    b.verbs.memory.write(b.mr.addr, b"done with it")
    b.verbs.post_send(b.qp, WR["SEND_WITH_INV"], [(b.mr.addr, 12, b.mr.lkey)], wr_id=3, imm=rkey)
    assert wait_cqes(b.verbs, b.cq, 1)[0].status == WC["SUCCESS"]
    got = wait_cqes(a.verbs, a.cq, 1)[0]
    assert (got.status, got.opcode, got.imm_data) == (WC["SUCCESS"], WC["OP_RECV"], rkey)
    assert got.wc_flags & WC["WITH_INV"]
    assert write(b, a.mr.addr + WINDOW[0], rkey, b"after") == WC["REM_ACCESS_ERR"]


def test_a_type_1_window_is_not_invalidated_but_bound_again(pair: tuple[SimSide, SimSide]) -> None:
    a, b = pair
    _, rkey = bound(a, 1)
    a.verbs.post_send(a.qp, WR["LOCAL_INV"], [], wr_id=7, imm=rkey)
    assert wait_cqes(a.verbs, a.cq, 1)[0].status == WC["LOC_PROT_ERR"]
    reconnect(a, b)
    assert write(b, a.mr.addr + WINDOW[0], rkey, b"still bound") == WC["SUCCESS"]
    # Bound again elsewhere: the old key is gone, the new one reaches the new range.
    fresh, done = bind(a, rkey, window=(3 * PAGE, 100))
    assert done.status == WC["SUCCESS"]
    assert write(b, a.mr.addr + WINDOW[0], rkey, b"stale key") == WC["REM_ACCESS_ERR"]
    reconnect(a, b)
    assert write(b, a.mr.addr + 3 * PAGE, fresh, b"new range") == WC["SUCCESS"]
    assert a.verbs.memory.read(a.mr.addr + 3 * PAGE, 9) == b"new range"
    # Zero length: bound to nothing.
    last, done = bind(a, fresh, access=0, window=(0, 0))
    assert done.status == WC["SUCCESS"]
    assert write(b, a.mr.addr + 3 * PAGE, last, b"unbound") == WC["REM_ACCESS_ERR"]


def test_a_type_2_window_is_its_binding_qps_alone(pair: tuple[SimSide, SimSide]) -> None:
    """Type 2B: only requests arriving at the QP that bound the window may use it, even on a QP of the same PD."""
    a, b = pair
    _, rkey = bound(a, 2)
    second, peer = a.verbs.create_qp(a.pd, a.cq, a.cq), b.verbs.create_qp(b.pd, b.cq, b.cq)
    a.verbs.connect(second, peer.qpn, GID["vm1"])
    b.verbs.connect(peer, second.qpn, GID["vm0"])
    b.verbs.memory.write(b.mr.addr, b"via another QP")
    b.verbs.post_send(peer, WR["RDMA_WRITE"], [(b.mr.addr, 14, b.mr.lkey)], wr_id=1, remote_addr=a.mr.addr + WINDOW[0],
                      rkey=rkey)
    assert wait_cqes(b.verbs, b.cq, 1)[0].status == WC["REM_ACCESS_ERR"]
    assert write(b, a.mr.addr + WINDOW[0], rkey, b"via the binder") == WC["SUCCESS"]


def test_a_type_2_window_is_not_invalidated_through_another_qp(pair: tuple[SimSide, SimSide]) -> None:
    """A SEND_WITH_INV arriving at another QP of the same PD names the window: an invalid request, and the window
    stays bound for the QP that bound it."""
    a, b = pair
    _, rkey = bound(a, 2)
    second, peer = a.verbs.create_qp(a.pd, a.cq, a.cq), b.verbs.create_qp(b.pd, b.cq, b.cq)
    a.verbs.connect(second, peer.qpn, GID["vm1"])
    b.verbs.connect(peer, second.qpn, GID["vm0"])
    a.verbs.post_recv(second, [(a.mr.addr, 64, a.mr.lkey)], wr_id=9)
    b.verbs.post_send(peer, WR["SEND_WITH_INV"], [(b.mr.addr, 8, b.mr.lkey)], wr_id=3, imm=rkey)
    assert wait_cqes(b.verbs, b.cq, 1)[0].status == WC["REM_INV_REQ_ERR"]
    assert wait_cqes(a.verbs, a.cq, 1)[0].status == WC["REM_INV_REQ_ERR"]
    assert write(b, a.mr.addr + WINDOW[0], rkey, b"still bound") == WC["SUCCESS"]


@pytest.mark.parametrize("how", ["deallocated", "its MR deregistered", "its MR deregistered, the slot reused",
                                 "its MR reregistered"])
def test_a_window_whose_mr_changed_reaches_nothing(pair: tuple[SimSide, SimSide], how: str) -> None:
    a, b = pair
    handle, rkey = bound(a, 1)
    if how == "deallocated":
        a.verbs.dealloc_mw(handle)
    elif how.startswith("its MR deregistered"):
        a.verbs.call("VRDMA_CMD_DEREG_MR", "vrdma_cmd_destroy", "vrdma_resp_hdr", handle=a.mr.handle)
        if how.endswith("reused"):
            a.mr = a.verbs.reg_mr(a.pd, MR_SIZE, buf=a.mr.buf)  # the slot the window named
    else:
        a.verbs.rereg_mr(a.mr, REREG["ACCESS"], access=0x1F)
    assert write(b, a.mr.addr + WINDOW[0], rkey, b"nothing there") == WC["REM_ACCESS_ERR"]
    assert a.verbs.memory.read(a.mr.addr + WINDOW[0], 13) == bytes(13)


# Each: what the BIND_MW names, beside a good type 2 window of vm0 and vm0's MR; the status it completes with.
def _bad_bind(a: SimSide, b: SimSide, case: str) -> tuple[dict[str, Any], int]:
    _, rkey = a.verbs.alloc_mw(a.pd, 2)
    if case == "an MR without MW_BIND access":
        return {"mw_rkey": rkey, "lkey": a.verbs.reg_mr(a.pd, MR_SIZE, access=0xF, buf=a.mr.buf).lkey}, \
            WC["MW_BIND_ERR"]
    if case == "an MR of another PD":
        return {"mw_rkey": rkey, "lkey": a.verbs.reg_mr(a.verbs.alloc_pd(), MR_SIZE, buf=a.mr.buf).lkey}, \
            WC["MW_BIND_ERR"]
    if case == "a window of another PD":
        return {"mw_rkey": a.verbs.alloc_mw(a.verbs.alloc_pd(), 2)[1]}, WC["MW_BIND_ERR"]
    if case == "a window of another VM":
        return {"mw_rkey": b.verbs.alloc_mw(b.pd, 2)[1]}, WC["MW_BIND_ERR"]
    if case == "an MR's key as the window":
        return {"mw_rkey": a.mr.rkey}, WC["MW_BIND_ERR"]
    if case == "a window key with other random bits":
        return {"mw_rkey": rkey ^ (1 << 31)}, WC["MW_BIND_ERR"]
    if case == "a new key of another window":
        return {"mw_rkey": rkey, "new_rkey": rkey ^ (1 << 8)}, WC["MW_BIND_ERR"]
    if case == "a range past the MR":
        return {"mw_rkey": rkey, "window": (MR_SIZE - 100, 101)}, WC["MW_BIND_ERR"]
    if case == "a range before the MR":
        return {"mw_rkey": rkey, "window": (-1, 100)}, WC["MW_BIND_ERR"]
    if case == "remote write on an MR without local write":
        mr = a.verbs.reg_mr(a.pd, MR_SIZE, access=ACCESS["MW_BIND"] | ACCESS["REMOTE_READ"], buf=a.mr.buf)
        return {"mw_rkey": rkey, "lkey": mr.lkey}, WC["MW_BIND_ERR"]
    if case == "local write asked of a window":
        return {"mw_rkey": rkey, "access": ACCESS["LOCAL_WRITE"] | RW}, WC["MW_BIND_ERR"]
    if case == "a bound type 2 window":
        return {"mw_rkey": bound(a, 2)[1]}, WC["MW_BIND_ERR"]
    raise AssertionError(case)


BAD_BINDS = ["an MR without MW_BIND access", "an MR of another PD", "a window of another PD", "a window of another VM",
             "an MR's key as the window", "a window key with other random bits", "a new key of another window",
             "a range past the MR", "a range before the MR", "remote write on an MR without local write",
             "local write asked of a window", "a bound type 2 window"]


@pytest.mark.parametrize("case", BAD_BINDS)
def test_a_malformed_bind_fails_and_touches_no_bystander(tmp_path: Path, case: str) -> None:
    backend = BackendProcess(tmp_path, names=("vm0", "vm1", "vm2"))
    try:
        with backend.frontend("vm0") as fe0, backend.frontend("vm1") as fe1, backend.frontend("vm2") as fe2:
            a, b = start_side(fe0, backend, "vm0", GID["vm0"], MR_SIZE), start_side(fe1, backend, "vm1", GID["vm1"],
                                                                                    MR_SIZE)
            a.verbs.connect(a.qp, b.qp.qpn, GID["vm1"])
            b.verbs.connect(b.qp, a.qp.qpn, GID["vm0"])
            bystander = Bystander.beside(backend, fe2, "vm2")
            fields, status = _bad_bind(a, b, case)
            mw_rkey = fields.pop("mw_rkey")
            new_rkey, done = bind(a, mw_rkey, wr_id=0xBAD, **fields)
            assert (done.wr_id, done.status) == (0xBAD, status), case
            assert a.verbs.query_qp(a.qp).qp_state == ERR
            reconnect(a, b)
            assert write(b, a.mr.addr + WINDOW[0], new_rkey, b"nothing") == WC["REM_ACCESS_ERR"]
            bystander.check()
    finally:
        assert backend.stop() == 0, backend.log_text()


def test_a_ud_qp_binds_no_window(backend: BackendProcess) -> None:
    with backend.frontend("vm0") as fe0:
        a = start_side(fe0, backend, "vm0", GID["vm0"], MR_SIZE, qp_type="UD")
        a.verbs.ud_ready(a.qp, 0x1234)
        _, rkey = a.verbs.alloc_mw(a.pd, 2)
        _, done = bind(a, rkey)
        assert done.status == WC["LOC_QP_OP_ERR"]


@pytest.mark.parametrize("fields", [{"type": 0}, {"type": 3}, {"pd": 0x7777}])
def test_a_malformed_window_allocation_is_refused(pair: tuple[SimSide, SimSide], fields: dict[str, int]) -> None:
    a, _ = pair
    request = {"pd": a.pd, "type": 2, **fields}
    with pytest.raises(CommandError) as refused:
        a.verbs.call("VRDMA_CMD_ALLOC_MW", "vrdma_cmd_alloc_mw", "vrdma_resp_alloc_mw", **request)
    assert refused.value.status == INVALID


def test_windows_and_mrs_are_not_each_others_to_free(pair: tuple[SimSide, SimSide]) -> None:
    a, _ = pair
    handle, _ = a.verbs.alloc_mw(a.pd, 1)
    for opcode, target in (("VRDMA_CMD_DEREG_MR", handle), ("VRDMA_CMD_DEALLOC_MW", a.mr.handle)):
        with pytest.raises(CommandError) as refused:
            a.verbs.call(opcode, "vrdma_cmd_destroy", "vrdma_resp_hdr", handle=target)
        assert refused.value.status == INVALID
    # A PD stays busy while a window of it lives.
    pd = a.verbs.alloc_pd()
    only, _ = a.verbs.alloc_mw(pd, 2)
    with pytest.raises(CommandError):
        a.verbs.call("VRDMA_CMD_DEALLOC_PD", "vrdma_cmd_destroy", "vrdma_resp_hdr", handle=pd)
    a.verbs.dealloc_mw(only)
    a.verbs.call("VRDMA_CMD_DEALLOC_PD", "vrdma_cmd_destroy", "vrdma_resp_hdr", handle=pd)


# -- reregistration ----------------------------------------------------------------------------------------------

def test_a_new_translation_moves_the_mr_to_new_pages_under_the_same_keys(pair: tuple[SimSide, SimSide]) -> None:
    a, b = pair
    old, fresh = a.mr.buf, a.verbs.alloc(2 * PAGE)
    keys = (a.mr.lkey, a.mr.rkey)
    a.verbs.rereg_mr(a.mr, REREG["TRANSLATION"], buf=fresh)
    assert write(b, fresh.gpa + 10, a.mr.rkey, b"new pages") == WC["SUCCESS"]
    assert a.verbs.memory.read(fresh.gpa + 10, 9) == b"new pages" and (a.mr.lkey, a.mr.rkey) == keys
    assert write(b, old.gpa + 3 * PAGE, a.mr.rkey, b"old range") == WC["REM_ACCESS_ERR"]
    assert a.verbs.memory.read(old.gpa + 3 * PAGE, 9) == bytes(9)


def test_new_access_rights_take_effect(pair: tuple[SimSide, SimSide]) -> None:
    a, b = pair
    a.verbs.rereg_mr(a.mr, REREG["ACCESS"], access=ACCESS["LOCAL_WRITE"] | ACCESS["REMOTE_READ"])
    assert write(b, a.mr.addr, a.mr.rkey, b"read", "RDMA_READ") == WC["SUCCESS"]
    assert write(b, a.mr.addr, a.mr.rkey, b"write") == WC["REM_ACCESS_ERR"]
    reconnect(a, b)
    a.verbs.rereg_mr(a.mr, REREG["ACCESS"], access=0x1F)
    assert write(b, a.mr.addr, a.mr.rkey, b"write again") == WC["SUCCESS"]


def test_an_mr_moved_to_another_pd_serves_that_pds_qps_only(pair: tuple[SimSide, SimSide]) -> None:
    """The flow of rdma-core's test_mr_rereg_pd: a receive into an MR of another PD is a remote operation error."""
    a, b = pair
    other = a.verbs.alloc_pd()
    a.verbs.rereg_mr(a.mr, REREG["PD"], pd=other)
    a.verbs.post_recv(a.qp, [(a.mr.addr, 64, a.mr.lkey)], wr_id=9)
    b.verbs.post_send(b.qp, WR["SEND"], [(b.mr.addr, 8, b.mr.lkey)], wr_id=3)
    assert wait_cqes(b.verbs, b.cq, 1)[0].status == WC["REM_OP_ERR"]
    reconnect(a, b)
    a.verbs.rereg_mr(a.mr, REREG["PD"], pd=a.pd)
    a.verbs.post_recv(a.qp, [(a.mr.addr, 64, a.mr.lkey)], wr_id=9)
    b.verbs.post_send(b.qp, WR["SEND"], [(b.mr.addr, 8, b.mr.lkey)], wr_id=3)
    assert wait_cqes(b.verbs, b.cq, 1)[0].status == WC["SUCCESS"]
    # The PD the MR left is free to go; the one it is in is not.
    a.verbs.call("VRDMA_CMD_DEALLOC_PD", "vrdma_cmd_destroy", "vrdma_resp_hdr", handle=other)
    with pytest.raises(CommandError):
        a.verbs.call("VRDMA_CMD_DEALLOC_PD", "vrdma_cmd_destroy", "vrdma_resp_hdr", handle=a.pd)


@pytest.mark.parametrize("case", ["no flags", "unknown flags", "a PD of another context", "a PD never issued",
                                  "remote write without local write", "a translation of length 0",
                                  "a page list short of the length", "a window", "a fast-registration MR"])
def test_a_malformed_reregistration_is_refused_and_leaves_the_mr_as_it_was(pair: tuple[SimSide, SimSide],
                                                                           case: str) -> None:
    a, b = pair
    target, fields = a.mr.handle, {"flags": REREG["ACCESS"], "access": 0x1F, "pd": 0}
    if case == "no flags":
        fields["flags"] = 0
    elif case == "unknown flags":
        fields["flags"] = 8 | REREG["ACCESS"]
    elif case == "a PD of another context":
        fields.update(flags=REREG["PD"], pd=b.pd)
    elif case == "a PD never issued":
        fields.update(flags=REREG["PD"], pd=0x7777)
    elif case == "remote write without local write":
        fields["access"] = ACCESS["REMOTE_WRITE"]
    elif case in ("a translation of length 0", "a page list short of the length"):
        buf = a.verbs.alloc(PAGE)
        fields.update(flags=REREG["TRANSLATION"], iova=buf.gpa, length=0 if "length 0" in case else 2 * PAGE,
                      pages=a.verbs.page_list(buf))
    elif case == "a window":
        target = a.verbs.alloc_mw(a.pd, 1)[0]
    else:
        with pytest.raises(CommandError):  # a user context has no fast-registration MRs: ALLOC_MR refuses
            a.verbs.alloc_mr(a.pd, 4)
        return
    with pytest.raises(CommandError) as refused:
        a.verbs.call("VRDMA_CMD_REREG_MR", "vrdma_cmd_rereg_mr", "vrdma_resp_reg_mr", handle=target, **fields)
    assert refused.value.status == INVALID
    assert write(b, a.mr.addr + 5, a.mr.rkey, b"as it was") == WC["SUCCESS"]
    assert a.verbs.memory.read(a.mr.addr + 5, 9) == b"as it was"
