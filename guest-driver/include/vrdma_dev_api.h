/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR BSD-2-Clause */
/*
 * vrdma device API: what the device (the vrdma backend on the host) and its guest drivers say to each other.
 * Config space, doorbell region, control commands and their statuses, events, and the ring formats (WQEs, CQEs,
 * ring headers, doorbell slots) that the guest kernel driver (vrdma.ko) and the rdma-core provider (libvrdma)
 * write and the device reads. What passes between vrdma.ko and libvrdma alone (udata) is the user ABI, in
 * uapi/rdma/vrdma-abi.h, where rdma-core expects it.
 *
 * Rules that keep it one definition:
 * - fixed-width little-endian types, explicit padding, no bit-fields, no packed attribute;
 * - everything between DEVICE-API-BEGIN and DEVICE-API-END is plain integer #defines and struct definitions, so
 *   that the backend loads this very text (with cffi) instead of declaring the layouts again;
 * - every struct's size is checked at compile time below, and the backend checks the same numbers.
 * See docs/device-interface.md for what the fields mean.
 */
#ifndef VRDMA_DEV_API_H
#define VRDMA_DEV_API_H

#include <linux/types.h>

/* DEVICE-API-BEGIN */
#define VRDMA_ABI_VERSION 8
#define VRDMA_VIRTIO_ID 42

/* Virtqueues */
#define VRDMA_QUEUE_CONTROL 0
#define VRDMA_QUEUE_EVENT 1
#define VRDMA_QUEUE_WAKE 2        /* no buffers: a notification wakes the device's parked data engine */
#define VRDMA_NUM_QUEUES 3

/*
 * Doorbell region (ivshmem-plain BAR2): page 0 is the header, page 1 the first of the kernel's (the queues of
 * context 0, the guest kernel's own consumers; mapped into the kernel only), then the user contexts' pages. Every
 * context starts with one page and is given more as its queues fill them; a page stays with its context until the
 * context goes (so no process ever maps a page that another context's queues use).
 */
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

/* Control commands */
#define VRDMA_CMD_QUERY_DEVICE 1
#define VRDMA_CMD_QUERY_PORT 2
#define VRDMA_CMD_ADD_GID 3
#define VRDMA_CMD_DEL_GID 4
#define VRDMA_CMD_ALLOC_UCONTEXT 5
#define VRDMA_CMD_DEALLOC_UCONTEXT 6
#define VRDMA_CMD_ALLOC_PD 7
#define VRDMA_CMD_DEALLOC_PD 8
#define VRDMA_CMD_REG_MR 9
#define VRDMA_CMD_DEREG_MR 10
#define VRDMA_CMD_CREATE_CQ 11
#define VRDMA_CMD_DESTROY_CQ 12
#define VRDMA_CMD_CREATE_QP 13
#define VRDMA_CMD_MODIFY_QP 14
#define VRDMA_CMD_QUERY_QP 15
#define VRDMA_CMD_DESTROY_QP 16
#define VRDMA_CMD_CREATE_SRQ 17
#define VRDMA_CMD_MODIFY_SRQ 18
#define VRDMA_CMD_QUERY_SRQ 19
#define VRDMA_CMD_DESTROY_SRQ 20
#define VRDMA_CMD_CREATE_AH 21
#define VRDMA_CMD_DESTROY_AH 22
#define VRDMA_CMD_MODIFY_CQ 23
#define VRDMA_CMD_QUERY_COUNTERS 24
#define VRDMA_CMD_ALLOC_XRCD 25
#define VRDMA_CMD_DEALLOC_XRCD 26
#define VRDMA_CMD_QUERY_QP_COUNTERS 27
#define VRDMA_CMD_ALLOC_MR 28
#define VRDMA_CMD_ALLOC_MW 29
#define VRDMA_CMD_DEALLOC_MW 30
#define VRDMA_CMD_REREG_MR 31

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
#define VRDMA_QP_STATE 0x1
#define VRDMA_QP_CUR_STATE 0x2
#define VRDMA_QP_EN_SQD_ASYNC_NOTIFY 0x4
#define VRDMA_QP_ACCESS_FLAGS 0x8
#define VRDMA_QP_PKEY_INDEX 0x10
#define VRDMA_QP_PORT 0x20
#define VRDMA_QP_QKEY 0x40
#define VRDMA_QP_AV 0x80
#define VRDMA_QP_PATH_MTU 0x100
#define VRDMA_QP_TIMEOUT 0x200
#define VRDMA_QP_RETRY_CNT 0x400
#define VRDMA_QP_RNR_RETRY 0x800
#define VRDMA_QP_RQ_PSN 0x1000
#define VRDMA_QP_MAX_QP_RD_ATOMIC 0x2000
#define VRDMA_QP_ALT_PATH 0x4000
#define VRDMA_QP_MIN_RNR_TIMER 0x8000
#define VRDMA_QP_SQ_PSN 0x10000
#define VRDMA_QP_MAX_DEST_RD_ATOMIC 0x20000
#define VRDMA_QP_PATH_MIG_STATE 0x40000
#define VRDMA_QP_CAP 0x80000
#define VRDMA_QP_DEST_QPN 0x100000
#define VRDMA_SRQ_MAX_WR 0x1
#define VRDMA_SRQ_LIMIT 0x2

