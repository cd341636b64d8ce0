// SPDX-License-Identifier: GPL-2.0-only
/*
 * vrdma verbs: the ib_device, tied to the paired virtio-net netdev (RoCE), with device and port queries, the GID
 * table forwarded to the device, user contexts (each with its own doorbell page, mapped into that process only),
 * protection domains and XRC domains. The data-path verbs have a file per object kind (vrdma_mr.c, vrdma_cq.c,
 * vrdma_srq.c, vrdma_qp.c, vrdma_ah.c), events theirs (vrdma_event.c).
 */
#include <linux/etherdevice.h>
#include <linux/netdevice.h>
#include <linux/rtnetlink.h>
#include <net/addrconf.h>
#include <rdma/ib_addr.h>
#include <rdma/ib_mad.h>
#include <rdma/uverbs_ioctl.h>

#include "vrdma.h"

static int vrdma_query_device(struct ib_device *ibdev, struct ib_device_attr *attr, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibdev);
	const struct vrdma_resp_query_device *a = &dev->attr;

	/* the core asks with no udata at registration (7.x), a user with an empty one */
	if (udata && (udata->inlen || udata->outlen))
		return -EINVAL;
	memset(attr, 0, sizeof(*attr));
	attr->fw_ver = le64_to_cpu(a->fw_ver);
	attr->sys_image_guid = cpu_to_be64(le64_to_cpu(a->sys_image_guid));
	attr->max_mr_size = le64_to_cpu(a->max_mr_size);
	attr->page_size_cap = le64_to_cpu(a->page_size_cap);
	attr->vendor_id = le32_to_cpu(a->vendor_id);
	attr->vendor_part_id = le32_to_cpu(a->vendor_part_id);
	attr->hw_ver = le32_to_cpu(a->hw_ver);
	attr->max_qp = le32_to_cpu(a->max_qp);
	attr->max_qp_wr = le32_to_cpu(a->max_qp_wr);
	attr->max_send_sge = le32_to_cpu(a->max_sge);
	attr->max_recv_sge = le32_to_cpu(a->max_sge);
	attr->max_sge_rd = le32_to_cpu(a->max_sge);
	attr->max_cq = le32_to_cpu(a->max_cq);
	attr->max_cqe = le32_to_cpu(a->max_cqe);
	attr->max_mr = le32_to_cpu(a->max_mr);
	attr->max_pd = le32_to_cpu(a->max_pd);
	attr->max_qp_rd_atom = le32_to_cpu(a->max_qp_rd_atom);
	attr->max_qp_init_rd_atom = le32_to_cpu(a->max_qp_init_rd_atom);
	attr->max_srq = le32_to_cpu(a->max_srq);
	attr->max_srq_wr = le32_to_cpu(a->max_srq_wr);
	attr->max_srq_sge = le32_to_cpu(a->max_srq_sge);
	attr->max_ah = le32_to_cpu(a->max_ah);
	attr->max_pkeys = 1;
	attr->kernel_cap_flags = IBK_LOCAL_DMA_LKEY;  /* kernel PDs use it: no DMA MR per PD */
	attr->device_cap_flags = IB_DEVICE_XRC;
	attr->max_fast_reg_page_list_len = le32_to_cpu(a->max_fast_reg_pages);
	if (attr->max_fast_reg_page_list_len)  /* fast registration, local and remote invalidation */
		attr->device_cap_flags |= IB_DEVICE_MEM_MGT_EXTENSIONS;
	/* Windows of type 1 and 2B (bound to the QP that binds them); they share the MRs' key table. */
	attr->device_cap_flags |= IB_DEVICE_MEM_WINDOW | IB_DEVICE_MEM_WINDOW_TYPE_2B;
	attr->max_mw = attr->max_mr;
	attr->atomic_cap = IB_ATOMIC_HCA;	/* the engine does atomics with host atomics: one coherent view */
	attr->local_ca_ack_delay = 15;
	return 0;
}

