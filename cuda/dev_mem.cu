/* dev_mem.h: thin wrappers of the CUDA runtime, with its errors as
 * gradgate's. */
#include "dev_mem.h"

#include <cuda_runtime.h>

#include "cuda_check.h"

int gg_cuda_use_gpu(char *err, size_t err_size)
{
	GG_CUDA_CHECK_AS(cudaSetDevice(0), "cudaSetDevice(0) (the gateway's GPU)", err, err_size);
	return 0;
}

extern "C" int gg_dev_stream_new(void **stream, char *err, size_t err_size)
{
	cudaStream_t s = NULL;
	int rc;

	*stream = NULL;
	if ((rc = gg_cuda_use_gpu(err, err_size)))
		return rc;
	GG_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), err, err_size);
	*stream = s;
	return 0;
}

extern "C" void gg_dev_stream_free(void *stream)
{
	if (stream)
		(void)cudaStreamDestroy((cudaStream_t)stream);
}

extern "C" int gg_dev_alloc(void **p, size_t bytes, char *err, size_t err_size)
{
	int rc;

	*p = NULL;
	if ((rc = gg_cuda_use_gpu(err, err_size)))
		return rc;
	GG_CUDA_CHECK(cudaMalloc(p, bytes ? bytes : 1), err, err_size);
	return 0;
}

extern "C" void gg_dev_free(void *p)
{
	if (p)
		(void)cudaFree(p);
}

extern "C" int gg_dev_host_alloc(void **p, size_t bytes, char *err, size_t err_size)
{
	int rc;

	*p = NULL;
	if ((rc = gg_cuda_use_gpu(err, err_size)))
		return rc;
	GG_CUDA_CHECK(cudaHostAlloc(p, bytes ? bytes : 1, cudaHostAllocPortable), err, err_size);
	return 0;
}

extern "C" void gg_dev_host_free(void *p)
{
	if (p)
		(void)cudaFreeHost(p);
}

extern "C" int gg_dev_copy(void *dst, const void *src, size_t bytes, void *stream, char *err, size_t err_size)
{
	int rc;

	if ((rc = gg_cuda_use_gpu(err, err_size)))
		return rc;
	GG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream), err, err_size);
	return 0;
}

extern "C" int gg_dev_sync(void *stream, char *err, size_t err_size)
{
	GG_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)stream), err, err_size);
	return 0;
}
