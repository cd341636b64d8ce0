// SPDX-License-Identifier: GPL-2.0-only
/*
 * vrdma_kverbs_ud: a kernel UD ping-pong between two guests, over the kernel's RDMA connection manager, built like
 * vrdma.ko. What a kernel consumer of datagrams does: rdma_cm resolves the peer's IP address and route on the
 * device's netdev and learns the server's QP number and Q_Key (SIDR, the CM's MADs on QP1), then a UD QP on a PD
 * with the local DMA lkey and a CQ with a completion handler sends datagrams through an address handle; the server
 * answers each from the address its 40-byte network header gives (ib_create_ah_from_wc), as udaddy does.
 *
 *   modprobe vrdma_kverbs_ud server=IPV4 [port=18516] [messages=64] [size=1024] [timeout=60]
 *   modprobe vrdma_kverbs_ud connect=IPV4 [port=18516] [messages=64] [size=1024]
 *
 * The server loads once it has echoed `messages` datagrams (it waits `timeout` seconds for them); the client once
 * every echo came back with the bytes it sent (each message a different pattern, every other one with immediate
 * data). Each says what it did, or what went wrong, in the kernel log. `rmmod` unloads it (it holds nothing).
 */
#include <linux/completion.h>
#include <linux/dma-mapping.h>
#include <linux/inet.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

static char *server;
module_param(server, charp, 0444);
MODULE_PARM_DESC(server, "IPv4 address to listen on (server role)");
static char *connect;
module_param(connect, charp, 0444);
MODULE_PARM_DESC(connect, "IPv4 address of the server (client role)");
static ushort port = 18516;
module_param(port, ushort, 0444);
MODULE_PARM_DESC(port, "rdma_cm port (default 18516)");
static uint messages = 64;
module_param(messages, uint, 0444);
MODULE_PARM_DESC(messages, "datagrams sent and echoed (1..4096, default 64)");
static uint size = 1024;
module_param(size, uint, 0444);
MODULE_PARM_DESC(size, "bytes per datagram (1..4096, at most the path MTU; default 1024)");
static uint timeout = 60;
module_param(timeout, uint, 0444);
MODULE_PARM_DESC(timeout, "seconds the server waits for the client, and either side for any one step");

#define GRH_LEN 40		/* the network header before every received datagram */
#define RECVS 16		/* receives kept posted */
#define PEER_WR_ID 0x100000	/* receive wr_ids: this plus the slot */
#define UDP_QKEY 0x01234567	/* the Q_Key the rdma_cm gives the QPs of RDMA_PS_UDP ids (cma.c's RDMA_UDP_QKEY) */

struct ud_test {
	struct rdma_cm_id *listen_id;
	struct rdma_cm_id *id;		/* the connection's: the client's, or the child the server accepted */
	struct ib_pd *pd;
	struct ib_cq *cq;
	struct ib_ah *ah;		/* the client's, to the server (from the CM's ESTABLISHED event) */
	u32 remote_qpn;
	u32 remote_qkey;
	u8 *buf;			/* RECVS receive slots of GRH_LEN + size, then one send slot of size */
	u64 dma;
	size_t len;
	/* CM events, handed from the CM's work queue to the module's loading thread */
	struct completion cm_done;
	enum rdma_cm_event_type cm_event;
	int cm_status;
	struct rdma_cm_id *child;
	struct rdma_ud_param ud;
	/* completions */
	struct completion wc_done;
	unsigned int events;
};

static u8 ud_byte(u32 message, u32 i)
{
	return (u8)(message * 29 + i * 13 + (i >> 7));
}

static int ud_cm_handler(struct rdma_cm_id *id, struct rdma_cm_event *event)
{
	struct ud_test *t = id->context;

	t->cm_event = event->event;
	t->cm_status = event->status;
	if (event->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
		t->child = id;
		id->context = t;
	} else if (event->event == RDMA_CM_EVENT_ESTABLISHED) {
		t->ud = event->param.ud;
	}
	complete(&t->cm_done);
	return 0;
}

