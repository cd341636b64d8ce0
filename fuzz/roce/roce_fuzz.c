// SPDX-License-Identifier: GPL-2.0-only
/*
 * libFuzzer harness for the RoCE transport's state: the requester, responder and the one input every packet goes
 * through (backend/vrdma/engine/net.c, rreq.c, rresp.c), stateful, in process (fuzz/build.py builds it with
 * AddressSanitizer and UndefinedBehaviorSanitizer, the engine's C files linked in as they are).
 *
 * One input is one execution: two hosts, each an engine with one device (vre_net_capture: no sockets;
 * vre_clock_set: a clock only the harness moves), a guest memory arena each between guard pages, a CQ, two QPs
 * connected to the other host's (RC, or one UC pair) and an MR; the attributes (path MTU, first PSNs near or across
 * the 24-bit wrap, max_rd_atomic, timeout, retry counts) come from the input's header. Then operations, one byte
 * each and their operands: the guests post work requests of every kind the transport carries and receives, the
 * engines poll, the network between them carries the packets they sent in order, drops, duplicates, delays or
 * reorders them, and a forger sends packets mutated from the traffic seen so far (another PSN, opcode, syndrome,
 * QPN, length, payload byte, a truncation, with a valid or a broken ICRC) to either host; the clocks step to the
 * next timer (the hosts and guests are hosts.c's, the network and the operations this file's). The seed corpus
 * (fuzz/roce/seeds.py) replays the in-process RoCE tests' scenarios in this format.
 *
 * Oracles, beyond the sanitizers: after every operation each engine's transport state holds its invariants
 * (vre_check); completions come once each, in the order the work requests were posted; nothing outside the MRs and
 * rings is written (canary pages in guest memory, checked at the end); and once the input stops, a clean network
 * and the timers bring every posted send WQE to a completion or its QP to the error state within MAX_DRAIN rounds
 * (a QP never stalls); every packet given to an engine is counted exactly once (the network counters add up).
 */
#include <errno.h>

#include "roce.h"

/* The packets in flight are a ring (the first at inflight_head): popping moves no packet, where a memmove of
 * up to MAX_INFLIGHT packets of PKT_ROOM bytes once took a sixth of the fuzzer's time. */
static struct packet inflight[MAX_INFLIGHT], pool[POOL], scratch;
static uint32_t inflight_head, ninflight, pool_next, pool_count;
bool verbose;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* -- the engines and the network ------------------------------------------------------------------------------- */

static void check_engine(struct host *h)
{
	CHECK(vre_check(h->e) == 0, "%s", vre_error(h->e));
}

/* One pass of a host's engine: the work it did. */
static uint32_t poll_host(struct host *h)
{
	struct vre_event ev[64];
	uint32_t work = vre_poll(h->e, POLL_BUDGET);

	while (vre_take_events(h->e, ev, 64) == 64)
		;
	check_engine(h);
	consume(h);
	return work;
}

/* A packet's copy: its header and the bytes it holds, not the whole room. */
static void copy_packet(struct packet *to, const struct packet *from)
{
	to->len = from->len;
	to->addr = from->addr;
	memcpy(to->data, from->data, from->len);
}

/* The i-th packet in flight, from the first. */
static struct packet *flying(uint32_t i)
{
	return &inflight[(inflight_head + i) % MAX_INFLIGHT];
}

static void keep(const struct packet *p)
{
	copy_packet(&pool[pool_next++ % POOL], p);
	if (pool_count < POOL)
		pool_count++;
}

/* What the hosts sent, onto the network (in flight; kept for the forger); what does not fit is lost. */
static uint32_t collect(void)
{
	uint32_t n = 0;

	for (int i = 0; i < HOSTS; i++) {
		while ((scratch.len = vre_net_take(hosts[i].e, scratch.data, PKT_ROOM, &scratch.addr))) {
			CHECK(scratch.len <= PKT_ROOM, "a packet of %u bytes", scratch.len);
			keep(&scratch);
			if (ninflight < MAX_INFLIGHT)
				copy_packet(flying(ninflight++), &scratch);
			n++;
		}
	}
	return n;
}

static void deliver(const struct packet *p)
{
	for (int i = 0; i < HOSTS; i++) {
		if (!memcmp(hosts[i].gid, p->addr.dst, 16)) {
			int ret = vre_roce_input(hosts[i].e, p->data, p->len, &p->addr);

			CHECK(ret <= 0, "vre_roce_input returned %d", ret);
			check_engine(&hosts[i]);
			consume(&hosts[i]);
		}
	}
}

static void pop(uint32_t n)
{
	n = n < ninflight ? n : ninflight;
	inflight_head = (inflight_head + n) % MAX_INFLIGHT;
	ninflight -= n;
}

static void op_poll(struct in *in)
{
	poll_host(&hosts[u8(in) & 1]);
	collect();
}

