// SPDX-License-Identifier: GPL-2.0-only
/*
 * The responder: what a request does at its destination QP, once the requester has checked its own side. Remote
 * memory is checked here (rkey, PD, bounds, the MR's and the QP's access rights) before a byte moves; a SEND or a
 * WRITE with immediate consumes a receive WQE whose SGEs are checked like the requester's; atomics act on 8 aligned
 * bytes. An XRC target has neither receives nor a PD of its own: the XRC SRQ the request names gives both (rx_of).
 * A failure completes the request with the status a real responder's NAK would give, and moves the QPs the
 * InfiniBand specification moves to the error state. A UC responder sends no NAK: what it cannot take is dropped
 * (a receive it consumed completes with the error), and both QPs carry on.
 */
#include "vre.h"

/* A message moved between two devices here: a READ's data leaves the destination, the others' the requester. */
static void count_bytes(const struct vre_request *r, struct vre_device *dd, struct vre_qp *dqp)
{
	uint64_t packets = packets_of(r->qp, r->len);

	if (r->op->flags & OP_READS) {
		count_tx(dd, dqp, r->len, packets);
		count_rx(r->d, r->qp, r->len, packets);
	} else {
		count_tx(r->d, r->qp, r->len, packets);
		count_rx(dd, dqp, r->len, packets);
	}
}

/* A SEND, SEND with immediate or WRITE with immediate: a receive WQE of the destination takes it. */
static enum resp deliver(const struct vre_request *r, struct vre_device *dd, struct vre_qp *dqp,
			 const struct vre_rx *rx, struct vre_mr *rmr, uint64_t roff)
{
	struct vre_engine *e = r->e;
	struct vre_scratch *s = &e->scratch;
	const struct vrdma_send_wqe *h = &r->w->hdr;
	uint32_t rmax_sge = 0, nremote = 0;
	enum take taken = take_recv(e, dd, dqp, rx, &s->rwqe, &rmax_sge);
	bool uc = dqp->cfg.flags & VRE_QP_UC;

	if (taken == TAKE_EMPTY)
		return uc ? RESP_DROPPED : RESP_RNR;  /* UC: no RNR NAK, the message is lost */
	if (taken == TAKE_BROKEN) {
		qp_to_error(e, dd, dqp, VRDMA_EVENT_QP_FATAL);
		if (uc)
			return RESP_DROPPED;
		complete_send(e, r->d, r->qp, h, VRDMA_WC_REM_OP_ERR, 0);
		qp_to_error(e, r->d, r->qp, 0);
		return RESP_FAILED;
	}
	struct vrdma_cqe rcqe = { .wr_id = s->rwqe.hdr.wr_id, .opcode = VRDMA_WC_OP_RECV,
				  .byte_len = (uint32_t)r->len, .qp_num = dqp->cfg.qpn, .src_qp = r->qp->cfg.qpn };
	uint8_t rstatus = VRDMA_WC_SUCCESS;
	uint64_t room = 0;
	bool invalid;

	if (r->op->flags & OP_REMOTE) {
		rcqe.opcode = VRDMA_WC_OP_RECV_RDMA_WITH_IMM;  /* the data went to the rkey's memory, not the WQE's */
	} else if (s->rwqe.hdr.num_sge > rmax_sge) {
		rstatus = VRDMA_WC_LOC_QP_OP_ERR;
	} else {
		rstatus = sges_to_segs(dd, rx->pd, rx->kernel, s->rwqe.sge, s->rwqe.hdr.num_sge, true, UINT64_MAX,
				       s->remote, &nremote, &room);
		if (rstatus == VRDMA_WC_SUCCESS && room < r->len)
			rstatus = VRDMA_WC_LOC_LEN_ERR;
	}
	/* SEND_WITH_INV: the key it names goes with the message, or the message is an invalid request. */
	if (rstatus == VRDMA_WC_SUCCESS && (r->op->flags & OP_INV) &&
	    mr_invalidate(dd, rx->pd, dqp->cfg.qpn, h->imm_data) != VRDMA_WC_SUCCESS)
		rstatus = VRDMA_WC_REM_INV_REQ_ERR;
	if (rstatus != VRDMA_WC_SUCCESS) {
		rcqe.status = rstatus;
		rcqe.byte_len = 0;
		cq_push(e, dd, rx->cq, &rcqe, false);
		dqp->counters.error_cqes++;
		if (uc)
			return RESP_DROPPED;
		qp_to_error(e, dd, dqp, VRDMA_EVENT_QP_REQ_ERR);
		invalid = rstatus == VRDMA_WC_LOC_LEN_ERR || rstatus == VRDMA_WC_REM_INV_REQ_ERR;
		complete_send(e, r->d, r->qp, h, invalid ? VRDMA_WC_REM_INV_REQ_ERR : VRDMA_WC_REM_OP_ERR, 0);
		qp_to_error(e, r->d, r->qp, 0);
		return RESP_FAILED;
	}
	if (r->op->flags & OP_REMOTE) {
		if (rmr) {
			struct seg dst = { .mem = &rmr->mem, .off = roff, .len = r->len };

			copy_segs(&dst, 1, r->local, r->nlocal);
		}
	} else {
		copy_segs(s->remote, nremote, r->local, r->nlocal);
	}
	if (r->op->flags & OP_IMM) {
		rcqe.imm_data = h->imm_data;
		rcqe.wc_flags = VRDMA_WC_WITH_IMM;
	}
	if (r->op->flags & OP_INV) {
		rcqe.imm_data = h->imm_data;  /* the key it invalidated */
		rcqe.wc_flags = VRDMA_WC_WITH_INV;
	}
	count_bytes(r, dd, dqp);
	cq_push(e, dd, rx->cq, &rcqe, h->send_flags & VRDMA_SEND_SOLICITED);
	return RESP_DONE;
}