/* Work requests (opcode and send_flags: the libibverbs values) */
#define VRDMA_WR_RDMA_WRITE 0
#define VRDMA_WR_RDMA_WRITE_WITH_IMM 1
#define VRDMA_WR_SEND 2
#define VRDMA_WR_SEND_WITH_IMM 3
#define VRDMA_WR_RDMA_READ 4
#define VRDMA_WR_ATOMIC_CMP_AND_SWP 5
#define VRDMA_WR_ATOMIC_FETCH_AND_ADD 6
#define VRDMA_WR_LOCAL_INV 7          /* imm_data: the key of a fast-registration MR or a type 2 window to invalidate */
#define VRDMA_WR_BIND_MW 8            /* the WQE's bind part binds a memory window to a range of an MR */
#define VRDMA_WR_SEND_WITH_INV 9      /* a SEND; imm_data: the key the responder invalidates (an MR of its PD) */
#define VRDMA_WR_REG_MR 0x20          /* fast registration: the WQE's reg part maps a fast-registration MR */
#define VRDMA_SEND_FENCE 1
#define VRDMA_SEND_SIGNALED 2
#define VRDMA_SEND_SOLICITED 4
#define VRDMA_SEND_INLINE 8

/* Work completions (status, opcode and flags: the libibverbs values) */
#define VRDMA_WC_SUCCESS 0
#define VRDMA_WC_LOC_LEN_ERR 1
#define VRDMA_WC_LOC_QP_OP_ERR 2
#define VRDMA_WC_LOC_PROT_ERR 4
#define VRDMA_WC_WR_FLUSH_ERR 5
#define VRDMA_WC_MW_BIND_ERR 6
#define VRDMA_WC_LOC_ACCESS_ERR 8
#define VRDMA_WC_REM_INV_REQ_ERR 9
#define VRDMA_WC_REM_ACCESS_ERR 10
#define VRDMA_WC_REM_OP_ERR 11
#define VRDMA_WC_RETRY_EXC_ERR 12
#define VRDMA_WC_RNR_RETRY_EXC_ERR 13
#define VRDMA_WC_FATAL_ERR 15
#define VRDMA_WC_GENERAL_ERR 21
#define VRDMA_WC_OP_SEND 0
#define VRDMA_WC_OP_RDMA_WRITE 1
#define VRDMA_WC_OP_RDMA_READ 2
#define VRDMA_WC_OP_COMP_SWAP 3
#define VRDMA_WC_OP_FETCH_ADD 4
#define VRDMA_WC_OP_BIND_MW 5
#define VRDMA_WC_OP_LOCAL_INV 6
#define VRDMA_WC_OP_REG_MR 8
#define VRDMA_WC_OP_RECV 128
#define VRDMA_WC_OP_RECV_RDMA_WITH_IMM 129
#define VRDMA_WC_GRH 1
#define VRDMA_WC_WITH_IMM 2
#define VRDMA_WC_WITH_INV 4       /* a SEND_WITH_INV arrived: imm_data holds the key it invalidated */

/*
 * A context's doorbell page (a user context's, or the kernel's): 32-bit slots. Slot 0 is the device's: nonzero while its data engine is parked,
 * and then whoever rings a send queue doorbell also wakes it (VRDMA_QUEUE_WAKE, through the kernel). Every other
 * slot belongs to one queue the device handed it to at creation: a send queue, receive queue or SRQ slot holds
 * that ring's producer index (free-running, WQEs posted so far), a CQ slot holds the CQ's arm request
 * (VRDMA_CQ_ARM_* in the low bits above a sequence number the provider increments on every request).
 */
