// SPDX-License-Identifier: GPL-2.0-only
/*
 * vrdma: paravirtual RDMA device driver (virtio device ID 42).
 *
 * Binds the virtio device, checks its ABI version, pairs it with its ivshmem doorbell region, sets up the control
 * and event virtqueues, queries the device and registers the ib_device (vrdma_verbs.c).
 */
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/workqueue.h>
#include <linux/virtio_config.h>
#include <linux/virtio_ids.h>

#include "vrdma.h"

static void vrdma_post_event_buffer(struct vrdma_dev *dev, struct vrdma_event *event)
{
	struct scatterlist sg;

	sg_init_one(&sg, event, sizeof(*event));
	if (virtqueue_add_inbuf(dev->event_vq, &sg, 1, event, GFP_ATOMIC))
		dev_warn(&dev->vdev->dev, "cannot repost an event buffer\n");
}

static void vrdma_event_done(struct virtqueue *vq)
{
	struct vrdma_dev *dev = vq->vdev->priv;
	struct vrdma_event *event;
	unsigned long flags;
	unsigned int len;

	spin_lock_irqsave(&dev->event_lock, flags);
	while ((event = virtqueue_get_buf(vq, &len))) {
		/* Only buffers this driver posted are accepted back. */
		if (event < dev->events || event >= dev->events + VRDMA_EVENT_BUFFERS ||
		    ((uintptr_t)event - (uintptr_t)dev->events) % sizeof(*event)) {
			dev_err(&dev->vdev->dev, "event queue returned a foreign buffer\n");
			continue;
		}
		if (len == sizeof(*event))
			vrdma_dispatch_event(dev, event);
		else if (len)
			dev_warn(&dev->vdev->dev, "event of %u bytes ignored (expected %zu)\n", len, sizeof(*event));
		vrdma_post_event_buffer(dev, event);
	}
	virtqueue_kick(vq);
	spin_unlock_irqrestore(&dev->event_lock, flags);
}

/*
 * Device loss and recovery. The device forgot every object this driver created (its backend restarted, or its
 * vhost-user connection was re-established, which the device epoch reveals; or it stopped answering commands).
 * Every handle held is stale, so the driver starts over as if the device had been unplugged and plugged back:
 * a work item reports IB_EVENT_DEVICE_FATAL and reprobes the virtio device. remove() unregisters the ib_device,
 * which disassociates user contexts (their doorbell mappings become a zero page, their processes get
 * IBV_EVENT_DEVICE_FATAL and EIO from further verbs, libvrdma flushes their outstanding work) without waiting for
 * them to exit; probe() registers a fresh vrdma device. Meanwhile commands fail at once (vrdma_cmd.c), and the
 * commands that only release an object succeed locally: the device has already forgotten it.
 */
struct vrdma_recovery {
	struct work_struct work;
	struct device *dev;	/* the virtio device, referenced until the work ran */
	ktime_t lost_at;
};

static void vrdma_recover(struct work_struct *work)
{
	struct vrdma_recovery *rec = container_of(work, struct vrdma_recovery, work);
	struct virtio_device *vdev = dev_to_virtio(rec->dev);
	struct vrdma_dev *dev;
	int ret;

	device_lock(rec->dev);
	dev = vdev->priv;
	if (dev) {
		/*
		 * Stop the device before anyone is told: once reset it no longer reads or writes the kernel's rings, so
		 * the driver can complete what they hold (flushed) without racing a device that might still be alive
		 * (a command timeout). The kernel's RDMA users then see their work end before they tear down.
		 */
		down_write(&dev->cmd_rwsem);  /* every command in flight has given up (vrdma_cmd_wake_all) */
		virtio_reset_device(vdev);
		WRITE_ONCE(dev->quiesced, true);
		up_write(&dev->cmd_rwsem);
		schedule_work(&dev->kflush_work);
	}
	if (dev && dev->registered) {
		struct ib_event ev = { .device = &dev->ib_dev, .event = IB_EVENT_DEVICE_FATAL,
				       .element.port_num = 1 };

		ib_dispatch_event(&ev);
	}
	device_unlock(rec->dev);
	ret = device_reprobe(rec->dev);
	if (ret)
		dev_err(rec->dev, "probing the device again failed: %d\n", ret);
	else
		dev_info(rec->dev, "device recovered in %lld ms\n", ktime_ms_delta(ktime_get(), rec->lost_at));
	put_device(rec->dev);
	kfree(rec);
}

