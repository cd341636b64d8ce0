// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * libvrdma: the rdma-core provider of the vrdma paravirtual RDMA device.
 *
 * libibverbs loads this plugin for every uverbs device whose parent is a virtio device with ID 42 (modalias
 * "virtio:d0000002Av*"). It is built inside an rdma-core source tree (providers/vrdma), because providers use
 * rdma-core's private interface (driver.h, IBVERBS_PRIVATE_<N>), which no -dev package ships.
 *
 * What it does today: open the device (one doorbell page per context, mapped from the uverbs file), query the
 * device and the port, allocate and free PDs. Everything else answers EOPNOTSUPP through libibverbs' defaults
 * until the data path lands. Every value the kernel hands back is checked before use.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <infiniband/driver.h>
#include <rdma/vrdma-abi.h>

struct vrdma_device {
	struct verbs_device ibv_dev;
};

struct vrdma_context {
	struct verbs_context ibv_ctx;
	uint32_t doorbell_page;   /* index of this context's page in the device's doorbell region */
	size_t doorbell_size;
	void *doorbell;           /* that page, mapped from the uverbs file; only this process maps it */
};

struct vrdma_pd {
	struct ibv_pd ibv_pd;
	uint32_t pdn;
};

/* Kernel responses: the core's part, then vrdma's udata (from the shared ABI header). */
struct vrdma_get_context_resp {
	struct ib_uverbs_get_context_resp ibv_resp;
	struct vrdma_alloc_ucontext_resp drv;
};

struct vrdma_alloc_pd_cmd_resp {
	struct ib_uverbs_alloc_pd_resp ibv_resp;
	struct vrdma_alloc_pd_resp drv;
};

static inline struct vrdma_context *to_vctx(struct ibv_context *ibctx)
{
	return container_of(ibctx, struct vrdma_context, ibv_ctx.context);
}

static inline struct vrdma_pd *to_vpd(struct ibv_pd *ibpd)
{
	return container_of(ibpd, struct vrdma_pd, ibv_pd);
}

static int vrdma_query_device_ex(struct ibv_context *context, const struct ibv_query_device_ex_input *input,
				 struct ibv_device_attr_ex *attr, size_t attr_size)
{
	struct ib_uverbs_ex_query_device_resp resp;
	size_t resp_size = sizeof(resp);
	uint64_t fw;
	int ret;

	ret = ibv_cmd_query_device_any(context, input, attr, attr_size, &resp, &resp_size);
	if (ret)
		return ret;
	fw = resp.base.fw_ver;
	snprintf(attr->orig_attr.fw_ver, sizeof(attr->orig_attr.fw_ver), "%u.%u.%u",
		 (unsigned int)(fw >> 32) & 0xffff, (unsigned int)(fw >> 16) & 0xffff, (unsigned int)fw & 0xffff);
	return 0;
}

static int vrdma_query_port(struct ibv_context *context, uint8_t port, struct ibv_port_attr *attr)
{
	struct ibv_query_port cmd;

	return ibv_cmd_query_port(context, port, attr, &cmd, sizeof(cmd));
}

static struct ibv_pd *vrdma_alloc_pd(struct ibv_context *context)
{
	struct ibv_alloc_pd cmd;
	struct vrdma_alloc_pd_cmd_resp resp = {};
	struct vrdma_pd *pd;
	int ret;

	pd = calloc(1, sizeof(*pd));
	if (!pd) {
		errno = ENOMEM;
		return NULL;
	}
	ret = ibv_cmd_alloc_pd(context, &pd->ibv_pd, &cmd, sizeof(cmd), &resp.ibv_resp, sizeof(resp));
	if (ret) {
		free(pd);
		errno = ret;
		return NULL;
	}
	pd->pdn = resp.drv.pdn;
	return &pd->ibv_pd;
}

static int vrdma_dealloc_pd(struct ibv_pd *ibpd)
{
	int ret;

	ret = ibv_cmd_dealloc_pd(ibpd);
	if (ret)
		return ret;
	free(to_vpd(ibpd));
	return 0;
}

