// SPDX-License-Identifier: GPL-2.0-only
/*
 * vrdma command channel over the control virtqueue.
 *
 * Small and strict: one command in flight (cmd_lock), request and response sizes fixed by the ABI, a timeout,
 * and every device-supplied value (used length, opcode, sequence number, status) checked before use.
 *
 * The device answers most commands within tens of microseconds, less than an interrupt and a wake-up cost a
 * guest: the driver polls the used ring that long with the queue's interrupt off, and only then sleeps on it.
 * Creating and connecting QPs is a few commands each, so this is most of what their rate is made of.
 */
#include <linux/delay.h>
#include <linux/ktime.h>
#include <linux/slab.h>
#include <linux/scatterlist.h>

#include <linux/virtio_config.h>

#include "vrdma.h"

#define VRDMA_CMD_POLL_US 200

void vrdma_cmd_vq_done(struct virtqueue *vq)
{
	struct vrdma_dev *dev = vq->vdev->priv;

	complete(&dev->cmd_done);
}

int vrdma_cmd_init(struct vrdma_dev *dev)
{
	mutex_init(&dev->cmd_lock);
	init_completion(&dev->cmd_done);
	spin_lock_init(&dev->ctrl_lock);
	dev->cmd_buf = kzalloc(PAGE_SIZE, GFP_KERNEL);
	return dev->cmd_buf ? 0 : -ENOMEM;
}

