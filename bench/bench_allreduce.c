/* gradgate-bench allreduce: one training rank's all-reduce loop through
 * its site's running gateway. Every rank of every site derives its input
 * from (site, rank, step, element), so each can check the result against
 * the exact global sum without talking to the others: exactly for lossless
 * codecs, within the codec's bound for lossy ones. A digest of every
 * result lets a script confirm that all ranks of all sites got the same
 * bytes.
 *
 * --data gaussian gives each rank random normal values instead, made once
 * and sent at every step: real-valued data that zstd cannot shrink more
 * than real gradients. Their exact sum is not a float, so the check allows
 * fp32 rounding on top of the codec's bound, and each rank checks its own
 * share of the elements, since making every rank's input costs more than
 * the step; the digests show every rank holds the same bytes. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>

#include "bench.h"
#include "codec.h"
#include "control_conn.h"
#include "control_proto.h"
#include "gg_common.h"
#include "gradgate.h"

#define GG_BENCH_MAX_INFLIGHT 8 /* the most a gateway allows (GG_CTRL_MAX_INFLIGHT) */
#define GG_BENCH_MAX_RANKS 4096   /* ranks of a job at one site (gg_session_open) */
#define GG_BENCH_MAX_SITES 8      /* sites of a mesh ([[peers]]: 7 at most) */

struct opts {
	const char *endpoint;
	const char *job;
	int rank, ranks, site, sites;
	size_t count;
	int steps;
	int inflight;      /* steps started before the oldest is waited for */
	const char *codec; /* what the gateways use: sets the check's bound */
	int warmup;        /* untimed steps before the timed ones */
	enum { DATA_GRID, DATA_GAUSSIAN } data;
	enum { CHECK_ALL, CHECK_FIRST, CHECK_NONE } check;
	bool shared;       /* tensors in shared buffers (gg_buffer_alloc): no copies */
	int timeout_ms;    /* each step's deadline; <= 0: the gateway's step_timeout */
	int timeout_step;  /* only this step's, when > 0 */
	int mismatch_step; /* announce one element more at this step (a fault) */
	int late_step;     /* sleep late_ms before announcing this step (a fault) */
	int late_ms;
	bool per_step;     /* a line per step: its outcome and result digest */
	bool no_refill;    /* later steps all-reduce what the step before left */
	bool json;
};

/* Multiples of 1/64 in [-32, 32): every sum of up to 2^12 of them is exact
 * in fp32, so lossless results can be compared bit for bit. */
static float input_value(int site, int rank, int step, size_t i)
{
	uint64_t h = (uint64_t)i * 0x9e3779b97f4a7c15ull ^ (uint64_t)(site * 131 + rank) * 0xbf58476d1ce4e5b9ull ^
		     (uint64_t)step * 0x94d049bb133111ebull;
	h ^= h >> 31;
	return (float)((int)(h % 4096) - 2048) / 64.0f;
}

