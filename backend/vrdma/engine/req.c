// SPDX-License-Identifier: GPL-2.0-only
/*
 * The requester of a QP whose peer is a QP of this engine: one send WQE, start to finish. The WQE (copied out of
 * guest memory by the scheduler, poll.c) is checked against its QP and its local memory (wqe.c), sent to its
 * destination QP (resp.c does the destination's part; ud.c a datagram's) and completed. A destination that does not
 * answer, or has no receive posted, makes the QP wait and retry as a real requester does (retry_cnt, rnr_retry).
 *
 * A message longer than the engine's piece size moves one piece per call (EXEC_MORE until its last), the WQE staying
 * at the head of the queue; each piece reads and checks it again, and one that no longer matches the message it
 * started (its opcode or length rewritten by the guest meanwhile) fails with a local QP operation error.
 */
#include <string.h>

#include "vre.h"

/* A piece of the message moved: where the message is, and what the scheduler charges and counts for it. */
static void piece_moved(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, const struct vre_request *r)
{
	struct vre_piece *p = &qp->piece;

	ctx(e)->moved = r->piece;
	if (r->first)
		*p = (struct vre_piece){ .len = r->len, .opcode = r->w->hdr.opcode, .turn = d->share.turn };
	else if (p->turn != d->share.turn)
		d->share.counters.deferred_bytes += r->piece;
	if (r->last && !r->first)
		d->share.counters.pieced_messages++;
	p->done = r->off + r->piece;
}

/* One send WQE, start to finish, its destination device's lock held (or its own). */
static enum exec execute(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, const struct send_wqe *w)
{
	struct vre_request r = { .e = e, .d = d, .qp = qp, .w = w, .op = vre_opcode(w->hdr.opcode),
				 .local = ctx(e)->scratch.local };
	struct vre_piece *p = &qp->piece;
	uint32_t piece_max;
	uint8_t status;
	struct vre_device *dd;
	struct vre_qp *dqp;

	ctx(e)->moved = 0;
	if (!p->done) {
		d->counters.send_wqes++;
		qp->counters.send_wqes++;
	}
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
	if (r.len <= e->sched.small_piece_bytes)
		recent_seen(ctx(e)->small, ctx(e)->now, d);  /* the other devices' turns and pieces small for a while */
	if (qp->cfg.flags & VRE_QP_UD) {
		ud_send(&r);  /* a datagram: sent (and completed) whether or not anyone takes it */
		ctx(e)->moved = r.len;
		return EXEC_DONE;
	}
	if (p->done && (r.len != p->len || w->hdr.opcode != p->opcode)) {
		status = VRDMA_WC_LOC_QP_OP_ERR;  /* rewritten between two of its pieces */
		goto local_error;
	}
	r.off = p->done;
	r.piece = r.len - r.off;
	piece_max = sched_size(e, d, e->sched.piece_bytes);
	if (r.piece > piece_max && !(r.op->flags & OP_ATOMIC))
		r.piece = piece_max;
	r.first = r.off == 0;
	r.last = r.off + r.piece == r.len;

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
		qp->rnr_until = ctx(e)->now + retry_wait_ns(qp);
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
		qp->rnr_until = ctx(e)->now + rnr_wait_ns(dqp->attr.min_rnr_timer);
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
	case RESP_MORE:
		piece_moved(e, d, qp, &r);
		return EXEC_MORE;
	case RESP_DONE:
		piece_moved(e, d, qp, &r);
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

/*
 * The device a WQE delivers into: its connected peer's, or a datagram's (routed by its GID). Neither changes while
 * the sender's device is locked (a QP's destination is set under its device's lock, the GID index under every lock).
 */
static struct vre_device *destination(struct vre_engine *e, struct vre_qp *qp, const struct send_wqe *w)
{
	if (qp->cfg.flags & VRE_QP_UD)
		return gid_route(e, w->hdr.ud.dgid);
	return qp->attr.dest_dev < e->ndevices ? &e->devices[qp->attr.dest_dev] : NULL;
}

/* Tries for another thread's device before giving up for this pass: a few microseconds, never a wait (two threads
 * delivering into each other's devices would wait for each other). */
#define DESTINATION_TRIES 64

/*
 * A destination that had no work of its own in its last turn (a VM that only receives) and runs on another thread
 * moves to this one (its lock is held here): its sender and it then share a thread and its locks stop crossing
 * cores, where balance() alone could leave each end of a flood on a thread of its own.
 */
static void follow(struct vre_ctx *c, struct vre_device *dd)
{
	if (c->worker == VRE_NO_WORKER || __atomic_load_n(&dd->owner, __ATOMIC_RELAXED) == c->worker ||
	    __atomic_load_n(&dd->worked, __ATOMIC_RELAXED) || c->now - dd->moved_at < VRE_MOVE_EVERY_NS)
		return;
	dd->moved_at = c->now;
	__atomic_store_n(&dd->owner, c->worker, __ATOMIC_RELEASE);
}

/*
 * The destination device locked for this WQE: kept locked for the next WQEs of the turn that go there too (one lock
 * a turn, not one a WQE; release_destination ends it with the turn), false if another thread or a caller has it.
 */
static bool hold_destination(struct vre_engine *e, struct vre_device *dd)
{
	struct vre_ctx *c = ctx(e);

	if (c->held == dd)
		return true;
	release_destination(e);
	for (uint32_t tries = 0;; tries++) {
		if (!__atomic_load_n(&dd->waiters, __ATOMIC_ACQUIRE) && device_trylock(dd))
			break;
		if (tries == DESTINATION_TRIES)
			return false;
		__builtin_ia32_pause();
	}
	c->held = dd;
	follow(c, dd);
	return true;
}

VRE_FN void release_destination(struct vre_engine *e)
{
	struct vre_ctx *c = ctx(e);

	if (c->held) {
		device_unlock(c->held);
		c->held = NULL;
	}
}

VRE_FN enum exec execute_send(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, const struct send_wqe *w)
{
	struct vre_device *dd = destination(e, qp, w);

	if (dd && dd != d && !hold_destination(e, dd)) {
		ctx(e)->moved = 0;
		return EXEC_BUSY;  /* the WQE stays at the head: the next pass tries again */
	}
	if (dd && __atomic_load_n(&dd->suspended, __ATOMIC_ACQUIRE)) {
		/* Its VM is being saved or loaded (a migration, an upgrade): a pause, not a lost peer, so no retry is
		 * spent; the WQE waits at the head as after an RNR. */
		ctx(e)->moved = 0;
		qp->rnr_until = ctx(e)->now + VRE_SUSPENDED_WAIT_NS;
		return EXEC_WAIT;
	}
	return execute(e, d, qp, w);
}
