// SPDX-License-Identifier: GPL-2.0-only
/*
 * RoCE v2 between this engine and other hosts: the one entry point every arriving packet goes through.
 *
 * An arriving packet is parsed and checked (roce.c: lengths, opcode, ICRC) before anything reads it; then its
 * destination GID must be one of a device's here, its destination QPN a QP of that device connected to the
 * packet's source address with the packet's transport (RC or UC). Anything else is dropped and counted, never
 * executed: the network is as untrusted as the guests. rcomp.c takes what comes back to such a QP's requester
 * (acknowledgements, READ responses, atomic acknowledgements), rresp.c the requests for its responder, ud.c
 * datagrams. The sockets are sockio.c's, the transmit ring tx.c's, the QP's transport state remote.c's.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vre.h"

void vre_clock_set(struct vre_engine *e, int64_t now_ns)
{
	e->clock = now_ns > 0 ? now_ns : 0;
	if (e->clock)
		ctx(e)->now = e->clock;
}

void vre_net_counters(struct vre_engine *e, struct vre_net_counters *out)
{
	const uint64_t *from = (const uint64_t *)&e->net;
	uint64_t *to = (uint64_t *)out;

	for (size_t i = 0; i < sizeof(*out) / sizeof(uint64_t); i++)
		to[i] = __atomic_load_n(&from[i], __ATOMIC_RELAXED);
}

void vre_device_roce_counters(struct vre_engine *e, uint32_t dev, struct vre_roce_counters *out)
{
	struct vre_device *d = vre_dev(e, dev);

	*out = d ? d->roce : (struct vre_roce_counters){ 0 };
}

/* -- arriving packets ------------------------------------------------------------------------------------------ */

static int roce_input(struct vre_engine *e, const uint8_t *udp_payload, uint32_t len, const struct vre_roce_addr *addr);
static int roce_deliver(struct vre_engine *e, struct vre_device *d, const struct vre_roce_pkt *pkt,
			const uint8_t *udp_payload, const struct vre_roce_addr *addr);

int vre_roce_input(struct vre_engine *e, const uint8_t *udp_payload, uint32_t len, const struct vre_roce_addr *addr)
{
	return roce_input(e, udp_payload, len, addr);
}

int vre_ip_input(struct vre_engine *e, const uint8_t *ip, uint32_t len)
{
	return ip_packet(e, ip, len, vre_roce_input);
}

static int roce_input(struct vre_engine *e, const uint8_t *udp_payload, uint32_t len, const struct vre_roce_addr *addr)
{
	struct vre_roce_pkt pkt;
	struct vre_device *d;
	int err;

	ctx(e)->now = e->clock ? e->clock : ctx(e)->now ? ctx(e)->now : vre_monotonic_ns();
	net_count(&e->net.rx_packets, 1);
	err = vre_roce_parse(udp_payload, len, addr, &pkt);
	if (err) {
		if (err == -EILSEQ)
			net_count(&e->net.rx_bad_icrc, 1);
		else
			net_count(&e->net.rx_malformed, 1);
		return err;
	}
	d = gid_route(e, addr->dst);
	if (!d) {
		net_count(&e->net.rx_no_qp, 1);
		return -ENOENT;
	}
	/* The packet's device, then the network (it may answer): a ring's thread receives for every thread's devices. */
	device_lock_blocking(d);
	net_lock(e);
	/* a suspended device's senders retransmit what it drops (it is being saved or loaded) */
	err = d->open && !d->suspended ? roce_deliver(e, d, &pkt, udp_payload, addr) : -ENOENT;
	net_unlock(e);
	net_assert(d);
	device_unlock(d);
	/* What it did may be the owner's to carry on (a resend after a NAK, a retry after an RNR, a moderated CQ's
	 * event, READ responses the transmit ring had no room for): wake it if it sleeps. */
	vre_kick_sleeping(e, dev_index(e, d));
	return err;
}

static int roce_deliver(struct vre_engine *e, struct vre_device *d, const struct vre_roce_pkt *pkt_in,
			const uint8_t *udp_payload, const struct vre_roce_addr *addr)
{
	const struct vre_roce_pkt pkt = *pkt_in;
	const struct roce_op *op;
	struct vre_qp *qp = qp_by_qpn(e, dev_index(e, d), pkt.dest_qpn);
	bool uc;

	if (!qp) {
		net_count(&e->net.rx_no_qp, 1);
		return -ENOENT;
	}
	op = roce_op(pkt.opcode);
	/* A datagram: any source may send a UD or GSI QP one with its Q_Key. */
	if (roce_transport_of(pkt.opcode) == ROCE_UD) {
		if (!(qp->cfg.flags & VRE_QP_UD)) {
			net_count(&e->net.rx_not_peer, 1);
			return -EPERM;
		}
		d->roce.rx_packets++;
		ud_input(e, d, qp, &pkt, udp_payload + pkt.payload_off, addr);
		return 0;
	}
	/* Its peer: connected to this source from this GID of ours, over the packet's transport. */
	uc = qp->cfg.flags & VRE_QP_UC;
	if (!qp->net || memcmp(qp->net->addr.dst, addr->src, 16) || memcmp(qp->net->addr.src, addr->dst, 16) ||
	    roce_transport_of(pkt.opcode) != (uc ? ROCE_UC : ROCE_RC) || (uc && roce_is_answer(op))) {
		net_count(&e->net.rx_not_peer, 1);
		return -EPERM;
	}
	d->roce.rx_packets++;
	if (roce_is_answer(op)) {
		if (qp->attr.state != VRDMA_QPS_RTS) {
			d->roce.dropped++;
			return 0;
		}
		remote_response(e, d, qp, &pkt, udp_payload + pkt.payload_off);
	} else {
		if (!qp_receives(qp)) {
			d->roce.dropped++;
			return 0;
		}
		remote_request(e, d, qp, &pkt, udp_payload + pkt.payload_off);
	}
	return 0;
}
