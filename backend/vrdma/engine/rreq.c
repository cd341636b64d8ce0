// SPDX-License-Identifier: GPL-2.0-only
/*
 * The requester of a QP whose peer is on another host: its send queue's WQEs as RoCE packets, and the four
 * functions that move its state (the completer, rcomp.c, takes what comes back for them through these).
 *
 * Each WQE takes a run of PSNs when it starts (its packets, segmented at the path MTU; a READ the PSNs of its
 * responses; an atomic one) and stays in the send ring until it is acknowledged: an ACK completes every SEND and
 * WRITE whose last PSN it covers, a READ completes with its last response, an atomic with its ATOMIC ACKNOWLEDGE;
 * completions stay in the order of the queue. What is lost is sent again from the oldest unacknowledged PSN
 * (go-back-N, as the InfiniBand specification's requester does): after the retransmission timer (the QP's
 * `timeout`, `retry_cnt` times), after a sequence-error NAK, after an RNR NAK's wait (`rnr_retry` times, 7:
 * forever). A NAK for an invalid request, a remote access or operational error completes the WQE with that status
 * and moves the QP to the error state. A UC requester sends and completes, and hears nothing back.
 *
 * rcomp.c trusts a response no further than its PSN allows: one outside what is outstanding is dropped and counted.
 */
#include <string.h>

#include "vre.h"

#define ACKREQ_EVERY 32           /* packets between acknowledgement requests inside a long message */
#define SEND_WINDOW 256           /* packets sent and not acknowledged, at most: what a loss costs to send again */

static uint32_t packets_for(uint64_t len, uint32_t mtu)
{
	return len ? (uint32_t)DIV_ROUND_UP(len, mtu) : 1;
}

/*
 * The requester's state moves through four functions only, which keep it whole (net_check states it):
 *
 *   cursor_at    the send cursor (sq_cur, cur_psn) goes to a WQE, backward or forward; rd_out is counted again
 *   cursor_past  the cursor passes the WQE it is on, all of it sent (a READ or an atomic is counted asked)
 *   retire_head  the oldest WQE is answered or failed: completed, and a cursor on it moves on to the next
 *   arm_timer    the retransmission timer runs while anything started is unanswered, and only then
 *
 * so that the cursor never sits on a completed WQE, rd_out is always the READs and atomics asked and not answered
 * ([sq_head, sq_cur)), and a QP with unanswered work always has a deadline (or waits out an RNR NAK).
 */
VRE_FN void cursor_at(struct vre_qp *qp, uint32_t index, uint32_t psn)
{
	struct vre_remote *n = qp->net;

	n->sq_cur = index;
	n->cur_psn = index == n->sq_next ? n->next_psn : psn;
	n->rd_out = 0;
	for (uint32_t i = qp->sq_head; i != index; i++)  /* at most sq_depth: index lies in [sq_head, sq_next] */
		n->rd_out += sent_of(qp, i)->kind != SENT_ACKED;
}

/* The cursor to the WQE holding `psn` (back to send it again, or forward past what the peer has), from `psn` on;
 * to sq_next if no started WQE holds it. */
VRE_FN void rewind_to(struct vre_qp *qp, uint32_t psn)
{
	struct vre_remote *n = qp->net;

	for (uint32_t i = qp->sq_head; i != n->sq_next; i++) {
		struct vre_sent *s = sent_of(qp, i);

		if (psn_diff(psn, last_psn(s)) <= 0) {
			cursor_at(qp, i, psn_diff(psn, s->first_psn) > 0 ? psn : s->first_psn);
			return;
		}
	}
	cursor_at(qp, n->sq_next, 0);
}

/* The cursor passes the WQE it is on, all of it sent: a READ or an atomic is now asked and not answered. */
static void cursor_past(struct vre_qp *qp)
{
	struct vre_remote *n = qp->net;

	n->rd_out += sent_of(qp, n->sq_cur)->kind != SENT_ACKED;
	n->sq_cur++;
	n->cur_psn = n->sq_cur == n->sq_next ? n->next_psn : sent_of(qp, n->sq_cur)->first_psn;
}

