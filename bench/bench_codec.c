/* gradgate-bench codec: ratio, speed and error of every codec on synthetic
 * gradient-like data or a raw fp32 file, one core. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "bench.h"
#include "codec.h"
#include "crc32c.h"
#include "frame.h"
#include "gg_common.h"
#include "units.h"

enum data_kind { DATA_GAUSSIAN, DATA_HEAVY, DATA_OUTLIERS };
static const char *const data_names[] = { "gaussian", "heavy", "outliers" };

struct opts {
	bool json;
	uint64_t size_bytes;
	const char *file;
	bool codecs[GG_CODEC_LAST + 1];
	bool kinds[3];
	bool zstd;
	int level;
	uint32_t block_elems;
	enum gg_scale_kind scale;
	uint64_t chunk_bytes;
	int reps;
	uint64_t seed;
};

struct result {
	double ratio, zstd_frac;
	double encode_gbps, decode_gbps, decode_acc_gbps, frame_encode_gbps, frame_decode_acc_gbps;
	double max_err_rel, rms_err_rel;
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: gradgate-bench codec [options]\n"
		"  --json            one JSON object per line (codec x data, then one per CRC-32C path)\n"
		"                    instead of a table\n"
		"  --size SIZE       fp32 bytes of synthetic data per kind, up to 4GiB (default 64MiB)\n"
		"  --file PATH       measure a raw little-endian fp32 file instead\n"
		"  --data LIST       synthetic kinds: gaussian,heavy,outliers (default all)\n"
		"  --codec LIST      codecs, comma-separated or repeated (default all: %s)\n"
		"  --level N         zstd level, 1 to 19 as the config's zstd_level (default %d); --no-zstd\n"
		"                    turns the stage off (the config's zstd_level = 0)\n"
		"  --block N         int8/int4 block size in elements (default %u)\n"
		"  --scale fp32|fp16 int8/int4 scale format (default fp32)\n"
		"  --chunk SIZE      fp32 bytes per frame, 4KiB to 64MiB as chunk_size (default 1MiB)\n"
		"  --reps N          repetitions, the best is kept (default 5)\n"
		"  --threads 1       cores to use (one: the figures are per core)\n"
		"  --seed N          synthetic data seed (default 1)\n"
		"GB/s count fp32 input bytes. Errors are relative to the input's RMS.\n"
		"GG_CODEC_ISA=scalar|avx2|avx512 caps the kernels.\n",
		gg_codec_names(), GG_ZSTD_DEFAULT_LEVEL, GG_CODEC_DEFAULT_BLOCK_ELEMS);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng_state;

static uint64_t rng_next(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static double rng_unit(void)
{
	return ((double)(rng_next() >> 11) + 0.5) * 0x1p-53;
}

static double rng_normal(void)
{
	return sqrt(-2.0 * log(rng_unit())) * cos(6.283185307179586 * rng_unit());
}

static void synthesize(float *x, size_t n, enum data_kind kind)
{
	for (size_t i = 0; i < n; i++) {
		double v = rng_normal();
		if (kind == DATA_HEAVY) { /* Student-t, 3 degrees of freedom */
			double c = 0;
			for (int k = 0; k < 3; k++) {
				double g = rng_normal();
				c += g * g;
			}
			v /= sqrt(c / 3);
		} else if (kind == DATA_OUTLIERS && rng_next() % 1000 == 0) {
			v *= 100;
		}
		x[i] = (float)(1e-3 * v);
	}
}

/* 0, or the exit status: 2 for a --file that names no file of values, 1
 * where reading it failed. */
