/* How fast the codec kernels run on 256 MiB of fp32 gradients, against
 * what a device-to-device cudaMemcpy moves on the same GPU. Both count the
 * bytes read plus the bytes written, so the ratio says how close a kernel
 * comes to the memory bandwidth a plain copy gets (target: 0.5 or more).
 * Then the gateway's own path (gateway/engine/mem_cuda.c): 1 MiB chunks,
 * each error-feedback encoded into pinned host memory or decoded and
 * added from it, with a wait for the stream after each, against a
 * device-to-host cudaMemcpy of as many encoded bytes (the bus they cross).
 * Speed is printed, never judged: the test fails only when the kernels'
 * bytes differ from the CPU reference's on the same 256 MiB, which it
 * checks after timing. Exit 77 without a GPU. */
#include "codec.h"
#include "codec_cuda.h"
#include "codec_internal.h"
#include "feedback.h"
#include "gpu_test.h"

#define N ((size_t)64 << 20) /* 256 MiB of fp32 */
#define CHUNK ((size_t)1 << 18) /* elements of the default chunk_size, 1 MiB */
#define REPS 20
#define TARGET_RATIO 0.5

enum op { OP_ENCODE, OP_FEEDBACK, OP_DECODE, OP_DECODE_ACC, OP_COUNT };
static const char *const op_names[OP_COUNT] = { "encode", "feedback encode", "decode", "decode_acc" };

struct bench {
	cudaStream_t stream;
	cudaEvent_t start, stop;
	float *x, *out;
	uint8_t *enc;
	uint8_t *enc_host; /* pinned, as the gateway's staging buffer */
	struct gg_feedback_cuda fb;
};

static int run_op(struct bench *b, const struct gg_codec_params *p, enum op op, size_t bytes, char *err,
		  size_t err_size)
{
	switch (op) {
	case OP_ENCODE:
		return gg_codec_encode_cuda(p, b->x, N, b->enc, bytes, b->stream, err, err_size);
	case OP_FEEDBACK:
		return gg_feedback_encode_cuda(&b->fb, p, 0, b->x, N, b->enc, bytes, b->stream, err, err_size);
	case OP_DECODE:
		return gg_codec_decode_cuda(p, b->enc, bytes, N, b->out, b->stream, err, err_size);
	case OP_DECODE_ACC:
		return gg_codec_decode_acc_cuda(p, b->enc, bytes, N, b->out, b->stream, err, err_size);
	case OP_COUNT:
		break;
	}
	return -1;
}

/* Bytes an op reads and writes: fp32 in and out, the encoded bytes, and for
 * feedback the residual read and written. */
static double op_traffic(enum op op, size_t bytes)
{
	double f = (double)N * sizeof(float);

	switch (op) {
	case OP_ENCODE:
	case OP_DECODE:
		return f + (double)bytes;
	case OP_FEEDBACK:
		return 3 * f + (double)bytes;
	case OP_DECODE_ACC:
		return 2 * f + (double)bytes;
	case OP_COUNT:
		break;
	}
	return 0;
}

/* Seconds per call of `op`, over REPS calls after one to warm up. */
static double time_op(struct bench *b, const struct gg_codec_params *p, enum op op, size_t bytes)
{
	char err[256];
	float ms;

	CHECK(run_op(b, p, op, bytes, err, sizeof(err)) == 0, "%s: %s", op_names[op], err);
	CUDA_OK(cudaEventRecord(b->start, b->stream));
	for (int i = 0; i < REPS; i++)
		CHECK(run_op(b, p, op, bytes, err, sizeof(err)) == 0, "%s: %s", op_names[op], err);
	CUDA_OK(cudaEventRecord(b->stop, b->stream));
	CUDA_OK(cudaEventSynchronize(b->stop));
	CUDA_OK(cudaEventElapsedTime(&ms, b->start, b->stop));
	return ms / 1e3 / REPS;
}

/* Seconds per cudaMemcpy of `bytes` from `src` to `dst`, over REPS after
 * one to warm up. */
static double time_copy(struct bench *b, void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind)
{
	float ms;

	CUDA_OK(cudaMemcpyAsync(dst, src, bytes, kind, b->stream));
	CUDA_OK(cudaEventRecord(b->start, b->stream));
	for (int i = 0; i < REPS; i++)
		CUDA_OK(cudaMemcpyAsync(dst, src, bytes, kind, b->stream));
	CUDA_OK(cudaEventRecord(b->stop, b->stream));
	CUDA_OK(cudaEventSynchronize(b->stop));
	CUDA_OK(cudaEventElapsedTime(&ms, b->start, b->stop));
	return ms / 1e3 / REPS;
}

