/* dav1d checkasm shape: every vectorized kernel against the scalar
 * reference on random inputs of many sizes (odd ones included), special
 * values, random byte soup for the decoders, unaligned buffers and
 * sentinel-filled outputs whose guard bytes must survive. Compared bit for
 * bit (any NaN equals any NaN). Exit 77 when the CPU has no vector path. */
#include "codec.h"
#include "codec_internal.h"
#include "test_util.h"

#define GUARD 64
#define SENTINEL_BYTE 0xa5
#define SENTINEL_FLOAT 0x5a5a5a5au

static const size_t sizes[] = { 0,   1,   2,   7,   15,  16,   17,   31,    32,    33,     63,
				64,  65,  127, 255, 256, 257, 1000, 4097, 65537, 262147 };

static unsigned long long cases;

struct bufs {
	uint8_t *enc_ref, *enc_new;  /* GUARD + bytes + GUARD */
	float *out_ref, *out_new;    /* GUARD + n + GUARD floats */
};

static void fill_sentinel_bytes(uint8_t *p, size_t n)
{
	memset(p, SENTINEL_BYTE, n);
}

static void fill_sentinel_floats(float *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = test_float(SENTINEL_FLOAT);
}

static void compare_floats(const float *a, const float *b, size_t n, const char *op, const char *what,
			   const char *isa)
{
	for (size_t i = 0; i < n + 2 * GUARD; i++) {
		bool guard = i < GUARD || i >= n + GUARD;
		if (guard) {
			CHECK(test_bits(b[i]) == SENTINEL_FLOAT, "%s %s %s: guard float %zd overwritten", isa, op, what,
			      (ptrdiff_t)i - GUARD);
			continue;
		}
		CHECK(same_float(a[i], b[i]), "%s %s %s: element %zu: ref %a (0x%08x), %s %a (0x%08x)", isa, op, what,
		      i - GUARD, a[i], test_bits(a[i]), isa, b[i], test_bits(b[i]));
	}
}

static void check_one(const struct gg_codec_kernels *k, const struct gg_codec_params *p, const float *x,
		      size_t n, struct rng *r, const char *kind)
{
	const struct gg_codec_kernels *ref = &gg_codec_kernels_ref;
	const char *isa = gg_isa_name(k->isa), *name = gg_codec_name(p->codec);
	char what[128];
	uint64_t bytes;

	CHECK(n <= 1u << 24, "size %zu out of the test's range", n);
	CHECK(gg_codec_encoded_bytes(p, n, &bytes) == 0 && bytes <= 1u << 26, "size");
	snprintf(what, sizeof(what), "%s/%s/block %u/%s/n=%zu", name, p->scale ? "f16" : "f32", p->block_elems,
		 kind, n);

	/* encode: odd byte offsets so no store is aligned by luck */
	uint8_t *er = xmalloc(bytes + 2 * GUARD + 1), *en = xmalloc(bytes + 2 * GUARD + 1);
	fill_sentinel_bytes(er, bytes + 2 * GUARD + 1);
	fill_sentinel_bytes(en, bytes + 2 * GUARD + 1);
	gg_encode_whole(ref->encode[p->codec], p->codec, x, n, p->block_elems, p->scale, er + GUARD + 1);
	gg_encode_whole(k->encode[p->codec], p->codec, x, n, p->block_elems, p->scale, en + GUARD + 1);
	for (size_t i = 0; i < bytes + 2 * GUARD + 1; i++)
		CHECK(er[i] == en[i], "%s encode %s: byte %zd: ref 0x%02x, %s 0x%02x%s", isa, what,
		      (ptrdiff_t)i - GUARD - 1, er[i], isa, en[i],
		      i < GUARD + 1 || i >= bytes + GUARD + 1 ? " (guard)" : "");
	cases++;

	/* decode the reference's bytes, then random byte soup (every code, any scale bits) */
	uint8_t *soup = xmalloc(bytes + 1);
	for (size_t i = 0; i < bytes; i++)
		soup[i + 1] = (uint8_t)rng_next(r);
	const uint8_t *inputs[2] = { er + GUARD + 1, soup + 1 };
	float *or_ = xmalloc((n + 2 * GUARD) * sizeof(float)), *on = xmalloc((n + 2 * GUARD) * sizeof(float));
	float *acc0 = xmalloc(n * sizeof(float) + 1);
	for (int in = 0; in < 2; in++) {
		fill_sentinel_floats(or_, n + 2 * GUARD);
		fill_sentinel_floats(on, n + 2 * GUARD);
		gg_decode_whole(ref->decode[p->codec], p->codec, inputs[in], n, p->block_elems, p->scale, or_ + GUARD);
		gg_decode_whole(k->decode[p->codec], p->codec, inputs[in], n, p->block_elems, p->scale, on + GUARD);
		compare_floats(or_, on, n, in ? "decode(soup)" : "decode", what, isa);

		fill_data(acc0, n, DATA_SPECIAL, r);
		memcpy(or_ + GUARD, acc0, n * sizeof(float));
		memcpy(on + GUARD, acc0, n * sizeof(float));
		gg_decode_whole(ref->decode_acc[p->codec], p->codec, inputs[in], n, p->block_elems, p->scale, or_ + GUARD);
		gg_decode_whole(k->decode_acc[p->codec], p->codec, inputs[in], n, p->block_elems, p->scale, on + GUARD);
		compare_floats(or_, on, n, in ? "decode_acc(soup)" : "decode_acc", what, isa);
		cases += 2;
	}
	free(er);
	free(en);
	free(soup);
	free(or_);
	free(on);
	free(acc0);
}

