"""The backend's RoCE v2 sockets (`vrdma-backend --roce`): opened here, with the privileges they need, and handed to
the data engine, which reads and writes them from its polling loop (engine.h, vre_net_attach).

- Receiving: a raw IPv4 socket of protocol UDP, so that each packet arrives with its IP header (the invariant CRC
  covers its identification word, which a UDP socket never shows: docs/interhost.md), filtered in the kernel to
  unfragmented UDP for port 4791 by a classic BPF program.
- Sending: a UDP socket bound to port 4791 with IP_TRANSPARENT (a packet may leave from a guest's address, which is
  not the host's) and don't-fragment (Linux then writes identification 0, the value the engine's ICRC assumes).
  Bound, it also keeps the host's UDP from answering RoCE packets for the guests with ICMP port unreachable; a
  drop-everything filter keeps it from queueing them.
- IPv6: one UDP socket bound to [::]:4791 (IPV6_V6ONLY, IPV6_TRANSPARENT, IPV6_RECVPKTINFO for each packet's
  destination, don't-fragment) sends and receives: the ICRC of an IPv6 packet covers nothing it does not show.
  On a host without IPv6 there is none, and IPv6 GIDs stay out of reach.

Both need CAP_NET_RAW and CAP_NET_ADMIN (root, in the harness). How packets for the guests' addresses reach this
host's stack (routing, nftables) is the operator's part: docs/interhost.md.
"""

from __future__ import annotations

import ctypes
import logging
import socket
import struct
from dataclasses import dataclass

from vrdma.errors import VrdmaError

log = logging.getLogger(__name__)

ROCE_PORT = 4791
SO_ATTACH_FILTER = 26
IP_TRANSPARENT = 19
IP_MTU_DISCOVER = 10  # (not in Python 3.11's socket module)
IP_PMTUDISC_DO = 2
IPV6_TRANSPARENT = 75
IPV6_MTU_DISCOVER = 23
IPV6_PMTUDISC_DO = 2
BUFFER_BYTES = 8 << 20


class RoceError(VrdmaError):
    """The RoCE sockets cannot be opened (the message says which and why)."""


def _bpf(program: list[tuple[int, int, int, int]]) -> tuple[bytes, ctypes.Array[ctypes.c_char]]:
    """struct sock_fprog for SO_ATTACH_FILTER, and the instructions it points to (kept alive by the caller)."""
    code = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *insn) for insn in program))
    return struct.pack("HxxxxxxQ", len(program), ctypes.addressof(code)), code


# Unfragmented UDP to port 4791, seen from the IP header on (what a raw IPv4 socket's filter sees).
ROCE_ONLY = [
    (0x30, 0, 0, 9),            # ldb [9]: protocol
    (0x15, 0, 6, 17),           # UDP, or drop
    (0x28, 0, 0, 6),            # ldh [6]: flags and fragment offset
    (0x45, 4, 0, 0x3FFF),       # a fragment (offset or more-fragments): drop
    (0xB1, 0, 0, 0),            # ldxb 4*([0]&0xf): the IP header's length
    (0x48, 0, 0, 2),            # ldh [x+2]: UDP destination port
    (0x15, 0, 1, ROCE_PORT),    # 4791, or drop
    (0x06, 0, 0, 0xFFFFFFFF),   # accept
    (0x06, 0, 0, 0),            # drop
]
DROP_ALL = [(0x06, 0, 0, 0)]


def _attach(sock: socket.socket, program: list[tuple[int, int, int, int]]) -> None:
    fprog, code = _bpf(program)
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
    del code  # the kernel copied the program


@dataclass
class RoceSockets:
    rx: socket.socket
    tx: socket.socket
    udp6: socket.socket | None = None

    def close(self) -> None:
        self.rx.close()
        self.tx.close()
        if self.udp6 is not None:
            self.udp6.close()


def open_sockets() -> RoceSockets:
    """The two sockets, non-blocking, with large buffers (bursts of a whole message's packets)."""
    try:
        rx = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
    except PermissionError as err:
        raise RoceError("RoCE needs a raw socket (CAP_NET_RAW): run the backend as root or give it the "
                        "capability") from err
    try:
        _attach(rx, ROCE_ONLY)
        rx.setblocking(False)
        _force_buffer(rx, socket.SO_RCVBUF, 33)  # SO_RCVBUFFORCE
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    except OSError:
        rx.close()
        raise
    try:
        tx.setsockopt(socket.SOL_IP, IP_TRANSPARENT, 1)
        tx.setsockopt(socket.SOL_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
        tx.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        _attach(tx, DROP_ALL)
        tx.bind(("0.0.0.0", ROCE_PORT))
        tx.setblocking(False)
        _force_buffer(tx, socket.SO_SNDBUF, 32)  # SO_SNDBUFFORCE
    except PermissionError as err:
        rx.close()
        tx.close()
        raise RoceError("RoCE sends from the guests' addresses (IP_TRANSPARENT needs CAP_NET_ADMIN): run the "
                        "backend as root or give it the capability") from err
    except OSError as err:
        rx.close()
        tx.close()
        raise RoceError(f"cannot bind UDP port {ROCE_PORT} for RoCE: {err.strerror} (is another RoCE "
                        f"endpoint, or another backend, using it in this network namespace?)") from err
    return RoceSockets(rx, tx, _open_udp6())


def _open_udp6() -> socket.socket | None:
    """The IPv6 socket, or None on a host without IPv6 (logged: IPv6 GIDs are then out of reach)."""
    try:
        udp6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    except OSError as err:
        log.warning("no IPv6 here (%s): RoCE with IPv6 GIDs is off", err.strerror)
        return None
    try:
        udp6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        udp6.setsockopt(socket.IPPROTO_IPV6, IPV6_TRANSPARENT, 1)
        udp6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVPKTINFO, 1)
        udp6.setsockopt(socket.IPPROTO_IPV6, IPV6_MTU_DISCOVER, IPV6_PMTUDISC_DO)
        udp6.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        udp6.bind(("::", ROCE_PORT))
        udp6.setblocking(False)
        _force_buffer(udp6, socket.SO_RCVBUF, 33)
        _force_buffer(udp6, socket.SO_SNDBUF, 32)
    except OSError as err:
        udp6.close()
        raise RoceError(f"cannot open the IPv6 RoCE socket (UDP [::]:{ROCE_PORT}): {err.strerror}") from err
    return udp6


def _force_buffer(sock: socket.socket, option: int, force_option: int) -> None:
    """BUFFER_BYTES, past the sysctl limit where the process may (CAP_NET_ADMIN), else as much as it allows."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, force_option, BUFFER_BYTES)
    except PermissionError:
        sock.setsockopt(socket.SOL_SOCKET, option, BUFFER_BYTES)
