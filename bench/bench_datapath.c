/* gradgate-bench datapath: each pass a gateway makes over a step's bytes,
 * timed on its own with the code the gateway runs, one core, and what they
 * add up to for one site of one step. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "codec.h"
#include "feedback.h"
#include "frame.h"
#include "gg_common.h"
#include "host_sum.h"
#include "units.h"

#define TLS_RECORD (16u << 10)
#define TLS_TAG 16

struct opts {
	uint64_t count;
	uint64_t chunk_elems;
	unsigned ranks, sites;
	enum gg_codec codec;
	int reps;
	bool json;
};

struct ctx {
	const struct opts *o;
	float *x[8];       /* the ranks' tensors; x[0] takes the site sum in place */
	float *result;     /* a second rank's tensor: the result copied there */
	uint8_t *frames;   /* every chunk's frame, back to back */
	size_t *frame_len;
	size_t nchunks, frame_cap;
	uint8_t *sealed;   /* the frames as TLS records */
	struct gg_frame_encoder enc;
	struct gg_frame_decoder dec;
	struct gg_feedback fb;
	EVP_CIPHER_CTX *seal, *open;
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: gradgate-bench datapath [options]\n"
		"Times each pass a gateway makes over one step's bytes (host mode), on one core,\n"
		"with the gateway's own code, and adds them up for one site of a direct step.\n\n"
		"  --codec NAME   fp32, bf16, bf16-split, int8, int4 (default fp32)\n"
		"  --count N      float32 elements per step (default 16777216, 64 MiB)\n"
		"  --ranks R      ranks at the site, 1-8 (default 2)\n"
		"  --sites K      sites, 2-8, for the sum (default 3)\n"
		"  --chunk SIZE   fp32 bytes per chunk (default 1MiB)\n"
		"  --reps N       repetitions, the fastest counts (default 5)\n"
		"  --json         one JSON object per pass, then one for the sum\n"
		"GB/s count the step's fp32 bytes; TLS passes run AES-256-GCM over 16 KiB records\n"
		"of the encoded frames, as the engine does. The kernel's socket copies are not\n"
		"here: `gradgate-bench transport --plain` measures them.\n");
}

