// SPDX-License-Identifier: GPL-2.0-only
/*
 * The completer of a QP whose peer is on another host (rxe's rxe_comp.c): what comes back for the requester's
 * packets. An ACK completes every SEND and WRITE whose last PSN it covers, a READ completes with its last response
 * (its data placed at its place in the READ's local SGEs), an atomic with its ATOMIC ACKNOWLEDGE; completions stay
 * in the order of the queue. A sequence-error NAK, an answer ahead of the oldest unanswered PSN, or an ACK that
 * covers a READ without its response makes the requester send again from what was lost; an RNR NAK makes it wait;
 * any other NAK completes the WQE with its status and moves the QP to the error state.
 *
 * An answer is trusted no further than its PSN allows: one outside what is outstanding is dropped and counted.
 */
#include <string.h>

#include "vre.h"

/*
 * Send again from the oldest unanswered PSN now, not after the timer: once for each una_psn (as a responder NAKs
 * once per gap), so that a run of answers that all show the same loss asks once. The timer covers a request asked
 * again and lost.
 */
static void ask_again(struct vre_qp *qp)
{
	struct vre_remote *n = qp->net;

	if (n->gap_asked && n->gap_psn == n->una_psn)
		return;
	n->gap_asked = true;
	n->gap_psn = n->una_psn;
	rewind_to(qp, n->una_psn);
}

/*
 * Everything up to and including `psn` is acknowledged: complete the SENDs and WRITEs it covers, in order. A READ
 * or an atomic it covers without its answer was answered (a responder answers in PSN order) and the answer lost:
 * it is asked again from its first missing response, and what follows it waits.
 */
static void ack_upto(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, uint32_t psn)
{
	struct vre_remote *n = qp->net;
	struct send_wqe *w = &ctx(e)->scratch.wqe;

	while (qp->sq_head != n->sq_next && qp->attr.state == VRDMA_QPS_RTS) {
		struct vre_sent *s = sent_of(qp, qp->sq_head);

		if (psn_diff(psn, last_psn(s)) < 0)
			break;
		if (s->kind != SENT_ACKED) {
			psn = psn_add(s->first_psn, PSN_MASK);  /* acknowledged: what came before it */
			if (psn_diff(psn_add(psn, 1), n->una_psn) > 0)
				n->una_psn = psn_add(psn, 1);
			ask_again(qp);
			break;
		}
		sq_wqe(qp, qp->sq_head, w);
		n->una_psn = psn_add(last_psn(s), 1);
		count_tx(d, qp, s->len, s->npkts);  /* a SEND or WRITE the peer acknowledged: its data left this VM */
		retire_head(e, d, qp, w, VRDMA_WC_SUCCESS, s->len);
	}
	if (psn_diff(psn_add(psn, 1), n->una_psn) > 0) {
		n->una_psn = psn_add(psn, 1);
		qp->retry_left = qp->attr.retry_cnt;  /* forward progress: the retries count from here again */
	}
	if (psn_diff(n->una_psn, n->cur_psn) > 0)
		rewind_to(qp, n->una_psn);  /* the peer has what was about to be sent again */
	arm_timer(e, qp);
}

/*
 * The WQE an answer (READ response, atomic acknowledgement) at `psn` is for: the head (copied into the scratch
 * WQE), of `kind`, holding `psn`, when `psn` is the oldest unanswered PSN; else NULL. An answer that starts a run
 * of responses (`first`: a READ's first or only response, an atomic acknowledgement) acknowledges everything
 * before it.
 */
static struct vre_sent *answered(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, uint32_t psn,
				 uint32_t kind, bool first)
{
	struct vre_remote *n = qp->net;
	struct vre_sent *s;

	if (qp->sq_head == n->sq_next)
		return NULL;
	if (first && psn_diff(psn, n->una_psn) > 0)
		ack_upto(e, d, qp, psn_add(psn, PSN_MASK));
	if (psn_diff(psn, n->una_psn) != 0 || qp->sq_head == n->sq_next || qp->attr.state != VRDMA_QPS_RTS)
		return NULL;
	s = sent_of(qp, qp->sq_head);
	if (s->kind != kind || psn_diff(psn, s->first_psn) < 0 || psn_diff(psn, last_psn(s)) > 0)
		return NULL;
	sq_wqe(qp, qp->sq_head, &ctx(e)->scratch.wqe);  /* where its answer goes (checked again by the caller) */
	return s;
}

/*
 * An answer the requester cannot take: ahead of the oldest unanswered PSN, what came between was lost, and the
 * requester asks again at once (as rxe's does), not after its timer: a READ's responses keep coming for a whole
 * message, and each would otherwise be dropped until the timer ran out, a whole message at a time. The timer starts
 * again from this answer: the peer answers (a queue of responses sent before the request came again may take
 * longer to drain than the timer's period). Behind it: stale, a duplicate.
 */
static void unexpected_answer(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, uint32_t psn)
{
	d->roce.dropped++;
	if (psn_diff(psn, qp->net->una_psn) <= 0 || qp->sq_head == qp->net->sq_next ||
	    qp->attr.state != VRDMA_QPS_RTS)
		return;
	arm_timer(e, qp);
	ask_again(qp);
}

/* Where a READ response may stand in its READ's run of `npkts` responses (k: its place): a first (or only)
 * response may start at any place, since a READ asked again from its first missing response is answered from
 * there as a new READ; a last (or only) one ends the READ; a middle one neither. */
static bool response_fits(const struct roce_op *op, uint32_t k, uint32_t npkts)
{
	return roce_ends(op) == (k == npkts - 1);
}

