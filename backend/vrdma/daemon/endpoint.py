"""A VM the backend serves: its socket, and the device each QEMU of the VM connects to.

A VM has one device (``VmDevice``: the vhost-user connection, the virtio transport, the RDMA device model and the
doorbell region). While it migrates between two QEMUs that this backend both serves, it has two for a while: the
source's, which QEMU suspends at the migration's last phase, and the incoming one, made for the destination QEMU
that connects to the VM's socket while the source's connection is open. The incoming device takes the source's
state through vhost-user's device-state transfer like any destination, and when it starts from that state it takes
the source's place (``VmEndpoint._arrived``): the QPs of every other VM that delivered into the source deliver into
it (``RdmaDevice.took_over``), its doorbell region takes the VM's path, and the source's connection is closed and its
device dropped without a word to anybody (its guest runs on the destination now). An incoming device that starts
without a state handed over was no migration (a second QEMU of a running VM): its connection is refused and the VM
keeps its device. A migration that fails or is cancelled ends with the destination QEMU gone: the incoming device
goes with its connection, and the source, never touched, runs on.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vrdma.daemon.config import EndpointSpec
from vrdma.daemon.doorbell import DoorbellRegion
from vrdma.daemon.transport import QUEUE_NAMES, VirtioRdmaTransport
from vrdma.device import abi
from vrdma.device.device import RdmaDevice
from vrdma.device.fabric import Fabric
from vrdma.device.params import DEFAULT_LIMITS
from vrdma.errors import VrdmaError
from vrdma.faultguard import FaultGuard
from vrdma.loop import EventLoop
from vrdma.vhost_user.connection import CloseCause, SharedMemoryMap, State, VhostUserConnection

log = logging.getLogger(__name__)

INCOMING_SUFFIX = ".incoming"  # the incoming device's doorbell region, beside the VM's until it takes its place


class BackendError(VrdmaError):
    """The backend cannot start or serve a VM as asked (a socket path it cannot use, a name taken, no free slot)."""


@dataclass
class ConnectionCounters:
    """What happened to a VM's vhost-user connections (the admin socket's "connection" counters)."""

    accepted: int = 0
    refused: int = 0             # a frontend not served: a third while two are connected, or a second that did
    #                              not migrate into the VM
    closed: int = 0
    protocol_errors: int = 0
    memory_faults: int = 0       # SIGBUS contained in the guest's memory or the doorbell region
    migrations_in: int = 0       # an incoming device took the place of this backend's source device
    last_close_reason: str = ""


class VmDevice:
    """The vrdma device one QEMU of the VM is connected to: its connection, transport, device model and doorbell
    region. ``on_start`` and ``on_closed`` are the endpoint's (VirtioRdmaTransport.on_start; the connection's end)."""

    def __init__(self, spec: EndpointSpec, doorbell_path: Path, loop: EventLoop, fabric: Fabric,
                 guard: FaultGuard | None, on_start: Callable[[VmDevice, VhostUserConnection, bool], bool],
                 on_closed: Callable[[VmDevice, CloseCause, str], None], doorbell_fd: int | None = None) -> None:
        """``doorbell_fd``: the region's file handed over (a backend upgrade: its pages are a running guest's)."""
        self.name = spec.name
        self.loop = loop
        self.guard = guard
        self.on_closed = on_closed
        self.connection: VhostUserConnection | None = None
        self.closed = False
        size = DEFAULT_LIMITS.doorbell_pages * abi.const("VRDMA_DOORBELL_PAGE_SIZE")
        try:
            self.doorbell = DoorbellRegion(doorbell_path, size, doorbell_fd)
        except ValueError as err:
            raise BackendError(f"{self.name}: {err}") from err
        except OSError as err:
            raise BackendError(f"{self.name}: cannot create the doorbell region {doorbell_path}: "
                               f"{err.strerror}") from err
        self.rdma = RdmaDevice(spec.name, mac=spec.mac, pairing_id=self.doorbell.pairing_id, fabric=fabric,
                               doorbells=self.doorbell.map, qos=spec.qos, live_doorbells=doorbell_fd is not None)
        self.doorbell.write_header(self.rdma.doorbell_header())
        self.doorbell_guard = None
        if guard is not None:
            self.doorbell_guard = guard.owner(f"{self.name} doorbell region", self._doorbell_fault)
            self.doorbell_guard.guard_ranges([(self.doorbell.address, self.doorbell.size)])
        self.transport = VirtioRdmaTransport(self.rdma, SharedMemoryMap(
            abi.const("VRDMA_SHM_DOORBELL"), self.doorbell.fd, self.doorbell.size),
            watch_wake=lambda fd: fabric.engine.set_wake_fd(self.rdma.engine_index, fd),
            on_start=lambda connection, migrated: on_start(self, connection, migrated))

    @property
    def connected(self) -> bool:
        return self.connection is not None and self.connection.state is State.CONNECTED

    def serve(self, sock: socket.socket) -> bool:
        try:
            self.connection = VhostUserConnection(self.name, sock, self.loop, self.transport, guard=self.guard,
                                                  on_closed=lambda cause, reason: self.on_closed(self, cause, reason))
        except OSError as err:
            log.error("%s: cannot serve the connection: %s", self.name, err)
            sock.close()
            return False
        return True

    def _doorbell_fault(self, faults: int) -> None:
        """QEMU truncated the doorbell region: this VM's device goes down, its region comes back, the VM may
        reconnect. No other VM is touched."""
        if self.closed:
            return
        if self.connection is not None and self.connection.state is not State.CLOSED:
            self.connection.close(f"doorbell region fault: {self.doorbell.path} was truncated", CloseCause.MEMORY_FAULT)
        else:
            self.on_closed(self, CloseCause.MEMORY_FAULT, "doorbell region fault with no connection")
        try:
            self.doorbell.restore()
        except OSError as err:
            log.error("%s: the doorbell region cannot be restored (%s): the VM's device stays down", self.name, err)
            return
        self.doorbell.write_header(self.rdma.doorbell_header())
        log.warning("%s: doorbell region restored in place (pairing id %#018x)", self.name, self.rdma.pairing_id)

    def close(self, reason: str, cause: CloseCause = CloseCause.STOPPING, unlink: bool = False) -> None:
        """The connection (if any) closed, the device model gone from the fabric, the region unmapped (``unlink``:
        and its file removed: an incoming device's that never took the VM's place)."""
        if self.closed:
            return
        self.closed = True
        if self.connection is not None:
            self.connection.close(reason, cause)
        self.rdma.close()  # the data engine lets go of the doorbell region before it is unmapped
        if self.doorbell_guard is not None:
            self.doorbell_guard.release()
        self.doorbell.close()
        if unlink:
            self.doorbell.path.unlink(missing_ok=True)


class VmEndpoint:
    """One VM: its socket, its device, and the incoming device of a migration between two of this backend's QEMUs."""

    def __init__(self, spec: EndpointSpec, loop: EventLoop, fabric: Fabric, guard: FaultGuard | None = None,
                 handed_over: socket.socket | None = None, doorbell_fd: int | None = None) -> None:
        """``doorbell_fd``: the VM comes from the backend this process took over (vrdma.daemon.upgrade): its doorbell
        region's file, the running guest's; its socket listening already (``handed_over``, if it has one); its
        connection handed over after."""
        taken_over = doorbell_fd is not None
        self.spec = spec
        self.name = spec.name
        self.loop = loop
        self.fabric = fabric
        self.guard = guard
        self.counters = ConnectionCounters()
        self.listener: socket.socket | None = None
        if taken_over:
            self.listener = handed_over
        elif spec.socket_path is not None:
            self.listener = _listen(spec.socket_path)
        self.doorbell_path = spec.doorbell_path or Path(f"/dev/shm/vrdma-{os.getpid()}-{spec.name}.doorbell")
        try:
            self.device = self._new_device(self.doorbell_path, doorbell_fd)
        except BaseException:
            if self.listener is not None:
                self.listener.close()
            raise
        self.incoming: VmDevice | None = None
        if self.listener is not None:
            loop.add_reader(self.listener.fileno(), self._accept)
            log.info("%s: listening on %s (doorbell region %s, %s, pairing id %#018x)", self.name,
                     spec.socket_path, self.doorbell_path, "handed over" if taken_over else
                     "reused" if self.device.doorbell.reused else "new", self.rdma.pairing_id)
        elif spec.fd is not None and not taken_over:
            try:
                sock = socket.socket(fileno=spec.fd)
            except OSError as err:
                raise BackendError(f"{self.name}: --fd {spec.fd} is not a socket: {err}") from err
            self._serve(self.device, sock)

    # The VM's device as the admin socket, the metrics and the test hooks see it: the one its guest runs on.
    @property
    def rdma(self) -> RdmaDevice:
        return self.device.rdma

    @property
    def transport(self) -> VirtioRdmaTransport:
        return self.device.transport

    @property
    def connection(self) -> VhostUserConnection | None:
        return self.device.connection

    def _new_device(self, doorbell_path: Path, doorbell_fd: int | None = None) -> VmDevice:
        return VmDevice(self.spec, doorbell_path, self.loop, self.fabric, self.guard, self._device_starts,
                        self._closed, doorbell_fd)

    def _accept(self) -> None:
        assert self.listener is not None
        try:
            sock, _ = self.listener.accept()
        except OSError as err:
            log.warning("%s: accept failed: %s", self.name, err)
            return
        if not self.device.connected:
            self._serve(self.device, sock)
            return
        if self.incoming is not None:
            log.error("%s: refusing a third frontend connection while two are open (a migration's source and "
                      "destination)", self.name)
            self.counters.refused += 1
            sock.close()
            return
        # A second QEMU of the VM: a migration's destination, known as one when it starts from the source's state.
        try:
            self.incoming = self._new_device(self.doorbell_path.with_name(self.doorbell_path.name + INCOMING_SUFFIX))
        except BackendError as err:
            log.error("%s: cannot make a device for a second frontend: %s", self.name, err)
            self.counters.refused += 1
            sock.close()
            return
        except RuntimeError as err:  # the fabric has no free slot
            log.error("%s: no room in the engine for a migration's destination device: %s", self.name, err)
            self.counters.refused += 1
            sock.close()
            return
        log.info("%s: a second frontend connected while the VM's is open: a migration's destination", self.name)
        self._serve(self.incoming, sock)

    def _serve(self, device: VmDevice, sock: socket.socket) -> None:
        if device.serve(sock):
            self.counters.accepted += 1
        elif device is self.incoming:
            self._drop_incoming("its connection could not be served")

    def _device_starts(self, device: VmDevice, connection: VhostUserConnection, migrated: bool) -> bool:
        if device is not self.incoming:
            return True
        if not migrated:
            connection.refuse("a second frontend started the VM's device without migrating into it "
                              "(the VM is running on its first frontend)")
            return False
        self._arrived()
        return True

    def _arrived(self) -> None:
        """The incoming device started from the source's state: it is the VM's device from now on."""
        source, incoming = self.device, self.incoming
        assert incoming is not None
        incoming.rdma.took_over(source.rdma)
        incoming.transport.carry_counters(source.transport)
        self.device, self.incoming = incoming, None
        # The VM's region path names the new region: QEMU's generic device and a restarted backend open it by name.
        os.replace(incoming.doorbell.path, self.doorbell_path)
        incoming.doorbell.path = self.doorbell_path
        source.close("the VM migrated to another frontend of this backend", CloseCause.MIGRATED)
        self.counters.migrations_in += 1
        log.info("%s: migrated between two frontends of this backend; the destination's device runs", self.name)

    def _drop_incoming(self, reason: str) -> None:
        incoming, self.incoming = self.incoming, None
        if incoming is not None:
            log.info("%s: the incoming device is dropped (%s); the VM's device is untouched", self.name, reason)
            incoming.close(reason, unlink=True)

    def _closed(self, device: VmDevice, cause: CloseCause, reason: str) -> None:
        if cause is CloseCause.MIGRATED:
            return  # the source of a migration that succeeded: no error of anybody's
        self.counters.closed += 1
        self.counters.last_close_reason = reason
        if cause is CloseCause.PROTOCOL_ERROR:
            self.counters.protocol_errors += 1
        elif cause is CloseCause.MEMORY_FAULT:
            self.counters.memory_faults += 1
        elif cause is CloseCause.REFUSED:
            self.counters.refused += 1
        if device is self.incoming:
            # Its QEMU went (a migration failed or cancelled, or a second QEMU refused). This is the connection's
            # last act: it has let go of everything of its own.
            self._drop_incoming(f"its connection closed: {reason}")

    def describe(self) -> dict[str, object]:
        """What `vrdma admin vm list` shows of this VM."""
        state = "connected" if self.device.connected else "waiting"
        if self.incoming is not None:
            state += ", migrating in"
        return {"name": self.name, "socket-path": str(self.spec.socket_path) if self.spec.socket_path else None,
                "fd": self.spec.fd, "mac": ":".join(f"{b:02x}" for b in self.spec.mac),
                "doorbell": str(self.doorbell_path), "qos": self.rdma.qos.as_table(), "state": state}

    def counters_snapshot(self) -> dict[str, object]:
        c = self.counters
        conn = self.connection
        transport = self.transport
        return {**self.rdma.counters_snapshot(),
                "doorbell_region": {"path": str(self.doorbell_path), "reused": self.device.doorbell.reused},
                "connection": {"state": "connected" if self.device.connected else "waiting", "accepted": c.accepted,
                               "refused": c.refused, "closed": c.closed, "protocol_errors": c.protocol_errors,
                               "memory_faults": c.memory_faults, "last_close_reason": c.last_close_reason,
                               "migrations_in": c.migrations_in, "incoming": self.incoming is not None,
                               # What the current (or last) connection negotiated and did.
                               "features": conn.negotiated_features if conn is not None else None,
                               "protocol_features": conn.negotiated_protocol_features if conn is not None else None,
                               "config_reads": conn.config_reads if conn is not None else 0,
                               "shared_memory_maps": conn.shared_memory_maps if conn is not None else 0,
                               "queues_started": sorted(QUEUE_NAMES.get(i, str(i)) for i in transport.started),
                               "device_resets": transport.device_resets, "stops": transport.stops,
                               "suspended": transport.suspended,
                               "states_refused_at_start": transport.states_refused_at_start},
                "migration": dict(transport.state_times),
                "command_time_us": transport.command_time(),
                "commands_at_once_max": transport.commands_at_once_max}

    def close(self, reason: str) -> None:
        self._drop_incoming(reason)
        if self.listener is not None:
            self.loop.remove_reader(self.listener.fileno())
            self.listener.close()
            if self.spec.socket_path is not None:
                self.spec.socket_path.unlink(missing_ok=True)
        self.device.close(reason)


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
