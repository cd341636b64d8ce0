// SPDX-License-Identifier: GPL-2.0-only
/*
 * Memory regions: their pages translated at registration, and the key and range checks of every access. A
 * fast-registration MR (ALLOC_MR) has room for its pages from the start and is mapped and unmapped by work
 * requests of its PD's QPs: REG_MR reads a page list out of guest RAM, LOCAL_INV (or a SEND_WITH_INV arriving)
 * unmaps it, as an HCA's memory-management extensions do. A memory window (ALLOC_MW) lives in the same table (MRs
 * and windows share one key space, as an HCA's memory keys do): a BIND_MW work request points it at a range of an
 * MR with MW_BIND access, and remote accesses by its rkey reach that range of that MR with the window's rights.
 */
#include <errno.h>
#include <stdlib.h>

#include "vre.h"

VRE_FN struct vre_mr *mr_by_key(struct vre_device *d, uint32_t key, bool remote)
{
	struct vre_mr *mr = mr_at(d, key_slot(d, key));

	if (!mr || !mr->mem.valid || (remote ? mr->cfg.rkey : mr->cfg.lkey) != key || (!remote && mr->cfg.mw_type))
		return NULL;  /* (a window is no local key) */
	return mr;
}

/* The offset in mr->mem of [addr, addr + len), if that range lies inside the MR. */
VRE_FN bool mr_range(const struct vre_mr *mr, uint64_t addr, uint64_t len, uint64_t *off)
{
	if (addr < mr->cfg.iova)
		return false;
	uint64_t rel = addr - mr->cfg.iova;

	if (rel > mr->cfg.length || len > mr->cfg.length - rel)
		return false;
	*off = mr->cfg.page_offset + rel;
	return true;
}

/* A fast-registration MR: room for max_pages pages, charged to the translation budget now; nothing mapped. */
static int fast_mr_create(struct vre_engine *e, struct vre_device *d, uint32_t slot, const struct vre_mr_config *c)
{
	struct vre_mr *mr;

	if (c->pages.npages || c->length || c->max_pages > d->lim.max_mr_pages || c->lkey != c->rkey)
		return vre_fail(e, EINVAL, "a fast-registration MR of %u pages has no pages, length or second key yet",
				c->max_pages);
	if (c->max_pages > d->lim.max_pages_total - d->pages_in_use)
		return vre_fail(e, ENOMEM, "a fast-registration MR of %u pages: the device has %llu of %u pages "
				"translated", c->max_pages, (unsigned long long)d->pages_in_use,
				d->lim.max_pages_total);
	mr = calloc(1, sizeof(*mr));
	if (mr) {
		mr->mem.gpa = calloc(c->max_pages, sizeof(*mr->mem.gpa));
		mr->mem.hva = calloc(c->max_pages, sizeof(*mr->mem.hva));
	}
	if (!mr || !mr->mem.gpa || !mr->mem.hva) {
		if (mr) {
			free(mr->mem.gpa);
			free(mr->mem.hva);
		}
		free(mr);
		return vre_fail(e, ENOMEM, "no memory for a fast-registration MR of %u pages", c->max_pages);
	}
	mr->cfg = *c;
	d->pages_in_use += c->max_pages;
	mr->gen = ++d->mr_gen;
	d->mrs[slot] = mr;
	return 0;
}

static int mw_create(struct vre_engine *e, struct vre_device *d, uint32_t slot, const struct vre_mr_config *c);

int vre_mr_create(struct vre_engine *e, uint32_t dev, uint32_t slot, const struct vre_mr_config *c)
{
	struct vre_device *d = vre_dev(e, dev);
	struct vre_mr *mr;
	int err;

	if (!mr_slot_free(d, slot))
		return vre_fail(e, EINVAL, "MR slot %u unusable", slot);
	if ((!c->mw_type && key_slot(d, c->lkey) != slot) || key_slot(d, c->rkey) != slot)
		return vre_fail(e, EINVAL, "MR keys do not name slot %u", slot);
	if (c->mw_type)
		return mw_create(e, d, slot, c);
	if (c->max_pages)
		return fast_mr_create(e, d, slot, c);
	if (c->page_offset >= PAGE_SIZE || c->length > (uint64_t)c->pages.npages * PAGE_SIZE - c->page_offset ||
	    c->iova + c->length < c->iova)
		return vre_fail(e, EINVAL, "MR of %llu bytes at page offset %u does not fit its %u pages",
				(unsigned long long)c->length, c->page_offset, c->pages.npages);
	mr = obj_new(e, d, sizeof(*mr), offsetof(struct vre_mr, mem), &c->pages, "an MR", &err);
	if (!mr)
		return err;
	mr->cfg = *c;
	mr->gen = ++d->mr_gen;
	d->mrs[slot] = mr;
	return 0;
}