void vrdma_cmd_fini(struct vrdma_dev *dev)
{
	kfree(dev->cmd_buf);
	dev->cmd_buf = NULL;
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

/* The answer to the command in flight, if the device has given it back (NULL: not yet). */
static void *vrdma_cmd_take(struct vrdma_dev *dev, unsigned int *used_len)
{
	unsigned long flags;
	void *token;

	spin_lock_irqsave(&dev->ctrl_lock, flags);
	token = virtqueue_get_buf(dev->ctrl_vq, used_len);
	spin_unlock_irqrestore(&dev->ctrl_lock, flags);
	return token;
}

/*
 * Wait for the command in flight: poll for VRDMA_CMD_POLL_US with the interrupt off, then sleep until the
 * interrupt, the timeout or the device's loss. A wake-up with nothing in the used ring (a late interrupt of an
 * earlier, polled command) sleeps again. Returns the buffer, or NULL on timeout or loss (*timed_out says which).
 */
static void *vrdma_cmd_wait(struct vrdma_dev *dev, unsigned int *used_len, bool *timed_out)
{
	unsigned long deadline = jiffies + msecs_to_jiffies(VRDMA_CMD_TIMEOUT_MS);
	ktime_t poll_end = ktime_add_us(ktime_get(), VRDMA_CMD_POLL_US);
	unsigned long flags;
	void *token;
	bool pending;

	*timed_out = false;
	do {
		token = vrdma_cmd_take(dev, used_len);
		if (token || READ_ONCE(dev->lost))
			return token;
		cpu_relax();
	} while (ktime_before(ktime_get(), poll_end));
	for (;;) {
		reinit_completion(&dev->cmd_done);
		spin_lock_irqsave(&dev->ctrl_lock, flags);
		pending = !virtqueue_enable_cb(dev->ctrl_vq);  /* false: a buffer came back meanwhile */
		spin_unlock_irqrestore(&dev->ctrl_lock, flags);
		token = vrdma_cmd_take(dev, used_len);
		if (token || READ_ONCE(dev->lost))
			return token;
		if (pending)
			continue;
		if (time_after_eq(jiffies, deadline) ||
		    !wait_for_completion_timeout(&dev->cmd_done, deadline - jiffies)) {
			token = vrdma_cmd_take(dev, used_len);
			*timed_out = !token;
			return token;
		}
	}
}

int vrdma_cmd_exec(struct vrdma_dev *dev, void *req, size_t req_len, void *resp, size_t resp_len)
{
	struct vrdma_cmd_hdr *hdr = req;
	struct vrdma_resp_hdr *rhdr;
	struct scatterlist out_sg, in_sg, *sgs[2];
	unsigned long flags;
	unsigned int used_len;
	bool timed_out;
	void *token;
	u16 opcode;
	u32 seq;
	int ret;

	if (req_len < sizeof(*hdr) || resp_len < sizeof(*rhdr) || req_len + resp_len > PAGE_SIZE)
		return -EINVAL;

	opcode = le16_to_cpu(hdr->opcode);
	mutex_lock(&dev->cmd_lock);
	if (READ_ONCE(dev->lost)) {
		ret = vrdma_lost_status(opcode);
		goto out;
	}
	if (dev->broken) {
		ret = -EIO;
		goto out;
	}
	seq = ++dev->cmd_seq;
	hdr->seq = cpu_to_le32(seq);
	hdr->reserved = 0;
	memcpy(dev->cmd_buf, req, req_len);
	memset(dev->cmd_buf + req_len, 0, resp_len);
	sg_init_one(&out_sg, dev->cmd_buf, req_len);
	sg_init_one(&in_sg, dev->cmd_buf + req_len, resp_len);
	sgs[0] = &out_sg;
	sgs[1] = &in_sg;

	spin_lock_irqsave(&dev->ctrl_lock, flags);
	virtqueue_disable_cb(dev->ctrl_vq);  /* polled first: see vrdma_cmd_wait */
	ret = virtqueue_add_sgs(dev->ctrl_vq, sgs, 1, 1, dev, GFP_ATOMIC);
	if (!ret)
		virtqueue_kick(dev->ctrl_vq);
	spin_unlock_irqrestore(&dev->ctrl_lock, flags);
	if (ret)
		goto out;

	token = vrdma_cmd_wait(dev, &used_len, &timed_out);
	if (timed_out) {
		/* The device still owns the buffer: never reuse the queue rather than risk a late write. The device
		 * is gone as far as this driver can tell: start over with a new probe. */
		dev_err(&dev->vdev->dev, "command %u (seq %u) timed out after %d ms\n", opcode, seq,
			VRDMA_CMD_TIMEOUT_MS);
		dev->broken = true;
		mutex_unlock(&dev->cmd_lock);
		vrdma_device_lost(dev, "a command timed out");
		return vrdma_lost_status(opcode);
	}
	if (!token) {
		/* Woken by vrdma_device_lost, not by the device: the buffer may still be the device's. */
		dev->broken = true;
		ret = vrdma_lost_status(opcode);
		goto out;
	}
	if (token != dev) {
		dev_err(&dev->vdev->dev, "command %u: device returned an unknown buffer\n", opcode);
		dev->broken = true;
		ret = -EIO;
		goto out;
	}
	if (used_len < sizeof(*rhdr) || used_len > resp_len) {
		dev_err(&dev->vdev->dev, "command %u: response of %u bytes (expected %zu)\n", opcode, used_len,
			resp_len);
		ret = -EIO;
		goto out;
	}
	rhdr = dev->cmd_buf + req_len;
	if (le16_to_cpu(rhdr->opcode) != opcode || le32_to_cpu(rhdr->seq) != seq) {
		dev_err(&dev->vdev->dev, "command %u seq %u: response is for command %u seq %u\n", opcode, seq,
			le16_to_cpu(rhdr->opcode), le32_to_cpu(rhdr->seq));
		ret = -EIO;
		goto out;
	}
	ret = vrdma_status_to_errno(le16_to_cpu(rhdr->status));
	if (ret && le16_to_cpu(rhdr->status) == VRDMA_STATUS_INVALID &&
	    virtio_cread64(dev->vdev, offsetof(struct vrdma_config, device_epoch)) != dev->epoch) {
		/* Refused because the device no longer knows our handles: it lost its state before its event
		 * saying so reached us. */
		mutex_unlock(&dev->cmd_lock);
		vrdma_device_lost(dev, "the device's state was reset (new epoch)");
		return vrdma_lost_status(opcode);
	}
	if (ret) {
		dev_dbg(&dev->vdev->dev, "command %u: status %u\n", opcode, le16_to_cpu(rhdr->status));
		memcpy(resp, rhdr, sizeof(*rhdr));
		goto out;
	}
	if (used_len != resp_len) {
		dev_err(&dev->vdev->dev, "command %u: short response, %u of %zu bytes\n", opcode, used_len, resp_len);
		ret = -EIO;
		goto out;
	}
	memcpy(resp, rhdr, resp_len);
out:
	mutex_unlock(&dev->cmd_lock);
	return ret;
}
