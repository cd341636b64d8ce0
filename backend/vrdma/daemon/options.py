"""The daemon's options, declared once: importable without the backend's C modules (the tooling CLI shows them in
`vrdma backend --help` before `make backend` has built anything)."""

from __future__ import annotations

import argparse

from vrdma.daemon.config import DEFAULT_MAX_VMS, MAX_VMS_LIMIT

DESCRIPTION = ("Serve one vrdma device (virtio ID 42) per VM over vhost-user. Runs in the foreground until SIGTERM "
               "or SIGINT.")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The daemon's options, on a parser of its own or on `vrdma backend`'s."""
    parser.add_argument("--config", metavar="FILE",
                        help="read the backend's settings and VMs from this TOML file (docs/operating.md); the "
                             "flags below override its values and add to its VMs")
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
    parser.add_argument("--admin-socket", metavar="PATH",
                        help="answer `vrdma admin` on this unix socket: add, list and remove VMs, read counters")
    parser.add_argument("--max-vms", type=_vm_count, metavar="N",
                        help=f"serve at most N VMs at once, counting those added later (default "
                             f"{DEFAULT_MAX_VMS})")
    parser.add_argument("--metrics", metavar="[HOST:]PORT",
                        help="serve Prometheus metrics (per-VM counters, objects, engine time) at "
                             "http://HOST:PORT/metrics; HOST defaults to 127.0.0.1")
    parser.add_argument("--roce", action="store_true",
                        help="reach destinations no VM of this backend holds over the network with RoCE v2 (UDP "
                             "port 4791; needs root or CAP_NET_RAW and CAP_NET_ADMIN, and the host set up as "
                             "docs/interhost.md says)")
    parser.add_argument("--print-capabilities", action="store_true",
                        help="print the backend's capabilities as JSON and exit")


def _vm_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= MAX_VMS_LIMIT:
        raise argparse.ArgumentTypeError(f"must be 1 to {MAX_VMS_LIMIT}: {value}")
    return value
