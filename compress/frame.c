#include "frame.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"
#include "crc32c.h"

#define CHECKED_HEADER_BYTES 28

static uint32_t ld32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t ld64(const uint8_t *p)
{
	return (uint64_t)ld32(p) | (uint64_t)ld32(p + 4) << 32;
}

static void st32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void st64(uint8_t *p, uint64_t v)
{
	st32(p, (uint32_t)v);
	st32(p + 4, (uint32_t)(v >> 32));
}

int gg_frame_bound(const struct gg_codec_params *p, uint64_t n, uint64_t *bytes)
{
	uint64_t raw;
	int rc = gg_codec_encoded_bytes(p, n, &raw);

	if (rc)
		return rc;
	if (raw > GG_FRAME_MAX_RAW_BYTES)
		return -EOVERFLOW;
	*bytes = GG_FRAME_HEADER_BYTES + raw;
	return 0;
}

int gg_frame_encoder_init(struct gg_frame_encoder *enc, const struct gg_frame_config *cfg)
{
	uint64_t raw;

	*enc = (struct gg_frame_encoder){ .cfg = *cfg };
	if (gg_codec_encoded_bytes(&cfg->codec, cfg->max_elems, &raw) || raw > GG_FRAME_MAX_RAW_BYTES)
		return -EINVAL;
	enc->max_raw_bytes = raw;
	if (!cfg->zstd)
		return 0;
	int rc = gg_zstd_stage_init(&enc->zs, cfg->zstd_level, raw);
	if (rc)
		return rc;
	if (cfg->zstd_min_saving_div)
		enc->zs.min_saving_div = cfg->zstd_min_saving_div;
	enc->scratch = malloc(raw ? raw : 1);
	if (!enc->scratch) {
		gg_zstd_stage_fini(&enc->zs);
		return -ENOMEM;
	}
	return 0;
}

void gg_frame_encoder_fini(struct gg_frame_encoder *enc)
{
	if (enc->cfg.zstd)
		gg_zstd_stage_fini(&enc->zs);
	free(enc->scratch);
	enc->scratch = NULL;
}

/* The payload at dst + header holds the raw codec bytes; compresses them
 * when that pays and writes the header. */
static int finish(struct gg_frame_encoder *enc, uint8_t *dst, size_t raw_bytes, size_t n,
		  size_t *frame_bytes)
{
	const struct gg_codec_params *p = &enc->cfg.codec;
	uint8_t *payload = dst + GG_FRAME_HEADER_BYTES;
	uint8_t flags = p->scale == GG_SCALE_F16 ? GG_FRAME_FLAG_SCALE_F16 : 0;
	size_t stored = raw_bytes, packed = 0;
	uint32_t crc = gg_crc32c(0, payload, raw_bytes);

	if (enc->cfg.zstd) {
		int rc = gg_zstd_stage_compress(&enc->zs, payload, raw_bytes, enc->scratch, enc->max_raw_bytes,
						&packed);
		if (rc)
			return rc;
		if (packed) {
			flags |= GG_FRAME_FLAG_ZSTD;
			stored = packed;
		}
	}
	st32(dst, GG_FRAME_MAGIC);
	dst[4] = GG_FRAME_VERSION;
	dst[5] = (uint8_t)p->codec;
	dst[6] = flags;
	dst[7] = 0;
	st64(dst + 8, n);
	st32(dst + 16, p->block_elems);
	st32(dst + 20, (uint32_t)raw_bytes);
	st32(dst + 24, (uint32_t)stored);
	st32(dst + 28, gg_crc32c(crc, dst, CHECKED_HEADER_BYTES));
	if (packed)
		memcpy(payload, enc->scratch, packed);
	*frame_bytes = GG_FRAME_HEADER_BYTES + stored;
	return 0;
}

static int encoder_room(const struct gg_frame_encoder *enc, size_t n, size_t dst_cap, uint64_t *raw)
{
	if (n > enc->cfg.max_elems)
		return -EINVAL;
	if (gg_codec_encoded_bytes(&enc->cfg.codec, n, raw))
		return -EINVAL;
	if (dst_cap < GG_FRAME_HEADER_BYTES || dst_cap - GG_FRAME_HEADER_BYTES < *raw)
		return -ENOBUFS;
	return 0;
}

