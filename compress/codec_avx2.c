/* AVX2 kernels. Built with -mavx2 only (no FMA), so every lane computes
 * exactly what codec_ref.c computes; tails run the shared scalar rules. */
#include <immintrin.h>

#include "codec_internal.h"

static inline float tail_absmax(const float *x, size_t n, float m)
{
	float t = gg_absmax_finite_ref(x, n);
	return t > m ? t : m;
}

static void fp32_decode_acc_avx2(const uint8_t *src, const uint8_t *rest, size_t n, uint32_t block_elems,
				 enum gg_scale_kind scale, float *acc)
{
	const float *s = (const float *)(const void *)src;
	size_t i = 0;

	for (; i + 32 <= n; i += 32) {
		for (size_t j = 0; j < 32; j += 8) {
			__m256 a = _mm256_loadu_ps(acc + i + j);
			_mm256_storeu_ps(acc + i + j, _mm256_add_ps(a, _mm256_loadu_ps(s + i + j)));
		}
	}
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_loadu_ps(s + i)));
	for (; i < n; i++) {
		float v;
		memcpy(&v, src + 4 * i, sizeof(v));
		acc[i] = gg_fadd(acc[i], v);
	}
}

/* gg_bf16_from_f32 on 8 lanes; the results sit in the low 16 bits. */
static inline __m256i bf16_round8(__m256 x)
{
	__m256i u = _mm256_castps_si256(x);
	__m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
					    _mm256_set1_epi32(0x7f800000));
	__m256i hi = _mm256_srli_epi32(u, 16);
	__m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
	__m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
	__m256i q = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
	return _mm256_blendv_epi8(r, q, is_nan);
}

/* 16 floats -> 16 bf16 in order. */
static inline __m256i bf16_round16(const float *src)
{
	__m256i a = bf16_round8(_mm256_loadu_ps(src));
	__m256i b = bf16_round8(_mm256_loadu_ps(src + 8));
	return _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
}