static int load_file(const char *path, float **out, size_t *n)
{
	FILE *f = fopen(path, "rb");
	struct stat st;
	if (!f) {
		int e = errno;
		fprintf(stderr, "gradgate-bench codec: --file %s: %s\n", path, strerror(e));
		return e == ENOENT || e == ENOTDIR || e == EACCES || e == EISDIR ? 2 : 1;
	}
	if (fstat(fileno(f), &st)) {
		fprintf(stderr, "gradgate-bench codec: %s: %s\n", path, strerror(errno));
		fclose(f);
		return 1;
	}
	if (!S_ISREG(st.st_mode)) {
		fprintf(stderr, "gradgate-bench codec: --file %s: %s\n", path,
			S_ISDIR(st.st_mode) ? "is a folder, not a file of fp32 values" : "is not a regular file");
		fclose(f);
		return 2;
	}
	if (fseek(f, 0, SEEK_END) || ftell(f) < 0) {
		fprintf(stderr, "gradgate-bench codec: %s: cannot tell its size\n", path);
		fclose(f);
		return 1;
	}
	long bytes = ftell(f);
	rewind(f);
	if (bytes % 4)
		fprintf(stderr, "gradgate-bench codec: %s: ignoring %ld trailing bytes (not a whole fp32)\n", path,
			bytes % 4);
	*n = (size_t)bytes / 4;
	*out = malloc(*n ? *n * sizeof(float) : 1);
	if (!*out || fread(*out, sizeof(float), *n, f) != *n) {
		fprintf(stderr, "gradgate-bench codec: %s: %s\n", path, *out ? "short read" : "out of memory");
		fclose(f);
		return 1;
	}
	fclose(f);
	if (*n == 0) {
		fprintf(stderr, "gradgate-bench codec: --file %s: no fp32 values\n", path);
		return 2;
	}
	return 0;
}

struct bufs {
	const float *x;
	size_t n, chunk_elems, nchunks;
	uint8_t *enc;   /* codec bytes, chunk after chunk at enc_stride */
	size_t enc_stride;
	uint8_t *frames; /* one frame per chunk at frame_stride */
	size_t frame_stride;
	size_t *frame_bytes;
	float *dec, *acc;
};

static size_t chunk_len(const struct bufs *b, size_t c)
{
	return GG_MIN(b->chunk_elems, b->n - c * b->chunk_elems);
}

#define BEST_OF(reps, best, body)                         \
	do {                                              \
		best = INFINITY;                          \
		for (int rep_ = 0; rep_ < (reps); rep_++) { \
			double t0_ = now_s();             \
			body;                             \
			double dt_ = now_s() - t0_;       \
			if (dt_ < best)                   \
				best = dt_;               \
		}                                         \
	} while (0)

