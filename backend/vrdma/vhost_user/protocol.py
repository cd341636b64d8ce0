"""The vhost-user wire protocol, frontend to backend: header, requests, framing and validation.

Every message is framed and checked here, in layers, before libvhost-user sees it: header (version and flag
bits, payload size bound) → exact payload size for the request → file descriptors only where the request carries
them, in the right number → per-payload meaning (region counts, queue indices, config sizes). Each failure is a
named ProtocolError with the values seen. Requests the backend does not implement are refused here too,
VHOST_USER_NONE among them (libvhost-user would call exit(0) on it).

Nothing here knows about RDMA.
"""

from __future__ import annotations

import enum
import itertools
import os
import socket
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from vrdma.errors import VrdmaError

HEADER = struct.Struct("<III")          # request, flags, payload size
U64 = struct.Struct("<Q")
VRING_STATE = struct.Struct("<II")      # index, num
VRING_ADDR = struct.Struct("<IIQQQQ")   # index, flags, desc, used, avail, log (user addresses)
VRING_ADDR_SIZE = VRING_ADDR.size
MEMORY_REGION = struct.Struct("<QQQQ")  # guest_phys_addr, memory_size, userspace_addr, mmap_offset
MEMORY_HEADER = struct.Struct("<II")    # nregions, padding
CONFIG_HEADER = struct.Struct("<III")   # offset, size, flags

VERSION = 0x1
FLAG_VERSION_MASK = 0x3
FLAG_REPLY = 0x1 << 2
FLAG_NEED_REPLY = 0x1 << 3
KNOWN_FLAGS = FLAG_VERSION_MASK | FLAG_REPLY | FLAG_NEED_REPLY

MAX_FDS = 8                 # VHOST_MEMORY_BASELINE_NREGIONS: fds one message may carry
MAX_PAYLOAD = 272           # sizeof(VhostUserMsg.payload) in libvhost-user (checked against the C build)
MAX_CONFIG_SIZE = 256       # VHOST_USER_MAX_CONFIG_SIZE
VRING_IDX_MASK = 0xFF
VRING_NOFD = 0x1 << 8
SHMEM_MAP_RW = 0x1       # VHOST_USER_FLAG_MAP_RW: a writable shared memory mapping


class ProtocolFeature(enum.IntFlag):
    MQ = 1 << 0
    LOG_SHMFD = 1 << 1
    REPLY_ACK = 1 << 3
    BACKEND_REQ = 1 << 5
    CONFIG = 1 << 9
    BACKEND_SEND_FD = 1 << 10
    RESET_DEVICE = 1 << 13       # VHOST_USER_RESET_DEVICE: a device reset is told apart from a stop
    CONFIGURE_MEM_SLOTS = 1 << 15
    DEVICE_STATE = 1 << 19       # SET_DEVICE_STATE_FD and CHECK_DEVICE_STATE: the back-end's state migrates
    SHMEM = 1 << 20              # VHOST_USER_BACKEND_SHMEM_MAP (docs/qemu.md)


# What the message table below implements; a device may offer less, never more.
SUPPORTED_PROTOCOL_FEATURES = (ProtocolFeature.MQ | ProtocolFeature.REPLY_ACK | ProtocolFeature.CONFIG
                               | ProtocolFeature.CONFIGURE_MEM_SLOTS | ProtocolFeature.BACKEND_REQ
                               | ProtocolFeature.BACKEND_SEND_FD | ProtocolFeature.SHMEM
                               | ProtocolFeature.RESET_DEVICE | ProtocolFeature.DEVICE_STATE
                               | ProtocolFeature.LOG_SHMFD)


