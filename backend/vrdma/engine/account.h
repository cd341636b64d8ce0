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
 * What the running thread's other devices did lately (struct vre_sched): a device's turns and pieces are
 * small_piece_bytes while another device of the thread has moved a small message in the last VRE_RECENT_WORK_NS,
 * piece_bytes while another has done any work in it, and solo_bytes while none has: a bulk transfer alone pays for
 * fewer passes and pieces, and the first message of a device waking up waits for at most one solo piece. Each kind
 * keeps the last two devices that did it, so that the device asking does not hide another behind itself.
 */
static inline bool recent_other(const struct vre_recent recent[2], int64_t now, const struct vre_device *d)
{
	for (uint32_t i = 0; i < 2; i++)
		if (recent[i].dev && recent[i].dev != d && now - recent[i].at < VRE_RECENT_WORK_NS)
			return true;
	return false;
}

/* Device `d` did it now: the latest of the two kept, the other device's kept beside it. */
static inline void recent_seen(struct vre_recent recent[2], int64_t now, const struct vre_device *d)
{
	if (recent[0].dev != d)
		recent[1] = recent[0];
	recent[0] = (struct vre_recent){ .at = now, .dev = d };
}

/* The most a turn of device `d` is worth, and the largest piece it moves, as its thread's other devices stand. */
static inline uint32_t sched_size(struct vre_engine *e, const struct vre_device *d, uint32_t shared)
{
	const struct vre_ctx *c = ctx(e);

	if (recent_other(c->small, c->now, d))
		return e->sched.small_piece_bytes < shared ? e->sched.small_piece_bytes : shared;
	if (recent_other(c->worked, c->now, d))
		return shared;
	return e->sched.solo_bytes > shared ? e->sched.solo_bytes : shared;
}

#endif /* VRDMA_ENGINE_ACCOUNT_H */
