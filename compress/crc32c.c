#include "crc32c.h"

#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* P = x^32 + x^28 + x^27 + ... + 1, reflected and without its x^32 term. */
#define CRC32C_POLY 0x82f63b78u

/* All the code below works on the raw CRC register: the public functions
 * invert on the way in and out (init and final xor 0xffffffff).
 *
 * The register is a polynomial of degree < 32 in the reflected form: bit 31
 * is the coefficient of x^0, bit 0 that of x^31. Feeding message bits M
 * (first bit highest degree) to register c leaves
 *	(c * x^|M| + M * x^32) mod P,
 * which is linear in (c, M). Two consequences the fast paths rest on:
 *  - the register of A||B is shift(reg(A), |B|) ^ reg_from_0(B), where
 *    shift(c, n bits) = c * x^n mod P (the register after n zero bits);
 *  - an initial register c is the same as xoring c into the first 4 bytes of
 *    the message (read little-endian) and starting from 0. */

static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void table_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ CRC32C_POLY : c >> 1;
		table[0][i] = c;
	}
	for (uint32_t i = 0; i < 256; i++)
		for (int t = 1; t < 8; t++)
			table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
}

uint32_t gg_crc32c_ref(uint32_t crc, const void *data, size_t len)
{
	const uint8_t *p = data;

	pthread_once(&table_once, table_init);
	crc = ~crc;
	for (; len >= 8; len -= 8, p += 8) {
		uint64_t w;
		memcpy(&w, p, sizeof(w)); /* little-endian host (see codec_internal.h) */
		w ^= crc;
		crc = table[7][w & 0xff] ^ table[6][(w >> 8) & 0xff] ^ table[5][(w >> 16) & 0xff] ^
		      table[4][(w >> 24) & 0xff] ^ table[3][(w >> 32) & 0xff] ^ table[2][(w >> 40) & 0xff] ^
		      table[1][(w >> 48) & 0xff] ^ table[0][w >> 56];
	}
	while (len--)
		crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff];
	return ~crc;
}

#if defined(__x86_64__)

/* Polynomial arithmetic mod P in the reflected form above, to derive the
 * shift and fold constants at start-up instead of trusting magic numbers. */

/* a * b mod P: b runs through b, b x, b x^2, ... (a right shift multiplies
 * by x; a bit shifted out is x^32, which is P - x^32 = CRC32C_POLY mod P) and
 * is added in for every term x^i present in a (bit 31 - i). */
static uint32_t poly_mulmod(uint32_t a, uint32_t b)
{
	uint32_t p = 0;

	for (uint32_t m = 1u << 31; m; m >>= 1) {
		if (a & m)
			p ^= b;
		b = b & 1 ? (b >> 1) ^ CRC32C_POLY : b >> 1;
	}
	return p;
}

/* x^n mod P by square and multiply. */
static uint32_t poly_xpow(uint64_t n)
{
	uint32_t r = 1u << 31;	/* 1 */
	uint32_t sq = 1u << 30; /* x, then x^2, x^4, ... */

	for (; n; n >>= 1) {
		if (n & 1)
			r = poly_mulmod(r, sq);
		sq = poly_mulmod(sq, sq);
	}
	return r;
}

/* Three-way path: the buffer goes in rounds of three blocks, each block
 * with its own crc32 chain from 0 (the instruction has a latency of 3 cycles
 * but issues at least every cycle, so one chain leaves it mostly idle), and
 * the round is then added to the register with shifts. Since no chain of a
 * round depends on the previous round, short rounds let the CPU overlap
 * them: 256-byte blocks measured best on the EPYC (about 39 GB/s against
 * 26 for 8 KiB blocks), 64-byte ones take what is left. */
#define CRC3_BLOCK 256
#define CRC3_TAIL_BLOCK 64

/* VPCLMULQDQ path: four 64-byte accumulators, 256 bytes a round; buffers
 * under 512 bytes go three ways, which is as fast there. */
