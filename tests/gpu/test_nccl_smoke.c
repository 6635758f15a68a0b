/* NCCL works on this machine, in the pattern GPU mode's site backend uses
 * (the ranks reduce to one rank, which broadcasts the result back), over
 * every local GPU with one communicator per device in this process: an
 * all-reduce, a reduce to the last device and a broadcast from it, each
 * exact. With one GPU each is a copy, which still checks the library and
 * the calls. */
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "gpu_test.h"

#define MAX_DEV 16
#define COUNT (1 << 20)

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

	ndev = gpu_test_device_count();
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
				printf("FAIL all-reduce: device %d element %d: %g, expected %g\n", d, i, host[i], want);
				bad++;
			}
		}
	}

	/* Reduce to the last device (the gateway's rank in GPU mode): every
	 * device now holds the all-reduced sum, so the root gets ndev times it. */
	const int root = ndev - 1;
	NCCL_OK(ncclGroupStart());
	for (int d = 0; d < ndev; d++)
		NCCL_OK(ncclReduce(buf[d], buf[d], COUNT, ncclFloat, ncclSum, root, comms[d], streams[d]));
	NCCL_OK(ncclGroupEnd());
	CUDA_OK(cudaSetDevice(root));
	CUDA_OK(cudaStreamSynchronize(streams[root]));
	CUDA_OK(cudaMemcpy(host, buf[root], sizeof(host), cudaMemcpyDeviceToHost));
	for (int i = 0; i < COUNT && bad < 10; i++) {
		float want = (float)((i % 1000) * (ndev * (ndev + 1) / 2) * ndev) * 0.25f;
		if (host[i] != want) {
			printf("FAIL reduce: root %d element %d: %g, expected %g\n", root, i, host[i], want);
			bad++;
		}
	}

	/* Broadcast a pattern of the root's to every device. */
	for (int i = 0; i < COUNT; i++)
		host[i] = (float)(i % 4093) - 2046.5f;
	CUDA_OK(cudaMemcpy(buf[root], host, sizeof(host), cudaMemcpyHostToDevice));
	NCCL_OK(ncclGroupStart());
	for (int d = 0; d < ndev; d++)
		NCCL_OK(ncclBroadcast(buf[d], buf[d], COUNT, ncclFloat, root, comms[d], streams[d]));
	NCCL_OK(ncclGroupEnd());
	for (int d = 0; d < ndev; d++) {
		CUDA_OK(cudaSetDevice(d));
		CUDA_OK(cudaStreamSynchronize(streams[d]));
		CUDA_OK(cudaMemcpy(host, buf[d], sizeof(host), cudaMemcpyDeviceToHost));
		for (int i = 0; i < COUNT && bad < 15; i++) {
			float want = (float)(i % 4093) - 2046.5f;
			if (host[i] != want) {
				printf("FAIL broadcast: device %d element %d: %g, expected %g\n", d, i, host[i], want);
				bad++;
			}
		}
		cudaFree(buf[d]);
		cudaStreamDestroy(streams[d]);
		ncclCommDestroy(comms[d]);
	}
	if (bad)
		return 1;
	printf("nccl %d: all-reduce, reduce to device %d and broadcast from it of %d floats over %d device(s) exact\n",
	       version, root, COUNT, ndev);
	return 0;
}
