/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * The vrdma data engine: the hot loop of the device, in C, driven by the Python device model.
 *
 * The model (vrdma.device) checks every control command, allocates handles, keys and table slots, and then
 * hands the engine plain configurations: host addresses of guest memory are never passed in, only guest-physical
 * page lists, which the engine translates through the VM's memory table (vre_device_set_memory) and checks. The
 * engine owns the runtime state of MRs, CQs, SRQs and QPs, polls send queue doorbells, validates every WQE,
 * copies data between the registered memory of the VMs it serves, writes CQEs and queues events for the model to
 * deliver. It is single-threaded: every call comes from the backend's event loop, so a control command (a
 * deregistration, a destroy) runs between two pieces of a transfer, never inside one, and each piece checks
 * everything again (poll.c shares the engine between the devices: turns by weight, large messages in pieces).
 *
 * The text between ENGINE-API-BEGIN and ENGINE-API-END is also the cffi declaration (vrdma/engine/_build.py).
 */
#ifndef VRDMA_ENGINE_H
#define VRDMA_ENGINE_H

#include <stddef.h>
#include <stdint.h>

/* ENGINE-API-BEGIN */
#define VRE_NO_DEVICE 0xffffffff
#define VRE_NO_SRQ -1
/* vre_qp_config.flags */
#define VRE_QP_KERNEL 1           /* a queue of the guest kernel: the local DMA lkey works */
#define VRE_QP_UD 2               /* datagrams: SEND with an address vector in the WQE, routed by GID and QPN */
#define VRE_QP_GSI 4              /* the device's QP1 (with VRE_QP_UD): found by QPN 1 */
#define VRE_QP_UC 8               /* unreliable connected: SEND and WRITE (with immediate), nothing acknowledged */
#define VRE_QP_XRC_INI 16         /* XRC initiator: RC operations, each naming an XRC SRQ at the target; no receives */
#define VRE_QP_XRC_TGT 32         /* XRC target: no rings, CQs or PD of its own; takes what XRC initiators send */
#define VRE_SRQ_KERNEL 1          /* vre_srq_config.flags: an SRQ of the guest kernel (the local DMA lkey works) */
#define VRE_MAX_GIDS 64           /* a device's GID table, at most */
#define VRE_MAX_REGIONS 256       /* a device's memory table, at most (a VM's RAM slots; a container's memfds) */

struct vre_engine;

/* One region of a VM's memory table: guest-physical range and where the backend has it mapped. */
struct vre_region {
	uint64_t gpa;
	uint64_t size;
	uint64_t hva;
};

struct vre_device_limits {
	uint32_t max_qp;          /* table sizes: powers of two (keys and QPNs carry the slot in their low bits) */
	uint32_t max_cq;
	uint32_t max_mr;
	uint32_t max_srq;
	uint32_t max_sge;
	uint32_t max_inline;
	uint32_t max_qp_wr;
	uint32_t max_cqe;
	uint32_t max_srq_wr;
	uint32_t max_mr_pages;
	uint32_t doorbell_pages;
	uint32_t max_pages_total; /* pages translated for all of a device's MRs and rings together (the MTT budget) */
	uint64_t max_msg_size;
};

/* A guest-physical page list as the driver described it (struct vrdma_page_list). */
struct vre_pages_desc {
	uint64_t addr;
	uint32_t npages;
	uint32_t levels;
};

struct vre_mr_config {
	uint32_t handle;
	uint32_t pd;
	uint32_t lkey;
	uint32_t rkey;
	uint32_t access;
	uint32_t page_offset;
	uint64_t iova;
	uint64_t length;
	struct vre_pages_desc pages;
	/* Nonzero: a fast-registration MR (ALLOC_MR) with room for this many pages, nothing mapped (no pages, no
	 * length) until a REG_MR work request of its PD maps it. */
	uint32_t max_pages;
	/* 1 or 2: a memory window (ALLOC_MW) of that type, its rkey in rkey, bound to nothing until a BIND_MW work
	 * request of its PD binds it (no lkey, pages, length or access). */
	uint32_t mw_type;
};

struct vre_cq_config {
	uint32_t handle;
	uint32_t entries;
	uint32_t db;              /* doorbell index (VRDMA_DB_PAGE, VRDMA_DB_SLOT) */
	struct vre_pages_desc ring;
};

