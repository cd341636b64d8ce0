"""A backend upgrade with live queue pairs: this process hands every VM to a new backend process, which goes on where
it stopped. Programs in the guests see a pause, never an error (docs/migration.md, "Backend upgrade").

`vrdma admin upgrade` (the admin socket's "upgrade"; the service's ExecReload) begins it:

1. The running backend (the old one) starts the new one: its own command line again, so the program as installed
   now, with ``--take-over FD``, one end of a socketpair. The new one loads its code, starts its engine and says
   ``ready``. Until then the old one serves as ever: the new one's start is no part of the pause.
2. The old one quiesces: every VM's device suspended in the engine (it lets go of it between two passes) and its
   state saved. Nothing else runs meanwhile: the whole hand-over is one turn of the loop, so no message, kick or
   command is taken. It sends a manifest (a memfd: a versioned header, JSON, the device states) and the descriptors
   the VMs live on (listening and connected vhost-user sockets, guest memory, eventfds, backend channels; the admin
   socket) with SCM_RIGHTS, in batches.
3. The new one checks the manifest like any input, rebuilds each VM (its doorbell region reopened by path, the same
   pages its guest has mapped; every VM's GIDs routed first; each connection's libvhost-user device rebuilt from
   the messages that built it: vrdma.vhost_user.handover), loads each state when the VM's queues start (the
   doorbell pages left as the guest rang them meanwhile), resumes them, and says ``running``.
4. The old one gives systemd the new main PID and exits touching nothing shared (no reset, no unlink: os._exit).

A new process that fails before ``running`` (at its start, refusing the manifest, or silent for HANDOVER_TIMEOUT)
leaves the old one to resume every VM as it was: the upgrade fails, the log says why, nothing is lost. Refused at
the start: a VM migrating (a second QEMU connected, a dirty log, a device-state transfer).

With --roce the new process opens RoCE sockets of its own as it starts (nothing is handed over: the guard and IPv6
sockets bind port 4791 beside the old one's, SO_REUSEADDR; its receive rings are a fanout group of their own, so
both processes see every packet). Until it takes over it holds no GID and drops what it sees; from the hand-over
on the old one reads nothing. A packet that arrives during the pause is retransmitted by its sender, whose QP's
transport state (PSNs, what is unacknowledged, the replay caches) moved in the device states.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import socket
import struct
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vrdma.daemon.config import EndpointSpec, check_vm_name, parse_mac, vm_spec
from vrdma.daemon.endpoint import BackendError, ConnectionCounters, VmEndpoint
from vrdma.device.qos import Qos, QosError
from vrdma.device.state import StateError
from vrdma.vhost_user import handover
from vrdma.vhost_user.handover import HandoverError

if TYPE_CHECKING:
    from vrdma.daemon.server import Backend

log = logging.getLogger(__name__)

VERSION = 1
MAGIC = b"VRDMAHO\0"
HEADER = struct.Struct("<8sII")  # magic, version, JSON bytes (the device states follow it)
HANDOVER_TIMEOUT = 30.0  # seconds the new process may take from the manifest to "running"
READY_TIMEOUT = 120.0    # seconds it may take to start (the old one serves meanwhile)
FDS_PER_MESSAGE = 250    # under SCM_MAX_FD (253)
MAX_FDS = 1 << 16
MAX_MANIFEST = 1 << 30
COUNTER_KEYS = set(asdict(ConnectionCounters()))
TRANSPORT_KEYS = ("fresh", "suspended", "device_resets", "stops", "states_refused_at_start")


class Upgrade:
    """One hand-over from this (old) backend to a new process, from its start until the old one exits or resumes."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        refused = _refusal(backend)
        if refused:
            raise BackendError(f"upgrade refused: {refused}")
        self.sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [sys.executable, *_own_arguments(sys.orig_argv[1:]), "--take-over", str(child.fileno())]
        env = {k: v for k, v in os.environ.items() if k != "WATCHDOG_PID"}  # (the watchdog is the new one's next)
        try:
            self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, pass_fds=[child.fileno()], env=env)
        except OSError as err:
            self.sock.close()
            raise BackendError(f"upgrade: cannot start {argv[0]}: {err}") from err
        finally:
            child.close()
        self.started = time.monotonic()
        self.result: dict[str, Any] = {"state": "starting", "pid": self.process.pid}
        backend.loop.add_reader(self.sock.fileno(), self._readable)
        log.info("upgrade: the new backend is starting (pid %d): %s", self.process.pid, " ".join(argv))

    def _readable(self) -> None:
        self.backend.loop.remove_reader(self.sock.fileno())
        try:
            said = self.sock.recv(64)
        except OSError as err:
            said = f"({err})".encode()
        if said != b"ready":
            self._failed(f"the new backend (pid {self.process.pid}) ended before taking over "
                         f"({said.decode(errors='replace') or 'it closed its end'}); its log says why")
            return
        self._hand_over()

    def _hand_over(self) -> None:
        backend = self.backend
        if backend.metrics is not None:  # (its port is the new one's next; its HTTP thread takes up to 0.5 s to stop,
            backend.metrics.close()      # which is no part of the VMs' pause)
            backend.metrics = None
        gc.disable()  # no collection of the whole heap in the VMs' pause (this process exits, or enables it again)
        quiesced = time.monotonic()
        fds: list[int] = []
        suspended: list[VmEndpoint] = []
        try:
            manifest, states = _collect(backend, fds, suspended)
            collected = time.monotonic()
            memfd = _manifest_file(manifest, states)
            try:
                socket.send_fds(self.sock, [b"manifest"], [memfd])
                for at in range(0, len(fds), FDS_PER_MESSAGE):
                    socket.send_fds(self.sock, [b"fds"], fds[at:at + FDS_PER_MESSAGE])
                log.info("upgrade: %d VM(s) saved in %.1f ms, sent with %d descriptors in %.1f ms", len(states),
                         (collected - quiesced) * 1e3, len(fds), (time.monotonic() - collected) * 1e3)
                self.sock.settimeout(HANDOVER_TIMEOUT)
                said = self.sock.recv(1 << 16)
            finally:
                os.close(memfd)
        except (OSError, HandoverError, StateError) as err:
            said = f"failed {err}".encode()
        finally:
            for fd in fds:
                os.close(fd)
        if not said.startswith(b"running "):
            self.process.kill()
            self._resume(suspended)
            gc.enable()
            self._failed(said.decode(errors="replace").removeprefix("failed ") or "the new backend said nothing")
            return
        took = json.loads(said[len(b"running "):])
        log.info("upgrade: the new backend (pid %d) runs every VM: the VMs were paused %.1f ms; this one exits",
                 self.process.pid, (took.get("resumed", quiesced) - quiesced) * 1e3)
        backend.notifier.send(MAINPID=str(self.process.pid))
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(0)  # touching nothing shared: the new process has every VM (no reset, no unlink, no cleanup)

    def _resume(self, suspended: list[VmEndpoint]) -> None:
        for endpoint in suspended:
            endpoint.rdma.suspend(False)
            endpoint.rdma.fabric.kick(endpoint.rdma.engine_index)
        self.backend.restart_metrics()

    def _failed(self, reason: str) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5)
        self.sock.close()
        self.result = {"state": "failed", "pid": self.process.pid, "error": reason}
        self.backend.upgrade = None
        self.backend.last_upgrade = self.result
        log.error("upgrade failed: %s; this backend serves every VM as before", reason)


