"""One vhost-user connection: the frontend (QEMU) of one VM's device, served through libvhost-user (cffi binding).

The rest of the backend sees only this module's small API: a ``DeviceModel`` supplies features and config space
and handles queue kicks; ``VhostUserConnection`` owns the connection, the memory table and the vrings, and offers
guest-memory translation and virtqueue pop/push/notify. No RDMA knowledge lives here.

Every message is framed and validated by ``protocol`` before libvhost-user processes it. libvhost-user's panic
callback and any protocol error mark only this connection broken and close only it. (The device is the RDMA
device behind the ``DeviceModel``; this is the vhost-user side of it, named for what it is.)
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import socket
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any, Protocol

from vrdma.faultguard import FaultGuard
from vrdma.loop import EventLoop
from vrdma.vhost_user import protocol
from vrdma.vhost_user.dirty_log import LOG, DirtyLog
from vrdma.vhost_user.state_transfer import DeviceStateChannel

try:
    from vrdma.vhost_user._libvhost_user import ffi, lib
except ImportError as err:  # pragma: no cover - depends on the build
    raise ImportError("the libvhost-user binding is not built: run `make backend` "
                      "(python -m vrdma.vhost_user._build)") from err

log = logging.getLogger(__name__)

VU_WATCH_IN = 1 << 0
# cffi's types, looked up once: the control path pops, reads and writes through them for every command, and cffi
# parses a type's name each time it is given one.
_UINTPTR, _CHAR_P = ffi.typeof("uintptr_t"), ffi.typeof("char *")
_VU_DEV_P, _ELEMENT_P = ffi.typeof("VuDev *"), ffi.typeof("VuVirtqElement *")
_ELEMENT_SIZE = ffi.sizeof("VuVirtqElement")
VIRTIO_F_VERSION_1 = 1 << 32
VHOST_USER_F_PROTOCOL_FEATURES = 1 << 30
# Messages after which the guest's memory table may look different.
MEMORY_TABLE_REQUESTS = frozenset({protocol.Request.SET_MEM_TABLE, protocol.Request.ADD_MEM_REG,
                                   protocol.Request.REM_MEM_REG})


@dataclass(frozen=True)
class SharedMemoryMap:
    """A range of a file the device maps into one of its VIRTIO shared memory regions (shmid) in the guest: sent
    to the frontend (VHOST_USER_BACKEND_SHMEM_MAP) once it has given the backend channel. The fd stays the
    model's."""

    shmid: int
    fd: int
    length: int
    fd_offset: int = 0
    shm_offset: int = 0
    writable: bool = True


@dataclass(frozen=True)
class MemoryRegion:
    """One region of the guest's memory table: guest-physical start and size, and its address in this process
    (``mapping``: the whole mmap behind it, from its page-aligned start, for the fault guard)."""

    gpa: int
    size: int
    host_address: int
    mapping: tuple[int, int]

VHOST_F_LOG_ALL = 26  # the virtio feature bit a frontend acks while it migrates: writes are logged

if lib.vrdma_payload_size() != protocol.MAX_PAYLOAD or lib.vrdma_max_fds() != protocol.MAX_FDS:
    raise ImportError(f"libvhost-user's message layout ({lib.vrdma_payload_size()} bytes, {lib.vrdma_max_fds()} "
                      f"fds) differs from vrdma.vhost_user.protocol ({protocol.MAX_PAYLOAD}, {protocol.MAX_FDS})")


class DeviceModel(Protocol):
    """What a device implementation gives the vhost-user layer."""

    num_queues: int

    def device_features(self) -> int: ...
    def protocol_features(self) -> int: ...
    def features_negotiated(self, features: int) -> None: ...
    def config_space(self) -> bytes: ...
    def shared_memory(self) -> list[SharedMemoryMap]: ...
    def queue_started(self, device: VhostUserConnection, index: int, started: bool) -> None: ...
    def queue_kicked(self, device: VhostUserConnection, index: int) -> None: ...
    # VHOST_USER_RESET_DEVICE (with ProtocolFeature.RESET_DEVICE offered): the driver or the machine reset the
    # device; every queue is stopped already. Without it, a frontend's stop and a reset look the same.
    def device_reset(self, device: VhostUserConnection) -> None: ...
    # The frontend's dirty log changed (SET_LOG_BASE), or logging was turned on or off (SET_FEATURES' LOG_ALL):
    # device.dirty_log_area() says where to mark the guest pages the model writes other than through this layer.
    def dirty_log_changed(self, device: VhostUserConnection) -> None: ...
    def memory_changed(self, device: VhostUserConnection) -> None: ...
    def disconnected(self, device: VhostUserConnection, reason: str) -> None: ...
    # Held while a memory message remaps guest memory and memory_changed runs: nothing of the device's that runs
    # in another thread may touch guest memory meanwhile.
    def data_path_paused(self) -> AbstractContextManager[None]: ...


