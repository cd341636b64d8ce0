// SPDX-License-Identifier: GPL-2.0-only
/*
 * vrdma_kverbs_test: a kernel RDMA consumer, built like vrdma.ko, that does at load time what the kernel verbs API
 * asks of a device (a PD with the local DMA lkey, a CQ with a completion handler armed by ib_req_notify_cq, an RC QP,
 * ib_post_recv and ib_post_send with DMA-mapped buffers, ib_poll_cq) and checks every byte that arrives.
 *
 * Loaded with `modprobe vrdma_kverbs_test [device=vrdma0] [messages=64] [size=5000] [srq=1]`, it connects a QP to
 * itself over the device's link-local GID, sends `messages` messages of `size` bytes (each a different pattern, every
 * other one with immediate data) and one inline message, and loads only if every completion and every byte was
 * right; it says what it did, or what went wrong, in the kernel log. `rmmod` unloads it (it holds nothing once
 * loaded). With srq=1 the receives are posted to a shared receive queue armed with a limit of 1, and the module also
 * waits for the SRQ-limit event the last receive raises. With await_loss=SECONDS it then posts `messages` receives
 * that no message will match, logs "waiting for the device to be lost", and loads only if, within that time, the
 * device is lost and every one of them completes with IB_WC_WR_FLUSH_ERR, as does a send posted after that.
 * With frwr=1 it then registers a DMA-mapped buffer by fast registration (ib_alloc_mr, ib_map_mr_sg, IB_WR_REG_MR
 * with a new key), RDMA-writes the messages into it and reads them back through that key, invalidates it
 * (IB_WR_LOCAL_INV), and checks that a write with the invalidated key fails with IB_WC_REM_ACCESS_ERR.
 */
#include <linux/completion.h>
#include <linux/dma-mapping.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <rdma/ib_cache.h>
#include <rdma/ib_verbs.h>

static char *device = "vrdma0";
module_param(device, charp, 0444);
MODULE_PARM_DESC(device, "RDMA device to test (default vrdma0)");
static uint messages = 64;
module_param(messages, uint, 0444);
MODULE_PARM_DESC(messages, "messages to send and receive (1..256, default 64)");
static uint size = 5000;
module_param(size, uint, 0444);
MODULE_PARM_DESC(size, "bytes per message (1..65536, default 5000: spans pages)");
static bool srq;
module_param(srq, bool, 0444);
MODULE_PARM_DESC(srq, "receive through a shared receive queue (default no)");
static bool frwr;
module_param(frwr, bool, 0444);
MODULE_PARM_DESC(frwr, "then fast registration, RDMA through its key, local invalidation (default no)");
static uint await_loss;
module_param(await_loss, uint, 0444);
MODULE_PARM_DESC(await_loss, "then wait this many seconds for the device's loss to flush posted receives (0: no)");

#define INLINE_LEN 48
#define TIMEOUT (10 * HZ)

struct kv_test {
	struct ib_device *ibdev;
	struct ib_pd *pd;
	struct ib_cq *cq;
	struct ib_qp *qp;
	struct ib_srq *srq;		/* srq=1: where the receives are posted */
	struct completion limit_event;	/* IB_EVENT_SRQ_LIMIT_REACHED */
	u8 *send_buf;			/* messages * size, then INLINE_LEN */
	u8 *recv_buf;			/* (messages + 1) * size */
	u64 send_dma;
	u64 recv_dma;
	struct completion event;
	unsigned int events;
	u32 qpn;
};

static void kv_comp_handler(struct ib_cq *cq, void *context)
{
	struct kv_test *t = context;

	t->events++;
	complete(&t->event);
}

static void kv_srq_event(struct ib_event *event, void *context)
{
	struct kv_test *t = context;

	if (event->event == IB_EVENT_SRQ_LIMIT_REACHED && event->element.srq == t->srq)
		complete(&t->limit_event);
	else
		pr_warn("vrdma_kverbs_test: unexpected event %s\n", ib_event_msg(event->event));
}

static u8 kv_byte(u32 message, u32 i)
{
	return (u8)(message * 31 + i * 7 + (i >> 8));
}

