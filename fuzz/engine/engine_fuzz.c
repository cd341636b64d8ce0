// SPDX-License-Identifier: GPL-2.0-only
/*
 * libFuzzer harness for the data engine (the .c files of backend/vrdma/engine, linked in as they are, built with
 * AddressSanitizer and UndefinedBehaviorSanitizer by fuzz/build.py).
 *
 * Each input builds two fake VMs and plays their model and their guests at once:
 *
 * - guest memory: an arena of ARENA_PAGES pages per VM (between PROT_NONE guard pages, mapped once), of which
 *   the input's memory table maps some slices at some guest-physical addresses (possibly misaligned, possibly
 *   not whole pages, possibly aliasing). Every byte of the arena that no region of the current table covers is
 *   poisoned for ASan, so the engine reading or writing anything but the guest's current memory (a stale
 *   translation after a memory table change, a copy past a page, a ring index out of its ring) is a report;
 * - doorbells: a heap buffer of doorbell_pages pages (ASan's redzones around it);
 * - the model: limits, memory tables, MR/CQ/SRQ/QP configurations with page lists written into guest memory,
 *   QP state changes, closes and reopens. Configurations are arbitrary (the engine checks what it relies on in
 *   guest memory: engine.h); what the harness keeps to is the model's contract for object lifetimes, which the
 *   engine is entitled to trust: a CQ or SRQ a QP uses is not destroyed before the QP (the model answers BUSY);
 * - the guest: WQEs written into the rings (mostly well formed, naming real keys, so that transfers happen),
 *   producer indices and arm requests stored into doorbells, raw bytes written anywhere in guest memory,
 *   completions consumed.
 *
 * Input format: a stream of bytes read by the u8/u16/u32/u64 helpers (little endian; an exhausted input reads
 * zeros). First, per VM: its limits and its memory table (read_limits, read_memory). Then operations, one byte
 * each (op = byte % OP_COUNT, VM = (byte / OP_COUNT) & 1) followed by that operation's operands, until the input
 * ends or MAX_OPS ran. fuzz/engine/seeds.py writes well-formed scenarios in this format (the seed corpus).
 *
 * Built with FUZZ_ENGINE_THREAD (build/fuzz/engine_threads_fuzz, ThreadSanitizer instead of ASan and UBSan), the
 * engine runs two threads for each input, as the backend runs them (one VM each to start with: a WRITE from one VM
 * into the other is one thread delivering into the other's device), and the harness makes each operation under the
 * lock the backend's event loop would take for it: its VM's device lock (vre_lock_device), every lock for what
 * concerns the whole engine (engine_wide): the guest's writes too (the engine reads a VM's memory only under that
 * VM's device lock, so a race ThreadSanitizer reports is one between the engine's threads, or between them and their
 * callers, not the guest's by design). op_poll's own polls then run between the threads' passes.
 *
 * Beyond the sanitizers the harness asserts what the engine promises its caller: return codes are 0 or a negative
 * errno, its error message is a terminated string, events name a device that exists, a QP is in the state it was
 * last given (or in error), and a memory table it refuses leaves it with no memory at all (so the whole arena is
 * poisoned from then on: an engine that kept using the old table would be caught).
 */
#include "fuzz.h"

struct vm vms[NDEV];
struct vre_event events[EVENT_BATCH];
bool verbose;              /* ENGINE_FUZZ_VERBOSE=1: print each input's engine counters (to check seeds) */

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fill_sges(struct in *in, struct vm *vm, struct vrdma_sge *sge, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		uint8_t how = u8(in);
		struct mr_rec *mr = pick_mr(vm, how >> 2);

		if ((how & 3) == 3 && vm->nregions && (how & 4)) {
			/* The local DMA lkey: guest-physical, near (inside, across the end of, past) a RAM region. */
			const struct vre_region *r = &vm->regions[(how >> 3) % vm->nregions];

			sge[i].addr = r->gpa + r->size - (u32(in) % (r->size + 0x2000)) + 0x1000;
			sge[i].length = u16(in);
			sge[i].lkey = VRDMA_LOCAL_DMA_LKEY;
			continue;
		}
		if ((how & 3) == 3 || !mr) {
			sge[i].addr = u64(in);
			sge[i].length = u32(in);
			sge[i].lkey = u32(in);
			continue;
		}
		uint64_t room = mr->length < 0x10000 ? mr->length : 0x10000;
		uint64_t off = u16(in) % (room + 1);

		/* how & 3 == 2: up to 8 bytes past the MR's end */
		uint64_t span = room - off + 1 + ((how & 3) == 2 ? 8 : 0);

		sge[i] = (struct vrdma_sge){ .addr = mr->iova + off, .lkey = mr->lkey,
					     .length = (uint32_t)(u16(in) % span) };
	}
}

