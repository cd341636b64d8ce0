// SPDX-License-Identifier: GPL-2.0-only
/*
 * libFuzzer harness for the data engine (the .c files of backend/vrdma/engine, linked in as they are, built with
 * AddressSanitizer and UndefinedBehaviorSanitizer by fuzz/build.py).
 *
 * Each input builds two fake VMs and plays their model and their guests at once:
 *
 * - guest memory: an arena of ARENA_PAGES pages per VM (between PROT_NONE guard pages, mapped once), of which
 *   the input's memory table maps some slices at some guest-physical addresses (possibly misaligned, possibly
 *   not whole pages, possibly aliasing). Every byte of the arena that no region of the current table covers is
 *   poisoned for ASan, so the engine reading or writing anything but the guest's current memory (a stale
 *   translation after a memory table change, a copy past a page, a ring index out of its ring) is a report;
 * - doorbells: a heap buffer of doorbell_pages pages (ASan's redzones around it);
 * - the model: limits, memory tables, MR/CQ/SRQ/QP configurations with page lists written into guest memory,
 *   QP state changes, closes and reopens. Configurations are arbitrary (the engine checks what it relies on in
 *   guest memory: engine.h); what the harness keeps to is the model's contract for object lifetimes, which the
 *   engine is entitled to trust: a CQ or SRQ a QP uses is not destroyed before the QP (the model answers BUSY);
 * - the guest: WQEs written into the rings (mostly well formed, naming real keys, so that transfers happen),
 *   producer indices and arm requests stored into doorbells, raw bytes written anywhere in guest memory,
 *   completions consumed.
 *
 * Input format: a stream of bytes read by the u8/u16/u32/u64 helpers (little endian; an exhausted input reads
 * zeros). First, per VM: its limits and its memory table (read_limits, read_memory). Then operations, one byte
 * each (op = byte % OP_COUNT, VM = (byte / OP_COUNT) & 1) followed by that operation's operands, until the input
 * ends or MAX_OPS ran. fuzz/engine/seeds.py writes well-formed scenarios in this format (the seed corpus).
 *
 * Beyond the sanitizers the harness asserts what the engine promises its caller: return codes are 0 or a negative
 * errno, its error message is a terminated string, events name a device that exists, a QP is in the state it was
 * last given (or in error), and a memory table it refuses leaves it with no memory at all (so the whole arena is
 * poisoned from then on: an engine that kept using the old table would be caught).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <sanitizer/asan_interface.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "engine.h"
#include "vrdma-abi.h"

#define NDEV 2
#define PAGE VRDMA_PAGE_SIZE
#define ARENA_PAGES 64
#define MAX_REGIONS 4
#define MAX_SLOTS 16              /* the largest object table the harness gives a device */
#define MAX_RING_PAGES 32         /* pages of an object's buffer the harness remembers (to write WQEs into) */
#define MAX_OPS 256
#define EVENT_BATCH 512
#define DEFAULT_MAX_MSG (1ULL << 31)

