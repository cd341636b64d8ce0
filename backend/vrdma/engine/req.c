// SPDX-License-Identifier: GPL-2.0-only
/*
 * The requester: a send queue's WQEs, start to finish, in order. Each WQE is copied out of guest memory, checked
 * against its QP (opcode, SGE count, inline length) and its local memory (keys, PD, bounds, access), sent to its
 * destination QP (resp.c does the destination's part) and completed. A destination that does not answer, or has no
 * receive posted, makes the QP wait and retry as a real requester does (retry_cnt, rnr_retry).
 */
#include <string.h>

#include "vre.h"

enum exec { EXEC_DONE, EXEC_WAIT };

static const uint32_t rnr_timer_us[32] = {
	655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840, 5120, 7680,
	10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520,
};

VRE_FN int64_t rnr_wait_ns(uint32_t timer)
{
	return (int64_t)rnr_timer_us[timer & 31] * 1000;
}

/*
 * Build segments from the SGEs of a WQE of device d whose memory is PD pd's, checking keys, PD, bounds and (if
 * asked) local write access. The local DMA lkey names guest RAM directly, and only the kernel's queues (`kernel`)
 * may use it.
 */
VRE_FN uint8_t sges_to_segs(struct vre_device *d, uint32_t pd, bool kernel, const struct vrdma_sge *sge, uint32_t n,
			    bool need_write, uint64_t max_msg, struct seg *segs, uint32_t *nsegs, uint64_t *total)
{
	uint64_t sum = 0;
	uint32_t k = 0;

	for (uint32_t i = 0; i < n; i++) {
		struct vrdma_sge s = sge[i];
		struct vre_mr *mr;
		uint64_t off;

		if (!s.length)
			continue;
		if (kernel && s.lkey == VRDMA_LOCAL_DMA_LKEY) {
			uint8_t *hva = gpa_range(d, s.addr, s.length);

			if (!hva)
				return VRDMA_WC_LOC_PROT_ERR;
			segs[k++] = (struct seg){ .buf = hva, .len = s.length };
		} else {
			mr = mr_by_key(d, s.lkey, false);
			if (!mr || mr->cfg.pd != pd || !mr_range(mr, s.addr, s.length, &off) ||
			    (need_write && !(mr->cfg.access & VRDMA_ACCESS_LOCAL_WRITE)))
				return VRDMA_WC_LOC_PROT_ERR;
			segs[k++] = (struct seg){ .mem = &mr->mem, .off = off, .len = s.length };
		}
		sum += s.length;  /* at most 4096/16 SGEs of < 2^32 bytes: cannot wrap 64 bits */
	}
	if (sum > max_msg)
		return VRDMA_WC_LOC_LEN_ERR;
	*nsegs = k;
	*total = sum;
	return VRDMA_WC_SUCCESS;
}

/*
 * Retire the send WQE at the head of the queue, then complete it. The consumer index is published first: a
 * provider that sees the completion must also see the slot free (it refuses posts into a full ring).
 */
VRE_FN void complete_send(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, const struct vrdma_send_wqe *w,
		   uint8_t status, uint32_t byte_len)
{
	struct vrdma_qp_ring_hdr *hdr = (struct vrdma_qp_ring_hdr *)mem_at(&qp->ring, 0);
	const struct vre_opcode *op = vre_opcode(w->opcode);
	struct vrdma_cqe cqe = { .wr_id = w->wr_id, .status = status, .opcode = op ? op->wc_opcode : VRDMA_WC_OP_SEND,
				 .byte_len = byte_len, .qp_num = qp->cfg.qpn };

	qp->sq_head++;
	store_release(&hdr->sq_cons, qp->sq_head);
	if (status != VRDMA_WC_SUCCESS)
		qp->counters.error_cqes++;
	if (status == VRDMA_WC_WR_FLUSH_ERR)
		qp->counters.flushed++;
	if (status != VRDMA_WC_SUCCESS || qp->cfg.sq_sig_all || (w->send_flags & VRDMA_SEND_SIGNALED))
		cq_push(e, d, d->cqs[qp->cfg.send_cq], &cqe, false);
}

