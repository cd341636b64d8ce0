/* SPDX-License-Identifier: GPL-2.0-only */
/* The benchmark's load generator (loadgen.c); the text between the markers is also the cffi declaration. */
#ifndef VRDMA_TESTING_LOADGEN_H
#define VRDMA_TESTING_LOADGEN_H

#include <stdint.h>

/* LOADGEN-API-BEGIN */
struct nat_queue {
	uint64_t base;            /* host address of the send queue's first WQE */
	uint64_t ring_hdr;        /* host address of the QP's ring header page */
	uint64_t doorbells;       /* host address of the doorbell region */
	uint32_t depth;
	uint32_t stride;
	uint32_t prod;
	uint32_t db;              /* the send queue's doorbell index */
	int wake_fd;              /* the wake virtqueue's kick eventfd */
	uint32_t reserved;
};

struct nat_cq {
	uint64_t hdr;             /* host address of the CQ's ring header */
	uint64_t cqes;            /* host address of the first CQE */
	uint32_t entries;
	uint32_t cons;
};

struct nat_write {
	uint64_t laddr;
	uint64_t raddr;
	uint32_t lkey;
	uint32_t rkey;
	uint32_t len;
	uint32_t reserved;
};

int64_t nat_now(void);
/* Signaled WRITEs one at a time, each sample its doorbell-to-CQE time; with `yield`, the CPU is yielded while a CQE
 * is not there (a victim that leaves the cores to others while it waits; spinning measures the backend alone). */
int nat_write_latency(struct nat_queue *q, struct nat_cq *cq, const struct nat_write *w, uint32_t iters,
		      int64_t *samples, int64_t timeout_ns, int yield);
/* `count` WRITEs, every `signal_every`th (and the last) signaled, until each signaled one has its CQE: the nanoseconds
 * taken, -1 past `timeout_ns`, -2 on a completion in error. */
int64_t nat_write_stream(struct nat_queue *q, struct nat_cq *cq, const struct nat_write *w, uint64_t count,
			 uint32_t signal_every, int64_t timeout_ns);
/* WRITEs at full queue depth until *stop is set, then drained: the WRITEs completed, or < 0 on an error
 * (batch_sleep_us: the queue refilled only once drained, looked at this often meanwhile). */
int64_t nat_write_flood(struct nat_queue *q, struct nat_cq *cq, const struct nat_write *w, uint32_t signal_every,
			uint32_t batch_sleep_us, volatile uint32_t *stop, int64_t timeout_ns);
int64_t nat_memcpy(uint64_t dst, uint64_t src, uint64_t len, uint32_t iters);
/* LOADGEN-API-END */

#endif /* VRDMA_TESTING_LOADGEN_H */