struct vre_srq_config {
	uint32_t handle;
	uint32_t pd;
	uint32_t depth;
	uint32_t stride;
	uint32_t max_sge;
	uint32_t limit;
	uint32_t db;
	uint32_t flags;           /* VRE_SRQ_* */
	uint32_t xrcd;            /* 0: a basic SRQ; else an XRC SRQ of this XRC domain (a model handle) ... */
	uint32_t cq;              /* ... whose receives complete on this CQ table slot */
	uint32_t srqn;            /* ... named so by XRC initiators: its table slot in the low bits */
	struct vre_pages_desc ring;
};

struct vre_qp_config {
	uint32_t handle;
	uint32_t qpn;
	uint32_t pd;
	uint32_t sq_sig_all;
	uint32_t send_cq;         /* CQ table slots */
	uint32_t recv_cq;
	int32_t srq;              /* SRQ table slot, or VRE_NO_SRQ */
	uint32_t sq_depth;
	uint32_t rq_depth;
	uint32_t sq_stride;
	uint32_t rq_stride;
	uint32_t sq_offset;
	uint32_t rq_offset;
	uint32_t max_send_sge;
	uint32_t max_recv_sge;
	uint32_t max_inline;
	uint32_t sq_db;           /* doorbell indexes; rq_db unused with an SRQ */
	uint32_t rq_db;
	uint32_t flags;           /* VRE_QP_* */
	uint32_t xrcd;            /* an XRC target's XRC domain (a model handle); 0 for other types */
	struct vre_pages_desc ring; /* an XRC target has none (0 pages), an XRC initiator a send queue only */
};

/* What a modify_qp changes; the model has checked the transition and every attribute. */
struct vre_qp_attr {
	uint32_t state;
	uint32_t access_flags;
	uint32_t dest_dev;        /* engine device owning the destination GID, or VRE_NO_DEVICE */
	uint32_t dest_qpn;
	uint32_t min_rnr_timer;
	uint32_t rnr_retry;
	uint32_t retry_cnt;
	uint32_t timeout;
	uint32_t qkey;            /* UD and GSI */
	/* A connected QP whose peer is on another host (dest_dev VRE_NO_DEVICE while the engine has a network):
	 * the path and the packet sequence numbers RoCE needs. */
	uint32_t path_mtu;        /* IB_MTU_256 (1) ... IB_MTU_4096 (5) */
	uint32_t sq_psn;          /* first PSN the requester sends, 24 bits */
	uint32_t rq_psn;          /* first PSN the responder expects */
	uint32_t max_rd_atomic;   /* READs and atomics this QP has outstanding as a requester, at most */
	uint32_t max_dest_rd_atomic; /* ... and as a responder */
	uint8_t sgid[16];         /* its GID (the source address of its packets) and its peer's */
	uint8_t dgid[16];
};

struct vre_event {
	uint32_t dev;
	uint32_t type;            /* VRDMA_EVENT_* */
	uint32_t handle;
	uint32_t reserved;
	uint64_t data;
};

struct vre_counters {
	uint64_t send_wqes;       /* send WQEs executed (successfully or not) */
	uint64_t recv_wqes;       /* receive WQEs consumed */
	uint64_t cqes;
	uint64_t bytes;           /* payload moved into this device's memory or out of it by its requests */
	uint64_t error_cqes;
	uint64_t flushed;
	uint64_t rnr_waits;
	uint64_t cq_overflows;
	uint64_t qp_fatal;
	uint64_t events_dropped;
	uint64_t ud_dropped;      /* datagrams this device sent that nobody took (no such GID or QP, wrong Q_Key, no
				   * receive posted), and datagrams for it it could not take: as UD defines, silently */
	uint64_t uc_dropped;      /* UC messages lost, sent by this device or for it: no destination ready, no receive
				   * posted, a bad rkey or receive (UC has no acknowledgement: the sender succeeds) */
	/* The port's data, as a NIC's port counts it (the guest's PMA PortCountersExt, node_exporter's infiniband
	 * collector): payload this device's memory gave (tx) and took (rx) in messages that completed their transfer,
	 * once each (a RoCE retransmission is in the RoCE counters, not here), and the packets that carried it: over
	 * RoCE the packets themselves; on one host, where a message moves in one copy, the packets the QP's path MTU
	 * would cut it into (a datagram: one). */
	uint64_t tx_bytes;
	uint64_t rx_bytes;
	uint64_t tx_packets;
	uint64_t rx_packets;
};

