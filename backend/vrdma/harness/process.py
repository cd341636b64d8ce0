"""Process helpers shared by the harness's children (QEMU, the link hub)."""

from __future__ import annotations

import ctypes
import signal
import subprocess
from types import TracebackType
from typing import Any, Self

import psutil

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Run in a child before exec: SIGKILL it when the harness dies, so a crashed test leaves no orphan.

    The signal follows the thread that forked the child: launch children from a thread that lives as long as
    they should (the main thread).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def find_process(pid: int, create_time: float) -> psutil.Process | None:
    """The process recorded as (pid, start time), or None when it is gone; a recycled PID is not it."""
    try:
        process = psutil.Process(pid)
        return process if abs(process.create_time() - create_time) < 0.01 else None
    except psutil.NoSuchProcess:
        return None


def record(process: psutil.Process) -> dict[str, Any]:
    """What find_process() needs to find this process again from another command."""
    return {"pid": process.pid, "create_time": process.create_time()}


def is_running(popen: subprocess.Popen[bytes] | None, process: psutil.Process | None) -> bool:
    """Our child (popen) has not exited, or a process we only know by its psutil handle is alive (not a zombie)."""
    if popen is not None:
        return popen.poll() is None
    if process is None:
        return False
    try:
        return bool(process.is_running() and process.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


class Managed:
    """A context manager over start() and stop(): stop() runs when start() fails part-way and when the block ends,
    whatever happened in it, so nothing a harness object started outlives it."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
