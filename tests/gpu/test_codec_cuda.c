/* dav1d's checkasm shape for the GPU: every kernel of cuda/codec_cuda.h
 * against the CPU reference of compress/ on random inputs of many sizes (1
 * element, odd sizes, sizes that are no multiple of the block, 4 Mi + 5),
 * special values (inf, NaN with payloads, subnormals, -0.0, huge values),
 * random byte soup for the decoders, and sentinel bytes around every output
 * that must survive. Encoded bytes must be equal; floats bit for bit, any
 * NaN equal to any NaN. Then error feedback over several steps, chunk by
 * chunk: the same bytes and residuals as the CPU's. Then pinned host
 * memory, and what must be refused. Exit 77 without a GPU. */
#include <errno.h>

#include "codec.h"
#include "codec_cuda.h"
#include "codec_internal.h"
#include "feedback.h"
#include "gpu_test.h"

#define GUARD 64 /* bytes on each side of an output; keeps it 4-byte aligned */
#define GUARD_FLOATS (GUARD / 4)
#define SENTINEL_BYTE 0xa5
#define SENTINEL_FLOAT_BYTE 0x5a
#define SENTINEL_FLOAT 0x5a5a5a5au
#define MAX_N ((size_t)(1u << 22) + 5)
#define BIG_N 100000 /* sizes above run with two kinds of data only */

static const size_t sizes[] = { 1,  2,   3,   7,   31,   32,   33,    63,    64,      65,
				255, 256, 257, 1000, 4097, 65535, 65537, 1000003, MAX_N };
static const uint32_t blocks[] = { 32, 96, 256, 4096, 65536 };

struct dev {
	cudaStream_t stream;
	float *x;     /* MAX_N + 1 floats: inputs start at x + 1, 4 bytes past the allocation */
	uint8_t *enc; /* GUARD + encoded bytes + GUARD */
	float *out;   /* GUARD_FLOATS + n + GUARD_FLOATS */
};

struct host {
	uint8_t *ref, *got, *soup; /* encoded bytes (got: with its guards) */
	float *out_ref, *out_got;  /* n floats; out_got with its guards */
	float *acc0;               /* what decode_acc starts from */
};

static unsigned long long cases;

static void compare_bytes(const uint8_t *ref, const uint8_t *got, size_t bytes, const char *op, const char *what)
{
	for (size_t i = 0; i < bytes + 2 * GUARD; i++) {
		if (i < GUARD || i >= bytes + GUARD)
			CHECK(got[i] == SENTINEL_BYTE, "%s %s: guard byte %zd overwritten (0x%02x)", op, what,
			      (ptrdiff_t)i - GUARD, got[i]);
		else
			CHECK(got[i] == ref[i - GUARD], "%s %s: byte %zu of %zu: cpu 0x%02x, gpu 0x%02x", op, what,
			      i - GUARD, bytes, ref[i - GUARD], got[i]);
	}
}

static void compare_floats(const float *ref, const float *got, size_t n, const char *op, const char *what)
{
	for (size_t i = 0; i < n + 2 * GUARD_FLOATS; i++) {
		if (i < GUARD_FLOATS || i >= n + GUARD_FLOATS)
			CHECK(test_bits(got[i]) == SENTINEL_FLOAT, "%s %s: guard float %zd overwritten (0x%08x)", op,
			      what, (ptrdiff_t)i - GUARD_FLOATS, test_bits(got[i]));
		else
			CHECK(same_float(ref[i - GUARD_FLOATS], got[i]), "%s %s: element %zu: cpu %a (0x%08x), gpu %a (0x%08x)",
			      op, what, i - GUARD_FLOATS, ref[i - GUARD_FLOATS], test_bits(ref[i - GUARD_FLOATS]), got[i],
			      test_bits(got[i]));
	}
}

static void must(int rc, const char *err, const char *op, const char *what)
{
	CHECK(rc == 0, "%s %s: %s", op, what, err);
}

/* Encoded bytes on the device at d->enc + GUARD, sentinels around them. */
static void put_encoded(struct dev *d, const uint8_t *bytes_in, size_t bytes)
{
	CUDA_OK(cudaMemsetAsync(d->enc, SENTINEL_BYTE, bytes + 2 * GUARD, d->stream));
	CUDA_OK(cudaMemcpyAsync(d->enc + GUARD, bytes_in, bytes, cudaMemcpyHostToDevice, d->stream));
}

