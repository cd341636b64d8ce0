"""The device-state transfer of vhost-user (VHOST_USER_PROTOCOL_F_DEVICE_STATE): SET_DEVICE_STATE_FD hands the
back-end one end of a pipe through which its state leaves (SAVE) or arrives (LOAD), CHECK_DEVICE_STATE asks whether
it moved. QEMU 10.0's libvhost-user implements neither, so the protocol layer does, never blocking the event loop:
QEMU reads or writes the pipe only after its reply, blocking on it meanwhile (docs/migration.md)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from vrdma.loop import EventLoop
from vrdma.vhost_user import protocol

if TYPE_CHECKING:
    from vrdma.vhost_user.connection import VhostUserConnection

log = logging.getLogger(__name__)

MAX_DEVICE_STATE = 1 << 30  # bytes a state the frontend sends may have, at most
STATE_CHUNK = 1 << 20       # bytes moved per turn of the loop (QEMU reads and writes the pipe a MiB at a time)


@runtime_checkable
class DeviceStateModel(Protocol):
    """What a device model that migrates gives the vhost-user layer besides a DeviceModel's (it offers
    ProtocolFeature.DEVICE_STATE): its state as bytes, the device stopped; and a state to take, which it refuses by
    raising ValueError (the frontend's migration then fails)."""

    def save_device_state(self, device: VhostUserConnection) -> bytes: ...
    def load_device_state(self, device: VhostUserConnection, data: bytes) -> None: ...


@dataclass
class StateTransfer:
    """A device state moving through the frontend's pipe (SET_DEVICE_STATE_FD): written out from the event loop as
    the pipe takes it (SAVE), or read in as it arrives (LOAD), never blocking the loop; CHECK_DEVICE_STATE ends it."""

    direction: int
    fd: int
    data: bytearray
    at: int = 0
    done: bool = False
    failed: str = ""


class DeviceStateChannel:
    """The transfer of one connection: at most one under way, from SET_DEVICE_STATE_FD until CHECK_DEVICE_STATE."""

    def __init__(self, device: VhostUserConnection, loop: EventLoop) -> None:
        self.device = device
        self.loop = loop
        self.transfer: StateTransfer | None = None

    @property
    def active(self) -> bool:
        """A transfer is under way (begun and not yet checked)."""
        return self.transfer is not None

    def set_fd(self, message: protocol.Message) -> int:
        """SAVE: the model's state, taken now (the device is stopped), streamed into the pipe once the loop runs
        again, after the reply; LOAD: the pipe read into a buffer as the frontend writes it. Returns the reply's
        value: the pipe accepted (VRING_NOFD: no descriptor back) or an error."""
        device, model = self.device, self.device.model
        direction = protocol.DEVICE_STATE.unpack(message.payload)[0]
        fd = message.fds.pop()
        self.end()
        if not isinstance(model, DeviceStateModel) or not device.offered_protocol_features & \
                protocol.ProtocolFeature.DEVICE_STATE:
            log.warning("%s: SET_DEVICE_STATE_FD, and the device does not migrate", device.name)
            os.close(fd)
            return 1
        data = bytearray()
        if direction == protocol.STATE_SAVE:
            try:
                data = bytearray(model.save_device_state(device))
            except Exception as err:  # the model's refusal (or failure) fails the migration, not the device
                log.error("%s: the device's state cannot be saved: %s", device.name, err)
                os.close(fd)
                return 1
        self.transfer = StateTransfer(direction, fd, data)
        os.set_blocking(fd, False)
        if direction == protocol.STATE_SAVE:
            self.loop.add_writer(fd, self._write)
        else:
            self.loop.add_reader(fd, self._on_readable)
        log.info("%s: device state transfer (%s) begins", device.name,
                 "save" if direction == protocol.STATE_SAVE else "load")
        return protocol.VRING_NOFD

    def _write(self) -> None:
        t = self.transfer
        if t is None or t.done:
            return
        try:
            while t.at < len(t.data):
                t.at += os.write(t.fd, t.data[t.at:t.at + STATE_CHUNK])
        except BlockingIOError:
            return  # the pipe is full: the frontend reads, the loop comes back
        except OSError as err:
            t.failed = f"writing the state: {err}"
        self._finish(t)

    def _on_readable(self) -> None:
        if self.transfer is not None:
            self._read(self.transfer)

    def _read(self, t: StateTransfer) -> bool:
        """Read what the pipe holds; True once the frontend closed its end (or the transfer failed)."""
        if t.done:
            return True
        try:
            while chunk := os.read(t.fd, STATE_CHUNK):
                t.data += chunk
                if len(t.data) > MAX_DEVICE_STATE:
                    t.failed = f"a state of more than {MAX_DEVICE_STATE} bytes"
                    break
        except BlockingIOError:
            return False
        except OSError as err:
            t.failed = f"reading the state: {err}"
        self._finish(t)
        return True

    def _finish(self, t: StateTransfer) -> None:
        """The pipe's end of the backend closed: EOF for a reading frontend, EPIPE for a writing one that sends on."""
        if t.fd >= 0:
            self.loop.remove_reader(t.fd)
            os.close(t.fd)
            t.fd = -1
        t.done = True

    def end(self) -> None:
        if self.transfer is not None:
            self._finish(self.transfer)
            self.transfer = None

    def check(self) -> int:
        """After the frontend read the state to its end (SAVE) or closed its end of the pipe (LOAD, so what is left in
        the pipe is there now): 0 when the state moved and, loading, the model took it; 1 otherwise."""
        device = self.device
        t, self.transfer = self.transfer, None
        failed = "no SET_DEVICE_STATE_FD before it" if t is None else ""
        if t is not None and t.direction == protocol.STATE_LOAD and not t.failed and not self._read(t):
            t.failed = "the frontend had not closed its end of the pipe"
        if t is not None:
            self._finish(t)
            failed = t.failed or ("the frontend did not read the whole state" if t.direction ==
                                  protocol.STATE_SAVE and t.at < len(t.data) else "")
        if not failed and t is not None and t.direction == protocol.STATE_LOAD:
            try:
                assert isinstance(device.model, DeviceStateModel)
                device.model.load_device_state(device, bytes(t.data))
            except Exception as err:  # a refused state fails the migration; the device goes on as it was
                failed = f"the device refused the state: {err}"
        if failed:
            log.error("%s: device state transfer failed: %s", device.name, failed)
        else:
            log.info("%s: device state transfer done (%d bytes)", device.name, len(t.data) if t else 0)
        return 1 if failed else 0