/* Atomics: 8 aligned bytes, so inside one page of the MR; the original value goes back to the local SGE. */
static enum resp atomic(const struct vre_request *r, struct vre_mr *rmr, uint64_t roff, uint8_t *status)
{
	const struct vrdma_send_wqe *h = &r->w->hdr;
	uint64_t *target = (uint64_t *)mem_at(&rmr->mem, roff), original;
	struct seg src = { .buf = (const uint8_t *)&original, .len = 8 };

	if ((uintptr_t)target & 7) {
		*status = VRDMA_WC_REM_INV_REQ_ERR;
		return RESP_LOCAL_ERROR;
	}
	if (r->w->hdr.opcode == VRDMA_WR_ATOMIC_CMP_AND_SWP) {
		original = h->compare_add;
		__atomic_compare_exchange_n(target, &original, h->swap, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
	} else {
		original = __atomic_fetch_add(target, h->compare_add, __ATOMIC_SEQ_CST);
	}
	copy_segs(r->local, r->nlocal, &src, 1);
	return RESP_DONE;
}

VRE_FN enum resp respond(const struct vre_request *r, struct vre_device *dd, struct vre_qp *dqp, uint8_t *status)
{
	uint32_t flags = r->op->flags;
	struct vre_mr *rmr = NULL;
	struct vre_rx rx;
	uint64_t roff = 0;

	if (!rx_of(dd, dqp, r->w->hdr.xrc_srqn, &rx)) {
		/* An XRC SRQ number the target's XRC domain does not have: an invalid request, both ends in error. */
		complete_send(r->e, r->d, r->qp, &r->w->hdr, VRDMA_WC_REM_INV_REQ_ERR, 0);
		qp_to_error(r->e, r->d, r->qp, 0);
		qp_to_error(r->e, dd, dqp, VRDMA_EVENT_QP_REQ_ERR);
		return RESP_FAILED;
	}
	/* Remote memory: the responder checks the rkey (a zero-length transfer names none; an atomic always does). */
	if ((flags & OP_ATOMIC) || ((flags & OP_REMOTE) && r->len)) {
		rmr = remote_mr(dd, dqp, rx.pd, r->w->hdr.rkey, r->w->hdr.remote_addr, r->len, r->op->remote_access,
				&roff);
		if (!rmr && (dqp->cfg.flags & VRE_QP_UC))
			return RESP_DROPPED;  /* nothing is written, and a UC requester never learns it */
		if (!rmr) {
			/* Remote access error: nothing is read or written; both ends go to the error state. */
			complete_send(r->e, r->d, r->qp, &r->w->hdr, VRDMA_WC_REM_ACCESS_ERR, 0);
			qp_to_error(r->e, r->d, r->qp, 0);
			qp_to_error(r->e, dd, dqp, VRDMA_EVENT_QP_ACCESS_ERR);
			return RESP_FAILED;
		}
	}
	if (flags & OP_RECV)
		return deliver(r, dd, dqp, &rx, rmr, roff);
	if (flags & OP_ATOMIC)
		return atomic(r, rmr, roff, status);
	if (r->len) {  /* RDMA WRITE or READ: one copy between the two VMs' registered memory */
		struct seg far = { .mem = &rmr->mem, .off = roff, .len = r->len };

		if (flags & OP_READS)
			copy_segs(r->local, r->nlocal, &far, 1);
		else
			copy_segs(&far, 1, r->local, r->nlocal);
	}
	count_bytes(r, dd, dqp);
	return RESP_DONE;
}
