// SPDX-License-Identifier: GPL-2.0-only
/*
 * vrdma data-path verbs: memory regions, CQs, QPs, SRQs and AHs of user contexts, and the event dispatcher.
 *
 * User space (libvrdma) allocates every ring in its own memory; this driver pins it (ib_umem), describes its
 * pages to the device as guest-physical page lists (page-list pages, two levels for large buffers) and tells
 * the provider which doorbell slots its queues ring. Posting and polling then bypass the kernel entirely; the
 * only data-path call that reaches this file is the wake-up (a post_send with no work requests, sent when the
 * device's engine is parked), which kicks the wake virtqueue.
 *
 * Objects that receive events (CQs, QPs, SRQs) sit in per-type xarrays keyed by the device's handle; the event
 * handler looks them up and dispatches under the xarray's lock, and destroy erases under that same lock, so no
 * handler runs on an object being destroyed (Xen-IB's event dispatcher by handle).
 */
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <rdma/ib_umem.h>
#include <rdma/uverbs_ioctl.h>

#include "vrdma.h"

#define VRDMA_MR_ACCESS (IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE | IB_ACCESS_REMOTE_READ | \
			 IB_ACCESS_REMOTE_ATOMIC)
#define VRDMA_QP_ATTR_MASK 0x1fffff	/* IB_QP_STATE .. IB_QP_DEST_QPN: the attributes the device knows */

static_assert(PAGE_SIZE == VRDMA_PAGE_SIZE, "vrdma page lists describe 4 KiB pages");
static_assert(IB_QPS_ERR == VRDMA_QPS_ERR && IB_QPT_RC == VRDMA_QPT_RC, "QP states and types are the IB values");
static_assert(IB_QP_DEST_QPN == VRDMA_QP_DEST_QPN && IB_QP_CAP == VRDMA_QP_CAP, "modify masks are the IB values");
static_assert(IB_ACCESS_REMOTE_ATOMIC == VRDMA_ACCESS_REMOTE_ATOMIC, "access flags are the IB values");

/* -- page lists ------------------------------------------------------------------------------------------------ */

/* The guest-physical pages of a pinned buffer, in page-list pages the device reads during the command. */
struct vrdma_pbl {
	struct vrdma_page_list desc;
	__le64 *dir;
	__le64 **lists;
	u32 nlists;
};

static void vrdma_pbl_free(struct vrdma_pbl *pbl)
{
	u32 i;

	for (i = 0; pbl->lists && i < pbl->nlists; i++)
		free_page((unsigned long)pbl->lists[i]);
	kfree(pbl->lists);
	free_page((unsigned long)pbl->dir);
	memset(pbl, 0, sizeof(*pbl));
}

static int vrdma_pbl_build(struct ib_umem *umem, struct vrdma_pbl *pbl)
{
	size_t npages = ib_umem_num_pages(umem);
	struct scatterlist *sg;
	size_t n = 0;
	u32 i;

	memset(pbl, 0, sizeof(*pbl));
	if (!npages || npages > VRDMA_PBL_ENTRIES * VRDMA_PBL_ENTRIES)
		return -EINVAL;
	pbl->nlists = DIV_ROUND_UP(npages, VRDMA_PBL_ENTRIES);
	pbl->lists = kcalloc(pbl->nlists, sizeof(*pbl->lists), GFP_KERNEL);
	if (!pbl->lists)
		return -ENOMEM;
	for (i = 0; i < pbl->nlists; i++) {
		pbl->lists[i] = (__le64 *)get_zeroed_page(GFP_KERNEL);
		if (!pbl->lists[i])
			goto nomem;
	}
	/*
	 * Guest-physical addresses, from the pages themselves: the device is a virtio device without
	 * VIRTIO_F_ACCESS_PLATFORM, which addresses guest memory physically, whatever DMA mapping ib_umem made.
	 */
	for_each_sgtable_sg(&umem->sgt_append.sgt, sg, i) {
		unsigned int off;

		for (off = 0; off < sg->length && n < npages; off += PAGE_SIZE, n++)
			pbl->lists[n / VRDMA_PBL_ENTRIES][n % VRDMA_PBL_ENTRIES] =
				cpu_to_le64(page_to_phys(nth_page(sg_page(sg), off >> PAGE_SHIFT)));
	}
	if (n != npages) {
		vrdma_pbl_free(pbl);
		return -EFAULT;
	}
	pbl->desc.npages = cpu_to_le32(npages);
	if (pbl->nlists == 1) {
		pbl->desc.levels = cpu_to_le32(1);
		pbl->desc.addr = cpu_to_le64(virt_to_phys(pbl->lists[0]));
		return 0;
	}
	pbl->dir = (__le64 *)get_zeroed_page(GFP_KERNEL);
	if (!pbl->dir)
		goto nomem;
	for (i = 0; i < pbl->nlists; i++)
		pbl->dir[i] = cpu_to_le64(virt_to_phys(pbl->lists[i]));
	pbl->desc.levels = cpu_to_le32(2);
	pbl->desc.addr = cpu_to_le64(virt_to_phys(pbl->dir));
	return 0;

nomem:
	vrdma_pbl_free(pbl);
	return -ENOMEM;
}

