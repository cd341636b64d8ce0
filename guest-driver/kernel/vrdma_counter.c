// SPDX-License-Identifier: GPL-2.0-only
/*
 * Counters: `rdma statistic`, `rdma statistic qp` and hw_counters in sysfs. The device's data engine counts for the
 * whole VM (QUERY_COUNTERS) and for each QP (QUERY_QP_COUNTERS: the QP's share of the VM's counters of the same
 * names, from its creation on).
 *
 * QP counters are the RDMA core's counter objects: the core binds QPs to them (automatically by QP type or process
 * with `rdma statistic qp set ... auto on`, or by hand with `rdma statistic qp bind`), and a counter's value is what
 * its QPs counted while bound. At bind the driver notes the QP's counters; a counter's value is what its bound QPs
 * counted since then plus what its QPs left when they were unbound (`retired`).
 *
 * The core reports a port's value as the driver's port value plus every live counter's value plus the last values of
 * the counters it freed (rdma_counter_get_hwstat_value: made for devices whose bound QPs leave the port's default
 * counter set). The engine's VM counters include every QP, so the port value given here is the VM's count minus the
 * live counters' values and minus what the freed ones held: `rdma statistic show` and hw_counters then add up to what
 * the engine counted, as on such a device the port's own set is what no counter took.
 */
#include <linux/slab.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_counter.h>

#include "vrdma.h"

enum {
	VRDMA_STAT_SEND_WQES, VRDMA_STAT_RECV_WQES, VRDMA_STAT_CQES, VRDMA_STAT_BYTES, VRDMA_STAT_ERROR_CQES,
	VRDMA_STAT_FLUSHED, VRDMA_STAT_RNR_WAITS, VRDMA_STAT_CQ_OVERFLOWS, VRDMA_STAT_QP_FATAL,
	VRDMA_STAT_EVENTS_DROPPED, VRDMA_STAT_UD_DROPPED, VRDMA_STAT_UC_DROPPED, VRDMA_STAT_TX_BYTES, VRDMA_STAT_RX_BYTES,
	VRDMA_STAT_TX_PACKETS, VRDMA_STAT_RX_PACKETS,
};

/* The port's counters and a QP counter's: one layout, as the core adds them up by index. */
static const struct rdma_stat_desc vrdma_stat_descs[VRDMA_NUM_STATS] = {
	[VRDMA_STAT_SEND_WQES] = { .name = "send_wqes" },
	[VRDMA_STAT_RECV_WQES] = { .name = "recv_wqes" },
	[VRDMA_STAT_CQES] = { .name = "cqes" },
	[VRDMA_STAT_BYTES] = { .name = "bytes" },
	[VRDMA_STAT_ERROR_CQES] = { .name = "error_cqes" },
	[VRDMA_STAT_FLUSHED] = { .name = "flushed" },
	[VRDMA_STAT_RNR_WAITS] = { .name = "rnr_waits" },
	[VRDMA_STAT_CQ_OVERFLOWS] = { .name = "cq_overflows" },
	[VRDMA_STAT_QP_FATAL] = { .name = "qp_fatal" },
	[VRDMA_STAT_EVENTS_DROPPED] = { .name = "events_dropped" },
	[VRDMA_STAT_UD_DROPPED] = { .name = "ud_dropped" },
	[VRDMA_STAT_UC_DROPPED] = { .name = "uc_dropped" },
	[VRDMA_STAT_TX_BYTES] = { .name = "tx_bytes" },
	[VRDMA_STAT_RX_BYTES] = { .name = "rx_bytes" },
	[VRDMA_STAT_TX_PACKETS] = { .name = "tx_packets" },
	[VRDMA_STAT_RX_PACKETS] = { .name = "rx_packets" },
};
static_assert(sizeof(struct vrdma_resp_query_counters) == sizeof(struct vrdma_resp_hdr) + VRDMA_NUM_STATS * 8,
	      "one name per counter of QUERY_COUNTERS, in its order");

/* Where each field of QUERY_QP_COUNTERS goes in that layout (the counters of the same names). */
static const u8 vrdma_qp_stat_index[VRDMA_NUM_QP_STATS] = {
	VRDMA_STAT_SEND_WQES, VRDMA_STAT_RECV_WQES, VRDMA_STAT_BYTES, VRDMA_STAT_ERROR_CQES, VRDMA_STAT_FLUSHED,
	VRDMA_STAT_RNR_WAITS,
};
static_assert(sizeof(struct vrdma_resp_query_qp_counters) == sizeof(struct vrdma_resp_hdr) + VRDMA_NUM_QP_STATS * 8,
	      "one index per counter of QUERY_QP_COUNTERS, in its order");

