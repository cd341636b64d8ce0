// SPDX-License-Identifier: GPL-2.0-only
/*
 * RoCE v2 on the wire: the InfiniBand transport headers (BTH and the extension headers) a packet carries in its
 * UDP payload, and the invariant CRC (ICRC) that ends it. An opcode table says which extension headers each opcode
 * carries and whether it may carry data, as the InfiniBand specification's tables do (and rxe's rxe_opcode.c); the
 * parser checks a packet against it, field by field, before anything reads further: the transport version, the
 * lengths (headers, payload, pad), the ICRC. Nothing here knows sockets: the packet's IP and UDP headers come as a
 * struct vre_roce_addr (the ICRC covers their invariant fields).
 *
 * Wire structs are declared once, with their sizes checked; multi-byte fields are big-endian on the wire, and
 * 64-bit fields of the 4-byte-aligned headers are two 32-bit halves.
 */
#include <endian.h>
#include <errno.h>
#include <string.h>
#include <zlib.h>

#include "vre.h"

struct roce_bth {
	uint8_t opcode;
	uint8_t flags;            /* SE (0x80), MigReq (0x40), PadCnt (0x30), TVer (0x0f) */
	uint16_t pkey;
	uint32_t dest_qpn;        /* FECN (bit 31), BECN (bit 30), reserved, destination QP (24 bits) */
	uint32_t psn;             /* AckReq (bit 31), reserved, PSN (24 bits) */
};

struct roce_reth {
	uint32_t va[2];
	uint32_t rkey;
	uint32_t dma_len;
};

struct roce_atomic_eth {
	uint32_t va[2];
	uint32_t rkey;
	uint32_t swap_add[2];
	uint32_t compare[2];
};

struct roce_atomic_ack_eth {
	uint32_t orig[2];
};

struct roce_deth {
	uint32_t qkey;
	uint32_t src_qpn;         /* reserved (8 bits), source QP (24 bits) */
};

_Static_assert(sizeof(struct roce_bth) == 12, "BTH");
_Static_assert(sizeof(struct roce_reth) == 16, "RETH");
_Static_assert(sizeof(struct roce_atomic_eth) == 28, "AtomicETH");
_Static_assert(sizeof(struct roce_atomic_ack_eth) == 8, "AtomicAckETH");
_Static_assert(sizeof(struct roce_deth) == 8, "DETH");

#define BTH_SE 0x80
#define BTH_MIGREQ 0x40
#define BTH_PAD_SHIFT 4
#define BTH_TVER_MASK 0x0f
#define BTH_FECN (1u << 31)
#define BTH_BECN (1u << 30)
#define BTH_ACKREQ (1u << 31)
#define MASK24 0xffffffu
#define ICRC_SIZE 4

/* Header sizes, in the order they follow the BTH (DETH, RETH or AtomicETH, AETH, AtomicAckETH, ImmDt or IETH). */
static const struct {
	uint16_t flag;
	uint8_t size;
} header_order[] = {
	{ VRE_ROCE_DETH, sizeof(struct roce_deth) },
	{ VRE_ROCE_RETH, sizeof(struct roce_reth) },
	{ VRE_ROCE_ATOMIC_ETH, sizeof(struct roce_atomic_eth) },
	{ VRE_ROCE_AETH, 4 },
	{ VRE_ROCE_ATOMIC_ACK_ETH, sizeof(struct roce_atomic_ack_eth) },
	{ VRE_ROCE_IMM, 4 },
	{ VRE_ROCE_IETH, 4 },
};

#define P VRE_ROCE_PAYLOAD
#define RC(op) (0x00 | (op))
#define UC(op) (0x20 | (op))
#define UD(op) (0x60 | (op))