/* One send WQE at the send queue's producer index. */
/* The opcodes the device knows (any byte, now and then: unknown ones are refused). */
static const uint8_t send_opcodes[] = {
	VRDMA_WR_RDMA_WRITE, VRDMA_WR_RDMA_WRITE_WITH_IMM, VRDMA_WR_SEND, VRDMA_WR_SEND_WITH_IMM, VRDMA_WR_RDMA_READ,
	VRDMA_WR_ATOMIC_CMP_AND_SWP, VRDMA_WR_ATOMIC_FETCH_AND_ADD, VRDMA_WR_LOCAL_INV, VRDMA_WR_SEND_WITH_INV,
	VRDMA_WR_REG_MR, VRDMA_WR_BIND_MW,
};

static void put_send_wqe(struct in *in, struct vm *vm, struct qp_rec *qp)
{
	union {
		struct {
			struct vrdma_send_wqe hdr;
			struct vrdma_sge sge[PAGE / sizeof(struct vrdma_sge)];
		} s;
		uint8_t bytes[sizeof(struct vrdma_send_wqe) + PAGE];
	} w;
	uint8_t flags = u8(in), dest;
	struct mr_rec *rmr;

	memset(&w, 0, sizeof(w));
	w.s.hdr.wr_id = u16(in);
	w.s.hdr.opcode = flags & 0x80 ? u8(in) : send_opcodes[u8(in) % sizeof(send_opcodes)];
	w.s.hdr.send_flags = u8(in) & 0xf;
	w.s.hdr.num_sge = (uint8_t)(u8(in) % (qp->cfg.max_send_sge + 2));
	w.s.hdr.imm_data = u32(in);
	/* The remote side: a key of an MR of either VM (the destination is wherever the QP points). */
	dest = u8(in) % NDEV;
	rmr = pick_mr(&vms[dest], u8(in));
	if (rmr && !(flags & 1)) {
		w.s.hdr.rkey = rmr->rkey;
		uint64_t span = rmr->length < 0x10000 ? rmr->length + 1 : 0x10000;

		w.s.hdr.remote_addr = rmr->iova + u16(in) % span;
		if (flags & 2)
			w.s.hdr.remote_addr &= ~7ULL;
	} else {
		w.s.hdr.rkey = u32(in);
		w.s.hdr.remote_addr = u64(in);
	}
	w.s.hdr.compare_add = u8(in);
	w.s.hdr.swap = u8(in);
	if (qp->cfg.flags & VRE_QP_XRC_INI)  /* the target side's XRC SRQ: a live one's number, or anything */
		w.s.hdr.xrc_srqn = flags & 64 ? u32(in) : pick_srqn(&vms[dest], u8(in));
	if (qp->cfg.flags & VRE_QP_UD) {
		/* The address vector, over the RDMA fields: a GID of the pool, a QPN of a live QP or 1, a Q_Key. */
		struct qp_rec *peer = pick_qp(&vms[dest], u8(in), NULL);

		fuzz_gid(in, w.s.hdr.ud.dgid);
		w.s.hdr.ud.remote_qpn = flags & 8 ? u32(in) : flags & 16 || !peer ? VRDMA_GSI_QPN : peer->cfg.qpn;
		w.s.hdr.ud.remote_qkey = fuzz_qkey(in);
		w.s.hdr.ud.sgid_index = flags & 32 ? u8(in) : u8(in) % 4;
		w.s.hdr.ud.hop_limit = u8(in);
		w.s.hdr.ud.traffic_class = u8(in);
		w.s.hdr.ud.flow_label = u32(in);
	}
	if (w.s.hdr.opcode == VRDMA_WR_LOCAL_INV || w.s.hdr.opcode == VRDMA_WR_SEND_WITH_INV) {
		/* The key to invalidate: of an MR of this VM (LOCAL_INV) or the destination's, or anything. */
		struct mr_rec *inv = pick_mr(w.s.hdr.opcode == VRDMA_WR_LOCAL_INV ? vm : &vms[dest], u8(in));

		w.s.hdr.imm_data = inv && !(flags & 1) ? inv->rkey : u32(in);
	}
	if (w.s.hdr.opcode == VRDMA_WR_REG_MR) {
		/* A fast registration: an MR of this VM by a key of its slot with a new low byte, a page list in guest
		 * memory (or anywhere), an IOVA, a length and access flags near or past what fits. */
		struct mr_rec *mr = pick_mr(vm, u8(in));
		struct vre_pages_desc pages;
		struct ring_rec rec;

		read_pages(in, vm, 1 + u8(in) % 8, &pages, &rec);
		w.s.hdr.reg.key = mr && !(flags & 1) ? (mr->lkey & ~0xffu) | u8(in) : u32(in);
		w.s.hdr.reg.iova = flags & 2 ? u64(in) : (uint64_t)u16(in) << 8;
		w.s.hdr.reg.length = flags & 4 ? u64(in) : (uint64_t)u16(in) * (1 + u8(in) % 8);
		w.s.hdr.reg.page_list = pages.addr + (flags & 8 ? u8(in) : 0);
		w.s.hdr.reg.npages = flags & 16 ? u32(in) : pages.npages;
		w.s.hdr.reg.access = u8(in) & 0x1f;
	}
	if (w.s.hdr.opcode == VRDMA_WR_BIND_MW) {
		/* A bind: a window (or any key) of this VM, an MR of it (or any key), a range near or past the MR's,
		 * window access flags or any; the key kept (so later accesses may use it) or a new low byte. */
		struct mr_rec *mw = pick_mr(vm, u8(in)), *mr = pick_mr(vm, u8(in));

		w.s.hdr.bind.mw_rkey = mw && !(flags & 1) ? mw->rkey : u32(in);
		w.s.hdr.bind.new_rkey = flags & 2 ? (w.s.hdr.bind.mw_rkey & ~0xffu) | u8(in) : w.s.hdr.bind.mw_rkey;
		w.s.hdr.bind.mr_lkey = mr && !(flags & 4) ? mr->lkey : u32(in);
		w.s.hdr.bind.addr = (mr ? mr->iova : 0) + (flags & 8 ? u64(in) : u16(in));
		w.s.hdr.bind.length = flags & 16 ? u64(in) : u16(in);
		w.s.hdr.bind.access = flags & 32 ? u8(in) : u8(in) & VRDMA_MW_ACCESS;
	}
	if (w.s.hdr.send_flags & VRDMA_SEND_INLINE) {
		uint32_t len = flags & 4 ? u16(in) : u16(in) % (qp->cfg.max_inline + 1);

		w.s.hdr.inline_len = len;
		for (uint32_t i = 0; i < len && i < PAGE && in->left; i++)
			((uint8_t *)w.s.sge)[i] = u8(in);
	} else {
		fill_sges(in, vm, w.s.sge, w.s.hdr.num_sge);
	}
	ring_write(vm, &qp->ring, qp->cfg.sq_offset + (uint64_t)(qp->sq_prod & (qp->cfg.sq_depth - 1)) *
		   qp->cfg.sq_stride, &w, qp->cfg.sq_stride < sizeof(w) ? qp->cfg.sq_stride : sizeof(w));
	qp->sq_prod++;
}

