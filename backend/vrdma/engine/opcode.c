// SPDX-License-Identifier: GPL-2.0-only
/*
 * What each work request opcode does, as a table (the way rxe's opcode table drives its requester and responder):
 * whether it names remote memory and with which access right, whether it reads into its local SGEs, consumes a
 * receive WQE, carries immediate data, is an atomic, and which opcode its completion reports, and the RC wire
 * opcodes of its packets (wire.h); a local operation (fast registration, local invalidation, binding a memory
 * window) names the function that does it. wqe.c, req.c, resp.c, rreq.c and ud.c consult the row instead of
 * comparing opcodes; an opcode with no row is refused.
 */
#include "vre.h"

/* A page list names guest-physical pages: only the guest's kernel may map them (its MRs are of its PDs, too). */
static uint8_t reg_mr(struct vre_device *d, const struct vre_qp *qp, const struct vrdma_send_wqe *w)
{
	if (!(qp->cfg.flags & VRE_QP_KERNEL))
		return VRDMA_WC_LOC_QP_OP_ERR;
	return mr_fast_register(d, qp->cfg.pd, w);
}

static uint8_t local_inv(struct vre_device *d, const struct vre_qp *qp, const struct vrdma_send_wqe *w)
{
	return mr_invalidate(d, qp->cfg.pd, qp->cfg.qpn, w->imm_data);
}

#define ROW(op_name, op_flags, access, wc) .name = op_name, .flags = op_flags, .remote_access = access, .wc_opcode = wc
/* The RC opcodes of a message's packets: first, middle, last, only (wire.h); a request of one packet. */
#define WIRE(first, middle, last, only) .wire = { first, middle, last, only }
#define ONE_PACKET(only) .wire = { [WIRE_ONLY] = only }

static const struct vre_opcode opcodes[] = {
	[VRDMA_WR_RDMA_WRITE] = {
		ROW("RDMA_WRITE", OP_REMOTE | OP_PAYLOAD, VRDMA_ACCESS_REMOTE_WRITE, VRDMA_WC_OP_RDMA_WRITE),
		WIRE(ROCE_RC_WRITE_FIRST, ROCE_RC_WRITE_MIDDLE, ROCE_RC_WRITE_LAST, ROCE_RC_WRITE_ONLY) },
	[VRDMA_WR_RDMA_WRITE_WITH_IMM] = {
		ROW("RDMA_WRITE_WITH_IMM", OP_REMOTE | OP_PAYLOAD | OP_RECV | OP_IMM, VRDMA_ACCESS_REMOTE_WRITE,
		    VRDMA_WC_OP_RDMA_WRITE),
		WIRE(ROCE_RC_WRITE_FIRST, ROCE_RC_WRITE_MIDDLE, ROCE_RC_WRITE_LAST_WITH_IMM,
		     ROCE_RC_WRITE_ONLY_WITH_IMM) },
	[VRDMA_WR_SEND] = {
		ROW("SEND", OP_PAYLOAD | OP_RECV, 0, VRDMA_WC_OP_SEND),
		WIRE(ROCE_RC_SEND_FIRST, ROCE_RC_SEND_MIDDLE, ROCE_RC_SEND_LAST, ROCE_RC_SEND_ONLY) },
	[VRDMA_WR_SEND_WITH_IMM] = {
		ROW("SEND_WITH_IMM", OP_PAYLOAD | OP_RECV | OP_IMM, 0, VRDMA_WC_OP_SEND),
		WIRE(ROCE_RC_SEND_FIRST, ROCE_RC_SEND_MIDDLE, ROCE_RC_SEND_LAST_WITH_IMM, ROCE_RC_SEND_ONLY_WITH_IMM) },
	[VRDMA_WR_RDMA_READ] = {
		ROW("RDMA_READ", OP_REMOTE | OP_READS, VRDMA_ACCESS_REMOTE_READ, VRDMA_WC_OP_RDMA_READ),
		ONE_PACKET(ROCE_RC_READ_REQUEST) },
	[VRDMA_WR_ATOMIC_CMP_AND_SWP] = {
		ROW("ATOMIC_CMP_AND_SWP", OP_REMOTE | OP_READS | OP_ATOMIC, VRDMA_ACCESS_REMOTE_ATOMIC,
		    VRDMA_WC_OP_COMP_SWAP),
		ONE_PACKET(ROCE_RC_COMPARE_SWAP) },
	[VRDMA_WR_ATOMIC_FETCH_AND_ADD] = {
		ROW("ATOMIC_FETCH_AND_ADD", OP_REMOTE | OP_READS | OP_ATOMIC, VRDMA_ACCESS_REMOTE_ATOMIC,
		    VRDMA_WC_OP_FETCH_ADD),
		ONE_PACKET(ROCE_RC_FETCH_ADD) },
	[VRDMA_WR_LOCAL_INV] = { ROW("LOCAL_INV", OP_LOCAL, 0, VRDMA_WC_OP_LOCAL_INV), .local = local_inv },
	[VRDMA_WR_BIND_MW] = { ROW("BIND_MW", OP_LOCAL, 0, VRDMA_WC_OP_BIND_MW), .local = mw_bind },
	[VRDMA_WR_SEND_WITH_INV] = {
		ROW("SEND_WITH_INV", OP_PAYLOAD | OP_RECV | OP_INV, 0, VRDMA_WC_OP_SEND),
		WIRE(ROCE_RC_SEND_FIRST, ROCE_RC_SEND_MIDDLE, ROCE_RC_SEND_LAST_WITH_INVALIDATE,
		     ROCE_RC_SEND_ONLY_WITH_INVALIDATE) },
	[VRDMA_WR_REG_MR] = { ROW("REG_MR", OP_LOCAL, 0, VRDMA_WC_OP_REG_MR), .local = reg_mr },
};
#undef ONE_PACKET
#undef WIRE
#undef ROW

VRE_FN const struct vre_opcode *vre_opcode(uint8_t wr_opcode)
{
	if (wr_opcode >= sizeof(opcodes) / sizeof(opcodes[0]) || !opcodes[wr_opcode].name)
		return NULL;
	return &opcodes[wr_opcode];
}
