// SPDX-License-Identifier: GPL-2.0-only
/*
 * A device's state as data (engine.h: vre_device_save, vre_device_load): what a live migration or a backend upgrade
 * carries of the engine's side of a VM. The writer walks the device's tables in a fixed order (MRs, CQs, SRQs, QPs:
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

#define MAX_TIMER_NS (INT64_C(1) << 43)  /* ~2.4 h: more than any wait the engine sets (4.096 us * 2^31) */

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

/* One record: its header, its kind's struct (`body`, zero-filled by the caller), its pages, and `tail`. */
static void put_record(struct out *o, uint32_t kind, uint32_t slot, const void *body, uint32_t body_len,
		       const struct vre_mem *m, const void *tail, uint32_t tail_len)
{
	uint32_t npages = m ? m->npages : 0;
	struct vre_state_record rec = { .kind = kind, .slot = slot, .npages = npages,
					.bytes = (uint32_t)(sizeof(rec) + body_len + (uint64_t)npages * 8 + tail_len) };

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
	put_record(o, VRE_STATE_MR, slot, &s, sizeof(s), &mr->mem, NULL, 0);
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
	put_record(o, VRE_STATE_CQ, slot, &s, sizeof(s), &cq->ring, NULL, 0);
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
	put_record(o, VRE_STATE_SRQ, slot, &s, sizeof(s), &srq->ring, NULL, 0);
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
		held_len = (uint32_t)(sizeof(struct vrdma_recv_wqe) + (uint64_t)qp->held.max_sge * sizeof(struct vrdma_sge));
	}
	put_record(o, VRE_STATE_QP, slot, &s, sizeof(s), &qp->ring, s.held ? qp->held.wqe : NULL, held_len);
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
	for (uint32_t i = 0; i < d->lim.max_qp; i++)
		if (d->qps[i] && d->qps[i]->net)
			return vre_fail(e, ENOTSUP, "QP %#x has its peer on another host: its RoCE transport state cannot "
					"be saved yet", d->qps[i]->cfg.qpn);
	save_device(e, d, &size);
	if (!buf)
		return (int64_t)size.at;
	if (len < size.at)
		return vre_fail(e, ENOSPC, "the state of device %u takes %llu bytes, not %llu (nothing written)", dev,
				(unsigned long long)size.at, (unsigned long long)len);
	save_device(e, d, &o);
	return (int64_t)o.at;
}

/* -- loading ------------------------------------------------------------------------------------------------- */

/* Where the loader is in the state, and how it loads (check only: nothing translated, everything freed after). */
struct in {
	struct vre_engine *e;
	struct vre_device *d;
	const uint8_t *p;
	uint64_t left;
	bool translate;
	uint64_t mr_gen;          /* the header's: no MR may be newer */
};

static bool boolean(uint32_t v)
{
	return v <= 1;
}

/* The pages of a record's object, into `m` (room: a fast-registration MR's max_pages, else npages). */
static int load_pages(struct in *in, const struct vre_state_record *rec, const uint8_t *pages, uint32_t room,
		      bool valid, struct vre_mem *m)
{
	return mem_from_state(in->e, in->d, pages, rec->npages, room, in->translate, valid, m);
}

