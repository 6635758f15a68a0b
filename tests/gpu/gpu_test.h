/* What the GPU codec tests share: the skip without a GPU, CUDA calls that
 * fail the test with file:line, and device buffers with guard bytes. */
#ifndef GG_GPU_TEST_H
#define GG_GPU_TEST_H

#include <cuda_runtime_api.h>

#include "test_util.h"

#define CUDA_OK(call)                                                                               \
	do {                                                                                        \
		cudaError_t e_ = (call);                                                            \
		CHECK(e_ == cudaSuccess, "%s: %s (%s)", #call, cudaGetErrorString(e_), cudaGetErrorName(e_)); \
	} while (0)

/* Exits 77 (skipped) unless a GPU is there; prints which one it is. */
static inline void gpu_test_require_device(void)
{
	struct cudaDeviceProp prop;
	int count = 0;
	cudaError_t e = cudaGetDeviceCount(&count);

	if (e != cudaSuccess || count == 0) {
		printf("skip: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "the driver reports none");
		exit(SKIP_EXIT);
	}
	CUDA_OK(cudaGetDeviceProperties(&prop, 0));
	printf("device 0: %s (sm_%d%d), %d SMs, %.1f GiB\n", prop.name, prop.major, prop.minor,
	       prop.multiProcessorCount, (double)prop.totalGlobalMem / (1u << 30));
}

__attribute__((unused)) static void *device_alloc(size_t bytes)
{
	void *p = NULL;
	CUDA_OK(cudaMalloc(&p, bytes ? bytes : 1));
	return p;
}

#endif
