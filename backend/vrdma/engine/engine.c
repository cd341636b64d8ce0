// SPDX-License-Identifier: GPL-2.0-only
/*
 * The vrdma data engine (see engine.h for its place in the backend).
 *
 * Trust: everything in guest memory (rings, WQEs, page lists, the consumer index of a CQ) and in doorbell pages
 * can change under our feet and is read once into local variables before it is checked and used. Every guest
 * address is translated page by page through the VM's memory table; every index is masked into its ring; every
 * `addr + len` is computed so that it cannot wrap; every loop is bounded by a ring depth or a budget.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "vrdma-abi.h"

#define PAGE_SIZE VRDMA_PAGE_SIZE
#define PAGE_SHIFT VRDMA_PAGE_SHIFT
#define EVENT_RING 4096
#define MAX_REGIONS 64
#define DB_WORDS (VRDMA_DOORBELL_PAGE_SIZE / 4)
#define RNR_INFINITE 7
#define DIV_ROUND_UP(n, d) (((n) + (d) - 1) / (d))

/* Guest memory an object spans: its pages' guest-physical addresses and where they are mapped here. */
struct vre_mem {
	uint32_t npages;
	bool valid;               /* false once a memory table change left a page untranslatable */
	uint64_t *gpa;
	uint8_t **hva;
};

struct vre_mr {
	struct vre_mr_config cfg;
	struct vre_mem mem;
};

struct vre_cq {
	struct vre_cq_config cfg;
	struct vre_mem ring;
	volatile uint32_t *arm;   /* doorbell slot */
	uint32_t arm_done;        /* the arm request the last event answered */
	uint32_t prod;
	bool error;
	uint32_t mod_count;       /* moderation: completions per event (0, 1: every armed completion) */
	uint32_t mod_period_us;   /* ... or this long after the first (0: no timer) */
	uint32_t mod_pending;     /* armed completions not announced yet */
	int64_t mod_deadline;     /* when the pending ones are announced anyway; 0: none */
};

struct vre_srq {
	struct vre_srq_config cfg;
	struct vre_mem ring;
	volatile uint32_t *db;
	uint32_t cons;
	uint32_t limit;
	bool error;
};

struct vre_qp {
	struct vre_qp_config cfg;
	struct vre_qp_attr attr;
	struct vre_mem ring;
	volatile uint32_t *sq_db;
	volatile uint32_t *rq_db;
	uint32_t sq_head;         /* next send WQE to execute */
	uint32_t rq_cons;
	uint32_t rnr_left;
	uint32_t retry_left;
	int64_t rnr_until;        /* CLOCK_MONOTONIC ns of the next attempt after an RNR or a timeout; 0: none */
	uint32_t index;           /* position in the device's active list */
};

struct vre_device {
	bool open;
	struct vre_device_limits lim;
	uint8_t *doorbells;
	struct vre_region regions[MAX_REGIONS];
	uint32_t nregions;
	struct vre_mr **mrs;
	struct vre_cq **cqs;
	struct vre_srq **srqs;
	struct vre_qp **qps;
	struct vre_qp **active;   /* the QPs, densely, for polling */
	uint32_t nactive;
	int64_t mod_next;         /* earliest moderation deadline of its CQs (0: none): the only time CQs are scanned */
	uint64_t pages_in_use;    /* translated pages of its MRs and rings, bounded by lim.max_pages_total */
	struct vre_counters counters;
};

struct vre_engine {
	uint32_t ndevices;
	struct vre_device *devices;
	struct vre_event events[EVENT_RING];
	uint32_t ev_head, ev_tail;
	bool parked;
	int64_t now;
	char error[256];
};

/* -- helpers ---------------------------------------------------------------------------------------------- */

