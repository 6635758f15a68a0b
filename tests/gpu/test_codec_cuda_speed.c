/* How fast the codec kernels run on 256 MiB of fp32 gradients, against
 * what a device-to-device cudaMemcpy moves on the same GPU. Both count the
 * bytes read plus the bytes written, so the ratio says how close a kernel
 * comes to the memory bandwidth a plain copy gets (target: 0.5 or more).
 * Speed is printed, never judged: the test fails only when the kernels'
 * bytes differ from the CPU reference's on the same 256 MiB, which it
 * checks after timing. Exit 77 without a GPU. */
#include "codec.h"
#include "codec_cuda.h"
#include "codec_internal.h"
#include "feedback.h"
#include "gpu_test.h"

#define N ((size_t)64 << 20) /* 256 MiB of fp32 */
#define REPS 20
#define TARGET_RATIO 0.5

enum op { OP_ENCODE, OP_FEEDBACK, OP_DECODE, OP_DECODE_ACC, OP_COUNT };
static const char *const op_names[OP_COUNT] = { "encode", "feedback encode", "decode", "decode_acc" };

struct bench {
	cudaStream_t stream;
	cudaEvent_t start, stop;
	float *x, *out;
	uint8_t *enc;
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

static double copy_bandwidth(struct bench *b)
{
	float ms;

	CUDA_OK(cudaMemcpyAsync(b->out, b->x, N * sizeof(float), cudaMemcpyDeviceToDevice, b->stream));
	CUDA_OK(cudaEventRecord(b->start, b->stream));
	for (int i = 0; i < REPS; i++)
		CUDA_OK(cudaMemcpyAsync(b->out, b->x, N * sizeof(float), cudaMemcpyDeviceToDevice, b->stream));
	CUDA_OK(cudaEventRecord(b->stop, b->stream));
	CUDA_OK(cudaEventSynchronize(b->stop));
	CUDA_OK(cudaEventElapsedTime(&ms, b->start, b->stop));
	return 2.0 * (double)N * sizeof(float) / (ms / 1e3 / REPS);
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

	ref->encode[p->codec](x, N, p->block_elems, p->scale, want);
	CHECK(gg_codec_encode_cuda(p, b->x, N, b->enc, bytes, b->stream, err, sizeof(err)) == 0, "%s", err);
	CUDA_OK(cudaMemcpyAsync(got, b->enc, bytes, cudaMemcpyDeviceToHost, b->stream));
	CUDA_OK(cudaStreamSynchronize(b->stream));
	CHECK(memcmp(want, got, bytes) == 0, "%s: encoded bytes differ from the reference", gg_codec_name(p->codec));

	for (int acc = 0; acc < 2; acc++) {
		memcpy(out_ref, x, N * sizeof(float));
		CUDA_OK(cudaMemcpyAsync(b->out, x, N * sizeof(float), cudaMemcpyHostToDevice, b->stream));
		(acc ? ref->decode_acc : ref->decode)[p->codec](want, N, p->block_elems, p->scale, out_ref);
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

	gg_feedback_fini_cuda(&b.fb);
	cudaFree(b.x);
	cudaFree(b.out);
	cudaFree(b.enc);
	cudaEventDestroy(b.start);
	cudaEventDestroy(b.stop);
	cudaStreamDestroy(b.stream);
	free(x);
	return 0;
}
