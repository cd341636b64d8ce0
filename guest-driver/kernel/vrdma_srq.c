// SPDX-License-Identifier: GPL-2.0-only
/*
 * Shared receive queues: a ring of receive WQEs in the process's memory, pinned and described to the device, or in
 * kernel pages for a kernel consumer's SRQ (vrdma_kqueue.c posts to it). An XRC SRQ also names its XRC domain and
 * the CQ its receives complete on, and gets an SRQ number from the device.
 */
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <rdma/ib_umem.h>
#include <rdma/uverbs_ioctl.h>

#include "vrdma.h"

/*
 * One create path for both kinds of SRQ: the ring comes from the process (libvrdma sized it; the kernel pins it) or,
 * for a kernel consumer's basic SRQ, from kernel pages sized here; then the same command, doorbell check and
 * publication.
 */
int vrdma_create_srq(struct ib_srq *ibsrq, struct ib_srq_init_attr *attr, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibsrq->device);
	struct vrdma_srq *srq = container_of(ibsrq, struct vrdma_srq, ibsrq);
	struct vrdma_pd *pd = container_of(ibsrq->pd, struct vrdma_pd, ibpd);
	struct vrdma_cmd_create_srq cmd = { .hdr.opcode = cpu_to_le16(VRDMA_CMD_CREATE_SRQ) };
	struct vrdma_resp_create_srq resp;
	struct vrdma_create_srq_resp uresp = {};
	struct vrdma_create_srq_cmd ucmd;
	u32 max_srq_sge = le32_to_cpu(dev->attr.max_srq_sge), depth, stride, max_sge;
	struct vrdma_pbl pbl;
	int ret;

	if (udata) {
		if (attr->srq_type != IB_SRQT_BASIC && attr->srq_type != IB_SRQT_XRC)
			return -EOPNOTSUPP;  /* basic or XRC (no tag matching) */
		ret = vrdma_udata_in(udata, &ucmd, sizeof(ucmd), sizeof(uresp));
		if (ret)
			return ret;
		if (!PAGE_ALIGNED(ucmd.buf_addr) || !is_power_of_2(ucmd.depth) || ucmd.depth < attr->attr.max_wr ||
		    attr->attr.srq_limit >= ucmd.depth || attr->attr.max_sge > max_srq_sge ||
		    !is_power_of_2(ucmd.stride) ||
		    ucmd.stride < sizeof(struct vrdma_recv_wqe) + attr->attr.max_sge * sizeof(struct vrdma_sge) ||
		    ucmd.stride > PAGE_SIZE || ucmd.buf_size < PAGE_SIZE + (u64)ucmd.depth * ucmd.stride)
			return -EINVAL;
		depth = ucmd.depth;
		stride = ucmd.stride;
		max_sge = attr->attr.max_sge;
		ret = vrdma_pin(dev, ucmd.buf_addr, ucmd.buf_size, IB_ACCESS_LOCAL_WRITE, &srq->ring, &pbl);
	} else {
		if (attr->srq_type != IB_SRQT_BASIC)
			return -EOPNOTSUPP;  /* XRC SRQs are user processes' (through their XRC domains) */
		if (!attr->attr.max_wr || attr->attr.max_sge > max_srq_sge)
			return -EINVAL;
		/* The limit must stay below the depth: one more slot than asked when they meet. */
		ret = vrdma_kqueue_size(&srq->rq, max(attr->attr.max_wr, attr->attr.srq_limit + 1), attr->attr.max_sge,
					0, sizeof(struct vrdma_recv_wqe), 32, le32_to_cpu(dev->attr.max_srq_wr));
		if (ret)
			return ret;
		srq->rq.offset = PAGE_SIZE;
		depth = srq->rq.depth;
		stride = srq->rq.stride;
		max_sge = srq->rq.max_sge;
		ret = vrdma_kbuf_alloc(&srq->ring, PAGE_SIZE + (size_t)depth * stride, &pbl);
	}
	if (ret)
		return ret;
	cmd.ucontext = cpu_to_le32(udata ? vrdma_ucontext_handle(udata) : 0);  /* 0: the kernel's */
	cmd.pd = cpu_to_le32(pd->handle);
	cmd.depth = cpu_to_le32(depth);
	cmd.stride = cpu_to_le32(stride);
	cmd.max_sge = cpu_to_le32(max_sge);
	cmd.srq_limit = cpu_to_le32(attr->attr.srq_limit);
	if (attr->srq_type == IB_SRQT_XRC) {
		cmd.xrcd = cpu_to_le32(container_of(attr->ext.xrc.xrcd, struct vrdma_xrcd, ibxrcd)->handle);
		cmd.cq = cpu_to_le32(container_of(attr->ext.cq, struct vrdma_cq, ibcq)->handle);
	}
	cmd.ring = pbl.desc;
	cmd.ring.npages = cpu_to_le32(DIV_ROUND_UP(PAGE_SIZE + (u64)depth * stride, PAGE_SIZE));
	ret = vrdma_exec_create(dev, &cmd, sizeof(cmd), &resp, sizeof(resp), &pbl, &srq->ring);
	if (ret)
		return ret;
	srq->handle = le32_to_cpu(resp.handle);
	if (attr->srq_type == IB_SRQT_XRC)
		ibsrq->ext.xrc.srq_num = le32_to_cpu(resp.srq_num);  /* what XRC initiators name it by */
	srq->max_sge = max_sge;
	srq->depth = depth;
	attr->attr.max_wr = depth;
	attr->attr.max_sge = max_sge;
	if (udata) {
		uresp.srq_handle = srq->handle;
		ret = vrdma_udata_db(udata, resp.db_index, &uresp.db_index, &uresp.db_offset);
	} else if (vrdma_kdb_ok(dev, le32_to_cpu(resp.db_index))) {
		srq->rq.db_index = le32_to_cpu(resp.db_index);
	} else {
		dev_err(&dev->vdev->dev, "device gave SRQ %#x doorbell index %u\n", srq->handle,
			le32_to_cpu(resp.db_index));
		ret = -EIO;
	}
	if (ret)
		return vrdma_unmake(dev, VRDMA_CMD_DESTROY_SRQ, srq->handle, &srq->ring, ret);
	return vrdma_publish(dev, &dev->srqs, srq->handle, srq, VRDMA_CMD_DESTROY_SRQ, udata, &uresp,
			     sizeof(uresp), &srq->ring);
}

