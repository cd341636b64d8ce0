"""The vhost-user layer over a real socket: framing, validation and libvhost-user behind the cffi binding."""

from __future__ import annotations

import contextlib
import os
import socket
import struct
from collections.abc import Iterator
from contextlib import AbstractContextManager

import pytest

from vrdma.loop import EventLoop
from vrdma.vhost_user import protocol
from vrdma.vhost_user.connection import (
    VHOST_USER_F_PROTOCOL_FEATURES,
    VIRTIO_F_VERSION_1,
    CloseCause,
    MemoryRegion,
    SharedMemoryMap,
    State,
    VhostUserConnection,
)
from vrdma.vhost_user.protocol import Request

pytestmark = pytest.mark.backend

CONFIG = bytes(range(64))


class FakeModel:
    num_queues = 2

    def __init__(self) -> None:
        self.negotiated: int | None = None
        self.disconnect_reason: str | None = None
        self.started: list[tuple[int, bool]] = []
        self.memory: list[MemoryRegion] = []
        self.paused = 0
        self.resets = 0
        self.dirty_logs: list[tuple[int, int]] = []

    def device_features(self) -> int:
        return 0

    def protocol_features(self) -> int:
        return (1 << 0) | (1 << 9)  # MQ, CONFIG

    def features_negotiated(self, features: int) -> None:
        self.negotiated = features

    def config_space(self) -> bytes:
        return CONFIG

    def queue_started(self, device: VhostUserConnection, index: int, started: bool) -> None:
        self.started.append((index, started))

    def queue_kicked(self, device: VhostUserConnection, index: int) -> None:
        pass

    def device_reset(self, device: VhostUserConnection) -> None:
        self.resets += 1

    def dirty_log_changed(self, device: VhostUserConnection) -> None:
        self.dirty_logs.append(device.dirty_log_area())

    def memory_changed(self, device: VhostUserConnection) -> None:
        self.memory = device.memory_regions()

    def shared_memory(self) -> list[SharedMemoryMap]:
        return []

    def disconnected(self, device: VhostUserConnection, reason: str) -> None:
        self.disconnect_reason = reason

    def data_path_paused(self) -> AbstractContextManager[None]:
        self.paused += 1  # a memory message: the model's data path is held around it
        return contextlib.nullcontext()


class Frontend:
    """The frontend end of the socket: sends raw messages, reads replies, runs the backend's loop."""

    def __init__(self, sock: socket.socket, loop: EventLoop) -> None:
        self.sock = sock
        self.loop = loop
        self.sock.settimeout(5)

    def send(self, request: int, payload: bytes = b"", flags: int = protocol.VERSION,
             fds: list[int] | None = None, size: int | None = None) -> None:
        header = protocol.HEADER.pack(request, flags, len(payload) if size is None else size)
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))] if fds else []
        self.sock.sendmsg([header + payload], ancillary)
        while self.loop.run_once(0):
            pass

    def reply(self) -> tuple[int, int, bytes]:
        header = self.sock.recv(protocol.HEADER.size, socket.MSG_WAITALL)
        request, flags, size = protocol.HEADER.unpack(header)
        return request, flags, self.sock.recv(size, socket.MSG_WAITALL) if size else b""

    def u64(self, request: int) -> int:
        self.send(request)
        got, flags, payload = self.reply()
        assert got == request and flags == protocol.VERSION | protocol.FLAG_REPLY
        return int(protocol.U64.unpack(payload)[0])


@pytest.fixture()
def pair() -> Iterator[tuple[Frontend, VhostUserConnection, FakeModel]]:
    loop = EventLoop()
    front, back = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    model = FakeModel()
    device = VhostUserConnection("vm-test", back, loop, model)
    yield Frontend(front, loop), device, model
    device.close("test over", CloseCause.STOPPING)
    front.close()
    loop.close()


def closed(device: VhostUserConnection, model: FakeModel, reason: str) -> bool:
    return device.state is State.CLOSED and reason in (model.disconnect_reason or "")


def test_feature_negotiation(pair: tuple[Frontend, VhostUserConnection, FakeModel]) -> None:
    front, device, model = pair
    features = front.u64(Request.GET_FEATURES)
    assert features & VIRTIO_F_VERSION_1 and features & VHOST_USER_F_PROTOCOL_FEATURES
    assert front.u64(Request.GET_PROTOCOL_FEATURES) == model.protocol_features()
    front.send(Request.SET_FEATURES, protocol.U64.pack(VIRTIO_F_VERSION_1))
    assert model.negotiated == VIRTIO_F_VERSION_1
    assert front.u64(Request.GET_QUEUE_NUM) == 2
    assert device.state is State.CONNECTED


