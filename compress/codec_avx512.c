/* AVX-512 (F, BW, VL, DQ) kernels: the AVX2 algorithms on 16 lanes, with
 * the narrowing moves (vpmov*) in place of pack and permute. No FMA is used;
 * tails run the shared scalar rules. */
#include <immintrin.h>

#include "codec_internal.h"

static inline void store16(float *out, __m512 v, bool acc)
{
	if (acc)
		v = _mm512_add_ps(_mm512_loadu_ps(out), v);
	_mm512_storeu_ps(out, v);
}

static void fp32_decode_acc_avx512(const uint8_t *src, const uint8_t *rest, size_t n, uint32_t block_elems,
				   enum gg_scale_kind scale, float *acc)
{
	const float *s = (const float *)(const void *)src;
	size_t i = 0;

	for (; i + 64 <= n; i += 64)
		for (size_t j = 0; j < 64; j += 16)
			store16(acc + i + j, _mm512_loadu_ps(s + i + j), true);
	for (; i + 16 <= n; i += 16)
		store16(acc + i, _mm512_loadu_ps(s + i), true);
	for (; i < n; i++) {
		float v;
		memcpy(&v, src + 4 * i, sizeof(v));
		acc[i] = gg_fadd(acc[i], v);
	}
}

/* gg_bf16_from_f32 on 16 lanes; results in the low 16 bits. */
static inline __m512i bf16_round16(const float *src)
{
	__m512i u = _mm512_loadu_si512(src);
	__mmask16 is_nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
						   _mm512_set1_epi32(0x7f800000));
	__m512i hi = _mm512_srli_epi32(u, 16);
	__m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
	__m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
	return _mm512_mask_or_epi32(r, is_nan, hi, _mm512_set1_epi32(0x40));
}

static inline __m512 bf16_widen16(__m512i u32)
{
	return _mm512_castsi512_ps(_mm512_slli_epi32(u32, 16));
}

static void bf16_encode_avx512(const float *src, size_t n, uint32_t block_elems,
			       enum gg_scale_kind scale, uint8_t *dst, uint8_t *rest)
{
	size_t i = 0;

	for (; i + 16 <= n; i += 16)
		_mm256_storeu_si256((__m256i *)(void *)(dst + 2 * i), _mm512_cvtepi32_epi16(bf16_round16(src + i)));
	for (; i < n; i++) {
		uint16_t b = gg_bf16_from_f32(src[i]);
		memcpy(dst + 2 * i, &b, sizeof(b));
	}
}

static inline void bf16_decode_any_avx512(const uint8_t *src, size_t n, float *out, bool acc)
{
	size_t i = 0;

	for (; i + 16 <= n; i += 16) {
		__m256i h = _mm256_loadu_si256((const __m256i *)(const void *)(src + 2 * i));
		store16(out + i, bf16_widen16(_mm512_cvtepu16_epi32(h)), acc);
	}
	for (; i < n; i++) {
		uint16_t b;
		memcpy(&b, src + 2 * i, sizeof(b));
		float v = gg_bf16_to_f32(b);
		out[i] = acc ? gg_fadd(out[i], v) : v;
	}
}

static void bf16_decode_avx512(const uint8_t *src, const uint8_t *rest, size_t n, uint32_t block_elems,
			       enum gg_scale_kind scale, float *out)
{
	bf16_decode_any_avx512(src, n, out, false);
}

static void bf16_decode_acc_avx512(const uint8_t *src, const uint8_t *rest, size_t n, uint32_t block_elems,
				   enum gg_scale_kind scale, float *acc)
{
	bf16_decode_any_avx512(src, n, acc, true);
}

static void bf16_split_encode_avx512(const float *src, size_t n, uint32_t block_elems,
				     enum gg_scale_kind scale, uint8_t *dst, uint8_t *rest)
{
	size_t i = 0;

