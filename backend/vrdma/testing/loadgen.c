// SPDX-License-Identifier: GPL-2.0-only
/*
 * The benchmark's guest side at native speed: posts RDMA WRITEs into a simulated guest's send queue, rings its
 * doorbell and polls its CQ, in C, so that what is measured is the backend and not the Python test harness.
 * The rings, doorbell page and memory are the ones vrdma.testing.simulated_guest set up through the control path; this
 * file only writes WQEs and reads CQEs, exactly as libvrdma does in a guest.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "loadgen.h"
#include "vrdma_dev_api.h"

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t nat_now(void)
{
	return now_ns();
}

static volatile uint32_t *slot(const struct nat_queue *q, uint32_t index)
{
	return (volatile uint32_t *)(uintptr_t)q->doorbells + index;
}

/* Write one WRITE WQE and ring; wake the device if its engine is parked (what libvrdma's post_send does). */
static void post_write(struct nat_queue *q, const struct nat_write *w, int signaled)
{
	struct vrdma_send_wqe *wqe = (struct vrdma_send_wqe *)(uintptr_t)(q->base +
		(uint64_t)(q->prod & (q->depth - 1)) * q->stride);
	struct vrdma_sge *sge = (struct vrdma_sge *)(wqe + 1);

	memset(wqe, 0, sizeof(*wqe));
	wqe->wr_id = q->prod;
	wqe->opcode = VRDMA_WR_RDMA_WRITE;
	wqe->send_flags = signaled ? VRDMA_SEND_SIGNALED : 0;
	wqe->num_sge = 1;
	wqe->rkey = w->rkey;
	wqe->remote_addr = w->raddr;
	sge->addr = w->laddr;
	sge->length = w->len;
	sge->lkey = w->lkey;
	q->prod++;
	__atomic_store_n(slot(q, q->db), q->prod, __ATOMIC_RELEASE);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (__atomic_load_n(slot(q, q->db - VRDMA_DB_SLOT(q->db) + VRDMA_DB_SLOT_PARKED), __ATOMIC_ACQUIRE))
		eventfd_write(q->wake_fd, 1);
}

/* Take one CQE if there is one: 1 (status in *status), 0 none. */
static int poll_one(struct nat_cq *cq, uint8_t *status)
{
	struct vrdma_cq_ring_hdr *hdr = (struct vrdma_cq_ring_hdr *)(uintptr_t)cq->hdr;
	const struct vrdma_cqe *ring = (const struct vrdma_cqe *)(uintptr_t)cq->cqes;

	if (__atomic_load_n(&hdr->prod, __ATOMIC_ACQUIRE) == cq->cons)
		return 0;
	*status = ring[cq->cons & (cq->entries - 1)].status;
	cq->cons++;
	__atomic_store_n(&hdr->cons, cq->cons, __ATOMIC_RELEASE);
	return 1;
}

int nat_write_latency(struct nat_queue *q, struct nat_cq *cq, const struct nat_write *w, uint32_t iters,
		      int64_t *samples, int64_t timeout_ns, int yield)
{
	for (uint32_t i = 0; i < iters; i++) {
		int64_t start = now_ns();
		uint8_t status;

		post_write(q, w, 1);
		while (!poll_one(cq, &status)) {
			if (now_ns() - start > timeout_ns)
				return -1;
			if (yield)
				sched_yield();
		}
		if (status != VRDMA_WC_SUCCESS)
			return -2;
		samples[i] = now_ns() - start;
	}
	return 0;
}

