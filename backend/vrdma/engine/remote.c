// SPDX-License-Identifier: GPL-2.0-only
/*
 * A connected QP whose peer is on another host: its transport state (struct vre_remote), made when it reaches RTR,
 * reset, freed, and checked. The requester (rreq.c), the completer (rcomp.c) and the responder (rresp.c) move it;
 * net_check states what they keep true of it, and the fuzz and sanitizer builds check it after every step.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vre.h"

VRE_FN void net_qp_free(struct vre_qp *qp)
{
	if (!qp->net)
		return;
	free(qp->net->sent);
	free(qp->net->rwqe);
	free(qp->net);
	qp->net = NULL;
}

/*
 * After a modify: a connected RC or UC QP at RTR or later whose destination no device here holds speaks RoCE (its
 * responder from RTR on, its requester from RTS on); one in RESET forgets it all. The model checked the GIDs: the
 * source is one of the device's own.
 */
/* A remote QP's transport state, zeroed (its send queue's slots, its receive), or ENOMEM. */
VRE_FN int net_qp_alloc(struct vre_engine *e, struct vre_qp *qp)
{
	struct vre_remote *n = calloc(1, sizeof(*n));

	if (n) {
		n->sent = calloc(qp->cfg.sq_depth ? qp->cfg.sq_depth : 1, sizeof(*n->sent));
		n->rwqe = malloc(sizeof(*n->rwqe));
	}
	if (!n || !n->sent || !n->rwqe) {
		if (n) {
			free(n->sent);
			free(n->rwqe);
		}
		free(n);
		return vre_fail(e, ENOMEM, "no memory for QP %#x's transport", qp->cfg.qpn);
	}
	qp->net = n;
	return 0;
}

/* Its addresses and path MTU, from its attributes (a modify's, or a loaded state's). */
VRE_FN void net_qp_address(struct vre_qp *qp)
{
	struct vre_remote *n = qp->net;

	memcpy(n->addr.src, qp->attr.sgid, 16);
	memcpy(n->addr.dst, qp->attr.dgid, 16);
	n->addr.sport = roce_sport(qp->cfg.qpn, qp->attr.dest_qpn);
	n->addr.dport = VRE_ROCE_PORT;
	n->addr.ip_frag = IP_DONT_FRAGMENT;  /* and so identification 0 from Linux (docs/interhost.md) */
	n->mtu = mtu_bytes(qp->attr.path_mtu);
}

VRE_FN int net_qp_update(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, uint32_t old_state)
{
	uint32_t state = qp->attr.state;
	struct vre_remote *n;

	(void)d;
	if (state == VRDMA_QPS_RESET || state == VRDMA_QPS_INIT) {
		net_qp_free(qp);
		return 0;
	}
	if (!net_on(e) || qp->attr.dest_dev != VRE_NO_DEVICE || (qp->cfg.flags & ~(VRE_QP_KERNEL | VRE_QP_UC)) ||
	    state == VRDMA_QPS_ERR || !net_reaches(e, qp->attr.sgid, qp->attr.dgid))
		return 0;
	if (!qp->net && net_qp_alloc(e, qp))
		return -ENOMEM;
	n = qp->net;
	net_qp_address(qp);
	if (old_state < VRDMA_QPS_RTR) {
		n->epsn = qp->attr.rq_psn & PSN_MASK;
		n->msn = 0;
		n->nak_sent = n->in_send = n->in_write = n->ack_owed = n->rwqe_held = false;
		n->rd_head = n->rd_tail = 0;
	}
	if (state == VRDMA_QPS_RTS && old_state < VRDMA_QPS_RTS) {
		n->next_psn = n->una_psn = n->cur_psn = n->sent_psn = qp->attr.sq_psn & PSN_MASK;
		n->sq_cur = n->sq_next = qp->sq_head;
		n->rd_out = 0;
		n->deadline = 0;
		n->gap_asked = false;
	}
	if (state != VRDMA_QPS_RTS)
		n->deadline = 0;  /* only a requester in RTS sends, and so times out */
	return 0;
}

/* Whether a remote QP has work of its own besides new WQEs: packets to send again or READ responses owed. */
VRE_FN bool net_busy(const struct vre_qp *qp)
{
	const struct vre_remote *n = qp->net;

	if (!n || (qp->attr.state != VRDMA_QPS_RTR && qp->attr.state != VRDMA_QPS_RTS))
		return false;
	if (n->sq_cur != n->sq_next && qp->attr.state == VRDMA_QPS_RTS)
		return true;
	return n->ack_owed || answers_owed(n);
}

/* -- invariants ---------------------------------------------------------------------------------------------- */

/*
 * What the requester's and responder's functions keep true of a remote QP between two calls into the engine
 * (rreq.c's cursor_at, cursor_past, retire_head and arm_timer; rresp.c's answers in order): NULL, or the first
 * that does not hold. vre_check runs it over every QP; the fuzzers after every operation.
 */
