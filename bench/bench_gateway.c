/* gradgate-bench gateway: how fast gateways exchange an all-reduce, next to
 * what one TLS transport moves on the same machine in the same run.
 *
 * K gateway cores (gateway/node.c: the daemon's peer mesh, step engine and
 * TLS streams, each on its own thread and io_uring loop) run in this
 * process and connect over loopback with throwaway certificates. Every
 * site contributes a fixed input; the timed steps follow one warm-up step.
 * Payload throughput is every frame byte the gateways sent (all sites, all
 * directions) per second of wall time; the baseline is
 * gradgate-bench transport with TLS, the same ciphersuite and S streams
 * one way (a sender and a receiver thread each), run right after. With two
 * sites both sides have S connections and keep every core of this
 * machine busy, so the ratio says what the gateway costs on top of the
 * channel per byte; with more sites the gateways carry more connections
 * than the baseline, and the ratio is a per-core comparison. The site
 * backend (ranks, shared memory, the site sum) is not part of it:
 * gradgate-bench allreduce measures that path end to end. */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/stat.h>

#include "bench.h"
#include "codec.h"
#include "config.h"
#include "log.h"
#include "net_addr.h"
#include "node.h"
#include "tls_pki.h"
#include "units.h"

#define MAX_SITES 4
#define MAX_JOBS 4
#define CONNECT_S 10.0 /* for every site to connect */
#define STALL_S 150.0  /* without a step finishing: past the steps' own deadline (120 s) */

struct opts {
	unsigned sites;
	uint64_t count;
	unsigned steps;
	const char *codec;
	int zstd_level;
	const char *algo;
	int streams;
	int threads;
	unsigned jobs;
	uint64_t chunk_bytes;
	const char *cipher;
	double baseline_s;
	bool json;
};

/* The sites start timing together: each keeps its loop running (its peers
 * need it for their handshakes) until every site is connected. */
struct start {
	atomic_uint connected;
	atomic_bool failed;
};

/* One job of a site: a step at a time, like one gradient bucket. */
struct job {
	struct site *site;
	unsigned index;
	float *result;
	unsigned steps_done;
	double step_start;
	bool busy;
};

struct site {
	pthread_t thread;
	const struct opts *o;
	unsigned index;
	struct gg_config cfg;
	struct start *start;
	float *input;
	struct job jobs[MAX_JOBS];
	unsigned steps_done; /* of all jobs */
	double *step_s;     /* per timed step */
	double wall_s;      /* the timed steps */
	uint64_t bytes_out; /* frame bytes sent during the timed steps */
	uint64_t raw_out;
	double tls_s, codec_s;
	int status;
	char message[GG_NODE_ERROR_MAX + 64];
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Multiples of 1/64 in [-32, 32): every sum of a few of them is exact in
 * fp32, so a lossless result can be checked bit for bit. */
static float input_value(unsigned site, uint64_t i)
{
	uint64_t h = i * 0x9e3779b97f4a7c15ull ^ (uint64_t)(site + 1) * 0xbf58476d1ce4e5b9ull;
	h ^= h >> 31;
	return (float)((int)(h % 4096) - 2048) / 64.0f;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: gradgate-bench gateway [options]\n"
		"Runs K gateways (peer mesh, step engine and TLS streams, one thread and io_uring\n"
		"loop each) in this process over loopback, times all-reduce steps between them, then\n"
		"runs the TLS transport benchmark with the same ciphersuite and streams, and prints\n"
		"the gateways' payload throughput against it.\n\n"
		"  --sites K            gateways, 2-%d (default 2)\n"
		"  --count C            float32 elements per step (default 16777216, 64 MiB)\n"
		"  --steps T            timed steps per job, after one warm-up step each (default 8)\n"
		"  --jobs J             jobs with a step in flight at once, as a trainer's gradient\n"
		"                       buckets are, 1-%d (default 1)\n"
		"  --codec NAME         fp32, bf16, bf16-split, int8, int4 (default fp32)\n"
		"  --zstd-level N       0 (off, default) to 19\n"
		"  --algorithm A        direct or ring (default direct)\n"
		"  --streams S          TLS streams per peer, and of the baseline (default 2)\n"
		"  --threads W          lanes per gateway: threads with a loop and a share of the\n"
		"                       streams and chunks each (default 1)\n"
		"  --chunk SIZE         chunk size (default 1MiB)\n"
		"  --cipher SUITE       TLS 1.3 ciphersuite (default TLS_AES_256_GCM_SHA384)\n"
		"  --baseline-time S    seconds of the transport baseline (default 3; 0 skips it)\n"
		"  --json               one JSON object\n",
		MAX_SITES, MAX_JOBS);
}

