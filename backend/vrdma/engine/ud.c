// SPDX-License-Identifier: GPL-2.0-only
/*
 * Datagrams: a UD or GSI send goes to the QP its address vector names, found by destination GID (in any device of
 * the engine) and QPN (1: the device's GSI QP), if that QP is a datagram QP ready to receive, its Q_Key matches and a
 * receive is posted; to a GID no device here holds, with a network, as one RoCE v2 packet (a DETH with the Q_Key
 * and the sender's QPN), and a datagram from the network is taken the same way (ud_input). The receiver gets a
 * 40-byte network header ahead of the payload, made from the sender's own GID table (the WQE names an index in it,
 * never a source address; from the network, the packet's source address): no VM can speak as another GID. What
 * nobody takes is dropped and counted, and the send completes successfully all the same, as UD defines.
 */
#include <string.h>

#include "vre.h"

static uint16_t ipv4_checksum(const uint8_t *header)
{
	uint32_t sum = 0;

	for (int i = 0; i < 20; i += 2)
		sum += (uint32_t)header[i] << 8 | header[i + 1];
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	return (uint16_t)~sum;
}

/*
 * The 40 bytes a UD receive starts with, as a RoCE NIC writes them for the sender's GID type: a GRH (RoCE v1), an
 * IPv6 header, or an IPv4 header in the last 20 bytes (RoCE v2). Returns the VRDMA_NETWORK_* type.
 */
static uint8_t network_header(uint8_t *h, const struct vre_gid *sgid, const struct vrdma_ud_av *av, uint32_t len)
{
	/* The transport headers a wire would carry after it (BTH 12, DETH 8, ICRC 4; UDP 8 for RoCE v2). */
	uint32_t payload = len + 24 + (sgid->type == VRDMA_GID_TYPE_ROCE_V2 ? 8 : 0);

	memset(h, 0, VRDMA_GRH_SIZE);
	if (sgid->type == VRDMA_GID_TYPE_ROCE_V2 && ipv4_mapped(sgid->raw)) {
		uint8_t *ip = h + 20;

		ip[0] = 0x45;
		ip[1] = av->traffic_class;
		be16_put(ip + 2, (uint16_t)(20 + payload));
		be16_put(ip + 6, IP_DONT_FRAGMENT);
		ip[8] = av->hop_limit ? av->hop_limit : 64;
		ip[9] = 17;    /* UDP */
		memcpy(ip + 12, sgid->raw + 12, 4);
		memcpy(ip + 16, av->dgid + 12, 4);
		be16_put(ip + 10, ipv4_checksum(ip));
		return VRDMA_NETWORK_IPV4;
	}
	be32_put(h, 6u << 28 | (uint32_t)av->traffic_class << 20 | (av->flow_label & 0xfffff));
	be16_put(h + 4, (uint16_t)payload);
	h[6] = sgid->type == VRDMA_GID_TYPE_ROCE_V2 ? 17 : 0x1b;  /* UDP, or the IB transport header */
	h[7] = av->hop_limit;
	memcpy(h + 8, sgid->raw, 16);
	memcpy(h + 24, av->dgid, 16);
	return sgid->type == VRDMA_GID_TYPE_ROCE_V2 ? VRDMA_NETWORK_IPV6 : VRDMA_NETWORK_ROCE_V1;
}

/* The datagram QP `qpn` of device dd if it takes a datagram with this Q_Key (ready, its Q_Key matching), else NULL. */
static struct vre_qp *datagram_target(struct vre_engine *e, struct vre_device *dd, uint32_t qpn, uint32_t qkey)
{
	struct vre_qp *dqp = qp_by_qpn(e, dev_index(e, dd), qpn);

	if (!dqp || !(dqp->cfg.flags & VRE_QP_UD) || !dqp->ring.valid || dqp->attr.qkey != qkey ||
	    (dqp->attr.state != VRDMA_QPS_RTR && dqp->attr.state != VRDMA_QPS_RTS))
		return NULL;
	return dqp;
}

/* What a datagram brings to its receiver: where it came from and what it carries. */
struct datagram {
	const struct vre_gid *sgid;       /* the sender's GID */
	const struct vrdma_ud_av *av;     /* its destination and network header fields */
	uint32_t src_qpn;
	struct seg *data;                 /* the payload, in s->datagram[1...] */
	uint32_t ndata;
	uint64_t len;
	bool has_imm, solicited;
	uint32_t imm;
};

