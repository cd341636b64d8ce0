"""The backend's admin socket: counters a person can read, and the commands a caller adds (test hooks).

One JSON object per line in each direction over a unix stream socket; each connection asks one question:

    {"command": "counters"}                        -> {"ok": true, "vms": {"vm0": {...}, ...}, "network": {...}}

("network": what arrived from other hosts that no QP took, and what went out; null without --roce.)

The daemon answers "counters" only. Whoever starts it may add commands (``extensions``): `vrdma backend
--test-hooks` adds "inject" from vrdma.testing.faults, so the daemon itself carries no test code.
`vrdma admin --socket PATH counters` is the command-line client.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from vrdma.device.device import RdmaDevice
from vrdma.loop import EventLoop

log = logging.getLogger(__name__)

MAX_REQUEST = 4096
MAX_REPLY = 16 << 20  # counters of many VMs, each listing its doorbell pages (up to 1022)


class Served(Protocol):
    """What the admin socket reads and arms of one VM the backend serves."""

    @property
    def rdma(self) -> RdmaDevice: ...
    def counters_snapshot(self) -> dict[str, object]: ...


# An added admin command: (the request, the VMs served by name) -> the reply.
AdminCommand = Callable[[dict[str, Any], dict[str, Served]], dict[str, Any]]

TIMEOUT = 2.0


class AdminSocket:
    def __init__(self, path: Path, loop: EventLoop, devices: Callable[[], dict[str, Served]],
                 extensions: dict[str, AdminCommand] | None = None,
                 network: Callable[[], dict[str, int]] | None = None) -> None:
        self.path = path
        self.network = network
        self.loop = loop
        self.devices = devices
        self.extensions = dict(extensions or {})
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
        devices = self.devices()
        if command == "counters":
            return {"ok": True, "vms": {name: dev.counters_snapshot() for name, dev in devices.items()},
                    "network": self.network() if self.network is not None else None}
        extension = self.extensions.get(command) if isinstance(command, str) else None
        if extension is not None:
            return extension(request, devices)
        if command == "inject":
            return {"ok": False, "error": "fault injection needs `vrdma backend --test-hooks`"}
        known = ", ".join(["counters", *sorted(self.extensions)])
        return {"ok": False, "error": f"unknown command {command!r} (known: {known})"}

    def close(self) -> None:
        self.loop.remove_reader(self.sock.fileno())
        self.sock.close()
        self.path.unlink(missing_ok=True)


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


def ask(path: Path, request: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    """Client side: send one request to a backend's admin socket and return the reply."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        sock.sendall(json.dumps(request).encode() + b"\n")
        reply: dict[str, Any] = json.loads(_read_line(sock, MAX_REPLY, "reply"))
    return reply
