/* GPU mode end to end: one rank of a job that all-reduces tensors in CUDA
 * device memory with gg_allreduce_cuda() and the same inputs in host memory
 * with gg_allreduce(), and requires the same result bytes from both.
 * tests/gpu/gpu_mode.sh starts the gateways and the ranks.
 *
 *   test_gpu_mode --probe
 *       exits 77 (skipped) without a CUDA device, else 0.
 *   test_gpu_mode ENDPOINT JOB RANK NRANKS SITE_INDEX [NSITES] [--lossy]
 *       runs as one rank. With NSITES, the last step is also checked
 *       against the exact global sum (grid data, exact in any order).
 *       --lossy: the gateways run a lossy codec (with error feedback,
 *       device residuals against host ones), so neither that sum nor the
 *       classes of inf/NaN results (3. below) are checked; device and
 *       host results must still be equal.
 *
 * Per rank, in this order (every rank does the same steps, so they stay in
 * step):
 *   1. calls that must be refused before anything is sent (no step number):
 *      host memory, NULL, count 0, a misaligned pointer, managed memory,
 *      an unknown dtype: each with its code and a message naming it;
 *   2. for each case (count, dtype): a device step (tensor 2*case) on
 *      memory 256 bytes into a cudaMalloc allocation, between guard bytes
 *      that must survive, then a host step (tensor 2*case+1) on the same
 *      input: the results must be equal byte for byte;
 *   3. inf/NaN inputs (f32): device and host equal element by element, any
 *      NaN equal to any NaN, and each element of the expected class;
 *   4. one step where rank 0 passes host memory and the others device
 *      memory: GG_ERR_MISMATCH at every rank, buffers unchanged;
 *   5. one more device step (legacy default stream) that must succeed;
 *   6. steps on one allocation again and again, then on more allocations
 *      than the session's max_buffers, each equal to a host step; the
 *      allocations are freed after the session is closed.
 * It prints `rank ok digest=<16 hex digits>` (FNV-1a 64 of every result,
 * the same at every rank of every site) and exits 0; on any failure it
 * names what failed (file:line) on stderr and exits 1.
 *
 * Device memory handed to the library is freed only after the session is
 * closed (the last step's allocations; the process's exit gives back the
 * rest): the gateway holds it open by CUDA IPC until then, and cudaFree
 * before the importer closes it is undefined. */
#include <inttypes.h>
#include <math.h>
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

#define GUARD 256        /* bytes before and after each device tensor */
#define GUARD_BYTE 0xA5
#define NAN_COUNT 4099
#define MIXED_COUNT 1000
#define FINAL_COUNT 4096
#define TENSOR_NAN 100   /* device; host is +1 */
#define TENSOR_MIXED 200
#define TENSOR_FINAL 300 /* device; host is +1 */
#define TENSOR_REUSE 500 /* device; host is +1 */
#define REGION_COUNT 1024
#define MAX_ALLOCS 128

struct tcase {
	size_t count;
	enum gg_dtype dtype;
};

static const struct tcase cases[] = {
	{ 1, GG_DTYPE_F32 },
	{ 7, GG_DTYPE_F32 },
	{ 1000, GG_DTYPE_F32 },
	{ 65537, GG_DTYPE_F32 },
	{ (1u << 20) + 3, GG_DTYPE_F32 },
	{ 16777216, GG_DTYPE_F32 }, /* 64 MiB: timed */
	{ 1, GG_DTYPE_BF16 },
	{ 7, GG_DTYPE_BF16 },
	{ 1000, GG_DTYPE_BF16 },
	{ 65537, GG_DTYPE_BF16 },
	{ (1u << 20) + 3, GG_DTYPE_BF16 },
};
#define NCASES (sizeof(cases) / sizeof(cases[0]))

static struct gg_session *sess;
static int site_index, rank_index;
static bool lossy; /* --lossy */

/* A gradgate call that must succeed: names the call, its code and message. */