/* The device's link-local GID (fe80::/64): the one whose MAC the core resolves without a route. */
static int kv_gid_index(struct kv_test *t, union ib_gid *gid)
{
	struct ib_port_attr port;
	u32 i;

	if (ib_query_port(t->ibdev, 1, &port))
		return -ENODEV;
	for (i = 0; i < port.gid_tbl_len; i++) {
		if (rdma_query_gid(t->ibdev, 1, i, gid))
			continue;
		if (gid->raw[0] == 0xfe && (gid->raw[1] & 0xc0) == 0x80)
			return i;
	}
	return -ENOENT;
}

static int kv_connect(struct kv_test *t)
{
	struct ib_qp_attr attr = {};
	union ib_gid gid;
	int index, ret;

	index = kv_gid_index(t, &gid);
	if (index < 0) {
		pr_err("vrdma_kverbs_test: %s has no link-local GID\n", device);
		return index;
	}
	attr.qp_state = IB_QPS_INIT;
	attr.pkey_index = 0;
	attr.port_num = 1;
	attr.qp_access_flags = IB_ACCESS_LOCAL_WRITE | (frwr ? IB_ACCESS_REMOTE_WRITE | IB_ACCESS_REMOTE_READ : 0);
	ret = ib_modify_qp(t->qp, &attr, IB_QP_STATE | IB_QP_PKEY_INDEX | IB_QP_PORT | IB_QP_ACCESS_FLAGS);
	if (ret)
		return ret;
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IB_QPS_RTR;
	attr.path_mtu = IB_MTU_1024;
	attr.dest_qp_num = t->qp->qp_num;	/* itself */
	attr.rq_psn = 0;
	attr.max_dest_rd_atomic = 1;
	attr.min_rnr_timer = 12;
	attr.ah_attr.type = RDMA_AH_ATTR_TYPE_ROCE;
	rdma_ah_set_port_num(&attr.ah_attr, 1);
	rdma_ah_set_grh(&attr.ah_attr, &gid, 0, index, 1, 0);
	ret = ib_modify_qp(t->qp, &attr, IB_QP_STATE | IB_QP_AV | IB_QP_PATH_MTU | IB_QP_DEST_QPN | IB_QP_RQ_PSN |
			   IB_QP_MAX_DEST_RD_ATOMIC | IB_QP_MIN_RNR_TIMER);
	if (ret)
		return ret;
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IB_QPS_RTS;
	attr.sq_psn = 0;
	attr.timeout = 14;
	attr.retry_cnt = 7;
	attr.rnr_retry = 7;
	attr.max_rd_atomic = 1;
	return ib_modify_qp(t->qp, &attr, IB_QP_STATE | IB_QP_SQ_PSN | IB_QP_TIMEOUT | IB_QP_RETRY_CNT |
			    IB_QP_RNR_RETRY | IB_QP_MAX_QP_RD_ATOMIC);
}

static int kv_post(struct kv_test *t)
{
	const struct ib_recv_wr *bad_recv;
	const struct ib_send_wr *bad_send;
	struct ib_sge sge;
	u32 m, i;
	int ret;

	for (m = 0; m <= messages; m++) {
		struct ib_recv_wr wr = { .wr_id = 0x10000 + m, .sg_list = &sge, .num_sge = 1 };

		sge = (struct ib_sge){ .addr = t->recv_dma + (u64)m * size, .length = size,
				       .lkey = t->pd->local_dma_lkey };
		ret = t->srq ? ib_post_srq_recv(t->srq, &wr, &bad_recv) : ib_post_recv(t->qp, &wr, &bad_recv);
		if (ret)
			return ret;
	}
	for (m = 0; m < messages; m++) {
		struct ib_send_wr wr = { .wr_id = m, .sg_list = &sge, .num_sge = 1, .send_flags = IB_SEND_SIGNALED,
					 .opcode = m % 2 ? IB_WR_SEND_WITH_IMM : IB_WR_SEND,
					 .ex.imm_data = cpu_to_be32(0xc0de0000 + m) };

		sge = (struct ib_sge){ .addr = t->send_dma + (u64)m * size, .length = size,
				       .lkey = t->pd->local_dma_lkey };
		ret = ib_post_send(t->qp, &wr, &bad_send);
		if (ret)
			return ret;
	}
	/* Inline: the data comes from a kernel virtual address and is copied at post time. */
	for (i = 0; i < INLINE_LEN; i++)
		t->send_buf[(size_t)messages * size + i] = kv_byte(messages, i);
	{
		struct ib_send_wr wr = { .wr_id = messages, .sg_list = &sge, .num_sge = 1, .opcode = IB_WR_SEND,
					 .send_flags = IB_SEND_SIGNALED | IB_SEND_INLINE };

		sge = (struct ib_sge){ .addr = (uintptr_t)(t->send_buf + (size_t)messages * size),
				       .length = INLINE_LEN };
		ret = ib_post_send(t->qp, &wr, &bad_send);
		memset(t->send_buf + (size_t)messages * size, 0, INLINE_LEN);  /* already copied: gone from here */
	}
	return ret;
}

