// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/* Queue pairs: their rings in this process (wqe.c writes the WQEs), posting by a store into the doorbell page. */
#include "ring.h"

/* The device forgets the QP: through the kernel, or a container's channel. */
static int vrdma_destroy_qp_cmd(struct vrdma_context *ctx, struct ibv_qp *ibqp)
{
	return ctx->chan ? vrdma_chan_destroy(ctx, VRDMA_CMD_DESTROY_QP, ibqp->handle) : ibv_cmd_destroy_qp(ibqp);
}

/* The wake-up command of a QP (see wake_if_parked): a POST_SEND of no work requests. */
static void wake_cmd_init(struct vrdma_qp *qp)
{
	qp->wake_cmd.hdr.command = IB_USER_VERBS_CMD_POST_SEND;
	qp->wake_cmd.hdr.in_words = sizeof(qp->wake_cmd) / 4;
	qp->wake_cmd.hdr.out_words = sizeof(qp->wake_resp) / 4;
	qp->wake_cmd.response = (uintptr_t)&qp->wake_resp;
	qp->wake_cmd.wqe_size = sizeof(struct ibv_send_wr);
}

/*
 * An XRC receive QP (the kernel's XRC target): no rings, no doorbells and nothing posted to it here; what its
 * initiators send lands in the XRC SRQ each message names.
 */
static struct ibv_qp *create_xrc_recv_qp(struct ibv_context *context, struct ibv_qp_init_attr_ex *attr)
{
	struct ibv_create_qp cmd = {};
	struct ib_uverbs_create_qp_resp resp = {};
	struct vrdma_qp *qp;
	int ret;

	if (!(attr->comp_mask & IBV_QP_INIT_ATTR_XRCD) ||
	    (attr->comp_mask & ~(IBV_QP_INIT_ATTR_XRCD | IBV_QP_INIT_ATTR_PD))) {
		errno = EINVAL;
		return NULL;
	}
	qp = calloc(1, sizeof(*qp));
	if (!qp)
		return vrdma_abandon(NULL, NULL, ENOMEM);
	ret = ibv_cmd_create_qp_ex(context, &qp->vqp, attr, &cmd, sizeof(cmd), &resp, sizeof(resp));
	if (ret)
		return vrdma_abandon(NULL, qp, ret);
	memset(&attr->cap, 0, sizeof(attr->cap));
	return &qp->vqp.qp;
}

/*
 * RC, UC, UD and XRC send QPs: a buffer holding a header page, the send queue and (unless the QP has an SRQ or is
 * an XRC initiator, which receives nothing) its receive queue, pinned by the kernel; the doorbells the device
 * names. XRC receive QPs have none of it (create_xrc_recv_qp). With send_ops_flags, the QP also posts through the
 * extended API (ibv_wr_*: qp_ex.c).
 */
struct ibv_qp *vrdma_create_qp_ex(struct ibv_context *context, struct ibv_qp_init_attr_ex *attr)
{
	struct vrdma_context *ctx = to_vctx(context);
	struct uvrdma_create_qp cmd = {};
	struct uvrdma_create_qp_resp resp = {};
	struct ibv_qp_cap *cap = &attr->cap;
	uint32_t sq_depth, rq_depth = 0, sq_stride, rq_stride = 0, sq_bytes, rq_bytes = 0;
	bool no_rq = attr->srq || attr->qp_type == IBV_QPT_XRC_SEND;
	struct ibv_qp_init_attr_ex core_attr;
	struct vrdma_qp *qp;
	int ret;