static uint64_t mix64(uint64_t x)
{
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* Elements [from, to) of the random normal input of (site, rank): a
 * counter-based hash gives each pair of elements two uniforms and
 * Box-Muller two normals, so any part of any rank's input can be made on
 * its own. */
static void gaussian_fill(float *out, int site, int rank, size_t from, size_t to)
{
	uint64_t seed = mix64(0x6761757373ull ^ (uint64_t)site << 32 ^ (uint64_t)rank);

	for (size_t p = from / 2; 2 * p < to; p++) {
		double u1 = (double)((mix64(seed + 2 * p) >> 11) + 1) * 0x1p-53; /* (0, 1] */
		double u2 = (double)(mix64(seed + 2 * p + 1) >> 11) * 0x1p-53;
		double r = sqrt(-2.0 * log(u1)), a = 2.0 * M_PI * u2;
		if (2 * p >= from)
			out[2 * p - from] = (float)(r * cos(a));
		if (2 * p + 1 >= from && 2 * p + 1 < to)
			out[2 * p + 1 - from] = (float)(r * sin(a));
	}
}

/* The float64 reference of elements [lo, hi) for Gaussian inputs. */
struct gauss_ref {
	size_t lo, hi;
	double *sum;  /* exact enough: the float64 sum of the float inputs */
	double *mag;  /* sum of |input|, for the fp32 rounding bound */
	double gmax;  /* largest sum of |site sum| within a block of any element here */
};

#define GG_BENCH_BLOCK_MAX 65536 /* the largest int8/int4 block (GG_CODEC_MAX_BLOCK_ELEMS) */

/* This rank's share of the elements; gmax looks one largest block further
 * on each side, so it covers every block that holds an element of it. */
static int gauss_ref_make(const struct opts *o, struct gauss_ref *g)
{
	size_t me = (size_t)o->site * (size_t)o->ranks + (size_t)o->rank, n = (size_t)o->sites * (size_t)o->ranks;
	g->lo = o->count * me / n;
	g->hi = o->count * (me + 1) / n;
	size_t xlo = g->lo > GG_BENCH_BLOCK_MAX ? g->lo - GG_BENCH_BLOCK_MAX : 0;
	size_t xhi = GG_MIN(g->hi + GG_BENCH_BLOCK_MAX, o->count), len = xhi - xlo;
	float *x = malloc(len * sizeof(float));
	double *site_sum = malloc(len * sizeof(double)), *site_abs = calloc(len, sizeof(double));
	g->sum = calloc(len, sizeof(double));
	g->mag = calloc(len, sizeof(double));
	int rc = x && site_sum && site_abs && g->sum && g->mag ? 0 : -ENOMEM;

	for (int k = 0; k < o->sites && !rc; k++) {
		memset(site_sum, 0, len * sizeof(double));
		for (int r = 0; r < o->ranks; r++) {
			gaussian_fill(x, k, r, xlo, xhi);
			for (size_t i = 0; i < len; i++) {
				site_sum[i] += x[i];
				g->mag[i] += fabs((double)x[i]);
			}
		}
		for (size_t i = 0; i < len; i++) {
			g->sum[i] += site_sum[i];
			site_abs[i] += fabs(site_sum[i]);
		}
	}
	g->gmax = 0;
	for (size_t i = 0; i < len && !rc; i++)
		g->gmax = fmax(g->gmax, site_abs[i]);
	if (!rc) { /* keep [lo, hi) only */
		memmove(g->sum, g->sum + (g->lo - xlo), (g->hi - g->lo) * sizeof(double));
		memmove(g->mag, g->mag + (g->lo - xlo), (g->hi - g->lo) * sizeof(double));
	}
	free(x);
	free(site_sum);
	free(site_abs);
	return rc;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static void usage(FILE *f)
{
	fprintf(f, "usage: gradgate-bench allreduce --rank R --ranks N --site S --sites K [options]\n"
		   "  runs as rank R of N at site S of K (S: the site's index in sorted name order)\n"
		   "  --endpoint E   the gateway's control endpoint (default: $%s)\n"
		   "  --job NAME     job name (default: bench)\n"
		   "  --count C      float32 elements per all-reduce (default: 1048576)\n"
		   "  --steps T      timed all-reduce steps (default: 100)\n"
		   "  --warmup W     untimed steps before them (default: 0)\n"
		   "  --inflight N   keep N steps in flight, as a pipelined trainer does (1-8, default 1)\n"
		   "  --data KIND    grid: multiples of 1/64, new every step, sums exact in fp32 (default);\n"
		   "                 gaussian: random normal values made once, sent every step\n"
		   "  --check WHICH  steps checked against the exact sum: all (default), first, none;\n"
		   "                 the digest covers the checked steps\n"
		   "  --no-refill    each step after a buffer's first all-reduces what the step before left\n"
		   "                 in it, so the rank does no work between steps and the timing is the\n"
		   "                 path's alone (values grow sites x ranks-fold a step; --check first or none)\n"
		   "  --codec NAME   the gateways' codec, for the error bound (default: fp32, exact)\n"
		   "  --shared       tensors in shared buffers (gg_buffer_alloc): nothing copied to the gateway\n"
		   "  --timeout-ms T[@STEP] each step's deadline, or only STEP's (default: step_timeout)\n"
		   "  --per-step     print a line per step: 'step T rc=CODE digest=HEX'\n"
		   "  --json         print the summary as one JSON object, with every timed step's time\n"
		   "                 and its start and end (CLOCK_MONOTONIC seconds)\n"
		   "faults, for tests:\n"
		   "  --mismatch-step T       announce one element more than the others at step T\n"
		   "  --late MS@T             wait MS milliseconds before announcing step T\n",
		GG_ENDPOINT_ENV);
}

static double cpu_s(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

/* "MS" or "MS@STEP", both whole numbers, MS at least `min_ms` and STEP at
 * least 1, nothing else: true with *ms and *step (0 when not given). */
static bool ms_at_step(const char *s, int min_ms, bool step_needed, int *ms, int *step)
{
	char *end;
	long v, t = 0;

	errno = 0;
	v = *s >= '0' && *s <= '9' ? strtol(s, &end, 10) : -1;
	if (v < min_ms || v > 86400000 || errno)
		return false;
	if (*end == '@') {
		const char *at = end + 1;
		t = *at >= '0' && *at <= '9' ? strtol(at, &end, 10) : 0;
		if (t < 1 || t > 1000000 || errno)
			return false;
	}
	if (*end || (step_needed && !t))
		return false;
	*ms = (int)v;
	*step = (int)t;
	return true;
}

static int parse(int argc, char **argv, struct opts *o)
{
	static const struct option lopts[] = {
		{ "endpoint", required_argument, NULL, 'e' }, { "job", required_argument, NULL, 'j' },
		{ "rank", required_argument, NULL, 'r' },     { "ranks", required_argument, NULL, 'n' },
		{ "site", required_argument, NULL, 's' },     { "sites", required_argument, NULL, 'k' },
		{ "count", required_argument, NULL, 'c' },    { "steps", required_argument, NULL, 't' },
		{ "codec", required_argument, NULL, 'x' },    { "json", no_argument, NULL, 'J' },
		{ "inflight", required_argument, NULL, 'i' }, { "warmup", required_argument, NULL, 'w' },
		{ "data", required_argument, NULL, 'd' },     { "check", required_argument, NULL, 'C' },
		{ "shared", no_argument, NULL, 'S' },         { "timeout-ms", required_argument, NULL, 'T' },
		{ "mismatch-step", required_argument, NULL, 'M' }, { "late", required_argument, NULL, 'L' },
		{ "per-step", no_argument, NULL, 'P' },       { "no-refill", no_argument, NULL, 'R' },
		{ "help", no_argument, NULL, 'h' },           { NULL, 0, NULL, 0 },
	};
	enum gg_codec codec;
	long long v;
	int c;

	*o = (struct opts){ .job = "bench", .rank = -1, .ranks = 0, .site = -1, .sites = 0, .count = 1u << 20,
			    .steps = 100, .inflight = 1, .codec = "fp32" };
	optind = 1;
	while ((c = getopt_long(argc, argv, ":h", lopts, NULL)) != -1) {
#define NUMBER(opt, lo, hi, field)                                                  \
	do {                                                                        \
		if (gg_bench_number("allreduce", opt, optarg, lo, hi, &v))          \
			return 2;                                                   \
		o->field = v;                                                       \
	} while (0)
		switch (c) {
		case 'e': o->endpoint = optarg; break;
		case 'j': o->job = optarg; break;
		case 'r': NUMBER("--rank", 0, GG_BENCH_MAX_RANKS - 1, rank); break;
		case 'n': NUMBER("--ranks", 1, GG_BENCH_MAX_RANKS, ranks); break;
		case 's': NUMBER("--site", 0, GG_BENCH_MAX_SITES - 1, site); break;
		case 'k': NUMBER("--sites", 2, GG_BENCH_MAX_SITES, sites); break;
		case 'c': NUMBER("--count", 1, 1ll << 40, count); break;
		case 't': NUMBER("--steps", 1, 1000000, steps); break;
		case 'w': NUMBER("--warmup", 0, 1000000, warmup); break;
		case 'x':
			if (gg_codec_from_name(optarg, &codec)) {
				fprintf(stderr, "gradgate-bench allreduce: --codec is fp32, bf16, bf16-split, int8 or int4, not '%s'\n",
					optarg);
				return 2;
			}
			o->codec = optarg;
			break;
		case 'i': NUMBER("--inflight", 1, GG_BENCH_MAX_INFLIGHT, inflight); break;
		case 'J': o->json = true; break;
		case 'S': o->shared = true; break;
		case 'T':
			if (!ms_at_step(optarg, 1, false, &o->timeout_ms, &o->timeout_step)) {
				fprintf(stderr, "gradgate-bench allreduce: --timeout-ms is MS or MS@STEP, not '%s'\n", optarg);
				return 2;
			}
			break;
		case 'M': NUMBER("--mismatch-step", 1, 1000000, mismatch_step); break;
		case 'P': o->per_step = true; break;
		case 'L':
			if (!ms_at_step(optarg, 0, true, &o->late_ms, &o->late_step)) {
				fprintf(stderr, "gradgate-bench allreduce: --late is MS@STEP, e.g. 3000@2, not '%s'\n", optarg);
				return 2;
			}
			break;
		case 'd':
			if (strcmp(optarg, "grid") && strcmp(optarg, "gaussian")) {
				fprintf(stderr, "gradgate-bench allreduce: --data is grid or gaussian, not '%s'\n", optarg);
				return 2;
			}
			o->data = !strcmp(optarg, "grid") ? DATA_GRID : DATA_GAUSSIAN;
			break;
		case 'R': o->no_refill = true; break;
		case 'C':
			if (strcmp(optarg, "all") && strcmp(optarg, "first") && strcmp(optarg, "none")) {
				fprintf(stderr, "gradgate-bench allreduce: --check is all, first or none, not '%s'\n", optarg);
				return 2;
			}
			o->check = !strcmp(optarg, "all") ? CHECK_ALL : !strcmp(optarg, "first") ? CHECK_FIRST : CHECK_NONE;
			break;
		case 'h': usage(stdout); exit(0);
		default: return gg_bench_bad_option("allreduce", c, argv);
		}
#undef NUMBER
	}
	if (gg_bench_no_operands("allreduce", argc, argv, optind))
		return 2;
	if (o->rank < 0 || o->ranks < 1 || o->site < 0 || o->sites < 2) {
		fprintf(stderr, "gradgate-bench allreduce: --rank, --ranks, --site and --sites are required (see --help)\n");
		return 2;
	}
	if (o->rank >= o->ranks || o->site >= o->sites) {
		fprintf(stderr, "gradgate-bench allreduce: rank %d of %d ranks, site %d of %d sites: each must be below its count\n",
			o->rank, o->ranks, o->site, o->sites);
		return 2;
	}
	/* What the library would refuse at the first call, refused here as a
	 * bad option. */
	char why[160];
	if (!gg_ctrl_job_name_ok(o->job, why, sizeof(why))) {
		fprintf(stderr, "gradgate-bench allreduce: --job '%s': %s\n", o->job, why);
		return 2;
	}
	struct sockaddr_un addr;
	struct gg_error err;
	if (o->endpoint && gg_ctrl_parse_endpoint(o->endpoint, &addr, &err)) {
		fprintf(stderr, "gradgate-bench allreduce: --endpoint: %s\n", err.message);
		return 2;
	}
	if (o->no_refill && o->check == CHECK_ALL) {
		fprintf(stderr, "gradgate-bench allreduce: --no-refill sums sums: only the first step can be checked (--check first or none)\n");
		return 2;
	}
	return 0;
}

/* Compares a result with the exact sum; returns the elements out of bound
 * and raises *max_err. Lossy codecs encode each site's sum once per hop
 * with at most q levels per block (or 8 mantissa bits for bf16), and error
 * feedback may carry up to one more step's error; Gaussian sums also round
 * in fp32 at most once per input. */
static int check_result(const struct opts *o, const float *buf, int t, double q, double **exact,
			struct gauss_ref *g, double *max_err)
{
	int wrong = 0, inputs = o->sites * o->ranks;

	if (o->data == DATA_GAUSSIAN) {
		if (!g->sum && gauss_ref_make(o, g))
			return -ENOMEM;
		double codec_tol = q == 0 ? 0 : 2.0 * o->sites * g->gmax / q;
		for (size_t i = g->lo; i < g->hi; i++) {
			double want = g->sum[i - g->lo], e = fabs((double)buf[i] - want);
			double tol = codec_tol + (inputs + 1) * 0x1p-24 * g->mag[i - g->lo];
			*max_err = fmax(*max_err, e);
			if ((e > tol || isnan(e)) && wrong++ < 3)
				fprintf(stderr, "gradgate-bench allreduce: rank %d step %d element %zu: %.9g, float64 sum %.9g\n",
					o->rank, t, i, buf[i], want);
		}
		return wrong;
	}
	if (!*exact && !(*exact = malloc(o->count * sizeof(double))))
		return -ENOMEM;
	double gmax = 0;
	for (size_t i = 0; i < o->count; i++) {
		double sum = 0, mag = 0;
		for (int k = 0; k < o->sites; k++) {
			double site_sum = 0;
			for (int r = 0; r < o->ranks; r++)
				site_sum += input_value(k, r, t, i);
			sum += site_sum;
			mag += fabs(site_sum);
		}
		(*exact)[i] = sum;
		gmax = fmax(gmax, mag);
	}
	for (size_t i = 0; i < o->count; i++) {
		double e = fabs((double)buf[i] - (*exact)[i]);
		double tol = q == 0 ? 0 : 2.0 * o->sites * gmax / q;
		*max_err = fmax(*max_err, e);
		if ((e > tol || isnan(e)) && wrong++ < 3)
			fprintf(stderr, "gradgate-bench allreduce: rank %d step %d element %zu: %.9g, exact %.9g\n", o->rank, t, i,
				buf[i], (*exact)[i]);
	}
	return wrong;
}

int gg_bench_allreduce_main(int argc, char **argv)
{
	struct opts o;
	int usage_rc = parse(argc, argv, &o);

	if (usage_rc)
		return usage_rc;
	double q = !strcmp(o.codec, "fp32") ? 0 : !strcmp(o.codec, "int8") ? 127 : !strcmp(o.codec, "int4") ? 7 : 256;

	struct gg_session *s;
	struct gg_error err;
	if (o.per_step)
		setvbuf(stdout, NULL, _IOLBF, 0); /* a watcher sees each step as it ends */
	if (gg_session_open(o.endpoint, o.job, o.rank, o.ranks, &s, &err)) {
		fprintf(stderr, "gradgate-bench allreduce: rank %d: %s\n", o.rank, err.message);
		return 1;
	}
	struct slot {
		float *buf;
		struct gg_request *req; /* NULL: the start failed with start_rc */
		int start_rc;
		struct gg_error err;
		double t0;
	} slots[GG_BENCH_MAX_INFLIGHT] = { 0 };
	double *exact = NULL; /* grid data: the sum of the step checked last */
	struct gauss_ref gref = { 0 };
	float *grads = NULL;  /* Gaussian data: this rank's input */
	double *step_s = calloc((size_t)o.steps, sizeof(double));
	double *step_t0 = calloc((size_t)o.steps, sizeof(double)); /* when each timed step started, */
	double *step_t1 = calloc((size_t)o.steps, sizeof(double)); /* and ended (CLOCK_MONOTONIC) */
	bool oom = !step_s || !step_t0 || !step_t1;
	const size_t cap = o.count + (o.mismatch_step > 0); /* room for the one element more */
	for (int k = 0; k < o.inflight && !oom; k++) {
		if (!o.shared) {
			oom |= !(slots[k].buf = malloc(cap * sizeof(float)));
		} else if (gg_buffer_alloc(s, cap * sizeof(float), (void **)&slots[k].buf, &err)) {
			fprintf(stderr, "gradgate-bench allreduce: rank %d: %s\n", o.rank, err.message);
			return 1;
		}
	}
	if (o.data == DATA_GAUSSIAN && !oom && (grads = malloc(o.count * sizeof(float))))
		gaussian_fill(grads, o.site, o.rank, 0, o.count);
	if (oom || (o.data == DATA_GAUSSIAN && !grads)) {
		fprintf(stderr, "gradgate-bench allreduce: out of memory for %zu elements\n", o.count);
		return 1;
	}
	uint64_t digest = 0xcbf29ce484222325ull;
	int failed = 0, wrong = 0, checked = 0, next = 1, last = o.warmup + o.steps;
	double max_err = 0, total = 0, t_start = 0, t_end = 0, cpu_start = 0, cpu_end = 0;
	/* Timed steps that ended, and those of them that completed: a run cut
	 * short (its session lost) reports only what ran, and the rate counts
	 * only completed steps. */
	int timed = 0, timed_ok = 0;

	/* Step t is waited for once steps up to t + inflight - 1 started;
	 * results arrive in order. The timed window runs from the start of
	 * the first timed step to the result of the last one. */
	for (int t = 1; t <= last; t++) {
		for (; next <= last && next < t + o.inflight; next++) {
			struct slot *sl = &slots[(next - 1) % o.inflight];
			if (next == o.warmup + 1) {
				t_start = now_s();
				cpu_start = cpu_s();
			}
			if (o.no_refill && next > o.inflight)
				; /* the buffer holds the result of its last step: that is the input */
			else if (o.data == DATA_GAUSSIAN)
				memcpy(sl->buf, grads, o.count * sizeof(float)); /* the result replaced it */
			else
				for (size_t i = 0; i < o.count; i++)
					sl->buf[i] = input_value(o.site, o.rank, next, i);
			size_t n = o.count;
			if (next == o.mismatch_step)
				sl->buf[n++] = 0;
			if (next == o.late_step) {
				struct timespec ts = { o.late_ms / 1000, (long)(o.late_ms % 1000) * 1000000 };
				nanosleep(&ts, NULL);
			}
			sl->t0 = now_s();
			int timeout = !o.timeout_step || o.timeout_step == next ? o.timeout_ms : 0;
			sl->start_rc = gg_allreduce_start(s, sl->buf, n, GG_DTYPE_F32, 1, timeout, &sl->req, &sl->err);
		}
		struct slot *sl = &slots[(t - 1) % o.inflight];
		float *buf = sl->buf;
		int rc = sl->req ? gg_wait(sl->req, -1, &err) : sl->start_rc;
		if (!sl->req)
			err = sl->err;
		gg_request_free(sl->req);
		sl->req = NULL;
		double now = now_s();
		if (t > o.warmup) {
			step_s[t - o.warmup - 1] = now - sl->t0;
			step_t0[t - o.warmup - 1] = sl->t0;
			step_t1[t - o.warmup - 1] = now;
			timed = t - o.warmup;
			if (!rc) {
				total += now - sl->t0;
				timed_ok++;
			}
		}
		if (t == last) {
			t_end = now;
			cpu_end = cpu_s();
		}
		if (rc) {
			failed++;
			const char *name = gg_errc_name(rc);
			fprintf(stderr, "gradgate-bench allreduce: rank %d step %d: error %d (%s): %s\n", o.rank, t, rc,
				name ? name : "unknown", err.message);
			if (o.per_step)
				printf("step %d rc=%d\n", t, rc);
			if (rc == GG_ERR_CLOSED || rc == GG_ERR_PROTOCOL)
				break;
			continue;
		}
		if (o.per_step) {
			uint64_t d = 0xcbf29ce484222325ull;
			for (size_t i = 0; i < o.count * sizeof(float); i++)
				d = (d ^ ((const uint8_t *)buf)[i]) * 0x100000001b3ull;
			printf("step %d rc=0 digest=%016llx\n", t, (unsigned long long)d);
		}
		if (o.check == CHECK_NONE || (o.check == CHECK_FIRST && t > 1))
			continue;
		int w = check_result(&o, buf, t, q, &exact, &gref, &max_err);
		if (w < 0) {
			fprintf(stderr, "gradgate-bench allreduce: out of memory for the check of %zu elements\n", o.count);
			return 1;
		}
		wrong += w;
		checked++;
		const uint8_t *p = (const uint8_t *)buf;
		for (size_t i = 0; i < o.count * sizeof(float); i++)
			digest = (digest ^ p[i]) * 0x100000001b3ull;
	}
	if (!t_end) { /* cut short */
		t_end = now_s();
		cpu_end = cpu_s();
		if (!t_start) {
			t_start = t_end;
			cpu_start = cpu_end;
		}
	}
	for (int k = 0; k < o.inflight; k++)
		gg_request_free(slots[k].req); /* after a lost session: detached */
	gg_session_close(s); /* shared buffers go with it */
	for (int k = 0; k < o.inflight && o.shared; k++)
		slots[k].buf = NULL;
	if (o.json) {
		printf("{\"rank\":%d,\"site\":%d,\"steps\":%d,\"warmup\":%d,\"failed\":%d,\"wrong\":%d,\"checked\":%d,"
		       "\"t_timed_start\":%.6f,\"t_timed_end\":%.6f,\"cpu_s\":%.6f,\"step_ms\":[",
		       o.rank, o.site, timed, o.warmup, failed, wrong, checked, t_start, t_end, cpu_end - cpu_start);
		for (int t = 0; t < timed; t++)
			printf("%s%.3f", t ? "," : "", step_s[t] * 1e3);
		printf("],\"step_start\":[");
		for (int t = 0; t < timed; t++)
			printf("%s%.6f", t ? "," : "", step_t0[t]);
		printf("],\"step_end\":[");
		for (int t = 0; t < timed; t++)
			printf("%s%.6f", t ? "," : "", step_t1[t]);
		printf("],");
	}
	qsort(step_s, (size_t)timed, sizeof(double), cmp_double);
	double p50 = timed ? step_s[timed / 2] * 1e3 : 0, p90 = timed ? step_s[(timed * 9) / 10] * 1e3 : 0;
	double p99 = timed ? step_s[(timed * 99) / 100] * 1e3 : 0;
	double gbps = total > 0 ? (double)o.count * 4.0 * timed_ok * 8 / total / 1e9 : 0;
	if (o.json)
		printf("\"step_ms_p50\":%.3f,\"step_ms_p90\":%.3f,\"step_ms_p99\":%.3f,\"gbps\":%.3f,\"max_err\":%.6g,"
		       "\"digest\":\"%016llx\"}\n",
		       p50, p90, p99, gbps, max_err, (unsigned long long)digest);
	else
		printf("allreduce rank=%d site=%d steps=%d failed=%d wrong=%d step_ms_p50=%.3f step_ms_p99=%.3f "
		       "gbps=%.3f max_err=%.6g digest=%016llx\n",
		       o.rank, o.site, timed, failed, wrong, p50, p99, gbps, max_err, (unsigned long long)digest);
	for (int k = 0; k < o.inflight; k++)
		free(slots[k].buf);
	free(exact);
	free(gref.sum);
	free(gref.mag);
	free(grads);
	free(step_s);
	free(step_t0);
	free(step_t1);
	return failed || wrong ? 1 : 0;
}
