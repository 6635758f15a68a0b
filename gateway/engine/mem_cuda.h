/* Step tensors on the gateway's GPU (struct gg_ar_mem): a step's input,
 * result and ring scratch are device memory, and the codecs run as the
 * kernels of cuda/codec_cuda.h, which give the CPU reference's bytes. The
 * host moves encoded bytes only: an encode kernel writes a chunk's codec
 * bytes into pinned staging memory, which the host copies into the frame
 * and wraps (header, CRC-32C, zstd); a received frame is unwrapped on the
 * host, its codec bytes copied into staging, and a decode kernel stores or
 * adds them into device memory. With error feedback the residuals are on
 * the device too (gg_feedback_cuda), one set per job's tensor that the
 * lanes share: their chunks never overlap.
 *
 * One gg_ar_mem_cuda per thread that runs steps (a lane): it holds that
 * thread's stream, staging memory and spare ring scratch, and each call
 * waits for its own work before it returns. Built only with CUDA. */
#ifndef GG_MEM_CUDA_H
#define GG_MEM_CUDA_H

#include "allreduce.h"
#include "codec_cuda.h"

#include <stdatomic.h>

#define GG_MEM_CUDA_SPARES 4
/* Ring scratch a lane keeps at most: its spares, and more while frees are
 * held (beyond that, it is freed anyway). */
#define GG_MEM_CUDA_KEPT 36

struct gg_ar_mem_cuda {
	struct gg_ar_mem mem; /* what a step's config points at */
	struct gg_ar_mem_cuda *lane; /* whose stream, staging and spares: itself, or what a view was made of */
	void *stream;
	uint8_t *staging;     /* pinned, staging_bytes */
	size_t staging_bytes;
	struct gg_feedback_cuda *fb;
	/* Ring scratch that finished steps gave back, kept for the next ones
	 * (freeing device memory waits for the whole GPU); the lane's only:
	 * GG_MEM_CUDA_SPARES buffers, and while *frees_held (NULL: never) up
	 * to GG_MEM_CUDA_KEPT, since an NCCL call of the gateway's may then
	 * run, which cudaFree would wait for, on this thread too (the node's
	 * loop is a lane's). Those beyond the spares are freed once frees are
	 * let go, at the lane's next step. */
	struct {
		float *p;
		uint64_t n;
	} kept[GG_MEM_CUDA_KEPT];
	const atomic_bool *frees_held;
};

/* Sets up `m` for frames whose codec bytes are at most max_raw_bytes (the
 * frame decoder's limit), with error feedback into `fb` (device residuals
 * covering the steps' tensors; NULL: none), which must outlive it. Returns
 * 0, or a negative errno with err saying why (no GPU: -ENODEV); on failure
 * there is nothing to free. */
GG_MUST_CHECK int gg_ar_mem_cuda_init(struct gg_ar_mem_cuda *m, size_t max_raw_bytes, struct gg_feedback_cuda *fb,
				      char *err, size_t err_size);
/* After every step using it, or a view of it, is freed; frees the spares. */
void gg_ar_mem_cuda_fini(struct gg_ar_mem_cuda *m);
/* `view` uses m's stream and staging with error feedback of its own (fb:
 * one job's tensor; NULL: none), for steps of the same thread as m: each
 * call waits for its own work, so they share them safely. A view owns
 * nothing (no fini) and is valid while m is. */
void gg_ar_mem_cuda_view(struct gg_ar_mem_cuda *view, const struct gg_ar_mem_cuda *m, struct gg_feedback_cuda *fb);

#endif
