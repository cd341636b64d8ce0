"""QUERY_DEVICE, QUERY_PORT, QUERY_COUNTERS and QUERY_QP_COUNTERS, and what the dispatcher refuses before any handler
runs."""

from __future__ import annotations

import time

import pytest
from backend_process import BackendProcess
from command_helpers import Bystander, Vm, refused
from polling import wait_until

from vrdma.device import abi
from vrdma.device.params import DEFAULT_LIMITS, query_fields
from vrdma.device.status import Status
from vrdma.engine.api import COUNTERS, QP_COUNTERS

pytestmark = pytest.mark.backend


def test_query_device_reports_every_limit(vm0: Vm, bystander: Bystander) -> None:
    answer = vm0.call("QUERY_DEVICE", "vrdma_cmd_query_device", "vrdma_resp_query_device")
    for name, value in query_fields(DEFAULT_LIMITS).items():
        assert getattr(answer, name) == value, name
    assert answer.vendor_id == 0x1AF4 and answer.vendor_part_id == abi.const("VRDMA_VIRTIO_ID")
    assert answer.node_guid & 0xFF == 0x02 and answer.sys_image_guid == answer.node_guid


def test_query_port_reports_an_active_roce_port(vm0: Vm, bystander: Bystander) -> None:
    port = vm0.call("QUERY_PORT", "vrdma_cmd_query_port", "vrdma_resp_query_port", port=1)
    assert port.state == abi.const("VRDMA_PORT_STATE_ACTIVE")
    assert port.link_layer == abi.const("VRDMA_LINK_LAYER_ETHERNET")
    assert port.gid_tbl_len == DEFAULT_LIMITS.gid_table_len and port.pkey_tbl_len == 1


def test_query_counters_reports_the_engines_counters(vm0: Vm, bystander: Bystander,
                                                    backend: BackendProcess) -> None:
    # Every counter of the engine, by name, in the response struct (the guest's hw_counters follow it).
    fields = [name for name, _ in abi.ffi.typeof("struct vrdma_resp_query_counters").fields]
    assert fields == ["hdr", *COUNTERS]
    _, _, qp = vm0.verbs.loopback_qp(bytes.fromhex("00000000000000000000ffffa9fe6401"))
    vm0.verbs.post_send(qp, abi.const("VRDMA_WR_SEND"), [], wr_id=1)  # no receive posted: RNR waits
    deadline = time.monotonic() + 10
    while not backend.counters("vm0")["engine"]["rnr_waits"]:
        assert time.monotonic() < deadline, "the engine never ran the send"
        time.sleep(0.001)  # the engine runs in the backend process
    answer = vm0.call("QUERY_COUNTERS", "vrdma_cmd_query_port", "vrdma_resp_query_counters", port=1)
    engine = backend.counters("vm0")["engine"]
    assert answer.send_wqes >= 1 and answer.rnr_waits >= 1
    assert all(getattr(answer, name) <= engine[name] for name in COUNTERS)  # counters only grow


