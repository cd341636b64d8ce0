// SPDX-License-Identifier: GPL-2.0-only
/*
 * The loop and its scheduler: a poll runs every active QP once (qp_poll: the answers it owes a peer on another
 * host, then its send queue, up to a budget, through the requester its peer needs) and the CQ moderation timers; a
 * spin polls in C for a while; parking asks every poster to wake the device (the parked slot of each doorbell
 * page) and looks once more, so that a doorbell rung before the poster read the flag is not lost; events wait
 * here for the model.
 */
#include "vre.h"

/* Run a QP's send queue: up to `budget` WQEs, in order; flush them in the error state. */
static uint32_t qp_poll(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, uint32_t budget)
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

uint32_t vre_poll(struct vre_engine *e, uint32_t budget)
{
	uint32_t work = 0;

	e->now = engine_clock(e);
	if (net_on(e) && !e->capture)
		work += sock_recv(e, budget, vre_roce_input);
	for (uint32_t i = 0; i < e->devices_hi; i++) {
		struct vre_device *d = &e->devices[i];

		if (!d->open)
			continue;
		for (uint32_t j = 0; j < d->nactive; j++)
			work += qp_poll(e, d, d->active[j], budget);
		cq_timers(e, d);
	}
	if (e->tx_tail != e->tx_head)
		sock_send(e);
	net_assert(e);
	return work;
}

/*
 * Poll for spin_ns, doing whatever work appears, and return early only when there are events to deliver (the
 * model delivers them through virtqueues): the hot loop stays in C, where noticing a doorbell takes one pass over
 * the send queues instead of a turn of the Python event loop. Returns the work done.
 */
uint32_t vre_spin(struct vre_engine *e, uint32_t budget, uint64_t spin_ns)
{
	int64_t until = engine_clock(e) + (int64_t)spin_ns;
	uint32_t work = 0;

	do {
		work += vre_poll(e, budget);
		if (e->ev_head != e->ev_tail || e->clock)
			break;  /* events to deliver, or a fixed clock that would never reach `until` */
		__builtin_ia32_pause();
	} while (e->now < until);
	return work;
}

int64_t vre_next_deadline(struct vre_engine *e)
{
	int64_t next = -1;

	for (uint32_t i = 0; i < e->devices_hi; i++) {
		struct vre_device *d = &e->devices[i];

		for (uint32_t j = 0; d->open && j < d->nactive; j++) {
			struct vre_qp *qp = d->active[j];
			int64_t t = qp->rnr_until;

			if (t && (next < 0 || t < next))
				next = t;
			t = qp->net ? qp->net->deadline : 0;
			if (t && (next < 0 || t < next))
				next = t;
		}
		if (d->open && d->mod_next && (next < 0 || d->mod_next < next))
			next = d->mod_next;
	}
	return next;
}

/* Tell every poster to wake us, then look once more: a doorbell rung before it read the flag is seen here. */
int vre_park(struct vre_engine *e)
{
	if (e->tx_tail != e->tx_head)
		return 0;  /* packets the network could not take yet */
	vre_set_parked_flags(e, 1);
	e->parked = true;
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	for (uint32_t i = 0; i < e->devices_hi; i++) {
		struct vre_device *d = &e->devices[i];

		for (uint32_t j = 0; d->open && j < d->nactive; j++) {
			struct vre_qp *qp = d->active[j];

			/* a remote QP's started WQEs wait for ACKs, not for this loop */
			uint32_t started = qp->net && qp->attr.state == VRDMA_QPS_RTS ? qp->net->sq_next : qp->sq_head;

			if (((qp->attr.state == VRDMA_QPS_RTS || qp->attr.state == VRDMA_QPS_ERR) &&
			     load_acquire(qp->sq_db) != started && !qp->rnr_until) || net_busy(qp)) {
				vre_unpark(e);
				return 0;
			}
		}
	}
	return 1;
}

void vre_unpark(struct vre_engine *e)
{
	if (!e->parked)
		return;
	e->parked = false;
	vre_set_parked_flags(e, 0);
}

uint32_t vre_take_events(struct vre_engine *e, struct vre_event *out, uint32_t max)
{
	uint32_t n = 0;

	while (e->ev_head != e->ev_tail && n < max)
		out[n++] = e->events[e->ev_head++ % EVENT_RING];
	return n;
}
