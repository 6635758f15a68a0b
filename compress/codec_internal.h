/* Kernel tables and the per-element rules of codec.h, shared by the scalar
 * reference and the vectorized files so that scales and tails are computed
 * by one piece of code. */
#ifndef GG_CODEC_INTERNAL_H
#define GG_CODEC_INTERNAL_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "codec.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "compress/ stores host floats as little-endian bytes; add byte swapping for this target"
#endif

#define GG_INT8_QMAX 127
#define GG_INT4_QMAX 7
#define GG_NAN_BITS 0x7fc00000u

/* One chunk: n elements, params already checked, dst sized exactly. */
typedef void (*gg_encode_fn)(const float *src, size_t n, uint32_t block_elems,
			     enum gg_scale_kind scale, uint8_t *dst);
typedef void (*gg_decode_fn)(const uint8_t *src, size_t n, uint32_t block_elems,
			     enum gg_scale_kind scale, float *out);

/* Error feedback (feedback.h): out[i] = a[i] + b[i]; and r[i] = c[i] - r[i]
 * where that is finite, else 0. */
typedef void (*gg_add_fn)(const float *a, const float *b, size_t n, float *out);
typedef void (*gg_residual_fn)(const float *c, float *r, size_t n);

struct gg_codec_kernels {
	enum gg_isa isa;
	gg_encode_fn encode[GG_CODEC_LAST + 1];
	gg_decode_fn decode[GG_CODEC_LAST + 1];
	gg_decode_fn decode_acc[GG_CODEC_LAST + 1];
	gg_add_fn add;
	gg_residual_fn residual;
};

/* _avx2 and _avx512 exist when GG_HAVE_AVX2 / GG_HAVE_AVX512 are defined. */
extern const struct gg_codec_kernels gg_codec_kernels_ref;
extern const struct gg_codec_kernels gg_codec_kernels_avx2;
extern const struct gg_codec_kernels gg_codec_kernels_avx512;

/* The kernels for `isa`, or NULL when this build or CPU lacks them. */
const struct gg_codec_kernels *gg_codec_kernels_for(enum gg_isa isa);
/* The kernels gg_codec_encode() and friends use now. */
const struct gg_codec_kernels *gg_codec_kernels_active(void);

/* fp32 is a copy both ways, the same for every instruction set (codec_ref.c). */
void gg_fp32_encode_copy(const float *src, size_t n, uint32_t block_elems, enum gg_scale_kind scale, uint8_t *dst);
void gg_fp32_decode_copy(const uint8_t *src, size_t n, uint32_t block_elems, enum gg_scale_kind scale, float *out);

/* bf16-input encoders (scalar only). */
void gg_codec_encode_bf16_ref(enum gg_codec codec, const uint16_t *src, size_t n,
			      uint32_t block_elems, enum gg_scale_kind scale, uint8_t *dst);

static inline uint32_t gg_f32_bits(float x)
{
	uint32_t u;
	memcpy(&u, &x, sizeof(u));
	return u;
}

static inline float gg_f32_from_bits(uint32_t u)
{
	float x;
	memcpy(&x, &u, sizeof(x));
	return x;
}

static inline bool gg_f32_is_finite(float x)
{
	return (gg_f32_bits(x) & 0x7f800000u) != 0x7f800000u;
}

static inline void gg_add_ref(const float *a, const float *b, size_t n, float *out)
{
	for (size_t i = 0; i < n; i++)
		out[i] = a[i] + b[i];
}

static inline void gg_residual_ref(const float *c, float *r, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		float e = c[i] - r[i];
		r[i] = gg_f32_is_finite(e) ? e : 0.0f;
	}
}

static inline uint16_t gg_bf16_from_f32_ref(float x)
{
	uint32_t u = gg_f32_bits(x);

	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x0040u);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float gg_bf16_to_f32(uint16_t b)
{
	return gg_f32_from_bits((uint32_t)b << 16);
}

/* Binary16 rounded toward +inf, for x >= 0 (finite or not). */
static inline uint16_t gg_f16_round_up_ref(float x)
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
	float y = x * 16777216.0f; /* exact: units of 2^-24, below 1024 */
	uint32_t k = (uint32_t)y;
	return (uint16_t)(k + ((float)k < y));
}

static inline float gg_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;

	if (e == 0)
		return gg_f32_from_bits(sign | gg_f32_bits((float)m * 0x1p-24f));
	if (e == 31)
		return gg_f32_from_bits(sign | 0x7f800000u | (m << 13));
	return gg_f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

static inline size_t gg_scale_bytes(enum gg_scale_kind scale)
{
	return scale == GG_SCALE_F16 ? 2 : 4;
}

static inline size_t gg_block_count(size_t n, uint32_t block_elems)
{
	return n / block_elems + (n % block_elems != 0);
}

/* Computes the block scale from the finite absmax m, stores it at `out`
 * (little-endian) and returns the s that codes are computed against. */
static inline float gg_block_scale_ref(float m, int qmax, enum gg_scale_kind scale, uint8_t *out)
{
	float s = m / (float)qmax;

	if (scale == GG_SCALE_F16) {
		uint16_t h = gg_f16_round_up_ref(s);
		memcpy(out, &h, sizeof(h));
		return gg_f16_to_f32(h);
	}
	memcpy(out, &s, sizeof(s));
	return s;
}

static inline float gg_block_scale_load(const uint8_t *p, enum gg_scale_kind scale)
{
	if (scale == GG_SCALE_F16) {
		uint16_t h;
		memcpy(&h, p, sizeof(h));
		return gg_f16_to_f32(h);
	}
	float s;
	memcpy(&s, p, sizeof(s));
	return s;
}

static inline float gg_absmax_finite_ref(const float *x, size_t n)
{
	float m = 0.0f;

	for (size_t i = 0; i < n; i++) {
		float a = fabsf(x[i]);
		if (gg_f32_is_finite(a) && a > m)
			m = a;
	}
	return m;
}

static inline int gg_quantize_ref(float x, float s, int qmax)
{
	if (!gg_f32_is_finite(x))
		return -qmax - 1;
	if (s == 0.0f)
		return 0;
	float r = rintf(x / s);
	if (r > (float)qmax)
		r = (float)qmax;
	if (r < (float)-qmax)
		r = (float)-qmax;
	return (int)r;
}

static inline float gg_dequantize_ref(int c, float s, int qmax)
{
	if (c == -qmax - 1)
		return gg_f32_from_bits(GG_NAN_BITS);
	return (float)c * s;
}

static inline int gg_int4_sext(unsigned nibble)
{
	return (int)((nibble & 0xfu) ^ 8u) - 8;
}

#endif