static int load_mr(struct in *in, const struct vre_state_record *rec, const struct vre_state_mr *s,
		   const uint8_t *pages)
{
	struct vre_engine *e = in->e;
	struct vre_device *d = in->d;
	const struct vre_mr_config *c = &s->cfg;
	uint64_t span = (uint64_t)rec->npages * PAGE_SIZE;
	uint32_t room = c->max_pages ? c->max_pages : rec->npages;
	struct vre_mr *mr;
	int err;

	if (!mr_slot_free(d, rec->slot) || key_slot(d, c->rkey) != rec->slot ||
	    (!c->mw_type && key_slot(d, c->lkey) != rec->slot))
		return vre_fail(e, EINVAL, "MR slot %u unusable, or its keys name another", rec->slot);
	if (c->pages.addr || c->pages.levels || c->pages.npages != rec->npages || !boolean(s->mapped) || !s->gen ||
	    s->gen > in->mr_gen || c->mw_type > 2)
		return vre_fail(e, EINVAL, "MR slot %u: pages, generation, access or type out of range", rec->slot);
	if (c->mw_type) {
		if (rec->npages || c->max_pages || c->lkey || (c->access & ~VRDMA_MW_ACCESS) ||
		    s->target_slot >= d->lim.max_mr)
			return vre_fail(e, EINVAL, "memory window in slot %u: no pages, a window's rights, an MR "
					"slot", rec->slot);
	} else if (c->max_pages) {
		if (c->lkey != c->rkey || rec->npages > c->max_pages || (s->mapped && !rec->npages))
			return vre_fail(e, EINVAL, "fast-registration MR in slot %u: one key, at most %u pages",
					rec->slot, c->max_pages);
	} else if (!rec->npages) {
		return vre_fail(e, EINVAL, "MR in slot %u has no pages", rec->slot);
	}
	if (!c->mw_type && (s->mapped || !c->max_pages) &&
	    (c->page_offset >= PAGE_SIZE || c->length > span - c->page_offset || c->iova + c->length < c->iova))
		return vre_fail(e, EINVAL, "MR of %llu bytes at page offset %u does not fit its %u pages",
				(unsigned long long)c->length, c->page_offset, rec->npages);
	mr = calloc(1, sizeof(*mr));
	if (!mr)
		return vre_fail(e, ENOMEM, "no memory for an MR");
	/* mapped: a fast-registration MR's pages, a window's binding, a registered MR's memory (a memory-table change
	 * can leave one without) */
	err = load_pages(in, rec, pages, room, s->mapped, &mr->mem);
	if (err) {
		free(mr);
		return err;
	}
	if (c->mw_type)
		mr->mem.valid = s->mapped;  /* a window has no pages: bound or not */
	mr->cfg = *c;
	mr->cfg.pages = (struct vre_pages_desc){ 0 };
	mr->gen = s->gen;
	mr->target_gen = s->target_gen;
	mr->target_slot = s->target_slot;
	mr->bound_qpn = s->bound_qpn;
	d->mrs[rec->slot] = mr;
	return 0;
}

static int load_cq(struct in *in, const struct vre_state_record *rec, const struct vre_state_cq *s,
		   const uint8_t *pages)
{
	struct vre_cq_config c = s->cfg;
	struct vre_cq *cq;
	int err;

	if (c.ring.addr || c.ring.levels || c.ring.npages != rec->npages || !boolean(s->error) ||
	    !boolean(s->ring_valid) || s->mod_left_ns < 0 || s->mod_left_ns > (int64_t)UINT32_MAX * 1000)
		return vre_fail(in->e, EINVAL, "CQ slot %u: its ring or moderation out of range", rec->slot);
	err = cq_config_check(in->e, in->d, rec->slot, &c);
	if (err)
		return err;
	cq = calloc(1, sizeof(*cq));
	if (!cq)
		return vre_fail(in->e, ENOMEM, "no memory for a CQ");
	err = load_pages(in, rec, pages, rec->npages, s->ring_valid, &cq->ring);
	if (err) {
		free(cq);
		return err;
	}
	cq->cfg = c;
	cq->arm = vre_db_adopt(in->d, c.db);
	cq->prod = s->prod;
	cq->arm_done = s->arm_done;
	cq->error = s->error;
	cq->mod_count = s->mod_count;
	cq->mod_period_us = s->mod_period_us;
	cq->mod_pending = s->mod_pending;
	if (s->mod_left_ns) {
		cq->mod_deadline = engine_clock(in->e) + s->mod_left_ns;
		if (!in->d->mod_next || cq->mod_deadline < in->d->mod_next)
			in->d->mod_next = cq->mod_deadline;
	}
	in->d->cqs[rec->slot] = cq;
	return 0;
}