static int parse(int argc, char **argv, struct opts *o)
{
	static const struct option lopts[] = {
		{ "sites", required_argument, NULL, 'k' },     { "count", required_argument, NULL, 'c' },
		{ "steps", required_argument, NULL, 't' },     { "codec", required_argument, NULL, 'x' },
		{ "zstd-level", required_argument, NULL, 'z' }, { "algorithm", required_argument, NULL, 'a' },
		{ "streams", required_argument, NULL, 's' },   { "chunk", required_argument, NULL, 'C' },
		{ "cipher", required_argument, NULL, 'p' },    { "baseline-time", required_argument, NULL, 'b' },
		{ "jobs", required_argument, NULL, 'j' },      { "json", no_argument, NULL, 'J' },
		{ "threads", required_argument, NULL, 'w' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	char *end;
	int c;
	bool streams_given = false;

	*o = (struct opts){ .sites = 2, .count = 16u << 20, .steps = 8, .codec = "fp32", .algo = "direct",
			    .streams = 2, .threads = 1, .jobs = 1, .chunk_bytes = 1u << 20, .cipher = "TLS_AES_256_GCM_SHA384",
			    .baseline_s = 3 };
	optind = 1;
	while ((c = getopt_long(argc, argv, ":h", lopts, NULL)) != -1) {
		long v;
		switch (c) {
		case 'k':
		case 't':
		case 'z':
		case 's':
		case 'w':
		case 'j': {
			static const struct {
				int opt;
				long lo, hi;
				const char *name;
			} ranges[] = { { 'k', 2, MAX_SITES, "--sites" }, { 't', 1, 10000, "--steps" },
				       { 'z', 0, 19, "--zstd-level" }, { 's', 1, 32, "--streams" },
				       { 'j', 1, MAX_JOBS, "--jobs" }, { 'w', 1, 64, "--threads" } };
			size_t r = 0;
			while (ranges[r].opt != c)
				r++;
			v = strtol(optarg, &end, 10);
			if (*end || end == optarg || v < ranges[r].lo || v > ranges[r].hi) {
				fprintf(stderr, "gradgate-bench gateway: %s must be %ld to %ld, not '%s'\n", ranges[r].name,
					ranges[r].lo, ranges[r].hi, optarg);
				return 2;
			}
			if (c == 'k')
				o->sites = (unsigned)v;
			else if (c == 't')
				o->steps = (unsigned)v;
			else if (c == 'z')
				o->zstd_level = (int)v;
			else if (c == 'j')
				o->jobs = (unsigned)v;
			else if (c == 'w')
				o->threads = (int)v;
			else
				o->streams = (int)v, streams_given = true;
			break;
		}
		case 'c':
			o->count = strtoull(optarg, &end, 10);
			if (*end || end == optarg || o->count == 0 || o->count > (1ull << 28)) {
				fprintf(stderr, "gradgate-bench gateway: --count must be 1 to %llu elements, not '%s'\n",
					1ull << 28, optarg);
				return 2;
			}
			break;
		case 'x': {
			enum gg_codec codec;
			if (gg_codec_from_name(optarg, &codec)) {
				fprintf(stderr, "gradgate-bench gateway: --codec is fp32, bf16, bf16-split, int8 or int4, "
						"not '%s'\n", optarg);
				return 2;
			}
			o->codec = gg_codec_name(codec);
			break;
		}
		case 'a':
			if (strcmp(optarg, "direct") && strcmp(optarg, "ring")) {
				fprintf(stderr, "gradgate-bench gateway: --algorithm is direct or ring, not '%s'\n", optarg);
				return 2;
			}
			o->algo = optarg;
			break;
		case 'C':
			if (gg_bench_size("gateway", "--chunk", optarg, 4u << 10, 64u << 20, sizeof(float), &o->chunk_bytes))
				return 2;
			break;
		case 'p':
			/* Goes into the config text: an IANA TLS 1.3 suite name only. */
			if (strlen(optarg) > 64 || strspn(optarg, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") != strlen(optarg)) {
				fprintf(stderr, "gradgate-bench gateway: --cipher wants a TLS 1.3 ciphersuite name such as "
						"TLS_AES_256_GCM_SHA384, not '%s'\n", optarg);
				return 2;
			}
			o->cipher = optarg;
			break;
		case 'b':
			o->baseline_s = strtod(optarg, &end);
			if (*end || end == optarg || !(o->baseline_s >= 0 && o->baseline_s <= 60)) {
				fprintf(stderr, "gradgate-bench gateway: --baseline-time must be 0 to 60 seconds, not '%s'\n",
					optarg);
				return 2;
			}
			break;
		case 'J':
			o->json = true;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		default:
			return gg_bench_bad_option("gateway", c, argv);
		}
	}
	if (gg_bench_no_operands("gateway", argc, argv, optind))
		return 2;
	/* Each stream belongs to one lane: a gateway starts no more lanes. */
	if (o->threads > o->streams) {
		fprintf(stderr, "gradgate-bench gateway: --threads %d: more lanes than --streams %d%s would leave lanes "
			"idle\n", o->threads, o->streams, streams_given ? "" : " (the default)");
		return 2;
	}
	return 0;
}

static int write_file(const char *dir, const char *name, const char *text)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "w");
	if (!f)
		return -errno;
	int bad = fputs(text, f) < 0;
	bad |= fclose(f) != 0;
	return bad ? -EIO : 0;
}

/* The throwaway folder and its files, named once so that a signal
 * handler can remove them (unlink and rmdir are async-signal-safe). */
static struct {
	char dir[256];
	char files[1 + 2 * MAX_SITES][300];
	unsigned nfiles;
} throwaway;

static void remove_dir(void)
{
	for (unsigned i = 0; i < throwaway.nfiles; i++)
		unlink(throwaway.files[i]);
	rmdir(throwaway.dir);
}

/* Interrupted, the run leaves no private keys behind, then dies of the
 * signal as it would have. */
static void on_stop_signal(int sig)
{
	remove_dir();
	signal(sig, SIG_DFL);
	raise(sig);
}

static void name_throwaway(const char *dir, unsigned sites)
{
	snprintf(throwaway.dir, sizeof(throwaway.dir), "%s", dir);
	snprintf(throwaway.files[throwaway.nfiles++], sizeof(throwaway.files[0]), "%s/ca.pem", dir);
	for (unsigned k = 0; k < sites; k++) {
		snprintf(throwaway.files[throwaway.nfiles++], sizeof(throwaway.files[0]), "%s/s%u.pem", dir, k);
		snprintf(throwaway.files[throwaway.nfiles++], sizeof(throwaway.files[0]), "%s/s%u.key", dir, k);
	}
	/* A signal the run was started ignoring (nohup, a background job of a
	 * script) stays ignored. */
	const int sigs[] = { SIGINT, SIGTERM, SIGHUP };
	for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
		struct sigaction sa = { .sa_handler = on_stop_signal }, old;
		if (!sigaction(sigs[i], NULL, &old) && old.sa_handler != SIG_IGN)
			sigaction(sigs[i], &sa, NULL);
	}
}

