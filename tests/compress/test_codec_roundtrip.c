/* Every codec against its definition in codec.h: golden byte vectors that a
 * GPU port can reuse, then random data of every kind through the public API
 * with the lossless/lossy contracts checked element by element by code that
 * does not share the implementation's arithmetic. */
#include <errno.h>

#include "codec.h"
#include "codec_internal.h"
#include "test_util.h"

static void expect_bytes(const char *what, const uint8_t *got, const uint8_t *want, size_t n)
{
	for (size_t i = 0; i < n; i++)
		CHECK(got[i] == want[i], "%s: byte %zu is 0x%02x, want 0x%02x", what, i, got[i], want[i]);
}

static void golden_bf16(void)
{
	const float in[] = { 1.0f, 0x1.01p0f, 0x1.03p0f, -0.0f, INFINITY, test_float(0x7f800001u),
			     0x1.fffffep127f, 0x1p-149f, test_float(0x00008000u), test_float(0x00018000u) };
	const uint16_t want[] = { 0x3f80, 0x3f80, 0x3f82, 0x8000, 0x7f80, 0x7fc0, 0x7f80, 0x0000, 0x0000, 0x0002 };
	const size_t n = GG_ARRAY_LEN(in);
	struct gg_codec_params p = gg_codec_defaults(GG_CODEC_BF16);
	uint8_t out[2 * GG_ARRAY_LEN(in)], split[2 * GG_ARRAY_LEN(in)];

	CHECK(gg_codec_encode(&p, in, n, out, sizeof(out)) == 0, "bf16 encode");
	for (size_t i = 0; i < n; i++)
		CHECK((out[2 * i] | out[2 * i + 1] << 8) == want[i], "bf16 golden %zu: 0x%04x want 0x%04x", i,
		      out[2 * i] | out[2 * i + 1] << 8, want[i]);
	p = gg_codec_defaults(GG_CODEC_BF16_SPLIT);
	CHECK(gg_codec_encode(&p, in, n, split, sizeof(split)) == 0, "split encode");
	for (size_t i = 0; i < n; i++) {
		CHECK(split[i] == (want[i] & 0xff), "split low plane %zu", i);
		CHECK(split[n + i] == want[i] >> 8, "split high plane %zu", i);
	}
}

static void golden_int(void)
{
	float in[40] = { 127.0f, 0.5f, 1.5f, 2.5f, -126.5f, INFINITY, NAN, -127.0f };
	in[32] = 3.0f; /* second (tail) block: 8 elements, absmax 3 */
	in[33] = -1.5f;
	/* scales 1.0 and 3/127 (0x3cc18306), then the codes */
	uint8_t want[2 * 4 + 40] = { 0x00, 0x00, 0x80, 0x3f, 0x06, 0x83, 0xc1, 0x3c,
				     0x7f, 0x00, 0x02, 0x02, 0x82, 0x80, 0x80, 0x81 };
	/* -1.5 / (3/127) is exactly -63.5 in fp32 and ties to even: -64 */
	want[8 + 32] = 0x7f;
	want[8 + 33] = 0xc0;
	uint8_t out[sizeof(want)];
	struct gg_codec_params p = { GG_CODEC_INT8, 32, GG_SCALE_F32 };

	CHECK(gg_codec_encode(&p, in, 40, out, sizeof(out)) == 0, "int8 encode");
	expect_bytes("int8 golden", out, want, sizeof(want));

	float dec[40];
	CHECK(gg_codec_decode(&p, out, sizeof(out), 40, dec) == 0, "int8 decode");
	CHECK(dec[0] == 127.0f && dec[1] == 0.0f && dec[2] == 2.0f && dec[4] == -126.0f, "int8 values");
	CHECK(isnan(dec[5]) && isnan(dec[6]), "non-finite inputs decode as NaN");

	/* int4: element 2j in the low nibble; odd count leaves the last high nibble 0 */
	const float in4[5] = { 7.0f, -7.0f, 0.5f, 1.5f, INFINITY };
	const uint8_t want4[4 + 3] = { 0x00, 0x00, 0x80, 0x3f, 0x97, 0x20, 0x08 };
	uint8_t out4[sizeof(want4)];
	p = (struct gg_codec_params){ GG_CODEC_INT4, 32, GG_SCALE_F32 };
	CHECK(gg_codec_encode(&p, in4, 5, out4, sizeof(out4)) == 0, "int4 encode");
	expect_bytes("int4 golden", out4, want4, sizeof(want4));

	/* fp16 scales round up: 1.0 stays 0x3c00; tiny scales become 2^-24 */
	const float in16[2] = { 127.0f, -1e-30f };
	uint8_t out16[2 + 2];
	p = (struct gg_codec_params){ GG_CODEC_INT8, 32, GG_SCALE_F16 };
	CHECK(gg_codec_encode(&p, in16, 2, out16, sizeof(out16)) == 0, "fp16 encode");
	CHECK(out16[0] == 0x00 && out16[1] == 0x3c && out16[2] == 0x7f && out16[3] == 0x00, "fp16 golden");
	const float tiny[1] = { 1e-30f };
	CHECK(gg_codec_encode(&p, tiny, 1, out16, 3) == 0, "fp16 tiny");
	CHECK(out16[0] == 0x01 && out16[1] == 0x00 && out16[2] == 0x00, "tiny scale is 2^-24, code 0");

	/* a block beyond fp16 range decodes all non-finite */
	const float big[3] = { 1e7f, 1.0f, 0.0f };
	float decbig[3];
	uint8_t outbig[2 + 3];
	CHECK(gg_codec_encode(&p, big, 3, outbig, sizeof(outbig)) == 0, "fp16 big");
	CHECK(outbig[0] == 0x00 && outbig[1] == 0x7c, "out-of-range marker is +inf");
	CHECK(gg_codec_decode(&p, outbig, sizeof(outbig), 3, decbig) == 0, "decode big");
	for (int i = 0; i < 3; i++)
		CHECK(!isfinite(decbig[i]), "element %d of an fp16-overflow block is finite", i);
}

