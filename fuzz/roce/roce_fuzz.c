// SPDX-License-Identifier: GPL-2.0-only
/*
 * libFuzzer harness for the RoCE transport's state: the requester, responder and the one input every packet goes
 * through (backend/vrdma/engine/net.c, rreq.c, rresp.c), stateful, in process (fuzz/build.py builds it with
 * AddressSanitizer and UndefinedBehaviorSanitizer, the engine's C files linked in as they are).
 *
 * One input is one execution: two hosts, each an engine with one device (vre_net_capture: no sockets;
 * vre_clock_set: a clock only the harness moves), a guest memory arena each between guard pages, a CQ, two QPs
 * connected to the other host's (RC, or one UC pair) and an MR; the attributes (path MTU, first PSNs near or across
 * the 24-bit wrap, max_rd_atomic, timeout, retry counts) come from the input's header. Then operations, one byte
 * each and their operands: the guests post work requests of every kind the transport carries and receives, the
 * engines poll, the network between them carries the packets they sent in order, drops, duplicates, delays or
 * reorders them, and a forger sends packets mutated from the traffic seen so far (another PSN, opcode, syndrome,
 * QPN, length, payload byte, a truncation, with a valid or a broken ICRC) to either host; the clocks step to the
 * next timer. The seed corpus (fuzz/roce/seeds.py) replays the in-process RoCE tests' scenarios in this format.
 *
 * Oracles, beyond the sanitizers: after every operation each engine's transport state holds its invariants
 * (vre_check); completions come once each, in the order the work requests were posted; nothing outside the MRs and
 * rings is written (canary pages in guest memory, checked at the end); and once the input stops, a clean network
 * and the timers bring every posted send WQE to a completion or its QP to the error state within MAX_DRAIN rounds
 * (a QP never stalls); every packet given to an engine is counted exactly once (the network counters add up).
 */
#include <sanitizer/asan_interface.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "engine.h"
#include "input.h"
#include "vrdma_dev_api.h"

#define PAGE VRDMA_PAGE_SIZE
#define HOSTS 2
#define NQP 2
#define ARENA_PAGES 96
#define CQ_ENTRIES 256
#define SQ_DEPTH 16
#define SQ_STRIDE 128             /* a header and up to 4 SGEs */
#define RQ_DEPTH 16
#define RQ_STRIDE 128
#define MAX_SGE 4
/* Guest-physical layout, the same on both hosts (page numbers): */
#define PBL_PAGE 1                /* page lists: one page each, 1 + object */
#define CQ_PAGE 8                 /* header page, then CQ_ENTRIES CQEs (2 pages) */
#define QP_PAGE 11                /* QP n at QP_PAGE + 3n: header page, send queue page, receive queue page */
#define MR_PAGE 20                /* the MR: MR_PAGES pages */
#define MR_PAGES 48
#define CANARY_FIRST (MR_PAGE + MR_PAGES)   /* from here to the end: nobody's, never written */
#define CANARY 0xcc
#define MAX_OPS 512
#define MAX_INFLIGHT 1024
#define POOL 64                   /* packets seen on the wire, kept for the forger to mutate */
#define PKT_ROOM 9216
#define MAX_DRAIN 20000
#define POLL_BUDGET 64

