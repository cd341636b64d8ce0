// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * The verbs of a container's device (channel.c): the control path vrdma.ko gives a VM's process, done here with
 * the device's own commands. The data path (posting, polling, arming) is the VM's, unchanged: the rings and
 * doorbells have the same layout, only where their memory comes from differs. Verbs a container's device does not
 * have (XRC, SRQs, memory windows, fast registration: docs/containers.md) are left out of the table, so libibverbs
 * answers them with EOPNOTSUPP.
 */
#include "ring.h"

struct vrdma_chan_mr {
	struct verbs_mr vmr;
	void *share;              /* the remapped range it registered (channel.c) */
};

static_assert(VRDMA_QP_STATE == IBV_QP_STATE && VRDMA_QP_AV == IBV_QP_AV && VRDMA_QP_DEST_QPN == IBV_QP_DEST_QPN &&
	      VRDMA_QP_MAX_DEST_RD_ATOMIC == IBV_QP_MAX_DEST_RD_ATOMIC && VRDMA_QP_CAP == IBV_QP_CAP,
	      "modify masks: the device's are libibverbs' bits");
static_assert(VRDMA_QPT_RC == IBV_QPT_RC && VRDMA_QPT_UC == IBV_QPT_UC && VRDMA_QPT_UD == IBV_QPT_UD, "QP types");
static_assert(VRDMA_QPS_RTS == IBV_QPS_RTS && VRDMA_QPS_ERR == IBV_QPS_ERR, "QP states");
static_assert(VRDMA_ACCESS_REMOTE_ATOMIC == IBV_ACCESS_REMOTE_ATOMIC && VRDMA_ACCESS_MW_BIND == IBV_ACCESS_MW_BIND,
	      "access flags");

int vrdma_chan_destroy(struct vrdma_context *ctx, uint16_t opcode, uint32_t handle)
{
	struct vrdma_cmd_destroy req = { .handle = htole32(handle) };
	struct vrdma_resp_hdr resp;

	return vrdma_chan_cmd(ctx, opcode, &req, sizeof(req), &resp, sizeof(resp));
}

static int query_device_ex(struct ibv_context *context, const struct ibv_query_device_ex_input *input,
			   struct ibv_device_attr_ex *attr, size_t attr_size)
{
	struct vrdma_cmd_query_device req = {};
	struct vrdma_resp_query_device resp;
	struct ibv_device_attr *a = &attr->orig_attr;
	uint64_t fw;
	int ret;

	if (attr_size < sizeof(*a))
		return EINVAL;
	ret = vrdma_chan_cmd(to_vctx(context), VRDMA_CMD_QUERY_DEVICE, &req, sizeof(req), &resp, sizeof(resp));
	if (ret)
		return ret;
	memset(attr, 0, attr_size);
	fw = le64toh(resp.fw_ver);
	snprintf(a->fw_ver, sizeof(a->fw_ver), "%u.%u.%u", (unsigned int)(fw >> 32) & 0xffff,
		 (unsigned int)(fw >> 16) & 0xffff, (unsigned int)fw & 0xffff);
	a->node_guid = htobe64(le64toh(resp.node_guid));
	a->sys_image_guid = htobe64(le64toh(resp.sys_image_guid));
	a->max_mr_size = le64toh(resp.max_mr_size);
	a->page_size_cap = le64toh(resp.page_size_cap);
	a->vendor_id = le32toh(resp.vendor_id);
	a->vendor_part_id = le32toh(resp.vendor_part_id);
	a->hw_ver = le32toh(resp.hw_ver);
	a->max_qp = (int)le32toh(resp.max_qp);
	a->max_qp_wr = (int)le32toh(resp.max_qp_wr);
	a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_PORT_ACTIVE_EVENT;
	a->max_sge = a->max_sge_rd = (int)le32toh(resp.max_sge);
	a->max_cq = (int)le32toh(resp.max_cq);
	a->max_cqe = (int)le32toh(resp.max_cqe);
	a->max_mr = (int)le32toh(resp.max_mr);
	a->max_pd = (int)le32toh(resp.max_pd);
	a->max_qp_rd_atom = a->max_res_rd_atom = (int)le32toh(resp.max_qp_rd_atom);
	a->max_qp_init_rd_atom = (int)le32toh(resp.max_qp_init_rd_atom);
	a->atomic_cap = IBV_ATOMIC_HCA;
	a->max_ah = (int)le32toh(resp.max_ah);
	a->max_pkeys = 1;
	a->local_ca_ack_delay = 15;
	a->phys_port_cnt = 1;
	return 0;
}

