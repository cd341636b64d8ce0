"""The backend process: one event loop serving one vhost-user device per VM.

Each VM has its own socket, its own RDMA device state and its own doorbell region. A listening socket takes one
frontend connection at a time; when that connection ends (or breaks), everything the VM owned is freed and the
socket waits for QEMU to reconnect. Nothing one VM sends can reach another VM's state.
"""

from __future__ import annotations

import contextlib
import errno
import faulthandler
import logging
import os
import signal
import socket
from dataclasses import dataclass
from pathlib import Path

from vrdma.daemon.admin import AdminCommand, AdminSocket
from vrdma.daemon.doorbell import DoorbellRegion
from vrdma.daemon.roce import ROCE_PORT, RoceSockets, open_sockets
from vrdma.daemon.transport import QUEUE_NAMES, VirtioRdmaTransport
from vrdma.device import abi
from vrdma.device.device import RdmaDevice
from vrdma.device.fabric import Fabric
from vrdma.device.params import DEFAULT_LIMITS
from vrdma.engine.native import Engine
from vrdma.errors import VrdmaError
from vrdma.faultguard import FaultGuard
from vrdma.loop import EventLoop
from vrdma.vhost_user.connection import CloseCause, State, VhostUserConnection

log = logging.getLogger(__name__)


class BackendError(VrdmaError):
    """The backend cannot start as asked (a socket path it cannot use, a bad option value)."""


@dataclass
class EndpointSpec:
    name: str
    socket_path: Path | None = None   # listen here
    fd: int | None = None             # or use this already connected socket
    mac: bytes = bytes(6)
    doorbell_path: Path | None = None


@dataclass
class ConnectionCounters:
    """What happened to a VM's vhost-user connections (the admin socket's "connection" counters)."""

    accepted: int = 0
    refused: int = 0             # a second frontend while one is connected
    closed: int = 0
    protocol_errors: int = 0     # closes for a message the protocol layer or libvhost-user refused
    memory_faults: int = 0       # SIGBUS contained in the guest's memory or the doorbell region
    last_close_reason: str = ""


