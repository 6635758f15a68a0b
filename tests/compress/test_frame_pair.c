/* gg_frame_decode_sum writes exactly what storing the first frame and
 * adding the others write, bit for bit (NaN payloads and signed zeros
 * included), on every kernel set, for every codec and block size with and
 * without zstd (the fused sweep is for frames of one codec without zstd;
 * the others take the separate decodes), for two frames and for up to
 * eight, and names the frame at fault when one is bad;
 * gg_codec_decode_span refuses spans that do not start and end where it
 * says. */
#include <errno.h>

#include "codec.h"
#include "frame.h"
#include "test_util.h"

#define MAX_ELEMS (1u << 17)

static char err[256];

struct framed {
	uint8_t *bytes;
	size_t len;
};

static void make_frame(const struct gg_frame_config *cfg, const float *x, size_t n, struct framed *f)
{
	struct gg_frame_encoder enc;
	uint64_t bound;

	CHECK(gg_frame_encoder_init(&enc, cfg) == 0 && gg_frame_bound(&cfg->codec, n, &bound) == 0, "encoder");
	f->bytes = xmalloc(bound);
	CHECK(gg_frame_encode(&enc, x, n, f->bytes, bound, &f->len) == 0, "encode");
	gg_frame_encoder_fini(&enc);
}

/* Pairs of NaNs with other signs and payloads, zeros of both signs,
 * infinities against each other, at the same places in both inputs. */
static void fill_clashing(float *x0, float *x1, size_t n, struct rng *r)
{
	for (size_t i = 0; i < n; i++) {
		uint32_t p = (uint32_t)rng_next(r) & 0x003fffffu;
		switch (i % 6) {
		case 0: /* NaN + NaN: whose payload? */
			x0[i] = test_float(0x7fc00000u | p);
			x1[i] = test_float(0xffc00000u | (p ^ 0x155555u));
			break;
		case 1: /* signalling NaN + number */
			x0[i] = test_float(0x7f800001u | p);
			x1[i] = 1.5f;
			break;
		case 2: /* number + NaN */
			x0[i] = -2.0f;
			x1[i] = test_float(0xff800000u | (p | 1u));
			break;
		case 3: /* -0 + -0, +0 + -0 */
			x0[i] = i % 12 == 3 ? -0.0f : 0.0f;
			x1[i] = -0.0f;
			break;
		case 4: /* inf - inf */
			x0[i] = test_float(0x7f800000u);
			x1[i] = test_float(0xff800000u);
			break;
		default:
			x0[i] = (float)rng_normal(r);
			x1[i] = (float)rng_normal(r);
		}
	}
}

/* gg_frame_decode_sum of two frames. */
static int decode_two(struct gg_frame_decoder *dec, const struct framed *f0, const struct framed *f1, float *out,
		      size_t n, unsigned *bad)
{
	const void *frames[2] = { f0->bytes, f1->bytes };
	const size_t lens[2] = { f0->len, f1->len };

	return gg_frame_decode_sum(dec, frames, lens, 2, out, n, bad, err, sizeof(err));
}

static void check_pair(const struct gg_frame_config *c0, const struct gg_frame_config *c1, const float *x0,
		       const float *x1, size_t n, struct gg_frame_decoder *dec)
{
	struct framed f0, f1;
	float *want = xmalloc((n + 1) * sizeof(float)), *got = xmalloc((n + 1) * sizeof(float));
	unsigned bad = 9;

	make_frame(c0, x0, n, &f0);
	make_frame(c1, x1, n, &f1);
	CHECK(gg_frame_decode(dec, f0.bytes, f0.len, want, n, GG_FRAME_STORE, NULL, err, sizeof(err)) == 0, "%s",
	      err);
	CHECK(gg_frame_decode(dec, f1.bytes, f1.len, want, n, GG_FRAME_ACCUMULATE, NULL, err, sizeof(err)) == 0,
	      "%s", err);
	memset(got, 0xa5, (n + 1) * sizeof(float));
	CHECK(decode_two(dec, &f0, &f1, got, n, &bad) == 0,
	      "%s + %s, %zu elements: %s", gg_codec_name(c0->codec.codec), gg_codec_name(c1->codec.codec), n, err);
	for (size_t i = 0; i < n; i++)
		CHECK(test_bits(got[i]) == test_bits(want[i]), "%s%s + %s%s, %zu elements: element %zu is %08x, the two "
		      "decodes give %08x", gg_codec_name(c0->codec.codec), c0->zstd ? "+zstd" : "",
		      gg_codec_name(c1->codec.codec), c1->zstd ? "+zstd" : "", n, i, test_bits(got[i]),
		      test_bits(want[i]));
	CHECK(test_bits(got[n]) == 0xa5a5a5a5u, "written past the end");

	if (n) {
		/* A bad checksum in either frame is refused, naming that frame.
		 * (The header's: a flipped bit of a zstd stream may decompress to
		 * the same bytes.) */
		const size_t at = 28;
		f0.bytes[at] ^= 1;
		CHECK(decode_two(dec, &f0, &f1, got, n, &bad) < 0 &&
			      bad == 0,
		      "a bad first frame: bad %u, %s", bad, err);
		f0.bytes[at] ^= 1;
		f1.bytes[at] ^= 1;
		CHECK(decode_two(dec, &f0, &f1, got, n, &bad) < 0 &&
			      bad == 1,
		      "a bad second frame: bad %u, %s", bad, err);
		f1.bytes[at] ^= 1;
		/* The second frame's element count must be the caller's too. */
		CHECK(decode_two(dec, &f0, &f1, got, n - 1, &bad) == -EBADMSG && bad == 0,
		      "n - 1 elements: %s", err);
	}
	free(f0.bytes);
	free(f1.bytes);
	free(want);
	free(got);
}

