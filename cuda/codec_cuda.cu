/* compress/codec.h and the error feedback of compress/feedback.h on the
 * GPU: argument checks, launches and CUDA errors around the kernels of
 * codec_kernels.cuh. */
#include "codec_cuda.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>

#include <cuda.h>
#include <cuda_runtime.h>

#include "cuda_check.h"

/* Launches through cudaLaunchKernel, each argument converted to the type of
 * the kernel's parameter first so that the argument array matches it, on
 * no more blocks than the device holds at once (grid-stride loops). */
template <typename... P>
static cudaError_t launch_typed(void (*kernel)(P...), unsigned blocks, unsigned threads, cudaStream_t st,
				P... args)
{
	void *argv[] = { (void *)&args... };
	int dev, sms, per_sm;
	cudaError_t e;

	if ((e = cudaGetDevice(&dev)) || (e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) ||
	    (e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, (int)threads, 0)))
		return e;
	unsigned full = (unsigned)sms * (unsigned)(per_sm > 0 ? per_sm : 1);
	return cudaLaunchKernel((const void *)kernel, dim3(blocks < full ? blocks : full), dim3(threads), argv, 0, st);
}

template <typename... P, typename... A>
static cudaError_t gg_launch(void (*kernel)(P...), unsigned blocks, unsigned threads, cudaStream_t st, A... args)
{
	return launch_typed<P...>(kernel, blocks, threads, st, static_cast<P>(args)...);
}

#include "codec_kernels.cuh"

/* Errors that stay with the CUDA context (a kernel's fault): every later
 * call of the process on the device fails too. The driver API's codes for
 * them are the same numbers. */
static bool sticky(cudaError_t e)
{
	switch (e) {
	case cudaErrorIllegalAddress:
	case cudaErrorLaunchFailure:
	case cudaErrorIllegalInstruction:
	case cudaErrorMisalignedAddress:
	case cudaErrorInvalidAddressSpace:
	case cudaErrorInvalidPc:
	case cudaErrorHardwareStackError:
	case cudaErrorAssert:
	case cudaErrorLaunchTimeout:
	case cudaErrorECCUncorrectable:
		return true;
	default:
		return false;
	}
}

#define CONTEXT_LOST "; the gateway's CUDA context is lost with it: every later step on its GPU fails until the " \
		     "gateway restarts"

int gg_cuda_fail(cudaError_t e, const char *what, const char *file, int line, char *err, size_t err_size)
{
	int code = -EIO;

	if (e == cudaErrorMemoryAllocation)
		code = -ENOMEM;
	else if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver)
		code = -ENODEV;
	else if (e == cudaErrorInvalidValue)
		code = -EINVAL;
	(void)cudaGetLastError();
	return gg_errf(err, err_size, code, "%s:%d: %s: %s (%s)%s", gg_source_path(file), line, what,
		       cudaGetErrorString(e), cudaGetErrorName(e), sticky(e) ? CONTEXT_LOST : "");
}

int gg_cuda_driver_symbol(const char *symbol, void **fn, char *err, size_t err_size)
{
	cudaDriverEntryPointQueryResult found;

	*fn = NULL;
	/* The call that names the API version came with CUDA 12.5, which
	 * deprecated the other. */
#if CUDART_VERSION >= 12050
	GG_CUDA_CHECK(cudaGetDriverEntryPointByVersion(symbol, fn, 12000, cudaEnableDefault, &found), err, err_size);
#else
	GG_CUDA_CHECK(cudaGetDriverEntryPoint(symbol, fn, cudaEnableDefault, &found), err, err_size);
#endif
	if (found != cudaDriverEntryPointSuccess || !*fn) {
		*fn = NULL;
		return gg_errf(err, err_size, -EIO, "the CUDA driver has no %s (entry point query result %d)", symbol,
			       (int)found);
	}
	return 0;
}

typedef CUresult (*error_name_fn)(CUresult error, const char **name);

/* The driver's name for `result` (cuGetErrorName), or NULL. */
static const char *driver_error_name(int result)
{
	const char *name = NULL;
	void *fn;

	if (gg_cuda_driver_symbol("cuGetErrorName", &fn, NULL, 0) ||
	    ((error_name_fn)fn)((CUresult)result, &name) != CUDA_SUCCESS)
		return NULL;
	return name;
}

