// SPDX-License-Identifier: GPL-2.0-only
/*
 * The ring layouts the device accepts, each rule in one place (the object files call these; nothing else states
 * them in C). A CQ ring and an SRQ ring are a page of indices followed by their entries; a QP's send and receive
 * queues lie at page-aligned offsets after the ring's header page. Every product is computed in 64 bits.
 * (The Python model states the same layouts once for its own, earlier check: vrdma/device/rings.py.)
 */
#include "vre.h"

/* The smallest receive WQE slot the device takes: a header and one SGE. */
#define MIN_RECV_STRIDE 32

VRE_FN bool cq_ring_fits(uint32_t entries, uint32_t max_cqe, uint32_t npages)
{
	return is_pow2(entries) && entries <= max_cqe &&
	       (uint64_t)npages * PAGE_SIZE >= PAGE_SIZE + (uint64_t)entries * sizeof(struct vrdma_cqe);
}

/* A receive queue (a QP's or an SRQ's): a power-of-two depth of power-of-two slots that hold their SGEs. */
VRE_FN bool recv_queue_fits(uint32_t depth, uint32_t max_depth, uint32_t stride, uint32_t max_sge, uint32_t dev_max_sge)
{
	return is_pow2(depth) && depth <= max_depth && is_pow2(stride) && stride >= MIN_RECV_STRIDE &&
	       stride <= PAGE_SIZE && max_sge <= dev_max_sge &&
	       sizeof(struct vrdma_recv_wqe) + (uint64_t)max_sge * sizeof(struct vrdma_sge) <= stride;
}

VRE_FN bool srq_ring_fits(uint32_t depth, uint32_t stride, uint32_t npages)
{
	return (uint64_t)npages * PAGE_SIZE >= PAGE_SIZE + (uint64_t)depth * stride;
}

/* A send queue: slots that hold a WQE header and the larger of its SGEs and its inline data. */
VRE_FN bool send_queue_fits(uint32_t depth, uint32_t max_depth, uint32_t stride, uint32_t max_sge, uint32_t dev_max_sge,
		     uint32_t max_inline, uint32_t dev_max_inline)
{
	return is_pow2(depth) && depth <= max_depth && is_pow2(stride) && stride >= sizeof(struct vrdma_send_wqe) &&
	       stride <= PAGE_SIZE && max_sge <= dev_max_sge && max_inline <= dev_max_inline &&
	       sizeof(struct vrdma_send_wqe) + (uint64_t)max_sge * sizeof(struct vrdma_sge) <= stride &&
	       sizeof(struct vrdma_send_wqe) + (uint64_t)max_inline <= stride;
}

/* A queue of `depth` entries of `stride` bytes at `offset` lies in [PAGE_SIZE, end) of its QP's ring, page-aligned. */
VRE_FN bool ring_fits(uint32_t depth, uint32_t stride, uint32_t offset, uint64_t end)
{
	return offset >= PAGE_SIZE && !(offset & (PAGE_SIZE - 1)) && offset <= end &&
	       (uint64_t)depth * stride <= end - offset;
}

/* The most pages a QP ring may have: its header page and its queues, each queue rounded up to whole pages. The
 * offsets may place the queues anywhere in that, but not add pages nothing uses (each costs a translation). */
VRE_FN uint64_t qp_ring_pages(uint32_t sq_depth, uint32_t sq_stride, uint32_t rq_depth, uint32_t rq_stride)
{
	return 1 + DIV_ROUND_UP((uint64_t)sq_depth * sq_stride, PAGE_SIZE) +
	       DIV_ROUND_UP((uint64_t)rq_depth * rq_stride, PAGE_SIZE);
}
