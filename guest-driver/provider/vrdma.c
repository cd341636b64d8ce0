// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * libvrdma: the rdma-core provider of the vrdma paravirtual RDMA device.
 *
 * libibverbs loads this plugin for every uverbs device whose parent is a virtio device with ID 42 (modalias
 * "virtio:d0000002Av*"). It is built inside an rdma-core source tree (providers/vrdma), because providers use
 * rdma-core's private interface (driver.h, IBVERBS_PRIVATE_<N>), which no -dev package ships.
 *
 * Control verbs go through the kernel (ibv_cmd_*). The data path does not: every ring (CQ, send and receive
 * queues, SRQ) lives in this process's memory, which vrdma.ko pins and hands to the device; post_send writes WQEs
 * and stores the producer index into the context's doorbell page (mapped from the device's doorbell region),
 * poll_cq reads CQEs the device wrote, req_notify_cq stores an arm request. No system call and no VM exit -
 * unless the device's engine is parked (slot 0 of the doorbell page says so), then a post_send also wakes it
 * through the kernel (a POST_SEND with no work requests). Every value the kernel hands back is checked.
 */
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

static uint32_t pow2_at_least(uint32_t value, uint32_t minimum)
{
	uint32_t result = minimum;

	while (result < value && result < (1u << 30))
		result <<= 1;
	return result;
}

static size_t page_align(size_t size)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);

	return (size + page - 1) & ~(page - 1);
}

static int buf_alloc(struct vrdma_buf *buf, size_t size)
{
	buf->size = page_align(size);
	if (posix_memalign(&buf->addr, (size_t)sysconf(_SC_PAGESIZE), buf->size))
		return ENOMEM;
	memset(buf->addr, 0, buf->size);
	if (ibv_dontfork_range(buf->addr, buf->size)) {
		free(buf->addr);
		buf->addr = NULL;
		return ENOMEM;
	}
	return 0;
}

static void buf_free(struct vrdma_buf *buf)
{
	if (!buf->addr)
		return;
	ibv_dofork_range(buf->addr, buf->size);
	free(buf->addr);
	buf->addr = NULL;
}

static inline void ring_doorbell(struct vrdma_context *ctx, uint32_t slot, uint32_t value)
{
	__atomic_store_n(&ctx->doorbell[slot], value, __ATOMIC_RELEASE);
}

/* After ringing: if the device's engine is parked, wake it (the store above and this load must not pass). */
static void wake_if_parked(struct vrdma_context *ctx, struct vrdma_qp *qp)
{
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (!__atomic_load_n(&ctx->doorbell[VRDMA_DB_SLOT_PARKED], __ATOMIC_ACQUIRE))
		return;
	qp->wake_cmd.qp_handle = qp->vqp.qp.handle;
	if (write(ctx->ibv_ctx.context.cmd_fd, &qp->wake_cmd, sizeof(qp->wake_cmd)) != sizeof(qp->wake_cmd))
		verbs_err(&ctx->ibv_ctx, "vrdma: waking the device failed: %s\n", strerror(errno));
}

/*
 * Whether the device still knows this context (VRDMA_DB_SLOT_ALIVE). A restarted backend clears the word; the
 * kernel maps a zero page over the doorbell page when it detaches the context from a lost device.
 */
static inline bool ctx_alive(struct vrdma_context *ctx)
{
	return __atomic_load_n(&ctx->doorbell[VRDMA_DB_SLOT_ALIVE], __ATOMIC_ACQUIRE) == VRDMA_DB_ALIVE;
}

static int vrdma_query_device_ex(struct ibv_context *context, const struct ibv_query_device_ex_input *input,
				 struct ibv_device_attr_ex *attr, size_t attr_size)
{
	struct ib_uverbs_ex_query_device_resp resp;
	size_t resp_size = sizeof(resp);
	uint64_t fw;
	int ret;

	ret = ibv_cmd_query_device_any(context, input, attr, attr_size, &resp, &resp_size);
	if (ret)
		return ret;
	fw = resp.base.fw_ver;
	snprintf(attr->orig_attr.fw_ver, sizeof(attr->orig_attr.fw_ver), "%u.%u.%u",
		 (unsigned int)(fw >> 32) & 0xffff, (unsigned int)(fw >> 16) & 0xffff, (unsigned int)fw & 0xffff);
	return 0;
}

static int vrdma_query_port(struct ibv_context *context, uint8_t port, struct ibv_port_attr *attr)
{
	struct ibv_query_port cmd;

	return ibv_cmd_query_port(context, port, attr, &cmd, sizeof(cmd));
}

static struct ibv_pd *vrdma_alloc_pd(struct ibv_context *context)
{
	struct ibv_alloc_pd cmd;
	struct vrdma_alloc_pd_cmd_resp resp = {};
	struct vrdma_pd *pd;
	int ret;

