// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/* Completion queues: the ring the device writes, polled here with no system call; arming; flushing a lost context. */
#include "ring.h"

static int vrdma_destroy_cq_cmd(struct vrdma_context *ctx, struct ibv_cq *ibcq);

struct ibv_cq *vrdma_create_cq(struct ibv_context *context, int cqe, struct ibv_comp_channel *channel,
			       int comp_vector)
{
	struct vrdma_context *ctx = to_vctx(context);
	struct uvrdma_create_cq cmd = {};
	struct uvrdma_create_cq_resp resp = {};
	struct vrdma_cq *cq;
	int ret;

	if (cqe < 1 || cqe > (1 << 24)) {
		errno = EINVAL;
		return NULL;
	}
	cq = calloc(1, sizeof(*cq));
	if (!cq)
		return vrdma_abandon(NULL, NULL, ENOMEM);
	cq->entries = pow2_at_least((uint32_t)cqe, 8);
	ret = buf_alloc(ctx, &cq->buf, VRDMA_PAGE_SIZE + (size_t)cq->entries * sizeof(struct vrdma_cqe));
	if (ret)
		goto err_free;
	pthread_spin_init(&cq->lock, PTHREAD_PROCESS_PRIVATE);
	cmd.buf_addr = (uintptr_t)cq->buf.addr;
	cmd.buf_size = cq->buf.size;
	cmd.entries = cq->entries;
	if (ctx->chan)
		ret = vrdma_chan_create_cq(ctx, cq, channel, &resp.db_index);
	else
		ret = ibv_cmd_create_cq(context, cqe, channel, comp_vector, &cq->vcq.cq, &cmd.ibv_cmd, sizeof(cmd),
					&resp.ibv_resp, sizeof(resp));
	if (ret)
		goto err_free;
	cq->db = vrdma_db_map(ctx, resp.db_index, resp.db_offset);
	if (!cq->db) {
		ret = errno;
		vrdma_destroy_cq_cmd(ctx, &cq->vcq.cq);
		goto err_free;
	}
	return &cq->vcq.cq;

err_free:
	return vrdma_abandon(&cq->buf, cq, ret);
}

/* The device forgets the CQ: through the kernel, or a container's channel. */
static int vrdma_destroy_cq_cmd(struct vrdma_context *ctx, struct ibv_cq *ibcq)
{
	return ctx->chan ? vrdma_chan_destroy(ctx, VRDMA_CMD_DESTROY_CQ, ibcq->handle) : ibv_cmd_destroy_cq(ibcq);
}

int vrdma_destroy_cq(struct ibv_cq *ibcq)
{
	struct vrdma_cq *cq = to_vcq(ibcq);
	int ret = vrdma_destroy_cq_cmd(to_vctx(ibcq->context), ibcq);

	if (ret)
		return ret;
	buf_free(&cq->buf);
	pthread_spin_destroy(&cq->lock);
	free(cq);
	return 0;
}

int vrdma_modify_cq(struct ibv_cq *ibcq, struct ibv_modify_cq_attr *attr)
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

		if (!qp->sq.db)
			continue;  /* an XRC receive QP: nothing posted, nothing to flush */
		if (qp->vqp.qp.send_cq == &cq->vcq.cq) {
			pthread_spin_lock(&qp->sq.lock);
			n += flush_queue(&qp->sq, &hdr->sq_cons, qp->vqp.qp.qp_num, true, ne - n, wc + n);
			pthread_spin_unlock(&qp->sq.lock);
		}
		if (qp->vqp.qp.recv_cq == &cq->vcq.cq && qp->rq.db) {
			pthread_spin_lock(&qp->rq.lock);
			n += flush_queue(&qp->rq, &hdr->rq_cons, qp->vqp.qp.qp_num, false, ne - n, wc + n);
			pthread_spin_unlock(&qp->rq.lock);
		}
	}
	pthread_mutex_unlock(&ctx->qps_lock);
	return n;
}

/*
 * A QP went back to RESET (or away): its completions not polled yet leave the CQ, as an HCA's driver cleans them
 * (mlx5_cq_clean), so that a QP brought up again does not reap its own past (the flush errors of its last error
 * state). The others move up to close the gap, walking down from the producer index: the device only writes
 * at and past it, and only into the room the consumer index gives, which this only adds to.
 */
void vrdma_cq_clean(struct ibv_cq *ibcq, uint32_t qp_num)
{
	struct vrdma_cq *cq = to_vcq(ibcq);
	struct vrdma_cq_ring_hdr *hdr = cq->buf.addr;
	struct vrdma_cqe *ring = (struct vrdma_cqe *)((uint8_t *)cq->buf.addr + VRDMA_PAGE_SIZE);
	uint32_t prod, freed = 0, mask = cq->entries - 1;

	pthread_spin_lock(&cq->lock);
	prod = __atomic_load_n(&hdr->prod, __ATOMIC_ACQUIRE);
	if (prod - cq->cons <= cq->entries) {  /* (else not the device's index: vrdma_poll_cq says so) */
		for (uint32_t i = prod; i != cq->cons;) {
			i--;
			if (ring[i & mask].qp_num == qp_num)
				freed++;
			else if (freed)
				ring[(i + freed) & mask] = ring[i & mask];
		}
		cq->cons += freed;
		__atomic_store_n(&hdr->cons, cq->cons, __ATOMIC_RELEASE);
	}
	pthread_spin_unlock(&cq->lock);
}

int vrdma_poll_cq(struct ibv_cq *ibcq, int ne, struct ibv_wc *wc)
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
		w->wc_flags = cqe->wc_flags & (VRDMA_WC_WITH_IMM | VRDMA_WC_GRH);  /* libibverbs' values */
		if (cqe->wc_flags & VRDMA_WC_WITH_INV)
			w->wc_flags |= IBV_WC_WITH_INV;  /* imm_data: the invalidated rkey */
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

int vrdma_req_notify_cq(struct ibv_cq *ibcq, int solicited_only)
{
	struct vrdma_cq *cq = to_vcq(ibcq);

	pthread_spin_lock(&cq->lock);
	cq->arm_seq++;
	ring_doorbell(cq->db, (cq->arm_seq << VRDMA_CQ_ARM_SEQ_SHIFT) |
		      (solicited_only ? VRDMA_CQ_ARM_SOLICITED : VRDMA_CQ_ARM_NEXT));
	/*
	 * The arm before the caller's next poll (it polls once more after arming, to catch a completion that came
	 * first): a store then a load, which only a full fence keeps in order. The engine fences its side between a
	 * CQE's publication and its look at this slot; without both, each may miss the other and no event ever comes.
	 */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	pthread_spin_unlock(&cq->lock);
	return 0;
}

/* -- queues ----------------------------------------------------------------------------------------------------- */
