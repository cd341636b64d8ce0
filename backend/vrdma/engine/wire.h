/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * What a RoCE packet's opcode is, said once (the shape of rxe's rxe_opcode.c): every wire opcode the device speaks
 * has a name here and one row in wire.c (its extension headers, what kind of packet it is, where it stands in its
 * message). The requester (rreq.c), the completer (rcomp.c), the responder (rresp.c), the packet parser (roce.c),
 * the entry point (net.c) and datagrams (ud.c) read the row; none of them compares an opcode with a number
 * (`make lint` checks it). The acknowledgement extended header (AETH) is here too, for the same reason.
 *
 * An opcode's top three bits are its transport, the low five its operation (InfiniBand specification, 9.2.1 and
 * table 38): RC and UC share the operations UC has, a UD datagram is a SEND only.
 */
#ifndef VRDMA_ENGINE_WIRE_H
#define VRDMA_ENGINE_WIRE_H

#include <stdbool.h>
#include <stdint.h>

enum roce_transport {
	ROCE_RC = 0x00,
	ROCE_UC = 0x20,
	ROCE_UD = 0x60,
};

#define ROCE_TRANSPORT_MASK 0xe0
#define ROCE_OPERATION_MASK 0x1f

#define RC(op) (ROCE_RC | (op))
#define UC(op) (ROCE_UC | (op))
#define UD(op) (ROCE_UD | (op))
enum roce_opcode {
	ROCE_RC_SEND_FIRST = RC(0x00),
	ROCE_RC_SEND_MIDDLE = RC(0x01),
	ROCE_RC_SEND_LAST = RC(0x02),
	ROCE_RC_SEND_LAST_WITH_IMM = RC(0x03),
	ROCE_RC_SEND_ONLY = RC(0x04),
	ROCE_RC_SEND_ONLY_WITH_IMM = RC(0x05),
	ROCE_RC_WRITE_FIRST = RC(0x06),
	ROCE_RC_WRITE_MIDDLE = RC(0x07),
	ROCE_RC_WRITE_LAST = RC(0x08),
	ROCE_RC_WRITE_LAST_WITH_IMM = RC(0x09),
	ROCE_RC_WRITE_ONLY = RC(0x0a),
	ROCE_RC_WRITE_ONLY_WITH_IMM = RC(0x0b),
	ROCE_RC_READ_REQUEST = RC(0x0c),
	ROCE_RC_READ_RESPONSE_FIRST = RC(0x0d),
	ROCE_RC_READ_RESPONSE_MIDDLE = RC(0x0e),
	ROCE_RC_READ_RESPONSE_LAST = RC(0x0f),
	ROCE_RC_READ_RESPONSE_ONLY = RC(0x10),
	ROCE_RC_ACKNOWLEDGE = RC(0x11),
	ROCE_RC_ATOMIC_ACKNOWLEDGE = RC(0x12),
	ROCE_RC_COMPARE_SWAP = RC(0x13),
	ROCE_RC_FETCH_ADD = RC(0x14),
	ROCE_RC_SEND_LAST_WITH_INVALIDATE = RC(0x16),
	ROCE_RC_SEND_ONLY_WITH_INVALIDATE = RC(0x17),
	ROCE_UC_SEND_FIRST = UC(0x00),
	ROCE_UC_SEND_MIDDLE = UC(0x01),
	ROCE_UC_SEND_LAST = UC(0x02),
	ROCE_UC_SEND_LAST_WITH_IMM = UC(0x03),
	ROCE_UC_SEND_ONLY = UC(0x04),
	ROCE_UC_SEND_ONLY_WITH_IMM = UC(0x05),
	ROCE_UC_WRITE_FIRST = UC(0x06),
	ROCE_UC_WRITE_MIDDLE = UC(0x07),
	ROCE_UC_WRITE_LAST = UC(0x08),
	ROCE_UC_WRITE_LAST_WITH_IMM = UC(0x09),
	ROCE_UC_WRITE_ONLY = UC(0x0a),
	ROCE_UC_WRITE_ONLY_WITH_IMM = UC(0x0b),
	ROCE_UD_SEND_ONLY = UD(0x04),
	ROCE_UD_SEND_ONLY_WITH_IMM = UD(0x05),
};
#undef RC
#undef UC
#undef UD

