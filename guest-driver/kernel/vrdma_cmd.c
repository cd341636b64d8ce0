// SPDX-License-Identifier: GPL-2.0-only
/*
 * vrdma command channel over the control virtqueue.
 *
 * Small and strict: up to VRDMA_CMD_SLOTS commands in flight, each with a buffer of its own (its slot), request and
 * response sizes fixed by the ABI, a timeout, and every device-supplied value (used length, opcode, sequence
 * number, status) checked before use. Commands of different callers (the RDMA core's work for many connections at
 * once, several processes making QPs) no longer wait for each other's round trips: the device takes them together.
 *
 * The device answers most commands within tens of microseconds, less than an interrupt and a wake-up cost a
 * guest: a command polls the used ring that long with the queue's interrupt off, and only then sleeps on its slot.
 * Whoever takes buffers off the used ring (a polling command, or the interrupt) hands each to its slot, so a
 * command sleeping while another polls is woken by the poller; the last poller turns the interrupt back on.
 * Creating and connecting QPs is a few commands each, so this is most of what their rate is made of.
 */
#include <linux/delay.h>
#include <linux/ktime.h>
#include <linux/slab.h>
#include <linux/scatterlist.h>

#include <linux/virtio_config.h>

#include "vrdma.h"

#define VRDMA_CMD_POLL_US 200

/* Under ctrl_lock: every buffer the device gave back, handed to its command (the token is its slot). */
static void vrdma_cmd_reap(struct vrdma_dev *dev)
{
	struct vrdma_cmd_slot *slot;
	unsigned int len;

	while ((slot = virtqueue_get_buf(dev->ctrl_vq, &len))) {
		if (!slot->busy || slot->answered) {
			dev_err(&dev->vdev->dev, "the device gave back a command buffer twice\n");
			dev->broken = true;
			continue;
		}
		slot->used_len = len;
		slot->answered = true;
		complete(&slot->done);
	}
}

void vrdma_cmd_vq_done(struct virtqueue *vq)
{
	struct vrdma_dev *dev = vq->vdev->priv;
	unsigned long flags;

	spin_lock_irqsave(&dev->ctrl_lock, flags);
	vrdma_cmd_reap(dev);
	spin_unlock_irqrestore(&dev->ctrl_lock, flags);
}

/* The device is lost: every command waiting for it gives up now. */
void vrdma_cmd_wake_all(struct vrdma_dev *dev)
{
	int i;

	for (i = 0; i < VRDMA_CMD_SLOTS; i++)
		complete(&dev->cmd_slots[i].done);
}

int vrdma_cmd_init(struct vrdma_dev *dev)
{
	int i;

	init_rwsem(&dev->cmd_rwsem);
	sema_init(&dev->cmd_free, VRDMA_CMD_SLOTS);
	spin_lock_init(&dev->ctrl_lock);
	atomic_set(&dev->cmd_seq, 0);
	dev->cmd_polling = 0;
	for (i = 0; i < VRDMA_CMD_SLOTS; i++) {
		struct vrdma_cmd_slot *slot = &dev->cmd_slots[i];

		init_completion(&slot->done);
		slot->busy = slot->answered = false;
		slot->buf = kzalloc(PAGE_SIZE, GFP_KERNEL);
		if (!slot->buf) {
			vrdma_cmd_fini(dev);
			return -ENOMEM;
		}
	}
	return 0;
}

void vrdma_cmd_fini(struct vrdma_dev *dev)
{
	int i;

	for (i = 0; i < VRDMA_CMD_SLOTS; i++) {
		kfree(dev->cmd_slots[i].buf);
		dev->cmd_slots[i].buf = NULL;
	}
}

/*
 * Every status of the protocol has its errno, the one a user of the verb expects: a device out of objects or
 * translation pages is ENOMEM (as an HCA out of resources), an object still in use is EBUSY. Only a status the
 * protocol does not define (a broken device) is EIO.
 */
static int vrdma_status_to_errno(u16 status)
{
	switch (status) {
	case VRDMA_STATUS_OK:
		return 0;
	case VRDMA_STATUS_NOT_SUPPORTED:
		return -EOPNOTSUPP;
	case VRDMA_STATUS_INVALID:
		return -EINVAL;
	case VRDMA_STATUS_BAD_LENGTH:
		return -EMSGSIZE;
	case VRDMA_STATUS_NO_RESOURCES:
		return -ENOMEM;
	case VRDMA_STATUS_BUSY:
		return -EBUSY;
	default:
		return -EIO;
	}
}

/*
 * Execute one command. @req starts with struct vrdma_cmd_hdr (opcode set by the caller), @resp with struct
 * vrdma_resp_hdr; both lengths are the ABI sizes of the command's structs. Returns 0 or a negative errno.
 */