/* The requester's own checks: its opcode, and its local data (inline, or SGEs of its own MRs). */
VRE_FN uint8_t wqe_local_data(struct vre_request *r)
{
	const struct vrdma_send_wqe *h = &r->w->hdr;
	bool is_inline = h->send_flags & VRDMA_SEND_INLINE;
	uint8_t status;

	if (!r->op || (is_inline && (r->op->flags & OP_READS)))
		return VRDMA_WC_LOC_QP_OP_ERR;
	/* A datagram QP sends, with or without immediate data, and does nothing else; a UC QP neither reads nor
	 * does atomics (they need a response, which UC has not). */
	if ((r->qp->cfg.flags & VRE_QP_UD) && (r->op->flags & ~(OP_RECV | OP_IMM | OP_PAYLOAD)))
		return VRDMA_WC_LOC_QP_OP_ERR;
	if ((r->qp->cfg.flags & VRE_QP_UC) && (r->op->flags & (OP_READS | OP_ATOMIC)))
		return VRDMA_WC_LOC_QP_OP_ERR;
	if (is_inline) {
		if (h->inline_len > r->qp->cfg.max_inline)
			return VRDMA_WC_LOC_LEN_ERR;
		r->len = h->inline_len;
		if (r->len)
			r->local[r->nlocal++] = (struct seg){ .buf = r->w->inline_data, .len = r->len };
	} else {
		if (h->num_sge > r->qp->cfg.max_send_sge)
			return VRDMA_WC_LOC_QP_OP_ERR;
		status = sges_to_segs(r->d, r->qp->cfg.pd, r->qp->cfg.flags & VRE_QP_KERNEL, r->w->sge, h->num_sge,
				      r->op->flags & OP_READS, r->d->lim.max_msg_size, r->local, &r->nlocal, &r->len);
		if (status != VRDMA_WC_SUCCESS)
			return status;
	}
	if ((r->op->flags & OP_ATOMIC) && (r->len != 8 || r->nlocal != 1 || (h->remote_addr & 7)))
		return r->len != 8 || r->nlocal != 1 ? VRDMA_WC_LOC_LEN_ERR : VRDMA_WC_REM_INV_REQ_ERR;
	return VRDMA_WC_SUCCESS;
}

/* One send WQE, start to finish. */
static enum exec execute_send(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp,
			      const struct send_wqe *w)
{
	struct vre_request r = { .e = e, .d = d, .qp = qp, .w = w, .op = vre_opcode(w->hdr.opcode),
				 .local = e->scratch.local };
	uint8_t status;
	struct vre_device *dd;
	struct vre_qp *dqp;

	d->counters.send_wqes++;
	qp->counters.send_wqes++;
	if (r.op && (r.op->flags & OP_LOCAL)) {
		/* Fast registration or local invalidation: nothing leaves the device, nothing waits. */
		status = r.op->local(d, qp, &w->hdr);
		complete_send(e, d, qp, &w->hdr, status, 0);
		if (status != VRDMA_WC_SUCCESS)
			qp_to_error(e, d, qp, 0);
		return EXEC_DONE;
	}
	status = wqe_local_data(&r);
	if (status != VRDMA_WC_SUCCESS)
		goto local_error;
	if (qp->cfg.flags & VRE_QP_UD) {
		ud_send(&r);  /* a datagram: sent (and completed) whether or not anyone takes it */
		return EXEC_DONE;
	}

	/*
	 * The destination: without one (unknown GID, QP gone, not ready to receive, or of another transport, which
	 * drops what it cannot parse) the requester retries in vain.
	 */
	dqp = qp->attr.dest_dev == VRE_NO_DEVICE ? NULL : qp_by_qpn(e, qp->attr.dest_dev, qp->attr.dest_qpn);
	dd = dqp ? &e->devices[qp->attr.dest_dev] : NULL;
	if (!dqp || !qp_receives(dqp) || !same_transport(qp->cfg.flags, dqp->cfg.flags)) {
		if (qp->cfg.flags & VRE_QP_UC) {
			d->counters.uc_dropped++;  /* sent into the void: UC has no acknowledgement to miss */
			complete_send(e, d, qp, &w->hdr, VRDMA_WC_SUCCESS, (uint32_t)r.len);
			return EXEC_DONE;
		}
		/*
		 * Nobody answers (yet: the peer may still be on its way to RTR). A real requester times out after
		 * 4.096 us * 2^timeout and retries retry_cnt times; so does this one (timeout 0: wait forever).
		 */
		if (qp->retry_left == 0) {
			status = VRDMA_WC_RETRY_EXC_ERR;
			goto local_error;
		}
		if (qp->attr.timeout)
			qp->retry_left--;
		qp->rnr_until = e->now + retry_wait_ns(qp);
		return EXEC_WAIT;
	}

	switch (respond(&r, dd, dqp, &status)) {
	case RESP_RNR:
		/* Receiver not ready: wait and retry, rnr_retry times (7: forever). */
		if (qp->attr.rnr_retry != RNR_INFINITE && qp->rnr_left == 0) {
			status = VRDMA_WC_RNR_RETRY_EXC_ERR;
			goto local_error;
		}
		if (qp->attr.rnr_retry != RNR_INFINITE)
			qp->rnr_left--;
		qp->rnr_until = e->now + rnr_wait_ns(dqp->attr.min_rnr_timer);
		d->counters.rnr_waits++;
		qp->counters.rnr_waits++;
		return EXEC_WAIT;
	case RESP_FAILED:
		return EXEC_DONE;
	case RESP_LOCAL_ERROR:
		goto local_error;
	case RESP_DROPPED:
		d->counters.uc_dropped++;
		dd->counters.uc_dropped++;
		break;
	case RESP_DONE:
		break;
	}
	qp->rnr_left = qp->attr.rnr_retry;
	qp->retry_left = qp->attr.retry_cnt;
	complete_send(e, d, qp, &w->hdr, VRDMA_WC_SUCCESS, (uint32_t)r.len);
	return EXEC_DONE;

local_error:
	complete_send(e, d, qp, &w->hdr, status, 0);
	qp_to_error(e, d, qp, 0);
	return EXEC_DONE;
}