#define CHECK(cond, ...)                                                                                      \
	do {                                                                                                  \
		if (!(cond)) {                                                                                \
			fprintf(stderr, "roce_fuzz: check failed at line %d: %s: ", __LINE__, #cond);         \
			fprintf(stderr, __VA_ARGS__);                                                         \
			fputc('\n', stderr);                                                                  \
			abort();                                                                              \
		}                                                                                             \
	} while (0)

struct packet {
	uint32_t len;
	struct vre_roce_addr addr;
	uint8_t data[PKT_ROOM];
};

struct qp_rec {
	uint32_t qpn;
	uint32_t sq_prod, rq_prod;
	uint32_t sq_done, rq_done;    /* completions seen, each in order */
	bool uc;
};

struct host {
	struct vre_engine *e;
	uint8_t *arena;               /* mapped once, guard pages around */
	uint8_t *doorbells;
	uint8_t gid[16];
	uint32_t cq_cons;
	uint32_t mr_lkey, mr_rkey;
	struct qp_rec qps[NQP];
	int64_t now;
};

static struct host hosts[HOSTS];
static struct packet inflight[MAX_INFLIGHT], pool[POOL], scratch;
static uint32_t ninflight, pool_next, pool_count;
static bool verbose;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint8_t *gpa_host(struct host *h, uint64_t gpa)
{
	return h->arena + gpa;
}

static uint64_t page_gpa(uint32_t page)
{
	return (uint64_t)page * PAGE;
}

/* A one-level page list in page `list` naming `npages` pages from `first` on. */
static struct vre_pages_desc pages(struct host *h, uint32_t list, uint32_t first, uint32_t npages)
{
	for (uint32_t i = 0; i < npages; i++) {
		uint64_t gpa = page_gpa(first + i);

		memcpy(gpa_host(h, page_gpa(list)) + 8 * i, &gpa, 8);
	}
	return (struct vre_pages_desc){ .addr = page_gpa(list), .npages = npages, .levels = 1 };
}

static void ring(struct host *h, uint32_t index, uint32_t value)
{
	__atomic_store_n((uint32_t *)(h->doorbells + 4 * (size_t)index), value, __ATOMIC_RELEASE);
}

static uint32_t sq_db(uint32_t qp)
{
	return VRDMA_DB_SLOTS + 2 + 2 * qp;   /* doorbell page 1 (the context's), slots after the CQ's */
}

static struct qp_rec *pick(struct in *in, struct host **h)
{
	uint8_t b = u8(in);

	*h = &hosts[b & 1];
	return &(*h)->qps[(b >> 1) % NQP];
}

/* -- set-up ---------------------------------------------------------------------------------------------------- */

static const struct vre_device_limits limits = {
	.max_qp = 4, .max_cq = 2, .max_mr = 4, .max_srq = 1, .max_sge = MAX_SGE, .max_inline = 64,
	.max_qp_wr = 256, .max_cqe = 4096, .max_srq_wr = 16, .max_mr_pages = 256, .doorbell_pages = 2,
	.max_pages_total = 4096, .max_msg_size = 1u << 20,
};

struct path {
	uint32_t mtu, psn[HOSTS][NQP], rd_atomic, timeout, retry_cnt, rnr_retry, min_rnr_timer;
	bool uc;
};

static void read_path(struct in *in, struct path *p)
{
	uint8_t flags = u8(in);

	p->mtu = 1 + u8(in) % 5;
	for (int i = 0; i < HOSTS; i++)
		for (int q = 0; q < NQP; q++)   /* near the 24-bit wrap now and then */
			p->psn[i][q] = (flags & 1 ? 0xffffff - u8(in) : u32(in)) & 0xffffff;
	p->rd_atomic = 1 + u8(in) % 8;
	p->timeout = 1 + u8(in) % 14;     /* 8 us to 67 ms: never 0, which waits for ever */
	p->retry_cnt = u8(in) % 8;
	p->rnr_retry = u8(in) % 7;        /* never 7, which retries for ever */
	p->min_rnr_timer = u8(in) % 32;
	p->uc = flags & 2;
}

static void setup_host(int i, const struct path *p)
{
	struct host *h = &hosts[i];
	struct vre_region region = { .gpa = 0, .size = (uint64_t)ARENA_PAGES * PAGE, .hva = (uint64_t)(uintptr_t)h->arena };
	struct vre_cq_config cq = { .handle = 1, .entries = CQ_ENTRIES, .db = VRDMA_DB_SLOTS + 1 };
	struct vre_mr_config mr = { .handle = 2, .pd = 1, .access = 0xf, .iova = 0x100000,
				    .length = (uint64_t)MR_PAGES * PAGE };

	memset(h->arena, 0, (size_t)ARENA_PAGES * PAGE);
	memset(h->arena + page_gpa(CANARY_FIRST), CANARY, (size_t)(ARENA_PAGES - CANARY_FIRST) * PAGE);
	memset(h->arena, CANARY, PAGE);  /* page 0 too */
	memset(h->doorbells, 0, 2 * PAGE);
	memset(h->gid, 0, 16);
	h->gid[10] = h->gid[11] = 0xff;
	h->gid[12] = 10;
	h->gid[15] = (uint8_t)(1 + i);
	h->cq_cons = 0;
	h->now = 1000000000;
	h->e = vre_engine_new(1);
	CHECK(h->e, "no engine");
	CHECK(vre_net_capture(h->e) == 0, "%s", vre_error(h->e));
	vre_clock_set(h->e, h->now);
	CHECK(vre_device_open(h->e, 0, &limits, (uint64_t)(uintptr_t)h->doorbells) == 0, "%s", vre_error(h->e));
	CHECK(vre_device_set_memory(h->e, 0, &region, 1) == 0, "%s", vre_error(h->e));
	CHECK(vre_gid_set(h->e, 0, 0, h->gid, VRDMA_GID_TYPE_ROCE_V2) == 0, "%s", vre_error(h->e));
	cq.ring = pages(h, PBL_PAGE, CQ_PAGE, 1 + CQ_ENTRIES * sizeof(struct vrdma_cqe) / PAGE);
	CHECK(vre_cq_create(h->e, 0, 0, &cq) == 0, "%s", vre_error(h->e));
	h->mr_lkey = 1 << VRDMA_KEY_SLOT_SHIFT | 0x11;
	h->mr_rkey = h->mr_lkey;
	mr.lkey = h->mr_lkey;
	mr.rkey = h->mr_rkey;
	mr.pages = pages(h, PBL_PAGE + 1, MR_PAGE, MR_PAGES);
	CHECK(vre_mr_create(h->e, 0, 1, &mr) == 0, "%s", vre_error(h->e));
	for (uint32_t q = 0; q < NQP; q++) {
		struct vre_qp_config c = {
			.handle = 10 + q, .qpn = 0x100 + q, .pd = 1, .sq_sig_all = 1, .send_cq = 0, .recv_cq = 0,
			.srq = VRE_NO_SRQ, .sq_depth = SQ_DEPTH, .rq_depth = RQ_DEPTH, .sq_stride = SQ_STRIDE,
			.rq_stride = RQ_STRIDE, .sq_offset = PAGE, .rq_offset = 2 * PAGE,
			.max_send_sge = MAX_SGE, .max_recv_sge = MAX_SGE, .max_inline = 64, .sq_db = sq_db(q),
			.rq_db = sq_db(q) + 1, .flags = q == 1 && p->uc ? VRE_QP_UC : 0,
		};

		c.ring = pages(h, PBL_PAGE + 2 + q, QP_PAGE + 3 * q, 3);
		CHECK(vre_qp_create(h->e, 0, q, &c) == 0, "%s", vre_error(h->e));
		h->qps[q] = (struct qp_rec){ .qpn = c.qpn, .uc = c.flags & VRE_QP_UC };
	}
}

static void connect_host(int i, const struct path *p)
{
	struct host *h = &hosts[i], *peer = &hosts[1 - i];

	for (uint32_t q = 0; q < NQP; q++) {
		struct vre_qp_attr a = {
			.access_flags = 0xe, .dest_dev = VRE_NO_DEVICE, .dest_qpn = peer->qps[q].qpn,
			.min_rnr_timer = p->min_rnr_timer, .rnr_retry = p->rnr_retry, .retry_cnt = p->retry_cnt,
			.timeout = p->timeout, .path_mtu = p->mtu, .sq_psn = p->psn[i][q], .rq_psn = p->psn[1 - i][q],
			.max_rd_atomic = p->rd_atomic, .max_dest_rd_atomic = p->rd_atomic,
		};

		memcpy(a.sgid, h->gid, 16);
		memcpy(a.dgid, peer->gid, 16);
		for (uint32_t state = VRDMA_QPS_INIT; state <= VRDMA_QPS_RTS; state++) {
			a.state = state;
			CHECK(vre_qp_modify(h->e, 0, q, &a) == 0, "%s", vre_error(h->e));
		}
	}
}

/* -- the guests ------------------------------------------------------------------------------------------------ */

static const uint8_t rc_opcodes[] = {
	VRDMA_WR_RDMA_WRITE, VRDMA_WR_RDMA_WRITE_WITH_IMM, VRDMA_WR_SEND, VRDMA_WR_SEND_WITH_IMM, VRDMA_WR_RDMA_READ,
	VRDMA_WR_ATOMIC_CMP_AND_SWP, VRDMA_WR_ATOMIC_FETCH_AND_ADD,
};

/* A range of the MR: mostly inside, now and then a few bytes past its end (the engine must refuse it). */
static void mr_range(struct in *in, uint32_t *off, uint32_t *len)
{
	uint32_t size = MR_PAGES * PAGE;
	uint8_t how = u8(in);

	*len = how & 1 ? u16(in) % 20000 : u8(in);
	*off = u32(in) % size;
	if (how & 2 && *len <= size)
		*off = size - *len + (how & 4 ? 8 : 0);
	if ((uint64_t)*off + *len > size && !(how & 4))
		*off = *len <= size ? size - *len : 0;
}

static void op_post_send(struct in *in)
{
	struct host *h, *peer;
	struct qp_rec *qp = pick(in, &h);
	uint8_t flags = u8(in), count = 1 + u8(in) % 4;

	peer = &hosts[h == &hosts[0]];
	for (uint8_t k = 0; k < count && qp->sq_prod - qp->sq_done < SQ_DEPTH; k++) {
		struct {
			struct vrdma_send_wqe hdr;
			struct vrdma_sge sge[MAX_SGE];
		} w = { 0 };
		uint32_t off, len, roff, rlen;

		w.hdr.opcode = rc_opcodes[u8(in) % (qp->uc ? 4 : sizeof(rc_opcodes))];
		w.hdr.wr_id = (uint64_t)(qp - h->qps) << 32 | qp->sq_prod;
		w.hdr.send_flags = VRDMA_SEND_SIGNALED | (flags & 1 ? VRDMA_SEND_FENCE : 0);
		w.hdr.imm_data = u32(in);
		mr_range(in, &off, &len);
		mr_range(in, &roff, &rlen);
		if (w.hdr.opcode == VRDMA_WR_ATOMIC_CMP_AND_SWP || w.hdr.opcode == VRDMA_WR_ATOMIC_FETCH_AND_ADD) {
			len = 8;
			off &= ~7u;
			roff &= ~7u;
			if (off + 8 > MR_PAGES * PAGE)
				off = 0;
			w.hdr.compare_add = u8(in);
			w.hdr.swap = u8(in);
		}
		w.hdr.num_sge = len ? 1 : 0;
		w.sge[0] = (struct vrdma_sge){ .addr = 0x100000 + off, .length = len, .lkey = h->mr_lkey };
		w.hdr.remote_addr = 0x100000 + (uint64_t)roff;
		w.hdr.rkey = flags & 2 ? u32(in) : peer->mr_rkey;   /* now and then a key the peer refuses */
		memcpy(gpa_host(h, page_gpa(QP_PAGE + 3 * (uint32_t)(qp - h->qps) + 1) +
				(size_t)(qp->sq_prod % SQ_DEPTH) * SQ_STRIDE), &w, sizeof(w));
		qp->sq_prod++;
	}
	ring(h, sq_db((uint32_t)(qp - h->qps)), qp->sq_prod);
}

static void op_post_recv(struct in *in)
{
	struct host *h;
	struct qp_rec *qp = pick(in, &h);
	uint8_t count = 1 + u8(in) % 4;

	for (uint8_t k = 0; k < count && qp->rq_prod - qp->rq_done < RQ_DEPTH; k++) {
		struct {
			struct vrdma_recv_wqe hdr;
			struct vrdma_sge sge[2];
		} w = { 0 };
		uint32_t off, len;

		mr_range(in, &off, &len);
		w.hdr.wr_id = (uint64_t)(qp - h->qps) << 32 | 1u << 31 | qp->rq_prod;
		w.hdr.num_sge = 1;
		w.sge[0] = (struct vrdma_sge){ .addr = 0x100000 + off, .length = len, .lkey = h->mr_lkey };
		memcpy(gpa_host(h, page_gpa(QP_PAGE + 3 * (uint32_t)(qp - h->qps) + 2) +
				(size_t)(qp->rq_prod % RQ_DEPTH) * RQ_STRIDE), &w, sizeof(w));
		qp->rq_prod++;
	}
	ring(h, sq_db((uint32_t)(qp - h->qps)) + 1, qp->rq_prod);
}

/* Completions, each once and in posting order per queue (a signaled send queue completes every WQE). */
static void consume(struct host *h)
{
	struct vrdma_cq_ring_hdr *hdr = (struct vrdma_cq_ring_hdr *)gpa_host(h, page_gpa(CQ_PAGE));
	uint32_t prod = __atomic_load_n(&hdr->prod, __ATOMIC_ACQUIRE);

	CHECK(!hdr->overflow, "the CQ overflowed (it holds more than every queue's depth)");
	CHECK(prod - h->cq_cons <= CQ_ENTRIES, "producer index %u ahead of %u by more than the ring", prod, h->cq_cons);
	for (; h->cq_cons != prod; h->cq_cons++) {
		const struct vrdma_cqe *c = (const struct vrdma_cqe *)gpa_host(h, page_gpa(CQ_PAGE) + PAGE) +
					    h->cq_cons % CQ_ENTRIES;
		uint32_t q = (uint32_t)(c->wr_id >> 32), seq = (uint32_t)c->wr_id & 0x7fffffff;
		bool recv = c->wr_id & (1u << 31);
		struct qp_rec *qp;

		if (verbose)
			fprintf(stderr, "host %d: %s %u of QP%u: status %u, %u bytes\n", (int)(h - hosts),
				recv ? "receive" : "send", seq, q, c->status, c->byte_len);
		CHECK(q < NQP, "a completion for no QP: wr_id %#llx", (unsigned long long)c->wr_id);
		qp = &h->qps[q];
		CHECK(c->qp_num == qp->qpn, "completion of QP %#x names %#x", qp->qpn, c->qp_num);
		if (recv) {
			CHECK(seq == qp->rq_done && seq != qp->rq_prod, "receive %u completed, expected %u (%u posted)", seq,
			      qp->rq_done, qp->rq_prod);
			qp->rq_done++;
		} else {
			CHECK(seq == qp->sq_done && seq != qp->sq_prod, "send %u completed, expected %u (%u posted)", seq,
			      qp->sq_done, qp->sq_prod);
			qp->sq_done++;
		}
	}
	__atomic_store_n(&hdr->cons, h->cq_cons, __ATOMIC_RELEASE);
}

/* -- the engines and the network ------------------------------------------------------------------------------- */

static void check_engine(struct host *h)
{
	CHECK(vre_check(h->e) == 0, "%s", vre_error(h->e));
}

/* One pass of a host's engine: the work it did. */
static uint32_t poll_host(struct host *h)
{
	struct vre_event ev[64];
	uint32_t work = vre_poll(h->e, POLL_BUDGET);

	while (vre_take_events(h->e, ev, 64) == 64)
		;
	check_engine(h);
	consume(h);
	return work;
}

static void keep(const struct packet *p)
{
	pool[pool_next++ % POOL] = *p;
	if (pool_count < POOL)
		pool_count++;
}

/* What the hosts sent, onto the network (in flight; kept for the forger); what does not fit is lost. */
static uint32_t collect(void)
{
	uint32_t n = 0;

	for (int i = 0; i < HOSTS; i++) {
		while ((scratch.len = vre_net_take(hosts[i].e, scratch.data, PKT_ROOM, &scratch.addr))) {
			CHECK(scratch.len <= PKT_ROOM, "a packet of %u bytes", scratch.len);
			keep(&scratch);
			if (ninflight < MAX_INFLIGHT)
				inflight[ninflight++] = scratch;
			n++;
		}
	}
	return n;
}

static void deliver(const struct packet *p)
{
	for (int i = 0; i < HOSTS; i++) {
		if (!memcmp(hosts[i].gid, p->addr.dst, 16)) {
			int ret = vre_roce_input(hosts[i].e, p->data, p->len, &p->addr);

			CHECK(ret <= 0, "vre_roce_input returned %d", ret);
			check_engine(&hosts[i]);
			consume(&hosts[i]);
		}
	}
}

static void pop(uint32_t n)
{
	n = n < ninflight ? n : ninflight;
	memmove(inflight, inflight + n, (ninflight - n) * sizeof(inflight[0]));
	ninflight -= n;
}

static void op_poll(struct in *in)
{
	poll_host(&hosts[u8(in) & 1]);
	collect();
}

/* The network: deliver the next packets in order, or lose, duplicate, hold back or reorder one. */
static void op_network(struct in *in)
{
	uint8_t how = u8(in);
	uint32_t n = 1 + (how >> 3);

	collect();
	if (!ninflight)
		return;
	switch (how & 7) {
	case 0: case 1: case 2:
		for (uint32_t i = 0; i < n && i < ninflight; i++)
			deliver(&inflight[i]);
		pop(n);
		break;
	case 3:  /* lost */
		pop(1);
		break;
	case 4:  /* duplicated */
		deliver(&inflight[0]);
		break;
	case 5:  /* the first held back behind the next n */
		if (ninflight > 1) {
			scratch = inflight[0];
			pop(1);
			for (uint32_t i = 0; i < n && i < ninflight; i++)
				deliver(&inflight[i]);
			pop(n);
			deliver(&scratch);
		}
		break;
	case 6:  /* two swapped */
		if (ninflight > 1) {
			scratch = inflight[0];
			inflight[0] = inflight[1];
			inflight[1] = scratch;
		}
		break;
	default:  /* everything, in order */
		for (uint32_t i = 0; i < ninflight; i++)
			deliver(&inflight[i]);
		pop(ninflight);
	}
}

/* The BTH's fields at their places in the UDP payload (big endian). */
static void put_be24(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 16);
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)v;
}

