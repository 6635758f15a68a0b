/* The CUDA calls of cuda/dev_mem.h and cuda/codec_cuda.h done on the host,
 * so that the CPU tests run gateway/engine/mem_cuda.c's own logic: the
 * test_allreduce_sim build with GG_SIM_CUDA links this instead of the GPU
 * library. It keeps CUDA's rules where a mistake would go unseen on a host:
 *   - work enqueued on a stream runs only when the stream is waited for
 *     (gg_dev_sync), so reading a kernel's output before the wait reads
 *     stale bytes and the results differ;
 *   - kernels take only memory the GPU addresses (gg_dev_alloc,
 *     gg_dev_host_alloc): anything else is refused with -EFAULT, as the
 *     real calls refuse plain malloc'd memory;
 *   - every allocation must be freed by the end (checked at exit). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "codec_cuda.h"
#include "dev_mem.h"
#include "feedback.h"

#define MAX_ALLOCS 64
#define MAX_QUEUED 8

enum op { OP_COPY, OP_ENCODE, OP_FB_ENCODE, OP_DECODE, OP_DECODE_ACC };

struct work {
	enum op op;
	struct gg_codec_params p;
	struct gg_feedback_cuda *fb;
	size_t offset, n, bytes;
	const void *src;
	void *dst;
};

struct stream {
	struct work q[MAX_QUEUED];
	unsigned len;
};

static struct {
	const void *p;
	size_t size;
} allocs[MAX_ALLOCS];

static void track(const void *p, size_t size)
{
	for (int i = 0; i < MAX_ALLOCS; i++)
		if (!allocs[i].p) {
			allocs[i].p = p;
			allocs[i].size = size;
			return;
		}
	fprintf(stderr, "cuda double: more than %d allocations\n", MAX_ALLOCS);
	exit(1);
}

static void untrack(const void *p)
{
	for (int i = 0; p && i < MAX_ALLOCS; i++)
		if (allocs[i].p == p) {
			allocs[i].p = NULL;
			return;
		}
}

/* Is [p, p + bytes) inside memory the GPU addresses? */
static bool gpu_reaches(const void *p, size_t bytes)
{
	for (int i = 0; i < MAX_ALLOCS; i++) {
		const char *b = allocs[i].p, *q = p;
		if (b && q >= b && bytes <= allocs[i].size && (size_t)(q - b) <= allocs[i].size - bytes)
			return true;
	}
	return false;
}

static void check_all_freed(void)
{
	for (int i = 0; i < MAX_ALLOCS; i++)
		if (allocs[i].p) {
			fprintf(stderr, "FAIL: cuda double: %zu bytes of GPU memory never freed\n", allocs[i].size);
			_Exit(1);
		}
}

static void *gpu_alloc(size_t bytes)
{
	static bool registered;
	void *p = calloc(1, bytes ? bytes : 1);

	if (!registered) {
		registered = true;
		atexit(check_all_freed);
	}
	if (p)
		track(p, bytes ? bytes : 1);
	return p;
}

int gg_dev_stream_new(void **stream, char *err, size_t err_size)
{
	*stream = calloc(1, sizeof(struct stream));
	return *stream ? 0 : gg_errf(err, err_size, -ENOMEM, "no memory for a stream");
}

void gg_dev_stream_free(void *stream)
{
	free(stream);
}

int gg_dev_alloc(void **p, size_t bytes, char *err, size_t err_size)
{
	*p = gpu_alloc(bytes);
	return *p ? 0 : gg_errf(err, err_size, -ENOMEM, "no memory");
}

void gg_dev_free(void *p)
{
	untrack(p);
	free(p);
}

int gg_dev_host_alloc(void **p, size_t bytes, char *err, size_t err_size)
{
	return gg_dev_alloc(p, bytes, err, err_size);
}

void gg_dev_host_free(void *p)
{
	gg_dev_free(p);
}

static int enqueue(void *stream, const struct work *w, char *err, size_t err_size)
{
	struct stream *s = stream;

	if (!s)
		return gg_errf(err, err_size, -EINVAL, "cuda double: work on the default stream");
	if (s->len == MAX_QUEUED)
		return gg_errf(err, err_size, -EIO, "cuda double: more than %d calls queued", MAX_QUEUED);
	s->q[s->len++] = *w;
	return 0;
}

