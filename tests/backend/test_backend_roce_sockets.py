"""How RoCE v2 packets travel between hosts' backends (docs/interhost.md), on a real Linux path: two network
namespaces on one bridge (vrdma.harness.hosts). A packet the engine builds, sent through a raw socket with its own
IP header (identification 0, DF, a source port of its QP's: as the backend sends IPv4) or through an unconnected
UDP socket with DF set (as it sends IPv6, whose header has no identification), arrives with IP identification 0
and parses with a valid ICRC. A packet from a sender that picks its own identification (rxe does) parses only with
the identification its IP header carries: a raw socket shows it, a UDP socket does not, which is why the backend
receives below UDP.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import shutil
import struct
import sys
from collections.abc import Iterator

import pytest

from vrdma.engine._engine import ffi, lib
from vrdma.harness.hosts import HostNetwork

pytestmark = [pytest.mark.backend,
              pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"), reason="needs root and iproute2")]

PORT = lib.VRE_ROCE_PORT
A, B = "10.97.0.1", "10.97.0.2"

RECEIVER = """
import socket, sys
raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
raw.settimeout(20)
print("ready", flush=True)
while True:
    packet = raw.recv(65535)
    if packet[9] == 17 and int.from_bytes(packet[22:24], "big") == int(sys.argv[1]):
        print(packet.hex(), flush=True)
        break
"""

UDP_SENDER = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, 10, 2)  # IP_MTU_DISCOVER = IP_PMTUDISC_DO: DF set (and, unconnected, id 0)
s.bind((sys.argv[1], int(sys.argv[4])))
s.sendto(bytes.fromhex(sys.argv[3]), (sys.argv[2], int(sys.argv[4])))
"""

RAW_SENDER = """
import socket, struct, sys
src, dst, payload = sys.argv[1], sys.argv[2], bytes.fromhex(sys.argv[3])
port, ident = int(sys.argv[4]), int(sys.argv[5])
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)  # IP_HDRINCL: the header as given
udp = struct.pack("!HHHH", port, port, 8 + len(payload), 0) + payload
ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), ident, 0x4000, 64, 17, 0,
                 socket.inet_aton(src), socket.inet_aton(dst))
s.sendto(ip + udp, (dst, 0))
"""


@pytest.fixture
def fabric() -> Iterator[HostNetwork]:
    """Two hosts, 10.97.0.1 (a) and 10.97.0.2 (b), on one bridge."""
    with HostNetwork(2, subnet="10.97.0.0/24", prefix=f"vr{os.getpid() % 10000}") as hosts:
        assert (hosts[0].address, hosts[1].address) == (A, B)
        yield hosts


def addr(ip_id: int, frag: int = 0x4000) -> object:
    a = ffi.new("struct vre_roce_addr *")
    a.src = list(ipaddress.IPv6Address(f"::ffff:{A}").packed)
    a.dst = list(ipaddress.IPv6Address(f"::ffff:{B}").packed)
    a.sport, a.dport, a.ip_id, a.ip_frag = PORT, PORT, ip_id, frag
    return a


def packet(psn: int) -> bytes:
    pkt = ffi.new("struct vre_roce_pkt *", {"opcode": 0x04, "pkey": 0xFFFF, "dest_qpn": 0x11, "psn": psn})
    buf = ffi.new("uint8_t[]", 256)
    n = lib.vre_roce_build(buf, len(buf), addr(0), pkt, b"from host a", 11)
    assert n > 0
    return bytes(ffi.buffer(buf, n))


def carry(fabric: HostNetwork, sender: str, *args: str) -> bytes:
    """Run `sender` in host a with `args` while host b's raw socket listens; the IP packet b saw."""
    receiver = fabric[1].popen([sys.executable, "-c", RECEIVER, str(PORT)])
    try:
        assert receiver.stdout is not None and receiver.stderr is not None
        assert receiver.stdout.readline().strip() == "ready", receiver.stderr.read()
        sent = fabric[0].run([sys.executable, "-c", sender, *args], timeout=20)
        assert sent.returncode == 0, sent.stderr
        line = receiver.stdout.readline().strip()
        assert line, f"nothing arrived at host b: {receiver.stderr.read()}"
        return bytes.fromhex(line)
    finally:
        receiver.kill()
        receiver.wait()


def parse(ip_packet: bytes, ip_id: int | None = None) -> int:
    """Parse the UDP payload of an IPv4 packet with the identification and flags its header has (or ip_id)."""
    ident, frag = struct.unpack("!HH", ip_packet[4:8])
    payload = ip_packet[28:]
    pkt = ffi.new("struct vre_roce_pkt *")
    return int(lib.vre_roce_parse(payload, len(payload), addr(ident if ip_id is None else ip_id, frag), pkt))


def test_a_packet_sent_through_an_unconnected_udp_socket_with_df_parses_on_the_other_host(
        fabric: HostNetwork) -> None:
    data = packet(psn=1)
    arrived = carry(fabric, UDP_SENDER, A, B, data.hex(), str(PORT))
    ident, frag = struct.unpack("!HH", arrived[4:8])
    assert (ident, frag) == (0, 0x4000)  # what the builder assumed for the ICRC
    assert arrived[28:] == data
    assert parse(arrived) == 0


