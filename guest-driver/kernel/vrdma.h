/* SPDX-License-Identifier: GPL-2.0-only */
/* vrdma guest driver: shared declarations. */
#ifndef VRDMA_H
#define VRDMA_H

#include <linux/completion.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/rwsem.h>
#include <linux/semaphore.h>
#include <linux/spinlock.h>
#include <linux/virtio.h>
#include <linux/xarray.h>
#include <rdma/ib_verbs.h>

#include <rdma/vrdma-abi.h>
#include "vrdma_dev_api.h"
#include "vrdma_compat.h"

#define VRDMA_CMD_TIMEOUT_MS 5000
#define VRDMA_EVENT_BUFFERS 16
#define VRDMA_NUM_STATS 16		/* the port's counters (QUERY_COUNTERS), a QP counter's too */
#define VRDMA_NUM_QP_STATS 6		/* a QP's (QUERY_QP_COUNTERS) */

#define VRDMA_CMD_SLOTS 8	/* commands in flight at once, at most */

/* One command's buffers and state (vrdma_cmd.c). */
struct vrdma_cmd_slot {
	void *buf;			/* request, then response: PAGE_SIZE, kmalloc'd (DMA-able) */
	struct completion done;		/* the device gave it back, or the device was lost */
	unsigned int used_len;
	bool busy;			/* a command holds it (ctrl_lock) */
	bool answered;			/* the device gave it back (ctrl_lock) */
};

struct vrdma_dev {
	struct ib_device ib_dev;	/* first: allocated by ib_alloc_device() */
	struct virtio_device *vdev;
	struct net_device *netdev;	/* the paired virtio-net netdev (config space MAC), held */
	bool registered;
	struct virtqueue *ctrl_vq;
	struct virtqueue *event_vq;
	struct virtqueue *wake_vq;	/* notified (no buffers) to wake the device's parked data engine */

	/* Objects that receive events, by device handle (vrdma_dispatch_event). */
	struct xarray cqs;
	struct xarray qps;
	struct xarray srqs;

	/* Command channel: up to VRDMA_CMD_SLOTS commands in flight at once, each in a slot of its own. */
	struct rw_semaphore cmd_rwsem;	/* commands hold it shared; recovery exclusive, to reset with none in flight */
	struct semaphore cmd_free;	/* the free slots, counted */
	struct vrdma_cmd_slot cmd_slots[VRDMA_CMD_SLOTS];
	unsigned int cmd_polling;	/* commands polling the used ring with its interrupt off (ctrl_lock) */
	spinlock_t ctrl_lock;		/* ctrl_vq and the slots' state, from process and interrupt context */
	atomic_t cmd_seq;
	bool broken;			/* a timed-out command leaves the queue unusable */
	bool lost;			/* the device forgot our objects: commands fail, the driver probes again */
	/*
	 * Set once a lost device was reset: it no longer touches the kernel's rings, which are the driver's to flush
	 * (vrdma_kcq_poll completes what was outstanding with IB_WC_WR_FLUSH_ERR). kflush_work runs the kernel CQs'
	 * completion handlers so that their users poll.
	 */
	bool quiesced;
	struct work_struct kflush_work;

	/* Event queue buffers, recycled after each event. */
	struct vrdma_event *events;
	spinlock_t event_lock;

	/* Config space, read once at probe (little-endian fields converted). */
	u32 abi_version;
	u64 pairing_id;
	u64 epoch;			/* the device state this driver's handles belong to (vrdma_config) */
	u32 doorbell_pages;
	u8 mac[6];

	/* The paired ivshmem device holding the doorbell region (BAR2). */
	struct pci_dev *db_pdev;	/* the ivshmem device of the region, or NULL (the device's shared memory) */
	u64 db_shm_size;		/* the region's bytes, when it is the device's shared memory region */
	phys_addr_t db_phys;		/* the region's guest-physical address: user mappings of its pages */
	void __iomem *db_header;
	void __iomem *db_region;	/* the whole region: the kernel's queues' slots are in pages the device names */
	struct xarray kqps;		/* the kernel's QPs by QPN: what a kernel CQE names (irq-safe lock) */

	struct vrdma_resp_query_device attr;
	struct vrdma_resp_query_port port;

	/* QP counters (vrdma_counter.c): the live ones, and the last values of those the core freed. */
	struct mutex counters_lock;
	struct list_head counters;
	u64 counted_history[VRDMA_NUM_STATS];
	struct ida counter_ids;
};

struct vrdma_user_mmap_entry {
	struct rdma_user_mmap_entry rdma_entry;
	phys_addr_t address;
};

