/* GPU mode at the gateway (site_cuda.h): IPC handles, the site sum and
 * the result's way back into the ranks' memory. */
#include "site_cuda.h"

#include <errno.h>
#include <string.h>

#include <cuda.h>
#include <cuda_runtime.h>

#include "codec_elem.h"
#include "cuda_check.h"

#define THREADS 256u
#define RANKS_PER_LAUNCH 16u /* rank pointers one kernel takes by value */

struct rank_ptrs {
	void *p[RANKS_PER_LAUNCH];
};

/* The device and stream of every call: set up by the first. */
static cudaStream_t stream;
static bool ready;

static int use_gpu(char *err, size_t err_size)
{
	int rc = gg_cuda_use_gpu(err, err_size);

	if (rc)
		return rc;
	if (!ready) {
		GG_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), err, err_size);
		ready = true;
	}
	return 0;
}

static unsigned blocks_for(uint64_t count)
{
	int dev = 0, sms = 132;

	if (cudaGetDevice(&dev) != cudaSuccess ||
	    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
		sms = 132;
	uint64_t want = (count + THREADS - 1) / THREADS, most = (uint64_t)sms * 8u;
	return (unsigned)(want < most ? want : most);
}

template <bool BF16> __device__ static inline float load(const void *p, uint64_t i)
{
	if (BF16)
		return gg_bf16_to_f32(((const uint16_t *)p)[i]);
	return ((const float *)p)[i];
}

/* Adds ranks [0, n) of `in`, in order, to sum[] (or, when first, sets
 * sum[] to their sum). */
template <bool BF16> __global__ static void sum_kernel(float *sum, rank_ptrs in, unsigned n, bool first, uint64_t count)
{
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < count;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		unsigned r = first ? 1u : 0u;
		float s = first ? load<BF16>(in.p[0], i) : sum[i];
		for (; r < n; r++)
			s = gg_fadd(s, load<BF16>(in.p[r], i));
		sum[i] = s;
	}
}

template <bool BF16> __global__ static void store_kernel(rank_ptrs out, unsigned n, const float *sum, uint64_t count)
{
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < count;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		float v = sum[i];
		if (BF16) {
			uint16_t b = gg_bf16_from_f32(v);
			for (unsigned r = 0; r < n; r++)
				((uint16_t *)out.p[r])[i] = b;
		} else {
			for (unsigned r = 0; r < n; r++)
				((float *)out.p[r])[i] = v;
		}
	}
}

/* cuMemGetAddressRange through the runtime, so that the gateway needs no
 * driver library to link or start. */
typedef CUresult (*address_range_fn)(CUdeviceptr *base, size_t *size, CUdeviceptr ptr);

static int allocation_size(void *dev, size_t *size, char *err, size_t err_size)
{
	static address_range_fn range;
	CUdeviceptr base = 0;

	if (!range) {
		void *fn;
		int rc = gg_cuda_driver_symbol("cuMemGetAddressRange", &fn, err, err_size);
		if (rc)
			return rc;
		range = (address_range_fn)fn;
	}
	CUresult r = range(&base, size, (CUdeviceptr)dev);
	if (r != CUDA_SUCCESS)
		return gg_cuda_driver_fail((int)r, "cuMemGetAddressRange on the opened device memory", __FILE__,
					   __LINE__, err, err_size);
	if ((void *)base != dev)
		return gg_errf(err, err_size, -EINVAL, "the IPC handle opened inside an allocation, not at its start");
	return 0;
}

extern "C" int gg_site_cuda_open(const unsigned char ipc[GG_SITE_CUDA_IPC_SIZE], uint64_t size, void **dev,
				 char *err, size_t err_size)
{
	cudaIpcMemHandle_t h;
	void *p = NULL;
	size_t have = 0;
	int rc;

	static_assert(sizeof(h) == GG_SITE_CUDA_IPC_SIZE, "cudaIpcMemHandle_t size");
	*dev = NULL;
	if ((rc = use_gpu(err, err_size)))
		return rc;
	memcpy(&h, ipc, sizeof(h));
	GG_CUDA_CHECK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), err, err_size);
	if ((rc = allocation_size(p, &have, err, err_size))) {
		(void)cudaIpcCloseMemHandle(p);
		return rc;
	}
	if (have < size) {
		(void)cudaIpcCloseMemHandle(p);
		return gg_errf(err, err_size, -EINVAL, "the rank says its allocation holds %llu bytes, but it holds %zu",
			       (unsigned long long)size, have);
	}
	*dev = p;
	return 0;
}