def _own_arguments(argv: list[str]) -> list[str]:
    """This process's command line for the next one: --ready-fd (its starter's pipe, answered already) left out."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--ready-fd":
            skip = True
        elif not arg.startswith("--ready-fd="):
            out.append(arg)
    return out


def _refusal(backend: Backend) -> str:
    if backend.upgrade is not None:
        return f"an upgrade is under way already (new backend pid {backend.upgrade.process.pid})"
    for name, endpoint in backend.endpoints.items():
        conn = endpoint.connection
        if endpoint.incoming is not None or (conn is not None and (conn.dirty_log is not None
                                                                   or conn.device_state.active)):
            return f"{name} is migrating"
    return ""


def _collect(backend: Backend, fds: list[int], suspended: list[VmEndpoint]) -> tuple[dict[str, Any], list[bytes]]:
    """Every VM as data (states in ``states``, descriptors duplicated onto ``fds``); the devices with a state are
    suspended (listed in ``suspended``, unless QEMU had stopped them already)."""
    states: list[bytes] = []
    vms = []
    for endpoint in backend.endpoints.values():
        spec, transport, conn = endpoint.spec, endpoint.transport, endpoint.connection
        connected = conn is not None and endpoint.device.connected
        state = None
        if connected and not transport.fresh:
            if not transport.suspended:
                endpoint.rdma.suspend()
                suspended.append(endpoint)
            states.append(endpoint.rdma.save_state())
            state = len(states) - 1
        vms.append({
            "name": spec.name, "socket_path": str(spec.socket_path) if spec.socket_path else None, "fd": spec.fd,
            "mac": spec.mac.hex(":"), "doorbell_path": str(endpoint.doorbell_path), "qos": endpoint.rdma.qos.as_table(),
            "listener": _add(fds, endpoint.listener.fileno()) if endpoint.listener is not None else None,
            "doorbell": _add(fds, endpoint.device.doorbell.fd),
            "counters": asdict(endpoint.counters),
            "transport": {key: getattr(transport, key) for key in TRANSPORT_KEYS},
            "state": state,
            "connection": handover.snapshot(conn, fds) if connected and conn is not None else None})
    admin = backend.admin
    manifest = {"version": VERSION, "old_pid": os.getpid(), "quiesced": time.monotonic(), "fds": 0, "vms": vms,
                "admin": _add(fds, admin.sock.fileno()) if admin is not None else None}
    manifest["fds"] = len(fds)
    return manifest, states


def _add(fds: list[int], fd: int) -> int:
    fds.append(os.dup(fd))
    return len(fds) - 1


def _manifest_file(manifest: dict[str, Any], states: list[bytes]) -> int:
    manifest["states"] = [len(state) for state in states]
    raw = json.dumps(manifest).encode()
    fd = os.memfd_create("vrdma-upgrade", os.MFD_CLOEXEC)
    with os.fdopen(os.dup(fd), "wb") as out:
        out.write(HEADER.pack(MAGIC, VERSION, len(raw)) + raw + b"".join(states))
    return fd


# -- the new process ------------------------------------------------------------------------------------------------

def take_over(backend: Backend, fd: int) -> None:
    """Take every VM of the backend at the other end of ``fd`` (--take-over) into ``backend`` (made with no VM and no
    admin socket). On success the old one exits; on any failure this process tells it why and exits at once without
    touching what it was given (the old one still serves it all): it never returns then."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError as err:
        raise BackendError(f"--take-over {fd}: not a socket: {err}") from err
    sock.settimeout(READY_TIMEOUT)
    # What the start made stays: kept out of every later collection (gc.freeze), and no collection at all until the
    # VMs run again, since one of the whole heap can cost the pause milliseconds.
    if backend.metrics_address is not None:
        import vrdma.daemon.metrics  # noqa: F401  (its server starts after the VMs run again: imported now, not then)
    gc.freeze()
    gc.disable()
    sock.send(b"ready")
    try:
        manifest, states, fds = _receive(sock)
        received = time.monotonic()
        _adopt(backend, manifest, states, fds)
    except (OSError, ValueError, HandoverError, StateError, BackendError) as err:
        log.error("take-over failed: %s; the backend that was running goes on", err)
        try:
            sock.send(f"failed {err}".encode()[:60000])
        finally:
            for handler in logging.getLogger().handlers:
                handler.flush()
            os._exit(1)
    resumed = time.monotonic()
    gc.enable()
    pause_ms = round((resumed - manifest["quiesced"]) * 1e3, 2) if isinstance(manifest["quiesced"], float) else None
    backend.last_upgrade = {"state": "took over", "pid": os.getpid(), "from_pid": manifest["old_pid"],
                            "vms": len(manifest["vms"]), "pause_ms": pause_ms}
    sock.send(b"running " + json.dumps({"pid": os.getpid(), "resumed": resumed}).encode())
    sock.close()
    log.info("took over %d VM(s) from the backend with pid %s: they ran again %s ms after it stopped them (the "
             "last %.1f ms here, rebuilding and loading them)", len(manifest["vms"]), manifest["old_pid"], pause_ms,
             (resumed - received) * 1e3)