/*
 * A forger: a packet seen on the wire, changed, sent to either host. Parsed and built again through the engine's
 * own builder (so that its ICRC is valid and it reaches the transport), or changed as raw bytes (its ICRC most
 * likely broken).
 */
static void op_forge(struct in *in)
{
	uint8_t how = u8(in), what = u8(in);
	struct vre_roce_pkt pkt;
	struct packet *p;

	collect();
	if (!pool_count)
		return;
	scratch = pool[u8(in) % pool_count];
	p = &scratch;
	if (how & 1)  /* the other way: as if from the destination to the source */
		memcpy(p->addr.dst, hosts[(how >> 1) & 1].gid, 16);
	if (how & 4) {  /* raw damage */
		uint32_t at = u16(in) % p->len;

		if (what & 1)
			p->len = at;
		else
			p->data[at] ^= u8(in) | 1;
		deliver(p);
		return;
	}
	if (vre_roce_parse(p->data, p->len, &p->addr, &pkt))
		return;
	switch (what % 8) {
	case 0: pkt.psn = (pkt.psn + (uint32_t)(int8_t)u8(in)) & 0xffffff; break;
	case 1: pkt.psn = u32(in) & 0xffffff; break;
	case 2: pkt.opcode = (uint8_t)((pkt.opcode & 0xe0) | (u8(in) & 0x1f)); break;
	case 3: pkt.aeth = (uint32_t)u8(in) << 24 | (pkt.aeth & 0xffffff); break;
	case 4: pkt.dest_qpn = hosts[0].qps[u8(in) % NQP].qpn; break;
	case 5: pkt.dma_len = u32(in) % 70000; pkt.va += u16(in); break;
	case 6: pkt.rkey = u32(in); break;
	default: pkt.ackreq ^= 1; pkt.psn = (pkt.psn + 1) & 0xffffff; break;
	}
	{
		uint8_t payload[PKT_ROOM];
		uint32_t plen = pkt.payload_len;
		int n;

		if (what & 8)
			plen = u16(in) % 4200;
		memset(payload, u8(in), plen);
		if (pkt.payload_len && plen)
			memcpy(payload, p->data + pkt.payload_off, plen < pkt.payload_len ? plen : pkt.payload_len);
		n = vre_roce_build(scratch.data, PKT_ROOM, &p->addr, &pkt, payload, plen);
		if (n < 0) {  /* an opcode that cannot carry that: the BTH changed in place, ICRC now wrong */
			put_be24(p->data + 9, pkt.psn);  /* the BTH's PSN: bytes 9 to 11 */
			deliver(p);
			return;
		}
		scratch.len = (uint32_t)n;
	}
	deliver(p);
}