static double copy_bandwidth(struct bench *b)
{
	return 2.0 * (double)N * sizeof(float) / time_copy(b, b->out, b->x, N * sizeof(float), cudaMemcpyDeviceToDevice);
}

/* The whole tensor as the gateway moves it: CHUNK elements at a time,
 * encoded into `enc` (encode; with error feedback for a lossy codec, as
 * the gateway's default) or decoded from it and added to b->out, each
 * chunk's `chunk_bytes` after the last's, and the stream waited for after
 * each chunk. */
static int chunked(struct bench *b, const struct gg_codec_params *p, bool encode, uint8_t *enc, size_t chunk_bytes,
		   char *err, size_t err_size)
{
	for (size_t off = 0, i = 0; off < N; off += CHUNK, i++) {
		uint8_t *at = enc + i * chunk_bytes;
		int rc;
		if (!encode)
			rc = gg_codec_decode_acc_cuda(p, at, chunk_bytes, CHUNK, b->out + off, b->stream, err, err_size);
		else if (gg_codec_is_lossy(p->codec))
			rc = gg_feedback_encode_cuda(&b->fb, p, off, b->x + off, CHUNK, at, chunk_bytes, b->stream, err,
						     err_size);
		else
			rc = gg_codec_encode_cuda(p, b->x + off, CHUNK, at, chunk_bytes, b->stream, err, err_size);
		if (rc)
			return rc;
		CUDA_OK(cudaStreamSynchronize(b->stream));
	}
	return 0;
}

/* Seconds per chunked() pass over REPS after one to warm up. */
static double time_chunked(struct bench *b, const struct gg_codec_params *p, bool encode, uint8_t *enc,
			   size_t chunk_bytes)
{
	char err[256];
	float ms;

	CHECK(chunked(b, p, encode, enc, chunk_bytes, err, sizeof(err)) == 0, "%s", err);
	CUDA_OK(cudaEventRecord(b->start, b->stream));
	for (int i = 0; i < REPS; i++)
		CHECK(chunked(b, p, encode, enc, chunk_bytes, err, sizeof(err)) == 0, "%s", err);
	CUDA_OK(cudaEventRecord(b->stop, b->stream));
	CUDA_OK(cudaEventSynchronize(b->stop));
	CUDA_OK(cudaEventElapsedTime(&ms, b->start, b->stop));
	return ms / 1e3 / REPS;
}

/* The gateway's path for one codec, timed against a device-to-host copy of
 * its encoded bytes; and checked: chunks encoded into pinned memory are
 * the bytes the same chunks encoded into device memory are, and decoded
 * from there add up to the same floats. */
static void pinned_path(struct bench *b, const struct gg_codec_params *p)
{
	uint64_t chunk_bytes;
	char err[256];

	CHECK(gg_codec_encoded_bytes(p, CHUNK, &chunk_bytes) == 0, "size");
	const size_t bytes = (size_t)chunk_bytes * (N / CHUNK);
	uint8_t *want = xmalloc(bytes);
	float *out_want = xmalloc(N * sizeof(float)), *out_got = xmalloc(N * sizeof(float));
	const double copy = time_copy(b, b->enc_host, b->enc, bytes, cudaMemcpyDeviceToHost);
	for (int encode = 1; encode >= 0; encode--) {
		double t = time_chunked(b, p, encode, b->enc_host, chunk_bytes);
		printf("%-10s %-16s %8.3f %12.0f %12.1f %8.2f\n", gg_codec_name(p->codec),
		       !encode ? "decode_acc" : gg_codec_is_lossy(p->codec) ? "feedback encode" : "encode", t * 1e3,
		       (double)N * sizeof(float) / t / 1e9, (double)bytes / t / 1e9, copy / t);
	}
	for (int pinned = 0; pinned < 2; pinned++) {
		uint8_t *enc = pinned ? b->enc_host : b->enc;
		CHECK(gg_feedback_reset_cuda(&b->fb, b->stream, err, sizeof(err)) == 0, "%s", err);
		CHECK(chunked(b, p, true, enc, chunk_bytes, err, sizeof(err)) == 0, "%s", err);
		CUDA_OK(cudaMemsetAsync(b->out, 0, N * sizeof(float), b->stream));
		CHECK(chunked(b, p, false, enc, chunk_bytes, err, sizeof(err)) == 0, "%s", err);
		CUDA_OK(cudaMemcpy(pinned ? out_got : out_want, b->out, N * sizeof(float), cudaMemcpyDeviceToHost));
		if (!pinned)
			CUDA_OK(cudaMemcpy(want, b->enc, bytes, cudaMemcpyDeviceToHost));
	}
	CHECK(memcmp(want, b->enc_host, bytes) == 0, "%s: chunks encoded into pinned memory differ",
	      gg_codec_name(p->codec));
	CHECK(memcmp(out_want, out_got, N * sizeof(float)) == 0, "%s: decode_acc from pinned memory differs",
	      gg_codec_name(p->codec));
	free(want);
	free(out_want);
	free(out_got);
}

