"""Fast registration, local and remote invalidation (the memory-management extensions) through the data engine.

vm0's kernel (context 0) allocates fast-registration MRs (ALLOC_MR) and maps them with REG_MR work requests whose
page lists name guest-physical pages; vm1, a user process connected to vm0's kernel QP, writes and reads them by
the key the registration gave. LOCAL_INV (vm0) and SEND_WITH_INV (vm1) unmap them, and the key stops working. Every
malformed registration or invalidation completes with an error and touches nothing, and a bystander VM on the same
backend sees nothing of it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from backend_process import GID, BackendProcess, Bystander, SimSide, pattern, start_side, wait_cqes

from vrdma.device import abi
from vrdma.testing.frontend import Frontend
from vrdma.testing.simulated_guest import Buffer, CommandError, SimCq, SimQp, SimVerbs

pytestmark = pytest.mark.backend

PAGE = abi.const("VRDMA_PAGE_SIZE")
WR = {name: abi.const(f"VRDMA_WR_{name}") for name in ("SEND", "SEND_WITH_INV", "RDMA_WRITE", "RDMA_READ",
                                                         "LOCAL_INV")}
WC = {name: abi.const(f"VRDMA_WC_{name}") for name in ("SUCCESS", "LOC_PROT_ERR", "LOC_QP_OP_ERR", "REM_ACCESS_ERR",
                                                         "REM_INV_REQ_ERR", "OP_REG_MR", "OP_LOCAL_INV", "OP_RECV",
                                                         "WITH_INV")}
ERR = abi.const("VRDMA_QPS_ERR")
INVALID = abi.const("VRDMA_STATUS_INVALID")
IOVA = 0x7F00_0000_0064  # an I/O virtual address of the ULP's choosing, 100 bytes into a page


@dataclass
class Kernel:
    """vm0's kernel: a PD, a CQ and an RC QP of context 0, and guest pages to map."""

    verbs: SimVerbs
    pd: int
    cq: SimCq
    qp: SimQp
    buf: Buffer


def kernel_side(fe: Frontend, backend: BackendProcess, name: str) -> Kernel:
    fe.start()
    verbs = SimVerbs(fe, backend.directory / f"{name}.doorbell", kernel=True)
    verbs.add_gid(0, GID[name])
    pd = verbs.alloc_pd()
    cq = verbs.create_cq(64)
    return Kernel(verbs, pd, cq, verbs.create_qp(pd, cq, cq), verbs.alloc(4 * PAGE))


def next_key(key: int) -> int:
    """ib_inc_rkey: the same MR, the low byte one further."""
    return (key & ~0xFF) | ((key + 1) & 0xFF)


def connect(k: Kernel, u: SimSide) -> None:
    """vm0's kernel QP and vm1's user QP to RTS, each aimed at the other."""
    k.verbs.connect(k.qp, u.qp.qpn, GID["vm1"])
    u.verbs.connect(u.qp, k.qp.qpn, GID["vm0"])


def kernel_and_user(backend: BackendProcess, fe0: Frontend, fe1: Frontend) -> tuple[Kernel, SimSide]:
    k, u = kernel_side(fe0, backend, "vm0"), start_side(fe1, backend, "vm1", GID["vm1"], 64 << 10)
    connect(k, u)
    return k, u


@pytest.fixture
def pair(backend: BackendProcess) -> Iterator[tuple[Kernel, SimSide]]:
    with backend.frontend("vm0") as fe0, backend.frontend("vm1") as fe1:
        yield kernel_and_user(backend, fe0, fe1)


@contextlib.contextmanager
def beside_a_bystander(tmp_path: Path) -> Iterator[tuple[Kernel, SimSide, Bystander]]:
    """vm0's kernel and vm1's user process connected (as `pair`), and vm2, a Bystander."""
    backend = BackendProcess(tmp_path, names=("vm0", "vm1", "vm2"))
    try:
        with backend.frontend("vm0") as fe0, backend.frontend("vm1") as fe1, backend.frontend("vm2") as fe2:
            k, u = kernel_and_user(backend, fe0, fe1)
            yield k, u, Bystander.beside(backend, fe2, "vm2")
    finally:
        assert backend.stop() == 0, backend.log_text()