/* Abort with a message libFuzzer shows (and records the input as a crash). */
#define CHECK(cond)                                                                                           \
	do {                                                                                                  \
		if (!(cond)) {                                                                                \
			fprintf(stderr, "engine_fuzz: check failed at line %d: %s\n", __LINE__, #cond);      \
			abort();                                                                              \
		}                                                                                             \
	} while (0)

/* -- input ----------------------------------------------------------------------------------------------- */

struct in {
	const uint8_t *p;
	size_t left;
};

static uint8_t u8(struct in *in)
{
	if (!in->left)
		return 0;
	in->left--;
	return *in->p++;
}

static uint16_t u16(struct in *in)
{
	uint16_t lo = u8(in);

	return (uint16_t)(lo | (uint16_t)u8(in) << 8);
}

static uint32_t u32(struct in *in)
{
	uint32_t lo = u16(in);

	return lo | (uint32_t)u16(in) << 16;
}

static uint64_t u64(struct in *in)
{
	uint64_t lo = u32(in);

	return lo | (uint64_t)u32(in) << 32;
}

/* -- the fake VMs ---------------------------------------------------------------------------------------- */

/* The pages of an object's buffer, as its page list named them when it was created. */
struct ring_rec {
	uint32_t npages;
	uint64_t gpa[MAX_RING_PAGES];
};

struct mr_rec {
	bool live;
	uint32_t lkey, rkey;
	uint64_t iova, length;
};

struct cq_rec {
	bool live;
	uint32_t refs;
	uint32_t entries, db_page, db_slot, arm_seq;
	struct ring_rec ring;
};

struct srq_rec {
	bool live;
	uint32_t refs;
	uint32_t depth, stride, db_page, db_slot, prod;
	struct ring_rec ring;
};

struct qp_rec {
	bool live;
	struct vre_qp_config cfg;
	uint32_t sq_prod, rq_prod;
	struct ring_rec ring;
};

struct vm {
	uint8_t *arena;           /* ARENA_PAGES pages, mapped once with a guard page on each side */
	struct vre_region regions[MAX_REGIONS];
	uint32_t nregions;
	uint8_t *doorbells;
	struct vre_device_limits lim;
	bool open;
	struct mr_rec mrs[MAX_SLOTS];
	struct cq_rec cqs[MAX_SLOTS];
	struct srq_rec srqs[MAX_SLOTS];
	struct qp_rec qps[MAX_SLOTS];
};

static struct vm vms[NDEV];
static struct vre_event events[EVENT_BATCH];
static bool verbose;              /* ENGINE_FUZZ_VERBOSE=1: print each input's engine counters (to check seeds) */

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	verbose = getenv("ENGINE_FUZZ_VERBOSE") != NULL;
	for (int i = 0; i < NDEV; i++) {
		uint8_t *map = mmap(NULL, (ARENA_PAGES + 2) * PAGE, PROT_READ | PROT_WRITE,
				    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		CHECK(map != MAP_FAILED);
		CHECK(mprotect(map, PAGE, PROT_NONE) == 0);
		CHECK(mprotect(map + (ARENA_PAGES + 1) * PAGE, PAGE, PROT_NONE) == 0);
		vms[i].arena = map + PAGE;
	}
	return 0;
}

/* Host address of [gpa, gpa + len) as the harness (the guest) sees its memory, or NULL if not all mapped. */
static uint8_t *host(struct vm *vm, uint64_t gpa, uint64_t len)
{
	for (uint32_t i = 0; i < vm->nregions; i++) {
		const struct vre_region *r = &vm->regions[i];

		if (gpa >= r->gpa && gpa - r->gpa <= r->size && len <= r->size - (gpa - r->gpa))
			return (uint8_t *)(uintptr_t)r->hva + (gpa - r->gpa);
	}
	return NULL;
}

static void guest_write(struct vm *vm, uint64_t gpa, const void *data, uint64_t len)
{
	uint8_t *to = host(vm, gpa, len);

	if (to)
		memcpy(to, data, len);
}

/* The k-th whole page of guest memory (over every region, in order): how inputs name a valid page. */
static uint64_t pick_page(struct vm *vm, uint32_t k)
{
	uint64_t total = 0;

	for (uint32_t i = 0; i < vm->nregions; i++)
		total += vm->regions[i].size / PAGE;
	if (!total)
		return (uint64_t)k * PAGE;
	k %= total;
	for (uint32_t i = 0; i < vm->nregions; i++) {
		uint64_t n = vm->regions[i].size / PAGE;

		if (k < n)
			return vm->regions[i].gpa + (uint64_t)k * PAGE;
		k -= (uint32_t)n;
	}
	return 0;
}

/* Poison every byte of the arena the current memory table does not map. */
static void poison_unmapped(struct vm *vm)
{
	ASAN_POISON_MEMORY_REGION(vm->arena, ARENA_PAGES * PAGE);
	for (uint32_t i = 0; i < vm->nregions; i++)
		ASAN_UNPOISON_MEMORY_REGION((void *)(uintptr_t)vm->regions[i].hva, vm->regions[i].size);
}

/*
 * A memory table: up to MAX_REGIONS slices of the arena at guest-physical addresses. Mostly page-aligned whole
 * pages; on request a slice starts a few bytes into its page (a frontend's mmap_offset is not necessarily
 * page-aligned), ends short of a page, or sits at a raw guest-physical address.
 */
static void read_memory(struct in *in, struct vre_engine *e, uint32_t dev)
{
	struct vm *vm = &vms[dev];
	uint8_t head = u8(in);
	uint32_t count = head % (MAX_REGIONS + 1);
	struct vre_region table[MAX_REGIONS];
	int ret;

	for (uint32_t i = 0; i < count; i++) {
		uint8_t flags = u8(in);
		uint64_t gpa = (uint64_t)u16(in) * PAGE;
		uint32_t first = u8(in) % ARENA_PAGES, npages = 1 + u8(in) % ARENA_PAGES;
		uint32_t misalign = flags & 1 ? 1 + u8(in) % (PAGE - 1) : 0;
		uint64_t size;

		if (flags & 2)
			gpa = u64(in);
		if (first + npages + (misalign ? 1 : 0) > ARENA_PAGES)
			npages = ARENA_PAGES - first - (misalign ? 1 : 0);
		if (!npages) {
			npages = 1;
			misalign = 0;
		}
		size = (uint64_t)npages * PAGE;
		if (flags & 4)
			size -= u16(in) % size;   /* a region that ends inside a page */
		table[i] = (struct vre_region){
			.gpa = gpa, .size = size,
			.hva = (uint64_t)(uintptr_t)(vm->arena + (size_t)first * PAGE + misalign),
		};
	}
	ret = vre_device_set_memory(e, dev, table, head & 0x80 ? 65 : count);
	CHECK(ret <= 0);
	if (head & 0x80 && vm->open) {
		/* More regions than the engine keeps: refused before it looks at them, the old table stays. */
		CHECK(ret < 0);
		return;
	}
	if (ret < 0 && vm->open) {
		/* A table the engine cannot use (a region not page-aligned): it promises to keep no memory at all,
		 * so from now on every byte of the arena is out of bounds for it. */
		count = 0;
	}
	memcpy(vm->regions, table, sizeof(table[0]) * count);
	vm->nregions = count;
	poison_unmapped(vm);
}

static uint32_t pow2_limit(uint8_t v)
{
	return 1u << (v % 5);     /* 1 .. MAX_SLOTS */
}

static void read_limits(struct in *in, struct vm *vm)
{
	uint8_t sel = u8(in);
	struct vre_device_limits *l = &vm->lim;

	*l = (struct vre_device_limits){ .max_qp = 8, .max_cq = 8, .max_mr = 8, .max_srq = 4, .max_sge = 16,
					 .max_inline = 256, .max_qp_wr = 4096, .max_cqe = 4096, .max_srq_wr = 4096,
					 .max_mr_pages = 4096, .doorbell_pages = 4, .max_pages_total = 1u << 16,
					 .max_msg_size = DEFAULT_MAX_MSG };
	if (!(sel & 1))
		return;
	l->max_qp = pow2_limit(u8(in));
	l->max_cq = pow2_limit(u8(in));
	l->max_mr = pow2_limit(u8(in));
	l->max_srq = pow2_limit(u8(in));
	l->max_sge = u16(in) % 300;           /* the engine takes up to a page of SGEs */
	l->max_inline = u16(in) % (PAGE + 8);
	l->max_qp_wr = 1u << (u8(in) % 16);
	l->max_cqe = 1u << (u8(in) % 16);
	l->max_srq_wr = 1u << (u8(in) % 16);
	l->max_mr_pages = sel & 2 ? VRDMA_PBL_ENTRIES * VRDMA_PBL_ENTRIES : 1 + u16(in);
	l->doorbell_pages = u8(in) % 9;
	l->max_msg_size = sel & 4 ? u64(in) : DEFAULT_MAX_MSG;
	/* A small translation budget makes registrations run out of it (0: the device does not open). */
	l->max_pages_total = sel & 16 ? u16(in) : 1u << 22;
	if (sel & 8)
		l->max_qp = 3;                /* not a power of two: the device does not open */
}

static void open_device(struct vre_engine *e, uint32_t dev)
{
	struct vm *vm = &vms[dev];
	uint32_t pages = vm->lim.doorbell_pages ? vm->lim.doorbell_pages : 1;
	int ret;

	vm->doorbells = aligned_alloc(PAGE, (size_t)pages * PAGE);
	CHECK(vm->doorbells);
	memset(vm->doorbells, 0, (size_t)pages * PAGE);
	ret = vre_device_open(e, dev, &vm->lim, (uint64_t)(uintptr_t)vm->doorbells);
	CHECK(ret <= 0);
	vm->open = ret == 0;
}

static void forget_objects(struct vm *vm)
{
	memset(vm->mrs, 0, sizeof(vm->mrs));
	memset(vm->cqs, 0, sizeof(vm->cqs));
	memset(vm->srqs, 0, sizeof(vm->srqs));
	memset(vm->qps, 0, sizeof(vm->qps));
}

/* -- page lists -------------------------------------------------------------------------------------------- */

/*
 * Page-list entries, read and written with memcpy: a region may start at any byte (see read_memory), so guest
 * memory is not necessarily aligned for the harness either.
 */
static uint8_t *list_page(struct vm *vm, uint64_t gpa)
{
	return host(vm, gpa, PAGE);
}

static uint64_t get_entry(const uint8_t *list, uint32_t index)
{
	uint64_t v;

	memcpy(&v, list + (size_t)index * 8, 8);
	return v;
}

static void set_entry(uint8_t *list, uint32_t index, uint64_t v)
{
	memcpy(list + (size_t)index * 8, &v, 8);
}

/*
 * Write a page list for a buffer of `want` pages into guest memory (or, on request, a wrong one: another page
 * count, another number of levels, an address anywhere, a corrupted entry). `rec` gets the pages the list names.
 */
static void read_pages(struct in *in, struct vm *vm, uint64_t want, struct vre_pages_desc *desc,
		       struct ring_rec *rec)
{
	uint8_t mode = u8(in);
	uint32_t first = u8(in), step = mode & 4 ? u8(in) : 1;
	uint64_t n = want;
	uint64_t list_gpa = pick_page(vm, u8(in));
	uint8_t *list;

	if (mode & 1)
		n = u16(in) % 1100;
	if (mode & 0x80)
		n = u32(in);
	if (mode & 8)
		list_gpa = u64(in);
	desc->npages = (uint32_t)(n > UINT32_MAX ? UINT32_MAX : n);
	desc->levels = desc->npages <= VRDMA_PBL_ENTRIES ? 1 : 2;
	if (mode & 2)
		desc->levels = u8(in) % 4;
	desc->addr = list_gpa;
	n = desc->npages;
	if (n > (uint64_t)VRDMA_PBL_ENTRIES * VRDMA_PBL_ENTRIES)
		n = (uint64_t)VRDMA_PBL_ENTRIES * VRDMA_PBL_ENTRIES;

	list = list_page(vm, list_gpa);
	if (desc->levels == 2) {
		uint32_t lists = (uint32_t)((n + VRDMA_PBL_ENTRIES - 1) / VRDMA_PBL_ENTRIES);
		uint32_t list_first = u8(in);

		/* At most 8 distinct list pages; the directory names them round robin (the engine cannot tell). */
		for (uint32_t j = 0; list && j < lists; j++)
			set_entry(list, j, pick_page(vm, list_first + j % 8));
		for (uint32_t j = 0; list && j < lists && j < 8; j++) {
			uint8_t *sub = list_page(vm, get_entry(list, j));

			for (uint32_t i = 0; sub && i < VRDMA_PBL_ENTRIES; i++)
				set_entry(sub, i, pick_page(vm, first + (j * VRDMA_PBL_ENTRIES + i) * step));
		}
	} else {
		for (uint32_t i = 0; list && i < n && i < VRDMA_PBL_ENTRIES; i++)
			set_entry(list, i, pick_page(vm, first + i * step));
	}
	if (mode & 0x10) {
		/* One entry of the first list page (or of the directory) becomes anything at all. */
		uint32_t index = u16(in) % VRDMA_PBL_ENTRIES;
		uint64_t value = u64(in);

		if (list)
			set_entry(list, index, value);
	}

	/* What the engine will read: the pages of the buffer in order (the first MAX_RING_PAGES of them). */
	memset(rec, 0, sizeof(*rec));
	rec->npages = (uint32_t)(n < MAX_RING_PAGES ? n : MAX_RING_PAGES);
	for (uint32_t i = 0; list && i < rec->npages; i++) {
		const uint8_t *sub = desc->levels == 2 ? list_page(vm, get_entry(list, 0)) : list;

		rec->gpa[i] = sub ? get_entry(sub, i) : 0;
	}
}

/* Write `len` bytes at byte `off` of an object's buffer, page by page, where the guest can. */
static void ring_write(struct vm *vm, const struct ring_rec *rec, uint64_t off, const void *data, uint64_t len)
{
	const uint8_t *from = data;

	while (len) {
		uint64_t page = off / PAGE, in_page = off % PAGE, chunk = PAGE - in_page;

		if (chunk > len)
			chunk = len;
		if (page < rec->npages)
			guest_write(vm, rec->gpa[page] + in_page, from, chunk);
		off += chunk;
		from += chunk;
		len -= chunk;
	}
}

/* A 32-bit word of an object's buffer (unaligned if the region is), or NULL where the guest has no memory. */
static uint8_t *ring_word(struct vm *vm, const struct ring_rec *rec, uint64_t off)
{
	uint64_t page = off / PAGE;

	return page < rec->npages ? host(vm, rec->gpa[page] + off % PAGE, 4) : NULL;
}

static volatile uint32_t *doorbell(struct vm *vm, uint32_t page, uint32_t slot)
{
	if (page >= vm->lim.doorbell_pages || slot >= VRDMA_DOORBELL_PAGE_SIZE / 4)
		return NULL;
	return (volatile uint32_t *)(vm->doorbells + (size_t)page * VRDMA_DOORBELL_PAGE_SIZE) + slot;
}

static void ring_doorbell(struct vm *vm, uint32_t page, uint32_t slot, uint32_t value)
{
	volatile uint32_t *db = doorbell(vm, page, slot);

	if (db)
		__atomic_store_n(db, value, __ATOMIC_RELEASE);
}

static uint64_t pages_for(uint64_t bytes)
{
	return (bytes + PAGE - 1) / PAGE;
}

/* A key (or QP number) naming `slot` of a table of `table` entries in its low bits, as the model makes them. */
static uint32_t key_for(struct in *in, uint32_t slot, uint32_t table, bool raw)
{
	return raw ? u32(in) : ((uint32_t)u16(in) * table) | (slot & (table - 1));
}

/* -- objects ------------------------------------------------------------------------------------------------ */

static void op_mr_create(struct in *in, struct vre_engine *e, uint32_t dev)
{
	struct vm *vm = &vms[dev];
	uint32_t slot = u8(in) % (vm->lim.max_mr + 1);
	uint8_t flags = u8(in);
	struct vre_mr_config c = { 0 };
	struct ring_rec rec;
	int ret;

	c.handle = u16(in);
	c.pd = u8(in) % 4;
	c.lkey = key_for(in, slot, vm->lim.max_mr, flags & 1);
	c.rkey = key_for(in, slot, vm->lim.max_mr, flags & 2);
	c.access = flags & 4 ? u32(in) : u8(in) & 0xf;
	c.page_offset = flags & 8 ? u16(in) : (u8(in) % 8) * 8;
	if (flags & 16) {
		c.length = u64(in);
	} else {
		c.length = 1 + (uint64_t)u16(in);
		c.length *= 1 + u8(in) % 8;
	}
	c.iova = flags & 32 ? u64(in) : (uint64_t)u16(in) << 12;
	read_pages(in, vm, c.page_offset < PAGE ? pages_for(c.page_offset + (c.length & 0xffffffffffULL)) : 1,
		   &c.pages, &rec);
	ret = vre_mr_create(e, dev, slot, &c);
	CHECK(ret <= 0);
	if (ret == 0) {
		CHECK(slot < MAX_SLOTS && !vm->mrs[slot].live);
		vm->mrs[slot] = (struct mr_rec){ .live = true, .lkey = c.lkey, .rkey = c.rkey, .iova = c.iova,
						 .length = c.length };
	}
}

static void op_mr_destroy(struct in *in, struct vre_engine *e, uint32_t dev)
{
	uint32_t slot = u8(in) % (MAX_SLOTS + 1);

	vre_mr_destroy(e, dev, slot);
	if (slot < MAX_SLOTS)
		vms[dev].mrs[slot].live = false;
}

/* CQ moderation: completions per event and a period in microseconds (short, so that timers fire). */
static void moderate(struct in *in, struct vre_engine *e, uint32_t dev, uint32_t slot)
{
	uint32_t count = u8(in) % 4, period = u8(in) % 3;

	CHECK(vre_cq_moderate(e, dev, slot, count, period) <= 0);
}

static void op_cq_create(struct in *in, struct vre_engine *e, uint32_t dev)
{
	struct vm *vm = &vms[dev];
	uint32_t slot = u8(in) % (vm->lim.max_cq + 1);
	uint8_t flags = u8(in);
	struct vre_cq_config c = { .handle = u16(in) };
	struct ring_rec rec;
	int ret;

	c.entries = flags & 1 ? u32(in) : 1u << (u8(in) % 13);
	c.db_page = flags & 2 ? u32(in) : 1 + u8(in) % (vm->lim.doorbell_pages ? vm->lim.doorbell_pages : 1);
	c.db_slot = flags & 4 ? u32(in) : u16(in) % 1024;
	read_pages(in, vm, pages_for(PAGE + (uint64_t)c.entries * sizeof(struct vrdma_cqe)), &c.ring, &rec);
	ret = vre_cq_create(e, dev, slot, &c);
	CHECK(ret <= 0);
	if (ret == 0) {
		CHECK(slot < MAX_SLOTS && !vm->cqs[slot].live);
		vm->cqs[slot] = (struct cq_rec){ .live = true, .entries = c.entries, .db_page = c.db_page,
						 .db_slot = c.db_slot, .ring = rec };
	}
	if (flags & 8)
		moderate(in, e, dev, slot);
}

static void op_cq_destroy(struct in *in, struct vre_engine *e, uint32_t dev)
{
	uint32_t slot = u8(in) % (MAX_SLOTS + 1);
	struct cq_rec *cq = slot < MAX_SLOTS ? &vms[dev].cqs[slot] : NULL;

	if (cq && cq->refs)
		return;   /* the model answers BUSY: a QP uses this CQ */
	vre_cq_destroy(e, dev, slot);
	if (cq)
		cq->live = false;
}

static void op_srq_create(struct in *in, struct vre_engine *e, uint32_t dev)
{
	struct vm *vm = &vms[dev];
	uint32_t slot = u8(in) % (vm->lim.max_srq + 1);
	uint8_t flags = u8(in);
	struct vre_srq_config c = { 0 };
	struct ring_rec rec;
	int ret;

	c.handle = u16(in);
	c.pd = u8(in) % 4;
	c.depth = flags & 1 ? u32(in) : 1u << (u8(in) % 13);
	c.stride = flags & 2 ? u32(in) : 1u << (5 + u8(in) % 8);
	c.max_sge = u8(in) % (vm->lim.max_sge + 2);
	c.limit = u8(in) % (c.depth ? c.depth : 1);
	c.db_page = flags & 4 ? u32(in) : 1 + u8(in) % (vm->lim.doorbell_pages ? vm->lim.doorbell_pages : 1);
	c.db_slot = flags & 8 ? u32(in) : u16(in) % 1024;
	read_pages(in, vm, pages_for(PAGE + (uint64_t)c.depth * c.stride), &c.ring, &rec);
	ret = vre_srq_create(e, dev, slot, &c);
	CHECK(ret <= 0);
	if (ret == 0) {
		CHECK(slot < MAX_SLOTS && !vm->srqs[slot].live);
		vm->srqs[slot] = (struct srq_rec){ .live = true, .depth = c.depth, .stride = c.stride,
						   .db_page = c.db_page, .db_slot = c.db_slot, .ring = rec };
	}
}

static void op_srq_destroy(struct in *in, struct vre_engine *e, uint32_t dev)
{
	uint32_t slot = u8(in) % (MAX_SLOTS + 1);
	struct srq_rec *srq = slot < MAX_SLOTS ? &vms[dev].srqs[slot] : NULL;

	if (srq && srq->refs)
		return;   /* BUSY in the model */
	vre_srq_destroy(e, dev, slot);
	if (srq)
		srq->live = false;
}

/* Smallest power of two >= v and >= minimum (at most a page). */
static uint32_t stride_for(uint64_t v, uint32_t minimum)
{
	uint32_t s = minimum;

	while (s < v && s < PAGE)
		s <<= 1;
	return s;
}

static void op_qp_create(struct in *in, struct vre_engine *e, uint32_t dev)
{
	struct vm *vm = &vms[dev];
	uint32_t slot = u8(in) % (vm->lim.max_qp + 1);
	uint16_t flags = u16(in);
	struct vre_qp_config c = { 0 };
	struct ring_rec rec;
	uint64_t end;
	int ret;

	c.handle = u16(in);
	c.pd = u8(in) % 4;
	c.sq_sig_all = u8(in) & 1;
	c.qpn = flags & 1 ? u32(in) : ((uint32_t)u16(in) * vm->lim.max_qp) | (slot & (vm->lim.max_qp - 1));
	c.send_cq = u8(in) % (vm->lim.max_cq + 1);
	c.recv_cq = u8(in) % (vm->lim.max_cq + 1);
	c.srq = flags & 2 ? (int32_t)(u8(in) % (vm->lim.max_srq + 1)) : VRE_NO_SRQ;
	if (flags & 0x400)
		c.srq = (int32_t)u32(in);
	c.max_send_sge = u8(in) % (vm->lim.max_sge + 2);
	c.max_recv_sge = c.srq == VRE_NO_SRQ ? u8(in) % (vm->lim.max_sge + 2) : 0;
	c.max_inline = flags & 4 ? u16(in) : u16(in) % (vm->lim.max_inline + 1);
	c.sq_depth = flags & 8 ? u32(in) : 1u << (u8(in) % 13);
	c.rq_depth = c.srq != VRE_NO_SRQ ? 0 : flags & 8 ? u32(in) : 1u << (u8(in) % 13);
	c.sq_stride = flags & 16 ? u32(in) :
		      stride_for(sizeof(struct vrdma_send_wqe) +
				 (c.max_send_sge * 16 > c.max_inline ? c.max_send_sge * 16 : c.max_inline), 64);
	c.rq_stride = c.srq != VRE_NO_SRQ ? 0 : flags & 16 ? u32(in) :
		      stride_for(sizeof(struct vrdma_recv_wqe) + c.max_recv_sge * 16, 32);
	c.sq_offset = flags & 32 ? u32(in) : PAGE;
	c.rq_offset = c.srq != VRE_NO_SRQ ? 0 : flags & 64 ? u32(in) :
		      (uint32_t)(c.sq_offset + pages_for((uint64_t)c.sq_depth * c.sq_stride) * PAGE);
	c.db_page = flags & 128 ? u32(in) : 1 + u8(in) % (vm->lim.doorbell_pages ? vm->lim.doorbell_pages : 1);
	c.sq_db_slot = flags & 256 ? u32(in) : u16(in) % 1024;
	c.rq_db_slot = flags & 512 ? u32(in) : u16(in) % 1024;
	end = (uint64_t)c.sq_offset + (uint64_t)c.sq_depth * c.sq_stride;
	if ((uint64_t)c.rq_offset + (uint64_t)c.rq_depth * c.rq_stride > end)
		end = (uint64_t)c.rq_offset + (uint64_t)c.rq_depth * c.rq_stride;
	read_pages(in, vm, pages_for(end), &c.ring, &rec);
	ret = vre_qp_create(e, dev, slot, &c);
	CHECK(ret <= 0);
	if (ret == 0) {
		CHECK(slot < MAX_SLOTS && !vm->qps[slot].live);
		CHECK(c.send_cq < MAX_SLOTS && vm->cqs[c.send_cq].live && c.recv_cq < MAX_SLOTS &&
		      vm->cqs[c.recv_cq].live);
		vm->qps[slot] = (struct qp_rec){ .live = true, .cfg = c, .ring = rec };
		vm->cqs[c.send_cq].refs++;
		vm->cqs[c.recv_cq].refs++;
		if (c.srq != VRE_NO_SRQ) {
			CHECK(c.srq >= 0 && c.srq < MAX_SLOTS && vm->srqs[c.srq].live);
			vm->srqs[c.srq].refs++;
		}
	}
}

static void qp_release(struct vm *vm, uint32_t slot)
{
	struct qp_rec *qp = &vm->qps[slot];

	if (!qp->live)
		return;
	vm->cqs[qp->cfg.send_cq].refs--;
	vm->cqs[qp->cfg.recv_cq].refs--;
	if (qp->cfg.srq != VRE_NO_SRQ)
		vm->srqs[qp->cfg.srq].refs--;
	qp->live = false;
}

static void op_qp_destroy(struct in *in, struct vre_engine *e, uint32_t dev)
{
	uint32_t slot = u8(in) % (MAX_SLOTS + 1);

	vre_qp_destroy(e, dev, slot);
	if (slot < MAX_SLOTS)
		qp_release(&vms[dev], slot);
}

/* A live QP of a VM, named by an input byte (NULL if it has none). */
static struct qp_rec *pick_qp(struct vm *vm, uint8_t k, uint32_t *slot)
{
	for (uint32_t i = 0; i < MAX_SLOTS; i++) {
		uint32_t s = (k + i) % MAX_SLOTS;

		if (vm->qps[s].live) {
			if (slot)
				*slot = s;
			return &vm->qps[s];
		}
	}
	return NULL;
}

static struct mr_rec *pick_mr(struct vm *vm, uint8_t k)
{
	for (uint32_t i = 0; i < MAX_SLOTS; i++) {
		uint32_t s = (k + i) % MAX_SLOTS;

		if (vm->mrs[s].live)
			return &vm->mrs[s];
	}
	return NULL;
}

static void op_qp_modify(struct in *in, struct vre_engine *e, uint32_t dev)
{
	struct vm *vm = &vms[dev];
	uint8_t flags = u8(in);
	uint32_t slot = u8(in) % (vm->lim.max_qp + 1);
	struct vre_qp_attr a = { 0 };
	uint8_t dest;
	int ret;

	a.state = u8(in) % 8;
	a.access_flags = u8(in) & 0xf;
	dest = u8(in);
	a.dest_dev = dest % 4 < NDEV ? dest % 4 : dest % 4 == NDEV ? VRE_NO_DEVICE : u32(in);
	if (flags & 1) {
		a.dest_qpn = u32(in);
	} else {
		struct qp_rec *peer = a.dest_dev < NDEV ? pick_qp(&vms[a.dest_dev], u8(in), NULL) : NULL;

		a.dest_qpn = peer ? peer->cfg.qpn : 0;
	}
	a.min_rnr_timer = flags & 2 ? u8(in) : u8(in) % 32;
	a.rnr_retry = u8(in) % 8;
	a.retry_cnt = u8(in) % 8;
	a.timeout = flags & 4 ? u8(in) : u8(in) % 32;
	if (flags & 8)
		a.access_flags = u32(in);
	ret = vre_qp_modify(e, dev, slot, &a);
	CHECK(ret <= 0);
	ret = vre_qp_state(e, dev, slot);
	CHECK(ret < 0 || ret == (int)a.state || ret == VRDMA_QPS_ERR);
	if (a.state == VRDMA_QPS_RESET && slot < MAX_SLOTS && vm->qps[slot].live)
		vm->qps[slot].sq_prod = vm->qps[slot].rq_prod = 0;
}

/* -- the guest's side: WQEs, doorbells, completions ----------------------------------------------------- */

static void fill_sges(struct in *in, struct vm *vm, struct vrdma_sge *sge, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		uint8_t how = u8(in);
		struct mr_rec *mr = pick_mr(vm, how >> 2);

		if ((how & 3) == 3 || !mr) {
			sge[i].addr = u64(in);
			sge[i].length = u32(in);
			sge[i].lkey = u32(in);
			continue;
		}
		uint64_t room = mr->length < 0x10000 ? mr->length : 0x10000;
		uint64_t off = u16(in) % (room + 1);

		/* how & 3 == 2: up to 8 bytes past the MR's end */
		uint64_t span = room - off + 1 + ((how & 3) == 2 ? 8 : 0);

		sge[i] = (struct vrdma_sge){ .addr = mr->iova + off, .lkey = mr->lkey,
					     .length = (uint32_t)(u16(in) % span) };
	}
}