/*
 * One QP's share of its device's counters (QUERY_QP_COUNTERS, `rdma statistic qp`), from its creation on: each
 * field counts what the device's field of the same name counts, for this QP's work, so a QP's value never exceeds
 * its device's.
 */
struct vre_qp_counters {
	uint64_t send_wqes;       /* its send WQEs executed (successfully or not) */
	uint64_t recv_wqes;       /* receive WQEs it consumed, from its receive queue or its SRQ */
	uint64_t bytes;           /* payload of the requests it made or served (and of datagrams it sent or took) */
	uint64_t error_cqes;      /* its completions in error, flushes included */
	uint64_t flushed;         /* its WQEs completed with WR_FLUSH_ERR */
	uint64_t rnr_waits;       /* receiver-not-ready waits of its requests */
};

/* One device's RoCE traffic (vre_device_roce_counters): what its QPs sent to and took from other hosts. */
struct vre_roce_counters {
	uint64_t tx_packets;      /* packets its QPs sent (first sendings and retransmissions, responses, ACKs) */
	uint64_t rx_packets;      /* packets for its QPs the engine took (parsed, for a QP of it, from its peer) */
	uint64_t retransmits;     /* packets its requesters sent again (after a timeout, a NAK or an RNR NAK) */
	uint64_t timeouts;        /* retransmission timers of its requesters that expired */
	uint64_t seq_naks;        /* sequence-error NAKs its responders sent (a packet ahead of the one expected) */
	uint64_t rnr_naks;        /* RNR NAKs its responders sent (no receive posted) */
	uint64_t duplicates;      /* duplicate requests its responders answered again without executing them twice */
	uint64_t dropped;         /* packets for its QPs that were dropped: stale responses, a QP not ready */
	/* Requests its responders dropped, by the step that dropped them (rresp.c names the steps in order); a UC
	 * message lost at sequence, resource or rkey is in uc_dropped too. */
	uint64_t resp_drop_opcode;     /* not a request the QP takes (an answer; UC: a READ or atomic) */
	uint64_t resp_drop_psn;        /* UC: a middle or last packet of a message a gap lost */
	uint64_t resp_drop_duplicate;  /* a duplicate too old to answer, or naming another request than its PSN's */
	uint64_t resp_drop_length;     /* longer than the path MTU; UC: more (or less) than its WRITE's RETH said */
	uint64_t resp_drop_sequence;   /* UC: out of the order of a message, or a first or middle packet short of MTU */
	uint64_t resp_drop_resource;   /* UC: no receive posted for it */
	uint64_t resp_drop_rkey;       /* UC: a WRITE its rkey does not allow */
};

/* What arrived from the network that no QP took, engine-wide (vre_net_counters); each packet counted once. */
struct vre_net_counters {
	uint64_t rx_packets;      /* every packet given to vre_roce_input */
	uint64_t rx_malformed;    /* not a RoCE v2 packet this device parses (lengths, opcode, version, pad) */
	uint64_t rx_bad_icrc;     /* its invariant CRC is wrong */
	uint64_t rx_no_qp;        /* no device has its destination GID, or no QP there has its destination QPN */
	uint64_t rx_not_peer;     /* the QP is not connected to its source (address or transport) */
	uint64_t rx_dropped;      /* packets for the engine the kernel dropped: its receive rings were full */
	uint64_t tx_packets;      /* packets the engine handed to the network */
	uint64_t tx_dropped;      /* packets the network refused (send errors) or the engine had no room for */
};

/*
 * The scheduler (vre_sched_set): how the engine shares itself between the devices with work. Each device's turn is
 * worth quantum_bytes times its weight of copying, a work request costing wr_cost_bytes on top of its data (what
 * the engine spends on one beyond its bytes); a message longer than piece_bytes moves in pieces of that size, with
 * other QPs' and devices' turns between them, so that a small message never waits behind a whole large one. The
 * sizes follow what the thread's other devices did in the last VRE_RECENT_WORK_NS: while another has sent a small
 * message (at most small_piece_bytes), a device's turn and pieces are worth small_piece_bytes, so that small
 * message's successor waits for a few microseconds of copying less (Justitia splits only while latency-sensitive
 * flows are present); while none has done any work, they are worth solo_bytes, since a device alone on its thread
 * gains nothing from pieces and pays for each pass (16 % of one VM's 1 MiB WRITEs at 64 KiB).
 */
