"""CREATE_CQ, MODIFY_CQ and DESTROY_CQ: ring sizes, doorbell slots, moderation, references."""

from __future__ import annotations

import pytest
from backend_process import BackendProcess
from command_helpers import Bystander, Vm, refused

from vrdma.device import abi
from vrdma.device.params import DEFAULT_LIMITS
from vrdma.device.status import Status
from vrdma.testing.simulated_guest import PAGE

pytestmark = pytest.mark.backend
CQE = abi.sizeof("vrdma_cqe")


def create(vm: Vm, entries: int, npages: int | None = None, **overrides: object) -> object:
    buf = vm.verbs.alloc(PAGE + entries * CQE if entries <= 1 << 16 else PAGE)
    ring = vm.verbs.page_list(buf, npages=npages)
    fields: dict[str, object] = {"ucontext": vm.verbs.ucontext, "entries": entries, "ring": ring}
    fields.update(overrides)
    return vm.call("CREATE_CQ", "vrdma_cmd_create_cq", "vrdma_resp_create_cq", **fields)


def test_cqs_take_distinct_doorbell_slots_and_give_them_back(vm0: Vm, bystander: Bystander,
                                                            backend: BackendProcess) -> None:
    cqs = [vm0.verbs.create_cq(16) for _ in range(3)]
    page = min(cq.db for cq in cqs) // abi.const("VRDMA_DB_SLOTS")
    assert len({cq.db for cq in cqs}) == 3 and page == vm0.verbs.doorbell_page
    assert all(0 < cq.db - page * abi.const("VRDMA_DB_SLOTS") < abi.const("VRDMA_DB_SLOT_ALIVE") for cq in cqs)
    vm0.call("MODIFY_CQ", "vrdma_cmd_modify_cq", handle=cqs[0].handle, cq_count=8, cq_period=100)
    vm0.call("DESTROY_CQ", "vrdma_cmd_destroy", handle=cqs[1].handle)
    assert vm0.verbs.create_cq(16).db == cqs[1].db
    assert backend.counters("vm0")["objects"]["cq"] == 3


def test_a_cq_used_by_a_qp_is_busy(vm0: Vm, bystander: Bystander) -> None:
    pd = vm0.verbs.alloc_pd()
    cq = vm0.verbs.create_cq(16)
    qp = vm0.verbs.create_qp(pd, cq, cq)
    assert refused(lambda: vm0.call("DESTROY_CQ", "vrdma_cmd_destroy", handle=cq.handle), vm0,
                   r"is used by 2 QPs") == Status.BUSY
    vm0.call("DESTROY_QP", "vrdma_cmd_destroy", handle=qp.handle)
    vm0.call("DESTROY_CQ", "vrdma_cmd_destroy", handle=cq.handle)


@pytest.mark.parametrize("case", ["0 entries", "not a power of two", "past max_cqe", "ring one page short",
                                  "context never issued"])
def test_bad_cq_is_refused(vm0: Vm, bystander: Bystander, case: str) -> None:
    entries, npages, overrides, expected, because = {
        "0 entries": (0, None, {}, Status.INVALID, r"CQ of 0 entries \(a power of two"),
        "not a power of two": (48, None, {}, Status.INVALID, r"CQ of 48 entries \(a power of two"),
        "past max_cqe": (DEFAULT_LIMITS.max_cqe * 2, 1, {}, Status.INVALID,
                         rf"CQ of {DEFAULT_LIMITS.max_cqe * 2} entries \(a power of two up to "
                         rf"{DEFAULT_LIMITS.max_cqe}"),
        "ring one page short": (64, 1, {}, Status.INVALID, r"the CQ ring spans 2 pages, the page list has 1"),
        "context never issued": (16, None, {"ucontext": 0x7777}, Status.INVALID, r"no user context 0x7777"),
    }[case]
    assert refused(lambda: create(vm0, entries, npages, **overrides), vm0, because) == expected


def test_modify_and_destroy_of_no_cq_are_refused(vm0: Vm, bystander: Bystander) -> None:
    assert refused(lambda: vm0.call("MODIFY_CQ", "vrdma_cmd_modify_cq", handle=0x7777, cq_count=1), vm0,
                   r"MODIFY_CQ: no CQ 0x7777") == \
        Status.INVALID
    assert refused(lambda: vm0.call("DESTROY_CQ", "vrdma_cmd_destroy", handle=0x7777), vm0,
                   r"DESTROY_CQ: no CQ 0x7777") == Status.INVALID