struct vrdma_ucontext {
	struct ib_ucontext ibuc;
	u32 handle;
	u32 doorbell_page;		/* its first page: the provider reads its alive slot */
	struct xarray db_entries;	/* page -> rdma_user_mmap_entry: each page of the context, mapped on demand */
};

struct vrdma_pd {
	struct ib_pd ibpd;
	u32 handle;
};

/* An XRC domain: the device's (processes share it through the kernel's XRCD file). */
struct vrdma_xrcd {
	struct ib_xrcd ibxrcd;
	u32 handle;
};

struct ib_umem;

/* A kernel consumer's ring: kernel pages the device reads and writes (vrdma_kqueue.c). */
struct vrdma_kbuf {
	void *va;
	size_t size;
};

/*
 * Guest memory an object hands the device, from one of two sources: a user process's pages, pinned (umem: a user
 * object's ring, an MR's memory), or kernel pages (kbuf: a kernel consumer's ring, which vrdma_kqueue.c posts to
 * and polls). Every create path takes one or the other and then runs the same command, publication and teardown.
 */
struct vrdma_buf {
	struct ib_umem *umem;
	struct vrdma_kbuf kbuf;
};

/* Whether an object's ring is the kernel's own (its work is posted and polled by the driver, not by libvrdma). */
static inline bool vrdma_kernel_ring(const struct vrdma_buf *ring)
{
	return ring->kbuf.va;
}

struct vrdma_mr {
	struct ib_mr ibmr;
	u32 handle;
	struct vrdma_buf mem;		/* its pinned pages (a user MR) */
	bool dma;			/* get_dma_mr's: the local DMA lkey, no device object */
	/* A fast-registration MR (alloc_mr): the page list ib_map_mr_sg fills and REG_MR work requests name. */
	__le64 *pages;
	u32 npages;
	u32 max_pages;
	int access;			/* what it was registered (or reregistered) with */
};

/* A memory window: the device's, bound by BIND_MW work requests the provider writes into its QPs' rings. */
struct vrdma_mw {
	struct ib_mw ibmw;
	u32 handle;
};

struct vrdma_cq {
	struct ib_cq ibcq;
	u32 handle;
	/* The CQE ring: in user memory (libvrdma polls it), or the kernel's (polled and armed by the driver). */
	struct vrdma_buf ring;
	spinlock_t lock;
	u32 entries;
	u32 cons;
	u32 arm_seq;
	u32 db_index;			/* of its arm slot */
};

/* One work queue of a kernel QP or SRQ, as the driver posts to it. */
struct vrdma_kqueue {
	spinlock_t lock;
	u32 prod;			/* WQEs posted (free-running), what the doorbell slot gets */
	u32 depth;
	u32 stride;
	u32 offset;			/* of slot 0 in the QP's or SRQ's ring */
	u32 max_sge;
	u32 db_index;			/* of its producer index */
};

struct vrdma_srq {
	struct ib_srq ibsrq;
	u32 handle;
	u32 depth;
	u32 max_sge;
	struct vrdma_buf ring;		/* in user memory, or the kernel's (posted to by the driver) */
	struct vrdma_kqueue rq;
};

struct vrdma_qp {
	struct ib_qp ibqp;
	u32 handle;
	enum ib_qp_state state;		/* as last set or queried; the device is the authority */
	bool sq_sig_all;
	/*
	 * RESET -> INIT kept here until the next transition (vrdma_modify_qp): the device is still in RESET and gets
	 * these attributes with it. Serialized, with state, by modify_lock.
	 */
	struct mutex modify_lock;
	bool init_deferred;
	int init_mask;
	struct vrdma_qp_attr init_attr;
	struct ib_qp_cap cap;
	/* Header page, send queue, receive queue: in user memory, or the kernel's (posted to by the driver). */
	struct vrdma_buf ring;
	struct vrdma_kqueue sq;
	struct vrdma_kqueue rq;
	/* Bound to a QP counter (ibqp.counter): its place there and its counters at binding (vrdma_counter.c). */
	struct list_head counter_node;
	u64 counter_base[VRDMA_NUM_QP_STATS];
};

struct vrdma_ah {
	struct ib_ah ibah;
	u32 handle;			/* a user AH's device object; 0 for a kernel AH */
	struct vrdma_ud_av av;		/* what a kernel UD send carries in its WQE (remote QPN and Q_Key per send) */
};

static inline struct vrdma_dev *to_vdev(struct ib_device *ibdev)
{
	return container_of(ibdev, struct vrdma_dev, ib_dev);
}