	for (; i + 16 <= n; i += 16) {
		__m512i r = bf16_round16(src + i);
		_mm_storeu_si128((__m128i *)(void *)(dst + i), _mm512_cvtepi32_epi8(r));
		_mm_storeu_si128((__m128i *)(void *)(rest + i), _mm512_cvtepi32_epi8(_mm512_srli_epi32(r, 8)));
	}
	for (; i < n; i++) {
		uint16_t b = gg_bf16_from_f32(src[i]);
		dst[i] = (uint8_t)b;
		rest[i] = (uint8_t)(b >> 8);
	}
}

static inline void bf16_split_decode_any_avx512(const uint8_t *src, const uint8_t *rest, size_t n, float *out, bool acc)
{
	size_t i = 0;

	for (; i + 16 <= n; i += 16) {
		__m512i lo = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(src + i)));
		__m512i hi = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(rest + i)));
		store16(out + i, bf16_widen16(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 8))), acc);
	}
	for (; i < n; i++) {
		float v = gg_bf16_to_f32((uint16_t)(src[i] | rest[i] << 8));
		out[i] = acc ? gg_fadd(out[i], v) : v;
	}
}

static void bf16_split_decode_avx512(const uint8_t *src, const uint8_t *rest, size_t n, uint32_t block_elems,
				     enum gg_scale_kind scale, float *out)
{
	bf16_split_decode_any_avx512(src, rest, n, out, false);
}

static void bf16_split_decode_acc_avx512(const uint8_t *src, const uint8_t *rest, size_t n, uint32_t block_elems,
					 enum gg_scale_kind scale, float *acc)
{
	bf16_split_decode_any_avx512(src, rest, n, acc, true);
}

/* See absmax_finite_avx2: an unsigned max of the |x| bit patterns. */
static float absmax_finite_avx512(const float *x, size_t n)
{
	const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
	__m512i m0 = _mm512_setzero_si512(), m1 = _mm512_setzero_si512();
	size_t i = 0;

	for (; i + 32 <= n; i += 32) {
		__m512i a = _mm512_and_si512(_mm512_loadu_si512(x + i), abs_mask);
		__m512i b = _mm512_and_si512(_mm512_loadu_si512(x + i + 16), abs_mask);
		m0 = _mm512_mask_max_epu32(m0, _mm512_cmplt_epu32_mask(a, inf), m0, a);
		m1 = _mm512_mask_max_epu32(m1, _mm512_cmplt_epu32_mask(b, inf), m1, b);
	}
	uint32_t bits = _mm512_reduce_max_epu32(_mm512_max_epu32(m0, m1));
	float m = gg_f32_from_bits(bits), t = gg_absmax_finite_ref(x + i, n - i);
	return t > m ? t : m;
}

/* gg_quantize on 16 lanes -> 16 int8 codes. */
static inline __m128i quantize16(const float *x, float s, int qmax)
{
	__m512i u = _mm512_loadu_si512(x);
	__m512i inf = _mm512_set1_epi32(0x7f800000);
	__mmask16 nonfinite = _mm512_cmpeq_epi32_mask(_mm512_and_si512(u, inf), inf);
	__m512i q = _mm512_setzero_si512();

	if (s != 0.0f) {
		__m512 r = _mm512_div_ps(_mm512_castsi512_ps(u), _mm512_set1_ps(s));
		q = _mm512_cvt_roundps_epi32(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
		q = _mm512_min_epi32(_mm512_max_epi32(q, _mm512_set1_epi32(-qmax)), _mm512_set1_epi32(qmax));
	}
	q = _mm512_mask_mov_epi32(q, nonfinite, _mm512_set1_epi32(-qmax - 1));
	return _mm512_cvtepi32_epi8(q);
}

static void int8_encode_avx512(const float *src, size_t n, uint32_t block_elems,
			       enum gg_scale_kind scale, uint8_t *dst, uint8_t *rest)
{
	size_t nb = gg_block_count(n, block_elems), sb = gg_scale_bytes(scale);
	uint8_t *codes = rest;

	for (size_t k = 0; k < nb; k++) {
		size_t off = k * block_elems, len = GG_MIN((size_t)block_elems, n - off), i = 0;
		const float *x = src + off;
		float s = gg_block_scale_ref(absmax_finite_avx512(x, len), GG_INT8_QMAX, scale, dst + k * sb);
		for (; i + 16 <= len; i += 16)
			_mm_storeu_si128((__m128i *)(void *)(codes + off + i), quantize16(x + i, s, GG_INT8_QMAX));
		gg_int8_codes_ref(x, i, len, s, codes + off);
	}
}

static void int4_encode_avx512(const float *src, size_t n, uint32_t block_elems,
			       enum gg_scale_kind scale, uint8_t *dst, uint8_t *rest)
{
	size_t nb = gg_block_count(n, block_elems), sb = gg_scale_bytes(scale);
	uint8_t *codes = rest;

	for (size_t k = 0; k < nb; k++) {
		size_t off = k * block_elems, len = GG_MIN((size_t)block_elems, n - off), i = 0;
		const float *x = src + off;
		float s = gg_block_scale_ref(absmax_finite_avx512(x, len), GG_INT4_QMAX, scale, dst + k * sb);
		for (; i + 32 <= len; i += 32) {
			__m256i v = _mm256_setr_m128i(quantize16(x + i, s, GG_INT4_QMAX),
						      quantize16(x + i + 16, s, GG_INT4_QMAX));
			__m256i p = _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi16(0x000f)),
						    _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi16(0x00f0)));
			_mm_storeu_si128((__m128i *)(void *)(codes + (off + i) / 2), _mm256_cvtepi16_epi8(p));
		}
		/* off + i is even here, so the scalar tail starts on a byte. */
		gg_int4_codes_ref(x, i, len, s, codes + off / 2);
	}
}