struct vre_sched {
	uint32_t quantum_bytes;
	uint32_t piece_bytes;
	uint32_t wr_cost_bytes;
	uint32_t small_piece_bytes;
	uint32_t solo_bytes;
};
#define VRE_RECENT_WORK_NS 1000000  /* how long a device's work (a small message) sizes its thread's turns */

/* A device's quality of service (vre_device_qos): its weight against the other devices with work (1 ..
 * VRE_MAX_WEIGHT), and its limits as token buckets (0: no limit): payload bytes and work requests per second, each
 * with the burst it may save up (0: one second's worth, at most VRE_MAX_RATE). */
#define VRE_DEFAULT_WEIGHT 100   /* a turn worth the engine's quantum */
#define VRE_MAX_WEIGHT 1000
#define VRE_MAX_RATE 17592186044416  /* 2^44: bytes or work requests per second (16 T), at most */
#define VRE_LATENCY_NORMAL 0      /* a turn a round */
#define VRE_LATENCY_LOW 1         /* a look between every other device's turns, paid from its own turn's worth */

struct vre_qos {
	uint32_t weight;
	uint32_t latency;         /* VRE_LATENCY_* */
	uint64_t bytes_per_s;
	uint64_t bytes_burst;
	uint64_t wrs_per_s;
	uint64_t wrs_burst;
};

/* What a device's share and limits did to it (vre_device_qos_counters), from its opening on. */
struct vre_qos_counters {
	uint64_t turns;           /* scheduler turns in which it had work */
	uint64_t throttled_ns;    /* time its limits held back work it had waiting */
	uint64_t deferred_bytes;  /* bytes of its messages moved in a later turn than their first piece */
	uint64_t pieced_messages; /* messages moved in more than one piece */
};

struct vre_engine *vre_engine_new(uint32_t max_devices);
/* After vre_thread_stop, if its thread was started. */
void vre_engine_free(struct vre_engine *e);
const char *vre_error(struct vre_engine *e);

int vre_device_open(struct vre_engine *e, uint32_t dev, const struct vre_device_limits *limits,
		    uint64_t doorbell_base);
void vre_device_close(struct vre_engine *e, uint32_t dev);
/* The VM's memory table: page-aligned regions; a table refused leaves the device with no memory at all. */
int vre_device_set_memory(struct vre_engine *e, uint32_t dev, const struct vre_region *regions, uint32_t count);
/* While the VM migrates: every guest page the engine writes for it (data, CQEs, ring headers, atomics) is marked in
 * the `bytes`-byte bitmap at `address` (a bit per 4 KiB page from guest address 0, set atomically after the write);
 * 0, 0 stops it. The caller keeps the bitmap mapped until it is replaced or stopped. A device opens without one. */
int vre_device_set_log(struct vre_engine *e, uint32_t dev, uint64_t address, uint64_t bytes);
void vre_device_counters(struct vre_engine *e, uint32_t dev, struct vre_counters *out);
/* The scheduler's sizes: small_piece_bytes <= piece_bytes <= solo_bytes (piece_bytes at most quantum_bytes is not
 * required). */
int vre_sched_set(struct vre_engine *e, const struct vre_sched *sched);
/* A device's weight and limits, at once; its buckets start full. Taken from its next turn on. */
int vre_device_qos(struct vre_engine *e, uint32_t dev, const struct vre_qos *qos);
void vre_device_qos_counters(struct vre_engine *e, uint32_t dev, struct vre_qos_counters *out);

int vre_mr_create(struct vre_engine *e, uint32_t dev, uint32_t slot, const struct vre_mr_config *config);
/* REREG_MR: the MR in `slot` becomes `config` (same keys; pages loaded anew when config has any, else kept); windows
 * bound to it are unbound. On failure it is as it was. */
