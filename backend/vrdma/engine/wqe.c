// SPDX-License-Identifier: GPL-2.0-only
/*
 * A send WQE, as both requesters read it (req.c for a peer on this engine, rreq.c for one on another host): copied
 * out of its ring, its local data checked (opcode, SGE count, inline length; keys, PD, bounds and access of every
 * SGE) into segments, and its completion at the head of the queue. Below both, so that neither borrows the other's.
 */
#include <string.h>

#include "vre.h"

static const uint32_t rnr_timer_us[32] = {
	655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840, 5120, 7680,
	10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520,
};

VRE_FN int64_t rnr_wait_ns(uint32_t timer)
{
	return (int64_t)rnr_timer_us[timer & 31] * 1000;
}

/*
 * Build segments from the SGEs of a WQE of device d whose memory is PD pd's, checking keys, PD, bounds and (if
 * asked) local write access. The local DMA lkey names guest RAM directly, and only the kernel's queues (`kernel`)
 * may use it.
 */
VRE_FN uint8_t sges_to_segs(struct vre_device *d, uint32_t pd, bool kernel, const struct vrdma_sge *sge, uint32_t n,
			    bool need_write, uint64_t max_msg, struct seg *segs, uint32_t *nsegs, uint64_t *total)
{
	uint64_t sum = 0;
	uint32_t k = 0;

	for (uint32_t i = 0; i < n; i++) {
		struct vrdma_sge s = sge[i];
		struct vre_mr *mr;
		uint64_t off;

		if (!s.length)
			continue;
		if (kernel && s.lkey == VRDMA_LOCAL_DMA_LKEY) {
			uint8_t *hva = gpa_range(d, s.addr, s.length);

			if (!hva)
				return VRDMA_WC_LOC_PROT_ERR;
			segs[k++] = (struct seg){ .buf = hva, .len = s.length, .log = &d->log, .gpa = s.addr };
		} else {
			mr = mr_by_key(d, s.lkey, false);
			if (!mr || mr->cfg.pd != pd || !mr_range(mr, s.addr, s.length, &off) ||
			    (need_write && !(mr->cfg.access & VRDMA_ACCESS_LOCAL_WRITE)))
				return VRDMA_WC_LOC_PROT_ERR;
			segs[k++] = (struct seg){ .mem = &mr->mem, .off = off, .len = s.length };
		}
		sum += s.length;  /* at most 4096/16 SGEs of < 2^32 bytes: cannot wrap 64 bits */
	}
	if (sum > max_msg)
		return VRDMA_WC_LOC_LEN_ERR;
	*nsegs = k;
	*total = sum;
	return VRDMA_WC_SUCCESS;
}

/*
 * Retire the send WQE at the head of the queue, then complete it. The consumer index is published first: a
 * provider that sees the completion must also see the slot free (it refuses posts into a full ring).
 */
VRE_FN void complete_send(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, const struct vrdma_send_wqe *w,
		   uint8_t status, uint32_t byte_len)
{
	struct vrdma_qp_ring_hdr *hdr = (struct vrdma_qp_ring_hdr *)mem_at(&qp->ring, 0);
	const struct vre_opcode *op = vre_opcode(w->opcode);
	struct vrdma_cqe cqe = { .wr_id = w->wr_id, .status = status, .opcode = op ? op->wc_opcode : VRDMA_WC_OP_SEND,
				 .byte_len = byte_len, .qp_num = qp->cfg.qpn };

	qp->sq_head++;
	qp->piece = (struct vre_piece){ 0 };  /* the next WQE's message starts from its first byte */
	store_release(&hdr->sq_cons, qp->sq_head);
	mem_dirty(&qp->ring, 0, sizeof(*hdr));
	if (status != VRDMA_WC_SUCCESS)
		qp->counters.error_cqes++;
	if (status == VRDMA_WC_WR_FLUSH_ERR)
		qp->counters.flushed++;
	if (status != VRDMA_WC_SUCCESS || qp->cfg.sq_sig_all || (w->send_flags & VRDMA_SEND_SIGNALED))
		cq_push(e, d, d->cqs[qp->cfg.send_cq], &cqe, false);
}

/* The requester's own checks: its opcode, and its local data (inline, or SGEs of its own MRs). */
VRE_FN uint8_t wqe_local_data(struct vre_request *r)
{
	const struct vrdma_send_wqe *h = &r->w->hdr;
	bool is_inline = h->send_flags & VRDMA_SEND_INLINE;
	uint8_t status;

	if (!r->op || (is_inline && (r->op->flags & OP_READS)))
		return VRDMA_WC_LOC_QP_OP_ERR;
	/* A datagram QP sends, with or without immediate data, and does nothing else; a UC QP neither reads nor
	 * does atomics (they need a response, which UC has not). */
	if ((r->qp->cfg.flags & VRE_QP_UD) && (r->op->flags & ~(OP_RECV | OP_IMM | OP_PAYLOAD)))
		return VRDMA_WC_LOC_QP_OP_ERR;
	if ((r->qp->cfg.flags & VRE_QP_UC) && (r->op->flags & (OP_READS | OP_ATOMIC)))
		return VRDMA_WC_LOC_QP_OP_ERR;
	if (is_inline) {
		if (h->inline_len > r->qp->cfg.max_inline)
			return VRDMA_WC_LOC_LEN_ERR;
		r->len = h->inline_len;
		if (r->len)
			r->local[r->nlocal++] = (struct seg){ .buf = r->w->inline_data, .len = r->len };
	} else {
		if (h->num_sge > r->qp->cfg.max_send_sge)
			return VRDMA_WC_LOC_QP_OP_ERR;
		status = sges_to_segs(r->d, r->qp->cfg.pd, r->qp->cfg.flags & VRE_QP_KERNEL, r->w->sge, h->num_sge,
				      r->op->flags & OP_READS, r->d->lim.max_msg_size, r->local, &r->nlocal, &r->len);
		if (status != VRDMA_WC_SUCCESS)
			return status;
	}
	if ((r->op->flags & OP_ATOMIC) && (r->len != 8 || r->nlocal != 1 || (h->remote_addr & 7)))
		return r->len != 8 || r->nlocal != 1 ? VRDMA_WC_LOC_LEN_ERR : VRDMA_WC_REM_INV_REQ_ERR;
	return VRDMA_WC_SUCCESS;
}

VRE_FN void sq_wqe(const struct vre_qp *qp, uint32_t index, struct send_wqe *w)
{
	memcpy(w, mem_at(&qp->ring, qp->cfg.sq_offset + (uint64_t)(index & (qp->cfg.sq_depth - 1)) * qp->cfg.sq_stride),
	       qp->cfg.sq_stride);
}
