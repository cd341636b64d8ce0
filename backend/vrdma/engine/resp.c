// SPDX-License-Identifier: GPL-2.0-only
/*
 * The responder: what a request does at its destination QP, once the requester has checked its own side. Remote
 * memory is checked here (rkey, PD, bounds, the MR's and the QP's access rights) before a byte moves; a SEND or a
 * WRITE with immediate consumes a receive WQE whose SGEs are checked like the requester's; atomics act on 8 aligned
 * bytes. An XRC target has neither receives nor a PD of its own: the XRC SRQ the request names gives both (rx_of).
 * A failure completes the request with the status a real responder's NAK would give, and moves the QPs the
 * InfiniBand specification moves to the error state. A UC responder sends no NAK: what it cannot take is dropped
 * (a receive it consumed completes with the error), and both QPs carry on.
 *
 * A message the scheduler cut into pieces comes here once per piece, checked each time as the first was (the rkey
 * for its whole range); a SEND's receive is taken by its first piece and held by the destination QP until its last,
 * a WRITE with immediate takes its receive with its last piece, and nothing completes before the last.
 */
#include <stdlib.h>
#include <string.h>

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

/*
 * Move this piece of the message ([r->off, r->off + r->piece)) between the requester's local segments and `far`,
 * the responder's side taken as one run from the message's first byte: into the local ones for a READ.
 */
static void move_piece(const struct vre_request *r, struct seg *far, uint32_t nfar, bool to_local)
{
	struct vre_scratch *s = &ctx(r->e)->scratch;
	struct seg *local = r->local, *remote = far;
	uint32_t nlocal = r->nlocal, nremote = nfar;

	if (r->piece != r->len) {
		nlocal = segs_slice(r->local, r->nlocal, r->off, r->piece, s->local_piece);
		local = s->local_piece;
		nremote = segs_slice(far, nfar, r->off, r->piece, s->remote_piece);
		remote = s->remote_piece;
	}
	if (to_local)
		copy_segs(local, nlocal, remote, nremote);
	else
		copy_segs(remote, nremote, local, nlocal);
}

/* The requester's message is an invalid request at the destination: both ends in error. */
static enum resp invalid_request(const struct vre_request *r, struct vre_device *dd, struct vre_qp *dqp)
{
	complete_send(r->e, r->d, r->qp, &r->w->hdr, VRDMA_WC_REM_INV_REQ_ERR, 0);
	qp_to_error(r->e, r->d, r->qp, 0);
	qp_to_error(r->e, dd, dqp, VRDMA_EVENT_QP_REQ_ERR);
	return RESP_FAILED;
}

/*
 * The receive WQE this piece of a SEND (or the last piece of a WRITE with immediate) fills, in *rw: the one the
 * destination holds for a message under way (a later piece, or a message that starts again), else the next one
 * posted (held when more pieces follow). RESP_DONE, or what the responder answers when there is none.
 */
static enum resp receive_of(const struct vre_request *r, struct vre_device *dd, struct vre_qp *dqp,
			    const struct vre_rx *rx, struct recv_wqe **rw, uint32_t *rmax_sge)
{
	struct vre_engine *e = r->e;
	struct vre_held_recv *held = &dqp->held;
	bool uc = dqp->cfg.flags & VRE_QP_UC;
	enum take taken;

	if (held->held && !(r->op->flags & OP_REMOTE)) {
		*rw = held->wqe;
		*rmax_sge = held->max_sge;
		return RESP_DONE;
	}
	if (!r->first && !(r->op->flags & OP_REMOTE))
		return uc ? RESP_DROPPED : invalid_request(r, dd, dqp);  /* a later piece, and no receive under way */
	if (!r->last && !held->wqe && !(held->wqe = malloc(sizeof(*held->wqe))))
		return RESP_RNR;  /* no memory to hold it: the requester tries again later */
	taken = take_recv(e, dd, dqp, rx, &ctx(e)->scratch.rwqe, rmax_sge);
	if (taken == TAKE_EMPTY)
		return uc ? RESP_DROPPED : RESP_RNR;  /* UC: no RNR NAK, the message is lost */
	if (taken == TAKE_BROKEN) {
		qp_to_error(e, dd, dqp, VRDMA_EVENT_QP_FATAL);
		if (uc)
			return RESP_DROPPED;
		complete_send(e, r->d, r->qp, &r->w->hdr, VRDMA_WC_REM_OP_ERR, 0);
		qp_to_error(e, r->d, r->qp, 0);
		return RESP_FAILED;
	}
	*rw = &ctx(e)->scratch.rwqe;
	if (!r->last) {
		memcpy(held->wqe, &ctx(e)->scratch.rwqe, sizeof(*held->wqe));
		held->max_sge = *rmax_sge;
		held->held = true;
		*rw = held->wqe;
	}
	return RESP_DONE;
}

