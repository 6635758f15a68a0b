/* Payload frames: one self-describing chunk of an encoded tensor.
 *
 * A frame is a 32-byte header followed by stored_bytes of payload. All
 * fields little-endian:
 *   off size field
 *   0   4    magic 0x31464747 (the bytes "GGF1")
 *   4   1    version, 1
 *   5   1    codec id (enum gg_codec)
 *   6   1    flags: bit 0 payload is one zstd frame, bit 1 fp16 block
 *            scales (int8/int4 only); other bits 0
 *   7   1    reserved, 0
 *   8   8    element count n
 *   16  4    block size in elements (int8/int4; 0 for the others)
 *   20  4    raw_bytes: the encoded size, exactly gg_codec_encoded_bytes(n)
 *   24  4    stored_bytes: raw_bytes, or the zstd frame's size (then
 *            smaller than raw_bytes)
 *   28  4    checksum: CRC-32C of the raw codec bytes followed by header
 *            bytes 0..27. The sender computes it on the encoder's output
 *            before the zstd stage, the receiver after undoing zstd, so it
 *            covers the zstd stage, the transport and every buffer between.
 *
 * The decoder treats every field as hostile: it checks them all against
 * each other and against its configured limits before touching the
 * payload, enforces the declared size on zstd (no decompression bomb: the
 * output buffer is exactly raw_bytes), verifies the checksum before writing
 * any output, and names the field and the values in its error message.
 *
 * Encoder and decoder objects are not thread-safe: one per thread. */
#ifndef GG_FRAME_H
#define GG_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codec.h"
#include "gg_common.h"
#include "zstd_stage.h"

#define GG_FRAME_MAGIC 0x31464747u
#define GG_FRAME_VERSION 1
#define GG_FRAME_HEADER_BYTES 32
#define GG_FRAME_FLAG_ZSTD 0x01u
#define GG_FRAME_FLAG_SCALE_F16 0x02u
#define GG_FRAME_MAX_RAW_BYTES UINT32_MAX

/* What a decoder accepts. max_raw_bytes also sizes its scratch buffer. */
struct gg_frame_limits {
	uint64_t max_elems;
	size_t max_raw_bytes; /* <= GG_FRAME_MAX_RAW_BYTES */
};

struct gg_frame_info {
	struct gg_codec_params params;
	uint64_t elems;
	uint32_t raw_bytes;
	uint32_t stored_bytes;
	uint32_t checksum;
	bool zstd;
	size_t frame_bytes; /* header + stored_bytes */
};

struct gg_frame_config {
	struct gg_codec_params codec;
	bool zstd;          /* run the zstd stage (it still bypasses chunks that do not pay) */
	int zstd_level;     /* GG_ZSTD_DEFAULT_LEVEL unless configured */
	uint64_t max_elems; /* largest chunk this encoder takes */
	unsigned zstd_min_saving_div; /* bypass rule (zstd_stage.h); 0: the default 8 */
};

struct gg_frame_encoder {
	struct gg_frame_config cfg;
	uint64_t max_raw_bytes;
	struct gg_zstd_stage zs;
	uint8_t *scratch; /* compressed payload, max_raw_bytes */
};

struct gg_frame_decoder {
	struct gg_frame_limits limits;
	struct gg_zstd_stage zs;
	uint8_t *scratch; /* decompressed payload, limits.max_raw_bytes */
};

enum gg_frame_op {
	GG_FRAME_STORE,      /* out[i] = x'[i] */
	GG_FRAME_ACCUMULATE, /* out[i] = out[i] + x'[i] */
};

/* Size of the largest frame for n elements (header + raw encoded size). */
GG_MUST_CHECK int gg_frame_bound(const struct gg_codec_params *p, uint64_t n, uint64_t *bytes);

/* Returns 0, -EINVAL (bad codec params, level or a frame that could exceed
 * GG_FRAME_MAX_RAW_BYTES) or -ENOMEM. */
GG_MUST_CHECK int gg_frame_encoder_init(struct gg_frame_encoder *enc, const struct gg_frame_config *cfg);
void gg_frame_encoder_fini(struct gg_frame_encoder *enc);

