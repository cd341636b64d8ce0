// SPDX-License-Identifier: GPL-2.0-only
/*
 * Guest memory: page lists read out of guest RAM and translated once, through the VM's memory table, into host
 * addresses; translation again when the table changes; and the copies between registered memory, which never
 * cross a page of either side (pages that are adjacent to the guest need not be adjacent here).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "vre.h"

/*
 * Host address of the guest-physical range [gpa, gpa + len), or NULL unless the range lies inside one RAM region
 * (a region is mapped here in one piece, so the range is too). What the local DMA lkey reaches: the guest's RAM and
 * nothing else.
 */
VRE_FN uint8_t *gpa_range(struct vre_device *d, uint64_t gpa, uint64_t len)
{
	for (uint32_t i = 0; i < d->nregions; i++) {
		const struct vre_region *r = &d->regions[i];

		if (gpa >= r->gpa && len <= r->size && gpa - r->gpa <= r->size - len)
			return (uint8_t *)(uintptr_t)(r->hva + (gpa - r->gpa));
	}
	return NULL;
}

/* Host address of one whole guest page, or NULL when the page is not entirely inside one RAM region. */
static uint8_t *gpa_page(struct vre_device *d, uint64_t gpa)
{
	return gpa & (PAGE_SIZE - 1) ? NULL : gpa_range(d, gpa, PAGE_SIZE);
}

/* gpa_page of a page a command's page list names (or holds the list): inside the device's page window too. */
static uint8_t *listed_page(struct vre_device *d, uint64_t gpa)
{
	if (gpa < d->window_lo || gpa > d->window_hi || d->window_hi - gpa < PAGE_SIZE - 1)
		return NULL;
	return gpa_page(d, gpa);
}

static void mem_free(struct vre_mem *m)
{
	free(m->gpa);
	free(m->hva);
	memset(m, 0, sizeof(*m));
}

/* An object's pages leave the device's translation budget (mem_load charged them). */
VRE_FN void mem_put(struct vre_device *d, struct vre_mem *m)
{
	d->pages_in_use -= m->npages;
	mem_free(m);
}

/* Read a page list (levels 1 or 2) out of guest memory and translate every page once. Each translated page costs
 * the backend 16 bytes whatever guest page it names (a list may name one page 262,144 times), so the device's pages
 * together are bounded, as an HCA's translation table is: past the budget a registration fails with ENOMEM. */
VRE_FN int mem_load(struct vre_engine *e, struct vre_device *d, const struct vre_pages_desc *desc, uint32_t max_pages,
	     struct vre_mem *m)
{
	uint32_t n = desc->npages;
	const uint64_t *list = NULL;

	memset(m, 0, sizeof(*m));
	if (n == 0 || n > max_pages)
		return vre_fail(e, EINVAL, "page list of %u pages (1..%u allowed)", n, max_pages);
	if (n > d->lim.max_pages_total - d->pages_in_use)
		return vre_fail(e, ENOMEM, "page list of %u pages: the device has %llu of %u pages translated", n,
				(unsigned long long)d->pages_in_use, d->lim.max_pages_total);
	if (desc->levels == 1 ? n > VRDMA_PBL_ENTRIES :
	    desc->levels == 2 ? n > VRDMA_PBL_ENTRIES * VRDMA_PBL_ENTRIES : true)
		return vre_fail(e, EINVAL, "page list of %u pages cannot have %u levels", n, desc->levels);
	const uint64_t *dir = (const uint64_t *)listed_page(d, desc->addr);
	if (!dir)
		return vre_fail(e, EFAULT, "page list at %#llx is not in guest RAM", (unsigned long long)desc->addr);
	m->gpa = calloc(n, sizeof(*m->gpa));
	m->hva = calloc(n, sizeof(*m->hva));
	if (!m->gpa || !m->hva) {
		mem_free(m);
		return vre_fail(e, ENOMEM, "no memory for a %u-page list", n);
	}
	m->npages = n;
	for (uint32_t i = 0; i < n; i++) {
		if (i % VRDMA_PBL_ENTRIES == 0) {
			if (desc->levels == 1) {
				list = dir;
			} else {
				uint64_t list_gpa = __atomic_load_n(&dir[i / VRDMA_PBL_ENTRIES], __ATOMIC_RELAXED);

				list = (const uint64_t *)listed_page(d, list_gpa);
				if (!list) {
					mem_free(m);
					return vre_fail(e, EFAULT, "page-list page %u at %#llx is not in guest RAM",
							i / VRDMA_PBL_ENTRIES, (unsigned long long)list_gpa);
				}
			}
		}
		uint64_t gpa = __atomic_load_n(&list[i % VRDMA_PBL_ENTRIES], __ATOMIC_RELAXED);

		m->gpa[i] = gpa;
		m->hva[i] = listed_page(d, gpa);
		if (!m->hva[i]) {
			mem_free(m);
			return vre_fail(e, EFAULT, "page %u at %#llx is not a page of guest RAM", i,
					(unsigned long long)gpa);
		}
	}
	m->valid = true;
	m->log = &d->log;
	d->pages_in_use += n;
	return 0;
}

