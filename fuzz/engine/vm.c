// SPDX-License-Identifier: GPL-2.0-only
/* The engine fuzzer's fake VMs: their memory (ASan-poisoned where the table maps nothing), limits, page lists,
 * rings and doorbells. */
#include "fuzz.h"

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

void guest_write(struct vm *vm, uint64_t gpa, const void *data, uint64_t len)
{
	uint8_t *to = host(vm, gpa, len);

	if (to)
		memcpy(to, data, len);
}

/* The k-th whole page of guest memory (over every region, in order): how inputs name a valid page. */
uint64_t pick_page(struct vm *vm, uint32_t k)
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
void poison_unmapped(struct vm *vm)
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
void read_memory(struct in *in, struct vre_engine *e, uint32_t dev)
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
	ret = vre_device_set_memory(e, dev, table, head & 0x80 ? VRE_MAX_REGIONS + 1 : count);
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

void read_limits(struct in *in, struct vm *vm)
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

void open_device(struct vre_engine *e, uint32_t dev)
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
	if (vm->open) {
		/* Its address, as a guest's driver adds one: QPs aimed at it are found by it (a state's load routes every
		 * peer again by its GID: restore.c); op_gid_set may change or remove it. */
		uint8_t gid[16];

		device_gid(dev, gid);
		CHECK(vre_gid_set(e, dev, 0, gid, VRDMA_GID_TYPE_ROCE_V2) == 0);
	}
}

void forget_objects(struct vm *vm)
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
void read_pages(struct in *in, struct vm *vm, uint64_t want, struct vre_pages_desc *desc,
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
void ring_write(struct vm *vm, const struct ring_rec *rec, uint64_t off, const void *data, uint64_t len)
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
uint8_t *ring_word(struct vm *vm, const struct ring_rec *rec, uint64_t off)
{
	uint64_t page = off / PAGE;

	return page < rec->npages ? host(vm, rec->gpa[page] + off % PAGE, 4) : NULL;
}

static volatile uint32_t *doorbell(struct vm *vm, uint32_t index)
{
	if (VRDMA_DB_PAGE(index) >= vm->lim.doorbell_pages)
		return NULL;
	return (volatile uint32_t *)vm->doorbells + index;
}

/* A doorbell index as the fuzzer draws it: a page of the region (or any value) and a slot. */
uint32_t draw_db(struct in *in, struct vm *vm, bool raw)
{
	uint32_t page;

	if (raw)
		return u32(in);
	page = 1 + u8(in) % (vm->lim.doorbell_pages ? vm->lim.doorbell_pages : 1);
	return page * VRDMA_DB_SLOTS + u16(in) % VRDMA_DB_SLOTS;
}

void ring_doorbell(struct vm *vm, uint32_t index, uint32_t value)
{
	volatile uint32_t *db = doorbell(vm, index);

	if (db)
		__atomic_store_n(db, value, __ATOMIC_RELEASE);
}

uint64_t pages_for(uint64_t bytes)
{
	return (bytes + PAGE - 1) / PAGE;
}

/* A key (or QP number) naming `slot` of a table of `table` entries in its low bits, as the model makes them. */
/* A key naming `slot` as the model makes them (VRDMA_KEY_SLOT_SHIFT), random around it; or anything. */
uint32_t key_for(struct in *in, uint32_t slot, uint32_t table, bool raw)
{
	return raw ? u32(in) : (((uint32_t)u16(in) * table) | (slot & (table - 1))) << VRDMA_KEY_SLOT_SHIFT | u8(in);
}

/* -- GIDs and Q_Keys: small pools, so that a datagram finds a device and a QP as often as it misses ------------- */

void device_gid(uint32_t dev, uint8_t *gid)
{
	memset(gid, 0, 16);
	gid[10] = gid[11] = 0xff;   /* ::ffff:169.254.100.(dev + 1): one of fuzz_gid's pool */
	gid[12] = 169;
	gid[13] = 254;
	gid[14] = 100;
	gid[15] = (uint8_t)(1 + dev % 4);
}

void fuzz_gid(struct in *in, uint8_t *gid)
{
	uint8_t k = u8(in);

	memset(gid, 0, 16);
	if (k & 0x80) {
		for (int i = 0; i < 16; i++)
			gid[i] = u8(in);
		return;
	}
	gid[10] = gid[11] = 0xff;   /* ::ffff:169.254.100.(1..4) */
	gid[12] = 169;
	gid[13] = 254;
	gid[14] = 100;
	gid[15] = 1 + k % 4;
}

uint32_t fuzz_qkey(struct in *in)
{
	static const uint32_t pool[] = { 0x11111111, 0x22222222, VRDMA_GSI_QKEY, VRDMA_QKEY_PRIVILEGED };
	uint8_t k = u8(in);

	return k & 0x80 ? u32(in) : pool[k % 4];
}

void op_gid_set(struct in *in, struct vre_engine *e, uint32_t dev)
{
	uint8_t gid[16];
	uint32_t index = u8(in) % (VRE_MAX_GIDS + 2);
	uint32_t type = u8(in) % 4;   /* 3: not a GID type */

	fuzz_gid(in, gid);
	CHECK(vre_gid_set(e, dev, index, gid, type) <= 0);
}
