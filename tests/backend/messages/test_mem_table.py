"""SET_MEM_TABLE, ADD_MEM_REG and REM_MEM_REG: the guest's memory, mapped from the file descriptors QEMU sends."""

from __future__ import annotations

import pytest
from backend_process import BackendProcess, Bystander, query_device
from message_helpers import harms_only_its_sender, raw

from vrdma.device.status import Status
from vrdma.testing.frontend import Frontend, GuestMemory
from vrdma.vhost_user import protocol
from vrdma.vhost_user.protocol import Request

pytestmark = pytest.mark.backend


def test_mem_table_rings_and_enable_make_a_working_device(fe: Frontend) -> None:
    fe.start()  # SET_MEM_TABLE, SET_VRING_NUM/BASE/ADDR/CALL/KICK/ENABLE on every queue
    assert query_device(fe).hdr.status == Status.OK


def test_add_and_remove_memory_regions(fe: Frontend) -> None:
    fe.start()
    extra = GuestMemory(1 << 20)
    try:
        region = protocol.MEMORY_REGION.pack(1 << 30, extra.size, 0x7E00_0000_0000, 0)
        fe.acked(Request.ADD_MEM_REG, bytes(8) + region, fds=[extra.fd])
        assert query_device(fe).hdr.status == Status.OK
        fe.acked(Request.REM_MEM_REG, bytes(8) + region)
        assert query_device(fe).hdr.status == Status.OK
    finally:
        extra.close()


ATTACKS = {
    "zero memory regions": raw(Request.SET_MEM_TABLE, protocol.MEMORY_HEADER.pack(0, 0)),
    "nine memory regions": raw(Request.SET_MEM_TABLE, protocol.MEMORY_HEADER.pack(9, 0) + bytes(9 * 32)),
    "too many fds": raw(Request.SET_MEM_TABLE, protocol.MEMORY_HEADER.pack(1, 0) + bytes(32), fds=2),
    "region without its fd": raw(Request.ADD_MEM_REG, bytes(8) + protocol.MEMORY_REGION.pack(1 << 30, 4096, 0, 0)),
}


@pytest.mark.parametrize("attack", ATTACKS)
def test_malformed_memory_table(backend: BackendProcess, bystander: Bystander, attack: str) -> None:
    harms_only_its_sender(backend, ATTACKS[attack])
