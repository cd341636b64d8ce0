"""The link hub: an Ethernet learning switch joining three or more guests over unix datagram sockets.

Two guests need no hub: each one's QEMU datagram netdev sends straight to the other's socket. With more, every
guest sends to the hub's one socket; the hub learns which guest socket each source MAC address lives behind,
forwards unicast frames to that guest and floods the rest to all the others. Frames never leave the run
directory: the link exists only between the guests.

Run as ``python -m vrdma.harness.linkhub --fd N --guest PATH ...`` by the harness, which binds the hub socket
itself and passes it as a file descriptor, so the socket exists before any guest sends to it.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from vrdma.harness.process import die_with_parent

log = logging.getLogger(__name__)

MAX_FRAME = 65536
BROADCAST_BIT = 0x01  # the I/G bit of the first destination octet: set for broadcast and multicast


def serve(sock: socket.socket, guests: Sequence[str]) -> None:
    """Forward frames until the socket is shut down or closed, or the process is told to stop.

    To stop a hub served in a thread, shut its socket down, join the thread, and only then close the socket: a
    socket closed under a thread about to call recvfrom() can hand its fd number to a new socket, whose datagrams
    the old thread would then take."""
    where: dict[bytes, str] = {}
    known = set(guests)
    while True:
        try:
            frame, source = sock.recvfrom(MAX_FRAME)
        except OSError:
            return
        if not frame and source is None:
            return  # shut down (a guest's datagram, even an empty one, comes from its bound address)
        if source not in known or len(frame) < 14:
            continue  # not one of our guests, or not an Ethernet frame
        where[frame[6:12]] = source
        destination = frame[0:6]
        if not destination[0] & BROADCAST_BIT and destination in where:
            targets = [where[destination]]
        else:
            targets = [g for g in guests if g != source]
        for target in targets:
            if target != source:
                # A guest that is not up (yet) or whose queue is full loses the frame, as on Ethernet.
                with contextlib.suppress(OSError):
                    sock.sendto(frame, target)


def bind_hub_socket(path: Path) -> socket.socket:
    path.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.set_inheritable(True)
    return sock


def start(path: Path, guests: Sequence[Path], log_file: Path, detach: bool) -> subprocess.Popen[bytes]:
    """Bind the hub socket at ``path`` and start the hub process serving it."""
    sock = bind_hub_socket(path)
    try:
        argv = [sys.executable, "-m", "vrdma.harness.linkhub", "--fd", str(sock.fileno()),
                *(a for g in guests for a in ("--guest", str(g)))]
        with log_file.open("wb") as out:
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    pass_fds=[sock.fileno()], start_new_session=detach,
                                    preexec_fn=None if detach else die_with_parent)
    finally:
        sock.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Ethernet hub for vrdma guests (run by the harness)")
    parser.add_argument("--fd", type=int, required=True, help="bound unix datagram socket to serve")
    parser.add_argument("--guest", action="append", required=True, help="a guest's link socket path")
    args = parser.parse_args(argv)
    sock = socket.socket(fileno=args.fd)

    def stop(signum: int, frame: FrameType | None) -> None:
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    serve(sock, args.guest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
