/* Writes the seed corpus of the frame fuzzer: small valid frames of every
 * codec, scale kind and zstd choice, odd sizes and empty ones.
 * usage: gen-frame-corpus DIR */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "frame.h"

static int write_frame(const char *dir, const char *name, const struct gg_frame_config *cfg, const float *x,
		       size_t n)
{
	struct gg_frame_encoder enc;
	static uint8_t buf[1 << 16];
	char path[512];
	size_t fb;

	if (gg_frame_encoder_init(&enc, cfg) || gg_frame_encode(&enc, x, n, buf, sizeof(buf), &fb)) {
		fprintf(stderr, "%s: cannot encode\n", name);
		return -1;
	}
	gg_frame_encoder_fini(&enc);
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "wb");
	if (!f || fwrite(buf, 1, fb, f) != fb || fclose(f)) {
		perror(path);
		return -1;
	}
	printf("%s: %zu bytes%s\n", path, fb, buf[6] & GG_FRAME_FLAG_ZSTD ? " (zstd)" : "");
	return 0;
}

int main(int argc, char **argv)
{
	static const size_t sizes[] = { 0, 1, 33, 300 };
	static float x[300];
	char name[128];
	int rc = 0;

	if (argc != 2) {
		fprintf(stderr, "usage: %s DIR\n", argv[0]);
		return 2;
	}
	for (int c = GG_CODEC_FIRST; c <= GG_CODEC_LAST; c++) {
		for (int variant = 0; variant < 3; variant++) {
			struct gg_frame_config cfg = { .codec = gg_codec_defaults((enum gg_codec)c),
						       .zstd = variant > 0,
						       .zstd_level = 1,
						       .max_elems = 300 };
			if (gg_codec_has_blocks(cfg.codec.codec)) {
				cfg.codec.block_elems = 64;
				cfg.codec.scale = variant == 2 ? GG_SCALE_F16 : GG_SCALE_F32;
			} else if (variant == 2) {
				continue;
			}
			for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
				size_t n = sizes[s];
				for (size_t i = 0; i < n; i++) /* low entropy, so zstd frames appear */
					x[i] = variant ? (float)(i % 5) * 0.25f : (float)sin((double)i) * 1e-3f;
				if (n > 7) {
					x[3] = INFINITY;
					x[5] = NAN;
				}
				snprintf(name, sizeof(name), "%s-%s-%zu", gg_codec_name(cfg.codec.codec),
					 variant == 0 ? "raw" : variant == 1 ? "zstd" : "zstd-f16", n);
				rc |= write_frame(argv[1], name, &cfg, x, n);
			}
		}
	}
	return rc ? 1 : 0;
}