int gg_dev_copy(void *dst, const void *src, size_t bytes, void *stream, char *err, size_t err_size)
{
	return enqueue(stream, &(struct work){ .op = OP_COPY, .src = src, .dst = dst, .bytes = bytes }, err, err_size);
}

static int run(struct work *w)
{
	struct gg_feedback fb;

	switch (w->op) {
	case OP_COPY:
		memcpy(w->dst, w->src, w->bytes);
		return 0;
	case OP_ENCODE:
		return gg_codec_encode(&w->p, w->src, w->n, w->dst, w->bytes);
	case OP_FB_ENCODE:
		fb = (struct gg_feedback){ .residual = w->fb->residual, .elems = w->fb->elems };
		float *scratch = malloc(w->n * sizeof(float) + 1);
		int rc = scratch ? gg_feedback_encode(&fb, &w->p, w->offset, w->src, w->n, w->dst, w->bytes, scratch)
				 : -ENOMEM;
		free(scratch);
		return rc;
	case OP_DECODE:
		return gg_codec_decode(&w->p, w->src, w->bytes, w->n, w->dst);
	case OP_DECODE_ACC:
		return gg_codec_decode_acc(&w->p, w->src, w->bytes, w->n, w->dst);
	}
	return -EINVAL;
}

int gg_dev_sync(void *stream, char *err, size_t err_size)
{
	struct stream *s = stream;
	int rc = 0;

	for (unsigned i = 0; i < s->len; i++)
		if (!rc && (rc = run(&s->q[i])))
			gg_errf(err, err_size, -EIO, "cuda double: queued call %u failed: %s", i, strerror(-rc));
	s->len = 0;
	return rc;
}

static int kernel(enum op op, const struct gg_codec_params *p, struct gg_feedback_cuda *fb, size_t offset,
		  const void *src, size_t src_bytes, size_t n, void *dst, size_t dst_bytes, void *stream, char *err,
		  size_t err_size)
{
	if (!gpu_reaches(src, src_bytes) || !gpu_reaches(dst, dst_bytes))
		return gg_errf(err, err_size, -EFAULT, "cuda double: a kernel given memory the GPU cannot address");
	struct work w = { .op = op, .p = *p, .fb = fb, .offset = offset, .n = n, .src = src, .dst = dst };
	w.bytes = op == OP_DECODE || op == OP_DECODE_ACC ? src_bytes : dst_bytes;
	return enqueue(stream, &w, err, err_size);
}

int gg_codec_encode_cuda(const struct gg_codec_params *p, const float *src, size_t n, void *dst, size_t dst_bytes,
			 void *stream, char *err, size_t err_size)
{
	return kernel(OP_ENCODE, p, NULL, 0, src, n * sizeof(float), n, dst, dst_bytes, stream, err, err_size);
}

int gg_codec_decode_cuda(const struct gg_codec_params *p, const void *src, size_t src_bytes, size_t n, float *dst,
			 void *stream, char *err, size_t err_size)
{
	return kernel(OP_DECODE, p, NULL, 0, src, src_bytes, n, dst, n * sizeof(float), stream, err, err_size);
}

int gg_codec_decode_acc_cuda(const struct gg_codec_params *p, const void *src, size_t src_bytes, size_t n,
			     float *acc, void *stream, char *err, size_t err_size)
{
	return kernel(OP_DECODE_ACC, p, NULL, 0, src, src_bytes, n, acc, n * sizeof(float), stream, err, err_size);
}

int gg_feedback_init_cuda(struct gg_feedback_cuda *fb, size_t elems, char *err, size_t err_size)
{
	fb->elems = elems;
	return gg_dev_alloc((void **)&fb->residual, elems * sizeof(float), err, err_size);
}

void gg_feedback_fini_cuda(struct gg_feedback_cuda *fb)
{
	gg_dev_free(fb->residual);
	fb->residual = NULL;
}

int gg_feedback_encode_cuda(struct gg_feedback_cuda *fb, const struct gg_codec_params *p, size_t offset,
			    const float *in, size_t n, void *dst, size_t dst_bytes, void *stream, char *err,
			    size_t err_size)
{
	return kernel(OP_FB_ENCODE, p, fb, offset, in, n * sizeof(float), n, dst, dst_bytes, stream, err, err_size);
}
