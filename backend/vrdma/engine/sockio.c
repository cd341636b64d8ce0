// SPDX-License-Identifier: GPL-2.0-only
/*
 * The engine's only contact with file descriptors: the sockets the daemon opened for RoCE and handed over
 * (vre_net_attach), read and written in batches from the polling loop. Nothing else in the engine makes a system
 * call on a descriptor; the device model (Python) never sees these.
 *
 * Receiving IPv4: mapped rings (TPACKET_V2) of AF_PACKET sockets, one or more, each hashed a share of the flows by
 * the kernel's fanout and read by one engine thread: every packet arrives with its IP header, whose identification
 * and flags the ICRC covers (docs/interhost.md), without a system call or a copy of its own (the kernel copies it
 * into the ring once, where the raw socket this replaced queued a clone that recvmmsg then copied out). The frames
 * are taken before the host's IP stack has looked at them, so the header is checked here in full (version,
 * lengths, checksum, no fragments, port); the rest is the input function's the loop gives (vre_roce_input: the
 * engine's entry point sits above this file, which only moves bytes). TPACKET_V2, not V3: a V3 block reaches its
 * reader only when it is full or its timer (milliseconds) retires it, a wait no RDMA latency can afford; a V2 frame
 * is the reader's as soon as the kernel has written it.
 *
 * Sending IPv4: a raw socket that takes each packet's IP and UDP headers as written here (IPPROTO_RAW, so
 * IP_HDRINCL): from its QP's GID to its peer's, from its QP's UDP source port (RoCE v2's entropy: a flow per QP,
 * which ECMP paths and the receiver's fanout spread), with don't-fragment and identification 0, the values its
 * ICRC was computed with (Linux keeps 0 in a don't-fragment packet's identification and fills in the checksum).
 * A packet longer than the route's MTU is refused (EMSGSIZE), never fragmented. The daemon's UDP socket bound to
 * 4791 sends nothing: it keeps the host's UDP from answering RoCE with ICMP.
 *
 * IPv6 arrives the same way, on rings of its own (a packet socket is bound to one protocol), and is sent through a
 * UDP socket bound to 4791 (IPV6_PKTINFO gives each packet its QP's GID as source): an IPv6 header has no
 * identification, so a UDP socket writes all the ICRC covers, and sends from its bound port.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE  /* sendmmsg */
#endif
#include <errno.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include "vre.h"

#define TX_BATCH 64
#define IPV4_UDP_HEADERS 28       /* what the engine writes before a packet it sends over IPv4 */
/* A receive ring: 64 blocks of 64 KiB, 15 frames in each (960 frames, ~4 MiB, about what the raw socket's 8 MiB
 * receive buffer held of 4 KiB packets). A frame holds the ring's header and address (80 bytes, aligned) and the
 * largest RoCE packet: a 60-byte IPv4 header (or IPv6's 40), UDP, BTH, RETH and immediate, 4,096 bytes, ICRC
 * (4,200); a longer one (never RoCE) arrives cut short and is counted malformed. */
#define RING_BLOCK (64u << 10)
#define RING_BLOCKS 64u
#define RING_FRAME 4352u
#define RING_FRAMES_PER_BLOCK (RING_BLOCK / RING_FRAME)
#define RING_FRAMES (RING_BLOCKS * RING_FRAMES_PER_BLOCK)
#define RING_BYTES ((size_t)RING_BLOCK * RING_BLOCKS)

/* Ones' complement sum of an IPv4 header: 0xffff when its checksum is right. */
static uint16_t ipv4_header_sum(const uint8_t *ip, uint32_t ihl)
{
	uint32_t sum = 0;

	for (uint32_t i = 0; i < ihl; i += 2)
		sum += be16_get(ip + i);
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	return (uint16_t)sum;
}

/* A packet that is not one this engine parses (its IP or UDP header, or longer than any RoCE packet): counted. */
static int malformed(struct vre_engine *e)
{
	net_count(&e->net.rx_packets, 1);
	net_count(&e->net.rx_malformed, 1);
	return -EBADMSG;
}

