"""The backend's RoCE v2 sockets (`vrdma-backend --roce`): opened here, with the privileges they need, and handed to
the data engine, which reads and writes them from its polling loop (engine.h, vre_net_attach).

- Receiving: AF_PACKET sockets, one per engine thread, which the engine makes mapped rings (TPACKET_V2) joined in
  one fanout group (engine.h, vre_net_attach), so that each packet arrives with its IP header (the invariant CRC
  covers its identification word, which a UDP socket never shows: docs/interhost.md) and the flows are shared
  among the threads; filtered in the kernel by a classic BPF program to this host's unfragmented UDP for port
  4791. They are opened with protocol 0, so that nothing arrives before the engine has its rings.
- Sending: a raw IPv4 socket (IPPROTO_RAW: the engine writes each packet's IP and UDP headers, from a guest's
  address, which is not the host's, and from its QP's UDP source port, with don't-fragment and identification 0,
  the values the engine's ICRC assumes).
- The guard: a UDP socket bound to port 4791, which keeps the host's UDP from answering RoCE packets for the
  guests with ICMP port unreachable; a drop-everything filter keeps it from queueing them.
- IPv6: rings of their own (a packet socket is bound to one protocol) receive, filtered to UDP as the next header
  for port 4791; one UDP socket bound to [::]:4791 (IPV6_V6ONLY, IPV6_TRANSPARENT, don't-fragment) sends, an IPv6
  header having no identification for the ICRC to cover, and guards the port with a drop-everything filter. On a
  host without IPv6 there is none of them, and IPv6 GIDs stay out of reach.

They need CAP_NET_RAW (root, in the harness); IPv6 sends from the guests' addresses with IPV6_TRANSPARENT, which
needs CAP_NET_ADMIN. How packets for the guests' addresses reach this host's stack (routing, nftables) is the
operator's part: docs/interhost.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import socket
import struct
from dataclasses import dataclass

from vrdma.errors import VrdmaError

log = logging.getLogger(__name__)

ROCE_PORT = 4791
SO_ATTACH_FILTER = 26
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


# Unfragmented UDP to port 4791 addressed to this host (not a copy of what it sends, nor another host's frame),
# seen from the IP header on (what a SOCK_DGRAM packet socket's filter sees).
PACKET_HOST = 0
SKF_AD_PKTTYPE = 0xFFFFF000 + 4  # SKF_AD_OFF + SKF_AD_PKTTYPE: the frame's packet type
ROCE_ONLY = [
    (0x20, 0, 0, SKF_AD_PKTTYPE),  # ld pkttype
    (0x15, 0, 8, PACKET_HOST),  # for this host, or drop
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
# IPv6: UDP as the next header (RoCE v2 uses no extension headers) to port 4791, addressed to this host.
ROCE6_ONLY = [
    (0x20, 0, 0, SKF_AD_PKTTYPE),  # ld pkttype
    (0x15, 0, 5, PACKET_HOST),  # for this host, or drop
    (0x30, 0, 0, 6),            # ldb [6]: next header
    (0x15, 0, 3, 17),           # UDP, or drop
    (0x28, 0, 0, 42),           # ldh [40+2]: UDP destination port
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
    rx: list[socket.socket]
    tx: socket.socket
    guard: socket.socket
    rx6: list[socket.socket]
    udp6: socket.socket | None = None

    def close(self) -> None:
        for sock in (*self.rx, self.tx, self.guard, *self.rx6, *((self.udp6,) if self.udp6 is not None else ())):
            sock.close()


def open_sockets(rings: int = 1) -> RoceSockets:
    """The receive sockets (`rings`: one per engine thread), the send socket, the guard and the IPv6 socket."""
    with contextlib.ExitStack() as opened:
        try:
            rx = [_ring_socket(opened, ROCE_ONLY) for _ in range(rings)]
            # IPPROTO_RAW: the engine writes the IP and UDP headers (IP_HDRINCL), from any address of its guests'
            tx = opened.enter_context(socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW))
            tx.setblocking(False)
            _force_buffer(tx, socket.SO_SNDBUF, 32)  # SO_SNDBUFFORCE
        except PermissionError as err:
            raise RoceError("RoCE receives through packet sockets and sends through a raw one (CAP_NET_RAW): run "
                            "the backend as root or give it the capability") from err
        except OSError as err:  # EAFNOSUPPORT where a sandbox (systemd's RestrictAddressFamilies) leaves AF_PACKET out
            raise RoceError(f"cannot open RoCE's packet and raw sockets: {err.strerror} (as a service, install the "
                            f"roce.conf drop-in: it allows AF_PACKET and CAP_NET_RAW)") from err
        guard = opened.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        try:
            guard.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            _attach(guard, DROP_ALL)
            guard.bind(("0.0.0.0", ROCE_PORT))
        except OSError as err:
            raise RoceError(f"cannot bind UDP port {ROCE_PORT} for RoCE: {err.strerror} (is another RoCE "
                            f"endpoint, or another backend, using it in this network namespace?)") from err
        udp6 = _open_udp6()
        rx6 = []
        if udp6 is not None:
            opened.enter_context(udp6)
            rx6 = [_ring_socket(opened, ROCE6_ONLY) for _ in range(rings)]
        opened.pop_all()
    return RoceSockets(rx, tx, guard, rx6, udp6)


def _ring_socket(opened: contextlib.ExitStack, program: list[tuple[int, int, int, int]]) -> socket.socket:
    """A packet socket for one of the engine's receive rings: filtered, not yet bound (nothing arrives)."""
    sock = opened.enter_context(socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, 0))
    _attach(sock, program)
    sock.setblocking(False)
    return sock


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
        udp6.setsockopt(socket.IPPROTO_IPV6, IPV6_MTU_DISCOVER, IPV6_PMTUDISC_DO)
        udp6.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        _attach(udp6, DROP_ALL)  # (it only sends, and guards the port: the rings receive)
        udp6.bind(("::", ROCE_PORT))
        udp6.setblocking(False)
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
