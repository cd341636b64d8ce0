// SPDX-License-Identifier: GPL-2.0-only
/*
 * Queue pairs: the send and receive rings in the process's memory, pinned and described to the device, or in kernel
 * pages for a kernel consumer's QP (vrdma_kqueue.c posts to it); state changes through MODIFY_QP; for a user QP the only data-path call that reaches the kernel is the wake-up (a post_send with no
 * work requests, sent when the device's engine is parked), which kicks the wake virtqueue.
 */
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <rdma/ib_umem.h>
#include <rdma/uverbs_ioctl.h>

#include "vrdma.h"

#define VRDMA_QP_ATTR_MASK 0x1fffff	/* IB_QP_STATE .. IB_QP_DEST_QPN: the attributes the device knows */

static_assert(IB_QPS_ERR == VRDMA_QPS_ERR && IB_QPT_RC == VRDMA_QPT_RC && IB_QPT_UC == VRDMA_QPT_UC &&
	      IB_QPT_UD == VRDMA_QPT_UD && IB_QPT_GSI == VRDMA_QPT_GSI && IB_QPT_XRC_INI == VRDMA_QPT_XRC_INI &&
	      IB_QPT_XRC_TGT == VRDMA_QPT_XRC_TGT, "QP states and types are the IB values");
static_assert(IB_QP_DEST_QPN == VRDMA_QP_DEST_QPN && IB_QP_CAP == VRDMA_QP_CAP, "modify masks are the IB values");

/* The CREATE_QP command of a QP of context @ucontext (0: the kernel's), its rings as @layout says (the ring's
 * page list is the caller's to add). */
void vrdma_create_qp_cmd(struct vrdma_cmd_create_qp *cmd, struct ib_qp *ibqp, const struct ib_qp_init_attr *attr,
			 u32 ucontext, const struct vrdma_qp_layout *layout)
{
	memset(cmd, 0, sizeof(*cmd));
	cmd->hdr.opcode = cpu_to_le16(VRDMA_CMD_CREATE_QP);
	cmd->ucontext = cpu_to_le32(ucontext);
	cmd->pd = cpu_to_le32(container_of(ibqp->pd, struct vrdma_pd, ibpd)->handle);
	cmd->send_cq = cpu_to_le32(container_of(attr->send_cq, struct vrdma_cq, ibcq)->handle);
	/* An XRC initiator has no receive CQ. */
	cmd->recv_cq = cpu_to_le32(attr->recv_cq ? container_of(attr->recv_cq, struct vrdma_cq, ibcq)->handle : 0);
	cmd->srq = cpu_to_le32(attr->srq ? container_of(attr->srq, struct vrdma_srq, ibsrq)->handle : 0);
	cmd->qp_type = attr->qp_type;  /* the IB values (static_assert above) */
	cmd->sq_sig_all = attr->sq_sig_type == IB_SIGNAL_ALL_WR;
	cmd->sq_depth = cpu_to_le32(layout->sq_depth);
	cmd->rq_depth = cpu_to_le32(layout->rq_depth);
	cmd->sq_stride = cpu_to_le32(layout->sq_stride);
	cmd->rq_stride = cpu_to_le32(layout->rq_stride);
	cmd->sq_offset = cpu_to_le32(layout->sq_offset);
	cmd->rq_offset = cpu_to_le32(layout->rq_offset);
	cmd->max_send_sge = cpu_to_le32(layout->max_send_sge);
	cmd->max_recv_sge = cpu_to_le32(layout->max_recv_sge);
	cmd->max_inline_data = cpu_to_le32(attr->cap.max_inline_data);
}

/*
 * An XRC target QP: the kernel creates it (with no udata) for the processes sharing its XRC domain. The device gives
 * it a QP number and nothing else: no rings, CQs or PD (what arrives lands in the XRC SRQ each message names).
 */
