"""CREATE_QP, MODIFY_QP, QUERY_QP and DESTROY_QP: queue layouts, the state table, attributes, references."""

from __future__ import annotations

from typing import Any

import pytest
from command_helpers import GID, Bystander, Vm, refused

from vrdma.device import abi
from vrdma.device.params import DEFAULT_LIMITS
from vrdma.device.qp_states import QpState
from vrdma.device.status import Status
from vrdma.testing.simulated_guest import PAGE

pytestmark = pytest.mark.backend


def m(*names: str) -> int:
    return sum(abi.const(f"VRDMA_QP_{name}") for name in names)


def create_fields(vm: Vm, pd: int, cq: int) -> dict[str, Any]:
    """A good RC QP of 16 WQEs each way (2 SGEs, 64 inline bytes), the receive queue on the page after the send
    queue's."""
    buf = vm.verbs.alloc(3 * PAGE)
    return {"ucontext": vm.verbs.ucontext, "pd": pd, "send_cq": cq, "recv_cq": cq, "srq": 0,
            "qp_type": abi.const("VRDMA_QPT_RC"), "sq_depth": 16, "rq_depth": 16, "sq_stride": 128,
            "rq_stride": 64, "sq_offset": PAGE, "rq_offset": 2 * PAGE, "max_send_sge": 2, "max_recv_sge": 2,
            "max_inline_data": 64, "ring": vm.verbs.page_list(buf)}


def create(vm: Vm, fields: dict[str, Any]) -> Any:
    return vm.call("CREATE_QP", "vrdma_cmd_create_qp", "vrdma_resp_create_qp", **fields)


def modify(vm: Vm, handle: int, mask: int, **attr: int | list[int]) -> Any:
    return vm.call("MODIFY_QP", "vrdma_cmd_modify_qp", handle=handle, attr_mask=mask, attr=attr)


def state(vm: Vm, handle: int) -> int:
    return int(vm.call("QUERY_QP", "vrdma_cmd_destroy", "vrdma_resp_query_qp", handle=handle).attr.qp_state)


def test_a_qp_walks_to_rts_and_reports_its_attributes(vm0: Vm, bystander: Bystander) -> None:
    vm0.verbs.add_gid(0, GID["vm0"])
    pd, cq = vm0.verbs.alloc_pd(), vm0.verbs.create_cq(16)
    qp = vm0.verbs.create_qp(pd, cq, cq)
    assert qp.qpn & (DEFAULT_LIMITS.max_qp - 1) == qp.handle & (DEFAULT_LIMITS.max_qp - 1) and qp.qpn >> 24 == 0
    assert state(vm0, qp.handle) == QpState.RESET
    vm0.verbs.connect(qp, qp.qpn, GID["vm0"])
    answer = vm0.call("QUERY_QP", "vrdma_cmd_destroy", "vrdma_resp_query_qp", handle=qp.handle).attr
    assert (answer.qp_state, answer.dest_qp_num, answer.timeout, answer.max_send_wr) == \
        (QpState.RTS, qp.qpn, 14, qp.sq.depth)
    assert bytes(answer.dgid) == GID["vm0"]
    modify(vm0, qp.handle, m("STATE"), qp_state=QpState.ERR)
    assert state(vm0, qp.handle) == QpState.ERR
    vm0.call("DESTROY_QP", "vrdma_cmd_destroy", handle=qp.handle)
    assert refused(lambda: state(vm0, qp.handle), vm0, r"QUERY_QP: no QP") == Status.INVALID


