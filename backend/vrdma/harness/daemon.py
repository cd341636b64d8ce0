"""The one launcher of the `vrdma backend` daemon, for the harness, the benchmarks and the tests.

Readiness is an event: the daemon writes READY on an inherited pipe once every socket listens (``--ready-fd``).
It is stopped with SIGTERM; one that does not stop in time first writes its Python stacks to its log (SIGUSR1)
and is described (its fds, and what each epoll watches) before it is killed, so a hang is a report, not a
mystery. Its log is kept in the directory it runs in.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from vrdma.errors import VrdmaError
from vrdma.harness.process import Managed, die_with_parent, is_running
from vrdma.harness.qemu_cmdline import GuestIdentity

START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0


class DaemonStartError(VrdmaError):
    pass


class DaemonStopError(VrdmaError):
    """The daemon did not stop on SIGTERM (the message holds its stacks and fds)."""


@dataclass(frozen=True)
class Served:
    """A VM the daemon serves: its name, where it listens, the MAC of its paired netdev (if any)."""

    name: str
    socket_path: Path
    mac: str | None = None


def socket_path(directory: Path, ident: GuestIdentity) -> Path:
    """Where the daemon listens for a guest; the same path qemu_cmdline gives QEMU."""
    return directory / ident.name / "vrdma.sock"


class DaemonProcess(Managed):
    """``with DaemonProcess(vms, log_file=..., admin_socket=...):`` runs `vrdma backend` for those VMs.

    ``doorbell_dir``: where each VM's doorbell region goes (default: next to its socket). ``launcher`` and
    ``env``: the command that runs `vrdma` and its environment (the sanitizer tier runs another build; a host of
    vrdma.harness.hosts runs it in its network namespace). ``detach``: the daemon outlives this process (`vrdma vm
    up`); otherwise it dies with it. ``roce``: `--roce`, RoCE v2 to other hosts. ``options``: further `vrdma
    backend` options (``--config FILE``, ``--max-vms N``).
    """

    def __init__(self, vms: list[Served], *, log_file: Path, admin_socket: Path, doorbell_dir: Path | None = None,
                 test_hooks: bool = False, verbose: bool = False, detach: bool = False,
                 launcher: list[str] | None = None, env: dict[str, str] | None = None, roce: bool = False,
                 options: list[str] | None = None) -> None:
        self.vms = vms
        self.options = list(options or [])
        self.log_file = log_file
        self.admin_socket = admin_socket
        self.doorbell_dir = doorbell_dir
        self.test_hooks = test_hooks
        self.verbose = verbose
        self.detach = detach
        self.launcher = launcher or [sys.executable, "-m", "vrdma.cli"]
        self.env = env
        self.roce = roce
        self.process: psutil.Process | None = None
        self.popen: subprocess.Popen[bytes] | None = None

    def argv(self, ready_fd: int) -> list[str]:
        argv = [*self.launcher, *(["-v"] if self.verbose else []), "backend", "--ready-fd", str(ready_fd),
                "--admin-socket", str(self.admin_socket)]
        if self.doorbell_dir is not None:
            argv += ["--doorbell-dir", str(self.doorbell_dir)]
        if self.test_hooks:
            argv.append("--test-hooks")
        if self.roce:
            argv.append("--roce")
        argv += self.options
        for vm in self.vms:
            argv += ["--socket-path", f"{vm.name}={vm.socket_path}"]
            if vm.mac is not None:
                argv += ["--mac", f"{vm.name}={vm.mac}"]
        return argv

    def start(self) -> None:
        for path in [*(vm.socket_path.parent for vm in self.vms), self.admin_socket.parent, self.log_file.parent,
                     *([self.doorbell_dir] if self.doorbell_dir else [])]:
            path.mkdir(parents=True, exist_ok=True)
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        try:
            with self.log_file.open("ab") as log:
                self.popen = subprocess.Popen(
                    self.argv(write_end), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    pass_fds=[write_end], start_new_session=self.detach, env=self.env,
                    preexec_fn=None if self.detach else die_with_parent)
            os.close(write_end)
            write_end = -1
            self.process = psutil.Process(self.popen.pid)
            ready = _read_until_eof(read_end, START_TIMEOUT)
        finally:
            os.close(read_end)
            if write_end >= 0:
                os.close(write_end)
        if ready != b"READY\n":
            self.kill()
            tail = "\n".join(self.log_text().splitlines()[-40:])
            raise DaemonStartError(f"the vrdma backend did not become ready (log: {self.log_file}):\n{tail}")

    @property
    def running(self) -> bool:
        return is_running(self.popen, self.process)

    def log_text(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        """SIGTERM, and SIGKILL if that does not end it in time (quietly: the harness is tearing down)."""
        with contextlib.suppress(DaemonStopError):
            self.terminate()

    def terminate(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM and wait; return the exit status (None if it was not running). A daemon that does not stop
        in time is described and killed, and DaemonStopError says what it was doing."""
        if self.process is None:
            return None
        try:
            self.process.terminate()
            self.process.wait(timeout)
        except psutil.TimeoutExpired:
            report = self._describe_hang()
            self.kill()
            raise DaemonStopError(f"the backend did not stop on SIGTERM within {timeout:g} s:\n{report}") from None
        except psutil.NoSuchProcess:
            pass
        status = self.popen.wait() if self.popen is not None else None
        self.process = None
        return status

    def kill(self) -> None:
        """SIGKILL, as a crash would end it (tests of reconnection)."""
        if self.process is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                self.process.kill()
            if self.popen is not None:
                self.popen.wait()
            self.process = None

    def upgrade(self) -> dict[str, Any]:
        """`vrdma admin upgrade`: the backend hands every VM to a new process of itself, which this handle follows
        from then on (the old one has exited). Returns the new one's status ("upgrade": its pause_ms)."""
        from vrdma.daemon.admin import upgrade

        status = upgrade(self.admin_socket)
        if self.popen is not None:
            self.popen.wait(STOP_TIMEOUT)  # (the old one exits as soon as the new one runs)
            self.popen = None
        self.process = psutil.Process(int(status["pid"]))
        return status

    def _describe_hang(self) -> str:
        """Its Python stacks (SIGUSR1: faulthandler writes them to the log) and its fds (what a stuck loop waits
        on), read before it is killed."""
        assert self.process is not None
        with contextlib.suppress(psutil.NoSuchProcess):
            self.process.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 5
        while "most recent call first" not in self.log_text() and time.monotonic() < deadline:
            time.sleep(0.05)  # a signal handler writes the stacks: there is no event to wait on
        return f"{self.log_text()[-5000:]}\nits fds (and what each epoll watches):\n{_describe_fds(self.process.pid)}"