static const char *dtype_name(enum gg_dtype dtype)
{
	return dtype == GG_DTYPE_F32 ? "f32" : dtype == GG_DTYPE_BF16 ? "bf16" : "?";
}

static uint64_t input_seed(int site, int rank, unsigned case_index)
{
	return mix64(0x6770756d6f6465ull ^ ((uint64_t)(unsigned)site << 48) ^ ((uint64_t)(unsigned)rank << 40) ^
		     ((uint64_t)case_index << 32));
}

/* Element i of an input: finite float32 bits of mixed sign and magnitude
 * (2^-40 to 2^21), 1/64 each +0.0, -0.0 and subnormals. */
static uint32_t input_f32_bits(uint64_t seed, size_t i)
{
	uint64_t r = mix64(seed + (uint64_t)(i + 1) * 0x9e3779b97f4a7c15ull);
	uint32_t sign = (uint32_t)(r >> 6 & 1) << 31;
	uint32_t mant = (uint32_t)(r >> 8) & 0x7fffffu;

	switch (r & 63) {
	case 0:
		return 0;
	case 1:
		return 0x80000000u;
	case 2:
		return sign | mant; /* subnormal (or a zero) */
	default:
		return sign | ((uint32_t)((r >> 32) % 61u) + 127u - 40u) << 23 | mant;
	}
}

/* float32 bits to bfloat16, to nearest even (finite inputs). */
static uint16_t bf16_from_bits(uint32_t u)
{
	return (uint16_t)((u + 0x7fffu + (u >> 16 & 1u)) >> 16);
}

static void make_input(void *buf, size_t count, enum gg_dtype dtype, int site, int rank, unsigned case_index)
{
	uint64_t seed = input_seed(site, rank, case_index);

	for (size_t i = 0; i < count; i++) {
		uint32_t u = input_f32_bits(seed, i);
		if (dtype == GG_DTYPE_F32)
			memcpy((unsigned char *)buf + 4 * i, &u, 4);
		else {
			uint16_t h = bf16_from_bits(u);
			memcpy((unsigned char *)buf + 2 * i, &h, 2);
		}
	}
}

/* Element i of a buffer as its bits and its value. */
static void element(const void *buf, enum gg_dtype dtype, size_t i, uint32_t *bits, double *value)
{
	if (dtype == GG_DTYPE_BF16) {
		uint16_t h;
		memcpy(&h, (const unsigned char *)buf + 2 * i, 2);
		*bits = h;
		*value = (double)test_float((uint32_t)h << 16);
	} else {
		memcpy(bits, (const unsigned char *)buf + 4 * i, 4);
		*value = (double)test_float(*bits);
	}
}

/* Device and host results must be equal byte for byte. */
static void require_equal(const char *what, const void *dev, const void *host, size_t count, enum gg_dtype dtype)
{
	size_t esize = gg_dtype_size(dtype);

	if (memcmp(dev, host, count * esize) == 0)
		return;
	for (size_t i = 0; i < count; i++) {
		if (memcmp((const unsigned char *)dev + i * esize, (const unsigned char *)host + i * esize, esize) == 0)
			continue;
		uint32_t db, hb;
		double dv, hv;
		size_t ndiff = 0;
		element(dev, dtype, i, &db, &dv);
		element(host, dtype, i, &hb, &hv);
		for (size_t j = i; j < count; j++)
			ndiff += memcmp((const unsigned char *)dev + j * esize, (const unsigned char *)host + j * esize,
					esize) != 0;
		fprintf(stderr,
			"%s:%d: site %d rank %d: %s: device and host results differ at %zu of %zu elements; first at "
			"element %zu: device 0x%0*" PRIx32 " (%.9g), host 0x%0*" PRIx32 " (%.9g)\n",
			__FILE__, __LINE__, site_index, rank_index, what, ndiff, count, i, (int)(2 * esize), db, dv,
			(int)(2 * esize), hb, hv);
		exit(1);
	}
}

