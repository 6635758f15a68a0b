/* Error feedback for lossy codecs: one residual buffer per tensor carries
 * what the codec lost in this step into the next step's input, so the sum
 * of the decoded values over many steps tracks the sum of the inputs
 * within one step's error instead of drifting.
 *
 * For element i of the tensor, with r the residual (0 at start):
 *   c = x + r                      (what is encoded; fp32, one rounding)
 *   d = decode(encode(c))
 *   r = c - d   if that is finite, else 0
 * Non-finite inputs (and decodes) reset the residual instead of poisoning
 * every later step. Residuals are therefore always finite, and c is NaN
 * only when x is: then c is x quieted, sign and payload kept (what x86
 * returns; fp32 and bf16 encode c's bits). codec_elem.h writes both steps
 * per element (gg_feedback_compensate_elem, gg_feedback_residual_elem);
 * cuda/codec_cuda.h has the same on the device.
 *
 * Chunks are independent: offset says where a chunk sits in the tensor.
 * Threads may work on disjoint ranges at once, each with its own scratch. */
#ifndef GG_FEEDBACK_H
#define GG_FEEDBACK_H

#include <stddef.h>

#include "codec.h"
#include "gg_common.h"

struct gg_feedback {
	float *residual;      /* elems */
	size_t elems;
	float *scratch;       /* max_chunk_elems: the compensated chunk */
	size_t max_chunk_elems;
};

/* Returns 0, -EINVAL or -ENOMEM. Residuals start at 0. */
GG_MUST_CHECK int gg_feedback_init(struct gg_feedback *fb, size_t elems, size_t max_chunk_elems);
void gg_feedback_fini(struct gg_feedback *fb);
/* Forget what was carried (e.g. after a step the loss scaler skipped). */
void gg_feedback_reset(struct gg_feedback *fb);

/* to_encode[i] = in[i] + residual[offset + i]: what to encode for this
 * chunk. -EINVAL when the range is outside the tensor. */
GG_MUST_CHECK int gg_feedback_compensate(struct gg_feedback *fb, size_t offset, const float *in,
					 size_t n, float *to_encode);
/* After to_encode was encoded (by any implementation) into `encoded`:
 * residual[offset + i] = to_encode[i] - decoded[i] (0 when not finite). */
GG_MUST_CHECK int gg_feedback_commit(struct gg_feedback *fb, const struct gg_codec_params *p,
				     size_t offset, const float *to_encode, size_t n,
				     const void *encoded, size_t encoded_bytes);
/* Both around gg_codec_encode(): encodes in[0..n) with its residual into
 * dst (exactly gg_codec_encoded_bytes() bytes) and updates the residual.
 * `scratch` holds the compensated chunk: n floats of the caller's, so
 * threads may encode disjoint ranges at once, or NULL for the feedback's
 * own (n <= max_chunk_elems). Returns 0 or what those return. */
GG_MUST_CHECK int gg_feedback_encode(struct gg_feedback *fb, const struct gg_codec_params *p,
				     size_t offset, const float *in, size_t n, void *dst,
				     size_t dst_bytes, float *scratch);

#endif
