"""Running commands in a guest through qemu-guest-agent (QGA) on a virtio-serial port.

QEMU serves the agent's chardev as a unix socket that takes one client at a time, and the guest agent answers
one request at a time. Every exchange here is therefore a short transaction under an exclusive file lock:
connect, resynchronise with ``guest-sync-delimited``, one request, disconnect. Commands themselves run
concurrently in the guest (``guest-exec`` returns at once with a PID); only the polls for their status take
turns, so several ``vrdma vm exec`` calls, from several processes, can run against one guest at once.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import logging
import random
import socket
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vrdma.harness.errors import AgentError, CommandTimeout

log = logging.getLogger(__name__)

# Reply timeout of one agent request; the agent answers within milliseconds when it is up.
REQUEST_TIMEOUT = 10.0
# How long to wait for a sync reply before sending the next one while the agent starts.
SYNC_ATTEMPT = 1.0
# Status polls back off from the first to the last interval: short commands return fast, long ones cost little.
POLL_FIRST, POLL_MAX = 0.005, 0.25


@dataclass(frozen=True)
class ExecResult:
    exit_status: int
    stdout: str
    stderr: str
    signal: int | None = None

    def check(self, what: str = "command") -> ExecResult:
        if self.exit_status != 0:
            raise AgentError(f"{what} failed with exit status {self.exit_status}\n"
                             f"stdout:\n{self.stdout}\nstderr:\n{self.stderr}")
        return self


class GuestAgent:
    """Client of one guest's qemu-guest-agent socket."""

    def __init__(self, guest: str, socket_path: Path, lock_path: Path, console_log: Path | None = None) -> None:
        self.guest = guest
        self.socket_path = socket_path
        self.lock_path = lock_path
        self.console_log = console_log

    # -- protocol -------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _session(self, timeout: float = REQUEST_TIMEOUT) -> Iterator[_Channel]:
        with open(self.lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(timeout)
                sock.connect(str(self.socket_path))
                channel = _Channel(sock, self.guest)
                channel.sync(timeout)
                yield channel
            except OSError as err:
                raise AgentError(f"guest agent of {self.guest} at {self.socket_path}: {err}") from err
            finally:
                sock.close()

    def request(self, command: str, arguments: Mapping[str, Any] | None = None) -> Any:
        with self._session() as channel:
            return channel.request(command, arguments)

    def wait_ready(self, deadline: float) -> None:
        """Handshake with the agent (guest-sync) until it answers or the monotonic ``deadline`` passes."""
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            try:
                with self._session(timeout=min(SYNC_ATTEMPT, max(deadline - time.monotonic(), 0.05))):
                    return
            except AgentError as err:  # not listening yet: the next attempt waits on the socket again
                last_error = err
        raise AgentError(f"guest agent of {self.guest} did not answer before the deadline: {last_error}")

    # -- commands -------------------------------------------------------------------------------------------

    def spawn(self, argv: Sequence[str], env: Sequence[str] = (), stdin: bytes | None = None) -> int:
        """Start ``argv`` in the guest with captured output; return its guest PID."""
        arguments: dict[str, Any] = {"path": argv[0], "arg": list(argv[1:]), "capture-output": True}
        if env:
            arguments["env"] = list(env)
        if stdin is not None:
            arguments["input-data"] = base64.b64encode(stdin).decode()
        reply = self.request("guest-exec", arguments)
        return int(reply["pid"])

    def poll(self, pid: int) -> ExecResult | None:
        status = self.request("guest-exec-status", {"pid": pid})
        if not status.get("exited"):
            return None
        return ExecResult(
            exit_status=int(status.get("exitcode", 128 + int(status.get("signal", 0)))),
            stdout=_decode(status.get("out-data")),
            stderr=_decode(status.get("err-data")),
            signal=status.get("signal"),
        )

    def wait(self, pid: int, argv: Sequence[str], timeout: float) -> ExecResult:
        deadline = time.monotonic() + timeout
        interval = POLL_FIRST
        while True:
            result = self.poll(pid)
            if result is not None:
                return result
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill(pid)
                raise CommandTimeout(self.guest, argv, timeout, self.console_log)
            time.sleep(min(interval, remaining))  # the agent offers no completion event: poll with backoff
            interval = min(interval * 2, POLL_MAX)

    def run(self, argv: Sequence[str], timeout: float = 300.0, env: Sequence[str] = (),
            stdin: bytes | None = None) -> ExecResult:
        """Run ``argv`` in the guest and return its exit status and output; CommandTimeout past ``timeout``."""
        if not argv:
            raise AgentError("no command given")
        log.debug("%s$ %s", self.guest, " ".join(argv))
        return self.wait(self.spawn(argv, env, stdin), argv, timeout)

    def kill(self, pid: int) -> None:
        """Kill a spawned command and all its descendants (best effort: they may have exited already)."""
        # Descendants first, found through /proc/PID/task/*/children, so none is re-parented and missed.
        script = ('kill_tree() { for c in $(cat /proc/$1/task/*/children 2>/dev/null); do kill_tree $c; done; '
                  'kill -KILL $1 2>/dev/null; }; kill_tree "$1"')
        try:
            kill_pid = self.spawn(["/bin/sh", "-c", script, "kill_tree", str(pid)])
            deadline = time.monotonic() + REQUEST_TIMEOUT
            while self.poll(kill_pid) is None and time.monotonic() < deadline:
                time.sleep(POLL_FIRST)
            self.poll(pid)  # reap its status in the agent
        except AgentError as err:
            log.warning("could not kill process %d in %s: %s", pid, self.guest, err)


class _Channel:
    """One connected agent socket: newline-delimited JSON with 0xFF resynchronisation."""

    def __init__(self, sock: socket.socket, guest: str) -> None:
        self.sock = sock
        self.guest = guest
        self.buffer = b""

    def sync(self, timeout: float) -> None:
        # A previous client may have left a reply unread inside the agent or QEMU: the agent prefixes the
        # guest-sync-delimited reply with 0xFF, so everything before it is stale and dropped.
        token = random.randrange(1, 2**31)
        self.sock.sendall(b"\xff" + json.dumps({"execute": "guest-sync-delimited",
                                                "arguments": {"id": token}}).encode() + b"\n")
        deadline = time.monotonic() + timeout
        while True:
            marker = self.buffer.find(b"\xff")
            if marker >= 0:
                self.buffer = self.buffer[marker + 1:]
                break
            self.buffer = b""
            self._fill(deadline)
        while True:
            reply = self._read_reply(deadline)
            if reply.get("return") == token:
                return

    def request(self, command: str, arguments: Mapping[str, Any] | None) -> Any:
        message: dict[str, Any] = {"execute": command}
        if arguments:
            message["arguments"] = dict(arguments)
        self.sock.sendall(json.dumps(message).encode() + b"\n")
        reply = self._read_reply(time.monotonic() + REQUEST_TIMEOUT)
        if "error" in reply:
            error = reply["error"]
            raise AgentError(f"guest agent of {self.guest}: {command} failed: "
                             f"{error.get('class', '?')}: {error.get('desc', error)}")
        return reply.get("return")

    def _read_reply(self, deadline: float) -> dict[str, Any]:
        while b"\n" not in self.buffer:
            self._fill(deadline)
        line, _, self.buffer = self.buffer.partition(b"\n")
        # A 0xFF (never in JSON) starts a guest-sync-delimited reply, ours or a stale one of an earlier sync (say, one
        # the agent answered while its VM migrated, after the client had given up on it).
        line = line.lstrip(b"\xff")
        try:
            reply = json.loads(line)
        except ValueError as err:
            raise AgentError(f"guest agent of {self.guest} sent malformed JSON: {line[:200]!r}") from err
        if not isinstance(reply, dict):
            raise AgentError(f"guest agent of {self.guest} sent a non-object reply: {line[:200]!r}")
        return reply

    def _fill(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AgentError(f"guest agent of {self.guest} did not reply in time")
        self.sock.settimeout(remaining)
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            raise AgentError(f"guest agent of {self.guest} did not reply in time") from None
        if not chunk:
            raise AgentError(f"guest agent of {self.guest} closed the connection")
        self.buffer += chunk


def _decode(data: str | None) -> str:
    return base64.b64decode(data).decode(errors="replace") if data else ""