	pd = calloc(1, sizeof(*pd));
	if (!pd) {
		errno = ENOMEM;
		return NULL;
	}
	ret = ibv_cmd_alloc_pd(context, &pd->ibv_pd, &cmd, sizeof(cmd), &resp.ibv_resp, sizeof(resp));
	if (ret) {
		free(pd);
		errno = ret;
		return NULL;
	}
	pd->pdn = resp.drv.pdn;
	return &pd->ibv_pd;
}

static int vrdma_dealloc_pd(struct ibv_pd *ibpd)
{
	int ret;

	ret = ibv_cmd_dealloc_pd(ibpd);
	if (ret)
		return ret;
	free(to_vpd(ibpd));
	return 0;
}


/* -- memory regions --------------------------------------------------------------------------------------------- */

static struct ibv_mr *vrdma_reg_mr(struct ibv_pd *pd, void *addr, size_t length, uint64_t hca_va, int access)
{
	struct ibv_reg_mr cmd;
	struct ib_uverbs_reg_mr_resp resp;
	struct verbs_mr *vmr;
	int ret;

	vmr = calloc(1, sizeof(*vmr));
	if (!vmr) {
		errno = ENOMEM;
		return NULL;
	}
	ret = ibv_cmd_reg_mr(pd, addr, length, hca_va, access, vmr, &cmd, sizeof(cmd), &resp, sizeof(resp));
	if (ret) {
		free(vmr);
		errno = ret;
		return NULL;
	}
	return &vmr->ibv_mr;
}

static int vrdma_dereg_mr(struct verbs_mr *vmr)
{
	int ret = ibv_cmd_dereg_mr(vmr);

	if (ret)
		return ret;
	free(vmr);
	return 0;
}

/* -- completion queues ------------------------------------------------------------------------------------------ */

static struct ibv_cq *vrdma_create_cq(struct ibv_context *context, int cqe, struct ibv_comp_channel *channel,
				      int comp_vector)
{
	struct vrdma_create_cq_req cmd = {};
	struct vrdma_create_cq_rsp resp = {};
	struct vrdma_cq *cq;
	int ret;

	if (cqe < 1 || cqe > (1 << 24)) {
		errno = EINVAL;
		return NULL;
	}
	cq = calloc(1, sizeof(*cq));
	if (!cq) {
		errno = ENOMEM;
		return NULL;
	}
	cq->entries = pow2_at_least((uint32_t)cqe, 8);
	ret = buf_alloc(&cq->buf, VRDMA_PAGE_SIZE + (size_t)cq->entries * sizeof(struct vrdma_cqe));
	if (ret)
		goto err_free;
	pthread_spin_init(&cq->lock, PTHREAD_PROCESS_PRIVATE);
	cmd.drv.buf_addr = (uintptr_t)cq->buf.addr;
	cmd.drv.buf_size = cq->buf.size;
	cmd.drv.entries = cq->entries;
	ret = ibv_cmd_create_cq(context, cqe, channel, comp_vector, &cq->vcq.cq, &cmd.ibv_cmd, sizeof(cmd),
				&resp.ibv_resp, sizeof(resp));
	if (ret)
		goto err_buf;
	if (resp.drv.db_slot == VRDMA_DB_SLOT_PARKED || resp.drv.db_slot >= VRDMA_DB_SLOTS) {
		ibv_cmd_destroy_cq(&cq->vcq.cq);
		ret = EPROTO;
		goto err_buf;
	}
	cq->db_slot = resp.drv.db_slot;
	return &cq->vcq.cq;

err_buf:
	buf_free(&cq->buf);
err_free:
	free(cq);
	errno = ret;
	return NULL;
}

static int vrdma_destroy_cq(struct ibv_cq *ibcq)
{
	struct vrdma_cq *cq = to_vcq(ibcq);
	int ret = ibv_cmd_destroy_cq(ibcq);

	if (ret)
		return ret;
	buf_free(&cq->buf);
	pthread_spin_destroy(&cq->lock);
	free(cq);
	return 0;
}

static int vrdma_modify_cq(struct ibv_cq *ibcq, struct ibv_modify_cq_attr *attr)
{
	struct ibv_modify_cq cmd = {};

	if (attr->attr_mask & ~IBV_CQ_ATTR_MODERATE)
		return EOPNOTSUPP;
	return ibv_cmd_modify_cq(ibcq, attr, &cmd, sizeof(cmd));
}

/* A flushed work request's completion: status WR_FLUSH_ERR, and only wr_id and qp_num defined. */
static void flush_wc(struct ibv_wc *w, uint64_t wr_id, uint32_t qp_num, enum ibv_wc_opcode opcode)
{
	memset(w, 0, sizeof(*w));
	w->wr_id = wr_id;
	w->status = IBV_WC_WR_FLUSH_ERR;
	w->opcode = opcode;
	w->qp_num = qp_num;
}

