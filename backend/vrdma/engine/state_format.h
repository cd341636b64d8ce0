/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * The format of a device's state (engine.h's vre_device_save and vre_device_load; state.c writes it, restore.c reads
 * and checks it; docs/migration.md): little-endian, fixed-size records, version VRE_STATE_VERSION. Included by
 * engine.h, whose types it uses; the text between ENGINE-API-BEGIN and -END is part of the cffi declaration.
 */
#ifndef VRDMA_ENGINE_STATE_FORMAT_H
#define VRDMA_ENGINE_STATE_FORMAT_H

/* ENGINE-API-BEGIN */
#define VRE_STATE_MAGIC 0x53414456   /* "VDAS" in its little-endian bytes */
#define VRE_STATE_VERSION 1

struct vre_state_header {
	uint32_t magic;
	uint32_t version;
	uint64_t bytes;           /* the whole state, this header included */
	uint32_t records;
	uint32_t max_mr;          /* the tables it was saved from: slots, keys and QPNs name them */
	uint32_t max_cq;
	uint32_t max_srq;
	uint32_t max_qp;
	uint32_t reserved;
	uint64_t mr_gen;          /* the device's MRs made so far (struct vre_mr.gen) */
	struct vre_counters counters;
	struct vre_roce_counters roce;
};

/* Each object: this header, its kind's struct, `npages` guest-physical page addresses (8 bytes each), and a QP's
 * held receive WQE. */
#define VRE_STATE_MR 1
#define VRE_STATE_CQ 2
#define VRE_STATE_SRQ 3
#define VRE_STATE_QP 4

struct vre_state_record {
	uint32_t kind;            /* VRE_STATE_*: every MR first, then CQs, SRQs, QPs (each names only earlier ones) */
	uint32_t slot;
	uint32_t bytes;           /* the record: this header, its struct, its pages */
	uint32_t npages;
};

struct vre_state_mr {
	struct vre_mr_config cfg; /* as the engine has it now (a fast registration or a bind changes it); pages: none */
	uint64_t gen;
	uint64_t target_gen;      /* a window: the MR it is bound to, and that MR's generation then */
	uint32_t target_slot;
	uint32_t bound_qpn;
	uint32_t mapped;          /* a fast-registration MR mapped, a window bound */
	uint32_t reserved;
};

struct vre_state_cq {
	struct vre_cq_config cfg;
	uint32_t prod;
	uint32_t arm_done;
	uint32_t error;
	uint32_t mod_count;
	uint32_t mod_period_us;
	uint32_t mod_pending;
	uint32_t ring_valid;      /* 0: a memory-table change had left its ring without memory (it stays so) */
	uint32_t reserved;
	int64_t mod_left_ns;      /* what was left of its moderation period (0: no timer) */
};

struct vre_state_srq {
	struct vre_srq_config cfg;
	uint32_t cons;
	uint32_t limit;
	uint32_t error;
	uint32_t ring_valid;
};

struct vre_state_qp {
	struct vre_qp_config cfg;
	struct vre_qp_attr attr;
	uint32_t sq_head;
	uint32_t rq_cons;
	uint32_t rnr_left;
	uint32_t retry_left;
	uint32_t piece_opcode;    /* the head WQE's message under way (piece_done 0: none) */
	uint32_t held;            /* 1: a receive is held, its WQE after the pages (struct vrdma_recv_wqe, held_sges SGEs) */
	uint32_t held_sges;       /* the receive a SEND in pieces fills (held): the SGEs its copy has room for */
	uint32_t ring_valid;
	uint32_t remote;          /* 1: its peer is on another host: its RoCE transport state follows (vre_state_remote) */
	uint32_t reserved;
	uint64_t piece_done;
	uint64_t piece_len;
	int64_t rnr_left_ns;      /* what was left of its wait after an RNR or a timeout (0: none) */
	struct vre_qp_counters counters;
};

/*
 * A QP whose peer is on another host carries its RoCE transport state after its held receive: this struct, then an
 * entry per send queue slot (the WQEs started and the PSNs they took), the responder's ring of READs and atomics,
 * and the receive a SEND arriving in packets lands in (rwqe_sges SGEs, when rwqe_held). Its addresses and path MTU
 * are not carried: a destination derives them from the QP's attributes, as a modify does.
 */
#define VRE_STATE_MAX_RD 128

struct vre_state_sent {
	uint32_t first_psn;
	uint32_t npkts;
	uint32_t len;
	uint32_t kind;
};

struct vre_state_rd {
	uint32_t psn;
	uint32_t npkts;
	uint32_t sent;
	uint32_t rkey;
	uint64_t va;
	uint32_t len;
	uint32_t atomic;
	uint32_t answered;
	uint32_t reserved;
	uint64_t orig;
};

struct vre_state_remote {
	uint32_t sq_cur;
	uint32_t sq_next;
	uint32_t cur_psn;
	uint32_t next_psn;
	uint32_t una_psn;
	uint32_t sent_psn;
	uint32_t gap_psn;
	uint32_t gap_asked;
	uint32_t rd_out;
	uint32_t since_ackreq;
	uint32_t epsn;
	uint32_t msn;
	uint32_t nak_sent;
	uint32_t in_send;
	uint32_t in_write;
	uint32_t wr_rkey;
	uint32_t wr_len;
	uint32_t ack_owed;
	uint32_t ack_psn;
	uint32_t ack_aeth;
	uint32_t rd_head;
	uint32_t rd_tail;
	uint32_t rwqe_held;
	uint32_t rwqe_sges;
	uint64_t msg_off;
	uint64_t wr_va;
	int64_t deadline_left_ns; /* what was left of its retransmission timer (0: stopped) */
};
/* ENGINE-API-END */

#endif /* VRDMA_ENGINE_STATE_FORMAT_H */