static int parse(int argc, char **argv, struct opts *o)
{
	static const struct option lopts[] = {
		{ "codec", required_argument, NULL, 'c' }, { "count", required_argument, NULL, 'n' },
		{ "ranks", required_argument, NULL, 'r' }, { "sites", required_argument, NULL, 'k' },
		{ "chunk", required_argument, NULL, 'C' }, { "reps", required_argument, NULL, 'p' },
		{ "json", no_argument, NULL, 'j' },	   { "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	uint64_t bytes;
	char *end;
	int c;

	*o = (struct opts){ .count = 16u << 20, .chunk_elems = 1u << 18, .ranks = 2, .sites = 3,
			    .codec = GG_CODEC_FP32, .reps = 5 };
	while ((c = getopt_long(argc, argv, ":h", lopts, NULL)) != -1) {
		switch (c) {
		case 'c':
			if (gg_codec_from_name(optarg, &o->codec)) {
				fprintf(stderr, "gradgate-bench datapath: --codec is one of %s, not '%s'\n",
					gg_codec_names(), optarg);
				return 2;
			}
			break;
		case 'n':
			o->count = strtoull(optarg, &end, 10);
			if (*end || o->count < 1 || o->count > (1ull << 30)) {
				fprintf(stderr, "gradgate-bench datapath: --count is 1 to 1073741824 elements, not '%s'\n",
					optarg);
				return 2;
			}
			break;
		case 'r':
		case 'k': {
			long v = strtol(optarg, &end, 10);
			bool ranks = c == 'r';
			if (*end || v < (ranks ? 1 : 2) || v > 8) {
				fprintf(stderr, "gradgate-bench datapath: --%s is %d to 8, not '%s'\n",
					ranks ? "ranks" : "sites", ranks ? 1 : 2, optarg);
				return 2;
			}
			*(ranks ? &o->ranks : &o->sites) = (unsigned)v;
			break;
		}
		case 'C':
			if (gg_bench_size("datapath", "--chunk", optarg, 4u << 10, 64u << 20, sizeof(float), &bytes))
				return 2;
			o->chunk_elems = bytes / 4;
			break;
		case 'p':
			o->reps = (int)strtol(optarg, &end, 10);
			if (*end || o->reps < 1 || o->reps > 100) {
				fprintf(stderr, "gradgate-bench datapath: --reps is 1 to 100, not '%s'\n", optarg);
				return 2;
			}
			break;
		case 'j': o->json = true; break;
		case 'h': usage(stdout); return 0;
		default: return gg_bench_bad_option("datapath", c, argv);
		}
	}
	if (gg_bench_no_operands("datapath", argc, argv, optind))
		return 2;
	if (o->chunk_elems > o->count)
		o->chunk_elems = o->count;
	return -1;
}

/* ---- the passes ------------------------------------------------------------ */

static uint64_t chunk_n(const struct ctx *c, size_t k)
{
	return GG_MIN(c->o->chunk_elems, c->o->count - k * c->o->chunk_elems);
}

static int pass_client_copy(struct ctx *c)
{
	memcpy(c->result, c->x[0], c->o->count * sizeof(float));
	return 0;
}

static int pass_site_sum(struct ctx *c)
{
	for (size_t k = 0; k < c->nchunks; k++)
		gg_host_sum_f32(c->x[0], (const float *const *)c->x, c->o->ranks, k * c->o->chunk_elems, chunk_n(c, k));
	return 0;
}

static int pass_encode(struct ctx *c)
{
	for (size_t k = 0; k < c->nchunks; k++) {
		int rc = gg_frame_encode(&c->enc, c->x[1] + k * c->o->chunk_elems, chunk_n(c, k),
					 c->frames + k * c->frame_cap, c->frame_cap, &c->frame_len[k]);
		if (rc)
			return rc;
	}
	return 0;
}

static int pass_encode_feedback(struct ctx *c)
{
	const struct gg_codec_params *p = &c->enc.cfg.codec;

	for (size_t k = 0; k < c->nchunks; k++) {
		uint64_t n = chunk_n(c, k), raw;
		uint8_t *f = c->frames + k * c->frame_cap;
		int rc = gg_codec_encoded_bytes(p, n, &raw);
		if (!rc)
			rc = gg_feedback_encode(&c->fb, p, k * c->o->chunk_elems, c->x[1] + k * c->o->chunk_elems, n,
						f + GG_FRAME_HEADER_BYTES, raw, NULL);
		if (!rc)
			rc = gg_frame_wrap(&c->enc, f + GG_FRAME_HEADER_BYTES, raw, n, f, c->frame_cap, &c->frame_len[k]);
		if (rc)
			return rc;
	}
	return 0;
}

/* Every frame as TLS 1.3 records of at most 16 KiB, sealed (or opened)
 * from one buffer into another in one pass, a nonce per record. */
static int tls_pass(struct ctx *c, bool seal)
{
	static const uint8_t key[32] = { 1 }, iv[12] = { 2 };
	uint8_t nonce[12], aad[5] = { 23, 3, 3, 0, 0 }, tag[TLS_TAG];
	uint64_t seq = 0;
	EVP_CIPHER_CTX *x = seal ? c->seal : c->open;
	size_t at = 0;
	int len;

	for (size_t k = 0; k < c->nchunks; k++) {
		uint8_t *plain = c->frames + k * c->frame_cap;
		for (size_t off = 0; off < c->frame_len[k]; off += TLS_RECORD, seq++) {
			size_t n = GG_MIN((size_t)TLS_RECORD, c->frame_len[k] - off);
			uint8_t *rec = c->sealed + at;
			memcpy(nonce, iv, sizeof(nonce));
			for (int b = 0; b < 8; b++)
				nonce[11 - b] ^= (uint8_t)(seq >> (8 * b));
			aad[3] = (uint8_t)((n + 1 + TLS_TAG) >> 8);
			aad[4] = (uint8_t)(n + 1 + TLS_TAG);
			bool ok;
			if (seal) {
				ok = EVP_EncryptInit_ex(x, NULL, NULL, key, nonce) && EVP_EncryptUpdate(x, NULL, &len, aad, 5) &&
				     EVP_EncryptUpdate(x, rec, &len, plain + off, (int)n) &&
				     EVP_EncryptFinal_ex(x, tag, &len) &&
				     EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_AEAD_GET_TAG, TLS_TAG, rec + n);
			} else {
				ok = EVP_DecryptInit_ex(x, NULL, NULL, key, nonce) && EVP_DecryptUpdate(x, NULL, &len, aad, 5) &&
				     EVP_DecryptUpdate(x, plain + off, &len, rec, (int)n) &&
				     EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_AEAD_SET_TAG, TLS_TAG, rec + n) &&
				     EVP_DecryptFinal_ex(x, tag, &len);
			}
			if (!ok) {
				fprintf(stderr, "gradgate-bench datapath: TLS %s of record %llu failed\n",
					seal ? "seal" : "open", (unsigned long long)seq);
				return -EIO;
			}
			at += n + TLS_TAG;
		}
	}
	return 0;
}

static int pass_seal(struct ctx *c)
{
	return tls_pass(c, true);
}

static int pass_open(struct ctx *c)
{
	return tls_pass(c, false);
}