/* One receive WQE at the producer index of the QP's receive queue or of its SRQ. */
static void put_recv_wqe(struct in *in, struct vm *vm, struct qp_rec *qp)
{
	struct {
		struct vrdma_recv_wqe hdr;
		struct vrdma_sge sge[PAGE / sizeof(struct vrdma_sge)];
	} w;
	uint32_t max_sge = qp->cfg.max_recv_sge;

	memset(&w, 0, sizeof(w));
	if (qp->cfg.srq != VRE_NO_SRQ)
		max_sge = vm->srqs[qp->cfg.srq].stride / 16;
	w.hdr.wr_id = u16(in);
	w.hdr.num_sge = u8(in) % (max_sge + 2);
	if (w.hdr.num_sge > PAGE / sizeof(struct vrdma_sge) - 1)
		w.hdr.num_sge = PAGE / sizeof(struct vrdma_sge) - 1;
	fill_sges(in, vm, w.sge, w.hdr.num_sge);
	if (qp->cfg.srq != VRE_NO_SRQ) {
		struct srq_rec *srq = &vm->srqs[qp->cfg.srq];

		ring_write(vm, &srq->ring, PAGE + (uint64_t)(srq->prod & (srq->depth - 1)) * srq->stride, &w,
			   srq->stride < sizeof(w) ? srq->stride : sizeof(w));
		srq->prod++;
	} else {
		uint64_t at = qp->cfg.rq_offset +
			      (uint64_t)(qp->rq_prod & (qp->cfg.rq_depth - 1)) * qp->cfg.rq_stride;
		uint64_t len = qp->cfg.rq_stride < sizeof(w) ? qp->cfg.rq_stride : sizeof(w);

		ring_write(vm, &qp->ring, at, &w, len);
		qp->rq_prod++;
	}
}

