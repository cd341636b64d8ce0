// SPDX-License-Identifier: GPL-2.0-only
/*
 * The RoCE harness's two hosts (roce_fuzz.c says what the harness does): each an engine with one device, a guest
 * memory arena between guard pages, a CQ, two QPs connected to the other host's and an MR, set up from the input's
 * header; and the guests' side: work requests posted, completions consumed and checked in order.
 */
#include "roce.h"

struct host hosts[HOSTS];

static uint8_t *gpa_host(struct host *h, uint64_t gpa)
{
	return h->arena + gpa;
}

uint64_t page_gpa(uint32_t page)
{
	return (uint64_t)page * PAGE;
}

/* A one-level page list in page `list` naming `npages` pages from `first` on. */
struct vre_pages_desc pages(struct host *h, uint32_t list, uint32_t first, uint32_t npages)
{
	for (uint32_t i = 0; i < npages; i++) {
		uint64_t gpa = page_gpa(first + i);

		memcpy(gpa_host(h, page_gpa(list)) + 8 * i, &gpa, 8);
	}
	return (struct vre_pages_desc){ .addr = page_gpa(list), .npages = npages, .levels = 1 };
}

void ring(struct host *h, uint32_t index, uint32_t value)
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


void read_path(struct in *in, struct path *p)
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

/*
 * A live migration or an upgrade of one host's VM (engine/state.c, restore.c), the harness's network going on
 * around it: its device suspended and saved, then resumed as it was (a migration that failed), or closed, opened
 * again (the same doorbell region and guest memory: what the destination has after the move) and loaded from the
 * state, which must check and load as it was saved, RoCE transport state and all. What arrives while it is
 * suspended is dropped, and the transport must make up for it.
 */
void op_migrate(struct in *in)
{
	struct host *h = &hosts[u8(in) & 1];
	struct vre_region region = { .gpa = 0, .size = (uint64_t)ARENA_PAGES * PAGE, .hva = (uint64_t)(uintptr_t)h->arena };
	bool reload = u8(in) & 1;
	uint8_t *state;
	int64_t size;

	CHECK(vre_device_suspend(h->e, 0, 1) == 0, "%s", vre_error(h->e));
	size = vre_device_save(h->e, 0, NULL, 0);
	CHECK(size > 0, "%s", vre_error(h->e));
	if (reload) {
		state = malloc((size_t)size);
		CHECK(state, "no memory for a state");
		CHECK(vre_device_save(h->e, 0, state, (uint64_t)size) == size, "%s", vre_error(h->e));
		vre_device_close(h->e, 0);
		CHECK(vre_device_open(h->e, 0, &limits, (uint64_t)(uintptr_t)h->doorbells) == 0, "%s", vre_error(h->e));
		CHECK(vre_device_set_memory(h->e, 0, &region, 1) == 0, "%s", vre_error(h->e));
		CHECK(vre_gid_set(h->e, 0, 0, h->gid, VRDMA_GID_TYPE_ROCE_V2) == 0, "%s", vre_error(h->e));
		CHECK(vre_device_load(h->e, 0, state, (uint64_t)size, VRE_LOAD_CHECK) == 0, "%s", vre_error(h->e));
		CHECK(vre_device_load(h->e, 0, state, (uint64_t)size, 0) == 0, "%s", vre_error(h->e));
		free(state);
	}
	CHECK(vre_device_suspend(h->e, 0, 0) == 0, "%s", vre_error(h->e));
	CHECK(vre_check(h->e) == 0, "%s", vre_error(h->e));
}

void setup_host(int i, const struct path *p)
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

void connect_host(int i, const struct path *p)
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

void op_post_send(struct in *in)
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

void op_post_recv(struct in *in)
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
void consume(struct host *h)
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