/* The next CM event, which must be `want`. */
static int ud_cm_wait(struct ud_test *t, enum rdma_cm_event_type want, const char *step)
{
	if (!wait_for_completion_timeout(&t->cm_done, timeout * HZ)) {
		pr_err("vrdma_kverbs_ud: %s: no CM event in %u s\n", step, timeout);
		return -ETIMEDOUT;
	}
	reinit_completion(&t->cm_done);
	if (t->cm_event != want) {
		pr_err("vrdma_kverbs_ud: %s: %s (status %d), expected %s\n", step, rdma_event_msg(t->cm_event),
		       t->cm_status, rdma_event_msg(want));
		return -EIO;
	}
	return 0;
}

static void ud_comp_handler(struct ib_cq *cq, void *context)
{
	struct ud_test *t = context;

	t->events++;
	complete(&t->wc_done);
}

static u8 *ud_recv_slot(struct ud_test *t, u32 slot)
{
	return t->buf + (size_t)slot * (GRH_LEN + size);
}

static int ud_post_recv(struct ud_test *t, u32 slot)
{
	struct ib_sge sge = { .addr = t->dma + (u64)slot * (GRH_LEN + size), .length = GRH_LEN + size,
			      .lkey = t->pd->local_dma_lkey };
	struct ib_recv_wr wr = { .wr_id = PEER_WR_ID + slot, .sg_list = &sge, .num_sge = 1 };
	const struct ib_recv_wr *bad;

	ib_dma_sync_single_for_device(t->id->device, t->dma + (u64)slot * (GRH_LEN + size), GRH_LEN + size,
				      DMA_BIDIRECTIONAL);
	return ib_post_recv(t->id->qp, &wr, &bad);
}

/* The next completion, sleeping on the handler (armed with REPORT_MISSED_EVENTS, so none is lost). */
static int ud_next_wc(struct ud_test *t, struct ib_wc *wc)
{
	for (;;) {
		if (ib_poll_cq(t->cq, 1, wc) == 1)
			return 0;
		if (ib_req_notify_cq(t->cq, IB_CQ_NEXT_COMP | IB_CQ_REPORT_MISSED_EVENTS) > 0)
			continue;
		if (!wait_for_completion_timeout(&t->wc_done, timeout * HZ)) {
			pr_err("vrdma_kverbs_ud: no completion in %u s\n", timeout);
			return -ETIMEDOUT;
		}
		reinit_completion(&t->wc_done);
	}
}

/* One datagram from the send slot (`len` bytes, immediate data if `imm`) to the peer's QP through `ah`. */
static int ud_send(struct ud_test *t, struct ib_ah *ah, u32 qpn, u32 qkey, u32 len, bool imm, u32 message)
{
	u64 addr = t->dma + (u64)RECVS * (GRH_LEN + size);
	struct ib_sge sge = { .addr = addr, .length = len, .lkey = t->pd->local_dma_lkey };
	struct ib_ud_wr wr = {
		.wr = { .wr_id = message, .sg_list = &sge, .num_sge = 1, .send_flags = IB_SEND_SIGNALED,
			.opcode = imm ? IB_WR_SEND_WITH_IMM : IB_WR_SEND, .ex.imm_data = cpu_to_be32(0xda7a0000 + message) },
		.ah = ah, .remote_qpn = qpn, .remote_qkey = qkey,
	};
	const struct ib_send_wr *bad;

	ib_dma_sync_single_for_device(t->id->device, addr, len, DMA_BIDIRECTIONAL);
	return ib_post_send(t->id->qp, &wr.wr, &bad);
}