/* Pin a user buffer and describe it; on success the caller owns *umem and must free the page list. */
static int vrdma_pin(struct vrdma_dev *dev, u64 addr, u64 size, int access, struct ib_umem **umem,
		     struct vrdma_pbl *pbl)
{
	int ret;

	*umem = ib_umem_get(&dev->ib_dev, addr, size, access);
	if (IS_ERR(*umem))
		return PTR_ERR(*umem);
	ret = vrdma_pbl_build(*umem, pbl);
	if (ret) {
		ib_umem_release(*umem);
		*umem = NULL;
	}
	return ret;
}

static u32 vrdma_ucontext_handle(struct ib_udata *udata)
{
	struct vrdma_ucontext *uc = rdma_udata_to_drv_context(udata, struct vrdma_ucontext, ibuc);

	return uc ? uc->handle : 0;
}

/*
 * Make a created object reachable by events (its xarray, by the device's handle) and tell the provider about it;
 * on failure undo both and destroy it in the device. The caller releases what it pinned.
 */
static int vrdma_publish(struct vrdma_dev *dev, struct xarray *xa, u32 handle, void *obj, u16 destroy_opcode,
			 struct ib_udata *udata, void *uresp, size_t uresp_len)
{
	int ret;

	ret = xa_insert_irq(xa, handle, obj, GFP_KERNEL);
	if (ret)
		goto err_destroy;
	ret = ib_copy_to_udata(udata, uresp, uresp_len);
	if (ret)
		goto err_erase;
	return 0;

err_erase:
	xa_erase_irq(xa, handle);
err_destroy:
	vrdma_destroy_handle(dev, destroy_opcode, handle);
	return ret;
}

/*
 * Destroy an object the device knows by handle: unreachable by events first (the dispatcher holds the xarray's
 * lock), then destroyed in the device; if the device refuses, it is put back.
 */
static int vrdma_unpublish(struct vrdma_dev *dev, struct xarray *xa, u32 handle, void *obj, u16 destroy_opcode)
{
	int ret;

	xa_erase_irq(xa, handle);
	ret = vrdma_destroy_handle(dev, destroy_opcode, handle);
	if (ret)
		xa_store_irq(xa, handle, obj, GFP_KERNEL);
	return ret;
}

/* -- memory regions -------------------------------------------------------------------------------------------- */

struct ib_mr *vrdma_reg_user_mr(struct ib_pd *ibpd, u64 start, u64 length, u64 virt, int access,
				struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibpd->device);
	struct vrdma_pd *pd = container_of(ibpd, struct vrdma_pd, ibpd);
	struct vrdma_cmd_reg_mr cmd = {};
	struct vrdma_resp_reg_mr resp;
	struct vrdma_pbl pbl;
	struct vrdma_mr *mr;
	int ret;

	access &= ~IB_ACCESS_OPTIONAL;  /* hints (relaxed ordering) a copy engine has no use for */
	if (access & ~VRDMA_MR_ACCESS)
		return ERR_PTR(-EOPNOTSUPP);
	mr = kzalloc(sizeof(*mr), GFP_KERNEL);
	if (!mr)
		return ERR_PTR(-ENOMEM);
	ret = vrdma_pin(dev, start, length, access, &mr->umem, &pbl);
	if (ret)
		goto err_free;
	cmd.hdr.opcode = cpu_to_le16(VRDMA_CMD_REG_MR);
	cmd.pd = cpu_to_le32(pd->handle);
	cmd.access = cpu_to_le32(access);
	cmd.iova = cpu_to_le64(virt);
	cmd.length = cpu_to_le64(length);
	cmd.page_offset = cpu_to_le32(ib_umem_offset(mr->umem));
	cmd.pages = pbl.desc;
	ret = vrdma_cmd_exec(dev, &cmd, sizeof(cmd), &resp, sizeof(resp));
	vrdma_pbl_free(&pbl);
	if (ret)
		goto err_umem;
	mr->handle = le32_to_cpu(resp.handle);
	mr->ibmr.lkey = le32_to_cpu(resp.lkey);
	mr->ibmr.rkey = le32_to_cpu(resp.rkey);
	return &mr->ibmr;

