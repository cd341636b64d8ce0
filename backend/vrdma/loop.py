"""The backend's event loop: a small selector over file descriptors with readiness callbacks.

One loop per backend process, given to whatever watches descriptors: the vhost-user connections (vrdma.vhost_user),
the fault guard's wake-ups (vrdma.faultguard), the admin socket and the RoCE sockets (vrdma.daemon). It sits below
all of them and imports none (pyproject.toml's import contracts): before it had a package of its own it lived in
vhost_user/, which made faultguard import vhost_user while vhost_user imported faultguard."""

from __future__ import annotations

import logging
import selectors
from collections.abc import Callable

log = logging.getLogger(__name__)

Callback = Callable[[], None]


class EventLoop:
    def __init__(self) -> None:
        self.selector = selectors.DefaultSelector()

    def add_reader(self, fd: int, callback: Callback) -> None:
        """Call ``callback`` whenever ``fd`` is readable (replacing an earlier callback for it).

        Always registered anew: an entry for this number may be stale (an fd closed without remove_reader, its number
        since reused), and selector.modify() with unchanged events only swaps the callback, so the new fd would
        never be watched by the kernel at all."""
        if fd in self.selector.get_map():
            self.selector.unregister(fd)  # epoll forgot a closed fd by itself; the selector ignores that error
        self.selector.register(fd, selectors.EVENT_READ, callback)

    def remove_reader(self, fd: int) -> None:
        if fd in self.selector.get_map():
            self.selector.unregister(fd)

    def add_writer(self, fd: int, callback: Callback) -> None:
        """Call ``callback`` whenever ``fd`` can take more bytes (a descriptor is watched one way: reading or
        writing; a pipe's end is only ever one)."""
        if fd in self.selector.get_map():
            self.selector.unregister(fd)
        self.selector.register(fd, selectors.EVENT_WRITE, callback)

    remove_writer = remove_reader

    def run_once(self, timeout: float | None = None) -> int:
        """Wait up to ``timeout`` seconds for readiness and run the callbacks; return how many ran."""
        events = self.selector.select(timeout)
        for key, _ in events:
            if key.fd in self.selector.get_map():  # an earlier callback may have removed it
                key.data()
        return len(events)

    def close(self) -> None:
        self.selector.close()