static int vrdma_create_xrc_tgt(struct vrdma_qp *qp, struct ib_qp_init_attr *attr)
{
	struct vrdma_dev *dev = to_vdev(qp->ibqp.device);
	struct vrdma_cmd_create_qp cmd = {
		.hdr.opcode = cpu_to_le16(VRDMA_CMD_CREATE_QP),
		.qp_type = VRDMA_QPT_XRC_TGT,
		.xrcd = cpu_to_le32(container_of(attr->xrcd, struct vrdma_xrcd, ibxrcd)->handle),
	};
	struct vrdma_resp_create_qp resp;
	int ret;

	if (attr->create_flags)
		return -EOPNOTSUPP;
	ret = vrdma_cmd_exec(dev, &cmd, sizeof(cmd), &resp, sizeof(resp));
	if (ret)
		return ret;
	qp->handle = le32_to_cpu(resp.handle);
	qp->state = IB_QPS_RESET;
	mutex_init(&qp->modify_lock);
	qp->ibqp.qp_num = le32_to_cpu(resp.qpn);
	memset(&attr->cap, 0, sizeof(attr->cap));
	qp->cap = attr->cap;
	return vrdma_publish(dev, &dev->qps, qp->handle, qp, VRDMA_CMD_DESTROY_QP, NULL, NULL, 0, NULL);
}

/*
 * A user QP's rings: laid out by libvrdma in its own memory (ucmd), checked against what the QP asks for and pinned.
 * @no_rq: its receives come from an SRQ, or never (an XRC initiator).
 */
static int vrdma_user_rings(struct vrdma_qp *qp, struct ib_qp_init_attr *attr, struct ib_udata *udata,
			    struct vrdma_create_qp_cmd *ucmd, bool no_rq, struct vrdma_qp_layout *layout,
			    struct vrdma_pbl *pbl, u64 *bytes)
{
	struct vrdma_dev *dev = to_vdev(qp->ibqp.device);
	struct ib_qp_cap *cap = &attr->cap;
	int ret;

	if ((attr->qp_type != IB_QPT_RC && attr->qp_type != IB_QPT_UC && attr->qp_type != IB_QPT_UD &&
	     attr->qp_type != IB_QPT_XRC_INI) || attr->create_flags)
		return -EOPNOTSUPP;  /* the GSI QP is the kernel's */
	ret = vrdma_udata_in(udata, ucmd, sizeof(*ucmd), sizeof(struct vrdma_create_qp_resp));
	if (ret)
		return ret;
	if (cap->max_send_wr > ucmd->sq_depth || (!no_rq && cap->max_recv_wr > ucmd->rq_depth) ||
	    cap->max_send_sge > le32_to_cpu(dev->attr.max_sge) || cap->max_recv_sge > le32_to_cpu(dev->attr.max_sge) ||
	    cap->max_inline_data > le32_to_cpu(dev->attr.max_inline_data))
		return -EINVAL;
	if (no_rq)
		ucmd->rq_depth = ucmd->rq_stride = ucmd->rq_offset = 0;
	if (!PAGE_ALIGNED(ucmd->buf_addr))
		return -EINVAL;
	*bytes = max((u64)ucmd->sq_offset + (u64)ucmd->sq_depth * ucmd->sq_stride,
		     (u64)ucmd->rq_offset + (u64)ucmd->rq_depth * ucmd->rq_stride);
	if (*bytes > ucmd->buf_size)
		return -EINVAL;
	*layout = (struct vrdma_qp_layout){
		.sq_depth = ucmd->sq_depth, .sq_stride = ucmd->sq_stride, .sq_offset = ucmd->sq_offset,
		.max_send_sge = cap->max_send_sge,
		.rq_depth = ucmd->rq_depth, .rq_stride = ucmd->rq_stride, .rq_offset = ucmd->rq_offset,
		.max_recv_sge = no_rq ? 0 : cap->max_recv_sge };
	return vrdma_pin(dev, ucmd->buf_addr, ucmd->buf_size, IB_ACCESS_LOCAL_WRITE, &qp->ring, pbl);
}

