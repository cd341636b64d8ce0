// SPDX-License-Identifier: GPL-2.0-only
/*
 * What every object shares: its ring described to the device as guest-physical page lists (page-list pages, two
 * levels for large buffers), pinned user memory for a user context's objects or kernel pages for the kernel's; its
 * context's handle; and its publication (reachable by events through its type's xarray, its handles told to the
 * provider) and withdrawal.
 */
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <linux/vmalloc.h>
#include <rdma/ib_umem.h>
#include <rdma/uverbs_ioctl.h>

#include "vrdma.h"

static_assert(PAGE_SIZE == VRDMA_PAGE_SIZE, "vrdma page lists describe 4 KiB pages");

void vrdma_pbl_free(struct vrdma_pbl *pbl)
{
	u32 i;

	for (i = 0; pbl->lists && i < pbl->nlists; i++)
		free_page((unsigned long)pbl->lists[i]);
	kfree(pbl->lists);
	free_page((unsigned long)pbl->dir);
	memset(pbl, 0, sizeof(*pbl));
}

/* Page-list pages for @npages pages (the caller fills them with vrdma_pbl_set, then vrdma_pbl_finish). */
static int vrdma_pbl_alloc(struct vrdma_pbl *pbl, size_t npages)
{
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
		if (!pbl->lists[i]) {
			vrdma_pbl_free(pbl);
			return -ENOMEM;
		}
	}
	pbl->desc.npages = cpu_to_le32(npages);
	return 0;
}

static void vrdma_pbl_set(struct vrdma_pbl *pbl, size_t n, struct page *page)
{
	/*
	 * Guest-physical addresses, from the pages themselves: the device is a virtio device without
	 * VIRTIO_F_ACCESS_PLATFORM, which addresses guest memory physically, whatever DMA mapping was made.
	 */
	pbl->lists[n / VRDMA_PBL_ENTRIES][n % VRDMA_PBL_ENTRIES] = cpu_to_le64(page_to_phys(page));
}

/* One level when one page-list page holds every page, else a directory of page-list pages. */
static int vrdma_pbl_finish(struct vrdma_pbl *pbl)
{
	u32 i;

	if (pbl->nlists == 1) {
		pbl->desc.levels = cpu_to_le32(1);
		pbl->desc.addr = cpu_to_le64(virt_to_phys(pbl->lists[0]));
		return 0;
	}
	pbl->dir = (__le64 *)get_zeroed_page(GFP_KERNEL);
	if (!pbl->dir) {
		vrdma_pbl_free(pbl);
		return -ENOMEM;
	}
	for (i = 0; i < pbl->nlists; i++)
		pbl->dir[i] = cpu_to_le64(virt_to_phys(pbl->lists[i]));
	pbl->desc.levels = cpu_to_le32(2);
	pbl->desc.addr = cpu_to_le64(virt_to_phys(pbl->dir));
	return 0;
}

int vrdma_pbl_build(struct ib_umem *umem, struct vrdma_pbl *pbl)
{
	size_t npages = ib_umem_num_pages(umem);
	struct scatterlist *sg;
	size_t n = 0;
	int ret;
	u32 i;

	ret = vrdma_pbl_alloc(pbl, npages);
	if (ret)
		return ret;
	for_each_sgtable_sg(&umem->sgt_append.sgt, sg, i) {
		unsigned int off;

		for (off = 0; off < sg->length && n < npages; off += PAGE_SIZE, n++)
			vrdma_pbl_set(pbl, n, vrdma_sg_page(sg, off >> PAGE_SHIFT));
	}
	if (n != npages) {
		vrdma_pbl_free(pbl);
		return -EFAULT;
	}
	return vrdma_pbl_finish(pbl);
}

/*
 * A kernel consumer's ring: zeroed pages of vmalloc space (page-aligned, no contiguous allocation however large the
 * ring), described by a page list the caller frees once the device has read it.
 */
int vrdma_kbuf_alloc(struct vrdma_buf *buf, size_t size, struct vrdma_pbl *pbl)
{
	struct vrdma_kbuf *kbuf = &buf->kbuf;
	size_t n, npages = DIV_ROUND_UP(size, PAGE_SIZE);
	int ret;

	kbuf->size = npages * PAGE_SIZE;
	kbuf->va = vzalloc(kbuf->size);
	if (!kbuf->va)
		return -ENOMEM;
	ret = vrdma_pbl_alloc(pbl, npages);
	if (ret)
		goto err_free;
	for (n = 0; n < npages; n++)
		vrdma_pbl_set(pbl, n, vmalloc_to_page(kbuf->va + n * PAGE_SIZE));
	ret = vrdma_pbl_finish(pbl);
	if (ret)
		goto err_free;
	return 0;

err_free:
	vfree(kbuf->va);
	kbuf->va = NULL;
	return ret;
}

