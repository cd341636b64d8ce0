// SPDX-License-Identifier: GPL-2.0-only
/*
 * Receive queues: where a message for a QP lands (its own queue, its SRQ, or for an XRC target the XRC SRQ the
 * message names), taking the next receive WQE there (with the SRQ's limit event), and flushing a QP's own queue
 * once it is in error. A producer index that claims more WQEs than the ring holds is garbage and names nothing.
 */
#include <string.h>

#include "vre.h"

VRE_FN bool rx_of(struct vre_device *d, struct vre_qp *qp, uint32_t srqn, struct vre_rx *rx)
{
	if (qp->cfg.flags & VRE_QP_XRC_TGT) {
		/* The SRQ number is the initiator's word: any value, checked against the target's own table. */
		struct vre_srq *srq = srq_at(d, srqn & (d->lim.max_srq - 1));

		if (!srq || srq->cfg.srqn != srqn || !srq->cfg.xrcd || srq->cfg.xrcd != qp->cfg.xrcd)
			return false;
		*rx = (struct vre_rx){ .srq = srq, .cq = d->cqs[srq->cfg.cq], .pd = srq->cfg.pd,
				       .kernel = srq->cfg.flags & VRE_SRQ_KERNEL };
		return true;
	}
	*rx = (struct vre_rx){ .srq = qp->cfg.srq == VRE_NO_SRQ ? NULL : d->srqs[qp->cfg.srq],
			       .cq = d->cqs[qp->cfg.recv_cq], .pd = qp->cfg.pd,
			       .kernel = qp->cfg.flags & VRE_QP_KERNEL };
	return true;
}

/* Take the next receive WQE for `qp` from where `rx` says (its RQ or an SRQ), copied out of guest memory. */
VRE_FN enum take take_recv(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, const struct vre_rx *rx,
			   struct recv_wqe *out, uint32_t *max_sge)
{
	if (rx->srq) {
		struct vre_srq *srq = rx->srq;
		struct vrdma_srq_ring_hdr *hdr;
		uint32_t prod, avail;

		if (srq->error || !srq->ring.valid)
			return TAKE_BROKEN;
		prod = load_acquire(srq->db);
		avail = prod - srq->cons;
		if (avail > srq->cfg.depth) {
			srq->error = true;  /* the producer overran the ring */
			return TAKE_BROKEN;
		}
		if (!avail)
			return TAKE_EMPTY;
		memcpy(out, mem_at(&srq->ring, PAGE_SIZE + (uint64_t)(srq->cons & (srq->cfg.depth - 1)) *
				   srq->cfg.stride), srq->cfg.stride);
		srq->cons++;
		hdr = (struct vrdma_srq_ring_hdr *)mem_at(&srq->ring, 0);
		store_release(&hdr->cons, srq->cons);
		mem_dirty(&srq->ring, 0, sizeof(*hdr));
		*max_sge = srq->cfg.max_sge;
		if (srq->limit && avail - 1 < srq->limit) {
			srq->limit = 0;  /* one event per arming (IB: the limit disarms itself) */
			vre_post_event(e, dev_index(e, d), VRDMA_EVENT_SRQ_LIMIT, srq->cfg.handle, 0);
		}
	} else {
		struct vrdma_qp_ring_hdr *hdr;
		uint32_t prod, avail;

		prod = load_acquire(qp->rq_db);
		avail = prod - qp->rq_cons;
		if (avail > qp->cfg.rq_depth)
			return TAKE_BROKEN;
		if (!avail)
			return TAKE_EMPTY;
		memcpy(out, mem_at(&qp->ring, qp->cfg.rq_offset + (uint64_t)(qp->rq_cons & (qp->cfg.rq_depth - 1)) *
				   qp->cfg.rq_stride), qp->cfg.rq_stride);
		qp->rq_cons++;
		hdr = (struct vrdma_qp_ring_hdr *)mem_at(&qp->ring, 0);
		store_release(&hdr->rq_cons, qp->rq_cons);
		mem_dirty(&qp->ring, 0, sizeof(*hdr));
		*max_sge = qp->cfg.max_recv_sge;
	}
	d->counters.recv_wqes++;
	qp->counters.recv_wqes++;
	return TAKE_OK;
}

/* Flush the receive queue of a QP in error: every posted receive completes with WR_FLUSH_ERR, the one a message
 * under way held first (an XRC target's went to the CQ of an SRQ the message named: it is dropped). */
VRE_FN uint32_t flush_recv(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, uint32_t budget)
{
	struct vrdma_qp_ring_hdr *hdr = (struct vrdma_qp_ring_hdr *)mem_at(&qp->ring, 0);
	uint32_t prod, n = 0;

	if (qp->held.held) {
		struct vrdma_cqe cqe = { .wr_id = qp->held.wqe->hdr.wr_id, .status = VRDMA_WC_WR_FLUSH_ERR,
					 .opcode = VRDMA_WC_OP_RECV, .qp_num = qp->cfg.qpn };

		qp->held.held = false;
		if (!(qp->cfg.flags & VRE_QP_XRC_TGT)) {
			cq_push(e, d, d->cqs[qp->cfg.recv_cq], &cqe, false);
			d->counters.flushed++;
			qp->counters.flushed++;
			qp->counters.error_cqes++;
			n++;
		}
	}
	if (qp->cfg.srq != VRE_NO_SRQ || !qp->rq_db)
		return n;  /* an SRQ's receives belong to the other QPs sharing it; XRC QPs have no receive queue */
	prod = load_acquire(qp->rq_db);
	if (prod - qp->rq_cons > qp->cfg.rq_depth)
		return 0;  /* more receives than the ring holds: the index is garbage and names nothing posted (clamping
			    * it to one ring's worth flushed another ring's worth on every pass, without end) */
	while (qp->rq_cons != prod && n < budget) {
		struct vrdma_recv_wqe w;
		struct vrdma_cqe cqe = { .status = VRDMA_WC_WR_FLUSH_ERR, .opcode = VRDMA_WC_OP_RECV,
					 .qp_num = qp->cfg.qpn };

		memcpy(&w, mem_at(&qp->ring, qp->cfg.rq_offset + (uint64_t)(qp->rq_cons & (qp->cfg.rq_depth - 1)) *
				  qp->cfg.rq_stride), sizeof(w));
		cqe.wr_id = w.wr_id;
		cq_push(e, d, d->cqs[qp->cfg.recv_cq], &cqe, false);
		qp->rq_cons++;
		d->counters.flushed++;
		qp->counters.flushed++;
		qp->counters.error_cqes++;
		n++;
	}
	store_release(&hdr->rq_cons, qp->rq_cons);
	mem_dirty(&qp->ring, 0, sizeof(*hdr));
	return n;
}