	if (attr->qp_type == IBV_QPT_XRC_RECV)
		return ctx->chan ? vrdma_abandon(NULL, NULL, EOPNOTSUPP) : create_xrc_recv_qp(context, attr);
	if ((attr->qp_type != IBV_QPT_RC && attr->qp_type != IBV_QPT_UC && attr->qp_type != IBV_QPT_UD &&
	     attr->qp_type != IBV_QPT_XRC_SEND) || !(attr->comp_mask & IBV_QP_INIT_ATTR_PD) ||
	    (attr->comp_mask & ~(uint32_t)(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS |
					   IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)) ||
	    ((attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && attr->create_flags) ||
	    ((attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) &&
	     (attr->send_ops_flags & ~vrdma_qp_ops(attr->qp_type)))) {
		errno = EOPNOTSUPP;  /* (no TSO, FLUSH or ATOMIC_WRITE; and only what the QP type has) */
		return NULL;
	}
	if (cap->max_send_wr > (1u << 20) || (!no_rq && cap->max_recv_wr > (1u << 20)) || cap->max_send_sge > 255 ||
	    (!no_rq && cap->max_recv_sge > 255) ||
	    cap->max_inline_data > VRDMA_PAGE_SIZE - sizeof(struct vrdma_send_wqe)) {
		errno = EINVAL;
		return NULL;
	}
	qp = calloc(1, sizeof(*qp));
	if (!qp)
		return vrdma_abandon(NULL, NULL, ENOMEM);
	sq_depth = pow2_at_least(cap->max_send_wr, 1);
	sq_stride = pow2_at_least(sizeof(struct vrdma_send_wqe) +
				  (cap->max_send_sge * sizeof(struct vrdma_sge) > cap->max_inline_data ?
				   cap->max_send_sge * sizeof(struct vrdma_sge) : cap->max_inline_data), 64);
	sq_bytes = (uint32_t)page_align((size_t)sq_depth * sq_stride);
	if (!no_rq) {
		rq_depth = pow2_at_least(cap->max_recv_wr, 1);
		rq_stride = pow2_at_least(sizeof(struct vrdma_recv_wqe) + cap->max_recv_sge * sizeof(struct vrdma_sge),
					  32);
		rq_bytes = (uint32_t)page_align((size_t)rq_depth * rq_stride);
	}
	if (sq_stride > VRDMA_PAGE_SIZE || rq_stride > VRDMA_PAGE_SIZE) {
		ret = EINVAL;
		goto err_free;
	}
	ret = buf_alloc(ctx, &qp->buf, VRDMA_PAGE_SIZE + (size_t)sq_bytes + rq_bytes);
	if (ret)
		goto err_free;
	cmd.buf_addr = (uintptr_t)qp->buf.addr;
	cmd.buf_size = qp->buf.size;
	cmd.sq_depth = sq_depth;
	cmd.rq_depth = rq_depth;
	cmd.sq_stride = sq_stride;
	cmd.rq_stride = rq_stride;
	cmd.sq_offset = VRDMA_PAGE_SIZE;
	cmd.rq_offset = no_rq ? 0 : VRDMA_PAGE_SIZE + sq_bytes;
	/* The core takes no creation-flags bit (there are none here, checked above) and no send_ops_flags: it gets the
	 * rest. */
	core_attr = *attr;
	core_attr.comp_mask &= ~(IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS);  /* (ours alone) */
	if (ctx->chan)
		ret = vrdma_chan_create_qp(ctx, qp, &core_attr, &cmd.drv_payload, &resp.sq_db_index, &resp.rq_db_index);
	else
		ret = ibv_cmd_create_qp_ex(context, &qp->vqp, &core_attr, &cmd.ibv_cmd, sizeof(cmd), &resp.ibv_resp,
					   sizeof(resp));
	if (ret)
		goto err_free;
	ret = vrdma_queue_init(ctx, &qp->sq, (uint8_t *)qp->buf.addr + VRDMA_PAGE_SIZE, sq_depth, sq_stride,
			 cap->max_send_sge, true, resp.sq_db_index, resp.sq_db_offset);
	if (!ret)
		ret = vrdma_queue_init(ctx, &qp->rq, (uint8_t *)qp->buf.addr + VRDMA_PAGE_SIZE + sq_bytes, rq_depth,
				 rq_stride, cap->max_recv_sge, !no_rq, resp.rq_db_index, resp.rq_db_offset);
	if (ret) {
		vrdma_destroy_qp_cmd(ctx, &qp->vqp.qp);
		goto err_free;
	}
	qp->max_inline = cap->max_inline_data;
	if (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)
		vrdma_qp_ex_init(qp, attr->send_ops_flags);
	cap->max_send_wr = sq_depth;
	cap->max_recv_wr = rq_depth;
	wake_cmd_init(qp);
	pthread_mutex_lock(&ctx->qps_lock);
	qp->next = ctx->qps;
	ctx->qps = qp;
	pthread_mutex_unlock(&ctx->qps_lock);
	return &qp->vqp.qp;

err_free:
	return vrdma_abandon(&qp->buf, qp, ret);
}

/* The legacy entry point: a PD, a type and capabilities. */
struct ibv_qp *vrdma_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	struct ibv_qp_init_attr_ex attr_ex = {
		.qp_context = attr->qp_context, .send_cq = attr->send_cq, .recv_cq = attr->recv_cq, .srq = attr->srq,
		.cap = attr->cap, .qp_type = attr->qp_type, .sq_sig_all = attr->sq_sig_all,
		.comp_mask = IBV_QP_INIT_ATTR_PD, .pd = pd,
	};
	struct ibv_qp *qp = vrdma_create_qp_ex(pd->context, &attr_ex);