int vre_mr_rereg(struct vre_engine *e, uint32_t dev, uint32_t slot, const struct vre_mr_config *config);
void vre_mr_destroy(struct vre_engine *e, uint32_t dev, uint32_t slot);
int vre_cq_create(struct vre_engine *e, uint32_t dev, uint32_t slot, const struct vre_cq_config *config);
int vre_cq_moderate(struct vre_engine *e, uint32_t dev, uint32_t slot, uint32_t count, uint32_t period_us);
void vre_cq_destroy(struct vre_engine *e, uint32_t dev, uint32_t slot);
int vre_srq_create(struct vre_engine *e, uint32_t dev, uint32_t slot, const struct vre_srq_config *config);
int vre_srq_set_limit(struct vre_engine *e, uint32_t dev, uint32_t slot, uint32_t limit);
int vre_srq_limit(struct vre_engine *e, uint32_t dev, uint32_t slot);
void vre_srq_destroy(struct vre_engine *e, uint32_t dev, uint32_t slot);
/* A GID of the device's table (type VRDMA_GID_TYPE_*, 0: the entry goes): where datagrams are routed by. */
int vre_gid_set(struct vre_engine *e, uint32_t dev, uint32_t index, const uint8_t *gid, uint32_t type);
/* The device holding GID `gid` (16 bytes), or VRE_NO_DEVICE: the one table connections and packets are routed by. */
uint32_t vre_gid_route(struct vre_engine *e, const uint8_t *gid);
int vre_qp_create(struct vre_engine *e, uint32_t dev, uint32_t slot, const struct vre_qp_config *config);
int vre_qp_modify(struct vre_engine *e, uint32_t dev, uint32_t slot, const struct vre_qp_attr *attr);
int vre_qp_state(struct vre_engine *e, uint32_t dev, uint32_t slot);
int vre_qp_counters(struct vre_engine *e, uint32_t dev, uint32_t slot, struct vre_qp_counters *out);
void vre_qp_destroy(struct vre_engine *e, uint32_t dev, uint32_t slot);

/*
 * A device's state as data (state.c; docs/migration.md), what a migration or an upgrade carries: every object the
 * engine holds for the device, each with the guest-physical pages it was translated from (the guest may have freed
 * the page lists it named) and its runtime state, and the device's own counters. Little-endian, fixed-size records,
 * version VRE_STATE_VERSION; zero-filled where a struct has padding (the bytes leave the process).
 *
 * vre_device_suspend stops a device (its pass, and deliveries into it: senders here wait without spending a retry,
 * packets from other hosts are dropped for their senders to retransmit) or lets it run again; vre_device_save
 * writes a suspended device's state without changing anything (a failed migration resumes the source as it was):
 * buf NULL asks for the size (a shorter buffer: -ENOSPC, nothing written). vre_device_load rebuilds a state in an
 * open device that has no objects, checking every record as strictly as the calls that made its objects (a corrupt,
 * foreign or hostile state is refused with the device left empty) and touching no guest memory; with VRE_LOAD_CHECK
 * it only checks (the pages need no memory table: a destination checks a state before its guest's memory is known),
 * without it every page must translate. A loaded device is suspended until vre_device_suspend(.., 0). The records:
 * state_format.h.
 */
#define VRE_LOAD_CHECK 1
int vre_device_suspend(struct vre_engine *e, uint32_t dev, int suspended);
/* A VM moved from device `from` to device `to` of this engine (a migration between two QEMUs of one backend): every
 * QP of every device whose destination was `from` now delivers into `to`. Under every lock. */
int vre_device_reroute(struct vre_engine *e, uint32_t from, uint32_t to);
int64_t vre_device_save(struct vre_engine *e, uint32_t dev, uint8_t *buf, uint64_t len);
int vre_device_load(struct vre_engine *e, uint32_t dev, const uint8_t *buf, uint64_t len, uint32_t flags);

/*
 * The engine's threads (thread.c). Without them the caller polls (vre_poll, vre_spin, vre_park: in-process tests and
 * fuzzers do). With them each thread polls, spins, parks and wakes by itself for the devices it owns (given out in
 * turn as devices open; a thread with nothing to do takes a busy device from a thread with two or more), and every
 * call of this API from another thread is made under a lock: vre_lock_device for a call about one device (a call
 * naming device `dev`: its objects, its memory, its counters), vre_lock for any other (every device's, the GID
 * index's, the network's). A thread holds a device's lock for that device's turn and lets a waiting caller have it
 * first, so a call waits for at most one turn. The locks are recursive: a caller may hold them across several calls
 * (while guest memory is remapped, say). `events_fd` (an eventfd of the caller's) is written when events wait for
 * vre_take_events, which takes a lock of its own (call it without one).
 */