/*
 * The pages of an object of a loaded state (state.c): `n` guest-physical addresses as the state holds them
 * (little-endian, unaligned), in arrays with room for `room` (a fast-registration MR's max_pages, else n), charged
 * to the translation budget as mem_load charges a page list. Each must be page-aligned; translated now unless
 * `translate` is false (a state only checked: nothing is usable, and the caller frees it at once). `valid`: what
 * the object's memory was at the source (a ring a memory-table change broke stays broken); valid pages must
 * translate.
 */
VRE_FN int mem_from_state(struct vre_engine *e, struct vre_device *d, const uint8_t *gpas, uint32_t n, uint32_t room,
			  bool translate, bool valid, struct vre_mem *m)
{
	memset(m, 0, sizeof(*m));
	if (n > room || room > d->lim.max_mr_pages)
		return vre_fail(e, EINVAL, "%u pages in room for %u (at most %u)", n, room, d->lim.max_mr_pages);
	if (room > d->lim.max_pages_total - d->pages_in_use)
		return vre_fail(e, ENOMEM, "%u pages: the device has %llu of %u pages translated", room,
				(unsigned long long)d->pages_in_use, d->lim.max_pages_total);
	if (room) {
		m->gpa = calloc(room, sizeof(*m->gpa));
		m->hva = calloc(room, sizeof(*m->hva));
		if (!m->gpa || !m->hva) {
			mem_free(m);
			return vre_fail(e, ENOMEM, "no memory for a %u-page list", room);
		}
	}
	for (uint32_t i = 0; i < n; i++) {
		uint64_t gpa;

		memcpy(&gpa, gpas + (size_t)i * sizeof(gpa), sizeof(gpa));
		if (gpa & (PAGE_SIZE - 1)) {
			mem_free(m);
			return vre_fail(e, EINVAL, "page %u at %#llx is not page-aligned", i, (unsigned long long)gpa);
		}
		m->gpa[i] = gpa;
		m->hva[i] = translate ? gpa_page(d, gpa) : NULL;
		if (translate && valid && !m->hva[i]) {
			mem_free(m);
			return vre_fail(e, EFAULT, "page %u at %#llx is not a page of guest RAM", i, (unsigned long long)gpa);
		}
	}
	m->npages = n;
	m->valid = valid && translate;
	m->log = &d->log;
	d->pages_in_use += room;
	return 0;
}

/*
 * A new object (an MR, CQ, SRQ or QP) of `size` bytes whose struct vre_mem at `mem_offset` holds `pages`, loaded and
 * translated; NULL with *err set (and the engine's message) when memory or the translation budget runs out or a page
 * is not guest RAM. obj_free gives both back (nothing for NULL: a destroy of an empty slot).
 */
VRE_FN void *obj_new(struct vre_engine *e, struct vre_device *d, size_t size, size_t mem_offset,
	      const struct vre_pages_desc *pages, const char *what, int *err)
{
	uint8_t *obj = calloc(1, size);

	if (!obj) {
		*err = vre_fail(e, ENOMEM, "no memory for %s", what);
		return NULL;
	}
	*err = mem_load(e, d, pages, d->lim.max_mr_pages, (struct vre_mem *)(obj + mem_offset));
	if (*err) {
		free(obj);
		return NULL;
	}
	return obj;
}

VRE_FN void obj_free(struct vre_device *d, void *obj, size_t mem_offset)
{
	if (!obj)
		return;
	mem_put(d, (struct vre_mem *)((uint8_t *)obj + mem_offset));
	free(obj);
}

VRE_FN bool mem_retranslate(struct vre_device *d, struct vre_mem *m)
{
	for (uint32_t i = 0; i < m->npages; i++) {
		m->hva[i] = gpa_page(d, m->gpa[i]);
		if (!m->hva[i])
			m->valid = false;
	}
	return m->valid;
}

/* Mark one guest page dirty in a VM's log (a page past the log is one QEMU does not migrate: nothing to mark). The
 * release order keeps the mark behind the bytes written before it. */
