// SPDX-License-Identifier: GPL-2.0-only
/*
 * The engine's only contact with file descriptors: the two sockets the daemon opened for RoCE and handed over
 * (vre_net_attach), read and written in batches from the polling loop. Nothing else in the engine makes a system
 * call on a descriptor; the device model (Python) never sees these.
 *
 * Receiving: a raw IPv4 socket of protocol UDP gets each UDP packet addressed to this host (the daemon filters it
 * to port 4791) with its IP header, whose identification and flags the ICRC covers (docs/interhost.md). The IP and
 * UDP headers are checked here (version, lengths, no fragments, port), the rest is the input function's the loop
 * gives (vre_roce_input: the engine's entry point sits above this file, which only moves bytes).
 *
 * Sending: an unconnected UDP socket bound to port 4791, don't-fragment on, allowed to send from addresses that are
 * not the host's (IP_TRANSPARENT): each packet goes from its QP's GID (IP_PKTINFO) to its peer's, and Linux writes
 * identification 0, the value the packet's ICRC was computed with.
 *
 * IPv6: one UDP socket does both, since the ICRC of an IPv6 packet covers nothing its reader does not see (the
 * addresses, from the source address and IPV6_PKTINFO; the lengths).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE  /* recvmmsg, sendmmsg */
#endif
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "vre.h"

#define RX_BATCH 32
#define RX_ROOM 9216              /* a jumbo frame's IP packet */
#define TX_BATCH 64

/* One IPv4 packet from the raw socket: its UDP payload to the engine if it is whole, unfragmented and for 4791. */
static void ipv4_packet(struct vre_engine *e, const uint8_t *ip, uint32_t len, vre_input_fn input)
{
	struct vre_roce_addr addr;
	uint32_t ihl, total, udp_len;
	const uint8_t *udp;

	if (len < 20 || (ip[0] >> 4) != 4)
		goto malformed;
	ihl = (uint32_t)(ip[0] & 0xf) * 4;
	total = be16_get(ip + 2);
	if (ihl < 20 || total > len || total < ihl + 8 || ip[9] != 17)
		goto malformed;
	udp = ip + ihl;
	if (be16_get(udp + 2) != VRE_ROCE_PORT)
		return;  /* someone else's UDP (the daemon's filter normally keeps it away) */
	udp_len = be16_get(udp + 4);
	if ((be16_get(ip + 6) & 0x3fff) || udp_len < 8 || udp_len > total - ihl)
		goto malformed;  /* a fragment (RoCE is never fragmented), or UDP lengths that do not add up */
	memset(&addr, 0, sizeof(addr));
	memcpy(addr.src, ipv4_mapped_prefix, 12);
	memcpy(addr.src + 12, ip + 12, 4);
	memcpy(addr.dst, ipv4_mapped_prefix, 12);
	memcpy(addr.dst + 12, ip + 16, 4);
	addr.sport = be16_get(udp);
	addr.dport = VRE_ROCE_PORT;
	addr.ip_id = be16_get(ip + 4);
	addr.ip_frag = be16_get(ip + 6);
	input(e, udp + 8, udp_len - 8, &addr);
	return;
malformed:
	net_count(&e->net.rx_packets, 1);
	net_count(&e->net.rx_malformed, 1);
}

/* IPv6 packets from the IPv6 UDP socket: their source, their destination (IPV6_PKTINFO), their UDP payload. */
static uint32_t recv6(struct vre_engine *e, uint32_t budget, vre_input_fn input)
{
	struct mmsghdr msgs[RX_BATCH];
	struct iovec iov[RX_BATCH];
	struct sockaddr_in6 from[RX_BATCH];
	union {
		struct cmsghdr align;
		uint8_t buf[CMSG_SPACE(sizeof(struct in6_pktinfo))];
	} control[RX_BATCH];
	uint32_t want = budget < RX_BATCH ? budget : RX_BATCH;
	int got;

	memset(msgs, 0, sizeof(msgs[0]) * want);
	for (uint32_t i = 0; i < want; i++) {
		iov[i] = (struct iovec){ .iov_base = e->rx + (size_t)i * RX_ROOM, .iov_len = RX_ROOM };
		msgs[i].msg_hdr = (struct msghdr){ .msg_name = &from[i], .msg_namelen = sizeof(from[i]),
						   .msg_iov = &iov[i], .msg_iovlen = 1, .msg_control = control[i].buf,
						   .msg_controllen = sizeof(control[i].buf) };
	}
	got = recvmmsg(e->udp6_fd, msgs, want, MSG_DONTWAIT, NULL);
	for (int i = 0; i < got; i++) {
		struct vre_roce_addr addr = { .dport = VRE_ROCE_PORT };
		struct cmsghdr *cm;
		bool have_dst = false;

		for (cm = CMSG_FIRSTHDR(&msgs[i].msg_hdr); cm; cm = CMSG_NXTHDR(&msgs[i].msg_hdr, cm)) {
			if (cm->cmsg_level == IPPROTO_IPV6 && cm->cmsg_type == IPV6_PKTINFO) {
				struct in6_pktinfo info;

				memcpy(&info, CMSG_DATA(cm), sizeof(info));
				memcpy(addr.dst, &info.ipi6_addr, 16);
				have_dst = true;
			}
		}
		if (!have_dst || (msgs[i].msg_hdr.msg_flags & MSG_TRUNC) || ipv4_mapped(addr.dst)) {
			net_count(&e->net.rx_packets, 1);
			net_count(&e->net.rx_malformed, 1);
			continue;
		}
		memcpy(addr.src, &from[i].sin6_addr, 16);
		addr.sport = ntohs(from[i].sin6_port);
		input(e, iov[i].iov_base, msgs[i].msg_len, &addr);
	}
	return got > 0 ? (uint32_t)got : 0;
}

