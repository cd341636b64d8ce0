/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * What the data path counts and charges: the port's data counters, and the scheduler's buckets and throttled time
 * (part of vre.h, which includes it: its helpers work on vre.h's objects).
 */
#ifndef VRDMA_ENGINE_ACCOUNT_H
#define VRDMA_ENGINE_ACCOUNT_H

/* -- the port's data counters (struct vre_counters: tx_bytes ... rx_packets) ------------------------------------ */

/* The bytes a packet carries on `qp`'s path (IB_MTU_256 = 1 ... IB_MTU_4096 = 5; unset: 1024, RoCE on Ethernet). */
static inline uint32_t mtu_bytes(uint32_t path_mtu)
{
	return path_mtu >= 1 && path_mtu <= 5 ? 128u << path_mtu : 1024;
}

/* The packets a message of `len` bytes takes on `qp`'s path: what a local message counts as (one at least). */
static inline uint64_t packets_of(const struct vre_qp *qp, uint64_t len)
{
	uint32_t mtu = mtu_bytes(qp->attr.path_mtu);

	return len ? (len + mtu - 1) / mtu : 1;
}

/* Payload `len` that left device d's memory (tx) or came into it (rx) for `qp`'s work, in `packets` packets: the
 * device's and the QP's `bytes`, and the port's data counters, counted in one place. */
static inline void count_tx(struct vre_device *d, struct vre_qp *qp, uint64_t len, uint64_t packets)
{
	d->counters.bytes += len;
	qp->counters.bytes += len;
	d->counters.tx_bytes += len;
	d->counters.tx_packets += packets;
}

static inline void count_rx(struct vre_device *d, struct vre_qp *qp, uint64_t len, uint64_t packets)
{
	d->counters.bytes += len;
	qp->counters.bytes += len;
	d->counters.rx_bytes += len;
	d->counters.rx_packets += packets;
}

/* -- the scheduler's accounting (poll.c keeps the turns; the requesters report what they moved) ------------------ */

/* Bring a bucket up to date at `now`: the tokens earned since, up to its burst. */
static inline void bucket_fill(struct vre_bucket *b, int64_t now)
{
	if (b->rate > 0 && now > b->at) {
		double earned = (double)(now - b->at) * b->rate / 1e9;

		b->tokens = b->tokens + earned < b->burst ? b->tokens + earned : b->burst;
	}
	b->at = now;
}

/* The device's limits run it again: the time they held back its work, counted. */
static inline void share_unthrottle(struct vre_share *s, int64_t now)
{
	if (s->throttled_since) {
		s->counters.throttled_ns += (uint64_t)(now - s->throttled_since);
		s->throttled_since = 0;
	}
}

/*
 * Small messages nearby (struct vre_sched): while another device of the running thread has moved a small message
 * in the last VRE_SMALL_WORK_NS, a device's turns and pieces are small_piece_bytes. The thread keeps the last two
 * devices that did, so that a device sending small messages between its large ones does not hide another's.
 */
static inline bool small_work_near(struct vre_engine *e, const struct vre_device *d)
{
	const struct vre_ctx *c = ctx(e);

	for (uint32_t i = 0; i < 2; i++)
		if (c->small[i].dev && c->small[i].dev != d && c->now - c->small[i].at < VRE_SMALL_WORK_NS)
			return true;
	return false;
}

/* Device `d` moved a small message: the latest of the two kept, the other device's kept beside it. */
static inline void small_work_seen(struct vre_engine *e, const struct vre_device *d)
{
	struct vre_ctx *c = ctx(e);

	if (c->small[0].dev != d)
		c->small[1] = c->small[0];
	c->small[0] = (struct vre_small_work){ .at = c->now, .dev = d };
}

#endif /* VRDMA_ENGINE_ACCOUNT_H */
