"""The backend process the campaign attacks, and a simulated frontend whose control queue reuses its buffers."""

from __future__ import annotations

import contextlib
import os
import select
import socket
import struct
import time
from pathlib import Path
from typing import Any

from fuzz import sanitize
from fuzz.campaign.common import COMMAND_SLOTS, DEFAULT_ENGINE_THREADS, REQUEST_ROOM, RESPONSE_ROOM, CampaignFailure
from vrdma.device import abi
from vrdma.harness.daemon import DaemonProcess, DaemonStartError, DaemonStopError, Served
from vrdma.testing.frontend import VRING_DESC_F_NEXT, VRING_DESC_F_WRITE, Frontend, FrontendError

# -- the backend process --------------------------------------------------------------------------------------------

class Backend:
    """`vrdma backend` serving vm0 (attacker) and vm1 (victim), as tests/backend_process.py starts it, optionally
    with the sanitizer build (fuzz.sanitize), with ``engine_threads`` engine threads (`--engine-threads`;
    common.DEFAULT_ENGINE_THREADS says why two)."""

    def __init__(self, directory: Path, sanitized: bool = False,
                 engine_threads: int = DEFAULT_ENGINE_THREADS) -> None:
        self.directory = directory
        self.sockets = {name: directory / f"{name}.sock" for name in ("vm0", "vm1")}
        self.admin = directory / "admin.sock"
        self.log = directory / "backend.log"
        self.sanitized = sanitized
        self.daemon = DaemonProcess([Served(name, path) for name, path in self.sockets.items()], log_file=self.log,
                                    admin_socket=self.admin,
                                    launcher=sanitize.backend_command() if sanitized else None,
                                    env=sanitize.environment() if sanitized else None,
                                    options=["--engine-threads", str(engine_threads)])
        self.log.unlink(missing_ok=True)
        try:
            self.daemon.start()
        except DaemonStartError as err:
            raise CampaignFailure("crash", f"the backend did not start: {err}") from None
        assert self.daemon.popen is not None
        self.proc = self.daemon.popen

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def counters(self, vm: str) -> dict[str, Any]:
        from vrdma.daemon.admin import ask

        return ask(self.admin, {"command": "counters"})["vms"][vm]  # type: ignore[no-any-return]

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def rss(self) -> int:
        with open(f"/proc/{self.pid}/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def stop(self) -> int:
        """SIGTERM; a backend that does not stop within 30 s is killed (the campaign's hang check reports it)."""
        if self.alive():
            try:
                status = self.daemon.terminate(30)
            except DaemonStopError:
                pass
            else:
                if status is not None:
                    return status
        return self.proc.wait()


# -- a frontend whose control queue reuses its buffers --------------------------------------------------------------

class CampaignFrontend(Frontend):
    """The simulated frontend, with a control queue that reuses a fixed set of buffers: Frontend.command takes new
    guest memory for every command, and a campaign sends millions."""

    def start(self, num_queues: int = abi.const("VRDMA_NUM_QUEUES"), queue_size: int = 64,
              device_features: int = 0, protocol_features: int = ~0) -> None:
        super().start(num_queues, queue_size, device_features, protocol_features)
        self.slots = [(self.memory.alloc(REQUEST_ROOM, 64), self.memory.alloc(RESPONSE_ROOM, 64))
                      for _ in range(COMMAND_SLOTS)]

    def command(self, request: bytes, response_size: int, queue: int = 0, timeout: float = 5.0) -> bytes:
        response = self.commands([(request, response_size)], timeout)[0]
        if response is None:
            raise FrontendError(f"queue {queue}: no response within {timeout:g} s")
        return response

    def commands(self, batch: list[tuple[bytes, int]], timeout: float) -> list[bytes | None]:
        """Post up to COMMAND_SLOTS commands (request, response room), kick once, wait for all of them."""
        vq = self.queues[abi.const("VRDMA_QUEUE_CONTROL")]
        heads: dict[int, int] = {}
        for index, (raw, room) in enumerate(batch[:COMMAND_SLOTS]):
            req_gpa, resp_gpa = self.slots[index]
            request = raw[:REQUEST_ROOM]
            self.memory.write(req_gpa, request)
            vq.write_desc(2 * index, req_gpa, len(request), VRING_DESC_F_NEXT, 2 * index + 1)
            vq.write_desc(2 * index + 1, resp_gpa, min(room, RESPONSE_ROOM), VRING_DESC_F_WRITE, 0)
            vq.publish(2 * index)
            heads[2 * index] = index
        vq.notify()
        results: list[bytes | None] = [None] * len(heads)
        deadline = time.monotonic() + timeout
        while heads:
            for head, length in reap(vq):
                index = heads.pop(head, -1)
                if index >= 0:
                    results[index] = self.memory.read(self.slots[index][1], min(length, RESPONSE_ROOM))
            remaining = deadline - time.monotonic()
            if not heads or remaining <= 0:
                break
            ready, _, _ = select.select([vq.call, self.sock.fileno()], [], [], remaining)
            if vq.call in ready:
                with contextlib.suppress(BlockingIOError):
                    os.eventfd_read(vq.call)
            if self.sock.fileno() in ready and self._closed_by_peer():
                break  # the backend dropped this connection: nothing more will be answered
        return results

    def _closed_by_peer(self) -> bool:
        """Whether the socket reached its end (replies to earlier messages waiting there are read and dropped)."""
        try:
            return self.sock.recv(65536, socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True


def reap(vq: Any) -> list[tuple[int, int]]:
    """New used entries of a virtqueue (the descriptors are the caller's to reuse; nothing goes to a free list)."""
    used_idx = struct.unpack("<H", vq.memory.read(vq.used + 2, 2))[0]
    entries = []
    while vq.used_seen != used_idx:
        slot = vq.used_seen % vq.size
        entries.append(struct.unpack("<II", vq.memory.read(vq.used + 4 + 8 * slot, 8)))
        vq.used_seen = (vq.used_seen + 1) & 0xFFFF
    return entries


