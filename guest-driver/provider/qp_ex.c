// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * The extended posting API (ibv_wr_start, the ibv_wr_* builders and setters, ibv_wr_complete) for a QP created
 * with send_ops_flags. ibv_wr_start takes the send queue; each builder starts a WQE in the ring at the producer
 * index (with the QP's wr_id and wr_flags of the moment) and the setters fill it; ibv_wr_complete publishes them all
 * with one doorbell, or, if anything failed since ibv_wr_start (an opcode the flags did not ask for, a full ring,
 * too many SGEs, too much inline data), none: the producer index goes back where ibv_wr_start found it, and the
 * first error is returned. ibv_wr_abort drops them the same way. The WQEs are the ones ibv_post_send writes.
 */
#include "ring.h"

static struct vrdma_qp *qp_of(struct ibv_qp_ex *ibqpx)
{
	return container_of(ibqpx, struct vrdma_qp, vqp.qp_ex);
}

static void fail(struct vrdma_qp *qp, int err)
{
	if (!qp->ex_err)
		qp->ex_err = err;
	qp->ex_wqe = NULL;  /* the setters that follow have nothing to fill */
}

/* A builder's WQE: `opcode`, which the QP's send_ops_flags must include; NULL once anything failed. */
static struct vrdma_send_wqe *begin(struct ibv_qp_ex *ibqpx, enum ibv_wr_opcode opcode)
{
	struct vrdma_qp *qp = qp_of(ibqpx);
	struct vrdma_send_wqe *wqe;

	if (qp->ex_err)
		return NULL;
	if (!(qp->ex_ops & (1ull << opcode))) {
		fail(qp, EINVAL);
		return NULL;
	}
	/* (IBV_SEND_INLINE means nothing here: ibv_wr_set_inline_data says it) */
	wqe = vrdma_send_slot(qp, ibqpx->wr_id, opcode, ibqpx->wr_flags & ~(unsigned int)IBV_SEND_INLINE);
	if (!wqe) {
		fail(qp, ENOMEM);
		return NULL;
	}
	qp->ex_wqe = wqe;
	return wqe;
}

static void wr_start(struct ibv_qp_ex *ibqpx)
{
	struct vrdma_qp *qp = qp_of(ibqpx);

	pthread_spin_lock(&qp->sq.lock);
	qp->ex_start = qp->sq.prod;
	qp->ex_wqe = NULL;
	/* not ready to send; or the device lost this context, and nothing posted now would ever complete */
	qp->ex_err = ibqpx->qp_base.state < IBV_QPS_RTS ? EINVAL : ctx_alive(to_vctx(ibqpx->qp_base.context)) ? 0 : EIO;
}

static int wr_complete(struct ibv_qp_ex *ibqpx)
{
	struct vrdma_qp *qp = qp_of(ibqpx);
	int err = qp->ex_err;

	if (err)
		qp->sq.prod = qp->ex_start;
	else if (qp->sq.prod != qp->ex_start)
		vrdma_sq_publish(qp);
	pthread_spin_unlock(&qp->sq.lock);
	return err;
}

static void wr_abort(struct ibv_qp_ex *ibqpx)
{
	struct vrdma_qp *qp = qp_of(ibqpx);

	qp->sq.prod = qp->ex_start;
	pthread_spin_unlock(&qp->sq.lock);
}

/* -- builders ------------------------------------------------------------------------------------------------- */

static void wr_send(struct ibv_qp_ex *ibqpx)
{
	begin(ibqpx, IBV_WR_SEND);
}

/* A builder whose one field is the WQE's imm_data word: an immediate, or the key to invalidate. */
static void begin_imm(struct ibv_qp_ex *ibqpx, enum ibv_wr_opcode opcode, uint32_t imm_data)
{
	struct vrdma_send_wqe *wqe = begin(ibqpx, opcode);

	if (wqe)
		wqe->imm_data = imm_data;
}

static void wr_send_imm(struct ibv_qp_ex *ibqpx, __be32 imm_data)
{
	begin_imm(ibqpx, IBV_WR_SEND_WITH_IMM, imm_data);
}

static void wr_send_inv(struct ibv_qp_ex *ibqpx, uint32_t invalidate_rkey)
{
	begin_imm(ibqpx, IBV_WR_SEND_WITH_INV, invalidate_rkey);
}

static struct vrdma_send_wqe *remote(struct ibv_qp_ex *ibqpx, enum ibv_wr_opcode opcode, uint32_t rkey,
				     uint64_t remote_addr)
{
	struct vrdma_send_wqe *wqe = begin(ibqpx, opcode);

	if (wqe) {
		wqe->rkey = rkey;
		wqe->remote_addr = remote_addr;
	}
	return wqe;
}

static void wr_rdma_write(struct ibv_qp_ex *ibqpx, uint32_t rkey, uint64_t remote_addr)
{
	remote(ibqpx, IBV_WR_RDMA_WRITE, rkey, remote_addr);
}

static void wr_rdma_write_imm(struct ibv_qp_ex *ibqpx, uint32_t rkey, uint64_t remote_addr, __be32 imm_data)
{
	struct vrdma_send_wqe *wqe = remote(ibqpx, IBV_WR_RDMA_WRITE_WITH_IMM, rkey, remote_addr);

	if (wqe)
		wqe->imm_data = imm_data;
}

static void wr_rdma_read(struct ibv_qp_ex *ibqpx, uint32_t rkey, uint64_t remote_addr)
{
	remote(ibqpx, IBV_WR_RDMA_READ, rkey, remote_addr);
}

static void wr_atomic_cmp_swp(struct ibv_qp_ex *ibqpx, uint32_t rkey, uint64_t remote_addr, uint64_t compare,
			      uint64_t swap)
{
	struct vrdma_send_wqe *wqe = remote(ibqpx, IBV_WR_ATOMIC_CMP_AND_SWP, rkey, remote_addr);

	if (wqe) {
		wqe->compare_add = compare;
		wqe->swap = swap;
	}
}

static void wr_atomic_fetch_add(struct ibv_qp_ex *ibqpx, uint32_t rkey, uint64_t remote_addr, uint64_t add)
{
	struct vrdma_send_wqe *wqe = remote(ibqpx, IBV_WR_ATOMIC_FETCH_AND_ADD, rkey, remote_addr);

	if (wqe)
		wqe->compare_add = add;
}

static void wr_local_inv(struct ibv_qp_ex *ibqpx, uint32_t invalidate_rkey)
{
	begin_imm(ibqpx, IBV_WR_LOCAL_INV, invalidate_rkey);
}

/* A window of either type: the caller names its next key (ibv_inc_rkey), as for IBV_WR_BIND_MW. */
static void wr_bind_mw(struct ibv_qp_ex *ibqpx, struct ibv_mw *mw, uint32_t rkey,
		       const struct ibv_mw_bind_info *info)
{
	struct vrdma_qp *qp = qp_of(ibqpx);
	struct vrdma_send_wqe *wqe;

	if (!vrdma_bind_ok(mw, info)) {
		fail(qp, EINVAL);
		return;
	}
	wqe = begin(ibqpx, IBV_WR_BIND_MW);
	if (wqe)
		vrdma_set_bind(wqe, mw, rkey, info);
}

/* -- setters of the WQE the last builder started ---------------------------------------------------------------- */

static void wr_set_sge_list(struct ibv_qp_ex *ibqpx, size_t num_sge, const struct ibv_sge *sg_list)
{
	struct vrdma_qp *qp = qp_of(ibqpx);
	struct vrdma_send_wqe *wqe = qp->ex_wqe;

	if (!wqe)
		return;
	if (num_sge > qp->sq.max_sge || (wqe->send_flags & IBV_SEND_INLINE)) {
		fail(qp, EINVAL);
		return;
	}
	vrdma_wqe_sges(wqe, sg_list, num_sge);
}

static void wr_set_sge(struct ibv_qp_ex *ibqpx, uint32_t lkey, uint64_t addr, uint32_t length)
{
	struct ibv_sge sge = { .addr = addr, .length = length, .lkey = lkey };

	wr_set_sge_list(ibqpx, 1, &sge);
}

static void wr_set_inline_data_list(struct ibv_qp_ex *ibqpx, size_t num_buf, const struct ibv_data_buf *buf_list)
{
	struct vrdma_qp *qp = qp_of(ibqpx);
	struct vrdma_send_wqe *wqe = qp->ex_wqe;

	if (!wqe)
		return;
	if (wqe->num_sge) {
		fail(qp, EINVAL);
		return;
	}
	for (size_t i = 0; i < num_buf; i++) {
		if (vrdma_wqe_inline(qp, wqe, buf_list[i].addr, buf_list[i].length)) {
			fail(qp, EINVAL);
			return;
		}
	}
}

static void wr_set_inline_data(struct ibv_qp_ex *ibqpx, void *addr, size_t length)
{
	struct ibv_data_buf buf = { .addr = addr, .length = length };

	wr_set_inline_data_list(ibqpx, 1, &buf);
}

static void wr_set_ud_addr(struct ibv_qp_ex *ibqpx, struct ibv_ah *ah, uint32_t remote_qpn, uint32_t remote_qkey)
{
	struct vrdma_qp *qp = qp_of(ibqpx);
	struct vrdma_send_wqe *wqe = qp->ex_wqe;

	if (!wqe)
		return;
	if (!ah) {
		fail(qp, EINVAL);
		return;
	}
	wqe->ud = container_of(ah, struct vrdma_ah, ibv_ah)->av;
	wqe->ud.remote_qpn = remote_qpn;
	wqe->ud.remote_qkey = remote_qkey;
}

static void wr_set_xrc_srqn(struct ibv_qp_ex *ibqpx, uint32_t remote_srqn)
{
	struct vrdma_qp *qp = qp_of(ibqpx);

	if (qp->ex_wqe)
		qp->ex_wqe->xrc_srqn = remote_srqn;
}

void vrdma_qp_ex_init(struct vrdma_qp *qp, uint64_t send_ops_flags)
{
	struct ibv_qp_ex *x = &qp->vqp.qp_ex;

	qp->ex_ops = send_ops_flags;
	qp->vqp.comp_mask |= VERBS_QP_EX;
	x->wr_start = wr_start;
	x->wr_complete = wr_complete;
	x->wr_abort = wr_abort;
	x->wr_send = wr_send;
	x->wr_send_imm = wr_send_imm;
	x->wr_send_inv = wr_send_inv;
	x->wr_rdma_write = wr_rdma_write;
	x->wr_rdma_write_imm = wr_rdma_write_imm;
	x->wr_rdma_read = wr_rdma_read;
	x->wr_atomic_cmp_swp = wr_atomic_cmp_swp;
	x->wr_atomic_fetch_add = wr_atomic_fetch_add;
	x->wr_local_inv = wr_local_inv;
	x->wr_bind_mw = wr_bind_mw;
	x->wr_set_sge = wr_set_sge;
	x->wr_set_sge_list = wr_set_sge_list;
	x->wr_set_inline_data = wr_set_inline_data;
	x->wr_set_inline_data_list = wr_set_inline_data_list;
	x->wr_set_ud_addr = wr_set_ud_addr;
	x->wr_set_xrc_srqn = wr_set_xrc_srqn;
}
