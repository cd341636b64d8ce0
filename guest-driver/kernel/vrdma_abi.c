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
	struct vrdma_page_list page_list;
	struct vrdma_cmd_reg_mr cmd_reg_mr;
	struct vrdma_resp_reg_mr resp_reg_mr;
	struct vrdma_cmd_create_cq cmd_create_cq;
	struct vrdma_resp_create_cq resp_create_cq;
	struct vrdma_cmd_modify_cq cmd_modify_cq;
	struct vrdma_cmd_create_qp cmd_create_qp;
	struct vrdma_resp_create_qp resp_create_qp;
	struct vrdma_qp_attr qp_attr;
	struct vrdma_cmd_modify_qp cmd_modify_qp;
	struct vrdma_resp_query_qp resp_query_qp;
	struct vrdma_cmd_create_srq cmd_create_srq;
	struct vrdma_resp_create_srq resp_create_srq;
	struct vrdma_cmd_modify_srq cmd_modify_srq;
	struct vrdma_resp_query_srq resp_query_srq;
	struct vrdma_cmd_create_ah cmd_create_ah;
	struct vrdma_resp_create_ah resp_create_ah;
	struct vrdma_sge sge;
	struct vrdma_send_wqe send_wqe;
	struct vrdma_recv_wqe recv_wqe;
	struct vrdma_cqe cqe;
	struct vrdma_cq_ring_hdr cq_ring_hdr;
	struct vrdma_qp_ring_hdr qp_ring_hdr;
	struct vrdma_srq_ring_hdr srq_ring_hdr;
	struct vrdma_create_cq_cmd create_cq_cmd;
	struct vrdma_create_cq_resp create_cq_resp;
	struct vrdma_create_qp_cmd create_qp_cmd;
	struct vrdma_create_qp_resp create_qp_resp;
	struct vrdma_create_srq_cmd create_srq_cmd;
	struct vrdma_create_srq_resp create_srq_resp;
};

static const struct vrdma_abi_types vrdma_abi_types __used;
