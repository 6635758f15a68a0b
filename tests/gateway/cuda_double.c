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
 *   - device memory is mapped without access where the caller sees it
 *     (the calls here reach it through a second mapping), so host code
 *     that reads or writes it directly faults, as it would on a GPU;
 *   - every allocation must be freed by the end (checked at exit).
 * Any thread may call it (a gateway's lanes do), each stream from one
 * thread at a time, as CUDA's rules allow. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "codec_cuda.h"
#include "cuda_double.h"
#include "dev_mem.h"
#include "feedback.h"
#include "fence_map.h"

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

/* An allocation: `p` as the caller sees it, `view` where the calls here
 * reach it (p itself for pinned host memory). */
struct alloc {
	char *p, *view;
	size_t size;
};

static struct alloc allocs[MAX_ALLOCS];
static pthread_mutex_t allocs_lock = PTHREAD_MUTEX_INITIALIZER;

static void track(void *p, void *view, size_t size)
{
	pthread_mutex_lock(&allocs_lock);
	for (int i = 0; i < MAX_ALLOCS; i++)
		if (!allocs[i].p) {
			allocs[i] = (struct alloc){ p, view, size };
			pthread_mutex_unlock(&allocs_lock);
			return;
		}
	fprintf(stderr, "cuda double: more than %d allocations\n", MAX_ALLOCS);
	exit(1);
}

/* The allocation holding [p, p + bytes): true with *out, or false. */
static bool find(const void *p, size_t bytes, struct alloc *out)
{
	bool found = false;

	pthread_mutex_lock(&allocs_lock);
	for (int i = 0; i < MAX_ALLOCS && !found; i++) {
		const char *b = allocs[i].p, *q = p;
		if (b && q >= b && bytes <= allocs[i].size && (size_t)(q - b) <= allocs[i].size - bytes) {
			*out = allocs[i];
			found = true;
		}
	}
	pthread_mutex_unlock(&allocs_lock);
	return found;
}

/* Forgets the allocation that starts at p: true with what it was, or false. */
static bool untrack(const void *p, struct alloc *out)
{
	bool found = false;

	pthread_mutex_lock(&allocs_lock);
	for (int i = 0; p && i < MAX_ALLOCS && !found; i++)
		if (allocs[i].p == p) {
			*out = allocs[i];
			allocs[i].p = NULL;
			found = true;
		}
	pthread_mutex_unlock(&allocs_lock);
	return found;
}

/* Is [p, p + bytes) inside memory the GPU addresses? */
static bool gpu_reaches(const void *p, size_t bytes)
{
	struct alloc a;

	return find(p, bytes, &a);
}

/* Where the calls here read and write what the caller calls p: device
 * memory through its second mapping, anything else as it is. */
static void *view(const void *p, size_t bytes)
{
	struct alloc a;

	return find(p, bytes, &a) ? a.view + ((const char *)p - a.p) : (void *)p;
}

static void check_all_freed(void)
{
	for (int i = 0; i < MAX_ALLOCS; i++)
		if (allocs[i].p) {
			fprintf(stderr, "FAIL: cuda double: %zu bytes of GPU memory never freed\n", allocs[i].size);
			_Exit(1);
		}
}

static void register_check(void)
{
	atexit(check_all_freed);
}

static void first_alloc(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	pthread_once(&once, register_check);
}

/* Device memory: without access for the caller (fence_map.h). */
static void *device_alloc(size_t bytes)
{
	void *p, *v;
	size_t size;

	first_alloc();
	if (fence_map(bytes, &p, &v, &size))
		return NULL;
	track(p, v, size);
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
	*p = device_alloc(bytes);
	return *p ? 0 : gg_errf(err, err_size, -ENOMEM, "no memory");
}

static atomic_uint device_frees;

void gg_dev_free(void *p)
{
	struct alloc a;

	if (untrack(p, &a)) {
		fence_unmap(a.p, a.view, a.size);
		atomic_fetch_add(&device_frees, 1);
	}
}

unsigned cuda_double_device_frees(void)
{
	return atomic_load(&device_frees);
}

int gg_dev_host_alloc(void **p, size_t bytes, char *err, size_t err_size)
{
	first_alloc();
	*p = calloc(1, bytes ? bytes : 1);
	if (!*p)
		return gg_errf(err, err_size, -ENOMEM, "no memory");
	track(*p, *p, bytes ? bytes : 1);
	return 0;
}

void gg_dev_host_free(void *p)
{
	struct alloc a;

	if (untrack(p, &a))
		free(p);
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

	const size_t floats = w->n * sizeof(float);

	switch (w->op) {
	case OP_COPY:
		memcpy(view(w->dst, w->bytes), view(w->src, w->bytes), w->bytes);
		return 0;
	case OP_ENCODE:
		return gg_codec_encode(&w->p, view(w->src, floats), w->n, view(w->dst, w->bytes), w->bytes);
	case OP_FB_ENCODE:
		fb = (struct gg_feedback){ .residual = view(w->fb->residual, w->fb->elems * sizeof(float)),
					   .elems = w->fb->elems };
		float *scratch = malloc(floats + 1);
		int rc = scratch ? gg_feedback_encode(&fb, &w->p, w->offset, view(w->src, floats), w->n,
						      view(w->dst, w->bytes), w->bytes, scratch)
				 : -ENOMEM;
		free(scratch);
		return rc;
	case OP_DECODE:
		return gg_codec_decode(&w->p, view(w->src, w->bytes), w->bytes, w->n, view(w->dst, floats));
	case OP_DECODE_ACC:
		return gg_codec_decode_acc(&w->p, view(w->src, w->bytes), w->bytes, w->n, view(w->dst, floats));
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