/* The network: deliver the next packets in order, or lose, duplicate, hold back or reorder one. */
static void op_network(struct in *in)
{
	uint8_t how = u8(in);
	uint32_t n = 1 + (how >> 3);

	collect();
	if (!ninflight)
		return;
	switch (how & 7) {
	case 0: case 1: case 2:
		for (uint32_t i = 0; i < n && i < ninflight; i++)
			deliver(flying(i));
		pop(n);
		break;
	case 3:  /* lost */
		pop(1);
		break;
	case 4:  /* duplicated */
		deliver(flying(0));
		break;
	case 5:  /* the first held back behind the next n */
		if (ninflight > 1) {
			copy_packet(&scratch, flying(0));
			pop(1);
			for (uint32_t i = 0; i < n && i < ninflight; i++)
				deliver(flying(i));
			pop(n);
			deliver(&scratch);
		}
		break;
	case 6:  /* two swapped */
		if (ninflight > 1) {
			struct packet *first = flying(0), *second = flying(1);

			copy_packet(&scratch, first);
			copy_packet(first, second);
			copy_packet(second, &scratch);
		}
		break;
	default:  /* everything, in order */
		for (uint32_t i = 0; i < ninflight; i++)
			deliver(flying(i));
		pop(ninflight);
	}
}

/* Big-endian fields at their places: the IP and UDP headers', the BTH's in the UDP payload. */
static void put_be16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)(v >> 8);
	p[1] = (uint8_t)v;
}

static void put_be24(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 16);
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)v;
}

/* The IP packet a receive ring would hold for p: its IP (v4 or v6, by its source GID) and UDP headers written
 * around its UDP payload, as the sender's raw socket writes them; its length. */
static uint32_t as_ip(const struct packet *p, uint8_t *ip)
{
	bool v4 = !memcmp(p->addr.src, "\0\0\0\0\0\0\0\0\0\0\xff\xff", 12);
	uint32_t hl = v4 ? 20 : 40, sum = 0;
	uint8_t *udp = ip + hl;

	memset(ip, 0, hl);
	if (v4) {
		ip[0] = 0x45;
		put_be16(ip + 2, (uint16_t)(hl + 8 + p->len));
		put_be16(ip + 4, p->addr.ip_id);
		put_be16(ip + 6, p->addr.ip_frag);
		ip[8] = 64;
		ip[9] = 17;
		memcpy(ip + 12, p->addr.src + 12, 4);
		memcpy(ip + 16, p->addr.dst + 12, 4);
		for (uint32_t i = 0; i < hl; i += 2)
			sum += (uint32_t)ip[i] << 8 | ip[i + 1];
		while (sum >> 16)
			sum = (sum & 0xffff) + (sum >> 16);
		put_be16(ip + 10, (uint16_t)~sum);
	} else {
		ip[0] = 0x60;
		put_be16(ip + 4, (uint16_t)(8 + p->len));
		ip[6] = 17;
		ip[7] = 64;
		memcpy(ip + 8, p->addr.src, 16);
		memcpy(ip + 24, p->addr.dst, 16);
	}
	put_be16(udp, p->addr.sport);
	put_be16(udp + 2, p->addr.dport);
	put_be16(udp + 4, (uint16_t)(8 + p->len));
	put_be16(udp + 6, 0);
	memcpy(udp + 8, p->data, p->len);
	return hl + 8 + p->len;
}

/* p through the receive rings' checks (vre_ip_input), its IP or UDP header maybe damaged: a byte of the first 48
 * changed, or the packet cut short or padded. */
static void deliver_ip(struct in *in, const struct packet *p)
{
	static uint8_t ip[PKT_ROOM + 64];
	uint32_t len = as_ip(p, ip);
	uint8_t damage = u8(in);

	if (damage & 1)
		ip[u8(in) % 48] ^= u8(in) | 1;
	if (damage & 2)
		len = u16(in) % (len + 8);  /* (the 8 bytes past it: Ethernet's padding, zeros) */
	for (int i = 0; i < HOSTS; i++) {
		if (!memcmp(hosts[i].gid, p->addr.dst, 16)) {
			int ret = vre_ip_input(hosts[i].e, ip, len);

			CHECK(ret <= 0, "vre_ip_input returned %d", ret);
			CHECK((damage & 3) || ret != -EBADMSG, "an IP packet as the engine's peer writes it was malformed");
			check_engine(&hosts[i]);
			consume(&hosts[i]);
		}
	}
}

/*
 * A forger: a packet seen on the wire, changed, sent to either host. Parsed and built again through the engine's
 * own builder (so that its ICRC is valid and it reaches the transport), or changed as raw bytes (its ICRC most
 * likely broken), or handed over as a whole IP packet through the receive rings' checks, its headers maybe
 * damaged.
 */