/* The retransmission timer: running while anything started is unanswered, but not during an RNR wait (qp_poll
 * does nothing for the QP until the wait ends, so a timer due before then would be due and never run: the loop
 * that sleeps until the next deadline would spin; remote_poll starts it again when the wait is over), and never
 * for UC, which nothing answers. */
VRE_FN void arm_timer(struct vre_engine *e, struct vre_qp *qp)
{
	bool waits = qp->sq_head != qp->net->sq_next && !qp->rnr_until && !(qp->cfg.flags & VRE_QP_UC);

	qp->net->deadline = waits ? ctx(e)->now + retry_wait_ns(qp) : 0;
}

/* The oldest WQE is done: completed with `status` (and `len`, its message length, on success). */
VRE_FN void retire_head(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, const struct send_wqe *w,
			uint8_t status, uint32_t len)
{
	struct vre_remote *n = qp->net;
	bool cursor_on_it = n->sq_cur == qp->sq_head;  /* being sent again when its answer came */

	if (!cursor_on_it && sent_of(qp, qp->sq_head)->kind != SENT_ACKED)
		n->rd_out--;
	if (status == VRDMA_WC_SUCCESS) {
		qp->rnr_left = qp->attr.rnr_retry;
		qp->retry_left = qp->attr.retry_cnt;
	}
	complete_send(e, d, qp, &w->hdr, status, status == VRDMA_WC_SUCCESS ? len : 0);  /* sq_head++ */
	if (cursor_on_it)  /* nothing of it is left to send: on to the next */
		cursor_at(qp, qp->sq_head, qp->sq_head == n->sq_next ? 0 : sent_of(qp, qp->sq_head)->first_psn);
	arm_timer(e, qp);
}

/* The requester fails: the WQE at the head completes with `status`, the rest are flushed in the error state. */
VRE_FN void requester_error(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, uint8_t status)
{
	struct send_wqe *w = &ctx(e)->scratch.wqe;

	if (qp->sq_head != qp->net->sq_next) {
		sq_wqe(qp, qp->sq_head, w);
		retire_head(e, d, qp, w, status, 0);
	}
	qp_to_error(e, d, qp, 0);
}

/* Local data of WQE `w` checked as at the start (keys, bounds, access): 0, or the status that fails it. */
VRE_FN uint8_t local_of(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, const struct send_wqe *w,
			struct vre_request *r)
{
	*r = (struct vre_request){ .e = e, .d = d, .qp = qp, .w = w, .op = vre_opcode(w->hdr.opcode),
				   .local = ctx(e)->scratch.local };
	return wqe_local_data(r);
}

/* -- sending ----------------------------------------------------------------------------------------------- */

/*
 * Start the next WQE of the queue: give it its PSNs. Local operations, and WQEs that fail their own checks, wait
 * until everything before them is acknowledged (completions stay in order), then run or fail here (the cursor
 * stays at sq_next: remote_poll counts it as work done). False: nothing to start now.
 */
