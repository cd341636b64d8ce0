"""What travels in the virtqueues once they run: control-queue chains carrying commands, event-queue buffers.
A chain the device cannot use costs the sender its connection; a command it can parse but refuses gets a status."""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest
from backend_process import BackendProcess, Bystander
from message_helpers import Attack, expect_closed, harms_only_its_sender

from vrdma.device import abi
from vrdma.device.constants import CommandOpcode, EventType
from vrdma.device.status import Status
from vrdma.testing.frontend import VRING_DESC_F_NEXT, VRING_DESC_F_WRITE, Frontend

pytestmark = pytest.mark.backend

EVENT_SIZE = abi.sizeof("vrdma_event")


def status_of(raw: bytes) -> int:
    return int(abi.from_bytes("vrdma_resp_hdr", raw[:8]).status)


def cmd(opcode: int, seq: int = 1, size: int | None = None) -> bytes:
    data = abi.to_bytes(abi.new("vrdma_cmd_hdr", opcode=opcode, seq=seq))
    return data if size is None else data.ljust(size, b"\0")[:size]


# -- event queue ----------------------------------------------------------------------------------------------------

def test_event_queue_delivers_port_active(fe: Frontend) -> None:
    fe.start()
    vq = fe.queues[abi.const("VRDMA_QUEUE_EVENT")]
    head, gpas = vq.add([], [EVENT_SIZE])
    vq.notify()
    assert vq.wait_used() == [(head, EVENT_SIZE)]
    event = abi.from_bytes("vrdma_event", fe.memory.read(gpas[0], EVENT_SIZE))
    assert (event.type, event.handle) == (EventType.PORT_ACTIVE, 1)


def test_event_buffer_too_small_is_returned_empty_and_the_event_kept(fe: Frontend) -> None:
    fe.start()
    vq = fe.queues[abi.const("VRDMA_QUEUE_EVENT")]
    small, _ = vq.add([], [8])
    vq.notify()
    assert vq.wait_used() == [(small, 0)]
    head, gpas = vq.add([], [EVENT_SIZE])
    vq.notify()
    assert vq.wait_used() == [(head, EVENT_SIZE)]
    event = abi.from_bytes("vrdma_event", fe.memory.read(gpas[0], EVENT_SIZE))
    assert event.type == EventType.PORT_ACTIVE


# -- control queue: chains the device cannot use, commands it refuses -------------------------------------------

Descriptor = tuple[int, int, int, int]  # addr, len, flags, next


def bad_chain(descriptors: Callable[[Frontend], list[Descriptor]]) -> Attack:
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


def command_status(request: bytes, response_size: int, status: int) -> Attack:
    def attack(fe: Frontend) -> None:
        fe.start()
        assert status_of(fe.command(request, response_size)) == status
    return attack


def no_room_for_a_response(fe: Frontend) -> None:
    fe.start()
    vq = fe.queues[0]
    head, _ = vq.add([cmd(CommandOpcode.QUERY_DEVICE)], [4])
    vq.notify()
    assert vq.wait_used() == [(head, 0)]  # completed, nothing written


def device_readable_response_buffer(fe: Frontend) -> None:
    fe.start()
    vq = fe.queues[0]
    head, _ = vq.add([cmd(CommandOpcode.QUERY_DEVICE), bytes(120)], [])  # no device-writable buffer at all
    vq.notify()
    assert vq.wait_used() == [(head, 0)]


QUERY_DEVICE, QUERY_PORT = CommandOpcode.QUERY_DEVICE, CommandOpcode.QUERY_PORT
ATTACKS: dict[str, Attack] = {
    "descriptor chain that loops": bad_chain(_looping),
    "descriptor outside guest memory": bad_chain(lambda fe: [(fe.memory.size + 0x100000, 8, 0, 0)]),
    "descriptor across the end of guest memory": bad_chain(lambda fe: [(fe.memory.size - 4, 64, 0, 0)]),
    "next index out of range": bad_chain(lambda fe: [(fe.memory.alloc(64), 8, VRING_DESC_F_NEXT, 1000)]),
    "avail index far ahead of the ring": avail_index_far_ahead,
    "readable descriptor after a writable one": bad_chain(_readable_after_writable),
    "oversized command": command_status(cmd(QUERY_DEVICE, size=8192), 128, Status.BAD_LENGTH),
    "truncated command header": command_status(cmd(QUERY_DEVICE)[:5], 128, Status.BAD_LENGTH),
    "command longer than its struct": command_status(cmd(QUERY_DEVICE, size=16), 128, Status.BAD_LENGTH),
    "QUERY_PORT cut short": command_status(cmd(QUERY_PORT, size=12), 64, Status.BAD_LENGTH),
    "QUERY_PORT for port 2": command_status(cmd(QUERY_PORT, size=16)[:8] + b"\x02" + bytes(7), 64, Status.INVALID),
    "unknown command code": command_status(cmd(0xBEEF), 64, Status.NOT_SUPPORTED),
    "response buffer too small for QUERY_DEVICE": command_status(cmd(QUERY_DEVICE), 16, Status.BAD_LENGTH),
    "no room for a response header": no_room_for_a_response,
    "no device-writable buffer": device_readable_response_buffer,
}


@pytest.mark.parametrize("attack", ATTACKS)
def test_malformed_queue_contents(backend: BackendProcess, bystander: Bystander, attack: str) -> None:
    harms_only_its_sender(backend, ATTACKS[attack])
