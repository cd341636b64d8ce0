// SPDX-License-Identifier: GPL-2.0-only
/*
 * RoCE v2 on the wire: the InfiniBand transport headers (BTH and the extension headers) a packet carries in its
 * UDP payload, and the invariant CRC (ICRC) that ends it. The wire opcode table (wire.c) says which extension
 * headers each opcode carries and whether it may carry data; the parser checks a packet against it, field by
 * field, before anything reads further: the transport version, the lengths (headers, payload, pad), the ICRC.
 * Nothing here knows sockets: the packet's IP and UDP headers come as a
 * struct vre_roce_addr (the ICRC covers their invariant fields).
 *
 * Wire structs are declared once, with their sizes checked; multi-byte fields are big-endian on the wire, and
 * 64-bit fields of the 4-byte-aligned headers are two 32-bit halves.
 */
#include <endian.h>
#include <errno.h>
#include <string.h>

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
		be16_put(ip + 2, (uint16_t)(udp_len + 20));
		be16_put(ip + 4, addr->ip_id);
		be16_put(ip + 6, addr->ip_frag);
		ip[8] = 0xff;
		ip[9] = 17;  /* UDP */
		be16_put(ip + 10, 0xffff);
		memcpy(ip + 12, addr->src + 12, 4);
		memcpy(ip + 16, addr->dst + 12, 4);
		udp = ip + 20;
	} else {
		memset(ip, 0xff, 4);  /* version 6 as ones too: the specification masks the whole first word but the
				       * version; version is 6 (0x6f, 0xff, 0xff, 0xff) */
		ip[0] = 0x6f;
		be16_put(ip + 4, (uint16_t)udp_len);
		ip[6] = 17;
		ip[7] = 0xff;
		memcpy(ip + 8, addr->src, 16);
		memcpy(ip + 24, addr->dst, 16);
		udp = ip + 40;
	}
	be16_put(udp, addr->sport);
	be16_put(udp + 2, addr->dport);
	be16_put(udp + 4, (uint16_t)udp_len);
	be16_put(udp + 6, 0xffff);
	memcpy(udp + 8, udp_payload, sizeof(struct roce_bth));
	udp[8 + 4] = 0xff;  /* FECN, BECN, reserved */
	n = (uint32_t)(udp + 8 + sizeof(struct roce_bth) - pseudo);
	/* (crc.c: every packet's ICRC covers all of it, both ways) */
	return ~vre_crc32_update(vre_crc32_update(~0u, pseudo, n), udp_payload + sizeof(struct roce_bth),
			     len - sizeof(struct roce_bth));
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
				be32_put(h, pkt->qkey);
				be32_put(h + 4, pkt->src_qpn & ROCE_QPN_MASK);
			} else {
				pkt->qkey = be32_get(h);
				pkt->src_qpn = be32_get(h + 4) & ROCE_QPN_MASK;
			}
			break;
		case VRE_ROCE_RETH:
		case VRE_ROCE_ATOMIC_ETH:
			if (write) {
				be64_put(h, pkt->va);
				be32_put(h + 8, pkt->rkey);
			} else {
				pkt->va = be64_get(h);
				pkt->rkey = be32_get(h + 8);
			}
			if (header_order[i].flag == VRE_ROCE_RETH) {
				if (write)
					be32_put(h + 12, pkt->dma_len);
				else
					pkt->dma_len = be32_get(h + 12);
			} else if (write) {
				be64_put(h + 12, pkt->swap_add);
				be64_put(h + 20, pkt->compare);
			} else {
				pkt->swap_add = be64_get(h + 12);
				pkt->compare = be64_get(h + 20);
			}
			break;
		case VRE_ROCE_AETH:
			if (write)
				be32_put(h, pkt->aeth);
			else
				pkt->aeth = be32_get(h);
			break;
		case VRE_ROCE_ATOMIC_ACK_ETH:
			if (write)
				be64_put(h, pkt->orig);
			else
				pkt->orig = be64_get(h);
			break;
		case VRE_ROCE_IMM:
			if (write)
				memcpy(h, &pkt->imm, 4);  /* as the verbs carry it: network order already */
			else
				memcpy(&pkt->imm, h, 4);
			break;
		case VRE_ROCE_IETH:
			if (write)
				be32_put(h, pkt->inv_rkey);
			else
				pkt->inv_rkey = be32_get(h);
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
	return headers_size(roce_op(opcode)->headers);
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
	headers = roce_op(udp_payload[0])->headers;
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
	pkt->pkey = be16_get(udp_payload + 2);
	word = be32_get(udp_payload + 4);
	pkt->fecn = !!(word & BTH_FECN);
	pkt->becn = !!(word & BTH_BECN);
	pkt->dest_qpn = word & ROCE_QPN_MASK;
	word = be32_get(udp_payload + 8);
	pkt->ackreq = !!(word & BTH_ACKREQ);
	pkt->psn = word & PSN_MASK;
	pkt->headers = headers;
	ext_headers((uint8_t *)(uintptr_t)udp_payload + sizeof(struct roce_bth), headers, pkt, false);
	pkt->payload_off = hdr_len;
	pkt->payload_len = data - pkt->pad;
	return 0;
}

int vre_roce_build(uint8_t *buf, uint32_t room, const struct vre_roce_addr *addr, const struct vre_roce_pkt *pkt,
		   const uint8_t *payload, uint32_t payload_len)
{
	uint16_t headers = roce_op(pkt->opcode)->headers;
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
	be16_put(buf + 2, pkt->pkey);
	be32_put(buf + 4, (pkt->fecn ? BTH_FECN : 0) | (pkt->becn ? BTH_BECN : 0) | (pkt->dest_qpn & ROCE_QPN_MASK));
	be32_put(buf + 8, (pkt->ackreq ? BTH_ACKREQ : 0) | (pkt->psn & PSN_MASK));
	ext_headers(buf + sizeof(struct roce_bth), headers, &fields, true);
	if (payload_len && payload != buf + hdr_len)  /* the engine's senders gather the payload in place */
		memcpy(buf + hdr_len, payload, payload_len);
	memset(buf + hdr_len + payload_len, 0, pad);
	crc = htole32(icrc(addr, buf, len - ICRC_SIZE));
	memcpy(buf + len - ICRC_SIZE, &crc, 4);
	return (int)len;
}
