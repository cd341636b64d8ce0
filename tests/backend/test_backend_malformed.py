"""Malformed input from one simulated VM: the backend refuses it (error status or disconnect of that VM only),
stays up, and another VM served by the same process still completes a QUERY_DEVICE round trip afterwards."""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator

import backend_process
import pytest
from backend_process import BackendProcess, query_device

from vrdma.device import abi
from vrdma.device.status import Status
from vrdma.testing.frontend import USER_BASE, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE, Frontend
from vrdma.vhost_user import protocol
from vrdma.vhost_user.protocol import Request

pytestmark = pytest.mark.backend

OK, NOT_SUPPORTED, INVALID, BAD_LENGTH = Status.OK, Status.NOT_SUPPORTED, Status.INVALID, Status.BAD_LENGTH
QUERY_DEVICE = abi.const("VRDMA_CMD_QUERY_DEVICE")
QUERY_PORT = abi.const("VRDMA_CMD_QUERY_PORT")


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackendProcess]:
    process = BackendProcess(tmp_path_factory.mktemp("backend"))
    yield process
    assert process.stop() == 0, process.log_text()


def expect_closed(fe: Frontend) -> None:
    backend_process.expect_closed(fe, timeout=5)


def status_of(raw: bytes) -> int:
    return int(abi.from_bytes("vrdma_resp_hdr", raw[:8]).status)


def cmd(opcode: int, seq: int = 1, size: int | None = None) -> bytes:
    data = abi.to_bytes(abi.new("vrdma_cmd_hdr", opcode=opcode, seq=seq))
    return data if size is None else data.ljust(size, b"\0")[:size]


# -- vhost-user messages: each attack sends something wrong and says what the backend must do --------------------

def raw(request: int, payload: bytes = b"", flags: int = protocol.VERSION, size: int | None = None,
        fds: int = 0) -> Callable[[Frontend], None]:
    def attack(fe: Frontend) -> None:
        pipes = [os.pipe() for _ in range(fds)]
        fe.send_raw(request, payload, flags=flags, size=size, fds=[r for r, _ in pipes])
        for r, w in pipes:
            os.close(r)
            os.close(w)
        expect_closed(fe)
    return attack


MESSAGE_ATTACKS = {
    "version 0 header": raw(Request.GET_FEATURES, flags=0),
    "version 3 header": raw(Request.GET_FEATURES, flags=3),
    "unknown flag bits": raw(Request.GET_FEATURES, flags=0x1 | 0x100),
    "reply flag from the frontend": raw(Request.GET_FEATURES, flags=0x1 | protocol.FLAG_REPLY),
    "payload larger than any message": raw(Request.SET_FEATURES, size=100_000),
    "short SET_FEATURES payload": raw(Request.SET_FEATURES, b"\0" * 4),
    "payload on GET_FEATURES": raw(Request.GET_FEATURES, b"\0" * 8),
    "VHOST_USER_NONE": raw(Request.NONE),
    "unknown request": raw(0x7FFF),
    "log base (not offered)": raw(Request.SET_LOG_BASE, b"\0" * 16, fds=1),
    "fd on a request that takes none": raw(Request.GET_QUEUE_NUM, fds=1),
    "kick without its fd": raw(Request.SET_VRING_KICK, protocol.U64.pack(0)),
    "too many fds": raw(Request.SET_MEM_TABLE, protocol.MEMORY_HEADER.pack(1, 0) + bytes(32), fds=2),
    "queue index out of range": raw(Request.SET_VRING_NUM, protocol.VRING_STATE.pack(5, 64)),
    "vring addr for a missing queue": raw(Request.SET_VRING_ADDR, struct.pack("<IIQQQQ", 9, 0, 0, 0, 0, 0)),
    "zero memory regions": raw(Request.SET_MEM_TABLE, protocol.MEMORY_HEADER.pack(0, 0)),
    "nine memory regions": raw(Request.SET_MEM_TABLE, protocol.MEMORY_HEADER.pack(9, 0) + bytes(9 * 32)),
    "config read past 256 bytes": raw(Request.GET_CONFIG, protocol.CONFIG_HEADER.pack(200, 100, 0) + bytes(100)),
    "protocol feature never offered": raw(Request.SET_PROTOCOL_FEATURES, protocol.U64.pack(1 << 1)),
}


# -- rings and commands, after a correct start -------------------------------------------------------------------

def ring_outside_memory(fe: Frontend) -> None:
    fe.start(num_queues=0)
    fe.acked(Request.SET_VRING_NUM, protocol.VRING_STATE.pack(0, 64))
    far = USER_BASE + fe.memory.size + 0x10000
    fe.send_raw(Request.SET_VRING_ADDR, struct.pack("<IIQQQQ", 0, 0, far, far, far, 0))
    expect_closed(fe)


Descriptor = tuple[int, int, int, int]  # addr, len, flags, next


