"""CREATE_SRQ, MODIFY_SRQ, QUERY_SRQ and DESTROY_SRQ: depth, stride, limit, references."""

from __future__ import annotations

import pytest
from command_helpers import Bystander, Vm, refused

from vrdma.device import abi
from vrdma.device.status import Status
from vrdma.testing.simulated_guest import PAGE

pytestmark = pytest.mark.backend
SRQ_LIMIT, SRQ_MAX_WR = abi.const("VRDMA_SRQ_LIMIT"), abi.const("VRDMA_SRQ_MAX_WR")


def query(vm: Vm, handle: int) -> tuple[int, int, int]:
    answer = vm.call("QUERY_SRQ", "vrdma_cmd_destroy", "vrdma_resp_query_srq", handle=handle)
    return int(answer.max_wr), int(answer.max_sge), int(answer.srq_limit)


def test_srq_limit_is_set_queried_and_a_qp_on_it_makes_it_busy(vm0: Vm, bystander: Bystander) -> None:
    pd = vm0.verbs.alloc_pd()
    srq = vm0.verbs.create_srq(pd, depth=32, max_sge=4, limit=4)
    assert query(vm0, srq.handle) == (32, 4, 4)
    vm0.call("MODIFY_SRQ", "vrdma_cmd_modify_srq", handle=srq.handle, attr_mask=SRQ_LIMIT, srq_limit=16)
    assert query(vm0, srq.handle)[2] == 16
    cq = vm0.verbs.create_cq(16)
    qp = vm0.verbs.create_qp(pd, cq, cq, srq=srq)
    assert refused(lambda: vm0.call("DESTROY_SRQ", "vrdma_cmd_destroy", handle=srq.handle), vm0,
                   r"SRQ .* is used by 1 QPs") == Status.BUSY
    vm0.call("DESTROY_QP", "vrdma_cmd_destroy", handle=qp.handle)
    vm0.call("DESTROY_SRQ", "vrdma_cmd_destroy", handle=srq.handle)


@pytest.mark.parametrize(("case", "expected"), [
    ("depth not a power of two", Status.INVALID), ("stride too small for its SGEs", Status.INVALID),
    ("limit not below depth", Status.INVALID), ("ring one page short", Status.INVALID),
    ("PD never issued", Status.INVALID)])
def test_bad_srq_is_refused(vm0: Vm, bystander: Bystander, case: str, expected: Status) -> None:
    pd = vm0.verbs.alloc_pd()
    buf = vm0.verbs.alloc(PAGE + 16 * 128)
    fields: dict[str, object] = {"ucontext": vm0.verbs.ucontext, "pd": pd, "depth": 16, "stride": 128,
                                 "max_sge": 4, "srq_limit": 0, "ring": vm0.verbs.page_list(buf)}
    fields.update({
        "depth not a power of two": {"depth": 24},
        "stride too small for its SGEs": {"stride": 32, "max_sge": 8},
        "limit not below depth": {"srq_limit": 16},
        "ring one page short": {"ring": vm0.verbs.page_list(buf, npages=1)},
        "PD never issued": {"pd": 0x7777},
    }[case])
    because = {
        "depth not a power of two": r"SRQ depth 24",
        "stride too small for its SGEs": r"SRQ stride 32 for 8 SGEs",
        "limit not below depth": r"SRQ limit 16 is not below its depth 16",
        "ring one page short": r"the SRQ ring spans 2 pages, the page list has 1",
        "PD never issued": r"no PD 0x7777",
    }[case]
    assert refused(lambda: vm0.call("CREATE_SRQ", "vrdma_cmd_create_srq", "vrdma_resp_create_srq",
                                    **fields), vm0, because) == expected


@pytest.mark.parametrize(("mask", "limit", "expected", "because"), [
    (SRQ_MAX_WR, 0, Status.NOT_SUPPORTED, r"resizing an SRQ is not supported"),
    (0x80, 0, Status.INVALID, r"unknown SRQ attribute bits 0x80"),
    (SRQ_LIMIT, 16, Status.INVALID, r"SRQ limit 16 is not below 16")])
def test_bad_srq_modification_is_refused(vm0: Vm, bystander: Bystander, mask: int, limit: int,
                                         expected: Status, because: str) -> None:
    srq = vm0.verbs.create_srq(vm0.verbs.alloc_pd(), depth=16)
    assert refused(lambda: vm0.call("MODIFY_SRQ", "vrdma_cmd_modify_srq", handle=srq.handle, attr_mask=mask,
                                    srq_limit=limit), vm0, because) == expected
    assert query(vm0, srq.handle)[2] == 0  # unchanged