err_umem:
	ib_umem_release(mr->umem);
err_free:
	kfree(mr);
	return ERR_PTR(ret);
}

int vrdma_dereg_mr(struct ib_mr *ibmr, struct ib_udata *udata)
{
	struct vrdma_mr *mr = container_of(ibmr, struct vrdma_mr, ibmr);
	int ret;

	ret = vrdma_destroy_handle(to_vdev(ibmr->device), VRDMA_CMD_DEREG_MR, mr->handle);
	if (ret)
		return ret;
	ib_umem_release(mr->umem);
	kfree(mr);
	return 0;
}

struct ib_mr *vrdma_get_dma_mr(struct ib_pd *ibpd, int access)
{
	return ERR_PTR(-EOPNOTSUPP);  /* kernel consumers are not supported yet */
}

/* -- completion queues ----------------------------------------------------------------------------------------- */

int vrdma_create_cq(struct ib_cq *ibcq, const struct ib_cq_init_attr *attr, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibcq->device);
	struct vrdma_cq *cq = container_of(ibcq, struct vrdma_cq, ibcq);
	struct vrdma_cmd_create_cq cmd = {};
	struct vrdma_resp_create_cq resp;
	struct vrdma_create_cq_resp uresp = {};
	struct vrdma_create_cq_cmd ucmd;
	struct vrdma_pbl pbl;
	int ret;

	if (!udata)
		return -EOPNOTSUPP;
	if (attr->flags || attr->comp_vector >= ibcq->device->num_comp_vectors)
		return -EOPNOTSUPP;
	if (udata->inlen < sizeof(ucmd) || udata->outlen < sizeof(uresp))
		return -EINVAL;
	ret = ib_copy_from_udata(&ucmd, udata, sizeof(ucmd));
	if (ret)
		return ret;
	if (!PAGE_ALIGNED(ucmd.buf_addr) || !is_power_of_2(ucmd.entries) || ucmd.entries < attr->cqe ||
	    ucmd.entries > le32_to_cpu(dev->attr.max_cqe) ||
	    ucmd.buf_size < PAGE_SIZE + (u64)ucmd.entries * sizeof(struct vrdma_cqe) || ucmd.reserved)
		return -EINVAL;
	ret = vrdma_pin(dev, ucmd.buf_addr, ucmd.buf_size, IB_ACCESS_LOCAL_WRITE, &cq->umem, &pbl);
	if (ret)
		return ret;
	cmd.hdr.opcode = cpu_to_le16(VRDMA_CMD_CREATE_CQ);
	cmd.ucontext = cpu_to_le32(vrdma_ucontext_handle(udata));
	cmd.entries = cpu_to_le32(ucmd.entries);
	cmd.ring = pbl.desc;
	cmd.ring.npages = cpu_to_le32(DIV_ROUND_UP(PAGE_SIZE + ucmd.entries * sizeof(struct vrdma_cqe), PAGE_SIZE));
	ret = vrdma_cmd_exec(dev, &cmd, sizeof(cmd), &resp, sizeof(resp));
	vrdma_pbl_free(&pbl);
	if (ret)
		goto err_umem;
	cq->handle = le32_to_cpu(resp.handle);
	ibcq->cqe = ucmd.entries;
	uresp.cq_handle = cq->handle;
	uresp.db_slot = le32_to_cpu(resp.db_slot);
	ret = vrdma_publish(dev, &dev->cqs, cq->handle, cq, VRDMA_CMD_DESTROY_CQ, udata, &uresp, sizeof(uresp));
	if (!ret)
		return 0;
