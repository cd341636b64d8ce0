/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * RoCE to other hosts, inside the engine: the transport state of a connected QP whose peer is on another host
 * (struct vre_remote: remote.c makes and checks it; the requester rreq.c, the completer rcomp.c and the responder
 * rresp.c move it), the transmit ring's packets (tx.c), and what those rooms, net.c, ud.c and sockio.c share.
 * Included by vre.h, inside its hidden visibility.
 */
#ifndef VRDMA_ENGINE_REMOTE_H
#define VRDMA_ENGINE_REMOTE_H

#define VRE_TX_RING 512           /* packets the engine holds for the network between two sends */
#define VRE_TX_RESERVE 64         /* ... of which requesters leave this many to responders (ACKs, READ responses) */
#define VRE_MAX_RD 128            /* READs and atomics outstanding on a QP, either way (max_qp_rd_atom) */
#define VRE_PKT_ROOM (VRE_ROCE_MAX_HEADERS + 4096 + 8)   /* headers, the largest path MTU, pad and ICRC */
#define PSN_MASK 0xffffffu
#define IP_DONT_FRAGMENT 0x4000   /* the flags and fragment offset of an IPv4 packet never fragmented */

/* A packet for the network: its addresses (the ICRC covers them) and its UDP payload. */
struct vre_tx_pkt {
	struct vre_roce_addr addr;
	uint32_t len;
	uint8_t data[VRE_PKT_ROOM];
};

/* What answers a started send WQE (struct vre_sent.kind): an ACK covering its last PSN, its READ responses, or
 * an atomic acknowledgement. Kept by the engine when the WQE starts: never read again from guest memory, which the
 * guest may have changed since. */
enum sent_kind { SENT_ACKED, SENT_READ, SENT_ATOMIC };

/* A send WQE the requester has started: the PSNs it takes (a READ: its responses'; an atomic: one). */
struct vre_sent {
	uint32_t first_psn;
	uint32_t npkts;
	uint32_t len;             /* its message length (what its completion reports) */
	uint32_t kind;            /* enum sent_kind */
};

/* A READ the responder owes responses to, or an atomic it answered (kept to answer a duplicate the same way). */
struct vre_rd_job {
	uint32_t psn;             /* its first PSN */
	uint32_t npkts;           /* PSNs it takes */
	uint32_t sent;            /* response packets sent so far (npkts: done; an atomic's is one) */
	uint32_t rkey;
	uint64_t va;
	uint32_t len;
	bool atomic;
	bool answered;            /* all its answers went out once (a duplicate asking again sends them again) */
	uint64_t orig;            /* atomic: the value it answered with */
};

struct vre_remote {
	struct vre_roce_addr addr;   /* the QP's GID to its peer's; dport 4791 */
	uint32_t mtu;                /* path MTU in bytes */
	/* requester: WQEs [sq_head, sq_next) have started; sq_cur is the one being sent (from PSN cur_psn) */
	uint32_t sq_cur;
	uint32_t sq_next;
	uint32_t cur_psn;
	uint32_t next_psn;           /* the first PSN of the next WQE to start */
	uint32_t una_psn;            /* the oldest PSN not acknowledged */
	uint32_t sent_psn;           /* one past the highest PSN sent (a packet below it is a retransmission) */
	uint32_t gap_psn;            /* the una_psn a response ahead of it made the requester send again from ... */
	bool gap_asked;              /* ... once per gap, as a responder NAKs once per gap */
	uint32_t rd_out;             /* READs and atomics in [sq_head, sq_cur): asked, not answered (cursor_at and
				      * retire_head keep it; net_check holds them to it) */
	int64_t deadline;            /* retransmission timer (CLOCK_MONOTONIC ns), 0: stopped */
	uint32_t since_ackreq;       /* packets sent since the last that asked for an acknowledgement */
	struct vre_sent *sent;       /* sq_depth entries, by ring slot */
	/* responder */
	uint32_t epsn;               /* the PSN expected next */
	uint32_t msn;                /* messages completed */
	bool nak_sent;               /* a sequence NAK went out for epsn: one per gap */
	bool in_send;                /* between the first and last packet of a SEND (rwqe is its receive) */
	bool in_write;               /* ... of an RDMA WRITE (wr_* is where it goes) */
	uint64_t msg_off;            /* bytes of the current SEND or WRITE so far */
	uint64_t wr_va;
	uint32_t wr_rkey;
	uint32_t wr_len;
	bool ack_owed;               /* an ACK or NAK waits for the responses owed before it (responses go out in
				      * PSN order: an ACK overtaking them would tell the requester they were lost) */
	uint32_t ack_psn, ack_aeth;
	struct vre_rd_job rd[VRE_MAX_RD];   /* a ring: [rd_head, rd_tail) */
	uint32_t rd_head, rd_tail;
	struct recv_wqe *rwqe;       /* the receive a SEND (or WRITE with immediate) lands in, while rwqe_held */
	bool rwqe_held;
};

