"""The backend under systemd (Type=notify): READY once every socket listens, STATUS as VMs come and go, the watchdog
pinged while the loop turns, STOPPING on SIGTERM. systemd's side is played by a datagram socket here; the unit
itself starts under systemd in the full Debian guest (tests/vm)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vrdma.daemon.admin import ask

pytestmark = pytest.mark.backend


def receive(sock: socket.socket, want: str, timeout: float = 30.0) -> list[str]:
    """Notifications until one holds ``want``; all of them, in order."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while not any(want in message for message in seen):
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            seen.append(sock.recv(4096).decode())
        except TimeoutError:
            raise AssertionError(f"no {want!r} within {timeout} s; got {seen}") from None
    return seen


def test_the_backend_speaks_sd_notify(tmp_path: Path) -> None:
    notify = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as systemd:
        systemd.bind(str(notify))
        env = {**os.environ, "NOTIFY_SOCKET": str(notify), "WATCHDOG_USEC": "200000"}  # ping every 0.1 s
        admin = tmp_path / "admin.sock"
        with subprocess.Popen([sys.executable, "-m", "vrdma.cli", "backend", "--admin-socket", str(admin)],
                              env=env, stderr=subprocess.PIPE, text=True) as backend:
            try:
                ready = receive(systemd, "READY=1")[-1]
                assert "STATUS=serving 0 of at most 64 VMs" in ready and f"MAINPID={backend.pid}" in ready
                assert admin.is_socket(), "READY came before the admin socket listened"
                pings = receive(systemd, "WATCHDOG=1")
                pings += receive(systemd, "WATCHDOG=1")
                reply = ask(admin, {"command": "vm-add", "name": "vm0", "socket-path": str(tmp_path / "vm0.sock")})
                assert reply["ok"], reply
                assert "STATUS=serving 1 of at most 64 VMs: vm0" in receive(systemd, "STATUS=serving 1")[-1]
                started = time.monotonic()
                count = 0
                while time.monotonic() - started < 1.0:
                    count += sum("WATCHDOG=1" in m for m in receive(systemd, "WATCHDOG=1"))
                # Half the period (0.1 s): about 10; the whole period would give 5.
                assert 7 <= count <= 13, f"{count} watchdog pings in a second (expected about 10)"
                backend.send_signal(signal.SIGTERM)
                receive(systemd, "STOPPING=1")
                assert backend.wait(30) == 0
            finally:
                if backend.poll() is None:
                    backend.kill()
            assert "Traceback" not in (backend.stderr.read() if backend.stderr else "")


def test_outside_systemd_nothing_is_sent(tmp_path: Path) -> None:
    from vrdma.daemon.notify import Notifier

    quiet = Notifier({})
    assert not quiet.enabled and quiet.due() is None
    quiet.ready("x")  # no socket: nothing to do, no error
    odd = Notifier({"NOTIFY_SOCKET": "relative/path"})
    assert not odd.enabled
    other_pid = Notifier({"NOTIFY_SOCKET": str(tmp_path / "n.sock"), "WATCHDOG_USEC": "1000000",
                          "WATCHDOG_PID": "1"})
    assert other_pid.enabled and other_pid.due() is None, "a watchdog meant for another process was taken"
    other_pid.close()


def _blocks_sigterm(pid: int, tid: int) -> bool:
    for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
        if line.startswith("SigBlk:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    raise AssertionError(f"no SigBlk for thread {tid}")


def test_a_sigterm_taken_by_another_thread_stops_the_backend(tmp_path: Path) -> None:
    """The kernel gives a process's SIGTERM to any thread that does not block it. The engine's threads block every
    signal, and one taken by a Python thread (the metrics server's) still wakes the main loop. (CI once saw a backend
    sleep 30 s in select() after its SIGTERM, until the harness's SIGUSR1 woke it.)"""
    import ctypes

    from tests.backend.test_backend_metrics import free_port

    admin = tmp_path / "admin.sock"
    command = [sys.executable, "-m", "vrdma.cli", "backend", "--admin-socket", str(admin), "--engine-threads", "2",
               "--metrics", f"127.0.0.1:{free_port()}", "--ready-fd", "1"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as backend:
        try:
            assert backend.stdout is not None and backend.stdout.readline() == "READY\n"
            others = [int(t) for t in os.listdir(f"/proc/{backend.pid}/task") if int(t) != backend.pid]
            blocking = [tid for tid in others if _blocks_sigterm(backend.pid, tid)]
            assert len(blocking) == 2, f"{len(blocking)} threads block SIGTERM; the engine runs 2"
            takers = [tid for tid in others if tid not in blocking]
            assert takers, "no thread besides the main one and the engine's (the metrics server's was expected)"
            libc = ctypes.CDLL(None, use_errno=True)
            for tid in takers:
                assert libc.tgkill(backend.pid, tid, signal.SIGTERM) == 0, os.strerror(ctypes.get_errno())
            assert backend.wait(10) == 0
        finally:
            if backend.poll() is None:
                backend.kill()
