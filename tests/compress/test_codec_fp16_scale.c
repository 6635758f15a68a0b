/* The fp16 block-scale conversions of codec.h: rounding toward +inf
 * (CUDA __float2half_ru) and the exact widening, checked against their
 * defining properties everywhere it matters and against the CPU's F16C
 * instructions when it has them. */
#include <cpuid.h>
#include <immintrin.h>

#include "codec_internal.h"
#include "test_util.h"

static bool have_f16c(void)
{
	unsigned a, b, c, d;
	return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

__attribute__((target("f16c"))) static uint16_t f16c_round_up(float x)
{
	return (uint16_t)_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(x), _MM_FROUND_TO_POS_INF), 0);
}

__attribute__((target("f16c"))) static float f16c_widen(uint16_t h)
{
	return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

static unsigned long long checked;

static void check_round_up(uint32_t u, bool hw)
{
	float x = test_float(u);
	uint16_t h = gg_f16_round_up(x);

	if (x > 65504.0f) {
		CHECK(h == 0x7c00, "%a: 0x%04x, want +inf", x, h);
	} else if (x == 0.0f) {
		CHECK(h == 0, "0: 0x%04x", h);
	} else {
		CHECK(h >= 1 && h <= 0x7bff, "%a: 0x%04x out of range", x, h);
		CHECK(gg_f16_to_f32(h) >= x, "%a: 0x%04x is below it", x, h);
		CHECK(h == 1 || gg_f16_to_f32((uint16_t)(h - 1)) < x, "%a: 0x%04x is not the smallest above", x, h);
	}
	if (hw)
		CHECK(h == f16c_round_up(x), "%a: 0x%04x, F16C says 0x%04x", x, h, f16c_round_up(x));
	checked++;
}

int main(void)
{
	bool hw = have_f16c();

	for (uint32_t h = 0; h <= 0xffff; h++) {
		float v = gg_f16_to_f32((uint16_t)h);
		if (hw)
			CHECK(same_float(v, f16c_widen((uint16_t)h)) && (isnan(v) || test_bits(v) == test_bits(f16c_widen((uint16_t)h))),
			      "widen 0x%04x: %a, F16C %a", h, v, f16c_widen((uint16_t)h));
		uint32_t e = (h >> 10) & 31;
		if (e != 31) {
			double m = (h & 0x3ff) + (e ? 1024.0 : 0.0);
			double want = ldexp(m, (e ? (int)e : 1) - 25) * ((h & 0x8000) ? -1 : 1);
			CHECK((double)v == want && !!signbit(v) == !!(h & 0x8000), "widen 0x%04x: %a, want %a", h, v, want);
		}
	}

	for (uint64_t u = 0; u <= 0x7f800000u; u += 17)
		check_round_up((uint32_t)u, hw);
	static const uint32_t edges[] = { 0x477fe000u, 0x38800000u, 0x33800000u, 0x33000000u, 0x3f800000u, 0 };
	for (size_t i = 0; i < GG_ARRAY_LEN(edges); i++)
		for (uint32_t u = edges[i] > 100000 ? edges[i] - 100000 : 0; u < edges[i] + 100000; u++)
			check_round_up(u, hw);

	printf("fp16 scale conversions hold on %llu inputs (%s)\n", checked,
	       hw ? "and match F16C" : "no F16C on this CPU");
	return 0;
}