#define FOLD_STRIDE 256
#define FOLD_MIN 512

/* Fold constants, moving one 128-bit lane d bytes forward (see fold_pair):
 * lo multiplies its first 8 bytes, hi its last 8. */
struct fold_k {
	uint64_t lo, hi;
};

static struct {
	/* crc_shift constants for 1, 2, 3 blocks of CRC3_BLOCK and
	 * CRC3_TAIL_BLOCK bytes */
	uint32_t block[3], tail_block[3];
	struct fold_k f16, f32, f48, f64, f256;
} K;

/* A lane holds 128 message bits, byte 0 bit 0 first: bit k of the lane is
 * the coefficient of x^(127 - k) in the lane's own polynomial L = H x^64 + L'
 * (H the first 8 bytes, L' the last 8). Moving the lane d bytes later in the
 * stream means multiplying it by x^(8d) mod P.
 *
 * pclmul of a reflected 64-bit H (bit i: x^(63 - i)) and a reflected 32-bit
 * constant k (bit j: x^(31 - j)) sets bit m of the 128-bit product to the
 * coefficient of x^(94 - m) of H k; read as a lane (bit m: x^(127 - m)) that
 * is H k x^33. So H x^64 x^(8d) needs k = x^(8d + 64 - 33) = x^(8d + 31),
 * and L' x^(8d) needs k = x^(8d - 33). The products have degree < 96, so they
 * fit the lane and stay congruent mod P, which is all the CRC sees. */
static struct fold_k fold_pair(uint64_t d)
{
	return (struct fold_k){ .lo = poly_xpow(8 * d + 31), .hi = poly_xpow(8 * d - 33) };
}

static void consts_init(void)
{
	/* crc_shift(c, k) = c k x^33 mod P (see there), so a shift by n bytes
	 * takes k = x^(8n - 33) */
	for (int i = 0; i < 3; i++) {
		K.block[i] = poly_xpow(8 * (uint64_t)(i + 1) * CRC3_BLOCK - 33);
		K.tail_block[i] = poly_xpow(8 * (uint64_t)(i + 1) * CRC3_TAIL_BLOCK - 33);
	}
	K.f16 = fold_pair(16);
	K.f32 = fold_pair(32);
	K.f48 = fold_pair(48);
	K.f64 = fold_pair(64);
	K.f256 = fold_pair(FOLD_STRIDE);
}

static inline uint64_t load64(const uint8_t *p)
{
	uint64_t w;

	memcpy(&w, p, sizeof(w)); /* little-endian host */
	return w;
}

/* The single chain: about 8 bytes every 3 cycles. */
__attribute__((target("sse4.2"))) static uint32_t crc_chain(uint32_t c, const uint8_t *p, size_t len)
{
	uint64_t c64 = c;

	for (; len >= 8; len -= 8, p += 8)
		c64 = _mm_crc32_u64(c64, load64(p));
	c = (uint32_t)c64;
	while (len--)
		c = _mm_crc32_u8(c, *p++);
	return c;
}

__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const void *data, size_t len)
{
	return ~crc_chain(~crc, data, len);
}

/* c * x^(8n) mod P for k = x^(8n - 33) mod P. pclmul of the reflected c and
 * k leaves c k in bits 0..62, with bit m the coefficient of x^(62 - m);
 * crc32 of that quadword from register 0 reads bit m as x^(63 - m) (one
 * factor x) and appends 32 zero bits (x^32), reducing mod P: c k x^33. */
__attribute__((target("sse4.2,pclmul"))) static inline uint32_t crc_shift(uint32_t c, uint32_t k)
{
	__m128i prod = _mm_clmulepi64_si128(_mm_cvtsi32_si128((int)c), _mm_cvtsi32_si128((int)k), 0x00);

	return (uint32_t)_mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(prod));
}

/* Rounds of three blocks of `block` bytes while they fit; k[i] shifts by
 * i + 1 blocks. Advances *p and *len. */
