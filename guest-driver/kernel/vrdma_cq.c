// SPDX-License-Identifier: GPL-2.0-only
/*
 * Completion queues: a user CQ's ring lives in the process's memory (libvrdma polls it; the kernel pins it and tells
 * the provider its doorbell slot for arming), a kernel consumer's in kernel pages (vrdma_kqueue.c polls and arms it).
 */
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <rdma/ib_umem.h>
#include <rdma/uverbs_ioctl.h>

#include "vrdma.h"

/*
 * One create path for both kinds of CQ: the ring comes from the process (libvrdma sized it in its own memory; the
 * kernel pins it) or, for a kernel consumer, from kernel pages sized here; then the same command, doorbell check
 * and publication.
 */
int vrdma_create_cq(struct ib_cq *ibcq, const struct ib_cq_init_attr *attr, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibcq->device);
	struct vrdma_cq *cq = container_of(ibcq, struct vrdma_cq, ibcq);
	struct vrdma_cmd_create_cq cmd = { .hdr.opcode = cpu_to_le16(VRDMA_CMD_CREATE_CQ) };
	struct vrdma_resp_create_cq resp;
	struct vrdma_create_cq_resp uresp = {};
	struct vrdma_create_cq_cmd ucmd;
	u32 max_cqe = le32_to_cpu(dev->attr.max_cqe), entries;
	struct vrdma_pbl pbl;
	int ret;

	if (attr->flags || attr->comp_vector >= ibcq->device->num_comp_vectors)
		return -EOPNOTSUPP;
	if (udata) {
		ret = vrdma_udata_in(udata, &ucmd, sizeof(ucmd), sizeof(uresp));
		if (ret)
			return ret;
		if (!PAGE_ALIGNED(ucmd.buf_addr) || !is_power_of_2(ucmd.entries) || ucmd.entries < attr->cqe ||
		    ucmd.entries > max_cqe || ucmd.buf_size < PAGE_SIZE + (u64)ucmd.entries * sizeof(struct vrdma_cqe) ||
		    ucmd.reserved)
			return -EINVAL;
		entries = ucmd.entries;
		ret = vrdma_pin(dev, ucmd.buf_addr, ucmd.buf_size, IB_ACCESS_LOCAL_WRITE, &cq->ring, &pbl);
	} else {
		if (!attr->cqe || attr->cqe > max_cqe || roundup_pow_of_two(attr->cqe) > max_cqe)
			return -EINVAL;
		entries = roundup_pow_of_two(attr->cqe);
		ret = vrdma_kbuf_alloc(&cq->ring, PAGE_SIZE + (size_t)entries * sizeof(struct vrdma_cqe), &pbl);
	}
	if (ret)
		return ret;
	cmd.ucontext = cpu_to_le32(udata ? vrdma_ucontext_handle(udata) : 0);  /* 0: the kernel's */
	cmd.entries = cpu_to_le32(entries);
	cmd.ring = pbl.desc;
	cmd.ring.npages = cpu_to_le32(DIV_ROUND_UP(PAGE_SIZE + entries * sizeof(struct vrdma_cqe), PAGE_SIZE));
	ret = vrdma_exec_create(dev, &cmd, sizeof(cmd), &resp, sizeof(resp), &pbl, &cq->ring);
	if (ret)
		return ret;
	cq->handle = le32_to_cpu(resp.handle);
	ibcq->cqe = entries;
	if (udata) {
		uresp.cq_handle = cq->handle;
		ret = vrdma_udata_db(udata, resp.db_index, &uresp.db_index, &uresp.db_offset);
	} else if (vrdma_kdb_ok(dev, le32_to_cpu(resp.db_index))) {
		vrdma_kcq_init(cq, entries, le32_to_cpu(resp.db_index));
	} else {
		dev_err(&dev->vdev->dev, "device gave CQ %#x doorbell index %u\n", cq->handle,
			le32_to_cpu(resp.db_index));
		ret = -EIO;
	}
	if (ret)
		return vrdma_unmake(dev, VRDMA_CMD_DESTROY_CQ, cq->handle, &cq->ring, ret);
	return vrdma_publish(dev, &dev->cqs, cq->handle, cq, VRDMA_CMD_DESTROY_CQ, udata, &uresp,
			     sizeof(uresp), &cq->ring);
}

int vrdma_destroy_cq(struct ib_cq *ibcq, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibcq->device);
	struct vrdma_cq *cq = container_of(ibcq, struct vrdma_cq, ibcq);

	return vrdma_unpublish(dev, &dev->cqs, cq->handle, cq, VRDMA_CMD_DESTROY_CQ, &cq->ring);
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

	return vrdma_kernel_ring(&cq->ring) ? vrdma_kcq_poll(cq, num_entries, wc) : -EOPNOTSUPP;
}

int vrdma_req_notify_cq(struct ib_cq *ibcq, enum ib_cq_notify_flags flags)
{
	struct vrdma_cq *cq = container_of(ibcq, struct vrdma_cq, ibcq);

	return vrdma_kernel_ring(&cq->ring) ? vrdma_kcq_notify(cq, flags) : -EOPNOTSUPP;
}
