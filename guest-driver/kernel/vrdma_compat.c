// SPDX-License-Identifier: GPL-2.0-only
/*
 * The adapters vrdma_compat.h declares: the running kernel's signatures on one side, the driver's own functions,
 * written once, on the other.
 */
#include <rdma/uverbs_ioctl.h>

#include "vrdma.h"

int vrdma_find_vqs(struct virtio_device *vdev, unsigned int nvqs, struct virtqueue *vqs[],
		   struct virtqueue_info vqs_info[])
{
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 11, 0)
	return virtio_find_vqs(vdev, nvqs, vqs, vqs_info, NULL);
#else
	vq_callback_t *callbacks[VRDMA_NUM_QUEUES];
	const char *names[VRDMA_NUM_QUEUES];
	unsigned int i;

	if (nvqs > VRDMA_NUM_QUEUES)
		return -EINVAL;
	for (i = 0; i < nvqs; i++) {
		callbacks[i] = vqs_info[i].callback;
		names[i] = vqs_info[i].name;
	}
	return virtio_find_vqs(vdev, nvqs, vqs, callbacks, names, NULL);
#endif
}

#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 11, 0)
int vrdma_ib_create_cq(struct ib_cq *ibcq, const struct ib_cq_init_attr *attr, struct uverbs_attr_bundle *attrs)
{
	return vrdma_create_cq(ibcq, attr, attrs ? &attrs->driver_udata : NULL);
}
#else
int vrdma_ib_create_cq(struct ib_cq *ibcq, const struct ib_cq_init_attr *attr, struct ib_udata *udata)
{
	return vrdma_create_cq(ibcq, attr, udata);
}
#endif

#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 13, 0)
int vrdma_ib_counter_bind_qp(struct rdma_counter *counter, struct ib_qp *ibqp, u32 port)
{
	return vrdma_counter_bind_qp(counter, ibqp);
}

int vrdma_ib_counter_unbind_qp(struct ib_qp *ibqp, u32 port)
{
	return vrdma_counter_unbind_qp(ibqp);
}
#else
int vrdma_ib_counter_bind_qp(struct rdma_counter *counter, struct ib_qp *ibqp)
{
	return vrdma_counter_bind_qp(counter, ibqp);
}

int vrdma_ib_counter_unbind_qp(struct ib_qp *ibqp)
{
	return vrdma_counter_unbind_qp(ibqp);
}
#endif

#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 17, 0)
struct ib_mr *vrdma_ib_reg_user_mr(struct ib_pd *ibpd, u64 start, u64 length, u64 virt, int access,
				   struct ib_dmah *dmah, struct ib_udata *udata)
{
	if (dmah)
		return ERR_PTR(-EOPNOTSUPP);
	return vrdma_reg_user_mr(ibpd, start, length, virt, access, udata);
}
#else
struct ib_mr *vrdma_ib_reg_user_mr(struct ib_pd *ibpd, u64 start, u64 length, u64 virt, int access,
				   struct ib_udata *udata)
{
	return vrdma_reg_user_mr(ibpd, start, length, virt, access, udata);
}
#endif