static int vrdma_query_port(struct ib_device *ibdev, u32 port, struct ib_port_attr *attr)
{
	struct vrdma_dev *dev = to_vdev(ibdev);
	bool up = netif_running(dev->netdev) && netif_carrier_ok(dev->netdev);

	/* The core zeroed attr. State follows the paired netdev, limits come from QUERY_PORT. */
	attr->state = up ? IB_PORT_ACTIVE : IB_PORT_DOWN;
	attr->phys_state = up ? IB_PORT_PHYS_STATE_LINK_UP : IB_PORT_PHYS_STATE_DISABLED;
	attr->max_mtu = IB_MTU_4096;
	attr->active_mtu = iboe_get_mtu(dev->netdev->mtu);
	attr->gid_tbl_len = le32_to_cpu(dev->port.gid_tbl_len);
	attr->port_cap_flags = IB_PORT_CM_SUP;
	attr->max_msg_sz = le32_to_cpu(dev->port.max_msg_sz);
	attr->pkey_tbl_len = 1;
	attr->active_speed = dev->port.active_speed;	/* the device's figure (IB codes), e.g. 4X EDR */
	attr->active_width = dev->port.active_width;
	return 0;
}

static int vrdma_get_port_immutable(struct ib_device *ibdev, u32 port, struct ib_port_immutable *immutable)
{
	struct ib_port_attr attr;
	int ret;

	ret = ib_query_port(ibdev, port, &attr);
	if (ret)
		return ret;
	immutable->pkey_tbl_len = attr.pkey_tbl_len;
	immutable->gid_tbl_len = attr.gid_tbl_len;
	immutable->core_cap_flags = RDMA_CORE_PORT_IBA_ROCE | RDMA_CORE_PORT_IBA_ROCE_UDP_ENCAP;
	immutable->max_mad_size = IB_MGMT_MAD_SIZE;
	return 0;
}

static enum rdma_link_layer vrdma_get_link_layer(struct ib_device *ibdev, u32 port)
{
	return IB_LINK_LAYER_ETHERNET;
}

static int vrdma_query_pkey(struct ib_device *ibdev, u32 port, u16 index, u16 *pkey)
{
	if (index)
		return -EINVAL;
	*pkey = IB_DEFAULT_PKEY_FULL;
	return 0;
}

static int vrdma_add_gid(const struct ib_gid_attr *attr, void **context)
{
	struct vrdma_dev *dev = to_vdev(attr->device);
	struct vrdma_cmd_add_gid cmd = {
		.hdr.opcode = cpu_to_le16(VRDMA_CMD_ADD_GID),
		.index = cpu_to_le32(attr->index),
		.type = cpu_to_le32(attr->gid_type == IB_GID_TYPE_ROCE_UDP_ENCAP ? VRDMA_GID_TYPE_ROCE_V2 :
				    VRDMA_GID_TYPE_ROCE_V1),
	};
	struct vrdma_resp_hdr resp;

	memcpy(cmd.gid, attr->gid.raw, sizeof(cmd.gid));
	return vrdma_cmd_exec(dev, &cmd, sizeof(cmd), &resp, sizeof(resp));
}

static int vrdma_del_gid(const struct ib_gid_attr *attr, void **context)
{
	struct vrdma_dev *dev = to_vdev(attr->device);
	struct vrdma_cmd_del_gid cmd = {
		.hdr.opcode = cpu_to_le16(VRDMA_CMD_DEL_GID),
		.index = cpu_to_le32(attr->index),
	};
	struct vrdma_resp_hdr resp;

	return vrdma_cmd_exec(dev, &cmd, sizeof(cmd), &resp, sizeof(resp));
}

int vrdma_destroy_handle(struct vrdma_dev *dev, u16 opcode, u32 handle)
{
	struct vrdma_cmd_destroy cmd = { .hdr.opcode = cpu_to_le16(opcode), .handle = cpu_to_le32(handle) };
	struct vrdma_resp_hdr resp;

	return vrdma_cmd_exec(dev, &cmd, sizeof(cmd), &resp, sizeof(resp));
}

