// SPDX-License-Identifier: GPL-2.0-only
/*
 * The responder of a QP whose peer is on another host: the requests that arrive for it as RoCE packets.
 *
 * Packets are taken in PSN order only. The expected one runs: a SEND's first packet takes a receive WQE (none
 * posted: an RNR NAK, and the requester sends again after its wait), its packets fill that receive's SGEs at their
 * place in the message and its last completes it; a WRITE's first packet names the remote memory (RETH: rkey, PD,
 * bounds and access checked as on the local path, mr.c's remote_mr) and every packet is checked against it; a
 * READ becomes responses, sent from responder_poll as the transmit ring has room; an atomic runs once and its
 * answer is kept. A packet ahead of the expected PSN gets one sequence-error NAK per gap; a duplicate (behind it)
 * is answered again without running twice: an ACK for a SEND or WRITE, the responses again for a READ, the kept
 * answer for an atomic. Anything that breaks the rules of the transport (a message without its first packet, a
 * middle packet that is not a whole MTU, more data than the RETH or the receive said) is an invalid request; a bad
 * key an access error: a NAK, and the QP goes to the error state, as the specification's responder does. UC has
 * no acknowledgements: what it cannot take is dropped, and a gap drops the message it falls in.
 */
#include <string.h>

#include "vre.h"

/* A NAK's syndrome, by its code. */
#define NAK(code) (AETH_NAK | (code))


/* A response without data, if the ring has room (a lost one is made good by the requester's timer). */
static void send_response(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp,
			  const struct vre_roce_pkt *pkt)
{
	struct vre_tx_pkt *slot = tx_slot(e, false);

	if (slot)
		tx_queue(e, d, &qp->net->addr, slot, pkt, 0);
	else
		net_count(&e->net.tx_dropped, 1);
}

static void send_ack(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, uint32_t aeth, uint32_t psn)
{
	struct vre_roce_pkt pkt = { .opcode = ROCE_RC_ACKNOWLEDGE, .pkey = ROCE_DEFAULT_PKEY,
				    .dest_qpn = qp->attr.dest_qpn, .psn = psn,
				    .aeth = aeth };

	send_response(e, d, qp, &pkt);
}

/*
 * An ACK or NAK (syndrome) for `psn`, in PSN order: behind the answers still owed to earlier READs and atomics it
 * waits, and responder_poll sends it after them (each says everything before it was taken, so the newest one
 * waiting stands for all); so it does behind one that already waits (for them, or for room in the ring).
 */
static void acknowledge(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, uint8_t syndrome, uint32_t psn)
{
	struct vre_remote *n = qp->net;
	uint32_t aeth = aeth_make(syndrome, n->msn);

	if (n->ack_owed || answers_owed(n)) {
		n->ack_owed = true;
		n->ack_psn = psn;
		n->ack_aeth = aeth;
		return;
	}
	send_ack(e, d, qp, aeth, psn);
}

/* The request breaks the rules or the keys: NAK it and go to the error state (an event for the guest). What was
 * owed is not sent: a QP in error answers nothing more. */
static void refuse(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, uint8_t nak, uint32_t event)
{
	struct vre_remote *n = qp->net;

	n->ack_owed = false;
	send_ack(e, d, qp, aeth_make(nak, n->msn), n->epsn);
	qp_to_error(e, d, qp, event);
}

/* The held receive (n->rwqe) completes: it is the guest's again. */
static void complete_recv(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, const struct vre_rx *rx,
			  struct vrdma_cqe *cqe, bool solicited)
{
	qp->net->rwqe_held = false;
	cq_push(e, d, rx->cq, cqe, solicited);
	if (cqe->status != VRDMA_WC_SUCCESS)
		qp->counters.error_cqes++;
}

/*
 * The receive a SEND (or a WRITE with immediate) lands in: taken at its first (or only, or last) packet, and held
 * until the message completes it. A message that does not finish leaves it held: the next message takes the same
 * receive (UC, whose lost messages consume nothing), or the QP's error flushes it first (responder_flush), so
 * that no receive is ever taken and not completed.
 */