static int query_port(struct ibv_context *context, uint8_t port, struct ibv_port_attr *attr)
{
	struct vrdma_cmd_query_port req = { .port = port };
	struct vrdma_resp_query_port resp;
	int ret;

	ret = vrdma_chan_cmd(to_vctx(context), VRDMA_CMD_QUERY_PORT, &req, sizeof(req), &resp, sizeof(resp));
	if (ret)
		return ret;
	memset(attr, 0, sizeof(*attr));
	attr->state = (enum ibv_port_state)le32toh(resp.state);
	attr->max_mtu = (enum ibv_mtu)le32toh(resp.max_mtu);
	attr->active_mtu = (enum ibv_mtu)le32toh(resp.active_mtu);
	attr->gid_tbl_len = (int)le32toh(resp.gid_tbl_len);
	attr->port_cap_flags = le32toh(resp.port_cap_flags);
	attr->max_msg_sz = le32toh(resp.max_msg_sz);
	attr->pkey_tbl_len = (uint16_t)le32toh(resp.pkey_tbl_len);
	attr->link_layer = resp.link_layer == VRDMA_LINK_LAYER_ETHERNET ? IBV_LINK_LAYER_ETHERNET :
									  IBV_LINK_LAYER_UNSPECIFIED;
	attr->active_speed = resp.active_speed;
	attr->active_width = resp.active_width;
	attr->phys_state = resp.phys_state;
	return 0;
}

static struct ibv_pd *alloc_pd(struct ibv_context *context)
{
	struct vrdma_context *ctx = to_vctx(context);
	struct vrdma_cmd_alloc_pd req = {};
	struct vrdma_resp_alloc_pd resp;
	struct vrdma_pd *pd = calloc(1, sizeof(*pd));
	int ret;

	if (!pd)
		return vrdma_abandon(NULL, NULL, ENOMEM);
	req.ucontext = htole32(ctx->ucontext);
	ret = vrdma_chan_cmd(ctx, VRDMA_CMD_ALLOC_PD, &req, sizeof(req), &resp, sizeof(resp));
	if (ret)
		return vrdma_abandon(NULL, pd, ret);
	pd->pdn = pd->ibv_pd.handle = le32toh(resp.handle);
	return &pd->ibv_pd;
}

static int dealloc_pd(struct ibv_pd *ibpd)
{
	int ret = vrdma_chan_destroy(to_vctx(ibpd->context), VRDMA_CMD_DEALLOC_PD, ibpd->handle);

	if (!ret)
		free(to_vpd(ibpd));
	return ret;
}

/* The memory becomes shareable first (its pages remapped onto a memfd: channel.c), then the device registers its
 * pages, whose page list this process writes. */
static struct ibv_mr *reg_mr(struct ibv_pd *pd, void *addr, size_t length, uint64_t hca_va, int access)
{
	struct vrdma_context *ctx = to_vctx(pd->context);
	uintptr_t offset = (uintptr_t)addr & (VRDMA_PAGE_SIZE - 1);
	struct vrdma_cmd_reg_mr req = {};
	struct vrdma_resp_reg_mr resp;
	struct vrdma_buf scratch = {};
	struct vrdma_chan_mr *mr;
	uint64_t dev;
	int ret;

	if (access & ~(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
		       IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND))
		return vrdma_abandon(NULL, NULL, EOPNOTSUPP);  /* (no ODP, relaxed ordering, ...) */
	mr = calloc(1, sizeof(*mr));
	if (!mr)
		return vrdma_abandon(NULL, NULL, ENOMEM);
	ret = vrdma_chan_share(ctx, addr, length, &dev, &mr->share);
	if (ret)
		return vrdma_abandon(NULL, mr, ret);
	ret = vrdma_chan_pages(ctx, dev, (uint32_t)((offset + length + VRDMA_PAGE_SIZE - 1) / VRDMA_PAGE_SIZE),
			       &req.pages, &scratch);
	if (!ret) {
		req.pd = htole32(pd->handle);
		req.access = htole32((uint32_t)access);
		req.iova = htole64(hca_va);
		req.length = htole64(length);
		req.page_offset = htole32((uint32_t)offset);
		ret = vrdma_chan_cmd(ctx, VRDMA_CMD_REG_MR, &req, sizeof(req), &resp, sizeof(resp));
		buf_free(&scratch);
	}
	if (ret) {
		vrdma_chan_unshare(ctx, mr->share);
		return vrdma_abandon(NULL, mr, ret);
	}
	mr->vmr.ibv_mr.handle = le32toh(resp.handle);
	mr->vmr.ibv_mr.lkey = le32toh(resp.lkey);
	mr->vmr.ibv_mr.rkey = le32toh(resp.rkey);
	mr->vmr.mr_type = IBV_MR_TYPE_MR;
	return &mr->vmr.ibv_mr;
}

