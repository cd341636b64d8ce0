// SPDX-License-Identifier: GPL-2.0-only
/*
 * Datagrams: a UD or GSI send goes to the QP its address vector names, found by destination GID (in any device of
 * the engine) and QPN (1: the device's GSI QP), if that QP is a datagram QP ready to receive, its Q_Key matches and a
 * receive is posted. The receiver gets a 40-byte network header ahead of the payload, made from the sender's own
 * GID table (the WQE names an index in it, never a source address): no VM can speak as another GID. What nobody
 * takes is dropped and counted, and the send completes successfully all the same, as UD defines.
 */
#include <string.h>

#include "vre.h"

/* The device holding GID `gid` (its table has it, of any type), or NULL. */
VRE_FN struct vre_device *device_by_gid(struct vre_engine *e, const uint8_t *gid)
{
	for (uint32_t i = 0; i < e->ndevices; i++) {
		struct vre_device *d = &e->devices[i];

		for (uint32_t k = 0; d->open && k < VRE_MAX_GIDS; k++)
			if (d->gids[k].type && !memcmp(d->gids[k].raw, gid, 16))
				return d;
	}
	return NULL;
}

static uint16_t ipv4_checksum(const uint8_t *header)
{
	uint32_t sum = 0;

	for (int i = 0; i < 20; i += 2)
		sum += (uint32_t)header[i] << 8 | header[i + 1];
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	return (uint16_t)~sum;
}

static void put_be16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)(v >> 8);
	p[1] = (uint8_t)v;
}

static void put_be32(uint8_t *p, uint32_t v)
{
	put_be16(p, (uint16_t)(v >> 16));
	put_be16(p + 2, (uint16_t)v);
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
		put_be16(ip + 2, (uint16_t)(20 + payload));
		ip[6] = 0x40;  /* don't fragment */
		ip[8] = av->hop_limit ? av->hop_limit : 64;
		ip[9] = 17;    /* UDP */
		memcpy(ip + 12, sgid->raw + 12, 4);
		memcpy(ip + 16, av->dgid + 12, 4);
		put_be16(ip + 10, ipv4_checksum(ip));
		return VRDMA_NETWORK_IPV4;
	}
	put_be32(h, 6u << 28 | (uint32_t)av->traffic_class << 20 | (av->flow_label & 0xfffff));
	put_be16(h + 4, (uint16_t)payload);
	h[6] = sgid->type == VRDMA_GID_TYPE_ROCE_V2 ? 17 : 0x1b;  /* UDP, or the IB transport header */
	h[7] = av->hop_limit;
	memcpy(h + 8, sgid->raw, 16);
	memcpy(h + 24, av->dgid, 16);
	return sgid->type == VRDMA_GID_TYPE_ROCE_V2 ? VRDMA_NETWORK_IPV6 : VRDMA_NETWORK_ROCE_V1;
}

/* The destination QP if it takes this datagram (a ready datagram QP whose Q_Key matches), else NULL. */
static struct vre_qp *datagram_target(struct vre_engine *e, struct vre_request *r, struct vre_device *dd)
{
	const struct vrdma_ud_av *av = &r->w->hdr.ud;
	uint32_t qkey = av->remote_qkey & VRDMA_QKEY_PRIVILEGED ? r->qp->attr.qkey : av->remote_qkey;
	struct vre_qp *dqp = qp_by_qpn(e, dev_index(e, dd), av->remote_qpn);

	if (!dqp || !(dqp->cfg.flags & VRE_QP_UD) || !dqp->ring.valid || dqp->attr.qkey != qkey ||
	    (dqp->attr.state != VRDMA_QPS_RTR && dqp->attr.state != VRDMA_QPS_RTS))
		return NULL;
	return dqp;
}

VRE_FN void ud_send(struct vre_request *r)
{
	struct vre_engine *e = r->e;
	struct vre_scratch *s = &e->scratch;
	const struct vrdma_send_wqe *h = &r->w->hdr;
	const struct vrdma_ud_av *av = &h->ud;
	const struct vre_gid *sgid = av->sgid_index < VRE_MAX_GIDS ? &r->d->gids[av->sgid_index] : NULL;
	struct vre_device *dd;
	struct vre_qp *dqp;
	uint32_t rmax_sge = 0, nremote = 0;
	uint64_t room = 0;

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
	dd = device_by_gid(e, av->dgid);
	dqp = dd ? datagram_target(e, r, dd) : NULL;
	struct vre_rx rx = {};
	enum take taken = dqp && rx_of(dd, dqp, 0, &rx) ? take_recv(e, dd, dqp, &rx, &s->rwqe, &rmax_sge) : TAKE_EMPTY;

	if (taken == TAKE_BROKEN)
		qp_to_error(e, dd, dqp, VRDMA_EVENT_QP_FATAL);
	if (taken != TAKE_OK) {
		r->d->counters.ud_dropped++;
		if (dd)
			dd->counters.ud_dropped++;
		complete_send(e, r->d, r->qp, h, VRDMA_WC_SUCCESS, (uint32_t)r->len);
		return;
	}

	struct vrdma_cqe rcqe = { .wr_id = s->rwqe.hdr.wr_id, .opcode = VRDMA_WC_OP_RECV, .qp_num = dqp->cfg.qpn,
				  .src_qp = r->qp->cfg.qpn, .wc_flags = VRDMA_WC_GRH };
	uint8_t rstatus = s->rwqe.hdr.num_sge > rmax_sge ? VRDMA_WC_LOC_QP_OP_ERR :
		sges_to_segs(dd, rx.pd, rx.kernel, s->rwqe.sge, s->rwqe.hdr.num_sge, true, UINT64_MAX, s->remote,
			     &nremote, &room);

	if (rstatus == VRDMA_WC_SUCCESS && room < VRDMA_GRH_SIZE + r->len)
		rstatus = VRDMA_WC_LOC_LEN_ERR;
	if (rstatus != VRDMA_WC_SUCCESS) {
		/* The receiver's WQE cannot take it: its completion says why; the sender's send went out fine. */
		rcqe.status = rstatus;
		rcqe.wc_flags = 0;
		dd->counters.ud_dropped++;
		dqp->counters.error_cqes++;
	} else {
		rcqe.network_hdr_type = network_header(s->grh, sgid, av, (uint32_t)r->len);
		s->datagram[0] = (struct seg){ .buf = s->grh, .len = VRDMA_GRH_SIZE };
		memcpy(&s->datagram[1], r->local, r->nlocal * sizeof(*r->local));
		copy_segs(s->remote, nremote, s->datagram, r->nlocal + 1);
		rcqe.byte_len = (uint32_t)(VRDMA_GRH_SIZE + r->len);
		if (r->op->flags & OP_IMM) {
			rcqe.imm_data = h->imm_data;
			rcqe.wc_flags |= VRDMA_WC_WITH_IMM;
		}
		r->d->counters.bytes += r->len;
		dd->counters.bytes += r->len;
		r->qp->counters.bytes += r->len;
		dqp->counters.bytes += r->len;
	}
	cq_push(e, dd, rx.cq, &rcqe, h->send_flags & VRDMA_SEND_SOLICITED);
	complete_send(e, r->d, r->qp, h, VRDMA_WC_SUCCESS, (uint32_t)r->len);
}