static bool take_receive(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, const struct vre_rx *rx,
			 bool uc)
{
	uint32_t max_sge = 0;

	if (qp->net->rwqe_held)
		return true;
	switch (take_recv(e, d, qp, rx, qp->net->rwqe, &max_sge)) {
	case TAKE_OK:
		qp->net->rwqe_held = true;
		if (qp->net->rwqe->hdr.num_sge <= max_sge)
			return true;
		qp->net->rwqe->hdr.num_sge = 0;
		/* a receive with more SGEs than its queue allows is a broken ring */
		__attribute__((fallthrough));
	case TAKE_BROKEN:
		qp_to_error(e, d, qp, VRDMA_EVENT_QP_FATAL);
		return false;
	case TAKE_EMPTY:
		if (uc) {
			d->counters.uc_dropped++;
			d->roce.resp_drop_resource++;
		} else {
			acknowledge(e, d, qp, AETH_RNR_NAK | (qp->attr.min_rnr_timer & AETH_VALUE_MASK), qp->net->epsn);
			d->roce.rnr_naks++;
		}
		return false;
	}
	return false;
}

/* A SEND packet's data into the receive at its place in the message; an error status (and the receive completed
 * with it) when it does not fit or the receive's memory is not the QP's to write. */
static uint8_t send_data(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, const struct vre_rx *rx,
		      const uint8_t *payload, uint32_t len)
{
	struct vre_remote *n = qp->net;
	struct vre_scratch *s = &ctx(e)->scratch;
	uint32_t nsegs = 0;
	uint64_t room = 0;
	uint8_t status = sges_to_segs(d, rx->pd, rx->kernel, n->rwqe->sge, n->rwqe->hdr.num_sge, true, UINT64_MAX,
				      s->remote, &nsegs, &room);

	if (status == VRDMA_WC_SUCCESS && n->msg_off + len > room)
		status = VRDMA_WC_LOC_LEN_ERR;
	if (status != VRDMA_WC_SUCCESS) {
		struct vrdma_cqe cqe = { .wr_id = n->rwqe->hdr.wr_id, .status = status, .opcode = VRDMA_WC_OP_RECV,
					 .qp_num = qp->cfg.qpn };

		complete_recv(e, d, qp, rx, &cqe, false);
		n->in_send = false;
		return status;
	}
	copy_at(s->remote, nsegs, n->msg_off, (uint8_t *)(uintptr_t)payload, len, true);
	return VRDMA_WC_SUCCESS;
}

/* The remote memory a WRITE packet's data goes to (checked for this packet's range), or NULL. */
static struct vre_mr *write_target(struct vre_device *d, struct vre_qp *qp, const struct vre_rx *rx, uint32_t len,
				   uint64_t *off)
{
	struct vre_remote *n = qp->net;

	return remote_mr(d, qp, rx->pd, n->wr_rkey, n->wr_va + n->msg_off, len, VRDMA_ACCESS_REMOTE_WRITE, off);
}

/*
 * The responder's steps, in the order a request passes them (the states of rxe's rxe_resp.c): each lets the packet
 * on, answers it (an ACK, a NAK, READ responses) or drops it, and a drop is counted under its step's name (struct
 * vre_roce_counters: resp_drop_opcode ... resp_drop_rkey; UC's lost messages are in uc_dropped as well).
 *
 *   opcode     a request this QP's responder takes: not an answer; UC: a SEND or WRITE (remote_request)
 *   psn        the expected PSN: ahead, one sequence NAK per gap (UC: the gap loses its message); behind, a duplicate
 *   duplicate  answered again, never run twice (duplicate)
 *   length     within the path MTU (else malformed, dropped unseen); within what the RETH or the receive allows
 *   sequence   its place in a message: a first packet starts one, middle and last packets continue it, and every
 *              packet but the last is a whole MTU (in_sequence)
 *   resource   a receive WQE for a SEND or a WRITE with immediate (none: an RNR NAK); a slot for a READ or atomic
 *   rkey       the remote memory a WRITE, READ or atomic names: key, PD, bounds, access (remote_mr)
 *   execute    the data placed, the atomic run, the READ queued for responder_poll
 *   complete   the receive's completion at a message's last packet, the key a SEND with invalidate names
 */