/* A kernel QP's rings: sized here for what it asks for (its queues, vrdma_kqueue.c posts to), in kernel pages. */
static int vrdma_kernel_rings(struct vrdma_qp *qp, struct ib_qp_init_attr *attr, struct vrdma_qp_layout *layout,
			      struct vrdma_pbl *pbl, u64 *bytes)
{
	struct vrdma_dev *dev = to_vdev(qp->ibqp.device);
	u32 max_sge = le32_to_cpu(dev->attr.max_sge), max_wr = le32_to_cpu(dev->attr.max_qp_wr);
	struct ib_qp_cap *cap = &attr->cap;
	int ret;

	if ((attr->qp_type != IB_QPT_RC && attr->qp_type != IB_QPT_UC && attr->qp_type != IB_QPT_UD &&
	     attr->qp_type != IB_QPT_GSI) || attr->create_flags || (attr->srq && attr->qp_type == IB_QPT_GSI))
		return -EOPNOTSUPP;  /* kernel RC, UC, UD and GSI QPs, with a receive queue of their own or an SRQ */
	if (cap->max_send_sge > max_sge || cap->max_recv_sge > max_sge ||
	    cap->max_inline_data > le32_to_cpu(dev->attr.max_inline_data))
		return -EINVAL;
	ret = vrdma_kqueue_size(&qp->sq, cap->max_send_wr, cap->max_send_sge, cap->max_inline_data,
				sizeof(struct vrdma_send_wqe), 64, max_wr) ?:
	      vrdma_kqueue_size(&qp->rq, cap->max_recv_wr, cap->max_recv_sge, 0, sizeof(struct vrdma_recv_wqe), 32,
				max_wr);
	if (ret)
		return ret;
	if (attr->srq)
		qp->rq.depth = qp->rq.stride = qp->rq.max_sge = 0;  /* its receives are the SRQ's */
	qp->sq.offset = PAGE_SIZE;
	qp->rq.offset = attr->srq ? 0 : qp->sq.offset + PAGE_ALIGN(qp->sq.depth * qp->sq.stride);
	*bytes = PAGE_SIZE + PAGE_ALIGN(qp->sq.depth * qp->sq.stride) + PAGE_ALIGN(qp->rq.depth * qp->rq.stride);
	*layout = (struct vrdma_qp_layout){
		.sq_depth = qp->sq.depth, .sq_stride = qp->sq.stride, .sq_offset = qp->sq.offset,
		.max_send_sge = qp->sq.max_sge,
		.rq_depth = qp->rq.depth, .rq_stride = qp->rq.stride, .rq_offset = qp->rq.offset,
		.max_recv_sge = qp->rq.max_sge };
	return vrdma_kbuf_alloc(&qp->ring, *bytes, pbl);
}

/* A kernel QP's doorbells (checked: the driver writes them) and its place among the QPs its CQEs name. */
static int vrdma_kernel_qp_ready(struct vrdma_qp *qp, const struct vrdma_resp_create_qp *resp, bool has_rq)
{
	struct vrdma_dev *dev = to_vdev(qp->ibqp.device);

	qp->sq.db_index = le32_to_cpu(resp->sq_db_index);
	qp->rq.db_index = le32_to_cpu(resp->rq_db_index);
	if (!vrdma_kdb_ok(dev, qp->sq.db_index) || (has_rq && !vrdma_kdb_ok(dev, qp->rq.db_index))) {
		dev_err(&dev->vdev->dev, "device gave QP %#x doorbell indexes %u and %u\n", qp->handle,
			qp->sq.db_index, qp->rq.db_index);
		return -EIO;
	}
	return xa_insert_irq(&dev->kqps, qp->ibqp.qp_num, qp, GFP_KERNEL);
}

/*
 * One create path for both kinds of QP (an XRC target aside, which has no rings): the rings come from the process
 * (vrdma_user_rings) or are the kernel's (vrdma_kernel_rings); then the same command, doorbells and publication.
 */