/*
 * The mmap() offset of the doorbell page holding doorbell index `index`, a page of this context (the device
 * names it in a create response): each page gets one mmap entry, the first time a queue names it, and keeps it
 * until the context goes. The device only names pages it gave this context; the index is checked to be a
 * queue's slot of a user page all the same.
 */
int vrdma_uctx_db_offset(struct vrdma_ucontext *uc, u32 index, u64 *offset)
{
	struct vrdma_dev *dev = to_vdev(uc->ibuc.device);
	u32 page = VRDMA_DB_PAGE(index), slot = VRDMA_DB_SLOT(index);
	struct vrdma_user_mmap_entry *entry;
	struct rdma_user_mmap_entry *found;
	int ret;

	if (page < VRDMA_FIRST_USER_DOORBELL_PAGE || page >= dev->doorbell_pages || slot == VRDMA_DB_SLOT_PARKED ||
	    slot == VRDMA_DB_SLOT_ALIVE) {
		dev_err(&dev->vdev->dev, "device gave user context %#x doorbell index %u (region has %u pages)\n",
			uc->handle, index, dev->doorbell_pages);
		return -EIO;
	}
	found = xa_load(&uc->db_entries, page);
	if (found) {
		*offset = rdma_user_mmap_get_offset(found);
		return 0;
	}
	entry = kzalloc(sizeof(*entry), GFP_KERNEL);
	if (!entry)
		return -ENOMEM;
	entry->address = dev->db_phys + (phys_addr_t)page * PAGE_SIZE;
	ret = rdma_user_mmap_entry_insert(&uc->ibuc, &entry->rdma_entry, PAGE_SIZE);
	if (ret) {
		kfree(entry);
		return ret;
	}
	/* Two queues created at once may both find the page new: the first entry stays, the second goes. */
	found = xa_cmpxchg(&uc->db_entries, page, NULL, &entry->rdma_entry, GFP_KERNEL);
	if (xa_is_err(found)) {
		rdma_user_mmap_entry_remove(&entry->rdma_entry);
		return xa_err(found);
	}
	if (found) {
		rdma_user_mmap_entry_remove(&entry->rdma_entry);
		*offset = rdma_user_mmap_get_offset(found);
		return 0;
	}
	*offset = rdma_user_mmap_get_offset(&entry->rdma_entry);
	return 0;
}

/* A doorbell index of a create response, for the provider: the index and the mmap() offset of its page. */
int vrdma_udata_db(struct ib_udata *udata, __le32 index, __u32 *uindex, __u64 *offset)
{
	struct vrdma_ucontext *uc = rdma_udata_to_drv_context(udata, struct vrdma_ucontext, ibuc);

	*uindex = le32_to_cpu(index);
	return vrdma_uctx_db_offset(uc, *uindex, offset);
}

static void vrdma_uctx_db_entries_remove(struct vrdma_ucontext *uc)
{
	struct rdma_user_mmap_entry *entry;
	unsigned long page;

	xa_for_each(&uc->db_entries, page, entry)
		rdma_user_mmap_entry_remove(entry);
	xa_destroy(&uc->db_entries);
}

