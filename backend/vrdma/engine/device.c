// SPDX-License-Identifier: GPL-2.0-only
/*
 * The engine and its devices: creation, one device per VM with its tables and limits, its memory table (and what
 * a new one does to objects that keep guest-physical pages), its doorbell slots, counters, errors and events.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vre.h"

VRE_FN int vre_fail(struct vre_engine *e, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(e->error, sizeof(e->error), fmt, ap);
	va_end(ap);
	return -err;
}

VRE_FN int64_t vre_monotonic_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

VRE_FN struct vre_device *vre_dev(struct vre_engine *e, uint32_t dev)
{
	return dev < e->ndevices && e->devices[dev].open ? &e->devices[dev] : NULL;
}

VRE_FN void vre_post_event(struct vre_engine *e, uint32_t dev, uint32_t type, uint32_t handle, uint64_t data)
{
	if (e->ev_tail - e->ev_head >= EVENT_RING) {
		if (dev < e->ndevices)
			e->devices[dev].counters.events_dropped++;
		return;
	}
	e->events[e->ev_tail % EVENT_RING] = (struct vre_event){ .dev = dev, .type = type, .handle = handle,
								 .data = data };
	e->ev_tail++;
}

static volatile uint32_t *db_word(struct vre_device *d, uint32_t page, uint32_t slot)
{
	return (volatile uint32_t *)(d->doorbells + (size_t)page * VRDMA_DOORBELL_PAGE_SIZE) + slot;
}

/*
 * The slot a doorbell index names: never in page 0 (the header), never a page's parked or alive slot, never past
 * the region.
 */
VRE_FN volatile uint32_t *vre_db_slot(struct vre_device *d, uint32_t index)
{
	uint32_t page = VRDMA_DB_PAGE(index), slot = VRDMA_DB_SLOT(index);

	if (page == 0 || page >= d->lim.doorbell_pages || slot == VRDMA_DB_SLOT_PARKED || slot == VRDMA_DB_SLOT_ALIVE)
		return NULL;
	return db_word(d, page, slot);
}

/*
 * A queue takes its slot (already checked by vre_db_slot): zero, and its page joins the pages whose parked slot
 * the engine keeps (set at once if the engine is parked now). Parking then writes the pages that have queues,
 * not the whole region, which is mostly unused.
 */
VRE_FN volatile uint32_t *vre_db_claim(struct vre_engine *e, struct vre_device *d, uint32_t index)
{
	uint32_t page = VRDMA_DB_PAGE(index);
	volatile uint32_t *slot = vre_db_slot(d, index);

	store_release(slot, 0);
	d->db_pages_used[page / 64] |= 1ULL << (page % 64);
	if (e->parked)
		store_release(db_word(d, page, VRDMA_DB_SLOT_PARKED), 1);
	return slot;
}

VRE_FN void vre_set_parked_flags(struct vre_engine *e, uint32_t value)
{
	for (uint32_t i = 0; i < e->ndevices; i++) {
		struct vre_device *d = &e->devices[i];

		for (uint32_t w = 0; d->open && w < DIV_ROUND_UP(d->lim.doorbell_pages, 64); w++) {
			for (uint64_t bits = d->db_pages_used[w]; bits; bits &= bits - 1)
				store_release(db_word(d, w * 64 + (uint32_t)__builtin_ctzll(bits), VRDMA_DB_SLOT_PARKED),
					      value);
		}
	}
}

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
	return e;
}

void vre_engine_free(struct vre_engine *e)
{
	if (!e)
		return;
	for (uint32_t i = 0; i < e->ndevices; i++)
		vre_device_close(e, i);
	free(e->devices);
	free(e->tx);
	free(e->rx);
	free(e);
}

const char *vre_error(struct vre_engine *e)
{
	return e->error;
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
	if (e->parked)
		vre_set_parked_flags(e, 1);
	return 0;
}

int vre_gid_set(struct vre_engine *e, uint32_t dev, uint32_t index, const uint8_t *gid, uint32_t type)
{
	struct vre_device *d = vre_dev(e, dev);

	if (!d || index >= VRE_MAX_GIDS || type > VRDMA_GID_TYPE_ROCE_V2)
		return vre_fail(e, EINVAL, "GID %u of type %u unusable", index, type);
	memcpy(d->gids[index].raw, gid, sizeof(d->gids[index].raw));
	d->gids[index].type = type;
	return 0;
}

void vre_device_close(struct vre_engine *e, uint32_t dev)
{
	struct vre_device *d = vre_dev(e, dev);

	if (!d)
		return;
	for (uint32_t i = 0; i < d->lim.max_qp; i++)
		vre_qp_destroy(e, dev, i);
	for (uint32_t i = 0; i < d->lim.max_srq; i++)
		vre_srq_destroy(e, dev, i);
	for (uint32_t i = 0; i < d->lim.max_cq; i++)
		vre_cq_destroy(e, dev, i);
	for (uint32_t i = 0; i < d->lim.max_mr; i++)
		vre_mr_destroy(e, dev, i);
	free_tables(d);
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