/* 16 int8 codes -> 16 floats. */
static inline __m512 dequantize16(__m128i c16, __m512 s, int marker)
{
	__m512i c = _mm512_cvtepi8_epi32(c16);
	__m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(c), s);
	__mmask16 m = _mm512_cmpeq_epi32_mask(c, _mm512_set1_epi32(marker));
	return _mm512_mask_mov_ps(v, m, _mm512_castsi512_ps(_mm512_set1_epi32((int)GG_NAN_BITS)));
}

static inline void int8_decode_any_avx512(const uint8_t *src, const uint8_t *rest, size_t n, uint32_t block_elems,
					  enum gg_scale_kind scale, float *out, bool acc)
{
	size_t nb = gg_block_count(n, block_elems), sb = gg_scale_bytes(scale);
	const uint8_t *codes = rest;

	for (size_t k = 0; k < nb; k++) {
		size_t off = k * block_elems, len = GG_MIN((size_t)block_elems, n - off), i = 0;
		float s = gg_block_scale_load(src + k * sb, scale);
		__m512 vs = _mm512_set1_ps(s);
		for (; i + 16 <= len; i += 16) {
			__m128i c = _mm_loadu_si128((const __m128i *)(const void *)(codes + off + i));
			store16(out + off + i, dequantize16(c, vs, -GG_INT8_QMAX - 1), acc);
		}
		for (; i < len; i++) {
			float v = gg_dequantize((int8_t)codes[off + i], s, GG_INT8_QMAX);
			out[off + i] = acc ? out[off + i] + v : v;
		}
	}
}

static void int8_decode_avx512(const uint8_t *src, const uint8_t *rest, size_t n, uint32_t block_elems,
			       enum gg_scale_kind scale, float *out)
{
	int8_decode_any_avx512(src, rest, n, block_elems, scale, out, false);
}

static void int8_decode_acc_avx512(const uint8_t *src, const uint8_t *rest, size_t n, uint32_t block_elems,
				   enum gg_scale_kind scale, float *acc)
{
	int8_decode_any_avx512(src, rest, n, block_elems, scale, acc, true);
}

