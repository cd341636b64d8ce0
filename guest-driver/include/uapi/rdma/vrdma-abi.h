/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR BSD-2-Clause */
/*
 * vrdma device ABI: the one definition of every structure shared by the device (the vrdma backend on the host),
 * the guest kernel driver (vrdma.ko) and the rdma-core provider (libvrdma).
 *
 * Rules that keep it one definition:
 * - fixed-width little-endian types, explicit padding, no bit-fields, no packed attribute;
 * - everything between ABI-BEGIN and ABI-END is plain integer #defines and struct/enum definitions, so that the
 *   backend loads this very text (with cffi) instead of declaring the layouts again;
 * - every struct's size is checked at compile time below, and the backend checks the same numbers.
 * See docs/device-interface.md for what the fields mean.
 */
#ifndef VRDMA_ABI_H
#define VRDMA_ABI_H

#include <linux/types.h>

/* ABI-BEGIN */
#define VRDMA_ABI_VERSION 1
#define VRDMA_VIRTIO_ID 42
#define VRDMA_UVERBS_ABI_VERSION 1

/* Virtqueues */
#define VRDMA_QUEUE_CONTROL 0
#define VRDMA_QUEUE_EVENT 1
#define VRDMA_NUM_QUEUES 2

/* Doorbell region (ivshmem-plain BAR2): page 0 is the header, then one page per user context */
#define VRDMA_DOORBELL_MAGIC 0x4c4c4542524f4456
#define VRDMA_DOORBELL_PAGE_SIZE 4096

/* Control commands */
#define VRDMA_CMD_QUERY_DEVICE 1
#define VRDMA_CMD_QUERY_PORT 2
#define VRDMA_CMD_ADD_GID 3
#define VRDMA_CMD_DEL_GID 4
#define VRDMA_CMD_ALLOC_UCONTEXT 5
#define VRDMA_CMD_DEALLOC_UCONTEXT 6
#define VRDMA_CMD_ALLOC_PD 7
#define VRDMA_CMD_DEALLOC_PD 8

/* Command status */
#define VRDMA_STATUS_OK 0
#define VRDMA_STATUS_NOT_SUPPORTED 1
#define VRDMA_STATUS_INVALID 2
#define VRDMA_STATUS_BAD_LENGTH 3
#define VRDMA_STATUS_NO_RESOURCES 4
#define VRDMA_STATUS_BUSY 5

/* GID types (struct vrdma_cmd_add_gid.type) */
#define VRDMA_GID_TYPE_ROCE_V1 1
#define VRDMA_GID_TYPE_ROCE_V2 2

/* Events on the event queue */
#define VRDMA_EVENT_NONE 0
#define VRDMA_EVENT_PORT_ACTIVE 1

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
	__le32 max_ucontext;      /* = doorbell_pages - 1 */
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

/* Every command starts with this header (device-readable part of a control queue chain). */
struct vrdma_cmd_hdr {
	__le16 opcode;
	__le16 reserved;
	__le32 seq;               /* echoed in the response */
};

/* Every response starts with this header (device-writable part of the chain). */
struct vrdma_resp_hdr {
	__le16 opcode;            /* the request's opcode */
	__le16 status;            /* VRDMA_STATUS_* */
	__le32 seq;
};

struct vrdma_cmd_query_device {
	struct vrdma_cmd_hdr hdr;
};

struct vrdma_resp_query_device {
	struct vrdma_resp_hdr hdr;
	__le64 fw_ver;
	__le64 node_guid;
	__le64 sys_image_guid;
	__le64 max_mr_size;
	__le64 page_size_cap;
	__le32 vendor_id;
	__le32 vendor_part_id;
	__le32 hw_ver;
	__le32 max_qp;
	__le32 max_qp_wr;
	__le32 max_sge;
	__le32 max_cq;
	__le32 max_cqe;
	__le32 max_mr;
	__le32 max_pd;
	__le32 max_qp_rd_atom;
	__le32 max_qp_init_rd_atom;
	__le32 max_srq;
	__le32 max_srq_wr;
	__le32 max_srq_sge;
	__le32 max_ah;
	__le32 max_inline_data;
	__le32 reserved;
};

struct vrdma_cmd_query_port {
	struct vrdma_cmd_hdr hdr;
	__u8 port;                /* 1: the device has one port */
	__u8 reserved[7];
};