/* One completion: right QP, status, opcode, length and immediate data. */
static int kv_check_wc(struct kv_test *t, const struct ib_wc *wc, unsigned long *seen)
{
	bool recv = wc->wr_id >= 0x10000;
	u32 m = recv ? wc->wr_id - 0x10000 : wc->wr_id;
	u32 len = m == messages ? INLINE_LEN : size;

	if (wc->status != IB_WC_SUCCESS || wc->qp != t->qp || m > messages || test_bit(m + recv * 512, seen)) {
		pr_err("vrdma_kverbs_test: bad completion: wr_id %#llx status %d (%s) qp %s\n", wc->wr_id, wc->status,
		       ib_wc_status_msg(wc->status), wc->qp == t->qp ? "right" : "wrong");
		return -EIO;
	}
	set_bit(m + recv * 512, seen);
	if (!recv)
		return wc->opcode == IB_WC_SEND ? 0 : -EIO;
	if (wc->byte_len != len || (m % 2 && m < messages) != !!(wc->wc_flags & IB_WC_WITH_IMM) ||
	    (wc->wc_flags & IB_WC_WITH_IMM && be32_to_cpu(wc->ex.imm_data) != 0xc0de0000 + m)) {
		pr_err("vrdma_kverbs_test: receive %u: %u bytes, flags %#x, immediate %#x\n", m, wc->byte_len,
		       wc->wc_flags, be32_to_cpu(wc->ex.imm_data));
		return -EIO;
	}
	return 0;
}

/* Sleep on the completion handler, poll, re-arm (REPORT_MISSED_EVENTS closes the race), until all arrived. */
static int kv_wait(struct kv_test *t)
{
	unsigned long *seen = bitmap_zalloc(1024, GFP_KERNEL);
	u32 want = 2 * (messages + 1), got = 0;
	struct ib_wc wc[16];
	int n, i, ret = 0;

	if (!seen)
		return -ENOMEM;
	while (got < want && !ret) {
		if (!wait_for_completion_timeout(&t->event, TIMEOUT)) {
			pr_err("vrdma_kverbs_test: %u of %u completions after %d s\n", got, want, TIMEOUT / HZ);
			ret = -ETIMEDOUT;
			break;
		}
		do {
			while ((n = ib_poll_cq(t->cq, ARRAY_SIZE(wc), wc)) > 0)
				for (i = 0; i < n && !ret; i++, got++)
					ret = kv_check_wc(t, &wc[i], seen);
		} while (!ret && got < want && ib_req_notify_cq(t->cq, IB_CQ_NEXT_COMP |
							       IB_CQ_REPORT_MISSED_EVENTS) > 0);
	}
	bitmap_free(seen);
	return ret;
}

static int kv_check_data(struct kv_test *t)
{
	u32 m, i;

	for (m = 0; m <= messages; m++) {
		u32 len = m == messages ? INLINE_LEN : size;

		for (i = 0; i < len; i++) {
			if (t->recv_buf[(size_t)m * size + i] != kv_byte(m, i)) {
				pr_err("vrdma_kverbs_test: message %u, byte %u: %#x, sent %#x\n", m, i,
				       t->recv_buf[(size_t)m * size + i], kv_byte(m, i));
				return -EIO;
			}
		}
	}
	return 0;
}

