// SPDX-License-Identifier: GPL-2.0-only
/*
 * Memory regions: a user buffer pinned and registered with the device, which translates its pages once; the
 * kernel's DMA MR (the local DMA lkey); and fast-registration MRs, which the kernel's RDMA users map with REG_MR
 * work requests (vrdma_kqueue.c) after ib_map_mr_sg filled their page list.
 */
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <rdma/ib_umem.h>
#include <rdma/uverbs_ioctl.h>

#include "vrdma.h"

#define VRDMA_MR_ACCESS (IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE | IB_ACCESS_REMOTE_READ | \
			 IB_ACCESS_REMOTE_ATOMIC | IB_ACCESS_MW_BIND)

static_assert(IB_ACCESS_REMOTE_ATOMIC == VRDMA_ACCESS_REMOTE_ATOMIC && IB_ACCESS_MW_BIND == VRDMA_ACCESS_MW_BIND &&
	      VRDMA_MR_ACCESS == VRDMA_ALL_ACCESS, "access flags are the IB values");
static_assert(IB_MR_REREG_TRANS == VRDMA_REREG_TRANSLATION && IB_MR_REREG_PD == VRDMA_REREG_PD &&
	      IB_MR_REREG_ACCESS == VRDMA_REREG_ACCESS, "reregistration flags are the IB values");

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
	ret = vrdma_pin(dev, start, length, access, &mr->mem, &pbl);
	if (ret)
		goto err_free;
	cmd.hdr.opcode = cpu_to_le16(VRDMA_CMD_REG_MR);
	cmd.pd = cpu_to_le32(pd->handle);
	cmd.access = cpu_to_le32(access);
	cmd.iova = cpu_to_le64(virt);
	cmd.length = cpu_to_le64(length);
	cmd.page_offset = cpu_to_le32(ib_umem_offset(mr->mem.umem));
	cmd.pages = pbl.desc;
	ret = vrdma_exec_create(dev, &cmd, sizeof(cmd), &resp, sizeof(resp), &pbl, &mr->mem);
	if (ret)
		goto err_free;
	mr->handle = le32_to_cpu(resp.handle);
	mr->ibmr.lkey = le32_to_cpu(resp.lkey);
	mr->ibmr.rkey = le32_to_cpu(resp.rkey);
	mr->access = access;
	return &mr->ibmr;

err_free:
	kfree(mr);
	return ERR_PTR(ret);
}

int vrdma_dereg_mr(struct ib_mr *ibmr, struct ib_udata *udata)
{
	struct vrdma_mr *mr = container_of(ibmr, struct vrdma_mr, ibmr);
	int ret;

	if (mr->dma) {  /* the device has no object behind it */
		kfree(mr);
		return 0;
	}
	ret = vrdma_destroy_handle(to_vdev(ibmr->device), VRDMA_CMD_DEREG_MR, mr->handle);
	if (ret)
		return ret;
	vrdma_buf_release(&mr->mem);  /* (none for a fast-registration MR) */
	kfree(mr->pages);
	kfree(mr);
	return 0;
}

/*
 * ibv_rereg_mr: the device changes the MR in place (handle and keys stay); a new translation pins the new range
 * first and lets the old one go only once the device has moved to it, so a refusal leaves the MR as it was.
 */
struct ib_mr *vrdma_rereg_user_mr(struct ib_mr *ibmr, int flags, u64 start, u64 length, u64 virt, int access,
				  struct ib_pd *ibpd, struct ib_udata *udata)
{
	struct vrdma_mr *mr = container_of(ibmr, struct vrdma_mr, ibmr);
	struct vrdma_dev *dev = to_vdev(ibmr->device);
	struct vrdma_cmd_rereg_mr cmd = {};
	struct vrdma_resp_reg_mr resp;
	struct vrdma_buf fresh = {};
	struct vrdma_pbl pbl;
	int ret;

	if (!mr->mem.umem)
		return ERR_PTR(-EOPNOTSUPP);  /* the DMA MR and fast-registration MRs are the kernel's */
	if (flags & IB_MR_REREG_ACCESS) {
		access &= ~IB_ACCESS_OPTIONAL;
		if (access & ~VRDMA_MR_ACCESS)
			return ERR_PTR(-EOPNOTSUPP);
	} else {
		access = mr->access;
	}
	cmd.hdr.opcode = cpu_to_le16(VRDMA_CMD_REREG_MR);
	cmd.handle = cpu_to_le32(mr->handle);
	cmd.flags = cpu_to_le32(flags);
	cmd.pd = cpu_to_le32(container_of(ibpd, struct vrdma_pd, ibpd)->handle);
	cmd.access = cpu_to_le32(access);
	if (flags & IB_MR_REREG_TRANS) {
		ret = vrdma_pin(dev, start, length, access, &fresh, &pbl);
		if (ret)
			return ERR_PTR(ret);
		cmd.iova = cpu_to_le64(virt);
		cmd.length = cpu_to_le64(length);
		cmd.page_offset = cpu_to_le32(ib_umem_offset(fresh.umem));
		cmd.pages = pbl.desc;
		ret = vrdma_exec_create(dev, &cmd, sizeof(cmd), &resp, sizeof(resp), &pbl, &fresh);
	} else {
		ret = vrdma_cmd_exec(dev, &cmd, sizeof(cmd), &resp, sizeof(resp));
	}
	if (ret)
		return ERR_PTR(ret);
	if (fresh.umem) {
		vrdma_buf_release(&mr->mem);  /* the device reads the new pages now */
		mr->mem = fresh;
	}
	mr->access = access;
	return NULL;  /* changed in place: the core keeps the ib_mr (and updates its PD, iova and length) */
}

