"""A simulated container process on the container channel: what libvrdma does in a container, from Python.

``ContainerProcess`` connects to a container's socket, says HELLO (and is given the doorbell region and the wake
eventfd), shares a memfd of its own as its memory (ADD_MEMORY) and sends commands: a
vrdma.testing.simulated_guest.DevicePort, so that SimVerbs drives a container's device exactly as it drives a
VM's. It can also send any bytes and descriptors a hostile process could (``exchange``).
"""

from __future__ import annotations

import array
import fcntl
import mmap
import os
import socket
from pathlib import Path
from typing import Any

from vrdma.channel import wire
from vrdma.channel.wire import MessageType
from vrdma.device import abi
from vrdma.testing.frontend import FrontendError
from vrdma.testing.simulated_guest import SimVerbs

PAGE = 4096


class ChannelError(FrontendError):
    pass


class ProcessMemory:
    """A memfd shared with the device (GuestMemory's interface, in device addresses): a bump allocator over it."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.fd = os.memfd_create("vrdma-process", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(self.fd, size)
        fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
        self.map = mmap.mmap(self.fd, size)
        self.base = 0          # its device address, once added
        self.next = PAGE       # (its first page unused, as a null pointer should be)

    def alloc(self, size: int, align: int = 16) -> int:
        start = (self.next + align - 1) & ~(align - 1)
        if start + size > self.size:
            raise ChannelError(f"process memory exhausted ({self.size} bytes)")
        self.next = start + size
        return self.base + start

    def read(self, address: int, length: int) -> bytes:
        offset = address - self.base
        return bytes(self.map[offset:offset + length])

    def write(self, address: int, data: bytes) -> None:
        offset = address - self.base
        self.map[offset:offset + len(data)] = data

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)


class ContainerProcess:
    """One connection to a container's device; ``verbs`` is a SimVerbs on its user context."""

    def __init__(self, socket_path: Path, memory_size: int = 16 << 20, timeout: float = 10.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        self.sock.settimeout(timeout)
        self.sock.connect(str(socket_path))
        self.seq = 0
        self.events: list[Any] = []
        self.memory = ProcessMemory(memory_size)
        hello = self.request("vrdma_chan_hello", MessageType.HELLO, version=wire.VERSION)
        answer, fds = hello
        if len(fds) != 2:
            raise ChannelError(f"HELLO's answer carried {len(fds)} descriptors, not 2")
        self.hello = wire.api.from_bytes("vrdma_chan_hello_resp", answer)
        self.doorbell_fd, self.wake_fd = fds
        self.doorbells = mmap.mmap(self.doorbell_fd, int(self.hello.doorbell_pages) * PAGE)
        self.memory.base = self.add_memory(self.memory.fd, memory_size)
        self.verbs = SimVerbs(self, self.doorbells, context=(int(self.hello.ucontext),
                                                             int(self.hello.doorbell_page)))

    # -- DevicePort ---------------------------------------------------------------------------------------------

    def command(self, request: bytes, response_size: int) -> bytes:
        answer, _ = self.exchange(MessageType.COMMAND, request)
        return answer[wire.HEADER_SIZE:]

    def wake(self) -> None:
        os.eventfd_write(self.wake_fd, 1)

    # -- the channel --------------------------------------------------------------------------------------------

    def add_memory(self, fd: int, size: int) -> int:
        answer, _ = self.request("vrdma_chan_add_memory", MessageType.ADD_MEMORY, fds=[fd], size=size)
        return int(wire.api.from_bytes("vrdma_chan_memory_resp", answer).addr)

    def remove_memory(self, address: int) -> None:
        self.request("vrdma_chan_remove_memory", MessageType.REMOVE_MEMORY, addr=address)

    def request(self, struct: str, kind: MessageType, fds: list[int] | None = None,
                **fields: int) -> tuple[bytes, list[int]]:
        """A request of ``struct`` (its header set here); its answer (ChannelError unless its status is OK)."""
        message = wire.api.new(struct, **fields)
        answer, out_fds = self.exchange(kind, wire.api.to_bytes(message)[wire.HEADER_SIZE:], fds or [])
        status = wire.api.from_bytes("vrdma_chan_hdr", answer[:wire.HEADER_SIZE]).status
        if status:
            raise ChannelError(f"{kind.name} answered with status {status}", )
        return answer, out_fds

    def exchange(self, kind: int, body: bytes, fds: list[int] | None = None) -> tuple[bytes, list[int]]:
        """Send a message of type ``kind`` (header and ``body``) and return its answer, and its descriptors; EVENT
        messages that arrive first are kept in ``events``."""
        self.seq += 1
        self.send_raw(wire.api.to_bytes(wire.api.new("vrdma_chan_hdr", type=kind, seq=self.seq)) + body, fds or [])
        while True:
            data, got = self.receive()
            hdr = wire.api.from_bytes("vrdma_chan_hdr", data[:wire.HEADER_SIZE])
            if hdr.type == MessageType.EVENT:
                self.events.append(abi.from_bytes("vrdma_event", data[wire.HEADER_SIZE:]))
                continue
            if hdr.seq != self.seq or hdr.type != kind:
                raise ChannelError(f"answer of type {hdr.type} seq {hdr.seq} to request {kind} seq {self.seq}")
            return data, got

    def send_raw(self, data: bytes, fds: list[int] | None = None) -> None:
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []
        self.sock.sendmsg([data], ancillary)

    def receive(self) -> tuple[bytes, list[int]]:
        """One message (ChannelError if the backend closed the channel)."""
        data, ancdata, _, _ = self.sock.recvmsg(wire.MAX_MESSAGE, socket.CMSG_SPACE(16), socket.MSG_CMSG_CLOEXEC)
        if not data:
            raise ChannelError("the backend closed the channel")
        fds = array.array("i")
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
        return data, list(fds)

    def wait_event(self) -> Any:
        """The next EVENT message's event."""
        while not self.events:
            data, _ = self.receive()
            if wire.api.from_bytes("vrdma_chan_hdr", data[:wire.HEADER_SIZE]).type == MessageType.EVENT:
                self.events.append(abi.from_bytes("vrdma_event", data[wire.HEADER_SIZE:]))
        return self.events.pop(0)

    def close(self) -> None:
        self.sock.close()
        self.doorbells.close()
        for fd in (self.doorbell_fd, self.wake_fd):
            os.close(fd)
        self.memory.close()

    def __enter__(self) -> ContainerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