/* What each opcode the device speaks carries (transport in the top 3 bits: RC 0x00, UC 0x20, UD 0x60); 0: unknown. */
static const uint16_t opcode_headers[256] = {
	[RC(0x00)] = P, [RC(0x01)] = P, [RC(0x02)] = P,                 /* SEND first, middle, last */
	[RC(0x03)] = P | VRE_ROCE_IMM, [RC(0x04)] = P, [RC(0x05)] = P | VRE_ROCE_IMM,   /* last+imm, only, only+imm */
	[RC(0x06)] = P | VRE_ROCE_RETH, [RC(0x07)] = P, [RC(0x08)] = P, /* RDMA WRITE first, middle, last */
	[RC(0x09)] = P | VRE_ROCE_IMM, [RC(0x0a)] = P | VRE_ROCE_RETH,  /* last+imm, only */
	[RC(0x0b)] = P | VRE_ROCE_RETH | VRE_ROCE_IMM,                  /* only+imm */
	[RC(0x0c)] = VRE_ROCE_RETH,                                     /* RDMA READ request */
	[RC(0x0d)] = P | VRE_ROCE_AETH, [RC(0x0e)] = P,                 /* READ response first, middle */
	[RC(0x0f)] = P | VRE_ROCE_AETH, [RC(0x10)] = P | VRE_ROCE_AETH, /* last, only */
	[RC(0x11)] = VRE_ROCE_AETH,                                     /* ACKNOWLEDGE */
	[RC(0x12)] = VRE_ROCE_AETH | VRE_ROCE_ATOMIC_ACK_ETH,           /* ATOMIC ACKNOWLEDGE */
	[RC(0x13)] = VRE_ROCE_ATOMIC_ETH, [RC(0x14)] = VRE_ROCE_ATOMIC_ETH,  /* COMPARE & SWAP, FETCH & ADD */
	[RC(0x16)] = P | VRE_ROCE_IETH, [RC(0x17)] = P | VRE_ROCE_IETH, /* SEND last, only with invalidate */
	[UC(0x00)] = P, [UC(0x01)] = P, [UC(0x02)] = P,
	[UC(0x03)] = P | VRE_ROCE_IMM, [UC(0x04)] = P, [UC(0x05)] = P | VRE_ROCE_IMM,
	[UC(0x06)] = P | VRE_ROCE_RETH, [UC(0x07)] = P, [UC(0x08)] = P,
	[UC(0x09)] = P | VRE_ROCE_IMM, [UC(0x0a)] = P | VRE_ROCE_RETH, [UC(0x0b)] = P | VRE_ROCE_RETH | VRE_ROCE_IMM,
	[UD(0x04)] = P | VRE_ROCE_DETH, [UD(0x05)] = P | VRE_ROCE_DETH | VRE_ROCE_IMM,  /* SEND only, only+imm */
};
#undef P
#undef RC
#undef UC
#undef UD

/* CRC-32 (the Ethernet polynomial, reflected), continued from crc: standard CRC-32 is crc32(~0, ...) ^ ~0, which is
 * zlib's crc32() (several GB/s: every packet's ICRC covers all of it, both ways). */
static uint32_t crc32_update(uint32_t crc, const uint8_t *p, size_t n)
{
	return ~(uint32_t)crc32(~crc, p, (uInt)n);
}

static void put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)(v >> 8);
	p[1] = (uint8_t)v;
}

/*
 * The ICRC of a UDP payload of len bytes (ICRC excluded) between addr: CRC-32 over 8 bytes of ones (the LRH a RoCE
 * v2 packet does not have), the IP header with its variant fields as ones (IPv4: type of service, TTL, checksum;
 * IPv6: traffic class, flow label, hop limit), the UDP header with its checksum as ones, the BTH with its variant
 * byte (FECN, BECN, reserved) as ones, and the rest of the payload.
 */