int gg_frame_encode(struct gg_frame_encoder *enc, const float *src, size_t n, void *dst,
		    size_t dst_cap, size_t *frame_bytes)
{
	uint64_t raw;
	int rc = encoder_room(enc, n, dst_cap, &raw);

	if (rc)
		return rc;
	rc = gg_codec_encode(&enc->cfg.codec, src, n, (uint8_t *)dst + GG_FRAME_HEADER_BYTES, raw);
	if (rc)
		return rc;
	return finish(enc, dst, raw, n, frame_bytes);
}

int gg_frame_encode_bf16(struct gg_frame_encoder *enc, const uint16_t *src, size_t n, void *dst,
			 size_t dst_cap, size_t *frame_bytes)
{
	uint64_t raw;
	int rc = encoder_room(enc, n, dst_cap, &raw);

	if (rc)
		return rc;
	rc = gg_codec_encode_bf16(&enc->cfg.codec, src, n, (uint8_t *)dst + GG_FRAME_HEADER_BYTES, raw);
	if (rc)
		return rc;
	return finish(enc, dst, raw, n, frame_bytes);
}

int gg_frame_wrap(struct gg_frame_encoder *enc, const void *raw, size_t raw_bytes, size_t n,
		  void *dst, size_t dst_cap, size_t *frame_bytes)
{
	uint64_t need;
	int rc = encoder_room(enc, n, dst_cap, &need);

	if (rc)
		return rc;
	if (raw_bytes != need)
		return -EINVAL;
	uint8_t *payload = (uint8_t *)dst + GG_FRAME_HEADER_BYTES;
	if (raw != payload && raw_bytes)
		memcpy(payload, raw, raw_bytes);
	return finish(enc, dst, raw_bytes, n, frame_bytes);
}

int gg_frame_parse_header(const void *buf, size_t len, const struct gg_frame_limits *lim,
			  struct gg_frame_info *info, char *err, size_t err_size)
{
	const uint8_t *h = buf;

	if (len < GG_FRAME_HEADER_BYTES)
		return gg_errf(err, err_size, -EBADMSG, "frame: truncated header: %zu bytes, need %d", len,
			    GG_FRAME_HEADER_BYTES);
	uint32_t magic = ld32(h);
	if (magic != GG_FRAME_MAGIC)
		return gg_errf(err, err_size, -EBADMSG, "frame: bad magic 0x%08x, expected 0x%08x (\"GGF1\")",
			    magic, GG_FRAME_MAGIC);
	if (h[4] != GG_FRAME_VERSION)
		return gg_errf(err, err_size, -EBADMSG, "frame: unsupported version %u (this build reads %d)",
			    h[4], GG_FRAME_VERSION);
	const char *name = gg_codec_name((enum gg_codec)h[5]);
	if (!name)
		return gg_errf(err, err_size, -EBADMSG, "frame: unknown codec id %u (known: %s)", h[5],
			    gg_codec_names());
	uint8_t flags = h[6];
	if (flags & ~(GG_FRAME_FLAG_ZSTD | GG_FRAME_FLAG_SCALE_F16))
		return gg_errf(err, err_size, -EBADMSG, "frame: unknown flag bits 0x%02x", flags);
	if (h[7])
		return gg_errf(err, err_size, -EBADMSG, "frame: reserved byte is 0x%02x, must be 0", h[7]);

