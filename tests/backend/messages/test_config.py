"""GET_CONFIG and SET_CONFIG: the device's config space, read-only for the driver."""

from __future__ import annotations

import pytest
from backend_process import BackendProcess, Bystander
from message_helpers import harms_only_its_sender, raw

from vrdma.device import abi
from vrdma.testing.frontend import Frontend
from vrdma.vhost_user import protocol
from vrdma.vhost_user.protocol import Request

pytestmark = pytest.mark.backend


def test_get_config_and_refused_set_config(fe: Frontend) -> None:
    fe.start()
    config = abi.from_bytes("vrdma_config", fe.get_config(abi.sizeof("vrdma_config")))
    assert config.abi_version == abi.const("VRDMA_ABI_VERSION")
    fe.send_raw(Request.SET_CONFIG, protocol.CONFIG_HEADER.pack(0, 4, 0) + b"\xff" * 4,
                flags=protocol.VERSION | protocol.FLAG_NEED_REPLY)
    assert protocol.U64.unpack(fe.reply(Request.SET_CONFIG))[0] != 0  # refused: config space is read-only
    again = abi.from_bytes("vrdma_config", fe.get_config(abi.sizeof("vrdma_config")))
    assert again.abi_version == config.abi_version


ATTACKS = {
    "config read past 256 bytes": raw(Request.GET_CONFIG, protocol.CONFIG_HEADER.pack(200, 100, 0) + bytes(100)),
    "config size beyond its payload": raw(Request.GET_CONFIG, protocol.CONFIG_HEADER.pack(0, 96, 0) + bytes(8)),
}


@pytest.mark.parametrize("attack", ATTACKS)
def test_malformed_config_access(backend: BackendProcess, bystander: Bystander, attack: str) -> None:
    harms_only_its_sender(backend, ATTACKS[attack])