class Request(enum.IntEnum):
    NONE = 0
    GET_FEATURES = 1
    SET_FEATURES = 2
    SET_OWNER = 3
    RESET_OWNER = 4
    SET_MEM_TABLE = 5
    SET_LOG_BASE = 6
    SET_LOG_FD = 7
    SET_VRING_NUM = 8
    SET_VRING_ADDR = 9
    SET_VRING_BASE = 10
    GET_VRING_BASE = 11
    SET_VRING_KICK = 12
    SET_VRING_CALL = 13
    SET_VRING_ERR = 14
    GET_PROTOCOL_FEATURES = 15
    SET_PROTOCOL_FEATURES = 16
    GET_QUEUE_NUM = 17
    SET_VRING_ENABLE = 18
    SEND_RARP = 19
    NET_SET_MTU = 20
    SET_BACKEND_REQ_FD = 21
    IOTLB_MSG = 22
    SET_VRING_ENDIAN = 23
    GET_CONFIG = 24
    SET_CONFIG = 25
    GET_INFLIGHT_FD = 31
    SET_INFLIGHT_FD = 32
    RESET_DEVICE = 34
    GET_MAX_MEM_SLOTS = 36
    ADD_MEM_REG = 37
    REM_MEM_REG = 38
    SET_DEVICE_STATE_FD = 42
    CHECK_DEVICE_STATE = 43


# SET_DEVICE_STATE_FD's payload (QEMU's VhostUserTransferDeviceState): the direction, and the phase, of which there
# is one (the device stopped); its reply is a u64 whose low byte is an error (0: accepted) and whose VRING_NOFD bit
# says that no descriptor comes back (the frontend's pipe carries the state).
DEVICE_STATE = struct.Struct("<II")
STATE_SAVE = 0       # VHOST_TRANSFER_STATE_DIRECTION_SAVE: the back-end writes its state into the descriptor
STATE_LOAD = 1       # ... LOAD: the back-end reads a state from it
STATE_STOPPED = 0    # VHOST_TRANSFER_STATE_PHASE_STOPPED


class ProtocolError(VrdmaError):
    """A message from the frontend broke the protocol; the connection it came on is not trusted further."""


class BadHeader(ProtocolError):
    pass


class UnsupportedRequest(ProtocolError):
    pass


class PayloadSizeMismatch(ProtocolError):
    pass


class FdCountMismatch(ProtocolError):
    pass


class BadPayload(ProtocolError):
    pass


class BadMemoryRegion(ProtocolError):
    """A memory region the backend must not map: empty, wrapping, overlapping, past its file, or able to shrink."""


@dataclass
class Message:
    request: int
    flags: int
    payload: bytes
    fds: list[int] = field(default_factory=list)

    @property
    def need_reply(self) -> bool:
        return bool(self.flags & FLAG_NEED_REPLY)

    def name(self) -> str:
        try:
            return Request(self.request).name
        except ValueError:
            return f"request {self.request}"

    def close_fds(self) -> None:
        for fd in self.fds:
            socket.close(fd)
        self.fds = []


@dataclass(frozen=True)
class WireRegion:
    """One region as a memory-table message describes it."""

    gpa: int
    size: int
    userspace_addr: int
    mmap_offset: int

    @property
    def gpa_end(self) -> int:
        return self.gpa + self.size

    def __str__(self) -> str:
        return (f"guest {self.gpa:#x}+{self.size:#x} (frontend address {self.userspace_addr:#x}, "
                f"file offset {self.mmap_offset:#x})")


def memory_regions(message: Message) -> list[WireRegion]:
    """The regions a validated SET_MEM_TABLE, ADD_MEM_REG or REM_MEM_REG carries."""
    if message.request == Request.SET_MEM_TABLE:
        count = MEMORY_HEADER.unpack_from(message.payload)[0]
        return [WireRegion(*MEMORY_REGION.unpack_from(message.payload, MEMORY_HEADER.size + i * MEMORY_REGION.size))
                for i in range(count)]
    return [WireRegion(*MEMORY_REGION.unpack_from(message.payload, U64.size))]


U64_END = 1 << 64


