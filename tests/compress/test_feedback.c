/* Error feedback: over 200 steps of slowly varying gradients, the sum of
 * what was decoded must stay within about one step's error of the sum of
 * the inputs, while the same codec without feedback drifts away. Also: a
 * non-finite input resets its residual instead of poisoning later steps,
 * and every instruction set compensates with the bits of the element rule
 * the GPU runs (codec_elem.h), NaN inputs included; gg_feedback_encode,
 * which runs its passes span by span, writes the bytes and residuals of
 * the whole-chunk passes, for every codec, block size and instruction set. */
#include <errno.h>

#include "codec.h"
#include "codec_internal.h"
#include "feedback.h"
#include "test_util.h"

#define N 4096
#define CHUNK (N / 2)
#define STEPS 200

struct run {
	double sum_in[N], sum_fb[N], sum_plain[N];
	double err_fb[STEPS + 1], err_plain[STEPS + 1];
	double step_err; /* largest single-step error of the plain codec */
};

static double max_abs_diff(const double *a, const double *b)
{
	double m = 0;
	for (size_t i = 0; i < N; i++)
		m = fmax(m, fabs(a[i] - b[i]));
	return m;
}

static void run_codec(const struct gg_codec_params *p, struct run *run)
{
	struct gg_feedback fb;
	struct rng r = { 99 };
	static float base[N], x[N], dec[N];
	uint64_t bytes;

	CHECK(gg_codec_encoded_bytes(p, CHUNK, &bytes) == 0, "size");
	uint8_t *enc = xmalloc(bytes);
	CHECK(gg_feedback_init(&fb, N, CHUNK) == 0, "init");
	memset(run, 0, sizeof(*run));
	fill_data(base, N, DATA_GAUSSIAN, &r);

	for (int t = 1; t <= STEPS; t++) {
		for (size_t i = 0; i < N; i++)
			x[i] = base[i] * (float)(1.0 + 0.01 * rng_normal(&r));
		for (size_t off = 0; off < N; off += CHUNK) {
			CHECK(gg_feedback_encode(&fb, p, off, x + off, CHUNK, enc, bytes, NULL) == 0, "feedback encode");
			CHECK(gg_codec_decode(p, enc, bytes, CHUNK, dec + off) == 0, "decode");
		}
		for (size_t i = 0; i < N; i++)
			run->sum_fb[i] += dec[i];
		for (size_t off = 0; off < N; off += CHUNK) {
			CHECK(gg_codec_encode(p, x + off, CHUNK, enc, bytes) == 0, "encode");
			CHECK(gg_codec_decode(p, enc, bytes, CHUNK, dec + off) == 0, "decode");
		}
		for (size_t i = 0; i < N; i++) {
			run->sum_plain[i] += dec[i];
			run->sum_in[i] += x[i];
			run->step_err = fmax(run->step_err, fabs((double)dec[i] - x[i]));
		}
		run->err_fb[t] = max_abs_diff(run->sum_fb, run->sum_in);
		run->err_plain[t] = max_abs_diff(run->sum_plain, run->sum_in);
	}
	gg_feedback_fini(&fb);
	free(enc);
}

static void non_finite_resets(void)
{
	struct gg_codec_params p = gg_codec_defaults(GG_CODEC_INT8);
	struct gg_feedback fb;
	struct rng r = { 1 };
	static float x[N], to_encode[N];
	uint64_t bytes;

	CHECK(gg_codec_encoded_bytes(&p, N, &bytes) == 0, "size");
	uint8_t *enc = xmalloc(bytes);
	CHECK(gg_feedback_init(&fb, N, N) == 0, "init");
	for (int t = 0; t < 5; t++) {
		fill_data(x, N, DATA_GAUSSIAN, &r);
		if (t == 2) {
			x[10] = INFINITY;
			x[11] = NAN;
		}
		/* the two-call form, as a GPU encoder would use it */
		CHECK(gg_feedback_compensate(&fb, 0, x, N, to_encode) == 0, "compensate");
		CHECK(gg_codec_encode(&p, to_encode, N, enc, bytes) == 0, "encode");
		CHECK(gg_feedback_commit(&fb, &p, 0, to_encode, N, enc, bytes) == 0, "commit");
		for (size_t i = 0; i < N; i++)
			CHECK(isfinite(fb.residual[i]), "step %d: residual %zu is %a", t, i, fb.residual[i]);
		if (t == 2)
			CHECK(fb.residual[10] == 0 && fb.residual[11] == 0, "non-finite inputs leave a zero residual");
	}
	CHECK(gg_feedback_compensate(&fb, N - 1, x, 2, to_encode) == -EINVAL, "range past the tensor");
	CHECK(gg_feedback_encode(&fb, &p, 0, x, N + 1, enc, bytes, NULL) == -EINVAL, "chunk over the limit");
	gg_feedback_reset(&fb);
	for (size_t i = 0; i < N; i++)
		CHECK(fb.residual[i] == 0, "reset");
	gg_feedback_fini(&fb);
	free(enc);

	CHECK(gg_feedback_init(&fb, 10, 11) == -EINVAL, "chunk larger than tensor");
}

