// SPDX-License-Identifier: GPL-2.0-only
/*
 * The transmit ring: packets for the network wait here between two sends (sockio.c sends them; a capture hands
 * them to a test or a fuzzer instead), built in place around the payload their sender gathered. Requesters leave
 * VRE_TX_RESERVE slots to responders, so that acknowledgements and READ responses always find room.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "vre.h"

int vre_net_attach(struct vre_engine *e, const int *rx_fds, const int *rx6_fds, uint32_t nrx, int tx_fd, int udp6_fd)
{
	struct vre_rx_ring *rings = NULL;
	uint32_t group[2] = { 0, 0 }, nrings;

	if ((nrx == 0) != (tx_fd < 0) || (udp6_fd >= 0) != (rx6_fds != NULL) || (udp6_fd >= 0 && tx_fd < 0) ||
	    nrx > VRE_MAX_RX_RINGS || (nrx && !rx_fds))
		return vre_fail(e, EINVAL, "RoCE needs its IPv4 sockets (1 to %u receive rings, got %u; send %d), with "
				"or without IPv6 (its receive rings and send socket %d together), or none",
				VRE_MAX_RX_RINGS, nrx, tx_fd, udp6_fd);
	nrings = rx6_fds ? 2 * nrx : nrx;
	for (uint32_t i = 0; i < nrings; i++)
		if ((i < nrx ? rx_fds[i] : rx6_fds[i - nrx]) < 0)
			return vre_fail(e, EBADF, "receive ring %u: no socket", i);
	if (vre_thread_count(e))
		return vre_fail(e, EBUSY, "the engine's threads are running: attach the network before they start");
	if (tx_fd >= 0 && !e->tx) {
		e->tx = calloc(VRE_TX_RING, sizeof(*e->tx));
		if (!e->tx)
			return vre_fail(e, ENOMEM, "no memory for the transmit ring");
	}
	/* The new rings first: a refusal leaves the engine with the network it had. IPv4's are [0, nrx), IPv6's
	 * [nrx, 2 nrx): thread t reads every ring i with i % threads == t (ring_mine), one of each family. */
	if (nrings) {
		rings = calloc(nrings, sizeof(*rings));
		if (!rings)
			return vre_fail(e, ENOMEM, "no memory for %u receive rings", nrings);
	}
	for (uint32_t i = 0; i < nrings; i++) {
		bool v6 = i >= nrx;
		int fd = v6 ? rx6_fds[i - nrx] : rx_fds[i];
		const char *step;
		int err = ring_open(&rings[i], fd, v6 ? AF_INET6 : AF_INET, nrx, &group[v6], &step);

		if (err) {
			rings_free(rings, i + 1);  /* what it mapped before it failed goes too */
			return vre_fail(e, err, "receive ring %u (IPv%c, socket %d): %s: %s", i % nrx, v6 ? '6' : '4', fd,
					step, strerror(err));
		}
	}
	rings_free(e->rings, e->nrings);
	e->rings = rings;
	e->nrings = nrings;
	e->tx_fd = tx_fd;
	e->udp6_fd = udp6_fd;
	e->capture = false;
	return 0;
}

int vre_net_capture(struct vre_engine *e)
{
	if (e->tx_fd >= 0)
		return vre_fail(e, EBUSY, "the engine has its sockets: no capture");
	if (vre_thread_count(e))
		return vre_fail(e, EBUSY, "the engine's threads are running: no capture");
	if (!e->tx) {
		e->tx = calloc(VRE_TX_RING, sizeof(*e->tx));
		if (!e->tx)
			return vre_fail(e, ENOMEM, "no memory for the transmit ring");
	}
	e->capture = true;
	return 0;
}

uint32_t vre_net_take(struct vre_engine *e, uint8_t *buf, uint32_t room, struct vre_roce_addr *addr)
{
	const struct vre_tx_pkt *p;

	if (!e->capture || e->tx_head == e->tx_tail)
		return 0;
	p = &e->tx[e->tx_head++ % VRE_TX_RING];
	*addr = p->addr;
	memcpy(buf, p->data, p->len < room ? p->len : room);
	net_count(&e->net.tx_packets, 1);
	return p->len;
}

VRE_FN struct vre_tx_pkt *tx_slot(struct vre_engine *e, bool requester)
{
	uint32_t limit = VRE_TX_RING - (requester ? VRE_TX_RESERVE : 0);

	if (!e->tx)
		return NULL;
	if (e->tx_tail - e->tx_head >= limit)
		sock_send(e);  /* make room: the network takes what it can now */
	if (e->tx_tail - e->tx_head >= limit)
		return NULL;
	return &e->tx[e->tx_tail % VRE_TX_RING];
}

VRE_FN void tx_queue(struct vre_engine *e, struct vre_device *d, const struct vre_roce_addr *addr,
		     struct vre_tx_pkt *slot, const struct vre_roce_pkt *pkt, uint32_t payload_len)
{
	int len;

	slot->addr = *addr;
	if (!ipv4_mapped(addr->src))
		slot->addr.sport = VRE_ROCE_PORT;  /* the IPv6 socket sends from the port it is bound to (sockio.c) */
	len = vre_roce_build(slot->data, sizeof(slot->data), &slot->addr, pkt,
			     slot->data + roce_header_len(pkt->opcode), payload_len);
	if (len < 0) {  /* an opcode or size the engine itself got wrong: never on the wire */
		net_count(&e->net.tx_dropped, 1);
		return;
	}
	slot->len = (uint32_t)len;
	e->tx_tail++;
	d->roce.tx_packets++;
}

