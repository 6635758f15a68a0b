/* mem_cuda.h: the step engine's memory ops on a GPU. */
#include "mem_cuda.h"

#include <errno.h>
#include <string.h>

#include "dev_mem.h"

static int staged(struct gg_ar_mem_cuda *m, uint64_t raw, char *err, size_t err_size)
{
	if (raw > m->staging_bytes)
		return gg_errf(err, err_size, -E2BIG, "%llu codec bytes of one chunk, staging holds %zu",
			       (unsigned long long)raw, m->staging_bytes);
	return 0;
}

static int cuda_encode(void *ctx, struct gg_frame_encoder *enc, uint64_t offset, const float *src, uint64_t n,
		       uint8_t *frame, uint64_t cap, size_t *len, char *err, size_t err_size)
{
	struct gg_ar_mem_cuda *m = ctx;
	const struct gg_codec_params *p = &enc->cfg.codec;
	uint64_t raw;
	int rc;

	if ((rc = gg_codec_encoded_bytes(p, n, &raw)))
		return gg_errf(err, err_size, rc, "%llu elements cannot be encoded by %s", (unsigned long long)n,
			       gg_codec_name(p->codec));
	if ((rc = staged(m, raw, err, err_size)))
		return rc;
	if (cap < GG_FRAME_HEADER_BYTES || cap - GG_FRAME_HEADER_BYTES < raw)
		return gg_errf(err, err_size, -ENOBUFS, "a frame of %llu codec bytes in a buffer of %llu",
			       (unsigned long long)raw, (unsigned long long)cap);
	rc = m->fb ? gg_feedback_encode_cuda(m->fb, p, offset, src, n, m->staging, raw, m->stream, err, err_size)
		   : gg_codec_encode_cuda(p, src, n, m->staging, raw, m->stream, err, err_size);
	if (rc || (rc = gg_dev_sync(m->stream, err, err_size)))
		return rc;
	memcpy(frame + GG_FRAME_HEADER_BYTES, m->staging, raw);
	rc = gg_frame_wrap(enc, frame + GG_FRAME_HEADER_BYTES, raw, n, frame, cap, len);
	if (rc)
		return gg_errf(err, err_size, rc, "framing %llu codec bytes: %s", (unsigned long long)raw, strerror(-rc));
	return 0;
}

static int cuda_decode(void *ctx, struct gg_frame_decoder *dec, const void *frame, size_t len, float *out,
		       uint64_t n, enum gg_frame_op op, char *err, size_t err_size)
{
	struct gg_ar_mem_cuda *m = ctx;
	struct gg_frame_info fi;
	const uint8_t *raw = NULL;
	int rc = gg_frame_unwrap_n(dec, frame, len, n, &fi, &raw, err, err_size);

	if (rc || (rc = staged(m, fi.raw_bytes, err, err_size)))
		return rc;
	memcpy(m->staging, raw, fi.raw_bytes);
	rc = op == GG_FRAME_ACCUMULATE
		     ? gg_codec_decode_acc_cuda(&fi.params, m->staging, fi.raw_bytes, n, out, m->stream, err, err_size)
		     : gg_codec_decode_cuda(&fi.params, m->staging, fi.raw_bytes, n, out, m->stream, err, err_size);
	return rc ? rc : gg_dev_sync(m->stream, err, err_size);
}

static int cuda_copy(void *ctx, float *dst, const float *src, uint64_t n, char *err, size_t err_size)
{
	struct gg_ar_mem_cuda *m = ctx;
	int rc = gg_dev_copy(dst, src, n * sizeof(float), m->stream, err, err_size);

	return rc ? rc : gg_dev_sync(m->stream, err, err_size);
}

static bool frees_held(const struct gg_ar_mem_cuda *lane)
{
	return lane->frees_held && atomic_load_explicit(lane->frees_held, memory_order_acquire);
}

/* Frees what the lane kept beyond its spares, unless frees are held; returns
 * how many buffers it keeps. */
