// SPDX-License-Identifier: GPL-2.0-only
/*
 * CRC-32 (the Ethernet polynomial, reflected, as zlib's crc32() and the RoCE ICRC use it) at memory speed.
 *
 * Every RoCE packet's ICRC covers the whole packet, once when it is built and once when it arrives: at 9,000-byte
 * frames that is two passes over every byte moved between hosts. zlib's table-driven crc32() runs at about 2 GB/s
 * on the project's machines, so at the wire rates of a 10-25 Gb/s link the CRC alone would take most of a core on
 * each side. On x86-64 with PCLMULQDQ (every x86 server since 2010) this folds the buffer 64 bytes at a time with
 * carry-less multiplications (the method of Intel's "Fast CRC Computation for Generic Polynomials Using
 * PCLMULQDQ", 2009) and leaves zlib the folded 16-byte remainder and the last 0 to 15 bytes; elsewhere it is
 * zlib's crc32().
 *
 * Why the folding is right, in the polynomial view (M(x) the message, the first bit the highest degree; the CRC
 * register r is XORed into its first 32 bits; the CRC is M(x) * x^32 mod P): any 128-bit R with R = M (mod P)
 * has the same CRC as M, so the buffer is reduced to one 128-bit R and zlib finishes R and the tail. A 128-bit
 * block A = H * x^64 + L moved D bits on (A * x^D) is congruent to H * (x^(64+D) mod P) + L * (x^D mod P), which
 * has fewer than 96 bits and is XORed into the block D bits later. Bytes are reflected (bit 0 of byte 0 is the
 * highest degree), so a 16-byte block loaded little-endian holds H in its low 64 bits and L in its high 64, each
 * bit-reversed; PCLMULQDQ of two bit-reversed 64-bit operands gives their product bit-reversed in 128 bits times
 * x (bit 127 is always 0), which the constants absorb: they are x^(64+D-1) and x^(D-1) mod P.
 */
#include <zlib.h>

#include "vre.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>

/*
 * x^n mod P for the folds, bit-reversed in the high half of 64 bits (the coefficient of x^d at bit 63 - d), as
 * PCLMULQDQ takes them. Computed once (crc_fold_constants) rather than written out: on a CPU with PCLMULQDQ the
 * test compares the result with zlib's over every length and alignment, which a wrong constant cannot pass.
 */
struct crc_fold {
	__m128i by4;   /* D = 512: each of four lanes folded over the other three (x^575, x^511) */
	__m128i by1;   /* D = 128: one block onto the next (x^191, x^127) */
};

/* x^n mod P, bit-reversed in 32 bits (the coefficient of x^d at bit 31 - d), as zlib's register holds a remainder:
 * multiplying by x shifts right, and x^32 folds back in as P's other terms (0xedb88320). */
static uint64_t xpow_mod(unsigned int n)
{
	uint32_t r = 0x80000000u;  /* x^0 */

	while (n--)
		r = (r >> 1) ^ ((r & 1) ? 0xedb88320u : 0);
	return (uint64_t)r << 32;
}

static struct crc_fold crc_fold_constants(void)
{
	return (struct crc_fold){
		.by4 = _mm_set_epi64x((long long)xpow_mod(511), (long long)xpow_mod(575)),
		.by1 = _mm_set_epi64x((long long)xpow_mod(127), (long long)xpow_mod(191)),
	};
}

/* A folded D bits on, onto the block there: H (low lane) times the first constant, L (high lane) the second. */
__attribute__((target("pclmul")))
static inline __m128i fold(__m128i a, __m128i k, __m128i next)
{
	return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(a, k, 0x00), _mm_clmulepi64_si128(a, k, 0x11)), next);
}

/* The CRC register (not zlib's complemented value) after n >= 64 bytes from register r. */
__attribute__((target("pclmul")))
static uint32_t crc_folded(uint32_t r, const uint8_t *p, size_t n, const struct crc_fold *k)
{
	__m128i x0 = _mm_loadu_si128((const __m128i *)p), x1 = _mm_loadu_si128((const __m128i *)(p + 16));
	__m128i x2 = _mm_loadu_si128((const __m128i *)(p + 32)), x3 = _mm_loadu_si128((const __m128i *)(p + 48));
	uint8_t rest[16];

	x0 = _mm_xor_si128(x0, _mm_cvtsi32_si128((int)r));  /* the register over the first 32 bits */
	p += 64;
	n -= 64;
	for (; n >= 64; p += 64, n -= 64) {
		x0 = fold(x0, k->by4, _mm_loadu_si128((const __m128i *)p));
		x1 = fold(x1, k->by4, _mm_loadu_si128((const __m128i *)(p + 16)));
		x2 = fold(x2, k->by4, _mm_loadu_si128((const __m128i *)(p + 32)));
		x3 = fold(x3, k->by4, _mm_loadu_si128((const __m128i *)(p + 48)));
	}
	x0 = fold(fold(fold(x0, k->by1, x1), k->by1, x2), k->by1, x3);
	for (; n >= 16; p += 16, n -= 16)
		x0 = fold(x0, k->by1, _mm_loadu_si128((const __m128i *)p));
	_mm_storeu_si128((__m128i *)rest, x0);
	/* R from register 0 (zlib's crc 0xffffffff), then the tail from there. */
	return ~(uint32_t)crc32_z(crc32_z(0xffffffffu, rest, sizeof(rest)), p, n);
}

static bool has_pclmul(void)
{
	unsigned int eax, ebx, ecx, edx;

	return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_PCLMUL);  /* (SSE2 is x86-64's baseline) */
}

/* Set once (crc_setup, through pthread_once, which every reader passes first: the packet parser and builder are
 * called without an engine too, from any thread); read only afterwards. */
static struct crc_fold crc_k;
static bool crc_fast;

static void crc_setup(void)
{
	if (has_pclmul()) {
		crc_k = crc_fold_constants();
		crc_fast = true;
	}
}

VRE_FN uint32_t vre_crc32_update(uint32_t r, const uint8_t *p, size_t n)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	if (n == 0)
		return r;  /* (zlib's crc32() of no buffer is its initial value, not the one given) */
	pthread_once(&once, crc_setup);  /* a load and a compare once it ran */
	if (crc_fast && n >= 64)
		return crc_folded(r, p, n, &crc_k);
	return ~(uint32_t)crc32_z(~r, p, n);
}

#else

VRE_FN uint32_t vre_crc32_update(uint32_t r, const uint8_t *p, size_t n)
{
	return n ? ~(uint32_t)crc32_z(~r, p, n) : r;
}

#endif

uint32_t vre_crc32(uint32_t crc, const uint8_t *p, size_t n)
{
	return ~vre_crc32_update(~crc, p, n);
}