/*
 * A post: a QP of the VM, 1 to 8 WQEs, then the doorbell (with bit 0 of the ring byte, a value from the input
 * instead of the producer index). The input is read in this order.
 */
static void post(struct in *in, uint32_t dev, bool send)
{
	struct vm *vm = &vms[dev];
	struct qp_rec *qp = pick_qp(vm, u8(in), NULL);
	uint32_t count = 1 + u8(in) % 8;
	uint8_t ring = u8(in);
	struct srq_rec *srq;

	if (!qp)
		return;
	for (uint32_t k = 0; k < count; k++)
		(send ? put_send_wqe : put_recv_wqe)(in, vm, qp);
	if (send) {
		ring_doorbell(vm, qp->cfg.sq_db, ring & 1 ? u32(in) : qp->sq_prod);
	} else if (qp->cfg.srq != VRE_NO_SRQ) {
		srq = &vm->srqs[qp->cfg.srq];
		ring_doorbell(vm, srq->db, ring & 1 ? u32(in) : srq->prod);
	} else {
		ring_doorbell(vm, qp->cfg.rq_db, ring & 1 ? u32(in) : qp->rq_prod);
	}
}

static void op_post_send(struct in *in, struct vre_engine *e, uint32_t dev)
{
	(void)e;
	post(in, dev, true);
}

static void op_post_recv(struct in *in, struct vre_engine *e, uint32_t dev)
{
	(void)e;
	post(in, dev, false);
}

/* The guest consumes completions (or claims to: any consumer index) and arms its CQ. */
static void op_cq_consume(struct in *in, struct vre_engine *e, uint32_t dev)
{
	struct vm *vm = &vms[dev];
	uint8_t flags = u8(in);
	struct cq_rec *cq = &vm->cqs[u8(in) % MAX_SLOTS];
	uint8_t *prod, *cons;
	uint32_t value = 0;

	(void)e;
	if (!cq->live)
		return;
	prod = ring_word(vm, &cq->ring, offsetof(struct vrdma_cq_ring_hdr, prod));
	cons = ring_word(vm, &cq->ring, offsetof(struct vrdma_cq_ring_hdr, cons));
	if (flags & 1)
		value = u32(in);
	else if (prod)
		memcpy(&value, prod, 4);
	if (cons)
		memcpy(cons, &value, 4);
	if (flags & 2) {
		cq->arm_seq++;
		ring_doorbell(vm, cq->db, cq->arm_seq << VRDMA_CQ_ARM_SEQ_SHIFT | (u8(in) & 3));
	}
	if (flags & 4)
		moderate(in, e, dev, u8(in) % (vm->lim.max_cq + 1));
}