struct vrdma_resp_query_port {
	struct vrdma_resp_hdr hdr;
	__le32 state;             /* VRDMA_PORT_STATE_* */
	__le32 max_mtu;           /* IB MTU enum: 1 = 256 ... 5 = 4096 */
	__le32 active_mtu;
	__le32 gid_tbl_len;
	__le32 port_cap_flags;
	__le32 max_msg_sz;
	__le32 pkey_tbl_len;
	__u8 link_layer;          /* VRDMA_LINK_LAYER_* */
	__u8 active_speed;
	__u8 active_width;
	__u8 phys_state;
};

/* GID table entry of the port, as the guest's RDMA core computes it from the paired netdev's addresses. */
struct vrdma_cmd_add_gid {
	struct vrdma_cmd_hdr hdr;
	__le32 index;             /* < gid_tbl_len of QUERY_PORT */
	__le32 type;              /* VRDMA_GID_TYPE_* */
	__u8 gid[16];
};

struct vrdma_cmd_del_gid {
	struct vrdma_cmd_hdr hdr;
	__le32 index;
	__le32 reserved;
};

/* A user context: the device gives it its own doorbell page. */
struct vrdma_cmd_alloc_ucontext {
	struct vrdma_cmd_hdr hdr;
};

struct vrdma_resp_alloc_ucontext {
	struct vrdma_resp_hdr hdr;
	__le32 handle;
	__le32 doorbell_page;     /* page index in the doorbell region: 1 .. doorbell_pages - 1 */
};

/* Deallocation of any object by handle (ucontext, PD, ...). */
struct vrdma_cmd_destroy {
	struct vrdma_cmd_hdr hdr;
	__le32 handle;
	__le32 reserved;
};

struct vrdma_cmd_alloc_pd {
	struct vrdma_cmd_hdr hdr;
	__le32 ucontext;          /* handle of the owning user context, 0 for a kernel PD */
	__le32 reserved;
};

struct vrdma_resp_alloc_pd {
	struct vrdma_resp_hdr hdr;
	__le32 handle;
	__le32 reserved;
};

/*
 * Kernel <-> provider (libvrdma) udata, native endian (same machine).
 */
struct vrdma_alloc_ucontext_resp {
	__u32 doorbell_page;      /* this context's page in the doorbell region */
	__u32 doorbell_page_size;
	__u64 doorbell_offset;    /* mmap() offset of that page on the uverbs file */
};

struct vrdma_alloc_pd_resp {
	__u32 pdn;                /* the device's handle of the PD */
	__u32 reserved;
};

/* One event, written by the device into a buffer the driver posted on the event queue. */
struct vrdma_event {
	__le16 type;              /* VRDMA_EVENT_* */
	__le16 reserved;
	__le32 handle;            /* the object the event is about */
	__le64 data;
};
/* ABI-END */

#define VRDMA_ASSERT_SIZE(type, size) _Static_assert(sizeof(struct type) == (size), #type " changed size")
VRDMA_ASSERT_SIZE(vrdma_config, 88);
VRDMA_ASSERT_SIZE(vrdma_doorbell_header, 32);
VRDMA_ASSERT_SIZE(vrdma_cmd_hdr, 8);
VRDMA_ASSERT_SIZE(vrdma_resp_hdr, 8);
VRDMA_ASSERT_SIZE(vrdma_cmd_query_device, 8);
VRDMA_ASSERT_SIZE(vrdma_resp_query_device, 120);
VRDMA_ASSERT_SIZE(vrdma_cmd_query_port, 16);
VRDMA_ASSERT_SIZE(vrdma_resp_query_port, 40);
VRDMA_ASSERT_SIZE(vrdma_event, 16);
VRDMA_ASSERT_SIZE(vrdma_cmd_add_gid, 32);
VRDMA_ASSERT_SIZE(vrdma_cmd_del_gid, 16);
VRDMA_ASSERT_SIZE(vrdma_cmd_alloc_ucontext, 8);
VRDMA_ASSERT_SIZE(vrdma_resp_alloc_ucontext, 16);
VRDMA_ASSERT_SIZE(vrdma_cmd_destroy, 16);
VRDMA_ASSERT_SIZE(vrdma_cmd_alloc_pd, 16);
VRDMA_ASSERT_SIZE(vrdma_resp_alloc_pd, 16);
VRDMA_ASSERT_SIZE(vrdma_alloc_ucontext_resp, 16);
VRDMA_ASSERT_SIZE(vrdma_alloc_pd_resp, 8);

#endif /* VRDMA_ABI_H */