static int load_srq(struct in *in, const struct vre_state_record *rec, const struct vre_state_srq *s,
		    const uint8_t *pages)
{
	struct vre_srq *srq;
	int err;

	if (s->cfg.ring.addr || s->cfg.ring.levels || s->cfg.ring.npages != rec->npages || !boolean(s->error) ||
	    !boolean(s->ring_valid))
		return vre_fail(in->e, EINVAL, "SRQ slot %u: its ring or limit out of range", rec->slot);
	err = srq_config_check(in->e, in->d, rec->slot, &s->cfg);
	if (err)
		return err;
	srq = calloc(1, sizeof(*srq));
	if (!srq)
		return vre_fail(in->e, ENOMEM, "no memory for an SRQ");
	err = load_pages(in, rec, pages, rec->npages, s->ring_valid, &srq->ring);
	if (err) {
		free(srq);
		return err;
	}
	srq->cfg = s->cfg;
	srq->db = vre_db_adopt(in->d, s->cfg.db);
	srq->cons = s->cons;
	srq->limit = s->limit;
	srq->error = s->error;
	in->d->srqs[rec->slot] = srq;
	return 0;
}

/* A QP's runtime state (its attributes: qp_attr_ok, as vre_qp_modify takes them). */
static bool qp_state_ok(const struct vre_device *d, const struct vre_state_qp *s)
{
	bool piece_ok = s->piece_done ? s->piece_done < s->piece_len && s->piece_len <= d->lim.max_msg_size &&
					(uint8_t)s->piece_opcode == s->piece_opcode && vre_opcode((uint8_t)s->piece_opcode) :
					!s->piece_len && !s->piece_opcode;

	return qp_attr_ok(&s->attr) && s->rnr_left <= 7 && s->retry_left <= 7 && s->rnr_left_ns >= 0 && s->rnr_left_ns <= MAX_TIMER_NS && piece_ok &&
	       boolean(s->held) && boolean(s->ring_valid) && (s->held ? s->held_sges <= d->lim.max_sge :
								      !s->held_sges);
}

static int load_qp(struct in *in, const struct vre_state_record *rec, const struct vre_state_qp *s,
		   const uint8_t *pages, const uint8_t *held)
{
	struct vre_engine *e = in->e;
	struct vre_device *d = in->d;
	const struct vre_qp_config *c = &s->cfg;
	bool own_rq = c->srq == VRE_NO_SRQ && !(c->flags & (VRE_QP_XRC_INI | VRE_QP_XRC_TGT));
	struct vrdma_recv_wqe held_hdr;
	struct vre_qp *qp;
	int err;

	if (c->ring.addr || c->ring.levels || c->ring.npages != rec->npages || !qp_state_ok(d, s))
		return vre_fail(e, EINVAL, "QP slot %u: its ring, attributes or runtime state out of range", rec->slot);
	if (s->held) {
		memcpy(&held_hdr, held, sizeof(held_hdr));
		if (held_hdr.num_sge > s->held_sges || (c->flags & VRE_QP_XRC_INI))
			return vre_fail(e, EINVAL, "QP slot %u holds a receive of %u SGEs in room for %u", rec->slot,
					held_hdr.num_sge, s->held_sges);
	}
	err = qp_config_check(e, d, rec->slot, c);
	if (err)
		return err;
	qp = calloc(1, sizeof(*qp));
	if (!qp)
		return vre_fail(e, ENOMEM, "no memory for a QP");
	if (s->held)
		qp->held.wqe = calloc(1, sizeof(*qp->held.wqe));
	err = s->held && !qp->held.wqe ? vre_fail(e, ENOMEM, "no memory for a held receive") :
					 load_pages(in, rec, pages, rec->npages, s->ring_valid, &qp->ring);
	if (err) {
		free(qp->held.wqe);
		free(qp);
		return err;
	}
	if (!(c->flags & VRE_QP_XRC_TGT)) {
		qp->sq_db = vre_db_adopt(d, c->sq_db);
		qp->rq_db = own_rq ? vre_db_adopt(d, c->rq_db) : NULL;
	}
	qp->cfg = *c;
	qp->cfg.ring = (struct vre_pages_desc){ 0 };
	qp->attr = s->attr;
	qp->sq_head = s->sq_head;
	qp->rq_cons = s->rq_cons;
	qp->rnr_left = s->rnr_left;
	qp->retry_left = s->retry_left;
	qp->rnr_until = s->rnr_left_ns ? engine_clock(e) + s->rnr_left_ns : 0;
	qp->counters = s->counters;
	qp->piece = (struct vre_piece){ .done = s->piece_done, .len = s->piece_len, .opcode = s->piece_opcode };
	if (s->held) {
		memcpy(qp->held.wqe, held,
		       sizeof(struct vrdma_recv_wqe) + (size_t)s->held_sges * sizeof(struct vrdma_sge));
		qp->held.max_sge = s->held_sges;
		qp->held.held = true;
	}
	qp_insert(d, rec->slot, qp);
	return 0;
}

