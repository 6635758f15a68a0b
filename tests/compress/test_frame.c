/* Payload frames that must be accepted: every codec with and without the
 * zstd stage, stored and accumulated, framed from floats, from bf16, and
 * from codec bytes made elsewhere (in place or copied). */
#include <errno.h>

#include "codec.h"
#include "frame.h"
#include "test_util.h"

#define MAX_ELEMS (1u << 18)

static char err[256];

static void check_frame(const struct gg_frame_config *cfg, const float *x, size_t n, struct rng *r,
			struct gg_frame_decoder *dec)
{
	struct gg_frame_encoder enc;
	const char *name = gg_codec_name(cfg->codec.codec);
	uint64_t bound, raw;

	CHECK(gg_frame_encoder_init(&enc, cfg) == 0, "encoder init");
	CHECK(gg_frame_bound(&cfg->codec, n, &bound) == 0, "bound");
	CHECK(gg_codec_encoded_bytes(&cfg->codec, n, &raw) == 0, "raw size");
	uint8_t *frame = xmalloc(bound), *frame2 = xmalloc(bound), *enc_bytes = xmalloc(raw);
	float *dec_ref = xmalloc(n * sizeof(float)), *out = xmalloc(n * sizeof(float));
	float *acc = xmalloc(n * sizeof(float)), *acc0 = xmalloc(n * sizeof(float));
	size_t fb, fb2;

	CHECK(gg_frame_encode(&enc, x, n, frame, bound, &fb) == 0, "%s: encode", name);
	CHECK(fb <= bound, "%s: frame %zu over bound %llu", name, fb, (unsigned long long)bound);
	CHECK(gg_codec_encode(&cfg->codec, x, n, enc_bytes, raw) == 0, "codec encode");
	CHECK(gg_codec_decode(&cfg->codec, enc_bytes, raw, n, dec_ref) == 0, "codec decode");

	struct gg_frame_info info;
	CHECK(gg_frame_decode(dec, frame, fb, out, n, GG_FRAME_STORE, &info, err, sizeof(err)) == 0, "%s: %s",
	      name, err);
	CHECK(info.elems == n && info.params.codec == cfg->codec.codec && info.raw_bytes == raw &&
		      info.frame_bytes == fb && info.params.block_elems == cfg->codec.block_elems &&
		      info.params.scale == cfg->codec.scale,
	      "%s: info", name);
	CHECK(!info.zstd || cfg->zstd, "%s: zstd flag without the stage", name);
	for (size_t i = 0; i < n; i++)
		CHECK(same_float(out[i], dec_ref[i]), "%s: element %zu", name, i);

	fill_data(acc0, n, DATA_GAUSSIAN, r);
	memcpy(acc, acc0, n * sizeof(float));
	CHECK(gg_frame_decode(dec, frame, fb, acc, n, GG_FRAME_ACCUMULATE, NULL, err, sizeof(err)) == 0, "%s", err);
	for (size_t i = 0; i < n; i++)
		CHECK(same_float(acc[i], acc0[i] + dec_ref[i]), "%s: accumulated element %zu", name, i);

	/* header alone says how long the frame is */
	struct gg_frame_info hi;
	CHECK(gg_frame_parse_header(frame, GG_FRAME_HEADER_BYTES, &dec->limits, &hi, err, sizeof(err)) == 0, "%s",
	      err);
	CHECK(hi.frame_bytes == fb, "header frame_bytes");

	/* wrap: codec bytes encoded in place, and copied from elsewhere */
	CHECK(gg_codec_encode(&cfg->codec, x, n, frame2 + GG_FRAME_HEADER_BYTES, raw) == 0, "in place");
	CHECK(gg_frame_wrap(&enc, frame2 + GG_FRAME_HEADER_BYTES, raw, n, frame2, bound, &fb2) == 0, "wrap");
	CHECK(fb2 == fb && memcmp(frame, frame2, fb) == 0, "%s: wrapped in place differs", name);
	memset(frame2, 0, bound);
	CHECK(gg_frame_wrap(&enc, enc_bytes, raw, n, frame2, bound, &fb2) == 0, "wrap copy");
	CHECK(fb2 == fb && memcmp(frame, frame2, fb) == 0, "%s: wrapped copy differs", name);
	CHECK(gg_frame_wrap(&enc, enc_bytes, raw + 1, n, frame2, bound + 1, &fb2) == -EINVAL, "wrap wrong size");

	/* bf16 input frames decode like the bf16-rounded floats */
	uint16_t *b = xmalloc(n * sizeof(uint16_t));
	for (size_t i = 0; i < n; i++) {
		uint32_t u = test_bits(x[i]);
		b[i] = (uint16_t)(u >> 16); /* truncation: any bf16 pattern will do */
	}
	CHECK(gg_frame_encode_bf16(&enc, b, n, frame2, bound, &fb2) == 0, "encode bf16");
	CHECK(gg_frame_decode(dec, frame2, fb2, out, n, GG_FRAME_STORE, NULL, err, sizeof(err)) == 0, "%s", err);