/* Any context, once per device life: the work item does the rest. */
void vrdma_device_lost(struct vrdma_dev *dev, const char *why)
{
	struct vrdma_recovery *rec;

	if (xchg(&dev->lost, true))
		return;
	dev_err(&dev->vdev->dev, "device lost: %s; reporting it fatal and probing again\n", why);
	vrdma_cmd_wake_all(dev);	/* a command waiting for the old device gives up now */
	rec = kzalloc(sizeof(*rec), GFP_ATOMIC);
	if (!rec) {
		dev_err(&dev->vdev->dev, "no memory to recover: unbind and bind the driver by hand\n");
		return;
	}
	INIT_WORK(&rec->work, vrdma_recover);
	rec->dev = get_device(&dev->vdev->dev);
	rec->lost_at = ktime_get();
	schedule_work(&rec->work);
}

static int vrdma_read_config(struct vrdma_dev *dev)
{
	struct virtio_device *vdev = dev->vdev;

	dev->abi_version = virtio_cread32(vdev, offsetof(struct vrdma_config, abi_version));
	if (dev->abi_version != VRDMA_ABI_VERSION) {
		dev_err(&vdev->dev, "device ABI version %u, driver speaks %u\n", dev->abi_version,
			VRDMA_ABI_VERSION);
		return -EINVAL;
	}
	dev->pairing_id = virtio_cread64(vdev, offsetof(struct vrdma_config, pairing_id));
	dev->epoch = virtio_cread64(vdev, offsetof(struct vrdma_config, device_epoch));
	dev->doorbell_pages = virtio_cread32(vdev, offsetof(struct vrdma_config, doorbell_pages));
	virtio_cread_bytes(vdev, offsetof(struct vrdma_config, mac), dev->mac, sizeof(dev->mac));
	if (dev->doorbell_pages < 2 || dev->doorbell_pages > 65536) {
		dev_err(&vdev->dev, "implausible doorbell region of %u pages\n", dev->doorbell_pages);
		return -EINVAL;
	}
	return 0;
}

static int vrdma_query(struct vrdma_dev *dev)
{
	struct vrdma_cmd_query_device qd = { .hdr.opcode = cpu_to_le16(VRDMA_CMD_QUERY_DEVICE) };
	struct vrdma_cmd_query_port qp = { .hdr.opcode = cpu_to_le16(VRDMA_CMD_QUERY_PORT), .port = 1 };
	int ret;

	ret = vrdma_cmd_exec(dev, &qd, sizeof(qd), &dev->attr, sizeof(dev->attr));
	if (ret) {
		dev_err(&dev->vdev->dev, "QUERY_DEVICE failed: %d\n", ret);
		return ret;
	}
	ret = vrdma_cmd_exec(dev, &qp, sizeof(qp), &dev->port, sizeof(dev->port));
	if (ret) {
		dev_err(&dev->vdev->dev, "QUERY_PORT failed: %d\n", ret);
		return ret;
	}
	dev_info(&dev->vdev->dev, "vrdma device: max_qp %u max_cq %u max_mr %u max_pd %u, port state %u, MAC %pM\n",
		 le32_to_cpu(dev->attr.max_qp), le32_to_cpu(dev->attr.max_cq), le32_to_cpu(dev->attr.max_mr),
		 le32_to_cpu(dev->attr.max_pd), le32_to_cpu(dev->port.state), dev->mac);
	return 0;
}

/*
 * Whether this CPU's memory fences may not order a doorbell store before the read of the parked slot as the device
 * sees them: under QEMU's TCG (its CPUID signature) a guest fence becomes a host barrier only when QEMU runs vCPUs in
 * parallel, which the guest cannot tell. Elsewhere (KVM, bare metal) they are real. Off x86 there is no signature to
 * read, and a missed wake-up would hang a consumer where the recheck costs the host little: ask.
 */
static bool vrdma_fences_may_be_dropped(void)
{
#ifdef CONFIG_X86
	u32 max_leaf, signature[3];

	cpuid(0x40000000, &max_leaf, &signature[0], &signature[1], &signature[2]);
	return !memcmp(signature, "TCGTCGTCGTCG", sizeof(signature));
#else
	return true;
#endif
}

/* Before the features are final: ask for the doorbell recheck only where fences may be dropped (the spec's SHOULD). */
static int vrdma_validate(struct virtio_device *vdev)
{
	if (vrdma_fences_may_be_dropped())
		dev_info(&vdev->dev, "memory fences may be emulated away here: asking the device to recheck doorbells\n");
	else
		__virtio_clear_bit(vdev, VRDMA_F_DOORBELL_RECHECK);
	return 0;
}

