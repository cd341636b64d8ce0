// SPDX-License-Identifier: GPL-2.0-only
/* The engine fuzzer's object operations: MRs (and memory windows), CQs, SRQs and QPs created, modified
 * (reregistered) and destroyed as the model would, with arbitrary configurations. */
#include "fuzz.h"

void op_mr_create(struct in *in, struct vre_engine *e, uint32_t dev)
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
	if (flags & 64 && flags & 128) {
		/* A memory window: an rkey, bound to nothing (BIND_MW work requests bind it). */
		c.lkey = 0;
		c.mw_type = 1 + (u8(in) & 1);
		ret = vre_mr_create(e, dev, slot, &c);
		CHECK(ret <= 0);
		if (ret == 0)
			vm->mrs[slot] = (struct mr_rec){ .live = true, .rkey = c.rkey };
		return;
	}
	if (flags & 64) {
		/* A fast-registration MR: room for pages, nothing mapped (REG_MR work requests map it). */
		c.rkey = c.lkey;
		c.max_pages = 1 + u8(in) % 16;
		ret = vre_mr_create(e, dev, slot, &c);
		CHECK(ret <= 0);
		if (ret == 0)
			vm->mrs[slot] = (struct mr_rec){ .live = true, .lkey = c.lkey, .rkey = c.rkey, .iova = 0,
							 .length = 0 };
		return;
	}
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
	if (flags & 128 && slot < MAX_SLOTS && vm->mrs[slot].live) {
		/* A reregistration of what the slot holds: its keys (else refused), new pages or none (kept). */
		c.lkey = vm->mrs[slot].lkey;
		c.rkey = vm->mrs[slot].rkey;
		if (flags & 1)
			c.pages.npages = 0;
		ret = vre_mr_rereg(e, dev, slot, &c);
		CHECK(ret <= 0);
		if (ret == 0)
			vm->mrs[slot] = (struct mr_rec){ .live = true, .lkey = c.lkey, .rkey = c.rkey, .iova = c.iova,
							 .length = c.length };
		return;
	}
	ret = vre_mr_create(e, dev, slot, &c);
	CHECK(ret <= 0);
	if (ret == 0) {
		CHECK(slot < MAX_SLOTS && !vm->mrs[slot].live);
		vm->mrs[slot] = (struct mr_rec){ .live = true, .lkey = c.lkey, .rkey = c.rkey, .iova = c.iova,
						 .length = c.length };
	}
}

void op_mr_destroy(struct in *in, struct vre_engine *e, uint32_t dev)
{
	uint32_t slot = u8(in) % (MAX_SLOTS + 1);

	vre_mr_destroy(e, dev, slot);
	if (slot < MAX_SLOTS)
		vms[dev].mrs[slot].live = false;
}

/* CQ moderation: completions per event and a period in microseconds (short, so that timers fire). */
void moderate(struct in *in, struct vre_engine *e, uint32_t dev, uint32_t slot)
{
	uint32_t count = u8(in) % 4, period = u8(in) % 3;

	CHECK(vre_cq_moderate(e, dev, slot, count, period) <= 0);
}

void op_cq_create(struct in *in, struct vre_engine *e, uint32_t dev)
{
	struct vm *vm = &vms[dev];
	uint32_t slot = u8(in) % (vm->lim.max_cq + 1);
	uint8_t flags = u8(in);
	struct vre_cq_config c = { .handle = u16(in) };
	struct ring_rec rec;
	int ret;

	c.entries = flags & 1 ? u32(in) : 1u << (u8(in) % 13);
	c.db = draw_db(in, vm, flags & 2);
	read_pages(in, vm, pages_for(PAGE + (uint64_t)c.entries * sizeof(struct vrdma_cqe)), &c.ring, &rec);
	ret = vre_cq_create(e, dev, slot, &c);
	CHECK(ret <= 0);
	if (ret == 0) {
		CHECK(slot < MAX_SLOTS && !vm->cqs[slot].live);
		vm->cqs[slot] = (struct cq_rec){ .live = true, .entries = c.entries, .db = c.db, .ring = rec };
	}
	if (flags & 8)
		moderate(in, e, dev, slot);
}

