/* CRC-32C: published check values, then every implementation this CPU runs
 * against the table one, bit for bit: every length up to 2 KiB at several
 * alignments, lengths around the block and fold sizes of the fast paths,
 * random lengths, offsets and starting values up to 6 MiB, and
 * continuation (the CRC of A then B is that of A||B, wherever the cut). */
#include "crc32c.h"
#include "test_util.h"

#define BIG (6u << 20)
#define SLACK 64 /* room for offsets */

/* The RFC 3720 B.4 vectors and the usual check value. */
static void check_vectors(const struct gg_crc32c_impl *im)
{
	uint8_t buf[32];
	uint32_t c;

	c = im->fn(0, "123456789", 9);
	CHECK(c == 0xe3069283u, "%s: check value 0x%08x", im->name, c);
	CHECK(im->fn(0, NULL, 0) == 0, "%s: empty", im->name);
	CHECK(im->fn(0x12345678u, NULL, 0) == 0x12345678u, "%s: empty continues", im->name);
	memset(buf, 0, sizeof(buf));
	c = im->fn(0, buf, 32);
	CHECK(c == 0x8a9136aau, "%s: zeros 0x%08x", im->name, c);
	memset(buf, 0xff, sizeof(buf));
	c = im->fn(0, buf, 32);
	CHECK(c == 0x62a8ab43u, "%s: ones 0x%08x", im->name, c);
	for (int i = 0; i < 32; i++)
		buf[i] = (uint8_t)i;
	c = im->fn(0, buf, 32);
	CHECK(c == 0x46dd794eu, "%s: ascending 0x%08x", im->name, c);
}

/* im over [p, p + len) from `start` equals the table, whole and cut in two
 * and three pieces at random. */
static void check_one(const struct gg_crc32c_impl *im, uint32_t start, const uint8_t *p, size_t len,
		      uint32_t want, struct rng *r)
{
	uint32_t c = im->fn(start, p, len);
	CHECK(c == want, "%s: len %zu at %p from 0x%08x: 0x%08x vs table 0x%08x", im->name, len, (const void *)p,
	      start, c, want);

	size_t a = len ? rng_next(r) % (len + 1) : 0;
	c = im->fn(im->fn(start, p, a), p + a, len - a);
	CHECK(c == want, "%s: len %zu cut at %zu: 0x%08x vs 0x%08x", im->name, len, a, c, want);

	size_t b = a + (len - a ? rng_next(r) % (len - a + 1) : 0);
	c = im->fn(im->fn(im->fn(start, p, a), p + a, b - a), p + b, len - b);
	CHECK(c == want, "%s: len %zu cut at %zu and %zu: 0x%08x vs 0x%08x", im->name, len, a, b, c, want);
}

static void check_all(const struct gg_crc32c_impl *im, size_t n, uint32_t start, const uint8_t *p, size_t len,
		      struct rng *r)
{
	uint32_t want = gg_crc32c_ref(start, p, len);

	for (size_t i = 1; i < n; i++)
		check_one(&im[i], start, p, len, want, r);
	uint32_t c = gg_crc32c(start, p, len);
	CHECK(c == want, "gg_crc32c: len %zu from 0x%08x: 0x%08x vs table 0x%08x", len, start, c, want);
}

static uint32_t random_start(struct rng *r)
{
	/* 0 (a fresh CRC) half the time, anything else otherwise */
	return rng_next(r) & 1 ? 0 : (uint32_t)rng_next(r);
}

int main(void)
{
	const struct gg_crc32c_impl *im;
	size_t n = gg_crc32c_impls(&im);

	CHECK(n >= 1 && im[0].fn == gg_crc32c_ref, "the table implementation comes first");
	printf("crc32c: implementations:");
	for (size_t i = 0; i < n; i++)
		printf(" [%s]", im[i].name);
	printf("\n");

	struct gg_crc32c_impl dispatch = { "gg_crc32c", gg_crc32c };
	check_vectors(&dispatch);
	for (size_t i = 0; i < n; i++)
		check_vectors(&im[i]);

	struct rng r = { 7 };
	uint8_t *data = xmalloc(BIG + SLACK);
	for (size_t i = 0; i < BIG + SLACK; i++)
		data[i] = (uint8_t)rng_next(&r);

	/* every length to 2 KiB at every alignment mod 8 and across a cache
	 * line; covers the fold and three-way thresholds and all tails */
	static const size_t offs[] = { 0, 1, 2, 3, 4, 5, 6, 7, 13, 63 };
	size_t cases = 0;
	for (size_t len = 0; len <= 2048; len++)
		for (size_t o = 0; o < sizeof(offs) / sizeof(offs[0]); o++, cases++)
			check_all(im, n, random_start(&r), data + offs[o], len, &r);

	/* around multiples of the fast paths' block, round and stride sizes */
	static const size_t bases[] = { 192, 256, 512, 768, 1024, 1536, 2304, 3072, 4096, 24576, 65536, 1 << 20 };
	for (size_t b = 0; b < sizeof(bases) / sizeof(bases[0]); b++)
		for (size_t m = 1; m <= 3; m++)
			for (int d = -17; d <= 17; d += 2, cases++) {
				size_t len = bases[b] * m + (size_t)d;
				check_all(im, n, random_start(&r), data + rng_next(&r) % SLACK, len, &r);
			}

	/* random lengths up to BIG, log-uniform so all sizes get their share */
	for (int i = 0; i < 300; i++, cases++) {
		size_t len = (size_t)(rng_next(&r) % ((uint64_t)1 << (rng_next(&r) % 23 + 1)));
		if (len > BIG)
			len = BIG;
		check_all(im, n, random_start(&r), data + rng_next(&r) % SLACK, len, &r);
	}
	for (int i = 0; i < 4; i++, cases++)
		check_all(im, n, random_start(&r), data + i, BIG - (size_t)i * 17, &r);

	/* exact-size heap copies, so that a sanitizer sees any read past the
	 * end or before the start */
	for (size_t len = 1; len <= 1 << 20; len = len < 1200 ? len + 1 : len * 3 / 2, cases++) {
		uint8_t *copy = xmalloc(len);
		memcpy(copy, data + len % SLACK, len);
		check_all(im, n, random_start(&r), copy, len, &r);
		free(copy);
	}

	/* long runs of zeros and of ones (the xor-in of the start register
	 * and the folds see little else) */
	for (int fill = 0; fill < 2; fill++) {
		memset(data, fill ? 0xff : 0, BIG + SLACK);
		for (int i = 0; i < 20; i++, cases++) {
			size_t len = (size_t)(rng_next(&r) % (3u << 20));
			check_all(im, n, random_start(&r), data + rng_next(&r) % SLACK, len, &r);
		}
	}
	free(data);
	printf("crc32c: check values hold; %zu implementations agree with the table on %zu buffers, whole and cut\n",
	       n, cases);
	return 0;
}