/* A memory window of a PD: a key the provider's BIND_MW work requests point at part of an MR. */
int vrdma_alloc_mw(struct ib_mw *ibmw, struct ib_udata *udata)
{
	struct vrdma_mw *mw = container_of(ibmw, struct vrdma_mw, ibmw);
	struct vrdma_cmd_alloc_mw cmd = { .hdr.opcode = cpu_to_le16(VRDMA_CMD_ALLOC_MW),
					  .pd = cpu_to_le32(container_of(ibmw->pd, struct vrdma_pd, ibpd)->handle),
					  .type = cpu_to_le32(ibmw->type) };
	struct vrdma_resp_alloc_mw resp;
	int ret;

	static_assert(IB_MW_TYPE_1 == 1 && IB_MW_TYPE_2 == 2, "window types are the IB values");
	ret = vrdma_cmd_exec(to_vdev(ibmw->device), &cmd, sizeof(cmd), &resp, sizeof(resp));
	if (ret)
		return ret;
	mw->handle = le32_to_cpu(resp.handle);
	ibmw->rkey = le32_to_cpu(resp.rkey);
	return 0;
}

int vrdma_dealloc_mw(struct ib_mw *ibmw)
{
	return vrdma_destroy_handle(to_vdev(ibmw->device), VRDMA_CMD_DEALLOC_MW,
				    container_of(ibmw, struct vrdma_mw, ibmw)->handle);
}

/*
 * A fast-registration MR (IB_MR_TYPE_MEM_REG): the device's MR of the PD with room for max_num_sg pages, nothing
 * mapped, one key for lkey and rkey. Its page list is a physically contiguous kernel buffer of guest-physical page
 * addresses: the device reads it when it executes the REG_MR work request that names it.
 */
struct ib_mr *vrdma_alloc_mr(struct ib_pd *ibpd, enum ib_mr_type type, u32 max_num_sg)
{
	struct vrdma_dev *dev = to_vdev(ibpd->device);
	struct vrdma_cmd_alloc_mr cmd = { .hdr.opcode = cpu_to_le16(VRDMA_CMD_ALLOC_MR),
					  .pd = cpu_to_le32(container_of(ibpd, struct vrdma_pd, ibpd)->handle),
					  .max_pages = cpu_to_le32(max_num_sg) };
	struct vrdma_resp_alloc_mr resp;
	struct vrdma_mr *mr;
	int ret;

	if (type != IB_MR_TYPE_MEM_REG)
		return ERR_PTR(-EOPNOTSUPP);  /* no SG_GAPS or integrity MRs */
	if (!max_num_sg || max_num_sg > le32_to_cpu(dev->attr.max_fast_reg_pages))
		return ERR_PTR(-EINVAL);
	mr = kzalloc(sizeof(*mr), GFP_KERNEL);
	if (!mr)
		return ERR_PTR(-ENOMEM);
	mr->pages = kcalloc(max_num_sg, sizeof(*mr->pages), GFP_KERNEL);
	if (!mr->pages) {
		ret = -ENOMEM;
		goto err_free;
	}
	ret = vrdma_cmd_exec(dev, &cmd, sizeof(cmd), &resp, sizeof(resp));
	if (ret)
		goto err_free;
	mr->handle = le32_to_cpu(resp.handle);
	mr->ibmr.lkey = mr->ibmr.rkey = le32_to_cpu(resp.key);
	mr->max_pages = max_num_sg;
	return &mr->ibmr;

err_free:
	kfree(mr->pages);
	kfree(mr);
	return ERR_PTR(ret);
}

static int vrdma_set_page(struct ib_mr *ibmr, u64 addr)
{
	struct vrdma_mr *mr = container_of(ibmr, struct vrdma_mr, ibmr);

	if (mr->npages == mr->max_pages)
		return -ENOMEM;
	mr->pages[mr->npages++] = cpu_to_le64(addr);  /* a DMA address: guest-physical (no IOMMU: vrdma_kqueue.c) */
	return 0;
}

int vrdma_map_mr_sg(struct ib_mr *ibmr, struct scatterlist *sg, int sg_nents, unsigned int *sg_offset)
{
	struct vrdma_mr *mr = container_of(ibmr, struct vrdma_mr, ibmr);

	if (!mr->pages || ibmr->page_size != VRDMA_PAGE_SIZE)
		return -EINVAL;  /* the device maps 4 KiB pages */
	mr->npages = 0;
	return ib_sg_to_pages(ibmr, sg, sg_nents, sg_offset, vrdma_set_page);
}

/*
 * The kernel's DMA MR: the local DMA lkey, which the device honours in the kernel's work requests for any range of
 * the guest's RAM. Local access only: an rkey to all of the guest's memory is what no VM should hand a peer.
 */
struct ib_mr *vrdma_get_dma_mr(struct ib_pd *ibpd, int access)
{
	struct vrdma_mr *mr;

	if (access & ~IB_ACCESS_LOCAL_WRITE)
		return ERR_PTR(-EOPNOTSUPP);
	mr = kzalloc(sizeof(*mr), GFP_KERNEL);
	if (!mr)
		return ERR_PTR(-ENOMEM);
	mr->dma = true;
	mr->ibmr.lkey = VRDMA_LOCAL_DMA_LKEY;
	return &mr->ibmr;
}
