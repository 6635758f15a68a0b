/* Memory and streams of the gateway's GPU, for C code that keeps tensors
 * there (gateway/engine/mem_cuda.c): device and pinned host allocations,
 * copies between any two of them, a stream of one's own and a wait for it.
 *
 * The GPU is the first one the gateway sees (CUDA_VISIBLE_DEVICES picks
 * it), as in site_cuda.h; every call sets it on the calling thread first.
 * Errors: 0 or a negative errno with one line in err naming the CUDA call,
 * its file:line and CUDA's message (cuda_check.h).
 *
 * This header is plain C: it compiles without nvcc. */
#ifndef GG_DEV_MEM_H
#define GG_DEV_MEM_H

#include <stddef.h>

#include "gg_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A stream that does not wait for the legacy default stream. */
GG_MUST_CHECK int gg_dev_stream_new(void **stream, char *err, size_t err_size);
void gg_dev_stream_free(void *stream); /* NULL: nothing */

/* bytes of device memory (*p NULL on failure). */
GG_MUST_CHECK int gg_dev_alloc(void **p, size_t bytes, char *err, size_t err_size);
void gg_dev_free(void *p); /* NULL: nothing */

/* bytes of pinned host memory, which kernels read and write directly. */
GG_MUST_CHECK int gg_dev_host_alloc(void **p, size_t bytes, char *err, size_t err_size);
void gg_dev_host_free(void *p); /* NULL: nothing */

/* Enqueues dst[0..bytes) = src[0..bytes) on the stream; either may be
 * device or host memory (the runtime tells which). */
GG_MUST_CHECK int gg_dev_copy(void *dst, const void *src, size_t bytes, void *stream, char *err,
			      size_t err_size);

/* Waits until everything enqueued on the stream is done; a fault of a
 * kernel that ran on it shows up here. */
GG_MUST_CHECK int gg_dev_sync(void *stream, char *err, size_t err_size);

#ifdef __cplusplus
}
#endif

#endif
