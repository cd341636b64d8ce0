// SPDX-License-Identifier: GPL-2.0-only
/*
 * A device's state as data (engine.h: vre_device_save, vre_device_load; the records: state_format.h): what a live
 * migration or a backend upgrade carries of the engine's side of a VM, and the device suspended and moved around it.
 * The writer walks the device's tables in a fixed order (MRs, CQs, SRQs, QPs:
 * each record names only objects of earlier records) and writes each object's configuration, its runtime state and
 * the guest-physical pages it was translated from. The loader is as strict as the commands that made the objects,
 * because a state arrives from outside the process (QEMU's migration stream, a former backend): every record goes
 * through the configuration checks of its kind's creation (cq_config_check, ...), every runtime field through a check
 * of its own, and any refusal leaves the device as it was before, open and empty. Nothing in guest memory is
 * written: the rings, WQEs and doorbells came with the guest (its RAM, the doorbell region the model restores first).
 *
 * Not yet carried: a QP whose peer is on another host (its RoCE transport state: PSNs, unanswered requests, the
 * READ and atomic replay caches), refused at save with ENOTSUP (docs/migration.md).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "vre.h"

/* The layouts are the format: a change of any is a new VRE_STATE_VERSION. */
_Static_assert(sizeof(struct vre_state_header) == 296, "struct vre_state_header changed: bump VRE_STATE_VERSION");
_Static_assert(sizeof(struct vre_state_record) == 16, "struct vre_state_record changed: bump VRE_STATE_VERSION");
_Static_assert(sizeof(struct vre_state_mr) == 96, "struct vre_state_mr changed: bump VRE_STATE_VERSION");
_Static_assert(sizeof(struct vre_state_cq) == 72, "struct vre_state_cq changed: bump VRE_STATE_VERSION");
_Static_assert(sizeof(struct vre_state_srq) == 80, "struct vre_state_srq changed: bump VRE_STATE_VERSION");
_Static_assert(sizeof(struct vre_state_qp) == 296, "struct vre_state_qp changed: bump VRE_STATE_VERSION");
_Static_assert(sizeof(struct vre_state_remote) == 120, "struct vre_state_remote changed: bump VRE_STATE_VERSION");
_Static_assert(sizeof(struct vre_state_sent) == 16 && sizeof(struct vre_state_rd) == 48,
	       "struct vre_state_sent or vre_state_rd changed: bump VRE_STATE_VERSION");
_Static_assert(VRE_STATE_MAX_RD == VRE_MAX_RD, "the responder's ring of READs and atomics changed size");


/* Where the writer is: bytes written so far, or counted only (buf NULL; vre_device_save counts first, so a buffer
 * is never short). */
struct out {
	uint8_t *buf;
	uint64_t len;
	uint64_t at;
};

static void put(struct out *o, const void *p, uint64_t n)
{
	if (!n)
		return;  /* (p may be NULL then) */
	if (o->buf && n <= o->len - o->at)
		memcpy(o->buf + o->at, p, n);
	o->at += n;
}

/* One record: its header, its kind's struct (`body`, zero-filled by the caller), its pages, and `tail`; `more`
 * bytes the caller writes after it belong to the record too. */
static void put_record(struct out *o, uint32_t kind, uint32_t slot, const void *body, uint32_t body_len,
		       const struct vre_mem *m, const void *tail, uint32_t tail_len, uint32_t more)
{
	uint32_t npages = m ? m->npages : 0;
	struct vre_state_record rec = { .kind = kind, .slot = slot, .npages = npages,
					.bytes = (uint32_t)(sizeof(rec) + body_len + (uint64_t)npages * 8 + tail_len +
							    more) };

	put(o, &rec, sizeof(rec));
	put(o, body, body_len);
	for (uint32_t i = 0; i < npages; i++)
		put(o, &m->gpa[i], sizeof(m->gpa[i]));
	put(o, tail, tail_len);
}

/* The time left until `at` (0: no timer), as a state carries it: clocks differ between processes and hosts. */
static int64_t left_ns(const struct vre_engine *e, int64_t at)
{
	int64_t now = engine_clock(e);

	return at ? (at > now ? at - now : 1) : 0;
}

static void save_mr(struct out *o, uint32_t slot, const struct vre_mr *mr)
{
	struct vre_state_mr s;

	memset(&s, 0, sizeof(s));
	s.cfg = mr->cfg;
	s.cfg.pages = (struct vre_pages_desc){ .npages = mr->mem.npages };
	s.gen = mr->gen;
	s.target_gen = mr->target_gen;
	s.target_slot = mr->target_slot;
	s.bound_qpn = mr->bound_qpn;
	s.mapped = mr->mem.valid;
	put_record(o, VRE_STATE_MR, slot, &s, sizeof(s), &mr->mem, NULL, 0, 0);
}