def register(k: Kernel, max_pages: int = 8, pages: list[int] | None = None, length: int = 3 * PAGE - 100,
             access: int = 0xF) -> tuple[int, int]:
    """A fast-registration MR mapped onto (by default) three of the kernel's pages out of order; its handle and key."""
    handle, key = k.verbs.alloc_mr(k.pd, max_pages)
    key = next_key(key)
    pages = [k.buf.gpa + 2 * PAGE, k.buf.gpa, k.buf.gpa + PAGE] if pages is None else pages
    k.verbs.post_reg_mr(k.qp, key, IOVA, length, pages, access=access, wr_id=0x5E6)
    done = wait_cqes(k.verbs, k.cq, 1)[0]
    assert (done.wr_id, done.status, done.opcode) == (0x5E6, WC["SUCCESS"], WC["OP_REG_MR"])
    return handle, key


def write(u: SimSide, remote: int, rkey: int, data: bytes, wr_id: int = 1) -> Any:
    u.verbs.memory.write(u.mr.addr, data)
    u.verbs.post_send(u.qp, WR["RDMA_WRITE"], [(u.mr.addr, len(data), u.mr.lkey)], wr_id=wr_id,
                      remote_addr=remote, rkey=rkey)
    return wait_cqes(u.verbs, u.cq, 1)[0]


def test_remote_writes_and_reads_reach_the_registered_pages(pair: tuple[Kernel, SimSide]) -> None:
    k, u = pair
    _, key = register(k)
    data = pattern(3 * PAGE - 100)
    assert write(u, IOVA, key, data).status == WC["SUCCESS"]
    # The MR's bytes are its pages in the page list's order, from the IOVA's offset in the first.
    mem = k.verbs.memory
    landed = mem.read(k.buf.gpa + 2 * PAGE + 100, PAGE - 100) + mem.read(k.buf.gpa, PAGE) + mem.read(k.buf.gpa + PAGE,
                                                                                                        PAGE)
    assert landed == data
    u.verbs.post_send(u.qp, WR["RDMA_READ"], [(u.mr.addr + PAGE * 4, 5000, u.mr.lkey)], wr_id=2,
                      remote_addr=IOVA + 1000, rkey=key)
    assert wait_cqes(u.verbs, u.cq, 1)[0].status == WC["SUCCESS"]
    assert u.verbs.memory.read(u.mr.addr + PAGE * 4, 5000) == data[1000:6000]
    # One byte past the registration is not in it.
    assert write(u, IOVA + len(data) - 10, key, b"x" * 11).status == WC["REM_ACCESS_ERR"]


def test_the_key_before_the_registration_maps_nothing(pair: tuple[Kernel, SimSide]) -> None:
    k, u = pair
    _, key = k.verbs.alloc_mr(k.pd, 4)
    assert write(u, IOVA, key, b"not mapped yet").status == WC["REM_ACCESS_ERR"]


def test_local_invalidation_unmaps_and_the_key_stops_working(pair: tuple[Kernel, SimSide]) -> None:
    k, u = pair
    _, key = register(k)
    assert write(u, IOVA, key, b"before").status == WC["SUCCESS"]
    k.verbs.post_send(k.qp, WR["LOCAL_INV"], [], wr_id=7, imm=key)
    done = wait_cqes(k.verbs, k.cq, 1)[0]
    assert (done.wr_id, done.status, done.opcode) == (7, WC["SUCCESS"], WC["OP_LOCAL_INV"])
    assert write(u, IOVA, key, b"after").status == WC["REM_ACCESS_ERR"]
    assert k.verbs.memory.read(k.buf.gpa + 2 * PAGE + 100, 6) == b"before"


def test_a_registration_again_needs_an_invalidation_and_takes_a_new_key(pair: tuple[Kernel, SimSide]) -> None:
    k, u = pair
    _, key = register(k)
    k.verbs.post_send(k.qp, WR["LOCAL_INV"], [], wr_id=7, imm=key)
    assert wait_cqes(k.verbs, k.cq, 1)[0].status == WC["SUCCESS"]
    fresh = next_key(key)
    k.verbs.post_reg_mr(k.qp, fresh, IOVA, PAGE - 100, [k.buf.gpa + 3 * PAGE], wr_id=8)
    assert wait_cqes(k.verbs, k.cq, 1)[0].status == WC["SUCCESS"]
    assert write(u, IOVA, fresh, b"to the new page").status == WC["SUCCESS"]
    assert k.verbs.memory.read(k.buf.gpa + 3 * PAGE + 100, 15) == b"to the new page"
    assert write(u, IOVA, key, b"stale").status == WC["REM_ACCESS_ERR"]  # the old key is gone with the old mapping