def check_regions(new: list[WireRegion], existing: Iterable[tuple[int, int]] = ()) -> None:
    """Refuse regions libvhost-user cannot handle safely: its region search assumes non-empty regions that do not
    wrap or overlap (one that does sends it round its binary search for ever).

    ``existing``: (guest-physical start, size) of the regions already mapped, for ADD_MEM_REG.
    """
    for region in new:
        if region.size == 0:
            raise BadMemoryRegion(f"empty memory region: {region}")
        for what, start in (("guest-physical", region.gpa), ("frontend", region.userspace_addr),
                            ("file offset", region.mmap_offset)):
            if start + region.size > U64_END:
                raise BadMemoryRegion(f"memory region wraps past 2^64 ({what} range): {region}")
    spans = sorted([(r.gpa, r.gpa_end) for r in new] + [(gpa, gpa + size) for gpa, size in existing])
    for (start, end), (next_start, _) in itertools.pairwise(spans):
        if next_start < end:
            raise BadMemoryRegion(f"memory regions overlap in guest-physical space: {start:#x}..{end:#x} and one "
                                  f"at {next_start:#x}")


def check_region_files(regions: list[WireRegion], fds: list[int]) -> None:
    """Every region lies inside its file when it is mapped.

    A file that shrinks later (anything but a memfd sealed with F_SEAL_SHRINK, as QEMU's memory-backend-memfd is by
    default: hugetlbfs files, the ivshmem doorbell file QEMU also shares) is the fault guard's to contain.
    """
    for region, fd in zip(regions, fds, strict=True):
        try:
            size = os.fstat(fd).st_size
        except OSError as err:
            raise BadMemoryRegion(f"cannot stat the file of memory region {region}: {err.strerror}") from None
        if region.mmap_offset + region.size > size:
            raise BadMemoryRegion(f"memory region {region} ends past the end of its {size}-byte file")


def _u64(message: Message) -> int:
    return int(U64.unpack(message.payload)[0])


# -- per-request rules: (payload size check, fd count check) -------------------------------------------------------

SizeRule = Callable[[Message], int]          # the exact size the payload must have
FdRule = Callable[[Message, int], int]       # the exact number of fds, given the number of queues


def _fixed(size: int) -> SizeRule:
    return lambda message: size


def _no_fds(message: Message, num_queues: int) -> int:
    return 0


def _one_fd(message: Message, num_queues: int) -> int:
    return 1


def _mem_table_size(message: Message) -> int:
    if len(message.payload) < MEMORY_HEADER.size:
        return MEMORY_HEADER.size
    nregions, _ = MEMORY_HEADER.unpack_from(message.payload)
    if not 1 <= nregions <= MAX_FDS:
        raise BadPayload(f"SET_MEM_TABLE with {nregions} regions (allowed: 1 to {MAX_FDS})")
    return MEMORY_HEADER.size + int(nregions) * MEMORY_REGION.size


def _mem_table_fds(message: Message, num_queues: int) -> int:
    return int(MEMORY_HEADER.unpack_from(message.payload)[0])


def _config_size(message: Message) -> int:
    if len(message.payload) < CONFIG_HEADER.size:
        return CONFIG_HEADER.size
    offset, size, _ = CONFIG_HEADER.unpack_from(message.payload)
    if size > MAX_CONFIG_SIZE or offset > MAX_CONFIG_SIZE - size:
        raise BadPayload(f"{message.name()} of {size} bytes at offset {offset} (config space is at most "
                         f"{MAX_CONFIG_SIZE} bytes)")
    return CONFIG_HEADER.size + int(size)


def _vring_index(message: Message, num_queues: int) -> int:
    index = (_u64(message) if len(message.payload) == U64.size else VRING_STATE.unpack_from(message.payload)[0])
    index &= VRING_IDX_MASK
    if index >= num_queues:
        raise BadPayload(f"{message.name()} for queue {index}; the device has {num_queues} queues")
    return index


def _vring_state_fds(message: Message, num_queues: int) -> int:
    _vring_index(message, num_queues)
    return 0