/* The guard bytes around a device tensor, copied back, must be intact. */
static void require_guards(const char *what, const unsigned char *back, size_t bytes)
{
	for (size_t k = 0; k < GUARD; k++) {
		CHECK(back[k] == GUARD_BYTE, "%s: guard byte %zu before the tensor is 0x%02x, not 0x%02x", what,
		      GUARD - k, back[k], GUARD_BYTE);
		CHECK(back[GUARD + bytes + k] == GUARD_BYTE, "%s: guard byte %zu after the tensor is 0x%02x, not 0x%02x",
		      what, k, back[GUARD + bytes + k], GUARD_BYTE);
	}
}

/* A device tensor: `bytes` at dev (GUARD bytes into its own allocation,
 * guards filled), the input queued on `stream` and not waited for. */
static unsigned char *device_tensor(const void *in, size_t bytes, cudaStream_t stream)
{
	unsigned char *base = device_alloc(bytes + 2 * GUARD);

	CUDA_OK(cudaMemsetAsync(base, GUARD_BYTE, bytes + 2 * GUARD, stream));
	CUDA_OK(cudaMemcpyAsync(base + GUARD, in, bytes, cudaMemcpyHostToDevice, stream));
	return base + GUARD;
}

/* Copies a device tensor back (after the work queued on `stream`) into
 * `out`, and checks its guards. */
static void device_result(const char *what, const unsigned char *dev, size_t bytes, cudaStream_t stream, void *out)
{
	unsigned char *back = xmalloc(bytes + 2 * GUARD);

	CUDA_OK(cudaMemcpyAsync(back, dev - GUARD, bytes + 2 * GUARD, cudaMemcpyDeviceToHost, stream));
	CUDA_OK(cudaStreamSynchronize(stream));
	require_guards(what, back, bytes);
	memcpy(out, back + GUARD, bytes);
	free(back);
}

/* One device all-reduce of `in` into `out` (host memory, count elements);
 * on its own stream, or the legacy default stream when default_stream.
 * Returns the milliseconds gg_allreduce_cuda() took. */
static double device_allreduce(const char *what, const void *in, void *out, size_t count, enum gg_dtype dtype,
			       uint32_t tensor, bool default_stream)
{
	struct gg_error err;
	size_t bytes = count * gg_dtype_size(dtype);
	cudaStream_t stream = NULL;

	if (!default_stream)
		CUDA_OK(cudaStreamCreate(&stream));
	unsigned char *dev = device_tensor(in, bytes, stream);
	double t0 = now_ms();
	GG_OK(gg_allreduce_cuda(sess, dev, count, dtype, tensor, (void *)stream, 0, &err), &err,
	      "%s: gg_allreduce_cuda(tensor %" PRIu32 ")", what, tensor);
	double ms = now_ms() - t0;
	device_result(what, dev, bytes, stream, out);
	if (stream)
		CUDA_OK(cudaStreamDestroy(stream));
	return ms;
}

/* One host all-reduce of `buf`, in place. Returns its milliseconds. */
static double host_allreduce(const char *what, void *buf, size_t count, enum gg_dtype dtype, uint32_t tensor)
{
	struct gg_error err;
	double t0 = now_ms();

	GG_OK(gg_allreduce(sess, buf, count, dtype, tensor, 0, &err), &err, "%s: gg_allreduce(tensor %" PRIu32 ")",
	      what, tensor);
	return now_ms() - t0;
}

/* A call that must be refused with `code` and a message containing `needle`. */
static void expect_refused(int line, const char *what, int rc, const struct gg_error *err, int code,
			   const char *needle)
{
	printf("refused %s: %d (%s): %s\n", what, rc, gg_strerror(rc), err->message);
	if (rc != code || err->code != code || !strstr(err->message, needle)) {
		fprintf(stderr,
			"%s:%d: site %d rank %d: %s: expected %d (%s) with a message containing \"%s\"; got %d "
			"(err.code %d): \"%s\"\n",
			__FILE__, line, site_index, rank_index, what, code, gg_strerror(code), needle, rc, err->code,
			err->message);
		exit(1);
	}
}