def test_a_packet_with_its_own_headers_identification_0_and_df_keeps_them_on_the_way(fabric: HostNetwork) -> None:
    """The backend's IPv4 send path: Linux fills in the checksum of a header given through IPPROTO_RAW, and would
    choose an identification for a 0 in a packet that may be fragmented; with DF it keeps the 0 the ICRC covers."""
    data = packet(psn=3)
    arrived = carry(fabric, RAW_SENDER, A, B, data.hex(), str(PORT), "0")
    ident, frag = struct.unpack("!HH", arrived[4:8])
    assert (ident, frag) == (0, 0x4000)
    assert arrived[28:] == data
    assert parse(arrived) == 0


def test_a_senders_own_ip_identification_needs_the_ip_header_to_check_the_icrc(fabric: HostNetwork) -> None:
    """A sender that writes its own IP header (rxe's way) with identification 0x1234: the ICRC holds with the
    identification the raw socket shows, and not with the 0 a UDP socket's reader would have to assume."""
    payload = ffi.new("uint8_t[]", 256)
    pkt = ffi.new("struct vre_roce_pkt *", {"opcode": 0x04, "pkey": 0xFFFF, "dest_qpn": 0x11, "psn": 2})
    n = lib.vre_roce_build(payload, len(payload), addr(0x1234), pkt, b"from host a", 11)
    assert n > 0
    arrived = carry(fabric, RAW_SENDER, A, B, bytes(ffi.buffer(payload, n)).hex(), str(PORT), str(0x1234))
    assert struct.unpack("!H", arrived[4:6])[0] == 0x1234
    assert parse(arrived) == 0
    assert parse(arrived, ip_id=0) == -errno.EILSEQ



def test_the_engine_makes_rings_only_of_packet_sockets_and_says_why_not() -> None:
    """vre_net_attach: a socket that cannot be a receive ring (a UDP socket), too many rings, or none with a send
    socket are refused with the step that failed, and the engine keeps nothing of them; packet sockets become
    rings (two of them one fanout group), and the engine gives them back."""
    import socket

    from vrdma.daemon.roce import open_sockets
    from vrdma.engine.api import EngineError
    from vrdma.engine.native import Engine

    engine = Engine(1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp, \
            socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW) as tx:
        with pytest.raises(EngineError, match=r"receive ring 0 .*TPACKET_V2") as refused:
            engine.attach_network([udp.fileno()], tx.fileno())
        assert refused.value.errno != 0
        with pytest.raises(EngineError, match="1 to 64 receive rings, got 65"):
            engine.attach_network([udp.fileno()] * 65, tx.fileno())
        with pytest.raises(EngineError, match="receive rings"):
            engine.attach_network([], tx.fileno())
        with pytest.raises(EngineError, match="IPv6"):  # IPv6 rings without the IPv6 send socket
            engine.attach_network([udp.fileno()], tx.fileno(), [udp.fileno()])
    assert engine.net_counters()["rx_packets"] == 0
    for _ in range(2):  # (a socket becomes a ring once: another attach takes new ones, as a restart does)
        sockets = open_sockets(rings=2)
        try:
            udp6 = sockets.udp6.fileno() if sockets.udp6 is not None else -1
            engine.attach_network([ring.fileno() for ring in sockets.rx], sockets.tx.fileno(),
                                  [ring.fileno() for ring in sockets.rx6], udp6)
            with pytest.raises(EngineError, match=r"TPACKET_V2.*busy"):
                engine.attach_network([sockets.rx[0].fileno()], sockets.tx.fileno())
            assert engine.net_counters()["rx_packets"] == 0
            engine.attach_network([], -1)
        finally:
            sockets.close()


@pytest.mark.parametrize("refusal", [errno.EPERM, errno.EAFNOSUPPORT], ids=["no CAP_NET_RAW", "no AF_PACKET"])
def test_sockets_the_host_refuses_are_a_clear_error_and_nothing_stays_open(
        monkeypatch: pytest.MonkeyPatch, refusal: int) -> None:
    """Without the capability (EPERM) or in a sandbox without AF_PACKET (EAFNOSUPPORT, systemd's
    RestrictAddressFamilies), the backend says what to grant and closes what it had opened."""
    import socket

    from vrdma.daemon import roce

    made: list[socket.socket] = []
    real = socket.socket

    def refusing(family: int = -1, *args: object) -> socket.socket:
        if family == socket.AF_PACKET and made:  # the second ring's socket: the first must be closed again
            raise OSError(refusal, os.strerror(refusal)) if refusal != errno.EPERM else PermissionError(
                refusal, os.strerror(refusal))
        sock = real(family, *args)  # type: ignore[arg-type]
        made.append(sock)
        return sock

    monkeypatch.setattr(roce.socket, "socket", refusing)
    with pytest.raises(roce.RoceError, match="CAP_NET_RAW" if refusal == errno.EPERM else "AF_PACKET"):
        roce.open_sockets(rings=2)
    assert made and all(sock.fileno() == -1 for sock in made)  # closed