/* Throwaway CA and one certificate per site (dns:sK.gradgate.test), as
 * files the configs name; keys 0600, as the gateway demands. */
static int make_certs(const char *dir, unsigned sites)
{
	struct gg_tls_pki *pki;
	int rc = gg_tls_pki_new("gradgate-bench gateway throwaway CA", &pki);

	if (rc)
		return rc;
	rc = write_file(dir, "ca.pem", gg_tls_pki_ca_pem(pki));
	mode_t old = umask(077);
	for (unsigned k = 0; k < sites && !rc; k++) {
		char id[64], name[32], *cert = NULL, *key = NULL;
		snprintf(id, sizeof(id), "dns:s%u.gradgate.test", k);
		struct gg_tls_cert_request req = { .identity = id, .valid_from_s = -3600, .valid_until_s = 86400 };
		rc = gg_tls_pki_issue(pki, &req, &cert, &key);
		if (!rc) {
			snprintf(name, sizeof(name), "s%u.pem", k);
			rc = write_file(dir, name, cert);
		}
		if (!rc) {
			snprintf(name, sizeof(name), "s%u.key", k);
			rc = write_file(dir, name, key);
		}
		free(cert);
		free(key);
	}
	umask(old);
	gg_tls_pki_free(pki);
	return rc;
}

