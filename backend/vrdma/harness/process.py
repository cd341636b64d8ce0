"""Process helpers shared by the harness's children (QEMU, the link hub)."""

from __future__ import annotations

import ctypes
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Run in a child before exec: SIGKILL it when the harness dies, so a crashed test leaves no orphan.

    The signal follows the thread that forked the child: launch children from a thread that lives as long as
    they should (the main thread).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
