"""The vring messages: SET_VRING_NUM, SET_VRING_ADDR, SET_VRING_BASE, SET_VRING_KICK, SET_VRING_CALL,
SET_VRING_ERR, SET_VRING_ENABLE and GET_VRING_BASE (which stops a ring; all of them stopped is a stop, or a
device reset from a frontend that cannot send RESET_DEVICE)."""

from __future__ import annotations

import os
import struct

import pytest
from backend_process import BackendProcess, Bystander, query_device
from message_helpers import Attack, expect_closed, harms_only_its_sender, raw

from vrdma.device import abi
from vrdma.device.objects import OBJECT_KINDS
from vrdma.device.status import Status
from vrdma.testing.frontend import USER_BASE, Frontend
from vrdma.testing.simulated_guest import SimVerbs
from vrdma.vhost_user import protocol
from vrdma.vhost_user.protocol import Request

pytestmark = pytest.mark.backend


def test_get_vring_base_stops_the_ring_and_reports_its_index(fe: Frontend) -> None:
    fe.start()
    for seq in range(3):
        query_device(fe, seq)
    fe.send_raw(Request.GET_VRING_BASE, protocol.VRING_STATE.pack(0, 0))
    index, last_avail = protocol.VRING_STATE.unpack(fe.reply(Request.GET_VRING_BASE))
    assert (index, last_avail) == (0, 3)


def test_vring_err_and_fdless_kick_are_accepted(fe: Frontend) -> None:
    fe.start()
    err_fd = os.eventfd(0, os.EFD_CLOEXEC)
    try:
        fe.acked(Request.SET_VRING_ERR, protocol.U64.pack(0), fds=[err_fd])
    finally:
        os.close(err_fd)
    fe.acked(Request.SET_VRING_ERR, protocol.U64.pack(1 | protocol.VRING_NOFD))
    assert query_device(fe).hdr.status == Status.OK


def test_vring_state_messages_carry_the_queue_index(fe: Frontend) -> None:
    fe.start()
    fe.acked(Request.SET_VRING_ENABLE, protocol.VRING_STATE.pack(1, 0))
    fe.acked(Request.SET_VRING_ENABLE, protocol.VRING_STATE.pack(1, 1))
    assert struct.unpack("<II", fe.queues[1].address_payload()[:8])[0] == 1
    assert query_device(fe).hdr.status == Status.OK


def test_a_stop_keeps_the_device_and_reset_device_resets_it(fe: Frontend, backend: BackendProcess) -> None:
    """With RESET_DEVICE negotiated (QEMU with the vrdma patch), every queue stopped is a stop: the device is
    suspended with everything it holds, a command the driver queued meanwhile is answered when the queues start
    again (nobody kicks it again), and only RESET_DEVICE resets it."""
    fe.start()
    epoch = abi.from_bytes("vrdma_config", fe.get_config(abi.sizeof("vrdma_config"))).device_epoch
    verbs = SimVerbs(fe, backend.directory / "vm0.doorbell")
    verbs.alloc_pd()
    before = backend.counters("vm0")
    assert before["connection"]["queues_started"] == ["control", "event", "wake"]
    stops, resets = before["connection"]["stops"], before["connection"]["device_resets"]
    bases = fe.stop_queues()
    stopped = backend.wait_for_counters("vm0", lambda c: c["connection"]["stops"] == stops + 1, "a stop")
    assert stopped["connection"]["suspended"] and stopped["connection"]["device_resets"] == resets
    assert stopped["objects"] == before["objects"] and stopped["doorbell_pages"] == before["doorbell_pages"]
    control = fe.queues[abi.const("VRDMA_QUEUE_CONTROL")]
    request = abi.to_bytes(abi.new("vrdma_cmd_query_device", hdr={"opcode": abi.const("VRDMA_CMD_QUERY_DEVICE"),
                                                                  "seq": 77}))
    head, in_gpas = control.add([request], [abi.sizeof("vrdma_resp_query_device")])
    control.notify()  # reaches nobody: the backend let go of the kick eventfd when the queue stopped
    fe.start_queues(bases)
    assert [desc for desc, _ in control.wait_used(5.0)] == [head]
    response = abi.from_bytes("vrdma_resp_query_device", fe.memory.read(in_gpas[0],
                                                                         abi.sizeof("vrdma_resp_query_device")))
    assert (response.hdr.status, response.hdr.seq) == (Status.OK, 77)
    resumed = backend.counters("vm0")
    assert not resumed["connection"]["suspended"] and resumed["objects"] == before["objects"]
    assert abi.from_bytes("vrdma_config", fe.get_config(abi.sizeof("vrdma_config"))).device_epoch == epoch
    verbs.alloc_pd()  # the device runs on with what it held
    fe.stop_queues()
    fe.send_raw(Request.RESET_DEVICE)  # no reply: QEMU sends it without NEED_REPLY
    after = backend.wait_for_counters("vm0", lambda c: c["connection"]["device_resets"] == resets + 1,
                                      "a device reset")
    assert after["connection"]["state"] == "connected" and not after["connection"]["suspended"]
    assert after["objects"] == dict.fromkeys(OBJECT_KINDS, 0) and after["doorbell_pages"] == []
    assert abi.from_bytes("vrdma_config", fe.get_config(abi.sizeof("vrdma_config"))).device_epoch != epoch