int vre_mr_rereg(struct vre_engine *e, uint32_t dev, uint32_t slot, const struct vre_mr_config *c)
{
	struct vre_device *d = vre_dev(e, dev);
	struct vre_mr *mr = mr_at(d, slot);
	struct vre_mem mem;
	uint64_t pages;
	int err;

	if (!mr || mr->cfg.max_pages || mr->cfg.mw_type || c->max_pages || c->mw_type)
		return vre_fail(e, EINVAL, "MR slot %u holds no MR of REG_MR", slot);
	if (c->lkey != mr->cfg.lkey || c->rkey != mr->cfg.rkey)
		return vre_fail(e, EINVAL, "reregistering MR slot %u cannot change its keys", slot);
	pages = c->pages.npages ? c->pages.npages : mr->mem.npages;
	if (c->page_offset >= PAGE_SIZE || c->length > pages * PAGE_SIZE - c->page_offset ||
	    c->iova + c->length < c->iova)
		return vre_fail(e, EINVAL, "MR of %llu bytes at page offset %u does not fit its %llu pages",
				(unsigned long long)c->length, c->page_offset, (unsigned long long)pages);
	if (c->pages.npages) {
		err = mem_load(e, d, &c->pages, d->lim.max_mr_pages, &mem);
		if (err)
			return err;  /* the MR keeps its pages */
		mem_put(d, &mr->mem);
		mr->mem = mem;
	}
	mr->cfg = *c;
	mr->gen = ++d->mr_gen;  /* windows bound to what it was reach nothing now */
	return 0;
}

/* A memory window: a key, bound to nothing yet. */
static int mw_create(struct vre_engine *e, struct vre_device *d, uint32_t slot, const struct vre_mr_config *c)
{
	struct vre_mr *mw;

	if (c->mw_type > 2 || c->max_pages || c->pages.npages || c->length || c->access || c->lkey)
		return vre_fail(e, EINVAL, "a memory window of type %u has only a PD and an rkey", c->mw_type);
	mw = calloc(1, sizeof(*mw));
	if (!mw)
		return vre_fail(e, ENOMEM, "no memory for a memory window");
	mw->cfg = *c;
	mw->gen = ++d->mr_gen;
	d->mrs[slot] = mw;
	return 0;
}

void vre_mr_destroy(struct vre_engine *e, uint32_t dev, uint32_t slot)
{
	struct vre_device *d = vre_dev(e, dev);
	struct vre_mr *mr = mr_take(d, slot);

	if (mr && mr->cfg.max_pages) {
		mr->mem.npages = mr->cfg.max_pages;  /* what it was charged, mapped or not */
		mem_put(d, &mr->mem);
		free(mr);
		return;
	}
	obj_free(d, mr, offsetof(struct vre_mr, mem));
}

VRE_FN uint8_t mr_fast_register(struct vre_device *d, uint32_t pd, const struct vrdma_send_wqe *w)
{
	struct vre_mr *mr = mr_at(d, key_slot(d, w->reg.key));
	uint32_t n = w->reg.npages, access = w->reg.access;
	uint64_t iova = w->reg.iova, length = w->reg.length, offset = iova & (PAGE_SIZE - 1);
	bool remote_needs_local = (access & (VRDMA_ACCESS_REMOTE_WRITE | VRDMA_ACCESS_REMOTE_ATOMIC)) &&
				  !(access & VRDMA_ACCESS_LOCAL_WRITE);
	const uint64_t *list;

	if (!mr || !mr->cfg.max_pages || mr->cfg.pd != pd || mr->mem.valid)
		return VRDMA_WC_LOC_PROT_ERR;  /* not a fast-registration MR of this PD, or mapped (invalidate first) */
	if (!n || n > mr->cfg.max_pages || (access & ~VRDMA_ALL_ACCESS) || remote_needs_local ||
	    length > (uint64_t)n * PAGE_SIZE - offset || iova + length < iova || (w->reg.page_list & 7))
		return VRDMA_WC_LOC_QP_OP_ERR;
	list = (const uint64_t *)gpa_range(d, w->reg.page_list, (uint64_t)n * sizeof(*list));
	if (!list)
		return VRDMA_WC_LOC_PROT_ERR;
	mr->mem.npages = 0;  /* nothing usable until every page is */
	for (uint32_t i = 0; i < n; i++) {
		uint64_t gpa = __atomic_load_n(&list[i], __ATOMIC_RELAXED);
		uint8_t *hva = gpa & (PAGE_SIZE - 1) ? NULL : gpa_range(d, gpa, PAGE_SIZE);

		if (!hva)
			return VRDMA_WC_LOC_PROT_ERR;  /* a page that is not the guest's RAM */
		mr->mem.gpa[i] = gpa;
		mr->mem.hva[i] = hva;
	}
	mr->mem.npages = n;
	mr->mem.log = &d->log;
	mr->cfg.lkey = mr->cfg.rkey = w->reg.key;
	mr->cfg.access = access;
	mr->cfg.iova = iova;
	mr->cfg.length = length;
	mr->cfg.page_offset = (uint32_t)offset;
	mr->gen = ++d->mr_gen;  /* windows bound to its last mapping reach nothing */
	mr->mem.valid = true;
	return VRDMA_WC_SUCCESS;
}