/* Outstanding WQEs of one ring, from the device's consumer index to our producer index, as flushed completions. */
static int flush_queue(struct vrdma_queue *q, volatile uint32_t *cons, uint32_t qp_num, bool send, int ne,
		       struct ibv_wc *wc)
{
	uint32_t at = __atomic_load_n(cons, __ATOMIC_ACQUIRE);
	int n = 0;

	if (q->prod - at > q->depth)
		at = q->prod - q->depth;  /* an index that is not the device's: flush what the ring can hold */
	for (; n < ne && at != q->prod; n++, at++) {
		const uint8_t *wqe = q->base + (size_t)(at & (q->depth - 1)) * q->stride;
		uint64_t wr_id;

		memcpy(&wr_id, wqe, sizeof(wr_id));  /* wr_id is the first field of both WQE kinds */
		flush_wc(&wc[n], wr_id, qp_num, send ? IBV_WC_SEND : IBV_WC_RECV);
	}
	__atomic_store_n(cons, at, __ATOMIC_RELEASE);  /* the device is gone: the consumer index is ours now */
	return n;
}

/*
 * The device lost the context: complete every outstanding work request of the QPs feeding this CQ with
 * WR_FLUSH_ERR (as a QP in the error state would), so that programs polling for completions see the error instead
 * of waiting for ever. Receives posted to an SRQ stay there, as the verbs define for a QP in error.
 */
static int flush_cq(struct vrdma_context *ctx, struct vrdma_cq *cq, int ne, struct ibv_wc *wc)
{
	struct vrdma_qp *qp;
	int n = 0;

	pthread_mutex_lock(&ctx->qps_lock);
	for (qp = ctx->qps; qp && n < ne; qp = qp->next) {
		struct vrdma_qp_ring_hdr *hdr = qp->buf.addr;

		if (qp->vqp.qp.send_cq == &cq->vcq.cq) {
			pthread_spin_lock(&qp->sq.lock);
			n += flush_queue(&qp->sq, &hdr->sq_cons, qp->vqp.qp.qp_num, true, ne - n, wc + n);
			pthread_spin_unlock(&qp->sq.lock);
		}
		if (qp->vqp.qp.recv_cq == &cq->vcq.cq && !qp->vqp.qp.srq) {
			pthread_spin_lock(&qp->rq.lock);
			n += flush_queue(&qp->rq, &hdr->rq_cons, qp->vqp.qp.qp_num, false, ne - n, wc + n);
			pthread_spin_unlock(&qp->rq.lock);
		}
	}
	pthread_mutex_unlock(&ctx->qps_lock);
	return n;
}

static int vrdma_poll_cq(struct ibv_cq *ibcq, int ne, struct ibv_wc *wc)
{
	struct vrdma_cq *cq = to_vcq(ibcq);
	struct vrdma_cq_ring_hdr *hdr = cq->buf.addr;
	const struct vrdma_cqe *ring = (const struct vrdma_cqe *)((uint8_t *)cq->buf.addr + VRDMA_PAGE_SIZE);
	uint32_t prod;
	int n = 0;

	pthread_spin_lock(&cq->lock);
	prod = __atomic_load_n(&hdr->prod, __ATOMIC_ACQUIRE);
	if (prod - cq->cons > cq->entries) {
		/* More completions than the ring holds: the index is not the device's. Read nothing. */
		pthread_spin_unlock(&cq->lock);
		verbs_err(verbs_get_ctx(ibcq->context), "vrdma: CQ producer index %u is %u past consumer %u (ring %u)\n",
			  prod, prod - cq->cons, cq->cons, cq->entries);
		return -EIO;
	}
	while (n < ne && cq->cons != prod) {
		const struct vrdma_cqe *cqe = &ring[cq->cons & (cq->entries - 1)];
		struct ibv_wc *w = &wc[n++];

		memset(w, 0, sizeof(*w));
		w->wr_id = cqe->wr_id;
		w->status = cqe->status;
		w->opcode = cqe->opcode;
		w->byte_len = cqe->byte_len;
		w->imm_data = cqe->imm_data;
		w->qp_num = cqe->qp_num;
		w->src_qp = cqe->src_qp;
		w->wc_flags = cqe->wc_flags & VRDMA_WC_WITH_IMM;
		w->vendor_err = cqe->status;
		cq->cons++;
	}
	__atomic_store_n(&hdr->cons, cq->cons, __ATOMIC_RELEASE);
	/* Nothing from the device: one load tells whether it still exists for us. */
	if (n < ne && cq->cons == prod && !ctx_alive(to_vctx(ibcq->context)))
		n += flush_cq(to_vctx(ibcq->context), cq, ne - n, wc + n);
	pthread_spin_unlock(&cq->lock);
	return n;
}