void op_cq_destroy(struct in *in, struct vre_engine *e, uint32_t dev)
{
	uint32_t slot = u8(in) % (MAX_SLOTS + 1);
	struct cq_rec *cq = slot < MAX_SLOTS ? &vms[dev].cqs[slot] : NULL;

	if (cq && cq->refs)
		return;   /* the model answers BUSY: a QP uses this CQ */
	vre_cq_destroy(e, dev, slot);
	if (cq)
		cq->live = false;
}

void op_srq_create(struct in *in, struct vre_engine *e, uint32_t dev)
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
	c.db = draw_db(in, vm, flags & 4);
	if (flags & 8) {
		/* An XRC SRQ: one of two domains (or any), a CQ, its number (mostly well formed). */
		c.xrcd = flags & 16 ? u32(in) : 1 + u8(in) % 2;
		c.cq = u8(in) % (vm->lim.max_cq + 1);
		c.srqn = flags & 32 ? u32(in) : ((uint32_t)u16(in) * vm->lim.max_srq) | (slot & (vm->lim.max_srq - 1));
	}
	c.flags = flags & 64 ? VRE_SRQ_KERNEL : 0;
	read_pages(in, vm, pages_for(PAGE + (uint64_t)c.depth * c.stride), &c.ring, &rec);
	ret = vre_srq_create(e, dev, slot, &c);
	CHECK(ret <= 0);
	if (ret == 0) {
		CHECK(slot < MAX_SLOTS && !vm->srqs[slot].live);
		CHECK(!c.xrcd || (c.cq < MAX_SLOTS && vm->cqs[c.cq].live));
		vm->srqs[slot] = (struct srq_rec){ .live = true, .depth = c.depth, .stride = c.stride, .db = c.db,
						   .xrcd = c.xrcd, .cq = c.cq, .srqn = c.srqn, .ring = rec };
		if (c.xrcd)
			vm->cqs[c.cq].refs++;
	}
}