/* A record's struct: its size by kind (0: no such kind). */
static uint32_t body_size(uint32_t kind)
{
	switch (kind) {
	case VRE_STATE_MR:
		return sizeof(struct vre_state_mr);
	case VRE_STATE_CQ:
		return sizeof(struct vre_state_cq);
	case VRE_STATE_SRQ:
		return sizeof(struct vre_state_srq);
	case VRE_STATE_QP:
		return sizeof(struct vre_state_qp);
	default:
		return 0;
	}
}

/* One record, checked against what is left of the state and loaded. */
static int load_record(struct in *in, uint32_t *last_kind)
{
	struct vre_state_record rec;
	union {
		struct vre_state_mr mr;
		struct vre_state_cq cq;
		struct vre_state_srq srq;
		struct vre_state_qp qp;
	} body;
	uint32_t size;
	uint64_t held_len = 0, need;
	const uint8_t *pages;

	if (in->left < sizeof(rec))
		return vre_fail(in->e, EINVAL, "the state ends inside a record's header");
	memcpy(&rec, in->p, sizeof(rec));
	size = body_size(rec.kind);
	if (!size || rec.kind < *last_kind || rec.npages > in->d->lim.max_mr_pages)
		return vre_fail(in->e, EINVAL, "a record of kind %u (after kind %u) with %u pages", rec.kind, *last_kind,
				rec.npages);
	need = sizeof(rec) + (uint64_t)size + (uint64_t)rec.npages * 8;
	if (need > in->left)
		return vre_fail(in->e, EINVAL, "the state ends inside a record of kind %u", rec.kind);
	memcpy(&body, in->p + sizeof(rec), size);  /* aligned copies: the state's bytes need not be */
	if (rec.kind == VRE_STATE_QP && body.qp.held) {
		if (body.qp.held_sges > MAX_WQE_SGES)
			return vre_fail(in->e, EINVAL, "a held receive of %u SGEs", body.qp.held_sges);
		held_len = sizeof(struct vrdma_recv_wqe) + (uint64_t)body.qp.held_sges * sizeof(struct vrdma_sge);
	}
	if (rec.bytes != need + held_len || rec.bytes > in->left)
		return vre_fail(in->e, EINVAL, "a record of kind %u says it has %u bytes, its contents %llu", rec.kind,
				rec.bytes, (unsigned long long)(need + held_len));
	pages = in->p + sizeof(rec) + size;
	*last_kind = rec.kind;
	in->p += rec.bytes;
	in->left -= rec.bytes;
	switch (rec.kind) {
	case VRE_STATE_MR:
		return load_mr(in, &rec, &body.mr, pages);
	case VRE_STATE_CQ:
		return load_cq(in, &rec, &body.cq, pages);
	case VRE_STATE_SRQ:
		return load_srq(in, &rec, &body.srq, pages);
	default:
		return load_qp(in, &rec, &body.qp, pages, pages + (size_t)rec.npages * 8);
	}
}