/* Time passes: to the next timer (a retransmission, an RNR wait), or a little. */
static void advance(int64_t ns)
{
	for (int i = 0; i < HOSTS; i++) {
		hosts[i].now += ns;
		vre_clock_set(hosts[i].e, hosts[i].now);
	}
}

static int64_t next_deadline(void)
{
	int64_t next = -1;

	for (int i = 0; i < HOSTS; i++) {
		int64_t t = vre_next_deadline(hosts[i].e);

		if (t >= 0 && (next < 0 || t < next))
			next = t;
	}
	return next;
}

static void op_tick(struct in *in)
{
	int64_t next = next_deadline();
	uint8_t how = u8(in);

	if (how & 1 && next > hosts[0].now)
		advance(next - hosts[0].now);
	else
		advance((int64_t)(how >> 1) * 1000);
}

typedef void (*op_fn)(struct in *in);

static const op_fn ops[] = {
	op_post_send, op_post_send, op_post_recv, op_poll, op_poll, op_network, op_network, op_network, op_forge,
	op_tick,
};
#define OP_COUNT (sizeof(ops) / sizeof(ops[0]))

/* -- after the input ------------------------------------------------------------------------------------------- */

/* Every posted send WQE completed (successfully, in error, or flushed by a QP in the error state). */
static bool settled(void)
{
	for (int i = 0; i < HOSTS; i++)
		for (uint32_t q = 0; q < NQP; q++)
			if (hosts[i].qps[q].sq_done != hosts[i].qps[q].sq_prod)
				return false;
	return true;
}