VRE_FN void sq_wqe(const struct vre_qp *qp, uint32_t index, struct send_wqe *w)
{
	memcpy(w, mem_at(&qp->ring, qp->cfg.sq_offset + (uint64_t)(index & (qp->cfg.sq_depth - 1)) * qp->cfg.sq_stride),
	       qp->cfg.sq_stride);
}

/* Run a QP's send queue: up to `budget` WQEs, in order; flush them in the error state. */
VRE_FN uint32_t qp_poll(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, uint32_t budget)
{
	struct send_wqe *w = &e->scratch.wqe;
	uint32_t prod, n = 0;
	uint32_t state = qp->attr.state;

	if (qp->net && (state == VRDMA_QPS_RTR || state == VRDMA_QPS_RTS) && qp->ring.valid)
		n = responder_poll(e, d, qp, budget);  /* READ responses it owes its peer on another host */
	if (state != VRDMA_QPS_RTS && state != VRDMA_QPS_ERR)
		return n;
	if (!qp->ring.valid) {
		qp_to_error(e, d, qp, VRDMA_EVENT_QP_FATAL);
		return 0;
	}
	if (qp->rnr_until) {
		if (e->now < qp->rnr_until)
			return n;
		qp->rnr_until = 0;
	}
	prod = load_acquire(qp->sq_db);
	if (prod - qp->sq_head > qp->cfg.sq_depth) {
		/* More WQEs than the ring holds: the producer index is garbage. */
		qp_to_error(e, d, qp, VRDMA_EVENT_QP_FATAL);
		prod = qp->sq_head;
	}
	if (qp->net && qp->attr.state == VRDMA_QPS_RTS)
		return n + remote_poll(e, d, qp, prod, budget);
	while (qp->sq_head != prod && n < budget) {
		sq_wqe(qp, qp->sq_head, w);
		n++;
		if (qp->attr.state == VRDMA_QPS_ERR) {
			complete_send(e, d, qp, &w->hdr, VRDMA_WC_WR_FLUSH_ERR, 0);
			d->counters.flushed++;
		} else if (execute_send(e, d, qp, w) == EXEC_WAIT) {
			break;
		}
	}
	if (qp->attr.state == VRDMA_QPS_ERR && n < budget) {
		responder_flush(e, d, qp);
		n += flush_recv(e, d, qp, budget - n);
	}
	return n;
}
