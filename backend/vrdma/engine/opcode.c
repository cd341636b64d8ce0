// SPDX-License-Identifier: GPL-2.0-only
/*
 * What each work request opcode does, as a table (the way rxe's opcode table drives its requester and responder):
 * whether it names remote memory and with which access right, whether it reads into its local SGEs, consumes a
 * receive WQE, carries immediate data, is an atomic, and which opcode its completion reports. req.c and resp.c
 * consult the row instead of comparing opcodes; an opcode with no row is refused.
 */
#include "vre.h"

static const struct vre_opcode opcodes[] = {
	[VRDMA_WR_RDMA_WRITE] = { "RDMA_WRITE", OP_REMOTE | OP_PAYLOAD, VRDMA_ACCESS_REMOTE_WRITE,
				  VRDMA_WC_OP_RDMA_WRITE },
	[VRDMA_WR_RDMA_WRITE_WITH_IMM] = { "RDMA_WRITE_WITH_IMM", OP_REMOTE | OP_PAYLOAD | OP_RECV | OP_IMM,
					   VRDMA_ACCESS_REMOTE_WRITE, VRDMA_WC_OP_RDMA_WRITE },
	[VRDMA_WR_SEND] = { "SEND", OP_PAYLOAD | OP_RECV, 0, VRDMA_WC_OP_SEND },
	[VRDMA_WR_SEND_WITH_IMM] = { "SEND_WITH_IMM", OP_PAYLOAD | OP_RECV | OP_IMM, 0, VRDMA_WC_OP_SEND },
	[VRDMA_WR_RDMA_READ] = { "RDMA_READ", OP_REMOTE | OP_READS, VRDMA_ACCESS_REMOTE_READ, VRDMA_WC_OP_RDMA_READ },
	[VRDMA_WR_ATOMIC_CMP_AND_SWP] = { "ATOMIC_CMP_AND_SWP", OP_REMOTE | OP_READS | OP_ATOMIC,
					  VRDMA_ACCESS_REMOTE_ATOMIC, VRDMA_WC_OP_COMP_SWAP },
	[VRDMA_WR_ATOMIC_FETCH_AND_ADD] = { "ATOMIC_FETCH_AND_ADD", OP_REMOTE | OP_READS | OP_ATOMIC,
					    VRDMA_ACCESS_REMOTE_ATOMIC, VRDMA_WC_OP_FETCH_ADD },
};

VRE_FN const struct vre_opcode *vre_opcode(uint8_t wr_opcode)
{
	if (wr_opcode >= sizeof(opcodes) / sizeof(opcodes[0]) || !opcodes[wr_opcode].name)
		return NULL;
	return &opcodes[wr_opcode];
}