class CloseCause(enum.Enum):
    """Why a connection ended, for counters (the reason text is for people)."""

    DISCONNECTED = "disconnected"        # the frontend closed its socket
    PROTOCOL_ERROR = "protocol error"    # a message or ring libvhost-user or the protocol layer refused
    MEMORY_FAULT = "memory fault"        # guest memory (or the VM's doorbell region) was truncated under us
    DEVICE_ERROR = "device error"        # the device model failed
    STOPPING = "stopping"                # the backend is shutting down
    REFUSED = "refused"                  # the device model will not serve this frontend (VhostUserConnection.refuse)
    MIGRATED = "migrated"                # the VM runs on another frontend now (a migration's source, let go)


class State(enum.Enum):
    CONNECTED = "connected"
    BROKEN = "broken"
    CLOSED = "closed"


@dataclass
class Element:
    """A popped virtqueue element: device-readable and device-writable buffers as (address, length)."""

    out_sg: list[tuple[int, int]]
    in_sg: list[tuple[int, int]]
    handle: Any  # the VuVirtqElement *, freed after push

    @property
    def writable(self) -> int:
        """Bytes the device may write into this chain."""
        return sum(length for _, length in self.in_sg)


class VhostUserConnection:
    def __init__(self, name: str, sock: socket.socket, loop: EventLoop, model: DeviceModel,
                 guard: FaultGuard | None = None,
                 on_closed: Callable[[CloseCause, str], None] | None = None) -> None:
        """``guard``: contain SIGBUS in the guest's memory (the backend has one; in-process tests may not).
        ``on_closed``: told the reason once the connection is closed and everything of it freed."""
        self.name = name
        self.on_closed = on_closed
        self.sock = sock
        self.loop = loop
        self.model = model
        self.state = State.CONNECTED
        self.broken_reason = ""
        self.broken_cause = CloseCause.PROTOCOL_ERROR
        self.config_reads = 0
        self.shared_memory_maps = 0  # VHOST_USER_BACKEND_SHMEM_MAP requests sent
        self.negotiated_features: int | None = None           # what SET_FEATURES negotiated (None: not yet)
        self.negotiated_protocol_features: int | None = None  # what SET_PROTOCOL_FEATURES negotiated
        self.sock.setblocking(False)
        self.device_state = DeviceStateChannel(self, loop)  # SET_DEVICE_STATE_FD, CHECK_DEVICE_STATE
        self.dirty_log: DirtyLog | None = None  # SET_LOG_BASE's (live migration)
        # A duplicate of each guest memory region's fd by its guest-physical start (libvhost-user closes its own
        # after mapping): what a backend upgrade hands to the next process (vrdma.vhost_user.handover).
        self.memory_fds: dict[int, int] = {}
        self.replaying = False  # messages of a backend upgrade's hand-over (handover.replay), not the frontend's
        self.reader = protocol.MessageReader(sock)
        self._handle = ffi.new_handle(self)
        self._vu = ffi.new("VrdmaVu *")
        self._iface = ffi.new("VuDevIface *")
        self._iface.get_features = lib.vrdma_get_features
        self._iface.set_features = lib.vrdma_set_features
        self._iface.get_protocol_features = lib.vrdma_get_protocol_features
        self._iface.set_protocol_features = lib.vrdma_set_protocol_features
        self._iface.queue_set_started = lib.vrdma_queue_set_started
        self._iface.get_config = lib.vrdma_get_config
        self._watches: dict[int, tuple[Any, Any]] = {}
        self._dev = ffi.cast(_VU_DEV_P, self._vu)  # the VuDev self._vu starts with (as long-lived as it)
        if not lib.vrdma_vu_init(self._vu, model.num_queues, sock.fileno(), self._handle, self._iface):
            raise OSError(f"{name}: libvhost-user could not initialise the device")
        self._guard = guard.owner(f"{name} guest memory", self._memory_fault) if guard is not None else None
        _DEVICES[int(ffi.cast(_UINTPTR, self._dev))] = self
        loop.add_reader(sock.fileno(), self._readable)
        log.info("%s: frontend connected", name)

    # -- incoming messages ------------------------------------------------------------------------------------

    def _readable(self) -> None:
        try:
            messages = self.reader.read()
        except EOFError:
            self.close("the frontend disconnected", CloseCause.DISCONNECTED)
            return
        except (protocol.ProtocolError, OSError) as err:
            self.close(f"protocol error: {err}", CloseCause.PROTOCOL_ERROR)
            return
        for message in messages:
            if self.state is not State.CONNECTED:
                message.close_fds()
                continue
            self._handle_message(message)

    def _handle_message(self, message: protocol.Message) -> None:
        try:
            protocol.validate(message, self.model.num_queues)
        except protocol.ProtocolError as err:
            message.close_fds()
            self.close(f"protocol error: {err}", CloseCause.PROTOCOL_ERROR)
            return
        log.debug("%s: %s", self.name, message.name())
        if message.request == protocol.Request.ADD_MEM_REG:
            try:  # the new region against the table libvhost-user holds (the protocol layer has no state)
                protocol.check_regions(protocol.memory_regions(message),
                                       [(r.gpa, r.size) for r in self.memory_regions()])
            except protocol.ProtocolError as err:
                message.close_fds()
                self.close(f"protocol error: {err}", CloseCause.PROTOCOL_ERROR)
                return
        if message.request == protocol.Request.GET_PROTOCOL_FEATURES:
            # libvhost-user would add features of its own (log, postcopy, backend channel) that this backend
            # does not implement: the offer is the model's, limited to what the protocol layer accepts.
            self._reply(message, protocol.U64.pack(self.offered_protocol_features))
            return
        if message.request == protocol.Request.SET_DEVICE_STATE_FD:
            # (libvhost-user of QEMU 10.0 has neither of these two)
            self._reply(message, protocol.U64.pack(self.device_state.set_fd(message)))
            return
        if message.request == protocol.Request.CHECK_DEVICE_STATE:
            self._reply(message, protocol.U64.pack(self.device_state.check()))
            return
        if message.request == protocol.Request.SET_LOG_BASE:
            self._set_log_base(message)  # (never libvhost-user's: dirty_log.py says why)
            return
        if message.request == protocol.Request.SET_CONFIG:
            # Config space is read-only. libvhost-user would call panic (and so drop the device) when the model
            # refuses a write; a refusal is an answer, not a protocol error: REPLY_ACK failure, if asked for.
            log.warning("%s: the driver wrote read-only config space: refused", self.name)
            if message.need_reply:
                self._reply(message, protocol.U64.pack(1))
            return
        if message.request == protocol.Request.SET_PROTOCOL_FEATURES:
            unoffered = protocol.U64.unpack(message.payload)[0] & ~self.offered_protocol_features
            if unoffered:
                self.close(f"protocol error: SET_PROTOCOL_FEATURES with features never offered: {unoffered:#x}",
                           CloseCause.PROTOCOL_ERROR)
                return
        if message.request == protocol.Request.RESET_DEVICE:
            # libvhost-user of QEMU 10.0 knows this reset only by its older name (every ring disabled).
            message = replace(message, request=protocol.Request.RESET_OWNER)
        remaps = message.request in MEMORY_TABLE_REQUESTS
        kept = _duplicates(message) if remaps else {}
        # libvhost-user unmaps and maps guest memory in dispatch; the model learns the new table after: whatever the
        # model runs in another thread waits between the two (and the fault guard's ranges change meanwhile too).
        with self.model.data_path_paused() if remaps else contextlib.nullcontext():
            fds = ffi.new("int[]", message.fds or [0])
            status = lib.vrdma_vu_dispatch(self._vu, message.request, message.flags, message.payload,
                                           len(message.payload), fds, len(message.fds))
            message.fds = []  # libvhost-user owns them now
            if remaps:
                self._keep_memory_fds(kept, message.request == protocol.Request.SET_MEM_TABLE)
            if status != 0 or self._broken():
                self.close(self.broken_reason or f"libvhost-user failed to process {message.name()}",
                           self.broken_cause)
                return
            if remaps:
                try:
                    if self._guard is not None:
                        self._guard.guard_ranges([r.mapping for r in self.memory_regions()])
                    self.model.memory_changed(self)
                except Exception as err:  # the model's failure ends this VM's connection, never the process
                    log.exception("%s: the device model failed on the new memory table", self.name)
                    self.close(f"device model error: {err}", CloseCause.DEVICE_ERROR)
                    return
        if message.request == protocol.Request.SET_BACKEND_REQ_FD:
            self._map_shared_memory()
        elif message.request in (protocol.Request.RESET_OWNER, protocol.Request.SET_VRING_ENABLE,
                                 protocol.Request.SET_FEATURES):
            try:
                self._tell_model(message)
            except Exception as err:  # the model's failure ends this VM's connection, never the process
                log.exception("%s: the device model failed on %s", self.name, message.name())
                self.close(f"device model error: {err}", CloseCause.DEVICE_ERROR)

    def _tell_model(self, message: protocol.Message) -> None:
        if message.request == protocol.Request.SET_FEATURES:
            self.model.dirty_log_changed(self)  # LOG_ALL may have come or gone
            return
        if message.request == protocol.Request.RESET_OWNER:
            self.model.device_reset(self)  # (libvhost-user only disabled the rings)
            return
        # A queue enabled is looked at once, as if kicked: after a stop (or a migration) the driver's kicks of the
        # chains it queued meanwhile reached the frontend, not this backend, and nobody kicks them again.
        index, enabled = protocol.VRING_STATE.unpack(message.payload)
        if enabled and not self.replaying and lib.vu_queue_started(self._dev, lib.vu_get_queue(self._dev, index)):
            self.model.queue_kicked(self, index)

    def _map_shared_memory(self) -> None:
        """The backend channel is up: map what the model shares (a frontend without shared memory regions, e.g.
        the generic vhost-user-device, refuses and says so in its log; the model's memory stays reachable the
        way it was before, e.g. a doorbell file the frontend maps by path)."""
        features = self.negotiated_protocol_features or 0
        needed = protocol.ProtocolFeature.SHMEM | protocol.ProtocolFeature.BACKEND_SEND_FD
        if features & needed != needed or self.replaying:  # (a hand-over's frontend has it mapped already)
            return
        for region in self.model.shared_memory():
            flags = protocol.SHMEM_MAP_RW if region.writable else 0
            if lib.vrdma_vu_shmem_map(self._vu, region.shmid, region.fd_offset, region.shm_offset, region.length,
                                      flags, region.fd) != 0:
                log.warning("%s: could not ask the frontend to map shared memory region %d", self.name,
                            region.shmid)
                continue
            self.shared_memory_maps += 1
            log.info("%s: shared memory region %d: %d bytes mapped (fd %d)", self.name, region.shmid,
                     region.length, region.fd)

    # -- the dirty log (live migration) ---------------------------------------------------------------------------

    def _set_log_base(self, message: protocol.Message) -> None:
        """The frontend's new log: mapped and checked, the model told, the old one unmapped after (the model's engine
        lets go of it first). QEMU waits for a reply whether or not it asked for one."""
        size, offset = LOG.unpack(message.payload)
        fd = message.fds.pop()
        try:
            if not (self.negotiated_protocol_features or 0) & protocol.ProtocolFeature.LOG_SHMFD:
                raise protocol.UnsupportedRequest("SET_LOG_BASE without VHOST_USER_PROTOCOL_F_LOG_SHMFD negotiated")
            new = DirtyLog(fd, size, offset)
        except (protocol.ProtocolError, OSError) as err:
            self.close(f"protocol error: {err}", CloseCause.PROTOCOL_ERROR)
            return
        finally:
            os.close(fd)
        old, self.dirty_log = self.dirty_log, new
        try:
            self.model.dirty_log_changed(self)
        except Exception as err:  # the model's failure ends this VM's connection, never the process
            log.exception("%s: the device model failed on the dirty log", self.name)
            self.close(f"device model error: {err}", CloseCause.DEVICE_ERROR)
            return
        finally:
            if old is not None:
                old.close()
        log.info("%s: dirty log of %d bytes", self.name, size)
        self._reply(message, protocol.U64.pack(0))

    def dirty_log_area(self) -> tuple[int, int]:
        """(address here, bytes) of the log that guest pages written must be marked in, (0, 0) when not logging:
        the frontend gave one and turned logging on (VHOST_F_LOG_ALL, a feature it acks only while it migrates)."""
        if self.dirty_log is None or not (self.negotiated_features or 0) & (1 << VHOST_F_LOG_ALL):
            return 0, 0
        return self.dirty_log.address, self.dirty_log.size

    def _log_bits(self) -> tuple[Any, int] | None:
        """The log to mark this layer's writes in, and its size; None when not logging."""
        address, size = self.dirty_log_area()
        return (ffi.cast("uint8_t *", address), size) if size else None

    @property
    def offered_protocol_features(self) -> int:
        return self.model.protocol_features() & protocol.SUPPORTED_PROTOCOL_FEATURES

    def _reply(self, message: protocol.Message, payload: bytes) -> None:
        header = protocol.HEADER.pack(message.request, protocol.VERSION | protocol.FLAG_REPLY, len(payload))
        try:
            self.sock.sendall(header + payload, socket.MSG_NOSIGNAL)
        except OSError as err:
            self.close(f"cannot reply to {message.name()}: {err}", CloseCause.DISCONNECTED)

    def _broken(self) -> bool:
        """libvhost-user called panic, or a Python callback failed (both mark only this device)."""
        return bool(self._dev.broken) or self.state is State.BROKEN

    # -- callbacks from libvhost-user -------------------------------------------------------------------------

    def _memory_fault(self, faults: int) -> None:
        self.close(f"guest memory fault: the file behind guest RAM was truncated ({faults} fault(s))",
                   CloseCause.MEMORY_FAULT)

    def _panic(self, reason: str) -> None:
        log.error("%s: libvhost-user: %s", self.name, reason)
        self.broken_reason = reason
        self.state = State.BROKEN

    def refuse(self, reason: str) -> None:
        """The device model will not serve this frontend: the connection ends once the message being handled is
        (closing it from inside libvhost-user's dispatch would free what the dispatch still uses)."""
        self.broken_reason, self.broken_cause = reason, CloseCause.REFUSED
        self.state = State.BROKEN

    def _set_watch(self, fd: int, condition: int, cb: Any, data: Any) -> None:
        self._watches[fd] = (cb, data)
        self.loop.add_reader(fd, lambda: self._watch_ready(fd))

    def _watch_ready(self, fd: int) -> None:
        watch = self._watches.get(fd)
        if watch is not None and self.state is State.CONNECTED:
            lib.vrdma_call_watch(watch[0], self._dev, VU_WATCH_IN, watch[1])
            if self._broken():
                self.close(self.broken_reason or "libvhost-user marked the device broken", self.broken_cause)

    def _remove_watch(self, fd: int) -> None:
        self._watches.pop(fd, None)
        self.loop.remove_reader(fd)

    # -- guest memory and virtqueues --------------------------------------------------------------------------

    def _keep_memory_fds(self, new: dict[int, int], replaced: bool) -> None:
        """After a memory-table message: the duplicates of the regions libvhost-user holds now, no others."""
        held = {int(self._dev.regions[i].gpa) for i in range(self._dev.nregions)}
        for gpa in list(self.memory_fds):
            if replaced or gpa not in held:
                os.close(self.memory_fds.pop(gpa))
        for gpa, fd in new.items():
            if gpa in held and gpa not in self.memory_fds:
                self.memory_fds[gpa] = fd
            else:
                os.close(fd)

    def memory_regions(self) -> list[MemoryRegion]:
        """The guest's memory table as this process has it mapped."""
        dev = self._dev
        return [MemoryRegion(int(r.gpa), int(r.size), int(r.mmap_addr) + int(r.mmap_offset),
                             (int(r.mmap_addr), int(r.size) + int(r.mmap_offset)))
                for r in (dev.regions[i] for i in range(dev.nregions))]

    def pop(self, index: int) -> Element | None:
        if not lib.vrdma_vu_queue_ready(self._vu, index):
            return None  # (rings outside guest memory: the device is broken now, and closes)
        vq = lib.vu_get_queue(self._dev, index)
        raw = lib.vu_queue_pop(self._dev, vq, _ELEMENT_SIZE)
        if raw == ffi.NULL:
            return None
        elem = ffi.cast(_ELEMENT_P, raw)
        outs, ins = elem.out_sg, elem.in_sg
        return Element([(int(ffi.cast(_UINTPTR, outs[i].iov_base)), outs[i].iov_len) for i in range(elem.out_num)],
                       [(int(ffi.cast(_UINTPTR, ins[i].iov_base)), ins[i].iov_len) for i in range(elem.in_num)],
                       ffi.gc(elem, lib.free))

    def push(self, index: int, element: Element, written: int) -> None:
        if not lib.vrdma_vu_queue_ready(self._vu, index):
            return
        vq = lib.vu_get_queue(self._dev, index)
        lib.vu_queue_push(self._dev, vq, element.handle, written)
        log_bits = self._log_bits()
        if log_bits is not None:
            lib.vrdma_vu_log_used(self._vu, index, *log_bits)

    def notify(self, index: int) -> None:
        if lib.vrdma_vu_queue_ready(self._vu, index):
            lib.vu_queue_notify(self._dev, lib.vu_get_queue(self._dev, index))

    def kick_fd(self, index: int) -> int:
        """The eventfd the frontend kicks queue ``index`` through, or -1: libvhost-user's, read by its watch here (a
        model may watch it too, never read it), valid until the queue stops."""
        return int(lib.vrdma_vu_kick_fd(self._vu, index)) if self._vu is not None else -1

    def read(self, address: int, length: int) -> bytes:
        """Bytes at a host address that libvhost-user translated from guest memory."""
        return bytes(ffi.buffer(ffi.cast(_CHAR_P, address), length))

    def write(self, address: int, data: bytes) -> None:
        ffi.memmove(ffi.cast(_CHAR_P, address), data, len(data))
        log_bits = self._log_bits()
        if log_bits is None:
            return
        for region in self.memory_regions():  # the guest pages behind a host address
            if region.host_address <= address < region.host_address + region.size:
                lib.vrdma_log_mark(*log_bits, region.gpa + address - region.host_address, len(data))
                break

    @property
    def features(self) -> int:
        return int(self._dev.features)

    # -- teardown ---------------------------------------------------------------------------------------------

    def close(self, reason: str, cause: CloseCause) -> None:
        """Forget everything of this connection: memory table, vrings, fds, socket. Idempotent."""
        if self.state is State.CLOSED:
            return
        level = logging.INFO if cause in (CloseCause.DISCONNECTED, CloseCause.STOPPING, CloseCause.MIGRATED) \
            else logging.ERROR
        log.log(level, "%s: closing the device: %s", self.name, reason)
        self.state = State.CLOSED
        self.loop.remove_reader(self.sock.fileno())
        self.device_state.end()
        # The model lets go of guest memory first (its data engine holds addresses in it, and in the dirty log) ...
        self.model.disconnected(self, reason)
        if self.dirty_log is not None:
            self.dirty_log.close()
            self.dirty_log = None
        # ... and the fault guard (an address range unmapped next may be mapped again for someone else) ...
        if self._guard is not None:
            self._guard.release()
        # ... then vu_deinit unmaps guest memory and closes the kick/call fds (removing their watches) and the socket.
        lib.vu_deinit(self._dev)
        self.sock.detach()
        for fd in list(self._watches):
            self._remove_watch(fd)
        self.reader.close()
        for fd in self.memory_fds.values():
            os.close(fd)
        self.memory_fds = {}
        _DEVICES.pop(int(ffi.cast(_UINTPTR, self._dev)), None)
        if self.on_closed is not None:
            self.on_closed(cause, reason)