/* Three to eight frames of one codec (or with one of zstd among them),
 * against the separate decodes; a bad checksum in the last names it. */
static int check_many(const struct gg_frame_config *cfg, size_t n, struct rng *r, struct gg_frame_decoder *dec)
{
	struct framed f[GG_FRAME_SUM_MAX];
	const void *frames[GG_FRAME_SUM_MAX];
	size_t lens[GG_FRAME_SUM_MAX];
	float *x = xmalloc((n + 1) * sizeof(float)), *want = xmalloc((n + 1) * sizeof(float)),
	      *got = xmalloc((n + 1) * sizeof(float));
	int sums = 0;

	for (unsigned count = 3; count <= GG_FRAME_SUM_MAX; count++, sums++) {
		for (unsigned i = 0; i < count; i++) {
			struct gg_frame_config c = *cfg;
			c.zstd = cfg->zstd && i == count / 2;
			fill_data(x, n, i == 1 ? DATA_BITS : DATA_GAUSSIAN, r);
			make_frame(&c, x, n, &f[i]);
			frames[i] = f[i].bytes;
			lens[i] = f[i].len;
			CHECK(gg_frame_decode(dec, f[i].bytes, f[i].len, want, n, i ? GG_FRAME_ACCUMULATE : GG_FRAME_STORE,
					      NULL, err, sizeof(err)) == 0,
			      "%s", err);
		}
		unsigned bad = 99;
		memset(got, 0xa5, (n + 1) * sizeof(float));
		CHECK(gg_frame_decode_sum(dec, frames, lens, count, got, n, &bad, err, sizeof(err)) == 0, "%u frames: %s",
		      count, err);
		for (size_t i = 0; i < n; i++)
			CHECK(test_bits(got[i]) == test_bits(want[i]), "%s%s, %u frames of %zu elements: element %zu is "
			      "%08x, the separate decodes give %08x", gg_codec_name(cfg->codec.codec),
			      cfg->zstd ? " (one with zstd)" : "", count, n, i, test_bits(got[i]), test_bits(want[i]));
		CHECK(test_bits(got[n]) == 0xa5a5a5a5u, "written past the end");
		f[count - 1].bytes[28] ^= 1;
		CHECK(gg_frame_decode_sum(dec, frames, lens, count, got, n, &bad, err, sizeof(err)) < 0 && bad == count - 1,
		      "%u frames, the last bad: bad %u, %s", count, bad, err);
		for (unsigned i = 0; i < count; i++)
			free(f[i].bytes);
	}
	free(x);
	free(want);
	free(got);
	return sums;
}

/* Other block sizes and fp16 scales (a block past the sweep's 4096
 * elements, one that does not divide it), and two frames of one codec
 * with other parameters. */
static int other_params(const size_t *sizes, size_t nsizes, float *x0, float *x1, struct rng *r,
			struct gg_frame_decoder *dec)
{
	static const uint32_t blocks[] = { 32, 96, 8192 };
	int pairs = 0;

	for (int c = GG_CODEC_INT8; c <= GG_CODEC_INT4; c++)
		for (size_t b = 0; b < GG_ARRAY_LEN(blocks); b++) {
			struct gg_frame_config c0 = { .codec = { (enum gg_codec)c, blocks[b], GG_SCALE_F16 },
						      .max_elems = MAX_ELEMS };
			struct gg_frame_config c1 = c0;
			for (size_t si = 0; si < nsizes; si++) {
				fill_data(x0, sizes[si], DATA_BITS, r);
				fill_data(x1, sizes[si], DATA_BITS, r);
				check_pair(&c0, &c1, x0, x1, sizes[si], dec);
				c1.codec.block_elems = GG_CODEC_DEFAULT_BLOCK_ELEMS;
				check_pair(&c0, &c1, x0, x1, sizes[si], dec);
				c1 = c0;
				pairs += 2;
			}
		}
	return pairs;
}