/* Appends to text (size bytes, *n used); once it is full, *n stays past
 * the end and nothing more is written. */
GG_PRINTF(4, 5) static void appendf(char *text, size_t size, size_t *n, const char *fmt, ...)
{
	va_list ap;

	if (*n >= size)
		return;
	va_start(ap, fmt);
	int w = vsnprintf(text + *n, size - *n, fmt, ap);
	va_end(ap);
	*n = w < 0 ? size : *n + (size_t)w;
}

static int load_config(const struct opts *o, const char *dir, const int *ports, unsigned k, struct gg_config *cfg)
{
	char text[4096];
	size_t n = 0;
	struct gg_diag diag = { 0 };

	appendf(text, sizeof(text), &n,
			      "[site]\nname = \"s%u\"\nlisten = \"127.0.0.1:%d\"\nthreads = %d\n"
			      "[tls]\nca = \"ca.pem\"\ncert = \"s%u.pem\"\nkey = \"s%u.key\"\nciphersuites = [\"%s\"]\n",
			      k, ports[k], o->threads, k, k, o->cipher);
	for (unsigned p = 0; p < o->sites; p++)
		if (p != k)
			appendf(text, sizeof(text), &n,
					      "[[peers]]\nsite = \"s%u\"\naddress = \"127.0.0.1:%d\"\n"
					      "identity = \"dns:s%u.gradgate.test\"\n",
					      p, ports[p], p);
	appendf(text, sizeof(text), &n,
			      "[transport]\nstreams_per_peer = %d\nchunk_size = %llu\nstep_timeout = \"120s\"\n"
			      "reconnect_min = \"20ms\"\nreconnect_max = \"200ms\"\n"
			      "[compression]\ncodec = \"%s\"\nzstd_level = %d\n[allreduce]\nalgorithm = \"%s\"\n",
			      o->streams, (unsigned long long)o->chunk_bytes, o->codec, o->zstd_level, o->algo);
	if (n >= sizeof(text))
		return -E2BIG;
	int rc = gg_config_load_text(text, n, "gateway bench config", dir, cfg, &diag);
	if (rc) {
		fprintf(stderr, "gradgate-bench gateway: the config the options make for site %u is refused "
			"(--chunk sets chunk_size, --cipher ciphersuites, --codec codec, --streams streams_per_peer):\n",
			k);
		gg_diag_print(&diag, stderr);
		gg_diag_free(&diag);
	}
	return rc;
}

static void on_done(void *arg, struct gg_node_step *st, int status, const char *message)
{
	struct job *j = arg;
	struct site *s = j->site;

	if (status && !s->status) {
		s->status = status;
		snprintf(s->message, sizeof(s->message), "site %u: job %u step %llu: %s", s->index, j->index,
			 (unsigned long long)st->seq, message ? message : "failed");
	}
	if (j->steps_done > 0 && j->steps_done <= s->o->steps && j->index == 0)
		s->step_s[j->steps_done - 1] = now_s() - j->step_start;
	j->steps_done++;
	j->busy = false;
	s->steps_done++;
	free(st);
}

