"""SET_OWNER, RESET_OWNER, GET_QUEUE_NUM and GET_MAX_MEM_SLOTS: the messages that take no payload."""

from __future__ import annotations

import pytest
from backend_process import BackendProcess, Bystander
from message_helpers import harms_only_its_sender, raw

from vrdma.device import abi
from vrdma.testing.frontend import Frontend
from vrdma.vhost_user import protocol
from vrdma.vhost_user.protocol import Request

pytestmark = pytest.mark.backend


def test_owner_queue_num_and_memory_slots(fe: Frontend) -> None:
    fe.send_raw(Request.SET_PROTOCOL_FEATURES, protocol.U64.pack(fe.get_u64(Request.GET_PROTOCOL_FEATURES)))
    fe.acked(Request.SET_OWNER)
    assert fe.get_u64(Request.GET_QUEUE_NUM) == abi.const("VRDMA_NUM_QUEUES")
    assert fe.get_u64(Request.GET_MAX_MEM_SLOTS) >= 8
    fe.acked(Request.RESET_OWNER)


ATTACKS = {
    "fd on a request that takes none": raw(Request.GET_QUEUE_NUM, fds=1),
    "payload on GET_QUEUE_NUM": raw(Request.GET_QUEUE_NUM, b"\0" * 8),
}


@pytest.mark.parametrize("attack", ATTACKS)
def test_malformed_owner_and_queue_messages(backend: BackendProcess, bystander: Bystander, attack: str) -> None:
    harms_only_its_sender(backend, ATTACKS[attack])
