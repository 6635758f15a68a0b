/* What the GPU codec tests share: the skip without a GPU, CUDA calls that
 * fail the test with file:line, and device buffers with guard bytes. */
#ifndef GG_GPU_TEST_H
#define GG_GPU_TEST_H

#include <dlfcn.h>

#include <cuda_runtime_api.h>

#include "test_util.h"

#define CUDA_OK(call)                                                                               \
	do {                                                                                        \
		cudaError_t e_ = (call);                                                            \
		CHECK(e_ == cudaSuccess, "%s: %s (%s)", #call, cudaGetErrorString(e_), cudaGetErrorName(e_)); \
	} while (0)

/* The number of GPUs. Exits 77 (skipped) where there is none: no CUDA
 * driver at all (the runtime then says the driver is insufficient), or a
 * driver that sees no device. A driver too old for this CUDA, or a device
 * that cannot be used, fails the test instead: a machine with a GPU must
 * not pass by skipping. */
static inline int gpu_test_device_count(void)
{
	int count = 0;
	cudaError_t e = cudaGetDeviceCount(&count);

	if (e == cudaErrorInsufficientDriver && !dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL)) {
		printf("skip: no CUDA driver (libcuda.so.1 cannot be loaded)\n");
		exit(SKIP_EXIT);
	}
	if (e == cudaErrorNoDevice || (e == cudaSuccess && count == 0)) {
		printf("skip: no CUDA device (the driver reports none)\n");
		exit(SKIP_EXIT);
	}
	CHECK(e == cudaSuccess, "cudaGetDeviceCount: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
	return count;
}

/* Exits 77 (skipped) unless a GPU is there; prints which one it is. */
static inline void gpu_test_require_device(void)
{
	struct cudaDeviceProp prop;

	gpu_test_device_count();
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