def test_send_with_invalidate_unmaps_the_receivers_mr(pair: tuple[Kernel, SimSide]) -> None:
    k, u = pair
    _, key = register(k)
    k.verbs.post_recv(k.qp, [(k.buf.gpa + 3 * PAGE, 64, abi.const("VRDMA_LOCAL_DMA_LKEY"))], wr_id=9)
    u.verbs.memory.write(u.mr.addr, b"done with it")
    u.verbs.post_send(u.qp, WR["SEND_WITH_INV"], [(u.mr.addr, 12, u.mr.lkey)], wr_id=3, imm=key)
    assert wait_cqes(u.verbs, u.cq, 1)[0].status == WC["SUCCESS"]
    got = wait_cqes(k.verbs, k.cq, 1)[0]
    assert (got.wr_id, got.status, got.opcode, got.byte_len) == (9, WC["SUCCESS"], WC["OP_RECV"], 12)
    assert got.wc_flags & WC["WITH_INV"] and got.imm_data == key
    assert k.verbs.memory.read(k.buf.gpa + 3 * PAGE, 12) == b"done with it"
    assert write(u, IOVA, key, b"after").status == WC["REM_ACCESS_ERR"]


def test_send_with_invalidate_of_a_key_outside_the_receivers_pd_is_an_invalid_request(
        pair: tuple[Kernel, SimSide]) -> None:
    k, u = pair
    other_pd = k.verbs.alloc_pd()
    _, other = k.verbs.alloc_mr(other_pd, 4)
    k.verbs.post_recv(k.qp, [(k.buf.gpa + 3 * PAGE, 64, abi.const("VRDMA_LOCAL_DMA_LKEY"))], wr_id=9)
    u.verbs.post_send(u.qp, WR["SEND_WITH_INV"], [(u.mr.addr, 12, u.mr.lkey)], wr_id=3, imm=other)
    assert wait_cqes(u.verbs, u.cq, 1)[0].status == WC["REM_INV_REQ_ERR"]
    assert wait_cqes(k.verbs, k.cq, 1)[0].status == WC["REM_INV_REQ_ERR"]
    assert k.verbs.query_qp(k.qp).qp_state == ERR and u.verbs.query_qp(u.qp).qp_state == ERR


@pytest.mark.parametrize("whose", ["the sender's own MR", "a third VM's MR", "the receiver's MR of another PD"])
def test_remote_invalidation_of_a_key_the_sender_does_not_own_touches_nothing(tmp_path: Path, whose: str) -> None:
    """vm1 sends SEND_WITH_INV naming a key that is not one of vm0's fast-registration MRs it may name: its own
    MR's, a bystander VM's, or vm0's of another PD. Keys are per device: the key names a slot of vm0's table, whose
    MR (if any) has another key or PD; nothing is unmapped anywhere, the message is an invalid request, and the
    bystander's MR still works."""
    with beside_a_bystander(tmp_path) as (k, u, bystander):
        _, mapped = register(k)  # vm0's own mapping, which must survive
        key = {"the sender's own MR": u.mr.rkey, "a third VM's MR": bystander.mr.rkey,
               "the receiver's MR of another PD": next_key(k.verbs.alloc_mr(k.verbs.alloc_pd(), 4)[1])}[whose]
        k.verbs.post_recv(k.qp, [(k.buf.gpa + 3 * PAGE, 64, abi.const("VRDMA_LOCAL_DMA_LKEY"))], wr_id=9)
        u.verbs.post_send(u.qp, WR["SEND_WITH_INV"], [(u.mr.addr, 12, u.mr.lkey)], wr_id=3, imm=key)
        assert wait_cqes(u.verbs, u.cq, 1)[0].status == WC["REM_INV_REQ_ERR"]
        assert wait_cqes(k.verbs, k.cq, 1)[0].status == WC["REM_INV_REQ_ERR"]
        bystander.check()
        # vm0's mapping and the sender's own MR are as they were.
        k.verbs.reset_qp(k.qp)
        u.verbs.reset_qp(u.qp)
        connect(k, u)
        assert write(u, IOVA, mapped, b"still mapped").status == WC["SUCCESS"]
        k.verbs.memory.write(k.buf.gpa, b"sender's MR")
        k.verbs.post_send(k.qp, WR["RDMA_WRITE"], [(k.buf.gpa, 11, abi.const("VRDMA_LOCAL_DMA_LKEY"))], wr_id=5,
                          remote_addr=u.mr.addr + 100, rkey=u.mr.rkey)
        assert wait_cqes(k.verbs, k.cq, 1)[0].status == WC["SUCCESS"]
        assert u.verbs.memory.read(u.mr.addr + 100, 11) == b"sender's MR"


