/* The CUDA kernels of cuda/codec_kernels.cuh, run on the CPU under an
 * emulation of warps and shuffles (cuda_emu.h) and compared with the
 * reference bit for bit, so that a machine without a GPU checks what it
 * can of them: which thread computes which element, block boundaries and
 * tails, int4 pairs, scale slots, grid-stride loops over one block, a few,
 * and one per work item, every lane reaching every shuffle, error feedback
 * over several steps, and no byte written outside the output. The device
 * arithmetic itself (the _rn intrinsics) runs in tests/gpu, on a GPU. */
#include "cuda_emu.h"

#include "codec_kernels.cuh"

extern "C" {
#include "codec_internal.h"
#include "feedback.h"
}
#include "test_util.h"

#define GUARD 64
#define GUARD_FLOATS (GUARD / 4)
#define SENTINEL_BYTE 0xa5
#define SENTINEL_FLOAT 0x5a5a5a5au
#define POISON_BYTE 0x77
#define POISON_FLOAT 3e38f /* past an input: reading it would change a scale or a code */

static const size_t sizes[] = { 1, 2, 31, 33, 255, 257, 1000, 4097, 65537 };
static const uint32_t block_sizes[] = { 32, 96, 256, 4096, 65536 };
static unsigned long long cases;

struct bufs {
	uint8_t *want, *got, *soup; /* encoded bytes, poison after; got with guards */
	float *out_ref, *out_got;   /* n floats; out_got with guards */
	float *acc0;
	float *res_got; /* residuals, with guards */
};

/* Poison after the n inputs (and GUARD_FLOATS before them, set once). */
static void poison_after(float *x, size_t n)
{
	for (size_t i = 0; i < GUARD_FLOATS; i++)
		x[n + i] = POISON_FLOAT;
}

static void check_bytes(const uint8_t *want, const uint8_t *got, size_t bytes, const char *op, const char *what)
{
	for (size_t i = 0; i < bytes + 2 * GUARD; i++) {
		bool guard = i < GUARD || i >= bytes + GUARD;
		CHECK(got[i] == (guard ? SENTINEL_BYTE : want[i - GUARD]), "%s %s: byte %zd of %zu%s: want 0x%02x, got 0x%02x",
		      op, what, (ptrdiff_t)i - GUARD, bytes, guard ? " (guard)" : "",
		      guard ? SENTINEL_BYTE : want[i - GUARD], got[i]);
	}
}

static void check_floats(const float *want, const float *got, size_t n, const char *op, const char *what)
{
	for (size_t i = 0; i < n + 2 * GUARD_FLOATS; i++) {
		if (i < GUARD_FLOATS || i >= n + GUARD_FLOATS)
			CHECK(test_bits(got[i]) == SENTINEL_FLOAT, "%s %s: guard float %zd overwritten", op, what,
			      (ptrdiff_t)i - GUARD_FLOATS);
		else
			CHECK(same_float(want[i - GUARD_FLOATS], got[i]), "%s %s: element %zu: want %a, got %a", op, what,
			      i - GUARD_FLOATS, want[i - GUARD_FLOATS], got[i]);
	}
}

static void sentinel_floats(float *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = test_float(SENTINEL_FLOAT);
}

/* Grids to launch: one block (each warp strides over many work items), a
 * few, and one thread per work item, as the host side asks for. */
static void grids(const struct gg_codec_params *p, size_t n, unsigned out[3])
{
	out[0] = 1;
	out[1] = 3;
	out[2] = blocks_for(p, n);
}

static void decode_one(const struct gg_codec_params *p, unsigned grid, const uint8_t *in, size_t n, bool acc,
		       struct bufs *b, const char *op, const char *what)
{
	const struct gg_codec_kernels *ref = &gg_codec_kernels_ref;