/* sequence: a SEND or WRITE packet in its place in a message; out of order, NAKed (RC) or dropped (UC). */
static bool in_sequence(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, const struct vre_roce_pkt *pkt,
			const struct roce_op *op)
{
	struct vre_remote *n = qp->net;
	bool first = roce_starts(op), send = op->kind == ROCE_SEND;

	if (first != (n->in_send || n->in_write) && (first || (send ? n->in_send : n->in_write)) &&
	    (roce_ends(op) || pkt->payload_len == n->mtu))
		return true;
	if (qp->cfg.flags & VRE_QP_UC) {
		n->in_send = n->in_write = false;
		d->counters.uc_dropped++;
		d->roce.resp_drop_sequence++;
	} else {
		refuse(e, d, qp, NAK(AETH_NAK_INVALID_REQUEST), VRDMA_EVENT_QP_REQ_ERR);
	}
	return false;
}

/* resource (a SEND's receive) at a message's first packet; a WRITE's RETH is kept for the packets after it. */
static bool message_starts(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp,
			   const struct vre_roce_pkt *pkt, const struct roce_op *op, const struct vre_rx *rx)
{
	struct vre_remote *n = qp->net;

	n->msg_off = 0;
	if (op->kind == ROCE_SEND) {
		if (!take_receive(e, d, qp, rx, qp->cfg.flags & VRE_QP_UC))
			return false;  /* RC: RNR NAK sent, the requester comes back */
		n->in_send = true;
		return true;
	}
	n->wr_va = pkt->va;
	n->wr_rkey = pkt->rkey;
	n->wr_len = pkt->dma_len;
	n->in_write = true;
	return true;
}

/* length (the receive's room) and execute: a SEND packet's data into the receive it holds. */
static bool send_lands(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, const struct vre_roce_pkt *pkt,
		       const uint8_t *payload, const struct vre_rx *rx)
{
	uint8_t status = send_data(e, d, qp, rx, payload, pkt->payload_len);

	if (status == VRDMA_WC_SUCCESS)
		return true;
	if (!(qp->cfg.flags & VRE_QP_UC))
		refuse(e, d, qp, NAK(status == VRDMA_WC_LOC_LEN_ERR ? AETH_NAK_INVALID_REQUEST :
				     AETH_NAK_REMOTE_OPERATION), VRDMA_EVENT_QP_REQ_ERR);
	return false;
}

/* length (within the RETH), resource (a WRITE with immediate's receive), rkey and execute: a WRITE packet's data
 * into the memory its message names. */
static bool write_lands(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, const struct vre_roce_pkt *pkt,
			const struct roce_op *op, const uint8_t *payload, const struct vre_rx *rx)
{
	struct vre_remote *n = qp->net;
	bool uc = qp->cfg.flags & VRE_QP_UC, last = roce_ends(op);
	struct vre_mr *mr;
	uint64_t off;

	if (n->msg_off + pkt->payload_len > n->wr_len || (last && n->msg_off + pkt->payload_len != n->wr_len)) {
		n->in_write = false;
		if (uc)
			d->roce.resp_drop_length++;
		else
			refuse(e, d, qp, NAK(AETH_NAK_INVALID_REQUEST), VRDMA_EVENT_QP_REQ_ERR);
		return false;
	}
	/* A WRITE with immediate consumes a receive at its last packet: taken before its data lands, so an RNR NAK
	 * leaves the message as it was for the packet's return. */
	if (last && (op->headers & VRE_ROCE_IMM) && !take_receive(e, d, qp, rx, uc)) {
		if (roce_starts(op) || uc)
			n->in_write = false;
		return false;
	}
	if (!pkt->payload_len)
		return true;
	mr = write_target(d, qp, rx, pkt->payload_len, &off);
	if (!mr) {
		n->in_write = false;
		if (uc) {
			d->counters.uc_dropped++;
			d->roce.resp_drop_rkey++;
		} else {
			refuse(e, d, qp, NAK(AETH_NAK_REMOTE_ACCESS), VRDMA_EVENT_QP_ACCESS_ERR);
		}
		return false;
	}
	struct seg dst = { .mem = &mr->mem, .off = off, .len = pkt->payload_len };

	copy_at(&dst, 1, 0, (uint8_t *)(uintptr_t)payload, pkt->payload_len, true);
	return true;
}