/* A READ response: its data goes to the READ's local SGEs at its place in the message. */
static void read_response(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp,
			  const struct vre_roce_pkt *pkt, const uint8_t *payload)
{
	struct vre_remote *n = qp->net;
	const struct roce_op *op = roce_op(pkt->opcode);
	struct vre_sent *s = answered(e, d, qp, pkt->psn, SENT_READ, roce_starts(op));
	uint32_t k, expect;
	struct vre_request r;
	uint64_t off;

	if (!s) {
		unexpected_answer(e, d, qp, pkt->psn);
		return;
	}
	k = (uint32_t)psn_diff(pkt->psn, s->first_psn);
	off = (uint64_t)k * n->mtu;
	expect = s->len - off < n->mtu ? (uint32_t)(s->len - off) : n->mtu;
	/* first and middle responses carry a whole MTU, the last the rest; an only response all of it */
	if (pkt->payload_len != expect || !response_fits(op, k, s->npkts)) {
		d->roce.dropped++;
		return;
	}
	if (local_of(e, d, qp, &ctx(e)->scratch.wqe, &r) != VRDMA_WC_SUCCESS || r.len != s->len) {
		requester_error(e, d, qp, VRDMA_WC_LOC_PROT_ERR);  /* its memory went away, or the guest changed it */
		return;
	}
	copy_at(r.local, r.nlocal, off, (uint8_t *)(uintptr_t)payload, pkt->payload_len, true);
	n->una_psn = psn_add(pkt->psn, 1);
	qp->retry_left = qp->attr.retry_cnt;
	if (k == s->npkts - 1) {
		count_rx(d, qp, s->len, s->npkts);
		retire_head(e, d, qp, &ctx(e)->scratch.wqe, VRDMA_WC_SUCCESS, s->len);
		return;
	}
	if (psn_diff(n->una_psn, n->cur_psn) > 0)
		rewind_to(qp, n->una_psn);  /* about to ask again for what just came: ask from here */
	arm_timer(e, qp);
}

static void atomic_ack(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, const struct vre_roce_pkt *pkt)
{
	struct vre_sent *s = answered(e, d, qp, pkt->psn, SENT_ATOMIC, true);
	uint64_t orig = pkt->orig;
	struct vre_request r;

	if (!s) {
		unexpected_answer(e, d, qp, pkt->psn);
		return;
	}
	if (local_of(e, d, qp, &ctx(e)->scratch.wqe, &r) != VRDMA_WC_SUCCESS || r.len != s->len) {
		requester_error(e, d, qp, VRDMA_WC_LOC_PROT_ERR);
		return;
	}
	copy_at(r.local, r.nlocal, 0, (uint8_t *)&orig, 8, true);
	qp->net->una_psn = psn_add(pkt->psn, 1);
	retire_head(e, d, qp, &ctx(e)->scratch.wqe, VRDMA_WC_SUCCESS, 8);
}

VRE_FN void remote_response(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp,
			    const struct vre_roce_pkt *pkt, const uint8_t *payload)
{
	struct vre_remote *n = qp->net;
	uint8_t syndrome = aeth_syndrome(pkt->aeth), value = syndrome & AETH_VALUE_MASK;
	uint8_t kind = roce_op(pkt->opcode)->kind;
	static const uint8_t nak_status[] = {
		[AETH_NAK_INVALID_REQUEST] = VRDMA_WC_REM_INV_REQ_ERR,
		[AETH_NAK_REMOTE_ACCESS] = VRDMA_WC_REM_ACCESS_ERR,
		[AETH_NAK_REMOTE_OPERATION] = VRDMA_WC_REM_OP_ERR,
		[AETH_NAK_INVALID_RD_REQUEST] = VRDMA_WC_REM_INV_REQ_ERR,
	};

	/* Outstanding PSNs are [una_psn, next_psn): an answer to anything else is stale or forged. */
	if (psn_diff(pkt->psn, n->una_psn) < -1 || psn_diff(pkt->psn, n->next_psn) >= 0) {
		d->roce.dropped++;
		return;
	}
	if (kind == ROCE_READ_RESPONSE) {
		read_response(e, d, qp, pkt, payload);
		return;
	}
	if (kind == ROCE_ATOMIC_ACK) {
		atomic_ack(e, d, qp, pkt);
		return;
	}
	switch (syndrome & AETH_TYPE_MASK) {
	case AETH_ACK:
		ack_upto(e, d, qp, pkt->psn);
		return;
	case AETH_RNR_NAK:
		ack_upto(e, d, qp, psn_add(pkt->psn, PSN_MASK));
		if (qp->attr.state != VRDMA_QPS_RTS || qp->sq_head == n->sq_next)
			return;
		if (qp->attr.rnr_retry != RNR_INFINITE && qp->rnr_left == 0) {
			requester_error(e, d, qp, VRDMA_WC_RNR_RETRY_EXC_ERR);
			return;
		}
		if (qp->attr.rnr_retry != RNR_INFINITE)
			qp->rnr_left--;
		d->counters.rnr_waits++;
		qp->counters.rnr_waits++;
		rewind_to(qp, n->una_psn);  /* the NAK's PSN, or a READ before it whose answer was lost */
		qp->rnr_until = ctx(e)->now + rnr_wait_ns(value);
		n->deadline = 0;
		return;
	case AETH_NAK:
		ack_upto(e, d, qp, psn_add(pkt->psn, PSN_MASK));
		if (qp->attr.state != VRDMA_QPS_RTS || qp->sq_head == n->sq_next)
			return;
		if (value == AETH_NAK_PSN_SEQUENCE) {  /* the peer lost something: send from there */
			rewind_to(qp, n->una_psn);
			return;
		}
		requester_error(e, d, qp, value < sizeof(nak_status) ? nak_status[value] : VRDMA_WC_REM_OP_ERR);
		return;
	default:
		d->roce.dropped++;
	}
}