	sentinel_floats(b->out_got, n + 2 * GUARD_FLOATS);
	if (acc) {
		memcpy(b->out_ref, b->acc0, n * sizeof(float));
		memcpy(b->out_got + GUARD_FLOATS, b->acc0, n * sizeof(float));
		gg_decode_whole(ref->decode_acc[p->codec], p->codec, in, n, p->block_elems, p->scale, b->out_ref);
		CHECK(enqueue_decode<true>(p, grid, nullptr, in, n, b->out_got + GUARD_FLOATS) == cudaSuccess, "launch");
	} else {
		gg_decode_whole(ref->decode[p->codec], p->codec, in, n, p->block_elems, p->scale, b->out_ref);
		CHECK(enqueue_decode<false>(p, grid, nullptr, in, n, b->out_got + GUARD_FLOATS) == cudaSuccess, "launch");
	}
	check_floats(b->out_ref, b->out_got, n, op, what);
	cases++;
}

static void check_case(const struct gg_codec_params *p, const float *x, size_t n, const char *kind, struct bufs *b,
		       struct rng *r)
{
	uint64_t bytes;
	unsigned g[3];
	char what[160];

	CHECK(gg_codec_encoded_bytes(p, n, &bytes) == 0, "size");
	gg_encode_whole(gg_codec_kernels_ref.encode[p->codec], p->codec, x, n, p->block_elems, p->scale, b->want);
	for (size_t i = 0; i < bytes; i++)
		b->soup[i] = (uint8_t)rng_next(r);
	memset(b->want + bytes, POISON_BYTE, GUARD);
	memset(b->soup + bytes, POISON_BYTE, GUARD);
	fill_data(b->acc0, n, DATA_SPECIAL, r);
	grids(p, n, g);
	for (int gi = 0; gi < 3; gi++) {
		snprintf(what, sizeof(what), "%s/%s/block %u/%s/n=%zu/grid %u", gg_codec_name(p->codec),
			 p->scale ? "f16" : "f32", p->block_elems, kind, n, g[gi]);
		memset(b->got, SENTINEL_BYTE, bytes + 2 * GUARD);
		CHECK(enqueue_encode<false>(p, g[gi], nullptr, x, nullptr, n, b->got + GUARD) == cudaSuccess, "launch");
		check_bytes(b->want, b->got, bytes, "encode", what);
		cases++;
		decode_one(p, g[gi], b->want, n, false, b, "decode", what);
		decode_one(p, g[gi], b->want, n, true, b, "decode_acc", what);
		decode_one(p, g[gi], b->soup, n, false, b, "decode(soup)", what);
		decode_one(p, g[gi], b->soup, n, true, b, "decode_acc(soup)", what);
	}
}

/* Steps of error feedback from zero residuals, against gg_feedback_encode(). */
static void check_feedback(const struct gg_codec_params *p, size_t n, struct bufs *b, struct rng *r)
{
	static const enum data_kind step_data[] = { DATA_GAUSSIAN, DATA_SPECIAL, DATA_BITS, DATA_OUTLIERS };
	float *xbuf = static_cast<float *>(xmalloc((n + 2 * GUARD_FLOATS) * sizeof(float))), *x = xbuf + GUARD_FLOATS;
	float *res = b->res_got + GUARD_FLOATS;
	struct gg_feedback fb;
	uint64_t bytes;
	unsigned g[3];
	char what[160];

	CHECK(gg_codec_encoded_bytes(p, n, &bytes) == 0, "size");
	CHECK(gg_feedback_init(&fb, n, n) == 0, "feedback init");
	sentinel_floats(b->res_got, n + 2 * GUARD_FLOATS);
	memset(res, 0, n * sizeof(float));
	for (size_t i = 0; i < GUARD_FLOATS; i++)
		xbuf[i] = POISON_FLOAT;
	grids(p, n, g);
	for (size_t t = 0; t < GG_ARRAY_LEN(step_data); t++) {
		unsigned grid = g[t % 3];
		snprintf(what, sizeof(what), "%s/%s/block %u/n=%zu/grid %u/step %zu", gg_codec_name(p->codec),
			 p->scale ? "f16" : "f32", p->block_elems, n, grid, t);
		fill_data(x, n, step_data[t], r);
		poison_after(x, n);
		CHECK(gg_feedback_encode(&fb, p, 0, x, n, b->want, bytes, NULL) == 0, "cpu feedback encode");
		memset(b->got, SENTINEL_BYTE, bytes + 2 * GUARD);
		CHECK(enqueue_encode<true>(p, grid, nullptr, x, res, n, b->got + GUARD) == cudaSuccess, "launch");
		check_bytes(b->want, b->got, bytes, "feedback encode", what);
		check_floats(fb.residual, b->res_got, n, "feedback residual", what);
		for (size_t i = 0; i < n; i++)
			CHECK(test_bits(res[i]) == test_bits(fb.residual[i]), "feedback %s: residual %zu: want %a, got %a", what,
			      i, fb.residual[i], res[i]);
		cases++;
	}
	gg_feedback_fini(&fb);
	free(xbuf);
}

