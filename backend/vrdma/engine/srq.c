// SPDX-License-Identifier: GPL-2.0-only
/*
 * Shared receive queues: a ring of receive WQEs in the guest's memory, and the limit event (recv.c takes from it).
 * An XRC SRQ also has an XRC domain, a CQ for its receives and an SRQ number that XRC initiators name it by.
 */
#include <errno.h>
#include <string.h>

#include "vre.h"

/* What an SRQ's configuration must be, made by a command or loaded from a state. */
VRE_FN int srq_config_check(struct vre_engine *e, struct vre_device *d, uint32_t slot, const struct vre_srq_config *c)
{
	if (!srq_slot_free(d, slot))
		return vre_fail(e, EINVAL, "SRQ slot %u unusable", slot);
	if (!recv_queue_fits(c->depth, d->lim.max_srq_wr, c->stride, c->max_sge, d->lim.max_sge) ||
	    !srq_ring_fits(c->depth, c->stride, c->ring.npages))
		return vre_fail(e, EINVAL, "SRQ layout (depth %u, stride %u, %u SGEs, %u pages) is not usable",
				c->depth, c->stride, c->max_sge, c->ring.npages);
	if (!vre_db_slot(d, c->db))
		return vre_fail(e, EINVAL, "SRQ doorbell index %u unusable", c->db);
	if ((c->flags & ~VRE_SRQ_KERNEL) || (c->xrcd && (!cq_at(d, c->cq) || (c->srqn & (d->lim.max_srq - 1)) != slot)))
		return vre_fail(e, EINVAL, "SRQ flags %#x, XRC domain %u, CQ slot %u, SRQ number %#x unusable",
				c->flags, c->xrcd, c->cq, c->srqn);
	return 0;
}

int vre_srq_create(struct vre_engine *e, uint32_t dev, uint32_t slot, const struct vre_srq_config *c)
{
	struct vre_device *d = vre_dev(e, dev);
	struct vre_srq *srq;
	int err = srq_config_check(e, d, slot, c);

	if (err)
		return err;
	srq = obj_new(e, d, sizeof(*srq), offsetof(struct vre_srq, ring), &c->ring, "an SRQ", &err);
	if (!srq)
		return err;
	srq->cfg = *c;
	srq->db = vre_db_claim(d, c->db);
	srq->limit = c->limit;
	memset(mem_at(&srq->ring, 0), 0, sizeof(struct vrdma_srq_ring_hdr));
	mem_dirty(&srq->ring, 0, sizeof(struct vrdma_srq_ring_hdr));
	d->srqs[slot] = srq;
	return 0;
}

int vre_srq_set_limit(struct vre_engine *e, uint32_t dev, uint32_t slot, uint32_t limit)
{
	struct vre_srq *srq = srq_at(vre_dev(e, dev), slot);

	if (!srq)
		return vre_fail(e, EINVAL, "no SRQ in slot %u", slot);
	srq->limit = limit;
	return 0;
}

/* The armed limit: 0 once the limit event fired (IB: the limit disarms itself). */
int vre_srq_limit(struct vre_engine *e, uint32_t dev, uint32_t slot)
{
	struct vre_srq *srq = srq_at(vre_dev(e, dev), slot);

	if (!srq)
		return vre_fail(e, EINVAL, "no SRQ in slot %u", slot);
	return (int)srq->limit;
}

void vre_srq_destroy(struct vre_engine *e, uint32_t dev, uint32_t slot)
{
	struct vre_device *d = vre_dev(e, dev);

	obj_free(d, srq_take(d, slot), offsetof(struct vre_srq, ring));
}