def test_get_config_returns_the_model_config(pair: tuple[Frontend, VhostUserConnection, FakeModel]) -> None:
    front, _, model = pair
    front.u64(Request.GET_FEATURES)
    front.send(Request.SET_PROTOCOL_FEATURES, protocol.U64.pack(model.protocol_features()))
    front.send(Request.GET_CONFIG, protocol.CONFIG_HEADER.pack(0, 16, 0) + bytes(16))
    request, _, payload = front.reply()
    assert request == Request.GET_CONFIG
    assert payload[protocol.CONFIG_HEADER.size:] == CONFIG[:16]


def test_none_request_disconnects_only_and_does_not_exit(pair: tuple[Frontend, VhostUserConnection, FakeModel]) -> None:
    front, device, model = pair
    assert front.u64(Request.GET_FEATURES)
    front.send(Request.NONE)
    assert closed(device, model, "NONE is not supported")  # and this test process is still alive


@pytest.mark.parametrize(("request_", "payload", "flags", "size", "reason"), [
    (Request.GET_FEATURES, b"", 0x0, None, "protocol version 0"),
    (Request.GET_FEATURES, b"", 0x2, None, "protocol version 2"),
    (Request.GET_FEATURES, b"", 0x1 | 0x10, None, "unknown flag bits 0x10"),
    (Request.GET_FEATURES, b"", 0x1 | protocol.FLAG_REPLY, None, "reply flag"),
    (Request.GET_FEATURES, b"", 0x1, 4096, "announces a 4096-byte payload"),
    (Request.SET_FEATURES, b"\0" * 4, 0x1, None, "SET_FEATURES with a 4-byte payload (expected 8)"),
    (Request.GET_FEATURES, b"\0" * 8, 0x1, None, "GET_FEATURES with a 8-byte payload (expected 0)"),
    (999, b"", 0x1, None, "request 999 is not supported"),
    (Request.SET_LOG_BASE, b"\0" * 16, 0x1, None, "SET_LOG_BASE came with 0 file descriptors (expected 1)"),
    (Request.SET_LOG_FD, b"\0" * 8, 0x1, None, "SET_LOG_FD is not supported"),
    (Request.SET_VRING_NUM, protocol.VRING_STATE.pack(2, 64), 0x1, None, "queue 2; the device has 2 queues"),
    (Request.SET_VRING_KICK, protocol.U64.pack(7 | protocol.VRING_NOFD), 0x1, None, "queue 7"),
    (Request.SET_VRING_KICK, protocol.U64.pack(0), 0x1, None, "came with 0 file descriptors (expected 1)"),
    (Request.SET_VRING_KICK, protocol.U64.pack(1 << 20 | protocol.VRING_NOFD), 0x1, None, "unknown bits"),
    (Request.SET_MEM_TABLE, protocol.MEMORY_HEADER.pack(0, 0), 0x1, None, "with 0 regions"),
    (Request.SET_MEM_TABLE, protocol.MEMORY_HEADER.pack(9, 0), 0x1, None, "with 9 regions"),
    (Request.SET_MEM_TABLE, protocol.MEMORY_HEADER.pack(1, 0) + bytes(32), 0x1, None,
     "came with 0 file descriptors (expected 1)"),
    (Request.GET_CONFIG, protocol.CONFIG_HEADER.pack(0, 300, 0), 0x1, None, "GET_CONFIG of 300 bytes"),
    (Request.GET_CONFIG, protocol.CONFIG_HEADER.pack(250, 16, 0) + bytes(16), 0x1, None, "at offset 250"),
    (Request.GET_CONFIG, protocol.CONFIG_HEADER.pack(0, 16, 0), 0x1, None, "with a 12-byte payload"),
])
def test_malformed_message_closes_the_device(pair: tuple[Frontend, VhostUserConnection, FakeModel], request_: int,
                                             payload: bytes, flags: int, size: int | None, reason: str) -> None:
    front, device, model = pair
    front.send(request_, payload, flags=flags, size=size)
    assert closed(device, model, reason), model.disconnect_reason


def test_unexpected_file_descriptor_is_refused_and_closed(
        pair: tuple[Frontend, VhostUserConnection, FakeModel]) -> None:
    front, device, model = pair
    read_end, write_end = os.pipe()
    front.send(Request.GET_FEATURES, fds=[read_end])
    assert closed(device, model, "GET_FEATURES came with 1 file descriptors (expected 0)")
    os.close(read_end)
    os.close(write_end)


