/* The zstd stage: per-chunk compression of encoded bytes with a bypass for
 * chunks that do not compress enough to pay for it.
 *
 * Bypass rule: a chunk of n bytes is stored compressed only when n >=
 * GG_ZSTD_MIN_INPUT_BYTES and zstd succeeds with n - n / min_saving_div
 * bytes of output room (default 8: it must save 12.5%, and a frame that
 * would end within the few bytes zstd wants spare of that bound does not
 * fit); otherwise it is stored raw. Chunks of GG_ZSTD_PROBE_MIN_INPUT_BYTES
 * and more are probed first: 8 slices of 4 KiB, slice k at byte
 * k * (n / 8) (so both planes of bf16-split are seen), are compressed
 * together under the same rule, and when the probe fails the chunk is
 * stored raw without compressing the rest. The decision
 * only ever chooses between two valid encodings. See docs/codecs.md for the
 * measurements behind these numbers.
 *
 * One stage object owns one ZSTD_CCtx and one ZSTD_DCtx, reused for every
 * chunk; it is not thread-safe (use one per thread). */
#ifndef GG_ZSTD_STAGE_H
#define GG_ZSTD_STAGE_H

#include <stddef.h>
#include <stdint.h>

#include "gg_common.h"

#define GG_ZSTD_DEFAULT_LEVEL 1
#define GG_ZSTD_DEFAULT_MIN_SAVING_DIV 8
#define GG_ZSTD_MIN_INPUT_BYTES 64
#define GG_ZSTD_PROBE_MIN_INPUT_BYTES (128u << 10)
#define GG_ZSTD_PROBE_SLICES 8
#define GG_ZSTD_PROBE_SLICE_BYTES 4096u

struct gg_zstd_stage {
	void *cctx; /* ZSTD_CCtx */
	void *dctx; /* ZSTD_DCtx */
	int level;
	unsigned min_saving_div;
	size_t max_raw_bytes;
	uint8_t *probe; /* slices, then room for their compressed form */
	unsigned long long probes, probe_bypasses; /* counters for benchmarks */
};

/* `level`: ZSTD_minCLevel()..ZSTD_maxCLevel(), 0 excluded (zstd would read
 * it as its default, 3). `max_raw_bytes` bounds what decompress accepts.
 * Returns 0, -EINVAL or -ENOMEM. */
GG_MUST_CHECK int gg_zstd_stage_init(struct gg_zstd_stage *st, int level, size_t max_raw_bytes);
void gg_zstd_stage_fini(struct gg_zstd_stage *st);

/* Compresses src[0..n) into dst. Returns 0 with *out_bytes the compressed
 * size, or 0 with *out_bytes == 0 when the bypass rule says to store the
 * chunk raw; -ENOMEM when zstd runs out of memory. dst_cap must be at least
 * n (a compressed chunk is always smaller). */
GG_MUST_CHECK int gg_zstd_stage_compress(struct gg_zstd_stage *st, const void *src, size_t n,
					 void *dst, size_t dst_cap, size_t *out_bytes);

/* Decompresses one zstd frame src[0..n) that must expand to exactly
 * raw_bytes (<= max_raw_bytes) into dst. Returns 0, or -EBADMSG / -E2BIG
 * with a message in err naming what is wrong. dst is written only up to
 * raw_bytes, even for hostile input. */
GG_MUST_CHECK int gg_zstd_stage_decompress(struct gg_zstd_stage *st, const void *src, size_t n,
					   void *dst, size_t raw_bytes, char *err, size_t err_size);

#endif