/* What a packet is to whoever takes it: a request the responder runs, or an answer the completer takes. */
enum roce_kind {
	ROCE_UNKNOWN,             /* an opcode this device does not speak: the parser refuses it */
	ROCE_SEND,
	ROCE_WRITE,
	ROCE_READ,                /* a READ request */
	ROCE_ATOMIC,
	ROCE_READ_RESPONSE,
	ROCE_ACK,                 /* an ACK, or a NAK (the AETH says which) */
	ROCE_ATOMIC_ACK,
};

/* Where a packet stands in its message (a READ, an atomic, an acknowledgement and a datagram are one packet). */
enum wire_pos { WIRE_FIRST, WIRE_MIDDLE, WIRE_LAST, WIRE_ONLY };

struct roce_op {
	const char *name;
	uint16_t headers;         /* VRE_ROCE_*: its extension headers, and whether it may carry data */
	uint8_t kind;             /* enum roce_kind */
	uint8_t pos;              /* enum wire_pos */
};

/* One row per opcode byte (wire.c); an opcode the device does not speak has kind ROCE_UNKNOWN and no headers. */
extern const struct roce_op roce_ops[256] __attribute__((visibility("hidden")));

static inline const struct roce_op *roce_op(uint8_t opcode)
{
	return &roce_ops[opcode];
}

static inline uint32_t roce_transport_of(uint8_t opcode)
{
	return opcode & ROCE_TRANSPORT_MASK;
}

/* The same operation on another transport (a UC requester sends the RC opcode's UC twin; a datagram the UD one). */
static inline uint8_t roce_on(uint8_t opcode, enum roce_transport transport)
{
	return (uint8_t)((opcode & ROCE_OPERATION_MASK) | transport);
}

/* An answer (READ response, ACK or NAK, atomic acknowledgement) rather than a request. */
static inline bool roce_is_answer(const struct roce_op *op)
{
	return op->kind >= ROCE_READ_RESPONSE;
}

static inline bool roce_starts(const struct roce_op *op)
{
	return op->pos == WIRE_FIRST || op->pos == WIRE_ONLY;
}

static inline bool roce_ends(const struct roce_op *op)
{
	return op->pos == WIRE_LAST || op->pos == WIRE_ONLY;
}

/* The READ response opcode for response k of a READ's npkts. */
static inline uint8_t roce_read_response(uint32_t k, uint32_t npkts)
{
	return npkts == 1 ? ROCE_RC_READ_RESPONSE_ONLY : k == 0 ? ROCE_RC_READ_RESPONSE_FIRST :
	       k == npkts - 1 ? ROCE_RC_READ_RESPONSE_LAST : ROCE_RC_READ_RESPONSE_MIDDLE;
}

/*
 * The AETH: a syndrome (its top three bits the type: ACK, RNR NAK or NAK; the low five a credit count, an RNR timer
 * or a NAK code) and the responder's message sequence number (MSN, 24 bits). Table 42 of the specification.
 */
#define AETH_TYPE_MASK 0x60
#define AETH_VALUE_MASK 0x1f
enum aeth_type {
	AETH_ACK = 0x00,
	AETH_RNR_NAK = 0x20,
	AETH_NAK = 0x60,
};
#define AETH_ACK_UNLIMITED (AETH_ACK | AETH_VALUE_MASK)   /* an ACK without end-to-end credits */
enum aeth_nak_code {
	AETH_NAK_PSN_SEQUENCE = 0,
	AETH_NAK_INVALID_REQUEST = 1,
	AETH_NAK_REMOTE_ACCESS = 2,
	AETH_NAK_REMOTE_OPERATION = 3,
	AETH_NAK_INVALID_RD_REQUEST = 4,
};
#define AETH_MSN_MASK 0xffffffu

static inline uint32_t aeth_make(uint8_t syndrome, uint32_t msn)
{
	return (uint32_t)syndrome << 24 | (msn & AETH_MSN_MASK);
}

static inline uint8_t aeth_syndrome(uint32_t aeth)
{
	return (uint8_t)(aeth >> 24);
}

/* QP numbers are 24 bits on the wire (BTH, DETH). */
#define ROCE_QPN_MASK 0xffffffu

/* The partition key every packet carries: the default, full membership (the device has one partition). */
#define ROCE_DEFAULT_PKEY 0xffff

#endif /* VRDMA_ENGINE_WIRE_H */
