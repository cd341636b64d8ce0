// SPDX-License-Identifier: GPL-2.0-only
/*
 * The kernel's own data path: CQs, QPs and SRQs of the guest kernel's RDMA users (context 0), what libvrdma is for a
 * user process. They are created by the same path as a process's (vrdma_cq.c, vrdma_qp.c, vrdma_srq.c), with kernel
 * pages for their rings where a process's are pinned; this file posts to them, polls them and flushes them. Their
 * rings are kernel pages the device reads and writes; work requests are written into them and the
 * producer index into the queue's slot of the kernel's doorbell page (VRDMA_KERNEL_DOORBELL_PAGE), with no command
 * and no exit; completions are read out of the CQ's ring. SGEs carry DMA addresses with the local DMA lkey: the
 * device is a virtio device without VIRTIO_F_ACCESS_PLATFORM, so a DMA address is the guest-physical address the
 * device reads (docs/device-interface.md, "Kernel consumers").
 */
#include <linux/io.h>
#include <linux/log2.h>
#include <linux/slab.h>
#include <linux/virtio.h>

#include "vrdma.h"

/* The kernel's verbs values are the device's for everything posted and completed here. */
static_assert(IB_WR_RDMA_WRITE == VRDMA_WR_RDMA_WRITE && IB_WR_SEND_WITH_IMM == VRDMA_WR_SEND_WITH_IMM &&
	      IB_WR_RDMA_READ == VRDMA_WR_RDMA_READ && IB_WR_ATOMIC_FETCH_AND_ADD == VRDMA_WR_ATOMIC_FETCH_AND_ADD &&
	      IB_WR_LOCAL_INV == VRDMA_WR_LOCAL_INV && IB_WR_SEND_WITH_INV == VRDMA_WR_SEND_WITH_INV &&
	      IB_WR_REG_MR == VRDMA_WR_REG_MR, "work request opcodes are the IB values");
static_assert(IB_SEND_SIGNALED == VRDMA_SEND_SIGNALED && IB_SEND_SOLICITED == VRDMA_SEND_SOLICITED &&
	      IB_SEND_FENCE == VRDMA_SEND_FENCE, "send flags are the IB values");
static_assert(IB_WC_SUCCESS == VRDMA_WC_SUCCESS && IB_WC_WR_FLUSH_ERR == VRDMA_WC_WR_FLUSH_ERR &&
	      IB_WC_RNR_RETRY_EXC_ERR == VRDMA_WC_RNR_RETRY_EXC_ERR && IB_WC_GENERAL_ERR == VRDMA_WC_GENERAL_ERR,
	      "completion statuses are the IB values");
static_assert(IB_WC_RECV == VRDMA_WC_OP_RECV && IB_WC_RECV_RDMA_WITH_IMM == VRDMA_WC_OP_RECV_RDMA_WITH_IMM &&
	      IB_WC_FETCH_ADD == VRDMA_WC_OP_FETCH_ADD && IB_WC_WITH_IMM == VRDMA_WC_WITH_IMM &&
	      IB_WC_GRH == VRDMA_WC_GRH && IB_WC_LOCAL_INV == VRDMA_WC_OP_LOCAL_INV &&
	      IB_WC_WITH_INVALIDATE == VRDMA_WC_WITH_INV && IB_WC_MW_BIND_ERR == VRDMA_WC_MW_BIND_ERR,
	      "completion opcodes and flags are the IB values, but for REG_MR (vrdma_wc_opcode)");
static_assert(RDMA_NETWORK_ROCE_V1 == VRDMA_NETWORK_ROCE_V1 && RDMA_NETWORK_IPV4 == VRDMA_NETWORK_IPV4 &&
	      RDMA_NETWORK_IPV6 == VRDMA_NETWORK_IPV6, "network header types are the kernel's");

static void __iomem *vrdma_kdb(struct vrdma_dev *dev, u32 index)
{
	return dev->db_region + sizeof(u32) * index;
}

/* The parked slot of the page holding doorbell index `index`. */
static void __iomem *vrdma_kdb_parked(struct vrdma_dev *dev, u32 index)
{
	return vrdma_kdb(dev, index - VRDMA_DB_SLOT(index) + VRDMA_DB_SLOT_PARKED);
}