class VmEndpoint:
    """One VM: its socket, its device model, its doorbell region and its current connection."""

    def __init__(self, spec: EndpointSpec, loop: EventLoop, fabric: Fabric, guard: FaultGuard | None = None) -> None:
        self.spec = spec
        self.name = spec.name
        self.loop = loop
        self.guard = guard
        self.counters = ConnectionCounters()
        self.connection: VhostUserConnection | None = None
        self.listener: socket.socket | None = None
        if spec.socket_path is not None:
            self.listener = _listen(spec.socket_path)
        doorbell_path = spec.doorbell_path or Path(f"/dev/shm/vrdma-{os.getpid()}-{spec.name}.doorbell")
        size = DEFAULT_LIMITS.doorbell_pages * abi.const("VRDMA_DOORBELL_PAGE_SIZE")
        try:
            self.doorbell = DoorbellRegion(doorbell_path, size)
        except OSError as err:
            if self.listener is not None:
                self.listener.close()
            raise BackendError(f"{self.name}: cannot create the doorbell region {doorbell_path}: "
                               f"{err.strerror}") from err
        self.rdma = RdmaDevice(spec.name, mac=spec.mac, pairing_id=self.doorbell.pairing_id, fabric=fabric,
                               doorbells=self.doorbell.map)
        self.doorbell.write_header(self.rdma.doorbell_header())
        self.doorbell_guard = None
        if guard is not None:
            self.doorbell_guard = guard.owner(f"{self.name} doorbell region", self._doorbell_fault)
            self.doorbell_guard.guard_ranges([(self.doorbell.address, self.doorbell.size)])
        self.transport = VirtioRdmaTransport(self.rdma)
        if self.listener is not None:
            loop.add_reader(self.listener.fileno(), self._accept)
            log.info("%s: listening on %s (doorbell region %s, %s, pairing id %#018x)", self.name,
                     spec.socket_path, doorbell_path, "reused" if self.doorbell.reused else "new",
                     self.rdma.pairing_id)
        elif spec.fd is not None:
            try:
                sock = socket.socket(fileno=spec.fd)
            except OSError as err:
                raise BackendError(f"{self.name}: --fd {spec.fd} is not a socket: {err}") from err
            self._serve(sock)

    def _accept(self) -> None:
        assert self.listener is not None
        try:
            sock, _ = self.listener.accept()
        except OSError as err:
            log.warning("%s: accept failed: %s", self.name, err)
            return
        if self.connection is not None and self.connection.state is State.CONNECTED:
            log.error("%s: refusing a second frontend connection while one is active", self.name)
            self.counters.refused += 1
            sock.close()
            return
        self._serve(sock)

    def _serve(self, sock: socket.socket) -> None:
        try:
            self.connection = VhostUserConnection(self.name, sock, self.loop, self.transport, guard=self.guard,
                                              on_closed=self._closed)
        except OSError as err:
            log.error("%s: cannot serve the connection: %s", self.name, err)
            sock.close()
            return
        self.counters.accepted += 1

    def _closed(self, cause: CloseCause, reason: str) -> None:
        self.counters.closed += 1
        self.counters.last_close_reason = reason
        if cause is CloseCause.PROTOCOL_ERROR:
            self.counters.protocol_errors += 1
        elif cause is CloseCause.MEMORY_FAULT:
            self.counters.memory_faults += 1

    def _doorbell_fault(self, faults: int) -> None:
        """QEMU truncated the doorbell region: this VM's device goes down, its region comes back, the VM may
        reconnect. No other VM is touched."""
        if self.connection is not None and self.connection.state is not State.CLOSED:
            self.connection.close(f"doorbell region fault: {self.doorbell.path} was truncated", CloseCause.MEMORY_FAULT)
        else:
            self.counters.memory_faults += 1
        try:
            self.doorbell.restore()
        except OSError as err:
            log.error("%s: the doorbell region cannot be restored (%s): the VM's device stays down", self.name, err)
            return
        self.doorbell.write_header(self.rdma.doorbell_header())
        log.warning("%s: doorbell region restored in place (pairing id %#018x)", self.name, self.rdma.pairing_id)

    def counters_snapshot(self) -> dict[str, object]:
        c = self.counters
        conn = self.connection
        connected = conn is not None and conn.state is State.CONNECTED
        return {**self.rdma.counters_snapshot(),
                "doorbell_region": {"path": str(self.doorbell.path), "reused": self.doorbell.reused},
                "connection": {"state": "connected" if connected else "waiting", "accepted": c.accepted,
                               "refused": c.refused, "closed": c.closed, "protocol_errors": c.protocol_errors,
                               "memory_faults": c.memory_faults, "last_close_reason": c.last_close_reason,
                               # What the current (or last) connection negotiated and did.
                               "features": conn.negotiated_features if conn is not None else None,
                               "protocol_features": conn.negotiated_protocol_features if conn is not None else None,
                               "config_reads": conn.config_reads if conn is not None else 0,
                               "queues_started": sorted(QUEUE_NAMES.get(i, str(i)) for i in self.transport.started),
                               "device_resets": self.transport.device_resets}}

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close("the backend is stopping", CloseCause.STOPPING)
        if self.listener is not None:
            self.loop.remove_reader(self.listener.fileno())
            self.listener.close()
            if self.spec.socket_path is not None:
                self.spec.socket_path.unlink(missing_ok=True)
        self.rdma.close()  # the data engine lets go of the doorbell region before it is unmapped
        if self.doorbell_guard is not None:
            self.doorbell_guard.release()
        self.doorbell.close()