int vrdma_create_qp(struct ib_qp *ibqp, struct ib_qp_init_attr *attr, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibqp->device);
	struct vrdma_qp *qp = container_of(ibqp, struct vrdma_qp, ibqp);
	struct vrdma_cmd_create_qp cmd;
	struct vrdma_resp_create_qp resp;
	struct vrdma_create_qp_resp uresp = {};
	struct vrdma_create_qp_cmd ucmd;
	struct ib_qp_cap *cap = &attr->cap;
	struct vrdma_qp_layout layout;
	struct vrdma_pbl pbl;
	bool no_rq = attr->srq || attr->qp_type == IB_QPT_XRC_INI;  /* receives come from the SRQ, or never */
	u64 bytes;
	int ret;

	if (attr->qp_type == IB_QPT_XRC_TGT)
		return vrdma_create_xrc_tgt(qp, attr);
	ret = udata ? vrdma_user_rings(qp, attr, udata, &ucmd, no_rq, &layout, &pbl, &bytes) :
		      vrdma_kernel_rings(qp, attr, &layout, &pbl, &bytes);
	if (ret)
		return ret;
	vrdma_create_qp_cmd(&cmd, ibqp, attr, udata ? vrdma_ucontext_handle(udata) : 0 /* the kernel's */, &layout);
	cmd.ring = pbl.desc;
	cmd.ring.npages = cpu_to_le32(DIV_ROUND_UP(bytes, PAGE_SIZE));
	ret = vrdma_exec_create(dev, &cmd, sizeof(cmd), &resp, sizeof(resp), &pbl, &qp->ring);
	if (ret)
		return ret;
	qp->handle = le32_to_cpu(resp.handle);
	qp->state = IB_QPS_RESET;
	mutex_init(&qp->modify_lock);
	qp->sq_sig_all = cmd.sq_sig_all;
	ibqp->qp_num = le32_to_cpu(resp.qpn);
	/* What the QP can hold, as created (at least what was asked; a user QP's rings as the provider sized them). */
	cap->max_send_wr = layout.sq_depth;
	cap->max_recv_wr = layout.rq_depth;
	if (!udata) {
		cap->max_send_sge = layout.max_send_sge;
		cap->max_recv_sge = layout.max_recv_sge;
	}
	qp->cap = *cap;
	if (udata) {
		uresp.qpn = ibqp->qp_num;
		uresp.max_inline_data = cap->max_inline_data;
		ret = vrdma_udata_db(udata, resp.sq_db_index, &uresp.sq_db_index, &uresp.sq_db_offset);
		if (!ret && !no_rq)
			ret = vrdma_udata_db(udata, resp.rq_db_index, &uresp.rq_db_index, &uresp.rq_db_offset);
	} else {
		ret = vrdma_kernel_qp_ready(qp, &resp, !attr->srq);
	}
	if (ret)
		return vrdma_unmake(dev, VRDMA_CMD_DESTROY_QP, qp->handle, &qp->ring, ret);
	ret = vrdma_publish(dev, &dev->qps, qp->handle, qp, VRDMA_CMD_DESTROY_QP, udata, &uresp, sizeof(uresp),
			    &qp->ring);
	if (ret && !udata)
		xa_erase_irq(&dev->kqps, ibqp->qp_num);  /* vrdma_publish destroyed it in the device */
	return ret;
}

/* The attributes of RESET -> INIT (the QP's port, P_Key, access rights or Q_Key). */
#define VRDMA_INIT_ATTRS (IB_QP_PKEY_INDEX | IB_QP_PORT | IB_QP_ACCESS_FLAGS | IB_QP_QKEY)

/*
 * RESET -> INIT is not told to the device when it happens: the QP does nothing in INIT the device would see (its
 * receives are read when a message arrives, which needs RTR), so the driver keeps the attributes and gives them
 * with the next transition, RESET -> RTR in one MODIFY_QP (the device checks it as the two transitions). Creating a
 * QP and moving it to INIT is then one command, connecting it one fewer. Returns true if `mask` was kept so.
 */