static int measure(const struct opts *o, const struct gg_codec_params *p, struct bufs *b, struct result *res)
{
	struct gg_frame_config cfg = { .codec = *p, .zstd = o->zstd, .zstd_level = o->level,
				       .max_elems = b->chunk_elems };
	struct gg_frame_limits lim = { b->chunk_elems, 0 };
	struct gg_frame_encoder enc;
	struct gg_frame_decoder dec;
	uint64_t raw, bound;
	double t, gb = (double)b->n * sizeof(float) / 1e9;
	int rc = 0;
	char err[256];

	if (gg_codec_encoded_bytes(p, b->chunk_elems, &raw) || gg_frame_bound(p, b->chunk_elems, &bound)) {
		fprintf(stderr, "gradgate-bench codec: chunk too large for one frame\n");
		return -1;
	}
	lim.max_raw_bytes = raw;
	if (gg_frame_encoder_init(&enc, &cfg) || gg_frame_decoder_init(&dec, &lim)) {
		fprintf(stderr, "gradgate-bench codec: cannot set up %s frames (zstd level %d?)\n",
			gg_codec_name(p->codec), o->level);
		return -1;
	}

	/* codec kernels alone */
	BEST_OF(o->reps, t, {
		for (size_t c = 0; c < b->nchunks; c++)
			rc |= gg_codec_encode(p, b->x + c * b->chunk_elems, chunk_len(b, c), b->enc + c * b->enc_stride,
					      b->enc_stride);
	});
	res->encode_gbps = gb / t;
	BEST_OF(o->reps, t, {
		for (size_t c = 0; c < b->nchunks; c++) {
			uint64_t nb;
			rc |= gg_codec_encoded_bytes(p, chunk_len(b, c), &nb);
			rc |= gg_codec_decode(p, b->enc + c * b->enc_stride, nb, chunk_len(b, c),
					      b->dec + c * b->chunk_elems);
		}
	});
	res->decode_gbps = gb / t;
	memset(b->acc, 0, b->n * sizeof(float));
	BEST_OF(o->reps, t, {
		for (size_t c = 0; c < b->nchunks; c++) {
			uint64_t nb;
			rc |= gg_codec_encoded_bytes(p, chunk_len(b, c), &nb);
			rc |= gg_codec_decode_acc(p, b->enc + c * b->enc_stride, nb, chunk_len(b, c),
						  b->acc + c * b->chunk_elems);
		}
	});
	res->decode_acc_gbps = gb / t;

	/* whole frames: codec + checksum + zstd stage */
	size_t total = 0, zchunks = 0;
	BEST_OF(o->reps, t, {
		total = 0;
		zchunks = 0;
		for (size_t c = 0; c < b->nchunks; c++) {
			uint8_t *f = b->frames + c * b->frame_stride;
			rc |= gg_frame_encode(&enc, b->x + c * b->chunk_elems, chunk_len(b, c), f, b->frame_stride,
					      &b->frame_bytes[c]);
			total += b->frame_bytes[c];
			zchunks += (f[6] & GG_FRAME_FLAG_ZSTD) != 0;
		}
	});
	res->frame_encode_gbps = gb / t;
	res->ratio = gb * 1e9 / (double)total;
	res->zstd_frac = (double)zchunks / (double)b->nchunks;
	BEST_OF(o->reps, t, {
		for (size_t c = 0; c < b->nchunks; c++) {
			if (gg_frame_decode(&dec, b->frames + c * b->frame_stride, b->frame_bytes[c],
					    b->acc + c * b->chunk_elems, chunk_len(b, c), GG_FRAME_ACCUMULATE, NULL, err,
					    sizeof(err))) {
				fprintf(stderr, "gradgate-bench codec: %s\n", err);
				rc = -1;
				break;
			}
		}
	});
	res->frame_decode_acc_gbps = gb / t;
	gg_frame_encoder_fini(&enc);
	gg_frame_decoder_fini(&dec);
	if (rc) {
		fprintf(stderr, "gradgate-bench codec: %s failed\n", gg_codec_name(p->codec));
		return -1;
	}

	/* error of one decode against the input, over finite inputs */
	double ss = 0, es = 0, emax = 0;
	size_t finite = 0;
	for (size_t i = 0; i < b->n; i++) {
		if (!isfinite(b->x[i]))
			continue;
		double e = fabs((double)b->dec[i] - (double)b->x[i]);
		ss += (double)b->x[i] * b->x[i];
		es += e * e;
		emax = isnan(e) || e > emax ? e : emax;
		finite++;
	}
	double rms = finite ? sqrt(ss / (double)finite) : 0;
	res->max_err_rel = rms > 0 ? emax / rms : 0;
	res->rms_err_rel = rms > 0 ? sqrt(es / (double)finite) / rms : 0;
	return 0;
}

static void print_header(void)
{
	printf("%-10s %-9s %7s %9s %9s %9s %10s %10s %5s %10s %10s\n", "codec", "data", "ratio", "enc GB/s",
	       "dec GB/s", "acc GB/s", "frame enc", "frame acc", "zstd", "max err", "rms err");
}

static void print_row(const struct opts *o, const char *codec, const char *data, const struct gg_codec_params *p,
		      size_t n, const struct result *r)
{
	if (!o->json) {
		printf("%-10s %-9s %6.2fx %9.2f %9.2f %9.2f %10.2f %10.2f %4.0f%% %10.3g %10.3g\n", codec, data,
		       r->ratio, r->encode_gbps, r->decode_gbps, r->decode_acc_gbps, r->frame_encode_gbps,
		       r->frame_decode_acc_gbps, 100 * r->zstd_frac, r->max_err_rel, r->rms_err_rel);
		return;
	}
	printf("{\"codec\":\"%s\",\"data\":\"%s\",\"elems\":%zu,\"chunk_bytes\":%llu,\"zstd_level\":%d,"
	       "\"block\":%u,\"scale\":\"%s\",\"isa\":\"%s\",\"ratio\":%.4f,\"encode_gbps\":%.3f,"
	       "\"decode_gbps\":%.3f,\"decode_acc_gbps\":%.3f,\"frame_encode_gbps\":%.3f,"
	       "\"frame_decode_acc_gbps\":%.3f,\"zstd_chunk_frac\":%.3f,\"max_err_rel\":%.6g,\"rms_err_rel\":%.6g}\n",
	       codec, data, n, (unsigned long long)o->chunk_bytes, o->zstd ? o->level : 0, p->block_elems,
	       p->scale == GG_SCALE_F16 ? "fp16" : "fp32", gg_isa_name(gg_codec_isa()), r->ratio, r->encode_gbps,
	       r->decode_gbps, r->decode_acc_gbps, r->frame_encode_gbps, r->frame_decode_acc_gbps, r->zstd_frac,
	       r->max_err_rel, r->rms_err_rel);
}