static uint32_t icrc(const struct vre_roce_addr *addr, const uint8_t *udp_payload, uint32_t len)
{
	uint8_t pseudo[8 + 40 + 8 + sizeof(struct roce_bth)];
	uint32_t udp_len = len + ICRC_SIZE + 8, n;
	uint8_t *ip = pseudo + 8, *udp;

	memset(pseudo, 0xff, 8);
	if (ipv4_mapped(addr->src)) {
		ip[0] = 0x45;
		ip[1] = 0xff;
		put16(ip + 2, (uint16_t)(udp_len + 20));
		put16(ip + 4, addr->ip_id);
		put16(ip + 6, addr->ip_frag);
		ip[8] = 0xff;
		ip[9] = 17;  /* UDP */
		put16(ip + 10, 0xffff);
		memcpy(ip + 12, addr->src + 12, 4);
		memcpy(ip + 16, addr->dst + 12, 4);
		udp = ip + 20;
	} else {
		memset(ip, 0xff, 4);  /* version 6 as ones too: the specification masks the whole first word but the
				       * version; version is 6 (0x6f, 0xff, 0xff, 0xff) */
		ip[0] = 0x6f;
		put16(ip + 4, (uint16_t)udp_len);
		ip[6] = 17;
		ip[7] = 0xff;
		memcpy(ip + 8, addr->src, 16);
		memcpy(ip + 24, addr->dst, 16);
		udp = ip + 40;
	}
	put16(udp, addr->sport);
	put16(udp + 2, addr->dport);
	put16(udp + 4, (uint16_t)udp_len);
	put16(udp + 6, 0xffff);
	memcpy(udp + 8, udp_payload, sizeof(struct roce_bth));
	udp[8 + 4] = 0xff;  /* FECN, BECN, reserved */
	n = (uint32_t)(udp + 8 + sizeof(struct roce_bth) - pseudo);
	return ~crc32_update(crc32_update(~0u, pseudo, n), udp_payload + sizeof(struct roce_bth),
			     len - sizeof(struct roce_bth));
}

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint64_t get64(const uint8_t *p)
{
	return (uint64_t)get32(p) << 32 | get32(p + 4);
}

static void put32(uint8_t *p, uint32_t v)
{
	put16(p, (uint16_t)(v >> 16));
	put16(p + 2, (uint16_t)v);
}

static void put64(uint8_t *p, uint64_t v)
{
	put32(p, (uint32_t)(v >> 32));
	put32(p + 4, (uint32_t)v);
}

/* The extension headers of `headers` after the BTH at p: read into (parse) or written from (build) pkt. */
static uint32_t ext_headers(uint8_t *p, uint16_t headers, struct vre_roce_pkt *pkt, bool write)
{
	uint32_t off = 0;

	for (size_t i = 0; i < sizeof(header_order) / sizeof(header_order[0]); i++) {
		uint8_t *h = p + off;

		if (!(headers & header_order[i].flag))
			continue;
		switch (header_order[i].flag) {
		case VRE_ROCE_DETH:
			if (write) {
				put32(h, pkt->qkey);
				put32(h + 4, pkt->src_qpn & MASK24);
			} else {
				pkt->qkey = get32(h);
				pkt->src_qpn = get32(h + 4) & MASK24;
			}
			break;
		case VRE_ROCE_RETH:
		case VRE_ROCE_ATOMIC_ETH:
			if (write) {
				put64(h, pkt->va);
				put32(h + 8, pkt->rkey);
			} else {
				pkt->va = get64(h);
				pkt->rkey = get32(h + 8);
			}
			if (header_order[i].flag == VRE_ROCE_RETH) {
				if (write)
					put32(h + 12, pkt->dma_len);
				else
					pkt->dma_len = get32(h + 12);
			} else if (write) {
				put64(h + 12, pkt->swap_add);
				put64(h + 20, pkt->compare);
			} else {
				pkt->swap_add = get64(h + 12);
				pkt->compare = get64(h + 20);
			}
			break;
		case VRE_ROCE_AETH:
			if (write)
				put32(h, pkt->aeth);
			else
				pkt->aeth = get32(h);
			break;
		case VRE_ROCE_ATOMIC_ACK_ETH:
			if (write)
				put64(h, pkt->orig);
			else
				pkt->orig = get64(h);
			break;
		case VRE_ROCE_IMM:
			if (write)
				memcpy(h, &pkt->imm, 4);  /* as the verbs carry it: network order already */
			else
				memcpy(&pkt->imm, h, 4);
			break;
		case VRE_ROCE_IETH:
			if (write)
				put32(h, pkt->inv_rkey);
			else
				pkt->inv_rkey = get32(h);
			break;
		}
		off += header_order[i].size;
	}
	return off;
}

static uint32_t headers_size(uint16_t headers)
{
	uint32_t size = sizeof(struct roce_bth);

	for (size_t i = 0; i < sizeof(header_order) / sizeof(header_order[0]); i++)
		size += headers & header_order[i].flag ? header_order[i].size : 0;
	return size;
}

