// SPDX-License-Identifier: GPL-2.0-only
/*
 * Queue pairs: creation with their rings and doorbell slots, the state the model sets (it checked the transition),
 * the error state and its events, lookups by QP number, destruction. poll.c schedules them; req.c (a peer here) or
 * rreq.c (a peer on another host) runs their send queues.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "vre.h"

VRE_FN struct vre_qp *qp_by_qpn(struct vre_engine *e, uint32_t dev, uint32_t qpn)
{
	struct vre_device *d = vre_dev(e, dev);
	struct vre_qp *qp;

	if (d && qpn == VRDMA_GSI_QPN)
		return d->gsi >= 0 ? qp_at(d, (uint32_t)d->gsi) : NULL;
	qp = d ? qp_at(d, qpn & (d->lim.max_qp - 1)) : NULL;
	return qp && qp->cfg.qpn == qpn ? qp : NULL;
}

VRE_FN bool qp_receives(const struct vre_qp *qp)
{
	return qp->attr.state >= VRDMA_QPS_RTR && qp->attr.state != VRDMA_QPS_ERR &&
	       (qp->ring.valid || (qp->cfg.flags & VRE_QP_XRC_TGT));  /* an XRC target has no ring to lose */
}

VRE_FN bool same_transport(uint32_t req, uint32_t resp)
{
	uint32_t want = req & VRE_TRANSPORT;

	if (want & VRE_QP_XRC_INI)
		want = (want & ~VRE_QP_XRC_INI) | VRE_QP_XRC_TGT;
	return (resp & VRE_TRANSPORT) == want;
}

VRE_FN void qp_to_error(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, uint32_t event)
{
	if (qp->attr.state == VRDMA_QPS_ERR)
		return;
	qp->attr.state = VRDMA_QPS_ERR;
	qp->rnr_until = 0;
	if (qp->net)
		qp->net->deadline = 0;  /* it sends nothing more: no timer (the loop would wake for it in vain) */
	if (event) {
		vre_post_event(e, dev_index(e, d), event, qp->cfg.handle, 0);
		if (event == VRDMA_EVENT_QP_FATAL)
			d->counters.qp_fatal++;
	}
	if (qp->cfg.srq != VRE_NO_SRQ)
		vre_post_event(e, dev_index(e, d), VRDMA_EVENT_QP_LAST_WQE, qp->cfg.handle, 0);
}

/* What a QP's configuration must be, made by a command or loaded from a state. An XRC target has no rings,
 * doorbells, CQs or PD: a QPN (to be found by) and its XRC domain. */
