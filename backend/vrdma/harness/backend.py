"""The vrdma backend process as the harness runs it: started before QEMU, one process for all guests.

Readiness is an event: the backend writes READY on an inherited pipe once every socket listens (``--ready-fd``).
The backend is stopped with SIGTERM (then SIGKILL) and its log is kept in the run directory.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from vrdma.errors import VrdmaError
from vrdma.harness.process import Managed, die_with_parent, is_running
from vrdma.harness.qemu_cmdline import GuestIdentity

START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0


class BackendStartError(VrdmaError):
    pass


def socket_path(directory: Path, ident: GuestIdentity) -> Path:
    """Where the backend listens for a guest; the same path qemu_cmdline gives QEMU."""
    return directory / ident.name / "vrdma.sock"


class BackendService(Managed):
    """``with BackendService(directory, identities):`` runs `vrdma backend` for those guests."""

    def __init__(self, directory: Path, identities: list[GuestIdentity], detach: bool = False,
                 test_hooks: bool = False) -> None:
        self.directory = directory
        self.test_hooks = test_hooks
        self.admin_socket = directory / "backend" / "admin.sock"
        self.identities = identities
        self.detach = detach
        self.log_file = directory / "backend.log"
        self.process: psutil.Process | None = None
        self._popen: subprocess.Popen[bytes] | None = None

    def argv(self, ready_fd: int) -> list[str]:
        argv = [sys.executable, "-m", "vrdma.cli", "backend", "--doorbell-dir", str(self.directory / "backend"),
                "--ready-fd", str(ready_fd), "--admin-socket", str(self.admin_socket)]
        if self.test_hooks:
            argv.append("--test-hooks")
        for ident in self.identities:
            argv += ["--socket-path", f"{ident.name}={socket_path(self.directory, ident)}",
                     "--mac", f"{ident.name}={ident.mac}"]
        return argv

    def start(self) -> None:
        (self.directory / "backend").mkdir(parents=True, exist_ok=True)
        for ident in self.identities:
            socket_path(self.directory, ident).parent.mkdir(parents=True, exist_ok=True)
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        try:
            with self.log_file.open("ab") as log:
                self._popen = subprocess.Popen(
                    self.argv(write_end), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    pass_fds=[write_end], start_new_session=self.detach,
                    preexec_fn=None if self.detach else die_with_parent)
            os.close(write_end)
            write_end = -1
            self.process = psutil.Process(self._popen.pid)
            ready = _read_until_eof(read_end, START_TIMEOUT)
        finally:
            os.close(read_end)
            if write_end >= 0:
                os.close(write_end)
        if ready != b"READY\n":
            self.stop()
            tail = "\n".join(self.log_file.read_text(errors="replace").splitlines()[-20:])
            raise BackendStartError(f"the vrdma backend did not become ready (log: {self.log_file}):\n{tail}")

    @property
    def running(self) -> bool:
        return is_running(self._popen, self.process)

    def stop(self) -> None:
        if self.process is None:
            return
        with contextlib.suppress(psutil.NoSuchProcess):
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT)
            except psutil.TimeoutExpired:
                self.process.kill()
                self.process.wait(STOP_TIMEOUT)
        if self._popen is not None:
            self._popen.wait()
        self.process = None

    def kill(self) -> None:
        """SIGKILL, as a crash would end it (tests of reconnection)."""
        if self.process is not None:
            self.process.kill()
            if self._popen is not None:
                self._popen.wait()
            self.process = None


def admin(service: BackendService, request: dict[str, object]) -> dict[str, object]:
    """Ask the running backend through its admin socket."""
    from vrdma.daemon.admin import ask

    return ask(service.admin_socket, request)


def vm_counters(service: BackendService, vm: str) -> dict[str, Any]:
    """One VM's counters from the running backend (docs/backend.md lists them)."""
    return admin(service, {"command": "counters"})["vms"][vm]  # type: ignore[index,no-any-return]


def _read_until_eof(fd: int, timeout: float) -> bytes:
    deadline = time.monotonic() + timeout
    data = b""
    while (remaining := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(fd, 64)
        if not chunk:
            break
        data += chunk
        if data.endswith(b"\n"):
            break
    return data