/* Round-to-nearest-even to bf16 in double arithmetic, independently of
 * the bit trick the codec uses. */
static float bf16_rne_double(float x)
{
	if (x == 0.0f || isinf(x))
		return x;
	int e;
	frexp((double)x, &e); /* |x| in [2^(e-1), 2^e) */
	int lsb_exp = GG_MAX(e - 1, -126) - 7;
	double q = ldexp((double)x, -lsb_exp);
	double r = nearbyint(q);
	double y = ldexp(r, lsb_exp);
	if (fabs(y) >= 0x1p128)
		return copysignf(INFINITY, x);
	return (float)y;
}

static float stored_scale(const uint8_t *enc, size_t k, enum gg_scale_kind sk)
{
	return gg_block_scale_load(enc + k * gg_scale_bytes(sk), sk);
}

static void check_lossy_int(const struct gg_codec_params *p, const float *x, size_t n,
			    const uint8_t *enc, const float *dec, const char *what)
{
	int qmax = p->codec == GG_CODEC_INT8 ? GG_INT8_QMAX : GG_INT4_QMAX;
	size_t nb = n ? gg_block_count(n, p->block_elems) : 0;

	for (size_t k = 0; k < nb; k++) {
		size_t off = k * p->block_elems, len = GG_MIN((size_t)p->block_elems, n - off);
		double m = 0;
		for (size_t i = off; i < off + len; i++)
			if (isfinite(x[i]))
				m = fmax(m, fabs((double)x[i]));
		float s = stored_scale(enc, k, p->scale);
		double exact = m / qmax;
		if (p->scale == GG_SCALE_F32)
			CHECK((double)s == (double)(float)exact || (m == 0 && s == 0), "%s: block %zu scale %a, m %a",
			      what, k, s, m);
		else
			CHECK(isinf(s) ? exact > 65504 : (s >= exact * (1 - 0x1p-23) && s <= exact * (1 + 0x1p-10) + 0x1p-24) ||
					(s == 0 && (float)exact == 0),
			      "%s: block %zu fp16 scale %a for m/Q %a", what, k, s, exact);
		for (size_t i = off; i < off + len; i++) {
			if (!isfinite(x[i])) {
				CHECK(isnan(dec[i]), "%s: element %zu: %a decoded as %a, want NaN", what, i, x[i], dec[i]);
				continue;
			}
			if (isinf(s)) {
				CHECK(!isfinite(dec[i]), "%s: element %zu of an out-of-range block is finite", what, i);
				continue;
			}
			if (isinf(dec[i]) && m > 0x1.fffep127) /* q * s rounding past FLT_MAX */
				continue;
			double bound = 0.5 * s * (1 + 0x1p-14) + 0x1p-140;
			double err = fabs((double)dec[i] - (double)x[i]);
			CHECK(err <= bound, "%s: element %zu: %a decoded as %a, error %g > bound %g (scale %a)", what,
			      i, x[i], dec[i], err, bound, s);
		}
	}
}