static int dereg_mr(struct verbs_mr *vmr)
{
	struct vrdma_chan_mr *mr = container_of(vmr, struct vrdma_chan_mr, vmr);
	struct vrdma_context *ctx = to_vctx(vmr->ibv_mr.context);
	int ret = vrdma_chan_destroy(ctx, VRDMA_CMD_DEREG_MR, vmr->ibv_mr.handle);

	if (ret)
		return ret;
	vrdma_chan_unshare(ctx, mr->share);
	free(mr);
	return 0;
}

/* CREATE_AH's step of vrdma_create_ah: what a VM's kernel would send the device for it. */
int vrdma_chan_create_ah(struct vrdma_context *ctx, struct ibv_pd *pd, const struct ibv_ah_attr *attr,
			 struct vrdma_ah *ah)
{
	struct vrdma_cmd_create_ah req = {};
	struct vrdma_resp_create_ah resp;
	int ret;

	req.pd = htole32(pd->handle);
	req.flow_label = htole32(attr->grh.flow_label);
	memcpy(req.dgid, attr->grh.dgid.raw, sizeof(req.dgid));
	req.sgid_index = attr->grh.sgid_index;
	req.hop_limit = attr->grh.hop_limit;
	req.traffic_class = attr->grh.traffic_class;
	ret = vrdma_chan_cmd(ctx, VRDMA_CMD_CREATE_AH, &req, sizeof(req), &resp, sizeof(resp));
	if (!ret)
		ah->ibv_ah.handle = le32toh(resp.handle);
	return ret;
}

/*
 * CREATE_CQ for vrdma_create_cq: the ring is in memory shared with the device (buf_alloc took it there). With a
 * completion channel (a pipe: libvrdma-compchan's, compchan.c), the device is given a write end of its pipe, into
 * which it writes the CQ's completion events as ibv_get_cq_event reads them (the ibv_cq's address).
 */
int vrdma_chan_create_cq(struct vrdma_context *ctx, struct vrdma_cq *cq, struct ibv_comp_channel *channel,
			 uint32_t *db_index)
{
	struct vrdma_cmd_create_cq req = { .entries = htole32(cq->entries) };
	struct vrdma_resp_create_cq resp;
	struct vrdma_buf scratch = {};
	int ret;

	req.ucontext = htole32(ctx->ucontext);
	ret = vrdma_chan_pages(ctx, cq->buf.dev, (uint32_t)(cq->buf.size / VRDMA_PAGE_SIZE), &req.ring, &scratch);
	if (ret)
		return ret;
	ret = vrdma_chan_cmd(ctx, VRDMA_CMD_CREATE_CQ, &req, sizeof(req), &resp, sizeof(resp));
	buf_free(&scratch);
	if (ret)
		return ret;
	cq->vcq.cq.handle = le32toh(resp.handle);
	cq->vcq.cq.cqe = (int)cq->entries;
	*db_index = le32toh(resp.db_index);
	if (channel) {
		ret = vrdma_chan_cq_notify(ctx, cq->vcq.cq.handle, (uintptr_t)&cq->vcq.cq, channel->fd);
		if (ret) {
			vrdma_chan_destroy(ctx, VRDMA_CMD_DESTROY_CQ, cq->vcq.cq.handle);
			return ret;
		}
	}
	return 0;
}

/* CREATE_QP for vrdma_create_qp_ex, with the layout it chose (the udata a VM's kernel would have been given); the
 * QP's fields libibverbs' create command would have set are set here. */