int vrdma_cmd_init(struct vrdma_dev *dev);
void vrdma_cmd_fini(struct vrdma_dev *dev);
void vrdma_cmd_vq_done(struct virtqueue *vq);
void vrdma_cmd_wake_all(struct vrdma_dev *dev);
int vrdma_cmd_exec(struct vrdma_dev *dev, void *req, size_t req_len, void *resp, size_t resp_len);

void vrdma_device_lost(struct vrdma_dev *dev, const char *why);

int vrdma_doorbell_pair(struct vrdma_dev *dev);
int vrdma_uctx_db_offset(struct vrdma_ucontext *uc, u32 index, u64 *offset);
void vrdma_doorbell_unpair(struct vrdma_dev *dev);

int vrdma_register_ib(struct vrdma_dev *dev);
void vrdma_unregister_ib(struct vrdma_dev *dev);
int vrdma_destroy_handle(struct vrdma_dev *dev, u16 opcode, u32 handle);

/* vrdma_umem.c: what every object's create and destroy share, whichever its memory's source. */
struct vrdma_pbl {               /* the guest-physical pages of a pinned buffer, in page-list pages */
	struct vrdma_page_list desc;
	__le64 *dir;
	__le64 **lists;
	u32 nlists;
};
void vrdma_pbl_free(struct vrdma_pbl *pbl);
int vrdma_pbl_build(struct ib_umem *umem, struct vrdma_pbl *pbl);
int vrdma_kbuf_alloc(struct vrdma_buf *buf, size_t size, struct vrdma_pbl *pbl);
int vrdma_pin(struct vrdma_dev *dev, u64 addr, u64 size, int access, struct vrdma_buf *buf,
	      struct vrdma_pbl *pbl);
void vrdma_buf_release(struct vrdma_buf *buf);
u32 vrdma_ucontext_handle(struct ib_udata *udata);
int vrdma_udata_in(struct ib_udata *udata, void *ucmd, size_t ucmd_len, size_t uresp_len);
int vrdma_exec_create(struct vrdma_dev *dev, void *cmd, size_t cmd_len, void *resp, size_t resp_len,
		      struct vrdma_pbl *pbl, struct vrdma_buf *buf);
int vrdma_publish(struct vrdma_dev *dev, struct xarray *xa, u32 handle, void *obj, u16 destroy_opcode,
		  struct ib_udata *udata, void *uresp, size_t uresp_len, struct vrdma_buf *buf);
int vrdma_unmake(struct vrdma_dev *dev, u16 destroy_opcode, u32 handle, struct vrdma_buf *buf, int err);
int vrdma_udata_db(struct ib_udata *udata, __le32 index, __u32 *uindex, __u64 *offset);
int vrdma_unpublish(struct vrdma_dev *dev, struct xarray *xa, u32 handle, void *obj, u16 destroy_opcode,
		    struct vrdma_buf *buf);

/* data-path verbs (vrdma_mr.c, vrdma_cq.c, vrdma_srq.c, vrdma_qp.c, vrdma_ah.c) and events (vrdma_event.c) */
struct ib_mr *vrdma_reg_user_mr(struct ib_pd *ibpd, u64 start, u64 length, u64 virt, int access,
				struct ib_udata *udata);
int vrdma_dereg_mr(struct ib_mr *ibmr, struct ib_udata *udata);
struct ib_mr *vrdma_rereg_user_mr(struct ib_mr *ibmr, int flags, u64 start, u64 length, u64 virt, int access,
				  struct ib_pd *ibpd, struct ib_udata *udata);
int vrdma_alloc_mw(struct ib_mw *ibmw, struct ib_udata *udata);
int vrdma_dealloc_mw(struct ib_mw *ibmw);
struct ib_mr *vrdma_get_dma_mr(struct ib_pd *ibpd, int access);
struct ib_mr *vrdma_alloc_mr(struct ib_pd *ibpd, enum ib_mr_type type, u32 max_num_sg);
int vrdma_map_mr_sg(struct ib_mr *ibmr, struct scatterlist *sg, int sg_nents, unsigned int *sg_offset);
int vrdma_create_cq(struct ib_cq *ibcq, const struct ib_cq_init_attr *attr, struct ib_udata *udata);
int vrdma_destroy_cq(struct ib_cq *ibcq, struct ib_udata *udata);
int vrdma_modify_cq(struct ib_cq *ibcq, u16 cq_count, u16 cq_period);
int vrdma_poll_cq(struct ib_cq *ibcq, int num_entries, struct ib_wc *wc);
int vrdma_req_notify_cq(struct ib_cq *ibcq, enum ib_cq_notify_flags flags);
int vrdma_create_srq(struct ib_srq *ibsrq, struct ib_srq_init_attr *attr, struct ib_udata *udata);
int vrdma_modify_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr, enum ib_srq_attr_mask mask,
		     struct ib_udata *udata);
