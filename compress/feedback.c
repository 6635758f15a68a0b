#include "feedback.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"

int gg_feedback_init(struct gg_feedback *fb, size_t elems, size_t max_chunk_elems)
{
	*fb = (struct gg_feedback){ .elems = elems, .max_chunk_elems = max_chunk_elems };
	if (max_chunk_elems > elems || max_chunk_elems == 0)
		return -EINVAL;
	fb->residual = calloc(elems, sizeof(float));
	fb->scratch = malloc(max_chunk_elems * sizeof(float));
	if (!fb->residual || !fb->scratch) {
		gg_feedback_fini(fb);
		return -ENOMEM;
	}
	return 0;
}

void gg_feedback_fini(struct gg_feedback *fb)
{
	free(fb->residual);
	free(fb->scratch);
	fb->residual = NULL;
	fb->scratch = NULL;
}

void gg_feedback_reset(struct gg_feedback *fb)
{
	memset(fb->residual, 0, fb->elems * sizeof(float));
}

static bool in_range(const struct gg_feedback *fb, size_t offset, size_t n)
{
	return offset <= fb->elems && n <= fb->elems - offset;
}

int gg_feedback_compensate(struct gg_feedback *fb, size_t offset, const float *in, size_t n,
			   float *to_encode)
{
	if (!in_range(fb, offset, n))
		return -EINVAL;
	gg_f32_add(in, fb->residual + offset, n, to_encode);
	return 0;
}

int gg_feedback_commit(struct gg_feedback *fb, const struct gg_codec_params *p, size_t offset,
		       const float *to_encode, size_t n, const void *encoded, size_t encoded_bytes)
{
	if (!in_range(fb, offset, n))
		return -EINVAL;
	float *r = fb->residual + offset;
	/* The residual slice doubles as the decode buffer. */
	int rc = gg_codec_decode(p, encoded, encoded_bytes, n, r);
	if (rc)
		return rc;
	gg_codec_kernels_active()->residual(to_encode, r, n);
	return 0;
}

int gg_feedback_encode(struct gg_feedback *fb, const struct gg_codec_params *p, size_t offset,
		       const float *in, size_t n, void *dst, size_t dst_bytes, float *scratch)
{
	if (!scratch) {
		if (n > fb->max_chunk_elems)
			return -EINVAL;
		scratch = fb->scratch;
	}
	if (!in_range(fb, offset, n))
		return -EINVAL;
	uint64_t bytes;
	int rc = gg_codec_encoded_bytes(p, n, &bytes);
	if (rc)
		return rc;
	if (dst_bytes < bytes)
		return -ENOBUFS;
	/* The four passes of compensate, encode, commit, span by span: what
	 * each writes is what the whole-chunk passes write, element for
	 * element (their rules are per element, the codec's per block). */
	const struct gg_codec_kernels *k = gg_codec_kernels_active();
	const size_t step = gg_codec_span_step(p);
	float *r = fb->residual + offset;
	for (size_t i = 0; i < n; i += step) {
		size_t m = GG_MIN(step, n - i);
		gg_f32_add(in + i, r + i, m, scratch + i);
		if ((rc = gg_codec_encode_span(p, scratch + i, n, i, m, dst, (size_t)bytes)) ||
		    (rc = gg_codec_decode_span(p, dst, (size_t)bytes, n, i, m, r + i, false)))
			return rc;
		k->residual(scratch + i, r + i, m);
	}
	return 0;
}
