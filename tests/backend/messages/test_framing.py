"""The vhost-user message header: request, flags (version 1, reply, need-reply) and payload size, and the file
descriptors that ride along. A message whose framing is wrong costs its sender the connection, nothing more."""

from __future__ import annotations

import pytest
from backend_process import BackendProcess, Bystander
from message_helpers import harms_only_its_sender, raw

from vrdma.testing.frontend import VIRTIO_F_VERSION_1, Frontend
from vrdma.vhost_user import protocol
from vrdma.vhost_user.protocol import Request

pytestmark = pytest.mark.backend


def test_a_well_framed_request_is_answered_with_the_reply_flag(fe: Frontend) -> None:
    fe.send_raw(Request.GET_FEATURES, flags=protocol.VERSION)
    assert protocol.U64.unpack(fe.reply(Request.GET_FEATURES))[0] & VIRTIO_F_VERSION_1


ATTACKS = {
    "version 0 header": raw(Request.GET_FEATURES, flags=0),
    "version 3 header": raw(Request.GET_FEATURES, flags=3),
    "unknown flag bits": raw(Request.GET_FEATURES, flags=0x1 | 0x100),
    "reply flag from the frontend": raw(Request.GET_FEATURES, flags=0x1 | protocol.FLAG_REPLY),
    "payload larger than any message": raw(Request.SET_FEATURES, size=100_000),
    "VHOST_USER_NONE": raw(Request.NONE),
    "unknown request": raw(0x7FFF),
}


@pytest.mark.parametrize("attack", ATTACKS)
def test_malformed_framing(backend: BackendProcess, bystander: Bystander, attack: str) -> None:
    harms_only_its_sender(backend, ATTACKS[attack])