# Each: what the REG_MR names (key, pages, length, access, page list), and the status it completes with.
def _bad(k: Kernel, case: str) -> tuple[dict[str, Any], int]:
    _, key = k.verbs.alloc_mr(k.pd, 4)
    key = next_key(key)
    ram = [k.buf.gpa]
    if case == "a registered (not fast) MR's key":
        return {"key": k.verbs.reg_mr(k.pd, PAGE).lkey, "pages": ram}, WC["LOC_PROT_ERR"]
    if case == "an MR of another PD":
        _, other = k.verbs.alloc_mr(k.verbs.alloc_pd(), 4)
        return {"key": next_key(other), "pages": ram}, WC["LOC_PROT_ERR"]
    if case == "a key that names no MR":
        return {"key": (key & 0xFF) | (0x7FF << 8), "pages": ram}, WC["LOC_PROT_ERR"]
    if case == "more pages than the MR has room for":
        return {"key": key, "pages": ram * 5, "length": 5 * PAGE - 100}, WC["LOC_QP_OP_ERR"]
    if case == "no pages":
        return {"key": key, "pages": [], "length": 0}, WC["LOC_QP_OP_ERR"]
    if case == "a length past its pages":
        return {"key": key, "pages": ram, "length": PAGE - 99}, WC["LOC_QP_OP_ERR"]
    if case == "unknown access bits":
        return {"key": key, "pages": ram, "access": 0x3F}, WC["LOC_QP_OP_ERR"]
    if case == "remote write without local write":
        return {"key": key, "pages": ram, "access": 0x2}, WC["LOC_QP_OP_ERR"]
    if case == "a page that is not guest RAM":
        return {"key": key, "pages": [0xFE00_0000]}, WC["LOC_PROT_ERR"]
    if case == "a page address inside a page":
        return {"key": key, "pages": [k.buf.gpa + 8]}, WC["LOC_PROT_ERR"]
    if case == "a page list outside guest RAM":
        return {"key": key, "pages": ram, "page_list": 0x7FFF_FFFF_F000}, WC["LOC_PROT_ERR"]
    if case == "a page list 4 bytes into a word":
        return {"key": key, "pages": ram, "page_list": k.buf.gpa + 4}, WC["LOC_QP_OP_ERR"]
    raise AssertionError(case)


BAD_REGISTRATIONS = ["a registered (not fast) MR's key", "an MR of another PD", "a key that names no MR",
                     "more pages than the MR has room for", "no pages", "a length past its pages",
                     "unknown access bits", "remote write without local write", "a page that is not guest RAM",
                     "a page address inside a page", "a page list outside guest RAM", "a page list 4 bytes into a word"]


@pytest.mark.parametrize("case", BAD_REGISTRATIONS)
def test_a_malformed_registration_fails_and_touches_no_bystander(tmp_path: Path, case: str) -> None:
    backend = BackendProcess(tmp_path, names=("vm0", "vm1", "vm2"))
    try:
        with backend.frontend("vm0") as fe0, backend.frontend("vm2") as fe2:
            k = kernel_side(fe0, backend, "vm0")
            k.verbs.connect(k.qp, k.qp.qpn, GID["vm0"])  # to itself: a QP runs its send queue in RTS
            bystander = Bystander.beside(backend, fe2, "vm2")
            fields, status = _bad(k, case)
            length = fields.get("length", PAGE - 100)
            k.verbs.post_reg_mr(k.qp, fields["key"], IOVA, length, fields["pages"], wr_id=0xBAD,
                                access=fields.get("access", 0xF), page_list=fields.get("page_list"))
            done = wait_cqes(k.verbs, k.cq, 1)[0]
            assert (done.wr_id, done.status) == (0xBAD, status), case
            assert k.verbs.query_qp(k.qp).qp_state == ERR
            bystander.check()
    finally:
        assert backend.stop() == 0, backend.log_text()


