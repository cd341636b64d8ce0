"""REG_MR and DEREG_MR: page lists inside guest RAM, access rights, lengths, keys."""

from __future__ import annotations

import pytest
from backend_process import BackendProcess
from command_helpers import Bystander, Vm, refused

from vrdma.device import abi
from vrdma.device.params import DEFAULT_LIMITS
from vrdma.device.status import Status
from vrdma.testing.simulated_guest import PAGE

pytestmark = pytest.mark.backend
LOCAL_WRITE, REMOTE_WRITE = abi.const("VRDMA_ACCESS_LOCAL_WRITE"), abi.const("VRDMA_ACCESS_REMOTE_WRITE")


def reg(vm: Vm, pd: int, length: int, overrides: dict[str, object] | None = None) -> object:
    buf = vm.verbs.alloc(max(length, PAGE))
    fields: dict[str, object] = {"pd": pd, "access": 0xF, "iova": buf.gpa, "length": length, "page_offset": 0,
                                 "pages": vm.verbs.page_list(buf)}
    fields.update(overrides or {})
    return vm.call("REG_MR", "vrdma_cmd_reg_mr", "vrdma_resp_reg_mr", **fields)


def test_keys_name_their_slot_and_are_not_guessable_from_each_other(vm0: Vm, bystander: Bystander,
                                                                     backend: BackendProcess) -> None:
    pd = vm0.verbs.alloc_pd()
    mrs = [vm0.verbs.reg_mr(pd, 3 * PAGE) for _ in range(4)]
    slot, shift = DEFAULT_LIMITS.max_mr - 1, abi.const("VRDMA_KEY_SLOT_SHIFT")
    for mr in mrs:
        assert mr.lkey != mr.rkey and (mr.lkey >> shift) & slot == (mr.rkey >> shift) & slot == mr.handle & slot
    assert len({mr.lkey >> 20 for mr in mrs}) == 4
    assert backend.counters("vm0")["objects"]["mr"] == 4
    for mr in mrs:
        vm0.call("DEREG_MR", "vrdma_cmd_destroy", handle=mr.handle)
    assert refused(lambda: vm0.call("DEREG_MR", "vrdma_cmd_destroy", handle=mrs[0].handle), vm0,
                   r"DEREG_MR: no MR") == Status.INVALID


@pytest.mark.parametrize("case", ["remote write without local write", "unknown access bit", "length 0",
                                  "length past max_mr_size", "page offset of a page", "iova + length wraps",
                                  "page list one page short", "page list of three levels", "page list unaligned",
                                  "reserved field", "PD never issued"])
def test_bad_registration_is_refused(vm0: Vm, bystander: Bystander, case: str) -> None:
    pd = vm0.verbs.alloc_pd()
    overrides: dict[str, object] = {
        "remote write without local write": {"access": REMOTE_WRITE},
        "unknown access bit": {"access": 0x20 | LOCAL_WRITE},
        "length 0": {"length": 0},
        "length past max_mr_size": {"length": DEFAULT_LIMITS.max_mr_size + 1},
        "page offset of a page": {"page_offset": PAGE},
        "iova + length wraps": {"iova": 2**64 - 8},
        "page list one page short": {"length": 2 * PAGE},
        "page list of three levels": {"pages": {"addr": 0, "npages": 1, "levels": 3}},
        "page list unaligned": {"pages": {"addr": 8, "npages": 1, "levels": 1}},
        "reserved field": {"reserved": 1},
        "PD never issued": {"pd": 0x7777},
    }[case]
    because = {
        "remote write without local write": r"remote write or atomic access needs local write access",
        "unknown access bit": r"unknown access flags 0x21",
        "length 0": r"MR length 0 \(1 to",
        "length past max_mr_size": rf"MR length {DEFAULT_LIMITS.max_mr_size + 1} \(1 to {DEFAULT_LIMITS.max_mr_size}",
        "page offset of a page": r"MR at 0x3000 \(page offset 4096\)",
        "iova + length wraps": r"MR at 0xfffffffffffffff8 \(page offset 0\) of 4096 bytes",
        "page list one page short": r"the MR spans 2 pages, the page list has 1",
        "page list of three levels": r"page list of 1 pages with 3 levels",
        "page list unaligned": r"page list address 0x8 is not aligned",
        "reserved field": r"reserved field of REG_MR is not zero",
        "PD never issued": r"no PD 0x7777",
    }[case]
    assert refused(lambda: reg(vm0, pd, PAGE, overrides), vm0, because) == Status.INVALID


def test_a_page_list_naming_memory_outside_the_guest_is_refused(vm0: Vm, bystander: Bystander) -> None:
    pd = vm0.verbs.alloc_pd()
    outside = vm0.verbs.memory.size + 0x100000
    pages = vm0.verbs.page_list(vm0.verbs.alloc(PAGE), first_page=outside, npages=1)
    assert refused(lambda: reg(vm0, pd, PAGE, {"pages": pages}), vm0,
                   rf"page 0 at {outside:#x} is not a page of guest RAM") == Status.INVALID