static bool vrdma_defer_init(struct vrdma_qp *qp, enum ib_qp_state next, int mask, const struct vrdma_qp_attr *a)
{
	if (next != IB_QPS_INIT || (qp->state != IB_QPS_RESET && !qp->init_deferred))
		return false;
	if (!qp->init_deferred)
		memset(&qp->init_attr, 0, sizeof(qp->init_attr));
	if (mask & IB_QP_PKEY_INDEX)
		qp->init_attr.pkey_index = a->pkey_index;
	if (mask & IB_QP_PORT)
		qp->init_attr.port_num = a->port_num;
	if (mask & IB_QP_ACCESS_FLAGS)
		qp->init_attr.qp_access_flags = a->qp_access_flags;
	if (mask & IB_QP_QKEY)
		qp->init_attr.qkey = a->qkey;
	qp->init_mask |= mask & VRDMA_INIT_ATTRS;
	qp->init_deferred = true;
	return true;
}

/* The deferred INIT attributes the command does not give itself, into the command (RESET -> RTR). */
static int vrdma_add_deferred_init(struct vrdma_qp *qp, int mask, struct vrdma_qp_attr *a)
{
	int missing = qp->init_mask & ~mask;

	if (missing & IB_QP_PKEY_INDEX)
		a->pkey_index = qp->init_attr.pkey_index;
	if (missing & IB_QP_PORT)
		a->port_num = qp->init_attr.port_num;
	if (missing & IB_QP_ACCESS_FLAGS)
		a->qp_access_flags = qp->init_attr.qp_access_flags;
	if (missing & IB_QP_QKEY)
		a->qkey = qp->init_attr.qkey;
	return mask | missing;
}

static int vrdma_modify_qp_locked(struct vrdma_qp *qp, struct ib_qp_attr *attr, int mask)
{
	struct ib_qp *ibqp = &qp->ibqp;
	struct vrdma_cmd_modify_qp cmd = { .hdr.opcode = cpu_to_le16(VRDMA_CMD_MODIFY_QP),
					   .handle = cpu_to_le32(qp->handle) };
	struct vrdma_qp_attr *a = &cmd.attr;
	enum ib_qp_state cur = mask & IB_QP_CUR_STATE ? attr->cur_qp_state : qp->state;
	enum ib_qp_state next = mask & IB_QP_STATE ? attr->qp_state : cur;
	struct vrdma_resp_hdr resp;
	int ret;

	if (mask & ~VRDMA_QP_ATTR_MASK)
		return -EOPNOTSUPP;
	if (!ib_modify_qp_is_ok(cur, next, ibqp->qp_type, mask))
		return -EINVAL;
	a->qp_state = cpu_to_le32(attr->qp_state);
	a->cur_qp_state = cpu_to_le32(attr->cur_qp_state);
	a->path_mtu = cpu_to_le32(attr->path_mtu);
	/* A QP's rights are remote read, write and atomic: FLUSH, relaxed ordering and the like are none of the
	 * device's (it has no such operation), so they are not passed on. */
	a->qp_access_flags = cpu_to_le32(attr->qp_access_flags & VRDMA_ALL_ACCESS);
	a->rq_psn = cpu_to_le32(attr->rq_psn);
	a->sq_psn = cpu_to_le32(attr->sq_psn);
	a->dest_qp_num = cpu_to_le32(attr->dest_qp_num);
	a->qkey = cpu_to_le32(attr->qkey);
	a->max_rd_atomic = attr->max_rd_atomic;
	a->max_dest_rd_atomic = attr->max_dest_rd_atomic;
	a->min_rnr_timer = attr->min_rnr_timer;
	a->timeout = attr->timeout;
	a->retry_cnt = attr->retry_cnt;
	a->rnr_retry = attr->rnr_retry;
	a->port_num = attr->port_num;
	a->pkey_index = cpu_to_le16(attr->pkey_index);
	a->en_sqd_async_notify = attr->en_sqd_async_notify;
	if (mask & IB_QP_AV) {
		const struct ib_global_route *grh = rdma_ah_read_grh(&attr->ah_attr);

		if (!(rdma_ah_get_ah_flags(&attr->ah_attr) & IB_AH_GRH))
			return -EINVAL;  /* RoCE: every address has a GRH */
		memcpy(a->dgid, grh->dgid.raw, sizeof(a->dgid));
		a->sgid_index = grh->sgid_index;
		a->hop_limit = grh->hop_limit;
		a->traffic_class = grh->traffic_class;
		a->flow_label = cpu_to_le32(grh->flow_label);
	}
	if (next == IB_QPS_ERR && READ_ONCE(to_vdev(ibqp->device)->lost)) {
		/*
		 * The device is gone, and with it every QP's state: in error is what the QP is. A kernel QP's work then
		 * completes flushed (vrdma_kcq_flush), which is what ib_drain_qp waits for.
		 */
		qp->state = next;
		if (vrdma_kernel_ring(&qp->ring) && READ_ONCE(to_vdev(ibqp->device)->quiesced))
			schedule_work(&to_vdev(ibqp->device)->kflush_work);
		return 0;
	}
	if (vrdma_defer_init(qp, next, mask, a)) {
		qp->state = next;
		return 0;
	}
	if (qp->init_deferred && next == IB_QPS_RESET) {
		qp->init_deferred = false;  /* the device never left RESET */
		qp->init_mask = 0;
		qp->state = next;
		return 0;
	}
	if (qp->init_deferred && next == IB_QPS_RTR)
		mask = vrdma_add_deferred_init(qp, mask, a);
	cmd.attr_mask = cpu_to_le32(mask);
	ret = vrdma_cmd_exec(to_vdev(ibqp->device), &cmd, sizeof(cmd), &resp, sizeof(resp));
	if (!ret) {
		qp->state = next;
		qp->init_deferred = false;
		qp->init_mask = 0;
	}
	return ret;
}