/*
 * A doorbell index the device handed out must be a queue's slot (not a parked or alive slot) of a page past the
 * header, inside the region.
 */
bool vrdma_kdb_ok(struct vrdma_dev *dev, u32 index)
{
	u32 slot = VRDMA_DB_SLOT(index);

	return VRDMA_DB_PAGE(index) >= VRDMA_KERNEL_DOORBELL_PAGE && VRDMA_DB_PAGE(index) < dev->doorbell_pages &&
	       slot > VRDMA_DB_SLOT_PARKED && slot < VRDMA_DB_SLOT_ALIVE;
}

/* -- CQs ------------------------------------------------------------------------------------------------------ */

/* A kernel CQ the device made (vrdma_create_cq): polled and armed from here. */
void vrdma_kcq_init(struct vrdma_cq *cq, u32 entries, u32 db_index)
{
	spin_lock_init(&cq->lock);
	cq->entries = entries;
	cq->cons = 0;
	cq->arm_seq = 0;
	cq->db_index = db_index;
}

static struct ib_qp *vrdma_kqp_by_qpn(struct vrdma_dev *dev, u32 qpn)
{
	struct vrdma_qp *qp = xa_load(&dev->kqps, qpn);

	return qp ? &qp->ibqp : NULL;
}

/*
 * The device's completion opcodes are fixed by its ABI; the kernel's enum ib_wc_opcode is not (6.2 put
 * IB_WC_ATOMIC_WRITE ahead of IB_WC_REG_MR). Every other value is asserted equal above.
 */
static enum ib_wc_opcode vrdma_wc_opcode(u8 opcode)
{
	return opcode == VRDMA_WC_OP_REG_MR ? IB_WC_REG_MR : opcode;
}

static void vrdma_kcq_wc(struct vrdma_dev *dev, const struct vrdma_cqe *cqe, struct ib_wc *wc)
{
	memset(wc, 0, sizeof(*wc));
	wc->wr_id = le64_to_cpu(cqe->wr_id);
	wc->status = cqe->status;
	wc->vendor_err = cqe->status;
	wc->opcode = vrdma_wc_opcode(cqe->opcode);
	wc->byte_len = le32_to_cpu(cqe->byte_len);
	if (cqe->wc_flags & VRDMA_WC_WITH_INV)
		wc->ex.invalidate_rkey = le32_to_cpu(cqe->imm_data);  /* the key the sender invalidated here */
	else
		wc->ex.imm_data = (__force __be32)cqe->imm_data;  /* carried as posted: network order */
	wc->qp = vrdma_kqp_by_qpn(dev, le32_to_cpu(cqe->qp_num));
	wc->src_qp = le32_to_cpu(cqe->src_qp);
	wc->wc_flags = cqe->wc_flags & (VRDMA_WC_WITH_IMM | VRDMA_WC_GRH | VRDMA_WC_WITH_INV);
	if (cqe->network_hdr_type) {
		/* A datagram: the 40 bytes ahead of its payload are this network header (ib_init_ah_attr_from_wc). */
		wc->network_hdr_type = cqe->network_hdr_type;
		wc->wc_flags |= IB_WC_WITH_NETWORK_HDR_TYPE;
	}
	wc->pkey_index = 0;
	wc->port_num = 1;
}

static int vrdma_kcq_flush(struct vrdma_dev *dev, struct vrdma_cq *cq, int num_entries, struct ib_wc *wc);

int vrdma_kcq_poll(struct vrdma_cq *cq, int num_entries, struct ib_wc *wc)
{
	struct vrdma_dev *dev = to_vdev(cq->ibcq.device);
	struct vrdma_cq_ring_hdr *hdr = cq->ring.kbuf.va;
	const struct vrdma_cqe *ring = cq->ring.kbuf.va + PAGE_SIZE;
	unsigned long flags;
	int n = 0;
	u32 prod;

	spin_lock_irqsave(&cq->lock, flags);
	prod = le32_to_cpu(smp_load_acquire(&hdr->prod));  /* the CQEs up to prod are written */
	while (n < num_entries && cq->cons != prod) {
		vrdma_kcq_wc(dev, &ring[cq->cons & (cq->entries - 1)], &wc[n++]);
		cq->cons++;
	}
	smp_store_release(&hdr->cons, cpu_to_le32(cq->cons));  /* their slots are the device's again */
	/* All the device wrote is read: once it is reset, what its QPs still hold completes here, flushed. */
	if (n < num_entries && READ_ONCE(dev->quiesced))
		n += vrdma_kcq_flush(dev, cq, num_entries - n, wc + n);
	spin_unlock_irqrestore(&cq->lock, flags);
	return n;
}

