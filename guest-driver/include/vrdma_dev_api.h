/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR BSD-2-Clause */
/*
 * vrdma device API: what the device (the vrdma backend on the host) and its guest drivers say to each other, in
 * three headers: this one (identity, virtqueues, config space, the doorbell region, keys, GIDs, events, pages,
 * access rights, QP types and states), vrdma_dev_ring.h (the ring formats: WQEs, CQEs, ring headers, doorbell
 * slots, that the guest kernel driver vrdma.ko and the rdma-core provider libvrdma write and the device reads) and
 * vrdma_dev_cmd.h (the control commands, their statuses and their messages). Include this one: it includes the
 * other two. What passes between vrdma.ko and libvrdma alone (udata) is the user ABI, in
 * uapi/rdma/vrdma-abi.h, where rdma-core expects it.
 *
 * Rules that keep it one definition:
 * - fixed-width little-endian types, explicit padding, no bit-fields, no packed attribute;
 * - everything between DEVICE-API-BEGIN and DEVICE-API-END (in each of the three) is plain integer #defines and
 *   struct definitions, so that the backend loads this very text (with cffi) instead of declaring the layouts
 *   again;
 * - every struct's size is checked at compile time below, and the backend checks the same numbers.
 * See docs/device-interface.md for what the fields mean.
 */
#ifndef VRDMA_DEV_API_H
#define VRDMA_DEV_API_H

#include <linux/types.h>

/* DEVICE-API-BEGIN */
#define VRDMA_ABI_VERSION 9
#define VRDMA_VIRTIO_ID 42

/* Virtqueues */
#define VRDMA_QUEUE_CONTROL 0
#define VRDMA_QUEUE_EVENT 1
#define VRDMA_QUEUE_WAKE 2        /* no buffers: a notification wakes the device's parked data engine */
#define VRDMA_NUM_QUEUES 3

/*
 * Feature bits (virtio's device-specific range). VRDMA_F_DOORBELL_RECHECK: the device offers to look at the
 * doorbells of its parked engine every few milliseconds even when nobody woke it; a driver accepts it when its
 * CPU's memory fences may not order its doorbell store before its read of the parked slot (a TCG guest: QEMU drops
 * the host barrier of a guest fence unless it runs vCPUs in parallel), so that a wake-up it misses costs
 * milliseconds, not a hang. A driver whose fences are real declines it, and its device costs nothing while idle.
 */
#define VRDMA_F_DOORBELL_RECHECK 0

/*
 * Doorbell region: the device's VIRTIO shared memory region VRDMA_SHM_DOORBELL (QEMU's vhost-user-rdma-pci: BAR 2,
 * the backend maps it over vhost-user), or, with the generic vhost-user-device-pci, an ivshmem-plain device's BAR 2
 * paired by the header's pairing identifier. Page 0 is the header, page 1 the first of the kernel's (the queues of
 * context 0, the guest kernel's own consumers; mapped into the kernel only), then the user contexts' pages. Every
 * context starts with one page and is given more as its queues fill them; a page stays with its context until the
 * context goes (so no process ever maps a page that another context's queues use).
 */
#define VRDMA_SHM_DOORBELL 0      /* the region's VIRTIO shared memory region id (vhost-user-rdma-pci: BAR 2) */
#define VRDMA_DOORBELL_MAGIC 0x4c4c4542524f4456
#define VRDMA_DOORBELL_PAGE_SIZE 4096
#define VRDMA_KERNEL_DOORBELL_PAGE 1
#define VRDMA_FIRST_USER_DOORBELL_PAGE 2

/*
 * The local DMA lkey: an SGE with this lkey names guest-physical memory directly (addr is a guest-physical
 * address, as the DMA API gives the kernel of a virtio device without VIRTIO_F_ACCESS_PLATFORM). The device honours
 * it only in work requests of the kernel's queues (context 0), and only for ranges inside the guest's RAM; no MR
 * ever has this key.
 */
#define VRDMA_LOCAL_DMA_LKEY 0

/*
 * An MR's keys: the MR's slot in the bits from VRDMA_KEY_SLOT_SHIFT up, random bits above it, and a low byte that is
 * the consumer's to change for a fast-registration MR (ib_update_fast_reg_key: each REG_MR work request gives the
 * MR a new key with the same slot bits, so that a stale key stops working).
 */
#define VRDMA_KEY_SLOT_SHIFT 8
#define VRDMA_KEY_CONSUMER_MASK 0xff

/* GID types (struct vrdma_cmd_add_gid.type) */
#define VRDMA_GID_TYPE_ROCE_V1 1
#define VRDMA_GID_TYPE_ROCE_V2 2

/* Events on the event queue (handle: the object's handle; data: event-specific) */
#define VRDMA_EVENT_NONE 0
#define VRDMA_EVENT_PORT_ACTIVE 1     /* data: the device epoch (see struct vrdma_config) */
#define VRDMA_EVENT_CQ_COMP 2         /* an armed CQ got a completion; the CQ is disarmed */
#define VRDMA_EVENT_CQ_ERR 3          /* CQ overflow: a completion found the ring full; the CQ is in error */
#define VRDMA_EVENT_QP_FATAL 4        /* the device could not process the QP's work (bad ring index, ...) */
#define VRDMA_EVENT_QP_REQ_ERR 5      /* invalid request seen by the responder */
#define VRDMA_EVENT_QP_ACCESS_ERR 6   /* remote access violation seen by the responder */
#define VRDMA_EVENT_QP_LAST_WQE 7     /* an SRQ-attached QP in error has no more receives in flight */
#define VRDMA_EVENT_SRQ_LIMIT 8       /* the SRQ's posted receives fell below its armed limit */