int vrdma_modify_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr, int mask, struct ib_udata *udata)
{
	struct vrdma_qp *qp = container_of(ibqp, struct vrdma_qp, ibqp);
	int ret;

	mutex_lock(&qp->modify_lock);
	ret = vrdma_modify_qp_locked(qp, attr, mask);
	mutex_unlock(&qp->modify_lock);
	return ret;
}

int vrdma_query_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr, int mask, struct ib_qp_init_attr *init)
{
	struct vrdma_qp *qp = container_of(ibqp, struct vrdma_qp, ibqp);
	struct vrdma_cmd_destroy cmd = { .hdr.opcode = cpu_to_le16(VRDMA_CMD_QUERY_QP),
					 .handle = cpu_to_le32(qp->handle) };
	struct vrdma_resp_query_qp resp;
	const struct vrdma_qp_attr *a = &resp.attr;
	union ib_gid dgid;
	int ret;

	ret = vrdma_cmd_exec(to_vdev(ibqp->device), &cmd, sizeof(cmd), &resp, sizeof(resp));
	if (ret)
		return ret;
	memset(attr, 0, sizeof(*attr));
	memset(init, 0, sizeof(*init));
	attr->qp_state = le32_to_cpu(a->qp_state);
	attr->cur_qp_state = attr->qp_state;
	mutex_lock(&qp->modify_lock);
	if (qp->init_deferred) {
		/* In INIT as far as anyone can tell; the device learns it with the next transition. */
		attr->qp_state = attr->cur_qp_state = IB_QPS_INIT;
		resp.attr.pkey_index = qp->init_attr.pkey_index;
		resp.attr.port_num = qp->init_attr.port_num;
		resp.attr.qp_access_flags = qp->init_attr.qp_access_flags;
		resp.attr.qkey = qp->init_attr.qkey;
	}
	qp->state = attr->qp_state;  /* the device may have moved it to the error state */
	mutex_unlock(&qp->modify_lock);
	attr->path_mtu = le32_to_cpu(a->path_mtu);
	attr->path_mig_state = IB_MIG_MIGRATED;
	attr->qp_access_flags = le32_to_cpu(a->qp_access_flags);
	attr->rq_psn = le32_to_cpu(a->rq_psn);
	attr->sq_psn = le32_to_cpu(a->sq_psn);
	attr->dest_qp_num = le32_to_cpu(a->dest_qp_num);
	attr->max_rd_atomic = a->max_rd_atomic;
	attr->max_dest_rd_atomic = a->max_dest_rd_atomic;
	attr->min_rnr_timer = a->min_rnr_timer;
	attr->timeout = a->timeout;
	attr->retry_cnt = a->retry_cnt;
	attr->rnr_retry = a->rnr_retry;
	attr->port_num = a->port_num;
	attr->pkey_index = le16_to_cpu(a->pkey_index);
	attr->en_sqd_async_notify = a->en_sqd_async_notify;
	attr->cap = qp->cap;
	attr->ah_attr.type = RDMA_AH_ATTR_TYPE_ROCE;
	memcpy(dgid.raw, a->dgid, sizeof(dgid.raw));
	rdma_ah_set_grh(&attr->ah_attr, &dgid, le32_to_cpu(a->flow_label), a->sgid_index, a->hop_limit,
			a->traffic_class);
	rdma_ah_set_port_num(&attr->ah_attr, 1);
	init->qp_type = ibqp->qp_type;
	attr->qkey = le32_to_cpu(a->qkey);
	init->cap = qp->cap;
	init->sq_sig_type = qp->sq_sig_all ? IB_SIGNAL_ALL_WR : IB_SIGNAL_REQ_WR;
	init->send_cq = ibqp->send_cq;
	init->recv_cq = ibqp->recv_cq;
	init->srq = ibqp->srq;
	return 0;
}