static void check_codec(const struct gg_codec_params *p, const float *x, size_t n, struct rng *r,
			const char *what)
{
	uint64_t bytes;
	CHECK(gg_codec_encoded_bytes(p, n, &bytes) == 0, "%s: size", what);
	uint8_t *enc = xmalloc(bytes);
	float *dec = xmalloc(n * sizeof(float)), *acc = xmalloc(n * sizeof(float));
	float *acc0 = xmalloc(n * sizeof(float));

	CHECK(gg_codec_encode(p, x, n, enc, bytes) == 0, "%s: encode", what);
	CHECK(gg_codec_decode(p, enc, bytes, n, dec) == 0, "%s: decode", what);
	fill_data(acc0, n, DATA_SPECIAL, r);
	memcpy(acc, acc0, n * sizeof(float));
	CHECK(gg_codec_decode_acc(p, enc, bytes, n, acc) == 0, "%s: decode_acc", what);
	for (size_t i = 0; i < n; i++)
		CHECK(same_float(acc[i], acc0[i] + dec[i]), "%s: element %zu: acc %a + %a gave %a", what, i,
		      acc0[i], dec[i], acc[i]);

	switch (p->codec) {
	case GG_CODEC_FP32:
		CHECK(memcmp(dec, x, n * sizeof(float)) == 0 || n == 0, "%s: fp32 is not lossless", what);
		break;
	case GG_CODEC_BF16:
	case GG_CODEC_BF16_SPLIT:
		for (size_t i = 0; i < n; i++) {
			if (isnan(x[i])) {
				CHECK(isnan(dec[i]) && signbit(dec[i]) == signbit(x[i]), "%s: NaN %zu", what, i);
				continue;
			}
			float want = bf16_rne_double(x[i]);
			CHECK(test_bits(dec[i]) == test_bits(want), "%s: element %zu: %a decoded as %a, want %a", what,
			      i, x[i], dec[i], want);
		}
		break;
	case GG_CODEC_INT8:
	case GG_CODEC_INT4:
		check_lossy_int(p, x, n, enc, dec, what);
		break;
	}

	/* bf16 input: the same bytes as encoding the widened values */
	uint16_t *b = xmalloc(n * sizeof(uint16_t));
	float *w = xmalloc(n * sizeof(float));
	uint8_t *enc2 = xmalloc(bytes), *enc3 = xmalloc(bytes);
	for (size_t i = 0; i < n; i++) {
		b[i] = gg_bf16_from_f32(x[i]);
		w[i] = gg_bf16_to_f32(b[i]);
	}
	CHECK(gg_codec_encode_bf16(p, b, n, enc2, bytes) == 0, "%s: encode_bf16", what);
	CHECK(gg_codec_encode(p, w, n, enc3, bytes) == 0, "%s: encode widened", what);
	CHECK(bytes == 0 || memcmp(enc2, enc3, bytes) == 0, "%s: bf16 input differs from widened input", what);

	free(b);
	free(w);
	free(enc2);
	free(enc3);
	free(enc);
	free(dec);
	free(acc);
	free(acc0);
}