static void refusals(void)
{
	struct gg_error err;
	cudaStream_t stream;
	unsigned char *dev = device_alloc(4096);
	unsigned char *aligned = dev + GUARD;
	void *host = xmalloc(4096);
	void *managed = NULL;
	int rc;

	CUDA_OK(cudaStreamCreate(&stream));
	CUDA_OK(cudaMallocManaged(&managed, 4096, cudaMemAttachGlobal));

	rc = gg_allreduce_cuda(sess, host, 16, GG_DTYPE_F32, 7, (void *)stream, 0, &err);
	expect_refused(__LINE__, "host memory", rc, &err, GG_ERR_INVALID, "is not CUDA device memory");
	rc = gg_allreduce_cuda(sess, NULL, 16, GG_DTYPE_F32, 7, (void *)stream, 0, &err);
	expect_refused(__LINE__, "NULL devbuf", rc, &err, GG_ERR_INVALID, "devbuf is NULL");
	rc = gg_allreduce_cuda(sess, aligned, 0, GG_DTYPE_F32, 7, (void *)stream, 0, &err);
	expect_refused(__LINE__, "count 0", rc, &err, GG_ERR_INVALID, "count is 0");
	rc = gg_allreduce_cuda(sess, aligned + 1, 16, GG_DTYPE_F32, 7, (void *)stream, 0, &err);
	expect_refused(__LINE__, "misaligned f32", rc, &err, GG_ERR_INVALID, "not aligned");
	rc = gg_allreduce_cuda(sess, managed, 16, GG_DTYPE_F32, 7, (void *)stream, 0, &err);
	expect_refused(__LINE__, "managed memory", rc, &err, GG_ERR_INVALID, "managed memory");
	rc = gg_allreduce_cuda(sess, aligned, 16, (enum gg_dtype)99, 7, (void *)stream, 0, &err);
	expect_refused(__LINE__, "dtype 99", rc, &err, GG_ERR_INVALID, "unknown dtype");

	CUDA_OK(cudaStreamDestroy(stream));
	free(host);
}

static void run_cases(void)
{
	for (unsigned c = 0; c < NCASES; c++) {
		size_t count = cases[c].count;
		enum gg_dtype dtype = cases[c].dtype;
		size_t bytes = count * gg_dtype_size(dtype);
		uint32_t tensor = 2 * c;
		char what[96];
		void *in = xmalloc(bytes), *dres = xmalloc(bytes), *hres = xmalloc(bytes);

		snprintf(what, sizeof(what), "case %u (%s x %zu)", c, dtype_name(dtype), count);
		make_input(in, count, dtype, site_index, rank_index, c);
		double dms = device_allreduce(what, in, dres, count, dtype, tensor, false);
		memcpy(hres, in, bytes);
		double hms = host_allreduce(what, hres, count, dtype, tensor + 1);
		require_equal(what, dres, hres, count, dtype);
		hash_bytes(hres, bytes);
		printf("ok %s: device == host, %zu bytes\n", what, bytes);
		if (dtype == GG_DTYPE_F32 && count == 16777216)
			printf("time %s x %zu (%zu MiB): device %.1f ms, host %.1f ms\n", dtype_name(dtype), count,
			       bytes >> 20, dms, hms);
		free(in);
		free(dres);
		free(hres);
	}
}

/* inf/NaN inputs by element class (i % 8), for NSITES sites (2 when not
 * given) of nranks ranks:
 *   0: +inf at site 0 rank 0, -inf at the last site's last rank -> NaN
 *   1: NaN at site 0's last rank                                 -> NaN
 *   2: +inf at every rank of site 0                              -> +inf
 *   3: -inf at rank 0 of every site                              -> -inf
 *   4: -NaN with a payload at rank 0 of every site               -> NaN
 *   else finite. */
