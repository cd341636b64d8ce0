"""pvrdma lesson 3, integer overflow in address and length arithmetic (CVE-2021-3582): MRs and work requests whose
ranges wrap around 2^64 or disagree with their pages."""

from __future__ import annotations

import pytest
from backend_process import BackendProcess
from pvrdma_helpers import *  # the lessons' shared helpers (its __all__)

from vrdma.testing.simulated_guest import PAGE

pytestmark = pytest.mark.backend

MR_RANGES = {
    # case: (iova, length, page_offset, npages)
    "iova + length wraps 2^64": (2**64 - PAGE, 2 * PAGE, 0, 2),
    "length 2^64 - 1": (0x10000, 2**64 - 1, 0, 2),
    "length beyond its pages": (0x10000, 3 * PAGE, 0, 2),
    "pages beyond its length": (0x10000, PAGE, 0, 2),
    "page offset pushes it past its last page": (0x10000, 2 * PAGE, 100, 2),
    "page offset of a whole page": (0x10000, PAGE, PAGE, 2),
    "length 0": (0x10000, 0, 0, 1),
    "length above max_mr_size": (0x10000, LIMITS["max_mr_size"] + PAGE, 0, 2),
}


@pytest.mark.parametrize("case", MR_RANGES)
def test_mr_whose_range_wraps_or_disagrees_with_its_pages_is_refused(vm0: Vm, case: str) -> None:
    """CVE-2021-3582: pvrdma_map_to_pdir mremap()ed the MR's first page to the guest's length without checking it
    against the number of pages it had (fixed by "hw/rdma: Fix possible mremap overflow": ROUND_UP(length) must
    equal nchunks * TARGET_PAGE_SIZE).

    Here an MR's [iova, iova + length) must not wrap 2^64, and page_offset + length must need exactly the pages of
    its list: REG_MR is refused with STATUS_INVALID and no MR is created."""
    iova, length, offset, npages = MR_RANGES[case]
    backend, v = vm0.backend, vm0.verbs
    pd = v.alloc_pd()
    pages = v.page_list(v.alloc(npages * PAGE))
    before = objects(backend, "vm0")
    status = status_of(lambda: v.call("VRDMA_CMD_REG_MR", "vrdma_cmd_reg_mr", "vrdma_resp_reg_mr", pd=pd,
                                      access=0xF, iova=iova, length=length, page_offset=offset, pages=pages))
    assert status == STATUS["INVALID"]
    assert objects(backend, "vm0") == before


HIGH_IOVA = 2**64 - 3 * PAGE  # an MR at the top of the address space: [HIGH_IOVA, 2^64 - PAGE)


@pytest.mark.parametrize("case", ["local SGE address wraps", "local SGE length runs past 2^64",
                                  "remote address wraps", "remote range runs past the MR's end",
                                  "remote address below the MR"])
@pytest.mark.parametrize("opcode", ["RDMA_WRITE", "RDMA_READ"])
def test_work_request_whose_range_wraps_is_refused(backend: BackendProcess, pair: tuple[Side, Side], case: str,
                                                   opcode: str) -> None:
    """CVE-2021-3582's arithmetic on the data path: every `addr + len` of an SGE or a remote access is checked in a
    way that cannot wrap. Both MRs sit at the top of the 64-bit address space, where a naive `addr + len <= end`
    wraps and passes.

    A bad local range completes with LOC_PROT_ERR, a bad remote one with REM_ACCESS_ERR; the QP goes to the error
    state; neither VM's memory changes."""
    victim, attacker = pair
    mrs = {}
    for side in (victim, attacker):
        buf = side.verbs.alloc(2 * PAGE)
        side.verbs.memory.write(buf.gpa, pattern(side.name + " high", 2 * PAGE))
        resp = side.verbs.call("VRDMA_CMD_REG_MR", "vrdma_cmd_reg_mr", "vrdma_resp_reg_mr", pd=side.pd, access=0xF,
                               iova=HIGH_IOVA, length=2 * PAGE, page_offset=0, pages=side.verbs.page_list(buf))
        mrs[side.name] = (buf.gpa, int(resp.lkey), int(resp.rkey))
    _, lkey, _ = mrs[attacker.name]
    _, _, rkey = mrs[victim.name]
    local, remote = (HIGH_IOVA, 64, lkey), HIGH_IOVA
    expected = WC["REM_ACCESS_ERR"]
    if case == "local SGE address wraps":
        local, expected = (2**64 - 16, 64, lkey), WC["LOC_PROT_ERR"]
    elif case == "local SGE length runs past 2^64":
        local, expected = (HIGH_IOVA + PAGE, 0xFFFFFFFF, lkey), WC["LOC_PROT_ERR"]
    elif case == "remote address wraps":
        remote = 2**64 - 16
    elif case == "remote range runs past the MR's end":
        remote = 2**64 - PAGE - 32  # 32 bytes left in the MR, 64 asked: the end is past it (and near 2^64)
    else:
        remote = HIGH_IOVA - 32
    attacker.verbs.post_send(attacker.qp, WR[opcode], [local], wr_id=0xBAD, remote_addr=remote, rkey=rkey)
    (done,) = wait_cqes(attacker.verbs, attacker.cq, 1)
    assert (done.wr_id, done.status, done.byte_len) == (0xBAD, expected, 0)
    assert qp_state(attacker.verbs, attacker.qp) == QPS_ERR
    for side in (victim, attacker):
        gpa = mrs[side.name][0]
        assert side.verbs.memory.read(gpa, 2 * PAGE) == pattern(side.name + " high", 2 * PAGE)
        assert side.untouched()


def test_message_whose_length_sum_exceeds_the_limit_is_refused(backend: BackendProcess,
                                                               pair: tuple[Side, Side]) -> None:
    """CVE-2021-3582's class, summed: three 1 GiB SGEs (each inside a 1 GiB MR built from three aliased guest
    pages) make a 3 GiB message, above max_msg_size (2 GiB). The sum is checked before anything is copied: the
    SEND completes with LOC_LEN_ERR, nothing moves and the receive WQE the peer posted is not consumed."""
    victim, attacker = pair
    gib = LIMITS["max_mr_size"]
    big = attacker.verbs.call("VRDMA_CMD_REG_MR", "vrdma_cmd_reg_mr", "vrdma_resp_reg_mr", pd=attacker.pd,
                              access=0xF, iova=0x1_0000_0000, length=gib, page_offset=0,
                              pages=aliased_pages(attacker.verbs, gib // PAGE))
    victim.verbs.post_recv(victim.qp, [(victim.mr.addr, MR_SIZE, victim.mr.lkey)], wr_id=5)
    attacker.verbs.post_send(attacker.qp, WR["SEND"], [(0x1_0000_0000, gib, int(big.lkey))] * 3, wr_id=0xBAD)
    (done,) = wait_cqes(attacker.verbs, attacker.cq, 1)
    assert (done.wr_id, done.status, done.byte_len) == (0xBAD, WC["LOC_LEN_ERR"], 0)
    assert engine(backend, "vm1")["bytes"] == engine(backend, "vm0")["recv_wqes"] == 0
    assert victim.untouched()