#define VRE_MAX_THREADS 64

struct vre_thread_config {
	uint32_t budget;          /* vre_poll's */
	uint32_t threads;         /* how many, 1 to VRE_MAX_THREADS */
	uint64_t park_after_ns;   /* idle this long, then park */
	int32_t events_fd;
	int32_t cpus[VRE_MAX_THREADS];  /* thread i runs on CPU cpus[i] only; -1: wherever the kernel puts it */
};

struct vre_thread_stats {
	uint64_t busy_ns;         /* time in passes that did work */
	uint64_t work;            /* WQEs, pieces and packets those passes handled */
	uint64_t passes;
	uint64_t parks;           /* times it parked and slept */
	uint64_t park_declined;   /* times it meant to park and found work in the last look */
	uint64_t woken_by_kick;   /* sleeps a kick ended (a wake-up through the event loop, a control change) */
	uint64_t woken_by_guest;  /* sleeps a guest's wake-up kick ended directly (a device's wake fd) */
	uint64_t woken_by_packet; /* sleeps a RoCE socket ended */
	uint64_t woken_by_time;   /* sleeps a deadline or the recheck period ended */
	uint64_t lock_waits;      /* device turns put off because a caller held or wanted the device */
	uint64_t sleep_ns;        /* time parked */
	uint64_t devices_taken;   /* busy devices it took from a busier thread */
	uint64_t rx_packets;      /* RoCE packets it took from its receive rings (the fanout's share) */
};

/* The threads start with every device open (and those opened later) given out to them; the network must be attached
 * before (vre_net_attach refuses while they run). */
int vre_thread_start(struct vre_engine *e, const struct vre_thread_config *config);
void vre_thread_stop(struct vre_engine *e);
uint32_t vre_thread_count(struct vre_engine *e);
void vre_lock(struct vre_engine *e);
void vre_unlock(struct vre_engine *e);
void vre_lock_device(struct vre_engine *e, uint32_t dev);  /* dev out of range: as vre_lock */
void vre_unlock_device(struct vre_engine *e, uint32_t dev);
/* Wake the parked thread that owns `dev` (a guest's wake-up; new deadlines or limits), or every thread
 * (VRE_NO_DEVICE): no lock. It, vre_thread_stats and vre_device_owner are called from the thread that starts and
 * stops the threads (the threads' array is freed when they stop). */
void vre_kick(struct vre_engine *e, uint32_t dev);
/* While parked, look at the doorbells at least every period_ns even unwoken (0: only when woken). */
void vre_thread_recheck(struct vre_engine *e, uint64_t period_ns);
/* Every thread's, summed (thread VRE_MAX_THREADS), or thread `thread`'s; -1: no such thread. */
int vre_thread_stats(struct vre_engine *e, uint32_t thread, struct vre_thread_stats *out);
/* The eventfd the guest's wake-up kicks arrive on for device `dev` (the wake queue's, read by its owner: never read
 * here), or -1: a parked thread that runs the device watches a duplicate of it, so a guest wakes it in one hop. */
int vre_device_wake_fd(struct vre_engine *e, uint32_t dev, int fd);
/* The device addresses page lists may name from now on, [lo, hi] (0, UINT64_MAX when a device opens): a list, and
 * every page it names, outside them is refused as a page outside guest RAM is. The container channel narrows it to
 * one process's memory around that process's commands (daemon/container.py). */
int vre_device_page_window(struct vre_engine *e, uint32_t dev, uint64_t lo, uint64_t hi);
/* The engine thread that runs device `dev`, or -1. */
int vre_device_owner(struct vre_engine *e, uint32_t dev);

uint32_t vre_poll(struct vre_engine *e, uint32_t budget);
uint32_t vre_spin(struct vre_engine *e, uint32_t budget, uint64_t spin_ns);
uint32_t vre_take_events(struct vre_engine *e, struct vre_event *out, uint32_t max);
int64_t vre_next_deadline(struct vre_engine *e);
int vre_park(struct vre_engine *e);
void vre_unpark(struct vre_engine *e);
/*
 * RoCE v2 on the wire (roce.c): the InfiniBand transport headers a packet to or from another host carries in its
 * UDP payload (port 4791), parsed into and built from this form. The packet's addresses (the IP and UDP headers,
 * which the host's stack writes and strips) go with it for the invariant CRC, which covers them.
 */