/* The driver's side of one rdma_counter: its bound QPs and what unbound ones left. Under dev->counters_lock. */
struct vrdma_counter {
	struct list_head node;		/* in dev->counters */
	struct rdma_counter *counter;
	struct list_head qps;		/* bound QPs, by vrdma_qp.counter_node */
	bool bound;			/* a QP was bound to it once: the core deallocates it (else it only frees it) */
	u64 retired[VRDMA_NUM_STATS];
};

static struct rdma_hw_stats *vrdma_alloc_stats(void)
{
	return rdma_alloc_hw_stats_struct(vrdma_stat_descs, VRDMA_NUM_STATS, RDMA_HW_STATS_DEFAULT_LIFESPAN);
}

static int vrdma_query_qp_stats(struct vrdma_dev *dev, struct vrdma_qp *qp, u64 *values)
{
	struct vrdma_cmd_destroy cmd = { .hdr.opcode = cpu_to_le16(VRDMA_CMD_QUERY_QP_COUNTERS),
					 .handle = cpu_to_le32(qp->handle) };
	struct vrdma_resp_query_qp_counters resp;
	const __le64 *counters = &resp.send_wqes;
	int ret, i;

	ret = vrdma_cmd_exec(dev, &cmd, sizeof(cmd), &resp, sizeof(resp));
	if (ret)
		return ret;
	for (i = 0; i < VRDMA_NUM_QP_STATS; i++)
		values[i] = le64_to_cpu(counters[i]);
	return 0;
}

/* Add what @qp counted since it was bound (its values now: @now) to @values, in the port's layout. */
static void vrdma_add_growth(const struct vrdma_qp *qp, const u64 *now, u64 *values)
{
	int i;

	for (i = 0; i < VRDMA_NUM_QP_STATS; i++)
		values[vrdma_qp_stat_index[i]] += now[i] >= qp->counter_base[i] ? now[i] - qp->counter_base[i] : 0;
}

/* A counter's value now: what it retired and what its bound QPs counted since their binding. */
static void vrdma_counter_value(struct vrdma_dev *dev, struct vrdma_counter *vc, u64 *values)
{
	u64 now[VRDMA_NUM_QP_STATS];
	struct vrdma_qp *qp;

	lockdep_assert_held(&dev->counters_lock);
	memcpy(values, vc->retired, sizeof(vc->retired));
	list_for_each_entry(qp, &vc->qps, counter_node)
		if (!vrdma_query_qp_stats(dev, qp, now))
			vrdma_add_growth(qp, now, values);
}

static struct vrdma_counter *vrdma_counter_find(struct vrdma_dev *dev, struct rdma_counter *counter)
{
	struct vrdma_counter *vc;

	lockdep_assert_held(&dev->counters_lock);
	list_for_each_entry(vc, &dev->counters, node)
		if (vc->counter == counter)
			return vc;
	return NULL;
}

struct rdma_hw_stats *vrdma_alloc_hw_port_stats(struct ib_device *ibdev, u32 port)
{
	return vrdma_alloc_stats();
}

/* The port's counters as the device keeps them: what the whole VM counted, whatever QP counters took. */
int vrdma_query_counters(struct vrdma_dev *dev, struct vrdma_resp_query_counters *resp)
{
	struct vrdma_cmd_query_port cmd = { .hdr.opcode = cpu_to_le16(VRDMA_CMD_QUERY_COUNTERS), .port = 1 };

	return vrdma_cmd_exec(dev, &cmd, sizeof(cmd), resp, sizeof(*resp));
}

int vrdma_get_hw_stats(struct ib_device *ibdev, struct rdma_hw_stats *stats, u32 port, int index)
{
	struct vrdma_dev *dev = to_vdev(ibdev);
	struct vrdma_resp_query_counters resp;
	const __le64 *counters = &resp.send_wqes;
	u64 taken[VRDMA_NUM_STATS], value[VRDMA_NUM_STATS];
	struct vrdma_counter *vc;
	int ret, i;

	if (port != 1)
		return -EINVAL;
	mutex_lock(&dev->counters_lock);
	ret = vrdma_query_counters(dev, &resp);
	if (ret)
		goto out;
	/* What the core adds back: the live counters' values and the freed ones' last values. */
	memcpy(taken, dev->counted_history, sizeof(taken));
	list_for_each_entry(vc, &dev->counters, node) {
		vrdma_counter_value(dev, vc, value);
		for (i = 0; i < VRDMA_NUM_STATS; i++)
			taken[i] += value[i];
	}
	for (i = 0; i < VRDMA_NUM_STATS; i++) {
		u64 total = le64_to_cpu(counters[i]);

		stats->value[i] = total >= taken[i] ? total - taken[i] : 0;
	}
	ret = VRDMA_NUM_STATS;
out:
	mutex_unlock(&dev->counters_lock);
	return ret;
}