	struct gg_frame_info fi = {
		.params = { .codec = (enum gg_codec)h[5], .block_elems = ld32(h + 16),
			    .scale = flags & GG_FRAME_FLAG_SCALE_F16 ? GG_SCALE_F16 : GG_SCALE_F32 },
		.elems = ld64(h + 8),
		.raw_bytes = ld32(h + 20),
		.stored_bytes = ld32(h + 24),
		.checksum = ld32(h + 28),
		.zstd = flags & GG_FRAME_FLAG_ZSTD,
	};
	if (!gg_codec_has_blocks(fi.params.codec)) {
		if (fi.params.block_elems)
			return gg_errf(err, err_size, -EBADMSG,
				    "frame: block size %u given for codec %s, which has no blocks",
				    fi.params.block_elems, name);
		if (fi.params.scale != GG_SCALE_F32)
			return gg_errf(err, err_size, -EBADMSG,
				    "frame: fp16 scale flag set for codec %s, which has no scales", name);
	} else if (gg_codec_params_check(&fi.params, NULL)) {
		return gg_errf(err, err_size, -EBADMSG,
			    "frame: block size %u for codec %s is not a multiple of %u in [%u, %u]",
			    fi.params.block_elems, name, GG_CODEC_BLOCK_ALIGN_ELEMS, GG_CODEC_MIN_BLOCK_ELEMS,
			    GG_CODEC_MAX_BLOCK_ELEMS);
	}
	if (fi.elems > lim->max_elems)
		return gg_errf(err, err_size, -E2BIG, "frame: element count %llu exceeds the limit %llu",
			    (unsigned long long)fi.elems, (unsigned long long)lim->max_elems);
	uint64_t need = 0;
	if (gg_codec_encoded_bytes(&fi.params, fi.elems, &need))
		return gg_errf(err, err_size, -EBADMSG, "frame: element count %llu is too large for codec %s",
			    (unsigned long long)fi.elems, name);
	if (need != fi.raw_bytes)
		return gg_errf(err, err_size, -EBADMSG,
			    "frame: element count %llu needs %llu bytes for codec %s, header says %u",
			    (unsigned long long)fi.elems, (unsigned long long)need, name, fi.raw_bytes);
	if (fi.raw_bytes > lim->max_raw_bytes)
		return gg_errf(err, err_size, -E2BIG, "frame: raw size %u bytes exceeds the limit %zu",
			    fi.raw_bytes, lim->max_raw_bytes);
	if (!fi.zstd && fi.stored_bytes != fi.raw_bytes)
		return gg_errf(err, err_size, -EBADMSG,
			    "frame: stored length %u differs from raw length %u in a frame without zstd",
			    fi.stored_bytes, fi.raw_bytes);
	if (fi.zstd && fi.stored_bytes >= fi.raw_bytes)
		return gg_errf(err, err_size, -EBADMSG,
			    "frame: zstd payload of %u bytes is not smaller than its raw length %u",
			    fi.stored_bytes, fi.raw_bytes);
	fi.frame_bytes = GG_FRAME_HEADER_BYTES + (size_t)fi.stored_bytes;
	*info = fi;
	return 0;
}

int gg_frame_decoder_init(struct gg_frame_decoder *dec, const struct gg_frame_limits *limits)
{
	*dec = (struct gg_frame_decoder){ .limits = *limits };
	if (limits->max_raw_bytes > GG_FRAME_MAX_RAW_BYTES)
		return -EINVAL;
	int rc = gg_zstd_stage_init(&dec->zs, GG_ZSTD_DEFAULT_LEVEL, limits->max_raw_bytes);
	if (rc)
		return rc;
	dec->scratch = malloc(limits->max_raw_bytes ? limits->max_raw_bytes : 1);
	if (!dec->scratch) {
		gg_zstd_stage_fini(&dec->zs);
		return -ENOMEM;
	}
	return 0;
}

void gg_frame_decoder_fini(struct gg_frame_decoder *dec)
{
	gg_zstd_stage_fini(&dec->zs);
	free(dec->scratch);
	dec->scratch = NULL;
}

int gg_frame_unwrap(struct gg_frame_decoder *dec, const void *frame, size_t frame_bytes,
		    struct gg_frame_info *info, const uint8_t **raw, char *err, size_t err_size)
{
	int rc = gg_frame_parse_header(frame, frame_bytes, &dec->limits, info, err, err_size);

	if (rc)
		return rc;
	size_t have = frame_bytes - GG_FRAME_HEADER_BYTES;
	if (have < info->stored_bytes)
		return gg_errf(err, err_size, -EBADMSG,
			    "frame: truncated payload: %zu bytes after the header, header says %u", have,
			    info->stored_bytes);
	if (have > info->stored_bytes)
		return gg_errf(err, err_size, -EBADMSG, "frame: %zu trailing bytes after the %u-byte payload",
			    have - info->stored_bytes, info->stored_bytes);
	const uint8_t *payload = (const uint8_t *)frame + GG_FRAME_HEADER_BYTES;
	if (info->zstd) {
		char why[160];
		rc = gg_zstd_stage_decompress(&dec->zs, payload, info->stored_bytes, dec->scratch,
					      info->raw_bytes, why, sizeof(why));
		if (rc)
			return gg_errf(err, err_size, rc, "frame: %s", why);
		payload = dec->scratch;
	}
	uint32_t crc = gg_crc32c(gg_crc32c(0, payload, info->raw_bytes), frame, CHECKED_HEADER_BYTES);
	if (crc != info->checksum)
		return gg_errf(err, err_size, -EILSEQ, "frame: checksum mismatch: computed 0x%08x, header says 0x%08x",
			    crc, info->checksum);
	*raw = payload;
	return 0;
}

