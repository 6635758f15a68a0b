/* Frames the decoder must refuse, each with the error code and a message
 * that names the field and the values; the output buffer stays untouched. */
#include <errno.h>
#include <zstd.h>

#include "codec.h"
#include "crc32c.h"
#include "frame.h"
#include "test_util.h"

#define N 1000

static struct gg_frame_decoder dec;
static struct gg_frame_limits lim = { .max_elems = 1u << 16, .max_raw_bytes = 1u << 18 };
static uint8_t frame[64 << 10];
static size_t frame_bytes;
static int refused;

static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
	put32(p, (uint32_t)v);
	put32(p + 4, (uint32_t)(v >> 32));
}

static void make_frame(enum gg_codec codec, bool zstd, const float *x, size_t n)
{
	struct gg_frame_config cfg = { gg_codec_defaults(codec), zstd, 1, 1u << 16 };
	struct gg_frame_encoder enc;
	CHECK(gg_frame_encoder_init(&enc, &cfg) == 0, "encoder");
	CHECK(gg_frame_encode(&enc, x, n, frame, sizeof(frame), &frame_bytes) == 0, "encode");
	gg_frame_encoder_fini(&enc);
}

/* Recomputes the checksum so that a test reaches the check after it. */
static void reseal(void)
{
	uint32_t raw = frame[20] | frame[21] << 8 | frame[22] << 16 | (uint32_t)frame[23] << 24;
	uint32_t crc = gg_crc32c(gg_crc32c(0, frame + GG_FRAME_HEADER_BYTES, raw), frame, 28);
	put32(frame + 28, crc);
}

static void expect(const void *buf, size_t len, size_t n, int want_rc, const char *want_msg)
{
	static float out[1u << 16];
	char err[256] = "";
	for (size_t i = 0; i < GG_ARRAY_LEN(out); i++)
		out[i] = 42.0f;
	int rc = gg_frame_decode(&dec, buf, len, out, n, GG_FRAME_ACCUMULATE, NULL, err, sizeof(err));
	CHECK(rc == want_rc, "rc %d, want %d; message: %s", rc, want_rc, err);
	CHECK(strstr(err, want_msg), "message \"%s\" lacks \"%s\"", err, want_msg);
	CHECK(strncmp(err, "frame: ", 7) == 0, "message \"%s\" does not start with \"frame: \"", err);
	for (size_t i = 0; i < GG_ARRAY_LEN(out); i++)
		CHECK(out[i] == 42.0f, "output element %zu touched by a refused frame", i);
	refused++;
}