static void op_post_send(struct in *in, struct vre_engine *e, uint32_t dev)
{
	struct vm *vm = &vms[dev];
	struct qp_rec *qp = pick_qp(vm, u8(in), NULL);
	uint32_t count = 1 + u8(in) % 8;
	uint8_t ring = u8(in);

	(void)e;
	if (!qp)
		return;
	for (uint32_t k = 0; k < count; k++) {
		union {
			struct {
				struct vrdma_send_wqe hdr;
				struct vrdma_sge sge[PAGE / sizeof(struct vrdma_sge)];
			} s;
			uint8_t bytes[sizeof(struct vrdma_send_wqe) + PAGE];
		} w;
		uint8_t flags = u8(in), dest;
		struct mr_rec *rmr;

		memset(&w, 0, sizeof(w));
		w.s.hdr.wr_id = u16(in);
		w.s.hdr.opcode = flags & 0x80 ? u8(in) : u8(in) % 7;
		w.s.hdr.send_flags = u8(in) & 0xf;
		w.s.hdr.num_sge = (uint8_t)(u8(in) % (qp->cfg.max_send_sge + 2));
		w.s.hdr.imm_data = u32(in);
		/* The remote side: a key of an MR of either VM (the destination is wherever the QP points). */
		dest = u8(in) % NDEV;
		rmr = pick_mr(&vms[dest], u8(in));
		if (rmr && !(flags & 1)) {
			w.s.hdr.rkey = rmr->rkey;
			uint64_t span = rmr->length < 0x10000 ? rmr->length + 1 : 0x10000;

			w.s.hdr.remote_addr = rmr->iova + u16(in) % span;
			if (flags & 2)
				w.s.hdr.remote_addr &= ~7ULL;
		} else {
			w.s.hdr.rkey = u32(in);
			w.s.hdr.remote_addr = u64(in);
		}
		w.s.hdr.compare_add = u8(in);
		w.s.hdr.swap = u8(in);
		if (w.s.hdr.send_flags & VRDMA_SEND_INLINE) {
			uint32_t len = flags & 4 ? u16(in) : u16(in) % (qp->cfg.max_inline + 1);

			w.s.hdr.inline_len = len;
			for (uint32_t i = 0; i < len && i < PAGE && in->left; i++)
				((uint8_t *)w.s.sge)[i] = u8(in);
		} else {
			fill_sges(in, vm, w.s.sge, w.s.hdr.num_sge);
		}
		ring_write(vm, &qp->ring, qp->cfg.sq_offset + (uint64_t)(qp->sq_prod & (qp->cfg.sq_depth - 1)) *
			   qp->cfg.sq_stride, &w, qp->cfg.sq_stride < sizeof(w) ? qp->cfg.sq_stride : sizeof(w));
		qp->sq_prod++;
	}
	ring_doorbell(vm, qp->cfg.db_page, qp->cfg.sq_db_slot, ring & 1 ? u32(in) : qp->sq_prod);
}