static inline __m256 bf16_widen8(__m128i h)
{
	return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline void store8(float *out, __m256 v, bool acc)
{
	if (acc)
		v = _mm256_add_ps(_mm256_loadu_ps(out), v);
	_mm256_storeu_ps(out, v);
}

static void bf16_encode_avx2(const float *src, size_t n, uint32_t block_elems,
			     enum gg_scale_kind scale, uint8_t *dst, uint8_t *rest)
{
	size_t i = 0;

	for (; i + 16 <= n; i += 16)
		_mm256_storeu_si256((__m256i *)(void *)(dst + 2 * i), bf16_round16(src + i));
	for (; i < n; i++) {
		uint16_t b = gg_bf16_from_f32(src[i]);
		memcpy(dst + 2 * i, &b, sizeof(b));
	}
}

static inline void bf16_decode_any_avx2(const uint8_t *src, size_t n, float *out, bool acc)
{
	size_t i = 0;

	for (; i + 16 <= n; i += 16) {
		__m256i h = _mm256_loadu_si256((const __m256i *)(const void *)(src + 2 * i));
		store8(out + i, bf16_widen8(_mm256_castsi256_si128(h)), acc);
		store8(out + i + 8, bf16_widen8(_mm256_extracti128_si256(h, 1)), acc);
	}
	for (; i < n; i++) {
		uint16_t b;
		memcpy(&b, src + 2 * i, sizeof(b));
		float v = gg_bf16_to_f32(b);
		out[i] = acc ? gg_fadd(out[i], v) : v;
	}
}

static void bf16_decode_avx2(const uint8_t *src, const uint8_t *rest, size_t n, uint32_t block_elems,
			     enum gg_scale_kind scale, float *out)
{
	bf16_decode_any_avx2(src, n, out, false);
}

static void bf16_decode_acc_avx2(const uint8_t *src, const uint8_t *rest, size_t n, uint32_t block_elems,
				 enum gg_scale_kind scale, float *acc)
{
	bf16_decode_any_avx2(src, n, acc, true);
}

static void bf16_split_encode_avx2(const float *src, size_t n, uint32_t block_elems,
				   enum gg_scale_kind scale, uint8_t *dst, uint8_t *rest)
{
	const __m256i planes = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
						0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
	size_t i = 0;

	for (; i + 16 <= n; i += 16) {
		__m256i v = _mm256_shuffle_epi8(bf16_round16(src + i), planes);
		v = _mm256_permute4x64_epi64(v, 0xd8);
		_mm_storeu_si128((__m128i *)(void *)(dst + i), _mm256_castsi256_si128(v));
		_mm_storeu_si128((__m128i *)(void *)(rest + i), _mm256_extracti128_si256(v, 1));
	}
	for (; i < n; i++) {
		uint16_t b = gg_bf16_from_f32(src[i]);
		dst[i] = (uint8_t)b;
		rest[i] = (uint8_t)(b >> 8);
	}
}

static inline void bf16_split_decode_any_avx2(const uint8_t *src, const uint8_t *rest, size_t n, float *out, bool acc)
{
	size_t i = 0;

	for (; i + 16 <= n; i += 16) {
		__m128i lo = _mm_loadu_si128((const __m128i *)(const void *)(src + i));
		__m128i hi = _mm_loadu_si128((const __m128i *)(const void *)(rest + i));
		store8(out + i, bf16_widen8(_mm_unpacklo_epi8(lo, hi)), acc);
		store8(out + i + 8, bf16_widen8(_mm_unpackhi_epi8(lo, hi)), acc);
	}
	for (; i < n; i++) {
		float v = gg_bf16_to_f32((uint16_t)(src[i] | rest[i] << 8));
		out[i] = acc ? gg_fadd(out[i], v) : v;
	}
}

static void bf16_split_decode_avx2(const uint8_t *src, const uint8_t *rest, size_t n, uint32_t block_elems,
				   enum gg_scale_kind scale, float *out)
{
	bf16_split_decode_any_avx2(src, rest, n, out, false);
}

static void bf16_split_decode_acc_avx2(const uint8_t *src, const uint8_t *rest, size_t n, uint32_t block_elems,
				       enum gg_scale_kind scale, float *acc)
{
	bf16_split_decode_any_avx2(src, rest, n, acc, true);
}

/* Largest finite |x|: on non-negative floats the integer order of the bits
 * is the numeric order, so an unsigned max gives the same value. */
static float absmax_finite_avx2(const float *x, size_t n)
{
	const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
	__m256i m0 = _mm256_setzero_si256(), m1 = _mm256_setzero_si256();
	size_t i = 0;

	for (; i + 16 <= n; i += 16) {
		__m256i a = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(const void *)(x + i)), abs_mask);
		__m256i b = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(const void *)(x + i + 8)), abs_mask);
		m0 = _mm256_max_epu32(m0, _mm256_and_si256(a, _mm256_cmpgt_epi32(inf, a)));
		m1 = _mm256_max_epu32(m1, _mm256_and_si256(b, _mm256_cmpgt_epi32(inf, b)));
	}
	m0 = _mm256_max_epu32(m0, m1);
	__m128i m = _mm_max_epu32(_mm256_castsi256_si128(m0), _mm256_extracti128_si256(m0, 1));
	m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4e));
	m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xb1));
	return tail_absmax(x + i, n - i, gg_f32_from_bits((uint32_t)_mm_cvtsi128_si32(m)));
}

/* gg_quantize on 8 lanes for a block whose scale is not zero. */
static inline __m256i quantize8(const float *x, __m256 s, int qmax)
{
	const __m256i inf = _mm256_set1_epi32(0x7f800000);
	__m256 v = _mm256_loadu_ps(x);
	__m256i nonfinite = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(v), inf), inf);
	__m256i q = _mm256_cvtps_epi32(_mm256_div_ps(v, s));
	q = _mm256_min_epi32(_mm256_max_epi32(q, _mm256_set1_epi32(-qmax)), _mm256_set1_epi32(qmax));
	return _mm256_blendv_epi8(q, _mm256_set1_epi32(-qmax - 1), nonfinite);
}

/* For a zero scale: 0, or the marker for non-finite inputs. */
static inline __m256i quantize8_zero(const float *x, int qmax)
{
	const __m256i inf = _mm256_set1_epi32(0x7f800000);
	__m256i u = _mm256_loadu_si256((const __m256i *)(const void *)x);
	__m256i nonfinite = _mm256_cmpeq_epi32(_mm256_and_si256(u, inf), inf);
	return _mm256_and_si256(nonfinite, _mm256_set1_epi32(-qmax - 1));
}