static void op_forge(struct in *in)
{
	uint8_t how = u8(in), what = u8(in);
	struct vre_roce_pkt pkt;
	struct packet *p;

	collect();
	if (!pool_count)
		return;
	copy_packet(&scratch, &pool[u8(in) % pool_count]);
	p = &scratch;
	if (how & 1)  /* the other way: as if from the destination to the source */
		memcpy(p->addr.dst, hosts[(how >> 1) & 1].gid, 16);
	if (how & 8) {  /* as a whole IP packet */
		deliver_ip(in, p);
		return;
	}
	if (how & 4) {  /* raw damage */
		uint32_t at = u16(in) % p->len;

		if (what & 1)
			p->len = at;
		else
			p->data[at] ^= u8(in) | 1;
		deliver(p);
		return;
	}
	if (vre_roce_parse(p->data, p->len, &p->addr, &pkt))
		return;
	switch (what % 8) {
	case 0: pkt.psn = (pkt.psn + (uint32_t)(int8_t)u8(in)) & 0xffffff; break;
	case 1: pkt.psn = u32(in) & 0xffffff; break;
	case 2: pkt.opcode = roce_on(u8(in), (enum roce_transport)roce_transport_of(pkt.opcode)); break;
	case 3: pkt.aeth = (uint32_t)u8(in) << 24 | (pkt.aeth & 0xffffff); break;
	case 4: pkt.dest_qpn = hosts[0].qps[u8(in) % NQP].qpn; break;
	case 5: pkt.dma_len = u32(in) % 70000; pkt.va += u16(in); break;
	case 6: pkt.rkey = u32(in); break;
	default: pkt.ackreq ^= 1; pkt.psn = (pkt.psn + 1) & 0xffffff; break;
	}
	{
		uint8_t payload[PKT_ROOM];
		uint32_t plen = pkt.payload_len;
		int n;

		if (what & 8)
			plen = u16(in) % 4200;
		memset(payload, u8(in), plen);
		if (pkt.payload_len && plen)
			memcpy(payload, p->data + pkt.payload_off, plen < pkt.payload_len ? plen : pkt.payload_len);
		n = vre_roce_build(scratch.data, PKT_ROOM, &p->addr, &pkt, payload, plen);
		if (n < 0) {  /* an opcode that cannot carry that: the BTH changed in place, ICRC now wrong */
			put_be24(p->data + 9, pkt.psn);  /* the BTH's PSN: bytes 9 to 11 */
			deliver(p);
			return;
		}
		scratch.len = (uint32_t)n;
	}
	deliver(p);
}

/* Time passes: to the next timer (a retransmission, an RNR wait), or a little. */
static void advance(int64_t ns)
{
	for (int i = 0; i < HOSTS; i++) {
		hosts[i].now += ns;
		vre_clock_set(hosts[i].e, hosts[i].now);
	}
}

static int64_t next_deadline(void)
{
	int64_t next = -1;

	for (int i = 0; i < HOSTS; i++) {
		int64_t t = vre_next_deadline(hosts[i].e);

		if (t >= 0 && (next < 0 || t < next))
			next = t;
	}
	return next;
}

static void op_tick(struct in *in)
{
	int64_t next = next_deadline();
	uint8_t how = u8(in);

	if (how & 1 && next > hosts[0].now)
		advance(next - hosts[0].now);
	else
		advance((int64_t)(how >> 1) * 1000);
}

typedef void (*op_fn)(struct in *in);

static const op_fn ops[] = {
	op_post_send, op_post_send, op_post_recv, op_poll, op_migrate, op_network, op_network, op_network, op_forge,
	op_tick,
};
#define OP_COUNT (sizeof(ops) / sizeof(ops[0]))

/* -- after the input ------------------------------------------------------------------------------------------- */

/* Every posted send WQE completed (successfully, in error, or flushed by a QP in the error state). */
static bool settled(void)
{
	for (int i = 0; i < HOSTS; i++)
		for (uint32_t q = 0; q < NQP; q++)
			if (hosts[i].qps[q].sq_done != hosts[i].qps[q].sq_prod)
				return false;
	return true;
}

/* What each host did so far, for a report. */
static void report(void)
{
	for (int i = 0; i < HOSTS; i++) {
		struct vre_roce_counters roce;

		vre_device_roce_counters(hosts[i].e, 0, &roce);
		fprintf(stderr, "host %d: sent %llu, took %llu, retransmitted %llu, timeouts %llu, seq NAKs %llu, "
			"RNR NAKs %llu, duplicates %llu, dropped %llu", i, (unsigned long long)roce.tx_packets,
			(unsigned long long)roce.rx_packets, (unsigned long long)roce.retransmits,
			(unsigned long long)roce.timeouts, (unsigned long long)roce.seq_naks,
			(unsigned long long)roce.rnr_naks, (unsigned long long)roce.duplicates,
			(unsigned long long)roce.dropped);
		for (uint32_t q = 0; q < NQP; q++)
			fprintf(stderr, "; QP%u (state %d) sends %u/%u, receives %u/%u", q, vre_qp_state(hosts[i].e, 0, q),
				hosts[i].qps[q].sq_done, hosts[i].qps[q].sq_prod, hosts[i].qps[q].rq_done,
				hosts[i].qps[q].rq_prod);
		fputc('\n', stderr);
	}
}