/* Runs decode (acc0 NULL) or decode_acc from acc0 on both sides and compares. */
static void check_decode(struct dev *d, struct host *h, const struct gg_codec_params *p, const uint8_t *in,
			 size_t bytes, size_t n, const float *acc0, const char *op, const char *what)
{
	const struct gg_codec_kernels *ref = &gg_codec_kernels_ref;
	char err[256];
	int rc;

	put_encoded(d, in, bytes);
	CUDA_OK(cudaMemsetAsync(d->out, SENTINEL_FLOAT_BYTE, (n + 2 * GUARD_FLOATS) * sizeof(float), d->stream));
	if (acc0) {
		CUDA_OK(cudaMemcpyAsync(d->out + GUARD_FLOATS, acc0, n * sizeof(float), cudaMemcpyHostToDevice, d->stream));
		memcpy(h->out_ref, acc0, n * sizeof(float));
		gg_decode_whole(ref->decode_acc[p->codec], p->codec, in, n, p->block_elems, p->scale, h->out_ref);
		rc = gg_codec_decode_acc_cuda(p, d->enc + GUARD, bytes, n, d->out + GUARD_FLOATS, d->stream, err,
					      sizeof(err));
	} else {
		gg_decode_whole(ref->decode[p->codec], p->codec, in, n, p->block_elems, p->scale, h->out_ref);
		rc = gg_codec_decode_cuda(p, d->enc + GUARD, bytes, n, d->out + GUARD_FLOATS, d->stream, err,
					  sizeof(err));
	}
	must(rc, err, op, what);
	CUDA_OK(cudaMemcpyAsync(h->out_got, d->out, (n + 2 * GUARD_FLOATS) * sizeof(float), cudaMemcpyDeviceToHost,
				d->stream));
	CUDA_OK(cudaStreamSynchronize(d->stream));
	compare_floats(h->out_ref, h->out_got, n, op, what);
	cases++;
}

/* One parameter set on the input x (on the host, and at d->x + 1). */
static void check_case(struct dev *d, struct host *h, const struct gg_codec_params *p, const float *x, size_t n,
		       const char *kind, struct rng *r)
{
	char what[128], err[256];
	uint64_t bytes;

	CHECK(gg_codec_encoded_bytes(p, n, &bytes) == 0 && bytes <= 4 * MAX_N, "size");
	snprintf(what, sizeof(what), "%s/%s/block %u/%s/n=%zu", gg_codec_name(p->codec), p->scale ? "f16" : "f32",
		 p->block_elems, kind, n);

	gg_encode_whole(gg_codec_kernels_ref.encode[p->codec], p->codec, x, n, p->block_elems, p->scale, h->ref);
	CUDA_OK(cudaMemsetAsync(d->enc, SENTINEL_BYTE, bytes + 2 * GUARD, d->stream));
	must(gg_codec_encode_cuda(p, d->x + 1, n, d->enc + GUARD, bytes, d->stream, err, sizeof(err)), err, "encode",
	     what);
	CUDA_OK(cudaMemcpyAsync(h->got, d->enc, bytes + 2 * GUARD, cudaMemcpyDeviceToHost, d->stream));
	CUDA_OK(cudaStreamSynchronize(d->stream));
	compare_bytes(h->ref, h->got, bytes, "encode", what);
	cases++;

	/* the reference's bytes, then soup: every code and any scale bits */
	for (size_t i = 0; i < bytes; i += 8) {
		uint64_t v = rng_next(r);
		memcpy(h->soup + i, &v, GG_MIN((size_t)8, bytes - i));
	}
	check_decode(d, h, p, h->ref, bytes, n, NULL, "decode", what);
	check_decode(d, h, p, h->ref, bytes, n, h->acc0, "decode_acc", what);
	check_decode(d, h, p, h->soup, bytes, n, NULL, "decode(soup)", what);
	check_decode(d, h, p, h->soup, bytes, n, h->acc0, "decode_acc(soup)", what);
}

/* fp32, bf16, bf16-split, and int8/int4 with every block size and scale kind. */
static size_t all_params(struct gg_codec_params *out)
{
	size_t k = 0;

	for (int c = GG_CODEC_FIRST; c <= GG_CODEC_LAST; c++) {
		struct gg_codec_params p = gg_codec_defaults((enum gg_codec)c);
		if (!gg_codec_has_blocks(p.codec)) {
			out[k++] = p;
			continue;
		}
		for (size_t b = 0; b < GG_ARRAY_LEN(blocks); b++) {
			for (int sk = GG_SCALE_F32; sk <= GG_SCALE_F16; sk++) {
				p.block_elems = blocks[b];
				p.scale = (enum gg_scale_kind)sk;
				out[k++] = p;
			}
		}
	}
	return k;
}