static void log_page(const struct vre_dirty_log *log, uint64_t gpa)
{
	uint64_t page = gpa >> PAGE_SHIFT;

	if (page / 8 < log->bytes)
		__atomic_fetch_or(&log->bits[page / 8], (uint8_t)(1u << (page % 8)), __ATOMIC_RELEASE);
}

VRE_FN void mem_dirty(const struct vre_mem *m, uint64_t off, uint64_t len)
{
	const struct vre_dirty_log *log = m->log;

	if (!log || !log->bits || !len)
		return;
	for (uint64_t p = off >> PAGE_SHIFT; p <= (off + len - 1) >> PAGE_SHIFT && p < m->npages; p++)
		log_page(log, m->gpa[p]);
}

VRE_FN void gpa_dirty(const struct vre_dirty_log *log, uint64_t gpa, uint64_t len)
{
	if (!log || !log->bits || !len || gpa + len < gpa)
		return;
	for (uint64_t page = gpa >> PAGE_SHIFT, last = (gpa + len - 1) >> PAGE_SHIFT; page <= last; page++)
		log_page(log, page << PAGE_SHIFT);
}

/* Where the next chunk of one side of a copy is, and how much of it stays inside one page of an MR. */
static uint8_t *seg_at(const struct seg *s, uint64_t done, uint64_t *chunk)
{
	if (!s->mem)
		return (uint8_t *)s->buf + done;
	uint64_t at = s->off + done, room = PAGE_SIZE - (at & (PAGE_SIZE - 1));

	*chunk = *chunk < room ? *chunk : room;
	return mem_at(s->mem, at);
}

/* Copy min(total of dst, total of src) bytes, chunk by chunk, never crossing a page of either side. */
VRE_FN uint64_t copy_segs(struct seg *dst, uint32_t ndst, struct seg *src, uint32_t nsrc)
{
	uint32_t di = 0, si = 0;
	uint64_t doff = 0, soff = 0, moved = 0;

	while (di < ndst && si < nsrc) {
		uint64_t dleft = dst[di].len - doff, sleft = src[si].len - soff;
		uint64_t chunk = dleft < sleft ? dleft : sleft;
		uint8_t *to = seg_at(&dst[di], doff, &chunk);
		const uint8_t *from = seg_at(&src[si], soff, &chunk);

		memmove(to, from, chunk);  /* memmove: both sides may be the same guest page */
		if (dst[di].mem)
			mem_dirty(dst[di].mem, dst[di].off + doff, chunk);
		else
			gpa_dirty(dst[di].log, dst[di].gpa + doff, chunk);
		moved += chunk;
		doff += chunk;
		soff += chunk;
		if (doff == dst[di].len) {
			di++;
			doff = 0;
		}
		if (soff == src[si].len) {
			si++;
			soff = 0;
		}
	}
	return moved;
}

/* Where byte `*off` of a list of segments taken as one run lies: the segment's index, and *off made its offset in it
 * (n when the run is shorter). */
static uint32_t seg_seek(const struct seg *segs, uint32_t n, uint64_t *off)
{
	uint32_t i = 0;

	while (i < n && *off >= segs[i].len)
		*off -= segs[i++].len;
	return i;
}

/* Segment `s` from its byte `off` on, at most `len` bytes of it. */
static struct seg seg_part(const struct seg *s, uint64_t off, uint64_t len)
{
	struct seg part = *s;

	if (part.mem) {
		part.off += off;
	} else {
		part.buf += off;
		part.gpa += off;
	}
	part.len = part.len - off < len ? part.len - off : len;
	return part;
}

VRE_FN uint32_t segs_slice(const struct seg *in, uint32_t n, uint64_t off, uint64_t len, struct seg *out)
{
	uint32_t k = 0;

	for (uint32_t i = seg_seek(in, n, &off); i < n && len; i++, off = 0) {
		out[k] = seg_part(&in[i], off, len);
		len -= out[k++].len;
	}
	return k;
}

/*
 * Copy len bytes between a buffer and the byte range [off, off + len) of a list of segments taken as one run of
 * bytes (into them with to_segs, out of them otherwise): a packet's payload and its place in a message. Returns the
 * bytes copied, less than len when the segments end first.
 */
VRE_FN uint64_t copy_at(struct seg *segs, uint32_t n, uint64_t off, uint8_t *buf, uint64_t len, bool to_segs)
{
	uint64_t done = 0;

	for (uint32_t i = seg_seek(segs, n, &off); i < n && done < len; i++, off = 0) {
		struct seg part = seg_part(&segs[i], off, len - done);
		struct seg flat = { .buf = buf + done, .len = part.len };

		if (to_segs)
			copy_segs(&part, 1, &flat, 1);
		else
			copy_segs(&flat, 1, &part, 1);
		done += part.len;
	}
	return done;
}