static void op_post_recv(struct in *in, struct vre_engine *e, uint32_t dev)
{
	struct vm *vm = &vms[dev];
	struct qp_rec *qp = pick_qp(vm, u8(in), NULL);
	uint32_t count = 1 + u8(in) % 8;
	uint8_t ring = u8(in);

	(void)e;
	if (!qp)
		return;
	for (uint32_t k = 0; k < count; k++) {
		struct {
			struct vrdma_recv_wqe hdr;
			struct vrdma_sge sge[PAGE / sizeof(struct vrdma_sge)];
		} w;
		uint32_t max_sge = qp->cfg.max_recv_sge;

		memset(&w, 0, sizeof(w));
		if (qp->cfg.srq != VRE_NO_SRQ)
			max_sge = vm->srqs[qp->cfg.srq].stride / 16;
		w.hdr.wr_id = u16(in);
		w.hdr.num_sge = u8(in) % (max_sge + 2);
		if (w.hdr.num_sge > PAGE / sizeof(struct vrdma_sge) - 1)
			w.hdr.num_sge = PAGE / sizeof(struct vrdma_sge) - 1;
		fill_sges(in, vm, w.sge, w.hdr.num_sge);
		if (qp->cfg.srq != VRE_NO_SRQ) {
			struct srq_rec *srq = &vm->srqs[qp->cfg.srq];

			ring_write(vm, &srq->ring, PAGE + (uint64_t)(srq->prod & (srq->depth - 1)) * srq->stride, &w,
				   srq->stride < sizeof(w) ? srq->stride : sizeof(w));
			srq->prod++;
		} else {
			uint64_t at = qp->cfg.rq_offset +
				      (uint64_t)(qp->rq_prod & (qp->cfg.rq_depth - 1)) * qp->cfg.rq_stride;
			uint64_t len = qp->cfg.rq_stride < sizeof(w) ? qp->cfg.rq_stride : sizeof(w);

			ring_write(vm, &qp->ring, at, &w, len);
			qp->rq_prod++;
		}
	}
	if (qp->cfg.srq != VRE_NO_SRQ) {
		struct srq_rec *srq = &vm->srqs[qp->cfg.srq];

		ring_doorbell(vm, srq->db_page, srq->db_slot, ring & 1 ? u32(in) : srq->prod);
	} else {
		ring_doorbell(vm, qp->cfg.db_page, qp->cfg.rq_db_slot, ring & 1 ? u32(in) : qp->rq_prod);
	}
}