/* Encodes src[0..n) (n <= cfg.max_elems) as one frame into dst. Returns 0
 * and *frame_bytes, -EINVAL (n too large) or -ENOBUFS (dst_cap below
 * gg_frame_bound()). */
GG_MUST_CHECK int gg_frame_encode(struct gg_frame_encoder *enc, const float *src, size_t n,
				  void *dst, size_t dst_cap, size_t *frame_bytes);
GG_MUST_CHECK int gg_frame_encode_bf16(struct gg_frame_encoder *enc, const uint16_t *src, size_t n,
				       void *dst, size_t dst_cap, size_t *frame_bytes);
/* Frames codec bytes encoded elsewhere (the GPU, error feedback): raw holds
 * exactly gg_codec_encoded_bytes(cfg.codec, n) bytes. raw may be dst +
 * GG_FRAME_HEADER_BYTES (encoded in place); otherwise it must not overlap
 * dst. */
GG_MUST_CHECK int gg_frame_wrap(struct gg_frame_encoder *enc, const void *raw, size_t raw_bytes,
				size_t n, void *dst, size_t dst_cap, size_t *frame_bytes);

/* Checks a header alone (len >= GG_FRAME_HEADER_BYTES bytes at buf) and
 * fills *info; does not look at the payload. Lets a reader learn how many
 * payload bytes follow. Returns 0, -EBADMSG or -E2BIG (over a limit), with
 * a one-line message in err. */
GG_MUST_CHECK int gg_frame_parse_header(const void *buf, size_t len, const struct gg_frame_limits *lim,
					struct gg_frame_info *info, char *err, size_t err_size);

/* limits->max_raw_bytes <= GG_FRAME_MAX_RAW_BYTES. Returns 0, -EINVAL, -ENOMEM. */
GG_MUST_CHECK int gg_frame_decoder_init(struct gg_frame_decoder *dec, const struct gg_frame_limits *limits);
void gg_frame_decoder_fini(struct gg_frame_decoder *dec);

/* Validates one whole frame (frame_bytes must be exactly header + payload),
 * undoes zstd, verifies the checksum and sets *raw to the codec bytes (in
 * the frame or in the decoder's scratch, valid until the next call).
 * Returns 0, -EBADMSG (malformed), -E2BIG (over a limit) or -EILSEQ
 * (checksum mismatch), with a one-line message in err. */
GG_MUST_CHECK int gg_frame_unwrap(struct gg_frame_decoder *dec, const void *frame, size_t frame_bytes,
				  struct gg_frame_info *info, const uint8_t **raw, char *err, size_t err_size);

/* gg_frame_unwrap, and the frame must hold n elements: -EBADMSG ("frame:
 * element count E, caller expects n") otherwise. */
GG_MUST_CHECK int gg_frame_unwrap_n(struct gg_frame_decoder *dec, const void *frame, size_t frame_bytes,
				    size_t n, struct gg_frame_info *info, const uint8_t **raw, char *err,
				    size_t err_size);

/* gg_frame_unwrap, then decodes into out (n elements, which must equal the
 * frame's element count: -EBADMSG otherwise). out is not touched unless the
 * whole frame is valid. info may be NULL. */
GG_MUST_CHECK int gg_frame_decode(struct gg_frame_decoder *dec, const void *frame, size_t frame_bytes,
				  float *out, size_t n, enum gg_frame_op op, struct gg_frame_info *info,
				  char *err, size_t err_size);

/* The most frames gg_frame_decode_sum() sweeps together: a sum's sites. */
#define GG_FRAME_SUM_MAX 8

/* The first `count` frames of a sum: writes exactly what gg_frame_decode of
 * frames[0] (STORE) and then of each other in turn (ACCUMULATE) write, by
 * the same kernels, but for 2 to GG_FRAME_SUM_MAX frames of one codec
 * without zstd in one sweep over out, a few thousand elements at a time,
 * each stored and added to while in cache (gg_codec_decode_span()).
 * Returns as gg_frame_decode, with *bad the index of the frame at fault;
 * out may then hold the sum of the frames before it. */
GG_MUST_CHECK int gg_frame_decode_sum(struct gg_frame_decoder *dec, const void *const *frames,
				      const size_t *frame_bytes, unsigned count, float *out, size_t n, unsigned *bad,
				      char *err, size_t err_size);

#endif
