"""systemd's service notification (sd_notify(3)) for `Type=notify` units: READY, STATUS, STOPPING and the watchdog.

The protocol is a datagram of ``KEY=VALUE`` lines to the unix socket named by ``$NOTIFY_SOCKET`` (an abstract one
when it starts with '@'); systemd documents it as stable and meant to be spoken without libsystemd, which the
backend's Python environment does not otherwise need. Outside systemd ($NOTIFY_SOCKET unset) every call does
nothing. The watchdog: with ``WatchdogSec=`` systemd sets ``$WATCHDOG_USEC``; the loop pings at half that period
(``due()``), so a loop stuck in C for longer gets the service restarted.
"""

from __future__ import annotations

import logging
import os
import socket
import time

log = logging.getLogger(__name__)


class Notifier:
    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = dict(os.environ if environ is None else environ)
        self.address: str | None = env.get("NOTIFY_SOCKET") or None
        self.sock: socket.socket | None = None
        if self.address is not None:
            if not self.address.startswith(("/", "@")):
                log.warning("NOTIFY_SOCKET=%r is neither a path nor an abstract socket: not notifying systemd",
                            self.address)
                self.address = None
            else:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.watchdog_s: float | None = None
        usec, pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
        if self.sock is not None and usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_s = int(usec) / 2e6  # ping at half the period systemd allows
        self.next_ping = 0.0

    @property
    def enabled(self) -> bool:
        return self.sock is not None

    def send(self, **fields: str) -> None:
        """One notification: ``send(READY="1", STATUS="serving 2 VMs")``."""
        if self.sock is None or self.address is None:
            return
        message = "\n".join(f"{key}={value}" for key, value in fields.items()).encode()
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        try:
            self.sock.sendto(message, target)
        except OSError as err:  # systemd gone or the socket full: the service goes on
            log.warning("cannot notify systemd (%s): %s", self.address, err)

    def ready(self, status: str) -> None:
        self.send(READY="1", STATUS=status, MAINPID=str(os.getpid()))

    def status(self, status: str) -> None:
        self.send(STATUS=status)

    def stopping(self) -> None:
        self.send(STOPPING="1", STATUS="stopping")

    def due(self) -> float | None:
        """Seconds until the next watchdog ping is due (None without a watchdog): the loop sleeps no longer."""
        if self.watchdog_s is None:
            return None
        return max(0.0, self.next_ping - time.monotonic())

    def ping_if_due(self) -> None:
        if self.watchdog_s is None:
            return
        now = time.monotonic()
        if now >= self.next_ping:
            self.send(WATCHDOG="1")
            self.next_ping = now + self.watchdog_s

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