def _receive(sock: socket.socket) -> tuple[dict[str, Any], list[bytes], list[int]]:
    what, memfds, _, _ = socket.recv_fds(sock, 64, 1)
    if what != b"manifest" or len(memfds) != 1:
        raise HandoverError("the old backend sent no manifest")
    with os.fdopen(memfds[0], "rb") as source:
        size = os.fstat(source.fileno()).st_size
        if size > MAX_MANIFEST:
            raise HandoverError(f"a manifest of {size} bytes")
        source.seek(0)  # (the file's offset is shared with the writer's: it stands at the end)
        data = source.read()
    if len(data) < HEADER.size:
        raise HandoverError("the manifest has no header")
    magic, version, length = HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise HandoverError(f"a hand-over of version {version} (magic {magic!r}); this backend reads {VERSION}")
    manifest = json.loads(data[HEADER.size:HEADER.size + length])
    if not isinstance(manifest, dict) or set(manifest) != {"version", "old_pid", "quiesced", "fds", "vms", "admin",
                                                           "states"}:
        raise HandoverError("the manifest's fields are not a hand-over's")
    sizes, count = manifest["states"], manifest["fds"]
    if not isinstance(sizes, list) or not all(isinstance(n, int) and n >= 0 for n in sizes) or \
            not isinstance(count, int) or not 0 <= count <= MAX_FDS or not isinstance(manifest["vms"], list):
        raise HandoverError("the manifest's states, descriptors or VMs are out of range")
    states, at = [], HEADER.size + length
    for n in sizes:
        states.append(data[at:at + n])
        at += n
    if at != len(data):
        raise HandoverError(f"the manifest holds {len(data)} bytes, its parts {at}")
    fds: list[int] = []
    while len(fds) < count:
        what, more, _, _ = socket.recv_fds(sock, 64, FDS_PER_MESSAGE)
        fds += more
        if what != b"fds" or not more:
            raise HandoverError(f"descriptors: {len(fds)} of {count} came")
    if len(fds) != count:
        raise HandoverError(f"{len(fds)} descriptors came for {count}")
    return manifest, states, fds