enum delivery { DELIVERED, NOT_TAKEN, RECEIVE_FAILED };

/* A receive of dqp takes the datagram: the network header, then the data; or its completion says why not. */
static enum delivery ud_deliver(struct vre_engine *e, struct vre_device *dd, struct vre_qp *dqp,
				const struct datagram *dg)
{
	struct vre_scratch *s = &ctx(e)->scratch;
	uint32_t rmax_sge = 0, nremote = 0;
	uint64_t room = 0;
	struct vre_rx rx = {};
	enum take taken = rx_of(dd, dqp, 0, &rx) ? take_recv(e, dd, dqp, &rx, &s->rwqe, &rmax_sge) : TAKE_EMPTY;

	if (taken == TAKE_BROKEN)
		qp_to_error(e, dd, dqp, VRDMA_EVENT_QP_FATAL);
	if (taken != TAKE_OK)
		return NOT_TAKEN;

	struct vrdma_cqe rcqe = { .wr_id = s->rwqe.hdr.wr_id, .opcode = VRDMA_WC_OP_RECV, .qp_num = dqp->cfg.qpn,
				  .src_qp = dg->src_qpn, .wc_flags = VRDMA_WC_GRH };
	uint8_t rstatus = s->rwqe.hdr.num_sge > rmax_sge ? VRDMA_WC_LOC_QP_OP_ERR :
		sges_to_segs(dd, rx.pd, rx.kernel, s->rwqe.sge, s->rwqe.hdr.num_sge, true, UINT64_MAX, s->remote,
			     &nremote, &room);

	if (rstatus == VRDMA_WC_SUCCESS && room < VRDMA_GRH_SIZE + dg->len)
		rstatus = VRDMA_WC_LOC_LEN_ERR;
	if (rstatus != VRDMA_WC_SUCCESS) {
		/* The receiver's WQE cannot take it: its completion says why. */
		rcqe.status = rstatus;
		rcqe.wc_flags = 0;
		dd->counters.ud_dropped++;
		dqp->counters.error_cqes++;
	} else {
		rcqe.network_hdr_type = network_header(s->grh, dg->sgid, dg->av, (uint32_t)dg->len);
		s->datagram[0] = (struct seg){ .buf = s->grh, .len = VRDMA_GRH_SIZE };
		copy_segs(s->remote, nremote, s->datagram, dg->ndata + 1);
		rcqe.byte_len = (uint32_t)(VRDMA_GRH_SIZE + dg->len);
		if (dg->has_imm) {
			rcqe.imm_data = dg->imm;
			rcqe.wc_flags |= VRDMA_WC_WITH_IMM;
		}
		count_rx(dd, dqp, dg->len, 1);
	}
	cq_push(e, dd, rx.cq, &rcqe, dg->solicited);
	return rstatus == VRDMA_WC_SUCCESS ? DELIVERED : RECEIVE_FAILED;
}

/* A datagram for another host: one RoCE v2 packet (SEND only, with a DETH), from the address vector's source GID. */
static void ud_send_remote(struct vre_request *r, const struct vre_gid *sgid, uint32_t qkey)
{
	struct vre_engine *e = r->e;
	const struct vrdma_send_wqe *h = &r->w->hdr;
	struct vre_tx_pkt *slot = tx_slot(e, true);
	struct vre_roce_pkt pkt = { .opcode = roce_on(r->op->wire[WIRE_ONLY], ROCE_UD), .pkey = ROCE_DEFAULT_PKEY,
				    .dest_qpn = h->ud.remote_qpn, .psn = psn_add(r->qp->attr.sq_psn, r->qp->sq_head),
				    .qkey = qkey, .src_qpn = r->qp->cfg.qpn, .imm = h->imm_data,
				    .solicited = !!(h->send_flags & VRDMA_SEND_SOLICITED) };
	struct vre_roce_addr addr = { .sport = roce_sport(r->qp->cfg.qpn, h->ud.remote_qpn), .dport = VRE_ROCE_PORT,
				      .ip_frag = IP_DONT_FRAGMENT };

	if (!slot || r->len > VRE_PKT_ROOM - VRE_ROCE_MAX_HEADERS - 8) {
		r->d->counters.ud_dropped++;  /* no room on the way out, or more than a packet: lost, as UD allows */
		return;
	}
	memcpy(addr.src, sgid->raw, 16);
	memcpy(addr.dst, h->ud.dgid, 16);
	copy_at(r->local, r->nlocal, 0, slot->data + roce_header_len(pkt.opcode), r->len, false);
	tx_queue(e, r->d, &addr, slot, &pkt, (uint32_t)r->len);
	count_tx(r->d, r->qp, r->len, 1);
}