static int trim_kept(struct gg_ar_mem_cuda *lane)
{
	const bool held = frees_held(lane);
	int count = 0;

	for (int i = 0; i < GG_MEM_CUDA_KEPT; i++) {
		if (!lane->kept[i].p)
			continue;
		if (count < GG_MEM_CUDA_SPARES || held) {
			count++;
			continue;
		}
		gg_dev_free(lane->kept[i].p);
		lane->kept[i].p = NULL;
	}
	return count;
}

/* The smallest buffer the lane keeps of at least n floats when it has
 * one, else new device memory. */
static int cuda_alloc(void *ctx, uint64_t n, float **out, char *err, size_t err_size)
{
	struct gg_ar_mem_cuda *lane = ((struct gg_ar_mem_cuda *)ctx)->lane;
	int best = -1;

	for (int i = 0; i < GG_MEM_CUDA_KEPT; i++)
		if (lane->kept[i].p && lane->kept[i].n >= n && (best < 0 || lane->kept[i].n < lane->kept[best].n))
			best = i;
	if (best >= 0) {
		*out = lane->kept[best].p;
		lane->kept[best].p = NULL;
		return 0;
	}
	trim_kept(lane);
	void *p = NULL;
	int rc = gg_dev_alloc(&p, n * sizeof(float), err, err_size);
	*out = p;
	return rc;
}

/* Kept as a spare, or beyond the spares while frees are held; else freed. */
static void cuda_free(void *ctx, float *p, uint64_t n)
{
	struct gg_ar_mem_cuda *lane = ((struct gg_ar_mem_cuda *)ctx)->lane;

	if (!p)
		return;
	if (trim_kept(lane) < GG_MEM_CUDA_SPARES || frees_held(lane))
		for (int i = 0; i < GG_MEM_CUDA_KEPT; i++)
			if (!lane->kept[i].p) {
				lane->kept[i].p = p;
				lane->kept[i].n = n;
				return;
			}
	gg_dev_free(p);
}

static const struct gg_ar_mem_ops cuda_ops = { .encode = cuda_encode, .decode = cuda_decode, .copy = cuda_copy,
					       .alloc = cuda_alloc, .free = cuda_free };

int gg_ar_mem_cuda_init(struct gg_ar_mem_cuda *m, size_t max_raw_bytes, struct gg_feedback_cuda *fb, char *err,
			size_t err_size)
{
	void *staging = NULL;
	int rc;

	*m = (struct gg_ar_mem_cuda){ .lane = m, .fb = fb, .staging_bytes = max_raw_bytes };
	if ((rc = gg_dev_stream_new(&m->stream, err, err_size)))
		return rc;
	if ((rc = gg_dev_host_alloc(&staging, max_raw_bytes, err, err_size))) {
		gg_dev_stream_free(m->stream);
		m->stream = NULL;
		return rc;
	}
	m->staging = staging;
	m->mem = (struct gg_ar_mem){ .ops = &cuda_ops, .ctx = m, .feedback = fb != NULL };
	return 0;
}

void gg_ar_mem_cuda_view(struct gg_ar_mem_cuda *view, const struct gg_ar_mem_cuda *m, struct gg_feedback_cuda *fb)
{
	*view = (struct gg_ar_mem_cuda){ .mem = { .ops = &cuda_ops, .ctx = view, .feedback = fb != NULL },
					 .lane = m->lane, .stream = m->stream, .staging = m->staging,
					 .staging_bytes = m->staging_bytes, .fb = fb };
}

void gg_ar_mem_cuda_fini(struct gg_ar_mem_cuda *m)
{
	for (int i = 0; i < GG_MEM_CUDA_KEPT; i++)
		gg_dev_free(m->kept[i].p);
	gg_dev_host_free(m->staging);
	gg_dev_stream_free(m->stream);
	m->staging = NULL;
	m->stream = NULL;
}
