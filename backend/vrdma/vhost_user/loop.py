"""A small selector-based event loop: file descriptor readiness callbacks, injected into every device."""

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

    def run_once(self, timeout: float | None = None) -> int:
        """Wait up to ``timeout`` seconds for readiness and run the callbacks; return how many ran."""
        events = self.selector.select(timeout)
        for key, _ in events:
            if key.fd in self.selector.get_map():  # an earlier callback may have removed it
                key.data()
        return len(events)

    def close(self) -> None:
        self.selector.close()