/* The device let go of an object's memory (or never had it): unpin a user's pages, free a kernel ring. */
void vrdma_buf_release(struct vrdma_buf *buf)
{
	ib_umem_release(buf->umem);  /* both accept nothing: at most one of the two is set */
	buf->umem = NULL;
	vfree(buf->kbuf.va);
	buf->kbuf.va = NULL;
}

/* A create's udata: the provider's request (exactly the user ABI's struct) copied in, room for the answer checked. */
int vrdma_udata_in(struct ib_udata *udata, void *ucmd, size_t ucmd_len, size_t uresp_len)
{
	if (udata->inlen < ucmd_len || udata->outlen < uresp_len)
		return -EINVAL;
	return ib_copy_from_udata(ucmd, udata, ucmd_len);
}

/* Pin a user buffer and describe it; on success the caller owns buf->umem and must free the page list. */
int vrdma_pin(struct vrdma_dev *dev, u64 addr, u64 size, int access, struct vrdma_buf *buf,
	      struct vrdma_pbl *pbl)
{
	struct ib_umem *umem = vrdma_umem_get(&dev->ib_dev, addr, size, access);
	int ret;

	if (IS_ERR(umem))
		return PTR_ERR(umem);
	ret = vrdma_pbl_build(umem, pbl);
	if (ret) {
		ib_umem_release(umem);
		return ret;
	}
	buf->umem = umem;
	return 0;
}

u32 vrdma_ucontext_handle(struct ib_udata *udata)
{
	struct vrdma_ucontext *uc = rdma_udata_to_drv_context(udata, struct vrdma_ucontext, ibuc);

	return uc ? uc->handle : 0;
}

/*
 * Run the create command of an object whose memory is @buf, described by @pbl: the page list is only needed while
 * the device reads it, so it goes either way; the memory goes too if the device refused.
 */
int vrdma_exec_create(struct vrdma_dev *dev, void *cmd, size_t cmd_len, void *resp, size_t resp_len,
		      struct vrdma_pbl *pbl, struct vrdma_buf *buf)
{
	int ret = vrdma_cmd_exec(dev, cmd, cmd_len, resp, resp_len);

	vrdma_pbl_free(pbl);
	if (ret)
		vrdma_buf_release(buf);
	return ret;
}

/*
 * Make a created object reachable by events (its xarray, by the device's handle) and tell the provider about it;
 * on failure undo both, destroy it in the device and release its pinned ring.
 */
int vrdma_publish(struct vrdma_dev *dev, struct xarray *xa, u32 handle, void *obj, u16 destroy_opcode,
		  struct ib_udata *udata, void *uresp, size_t uresp_len, struct vrdma_buf *buf)
{
	int ret;

	ret = xa_insert_irq(xa, handle, obj, GFP_KERNEL);
	if (ret)
		goto err_destroy;
	ret = udata ? ib_copy_to_udata(udata, uresp, uresp_len) : 0;  /* a kernel object has no provider to tell */
	if (ret)
		goto err_erase;
	return 0;

err_erase:
	xa_erase_irq(xa, handle);
err_destroy:
	return vrdma_unmake(dev, destroy_opcode, handle, buf, ret);
}

/* An object made in the device that cannot be handed out after all: destroyed, its memory released; returns err. */
int vrdma_unmake(struct vrdma_dev *dev, u16 destroy_opcode, u32 handle, struct vrdma_buf *buf, int err)
{
	vrdma_destroy_handle(dev, destroy_opcode, handle);
	vrdma_buf_release(buf);
	return err;
}

/*
 * Destroy an object the device knows by handle: unreachable by events first (the dispatcher holds the xarray's
 * lock), then destroyed in the device, then its memory released; if the device refuses, it is put back (and a
 * ring it may still write is never freed).
 */
int vrdma_unpublish(struct vrdma_dev *dev, struct xarray *xa, u32 handle, void *obj, u16 destroy_opcode,
		    struct vrdma_buf *buf)
{
	int ret;

	xa_erase_irq(xa, handle);
	ret = vrdma_destroy_handle(dev, destroy_opcode, handle);
	if (ret) {
		xa_store_irq(xa, handle, obj, GFP_KERNEL);
		return ret;
	}
	vrdma_buf_release(buf);  /* the device let go of it */
	return 0;
}