def test_without_reset_device_stopping_every_queue_resets_the_device(fe: Frontend, backend: BackendProcess) -> None:
    """A frontend that cannot say "reset" (QEMU without the vrdma patch: its generic device stops the queues for a
    driver reset and sends nothing more) has every queue stopped taken for a reset, as before."""
    fe.start(protocol_features=~protocol.ProtocolFeature.RESET_DEVICE)
    epoch = abi.from_bytes("vrdma_config", fe.get_config(abi.sizeof("vrdma_config"))).device_epoch
    verbs = SimVerbs(fe, backend.directory / "vm0.doorbell")
    verbs.alloc_pd()
    before = backend.counters("vm0")
    assert before["objects"]["ucontext"] == 1 and before["objects"]["pd"] == 1
    resets = before["connection"]["device_resets"]
    fe.stop_queues()
    after = backend.wait_for_counters("vm0", lambda c: c["connection"]["device_resets"] == resets + 1,
                                      "a device reset")
    assert after["connection"]["queues_started"] == [] and after["connection"]["state"] == "connected"
    assert after["connection"]["stops"] == before["connection"]["stops"]
    assert after["objects"] == dict.fromkeys(OBJECT_KINDS, 0) and after["doorbell_pages"] == []
    assert abi.from_bytes("vrdma_config", fe.get_config(abi.sizeof("vrdma_config"))).device_epoch != epoch


def ring_outside_memory(fe: Frontend) -> None:
    fe.start(num_queues=0)
    fe.acked(Request.SET_VRING_NUM, protocol.VRING_STATE.pack(0, 64))
    far = USER_BASE + fe.memory.size + 0x10000
    fe.send_raw(Request.SET_VRING_ADDR, struct.pack("<IIQQQQ", 0, 0, far, far, far, 0))
    expect_closed(fe)


ATTACKS: dict[str, Attack] = {
    "queue index out of range": raw(Request.SET_VRING_NUM, protocol.VRING_STATE.pack(5, 64)),
    "vring addr for a missing queue": raw(Request.SET_VRING_ADDR, struct.pack("<IIQQQQ", 9, 0, 0, 0, 0, 0)),
    "kick without its fd": raw(Request.SET_VRING_KICK, protocol.U64.pack(0)),
    "ring addresses outside guest memory": ring_outside_memory,
}


@pytest.mark.parametrize("attack", ATTACKS)
def test_malformed_vring_messages(backend: BackendProcess, bystander: Bystander, attack: str) -> None:
    harms_only_its_sender(backend, ATTACKS[attack])
