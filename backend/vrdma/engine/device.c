// SPDX-License-Identifier: GPL-2.0-only
/*
 * The engine and its devices, opened and closed: one device per VM with its tables and limits, its memory table
 * (and what a new one does to objects that keep guest-physical pages), its counters. Closing a device destroys
 * every object it has, so this file sits above every object's room (base.c is what they all share).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "vre.h"

struct vre_engine *vre_engine_new(uint32_t max_devices)
{
	struct vre_engine *e = aligned_alloc(64, sizeof(*e));  /* the scratch is cache-line aligned */

	if (!e)
		return NULL;
	memset(e, 0, sizeof(*e));
	e->devices = calloc(max_devices, sizeof(*e->devices));
	if (!e->devices) {
		free(e);
		return NULL;
	}
	e->ndevices = max_devices;
	e->rx_fd = e->tx_fd = e->udp6_fd = -1;
	if (gid_index_init(e)) {
		free(e->devices);
		free(e);
		return NULL;
	}
	return e;
}

void vre_engine_free(struct vre_engine *e)
{
	if (!e)
		return;
	for (uint32_t i = 0; i < e->ndevices; i++)
		vre_device_close(e, i);
	free(e->devices);
	free(e->gid_slots);
	free(e->tx);
	free(e->rx);
	free(e);
}

/* A device's tables, and the device back to closed. */
static void free_tables(struct vre_device *d)
{
	free(d->mrs);
	free(d->cqs);
	free(d->srqs);
	free(d->qps);
	free(d->active);
	free(d->db_pages_used);
	memset(d, 0, sizeof(*d));
}

int vre_device_open(struct vre_engine *e, uint32_t dev, const struct vre_device_limits *limits,
		    uint64_t doorbell_base)
{
	struct vre_device *d;

	if (dev >= e->ndevices)
		return vre_fail(e, EINVAL, "device %u out of range", dev);
	d = &e->devices[dev];
	if (d->open)
		return vre_fail(e, EBUSY, "device %u is open", dev);
	if (!is_pow2(limits->max_qp) || !is_pow2(limits->max_cq) || !is_pow2(limits->max_mr) ||
	    !is_pow2(limits->max_srq) || limits->max_sge > MAX_WQE_SGES ||
	    limits->max_inline > VRDMA_PAGE_SIZE - sizeof(struct vrdma_send_wqe) || !limits->max_pages_total ||
	    !doorbell_base)
		return vre_fail(e, EINVAL, "unusable device limits");
	memset(d, 0, sizeof(*d));
	d->lim = *limits;
	d->doorbells = (uint8_t *)(uintptr_t)doorbell_base;
	d->mrs = calloc(limits->max_mr, sizeof(*d->mrs));
	d->cqs = calloc(limits->max_cq, sizeof(*d->cqs));
	d->srqs = calloc(limits->max_srq, sizeof(*d->srqs));
	d->qps = calloc(limits->max_qp, sizeof(*d->qps));
	d->active = calloc(limits->max_qp, sizeof(*d->active));
	d->db_pages_used = calloc(DIV_ROUND_UP(limits->doorbell_pages, 64), sizeof(*d->db_pages_used));
	if (!d->mrs || !d->cqs || !d->srqs || !d->qps || !d->active || !d->db_pages_used) {
		free_tables(d);
		return vre_fail(e, ENOMEM, "no memory for device %u", dev);
	}
	d->gsi = -1;
	d->open = true;
	if (dev >= e->devices_hi)
		e->devices_hi = dev + 1;
	if (e->parked)
		vre_set_parked_flags(e, 1);
	return 0;
}

void vre_device_close(struct vre_engine *e, uint32_t dev)
{
	struct vre_device *d = vre_dev(e, dev);

	if (!d)
		return;
	gid_forget_device(e, d);
	for (uint32_t i = 0; i < d->lim.max_qp; i++)
		vre_qp_destroy(e, dev, i);
	for (uint32_t i = 0; i < d->lim.max_srq; i++)
		vre_srq_destroy(e, dev, i);
	for (uint32_t i = 0; i < d->lim.max_cq; i++)
		vre_cq_destroy(e, dev, i);
	for (uint32_t i = 0; i < d->lim.max_mr; i++)
		vre_mr_destroy(e, dev, i);
	free_tables(d);
	while (e->devices_hi && !e->devices[e->devices_hi - 1].open)
		e->devices_hi--;
}

/* Objects keep their guest-physical pages: translate them again; what no longer maps is unusable. */
static void retranslate_all(struct vre_device *d)
{
#define RETRANSLATE(kind, mem)                                   \
	for (uint32_t i = 0; i < d->lim.max_##kind; i++)          \
		if (d->kind##s[i])                                \
			mem_retranslate(d, &d->kind##s[i]->mem)
	RETRANSLATE(mr, mem);
	RETRANSLATE(cq, ring);
	RETRANSLATE(srq, ring);
	RETRANSLATE(qp, ring);
#undef RETRANSLATE
}

int vre_device_set_memory(struct vre_engine *e, uint32_t dev, const struct vre_region *regions, uint32_t count)
{
	struct vre_device *d = vre_dev(e, dev);

	if (!d)
		return vre_fail(e, ENODEV, "device %u is not open", dev);
	if (count > MAX_REGIONS)
		return vre_fail(e, EINVAL, "%u memory regions (at most %u)", count, MAX_REGIONS);
	for (uint32_t i = 0; i < count; i++) {
		/*
		 * Guest pages must be pages here too: ring headers, CQEs and atomic targets are accessed as aligned
		 * words, and an 8-byte atomic must not run past its page. A frontend chooses the mmap offset of a
		 * region, so a region that starts inside a host page is the frontend's error: the device keeps no
		 * memory at all (every object becomes unusable) rather than a table it cannot use.
		 */
		if ((regions[i].gpa | regions[i].hva) & (PAGE_SIZE - 1)) {
			d->nregions = 0;
			retranslate_all(d);
			return vre_fail(e, EINVAL, "memory region %u (guest %#llx at %#llx) is not page-aligned", i,
					(unsigned long long)regions[i].gpa, (unsigned long long)regions[i].hva);
		}
	}
	memcpy(d->regions, regions, count * sizeof(*regions));
	d->nregions = count;
	retranslate_all(d);
	return 0;
}

void vre_device_counters(struct vre_engine *e, uint32_t dev, struct vre_counters *out)
{
	struct vre_device *d = vre_dev(e, dev);

	if (d)
		*out = d->counters;
	else
		memset(out, 0, sizeof(*out));
}