err_umem:
	ib_umem_release(cq->umem);
	return ret;
}

int vrdma_destroy_cq(struct ib_cq *ibcq, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibcq->device);
	struct vrdma_cq *cq = container_of(ibcq, struct vrdma_cq, ibcq);
	int ret;

	ret = vrdma_unpublish(dev, &dev->cqs, cq->handle, cq, VRDMA_CMD_DESTROY_CQ);
	if (ret)
		return ret;
	ib_umem_release(cq->umem);
	return 0;
}

int vrdma_modify_cq(struct ib_cq *ibcq, u16 cq_count, u16 cq_period)
{
	struct vrdma_cq *cq = container_of(ibcq, struct vrdma_cq, ibcq);
	struct vrdma_cmd_modify_cq cmd = { .hdr.opcode = cpu_to_le16(VRDMA_CMD_MODIFY_CQ),
					   .handle = cpu_to_le32(cq->handle), .cq_count = cpu_to_le16(cq_count),
					   .cq_period = cpu_to_le16(cq_period) };
	struct vrdma_resp_hdr resp;

	return vrdma_cmd_exec(to_vdev(ibcq->device), &cmd, sizeof(cmd), &resp, sizeof(resp));
}

int vrdma_poll_cq(struct ib_cq *ibcq, int num_entries, struct ib_wc *wc)
{
	return -EOPNOTSUPP;  /* user CQs are polled in user space; there are no kernel CQs */
}

int vrdma_req_notify_cq(struct ib_cq *ibcq, enum ib_cq_notify_flags flags)
{
	return -EOPNOTSUPP;  /* user space arms its CQs through its doorbell page */
}

/* -- shared receive queues ------------------------------------------------------------------------------------- */

int vrdma_create_srq(struct ib_srq *ibsrq, struct ib_srq_init_attr *attr, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibsrq->device);
	struct vrdma_srq *srq = container_of(ibsrq, struct vrdma_srq, ibsrq);
	struct vrdma_pd *pd = container_of(ibsrq->pd, struct vrdma_pd, ibpd);
	struct vrdma_cmd_create_srq cmd = {};
	struct vrdma_resp_create_srq resp;
	struct vrdma_create_srq_resp uresp = {};
	struct vrdma_create_srq_cmd ucmd;
	struct vrdma_pbl pbl;
	int ret;

	if (!udata || attr->srq_type != IB_SRQT_BASIC)
		return -EOPNOTSUPP;
	if (udata->inlen < sizeof(ucmd) || udata->outlen < sizeof(uresp))
		return -EINVAL;
	ret = ib_copy_from_udata(&ucmd, udata, sizeof(ucmd));
	if (ret)
		return ret;
	if (!PAGE_ALIGNED(ucmd.buf_addr) || !is_power_of_2(ucmd.depth) || ucmd.depth < attr->attr.max_wr || attr->attr.srq_limit >= ucmd.depth ||
	    attr->attr.max_sge > le32_to_cpu(dev->attr.max_srq_sge) || !is_power_of_2(ucmd.stride) ||
	    ucmd.stride < sizeof(struct vrdma_recv_wqe) + attr->attr.max_sge * sizeof(struct vrdma_sge) ||
	    ucmd.stride > PAGE_SIZE || ucmd.buf_size < PAGE_SIZE + (u64)ucmd.depth * ucmd.stride)
		return -EINVAL;
	ret = vrdma_pin(dev, ucmd.buf_addr, ucmd.buf_size, IB_ACCESS_LOCAL_WRITE, &srq->umem, &pbl);
	if (ret)
		return ret;
	cmd.hdr.opcode = cpu_to_le16(VRDMA_CMD_CREATE_SRQ);
	cmd.ucontext = cpu_to_le32(vrdma_ucontext_handle(udata));
	cmd.pd = cpu_to_le32(pd->handle);
	cmd.depth = cpu_to_le32(ucmd.depth);
	cmd.stride = cpu_to_le32(ucmd.stride);
	cmd.max_sge = cpu_to_le32(attr->attr.max_sge);
	cmd.srq_limit = cpu_to_le32(attr->attr.srq_limit);
	cmd.ring = pbl.desc;
	cmd.ring.npages = cpu_to_le32(DIV_ROUND_UP(PAGE_SIZE + (u64)ucmd.depth * ucmd.stride, PAGE_SIZE));
	ret = vrdma_cmd_exec(dev, &cmd, sizeof(cmd), &resp, sizeof(resp));
	vrdma_pbl_free(&pbl);
	if (ret)
		goto err_umem;
	srq->handle = le32_to_cpu(resp.handle);
	srq->max_sge = attr->attr.max_sge;
	srq->depth = ucmd.depth;
	attr->attr.max_wr = ucmd.depth;
	uresp.srq_handle = srq->handle;
	uresp.db_slot = le32_to_cpu(resp.db_slot);
	ret = vrdma_publish(dev, &dev->srqs, srq->handle, srq, VRDMA_CMD_DESTROY_SRQ, udata, &uresp, sizeof(uresp));
	if (!ret)
		return 0;
