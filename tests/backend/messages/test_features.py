"""GET_FEATURES, SET_FEATURES, GET_PROTOCOL_FEATURES, SET_PROTOCOL_FEATURES (SET_LOG_BASE: test_log_base.py)."""

from __future__ import annotations

import pytest
from backend_process import BackendProcess, Bystander
from message_helpers import harms_only_its_sender, raw

from vrdma.device import abi
from vrdma.testing.frontend import VHOST_USER_F_PROTOCOL_FEATURES, VIRTIO_F_VERSION_1, Frontend
from vrdma.vhost_user import protocol
from vrdma.vhost_user.protocol import ProtocolFeature, Request

pytestmark = pytest.mark.backend


def test_get_and_set_features(fe: Frontend, backend: BackendProcess) -> None:
    features = fe.get_u64(Request.GET_FEATURES)
    assert features & VIRTIO_F_VERSION_1 and features & VHOST_USER_F_PROTOCOL_FEATURES
    fe.send_raw(Request.SET_FEATURES, protocol.U64.pack(VIRTIO_F_VERSION_1))
    assert fe.get_u64(Request.GET_QUEUE_NUM) == abi.const("VRDMA_NUM_QUEUES")  # still connected, answering
    assert backend.connection("vm0")["features"] == VIRTIO_F_VERSION_1


def test_protocol_features_are_exactly_what_the_backend_implements(fe: Frontend, backend: BackendProcess) -> None:
    offered = fe.get_u64(Request.GET_PROTOCOL_FEATURES)
    assert offered == ProtocolFeature.MQ | ProtocolFeature.REPLY_ACK | ProtocolFeature.CONFIG \
        | ProtocolFeature.CONFIGURE_MEM_SLOTS | ProtocolFeature.BACKEND_REQ | ProtocolFeature.BACKEND_SEND_FD \
        | ProtocolFeature.SHMEM | ProtocolFeature.RESET_DEVICE | ProtocolFeature.DEVICE_STATE \
        | ProtocolFeature.LOG_SHMFD
    fe.send_raw(Request.SET_PROTOCOL_FEATURES, protocol.U64.pack(offered))
    backend.wait_for_counters("vm0", lambda c: c["connection"]["protocol_features"] == offered,
                              f"protocol features {offered:#x} negotiated")


ATTACKS = {
    "short SET_FEATURES payload": raw(Request.SET_FEATURES, b"\0" * 4),
    "payload on GET_FEATURES": raw(Request.GET_FEATURES, b"\0" * 8),
    "protocol feature never offered": raw(Request.SET_PROTOCOL_FEATURES, protocol.U64.pack(1 << 4)),  # NET_MTU
    "log base of 0 bytes on a pipe": raw(Request.SET_LOG_BASE, b"\0" * 16, fds=1),
}


@pytest.mark.parametrize("attack", ATTACKS)
def test_malformed_features(backend: BackendProcess, bystander: Bystander, attack: str) -> None:
    harms_only_its_sender(backend, ATTACKS[attack])