void op_srq_destroy(struct in *in, struct vre_engine *e, uint32_t dev)
{
	uint32_t slot = u8(in) % (MAX_SLOTS + 1);
	struct srq_rec *srq = slot < MAX_SLOTS ? &vms[dev].srqs[slot] : NULL;

	if (srq && srq->refs)
		return;   /* BUSY in the model */
	vre_srq_destroy(e, dev, slot);
	if (srq && srq->live && srq->xrcd)
		vms[dev].cqs[srq->cq].refs--;
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

void op_qp_create(struct in *in, struct vre_engine *e, uint32_t dev)
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
	c.sq_db = draw_db(in, vm, flags & 128);
	/* Mostly in the send queue's page (as the device hands them out), sometimes anywhere. */
	c.rq_db = flags & 512 ? draw_db(in, vm, flags & 256) :
		  c.sq_db - VRDMA_DB_SLOT(c.sq_db) + u16(in) % VRDMA_DB_SLOTS;
	c.flags = (flags & 0x800 ? VRE_QP_KERNEL : 0) | (flags & 0x1000 ? VRE_QP_UD : 0) |
		  (flags & 0x2000 ? VRE_QP_GSI : 0) | (flags & 0x4000 ? VRE_QP_UC : 0);
	if (flags & 0x8000) {
		/* XRC: an initiator (a send queue only) or a target (a domain, no queues), or any mix the input asks. */
		uint8_t xrc = u8(in);

		if (xrc & 1) {
			c.flags = (c.flags & VRE_QP_KERNEL) | VRE_QP_XRC_TGT;
			c.xrcd = xrc & 2 ? u32(in) : 1 + u8(in) % 2;
			if (!(xrc & 4)) {
				c.srq = VRE_NO_SRQ;
				c.sq_depth = c.rq_depth = 0;
			}
		} else {
			c.flags |= VRE_QP_XRC_INI;
			if (!(xrc & 4)) {
				c.srq = VRE_NO_SRQ;
				c.rq_depth = 0;
			}
		}
	}
	if ((flags & 0x3000) == 0x3000 && !(flags & 1))
		c.qpn = VRDMA_GSI_QPN;  /* the device's QP1 (the engine takes it in any free slot) */
	end = (uint64_t)c.sq_offset + (uint64_t)c.sq_depth * c.sq_stride;
	if ((uint64_t)c.rq_offset + (uint64_t)c.rq_depth * c.rq_stride > end)
		end = (uint64_t)c.rq_offset + (uint64_t)c.rq_depth * c.rq_stride;
	if (c.flags & VRE_QP_XRC_TGT)
		memset(&rec, 0, sizeof(rec));  /* no ring: a target's page list is empty */
	else
		read_pages(in, vm, pages_for(end), &c.ring, &rec);
	ret = vre_qp_create(e, dev, slot, &c);
	CHECK(ret <= 0);
	if (ret == 0) {
		CHECK(slot < MAX_SLOTS && !vm->qps[slot].live);
		if (c.flags & VRE_QP_XRC_TGT) {
			CHECK(c.xrcd && !c.ring.npages);
			c.send_cq = c.recv_cq = NO_CQ;  /* it holds none */
		} else if (c.flags & VRE_QP_XRC_INI) {
			CHECK(c.send_cq < MAX_SLOTS && vm->cqs[c.send_cq].live && c.srq == VRE_NO_SRQ);
			c.recv_cq = NO_CQ;
		} else {
			CHECK(c.send_cq < MAX_SLOTS && vm->cqs[c.send_cq].live && c.recv_cq < MAX_SLOTS &&
			      vm->cqs[c.recv_cq].live);
		}
		vm->qps[slot] = (struct qp_rec){ .live = true, .cfg = c, .ring = rec };
		if (c.send_cq != NO_CQ)
			vm->cqs[c.send_cq].refs++;
		if (c.recv_cq != NO_CQ)
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
	if (qp->cfg.send_cq != NO_CQ)
		vm->cqs[qp->cfg.send_cq].refs--;
	if (qp->cfg.recv_cq != NO_CQ)
		vm->cqs[qp->cfg.recv_cq].refs--;
	if (qp->cfg.srq != VRE_NO_SRQ)
		vm->srqs[qp->cfg.srq].refs--;
	qp->live = false;
}

void op_qp_destroy(struct in *in, struct vre_engine *e, uint32_t dev)
{
	uint32_t slot = u8(in) % (MAX_SLOTS + 1);

	vre_qp_destroy(e, dev, slot);
	if (slot < MAX_SLOTS)
		qp_release(&vms[dev], slot);
}

/* A live QP of a VM, named by an input byte (NULL if it has none). */
struct qp_rec *pick_qp(struct vm *vm, uint8_t k, uint32_t *slot)
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

uint32_t pick_srqn(struct vm *vm, uint8_t k)
{
	for (uint32_t i = 0; i < MAX_SLOTS; i++) {
		uint32_t s = (k + i) % MAX_SLOTS;

		if (vm->srqs[s].live && vm->srqs[s].xrcd)
			return vm->srqs[s].srqn;
	}
	return 0;
}

struct mr_rec *pick_mr(struct vm *vm, uint8_t k)
{
	for (uint32_t i = 0; i < MAX_SLOTS; i++) {
		uint32_t s = (k + i) % MAX_SLOTS;

		if (vm->mrs[s].live)
			return &vm->mrs[s];
	}
	return NULL;
}

void op_qp_modify(struct in *in, struct vre_engine *e, uint32_t dev)
{
	struct vm *vm = &vms[dev];
	uint8_t flags = u8(in);
	uint32_t slot = u8(in) % (vm->lim.max_qp + 1);
	struct vre_qp_attr a = { 0 };
	uint8_t dest;
	int ret, before, state;

	a.state = u8(in) % 8;
	a.access_flags = u8(in) & 0xf;
	dest = u8(in);
	a.dest_dev = dest % 4 < NDEV ? dest % 4 : dest % 4 == NDEV ? VRE_NO_DEVICE : u32(in);
	if (a.dest_dev < NDEV)
		device_gid(a.dest_dev, a.dgid);   /* (the model routes a connection by its GID, as a load does again) */
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
	a.qkey = fuzz_qkey(in);
	if (flags & 8)
		a.access_flags = u32(in);
	before = vre_qp_state(e, dev, slot);
	ret = vre_qp_modify(e, dev, slot, &a);
	CHECK(ret <= 0);
	state = vre_qp_state(e, dev, slot);
	/* (a state it does not know is refused, and changes nothing) */
	CHECK(state < 0 || state == (a.state <= VRDMA_QPS_ERR ? (int)a.state : before) || state == VRDMA_QPS_ERR);
	if (a.state == VRDMA_QPS_RESET && slot < MAX_SLOTS && vm->qps[slot].live)
		vm->qps[slot].sq_prod = vm->qps[slot].rq_prod = 0;
}