static bool start_next(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, uint32_t prod)
{
	struct vre_remote *n = qp->net;
	struct send_wqe *w = &ctx(e)->scratch.wqe;
	const struct vre_opcode *op;
	struct vre_request r;
	uint8_t status;
	struct vre_sent *s;

	if (n->sq_next == prod)
		return false;
	sq_wqe(qp, n->sq_next, w);
	op = vre_opcode(w->hdr.opcode);
	if (op && (op->flags & OP_LOCAL)) {
		if (qp->sq_head != n->sq_next)
			return false;
		d->counters.send_wqes++;
		qp->counters.send_wqes++;
		status = op->local(d, qp, &w->hdr);
		n->sq_next++;
		cursor_at(qp, n->sq_next, 0);
		complete_send(e, d, qp, &w->hdr, status, 0);  /* the head: nothing else was started */
		if (status != VRDMA_WC_SUCCESS)
			qp_to_error(e, d, qp, 0);
		return true;
	}
	status = local_of(e, d, qp, w, &r);
	if (status != VRDMA_WC_SUCCESS) {
		if (qp->sq_head != n->sq_next)
			return false;
		d->counters.send_wqes++;
		qp->counters.send_wqes++;
		n->sq_next++;
		cursor_at(qp, n->sq_next, 0);
		complete_send(e, d, qp, &w->hdr, status, 0);
		qp_to_error(e, d, qp, 0);
		return true;
	}
	if ((r.op->flags & OP_READS) &&
	    (n->rd_out >= (qp->attr.max_rd_atomic ? qp->attr.max_rd_atomic : 1) || qp->cfg.flags & VRE_QP_UC))
		return false;
	if ((w->hdr.send_flags & VRDMA_SEND_FENCE) && n->rd_out)
		return false;
	s = sent_of(qp, n->sq_next);
	s->first_psn = n->next_psn;
	s->npkts = (r.op->flags & OP_ATOMIC) ? 1 : packets_for(r.len, n->mtu);
	s->len = (uint32_t)r.len;
	s->kind = (r.op->flags & OP_ATOMIC) ? SENT_ATOMIC : (r.op->flags & OP_READS) ? SENT_READ : SENT_ACKED;
	n->next_psn = psn_add(n->next_psn, s->npkts);
	n->sq_next++;  /* the cursor, at the old sq_next from cur_psn == its first PSN, is on it now */
	d->counters.send_wqes++;
	qp->counters.send_wqes++;
	return true;
}