__attribute__((target("sse4.2,pclmul"))) static inline uint32_t
crc3_rounds(uint32_t c, const uint8_t **p, size_t *len, size_t block, const uint32_t k[3])
{
	const uint8_t *a = *p;
	size_t n = *len;

	for (; n >= 3 * block; n -= 3 * block, a += 3 * block) {
		uint64_t c0 = 0, c1 = 0, c2 = 0;

		for (size_t i = 0; i < block; i += 8) {
			c0 = _mm_crc32_u64(c0, load64(a + i));
			c1 = _mm_crc32_u64(c1, load64(a + block + i));
			c2 = _mm_crc32_u64(c2, load64(a + 2 * block + i));
		}
		/* reg(c, A||B||C) = shift(c, 3 block) ^ shift(reg(0, A), 2 block)
		 *		      ^ shift(reg(0, B), block) ^ reg(0, C) */
		c = crc_shift(c, k[2]) ^ crc_shift((uint32_t)c0, k[1]) ^ crc_shift((uint32_t)c1, k[0]) ^ (uint32_t)c2;
	}
	*p = a;
	*len = n;
	return c;
}

/* Register c continued over len bytes at p, three ways. */
__attribute__((target("sse4.2,pclmul"))) static uint32_t crc3(uint32_t c, const uint8_t *p, size_t len)
{
	c = crc3_rounds(c, &p, &len, CRC3_BLOCK, K.block);
	c = crc3_rounds(c, &p, &len, CRC3_TAIL_BLOCK, K.tail_block);
	return crc_chain(c, p, len);
}

__attribute__((target("sse4.2,pclmul"))) static uint32_t crc32c_sse42_3way(uint32_t crc, const void *data,
									  size_t len)
{
	return ~crc3(~crc, data, len);
}

/* Moves each 128-bit lane of x forward by the distance k was made for (see
 * fold_pair) and adds next: lo half times k.lo, hi half times k.hi. */
__attribute__((target("avx512f,vpclmulqdq"))) static inline __m512i fold512(__m512i x, __m512i k, __m512i next)
{
	__m512i a = _mm512_clmulepi64_epi128(x, k, 0x00);
	__m512i b = _mm512_clmulepi64_epi128(x, k, 0x11);

	return _mm512_ternarylogic_epi64(a, b, next, 0x96); /* a ^ b ^ next */
}

__attribute__((target("pclmul"))) static inline __m128i fold128(__m128i x, __m128i k, __m128i next)
{
	__m128i a = _mm_clmulepi64_si128(x, k, 0x00);
	__m128i b = _mm_clmulepi64_si128(x, k, 0x11);

	return _mm_xor_si128(_mm_xor_si128(a, b), next);
}

__attribute__((target("avx512f"))) static inline __m512i fold_k512(struct fold_k k)
{
	return _mm512_set_epi64((long long)k.hi, (long long)k.lo, (long long)k.hi, (long long)k.lo,
				(long long)k.hi, (long long)k.lo, (long long)k.hi, (long long)k.lo);
}

/* Folding: keep the message as a few 512-bit accumulators congruent (mod P,
 * at their position in the stream) to everything read so far, each round
 * moving them forward by the stride and adding the next bytes; then fold
 * them into one 128-bit lane, whose register from 0 is two crc32 steps. */
