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
		e->now = e->clock;
}

void vre_net_counters(struct vre_engine *e, struct vre_net_counters *out)
{
	*out = e->net;
}

void vre_device_roce_counters(struct vre_engine *e, uint32_t dev, struct vre_roce_counters *out)
{
	struct vre_device *d = vre_dev(e, dev);

	*out = d ? d->roce : (struct vre_roce_counters){ 0 };
}

/* -- arriving packets ------------------------------------------------------------------------------------------ */

static int roce_input(struct vre_engine *e, const uint8_t *udp_payload, uint32_t len, const struct vre_roce_addr *addr);

int vre_roce_input(struct vre_engine *e, const uint8_t *udp_payload, uint32_t len, const struct vre_roce_addr *addr)
{
	int ret = roce_input(e, udp_payload, len, addr);

	net_assert(e);
	return ret;
}

static int roce_input(struct vre_engine *e, const uint8_t *udp_payload, uint32_t len, const struct vre_roce_addr *addr)
{
	const struct roce_op *op;
	struct vre_roce_pkt pkt;
	struct vre_device *d;
	struct vre_qp *qp;
	bool uc;
	int err;

	e->now = e->clock ? e->clock : e->now ? e->now : vre_monotonic_ns();
	e->net.rx_packets++;
	err = vre_roce_parse(udp_payload, len, addr, &pkt);
	if (err) {
		if (err == -EILSEQ)
			e->net.rx_bad_icrc++;
		else
			e->net.rx_malformed++;
		return err;
	}
	d = gid_route(e, addr->dst);
	qp = d ? qp_by_qpn(e, dev_index(e, d), pkt.dest_qpn) : NULL;
	if (!qp) {
		e->net.rx_no_qp++;
		return -ENOENT;
	}
	op = roce_op(pkt.opcode);
	/* A datagram: any source may send a UD or GSI QP one with its Q_Key. */
	if (roce_transport_of(pkt.opcode) == ROCE_UD) {
		if (!(qp->cfg.flags & VRE_QP_UD)) {
			e->net.rx_not_peer++;
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
		e->net.rx_not_peer++;
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