#define VRE_ROCE_PORT 4791
#define VRE_ROCE_RETH 1           /* vre_roce_pkt.headers: which extension headers the opcode carries */
#define VRE_ROCE_AETH 2
#define VRE_ROCE_ATOMIC_ETH 4
#define VRE_ROCE_ATOMIC_ACK_ETH 8
#define VRE_ROCE_IMM 16
#define VRE_ROCE_IETH 32
#define VRE_ROCE_DETH 64
#define VRE_ROCE_PAYLOAD 128      /* the opcode may carry data */
#define VRE_ROCE_MAX_HEADERS 40   /* BTH and the largest extension headers an opcode has (AtomicETH: 12 + 28) */

struct vre_roce_addr {
	uint8_t src[16];          /* IPv6, or IPv4-mapped (::ffff:a.b.c.d): then the packet is IPv4 */
	uint8_t dst[16];
	uint16_t sport;           /* UDP, host order */
	uint16_t dport;
	/* IPv4 only: the header's identification and flags/fragment offset words, which the ICRC covers (a socket
	 * that sends unconnected with DF set gets id 0 and DF, 0x4000, from Linux) */
	uint16_t ip_id;
	uint16_t ip_frag;
};

struct vre_roce_pkt {
	uint8_t opcode;
	uint8_t solicited;
	uint8_t migreq;
	uint8_t pad;              /* bytes after the payload to a multiple of 4 */
	uint8_t fecn;
	uint8_t becn;
	uint8_t ackreq;
	uint8_t reserved;
	uint16_t pkey;
	uint16_t headers;         /* VRE_ROCE_*: what the opcode carries (parse fills it; build goes by the opcode) */
	uint32_t dest_qpn;        /* 24 bits */
	uint32_t psn;             /* 24 bits */
	uint64_t va;              /* RETH or AtomicETH */
	uint32_t rkey;            /* RETH or AtomicETH */
	uint32_t dma_len;         /* RETH */
	uint64_t swap_add;        /* AtomicETH */
	uint64_t compare;         /* AtomicETH */
	uint32_t aeth;            /* AETH: syndrome << 24 | MSN */
	uint32_t imm;             /* ImmDt, as on the wire (network order, as libibverbs carries it) */
	uint64_t orig;            /* AtomicAckETH */
	uint32_t inv_rkey;        /* IETH */
	uint32_t qkey;            /* DETH */
	uint32_t src_qpn;         /* DETH */
	uint32_t payload_off;     /* parse: where the payload starts in the UDP payload and its length (no pad) */
	uint32_t payload_len;
};

/* Parse a UDP payload that arrived for port 4791: 0 and *pkt, or -EBADMSG (truncated, an unknown or
 * unsupported opcode, a bad transport version or pad, a length that does not add up) or -EILSEQ (a bad ICRC). */
int vre_roce_parse(const uint8_t *udp_payload, uint32_t len, const struct vre_roce_addr *addr,
		   struct vre_roce_pkt *pkt);
/* Build a packet's UDP payload into buf (room bytes): headers, payload_len bytes of payload, pad, ICRC. Its length,
 * or -EINVAL (unknown opcode, a payload it may not carry) or -ENOSPC. */
int vre_roce_build(uint8_t *buf, uint32_t room, const struct vre_roce_addr *addr, const struct vre_roce_pkt *pkt,
		   const uint8_t *payload, uint32_t payload_len);