VRE_FN int qp_config_check(struct vre_engine *e, struct vre_device *d, uint32_t slot, const struct vre_qp_config *c)
{
	uint64_t size = (uint64_t)c->ring.npages * PAGE_SIZE;
	bool xrc_ini = c->flags & VRE_QP_XRC_INI;
	bool own_rq = c->srq == VRE_NO_SRQ && !xrc_ini;  /* an XRC initiator receives nothing */
	uint32_t transport = c->flags & VRE_TRANSPORT;
	bool gsi = c->flags & VRE_QP_GSI;

	if ((c->flags & ~(VRE_QP_KERNEL | VRE_QP_GSI | VRE_TRANSPORT)) || (transport & (transport - 1)) ||
	    (gsi && transport != VRE_QP_UD))
		return vre_fail(e, EINVAL, "QP flags %#x: no such QP type", c->flags);
	if (!qp_slot_free(d, slot) || (gsi ? c->qpn != VRDMA_GSI_QPN || d->gsi >= 0 :
				       (c->qpn & (d->lim.max_qp - 1)) != slot || c->qpn == VRDMA_GSI_QPN))
		return vre_fail(e, EINVAL, "QP slot %u (QPN %#x) unusable", slot, c->qpn);
	if (transport == VRE_QP_XRC_TGT) {
		if (!c->xrcd || c->ring.npages || c->srq != VRE_NO_SRQ || c->sq_depth || c->rq_depth)
			return vre_fail(e, EINVAL, "an XRC target has an XRC domain and no queues");
		return 0;
	}
	if (c->xrcd || (xrc_ini && (c->srq != VRE_NO_SRQ || c->rq_depth)))
		return vre_fail(e, EINVAL, "only an XRC target has an XRC domain; an XRC initiator no receive queue");
	if (!cq_at(d, c->send_cq) || (!xrc_ini && !cq_at(d, c->recv_cq)) ||
	    (c->srq != VRE_NO_SRQ && (c->srq < 0 || !srq_at(d, (uint32_t)c->srq))))
		return vre_fail(e, EINVAL, "QP names a CQ or SRQ that does not exist");
	if (!send_queue_fits(c->sq_depth, d->lim.max_qp_wr, c->sq_stride, c->max_send_sge, d->lim.max_sge,
			     c->max_inline, d->lim.max_inline) ||
	    !ring_fits(c->sq_depth, c->sq_stride, c->sq_offset, own_rq ? c->rq_offset : size))
		return vre_fail(e, EINVAL, "send queue layout (depth %u, stride %u, offset %u, %u SGEs, %u inline) is "
				"not usable", c->sq_depth, c->sq_stride, c->sq_offset, c->max_send_sge, c->max_inline);
	if (own_rq && (!recv_queue_fits(c->rq_depth, d->lim.max_qp_wr, c->rq_stride, c->max_recv_sge, d->lim.max_sge) ||
		       !ring_fits(c->rq_depth, c->rq_stride, c->rq_offset, size)))
		return vre_fail(e, EINVAL, "receive queue layout (depth %u, stride %u, offset %u, %u SGEs) is not "
				"usable", c->rq_depth, c->rq_stride, c->rq_offset, c->max_recv_sge);
	uint64_t max_pages = qp_ring_pages(c->sq_depth, c->sq_stride, own_rq ? c->rq_depth : 0, c->rq_stride);

	if (c->ring.npages > max_pages)
		return vre_fail(e, EINVAL, "QP ring of %u pages: its header and queues need %llu", c->ring.npages,
				(unsigned long long)max_pages);
	if (!vre_db_slot(d, c->sq_db) || (own_rq && (!vre_db_slot(d, c->rq_db) || c->rq_db == c->sq_db)))
		return vre_fail(e, EINVAL, "QP doorbell indexes %u and %u unusable", c->sq_db, c->rq_db);
	return 0;
}

/* A QP made (its configuration checked): in its slot and, unless an XRC target (never polled), the active list. */
VRE_FN void qp_insert(struct vre_device *d, uint32_t slot, struct vre_qp *qp)
{
	if (qp->cfg.flags & VRE_QP_XRC_TGT) {
		qp->index = VRE_NOT_ACTIVE;
	} else {
		qp->index = d->nactive;
		d->active[d->nactive++] = qp;
	}
	d->qps[slot] = qp;
	if (qp->cfg.flags & VRE_QP_GSI)
		d->gsi = slot;
}

int vre_qp_create(struct vre_engine *e, uint32_t dev, uint32_t slot, const struct vre_qp_config *c)
{
	struct vre_device *d = vre_dev(e, dev);
	struct vre_qp *qp;
	int err = qp_config_check(e, d, slot, c);

	if (err)
		return err;
	if (c->flags & VRE_QP_XRC_TGT) {
		qp = calloc(1, sizeof(*qp));
		if (!qp)
			return vre_fail(e, ENOMEM, "no memory for a QP");
	} else {
		bool own_rq = c->srq == VRE_NO_SRQ && !(c->flags & VRE_QP_XRC_INI);

		qp = obj_new(e, d, sizeof(*qp), offsetof(struct vre_qp, ring), &c->ring, "a QP", &err);
		if (!qp)
			return err;
		qp->sq_db = vre_db_claim(d, c->sq_db);
		qp->rq_db = own_rq ? vre_db_claim(d, c->rq_db) : NULL;
		memset(mem_at(&qp->ring, 0), 0, sizeof(struct vrdma_qp_ring_hdr));
		mem_dirty(&qp->ring, 0, sizeof(struct vrdma_qp_ring_hdr));
	}
	qp->cfg = *c;
	qp->attr.state = VRDMA_QPS_RESET;
	qp->attr.dest_dev = VRE_NO_DEVICE;
	qp_insert(d, slot, qp);
	return 0;
}