int gg_cuda_driver_fail(int result, const char *what, const char *file, int line, char *err, size_t err_size)
{
	const char *name = driver_error_name(result);

	return gg_errf(err, err_size, -EIO, "%s:%d: %s: %s (CUDA driver error %d)%s", gg_source_path(file), line, what,
		       name ? name : "unknown", result, sticky((cudaError_t)result) ? CONTEXT_LOST : "");
}

/* Checks the parameters and computes the encoded size of n elements. */
static int check_params(const struct gg_codec_params *p, size_t n, size_t *bytes, char *err, size_t err_size)
{
	const char *why;
	uint64_t need = 0;

	if (gg_codec_params_check(p, &why))
		return gg_errf(err, err_size, -EINVAL, "codec parameters: %s", why);
	if (gg_codec_encoded_bytes(p, n, &need) || need > SIZE_MAX)
		return gg_errf(err, err_size, -EINVAL, "%zu elements of %s: the encoded size overflows", n,
			       gg_codec_name(p->codec));
	*bytes = (size_t)need;
	return 0;
}

/* `name` points at memory the current device can read and write, 4-byte
 * aligned. */
static int check_memory(const void *ptr, const char *name, char *err, size_t err_size)
{
	cudaPointerAttributes a;
	int dev;

	if (!ptr)
		return gg_errf(err, err_size, -EFAULT, "%s is NULL", name);
	if ((uintptr_t)ptr % 4)
		return gg_errf(err, err_size, -EINVAL, "%s (%p) is not 4-byte aligned", name, ptr);
	GG_CUDA_CHECK(cudaPointerGetAttributes(&a, ptr), err, err_size);
	if (a.type == cudaMemoryTypeUnregistered)
		return gg_errf(err, err_size, -EFAULT,
			       "%s (%p) is memory the GPU cannot address: allocate it with cudaMalloc, "
			       "cudaMallocManaged or cudaHostAlloc, or cudaHostRegister it",
			       name, ptr);
	GG_CUDA_CHECK(cudaGetDevice(&dev), err, err_size);
	if (a.type == cudaMemoryTypeDevice && a.device != dev)
		return gg_errf(err, err_size, -EINVAL, "%s (%p) is on device %d, the current device is %d", name,
			       ptr, a.device, dev);
	return 0;
}

enum op { OP_ENCODE, OP_FEEDBACK_ENCODE, OP_DECODE, OP_DECODE_ACC };

/* Enqueues one operation whose sizes are checked: src and dst as the API
 * names them (for decode_acc dst is acc), res the residuals of the chunk
 * for feedback. `bytes` is the encoded size. */
static int enqueue(const struct gg_codec_params *p, enum op op, const void *src, float *res, size_t n, void *dst,
		   size_t bytes, cudaStream_t st, char *err, size_t err_size)
{
	bool encoding = op == OP_ENCODE || op == OP_FEEDBACK_ENCODE;
	unsigned blocks = blocks_for(p, n);
	int rc;

	if (n == 0)
		return 0;
	if ((rc = check_memory(src, "input", err, err_size)) || (rc = check_memory(dst, "output", err, err_size)))
		return rc;
	switch (op) {
	case OP_ENCODE:
	case OP_DECODE:
		if (p->codec == GG_CODEC_FP32) {
			GG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, st), err, err_size);
			return 0;
		}
		GG_CUDA_CHECK_AS(encoding ? enqueue_encode<false>(p, blocks, st, (const float *)src, NULL, n,
								  (uint8_t *)dst)
					  : enqueue_decode<false>(p, blocks, st, (const uint8_t *)src, n, (float *)dst),
				 encoding ? "launching the encode kernel" : "launching the decode kernel", err, err_size);
		return 0;
	case OP_FEEDBACK_ENCODE:
		GG_CUDA_CHECK_AS(enqueue_encode<true>(p, blocks, st, (const float *)src, res, n, (uint8_t *)dst),
				 "launching the feedback encode kernel", err, err_size);
		return 0;
	case OP_DECODE_ACC:
		GG_CUDA_CHECK_AS(enqueue_decode<true>(p, blocks, st, (const uint8_t *)src, n, (float *)dst),
				 "launching the decode_acc kernel", err, err_size);
		return 0;
	}
	return gg_errf(err, err_size, -EINVAL, "unknown operation %d", (int)op);
}