#define VRDMA_DB_SLOTS 1024
#define VRDMA_DB_SLOT_PARKED 0
/*
 * The device names a queue's slot by its doorbell index: page * VRDMA_DB_SLOTS + slot, the slot's 32-bit word
 * in the region.
 */
#define VRDMA_DB_PAGE(index) ((index) / VRDMA_DB_SLOTS)
#define VRDMA_DB_SLOT(index) ((index) % VRDMA_DB_SLOTS)
/*
 * The last slot is the device's too: nonzero (VRDMA_DB_ALIVE) from the moment the context is allocated until the
 * device forgets it. The device clears it when the context goes, when the device is reset and when a restarted
 * backend finds the region; the kernel's disassociation of a dead device maps a zero page in its place. A provider
 * whose CQ is empty reads it: zero means the device lost the context, and every outstanding work request is
 * flushed (IBV_WC_WR_FLUSH_ERR) instead of waiting for completions that will never come.
 */
#define VRDMA_DB_SLOT_ALIVE 1023     /* VRDMA_DB_SLOTS - 1 */
#define VRDMA_DB_ALIVE 0x414c4956     /* "VILA" */
#define VRDMA_CQ_ARM_NEXT 1
#define VRDMA_CQ_ARM_SOLICITED 2
#define VRDMA_CQ_ARM_SEQ_SHIFT 2

/*
 * Ring buffers live in guest (user) memory, page-aligned, starting with one header page:
 * CQ:  header page (struct vrdma_cq_ring_hdr), then entries * struct vrdma_cqe
 * QP:  header page (struct vrdma_qp_ring_hdr), send queue at sq_offset, receive queue at rq_offset
 * SRQ: header page (struct vrdma_srq_ring_hdr), then depth * rq_stride
 * Depths are powers of two; strides are powers of two between 64 (send) or 32 (receive) and 4096 bytes, so no
 * entry crosses a page. Indices are free-running 32-bit counters; slot = index & (depth - 1).
 */

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
	__le32 max_fast_reg_pages;  /* pages a fast-registration MR maps at most (ALLOC_MR, REG_MR work requests) */
};

struct vrdma_cmd_query_port {
	struct vrdma_cmd_hdr hdr;
	__u8 port;                /* 1: the device has one port */
	__u8 reserved[7];
};

/* QUERY_COUNTERS (request: struct vrdma_cmd_query_port): the port's counters, kept by the device's data engine. */
struct vrdma_resp_query_counters {
	struct vrdma_resp_hdr hdr;
	__le64 send_wqes;         /* send WQEs executed, successfully or not */
	__le64 recv_wqes;         /* receive WQEs consumed */
	__le64 cqes;
	__le64 bytes;             /* payload moved into or out of this VM's memory */
	__le64 error_cqes;
	__le64 flushed;
	__le64 rnr_waits;
	__le64 cq_overflows;
	__le64 qp_fatal;
	__le64 events_dropped;
	__le64 ud_dropped;        /* datagrams nobody took */
	__le64 uc_dropped;        /* UC messages lost (no destination ready, no receive, a bad rkey or receive) */
};

/*
 * QUERY_QP_COUNTERS (request: struct vrdma_cmd_destroy, the QP's handle): one QP's share of the port's counters of
 * the same names, from its creation on (a QP's value never exceeds the port's).
 */