def test_reset_to_rtr_in_one_modify_takes_the_attributes_of_both_transitions(vm0: Vm, bystander: Bystander) -> None:
    """What a driver that keeps RESET->INIT to itself sends: one MODIFY_QP with INIT's and RTR's attributes. The
    device checks it as the two transitions: without an attribute of either it is refused, and the QP stays put."""
    vm0.verbs.add_gid(0, GID["vm0"])
    pd, cq = vm0.verbs.alloc_pd(), vm0.verbs.create_cq(16)
    qp = vm0.verbs.create_qp(pd, cq, cq)
    init = m("PKEY_INDEX", "PORT", "ACCESS_FLAGS")
    rtr = m("STATE", "AV", "PATH_MTU", "DEST_QPN", "RQ_PSN", "MAX_DEST_RD_ATOMIC", "MIN_RNR_TIMER")
    attrs: dict[str, int | list[int]] = {"qp_state": QpState.RTR, "pkey_index": 0, "port_num": 1,
                                         "qp_access_flags": abi.const("VRDMA_ACCESS_REMOTE_WRITE"), "path_mtu": 3,
                                         "dest_qp_num": qp.qpn, "rq_psn": 0, "max_dest_rd_atomic": 1,
                                         "min_rnr_timer": 12, "dgid": list(GID["vm0"]), "sgid_index": 0}
    for missing in (m("PORT"), m("ACCESS_FLAGS"), m("DEST_QPN"), m("AV")):
        assert refused(lambda missing=missing: modify(vm0, qp.handle, (init | rtr) & ~missing, **attrs), vm0,
                       rf"RESET -> RTR requires attributes {missing:#x}$") == Status.INVALID
        assert state(vm0, qp.handle) == QpState.RESET
    modify(vm0, qp.handle, init | rtr, **attrs)
    answer = vm0.call("QUERY_QP", "vrdma_cmd_destroy", "vrdma_resp_query_qp", handle=qp.handle).attr
    assert (answer.qp_state, answer.port_num, answer.qp_access_flags, answer.dest_qp_num) == \
        (QpState.RTR, 1, abi.const("VRDMA_ACCESS_REMOTE_WRITE"), qp.qpn)
    assert refused(lambda: modify(vm0, qp.handle, init | rtr, **attrs), vm0,
                   r"no transition from RTR to RTR") == Status.INVALID


@pytest.mark.parametrize(("case", "expected"), [
    ("XRC initiator with a receive queue", Status.INVALID), ("XRC target of a user context", Status.INVALID),
    ("XRC domain on an RC QP", Status.INVALID), ("no such type", Status.NOT_SUPPORTED),
    ("GSI QP of a user context", Status.INVALID), ("send depth past max_qp_wr", Status.INVALID),
    ("send SGEs past the device's", Status.INVALID), ("inline data past the device's", Status.INVALID),
    ("send stride smaller than a WQE", Status.INVALID), ("receive depth not a power of two", Status.INVALID),
    ("an SRQ and a receive queue", Status.INVALID), ("CQ never issued", Status.INVALID),
    ("CQ of another context", Status.INVALID), ("ring one page short", Status.INVALID),
    ("reserved bytes", Status.INVALID)])
def test_bad_qp_is_refused(vm0: Vm, bystander: Bystander, case: str, expected: Status) -> None:
    pd, cq = vm0.verbs.alloc_pd(), vm0.verbs.create_cq(16)
    fields = create_fields(vm0, pd, cq.handle)
    if case == "CQ of another context":
        other = vm0.call("ALLOC_UCONTEXT", "vrdma_cmd_alloc_ucontext", "vrdma_resp_alloc_ucontext")
        buf = vm0.verbs.alloc(PAGE + 16 * abi.sizeof("vrdma_cqe"))
        theirs = vm0.call("CREATE_CQ", "vrdma_cmd_create_cq", "vrdma_resp_create_cq", ucontext=other.handle,
                          entries=16, ring=vm0.verbs.page_list(buf))
        fields["recv_cq"] = theirs.handle
    elif case == "an SRQ and a receive queue":
        fields["srq"] = vm0.verbs.create_srq(pd).handle
    else:
        fields.update({
            "XRC initiator with a receive queue": {"qp_type": abi.const("VRDMA_QPT_XRC_INI"), "recv_cq": 0},
            "XRC target of a user context": {"qp_type": abi.const("VRDMA_QPT_XRC_TGT")},  # the kernel's
            "XRC domain on an RC QP": {"xrcd": vm0.call("ALLOC_XRCD", "vrdma_cmd_alloc_xrcd",
                                                        "vrdma_resp_alloc_xrcd").handle},
            "no such type": {"qp_type": 0xFF},
            "GSI QP of a user context": {"qp_type": abi.const("VRDMA_QPT_GSI")},  # QP1 is the kernel's
            "send depth past max_qp_wr": {"sq_depth": DEFAULT_LIMITS.max_qp_wr * 2},
            "send SGEs past the device's": {"max_send_sge": DEFAULT_LIMITS.max_sge + 1, "sq_stride": PAGE},
            "inline data past the device's": {"max_inline_data": DEFAULT_LIMITS.max_inline_data + 1,
                                              "sq_stride": PAGE},
            "send stride smaller than a WQE": {"sq_stride": 32},
            "receive depth not a power of two": {"rq_depth": 12},
            "CQ never issued": {"send_cq": 0x7777},
            "ring one page short": {"ring": vm0.verbs.page_list(vm0.verbs.alloc(PAGE), npages=2)},
            "reserved bytes": {"reserved0": [1, 0]},
        }[case])
    because = {
        "XRC initiator with a receive queue": r"an XRC initiator QP has no receive side",
        "XRC target of a user context": r"XRC target QPs are the kernel's",
        "XRC domain on an RC QP": r"only an XRC target QP has an XRC domain",
        "no such type": r"QP type 255 \(the device has",
        "GSI QP of a user context": r"the GSI QP is the kernel's",
        "send depth past max_qp_wr": rf"send queue: depth {DEFAULT_LIMITS.max_qp_wr * 2},",
        "send SGEs past the device's": rf"send queue: depth 16, stride 4096, {DEFAULT_LIMITS.max_sge + 1} SGEs",
        "inline data past the device's": rf"send queue: .* {DEFAULT_LIMITS.max_inline_data + 1} inline bytes",
        "send stride smaller than a WQE": r"send queue: depth 16, stride 32,",
        "receive depth not a power of two": r"receive queue: depth 12,",
        "an SRQ and a receive queue": r"a QP with an SRQ has no receive queue of its own",
        "CQ never issued": r"no CQ 0x7777",
        "CQ of another context": r"CQ .* belongs to another context",
        "ring one page short": r"the QP ring spans 3 pages, the page list has 2",
        "reserved bytes": r"reserved fields of CREATE_QP are not zero",
    }[case]
    assert refused(lambda: create(vm0, fields), vm0, because) == expected


