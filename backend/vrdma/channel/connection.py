"""One process's connection on the container channel: its messages, its descriptors and the memory it shares.

Every message is checked before anything in it is used, in one place (``_handle``): a packet longer than the
longest message, descriptors beyond what a message carries, a header too short, a first message that is not HELLO
close the connection (the peer does not speak the protocol); a message of an unknown type, of the wrong size for its
type or with descriptors its type does not carry is answered with a status and the connection goes on. Descriptors
that arrive are closed unless a message takes them. A memfd the process adds must be one (it has seals), sealed
against shrinking (so the mapping here can never lose its pages under the device: no SIGBUS), at least as large as
the process says, and is mapped here once; the model places it among the device's addresses.

Answers go out without blocking: a peer that sends requests without reading the answers is closed, and an event
that does not fit in the socket's buffer is dropped and counted (events are told again by the device's state, as a
guest that posts no event buffers loses them).
"""

from __future__ import annotations

import array
import errno
import fcntl
import logging
import mmap
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import cffi

from vrdma.channel import wire
from vrdma.channel.wire import HEADER_SIZE, MAX_MESSAGE, PAGE, MessageType, Status
from vrdma.loop import EventLoop

log = logging.getLogger(__name__)

MAX_FDS = 2                     # the most descriptors one message may carry (a peer sending more is closed)
MAX_REGION = 1 << 40            # one region's bytes at most
_ffi = cffi.FFI()