VRE_FN uint32_t sock_recv(struct vre_engine *e, uint32_t budget, vre_input_fn input)
{
	struct mmsghdr msgs[RX_BATCH];
	struct iovec iov[RX_BATCH];
	uint32_t done = 0;

	if (!e->rx) {
		e->rx = malloc((size_t)RX_BATCH * RX_ROOM);
		if (!e->rx)
			return 0;
	}
	while (done < budget) {
		uint32_t want = budget - done < RX_BATCH ? budget - done : RX_BATCH;
		int got;

		memset(msgs, 0, sizeof(msgs[0]) * want);
		for (uint32_t i = 0; i < want; i++) {
			iov[i] = (struct iovec){ .iov_base = e->rx + (size_t)i * RX_ROOM, .iov_len = RX_ROOM };
			msgs[i].msg_hdr.msg_iov = &iov[i];
			msgs[i].msg_hdr.msg_iovlen = 1;
		}
		got = recvmmsg(e->rx_fd, msgs, want, MSG_DONTWAIT, NULL);
		if (got <= 0)
			break;
		for (int i = 0; i < got; i++) {
			if (msgs[i].msg_hdr.msg_flags & MSG_TRUNC) {
				net_count(&e->net.rx_packets, 1);
				net_count(&e->net.rx_malformed, 1);
				continue;
			}
			ipv4_packet(e, iov[i].iov_base, msgs[i].msg_len, input);
		}
		done += (uint32_t)got;
		if ((uint32_t)got < want)
			break;
	}
	if (e->udp6_fd >= 0 && done < budget)
		done += recv6(e, budget - done, input);
	return done;
}

/* The message's one control message: `level`/`type` with `len` bytes of `data` (the source address to send from). */
static void put_pktinfo(struct msghdr *msg, int level, int type, const void *data, size_t len)
{
	struct cmsghdr *cm = CMSG_FIRSTHDR(msg);  /* msg_controllen holds the whole buffer here: set exactly below */

	cm->cmsg_level = level;
	cm->cmsg_type = type;
	cm->cmsg_len = CMSG_LEN(len);
	memcpy(CMSG_DATA(cm), data, len);
	msg->msg_controllen = CMSG_SPACE(len);
}

VRE_FN void sock_send(struct vre_engine *e)
{
	struct mmsghdr msgs[TX_BATCH];
	struct iovec iov[TX_BATCH];
	union {
		struct sockaddr_in v4;
		struct sockaddr_in6 v6;
	} dst[TX_BATCH];
	union {
		struct cmsghdr align;
		uint8_t buf[CMSG_SPACE(sizeof(struct in6_pktinfo))];
	} control[TX_BATCH];

	if (e->capture)
		return;  /* the packets wait for vre_net_take */
	while (e->tx_head != e->tx_tail) {
		uint32_t n = e->tx_tail - e->tx_head;
		/* a batch of one family: the first packet's */
		bool v6 = !ipv4_mapped(e->tx[e->tx_head % VRE_TX_RING].addr.src);
		int sent;

		n = n < TX_BATCH ? n : TX_BATCH;
		memset(msgs, 0, sizeof(msgs[0]) * n);
		for (uint32_t i = 0; i < n; i++) {
			struct vre_tx_pkt *p = &e->tx[(e->tx_head + i) % VRE_TX_RING];

			if (!ipv4_mapped(p->addr.src) != v6) {
				n = i;
				break;
			}
			iov[i] = (struct iovec){ .iov_base = p->data, .iov_len = p->len };
			msgs[i].msg_hdr = (struct msghdr){ .msg_name = &dst[i], .msg_iov = &iov[i], .msg_iovlen = 1,
							   .msg_control = control[i].buf,
							   .msg_controllen = sizeof(control[i].buf) };
			if (v6) {
				struct in6_pktinfo info = { 0 };

				dst[i].v6 = (struct sockaddr_in6){ .sin6_family = AF_INET6,
								   .sin6_port = htons(p->addr.dport) };
				memcpy(&dst[i].v6.sin6_addr, p->addr.dst, 16);
				memcpy(&info.ipi6_addr, p->addr.src, 16);
				msgs[i].msg_hdr.msg_namelen = sizeof(dst[i].v6);
				put_pktinfo(&msgs[i].msg_hdr, IPPROTO_IPV6, IPV6_PKTINFO, &info, sizeof(info));
			} else {
				struct in_pktinfo info = { 0 };

				dst[i].v4 = (struct sockaddr_in){ .sin_family = AF_INET, .sin_port = htons(p->addr.dport) };
				memcpy(&dst[i].v4.sin_addr, p->addr.dst + 12, 4);
				memcpy(&info.ipi_spec_dst, p->addr.src + 12, 4);
				msgs[i].msg_hdr.msg_namelen = sizeof(dst[i].v4);
				put_pktinfo(&msgs[i].msg_hdr, IPPROTO_IP, IP_PKTINFO, &info, sizeof(info));
			}
		}
		if (v6 && e->udp6_fd < 0) {
			sent = -1;
			errno = EAFNOSUPPORT;  /* (only the engine's own bug would queue one: net_reaches checks first) */
		} else {
			sent = sendmmsg(v6 ? e->udp6_fd : e->tx_fd, msgs, n, MSG_DONTWAIT);
		}
		if (sent < 0) {
			if (errno == EAGAIN || errno == ENOBUFS || errno == EINTR)
				return;  /* the next poll tries again */
			/* this packet cannot go (no route, too big for the link): lost, as on a wire */
			net_count(&e->net.tx_dropped, 1);
			e->tx_head++;
			continue;
		}
		net_count(&e->net.tx_packets, (uint32_t)sent);
		e->tx_head += (uint32_t)sent;
	}
}
