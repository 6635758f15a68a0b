#include "cuda_probe.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime.h>

#include "cuda_check.h"
#include "gg_build_config.h"
#if HAVE_NCCL
#include <nccl.h>
#endif

extern "C" void gg_cuda_probe(struct gg_cuda_info *info)
{
	memset(info, 0, sizeof(*info));
	cudaRuntimeGetVersion(&info->runtime_version);
	cudaDriverGetVersion(&info->driver_version);
#if HAVE_NCCL
	ncclGetVersion(&info->nccl_version);
#endif
	cudaError_t e = cudaGetDeviceCount(&info->device_count);
	if (e != cudaSuccess) {
		info->device_count = 0;
		snprintf(info->error, sizeof(info->error), "%s",
			 info->driver_version ? cudaGetErrorString(e) : "no NVIDIA driver installed");
		return;
	}
	cudaDeviceProp prop;
	if (info->device_count > 0 && cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
		snprintf(info->device_name, sizeof(info->device_name), "%s", prop.name);
		info->cc_major = prop.major;
		info->cc_minor = prop.minor;
	}
}

__global__ static void fill_pattern(unsigned *out, unsigned n)
{
	unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		out[i] = i * 2654435761u;
}

enum { SELFTEST_N = 1 << 20 };

static int selftest_run(unsigned *dev, unsigned *host, char *err, size_t err_size)
{
	fill_pattern<<<(SELFTEST_N + 255) / 256, 256>>>(dev, SELFTEST_N);
	GG_CUDA_CHECK_AS(cudaGetLastError(), "launching fill_pattern", err, err_size);
	GG_CUDA_CHECK(cudaMemcpy(host, dev, SELFTEST_N * sizeof(unsigned), cudaMemcpyDeviceToHost), err, err_size);
	return 0;
}

extern "C" int gg_cuda_selftest(char *error, unsigned long error_size)
{
	static unsigned host[SELFTEST_N];
	unsigned *dev = NULL;
	int count = 0;

	if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
		snprintf(error, error_size, "no CUDA device");
		return -ENODEV;
	}
	GG_CUDA_CHECK(cudaMalloc(&dev, SELFTEST_N * sizeof(unsigned)), error, error_size);
	int rc = selftest_run(dev, host, error, error_size);
	cudaFree(dev);
	if (rc)
		return rc;
	for (unsigned i = 0; i < SELFTEST_N; i++) {
		if (host[i] != i * 2654435761u) {
			snprintf(error, error_size, "device wrote %#x at %u, expected %#x", host[i], i,
				 i * 2654435761u);
			return -EIO;
		}
	}
	return 0;
}