def _listen(path: Path) -> socket.socket:
    if not path.parent.is_dir():
        raise BackendError(f"cannot listen on {path}: directory {path.parent} does not exist")
    if path.exists() or path.is_symlink():
        if not path.is_socket():
            raise BackendError(f"cannot listen on {path}: it exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except ConnectionRefusedError:
            path.unlink()  # a stale socket of a backend that died
        except OSError as err:
            raise BackendError(f"cannot listen on {path}: {err}") from err
        else:
            raise BackendError(f"cannot listen on {path}: another process is serving it")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        sock.listen(4)
    except OSError as err:
        sock.close()
        reason = "path too long" if err.errno == errno.EINVAL or len(str(path)) > 107 else err.strerror
        raise BackendError(f"cannot listen on {path}: {reason}") from err
    return sock


class Backend:
    """``with Backend(specs) as backend: backend.run()`` until SIGTERM/SIGINT or ``stop()``."""

    def __init__(self, specs: list[EndpointSpec], admin_socket: Path | None = None,
                 admin_extensions: dict[str, AdminCommand] | None = None, roce: bool = False) -> None:
        """``admin_extensions``: commands the admin socket answers besides "counters" (test hooks); ``roce``: speak
        RoCE v2 to other hosts for destinations no VM here holds (vrdma.daemon.roce)."""
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise BackendError(f"VM names must be unique: {', '.join(names)}")
        self.loop = EventLoop()
        self.guard: FaultGuard | None = FaultGuard(self.loop)
        self.engine = Engine(max(1, len(specs)))
        self.fabric = Fabric(self.engine, max(1, len(specs)))
        self.endpoints: list[VmEndpoint] = []
        self._stop_r, self._stop_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.stopping = False
        self.admin: AdminSocket | None = None
        self.roce: RoceSockets | None = None
        try:
            if roce:
                self.roce = open_sockets()
                udp6 = self.roce.udp6.fileno() if self.roce.udp6 is not None else -1
                self.engine.attach_network(self.roce.rx.fileno(), self.roce.tx.fileno(), udp6)
                # Readable wakes a parked loop; the engine reads the sockets when it polls.
                for fd in (self.roce.rx.fileno(), udp6):
                    if fd >= 0:
                        self.loop.add_reader(fd, lambda: None)
                log.info("RoCE v2 on UDP port %d: destinations no VM here holds are reached over the network",
                         ROCE_PORT)
            for spec in specs:
                self.endpoints.append(VmEndpoint(spec, self.loop, self.fabric, self.guard))
            if admin_socket is not None:
                try:
                    self.admin = AdminSocket(admin_socket, self.loop,
                                             lambda: {e.name: e for e in self.endpoints}, admin_extensions,
                                             self.engine.net_counters if roce else None)
                except OSError as err:  # (an over-long path raises with no errno: its text says it)
                    raise BackendError(f"cannot listen on admin socket {admin_socket}: {err.strerror or err}") \
                        from err
        except BaseException:
            self.close()
            raise
        self.loop.add_reader(self._stop_r, self._drain_stop)

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stop(self) -> None:
        """Ask run() to return; safe from a signal handler."""
        self.stopping = True
        with contextlib.suppress(OSError):
            os.write(self._stop_w, b"x")

    def _drain_stop(self) -> None:
        while True:
            try:
                if not os.read(self._stop_r, 64):
                    break
            except BlockingIOError:
                break

    def run(self) -> None:
        previous = {sig: signal.signal(sig, lambda *_: self.stop()) for sig in (signal.SIGTERM, signal.SIGINT)}
        # A VM's QEMU that closes its socket before reading a reply must cost that VM its connection (EPIPE),
        # not the process its life: libvhost-user writes replies with plain sendmsg().
        previous[signal.SIGPIPE] = signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        # SIGUSR1 writes every thread's Python stack to stderr (the log), from the signal handler itself: it answers
        # even while the loop is inside C, which is where a backend that does not stop would be.
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        try:
            while not self.stopping:
                self.run_once()
        finally:
            faulthandler.unregister(signal.SIGUSR1)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        log.info("stopping")

    def run_once(self) -> None:
        """One turn: wait for descriptors (not at all while the data engine is busy), then run the engine."""
        self.loop.run_once(self.fabric.timeout())
        self.fabric.run()

    def close(self) -> None:
        if self.admin is not None:
            self.admin.close()
            self.admin = None
        for endpoint in self.endpoints:
            endpoint.close()
        self.endpoints = []
        if self.roce is not None:
            self.loop.remove_reader(self.roce.rx.fileno())
            if self.roce.udp6 is not None:
                self.loop.remove_reader(self.roce.udp6.fileno())
            self.engine.attach_network(-1, -1, -1)
            self.roce.close()
            self.roce = None
        if self.guard is not None:
            self.guard.close()
            self.guard = None
        for fd in (self._stop_r, self._stop_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.loop.close()


def capabilities() -> dict[str, object]:
    """What `vrdma backend --print-capabilities` prints (vhost-user backend program conventions)."""
    return {
        "type": "rdma",
        "virtio-id": abi.const("VRDMA_VIRTIO_ID"),
        "abi-version": abi.const("VRDMA_ABI_VERSION"),
        "num-queues": abi.const("VRDMA_NUM_QUEUES"),
        "config-size": abi.sizeof("vrdma_config"),
        "features": [],
    }
