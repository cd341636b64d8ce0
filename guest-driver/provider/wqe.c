// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * The rings as the posting paths write them (ibv_post_send and ibv_post_recv in qp.c, the extended QP's
 * ibv_wr_* in qp_ex.c, ibv_post_srq_recv in srq.c): a queue's ring and doorbell, WQEs written at the producer
 * index, published by a store into the doorbell page, and the engine woken if it is parked.
 */
#include "ring.h"

/* After ringing: if the device's engine is parked, wake it (the store above and this load must not pass). */
static void wake_if_parked(struct vrdma_context *ctx, struct vrdma_qp *qp)
{
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (!__atomic_load_n(qp->sq.parked, __ATOMIC_ACQUIRE))
		return;
	if (ctx->chan) {
		vrdma_chan_wake(ctx);  /* a container's: the device's wake eventfd */
		return;
	}
	qp->wake_cmd.qp_handle = qp->vqp.qp.handle;
	if (write(ctx->ibv_ctx.context.cmd_fd, &qp->wake_cmd, sizeof(qp->wake_cmd)) != sizeof(qp->wake_cmd))
		verbs_err(&ctx->ibv_ctx, "vrdma: waking the device failed: %s\n", strerror(errno));
}

/*
 * A queue's ring and doorbell: index `db` of the page at mmap offset `db_offset` (none for the receive queue of a
 * QP with an SRQ: `has_db` false). 0 on success, else errno.
 */
int vrdma_queue_init(struct vrdma_context *ctx, struct vrdma_queue *q, uint8_t *base, uint32_t depth,
		      uint32_t stride, uint32_t max_sge, bool has_db, uint32_t db, uint64_t db_offset)
{
	q->base = base;
	q->depth = depth;
	q->stride = stride;
	q->max_sge = max_sge;
	q->prod = 0;
	q->db = q->parked = NULL;
	pthread_spin_init(&q->lock, PTHREAD_PROCESS_PRIVATE);
	if (!has_db)
		return 0;
	q->db = vrdma_db_map(ctx, db, db_offset);
	if (!q->db)
		return errno;
	q->parked = q->db - VRDMA_DB_SLOT(db) + VRDMA_DB_SLOT_PARKED;
	return 0;
}

/* Post receive WQEs to an RQ or SRQ ring; `cons` is the device's consumer index in the ring header. */
int vrdma_post_recv_ring(struct vrdma_context *ctx, struct vrdma_queue *q, volatile uint32_t *cons,
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
	ring_doorbell(q->db, q->prod);
	pthread_spin_unlock(&q->lock);
	return ret;
}

/*
 * The opcodes a QP of type `type` posts, as IBV_QP_EX_WITH_* bits (bit n: opcode n): UD sends; UC sends, writes,
 * local invalidations and window binds (it has no responses); RC and XRC all.
 */
uint64_t vrdma_qp_ops(enum ibv_qp_type type)
{
	const uint64_t ud = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
	const uint64_t uc = ud | IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
			    IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW;

	switch (type) {
	case IBV_QPT_UD:
		return ud;
	case IBV_QPT_UC:
		return uc;
	case IBV_QPT_RC:
	case IBV_QPT_XRC_SEND:
		return uc | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
		       IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_SEND_WITH_INV;
	default:
		return 0;
	}
}

/* A bind the device could take: a window, a remote right or local write (meaningless here) only, an MR unless the
 * length is 0 (no zero-based windows). */
bool vrdma_bind_ok(const struct ibv_mw *mw, const struct ibv_mw_bind_info *info)
{
	return mw && !(info->mw_access_flags & ~(VRDMA_MW_ACCESS | IBV_ACCESS_LOCAL_WRITE)) &&
	       (info->mr || !info->length);
}

