/* Kernel tables and the block helpers of codec.h, shared by the scalar
 * reference and the vectorized files so that scales and tails are computed
 * by one piece of code; the per-element rules are in codec_elem.h, which
 * the CUDA kernels compile too. */
#ifndef GG_CODEC_INTERNAL_H
#define GG_CODEC_INTERNAL_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "codec.h"
#include "codec_elem.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "compress/ stores host floats as little-endian bytes; add byte swapping for this target"
#endif

/* n elements, params already checked, into the payload's two parts (as
 * gg_decode_fn takes them; gg_encode_whole() finds them in a chunk's). */
typedef void (*gg_encode_fn)(const float *src, size_t n, uint32_t block_elems,
			     enum gg_scale_kind scale, uint8_t *dst, uint8_t *rest);
/* Decoders take the payload as two parts, so that a decoder may take any
 * run of whole blocks of a chunk (gg_codec_decode_span()): `src` the first
 * (fp32, bf16: the values; bf16-split: the low plane; int8, int4: the
 * blocks' scales) and `rest` the second (bf16-split: the high plane; int8,
 * int4: the codes; else unused). gg_decode_whole() finds them in a chunk's
 * payload. */
typedef void (*gg_decode_fn)(const uint8_t *src, const uint8_t *rest, size_t n, uint32_t block_elems,
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
void gg_fp32_encode_copy(const float *src, size_t n, uint32_t block_elems, enum gg_scale_kind scale, uint8_t *dst,
			 uint8_t *rest);
void gg_fp32_decode_copy(const uint8_t *src, const uint8_t *rest, size_t n, uint32_t block_elems,
			 enum gg_scale_kind scale, float *out);

/* bf16-input encoders (scalar only). */
void gg_codec_encode_bf16_ref(enum gg_codec codec, const uint16_t *src, size_t n,
			      uint32_t block_elems, enum gg_scale_kind scale, uint8_t *dst);

static inline void gg_add_ref(const float *a, const float *b, size_t n, float *out)
{
	for (size_t i = 0; i < n; i++)
		out[i] = gg_fadd(a[i], b[i]);
}

/* r[i] = c[i] - r[i] where finite, else 0: r holds what c decoded to. */
static inline void gg_residual_ref(const float *c, float *r, size_t n)
{
	for (size_t i = 0; i < n; i++)
		r[i] = gg_feedback_residual_elem(c[i], r[i]);
}

static inline size_t gg_scale_bytes(enum gg_scale_kind scale)
{
	return scale == GG_SCALE_F16 ? 2 : 4;
}

static inline size_t gg_block_count(size_t n, uint32_t block_elems)
{
	return n / block_elems + (n % block_elems != 0);
}

/* Where the two parts of a codec's payload (gg_decode_fn) for elements
 * [first, first + m) of a chunk of n elements begin, as offsets into the
 * chunk's payload (first a multiple of block_elems for int8 and int4; the
 * second part is at 0 where the codec has none). */
static inline void gg_payload_parts(enum gg_codec codec, size_t n, size_t first, uint32_t block_elems,
				    enum gg_scale_kind scale, size_t *src, size_t *rest)
{
	size_t sb = gg_scale_bytes(scale);

	*rest = 0;
	switch (codec) {
	case GG_CODEC_BF16:
		*src = 2 * first;
		break;
	case GG_CODEC_BF16_SPLIT:
		*src = first;
		*rest = n + first;
		break;
	case GG_CODEC_INT8:
	case GG_CODEC_INT4:
		*src = first / block_elems * sb;
		*rest = gg_block_count(n, block_elems) * sb + (codec == GG_CODEC_INT8 ? first : first / 2);
		break;
	default:
		*src = 4 * first;
		break;
	}
}

/* A decoder `fn` of `codec` run on a whole chunk's payload. */
static inline void gg_decode_whole(gg_decode_fn fn, enum gg_codec codec, const uint8_t *payload, size_t n,
				   uint32_t block_elems, enum gg_scale_kind scale, float *out)
{
	size_t a, b;

	gg_payload_parts(codec, n, 0, block_elems, scale, &a, &b);
	fn(payload + a, payload + b, n, block_elems, scale, out);
}

/* An encoder `fn` of `codec` run on a whole chunk, into its payload. */
static inline void gg_encode_whole(gg_encode_fn fn, enum gg_codec codec, const float *src, size_t n,
				   uint32_t block_elems, enum gg_scale_kind scale, uint8_t *payload)
{
	size_t a, b;

	gg_payload_parts(codec, n, 0, block_elems, scale, &a, &b);
	fn(src, n, block_elems, scale, payload + a, payload + b);
}

/* Computes the block scale from the finite absmax m, stores it at `out`
 * (little-endian) and returns the s that codes are computed against. */
static inline float gg_block_scale_ref(float m, int qmax, enum gg_scale_kind scale, uint8_t *out)
{
	uint32_t stored;
	float s = gg_block_scale(m, qmax, scale == GG_SCALE_F16, &stored);

	if (scale == GG_SCALE_F16) {
		uint16_t h = (uint16_t)stored;
		memcpy(out, &h, sizeof(h));
	} else {
		memcpy(out, &stored, sizeof(stored));
	}
	return s;
}

static inline float gg_block_scale_load(const uint8_t *p, enum gg_scale_kind scale)
{
	if (scale == GG_SCALE_F16) {
		uint16_t h;
		memcpy(&h, p, sizeof(h));
		return gg_block_scale_from_bits(h, true);
	}
	uint32_t u;
	memcpy(&u, p, sizeof(u));
	return gg_block_scale_from_bits(u, false);
}

/* The codes of elements [from, len) of one block: x and codes point at the
 * block's first element and first code byte (int4: from must be even). */
static inline void gg_int8_codes_ref(const float *x, size_t from, size_t len, float s, uint8_t *codes)
{
	for (size_t i = from; i < len; i++)
		codes[i] = (uint8_t)(int8_t)gg_quantize(x[i], s, GG_INT8_QMAX);
}

static inline void gg_int4_codes_ref(const float *x, size_t from, size_t len, float s, uint8_t *codes)
{
	for (size_t i = from; i < len; i += 2) {
		int c1 = i + 1 < len ? gg_quantize(x[i + 1], s, GG_INT4_QMAX) : 0;
		codes[i / 2] = gg_int4_pack(gg_quantize(x[i], s, GG_INT4_QMAX), c1);
	}
}

static inline float gg_absmax_finite_ref(const float *x, size_t n)
{
	uint32_t m = 0;

	for (size_t i = 0; i < n; i++) {
		uint32_t a = gg_abs_bits_finite(x[i]);
		if (a > m)
			m = a;
	}
	return gg_f32_from_bits(m);
}

#endif