/* The guest consumes completions (or claims to: any consumer index) and arms its CQ. */
static void op_cq_consume(struct in *in, struct vre_engine *e, uint32_t dev)
{
	struct vm *vm = &vms[dev];
	uint8_t flags = u8(in);
	struct cq_rec *cq = &vm->cqs[u8(in) % MAX_SLOTS];
	uint8_t *prod, *cons;
	uint32_t value = 0;

	(void)e;
	if (!cq->live)
		return;
	prod = ring_word(vm, &cq->ring, offsetof(struct vrdma_cq_ring_hdr, prod));
	cons = ring_word(vm, &cq->ring, offsetof(struct vrdma_cq_ring_hdr, cons));
	if (flags & 1)
		value = u32(in);
	else if (prod)
		memcpy(&value, prod, 4);
	if (cons)
		memcpy(cons, &value, 4);
	if (flags & 2) {
		cq->arm_seq++;
		ring_doorbell(vm, cq->db_page, cq->db_slot, cq->arm_seq << VRDMA_CQ_ARM_SEQ_SHIFT | (u8(in) & 3));
	}
	if (flags & 4)
		moderate(in, e, dev, u8(in) % (vm->lim.max_cq + 1));
}

static void op_srq_limit(struct in *in, struct vre_engine *e, uint32_t dev)
{
	uint32_t slot = u8(in) % (vms[dev].lim.max_srq + 1);
	int ret = vre_srq_set_limit(e, dev, slot, u8(in));

	CHECK(ret <= 0);
	(void)vre_srq_limit(e, dev, slot);
}