def _vring_addr_fds(message: Message, num_queues: int) -> int:
    index = struct.unpack_from("<I", message.payload)[0]
    if index >= num_queues:
        raise BadPayload(f"SET_VRING_ADDR for queue {index}; the device has {num_queues} queues")
    return 0


def _vring_fd(message: Message, num_queues: int) -> int:
    _vring_index(message, num_queues)
    value = _u64(message)
    if value & ~(VRING_IDX_MASK | VRING_NOFD):
        raise BadPayload(f"{message.name()} payload {value:#x} has unknown bits")
    return 0 if value & VRING_NOFD else 1


def _device_state_fd(message: Message, num_queues: int) -> int:
    direction, phase = DEVICE_STATE.unpack(message.payload)
    if direction not in (STATE_SAVE, STATE_LOAD) or phase != STATE_STOPPED:
        raise BadPayload(f"SET_DEVICE_STATE_FD with direction {direction} and phase {phase}")
    return 1


def _rem_mem_reg_fds(message: Message, num_queues: int) -> int:
    return len(message.fds) if len(message.fds) <= 1 else 1  # QEMU may or may not attach the region's fd


# One table: every request the backend accepts, how big its payload is, and which fds it carries.
RULES: dict[Request, tuple[SizeRule, FdRule]] = {
    Request.GET_FEATURES: (_fixed(0), _no_fds),
    Request.SET_FEATURES: (_fixed(U64.size), _no_fds),
    Request.SET_OWNER: (_fixed(0), _no_fds),
    Request.RESET_OWNER: (_fixed(0), _no_fds),
    Request.SET_MEM_TABLE: (_mem_table_size, _mem_table_fds),
    Request.SET_LOG_BASE: (_fixed(2 * U64.size), _one_fd),
    Request.SET_VRING_NUM: (_fixed(VRING_STATE.size), _vring_state_fds),
    Request.SET_VRING_ADDR: (_fixed(VRING_ADDR_SIZE), _vring_addr_fds),
    Request.SET_VRING_BASE: (_fixed(VRING_STATE.size), _vring_state_fds),
    Request.GET_VRING_BASE: (_fixed(VRING_STATE.size), _vring_state_fds),
    Request.SET_VRING_KICK: (_fixed(U64.size), _vring_fd),
    Request.SET_VRING_CALL: (_fixed(U64.size), _vring_fd),
    Request.SET_VRING_ERR: (_fixed(U64.size), _vring_fd),
    Request.GET_PROTOCOL_FEATURES: (_fixed(0), _no_fds),
    Request.SET_PROTOCOL_FEATURES: (_fixed(U64.size), _no_fds),
    Request.GET_QUEUE_NUM: (_fixed(0), _no_fds),
    Request.SET_BACKEND_REQ_FD: (_fixed(0), _one_fd),
    Request.SET_VRING_ENABLE: (_fixed(VRING_STATE.size), _vring_state_fds),
    Request.GET_CONFIG: (_config_size, _no_fds),
    Request.SET_CONFIG: (_config_size, _no_fds),
    Request.GET_MAX_MEM_SLOTS: (_fixed(0), _no_fds),
    Request.RESET_DEVICE: (_fixed(0), _no_fds),
    Request.ADD_MEM_REG: (_fixed(U64.size + MEMORY_REGION.size), _one_fd),
    Request.REM_MEM_REG: (_fixed(U64.size + MEMORY_REGION.size), _rem_mem_reg_fds),
    Request.SET_DEVICE_STATE_FD: (_fixed(DEVICE_STATE.size), _device_state_fd),
    Request.CHECK_DEVICE_STATE: (_fixed(0), _no_fds),
}