_DEVICES: dict[int, VhostUserConnection] = {}


def _duplicates(message: protocol.Message) -> dict[int, int]:
    """A duplicate of each region's fd of a SET_MEM_TABLE or ADD_MEM_REG by guest-physical start (REM_MEM_REG: none)."""
    if message.request == protocol.Request.REM_MEM_REG:
        return {}
    return {region.gpa: os.dup(fd) for region, fd in zip(protocol.memory_regions(message), message.fds, strict=False)}


def _device(dev: Any) -> VhostUserConnection:
    return _DEVICES[int(ffi.cast(_UINTPTR, dev))]


def _guarded(default: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A Python exception must never unwind into C: log it, break the device, return a safe value."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(dev: Any, *args: Any) -> Any:
            device = _DEVICES.get(int(ffi.cast(_UINTPTR, dev)))
            if device is None:
                return default
            try:
                return fn(device, *args)
            except Exception as err:  # reported, and only this device pays for it
                log.exception("%s: error in %s", device.name, fn.__name__)
                device._panic(f"{fn.__name__} failed: {err}")
                return default

        call.__name__ = fn.__name__
        return call

    return wrap


@_guarded(None)
def _panic_cb(device: VhostUserConnection, err: Any) -> None:
    device._panic(ffi.string(err).decode(errors="replace").strip())


@_guarded(None)
def _set_watch_cb(device: VhostUserConnection, fd: int, condition: int, cb: Any, data: Any) -> None:
    device._set_watch(fd, condition, cb, data)


@_guarded(None)
def _remove_watch_cb(device: VhostUserConnection, fd: int) -> None:
    device._remove_watch(fd)


@_guarded(0)
def _get_features_cb(device: VhostUserConnection) -> int:
    return device.model.device_features() | VIRTIO_F_VERSION_1 | VHOST_USER_F_PROTOCOL_FEATURES


@_guarded(None)
def _set_features_cb(device: VhostUserConnection, features: int) -> None:
    log.info("%s: negotiated features %#x", device.name, features)
    device.negotiated_features = int(features)
    device.model.features_negotiated(features)


@_guarded(0)
def _get_protocol_features_cb(device: VhostUserConnection) -> int:
    return device.model.protocol_features()


@_guarded(None)
def _set_protocol_features_cb(device: VhostUserConnection, features: int) -> None:
    log.info("%s: negotiated protocol features %#x", device.name, features)
    device.negotiated_protocol_features = int(features)


@_guarded(None)
def _queue_set_started_cb(device: VhostUserConnection, index: int, started: bool) -> None:
    vq = lib.vu_get_queue(device._dev, index)
    lib.vu_set_queue_handler(device._dev, vq, lib.vrdma_queue_handler if started else ffi.NULL)
    device.model.queue_started(device, index, bool(started))


@_guarded(None)
def _queue_handler_cb(device: VhostUserConnection, index: int) -> None:
    device.model.queue_kicked(device, index)


@_guarded(-1)
def _get_config_cb(device: VhostUserConnection, config: Any, length: int) -> int:
    space = device.model.config_space()
    device.config_reads += 1
    # QEMU fetches the whole space for every guest access: say it once per connection, then only in debug.
    log.log(logging.INFO if device.config_reads == 1 else logging.DEBUG, "%s: the driver reads config space "
            "(%d bytes, read %d)", device.name, length, device.config_reads)
    data = space[:length].ljust(length, b"\0")
    ffi.memmove(config, data, length)
    return 0


# libvhost-user calls these through the glue (see _build.py: extern "Python").
for _c_name, _callback in {
    "vrdma_panic": _panic_cb,
    "vrdma_set_watch": _set_watch_cb,
    "vrdma_remove_watch": _remove_watch_cb,
    "vrdma_get_features": _get_features_cb,
    "vrdma_set_features": _set_features_cb,
    "vrdma_get_protocol_features": _get_protocol_features_cb,
    "vrdma_set_protocol_features": _set_protocol_features_cb,
    "vrdma_queue_set_started": _queue_set_started_cb,
    "vrdma_queue_handler": _queue_handler_cb,
    "vrdma_get_config": _get_config_cb,
}.items():
    ffi.def_extern(name=_c_name)(_callback)