def test_a_registration_of_a_mapped_mr_fails(pair: tuple[Kernel, SimSide]) -> None:
    k, _ = pair
    _, key = register(k)
    k.verbs.post_reg_mr(k.qp, next_key(key), IOVA, PAGE - 100, [k.buf.gpa], wr_id=2)
    assert wait_cqes(k.verbs, k.cq, 1)[0].status == WC["LOC_PROT_ERR"]


@pytest.mark.parametrize("which", ["another low byte", "a registered MR's key", "an MR of another PD",
                                   "an MR of another VM"])
def test_a_local_invalidation_of_what_is_not_the_qps_fails(tmp_path: Path, which: str) -> None:
    """LOCAL_INV of a key that is no fast-registration MR of the QP's PD by its current key: a local protection
    error, nothing unmapped (vm0's own mapping, vm1's MR), and the bystander VM sees nothing of it."""
    with beside_a_bystander(tmp_path) as (k, u, bystander):
        _, key = register(k)
        other = {"another low byte": next_key(key), "a registered MR's key": k.verbs.reg_mr(k.pd, PAGE).rkey,
                 "an MR of another PD": k.verbs.alloc_mr(k.verbs.alloc_pd(), 4)[1],
                 "an MR of another VM": u.mr.rkey}[which]
        k.verbs.post_send(k.qp, WR["LOCAL_INV"], [], wr_id=7, imm=other)
        assert wait_cqes(k.verbs, k.cq, 1)[0].status == WC["LOC_PROT_ERR"]
        assert k.verbs.query_qp(k.qp).qp_state == ERR
        bystander.check()
        # vm0's mapping still takes vm1's writes once vm0's QP is back, and vm1's MR still takes vm0's.
        k.verbs.reset_qp(k.qp)
        k.verbs.connect(k.qp, u.qp.qpn, GID["vm1"])
        assert write(u, IOVA, key, b"still mapped").status == WC["SUCCESS"]
        k.verbs.post_send(k.qp, WR["RDMA_WRITE"], [(k.buf.gpa, 8, abi.const("VRDMA_LOCAL_DMA_LKEY"))], wr_id=8,
                          remote_addr=u.mr.addr + 64, rkey=u.mr.rkey)
        assert wait_cqes(k.verbs, k.cq, 1)[0].status == WC["SUCCESS"]


def test_a_user_qp_cannot_register_guest_physical_pages(pair: tuple[Kernel, SimSide]) -> None:
    """A page list names guest-physical pages: a user process that writes a REG_MR work request into its own ring
    (libvrdma never does) would reach the guest's kernel memory. The device refuses it."""
    k, u = pair
    _, key = k.verbs.alloc_mr(k.pd, 4)
    u.verbs.post_reg_mr(u.qp, next_key(key), IOVA, PAGE - 100, [k.buf.gpa], wr_id=5)
    assert wait_cqes(u.verbs, u.cq, 1)[0].status == WC["LOC_QP_OP_ERR"]


@pytest.mark.parametrize("fields", [{"max_pages": 0}, {"max_pages": 513}, {"pd": 0x7FFF0001, "max_pages": 4}],
                         ids=["no pages", "past max_fast_reg_pages", "no such PD"])
def test_alloc_mr_refuses_what_it_cannot_make(pair: tuple[Kernel, SimSide], fields: dict[str, int]) -> None:
    k, _ = pair
    with pytest.raises(CommandError) as refused:
        k.verbs.call("VRDMA_CMD_ALLOC_MR", "vrdma_cmd_alloc_mr", "vrdma_resp_alloc_mr", **{"pd": k.pd, **fields})
    assert refused.value.status == INVALID


def test_alloc_mr_is_the_kernels(pair: tuple[Kernel, SimSide]) -> None:
    _, u = pair
    with pytest.raises(CommandError) as refused:
        u.verbs.alloc_mr(u.pd, 4)
    assert refused.value.status == INVALID