int vrdma_modify_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr, enum ib_srq_attr_mask mask,
		     struct ib_udata *udata)
{
	struct vrdma_srq *srq = container_of(ibsrq, struct vrdma_srq, ibsrq);
	struct vrdma_cmd_modify_srq cmd = { .hdr.opcode = cpu_to_le16(VRDMA_CMD_MODIFY_SRQ),
					    .handle = cpu_to_le32(srq->handle) };
	struct vrdma_resp_hdr resp;

	if (mask & IB_SRQ_MAX_WR)
		return -EOPNOTSUPP;  /* the ring lives in user memory: no resizing */
	if (mask & ~IB_SRQ_LIMIT)
		return -EINVAL;
	cmd.attr_mask = cpu_to_le32(mask & IB_SRQ_LIMIT ? VRDMA_SRQ_LIMIT : 0);
	cmd.srq_limit = cpu_to_le32(attr->srq_limit);
	return vrdma_cmd_exec(to_vdev(ibsrq->device), &cmd, sizeof(cmd), &resp, sizeof(resp));
}

int vrdma_query_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr)
{
	struct vrdma_srq *srq = container_of(ibsrq, struct vrdma_srq, ibsrq);
	struct vrdma_cmd_destroy cmd = { .hdr.opcode = cpu_to_le16(VRDMA_CMD_QUERY_SRQ),
					 .handle = cpu_to_le32(srq->handle) };
	struct vrdma_resp_query_srq resp;
	int ret;

	ret = vrdma_cmd_exec(to_vdev(ibsrq->device), &cmd, sizeof(cmd), &resp, sizeof(resp));
	if (ret)
		return ret;
	attr->max_wr = le32_to_cpu(resp.max_wr);
	attr->max_sge = le32_to_cpu(resp.max_sge);
	attr->srq_limit = le32_to_cpu(resp.srq_limit);
	return 0;
}

int vrdma_destroy_srq(struct ib_srq *ibsrq, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibsrq->device);
	struct vrdma_srq *srq = container_of(ibsrq, struct vrdma_srq, ibsrq);

	return vrdma_unpublish(dev, &dev->srqs, srq->handle, srq, VRDMA_CMD_DESTROY_SRQ, &srq->ring);
}

/* A kernel SRQ is posted to here; a user SRQ in user space, where this is never called (libvrdma posts). */
int vrdma_post_srq_recv(struct ib_srq *ibsrq, const struct ib_recv_wr *wr, const struct ib_recv_wr **bad_wr)
{
	struct vrdma_srq *srq = container_of(ibsrq, struct vrdma_srq, ibsrq);

	if (vrdma_kernel_ring(&srq->ring))
		return vrdma_ksrq_post_recv(srq, wr, bad_wr);
	*bad_wr = wr;
	return -EOPNOTSUPP;
}