/* Checks the sizes of an encode: dst_bytes must hold the encoded size. */
static int encode_checked(const struct gg_codec_params *p, enum op op, const float *src, float *res, size_t n,
			  void *dst, size_t dst_bytes, void *stream, char *err, size_t err_size)
{
	size_t need = 0;
	int rc = check_params(p, n, &need, err, err_size);

	if (rc)
		return rc;
	if (dst_bytes < need)
		return gg_errf(err, err_size, -ENOBUFS, "output holds %zu bytes; %zu elements of %s need %zu", dst_bytes,
			       n, gg_codec_name(p->codec), need);
	return enqueue(p, op, src, res, n, dst, need, (cudaStream_t)stream, err, err_size);
}

/* Checks the sizes of a decode: src_bytes must be the encoded size. */
static int decode_checked(const struct gg_codec_params *p, enum op op, const void *src, size_t src_bytes, size_t n,
			  float *out, void *stream, char *err, size_t err_size)
{
	size_t need = 0;
	int rc = check_params(p, n, &need, err, err_size);

	if (rc)
		return rc;
	if (src_bytes != need)
		return gg_errf(err, err_size, -EBADMSG, "%zu elements of %s take %zu bytes, the input has %zu", n,
			       gg_codec_name(p->codec), need, src_bytes);
	return enqueue(p, op, src, NULL, n, out, need, (cudaStream_t)stream, err, err_size);
}

extern "C" int gg_codec_encode_cuda(const struct gg_codec_params *p, const float *src, size_t n, void *dst,
				    size_t dst_bytes, void *stream, char *err, size_t err_size)
{
	return encode_checked(p, OP_ENCODE, src, NULL, n, dst, dst_bytes, stream, err, err_size);
}

extern "C" int gg_codec_decode_cuda(const struct gg_codec_params *p, const void *src, size_t src_bytes, size_t n,
				    float *dst, void *stream, char *err, size_t err_size)
{
	return decode_checked(p, OP_DECODE, src, src_bytes, n, dst, stream, err, err_size);
}

extern "C" int gg_codec_decode_acc_cuda(const struct gg_codec_params *p, const void *src, size_t src_bytes,
					size_t n, float *acc, void *stream, char *err, size_t err_size)
{
	return decode_checked(p, OP_DECODE_ACC, src, src_bytes, n, acc, stream, err, err_size);
}

extern "C" int gg_feedback_init_cuda(struct gg_feedback_cuda *fb, size_t elems, char *err, size_t err_size)
{
	float *r = NULL;

	fb->residual = NULL;
	fb->elems = 0;
	if (elems == 0 || elems > SIZE_MAX / sizeof(float))
		return gg_errf(err, err_size, -EINVAL, "feedback for %zu elements: must be 1 to %zu", elems,
			       SIZE_MAX / sizeof(float));
	GG_CUDA_CHECK(cudaMalloc(&r, elems * sizeof(float)), err, err_size);
	/* cudaMemset runs on the legacy default stream: wait for it, so
	 * that streams which do not synchronize with that one see zeros. */
	cudaError_t e = cudaMemset(r, 0, elems * sizeof(float));
	if (e == cudaSuccess)
		e = cudaStreamSynchronize(0);
	if (e != cudaSuccess) {
		cudaFree(r);
		return gg_cuda_fail(e, "zeroing the residuals", __FILE__, __LINE__, err, err_size);
	}
	fb->residual = r;
	fb->elems = elems;
	return 0;
}

extern "C" void gg_feedback_fini_cuda(struct gg_feedback_cuda *fb)
{
	cudaFree(fb->residual);
	fb->residual = NULL;
	fb->elems = 0;
}

extern "C" int gg_feedback_reset_cuda(struct gg_feedback_cuda *fb, void *stream, char *err, size_t err_size)
{
	GG_CUDA_CHECK(cudaMemsetAsync(fb->residual, 0, fb->elems * sizeof(float), (cudaStream_t)stream), err,
		      err_size);
	return 0;
}

extern "C" int gg_feedback_encode_cuda(struct gg_feedback_cuda *fb, const struct gg_codec_params *p,
				       size_t offset, const float *in, size_t n, void *dst, size_t dst_bytes,
				       void *stream, char *err, size_t err_size)
{
	if (offset > fb->elems || n > fb->elems - offset)
		return gg_errf(err, err_size, -EINVAL, "elements [%zu, %zu + %zu) are outside the %zu of the tensor",
			       offset, offset, n, fb->elems);
	return encode_checked(p, OP_FEEDBACK_ENCODE, in, fb->residual + offset, n, dst, dst_bytes, stream, err,
			      err_size);
}