/* The kernels' bytes and floats for this input against the reference's:
 * encode, decode, decode_acc, and one feedback step from zero residuals. */
static void check_bytes(struct bench *b, const struct gg_codec_params *p, const float *x, size_t bytes)
{
	const struct gg_codec_kernels *ref = &gg_codec_kernels_ref;
	uint8_t *want = xmalloc(bytes), *got = xmalloc(bytes);
	float *out_ref = xmalloc(N * sizeof(float)), *out_got = xmalloc(N * sizeof(float));
	struct gg_feedback fb;
	char err[256];

	gg_encode_whole(ref->encode[p->codec], p->codec, x, N, p->block_elems, p->scale, want);
	CHECK(gg_codec_encode_cuda(p, b->x, N, b->enc, bytes, b->stream, err, sizeof(err)) == 0, "%s", err);
	CUDA_OK(cudaMemcpyAsync(got, b->enc, bytes, cudaMemcpyDeviceToHost, b->stream));
	CUDA_OK(cudaStreamSynchronize(b->stream));
	CHECK(memcmp(want, got, bytes) == 0, "%s: encoded bytes differ from the reference", gg_codec_name(p->codec));

	for (int acc = 0; acc < 2; acc++) {
		memcpy(out_ref, x, N * sizeof(float));
		CUDA_OK(cudaMemcpyAsync(b->out, x, N * sizeof(float), cudaMemcpyHostToDevice, b->stream));
		gg_decode_whole((acc ? ref->decode_acc : ref->decode)[p->codec], p->codec, want, N, p->block_elems, p->scale,
				out_ref);
		CHECK(run_op(b, p, acc ? OP_DECODE_ACC : OP_DECODE, bytes, err, sizeof(err)) == 0, "%s", err);
		CUDA_OK(cudaMemcpyAsync(out_got, b->out, N * sizeof(float), cudaMemcpyDeviceToHost, b->stream));
		CUDA_OK(cudaStreamSynchronize(b->stream));
		for (size_t i = 0; i < N; i++)
			CHECK(same_float(out_ref[i], out_got[i]), "%s %s: element %zu: cpu %a, gpu %a",
			      gg_codec_name(p->codec), acc ? "decode_acc" : "decode", i, out_ref[i], out_got[i]);
	}

	CHECK(gg_feedback_init(&fb, N, N) == 0, "cpu feedback");
	CHECK(gg_feedback_encode(&fb, p, 0, x, N, want, bytes, NULL) == 0, "cpu feedback encode");
	CHECK(gg_feedback_reset_cuda(&b->fb, b->stream, err, sizeof(err)) == 0, "%s", err);
	CHECK(run_op(b, p, OP_FEEDBACK, bytes, err, sizeof(err)) == 0, "%s", err);
	CUDA_OK(cudaMemcpyAsync(got, b->enc, bytes, cudaMemcpyDeviceToHost, b->stream));
	CUDA_OK(cudaMemcpyAsync(out_got, b->fb.residual, N * sizeof(float), cudaMemcpyDeviceToHost, b->stream));
	CUDA_OK(cudaStreamSynchronize(b->stream));
	CHECK(memcmp(want, got, bytes) == 0, "%s: feedback bytes differ from the CPU's", gg_codec_name(p->codec));
	CHECK(memcmp(fb.residual, out_got, N * sizeof(float)) == 0, "%s: residuals differ from the CPU's",
	      gg_codec_name(p->codec));
	gg_feedback_fini(&fb);
	free(want);
	free(got);
	free(out_ref);
	free(out_got);
}