static int vrdma_req_notify_cq(struct ibv_cq *ibcq, int solicited_only)
{
	struct vrdma_cq *cq = to_vcq(ibcq);
	struct vrdma_context *ctx = to_vctx(ibcq->context);

	pthread_spin_lock(&cq->lock);
	cq->arm_seq++;
	ring_doorbell(ctx, cq->db_slot, (cq->arm_seq << VRDMA_CQ_ARM_SEQ_SHIFT) |
		      (solicited_only ? VRDMA_CQ_ARM_SOLICITED : VRDMA_CQ_ARM_NEXT));
	pthread_spin_unlock(&cq->lock);
	return 0;
}

/* -- queues ----------------------------------------------------------------------------------------------------- */

static void queue_init(struct vrdma_queue *q, uint8_t *base, uint32_t depth, uint32_t stride, uint32_t max_sge,
		       uint32_t db_slot)
{
	q->base = base;
	q->depth = depth;
	q->stride = stride;
	q->max_sge = max_sge;
	q->db_slot = db_slot;
	q->prod = 0;
	pthread_spin_init(&q->lock, PTHREAD_PROCESS_PRIVATE);
}

static bool slot_ok(uint32_t slot)
{
	return slot != VRDMA_DB_SLOT_PARKED && slot < VRDMA_DB_SLOTS;
}

/*
 * Room in a ring whose consumer index the device publishes: `prod - cons` WQEs are outstanding. A consumer index
 * ahead of the producer is not the device's; the ring then counts as full.
 */
static bool ring_full(const struct vrdma_queue *q, volatile uint32_t *cons)
{
	uint32_t outstanding = q->prod - __atomic_load_n(cons, __ATOMIC_ACQUIRE);

	return outstanding >= q->depth;
}

/* Post receive WQEs to an RQ or SRQ ring; `cons` is the device's consumer index in the ring header. */
static int post_recv_ring(struct vrdma_context *ctx, struct vrdma_queue *q, volatile uint32_t *cons,
			  struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	int ret = 0;

	if (!ctx_alive(ctx)) {
		*bad_wr = wr;
		return EIO;
	}
	pthread_spin_lock(&q->lock);
	for (; wr; wr = wr->next) {
		struct vrdma_recv_wqe *wqe;
		struct vrdma_sge *sge;

		if (ring_full(q, cons)) {
			ret = ENOMEM;
			break;
		}
		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > q->max_sge) {
			ret = EINVAL;
			break;
		}
		wqe = (struct vrdma_recv_wqe *)(q->base + (size_t)(q->prod & (q->depth - 1)) * q->stride);
		wqe->wr_id = wr->wr_id;
		wqe->num_sge = (uint32_t)wr->num_sge;
		wqe->reserved = 0;
		sge = (struct vrdma_sge *)(wqe + 1);
		for (int i = 0; i < wr->num_sge; i++) {
			sge[i].addr = wr->sg_list[i].addr;
			sge[i].length = wr->sg_list[i].length;
			sge[i].lkey = wr->sg_list[i].lkey;
		}
		q->prod++;
	}
	if (ret)
		*bad_wr = wr;
	/* Receives are taken when a send arrives: no need to wake a parked engine for them. */
	ring_doorbell(ctx, q->db_slot, q->prod);
	pthread_spin_unlock(&q->lock);
	return ret;
}