VRE_FN uint32_t roce_header_len(uint8_t opcode)
{
	return headers_size(opcode_headers[opcode]);
}

int vre_roce_parse(const uint8_t *udp_payload, uint32_t len, const struct vre_roce_addr *addr,
		   struct vre_roce_pkt *pkt)
{
	uint16_t headers;
	uint32_t hdr_len, word, data;
	uint8_t flags;

	memset(pkt, 0, sizeof(*pkt));
	if (len < sizeof(struct roce_bth) + ICRC_SIZE)
		return -EBADMSG;
	headers = opcode_headers[udp_payload[0]];
	flags = udp_payload[1];
	if (!headers || (flags & BTH_TVER_MASK) != 0)
		return -EBADMSG;  /* an opcode this device does not speak, or another transport version */
	hdr_len = headers_size(headers);
	if (len - ICRC_SIZE < hdr_len)
		return -EBADMSG;
	data = len - ICRC_SIZE - hdr_len;
	pkt->pad = (flags >> BTH_PAD_SHIFT) & 3;
	if ((data & 3) || pkt->pad > data || (!(headers & VRE_ROCE_PAYLOAD) && data))
		return -EBADMSG;  /* payload and pad make whole words; no data where the opcode carries none */
	{
		uint32_t want = icrc(addr, udp_payload, len - ICRC_SIZE), got;

		memcpy(&got, udp_payload + len - ICRC_SIZE, 4);  /* the ICRC travels least significant byte first */
		if (le32toh(got) != want)
			return -EILSEQ;
	}
	pkt->opcode = udp_payload[0];
	pkt->solicited = !!(flags & BTH_SE);
	pkt->migreq = !!(flags & BTH_MIGREQ);
	pkt->pkey = (uint16_t)(udp_payload[2] << 8 | udp_payload[3]);
	word = get32(udp_payload + 4);
	pkt->fecn = !!(word & BTH_FECN);
	pkt->becn = !!(word & BTH_BECN);
	pkt->dest_qpn = word & MASK24;
	word = get32(udp_payload + 8);
	pkt->ackreq = !!(word & BTH_ACKREQ);
	pkt->psn = word & MASK24;
	pkt->headers = headers;
	ext_headers((uint8_t *)(uintptr_t)udp_payload + sizeof(struct roce_bth), headers, pkt, false);
	pkt->payload_off = hdr_len;
	pkt->payload_len = data - pkt->pad;
	return 0;
}

int vre_roce_build(uint8_t *buf, uint32_t room, const struct vre_roce_addr *addr, const struct vre_roce_pkt *pkt,
		   const uint8_t *payload, uint32_t payload_len)
{
	uint16_t headers = opcode_headers[pkt->opcode];
	uint32_t hdr_len, pad, len, crc;
	struct vre_roce_pkt fields = *pkt;

	if (!headers || (payload_len && !(headers & VRE_ROCE_PAYLOAD)) || payload_len > UINT32_MAX - 64)
		return -EINVAL;
	hdr_len = headers_size(headers);
	pad = (4 - (payload_len & 3)) & 3;
	len = hdr_len + payload_len + pad + ICRC_SIZE;
	if (len > room)
		return -ENOSPC;
	buf[0] = pkt->opcode;
	buf[1] = (uint8_t)((pkt->solicited ? BTH_SE : 0) | (pkt->migreq ? BTH_MIGREQ : 0) | pad << BTH_PAD_SHIFT);
	put16(buf + 2, pkt->pkey);
	put32(buf + 4, (pkt->fecn ? BTH_FECN : 0) | (pkt->becn ? BTH_BECN : 0) | (pkt->dest_qpn & MASK24));
	put32(buf + 8, (pkt->ackreq ? BTH_ACKREQ : 0) | (pkt->psn & MASK24));
	ext_headers(buf + sizeof(struct roce_bth), headers, &fields, true);
	if (payload_len && payload != buf + hdr_len)  /* the engine's senders gather the payload in place */
		memcpy(buf + hdr_len, payload, payload_len);
	memset(buf + hdr_len + payload_len, 0, pad);
	crc = htole32(icrc(addr, buf, len - ICRC_SIZE));
	memcpy(buf + len - ICRC_SIZE, &crc, 4);
	return (int)len;
}