	/* encoder refusals */
	CHECK(gg_frame_encode(&enc, x, n, frame, GG_FRAME_HEADER_BYTES + raw - 1, &fb) == -ENOBUFS || raw == 0,
	      "small dst");
	CHECK(gg_frame_encode(&enc, x, MAX_ELEMS + 1, frame, bound, &fb) == -EINVAL, "too many elements");

	gg_frame_encoder_fini(&enc);
	free(frame);
	free(frame2);
	free(enc_bytes);
	free(dec_ref);
	free(out);
	free(acc);
	free(acc0);
	free(b);
}

int main(void)
{
	static const size_t sizes[] = { 0, 1, 63, 64, 1000, 65539, MAX_ELEMS };
	struct gg_frame_limits lim = { .max_elems = MAX_ELEMS, .max_raw_bytes = 4u * MAX_ELEMS };
	struct gg_frame_decoder dec;
	struct rng r = { 11 };
	float *x = xmalloc(MAX_ELEMS * sizeof(float));
	int frames = 0, zstd_frames = 0;

	CHECK(gg_frame_decoder_init(&dec, &lim) == 0, "decoder init");
	for (int c = GG_CODEC_FIRST; c <= GG_CODEC_LAST; c++) {
		for (int variant = 0; variant < 3; variant++) {
			struct gg_frame_config cfg = {
				.codec = gg_codec_defaults((enum gg_codec)c),
				.zstd = variant != 0,
				.zstd_level = variant == 2 ? 3 : GG_ZSTD_DEFAULT_LEVEL,
				.max_elems = MAX_ELEMS,
			};
			if (variant == 2 && gg_codec_has_blocks(cfg.codec.codec)) {
				cfg.codec.scale = GG_SCALE_F16;
				cfg.codec.block_elems = 64;
			}
			for (size_t si = 0; si < GG_ARRAY_LEN(sizes); si++) {
				for (int kind = 0; kind < DATA_KINDS; kind++) {
					fill_data(x, sizes[si], (enum data_kind)kind, &r);
					check_frame(&cfg, x, sizes[si], &r, &dec);
					frames++;
				}
			}
		}
	}

	/* the zstd stage runs where it pays: split bf16 of gradients compresses */
	struct gg_frame_config cfg = { gg_codec_defaults(GG_CODEC_BF16_SPLIT), true, 1, MAX_ELEMS };
	struct gg_frame_encoder enc;
	uint64_t bound;
	CHECK(gg_frame_encoder_init(&enc, &cfg) == 0 && gg_frame_bound(&cfg.codec, MAX_ELEMS, &bound) == 0, "init");
	uint8_t *frame = xmalloc(bound);
	size_t fb;
	struct gg_frame_info info;
	fill_data(x, MAX_ELEMS, DATA_GAUSSIAN, &r);
	CHECK(gg_frame_encode(&enc, x, MAX_ELEMS, frame, bound, &fb) == 0, "encode");
	CHECK(gg_frame_parse_header(frame, fb, &lim, &info, err, sizeof(err)) == 0 && info.zstd, "bf16-split used zstd");
	zstd_frames++;
	/* and not where it does not: fp32 gradients */
	gg_frame_encoder_fini(&enc);
	cfg.codec = gg_codec_defaults(GG_CODEC_FP32);
	CHECK(gg_frame_encoder_init(&enc, &cfg) == 0 && gg_frame_bound(&cfg.codec, MAX_ELEMS, &bound) == 0, "init");
	free(frame);
	frame = xmalloc(bound);
	CHECK(gg_frame_encode(&enc, x, MAX_ELEMS, frame, bound, &fb) == 0, "encode");
	CHECK(gg_frame_parse_header(frame, fb, &lim, &info, err, sizeof(err)) == 0 && !info.zstd, "fp32 bypassed zstd");
	gg_frame_encoder_fini(&enc);
	free(frame);

	/* encoder configs that cannot work */
	struct gg_frame_config bad = { gg_codec_defaults(GG_CODEC_FP32), false, 1, 1ull << 31 };
	CHECK(gg_frame_encoder_init(&enc, &bad) == -EINVAL, "frame over 4 GiB");
	bad = (struct gg_frame_config){ gg_codec_defaults(GG_CODEC_FP32), true, 0, 1000 };
	CHECK(gg_frame_encoder_init(&enc, &bad) == -EINVAL, "zstd level 0");

	gg_frame_decoder_fini(&dec);
	free(x);
	printf("frames: %d configurations round-trip\n", frames + zstd_frames);
	return 0;
}