static float nan_input(int site, int rank, int nranks, int nsites, size_t i, uint64_t seed)
{
	float finite = test_float(input_f32_bits(seed, i));

	switch (i % 8) {
	case 0:
		if (site == 0 && rank == 0)
			return INFINITY;
		if (site == nsites - 1 && rank == nranks - 1)
			return -INFINITY;
		return finite;
	case 1:
		return site == 0 && rank == nranks - 1 ? test_float(0x7fc00000u) : finite;
	case 2:
		return site == 0 ? INFINITY : finite;
	case 3:
		return rank == 0 ? -INFINITY : finite;
	case 4:
		return rank == 0 ? test_float(0xffc01234u) : finite;
	default:
		return finite;
	}
}

static void run_nan_case(int nranks, int nsites)
{
	const size_t count = NAN_COUNT;
	size_t bytes = count * 4;
	float *in = xmalloc(bytes), *dres = xmalloc(bytes), *hres = xmalloc(bytes);
	uint64_t seed = input_seed(site_index, rank_index, 1000);
	const char *what = "inf/NaN (f32 x 4099)";
	int ns = nsites > 0 ? nsites : 2;
	bool inf_pair = ns > 1 || nranks > 1; /* +inf and -inf at different ranks */

	for (size_t i = 0; i < count; i++)
		in[i] = nan_input(site_index, rank_index, nranks, ns, i, seed);
	device_allreduce(what, in, dres, count, GG_DTYPE_F32, TENSOR_NAN, false);
	memcpy(hres, in, bytes);
	host_allreduce(what, hres, count, GG_DTYPE_F32, TENSOR_NAN + 1);
	for (size_t i = 0; i < count; i++) {
		float d = dres[i], h = hres[i];
		CHECK(same_float(d, h), "%s: element %zu: device 0x%08" PRIx32 " (%.9g), host 0x%08" PRIx32 " (%.9g)",
		      what, i, test_bits(d), (double)d, test_bits(h), (double)h);
		switch (lossy ? -1 : (int)(i % 8)) {
		case -1:
			break;
		case 0:
			if (inf_pair)
				CHECK(isnan(h), "%s: element %zu (+inf + -inf) is %.9g, not NaN", what, i, (double)h);
			break;
		case 1:
		case 4:
			CHECK(isnan(h), "%s: element %zu (a NaN input) is %.9g, not NaN", what, i, (double)h);
			break;
		case 2:
			CHECK(isinf(h) && h > 0, "%s: element %zu (+inf inputs) is %.9g, not +inf", what, i, (double)h);
			break;
		case 3:
			CHECK(isinf(h) && h < 0, "%s: element %zu (-inf inputs) is %.9g, not -inf", what, i, (double)h);
			break;
		default:
			CHECK(isfinite(h), "%s: element %zu (finite inputs) is %.9g", what, i, (double)h);
			break;
		}
		/* Any NaN hashes as one: only its being NaN is required. */
		if (isnan(h))
			hres[i] = test_float(0x7fc00000u);
	}
	hash_bytes(hres, bytes);
	printf("ok %s: device == host (NaN == NaN)%s\n", what, lossy ? "" : ", classes as expected");
	free(in);
	free(dres);
	free(hres);
}

/* Rank 0 passes host memory, the others device memory, for one step: it
 * fails at every rank with GG_ERR_MISMATCH and leaves the buffers as they
 * were. */
