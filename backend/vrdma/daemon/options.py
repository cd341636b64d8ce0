"""The daemon's options, declared once: importable without the backend's C modules (the tooling CLI shows them in
`vrdma backend --help` before `make backend` has built anything)."""

from __future__ import annotations

import argparse

DESCRIPTION = ("Serve one vrdma device (virtio ID 42) per VM over vhost-user. Runs in the foreground until SIGTERM "
               "or SIGINT.")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The daemon's options, on a parser of its own or on `vrdma backend`'s."""
    parser.add_argument("--socket-path", action="append", default=[], metavar="[NAME=]PATH",
                        help="listen for a VM's QEMU on this unix socket (repeatable, one device each); the VM "
                             "name defaults to the file's stem")
    parser.add_argument("--fd", action="append", default=[], type=int, metavar="N",
                        help="serve a VM over this inherited, already connected socket (repeatable)")
    parser.add_argument("--mac", action="append", default=[], metavar="NAME=MAC",
                        help="MAC of the virtio-net netdev paired with VM NAME's device")
    parser.add_argument("--doorbell-dir", metavar="DIR",
                        help="where to create each VM's doorbell region NAME.doorbell (default: next to its "
                             "socket)")
    parser.add_argument("--ready-fd", type=int, metavar="N",
                        help="write READY to this inherited fd once every socket listens")
    parser.add_argument("--admin-socket", metavar="PATH", help="serve counters on this unix socket")
    parser.add_argument("--roce", action="store_true",
                        help="reach destinations no VM of this backend holds over the network with RoCE v2 (UDP "
                             "port 4791; needs root or CAP_NET_RAW and CAP_NET_ADMIN, and the host set up as "
                             "docs/interhost.md says)")
    parser.add_argument("--print-capabilities", action="store_true",
                        help="print the backend's capabilities as JSON and exit")
