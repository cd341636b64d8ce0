// SPDX-License-Identifier: GPL-2.0-only
/*
 * The loop and its scheduler: a poll gives every device with work a turn (device_turn: deficit round robin, worth
 * its weight's share of the engine's quantum, within its limits), in which its active QPs run in turn (qp_poll: the
 * answers it owes a peer on another host, then its send queue, up to a budget, through the requester its peer
 * needs) until the turn's worth is used; a message longer than a piece moves one piece at a time, so that between
 * two pieces of a neighbour's 1 GiB WRITE every other device has its turn. Then the CQ moderation timers; a
 * spin polls in C for a while; parking asks every poster to wake the device (the parked slot of each doorbell
 * page) and looks once more, so that a doorbell rung before the poster read the flag is not lost; events wait
 * here for the model.
 */
#include "vre.h"

/* Whether the device's limits let `qp` run its next piece now (a new work request needs a token of its own). */
static bool limits_allow(const struct vre_device *d, const struct vre_qp *qp)
{
	const struct vre_share *s = &d->share;

	return !(s->bytes.rate > 0 && s->bytes.tokens <= 0) && !(s->wrs.rate > 0 && !qp->piece.done && s->wrs.tokens < 1);
}

/* The device's limits hold back work it has: from now on that is time throttled (until charge runs it again). */
static void throttled(struct vre_engine *e, struct vre_device *d)
{
	if (!d->share.throttled_since)
		d->share.throttled_since = ctx(e)->now > 0 ? ctx(e)->now : 1;
}

/* What the device's turn and limits pay for work just done: `bytes` of data and `wrs` work requests started, each
 * piece costing the engine's per-request cost on top. */
static void charge(struct vre_engine *e, struct vre_device *d, uint64_t bytes, uint32_t pieces, uint32_t wrs)
{
	struct vre_share *s = &d->share;

	s->deficit -= (int64_t)(bytes + (uint64_t)pieces * e->sched.wr_cost_bytes);
	if (s->bytes.rate > 0)
		s->bytes.tokens -= (double)bytes;
	if (s->wrs.rate > 0)
		s->wrs.tokens -= wrs;
	if (bytes || wrs)
		share_unthrottle(s, ctx(e)->now);
}

/* Packets a RoCE QP handled (its requester's or its responder's), charged as full packets of its path MTU. */
static void charge_packets(struct vre_engine *e, struct vre_device *d, const struct vre_qp *qp, uint32_t n)
{
	charge(e, d, (uint64_t)n * mtu_bytes(qp->attr.path_mtu), n, 0);
}

/* Run a QP's send queue: up to `budget` WQEs (or pieces of them), in order, while its device's turn lasts; flush
 * them in the error state. */
static uint32_t qp_poll(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, uint32_t budget)
{
	struct send_wqe *w = &ctx(e)->scratch.wqe;
	uint32_t prod, n = 0, k;
	uint32_t state = qp->attr.state;

	if (qp->net && (state == VRDMA_QPS_RTR || state == VRDMA_QPS_RTS) && qp->ring.valid) {
		net_lock(e);
		n = responder_poll(e, d, qp, budget);  /* READ responses it owes its peer on another host */
		net_unlock(e);
		charge_packets(e, d, qp, n);
	}
	if (state != VRDMA_QPS_RTS && state != VRDMA_QPS_ERR)
		return n;
	if (!qp->ring.valid) {
		qp_to_error(e, d, qp, VRDMA_EVENT_QP_FATAL);
		return 0;
	}
	if (qp->rnr_until) {
		if (ctx(e)->now < qp->rnr_until)
			return n;
		qp->rnr_until = 0;
	}
	prod = load_acquire(qp->sq_db);
	if (prod - qp->sq_head > qp->cfg.sq_depth) {
		/* More WQEs than the ring holds: the producer index is garbage. */
		qp_to_error(e, d, qp, VRDMA_EVENT_QP_FATAL);
		prod = qp->sq_head;
	}
	if (qp->net && qp->attr.state == VRDMA_QPS_RTS) {
		if (!limits_allow(d, qp)) {
			throttled(e, d);
			return n;
		}
		net_lock(e);
		k = remote_poll(e, d, qp, prod, budget);
		net_unlock(e);
		charge_packets(e, d, qp, k);
		return n + k;
	}
	while (qp->sq_head != prod && n < budget && d->share.deficit > 0) {
		bool starts = !qp->piece.done;
		enum exec x;

		if (qp->attr.state != VRDMA_QPS_ERR && !limits_allow(d, qp)) {
			throttled(e, d);
			break;
		}
		sq_wqe(qp, qp->sq_head, w);
		n++;
		if (qp->attr.state == VRDMA_QPS_ERR) {
			complete_send(e, d, qp, &w->hdr, VRDMA_WC_WR_FLUSH_ERR, 0);
			d->counters.flushed++;
			charge(e, d, 0, 1, 0);
			continue;
		}
		x = execute_send(e, d, qp, w);
		if (x == EXEC_BUSY) {
			n--;  /* nothing done: the WQE is still at the head */
			break;
		}
		charge(e, d, ctx(e)->moved, 1, starts && x != EXEC_WAIT);
		if (x == EXEC_WAIT)
			break;
	}
	if (qp->attr.state == VRDMA_QPS_ERR && n < budget) {
		responder_flush(e, d, qp);
		n += flush_recv(e, d, qp, budget - n);
	}
	return n;
}