static int kv_run(struct kv_test *t)
{
	struct ib_cq_init_attr cq_attr = { .cqe = 2 * (messages + 1) };
	struct ib_qp_init_attr qp_attr = {
		.qp_type = IB_QPT_RC, .sq_sig_type = IB_SIGNAL_REQ_WR,
		.cap = { .max_send_wr = messages + 1, .max_recv_wr = messages + 1, .max_send_sge = 1,
			 .max_recv_sge = 1, .max_inline_data = INLINE_LEN },
	};
	size_t send_len = (size_t)messages * size + INLINE_LEN, recv_len = (size_t)(messages + 1) * size;
	u32 m, i;
	int ret;

	t->pd = ib_alloc_pd(t->ibdev, 0);
	if (IS_ERR(t->pd))
		return PTR_ERR(t->pd);
	t->cq = ib_create_cq(t->ibdev, kv_comp_handler, NULL, t, &cq_attr);
	if (IS_ERR(t->cq))
		return PTR_ERR(t->cq);
	qp_attr.send_cq = qp_attr.recv_cq = t->cq;
	if (srq) {
		struct ib_srq_init_attr srq_attr = { .event_handler = kv_srq_event, .srq_context = t,
						     .attr = { .max_wr = messages + 1, .max_sge = 1 } };
		struct ib_srq_attr limit = { .srq_limit = 1 };

		t->srq = ib_create_srq(t->pd, &srq_attr);
		if (IS_ERR(t->srq))
			return PTR_ERR(t->srq);
		/* Armed: the event comes when fewer than one receive is left, after the last message. */
		ret = ib_modify_srq(t->srq, &limit, IB_SRQ_LIMIT);
		if (ret)
			return ret;
		qp_attr.srq = t->srq;
		qp_attr.cap.max_recv_wr = qp_attr.cap.max_recv_sge = 0;
	}
	t->qp = ib_create_qp(t->pd, &qp_attr);
	if (IS_ERR(t->qp))
		return PTR_ERR(t->qp);
	t->qpn = t->qp->qp_num;
	t->send_buf = kvmalloc(send_len, GFP_KERNEL);
	t->recv_buf = kvzalloc(recv_len, GFP_KERNEL);
	if (!t->send_buf || !t->recv_buf)
		return -ENOMEM;
	for (m = 0; m < messages; m++)
		for (i = 0; i < size; i++)
			t->send_buf[(size_t)m * size + i] = kv_byte(m, i);
	/* kvmalloc may give vmalloc memory; the DMA API wants the linear map: take kmalloc sizes only. */
	if (is_vmalloc_addr(t->send_buf) || is_vmalloc_addr(t->recv_buf)) {
		pr_err("vrdma_kverbs_test: buffers too large for one DMA mapping (lower messages or size)\n");
		return -EINVAL;
	}
	t->send_dma = ib_dma_map_single(t->ibdev, t->send_buf, send_len, DMA_TO_DEVICE);
	if (ib_dma_mapping_error(t->ibdev, t->send_dma))
		return -ENOMEM;
	t->recv_dma = ib_dma_map_single(t->ibdev, t->recv_buf, recv_len, DMA_FROM_DEVICE);
	if (ib_dma_mapping_error(t->ibdev, t->recv_dma)) {
		t->recv_dma = 0;
		return -ENOMEM;
	}
	ret = kv_connect(t);
	if (ret) {
		pr_err("vrdma_kverbs_test: connecting QP %#x to itself failed: %d\n", t->qp->qp_num, ret);
		return ret;
	}
	ret = ib_req_notify_cq(t->cq, IB_CQ_NEXT_COMP);
	if (ret < 0)
		return ret;
	ret = kv_post(t);
	if (ret) {
		pr_err("vrdma_kverbs_test: posting failed: %d\n", ret);
		return ret;
	}
	ret = kv_wait(t);
	if (!ret && t->srq && !wait_for_completion_timeout(&t->limit_event, TIMEOUT)) {
		pr_err("vrdma_kverbs_test: no SRQ limit event after %d s\n", TIMEOUT / HZ);
		ret = -ETIMEDOUT;
	}
	ib_dma_sync_single_for_cpu(t->ibdev, t->recv_dma, recv_len, DMA_FROM_DEVICE);
	return ret ?: kv_check_data(t);
}

