#include "cuda_probe.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime.h>

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

extern "C" int gg_cuda_selftest(char *error, unsigned long error_size)
{
	enum { N = 1 << 20 };
	static unsigned host[N];
	unsigned *dev = NULL;
	int count = 0;
	cudaError_t e;

	if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
		snprintf(error, error_size, "no CUDA device");
		return -ENODEV;
	}
	if ((e = cudaMalloc(&dev, N * sizeof(unsigned))) != cudaSuccess)
		goto fail;
	fill_pattern<<<(N + 255) / 256, 256>>>(dev, N);
	if ((e = cudaGetLastError()) != cudaSuccess)
		goto fail;
	if ((e = cudaMemcpy(host, dev, sizeof(host), cudaMemcpyDeviceToHost)) != cudaSuccess)
		goto fail;
	cudaFree(dev);
	for (unsigned i = 0; i < N; i++) {
		if (host[i] != i * 2654435761u) {
			snprintf(error, error_size, "device wrote %#x at %u, expected %#x", host[i], i,
				 i * 2654435761u);
			return -EIO;
		}
	}
	return 0;
fail:
	snprintf(error, error_size, "%s:%d: %s", __FILE__, __LINE__, cudaGetErrorString(e));
	cudaFree(dev);
	return -EIO;
}
