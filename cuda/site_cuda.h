/* The gateway's side of GPU mode (gg_allreduce_cuda): the ranks' CUDA
 * allocations opened by IPC handle, the site sum formed from them on the
 * gateway's GPU, and the result written back into them. The sums are the
 * host backend's to the bit (gateway/site/host_sum.h): float32, added in
 * rank order, one IEEE operation at a time with the functions of
 * compress/codec_elem.h; bfloat16 widened exactly and rounded back to
 * nearest even.
 *
 * The GPU is the first one the gateway sees (CUDA_VISIBLE_DEVICES picks
 * it); a rank's memory on another GPU is reached as a peer. Every call
 * sets that device on the calling thread, runs on a stream of the
 * gateway's own and returns once the work is done. Calls must come from
 * one thread at a time (the site backend's loop).
 *
 * Errors: 0 or a negative errno with one line in `err` naming the CUDA call
 * that failed, its file:line and CUDA's message (cuda_check.h): -ENODEV
 * when the gateway has no usable GPU, -EINVAL for a bad handle or size,
 * -ENOMEM, -EIO for the rest.
 *
 * This header is plain C: it compiles without nvcc. */
#ifndef GG_SITE_CUDA_H
#define GG_SITE_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "gg_common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GG_SITE_CUDA_IPC_SIZE 64 /* bytes of a cudaIpcMemHandle_t */

/* Opens the allocation whose IPC handle is `ipc`, of which the rank says it
 * holds `size` bytes: *dev receives its base. Refused (-EINVAL) when the
 * allocation is smaller than `size`. */
GG_MUST_CHECK int gg_site_cuda_open(const unsigned char ipc[GG_SITE_CUDA_IPC_SIZE], uint64_t size, void **dev,
				    char *err, size_t err_size);
/* Closes what gg_site_cuda_open() opened (NULL: nothing). */
void gg_site_cuda_close(void *dev);

/* sum[i] = in[0][i] + in[1][i] + ... + in[n-1][i], i < count, where in[r] are
 * device pointers to float32 (bf16 false) or bfloat16 elements and `sum`
 * is device memory (gg_dev_alloc(), dev_mem.h). n >= 1. */
GG_MUST_CHECK int gg_site_cuda_sum(float *sum, const void *const *in, unsigned n, bool bf16, uint64_t count,
				   char *err, size_t err_size);
/* out[r][i] = sum[i] for every r < n, i < count: float32, or rounded to
 * bfloat16 when bf16. `sum` is device memory, as above. */
GG_MUST_CHECK int gg_site_cuda_store(void *const *out, unsigned n, bool bf16, const float *sum, uint64_t count,
				     char *err, size_t err_size);

/* Enqueues dst[i] = bits for i < count on `stream` (a cudaStream_t of the
 * gateway's GPU) without waiting for it: device memory filled with one
 * 32-bit pattern, such as -0.0f's. */
GG_MUST_CHECK int gg_site_cuda_fill_async(uint32_t *dst, uint32_t bits, uint64_t count, void *stream, char *err,
					  size_t err_size);

#ifdef __cplusplus
}
#endif

#endif