err_umem:
	ib_umem_release(srq->umem);
	return ret;
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
	int ret;

	ret = vrdma_unpublish(dev, &dev->srqs, srq->handle, srq, VRDMA_CMD_DESTROY_SRQ);
	if (ret)
		return ret;
	ib_umem_release(srq->umem);
	return 0;
}

/* -- queue pairs ----------------------------------------------------------------------------------------------- */

int vrdma_create_qp(struct ib_qp *ibqp, struct ib_qp_init_attr *attr, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibqp->device);
	struct vrdma_qp *qp = container_of(ibqp, struct vrdma_qp, ibqp);
	struct vrdma_pd *pd = container_of(ibqp->pd, struct vrdma_pd, ibpd);
	struct vrdma_cmd_create_qp cmd = {};
	struct vrdma_resp_create_qp resp;
	struct vrdma_create_qp_resp uresp = {};
	struct vrdma_create_qp_cmd ucmd;
	struct ib_qp_cap *cap = &attr->cap;
	struct vrdma_pbl pbl;
	u64 end;
	int ret;

	if (!udata || attr->qp_type != IB_QPT_RC || attr->create_flags)
		return -EOPNOTSUPP;  /* user RC QPs only: no kernel QPs (GSI included), no UD/UC/XRC yet */
	if (udata->inlen < sizeof(ucmd) || udata->outlen < sizeof(uresp))
		return -EINVAL;
	ret = ib_copy_from_udata(&ucmd, udata, sizeof(ucmd));
	if (ret)
		return ret;
	if (cap->max_send_wr > ucmd.sq_depth || (!attr->srq && cap->max_recv_wr > ucmd.rq_depth) ||
	    cap->max_send_sge > le32_to_cpu(dev->attr.max_sge) || cap->max_recv_sge > le32_to_cpu(dev->attr.max_sge) ||
	    cap->max_inline_data > le32_to_cpu(dev->attr.max_inline_data))
		return -EINVAL;
	if (attr->srq)
		ucmd.rq_depth = ucmd.rq_stride = ucmd.rq_offset = 0;  /* receives come from the SRQ */
	if (!PAGE_ALIGNED(ucmd.buf_addr))
		return -EINVAL;
	end = max((u64)ucmd.sq_offset + (u64)ucmd.sq_depth * ucmd.sq_stride,
		  (u64)ucmd.rq_offset + (u64)ucmd.rq_depth * ucmd.rq_stride);
	if (end > ucmd.buf_size)
		return -EINVAL;
	ret = vrdma_pin(dev, ucmd.buf_addr, ucmd.buf_size, IB_ACCESS_LOCAL_WRITE, &qp->umem, &pbl);
	if (ret)
		return ret;
	cmd.hdr.opcode = cpu_to_le16(VRDMA_CMD_CREATE_QP);
	cmd.ucontext = cpu_to_le32(vrdma_ucontext_handle(udata));
	cmd.pd = cpu_to_le32(pd->handle);
	cmd.send_cq = cpu_to_le32(container_of(attr->send_cq, struct vrdma_cq, ibcq)->handle);
	cmd.recv_cq = cpu_to_le32(container_of(attr->recv_cq, struct vrdma_cq, ibcq)->handle);
	cmd.srq = cpu_to_le32(attr->srq ? container_of(attr->srq, struct vrdma_srq, ibsrq)->handle : 0);
	cmd.qp_type = VRDMA_QPT_RC;
	cmd.sq_sig_all = attr->sq_sig_type == IB_SIGNAL_ALL_WR;
	cmd.sq_depth = cpu_to_le32(ucmd.sq_depth);
	cmd.rq_depth = cpu_to_le32(ucmd.rq_depth);
	cmd.sq_stride = cpu_to_le32(ucmd.sq_stride);
	cmd.rq_stride = cpu_to_le32(ucmd.rq_stride);
	cmd.sq_offset = cpu_to_le32(ucmd.sq_offset);
	cmd.rq_offset = cpu_to_le32(ucmd.rq_offset);
	cmd.max_send_sge = cpu_to_le32(cap->max_send_sge);
	cmd.max_recv_sge = cpu_to_le32(attr->srq ? 0 : cap->max_recv_sge);
	cmd.max_inline_data = cpu_to_le32(cap->max_inline_data);
	cmd.ring = pbl.desc;
	cmd.ring.npages = cpu_to_le32(DIV_ROUND_UP(end, PAGE_SIZE));
	ret = vrdma_cmd_exec(dev, &cmd, sizeof(cmd), &resp, sizeof(resp));
	vrdma_pbl_free(&pbl);
	if (ret)
		goto err_umem;
	qp->handle = le32_to_cpu(resp.handle);
	qp->state = IB_QPS_RESET;
	qp->sq_sig_all = cmd.sq_sig_all;
	ibqp->qp_num = le32_to_cpu(resp.qpn);
	/* What the QP can hold, as created (the provider sized the rings). */
	cap->max_send_wr = ucmd.sq_depth;
	cap->max_recv_wr = ucmd.rq_depth;
	qp->cap = *cap;
	uresp.qpn = ibqp->qp_num;
	uresp.sq_db_slot = le32_to_cpu(resp.sq_db_slot);
	uresp.rq_db_slot = le32_to_cpu(resp.rq_db_slot);
	uresp.max_inline_data = cap->max_inline_data;
	ret = vrdma_publish(dev, &dev->qps, qp->handle, qp, VRDMA_CMD_DESTROY_QP, udata, &uresp, sizeof(uresp));
	if (!ret)
		return 0;