/* One IPv4 packet from a ring: its UDP payload to the engine if it is whole, unfragmented and for 4791. */
static int ipv4_packet(struct vre_engine *e, const uint8_t *ip, uint32_t len, vre_input_fn input)
{
	struct vre_roce_addr addr;
	uint32_t ihl, total, udp_len;
	const uint8_t *udp;

	if (len < 20 || (ip[0] >> 4) != 4)
		return malformed(e);
	ihl = (uint32_t)(ip[0] & 0xf) * 4;
	total = be16_get(ip + 2);
	if (ihl < 20 || total > len || total < ihl + 8 || ip[9] != 17 || ipv4_header_sum(ip, ihl) != 0xffff)
		return malformed(e);  /* (the host's IP stack has not checked it yet: the ring sees it first) */
	udp = ip + ihl;
	if (be16_get(udp + 2) != VRE_ROCE_PORT)
		return -EPROTO;  /* someone else's UDP (the daemon's filter normally keeps it away): not counted */
	udp_len = be16_get(udp + 4);
	if ((be16_get(ip + 6) & 0x3fff) || udp_len < 8 || udp_len > total - ihl)
		return malformed(e);  /* a fragment (RoCE is never fragmented), or UDP lengths that do not add up */
	memset(&addr, 0, sizeof(addr));
	memcpy(addr.src, ipv4_mapped_prefix, 12);
	memcpy(addr.src + 12, ip + 12, 4);
	memcpy(addr.dst, ipv4_mapped_prefix, 12);
	memcpy(addr.dst + 12, ip + 16, 4);
	addr.sport = be16_get(udp);
	addr.dport = VRE_ROCE_PORT;
	addr.ip_id = be16_get(ip + 4);
	addr.ip_frag = be16_get(ip + 6);
	return input(e, udp + 8, udp_len - 8, &addr);
}

/* One IPv6 packet from a ring: its UDP payload to the engine if it is whole and for 4791 (no extension headers:
 * RoCE v2 uses none, and the filter passes only UDP as the next header). */
static int ipv6_packet(struct vre_engine *e, const uint8_t *ip, uint32_t len, vre_input_fn input)
{
	struct vre_roce_addr addr = { .dport = VRE_ROCE_PORT };
	uint32_t payload_len, udp_len;
	const uint8_t *udp;

	if (len < 48 || (ip[0] >> 4) != 6 || ip[6] != 17)
		return malformed(e);
	payload_len = be16_get(ip + 4);
	if (payload_len < 8 || payload_len > len - 40)
		return malformed(e);
	udp = ip + 40;
	if (be16_get(udp + 2) != VRE_ROCE_PORT)
		return -EPROTO;  /* someone else's UDP (the daemon's filter normally keeps it away): not counted */
	udp_len = be16_get(udp + 4);
	memcpy(addr.src, ip + 8, 16);
	memcpy(addr.dst, ip + 24, 16);
	if (udp_len < 8 || udp_len > payload_len || ipv4_mapped(addr.src) || ipv4_mapped(addr.dst))
		return malformed(e);
	addr.sport = be16_get(udp);
	return input(e, udp + 8, udp_len - 8, &addr);
}

VRE_FN int ip_packet(struct vre_engine *e, const uint8_t *ip, uint32_t len, vre_input_fn input)
{
	if (len && ip[0] >> 4 == 6)
		return ipv6_packet(e, ip, len, input);
	return ipv4_packet(e, ip, len, input);  /* (which counts anything else malformed) */
}

/* -- the receive rings ------------------------------------------------------------------------------------- */

static struct tpacket2_hdr *ring_frame(const struct vre_rx_ring *r, uint32_t i)
{
	return (struct tpacket2_hdr *)(r->map + (size_t)(i / RING_FRAMES_PER_BLOCK) * RING_BLOCK +
				       (size_t)(i % RING_FRAMES_PER_BLOCK) * RING_FRAME);
}

/* Make socket `fd` ring `r`: TPACKET_V2, the ring mapped, bound to `family` (AF_INET or AF_INET6) on every link,
 * and in fanout group *group (0: the first ring of several makes one, the kernel choosing its id; one ring alone
 * joins none). 0, or the errno of the step that failed, named in *step (tx.c reports it). */