def _adopt(backend: Backend, manifest: dict[str, Any], states: list[bytes], fds: list[int]) -> None:
    taken: set[int] = set()

    def named(index: Any) -> int:
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(fds) or index in taken:
            raise HandoverError(f"descriptor {index!r}: none, or named twice")
        taken.add(index)
        return fds[index]

    def listening(index: Any) -> socket.socket | None:
        if index is None:
            return None
        sock = socket.socket(fileno=named(index))
        if sock.type != socket.SOCK_STREAM or sock.family != socket.AF_UNIX:
            raise HandoverError(f"descriptor {index} is not a unix stream socket")
        return sock

    adopted: list[tuple[VmEndpoint, dict[str, Any], bytes | None]] = []
    for vm in manifest["vms"]:
        if not isinstance(vm, dict) or set(vm) != {"name", "socket_path", "fd", "mac", "doorbell_path", "qos",
                                                    "listener", "doorbell", "counters", "transport", "state",
                                                    "connection"}:
            raise HandoverError("a VM of the manifest lacks fields, or has others")
        spec = _spec(vm)
        endpoint = VmEndpoint(spec, backend.loop, backend.fabric, backend.guard,
                              handed_over=listening(vm["listener"]), doorbell_fd=named(vm["doorbell"]))
        backend.endpoints[spec.name] = endpoint
        if not isinstance(vm["counters"], dict) or set(vm["counters"]) != COUNTER_KEYS:
            raise HandoverError(f"{spec.name}: its counters are not a VM's")
        endpoint.counters = ConnectionCounters(**vm["counters"])
        transport = vm["transport"]
        if not isinstance(transport, dict) or set(transport) != set(TRANSPORT_KEYS):
            raise HandoverError(f"{spec.name}: its transport's fields are not a transport's")
        for key in TRANSPORT_KEYS:
            setattr(endpoint.transport, key, transport[key])
        state = vm["state"]
        if state is not None and (not isinstance(state, int) or not 0 <= state < len(states)):
            raise HandoverError(f"{spec.name}: state {state!r} is none of the manifest's")
        adopted.append((endpoint, vm, states[state] if state is not None else None))
    for endpoint, _, data in adopted:  # every VM's GIDs first: a QP finds its peer by GID as its state loads
        if data is not None:
            endpoint.rdma.announce_gids(data)
    for endpoint, vm, data in adopted:
        if vm["connection"] is None:
            continue
        sock = socket.socket(fileno=handover.socket_fd(vm["connection"], fds, taken))
        endpoint.transport.incoming_state, endpoint.transport.incoming_live_doorbells = data, True
        endpoint.transport.held = True
        if not endpoint.device.serve(sock):
            raise HandoverError(f"{endpoint.name}: its connection cannot be served")
        assert endpoint.connection is not None
        refused = endpoint.transport.states_refused_at_start
        handover.replay(endpoint.connection, vm["connection"], fds, taken)
        if endpoint.transport.states_refused_at_start != refused or (
                endpoint.transport.incoming_state is not None and endpoint.transport.started):
            raise HandoverError(f"{endpoint.name}: its state did not load (the log says why)")
    admin = listening(manifest["admin"])
    if admin is not None:
        backend.open_admin(admin)
    unnamed = set(range(len(fds))) - taken
    if unnamed:
        raise HandoverError(f"descriptor(s) {sorted(unnamed)} named by nothing")
    for endpoint, _, _ in adopted:  # every VM taken: they run again (nothing after this may fail)
        endpoint.transport.release()


def _spec(vm: dict[str, Any]) -> EndpointSpec:
    """A VM's declaration, checked as the admin socket's vm-add checks one (a VM served on an inherited connection
    has no socket path: its connection comes in the hand-over)."""
    if vm["socket_path"] is not None:
        return vm_spec(vm["name"], vm["socket_path"], mac=vm["mac"], doorbell=vm["doorbell_path"], qos=vm["qos"],
                       what="handed-over VM")
    name = check_vm_name(vm["name"], "handed-over VM")
    doorbell = vm["doorbell_path"]
    if not isinstance(vm["fd"], int) or not isinstance(doorbell, str) or not doorbell.startswith("/") or \
            "\0" in doorbell or not isinstance(vm["qos"], dict):
        raise HandoverError(f"{name}: neither a socket path nor an fd, or its doorbell path or QoS is not one")
    try:
        qos = Qos().changed(vm["qos"], f"handed-over VM {name}: qos")
    except QosError as err:
        raise HandoverError(str(err)) from None
    return EndpointSpec(name=name, fd=vm["fd"], mac=parse_mac(vm["mac"], f"handed-over VM {name}: mac"),
                        doorbell_path=Path(doorbell), qos=qos)
