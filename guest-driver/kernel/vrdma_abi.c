// SPDX-License-Identifier: GPL-2.0-only
/*
 * Every structure of the device ABI, kept in this module's debug information: the ABI drift test
 * (tests/test_abi_drift.py) reads the compiler's layouts from here and compares them with the layouts the backend
 * loads from the same header. A module built from another version of the header fails that test.
 */
#include <linux/compiler.h>

#include "vrdma.h"

struct vrdma_abi_types {
	struct vrdma_config config;
	struct vrdma_doorbell_header doorbell_header;
	struct vrdma_cmd_hdr cmd_hdr;
	struct vrdma_resp_hdr resp_hdr;
	struct vrdma_cmd_query_device cmd_query_device;
	struct vrdma_resp_query_device resp_query_device;
	struct vrdma_cmd_query_port cmd_query_port;
	struct vrdma_resp_query_port resp_query_port;
	struct vrdma_event event;
	struct vrdma_cmd_add_gid cmd_add_gid;
	struct vrdma_cmd_del_gid cmd_del_gid;
	struct vrdma_cmd_alloc_ucontext cmd_alloc_ucontext;
	struct vrdma_resp_alloc_ucontext resp_alloc_ucontext;
	struct vrdma_cmd_destroy cmd_destroy;
	struct vrdma_cmd_alloc_pd cmd_alloc_pd;
	struct vrdma_resp_alloc_pd resp_alloc_pd;
	struct vrdma_alloc_ucontext_resp alloc_ucontext_resp;
	struct vrdma_alloc_pd_resp alloc_pd_resp;
};

static const struct vrdma_abi_types vrdma_abi_types __used;