/* -- what the RoCE rooms share ---------------------------------------------------------------------------------- */

/* Whether the engine has a network (a connected QP whose peer no device here holds then speaks RoCE). */
static inline bool net_on(const struct vre_engine *e)
{
	return e->tx_fd >= 0 || e->capture;
}

/* The time timers are measured against (vre_clock_set). */
static inline int64_t engine_clock(const struct vre_engine *e)
{
	return e->clock ? e->clock : vre_monotonic_ns();
}

/* Whether packets from GID `src` to GID `dst` can go out: both IPv4 (IPv4-mapped), or both IPv6 with an IPv6
 * socket. */
static inline bool net_reaches(const struct vre_engine *e, const uint8_t *src, const uint8_t *dst)
{
	return ipv4_mapped(src) ? ipv4_mapped(dst) : !ipv4_mapped(dst) && e->udp6_fd >= 0;
}

/* RoCE v2's UDP source port for the packets of QP `qpn` to QP `peer_qpn`: a flow of their own (the entropy ECMP
 * paths and the receiving host's fanout spread by), from 0xc000 up as rxe's, the same for every packet of the pair
 * (so that their order holds on any path). */
static inline uint16_t roce_sport(uint32_t qpn, uint32_t peer_qpn)
{
	uint32_t h = (qpn ^ (peer_qpn << 7)) * 0x9e3779b1u;

	return (uint16_t)(0xc000 | (h >> 18));
}

static inline uint32_t psn_add(uint32_t psn, uint32_t n)
{
	return (psn + n) & PSN_MASK;
}

/* a - b in the 24-bit PSN space, as a signed distance (within 2^23 either way) */
static inline int32_t psn_diff(uint32_t a, uint32_t b)
{
	return (int32_t)((a - b) << 8) >> 8;
}

/* Whether the responder still owes READ responses or atomic acknowledgements (net_busy, rresp.c's ordering). */
static inline bool answers_owed(const struct vre_remote *n)
{
	for (uint32_t i = n->rd_head; i != n->rd_tail; i++) {
		const struct vre_rd_job *job = &n->rd[i % VRE_MAX_RD];

		if (job->sent < job->npkts)
			return true;
	}
	return false;
}

/* The started WQE in send ring slot `index` of a remote QP, and the last PSN it takes. */
static inline struct vre_sent *sent_of(struct vre_qp *qp, uint32_t index)
{
	return &qp->net->sent[index & (qp->cfg.sq_depth - 1)];
}

static inline uint32_t last_psn(const struct vre_sent *s)
{
	return psn_add(s->first_psn, s->npkts - 1);
}

VRE_FN uint32_t roce_header_len(uint8_t opcode);
/* Room for a packet in the transmit ring (requesters keep VRE_TX_RESERVE for responders), or NULL. */
VRE_FN struct vre_tx_pkt *tx_slot(struct vre_engine *e, bool requester);
/* Finish the packet in the slot tx_slot gave: build its headers around the payload already at
 * data + roce_header_len(pkt->opcode) and queue it. */