__attribute__((target("avx512f,vpclmulqdq,pclmul,sse4.2"))) static uint32_t
crc32c_vpclmul(uint32_t crc, const void *data, size_t len)
{
	const uint8_t *p = data;
	uint32_t c = ~crc;

	if (len < FOLD_MIN)
		return ~crc3(c, p, len);

	__m512i k = fold_k512(K.f256);
	/* the initial register goes into the first 4 bytes */
	__m512i x0 = _mm512_xor_si512(_mm512_loadu_si512(p), _mm512_set_epi64(0, 0, 0, 0, 0, 0, 0, c));
	__m512i x1 = _mm512_loadu_si512(p + 64);
	__m512i x2 = _mm512_loadu_si512(p + 128);
	__m512i x3 = _mm512_loadu_si512(p + 192);

	for (p += FOLD_STRIDE, len -= FOLD_STRIDE; len >= FOLD_STRIDE; p += FOLD_STRIDE, len -= FOLD_STRIDE) {
		x0 = fold512(x0, k, _mm512_loadu_si512(p));
		x1 = fold512(x1, k, _mm512_loadu_si512(p + 64));
		x2 = fold512(x2, k, _mm512_loadu_si512(p + 128));
		x3 = fold512(x3, k, _mm512_loadu_si512(p + 192));
	}
	/* four accumulators into one, 64 bytes at a time, then whatever
	 * 64-byte pieces are left */
	k = fold_k512(K.f64);
	x0 = fold512(x0, k, x1);
	x0 = fold512(x0, k, x2);
	x0 = fold512(x0, k, x3);
	for (; len >= 64; p += 64, len -= 64)
		x0 = fold512(x0, k, _mm512_loadu_si512(p));

	/* lanes 0, 1, 2 forward by 48, 32, 16 bytes onto lane 3 (lane 3
	 * of the constant is 0, so it drops out of the products) */
	k = _mm512_set_epi64(0, 0, (long long)K.f16.hi, (long long)K.f16.lo, (long long)K.f32.hi,
			     (long long)K.f32.lo, (long long)K.f48.hi, (long long)K.f48.lo);
	__m512i z = fold512(x0, k, _mm512_setzero_si512());
	__m128i y = _mm_xor_si128(_mm_xor_si128(_mm512_extracti32x4_epi32(z, 0), _mm512_extracti32x4_epi32(z, 1)),
				  _mm_xor_si128(_mm512_extracti32x4_epi32(z, 2), _mm512_extracti32x4_epi32(x0, 3)));

	__m128i k16 = _mm_set_epi64x((long long)K.f16.hi, (long long)K.f16.lo);
	for (; len >= 16; p += 16, len -= 16)
		y = fold128(y, k16, _mm_loadu_si128((const __m128i *)(const void *)p));

	/* y is a 16-byte message with the same register as all of the
	 * above; run it through from 0 */
	uint64_t c64 = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(y));
	c = (uint32_t)_mm_crc32_u64(c64, (uint64_t)_mm_extract_epi64(y, 1));
	return ~crc_chain(c, p, len);
}

#endif /* __x86_64__ */

static struct gg_crc32c_impl impls[4];
static size_t n_impls;
static pthread_once_t impls_once = PTHREAD_ONCE_INIT;

static void impls_init(void)
{
	impls[n_impls++] = (struct gg_crc32c_impl){ "table", gg_crc32c_ref };
#if defined(__x86_64__)
	__builtin_cpu_init();
	bool sse42 = __builtin_cpu_supports("sse4.2"), pclmul = __builtin_cpu_supports("pclmul");

	consts_init();
	if (sse42)
		impls[n_impls++] = (struct gg_crc32c_impl){ "sse4.2", crc32c_sse42 };
	if (sse42 && pclmul)
		impls[n_impls++] = (struct gg_crc32c_impl){ "sse4.2 3-way + pclmul", crc32c_sse42_3way };
	if (sse42 && pclmul && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("vpclmulqdq"))
		impls[n_impls++] = (struct gg_crc32c_impl){ "avx512 vpclmulqdq", crc32c_vpclmul };
#endif
}

size_t gg_crc32c_impls(const struct gg_crc32c_impl **out)
{
	pthread_once(&impls_once, impls_init);
	*out = impls;
	return n_impls;
}

/* The last implementation is the fastest the CPU runs. */
uint32_t gg_crc32c(uint32_t crc, const void *data, size_t len)
{
	pthread_once(&impls_once, impls_init);
	return impls[n_impls - 1].fn(crc, data, len);
}