int vrdma_kcq_notify(struct vrdma_cq *cq, enum ib_cq_notify_flags flags)
{
	struct vrdma_dev *dev = to_vdev(cq->ibcq.device);
	struct vrdma_cq_ring_hdr *hdr = cq->ring.kbuf.va;
	u32 kind = (flags & IB_CQ_SOLICITED_MASK) == IB_CQ_SOLICITED ? VRDMA_CQ_ARM_SOLICITED : VRDMA_CQ_ARM_NEXT;
	unsigned long irqflags;
	int missed = 0;

	spin_lock_irqsave(&cq->lock, irqflags);
	cq->arm_seq++;
	writel(cq->arm_seq << VRDMA_CQ_ARM_SEQ_SHIFT | kind, vrdma_kdb(dev, cq->db_index));
	/*
	 * The arm before any look at prod, here or by a caller that polls again after arming: a completion after it
	 * raises an event, one before it is seen (the engine fences between publishing a CQE and reading the arm).
	 */
	mb();
	if (flags & IB_CQ_REPORT_MISSED_EVENTS)
		missed = le32_to_cpu(READ_ONCE(hdr->prod)) != cq->cons;
	spin_unlock_irqrestore(&cq->lock, irqflags);
	return missed;
}

/* -- QPs ------------------------------------------------------------------------------------------------------ */

/* Size one work queue for @wr requests of @sge SGEs (and @inline bytes): a power-of-two depth and stride. */
int vrdma_kqueue_size(struct vrdma_kqueue *q, u32 wr, u32 sge, u32 inline_len, u32 header, u32 min_stride,
		      u32 max_wr)
{
	q->depth = roundup_pow_of_two(max(wr, 1u));
	q->max_sge = max(sge, 1u);
	q->stride = roundup_pow_of_two(max(min_stride, header + max(q->max_sge * (u32)sizeof(struct vrdma_sge),
								   inline_len)));
	spin_lock_init(&q->lock);
	q->prod = 0;
	return q->depth > max_wr || q->stride > PAGE_SIZE ? -EINVAL : 0;
}

/* The WQE of free-running index @index in queue @q of ring @kbuf. */
static void *vrdma_kqueue_at(struct vrdma_kbuf *kbuf, struct vrdma_kqueue *q, u32 index)
{
	return kbuf->va + q->offset + (size_t)(index & (q->depth - 1)) * q->stride;
}

/*
 * The WQEs up to q->prod are written: tell the device through the queue's doorbell slot (writel orders the WQEs'
 * stores before it) and, for a send queue, wake a parked engine as libvrdma does. Once the device is gone they are
 * the flush's: they complete flushed (vrdma_kcq_flush). Called with the queue's lock held.
 */
static void vrdma_kqueue_ring(struct vrdma_dev *dev, struct vrdma_kqueue *q, bool wake)
{
	if (READ_ONCE(dev->quiesced)) {
		schedule_work(&dev->kflush_work);
		return;
	}
	writel(q->prod, vrdma_kdb(dev, q->db_index));
	if (!wake)
		return;  /* the device reads receive queues when it needs one */
	mb();
	if (readl(vrdma_kdb_parked(dev, q->db_index)))
		virtqueue_notify(dev->wake_vq);
}

/* Room for one more WQE: the device's consumer index (in the ring's header page) tells which slots it is done with. */
static bool vrdma_kqueue_full(struct vrdma_kqueue *q, __le32 *cons)
{
	return q->prod - le32_to_cpu(smp_load_acquire(cons)) >= q->depth;
}

