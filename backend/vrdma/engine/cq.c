// SPDX-License-Identifier: GPL-2.0-only
/*
 * Completion queues: CQEs written into the guest's ring (never over one the consumer has not read), events for an
 * armed CQ, and moderation (an event per so many completions, or so long after the first).
 */
#include <errno.h>
#include <string.h>

#include "vre.h"

VRE_FN void cq_announce(struct vre_engine *e, struct vre_device *d, struct vre_cq *cq, uint32_t arm)
{
	cq->arm_done = arm;
	cq->mod_pending = 0;
	cq->mod_deadline = 0;
	vre_post_event(e, dev_index(e, d), VRDMA_EVENT_CQ_COMP, cq->cfg.handle, 0);
}

VRE_FN void cq_push(struct vre_engine *e, struct vre_device *d, struct vre_cq *cq, const struct vrdma_cqe *cqe,
	     bool solicited)
{
	struct vrdma_cq_ring_hdr *hdr;
	uint32_t cons, arm;

	if (cq->error || !cq->ring.valid)
		return;
	hdr = (struct vrdma_cq_ring_hdr *)mem_at(&cq->ring, 0);
	cons = load_acquire(&hdr->cons);
	if (cq->prod - cons >= cq->cfg.entries) {
		/* Full: never overwrite a completion the consumer has not read. The CQ is in error from now on. */
		cq->error = true;
		store_release(&hdr->overflow, 1);
		mem_dirty(&cq->ring, 0, sizeof(*hdr));
		d->counters.cq_overflows++;
		vre_post_event(e, dev_index(e, d), VRDMA_EVENT_CQ_ERR, cq->cfg.handle, 0);
		return;
	}
	memcpy(mem_at(&cq->ring, PAGE_SIZE + (uint64_t)(cq->prod & (cq->cfg.entries - 1)) * sizeof(*cqe)), cqe,
	       sizeof(*cqe));
	mem_dirty(&cq->ring, PAGE_SIZE + (uint64_t)(cq->prod & (cq->cfg.entries - 1)) * sizeof(*cqe), sizeof(*cqe));
	cq->prod++;
	store_release(&hdr->prod, cq->prod);
	mem_dirty(&cq->ring, 0, sizeof(*hdr));
	d->counters.cqes++;
	if (cqe->status != VRDMA_WC_SUCCESS)
		d->counters.error_cqes++;
	/*
	 * The CQE's publication before the look at the arm slot. A consumer arms (a store to the slot), then looks at
	 * prod (a load); here the store is prod and the load the arm. A release store and an acquire load do not order
	 * a store before a later load (x86's store buffer passes them), so without a full fence on both sides each
	 * could see the other's old value: no event here, an empty CQ there, and the consumer sleeps for good. The
	 * provider's req_notify_cq and the kernel driver's fence their side.
	 */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	arm = load_acquire(cq->arm);
	cq->arm_seen = arm;
	if (arm == cq->arm_done || !((arm & VRDMA_CQ_ARM_NEXT) ||
				     ((arm & VRDMA_CQ_ARM_SOLICITED) && (solicited || cqe->status != VRDMA_WC_SUCCESS))))
		return;
	if (cq->mod_count <= 1 && !cq->mod_period_us) {
		cq_announce(e, d, cq, arm);
		return;
	}
	/* Moderated: announce after mod_count completions, or mod_period_us after the first (vre_poll's timer). */
	if (++cq->mod_pending == 1 && cq->mod_period_us) {
		cq->mod_deadline = ctx(e)->now + (int64_t)cq->mod_period_us * 1000;
		if (!d->mod_next || cq->mod_deadline < d->mod_next)
			d->mod_next = cq->mod_deadline;
	}
	if (cq->mod_count > 1 && cq->mod_pending >= cq->mod_count)
		cq_announce(e, d, cq, arm);
}

/*
 * Once the device's earliest moderation deadline has passed: the CQs whose period ran out announce what they hold,
 * and the earliest deadline still pending becomes the next one. (A deadline that went away early, because its CQ
 * reached its count, only makes this run once for nothing.)
 */
VRE_FN void cq_timers(struct vre_engine *e, struct vre_device *d)
{
	int64_t next = 0;

	if (!d->mod_next || ctx(e)->now < d->mod_next)
		return;
	for (uint32_t i = 0; i < d->cq_hi; i++) {
		struct vre_cq *cq = d->cqs[i];

		if (!cq || !cq->mod_deadline)
			continue;
		if (ctx(e)->now >= cq->mod_deadline)
			cq_announce(e, d, cq, load_acquire(cq->arm));
		else if (!next || cq->mod_deadline < next)
			next = cq->mod_deadline;
	}
	d->mod_next = next;
}