err_umem:
	ib_umem_release(qp->umem);
	return ret;
}

int vrdma_modify_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr, int mask, struct ib_udata *udata)
{
	struct vrdma_qp *qp = container_of(ibqp, struct vrdma_qp, ibqp);
	struct vrdma_cmd_modify_qp cmd = { .hdr.opcode = cpu_to_le16(VRDMA_CMD_MODIFY_QP),
					   .handle = cpu_to_le32(qp->handle) };
	struct vrdma_qp_attr *a = &cmd.attr;
	enum ib_qp_state cur = mask & IB_QP_CUR_STATE ? attr->cur_qp_state : qp->state;
	enum ib_qp_state next = mask & IB_QP_STATE ? attr->qp_state : cur;
	struct vrdma_resp_hdr resp;
	int ret;

	if (mask & ~VRDMA_QP_ATTR_MASK)
		return -EOPNOTSUPP;
	if (!ib_modify_qp_is_ok(cur, next, IB_QPT_RC, mask))
		return -EINVAL;
	cmd.attr_mask = cpu_to_le32(mask);
	a->qp_state = cpu_to_le32(attr->qp_state);
	a->cur_qp_state = cpu_to_le32(attr->cur_qp_state);
	a->path_mtu = cpu_to_le32(attr->path_mtu);
	a->qp_access_flags = cpu_to_le32(attr->qp_access_flags);
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
	ret = vrdma_cmd_exec(to_vdev(ibqp->device), &cmd, sizeof(cmd), &resp, sizeof(resp));
	if (!ret)
		qp->state = next;
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
	qp->state = attr->qp_state;  /* the device may have moved it to the error state */
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
	init->qp_type = IB_QPT_RC;
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
	int ret;

	ret = vrdma_unpublish(dev, &dev->qps, qp->handle, qp, VRDMA_CMD_DESTROY_QP);
	if (ret)
		return ret;
	ib_umem_release(qp->umem);
	return 0;
}