static void vrdma_free_context(struct ibv_context *ibctx)
{
	struct vrdma_context *ctx = to_vctx(ibctx);

	if (ctx->doorbell)
		munmap(ctx->doorbell, ctx->doorbell_size);
	verbs_uninit_context(&ctx->ibv_ctx);
	free(ctx);
}

static const struct verbs_context_ops vrdma_ctx_ops = {
	.query_device_ex = vrdma_query_device_ex,
	.query_port = vrdma_query_port,
	.alloc_pd = vrdma_alloc_pd,
	.dealloc_pd = vrdma_dealloc_pd,
	.free_context = vrdma_free_context,
};

/* The doorbell page the kernel describes must be one whole page at a page-aligned offset. */
static int vrdma_check_doorbell(struct vrdma_context *ctx, const struct vrdma_alloc_ucontext_resp *resp)
{
	long page_size = sysconf(_SC_PAGESIZE);

	if (resp->doorbell_page == 0 || page_size <= 0 || resp->doorbell_page_size != (uint32_t)page_size ||
	    resp->doorbell_offset % (uint64_t)page_size != 0) {
		verbs_err(&ctx->ibv_ctx, "vrdma: kernel gave doorbell page %u, size %u, offset %#llx: not usable\n",
			  resp->doorbell_page, resp->doorbell_page_size,
			  (unsigned long long)resp->doorbell_offset);
		return EPROTO;
	}
	return 0;
}

static struct verbs_context *vrdma_alloc_context(struct ibv_device *ibdev, int cmd_fd, void *private_data)
{
	struct vrdma_context *ctx;
	struct ibv_get_context cmd;
	struct vrdma_get_context_resp resp = {};
	int ret;

	ctx = verbs_init_and_alloc_context(ibdev, cmd_fd, ctx, ibv_ctx, RDMA_DRIVER_UNKNOWN);
	if (!ctx)
		return NULL;
	ret = ibv_cmd_get_context(&ctx->ibv_ctx, &cmd, sizeof(cmd), &resp.ibv_resp, sizeof(resp));
	if (ret)
		goto err_free;
	ret = vrdma_check_doorbell(ctx, &resp.drv);
	if (ret)
		goto err_free;
	ctx->doorbell_page = resp.drv.doorbell_page;
	ctx->doorbell_size = resp.drv.doorbell_page_size;
	ctx->doorbell = mmap(NULL, ctx->doorbell_size, PROT_WRITE, MAP_SHARED, cmd_fd,
			     (off_t)resp.drv.doorbell_offset);
	if (ctx->doorbell == MAP_FAILED) {
		ret = errno;
		ctx->doorbell = NULL;
		verbs_err(&ctx->ibv_ctx, "vrdma: mapping doorbell page %u failed: %s\n", ctx->doorbell_page,
			  strerror(ret));
		goto err_free;
	}
	verbs_set_ops(&ctx->ibv_ctx, &vrdma_ctx_ops);
	return &ctx->ibv_ctx;

err_free:
	/* Closing the context's file (done by the caller on failure) releases what the kernel allocated. */
	verbs_uninit_context(&ctx->ibv_ctx);
	free(ctx);
	errno = ret;
	return NULL;
}

static struct verbs_device *vrdma_device_alloc(struct verbs_sysfs_dev *sysfs_dev)
{
	struct vrdma_device *dev;

	dev = calloc(1, sizeof(*dev));
	if (!dev)
		return NULL;
	return &dev->ibv_dev;
}

static void vrdma_device_free(struct verbs_device *verbs_dev)
{
	free(container_of(verbs_dev, struct vrdma_device, ibv_dev));
}

static const struct verbs_match_ent vrdma_match_table[] = {
	/* The uverbs device's parent is the virtio device: virtio:d<device id>v<vendor id>. */
	VERBS_MODALIAS_MATCH("virtio:d0000002Av*", NULL),
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