/* Send packets of WQE sq_cur from cur_psn on, while the ring has room: false when it had none. */
static bool send_packets(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, uint32_t *budget)
{
	struct vre_remote *n = qp->net;
	struct send_wqe *w = &ctx(e)->scratch.wqe;
	struct vre_sent *s = sent_of(qp, n->sq_cur);
	bool uc = qp->cfg.flags & VRE_QP_UC;
	const struct vrdma_send_wqe *h;
	struct vre_request r;
	struct vre_tx_pkt *slot;

	sq_wqe(qp, n->sq_cur, w);
	h = &w->hdr;
	if (local_of(e, d, qp, w, &r) != VRDMA_WC_SUCCESS || r.len != s->len) {
		/* The guest changed a WQE it had handed over, or its memory went away: the queue cannot go on. */
		requester_error(e, d, qp, VRDMA_WC_LOC_PROT_ERR);
		return true;
	}
	while (*budget) {
		uint32_t k = (uint32_t)psn_diff(n->cur_psn, s->first_psn), hdr, plen = 0;
		uint64_t off = (uint64_t)k * n->mtu;
		struct vre_roce_pkt pkt = { .dest_qpn = qp->attr.dest_qpn, .psn = n->cur_psn,
					    .pkey = ROCE_DEFAULT_PKEY };
		enum wire_pos pos = s->npkts == 1 || (r.op->flags & OP_READS) ? WIRE_ONLY : k == 0 ? WIRE_FIRST :
				    k == s->npkts - 1 ? WIRE_LAST : WIRE_MIDDLE;

		if (psn_diff(n->cur_psn, n->una_psn) >= SEND_WINDOW)
			return false;  /* until acknowledgements come */
		slot = tx_slot(e, true);
		if (!slot)
			return false;
		pkt.opcode = roce_on(r.op->wire[pos], uc ? ROCE_UC : ROCE_RC);
		if (r.op->flags & OP_READS) {  /* one request: a READ (from its first missing response) or atomic */
			pkt.va = h->remote_addr + off;
			pkt.rkey = h->rkey;
			pkt.dma_len = (uint32_t)(s->len - off);
			pkt.swap_add = h->opcode == VRDMA_WR_ATOMIC_CMP_AND_SWP ? h->swap : h->compare_add;
			pkt.compare = h->compare_add;
			pkt.ackreq = 1;
		} else {
			plen = s->len - off < n->mtu ? (uint32_t)(s->len - off) : n->mtu;
			if (pos == WIRE_FIRST || pos == WIRE_ONLY) {
				pkt.va = h->remote_addr;
				pkt.rkey = h->rkey;
				pkt.dma_len = s->len;
			}
			if (pos == WIRE_LAST || pos == WIRE_ONLY) {
				pkt.imm = h->imm_data;
				pkt.inv_rkey = h->imm_data;
				pkt.solicited = !!(h->send_flags & VRDMA_SEND_SOLICITED);
			}
			pkt.ackreq = !uc && (pos == WIRE_LAST || pos == WIRE_ONLY || ++n->since_ackreq >= ACKREQ_EVERY);
			hdr = roce_header_len(pkt.opcode);
			copy_at(r.local, r.nlocal, off, slot->data + hdr, plen, false);
		}
		if (pkt.ackreq)
			n->since_ackreq = 0;
		tx_queue(e, d, &qp->net->addr, slot, &pkt, plen);
		if (!uc && !n->deadline)
			arm_timer(e, qp);  /* an answer is due from now */
		if (psn_diff(n->cur_psn, n->sent_psn) < 0)
			d->roce.retransmits++;
		else
			n->sent_psn = psn_add(n->cur_psn, 1);
		(*budget)--;
		if (r.op->flags & OP_READS) {
			n->cur_psn = psn_add(s->first_psn, s->npkts);
		} else {
			n->cur_psn = psn_add(n->cur_psn, 1);
		}
		if (psn_diff(n->cur_psn, last_psn(s)) > 0)
			break;
	}
	if (psn_diff(n->cur_psn, last_psn(s)) <= 0)
		return true;  /* out of budget inside the message */
	cursor_past(qp);
	if (uc) {  /* nothing comes back: done when sent (it is the head) */
		count_tx(d, qp, s->len, s->npkts);
		n->una_psn = psn_add(last_psn(s), 1);
		retire_head(e, d, qp, w, VRDMA_WC_SUCCESS, s->len);
	}
	return true;
}

/*
 * A remote QP's send queue in RTS: the retransmission timer, then packets (again from where the peer lost them, then
 * of new WQEs) while the ring and the budget allow. `prod` is the producer index qp_poll checked.
 */
VRE_FN uint32_t remote_poll(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, uint32_t prod,
			    uint32_t budget)
{
	struct vre_remote *n = qp->net;
	uint32_t left = budget;

	if (n->deadline && ctx(e)->now >= n->deadline) {
		d->roce.timeouts++;
		if (qp->attr.timeout && qp->retry_left == 0) {
			requester_error(e, d, qp, VRDMA_WC_RETRY_EXC_ERR);
			return 1;
		}
		if (qp->attr.timeout)
			qp->retry_left--;
		rewind_to(qp, n->una_psn);
		n->deadline = ctx(e)->now + retry_wait_ns(qp);
	}
	while (left && qp->attr.state == VRDMA_QPS_RTS) {
		if (n->sq_cur == n->sq_next && !start_next(e, d, qp, prod))
			break;
		if (n->sq_cur == n->sq_next) {  /* a local operation ran, or a WQE failed its checks */
			left--;
			continue;
		}
		if (!send_packets(e, d, qp, &left))
			break;
	}
	/* What is started and unanswered has a deadline, also when nothing could be sent (the ring was full as an
	 * RNR wait ended): the timer's expiry is what makes a silent peer an error. */
	if (!(qp->cfg.flags & VRE_QP_UC) && qp->attr.state == VRDMA_QPS_RTS && qp->sq_head != n->sq_next &&
	    !n->deadline && !qp->rnr_until)
		arm_timer(e, qp);
	return budget - left;
}
