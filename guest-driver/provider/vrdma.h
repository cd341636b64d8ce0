/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * libvrdma's private header: the provider's objects, the commands it exchanges with vrdma.ko (the core's part, then
 * vrdma's udata from the shared ABI header), and what its files share. The files: main.c (device matching, contexts
 * and the verbs table), verbs.c (device and port queries, PDs, MRs, AHs, ring buffers), cq.c (CQs: create, poll,
 * arm, flush), qp.c (QPs and SRQs: create, modify, post), ring.h (the rings and the doorbell page).
 */
#ifndef VRDMA_PROVIDER_H
#define VRDMA_PROVIDER_H

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <infiniband/driver.h>
#include <rdma/vrdma-abi.h>

struct vrdma_device {
	struct verbs_device ibv_dev;
};

struct vrdma_context {
	struct verbs_context ibv_ctx;
	uint32_t doorbell_page;   /* index of this context's page in the device's doorbell region */
	size_t doorbell_size;
	volatile uint32_t *doorbell;  /* that page, mapped from the uverbs file; only this process maps it */
	pthread_mutex_t qps_lock;
	struct vrdma_qp *qps;     /* every QP of the context (flushed when the device loses the context) */
};

struct vrdma_pd {
	struct ibv_pd ibv_pd;
	uint32_t pdn;
};

/* A ring buffer in this process's memory, page-aligned, kept out of fork()ed children (it is pinned). */
struct vrdma_buf {
	void *addr;
	size_t size;
};

struct vrdma_cq {
	struct verbs_cq vcq;
	struct vrdma_buf buf;
	pthread_spinlock_t lock;
	uint32_t entries;
	uint32_t cons;
	uint32_t arm_seq;
	uint32_t db_slot;
};

struct vrdma_queue {
	uint8_t *base;            /* first WQE */
	uint32_t depth;           /* a power of two */
	uint32_t stride;
	uint32_t prod;            /* WQEs posted (free-running) */
	uint32_t db_slot;
	uint32_t max_sge;
	pthread_spinlock_t lock;
};

struct vrdma_qp {
	struct verbs_qp vqp;
	struct vrdma_buf buf;
	struct vrdma_queue sq;
	struct vrdma_queue rq;    /* unused with an SRQ */
	uint32_t max_inline;
	struct ibv_post_send wake_cmd;
	struct ib_uverbs_post_send_resp wake_resp;
	struct vrdma_qp *next;    /* in the context's list */
};

struct vrdma_srq {
	struct verbs_srq vsrq;
	struct vrdma_buf buf;
	struct vrdma_queue rq;
};

struct vrdma_ah {
	struct ibv_ah ibv_ah;
};

/* Commands and responses: the core's part, then vrdma's udata (from the shared ABI header). */
struct vrdma_create_cq_req {
	struct ibv_create_cq ibv_cmd;
	struct vrdma_create_cq_cmd drv;
};

struct vrdma_create_cq_rsp {
	struct ib_uverbs_create_cq_resp ibv_resp;
	struct vrdma_create_cq_resp drv;
};

struct vrdma_create_qp_req {
	struct ibv_create_qp ibv_cmd;
	struct vrdma_create_qp_cmd drv;
};

struct vrdma_create_qp_rsp {
	struct ib_uverbs_create_qp_resp ibv_resp;
	struct vrdma_create_qp_resp drv;
};

struct vrdma_create_srq_req {
	struct ibv_create_srq ibv_cmd;
	struct vrdma_create_srq_cmd drv;
};

struct vrdma_create_srq_rsp {
	struct ib_uverbs_create_srq_resp ibv_resp;
	struct vrdma_create_srq_resp drv;
};

/* The device's values are libibverbs' own: the ring formats carry them as they are. */
static_assert(VRDMA_WR_ATOMIC_FETCH_AND_ADD == IBV_WR_ATOMIC_FETCH_AND_ADD && VRDMA_WR_SEND == IBV_WR_SEND &&
	      VRDMA_WR_RDMA_READ == IBV_WR_RDMA_READ, "work request opcodes");
static_assert(VRDMA_SEND_INLINE == IBV_SEND_INLINE && VRDMA_SEND_SIGNALED == IBV_SEND_SIGNALED &&
	      VRDMA_SEND_SOLICITED == IBV_SEND_SOLICITED, "send flags");
