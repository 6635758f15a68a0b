/* libFuzzer target: the payload frame decoder on hostile bytes, with the
 * limits a gateway would configure. A frame refused only for its checksum
 * is retried with the checksum fixed, so mutated payloads also reach the
 * codec decoders. Accepted frames are also decoded, and decoded onto
 * addends, by the scalar reference and every vector path, which must
 * agree bit for bit but for NaNs: any NaN is one (docs/codecs.md). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"
#include "crc32c.h"
#include "frame.h"

#define MAX_ELEMS (1u << 16)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct gg_frame_decoder dec;
static float out[MAX_ELEMS], acc[MAX_ELEMS], other[MAX_ELEMS];

static void same_or_die(const float *a, const float *b, size_t n, const char *isa, const char *what)
{
	for (size_t i = 0; i < n; i++) {
		uint32_t x, y;
		memcpy(&x, &a[i], 4);
		memcpy(&y, &b[i], 4);
		bool nan_a = (x & 0x7fffffffu) > 0x7f800000u, nan_b = (y & 0x7fffffffu) > 0x7f800000u;
		if (nan_a ? !nan_b : x != y) {
			fprintf(stderr, "%s %s differs from the reference at %zu: 0x%08x vs 0x%08x\n", isa, what, i, y, x);
			abort();
		}
	}
}

static void decode_all(const uint8_t *data, size_t size);

/* The raw codec bytes of a frame whose checksum alone failed: the payload,
 * or the decoder's scratch when zstd was undone. */
static const uint8_t *raw_of(const uint8_t *frame, const struct gg_frame_info *info)
{
	return info->zstd ? dec.scratch : frame + GG_FRAME_HEADER_BYTES;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int ready;
	char err[256];
	struct gg_frame_info info;
	const uint8_t *raw;

	if (!ready) {
		struct gg_frame_limits lim = { .max_elems = MAX_ELEMS, .max_raw_bytes = 4u * MAX_ELEMS };
		if (gg_frame_decoder_init(&dec, &lim))
			abort();
		ready = 1;
	}
	err[0] = 0;
	int rc = gg_frame_unwrap(&dec, data, size, &info, &raw, err, sizeof(err));
	if (rc) {
		if (strncmp(err, "frame: ", 7) || !memchr(err, 0, sizeof(err)))
			abort(); /* every refusal explains itself */
		if (rc != -EILSEQ)
			return 0;
		uint8_t *fixed = malloc(size);
		if (!fixed)
			return 0; /* the replay's injected allocation failure */
		memcpy(fixed, data, size);
		uint32_t crc = gg_crc32c(gg_crc32c(0, raw_of(fixed, &info), info.raw_bytes), fixed, 28);
		for (int i = 0; i < 4; i++)
			fixed[28 + i] = (uint8_t)(crc >> (8 * i));
		decode_all(fixed, size);
		free(fixed);
		return 0;
	}
	decode_all(data, size);
	return 0;
}

static void decode_all(const uint8_t *data, size_t size)
{
	char err[256];
	struct gg_frame_info info;
	const uint8_t *raw;

	if (gg_frame_unwrap(&dec, data, size, &info, &raw, err, sizeof(err)))
		abort(); /* accepted once (or fixed up), must be accepted again */
	size_t n = (size_t)info.elems;
	if (gg_frame_decode(&dec, data, size, out, n, GG_FRAME_STORE, NULL, err, sizeof(err)))
		abort(); /* unwrap accepted it */
	memset(acc, 0, n * sizeof(float));
	if (gg_frame_decode(&dec, data, size, acc, n, GG_FRAME_ACCUMULATE, NULL, err, sizeof(err)))
		abort();
	if (gg_frame_unwrap(&dec, data, size, &info, &raw, err, sizeof(err)))
		abort();
	n = (size_t)info.elems;
	const struct gg_codec_params *p = &info.params;
	gg_decode_whole(gg_codec_kernels_ref.decode[p->codec], p->codec, raw, n, p->block_elems, p->scale, out);
	/* The addends: the decoded values themselves, infinities and NaNs
	 * included. */
	memcpy(acc, out, n * sizeof(float));
	gg_decode_whole(gg_codec_kernels_ref.decode_acc[p->codec], p->codec, raw, n, p->block_elems, p->scale, acc);
	for (int isa = GG_ISA_SCALAR + 1; isa < GG_ISA_COUNT; isa++) {
		const struct gg_codec_kernels *k = gg_codec_kernels_for((enum gg_isa)isa);
		if (!k)
			continue;
		gg_decode_whole(k->decode[p->codec], p->codec, raw, n, p->block_elems, p->scale, other);
		same_or_die(out, other, n, gg_isa_name((enum gg_isa)isa), "decode");
		memcpy(other, out, n * sizeof(float));
		gg_decode_whole(k->decode_acc[p->codec], p->codec, raw, n, p->block_elems, p->scale, other);
		same_or_die(acc, other, n, gg_isa_name((enum gg_isa)isa), "decode-and-accumulate");
	}
}
