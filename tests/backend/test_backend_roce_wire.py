"""RoCE v2 on the wire (the engine's roce.c) against an independent implementation: scapy's RoCE layer.

Packets the engine builds, wrapped in the IP and UDP headers a host's stack would add, decode in scapy with the same
BTH fields and an ICRC scapy computes alike; packets scapy builds parse in the engine, ICRC checked. Every
malformed packet (truncated anywhere, a bit flipped anywhere, an opcode or transport version the device does not
speak, a pad or a length that does not add up) is refused, and the parser never reads past what it was given.
"""

from __future__ import annotations

import errno
import ipaddress
import random
import zlib
from typing import Any

import pytest
from scapy.contrib.roce import BTH  # a declared test dependency (pyproject.toml): never skipped
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.packet import Raw

from vrdma.engine._engine import ffi, lib

pytestmark = pytest.mark.backend

PORT = lib.VRE_ROCE_PORT
SPORT = 49152
ADDRS = {"IPv4": ("192.0.2.1", "192.0.2.2"), "IPv6": ("2001:db8::1", "2001:db8::2")}
DF = 0x4000  # what Linux puts in an unconnected UDP socket's packets with IP_PMTUDISC_DO (and id 0)

# name: (opcode, fields of struct vre_roce_pkt, payload)
PACKETS: dict[str, tuple[int, dict[str, int], bytes]] = {
    "RC SEND only, 5 bytes (3 of pad)": (0x04, {"solicited": 1, "ackreq": 1}, b"hello"),
    "RC SEND first, 1024 bytes": (0x00, {}, bytes(range(256)) * 4),
    "RC SEND middle, 4096 bytes": (0x01, {}, bytes(random.Random(4096).randrange(256) for _ in range(4096))),
    "RC SEND last with immediate": (0x03, {"imm": 0x78563412}, b"tail!!"),
    "RC SEND only with invalidate": (0x17, {"inv_rkey": 0x1234_5601}, b"x" * 8),
    "RC RDMA WRITE only with immediate": (0x0B, {"va": 0x7F00_1234_5678, "rkey": 0xABCD_EF01, "dma_len": 7,
                                                 "imm": 0x01020304}, b"written"),
    "RC RDMA READ request": (0x0C, {"va": 0xFFFF_FFFF_0000_1000, "rkey": 0x11, "dma_len": 1 << 20}, b""),
    "RC READ response only": (0x10, {"aeth": 0x1F_00_00_2A}, b"read data"),
    "RC ACKNOWLEDGE (NAK)": (0x11, {"aeth": 0x60_00_01_00, "psn": 0xFFFFFF}, b""),
    "RC COMPARE & SWAP": (0x13, {"va": 0x1000, "rkey": 7, "swap_add": 0x0102030405060708,
                                 "compare": 0x1112131415161718}, b""),
    "RC ATOMIC ACKNOWLEDGE": (0x12, {"aeth": 0x1F000003, "orig": 0xDEAD_BEEF_CAFE_F00D}, b""),
    "UC RDMA WRITE first": (0x26, {"va": 0x2000, "rkey": 9, "dma_len": 8192}, b"w" * 64),
    "UD SEND only with immediate": (0x65, {"qkey": 0x8001_0000, "src_qpn": 0x000011, "imm": 0xAABBCCDD}, b"dgram"),
}
COMMON = {"pkey": 0xFFFF, "dest_qpn": 0x00_12_34, "psn": 0x00_AB_CD}


def roce_addr(family: str) -> Any:
    src, dst = (ipaddress.ip_address(a) for a in ADDRS[family])
    addr = ffi.new("struct vre_roce_addr *")
    as16 = (lambda a: a.packed) if family == "IPv6" else (lambda a: ipaddress.IPv6Address(f"::ffff:{a}").packed)
    addr.src, addr.dst = list(as16(src)), list(as16(dst))
    addr.sport, addr.dport = SPORT, PORT
    addr.ip_id, addr.ip_frag = 0, DF if family == "IPv4" else 0
    return addr


