// SPDX-License-Identifier: GPL-2.0-only
/*
 * Address handles: a destination GID and the source GID index. A user AH is registered with the device; a kernel
 * AH stays in the driver (the kernel creates them where it cannot sleep, as the IB CM does) and its address vector
 * goes into each UD work request.
 */
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <rdma/ib_umem.h>
#include <rdma/uverbs_ioctl.h>

#include "vrdma.h"

int vrdma_create_ah(struct ib_ah *ibah, struct rdma_ah_init_attr *init, struct ib_udata *udata)
{
	struct vrdma_ah *ah = container_of(ibah, struct vrdma_ah, ibah);
	struct vrdma_pd *pd = container_of(ibah->pd, struct vrdma_pd, ibpd);
	const struct ib_global_route *grh = rdma_ah_read_grh(init->ah_attr);
	struct vrdma_cmd_create_ah cmd = { .hdr.opcode = cpu_to_le16(VRDMA_CMD_CREATE_AH),
					   .pd = cpu_to_le32(pd->handle) };
	struct vrdma_resp_create_ah resp;
	int ret;

	if (!(rdma_ah_get_ah_flags(init->ah_attr) & IB_AH_GRH))
		return -EINVAL;  /* RoCE: every address has a GRH */
	if (!udata) {
		memset(&ah->av, 0, sizeof(ah->av));
		memcpy(ah->av.dgid, grh->dgid.raw, sizeof(ah->av.dgid));
		ah->av.sgid_index = grh->sgid_index;
		ah->av.hop_limit = grh->hop_limit;
		ah->av.traffic_class = grh->traffic_class;
		ah->av.flow_label = cpu_to_le32(grh->flow_label);
		ah->handle = 0;
		return 0;
	}
	if (!(init->flags & RDMA_CREATE_AH_SLEEPABLE))
		return -EOPNOTSUPP;  /* creating a user AH is a device command, which sleeps */
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

	if (!ah->handle)
		return 0;  /* a kernel AH: nothing in the device */
	if (!(flags & RDMA_DESTROY_AH_SLEEPABLE))
		return -EOPNOTSUPP;
	return vrdma_destroy_handle(to_vdev(ibah->device), VRDMA_CMD_DESTROY_AH, ah->handle);
}