static void check_codecs(struct dev *d, struct host *h)
{
	struct gg_codec_params params[3 + 2 * 2 * GG_ARRAY_LEN(blocks)];
	size_t np = all_params(params);
	struct rng r = { 0x6075eed };
	float *x = xmalloc(MAX_N * sizeof(float));

	CHECK(np == GG_ARRAY_LEN(params), "parameter sets");
	for (size_t si = 0; si < GG_ARRAY_LEN(sizes); si++) {
		size_t n = sizes[si];
		unsigned long long before = cases;
		fill_data(h->acc0, n, DATA_SPECIAL, &r);
		for (int kind = 0; kind < DATA_KINDS; kind++) {
			if (n > BIG_N && kind != DATA_SPECIAL && kind != DATA_GAUSSIAN)
				continue;
			fill_data(x, n, (enum data_kind)kind, &r);
			CUDA_OK(cudaMemcpyAsync(d->x + 1, x, n * sizeof(float), cudaMemcpyHostToDevice, d->stream));
			for (size_t pi = 0; pi < np; pi++)
				check_case(d, h, &params[pi], x, n, data_kind_name((enum data_kind)kind), &r);
		}
		printf("n=%-8zu %zu parameter sets: encode, decode, decode_acc (reference and soup) match, %llu cases\n",
		       n, np, cases - before);
	}
	free(x);
}

/* Several steps of error feedback over a tensor cut into chunks, on both
 * sides from zero residuals: each chunk's bytes, then all residuals. */
static void check_feedback(struct dev *d, struct host *h, const struct gg_codec_params *p)
{
	enum { ELEMS = 100003, CHUNK = 40000, STEPS = 6 };
	static const enum data_kind step_data[STEPS] = { DATA_GAUSSIAN, DATA_OUTLIERS, DATA_SPECIAL,
							 DATA_GAUSSIAN, DATA_BITS,     DATA_HEAVY };
	struct gg_feedback fb;
	struct gg_feedback_cuda gfb;
	struct rng r = { 0xfeedu + (uint64_t)p->codec };
	float *x = xmalloc(ELEMS * sizeof(float)), *res = xmalloc(ELEMS * sizeof(float));
	char what[128], err[256];

	CHECK(gg_feedback_init(&fb, ELEMS, CHUNK) == 0, "cpu feedback");
	must(gg_feedback_init_cuda(&gfb, ELEMS, err, sizeof(err)), err, "feedback init", "");
	for (int t = 0; t < STEPS; t++) {
		fill_data(x, ELEMS, step_data[t], &r);
		CUDA_OK(cudaMemcpyAsync(d->x, x, ELEMS * sizeof(float), cudaMemcpyHostToDevice, d->stream));
		for (size_t off = 0; off < ELEMS; off += CHUNK) {
			size_t n = GG_MIN((size_t)CHUNK, ELEMS - off);
			uint64_t bytes;
			CHECK(gg_codec_encoded_bytes(p, n, &bytes) == 0, "size");
			snprintf(what, sizeof(what), "%s/%s/block %u: step %d, chunk at %zu", gg_codec_name(p->codec),
				 p->scale ? "f16" : "f32", p->block_elems, t, off);
			CHECK(gg_feedback_encode(&fb, p, off, x + off, n, h->ref, bytes, NULL) == 0, "cpu feedback encode");
			CUDA_OK(cudaMemsetAsync(d->enc, SENTINEL_BYTE, bytes + 2 * GUARD, d->stream));
			must(gg_feedback_encode_cuda(&gfb, p, off, d->x + off, n, d->enc + GUARD, bytes, d->stream, err,
						     sizeof(err)),
			     err, "feedback encode", what);
			CUDA_OK(cudaMemcpyAsync(h->got, d->enc, bytes + 2 * GUARD, cudaMemcpyDeviceToHost, d->stream));
			CUDA_OK(cudaStreamSynchronize(d->stream));
			compare_bytes(h->ref, h->got, bytes, "feedback encode", what);
		}
		CUDA_OK(cudaMemcpy(res, gfb.residual, ELEMS * sizeof(float), cudaMemcpyDeviceToHost));
		for (size_t i = 0; i < ELEMS; i++)
			CHECK(test_bits(res[i]) == test_bits(fb.residual[i]), "%s/block %u: step %d: residual %zu: cpu %a, gpu %a",
			      gg_codec_name(p->codec), p->block_elems, t, i, fb.residual[i], res[i]);
		cases++;
	}
	must(gg_feedback_reset_cuda(&gfb, d->stream, err, sizeof(err)), err, "feedback reset", "");
	CUDA_OK(cudaMemcpyAsync(res, gfb.residual, ELEMS * sizeof(float), cudaMemcpyDeviceToHost, d->stream));
	CUDA_OK(cudaStreamSynchronize(d->stream));
	for (size_t i = 0; i < ELEMS; i++)
		CHECK(test_bits(res[i]) == 0, "reset: residual %zu is %a", i, res[i]);
	printf("feedback %-10s %s scales, block %-5u %d steps of %d chunks: bytes and residuals match\n",
	       gg_codec_name(p->codec), p->scale ? "f16" : "f32", p->block_elems, STEPS, (ELEMS + CHUNK - 1) / CHUNK);
	gg_feedback_fini_cuda(&gfb);
	gg_feedback_fini(&fb);
	free(x);
	free(res);
}