static void random_roundtrips(void)
{
	static const size_t sizes[] = { 0, 1, 2, 7, 31, 32, 33, 255, 256, 257, 1000, 4099, 65537 };
	static const uint32_t blocks[] = { 32, 256, 4096 };
	struct rng r = { 42 };
	char what[160];

	for (int c = GG_CODEC_FIRST; c <= GG_CODEC_LAST; c++) {
		for (int sk = 0; sk < 2; sk++) {
			for (size_t bi = 0; bi < GG_ARRAY_LEN(blocks); bi++) {
				struct gg_codec_params p = gg_codec_defaults((enum gg_codec)c);
				if (gg_codec_has_blocks(p.codec)) {
					p.block_elems = blocks[bi];
					p.scale = (enum gg_scale_kind)sk;
				} else if (sk || bi) {
					continue;
				}
				for (int kind = 0; kind < DATA_KINDS; kind++) {
					for (size_t si = 0; si < GG_ARRAY_LEN(sizes); si++) {
						size_t n = sizes[si];
						float *x = xmalloc(n * sizeof(float));
						fill_data(x, n, (enum data_kind)kind, &r);
						snprintf(what, sizeof(what), "%s/%s/block %u/%s/n=%zu",
							 gg_codec_name(p.codec), sk ? "f16" : "f32", p.block_elems,
							 data_kind_name((enum data_kind)kind), n);
						check_codec(&p, x, n, &r, what);
						free(x);
					}
				}
			}
		}
	}
}

static void api_errors(void)
{
	enum gg_codec c;
	const char *why = NULL;
	struct gg_codec_params p;
	uint64_t bytes;
	float x[64] = { 0 };
	uint8_t buf[512];

	CHECK(gg_codec_from_name("bf16-split", &c) == 0 && c == GG_CODEC_BF16_SPLIT, "lookup");
	for (int i = GG_CODEC_FIRST; i <= GG_CODEC_LAST; i++)
		CHECK(gg_codec_from_name(gg_codec_name((enum gg_codec)i), &c) == 0 && (int)c == i, "names round-trip");
	CHECK(gg_codec_from_name("int2", &c) == -EINVAL, "unknown name");
	CHECK(gg_codec_name((enum gg_codec)9) == NULL, "unknown id");

	p = (struct gg_codec_params){ GG_CODEC_INT8, 100, GG_SCALE_F32 };
	CHECK(gg_codec_params_check(&p, &why) == -EINVAL && why, "block 100");
	p.block_elems = 0;
	CHECK(gg_codec_params_check(&p, &why) == -EINVAL, "block 0");
	p.block_elems = 65536 + 32;
	CHECK(gg_codec_params_check(&p, &why) == -EINVAL, "block too large");
	p = (struct gg_codec_params){ GG_CODEC_BF16, 256, GG_SCALE_F32 };
	CHECK(gg_codec_params_check(&p, &why) == -EINVAL, "block on bf16");

	p = gg_codec_defaults(GG_CODEC_INT4);
	CHECK(gg_codec_encoded_bytes(&p, 257, &bytes) == 0 && bytes == 2 * 4 + 129, "int4 size %llu",
	      (unsigned long long)bytes);
	p.scale = GG_SCALE_F16;
	CHECK(gg_codec_encoded_bytes(&p, 256, &bytes) == 0 && bytes == 2 + 128, "int4 f16 size");
	p = gg_codec_defaults(GG_CODEC_FP32);
	CHECK(gg_codec_encoded_bytes(&p, UINT64_MAX / 2, &bytes) == -EOVERFLOW, "overflow");
	CHECK(gg_codec_encode(&p, x, 64, buf, 255) == -ENOBUFS, "small dst");
	CHECK(gg_codec_decode(&p, buf, 255, 64, x) == -EBADMSG, "short src");
	CHECK(gg_codec_decode(&p, buf, 257, 64, x) == -EBADMSG, "long src");
}

int main(void)
{
	/* read at first use: the cap that lets users and tests force a path */
	CHECK(setenv("GG_CODEC_ISA", "scalar", 1) == 0, "setenv");
	CHECK(gg_codec_isa() == GG_ISA_SCALAR, "GG_CODEC_ISA=scalar is ignored");
	CHECK(gg_codec_set_isa((enum gg_isa)7) == -ENOTSUP, "unknown isa");
	api_errors();
	golden_bf16();
	golden_int();
	for (int isa = 0; isa < GG_ISA_COUNT; isa++) {
		if (gg_codec_set_isa((enum gg_isa)isa))
			continue;
		random_roundtrips();
		printf("codec round trips hold with %s kernels\n", gg_isa_name((enum gg_isa)isa));
	}
	return 0;
}