static void op_srq_limit(struct in *in, struct vre_engine *e, uint32_t dev)
{
	uint32_t slot = u8(in) % (vms[dev].lim.max_srq + 1);
	int ret = vre_srq_set_limit(e, dev, slot, u8(in));

	CHECK(ret <= 0);
	(void)vre_srq_limit(e, dev, slot);
}

static void op_mem_write(struct in *in, struct vre_engine *e, uint32_t dev)
{
	struct vm *vm = &vms[dev];
	uint64_t gpa = pick_page(vm, u8(in));
	uint8_t len, buf[64];

	(void)e;
	gpa += u16(in) % PAGE;
	len = u8(in) % 64;
	for (uint32_t i = 0; i < len; i++)
		buf[i] = u8(in);
	guest_write(vm, gpa, buf, len);
}

static void op_doorbell(struct in *in, struct vre_engine *e, uint32_t dev)
{
	struct vm *vm = &vms[dev];
	uint32_t page = u8(in), slot = u16(in) % 1024, value = u32(in);

	(void)e;
	ring_doorbell(vm, (vm->lim.doorbell_pages ? page % vm->lim.doorbell_pages : 0) * VRDMA_DB_SLOTS + slot, value);
}

static void take_events(struct vre_engine *e, uint32_t max)
{
	uint32_t n = vre_take_events(e, events, max);

	CHECK(n <= max);
	for (uint32_t i = 0; i < n; i++)
		CHECK(events[i].dev < NDEV);
}

static void op_poll(struct in *in, struct vre_engine *e, uint32_t dev)
{
	uint8_t how = u8(in);

	if (how & 0x40) {
		/* The VM's share changes first (from the bits the budget leaves, so the input format is as it was): a
		 * weight, the latency class, and with the top bit limits small enough to hold it back. */
		struct vre_qos qos = { .weight = 1 + (uint32_t)(how & 0x3f) * 16 % VRE_MAX_WEIGHT,
				       .latency = how & 8 ? VRE_LATENCY_LOW : VRE_LATENCY_NORMAL,
				       .bytes_per_s = how & 0x80 ? 1ull << (how & 31) : 0,
				       .wrs_per_s = (how & 0xa0) == 0xa0 ? 1000 : 0, .wrs_burst = how & 7 };

		CHECK(vre_device_qos(e, dev, &qos) == (vms[dev].open ? 0 : -EINVAL));
	}
	if (how & 1)
		vre_spin(e, 1 + how % 64, 0);
	else
		vre_poll(e, 1 + how % 64);
	if (how & 2)
		take_events(e, 1 + u16(in) % EVENT_BATCH);
	(void)vre_next_deadline(e);
}

static void op_park(struct in *in, struct vre_engine *e, uint32_t dev)
{
	uint8_t unpark = u8(in) & 1;

	(void)dev;
	if (vre_park(e) && unpark)
		vre_unpark(e);
}

static void op_set_memory(struct in *in, struct vre_engine *e, uint32_t dev)
{
	read_memory(in, e, dev);
}

/* What the model does on a device reset: the engine device closes (every object) and opens again. */
static void op_reset(struct in *in, struct vre_engine *e, uint32_t dev)
{
	struct vm *vm = &vms[dev];

	(void)in;
	vre_device_close(e, dev);
	free(vm->doorbells);
	forget_objects(vm);
	open_device(e, dev);
	if (vm->open && vre_device_set_memory(e, dev, vm->regions, vm->nregions) < 0) {
		vm->nregions = 0;  /* a table only a closed device was given: refused now, and so no memory */
		poison_unmapped(vm);
	}
}

/* The device closed and opened again with the doorbell region it had (the model keeps the region across a reset of
 * the engine's side) and its memory table. */