int64_t nat_write_stream(struct nat_queue *q, struct nat_cq *cq, const struct nat_write *w, uint64_t count,
			 uint32_t signal_every, int64_t timeout_ns)
{
	struct vrdma_qp_ring_hdr *hdr = (struct vrdma_qp_ring_hdr *)(uintptr_t)q->ring_hdr;
	int64_t start = now_ns();
	uint64_t posted = 0, signaled = 0, completed = 0;
	uint8_t status;

	/* Until every signaled WRITE has its CQE: the send queue's consumer index moves before the last CQE is
	 * written, and a CQE left behind would be the next run's (which then reads one completion early, or
	 * overflows its CQ). */
	while (posted < count || completed < signaled) {
		/* At most a signal interval posted between looks at the CQ: a driver that only polled once its send
		 * queue is full never polls while the device keeps up with it, and its CQ overflows. */
		for (uint32_t batch = 0; batch < signal_every && posted < count &&
		     q->prod - __atomic_load_n(&hdr->sq_cons, __ATOMIC_ACQUIRE) < q->depth; batch++) {
			bool signal = ++posted % signal_every == 0 || posted == count;

			signaled += signal;
			post_write(q, w, signal);
		}
		while (poll_one(cq, &status)) {
			if (status != VRDMA_WC_SUCCESS)
				return -2;
			completed++;
		}
		if (now_ns() - start > timeout_ns)
			return -1;
	}
	return now_ns() - start;
}

/*
 * A neighbour's flood: its queue kept full of WRITEs until told to stop. With the queue full and nothing to take
 * from the CQ it sleeps 20 us rather than spin, so that on a machine of few cores the flood costs the engine's
 * work, not a core of its own (a guest's vCPU is its own core; here the flood shares them with the backend).
 * `batch_sleep_us` (0: as above): the queue filled only once it has drained, a batch at a time, the driver sleeping
 * this long between its looks (a driver that waits for its completions, leaving the cores to the engine's threads).
 */
int64_t nat_write_flood(struct nat_queue *q, struct nat_cq *cq, const struct nat_write *w, uint32_t signal_every,
			uint32_t batch_sleep_us, volatile uint32_t *stop, int64_t timeout_ns)
{
	struct vrdma_qp_ring_hdr *hdr = (struct vrdma_qp_ring_hdr *)(uintptr_t)q->ring_hdr;
	uint32_t first = q->prod;
	int64_t deadline = now_ns() + timeout_ns;
	uint32_t filling = 0, unpolled = 0;
	uint8_t status;

	while (!__atomic_load_n(stop, __ATOMIC_ACQUIRE)) {
		uint32_t room = q->depth - (q->prod - __atomic_load_n(&hdr->sq_cons, __ATOMIC_ACQUIRE));
		bool posting = room && (!batch_sleep_us || filling || room == q->depth);
		int took = 0;

		/* As in nat_write_stream, the CQ looked at once a signal interval at least, or it could overflow. */
		if (posting && unpolled < signal_every) {
			filling = room > 1;
			unpolled++;
			post_write(q, w, (q->prod - first + 1) % signal_every == 0);
			continue;
		}
		unpolled = 0;
		while (poll_one(cq, &status)) {
			if (status != VRDMA_WC_SUCCESS)
				return -2;
			took = 1;
		}
		if (now_ns() > deadline)
			return -1;
		if (posting)
			continue;  /* only here to poll */
		if (!took || batch_sleep_us)
			usleep(batch_sleep_us ? batch_sleep_us : 20);
	}
	/* The last one signaled (the drain below ends on its completion), once the ring has room for it: a producer
	 * index more than a ring ahead of the consumer is garbage to the device, which fails the QP. */
	while (q->prod - __atomic_load_n(&hdr->sq_cons, __ATOMIC_ACQUIRE) >= q->depth)
		if (now_ns() > deadline)
			return -1;
	post_write(q, w, 1);
	while (__atomic_load_n(&hdr->sq_cons, __ATOMIC_ACQUIRE) != q->prod)
		if (now_ns() > deadline)
			return -1;
	while (poll_one(cq, &status))
		if (status != VRDMA_WC_SUCCESS)
			return -2;
	return (int64_t)(q->prod - first);
}

int64_t nat_memcpy(uint64_t dst, uint64_t src, uint64_t len, uint32_t iters)
{
	int64_t start = now_ns();

	for (uint32_t i = 0; i < iters; i++) {
		memcpy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, len);
		__asm__ volatile("" : : : "memory");  /* each copy happens */
	}
	return now_ns() - start;
}