/*
 * RoCE v2 to other hosts (net.c, rreq.c, rcomp.c, rresp.c; the transmit ring in tx.c, the sockets in sockio.c).
 * The daemon opens the sockets, with the privileges they need, and hands them over. `rx_fds`: `nrx` (1 to
 * VRE_MAX_RX_RINGS, one per engine thread) AF_PACKET sockets of type SOCK_DGRAM opened with protocol 0 (nothing
 * arrives yet), each with the daemon's classic BPF filter (IPv4 packets for this host, unfragmented UDP to 4791);
 * `rx6_fds` as many for IPv6 (NULL with no IPv6): the engine makes each a mapped receive ring (TPACKET_V2), binds it
 * to its protocol on every link and, for more than one, joins those of a family in one fanout group that hashes
 * each flow to one ring; engine thread i reads rings i, i + threads, ... of both (each packet is seen with its IP
 * header, whose identification the ICRC covers). A socket becomes a ring once: another attach takes new ones.
 * `tx_fd` a raw IPv4 socket of IPPROTO_RAW (the engine writes the IP and UDP headers: from its guests' addresses,
 * its QPs' source ports, identification 0 and don't-fragment); `udp6_fd` (-1: no IPv6) an IPv6 UDP socket bound to
 * port 4791 (IPV6_V6ONLY, IPV6_TRANSPARENT, don't-fragment) that sends IPv6 RoCE, whose ICRC covers nothing a UDP
 * socket does not write. NULL, NULL, 0, -1, -1: no network (connected QPs with a destination no device here holds
 * wait and time out, as before); the rings are unmapped, the sockets stay the daemon's to close. A refused attach
 * leaves the network as it was. The engine reads and writes them from vre_poll, vre_spin and its threads.
 */
#define VRE_MAX_RX_RINGS 64
int vre_net_attach(struct vre_engine *e, const int *rx_fds, const int *rx6_fds, uint32_t nrx, int tx_fd,
		   int udp6_fd);
/* One UDP payload that arrived for port 4791 between `addr`: parsed, checked and executed, or dropped and
 * counted. 0 when a QP took it, else the reason (-EBADMSG, -EILSEQ, -ENOENT no such QP, -EPERM not its peer). */
int vre_roce_input(struct vre_engine *e, const uint8_t *udp_payload, uint32_t len, const struct vre_roce_addr *addr);
/* One IP packet (IPv4 or IPv6, by its version) as a receive ring holds it, from its IP header on: the header
 * checked (version, lengths, IPv4's checksum, no fragment, UDP to 4791, no IPv6 extension header) and its UDP
 * payload given to vre_roce_input. vre_roce_input's answer, or -EBADMSG (a malformed IP or UDP header: counted
 * rx_malformed) or -EPROTO (UDP to another port: not RoCE, not counted). For tests and fuzzers; the rings' own
 * reader runs the same checks. */
int vre_ip_input(struct vre_engine *e, const uint8_t *ip, uint32_t len);
/*
 * A network without sockets, for tests and fuzzers that play the other hosts in process (tests/unit's RoCE tier,
 * fuzz/engine's stateful target): what the engine sends waits in its transmit ring (VRE_TX_RING packets; a full
 * ring refuses more, as a busy socket does) until vre_net_take takes it, and nothing arrives but what
 * vre_roce_input is given. The daemon never uses it. vre_net_attach (any sockets, or none) ends it.
 */
int vre_net_capture(struct vre_engine *e);
/* The oldest packet waiting to go: its addresses into *addr, its UDP payload into buf (room bytes: a longer one is
 * cut short), and its whole length; 0 when none waits. Only in capture mode. */
uint32_t vre_net_take(struct vre_engine *e, uint8_t *buf, uint32_t room, struct vre_roce_addr *addr);
/* The engine's clock for its timers (retransmission, RNR waits, CQ moderation): CLOCK_MONOTONIC (now_ns 0), or a
 * fixed time in ns that only the caller moves, so that a test or a fuzzer steps timers without waiting for them.
 * Under a fixed clock vre_spin polls once. */
void vre_clock_set(struct vre_engine *e, int64_t now_ns);
/* The invariants of every QP's transport state (remote.c, net_check): 0, or -EPROTO and the first that does not hold
 * (vre_error names the QP). Cheap enough for tests and fuzzers to call after every step. */
int vre_check(struct vre_engine *e);
void vre_net_counters(struct vre_engine *e, struct vre_net_counters *out);
void vre_device_roce_counters(struct vre_engine *e, uint32_t dev, struct vre_roce_counters *out);
/* CRC-32 of n bytes continued from crc, as zlib's crc32() (crc.c: what every ICRC is computed with). */
uint32_t vre_crc32(uint32_t crc, const uint8_t *p, size_t n);

/* ENGINE-API-END */

#include "state_format.h"  /* the device state's records (part of the API: the cffi declaration too) */

#endif /* VRDMA_ENGINE_H */