int vrdma_destroy_qp(struct ib_qp *ibqp, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibqp->device);
	struct vrdma_qp *qp = container_of(ibqp, struct vrdma_qp, ibqp);

	bool kernel = vrdma_kernel_ring(&qp->ring);
	int ret;

	if (kernel)
		xa_erase_irq(&dev->kqps, ibqp->qp_num);  /* under the lock vrdma_kcq_flush holds: it is done with it */
	ret = vrdma_unpublish(dev, &dev->qps, qp->handle, qp, VRDMA_CMD_DESTROY_QP, &qp->ring);
	/* The device kept it: so does the driver (its completions name it again once it is back). */
	if (ret && kernel && xa_insert_irq(&dev->kqps, ibqp->qp_num, qp, GFP_KERNEL))
		dev_warn(&dev->vdev->dev, "QP %#x kept, but its completions no longer name it\n", ibqp->qp_num);
	return ret;
}

/*
 * A kernel QP is posted to here (vrdma_kqueue.c). A user QP is posted to in user space: the one call of its that
 * gets here is libvrdma's wake-up, a POST_SEND (or POST_RECV) with no work requests, written when the device's
 * engine is parked. It kicks the wake virtqueue.
 */
int vrdma_post_send(struct ib_qp *ibqp, const struct ib_send_wr *wr, const struct ib_send_wr **bad_wr)
{
	struct vrdma_qp *qp = container_of(ibqp, struct vrdma_qp, ibqp);

	if (vrdma_kernel_ring(&qp->ring))
		return vrdma_kqp_post_send(qp, wr, bad_wr);
	if (wr) {
		*bad_wr = wr;
		return -EOPNOTSUPP;
	}
	virtqueue_notify(to_vdev(ibqp->device)->wake_vq);
	return 0;
}

int vrdma_post_recv(struct ib_qp *ibqp, const struct ib_recv_wr *wr, const struct ib_recv_wr **bad_wr)
{
	struct vrdma_qp *qp = container_of(ibqp, struct vrdma_qp, ibqp);

	if (vrdma_kernel_ring(&qp->ring))
		return vrdma_kqp_post_recv(qp, wr, bad_wr);
	if (wr) {
		*bad_wr = wr;
		return -EOPNOTSUPP;
	}
	virtqueue_notify(to_vdev(ibqp->device)->wake_vq);
	return 0;
}