static int vrdma_kqp_write_send(struct vrdma_qp *qp, const struct ib_send_wr *wr, struct vrdma_send_wqe *wqe)
{
	struct vrdma_sge *sge = (struct vrdma_sge *)(wqe + 1);
	u32 i, len = 0;

	memset(wqe, 0, sizeof(*wqe));
	if (qp->ibqp.qp_type == IB_QPT_UC && (wr->opcode == IB_WR_RDMA_READ || wr->opcode == IB_WR_ATOMIC_CMP_AND_SWP ||
					      wr->opcode == IB_WR_ATOMIC_FETCH_AND_ADD))
		return -EINVAL;  /* UC has no responses: no READ, no atomics */
	if (qp->ibqp.qp_type == IB_QPT_UD || qp->ibqp.qp_type == IB_QPT_GSI) {
		/* A datagram: its address vector goes with it (the device routes by it; no AH is a device object). */
		if (wr->opcode != IB_WR_SEND && wr->opcode != IB_WR_SEND_WITH_IMM)
			return -EINVAL;
		wqe->ud = container_of(ud_wr(wr)->ah, struct vrdma_ah, ibah)->av;
		wqe->ud.remote_qpn = cpu_to_le32(ud_wr(wr)->remote_qpn);
		wqe->ud.remote_qkey = cpu_to_le32(ud_wr(wr)->remote_qkey);
	}
	switch (wr->opcode) {
	case IB_WR_RDMA_WRITE:
	case IB_WR_RDMA_WRITE_WITH_IMM:
	case IB_WR_RDMA_READ:
		wqe->remote_addr = cpu_to_le64(rdma_wr(wr)->remote_addr);
		wqe->rkey = cpu_to_le32(rdma_wr(wr)->rkey);
		break;
	case IB_WR_ATOMIC_CMP_AND_SWP:
	case IB_WR_ATOMIC_FETCH_AND_ADD:
		wqe->remote_addr = cpu_to_le64(atomic_wr(wr)->remote_addr);
		wqe->rkey = cpu_to_le32(atomic_wr(wr)->rkey);
		wqe->compare_add = cpu_to_le64(atomic_wr(wr)->compare_add);
		wqe->swap = cpu_to_le64(atomic_wr(wr)->swap);
		break;
	case IB_WR_SEND:
	case IB_WR_SEND_WITH_IMM:
		break;
	case IB_WR_SEND_WITH_INV:
	case IB_WR_LOCAL_INV:
		wqe->imm_data = cpu_to_le32(wr->ex.invalidate_rkey);
		break;
	case IB_WR_REG_MR: {
		const struct ib_reg_wr *reg = reg_wr(wr);
		struct vrdma_mr *mr = container_of(reg->mr, struct vrdma_mr, ibmr);

		if (!mr->pages)
			return -EINVAL;  /* not a fast-registration MR */
		/* The device reads the page list when it executes this: the MR is not mapped again before. */
		wqe->reg.iova = cpu_to_le64(mr->ibmr.iova);
		wqe->reg.length = cpu_to_le64(mr->ibmr.length);
		wqe->reg.page_list = cpu_to_le64(virt_to_phys(mr->pages));
		wqe->reg.key = cpu_to_le32(reg->key);
		wqe->reg.access = cpu_to_le32(reg->access & VRDMA_ALL_ACCESS);
		wqe->reg.npages = cpu_to_le32(mr->npages);
		break;
	}
	default:
		return -EINVAL;  /* not an operation of the device (yet): memory windows */
	}
	wqe->wr_id = cpu_to_le64(wr->wr_id);
	wqe->opcode = wr->opcode;
	wqe->send_flags = wr->send_flags & (IB_SEND_FENCE | IB_SEND_SIGNALED | IB_SEND_SOLICITED);
	if (wr->opcode == IB_WR_SEND_WITH_IMM || wr->opcode == IB_WR_RDMA_WRITE_WITH_IMM)
		wqe->imm_data = (__force __le32)wr->ex.imm_data;
	if (wr->send_flags & IB_SEND_INLINE) {
		/* Inline data comes from kernel virtual addresses (as every RDMA driver takes them), copied now. */
		for (i = 0; i < wr->num_sge; i++) {
			if (wr->sg_list[i].length > qp->cap.max_inline_data - len)
				return -EINVAL;
			memcpy((u8 *)(wqe + 1) + len, (void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
			len += wr->sg_list[i].length;
		}
		wqe->send_flags |= VRDMA_SEND_INLINE;
		wqe->inline_len = cpu_to_le32(len);
		return 0;
	}
	if (wr->num_sge > qp->sq.max_sge)
		return -EINVAL;
	for (i = 0; i < wr->num_sge; i++) {
		sge[i].addr = cpu_to_le64(wr->sg_list[i].addr);
		sge[i].length = cpu_to_le32(wr->sg_list[i].length);
		sge[i].lkey = cpu_to_le32(wr->sg_list[i].lkey);
	}
	wqe->num_sge = wr->num_sge;
	return 0;
}

int vrdma_kqp_post_send(struct vrdma_qp *qp, const struct ib_send_wr *wr, const struct ib_send_wr **bad_wr)
{
	struct vrdma_dev *dev = to_vdev(qp->ibqp.device);
	struct vrdma_qp_ring_hdr *hdr = qp->ring.kbuf.va;
	struct vrdma_kqueue *q = &qp->sq;
	unsigned long flags;
	u32 posted;
	int ret = 0;

	spin_lock_irqsave(&q->lock, flags);
	posted = q->prod;
	for (; wr; wr = wr->next) {
		if (vrdma_kqueue_full(q, &hdr->sq_cons)) {
			ret = -ENOMEM;
			break;
		}
		ret = vrdma_kqp_write_send(qp, wr, vrdma_kqueue_at(&qp->ring.kbuf, q, q->prod));
		if (ret)
			break;
		q->prod++;
	}
	if (q->prod != posted)
		vrdma_kqueue_ring(dev, q, true);
	spin_unlock_irqrestore(&q->lock, flags);
	if (ret)
		*bad_wr = wr;
	return ret;
}

/* Receive WQEs into a QP's receive queue or an SRQ's ring (@cons: the device's consumer index in its header). */
static int vrdma_kqueue_post_recv(struct vrdma_dev *dev, struct vrdma_kbuf *kbuf, struct vrdma_kqueue *q,
				  __le32 *cons, const struct ib_recv_wr *wr, const struct ib_recv_wr **bad_wr)
{
	unsigned long flags;
	u32 posted, i;
	int ret = 0;

	spin_lock_irqsave(&q->lock, flags);
	posted = q->prod;
	for (; wr; wr = wr->next) {
		struct vrdma_recv_wqe *wqe = vrdma_kqueue_at(kbuf, q, q->prod);
		struct vrdma_sge *sge = (struct vrdma_sge *)(wqe + 1);

		if (vrdma_kqueue_full(q, cons)) {
			ret = -ENOMEM;
			break;
		}
		if (wr->num_sge > q->max_sge) {
			ret = -EINVAL;
			break;
		}
		wqe->wr_id = cpu_to_le64(wr->wr_id);
		wqe->num_sge = cpu_to_le32(wr->num_sge);
		wqe->reserved = 0;
		for (i = 0; i < wr->num_sge; i++) {
			sge[i].addr = cpu_to_le64(wr->sg_list[i].addr);
			sge[i].length = cpu_to_le32(wr->sg_list[i].length);
			sge[i].lkey = cpu_to_le32(wr->sg_list[i].lkey);
		}
		q->prod++;
	}
	if (q->prod != posted)
		vrdma_kqueue_ring(dev, q, false);
	spin_unlock_irqrestore(&q->lock, flags);
	if (ret)
		*bad_wr = wr;
	return ret;
}

int vrdma_kqp_post_recv(struct vrdma_qp *qp, const struct ib_recv_wr *wr, const struct ib_recv_wr **bad_wr)
{
	struct vrdma_qp_ring_hdr *hdr = qp->ring.kbuf.va;

	if (qp->ibqp.srq) {
		*bad_wr = wr;
		return -EINVAL;  /* its receives are the SRQ's */
	}
	return vrdma_kqueue_post_recv(to_vdev(qp->ibqp.device), &qp->ring.kbuf, &qp->rq, &hdr->rq_cons, wr, bad_wr);
}

/* -- SRQs ----------------------------------------------------------------------------------------------------- */

int vrdma_ksrq_post_recv(struct vrdma_srq *srq, const struct ib_recv_wr *wr, const struct ib_recv_wr **bad_wr)
{
	struct vrdma_srq_ring_hdr *hdr = srq->ring.kbuf.va;

	return vrdma_kqueue_post_recv(to_vdev(srq->ibsrq.device), &srq->ring.kbuf, &srq->rq, &hdr->cons, wr, bad_wr);
}

/* -- device loss ---------------------------------------------------------------------------------------------- */

/*
 * The outstanding WQEs of one queue, from the device's consumer index to the driver's producer index, as flushed
 * completions. Only once the device is reset: its consumer index is the driver's from then on.
 */
static int vrdma_kqueue_flush(struct vrdma_qp *qp, struct vrdma_kqueue *q, __le32 *cons, bool send,
			      int num_entries, struct ib_wc *wc)
{
	unsigned long flags;
	int n = 0;
	u32 at;

	spin_lock_irqsave(&q->lock, flags);
	at = le32_to_cpu(READ_ONCE(*cons));
	if (q->prod - at > q->depth)
		at = q->prod - q->depth;  /* not an index the device could have left: flush what the ring holds */
	for (; n < num_entries && at != q->prod; n++, at++) {
		const __le64 *wr_id = vrdma_kqueue_at(&qp->ring.kbuf, q, at);  /* the first field of both WQE kinds */

		memset(&wc[n], 0, sizeof(wc[n]));
		wc[n].wr_id = le64_to_cpu(*wr_id);
		wc[n].status = IB_WC_WR_FLUSH_ERR;
		wc[n].opcode = send ? IB_WC_SEND : IB_WC_RECV;
		wc[n].qp = &qp->ibqp;
		wc[n].port_num = 1;
	}
	WRITE_ONCE(*cons, cpu_to_le32(at));
	spin_unlock_irqrestore(&q->lock, flags);
	return n;
}

/*
 * The device was lost and reset: every kernel QP feeding @cq completes its outstanding work requests with
 * IB_WC_WR_FLUSH_ERR, as a QP in the error state does, so that the kernel's RDMA users (ib_drain_qp, a ULP waiting
 * for its I/O) see their work end instead of waiting for a device that is gone. Receives posted to an SRQ stay
 * there, as the verbs define for a QP in error. Called with the CQ's lock held.
 */
static int vrdma_kcq_flush(struct vrdma_dev *dev, struct vrdma_cq *cq, int num_entries, struct ib_wc *wc)
{
	struct vrdma_qp *qp;
	unsigned long index, flags;
	int n = 0;

	xa_lock_irqsave(&dev->kqps, flags);  /* a QP being destroyed is erased under it first */
	xa_for_each(&dev->kqps, index, qp) {
		struct vrdma_qp_ring_hdr *hdr = qp->ring.kbuf.va;

		if (n == num_entries)
			break;
		if (qp->ibqp.send_cq == &cq->ibcq)
			n += vrdma_kqueue_flush(qp, &qp->sq, &hdr->sq_cons, true, num_entries - n, wc + n);
		if (qp->ibqp.recv_cq == &cq->ibcq && !qp->ibqp.srq)
			n += vrdma_kqueue_flush(qp, &qp->rq, &hdr->rq_cons, false, num_entries - n, wc + n);
	}
	xa_unlock_irqrestore(&dev->kqps, flags);
	return n;
}

/*
 * Run the completion handler of every kernel CQ once the device is reset (and after each later post), so that their
 * users poll and find their flushed work: the device raises no more events. Under the CQs' xarray lock, as the event
 * dispatcher runs handlers, so that no CQ is destroyed under it.
 */
void vrdma_kflush(struct work_struct *work)
{
	struct vrdma_dev *dev = container_of(work, struct vrdma_dev, kflush_work);
	struct vrdma_cq *cq;
	unsigned long index, flags;

	xa_lock_irqsave(&dev->cqs, flags);
	xa_for_each(&dev->cqs, index, cq)
		if (cq->ring.kbuf.va && cq->ibcq.comp_handler)
			cq->ibcq.comp_handler(&cq->ibcq, cq->ibcq.cq_context);
	xa_unlock_irqrestore(&dev->cqs, flags);
}