static int fail(struct vre_engine *e, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(struct vre_engine *e, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(e->error, sizeof(e->error), fmt, ap);
	va_end(ap);
	return -err;
}

static int64_t monotonic_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline uint32_t load_acquire(volatile uint32_t *p)
{
	return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

static inline void store_release(volatile uint32_t *p, uint32_t v)
{
	__atomic_store_n(p, v, __ATOMIC_RELEASE);
}

static inline bool is_pow2(uint32_t v)
{
	return v && !(v & (v - 1));
}

static struct vre_device *device(struct vre_engine *e, uint32_t dev)
{
	return dev < e->ndevices && e->devices[dev].open ? &e->devices[dev] : NULL;
}

static void post_event(struct vre_engine *e, uint32_t dev, uint32_t type, uint32_t handle, uint64_t data)
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

static uint32_t dev_index(struct vre_engine *e, struct vre_device *d)
{
	return (uint32_t)(d - e->devices);
}

/* -- guest memory ------------------------------------------------------------------------------------------ */

/* Host address of one whole guest page, or NULL when the page is not entirely inside one RAM region. */
static uint8_t *gpa_page(struct vre_device *d, uint64_t gpa)
{
	if (gpa & (PAGE_SIZE - 1))
		return NULL;
	for (uint32_t i = 0; i < d->nregions; i++) {
		const struct vre_region *r = &d->regions[i];

		if (gpa >= r->gpa && r->size >= PAGE_SIZE && gpa - r->gpa <= r->size - PAGE_SIZE)
			return (uint8_t *)(uintptr_t)(r->hva + (gpa - r->gpa));
	}
	return NULL;
}

static void mem_free(struct vre_mem *m)
{
	free(m->gpa);
	free(m->hva);
	memset(m, 0, sizeof(*m));
}

/* An object's pages leave the device's translation budget (mem_load charged them). */
static void mem_put(struct vre_device *d, struct vre_mem *m)
{
	d->pages_in_use -= m->npages;
	mem_free(m);
}

/* Read a page list (levels 1 or 2) out of guest memory and translate every page once. Each translated page costs
 * the backend 16 bytes whatever guest page it names (a list may name one page 262,144 times), so the device's pages
 * together are bounded, as an HCA's translation table is: past the budget a registration fails with ENOMEM. */
static int mem_load(struct vre_engine *e, struct vre_device *d, const struct vre_pages_desc *desc,
		    uint32_t max_pages, struct vre_mem *m)
{
	uint32_t n = desc->npages;
	const uint64_t *list = NULL;

	memset(m, 0, sizeof(*m));
	if (n == 0 || n > max_pages)
		return fail(e, EINVAL, "page list of %u pages (1..%u allowed)", n, max_pages);
	if (n > d->lim.max_pages_total - d->pages_in_use)
		return fail(e, ENOMEM, "page list of %u pages: the device has %llu of %u pages translated", n,
			    (unsigned long long)d->pages_in_use, d->lim.max_pages_total);
	if (desc->levels == 1 ? n > VRDMA_PBL_ENTRIES :
	    desc->levels == 2 ? n > VRDMA_PBL_ENTRIES * VRDMA_PBL_ENTRIES : true)
		return fail(e, EINVAL, "page list of %u pages cannot have %u levels", n, desc->levels);
	const uint64_t *dir = (const uint64_t *)gpa_page(d, desc->addr);
	if (!dir)
		return fail(e, EFAULT, "page list at %#llx is not in guest RAM", (unsigned long long)desc->addr);
	m->gpa = calloc(n, sizeof(*m->gpa));
	m->hva = calloc(n, sizeof(*m->hva));
	if (!m->gpa || !m->hva) {
		mem_free(m);
		return fail(e, ENOMEM, "no memory for a %u-page list", n);
	}
	m->npages = n;
	for (uint32_t i = 0; i < n; i++) {
		if (i % VRDMA_PBL_ENTRIES == 0) {
			if (desc->levels == 1) {
				list = dir;
			} else {
				uint64_t list_gpa = __atomic_load_n(&dir[i / VRDMA_PBL_ENTRIES], __ATOMIC_RELAXED);

				list = (const uint64_t *)gpa_page(d, list_gpa);
				if (!list) {
					mem_free(m);
					return fail(e, EFAULT, "page-list page %u at %#llx is not in guest RAM",
						    i / VRDMA_PBL_ENTRIES, (unsigned long long)list_gpa);
				}
			}
		}
		uint64_t gpa = __atomic_load_n(&list[i % VRDMA_PBL_ENTRIES], __ATOMIC_RELAXED);

		m->gpa[i] = gpa;
		m->hva[i] = gpa_page(d, gpa);
		if (!m->hva[i]) {
			mem_free(m);
			return fail(e, EFAULT, "page %u at %#llx is not a page of guest RAM", i,
				    (unsigned long long)gpa);
		}
	}
	m->valid = true;
	d->pages_in_use += n;
	return 0;
}

static bool mem_retranslate(struct vre_device *d, struct vre_mem *m)
{
	for (uint32_t i = 0; i < m->npages; i++) {
		m->hva[i] = gpa_page(d, m->gpa[i]);
		if (!m->hva[i])
			m->valid = false;
	}
	return m->valid;
}

/* Address of byte `off` of an object's memory; the caller keeps `off` below npages * PAGE_SIZE. */
static inline uint8_t *mem_at(const struct vre_mem *m, uint64_t off)
{
	return m->hva[off >> PAGE_SHIFT] + (off & (PAGE_SIZE - 1));
}

/* A run of bytes to copy: in an MR (mem + offset in it) or in a local buffer. */
struct seg {
	const struct vre_mem *mem;
	const uint8_t *buf;
	uint64_t off;
	uint64_t len;
};

/* Copy min(total of dst, total of src) bytes, chunk by chunk, never crossing a page of either side. */
static uint64_t copy_segs(struct seg *dst, uint32_t ndst, struct seg *src, uint32_t nsrc)
{
	uint32_t di = 0, si = 0;
	uint64_t doff = 0, soff = 0, moved = 0;

	while (di < ndst && si < nsrc) {
		uint64_t dleft = dst[di].len - doff, sleft = src[si].len - soff;
		uint64_t chunk = dleft < sleft ? dleft : sleft;
		uint8_t *to;
		const uint8_t *from;

		if (dst[di].mem) {
			uint64_t at = dst[di].off + doff, room = PAGE_SIZE - (at & (PAGE_SIZE - 1));

			chunk = chunk < room ? chunk : room;
			to = mem_at(dst[di].mem, at);
		} else {
			to = (uint8_t *)dst[di].buf + doff;
		}
		if (src[si].mem) {
			uint64_t at = src[si].off + soff, room = PAGE_SIZE - (at & (PAGE_SIZE - 1));

			chunk = chunk < room ? chunk : room;
			from = mem_at(src[si].mem, at);
		} else {
			from = src[si].buf + soff;
		}
		memmove(to, from, chunk);  /* memmove: both sides may be the same guest page */
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

/* -- lookups ------------------------------------------------------------------------------------------------ */

static struct vre_mr *mr_by_key(struct vre_device *d, uint32_t key, bool remote)
{
	struct vre_mr *mr = d->mrs[key & (d->lim.max_mr - 1)];

	if (!mr || !mr->mem.valid || (remote ? mr->cfg.rkey : mr->cfg.lkey) != key)
		return NULL;
	return mr;
}

/* The offset in mr->mem of [addr, addr + len), if that range lies inside the MR. */
static bool mr_range(const struct vre_mr *mr, uint64_t addr, uint64_t len, uint64_t *off)
{
	if (addr < mr->cfg.iova)
		return false;
	uint64_t rel = addr - mr->cfg.iova;

	if (rel > mr->cfg.length || len > mr->cfg.length - rel)
		return false;
	*off = mr->cfg.page_offset + rel;
	return true;
}

static struct vre_qp *qp_by_qpn(struct vre_engine *e, uint32_t dev, uint32_t qpn)
{
	struct vre_device *d = device(e, dev);
	struct vre_qp *qp;

	if (!d)
		return NULL;
	qp = d->qps[qpn & (d->lim.max_qp - 1)];
	return qp && qp->cfg.qpn == qpn ? qp : NULL;
}

/* -- completions and state ------------------------------------------------------------------------------- */

static void cq_announce(struct vre_engine *e, struct vre_device *d, struct vre_cq *cq, uint32_t arm)
{
	cq->arm_done = arm;
	cq->mod_pending = 0;
	cq->mod_deadline = 0;
	post_event(e, dev_index(e, d), VRDMA_EVENT_CQ_COMP, cq->cfg.handle, 0);
}

static void cq_push(struct vre_engine *e, struct vre_device *d, struct vre_cq *cq, const struct vrdma_cqe *cqe,
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
		d->counters.cq_overflows++;
		post_event(e, dev_index(e, d), VRDMA_EVENT_CQ_ERR, cq->cfg.handle, 0);
		return;
	}
	memcpy(mem_at(&cq->ring, PAGE_SIZE + (uint64_t)(cq->prod & (cq->cfg.entries - 1)) * sizeof(*cqe)), cqe,
	       sizeof(*cqe));
	cq->prod++;
	store_release(&hdr->prod, cq->prod);
	d->counters.cqes++;
	if (cqe->status != VRDMA_WC_SUCCESS)
		d->counters.error_cqes++;
	arm = load_acquire(cq->arm);
	if (arm == cq->arm_done || !((arm & VRDMA_CQ_ARM_NEXT) ||
				     ((arm & VRDMA_CQ_ARM_SOLICITED) && (solicited || cqe->status != VRDMA_WC_SUCCESS))))
		return;
	if (cq->mod_count <= 1 && !cq->mod_period_us) {
		cq_announce(e, d, cq, arm);
		return;
	}
	/* Moderated: announce after mod_count completions, or mod_period_us after the first (vre_poll's timer). */
	if (++cq->mod_pending == 1 && cq->mod_period_us) {
		cq->mod_deadline = e->now + (int64_t)cq->mod_period_us * 1000;
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
static void cq_timers(struct vre_engine *e, struct vre_device *d)
{
	int64_t next = 0;

	if (!d->mod_next || e->now < d->mod_next)
		return;
	for (uint32_t i = 0; i < d->lim.max_cq; i++) {
		struct vre_cq *cq = d->cqs[i];

		if (!cq || !cq->mod_deadline)
			continue;
		if (e->now >= cq->mod_deadline)
			cq_announce(e, d, cq, load_acquire(cq->arm));
		else if (!next || cq->mod_deadline < next)
			next = cq->mod_deadline;
	}
	d->mod_next = next;
}

static void qp_to_error(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, uint32_t event)
{
	if (qp->attr.state == VRDMA_QPS_ERR)
		return;
	qp->attr.state = VRDMA_QPS_ERR;
	qp->rnr_until = 0;
	if (event) {
		post_event(e, dev_index(e, d), event, qp->cfg.handle, 0);
		if (event == VRDMA_EVENT_QP_FATAL)
			d->counters.qp_fatal++;
	}
	if (qp->cfg.srq != VRE_NO_SRQ)
		post_event(e, dev_index(e, d), VRDMA_EVENT_QP_LAST_WQE, qp->cfg.handle, 0);
}

static uint8_t wc_opcode(uint8_t wr_opcode)
{
	switch (wr_opcode) {
	case VRDMA_WR_RDMA_WRITE:
	case VRDMA_WR_RDMA_WRITE_WITH_IMM:
		return VRDMA_WC_OP_RDMA_WRITE;
	case VRDMA_WR_RDMA_READ:
		return VRDMA_WC_OP_RDMA_READ;
	case VRDMA_WR_ATOMIC_CMP_AND_SWP:
		return VRDMA_WC_OP_COMP_SWAP;
	case VRDMA_WR_ATOMIC_FETCH_AND_ADD:
		return VRDMA_WC_OP_FETCH_ADD;
	default:
		return VRDMA_WC_OP_SEND;
	}
}

/*
 * Retire the send WQE at the head of the queue, then complete it. The consumer index is published first: a
 * provider that sees the completion must also see the slot free (it refuses posts into a full ring).
 */
static void complete_send(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp,
			  const struct vrdma_send_wqe *w, uint8_t status, uint32_t byte_len)
{
	struct vrdma_qp_ring_hdr *hdr = (struct vrdma_qp_ring_hdr *)mem_at(&qp->ring, 0);
	struct vrdma_cqe cqe = { .wr_id = w->wr_id, .status = status, .opcode = wc_opcode(w->opcode),
				 .byte_len = byte_len, .qp_num = qp->cfg.qpn };

	qp->sq_head++;
	store_release(&hdr->sq_cons, qp->sq_head);
	if (status != VRDMA_WC_SUCCESS || qp->cfg.sq_sig_all || (w->send_flags & VRDMA_SEND_SIGNALED))
		cq_push(e, d, d->cqs[qp->cfg.send_cq], &cqe, false);
}

/* -- receive queues ---------------------------------------------------------------------------------------- */

struct recv_wqe {
	struct vrdma_recv_wqe hdr;
	struct vrdma_sge sge[VRDMA_PAGE_SIZE / sizeof(struct vrdma_sge)];
};

enum take { TAKE_OK, TAKE_EMPTY, TAKE_BROKEN };

/* Take the next receive WQE of `qp` (its RQ or its SRQ), copied out of guest memory. */
static enum take take_recv(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, struct recv_wqe *out,
			   uint32_t *max_sge)
{
	if (qp->cfg.srq != VRE_NO_SRQ) {
		struct vre_srq *srq = d->srqs[qp->cfg.srq];
		struct vrdma_srq_ring_hdr *hdr;
		uint32_t prod, avail;

		if (srq->error || !srq->ring.valid)
			return TAKE_BROKEN;
		prod = load_acquire(srq->db);
		avail = prod - srq->cons;
		if (avail > srq->cfg.depth) {
			srq->error = true;  /* the producer overran the ring */
			return TAKE_BROKEN;
		}
		if (!avail)
			return TAKE_EMPTY;
		memcpy(out, mem_at(&srq->ring, PAGE_SIZE + (uint64_t)(srq->cons & (srq->cfg.depth - 1)) *
				   srq->cfg.stride), srq->cfg.stride);
		srq->cons++;
		hdr = (struct vrdma_srq_ring_hdr *)mem_at(&srq->ring, 0);
		store_release(&hdr->cons, srq->cons);
		*max_sge = srq->cfg.max_sge;
		if (srq->limit && avail - 1 < srq->limit) {
			srq->limit = 0;  /* one event per arming (IB: the limit disarms itself) */
			post_event(e, dev_index(e, d), VRDMA_EVENT_SRQ_LIMIT, srq->cfg.handle, 0);
		}
	} else {
		struct vrdma_qp_ring_hdr *hdr;
		uint32_t prod, avail;

		prod = load_acquire(qp->rq_db);
		avail = prod - qp->rq_cons;
		if (avail > qp->cfg.rq_depth)
			return TAKE_BROKEN;
		if (!avail)
			return TAKE_EMPTY;
		memcpy(out, mem_at(&qp->ring, qp->cfg.rq_offset + (uint64_t)(qp->rq_cons & (qp->cfg.rq_depth - 1)) *
				   qp->cfg.rq_stride), qp->cfg.rq_stride);
		qp->rq_cons++;
		hdr = (struct vrdma_qp_ring_hdr *)mem_at(&qp->ring, 0);
		store_release(&hdr->rq_cons, qp->rq_cons);
		*max_sge = qp->cfg.max_recv_sge;
	}
	d->counters.recv_wqes++;
	return TAKE_OK;
}

/* Flush the receive queue of a QP in error: every posted receive completes with WR_FLUSH_ERR. */
static uint32_t flush_recv(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, uint32_t budget)
{
	struct vrdma_qp_ring_hdr *hdr = (struct vrdma_qp_ring_hdr *)mem_at(&qp->ring, 0);
	uint32_t prod, n = 0;

	if (qp->cfg.srq != VRE_NO_SRQ)
		return 0;  /* an SRQ's receives belong to the other QPs sharing it */
	prod = load_acquire(qp->rq_db);
	if (prod - qp->rq_cons > qp->cfg.rq_depth)
		return 0;  /* more receives than the ring holds: the index is garbage and names nothing posted (clamping
			    * it to one ring's worth flushed another ring's worth on every pass, without end) */
	while (qp->rq_cons != prod && n < budget) {
		struct vrdma_recv_wqe w;
		struct vrdma_cqe cqe = { .status = VRDMA_WC_WR_FLUSH_ERR, .opcode = VRDMA_WC_OP_RECV,
					 .qp_num = qp->cfg.qpn };

		memcpy(&w, mem_at(&qp->ring, qp->cfg.rq_offset + (uint64_t)(qp->rq_cons & (qp->cfg.rq_depth - 1)) *
				  qp->cfg.rq_stride), sizeof(w));
		cqe.wr_id = w.wr_id;
		cq_push(e, d, d->cqs[qp->cfg.recv_cq], &cqe, false);
		qp->rq_cons++;
		d->counters.flushed++;
		n++;
	}
	store_release(&hdr->rq_cons, qp->rq_cons);
	return n;
}

/* -- executing send WQEs ---------------------------------------------------------------------------------- */

enum exec { EXEC_DONE, EXEC_WAIT };

struct send_wqe {
	struct vrdma_send_wqe hdr;
	union {
		struct vrdma_sge sge[VRDMA_PAGE_SIZE / sizeof(struct vrdma_sge)];
		uint8_t inline_data[VRDMA_PAGE_SIZE];
	};
};

/* Build segments from SGEs in device d, checking keys, PD, bounds and (if asked) local write access. */
static uint8_t sges_to_segs(struct vre_device *d, uint32_t pd, const struct vrdma_sge *sge, uint32_t n,
			    bool need_write, uint64_t max_msg, struct seg *segs, uint32_t *nsegs, uint64_t *total)
{
	uint64_t sum = 0;
	uint32_t k = 0;

	for (uint32_t i = 0; i < n; i++) {
		struct vrdma_sge s = sge[i];
		struct vre_mr *mr;
		uint64_t off;

		if (!s.length)
			continue;
		mr = mr_by_key(d, s.lkey, false);
		if (!mr || mr->cfg.pd != pd || !mr_range(mr, s.addr, s.length, &off) ||
		    (need_write && !(mr->cfg.access & VRDMA_ACCESS_LOCAL_WRITE)))
			return VRDMA_WC_LOC_PROT_ERR;
		sum += s.length;  /* at most 4096/16 SGEs of < 2^32 bytes: cannot wrap 64 bits */
		segs[k++] = (struct seg){ .mem = &mr->mem, .off = off, .len = s.length };
	}
	if (sum > max_msg)
		return VRDMA_WC_LOC_LEN_ERR;
	*nsegs = k;
	*total = sum;
	return VRDMA_WC_SUCCESS;
}

/* The responder's checks of a remote access: rkey, PD, bounds, MR and QP access rights. */
static struct vre_mr *remote_mr(struct vre_device *dd, struct vre_qp *dqp, uint32_t rkey, uint64_t addr,
				uint64_t len, uint32_t access, uint64_t *off)
{
	struct vre_mr *mr = mr_by_key(dd, rkey, true);

	if (!mr || mr->cfg.pd != dqp->cfg.pd || !(mr->cfg.access & access) || !(dqp->attr.access_flags & access) ||
	    !mr_range(mr, addr, len, off))
		return NULL;
	return mr;
}

static const uint32_t rnr_timer_us[32] = {
	655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840, 5120, 7680,
	10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520,
};

/* One send WQE, start to finish. The engine is single-threaded: the scratch arrays are static. */
static enum exec execute_send(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp,
			      const struct send_wqe *w)
{
	static struct seg local[VRDMA_PAGE_SIZE / sizeof(struct vrdma_sge)];
	static struct seg remote[VRDMA_PAGE_SIZE / sizeof(struct vrdma_sge)];
	static struct recv_wqe rwqe;
	uint8_t op = w->hdr.opcode, status;
	bool is_inline = w->hdr.send_flags & VRDMA_SEND_INLINE;
	bool reads = op == VRDMA_WR_RDMA_READ || op == VRDMA_WR_ATOMIC_CMP_AND_SWP ||
		     op == VRDMA_WR_ATOMIC_FETCH_AND_ADD;
	uint32_t nlocal = 0, nremote = 0, rmax_sge = 0;
	uint64_t len = 0, roff = 0;
	struct vre_device *dd;
	struct vre_qp *dqp;
	struct vre_mr *rmr = NULL;

	d->counters.send_wqes++;
	/* Local checks: the requester's own mistakes. */
	if (op > VRDMA_WR_ATOMIC_FETCH_AND_ADD || (is_inline && reads)) {
		status = VRDMA_WC_LOC_QP_OP_ERR;
		goto local_error;
	}
	if (is_inline) {
		if (w->hdr.inline_len > qp->cfg.max_inline) {
			status = VRDMA_WC_LOC_LEN_ERR;
			goto local_error;
		}
		len = w->hdr.inline_len;
		if (len)
			local[nlocal++] = (struct seg){ .buf = w->inline_data, .len = len };
	} else {
		if (w->hdr.num_sge > qp->cfg.max_send_sge) {
			status = VRDMA_WC_LOC_QP_OP_ERR;
			goto local_error;
		}
		status = sges_to_segs(d, qp->cfg.pd, w->sge, w->hdr.num_sge, reads, d->lim.max_msg_size, local,
				      &nlocal, &len);
		if (status != VRDMA_WC_SUCCESS)
			goto local_error;
	}
	if ((op == VRDMA_WR_ATOMIC_CMP_AND_SWP || op == VRDMA_WR_ATOMIC_FETCH_AND_ADD) &&
	    (len != 8 || nlocal != 1 || (w->hdr.remote_addr & 7))) {
		status = len != 8 || nlocal != 1 ? VRDMA_WC_LOC_LEN_ERR : VRDMA_WC_REM_INV_REQ_ERR;
		goto local_error;
	}

	/* The destination: without one (unknown GID, QP gone, not ready to receive) the requester retries in vain. */
	dqp = qp->attr.dest_dev == VRE_NO_DEVICE ? NULL : qp_by_qpn(e, qp->attr.dest_dev, qp->attr.dest_qpn);
	dd = dqp ? &e->devices[qp->attr.dest_dev] : NULL;
	if (!dqp || dqp->attr.state < VRDMA_QPS_RTR || dqp->attr.state == VRDMA_QPS_ERR || !dqp->ring.valid) {
		/*
		 * Nobody answers (yet: the peer may still be on its way to RTR). A real requester times out after
		 * 4.096 us * 2^timeout and retries retry_cnt times; so does this one (timeout 0: wait forever).
		 */
		if (qp->retry_left == 0) {
			status = VRDMA_WC_RETRY_EXC_ERR;
			goto local_error;
		}
		if (qp->attr.timeout)
			qp->retry_left--;
		qp->rnr_until = e->now + (qp->attr.timeout ? (int64_t)4096 << (qp->attr.timeout & 31) : 100000000);
		return EXEC_WAIT;
	}

	/* Operations naming remote memory: the responder checks the rkey (a zero-length transfer names none). */
	if (op == VRDMA_WR_ATOMIC_CMP_AND_SWP || op == VRDMA_WR_ATOMIC_FETCH_AND_ADD ||
	    (len && (op == VRDMA_WR_RDMA_WRITE || op == VRDMA_WR_RDMA_WRITE_WITH_IMM || op == VRDMA_WR_RDMA_READ))) {
		uint32_t access = op == VRDMA_WR_RDMA_READ ? VRDMA_ACCESS_REMOTE_READ :
				  op == VRDMA_WR_RDMA_WRITE || op == VRDMA_WR_RDMA_WRITE_WITH_IMM ?
				  VRDMA_ACCESS_REMOTE_WRITE : VRDMA_ACCESS_REMOTE_ATOMIC;

		rmr = remote_mr(dd, dqp, w->hdr.rkey, w->hdr.remote_addr, len, access, &roff);
		if (!rmr) {
			/* Remote access error: nothing is read or written; both ends go to the error state. */
			complete_send(e, d, qp, &w->hdr, VRDMA_WC_REM_ACCESS_ERR, 0);
			qp_to_error(e, d, qp, 0);
			qp_to_error(e, dd, dqp, VRDMA_EVENT_QP_ACCESS_ERR);
			return EXEC_DONE;
		}
	}

	/* Operations that consume a receive WQE at the destination. */
	if (op == VRDMA_WR_SEND || op == VRDMA_WR_SEND_WITH_IMM || op == VRDMA_WR_RDMA_WRITE_WITH_IMM) {
		enum take taken = take_recv(e, dd, dqp, &rwqe, &rmax_sge);

		if (taken == TAKE_EMPTY) {
			/* Receiver not ready: wait and retry, rnr_retry times (7: forever). */
			if (qp->attr.rnr_retry != RNR_INFINITE && qp->rnr_left == 0) {
				status = VRDMA_WC_RNR_RETRY_EXC_ERR;
				goto local_error;
			}
			if (qp->attr.rnr_retry != RNR_INFINITE)
				qp->rnr_left--;
			qp->rnr_until = e->now + (int64_t)rnr_timer_us[dqp->attr.min_rnr_timer & 31] * 1000;
			d->counters.rnr_waits++;
			return EXEC_WAIT;
		}
		if (taken == TAKE_BROKEN) {
			qp_to_error(e, dd, dqp, VRDMA_EVENT_QP_FATAL);
			complete_send(e, d, qp, &w->hdr, VRDMA_WC_REM_OP_ERR, 0);
			qp_to_error(e, d, qp, 0);
			return EXEC_DONE;
		}
		struct vrdma_cqe rcqe = { .wr_id = rwqe.hdr.wr_id, .opcode = VRDMA_WC_OP_RECV, .byte_len = (uint32_t)len,
					  .qp_num = dqp->cfg.qpn, .src_qp = qp->cfg.qpn };
		uint8_t rstatus = VRDMA_WC_SUCCESS;
		uint64_t room = 0;

		if (op == VRDMA_WR_RDMA_WRITE_WITH_IMM) {
			rcqe.opcode = VRDMA_WC_OP_RECV_RDMA_WITH_IMM;
		} else if (rwqe.hdr.num_sge > rmax_sge) {
			rstatus = VRDMA_WC_LOC_QP_OP_ERR;
		} else {
			rstatus = sges_to_segs(dd, dqp->cfg.pd, rwqe.sge, rwqe.hdr.num_sge, true, UINT64_MAX, remote,
					       &nremote, &room);
			if (rstatus == VRDMA_WC_SUCCESS && room < len)
				rstatus = VRDMA_WC_LOC_LEN_ERR;
		}
		if (rstatus != VRDMA_WC_SUCCESS) {
			rcqe.status = rstatus;
			rcqe.byte_len = 0;
			cq_push(e, dd, dd->cqs[dqp->cfg.recv_cq], &rcqe, false);
			qp_to_error(e, dd, dqp, VRDMA_EVENT_QP_REQ_ERR);
			complete_send(e, d, qp, &w->hdr, rstatus == VRDMA_WC_LOC_LEN_ERR ? VRDMA_WC_REM_INV_REQ_ERR :
				      VRDMA_WC_REM_OP_ERR, 0);
			qp_to_error(e, d, qp, 0);
			return EXEC_DONE;
		}
		if (op == VRDMA_WR_RDMA_WRITE_WITH_IMM) {
			if (rmr) {
				struct seg dst = { .mem = &rmr->mem, .off = roff, .len = len };

				copy_segs(&dst, 1, local, nlocal);
			}
		} else {
			copy_segs(remote, nremote, local, nlocal);
		}
		if (op != VRDMA_WR_SEND) {
			rcqe.imm_data = w->hdr.imm_data;
			rcqe.wc_flags = VRDMA_WC_WITH_IMM;
		}
		d->counters.bytes += len;
		dd->counters.bytes += len;
		cq_push(e, dd, dd->cqs[dqp->cfg.recv_cq], &rcqe, w->hdr.send_flags & VRDMA_SEND_SOLICITED);
	} else if (op == VRDMA_WR_RDMA_WRITE) {
		if (len) {
			struct seg dst = { .mem = &rmr->mem, .off = roff, .len = len };

			copy_segs(&dst, 1, local, nlocal);
		}
		d->counters.bytes += len;
		dd->counters.bytes += len;
	} else if (op == VRDMA_WR_RDMA_READ) {
		if (len) {
			struct seg src = { .mem = &rmr->mem, .off = roff, .len = len };

			copy_segs(local, nlocal, &src, 1);
		}
		d->counters.bytes += len;
		dd->counters.bytes += len;
	} else {
		/* Atomics: 8 aligned bytes, so inside one page of the MR; the original value goes back. */
		uint64_t *target = (uint64_t *)mem_at(&rmr->mem, roff), original;
		struct seg src = { .buf = (const uint8_t *)&original, .len = 8 };

		if ((uintptr_t)target & 7) {
			status = VRDMA_WC_REM_INV_REQ_ERR;
			goto local_error;
		}
		if (op == VRDMA_WR_ATOMIC_CMP_AND_SWP) {
			original = w->hdr.compare_add;
			__atomic_compare_exchange_n(target, &original, w->hdr.swap, false, __ATOMIC_SEQ_CST,
						    __ATOMIC_SEQ_CST);
		} else {
			original = __atomic_fetch_add(target, w->hdr.compare_add, __ATOMIC_SEQ_CST);
		}
		copy_segs(local, nlocal, &src, 1);
	}
	qp->rnr_left = qp->attr.rnr_retry;
	qp->retry_left = qp->attr.retry_cnt;
	complete_send(e, d, qp, &w->hdr, VRDMA_WC_SUCCESS, (uint32_t)len);
	return EXEC_DONE;

local_error:
	complete_send(e, d, qp, &w->hdr, status, 0);
	qp_to_error(e, d, qp, 0);
	return EXEC_DONE;
}

/* Run a QP's send queue: up to `budget` WQEs, in order; flush them in the error state. */
static uint32_t qp_poll(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, uint32_t budget)
{
	static struct send_wqe w;
	uint32_t prod, n = 0;
	uint32_t state = qp->attr.state;

	if (state != VRDMA_QPS_RTS && state != VRDMA_QPS_ERR)
		return 0;
	if (!qp->ring.valid) {
		qp_to_error(e, d, qp, VRDMA_EVENT_QP_FATAL);
		return 0;
	}
	if (qp->rnr_until) {
		if (e->now < qp->rnr_until)
			return 0;
		qp->rnr_until = 0;
	}
	prod = load_acquire(qp->sq_db);
	if (prod - qp->sq_head > qp->cfg.sq_depth) {
		/* More WQEs than the ring holds: the producer index is garbage. */
		qp_to_error(e, d, qp, VRDMA_EVENT_QP_FATAL);
		prod = qp->sq_head;
	}
	while (qp->sq_head != prod && n < budget) {
		memcpy(&w, mem_at(&qp->ring, qp->cfg.sq_offset + (uint64_t)(qp->sq_head & (qp->cfg.sq_depth - 1)) *
				  qp->cfg.sq_stride), qp->cfg.sq_stride);
		n++;
		if (qp->attr.state == VRDMA_QPS_ERR) {
			complete_send(e, d, qp, &w.hdr, VRDMA_WC_WR_FLUSH_ERR, 0);
			d->counters.flushed++;
		} else if (execute_send(e, d, qp, &w) == EXEC_WAIT) {
			break;
		}
	}
	if (qp->attr.state == VRDMA_QPS_ERR && n < budget)
		n += flush_recv(e, d, qp, budget - n);
	return n;
}

uint32_t vre_poll(struct vre_engine *e, uint32_t budget)
{
	uint32_t work = 0;

	e->now = monotonic_ns();
	for (uint32_t i = 0; i < e->ndevices; i++) {
		struct vre_device *d = &e->devices[i];

		if (!d->open)
			continue;
		for (uint32_t j = 0; j < d->nactive; j++)
			work += qp_poll(e, d, d->active[j], budget);
		cq_timers(e, d);
	}
	return work;
}

/*
 * Poll for spin_ns, doing whatever work appears, and return early only when there are events to deliver (the
 * model delivers them through virtqueues): the hot loop stays in C, where noticing a doorbell takes one pass over
 * the send queues instead of a turn of the Python event loop. Returns the work done.
 */
uint32_t vre_spin(struct vre_engine *e, uint32_t budget, uint64_t spin_ns)
{
	int64_t until = monotonic_ns() + (int64_t)spin_ns;
	uint32_t work = 0;

	do {
		work += vre_poll(e, budget);
		if (e->ev_head != e->ev_tail)
			break;
		__builtin_ia32_pause();
	} while (e->now < until);
	return work;
}

int64_t vre_next_deadline(struct vre_engine *e)
{
	int64_t next = -1;

	for (uint32_t i = 0; i < e->ndevices; i++) {
		struct vre_device *d = &e->devices[i];

		for (uint32_t j = 0; d->open && j < d->nactive; j++) {
			int64_t t = d->active[j]->rnr_until;

			if (t && (next < 0 || t < next))
				next = t;
		}
		if (d->open && d->mod_next && (next < 0 || d->mod_next < next))
			next = d->mod_next;
	}
	return next;
}

static void set_parked_flags(struct vre_engine *e, uint32_t value)
{
	for (uint32_t i = 0; i < e->ndevices; i++) {
		struct vre_device *d = &e->devices[i];

		for (uint32_t p = 1; d->open && p < d->lim.doorbell_pages; p++)
			store_release((volatile uint32_t *)(d->doorbells + (size_t)p * VRDMA_DOORBELL_PAGE_SIZE) +
				      VRDMA_DB_SLOT_PARKED, value);
	}
}

/* Tell every poster to wake us, then look once more: a doorbell rung before it read the flag is seen here. */
int vre_park(struct vre_engine *e)
{
	set_parked_flags(e, 1);
	e->parked = true;
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	for (uint32_t i = 0; i < e->ndevices; i++) {
		struct vre_device *d = &e->devices[i];

		for (uint32_t j = 0; d->open && j < d->nactive; j++) {
			struct vre_qp *qp = d->active[j];

			if ((qp->attr.state == VRDMA_QPS_RTS || qp->attr.state == VRDMA_QPS_ERR) &&
			    load_acquire(qp->sq_db) != qp->sq_head && !qp->rnr_until) {
				vre_unpark(e);
				return 0;
			}
		}
	}
	return 1;
}

void vre_unpark(struct vre_engine *e)
{
	if (!e->parked)
		return;
	e->parked = false;
	set_parked_flags(e, 0);
}

uint32_t vre_take_events(struct vre_engine *e, struct vre_event *out, uint32_t max)
{
	uint32_t n = 0;

	while (e->ev_head != e->ev_tail && n < max)
		out[n++] = e->events[e->ev_head++ % EVENT_RING];
	return n;
}

/* -- engine and devices ----------------------------------------------------------------------------------- */

struct vre_engine *vre_engine_new(uint32_t max_devices)
{
	struct vre_engine *e = calloc(1, sizeof(*e));

	if (!e)
		return NULL;
	e->devices = calloc(max_devices, sizeof(*e->devices));
	if (!e->devices) {
		free(e);
		return NULL;
	}
	e->ndevices = max_devices;
	return e;
}

void vre_engine_free(struct vre_engine *e)
{
	if (!e)
		return;
	for (uint32_t i = 0; i < e->ndevices; i++)
		vre_device_close(e, i);
	free(e->devices);
	free(e);
}

const char *vre_error(struct vre_engine *e)
{
	return e->error;
}

int vre_device_open(struct vre_engine *e, uint32_t dev, const struct vre_device_limits *limits,
		    uint64_t doorbell_base)
{
	struct vre_device *d;

	if (dev >= e->ndevices)
		return fail(e, EINVAL, "device %u out of range", dev);
	d = &e->devices[dev];
	if (d->open)
		return fail(e, EBUSY, "device %u is open", dev);
	if (!is_pow2(limits->max_qp) || !is_pow2(limits->max_cq) || !is_pow2(limits->max_mr) ||
	    !is_pow2(limits->max_srq) || limits->max_sge > VRDMA_PAGE_SIZE / sizeof(struct vrdma_sge) ||
	    limits->max_inline > VRDMA_PAGE_SIZE - sizeof(struct vrdma_send_wqe) || !limits->max_pages_total ||
	    !doorbell_base)
		return fail(e, EINVAL, "unusable device limits");
	memset(d, 0, sizeof(*d));
	d->lim = *limits;
	d->doorbells = (uint8_t *)(uintptr_t)doorbell_base;
	d->mrs = calloc(limits->max_mr, sizeof(*d->mrs));
	d->cqs = calloc(limits->max_cq, sizeof(*d->cqs));
	d->srqs = calloc(limits->max_srq, sizeof(*d->srqs));
	d->qps = calloc(limits->max_qp, sizeof(*d->qps));
	d->active = calloc(limits->max_qp, sizeof(*d->active));
	if (!d->mrs || !d->cqs || !d->srqs || !d->qps || !d->active) {
		free(d->mrs);
		free(d->cqs);
		free(d->srqs);
		free(d->qps);
		free(d->active);
		return fail(e, ENOMEM, "no memory for device %u", dev);
	}
	d->open = true;
	if (e->parked)
		set_parked_flags(e, 1);
	return 0;
}

void vre_device_close(struct vre_engine *e, uint32_t dev)
{
	struct vre_device *d = device(e, dev);

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
	free(d->mrs);
	free(d->cqs);
	free(d->srqs);
	free(d->qps);
	free(d->active);
	memset(d, 0, sizeof(*d));
}

/* Objects keep their guest-physical pages: translate them again; what no longer maps is unusable. */
static void retranslate_all(struct vre_device *d)
{
	for (uint32_t i = 0; i < d->lim.max_mr; i++)
		if (d->mrs[i])
			mem_retranslate(d, &d->mrs[i]->mem);
	for (uint32_t i = 0; i < d->lim.max_cq; i++)
		if (d->cqs[i])
			mem_retranslate(d, &d->cqs[i]->ring);
	for (uint32_t i = 0; i < d->lim.max_srq; i++)
		if (d->srqs[i])
			mem_retranslate(d, &d->srqs[i]->ring);
	for (uint32_t i = 0; i < d->lim.max_qp; i++)
		if (d->qps[i])
			mem_retranslate(d, &d->qps[i]->ring);
}

int vre_device_set_memory(struct vre_engine *e, uint32_t dev, const struct vre_region *regions, uint32_t count)
{
	struct vre_device *d = device(e, dev);

	if (!d)
		return fail(e, ENODEV, "device %u is not open", dev);
	if (count > MAX_REGIONS)
		return fail(e, EINVAL, "%u memory regions (at most %u)", count, MAX_REGIONS);
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
			return fail(e, EINVAL, "memory region %u (guest %#llx at %#llx) is not page-aligned", i,
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
	struct vre_device *d = device(e, dev);

	if (d)
		*out = d->counters;
	else
		memset(out, 0, sizeof(*out));
}

static volatile uint32_t *db_slot(struct vre_device *d, uint32_t page, uint32_t slot)
{
	if (page == 0 || page >= d->lim.doorbell_pages || slot == VRDMA_DB_SLOT_PARKED || slot >= DB_WORDS)
		return NULL;
	return (volatile uint32_t *)(d->doorbells + (size_t)page * VRDMA_DOORBELL_PAGE_SIZE) + slot;
}

/* -- objects ------------------------------------------------------------------------------------------------ */

int vre_mr_create(struct vre_engine *e, uint32_t dev, uint32_t slot, const struct vre_mr_config *c)
{
	struct vre_device *d = device(e, dev);
	struct vre_mr *mr;
	int ret;

	if (!d || slot >= d->lim.max_mr || d->mrs[slot])
		return fail(e, EINVAL, "MR slot %u unusable", slot);
	if ((c->lkey & (d->lim.max_mr - 1)) != slot || (c->rkey & (d->lim.max_mr - 1)) != slot)
		return fail(e, EINVAL, "MR keys do not name slot %u", slot);
	if (c->page_offset >= PAGE_SIZE || c->length > (uint64_t)c->pages.npages * PAGE_SIZE - c->page_offset ||
	    c->iova + c->length < c->iova)
		return fail(e, EINVAL, "MR of %llu bytes at page offset %u does not fit its %u pages",
			    (unsigned long long)c->length, c->page_offset, c->pages.npages);
	mr = calloc(1, sizeof(*mr));
	if (!mr)
		return fail(e, ENOMEM, "no memory for an MR");
	mr->cfg = *c;
	ret = mem_load(e, d, &c->pages, d->lim.max_mr_pages, &mr->mem);
	if (ret) {
		free(mr);
		return ret;
	}
	d->mrs[slot] = mr;
	return 0;
}

void vre_mr_destroy(struct vre_engine *e, uint32_t dev, uint32_t slot)
{
	struct vre_device *d = device(e, dev);

	if (!d || slot >= d->lim.max_mr || !d->mrs[slot])
		return;
	mem_put(d, &d->mrs[slot]->mem);
	free(d->mrs[slot]);
	d->mrs[slot] = NULL;
}

int vre_cq_create(struct vre_engine *e, uint32_t dev, uint32_t slot, const struct vre_cq_config *c)
{
	struct vre_device *d = device(e, dev);
	struct vre_cq *cq;
	int ret;

	if (!d || slot >= d->lim.max_cq || d->cqs[slot])
		return fail(e, EINVAL, "CQ slot %u unusable", slot);
	if (!is_pow2(c->entries) || c->entries > d->lim.max_cqe ||
	    (uint64_t)c->ring.npages * PAGE_SIZE < PAGE_SIZE + (uint64_t)c->entries * sizeof(struct vrdma_cqe))
		return fail(e, EINVAL, "CQ of %u entries does not fit %u pages", c->entries, c->ring.npages);
	if (!db_slot(d, c->db_page, c->db_slot))
		return fail(e, EINVAL, "CQ doorbell slot %u:%u unusable", c->db_page, c->db_slot);
	cq = calloc(1, sizeof(*cq));
	if (!cq)
		return fail(e, ENOMEM, "no memory for a CQ");
	cq->cfg = *c;
	ret = mem_load(e, d, &c->ring, d->lim.max_mr_pages, &cq->ring);
	if (ret) {
		free(cq);
		return ret;
	}
	cq->arm = db_slot(d, c->db_page, c->db_slot);
	store_release(cq->arm, 0);
	memset(mem_at(&cq->ring, 0), 0, sizeof(struct vrdma_cq_ring_hdr));
	d->cqs[slot] = cq;
	return 0;
}

int vre_cq_moderate(struct vre_engine *e, uint32_t dev, uint32_t slot, uint32_t count, uint32_t period_us)
{
	struct vre_device *d = device(e, dev);
	struct vre_cq *cq;

	if (!d || slot >= d->lim.max_cq || !d->cqs[slot])
		return fail(e, EINVAL, "no CQ in slot %u", slot);
	cq = d->cqs[slot];
	cq->mod_count = count;
	cq->mod_period_us = period_us;
	if (count <= 1 && !period_us && cq->mod_pending)
		cq_announce(e, d, cq, load_acquire(cq->arm));  /* nothing held back any longer */
	return 0;
}

void vre_cq_destroy(struct vre_engine *e, uint32_t dev, uint32_t slot)
{
	struct vre_device *d = device(e, dev);

	if (!d || slot >= d->lim.max_cq || !d->cqs[slot])
		return;
	mem_put(d, &d->cqs[slot]->ring);
	free(d->cqs[slot]);
	d->cqs[slot] = NULL;
}

int vre_srq_create(struct vre_engine *e, uint32_t dev, uint32_t slot, const struct vre_srq_config *c)
{
	struct vre_device *d = device(e, dev);
	struct vre_srq *srq;
	int ret;

	if (!d || slot >= d->lim.max_srq || d->srqs[slot])
		return fail(e, EINVAL, "SRQ slot %u unusable", slot);
	if (!is_pow2(c->depth) || c->depth > d->lim.max_srq_wr || !is_pow2(c->stride) || c->stride < 32 ||
	    c->stride > PAGE_SIZE || c->max_sge > d->lim.max_sge ||
	    sizeof(struct vrdma_recv_wqe) + (uint64_t)c->max_sge * sizeof(struct vrdma_sge) > c->stride ||
	    (uint64_t)c->ring.npages * PAGE_SIZE < PAGE_SIZE + (uint64_t)c->depth * c->stride)
		return fail(e, EINVAL, "SRQ layout (depth %u, stride %u, %u SGEs, %u pages) is not usable", c->depth,
			    c->stride, c->max_sge, c->ring.npages);
	if (!db_slot(d, c->db_page, c->db_slot))
		return fail(e, EINVAL, "SRQ doorbell slot %u:%u unusable", c->db_page, c->db_slot);
	srq = calloc(1, sizeof(*srq));
	if (!srq)
		return fail(e, ENOMEM, "no memory for an SRQ");
	srq->cfg = *c;
	ret = mem_load(e, d, &c->ring, d->lim.max_mr_pages, &srq->ring);
	if (ret) {
		free(srq);
		return ret;
	}
	srq->db = db_slot(d, c->db_page, c->db_slot);
	store_release(srq->db, 0);
	srq->limit = c->limit;
	memset(mem_at(&srq->ring, 0), 0, sizeof(struct vrdma_srq_ring_hdr));
	d->srqs[slot] = srq;
	return 0;
}

int vre_srq_set_limit(struct vre_engine *e, uint32_t dev, uint32_t slot, uint32_t limit)
{
	struct vre_device *d = device(e, dev);

	if (!d || slot >= d->lim.max_srq || !d->srqs[slot])
		return fail(e, EINVAL, "no SRQ in slot %u", slot);
	d->srqs[slot]->limit = limit;
	return 0;
}

/* The armed limit: 0 once the limit event fired (IB: the limit disarms itself). */
int vre_srq_limit(struct vre_engine *e, uint32_t dev, uint32_t slot)
{
	struct vre_device *d = device(e, dev);

	if (!d || slot >= d->lim.max_srq || !d->srqs[slot])
		return fail(e, EINVAL, "no SRQ in slot %u", slot);
	return (int)d->srqs[slot]->limit;
}

void vre_srq_destroy(struct vre_engine *e, uint32_t dev, uint32_t slot)
{
	struct vre_device *d = device(e, dev);

	if (!d || slot >= d->lim.max_srq || !d->srqs[slot])
		return;
	mem_put(d, &d->srqs[slot]->ring);
	free(d->srqs[slot]);
	d->srqs[slot] = NULL;
}

/* A ring of `depth` entries of `stride` bytes at `offset` lies in [start, end) of the buffer. */
static bool ring_fits(uint32_t depth, uint32_t stride, uint32_t offset, uint64_t end)
{
	return offset >= PAGE_SIZE && !(offset & (PAGE_SIZE - 1)) && offset <= end &&
	       (uint64_t)depth * stride <= end - offset;
}

/* The most pages a QP ring may have: its header page and its queues, each queue rounded up to whole pages. The
 * offsets may place the queues anywhere in that, but not add pages nothing uses (each costs a translation). */
static uint64_t qp_ring_pages(uint32_t sq_depth, uint32_t sq_stride, uint32_t rq_depth, uint32_t rq_stride)
{
	return 1 + DIV_ROUND_UP((uint64_t)sq_depth * sq_stride, PAGE_SIZE) +
	       DIV_ROUND_UP((uint64_t)rq_depth * rq_stride, PAGE_SIZE);
}

int vre_qp_create(struct vre_engine *e, uint32_t dev, uint32_t slot, const struct vre_qp_config *c)
{
	struct vre_device *d = device(e, dev);
	uint64_t size = (uint64_t)c->ring.npages * PAGE_SIZE;
	bool own_rq = c->srq == VRE_NO_SRQ;
	struct vre_qp *qp;
	int ret;

	if (!d || slot >= d->lim.max_qp || d->qps[slot] || (c->qpn & (d->lim.max_qp - 1)) != slot)
		return fail(e, EINVAL, "QP slot %u unusable", slot);
	if (c->send_cq >= d->lim.max_cq || !d->cqs[c->send_cq] || c->recv_cq >= d->lim.max_cq ||
	    !d->cqs[c->recv_cq] || (!own_rq && (c->srq < 0 || (uint32_t)c->srq >= d->lim.max_srq ||
					       !d->srqs[c->srq])))
		return fail(e, EINVAL, "QP names a CQ or SRQ that does not exist");
	if (!is_pow2(c->sq_depth) || c->sq_depth > d->lim.max_qp_wr || !is_pow2(c->sq_stride) ||
	    c->sq_stride < sizeof(struct vrdma_send_wqe) || c->sq_stride > PAGE_SIZE ||
	    c->max_send_sge > d->lim.max_sge || c->max_inline > d->lim.max_inline ||
	    sizeof(struct vrdma_send_wqe) + (uint64_t)c->max_send_sge * sizeof(struct vrdma_sge) > c->sq_stride ||
	    sizeof(struct vrdma_send_wqe) + (uint64_t)c->max_inline > c->sq_stride ||
	    !ring_fits(c->sq_depth, c->sq_stride, c->sq_offset, own_rq ? c->rq_offset : size))
		return fail(e, EINVAL, "send queue layout (depth %u, stride %u, offset %u, %u SGEs, %u inline) is "
			    "not usable", c->sq_depth, c->sq_stride, c->sq_offset, c->max_send_sge, c->max_inline);
	if (own_rq && (!is_pow2(c->rq_depth) || c->rq_depth > d->lim.max_qp_wr || !is_pow2(c->rq_stride) ||
		       c->rq_stride < 32 || c->rq_stride > PAGE_SIZE || c->max_recv_sge > d->lim.max_sge ||
		       sizeof(struct vrdma_recv_wqe) + (uint64_t)c->max_recv_sge * sizeof(struct vrdma_sge) >
		       c->rq_stride || !ring_fits(c->rq_depth, c->rq_stride, c->rq_offset, size)))
		return fail(e, EINVAL, "receive queue layout (depth %u, stride %u, offset %u, %u SGEs) is not usable",
			    c->rq_depth, c->rq_stride, c->rq_offset, c->max_recv_sge);
	if (c->ring.npages > qp_ring_pages(c->sq_depth, c->sq_stride, own_rq ? c->rq_depth : 0, c->rq_stride))
		return fail(e, EINVAL, "QP ring of %u pages: its header and queues need %llu", c->ring.npages,
			    (unsigned long long)qp_ring_pages(c->sq_depth, c->sq_stride, own_rq ? c->rq_depth : 0,
							      c->rq_stride));
	if (!db_slot(d, c->db_page, c->sq_db_slot) || (own_rq && !db_slot(d, c->db_page, c->rq_db_slot)))
		return fail(e, EINVAL, "QP doorbell slots unusable");
	qp = calloc(1, sizeof(*qp));
	if (!qp)
		return fail(e, ENOMEM, "no memory for a QP");
	qp->cfg = *c;
	ret = mem_load(e, d, &c->ring, d->lim.max_mr_pages, &qp->ring);
	if (ret) {
		free(qp);
		return ret;
	}
	qp->sq_db = db_slot(d, c->db_page, c->sq_db_slot);
	qp->rq_db = own_rq ? db_slot(d, c->db_page, c->rq_db_slot) : NULL;
	store_release(qp->sq_db, 0);
	if (qp->rq_db)
		store_release(qp->rq_db, 0);
	memset(mem_at(&qp->ring, 0), 0, sizeof(struct vrdma_qp_ring_hdr));
	qp->attr.state = VRDMA_QPS_RESET;
	qp->attr.dest_dev = VRE_NO_DEVICE;
	qp->index = d->nactive;
	d->active[d->nactive++] = qp;
	d->qps[slot] = qp;
	return 0;
}

int vre_qp_modify(struct vre_engine *e, uint32_t dev, uint32_t slot, const struct vre_qp_attr *attr)
{
	struct vre_device *d = device(e, dev);
	struct vre_qp *qp;

	if (!d || slot >= d->lim.max_qp || !d->qps[slot])
		return fail(e, EINVAL, "no QP in slot %u", slot);
	qp = d->qps[slot];
	if (attr->state == VRDMA_QPS_ERR) {
		uint32_t old = qp->attr.state;

		qp->attr = *attr;
		qp->attr.state = old;
		qp_to_error(e, d, qp, 0);  /* no-op when already in error */
		return 0;
	}
	qp->attr = *attr;
	qp->rnr_left = attr->rnr_retry;
	qp->retry_left = attr->retry_cnt;
	if (attr->state == VRDMA_QPS_RESET) {
		/* Empty queues: both sides start counting from zero again. */
		qp->sq_head = qp->rq_cons = 0;
		qp->rnr_until = 0;
		/* The ring may be gone from the memory table (its pages no longer translate): nothing to tell. */
		if (qp->ring.valid) {
			struct vrdma_qp_ring_hdr *hdr = (struct vrdma_qp_ring_hdr *)mem_at(&qp->ring, 0);

			store_release(&hdr->sq_cons, 0);
			store_release(&hdr->rq_cons, 0);
		}
	}
	return 0;
}

int vre_qp_state(struct vre_engine *e, uint32_t dev, uint32_t slot)
{
	struct vre_device *d = device(e, dev);

	if (!d || slot >= d->lim.max_qp || !d->qps[slot])
		return fail(e, EINVAL, "no QP in slot %u", slot);
	return (int)d->qps[slot]->attr.state;
}

void vre_qp_destroy(struct vre_engine *e, uint32_t dev, uint32_t slot)
{
	struct vre_device *d = device(e, dev);
	struct vre_qp *qp;

	if (!d || slot >= d->lim.max_qp || !d->qps[slot])
		return;
	qp = d->qps[slot];
	d->active[qp->index] = d->active[--d->nactive];
	d->active[qp->index]->index = qp->index;
	mem_put(d, &qp->ring);
	free(qp);
	d->qps[slot] = NULL;
}