@pytest.mark.parametrize("case", ["RESET to RTS", "INIT without its attributes", "port 2", "path MTU 6",
                                  "unset source GID", "PSN of 25 bits", "unknown attribute bit",
                                  "cur_qp_state that is not the state"])
def test_bad_modification_is_refused_and_leaves_the_qp_as_it_was(vm0: Vm, bystander: Bystander, case: str) -> None:
    vm0.verbs.add_gid(0, GID["vm0"])
    pd, cq = vm0.verbs.alloc_pd(), vm0.verbs.create_cq(16)
    qp = vm0.verbs.create_qp(pd, cq, cq)
    init = m("STATE", "PKEY_INDEX", "PORT", "ACCESS_FLAGS")
    rtr = m("STATE", "AV", "PATH_MTU", "DEST_QPN", "RQ_PSN", "MAX_DEST_RD_ATOMIC", "MIN_RNR_TIMER")
    good_rtr: dict[str, Any] = {"qp_state": QpState.RTR, "path_mtu": 3, "dest_qp_num": qp.qpn,
                                "dgid": list(GID["vm0"]), "max_dest_rd_atomic": 1}
    if case not in ("RESET to RTS", "INIT without its attributes", "port 2", "unknown attribute bit"):
        modify(vm0, qp.handle, init, qp_state=QpState.INIT, port_num=1)
    before = state(vm0, qp.handle)
    mask, attr = {
        "RESET to RTS": (m("STATE"), {"qp_state": QpState.RTS}),
        "INIT without its attributes": (m("STATE"), {"qp_state": QpState.INIT}),
        "port 2": (init, {"qp_state": QpState.INIT, "port_num": 2}),
        "path MTU 6": (rtr, {**good_rtr, "path_mtu": 6}),
        "unset source GID": (rtr, {**good_rtr, "sgid_index": 9}),
        "PSN of 25 bits": (rtr, {**good_rtr, "rq_psn": 1 << 24}),
        "unknown attribute bit": (init | 1 << 30, {"qp_state": QpState.INIT, "port_num": 1}),
        "cur_qp_state that is not the state": (rtr | m("CUR_STATE"), {**good_rtr, "cur_qp_state": QpState.RTS}),
    }[case]
    because = {
        "RESET to RTS": r"no transition from RESET to RTS",
        "INIT without its attributes": r"RESET -> INIT requires attributes",
        "port 2": r"bad port \(the device has port 1\)",
        "path MTU 6": r"bad path MTU",
        "unset source GID": r"bad source GID index",
        "PSN of 25 bits": r"bad RQ PSN",
        "unknown attribute bit": r"unknown attribute bits 0x40000000",
        "cur_qp_state that is not the state": r"cur_qp_state RTS but the QP is in INIT",
    }[case]
    assert refused(lambda: modify(vm0, qp.handle, mask, **attr), vm0, because) == Status.INVALID
    assert state(vm0, qp.handle) == before
