/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR BSD-2-Clause */
/*
 * The rings in guest memory: work requests and their flags, work completions, the doorbell page's slots, and the
 * formats of SGEs, WQEs, CQEs and ring headers. The guest kernel driver (vrdma.ko) and the rdma-core provider
 * (libvrdma) write them, the device's data engine reads them.
 * Part of the device API (vrdma_dev_api.h includes it; include that one): the same rules hold.
 */
#ifndef VRDMA_DEV_RING_H
#define VRDMA_DEV_RING_H

#ifndef VRDMA_DEV_API_H
#error "include vrdma_dev_api.h, which includes this header after what it builds on"
#endif

/* DEVICE-API-BEGIN */
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
/* DEVICE-API-END */

VRDMA_ASSERT_SIZE(vrdma_sge, 16);
VRDMA_ASSERT_SIZE(vrdma_ud_av, 40);
VRDMA_ASSERT_SIZE(vrdma_send_wqe, 64);
VRDMA_ASSERT_SIZE(vrdma_recv_wqe, 16);
VRDMA_ASSERT_SIZE(vrdma_cqe, 32);
VRDMA_ASSERT_SIZE(vrdma_cq_ring_hdr, 32);
VRDMA_ASSERT_SIZE(vrdma_qp_ring_hdr, 32);
VRDMA_ASSERT_SIZE(vrdma_srq_ring_hdr, 32);

#endif /* VRDMA_DEV_RING_H */