/* What each host did so far, for a report. */
static void report(void)
{
	for (int i = 0; i < HOSTS; i++) {
		struct vre_roce_counters roce;

		vre_device_roce_counters(hosts[i].e, 0, &roce);
		fprintf(stderr, "host %d: sent %llu, took %llu, retransmitted %llu, timeouts %llu, seq NAKs %llu, "
			"RNR NAKs %llu, duplicates %llu, dropped %llu", i, (unsigned long long)roce.tx_packets,
			(unsigned long long)roce.rx_packets, (unsigned long long)roce.retransmits,
			(unsigned long long)roce.timeouts, (unsigned long long)roce.seq_naks,
			(unsigned long long)roce.rnr_naks, (unsigned long long)roce.duplicates,
			(unsigned long long)roce.dropped);
		for (uint32_t q = 0; q < NQP; q++)
			fprintf(stderr, "; QP%u (state %d) sends %u/%u, receives %u/%u", q, vre_qp_state(hosts[i].e, 0, q),
				hosts[i].qps[q].sq_done, hosts[i].qps[q].sq_prod, hosts[i].qps[q].rq_done,
				hosts[i].qps[q].rq_prod);
		fputc('\n', stderr);
	}
}

/* A clean network and the timers: every posted send WQE completes within MAX_DRAIN rounds (its own completion, or
 * its QP's error and the flush). A round in which no engine did anything and nothing was sent, with no timer
 * armed and work not completed, is a stall. */
