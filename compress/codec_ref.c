/* Scalar reference kernels: the definition in codec.h written as plainly as
 * possible. Every other implementation is checked against these. */
#include "codec_internal.h"

static inline void put(float *out, size_t i, float v, bool acc)
{
	if (acc)
		out[i] = gg_fadd(out[i], v);
	else
		out[i] = v;
}

/* fp32 is a copy both ways: every kernel table uses these two. */
void gg_fp32_encode_copy(const float *src, size_t n, uint32_t block_elems, enum gg_scale_kind scale, uint8_t *dst, uint8_t *rest)
{
	if (n)
		memcpy(dst, src, n * sizeof(float));
}

void gg_fp32_decode_copy(const uint8_t *src, const uint8_t *rest, size_t n, uint32_t block_elems, enum gg_scale_kind scale, float *out)
{
	if (n)
		memcpy(out, src, n * sizeof(float));
}

static void fp32_decode_acc_ref(const uint8_t *src, const uint8_t *rest, size_t n, uint32_t block_elems,
				enum gg_scale_kind scale, float *acc)
{
	for (size_t i = 0; i < n; i++) {
		float v;
		memcpy(&v, src + 4 * i, sizeof(v));
		acc[i] = gg_fadd(acc[i], v);
	}
}

static void bf16_encode_ref(const float *src, size_t n, uint32_t block_elems,
			    enum gg_scale_kind scale, uint8_t *dst, uint8_t *rest)
{
	for (size_t i = 0; i < n; i++) {
		uint16_t b = gg_bf16_from_f32(src[i]);
		memcpy(dst + 2 * i, &b, sizeof(b));
	}
}

static inline void bf16_decode_any_ref(const uint8_t *src, size_t n, float *out, bool acc)
{
	for (size_t i = 0; i < n; i++) {
		uint16_t b;
		memcpy(&b, src + 2 * i, sizeof(b));
		put(out, i, gg_bf16_to_f32(b), acc);
	}
}

static void bf16_decode_ref(const uint8_t *src, const uint8_t *rest, size_t n, uint32_t block_elems,
			    enum gg_scale_kind scale, float *out)
{
	bf16_decode_any_ref(src, n, out, false);
}

static void bf16_decode_acc_ref(const uint8_t *src, const uint8_t *rest, size_t n, uint32_t block_elems,
				enum gg_scale_kind scale, float *acc)
{
	bf16_decode_any_ref(src, n, acc, true);
}

static void bf16_split_encode_ref(const float *src, size_t n, uint32_t block_elems,
				  enum gg_scale_kind scale, uint8_t *dst, uint8_t *rest)
{
	for (size_t i = 0; i < n; i++) {
		uint16_t b = gg_bf16_from_f32(src[i]);
		dst[i] = (uint8_t)b;
		rest[i] = (uint8_t)(b >> 8);
	}
}

static inline void bf16_split_decode_any_ref(const uint8_t *src, const uint8_t *rest, size_t n, float *out, bool acc)
{
	for (size_t i = 0; i < n; i++)
		put(out, i, gg_bf16_to_f32((uint16_t)(src[i] | rest[i] << 8)), acc);
}

static void bf16_split_decode_ref(const uint8_t *src, const uint8_t *rest, size_t n, uint32_t block_elems,
				  enum gg_scale_kind scale, float *out)
{
	bf16_split_decode_any_ref(src, rest, n, out, false);
}

static void bf16_split_decode_acc_ref(const uint8_t *src, const uint8_t *rest, size_t n, uint32_t block_elems,
				      enum gg_scale_kind scale, float *acc)
{
	bf16_split_decode_any_ref(src, rest, n, acc, true);
}

static void int8_encode_ref(const float *src, size_t n, uint32_t block_elems,
			    enum gg_scale_kind scale, uint8_t *dst, uint8_t *rest)
{
	size_t nb = gg_block_count(n, block_elems), sb = gg_scale_bytes(scale);
	uint8_t *codes = rest;

	for (size_t k = 0; k < nb; k++) {
		size_t off = k * block_elems, len = GG_MIN((size_t)block_elems, n - off);
		float m = gg_absmax_finite_ref(src + off, len);
		float s = gg_block_scale_ref(m, GG_INT8_QMAX, scale, dst + k * sb);
		gg_int8_codes_ref(src + off, 0, len, s, codes + off);
	}
}

static void int4_encode_ref(const float *src, size_t n, uint32_t block_elems,
			    enum gg_scale_kind scale, uint8_t *dst, uint8_t *rest)
{
	size_t nb = gg_block_count(n, block_elems), sb = gg_scale_bytes(scale);
	uint8_t *codes = rest;

	for (size_t k = 0; k < nb; k++) {
		size_t off = k * block_elems, len = GG_MIN((size_t)block_elems, n - off);
		float m = gg_absmax_finite_ref(src + off, len);
		float s = gg_block_scale_ref(m, GG_INT4_QMAX, scale, dst + k * sb);
		gg_int4_codes_ref(src + off, 0, len, s, codes + off / 2);
	}
}

/* int8 and int4 decoding: qmax tells them apart. */
static inline void int_decode_any_ref(const uint8_t *src, const uint8_t *rest, size_t n, uint32_t block_elems,
				      enum gg_scale_kind scale, int qmax, float *out, bool acc)
{
	size_t nb = gg_block_count(n, block_elems), sb = gg_scale_bytes(scale);
	const uint8_t *codes = rest;

