/* What the GPU-mode rank programs (test_gpu_mode, test_nccl_mode) share:
 * library calls that fail the rank naming the call, a clock, a mixer for
 * inputs, the digest of the results every rank prints, and their
 * arguments. The including file defines `site_index` and `rank_index`. */
#ifndef GG_RANK_TEST_H
#define GG_RANK_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "gradgate.h"

#define GG_OK(rc, err, ...)                                                                              \
	do {                                                                                             \
		int rc_ = (rc);                                                                          \
		if (rc_ != 0) {                                                                          \
			fprintf(stderr, "%s:%d: site %d rank %d: ", __FILE__, __LINE__, site_index, rank_index); \
			fprintf(stderr, __VA_ARGS__);                                                    \
			fprintf(stderr, " failed: %d (%s): %s\n", rc_, gg_strerror(rc_), (err)->message); \
			exit(1);                                                                         \
		}                                                                                        \
	} while (0)

static inline double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static inline uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* FNV-1a 64 of every result a rank checked: the same at every rank. */
static uint64_t result_hash = 0xcbf29ce484222325ull;

static inline void hash_bytes(const void *p, size_t n)
{
	const unsigned char *b = p;

	for (size_t i = 0; i < n; i++)
		result_hash = (result_hash ^ b[i]) * 0x100000001b3ull;
}

/* An integer argument in lo..hi, or exit 2 naming it. */
static inline int parse_int(const char *prog, const char *s, const char *name, int lo, int hi)
{
	char *end;
	long v = strtol(s, &end, 10);

	if (!*s || *end || v < lo || v > hi) {
		fprintf(stderr, "%s: %s must be an integer from %d to %d, not \"%s\"\n", prog, name, lo, hi, s);
		exit(2);
	}
	return (int)v;
}

#endif