static struct ibv_qp *vrdma_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	struct vrdma_context *ctx = to_vctx(pd->context);
	struct vrdma_create_qp_req cmd = {};
	struct vrdma_create_qp_rsp resp = {};
	struct ibv_qp_cap *cap = &attr->cap;
	uint32_t sq_depth, rq_depth = 0, sq_stride, rq_stride = 0, sq_bytes, rq_bytes = 0;
	struct vrdma_qp *qp;
	int ret;

	if (attr->qp_type != IBV_QPT_RC) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (cap->max_send_wr > (1u << 20) || cap->max_recv_wr > (1u << 20) || cap->max_send_sge > 255 ||
	    cap->max_recv_sge > 255 || cap->max_inline_data > VRDMA_PAGE_SIZE - sizeof(struct vrdma_send_wqe)) {
		errno = EINVAL;
		return NULL;
	}
	qp = calloc(1, sizeof(*qp));
	if (!qp) {
		errno = ENOMEM;
		return NULL;
	}
	sq_depth = pow2_at_least(cap->max_send_wr, 1);
	sq_stride = pow2_at_least(sizeof(struct vrdma_send_wqe) +
				  (cap->max_send_sge * sizeof(struct vrdma_sge) > cap->max_inline_data ?
				   cap->max_send_sge * sizeof(struct vrdma_sge) : cap->max_inline_data), 64);
	sq_bytes = (uint32_t)page_align((size_t)sq_depth * sq_stride);
	if (!attr->srq) {
		rq_depth = pow2_at_least(cap->max_recv_wr, 1);
		rq_stride = pow2_at_least(sizeof(struct vrdma_recv_wqe) + cap->max_recv_sge * sizeof(struct vrdma_sge),
					  32);
		rq_bytes = (uint32_t)page_align((size_t)rq_depth * rq_stride);
	}
	if (sq_stride > VRDMA_PAGE_SIZE || rq_stride > VRDMA_PAGE_SIZE) {
		ret = EINVAL;
		goto err_free;
	}
	ret = buf_alloc(&qp->buf, VRDMA_PAGE_SIZE + (size_t)sq_bytes + rq_bytes);
	if (ret)
		goto err_free;
	cmd.drv.buf_addr = (uintptr_t)qp->buf.addr;
	cmd.drv.buf_size = qp->buf.size;
	cmd.drv.sq_depth = sq_depth;
	cmd.drv.rq_depth = rq_depth;
	cmd.drv.sq_stride = sq_stride;
	cmd.drv.rq_stride = rq_stride;
	cmd.drv.sq_offset = VRDMA_PAGE_SIZE;
	cmd.drv.rq_offset = attr->srq ? 0 : VRDMA_PAGE_SIZE + sq_bytes;
	ret = ibv_cmd_create_qp(pd, &qp->vqp.qp, attr, &cmd.ibv_cmd, sizeof(cmd), &resp.ibv_resp, sizeof(resp));
	if (ret)
		goto err_buf;
	if (!slot_ok(resp.drv.sq_db_slot) || (!attr->srq && !slot_ok(resp.drv.rq_db_slot))) {
		ibv_cmd_destroy_qp(&qp->vqp.qp);
		ret = EPROTO;
		goto err_buf;
	}
	queue_init(&qp->sq, (uint8_t *)qp->buf.addr + VRDMA_PAGE_SIZE, sq_depth, sq_stride, cap->max_send_sge,
		   resp.drv.sq_db_slot);
	queue_init(&qp->rq, (uint8_t *)qp->buf.addr + VRDMA_PAGE_SIZE + sq_bytes, rq_depth, rq_stride,
		   cap->max_recv_sge, resp.drv.rq_db_slot);
	qp->max_inline = cap->max_inline_data;
	cap->max_send_wr = sq_depth;
	cap->max_recv_wr = rq_depth;
	/* The wake-up: a POST_SEND of no work requests (see wake_if_parked). */
	qp->wake_cmd.hdr.command = IB_USER_VERBS_CMD_POST_SEND;
	qp->wake_cmd.hdr.in_words = sizeof(qp->wake_cmd) / 4;
	qp->wake_cmd.hdr.out_words = sizeof(qp->wake_resp) / 4;
	qp->wake_cmd.response = (uintptr_t)&qp->wake_resp;
	qp->wake_cmd.wqe_size = sizeof(struct ibv_send_wr);
	pthread_mutex_lock(&ctx->qps_lock);
	qp->next = ctx->qps;
	ctx->qps = qp;
	pthread_mutex_unlock(&ctx->qps_lock);
	return &qp->vqp.qp;

err_buf:
	buf_free(&qp->buf);
err_free:
	free(qp);
	errno = ret;
	return NULL;
}

/* The extended entry point, for what the legacy one can express: a PD and no creation flags. The new posting
 * API (send_ops_flags, ibv_wr_*) and other QP types are not offered. */
static struct ibv_qp *vrdma_create_qp_ex(struct ibv_context *context, struct ibv_qp_init_attr_ex *attr_ex)
{
	struct ibv_qp_init_attr attr = {};
	struct ibv_qp *qp;

	if (!(attr_ex->comp_mask & IBV_QP_INIT_ATTR_PD) ||
	    (attr_ex->comp_mask & ~(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS)) ||
	    ((attr_ex->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && attr_ex->create_flags)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	attr.qp_context = attr_ex->qp_context;
	attr.send_cq = attr_ex->send_cq;
	attr.recv_cq = attr_ex->recv_cq;
	attr.srq = attr_ex->srq;
	attr.cap = attr_ex->cap;
	attr.qp_type = attr_ex->qp_type;
	attr.sq_sig_all = attr_ex->sq_sig_all;
	qp = vrdma_create_qp(attr_ex->pd, &attr);
	if (qp)
		attr_ex->cap = attr.cap;
	return qp;
}

static int vrdma_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int attr_mask)
{
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct vrdma_context *ctx = to_vctx(ibqp->context);
	struct ibv_modify_qp cmd = {};
	int ret;

	ret = ibv_cmd_modify_qp(ibqp, attr, attr_mask, &cmd, sizeof(cmd));
	if (ret)
		return ret;
	if ((attr_mask & IBV_QP_STATE) && attr->qp_state == IBV_QPS_RESET) {
		/* Emptied queues: both sides count from zero again. */
		pthread_spin_lock(&qp->sq.lock);
		qp->sq.prod = 0;
		ring_doorbell(ctx, qp->sq.db_slot, 0);
		pthread_spin_unlock(&qp->sq.lock);
		if (!ibqp->srq) {
			pthread_spin_lock(&qp->rq.lock);
			qp->rq.prod = 0;
			ring_doorbell(ctx, qp->rq.db_slot, 0);
			pthread_spin_unlock(&qp->rq.lock);
		}
	}
	return 0;
}

static int vrdma_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int attr_mask,
			  struct ibv_qp_init_attr *init_attr)
{
	struct ibv_query_qp cmd;