/* A comma list of names for option `opt` (what its items are: `what`). */
static int parse_list(const char *opt, const char *arg, bool *set, int first, int last, const char *(*name)(int),
		      const char *what)
{
	char buf[256];
	if (strlen(arg) >= sizeof(buf)) {
		fprintf(stderr, "gradgate-bench codec: %s: %s list too long\n", opt, what);
		return -1;
	}
	if (!*arg || arg[0] == ',' || arg[strlen(arg) - 1] == ',' || strstr(arg, ",,")) {
		fprintf(stderr, "gradgate-bench codec: %s '%s': an empty item in the %s list (names separated by "
			"commas)\n", opt, arg, what);
		return -1;
	}
	strcpy(buf, arg);
	for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		int found = -1;
		for (int i = first; i <= last; i++)
			if (name(i) && !strcmp(tok, name(i)))
				found = i;
		if (found < 0) {
			char known[160] = "";
			size_t n = 0;
			for (int i = first; i <= last; i++)
				if (name(i) && n < sizeof(known))
					n += (size_t)snprintf(known + n, sizeof(known) - n, "%s%s", n ? ", " : "", name(i));
			fprintf(stderr, "gradgate-bench codec: %s %s: unknown %s '%s' (known: %s)\n", opt, arg, what, tok,
				known);
			return -1;
		}
		set[found] = true;
	}
	return 0;
}

static const char *codec_name_i(int i)
{
	return gg_codec_name((enum gg_codec)i);
}

static const char *data_name_i(int i)
{
	return i >= 0 && i < 3 ? data_names[i] : NULL;
}

static int parse_uint(const char *opt, const char *arg, unsigned long long max, unsigned long long *v)
{
	char *end;
	errno = 0;
	*v = strtoull(arg, &end, 10);
	if (errno || end == arg || *end || *v > max || arg[0] == '-') {
		fprintf(stderr, "gradgate-bench codec: %s wants a number up to %llu, got '%s'\n", opt, max, arg);
		return -1;
	}
	return 0;
}