/* Pinned host memory is memory the kernels address: encode from it into
 * it, and accumulate into it. */
static void check_pinned(struct host *h)
{
	enum { N = 100003 };
	struct gg_codec_params p = gg_codec_defaults(GG_CODEC_INT4);
	struct rng r = { 3 };
	float *x, *acc;
	uint8_t *enc;
	uint64_t bytes;
	char err[256];

	CHECK(gg_codec_encoded_bytes(&p, N, &bytes) == 0, "size");
	CUDA_OK(cudaHostAlloc((void **)&x, N * sizeof(float), cudaHostAllocDefault));
	CUDA_OK(cudaHostAlloc((void **)&acc, N * sizeof(float), cudaHostAllocDefault));
	CUDA_OK(cudaHostAlloc((void **)&enc, bytes, cudaHostAllocDefault));
	fill_data(x, N, DATA_SPECIAL, &r);
	fill_data(acc, N, DATA_GAUSSIAN, &r);
	memcpy(h->out_ref, acc, N * sizeof(float));
	gg_encode_whole(gg_codec_kernels_ref.encode[p.codec], p.codec, x, N, p.block_elems, p.scale, h->ref);
	gg_decode_whole(gg_codec_kernels_ref.decode_acc[p.codec], p.codec, h->ref, N, p.block_elems, p.scale, h->out_ref);
	must(gg_codec_encode_cuda(&p, x, N, enc, bytes, NULL, err, sizeof(err)), err, "encode", "pinned");
	must(gg_codec_decode_acc_cuda(&p, enc, bytes, N, acc, NULL, err, sizeof(err)), err, "decode_acc", "pinned");
	CUDA_OK(cudaDeviceSynchronize());
	CHECK(memcmp(enc, h->ref, bytes) == 0, "pinned: encoded bytes differ");
	for (size_t i = 0; i < N; i++)
		CHECK(same_float(acc[i], h->out_ref[i]), "pinned decode_acc: element %zu: cpu %a, gpu %a", i,
		      h->out_ref[i], acc[i]);
	cudaFreeHost(x);
	cudaFreeHost(acc);
	cudaFreeHost(enc);
	printf("pinned host memory: int4 encode and decode_acc match\n");
}

static void refused(int rc, int want, const char *err, const char *why)
{
	CHECK(rc == want, "%s: returned %d, expected %d (%s)", why, rc, want, err);
	CHECK(err[0] != '\0', "%s: no message", why);
	printf("refused, %s: %s\n", why, err);
}

