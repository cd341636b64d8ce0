// SPDX-License-Identifier: GPL-2.0-only
/*
 * The event dispatcher: events of the device's event queue reach their CQ, QP or SRQ by handle. Objects that
 * receive events sit in per-type xarrays keyed by the device's handle; the handler looks them up and dispatches
 * under the xarray's lock, and destroy erases under that same lock, so no handler runs on an object being destroyed
 * (Xen-IB's event dispatcher by handle).
 */
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <rdma/ib_umem.h>
#include <rdma/uverbs_ioctl.h>

#include "vrdma.h"

/* The object an event names (the caller holds the xarray's lock); an unknown handle is the device's mistake. */
static void *vrdma_event_target(struct vrdma_dev *dev, struct xarray *xa, u32 type, u32 handle, const char *kind)
{
	void *obj = xa_load(xa, handle);

	if (!obj)
		dev_warn_ratelimited(&dev->vdev->dev, "event %u for unknown %s %#x\n", type, kind, handle);
	return obj;
}

static void vrdma_cq_event(struct vrdma_dev *dev, u32 type, u32 handle, u64 data)
{
	struct vrdma_cq *cq = vrdma_event_target(dev, &dev->cqs, type, handle, "CQ");
	struct ib_event ev = { .device = &dev->ib_dev, .event = IB_EVENT_CQ_ERR };

	if (!cq)
		return;
	if (type == VRDMA_EVENT_CQ_COMP) {
		if (cq->ibcq.comp_handler)
			cq->ibcq.comp_handler(&cq->ibcq, cq->ibcq.cq_context);
	} else if (cq->ibcq.event_handler) {
		ev.element.cq = &cq->ibcq;
		cq->ibcq.event_handler(&ev, cq->ibcq.cq_context);
	}
}

static void vrdma_qp_event(struct vrdma_dev *dev, u32 type, u32 handle, u64 data)
{
	static const enum ib_event_type ib_type[] = {
		[VRDMA_EVENT_QP_FATAL] = IB_EVENT_QP_FATAL,
		[VRDMA_EVENT_QP_REQ_ERR] = IB_EVENT_QP_REQ_ERR,
		[VRDMA_EVENT_QP_ACCESS_ERR] = IB_EVENT_QP_ACCESS_ERR,
		[VRDMA_EVENT_QP_LAST_WQE] = IB_EVENT_QP_LAST_WQE_REACHED,
	};
	struct vrdma_qp *qp = vrdma_event_target(dev, &dev->qps, type, handle, "QP");
	struct ib_event ev = { .device = &dev->ib_dev, .event = ib_type[type] };

	if (!qp)
		return;
	if (type != VRDMA_EVENT_QP_LAST_WQE)
		qp->state = IB_QPS_ERR;
	if (qp->ibqp.event_handler) {
		ev.element.qp = &qp->ibqp;
		qp->ibqp.event_handler(&ev, qp->ibqp.qp_context);
	}
}

static void vrdma_srq_event(struct vrdma_dev *dev, u32 type, u32 handle, u64 data)
{
	struct vrdma_srq *srq = vrdma_event_target(dev, &dev->srqs, type, handle, "SRQ");
	struct ib_event ev = { .device = &dev->ib_dev, .event = IB_EVENT_SRQ_LIMIT_REACHED };

	if (!srq)
		return;
	if (srq->ibsrq.event_handler) {
		ev.element.srq = &srq->ibsrq;
		srq->ibsrq.event_handler(&ev, srq->ibsrq.srq_context);
	}
}

static void vrdma_port_event(struct vrdma_dev *dev, u32 type, u32 handle, u64 data)
{
	dev_dbg(&dev->vdev->dev, "port %u active, device epoch %#llx\n", handle, data);
	if (data != dev->epoch)
		vrdma_device_lost(dev, "the device's state was reset (new epoch)");
}

/* One handler per event type; the xarray it looks in is locked around the whole dispatch. */
static const struct {
	void (*handle)(struct vrdma_dev *dev, u32 type, u32 handle, u64 data);
	size_t table;	/* offset of the xarray in struct vrdma_dev, 0: none */
} vrdma_event_table[] = {
	[VRDMA_EVENT_PORT_ACTIVE] = { vrdma_port_event, 0 },
	[VRDMA_EVENT_CQ_COMP] = { vrdma_cq_event, offsetof(struct vrdma_dev, cqs) },
	[VRDMA_EVENT_CQ_ERR] = { vrdma_cq_event, offsetof(struct vrdma_dev, cqs) },
	[VRDMA_EVENT_QP_FATAL] = { vrdma_qp_event, offsetof(struct vrdma_dev, qps) },
	[VRDMA_EVENT_QP_REQ_ERR] = { vrdma_qp_event, offsetof(struct vrdma_dev, qps) },
	[VRDMA_EVENT_QP_ACCESS_ERR] = { vrdma_qp_event, offsetof(struct vrdma_dev, qps) },
	[VRDMA_EVENT_QP_LAST_WQE] = { vrdma_qp_event, offsetof(struct vrdma_dev, qps) },
	[VRDMA_EVENT_SRQ_LIMIT] = { vrdma_srq_event, offsetof(struct vrdma_dev, srqs) },
};

void vrdma_dispatch_event(struct vrdma_dev *dev, const struct vrdma_event *event)
{
	u32 type = le16_to_cpu(event->type), handle = le32_to_cpu(event->handle);
	u64 data = le64_to_cpu(event->data);
	struct xarray *xa;
	unsigned long flags;

	if (type >= ARRAY_SIZE(vrdma_event_table) || !vrdma_event_table[type].handle) {
		dev_warn_ratelimited(&dev->vdev->dev, "unknown event type %u ignored\n", type);
		return;
	}
	if (!vrdma_event_table[type].table) {
		vrdma_event_table[type].handle(dev, type, handle, data);
		return;
	}
	xa = (struct xarray *)((char *)dev + vrdma_event_table[type].table);
	xa_lock_irqsave(xa, flags);
	vrdma_event_table[type].handle(dev, type, handle, data);
	xa_unlock_irqrestore(xa, flags);
}
