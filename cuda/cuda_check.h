/* CUDA runtime calls that return an error naming the call and its
 * file:line, never an assert that vanishes in a release build. For the
 * .cu files of this folder, and the C files that call the runtime
 * themselves (gateway/site/site_nccl.c). */
#ifndef GG_CUDA_CHECK_H
#define GG_CUDA_CHECK_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Writes "file:line: what: CUDA's message (its error name)" into err,
 * with "; the gateway's CUDA context is lost with it: ..." after an error
 * the context keeps (an illegal address, an uncorrectable ECC error), and
 * returns e as a negative errno: -ENOMEM, -ENODEV (no usable GPU or
 * driver), -EINVAL, or -EIO for the rest. Clears the runtime's last
 * error, so a later launch check does not report this one again. */
int gg_cuda_fail(cudaError_t e, const char *what, const char *file, int line, char *err, size_t err_size);

/* The same for a driver API call's CUresult `result`: "file:line: what:
 * CUDA_ERROR_NAME (CUDA driver error N)", -EIO. */
int gg_cuda_driver_fail(int result, const char *what, const char *file, int line, char *err, size_t err_size);

/* A CUDA driver entry point, looked up through the runtime, so that the
 * gateway needs no driver library to link or start: 0 with *fn set, or
 * an error naming the symbol (*fn NULL). */
int gg_cuda_driver_symbol(const char *symbol, void **fn, char *err, size_t err_size);

#define GG_CUDA_CHECK_AS(call, what, err, err_size)                                               \
	do {                                                                                       \
		cudaError_t gg_e_ = (call);                                                        \
		if (gg_e_ != cudaSuccess)                                                          \
			return gg_cuda_fail(gg_e_, (what), __FILE__, __LINE__, (err), (err_size)); \
	} while (0)

/* Runs `call` (a CUDA runtime call); on failure returns from the calling
 * function with gg_cuda_fail()'s code. */
#define GG_CUDA_CHECK(call, err, err_size) GG_CUDA_CHECK_AS(call, #call, err, err_size)

/* Makes the gateway's GPU (the first it sees: CUDA_VISIBLE_DEVICES picks
 * it) the calling thread's current device. Returns 0 or gg_cuda_fail()'s
 * code. */
int gg_cuda_use_gpu(char *err, size_t err_size);

#ifdef __cplusplus
}
#endif

#endif
