/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * What the RoCE harness's two files share: the two hosts (hosts.c: their engines, guest memory, set-up, and the
 * guests' work requests and completions) and the network between them with its operations (roce_fuzz.c).
 */
#ifndef VRDMA_FUZZ_ROCE_H
#define VRDMA_FUZZ_ROCE_H

#include <sanitizer/asan_interface.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "engine.h"
#include "input.h"
#include "wire.h"
#include "vrdma_dev_api.h"

#define PAGE VRDMA_PAGE_SIZE
#define HOSTS 2
#define NQP 2
#define ARENA_PAGES 96
#define CQ_ENTRIES 256
#define SQ_DEPTH 16
#define SQ_STRIDE 128             /* a header and up to 4 SGEs */
#define RQ_DEPTH 16
#define RQ_STRIDE 128
#define MAX_SGE 4
/* Guest-physical layout, the same on both hosts (page numbers): */
#define PBL_PAGE 1                /* page lists: one page each, 1 + object */
#define CQ_PAGE 8                 /* header page, then CQ_ENTRIES CQEs (2 pages) */
#define QP_PAGE 11                /* QP n at QP_PAGE + 3n: header page, send queue page, receive queue page */
#define MR_PAGE 20                /* the MR: MR_PAGES pages */
#define MR_PAGES 48
#define CANARY_FIRST (MR_PAGE + MR_PAGES)   /* from here to the end: nobody's, never written */
#define CANARY 0xcc
#define MAX_OPS 512
#define MAX_INFLIGHT 1024
#define POOL 64                   /* packets seen on the wire, kept for the forger to mutate */
#define PKT_ROOM 9216
#define MAX_DRAIN 20000
#define POLL_BUDGET 64

#define CHECK(cond, ...)                                                                                      \
	do {                                                                                                  \
		if (!(cond)) {                                                                                \
			fprintf(stderr, "roce_fuzz: check failed at line %d: %s: ", __LINE__, #cond);         \
			fprintf(stderr, __VA_ARGS__);                                                         \
			fputc('\n', stderr);                                                                  \
			abort();                                                                              \
		}                                                                                             \
	} while (0)

struct packet {
	uint32_t len;
	struct vre_roce_addr addr;
	uint8_t data[PKT_ROOM];
};

struct qp_rec {
	uint32_t qpn;
	uint32_t sq_prod, rq_prod;
	uint32_t sq_done, rq_done;    /* completions seen, each in order */
	bool uc;
};

struct host {
	struct vre_engine *e;
	uint8_t *arena;               /* mapped once, guard pages around */
	uint8_t *doorbells;
	uint8_t gid[16];
	uint32_t cq_cons;
	uint32_t mr_lkey, mr_rkey;
	struct qp_rec qps[NQP];
	int64_t now;
};

struct path {
	uint32_t mtu, psn[HOSTS][NQP], rd_atomic, timeout, retry_cnt, rnr_retry, min_rnr_timer;
	bool uc;
};

extern struct host hosts[HOSTS];
extern bool verbose;

uint64_t page_gpa(uint32_t page);
struct vre_pages_desc pages(struct host *h, uint32_t list, uint32_t first, uint32_t npages);
void ring(struct host *h, uint32_t index, uint32_t value);
void read_path(struct in *in, struct path *p);
void setup_host(int i, const struct path *p);
void connect_host(int i, const struct path *p);
void op_post_send(struct in *in);
void op_post_recv(struct in *in);
void op_migrate(struct in *in);
void consume(struct host *h);

#endif /* VRDMA_FUZZ_ROCE_H */