static int decode_pass(struct ctx *c, enum gg_frame_op op)
{
	for (size_t k = 0; k < c->nchunks; k++) {
		char err[160];
		int rc = gg_frame_decode(&c->dec, c->frames + k * c->frame_cap, c->frame_len[k],
					 c->result + k * c->o->chunk_elems, chunk_n(c, k), op, NULL, err, sizeof(err));
		if (rc) {
			fprintf(stderr, "gradgate-bench datapath: decoding chunk %zu: %s\n", k, err);
			return rc;
		}
	}
	return 0;
}

static int pass_decode(struct ctx *c)
{
	return decode_pass(c, GG_FRAME_STORE);
}

static int pass_decode_acc(struct ctx *c)
{
	return decode_pass(c, GG_FRAME_ACCUMULATE);
}

struct pass {
	const char *name;
	const char *what;
	int (*run)(struct ctx *c);
	bool lossy_only;   /* run for a lossy codec only */
	bool ranks_only;   /* run where a site has more than one rank */
	double seconds;
};

static bool pass_runs(const struct pass *p, const struct opts *o)
{
	return (!p->lossy_only || gg_codec_is_lossy(o->codec)) && (!p->ranks_only || o->ranks > 1);
}

/* ---- main ------------------------------------------------------------------ */

