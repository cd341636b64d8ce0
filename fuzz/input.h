/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * How the native fuzz harnesses (fuzz/engine, fuzz/roce) read their input: a stream of bytes read little endian by
 * these helpers; an exhausted input reads zeros.
 */
#ifndef VRDMA_FUZZ_INPUT_H
#define VRDMA_FUZZ_INPUT_H

#include <stddef.h>
#include <stdint.h>

struct in {
	const uint8_t *p;
	size_t left;
};

static inline uint8_t u8(struct in *in)
{
	if (!in->left)
		return 0;
	in->left--;
	return *in->p++;
}

static inline uint16_t u16(struct in *in)
{
	uint16_t lo = u8(in);

	return (uint16_t)(lo | (uint16_t)u8(in) << 8);
}

static inline uint32_t u32(struct in *in)
{
	uint32_t lo = u16(in);

	return lo | (uint32_t)u16(in) << 16;
}

static inline uint64_t u64(struct in *in)
{
	uint64_t lo = u32(in);

	return lo | (uint64_t)u32(in) << 32;
}

#endif /* VRDMA_FUZZ_INPUT_H */
