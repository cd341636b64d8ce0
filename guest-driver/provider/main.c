// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * libvrdma: the rdma-core provider of the vrdma paravirtual RDMA device.
 *
 * libibverbs loads this plugin for every uverbs device whose parent is a virtio device with ID 42 (modalias
 * "virtio:d0000002Av*"). It is built inside an rdma-core source tree (providers/vrdma), because providers use
 * rdma-core's private interface (driver.h, IBVERBS_PRIVATE_<N>), which no -dev package ships.
 *
 * Control verbs go through the kernel (ibv_cmd_*), or, for a container's device (modalias "vrdma:channel"), over
 * the backend's container channel (channel.c, chan_verbs.c: no kernel at all). The data path does not: every ring (CQ, send and receive
 * queues, SRQ) lives in this process's memory, which vrdma.ko pins and hands to the device; post_send writes WQEs
 * and stores the producer index into the context's doorbell page (mapped from the device's doorbell region),
 * poll_cq reads CQEs the device wrote, req_notify_cq stores an arm request. No system call and no VM exit -
 * unless the device's engine is parked (slot 0 of the doorbell page says so), then a post_send also wakes it
 * through the kernel (a POST_SEND with no work requests). Every value the kernel hands back is checked.
 */
#include <fcntl.h>

#include "ring.h"

/*
 * The slot of doorbell index `index` (a create response's), its page mapped from mmap offset `offset` if no
 * queue of this context named that page before; NULL with errno set if the index is not a queue's slot of the
 * region or the mapping fails. Pages stay mapped until the context goes (the device never takes one back).
 */
volatile uint32_t *vrdma_db_map(struct vrdma_context *ctx, uint32_t index, uint64_t offset)
{
	uint32_t page = VRDMA_DB_PAGE(index), slot = VRDMA_DB_SLOT(index);
	volatile uint32_t *mapped;
	void *addr;

	if (ctx->chan)
		return vrdma_chan_db(ctx, index);  /* a container's: the whole region is mapped already */
	if (page < VRDMA_FIRST_USER_DOORBELL_PAGE || page >= ctx->doorbell_pages || slot == VRDMA_DB_SLOT_PARKED ||
	    slot == VRDMA_DB_SLOT_ALIVE || offset % ctx->doorbell_size) {
		verbs_err(&ctx->ibv_ctx, "vrdma: kernel gave doorbell index %u at offset %#llx: not usable\n", index,
			  (unsigned long long)offset);
		errno = EPROTO;
		return NULL;
	}
	pthread_mutex_lock(&ctx->db_lock);
	mapped = ctx->db_pages[page];
	if (!mapped) {
		addr = mmap(NULL, ctx->doorbell_size, PROT_READ | PROT_WRITE, MAP_SHARED,
			    ctx->ibv_ctx.context.cmd_fd, (off_t)offset);
		if (addr == MAP_FAILED) {
			int err = errno;

			pthread_mutex_unlock(&ctx->db_lock);
			verbs_err(&ctx->ibv_ctx, "vrdma: mapping doorbell page %u failed: %s\n", page, strerror(err));
			errno = err;
			return NULL;
		}
		mapped = ctx->db_pages[page] = addr;
	}
	pthread_mutex_unlock(&ctx->db_lock);
	return mapped + slot;
}

void vrdma_free_context(struct ibv_context *ibctx)
{
	struct vrdma_context *ctx = to_vctx(ibctx);

	vrdma_chan_close(ctx);
	for (uint32_t page = 0; ctx->db_pages && page < ctx->doorbell_pages; page++) {
		if (ctx->db_pages[page])
			munmap((void *)ctx->db_pages[page], ctx->doorbell_size);
	}
	free(ctx->db_pages);
	pthread_mutex_destroy(&ctx->db_lock);
	pthread_mutex_destroy(&ctx->qps_lock);
	verbs_uninit_context(&ctx->ibv_ctx);
	free(ctx);
}

