"""ALLOC_UCONTEXT, DEALLOC_UCONTEXT, ALLOC_PD and DEALLOC_PD: doorbell pages and protection domains."""

from __future__ import annotations

import pytest
from backend_process import BackendProcess
from command_helpers import Bystander, Vm, refused

from vrdma.device import abi
from vrdma.device.objects import OBJECT_KINDS
from vrdma.device.params import DEFAULT_LIMITS
from vrdma.device.status import Status
from vrdma.testing.simulated_guest import SimVerbs

pytestmark = pytest.mark.backend


def alloc_ucontext(vm: Vm) -> tuple[int, int]:
    answer = vm.call("ALLOC_UCONTEXT", "vrdma_cmd_alloc_ucontext", "vrdma_resp_alloc_ucontext")
    return int(answer.handle), int(answer.doorbell_page)


def test_contexts_get_distinct_pages_and_a_freed_page_is_given_again(vm0: Vm, bystander: Bystander,
                                                                     backend: BackendProcess) -> None:
    first = vm0.verbs.ucontext, vm0.verbs.doorbell_page
    second = alloc_ucontext(vm0)
    assert second[1] != first[1] and second[0] != first[0]
    vm0.call("DEALLOC_UCONTEXT", "vrdma_cmd_destroy", handle=second[0])
    assert alloc_ucontext(vm0)[1] == second[1]
    assert backend.counters("vm0")["doorbell_pages"] == sorted([first[1], second[1]])


def test_doorbell_pages_run_out_with_no_resources(vm0: Vm, bystander: Bystander) -> None:
    # Page 0 is the region's header, page 1 the kernel's, and vm0 holds one page already (vm1 has a region of its
    # own): the user contexts get every page from 2 on, and no more.
    first = abi.const("VRDMA_FIRST_USER_DOORBELL_PAGE")
    pages = [vm0.verbs.doorbell_page] + [alloc_ucontext(vm0)[1]
                                         for _ in range(DEFAULT_LIMITS.doorbell_pages - first - 1)]
    assert sorted(pages) == list(range(first, DEFAULT_LIMITS.doorbell_pages))
    assert refused(lambda: alloc_ucontext(vm0), vm0, r"all \d+ user contexts in use") == Status.NO_RESOURCES