	return ibv_cmd_query_qp(ibqp, attr, attr_mask, init_attr, &cmd, sizeof(cmd));
}

static int vrdma_destroy_qp(struct ibv_qp *ibqp)
{
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct vrdma_context *ctx = to_vctx(ibqp->context);
	struct vrdma_qp **link;
	int ret = ibv_cmd_destroy_qp(ibqp);

	if (ret)
		return ret;
	pthread_mutex_lock(&ctx->qps_lock);
	for (link = &ctx->qps; *link; link = &(*link)->next) {
		if (*link == qp) {
			*link = qp->next;
			break;
		}
	}
	pthread_mutex_unlock(&ctx->qps_lock);
	buf_free(&qp->buf);
	pthread_spin_destroy(&qp->sq.lock);
	pthread_spin_destroy(&qp->rq.lock);
	free(qp);
	return 0;
}

static bool opcode_ok(enum ibv_wr_opcode op)
{
	switch (op) {
	case IBV_WR_SEND:
	case IBV_WR_SEND_WITH_IMM:
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
	case IBV_WR_RDMA_READ:
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		return true;
	default:
		return false;
	}
}

static int vrdma_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct vrdma_context *ctx = to_vctx(ibqp->context);
	struct vrdma_queue *q = &qp->sq;
	struct vrdma_qp_ring_hdr *hdr = qp->buf.addr;
	uint32_t posted = 0;
	int ret = 0;

	if (!ctx_alive(ctx)) {
		*bad_wr = wr;  /* the device lost this context: nothing posted now would ever complete */
		return EIO;
	}
	pthread_spin_lock(&q->lock);
	for (; wr; wr = wr->next) {
		struct vrdma_send_wqe *wqe;
		bool is_atomic = wr->opcode == IBV_WR_ATOMIC_CMP_AND_SWP || wr->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;

		if (ring_full(q, &hdr->sq_cons)) {
			ret = ENOMEM;
			break;
		}
		if (!opcode_ok(wr->opcode) || wr->num_sge < 0 || (uint32_t)wr->num_sge > q->max_sge) {
			ret = EINVAL;
			break;
		}
		wqe = (struct vrdma_send_wqe *)(q->base + (size_t)(q->prod & (q->depth - 1)) * q->stride);
		memset(wqe, 0, sizeof(*wqe));
		wqe->wr_id = wr->wr_id;
		wqe->opcode = (uint8_t)wr->opcode;
		wqe->send_flags = (uint8_t)(wr->send_flags & (IBV_SEND_FENCE | IBV_SEND_SIGNALED | IBV_SEND_SOLICITED |
							      IBV_SEND_INLINE));
		wqe->imm_data = wr->imm_data;
		if (is_atomic) {
			wqe->remote_addr = wr->wr.atomic.remote_addr;
			wqe->rkey = wr->wr.atomic.rkey;
			wqe->compare_add = wr->wr.atomic.compare_add;
			wqe->swap = wr->wr.atomic.swap;
		} else if (wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_SEND_WITH_IMM) {
			wqe->remote_addr = wr->wr.rdma.remote_addr;
			wqe->rkey = wr->wr.rdma.rkey;
		}
		if (wr->send_flags & IBV_SEND_INLINE) {
			uint8_t *data = (uint8_t *)(wqe + 1);
			uint32_t len = 0;

			for (int i = 0; i < wr->num_sge; i++) {
				if (wr->sg_list[i].length > qp->max_inline - len) {
					ret = EINVAL;
					break;
				}
				memcpy(data + len, (void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
				len += wr->sg_list[i].length;
			}
			if (ret)
				break;
			wqe->inline_len = len;
		} else {
			struct vrdma_sge *sge = (struct vrdma_sge *)(wqe + 1);

			wqe->num_sge = (uint8_t)wr->num_sge;
			for (int i = 0; i < wr->num_sge; i++) {
				sge[i].addr = wr->sg_list[i].addr;
				sge[i].length = wr->sg_list[i].length;
				sge[i].lkey = wr->sg_list[i].lkey;
			}
		}
		q->prod++;
		posted++;
	}
	if (ret)
		*bad_wr = wr;
	if (posted) {
		ring_doorbell(ctx, q->db_slot, q->prod);
		wake_if_parked(ctx, qp);
	}
	pthread_spin_unlock(&q->lock);
	return ret;
}

static int vrdma_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct vrdma_qp_ring_hdr *hdr = qp->buf.addr;

	if (ibqp->srq) {
		*bad_wr = wr;
		return EINVAL;
	}
	return post_recv_ring(to_vctx(ibqp->context), &qp->rq, &hdr->rq_cons, wr, bad_wr);
}