static int vrdma_probe(struct virtio_device *vdev)
{
	struct virtqueue_info vqs_info[VRDMA_NUM_QUEUES] = {
		[VRDMA_QUEUE_CONTROL] = { .name = "control", .callback = vrdma_cmd_vq_done },
		[VRDMA_QUEUE_EVENT] = { .name = "event", .callback = vrdma_event_done },
		[VRDMA_QUEUE_WAKE] = { .name = "wake" },
	};
	struct virtqueue *vqs[VRDMA_NUM_QUEUES];
	struct vrdma_dev *dev;
	int i, ret;

	dev = ib_alloc_device(vrdma_dev, ib_dev);
	if (!dev)
		return -ENOMEM;
	dev->vdev = vdev;
	vdev->priv = dev;
	spin_lock_init(&dev->event_lock);
	xa_init_flags(&dev->cqs, XA_FLAGS_LOCK_IRQ);
	xa_init_flags(&dev->qps, XA_FLAGS_LOCK_IRQ);
	xa_init_flags(&dev->srqs, XA_FLAGS_LOCK_IRQ);
	xa_init_flags(&dev->kqps, XA_FLAGS_LOCK_IRQ);
	INIT_WORK(&dev->kflush_work, vrdma_kflush);
	mutex_init(&dev->counters_lock);
	INIT_LIST_HEAD(&dev->counters);
	ida_init(&dev->counter_ids);

	ret = vrdma_read_config(dev);
	if (ret)
		goto err_free;
	ret = vrdma_cmd_init(dev);
	if (ret)
		goto err_free;
	dev->events = kcalloc(VRDMA_EVENT_BUFFERS, sizeof(*dev->events), GFP_KERNEL);
	if (!dev->events) {
		ret = -ENOMEM;
		goto err_cmd;
	}
	ret = vrdma_doorbell_pair(dev);
	if (ret)
		goto err_events;
	ret = vrdma_find_vqs(vdev, VRDMA_NUM_QUEUES, vqs, vqs_info);
	if (ret)
		goto err_doorbell;
	dev->ctrl_vq = vqs[VRDMA_QUEUE_CONTROL];
	dev->event_vq = vqs[VRDMA_QUEUE_EVENT];
	dev->wake_vq = vqs[VRDMA_QUEUE_WAKE];

	virtio_device_ready(vdev);
	spin_lock_irq(&dev->event_lock);
	for (i = 0; i < VRDMA_EVENT_BUFFERS; i++)
		vrdma_post_event_buffer(dev, &dev->events[i]);
	virtqueue_kick(dev->event_vq);
	spin_unlock_irq(&dev->event_lock);

	ret = vrdma_query(dev);
	if (ret)
		goto err_reset;
	ret = vrdma_register_ib(dev);
	if (ret)
		goto err_reset;
	return 0;

err_reset:
	virtio_reset_device(vdev);
	vdev->config->del_vqs(vdev);
err_doorbell:
	vrdma_doorbell_unpair(dev);
err_events:
	kfree(dev->events);
err_cmd:
	vrdma_cmd_fini(dev);
err_free:
	vdev->priv = NULL;
	ib_dealloc_device(&dev->ib_dev);
	return ret;
}

static void vrdma_remove(struct virtio_device *vdev)
{
	struct vrdma_dev *dev = vdev->priv;

	/* Unregistering frees every verbs object through the device, so the queues must still run. */
	vrdma_unregister_ib(dev);
	cancel_work_sync(&dev->kflush_work);  /* no kernel CQ is left for it */
	virtio_reset_device(vdev);
	vdev->config->del_vqs(vdev);
	vrdma_doorbell_unpair(dev);
	kfree(dev->events);
	vrdma_cmd_fini(dev);
	ida_destroy(&dev->counter_ids);
	ib_dealloc_device(&dev->ib_dev);
}

static const struct virtio_device_id vrdma_id_table[] = {
	{ VRDMA_VIRTIO_ID, VIRTIO_DEV_ANY_ID },
	{ 0 },
};
MODULE_DEVICE_TABLE(virtio, vrdma_id_table);

static unsigned int vrdma_features[] = {
	VRDMA_F_DOORBELL_RECHECK,
};

static struct virtio_driver vrdma_driver = {
	.driver.name = KBUILD_MODNAME,
	.driver.owner = THIS_MODULE,
	.feature_table = vrdma_features,
	.feature_table_size = ARRAY_SIZE(vrdma_features),
	.id_table = vrdma_id_table,
	.validate = vrdma_validate,
	.probe = vrdma_probe,
	.remove = vrdma_remove,
};
module_virtio_driver(vrdma_driver);

MODULE_DESCRIPTION("vrdma paravirtual RDMA device driver");
MODULE_LICENSE("GPL");