/* A clean network and the timers: every posted send WQE completes within MAX_DRAIN rounds (its own completion, or
 * its QP's error and the flush). A round in which no engine did anything and nothing was sent, with no timer
 * armed and work not completed, is a stall. */
static void drain(void)
{
	for (uint32_t round = 0; round < MAX_DRAIN; round++) {
		uint32_t work = 0;

		if (settled())
			return;
		for (int i = 0; i < HOSTS; i++)
			work += poll_host(&hosts[i]);
		collect();
		work += ninflight;
		for (uint32_t i = 0; i < ninflight; i++)
			deliver(flying(i));
		pop(ninflight);
		if (!work && !settled()) {
			int64_t next = next_deadline();

			if (next < 0)
				report();
			CHECK(next >= 0, "a QP stalled: work posted and not completed, nothing in flight, no timer");
			advance(next > hosts[0].now ? next - hosts[0].now : 1);
		}
	}
	if (!settled())
		report();
	CHECK(settled(), "work still not completed after %u rounds", MAX_DRAIN);
}

/* Every packet given to an engine counted once: taken by a QP or refused for one reason; every packet built
 * either taken by the network or still in the ring (none: drained). */
static void check_counters(struct host *h)
{
	struct vre_net_counters net;
	struct vre_roce_counters roce;

	vre_net_counters(h->e, &net);
	vre_device_roce_counters(h->e, 0, &roce);
	CHECK(net.rx_packets == net.rx_malformed + net.rx_bad_icrc + net.rx_no_qp + net.rx_not_peer + roce.rx_packets,
	      "%llu packets in, %llu + %llu + %llu + %llu + %llu accounted", (unsigned long long)net.rx_packets,
	      (unsigned long long)net.rx_malformed, (unsigned long long)net.rx_bad_icrc,
	      (unsigned long long)net.rx_no_qp, (unsigned long long)net.rx_not_peer,
	      (unsigned long long)roce.rx_packets);
	CHECK(roce.tx_packets == net.tx_packets, "%llu packets built, %llu taken", (unsigned long long)roce.tx_packets,
	      (unsigned long long)net.tx_packets);
}

static uint8_t canary_page[PAGE];

/* Page 0 and the pages after the MR: no MR or ring covers them, so nothing may have changed them. */
static void check_canaries(struct host *h)
{
	for (uint32_t page = 0; page < ARENA_PAGES; page = page ? page + 1 : CANARY_FIRST)
		CHECK(!memcmp(h->arena + page_gpa(page), canary_page, PAGE),
		      "guest page %u, outside every MR and ring, was written", page);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	verbose = getenv("ROCE_FUZZ_VERBOSE") != NULL;
	memset(canary_page, CANARY, PAGE);
	for (int i = 0; i < HOSTS; i++) {
		uint8_t *map = mmap(NULL, (ARENA_PAGES + 2) * PAGE, PROT_READ | PROT_WRITE,
				    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		CHECK(map != MAP_FAILED, "mmap");
		CHECK(mprotect(map, PAGE, PROT_NONE) == 0 &&
		      mprotect(map + (ARENA_PAGES + 1) * PAGE, PAGE, PROT_NONE) == 0, "mprotect");
		hosts[i].arena = map + PAGE;
		hosts[i].doorbells = aligned_alloc(PAGE, 2 * PAGE);
		CHECK(hosts[i].doorbells, "doorbells");
	}
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct in in = { data, size };
	struct path path;

	read_path(&in, &path);
	inflight_head = ninflight = pool_next = pool_count = 0;
	for (int i = 0; i < HOSTS; i++)
		setup_host(i, &path);
	for (int i = 0; i < HOSTS; i++)
		connect_host(i, &path);
	for (uint32_t n = 0; n < MAX_OPS && in.left; n++)
		ops[u8(&in) % OP_COUNT](&in);
	drain();
	for (int i = 0; i < HOSTS; i++)
		poll_host(&hosts[i]);
	collect();
	for (int i = 0; i < HOSTS; i++) {
		check_counters(&hosts[i]);
		check_canaries(&hosts[i]);
	}
	if (verbose)
		report();
	for (int i = 0; i < HOSTS; i++) {
		vre_engine_free(hosts[i].e);
		hosts[i].e = NULL;
	}
	return 0;
}