void vrdma_set_bind(struct vrdma_send_wqe *wqe, const struct ibv_mw *mw, uint32_t rkey,
		    const struct ibv_mw_bind_info *info)
{
	wqe->bind.addr = info->addr;
	wqe->bind.length = info->length;
	wqe->bind.mr_lkey = info->mr ? info->mr->lkey : 0;
	wqe->bind.mw_rkey = mw->rkey;
	wqe->bind.new_rkey = rkey;
	wqe->bind.access = info->mw_access_flags & VRDMA_MW_ACCESS;  /* (local write: nothing here) */
}

static_assert(IBV_QP_EX_WITH_SEND_WITH_INV == 1 << IBV_WR_SEND_WITH_INV &&
	      IBV_QP_EX_WITH_RDMA_WRITE == 1 << IBV_WR_RDMA_WRITE, "a send_ops_flags bit per opcode");
static_assert(IBV_WR_LOCAL_INV == VRDMA_WR_LOCAL_INV && IBV_WR_BIND_MW == VRDMA_WR_BIND_MW &&
	      IBV_WR_SEND_WITH_INV == VRDMA_WR_SEND_WITH_INV && IBV_WC_BIND_MW == VRDMA_WC_OP_BIND_MW &&
	      IBV_WC_LOCAL_INV == VRDMA_WC_OP_LOCAL_INV, "work request and completion opcodes are libibverbs'");

/*
 * The next send WQE (zeroed, with its header) at the producer index, which moves past it; NULL when the ring is
 * full. The device sees it only once vrdma_sq_publish rings the doorbell. Called with the send queue's lock held.
 */
struct vrdma_send_wqe *vrdma_send_slot(struct vrdma_qp *qp, uint64_t wr_id, enum ibv_wr_opcode opcode,
				       unsigned int send_flags)
{
	struct vrdma_queue *q = &qp->sq;
	struct vrdma_qp_ring_hdr *hdr = qp->buf.addr;
	struct vrdma_send_wqe *wqe;

	if (ring_full(q, &hdr->sq_cons))
		return NULL;
	wqe = (struct vrdma_send_wqe *)(q->base + (size_t)(q->prod & (q->depth - 1)) * q->stride);
	memset(wqe, 0, sizeof(*wqe));
	wqe->wr_id = wr_id;
	wqe->opcode = (uint8_t)opcode;
	wqe->send_flags = (uint8_t)(send_flags & (IBV_SEND_FENCE | IBV_SEND_SIGNALED | IBV_SEND_SOLICITED |
						  IBV_SEND_INLINE));
	q->prod++;
	return wqe;
}

/* Append length bytes at addr to the WQE's inline data: 0, or EINVAL past the QP's max_inline. */
int vrdma_wqe_inline(struct vrdma_qp *qp, struct vrdma_send_wqe *wqe, const void *addr, size_t length)
{
	if (length > qp->max_inline - wqe->inline_len)
		return EINVAL;
	memcpy((uint8_t *)(wqe + 1) + wqe->inline_len, addr, length);
	wqe->inline_len += (uint32_t)length;
	wqe->send_flags |= IBV_SEND_INLINE;
	return 0;
}

/* The WQE's SGEs (the caller checked their count against the send queue's max_sge). */
void vrdma_wqe_sges(struct vrdma_send_wqe *wqe, const struct ibv_sge *sg_list, size_t num_sge)
{
	struct vrdma_sge *sge = (struct vrdma_sge *)(wqe + 1);

	for (size_t i = 0; i < num_sge; i++) {
		sge[i].addr = sg_list[i].addr;
		sge[i].length = sg_list[i].length;
		sge[i].lkey = sg_list[i].lkey;
	}
	wqe->num_sge = (uint8_t)num_sge;
}

/* Hand the device what was written since the last doorbell (send queue lock held). */
void vrdma_sq_publish(struct vrdma_qp *qp)
{
	ring_doorbell(qp->sq.db, qp->sq.prod);
	wake_if_parked(to_vctx(qp->vqp.qp.context), qp);
}