struct vrdma_resp_query_qp_counters {
	struct vrdma_resp_hdr hdr;
	__le64 send_wqes;         /* its send WQEs executed, successfully or not */
	__le64 recv_wqes;         /* receive WQEs it consumed (from its receive queue or its SRQ) */
	__le64 bytes;             /* payload of the requests it made or served, and of datagrams it sent or took */
	__le64 error_cqes;        /* its completions in error, flushes included */
	__le64 flushed;           /* its WQEs completed with WR_FLUSH_ERR */
	__le64 rnr_waits;         /* receiver-not-ready waits of its requests */
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

/* A user context: the device gives it its own doorbell page (and more as its queues need them). */
struct vrdma_cmd_alloc_ucontext {
	struct vrdma_cmd_hdr hdr;
};

struct vrdma_resp_alloc_ucontext {
	struct vrdma_resp_hdr hdr;
	__le32 handle;
	__le32 doorbell_page;     /* its first page in the doorbell region: 2 .. doorbell_pages - 1 */
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

/* An XRC domain: the device's, not a context's (processes share one through the kernel's XRCD file). */
struct vrdma_cmd_alloc_xrcd {
	struct vrdma_cmd_hdr hdr;
};

struct vrdma_resp_alloc_xrcd {
	struct vrdma_resp_hdr hdr;
	__le32 handle;
	__le32 reserved;
};

struct vrdma_page_list {
	__le64 addr;              /* guest-physical address of the page-list page (levels 1) or directory (2) */
	__le32 npages;            /* data pages */
	__le32 levels;            /* 1 or 2 */
};

struct vrdma_cmd_reg_mr {
	struct vrdma_cmd_hdr hdr;
	__le32 pd;
	__le32 access;            /* VRDMA_ACCESS_* */
	__le64 iova;              /* address of the MR's first byte in its address space (what SGEs name) */
	__le64 length;
	__le32 page_offset;       /* offset of the first byte in the first page */
	__le32 reserved;
	struct vrdma_page_list pages;
};

/*
 * ALLOC_MR: a fast-registration MR of a PD, with room for max_pages pages and nothing mapped: REG_MR work requests
 * map it (and give it a new key each time), LOCAL_INV and SEND_WITH_INV work requests unmap it; DEREG_MR frees it.
 * Its lkey and rkey are one key.
 */
struct vrdma_cmd_alloc_mr {
	struct vrdma_cmd_hdr hdr;
	__le32 pd;
	__le32 max_pages;         /* 1 .. max_fast_reg_pages */
};

struct vrdma_resp_alloc_mr {
	struct vrdma_resp_hdr hdr;
	__le32 handle;
	__le32 key;
};

struct vrdma_resp_reg_mr {
	struct vrdma_resp_hdr hdr;
	__le32 handle;
	__le32 lkey;
	__le32 rkey;
	__le32 reserved;
};

/*
 * REREG_MR: change what an MR (of REG_MR) is, keeping its handle and keys. flags (the IB values): CHANGE_TRANSLATION
 * takes iova, length, page_offset and pages as REG_MR does; CHANGE_PD moves it to pd; CHANGE_ACCESS gives it access.
 * Fields of a change not asked for are ignored. Windows bound to the MR are unbound by any change. On failure the MR
 * is as it was.
 */
#define VRDMA_REREG_TRANSLATION 1
#define VRDMA_REREG_PD 2
#define VRDMA_REREG_ACCESS 4

struct vrdma_cmd_rereg_mr {
	struct vrdma_cmd_hdr hdr;
	__le32 handle;
	__le32 flags;             /* VRDMA_REREG_* */
	__le32 pd;
	__le32 access;
	__le64 iova;
	__le64 length;
	__le32 page_offset;
	__le32 reserved;
	struct vrdma_page_list pages;
};

/*
 * ALLOC_MW: a memory window of a PD, type 1 or 2, bound to nothing. BIND_MW work requests of its PD's RC, UC and XRC
 * QPs bind it to a range of an MR that has VRDMA_ACCESS_MW_BIND (a type 1 window again and again; a type 2 window
 * only when free, and it is then the binding QP's alone); LOCAL_INV and SEND_WITH_INV free a type 2 window. Windows
 * and MRs share the device's key table (max_mr). DEALLOC_MW (struct vrdma_cmd_destroy) frees it.
 */
struct vrdma_cmd_alloc_mw {
	struct vrdma_cmd_hdr hdr;
	__le32 pd;
	__le32 type;              /* 1 or 2 */
};

struct vrdma_resp_alloc_mw {
	struct vrdma_resp_hdr hdr;
	__le32 handle;
	__le32 rkey;
};

struct vrdma_cmd_create_cq {
	struct vrdma_cmd_hdr hdr;
	__le32 ucontext;          /* the owning user context, 0: the kernel (its doorbell page gets the CQ's arm slot) */
	__le32 entries;           /* ring entries, a power of two */
	struct vrdma_page_list ring;
};

struct vrdma_resp_create_cq {
	struct vrdma_resp_hdr hdr;
	__le32 handle;
	__le32 db_index;          /* its arm slot: a doorbell index (VRDMA_DB_PAGE, VRDMA_DB_SLOT) of a page of the context */
};

/* CQ moderation: one completion event per cq_count completions, or cq_period microseconds after the first. */
struct vrdma_cmd_modify_cq {
	struct vrdma_cmd_hdr hdr;
	__le32 handle;
	__le16 cq_count;          /* 0 or 1: an event for the first completion, as without moderation */
	__le16 cq_period;         /* 0: no timer */
};

struct vrdma_cmd_create_qp {
	struct vrdma_cmd_hdr hdr;
	__le32 ucontext;
	__le32 pd;
	__le32 send_cq;
	__le32 recv_cq;
	__le32 srq;               /* 0: the QP has its own receive queue */
	__u8 qp_type;             /* VRDMA_QPT_RC, _UC, _UD, _GSI (the kernel's, one per device: QPN 1), _XRC_* */
	__u8 sq_sig_all;
	__u8 reserved0[2];
	__le32 sq_depth;
	__le32 rq_depth;          /* 0 with an SRQ */
	__le32 sq_stride;
	__le32 rq_stride;
	__le32 sq_offset;         /* byte offsets of the rings in the buffer, page-aligned, after the header page */
	__le32 rq_offset;
	__le32 max_send_sge;
	__le32 max_recv_sge;
	__le32 max_inline_data;
	/*
	 * XRC_TGT: its XRC domain, and nothing else (no PD, CQs, rings or context: the kernel's, ucontext 0). XRC_INI:
	 * 0, a send queue and send CQ only (no receive queue, recv_cq 0). Other types: 0.
	 */
	__le32 xrcd;
	struct vrdma_page_list ring;
};

struct vrdma_resp_create_qp {
	struct vrdma_resp_hdr hdr;
	__le32 handle;
	__le32 qpn;
	__le32 sq_db_index;       /* doorbell indexes, in pages of the context */
	__le32 rq_db_index;       /* 0 with an SRQ */
};

struct vrdma_qp_attr {
	__le32 qp_state;
	__le32 cur_qp_state;
	__le32 path_mtu;
	__le32 qp_access_flags;
	__le32 rq_psn;
	__le32 sq_psn;
	__le32 dest_qp_num;
	__le32 qkey;
	__u8 sq_draining;
	__u8 max_rd_atomic;
	__u8 max_dest_rd_atomic;
	__u8 min_rnr_timer;
	__u8 timeout;
	__u8 retry_cnt;
	__u8 rnr_retry;
	__u8 port_num;
	__le16 pkey_index;
	__u8 sgid_index;
	__u8 hop_limit;
	__le32 flow_label;
	__u8 dgid[16];
	__u8 traffic_class;
	__u8 en_sqd_async_notify;
	__u8 reserved[2];
	__le32 max_send_wr;       /* capabilities, reported by QUERY_QP */
	__le32 max_recv_wr;
	__le32 max_send_sge;
	__le32 max_recv_sge;
	__le32 max_inline_data;
	__le32 reserved1;
};

struct vrdma_cmd_modify_qp {
	struct vrdma_cmd_hdr hdr;
	__le32 handle;
	__le32 attr_mask;         /* VRDMA_QP_* */
	struct vrdma_qp_attr attr;
};

struct vrdma_resp_query_qp {
	struct vrdma_resp_hdr hdr;
	struct vrdma_qp_attr attr;
};

struct vrdma_cmd_create_srq {
	struct vrdma_cmd_hdr hdr;
	__le32 ucontext;
	__le32 pd;
	__le32 depth;
	__le32 stride;
	__le32 max_sge;
	__le32 srq_limit;
	__le32 xrcd;              /* 0: a basic SRQ; else an XRC SRQ of this XRC domain ... */
	__le32 cq;                /* ... whose receives complete on this CQ (of its context); 0 for a basic SRQ */
	struct vrdma_page_list ring;
};

struct vrdma_resp_create_srq {
	struct vrdma_resp_hdr hdr;
	__le32 handle;
	__le32 db_index;
	__le32 srq_num;           /* what an XRC initiator's send names it by (24 bits) */
	__le32 reserved;
};

struct vrdma_cmd_modify_srq {
	struct vrdma_cmd_hdr hdr;
	__le32 handle;
	__le32 attr_mask;         /* VRDMA_SRQ_* */
	__le32 max_wr;
	__le32 srq_limit;
};

struct vrdma_resp_query_srq {
	struct vrdma_resp_hdr hdr;
	__le32 max_wr;
	__le32 max_sge;
	__le32 srq_limit;
	__le32 reserved;
};

struct vrdma_cmd_create_ah {
	struct vrdma_cmd_hdr hdr;
	__le32 pd;
	__le32 flow_label;
	__u8 dgid[16];
	__u8 sgid_index;
	__u8 hop_limit;
	__u8 traffic_class;
	__u8 reserved[5];
};

struct vrdma_resp_create_ah {
	struct vrdma_resp_hdr hdr;
	__le32 handle;
	__le32 reserved;
};

/* Rings in guest memory */
struct vrdma_sge {
	__le64 addr;
	__le32 length;
	__le32 lkey;
};

/*
 * Where a UD or GSI send goes: the address handle's content, carried in the WQE itself (the kernel creates address
 * handles where it cannot sleep, so they cannot be device objects). The source is not the sender's to say: the
 * device stamps the GID at sgid_index of the sender's own GID table.
 */
struct vrdma_ud_av {
	__u8 dgid[16];
	__le32 remote_qpn;
	__le32 remote_qkey;       /* with VRDMA_QKEY_PRIVILEGED: the sending QP's own Q_Key */
	__u8 sgid_index;
	__u8 hop_limit;
	__u8 traffic_class;
	__u8 reserved0;
	__le32 flow_label;
	__le32 reserved1[2];
};

/* A send WQE: this header, then num_sge struct vrdma_sge or, with VRDMA_SEND_INLINE, inline_len bytes. */
struct vrdma_send_wqe {
	__le64 wr_id;
	__u8 opcode;              /* VRDMA_WR_* */
	__u8 send_flags;          /* VRDMA_SEND_* */
	__u8 num_sge;
	__u8 reserved0;
	__le32 imm_data;          /* carried as given (network order for libibverbs) */
	__le32 inline_len;
	__le32 rkey;
	union {
		struct {          /* RC, UC and XRC: RDMA and atomics */
			__le64 remote_addr;
			__le64 compare_add;
			__le64 swap;
			__le32 xrc_srqn;  /* XRC_INI: the target side's XRC SRQ the message is for */
			__le32 reserved1[3];
		};
		struct vrdma_ud_av ud;    /* UD and GSI */
		struct {          /* REG_MR: map the fast-registration MR whose slot `key` names */
			__le64 iova;      /* its first byte's address; the first page's offset is iova's */
			__le64 length;
			__le64 page_list; /* guest-physical address of npages __le64 page addresses, inside one page */
			__le32 key;       /* its new lkey and rkey: the same slot bits, a new low byte */
			__le32 access;    /* VRDMA_ACCESS_* */
			__le32 npages;    /* 4 KiB pages, 1 .. the MR's max_pages */
			__le32 reserved2;
		} reg;
		struct {          /* BIND_MW: bind the window whose key is mw_rkey to [addr, addr + length) of an MR */
			__le64 addr;      /* in the MR's address space (no zero-based windows) */
			__le64 length;    /* 0: unbind */
			__le32 mr_lkey;   /* the MR: of the QP's PD, with VRDMA_ACCESS_MW_BIND */
			__le32 mw_rkey;   /* the window's key (its low byte aside: the consumer's) */
			__le32 new_rkey;  /* its key from now: mw_rkey with another VRDMA_KEY_CONSUMER_MASK part */
			__le32 access;    /* VRDMA_MW_ACCESS bits */
		} bind;
	};
};

/* A receive WQE: this header, then num_sge struct vrdma_sge. */
struct vrdma_recv_wqe {
	__le64 wr_id;
	__le32 num_sge;
	__le32 reserved;
};

struct vrdma_cqe {
	__le64 wr_id;
	__u8 status;              /* VRDMA_WC_* */
	__u8 opcode;              /* VRDMA_WC_OP_* */
	__u8 wc_flags;            /* VRDMA_WC_GRH, VRDMA_WC_WITH_IMM */
	__u8 network_hdr_type;    /* VRDMA_NETWORK_* of a UD receive's header, 0 otherwise */
	__le32 byte_len;
	__le32 imm_data;
	__le32 qp_num;
	__le32 src_qp;
	__le32 reserved1;
};

struct vrdma_cq_ring_hdr {
	__le32 prod;              /* device: CQEs written (free-running) */
	__le32 cons;              /* provider: CQEs consumed (free-running) */
	__le32 overflow;          /* device: nonzero once a CQE found the ring full */
	__le32 reserved[5];
};

struct vrdma_qp_ring_hdr {
	__le32 sq_cons;           /* device: send WQEs finished (their slots may be reused) */
	__le32 rq_cons;           /* device: receive WQEs consumed */
	__le32 reserved[6];
};

struct vrdma_srq_ring_hdr {
	__le32 cons;              /* device: receive WQEs consumed */
	__le32 reserved[7];
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
VRDMA_ASSERT_SIZE(vrdma_cmd_hdr, 8);
VRDMA_ASSERT_SIZE(vrdma_resp_hdr, 8);
VRDMA_ASSERT_SIZE(vrdma_cmd_query_device, 8);
VRDMA_ASSERT_SIZE(vrdma_resp_query_device, 120);
VRDMA_ASSERT_SIZE(vrdma_cmd_query_port, 16);
VRDMA_ASSERT_SIZE(vrdma_resp_query_port, 40);
VRDMA_ASSERT_SIZE(vrdma_resp_query_counters, 104);
VRDMA_ASSERT_SIZE(vrdma_resp_query_qp_counters, 56);
VRDMA_ASSERT_SIZE(vrdma_cmd_alloc_mr, 16);
VRDMA_ASSERT_SIZE(vrdma_resp_alloc_mr, 16);
VRDMA_ASSERT_SIZE(vrdma_event, 16);
VRDMA_ASSERT_SIZE(vrdma_cmd_add_gid, 32);
VRDMA_ASSERT_SIZE(vrdma_cmd_del_gid, 16);
VRDMA_ASSERT_SIZE(vrdma_cmd_alloc_ucontext, 8);
VRDMA_ASSERT_SIZE(vrdma_resp_alloc_ucontext, 16);
VRDMA_ASSERT_SIZE(vrdma_cmd_destroy, 16);
VRDMA_ASSERT_SIZE(vrdma_cmd_alloc_pd, 16);
VRDMA_ASSERT_SIZE(vrdma_resp_alloc_pd, 16);
VRDMA_ASSERT_SIZE(vrdma_cmd_alloc_xrcd, 8);
VRDMA_ASSERT_SIZE(vrdma_resp_alloc_xrcd, 16);
VRDMA_ASSERT_SIZE(vrdma_page_list, 16);
VRDMA_ASSERT_SIZE(vrdma_cmd_reg_mr, 56);
VRDMA_ASSERT_SIZE(vrdma_resp_reg_mr, 24);
VRDMA_ASSERT_SIZE(vrdma_cmd_rereg_mr, 64);
VRDMA_ASSERT_SIZE(vrdma_cmd_alloc_mw, 16);
VRDMA_ASSERT_SIZE(vrdma_resp_alloc_mw, 16);
VRDMA_ASSERT_SIZE(vrdma_cmd_create_cq, 32);
VRDMA_ASSERT_SIZE(vrdma_resp_create_cq, 16);
VRDMA_ASSERT_SIZE(vrdma_cmd_modify_cq, 16);
VRDMA_ASSERT_SIZE(vrdma_cmd_create_qp, 88);
VRDMA_ASSERT_SIZE(vrdma_resp_create_qp, 24);
VRDMA_ASSERT_SIZE(vrdma_qp_attr, 92);
VRDMA_ASSERT_SIZE(vrdma_cmd_modify_qp, 108);
VRDMA_ASSERT_SIZE(vrdma_resp_query_qp, 100);
VRDMA_ASSERT_SIZE(vrdma_cmd_create_srq, 56);
VRDMA_ASSERT_SIZE(vrdma_resp_create_srq, 24);
VRDMA_ASSERT_SIZE(vrdma_cmd_modify_srq, 24);
VRDMA_ASSERT_SIZE(vrdma_resp_query_srq, 24);
VRDMA_ASSERT_SIZE(vrdma_cmd_create_ah, 40);
VRDMA_ASSERT_SIZE(vrdma_resp_create_ah, 16);
VRDMA_ASSERT_SIZE(vrdma_sge, 16);
VRDMA_ASSERT_SIZE(vrdma_ud_av, 40);
VRDMA_ASSERT_SIZE(vrdma_send_wqe, 64);
VRDMA_ASSERT_SIZE(vrdma_recv_wqe, 16);
VRDMA_ASSERT_SIZE(vrdma_cqe, 32);
VRDMA_ASSERT_SIZE(vrdma_cq_ring_hdr, 32);
VRDMA_ASSERT_SIZE(vrdma_qp_ring_hdr, 32);
VRDMA_ASSERT_SIZE(vrdma_srq_ring_hdr, 32);

#endif /* VRDMA_DEV_API_H */
