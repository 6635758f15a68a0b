/* Gradient codecs: the CPU reference (the oracle for cuda/) and its
 * vectorized twins. docs/codecs.md explains the choices; this comment is the
 * normative definition that every implementation must reproduce bit for bit.
 *
 * Conventions
 *   All multi-byte fields are little-endian. Arithmetic is IEEE binary32 in
 *   round-to-nearest-even with subnormals kept (no FTZ/DAZ) and without
 *   contraction: every '*', '/', '+', '-' below rounds on its own (CUDA:
 *   __fmul_rn, __fdiv_rn, __fadd_rn, __fsub_rn; no --use_fast_math).
 *   rne(v) is rintf(v) in the default rounding mode (on the GPU too).
 *   codec_elem.h holds these rules per element, for every implementation.
 *   finite(x) is true unless the exponent bits of x are all ones.
 *   NaN(x) means the quiet NaN with bits 0x7fc00000.
 *   n is the element count of one chunk; every chunk is encoded on its own.
 *
 * fp32 (id 1) — lossless. 4n bytes: the input's bits as they are (NaN
 *   payloads included).
 *
 * bf16 (id 2) — 2n bytes, one little-endian uint16 per element:
 *     u = bits(x)
 *     if (u & 0x7fffffff) > 0x7f800000:  b = (u >> 16) | 0x0040   (NaN stays
 *                                            a quiet NaN, sign kept)
 *     else:                              b = (u + 0x7fff + ((u >> 16) & 1)) >> 16
 *   i.e. round to nearest even on the bit pattern; subnormals round like
 *   normals, ±inf stay ±inf, and finite values from 0x1.ffp127 up (bits
 *   0x7f7f8000, halfway between the largest bf16 and infinity) become ±inf
 *   (IEEE overflow). Decoding: bits = b << 16.
 *   bf16 input is copied verbatim.
 *
 * bf16-split (id 3) — 2n bytes: the bf16 values b[i] defined above, stored
 *   as two byte planes: bytes [0, n) hold b[i] & 0xff (low plane: the low
 *   exponent bit and 7 mantissa bits), bytes [n, 2n) hold b[i] >> 8 (high
 *   plane: sign and 7 exponent bits, which zstd compresses well). Decodes to
 *   exactly the bf16 values.
 *
 * int8 (id 4) and int4 (id 5) — blockwise absmax quantization.
 *   Q = 127 for int8, 7 for int4. Block size B (params.block_elems) is a
 *   multiple of 32 in [32, 65536]; the chunk is cut into nb = ceil(n / B)
 *   blocks, block k covering elements [kB, min(n, kB + B)); the last block
 *   may be shorter (a tail block follows the same rules over its own
 *   elements).
 *   Layout: nb scales (4 bytes each for GG_SCALE_F32, 2 bytes for
 *   GG_SCALE_F16), then the codes: int8 one int8_t per element (n bytes);
 *   int4 two per byte (ceil(n/2) bytes), element 2j in bits 0-3 and element
 *   2j+1 in bits 4-7 of byte j, each a 4-bit two's complement value; when n
 *   is odd the last byte's high nibble is 0.
 *   Per block:
 *     m = max over the block's finite elements of |x| (0 if none)
 *     s32 = m / (float)Q
 *     GG_SCALE_F32: stored = s32,            s = s32
 *     GG_SCALE_F16: stored = f16_ru(s32),    s = (float)stored
 *       f16_ru rounds toward +inf to IEEE binary16 (CUDA __float2half_ru):
 *       a nonzero s32 below 2^-24 becomes 2^-24, and s32 > 65504 becomes
 *       +inf, which marks the block as out of range: all its elements
 *       decode non-finite (as fp16 overflow would).
 *   Per element x of the block, the code c:
 *     !finite(x)      -> c = -Q - 1   (-128 / -8: the non-finite marker)
 *     s == 0          -> c = 0
 *     otherwise       -> c = clamp(rne(x / s), -Q, Q)
 *   Decoding:  c == -Q - 1 -> NaN;  otherwise x' = (float)c * s.
 *   Any stored bit pattern decodes by this rule (a scale is not validated;
 *   the frame checksum covers it). So the element positions of inf and NaN
 *   are kept (both decode to NaN), a block with an out-of-range fp16 scale
 *   decodes all non-finite, and every finite x in a block with scale s
 *   decodes with
 *     |x' - x| <= 0.5 * s * (1 + 2^-14) + 2^-140
 *   (s32 <= (m / Q) * (1 + 2^-23); f16_ru adds at most a factor 1 + 2^-10
 *   above 2^-14). Only when m > FLT_MAX * (1 - 2^-16) may c * s round to
 *   ±inf: a finite input can then decode as inf, never the reverse.
 *
 * Decode-and-accumulate computes acc[i] = acc[i] + x'[i] (one fp32 add per
 * element, after x' has been rounded). The bytes of a decoded NaN (sign and
 * payload) are not part of the contract; any NaN equals any NaN.
 */