static void run_mixed(void)
{
	const size_t count = MIXED_COUNT;
	size_t bytes = count * 4;
	const char *what = "mixed memory step";
	float *in = xmalloc(bytes), *buf = xmalloc(bytes);
	struct gg_error err;
	int rc;

	make_input(in, count, GG_DTYPE_F32, site_index, rank_index, 2000);
	memcpy(buf, in, bytes);
	if (rank_index == 0) {
		rc = gg_allreduce(sess, buf, count, GG_DTYPE_F32, TENSOR_MIXED, 0, &err);
		printf("%s (host memory): %d (%s): %s\n", what, rc, gg_strerror(rc), err.message);
	} else {
		cudaStream_t stream;
		CUDA_OK(cudaStreamCreate(&stream));
		unsigned char *dev = device_tensor(in, bytes, stream);
		rc = gg_allreduce_cuda(sess, dev, count, GG_DTYPE_F32, TENSOR_MIXED, (void *)stream, 0, &err);
		printf("%s (device memory): %d (%s): %s\n", what, rc, gg_strerror(rc), err.message);
		device_result(what, dev, bytes, stream, buf);
		CUDA_OK(cudaStreamDestroy(stream));
	}
	CHECK(rc == GG_ERR_MISMATCH && err.code == GG_ERR_MISMATCH && strstr(err.message, "different kinds of memory"),
	      "%s: expected %d (%s) with a message containing \"different kinds of memory\"; got %d (err.code %d): "
	      "\"%s\"",
	      what, GG_ERR_MISMATCH, gg_strerror(GG_ERR_MISMATCH), rc, err.code, err.message);
	CHECK(memcmp(buf, in, bytes) == 0, "%s: the failed step changed the %s buffer", what,
	      rank_index == 0 ? "host" : "device");
	printf("ok %s: GG_ERR_MISMATCH, buffer unchanged\n", what);
	free(in);
	free(buf);
}

/* Allocations of run_regions(), freed once the session is closed. */
static void *allocs[MAX_ALLOCS];
static unsigned nallocs;

/* One device step on `dev` (REGION_COUNT floats, input `k`) against a host
 * step of the same input. */
static void region_step(const char *what, float *dev, unsigned k)
{
	const size_t bytes = REGION_COUNT * sizeof(float);
	float *in = xmalloc(bytes), *dres = xmalloc(bytes), *hres = xmalloc(bytes);
	struct gg_error err;

	make_input(in, REGION_COUNT, GG_DTYPE_F32, site_index, rank_index, 4000 + k);
	CUDA_OK(cudaMemcpy(dev, in, bytes, cudaMemcpyHostToDevice));
	GG_OK(gg_allreduce_cuda(sess, dev, REGION_COUNT, GG_DTYPE_F32, TENSOR_REUSE, NULL, 0, &err), &err,
	      "%s %u: gg_allreduce_cuda", what, k);
	CUDA_OK(cudaMemcpy(dres, dev, bytes, cudaMemcpyDeviceToHost));
	memcpy(hres, in, bytes);
	host_allreduce(what, hres, REGION_COUNT, GG_DTYPE_F32, TENSOR_REUSE + 1);
	require_equal(what, dres, hres, REGION_COUNT, GG_DTYPE_F32);
	hash_bytes(dres, bytes);
	free(in);
	free(dres);
	free(hres);
}

/* One allocation used for several steps (the library hands it to the
 * gateway once), then more allocations than the session's max_buffers
 * (the library gives back the one unused longest for each new one): every
 * result equal to a host all-reduce's. */
static void run_regions(unsigned max_buffers)
{
	unsigned fresh = max_buffers + 3;

	CHECK(1 + fresh <= MAX_ALLOCS, "max_buffers %u: more allocations than the test keeps", max_buffers);
	allocs[nallocs++] = device_alloc(REGION_COUNT * sizeof(float));
	for (unsigned k = 0; k < 3; k++)
		region_step("one allocation, step after step", allocs[0], k);
	for (unsigned k = 0; k < fresh; k++) {
		allocs[nallocs] = device_alloc(REGION_COUNT * sizeof(float));
		region_step("a new allocation each step", allocs[nallocs++], 3 + k);
	}
	printf("ok %u steps on one allocation, %u on as many new ones (max_buffers %u): device == host\n", 3, fresh,
	       max_buffers);
}

/* Grid data for the last step: multiples of 1/64 in [-32, 32), whose sums
 * over a few ranks are exact in float32 in any order. */
static float grid_input(int site, int rank, size_t i)
{
	uint64_t r = mix64(input_seed(site, rank, 3000) + (uint64_t)(i + 1) * 0x9e3779b97f4a7c15ull);

	return (float)((int)(r % 4096) - 2048) / 64.0f;
}