/* complete: a message's last packet completes the receive it took (a SEND, a WRITE with immediate). */
static bool message_completes(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp,
			      const struct vre_roce_pkt *pkt, const struct roce_op *op, const struct vre_rx *rx)
{
	struct vre_remote *n = qp->net;
	bool send = op->kind == ROCE_SEND, imm = op->headers & VRE_ROCE_IMM;

	if (send || imm) {
		struct vrdma_cqe cqe = { .wr_id = n->rwqe->hdr.wr_id, .opcode = send ? VRDMA_WC_OP_RECV :
					 VRDMA_WC_OP_RECV_RDMA_WITH_IMM, .byte_len = (uint32_t)(send ? n->msg_off : 0),
					 .qp_num = qp->cfg.qpn, .src_qp = qp->attr.dest_qpn };

		if (imm) {
			cqe.imm_data = pkt->imm;
			cqe.wc_flags = VRDMA_WC_WITH_IMM;
			cqe.byte_len = (uint32_t)n->msg_off;
		}
		if (op->headers & VRE_ROCE_IETH) {
			if (mr_invalidate(d, rx->pd, qp->cfg.qpn, pkt->inv_rkey) != VRDMA_WC_SUCCESS) {
				cqe.status = VRDMA_WC_REM_INV_REQ_ERR;
				cqe.byte_len = 0;
				complete_recv(e, d, qp, rx, &cqe, false);
				n->in_send = false;
				if (!(qp->cfg.flags & VRE_QP_UC))
					refuse(e, d, qp, NAK(AETH_NAK_INVALID_REQUEST), VRDMA_EVENT_QP_REQ_ERR);
				return false;
			}
			cqe.imm_data = pkt->inv_rkey;
			cqe.wc_flags = VRDMA_WC_WITH_INV;
		}
		complete_recv(e, d, qp, rx, &cqe, pkt->solicited);
	}
	n->in_send = n->in_write = false;
	n->msn++;
	return true;
}

/*
 * A SEND or WRITE packet at the expected PSN, through its steps. Returns whether it was taken (the PSN advances):
 * an RC packet refused or waiting for a receive is not; a UC packet always is (what UC cannot take is lost).
 */
static bool message_packet(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp,
			   const struct vre_roce_pkt *pkt, const uint8_t *payload, const struct vre_rx *rx)
{
	struct vre_remote *n = qp->net;
	const struct roce_op *op = roce_op(pkt->opcode);
	bool uc = qp->cfg.flags & VRE_QP_UC;

	if (pkt->payload_len > n->mtu) {
		d->roce.dropped++;  /* length: longer than the path allows, malformed, dropped unseen (no NAK) */
		d->roce.resp_drop_length++;
		return false;
	}
	if (!in_sequence(e, d, qp, pkt, op) || (roce_starts(op) && !message_starts(e, d, qp, pkt, op, rx)))
		return uc;
	if (!(op->kind == ROCE_SEND ? send_lands(e, d, qp, pkt, payload, rx) :
				       write_lands(e, d, qp, pkt, op, payload, rx)))
		return uc;
	n->msg_off += pkt->payload_len;
	count_rx(d, qp, pkt->payload_len, 1);
	if (roce_ends(op) && !message_completes(e, d, qp, pkt, op, rx))
		return uc;
	return true;
}

/* A new READ or atomic: a slot of the responder's ring of them (the oldest answered one makes room). */
static struct vre_rd_job *new_job(struct vre_qp *qp)
{
	struct vre_remote *n = qp->net;
	uint32_t limit = qp->attr.max_dest_rd_atomic ? qp->attr.max_dest_rd_atomic : 1, busy = 0;

	limit = limit < VRE_MAX_RD ? limit : VRE_MAX_RD;

