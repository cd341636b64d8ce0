// SPDX-License-Identifier: GPL-2.0-only
/*
 * The loop: a poll runs every active QP's send queue once and the CQ moderation timers; a spin polls in C for a
 * while; parking asks every poster to wake the device (the parked slot of each doorbell page) and looks once more,
 * so that a doorbell rung before the poster read the flag is not lost; events wait here for the model.
 */
#include "vre.h"

uint32_t vre_poll(struct vre_engine *e, uint32_t budget)
{
	uint32_t work = 0;

	e->now = engine_clock(e);
	if (net_on(e) && !e->capture)
		work += sock_recv(e, budget);
	for (uint32_t i = 0; i < e->ndevices; i++) {
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

	for (uint32_t i = 0; i < e->ndevices; i++) {
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
	for (uint32_t i = 0; i < e->ndevices; i++) {
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