int main(void)
{
	struct rng r = { 5 };
	float x[N];
	uint8_t saved[sizeof(frame)];
	size_t saved_bytes;

	CHECK(gg_frame_decoder_init(&dec, &lim) == 0, "decoder");
	fill_data(x, N, DATA_GAUSSIAN, &r);
	make_frame(GG_CODEC_FP32, false, x, N);
	memcpy(saved, frame, frame_bytes);
	saved_bytes = frame_bytes;
#define RESET() memcpy(frame, saved, saved_bytes), frame_bytes = saved_bytes

	expect(frame, 10, N, -EBADMSG, "truncated header: 10 bytes, need 32");
	expect(frame, 0, N, -EBADMSG, "truncated header: 0 bytes");
	frame[0] = 'X';
	expect(frame, frame_bytes, N, -EBADMSG, "bad magic 0x31464758, expected 0x31464747");
	RESET();
	frame[4] = 2;
	expect(frame, frame_bytes, N, -EBADMSG, "unsupported version 2 (this build reads 1)");
	RESET();
	frame[5] = 9;
	expect(frame, frame_bytes, N, -EBADMSG, "unknown codec id 9");
	frame[5] = 0;
	expect(frame, frame_bytes, N, -EBADMSG, "unknown codec id 0");
	RESET();
	frame[6] = 0x04;
	expect(frame, frame_bytes, N, -EBADMSG, "unknown flag bits 0x04");
	RESET();
	frame[7] = 1;
	expect(frame, frame_bytes, N, -EBADMSG, "reserved byte is 0x01, must be 0");
	RESET();
	frame[5] = GG_CODEC_BF16;
	put32(frame + 16, 256);
	expect(frame, frame_bytes, N, -EBADMSG, "block size 256 given for codec bf16, which has no blocks");
	RESET();
	frame[6] = GG_FRAME_FLAG_SCALE_F16;
	expect(frame, frame_bytes, N, -EBADMSG, "fp16 scale flag set for codec fp32, which has no scales");
	RESET();
	frame[5] = GG_CODEC_INT8;
	put32(frame + 16, 100);
	expect(frame, frame_bytes, N, -EBADMSG, "block size 100 for codec int8 is not a multiple of 32 in [32, 65536]");
	put32(frame + 16, 0);
	expect(frame, frame_bytes, N, -EBADMSG, "block size 0 for codec int8");
	RESET();

	/* element count against byte counts */
	put32(frame + 20, 3000);
	put32(frame + 24, 3000);
	expect(frame, frame_bytes, N, -EBADMSG, "element count 1000 needs 4000 bytes for codec fp32, header says 3000");
	RESET();
	put64(frame + 8, 999);
	expect(frame, frame_bytes, N, -EBADMSG, "element count 999 needs 3996 bytes for codec fp32, header says 4000");
	RESET();
	put64(frame + 8, (1u << 16) + 1);
	expect(frame, frame_bytes, N, -E2BIG, "element count 65537 exceeds the limit 65536");
	put64(frame + 8, UINT64_MAX);
	expect(frame, frame_bytes, N, -E2BIG, "element count 18446744073709551615 exceeds the limit");
	RESET();
	frame[5] = GG_CODEC_BF16;
	put32(frame + 20, 2000);
	put32(frame + 24, 2000);
	expect(frame, frame_bytes, N, -EBADMSG, "trailing bytes after the 2000-byte payload");
	RESET();
	put32(frame + 24, 10);
	expect(frame, frame_bytes, N, -EBADMSG, "stored length 10 differs from raw length 4000 in a frame without zstd");
	RESET();
	frame[6] = GG_FRAME_FLAG_ZSTD;
	expect(frame, frame_bytes, N, -EBADMSG, "zstd payload of 4000 bytes is not smaller than its raw length 4000");
	RESET();

	/* raw size over the decoder's limit (count within its own limit) */
	{
		struct gg_frame_decoder small;
		struct gg_frame_limits sl = { .max_elems = 1u << 16, .max_raw_bytes = 2048 };
		char err[256];
		float out[N];
		CHECK(gg_frame_decoder_init(&small, &sl) == 0, "small decoder");
		int rc = gg_frame_decode(&small, frame, frame_bytes, out, N, GG_FRAME_STORE, NULL, err, sizeof(err));
		CHECK(rc == -E2BIG && strstr(err, "raw size 4000 bytes exceeds the limit 2048"), "rc %d: %s", rc, err);
		gg_frame_decoder_fini(&small);
		refused++;
	}

	/* lengths of the buffer itself */
	expect(frame, frame_bytes - 1, N, -EBADMSG, "truncated payload: 3999 bytes after the header, header says 4000");
	expect(frame, GG_FRAME_HEADER_BYTES, N, -EBADMSG, "truncated payload: 0 bytes after the header");
	expect(frame, frame_bytes + 3, N, -EBADMSG, "3 trailing bytes after the 4000-byte payload");

	/* checksum: the field, the payload, a header change that keeps sizes consistent */
	frame[28] ^= 1;
	expect(frame, frame_bytes, N, -EILSEQ, "checksum mismatch: computed 0x");
	RESET();
	frame[GG_FRAME_HEADER_BYTES + 77] ^= 0x10;
	expect(frame, frame_bytes, N, -EILSEQ, "checksum mismatch");
	RESET();
	make_frame(GG_CODEC_BF16, false, x, N);
	frame[5] = GG_CODEC_BF16_SPLIT; /* same size, other meaning */
	expect(frame, frame_bytes, N, -EILSEQ, "checksum mismatch");
	frame[5] = GG_CODEC_BF16;
	expect(frame, frame_bytes, N - 1, -EBADMSG, "element count 1000, caller expects 999");
	RESET();

	/* zstd payloads: a bomb, no declared size, garbage, corrupted, trailing frame */
	{
		size_t big = 64u << 20;
		uint8_t *zeros = calloc(big, 1);
		CHECK(zeros, "calloc");
		ZSTD_CCtx *c = ZSTD_createCCtx();
		size_t zn = ZSTD_compress2(c, frame + GG_FRAME_HEADER_BYTES, sizeof(frame) - GG_FRAME_HEADER_BYTES,
					   zeros, big);
		CHECK(!ZSTD_isError(zn) && zn < 4000, "bomb %zu", zn);
		frame[6] = GG_FRAME_FLAG_ZSTD;
		put32(frame + 24, (uint32_t)zn);
		expect(frame, GG_FRAME_HEADER_BYTES + zn, N, -EBADMSG,
		       "zstd: payload declares 67108864 decompressed bytes, header says 4000");

		CHECK(!ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 0)), "param");
		zn = ZSTD_compress2(c, frame + GG_FRAME_HEADER_BYTES, sizeof(frame) - GG_FRAME_HEADER_BYTES, zeros, big);
		put32(frame + 24, (uint32_t)zn);
		expect(frame, GG_FRAME_HEADER_BYTES + zn, N, -EBADMSG, "zstd: payload does not declare its decompressed size");
		free(zeros);

		memset(frame + GG_FRAME_HEADER_BYTES, 0x55, 100);
		put32(frame + 24, 100);
		expect(frame, GG_FRAME_HEADER_BYTES + 100, N, -EBADMSG, "zstd: payload is not a zstd frame");

		CHECK(!ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 1)), "param");
		float zeros_f[N] = { 0 };
		zn = ZSTD_compress2(c, frame + GG_FRAME_HEADER_BYTES, 2000, zeros_f, sizeof(zeros_f));
		CHECK(!ZSTD_isError(zn), "compress");
		memcpy(frame + GG_FRAME_HEADER_BYTES + zn, frame + GG_FRAME_HEADER_BYTES, zn);
		put32(frame + 24, (uint32_t)(2 * zn));
		expect(frame, GG_FRAME_HEADER_BYTES + 2 * zn, N, -EBADMSG, "bytes after the zstd frame");
		put32(frame + 24, (uint32_t)zn);
		reseal(); /* over the compressed bytes: wrong, as a forger would not know better */
		expect(frame, GG_FRAME_HEADER_BYTES + zn, N, -EILSEQ, "checksum mismatch");
		ZSTD_freeCCtx(c);
	}

	/* a valid zstd frame, then each of its payload bytes flipped: refused or
	 * caught by the checksum, never accepted with other values */
	{
		float g[N];
		fill_data(g, N, DATA_GAUSSIAN, &r);
		make_frame(GG_CODEC_BF16_SPLIT, true, g, N);
		CHECK(frame[6] & GG_FRAME_FLAG_ZSTD, "expected a zstd frame");
		memcpy(saved, frame, frame_bytes);
		saved_bytes = frame_bytes;
		static float good[N], out[N];
		char err[256];
		CHECK(gg_frame_decode(&dec, frame, frame_bytes, good, N, GG_FRAME_STORE, NULL, err, sizeof(err)) == 0,
		      "%s", err);
		int same = 0;
		for (size_t i = GG_FRAME_HEADER_BYTES; i < frame_bytes; i++) {
			RESET();
			frame[i] ^= (uint8_t)(1u << (i % 8));
			int rc = gg_frame_decode(&dec, frame, frame_bytes, out, N, GG_FRAME_STORE, NULL, err, sizeof(err));
			if (rc == 0) { /* e.g. zstd's "unused" header bit: same content */
				CHECK(memcmp(out, good, sizeof(out)) == 0, "flip at %zu accepted with other values", i);
				same++;
				continue;
			}
			CHECK(rc == -EBADMSG || rc == -EILSEQ, "flip at %zu: rc %d", i, rc);
			refused++;
		}
		printf("%d payload bit flips decoded to the same values\n", same);
	}

	gg_frame_decoder_fini(&dec);
	printf("frame decoder refused %d hostile frames with the expected messages\n", refused);
	return 0;
}