/*
 * What a command returns once the device is lost: releasing an object succeeds (the device has forgotten it
 * already, and the RDMA core must be able to tear everything down without it); anything else fails.
 */
static int vrdma_lost_status(u16 opcode)
{
	switch (opcode) {
	case VRDMA_CMD_DEALLOC_UCONTEXT:
	case VRDMA_CMD_DEALLOC_PD:
	case VRDMA_CMD_DEREG_MR:
	case VRDMA_CMD_DESTROY_CQ:
	case VRDMA_CMD_DESTROY_QP:
	case VRDMA_CMD_DESTROY_SRQ:
	case VRDMA_CMD_DESTROY_AH:
	case VRDMA_CMD_DEL_GID:
		return 0;
	default:
		return -EIO;
	}
}

/* Whether the device gave the slot back (reaping what it gave back meanwhile). */
static bool vrdma_cmd_answered(struct vrdma_dev *dev, struct vrdma_cmd_slot *slot)
{
	unsigned long flags;
	bool answered;

	spin_lock_irqsave(&dev->ctrl_lock, flags);
	vrdma_cmd_reap(dev);
	answered = slot->answered;
	spin_unlock_irqrestore(&dev->ctrl_lock, flags);
	return answered;
}

/*
 * Wait for the slot's answer: poll for VRDMA_CMD_POLL_US with the interrupt off (while any command polls), then
 * sleep until its completion, the timeout or the device's loss. Returns whether the device answered; *timed_out
 * says whether it did not within the timeout (rather than being lost).
 */
static bool vrdma_cmd_wait(struct vrdma_dev *dev, struct vrdma_cmd_slot *slot, bool *timed_out)
{
	unsigned long deadline = jiffies + msecs_to_jiffies(VRDMA_CMD_TIMEOUT_MS);
	ktime_t poll_end = ktime_add_us(ktime_get(), VRDMA_CMD_POLL_US);
	unsigned long flags;
	bool answered;

	*timed_out = false;
	spin_lock_irqsave(&dev->ctrl_lock, flags);
	if (dev->cmd_polling++ == 0)
		virtqueue_disable_cb(dev->ctrl_vq);
	spin_unlock_irqrestore(&dev->ctrl_lock, flags);
	do {
		answered = vrdma_cmd_answered(dev, slot);
		if (answered || READ_ONCE(dev->lost))
			break;
		cpu_relax();
	} while (ktime_before(ktime_get(), poll_end));
	spin_lock_irqsave(&dev->ctrl_lock, flags);
	/* The last poller turns the interrupt back on; buffers given back meanwhile raise none: reap them here. */
	if (--dev->cmd_polling == 0 && !virtqueue_enable_cb(dev->ctrl_vq))
		vrdma_cmd_reap(dev);
	answered = slot->answered;
	spin_unlock_irqrestore(&dev->ctrl_lock, flags);
	if (answered || READ_ONCE(dev->lost))
		return answered;
	if (time_after_eq(jiffies, deadline) || !wait_for_completion_timeout(&slot->done, deadline - jiffies)) {
		answered = vrdma_cmd_answered(dev, slot);
		*timed_out = !answered && !READ_ONCE(dev->lost);
		return answered;
	}
	return vrdma_cmd_answered(dev, slot);  /* woken by its answer, or by vrdma_cmd_wake_all */
}

/* A free slot, reset for a new command (cmd_free counted one free). */
static struct vrdma_cmd_slot *vrdma_cmd_slot_take(struct vrdma_dev *dev)
{
	struct vrdma_cmd_slot *slot = NULL;
	unsigned long flags;
	int i;

	spin_lock_irqsave(&dev->ctrl_lock, flags);
	for (i = 0; i < VRDMA_CMD_SLOTS && !slot; i++) {
		if (!dev->cmd_slots[i].busy)
			slot = &dev->cmd_slots[i];
	}
	if (slot) {
		slot->busy = true;
		slot->answered = false;
		reinit_completion(&slot->done);
	}
	spin_unlock_irqrestore(&dev->ctrl_lock, flags);
	return slot;
}

static void vrdma_cmd_slot_give(struct vrdma_dev *dev, struct vrdma_cmd_slot *slot)
{
	unsigned long flags;

	spin_lock_irqsave(&dev->ctrl_lock, flags);
	slot->busy = false;
	spin_unlock_irqrestore(&dev->ctrl_lock, flags);
	up(&dev->cmd_free);
}

