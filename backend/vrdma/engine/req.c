// SPDX-License-Identifier: GPL-2.0-only
/*
 * The requester of a QP whose peer is a QP of this engine: one send WQE, start to finish. The WQE (copied out of
 * guest memory by the scheduler, poll.c) is checked against its QP and its local memory (wqe.c), sent to its
 * destination QP (resp.c does the destination's part; ud.c a datagram's) and completed. A destination that does not
 * answer, or has no receive posted, makes the QP wait and retry as a real requester does (retry_cnt, rnr_retry).
 */
#include <string.h>

#include "vre.h"

/* One send WQE, start to finish. */
VRE_FN enum exec execute_send(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp,
			      const struct send_wqe *w)
{
	struct vre_request r = { .e = e, .d = d, .qp = qp, .w = w, .op = vre_opcode(w->hdr.opcode),
				 .local = e->scratch.local };
	uint8_t status;
	struct vre_device *dd;
	struct vre_qp *dqp;

	d->counters.send_wqes++;
	qp->counters.send_wqes++;
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
	if (qp->cfg.flags & VRE_QP_UD) {
		ud_send(&r);  /* a datagram: sent (and completed) whether or not anyone takes it */
		return EXEC_DONE;
	}

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
		qp->rnr_until = e->now + retry_wait_ns(qp);
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
		qp->rnr_until = e->now + rnr_wait_ns(dqp->attr.min_rnr_timer);
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
	case RESP_DONE:
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