/* 32 codes as int8 in element order. */
static inline __m256i quantize32(const float *x, float s, int qmax)
{
	__m256i a, b, c, d;

	if (s == 0.0f) {
		a = quantize8_zero(x, qmax);
		b = quantize8_zero(x + 8, qmax);
		c = quantize8_zero(x + 16, qmax);
		d = quantize8_zero(x + 24, qmax);
	} else {
		__m256 vs = _mm256_set1_ps(s);
		a = quantize8(x, vs, qmax);
		b = quantize8(x + 8, vs, qmax);
		c = quantize8(x + 16, vs, qmax);
		d = quantize8(x + 24, vs, qmax);
	}
	__m256i abcd = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
	return _mm256_permutevar8x32_epi32(abcd, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static void int8_encode_avx2(const float *src, size_t n, uint32_t block_elems,
			     enum gg_scale_kind scale, uint8_t *dst, uint8_t *rest)
{
	size_t nb = gg_block_count(n, block_elems), sb = gg_scale_bytes(scale);
	uint8_t *codes = rest;

	for (size_t k = 0; k < nb; k++) {
		size_t off = k * block_elems, len = GG_MIN((size_t)block_elems, n - off), i = 0;
		const float *x = src + off;
		float s = gg_block_scale_ref(absmax_finite_avx2(x, len), GG_INT8_QMAX, scale, dst + k * sb);
		for (; i + 32 <= len; i += 32)
			_mm256_storeu_si256((__m256i *)(void *)(codes + off + i), quantize32(x + i, s, GG_INT8_QMAX));
		gg_int8_codes_ref(x, i, len, s, codes + off);
	}
}

static void int4_encode_avx2(const float *src, size_t n, uint32_t block_elems,
			     enum gg_scale_kind scale, uint8_t *dst, uint8_t *rest)
{
	size_t nb = gg_block_count(n, block_elems), sb = gg_scale_bytes(scale);
	uint8_t *codes = rest;

	for (size_t k = 0; k < nb; k++) {
		size_t off = k * block_elems, len = GG_MIN((size_t)block_elems, n - off), i = 0;
		const float *x = src + off;
		float s = gg_block_scale_ref(absmax_finite_avx2(x, len), GG_INT4_QMAX, scale, dst + k * sb);
		for (; i + 32 <= len; i += 32) {
			__m256i v = quantize32(x + i, s, GG_INT4_QMAX);
			__m256i p = _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi16(0x000f)),
						    _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi16(0x00f0)));
			p = _mm256_permute4x64_epi64(_mm256_packus_epi16(p, p), 0x08);
			_mm_storeu_si128((__m128i *)(void *)(codes + (off + i) / 2), _mm256_castsi256_si128(p));
		}
		/* off + i is even here, so the scalar tail starts on a byte. */
		gg_int4_codes_ref(x, i, len, s, codes + off / 2);
	}
}

/* 8 int8 codes (low half of c8) -> 8 floats. */
static inline __m256 dequantize8(__m128i c8, __m256 s, __m256i marker)
{
	__m256i c = _mm256_cvtepi8_epi32(c8);
	__m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(c), s);
	__m256 nan = _mm256_castsi256_ps(_mm256_set1_epi32((int)GG_NAN_BITS));
	return _mm256_blendv_ps(v, nan, _mm256_castsi256_ps(_mm256_cmpeq_epi32(c, marker)));
}

/* 32 int8 codes -> out[0..32). */
static inline void dequantize32(__m128i lo16, __m128i hi16, __m256 vs, __m256i marker, float *out, bool acc)
{
	store8(out, dequantize8(lo16, vs, marker), acc);
	store8(out + 8, dequantize8(_mm_srli_si128(lo16, 8), vs, marker), acc);
	store8(out + 16, dequantize8(hi16, vs, marker), acc);
	store8(out + 24, dequantize8(_mm_srli_si128(hi16, 8), vs, marker), acc);
}

static inline void int8_decode_any_avx2(const uint8_t *src, const uint8_t *rest, size_t n, uint32_t block_elems,
					enum gg_scale_kind scale, float *out, bool acc)
{
	size_t nb = gg_block_count(n, block_elems), sb = gg_scale_bytes(scale);
	const uint8_t *codes = rest;
	const __m256i marker = _mm256_set1_epi32(-GG_INT8_QMAX - 1);

	for (size_t k = 0; k < nb; k++) {
		size_t off = k * block_elems, len = GG_MIN((size_t)block_elems, n - off), i = 0;
		float s = gg_block_scale_load(src + k * sb, scale);
		__m256 vs = _mm256_set1_ps(s);
		for (; i + 32 <= len; i += 32) {
			const uint8_t *c = codes + off + i;
			dequantize32(_mm_loadu_si128((const __m128i *)(const void *)c),
				     _mm_loadu_si128((const __m128i *)(const void *)(c + 16)), vs, marker,
				     out + off + i, acc);
		}
		for (; i < len; i++) {
			float v = gg_dequantize((int8_t)codes[off + i], s, GG_INT8_QMAX);
			out[off + i] = acc ? out[off + i] + v : v;
		}
	}
}

static void int8_decode_avx2(const uint8_t *src, const uint8_t *rest, size_t n, uint32_t block_elems,
			     enum gg_scale_kind scale, float *out)
{
	int8_decode_any_avx2(src, rest, n, block_elems, scale, out, false);
}