static_assert(VRDMA_WC_RNR_RETRY_EXC_ERR == IBV_WC_RNR_RETRY_EXC_ERR && VRDMA_WC_WR_FLUSH_ERR == IBV_WC_WR_FLUSH_ERR &&
	      VRDMA_WC_GENERAL_ERR == IBV_WC_GENERAL_ERR, "completion status");
static_assert(VRDMA_WC_OP_RECV == IBV_WC_RECV && VRDMA_WC_OP_RECV_RDMA_WITH_IMM == IBV_WC_RECV_RDMA_WITH_IMM &&
	      VRDMA_WC_OP_FETCH_ADD == IBV_WC_FETCH_ADD && VRDMA_WC_WITH_IMM == IBV_WC_WITH_IMM, "completion opcodes");

/* Kernel responses: the core's part, then vrdma's udata (from the shared ABI header). */
struct vrdma_get_context_resp {
	struct ib_uverbs_get_context_resp ibv_resp;
	struct vrdma_alloc_ucontext_resp drv;
};

struct vrdma_alloc_pd_cmd_resp {
	struct ib_uverbs_alloc_pd_resp ibv_resp;
	struct vrdma_alloc_pd_resp drv;
};

static inline struct vrdma_context *to_vctx(struct ibv_context *ibctx)
{
	return container_of(ibctx, struct vrdma_context, ibv_ctx.context);
}

static inline struct vrdma_pd *to_vpd(struct ibv_pd *ibpd)
{
	return container_of(ibpd, struct vrdma_pd, ibv_pd);
}

static inline struct vrdma_cq *to_vcq(struct ibv_cq *ibcq)
{
	return container_of(ibcq, struct vrdma_cq, vcq.cq);
}

static inline struct vrdma_qp *to_vqp(struct ibv_qp *ibqp)
{
	return container_of(ibqp, struct vrdma_qp, vqp.qp);
}

static inline struct vrdma_srq *to_vsrq(struct ibv_srq *ibsrq)
{
	return container_of(ibsrq, struct vrdma_srq, vsrq.srq);
}

uint32_t pow2_at_least(uint32_t value, uint32_t minimum);
size_t page_align(size_t size);
int buf_alloc(struct vrdma_buf *buf, size_t size);
void buf_free(struct vrdma_buf *buf);
void *vrdma_abandon(struct vrdma_buf *buf, void *obj, int err);
int vrdma_query_device_ex(struct ibv_context *context, const struct ibv_query_device_ex_input *input,
				 struct ibv_device_attr_ex *attr, size_t attr_size);
int vrdma_query_port(struct ibv_context *context, uint8_t port, struct ibv_port_attr *attr);
struct ibv_pd *vrdma_alloc_pd(struct ibv_context *context);
int vrdma_dealloc_pd(struct ibv_pd *ibpd);
struct ibv_mr *vrdma_reg_mr(struct ibv_pd *pd, void *addr, size_t length, uint64_t hca_va, int access);
int vrdma_dereg_mr(struct verbs_mr *vmr);
struct ibv_cq *vrdma_create_cq(struct ibv_context *context, int cqe, struct ibv_comp_channel *channel,
				      int comp_vector);
int vrdma_destroy_cq(struct ibv_cq *ibcq);
int vrdma_modify_cq(struct ibv_cq *ibcq, struct ibv_modify_cq_attr *attr);
int vrdma_poll_cq(struct ibv_cq *ibcq, int ne, struct ibv_wc *wc);
int vrdma_req_notify_cq(struct ibv_cq *ibcq, int solicited_only);
struct ibv_qp *vrdma_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
struct ibv_qp *vrdma_create_qp_ex(struct ibv_context *context, struct ibv_qp_init_attr_ex *attr_ex);
int vrdma_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int attr_mask);
int vrdma_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int attr_mask,
			  struct ibv_qp_init_attr *init_attr);
int vrdma_destroy_qp(struct ibv_qp *ibqp);
int vrdma_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
int vrdma_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
struct ibv_srq *vrdma_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr);
int vrdma_modify_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr, int mask);
int vrdma_query_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr);
int vrdma_destroy_srq(struct ibv_srq *ibsrq);
int vrdma_post_srq_recv(struct ibv_srq *ibsrq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
struct ibv_ah *vrdma_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr);
int vrdma_destroy_ah(struct ibv_ah *ibah);

#endif /* VRDMA_PROVIDER_H */
