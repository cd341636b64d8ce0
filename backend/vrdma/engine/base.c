// SPDX-License-Identifier: GPL-2.0-only
/*
 * What every room of the engine shares: its error message, its clock, the open device a number names, the event
 * ring the model drains, and the doorbell slots queues take. Nothing here knows an RDMA object.
 */
#include <stdarg.h>
#include <stdint.h>
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

/* `n` objects of `size` bytes (a multiple of 64: structs with cache-line aligned members), zeroed, the array
 * cache-line aligned so that each object's lines are its own; NULL without memory or if n * size overflows. */
VRE_FN void *vre_alloc_lines(size_t n, size_t size)
{
	void *p = size && n > SIZE_MAX / size ? NULL : aligned_alloc(64, n * size);

	if (p)
		memset(p, 0, n * size);
	return p;
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

/* Under the lock of device `dev` (whose counter counts a dropped event); any thread may post, so the ring has its own. */
VRE_FN void vre_post_event(struct vre_engine *e, uint32_t dev, uint32_t type, uint32_t handle, uint64_t data)
{
	bool full;

	events_lock(e);
	full = e->ev_tail - e->ev_head >= EVENT_RING;
	if (!full) {
		e->events[e->ev_tail % EVENT_RING] = (struct vre_event){ .dev = dev, .type = type, .handle = handle,
									 .data = data };
		e->ev_tail++;
	}
	events_unlock(e);
	__atomic_store_n(&e->threads.events_posted, 1, __ATOMIC_RELEASE);  /* the next pass of any thread tells */
	if (full && dev < e->ndevices)
		e->devices[dev].counters.events_dropped++;
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
VRE_FN volatile uint32_t *vre_db_claim(struct vre_device *d, uint32_t index)
{
	volatile uint32_t *slot = vre_db_adopt(d, index);

	store_release(slot, 0);
	return slot;
}

/* The same, keeping what the slot holds: a loaded state's queue (the doorbell region came with the state). */
VRE_FN volatile uint32_t *vre_db_adopt(struct vre_device *d, uint32_t index)
{
	uint32_t page = VRDMA_DB_PAGE(index);

	d->db_pages_used[page / 64] |= 1ULL << (page % 64);
	if (d->parked)
		store_release(db_word(d, page, VRDMA_DB_SLOT_PARKED), 1);
	return vre_db_slot(d, index);
}

VRE_FN void vre_set_parked_flags(struct vre_device *d, uint32_t value)
{
	for (uint32_t w = 0; d->open && w < DIV_ROUND_UP(d->lim.doorbell_pages, 64); w++) {
		for (uint64_t bits = d->db_pages_used[w]; bits; bits &= bits - 1)
			store_release(db_word(d, w * 64 + (uint32_t)__builtin_ctzll(bits), VRDMA_DB_SLOT_PARKED), value);
	}
}

const char *vre_error(struct vre_engine *e)
{
	return e->error;
}
