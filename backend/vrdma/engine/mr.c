// SPDX-License-Identifier: GPL-2.0-only
/* Memory regions: their pages translated at registration, and the key and range checks of every access. */
#include <errno.h>

#include "vre.h"

VRE_FN struct vre_mr *mr_by_key(struct vre_device *d, uint32_t key, bool remote)
{
	struct vre_mr *mr = mr_at(d, key & (d->lim.max_mr - 1));

	if (!mr || !mr->mem.valid || (remote ? mr->cfg.rkey : mr->cfg.lkey) != key)
		return NULL;
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

int vre_mr_create(struct vre_engine *e, uint32_t dev, uint32_t slot, const struct vre_mr_config *c)
{
	struct vre_device *d = vre_dev(e, dev);
	struct vre_mr *mr;
	int err;

	if (!mr_slot_free(d, slot))
		return vre_fail(e, EINVAL, "MR slot %u unusable", slot);
	if ((c->lkey & (d->lim.max_mr - 1)) != slot || (c->rkey & (d->lim.max_mr - 1)) != slot)
		return vre_fail(e, EINVAL, "MR keys do not name slot %u", slot);
	if (c->page_offset >= PAGE_SIZE || c->length > (uint64_t)c->pages.npages * PAGE_SIZE - c->page_offset ||
	    c->iova + c->length < c->iova)
		return vre_fail(e, EINVAL, "MR of %llu bytes at page offset %u does not fit its %u pages",
				(unsigned long long)c->length, c->page_offset, c->pages.npages);
	mr = obj_new(e, d, sizeof(*mr), offsetof(struct vre_mr, mem), &c->pages, "an MR", &err);
	if (!mr)
		return err;
	mr->cfg = *c;
	d->mrs[slot] = mr;
	return 0;
}

void vre_mr_destroy(struct vre_engine *e, uint32_t dev, uint32_t slot)
{
	struct vre_device *d = vre_dev(e, dev);

	obj_free(d, mr_take(d, slot), offsetof(struct vre_mr, mem));
}
