"""A simulated vhost-user frontend: what QEMU and a guest driver do to a backend, done from Python.

It connects to a backend's socket, negotiates features, shares memfd "guest memory" through SET_MEM_TABLE,
lays out real split virtqueues in that memory, kicks through eventfds and waits on call eventfds. Tests use it
for everything that does not need a real guest (including malformed input, through ``send_raw``); benchmarks
use it to drive the backend at native speed.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import mmap
import os
import select
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

from vrdma.device import abi
from vrdma.vhost_user import protocol
from vrdma.vhost_user.protocol import Request

VIRTIO_F_VERSION_1 = 1 << 32
VHOST_USER_F_PROTOCOL_FEATURES = 1 << 30
VHOST_F_LOG_ALL = 1 << 26
DESC = struct.Struct("<QIHH")        # addr, len, flags, next
VRING_DESC_F_NEXT, VRING_DESC_F_WRITE = 1, 2
USER_BASE = 0x7F00_0000_0000         # the "QEMU virtual address" of guest memory, as a real frontend has one


class FrontendError(Exception):
    pass


class GuestMemory:
    """Guest RAM in a memfd: guest physical address 0 is offset 0, with a bump allocator.

    Sealed against growing and shrinking as QEMU's memory-backend-memfd seals it by default (the backend refuses
    guest RAM that could shrink under it); ``sealed=False`` makes the memory a hostile frontend would share.
    """

    def __init__(self, size: int = 16 << 20, sealed: bool = True) -> None:
        self.size = size
        self.fd = os.memfd_create("vrdma-guest", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(self.fd, size)
        if sealed:
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        self.map = mmap.mmap(self.fd, size)
        self.next = 0x1000  # keep gpa 0 unused, as a null pointer should be

    def alloc(self, size: int, align: int = 16) -> int:
        start = (self.next + align - 1) & ~(align - 1)
        if start + size > self.size:
            raise FrontendError(f"guest memory exhausted ({self.size} bytes)")
        self.next = start + size
        return start

    def read(self, gpa: int, length: int) -> bytes:
        return bytes(self.map[gpa:gpa + length])

    def write(self, gpa: int, data: bytes) -> None:
        self.map[gpa:gpa + len(data)] = data

    def region(self) -> bytes:
        return protocol.MEMORY_REGION.pack(0, self.size, USER_BASE, 0)

    def copy(self) -> GuestMemory:
        """Memory of another QEMU with this one's contents (what a migration's RAM copy leaves the destination)."""
        other = GuestMemory(self.size)
        other.map[:] = self.map[:]
        other.next = self.next
        return other

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)


SENTINEL = b"\xa5"


@dataclass
class Virtqueue:
    """A split virtqueue laid out in guest memory, with its kick and call eventfds."""

    memory: GuestMemory
    index: int
    size: int = 64
    desc: int = 0
    avail: int = 0
    used: int = 0
    avail_idx: int = 0
    used_seen: int = 0
    free: list[int] = field(default_factory=list)
    kick: int = -1
    call: int = -1

    def __post_init__(self) -> None:
        self.desc = self.memory.alloc(16 * self.size, 16)
        self.avail = self.memory.alloc(6 + 2 * self.size, 2)
        self.used = self.memory.alloc(6 + 8 * self.size, 4)
        self.free = list(range(self.size))
        self.kick = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self.call = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)

    def address_payload(self, logged: bool = False) -> bytes:
        """SET_VRING_ADDR payload: ring addresses are frontend virtual addresses; ``logged``: the used ring's writes
        to be logged (VHOST_VRING_F_LOG, at its guest address), as QEMU asks while it migrates."""
        return struct.pack("<IIQQQQ", self.index, 1 if logged else 0, USER_BASE + self.desc, USER_BASE + self.used,
                           USER_BASE + self.avail, self.used if logged else 0)

    def add(self, out: list[bytes], in_sizes: list[int]) -> tuple[int, list[int]]:
        """Post a chain of device-readable buffers then device-writable ones; return (head, in buffer gpas)."""
        count = len(out) + len(in_sizes)
        if count == 0 or count > len(self.free):
            raise FrontendError(f"cannot post a chain of {count} descriptors ({len(self.free)} free)")
        ids = [self.free.pop(0) for _ in range(count)]
        in_gpas = []
        # Device-writable buffers start as a sentinel, not zeros: a byte the device never wrote reads as 0xA5, so
        # a zeroed response cannot pass for a written one.
        buffers = [(data, 0) for data in out] + [(SENTINEL * size, VRING_DESC_F_WRITE) for size in in_sizes]
        for position, (desc_id, (data, flags)) in enumerate(zip(ids, buffers, strict=True)):
            gpa = self.memory.alloc(max(len(data), 1), 8)
            self.memory.write(gpa, data)
            if flags & VRING_DESC_F_WRITE:
                in_gpas.append(gpa)
            last = position == count - 1
            self.write_desc(desc_id, gpa, len(data), flags | (0 if last else VRING_DESC_F_NEXT),
                            0 if last else ids[position + 1])
        self.publish(ids[0])
        return ids[0], in_gpas

    def buffer_address(self, desc_id: int) -> int:
        """Guest address of the buffer a descriptor points at."""
        return int(DESC.unpack(self.memory.read(self.desc + 16 * desc_id, 16))[0])

    def write_desc(self, desc_id: int, addr: int, length: int, flags: int, next_id: int) -> None:
        self.memory.write(self.desc + 16 * desc_id, DESC.pack(addr, length, flags, next_id))

    def publish(self, head: int) -> None:
        slot = self.avail_idx % self.size
        self.memory.write(self.avail + 4 + 2 * slot, struct.pack("<H", head))
        self.avail_idx = (self.avail_idx + 1) & 0xFFFF
        self.memory.write(self.avail + 2, struct.pack("<H", self.avail_idx))

    def notify(self) -> None:
        os.eventfd_write(self.kick, 1)

    def wait_used(self, timeout: float = 5.0) -> list[tuple[int, int]]:
        """Wait for the device to signal the call eventfd; return the new used entries (id, length)."""
        deadline = time.monotonic() + timeout
        while True:
            entries = self.reap()
            if entries:
                return entries
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise FrontendError(f"queue {self.index}: no used buffer within {timeout:g} s")
            ready, _, _ = select.select([self.call], [], [], remaining)
            if ready:
                with contextlib.suppress(BlockingIOError):  # another reader consumed it
                    os.eventfd_read(self.call)

    def reap(self) -> list[tuple[int, int]]:
        used_idx = struct.unpack("<H", self.memory.read(self.used + 2, 2))[0]
        entries = []
        while self.used_seen != used_idx:
            slot = self.used_seen % self.size
            desc_id, length = struct.unpack("<II", self.memory.read(self.used + 4 + 8 * slot, 8))
            entries.append((desc_id, length))
            self.used_seen = (self.used_seen + 1) & 0xFFFF
            self._free_chain(desc_id)
        return entries

    def _free_chain(self, head: int) -> None:
        desc_id = head
        for _ in range(self.size):
            _, _, flags, next_id = DESC.unpack(self.memory.read(self.desc + 16 * desc_id, 16))
            self.free.append(desc_id)
            if not flags & VRING_DESC_F_NEXT:
                return
            desc_id = next_id

    def close(self) -> None:
        os.close(self.kick)
        os.close(self.call)


class Frontend:
    """``with Frontend(path) as fe: fe.start(); fe.command(...)`` — one simulated VM."""

    def __init__(self, socket_path: str, memory_size: int = 16 << 20, timeout: float = 5.0,
                 memory: GuestMemory | None = None) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(socket_path)
        self.memory = memory if memory is not None else GuestMemory(memory_size)
        self.queues: list[Virtqueue] = []
        self.offered_features = 0
        self.device_features = 0  # the device-specific features the simulated driver acked

    def __enter__(self) -> Frontend:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- messages -------------------------------------------------------------------------------------------

    def send_raw(self, request: int, payload: bytes = b"", flags: int = protocol.VERSION,
                 fds: list[int] | None = None, size: int | None = None) -> None:
        header = protocol.HEADER.pack(request, flags, len(payload) if size is None else size)
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))] if fds else []
        self.sock.sendmsg([header + payload], ancillary)

    def reply(self, request: int) -> bytes:
        header = self._recv_exact(protocol.HEADER.size)
        got, flags, size = protocol.HEADER.unpack(header)
        if got != request or flags != protocol.VERSION | protocol.FLAG_REPLY:
            raise FrontendError(f"reply to {request} came as request {got} with flags {flags:#x}")
        return self._recv_exact(size)

    def _recv_exact(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            if not chunk:
                raise FrontendError("the backend closed the connection")
            data += chunk
        return data

    def get_u64(self, request: int) -> int:
        self.send_raw(request)
        return int(protocol.U64.unpack(self.reply(request))[0])

    def acked(self, request: int, payload: bytes = b"", fds: list[int] | None = None) -> None:
        """Send with NEED_REPLY (REPLY_ACK) and check the backend reports success."""
        self.send_raw(request, payload, flags=protocol.VERSION | protocol.FLAG_NEED_REPLY, fds=fds)
        status = protocol.U64.unpack(self.reply(request))[0]
        if status != 0:
            raise FrontendError(f"{Request(request).name} failed in the backend (status {status})")

    # -- device set-up --------------------------------------------------------------------------------------

    def start(self, num_queues: int = abi.const("VRDMA_NUM_QUEUES"), queue_size: int = 64,
              device_features: int = 0, protocol_features: int = ~0) -> None:
        """Do what QEMU does up to DRIVER_OK: negotiate, share memory, set up and enable every queue.
        ``device_features``: the device-specific feature bits the simulated driver accepts (of those the backend
        offers), as a driver would; none by default (a host process's fences are real: no doorbell recheck).
        ``protocol_features``: those this frontend knows (it acks what it knows of the backend's offer)."""
        self.negotiate(protocol_features)
        self.device_features = device_features
        self.share_memory()
        for index in range(num_queues):
            self.queues.append(Virtqueue(self.memory, index, queue_size))
        self.start_queues([0] * num_queues)

    def negotiate(self, protocol_features: int = ~0) -> None:
        """What QEMU sends when it connects (vhost_dev_init): features asked for, protocol features acked (those
        this frontend knows, ``protocol_features``, of the backend's offer), ownership taken."""
        features = self.get_u64(Request.GET_FEATURES)
        if not features & VHOST_USER_F_PROTOCOL_FEATURES:
            raise FrontendError(f"backend features {features:#x} lack PROTOCOL_FEATURES")
        self.offered_features = features
        protocol_features &= self.get_u64(Request.GET_PROTOCOL_FEATURES)
        self.send_raw(Request.SET_PROTOCOL_FEATURES, protocol.U64.pack(protocol_features))
        self.acked(Request.SET_OWNER)

    def share_memory(self) -> None:
        """The first of vhost_dev_start: the features the driver acked, and the guest's memory table."""
        unoffered = self.device_features & ~self.offered_features
        if unoffered:
            raise FrontendError(f"the backend does not offer features {unoffered:#x}")
        self.acked(Request.SET_FEATURES, protocol.U64.pack(VIRTIO_F_VERSION_1 | VHOST_USER_F_PROTOCOL_FEATURES
                                                           | self.device_features))
        self.acked(Request.SET_MEM_TABLE, protocol.MEMORY_HEADER.pack(1, 0) + self.memory.region(),
                   fds=[self.memory.fd])

    def start_queues(self, bases: list[int]) -> None:
        """What QEMU's vhost_dev_start sends for the queues, each starting at its base (its last avail index)."""
        for vq, base in zip(self.queues, bases, strict=True):
            self.acked(Request.SET_VRING_NUM, protocol.VRING_STATE.pack(vq.index, vq.size))
            self.acked(Request.SET_VRING_BASE, protocol.VRING_STATE.pack(vq.index, base))
            self.acked(Request.SET_VRING_ADDR, vq.address_payload())
            self.acked(Request.SET_VRING_CALL, protocol.U64.pack(vq.index), fds=[vq.call])
            self.acked(Request.SET_VRING_KICK, protocol.U64.pack(vq.index), fds=[vq.kick])
        for vq in self.queues:
            self.acked(Request.SET_VRING_ENABLE, protocol.VRING_STATE.pack(vq.index, 1))

    def stop_queues(self) -> list[int]:
        """What QEMU's vhost_dev_stop sends (a `stop`, a migration's switch-over, or the first half of a device
        reset): every queue disabled, then each one's base asked for, which stops it. Returns the bases."""
        for vq in self.queues:
            self.acked(Request.SET_VRING_ENABLE, protocol.VRING_STATE.pack(vq.index, 0))
        bases = []
        for vq in self.queues:
            self.send_raw(Request.GET_VRING_BASE, protocol.VRING_STATE.pack(vq.index, 0))
            bases.append(protocol.VRING_STATE.unpack(self.reply(Request.GET_VRING_BASE))[1])
        return bases

    # -- live migration: the device's state through a pipe, as QEMU's vhost_save/load_backend_state move it ------

    def save_device_state(self) -> bytes:
        """SET_DEVICE_STATE_FD(SAVE) with a pipe, the state read to its end, CHECK_DEVICE_STATE (the device stopped)."""
        read_end, write_end = os.pipe()
        with open(read_end, "rb") as pipe:
            self._hand_over_pipe(protocol.STATE_SAVE, write_end)
            data = pipe.read()
        self._check_device_state()
        return data

    def load_device_state(self, data: bytes) -> None:
        """SET_DEVICE_STATE_FD(LOAD) with a pipe, the state written into it and the pipe closed, CHECK_DEVICE_STATE:
        FrontendError when the backend refuses the state (QEMU's destination then fails the migration)."""
        read_end, write_end = os.pipe()
        with open(write_end, "wb") as pipe:
            self._hand_over_pipe(protocol.STATE_LOAD, read_end)
            pipe.write(data)
        self._check_device_state()

    def _hand_over_pipe(self, direction: int, fd: int) -> None:
        """SET_DEVICE_STATE_FD with the backend's end of the pipe (closed here once sent); FrontendError unless the
        backend took it and wants the pipe, as QEMU requires before it reads or writes."""
        try:
            self.send_raw(Request.SET_DEVICE_STATE_FD, protocol.DEVICE_STATE.pack(direction, protocol.STATE_STOPPED),
                          fds=[fd])
        finally:
            os.close(fd)
        reply = protocol.U64.unpack(self.reply(Request.SET_DEVICE_STATE_FD))[0]
        if reply & protocol.VRING_IDX_MASK or not reply & protocol.VRING_NOFD:
            raise FrontendError(f"SET_DEVICE_STATE_FD refused (reply {reply:#x})")

    def _check_device_state(self) -> None:
        self.send_raw(Request.CHECK_DEVICE_STATE)
        if protocol.U64.unpack(self.reply(Request.CHECK_DEVICE_STATE))[0] != 0:
            raise FrontendError("CHECK_DEVICE_STATE: the device state did not move (the backend's log says why)")

    def migrate(self, socket_path: str, dest: Frontend | None = None,
                while_stopped: Callable[[], None] | None = None) -> Frontend:
        """This VM migrated, in QEMU's order, to a new frontend on ``socket_path`` (another backend's socket, or this
        VM's own: a migration between two QEMUs of one backend): the destination connected and negotiated while
        this one runs (or ``dest``, made by the caller so), every queue of this one stopped, the device's state
        saved, the destination given a copy of the guest's memory and the same rings, the state loaded, the device
        started where it stopped; only then does this frontend go (the source QEMU quits after the migration).
        ``while_stopped``: called between the save and the load (the VM stopped, its device nowhere running). The
        new frontend is returned (this one is closed)."""
        if dest is None:
            dest = Frontend(socket_path, memory_size=4096)  # (its memory is the copy made below)
            dest.negotiate()
        bases = self.stop_queues()
        data = self.save_device_state()
        if while_stopped is not None:
            while_stopped()
        dest.memory.close()
        dest.memory = memory = self.memory.copy()
        queues = [copy.copy(vq) for vq in self.queues]  # the same rings, in the copy of the memory
        for vq in queues:
            vq.memory, vq.free = memory, list(vq.free)
            vq.kick = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
            vq.call = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        dest.device_features = self.device_features
        dest.load_device_state(data)
        dest.queues = queues
        dest.share_memory()
        dest.start_queues(bases)
        self.close()
        return dest

    def start_dirty_log(self) -> mmap.mmap:
        """What QEMU sends when a migration starts with the device running: SET_LOG_BASE (a sealed memfd, a bit per
        page of guest memory), SET_FEATURES with VHOST_F_LOG_ALL, each queue's address again with its used ring
        logged. Returns the log, which the test reads and clears as QEMU does."""
        size = self.memory.size // 4096 // 8
        fd = os.memfd_create("vhost-log", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            log = mmap.mmap(fd, size)
            self.send_raw(Request.SET_LOG_BASE, struct.pack("<QQ", size, 0), fds=[fd])
        finally:
            os.close(fd)
        self.reply(Request.SET_LOG_BASE)
        self.acked(Request.SET_FEATURES, protocol.U64.pack(VIRTIO_F_VERSION_1 | VHOST_USER_F_PROTOCOL_FEATURES
                                                           | VHOST_F_LOG_ALL | self.device_features))
        for vq in self.queues:
            self.acked(Request.SET_VRING_ADDR, vq.address_payload(logged=True))
        return log

    def get_config(self, size: int) -> bytes:
        self.send_raw(Request.GET_CONFIG, protocol.CONFIG_HEADER.pack(0, size, 0) + bytes(size))
        return self.reply(Request.GET_CONFIG)[protocol.CONFIG_HEADER.size:]

    # -- the driver's side of the queues --------------------------------------------------------------------

    def command(self, request: bytes, response_size: int, queue: int = 0, timeout: float = 5.0) -> bytes:
        """Post a command chain on a queue, kick, wait for it to be used, return what the device wrote."""
        vq = self.queues[queue]
        head, in_gpas = vq.add([request], [response_size])
        vq.notify()
        for desc_id, length in vq.wait_used(timeout):
            if desc_id == head:
                return self.memory.read(in_gpas[0], min(length, response_size))
        raise FrontendError(f"queue {queue}: used ring returned another chain than {head}")

    def wake(self) -> None:
        """Kick the device's wake queue (what a poster does when it finds the engine parked)."""
        self.queues[abi.const("VRDMA_QUEUE_WAKE")].notify()

    def close(self) -> None:
        """Idempotent (a migrated frontend is closed by migrate(), and again by its with block)."""
        if self.sock.fileno() < 0:
            return
        self.sock.close()
        for vq in self.queues:
            vq.close()
        self.memory.close()