/* After the failed step the session still works: a device step on the
 * legacy default stream, equal to a host step and (with NSITES) to the
 * exact sum. */
static void run_final(int nranks, int nsites)
{
	const size_t count = FINAL_COUNT;
	size_t bytes = count * 4;
	const char *what = "last device step (default stream)";
	float *in = xmalloc(bytes), *dres = xmalloc(bytes), *hres = xmalloc(bytes);

	for (size_t i = 0; i < count; i++)
		in[i] = grid_input(site_index, rank_index, i);
	device_allreduce(what, in, dres, count, GG_DTYPE_F32, TENSOR_FINAL, true);
	memcpy(hres, in, bytes);
	host_allreduce(what, hres, count, GG_DTYPE_F32, TENSOR_FINAL + 1);
	require_equal(what, dres, hres, count, GG_DTYPE_F32);
	if (nsites > 0 && !lossy) {
		for (size_t i = 0; i < count; i++) {
			double sum = 0;
			for (int s = 0; s < nsites; s++)
				for (int r = 0; r < nranks; r++)
					sum += (double)grid_input(s, r, i);
			CHECK((double)dres[i] == sum, "%s: element %zu is %.9g, the exact sum %.9g", what, i,
			      (double)dres[i], sum);
		}
	}
	hash_bytes(dres, bytes);
	printf("ok %s: device == host%s\n", what, nsites > 0 && !lossy ? " == exact sum" : "");
	free(in);
	free(dres);
	free(hres);
}

int main(int argc, char **argv)
{
	struct gg_error err;
	struct gg_session_info info = { .size = sizeof(info) };
	int nranks, nsites = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 2 && strcmp(argv[1], "--probe") == 0) {
		gpu_test_require_device(); /* exits 77 without one */
		return 0;
	}
	if (argc > 6 && strcmp(argv[argc - 1], "--lossy") == 0) {
		lossy = true;
		argc--;
	}
	if (argc != 6 && argc != 7) {
		fprintf(stderr, "usage: test_gpu_mode --probe\n"
				"       test_gpu_mode ENDPOINT JOB RANK NRANKS SITE_INDEX [NSITES] [--lossy]\n");
		return 2;
	}
	nranks = parse_int("test_gpu_mode", argv[4], "NRANKS", 1, 1024);
	rank_index = parse_int("test_gpu_mode", argv[3], "RANK", 0, nranks - 1);
	site_index = parse_int("test_gpu_mode", argv[5], "SITE_INDEX", 0, 63);
	if (argc == 7)
		nsites = parse_int("test_gpu_mode", argv[6], "NSITES", site_index + 1, 64);

	/* CUDA's context before the session, so that its start-up (seconds on
	 * a cold GPU) does not count against the first step's deadline. */
	gpu_test_require_device();
	CUDA_OK(cudaSetDevice(0));
	CUDA_OK(cudaFree(NULL));

	GG_OK(gg_session_open(argv[1], argv[2], rank_index, nranks, &sess, &err), &err, "gg_session_open(%s, %s)",
	      argv[1], argv[2]);
	CHECK(gg_session_get_info(sess, &info) == 0, "gg_session_get_info failed");
	printf("site %d (%s) rank %d of %d: max_message %" PRIu64 " bytes, max_buffers %" PRIu32
	       ", step_timeout %" PRIu32 " ms\n",
	       site_index, info.site, rank_index, nranks, info.max_message_bytes, info.max_buffers,
	       info.step_timeout_ms);

	refusals();
	run_cases();
	run_nan_case(nranks, nsites);
	run_mixed();
	run_final(nranks, nsites);
	run_regions(info.max_buffers);

	/* The close returns once the gateway let go of the allocations, which
	 * may then be freed. */
	gg_session_close(sess);
	sess = NULL;
	for (unsigned k = 0; k < nallocs; k++)
		CUDA_OK(cudaFree(allocs[k]));
	CUDA_OK(cudaDeviceSynchronize());
	printf("rank ok digest=%016" PRIx64 "\n", result_hash);
	return 0;
}