/* A device's worth per turn: the quantum, a small piece's while another device of this thread sends small
 * messages, a solo piece's while no other device of it works (account.h: sched_size). */
static int64_t turn_worth(struct vre_engine *e, const struct vre_device *d)
{
	uint32_t quantum = sched_size(e, d, e->sched.quantum_bytes);

	return (int64_t)((uint64_t)quantum * d->share.weight / VRE_DEFAULT_WEIGHT) + 1;
}

/* A device's turn opens: its buckets brought up to date, its share of this round earned. False: nothing to run. */
static bool turn_open(struct vre_engine *e, struct vre_device *d)
{
	struct vre_share *s = &d->share;

	if (!d->nactive)
		return false;
	bucket_fill(&s->bytes, ctx(e)->now);
	bucket_fill(&s->wrs, ctx(e)->now);
	s->turn++;
	s->deficit += turn_worth(e, d);
	return true;
}

/* What is left of the turn, spent on the device's QPs in turn from where it last stopped. */
static uint32_t turn_spend(struct vre_engine *e, struct vre_device *d, uint32_t budget)
{
	struct vre_share *s = &d->share;
	uint32_t work = 0, n = d->nactive, k;

	for (k = 0; k < n && s->deficit > 0; k++)
		work += qp_poll(e, d, d->active[(s->next + k) % n], budget);
	release_destination(e);
	s->next = n ? (s->next + k) % n : 0;
	return work;
}

/* The turn ends: what it left unspent is not saved (deficit round robin: a device without work earns nothing). */
static void turn_close(struct vre_device *d, uint32_t work)
{
	if (d->share.deficit > 0)
		d->share.deficit = 0;
	if (work)
		d->share.counters.turns++;
}

/*
 * A device's turn: its share of this round (quantum * weight / VRE_DEFAULT_WEIGHT, plus the debt of a piece that
 * overran the last), spent on its QPs in turn from where its last turn stopped, so a busy device never gets more
 * than its weight however many QPs it keeps busy.
 */
static uint32_t device_turn(struct vre_engine *e, struct vre_device *d, uint32_t budget)
{
	uint32_t work;

	if (!turn_open(e, d))
		return 0;
	work = turn_spend(e, d, budget);
	turn_close(d, work);
	return work;
}

/* Whether device `d` is one this pass runs: a thread's own (w), or every open device (w NULL: the caller polls);
 * never a suspended one. */
static bool runs(const struct vre_device *d, const struct vre_worker *w)
{
	return __atomic_load_n(&d->open, __ATOMIC_ACQUIRE) && !__atomic_load_n(&d->suspended, __ATOMIC_ACQUIRE) &&
	       (!w || __atomic_load_n(&d->owner, __ATOMIC_ACQUIRE) == w->index);
}