VRE_FN const char *net_check(const struct vre_qp *qp)
{
	const struct vre_remote *n = qp->net;
	uint32_t depth = qp->cfg.sq_depth, started, cursor, rd = 0, psn;
	bool first_owed = false;

	if (!n)
		return NULL;
	if (n->rd_tail - n->rd_head > VRE_MAX_RD)
		return "the responder keeps more READs and atomics than its ring holds";
	for (uint32_t i = n->rd_head; i != n->rd_tail; i++) {
		const struct vre_rd_job *job = &n->rd[i % VRE_MAX_RD];

		if (job->sent > job->npkts || (job->atomic && job->npkts != 1))
			return "a READ or atomic of the responder has sent more than it owes";
		/* first answers in PSN order (a duplicate asking an answered one again is answered again after others) */
		if (first_owed && job->sent)
			return "an answer went out ahead of one owed before it";
		first_owed |= !job->answered && job->sent < job->npkts;
	}
	if (qp->attr.state != VRDMA_QPS_RTS)  /* the requester's state counts from RTS (net_qp_update) */
		return n->deadline ? "a retransmission timer on a QP that sends nothing" : NULL;
	started = n->sq_next - qp->sq_head;
	cursor = n->sq_cur - qp->sq_head;
	if (started > depth || cursor > started)
		return "the send cursor is outside the started WQEs (on a completed one, or past sq_next)";
	psn = started ? n->sent[qp->sq_head & (depth - 1)].first_psn : n->next_psn;
	for (uint32_t i = 0; i < started; i++) {
		const struct vre_sent *s = &n->sent[(qp->sq_head + i) & (depth - 1)];

		if (s->first_psn != psn || s->npkts == 0 || s->npkts > PSN_MASK / 2)
			return "the started WQEs' PSNs do not follow each other";
		if (i == cursor && (psn_diff(n->cur_psn, s->first_psn) < 0 ||
				    psn_diff(n->cur_psn, psn_add(s->first_psn, s->npkts)) >= 0))
			return "the cursor's PSN is outside the WQE it is on";
		if (i < cursor)
			rd += s->kind != SENT_ACKED;
		psn = psn_add(psn, s->npkts);
	}
	if (psn != n->next_psn)
		return "next_psn is not where the started WQEs end";
	if (cursor == started && n->cur_psn != n->next_psn)
		return "the cursor has nothing to send but its PSN is not next_psn";
	if (rd != n->rd_out)
		return "rd_out is not the READs and atomics asked and not answered";
	if (started && !(qp->cfg.flags & VRE_QP_UC)) {
		const struct vre_sent *head = &n->sent[qp->sq_head & (depth - 1)];

		if (psn_diff(n->una_psn, head->first_psn) < 0 ||
		    psn_diff(n->una_psn, psn_add(head->first_psn, head->npkts)) >= 0)
			return "the oldest unanswered PSN is not in the oldest unanswered WQE";
		if (!n->deadline && !qp->rnr_until)
			return "unanswered work without a deadline";
	}
	if (n->deadline && (qp->cfg.flags & VRE_QP_UC))
		return "a retransmission timer on a UC QP (nothing answers it)";
	if (n->deadline && qp->rnr_until)
		return "a retransmission timer during an RNR wait (due, it would not run before the wait ends)";
	if (!started && n->una_psn != n->next_psn && !(qp->cfg.flags & VRE_QP_UC))
		return "everything answered, but una_psn is not next_psn";
	if (started && psn_diff(n->cur_psn, n->una_psn) < 0)
		return "the cursor is behind the oldest unanswered PSN";
	return NULL;
}

/* The fuzz and sanitizer builds (-DVRE_CHECK_INVARIANTS) check the invariants of a device after its every turn and
 * every packet it took (under its lock: another thread may be changing any other device meanwhile) and abort on the
 * first broken one, naming it: a state that went wrong is caught where it went wrong. */
VRE_FN void net_assert(struct vre_device *d)
{
#ifdef VRE_CHECK_INVARIANTS
	for (uint32_t j = 0; d->open && j < d->nactive; j++) {
		const char *broken = net_check(d->active[j]);

		if (broken) {
			fprintf(stderr, "vrdma engine: invariant broken: QP %#x: %s\n", d->active[j]->cfg.qpn, broken);
			abort();
		}
	}
#else
	(void)d;
#endif
}

int vre_check(struct vre_engine *e)
{
	for (uint32_t i = 0; i < e->devices_hi; i++) {
		struct vre_device *d = &e->devices[i];

		for (uint32_t j = 0; d->open && j < d->nactive; j++) {
			const char *broken = net_check(d->active[j]);

			if (broken)
				return vre_fail(e, EPROTO, "device %u QP %#x: %s", i, d->active[j]->cfg.qpn, broken);
		}
	}
	return 0;
}