def test_partial_message_waits_without_blocking(pair: tuple[Frontend, VhostUserConnection, FakeModel]) -> None:
    front, device, model = pair
    header = protocol.HEADER.pack(Request.SET_FEATURES, protocol.VERSION, 8)
    front.sock.sendall(header + b"\0\0")  # header and 2 of 8 payload bytes
    while front.loop.run_once(0):
        pass
    assert device.state is State.CONNECTED and model.negotiated is None
    front.sock.sendall(protocol.U64.pack(VIRTIO_F_VERSION_1)[2:])
    while front.loop.run_once(0):
        pass
    assert model.negotiated == VIRTIO_F_VERSION_1


def test_frontend_hang_up_frees_the_device(pair: tuple[Frontend, VhostUserConnection, FakeModel]) -> None:
    front, device, model = pair
    front.sock.close()
    while front.loop.run_once(0):
        pass
    assert closed(device, model, "the frontend disconnected")


def test_descriptors_belong_to_the_message_they_were_sent_with(
        pair: tuple[Frontend, VhostUserConnection, FakeModel]) -> None:
    """QEMU sends SET_FEATURES and then SET_VRING_CALL (with an eventfd) back to back: both wait in the socket
    before the backend reads, and the eventfd must go with the second message, not the first."""
    front, device, model = pair
    call = os.eventfd(0)
    header = protocol.HEADER.pack(Request.SET_FEATURES, protocol.VERSION, 8)
    front.sock.sendmsg([header + protocol.U64.pack(VIRTIO_F_VERSION_1)])
    header = protocol.HEADER.pack(Request.SET_VRING_CALL, protocol.VERSION, 8)
    front.sock.sendmsg([header + protocol.U64.pack(0)],
                       [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", call))])
    os.close(call)
    while front.loop.run_once(0):
        pass
    assert device.state is State.CONNECTED, model.disconnect_reason
    assert model.negotiated == VIRTIO_F_VERSION_1


def test_an_exception_in_the_model_closes_only_that_device(
        pair: tuple[Frontend, VhostUserConnection, FakeModel], monkeypatch: pytest.MonkeyPatch) -> None:
    front, device, model = pair

    def broken_config() -> bytes:
        raise RuntimeError("model bug")

    monkeypatch.setattr(model, "config_space", broken_config)
    front.u64(Request.GET_FEATURES)
    front.send(Request.SET_PROTOCOL_FEATURES, protocol.U64.pack(model.protocol_features()))
    front.send(Request.GET_CONFIG, protocol.CONFIG_HEADER.pack(0, 16, 0) + bytes(16))
    assert closed(device, model, "_get_config_cb failed: model bug"), model.disconnect_reason


def test_a_reused_fd_number_is_watched_even_if_the_old_one_was_never_removed() -> None:
    """An fd closed without remove_reader leaves its number in the selector; a new fd with that number must still be
    watched (with modify(), only the callback changed and the new fd never woke the loop)."""
    loop = EventLoop()
    old_r, old_w = os.pipe()
    loop.add_reader(old_r, lambda: None)
    os.close(old_r)
    os.close(old_w)
    new_r, new_w = os.pipe()
    try:
        assert new_r == old_r  # the lowest free number: the one just closed
        woke: list[int] = []
        loop.add_reader(new_r, lambda: woke.append(new_r))
        os.write(new_w, b"x")
        assert loop.run_once(timeout=5) == 1 and woke == [new_r]
    finally:
        os.close(new_r)
        os.close(new_w)
        loop.close()


# -- the device's state through the frontend's pipe (VHOST_USER_PROTOCOL_F_DEVICE_STATE) ---------------------------

class StatefulModel(FakeModel):
    """A model that migrates: its state is ``state``; a state it loads becomes ``loaded`` unless it starts with
    b"bad"."""

    def __init__(self, state: bytes) -> None:
        super().__init__()
        self.state = state
        self.loaded: bytes | None = None

    def protocol_features(self) -> int:
        return super().protocol_features() | protocol.ProtocolFeature.DEVICE_STATE

    def save_device_state(self, device: VhostUserConnection) -> bytes:
        return self.state

    def load_device_state(self, device: VhostUserConnection, data: bytes) -> None:
        if data.startswith(b"bad"):
            raise ValueError("not a state of this device")
        self.loaded = data


@pytest.fixture()
def stateful() -> Iterator[tuple[Frontend, VhostUserConnection, StatefulModel]]:
    loop = EventLoop()
    front, back = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    model = StatefulModel(bytes(range(256)) * (3 << 12))  # 3 MiB: the pipe takes 64 KiB at a time
    device = VhostUserConnection("vm-test", back, loop, model)
    yield Frontend(front, loop), device, model
    device.close("test over", CloseCause.STOPPING)
    front.close()
    loop.close()


def set_state_fd(front: Frontend, direction: int, fd: int) -> int:
    front.send(Request.SET_DEVICE_STATE_FD, protocol.DEVICE_STATE.pack(direction, protocol.STATE_STOPPED), fds=[fd])
    os.close(fd)  # as QEMU closes its copy of the end it passed
    request, flags, payload = front.reply()
    assert (request, flags) == (Request.SET_DEVICE_STATE_FD, protocol.VERSION | protocol.FLAG_REPLY)
    return int(protocol.U64.unpack(payload)[0])


def test_a_saved_state_streams_through_the_frontends_pipe_without_blocking_the_loop(
        stateful: tuple[Frontend, VhostUserConnection, StatefulModel]) -> None:
    """SAVE: the reply first (no descriptor back: VRING_NOFD), then the state, 3 MiB through a 64 KiB pipe as the
    frontend reads it, while the loop stays free; EOF at its end; CHECK_DEVICE_STATE 0."""
    front, device, model = stateful
    assert front.u64(Request.GET_PROTOCOL_FEATURES) & protocol.ProtocolFeature.DEVICE_STATE
    read_end, write_end = os.pipe()
    assert set_state_fd(front, protocol.STATE_SAVE, write_end) == protocol.VRING_NOFD
    os.set_blocking(read_end, False)
    got = bytearray()
    while True:
        front.loop.run_once(0.1)
        try:
            chunk = os.read(read_end, 1 << 20)
        except BlockingIOError:
            continue
        if not chunk:
            break
        got += chunk
    os.close(read_end)
    assert bytes(got) == model.state
    assert front.u64(Request.CHECK_DEVICE_STATE) == 0
    assert device.state is State.CONNECTED


def load(front: Frontend, data: bytes) -> int:
    """LOAD ``data`` as QEMU does: the descriptor, the bytes, its end closed, CHECK_DEVICE_STATE's answer."""
    read_end, write_end = os.pipe()
    assert set_state_fd(front, protocol.STATE_LOAD, read_end) == protocol.VRING_NOFD
    os.set_blocking(write_end, False)
    at = 0
    while at < len(data):
        try:
            at += os.write(write_end, data[at:at + (1 << 20)])
        except BlockingIOError:
            front.loop.run_once(0.1)
    os.close(write_end)
    return front.u64(Request.CHECK_DEVICE_STATE)


def test_a_loaded_state_is_read_as_it_comes_and_given_to_the_model_at_check(
        stateful: tuple[Frontend, VhostUserConnection, StatefulModel]) -> None:
    front, device, model = stateful
    assert load(front, model.state) == 0
    assert model.loaded == model.state
    assert load(front, b"bad state") == 1  # refused by the model: the migration fails, the device stays
    assert model.loaded == model.state and device.state is State.CONNECTED


def test_device_state_requests_out_of_turn_fail_the_transfer_not_the_device(
        stateful: tuple[Frontend, VhostUserConnection, StatefulModel],
        pair: tuple[Frontend, VhostUserConnection, FakeModel]) -> None:
    """A CHECK without a SET answers 1; a SAVE whose state the frontend did not read to its end answers 1; a model
    that does not migrate refuses SET with 1; each connection goes on. A direction or phase that does not exist is a
    protocol error."""
    front, device, _ = stateful
    assert front.u64(Request.CHECK_DEVICE_STATE) == 1
    read_end, write_end = os.pipe()
    assert set_state_fd(front, protocol.STATE_SAVE, write_end) == protocol.VRING_NOFD
    os.close(read_end)
    front.loop.run_once(0.1)
    assert front.u64(Request.CHECK_DEVICE_STATE) == 1
    plain_front, plain_device, _ = pair
    read_end, write_end = os.pipe()
    assert set_state_fd(plain_front, protocol.STATE_LOAD, read_end) == 1
    os.close(write_end)
    assert device.state is State.CONNECTED and plain_device.state is State.CONNECTED
    read_end, write_end = os.pipe()
    front.send(Request.SET_DEVICE_STATE_FD, protocol.DEVICE_STATE.pack(2, protocol.STATE_STOPPED), fds=[read_end])
    os.close(read_end)
    os.close(write_end)
    assert device.state is State.CLOSED