int vrdma_cmd_exec(struct vrdma_dev *dev, void *req, size_t req_len, void *resp, size_t resp_len)
{
	struct vrdma_cmd_hdr *hdr = req;
	struct vrdma_resp_hdr *rhdr;
	struct scatterlist out_sg, in_sg, *sgs[2];
	struct vrdma_cmd_slot *slot;
	unsigned long flags;
	bool timed_out;
	u16 opcode;
	u32 seq;
	int ret;

	if (req_len < sizeof(*hdr) || resp_len < sizeof(*rhdr) || req_len + resp_len > PAGE_SIZE)
		return -EINVAL;

	opcode = le16_to_cpu(hdr->opcode);
	down_read(&dev->cmd_rwsem);
	if (READ_ONCE(dev->lost)) {
		ret = vrdma_lost_status(opcode);
		goto out;
	}
	if (dev->broken) {
		ret = -EIO;
		goto out;
	}
	down(&dev->cmd_free);
	slot = vrdma_cmd_slot_take(dev);
	if (WARN_ON_ONCE(!slot)) {  /* cmd_free counted one */
		up(&dev->cmd_free);
		ret = -EIO;
		goto out;
	}
	seq = (u32)atomic_inc_return(&dev->cmd_seq);
	hdr->seq = cpu_to_le32(seq);
	hdr->reserved = 0;
	memcpy(slot->buf, req, req_len);
	memset(slot->buf + req_len, 0, resp_len);
	sg_init_one(&out_sg, slot->buf, req_len);
	sg_init_one(&in_sg, slot->buf + req_len, resp_len);
	sgs[0] = &out_sg;
	sgs[1] = &in_sg;

	spin_lock_irqsave(&dev->ctrl_lock, flags);
	ret = virtqueue_add_sgs(dev->ctrl_vq, sgs, 1, 1, slot, GFP_ATOMIC);
	if (!ret)
		virtqueue_kick(dev->ctrl_vq);
	spin_unlock_irqrestore(&dev->ctrl_lock, flags);
	if (ret)
		goto give;

	if (!vrdma_cmd_wait(dev, slot, &timed_out)) {
		/* The device still owns the buffer (timed out, or lost while it held it): the slot stays taken rather
		 * than risk a late write into a reused buffer. A timeout means the device is gone as far as this
		 * driver can tell: start over with a new probe. */
		dev->broken = true;
		up_read(&dev->cmd_rwsem);
		if (timed_out) {
			dev_err(&dev->vdev->dev, "command %u (seq %u) timed out after %d ms\n", opcode, seq,
				VRDMA_CMD_TIMEOUT_MS);
			vrdma_device_lost(dev, "a command timed out");
		}
		return vrdma_lost_status(opcode);
	}
	if (slot->used_len < sizeof(*rhdr) || slot->used_len > resp_len) {
		dev_err(&dev->vdev->dev, "command %u: response of %u bytes (expected %zu)\n", opcode, slot->used_len,
			resp_len);
		ret = -EIO;
		goto give;
	}
	rhdr = slot->buf + req_len;
	if (le16_to_cpu(rhdr->opcode) != opcode || le32_to_cpu(rhdr->seq) != seq) {
		dev_err(&dev->vdev->dev, "command %u seq %u: response is for command %u seq %u\n", opcode, seq,
			le16_to_cpu(rhdr->opcode), le32_to_cpu(rhdr->seq));
		ret = -EIO;
		goto give;
	}
	ret = vrdma_status_to_errno(le16_to_cpu(rhdr->status));
	if (ret && le16_to_cpu(rhdr->status) == VRDMA_STATUS_INVALID &&
	    virtio_cread64(dev->vdev, offsetof(struct vrdma_config, device_epoch)) != dev->epoch) {
		/* Refused because the device no longer knows our handles: it lost its state before its event
		 * saying so reached us. */
		vrdma_cmd_slot_give(dev, slot);
		up_read(&dev->cmd_rwsem);
		vrdma_device_lost(dev, "the device's state was reset (new epoch)");
		return vrdma_lost_status(opcode);
	}
	if (ret) {
		dev_dbg(&dev->vdev->dev, "command %u: status %u\n", opcode, le16_to_cpu(rhdr->status));
		memcpy(resp, rhdr, sizeof(*rhdr));
		goto give;
	}
	if (slot->used_len != resp_len) {
		dev_err(&dev->vdev->dev, "command %u: short response, %u of %zu bytes\n", opcode, slot->used_len,
			resp_len);
		ret = -EIO;
		goto give;
	}
	memcpy(resp, rhdr, resp_len);
give:
	vrdma_cmd_slot_give(dev, slot);
out:
	up_read(&dev->cmd_rwsem);
	return ret;
}