int vrdma_chan_create_qp(struct vrdma_context *ctx, struct vrdma_qp *qp, struct ibv_qp_init_attr_ex *attr,
			 const struct vrdma_create_qp_cmd *layout, uint32_t *sq_db, uint32_t *rq_db)
{
	struct vrdma_cmd_create_qp req = {};
	struct vrdma_resp_create_qp resp;
	struct vrdma_buf scratch = {};
	struct ibv_qp *ibqp = &qp->vqp.qp;
	int ret;

	if (attr->qp_type != IBV_QPT_RC && attr->qp_type != IBV_QPT_UC && attr->qp_type != IBV_QPT_UD)
		return EOPNOTSUPP;  /* (XRC is a guest kernel's) */
	if (attr->srq)
		return EOPNOTSUPP;
	req.ucontext = htole32(ctx->ucontext);
	req.pd = htole32(attr->pd->handle);
	req.send_cq = htole32(attr->send_cq->handle);
	req.recv_cq = htole32(attr->recv_cq ? attr->recv_cq->handle : 0);
	req.qp_type = (uint8_t)attr->qp_type;
	req.sq_sig_all = (uint8_t)!!attr->sq_sig_all;
	req.sq_depth = htole32(layout->sq_depth);
	req.rq_depth = htole32(layout->rq_depth);
	req.sq_stride = htole32(layout->sq_stride);
	req.rq_stride = htole32(layout->rq_stride);
	req.sq_offset = htole32(layout->sq_offset);
	req.rq_offset = htole32(layout->rq_offset);
	req.max_send_sge = htole32(attr->cap.max_send_sge);
	req.max_recv_sge = htole32(attr->cap.max_recv_sge);
	req.max_inline_data = htole32(attr->cap.max_inline_data);
	ret = vrdma_chan_pages(ctx, qp->buf.dev, (uint32_t)(qp->buf.size / VRDMA_PAGE_SIZE), &req.ring, &scratch);
	if (ret)
		return ret;
	ret = vrdma_chan_cmd(ctx, VRDMA_CMD_CREATE_QP, &req, sizeof(req), &resp, sizeof(resp));
	buf_free(&scratch);
	if (ret)
		return ret;
	ibqp->context = &ctx->ibv_ctx.context;
	ibqp->qp_context = attr->qp_context;
	ibqp->pd = attr->pd;
	ibqp->send_cq = attr->send_cq;
	ibqp->recv_cq = attr->recv_cq;
	ibqp->srq = NULL;
	ibqp->qp_type = attr->qp_type;
	ibqp->state = IBV_QPS_RESET;
	ibqp->events_completed = 0;
	pthread_mutex_init(&ibqp->mutex, NULL);
	pthread_cond_init(&ibqp->cond, NULL);
	qp->vqp.comp_mask = 0;
	ibqp->handle = le32toh(resp.handle);
	ibqp->qp_num = le32toh(resp.qpn);
	*sq_db = le32toh(resp.sq_db_index);
	*rq_db = le32toh(resp.rq_db_index);
	return 0;
}

/* MODIFY_QP's step of vrdma_modify_qp: libibverbs' attributes as the device's (the mask bits are the same). */
int vrdma_chan_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int attr_mask)
{
	const int known = IBV_QP_STATE | IBV_QP_CUR_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY | IBV_QP_ACCESS_FLAGS |
			  IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_TIMEOUT |
			  IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_RQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC |
			  IBV_QP_MIN_RNR_TIMER | IBV_QP_SQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_DEST_QPN;
	struct vrdma_cmd_modify_qp req = { .handle = htole32(ibqp->handle), .attr_mask = htole32((uint32_t)attr_mask) };
	struct vrdma_qp_attr *a = &req.attr;
	struct vrdma_resp_hdr resp;

	if (attr_mask & ~known)
		return EOPNOTSUPP;  /* (alternate paths, path migration, resizing) */
	a->qp_state = htole32(attr->qp_state);
	a->cur_qp_state = htole32(attr->cur_qp_state);
	a->path_mtu = htole32(attr->path_mtu);
	a->qp_access_flags = htole32((uint32_t)attr->qp_access_flags);
	a->rq_psn = htole32(attr->rq_psn);
	a->sq_psn = htole32(attr->sq_psn);
	a->dest_qp_num = htole32(attr->dest_qp_num);
	a->qkey = htole32(attr->qkey);
	a->max_rd_atomic = attr->max_rd_atomic;
	a->max_dest_rd_atomic = attr->max_dest_rd_atomic;
	a->min_rnr_timer = attr->min_rnr_timer;
	a->timeout = attr->timeout;
	a->retry_cnt = attr->retry_cnt;
	a->rnr_retry = attr->rnr_retry;
	a->port_num = (attr_mask & IBV_QP_AV) ? attr->ah_attr.port_num : attr->port_num;
	a->pkey_index = htole16(attr->pkey_index);
	a->en_sqd_async_notify = attr->en_sqd_async_notify;
	if (attr_mask & IBV_QP_AV) {
		a->sgid_index = attr->ah_attr.grh.sgid_index;
		a->hop_limit = attr->ah_attr.grh.hop_limit;
		a->flow_label = htole32(attr->ah_attr.grh.flow_label);
		a->traffic_class = attr->ah_attr.grh.traffic_class;
		memcpy(a->dgid, attr->ah_attr.grh.dgid.raw, sizeof(a->dgid));
	}
	return vrdma_chan_cmd(to_vctx(ibqp->context), VRDMA_CMD_MODIFY_QP, &req, sizeof(req), &resp, sizeof(resp));
}