def test_query_qp_counters_reports_each_qps_share(vm0: Vm, bystander: Bystander, backend: BackendProcess) -> None:
    # One QP's counters, named as the port's counters they are a share of.
    fields = [name for name, _ in abi.ffi.typeof("struct vrdma_resp_query_qp_counters").fields]
    assert fields == ["hdr", *QP_COUNTERS] and set(QP_COUNTERS) <= set(COUNTERS)
    gid = bytes.fromhex("00000000000000000000ffffa9fe6401")
    pd, cq, qp = vm0.verbs.loopback_qp(gid)
    idle = vm0.verbs.create_qp(pd, cq, cq)  # a second QP of the same VM, doing nothing
    mr = vm0.verbs.reg_mr(pd, 8192)

    def qp_counters(which: object) -> object:
        return vm0.call("QUERY_QP_COUNTERS", "vrdma_cmd_destroy", "vrdma_resp_query_qp_counters",
                        handle=which.handle)  # type: ignore[attr-defined]

    assert all(getattr(qp_counters(qp), name) == 0 for name in QP_COUNTERS)  # from its creation on
    vm0.verbs.post_recv(qp, [(mr.addr + 4096, 4096, mr.lkey)], wr_id=7)
    vm0.verbs.post_send(qp, abi.const("VRDMA_WR_SEND"), [(mr.addr, 3000, mr.lkey)], wr_id=1)
    vm0.verbs.post_send(qp, abi.const("VRDMA_WR_RDMA_WRITE"), [(mr.addr, 1000, mr.lkey)], wr_id=2,
                        remote_addr=mr.addr + 4096, rkey=mr.rkey)
    wait_until("the engine ran both sends", lambda: qp_counters(qp).send_wqes == 2, 10,  # type: ignore[attr-defined]
               interval=0.001)
    completions: list[object] = []
    wait_until("the three completions", lambda: completions.extend(vm0.verbs.poll_cq(cq)) or len(completions) == 3,
               10, interval=0.001)
    mine = qp_counters(qp)
    # The SEND and the WRITE, each counted as requester and as responder: the QP is its own peer.
    assert (mine.send_wqes, mine.recv_wqes, mine.bytes, mine.error_cqes) == (2, 1, 2 * 4000, 0)  # type: ignore
    port = vm0.call("QUERY_COUNTERS", "vrdma_cmd_query_port", "vrdma_resp_query_counters", port=1)
    assert all(getattr(mine, name) <= getattr(port, name) for name in QP_COUNTERS)
    assert all(getattr(qp_counters(idle), name) == 0 for name in QP_COUNTERS)
    assert refused(lambda: vm0.call("QUERY_QP_COUNTERS", "vrdma_cmd_destroy", "vrdma_resp_query_qp_counters",
                                    handle=0x7FFF0001), vm0, r"no QP 0x7fff0001") == Status.INVALID
    assert refused(lambda: vm0.call("QUERY_QP_COUNTERS", "vrdma_cmd_destroy", "vrdma_resp_query_qp_counters",
                                    handle=qp.handle, reserved=1), vm0,
                   r"reserved field of QUERY_QP_COUNTERS is 1") == Status.INVALID


@pytest.mark.parametrize("command", ["QUERY_PORT", "QUERY_COUNTERS"])
@pytest.mark.parametrize(("fields", "expected", "because"), [
    ({"port": 0}, Status.INVALID, r"port 0 does not exist \(the device has port 1\)"),
    ({"port": 2}, Status.INVALID, r"port 2 does not exist \(the device has port 1\)"),
    ({"port": 1, "reserved": [0, 0, 0, 0, 0, 0, 1]}, Status.INVALID, r"reserved bytes of QUERY_\w+ are not zero"),
])
def test_a_query_of_no_port_is_refused(vm0: Vm, bystander: Bystander, fields: dict[str, object],
                                       expected: Status, because: str, command: str) -> None:
    response = "vrdma_resp_query_port" if command == "QUERY_PORT" else "vrdma_resp_query_counters"
    assert refused(lambda: vm0.call(command, "vrdma_cmd_query_port", response, **fields), vm0,
                   rf"{command}: {because}") == expected


def test_dispatcher_refusals_are_counted_and_answer_with_the_request_header(vm0: Vm, bystander: Bystander,
                                                                             backend: BackendProcess) -> None:
    before = backend.counters("vm0")["command_errors"]
    raw = abi.to_bytes(abi.new("vrdma_cmd_hdr", opcode=0x7777, seq=9))
    unknown = abi.from_bytes("vrdma_resp_hdr", vm0.fe.command(raw, 64)[:8])
    assert (unknown.opcode, unknown.seq, unknown.status) == (0x7777, 9, Status.NOT_SUPPORTED)
    reserved = abi.to_bytes(abi.new("vrdma_cmd_query_device", hdr={"opcode": abi.const("VRDMA_CMD_QUERY_DEVICE"),
                                                                   "reserved": 1, "seq": 10}))
    assert abi.from_bytes("vrdma_resp_hdr", vm0.fe.command(reserved, 512)[:8]).status == Status.INVALID
    short = abi.to_bytes(abi.new("vrdma_cmd_hdr", opcode=abi.const("VRDMA_CMD_QUERY_PORT"), seq=11))
    assert abi.from_bytes("vrdma_resp_hdr", vm0.fe.command(short, 64)[:8]).status == Status.BAD_LENGTH
    assert backend.counters("vm0")["command_errors"] == before + 3