int gg_frame_unwrap_n(struct gg_frame_decoder *dec, const void *frame, size_t frame_bytes, size_t n,
		      struct gg_frame_info *fi, const uint8_t **raw, char *err, size_t err_size)
{
	int rc = gg_frame_unwrap(dec, frame, frame_bytes, fi, raw, err, err_size);

	if (!rc && fi->elems != n)
		rc = gg_errf(err, err_size, -EBADMSG, "frame: element count %llu, caller expects %zu",
			     (unsigned long long)fi->elems, n);
	return rc;
}

int gg_frame_decode(struct gg_frame_decoder *dec, const void *frame, size_t frame_bytes, float *out,
		    size_t n, enum gg_frame_op op, struct gg_frame_info *info, char *err, size_t err_size)
{
	struct gg_frame_info fi;
	const uint8_t *raw = NULL;
	int rc = gg_frame_unwrap_n(dec, frame, frame_bytes, n, &fi, &raw, err, err_size);

	if (rc)
		return rc;
	if (op == GG_FRAME_ACCUMULATE)
		rc = gg_codec_decode_acc(&fi.params, raw, fi.raw_bytes, n, out);
	else
		rc = gg_codec_decode(&fi.params, raw, fi.raw_bytes, n, out);
	if (rc)
		return gg_errf(err, err_size, rc, "frame: codec %s refused the payload", gg_codec_name(fi.params.codec));
	if (info)
		*info = fi;
	return 0;
}

/* A frame without zstd, by its header: its payload lies in the frame
 * (not in the decoder's scratch), where it stays while another is read. */
static bool sweepable(const struct gg_frame_decoder *dec, const void *frame, size_t frame_bytes,
		      struct gg_frame_info *fi)
{
	char why[8];

	return !gg_frame_parse_header(frame, frame_bytes, &dec->limits, fi, why, sizeof(why)) && !fi->zstd;
}

int gg_frame_decode_sum(struct gg_frame_decoder *dec, const void *const *frames, const size_t *frame_bytes,
			unsigned count, float *out, size_t n, unsigned *bad, char *err, size_t err_size)
{
	struct gg_frame_info fi[GG_FRAME_SUM_MAX];
	const uint8_t *raw[GG_FRAME_SUM_MAX];
	bool sweep = count >= 2 && count <= GG_FRAME_SUM_MAX;
	int rc = 0;

	*bad = 0;
	for (unsigned f = 0; f < count && sweep; f++)
		sweep = sweepable(dec, frames[f], frame_bytes[f], &fi[f]) &&
			!memcmp(&fi[f].params, &fi[0].params, sizeof(fi[0].params));
	if (!sweep) {
		for (unsigned f = 0; f < count && !rc; f++) {
			*bad = f;
			rc = gg_frame_decode(dec, frames[f], frame_bytes[f], out, n,
					     f ? GG_FRAME_ACCUMULATE : GG_FRAME_STORE, NULL, err, err_size);
		}
		return rc;
	}
	for (unsigned f = 0; f < count; f++) {
		*bad = f;
		if ((rc = gg_frame_unwrap_n(dec, frames[f], frame_bytes[f], n, &fi[f], &raw[f], err, err_size)))
			return rc;
	}
	const size_t step = gg_codec_span_step(&fi[0].params);
	for (size_t i = 0; i < n && !rc; i += step) {
		size_t m = GG_MIN(step, n - i);
		for (unsigned f = 0; f < count && !rc; f++) {
			*bad = f;
			rc = gg_codec_decode_span(&fi[f].params, raw[f], fi[f].raw_bytes, n, i, m, out + i, f > 0);
		}
	}
	return rc ? gg_errf(err, err_size, rc, "frame: codec %s refused the payload", gg_codec_name(fi[0].params.codec))
		  : 0;
}