static int vrdma_alloc_ucontext(struct ib_ucontext *ibuc, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibuc->device);
	struct vrdma_ucontext *uc = container_of(ibuc, struct vrdma_ucontext, ibuc);
	struct vrdma_cmd_alloc_ucontext cmd = { .hdr.opcode = cpu_to_le16(VRDMA_CMD_ALLOC_UCONTEXT) };
	struct vrdma_resp_alloc_ucontext resp;
	struct vrdma_alloc_ucontext_resp uresp = {};
	int ret;

	if (udata->outlen < sizeof(uresp))
		return -EINVAL;
	ret = vrdma_cmd_exec(dev, &cmd, sizeof(cmd), &resp, sizeof(resp));
	if (ret)
		return ret;
	uc->handle = le32_to_cpu(resp.handle);
	uc->doorbell_page = le32_to_cpu(resp.doorbell_page);
	xa_init(&uc->db_entries);
	/* Its first page is mapped as any other (the device picked it; the offset checks it is a user page). */
	ret = vrdma_uctx_db_offset(uc, uc->doorbell_page * VRDMA_DB_SLOTS + VRDMA_DB_SLOT_PARKED + 1,
				   &uresp.doorbell_offset);
	if (ret)
		goto err_dealloc;
	uresp.doorbell_page = uc->doorbell_page;
	uresp.doorbell_page_size = PAGE_SIZE;
	uresp.doorbell_pages = dev->doorbell_pages;
	ret = ib_copy_to_udata(udata, &uresp, sizeof(uresp));
	if (ret)
		goto err_entries;
	return 0;

err_entries:
	vrdma_uctx_db_entries_remove(uc);
err_dealloc:
	vrdma_destroy_handle(dev, VRDMA_CMD_DEALLOC_UCONTEXT, uc->handle);
	return ret;
}

static void vrdma_dealloc_ucontext(struct ib_ucontext *ibuc)
{
	struct vrdma_ucontext *uc = container_of(ibuc, struct vrdma_ucontext, ibuc);

	vrdma_uctx_db_entries_remove(uc);
	vrdma_destroy_handle(to_vdev(ibuc->device), VRDMA_CMD_DEALLOC_UCONTEXT, uc->handle);
}

static int vrdma_mmap(struct ib_ucontext *ibuc, struct vm_area_struct *vma)
{
	struct rdma_user_mmap_entry *rdma_entry;
	struct vrdma_user_mmap_entry *entry;
	int ret;

	/* Only entries of this very context are found: another process's doorbell page cannot be mapped. */
	rdma_entry = rdma_user_mmap_entry_get(ibuc, vma);
	if (!rdma_entry)
		return -EINVAL;
	entry = container_of(rdma_entry, struct vrdma_user_mmap_entry, rdma_entry);
	ret = rdma_user_mmap_io(ibuc, vma, PHYS_PFN(entry->address), PAGE_SIZE,
				pgprot_noncached(vma->vm_page_prot), rdma_entry);
	rdma_user_mmap_entry_put(rdma_entry);
	return ret;
}

/*
 * The RDMA core detaches user contexts from a device that goes away (device loss: vrdma_recover) without waiting
 * for their processes: it replaces their doorbell mappings by a zero page itself. Nothing else maps device memory.
 */
static void vrdma_disassociate_ucontext(struct ib_ucontext *ibuc)
{
}

static void vrdma_mmap_free(struct rdma_user_mmap_entry *rdma_entry)
{
	kfree(container_of(rdma_entry, struct vrdma_user_mmap_entry, rdma_entry));
}

static int vrdma_alloc_pd(struct ib_pd *ibpd, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibpd->device);
	struct vrdma_pd *pd = container_of(ibpd, struct vrdma_pd, ibpd);
	struct vrdma_ucontext *uc = rdma_udata_to_drv_context(udata, struct vrdma_ucontext, ibuc);
	struct vrdma_cmd_alloc_pd cmd = {
		.hdr.opcode = cpu_to_le16(VRDMA_CMD_ALLOC_PD),
		.ucontext = cpu_to_le32(uc ? uc->handle : 0),
	};
	struct vrdma_resp_alloc_pd resp;
	struct vrdma_alloc_pd_resp uresp = {};
	int ret;

	if (udata && udata->outlen < sizeof(uresp))
		return -EINVAL;
	ret = vrdma_cmd_exec(dev, &cmd, sizeof(cmd), &resp, sizeof(resp));
	if (ret)
		return ret;
	pd->handle = le32_to_cpu(resp.handle);
	if (udata) {
		uresp.pdn = pd->handle;
		ret = ib_copy_to_udata(udata, &uresp, sizeof(uresp));
		if (ret) {
			vrdma_destroy_handle(dev, VRDMA_CMD_DEALLOC_PD, pd->handle);
			return ret;
		}
	}
	return 0;
}