static inline void int4_decode_any_avx512(const uint8_t *src, const uint8_t *rest, size_t n, uint32_t block_elems,
					  enum gg_scale_kind scale, float *out, bool acc)
{
	size_t nb = gg_block_count(n, block_elems), sb = gg_scale_bytes(scale);
	const uint8_t *codes = rest;
	const __m128i low4 = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);

	for (size_t k = 0; k < nb; k++) {
		size_t off = k * block_elems, len = GG_MIN((size_t)block_elems, n - off), i = 0;
		float s = gg_block_scale_load(src + k * sb, scale);
		__m512 vs = _mm512_set1_ps(s);
		for (; i + 32 <= len; i += 32) {
			__m128i b = _mm_loadu_si128((const __m128i *)(const void *)(codes + (off + i) / 2));
			__m128i lo = _mm_and_si128(b, low4);
			__m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), low4);
			__m128i e0 = _mm_sub_epi8(_mm_xor_si128(_mm_unpacklo_epi8(lo, hi), eight), eight);
			__m128i e1 = _mm_sub_epi8(_mm_xor_si128(_mm_unpackhi_epi8(lo, hi), eight), eight);
			store16(out + off + i, dequantize16(e0, vs, -GG_INT4_QMAX - 1), acc);
			store16(out + off + i + 16, dequantize16(e1, vs, -GG_INT4_QMAX - 1), acc);
		}
		for (; i < len; i++) {
			size_t e = off + i;
			int c = gg_int4_unpack(codes[e / 2], e & 1);
			float v = gg_dequantize(c, s, GG_INT4_QMAX);
			out[e] = acc ? out[e] + v : v;
		}
	}
}

static void int4_decode_avx512(const uint8_t *src, const uint8_t *rest, size_t n, uint32_t block_elems,
			       enum gg_scale_kind scale, float *out)
{
	int4_decode_any_avx512(src, rest, n, block_elems, scale, out, false);
}

static void int4_decode_acc_avx512(const uint8_t *src, const uint8_t *rest, size_t n, uint32_t block_elems,
				   enum gg_scale_kind scale, float *acc)
{
	int4_decode_any_avx512(src, rest, n, block_elems, scale, acc, true);
}

/* ---- error feedback ------------------------------------------------------ */

static void add_avx512(const float *a, const float *b, size_t n, float *out)
{
	size_t i = 0;

	for (; i + 16 <= n; i += 16)
		_mm512_storeu_ps(out + i, _mm512_add_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
	gg_add_ref(a + i, b + i, n - i, out + i);
}

static void residual_avx512(const float *c, float *r, size_t n)
{
	const __m512i exp = _mm512_set1_epi32(0x7f800000);
	size_t i = 0;

	for (; i + 16 <= n; i += 16) {
		__m512 e = _mm512_sub_ps(_mm512_loadu_ps(c + i), _mm512_loadu_ps(r + i));
		__mmask16 ok = _mm512_cmpneq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(e), exp), exp);
		_mm512_storeu_ps(r + i, _mm512_maskz_mov_ps(ok, e));
	}
	gg_residual_ref(c + i, r + i, n - i);
}

const struct gg_codec_kernels gg_codec_kernels_avx512 = {
	.isa = GG_ISA_AVX512,
	.encode = {
		[GG_CODEC_FP32] = gg_fp32_encode_copy,
		[GG_CODEC_BF16] = bf16_encode_avx512,
		[GG_CODEC_BF16_SPLIT] = bf16_split_encode_avx512,
		[GG_CODEC_INT8] = int8_encode_avx512,
		[GG_CODEC_INT4] = int4_encode_avx512,
	},
	.decode = {
		[GG_CODEC_FP32] = gg_fp32_decode_copy,
		[GG_CODEC_BF16] = bf16_decode_avx512,
		[GG_CODEC_BF16_SPLIT] = bf16_split_decode_avx512,
		[GG_CODEC_INT8] = int8_decode_avx512,
		[GG_CODEC_INT4] = int4_decode_avx512,
	},
	.decode_acc = {
		[GG_CODEC_FP32] = fp32_decode_acc_avx512,
		[GG_CODEC_BF16] = bf16_decode_acc_avx512,
		[GG_CODEC_BF16_SPLIT] = bf16_split_decode_acc_avx512,
		[GG_CODEC_INT8] = int8_decode_acc_avx512,
		[GG_CODEC_INT4] = int4_decode_acc_avx512,
	},
	.add = add_avx512,
	.residual = residual_avx512,
};