class Refused(Exception):
    """A request the model refuses: the answer's status, and why (for the backend's log)."""

    def __init__(self, status: Status, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class ChannelModel(Protocol):
    """The device behind one connection (vrdma.daemon.container): what each request does."""

    def hello(self, version: int) -> tuple[dict[str, int], list[int]]:
        """HELLO's answer fields (struct vrdma_chan_hello_resp's, by name) and the descriptors it carries."""

    def memory_added(self, size: int, host_address: int) -> int:
        """A region of ``size`` bytes mapped here at ``host_address``: its device address (Refused if none)."""

    def memory_removed(self, address: int) -> None:
        """The region at device address ``address`` leaves the device (Refused if there is none); unmapped after."""

    def command(self, request: bytes) -> bytes:
        """A command's response."""

    def cq_notify(self, cq: int, cookie: int, fd: int) -> None:
        """CQ ``cq``'s events go into ``fd`` (a pipe's write end, this call's to keep or not: the channel closes its
        own after) as ``cookie`` (Refused if it may not)."""

    def closed(self, reason: str) -> None:
        """The connection ended: the device forgets the process (its regions are unmapped after this returns)."""


@dataclass
class Region:
    address: int        # its device address (the model's)
    size: int
    map: mmap.mmap

    @property
    def host_address(self) -> int:
        return host_address(self.map)


def host_address(mapping: mmap.mmap) -> int:
    """Where a mapping is in this process (the buffer export is dropped at once: the mapping can still close)."""
    return int(_ffi.cast("uintptr_t", _ffi.from_buffer(mapping)))


@dataclass
class ChannelCounters:
    messages: int = 0
    refused: int = 0            # answered with a status other than OK
    events_sent: int = 0
    events_dropped: int = 0     # the peer's socket buffer was full


class ChannelConnection:
    def __init__(self, name: str, sock: socket.socket, loop: EventLoop, model: ChannelModel, max_regions: int,
                 on_closed: Callable[[ChannelConnection, str], None]) -> None:
        self.name = name
        self.sock = sock
        self.loop = loop
        self.model = model
        self.max_regions = max_regions
        self.on_closed = on_closed
        self.regions: dict[int, Region] = {}
        self.greeted = False
        self.closed = False
        self.counters = ChannelCounters()
        sock.setblocking(False)
        loop.add_reader(sock.fileno(), self._readable)

    # -- input ----------------------------------------------------------------------------------------------------

    def _readable(self) -> None:
        try:
            data, ancdata, flags, _ = self.sock.recvmsg(MAX_MESSAGE + 1, socket.CMSG_SPACE(MAX_FDS * 4),
                                                        socket.MSG_CMSG_CLOEXEC)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as err:
            self.close(f"receive failed: {err.strerror}")
            return
        fds = _descriptors(ancdata)  # closed below whatever happens: a region keeps a mapping, not a descriptor
        try:
            if not data and not fds:
                self.close("the process closed the channel")
            elif flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                self.close(f"a message longer than {MAX_MESSAGE} bytes or with more than {MAX_FDS} descriptors")
            else:
                self._handle(data, fds)
        finally:
            for fd in fds:
                os.close(fd)

    def _handle(self, data: bytes, fds: list[int]) -> None:
        """One message (the caller closes its descriptors after: a region keeps a mapping, not the descriptor)."""
        if len(data) < HEADER_SIZE:
            self.close(f"a {len(data)}-byte message has no header")
            return
        self.counters.messages += 1
        hdr = wire.api.from_bytes("vrdma_chan_hdr", data[:HEADER_SIZE])
        kind, seq = int(hdr.type), int(hdr.seq)
        if not self.greeted and kind != MessageType.HELLO:
            self.close(f"the first message is of type {kind}, not HELLO")
            return
        status = Status.OK
        try:
            answer, tail, out_fds = self._dispatch(kind, data, fds)
        except Refused as err:
            log.warning("%s: message of type %d refused (status %d): %s", self.name, kind, err.status, err)
            self.counters.refused += 1
            answer, tail, out_fds, status = None, b"", [], err.status
        answer_hdr = wire.api.new("vrdma_chan_hdr") if answer is None else answer.hdr
        answer_hdr.type, answer_hdr.status, answer_hdr.seq = kind, status, seq
        self._send(wire.api.to_bytes(answer_hdr if answer is None else answer) + tail, out_fds, answer=True)

    def _dispatch(self, kind: int, data: bytes, fds: list[int]) -> tuple[Any, bytes, list[int]]:
        """A request's answer: its struct (None: a bare header), the bytes after it, the descriptors it carries."""
        try:
            message = MessageType(kind)
            struct, wanted_fds = wire.REQUESTS[message]
        except (ValueError, KeyError):
            raise Refused(Status.NOT_SUPPORTED, f"unknown message type {kind}") from None
        if len(fds) != wanted_fds:
            raise Refused(Status.INVALID, f"{message.name} carries {wanted_fds} descriptors, not {len(fds)}")
        if message is MessageType.COMMAND:
            return None, self.model.command(data[HEADER_SIZE:]), []
        if len(data) != wire.api.sizeof(struct):
            raise Refused(Status.BAD_LENGTH, f"{message.name} of {len(data)} bytes, not {wire.api.sizeof(struct)}")
        body = wire.api.from_bytes(struct, data)
        if message is MessageType.HELLO:
            if self.greeted:
                raise Refused(Status.INVALID, "a second HELLO")
            if body.reserved:
                raise Refused(Status.INVALID, "HELLO's reserved field is not 0")
            fields, out_fds = self.model.hello(int(body.version))
            self.greeted = True
            return wire.api.new("vrdma_chan_hello_resp", **fields), b"", out_fds
        if message is MessageType.CQ_NOTIFY:
            if body.reserved:
                raise Refused(Status.INVALID, "CQ_NOTIFY's reserved field is not 0")
            self.model.cq_notify(int(body.cq), int(body.cookie), fds[0])
            return None, b"", []
        if message is MessageType.ADD_MEMORY:
            address = self._add_memory(fds[0], int(body.size))
        else:
            address = int(body.addr)
            self._remove_memory(address)
        return wire.api.new("vrdma_chan_memory_resp", addr=address), b"", []

    def _add_memory(self, fd: int, size: int) -> int:
        if len(self.regions) >= self.max_regions:
            raise Refused(Status.NO_RESOURCES, f"the process holds {len(self.regions)} regions already")
        if not 0 < size <= MAX_REGION or size % PAGE:
            raise Refused(Status.INVALID, f"a region of {size} bytes (whole pages, at most {MAX_REGION})")
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError:
            raise Refused(Status.INVALID, "the descriptor is no memfd (it has no seals)") from None
        if not seals & fcntl.F_SEAL_SHRINK:
            raise Refused(Status.INVALID, "the memfd is not sealed against shrinking (F_SEAL_SHRINK)")
        if os.fstat(fd).st_size < size:
            raise Refused(Status.INVALID, f"the memfd has {os.fstat(fd).st_size} bytes, not {size}")
        try:
            mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as err:
            raise Refused(Status.NO_RESOURCES, f"cannot map the memfd: {err.strerror}") from None
        try:
            address = self.model.memory_added(size, host_address(mapping))
        except BaseException:
            mapping.close()
            raise
        self.regions[address] = Region(address, size, mapping)
        return address

    def _remove_memory(self, address: int) -> None:
        region = self.regions.get(address)
        if region is None:
            raise Refused(Status.INVALID, f"no region at {address:#x}")
        self.model.memory_removed(address)
        del self.regions[address]
        region.map.close()

    # -- output ---------------------------------------------------------------------------------------------------

    def send_event(self, event: bytes) -> None:
        """An EVENT message carrying ``event`` (dropped, and counted, if the peer's buffer is full)."""
        if self.closed:
            return
        hdr = wire.api.new("vrdma_chan_hdr", type=MessageType.EVENT)
        if self._send(wire.api.to_bytes(hdr) + event, [], answer=False):
            self.counters.events_sent += 1

    def _send(self, payload: bytes, fds: list[int], answer: bool) -> bool:
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []
        try:
            self.sock.sendmsg([payload], ancillary, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
            return True
        except (BlockingIOError, InterruptedError):
            if answer:
                self.close("the process does not read its answers")
            else:
                self.counters.events_dropped += 1
        except OSError as err:
            if err.errno not in (errno.EPIPE, errno.ECONNRESET):
                log.warning("%s: send failed: %s", self.name, err.strerror)
            self.close(f"send failed: {err.strerror}")
        return False

    # -- end ------------------------------------------------------------------------------------------------------

    def close(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        log.info("%s: channel closed: %s", self.name, reason)
        self.loop.remove_reader(self.sock.fileno())
        try:
            self.model.closed(reason)
        finally:
            for region in self.regions.values():
                region.map.close()
            self.regions.clear()
            self.sock.close()
            self.on_closed(self, reason)


def _descriptors(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    fds = array.array("i")
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    return list(fds)