static void compensate_matches_elem(void)
{
	static float x[N], to_encode[N];
	struct gg_feedback fb;
	struct rng r = { 7 };

	CHECK(gg_feedback_init(&fb, N, N) == 0, "init");
	for (int isa = GG_ISA_SCALAR; isa < GG_ISA_COUNT; isa++) {
		if (gg_codec_set_isa((enum gg_isa)isa))
			continue;
		for (int kind = 0; kind < DATA_KINDS; kind++) {
			fill_data(x, N, (enum data_kind)kind, &r);
			fill_data(fb.residual, N, DATA_GAUSSIAN, &r); /* residuals are always finite */
			CHECK(gg_feedback_compensate(&fb, 0, x, N, to_encode) == 0, "compensate");
			for (size_t i = 0; i < N; i++) {
				float want = gg_feedback_compensate_elem(x[i], fb.residual[i]);
				CHECK(test_bits(to_encode[i]) == test_bits(want), "%s, %s input %zu: %a + %a gave 0x%08x, the element rule 0x%08x",
				      gg_isa_name((enum gg_isa)isa), data_kind_name((enum data_kind)kind), i, x[i],
				      fb.residual[i], test_bits(to_encode[i]), test_bits(want));
			}
		}
	}
	CHECK(gg_codec_set_isa(GG_ISA_SCALAR) == 0, "scalar");
	gg_feedback_fini(&fb);
}

/* gg_feedback_encode against compensate, gg_codec_encode and commit of
 * the whole chunk, three steps in a row (the residuals carry), on chunks
 * of every size around the spans' bounds. */