/* Poll until `want` completions arrived (each flushed, with the expected wr_id) or `timeout` jiffies passed. */
static int kv_wait_flushed(struct kv_test *t, u32 want, u64 first_wr_id, unsigned long timeout)
{
	unsigned long deadline = jiffies + timeout;
	u32 got = 0;
	struct ib_wc wc;

	while (got < want) {
		while (got < want && ib_poll_cq(t->cq, 1, &wc) > 0) {
			if (wc.status != IB_WC_WR_FLUSH_ERR || wc.wr_id != first_wr_id + got || wc.qp != t->qp) {
				pr_err("vrdma_kverbs_test: completion %u of %u: wr_id %#llx status %d (%s), expected %#llx flushed\n",
				       got, want, wc.wr_id, wc.status, ib_wc_status_msg(wc.status), first_wr_id + got);
				return -EIO;
			}
			got++;
		}
		if (got == want)
			break;
		if (ib_req_notify_cq(t->cq, IB_CQ_NEXT_COMP | IB_CQ_REPORT_MISSED_EVENTS) > 0)
			continue;
		if (time_after(jiffies, deadline) ||
		    !wait_for_completion_timeout(&t->event, max_t(long, deadline - jiffies, 1))) {
			pr_err("vrdma_kverbs_test: %u of %u flushed completions after %u s\n", got, want, await_loss);
			return -ETIMEDOUT;
		}
	}
	return 0;
}

/*
 * await_loss: receives nothing will match, then the device lost (the test restarts the backend): each completes
 * flushed, and so does a send posted once the device is gone. The module holds the device until it returns.
 */
static int kv_await_loss(struct kv_test *t)
{
	const struct ib_recv_wr *bad_recv;
	const struct ib_send_wr *bad_send;
	struct ib_sge sge = { .addr = t->recv_dma, .length = size, .lkey = t->pd->local_dma_lkey };
	ktime_t start;
	u32 m;
	int ret;

	for (m = 0; m < messages; m++) {
		struct ib_recv_wr wr = { .wr_id = 0x20000 + m, .sg_list = &sge, .num_sge = 1 };

		ret = ib_post_recv(t->qp, &wr, &bad_recv);
		if (ret)
			return ret;
	}
	pr_info("vrdma_kverbs_test: %s: %u receives posted, waiting for the device to be lost\n", device, messages);
	start = ktime_get();
	ret = kv_wait_flushed(t, messages, 0x20000, (unsigned long)await_loss * HZ);
	if (ret)
		return ret;
	{
		struct ib_send_wr wr = { .wr_id = 0x30000, .sg_list = &sge, .num_sge = 1, .opcode = IB_WR_SEND,
					 .send_flags = IB_SEND_SIGNALED };

		sge.addr = t->send_dma;
		ret = ib_post_send(t->qp, &wr, &bad_send);
		if (ret) {
			pr_err("vrdma_kverbs_test: posting a send after the loss: %d\n", ret);
			return ret;
		}
	}
	ret = kv_wait_flushed(t, 1, 0x30000, TIMEOUT);
	if (!ret)
		pr_info("vrdma_kverbs_test: %s: device lost: %u receives and a send posted after it completed flushed (IB_WC_WR_FLUSH_ERR) in %lld ms\n",
			device, messages, ktime_ms_delta(ktime_get(), start));
	return ret;
}

/* The next completion, waiting on the completion handler (re-armed, missed events reported), or -ETIMEDOUT. */
static int kv_next_wc(struct kv_test *t, struct ib_wc *wc)
{
	unsigned long deadline = jiffies + TIMEOUT;

	for (;;) {
		if (ib_poll_cq(t->cq, 1, wc) > 0)
			return 0;
		if (ib_req_notify_cq(t->cq, IB_CQ_NEXT_COMP | IB_CQ_REPORT_MISSED_EVENTS) > 0)
			continue;
		if (time_after(jiffies, deadline) ||
		    !wait_for_completion_timeout(&t->event, max_t(long, deadline - jiffies, 1)))
			return -ETIMEDOUT;
	}
}

static int kv_expect(struct kv_test *t, u64 wr_id, enum ib_wc_opcode opcode, enum ib_wc_status status)
{
	struct ib_wc wc;
	int ret = kv_next_wc(t, &wc);

	if (ret) {
		pr_err("vrdma_kverbs_test: frwr: no completion for %#llx\n", wr_id);
		return ret;
	}
	if (wc.wr_id != wr_id || wc.status != status || (status == IB_WC_SUCCESS && wc.opcode != opcode)) {
		pr_err("vrdma_kverbs_test: frwr: completion %#llx opcode %d status %d (%s), expected %#llx opcode %d status %d\n",
		       wc.wr_id, wc.opcode, wc.status, ib_wc_status_msg(wc.status), wr_id, opcode, status);
		return -EIO;
	}
	return 0;
}

