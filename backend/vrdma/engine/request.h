/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * A request of one QP of this engine to another (req.c, resp.c, ud.c, and wqe.c, which reads the send WQE both
 * requesters use): what the requester hands the responder and what each answers. Part of the engine's private
 * header (vre.h includes it).
 */
#ifndef VRDMA_ENGINE_REQUEST_H
#define VRDMA_ENGINE_REQUEST_H

/* How long a sender waits before it looks again at a destination whose device is suspended (vre_device_suspend). */
#define VRE_SUSPENDED_WAIT_NS 100000

/* -- a request: what a requester hands the responder ------------------------------------------------------------ */

/* What a request brings to its destination: the requester's checked local data. */
struct vre_request {
	struct vre_engine *e;
	struct vre_device *d;     /* requester */
	struct vre_qp *qp;
	const struct send_wqe *w;
	const struct vre_opcode *op;
	struct seg *local;
	uint32_t nlocal;
	uint64_t len;
	/* The part of the message this call moves: [off, off + piece); the whole message (0, len, true, true) unless
	 * the scheduler cut it into pieces. */
	uint64_t off;
	uint64_t piece;
	bool first;
	bool last;
};

/* RESP_FAILED: the responder completed the request with its error; RESP_LOCAL_ERROR: the requester completes it
 * with *status and goes to the error state alone; RESP_DROPPED: an unreliable (UC) message the responder could
 * not take is lost, as if on the wire, and the requester completes it successfully. */
enum resp { RESP_DONE, RESP_RNR, RESP_FAILED, RESP_LOCAL_ERROR, RESP_DROPPED, RESP_MORE };
/* RESP_MORE: a piece that is not the message's last was moved; nothing completes yet. */

/* -- wqe.c: a send WQE as the requesters read it --------------------------------------------------------------- */

/* Copy send WQE `index` (masked into the ring) out of guest memory. */
VRE_FN void sq_wqe(const struct vre_qp *qp, uint32_t index, struct send_wqe *w);
/* Segments of SGEs of PD `pd`'s memory, checked (keys, PD, bounds, local write access if asked): a status. */
VRE_FN uint8_t sges_to_segs(struct vre_device *d, uint32_t pd, bool kernel, const struct vrdma_sge *sge, uint32_t n,
			    bool need_write, uint64_t max_msg, struct seg *segs, uint32_t *nsegs, uint64_t *total);
/* The requester's own checks of r->w (its opcode, its local data into r->local): a status. */
VRE_FN uint8_t wqe_local_data(struct vre_request *r);
/* The WQE at the head of the send queue completes (sq_head moves on). */
VRE_FN void complete_send(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, const struct vrdma_send_wqe *w,
		   uint8_t status, uint32_t byte_len);
/* How long a requester waits after an RNR NAK with this timer field (the InfiniBand specification's table). */
VRE_FN int64_t rnr_wait_ns(uint32_t timer);

/* -- req.c and resp.c: a request to a QP of this engine ----------------------------------------------------------- */

/* EXEC_MORE: one piece of the message moved, the WQE stays at the head for the next. */
enum exec { EXEC_DONE, EXEC_WAIT, EXEC_MORE, EXEC_BUSY };

/* One send WQE of a QP whose peer is here (or a datagram), start to finish; EXEC_WAIT: retry it later; EXEC_BUSY:
 * its destination device was another thread's or a caller's, untouched: the next pass tries again. */
VRE_FN enum exec execute_send(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, const struct send_wqe *w);
/* The destination device execute_send kept locked, unlocked: at the end of every turn. */
VRE_FN void release_destination(struct vre_engine *e);
VRE_FN enum resp respond(const struct vre_request *r, struct vre_device *dd, struct vre_qp *dqp, uint8_t *status);

/* -- ud.c -------------------------------------------------------------------------------------------------- */

/* How long a requester waits for an answer before it sends again: 4.096 us * 2^timeout (0: "infinite", which
 * this device takes as 100 ms without counting retries down). */
static inline int64_t retry_wait_ns(const struct vre_qp *qp)
{
	return qp->attr.timeout ? (int64_t)4096 << (qp->attr.timeout & 31) : 100000000;
}

VRE_FN void ud_send(struct vre_request *r);

#endif /* VRDMA_ENGINE_REQUEST_H */
