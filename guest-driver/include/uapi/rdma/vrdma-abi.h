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
#define VRDMA_UVERBS_ABI_VERSION 2

struct vrdma_alloc_ucontext_resp {
	__u32 doorbell_page;      /* this context's page in the doorbell region */
	__u32 doorbell_page_size;
	__u64 doorbell_offset;    /* mmap() offset of that page on the uverbs file */
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
	__u32 db_slot;
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
	__u32 sq_db_slot;
	__u32 rq_db_slot;
	__u32 max_inline_data;
};

struct vrdma_create_srq_cmd {
	__u64 buf_addr;
	__u64 buf_size;
	__u32 depth;
	__u32 stride;
};

struct vrdma_create_srq_resp {
	__u32 srq_handle;
	__u32 db_slot;
};
/* USER-ABI-END */

#ifndef VRDMA_ASSERT_SIZE
#define VRDMA_ASSERT_SIZE(type, size) _Static_assert(sizeof(struct type) == (size), #type " changed size")
#endif
VRDMA_ASSERT_SIZE(vrdma_alloc_ucontext_resp, 16);
VRDMA_ASSERT_SIZE(vrdma_alloc_pd_resp, 8);
VRDMA_ASSERT_SIZE(vrdma_create_cq_cmd, 24);
VRDMA_ASSERT_SIZE(vrdma_create_cq_resp, 8);
VRDMA_ASSERT_SIZE(vrdma_create_qp_cmd, 40);
VRDMA_ASSERT_SIZE(vrdma_create_qp_resp, 16);
VRDMA_ASSERT_SIZE(vrdma_create_srq_cmd, 24);
VRDMA_ASSERT_SIZE(vrdma_create_srq_resp, 8);

#endif /* VRDMA_ABI_H */