/* Starts job j's next step. */
static int submit(struct gg_node *node, struct site *s, struct job *j)
{
	char err[GG_NODE_ERROR_MAX];
	struct gg_node_step *st = calloc(1, sizeof(*st));

	if (!st)
		return -ENOMEM;
	*st = (struct gg_node_step){ .seq = j->steps_done + 1, .tensor_id = 1, .count = s->o->count, .dtype = 1,
				     .input = s->input, .result = j->result, .done = on_done, .arg = j };
	snprintf(st->job, sizeof(st->job), "bench-%u", j->index);
	j->busy = true;
	j->step_start = now_s();
	int rc = gg_node_submit(node, st, err, sizeof(err));
	if (rc) {
		free(st);
		j->busy = false;
		snprintf(s->message, sizeof(s->message), "site %u: %s", s->index, err);
		s->status = rc;
	}
	return rc;
}

/* Runs the loop until `until` steps (of all jobs) are done, keeping every
 * job's next step submitted up to `per_job` steps each. */
static void run_steps(struct gg_node *node, struct site *s, unsigned per_job, unsigned until)
{
	unsigned seen = s->steps_done;
	double stall_at = now_s() + STALL_S;

	while (!s->status && s->steps_done < until && !atomic_load(&s->start->failed)) {
		for (unsigned k = 0; k < s->o->jobs && !s->status; k++)
			if (!s->jobs[k].busy && s->jobs[k].steps_done < per_job && submit(node, s, &s->jobs[k]))
				break;
		if (s->steps_done != seen) {
			seen = s->steps_done;
			stall_at = now_s() + STALL_S;
		}
		if (!s->status && (now_s() > stall_at || gg_node_run_once(node, 10000, NULL, NULL))) {
			snprintf(s->message, sizeof(s->message), "site %u: no step finished for %.0f s", s->index,
				 STALL_S);
			s->status = -ETIMEDOUT;
		}
	}
	if (s->status) /* the other sites stop too, rather than wait for this one */
		atomic_store(&s->start->failed, true);
}

