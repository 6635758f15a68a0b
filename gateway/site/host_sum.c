#include "host_sum.h"

#include <stdlib.h>

#include "codec.h"
#include "gg_common.h"

/* Blocks keep the running sum in cache while every rank's slice is added. */
#define BLOCK 8192u

void gg_host_sum_f32(float *sum, const float *const *in, unsigned n, uint64_t offset, uint64_t count)
{
	for (uint64_t b = offset; b < offset + count; b += BLOCK) {
		uint64_t m = GG_MIN(offset + count - b, (uint64_t)BLOCK);
		float *restrict s = sum + b;

		if (in[0] != sum)
			memcpy(s, in[0] + b, m * sizeof(float));
		for (unsigned r = 1; r < n; r++)
			gg_f32_add(s, in[r] + b, m, s);
	}
}

void gg_host_sum_bf16(float *sum, const uint16_t *const *in, unsigned n, uint64_t offset, uint64_t count)
{
	for (uint64_t b = offset; b < offset + count; b += BLOCK) {
		uint64_t m = GG_MIN(offset + count - b, (uint64_t)BLOCK);
		float *restrict s = sum + b;
		const uint16_t *restrict x0 = in[0] + b;

		for (uint64_t i = 0; i < m; i++)
			s[i] = gg_host_bf16_to_f32(x0[i]);
		for (unsigned r = 1; r < n; r++) {
			const uint16_t *restrict x = in[r] + b;
			for (uint64_t i = 0; i < m; i++)
				s[i] = s[i] + gg_host_bf16_to_f32(x[i]);
		}
	}
}

void gg_host_store_bf16(uint16_t *dst, const float *src, uint64_t count)
{
	const struct gg_codec_params bf16 = gg_codec_defaults(GG_CODEC_BF16);

	/* The codec's bytes are the little-endian bf16 values themselves. */
	if (gg_codec_encode(&bf16, src, count, dst, count * sizeof(*dst)))
		abort(); /* only bad parameters fail, and these are fixed */
}