/*
 * An arm request that the last completion may have missed. The fences of cq_push and of the consumer order an arm
 * and a CQE, but a guest whose CPU is emulated can lose its fence (QEMU's TCG drops a guest's barriers when the
 * guest has one vCPU): its arm store can then reach memory after cq_push looked at the slot, while its poll read
 * prod before the CQE was there, and it sleeps with a completion in its ring. So every VRE_ARM_SWEEP_NS a CQ whose
 * arm request is new since its last completion, and that holds completions its consumer has not taken, gets its
 * event: what a NIC does when a CQ is armed over entries not yet polled. An event too many is harmless (a
 * consumer polls after each); a missing one is a hang.
 */
VRE_FN void cq_sweep_arms(struct vre_engine *e, struct vre_device *d)
{
	if (ctx(e)->now < d->arm_sweep_at)
		return;
	d->arm_sweep_at = ctx(e)->now + VRE_ARM_SWEEP_NS;
	for (uint32_t i = 0; i < d->cq_hi; i++) {
		struct vre_cq *cq = d->cqs[i];
		struct vrdma_cq_ring_hdr *hdr;
		uint32_t arm;

		if (!cq || cq->error || !cq->ring.valid)
			continue;
		arm = load_acquire(cq->arm);
		if (arm == cq->arm_seen || arm == cq->arm_done ||
		    !(arm & (VRDMA_CQ_ARM_NEXT | VRDMA_CQ_ARM_SOLICITED)))
			continue;
		cq->arm_seen = arm;  /* looked at once: the next completion reads it again anyway */
		hdr = (struct vrdma_cq_ring_hdr *)mem_at(&cq->ring, 0);
		if (load_acquire(&hdr->cons) != cq->prod)
			cq_announce(e, d, cq, arm);
	}
}

/* A CQ into its slot of the device's table (made by a command or loaded from a state). */
VRE_FN void cq_install(struct vre_device *d, uint32_t slot, struct vre_cq *cq)
{
	d->cqs[slot] = cq;
	if (slot >= d->cq_hi)
		d->cq_hi = slot + 1;
}

/* What a CQ's configuration must be, made by a command or loaded from a state. */
VRE_FN int cq_config_check(struct vre_engine *e, struct vre_device *d, uint32_t slot, const struct vre_cq_config *c)
{
	if (!cq_slot_free(d, slot))
		return vre_fail(e, EINVAL, "CQ slot %u unusable", slot);
	if (!cq_ring_fits(c->entries, d->lim.max_cqe, c->ring.npages))
		return vre_fail(e, EINVAL, "CQ of %u entries does not fit %u pages", c->entries, c->ring.npages);
	if (!vre_db_slot(d, c->db))
		return vre_fail(e, EINVAL, "CQ doorbell index %u unusable", c->db);
	return 0;
}

int vre_cq_create(struct vre_engine *e, uint32_t dev, uint32_t slot, const struct vre_cq_config *c)
{
	struct vre_device *d = vre_dev(e, dev);
	struct vre_cq *cq;
	int err = cq_config_check(e, d, slot, c);

	if (err)
		return err;
	cq = obj_new(e, d, sizeof(*cq), offsetof(struct vre_cq, ring), &c->ring, "a CQ", &err);
	if (!cq)
		return err;
	cq->cfg = *c;
	cq->arm = vre_db_claim(d, c->db);
	memset(mem_at(&cq->ring, 0), 0, sizeof(struct vrdma_cq_ring_hdr));
	mem_dirty(&cq->ring, 0, sizeof(struct vrdma_cq_ring_hdr));
	cq_install(d, slot, cq);
	return 0;
}

int vre_cq_moderate(struct vre_engine *e, uint32_t dev, uint32_t slot, uint32_t count, uint32_t period_us)
{
	struct vre_device *d = vre_dev(e, dev);
	struct vre_cq *cq = cq_at(d, slot);

	if (!cq)
		return vre_fail(e, EINVAL, "no CQ in slot %u", slot);
	cq->mod_count = count;
	cq->mod_period_us = period_us;
	if (count <= 1 && !period_us && cq->mod_pending)
		cq_announce(e, d, cq, load_acquire(cq->arm));  /* nothing held back any longer */
	return 0;
}

void vre_cq_destroy(struct vre_engine *e, uint32_t dev, uint32_t slot)
{
	struct vre_device *d = vre_dev(e, dev);

	obj_free(d, cq_take(d, slot), offsetof(struct vre_cq, ring));
}
