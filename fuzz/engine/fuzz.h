/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * What the engine fuzzer's files share (engine_fuzz.c says what the harness does): the input reader, the fake
 * VMs' records, and the helpers of vm.c (memory, limits, page lists, rings, doorbells) and objects.c (creating,
 * modifying and destroying the engine's objects as the model would).
 */
#ifndef VRDMA_ENGINE_FUZZ_H
#define VRDMA_ENGINE_FUZZ_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <sanitizer/asan_interface.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "engine.h"
#include "input.h"
#include "vrdma_dev_api.h"

#define NDEV 2
#define PAGE VRDMA_PAGE_SIZE
#define ARENA_PAGES 64
#define MAX_REGIONS 4
#define MAX_SLOTS 16              /* the largest object table the harness gives a device */
#define NO_CQ UINT32_MAX          /* a QP record's CQ when it holds none (XRC: an initiator's receive CQ, a target's) */
#define MAX_RING_PAGES 32         /* pages of an object's buffer the harness remembers (to write WQEs into) */
#define MAX_OPS 256
#define EVENT_BATCH 512
#define DEFAULT_MAX_MSG (1ULL << 31)

/* Abort with a message libFuzzer shows (and records the input as a crash). */
#define CHECK(cond)                                                                                           \
	do {                                                                                                  \
		if (!(cond)) {                                                                                \
			fprintf(stderr, "engine_fuzz: check failed at line %d: %s\n", __LINE__, #cond);      \
			abort();                                                                              \
		}                                                                                             \
	} while (0)

/* -- the fake VMs ---------------------------------------------------------------------------------------- */

/* The pages of an object's buffer, as its page list named them when it was created. */
struct ring_rec {
	uint32_t npages;
	uint64_t gpa[MAX_RING_PAGES];
};

struct mr_rec {
	bool live;
	uint32_t lkey, rkey;
	uint64_t iova, length;
};

struct cq_rec {
	bool live;
	uint32_t refs;
	uint32_t entries, db, arm_seq;
	struct ring_rec ring;
};

struct srq_rec {
	bool live;
	uint32_t refs;
	uint32_t depth, stride, db, prod;
	uint32_t xrcd, cq, srqn;  /* an XRC SRQ's (xrcd 0: a basic SRQ) */
	struct ring_rec ring;
};

struct qp_rec {
	bool live;
	struct vre_qp_config cfg;
	uint32_t sq_prod, rq_prod;
	struct ring_rec ring;
};

struct vm {
	uint8_t *arena;           /* ARENA_PAGES pages, mapped once with a guard page on each side */
	struct vre_region regions[MAX_REGIONS];
	uint32_t nregions;
	uint8_t *doorbells;
	struct vre_device_limits lim;
	bool open;
	struct mr_rec mrs[MAX_SLOTS];
	struct cq_rec cqs[MAX_SLOTS];
	struct srq_rec srqs[MAX_SLOTS];
	struct qp_rec qps[MAX_SLOTS];
};

extern struct vm vms[NDEV];
extern struct vre_event events[EVENT_BATCH];
extern bool verbose;              /* ENGINE_FUZZ_VERBOSE=1: print each input's engine counters (to check seeds) */

void guest_write(struct vm *vm, uint64_t gpa, const void *data, uint64_t len);
/* GIDs and Q_Keys from small pools (so that datagrams find their way), or anything. */
void fuzz_gid(struct in *in, uint8_t *gid);
void device_gid(uint32_t dev, uint8_t *gid);   /* the GID a device is given when it opens */
uint32_t fuzz_qkey(struct in *in);
void op_gid_set(struct in *in, struct vre_engine *e, uint32_t dev);
uint64_t pick_page(struct vm *vm, uint32_t k);
void poison_unmapped(struct vm *vm);
void read_memory(struct in *in, struct vre_engine *e, uint32_t dev);
void read_limits(struct in *in, struct vm *vm);
void open_device(struct vre_engine *e, uint32_t dev);
void forget_objects(struct vm *vm);
void read_pages(struct in *in, struct vm *vm, uint64_t want, struct vre_pages_desc *desc, struct ring_rec *rec);
void ring_write(struct vm *vm, const struct ring_rec *rec, uint64_t off, const void *data, uint64_t len);
uint8_t *ring_word(struct vm *vm, const struct ring_rec *rec, uint64_t off);
void ring_doorbell(struct vm *vm, uint32_t index, uint32_t value);
uint32_t draw_db(struct in *in, struct vm *vm, bool raw);
uint64_t pages_for(uint64_t bytes);
uint32_t key_for(struct in *in, uint32_t slot, uint32_t table, bool raw);
void op_mr_create(struct in *in, struct vre_engine *e, uint32_t dev);
void op_mr_destroy(struct in *in, struct vre_engine *e, uint32_t dev);
void moderate(struct in *in, struct vre_engine *e, uint32_t dev, uint32_t slot);
void op_cq_create(struct in *in, struct vre_engine *e, uint32_t dev);
void op_cq_destroy(struct in *in, struct vre_engine *e, uint32_t dev);
void op_srq_create(struct in *in, struct vre_engine *e, uint32_t dev);
void op_srq_destroy(struct in *in, struct vre_engine *e, uint32_t dev);
void op_qp_create(struct in *in, struct vre_engine *e, uint32_t dev);
void op_qp_destroy(struct in *in, struct vre_engine *e, uint32_t dev);
struct qp_rec *pick_qp(struct vm *vm, uint8_t k, uint32_t *slot);
struct mr_rec *pick_mr(struct vm *vm, uint8_t k);
/* The SRQ number of a live XRC SRQ of a VM, named by an input byte (0 if it has none). */
uint32_t pick_srqn(struct vm *vm, uint8_t k);
void op_qp_modify(struct in *in, struct vre_engine *e, uint32_t dev);

#endif /* VRDMA_ENGINE_FUZZ_H */
