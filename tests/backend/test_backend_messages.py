"""Every vhost-user message the backend handles, sent by the simulated frontend, with what the backend answers."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from backend_process import BackendProcess, query_device

from vrdma.device import abi
from vrdma.device.objects import OBJECT_KINDS
from vrdma.testing.frontend import VHOST_USER_F_PROTOCOL_FEATURES, VIRTIO_F_VERSION_1, Frontend, GuestMemory
from vrdma.testing.verbs import SimVerbs
from vrdma.vhost_user import protocol
from vrdma.vhost_user.protocol import ProtocolFeature, Request

pytestmark = pytest.mark.backend


@pytest.fixture()
def fe(backend: BackendProcess) -> Iterator[Frontend]:
    with backend.frontend("vm0") as frontend:
        yield frontend


def test_get_and_set_features(fe: Frontend, backend: BackendProcess) -> None:
    features = fe.get_u64(Request.GET_FEATURES)
    assert features & VIRTIO_F_VERSION_1 and features & VHOST_USER_F_PROTOCOL_FEATURES
    fe.send_raw(Request.SET_FEATURES, protocol.U64.pack(VIRTIO_F_VERSION_1))
    assert fe.get_u64(Request.GET_QUEUE_NUM) == abi.const("VRDMA_NUM_QUEUES")  # still connected, answering
    assert backend.connection("vm0")["features"] == VIRTIO_F_VERSION_1


def test_protocol_features_are_exactly_what_the_backend_implements(fe: Frontend, backend: BackendProcess) -> None:
    offered = fe.get_u64(Request.GET_PROTOCOL_FEATURES)
    assert offered == ProtocolFeature.MQ | ProtocolFeature.REPLY_ACK | ProtocolFeature.CONFIG \
        | ProtocolFeature.CONFIGURE_MEM_SLOTS
    fe.send_raw(Request.SET_PROTOCOL_FEATURES, protocol.U64.pack(offered))
    backend.wait_for_counters("vm0", lambda c: c["connection"]["protocol_features"] == offered,
                              f"protocol features {offered:#x} negotiated")


def test_owner_queue_num_and_memory_slots(fe: Frontend) -> None:
    fe.send_raw(Request.SET_PROTOCOL_FEATURES, protocol.U64.pack(fe.get_u64(Request.GET_PROTOCOL_FEATURES)))
    fe.acked(Request.SET_OWNER)
    assert fe.get_u64(Request.GET_QUEUE_NUM) == abi.const("VRDMA_NUM_QUEUES")
    assert fe.get_u64(Request.GET_MAX_MEM_SLOTS) >= 8
    fe.acked(Request.RESET_OWNER)


def test_mem_table_rings_and_enable_make_a_working_device(fe: Frontend) -> None:
    fe.start()  # SET_MEM_TABLE, SET_VRING_NUM/BASE/ADDR/CALL/KICK/ENABLE on both queues
    assert query_device(fe).hdr.status == abi.const("VRDMA_STATUS_OK")


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
    assert query_device(fe).hdr.status == abi.const("VRDMA_STATUS_OK")


def test_get_config_and_refused_set_config(fe: Frontend) -> None:
    fe.start()
    config = abi.from_bytes("vrdma_config", fe.get_config(abi.sizeof("vrdma_config")))
    assert config.abi_version == abi.const("VRDMA_ABI_VERSION")
    fe.send_raw(Request.SET_CONFIG, protocol.CONFIG_HEADER.pack(0, 4, 0) + b"\xff" * 4,
                flags=protocol.VERSION | protocol.FLAG_NEED_REPLY)
    assert protocol.U64.unpack(fe.reply(Request.SET_CONFIG))[0] != 0  # refused: config space is read-only
    again = abi.from_bytes("vrdma_config", fe.get_config(abi.sizeof("vrdma_config")))
    assert again.abi_version == config.abi_version


def test_add_and_remove_memory_regions(fe: Frontend) -> None:
    fe.start()
    extra = GuestMemory(1 << 20)
    try:
        region = protocol.MEMORY_REGION.pack(1 << 30, extra.size, 0x7E00_0000_0000, 0)
        fe.acked(Request.ADD_MEM_REG, bytes(8) + region, fds=[extra.fd])
        assert query_device(fe).hdr.status == abi.const("VRDMA_STATUS_OK")
        fe.acked(Request.REM_MEM_REG, bytes(8) + region)
        assert query_device(fe).hdr.status == abi.const("VRDMA_STATUS_OK")
    finally:
        extra.close()


def test_event_queue_delivers_port_active(fe: Frontend) -> None:
    fe.start()
    vq = fe.queues[abi.const("VRDMA_QUEUE_EVENT")]
    head, gpas = vq.add([], [abi.sizeof("vrdma_event")])
    vq.notify()
    assert vq.wait_used() == [(head, abi.sizeof("vrdma_event"))]
    event = abi.from_bytes("vrdma_event", fe.memory.read(gpas[0], abi.sizeof("vrdma_event")))
    assert (event.type, event.handle) == (abi.const("VRDMA_EVENT_PORT_ACTIVE"), 1)


def test_vring_state_messages_carry_the_queue_index(fe: Frontend) -> None:
    fe.start()
    fe.acked(Request.SET_VRING_ENABLE, protocol.VRING_STATE.pack(1, 0))
    fe.acked(Request.SET_VRING_ENABLE, protocol.VRING_STATE.pack(1, 1))
    assert struct.unpack("<II", fe.queues[1].address_payload()[:8])[0] == 1
    assert query_device(fe).hdr.status == abi.const("VRDMA_STATUS_OK")


def test_backend_flags_and_paths_fail_in_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    def backend(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "vrdma.cli", "backend", *args], capture_output=True,
                              text=True, timeout=60, check=False)

    bad_flag = backend("--no-such-flag")
    assert bad_flag.returncode == 2 and "unrecognized arguments: --no-such-flag" in bad_flag.stderr
    for args, message in [
        (["--socket-path", str(tmp_path / "missing" / "vm0.sock")], "directory"),
        (["--socket-path", str(tmp_path / ("x" * 120) / "vm0.sock")], "cannot listen on"),
        (["--socket-path", str(tmp_path)], "it exists and is not a socket"),
        (["--socket-path", f"vm0={tmp_path}/a.sock", "--mac", "vm0=nope"], "expected NAME=xx:xx:xx:xx:xx:xx"),
        (["--socket-path", f"vm0={tmp_path}/a.sock", "--mac", "vm9=52:54:00:00:00:01"], "unknown VM"),
        (["--socket-path", f"vm0={tmp_path}/a.sock", "--socket-path", f"vm0={tmp_path}/b.sock"], "unique"),
        (["--fd", "999"], "not a socket"),
        ([], "nothing to serve"),
    ]:
        result = backend(*args)
        assert result.returncode == 1, (args, result.stderr)
        assert message in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, (args, result.stderr)


def test_stopping_every_queue_resets_the_device(fe: Frontend, backend: BackendProcess) -> None:
    fe.start()
    epoch = abi.from_bytes("vrdma_config", fe.get_config(abi.sizeof("vrdma_config"))).device_epoch
    verbs = SimVerbs(fe, backend.directory / "vm0.doorbell")
    verbs.alloc_pd()
    before = backend.counters("vm0")
    assert before["objects"]["ucontext"] == 1 and before["objects"]["pd"] == 1
    assert before["connection"]["queues_started"] == ["control", "event", "wake"]
    for index in range(abi.const("VRDMA_NUM_QUEUES")):  # what QEMU does on a device reset: fetch each ring base
        fe.send_raw(Request.GET_VRING_BASE, protocol.VRING_STATE.pack(index, 0))
        fe.reply(Request.GET_VRING_BASE)
    after = backend.wait_for_counters("vm0", lambda c: c["connection"]["device_resets"] == 1, "a device reset")
    assert after["connection"]["queues_started"] == [] and after["connection"]["state"] == "connected"
    assert after["objects"] == dict.fromkeys(OBJECT_KINDS, 0) and after["doorbell_pages"] == []
    assert abi.from_bytes("vrdma_config", fe.get_config(abi.sizeof("vrdma_config"))).device_epoch != epoch


def test_event_buffer_too_small_is_returned_empty_and_the_event_kept(fe: Frontend) -> None:
    fe.start()
    vq = fe.queues[abi.const("VRDMA_QUEUE_EVENT")]
    small, _ = vq.add([], [8])
    vq.notify()
    assert vq.wait_used() == [(small, 0)]
    head, gpas = vq.add([], [abi.sizeof("vrdma_event")])
    vq.notify()
    assert vq.wait_used() == [(head, abi.sizeof("vrdma_event"))]
    event = abi.from_bytes("vrdma_event", fe.memory.read(gpas[0], abi.sizeof("vrdma_event")))
    assert event.type == abi.const("VRDMA_EVENT_PORT_ACTIVE")
