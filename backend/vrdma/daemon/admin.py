"""The backend's admin socket: the VMs it serves (listed, added, removed at run time), their counters, and the
commands a caller adds (test hooks).

One JSON object per line in each direction over a unix stream socket; each connection asks one question:

    {"command": "counters"}                        -> {"ok": true, "vms": {"vm0": {...}, ...}, "containers": {...},
                                                       "network": {...},
                                                       "engine_threads": [{"busy_ns": ..., "work": ...}, ...]}
    {"command": "vm-list"}                         -> {"ok": true, "vms": [{"name": "vm0", "socket-path": ...}, ...]}
    {"command": "vm-add", "name": "vm2", "socket-path": "/run/vrdma/vm2.sock", "mac": "52:54:00:..",
     "doorbell": "/dev/shm/vm2.doorbell"}          -> {"ok": true, "vm": {"name": "vm2", ...}}
    {"command": "vm-remove", "name": "vm2"}        -> {"ok": true}
    {"command": "vm-qos", "name": "vm0", "weight": 300, "bytes-per-s": "1G"}
                                                   -> {"ok": true, "qos": {"weight": 300, ..., "throttled_ns": ...}}
    {"command": "container-add", "name": "c0", "socket-path": "/run/vrdma/c0.sock", "address": "10.0.0.5",
     "max-processes": 8, "qos": {...}}             -> {"ok": true, "container": {"name": "c0", ...}}
    {"command": "container-list"}                  -> {"ok": true, "containers": [{"name": "c0", "processes": ...}]}
    {"command": "container-remove", "name": "c0"}  -> {"ok": true}
    {"command": "upgrade"}                         -> {"ok": true, "pid": 4242}   (the new backend, starting)
    {"command": "status"}                          -> {"ok": true, "pid": 4242, "serving": ["vm0"],
                                                       "upgrade": {"state": "took over", "pause_ms": ...} or null}

("network": what arrived from other hosts that no QP took, and what went out; null without --roce. In vm-add,
"mac", "doorbell" and "qos" (a table of the keys vm-qos takes) may be left out; paths are absolute. vm-qos changes
the settings it names, keeps the others, and answers them all with the VM's QoS counters; with none it only
answers.) A refused request is {"ok": false, "error": "..."} with
the reason, and changes nothing.

Whoever starts the daemon may add commands (``extensions``): `vrdma backend --test-hooks` adds "inject" from
vrdma.testing.faults, so the daemon itself carries no test code. `vrdma admin` is the command-line client.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol

from vrdma.daemon.config import DEFAULT_MAX_PROCESSES, ContainerSpec, EndpointSpec, container_spec, vm_spec
from vrdma.device.device import RdmaDevice
from vrdma.device.qos import KEYS as QOS_KEYS
from vrdma.errors import VrdmaError
from vrdma.loop import EventLoop

log = logging.getLogger(__name__)

MAX_REQUEST = 4096
MAX_REPLY = 16 << 20  # counters of many VMs, each listing its doorbell pages (up to 1022)


class Served(Protocol):
    """What the admin socket reads and arms of one VM the backend serves."""

    @property
    def rdma(self) -> RdmaDevice: ...
    def counters_snapshot(self) -> dict[str, object]: ...
    def describe(self) -> dict[str, object]: ...


class Described(Protocol):
    def describe(self) -> dict[str, object]: ...
    def counters_snapshot(self) -> dict[str, object]: ...


class VmRegistry(Protocol):
    """The backend, as the admin socket sees it: the VMs it serves, and adding or removing one."""

    @property
    def doorbell_dir(self) -> Path | None: ...
    def served(self) -> Mapping[str, Served]: ...
    def add_vm(self, spec: EndpointSpec) -> Served: ...
    def remove_vm(self, name: str) -> None: ...
    @property
    def containers(self) -> Mapping[str, Described]: ...
    def add_container(self, spec: ContainerSpec) -> Described: ...
    def remove_container(self, name: str) -> None: ...
    def begin_upgrade(self) -> dict[str, Any]: ...
    def status(self) -> dict[str, Any]: ...


# An added admin command: (the request, the VMs served by name) -> the reply.
AdminCommand = Callable[[dict[str, Any], Mapping[str, Served]], dict[str, Any]]

TIMEOUT = 2.0


class AdminSocket:
    def __init__(self, path: Path, loop: EventLoop, backend: VmRegistry,
                 extensions: dict[str, AdminCommand] | None = None,
                 network: Callable[[], dict[str, int]] | None = None,
                 engine_threads: Callable[[], list[dict[str, int]]] | None = None,
                 handed_over: socket.socket | None = None) -> None:
        """``handed_over``: the socket, listening already (a backend upgrade: vrdma.daemon.upgrade)."""
        self.path = path
        self.network = network
        self.engine_threads = engine_threads
        self.loop = loop
        self.backend = backend
        self.extensions = dict(extensions or {})
        if handed_over is not None:
            self.sock = handed_over
        else:
            path.unlink(missing_ok=True)
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.bind(str(path))
            self.sock.listen(4)
        loop.add_reader(self.sock.fileno(), self._accept)
        log.info("admin socket on %s%s", path,
                 f" (also {', '.join(sorted(self.extensions))})" if self.extensions else "")

    def _accept(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(TIMEOUT)  # a silent client cannot hold the loop longer than this
            try:
                request = _read_line(conn)
                reply = self.handle(json.loads(request))
            except (OSError, ValueError) as err:
                reply = {"ok": False, "error": f"bad request: {err}"}
            with contextlib.suppress(OSError):  # the client went away: nothing to tell it
                conn.sendall(json.dumps(reply).encode() + b"\n", socket.MSG_NOSIGNAL)

    def handle(self, request: Any) -> dict[str, Any]:
        if not isinstance(request, dict):
            return {"ok": False, "error": "a request is a JSON object"}
        command = request.get("command")
        own = self.COMMANDS.get(command) if isinstance(command, str) else None
        try:
            if own is not None:
                return own(self, request)
            extension = self.extensions.get(command) if isinstance(command, str) else None
            if extension is not None:
                return extension(request, self.backend.served())
        except VrdmaError as err:
            return {"ok": False, "error": str(err)}
        if command == "inject":
            return {"ok": False, "error": "fault injection needs `vrdma backend --test-hooks`"}
        known = ", ".join(sorted([*self.COMMANDS, *self.extensions]))
        return {"ok": False, "error": f"unknown command {command!r} (known: {known})"}

    def _counters(self, request: dict[str, Any]) -> dict[str, Any]:
        _fields(request, set())
        return {"ok": True, "vms": {name: vm.counters_snapshot() for name, vm in self.backend.served().items()},
                "containers": {name: c.counters_snapshot() for name, c in self.backend.containers.items()},
                "network": self.network() if self.network is not None else None,
                "engine_threads": self.engine_threads() if self.engine_threads is not None else []}

    def _vm_list(self, request: dict[str, Any]) -> dict[str, Any]:
        _fields(request, set())
        return {"ok": True, "vms": [vm.describe() for _, vm in sorted(self.backend.served().items())]}

    def _vm_add(self, request: dict[str, Any]) -> dict[str, Any]:
        _fields(request, {"name", "socket-path", "mac", "doorbell", "qos"}, required={"name", "socket-path"})
        spec = vm_spec(request["name"], request["socket-path"], mac=request.get("mac"),
                       doorbell=request.get("doorbell"), doorbell_dir=self.backend.doorbell_dir,
                       qos=request.get("qos"), what="vm-add")
        return {"ok": True, "vm": self.backend.add_vm(spec).describe()}

    def _vm_remove(self, request: dict[str, Any]) -> dict[str, Any]:
        _fields(request, {"name"}, required={"name"})
        if not isinstance(request["name"], str):
            return {"ok": False, "error": f"vm-remove: name must be a string, not {request['name']!r}"}
        self.backend.remove_vm(request["name"])
        return {"ok": True}

    def _vm_qos(self, request: dict[str, Any]) -> dict[str, Any]:
        _fields(request, {"name", *QOS_KEYS}, required={"name"})
        name = request["name"]
        vm = self.backend.served().get(name) if isinstance(name, str) else None
        if vm is None:
            return {"ok": False, "error": f"vm-qos: no VM named {name!r} is served"}
        settings = {key: value for key, value in request.items() if key in QOS_KEYS}
        if settings:
            vm.rdma.set_qos(vm.rdma.qos.changed(settings, f"vm-qos {name}"))
            log.info("%s: QoS now %s", name, vm.rdma.qos.as_table())
        return {"ok": True, "qos": {**vm.rdma.qos.as_table(), **vm.rdma.qos_counters()}}

    def _container_add(self, request: dict[str, Any]) -> dict[str, Any]:
        _fields(request, {"name", "socket-path", "address", "qos", "max-processes"},
                required={"name", "socket-path", "address"})
        spec = container_spec(request["name"], request["socket-path"], request["address"], qos=request.get("qos"),
                              max_processes=request.get("max-processes", DEFAULT_MAX_PROCESSES),
                              what="container-add")
        return {"ok": True, "container": self.backend.add_container(spec).describe()}

    def _container_remove(self, request: dict[str, Any]) -> dict[str, Any]:
        _fields(request, {"name"}, required={"name"})
        if not isinstance(request["name"], str):
            return {"ok": False, "error": f"container-remove: name must be a string, not {request['name']!r}"}
        self.backend.remove_container(request["name"])
        return {"ok": True}

    def _container_list(self, request: dict[str, Any]) -> dict[str, Any]:
        _fields(request, set())
        return {"ok": True, "containers": [c.describe() for _, c in sorted(self.backend.containers.items())]}

    def _upgrade(self, request: dict[str, Any]) -> dict[str, Any]:
        _fields(request, set())
        return {"ok": True, **self.backend.begin_upgrade()}

    def _status(self, request: dict[str, Any]) -> dict[str, Any]:
        _fields(request, set())
        return {"ok": True, **self.backend.status()}

    COMMANDS: ClassVar[dict[str, Callable[[AdminSocket, dict[str, Any]], dict[str, Any]]]] = {
        "counters": _counters, "vm-add": _vm_add, "vm-list": _vm_list, "vm-qos": _vm_qos, "vm-remove": _vm_remove,
        "container-add": _container_add, "container-list": _container_list, "container-remove": _container_remove,
        "upgrade": _upgrade, "status": _status}

    def close(self) -> None:
        self.loop.remove_reader(self.sock.fileno())
        self.sock.close()
        self.path.unlink(missing_ok=True)


class RequestError(VrdmaError):
    """A request with fields the command does not take, or without those it needs."""


def _fields(request: dict[str, Any], allowed: set[str], required: frozenset[str] | set[str] = frozenset()) -> None:
    command = request["command"]
    extra = sorted(set(request) - allowed - {"command"})
    if extra:
        raise RequestError(f"{command}: unknown field(s) {', '.join(extra)}"
                           + (f" (it takes {', '.join(sorted(allowed))})" if allowed else " (it takes none)"))
    missing = sorted(required - set(request))
    if missing:
        raise RequestError(f"{command}: missing field(s) {', '.join(missing)}")


def _read_line(conn: socket.socket, limit: int = MAX_REQUEST, what: str = "request") -> bytes:
    data = b""
    while b"\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
        if len(data) > limit:
            raise ValueError(f"{what} longer than {limit} bytes")
    return data.split(b"\n", 1)[0]


UPGRADE_TIMEOUT = 180.0  # seconds `vrdma admin upgrade` waits for the new backend to answer


def upgrade(path: Path, timeout: float = UPGRADE_TIMEOUT) -> dict[str, Any]:
    """Client side: upgrade the backend at ``path`` (vrdma.daemon.upgrade) and return the new one's status once it
    answers there: its pid, and how long the VMs were paused ("upgrade": "pause_ms"). VrdmaError when the backend
    refuses, or the new one fails (the old one then serves on, and the error says why)."""
    reply = ask(path, {"command": "upgrade"})
    if not reply.get("ok"):
        raise VrdmaError(f"the backend refused: {reply.get('error')}")
    new, deadline, interval = reply["pid"], time.monotonic() + timeout, 0.01
    while True:
        try:
            status = ask(path, {"command": "status"})
        except OSError as err:  # (the socket is the new process's from one moment to the next: never unanswered)
            raise VrdmaError(f"upgrade: the admin socket {path} stopped answering: {err}") from err
        if status.get("pid") == new:
            return status
        outcome = status.get("upgrade") or {}
        if outcome.get("pid") == new and outcome.get("state") == "failed":
            raise VrdmaError(f"upgrade failed: {outcome.get('error')} (the backend with pid {status.get('pid')} "
                             "serves on)")
        if time.monotonic() > deadline:
            raise VrdmaError(f"upgrade: the new backend (pid {new}) did not take over in {timeout:g} s")
        time.sleep(interval)  # the status is asked for; nothing announces it
        interval = min(interval * 2, 0.5)


def ask(path: Path, request: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    """Client side: send one request to a backend's admin socket and return the reply."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        sock.sendall(json.dumps(request).encode() + b"\n")
        reply: dict[str, Any] = json.loads(_read_line(sock, MAX_REPLY, "reply"))
    return reply
