/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * The data engine's private header: its objects, the checked lookups every entry point goes through, and what its
 * files share. engine.h is the engine's contract with the model; this is how the engine is built inside.
 *
 * The rooms, one job each, in layers (pyproject.toml's [tool.vrdma.engine-layers]; a file calls only files of the
 * layers below its own, and `make lint` checks it from the object files):
 *   thread.c (the engine's threads: passes, parking, balancing);
 *   poll.c (the loop and the per-QP scheduler), device.c (engines and devices opened and closed);
 *   net.c (every arriving packet, parsed, routed and handed to its QP);
 *   req.c (the requester to a QP of this engine), rcomp.c (the completer of a QP whose peer is on another host);
 *   resp.c (the responder here), ud.c (datagrams), rreq.c and rresp.c (the RoCE requester and responder);
 *   wqe.c (a send WQE as both requesters read it);
 *   opcode.c (what each work request opcode does), recv.c (receive queues and SRQs);
 *   mr.c, cq.c, srq.c, qp.c (the objects), tx.c (the transmit ring);
 *   mem.c (guest page lists, translation, copies), gid.c (the GID index), remote.c (a remote QP's transport
 *   state), roce.c (RoCE packets parsed and built);
 *   base.c (errors, the clock, events, doorbell slots), layout.c (the ring layouts the device accepts), wire.c (the
 *   wire opcode table), sockio.c (the sockets), crc.c (CRC-32 at memory speed, for the ICRC);
 *   lock.c (the locks the threads and their callers share, each thread's context, waking a thread).
 * remote.h holds what the RoCE rooms share, wire.h the names of the wire, threads.h the threads' and locks' types,
 * account.h what the data path counts and charges.
 *
 * Trust: everything in guest memory (rings, WQEs, page lists, the consumer index of a CQ) and in doorbell pages
 * can change under our feet and is read once into local variables before it is checked and used. Every guest
 * address is translated page by page through the VM's memory table; every index is masked into its ring; every
 * `addr + len` is computed so that it cannot wrap; every loop is bounded by a ring depth or a budget.
 */
#ifndef VRDMA_ENGINE_VRE_H
#define VRDMA_ENGINE_VRE_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <poll.h>     /* (threads.h: before the visibility pragma, which would hide libc's declarations) */
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "engine.h"
#include "vrdma_dev_api.h"
#include "wire.h"

#define PAGE_SIZE VRDMA_PAGE_SIZE
#define PAGE_SHIFT VRDMA_PAGE_SHIFT
#define EVENT_RING 4096
#define VRE_ARM_SWEEP_NS 100000000  /* cq_sweep_arms: the doorbell recheck's period (the spec's 100 ms) */
#define MAX_REGIONS VRE_MAX_REGIONS
#define RNR_INFINITE 7
#define MAX_WQE_SGES (VRDMA_PAGE_SIZE / sizeof(struct vrdma_sge))
#define DIV_ROUND_UP(n, d) (((n) + (d) - 1) / (d))

#pragma GCC visibility push(hidden)

/*
 * The engine's internal functions: `static` when the files are compiled as one unit (VRE_ONE_UNIT: the cffi
 * module, so the compiler inlines across files as it would within one), hidden otherwise (the fuzzer links the
 * files apart).
 */
#ifdef VRE_ONE_UNIT
#define VRE_FN static
#else
#define VRE_FN
#endif

/*
 * A VM's dirty log while it migrates (vre_device_set_log): a bit per 4 KiB guest-physical page, from guest address 0,
 * which QEMU collects and clears (vhost-user's VHOST_USER_SET_LOG_BASE region). A page the engine writes is marked
 * after the bytes are there, so that QEMU never clears a mark and copies the page before the write lands.
 */
struct vre_dirty_log {
	uint8_t *bits;            /* NULL: not logging */
	uint64_t bytes;
};

/* Guest memory an object spans: its pages' guest-physical addresses and where they are mapped here. */
struct vre_mem {
	uint32_t npages;
	bool valid;               /* false once a memory table change left a page untranslatable */
	uint64_t *gpa;
	uint8_t **hva;
	const struct vre_dirty_log *log;  /* the log of the VM whose memory this is (its device's) */
};

struct vre_mr {
	struct vre_mr_config cfg;
	struct vre_mem mem;       /* a window's: none; mem.valid while it is bound */
	uint64_t gen;             /* the device's mr_gen when this MR was made or last (re)registered */
	/* A window (cfg.mw_type): bound to [cfg.iova, cfg.iova + cfg.length) of the MR in target_slot whose gen is
	 * target_gen (so a window outliving its MR reaches nothing); a type 2 window to the QP bound_qpn alone. */
	uint32_t target_slot;
	uint32_t bound_qpn;
	uint64_t target_gen;
};

struct vre_cq {
	struct vre_cq_config cfg;
	struct vre_mem ring;
	volatile uint32_t *arm;   /* doorbell slot */
	uint32_t arm_done;        /* the arm request the last event answered */
	uint32_t arm_seen;        /* the arm slot as the last completion read it (cq_sweep_arms) */
	uint32_t prod;
	bool error;
	uint32_t mod_count;       /* moderation: completions per event (0, 1: every armed completion) */
	uint32_t mod_period_us;   /* ... or this long after the first (0: no timer) */
	uint32_t mod_pending;     /* armed completions not announced yet */
	int64_t mod_deadline;     /* when the pending ones are announced anyway; 0: none */
};

struct vre_srq {
	struct vre_srq_config cfg;
	struct vre_mem ring;
	volatile uint32_t *db;
	uint32_t cons;
	uint32_t limit;
	bool error;
};

/* A receive WQE and a send WQE as copied out of guest memory (at most a page: a ring's largest stride). */
struct recv_wqe {
	struct vrdma_recv_wqe hdr;
	struct vrdma_sge sge[MAX_WQE_SGES];
};

struct send_wqe {
	struct vrdma_send_wqe hdr;
	union {
		struct vrdma_sge sge[MAX_WQE_SGES];
		uint8_t inline_data[VRDMA_PAGE_SIZE];
	};
};

/*
 * The head send WQE's message while it moves in pieces (poll.c cuts a message longer than the engine's piece size,
 * so that other QPs and VMs run between its pieces): how far it got and what it was when it started. Every piece
 * reads the WQE again and checks it, its local memory and the remote key as the first did: between two pieces a
 * control command may have destroyed an MR or changed the memory table, and the guest may have rewritten the WQE
 * (then it no longer matches: a local QP operation error).
 */
struct vre_piece {
	uint64_t done;            /* bytes moved; 0: no message under way */
	uint64_t len;             /* its length */
	uint32_t opcode;          /* its work request opcode */
	uint32_t turn;            /* the device's turn it started in (a piece of a later turn was deferred) */
};

/* A receive WQE a SEND that moves in pieces took at its first piece and fills until its last (the responder's
 * current receive, as a real responder keeps it: a message that starts again, after the requester retried or was
 * reset, fills it from the start). Allocated the first time this QP needs one. */
struct vre_held_recv {
	struct recv_wqe *wqe;
	uint32_t max_sge;
	bool held;
};

struct vre_qp {
	struct vre_qp_config cfg;
	struct vre_qp_attr attr;
	struct vre_mem ring;
	volatile uint32_t *sq_db;
	volatile uint32_t *rq_db;
	uint32_t sq_head;         /* next send WQE to execute */
	uint32_t rq_cons;
	uint32_t rnr_left;
	uint32_t retry_left;
	int64_t rnr_until;        /* CLOCK_MONOTONIC ns of the next attempt after an RNR or a timeout; 0: none */
	uint32_t index;           /* position in the device's active list (VRE_NOT_ACTIVE: an XRC target, no SQ) */
	struct vre_qp_counters counters;
	struct vre_remote *net;   /* RTR or later with its peer on another host: the RoCE transport's state */
	struct vre_piece piece;   /* as a requester: its head WQE's message, moving in pieces */
	struct vre_held_recv held;  /* as a responder: the receive a message moving in pieces fills */
};

#define VRE_NOT_ACTIVE UINT32_MAX
#define VRE_TRANSPORT (VRE_QP_UD | VRE_QP_UC | VRE_QP_XRC_INI | VRE_QP_XRC_TGT)

struct vre_gid {
	uint8_t raw[16];
	uint32_t type;            /* VRDMA_GID_TYPE_*, 0: no GID here */
};

/* A token bucket (a limit): `rate` per second, at most `burst` saved up; tokens may go below zero (a piece larger
 * than what is left is allowed and repaid), so the long-run rate is exact whatever the piece size. */
struct vre_bucket {
	double rate;              /* 0: no limit */
	double burst;
	double tokens;
	int64_t at;               /* when tokens was last brought up to date (engine clock, ns) */
};

/*
 * A device's share of the engine (poll.c): deficit round robin between the devices with work, each device's turn
 * worth `quantum_bytes * weight` of copying (a work request costs the engine's wr_cost_bytes on top of its data),
 * and its limits. A device that did not use its turn's worth keeps none of it; one that overran it (by at most one
 * piece) starts the next turn in debt. Inside a device, its QPs take turns starting at `next`.
 */
struct vre_share {
	uint32_t weight;
	bool low_latency;         /* VRE_LATENCY_LOW: looked at between every other device's turns (poll.c) */
	bool in_turn;             /* a low-latency device's turn is open for this round ... */
	uint32_t turn_work;       /* ... and did this much so far */
	uint32_t next;            /* the active QP its next turn starts at */
	uint32_t turn;            /* turns taken (struct vre_piece.turn) */
	int64_t deficit;
	struct vre_bucket bytes, wrs;
	int64_t throttled_since;  /* when its limits stopped it with work waiting; 0: they do not */
	struct vre_qos_counters counters;
};

struct vre_device {
	/* What every engine thread reads every pass, looking for its devices (thread.c), seldom written: a cache line
	 * apart from the lock its owner takes every turn. A device's opening and closing keeps them. */
	uint32_t owner;           /* atomic: the engine thread that runs it (balance() moves it) */
	uint32_t waiters;         /* atomic: callers waiting for `lock` (the owner lets them have it first) */
	bool open;                /* written under every lock (atomic), read by a thread looking for its devices */
	bool suspended;           /* atomic, written under its lock: not run, not delivered into (vre_device_suspend) */
	pthread_mutex_t lock __attribute__((aligned(64)));  /* recursive */
	uint32_t worked;          /* atomic: its last turn did work (balance() looks for such a device to move) */
	/* Everything from here, and everything the device holds (its objects, its guest memory), is touched only
	 * under `lock`: its owner takes it for the device's turn, another device's thread to deliver into it, a
	 * caller for a call. */
	bool parked;              /* its owner parked: its doorbell pages' parked slots are set */
	int64_t moved_at;         /* when it last changed thread (req.c's follow, thread.c's balance) */
	int wake_fd;              /* a duplicate of the wake queue's kick eventfd, or -1 (vre_device_wake_fd) */
	struct vre_device_limits lim;
	uint8_t *doorbells;
	uint64_t *db_pages_used;  /* bitmap: pages some queue took a slot of (their parked slot is kept) */
	struct vre_region regions[MAX_REGIONS];
	uint32_t nregions;
	/* The device addresses the page lists of the command being run may name, [lo, hi] (vre_device_page_window):
	 * one user context's share of the memory table (a container's process), or all of it. */
	uint64_t window_lo, window_hi;
	struct vre_dirty_log log;
	struct vre_mr **mrs;
	struct vre_cq **cqs;
	struct vre_srq **srqs;
	struct vre_qp **qps;
	struct vre_qp **active;   /* the QPs, densely, for polling */
	struct vre_gid gids[VRE_MAX_GIDS];
	int64_t gsi;              /* the QP table slot of QP1, or -1 */
	uint32_t nactive;
	int64_t mod_next;         /* earliest moderation deadline of its CQs (0: none) */
	int64_t arm_sweep_at;     /* when cq_sweep_arms next looks at its CQs' arm slots */
	uint32_t cq_hi;           /* past the highest CQ slot used since the device opened: the CQ scans' bound */
	uint64_t pages_in_use;    /* translated pages of its MRs and rings, bounded by lim.max_pages_total */
	uint64_t mr_gen;          /* MRs made, reregistered or fast-registered so far (struct vre_mr.gen) */
	struct vre_counters counters;
	struct vre_roce_counters roce;
	struct vre_share share;
};

/* A run of bytes to copy: in an MR (mem + offset in it) or in a buffer mapped here in one piece (a WQE's inline
 * data, or guest RAM named by the local DMA lkey). */
struct seg {
	const struct vre_mem *mem;
	const uint8_t *buf;
	uint64_t off;
	uint64_t len;
	/* A buffer that is guest RAM (the local DMA lkey's): its guest address, and its VM's log; else NULL. */
	const struct vre_dirty_log *log;
	uint64_t gpa;
};

/* Where one WQE's execution keeps its copies: one per thread that executes (struct vre_ctx), not on the stack
 * (tens of KiB) and not function-static (two engines in one process must not share them). */
struct vre_scratch {
	struct send_wqe wqe;
	struct recv_wqe rwqe;
	struct seg local[MAX_WQE_SGES];
	struct seg remote[MAX_WQE_SGES];
	struct seg datagram[MAX_WQE_SGES + 1];   /* a UD receive's network header, then the sender's data */
	struct seg local_piece[MAX_WQE_SGES];    /* the part of each side one piece of a message moves */
	struct seg remote_piece[MAX_WQE_SGES];
	uint8_t grh[VRDMA_GRH_SIZE];
};

/*
 * What one thread running the engine keeps to itself: each engine thread has one (struct vre_worker), and every
 * other caller shares the engine's own (`caller`: the event loop's thread, a fuzzer, in-process tests, whose calls
 * never overlap). ctx(e) finds the running thread's.
 */
#define VRE_NO_WORKER UINT32_MAX

struct vre_ctx {
	struct vre_engine *engine;
	uint32_t worker;          /* the engine thread's index, VRE_NO_WORKER for the callers' */
	int64_t now;              /* the clock as the current pass read it */
	uint64_t moved;           /* bytes the last execute_send moved: what poll.c charges the device */
	struct vre_device *held;  /* another device it holds the lock of for this turn (req.c's destination) */
	/* The last two devices that moved a small message, the last two that did any work, latest first (account.h). */
	struct vre_recent { int64_t at; const struct vre_device *dev; } small[2], worked[2];
	struct vre_scratch scratch __attribute__((aligned(64)));  /* its own cache lines */
};

/* A slot of the engine's GID index (gid.c): device `dev`'s GID `index`; dev UINT32_MAX: empty. */
struct vre_gid_slot {
	uint32_t dev;
	uint32_t index;
};

#include "threads.h"

/* A mapped receive ring (sockio.c): frames the kernel fills and hands over one at a time (TPACKET_V2), read in
 * order by the one thread it belongs to. */
struct vre_rx_ring {
	int fd;
	int family;               /* AF_INET or AF_INET6: what it is bound to */
	uint8_t *map;
	uint32_t next;            /* the frame read next */
};

struct vre_engine {
	uint32_t ndevices;                /* device slots, made once: VMs added later take a free one */
	uint32_t devices_hi;              /* one past the highest open device: the loops over devices stop here */
	struct vre_device *devices;
	struct vre_gid_slot *gid_slots;   /* every open device's GIDs (gid.c), gid_mask + 1 slots */
	uint32_t gid_mask;
	struct vre_event events[EVENT_RING];
	uint32_t ev_head, ev_tail;
	char error[256];
	/* The network (tx.c, sockio.c): the daemon's sockets (-1: none), its receive rings, packets waiting to go
	 * [tx_head, tx_tail). */
	int tx_fd, udp6_fd;
	struct vre_rx_ring *rings;
	uint32_t nrings;
	bool capture;             /* vre_net_capture: no sockets, the caller takes what is sent */
	int64_t clock;            /* vre_clock_set: a fixed time (ns), 0: CLOCK_MONOTONIC */
	struct vre_tx_pkt *tx;
	uint32_t tx_head, tx_tail;
	struct vre_net_counters net;
	struct vre_threads threads;
	struct vre_sched sched;   /* the scheduler's sizes (vre_sched_set) */
	struct vre_ctx caller;    /* every thread's but the engine's own (struct vre_ctx) */
	bool caller_parked;       /* vre_park: the caller parked every device (no threads run) */
};

/* The running thread's context: an engine thread's own, or the callers' (see struct vre_ctx). Initial-exec TLS: one
 * pointer, read with one instruction on the hot path. */
extern __thread struct vre_ctx *vre_current_ctx __attribute__((tls_model("initial-exec")));

static inline struct vre_ctx *ctx(struct vre_engine *e)
{
	struct vre_ctx *c = vre_current_ctx;

	return c && c->engine == e ? c : &e->caller;
}

/* -- small helpers ------------------------------------------------------------------------------------------ */

/* The network's counters: bumped by whichever thread sends or receives, read by the caller. */
static inline void net_count(uint64_t *counter, uint64_t n)
{
	__atomic_fetch_add(counter, n, __ATOMIC_RELAXED);
}

static inline uint32_t load_acquire(volatile uint32_t *p)
{
	return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

static inline void store_release(volatile uint32_t *p, uint32_t v)
{
	__atomic_store_n(p, v, __ATOMIC_RELEASE);
}

/* Big-endian fields of wire headers (RoCE's, IP's, UDP's), at any alignment. */
static inline uint16_t be16_get(const uint8_t *p)
{
	return (uint16_t)(p[0] << 8 | p[1]);
}

static inline uint32_t be32_get(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static inline uint64_t be64_get(const uint8_t *p)
{
	return (uint64_t)be32_get(p) << 32 | be32_get(p + 4);
}

static inline void be16_put(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)(v >> 8);
	p[1] = (uint8_t)v;
}

static inline void be32_put(uint8_t *p, uint32_t v)
{
	be16_put(p, (uint16_t)(v >> 16));
	be16_put(p + 2, (uint16_t)v);
}

static inline void be64_put(uint8_t *p, uint64_t v)
{
	be32_put(p, (uint32_t)(v >> 32));
	be32_put(p + 4, (uint32_t)v);
}

static inline bool is_pow2(uint32_t v)
{
	return v && !(v & (v - 1));
}

/* The first 12 bytes of an IPv4-mapped IPv6 address (::ffff:a.b.c.d): how a GID holds an IPv4 address. */
static const uint8_t ipv4_mapped_prefix[12] = { [10] = 0xff, [11] = 0xff };

static inline bool ipv4_mapped(const uint8_t *gid)
{
	return !memcmp(gid, ipv4_mapped_prefix, sizeof(ipv4_mapped_prefix));
}

static inline uint32_t dev_index(struct vre_engine *e, struct vre_device *d)
{
	return (uint32_t)(d - e->devices);
}

/* Address of byte `off` of an object's memory; the caller keeps `off` below npages * PAGE_SIZE. */
static inline uint8_t *mem_at(const struct vre_mem *m, uint64_t off)
{
	return m->hva[off >> PAGE_SHIFT] + (off & (PAGE_SIZE - 1));
}

/* -- checked lookups: every slot or device index a caller gives goes through one of these --------------------- */

/* An open device, or NULL. */
VRE_FN struct vre_device *vre_dev(struct vre_engine *e, uint32_t dev);

/*
 * mr_at(d, slot), cq_at, srq_at, qp_at: the object in `slot` of an open device's table of that kind, or NULL when
 * the device is NULL, the slot is past the table or empty. One definition for the four tables.
 */
#define VRE_TABLE(kind)                                                                                  \
	static inline struct vre_##kind *kind##_at(struct vre_device *d, uint32_t slot)                 \
	{                                                                                                \
		return d && slot < d->lim.max_##kind ? d->kind##s[slot] : NULL;                          \
	}                                                                                                \
	static inline bool kind##_slot_free(struct vre_device *d, uint32_t slot)                         \
	{                                                                                                \
		return d && slot < d->lim.max_##kind && !d->kind##s[slot];                               \
	}                                                                                                \
	/* Take the object out of its slot (the caller frees it), or NULL. */                            \
	static inline struct vre_##kind *kind##_take(struct vre_device *d, uint32_t slot)               \
	{                                                                                                \
		struct vre_##kind *obj = kind##_at(d, slot);                                             \
                                                                                                         \
		if (obj)                                                                                 \
			d->kind##s[slot] = NULL;                                                         \
		return obj;                                                                              \
	}
VRE_TABLE(mr)
VRE_TABLE(cq)
VRE_TABLE(srq)
VRE_TABLE(qp)
#undef VRE_TABLE

/* -- base.c ------------------------------------------------------------------------------------------------ */

VRE_FN int vre_fail(struct vre_engine *e, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
VRE_FN int64_t vre_monotonic_ns(void);
VRE_FN void *vre_alloc_lines(size_t n, size_t size);
VRE_FN void vre_post_event(struct vre_engine *e, uint32_t dev, uint32_t type, uint32_t handle, uint64_t data);
VRE_FN volatile uint32_t *vre_db_slot(struct vre_device *d, uint32_t index);
VRE_FN volatile uint32_t *vre_db_claim(struct vre_device *d, uint32_t index);
VRE_FN volatile uint32_t *vre_db_adopt(struct vre_device *d, uint32_t index);
VRE_FN void vre_set_parked_flags(struct vre_device *d, uint32_t value);

/* -- crc.c: CRC-32 at memory speed --------------------------------------------------------------------------- */

/* The CRC-32 register (not zlib's complemented value) after n bytes from register r (the folding code where the CPU
 * has it, picked at the first call). */
VRE_FN uint32_t vre_crc32_update(uint32_t r, const uint8_t *p, size_t n);

/* -- gid.c: the GID index ----------------------------------------------------------------------------------- */

VRE_FN int gid_index_init(struct vre_engine *e);
/* The open device holding GID `gid` (of any type), or NULL. */
VRE_FN struct vre_device *gid_route(struct vre_engine *e, const uint8_t *gid);
/* A device closes: its GIDs leave the index. */
VRE_FN void gid_forget_device(struct vre_engine *e, struct vre_device *d);

/* -- mem.c ------------------------------------------------------------------------------------------------- */

VRE_FN uint8_t *gpa_range(struct vre_device *d, uint64_t gpa, uint64_t len);
VRE_FN int mem_load(struct vre_engine *e, struct vre_device *d, const struct vre_pages_desc *desc, uint32_t max_pages,
	     struct vre_mem *m);
VRE_FN void *obj_new(struct vre_engine *e, struct vre_device *d, size_t size, size_t mem_offset,
	      const struct vre_pages_desc *pages, const char *what, int *err);
VRE_FN int mem_from_state(struct vre_engine *e, struct vre_device *d, const uint8_t *gpas, uint32_t n, uint32_t room,
			  bool translate, bool valid, struct vre_mem *m);
VRE_FN void obj_free(struct vre_device *d, void *obj, size_t mem_offset);
VRE_FN void mem_put(struct vre_device *d, struct vre_mem *m);
VRE_FN bool mem_retranslate(struct vre_device *d, struct vre_mem *m);
VRE_FN uint64_t copy_segs(struct seg *dst, uint32_t ndst, struct seg *src, uint32_t nsrc);
/* Bytes [off, off + len) of an object's memory (or of guest RAM at gpa) written: marked in its VM's dirty log. */
VRE_FN void mem_dirty(const struct vre_mem *m, uint64_t off, uint64_t len);
VRE_FN void gpa_dirty(const struct vre_dirty_log *log, uint64_t gpa, uint64_t len);
VRE_FN uint64_t copy_at(struct seg *segs, uint32_t n, uint64_t off, uint8_t *buf, uint64_t len, bool to_segs);
/* Bytes [off, off + len) of a list of segments taken as one run, as a list of segments (into out, which has room
 * for n): how many. */
VRE_FN uint32_t segs_slice(const struct seg *in, uint32_t n, uint64_t off, uint64_t len, struct seg *out);

/* -- layout.c: the ring layouts the device accepts, each rule in one place ------------------------------------ */

VRE_FN bool cq_ring_fits(uint32_t entries, uint32_t max_cqe, uint32_t npages);
VRE_FN bool recv_queue_fits(uint32_t depth, uint32_t max_depth, uint32_t stride, uint32_t max_sge, uint32_t dev_max_sge);
VRE_FN bool srq_ring_fits(uint32_t depth, uint32_t stride, uint32_t npages);
VRE_FN bool send_queue_fits(uint32_t depth, uint32_t max_depth, uint32_t stride, uint32_t max_sge, uint32_t dev_max_sge,
		     uint32_t max_inline, uint32_t dev_max_inline);
VRE_FN bool ring_fits(uint32_t depth, uint32_t stride, uint32_t offset, uint64_t end);
VRE_FN uint64_t qp_ring_pages(uint32_t sq_depth, uint32_t sq_stride, uint32_t rq_depth, uint32_t rq_stride);

/* -- mr.c -------------------------------------------------------------------------------------------------- */

/* The MR table slot a key names (VRDMA_KEY_SLOT_SHIFT: the low byte is the key's variable part). */
static inline uint32_t key_slot(const struct vre_device *d, uint32_t key)
{
	return (key >> VRDMA_KEY_SLOT_SHIFT) & (d->lim.max_mr - 1);
}

VRE_FN struct vre_mr *mr_by_key(struct vre_device *d, uint32_t key, bool remote);
VRE_FN bool mr_range(const struct vre_mr *mr, uint64_t addr, uint64_t len, uint64_t *off);
/* Work requests on fast-registration MRs of PD `pd`: map one (REG_MR), unmap one by its key (LOCAL_INV, and the
 * responder's side of SEND_WITH_INV; a type 2 window too, by the QP it is bound to). A completion status:
 * VRDMA_WC_SUCCESS or why not. */
VRE_FN uint8_t mr_fast_register(struct vre_device *d, uint32_t pd, const struct vrdma_send_wqe *w);
VRE_FN uint8_t mr_invalidate(struct vre_device *d, uint32_t pd, uint32_t qpn, uint32_t key);
/* BIND_MW of QP `qp`: bind (or unbind) a window of its PD to a range of an MR of its PD. */
VRE_FN uint8_t mw_bind(struct vre_device *d, const struct vre_qp *qp, const struct vrdma_send_wqe *w);
/* The MR a bound window `mw` reaches for [addr, addr + len), as the responder QP `qpn` uses it, or NULL. */
VRE_FN struct vre_mr *mw_target(struct vre_device *d, const struct vre_mr *mw, uint32_t qpn, uint64_t addr,
				uint64_t len);

/* The responder's checks of a remote access by QP dqp: rkey, PD `pd` (the receive side's), bounds, MR (or window) and
 * QP access rights. The MR whose memory [addr, addr + len) is (at *off in it), or NULL. */
struct vre_qp;
VRE_FN struct vre_mr *remote_mr(struct vre_device *dd, struct vre_qp *dqp, uint32_t pd, uint32_t rkey,
				uint64_t addr, uint64_t len, uint32_t access, uint64_t *off);

/* -- cq.c -------------------------------------------------------------------------------------------------- */

VRE_FN void cq_announce(struct vre_engine *e, struct vre_device *d, struct vre_cq *cq, uint32_t arm);
VRE_FN void cq_push(struct vre_engine *e, struct vre_device *d, struct vre_cq *cq, const struct vrdma_cqe *cqe,
	     bool solicited);
VRE_FN void cq_timers(struct vre_engine *e, struct vre_device *d);
VRE_FN void cq_sweep_arms(struct vre_engine *e, struct vre_device *d);
VRE_FN void cq_install(struct vre_device *d, uint32_t slot, struct vre_cq *cq);
/* What a configuration must be (cq.c, srq.c, qp.c), made by a command or loaded from a state (state.c). */
VRE_FN int cq_config_check(struct vre_engine *e, struct vre_device *d, uint32_t slot, const struct vre_cq_config *c);
VRE_FN int srq_config_check(struct vre_engine *e, struct vre_device *d, uint32_t slot, const struct vre_srq_config *c);
VRE_FN int qp_config_check(struct vre_engine *e, struct vre_device *d, uint32_t slot, const struct vre_qp_config *c);

/* -- qp.c -------------------------------------------------------------------------------------------------- */

VRE_FN struct vre_qp *qp_by_qpn(struct vre_engine *e, uint32_t dev, uint32_t qpn);
VRE_FN void qp_to_error(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, uint32_t event);
VRE_FN void qp_insert(struct vre_device *d, uint32_t slot, struct vre_qp *qp);
/* -- device.c: every object of a device destroyed (its close; restore.c's refused state) */
VRE_FN void device_objects_free(struct vre_engine *e, uint32_t dev, struct vre_device *d);
VRE_FN bool qp_attr_ok(const struct vre_qp_attr *a);
/* Whether a QP takes messages now: RTR or later, not in error, its rings still in guest memory. */
VRE_FN bool qp_receives(const struct vre_qp *qp);
/* Whether a requester of QP flags `req` and a responder of `resp` speak the same transport (RC with RC, UC with
 * UC, an XRC initiator with an XRC target): a responder drops what it cannot parse. */
VRE_FN bool same_transport(uint32_t req, uint32_t resp);

/* -- opcode.c ---------------------------------------------------------------------------------------------- */

enum vre_op_flags {
	OP_REMOTE = 1 << 0,       /* names remote memory with an rkey (checked by the responder) */
	OP_READS = 1 << 1,        /* brings data back: its local SGEs are written (local write access) */
	OP_RECV = 1 << 2,         /* consumes a receive WQE at the destination */
	OP_IMM = 1 << 3,          /* carries immediate data to the receiver's completion */
	OP_ATOMIC = 1 << 4,       /* 8 aligned bytes, one SGE */
	OP_PAYLOAD = 1 << 5,      /* sends its local data to the destination (inline allowed) */
	OP_LOCAL = 1 << 6,        /* done by the requester alone, on its own device (the row's `local` does it) */
	OP_INV = 1 << 7,          /* invalidates the key in imm_data at the responder, with the receive it takes */
};

struct vre_opcode {
	const char *name;
	uint32_t flags;           /* enum vre_op_flags */
	uint32_t remote_access;   /* the VRDMA_ACCESS_REMOTE_* bit the MR and the QP must grant (OP_REMOTE) */
	uint8_t wc_opcode;        /* the requester's completion opcode */
	/* On the wire: the RC opcodes of a message's packets, by position (enum wire_pos; roce_on gives their UC or UD
	 * twins); a READ or an atomic is one request packet (WIRE_ONLY). */
	uint8_t wire[4];
	/* OP_LOCAL: the whole operation, on the QP's own device; its completion status */
	uint8_t (*local)(struct vre_device *d, const struct vre_qp *qp, const struct vrdma_send_wqe *w);
};

/* The opcode's row, or NULL for an opcode the device does not know. */
VRE_FN const struct vre_opcode *vre_opcode(uint8_t wr_opcode);

/* -- recv.c ------------------------------------------------------------------------------------------------ */

enum take { TAKE_OK, TAKE_EMPTY, TAKE_BROKEN };

/*
 * Where a message for a QP lands: the receive queue it draws from (an SRQ, or the QP's own), the CQ its receive
 * completions go to, and whose memory its receive SGEs and the rkeys it honours name (the PD, and whether the local
 * DMA lkey works). A QP has these of its own; an XRC target has none, and the XRC SRQ a message names gives them.
 */
struct vre_rx {
	struct vre_srq *srq;      /* NULL: the QP's own receive queue */
	struct vre_cq *cq;
	uint32_t pd;
	bool kernel;
};

/* The receive side of `qp` for a message naming XRC SRQ number `srqn` (used by XRC targets only); false if an
 * XRC target has no such SRQ in its XRC domain. */
VRE_FN bool rx_of(struct vre_device *d, struct vre_qp *qp, uint32_t srqn, struct vre_rx *rx);
VRE_FN enum take take_recv(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, const struct vre_rx *rx,
			   struct recv_wqe *out, uint32_t *max_sge);
VRE_FN uint32_t flush_recv(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, uint32_t budget);

#include "request.h"

/* -- state.c and restore.c: a device's state as data --------------------------------------------------------------- */

/* Bytes of a receive WQE of n SGEs, as a state carries it (a held receive, a remote QP's). */
static inline uint64_t recv_bytes(uint64_t n)
{
	return sizeof(struct vrdma_recv_wqe) + n * sizeof(struct vrdma_sge);
}

/* The bytes of a remote QP's part of its record: its struct, its send queue's slots, the READ ring, its receive. */
static inline uint64_t remote_bytes(uint32_t sq_depth, uint32_t rwqe_sges, bool rwqe_held)
{
	return sizeof(struct vre_state_remote) + (uint64_t)(sq_depth ? sq_depth : 1) * sizeof(struct vre_state_sent) +
	       (uint64_t)VRE_STATE_MAX_RD * sizeof(struct vre_state_rd) + (rwqe_held ? recv_bytes(rwqe_sges) : 0);
}
#include "account.h"
#include "remote.h"

#pragma GCC visibility pop

#endif /* VRDMA_ENGINE_VRE_H */