VRE_FN uint8_t mr_invalidate(struct vre_device *d, uint32_t pd, uint32_t qpn, uint32_t key)
{
	struct vre_mr *mr = mr_at(d, key_slot(d, key));

	/* Only a fast-registration MR or a type 2 window (of the QP it is bound to) of this PD, by its current key. */
	if (!mr || mr->cfg.pd != pd || mr->cfg.rkey != key ||
	    !(mr->cfg.max_pages || (mr->cfg.mw_type == 2 && mr->mem.valid && mr->bound_qpn == qpn)))
		return VRDMA_WC_LOC_PROT_ERR;
	mr->mem.valid = false;
	return VRDMA_WC_SUCCESS;
}

VRE_FN uint8_t mw_bind(struct vre_device *d, const struct vre_qp *qp, const struct vrdma_send_wqe *w)
{
	uint32_t mw_rkey = w->bind.mw_rkey, new_rkey = w->bind.new_rkey, access = w->bind.access;
	const uint32_t consumer = VRDMA_KEY_CONSUMER_MASK;
	uint64_t addr = w->bind.addr, length = w->bind.length, off;
	struct vre_mr *mw = mr_at(d, key_slot(d, mw_rkey)), *mr = NULL;

	if (qp->cfg.flags & (VRE_QP_UD | VRE_QP_XRC_TGT))
		return VRDMA_WC_LOC_QP_OP_ERR;  /* windows are bound on connected QPs */
	/*
	 * The window by its key, whatever its low byte (the consumer's: an application need not track what it last
	 * bound a window as); the new key keeps the rest. A bound type 2 window binds again once invalidated.
	 */
	if (!mw || !mw->cfg.mw_type || ((mw->cfg.rkey ^ mw_rkey) & ~consumer) || mw->cfg.pd != qp->cfg.pd ||
	    ((new_rkey ^ mw_rkey) & ~consumer) || (access & ~VRDMA_MW_ACCESS) || (mw->cfg.mw_type == 2 && mw->mem.valid))
		return VRDMA_WC_MW_BIND_ERR;
	if (length) {
		mr = mr_by_key(d, w->bind.mr_lkey, false);
		if (!mr || mr->cfg.pd != qp->cfg.pd || !(mr->cfg.access & VRDMA_ACCESS_MW_BIND) ||
		    ((access & (VRDMA_ACCESS_REMOTE_WRITE | VRDMA_ACCESS_REMOTE_ATOMIC)) &&
		     !(mr->cfg.access & VRDMA_ACCESS_LOCAL_WRITE)) || !mr_range(mr, addr, length, &off))
			return VRDMA_WC_MW_BIND_ERR;
		mw->target_slot = key_slot(d, mr->cfg.lkey);
		mw->target_gen = mr->gen;
	}
	mw->cfg.rkey = new_rkey;
	mw->cfg.iova = addr;
	mw->cfg.length = length;
	mw->cfg.access = access;
	mw->bound_qpn = qp->cfg.qpn;
	mw->mem.valid = mr != NULL;  /* length 0 unbinds */
	return VRDMA_WC_SUCCESS;
}

VRE_FN struct vre_mr *mw_target(struct vre_device *d, const struct vre_mr *mw, uint32_t qpn, uint64_t addr,
				uint64_t len)
{
	struct vre_mr *mr = mr_at(d, mw->target_slot);
	uint64_t rel = addr - mw->cfg.iova;

	if ((mw->cfg.mw_type == 2 && mw->bound_qpn != qpn) || addr < mw->cfg.iova || rel > mw->cfg.length ||
	    len > mw->cfg.length - rel)
		return NULL;
	if (!mr || mr->gen != mw->target_gen || !mr->mem.valid || mr->cfg.pd != mw->cfg.pd)
		return NULL;  /* the MR went (or was reregistered, or invalidated) since the bind */
	return mr;
}

/* The responder's checks of a remote access: rkey, PD (the receive side's: an XRC target has its SRQ's), bounds,
 * MR (or window) and QP access rights. */
VRE_FN struct vre_mr *remote_mr(struct vre_device *dd, struct vre_qp *dqp, uint32_t pd, uint32_t rkey,
				uint64_t addr, uint64_t len, uint32_t access, uint64_t *off)
{
	struct vre_mr *mr = mr_by_key(dd, rkey, true);

	if (!mr || mr->cfg.pd != pd || !(mr->cfg.access & access) || !(dqp->attr.access_flags & access))
		return NULL;
	if (mr->cfg.mw_type)
		mr = mw_target(dd, mr, dqp->cfg.qpn, addr, len);  /* the window's rights, its MR's memory */
	return mr && mr_range(mr, addr, len, off) ? mr : NULL;
}