static void drain(void)
{
	for (uint32_t round = 0; round < MAX_DRAIN; round++) {
		uint32_t work = 0;

		if (settled())
			return;
		for (int i = 0; i < HOSTS; i++)
			work += poll_host(&hosts[i]);
		collect();
		work += ninflight;
		for (uint32_t i = 0; i < ninflight; i++)
			deliver(&inflight[i]);
		pop(ninflight);
		if (!work && !settled()) {
			int64_t next = next_deadline();

			if (next < 0)
				report();
			CHECK(next >= 0, "a QP stalled: work posted and not completed, nothing in flight, no timer");
			advance(next > hosts[0].now ? next - hosts[0].now : 1);
		}
	}
	if (!settled())
		report();
	CHECK(settled(), "work still not completed after %u rounds", MAX_DRAIN);
}

/* Every packet given to an engine counted once: taken by a QP or refused for one reason; every packet built
 * either taken by the network or still in the ring (none: drained). */
static void check_counters(struct host *h)
{
	struct vre_net_counters net;
	struct vre_roce_counters roce;

	vre_net_counters(h->e, &net);
	vre_device_roce_counters(h->e, 0, &roce);
	CHECK(net.rx_packets == net.rx_malformed + net.rx_bad_icrc + net.rx_no_qp + net.rx_not_peer + roce.rx_packets,
	      "%llu packets in, %llu + %llu + %llu + %llu + %llu accounted", (unsigned long long)net.rx_packets,
	      (unsigned long long)net.rx_malformed, (unsigned long long)net.rx_bad_icrc,
	      (unsigned long long)net.rx_no_qp, (unsigned long long)net.rx_not_peer,
	      (unsigned long long)roce.rx_packets);
	CHECK(roce.tx_packets == net.tx_packets, "%llu packets built, %llu taken", (unsigned long long)roce.tx_packets,
	      (unsigned long long)net.tx_packets);
}

