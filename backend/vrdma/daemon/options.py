"""The daemon's options, declared once: importable without the backend's C modules (the tooling CLI shows them in
`vrdma backend --help` before `make backend` has built anything)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from vrdma.daemon.config import DEFAULT_ENGINE_THREADS, DEFAULT_MAX_VMS, MAX_ENGINE_THREADS, MAX_VMS_LIMIT

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
    parser.add_argument("--engine-threads", type=_thread_count, metavar="N",
                        help=f"run the data path in N threads (1 to {MAX_ENGINE_THREADS}, default "
                             f"{DEFAULT_ENGINE_THREADS}, or one per CPU of --engine-cpus): each runs the VMs given "
                             "to it, and an idle one takes a busy VM from a thread running two")
    parser.add_argument("--engine-cpus", metavar="LIST",
                        help="pin the engine's threads, thread i to the i-th CPU of LIST (taskset's form: 0,2-3); "
                             "one CPU per thread")
    parser.add_argument("--metrics", metavar="[HOST:]PORT",
                        help="serve Prometheus metrics (per-VM counters, objects, engine time) at "
                             "http://HOST:PORT/metrics; HOST defaults to 127.0.0.1")
    parser.add_argument("--roce", action="store_true",
                        help="reach destinations no VM of this backend holds over the network with RoCE v2 (UDP "
                             "port 4791; needs root or CAP_NET_RAW and CAP_NET_ADMIN, and the host set up as "
                             "docs/interhost.md says)")
    parser.add_argument("--take-over", type=int, metavar="FD", help=argparse.SUPPRESS)  # (upgrade.py's own)
    parser.add_argument("--print-capabilities", action="store_true",
                        help="print the backend's capabilities as JSON and exit")


def _whole_number(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` to ``high``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be {low} to {high}: {value}")
        return value
    return parse


_thread_count = _whole_number(1, MAX_ENGINE_THREADS)
_vm_count = _whole_number(1, MAX_VMS_LIMIT)
