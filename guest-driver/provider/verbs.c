// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/* Device and port queries, protection domains, memory regions, address handles, and the page-aligned ring buffers. */
#include "ring.h"

uint32_t pow2_at_least(uint32_t value, uint32_t minimum)
{
	uint32_t result = minimum;

	while (result < value && result < (1u << 30))
		result <<= 1;
	return result;
}

size_t page_align(size_t size)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);

	return (size + page - 1) & ~(page - 1);
}

int buf_alloc(struct vrdma_context *ctx, struct vrdma_buf *buf, size_t size)
{
	if (ctx->chan)
		return vrdma_chan_buf_alloc(ctx->chan, buf, size);
	buf->size = page_align(size);
	if (posix_memalign(&buf->addr, (size_t)sysconf(_SC_PAGESIZE), buf->size))
		return ENOMEM;
	memset(buf->addr, 0, buf->size);
	if (ibv_dontfork_range(buf->addr, buf->size)) {
		free(buf->addr);
		buf->addr = NULL;
		return ENOMEM;
	}
	return 0;
}

void buf_free(struct vrdma_buf *buf)
{
	if (!buf->addr)
		return;
	if (buf->chan) {
		vrdma_chan_buf_free(buf);
		return;
	}
	ibv_dofork_range(buf->addr, buf->size);
	free(buf->addr);
	buf->addr = NULL;
}

int vrdma_query_device_ex(struct ibv_context *context, const struct ibv_query_device_ex_input *input,
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

int vrdma_query_port(struct ibv_context *context, uint8_t port, struct ibv_port_attr *attr)
{
	struct ibv_query_port cmd;

	return ibv_cmd_query_port(context, port, attr, &cmd, sizeof(cmd));
}

struct ibv_pd *vrdma_alloc_pd(struct ibv_context *context)
{
	struct uvrdma_alloc_pd cmd = {};
	struct uvrdma_alloc_pd_resp resp = {};
	struct vrdma_pd *pd;
	int ret;

	pd = calloc(1, sizeof(*pd));
	if (!pd)
		return vrdma_abandon(NULL, NULL, ENOMEM);
	ret = ibv_cmd_alloc_pd(context, &pd->ibv_pd, &cmd.ibv_cmd, sizeof(cmd), &resp.ibv_resp, sizeof(resp));
	if (ret)
		return vrdma_abandon(NULL, pd, ret);
	pd->pdn = resp.pdn;
	return &pd->ibv_pd;
}

int vrdma_dealloc_pd(struct ibv_pd *ibpd)
{
	int ret;

	ret = ibv_cmd_dealloc_pd(ibpd);
	if (ret)
		return ret;
	free(to_vpd(ibpd));
	return 0;
}


/* -- memory regions --------------------------------------------------------------------------------------------- */

/* An XRC domain, as the kernel shares it between the processes that open the same file (or private, with none). */
struct ibv_xrcd *vrdma_open_xrcd(struct ibv_context *context, struct ibv_xrcd_init_attr *attr)
{
	struct verbs_xrcd *xrcd = calloc(1, sizeof(*xrcd));
	struct ibv_open_xrcd cmd = {};
	struct ib_uverbs_open_xrcd_resp resp = {};
	int ret;

	if (!xrcd)
		return vrdma_abandon(NULL, NULL, ENOMEM);
	ret = ibv_cmd_open_xrcd(context, xrcd, sizeof(*xrcd), attr, &cmd, sizeof(cmd), &resp, sizeof(resp));
	if (ret)
		return vrdma_abandon(NULL, xrcd, ret);
	return &xrcd->xrcd;
}

int vrdma_close_xrcd(struct ibv_xrcd *ibxrcd)
{
	struct verbs_xrcd *xrcd = container_of(ibxrcd, struct verbs_xrcd, xrcd);
	int ret = ibv_cmd_close_xrcd(xrcd);

	if (ret)
		return ret;
	free(xrcd);
	return 0;
}

struct ibv_mr *vrdma_reg_mr(struct ibv_pd *pd, void *addr, size_t length, uint64_t hca_va, int access)
{
	struct ibv_reg_mr cmd;
	struct ib_uverbs_reg_mr_resp resp;
	struct verbs_mr *vmr;
	int ret;

	vmr = calloc(1, sizeof(*vmr));
	if (!vmr)
		return vrdma_abandon(NULL, NULL, ENOMEM);
	ret = ibv_cmd_reg_mr(pd, addr, length, hca_va, access, vmr, &cmd, sizeof(cmd), &resp, sizeof(resp));
	if (ret)
		return vrdma_abandon(NULL, vmr, ret);
	return &vmr->ibv_mr;
}

int vrdma_dereg_mr(struct verbs_mr *vmr)
{
	int ret = ibv_cmd_dereg_mr(vmr);

	if (ret)
		return ret;
	free(vmr);
	return 0;
}

/* The kernel and the device change the MR in place: handle and keys stay (libibverbs updates the ibv_mr). */
int vrdma_rereg_mr(struct verbs_mr *vmr, int flags, struct ibv_pd *pd, void *addr, size_t length, int access)
{
	struct ibv_rereg_mr cmd;
	struct ib_uverbs_rereg_mr_resp resp;

	return ibv_cmd_rereg_mr(vmr, (uint32_t)flags, addr, length, (uintptr_t)addr, access, pd, &cmd, sizeof(cmd),
				&resp, sizeof(resp));
}

/* -- memory windows: the device's keys; BIND_MW work requests (qp.c) bind them ------------------------------------ */

struct ibv_mw *vrdma_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type)
{
	struct ibv_alloc_mw cmd;
	struct ib_uverbs_alloc_mw_resp resp;
	struct ibv_mw *mw;
	int ret;