def build(family: str, opcode: int, fields: dict[str, int], payload: bytes) -> bytes:
    pkt = ffi.new("struct vre_roce_pkt *", {"opcode": opcode, **COMMON, **fields})
    buf = ffi.new("uint8_t[]", 8192)
    n = lib.vre_roce_build(buf, len(buf), roce_addr(family), pkt, payload, len(payload))
    assert n > 0, n
    return bytes(ffi.buffer(buf, n))


def parse(family: str, data: bytes) -> tuple[int, Any]:
    pkt = ffi.new("struct vre_roce_pkt *")
    buf = ffi.new("uint8_t[]", data)  # exactly len(data) bytes: ASan (the sanitizer tier) sees any overread
    return lib.vre_roce_parse(buf, len(data), roce_addr(family), pkt), pkt


def in_scapy(family: str, udp_payload: bytes) -> Any:
    src, dst = ADDRS[family]
    ip = IP(src=src, dst=dst, id=0, flags="DF", ttl=64) if family == "IPv4" else IPv6(src=src, dst=dst, hlim=64)
    wire = bytes(ip / UDP(sport=SPORT, dport=PORT) / Raw(udp_payload))
    return (IP if family == "IPv4" else IPv6)(wire)


@pytest.mark.parametrize("family", ["IPv4", "IPv6"])
@pytest.mark.parametrize("name", list(PACKETS))
def test_what_the_engine_builds_decodes_in_scapy_with_a_valid_icrc(family: str, name: str) -> None:
    opcode, fields, payload = PACKETS[name]
    data = build(family, opcode, fields, payload)
    decoded = in_scapy(family, data)
    bth = decoded[BTH]
    assert (bth.opcode, bth.pkey, bth.dqpn, bth.psn, bth.version) == \
        (opcode, COMMON["pkey"], COMMON["dest_qpn"], fields.get("psn", COMMON["psn"]), 0)
    assert bth.padcount == (4 - len(payload) % 4) % 4
    assert (bth.solicited, bth.ackreq) == (fields.get("solicited", 0), fields.get("ackreq", 0))
    # scapy computes the ICRC of the same packet (its own pseudo-header) and gets what the engine wrote.
    recomputed = in_scapy(family, data)
    recomputed[BTH].icrc = None
    assert bytes(recomputed[BTH])[-4:] == data[-4:]
    # And the engine parses its own packet back, field by field.
    rc, pkt = parse(family, data)
    assert rc == 0
    for field, value in {**COMMON, **fields}.items():
        assert getattr(pkt, field) == value, field
    assert bytes(data[pkt.payload_off:pkt.payload_off + pkt.payload_len]) == payload


@pytest.mark.parametrize("family", ["IPv4", "IPv6"])
def test_what_scapy_builds_parses_in_the_engine(family: str) -> None:
    src, dst = ADDRS[family]
    ip = IP(src=src, dst=dst, id=0, flags="DF") if family == "IPv4" else IPv6(src=src, dst=dst)
    reth = (0x1234_5678_9ABC).to_bytes(8, "big") + (0x55).to_bytes(4, "big") + (11).to_bytes(4, "big")
    wire = ip / UDP(sport=SPORT, dport=PORT) / BTH(opcode=0x0A, padcount=1, dqpn=0x42, psn=77, pkey=0xFFFF) / \
        Raw(reth + b"eleven byte" + b"\0")
    udp_payload = bytes(wire[UDP].payload)
    rc, pkt = parse(family, udp_payload)
    assert rc == 0
    assert (pkt.opcode, pkt.dest_qpn, pkt.psn, pkt.va, pkt.rkey, pkt.dma_len, pkt.payload_len) == \
        (0x0A, 0x42, 77, 0x1234_5678_9ABC, 0x55, 11, 11)


