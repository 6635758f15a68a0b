/* The zstd stage: round trips through one reused context, the bypass rule,
 * and decompression of hostile payloads (wrong or missing declared size,
 * trailing data, garbage, truncation, a bomb) that must fail with a clear
 * message and never write past the declared size. */
#include <errno.h>
#include <zstd.h>

#include "test_util.h"
#include "zstd_stage.h"

#define MAX_RAW (1u << 20)

static struct gg_zstd_stage st;
static char err[256];

static size_t compress_plain(const void *src, size_t n, void *dst, size_t cap, int content_size)
{
	ZSTD_CCtx *c = ZSTD_createCCtx();
	CHECK(c, "cctx");
	CHECK(!ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, content_size)), "param");
	size_t r = ZSTD_compress2(c, dst, cap, src, n);
	CHECK(!ZSTD_isError(r), "compress: %s", ZSTD_getErrorName(r));
	ZSTD_freeCCtx(c);
	return r;
}

static void expect_error(const void *src, size_t n, size_t raw, int want_rc, const char *want_msg)
{
	static uint8_t out[MAX_RAW + 64];
	memset(out, 0xa5, sizeof(out));
	err[0] = 0;
	int rc = gg_zstd_stage_decompress(&st, src, n, out, raw, err, sizeof(err));
	CHECK(rc == want_rc, "rc %d, want %d (%s)", rc, want_rc, err);
	CHECK(strstr(err, want_msg), "message \"%s\" lacks \"%s\"", err, want_msg);
	for (size_t i = GG_MIN(raw, (size_t)MAX_RAW); i < sizeof(out); i++)
		CHECK(out[i] == 0xa5, "byte %zu written past the declared size %zu", i, raw);
}

static void fill_bits(uint8_t *p, size_t n, unsigned bits, struct rng *r)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(rng_next(r) & ((1u << bits) - 1));
}

int main(void)
{
	struct rng r = { 3 };
	uint8_t *src = xmalloc(MAX_RAW), *z = xmalloc(MAX_RAW), *back = xmalloc(MAX_RAW);
	size_t zn;

	CHECK(gg_zstd_stage_init(&st, 0, MAX_RAW) == -EINVAL, "level 0 is refused");
	CHECK(gg_zstd_stage_init(&st, 1000, MAX_RAW) == -EINVAL, "level 1000 is refused");
	CHECK(gg_zstd_stage_init(&st, GG_ZSTD_DEFAULT_LEVEL, MAX_RAW) == 0, "init");

	/* the same context serves chunks of every size and kind */
	for (int round = 0; round < 40; round++) {
		size_t n = round == 0 ? MAX_RAW : (size_t)(rng_next(&r) % MAX_RAW);
		unsigned bits = 1 + round % 8;
		fill_bits(src, n, bits, &r);
		CHECK(gg_zstd_stage_compress(&st, src, n, z, MAX_RAW, &zn) == 0, "compress");
		if (bits <= 6 && n >= 4096)
			CHECK(zn > 0, "%u-bit bytes (n=%zu) should compress", bits, n);
		if (bits == 8)
			CHECK(zn == 0, "random bytes (n=%zu) should bypass, got %zu", n, zn);
		if (zn) {
			CHECK(zn <= n - n / 8, "accepted %zu of %zu bytes: saves under 1/8", zn, n);
			CHECK(gg_zstd_stage_decompress(&st, z, zn, back, n, err, sizeof(err)) == 0, "%s", err);
			CHECK(memcmp(back, src, n) == 0, "round trip of %zu bytes", n);
		}
	}

	memset(src, 0, 63);
	CHECK(gg_zstd_stage_compress(&st, src, 63, z, MAX_RAW, &zn) == 0 && zn == 0, "63 bytes bypass");

	/* declared size must match exactly */
	memset(src, 7, 4096);
	zn = compress_plain(src, 4096, z, MAX_RAW, 1);
	expect_error(z, zn, 4000, -EBADMSG, "declares 4096 decompressed bytes, header says 4000");
	expect_error(z, zn, 5000, -EBADMSG, "declares 4096 decompressed bytes, header says 5000");
	expect_error(z, zn, MAX_RAW + 1, -E2BIG, "exceeds the limit");

	/* no declared size */
	zn = compress_plain(src, 4096, z, MAX_RAW, 0);
	expect_error(z, zn, 4096, -EBADMSG, "does not declare its decompressed size");

	/* trailing data: a second frame or junk */
	zn = compress_plain(src, 4096, z, MAX_RAW, 1);
	memcpy(z + zn, z, zn);
	expect_error(z, 2 * zn, 4096, -EBADMSG, "bytes after the zstd frame");
	expect_error(z, zn - 3, 4096, -EBADMSG, "zstd: ");
	expect_error("not zstd at all", 15, 4096, -EBADMSG, "not a zstd frame");
	expect_error(z, 0, 4096, -EBADMSG, "zstd");

	/* corrupted block content: zstd's own checks fail, the buffer stays bounded */
	zn = compress_plain(src, 4096, z, MAX_RAW, 1);
	int still_valid = 0;
	for (int i = 0; i < 200; i++) {
		uint8_t c[256];
		memcpy(c, z, zn);
		c[6 + rng_next(&r) % (zn - 6)] ^= (uint8_t)(1 + rng_next(&r) % 255);
		uint8_t out[4096 + 64];
		memset(out, 0xa5, sizeof(out));
		/* some flips stay valid zstd (the frame checksum catches those) */
		still_valid += gg_zstd_stage_decompress(&st, c, zn, out, 4096, err, sizeof(err)) == 0;
		for (size_t k = 4096; k < sizeof(out); k++)
			CHECK(out[k] == 0xa5, "corrupted frame wrote past its size");
	}

	/* a bomb: 256 MiB of zeros in a few KiB */
	size_t big = 256u << 20;
	uint8_t *zeros = calloc(big, 1);
	CHECK(zeros, "calloc");
	uint8_t *bomb = xmalloc(64 << 10);
	size_t bn = compress_plain(zeros, big, bomb, 64 << 10, 1);
	free(zeros);
	expect_error(bomb, bn, 4096, -EBADMSG, "declares 268435456 decompressed bytes, header says 4096");
	uint8_t *bomb_nosize = xmalloc(64 << 10);
	zeros = calloc(big, 1);
	CHECK(zeros, "calloc");
	bn = compress_plain(zeros, big, bomb_nosize, 64 << 10, 0);
	free(zeros);
	expect_error(bomb_nosize, bn, 4096, -EBADMSG, "does not declare");

	gg_zstd_stage_fini(&st);
	free(src);
	free(z);
	free(back);
	free(bomb);
	free(bomb_nosize);
	printf("zstd stage: round trips, bypass and hostile payloads hold (%d of 200 bit flips stayed valid zstd)\n",
	       still_valid);
	return 0;
}