/* -- shared receive queues -------------------------------------------------------------------------------------- */

static struct ibv_srq *vrdma_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
	struct vrdma_create_srq_req cmd = {};
	struct vrdma_create_srq_rsp resp = {};
	struct vrdma_srq *srq;
	uint32_t depth, stride;
	int ret;

	if (attr->attr.max_wr > (1u << 20) || attr->attr.max_sge > 255) {
		errno = EINVAL;
		return NULL;
	}
	srq = calloc(1, sizeof(*srq));
	if (!srq) {
		errno = ENOMEM;
		return NULL;
	}
	depth = pow2_at_least(attr->attr.max_wr + 1, 2);  /* one more than asked: the limit must stay below it */
	stride = pow2_at_least(sizeof(struct vrdma_recv_wqe) + attr->attr.max_sge * sizeof(struct vrdma_sge), 32);
	if (stride > VRDMA_PAGE_SIZE) {
		ret = EINVAL;
		goto err_free;
	}
	ret = buf_alloc(&srq->buf, VRDMA_PAGE_SIZE + (size_t)depth * stride);
	if (ret)
		goto err_free;
	cmd.drv.buf_addr = (uintptr_t)srq->buf.addr;
	cmd.drv.buf_size = srq->buf.size;
	cmd.drv.depth = depth;
	cmd.drv.stride = stride;
	ret = ibv_cmd_create_srq(pd, &srq->vsrq.srq, attr, &cmd.ibv_cmd, sizeof(cmd), &resp.ibv_resp, sizeof(resp));
	if (ret)
		goto err_buf;
	if (!slot_ok(resp.drv.db_slot)) {
		ibv_cmd_destroy_srq(&srq->vsrq.srq);
		ret = EPROTO;
		goto err_buf;
	}
	queue_init(&srq->rq, (uint8_t *)srq->buf.addr + VRDMA_PAGE_SIZE, depth, stride, attr->attr.max_sge,
		   resp.drv.db_slot);
	return &srq->vsrq.srq;

err_buf:
	buf_free(&srq->buf);
err_free:
	free(srq);
	errno = ret;
	return NULL;
}

static int vrdma_modify_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr, int mask)
{
	struct ibv_modify_srq cmd;

	return ibv_cmd_modify_srq(ibsrq, attr, mask, &cmd, sizeof(cmd));
}

static int vrdma_query_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr)
{
	struct ibv_query_srq cmd;

	return ibv_cmd_query_srq(ibsrq, attr, &cmd, sizeof(cmd));
}

static int vrdma_destroy_srq(struct ibv_srq *ibsrq)
{
	struct vrdma_srq *srq = to_vsrq(ibsrq);
	int ret = ibv_cmd_destroy_srq(ibsrq);

	if (ret)
		return ret;
	buf_free(&srq->buf);
	pthread_spin_destroy(&srq->rq.lock);
	free(srq);
	return 0;
}

static int vrdma_post_srq_recv(struct ibv_srq *ibsrq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	struct vrdma_srq *srq = to_vsrq(ibsrq);
	struct vrdma_srq_ring_hdr *hdr = srq->buf.addr;

	return post_recv_ring(to_vctx(ibsrq->context), &srq->rq, &hdr->cons, wr, bad_wr);
}

/* -- address handles -------------------------------------------------------------------------------------------- */

static struct ibv_ah *vrdma_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
	struct ib_uverbs_create_ah_resp resp;
	struct vrdma_ah *ah;
	int ret;

	ah = calloc(1, sizeof(*ah));
	if (!ah) {
		errno = ENOMEM;
		return NULL;
	}
	ret = ibv_cmd_create_ah(pd, &ah->ibv_ah, attr, &resp, sizeof(resp));
	if (ret) {
		free(ah);
		errno = ret;
		return NULL;
	}
	return &ah->ibv_ah;
}

static int vrdma_destroy_ah(struct ibv_ah *ibah)
{
	int ret = ibv_cmd_destroy_ah(ibah);

	if (ret)
		return ret;
	free(container_of(ibah, struct vrdma_ah, ibv_ah));
	return 0;
}

static void vrdma_free_context(struct ibv_context *ibctx)
{
	struct vrdma_context *ctx = to_vctx(ibctx);

	if (ctx->doorbell)
		munmap((void *)ctx->doorbell, ctx->doorbell_size);
	pthread_mutex_destroy(&ctx->qps_lock);
	verbs_uninit_context(&ctx->ibv_ctx);
	free(ctx);
}