	for (uint32_t i = n->rd_head; i != n->rd_tail; i++) {
		const struct vre_rd_job *job = &n->rd[i % VRE_MAX_RD];

		busy += job->sent < job->npkts;
	}
	if (busy >= limit)
		return NULL;
	/* Answers go in order, so an owed job has only owed jobs after it: with busy < limit <= VRE_MAX_RD, the
	 * oldest of a full ring is answered, kept only to answer a duplicate. */
	if (n->rd_tail - n->rd_head == VRE_MAX_RD)
		n->rd_head++;
	return &n->rd[n->rd_tail++ % VRE_MAX_RD];
}

/* A READ request in sequence: checked now, answered from responder_poll. */
static void read_request(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp,
			 const struct vre_roce_pkt *pkt, const struct vre_rx *rx)
{
	struct vre_remote *n = qp->net;
	struct vre_rd_job *job;
	uint64_t off;

	if (pkt->dma_len && !remote_mr(d, qp, rx->pd, pkt->rkey, pkt->va, pkt->dma_len, VRDMA_ACCESS_REMOTE_READ,
				       &off)) {
		refuse(e, d, qp, NAK(AETH_NAK_REMOTE_ACCESS), VRDMA_EVENT_QP_ACCESS_ERR);
		return;
	}
	job = new_job(qp);
	if (!job) {  /* more READs outstanding than max_dest_rd_atomic allows */
		refuse(e, d, qp, NAK(AETH_NAK_INVALID_REQUEST), VRDMA_EVENT_QP_REQ_ERR);
		return;
	}
	*job = (struct vre_rd_job){ .psn = pkt->psn, .npkts = pkt->dma_len ? DIV_ROUND_UP(pkt->dma_len, n->mtu) : 1,
				    .rkey = pkt->rkey, .va = pkt->va, .len = pkt->dma_len };
	n->epsn = psn_add(n->epsn, job->npkts);
	n->msn++;
	responder_poll(e, d, qp, VRE_TX_RING);
}

/* An atomic's acknowledgement (its original value), if the ring has room: false when it had none. */
static bool atomic_answer(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, const struct vre_rd_job *job)
{
	struct vre_roce_pkt pkt = { .opcode = ROCE_RC_ATOMIC_ACKNOWLEDGE, .pkey = ROCE_DEFAULT_PKEY,
				    .dest_qpn = qp->attr.dest_qpn, .psn = job->psn,
				    .aeth = aeth_make(AETH_ACK_UNLIMITED, qp->net->msn),
				    .orig = job->orig };
	struct vre_tx_pkt *slot = tx_slot(e, false);

	if (!slot)
		return false;
	tx_queue(e, d, &qp->net->addr, slot, &pkt, 0);
	return true;
}