/* frwr=1: fast registration of a buffer, RDMA through its key, local invalidation, the stale key refused. */
static int kv_frwr(struct kv_test *t)
{
	size_t len = (size_t)messages * size;
	u32 npages = DIV_ROUND_UP(len, PAGE_SIZE) + 1;  /* one more: the buffer may start inside a page */
	const struct ib_send_wr *bad;
	struct scatterlist sg;
	struct ib_sge wsge = { .addr = t->send_dma, .length = len, .lkey = t->pd->local_dma_lkey };
	struct ib_sge rsge = { .addr = t->recv_dma, .length = len, .lkey = t->pd->local_dma_lkey };
	struct ib_reg_wr reg = { .wr = { .wr_id = 0x40000, .opcode = IB_WR_REG_MR, .send_flags = IB_SEND_SIGNALED },
				 .access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE | IB_ACCESS_REMOTE_READ };
	struct ib_rdma_wr write = { .wr = { .wr_id = 0x40001, .opcode = IB_WR_RDMA_WRITE, .sg_list = &wsge,
					    .num_sge = 1, .send_flags = IB_SEND_SIGNALED } };
	struct ib_rdma_wr read = { .wr = { .wr_id = 0x40002, .opcode = IB_WR_RDMA_READ, .sg_list = &rsge,
					   .num_sge = 1, .send_flags = IB_SEND_SIGNALED } };
	struct ib_send_wr inv = { .wr_id = 0x40003, .opcode = IB_WR_LOCAL_INV, .send_flags = IB_SEND_SIGNALED };
	struct ib_mr *mr;
	u8 *buf;
	int ret, n;

	if (npages > t->ibdev->attrs.max_fast_reg_page_list_len) {
		pr_err("vrdma_kverbs_test: frwr: %zu bytes need %u pages, the device maps %u\n", len, npages,
		       t->ibdev->attrs.max_fast_reg_page_list_len);
		return -EINVAL;
	}
	buf = kzalloc(len, GFP_KERNEL);
	if (!buf)
		return -ENOMEM;
	sg_init_one(&sg, buf, len);
	ret = -ENOMEM;
	if (ib_dma_map_sg(t->ibdev, &sg, 1, DMA_BIDIRECTIONAL) != 1)
		goto out_free;
	mr = ib_alloc_mr(t->pd, IB_MR_TYPE_MEM_REG, npages);
	if (IS_ERR(mr)) {
		ret = PTR_ERR(mr);
		goto out_unmap;
	}
	n = ib_map_mr_sg(mr, &sg, 1, NULL, PAGE_SIZE);
	if (n != 1) {
		pr_err("vrdma_kverbs_test: frwr: ib_map_mr_sg mapped %d of 1\n", n);
		ret = n < 0 ? n : -EIO;
		goto out_mr;
	}
	ib_update_fast_reg_key(mr, ib_inc_rkey(mr->rkey));
	reg.mr = mr;
	reg.key = mr->rkey;
	write.remote_addr = read.remote_addr = mr->iova;
	write.rkey = read.rkey = mr->rkey;
	inv.ex.invalidate_rkey = mr->rkey;
	reg.wr.next = &write.wr;
	write.wr.next = &read.wr;
	read.wr.next = &inv;
	memset(t->recv_buf, 0, len);
	ib_dma_sync_single_for_device(t->ibdev, t->recv_dma, len, DMA_FROM_DEVICE);
	ret = ib_post_send(t->qp, &reg.wr, &bad) ?:
	      kv_expect(t, 0x40000, IB_WC_REG_MR, IB_WC_SUCCESS) ?:
	      kv_expect(t, 0x40001, IB_WC_RDMA_WRITE, IB_WC_SUCCESS) ?:
	      kv_expect(t, 0x40002, IB_WC_RDMA_READ, IB_WC_SUCCESS) ?:
	      kv_expect(t, 0x40003, IB_WC_LOCAL_INV, IB_WC_SUCCESS);
	if (ret)
		goto out_mr;
	dma_sync_sg_for_cpu(t->ibdev->dma_device, &sg, 1, DMA_BIDIRECTIONAL);
	ib_dma_sync_single_for_cpu(t->ibdev, t->recv_dma, len, DMA_FROM_DEVICE);
	if (memcmp(buf, t->send_buf, len) || memcmp(t->recv_buf, t->send_buf, len)) {
		pr_err("vrdma_kverbs_test: frwr: the bytes written through the key, or read back, differ\n");
		ret = -EIO;
		goto out_mr;
	}
	/* The key is gone with the invalidation: a write through it is a remote access error. */
	write.wr.wr_id = 0x40004;
	write.wr.next = NULL;
	ret = ib_post_send(t->qp, &write.wr, &bad) ?: kv_expect(t, 0x40004, 0, IB_WC_REM_ACCESS_ERR);
	if (!ret)
		pr_info("vrdma_kverbs_test: %s: fast registration of %u pages (key %#x): %zu bytes written and read back through it, invalidated, the stale key refused\n",
			device, npages, mr->rkey, len);
out_mr:
	ib_dereg_mr(mr);
out_unmap:
	ib_dma_unmap_sg(t->ibdev, &sg, 1, DMA_BIDIRECTIONAL);
out_free:
	kfree(buf);
	return ret;
}

