// SPDX-License-Identifier: GPL-2.0-only
/*
 * A device's state loaded (engine.h: vre_device_load; the records: state_format.h; state.c writes them). A state
 * arrives from outside the process, so every record goes through the configuration checks of its kind's creation
 * (cq_config_check, ...), every runtime field through a check of its own, a remote QP's transport state through the
 * invariants its requester and responder keep (net_check), and any refusal leaves the device open and empty.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "vre.h"

#define MAX_TIMER_NS (INT64_C(1) << 43)  /* ~2.4 h: more than any wait the engine sets (4.096 us * 2^31) */

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
	cq_install(in->d, rec->slot, cq);
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
	       boolean(s->held) && boolean(s->ring_valid) && boolean(s->remote) && !s->reserved &&
	       (s->held ? s->held_sges <= d->lim.max_sge : !s->held_sges);
}

/*
 * A remote QP's transport state, from `p` (its record's remote part, sized by load_record): its fields, its send
 * queue's slots and its READ ring as they were; its addresses and path MTU derived from its attributes; then held
 * to the invariants the requester and responder keep (net_check), which a state must meet like any other.
 */
static int load_remote(struct in *in, struct vre_qp *qp, const uint8_t *p)
{
	struct vre_engine *e = in->e;
	uint32_t slots = qp->cfg.sq_depth ? qp->cfg.sq_depth : 1;
	struct vre_state_remote r;
	struct vre_remote *n;
	const char *why;

	memcpy(&r, p, sizeof(r));
	p += sizeof(r);
	if (!net_on(e) || (qp->cfg.flags & ~(VRE_QP_KERNEL | VRE_QP_UC)) || qp->attr.state < VRDMA_QPS_RTR ||
	    qp->attr.dest_dev != VRE_NO_DEVICE)
		return vre_fail(e, EINVAL, "QP %#x speaks RoCE to another host, and cannot here (no network, not RC or "
				"UC, not ready to receive, or a peer on this host)", qp->cfg.qpn);
	if (!boolean(r.gap_asked) || !boolean(r.nak_sent) || !boolean(r.in_send) || !boolean(r.in_write) ||
	    !boolean(r.ack_owed) || r.deadline_left_ns < 0 || r.deadline_left_ns > MAX_TIMER_NS ||
	    ((r.cur_psn | r.next_psn | r.una_psn | r.sent_psn | r.gap_psn | r.epsn | r.ack_psn) & ~PSN_MASK))
		return vre_fail(e, EINVAL, "QP %#x's transport state out of range", qp->cfg.qpn);
	if (net_qp_alloc(e, qp))
		return -ENOMEM;
	n = qp->net;
	net_qp_address(qp);
	*n = (struct vre_remote){ .addr = n->addr, .mtu = n->mtu, .sent = n->sent, .rwqe = n->rwqe,
		.sq_cur = r.sq_cur, .sq_next = r.sq_next, .cur_psn = r.cur_psn, .next_psn = r.next_psn,
		.una_psn = r.una_psn, .sent_psn = r.sent_psn, .gap_psn = r.gap_psn, .gap_asked = r.gap_asked,
		.rd_out = r.rd_out, .since_ackreq = r.since_ackreq, .epsn = r.epsn, .msn = r.msn, .nak_sent = r.nak_sent,
		.in_send = r.in_send, .in_write = r.in_write, .msg_off = r.msg_off, .wr_va = r.wr_va,
		.wr_rkey = r.wr_rkey, .wr_len = r.wr_len, .ack_owed = r.ack_owed, .ack_psn = r.ack_psn,
		.ack_aeth = r.ack_aeth, .rd_head = r.rd_head, .rd_tail = r.rd_tail, .rwqe_held = r.rwqe_held,
		.deadline = r.deadline_left_ns ? engine_clock(e) + r.deadline_left_ns : 0 };
	for (uint32_t i = 0; i < slots; i++, p += sizeof(struct vre_state_sent)) {
		struct vre_state_sent s;

		memcpy(&s, p, sizeof(s));
		if (s.kind > SENT_ATOMIC)
			return vre_fail(e, EINVAL, "QP %#x: a started WQE of kind %u", qp->cfg.qpn, s.kind);
		n->sent[i] = (struct vre_sent){ .first_psn = s.first_psn, .npkts = s.npkts, .len = s.len, .kind = s.kind };
	}
	for (uint32_t i = 0; i < VRE_MAX_RD; i++, p += sizeof(struct vre_state_rd)) {
		struct vre_state_rd s;

		memcpy(&s, p, sizeof(s));
		if (!boolean(s.atomic) || !boolean(s.answered) || (s.psn & ~PSN_MASK))
			return vre_fail(e, EINVAL, "QP %#x: a READ or atomic out of range", qp->cfg.qpn);
		n->rd[i] = (struct vre_rd_job){ .psn = s.psn, .npkts = s.npkts, .sent = s.sent, .rkey = s.rkey,
						.va = s.va, .len = s.len, .atomic = s.atomic, .answered = s.answered,
						.orig = s.orig };
	}
	if (r.rwqe_held)
		memcpy(n->rwqe, p, recv_bytes(r.rwqe_sges));
	if (r.rwqe_held && n->rwqe->hdr.num_sge > r.rwqe_sges)
		return vre_fail(e, EINVAL, "QP %#x: a receive of %u SGEs in room for %u", qp->cfg.qpn,
				n->rwqe->hdr.num_sge, r.rwqe_sges);
	why = net_check(qp);
	return why ? vre_fail(e, EINVAL, "QP %#x's transport state: %s", qp->cfg.qpn, why) : 0;
}