def test_every_truncation_and_every_flipped_bit_is_refused() -> None:
    data = build("IPv4", 0x0B, {"va": 0x1000, "rkey": 3, "dma_len": 9, "imm": 5}, b"nine byte")
    for n in range(len(data)):
        rc, _ = parse("IPv4", data[:n])
        assert rc in (-errno.EBADMSG, -errno.EILSEQ), n
    for bit in range(len(data) * 8):
        flipped = bytearray(data)
        flipped[bit // 8] ^= 1 << (bit % 8)
        rc, _ = parse("IPv4", bytes(flipped))
        # The ICRC covers every bit but the BTH's FECN, BECN and reserved bits (byte 4, above the QPN), which
        # switches may set on the way.
        if bit // 8 == 4:
            assert rc == 0, bit
        else:
            assert rc in (-errno.EBADMSG, -errno.EILSEQ), bit


@pytest.mark.parametrize("case", ["unknown opcode", "RD opcode", "transport version 1", "pad past the payload",
                                  "data where the opcode carries none", "payload not whole words",
                                  "a packet from another address"])
def test_a_malformed_packet_is_refused(case: str) -> None:
    data = bytearray(build("IPv4", 0x04, {}, b"12345678"))
    addr_family = "IPv4"
    if case == "unknown opcode":
        data[0] = 0x1F
    elif case == "RD opcode":
        data[0] = 0x44
    elif case == "transport version 1":
        data[1] |= 1
    elif case == "pad past the payload":
        data = bytearray(build("IPv4", 0x04, {}, b""))
        data[1] |= 3 << 4
    elif case == "data where the opcode carries none":
        data = bytearray(build("IPv4", 0x11, {"aeth": 0}, b""))
        data[-4:-4] = b"abcd"
    elif case == "payload not whole words":
        data[-4:-4] = b"x"
    else:
        addr_family = "IPv6"  # the same bytes between other addresses: the ICRC says no
    rc, _ = parse(addr_family, bytes(data))
    expected = -errno.EILSEQ if case == "a packet from another address" else -errno.EBADMSG
    assert rc == expected, case


def test_random_bytes_never_parse_unless_their_icrc_holds() -> None:
    rng = random.Random(4791)
    for _ in range(20000):
        data = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 80)))
        rc, _ = parse("IPv4", data)
        assert rc in (-errno.EBADMSG, -errno.EILSEQ)


def test_the_crc_is_zlibs_at_every_length_and_alignment() -> None:
    """The ICRC's CRC-32 (crc.c: folded with carry-less multiplications where the CPU has them, zlib's for the
    rest) gives zlib's result for every length across the folding's steps (16 and 64 bytes), every alignment and
    any starting value, and for whole jumbo frames."""
    rng = random.Random(32)
    data = bytes(rng.randrange(256) for _ in range(9100))
    cases = [(n, offset) for n in range(0, 300) for offset in range(16)]
    cases += [(n, rng.randrange(64)) for n in (1023, 1024, 1025, 4095, 4096, 4097, 8972, 9000)]
    for n, offset in cases:
        start = rng.getrandbits(32)
        chunk = data[offset:offset + n]
        assert lib.vre_crc32(start, ffi.from_buffer(chunk), n) == zlib.crc32(chunk, start), (n, offset)


def test_build_refuses_what_the_opcode_cannot_carry() -> None:
    buf = ffi.new("uint8_t[]", 64)
    for opcode, payload in ((0x1F, b""), (0x0C, b"data on a READ request"), (0x11, b"data on an ACK")):
        pkt = ffi.new("struct vre_roce_pkt *", {"opcode": opcode})
        assert lib.vre_roce_build(buf, len(buf), roce_addr("IPv4"), pkt, payload, len(payload)) == -errno.EINVAL
    pkt = ffi.new("struct vre_roce_pkt *", {"opcode": 0x04})
    assert lib.vre_roce_build(buf, len(buf), roce_addr("IPv4"), pkt, b"x" * 64, 64) == -errno.ENOSPC



def with_ipv4_checksum(packet: bytes) -> bytes:
    """The IPv4 packet with its header checksum made right again (so that only the change under test is wrong)."""
    ihl = (packet[0] & 0xF) * 4
    header = bytearray(packet[:ihl])
    header[10:12] = b"\0\0"
    total = sum(int.from_bytes(header[i:i + 2], "big") for i in range(0, ihl, 2))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    header[10:12] = (~total & 0xFFFF).to_bytes(2, "big")
    return bytes(header) + packet[ihl:]


def patched(packet: bytes, at: int, value: bytes) -> bytes:
    return packet[:at] + value + packet[at + len(value):]