/* The device for this pass, locked: not while a caller waits for it (the caller has it first) or holds it. */
static bool take_device(struct vre_device *d, struct vre_worker *w)
{
	if (w && __atomic_load_n(&d->waiters, __ATOMIC_ACQUIRE)) {
		stat_add(&w->stats.lock_waits, 1);
		return false;
	}
	if (device_trylock(d))
		return true;
	if (w)
		stat_add(&w->stats.lock_waits, 1);
	return false;
}

/*
 * A round in which nobody ran, while devices are still in debt (a piece, or a RoCE QP's packets, larger than their
 * turn is worth): the rounds that would pass doing nothing until the first of them may run again are passed at
 * once, every indebted device earning what it would have earned in them. Without this a round could do no work with
 * work waiting and no timer to wake for it. (A thread's devices only: each thread's rounds are its own.)
 */
static bool skip_idle_rounds(struct vre_engine *e, struct vre_worker *w, uint32_t hi)
{
	int64_t rounds = INT64_MAX;

	for (uint32_t i = 0; i < hi; i++) {
		struct vre_device *d = &e->devices[i];
		int64_t worth, need;

		if (!runs(d, w) || !take_device(d, w))
			continue;
		worth = turn_worth(e, d);
		if (d->open && d->nactive && d->share.deficit < 0) {
			need = (1 - d->share.deficit + worth - 1) / worth;  /* turns until its deficit is positive */
			rounds = need < rounds ? need : rounds;
		}
		device_unlock(d);
	}
	if (rounds == INT64_MAX)
		return false;
	for (uint32_t i = 0; i < hi; i++) {
		struct vre_device *d = &e->devices[i];

		if (!runs(d, w) || !take_device(d, w))
			continue;
		if (d->open && d->nactive && d->share.deficit < 0)
			d->share.deficit += (rounds - 1) * turn_worth(e, d);  /* the next turn adds the last one */
		device_unlock(d);
	}
	return true;
}

/* The packets waiting to go, sent (under the network's lock: any thread queues them). */
static void flush_network(struct vre_engine *e)
{
	if (!net_on(e))
		return;
	net_lock(e);
	if (e->tx_tail != e->tx_head)
		sock_send(e);
	net_unlock(e);
}

/*
 * The latency class (VRE_LATENCY_LOW): such a device's turn opens with the round (low_turns_open) and stays open
 * to its end (low_turns_close); in between, it gets a look before the round and after every other device's turn
 * that did work (low_looks), each spending what is left of its turn. Its small messages wait for at most one turn,
 * a piece, of another device, not for a round of every device's; it gets no more than its weight.
 */
static uint32_t low_turns_open(struct vre_engine *e, struct vre_worker *w, uint32_t hi)
{
	uint32_t opened = 0;

	for (uint32_t i = 0; i < hi; i++) {
		struct vre_device *d = &e->devices[i];

		if (!runs(d, w) || !take_device(d, w))
			continue;
		if (d->open && d->share.low_latency && turn_open(e, d)) {
			d->share.in_turn = true;
			d->share.turn_work = 0;
			opened++;
		}
		device_unlock(d);
	}
	return opened;
}

static uint32_t low_looks(struct vre_engine *e, struct vre_worker *w, uint32_t hi, uint32_t budget)
{
	uint32_t work = 0;

	for (uint32_t i = 0; i < hi; i++) {
		struct vre_device *d = &e->devices[i];

		if (!runs(d, w) || !take_device(d, w))
			continue;
		if (d->open && d->share.in_turn && d->share.deficit > 0) {
			uint32_t k = turn_spend(e, d, budget);

			d->share.turn_work += k;
			work += k;
		}
		device_unlock(d);
	}
	return work;
}

/* After a device's turn (under its lock): its moderation timers (once a pass), whether it worked (what balance()
 * looks at, and the thread's count of busy devices), its invariants. */
static void turn_done(struct vre_engine *e, struct vre_device *d, uint32_t done, bool first_round, uint32_t *busy)
{
	if (done)
		recent_seen(ctx(e)->worked, ctx(e)->now, d);
	if (first_round) {
		cq_timers(e, d);
		cq_sweep_arms(e, d);
		__atomic_store_n(&d->worked, done != 0, __ATOMIC_RELEASE);
		*busy += done != 0;
	}
	net_assert(d);
}