VRE_FN int ring_open(struct vre_rx_ring *r, int fd, int family, uint32_t nrings, uint32_t *group,
		     const char **step)
{
	int version = TPACKET_V2, fanout;
	struct tpacket_req req = { .tp_block_size = RING_BLOCK, .tp_block_nr = RING_BLOCKS,
				   .tp_frame_size = RING_FRAME, .tp_frame_nr = RING_FRAMES };
	struct sockaddr_ll at = { .sll_family = AF_PACKET,
				  .sll_protocol = htons(family == AF_INET6 ? ETH_P_IPV6 : ETH_P_IP) };
	socklen_t len = sizeof(fanout);

	r->fd = fd;
	r->family = family;
	r->next = 0;
	*step = "TPACKET_V2 (is it an AF_PACKET socket?)";
	if (setsockopt(fd, SOL_PACKET, PACKET_VERSION, &version, sizeof(version)))
		return errno;
	*step = "setting up its ring (PACKET_RX_RING)";
	if (setsockopt(fd, SOL_PACKET, PACKET_RX_RING, &req, sizeof(req)))
		return errno;
	*step = "mapping its ring";
	r->map = mmap(NULL, RING_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (r->map == MAP_FAILED) {
		r->map = NULL;
		return errno;
	}
	*step = family == AF_INET6 ? "binding it to IPv6" : "binding it to IPv4";
	if (bind(fd, (struct sockaddr *)&at, sizeof(at)))
		return errno;
	if (nrings < 2)
		return 0;
	*step = "joining the rings' fanout group";
	fanout = *group ? (int)(*group | (PACKET_FANOUT_HASH << 16)) :
			  (PACKET_FANOUT_HASH | PACKET_FANOUT_FLAG_UNIQUEID) << 16;
	if (setsockopt(fd, SOL_PACKET, PACKET_FANOUT, &fanout, sizeof(fanout)))
		return errno;
	if (!*group) {
		if (getsockopt(fd, SOL_PACKET, PACKET_FANOUT, &fanout, &len))
			return errno;
		*group = (uint32_t)fanout & 0xffff;
	}
	return 0;
}

VRE_FN void rings_free(struct vre_rx_ring *rings, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		if (rings[i].map)
			munmap(rings[i].map, RING_BYTES);
	free(rings);
}

/* The frames the kernel could not place since the last look (a full ring), into rx_dropped. */
static void ring_losses(struct vre_engine *e, const struct vre_rx_ring *r)
{
	struct tpacket_stats stats;
	socklen_t len = sizeof(stats);

	if (!getsockopt(r->fd, SOL_PACKET, PACKET_STATISTICS, &stats, &len))  /* (reading them resets them) */
		net_count(&e->net.rx_dropped, stats.tp_drops);
}

/* Up to `budget` frames of ring `r`, each handed back to the kernel once read. */
static uint32_t ring_recv(struct vre_engine *e, struct vre_rx_ring *r, uint32_t budget, vre_input_fn input)
{
	uint32_t done = 0;

	while (done < budget) {
		struct tpacket2_hdr *h = ring_frame(r, r->next);
		uint32_t status = __atomic_load_n(&h->tp_status, __ATOMIC_ACQUIRE);
		const struct sockaddr_ll *from;

		if (!(status & TP_STATUS_USER))
			break;
		if (status & TP_STATUS_LOSING)
			ring_losses(e, r);
		from = (const struct sockaddr_ll *)((uint8_t *)h + TPACKET_ALIGN(sizeof(*h)));
		/* The kernel's offsets stay inside the frame; checked all the same, as anything shared is. */
		if (from->sll_pkttype != PACKET_HOST) {
			/* another host's, a broadcast or our own going out: the filter keeps them away */
		} else if (h->tp_snaplen < h->tp_len || h->tp_net > RING_FRAME || h->tp_snaplen > RING_FRAME - h->tp_net) {
			(void)malformed(e);  /* longer than any RoCE packet */
		} else if (r->family == AF_INET6) {
			(void)ipv6_packet(e, (uint8_t *)h + h->tp_net, h->tp_snaplen, input);
		} else {
			(void)ipv4_packet(e, (uint8_t *)h + h->tp_net, h->tp_snaplen, input);
		}
		__atomic_store_n(&h->tp_status, TP_STATUS_KERNEL, __ATOMIC_RELEASE);
		r->next = r->next + 1 < RING_FRAMES ? r->next + 1 : 0;
		done++;
	}
	return done;
}

/* Whether ring `i` is read by worker `w` (NULL: the caller, only while no thread runs, reads them all). */
VRE_FN bool ring_mine(const struct vre_engine *e, const struct vre_worker *w, uint32_t i)
{
	uint32_t threads = vre_thread_count((struct vre_engine *)e);

	return w ? threads && i % threads == w->index : !threads;
}

VRE_FN uint32_t sock_recv(struct vre_engine *e, struct vre_worker *w, uint32_t budget, vre_input_fn input)
{
	uint32_t done = 0;

	for (uint32_t i = 0; i < e->nrings && done < budget; i++)
		if (ring_mine(e, w, i))
			done += ring_recv(e, &e->rings[i], budget - done, input);
	if (w && done)
		stat_add(&w->stats.rx_packets, done);
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

/* The IPv4 and UDP headers of packet p, for the raw socket (Linux fills in the IP checksum). */
static void ipv4_headers(uint8_t *h, const struct vre_tx_pkt *p)
{
	h[0] = 0x45;
	h[1] = 0;
	be16_put(h + 2, (uint16_t)(IPV4_UDP_HEADERS + p->len));
	be16_put(h + 4, p->addr.ip_id);
	be16_put(h + 6, p->addr.ip_frag);
	h[8] = 64;  /* TTL */
	h[9] = 17;  /* UDP */
	be16_put(h + 10, 0);
	memcpy(h + 12, p->addr.src + 12, 4);
	memcpy(h + 16, p->addr.dst + 12, 4);
	be16_put(h + 20, p->addr.sport);
	be16_put(h + 22, p->addr.dport);
	be16_put(h + 24, (uint16_t)(8 + p->len));
	be16_put(h + 26, 0);  /* no UDP checksum: RoCE v2 allows it, the ICRC covers the packet */
}

VRE_FN void sock_send(struct vre_engine *e)
{
	struct mmsghdr msgs[TX_BATCH];
	struct iovec iov[TX_BATCH][2];
	uint8_t headers[TX_BATCH][IPV4_UDP_HEADERS];
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
			if (v6) {
				struct in6_pktinfo info = { 0 };

				iov[i][0] = (struct iovec){ .iov_base = p->data, .iov_len = p->len };
				dst[i].v6 = (struct sockaddr_in6){ .sin6_family = AF_INET6,
								   .sin6_port = htons(p->addr.dport) };
				memcpy(&dst[i].v6.sin6_addr, p->addr.dst, 16);
				memcpy(&info.ipi6_addr, p->addr.src, 16);
				msgs[i].msg_hdr = (struct msghdr){ .msg_name = &dst[i], .msg_namelen = sizeof(dst[i].v6),
								   .msg_iov = iov[i], .msg_iovlen = 1,
								   .msg_control = control[i].buf,
								   .msg_controllen = sizeof(control[i].buf) };
				put_pktinfo(&msgs[i].msg_hdr, IPPROTO_IPV6, IPV6_PKTINFO, &info, sizeof(info));
			} else {
				ipv4_headers(headers[i], p);
				iov[i][0] = (struct iovec){ .iov_base = headers[i], .iov_len = IPV4_UDP_HEADERS };
				iov[i][1] = (struct iovec){ .iov_base = p->data, .iov_len = p->len };
				dst[i].v4 = (struct sockaddr_in){ .sin_family = AF_INET };
				memcpy(&dst[i].v4.sin_addr, p->addr.dst + 12, 4);
				msgs[i].msg_hdr = (struct msghdr){ .msg_name = &dst[i], .msg_namelen = sizeof(dst[i].v4),
								   .msg_iov = iov[i], .msg_iovlen = 2 };
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
