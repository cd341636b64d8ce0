// SPDX-License-Identifier: GPL-2.0-only
/*
 * Completion queues: the ring lives in the process's memory (libvrdma polls it); the kernel pins it, creates the CQ
 * with the device and tells the provider its doorbell slot for arming.
 */
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <rdma/ib_umem.h>
#include <rdma/uverbs_ioctl.h>

#include "vrdma.h"

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

	if (attr->flags || attr->comp_vector >= ibcq->device->num_comp_vectors)
		return -EOPNOTSUPP;
	if (!udata)
		return vrdma_kcq_create(cq, attr);  /* a kernel consumer's */
	ret = vrdma_udata_in(udata, &ucmd, sizeof(ucmd), sizeof(uresp));
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
	ret = vrdma_exec_pinned(dev, &cmd, sizeof(cmd), &resp, sizeof(resp), &pbl, cq->umem);
	if (ret)
		return ret;
	cq->handle = le32_to_cpu(resp.handle);
	ibcq->cqe = ucmd.entries;
	uresp.cq_handle = cq->handle;
	ret = vrdma_udata_db(udata, resp.db_index, &uresp.db_index, &uresp.db_offset);
	if (ret)
		return vrdma_unmake(dev, VRDMA_CMD_DESTROY_CQ, cq->handle, cq->umem, ret);
	return vrdma_publish(dev, &dev->cqs, cq->handle, cq, VRDMA_CMD_DESTROY_CQ, udata, &uresp,
			     sizeof(uresp), cq->umem);
}

int vrdma_destroy_cq(struct ib_cq *ibcq, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibcq->device);
	struct vrdma_cq *cq = container_of(ibcq, struct vrdma_cq, ibcq);

	if (cq->kbuf.va)
		return vrdma_kcq_destroy(cq);
	return vrdma_unpublish(dev, &dev->cqs, cq->handle, cq, VRDMA_CMD_DESTROY_CQ, cq->umem);
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

/* Kernel CQs are polled and armed here; user CQs in user space (libvrdma), through their ring and doorbell page. */
int vrdma_poll_cq(struct ib_cq *ibcq, int num_entries, struct ib_wc *wc)
{
	struct vrdma_cq *cq = container_of(ibcq, struct vrdma_cq, ibcq);

	return cq->kbuf.va ? vrdma_kcq_poll(cq, num_entries, wc) : -EOPNOTSUPP;
}

int vrdma_req_notify_cq(struct ib_cq *ibcq, enum ib_cq_notify_flags flags)
{
	struct vrdma_cq *cq = container_of(ibcq, struct vrdma_cq, ibcq);

	return cq->kbuf.va ? vrdma_kcq_notify(cq, flags) : -EOPNOTSUPP;
}