static float gaussian(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	z ^= z >> 31;
	double u1 = ((double)(z >> 11) + 0.5) / 9007199254740992.0, u2 = (double)(z & 0x7ff) / 2048.0;
	return (float)(1e-3 * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static int setup(struct ctx *c, const struct opts *o)
{
	uint64_t seed = 1, bound;
	struct gg_frame_config fc = { .codec = gg_codec_defaults(o->codec), .max_elems = o->chunk_elems };
	struct gg_frame_limits lim = { .max_elems = o->chunk_elems };
	int rc;

	memset(c, 0, sizeof(*c));
	c->o = o;
	c->nchunks = (size_t)((o->count + o->chunk_elems - 1) / o->chunk_elems);
	if ((rc = gg_frame_bound(&fc.codec, o->chunk_elems, &bound)))
		return rc;
	c->frame_cap = (size_t)bound;
	lim.max_raw_bytes = (size_t)bound;
	for (unsigned r = 0; r < GG_MAX(o->ranks, 2u); r++) {
		if (!(c->x[r] = malloc(o->count * sizeof(float))))
			return -ENOMEM;
		for (uint64_t i = 0; i < o->count; i++)
			c->x[r][i] = gaussian(&seed);
	}
	c->result = malloc(o->count * sizeof(float));
	c->frames = malloc(c->nchunks * c->frame_cap);
	c->frame_len = calloc(c->nchunks, sizeof(size_t));
	c->sealed = malloc(c->nchunks * (c->frame_cap + (c->frame_cap / TLS_RECORD + 1) * TLS_TAG));
	c->seal = EVP_CIPHER_CTX_new();
	c->open = EVP_CIPHER_CTX_new();
	if (!c->result || !c->frames || !c->frame_len || !c->sealed || !c->seal || !c->open)
		return -ENOMEM;
	memset(c->result, 0, o->count * sizeof(float));
	if (!EVP_EncryptInit_ex(c->seal, EVP_aes_256_gcm(), NULL, NULL, NULL) ||
	    !EVP_DecryptInit_ex(c->open, EVP_aes_256_gcm(), NULL, NULL, NULL))
		return -EIO;
	if ((rc = gg_frame_encoder_init(&c->enc, &fc)) || (rc = gg_frame_decoder_init(&c->dec, &lim)))
		return rc;
	if (gg_codec_is_lossy(o->codec) && (rc = gg_feedback_init(&c->fb, o->count, o->chunk_elems)))
		return rc;
	return 0;
}

static void teardown(struct ctx *c)
{
	for (unsigned r = 0; r < 8; r++)
		free(c->x[r]);
	free(c->result);
	free(c->frames);
	free(c->frame_len);
	free(c->sealed);
	EVP_CIPHER_CTX_free(c->seal);
	EVP_CIPHER_CTX_free(c->open);
	gg_frame_encoder_fini(&c->enc);
	gg_frame_decoder_fini(&c->dec);
	if (gg_codec_is_lossy(c->o->codec))
		gg_feedback_fini(&c->fb);
}

int gg_bench_datapath_main(int argc, char **argv)
{
	struct opts o;
	struct ctx c;
	int rc = parse(argc, argv, &o);

	if (rc >= 0)
		return rc;
	struct pass passes[] = {
		{ .name = "client copy", .what = "a rank's tensor to or from the gateway, without shared buffers",
		  .run = pass_client_copy },
		{ .name = "site sum", .what = "the ranks' tensors summed in place in rank 0's", .run = pass_site_sum,
		  .ranks_only = true },
		{ .name = "encode", .what = "codec, frame header and CRC-32C into the frame", .run = pass_encode },
		{ .name = "encode+feedback", .what = "the same with error feedback (compensate, encode, decode, residual)",
		  .run = pass_encode_feedback, .lossy_only = true },
		{ .name = "TLS seal", .what = "frames to AES-256-GCM records, one pass", .run = pass_seal },
		{ .name = "TLS open", .what = "records to frames, tags checked, one pass", .run = pass_open },
		{ .name = "decode", .what = "CRC-32C and codec, stored into the result", .run = pass_decode },
		{ .name = "decode+add", .what = "the same, added to the result", .run = pass_decode_acc },
		{ .name = "result copy", .what = "the result into one more rank's tensor", .run = pass_client_copy },
	};
	const size_t npasses = sizeof(passes) / sizeof(passes[0]);

	if ((rc = setup(&c, &o))) {
		fprintf(stderr, "gradgate-bench datapath: cannot set up %llu elements: %s\n",
			(unsigned long long)o.count, strerror(-rc));
		teardown(&c);
		return 1;
	}
	/* Frames exist before TLS and decode passes run, whatever the order. */
	if ((rc = pass_encode(&c)) || (rc = pass_seal(&c))) {
		teardown(&c);
		return 1;
	}
	for (int rep = 0; rep < o.reps; rep++) {
		for (size_t i = 0; i < npasses; i++) {
			struct pass *p = &passes[i];
			if (!pass_runs(p, &o))
				continue;
			double t0 = now_s();
			if ((rc = p->run(&c))) {
				fprintf(stderr, "gradgate-bench datapath: %s failed: %s\n", p->name, strerror(-rc));
				teardown(&c);
				return 1;
			}
			double t = now_s() - t0;
			if (rep == 0 || t < p->seconds)
				p->seconds = t;
			if (p->run == pass_encode_feedback) /* the frames stay plain encodings for TLS and decode */
				(void)pass_encode(&c);
		}
	}
	size_t encoded = 0;
	for (size_t k = 0; k < c.nchunks; k++)
		encoded += c.frame_len[k];
	const double fp32_bytes = (double)o.count * 4.0, step_ms_per_s = 1e3;
	const unsigned K = o.sites, R = o.ranks;
	if (!o.json) {
		printf("gradgate-bench datapath: %llu float32 (%.0f MiB) per step, %s (frames %.1f%% of fp32), "
		       "%llu-element chunks, %s kernels, one core\n",
		       (unsigned long long)o.count, fp32_bytes / 1048576.0, gg_codec_name(o.codec),
		       100.0 * (double)encoded / fp32_bytes, (unsigned long long)o.chunk_elems, gg_isa_name(gg_codec_isa()));
		printf("%-16s %9s %12s  %s\n", "pass", "GB/s", "ms per step", "what");
	}
	for (size_t i = 0; i < npasses; i++) {
		const struct pass *p = &passes[i];
		if (!pass_runs(p, &o))
			continue;
		double gbps = fp32_bytes / p->seconds / 1e9, ms = p->seconds * step_ms_per_s;
		if (o.json)
			printf("{\"pass\":\"%s\",\"codec\":\"%s\",\"count\":%llu,\"fp32_gbps\":%.3f,\"ms_per_step\":%.3f}\n",
			       p->name, gg_codec_name(o.codec), (unsigned long long)o.count, gbps, ms);
		else
			printf("%-16s %9.2f %12.2f  %s\n", p->name, gbps, ms, p->what);
	}
	/* One site of a direct step: R-1 adds of the site sum, its own chunks
	 * encoded once, sealed to each of K-1 peers, K-1 frames opened, K
	 * frames decoded into the result (its own too, in site order), the
	 * result copied to R-1 more ranks. */
	const struct pass *sum = &passes[1], *enc = gg_codec_is_lossy(o.codec) ? &passes[3] : &passes[2];
	double site_s = (R > 1 ? sum->seconds : 0) + enc->seconds + (K - 1) * passes[4].seconds +
			(K - 1) * passes[5].seconds + passes[6].seconds + (K - 1) * passes[7].seconds +
			(R - 1) * passes[8].seconds;
	if (o.json)
		printf("{\"sum\":\"direct step, one site\",\"sites\":%u,\"ranks\":%u,\"cpu_ms_per_step\":%.3f,"
		       "\"fp32_gbps_per_core\":%.3f}\n",
		       K, R, site_s * 1e3, fp32_bytes / site_s / 1e9);
	else
		printf("one site of a direct step, %u sites x %u ranks, shared buffers: %.1f ms of one core "
		       "(%.2f GB/s of fp32 per core), plus the kernel's socket copies\n",
		       K, R, site_s * 1e3, fp32_bytes / site_s / 1e9);
	teardown(&c);
	return 0;
}
