// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/* Shared receive queues, basic and XRC: a header page and the ring, pinned by the kernel; posting as a QP's RQ. */
#include "ring.h"

/* A basic or an XRC SRQ: a header page and the ring, pinned by the kernel; its doorbell the device names. */
struct ibv_srq *vrdma_create_srq_ex(struct ibv_context *context, struct ibv_srq_init_attr_ex *attr)
{
	struct uvrdma_create_xsrq cmd = {};
	struct uvrdma_create_xsrq_resp resp = {};
	enum ibv_srq_type type = attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE ? attr->srq_type : IBV_SRQT_BASIC;
	struct vrdma_srq *srq;
	uint32_t depth, stride;
	int ret;

	if ((type != IBV_SRQT_BASIC && type != IBV_SRQT_XRC) || !(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) ||
	    (attr->comp_mask & ~(IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD |
				 IBV_SRQ_INIT_ATTR_CQ))) {
		errno = EOPNOTSUPP;  /* no tag matching */
		return NULL;
	}
	if (attr->attr.max_wr > (1u << 20) || attr->attr.max_sge > 255) {
		errno = EINVAL;
		return NULL;
	}
	srq = calloc(1, sizeof(*srq));
	if (!srq)
		return vrdma_abandon(NULL, NULL, ENOMEM);
	depth = pow2_at_least(attr->attr.max_wr + 1, 2);  /* one more than asked: the limit must stay below it */
	stride = pow2_at_least(sizeof(struct vrdma_recv_wqe) + attr->attr.max_sge * sizeof(struct vrdma_sge), 32);
	if (stride > VRDMA_PAGE_SIZE) {
		ret = EINVAL;
		goto err_free;
	}
	ret = buf_alloc(to_vctx(context), &srq->buf, VRDMA_PAGE_SIZE + (size_t)depth * stride);
	if (ret)
		goto err_free;
	cmd.buf_addr = (uintptr_t)srq->buf.addr;
	cmd.buf_size = srq->buf.size;
	cmd.depth = depth;
	cmd.stride = stride;
	ret = ibv_cmd_create_srq_ex(context, &srq->vsrq, attr, &cmd.ibv_cmd, sizeof(cmd), &resp.ibv_resp,
				    sizeof(resp));
	if (ret)
		goto err_free;
	ret = vrdma_queue_init(to_vctx(context), &srq->rq, (uint8_t *)srq->buf.addr + VRDMA_PAGE_SIZE, depth, stride,
			 attr->attr.max_sge, true, resp.db_index, resp.db_offset);
	if (ret) {
		ibv_cmd_destroy_srq(&srq->vsrq.srq);
		goto err_free;
	}
	return &srq->vsrq.srq;

err_free:
	return vrdma_abandon(&srq->buf, srq, ret);
}

struct ibv_srq *vrdma_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
	struct ibv_srq_init_attr_ex attr_ex = { .srq_context = attr->srq_context, .attr = attr->attr,
						.comp_mask = IBV_SRQ_INIT_ATTR_PD, .pd = pd };
	struct ibv_srq *srq = vrdma_create_srq_ex(pd->context, &attr_ex);

	if (srq)
		attr->attr = attr_ex.attr;
	return srq;
}

int vrdma_get_srq_num(struct ibv_srq *ibsrq, uint32_t *srq_num)
{
	struct vrdma_srq *srq = to_vsrq(ibsrq);

	if (srq->vsrq.srq_type != IBV_SRQT_XRC)
		return EOPNOTSUPP;
	*srq_num = srq->vsrq.srq_num;
	return 0;
}

int vrdma_modify_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr, int mask)
{
	struct ibv_modify_srq cmd;

	return ibv_cmd_modify_srq(ibsrq, attr, mask, &cmd, sizeof(cmd));
}

int vrdma_query_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr)
{
	struct ibv_query_srq cmd;

	return ibv_cmd_query_srq(ibsrq, attr, &cmd, sizeof(cmd));
}

int vrdma_destroy_srq(struct ibv_srq *ibsrq)
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

int vrdma_post_srq_recv(struct ibv_srq *ibsrq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	struct vrdma_srq *srq = to_vsrq(ibsrq);
	struct vrdma_srq_ring_hdr *hdr = srq->buf.addr;

	return vrdma_post_recv_ring(to_vctx(ibsrq->context), &srq->rq, &hdr->cons, wr, bad_wr);
}
