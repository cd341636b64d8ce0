"""A container the backend serves: one RDMA device, a socket its processes connect to, a user context each.

A container is a seat like a VM's (docs/containers.md): one device in the data engine, with the limits and QoS a
VM has, whose GID is the container's address (set here: a process cannot change it, as a datagram's source is its
device's). Its processes reach it through the container channel (vrdma.channel) on a unix socket the backend
listens on and the container has bind-mounted; each connection is one process and one user context
(vrdma.device.scope: its commands name only its objects, its page lists only its memory, its events reach it
alone). What a process shares it shares as memfds, each placed in the process's own window of device addresses
(1 TiB each: slot k's is [(k + 1) << 40, (k + 2) << 40)); the device's memory table is every process's regions.
The doorbell region is one sealed memfd, and the wake eventfd one eventfd, for the whole container: its processes
are one trust domain on the doorbells, as one VM's are under its kernel (docs/containers.md says what that means).

A process that goes, however it goes (exit, kill -9), closes its socket: its objects are destroyed, its regions
leave the memory table and are unmapped, its slot is free again; no other process or VM notices.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import stat
import struct
from pathlib import Path

from vrdma.channel import wire
from vrdma.channel.connection import ChannelConnection, Refused
from vrdma.channel.wire import Status
from vrdma.daemon.config import ContainerSpec
from vrdma.daemon.doorbell import DoorbellRegion
from vrdma.device import abi
from vrdma.device.constants import EventType
from vrdma.device.device import RdmaDevice
from vrdma.device.fabric import Fabric
from vrdma.device.params import DEFAULT_LIMITS
from vrdma.device.scope import ContextScope, ScopeError
from vrdma.engine.api import MAX_REGIONS
from vrdma.errors import VrdmaError
from vrdma.loop import EventLoop

log = logging.getLogger(__name__)

WINDOW_BITS = 40
MAX_RESPONSE = wire.MAX_MESSAGE - wire.HEADER_SIZE


class ContainerError(VrdmaError):
    """A container the backend cannot serve as asked (its socket in use or unusable)."""


class ContainerEndpoint:
    """The container's device, its doorbell region and wake eventfd, its listening socket and its processes."""

    def __init__(self, spec: ContainerSpec, loop: EventLoop, fabric: Fabric) -> None:
        self.spec = spec
        self.name = spec.name
        self.loop = loop
        self.sessions: dict[int, ProcessSession] = {}  # by slot
        self.refused = 0
        self.listener = _listen(spec)
        try:
            size = DEFAULT_LIMITS.doorbell_pages * abi.const("VRDMA_DOORBELL_PAGE_SIZE")
            self.doorbell = DoorbellRegion(None, size)
            self.wake_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
            self.rdma = RdmaDevice(spec.name, fabric=fabric, doorbells=self.doorbell.map, qos=spec.qos,
                                   pairing_id=self.doorbell.pairing_id)
        except BaseException:
            self.listener.close()
            raise
        self.doorbell.write_header(self.rdma.doorbell_header())
        fabric.engine.set_wake_fd(self.rdma.engine_index, self.wake_fd)
        self.rdma.objects.gids.add(0, spec.gid, abi.const("VRDMA_GID_TYPE_ROCE_V2"))
        self.rdma.on_event = self.deliver_events
        loop.add_reader(self.listener.fileno(), self._accept)
        loop.add_reader(self.wake_fd, self._woken)
        log.info("%s: container device on %s (GID %s), up to %d processes", self.name, spec.socket_path,
                 spec.address, spec.max_processes)

    def _woken(self) -> None:
        """A process woke the parked engine (the engine's thread watched the eventfd; it is read here, as a VM's
        wake queue's kick is read by its connection, or it would stay readable and the engine never sleep)."""
        try:
            os.eventfd_read(self.wake_fd)
        except BlockingIOError:
            return
        self.rdma.fabric.kick(self.rdma.engine_index)

    @property
    def regions_per_process(self) -> int:
        return MAX_REGIONS // self.spec.max_processes  # the device's memory table, shared

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as err:
            log.error("%s: accept failed: %s", self.name, err.strerror)
            return
        self.serve(sock, _peer_pid(sock))

    def serve(self, sock: socket.socket, pid: int) -> ProcessSession | None:
        """One process's connection (``pid``: for the log), in a free slot; None (the socket closed) if none is."""
        free = [slot for slot in range(self.spec.max_processes) if slot not in self.sessions]
        if not free:
            log.warning("%s: process %d refused: all %d process slots are in use", self.name, pid,
                        self.spec.max_processes)
            self.refused += 1
            sock.close()
            return None
        session = ProcessSession(self, free[0], pid)
        session.connection = ChannelConnection(f"{self.name}[{pid}]", sock, self.loop, session,
                                               self.regions_per_process, self._closed)
        self.sessions[free[0]] = session
        log.info("%s: process %d connected (slot %d)", self.name, pid, free[0])
        return session

    def _closed(self, connection: ChannelConnection, reason: str) -> None:
        for slot, session in list(self.sessions.items()):
            if session.connection is connection:
                del self.sessions[slot]

    def memory_changed(self) -> None:
        """The device's memory table becomes every process's regions (the engine held between its passes)."""
        table = sorted(region for session in self.sessions.values() for region in session.regions.values())
        with self.rdma.fabric.paused(self.rdma.engine_index):
            self.rdma.set_memory(table)

    def deliver_events(self) -> None:
        """Each event the device has goes to the process whose object it is about (a port's, to every process): a
        CQ's into the pipe of its completion channel, if the process gave one (CQ_NOTIFY), else as an EVENT."""
        while self.rdma.events:
            event = self.rdma.events.popleft()
            for session in list(self.sessions.values()):
                if session.scope is not None and session.scope.owns_event(event) and session.connection is not None \
                        and not session.notified(event):
                    session.connection.send_event(event)

    def counters_snapshot(self) -> dict[str, object]:
        """The device's counters (objects, commands, the engine's, QoS) and its processes' channels."""
        channels = [session.connection.counters for session in self.sessions.values() if session.connection]
        return {**self.rdma.counters_snapshot(),
                "channel": {"processes": len(self.sessions), "refused": self.refused,
                            "messages": sum(c.messages for c in channels),
                            "messages_refused": sum(c.refused for c in channels),
                            "events_sent": sum(c.events_sent for c in channels),
                            "events_dropped": sum(c.events_dropped for c in channels),
                            "cq_events_dropped": sum(s.cq_events_dropped for s in self.sessions.values())}}

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "socket": str(self.spec.socket_path), "address": self.spec.address,
                "max_processes": self.spec.max_processes, "refused": self.refused,
                "processes": [session.describe() for session in self.sessions.values()]}

    def close(self, reason: str) -> None:
        """Stop serving the container: every process's connection closes (their objects go), then the device."""
        self.loop.remove_reader(self.listener.fileno())
        self.loop.remove_reader(self.wake_fd)
        self.listener.close()
        for session in list(self.sessions.values()):
            if session.connection is not None:
                session.connection.close(reason)
        self.sessions.clear()
        self.rdma.fabric.engine.set_wake_fd(self.rdma.engine_index, -1)
        self.rdma.close()
        self.doorbell.close()
        os.close(self.wake_fd)
        try:
            if stat.S_ISSOCK(os.lstat(self.spec.socket_path).st_mode):
                os.unlink(self.spec.socket_path)
        except OSError:
            pass
        log.info("%s: container no longer served: %s", self.name, reason)