static void op_mem_write(struct in *in, struct vre_engine *e, uint32_t dev)
{
	struct vm *vm = &vms[dev];
	uint64_t gpa = pick_page(vm, u8(in));
	uint8_t len, buf[64];

	(void)e;
	gpa += u16(in) % PAGE;
	len = u8(in) % 64;
	for (uint32_t i = 0; i < len; i++)
		buf[i] = u8(in);
	guest_write(vm, gpa, buf, len);
}

static void op_doorbell(struct in *in, struct vre_engine *e, uint32_t dev)
{
	struct vm *vm = &vms[dev];
	uint32_t page = u8(in), slot = u16(in) % 1024, value = u32(in);

	(void)e;
	ring_doorbell(vm, vm->lim.doorbell_pages ? page % vm->lim.doorbell_pages : 0, slot, value);
}

static void take_events(struct vre_engine *e, uint32_t max)
{
	uint32_t n = vre_take_events(e, events, max);

	CHECK(n <= max);
	for (uint32_t i = 0; i < n; i++)
		CHECK(events[i].dev < NDEV);
}

static void op_poll(struct in *in, struct vre_engine *e, uint32_t dev)
{
	uint8_t how = u8(in);

	(void)dev;
	if (how & 1)
		vre_spin(e, 1 + how % 64, 0);
	else
		vre_poll(e, 1 + how % 64);
	if (how & 2)
		take_events(e, 1 + u16(in) % EVENT_BATCH);
	(void)vre_next_deadline(e);
}