def test_a_context_takes_doorbell_pages_as_its_queues_need_them_and_gives_all_back(
        vm0: Vm, bystander: Bystander, backend: BackendProcess) -> None:
    slots, per_page = abi.const("VRDMA_DB_SLOTS"), abi.const("VRDMA_DB_SLOT_ALIVE") - 1
    ring = vm0.verbs.page_list(vm0.verbs.alloc(2 * 4096))  # one ring every CQ here shares: none completes
    cqs = [vm0.call("CREATE_CQ", "vrdma_cmd_create_cq", "vrdma_resp_create_cq", ucontext=vm0.verbs.ucontext,
                    entries=1, ring=ring) for _ in range(2 * per_page + 1)]
    pages = sorted({int(cq.db_index) // slots for cq in cqs})
    assert len(pages) == 3 and pages[0] == vm0.verbs.doorbell_page
    assert len({int(cq.db_index) for cq in cqs}) == len(cqs)
    assert all(0 < int(cq.db_index) % slots < abi.const("VRDMA_DB_SLOT_ALIVE") for cq in cqs)
    assert backend.counters("vm0")["doorbell_pages"] == pages
    other_page = alloc_ucontext(vm0)[1]  # the next free page, not one of the three
    assert other_page not in pages
    assert refused(lambda: vm0.call("DEALLOC_UCONTEXT", "vrdma_cmd_destroy",
                                    handle=vm0.verbs.ucontext), vm0,
                   rf"still has 0 PDs and {len(cqs)} queues") == Status.BUSY
    for cq in cqs:
        vm0.call("DESTROY_CQ", "vrdma_cmd_destroy", handle=cq.handle)
    vm0.call("DEALLOC_UCONTEXT", "vrdma_cmd_destroy", handle=vm0.verbs.ucontext)
    assert backend.counters("vm0")["doorbell_pages"] == [other_page]
    assert alloc_ucontext(vm0)[1] == min(pages)  # the lowest free page comes first


def test_a_context_with_a_pd_and_a_pd_with_an_mr_are_busy(vm0: Vm, bystander: Bystander) -> None:
    pd = vm0.verbs.alloc_pd()
    mr = vm0.verbs.reg_mr(pd, 4096)
    assert refused(lambda: vm0.call("DEALLOC_PD", "vrdma_cmd_destroy", handle=pd), vm0,
                   r"PD .* is used by 1 objects") == Status.BUSY
    assert refused(lambda: vm0.call("DEALLOC_UCONTEXT", "vrdma_cmd_destroy",
                                    handle=vm0.verbs.ucontext), vm0, r"still has 1 PDs and 0 queues") == Status.BUSY
    vm0.call("DEREG_MR", "vrdma_cmd_destroy", handle=mr.handle)
    vm0.call("DEALLOC_PD", "vrdma_cmd_destroy", handle=pd)
    vm0.call("DEALLOC_UCONTEXT", "vrdma_cmd_destroy", handle=vm0.verbs.ucontext)


def test_thousand_pds_come_and_go(vm0: Vm, bystander: Bystander, backend: BackendProcess) -> None:
    before = backend.counters("vm0")["by_opcode"]
    for _ in range(1000):
        vm0.call("DEALLOC_PD", "vrdma_cmd_destroy", handle=vm0.verbs.alloc_pd())
    counters = backend.counters("vm0")
    assert counters["objects"]["pd"] == 0
    for opcode in ("ALLOC_PD", "DEALLOC_PD"):
        assert counters["by_opcode"][opcode] - before.get(opcode, 0) == 1000, opcode


@pytest.mark.parametrize("case", ["handle never issued", "handle freed", "handle of the other VM", "reserved",
                                  "generation bit flipped", "PD of a context never issued", "context handle 0"])
def test_bad_handles_are_refused(vm0: Vm, bystander: Bystander, case: str) -> None:
    freed = vm0.verbs.alloc_pd()
    vm0.call("DEALLOC_PD", "vrdma_cmd_destroy", handle=freed)
    theirs = bystander.verbs.alloc_pd()
    bystander.objects["pd"] += 1  # type: ignore[index]
    live = vm0.verbs.alloc_pd()
    if case == "PD of a context never issued":
        assert refused(lambda: vm0.call("ALLOC_PD", "vrdma_cmd_alloc_pd", "vrdma_resp_alloc_pd",
                                        ucontext=0x7777), vm0, r"ALLOC_PD: no user context 0x7777") == \
            Status.INVALID
        return
    if case == "context handle 0":
        assert refused(lambda: vm0.call("DEALLOC_UCONTEXT", "vrdma_cmd_destroy", handle=0), vm0,
                       r"no user context 0x0") == Status.INVALID
        return
    fields = {"handle never issued": {"handle": 0x12345}, "handle freed": {"handle": freed},
              "handle of the other VM": {"handle": theirs}, "reserved": {"handle": live, "reserved": 1},
              "generation bit flipped": {"handle": live ^ 1 << 20}}[case]
    because = r"reserved field is 1" if case == "reserved" else rf"DEALLOC_PD: no PD {fields['handle']:#x}$"
    assert refused(lambda: vm0.call("DEALLOC_PD", "vrdma_cmd_destroy", **fields), vm0, because) == Status.INVALID
    vm0.call("DEALLOC_PD", "vrdma_cmd_destroy", handle=live)  # the refusals left it in place


def test_objects_are_per_vm_and_a_new_connection_starts_from_nothing(backend: BackendProcess) -> None:
    closed = backend.connection("vm0")["closed"]
    with backend.frontend("vm0") as fe:
        fe.start()
        SimVerbs(fe, backend.directory / "vm0.doorbell").alloc_pd()
        assert backend.counters("vm0")["objects"]["pd"] == 1 and backend.counters("vm1")["objects"]["pd"] == 0
    backend.wait_for_closed("vm0", closed + 1)
    with backend.frontend("vm0") as again:
        again.start()
        assert backend.counters("vm0")["objects"] == dict.fromkeys(OBJECT_KINDS, 0)
    backend.wait_for_closed("vm0", closed + 2)