static void kv_teardown(struct kv_test *t)
{
	size_t send_len = (size_t)messages * size + INLINE_LEN, recv_len = (size_t)(messages + 1) * size;

	if (t->recv_dma)
		ib_dma_unmap_single(t->ibdev, t->recv_dma, recv_len, DMA_FROM_DEVICE);
	if (t->send_dma)
		ib_dma_unmap_single(t->ibdev, t->send_dma, send_len, DMA_TO_DEVICE);
	if (!IS_ERR_OR_NULL(t->qp))
		ib_destroy_qp(t->qp);
	if (!IS_ERR_OR_NULL(t->srq))
		ib_destroy_srq(t->srq);
	if (!IS_ERR_OR_NULL(t->cq))
		ib_destroy_cq(t->cq);
	if (!IS_ERR_OR_NULL(t->pd))
		ib_dealloc_pd(t->pd);
	kvfree(t->send_buf);
	kvfree(t->recv_buf);
}

/*
 * The device named by the module parameter, held (ib_device_put() releases it). Found as every kernel consumer
 * finds devices, through an ib_client, whose add callback the core calls for each registered device;
 * ib_device_get_by_name() left the kernel's public headers in 7.x.
 */
static struct ib_device *kv_found;

static int kv_client_add(struct ib_device *ibdev)
{
	if (!kv_found && !strcmp(dev_name(&ibdev->dev), device) && ib_device_try_get(ibdev))
		kv_found = ibdev;
	return 0;
}

static void kv_client_remove(struct ib_device *ibdev, void *client_data)
{
}

static struct ib_client kv_client = {
	.name = "vrdma_kverbs_test",
	.add = kv_client_add,
	.remove = kv_client_remove,
};

static struct ib_device *kv_device_get(void)
{
	kv_found = NULL;
	if (ib_register_client(&kv_client))
		return NULL;
	ib_unregister_client(&kv_client);
	return kv_found;
}

static int __init kv_init(void)
{
	struct kv_test *t;
	int ret;

	if (!messages || messages > 256 || !size || size > 65536 || await_loss > 3600 || (await_loss && (srq || frwr))) {
		pr_err("vrdma_kverbs_test: messages must be 1..256, size 1..65536, await_loss 0..3600 and alone\n");
		return -EINVAL;
	}
	t = kzalloc(sizeof(*t), GFP_KERNEL);
	if (!t)
		return -ENOMEM;
	init_completion(&t->event);
	init_completion(&t->limit_event);
	t->ibdev = kv_device_get();
	if (!t->ibdev) {
		pr_err("vrdma_kverbs_test: no RDMA device %s\n", device);
		kfree(t);
		return -ENODEV;
	}
	ret = kv_run(t);
	if (!ret && frwr)
		ret = kv_frwr(t);
	if (!ret && await_loss)
		ret = kv_await_loss(t);
	kv_teardown(t);
	if (!ret)
		pr_info("vrdma_kverbs_test: %s: RC QP %#x to itself: %u messages of %u bytes and one of %u inline sent, received and checked; %u completion events%s\n",
			device, t->qpn, messages, size, INLINE_LEN, t->events,
			srq ? "; receives through an SRQ, its limit event seen" : "");
	else
		pr_err("vrdma_kverbs_test: %s: failed: %d\n", device, ret);
	ib_device_put(t->ibdev);
	kfree(t);
	return ret;
}

static void __exit kv_exit(void)
{
}

module_init(kv_init);
module_exit(kv_exit);
MODULE_DESCRIPTION("Kernel verbs test for vrdma: PD, CQ with a completion handler, RC QP, data checked");
MODULE_LICENSE("GPL");