static void save_cq(const struct vre_engine *e, struct out *o, uint32_t slot, const struct vre_cq *cq)
{
	struct vre_state_cq s;

	memset(&s, 0, sizeof(s));
	s.cfg = cq->cfg;
	s.cfg.ring = (struct vre_pages_desc){ .npages = cq->ring.npages };
	s.prod = cq->prod;
	s.arm_done = cq->arm_done;
	s.error = cq->error;
	s.mod_count = cq->mod_count;
	s.mod_period_us = cq->mod_period_us;
	s.mod_pending = cq->mod_pending;
	s.ring_valid = cq->ring.valid;
	s.mod_left_ns = left_ns(e, cq->mod_deadline);
	put_record(o, VRE_STATE_CQ, slot, &s, sizeof(s), &cq->ring, NULL, 0, 0);
}

static void save_srq(struct out *o, uint32_t slot, const struct vre_srq *srq)
{
	struct vre_state_srq s;

	memset(&s, 0, sizeof(s));
	s.cfg = srq->cfg;
	s.cfg.ring = (struct vre_pages_desc){ .npages = srq->ring.npages };
	s.cons = srq->cons;
	s.limit = srq->limit;
	s.error = srq->error;
	s.ring_valid = srq->ring.valid;
	put_record(o, VRE_STATE_SRQ, slot, &s, sizeof(s), &srq->ring, NULL, 0, 0);
}

/* A remote QP's transport state (after its record's held receive). */
static void save_remote(const struct vre_engine *e, struct out *o, const struct vre_qp *qp)
{
	const struct vre_remote *n = qp->net;
	struct vre_state_remote r;

	memset(&r, 0, sizeof(r));
	r = (struct vre_state_remote){
		.sq_cur = n->sq_cur, .sq_next = n->sq_next, .cur_psn = n->cur_psn, .next_psn = n->next_psn,
		.una_psn = n->una_psn, .sent_psn = n->sent_psn, .gap_psn = n->gap_psn, .gap_asked = n->gap_asked,
		.rd_out = n->rd_out, .since_ackreq = n->since_ackreq, .epsn = n->epsn, .msn = n->msn,
		.nak_sent = n->nak_sent, .in_send = n->in_send, .in_write = n->in_write, .wr_rkey = n->wr_rkey,
		.wr_len = n->wr_len, .ack_owed = n->ack_owed, .ack_psn = n->ack_psn, .ack_aeth = n->ack_aeth,
		.rd_head = n->rd_head, .rd_tail = n->rd_tail, .rwqe_held = n->rwqe_held,
		.rwqe_sges = n->rwqe_held ? n->rwqe->hdr.num_sge : 0, .msg_off = n->msg_off, .wr_va = n->wr_va,
		.deadline_left_ns = left_ns(e, n->deadline) };
	put(o, &r, sizeof(r));
	for (uint32_t i = 0; i < (qp->cfg.sq_depth ? qp->cfg.sq_depth : 1); i++) {
		struct vre_state_sent s = { .first_psn = n->sent[i].first_psn, .npkts = n->sent[i].npkts,
					    .len = n->sent[i].len, .kind = n->sent[i].kind };

		put(o, &s, sizeof(s));
	}
	for (uint32_t i = 0; i < VRE_MAX_RD; i++) {
		const struct vre_rd_job *j = &n->rd[i];
		struct vre_state_rd s;

		memset(&s, 0, sizeof(s));
		s = (struct vre_state_rd){ .psn = j->psn, .npkts = j->npkts, .sent = j->sent, .rkey = j->rkey, .va = j->va,
					   .len = j->len, .atomic = j->atomic, .answered = j->answered,
					   .orig = j->orig };
		put(o, &s, sizeof(s));
	}
	if (n->rwqe_held)
		put(o, n->rwqe, recv_bytes(r.rwqe_sges));
}

