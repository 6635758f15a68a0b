#include "zstd_stage.h"

#include <errno.h>
#include <stdio.h>
#include <zstd.h>
#include <zstd_errors.h>

int gg_zstd_stage_init(struct gg_zstd_stage *st, int level, size_t max_raw_bytes)
{
	*st = (struct gg_zstd_stage){ .level = level, .min_saving_div = GG_ZSTD_DEFAULT_MIN_SAVING_DIV,
				      .max_raw_bytes = max_raw_bytes };
	if (level == 0 || level < ZSTD_minCLevel() || level > ZSTD_maxCLevel())
		return -EINVAL;
	st->cctx = ZSTD_createCCtx();
	st->dctx = ZSTD_createDCtx();
	if (!st->cctx || !st->dctx)
		goto nomem;
	if (ZSTD_isError(ZSTD_CCtx_setParameter(st->cctx, ZSTD_c_compressionLevel, level)) ||
	    ZSTD_isError(ZSTD_CCtx_setParameter(st->cctx, ZSTD_c_contentSizeFlag, 1)) ||
	    ZSTD_isError(ZSTD_CCtx_setParameter(st->cctx, ZSTD_c_checksumFlag, 0))) {
		gg_zstd_stage_fini(st);
		return -EINVAL;
	}
	int wlog = 10; /* ZSTD_WINDOWLOG_ABSOLUTEMIN */
	while (wlog < 31 && ((size_t)1 << wlog) < max_raw_bytes)
		wlog++;
	if (ZSTD_isError(ZSTD_DCtx_setParameter(st->dctx, ZSTD_d_windowLogMax, wlog))) {
		gg_zstd_stage_fini(st);
		return -EINVAL;
	}
	return 0;
nomem:
	gg_zstd_stage_fini(st);
	return -ENOMEM;
}

void gg_zstd_stage_fini(struct gg_zstd_stage *st)
{
	ZSTD_freeCCtx(st->cctx);
	ZSTD_freeDCtx(st->dctx);
	st->cctx = NULL;
	st->dctx = NULL;
}

int gg_zstd_stage_compress(struct gg_zstd_stage *st, const void *src, size_t n, void *dst,
			   size_t dst_cap, size_t *out_bytes)
{
	*out_bytes = 0;
	if (n < GG_ZSTD_MIN_INPUT_BYTES)
		return 0;
	size_t limit = n - n / st->min_saving_div;
	size_t r = ZSTD_compress2(st->cctx, dst, GG_MIN(limit, dst_cap), src, n);
	if (ZSTD_isError(r)) {
		if (ZSTD_getErrorCode(r) == ZSTD_error_memory_allocation)
			return -ENOMEM;
		/* Too big for the limit (or any other refusal): store raw. */
		return 0;
	}
	*out_bytes = r;
	return 0;
}

int gg_zstd_stage_decompress(struct gg_zstd_stage *st, const void *src, size_t n, void *dst,
			     size_t raw_bytes, char *err, size_t err_size)
{
	if (raw_bytes > st->max_raw_bytes) {
		snprintf(err, err_size, "zstd: raw size %zu bytes exceeds the limit %zu", raw_bytes,
			 st->max_raw_bytes);
		return -E2BIG;
	}
	unsigned long long declared = ZSTD_getFrameContentSize(src, n);
	if (declared == ZSTD_CONTENTSIZE_ERROR) {
		snprintf(err, err_size, "zstd: payload is not a zstd frame");
		return -EBADMSG;
	}
	if (declared == ZSTD_CONTENTSIZE_UNKNOWN) {
		snprintf(err, err_size, "zstd: payload does not declare its decompressed size");
		return -EBADMSG;
	}
	if (declared != raw_bytes) {
		snprintf(err, err_size, "zstd: payload declares %llu decompressed bytes, header says %zu",
			 declared, raw_bytes);
		return -EBADMSG;
	}
	size_t frame = ZSTD_findFrameCompressedSize(src, n);
	if (ZSTD_isError(frame)) {
		snprintf(err, err_size, "zstd: %s", ZSTD_getErrorName(frame));
		return -EBADMSG;
	}
	if (frame != n) {
		snprintf(err, err_size, "zstd: %zu bytes after the zstd frame in a %zu-byte payload", n - frame, n);
		return -EBADMSG;
	}
	size_t r = ZSTD_decompressDCtx(st->dctx, dst, raw_bytes, src, n);
	if (ZSTD_isError(r)) {
		snprintf(err, err_size, "zstd: %s", ZSTD_getErrorName(r));
		return -EBADMSG;
	}
	if (r != raw_bytes) {
		snprintf(err, err_size, "zstd: payload decompressed to %zu bytes, header says %zu", r, raw_bytes);
		return -EBADMSG;
	}
	return 0;
}