static const struct verbs_context_ops vrdma_ctx_ops = {
	.alloc_pd = vrdma_alloc_pd,
	.create_ah = vrdma_create_ah,
	.create_cq = vrdma_create_cq,
	.create_qp = vrdma_create_qp,
	.create_qp_ex = vrdma_create_qp_ex,
	.create_srq = vrdma_create_srq,
	.dealloc_pd = vrdma_dealloc_pd,
	.dereg_mr = vrdma_dereg_mr,
	.destroy_ah = vrdma_destroy_ah,
	.destroy_cq = vrdma_destroy_cq,
	.destroy_qp = vrdma_destroy_qp,
	.destroy_srq = vrdma_destroy_srq,
	.free_context = vrdma_free_context,
	.modify_cq = vrdma_modify_cq,
	.modify_qp = vrdma_modify_qp,
	.modify_srq = vrdma_modify_srq,
	.poll_cq = vrdma_poll_cq,
	.post_recv = vrdma_post_recv,
	.post_send = vrdma_post_send,
	.post_srq_recv = vrdma_post_srq_recv,
	.query_device_ex = vrdma_query_device_ex,
	.query_port = vrdma_query_port,
	.query_qp = vrdma_query_qp,
	.query_srq = vrdma_query_srq,
	.reg_mr = vrdma_reg_mr,
	.req_notify_cq = vrdma_req_notify_cq,
};

/* The doorbell page the kernel describes must be one whole page at a page-aligned offset. */
static int vrdma_check_doorbell(struct vrdma_context *ctx, const struct vrdma_alloc_ucontext_resp *resp)
{
	long page_size = sysconf(_SC_PAGESIZE);

	if (resp->doorbell_page == 0 || page_size <= 0 || resp->doorbell_page_size != (uint32_t)page_size ||
	    resp->doorbell_offset % (uint64_t)page_size != 0) {
		verbs_err(&ctx->ibv_ctx, "vrdma: kernel gave doorbell page %u, size %u, offset %#llx: not usable\n",
			  resp->doorbell_page, resp->doorbell_page_size,
			  (unsigned long long)resp->doorbell_offset);
		return EPROTO;
	}
	return 0;
}

static struct verbs_context *vrdma_alloc_context(struct ibv_device *ibdev, int cmd_fd, void *private_data)
{
	struct vrdma_context *ctx;
	struct ibv_get_context cmd;
	struct vrdma_get_context_resp resp = {};
	int ret;

	ctx = verbs_init_and_alloc_context(ibdev, cmd_fd, ctx, ibv_ctx, RDMA_DRIVER_UNKNOWN);
	if (!ctx)
		return NULL;
	pthread_mutex_init(&ctx->qps_lock, NULL);
	ret = ibv_cmd_get_context(&ctx->ibv_ctx, &cmd, sizeof(cmd), &resp.ibv_resp, sizeof(resp));
	if (ret)
		goto err_free;
	ret = vrdma_check_doorbell(ctx, &resp.drv);
	if (ret)
		goto err_free;
	ctx->doorbell_page = resp.drv.doorbell_page;
	ctx->doorbell_size = resp.drv.doorbell_page_size;
	ctx->doorbell = mmap(NULL, ctx->doorbell_size, PROT_READ | PROT_WRITE, MAP_SHARED, cmd_fd,
			     (off_t)resp.drv.doorbell_offset);
	if (ctx->doorbell == MAP_FAILED) {
		ret = errno;
		ctx->doorbell = NULL;
		verbs_err(&ctx->ibv_ctx, "vrdma: mapping doorbell page %u failed: %s\n", ctx->doorbell_page,
			  strerror(ret));
		goto err_free;
	}
	verbs_set_ops(&ctx->ibv_ctx, &vrdma_ctx_ops);
	return &ctx->ibv_ctx;

err_free:
	/* Closing the context's file (done by the caller on failure) releases what the kernel allocated. */
	pthread_mutex_destroy(&ctx->qps_lock);
	verbs_uninit_context(&ctx->ibv_ctx);
	free(ctx);
	errno = ret;
	return NULL;
}

static struct verbs_device *vrdma_device_alloc(struct verbs_sysfs_dev *sysfs_dev)
{
	struct vrdma_device *dev;

	dev = calloc(1, sizeof(*dev));
	if (!dev)
		return NULL;
	return &dev->ibv_dev;
}

static void vrdma_device_free(struct verbs_device *verbs_dev)
{
	free(container_of(verbs_dev, struct vrdma_device, ibv_dev));
}

static const struct verbs_match_ent vrdma_match_table[] = {
	/* The uverbs device's parent is the virtio device: virtio:d<device id>v<vendor id>. */
	VERBS_MODALIAS_MATCH("virtio:d0000002Av*", NULL),
	{},
};

static const struct verbs_device_ops vrdma_dev_ops = {
	.name = "vrdma",
	.match_min_abi_version = VRDMA_UVERBS_ABI_VERSION,
	.match_max_abi_version = VRDMA_UVERBS_ABI_VERSION,
	.match_table = vrdma_match_table,
	.alloc_device = vrdma_device_alloc,
	.uninit_device = vrdma_device_free,
	.alloc_context = vrdma_alloc_context,
};

PROVIDER_DRIVER(vrdma, vrdma_dev_ops);