	mw = calloc(1, sizeof(*mw));
	if (!mw)
		return vrdma_abandon(NULL, NULL, ENOMEM);
	ret = ibv_cmd_alloc_mw(pd, type, mw, &cmd, sizeof(cmd), &resp, sizeof(resp));
	if (ret)
		return vrdma_abandon(NULL, mw, ret);
	return mw;
}

int vrdma_dealloc_mw(struct ibv_mw *mw)
{
	int ret = ibv_cmd_dealloc_mw(mw);

	if (ret)
		return ret;
	free(mw);
	return 0;
}

/* -- address handles -------------------------------------------------------------------------------------------- */

/* An AH and what a UD send to it carries in its WQE, before the device (or the kernel) is told of it. */
static struct vrdma_ah *vrdma_ah_new(const struct ibv_ah_attr *attr)
{
	struct vrdma_ah *ah;

	if (!attr->is_global)
		return vrdma_abandon(NULL, NULL, EINVAL);  /* RoCE: every address has a GRH */
	ah = calloc(1, sizeof(*ah));
	if (!ah)
		return vrdma_abandon(NULL, NULL, ENOMEM);
	memcpy(ah->av.dgid, attr->grh.dgid.raw, sizeof(ah->av.dgid));
	ah->av.sgid_index = attr->grh.sgid_index;
	ah->av.hop_limit = attr->grh.hop_limit;
	ah->av.traffic_class = attr->grh.traffic_class;
	ah->av.flow_label = htole32(attr->grh.flow_label);
	return ah;
}

/* The device is told of an AH through the kernel, or a container's channel. */
struct ibv_ah *vrdma_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
	struct vrdma_context *ctx = to_vctx(pd->context);
	struct ib_uverbs_create_ah_resp resp;
	struct vrdma_ah *ah;
	int ret;

	ah = vrdma_ah_new(attr);
	if (!ah)
		return NULL;
	ret = ctx->chan ? vrdma_chan_create_ah(ctx, pd, attr, ah) :
			  ibv_cmd_create_ah(pd, &ah->ibv_ah, attr, &resp, sizeof(resp));
	if (ret)
		return vrdma_abandon(NULL, ah, ret);
	return &ah->ibv_ah;
}

int vrdma_destroy_ah(struct ibv_ah *ibah)
{
	struct vrdma_context *ctx = to_vctx(ibah->context);
	int ret = ctx->chan ? vrdma_chan_destroy(ctx, VRDMA_CMD_DESTROY_AH, ibah->handle) : ibv_cmd_destroy_ah(ibah);

	if (ret)
		return ret;
	free(container_of(ibah, struct vrdma_ah, ibv_ah));
	return 0;
}

/* A create that failed: the object's ring buffer (if it has one) and the object (if any) go; errno says why. */
void *vrdma_abandon(struct vrdma_buf *buf, void *obj, int err)
{
	if (buf)
		buf_free(buf);
	free(obj);
	errno = err;
	return NULL;
}