static void save_qp(const struct vre_engine *e, struct out *o, uint32_t slot, const struct vre_qp *qp)
{
	struct vre_state_qp s;
	uint32_t held_len = 0;

	memset(&s, 0, sizeof(s));
	s.cfg = qp->cfg;
	s.cfg.ring = (struct vre_pages_desc){ .npages = qp->ring.npages };
	s.attr = qp->attr;
	s.sq_head = qp->sq_head;
	s.rq_cons = qp->rq_cons;
	s.rnr_left = qp->rnr_left;
	s.retry_left = qp->retry_left;
	s.piece_opcode = qp->piece.opcode;
	s.piece_done = qp->piece.done;
	s.piece_len = qp->piece.len;
	s.rnr_left_ns = left_ns(e, qp->rnr_until);
	s.counters = qp->counters;
	s.ring_valid = qp->ring.valid;
	if (qp->held.held) {
		s.held = 1;
		s.held_sges = qp->held.max_sge;
		held_len = (uint32_t)recv_bytes(qp->held.max_sge);
	}
	s.remote = qp->net != NULL;
	put_record(o, VRE_STATE_QP, slot, &s, sizeof(s), &qp->ring, s.held ? qp->held.wqe : NULL, held_len,
		   s.remote ? (uint32_t)remote_bytes(qp->cfg.sq_depth, qp->net->rwqe_held ? qp->net->rwqe->hdr.num_sge : 0,
						       qp->net->rwqe_held) : 0);
	if (s.remote)
		save_remote(e, o, qp);
}

/* The state written (or counted, buf NULL) into `o`. */
static void save_device(const struct vre_engine *e, const struct vre_device *d, struct out *o)
{
	struct vre_state_header h;
	uint64_t start = o->at;

	memset(&h, 0, sizeof(h));
	h.magic = VRE_STATE_MAGIC;
	h.version = VRE_STATE_VERSION;
	h.max_mr = d->lim.max_mr;
	h.max_cq = d->lim.max_cq;
	h.max_srq = d->lim.max_srq;
	h.max_qp = d->lim.max_qp;
	h.mr_gen = d->mr_gen;
	h.counters = d->counters;
	h.roce = d->roce;
	put(o, &h, sizeof(h));
	for (uint32_t i = 0; i < d->lim.max_mr; i++)
		if (d->mrs[i]) {
			save_mr(o, i, d->mrs[i]);
			h.records++;
		}
	for (uint32_t i = 0; i < d->lim.max_cq; i++)
		if (d->cqs[i]) {
			save_cq(e, o, i, d->cqs[i]);
			h.records++;
		}
	for (uint32_t i = 0; i < d->lim.max_srq; i++)
		if (d->srqs[i]) {
			save_srq(o, i, d->srqs[i]);
			h.records++;
		}
	for (uint32_t i = 0; i < d->lim.max_qp; i++)
		if (d->qps[i]) {
			save_qp(e, o, i, d->qps[i]);
			h.records++;
		}
	h.bytes = o->at - start;
	if (o->buf)
		memcpy(o->buf + start, &h, sizeof(h));  /* its count and length, known now */
}

int64_t vre_device_save(struct vre_engine *e, uint32_t dev, uint8_t *buf, uint64_t len)
{
	struct vre_device *d = vre_dev(e, dev);
	struct out size = { 0 }, o = { .buf = buf, .len = len };

	if (!d)
		return vre_fail(e, ENODEV, "device %u is not open", dev);
	if (!__atomic_load_n(&d->suspended, __ATOMIC_ACQUIRE))
		return vre_fail(e, EBUSY, "device %u runs: suspend it before saving its state", dev);
	save_device(e, d, &size);
	if (!buf)
		return (int64_t)size.at;
	if (len < size.at)
		return vre_fail(e, ENOSPC, "the state of device %u takes %llu bytes, not %llu (nothing written)", dev,
				(unsigned long long)size.at, (unsigned long long)len);
	save_device(e, d, &o);
	return (int64_t)o.at;
}

int vre_device_reroute(struct vre_engine *e, uint32_t from, uint32_t to)
{
	uint32_t hi = __atomic_load_n(&e->devices_hi, __ATOMIC_ACQUIRE);

	if (from >= e->ndevices || !vre_dev(e, to))
		return vre_fail(e, EINVAL, "no route from device %u to device %u", from, to);
	for (uint32_t i = 0; i < hi; i++) {
		struct vre_device *d = vre_dev(e, i);

		for (uint32_t j = 0; d && j < d->lim.max_qp; j++)
			if (d->qps[j] && d->qps[j]->attr.dest_dev == from)
				d->qps[j]->attr.dest_dev = to;
	}
	return 0;
}

int vre_device_suspend(struct vre_engine *e, uint32_t dev, int suspended)
{
	struct vre_device *d = vre_dev(e, dev);

	if (!d)
		return vre_fail(e, ENODEV, "device %u is not open", dev);
	__atomic_store_n(&d->suspended, suspended != 0, __ATOMIC_RELEASE);
	if (!suspended)
		vre_kick(e, dev);  /* its thread looks at its doorbells again: nobody rang while it was away */
	return 0;
}
