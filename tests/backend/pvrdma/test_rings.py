"""pvrdma lesson 2, ring page counts and sizes (CVE-2018-20125, CVE-2021-3607, CVE-2023-1544): page lists that do
not describe the ring they claim, impossible ring sizes, and the per-VM bound on translated pages."""

from __future__ import annotations

from typing import Any

import pytest
from backend_process import BackendProcess
from pvrdma_helpers import *  # the lessons' shared helpers (its __all__)

from vrdma.testing.simulated_guest import PAGE, PBL, SimVerbs

pytestmark = pytest.mark.backend

RING_PAGE_LISTS = ["no pages", "one page short", "one page too many", "2^32 - 1 pages", "one level of 513 pages",
                   "three levels", "zero levels", "list not page-aligned"]


def _spoil_ring(ring: dict[str, int], case: str) -> dict[str, int]:
    spoiled = dict(ring)
    if case == "no pages":
        spoiled["npages"] = 0
    elif case == "one page short":
        spoiled["npages"] -= 1
    elif case == "one page too many":
        spoiled["npages"] += 1
    elif case == "2^32 - 1 pages":
        spoiled.update(npages=0xFFFFFFFF, levels=2)
    elif case == "one level of 513 pages":
        spoiled.update(npages=PBL + 1, levels=1)
    elif case == "three levels":
        spoiled["levels"] = 3
    elif case == "zero levels":
        spoiled["levels"] = 0
    else:
        spoiled["addr"] += 8
    return spoiled


@pytest.mark.parametrize("case", RING_PAGE_LISTS)
@pytest.mark.parametrize("kind", ["CQ", "QP", "SRQ"])
def test_ring_whose_page_list_does_not_match_its_size_is_refused(vm0: Vm, kind: str,
                                                                 case: str) -> None:
    """CVE-2018-20125: pvrdma_ring_init trusted the page count a guest gave for a CQ/QP ring (NULL dereference or a
    huge allocation; fixed by "pvrdma: check number of pages when creating rings"). CVE-2021-3607: a ring of zero
    pages (fixed by "pvrdma: Ensure correct input on ring init": "Check the guest passed a non zero page count").
    CVE-2023-1544: a page count larger than one page table holds, read out of bounds later.

    Here a ring's page list must describe exactly the pages its size needs, with 1 or 2 levels, at an aligned
    address: anything else is refused with STATUS_INVALID, creates nothing, and the backend's RSS does not jump."""
    backend, v = vm0.backend, vm0.verbs
    pd, cq = v.alloc_pd(), v.create_cq(16)
    if kind == "CQ":
        fields = create_cq_fields(v, 1024)  # 9 pages: header and 1024 CQEs
        command = CQ
    elif kind == "QP":
        fields = create_qp_fields(v, pd, cq.handle)
        command = QP
    else:
        fields = create_srq_fields(v, pd, depth=256)
        command = SRQ
    before, memory = objects(backend, "vm0"), rss(backend)
    fields["ring"] = _spoil_ring(fields["ring"], case)
    assert status_of(lambda: v.call(*command, **fields)) == STATUS["INVALID"]
    assert objects(backend, "vm0") == before
    assert rss(backend) - memory < 4 << 20


@pytest.mark.parametrize(("kind", "field", "value"), [
    ("CQ", "entries", 0), ("CQ", "entries", 48), ("CQ", "entries", LIMITS["max_cqe"] * 2), ("CQ", "entries", 1 << 31),
    ("QP", "sq_depth", 0), ("QP", "sq_depth", 96), ("QP", "sq_depth", LIMITS["max_qp_wr"] * 2),
    ("QP", "rq_depth", 1 << 31), ("QP", "sq_stride", 8192), ("QP", "rq_stride", 16),
    ("QP", "sq_offset", 0), ("QP", "sq_offset", PAGE + 8), ("QP", "rq_offset", PAGE),
    ("SRQ", "depth", 0), ("SRQ", "depth", 1 << 31), ("SRQ", "stride", 8192),
])
def test_ring_of_an_impossible_size_is_refused(vm0: Vm, kind: str, field: str, value: int) -> None:
    """CVE-2018-20125 / CVE-2023-1544, the sizes: pvrdma computed a ring's extent from guest numbers it did not
    bound. Here depths and entry counts are powers of two within the advertised limits, strides powers of two that
    fit a page, the queues of a QP page-aligned after its header page and apart from each other: a ring breaking any
    rule is refused with STATUS_INVALID and nothing is created. Where the extent asked for is small enough to back
    with guest memory, the page list matches it exactly, so only the size rule can be what refuses it."""
    backend, v = vm0.backend, vm0.verbs
    pd, cq = v.alloc_pd(), v.create_cq(16)
    if kind == "CQ":
        fields = create_cq_fields(v, 16)
        command = CQ
    elif kind == "QP":
        fields = create_qp_fields(v, pd, cq.handle)
        command = QP
    else:
        fields = create_srq_fields(v, pd)
        command = SRQ
    fields[field] = value
    if kind == "CQ":
        extent = PAGE + fields["entries"] * CQE
    elif kind == "QP":
        extent = max(fields["sq_offset"] + fields["sq_depth"] * fields["sq_stride"],
                     fields["rq_offset"] + fields["rq_depth"] * fields["rq_stride"])
    else:
        extent = PAGE + fields["depth"] * fields["stride"]
    if 0 < extent <= 256 * PAGE:
        fields["ring"] = v.page_list(v.alloc(extent))
    before = objects(backend, "vm0")
    assert status_of(lambda: v.call(*command, **fields)) == STATUS["INVALID"]
    assert objects(backend, "vm0") == before