static void reopen(struct vre_engine *e, uint32_t dev)
{
	struct vm *vm = &vms[dev];
	uint32_t pages = vm->lim.doorbell_pages ? vm->lim.doorbell_pages : 1;
	uint8_t *doorbells = vm->doorbells;

	vre_device_close(e, dev);
	open_device(e, dev);
	memcpy(vm->doorbells, doorbells, (size_t)pages * PAGE);
	free(doorbells);
	if (vm->open && vre_device_set_memory(e, dev, vm->regions, vm->nregions) < 0) {
		vm->nregions = 0;
		poison_unmapped(vm);
	}
}

/*
 * A live migration or an upgrade of one VM (engine/state.c): its device suspended and saved. Then, by the input:
 * resumed as it was (a migration that failed); or the device reopened empty and the state loaded into it, which
 * must check and load as it was saved (the same memory table: every page that translated translates), after which
 * the traffic goes on where it stopped; or the state damaged on the way, which the loader refuses whole (the device
 * left empty) or takes as a state it can run, then polled and reset, since the harness's records no longer say what
 * the device holds.
 */
static void op_migrate(struct in *in, struct vre_engine *e, uint32_t dev)
{
	struct vm *vm = &vms[dev];
	uint8_t how = u8(in);
	uint16_t at = u16(in), flip = u8(in) | 1;
	uint8_t *state;
	int64_t size;
	int ret;

	if (!vm->open)
		return;
	CHECK(vre_device_suspend(e, dev, 1) == 0);
	size = vre_device_save(e, dev, NULL, 0);
	CHECK(size >= (int64_t)sizeof(struct vre_state_header) || size == -ENOTSUP);
	if (size < 0 || !(how & 3)) {
		CHECK(vre_device_suspend(e, dev, 0) == 0);
		return;
	}
	state = malloc((size_t)size);
	CHECK(state);
	CHECK(vre_device_save(e, dev, state, (uint64_t)size) == size);
	CHECK(vre_device_save(e, dev, state, (uint64_t)size - 1) == -ENOSPC);
	reopen(e, dev);
	if (!vm->open) {
		free(state);
		forget_objects(vm);
		return;
	}
	if (how & 4) {
		state[at % size] ^= flip;
		ret = vre_device_load(e, dev, state, (uint64_t)size, how & 8 ? VRE_LOAD_CHECK : 0);
		CHECK(ret <= 0);
		if (ret == 0 && !(how & 8)) {
			CHECK(vre_device_suspend(e, dev, 0) == 0);
			vre_poll(e, 16);
			take_events(e, EVENT_BATCH);
		}
		reopen(e, dev);
		forget_objects(vm);
	} else {
		ret = vre_device_load(e, dev, state, (uint64_t)size, VRE_LOAD_CHECK);
		if (ret)
			fprintf(stderr, "engine_fuzz: a saved state refused: %s\n", vre_error(e));
		CHECK(ret == 0);
		ret = vre_device_load(e, dev, state, (uint64_t)size, 0);
		if (ret == -EOPNOTSUPP) {
			/*
			 * A QP aimed at a device by number (as this harness aims them) whose peer holds no GID it could be
			 * found by: a load routes every peer again by GID (restore.c, route_peers) and refuses the state
			 * whole, the device left empty.
			 */
			free(state);
			reopen(e, dev);
			forget_objects(vm);
			return;
		}
		CHECK(ret == 0);
		struct vre_state_header h;

		memcpy(&h, state, sizeof(h));
		CHECK(vre_device_load(e, dev, state, (uint64_t)size, 0) == (h.records ? -EBUSY : 0));  /* objects now */
		CHECK(vre_device_suspend(e, dev, 0) == 0);
	}
	free(state);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	verbose = getenv("ENGINE_FUZZ_VERBOSE") != NULL;
	for (int i = 0; i < NDEV; i++) {
		uint8_t *map = mmap(NULL, (ARENA_PAGES + 2) * PAGE, PROT_READ | PROT_WRITE,
				    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		CHECK(map != MAP_FAILED);
		CHECK(mprotect(map, PAGE, PROT_NONE) == 0);
		CHECK(mprotect(map + (ARENA_PAGES + 1) * PAGE, PAGE, PROT_NONE) == 0);
		vms[i].arena = map + PAGE;
	}
	return 0;
}

/*
 * A packet from the network (RoCE v2): arbitrary bytes, or a packet built from arbitrary fields and then damaged,
 * parsed between arbitrary addresses. What the builder makes, the parser takes back as it was.
 */
static void op_roce(struct in *in, struct vre_engine *e, uint32_t dev)
{
	struct vre_roce_addr addr = { .sport = u16(in), .dport = VRE_ROCE_PORT, .ip_id = u16(in), .ip_frag = u16(in) };
	uint8_t flags = u8(in), buf[VRE_ROCE_MAX_HEADERS + 256 + 8], payload[256];
	struct vre_roce_pkt pkt = { 0 }, back;
	uint32_t len = u8(in), plen = u8(in);
	int n;

	(void)e;
	(void)dev;
	for (int i = 0; i < 16; i++) {
		addr.src[i] = i < 10 || !(flags & 1) ? u8(in) : (i < 12 ? 0xff : u8(in));
		addr.dst[i] = i < 10 || !(flags & 1) ? u8(in) : (i < 12 ? 0xff : u8(in));
	}
	if (flags & 2) {  /* raw bytes off the wire */
		for (uint32_t i = 0; i < len && i < sizeof(buf); i++)
			buf[i] = u8(in);
		vre_roce_parse(buf, len < sizeof(buf) ? len : sizeof(buf), &addr, &back);
		return;
	}
	pkt.opcode = u8(in);
	pkt.solicited = flags & 4 ? 1 : 0;
	pkt.ackreq = flags & 8 ? 1 : 0;
	pkt.pkey = u16(in);
	pkt.dest_qpn = u32(in);
	pkt.psn = u32(in);
	pkt.va = u64(in);
	pkt.rkey = u32(in);
	pkt.dma_len = u32(in);
	pkt.aeth = u32(in);
	pkt.imm = u32(in);
	pkt.qkey = u32(in);
	pkt.src_qpn = u32(in);
	for (uint32_t i = 0; i < plen; i++)
		payload[i] = u8(in);
	n = vre_roce_build(buf, (uint32_t)sizeof(buf), &addr, &pkt, payload, plen);
	if (n < 0)
		return;
	CHECK(vre_roce_parse(buf, (uint32_t)n, &addr, &back) == 0);
	CHECK(back.opcode == pkt.opcode && back.psn == (pkt.psn & 0xffffff) && back.payload_len == plen &&
	      !memcmp(buf + back.payload_off, payload, plen));
	if (flags & 16) {  /* damaged on the way: one byte changed, or the packet cut short */
		uint32_t at = u16(in) % (uint32_t)n;

		buf[at] ^= u8(in) | 1;
		vre_roce_parse(buf, flags & 32 ? at : (uint32_t)n, &addr, &back);
	}
}

typedef void (*op_fn)(struct in *in, struct vre_engine *e, uint32_t dev);

/* The page window the container channel sets around one process's commands (vre_device_page_window): page lists,
 * and the pages they list, outside it are refused from then on; the whole table again, or a part of guest RAM. */
static void op_page_window(struct in *in, struct vre_engine *e, uint32_t dev)
{
	uint64_t lo = (uint64_t)u16(in) * PAGE;
	uint64_t hi = u8(in) & 1 ? UINT64_MAX : lo + (uint64_t)u16(in) * PAGE - 1;
	int ret = vre_device_page_window(e, dev, lo, hi);

	CHECK(ret <= 0 && (ret == 0 || !vms[dev].open || lo > hi));
}

static const op_fn ops[] = {
	op_mr_create, op_mr_destroy, op_cq_create, op_cq_destroy, op_srq_create, op_srq_destroy, op_qp_create,
	op_qp_modify, op_qp_destroy, op_post_send, op_post_recv, op_poll, op_migrate, op_cq_consume, op_mem_write,
	op_doorbell, op_set_memory, op_srq_limit, op_park, op_reset, op_gid_set, op_roce, op_page_window,
};
#define OP_COUNT (sizeof(ops) / sizeof(ops[0]))

/* What the backend makes a call about the whole engine (vrdma.engine.native's _ENGINE_WIDE, and its own polls and
 * packets): under every lock; anything else under the lock of its VM's device only, as the backend's calls are. */
static bool engine_wide(op_fn op)
{
	return op == op_poll || op == op_park || op == op_reset || op == op_gid_set || op == op_roce || op == op_migrate;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct in in = { data, size };
	struct vre_engine *e = vre_engine_new(NDEV);
	/* Pieces of a page and turns of two (one while another device sends small messages; pieces and turns of two
	 * while no other device works): every message of more than two pages moves in pieces, with turns between. */
	const struct vre_sched sched = { .quantum_bytes = 2 * PAGE, .piece_bytes = PAGE, .wr_cost_bytes = 512,
					 .small_piece_bytes = PAGE, .solo_bytes = 2 * PAGE };

	CHECK(e);
	CHECK(vre_sched_set(e, &sched) == 0);
	for (uint32_t dev = 0; dev < NDEV; dev++) {
		struct vm *vm = &vms[dev];

		ASAN_UNPOISON_MEMORY_REGION(vm->arena, ARENA_PAGES * PAGE);
		memset(vm->arena, 0, ARENA_PAGES * PAGE);
		vm->nregions = 0;
		forget_objects(vm);
		read_limits(&in, vm);
		open_device(e, dev);
		read_memory(&in, e, dev);
	}
#ifdef FUZZ_ENGINE_THREAD
	int events_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	struct vre_thread_config thread = { .budget = 16, .threads = 2, .park_after_ns = 20000, .events_fd = events_fd };

	for (uint32_t i = 0; i < VRE_MAX_THREADS; i++)
		thread.cpus[i] = -1;
	CHECK(events_fd >= 0 && vre_thread_start(e, &thread) == 0);
#endif
	for (uint32_t n = 0; n < MAX_OPS && in.left; n++) {
		uint8_t b = u8(&in);
		op_fn op = ops[b % OP_COUNT];
		uint32_t dev = (b / OP_COUNT) & 1, locked = engine_wide(op) ? VRE_NO_DEVICE : dev;

		vre_lock_device(e, locked);  /* VRE_NO_DEVICE: every lock (vre_lock) */
		char before[256];

		snprintf(before, sizeof(before), "%s", vre_error(e));
		op(&in, e, dev);
		CHECK(strnlen(vre_error(e), 256) < 256);
		if (verbose && strcmp(before, vre_error(e)))  /* what each operation the engine refused was told */
			fprintf(stderr, "op %u (%u) on vm%u: %s\n", n, (unsigned)(b % OP_COUNT), dev, vre_error(e));
		vre_unlock_device(e, locked);
#ifdef FUZZ_ENGINE_THREAD
		vre_kick(e, VRE_NO_DEVICE);  /* as a guest's wake-up would: a parked thread looks again */
#endif
	}
#ifdef FUZZ_ENGINE_THREAD
	vre_thread_stop(e);
	close(events_fd);
#endif
	take_events(e, EVENT_BATCH);
	for (uint32_t dev = 0; verbose && dev < NDEV; dev++) {
		struct vre_counters c;

		vre_device_counters(e, dev, &c);
		fprintf(stderr, "vm%u: send %llu recv %llu cqes %llu (errors %llu) bytes %llu flushed %llu rnr %llu "
			"overflows %llu fatal %llu\n", dev, (unsigned long long)c.send_wqes,
			(unsigned long long)c.recv_wqes, (unsigned long long)c.cqes, (unsigned long long)c.error_cqes,
			(unsigned long long)c.bytes, (unsigned long long)c.flushed, (unsigned long long)c.rnr_waits,
			(unsigned long long)c.cq_overflows, (unsigned long long)c.qp_fatal);
	}
	vre_engine_free(e);
	for (uint32_t dev = 0; dev < NDEV; dev++) {
		free(vms[dev].doorbells);
		vms[dev].doorbells = NULL;
		vms[dev].open = false;
	}
	return 0;
}