def bad_chain(descriptors: Callable[[Frontend], list[Descriptor]]) -> Callable[[Frontend], None]:
    """Start the device, write raw descriptors 0, 1, ... on the control queue, publish 0 and kick: the backend
    must drop the VM."""
    def attack(fe: Frontend) -> None:
        fe.start()
        vq = fe.queues[0]
        for desc_id, (addr, length, flags, next_id) in enumerate(descriptors(fe)):
            vq.write_desc(desc_id, addr, length, flags, next_id)
        vq.publish(0)
        vq.notify()
        expect_closed(fe)
    return attack


def _looping(fe: Frontend) -> list[Descriptor]:
    gpa = fe.memory.alloc(64)
    return [(gpa, 8, VRING_DESC_F_NEXT, 1), (gpa, 8, VRING_DESC_F_NEXT, 0)]  # 0 -> 1 -> 0 -> ...


def _readable_after_writable(fe: Frontend) -> list[Descriptor]:
    return [(fe.memory.alloc(8), 8, VRING_DESC_F_WRITE | VRING_DESC_F_NEXT, 1), (fe.memory.alloc(16), 16, 0, 0)]


def avail_index_far_ahead(fe: Frontend) -> None:
    fe.start()
    vq = fe.queues[0]
    vq.memory.write(vq.avail + 2, struct.pack("<H", 5000))  # claims 5000 new buffers in a 64-entry ring
    vq.notify()
    expect_closed(fe)


def command_status(request: bytes, response_size: int, status: int) -> Callable[[Frontend], None]:
    def attack(fe: Frontend) -> None:
        fe.start()
        assert status_of(fe.command(request, response_size)) == status
    return attack


def no_room_for_a_response(fe: Frontend) -> None:
    fe.start()
    vq = fe.queues[0]
    head, _ = vq.add([cmd(QUERY_DEVICE)], [4])
    vq.notify()
    assert vq.wait_used() == [(head, 0)]  # completed, nothing written


def device_readable_response_buffer(fe: Frontend) -> None:
    fe.start()
    vq = fe.queues[0]
    head, _ = vq.add([cmd(QUERY_DEVICE), bytes(120)], [])  # no device-writable buffer at all
    vq.notify()
    assert vq.wait_used() == [(head, 0)]


RING_ATTACKS = {
    "ring addresses outside guest memory": ring_outside_memory,
    "descriptor chain that loops": bad_chain(_looping),
    "descriptor outside guest memory": bad_chain(lambda fe: [(fe.memory.size + 0x100000, 8, 0, 0)]),
    "descriptor across the end of guest memory": bad_chain(lambda fe: [(fe.memory.size - 4, 64, 0, 0)]),
    "next index out of range": bad_chain(lambda fe: [(fe.memory.alloc(64), 8, VRING_DESC_F_NEXT, 1000)]),
    "avail index far ahead of the ring": avail_index_far_ahead,
    "readable descriptor after a writable one": bad_chain(_readable_after_writable),
    "oversized command": command_status(cmd(QUERY_DEVICE, size=8192), 128, BAD_LENGTH),
    "truncated command header": command_status(cmd(QUERY_DEVICE)[:5], 128, BAD_LENGTH),
    "command longer than its struct": command_status(cmd(QUERY_DEVICE, size=16), 128, BAD_LENGTH),
    "QUERY_PORT cut short": command_status(cmd(QUERY_PORT, size=12), 64, BAD_LENGTH),
    "QUERY_PORT for port 2": command_status(cmd(QUERY_PORT, size=16)[:8] + b"\x02" + bytes(7), 64, INVALID),
    "unknown command code": command_status(cmd(0xBEEF), 64, NOT_SUPPORTED),
    "response buffer too small for QUERY_DEVICE": command_status(cmd(QUERY_DEVICE), 16, BAD_LENGTH),
    "no room for a response header": no_room_for_a_response,
    "no device-writable buffer": device_readable_response_buffer,
}


@pytest.mark.parametrize("attack", [*MESSAGE_ATTACKS, *RING_ATTACKS])
def test_malformed_input_harms_only_its_sender(backend: BackendProcess, attack: str) -> None:
    closes_before = backend.connection("vm0")["closed"]
    with backend.frontend("vm1") as bystander:
        bystander.start()
        with backend.frontend("vm0") as attacker:
            (MESSAGE_ATTACKS | RING_ATTACKS)[attack](attacker)
        assert backend.proc.poll() is None, backend.log_text()
        response = query_device(bystander)
        assert response.hdr.status == OK and response.max_qp > 0
    # Once the backend has let go of the attacker's connection, vm0 is served again from a clean state.
    backend.wait_for_closed("vm0", closes_before + 1)
    with backend.frontend("vm0") as again:
        again.start()
        assert query_device(again).hdr.status == OK
