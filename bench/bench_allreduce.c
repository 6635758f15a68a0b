/* gradgate-bench allreduce: one training rank's all-reduce loop through
 * its site's running gateway. Every rank of every site derives its input
 * from (site, rank, step, element), so each can check the result against
 * the exact global sum without talking to the others: exactly for lossless
 * codecs, within the codec's bound for lossy ones. A digest of every
 * result lets a script confirm that all ranks of all sites got the same
 * bytes. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "gradgate.h"

#define GG_BENCH_MAX_INFLIGHT 8 /* the most a gateway allows (GG_CTRL_MAX_INFLIGHT) */

struct opts {
	const char *endpoint;
	const char *job;
	int rank, ranks, site, sites;
	size_t count;
	int steps;
	int inflight;      /* steps started before the oldest is waited for */
	const char *codec; /* what the gateways use: sets the check's bound */
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
		   "  --steps T      all-reduce steps (default: 100)\n"
		   "  --inflight N   keep N steps in flight, as a pipelined trainer does (1-8, default 1)\n"
		   "  --codec NAME   the gateways' codec, for the error bound (default: fp32, exact)\n"
		   "  --json         print the summary as one JSON object\n",
		GG_ENDPOINT_ENV);
}

int gg_bench_allreduce_main(int argc, char **argv)
{
	static const struct option lopts[] = {
		{ "endpoint", required_argument, NULL, 'e' }, { "job", required_argument, NULL, 'j' },
		{ "rank", required_argument, NULL, 'r' },     { "ranks", required_argument, NULL, 'n' },
		{ "site", required_argument, NULL, 's' },     { "sites", required_argument, NULL, 'k' },
		{ "count", required_argument, NULL, 'c' },    { "steps", required_argument, NULL, 't' },
		{ "codec", required_argument, NULL, 'x' },    { "json", no_argument, NULL, 'J' },
		{ "inflight", required_argument, NULL, 'i' }, { "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct opts o = { .job = "bench", .rank = -1, .ranks = 0, .site = -1, .sites = 0, .count = 1u << 20,
			  .steps = 100, .inflight = 1, .codec = "fp32" };
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "h", lopts, NULL)) != -1) {
		switch (c) {
		case 'e': o.endpoint = optarg; break;
		case 'j': o.job = optarg; break;
		case 'r': o.rank = atoi(optarg); break;
		case 'n': o.ranks = atoi(optarg); break;
		case 's': o.site = atoi(optarg); break;
		case 'k': o.sites = atoi(optarg); break;
		case 'c': o.count = strtoull(optarg, NULL, 10); break;
		case 't': o.steps = atoi(optarg); break;
		case 'x': o.codec = optarg; break;
		case 'i': o.inflight = atoi(optarg); break;
		case 'J': o.json = true; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (o.rank < 0 || o.ranks < 1 || o.rank >= o.ranks || o.site < 0 || o.sites < 2 || o.site >= o.sites ||
	    o.count == 0 || o.steps < 1 || o.inflight < 1 || o.inflight > GG_BENCH_MAX_INFLIGHT) {
		usage(stderr);
		return 2;
	}
	double q = !strcmp(o.codec, "fp32") ? 0 : !strcmp(o.codec, "int8") ? 127 : !strcmp(o.codec, "int4") ? 7 : 256;

	struct gg_session *s;
	struct gg_error err;
	if (gg_session_open(o.endpoint, o.job, o.rank, o.ranks, &s, &err)) {
		fprintf(stderr, "allreduce: rank %d: %s\n", o.rank, err.message);
		return 1;
	}
	struct slot {
		float *buf;
		struct gg_request *req; /* NULL: the start failed with start_rc */
		int start_rc;
		struct gg_error err;
		double t0;
	} slots[GG_BENCH_MAX_INFLIGHT] = { 0 };
	double *exact = malloc(o.count * sizeof(double));
	double *step_s = calloc((size_t)o.steps, sizeof(double));
	bool oom = !exact || !step_s;
	for (int k = 0; k < o.inflight; k++)
		oom |= !(slots[k].buf = malloc(o.count * sizeof(float)));
	if (oom) {
		fprintf(stderr, "allreduce: out of memory for %zu elements\n", o.count);
		return 1;
	}
	uint64_t digest = 0xcbf29ce484222325ull;
	int failed = 0, wrong = 0, next = 1;
	double max_err = 0, total = 0;

	/* Step t is waited for once steps up to t + inflight - 1 started;
	 * results arrive in order. */
	for (int t = 1; t <= o.steps; t++) {
		for (; next <= o.steps && next < t + o.inflight; next++) {
			struct slot *sl = &slots[(next - 1) % o.inflight];
			for (size_t i = 0; i < o.count; i++)
				sl->buf[i] = input_value(o.site, o.rank, next, i);
			sl->t0 = now_s();
			sl->start_rc = gg_allreduce_start(s, sl->buf, o.count, GG_DTYPE_F32, 1, -1, &sl->req, &sl->err);
		}
		struct slot *sl = &slots[(t - 1) % o.inflight];
		float *buf = sl->buf;
		int rc = sl->req ? gg_wait(sl->req, -1, &err) : sl->start_rc;
		if (!sl->req)
			err = sl->err;
		gg_request_free(sl->req);
		sl->req = NULL;
		step_s[t - 1] = now_s() - sl->t0;
		total += step_s[t - 1];
		if (rc) {
			failed++;
			fprintf(stderr, "allreduce: rank %d step %d: %s\n", o.rank, t, err.message);
			if (rc == GG_ERR_CLOSED || rc == GG_ERR_PROTOCOL)
				break;
			continue;
		}
		/* The exact sum, and the bound a lossy codec must stay within: it
		 * encodes each site's sum once per hop with at most q levels per
		 * block (or 8 mantissa bits for bf16), and error feedback may carry
		 * up to one more step's error. */
		double gmax = 0;
		for (size_t i = 0; i < o.count; i++) {
			double sum = 0, mag = 0;
			for (int k = 0; k < o.sites; k++) {
				double site_sum = 0;
				for (int r = 0; r < o.ranks; r++)
					site_sum += input_value(k, r, t, i);
				sum += site_sum;
				mag += fabs(site_sum);
			}
			exact[i] = sum;
			gmax = fmax(gmax, mag);
		}
		for (size_t i = 0; i < o.count; i++) {
			double e = fabs((double)buf[i] - exact[i]);
			double tol = q == 0 ? 0 : q == 256 ? 2.0 * o.sites * gmax / 256.0 : 2.0 * o.sites * gmax / q;
			max_err = fmax(max_err, e);
			if (e > tol || isnan(e)) {
				if (wrong++ < 3)
					fprintf(stderr, "allreduce: rank %d step %d element %zu: %.9g, exact %.9g\n", o.rank,
						t, i, buf[i], exact[i]);
			}
		}
		const uint8_t *p = (const uint8_t *)buf;
		for (size_t i = 0; i < o.count * sizeof(float); i++)
			digest = (digest ^ p[i]) * 0x100000001b3ull;
	}
	for (int k = 0; k < o.inflight; k++)
		gg_request_free(slots[k].req); /* after a lost session: detached */
	gg_session_close(s);
	qsort(step_s, (size_t)o.steps, sizeof(double), cmp_double);
	double p50 = step_s[o.steps / 2] * 1e3, p99 = step_s[(o.steps * 99) / 100] * 1e3;
	double gbps = total > 0 ? (double)o.count * 4.0 * o.steps * 8 / total / 1e9 : 0;
	if (o.json)
		printf("{\"rank\":%d,\"site\":%d,\"steps\":%d,\"failed\":%d,\"wrong\":%d,\"step_ms_p50\":%.3f,"
		       "\"step_ms_p99\":%.3f,\"gbps\":%.3f,\"max_err\":%.6g,\"digest\":\"%016llx\"}\n",
		       o.rank, o.site, o.steps, failed, wrong, p50, p99, gbps, max_err, (unsigned long long)digest);
	else
		printf("allreduce rank=%d site=%d steps=%d failed=%d wrong=%d step_ms_p50=%.3f step_ms_p99=%.3f "
		       "gbps=%.3f max_err=%.6g digest=%016llx\n",
		       o.rank, o.site, o.steps, failed, wrong, p50, p99, gbps, max_err, (unsigned long long)digest);
	for (int k = 0; k < o.inflight; k++)
		free(slots[k].buf);
	free(exact);
	free(step_s);
	return failed || wrong ? 1 : 0;
}