/* Wait for the send of `message` and the next receive; returns the receive's slot, or a negative errno. */
static int ud_exchange(struct ud_test *t, u32 message, struct ib_wc *recv, bool want_send)
{
	bool sent = !want_send, received = false;
	struct ib_wc wc;
	int ret;

	while (!sent || !received) {
		ret = ud_next_wc(t, &wc);
		if (ret)
			return ret;
		if (wc.status != IB_WC_SUCCESS) {
			pr_err("vrdma_kverbs_ud: message %u: wr_id %#llx completed with %s\n", message, wc.wr_id,
			       ib_wc_status_msg(wc.status));
			return -EIO;
		}
		if (wc.wr_id >= PEER_WR_ID && wc.wr_id < PEER_WR_ID + RECVS && !received) {
			*recv = wc;
			received = true;
		} else if (wc.wr_id == message && !sent) {
			sent = true;
		} else {
			pr_err("vrdma_kverbs_ud: message %u: unexpected completion %#llx\n", message, wc.wr_id);
			return -EIO;
		}
	}
	return recv->wr_id - PEER_WR_ID;
}

static int ud_resources(struct ud_test *t)
{
	struct ib_cq_init_attr cq_attr = { .cqe = 2 * RECVS + 2 };
	struct ib_qp_init_attr qp_attr = {
		.qp_type = IB_QPT_UD, .sq_sig_type = IB_SIGNAL_REQ_WR,
		.cap = { .max_send_wr = 2, .max_recv_wr = RECVS, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	u32 slot;
	int ret;

	t->pd = ib_alloc_pd(t->id->device, 0);
	if (IS_ERR(t->pd))
		return PTR_ERR(t->pd);
	t->cq = ib_create_cq(t->id->device, ud_comp_handler, NULL, t, &cq_attr);
	if (IS_ERR(t->cq))
		return PTR_ERR(t->cq);
	qp_attr.send_cq = qp_attr.recv_cq = t->cq;
	ret = rdma_create_qp(t->id, t->pd, &qp_attr);  /* to RTS, with the rdma_cm's Q_Key */
	if (ret)
		return ret;
	t->len = (size_t)RECVS * (GRH_LEN + size) + size;
	t->buf = kzalloc(t->len, GFP_KERNEL);
	if (!t->buf)
		return -ENOMEM;
	t->dma = ib_dma_map_single(t->id->device, t->buf, t->len, DMA_BIDIRECTIONAL);
	if (ib_dma_mapping_error(t->id->device, t->dma)) {
		t->dma = 0;
		return -ENOMEM;
	}
	for (slot = 0; slot < RECVS; slot++) {
		ret = ud_post_recv(t, slot);
		if (ret)
			return ret;
	}
	return ib_req_notify_cq(t->cq, IB_CQ_NEXT_COMP) < 0 ? -EIO : 0;
}

static struct sockaddr_in ud_addr(const char *text, int *ret)
{
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(port) };

	*ret = in4_pton(text, -1, (u8 *)&sin.sin_addr.s_addr, -1, NULL) ? 0 : -EINVAL;
	if (*ret)
		pr_err("vrdma_kverbs_ud: %s is not an IPv4 address\n", text);
	return sin;
}

/* Server: take one client, then echo `messages` datagrams back to whoever sent each, from its network header. */
static int ud_serve(struct ud_test *t)
{
	struct sockaddr_in sin = ud_addr(server, &(int){0});
	struct rdma_conn_param param = {};
	u32 m;
	int ret;

	t->listen_id = rdma_create_id(&init_net, ud_cm_handler, t, RDMA_PS_UDP, IB_QPT_UD);
	if (IS_ERR(t->listen_id))
		return PTR_ERR(t->listen_id);
	ret = rdma_bind_addr(t->listen_id, (struct sockaddr *)&sin);
	if (!ret)
		ret = rdma_listen(t->listen_id, 1);
	if (ret)
		return ret;
	pr_info("vrdma_kverbs_ud: listening on %s port %u\n", server, port);
	ret = ud_cm_wait(t, RDMA_CM_EVENT_CONNECT_REQUEST, "waiting for the client");
	if (ret)
		return ret;
	t->id = t->child;
	ret = ud_resources(t);
	if (ret)
		return ret;
	param.qp_num = t->id->qp->qp_num;
	ret = rdma_accept(t->id, &param);  /* the SIDR reply: our QP number and Q_Key */
	if (ret)
		return ret;
	for (m = 0; m < messages; m++) {
		struct ib_wc wc;
		struct ib_ah *ah;
		int slot = ud_exchange(t, m, &wc, false);

		if (slot < 0)
			return slot;
		ib_dma_sync_single_for_cpu(t->id->device, t->dma + (u64)slot * (GRH_LEN + size), GRH_LEN + size,
					   DMA_BIDIRECTIONAL);
		if (!(wc.wc_flags & IB_WC_GRH) || wc.byte_len < GRH_LEN) {
			pr_err("vrdma_kverbs_ud: datagram %u: no network header (%u bytes)\n", m, wc.byte_len);
			return -EIO;
		}
		ah = ib_create_ah_from_wc(t->pd, &wc, (const struct ib_grh *)ud_recv_slot(t, slot), 1);
		if (IS_ERR(ah)) {
			pr_err("vrdma_kverbs_ud: datagram %u: no address handle from its header: %ld\n", m, PTR_ERR(ah));
			return PTR_ERR(ah);
		}
		memcpy(t->buf + (size_t)RECVS * (GRH_LEN + size), ud_recv_slot(t, slot) + GRH_LEN,
		       wc.byte_len - GRH_LEN);
		ret = ud_post_recv(t, slot);
		if (!ret)
			ret = ud_send(t, ah, wc.src_qp, UDP_QKEY, wc.byte_len - GRH_LEN,
				      wc.wc_flags & IB_WC_WITH_IMM, m);
		if (!ret) {
			struct ib_wc sent;

			ret = ud_next_wc(t, &sent);
			if (!ret && (sent.status != IB_WC_SUCCESS || sent.wr_id != m))
				ret = -EIO;
		}
		rdma_destroy_ah(ah, RDMA_DESTROY_AH_SLEEPABLE);
		if (ret)
			return ret;
	}
	pr_info("vrdma_kverbs_ud: %s: server QP %#x echoed %u datagrams; %u completion events\n",
		t->id->device->name, t->id->qp->qp_num, messages, t->events);
	return 0;
}

/* Client: resolve the server, learn its QP by SIDR, send `messages` datagrams and check every echo. */
static int ud_client(struct ud_test *t)
{
	struct sockaddr_in sin = ud_addr(connect, &(int){0});
	struct rdma_conn_param param = {};
	u32 m, i;
	int ret;

	t->id = rdma_create_id(&init_net, ud_cm_handler, t, RDMA_PS_UDP, IB_QPT_UD);
	if (IS_ERR(t->id)) {
		ret = PTR_ERR(t->id);
		t->id = NULL;
		return ret;
	}
	ret = rdma_resolve_addr(t->id, NULL, (struct sockaddr *)&sin, 2000);
	if (!ret)
		ret = ud_cm_wait(t, RDMA_CM_EVENT_ADDR_RESOLVED, "resolving the server's address");
	if (!ret)
		ret = rdma_resolve_route(t->id, 2000);
	if (!ret)
		ret = ud_cm_wait(t, RDMA_CM_EVENT_ROUTE_RESOLVED, "resolving the route");
	if (!ret)
		ret = ud_resources(t);
	if (!ret)
		ret = rdma_connect(t->id, &param);  /* SIDR: the server's QP number and Q_Key come back */
	if (!ret)
		ret = ud_cm_wait(t, RDMA_CM_EVENT_ESTABLISHED, "SIDR with the server");
	if (ret)
		return ret;
	t->remote_qpn = t->ud.qp_num;
	t->remote_qkey = t->ud.qkey;
	t->ah = rdma_create_ah(t->pd, &t->ud.ah_attr, RDMA_CREATE_AH_SLEEPABLE);
	if (IS_ERR(t->ah)) {
		ret = PTR_ERR(t->ah);
		t->ah = NULL;
		return ret;
	}
	for (m = 0; m < messages; m++) {
		u8 *out = t->buf + (size_t)RECVS * (GRH_LEN + size), *in;
		struct ib_wc wc;
		int slot;

		for (i = 0; i < size; i++)
			out[i] = ud_byte(m, i);
		ret = ud_send(t, t->ah, t->remote_qpn, t->remote_qkey, size, m % 2, m);
		if (ret)
			return ret;
		slot = ud_exchange(t, m, &wc, true);
		if (slot < 0)
			return slot;
		ib_dma_sync_single_for_cpu(t->id->device, t->dma + (u64)slot * (GRH_LEN + size), GRH_LEN + size,
					   DMA_BIDIRECTIONAL);
		in = ud_recv_slot(t, slot) + GRH_LEN;
		if (wc.byte_len != GRH_LEN + size || wc.src_qp != t->remote_qpn || !(wc.wc_flags & IB_WC_GRH) ||
		    !!(wc.wc_flags & IB_WC_WITH_IMM) != (m % 2) ||
		    (m % 2 && be32_to_cpu(wc.ex.imm_data) != 0xda7a0000 + m)) {
			pr_err("vrdma_kverbs_ud: echo %u: %u bytes from QP %#x, flags %#x, immediate %#x\n", m,
			       wc.byte_len, wc.src_qp, wc.wc_flags, be32_to_cpu(wc.ex.imm_data));
			return -EIO;
		}
		for (i = 0; i < size; i++) {
			if (in[i] != ud_byte(m, i)) {
				pr_err("vrdma_kverbs_ud: echo %u, byte %u: %#x, sent %#x\n", m, i, in[i], ud_byte(m, i));
				return -EIO;
			}
		}
		ret = ud_post_recv(t, slot);
		if (ret)
			return ret;
	}
	pr_info("vrdma_kverbs_ud: %s: client QP %#x to server QP %#x: %u datagrams of %u bytes sent, echoed and checked; %u completion events\n",
		t->id->device->name, t->id->qp->qp_num, t->remote_qpn, messages, size, t->events);
	return 0;
}

static void ud_teardown(struct ud_test *t)
{
	if (t->ah)
		rdma_destroy_ah(t->ah, RDMA_DESTROY_AH_SLEEPABLE);
	if (t->id && t->id->qp)
		rdma_destroy_qp(t->id);
	if (t->dma)
		ib_dma_unmap_single(t->id->device, t->dma, t->len, DMA_BIDIRECTIONAL);
	if (!IS_ERR_OR_NULL(t->cq))
		ib_destroy_cq(t->cq);
	if (!IS_ERR_OR_NULL(t->pd))
		ib_dealloc_pd(t->pd);
	if (t->id)
		rdma_destroy_id(t->id);
	if (!IS_ERR_OR_NULL(t->listen_id))
		rdma_destroy_id(t->listen_id);
	kfree(t->buf);
}

static int __init ud_init(void)
{
	struct ud_test *t;
	int ret;

	if (!server == !connect || !messages || messages > 4096 || !size || size > 4096 || !timeout) {
		pr_err("vrdma_kverbs_ud: give server= or connect=, messages 1..4096, size 1..4096, timeout > 0\n");
		return -EINVAL;
	}
	ud_addr(server ?: connect, &ret);
	if (ret)
		return ret;
	t = kzalloc(sizeof(*t), GFP_KERNEL);
	if (!t)
		return -ENOMEM;
	init_completion(&t->cm_done);
	init_completion(&t->wc_done);
	ret = server ? ud_serve(t) : ud_client(t);
	if (ret)
		pr_err("vrdma_kverbs_ud: %s failed: %d\n", server ? "server" : "client", ret);
	ud_teardown(t);
	kfree(t);
	return ret;
}

static void __exit ud_exit(void)
{
}

module_init(ud_init);
module_exit(ud_exit);
MODULE_DESCRIPTION("vrdma test: kernel UD ping-pong between two guests over the kernel's rdma_cm");
MODULE_LICENSE("GPL");