def validate(message: Message, num_queues: int) -> None:
    """Check a framed message against the table; raise the ProtocolError that names what is wrong."""
    if message.flags & ~KNOWN_FLAGS:
        raise BadHeader(f"{message.name()} has unknown flag bits {message.flags & ~KNOWN_FLAGS:#x}")
    if message.flags & FLAG_REPLY:
        raise BadHeader(f"{message.name()} has the reply flag set: replies do not flow to the backend")
    try:
        request = Request(message.request)
        size_rule, fd_rule = RULES[request]
    except (ValueError, KeyError):
        raise UnsupportedRequest(f"{message.name()} is not supported by this backend") from None
    expected = size_rule(message)
    if len(message.payload) != expected:
        raise PayloadSizeMismatch(f"{request.name} with a {len(message.payload)}-byte payload "
                                  f"(expected {expected})")
    fds = fd_rule(message, num_queues)
    if len(message.fds) != fds:
        raise FdCountMismatch(f"{request.name} came with {len(message.fds)} file descriptors (expected {fds})")
    if request in (Request.SET_MEM_TABLE, Request.ADD_MEM_REG):
        regions = memory_regions(message)
        check_regions(regions)
        check_region_files(regions, message.fds)


class MessageReader:
    """Frames messages out of a non-blocking stream socket, keeping partial ones until they are whole.

    It never reads past the end of the message it is assembling: a unix stream socket hands over the file
    descriptors of a sendmsg() with the first read that touches that sendmsg's bytes, so reading message by
    message ties every descriptor to the message it was sent with (a read spanning two messages would hand the
    second one's descriptors over with the first one's bytes). A peer that stalls mid-message blocks nothing.
    """

    MAX_MESSAGES_PER_READ = 64  # then yield to the other VMs' sockets; the rest stays in the socket

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()
        self.fds: list[int] = []

    def _wanted(self) -> int:
        if len(self.buffer) < HEADER.size:
            return HEADER.size - len(self.buffer)
        request, flags, size = HEADER.unpack_from(self.buffer)
        if flags & FLAG_VERSION_MASK != VERSION:
            raise BadHeader(f"request {request} with protocol version {flags & FLAG_VERSION_MASK} "
                            f"(flags {flags:#x}); only version {VERSION} exists")
        if size > MAX_PAYLOAD:
            raise BadHeader(f"request {request} announces a {size}-byte payload (at most {MAX_PAYLOAD})")
        return HEADER.size + int(size) - len(self.buffer)

    def read(self) -> list[Message]:
        """Read what is available; return the complete messages. EOFError when the peer closed.

        On any error the file descriptors of messages already framed in this call are closed with it: they are
        nobody else's yet (the partial message's ones stay with the reader until close()).
        """
        messages: list[Message] = []
        try:
            self._read_into(messages)
        except BaseException:
            for message in messages:
                message.close_fds()
            raise
        return messages

    def _read_into(self, messages: list[Message]) -> None:
        while len(messages) < self.MAX_MESSAGES_PER_READ:
            wanted = self._wanted()
            if wanted == 0:
                request, flags, _ = HEADER.unpack_from(self.buffer)
                messages.append(Message(request, flags, bytes(self.buffer[HEADER.size:]), self.fds))
                self.buffer = bytearray()
                self.fds = []
                continue
            try:
                data, ancdata, msg_flags, _ = self.sock.recvmsg(wanted, socket.CMSG_SPACE(4 * MAX_FDS * 4),
                                                                socket.MSG_CMSG_CLOEXEC)
            except BlockingIOError:
                break
            for level, kind, cmsg in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    count = len(cmsg) // 4
                    self.fds.extend(struct.unpack(f"<{count}i", cmsg[: count * 4]))
            if msg_flags & socket.MSG_CTRUNC:
                raise FdCountMismatch(f"a message carried more than {4 * MAX_FDS} file descriptors")
            if not data:
                if messages:
                    break  # hand over what is complete; the next read reports the end
                raise EOFError("the frontend closed the connection")
            self.buffer += data
        if len(self.buffer) >= HEADER.size:
            self._wanted()  # check a waiting header now rather than when its payload arrives

    def close(self) -> None:
        for fd in self.fds:
            socket.close(fd)
        self.fds = []
