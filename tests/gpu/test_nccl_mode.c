/* GPU mode with NCCL end to end: one rank of a job that all-reduces CUDA
 * tensors with gg_allreduce_nccl(), through the NCCL communicator it forms
 * with its site's ranks and gateway. tests/gpu/nccl_mode.sh starts the
 * gateways and the ranks, each with its own NCCL_HOSTID so that NCCL lets
 * the ranks and the gateway share one GPU (they then talk over its socket
 * transport, on loopback).
 *
 *   test_nccl_mode --probe
 *       exits 77 (skipped) without a CUDA device, else 0.
 *   test_nccl_mode ENDPOINT JOB RANK NRANKS SITE_INDEX NSITES
 *       runs as one rank.
 *
 * Per rank: a bfloat16 tensor must be refused before anything is sent;
 * then steps of several sizes (odd ones, and 64 MiB) on grid data, whose
 * sum is exact in any order: every result must equal the exact global sum
 * element by element, with the guard bytes around the tensor untouched;
 * then the same tensor through gg_allreduce_cuda() must give the same
 * bytes. It prints the time of each step and `rank ok digest=<hex>` (the
 * same at every rank of every site) and exits 0, or names what failed and
 * exits 1. */
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "gpu_test.h"
#include "gradgate.h"
#include "rank_test.h"

#define GUARD 256
#define GUARD_BYTE 0xA5

static int site_index, rank_index, nranks, nsites;


/* Multiples of 1/64 below 32 in size: sums of a few are exact. */
static float grid_input(int site, int rank, unsigned c, size_t i)
{
	uint64_t r = mix64(((uint64_t)site << 48) ^ ((uint64_t)rank << 32) ^ ((uint64_t)c << 24) ^ (i + 1));

	return (float)((int)(r % 4096) - 2048) / 64.0f;
}

static struct gg_session *sess;

/* A step of `count` floats through NCCL, checked against the exact sum;
 * then the same through gg_allreduce_cuda(), which must agree bit for bit. */
static void nccl_case(unsigned c, size_t count, cudaStream_t stream)
{
	size_t bytes = count * sizeof(float);
	float *in = malloc(bytes), *out = malloc(bytes), *again = malloc(bytes);
	unsigned char *dev = device_alloc(bytes + 2 * GUARD), *back = malloc(bytes + 2 * GUARD);
	struct gg_error err;

	CHECK(in && out && again && back, "out of memory");
	for (size_t i = 0; i < count; i++)
		in[i] = grid_input(site_index, rank_index, c, i);
	/* On `stream`, which the calls synchronize first (it does not wait for
	 * the legacy stream's copies). */
	CUDA_OK(cudaMemsetAsync(dev, GUARD_BYTE, bytes + 2 * GUARD, stream));
	CUDA_OK(cudaMemcpyAsync(dev + GUARD, in, bytes, cudaMemcpyHostToDevice, stream));
	double t0 = now_ms();
	GG_OK(gg_allreduce_nccl(sess, dev + GUARD, count, GG_DTYPE_F32, 2 * c, stream, 0, &err), &err,
	      "gg_allreduce_nccl(%zu floats)", count);
	CUDA_OK(cudaStreamSynchronize(stream));
	double ms = now_ms() - t0;
	CUDA_OK(cudaMemcpy(back, dev, bytes + 2 * GUARD, cudaMemcpyDeviceToHost));
	for (size_t i = 0; i < GUARD; i++)
		CHECK(back[i] == GUARD_BYTE && back[GUARD + bytes + i] == GUARD_BYTE,
		      "case %u: guard byte %zu around the tensor was written", c, i);
	memcpy(out, back + GUARD, bytes);
	for (size_t i = 0; i < count; i++) {
		double sum = 0;
		for (int s = 0; s < nsites; s++)
			for (int r = 0; r < nranks; r++)
				sum += (double)grid_input(s, r, c, i);
		CHECK((double)out[i] == sum, "case %u (%zu floats): element %zu is %.9g, the exact sum %.9g", c, count,
		      i, (double)out[i], sum);
	}

	CUDA_OK(cudaMemcpyAsync(dev + GUARD, in, bytes, cudaMemcpyHostToDevice, stream));
	GG_OK(gg_allreduce_cuda(sess, dev + GUARD, count, GG_DTYPE_F32, 2 * c + 1, stream, 0, &err), &err,
	      "gg_allreduce_cuda(%zu floats)", count);
	CUDA_OK(cudaMemcpy(again, dev + GUARD, bytes, cudaMemcpyDeviceToHost));
	CHECK(!memcmp(out, again, bytes), "case %u: gg_allreduce_nccl and gg_allreduce_cuda differ", c);
	hash_bytes(out, bytes);
	printf("ok case %u: %zu floats through NCCL == exact sum == gg_allreduce_cuda; time %.2f ms (%.2f GB/s of "
	       "tensor)\n", c, count, ms, (double)bytes / ms / 1e6);
	free(in);
	free(out);
	free(again);
	free(back);
	/* The gateway holds the allocation by IPC until the session closes:
	 * freed by the process's exit. */
}

int main(int argc, char **argv)
{
	static const size_t counts[] = { 1, 1000, 4097, 1u << 20, (16u << 20) + 3 };
	struct gg_error err;
	cudaStream_t stream;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 2 && strcmp(argv[1], "--probe") == 0) {
		gpu_test_require_device();
		return 0;
	}
	if (argc != 7) {
		fprintf(stderr, "usage: test_nccl_mode --probe\n"
				"       test_nccl_mode ENDPOINT JOB RANK NRANKS SITE_INDEX NSITES\n");
		return 2;
	}
	nranks = parse_int("test_nccl_mode", argv[4], "NRANKS", 1, 64);
	rank_index = parse_int("test_nccl_mode", argv[3], "RANK", 0, nranks - 1);
	nsites = parse_int("test_nccl_mode", argv[6], "NSITES", 1, 8);
	site_index = parse_int("test_nccl_mode", argv[5], "SITE_INDEX", 0, nsites - 1);

	gpu_test_require_device();
	CUDA_OK(cudaSetDevice(0));
	CUDA_OK(cudaFree(NULL));
	CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
	GG_OK(gg_session_open(argv[1], argv[2], rank_index, nranks, &sess, &err), &err, "gg_session_open(%s, %s)",
	      argv[1], argv[2]);

	/* Refused before anything is sent: the step numbers stay in line. */
	void *small = device_alloc(64);
	int rc = gg_allreduce_nccl(sess, small, 16, GG_DTYPE_BF16, 1, stream, 0, &err);
	CHECK(rc == GG_ERR_INVALID && strstr(err.message, "float32"),
	      "bfloat16 through NCCL: expected GG_ERR_INVALID naming float32, got %d: %s", rc, err.message);

	for (unsigned c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
		nccl_case(c, counts[c], stream);
	gg_session_close(sess);
	CUDA_OK(cudaStreamDestroy(stream));
	printf("rank ok digest=%016" PRIx64 "\n", result_hash);
	return 0;
}