static void int8_decode_acc_avx2(const uint8_t *src, const uint8_t *rest, size_t n, uint32_t block_elems,
				 enum gg_scale_kind scale, float *acc)
{
	int8_decode_any_avx2(src, rest, n, block_elems, scale, acc, true);
}

static inline void int4_decode_any_avx2(const uint8_t *src, const uint8_t *rest, size_t n, uint32_t block_elems,
					enum gg_scale_kind scale, float *out, bool acc)
{
	size_t nb = gg_block_count(n, block_elems), sb = gg_scale_bytes(scale);
	const uint8_t *codes = rest;
	const __m256i marker = _mm256_set1_epi32(-GG_INT4_QMAX - 1);
	const __m128i low4 = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);

	for (size_t k = 0; k < nb; k++) {
		size_t off = k * block_elems, len = GG_MIN((size_t)block_elems, n - off), i = 0;
		float s = gg_block_scale_load(src + k * sb, scale);
		__m256 vs = _mm256_set1_ps(s);
		for (; i + 32 <= len; i += 32) {
			__m128i b = _mm_loadu_si128((const __m128i *)(const void *)(codes + (off + i) / 2));
			__m128i lo = _mm_and_si128(b, low4);
			__m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), low4);
			__m128i e0 = _mm_sub_epi8(_mm_xor_si128(_mm_unpacklo_epi8(lo, hi), eight), eight);
			__m128i e1 = _mm_sub_epi8(_mm_xor_si128(_mm_unpackhi_epi8(lo, hi), eight), eight);
			dequantize32(e0, e1, vs, marker, out + off + i, acc);
		}
		for (; i < len; i++) {
			size_t e = off + i;
			int c = gg_int4_unpack(codes[e / 2], e & 1);
			float v = gg_dequantize(c, s, GG_INT4_QMAX);
			out[e] = acc ? out[e] + v : v;
		}
	}
}

static void int4_decode_avx2(const uint8_t *src, const uint8_t *rest, size_t n, uint32_t block_elems,
			     enum gg_scale_kind scale, float *out)
{
	int4_decode_any_avx2(src, rest, n, block_elems, scale, out, false);
}

static void int4_decode_acc_avx2(const uint8_t *src, const uint8_t *rest, size_t n, uint32_t block_elems,
				 enum gg_scale_kind scale, float *acc)
{
	int4_decode_any_avx2(src, rest, n, block_elems, scale, acc, true);
}

/* ---- error feedback ------------------------------------------------------ */

static void add_avx2(const float *a, const float *b, size_t n, float *out)
{
	size_t i = 0;

	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
	gg_add_ref(a + i, b + i, n - i, out + i);
}

/* Not finite: all exponent bits set. */
static void residual_avx2(const float *c, float *r, size_t n)
{
	const __m256i exp = _mm256_set1_epi32(0x7f800000);
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		__m256 e = _mm256_sub_ps(_mm256_loadu_ps(c + i), _mm256_loadu_ps(r + i));
		__m256i bad = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(e), exp), exp);
		_mm256_storeu_ps(r + i, _mm256_andnot_ps(_mm256_castsi256_ps(bad), e));
	}
	gg_residual_ref(c + i, r + i, n - i);
}

const struct gg_codec_kernels gg_codec_kernels_avx2 = {
	.isa = GG_ISA_AVX2,
	.encode = {
		[GG_CODEC_FP32] = gg_fp32_encode_copy,
		[GG_CODEC_BF16] = bf16_encode_avx2,
		[GG_CODEC_BF16_SPLIT] = bf16_split_encode_avx2,
		[GG_CODEC_INT8] = int8_encode_avx2,
		[GG_CODEC_INT4] = int4_encode_avx2,
	},
	.decode = {
		[GG_CODEC_FP32] = gg_fp32_decode_copy,
		[GG_CODEC_BF16] = bf16_decode_avx2,
		[GG_CODEC_BF16_SPLIT] = bf16_split_decode_avx2,
		[GG_CODEC_INT8] = int8_decode_avx2,
		[GG_CODEC_INT4] = int4_decode_avx2,
	},
	.decode_acc = {
		[GG_CODEC_FP32] = fp32_decode_acc_avx2,
		[GG_CODEC_BF16] = bf16_decode_acc_avx2,
		[GG_CODEC_BF16_SPLIT] = bf16_split_decode_acc_avx2,
		[GG_CODEC_INT8] = int8_decode_acc_avx2,
		[GG_CODEC_INT4] = int4_decode_acc_avx2,
	},
	.add = add_avx2,
	.residual = residual_avx2,
};
