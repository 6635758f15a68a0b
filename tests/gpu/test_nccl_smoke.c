/* NCCL works on this machine: an all-reduce over every local GPU (one
 * communicator per device in this process) sums exactly. */
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#define MAX_DEV 16
#define COUNT (1 << 20)

#define CUDA_OK(call)                                                                          \
	do {                                                                                   \
		cudaError_t e_ = (call);                                                       \
		if (e_ != cudaSuccess) {                                                       \
			printf("FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
			return 1;                                                              \
		}                                                                              \
	} while (0)
#define NCCL_OK(call)                                                                          \
	do {                                                                                   \
		ncclResult_t r_ = (call);                                                      \
		if (r_ != ncclSuccess) {                                                       \
			printf("FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #call, ncclGetErrorString(r_)); \
			return 1;                                                              \
		}                                                                              \
	} while (0)

int main(void)
{
	int ndev = 0, version = 0;
	ncclComm_t comms[MAX_DEV];
	float *buf[MAX_DEV];
	cudaStream_t streams[MAX_DEV];
	static float host[COUNT];

	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
		printf("skip: no CUDA device\n");
		return 77;
	}
	if (ndev > MAX_DEV)
		ndev = MAX_DEV;
	NCCL_OK(ncclGetVersion(&version));
	NCCL_OK(ncclCommInitAll(comms, ndev, NULL));
	for (int d = 0; d < ndev; d++) {
		for (int i = 0; i < COUNT; i++)
			host[i] = (float)((i % 1000) * (d + 1)) * 0.25f;
		CUDA_OK(cudaSetDevice(d));
		CUDA_OK(cudaStreamCreate(&streams[d]));
		CUDA_OK(cudaMalloc((void **)&buf[d], sizeof(host)));
		CUDA_OK(cudaMemcpy(buf[d], host, sizeof(host), cudaMemcpyHostToDevice));
	}
	NCCL_OK(ncclGroupStart());
	for (int d = 0; d < ndev; d++)
		NCCL_OK(ncclAllReduce(buf[d], buf[d], COUNT, ncclFloat, ncclSum, comms[d], streams[d]));
	NCCL_OK(ncclGroupEnd());
	int bad = 0;
	for (int d = 0; d < ndev; d++) {
		CUDA_OK(cudaSetDevice(d));
		CUDA_OK(cudaStreamSynchronize(streams[d]));
		CUDA_OK(cudaMemcpy(host, buf[d], sizeof(host), cudaMemcpyDeviceToHost));
		for (int i = 0; i < COUNT && bad < 5; i++) {
			/* Small integers times 0.25: every partial sum is exact in fp32. */
			float want = (float)((i % 1000) * (ndev * (ndev + 1) / 2)) * 0.25f;
			if (host[i] != want) {
				printf("FAIL device %d element %d: %g, expected %g\n", d, i, host[i], want);
				bad++;
			}
		}
		cudaFree(buf[d]);
		cudaStreamDestroy(streams[d]);
		ncclCommDestroy(comms[d]);
	}
	if (bad)
		return 1;
	printf("nccl %d: all-reduce of %d floats over %d device(s) exact\n", version, COUNT, ndev);
	return 0;
}