static int load_qp(struct in *in, const struct vre_state_record *rec, const struct vre_state_qp *s,
		   const uint8_t *pages, const uint8_t *held, const uint8_t *remote)
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
	/* (a refusal frees the QP with the others: it is in its slot now) */
	return s->remote ? load_remote(in, qp, remote) : 0;
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
	uint64_t held_len = 0, remote_len = 0, need;
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
		held_len = recv_bytes(body.qp.held_sges);
	}
	if (rec.kind == VRE_STATE_QP && body.qp.remote) {
		struct vre_state_remote r;

		if (body.qp.cfg.sq_depth > in->d->lim.max_qp_wr || need + held_len + sizeof(r) > in->left)
			return vre_fail(in->e, EINVAL, "a remote QP of %u send slots, or cut short", body.qp.cfg.sq_depth);
		memcpy(&r, in->p + need + held_len, sizeof(r));
		if (r.rwqe_sges > MAX_WQE_SGES || !boolean(r.rwqe_held))
			return vre_fail(in->e, EINVAL, "a remote QP's receive of %u SGEs", r.rwqe_sges);
		remote_len = remote_bytes(body.qp.cfg.sq_depth, r.rwqe_sges, r.rwqe_held);
	}
	if (rec.bytes != need + held_len + remote_len || rec.bytes > in->left)
		return vre_fail(in->e, EINVAL, "a record of kind %u says it has %u bytes, its contents %llu", rec.kind,
				rec.bytes, (unsigned long long)(need + held_len + remote_len));
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
		return load_qp(in, &rec, &body.qp, pages, pages + (size_t)rec.npages * 8,
			       pages + (size_t)rec.npages * 8 + held_len);
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
	device_objects_free(e, dev, d);
	d->mod_next = 0;
	d->mr_gen = 0;
}

/*
 * Every QP's peer device as this engine numbers it. A state names a QP's peer on its host by the source engine's
 * device number, which means another VM (or none) here: the number is derived again from the peer's GID (the
 * device's own GIDs are set before its state loads; another VM's, before a backend upgrade loads any). A QP whose
 * peer was on the source's host and is on no device here (its VM moved away from its peer), and one that spoke RoCE
 * to a peer now on this host, are refused: turning a QP from one transport to the other is not built (a QP in error
 * keeps no peer).
 */
static int route_peers(struct vre_engine *e, struct vre_device *d)
{
	for (uint32_t j = 0; j < d->lim.max_qp; j++) {
		struct vre_qp *qp = d->qps[j];
		struct vre_device *peer;

		if (!qp || (qp->attr.dest_dev == VRE_NO_DEVICE && !qp->net))
			continue;
		peer = gid_route(e, qp->attr.dgid);
		if (qp->net && peer)
			return vre_fail(e, EOPNOTSUPP, "QP %#x spoke RoCE to a peer that is on this host now",
					qp->cfg.qpn);
		if (!qp->net && !peer && qp->attr.state != VRDMA_QPS_ERR)
			return vre_fail(e, EOPNOTSUPP, "QP %#x's peer was on the source's host and is on no device here",
					qp->cfg.qpn);
		if (!qp->net)  /* (a QP in error moves nothing: its lost peer is none) */
			qp->attr.dest_dev = peer ? dev_index(e, peer) : VRE_NO_DEVICE;
	}
	return 0;
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
	if (!err && in.translate)
		err = route_peers(e, d);
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