def ip_packets() -> dict[str, tuple[bytes, int]]:
    """Whole IP packets as a receive ring holds them, each with what vre_ip_input answers: a well-formed one
    reaches the transport (no device has its GID here: -ENOENT), the rest stop at their IP or UDP header."""
    src, dst = ADDRS["IPv4"]
    src6, dst6 = ADDRS["IPv6"]
    v4 = bytes(IP(src=src, dst=dst, id=0, flags="DF") / UDP(sport=SPORT, dport=PORT, chksum=0) /
               Raw(build("IPv4", 0x04, {}, b"hello")))
    v6 = bytes(IPv6(src=src6, dst=dst6) / UDP(sport=SPORT, dport=PORT, chksum=0) /
               Raw(build("IPv6", 0x04, {}, b"hello")))
    bad = -errno.EBADMSG
    return {
        "IPv4": (v4, -errno.ENOENT),
        "IPv6": (v6, -errno.ENOENT),
        "IPv4, Ethernet padding after it": (v4 + bytes(6), -errno.ENOENT),
        "IPv4, a wrong header checksum": (patched(v4, 10, bytes([v4[10] ^ 1])), bad),
        "IPv4, a fragment (more fragments)": (with_ipv4_checksum(patched(v4, 6, b"\x20\x00")), bad),
        "IPv4, a fragment (an offset)": (with_ipv4_checksum(patched(v4, 6, b"\x40\x08")), bad),
        "IPv4, a total length past the frame": (with_ipv4_checksum(patched(v4, 2, (len(v4) + 1).to_bytes(2, "big"))),
                                                bad),
        "IPv4, a header length of 16 bytes": (with_ipv4_checksum(patched(v4, 0, b"\x44")), bad),
        "IPv4, a header length past the packet": (with_ipv4_checksum(patched(v4, 0, b"\x4f")[:40]), bad),
        "IPv4, not UDP": (with_ipv4_checksum(patched(v4, 9, b"\x06")), bad),
        "IPv4, a UDP length past the packet": (patched(v4, 24, (len(v4) - 19).to_bytes(2, "big")), bad),
        "IPv4, a UDP length under 8": (patched(v4, 24, b"\x00\x07"), bad),
        "IPv4, another UDP port": (patched(v4, 22, b"\x12\x34"), -errno.EPROTO),
        "IPv4, cut to 19 bytes": (v4[:19], bad),
        "version 5": (with_ipv4_checksum(patched(v4, 0, b"\x55")), bad),
        "IPv6, an extension header (hop-by-hop)": (patched(v6, 6, b"\x00"), bad),
        "IPv6, a payload length past the frame": (patched(v6, 4, (len(v6) - 39).to_bytes(2, "big")), bad),
        "IPv6, a UDP length past the payload": (patched(v6, 44, (len(v6) - 39).to_bytes(2, "big")), bad),
        "IPv6, an IPv4-mapped source": (patched(v6, 8, bytes(10) + b"\xff\xff" + bytes([192, 0, 2, 1])), bad),
        "IPv6, another UDP port": (patched(v6, 42, b"\x12\x34"), -errno.EPROTO),
        "IPv6, cut to 47 bytes": (v6[:47], bad),
        "nothing": (b"", bad),
    }


@pytest.mark.parametrize("case", list(ip_packets()))
def test_the_rings_ip_header_checks(case: str) -> None:
    """What a receive ring hands the engine is checked from the IP header on, before the host's stack has looked at
    it (vre_ip_input runs the rings' checks): every malformed header is counted rx_malformed, other ports' UDP is
    not RoCE and not counted, a good one reaches the transport (and, with no device for its GID, rx_no_qp)."""
    from vrdma.engine.native import Engine

    packet, expected = ip_packets()[case]
    engine = Engine(1)
    before = engine.net_counters()
    assert engine.ip_input(packet) == expected
    after = engine.net_counters()
    assert after["rx_malformed"] - before["rx_malformed"] == (expected == -errno.EBADMSG)
    assert after["rx_no_qp"] - before["rx_no_qp"] == (expected == -errno.ENOENT)
    assert after["rx_packets"] - before["rx_packets"] == (expected != -errno.EPROTO)