/* The error-feedback kernels: out = a + b, and r = c - r where finite. */
static void check_feedback(const struct gg_codec_kernels *k, const float *a, const float *b, size_t n,
			   const char *kind)
{
	const char *isa = gg_isa_name(k->isa);
	float *o_ref = xmalloc((n + 2 * GUARD) * sizeof(float)), *o_new = xmalloc((n + 2 * GUARD) * sizeof(float));
	char what[96];

	snprintf(what, sizeof(what), "%s/n=%zu", kind, n);
	fill_sentinel_floats(o_ref, n + 2 * GUARD);
	fill_sentinel_floats(o_new, n + 2 * GUARD);
	gg_codec_kernels_ref.add(a, b, n, o_ref + GUARD);
	k->add(a, b, n, o_new + GUARD);
	compare_floats(o_ref, o_new, n, "add", what, isa);
	for (size_t i = 0; i < n; i++)
		o_ref[GUARD + i] = o_new[GUARD + i] = b[i];
	gg_codec_kernels_ref.residual(a, o_ref + GUARD, n);
	k->residual(a, o_new + GUARD, n);
	compare_floats(o_ref, o_new, n, "residual", what, isa);
	for (size_t i = 0; i < n; i++)
		CHECK(isfinite(o_new[GUARD + i]), "%s residual %s: element %zu not finite", isa, what, i);
	cases += 2;
	free(o_ref);
	free(o_new);
}

static void check_isa(const struct gg_codec_kernels *k)
{
	static const uint32_t blocks[] = { 32, 96, 256, 4096 };
	struct rng r = { 0x5eed + (uint64_t)k->isa };
	unsigned long long before = cases;

	for (int c = GG_CODEC_FIRST; c <= GG_CODEC_LAST; c++) {
		for (size_t bi = 0; bi < GG_ARRAY_LEN(blocks); bi++) {
			for (int sk = 0; sk < 2; sk++) {
				struct gg_codec_params p = gg_codec_defaults((enum gg_codec)c);
				if (gg_codec_has_blocks(p.codec)) {
					p.block_elems = blocks[bi];
					p.scale = (enum gg_scale_kind)sk;
				} else if (bi || sk) {
					continue;
				}
				for (size_t si = 0; si < GG_ARRAY_LEN(sizes); si++) {
					size_t n = sizes[si];
					/* +1: the input starts one float past an aligned address */
					float *buf = xmalloc((n + 1) * sizeof(float)), *x = buf + 1;
					for (int kind = 0; kind < DATA_KINDS; kind++) {
						if (n > 100000 && kind != DATA_SPECIAL && kind != DATA_GAUSSIAN)
							continue;
						fill_data(x, n, (enum data_kind)kind, &r);
						check_one(k, &p, x, n, &r, data_kind_name((enum data_kind)kind));
					}
					free(buf);
				}
			}
		}
		printf("%-7s %-10s encode/decode/decode_acc match the reference\n", gg_isa_name(k->isa),
		       gg_codec_name((enum gg_codec)c));
	}
	for (size_t si = 0; si < GG_ARRAY_LEN(sizes); si++) {
		size_t n = sizes[si];
		float *buf = xmalloc((2 * n + 1) * sizeof(float)), *x = buf + 1, *y = x + n;
		for (int kind = 0; kind < DATA_KINDS; kind++) {
			fill_data(x, n, (enum data_kind)kind, &r);
			fill_data(y, n, (enum data_kind)((kind + 1) % DATA_KINDS), &r);
			check_feedback(k, x, y, n, data_kind_name((enum data_kind)kind));
		}
		free(buf);
	}
	printf("%-7s error-feedback add/residual match the reference\n", gg_isa_name(k->isa));
	printf("%s: %llu cases\n", gg_isa_name(k->isa), cases - before);
}

int main(void)
{
	int tested = 0;

	for (int isa = GG_ISA_SCALAR + 1; isa < GG_ISA_COUNT; isa++) {
		const struct gg_codec_kernels *k = gg_codec_kernels_for((enum gg_isa)isa);
		if (!k) {
			printf("%s: not available on this CPU or build, skipped\n", gg_isa_name((enum gg_isa)isa));
			continue;
		}
		check_isa(k);
		tested++;
	}
	return tested ? 0 : SKIP_EXIT;
}