#ifndef GG_CODEC_H
#define GG_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gg_common.h"

#ifdef __cplusplus
extern "C" { /* cuda/ includes this from C++ */
#endif

enum gg_codec {
	GG_CODEC_FP32 = 1,
	GG_CODEC_BF16 = 2,
	GG_CODEC_BF16_SPLIT = 3,
	GG_CODEC_INT8 = 4,
	GG_CODEC_INT4 = 5,
};
#define GG_CODEC_FIRST GG_CODEC_FP32
#define GG_CODEC_LAST GG_CODEC_INT4

enum gg_scale_kind {
	GG_SCALE_F32 = 0,
	GG_SCALE_F16 = 1,
};

#define GG_CODEC_DEFAULT_BLOCK_ELEMS 256u
#define GG_CODEC_MIN_BLOCK_ELEMS 32u
#define GG_CODEC_MAX_BLOCK_ELEMS 65536u
#define GG_CODEC_BLOCK_ALIGN_ELEMS 32u

struct gg_codec_params {
	enum gg_codec codec;
	uint32_t block_elems;     /* int8/int4 only; must be 0 for the others */
	enum gg_scale_kind scale; /* int8/int4 only; must be GG_SCALE_F32 for the others */
};

/* "fp32", "bf16", "bf16-split", "int8", "int4": the names config files and
 * the CLI use. Returns 0, or -EINVAL for an unknown name. */
GG_MUST_CHECK int gg_codec_from_name(const char *name, enum gg_codec *out);
/* NULL for a value outside the enum. */
const char *gg_codec_name(enum gg_codec codec);
/* "fp32", "bf16", "bf16-split", "int8", "int4" joined by ", " for messages. */
const char *gg_codec_names(void);
bool gg_codec_is_lossy(enum gg_codec codec);
bool gg_codec_has_blocks(enum gg_codec codec);

/* Parameters with the defaults for `codec` (block 256, fp32 scales). */
struct gg_codec_params gg_codec_defaults(enum gg_codec codec);

/* 0, or -EINVAL when the codec is unknown or block_elems/scale do not fit
 * it. `why` (may be NULL) then says what is wrong. */
GG_MUST_CHECK int gg_codec_params_check(const struct gg_codec_params *p, const char **why);

/* Encoded size of `elems` elements. 0, -EINVAL (bad params) or -EOVERFLOW. */
GG_MUST_CHECK int gg_codec_encoded_bytes(const struct gg_codec_params *p, uint64_t elems,
					 uint64_t *bytes);

/* Encode n elements into dst, which must hold gg_codec_encoded_bytes();
 * exactly that many bytes are written. Returns 0, -EINVAL (params) or
 * -ENOBUFS (dst_bytes too small). */
GG_MUST_CHECK int gg_codec_encode(const struct gg_codec_params *p, const float *src, size_t n,
				  void *dst, size_t dst_bytes);
/* Same from bf16 input (uint16 bit patterns): each value is widened to fp32
 * exactly and then encoded as above, except that codec bf16 copies the bits
 * and bf16-split splits them. Runs the scalar reference only. */
GG_MUST_CHECK int gg_codec_encode_bf16(const struct gg_codec_params *p, const uint16_t *src,
				       size_t n, void *dst, size_t dst_bytes);

/* Decode n elements from src_bytes bytes, which must equal the encoded size
 * exactly (-EBADMSG otherwise). decode stores into dst; decode_acc adds into
 * acc. Nothing is written on error. */
GG_MUST_CHECK int gg_codec_decode(const struct gg_codec_params *p, const void *src,
				  size_t src_bytes, size_t n, float *dst);
GG_MUST_CHECK int gg_codec_decode_acc(const struct gg_codec_params *p, const void *src,
				      size_t src_bytes, size_t n, float *acc);

/* Elements a span of gg_codec_decode_span() and gg_codec_encode_span()
 * starts at a multiple of, and lasts a multiple of (but for the chunk's
 * last span): a block of int8 and int4 (whose loops start at each block),
 * 64 for the rest (a multiple of every vector loop): each element takes
 * the path it takes in a decode or encode of the whole chunk. */
static inline size_t gg_codec_span_align(const struct gg_codec_params *p)
{
	return p->codec == GG_CODEC_INT8 || p->codec == GG_CODEC_INT4 ? p->block_elems : 64;
}

/* The span a pass over a chunk takes at a time while it stays in cache:
 * about 4096 elements (16 KiB of float32), whole spans (a block where one
 * is larger). */
static inline size_t gg_codec_span_step(const struct gg_codec_params *p)
{
	const size_t align = gg_codec_span_align(p);

	return GG_MAX(align, 4096 / align * align);
}

/* Elements [first, first + m) of the chunk of n elements that src (its
 * whole payload, checked as gg_codec_decode does) holds, decoded into
 * out[0..m): stored, or with `acc` added, exactly as gg_codec_decode() and
 * gg_codec_decode_acc() of the chunk write them. first and m as
 * gg_codec_span_align() says (-EINVAL otherwise). */
GG_MUST_CHECK int gg_codec_decode_span(const struct gg_codec_params *p, const void *src, size_t src_bytes,
				       size_t n, size_t first, size_t m, float *out, bool acc);
/* The other way: src[0..m), elements [first, first + m) of a chunk of n
 * elements, encoded into their places in dst, the chunk's payload (which
 * must hold gg_codec_encoded_bytes() of n: -ENOBUFS), byte for byte as
 * gg_codec_encode() of the chunk writes them there. */
GG_MUST_CHECK int gg_codec_encode_span(const struct gg_codec_params *p, const float *src, size_t n, size_t first,
				       size_t m, void *dst, size_t dst_bytes);

/* Instruction sets for the kernels. The best one the CPU has is picked at
 * first use; the environment variable GG_CODEC_ISA=scalar|avx2|avx512 or
 * gg_codec_set_isa() caps it, so tests and benchmarks can compare paths. */
enum gg_isa {
	GG_ISA_SCALAR = 0,
	GG_ISA_AVX2 = 1,   /* AVX2 */
	GG_ISA_AVX512 = 2, /* AVX-512 F, BW, VL, DQ */
};
#define GG_ISA_COUNT 3

const char *gg_isa_name(enum gg_isa isa);
/* True when this build has the kernels and this CPU can run them. */
bool gg_isa_available(enum gg_isa isa);
/* Selects the kernels all later calls use (process-wide). -ENOTSUP when
 * not available. */
GG_MUST_CHECK int gg_codec_set_isa(enum gg_isa isa);
enum gg_isa gg_codec_isa(void);

/* out[i] = a[i] + b[i] in float32 (each sum rounded on its own), with the
 * selected kernels; out may be a or b. */
void gg_f32_add(const float *a, const float *b, size_t n, float *out);

#ifdef __cplusplus
}
#endif

#endif