class ProcessSession:
    """One process of the container (vrdma.channel.connection.ChannelModel): its user context and its regions."""

    def __init__(self, endpoint: ContainerEndpoint, slot: int, pid: int) -> None:
        self.endpoint = endpoint
        self.slot = slot
        self.pid = pid
        self.window = ((slot + 1) << WINDOW_BITS, ((slot + 2) << WINDOW_BITS) - 1)
        self.next_address = self.window[0]
        self.regions: dict[int, tuple[int, int, int]] = {}  # device address -> (address, size, host address)
        self.scope: ContextScope | None = None
        self.connection: ChannelConnection | None = None
        self.cq_pipes: dict[int, tuple[int, bytes]] = {}  # CQ handle -> (its channel's pipe, the 8 bytes to write)
        self.cq_events_dropped = 0

    @property
    def owner(self) -> str:
        return f"{self.endpoint.name}[{self.pid}]"

    def hello(self, version: int) -> tuple[dict[str, int], list[int]]:
        if version != wire.VERSION:
            raise Refused(Status.INVALID, f"channel version {version}; this backend speaks {wire.VERSION}")
        rdma = self.endpoint.rdma
        try:
            self.scope = ContextScope(rdma, self.owner, self.window)
        except ScopeError as err:
            raise Refused(Status.NO_RESOURCES, str(err)) from None
        fields = {"version": wire.VERSION, "ucontext": self.scope.ucontext,
                  "doorbell_page": self.scope.doorbell_page, "doorbell_pages": rdma.limits.doorbell_pages,
                  "window_base": self.window[0], "window_size": self.window[1] - self.window[0] + 1,
                  "max_regions": self.endpoint.regions_per_process, "max_message": wire.MAX_MESSAGE}
        return fields, [self.endpoint.doorbell.fd, self.endpoint.wake_fd]

    def memory_added(self, size: int, host_address: int) -> int:
        address = self.next_address
        if size > self.window[1] + 1 - address:
            raise Refused(Status.NO_RESOURCES, f"the process's window has {self.window[1] + 1 - address} bytes left")
        self.next_address += size
        self.regions[address] = (address, size, host_address)
        self.endpoint.memory_changed()
        return address

    def memory_removed(self, address: int) -> None:
        # Objects still on the region lose their pages (the engine fails their work), as a guest's would that
        # unplugged memory under them: the process's own.
        del self.regions[address]
        self.endpoint.memory_changed()

    def command(self, request: bytes) -> bytes:
        if self.scope is None:  # (the channel answers nothing before HELLO)
            raise Refused(Status.INVALID, "no user context")
        response = self.scope.execute(request, MAX_RESPONSE)
        for cq in [cq for cq in self.cq_pipes if not self.scope.owns("cq", cq)]:
            os.close(self.cq_pipes.pop(cq)[0])  # the CQ went: its events with it
        return response

    def cq_notify(self, cq: int, cookie: int, fd: int) -> None:
        if self.scope is None or not self.scope.owns("cq", cq):
            raise Refused(Status.INVALID, f"CQ {cq} is no CQ of the process's")
        mode = os.fstat(fd).st_mode
        if not stat.S_ISFIFO(mode) or fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE != os.O_WRONLY:
            raise Refused(Status.INVALID, "CQ_NOTIFY's descriptor is no pipe's write end")
        kept = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 0)
        os.set_blocking(kept, False)  # (a full pipe drops an event; it never holds the backend)
        old = self.cq_pipes.pop(cq, None)
        if old is not None:
            os.close(old[0])
        self.cq_pipes[cq] = (kept, cookie.to_bytes(8, "little"))

    def notified(self, event: bytes) -> bool:
        """Whether a completion event went into its CQ's pipe (the process's completion channel)."""
        parsed = abi.from_bytes("vrdma_event", event)
        pipe = self.cq_pipes.get(int(parsed.handle)) if int(parsed.type) == EventType.CQ_COMP else None
        if pipe is None:
            return False
        try:
            os.write(pipe[0], pipe[1])
        except BlockingIOError:
            self.cq_events_dropped += 1
        except OSError:  # nobody reads it any more
            os.close(self.cq_pipes.pop(int(parsed.handle))[0])
        return True

    def closed(self, reason: str) -> None:
        for pipe, _ in self.cq_pipes.values():
            os.close(pipe)
        self.cq_pipes.clear()
        if self.scope is not None:
            self.scope.close()
        self.regions.clear()
        self.endpoint.memory_changed()
        log.info("%s: process gone (%s)", self.owner, reason)

    def describe(self) -> dict[str, object]:
        return {"pid": self.pid, "slot": self.slot, "regions": len(self.regions),
                "objects": self.scope.objects() if self.scope is not None else {}}


def _listen(spec: ContainerSpec) -> socket.socket:
    path = spec.socket_path
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            if _answers(path):
                raise ContainerError(f"{spec.name}: {path} is the socket of a backend that serves it now")
            os.unlink(path)  # a socket left by a backend that is gone
    except FileNotFoundError:
        pass
    except OSError as err:
        raise ContainerError(f"{spec.name}: cannot use {path}: {err.strerror}") from None
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
    try:
        listener.bind(str(path))
        os.chmod(path, 0o660)
        listener.listen(16)
    except OSError as err:
        listener.close()
        raise ContainerError(f"{spec.name}: cannot listen on {path}: {err.strerror}") from None
    return listener


def _answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def _peer_pid(sock: socket.socket) -> int:
    """The connecting process's PID in the backend's PID namespace (0 when the kernel does not say)."""
    try:
        pid, _, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    except OSError:
        return 0
    return int(pid)
