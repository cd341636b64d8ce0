// SPDX-License-Identifier: GPL-2.0-only
/*
 * The engine and its devices, opened and closed: one device per VM with its tables and limits, its memory table
 * (and what a new one does to objects that keep guest-physical pages), its counters. Closing a device destroys
 * every object it has, so this file sits above every object's room (base.c is what they all share).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "vre.h"

struct vre_engine *vre_engine_new(uint32_t max_devices)
{
	struct vre_engine *e = vre_alloc_lines(1, sizeof(*e));  /* the caller's scratch is cache-line aligned */

	if (!e)
		return NULL;
	e->devices = vre_alloc_lines(max_devices, sizeof(*e->devices));  /* as struct vre_device's lines are laid out */
	if (!e->devices) {
		free(e);
		return NULL;
	}
	e->ndevices = max_devices;
	e->tx_fd = e->udp6_fd = -1;
	e->caller.engine = e;
	e->caller.worker = VRE_NO_WORKER;
	if (vre_locks_init(e)) {
		free(e->devices);
		free(e);
		return NULL;
	}
	/* 64 KiB a turn and a piece: ~2 us of copying at memory speed, what one VM's bulk transfer may keep another's
	 * small message waiting, 16 KiB while small messages are about; a work request costs about what copying 2 KiB
	 * does (docs/backend.md). */
	e->sched = (struct vre_sched){ .quantum_bytes = 64 << 10, .piece_bytes = 64 << 10, .wr_cost_bytes = 2048,
				       .small_piece_bytes = 16 << 10, .solo_bytes = 1 << 20 };
	if (gid_index_init(e)) {
		vre_locks_destroy(e);
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
	vre_locks_destroy(e);  /* the devices' locks are in e->devices */
	free(e->devices);
	free(e->gid_slots);
	rings_free(e->rings, e->nrings);
	free(e->tx);
	free(e);
}

/* Everything of a device from `parked` on back to zero: its lock, owner and open flag are the threads' (vre.h). */
static void device_clear(struct vre_device *d)
{
	size_t from = offsetof(struct vre_device, parked);

	memset((uint8_t *)d + from, 0, sizeof(*d) - from);
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
	device_clear(d);
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
	device_clear(d);
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
	d->wake_fd = -1;
	d->window_hi = UINT64_MAX;
	d->share.weight = VRE_DEFAULT_WEIGHT;
	/* Under every lock (vre_lock): a thread looking for its devices reads these without one. */
	__atomic_store_n(&d->owner, vre_new_owner(e, dev), __ATOMIC_RELEASE);
	__atomic_store_n(&d->suspended, false, __ATOMIC_RELEASE);
	__atomic_store_n(&d->open, true, __ATOMIC_RELEASE);
	if (dev >= e->devices_hi)
		__atomic_store_n(&e->devices_hi, dev + 1, __ATOMIC_RELEASE);
	if (e->caller_parked) {
		vre_set_parked_flags(d, 1);
		d->parked = true;
	}
	vre_kick(e, dev);  /* its thread, if parked, parks the new device too */
	return 0;
}

/* Every object of an open device destroyed, users before what they use (a closing device, a refused state). */
VRE_FN void device_objects_free(struct vre_engine *e, uint32_t dev, struct vre_device *d)
{
	for (uint32_t i = 0; i < d->lim.max_qp; i++)
		vre_qp_destroy(e, dev, i);
	for (uint32_t i = 0; i < d->lim.max_srq; i++)
		vre_srq_destroy(e, dev, i);
	for (uint32_t i = 0; i < d->lim.max_cq; i++)
		vre_cq_destroy(e, dev, i);
	for (uint32_t i = 0; i < d->lim.max_mr; i++)
		vre_mr_destroy(e, dev, i);
}