static int query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int attr_mask, struct ibv_qp_init_attr *init)
{
	struct vrdma_cmd_destroy req = { .handle = htole32(ibqp->handle) };
	struct vrdma_resp_query_qp resp;
	const struct vrdma_qp_attr *a = &resp.attr;
	int ret;

	ret = vrdma_chan_cmd(to_vctx(ibqp->context), VRDMA_CMD_QUERY_QP, &req, sizeof(req), &resp, sizeof(resp));
	if (ret)
		return ret;
	memset(attr, 0, sizeof(*attr));
	memset(init, 0, sizeof(*init));
	attr->qp_state = (enum ibv_qp_state)le32toh(a->qp_state);
	attr->cur_qp_state = (enum ibv_qp_state)le32toh(a->cur_qp_state);
	attr->path_mtu = (enum ibv_mtu)le32toh(a->path_mtu);
	attr->qp_access_flags = (unsigned int)le32toh(a->qp_access_flags);
	attr->rq_psn = le32toh(a->rq_psn);
	attr->sq_psn = le32toh(a->sq_psn);
	attr->dest_qp_num = le32toh(a->dest_qp_num);
	attr->qkey = le32toh(a->qkey);
	attr->sq_draining = a->sq_draining;
	attr->max_rd_atomic = a->max_rd_atomic;
	attr->max_dest_rd_atomic = a->max_dest_rd_atomic;
	attr->min_rnr_timer = a->min_rnr_timer;
	attr->timeout = a->timeout;
	attr->retry_cnt = a->retry_cnt;
	attr->rnr_retry = a->rnr_retry;
	attr->port_num = a->port_num;
	attr->pkey_index = le16toh(a->pkey_index);
	attr->ah_attr.is_global = 1;
	attr->ah_attr.port_num = a->port_num;
	attr->ah_attr.grh.sgid_index = a->sgid_index;
	attr->ah_attr.grh.hop_limit = a->hop_limit;
	attr->ah_attr.grh.flow_label = le32toh(a->flow_label);
	attr->ah_attr.grh.traffic_class = a->traffic_class;
	memcpy(attr->ah_attr.grh.dgid.raw, a->dgid, sizeof(a->dgid));
	attr->cap.max_send_wr = le32toh(a->max_send_wr);
	attr->cap.max_recv_wr = le32toh(a->max_recv_wr);
	attr->cap.max_send_sge = le32toh(a->max_send_sge);
	attr->cap.max_recv_sge = le32toh(a->max_recv_sge);
	attr->cap.max_inline_data = le32toh(a->max_inline_data);
	init->qp_context = ibqp->qp_context;
	init->send_cq = ibqp->send_cq;
	init->recv_cq = ibqp->recv_cq;
	init->cap = attr->cap;
	init->qp_type = ibqp->qp_type;
	return 0;
}

const struct verbs_context_ops vrdma_chan_ctx_ops = {
	.alloc_pd = alloc_pd,
	.create_ah = vrdma_create_ah,
	.create_cq = vrdma_create_cq,
	.create_qp = vrdma_create_qp,
	.create_qp_ex = vrdma_create_qp_ex,
	.dealloc_pd = dealloc_pd,
	.dereg_mr = dereg_mr,
	.destroy_ah = vrdma_destroy_ah,
	.destroy_cq = vrdma_destroy_cq,
	.destroy_qp = vrdma_destroy_qp,
	.free_context = vrdma_free_context,
	.modify_qp = vrdma_modify_qp,
	.poll_cq = vrdma_poll_cq,
	.post_recv = vrdma_post_recv,
	.post_send = vrdma_post_send,
	.query_device_ex = query_device_ex,
	.query_port = query_port,
	.query_qp = query_qp,
	.reg_mr = reg_mr,
	.req_notify_cq = vrdma_req_notify_cq,
};