static int vrdma_dealloc_pd(struct ib_pd *ibpd, struct ib_udata *udata)
{
	struct vrdma_pd *pd = container_of(ibpd, struct vrdma_pd, ibpd);

	return vrdma_destroy_handle(to_vdev(ibpd->device), VRDMA_CMD_DEALLOC_PD, pd->handle);
}

static int vrdma_alloc_xrcd(struct ib_xrcd *ibxrcd, struct ib_udata *udata)
{
	struct vrdma_xrcd *xrcd = container_of(ibxrcd, struct vrdma_xrcd, ibxrcd);
	struct vrdma_cmd_alloc_xrcd cmd = { .hdr.opcode = cpu_to_le16(VRDMA_CMD_ALLOC_XRCD) };
	struct vrdma_resp_alloc_xrcd resp;
	int ret;

	ret = vrdma_cmd_exec(to_vdev(ibxrcd->device), &cmd, sizeof(cmd), &resp, sizeof(resp));
	if (ret)
		return ret;
	xrcd->handle = le32_to_cpu(resp.handle);
	return 0;
}

static int vrdma_dealloc_xrcd(struct ib_xrcd *ibxrcd, struct ib_udata *udata)
{
	struct vrdma_xrcd *xrcd = container_of(ibxrcd, struct vrdma_xrcd, ibxrcd);

	return vrdma_destroy_handle(to_vdev(ibxrcd->device), VRDMA_CMD_DEALLOC_XRCD, xrcd->handle);
}

static const struct ib_device_ops vrdma_dev_ops = {
	.owner = THIS_MODULE,
	.driver_id = RDMA_DRIVER_UNKNOWN,
	.uverbs_abi_ver = VRDMA_UVERBS_ABI_VERSION,

	.add_gid = vrdma_add_gid,
	.alloc_hw_port_stats = vrdma_alloc_hw_port_stats,
	.alloc_mr = vrdma_alloc_mr,
	.alloc_mw = vrdma_alloc_mw,
	.alloc_pd = vrdma_alloc_pd,
	.alloc_ucontext = vrdma_alloc_ucontext,
	.alloc_xrcd = vrdma_alloc_xrcd,
	.create_ah = vrdma_create_ah,
	.create_cq = vrdma_ib_create_cq,
	.create_qp = vrdma_create_qp,
	.create_srq = vrdma_create_srq,
	.counter_alloc_stats = vrdma_counter_alloc_stats,
	.counter_bind_qp = vrdma_ib_counter_bind_qp,
	.counter_dealloc = vrdma_counter_dealloc,
	.counter_unbind_qp = vrdma_ib_counter_unbind_qp,
	.counter_update_stats = vrdma_counter_update_stats,
	.create_user_ah = vrdma_create_ah,
	.dealloc_mw = vrdma_dealloc_mw,
	.dealloc_pd = vrdma_dealloc_pd,
	.dealloc_ucontext = vrdma_dealloc_ucontext,
	.dealloc_xrcd = vrdma_dealloc_xrcd,
	.del_gid = vrdma_del_gid,
	.dereg_mr = vrdma_dereg_mr,
	.destroy_ah = vrdma_destroy_ah,
	.destroy_cq = vrdma_destroy_cq,
	.destroy_qp = vrdma_destroy_qp,
	.destroy_srq = vrdma_destroy_srq,
	.disassociate_ucontext = vrdma_disassociate_ucontext,
	.get_dma_mr = vrdma_get_dma_mr,
	.get_hw_stats = vrdma_get_hw_stats,
	.get_link_layer = vrdma_get_link_layer,
	.get_port_immutable = vrdma_get_port_immutable,
	.map_mr_sg = vrdma_map_mr_sg,
	.mmap = vrdma_mmap,
	.mmap_free = vrdma_mmap_free,
	.modify_cq = vrdma_modify_cq,
	.modify_qp = vrdma_modify_qp,
	.modify_srq = vrdma_modify_srq,
	.poll_cq = vrdma_poll_cq,
	.post_recv = vrdma_post_recv,
	.post_send = vrdma_post_send,
	.post_srq_recv = vrdma_post_srq_recv,
	.process_mad = vrdma_process_mad,
	.query_device = vrdma_query_device,
	.query_pkey = vrdma_query_pkey,
	.query_port = vrdma_query_port,
	.query_qp = vrdma_query_qp,
	.query_srq = vrdma_query_srq,
	.reg_user_mr = vrdma_ib_reg_user_mr,
	.rereg_user_mr = vrdma_rereg_user_mr,
	.req_notify_cq = vrdma_req_notify_cq,

	INIT_RDMA_OBJ_SIZE(ib_ah, vrdma_ah, ibah),
	INIT_RDMA_OBJ_SIZE(ib_cq, vrdma_cq, ibcq),
	INIT_RDMA_OBJ_SIZE(ib_mw, vrdma_mw, ibmw),
	INIT_RDMA_OBJ_SIZE(ib_pd, vrdma_pd, ibpd),
	INIT_RDMA_OBJ_SIZE(ib_qp, vrdma_qp, ibqp),
	INIT_RDMA_OBJ_SIZE(ib_srq, vrdma_srq, ibsrq),
	INIT_RDMA_OBJ_SIZE(ib_ucontext, vrdma_ucontext, ibuc),
	INIT_RDMA_OBJ_SIZE(ib_xrcd, vrdma_xrcd, ibxrcd),
};

