// SPDX-License-Identifier: GPL-2.0-only
/*
 * The port's performance-management agent: the InfiniBand PMA's ClassPortInfo, PortCounters and
 * PortCountersExtended, answered from QUERY_COUNTERS. The RDMA core creates a port's `counters` directory in sysfs
 * only for a driver that answers these (it asks ClassPortInfo once at registration, then one attribute for each
 * file read), and that directory is what monitoring reads: node_exporter's infiniband collector, telegraf,
 * collectd, netdata. `hw_counters` (vrdma_counter.c, `rdma statistic`) carries the same data counters by name:
 * PortXmitData here is tx_bytes there, in the four-byte words the specification counts in.
 *
 * Only the core's own queries are answered (no work completion: they come from sysfs, not from the wire). A MAD
 * that arrives on QP1 from a peer goes on to the MAD layer as if the driver had no agent, as rxe's would: RoCE
 * fabrics are not managed through the PMA, and the driver answers nothing a peer sends.
 *
 * The link is virtual: it has no symbol, integrity, overrun or constraint errors and never goes down, so those
 * counters are zero because nothing of theirs can happen; no multicast exists, so all packets are unicast.
 */
#include <rdma/ib_mad.h>
#include <rdma/ib_pma.h>

#include "vrdma.h"

static_assert(sizeof(struct ib_class_port_info) <= sizeof_field(struct ib_pma_mad, data));
static_assert(sizeof(struct ib_pma_portcounters) <= sizeof_field(struct ib_pma_mad, data));
static_assert(sizeof(struct ib_pma_portcounters_ext) <= sizeof_field(struct ib_pma_mad, data));

/* What a 32-bit PortCounters field shows: the IBTA's counters stop at all ones rather than wrap. */
static __be32 vrdma_pma_saturated(u64 value)
{
	return cpu_to_be32(min_t(u64, value, U32_MAX));
}

static void vrdma_pma_class_port_info(struct ib_pma_mad *pmp)
{
	struct ib_class_port_info *cpi = (struct ib_class_port_info *)pmp->data;

	cpi->base_version = IB_MGMT_BASE_VERSION;
	cpi->class_version = 1;
	/* 64-bit data and packet counters, unicast and multicast included (PortCountersExtended in full). */
	cpi->capability_mask = IB_PMA_CLASS_CAP_EXT_WIDTH;
	cpi->cap_mask2_resp_time = cpu_to_be32(18);  /* RespTimeValue: 4.096 us * 2^18, the usual ~1 s */
}

static void vrdma_pma_port_counters(struct ib_pma_mad *pmp, const struct vrdma_resp_query_counters *c)
{
	struct ib_pma_portcounters *pc = (struct ib_pma_portcounters *)pmp->data;

	pc->port_select = 1;
	pc->port_xmit_data = vrdma_pma_saturated(le64_to_cpu(c->tx_bytes) / 4);
	pc->port_rcv_data = vrdma_pma_saturated(le64_to_cpu(c->rx_bytes) / 4);
	pc->port_xmit_packets = vrdma_pma_saturated(le64_to_cpu(c->tx_packets));
	pc->port_rcv_packets = vrdma_pma_saturated(le64_to_cpu(c->rx_packets));
}

static void vrdma_pma_port_counters_ext(struct ib_pma_mad *pmp, const struct vrdma_resp_query_counters *c)
{
	struct ib_pma_portcounters_ext *pc = (struct ib_pma_portcounters_ext *)pmp->data;

	pc->port_select = 1;
	pc->port_xmit_data = cpu_to_be64(le64_to_cpu(c->tx_bytes) / 4);
	pc->port_rcv_data = cpu_to_be64(le64_to_cpu(c->rx_bytes) / 4);
	pc->port_xmit_packets = cpu_to_be64(le64_to_cpu(c->tx_packets));
	pc->port_rcv_packets = cpu_to_be64(le64_to_cpu(c->rx_packets));
	pc->port_unicast_xmit_packets = pc->port_xmit_packets;
	pc->port_unicast_rcv_packets = pc->port_rcv_packets;
}

int vrdma_process_mad(struct ib_device *ibdev, int mad_flags, u32 port, const struct ib_wc *in_wc,
		      const struct ib_grh *in_grh, const struct ib_mad *in, struct ib_mad *out, size_t *out_mad_size,
		      u16 *out_mad_pkey_index)
{
	const struct ib_pma_mad *query = (const struct ib_pma_mad *)in;
	struct ib_pma_mad *pmp = (struct ib_pma_mad *)out;
	struct vrdma_resp_query_counters counters;
	__be16 attr = in->mad_hdr.attr_id;

	if (in_wc || in->mad_hdr.mgmt_class != IB_MGMT_CLASS_PERF_MGMT || in->mad_hdr.method != IB_MGMT_METHOD_GET)
		return IB_MAD_RESULT_SUCCESS;  /* not the core's own query: the MAD layer goes on with it */
	if (port != 1 || *out_mad_size < sizeof(*out))
		return IB_MAD_RESULT_FAILURE;

	memset(out, 0, sizeof(*out));
	out->mad_hdr = in->mad_hdr;
	out->mad_hdr.method = IB_MGMT_METHOD_GET_RESP;
	*out_mad_size = sizeof(*out);
	if (attr == IB_PMA_CLASS_PORT_INFO) {
		vrdma_pma_class_port_info(pmp);
		return IB_MAD_RESULT_SUCCESS | IB_MAD_RESULT_REPLY;
	}
	/* PortSelect: this port, or all of them (0xFF), which is the same one port. */
	if ((attr != IB_PMA_PORT_COUNTERS && attr != IB_PMA_PORT_COUNTERS_EXT) ||
	    (query->data[1] != 1 && query->data[1] != 0xFF)) {
		out->mad_hdr.status = cpu_to_be16(IB_MGMT_MAD_STATUS_UNSUPPORTED_METHOD_ATTRIB);
		return IB_MAD_RESULT_SUCCESS | IB_MAD_RESULT_REPLY;
	}
	if (vrdma_query_counters(to_vdev(ibdev), &counters))
		return IB_MAD_RESULT_FAILURE;  /* the device is gone or resetting: the core's read fails with EINVAL */
	if (attr == IB_PMA_PORT_COUNTERS)
		vrdma_pma_port_counters(pmp, &counters);
	else
		vrdma_pma_port_counters_ext(pmp, &counters);
	return IB_MAD_RESULT_SUCCESS | IB_MAD_RESULT_REPLY;
}