/*
 * Guest memory as the device sees it: lists of guest-physical 4 KiB pages. A page-list page holds 512 page
 * addresses. levels 1: addr is one page-list page (npages <= 512); levels 2: addr is a directory page holding
 * the addresses of up to 512 page-list pages (npages <= 512 * 512).
 */
#define VRDMA_PAGE_SHIFT 12
#define VRDMA_PAGE_SIZE 4096
#define VRDMA_PBL_ENTRIES 512

/* Memory access flags (the InfiniBand values) */
#define VRDMA_ACCESS_LOCAL_WRITE 1
#define VRDMA_ACCESS_REMOTE_WRITE 2
#define VRDMA_ACCESS_REMOTE_READ 4
#define VRDMA_ACCESS_REMOTE_ATOMIC 8
#define VRDMA_ACCESS_MW_BIND 0x10     /* memory windows may be bound to the MR */
#define VRDMA_ALL_ACCESS 0x1f
#define VRDMA_MW_ACCESS 0xe           /* what a window grants: remote read, write, atomic */

/* QP types and states, modify masks (the InfiniBand values) */
#define VRDMA_QPT_GSI 1           /* QP1 of the port: datagrams of the MAD layer (the IB CM's among them) */
#define VRDMA_QPT_RC 2
#define VRDMA_QPT_UC 3            /* SEND and RDMA WRITE (with immediate) without acknowledgement */
#define VRDMA_QPT_UD 4
/*
 * XRC: an initiator sends (RC operations, each naming an XRC SRQ of the target side by its SRQ number); a target
 * has no queues of its own: a message lands in the XRC SRQ it names, which must be of the target's XRC domain, and
 * completes on that SRQ's CQ; the rkeys it honours are of that SRQ's PD.
 */
#define VRDMA_QPT_XRC_INI 9
#define VRDMA_QPT_XRC_TGT 10
#define VRDMA_GSI_QPN 1
#define VRDMA_GSI_QKEY 0x80010000
#define VRDMA_QKEY_PRIVILEGED 0x80000000  /* a send's Q_Key with this bit: the sending QP's own Q_Key (IB spec) */
#define VRDMA_GRH_SIZE 40         /* what a UD receive gets ahead of the payload (VRDMA_WC_GRH) */
#define VRDMA_UD_MAX_MSG 4096     /* a datagram's payload at most: the largest path MTU */
/* A UD receive's network header (struct vrdma_cqe.network_hdr_type), as the sender's GID type makes it: */
#define VRDMA_NETWORK_ROCE_V1 1   /* a GRH */
#define VRDMA_NETWORK_IPV4 2      /* an IPv4 header in the last 20 of the 40 bytes */
#define VRDMA_NETWORK_IPV6 3      /* an IPv6 header */
#define VRDMA_QPS_RESET 0
#define VRDMA_QPS_INIT 1
#define VRDMA_QPS_RTR 2
#define VRDMA_QPS_RTS 3
#define VRDMA_QPS_SQD 4
#define VRDMA_QPS_SQE 5
#define VRDMA_QPS_ERR 6
/* Port */
#define VRDMA_PORT_STATE_DOWN 1
#define VRDMA_PORT_STATE_ACTIVE 4
#define VRDMA_LINK_LAYER_ETHERNET 2

/* Device config space (virtio device-specific configuration), read-only for the driver. */
struct vrdma_config {
	__le32 abi_version;
	__le32 doorbell_page_size;
	__le64 pairing_id;        /* also in the doorbell region header: pairs this device with its ivshmem device */
	__le32 doorbell_pages;    /* pages in the doorbell region, header page included */
	__le32 max_ucontext;      /* at most doorbell_pages - 2 (VRDMA_FIRST_USER_DOORBELL_PAGE): a page each */
	__u8 mac[6];              /* MAC of the paired virtio-net netdev */
	__u8 reserved0[2];
	__le32 max_qp;
	__le32 max_qp_wr;
	__le32 max_sge;
	__le32 max_inline_data;
	__le32 max_cq;
	__le32 max_cqe;
	__le32 max_mr;
	__le32 max_pd;
	__le32 max_srq;
	__le32 max_srq_wr;
	__le32 max_ah;
	__le32 reserved1;
	__le64 max_mr_size;
	/*
	 * Changes whenever the device forgets its state (a reset, a new vhost-user connection, a restarted backend).
	 * A driver that sees another epoch than the one it probed with, here or in a PORT_ACTIVE event, holds handles
	 * the device no longer knows: it reports the device fatal and probes again.
	 */
	__le64 device_epoch;
};

/* Header of the doorbell region's first page. */
struct vrdma_doorbell_header {
	__le64 magic;
	__le64 pairing_id;
	__le32 abi_version;
	__le32 page_size;
	__le32 num_pages;
	__le32 reserved;
};

/* One event, written by the device into a buffer the driver posted on the event queue. */
struct vrdma_event {
	__le16 type;              /* VRDMA_EVENT_* */
	__le16 reserved;
	__le32 handle;            /* the object the event is about */
	__le64 data;
};
/* DEVICE-API-END */

#ifndef VRDMA_ASSERT_SIZE
#define VRDMA_ASSERT_SIZE(type, size) _Static_assert(sizeof(struct type) == (size), #type " changed size")
#endif
VRDMA_ASSERT_SIZE(vrdma_config, 96);
VRDMA_ASSERT_SIZE(vrdma_doorbell_header, 32);
VRDMA_ASSERT_SIZE(vrdma_event, 16);

#include "vrdma_dev_ring.h"
#include "vrdma_dev_cmd.h"

#endif /* VRDMA_DEV_API_H */
