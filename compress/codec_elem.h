/* The per-element arithmetic of codec.h and feedback.h, written once for
 * every implementation: the scalar reference (codec_ref.c), the scalar
 * tails of the vector paths and the CUDA kernels (cuda/codec_cuda.cu)
 * compile these same functions, so the CPU tests check the code the GPU
 * runs. Plain C17 that nvcc also compiles as device code (GG_HD).
 *
 * Every float operation goes through gg_fadd/gg_fsub/gg_fmul/gg_fdiv:
 * one IEEE binary32 operation, rounded to nearest even, subnormals kept.
 * On the device these are the _rn intrinsics, which are never contracted
 * into a multiply-add; on the host, compress/ is built with
 * -ffp-contract=off and without fast-math. */
#ifndef GG_CODEC_ELEM_H
#define GG_CODEC_ELEM_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#if defined(__FAST_MATH__) || (defined(__FINITE_MATH_ONLY__) && __FINITE_MATH_ONLY__)
#error "the codecs must not be built with -ffast-math or -ffinite-math-only: their bytes would change"
#endif

#ifdef __CUDACC__
#define GG_HD __host__ __device__
#else
#define GG_HD
#endif

#define GG_INT8_QMAX 127
#define GG_INT4_QMAX 7
#define GG_NAN_BITS 0x7fc00000u

static inline GG_HD uint32_t gg_f32_bits(float x)
{
#ifdef __CUDA_ARCH__
	return __float_as_uint(x);
#else
	uint32_t u;
	memcpy(&u, &x, sizeof(u));
	return u;
#endif
}

static inline GG_HD float gg_f32_from_bits(uint32_t u)
{
#ifdef __CUDA_ARCH__
	return __uint_as_float(u);
#else
	float x;
	memcpy(&x, &u, sizeof(x));
	return x;
#endif
}

static inline GG_HD bool gg_f32_is_finite(float x)
{
	return (gg_f32_bits(x) & 0x7f800000u) != 0x7f800000u;
}

static inline GG_HD bool gg_f32_is_nan(float x)
{
	return (gg_f32_bits(x) & 0x7fffffffu) > 0x7f800000u;
}

static inline GG_HD float gg_fadd(float a, float b)
{
#ifdef __CUDA_ARCH__
	return __fadd_rn(a, b);
#else
	return a + b;
#endif
}

static inline GG_HD float gg_fsub(float a, float b)
{
#ifdef __CUDA_ARCH__
	return __fsub_rn(a, b);
#else
	return a - b;
#endif
}

static inline GG_HD float gg_fmul(float a, float b)
{
#ifdef __CUDA_ARCH__
	return __fmul_rn(a, b);
#else
	return a * b;
#endif
}

static inline GG_HD float gg_fdiv(float a, float b)
{
#ifdef __CUDA_ARCH__
	return __fdiv_rn(a, b);
#else
	return a / b;
#endif
}

/* Error feedback: what is encoded, c = x + r. Residuals are always finite,
 * so c is NaN only when x is, and then it is x quieted with its sign and
 * payload: what x86 returns for that sum. Spelled out because a GPU
 * returns one canonical NaN instead, and c's bits are what fp32 and bf16
 * encode. */
static inline GG_HD float gg_feedback_compensate_elem(float x, float r)
{
	if (gg_f32_is_nan(x))
		return gg_f32_from_bits(gg_f32_bits(x) | 0x00400000u);
	return gg_fadd(x, r);
}

/* Error feedback: the new residual from what was encoded (c) and what it
 * decodes to (d); 0 when that is not finite. */
static inline GG_HD float gg_feedback_residual_elem(float c, float d)
{
	float e = gg_fsub(c, d);
	return gg_f32_is_finite(e) ? e : 0.0f;
}

/* bf16 by round to nearest even on the bit pattern; NaN stays quiet NaN. */
static inline GG_HD uint16_t gg_bf16_from_f32(float x)
{
	uint32_t u = gg_f32_bits(x);

	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x0040u);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline GG_HD float gg_bf16_to_f32(uint16_t b)
{
	return gg_f32_from_bits((uint32_t)b << 16);
}

/* Binary16 rounded toward +inf, for x >= 0 (finite or not). */
static inline GG_HD uint16_t gg_f16_round_up(float x)
{
	uint32_t u = gg_f32_bits(x);

	if (u == 0)
		return 0;
	if (u > 0x477fe000u) /* above 65504 */
		return 0x7c00;
	if (u >= 0x38800000u) { /* 2^-14 and up: normal binary16 */
		uint32_t h = (((u >> 23) - 112u) << 10) | ((u >> 13) & 0x3ffu);
		return (uint16_t)(h + ((u & 0x1fffu) != 0));
	}
	float y = gg_fmul(x, 16777216.0f); /* exact: units of 2^-24, below 1024 */
	uint32_t k = (uint32_t)y;
	return (uint16_t)(k + ((float)k < y));
}

static inline GG_HD float gg_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;

	if (e == 0) /* exact: m units of 2^-24 */
		return gg_f32_from_bits(sign | gg_f32_bits(gg_fmul((float)m, 5.9604644775390625e-8f)));
	if (e == 31)
		return gg_f32_from_bits(sign | 0x7f800000u | (m << 13));
	return gg_f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

/* The bits of |x| when x is finite, else 0. A block's absmax is the
 * largest of these: finite non-negative floats order as their bits, so an
 * integer max gives the float max in any order. */
static inline GG_HD uint32_t gg_abs_bits_finite(float x)
{
	uint32_t a = gg_f32_bits(x) & 0x7fffffffu;

	return a < 0x7f800000u ? a : 0;
}

/* The block scale from the finite absmax m: returns the s codes are
 * computed against and sets *stored to the bits kept in the stream (a
 * binary16 in the low half for fp16 scales). */
static inline GG_HD float gg_block_scale(float m, int qmax, bool f16, uint32_t *stored)
{
	float s = gg_fdiv(m, (float)qmax);

	if (f16) {
		uint16_t h = gg_f16_round_up(s);
		*stored = h;
		return gg_f16_to_f32(h);
	}
	*stored = gg_f32_bits(s);
	return s;
}

/* The s a stored scale decodes to. */
static inline GG_HD float gg_block_scale_from_bits(uint32_t stored, bool f16)
{
	return f16 ? gg_f16_to_f32((uint16_t)stored) : gg_f32_from_bits(stored);
}

static inline GG_HD int gg_quantize(float x, float s, int qmax)
{
	if (!gg_f32_is_finite(x))
		return -qmax - 1;
	if (s == 0.0f)
		return 0;
	float r = rintf(gg_fdiv(x, s));
	if (r > (float)qmax)
		r = (float)qmax;
	if (r < (float)-qmax)
		r = (float)-qmax;
	return (int)r;
}

static inline GG_HD float gg_dequantize(int c, float s, int qmax)
{
	if (c == -qmax - 1)
		return gg_f32_from_bits(GG_NAN_BITS);
	return gg_fmul((float)c, s);
}

/* int4: codes c0 (element 2j) and c1 (element 2j + 1, 0 past the end) in
 * byte j; and back, nibble `hi` of a byte as a signed code. */
static inline GG_HD uint8_t gg_int4_pack(int c0, int c1)
{
	return (uint8_t)(((unsigned)c0 & 0xfu) | ((unsigned)c1 & 0xfu) << 4);
}

static inline GG_HD int gg_int4_unpack(uint8_t byte, unsigned hi)
{
	return (int)((((unsigned)byte >> (4 * hi)) & 0xfu) ^ 8u) - 8;
}

#endif