int main(void)
{
	size_t max_n = sizes[GG_ARRAY_LEN(sizes) - 1];
	struct rng r = { 0xe3u };
	struct bufs b;
	float *xbuf = static_cast<float *>(xmalloc((max_n + 2 * GUARD_FLOATS) * sizeof(float))), *x = xbuf + GUARD_FLOATS;

	for (size_t i = 0; i < GUARD_FLOATS; i++)
		xbuf[i] = POISON_FLOAT;
	b.want = static_cast<uint8_t *>(xmalloc(4 * max_n + GUARD));
	b.soup = static_cast<uint8_t *>(xmalloc(4 * max_n + GUARD));
	b.got = static_cast<uint8_t *>(xmalloc(4 * max_n + 2 * GUARD));
	b.out_ref = static_cast<float *>(xmalloc(max_n * sizeof(float)));
	b.out_got = static_cast<float *>(xmalloc((max_n + 2 * GUARD_FLOATS) * sizeof(float)));
	b.acc0 = static_cast<float *>(xmalloc(max_n * sizeof(float)));
	b.res_got = static_cast<float *>(xmalloc((max_n + 2 * GUARD_FLOATS) * sizeof(float)));

	for (int c = GG_CODEC_FIRST; c <= GG_CODEC_LAST; c++) {
		unsigned long long before = cases;
		for (size_t bi = 0; bi < GG_ARRAY_LEN(block_sizes); bi++) {
			for (int sk = GG_SCALE_F32; sk <= GG_SCALE_F16; sk++) {
				struct gg_codec_params p = gg_codec_defaults((enum gg_codec)c);
				if (gg_codec_has_blocks(p.codec)) {
					p.block_elems = block_sizes[bi];
					p.scale = (enum gg_scale_kind)sk;
				} else if (bi || sk) {
					continue;
				}
				for (size_t si = 0; si < GG_ARRAY_LEN(sizes); si++) {
					size_t n = sizes[si];
					/* n = 4097 already spans many small blocks and a
					 * tail; the largest n is for the largest blocks. */
					if (n > 4097 && gg_codec_has_blocks(p.codec) && p.block_elems < 4096)
						continue;
					for (int kind = DATA_SPECIAL; kind <= DATA_BITS; kind++) {
						fill_data(x, n, (enum data_kind)kind, &r);
						poison_after(x, n);
						check_case(&p, x, n, data_kind_name((enum data_kind)kind), &b, &r);
					}
					if (n <= 4097)
						check_feedback(&p, n, &b, &r);
				}
			}
		}
		printf("%-10s encode, feedback encode, decode, decode_acc: %llu cases match the reference\n",
		       gg_codec_name((enum gg_codec)c), cases - before);
	}
	printf("emulated %llu warps, %llu shuffles; %llu cases\n", emu.warps, emu.shuffles, cases);
	free(xbuf);
	free(b.want);
	free(b.soup);
	free(b.got);
	free(b.out_ref);
	free(b.out_got);
	free(b.acc0);
	free(b.res_got);
	return 0;
}