/* The low-latency turns close (blocking: a turn opened must close); what they did, counted as a turn's. */
static void low_turns_close(struct vre_engine *e, struct vre_worker *w, uint32_t hi, bool first_round,
			    uint32_t *busy)
{
	for (uint32_t i = 0; i < hi; i++) {
		struct vre_device *d = &e->devices[i];
		uint32_t done;

		if (!runs(d, w))
			continue;
		device_lock_blocking(d);
		if (d->share.in_turn) {
			done = d->share.turn_work;
			d->share.in_turn = false;
			turn_close(d, done);
			turn_done(e, d, done, first_round, busy);
		}
		device_unlock(d);
	}
}

VRE_FN uint32_t vre_poll_owned(struct vre_engine *e, struct vre_worker *w, uint32_t budget)
{
	uint32_t work = 0, busy = 0, hi = __atomic_load_n(&e->devices_hi, __ATOMIC_ACQUIRE);

	ctx(e)->now = engine_clock(e);
	/* each thread its rings; a caller all of them, only while no thread runs */
	if (net_on(e) && !e->capture)
		work += sock_recv(e, w, budget, vre_roce_input);
	for (uint32_t round = 0; round < 2; round++) {
		uint32_t low = low_turns_open(e, w, hi);

		if (low)
			work += low_looks(e, w, hi, budget);
		for (uint32_t i = 0; i < hi; i++) {
			struct vre_device *d = &e->devices[i];
			uint32_t done = 0;

			if (!runs(d, w) || !take_device(d, w))
				continue;
			if (d->share.in_turn) {  /* a low-latency device: its looks are low_looks' */
				device_unlock(d);
				continue;
			}
			if (d->open) {
				done = device_turn(e, d, budget);
				turn_done(e, d, done, round == 0, &busy);
			}
			device_unlock(d);
			work += done;
			if (low && done)
				work += low_looks(e, w, hi, budget);
		}
		if (low)
			low_turns_close(e, w, hi, round == 0, &busy);
		if (work || !skip_idle_rounds(e, w, hi))
			break;
	}
	if (w)
		__atomic_store_n(&w->busy_devices, busy, __ATOMIC_RELEASE);
	flush_network(e);
	return work;
}

uint32_t vre_poll(struct vre_engine *e, uint32_t budget)
{
	return vre_poll_owned(e, NULL, budget);
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
		uint32_t done = vre_poll(e, budget);

		work += done;
		if (e->ev_head != e->ev_tail || e->clock)
			break;  /* events to deliver, or a fixed clock that would never reach `until` */
		if (!done)
			__builtin_ia32_pause();  /* only while idle: a busy pass goes straight on to the next */
	} while (ctx(e)->now < until);
	return work;
}

/* When a bucket of the device has earned enough to run again: a byte (a work request) after its debt. */
static int64_t bucket_open_at(const struct vre_bucket *b, double need)
{
	if (b->rate <= 0 || b->tokens >= need)
		return b->at;
	return b->at + (int64_t)((need - b->tokens) * 1e9 / b->rate) + 1;
}

static int64_t limits_open_at(const struct vre_device *d)
{
	int64_t bytes = bucket_open_at(&d->share.bytes, 1e-9), wrs = bucket_open_at(&d->share.wrs, 1);

	return bytes > wrs ? bytes : wrs;
}

/* The earliest deadline of one device (under its lock), or `next`. */
static int64_t device_deadline(struct vre_device *d, int64_t next)
{
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
	if (d->open && d->share.throttled_since) {
		int64_t t = limits_open_at(d);

		if (next < 0 || t < next)
			next = t;
	}
	return next;
}

VRE_FN int64_t vre_next_deadline_owned(struct vre_engine *e, struct vre_worker *w)
{
	uint32_t hi = __atomic_load_n(&e->devices_hi, __ATOMIC_ACQUIRE);
	int64_t next = -1;

	for (uint32_t i = 0; i < hi; i++) {
		struct vre_device *d = &e->devices[i];

		if (!runs(d, w))
			continue;
		device_lock_blocking(d);
		next = device_deadline(d, next);
		device_unlock(d);
	}
	return next;
}