/*
 * What the engine relies on of a QP's attributes, set by the model (which checks each against the verbs) or loaded
 * from a state: a state it knows, retry counts of three bits, a path MTU and PSNs of the wire's sizes. The others
 * (access flags, destination, timers, Q_Key) it takes as they come: it masks or looks up each where used.
 */
VRE_FN bool qp_attr_ok(const struct vre_qp_attr *a)
{
	return a->state <= VRDMA_QPS_ERR && a->rnr_retry <= 7 && a->retry_cnt <= 7 && a->path_mtu <= 5 &&
	       a->sq_psn < (1u << 24) && a->rq_psn < (1u << 24) && a->max_rd_atomic <= 0xff &&
	       a->max_dest_rd_atomic <= 0xff;
}

int vre_qp_modify(struct vre_engine *e, uint32_t dev, uint32_t slot, const struct vre_qp_attr *attr)
{
	struct vre_device *d = vre_dev(e, dev);
	struct vre_qp *qp = qp_at(d, slot);

	if (!qp)
		return vre_fail(e, EINVAL, "no QP in slot %u", slot);
	if (!qp_attr_ok(attr))
		return vre_fail(e, EINVAL, "QP attributes out of range (state %u, retries %u and %u, path MTU %u, PSNs "
				"%#x and %#x, %u and %u reads)", attr->state, attr->rnr_retry, attr->retry_cnt,
				attr->path_mtu, attr->sq_psn, attr->rq_psn, attr->max_rd_atomic,
				attr->max_dest_rd_atomic);
	if (attr->state == VRDMA_QPS_ERR) {
		uint32_t old = qp->attr.state;

		qp->attr = *attr;
		qp->attr.state = old;
		qp_to_error(e, d, qp, 0);  /* no-op when already in error */
		return 0;
	}
	uint32_t old_state = qp->attr.state;
	int err;

	qp->attr = *attr;
	err = net_qp_update(e, d, qp, old_state);
	if (err) {
		qp_to_error(e, d, qp, 0);
		return err;
	}
	qp->rnr_left = attr->rnr_retry;
	qp->retry_left = attr->retry_cnt;
	if (attr->state == VRDMA_QPS_RESET) {
		/* Empty queues: both sides start counting from zero again. */
		qp->sq_head = qp->rq_cons = 0;
		qp->rnr_until = 0;
		qp->piece = (struct vre_piece){ 0 };
		qp->held.held = false;  /* a receive a message under way held is gone with the queue */
		/* The ring may be gone from the memory table (its pages no longer translate), or an XRC target has
		 * none: nothing to tell. */
		if (qp->ring.valid) {
			struct vrdma_qp_ring_hdr *hdr = (struct vrdma_qp_ring_hdr *)mem_at(&qp->ring, 0);

			store_release(&hdr->sq_cons, 0);
			store_release(&hdr->rq_cons, 0);
			mem_dirty(&qp->ring, 0, sizeof(*hdr));
		}
	}
	return 0;
}

int vre_qp_state(struct vre_engine *e, uint32_t dev, uint32_t slot)
{
	struct vre_qp *qp = qp_at(vre_dev(e, dev), slot);

	if (!qp)
		return vre_fail(e, EINVAL, "no QP in slot %u", slot);
	return (int)qp->attr.state;
}

int vre_qp_counters(struct vre_engine *e, uint32_t dev, uint32_t slot, struct vre_qp_counters *out)
{
	struct vre_qp *qp = qp_at(vre_dev(e, dev), slot);

	if (!qp)
		return vre_fail(e, EINVAL, "no QP in slot %u", slot);
	*out = qp->counters;
	return 0;
}

void vre_qp_destroy(struct vre_engine *e, uint32_t dev, uint32_t slot)
{
	struct vre_device *d = vre_dev(e, dev);
	struct vre_qp *qp = qp_take(d, slot);

	if (!qp)
		return;
	if (d->gsi == (int64_t)slot)
		d->gsi = -1;
	if (qp->index != VRE_NOT_ACTIVE) {
		d->active[qp->index] = d->active[--d->nactive];  /* the last active QP takes its place */
		d->active[qp->index]->index = qp->index;
	}
	net_qp_free(qp);
	free(qp->held.wqe);
	obj_free(d, qp, offsetof(struct vre_qp, ring));
}