static void atomic_request(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp,
			   const struct vre_roce_pkt *pkt, const struct vre_rx *rx)
{
	struct vre_remote *n = qp->net;
	struct vre_rd_job *job;
	struct vre_mr *mr;
	uint64_t *target, off, orig;

	mr = remote_mr(d, qp, rx->pd, pkt->rkey, pkt->va, 8, VRDMA_ACCESS_REMOTE_ATOMIC, &off);
	if (!mr) {
		refuse(e, d, qp, NAK(AETH_NAK_REMOTE_ACCESS), VRDMA_EVENT_QP_ACCESS_ERR);
		return;
	}
	target = (uint64_t *)mem_at(&mr->mem, off);
	job = (pkt->va & 7) || ((uintptr_t)target & 7) ? NULL : new_job(qp);
	if (!job) {
		refuse(e, d, qp, NAK(AETH_NAK_INVALID_REQUEST), VRDMA_EVENT_QP_REQ_ERR);
		return;
	}
	if (pkt->opcode == ROCE_RC_COMPARE_SWAP) {
		orig = pkt->compare;
		__atomic_compare_exchange_n(target, &orig, pkt->swap_add, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
	} else {
		orig = __atomic_fetch_add(target, pkt->swap_add, __ATOMIC_SEQ_CST);
	}
	mem_dirty(&mr->mem, off, 8);
	*job = (struct vre_rd_job){ .psn = pkt->psn, .npkts = 1, .atomic = true, .orig = orig };
	n->epsn = psn_add(n->epsn, 1);
	n->msn++;
	responder_poll(e, d, qp, VRE_TX_RING);  /* its answer, after those owed before it */
}

/* A request behind the expected PSN: answered again, never run twice. */
static void duplicate(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, const struct vre_roce_pkt *pkt,
		      const struct vre_rx *rx)
{
	struct vre_remote *n = qp->net;
	uint8_t kind = roce_op(pkt->opcode)->kind;
	uint64_t off;

	d->roce.duplicates++;
	if (kind == ROCE_SEND || kind == ROCE_WRITE) {
		acknowledge(e, d, qp, AETH_ACK_UNLIMITED, psn_add(n->epsn, PSN_MASK));
		return;
	}
	for (uint32_t i = n->rd_tail; i != n->rd_head; i--) {
		struct vre_rd_job *job = &n->rd[(i - 1) % VRE_MAX_RD];

		if (psn_diff(pkt->psn, job->psn) < 0 || psn_diff(pkt->psn, job->psn) >= (int32_t)job->npkts)
			continue;
		uint32_t npkts = pkt->dma_len ? DIV_ROUND_UP(pkt->dma_len, n->mtu) : 1;

		if (kind == ROCE_ATOMIC && job->atomic && job->psn == pkt->psn) {
			job->sent = 0;  /* the kept answer, again */
			responder_poll(e, d, qp, VRE_TX_RING);
		} else if (kind == ROCE_READ && !job->atomic && pkt->rkey == job->rkey &&
			   psn_diff(psn_add(pkt->psn, npkts), psn_add(job->psn, job->npkts)) <= 0 &&
			   (!pkt->dma_len || remote_mr(d, qp, rx->pd, pkt->rkey, pkt->va, pkt->dma_len,
						       VRDMA_ACCESS_REMOTE_READ, &off))) {
			/* Asked again from `psn` on: the responses from there, for what the request now names, within
			 * the PSNs the READ took (past them are other requests' PSNs). */
			job->psn = pkt->psn;
			job->va = pkt->va;
			job->len = pkt->dma_len;
			job->npkts = npkts;
			job->sent = 0;
			responder_poll(e, d, qp, VRE_TX_RING);
		} else {
			d->roce.dropped++;  /* names another request than the one that took its PSN */
			d->roce.resp_drop_duplicate++;
		}
		return;
	}
	d->roce.dropped++;  /* too old to answer: the requester's retries run out */
	d->roce.resp_drop_duplicate++;
}

VRE_FN void remote_request(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp,
			   const struct vre_roce_pkt *pkt, const uint8_t *payload)
{
	struct vre_remote *n = qp->net;
	const struct roce_op *op = roce_op(pkt->opcode);
	bool uc = qp->cfg.flags & VRE_QP_UC;
	int32_t ahead = psn_diff(pkt->psn, n->epsn);
	uint8_t kind = op->kind;
	struct vre_rx rx;

	if (roce_is_answer(op) || (uc && kind != ROCE_SEND && kind != ROCE_WRITE) || !rx_of(d, qp, 0, &rx)) {
		d->roce.dropped++;  /* opcode: not a request this responder takes */
		d->roce.resp_drop_opcode++;
		return;
	}
	if (uc && ahead != 0) {
		/* A gap: the message it falls in is lost; a first (or only) packet starts afresh from its PSN. */
		d->counters.uc_dropped += n->in_send || n->in_write;
		n->in_send = n->in_write = false;
		if (!roce_starts(op)) {
			d->roce.dropped++;  /* psn: the rest of a message a gap lost */
			d->roce.resp_drop_psn++;
			return;
		}
		n->epsn = pkt->psn;
		ahead = 0;
	}
	if (ahead > 0) {
		if (!n->nak_sent) {
			acknowledge(e, d, qp, NAK(AETH_NAK_PSN_SEQUENCE), n->epsn);
			d->roce.seq_naks++;
			n->nak_sent = true;
		}
		return;
	}
	if (ahead < 0) {
		duplicate(e, d, qp, pkt, &rx);
		return;
	}
	if (kind == ROCE_READ) {
		n->nak_sent = false;
		read_request(e, d, qp, pkt, &rx);
		return;
	}
	if (kind == ROCE_ATOMIC) {
		n->nak_sent = false;
		atomic_request(e, d, qp, pkt, &rx);
		return;
	}
	if (!message_packet(e, d, qp, pkt, payload, &rx))
		return;
	n->nak_sent = false;
	n->epsn = psn_add(n->epsn, 1);
	if (pkt->ackreq && !uc && qp->attr.state != VRDMA_QPS_ERR)
		acknowledge(e, d, qp, AETH_ACK_UNLIMITED, pkt->psn);
}

/* The answers owed to READs and atomics, in order, while the ring has room (each READ response's data read from
 * the MR as it goes); then the ACK or NAK that waited for them. */
VRE_FN uint32_t responder_poll(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, uint32_t budget)
{
	struct vre_remote *n = qp->net;
	uint32_t done = 0;
	struct vre_rx rx;

	if (!n || !rx_of(d, qp, 0, &rx))
		return 0;
	for (uint32_t i = n->rd_head; i != n->rd_tail && done < budget; i++) {
		struct vre_rd_job *job = &n->rd[i % VRE_MAX_RD];

		while (job->sent < job->npkts && done < budget) {
			uint64_t off = (uint64_t)job->sent * n->mtu, moff = 0;
			uint32_t plen = job->len - off < n->mtu ? (uint32_t)(job->len - off) : n->mtu;
			struct vre_roce_pkt pkt = { .opcode = roce_read_response(job->sent, job->npkts),
						    .pkey = ROCE_DEFAULT_PKEY, .dest_qpn = qp->attr.dest_qpn,
						    .psn = psn_add(job->psn, job->sent),
						    .aeth = aeth_make(AETH_ACK_UNLIMITED, n->msn) };
			struct vre_tx_pkt *slot;
			struct vre_mr *mr = NULL;

			if (job->atomic) {
				if (!atomic_answer(e, d, qp, job))
					return done;
				job->sent = job->npkts;
				job->answered = true;
				done++;
				continue;
			}
			if (plen && !(mr = remote_mr(d, qp, rx.pd, job->rkey, job->va + off, plen,
						    VRDMA_ACCESS_REMOTE_READ, &moff))) {
				/* The MR went away (or lost its rights) while the READ was answered. */
				job->sent = job->npkts;
				job->answered = true;
				n->ack_owed = false;
				send_ack(e, d, qp, aeth_make(NAK(AETH_NAK_REMOTE_ACCESS), n->msn), pkt.psn);
				qp_to_error(e, d, qp, VRDMA_EVENT_QP_ACCESS_ERR);
				return done;
			}
			slot = tx_slot(e, false);
			if (!slot)
				return done;
			if (plen) {
				struct seg src = { .mem = &mr->mem, .off = moff, .len = plen };

				copy_at(&src, 1, 0, slot->data + roce_header_len(pkt.opcode), plen, false);
			}
			tx_queue(e, d, &qp->net->addr, slot, &pkt, plen);
			count_tx(d, qp, plen, 1);
			job->answered |= ++job->sent == job->npkts;
			done++;
		}
	}
	if (n->ack_owed && done < budget && !answers_owed(n) && tx_slot(e, false)) {
		n->ack_owed = false;
		send_ack(e, d, qp, n->ack_aeth, n->ack_psn);
		done++;
	}
	return done;
}

/* A QP in error: the receive it held for a message that did not finish completes first, flushed (its queue's
 * other receives are flushed after it, in order). */
VRE_FN void responder_flush(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp)
{
	struct vre_rx rx;

	if (!qp->net || !qp->net->rwqe_held || !rx_of(d, qp, 0, &rx))
		return;
	struct vrdma_cqe cqe = { .wr_id = qp->net->rwqe->hdr.wr_id, .status = VRDMA_WC_WR_FLUSH_ERR,
				 .opcode = VRDMA_WC_OP_RECV, .qp_num = qp->cfg.qpn };

	complete_recv(e, d, qp, &rx, &cqe, false);
	d->counters.flushed++;
	qp->counters.flushed++;
}