static uint8_t canary_page[PAGE];

/* Page 0 and the pages after the MR: no MR or ring covers them, so nothing may have changed them. */
static void check_canaries(struct host *h)
{
	for (uint32_t page = 0; page < ARENA_PAGES; page = page ? page + 1 : CANARY_FIRST)
		CHECK(!memcmp(h->arena + page_gpa(page), canary_page, PAGE),
		      "guest page %u, outside every MR and ring, was written", page);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	verbose = getenv("ROCE_FUZZ_VERBOSE") != NULL;
	memset(canary_page, CANARY, PAGE);
	for (int i = 0; i < HOSTS; i++) {
		uint8_t *map = mmap(NULL, (ARENA_PAGES + 2) * PAGE, PROT_READ | PROT_WRITE,
				    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		CHECK(map != MAP_FAILED, "mmap");
		CHECK(mprotect(map, PAGE, PROT_NONE) == 0 &&
		      mprotect(map + (ARENA_PAGES + 1) * PAGE, PAGE, PROT_NONE) == 0, "mprotect");
		hosts[i].arena = map + PAGE;
		hosts[i].doorbells = aligned_alloc(PAGE, 2 * PAGE);
		CHECK(hosts[i].doorbells, "doorbells");
	}
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct in in = { data, size };
	struct path path;

	read_path(&in, &path);
	ninflight = pool_next = pool_count = 0;
	for (int i = 0; i < HOSTS; i++)
		setup_host(i, &path);
	for (int i = 0; i < HOSTS; i++)
		connect_host(i, &path);
	for (uint32_t n = 0; n < MAX_OPS && in.left; n++)
		ops[u8(&in) % OP_COUNT](&in);
	drain();
	for (int i = 0; i < HOSTS; i++)
		poll_host(&hosts[i]);
	collect();
	for (int i = 0; i < HOSTS; i++) {
		check_counters(&hosts[i]);
		check_canaries(&hosts[i]);
	}
	if (verbose)
		report();
	for (int i = 0; i < HOSTS; i++) {
		vre_engine_free(hosts[i].e);
		hosts[i].e = NULL;
	}
	return 0;
}