static void op_park(struct in *in, struct vre_engine *e, uint32_t dev)
{
	uint8_t unpark = u8(in) & 1;

	(void)dev;
	if (vre_park(e) && unpark)
		vre_unpark(e);
}

static void op_set_memory(struct in *in, struct vre_engine *e, uint32_t dev)
{
	read_memory(in, e, dev);
}

/* What the model does on a device reset: the engine device closes (every object) and opens again. */
static void op_reset(struct in *in, struct vre_engine *e, uint32_t dev)
{
	struct vm *vm = &vms[dev];

	(void)in;
	vre_device_close(e, dev);
	free(vm->doorbells);
	forget_objects(vm);
	open_device(e, dev);
	if (vm->open && vre_device_set_memory(e, dev, vm->regions, vm->nregions) < 0) {
		vm->nregions = 0;  /* a table only a closed device was given: refused now, and so no memory */
		poison_unmapped(vm);
	}
}

typedef void (*op_fn)(struct in *in, struct vre_engine *e, uint32_t dev);

static const op_fn ops[] = {
	op_mr_create, op_mr_destroy, op_cq_create, op_cq_destroy, op_srq_create, op_srq_destroy, op_qp_create,
	op_qp_modify, op_qp_destroy, op_post_send, op_post_recv, op_poll, op_poll, op_cq_consume, op_mem_write,
	op_doorbell, op_set_memory, op_srq_limit, op_park, op_reset,
};
#define OP_COUNT (sizeof(ops) / sizeof(ops[0]))

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct in in = { data, size };
	struct vre_engine *e = vre_engine_new(NDEV);

	CHECK(e);
	for (uint32_t dev = 0; dev < NDEV; dev++) {
		struct vm *vm = &vms[dev];

		ASAN_UNPOISON_MEMORY_REGION(vm->arena, ARENA_PAGES * PAGE);
		memset(vm->arena, 0, ARENA_PAGES * PAGE);
		vm->nregions = 0;
		forget_objects(vm);
		read_limits(&in, vm);
		open_device(e, dev);
		read_memory(&in, e, dev);
	}
	for (uint32_t n = 0; n < MAX_OPS && in.left; n++) {
		uint8_t b = u8(&in);

		ops[b % OP_COUNT](&in, e, (b / OP_COUNT) & 1);
		CHECK(strnlen(vre_error(e), 256) < 256);
	}
	take_events(e, EVENT_BATCH);
	for (uint32_t dev = 0; verbose && dev < NDEV; dev++) {
		struct vre_counters c;

		vre_device_counters(e, dev, &c);
		fprintf(stderr, "vm%u: send %llu recv %llu cqes %llu (errors %llu) bytes %llu flushed %llu rnr %llu "
			"overflows %llu fatal %llu\n", dev, (unsigned long long)c.send_wqes,
			(unsigned long long)c.recv_wqes, (unsigned long long)c.cqes, (unsigned long long)c.error_cqes,
			(unsigned long long)c.bytes, (unsigned long long)c.flushed, (unsigned long long)c.rnr_waits,
			(unsigned long long)c.cq_overflows, (unsigned long long)c.qp_fatal);
	}
	vre_engine_free(e);
	for (uint32_t dev = 0; dev < NDEV; dev++) {
		free(vms[dev].doorbells);
		vms[dev].doorbells = NULL;
		vms[dev].open = false;
	}
	return 0;
}