int vrdma_query_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr);
int vrdma_destroy_srq(struct ib_srq *ibsrq, struct ib_udata *udata);
int vrdma_post_srq_recv(struct ib_srq *ibsrq, const struct ib_recv_wr *wr, const struct ib_recv_wr **bad_wr);
int vrdma_create_qp(struct ib_qp *ibqp, struct ib_qp_init_attr *attr, struct ib_udata *udata);
int vrdma_modify_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr, int mask, struct ib_udata *udata);
int vrdma_query_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr, int mask, struct ib_qp_init_attr *init);
int vrdma_destroy_qp(struct ib_qp *ibqp, struct ib_udata *udata);
int vrdma_post_send(struct ib_qp *ibqp, const struct ib_send_wr *wr, const struct ib_send_wr **bad_wr);
int vrdma_post_recv(struct ib_qp *ibqp, const struct ib_recv_wr *wr, const struct ib_recv_wr **bad_wr);
int vrdma_create_ah(struct ib_ah *ibah, struct rdma_ah_init_attr *init, struct ib_udata *udata);
int vrdma_destroy_ah(struct ib_ah *ibah, u32 flags);
void vrdma_dispatch_event(struct vrdma_dev *dev, const struct vrdma_event *event);

/* counters (vrdma_counter.c): the port's and QP counters */
struct rdma_counter;
struct rdma_hw_stats *vrdma_alloc_hw_port_stats(struct ib_device *ibdev, u32 port);
int vrdma_get_hw_stats(struct ib_device *ibdev, struct rdma_hw_stats *stats, u32 port, int index);
int vrdma_query_counters(struct vrdma_dev *dev, struct vrdma_resp_query_counters *resp);
/* vrdma_mad.c: the port's performance-management agent (PortCounters in sysfs, node_exporter's source). */
int vrdma_process_mad(struct ib_device *ibdev, int mad_flags, u32 port, const struct ib_wc *in_wc,
		      const struct ib_grh *in_grh, const struct ib_mad *in, struct ib_mad *out, size_t *out_mad_size,
		      u16 *out_mad_pkey_index);
struct rdma_hw_stats *vrdma_counter_alloc_stats(struct rdma_counter *counter);
int vrdma_counter_bind_qp(struct rdma_counter *counter, struct ib_qp *ibqp);
int vrdma_counter_unbind_qp(struct ib_qp *ibqp);
int vrdma_counter_update_stats(struct rdma_counter *counter);
int vrdma_counter_dealloc(struct rdma_counter *counter);

/* How a QP's rings are laid out in its buffer: the provider's choice for a user QP, the driver's for a kernel one. */
struct vrdma_qp_layout {
	u32 sq_depth, sq_stride, sq_offset, max_send_sge;
	u32 rq_depth, rq_stride, rq_offset, max_recv_sge;
};
void vrdma_create_qp_cmd(struct vrdma_cmd_create_qp *cmd, struct ib_qp *ibqp, const struct ib_qp_init_attr *attr,
			 u32 ucontext, const struct vrdma_qp_layout *layout);

/*
 * The kernel's own data path (vrdma_kqueue.c): kernel CQs, QPs and SRQs (made by the objects' one create path with
 * a kernel ring), posted and polled with no command, flushed when the device is lost.
 */
bool vrdma_kdb_ok(struct vrdma_dev *dev, u32 index);
int vrdma_kqueue_size(struct vrdma_kqueue *q, u32 wr, u32 sge, u32 inline_len, u32 header, u32 min_stride,
		      u32 max_wr);
void vrdma_kcq_init(struct vrdma_cq *cq, u32 entries, u32 db_index);
int vrdma_kcq_poll(struct vrdma_cq *cq, int num_entries, struct ib_wc *wc);
int vrdma_kcq_notify(struct vrdma_cq *cq, enum ib_cq_notify_flags flags);
int vrdma_kqp_post_send(struct vrdma_qp *qp, const struct ib_send_wr *wr, const struct ib_send_wr **bad_wr);
int vrdma_kqp_post_recv(struct vrdma_qp *qp, const struct ib_recv_wr *wr, const struct ib_recv_wr **bad_wr);
void vrdma_kflush(struct work_struct *work);
int vrdma_ksrq_post_recv(struct vrdma_srq *srq, const struct ib_recv_wr *wr, const struct ib_recv_wr **bad_wr);

#endif /* VRDMA_H */
