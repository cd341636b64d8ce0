"""Process helpers shared by the harness's children (QEMU, the link hub)."""

from __future__ import annotations

import ctypes
import signal
from types import TracebackType
from typing import Self

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Run in a child before exec: SIGKILL it when the harness dies, so a crashed test leaves no orphan.

    The signal follows the thread that forked the child: launch children from a thread that lives as long as
    they should (the main thread).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


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
