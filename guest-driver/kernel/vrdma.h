/* SPDX-License-Identifier: GPL-2.0-only */
/* vrdma guest driver: shared declarations. */
#ifndef VRDMA_H
#define VRDMA_H

#include <linux/completion.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/spinlock.h>
#include <linux/virtio.h>
#include <rdma/ib_verbs.h>

#include <rdma/vrdma-abi.h>

#define VRDMA_CMD_TIMEOUT_MS 5000
#define VRDMA_EVENT_BUFFERS 16

struct vrdma_dev {
	struct ib_device ib_dev;	/* first: allocated by ib_alloc_device() */
	struct virtio_device *vdev;
	struct net_device *netdev;	/* the paired virtio-net netdev (config space MAC), held */
	bool registered;
	struct virtqueue *ctrl_vq;
	struct virtqueue *event_vq;

	/* Command channel: one command in flight, serialized by cmd_lock. */
	struct mutex cmd_lock;
	struct completion cmd_done;
	spinlock_t ctrl_lock;		/* ctrl_vq access from process and interrupt context */
	u32 cmd_seq;
	void *cmd_buf;			/* request, then response: PAGE_SIZE, kmalloc'd (DMA-able) */
	bool broken;			/* a timed-out command leaves the queue unusable */

	/* Event queue buffers, recycled after each event. */
	struct vrdma_event *events;
	spinlock_t event_lock;

	/* Config space, read once at probe (little-endian fields converted). */
	u32 abi_version;
	u64 pairing_id;
	u32 doorbell_pages;
	u8 mac[6];

	/* The paired ivshmem device holding the doorbell region (BAR2). */
	struct pci_dev *db_pdev;
	void __iomem *db_header;

	struct vrdma_resp_query_device attr;
	struct vrdma_resp_query_port port;
};

struct vrdma_user_mmap_entry {
	struct rdma_user_mmap_entry rdma_entry;
	phys_addr_t address;
};

struct vrdma_ucontext {
	struct ib_ucontext ibuc;
	u32 handle;
	u32 doorbell_page;
	struct rdma_user_mmap_entry *doorbell_entry;
};

struct vrdma_pd {
	struct ib_pd ibpd;
	u32 handle;
};

struct vrdma_cq {
	struct ib_cq ibcq;
};

struct vrdma_qp {
	struct ib_qp ibqp;
};

static inline struct vrdma_dev *to_vdev(struct ib_device *ibdev)
{
	return container_of(ibdev, struct vrdma_dev, ib_dev);
}

int vrdma_cmd_init(struct vrdma_dev *dev);
void vrdma_cmd_fini(struct vrdma_dev *dev);
void vrdma_cmd_vq_done(struct virtqueue *vq);
int vrdma_cmd_exec(struct vrdma_dev *dev, void *req, size_t req_len, void *resp, size_t resp_len);

int vrdma_doorbell_pair(struct vrdma_dev *dev);
void vrdma_doorbell_unpair(struct vrdma_dev *dev);

int vrdma_register_ib(struct vrdma_dev *dev);
void vrdma_unregister_ib(struct vrdma_dev *dev);

#endif /* VRDMA_H */
