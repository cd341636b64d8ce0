/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR BSD-2-Clause */
/*
 * vrdma user ABI: the driver-specific data (udata) that vrdma.ko and the rdma-core provider libvrdma exchange
 * through the uverbs commands, native endian (both sides run in the same guest). rdma-core carries this file as
 * kernel-headers/rdma/vrdma-abi.h and generates its DECLARE_DRV_CMD wrappers from it, so the structs stay
 * simple: one member a line, every size a multiple of 8 (the wrappers assert it), checked below.
 * The device API (what either side says to the device) is guest-driver/include/vrdma_dev_api.h.
 */
#ifndef VRDMA_ABI_H
#define VRDMA_ABI_H

#include <linux/types.h>

/* USER-ABI-BEGIN */
#define VRDMA_UVERBS_ABI_VERSION 3

/*
 * Doorbells: the device names every queue's slot by its doorbell index (page * VRDMA_DB_SLOTS + slot in the
 * region, vrdma_dev_api.h). A context starts with one page and gets more as it creates queues; each create
 * response gives, with the index, the mmap() offset of the page holding it: the provider maps a page the first
 * time a queue names it, and only pages of its own context can be mapped.
 */

struct vrdma_alloc_ucontext_resp {
	__u32 doorbell_page;      /* this context's first page in the doorbell region (its alive slot is read) */
	__u32 doorbell_page_size;
	__u64 doorbell_offset;    /* mmap() offset of that page on the uverbs file */
	__u32 doorbell_pages;     /* pages in the region: every doorbell index is below doorbell_pages * 1024 */
	__u32 reserved;
};

struct vrdma_alloc_pd_resp {
	__u32 pdn;                /* the device's handle of the PD */
	__u32 reserved;
};

/* User rings: the provider allocates the buffer (page-aligned), the kernel pins it and hands its pages over. */
struct vrdma_create_cq_cmd {
	__u64 buf_addr;
	__u64 buf_size;
	__u32 entries;            /* power of two; the ring holds entries CQEs */
	__u32 reserved;
};

struct vrdma_create_cq_resp {
	__u32 cq_handle;
	__u32 db_index;
	__u64 db_offset;          /* mmap() offset of the page of db_index */
};

struct vrdma_create_qp_cmd {
	__u64 buf_addr;
	__u64 buf_size;
	__u32 sq_depth;
	__u32 rq_depth;
	__u32 sq_stride;
	__u32 rq_stride;
	__u32 sq_offset;
	__u32 rq_offset;
};

struct vrdma_create_qp_resp {
	__u32 qpn;
	__u32 sq_db_index;
	__u32 rq_db_index;        /* 0 with an SRQ */
	__u32 max_inline_data;
	__u64 sq_db_offset;       /* mmap() offsets of the pages of the two indexes */
	__u64 rq_db_offset;
};

struct vrdma_create_srq_cmd {
	__u64 buf_addr;
	__u64 buf_size;
	__u32 depth;
	__u32 stride;
};

struct vrdma_create_srq_resp {
	__u32 srq_handle;
	__u32 db_index;
	__u64 db_offset;
};
/* USER-ABI-END */

#ifndef VRDMA_ASSERT_SIZE
#define VRDMA_ASSERT_SIZE(type, size) _Static_assert(sizeof(struct type) == (size), #type " changed size")
#endif
VRDMA_ASSERT_SIZE(vrdma_alloc_ucontext_resp, 24);
VRDMA_ASSERT_SIZE(vrdma_alloc_pd_resp, 8);
VRDMA_ASSERT_SIZE(vrdma_create_cq_cmd, 24);
VRDMA_ASSERT_SIZE(vrdma_create_cq_resp, 16);
VRDMA_ASSERT_SIZE(vrdma_create_qp_cmd, 40);
VRDMA_ASSERT_SIZE(vrdma_create_qp_resp, 32);
VRDMA_ASSERT_SIZE(vrdma_create_srq_cmd, 24);
VRDMA_ASSERT_SIZE(vrdma_create_srq_resp, 16);

#endif /* VRDMA_ABI_H */