VRE_FN void tx_queue(struct vre_engine *e, struct vre_device *d, const struct vre_roce_addr *addr,
		     struct vre_tx_pkt *slot, const struct vre_roce_pkt *pkt, uint32_t payload_len);
/* A datagram that arrived for UD or GSI QP `qp` (ud.c). */
VRE_FN void ud_input(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, const struct vre_roce_pkt *pkt,
		     const uint8_t *payload, const struct vre_roce_addr *addr);
/* A QP becomes remote (RTR, peer not here) or stops being: its transport state made or freed. */
VRE_FN int net_qp_update(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, uint32_t old_state);
VRE_FN bool net_busy(const struct vre_qp *qp);
VRE_FN void net_qp_free(struct vre_qp *qp);
VRE_FN int net_qp_alloc(struct vre_engine *e, struct vre_qp *qp);
VRE_FN void net_qp_address(struct vre_qp *qp);
/* rreq.c: how the requester's state moves (rcomp.c moves it through these too; net_check says what they keep). */
VRE_FN void cursor_at(struct vre_qp *qp, uint32_t index, uint32_t psn);
VRE_FN void rewind_to(struct vre_qp *qp, uint32_t psn);
VRE_FN void arm_timer(struct vre_engine *e, struct vre_qp *qp);
VRE_FN void retire_head(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, const struct send_wqe *w,
			uint8_t status, uint32_t len);
VRE_FN void requester_error(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, uint8_t status);
VRE_FN uint8_t local_of(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, const struct send_wqe *w,
			struct vre_request *r);
VRE_FN uint32_t remote_poll(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, uint32_t prod,
			    uint32_t budget);
VRE_FN void remote_response(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp,
			    const struct vre_roce_pkt *pkt, const uint8_t *payload);
VRE_FN void remote_request(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp,
			   const struct vre_roce_pkt *pkt, const uint8_t *payload);
VRE_FN uint32_t responder_poll(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp, uint32_t budget);
VRE_FN void responder_flush(struct vre_engine *e, struct vre_device *d, struct vre_qp *qp);
/* The transport state's invariants (remote.c): NULL, or the first one a QP breaks. */
VRE_FN const char *net_check(const struct vre_qp *qp);
/* With VRE_CHECK_INVARIANTS (the fuzz and sanitizer builds): net_check over the device's QPs (under its lock), and
 * abort naming what broke. */
VRE_FN void net_assert(struct vre_device *d);
/* What arrives from the network goes to `input` (vre_roce_input), one UDP payload at a time. */
typedef int (*vre_input_fn)(struct vre_engine *e, const uint8_t *udp_payload, uint32_t len,
			    const struct vre_roce_addr *addr);
/* What arrived on the rings `w` reads (NULL: the caller, every ring while no thread runs). */
VRE_FN uint32_t sock_recv(struct vre_engine *e, struct vre_worker *w, uint32_t budget, vre_input_fn input);
/* An IP packet as a ring holds it (IPv4 or IPv6, by its version): checked, its UDP payload to `input`. */
VRE_FN int ip_packet(struct vre_engine *e, const uint8_t *ip, uint32_t len, vre_input_fn input);
VRE_FN int ring_open(struct vre_rx_ring *r, int fd, int family, uint32_t nrings, uint32_t *group,
		     const char **step);
/* Rings [0, n) unmapped and the array freed (their sockets stay the daemon's). */
VRE_FN void rings_free(struct vre_rx_ring *rings, uint32_t n);
VRE_FN bool ring_mine(const struct vre_engine *e, const struct vre_worker *w, uint32_t i);
VRE_FN void sock_send(struct vre_engine *e);

#endif /* VRDMA_ENGINE_REMOTE_H */