	if (qp)
		attr->cap = attr_ex.cap;
	return qp;
}

/* Another process's XRC receive QP, opened by number in an XRC domain both share. */
struct ibv_qp *vrdma_open_qp(struct ibv_context *context, struct ibv_qp_open_attr *attr)
{
	struct ibv_open_qp cmd = {};
	struct ib_uverbs_create_qp_resp resp = {};
	struct vrdma_qp *qp = calloc(1, sizeof(*qp));
	int ret;

	if (!qp)
		return vrdma_abandon(NULL, NULL, ENOMEM);
	ret = ibv_cmd_open_qp(context, &qp->vqp, sizeof(qp->vqp), attr, &cmd, sizeof(cmd), &resp, sizeof(resp));
	if (ret)
		return vrdma_abandon(NULL, qp, ret);
	return &qp->vqp.qp;
}

/* The QP's completions not polled yet leave its CQs (vrdma_cq_clean). */
static void clean_cqs(struct ibv_qp *ibqp)
{
	if (ibqp->send_cq)
		vrdma_cq_clean(ibqp->send_cq, ibqp->qp_num);
	if (ibqp->recv_cq && ibqp->recv_cq != ibqp->send_cq)
		vrdma_cq_clean(ibqp->recv_cq, ibqp->qp_num);
}

int vrdma_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int attr_mask)
{
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct ibv_modify_qp cmd = {};
	int ret;

	if (to_vctx(ibqp->context)->chan)
		ret = vrdma_chan_modify_qp(ibqp, attr, attr_mask);
	else
		ret = ibv_cmd_modify_qp(ibqp, attr, attr_mask, &cmd, sizeof(cmd));
	if (ret)
		return ret;
	if ((attr_mask & IBV_QP_STATE) && attr->qp_state == IBV_QPS_RESET && qp->sq.db) {
		/* Emptied queues: both sides count from zero again (an XRC receive QP has none). */
		pthread_spin_lock(&qp->sq.lock);
		qp->sq.prod = 0;
		ring_doorbell(qp->sq.db, 0);
		pthread_spin_unlock(&qp->sq.lock);
		if (qp->rq.db) {
			pthread_spin_lock(&qp->rq.lock);
			qp->rq.prod = 0;
			ring_doorbell(qp->rq.db, 0);
			pthread_spin_unlock(&qp->rq.lock);
		}
		clean_cqs(ibqp);
	}
	return 0;
}

int vrdma_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int attr_mask,
		   struct ibv_qp_init_attr *init_attr)
{
	struct ibv_query_qp cmd;

	return ibv_cmd_query_qp(ibqp, attr, attr_mask, init_attr, &cmd, sizeof(cmd));
}

int vrdma_destroy_qp(struct ibv_qp *ibqp)
{
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct vrdma_context *ctx = to_vctx(ibqp->context);
	struct vrdma_qp **link;
	int ret = vrdma_destroy_qp_cmd(ctx, ibqp);

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
	clean_cqs(ibqp);
	buf_free(&qp->buf);
	if (qp->sq.db) {  /* spinlocks of queues that exist (an XRC receive QP has none) */
		pthread_spin_destroy(&qp->sq.lock);
		pthread_spin_destroy(&qp->rq.lock);
	}
	free(qp);
	return 0;
}

/* A BIND_MW work request binds a type 2 window; ibv_bind_mw (`bind_verb`) a type 1. */
static bool opcode_ok(enum ibv_qp_type type, const struct ibv_send_wr *wr, bool bind_verb)
{
	if ((unsigned int)wr->opcode > IBV_WR_SEND_WITH_INV || !(vrdma_qp_ops(type) & (1ull << wr->opcode)))
		return false;
	return wr->opcode != IBV_WR_BIND_MW ||
	       (vrdma_bind_ok(wr->bind_mw.mw, &wr->bind_mw.bind_info) &&
		wr->bind_mw.mw->type == (bind_verb ? IBV_MW_TYPE_1 : IBV_MW_TYPE_2));
}