static void check_refusals(struct dev *d)
{
	enum { N = 1000 };
	struct gg_codec_params p = gg_codec_defaults(GG_CODEC_INT8), bad = p;
	struct gg_feedback_cuda gfb;
	float *host = xmalloc(N * sizeof(float));
	uint8_t guard[GUARD];
	uint64_t bytes;
	char err[256];

	CHECK(gg_codec_encoded_bytes(&p, N, &bytes) == 0, "size");
	memset(host, 0, N * sizeof(float));
	refused(gg_codec_encode_cuda(&p, host, N, d->enc, bytes, d->stream, err, sizeof(err)), -EFAULT, err,
		"input from malloc");
	refused(gg_codec_encode_cuda(&p, NULL, N, d->enc, bytes, d->stream, err, sizeof(err)), -EFAULT, err,
		"NULL input");
	refused(gg_codec_encode_cuda(&p, (const float *)(const void *)((const char *)d->x + 2), N, d->enc, bytes,
				     d->stream, err, sizeof(err)),
		-EINVAL, err, "misaligned input");
	refused(gg_codec_encode_cuda(&p, d->x, N, d->enc + 1, bytes, d->stream, err, sizeof(err)), -EINVAL, err,
		"misaligned output");
	refused(gg_codec_encode_cuda(&p, d->x, N, d->enc, bytes - 1, d->stream, err, sizeof(err)), -ENOBUFS, err,
		"output too small");
	refused(gg_codec_decode_cuda(&p, d->enc, bytes + 1, N, d->out, d->stream, err, sizeof(err)), -EBADMSG, err,
		"input longer than the encoded size");
	refused(gg_codec_decode_acc_cuda(&p, d->enc, bytes, N, (float *)(void *)host, d->stream, err, sizeof(err)),
		-EFAULT, err, "accumulating into malloc memory");
	bad.block_elems = 33;
	refused(gg_codec_encode_cuda(&bad, d->x, N, d->enc, bytes, d->stream, err, sizeof(err)), -EINVAL, err,
		"block size 33");
	refused(gg_feedback_init_cuda(&gfb, 0, err, sizeof(err)), -EINVAL, err, "feedback for 0 elements");
	must(gg_feedback_init_cuda(&gfb, N, err, sizeof(err)), err, "feedback init", "");
	refused(gg_feedback_encode_cuda(&gfb, &p, N - 1, d->x, 2, d->enc, bytes, d->stream, err, sizeof(err)), -EINVAL,
		err, "feedback range past the tensor");
	gg_feedback_fini_cuda(&gfb);
	gg_feedback_fini_cuda(&gfb);

	/* nothing to do writes nothing */
	CUDA_OK(cudaMemset(d->enc, SENTINEL_BYTE, GUARD));
	must(gg_codec_encode_cuda(&p, d->x, 0, d->enc, 0, d->stream, err, sizeof(err)), err, "encode", "n=0");
	must(gg_codec_decode_acc_cuda(&p, d->enc, 0, 0, d->out, d->stream, err, sizeof(err)), err, "decode_acc", "n=0");
	CUDA_OK(cudaStreamSynchronize(d->stream));
	CUDA_OK(cudaMemcpy(guard, d->enc, GUARD, cudaMemcpyDeviceToHost));
	for (size_t i = 0; i < GUARD; i++)
		CHECK(guard[i] == SENTINEL_BYTE, "n=0: byte %zu written", i);
	free(host);
}

int main(void)
{
	struct gg_codec_params fb_params[] = {
		gg_codec_defaults(GG_CODEC_FP32), gg_codec_defaults(GG_CODEC_BF16),
		gg_codec_defaults(GG_CODEC_BF16_SPLIT), gg_codec_defaults(GG_CODEC_INT8),
		gg_codec_defaults(GG_CODEC_INT4),
		{ .codec = GG_CODEC_INT8, .block_elems = 96, .scale = GG_SCALE_F16 },
		{ .codec = GG_CODEC_INT4, .block_elems = 32, .scale = GG_SCALE_F16 },
		{ .codec = GG_CODEC_INT4, .block_elems = 4096, .scale = GG_SCALE_F32 },
		/* past 256: one block a group, its two passes (codec_kernels.cuh) */
		{ .codec = GG_CODEC_INT8, .block_elems = 4096, .scale = GG_SCALE_F32 },
	};
	struct dev d;
	struct host h;

	gpu_test_require_device();
	CUDA_OK(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking));
	d.x = device_alloc((MAX_N + 1) * sizeof(float));
	d.enc = device_alloc(4 * MAX_N + 2 * GUARD);
	d.out = device_alloc((MAX_N + 2 * GUARD_FLOATS) * sizeof(float));
	h.ref = xmalloc(4 * MAX_N);
	h.soup = xmalloc(4 * MAX_N);
	h.got = xmalloc(4 * MAX_N + 2 * GUARD);
	h.out_ref = xmalloc(MAX_N * sizeof(float));
	h.out_got = xmalloc((MAX_N + 2 * GUARD_FLOATS) * sizeof(float));
	h.acc0 = xmalloc(MAX_N * sizeof(float));

	check_codecs(&d, &h);
	for (size_t i = 0; i < GG_ARRAY_LEN(fb_params); i++)
		check_feedback(&d, &h, &fb_params[i]);
	check_pinned(&h);
	check_refusals(&d);
	printf("gpu codecs: %llu cases match the CPU reference\n", cases);

	cudaFree(d.x);
	cudaFree(d.enc);
	cudaFree(d.out);
	cudaStreamDestroy(d.stream);
	free(h.ref);
	free(h.soup);
	free(h.got);
	free(h.out_ref);
	free(h.out_got);
	free(h.acc0);
	return 0;
}