static const struct verbs_context_ops vrdma_ctx_ops = {
	.alloc_mw = vrdma_alloc_mw,
	.alloc_pd = vrdma_alloc_pd,
	.bind_mw = vrdma_bind_mw,
	.close_xrcd = vrdma_close_xrcd,
	.create_ah = vrdma_create_ah,
	.create_cq = vrdma_create_cq,
	.create_qp = vrdma_create_qp,
	.create_qp_ex = vrdma_create_qp_ex,
	.create_srq = vrdma_create_srq,
	.create_srq_ex = vrdma_create_srq_ex,
	.dealloc_mw = vrdma_dealloc_mw,
	.dealloc_pd = vrdma_dealloc_pd,
	.dereg_mr = vrdma_dereg_mr,
	.destroy_ah = vrdma_destroy_ah,
	.destroy_cq = vrdma_destroy_cq,
	.destroy_qp = vrdma_destroy_qp,
	.destroy_srq = vrdma_destroy_srq,
	.free_context = vrdma_free_context,
	.get_srq_num = vrdma_get_srq_num,
	.modify_cq = vrdma_modify_cq,
	.modify_qp = vrdma_modify_qp,
	.modify_srq = vrdma_modify_srq,
	.open_qp = vrdma_open_qp,
	.open_xrcd = vrdma_open_xrcd,
	.poll_cq = vrdma_poll_cq,
	.post_recv = vrdma_post_recv,
	.post_send = vrdma_post_send,
	.post_srq_recv = vrdma_post_srq_recv,
	.query_device_ex = vrdma_query_device_ex,
	.query_port = vrdma_query_port,
	.query_qp = vrdma_query_qp,
	.query_srq = vrdma_query_srq,
	.reg_mr = vrdma_reg_mr,
	.req_notify_cq = vrdma_req_notify_cq,
	.rereg_mr = vrdma_rereg_mr,
};

/* The doorbell page the kernel describes must be one whole page at a page-aligned offset. */
static int vrdma_check_doorbell(struct vrdma_context *ctx, const struct vrdma_alloc_ucontext_resp *resp)
{
	long page_size = sysconf(_SC_PAGESIZE);

	if (resp->doorbell_page < VRDMA_FIRST_USER_DOORBELL_PAGE || resp->doorbell_page >= resp->doorbell_pages ||
	    resp->doorbell_pages > 65536 || page_size <= 0 || resp->doorbell_page_size != (uint32_t)page_size ||
	    resp->doorbell_offset % (uint64_t)page_size != 0) {
		verbs_err(&ctx->ibv_ctx, "vrdma: kernel gave doorbell page %u of %u, size %u, offset %#llx: not usable\n",
			  resp->doorbell_page, resp->doorbell_pages, resp->doorbell_page_size,
			  (unsigned long long)resp->doorbell_offset);
		return EPROTO;
	}
	return 0;
}

/* A context that could not be made: what it holds goes, errno says why. */
static struct verbs_context *abandon_context(struct vrdma_context *ctx, int err)
{
	free(ctx->db_pages);
	pthread_mutex_destroy(&ctx->db_lock);
	pthread_mutex_destroy(&ctx->qps_lock);
	verbs_uninit_context(&ctx->ibv_ctx);
	free(ctx);
	errno = err;
	return NULL;
}

/*
 * A container's device (docs/containers.md): libibverbs opened the tree's /dev/infiniband node, which is
 * /dev/null's; no command goes through it. It is swapped for a read-only /dev/null, so that what libibverbs itself
 * writes to the command file (a completion channel's creation) fails cleanly with EBADF.
 */
static struct verbs_context *vrdma_alloc_channel_context(struct ibv_device *ibdev, int cmd_fd)
{
	struct verbs_device *vdev = verbs_get_device(ibdev);
	struct vrdma_context *ctx;
	int null_fd, ret;

	null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	close(cmd_fd);
	if (null_fd < 0)
		return NULL;
	ctx = verbs_init_and_alloc_context(ibdev, null_fd, ctx, ibv_ctx, RDMA_DRIVER_UNKNOWN);
	if (!ctx)
		return NULL;
	pthread_mutex_init(&ctx->qps_lock, NULL);
	pthread_mutex_init(&ctx->db_lock, NULL);
	ret = vrdma_chan_open(ctx, vdev->sysfs);
	if (ret)
		return abandon_context(ctx, ret);
	verbs_set_ops(&ctx->ibv_ctx, &vrdma_chan_ctx_ops);
	return &ctx->ibv_ctx;
}

