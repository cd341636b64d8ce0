/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * The rings and the doorbell page as libvrdma sees them: a producer index stored into the queue's slot of a
 * doorbell page (release order: the WQE is visible first), room in a ring, and whether the device still knows the
 * context.
 */
#ifndef VRDMA_PROVIDER_RING_H
#define VRDMA_PROVIDER_RING_H

#include "vrdma.h"

static inline void ring_doorbell(volatile uint32_t *db, uint32_t value)
{
	__atomic_store_n(db, value, __ATOMIC_RELEASE);
}

/*
 * Whether the device still knows this context (VRDMA_DB_SLOT_ALIVE). A restarted backend clears the word; the
 * kernel maps a zero page over the doorbell page when it detaches the context from a lost device.
 */
static inline bool ctx_alive(struct vrdma_context *ctx)
{
	return __atomic_load_n(&ctx->doorbell[VRDMA_DB_SLOT_ALIVE], __ATOMIC_ACQUIRE) == VRDMA_DB_ALIVE;
}

/*
 * Room in a ring whose consumer index the device publishes: `prod - cons` WQEs are outstanding. A consumer index
 * ahead of the producer is not the device's; the ring then counts as full.
 */
static inline bool ring_full(const struct vrdma_queue *q, volatile uint32_t *cons)
{
	uint32_t outstanding = q->prod - __atomic_load_n(cons, __ATOMIC_ACQUIRE);

	return outstanding >= q->depth;
}

/* wqe.c: a queue's ring and doorbell (0 or errno), and receive WQEs posted to an RQ or SRQ ring. */
int vrdma_queue_init(struct vrdma_context *ctx, struct vrdma_queue *q, uint8_t *base, uint32_t depth,
		     uint32_t stride, uint32_t max_sge, bool has_db, uint32_t db, uint64_t db_offset);
int vrdma_post_recv_ring(struct vrdma_context *ctx, struct vrdma_queue *q, volatile uint32_t *cons,
			 struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);

#endif /* VRDMA_PROVIDER_RING_H */