/*
 * Posting is done in user space. The one call that gets here is libvrdma's wake-up: a POST_SEND (or POST_RECV)
 * with no work requests, written when the device's engine is parked. It kicks the wake virtqueue.
 */
int vrdma_post_send(struct ib_qp *ibqp, const struct ib_send_wr *wr, const struct ib_send_wr **bad_wr)
{
	if (wr) {
		*bad_wr = wr;
		return -EOPNOTSUPP;
	}
	virtqueue_notify(to_vdev(ibqp->device)->wake_vq);
	return 0;
}

int vrdma_post_recv(struct ib_qp *ibqp, const struct ib_recv_wr *wr, const struct ib_recv_wr **bad_wr)
{
	if (wr) {
		*bad_wr = wr;
		return -EOPNOTSUPP;
	}
	virtqueue_notify(to_vdev(ibqp->device)->wake_vq);
	return 0;
}

/* -- address handles ------------------------------------------------------------------------------------------- */

int vrdma_create_ah(struct ib_ah *ibah, struct rdma_ah_init_attr *init, struct ib_udata *udata)
{
	struct vrdma_ah *ah = container_of(ibah, struct vrdma_ah, ibah);
	struct vrdma_pd *pd = container_of(ibah->pd, struct vrdma_pd, ibpd);
	const struct ib_global_route *grh = rdma_ah_read_grh(init->ah_attr);
	struct vrdma_cmd_create_ah cmd = { .hdr.opcode = cpu_to_le16(VRDMA_CMD_CREATE_AH),
					   .pd = cpu_to_le32(pd->handle) };
	struct vrdma_resp_create_ah resp;
	int ret;

	if (!(init->flags & RDMA_CREATE_AH_SLEEPABLE))
		return -EOPNOTSUPP;  /* creating one is a device command, which sleeps */
	if (!(rdma_ah_get_ah_flags(init->ah_attr) & IB_AH_GRH))
		return -EINVAL;
	memcpy(cmd.dgid, grh->dgid.raw, sizeof(cmd.dgid));
	cmd.sgid_index = grh->sgid_index;
	cmd.hop_limit = grh->hop_limit;
	cmd.traffic_class = grh->traffic_class;
	cmd.flow_label = cpu_to_le32(grh->flow_label);
	ret = vrdma_cmd_exec(to_vdev(ibah->device), &cmd, sizeof(cmd), &resp, sizeof(resp));
	if (ret)
		return ret;
	ah->handle = le32_to_cpu(resp.handle);
	return 0;
}

int vrdma_destroy_ah(struct ib_ah *ibah, u32 flags)
{
	struct vrdma_ah *ah = container_of(ibah, struct vrdma_ah, ibah);

	if (!(flags & RDMA_DESTROY_AH_SLEEPABLE))
		return -EOPNOTSUPP;
	return vrdma_destroy_handle(to_vdev(ibah->device), VRDMA_CMD_DESTROY_AH, ah->handle);
}

/* -- events ---------------------------------------------------------------------------------------------------- */

static void vrdma_cq_event(struct vrdma_dev *dev, u32 type, u32 handle, u64 data)
{
	struct vrdma_cq *cq = xa_load(&dev->cqs, handle);
	struct ib_event ev = { .device = &dev->ib_dev, .event = IB_EVENT_CQ_ERR };

	if (!cq) {
		dev_warn_ratelimited(&dev->vdev->dev, "event %u for unknown CQ %#x\n", type, handle);
		return;
	}
	if (type == VRDMA_EVENT_CQ_COMP) {
		if (cq->ibcq.comp_handler)
			cq->ibcq.comp_handler(&cq->ibcq, cq->ibcq.cq_context);
	} else if (cq->ibcq.event_handler) {
		ev.element.cq = &cq->ibcq;
		cq->ibcq.event_handler(&ev, cq->ibcq.cq_context);
	}
}