static struct verbs_context *vrdma_alloc_context(struct ibv_device *ibdev, int cmd_fd, void *private_data)
{
	struct vrdma_context *ctx;
	volatile uint32_t *first;
	struct uvrdma_get_context cmd = {};
	struct uvrdma_get_context_resp resp = {};
	int ret;

	if (container_of(ibdev, struct vrdma_device, ibv_dev.device)->channel)
		return vrdma_alloc_channel_context(ibdev, cmd_fd);
	ctx = verbs_init_and_alloc_context(ibdev, cmd_fd, ctx, ibv_ctx, RDMA_DRIVER_UNKNOWN);
	if (!ctx)
		return NULL;
	pthread_mutex_init(&ctx->qps_lock, NULL);
	pthread_mutex_init(&ctx->db_lock, NULL);
	ret = ibv_cmd_get_context(&ctx->ibv_ctx, &cmd.ibv_cmd, sizeof(cmd), &resp.ibv_resp, sizeof(resp));
	if (ret)
		goto err_free;
	ret = vrdma_check_doorbell(ctx, &resp.drv_payload);
	if (ret)
		goto err_free;
	ctx->doorbell_page = resp.doorbell_page;
	ctx->doorbell_size = resp.doorbell_page_size;
	ctx->doorbell_pages = resp.doorbell_pages;
	ctx->db_pages = calloc(ctx->doorbell_pages, sizeof(*ctx->db_pages));
	if (!ctx->db_pages) {
		ret = ENOMEM;
		goto err_free;
	}
	/* The first page, mapped as any other (its first queue slot names it); ctx->doorbell is its start. */
	first = vrdma_db_map(ctx, ctx->doorbell_page * VRDMA_DB_SLOTS + VRDMA_DB_SLOT_PARKED + 1, resp.doorbell_offset);
	if (!first) {
		ret = errno;
		goto err_free;
	}
	ctx->doorbell = first - (VRDMA_DB_SLOT_PARKED + 1);
	verbs_set_ops(&ctx->ibv_ctx, &vrdma_ctx_ops);
	return &ctx->ibv_ctx;

err_free:
	/* Closing the context's file (done by the caller on failure) releases what the kernel allocated. */
	return abandon_context(ctx, ret);
}

/* A container's device: its tree's device/modalias says so (docs/containers.md). */
#define VRDMA_CHANNEL_MATCH ((void *)1)

static struct verbs_device *vrdma_device_alloc(struct verbs_sysfs_dev *sysfs_dev)
{
	struct vrdma_device *dev;

	dev = calloc(1, sizeof(*dev));
	if (!dev)
		return NULL;
	dev->channel = sysfs_dev->match && sysfs_dev->match->driver_data == VRDMA_CHANNEL_MATCH;
	return &dev->ibv_dev;
}

static void vrdma_device_free(struct verbs_device *verbs_dev)
{
	free(container_of(verbs_dev, struct vrdma_device, ibv_dev));
}

static const struct verbs_match_ent vrdma_match_table[] = {
	/* The uverbs device's parent is the virtio device: virtio:d<device id>v<vendor id>. */
	VERBS_MODALIAS_MATCH("virtio:d0000002Av*", NULL),
	VERBS_MODALIAS_MATCH("vrdma:channel", VRDMA_CHANNEL_MATCH),
	{},
};

static const struct verbs_device_ops vrdma_dev_ops = {
	.name = "vrdma",
	.match_min_abi_version = VRDMA_UVERBS_ABI_VERSION,
	.match_max_abi_version = VRDMA_UVERBS_ABI_VERSION,
	.match_table = vrdma_match_table,
	.alloc_device = vrdma_device_alloc,
	.uninit_device = vrdma_device_free,
	.alloc_context = vrdma_alloc_context,
};

PROVIDER_DRIVER(vrdma, vrdma_dev_ops);