/* A SEND, SEND with immediate or WRITE with immediate: a receive WQE of the destination takes it. */
static enum resp deliver(const struct vre_request *r, struct vre_device *dd, struct vre_qp *dqp,
			 const struct vre_rx *rx, struct vre_mr *rmr, uint64_t roff)
{
	struct vre_engine *e = r->e;
	struct vre_scratch *s = &ctx(e)->scratch;
	const struct vrdma_send_wqe *h = &r->w->hdr;
	uint32_t rmax_sge = 0, nremote = 0;
	bool uc = dqp->cfg.flags & VRE_QP_UC;
	struct recv_wqe *rw = NULL;
	enum resp got;

	if ((r->op->flags & OP_REMOTE) && !r->last) {
		/* A WRITE with immediate before its last piece: data only, the receive is its last piece's. */
		struct seg far = { .mem = &rmr->mem, .off = roff, .len = r->len };

		move_piece(r, &far, 1, false);
		return RESP_MORE;
	}
	got = receive_of(r, dd, dqp, rx, &rw, &rmax_sge);
	if (got != RESP_DONE)
		return got;
	struct vrdma_cqe rcqe = { .wr_id = rw->hdr.wr_id, .opcode = VRDMA_WC_OP_RECV,
				  .byte_len = (uint32_t)r->len, .qp_num = dqp->cfg.qpn, .src_qp = r->qp->cfg.qpn };
	uint8_t rstatus = VRDMA_WC_SUCCESS;
	uint64_t room = 0;
	bool invalid;

	if (r->op->flags & OP_REMOTE) {
		rcqe.opcode = VRDMA_WC_OP_RECV_RDMA_WITH_IMM;  /* the data went to the rkey's memory, not the WQE's */
	} else if (rw->hdr.num_sge > rmax_sge) {
		rstatus = VRDMA_WC_LOC_QP_OP_ERR;
	} else {
		rstatus = sges_to_segs(dd, rx->pd, rx->kernel, rw->sge, rw->hdr.num_sge, true, UINT64_MAX,
				       s->remote, &nremote, &room);
		if (rstatus == VRDMA_WC_SUCCESS && room < r->len)
			rstatus = VRDMA_WC_LOC_LEN_ERR;
	}
	/* SEND_WITH_INV: the key it names goes with the message, or the message is an invalid request. */
	if (rstatus == VRDMA_WC_SUCCESS && r->last && (r->op->flags & OP_INV) &&
	    mr_invalidate(dd, rx->pd, dqp->cfg.qpn, h->imm_data) != VRDMA_WC_SUCCESS)
		rstatus = VRDMA_WC_REM_INV_REQ_ERR;
	if (rstatus != VRDMA_WC_SUCCESS) {
		dqp->held.held = false;  /* the receive completes, with the error */
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

			move_piece(r, &dst, 1, false);
		}
	} else {
		move_piece(r, s->remote, nremote, false);
	}
	if (!r->last)
		return RESP_MORE;
	dqp->held.held = false;
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
	mem_dirty(&rmr->mem, roff, 8);
	copy_segs(r->local, r->nlocal, &src, 1);
	return RESP_DONE;
}

VRE_FN enum resp respond(const struct vre_request *r, struct vre_device *dd, struct vre_qp *dqp, uint8_t *status)
{
	uint32_t flags = r->op->flags;
	struct vre_mr *rmr = NULL;
	struct vre_rx rx;
	uint64_t roff = 0;

	if (!rx_of(dd, dqp, r->w->hdr.xrc_srqn, &rx))
		return invalid_request(r, dd, dqp);  /* an XRC SRQ number the target's XRC domain does not have */
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

		move_piece(r, &far, 1, flags & OP_READS);
	}
	if (!r->last)
		return RESP_MORE;
	count_bytes(r, dd, dqp);
	return RESP_DONE;
}
