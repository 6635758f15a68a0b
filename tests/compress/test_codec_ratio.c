/* The compression targets on Gaussian gradients, through whole frames
 * (headers, scales and the zstd stage included), 1 MiB of fp32 per chunk:
 * bf16-split >= 2.9x, int8 >= 3.9x, int4 >= 7.5x of fp32. */
#include "codec.h"
#include "frame.h"
#include "test_util.h"

#define TOTAL_ELEMS (4u << 20)
#define CHUNK_ELEMS (256u << 10)

static double ratio(enum gg_codec codec, const float *x, bool *used_zstd)
{
	struct gg_frame_config cfg = { gg_codec_defaults(codec), true, GG_ZSTD_DEFAULT_LEVEL, CHUNK_ELEMS };
	struct gg_frame_encoder enc;
	uint64_t bound;
	size_t total = 0, fb;

	CHECK(gg_frame_encoder_init(&enc, &cfg) == 0, "init");
	CHECK(gg_frame_bound(&cfg.codec, CHUNK_ELEMS, &bound) == 0, "bound");
	uint8_t *frame = xmalloc(bound);
	*used_zstd = false;
	for (size_t off = 0; off < TOTAL_ELEMS; off += CHUNK_ELEMS) {
		CHECK(gg_frame_encode(&enc, x + off, CHUNK_ELEMS, frame, bound, &fb) == 0, "encode");
		*used_zstd |= (frame[6] & GG_FRAME_FLAG_ZSTD) != 0;
		total += fb;
	}
	gg_frame_encoder_fini(&enc);
	free(frame);
	return (double)TOTAL_ELEMS * sizeof(float) / (double)total;
}

int main(void)
{
	static const struct {
		enum gg_codec codec;
		double min_ratio;
	} targets[] = {
		{ GG_CODEC_FP32, 0.99 },  { GG_CODEC_BF16, 2.0 }, { GG_CODEC_BF16_SPLIT, 2.9 },
		{ GG_CODEC_INT8, 3.9 },   { GG_CODEC_INT4, 7.5 },
	};
	struct rng r = { 2024 };
	float *x = xmalloc(TOTAL_ELEMS * sizeof(float));
	int failed = 0;

	fill_data(x, TOTAL_ELEMS, DATA_GAUSSIAN, &r);
	for (size_t i = 0; i < GG_ARRAY_LEN(targets); i++) {
		bool z;
		double q = ratio(targets[i].codec, x, &z);
		printf("%-10s %.3fx of fp32 (target >= %.1fx)%s\n", gg_codec_name(targets[i].codec), q,
		       targets[i].min_ratio, z ? ", zstd stage used" : ", zstd stage bypassed");
		if (q < targets[i].min_ratio) {
			fprintf(stderr, "%s: ratio %.3f below its target %.1f\n", gg_codec_name(targets[i].codec), q,
				targets[i].min_ratio);
			failed = 1;
		}
	}
	free(x);
	return failed;
}