static struct net_device *vrdma_find_netdev(const u8 *mac)
{
	struct net_device *ndev, *found = NULL;

	rtnl_lock();
	for_each_netdev(&init_net, ndev) {
		if (ether_addr_equal(ndev->dev_addr, mac)) {
			dev_hold(ndev);
			found = ndev;
			break;
		}
	}
	rtnl_unlock();
	return found;
}

int vrdma_register_ib(struct vrdma_dev *dev)
{
	struct ib_device *ibdev = &dev->ib_dev;
	int ret;

	dev->netdev = vrdma_find_netdev(dev->mac);
	if (!dev->netdev) {
		dev_err(&dev->vdev->dev, "no netdev with MAC %pM to pair with (load virtio_net first)\n", dev->mac);
		return -ENODEV;
	}
	ibdev->node_type = RDMA_NODE_IB_CA;
	ibdev->phys_port_cnt = 1;
	ibdev->num_comp_vectors = 1;
	/* The one legacy data-path command libvrdma sends: an empty POST_SEND wakes a parked device engine. */
	ibdev->uverbs_cmd_mask |= BIT_ULL(IB_USER_VERBS_CMD_POST_SEND);
	ibdev->dev.parent = &dev->vdev->dev;
	ibdev->local_dma_lkey = VRDMA_LOCAL_DMA_LKEY;
	addrconf_addr_eui48((u8 *)&ibdev->node_guid, dev->mac);
	strscpy(ibdev->node_desc, "vrdma", sizeof(ibdev->node_desc));
	ib_set_device_ops(ibdev, &vrdma_dev_ops);
	ret = ib_device_set_netdev(ibdev, dev->netdev, 1);
	if (ret)
		goto err_netdev;
	ret = ib_register_device(ibdev, "vrdma%d", dev->vdev->dev.parent);
	if (ret)
		goto err_netdev;
	dev->registered = true;
	dev_info(&dev->vdev->dev, "registered %s on %s\n", dev_name(&ibdev->dev), netdev_name(dev->netdev));
	return 0;

err_netdev:
	dev_put(dev->netdev);
	dev->netdev = NULL;
	return ret;
}

void vrdma_unregister_ib(struct vrdma_dev *dev)
{
	if (dev->registered)
		ib_unregister_device(&dev->ib_dev);
	dev->registered = false;
	if (dev->netdev)
		dev_put(dev->netdev);
	dev->netdev = NULL;
}
