/* Shared helpers for the compress tests: a seeded generator, gradient-like
 * data, special values and a CHECK that names file and line. */
#ifndef GG_TEST_UTIL_H
#define GG_TEST_UTIL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond, ...)                                                          \
	do {                                                                      \
		if (!(cond)) {                                                    \
			fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
			fprintf(stderr, __VA_ARGS__);                             \
			fputc('\n', stderr);                                      \
			exit(1);                                                  \
		}                                                                 \
	} while (0)

#define SKIP_EXIT 77

struct rng {
	uint64_t s;
};

static inline uint64_t rng_next(struct rng *r)
{
	uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform in (0, 1). */
static inline double rng_unit(struct rng *r)
{
	return ((double)(rng_next(r) >> 11) + 0.5) * 0x1p-53;
}

static inline double rng_normal(struct rng *r)
{
	return sqrt(-2.0 * log(rng_unit(r))) * cos(6.283185307179586 * rng_unit(r));
}

static inline uint32_t test_bits(float x)
{
	uint32_t u;
	memcpy(&u, &x, sizeof(u));
	return u;
}

static inline float test_float(uint32_t u)
{
	float x;
	memcpy(&x, &u, sizeof(x));
	return x;
}

/* Bitwise equal, except that any NaN equals any NaN. */
static inline bool same_float(float a, float b)
{
	if (isnan(a) || isnan(b))
		return isnan(a) && isnan(b);
	return test_bits(a) == test_bits(b);
}

enum data_kind {
	DATA_GAUSSIAN,   /* N(0, 1e-3) */
	DATA_HEAVY,      /* Student-t, 3 degrees of freedom */
	DATA_OUTLIERS,   /* Gaussian with 0.1% of values 1000x larger */
	DATA_SPECIAL,    /* random mix of special values and normal data */
	DATA_BITS,       /* random bit patterns (all classes, NaN payloads) */
	DATA_KINDS,
};

static const float special_values[] = {
	0.0f, -0.0f, 1.0f, -1.0f, 0x1p-149f, -0x1p-149f, 0x1p-126f, 0x1.fffffcp-127f,
	0x1.fffffep127f, -0x1.fffffep127f, INFINITY, -INFINITY,
	/* ties for bf16 (exactly half a bf16 ulp over an even / odd value) */
	0x1.008p0f, 0x1.018p0f, -0x1.008p0f, 0x1.fffp127f, 0x1.ff8p127f,
	65504.0f, 65536.0f, 8.3e6f, 0x1p-24f, 0x1p-25f, 3.0e-44f,
};

static inline float special_value(struct rng *r)
{
	uint32_t k = (uint32_t)(rng_next(r) % (sizeof(special_values) / sizeof(special_values[0]) + 3));
	switch (k) {
	case 0:
		return test_float(0x7fc00000u); /* quiet NaN */
	case 1:
		return test_float(0xff812345u); /* signaling NaN, payload, sign */
	case 2:
		return test_float(0x7f800001u);
	default:
		return special_values[k - 3];
	}
}

static inline void fill_data(float *x, size_t n, enum data_kind kind, struct rng *r)
{
	for (size_t i = 0; i < n; i++) {
		switch (kind) {
		case DATA_GAUSSIAN:
			x[i] = (float)(1e-3 * rng_normal(r));
			break;
		case DATA_HEAVY: {
			double z = rng_normal(r), c = 0;
			for (int k = 0; k < 3; k++) {
				double g = rng_normal(r);
				c += g * g;
			}
			x[i] = (float)(1e-3 * z / sqrt(c / 3));
			break;
		}
		case DATA_OUTLIERS:
			x[i] = (float)(1e-3 * rng_normal(r) * (rng_next(r) % 1000 == 0 ? 1000 : 1));
			break;
		case DATA_SPECIAL:
			x[i] = rng_next(r) % 4 == 0 ? special_value(r) : (float)rng_normal(r);
			break;
		case DATA_BITS:
			x[i] = test_float((uint32_t)rng_next(r));
			break;
		case DATA_KINDS:
			break;
		}
	}
}

static inline const char *data_kind_name(enum data_kind kind)
{
	static const char *const names[] = { "gaussian", "heavy", "outliers", "special", "bits" };
	return (unsigned)kind < DATA_KINDS ? names[kind] : "?";
}

__attribute__((noinline, unused)) static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	CHECK(p, "out of memory (%zu bytes)", n);
	return p;
}

#endif
