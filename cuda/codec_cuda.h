/* The codecs of compress/codec.h and the error feedback of
 * compress/feedback.h on a CUDA device: the same operations on memory the
 * GPU addresses, giving the same bytes as the CPU reference for the same
 * input. The kernels compute every element with the functions of
 * compress/codec_elem.h, the ones the reference runs; tests/gpu checks
 * them against the reference bit for bit.
 *
 * What is equal: encoded bytes always (NaN inputs included); decoded and
 * accumulated floats bit for bit, except that of a NaN only "is NaN" is
 * kept (codec.h: sign and payload are not part of the contract).
 *
 * Memory: every pointer must be addressable by the current device:
 * cudaMalloc'd memory on this device, managed memory, or pinned host
 * memory (cudaHostAlloc, cudaHostRegister); and 4-byte aligned. Memory
 * the GPU cannot reach (plain malloc) is refused with -EFAULT, before
 * anything runs. Buffers of one call must not overlap.
 *
 * Streams: `stream` is a cudaStream_t (NULL: the default stream). The
 * calls check their arguments, enqueue their work on the stream and
 * return; the results are there once the stream reaches that point. A
 * fault while the kernels run shows up at the next call that
 * synchronizes (cudaStreamSynchronize), like any CUDA error.
 *
 * Errors: each call returns 0 or a negative errno and, when err_size > 0,
 * writes one line about the failure into err: for a CUDA failure the call
 * that failed, its file:line and CUDA's message. -EINVAL (parameters,
 * alignment, a pointer on another device), -ENOBUFS / -EBADMSG (sizes, as
 * compress/codec.h), -EFAULT (memory the GPU cannot address), -ENOMEM,
 * -ENODEV (no usable GPU), -EIO (any other CUDA error).
 *
 * This header is plain C: it compiles without nvcc. */
#ifndef GG_CODEC_CUDA_H
#define GG_CODEC_CUDA_H

#include <stddef.h>

#include "codec.h"
#include "gg_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Encodes src[0..n) into dst, which must hold dst_bytes >=
 * gg_codec_encoded_bytes() bytes; exactly that many are written. */
GG_MUST_CHECK int gg_codec_encode_cuda(const struct gg_codec_params *p, const float *src, size_t n,
				       void *dst, size_t dst_bytes, void *stream, char *err,
				       size_t err_size);

/* Decodes n elements from src, whose src_bytes must equal the encoded
 * size exactly: decode stores them into dst, decode_acc adds them into acc
 * (acc[i] = acc[i] + x'[i]). Summing K sites' frames in a fixed order is
 * one decode of the first and a decode_acc of each next one, as the CPU
 * path does. */
GG_MUST_CHECK int gg_codec_decode_cuda(const struct gg_codec_params *p, const void *src, size_t src_bytes,
				       size_t n, float *dst, void *stream, char *err, size_t err_size);
GG_MUST_CHECK int gg_codec_decode_acc_cuda(const struct gg_codec_params *p, const void *src,
					   size_t src_bytes, size_t n, float *acc, void *stream, char *err,
					   size_t err_size);

/* Error feedback with the residuals on the device: one fp32 per tensor
 * element, as compress/feedback.h. */
struct gg_feedback_cuda {
	float *residual; /* device memory, elems floats; owned */
	size_t elems;
};

/* Allocates the residuals on the current device and sets them to 0
 * (synchronously). Returns 0, -EINVAL (elems 0 or too large), -ENOMEM or
 * a CUDA error. On failure *fb holds nothing to free. */
GG_MUST_CHECK int gg_feedback_init_cuda(struct gg_feedback_cuda *fb, size_t elems, char *err,
					size_t err_size);
/* Frees the residuals (after the work using them is done); a second call
 * does nothing. */
void gg_feedback_fini_cuda(struct gg_feedback_cuda *fb);
/* Sets every residual to 0, on the stream. */
GG_MUST_CHECK int gg_feedback_reset_cuda(struct gg_feedback_cuda *fb, void *stream, char *err,
					 size_t err_size);

/* One kernel pass of gg_feedback_encode(): for the chunk at `offset` of
 * the tensor, c = in + residual, encodes c into dst as
 * gg_codec_encode_cuda() does, and sets residual = c - decode(dst) where
 * that is finite, else 0. The same bytes and residuals as the CPU's
 * gg_feedback_encode() on the same input and residuals. -EINVAL when the
 * range is outside the tensor. Chunks of one tensor may be encoded at
 * once on different streams when their ranges do not overlap. */
GG_MUST_CHECK int gg_feedback_encode_cuda(struct gg_feedback_cuda *fb, const struct gg_codec_params *p,
					  size_t offset, const float *in, size_t n, void *dst,
					  size_t dst_bytes, void *stream, char *err, size_t err_size);

#ifdef __cplusplus
}
#endif

#endif
