/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * The rings and the doorbell page as libvrdma sees them: a producer index stored into the queue's slot of a doorbell page
 * (release order: the WQE is visible first), and whether the device still knows the context.
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

#endif /* VRDMA_PROVIDER_RING_H */