	for (size_t k = 0; k < nb; k++) {
		size_t off = k * block_elems, len = GG_MIN((size_t)block_elems, n - off);
		float s = gg_block_scale_load(src + k * sb, scale);
		for (size_t i = off; i < off + len; i++) {
			int c = qmax == GG_INT8_QMAX ? (int8_t)codes[i] : gg_int4_unpack(codes[i / 2], i & 1);
			put(out, i, gg_dequantize(c, s, qmax), acc);
		}
	}
}

/* The table's int8 and int4 decoders, storing and accumulating. */
#define INT_DECODERS_REF(name, qmax)                                                                 \
	static void name##_decode_ref(const uint8_t *src, const uint8_t *rest, size_t n, uint32_t block_elems,           \
				      enum gg_scale_kind scale, float *out)                          \
	{                                                                                            \
		int_decode_any_ref(src, rest, n, block_elems, scale, qmax, out, false);                    \
	}                                                                                            \
	static void name##_decode_acc_ref(const uint8_t *src, const uint8_t *rest, size_t n, uint32_t block_elems,       \
					  enum gg_scale_kind scale, float *acc)                      \
	{                                                                                            \
		int_decode_any_ref(src, rest, n, block_elems, scale, qmax, acc, true);                     \
	}

INT_DECODERS_REF(int8, GG_INT8_QMAX)
INT_DECODERS_REF(int4, GG_INT4_QMAX)

const struct gg_codec_kernels gg_codec_kernels_ref = {
	.isa = GG_ISA_SCALAR,
	.encode = {
		[GG_CODEC_FP32] = gg_fp32_encode_copy,
		[GG_CODEC_BF16] = bf16_encode_ref,
		[GG_CODEC_BF16_SPLIT] = bf16_split_encode_ref,
		[GG_CODEC_INT8] = int8_encode_ref,
		[GG_CODEC_INT4] = int4_encode_ref,
	},
	.decode = {
		[GG_CODEC_FP32] = gg_fp32_decode_copy,
		[GG_CODEC_BF16] = bf16_decode_ref,
		[GG_CODEC_BF16_SPLIT] = bf16_split_decode_ref,
		[GG_CODEC_INT8] = int8_decode_ref,
		[GG_CODEC_INT4] = int4_decode_ref,
	},
	.decode_acc = {
		[GG_CODEC_FP32] = fp32_decode_acc_ref,
		[GG_CODEC_BF16] = bf16_decode_acc_ref,
		[GG_CODEC_BF16_SPLIT] = bf16_split_decode_acc_ref,
		[GG_CODEC_INT8] = int8_decode_acc_ref,
		[GG_CODEC_INT4] = int4_decode_acc_ref,
	},
	.add = gg_add_ref,
	.residual = gg_residual_ref,
};

/* bf16 input: the values widen exactly, so the int codecs run the same
 * rules on each block widened to fp32. */
static void int_encode_bf16_ref(const uint16_t *src, size_t n, uint32_t block_elems,
				enum gg_scale_kind scale, int qmax, uint8_t *dst)
{
	size_t nb = gg_block_count(n, block_elems), sb = gg_scale_bytes(scale);
	uint8_t *codes = dst + nb * sb;
	float wide[256];

	for (size_t k = 0; k < nb; k++) {
		size_t off = k * block_elems, len = GG_MIN((size_t)block_elems, n - off);
		uint32_t m = 0;
		for (size_t i = 0; i < len; i++)
			m = GG_MAX(m, gg_abs_bits_finite(gg_bf16_to_f32(src[off + i])));
		float s = gg_block_scale_ref(gg_f32_from_bits(m), qmax, scale, dst + k * sb);
		/* Pieces of an even length, so int4 pieces start on a byte. */
		for (size_t i = 0; i < len; i += GG_ARRAY_LEN(wide)) {
			size_t piece = GG_MIN(GG_ARRAY_LEN(wide), len - i);
			for (size_t j = 0; j < piece; j++)
				wide[j] = gg_bf16_to_f32(src[off + i + j]);
			if (qmax == GG_INT8_QMAX)
				gg_int8_codes_ref(wide, 0, piece, s, codes + off + i);
			else
				gg_int4_codes_ref(wide, 0, piece, s, codes + (off + i) / 2);
		}
	}
}

void gg_codec_encode_bf16_ref(enum gg_codec codec, const uint16_t *src, size_t n,
			      uint32_t block_elems, enum gg_scale_kind scale, uint8_t *dst)
{
	switch (codec) {
	case GG_CODEC_FP32:
		for (size_t i = 0; i < n; i++) {
			float v = gg_bf16_to_f32(src[i]);
			memcpy(dst + 4 * i, &v, sizeof(v));
		}
		break;
	case GG_CODEC_BF16:
		if (n)
			memcpy(dst, src, 2 * n);
		break;
	case GG_CODEC_BF16_SPLIT:
		for (size_t i = 0; i < n; i++) {
			dst[i] = (uint8_t)src[i];
			dst[n + i] = (uint8_t)(src[i] >> 8);
		}
		break;
	case GG_CODEC_INT8:
		int_encode_bf16_ref(src, n, block_elems, scale, GG_INT8_QMAX, dst);
		break;
	case GG_CODEC_INT4:
		int_encode_bf16_ref(src, n, block_elems, scale, GG_INT4_QMAX, dst);
		break;
	}
}
