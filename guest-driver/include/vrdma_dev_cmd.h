/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR BSD-2-Clause */
/*
 * The control commands on the control virtqueue: their opcodes, statuses, the QP and SRQ modify masks, and every
 * command and response message. The guest kernel driver (vrdma.ko) sends them, the device model executes them.
 * Part of the device API (vrdma_dev_api.h includes it; include that one): the same rules hold.
 */
#ifndef VRDMA_DEV_CMD_H
#define VRDMA_DEV_CMD_H

#ifndef VRDMA_DEV_API_H
#error "include vrdma_dev_api.h, which includes this header after what it builds on"
#endif

/* DEVICE-API-BEGIN */
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
	/* The port's data as a NIC's port counts it: payload this VM's memory gave and took in transfers that
	 * completed, once each, and the packets that carried it (on one host: those the QP's path MTU cuts it into) */
	__le64 tx_bytes;
	__le64 rx_bytes;
	__le64 tx_packets;
	__le64 rx_packets;
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
/* DEVICE-API-END */

VRDMA_ASSERT_SIZE(vrdma_cmd_hdr, 8);
VRDMA_ASSERT_SIZE(vrdma_resp_hdr, 8);
VRDMA_ASSERT_SIZE(vrdma_cmd_query_device, 8);
VRDMA_ASSERT_SIZE(vrdma_resp_query_device, 120);
VRDMA_ASSERT_SIZE(vrdma_cmd_query_port, 16);
VRDMA_ASSERT_SIZE(vrdma_resp_query_port, 40);
VRDMA_ASSERT_SIZE(vrdma_resp_query_counters, 136);
VRDMA_ASSERT_SIZE(vrdma_resp_query_qp_counters, 56);
VRDMA_ASSERT_SIZE(vrdma_cmd_alloc_mr, 16);
VRDMA_ASSERT_SIZE(vrdma_resp_alloc_mr, 16);
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

#endif /* VRDMA_DEV_CMD_H */
