/* CPU kernels of the host site backend: the site sum in rank order and the
 * conversions between bfloat16 and float32. */
#ifndef GG_HOST_SUM_H
#define GG_HOST_SUM_H

#include <stdint.h>
#include <string.h>

/* sum[i] = in[0][i] + in[1][i] + ... + in[n-1][i] for i in [offset,
 * offset + count), added left to right in float32 so the bytes depend on
 * nothing but the inputs and their order. bf16 inputs are widened exactly
 * first. n >= 1. sum may be in[0] (summed in place), no other input. */
void gg_host_sum_f32(float *sum, const float *const *in, unsigned n, uint64_t offset, uint64_t count);
void gg_host_sum_bf16(float *sum, const uint16_t *const *in, unsigned n, uint64_t offset, uint64_t count);

/* dst[i] = src[i] rounded to bfloat16 by the bf16 codec's rule (compress/codec.h):
 * to nearest even, NaN stays NaN. */
void gg_host_store_bf16(uint16_t *dst, const float *src, uint64_t count);

static inline float gg_host_bf16_to_f32(uint16_t b)
{
	uint32_t u = (uint32_t)b << 16;
	float x;

	memcpy(&x, &u, sizeof(x));
	return x;
}

#endif