static void *run_site(void *arg)
{
	struct site *s = arg;
	const struct opts *o = s->o;
	struct gg_node *node = NULL;
	char err[GG_NODE_ERROR_MAX];
	double t0 = 0;
	uint64_t bytes0 = 0, raw0 = 0;
	double tls0 = 0, codec0 = 0;

	if (gg_node_new(&s->cfg, &node, err, sizeof(err))) {
		snprintf(s->message, sizeof(s->message), "site %u: %s", s->index, err);
		s->status = -EIO;
		atomic_store(&s->start->failed, true);
		return NULL;
	}
	bool counted = false;
	for (double until = now_s() + CONNECT_S; now_s() < until && !atomic_load(&s->start->failed);) {
		if (!counted && gg_node_connected(node)) {
			atomic_fetch_add(&s->start->connected, 1);
			counted = true;
		}
		if (atomic_load(&s->start->connected) == o->sites)
			break;
		if (gg_node_run_once(node, 10000, NULL, NULL))
			break;
	}
	if (atomic_load(&s->start->connected) != o->sites) {
		snprintf(s->message, sizeof(s->message), "site %u: the sites did not all connect within %.0f s", s->index,
			 CONNECT_S);
		s->status = -ETIMEDOUT;
		atomic_store(&s->start->failed, true);
	}
	/* One warm-up step per job, then the timed ones, the jobs' steps
	 * overlapping as a trainer's buckets do. */
	for (unsigned k = 0; k < o->jobs && !s->status; k++)
		run_steps(node, s, 1, k + 1);
	const struct gg_node_stats *stats = gg_node_stats(node);
	t0 = now_s();
	bytes0 = stats->data_bytes_out;
	raw0 = stats->raw_bytes_out;
	tls0 = stats->tls_s;
	codec0 = stats->encode_s + stats->decode_s;
	run_steps(node, s, o->steps + 1, o->jobs * (o->steps + 1));
	if (!s->status) {
		s->wall_s = now_s() - t0;
		s->bytes_out = stats->data_bytes_out - bytes0;
		s->raw_out = stats->raw_bytes_out - raw0;
		s->tls_s = stats->tls_s - tls0;
		s->codec_s = stats->encode_s + stats->decode_s - codec0;
	}
	for (int spins = 0; spins < 500 && !gg_node_flushed(node); spins++)
		if (gg_node_run_once(node, 10000, NULL, NULL))
			break;
	gg_node_shutdown(node);
	for (int spins = 0; spins < 200 && !gg_node_idle(node); spins++)
		if (gg_node_run_once(node, 10000, NULL, NULL))
			break;
	gg_node_free(node);
	return NULL;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Every site got the same bytes in every job; fp32 results are the exact
 * sum. */
static int check_results(const struct opts *o, struct site *sites)
{
	for (unsigned j = 0; j < o->jobs; j++) {
		const float *r0 = sites[0].jobs[j].result;
		for (unsigned k = 1; k < o->sites; k++)
			if (memcmp(r0, sites[k].jobs[j].result, o->count * sizeof(float))) {
				fprintf(stderr, "gradgate-bench gateway: job %u: site %u's result differs from site 0's\n",
					j, k);
				return -1;
			}
		for (uint64_t i = 0; i < o->count && !strcmp(o->codec, "fp32"); i++) {
			float want = 0;
			for (unsigned k = 0; k < o->sites; k++)
				want += input_value(k, i);
			if (r0[i] != want) {
				fprintf(stderr, "gradgate-bench gateway: job %u: element %llu is %g, the sum is %g\n", j,
					(unsigned long long)i, (double)r0[i], (double)want);
				return -1;
			}
		}
	}
	return 0;
}

int gg_bench_gateway_main(int argc, char **argv)
{
	static struct site sites[MAX_SITES];
	struct opts o;
	struct start start = { 0 };
	const char *tmp = getenv("TMPDIR");
	char dir[sizeof(throwaway.dir)];
	int ports[MAX_SITES], rc, status = 0;

	if ((rc = parse(argc, argv, &o)))
		return rc;
	gg_log_set_level(GG_LOG_ERROR);
	if (!tmp || !*tmp)
		tmp = "/tmp";
	if ((size_t)snprintf(dir, sizeof(dir), "%s/gradgate-bench-gw.XXXXXX", tmp) >= sizeof(dir)) {
		fprintf(stderr, "gradgate-bench gateway: TMPDIR is %zu bytes long; the folder for throwaway "
			"certificates takes one of at most %zu\n", strlen(tmp), sizeof(dir) - sizeof("/gradgate-bench-gw.XXXXXX"));
		return 1;
	}
	if (!mkdtemp(dir)) {
		fprintf(stderr, "gradgate-bench gateway: cannot make a folder for throwaway certificates in %s: %s\n",
			tmp, strerror(errno));
		return 1;
	}
	name_throwaway(dir, o.sites);
	if ((rc = make_certs(dir, o.sites))) {
		fprintf(stderr, "gradgate-bench gateway: cannot make throwaway certificates in %s: %s\n", dir,
			strerror(-rc));
		remove_dir();
		return 1;
	}
	if ((rc = gg_net_free_loopback_ports(ports, o.sites))) {
		fprintf(stderr, "gradgate-bench gateway: no free loopback ports: %s\n", strerror(-rc));
		remove_dir();
		return 1;
	}
	memset(sites, 0, sizeof(sites));
	for (unsigned k = 0; k < o.sites; k++) {
		struct site *s = &sites[k];
		s->o = &o;
		s->index = k;
		s->start = &start;
		if (load_config(&o, dir, ports, k, &s->cfg)) {
			status = 2;
			break;
		}
		s->input = malloc(o.count * sizeof(float));
		s->step_s = calloc(o.steps, sizeof(double));
		bool ok = s->input && s->step_s;
		for (unsigned j = 0; j < o.jobs && ok; j++) {
			s->jobs[j] = (struct job){ .site = s, .index = j, .result = malloc(o.count * sizeof(float)) };
			/* no first-touch faults in the timed steps */
			if ((ok = s->jobs[j].result != NULL))
				memset(s->jobs[j].result, 0, o.count * sizeof(float));
		}
		if (!ok) {
			fprintf(stderr, "gradgate-bench gateway: out of memory\n");
			status = 1;
			break;
		}
		for (uint64_t i = 0; i < o.count; i++)
			s->input[i] = input_value(k, i);
	}
	if (!status) {
		unsigned started = 0;
		while (started < o.sites && !pthread_create(&sites[started].thread, NULL, run_site, &sites[started]))
			started++;
		if (started < o.sites) {
			fprintf(stderr, "gradgate-bench gateway: cannot start the thread of site %u\n", started);
			atomic_store(&start.failed, true); /* the started sites give up */
			status = 1;
		}
		for (unsigned k = 0; k < started; k++)
			pthread_join(sites[k].thread, NULL);
	}
	remove_dir();

	double wall = 0, tls = 0, codec = 0;
	uint64_t bytes = 0, raw = 0;
	for (unsigned k = 0; k < o.sites && !status; k++) {
		if (sites[k].status) {
			fprintf(stderr, "gradgate-bench gateway: %s\n", sites[k].message);
			status = 1;
		}
		wall = GG_MAX(wall, sites[k].wall_s);
		bytes += sites[k].bytes_out;
		raw += sites[k].raw_out;
		tls += sites[k].tls_s;
		codec += sites[k].codec_s;
	}
	if (!status && check_results(&o, sites))
		status = 1;
	if (!status) {
		double base = 0, gbps = (double)bytes * 8 / wall / 1e9;
		qsort(sites[0].step_s, o.steps, sizeof(double), cmp_double);
		double p50 = sites[0].step_s[(o.steps - 1) / 2] * 1e3;
		if (o.baseline_s > 0 && gg_bench_transport_loopback(o.cipher, o.streams, o.baseline_s, &base)) {
			fprintf(stderr, "gradgate-bench gateway: the transport baseline failed\n");
			status = 1;
		}
		if (o.json) {
			printf("{\"sites\": %u, \"count\": %llu, \"steps\": %u, \"codec\": \"%s\", \"zstd_level\": %d, "
			       "\"algorithm\": \"%s\", \"streams\": %d, \"threads\": %d, \"jobs\": %u, \"cipher\": \"%s\", "
			       "\"step_ms_p50\": %.3f, \"payload_gbps\": %.3f, \"raw_gbps\": %.3f, \"tls_share\": %.3f, "
			       "\"codec_share\": %.3f",
			       o.sites, (unsigned long long)o.count, o.steps, o.codec, o.zstd_level, o.algo, o.streams, o.threads,
			       o.jobs, o.cipher, p50,
			       gbps, (double)raw * 8 / wall / 1e9, tls / (wall * o.sites), codec / (wall * o.sites));
			if (base > 0)
				printf(", \"transport_gbps\": %.3f, \"ratio_vs_transport\": %.3f", base, gbps / base);
			else /* --baseline-time 0: no baseline */
				printf(", \"transport_gbps\": null, \"ratio_vs_transport\": null");
			printf("}\n");
		} else {
			printf("gradgate-bench gateway: %u sites, %llu float32 per step (%s), %s, %s, %d streams per peer, "
			       "%d thread%s per gateway, %u job%s in flight, loopback\n",
			       o.sites, (unsigned long long)o.count, o.codec, o.algo, o.cipher, o.streams, o.threads,
			       o.threads == 1 ? "" : "s", o.jobs, o.jobs == 1 ? "" : "s");
			printf("  gateways        %8.2f Gbit/s payload (all sites and directions), %.2f Gbit/s of fp32; "
			       "step p50 %.1f ms over %u steps\n",
			       gbps, (double)raw * 8 / wall / 1e9, p50, o.steps);
			printf("  time in         TLS %.0f%%, codec %.0f%% of the gateways' wall time\n",
			       100 * tls / (wall * o.sites), 100 * codec / (wall * o.sites));
			if (base > 0)
				printf("  transport TLS   %8.2f Gbit/s (%d streams, same run)\n  ratio           %8.3f\n",
				       base, o.streams, gbps / base);
			printf("  results         every site identical%s\n",
			       strcmp(o.codec, "fp32") ? "" : ", equal to the exact sum");
		}
	}
	for (unsigned k = 0; k < o.sites; k++) {
		gg_config_free(&sites[k].cfg);
		free(sites[k].input);
		for (unsigned j = 0; j < o.jobs; j++)
			free(sites[k].jobs[j].result);
		free(sites[k].step_s);
	}
	return status;
}