struct rdma_hw_stats *vrdma_counter_alloc_stats(struct rdma_counter *counter)
{
	struct vrdma_dev *dev = to_vdev(counter->device);
	struct vrdma_counter *vc = kzalloc(sizeof(*vc), GFP_KERNEL);
	struct rdma_hw_stats *stats;

	if (!vc)
		return NULL;
	stats = vrdma_alloc_stats();
	if (!stats) {
		kfree(vc);
		return NULL;
	}
	vc->counter = counter;
	INIT_LIST_HEAD(&vc->qps);
	mutex_lock(&dev->counters_lock);
	list_add(&vc->node, &dev->counters);
	mutex_unlock(&dev->counters_lock);
	return stats;
}

/* Called with the rdma_counter's lock held (the core's), as are unbind and update. */
int vrdma_counter_bind_qp(struct rdma_counter *counter, struct ib_qp *ibqp)
{
	struct vrdma_dev *dev = to_vdev(counter->device);
	struct vrdma_qp *qp = container_of(ibqp, struct vrdma_qp, ibqp);
	struct vrdma_counter *vc;
	int ret = -EINVAL;

	mutex_lock(&dev->counters_lock);
	vc = vrdma_counter_find(dev, counter);
	if (!vc)
		goto out;
	if (!counter->id) {
		/* The driver names its counters (the core files them under this id). */
		ret = ida_alloc_min(&dev->counter_ids, 1, GFP_KERNEL);
		if (ret < 0)
			goto out;
		counter->id = ret;
	}
	ret = vrdma_query_qp_stats(dev, qp, qp->counter_base);
	if (ret)
		goto out;
	list_add(&qp->counter_node, &vc->qps);
	vc->bound = true;
	ibqp->counter = counter;
out:
	if (ret && vc && !vc->bound) {
		/* A new counter whose first binding failed: the core frees it without counter_dealloc. */
		if (counter->id)
			ida_free(&dev->counter_ids, counter->id);
		counter->id = 0;
		list_del(&vc->node);
		kfree(vc);
	}
	mutex_unlock(&dev->counters_lock);
	return ret;
}

int vrdma_counter_unbind_qp(struct ib_qp *ibqp)
{
	struct vrdma_dev *dev = to_vdev(ibqp->device);
	struct vrdma_qp *qp = container_of(ibqp, struct vrdma_qp, ibqp);
	struct vrdma_counter *vc;
	u64 now[VRDMA_NUM_QP_STATS];

	mutex_lock(&dev->counters_lock);
	vc = vrdma_counter_find(dev, ibqp->counter);
	if (vc && !vrdma_query_qp_stats(dev, qp, now))
		vrdma_add_growth(qp, now, vc->retired);  /* (a lost device counted nothing more) */
	list_del(&qp->counter_node);
	ibqp->counter = NULL;
	mutex_unlock(&dev->counters_lock);
	return 0;
}

int vrdma_counter_update_stats(struct rdma_counter *counter)
{
	struct vrdma_dev *dev = to_vdev(counter->device);
	struct vrdma_counter *vc;

	mutex_lock(&dev->counters_lock);
	vc = vrdma_counter_find(dev, counter);
	if (vc)
		vrdma_counter_value(dev, vc, counter->stats->value);
	mutex_unlock(&dev->counters_lock);
	return vc ? 0 : -EINVAL;
}

/* The core added the counter's last values to the port's history: so does the driver, to take them off the port. */
int vrdma_counter_dealloc(struct rdma_counter *counter)
{
	struct vrdma_dev *dev = to_vdev(counter->device);
	struct vrdma_counter *vc;
	int i;

	mutex_lock(&dev->counters_lock);
	vc = vrdma_counter_find(dev, counter);
	if (vc) {
		for (i = 0; i < VRDMA_NUM_STATS; i++)
			dev->counted_history[i] += counter->stats->value[i];
		list_del(&vc->node);
		kfree(vc);
	}
	if (counter->id)
		ida_free(&dev->counter_ids, counter->id);
	mutex_unlock(&dev->counters_lock);
	return 0;
}