int64_t vre_next_deadline(struct vre_engine *e)
{
	return vre_next_deadline_owned(e, NULL);
}

/* Whether the device has work its poster would not wake it for (under its lock). */
static bool device_pending(struct vre_device *d, int64_t now)
{
	/* a device its limits hold back waits for its deadline (vre_next_deadline), not for this loop */
	if (d->share.throttled_since && limits_open_at(d) > now)
		return false;
	for (uint32_t j = 0; d->open && j < d->nactive; j++) {
		struct vre_qp *qp = d->active[j];

		/* a remote QP's started WQEs wait for ACKs, not for this loop */
		uint32_t started = qp->net && qp->attr.state == VRDMA_QPS_RTS ? qp->net->sq_next : qp->sq_head;

		if (((qp->attr.state == VRDMA_QPS_RTS || qp->attr.state == VRDMA_QPS_ERR) &&
		     load_acquire(qp->sq_db) != started && !qp->rnr_until) || net_busy(qp))
			return true;
	}
	return false;
}

static bool network_pending(struct vre_engine *e)
{
	bool pending;

	if (!net_on(e))
		return false;
	net_lock(e);
	pending = e->tx_tail != e->tx_head;
	net_unlock(e);
	return pending;
}

/* Tell every poster of the devices to wake us, then look once more: a doorbell rung before it read the flag is seen
 * here. (A thread's devices, or, w NULL, every device: the caller's.) */
VRE_FN int vre_park_owned(struct vre_engine *e, struct vre_worker *w)
{
	uint32_t hi = __atomic_load_n(&e->devices_hi, __ATOMIC_ACQUIRE);
	int64_t now;

	if ((!w || w->index == 0) && network_pending(e))
		return 0;  /* packets the network could not take yet */
	for (uint32_t i = 0; i < hi; i++) {
		struct vre_device *d = &e->devices[i];

		if (!runs(d, w))
			continue;
		device_lock_blocking(d);
		if (d->open && !d->parked) {
			vre_set_parked_flags(d, 1);
			d->parked = true;
		}
		device_unlock(d);
	}
	if (!w)
		e->caller_parked = true;
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	now = engine_clock(e);
	for (uint32_t i = 0; i < hi; i++) {
		struct vre_device *d = &e->devices[i];
		bool pending;

		if (!runs(d, w))
			continue;
		device_lock_blocking(d);
		pending = device_pending(d, now);
		device_unlock(d);
		if (pending) {
			vre_unpark_owned(e, w);
			return 0;
		}
	}
	return 1;
}

VRE_FN void vre_unpark_owned(struct vre_engine *e, struct vre_worker *w)
{
	uint32_t hi = __atomic_load_n(&e->devices_hi, __ATOMIC_ACQUIRE);

	if (!w)
		e->caller_parked = false;
	for (uint32_t i = 0; i < hi; i++) {
		struct vre_device *d = &e->devices[i];

		if (!w ? !__atomic_load_n(&d->open, __ATOMIC_ACQUIRE) : !runs(d, w))
			continue;
		device_lock_blocking(d);
		if (d->parked) {
			vre_set_parked_flags(d, 0);
			d->parked = false;
		}
		device_unlock(d);
	}
}

/* The caller's parking: nothing while the engine's threads run (each parks its own devices; a caller's flags would
 * undo theirs). */
int vre_park(struct vre_engine *e)
{
	return vre_thread_count(e) ? 0 : vre_park_owned(e, NULL);
}

void vre_unpark(struct vre_engine *e)
{
	if (!vre_thread_count(e))
		vre_unpark_owned(e, NULL);
}

uint32_t vre_take_events(struct vre_engine *e, struct vre_event *out, uint32_t max)
{
	uint32_t n = 0;

	events_lock(e);
	while (e->ev_head != e->ev_tail && n < max)
		out[n++] = e->events[e->ev_head++ % EVENT_RING];
	e->threads.events_told = false;  /* an engine thread tells of the next ones */
	events_unlock(e);
	return n;
}
