// SPDX-License-Identifier: GPL-2.0-only
/*
 * The engine's GID index: every GID of every open device in one hash table, so that the device holding a
 * destination GID is one probe away, for each arriving packet (net.c), each datagram (ud.c) and each connection the
 * model routes (vre_gid_route), instead of a scan over every device's whole GID table. It is the only routing
 * table: the model keeps no second one.
 *
 * Open addressing with linear probing over twice as many slots as GIDs can exist (at most half full, so probes stay
 * short); a slot names (device, GID index) and the key is that device's GID itself, never a copy. Removal shifts
 * the following entries back (no tombstones). Two devices may hold the same GID (a guest may set any address): the
 * lowest device number wins, as it did before the index existed.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "vre.h"

#define EMPTY UINT32_MAX

static uint32_t gid_hash(const uint8_t *raw)
{
	uint64_t hi, lo, x;

	memcpy(&hi, raw, 8);
	memcpy(&lo, raw + 8, 8);
	x = (hi ^ lo * 0x9e3779b97f4a7c15ull) * 0xff51afd7ed558ccdull;  /* a multiplicative mix of both halves */
	return (uint32_t)(x >> 32);
}

static const uint8_t *slot_key(const struct vre_engine *e, const struct vre_gid_slot *s)
{
	return e->devices[s->dev].gids[s->index].raw;
}

VRE_FN int gid_index_init(struct vre_engine *e)
{
	uint64_t want = (uint64_t)e->ndevices * VRE_MAX_GIDS * 2, size = 16;

	while (size < want)
		size <<= 1;
	if (size > UINT32_MAX)
		return -ENOMEM;
	e->gid_slots = malloc(size * sizeof(*e->gid_slots));
	if (!e->gid_slots)
		return -ENOMEM;
	for (uint64_t i = 0; i < size; i++)
		e->gid_slots[i].dev = EMPTY;
	e->gid_mask = (uint32_t)(size - 1);
	return 0;
}

static void index_add(struct vre_engine *e, uint32_t dev, uint32_t index)
{
	uint32_t i = gid_hash(e->devices[dev].gids[index].raw) & e->gid_mask;

	while (e->gid_slots[i].dev != EMPTY)  /* at most half full: an empty slot is always found */
		i = (i + 1) & e->gid_mask;
	e->gid_slots[i] = (struct vre_gid_slot){ .dev = dev, .index = index };
}

/* Take (dev, index) out, and move back the entries after it that its slot had pushed on (Knuth's algorithm R). */
static void index_remove(struct vre_engine *e, uint32_t dev, uint32_t index)
{
	uint32_t i = gid_hash(e->devices[dev].gids[index].raw) & e->gid_mask, j;

	while (e->gid_slots[i].dev != EMPTY && (e->gid_slots[i].dev != dev || e->gid_slots[i].index != index))
		i = (i + 1) & e->gid_mask;
	if (e->gid_slots[i].dev == EMPTY)
		return;
	e->gid_slots[i].dev = EMPTY;
	for (j = (i + 1) & e->gid_mask; e->gid_slots[j].dev != EMPTY; j = (j + 1) & e->gid_mask) {
		uint32_t home = gid_hash(slot_key(e, &e->gid_slots[j])) & e->gid_mask;

		/* The entry at j stays only if its home lies cyclically in (i, j]; otherwise it moves to the hole. */
		if (i <= j ? (i < home && home <= j) : (i < home || home <= j))
			continue;
		e->gid_slots[i] = e->gid_slots[j];
		e->gid_slots[j].dev = EMPTY;
		i = j;
	}
}

/* Under the GID index's lock: any thread routes, a caller changes the index under every lock. */
VRE_FN struct vre_device *gid_route(struct vre_engine *e, const uint8_t *gid)
{
	uint32_t best = EMPTY;

	gid_lock(e);
	for (uint32_t i = gid_hash(gid) & e->gid_mask; e->gid_slots[i].dev != EMPTY; i = (i + 1) & e->gid_mask) {
		const struct vre_gid_slot *s = &e->gid_slots[i];

		if (s->dev < best && !memcmp(slot_key(e, s), gid, 16))
			best = s->dev;
	}
	gid_unlock(e);
	return best == EMPTY ? NULL : &e->devices[best];
}

uint32_t vre_gid_route(struct vre_engine *e, const uint8_t *gid)
{
	struct vre_device *d = gid_route(e, gid);

	return d ? dev_index(e, d) : VRE_NO_DEVICE;
}

int vre_gid_set(struct vre_engine *e, uint32_t dev, uint32_t index, const uint8_t *gid, uint32_t type)
{
	struct vre_device *d = vre_dev(e, dev);

	if (!d || index >= VRE_MAX_GIDS || type > VRDMA_GID_TYPE_ROCE_V2)
		return vre_fail(e, EINVAL, "GID %u of type %u unusable", index, type);
	if (d->gids[index].type)
		index_remove(e, dev, index);
	memcpy(d->gids[index].raw, gid, sizeof(d->gids[index].raw));
	d->gids[index].type = type;
	if (type)
		index_add(e, dev, index);
	return 0;
}

VRE_FN void gid_forget_device(struct vre_engine *e, struct vre_device *d)
{
	for (uint32_t k = 0; k < VRE_MAX_GIDS; k++) {
		if (d->gids[k].type)
			index_remove(e, dev_index(e, d), k);
		d->gids[k].type = 0;
	}
}