static int parse_opts(int argc, char **argv, struct opts *o)
{
	bool any_codec = false, any_kind = false, level_given = false;

	*o = (struct opts){ .size_bytes = 64ull << 20, .zstd = true, .level = GG_ZSTD_DEFAULT_LEVEL,
			    .block_elems = GG_CODEC_DEFAULT_BLOCK_ELEMS, .scale = GG_SCALE_F32,
			    .chunk_bytes = 1ull << 20, .reps = 5, .seed = 1 };
	static const char *const valued[] = { "--size", "--chunk", "--file", "--codec", "--data", "--level",
					      "--block", "--scale", "--reps", "--threads", "--seed" };
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		unsigned long long u;
		long long n;
		bool takes = false;
		for (size_t k = 0; k < GG_ARRAY_LEN(valued); k++)
			takes |= !strcmp(a, valued[k]);
		if (!takes && strcmp(a, "--json") && strcmp(a, "--no-zstd") && strcmp(a, "--help") && strcmp(a, "-h")) {
			fprintf(stderr, "gradgate-bench codec: unknown %s '%s' (see --help)\n", a[0] == '-' ? "option" : "argument",
				a);
			return -1;
		}
		if (takes && !v) {
			fprintf(stderr, "gradgate-bench codec: %s needs a value\n", a);
			return -1;
		}
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			usage(stdout);
			exit(0);
		} else if (!strcmp(a, "--json")) {
			o->json = true;
		} else if (!strcmp(a, "--no-zstd")) {
			o->zstd = false;
		} else if (!strcmp(a, "--size") || !strcmp(a, "--chunk")) {
			/* Data up to 4 GiB per kind; chunks as [transport] chunk_size. */
			bool size = a[2] == 's';
			if (gg_bench_size("codec", a, v, size ? sizeof(float) : 4u << 10, size ? 4ull << 30 : 64u << 20,
					  sizeof(float), size ? &o->size_bytes : &o->chunk_bytes))
				return -1;
		} else if (!strcmp(a, "--file")) {
			o->file = v;
		} else if (!strcmp(a, "--codec")) {
			if (parse_list(a, v, o->codecs, GG_CODEC_FIRST, GG_CODEC_LAST, codec_name_i, "codec"))
				return -1;
			any_codec = true;
		} else if (!strcmp(a, "--data")) {
			if (parse_list(a, v, o->kinds, 0, 2, data_name_i, "data kind"))
				return -1;
			any_kind = true;
		} else if (!strcmp(a, "--level")) {
			char *end;
			long l = strtol(v, &end, 10);
			if (*end || end == v || l < 1 || l > 19) {
				fprintf(stderr, "gradgate-bench codec: --level wants 1 to 19, as [compression] zstd_level "
					"(whose 0, no zstd stage, is --no-zstd here), got '%s'\n", v);
				return -1;
			}
			o->level = (int)l;
			level_given = true;
		} else if (!strcmp(a, "--block")) {
			if (parse_uint(a, v, GG_CODEC_MAX_BLOCK_ELEMS, &u))
				return -1;
			o->block_elems = (uint32_t)u;
		} else if (!strcmp(a, "--scale")) {
			if (strcmp(v, "fp32") && strcmp(v, "fp16")) {
				fprintf(stderr, "gradgate-bench codec: --scale wants fp32 or fp16, got '%s'\n", v);
				return -1;
			}
			o->scale = strcmp(v, "fp16") ? GG_SCALE_F32 : GG_SCALE_F16;
		} else if (!strcmp(a, "--reps")) {
			if (gg_bench_number("codec", a, v, 1, 1000, &n))
				return -1;
			o->reps = (int)n;
		} else if (!strcmp(a, "--threads")) {
			if (strcmp(v, "1")) {
				fprintf(stderr, "gradgate-bench codec: --threads: only 1 is supported (figures are per core), "
						"not '%s'\n", v);
				return -1;
			}
		} else if (!strcmp(a, "--seed")) {
			if (parse_uint(a, v, UINT64_MAX, &u))
				return -1;
			o->seed = u;
		}
		if (takes)
			i++;
	}
	if (level_given && !o->zstd) {
		fprintf(stderr, "gradgate-bench codec: --level and --no-zstd contradict each other: --level is the "
			"zstd stage's\n");
		return -1;
	}
	if (!any_codec)
		for (int c = GG_CODEC_FIRST; c <= GG_CODEC_LAST; c++)
			o->codecs[c] = true;
	if (!any_kind)
		for (int k = 0; k < 3; k++)
			o->kinds[k] = true;
	struct gg_codec_params p = { GG_CODEC_INT8, o->block_elems, o->scale };
	const char *why;
	if (gg_codec_params_check(&p, &why)) {
		fprintf(stderr, "gradgate-bench codec: --block %u: %s\n", o->block_elems, why);
		return -1;
	}
	return 0;
}

static int run_data(const struct opts *o, const float *x, size_t n, const char *data_name)
{
	struct bufs b = { .x = x, .n = n };
	b.chunk_elems = GG_MAX((size_t)1, GG_MIN((size_t)(o->chunk_bytes / sizeof(float)), n));
	b.nchunks = n / b.chunk_elems + (n % b.chunk_elems != 0);
	/* the largest encoding of a chunk is fp32's */
	b.enc_stride = b.chunk_elems * sizeof(float) + 64;
	b.frame_stride = b.enc_stride + GG_FRAME_HEADER_BYTES;
	b.enc = malloc(b.nchunks * b.enc_stride);
	b.frames = malloc(b.nchunks * b.frame_stride);
	b.frame_bytes = calloc(b.nchunks, sizeof(size_t));
	b.dec = malloc(n * sizeof(float));
	b.acc = malloc(n * sizeof(float));
	int rc = 0;
	if (!b.enc || !b.frames || !b.frame_bytes || !b.dec || !b.acc) {
		fprintf(stderr, "gradgate-bench codec: out of memory for %zu elements\n", n);
		rc = -1;
	} else { /* fault the pages in before anything is timed */
		memset(b.enc, 0, b.nchunks * b.enc_stride);
		memset(b.frames, 0, b.nchunks * b.frame_stride);
		memset(b.dec, 0, n * sizeof(float));
		memset(b.acc, 0, n * sizeof(float));
	}
	for (int c = GG_CODEC_FIRST; !rc && c <= GG_CODEC_LAST; c++) {
		if (!o->codecs[c])
			continue;
		struct gg_codec_params p = gg_codec_defaults((enum gg_codec)c);
		if (gg_codec_has_blocks(p.codec)) {
			p.block_elems = o->block_elems;
			p.scale = o->scale;
		}
		struct result r;
		rc = measure(o, &p, &b, &r);
		if (!rc)
			print_row(o, gg_codec_name(p.codec), data_name, &p, n, &r);
		fflush(stdout);
	}
	free(b.enc);
	free(b.frames);
	free(b.frame_bytes);
	free(b.dec);
	free(b.acc);
	return rc;
}

