/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * The container channel's state, private to channel.c (the connection, commands, doorbells) and chan_mem.c (the
 * memory shared with the device).
 */
#ifndef VRDMA_PROVIDER_CHANNEL_H
#define VRDMA_PROVIDER_CHANNEL_H

#include "ring.h"
#include "vrdma_channel.h"

struct chan_chunk {               /* one memfd of the arena (rings, page lists), pages handed out first-fit */
	uint8_t *va;
	size_t pages;
	uint64_t dev;
	uint8_t *used;            /* a byte per page */
	struct chan_chunk *next;
};

struct chan_share {               /* application memory remapped onto a memfd shared with the device */
	uintptr_t start, end;
	uint64_t dev;
	int fd;
	unsigned int refs;
	struct chan_share *next;
};

struct vrdma_channel {
	int sock;
	pthread_mutex_t lock;     /* one request at a time, and the arena and shares */
	uint32_t seq;
	uint32_t ucontext;
	uint8_t *doorbells;
	size_t doorbell_bytes;
	uint32_t doorbell_pages;
	int wake_fd;
	int event_pipe[2];        /* async_fd's pipe: libibverbs reads the read end */
	uint64_t window_base, window_size;
	uint32_t regions, max_regions;
	struct chan_chunk *chunks;
	struct chan_share *shares;
};

/* One request whose answer carries no descriptor (ADD_MEMORY, REMOVE_MEMORY): 0 or errno, the answer in `answer`.
 * Call with the lock held. */
int vrdma_chan_request(struct vrdma_channel *chan, uint16_t type, const void *body, size_t len, const int *fds,
		       int nfds, void *answer, size_t answer_size);

#endif /* VRDMA_PROVIDER_CHANNEL_H */