int main(void)
{
	struct bench b;
	struct rng r = { 42 };
	char err[256];
	int below = 0;

	gpu_test_require_device();
	float *x = xmalloc(N * sizeof(float));
	fill_data(x, N, DATA_GAUSSIAN, &r);
	CUDA_OK(cudaStreamCreateWithFlags(&b.stream, cudaStreamNonBlocking));
	CUDA_OK(cudaEventCreate(&b.start));
	CUDA_OK(cudaEventCreate(&b.stop));
	b.x = device_alloc(N * sizeof(float));
	b.out = device_alloc(N * sizeof(float));
	b.enc = device_alloc(N * sizeof(float));
	CUDA_OK(cudaHostAlloc((void **)&b.enc_host, N * sizeof(float), cudaHostAllocPortable));
	CHECK(gg_feedback_init_cuda(&b.fb, N, err, sizeof(err)) == 0, "%s", err);
	CUDA_OK(cudaMemcpyAsync(b.x, x, N * sizeof(float), cudaMemcpyHostToDevice, b.stream));
	CUDA_OK(cudaStreamSynchronize(b.stream));

	double copy = copy_bandwidth(&b);
	printf("device-to-device cudaMemcpy of 256 MiB: %.0f GB/s (read + write)\n", copy / 1e9);
	printf("%-10s %-16s %8s %10s %12s %6s\n", "codec", "op", "ms", "GB/s", "fp32 GB/s", "ratio");
	for (int c = GG_CODEC_FIRST; c <= GG_CODEC_LAST; c++) {
		struct gg_codec_params p = gg_codec_defaults((enum gg_codec)c);
		uint64_t bytes;
		CHECK(gg_codec_encoded_bytes(&p, N, &bytes) == 0, "size");
		for (int op = 0; op < OP_COUNT; op++) {
			if (op == OP_DECODE || op == OP_DECODE_ACC)
				CHECK(gg_codec_encode_cuda(&p, b.x, N, b.enc, bytes, b.stream, err, sizeof(err)) == 0, "%s",
				      err);
			double t = time_op(&b, &p, (enum op)op, bytes);
			double gbs = op_traffic((enum op)op, bytes) / t, ratio = gbs / copy;
			below += ratio < TARGET_RATIO;
			printf("%-10s %-16s %8.3f %10.0f %12.0f %6.2f%s\n", gg_codec_name(p.codec), op_names[op], t * 1e3,
			       gbs / 1e9, (double)N * sizeof(float) / t / 1e9, ratio,
			       ratio < TARGET_RATIO ? "  (under the 0.50 target)" : "");
		}
		check_bytes(&b, &p, x, bytes);
	}
	printf("GB/s: bytes read + written per second; fp32 GB/s: fp32 elements' bytes per second; ratio: GB/s "
	       "over the copy's. %d of %d under the %.2f target. The 256 MiB results match the CPU reference.\n",
	       below, (GG_CODEC_LAST - GG_CODEC_FIRST + 1) * OP_COUNT, TARGET_RATIO);

	printf("\nthe gateway's path: 1 MiB chunks, encoded bytes in pinned host memory, a wait after each\n");
	printf("%-10s %-16s %8s %12s %12s %8s\n", "codec", "op", "ms", "fp32 GB/s", "encoded GB/s", "vs copy");
	for (int c = GG_CODEC_FIRST; c <= GG_CODEC_LAST; c++) {
		struct gg_codec_params p = gg_codec_defaults((enum gg_codec)c);
		pinned_path(&b, &p);
	}
	printf("encoded GB/s: encoded bytes across the bus per second; vs copy: the time of one device-to-host "
	       "cudaMemcpy of as many bytes over the op's (1.00: as fast as that copy). Bytes and sums match "
	       "the same chunks' in device memory.\n");

	gg_feedback_fini_cuda(&b.fb);
	cudaFree(b.x);
	cudaFree(b.out);
	cudaFree(b.enc);
	cudaFreeHost(b.enc_host);
	cudaEventDestroy(b.start);
	cudaEventDestroy(b.stop);
	cudaStreamDestroy(b.stream);
	free(x);
	return 0;
}