VRE_FN void ud_send(struct vre_request *r)
{
	struct vre_engine *e = r->e;
	const struct vrdma_send_wqe *h = &r->w->hdr;
	const struct vrdma_ud_av *av = &h->ud;
	const struct vre_gid *sgid = av->sgid_index < VRE_MAX_GIDS ? &r->d->gids[av->sgid_index] : NULL;
	uint32_t qkey = av->remote_qkey & VRDMA_QKEY_PRIVILEGED ? r->qp->attr.qkey : av->remote_qkey;
	struct vre_device *dd;
	struct vre_qp *dqp;

	if (!sgid || !sgid->type) {
		/* The address vector names a source this device does not have: the sender's own error. */
		complete_send(e, r->d, r->qp, h, VRDMA_WC_LOC_QP_OP_ERR, 0);
		qp_to_error(e, r->d, r->qp, 0);
		return;
	}
	if (r->len > VRDMA_UD_MAX_MSG) {
		complete_send(e, r->d, r->qp, h, VRDMA_WC_LOC_LEN_ERR, 0);
		qp_to_error(e, r->d, r->qp, 0);
		return;
	}
	dd = gid_route(e, av->dgid);
	if (!dd && net_on(e) && sgid->type == VRDMA_GID_TYPE_ROCE_V2 && net_reaches(e, sgid->raw, av->dgid)) {
		net_lock(e);
		ud_send_remote(r, sgid, qkey);
		net_unlock(e);
		complete_send(e, r->d, r->qp, h, VRDMA_WC_SUCCESS, (uint32_t)r->len);
		return;
	}
	dqp = dd ? datagram_target(e, dd, av->remote_qpn, qkey) : NULL;
	memcpy(&ctx(e)->scratch.datagram[1], r->local, r->nlocal * sizeof(*r->local));
	struct datagram dg = { .sgid = sgid, .av = av, .src_qpn = r->qp->cfg.qpn, .data = &ctx(e)->scratch.datagram[1],
			       .ndata = r->nlocal, .len = r->len, .has_imm = r->op->flags & OP_IMM, .imm = h->imm_data,
			       .solicited = h->send_flags & VRDMA_SEND_SOLICITED };

	switch (dqp ? ud_deliver(e, dd, dqp, &dg) : NOT_TAKEN) {
	case DELIVERED:
		count_tx(r->d, r->qp, r->len, 1);
		break;
	case NOT_TAKEN:
		r->d->counters.ud_dropped++;
		if (dd)
			dd->counters.ud_dropped++;
		break;
	case RECEIVE_FAILED:
		break;
	}
	complete_send(e, r->d, r->qp, h, VRDMA_WC_SUCCESS, (uint32_t)r->len);
}

VRE_FN void ud_input(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, const struct vre_roce_pkt *pkt,
		     const uint8_t *payload, const struct vre_roce_addr *addr)
{
	struct vre_gid sender = { .type = VRDMA_GID_TYPE_ROCE_V2 };
	struct vrdma_ud_av av = { .hop_limit = 64 };
	struct vre_qp *dqp = datagram_target(e, d, qp->cfg.qpn, pkt->qkey);

	memcpy(sender.raw, addr->src, 16);
	memcpy(av.dgid, addr->dst, 16);
	ctx(e)->scratch.datagram[1] = (struct seg){ .buf = payload, .len = pkt->payload_len };
	struct datagram dg = { .sgid = &sender, .av = &av, .src_qpn = pkt->src_qpn, .data = &ctx(e)->scratch.datagram[1],
			       .ndata = pkt->payload_len ? 1 : 0, .len = pkt->payload_len,
			       .has_imm = pkt->headers & VRE_ROCE_IMM, .imm = pkt->imm, .solicited = pkt->solicited };

	if (!dqp || ud_deliver(e, d, dqp, &dg) == NOT_TAKEN)
		d->counters.ud_dropped++;  /* wrong Q_Key, not ready, no receive posted: silently, as UD defines */
}