QP_RING_GAPS = ["gap before the send queue", "gap before the receive queue", "unused receive offset with an SRQ"]


@pytest.mark.parametrize("case", QP_RING_GAPS)
def test_qp_ring_larger_than_its_queues_is_refused(backend: BackendProcess, case: str) -> None:
    """CVE-2023-1544: "a crafted guest driver [could] allocate and initialize a huge number of page tables to be
    used as a ring" (fixed by bounding a ring's pages by what one page table holds); CVE-2018-20125: excessive
    allocation when creating QP/CQ rings.

    A QP's queues here need 2 pages after the header (64 x 64-byte send WQEs, 64 x 32-byte receive WQEs), but an
    offset puts a gigabyte of unused pages between them; the page list (262144 entries naming one guest page, three
    pages of guest RAM in all) matches that inflated extent. Expected: refused with STATUS_INVALID, since a QP ring
    needs no more pages than its header and its queues (the provider lays them out back to back); and eight tries
    leave the backend's RSS where it was (each accepted one costs 4 MiB of translated page tables)."""
    with backend.frontend("vm0") as fe:
        fe.start()
        v = SimVerbs(fe, backend.directory / "vm0.doorbell")
        pd, cq = v.alloc_pd(), v.create_cq(16)
        npages = PBL * PBL
        fields = create_qp_fields(v, pd, cq.handle, max_send_sge=0, max_recv_sge=0)
        fields.update(sq_stride=64, rq_stride=32, ring=aliased_pages(v, npages))
        if case == "gap before the send queue":
            fields.update(sq_offset=(npages - 2) * PAGE, rq_offset=(npages - 1) * PAGE)
        elif case == "gap before the receive queue":
            fields.update(sq_offset=PAGE, rq_offset=(npages - 1) * PAGE)
        else:
            srq = v.create_srq(pd)
            fields.update(srq=srq.handle, rq_depth=0, rq_stride=0, max_recv_sge=0, sq_offset=PAGE,
                          rq_offset=npages * PAGE)
        before, memory = objects(backend, "vm0"), rss(backend)
        statuses = [status_of(lambda: create_qp(v, fields)) for _ in range(8)]
        assert statuses == [STATUS["INVALID"]] * 8
        assert objects(backend, "vm0") == before
        assert rss(backend) - memory < 4 << 20


def test_translated_pages_of_a_vm_are_bounded(backend: BackendProcess) -> None:
    """CVE-2023-1544's lesson for MRs: each page of an MR's list costs the backend a translation (16 bytes) whatever
    guest page it names, so three guest pages can ask for 4 MiB of backend memory per 1 GiB MR, and max_mr of them
    for 16 GiB. A VM's translated pages are bounded as an HCA's translation table is (max_translated_pages): MRs
    past it are refused with STATUS_NO_RESOURCES, the backend's RSS grows by at most the budget's worth, and a
    deregistration gives its pages back."""
    budget, per_mr = LIMITS["max_translated_pages"], LIMITS["max_mr_size"] // PAGE
    with backend.frontend("vm0") as fe:
        fe.start()
        v = SimVerbs(fe, backend.directory / "vm0.doorbell")
        pd, pages = v.alloc_pd(), aliased_pages(v, per_mr)
        memory = rss(backend)

        def reg() -> Any:
            return v.call(*MR, pd=pd, access=0xF, iova=0x1_0000_0000, length=per_mr * PAGE, page_offset=0,
                          pages=pages)

        mrs = [reg() for _ in range(budget // per_mr)]
        statuses = [status_of(reg) for _ in range(8)]
        assert statuses == [STATUS["NO_RESOURCES"]] * 8
        assert objects(backend, "vm0")["mr"] == len(mrs)
        assert rss(backend) - memory < budget * 16 + (8 << 20)
        v.call("VRDMA_CMD_DEREG_MR", "vrdma_cmd_destroy", "vrdma_resp_hdr", handle=mrs.pop().handle)
        mrs.append(reg())
        assert status_of(reg) == STATUS["NO_RESOURCES"]
        # A fast-registration MR (the guest kernel's) takes its max_pages from the same budget when it is allocated
        # (before any REG_MR work request maps it), and gives them back when it goes.
        kernel = SimVerbs(fe, backend.directory / "vm0.doorbell", kernel=True)
        kernel_pd = kernel.alloc_pd()
        assert status_of(lambda: kernel.alloc_mr(kernel_pd, 1)) == STATUS["NO_RESOURCES"]
        v.call("VRDMA_CMD_DEREG_MR", "vrdma_cmd_destroy", "vrdma_resp_hdr", handle=mrs.pop().handle)
        fast, _ = kernel.alloc_mr(kernel_pd, 1)
        assert status_of(reg) == STATUS["NO_RESOURCES"], "one page short: the fast-registration MR holds it"
        kernel.call("VRDMA_CMD_DEREG_MR", "vrdma_cmd_destroy", "vrdma_resp_hdr", handle=fast)
        mrs.append(reg())
        assert objects(backend, "vm0")["mr"] == len(mrs)