static void spans_match_whole(void)
{
	enum { MAX = 70000 };
	static const struct gg_codec_params params[] = {
		{ GG_CODEC_BF16, 0, GG_SCALE_F32 },      { GG_CODEC_BF16_SPLIT, 0, GG_SCALE_F32 },
		{ GG_CODEC_INT8, 256, GG_SCALE_F16 },    { GG_CODEC_INT4, 256, GG_SCALE_F16 },
		{ GG_CODEC_INT8, 96, GG_SCALE_F32 },     { GG_CODEC_INT4, 32, GG_SCALE_F32 },
		{ GG_CODEC_INT8, 8192, GG_SCALE_F16 },   { GG_CODEC_INT4, 65536, GG_SCALE_F16 },
	};
	static const size_t sizes[] = { 1, 63, 64, 65, 4095, 4096, 4097, 8193, 65539 };
	static float x[MAX], want_r[MAX];
	static uint8_t got[MAX * 4 + 4096], want[MAX * 4 + 4096];
	struct gg_feedback a, b;
	struct rng r = { 11 };
	int cases = 0;

	CHECK(gg_feedback_init(&a, MAX, MAX) == 0 && gg_feedback_init(&b, MAX, MAX) == 0, "init");
	for (int isa = GG_ISA_SCALAR; isa < GG_ISA_COUNT; isa++) {
		if (gg_codec_set_isa((enum gg_isa)isa))
			continue;
		for (size_t pi = 0; pi < GG_ARRAY_LEN(params); pi++)
			for (size_t si = 0; si < GG_ARRAY_LEN(sizes); si++) {
				const struct gg_codec_params *p = &params[pi];
				size_t n = sizes[si], off = MAX - n;
				uint64_t bytes;
				CHECK(gg_codec_encoded_bytes(p, n, &bytes) == 0 && bytes <= sizeof(got), "size");
				gg_feedback_reset(&a);
				gg_feedback_reset(&b);
				for (int step = 0; step < 3; step++, cases++) {
					fill_data(x, n, step == 1 ? DATA_BITS : DATA_GAUSSIAN, &r);
					CHECK(gg_feedback_encode(&a, p, off, x, n, got, bytes, NULL) == 0, "encode");
					CHECK(gg_feedback_compensate(&b, off, x, n, b.scratch) == 0 &&
						      gg_codec_encode(p, b.scratch, n, want, bytes) == 0 &&
						      gg_feedback_commit(&b, p, off, b.scratch, n, want, bytes) == 0,
					      "the whole-chunk passes");
					CHECK(!memcmp(got, want, bytes), "%s %s block %u, %zu elements, step %d: bytes differ",
					      gg_isa_name((enum gg_isa)isa), gg_codec_name(p->codec), p->block_elems, n, step);
					memcpy(want_r, b.residual + off, n * sizeof(float));
					for (size_t i = 0; i < n; i++)
						CHECK(test_bits(a.residual[off + i]) == test_bits(want_r[i]),
						      "%s %s block %u, %zu elements, step %d: residual %zu is 0x%08x, not 0x%08x",
						      gg_isa_name((enum gg_isa)isa), gg_codec_name(p->codec), p->block_elems, n,
						      step, i, test_bits(a.residual[off + i]), test_bits(want_r[i]));
				}
			}
	}
	CHECK(gg_codec_set_isa(GG_ISA_SCALAR) == 0, "scalar");
	/* A payload too small, a span that does not start on a block. */
	struct gg_codec_params p = { GG_CODEC_INT8, 256, GG_SCALE_F32 };
	uint64_t bytes;
	CHECK(gg_codec_encoded_bytes(&p, 1000, &bytes) == 0, "size");
	CHECK(gg_feedback_encode(&a, &p, 0, x, 1000, got, bytes - 1, NULL) == -ENOBUFS, "a short payload");
	CHECK(gg_codec_encode_span(&p, x, 1000, 0, 256, got, bytes - 1) == -ENOBUFS, "a short payload, one span");
	CHECK(gg_codec_encode_span(&p, x, 1000, 100, 256, got, bytes) == -EINVAL, "a span at 100");
	CHECK(gg_codec_encode_span(&p, x, 1000, 768, 256, got, bytes) == -EINVAL, "a span past the end");
	gg_feedback_fini(&a);
	gg_feedback_fini(&b);
	printf("feedback spans: %d steps, each the whole-chunk passes' bytes and residuals\n", cases);
}

int main(void)
{
	static const enum gg_codec codecs[] = { GG_CODEC_INT8, GG_CODEC_INT4, GG_CODEC_BF16, GG_CODEC_BF16_SPLIT };
	static struct run run;

	for (size_t c = 0; c < GG_ARRAY_LEN(codecs); c++) {
		struct gg_codec_params p = gg_codec_defaults(codecs[c]);
		run_codec(&p, &run);
		printf("%-10s max |sum decoded - sum input| after 1/10/100/200 steps: "
		       "with feedback %.3g %.3g %.3g %.3g, without %.3g %.3g %.3g %.3g (one step: %.3g)\n",
		       gg_codec_name(p.codec), run.err_fb[1], run.err_fb[10], run.err_fb[100], run.err_fb[STEPS],
		       run.err_plain[1], run.err_plain[10], run.err_plain[100], run.err_plain[STEPS], run.step_err);
		/* bounded: never beyond a couple of single-step errors, at any step */
		for (int t = 1; t <= STEPS; t++)
			CHECK(run.err_fb[t] <= 2.0 * run.step_err, "%s: step %d error %g exceeds twice one step's %g",
			      gg_codec_name(p.codec), t, run.err_fb[t], run.step_err);
		/* and not growing, while the plain codec drifts */
		CHECK(run.err_fb[STEPS] <= 2.0 * run.err_fb[10] + 1e-12, "%s: feedback error grows",
		      gg_codec_name(p.codec));
		CHECK(run.err_plain[STEPS] >= 10.0 * run.err_fb[STEPS], "%s: without feedback only %g vs %g",
		      gg_codec_name(p.codec), run.err_plain[STEPS], run.err_fb[STEPS]);
	}
	non_finite_resets();
	compensate_matches_elem();
	spans_match_whole();
	return 0;
}