static int post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr, bool bind_verb)
{
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct vrdma_context *ctx = to_vctx(ibqp->context);
	struct vrdma_queue *q = &qp->sq;
	uint32_t posted = 0;
	int ret = 0;

	if (!q->db || ibqp->state < IBV_QPS_RTS) {
		*bad_wr = wr;  /* an XRC receive QP (nothing is posted to it), or one not ready to send */
		return EINVAL;
	}
	if (!ctx_alive(ctx)) {
		*bad_wr = wr;  /* the device lost this context: nothing posted now would ever complete */
		return EIO;
	}
	pthread_spin_lock(&q->lock);
	for (; wr; wr = wr->next) {
		struct vrdma_send_wqe *wqe;
		bool is_atomic = wr->opcode == IBV_WR_ATOMIC_CMP_AND_SWP || wr->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;

		if (!opcode_ok(ibqp->qp_type, wr, bind_verb) || wr->num_sge < 0 || (uint32_t)wr->num_sge > q->max_sge ||
		    (ibqp->qp_type == IBV_QPT_UD && !wr->wr.ud.ah)) {
			ret = EINVAL;
			break;
		}
		wqe = vrdma_send_slot(qp, wr->wr_id, wr->opcode, wr->send_flags);
		if (!wqe) {
			ret = ENOMEM;
			break;
		}
		wqe->imm_data = wr->imm_data;
		if (ibqp->qp_type == IBV_QPT_XRC_SEND)
			wqe->xrc_srqn = wr->qp_type.xrc.remote_srqn;  /* the target side's XRC SRQ */
		if (is_atomic) {
			wqe->remote_addr = wr->wr.atomic.remote_addr;
			wqe->rkey = wr->wr.atomic.rkey;
			wqe->compare_add = wr->wr.atomic.compare_add;
			wqe->swap = wr->wr.atomic.swap;
		} else if (ibqp->qp_type == IBV_QPT_UD) {
			/* A datagram carries its destination (the device routes by it, and stamps the source itself). */
			wqe->ud = container_of(wr->wr.ud.ah, struct vrdma_ah, ibv_ah)->av;
			wqe->ud.remote_qpn = wr->wr.ud.remote_qpn;
			wqe->ud.remote_qkey = wr->wr.ud.remote_qkey;
		} else if (wr->opcode == IBV_WR_BIND_MW) {
			vrdma_set_bind(wqe, wr->bind_mw.mw, wr->bind_mw.rkey, &wr->bind_mw.bind_info);
		} else if (wr->opcode == IBV_WR_LOCAL_INV || wr->opcode == IBV_WR_SEND_WITH_INV) {
			wqe->imm_data = wr->invalidate_rkey;  /* (the same word as imm_data) */
		} else if (wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_SEND_WITH_IMM) {
			wqe->remote_addr = wr->wr.rdma.remote_addr;
			wqe->rkey = wr->wr.rdma.rkey;
		}
		if (wr->send_flags & IBV_SEND_INLINE) {
			for (int i = 0; i < wr->num_sge && !ret; i++)
				ret = vrdma_wqe_inline(qp, wqe, (void *)(uintptr_t)wr->sg_list[i].addr,
						       wr->sg_list[i].length);
			if (ret) {
				q->prod--;  /* not posted after all */
				break;
			}
		} else {
			vrdma_wqe_sges(wqe, wr->sg_list, (size_t)wr->num_sge);
		}
		posted++;
	}
	if (ret)
		*bad_wr = wr;
	if (posted)
		vrdma_sq_publish(qp);
	pthread_spin_unlock(&q->lock);
	return ret;
}

int vrdma_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
	return post_send(ibqp, wr, bad_wr, false);
}

/*
 * ibv_bind_mw: a type 1 window, bound by a BIND_MW work request on the QP like a type 2 one, under the next key
 * (ibv_inc_rkey), which the window takes once the request is posted.
 */
int vrdma_bind_mw(struct ibv_qp *ibqp, struct ibv_mw *mw, struct ibv_mw_bind *mw_bind)
{
	struct ibv_send_wr wr = { .wr_id = mw_bind->wr_id, .opcode = IBV_WR_BIND_MW, .send_flags = mw_bind->send_flags,
				  .bind_mw = { .mw = mw, .rkey = ibv_inc_rkey(mw->rkey),
					       .bind_info = mw_bind->bind_info } }, *bad;
	int ret;

	if (mw->pd != ibqp->pd || (mw_bind->bind_info.mr && mw_bind->bind_info.mr->pd != ibqp->pd))
		return EINVAL;
	ret = post_send(ibqp, &wr, &bad, true);
	if (!ret)
		mw->rkey = wr.bind_mw.rkey;
	return ret;
}

int vrdma_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct vrdma_qp_ring_hdr *hdr = qp->buf.addr;

	if (!qp->rq.db || ibqp->state == IBV_QPS_RESET) {
		*bad_wr = wr;  /* its receives come from an SRQ, or it has none (XRC), or it is not yet (or no more) */
		return EINVAL;
	}
	return vrdma_post_recv_ring(to_vctx(ibqp->context), &qp->rq, &hdr->rq_cons, wr, bad_wr);
}