/* The frame checksum, which every frame costs twice (made and checked):
 * each CRC-32C path this CPU has, over the data in frame-sized pieces. */
static void run_crc(const struct opts *o, const float *x, size_t n)
{
	const struct gg_crc32c_impl *impls;
	size_t count = gg_crc32c_impls(&impls), bytes = n * sizeof(float);
	size_t piece = (size_t)GG_MIN(o->chunk_bytes, (uint64_t)bytes);
	volatile uint32_t sink = 0;

	if (!bytes)
		return;
	for (size_t i = 0; i < count; i++) {
		double best;
		BEST_OF(o->reps, best, {
			for (size_t off = 0; off < bytes; off += piece)
				sink ^= impls[i].fn(0, (const uint8_t *)x + off, GG_MIN(piece, bytes - off));
		});
		double gbps = (double)bytes / best / 1e9;
		if (o->json)
			printf("{\"checksum\":\"crc32c\",\"impl\":\"%s\",\"piece_bytes\":%zu,\"gb_per_s\":%.3f,"
			       "\"used\":%s}\n", impls[i].name, piece, gbps, i + 1 == count ? "true" : "false");
		else
			printf("crc32c %-26s %8.2f GB/s%s\n", impls[i].name, gbps, i + 1 == count ? "  (used)" : "");
	}
	(void)sink;
}

int gg_bench_codec_main(int argc, char **argv)
{
	struct opts o;
	int rc = 0;

	if (parse_opts(argc, argv, &o))
		return 2;
	float *x = NULL;
	size_t n = 0;
	if (o.file && (rc = load_file(o.file, &x, &n))) /* before the banner, which would promise figures */
		return rc;
	if (!o.json) {
		char sz[32], ch[32], lv[16] = "off";
		if (o.zstd)
			snprintf(lv, sizeof(lv), "level %d", o.level);
		printf("codec benchmark: %s kernels, %s per frame, zstd %s, block %u, %s scales, best of %d, one core\n",
		       gg_isa_name(gg_codec_isa()), gg_format_size(o.chunk_bytes, ch, sizeof(ch)), lv, o.block_elems,
		       o.scale == GG_SCALE_F16 ? "fp16" : "fp32", o.reps);
		if (!o.file)
			printf("data: %s of fp32 per kind\n", gg_format_size(o.size_bytes, sz, sizeof(sz)));
		print_header();
	}
	if (o.file) {
		const char *base = strrchr(o.file, '/');
		rc = run_data(&o, x, n, base ? base + 1 : o.file);
		if (!rc)
			run_crc(&o, x, n);
		free(x);
		return rc ? 1 : 0;
	}
	n = (size_t)(o.size_bytes / sizeof(float));
	x = malloc(n * sizeof(float));
	if (!x) {
		fprintf(stderr, "gradgate-bench codec: out of memory for %zu elements\n", n);
		return 1;
	}
	for (int k = 0; !rc && k < 3; k++) {
		if (!o.kinds[k])
			continue;
		rng_state = o.seed + (uint64_t)k * 0x632be59bd9b4e019ull; /* each kind's data whatever else runs */
		synthesize(x, n, (enum data_kind)k);
		rc = run_data(&o, x, n, data_names[k]);
	}
	if (!rc)
		run_crc(&o, x, n);
	free(x);
	return rc ? 1 : 0;
}