static void vrdma_qp_event(struct vrdma_dev *dev, u32 type, u32 handle, u64 data)
{
	static const enum ib_event_type ib_type[] = {
		[VRDMA_EVENT_QP_FATAL] = IB_EVENT_QP_FATAL,
		[VRDMA_EVENT_QP_REQ_ERR] = IB_EVENT_QP_REQ_ERR,
		[VRDMA_EVENT_QP_ACCESS_ERR] = IB_EVENT_QP_ACCESS_ERR,
		[VRDMA_EVENT_QP_LAST_WQE] = IB_EVENT_QP_LAST_WQE_REACHED,
	};
	struct vrdma_qp *qp = xa_load(&dev->qps, handle);
	struct ib_event ev = { .device = &dev->ib_dev, .event = ib_type[type] };

	if (!qp) {
		dev_warn_ratelimited(&dev->vdev->dev, "event %u for unknown QP %#x\n", type, handle);
		return;
	}
	if (type != VRDMA_EVENT_QP_LAST_WQE)
		qp->state = IB_QPS_ERR;
	if (qp->ibqp.event_handler) {
		ev.element.qp = &qp->ibqp;
		qp->ibqp.event_handler(&ev, qp->ibqp.qp_context);
	}
}

static void vrdma_srq_event(struct vrdma_dev *dev, u32 type, u32 handle, u64 data)
{
	struct vrdma_srq *srq = xa_load(&dev->srqs, handle);
	struct ib_event ev = { .device = &dev->ib_dev, .event = IB_EVENT_SRQ_LIMIT_REACHED };

	if (!srq) {
		dev_warn_ratelimited(&dev->vdev->dev, "event %u for unknown SRQ %#x\n", type, handle);
		return;
	}
	if (srq->ibsrq.event_handler) {
		ev.element.srq = &srq->ibsrq;
		srq->ibsrq.event_handler(&ev, srq->ibsrq.srq_context);
	}
}

static void vrdma_port_event(struct vrdma_dev *dev, u32 type, u32 handle, u64 data)
{
	dev_dbg(&dev->vdev->dev, "port %u active, device epoch %#llx\n", handle, data);
	if (data != dev->epoch)
		vrdma_device_lost(dev, "the device's state was reset (new epoch)");
}

/* One handler per event type; the xarray it looks in is locked around the whole dispatch. */
static const struct {
	void (*handle)(struct vrdma_dev *dev, u32 type, u32 handle, u64 data);
	size_t table;	/* offset of the xarray in struct vrdma_dev, 0: none */
} vrdma_event_table[] = {
	[VRDMA_EVENT_PORT_ACTIVE] = { vrdma_port_event, 0 },
	[VRDMA_EVENT_CQ_COMP] = { vrdma_cq_event, offsetof(struct vrdma_dev, cqs) },
	[VRDMA_EVENT_CQ_ERR] = { vrdma_cq_event, offsetof(struct vrdma_dev, cqs) },
	[VRDMA_EVENT_QP_FATAL] = { vrdma_qp_event, offsetof(struct vrdma_dev, qps) },
	[VRDMA_EVENT_QP_REQ_ERR] = { vrdma_qp_event, offsetof(struct vrdma_dev, qps) },
	[VRDMA_EVENT_QP_ACCESS_ERR] = { vrdma_qp_event, offsetof(struct vrdma_dev, qps) },
	[VRDMA_EVENT_QP_LAST_WQE] = { vrdma_qp_event, offsetof(struct vrdma_dev, qps) },
	[VRDMA_EVENT_SRQ_LIMIT] = { vrdma_srq_event, offsetof(struct vrdma_dev, srqs) },
};

void vrdma_dispatch_event(struct vrdma_dev *dev, const struct vrdma_event *event)
{
	u32 type = le16_to_cpu(event->type), handle = le32_to_cpu(event->handle);
	u64 data = le64_to_cpu(event->data);
	struct xarray *xa;
	unsigned long flags;

	if (type >= ARRAY_SIZE(vrdma_event_table) || !vrdma_event_table[type].handle) {
		dev_warn_ratelimited(&dev->vdev->dev, "unknown event type %u ignored\n", type);
		return;
	}
	if (!vrdma_event_table[type].table) {
		vrdma_event_table[type].handle(dev, type, handle, data);
		return;
	}
	xa = (struct xarray *)((char *)dev + vrdma_event_table[type].table);
	xa_lock_irqsave(xa, flags);
	vrdma_event_table[type].handle(dev, type, handle, data);
	xa_unlock_irqrestore(xa, flags);
}