static bool device_empty(const struct vre_device *d)
{
	for (uint32_t i = 0; i < d->lim.max_mr; i++)
		if (d->mrs[i])
			return false;
	for (uint32_t i = 0; i < d->lim.max_cq; i++)
		if (d->cqs[i])
			return false;
	for (uint32_t i = 0; i < d->lim.max_srq; i++)
		if (d->srqs[i])
			return false;
	for (uint32_t i = 0; i < d->lim.max_qp; i++)
		if (d->qps[i])
			return false;
	return true;
}

/* Every object of the device freed (a refused or only checked state): the device as it was, open and empty. */
static void forget_objects(struct vre_engine *e, uint32_t dev, struct vre_device *d)
{
	for (uint32_t i = 0; i < d->lim.max_qp; i++)
		vre_qp_destroy(e, dev, i);
	for (uint32_t i = 0; i < d->lim.max_srq; i++)
		vre_srq_destroy(e, dev, i);
	for (uint32_t i = 0; i < d->lim.max_cq; i++)
		vre_cq_destroy(e, dev, i);
	for (uint32_t i = 0; i < d->lim.max_mr; i++)
		vre_mr_destroy(e, dev, i);
	d->mod_next = 0;
	d->mr_gen = 0;
}

int vre_device_load(struct vre_engine *e, uint32_t dev, const uint8_t *buf, uint64_t len, uint32_t flags)
{
	struct vre_device *d = vre_dev(e, dev);
	struct vre_state_header h;
	struct in in = { .e = e, .d = d, .translate = !(flags & VRE_LOAD_CHECK) };
	uint32_t last_kind = 0;
	bool was_suspended;
	int err = 0;

	if (!d)
		return vre_fail(e, ENODEV, "device %u is not open", dev);
	if (flags & ~VRE_LOAD_CHECK)
		return vre_fail(e, EINVAL, "load flags %#x", flags);
	if (!device_empty(d))
		return vre_fail(e, EBUSY, "device %u has objects: a state loads into an empty device", dev);
	if (!buf || len < sizeof(h))
		return vre_fail(e, EINVAL, "a state of %llu bytes has no header", (unsigned long long)len);
	memcpy(&h, buf, sizeof(h));
	if (h.magic != VRE_STATE_MAGIC || h.version != VRE_STATE_VERSION)
		return vre_fail(e, EINVAL, "not a device state of version %u (magic %#x, version %u)",
				VRE_STATE_VERSION, h.magic, h.version);
	if (h.bytes != len || h.max_mr != d->lim.max_mr || h.max_cq != d->lim.max_cq || h.max_srq != d->lim.max_srq ||
	    h.max_qp != d->lim.max_qp || h.reserved ||
	    h.records > (uint64_t)h.max_mr + h.max_cq + h.max_srq + h.max_qp)
		return vre_fail(e, EINVAL, "a state of %llu bytes and %u records for tables of %u MRs, %u CQs, %u SRQs "
				"and %u QPs does not fit this device (%llu bytes given)", (unsigned long long)h.bytes,
				h.records, h.max_mr, h.max_cq, h.max_srq, h.max_qp, (unsigned long long)len);
	was_suspended = __atomic_load_n(&d->suspended, __ATOMIC_ACQUIRE);
	__atomic_store_n(&d->suspended, true, __ATOMIC_RELEASE);  /* nobody delivers into what is half loaded */
	in.p = buf + sizeof(h);
	in.left = len - sizeof(h);
	in.mr_gen = h.mr_gen;
	for (uint32_t i = 0; i < h.records && !err; i++)
		err = load_record(&in, &last_kind);
	if (!err && in.left)
		err = vre_fail(e, EINVAL, "%llu bytes after the state's %u records", (unsigned long long)in.left,
			       h.records);
	if (err || !in.translate) {
		forget_objects(e, dev, d);
		__atomic_store_n(&d->suspended, was_suspended, __ATOMIC_RELEASE);
		return err;
	}
	d->mr_gen = h.mr_gen;
	d->counters = h.counters;
	d->roce = h.roce;
	return 0;
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