def for_guests(directory: Path, identities: list[GuestIdentity], *, detach: bool = False,
               test_hooks: bool = False, options: list[str] | None = None) -> DaemonProcess:
    """The daemon as the harness runs it for booted guests: one socket per guest where QEMU looks for it;
    ``options``: further `vrdma backend` options (``--engine-threads N``)."""
    return DaemonProcess([Served(i.name, socket_path(directory, i), i.mac) for i in identities],
                         log_file=directory / "backend.log", admin_socket=directory / "backend" / "admin.sock",
                         doorbell_dir=directory / "backend", test_hooks=test_hooks, detach=detach, options=options)


def admin(daemon: DaemonProcess, request: dict[str, object]) -> dict[str, object]:
    """Ask the running daemon through its admin socket."""
    from vrdma.daemon.admin import ask

    return ask(daemon.admin_socket, request)


def vm_counters(daemon: DaemonProcess, vm: str) -> dict[str, Any]:
    """One VM's counters from the running daemon (docs/backend.md lists them)."""
    return admin(daemon, {"command": "counters"})["vms"][vm]  # type: ignore[index,no-any-return]


def _describe_fds(pid: int) -> str:
    """Every open fd of a process, and for an epoll fd the fds it watches."""
    lines = []
    base = Path(f"/proc/{pid}/fd")
    with contextlib.suppress(OSError):
        for fd in sorted(base.iterdir(), key=lambda p: int(p.name)):
            try:
                target = os.readlink(fd)
                info = (Path(f"/proc/{pid}/fdinfo") / fd.name).read_text()
            except OSError:
                continue
            watched = [line.split()[1] for line in info.splitlines() if line.startswith("tfd:")]
            lines.append(f"{fd.name} -> {target}" + (f" watching {' '.join(watched)}" if watched else ""))
    return "\n".join(lines)


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