extern "C" void gg_site_cuda_close(void *dev)
{
	if (dev && cudaSetDevice(0) == cudaSuccess)
		(void)cudaIpcCloseMemHandle(dev);
}

/* A <<<>>> launch's error is read from cudaGetLastError(), which also
 * holds the error of an earlier call on this thread whose outcome was
 * ignored (closing an IPC handle, freeing): cleared before a launch, so
 * that a launch is not failed for it. A sticky error (a kernel that
 * faulted) stays, and fails the launch as it should. */
static void clear_last_error(void)
{
	(void)cudaGetLastError();
}

/* Runs the sum (store false) or the result kernel over ranks' pointers,
 * RANKS_PER_LAUNCH at a time in rank order, on `sum` (device memory) and
 * waits for them. */
static int over_ranks(bool store, void *const *ptrs, unsigned n, bool bf16, const float *sum, uint64_t count,
		      char *err, size_t err_size)
{
	float *dsum = (float *)sum;
	int rc;

	if (!n || !count)
		return gg_errf(err, err_size, -EINVAL, "%s of %u ranks and %llu elements",
			       store ? "a result" : "a site sum", n, (unsigned long long)count);
	if ((rc = use_gpu(err, err_size)))
		return rc;
	unsigned blocks = blocks_for(count);
	clear_last_error();
	for (unsigned r0 = 0; r0 < n; r0 += RANKS_PER_LAUNCH) {
		rank_ptrs p = {};
		unsigned m = n - r0 < RANKS_PER_LAUNCH ? n - r0 : RANKS_PER_LAUNCH;
		for (unsigned r = 0; r < m; r++)
			p.p[r] = ptrs[r0 + r];
		if (store && bf16)
			store_kernel<true><<<blocks, THREADS, 0, stream>>>(p, m, dsum, count);
		else if (store)
			store_kernel<false><<<blocks, THREADS, 0, stream>>>(p, m, dsum, count);
		else if (bf16)
			sum_kernel<true><<<blocks, THREADS, 0, stream>>>(dsum, p, m, r0 == 0, count);
		else
			sum_kernel<false><<<blocks, THREADS, 0, stream>>>(dsum, p, m, r0 == 0, count);
		GG_CUDA_CHECK_AS(cudaGetLastError(), store ? "launching the result kernel" : "launching the site sum kernel",
				 err, err_size);
	}
	GG_CUDA_CHECK_AS(cudaStreamSynchronize(stream),
			 store ? "cudaStreamSynchronize (the result)" : "cudaStreamSynchronize (the site sum)", err,
			 err_size);
	return 0;
}

extern "C" int gg_site_cuda_sum(float *sum, const void *const *in, unsigned n, bool bf16, uint64_t count,
				char *err, size_t err_size)
{
	return over_ranks(false, (void *const *)in, n, bf16, sum, count, err, err_size);
}

extern "C" int gg_site_cuda_store(void *const *out, unsigned n, bool bf16, const float *sum, uint64_t count,
				  char *err, size_t err_size)
{
	return over_ranks(true, out, n, bf16, sum, count, err, err_size);
}

__global__ static void fill_kernel(uint32_t *dst, uint32_t bits, uint64_t count)
{
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < count;
	     i += (uint64_t)gridDim.x * blockDim.x)
		dst[i] = bits;
}

extern "C" int gg_site_cuda_fill_async(uint32_t *dst, uint32_t bits, uint64_t count, void *on, char *err,
				       size_t err_size)
{
	int rc = gg_cuda_use_gpu(err, err_size);

	if (rc || !count)
		return rc;
	clear_last_error();
	fill_kernel<<<blocks_for(count), THREADS, 0, (cudaStream_t)on>>>(dst, bits, count);
	GG_CUDA_CHECK_AS(cudaGetLastError(), "launching the fill kernel", err, err_size);
	return 0;
}