int main(void)
{
	static const size_t sizes[] = { 0, 1, 63, 64, 4095, 4096, 4097, 65539, MAX_ELEMS };
	static const enum gg_isa isas[] = { GG_ISA_SCALAR, GG_ISA_AVX2, GG_ISA_AVX512 };
	struct gg_frame_limits lim = { .max_elems = MAX_ELEMS, .max_raw_bytes = 4u * MAX_ELEMS };
	struct gg_frame_decoder dec;
	struct rng r = { 5 };
	float *x0 = xmalloc(MAX_ELEMS * sizeof(float)), *x1 = xmalloc(MAX_ELEMS * sizeof(float));
	int pairs = 0, isas_run = 0;

	CHECK(gg_frame_decoder_init(&dec, &lim) == 0, "decoder init");
	for (size_t k = 0; k < GG_ARRAY_LEN(isas); k++) {
		if (gg_codec_set_isa(isas[k]))
			continue; /* this CPU lacks it */
		isas_run++;
		for (int c = GG_CODEC_FIRST; c <= GG_CODEC_LAST; c++) {
			for (int z = 0; z < 4; z++) {
				struct gg_frame_config c0 = { .codec = gg_codec_defaults((enum gg_codec)c),
							      .zstd = z & 1, .zstd_level = 1, .max_elems = MAX_ELEMS };
				struct gg_frame_config c1 = c0;
				c1.zstd = z & 2;
				for (size_t si = 0; si < GG_ARRAY_LEN(sizes); si++) {
					size_t n = sizes[si];
					fill_clashing(x0, x1, n, &r);
					check_pair(&c0, &c1, x0, x1, n, &dec);
					fill_data(x0, n, DATA_BITS, &r);
					fill_data(x1, n, DATA_BITS, &r);
					check_pair(&c0, &c1, x0, x1, n, &dec);
					pairs += 2;
				}
			}
		}
		pairs += other_params(sizes, GG_ARRAY_LEN(sizes), x0, x1, &r, &dec);
		for (int c = GG_CODEC_FIRST; c <= GG_CODEC_LAST; c++)
			for (int z = 0; z < 2; z++) {
				struct gg_frame_config cfg = { .codec = gg_codec_defaults((enum gg_codec)c), .zstd = z,
							       .zstd_level = 1, .max_elems = MAX_ELEMS };
				pairs += check_many(&cfg, 4097, &r, &dec) + check_many(&cfg, 70001, &r, &dec);
			}
	}
	/* Spans start at a multiple of gg_codec_span_align() and last one,
	 * but for the last; within the chunk. */
	{
		struct gg_codec_params p = { GG_CODEC_INT8, 256, GG_SCALE_F32 };
		uint64_t bytes;
		CHECK(gg_codec_encoded_bytes(&p, 1000, &bytes) == 0, "int8 size");
		uint8_t *payload = xmalloc(bytes);
		CHECK(gg_codec_encode(&p, x0, 1000, payload, bytes) == 0, "int8 encode");
		CHECK(gg_codec_span_align(&p) == 256, "int8 spans: %zu", gg_codec_span_align(&p));
		CHECK(gg_codec_decode_span(&p, payload, bytes, 1000, 128, 256, x1, false) == -EINVAL, "span at 128");
		CHECK(gg_codec_decode_span(&p, payload, bytes, 1000, 0, 300, x1, false) == -EINVAL, "span of 300");
		CHECK(gg_codec_decode_span(&p, payload, bytes, 1000, 768, 256, x1, false) == -EINVAL, "span past the end");
		CHECK(gg_codec_decode_span(&p, payload, bytes - 1, 1000, 0, 256, x1, false) == -EBADMSG, "short payload");
		CHECK(gg_codec_decode_span(&p, payload, bytes, 1000, 768, 232, x1, false) == 0, "the last span");
		free(payload);
		struct gg_codec_params q = gg_codec_defaults(GG_CODEC_BF16_SPLIT);
		CHECK(gg_codec_span_align(&q) == 64, "bf16-split spans: %zu", gg_codec_span_align(&q));
	}
	CHECK(isas_run > 0, "no kernel set could be chosen");
	gg_frame_decoder_fini(&dec);
	free(x0);
	free(x1);
	printf("frame sums: %d sums on %d kernel sets, each bit for bit the separate decodes\n", pairs, isas_run);
	return 0;
}