void vre_device_close(struct vre_engine *e, uint32_t dev)
{
	struct vre_device *d = vre_dev(e, dev);

	if (!d)
		return;
	gid_forget_device(e, d);
	device_objects_free(e, dev, d);
	__atomic_store_n(&d->open, false, __ATOMIC_RELEASE);
	if (d->wake_fd >= 0)
		close(d->wake_fd);
	free_tables(d);
	while (e->devices_hi && !e->devices[e->devices_hi - 1].open)
		__atomic_store_n(&e->devices_hi, e->devices_hi - 1, __ATOMIC_RELEASE);
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

int vre_device_set_log(struct vre_engine *e, uint32_t dev, uint64_t address, uint64_t bytes)
{
	struct vre_device *d = vre_dev(e, dev);

	if (!d)
		return vre_fail(e, ENODEV, "device %u is not open", dev);
	if (!address != !bytes)
		return vre_fail(e, EINVAL, "a dirty log of %llu bytes at %#llx", (unsigned long long)bytes,
				(unsigned long long)address);
	d->log.bits = (uint8_t *)(uintptr_t)address;
	d->log.bytes = bytes;
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

int vre_sched_set(struct vre_engine *e, const struct vre_sched *sched)
{
	if (!sched->quantum_bytes || sched->quantum_bytes > (1u << 30) || sched->piece_bytes < VRDMA_PAGE_SIZE ||
	    sched->piece_bytes > (1u << 30) || sched->wr_cost_bytes > (1u << 20) ||
	    sched->small_piece_bytes < VRDMA_PAGE_SIZE || sched->small_piece_bytes > sched->piece_bytes ||
	    sched->solo_bytes < sched->piece_bytes || sched->solo_bytes > (1u << 30))
		return vre_fail(e, EINVAL, "scheduler sizes out of range (quantum 1..1 GiB, piece 4 KiB..1 GiB, work "
				"request cost at most 1 MiB, small piece 4 KiB..piece, solo piece..1 GiB)");
	e->sched = *sched;
	return 0;
}

/* A bucket of `rate` per second saving up `burst` (0: one second's worth), full from now on. */
static struct vre_bucket bucket_new(uint64_t rate, uint64_t burst, int64_t now)
{
	double r = (double)rate, saved = burst ? (double)burst : r;

	return (struct vre_bucket){ .rate = r, .burst = saved, .tokens = saved, .at = now };
}

int vre_device_wake_fd(struct vre_engine *e, uint32_t dev, int fd)
{
	struct vre_device *d = vre_dev(e, dev);
	int copy = -1;

	if (!d)
		return fd < 0 ? 0 : vre_fail(e, EINVAL, "no device %u", dev);  /* a closed device watches nothing */
	if (fd >= 0) {
		copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
		if (copy < 0)
			return vre_fail(e, errno, "cannot watch the wake-up eventfd %d: %s", fd, strerror(errno));
	}
	if (d->wake_fd >= 0)
		close(d->wake_fd);
	d->wake_fd = copy;
	vre_kick(e, dev);  /* its thread, if parked, watches the new one from its next sleep on */
	return 0;
}

int vre_device_page_window(struct vre_engine *e, uint32_t dev, uint64_t lo, uint64_t hi)
{
	struct vre_device *d = vre_dev(e, dev);

	if (!d)
		return vre_fail(e, ENODEV, "device %u is not open", dev);
	if (lo > hi)
		return vre_fail(e, EINVAL, "page window [%#llx, %#llx] is empty", (unsigned long long)lo,
				(unsigned long long)hi);
	d->window_lo = lo;
	d->window_hi = hi;
	return 0;
}

int vre_device_qos(struct vre_engine *e, uint32_t dev, const struct vre_qos *qos)
{
	struct vre_device *d = vre_dev(e, dev);
	struct vre_share *s;
	int64_t now = engine_clock(e);

	if (!d)
		return vre_fail(e, EINVAL, "no device %u", dev);
	if (qos->weight < 1 || qos->weight > VRE_MAX_WEIGHT)
		return vre_fail(e, EINVAL, "weight %u (1..%u)", qos->weight, VRE_MAX_WEIGHT);
	if (qos->latency > VRE_LATENCY_LOW)
		return vre_fail(e, EINVAL, "latency class %u (%u or %u)", qos->latency, VRE_LATENCY_NORMAL,
				VRE_LATENCY_LOW);
	if (qos->bytes_per_s > VRE_MAX_RATE || qos->bytes_burst > VRE_MAX_RATE || qos->wrs_per_s > VRE_MAX_RATE ||
	    qos->wrs_burst > VRE_MAX_RATE)
		return vre_fail(e, EINVAL, "a rate or burst above %llu", (unsigned long long)VRE_MAX_RATE);
	s = &d->share;
	share_unthrottle(s, now);
	s->weight = qos->weight;
	s->low_latency = qos->latency == VRE_LATENCY_LOW;
	s->bytes = bucket_new(qos->bytes_per_s, qos->bytes_burst, now);
	s->wrs = bucket_new(qos->wrs_per_s, qos->wrs_burst, now);
	return 0;
}

void vre_device_qos_counters(struct vre_engine *e, uint32_t dev, struct vre_qos_counters *out)
{
	struct vre_device *d = vre_dev(e, dev);

	if (d)
		*out = d->share.counters;
	else
		memset(out, 0, sizeof(*out));
}
