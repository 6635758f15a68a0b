/* gradgate-bench wan: an all-reduce step across K sites over rate-limited
 * (and optionally delayed) links, gradgate against PyTorch's gloo on the
 * same links in the same run.
 *
 * Every site is a network namespace joined to a hub namespace (a Linux
 * bridge) through an edge of its own in the hub: a tbf rate limit on each
 * direction, both past the site's own network stack, so each site has an
 * uplink and a downlink of --rate. Per mode the bench starts a
 * gateway and R `gradgate-bench allreduce` ranks in each site's namespace
 * (or K*R ranks of bench/wan_gloo.py), and reads step times and CPU from
 * the ranks, encoded bytes from the gateways' `stopped` lines and link
 * bytes from the tbf counters. docs/wan-bench.md describes the link model
 * the times are compared with.
 *
 * Whatever ends a run (its end, an error, SIGINT/SIGTERM/SIGHUP, a child
 * that dies), the children are killed and reaped and the namespaces and
 * files removed; every wait has a bound. Children sit in process groups of
 * their own with SIGKILL as parent-death signal, so they cannot outlive
 * this process even when it is killed; the namespaces then stay behind for
 * --cleanup. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "bench.h"
#include "codec.h"
#include "gg_common.h"
#include "units.h"
#include "wire.h"

#define WAN_MAX_SITES 8
#define WAN_MAX_RANKS 8
#define WAN_MAX_SIZES 16
#define WAN_MAX_CODECS 5
#define WAN_MAX_ZSTD 4
#define WAN_MAX_MODES (1 + WAN_MAX_CODECS * 3 * WAN_MAX_ZSTD)
#define WAN_MAX_REPEAT 100
#define WAN_MAX_STEPS 10000
#define WAN_MAX_CHILDREN (WAN_MAX_SITES * WAN_MAX_RANKS + WAN_MAX_SITES + WAN_MAX_SITES * (WAN_MAX_SITES - 1) / 2)
#define WAN_GW_PORT 7100    /* every namespace has ports of its own */
#define WAN_LINK_PORT 7200  /* + the peer's index: linkem towards that peer */
#define WAN_GLOO_PORT 29500 /* + the run's number modulo 1000 */
#define WAN_IFACE "wan0"
#define WAN_JOB "wan"
#define WAN_TBF_LATENCY_MS 5
/* A 64 KiB GSO packet with 45 segments' headers is about 68 KB: a bucket
 * that holds it keeps tbf from splitting packets into segments. */
#define WAN_TBF_BURST_MIN 72000u
/* The link model: what tbf counts per TCP segment (Ethernet 14 + IPv4 20
 * + TCP 20 + timestamps 12) around an MSS of 1500 - 52 bytes, and what a
 * TLS 1.3 record adds (5 header, 1 content type, 16 tag) to 16 KiB. */
#define WAN_MSS 1448
#define WAN_SEGMENT_HDR 66
#define WAN_TLS_RECORD 16384
#define WAN_TLS_OVERHEAD 22
#define WAN_TEXT_MAX (4u << 20) /* the most read back of a child's output */
#define WAN_TRACE_CAP 4096
#define WAN_QUIET_WAIT_S 1800 /* for a busy host to go quiet, per run */
#define WAN_TRIES 8           /* runs of one mode and size that other processes disturbed */

enum { WAN_OK = 0, WAN_FAILED = 1, WAN_USAGE = 2, WAN_CANNOT = 3 };

struct wan_opts {
	int sites, ranks;
	double rate_bps;
	uint64_t sizes[WAN_MAX_SIZES];
	int nsizes;
	enum gg_codec codecs[WAN_MAX_CODECS];
	int ncodecs;
	const char *algos[3];
	int nalgos;
	int zstd[WAN_MAX_ZSTD];
	int nzstd;
	int steps, warmup, repeat;
	double delay_ms;
	int streams;
	int max_other_pct; /* a run that other processes disturbed more is discarded; 100: keep all */
	uint64_t chunk_bytes;
	bool json, cleanup, no_gloo, prefix_given, python_given, copy;
	const char *plot, *gloo_script, *python, *gradgate, *linkem, *make_certs;
	char prefix[16];
	char congestion[16]; /* the sites' TCP congestion control; empty: the host's */
};

struct mode {
	bool gloo;
	enum gg_codec codec;
	const char *algo;
	int zstd;
	char name[48];
};

/* One run of a mode at one size. */
struct sample {
	double p50_ms, p90_ms;
	double cpu_s_per_gb;
	double wire_bytes; /* payload per step on the busiest link */
	double link_bytes; /* what the busiest tbf counted per step */
	double drops;      /* packets all tbfs dropped per step */
	double hedged;     /* frames all gateways sent once more off a slow stream, per step */
	double other_cpu;  /* share of the host's CPU that other processes used meanwhile */
};

/* A run's measures at its start or end: what the shaped links counted
 * ([0, K) the sites' uplinks, [K, 2K) their downlinks; bytes as tbf counts
 * them, Ethernet, IP and TCP headers included), and the host's CPU next to
 * this bench's own. */
struct snapshot {
	uint64_t bytes[2 * WAN_MAX_SITES];
	uint64_t drops;
	double t, host_busy_s, ours_s;
};

struct cell {
	struct sample s[WAN_MAX_REPEAT];
	int n;
};

enum role { ROLE_GATEWAY, ROLE_LINK, ROLE_RANK, ROLE_GLOO };

struct child {
	pid_t pid;
	enum role role;
	char name[48];
	char out[160], err[160];
	int status;
	bool exited;
};

/* Gateways' CPU seconds over time, for the part that falls in the ranks'
 * timed window; when full, every other sample goes and the spacing
 * doubles. */
struct cpu_trace {
	double t[WAN_TRACE_CAP], cpu[WAN_TRACE_CAP];
	int n;
	double every;
};

static struct {
	struct wan_opts o;
	char ip[256], tc[256], self[4096];
	char dir[96]; /* refused from 80 on: the control sockets live here */
	char hub[32], site[WAN_MAX_SITES][32];
	bool hub_made;
	int sites_made;
	bool tearing_down;
	struct child kids[WAN_MAX_CHILDREN];
	int nkids;
	int step_timeout_s;
	uint64_t tbf_burst;
	char gloo_skip[320]; /* why gloo does not run; empty when it does */
	char congestion[16]; /* the sites' TCP congestion control, as the run reports it */
	double children_cpu_s; /* of every child reaped so far */
	int gloo_runs;         /* each rendezvous on a port of its own */
	struct cpu_trace trace;
} W;

static volatile sig_atomic_t wan_signal;

GG_PRINTF(1, 2) static void say(const char *fmt, ...)
{
	va_list ap;

	fputs("gradgate-bench wan: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void nap_ms(int ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000 };
	nanosleep(&ts, NULL);
}

/* Finds an executable by name in PATH, then in the sbin folders a
 * non-root PATH often lacks. */
static bool find_tool(const char *name, char *path, size_t size)
{
	const char *env = getenv("PATH");
	char dirs[4096];

	snprintf(dirs, sizeof(dirs), "%s:/usr/sbin:/sbin:/usr/bin:/bin", env ? env : "");
	for (char *save, *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
		struct stat st;
		if (*d && (size_t)snprintf(path, size, "%s/%s", d, name) < size && !stat(path, &st) &&
		    S_ISREG(st.st_mode) && !access(path, X_OK))
			return true;
	}
	*path = '\0';
	return false;
}

static void on_signal(int sig)
{
	wan_signal = sig;
}

static bool stop_requested(void)
{
	return wan_signal && !W.tearing_down;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double median(const double *v, int n)
{
	double s[WAN_MAX_REPEAT];

	memcpy(s, v, (size_t)n * sizeof(double));
	qsort(s, (size_t)n, sizeof(double), cmp_double);
	return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

/* Nearest rank: the smallest value with at least p of the values at or below it. */
static double percentile(double *v, int n, double p)
{
	qsort(v, (size_t)n, sizeof(double), cmp_double);
	int k = (int)ceil(p * n) - 1;
	return v[GG_MAX(k, 0)];
}

static double framing_tcp(void)
{
	return (double)(WAN_MSS + WAN_SEGMENT_HDR) / WAN_MSS;
}

static double framing_tls(void)
{
	return (double)(WAN_TLS_RECORD + WAN_TLS_OVERHEAD) / WAN_TLS_RECORD;
}

/* ---- options ---- */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: gradgate-bench wan [options]        (as root: it makes network namespaces)\n"
		"An all-reduce step across K sites, each a network namespace whose link to a hub\n"
		"is rate-limited (tbf) in both directions: gradgate (one gateway and R ranks per site)\n"
		"against PyTorch's gloo (K*R ranks) on the same links, in the same run.\n\n"
		"  --sites K            sites, 2-%d (default 3)\n"
		"  --ranks R            ranks per site, 1-%d (default 2)\n"
		"  --rate RATE          each site's uplink and downlink: 100mbit, 1gbit, 2.5gbit or 2G (default 1gbit)\n"
		"  --delay-ms D         one-way delay between gateways, through linkem (default 0);\n"
		"                       gloo's traffic does not go through linkem\n"
		"  --sizes LIST         fp32 bytes per all-reduce, 4KiB-1GiB (default 64MiB)\n"
		"  --codecs LIST        of fp32, bf16, bf16-split, int8, int4 (default fp32,bf16-split,int8)\n"
		"  --algorithms LIST    of ring, direct, auto (default ring,direct)\n"
		"  --zstd-level LIST    zstd levels, 0 (off) to 19, each its own mode (default 0)\n"
		"  --streams S          TLS streams per peer, 1-64 (default 4)\n"
		"  --chunk SIZE         gateways' chunk size, 4KiB-64MiB (default 1MiB)\n"
		"  --congestion NAME    TCP congestion control in every site, one the kernel has and lets\n"
		"                       namespaces take (net.ipv4.tcp_allowed_congestion_control;\n"
		"                       default: the host's)\n"
		"  --steps T            timed steps, 1-%d (default 10)\n"
		"  --warmup W           untimed steps before them, 0-1000 (default 2); gradgate's\n"
		"                       first step is checked against a float64 sum\n"
		"  --repeat N           runs of every mode, the modes alternating, 1-%d (default 3)\n"
		"  --max-other-cpu PCT  discard a run during which other processes used more than PCT%%\n"
		"                       of the host's CPU, wait for the host to go quiet and run it again;\n"
		"                       of %d such runs the least disturbed stays (default 100: keep\n"
		"                       every run; the column 'other' says how much others took)\n"
		"  --json               one JSON object per mode and size instead of the table\n"
		"  --plot FILE.svg      step time against size, one line per mode (gnuplot)\n"
		"  --no-gloo            leave out the gloo baseline\n"
		"  --copy               gradgate's ranks all-reduce their own memory, copied to and from\n"
		"                       the gateway (default: buffers from gg_buffer_alloc, no copies)\n"
		"  --python PATH        the Python with torch (default /usr/bin/python3)\n"
		"  --gloo-script PATH   wan_gloo.py\n"
		"  --gradgate PATH, --linkem PATH, --make-certs PATH\n"
		"                       the gateway, the link emulator, examples/make-certs.sh\n"
		"                       (default for these four: those of this build tree when run\n"
		"                       from it, else the installed ones)\n"
		"  --prefix NAME        namespace names start with it, a-z0-9 (default ggw<pid>)\n"
		"  --cleanup            remove what runs killed before they could clean up:\n"
		"                       namespaces of --prefix, or of ggw<pid> with <pid> gone\n\n"
		"Exit status: 0 done, 1 a run failed, 2 bad options, 3 cannot run here (privileges,\n"
		"tools, kernel features), 128+N after signal N.\n",
		WAN_MAX_SITES, WAN_MAX_RANKS, WAN_MAX_STEPS, WAN_MAX_REPEAT, WAN_TRIES);
}

/* 1 Mbit/s to 100 Gbit/s, as gg_bench_parse_rate() reads them ("1gbit",
 * "2.5gbit", "100mbit", "2G"); tc is given bits per second. */
static int parse_rate(const char *text, double *bps)
{
	return gg_bench_parse_rate(text, bps) || *bps < 1e6 || *bps > 1e11 ? -EINVAL : 0;
}

/* Splits a comma list into at most max items (in buf); -1 when empty,
 * too long or with an empty item. */
static int split_list(const char *text, char *buf, size_t size, char **items, int max)
{
	int n = 0;
	char *save, *item;

	if (strlen(text) >= size || !*text || text[strlen(text) - 1] == ',' || strstr(text, ",,") || text[0] == ',')
		return -1;
	strcpy(buf, text);
	for (item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
		if (n == max)
			return -1;
		items[n++] = item;
	}
	return n;
}

static bool parse_int(const char *text, long lo, long hi, int *out)
{
	char *end;
	long v = strtol(text, &end, 10);

	if (end == text || *end || v < lo || v > hi)
		return false;
	*out = (int)v;
	return true;
}

/* Item i of the list option opt; false when it is not valid. */
static bool parse_item(int opt, const char *item, int i, struct wan_opts *o)
{
	const char *why;

	switch (opt) {
	case 'S':
		return !gg_parse_size(item, &o->sizes[i], &why) && o->sizes[i] >= (4u << 10) && o->sizes[i] <= (1u << 30) &&
		       o->sizes[i] % 4 == 0;
	case 'x':
		return !gg_codec_from_name(item, &o->codecs[i]);
	case 'a':
		o->algos[i] = !strcmp(item, "ring") ? "ring" : !strcmp(item, "auto") ? "auto" : "direct";
		return !strcmp(item, "ring") || !strcmp(item, "direct") || !strcmp(item, "auto");
	default:
		return parse_int(item, 0, 19, &o->zstd[i]);
	}
}

/* Whether a file may be made or rewritten at `path`; else why, in why. */
static bool writable_path(const char *path, char *why, size_t size)
{
	char dir[PATH_MAX];
	const char *slash = strrchr(path, '/');
	struct stat st;

	if (!stat(path, &st)) {
		if (S_ISDIR(st.st_mode)) {
			snprintf(why, size, "it is a folder");
			return false;
		}
		if (access(path, W_OK)) {
			snprintf(why, size, "%s", strerror(errno));
			return false;
		}
		return true;
	}
	snprintf(dir, sizeof(dir), "%.*s", slash ? (int)(slash - path) + 1 : 1, slash ? path : ".");
	if (stat(dir, &st) || (S_ISDIR(st.st_mode) && access(dir, W_OK | X_OK))) {
		snprintf(why, size, "folder %.200s: %s", dir, strerror(errno));
		return false;
	}
	if (!S_ISDIR(st.st_mode)) {
		snprintf(why, size, "%.200s is not a folder", dir);
		return false;
	}
	return true;
}

/* Whether items i and k of list option opt are the same. */
static bool same_item(int opt, int i, int k, const struct wan_opts *o)
{
	switch (opt) {
	case 'S': return o->sizes[i] == o->sizes[k];
	case 'x': return o->codecs[i] == o->codecs[k];
	case 'a': return !strcmp(o->algos[i], o->algos[k]);
	default: return o->zstd[i] == o->zstd[k];
	}
}

/* The programs and scripts a run starts: those of the build tree this
 * binary was built in while it runs from there, else the installed ones
 * (meson install puts them where GG_WAN_INSTALLED_* say). */
static void wan_default_tools(struct wan_opts *o)
{
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	bool built = n > 0 && (self[n] = 0, !strcmp(self, GG_WAN_BUILT_BENCH));

	o->gradgate = built ? GG_WAN_GRADGATE : GG_WAN_INSTALLED_GRADGATE;
	o->linkem = built ? GG_WAN_LINKEM : GG_WAN_INSTALLED_LINKEM;
	o->make_certs = built ? GG_WAN_MAKE_CERTS : GG_WAN_INSTALLED_MAKE_CERTS;
	o->gloo_script = built ? GG_WAN_GLOO_SCRIPT : GG_WAN_INSTALLED_GLOO_SCRIPT;
}

#define CC_AVAILABLE "/proc/sys/net/ipv4/tcp_available_congestion_control"
#define CC_ALLOWED "/proc/sys/net/ipv4/tcp_allowed_congestion_control"
#define CC_CURRENT "/proc/sys/net/ipv4/tcp_congestion_control"

/* The first line of a /proc file into buf, newline dropped; false when
 * unreadable. */
static bool proc_line(const char *path, char *buf, size_t size)
{
	FILE *f = fopen(path, "r");
	bool ok = f && fgets(buf, (int)size, f);

	if (f)
		fclose(f);
	if (ok)
		buf[strcspn(buf, "\n")] = '\0';
	return ok;
}

/* Whether the space-separated list in /proc file `path` holds `name`;
 * the list goes into list[size] (empty when unreadable). */
static bool proc_list_has(const char *path, const char *name, char *list, size_t size)
{
	char copy[512];

	if (!proc_line(path, list, size))
		*list = '\0';
	snprintf(copy, sizeof(copy), "%s", list);
	for (char *save = NULL, *t = strtok_r(copy, " \t", &save); t; t = strtok_r(NULL, " \t", &save))
		if (!strcmp(t, name))
			return true;
	return false;
}

/* Whether the sites' namespaces may use congestion control `name`: the
 * kernel must have it, and a namespace other than the host's may only
 * take one of net.ipv4.tcp_allowed_congestion_control. Says why not. */
static bool congestion_usable(const char *name)
{
	char list[512];

	if (!proc_list_has(CC_AVAILABLE, name, list, sizeof(list))) {
		say("--congestion: this kernel has no '%s' (it has: %s; modprobe tcp_%s may add it)", name,
		    *list ? list : "?", name);
		return false;
	}
	if (!proc_list_has(CC_ALLOWED, name, list, sizeof(list))) {
		say("--congestion: '%s' is not in net.ipv4.tcp_allowed_congestion_control (%s), the ones a network "
		    "namespace may take; add it with sysctl -w net.ipv4.tcp_allowed_congestion_control=\"%s%s%s\"",
		    name, list, list, *list ? " " : "", name);
		return false;
	}
	return true;
}

static int parse_opts(int argc, char **argv, struct wan_opts *o)
{
	static const struct option lopts[] = {
		{ "sites", required_argument, NULL, 'k' },	{ "ranks", required_argument, NULL, 'r' },
		{ "rate", required_argument, NULL, 'R' },	{ "delay-ms", required_argument, NULL, 'd' },
		{ "sizes", required_argument, NULL, 'S' },	{ "codecs", required_argument, NULL, 'x' },
		{ "algorithms", required_argument, NULL, 'a' }, { "zstd-level", required_argument, NULL, 'z' },
		{ "streams", required_argument, NULL, 's' },	{ "chunk", required_argument, NULL, 'C' },
		{ "steps", required_argument, NULL, 't' },	{ "warmup", required_argument, NULL, 'w' },
		{ "repeat", required_argument, NULL, 'n' },	{ "json", no_argument, NULL, 'J' },
		{ "plot", required_argument, NULL, 'P' },	{ "no-gloo", no_argument, NULL, 'G' },
		{ "python", required_argument, NULL, 'y' },	{ "gloo-script", required_argument, NULL, 'g' },
		{ "gradgate", required_argument, NULL, 'D' },	{ "linkem", required_argument, NULL, 'L' },
		{ "make-certs", required_argument, NULL, 'M' }, { "prefix", required_argument, NULL, 'p' },
		{ "cleanup", no_argument, NULL, 'c' },		{ "max-other-cpu", required_argument, NULL, 'o' },
		{ "copy", no_argument, NULL, 'Y' },		{ "congestion", required_argument, NULL, 'T' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	char buf[512], *items[WAN_MAX_SIZES + 1];
	int c, n;

	*o = (struct wan_opts){
		.sites = 3, .ranks = 2, .rate_bps = 1e9, .sizes = { 64u << 20 }, .nsizes = 1,
		.codecs = { GG_CODEC_FP32, GG_CODEC_BF16_SPLIT, GG_CODEC_INT8 }, .ncodecs = 3,
		.algos = { "ring", "direct" }, .nalgos = 2, .nzstd = 1, .steps = 10, .warmup = 2, .repeat = 3,
		.streams = 4, .max_other_pct = 100, .chunk_bytes = 1u << 20, .python = "/usr/bin/python3",
	};
	wan_default_tools(o);
	snprintf(o->prefix, sizeof(o->prefix), "ggw%d", (int)getpid());
	const struct {
		int opt;
		const char *name;
		long lo, hi;
		int *dst;
	} ints[] = {
		{ 'k', "--sites", 2, WAN_MAX_SITES, &o->sites },   { 'r', "--ranks", 1, WAN_MAX_RANKS, &o->ranks },
		{ 't', "--steps", 1, WAN_MAX_STEPS, &o->steps },   { 'w', "--warmup", 0, 1000, &o->warmup },
		{ 'n', "--repeat", 1, WAN_MAX_REPEAT, &o->repeat }, { 's', "--streams", 1, 64, &o->streams },
		{ 'o', "--max-other-cpu", 1, 100, &o->max_other_pct },
	};
	const struct {
		int opt;
		const char *name, *rule;
		int max, *n;
	} lists[] = {
		{ 'S', "--sizes", "a size of 4KiB to 1GiB in whole float32s", WAN_MAX_SIZES, &o->nsizes },
		{ 'x', "--codecs", "a codec: fp32, bf16, bf16-split, int8 or int4", WAN_MAX_CODECS, &o->ncodecs },
		{ 'a', "--algorithms", "ring, direct or auto", 3, &o->nalgos },
		{ 'z', "--zstd-level", "a level of 0 (off) to 19", WAN_MAX_ZSTD, &o->nzstd },
	};

	optind = 1;
	int li = -1;
	const char *other = NULL; /* the first option given beside --cleanup's --prefix */
	while ((c = getopt_long(argc, argv, ":h", lopts, &li)) != -1) {
		size_t k;
		if (c != 'c' && c != 'p' && c != 'h' && c != '?' && li >= 0 && !other)
			other = lopts[li].name;
		li = -1;
		for (k = 0; k < GG_ARRAY_LEN(ints) && ints[k].opt != c; k++)
			;
		if (k < GG_ARRAY_LEN(ints)) {
			if (!parse_int(optarg, ints[k].lo, ints[k].hi, ints[k].dst)) {
				say("%s must be %ld to %ld, not '%s'", ints[k].name, ints[k].lo, ints[k].hi, optarg);
				return WAN_USAGE;
			}
			continue;
		}
		for (k = 0; k < GG_ARRAY_LEN(lists) && lists[k].opt != c; k++)
			;
		if (k < GG_ARRAY_LEN(lists)) {
			if ((n = split_list(optarg, buf, sizeof(buf), items, lists[k].max)) < 0) {
				say("%s wants 1 to %d items separated by commas, not '%s'", lists[k].name, lists[k].max, optarg);
				return WAN_USAGE;
			}
			for (int i = 0; i < n; i++) {
				if (!parse_item(c, items[i], i, o)) {
					say("%s: '%s' is not %s", lists[k].name, items[i], lists[k].rule);
					return WAN_USAGE;
				}
				/* Twice would run every mode of it twice. */
				for (int e = 0; e < i; e++)
					if (same_item(c, i, e, o)) {
						say("%s: '%s' repeats '%s' in '%s'", lists[k].name, items[i], items[e], optarg);
						return WAN_USAGE;
					}
			}
			*lists[k].n = n;
			continue;
		}
		switch (c) {
		case 'R':
			if (parse_rate(optarg, &o->rate_bps)) {
				say("--rate wants 1mbit to 100gbit, such as 100mbit, 1gbit, 2.5gbit or 2G, not '%s'", optarg);
				return WAN_USAGE;
			}
			break;
		case 'd': {
			char *end;
			o->delay_ms = strtod(optarg, &end);
			if (end == optarg || *end || !(o->delay_ms >= 0 && o->delay_ms <= 10000)) {
				say("--delay-ms must be 0 to 10000, not '%s'", optarg);
				return WAN_USAGE;
			}
			break;
		}
		case 'C':
			if (gg_bench_size("wan", "--chunk", optarg, 4u << 10, 64u << 20, sizeof(float), &o->chunk_bytes))
				return WAN_USAGE;
			break;
		case 'T':
			if (!*optarg || strlen(optarg) > 15 ||
			    strspn(optarg, "abcdefghijklmnopqrstuvwxyz0123456789_") != strlen(optarg)) {
				say("--congestion wants a congestion control's name (1 to 15 of a-z 0-9 _), not '%s'",
				    optarg);
				return WAN_USAGE;
			}
			snprintf(o->congestion, sizeof(o->congestion), "%s", optarg);
			break;
		case 'p':
			if (strlen(optarg) < 1 || strlen(optarg) > 12 || optarg[0] < 'a' || optarg[0] > 'z' ||
			    strspn(optarg, "abcdefghijklmnopqrstuvwxyz0123456789") != strlen(optarg)) {
				say("--prefix wants 1 to 12 of a-z 0-9, starting with a letter, not '%s'", optarg);
				return WAN_USAGE;
			}
			snprintf(o->prefix, sizeof(o->prefix), "%s", optarg);
			o->prefix_given = true;
			break;
		case 'P':
			/* It goes into gnuplot's script between single quotes. */
			if (strlen(optarg) < 5 || strcmp(optarg + strlen(optarg) - 4, ".svg") || strchr(optarg, '\'') ||
			    strchr(optarg, '\n')) {
				say("--plot wants an SVG file name, FILE.svg, without quotes or newlines, not '%s'", optarg);
				return WAN_USAGE;
			}
			/* Found now, not once every run is over. */
			if (!writable_path(optarg, buf, sizeof(buf))) {
				say("--plot %s: cannot write there: %s", optarg, buf);
				return WAN_USAGE;
			}
			o->plot = optarg;
			break;
		case 'J': o->json = true; break;
		case 'G': o->no_gloo = true; break;
		case 'Y': o->copy = true; break;
		case 'c': o->cleanup = true; break;
		case 'y':
			o->python = optarg;
			o->python_given = true;
			break;
		case 'g': o->gloo_script = optarg; break;
		case 'D': o->gradgate = optarg; break;
		case 'L': o->linkem = optarg; break;
		case 'M': o->make_certs = optarg; break;
		case 'h': usage(stdout); exit(0);
		default: return gg_bench_bad_option("wan", c, argv);
		}
	}
	if (optind < argc) {
		say("unexpected argument '%s' (see --help)", argv[optind]);
		return WAN_USAGE;
	}
	/* A run's options with it would read as if they changed what it
	 * removes, or as if a run followed. */
	if (o->cleanup && other) {
		say("--cleanup takes --prefix only, not --%s: it removes what killed runs left, and runs nothing", other);
		return WAN_USAGE;
	}
	return WAN_OK;
}

/* ---- processes ---- */

static int open_out(const char *path)
{
	return path ? open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600) : open("/dev/null", O_WRONLY | O_CLOEXEC);
}

/* Starts argv (argv[0] a path) in network namespace ns (NULL: this one)
 * with stdin from /dev/null, stdout and stderr on fd_out and fd_err, and
 * env ("NAME=VALUE") added when not NULL. Returns the pid or -errno. */
static pid_t spawn(const char *ns, const char *const argv[], int fd_out, int fd_err, const char *env)
{
	const char *full[48];
	size_t n = 0;

	if (ns) {
		full[n++] = W.ip;
		full[n++] = "netns";
		full[n++] = "exec";
		full[n++] = ns;
	}
	for (size_t i = 0; argv[i]; i++) {
		if (n + 1 >= GG_ARRAY_LEN(full))
			return -E2BIG;
		full[n++] = argv[i];
	}
	full[n] = NULL;
	fflush(NULL);
	pid_t parent = getpid(), pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		setpgid(0, 0);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		signal(SIGPIPE, SIG_DFL); /* an ignored signal stays ignored across exec */
		int in = open("/dev/null", O_RDONLY | O_CLOEXEC);
		if (in < 0 || dup2(in, 0) < 0 || dup2(fd_out, 1) < 0 || dup2(fd_err, 2) < 0)
			_exit(127);
		if (env)
			putenv((char *)env);
		execv(full[0], (char *const *)full);
		dprintf(2, "cannot run %s: %s\n", full[0], strerror(errno));
		_exit(127);
	}
	setpgid(pid, pid); /* also here: a signal to the group must not race the child's own call */
	return pid;
}

/* waitpid() that adds the child's CPU to what this bench's children used. */
static pid_t reap(pid_t pid, int *status, int flags)
{
	struct rusage ru;
	pid_t r = wait4(pid, status, flags, &ru);

	if (r == pid)
		W.children_cpu_s += (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
				    (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
	return r;
}

static void describe_status(int status, char *buf, size_t size)
{
	if (WIFEXITED(status))
		snprintf(buf, size, "exited with status %d", WEXITSTATUS(status));
	else if (WIFSIGNALED(status))
		snprintf(buf, size, "was killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
	else
		snprintf(buf, size, "ended with wait status %#x", status);
}

/* Runs a short command to its end, at most timeout_s. Returns its exit
 * status (128 + N when signal N ended it), -ETIMEDOUT, -EINTR when this
 * process was asked to stop, or -errno when it could not start. What it
 * printed on either stream lands in text (the first size - 1 bytes; the
 * rest is read and dropped), without the final newline. */
static int run_tool(const char *const argv[], double timeout_s, char *text, size_t size)
{
	int fds[2], status, rc;
	size_t used = 0;
	char sink[4096];

	if (pipe2(fds, O_CLOEXEC))
		return -errno;
	pid_t pid = spawn(NULL, argv, fds[1], fds[1], NULL);
	close(fds[1]);
	if (pid < 0) {
		close(fds[0]);
		return (int)pid;
	}
	double until = now_s() + timeout_s;
	for (bool eof = false; !eof;) {
		if (stop_requested() || now_s() > until)
			goto kill;
		struct pollfd p = { .fd = fds[0], .events = POLLIN };
		if (poll(&p, 1, 20) <= 0)
			continue;
		bool keep = used + 1 < size;
		ssize_t r = read(fds[0], keep ? text + used : sink, keep ? size - 1 - used : sizeof(sink));
		if (r > 0 && keep)
			used += (size_t)r;
		eof = r == 0 || (r < 0 && errno != EINTR);
	}
	while ((rc = (int)reap(pid, &status, WNOHANG)) == 0) {
		if (stop_requested() || now_s() > until)
			goto kill;
		nap_ms(2);
	}
	close(fds[0]);
	if (size) {
		while (used && text[used - 1] == '\n')
			used--;
		text[used] = '\0';
	}
	if (rc < 0)
		return -ECHILD;
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
kill:
	kill(-pid, SIGKILL);
	reap(pid, &status, 0);
	close(fds[0]);
	if (size)
		text[used] = '\0';
	return stop_requested() ? -EINTR : -ETIMEDOUT;
}

/* Runs `prog args... NULL` for the set-up; on failure says what could not
 * be done, the command and what it printed. */
static int setup_cmd(const char *what, const char *prog, ...)
{
	const char *argv[24];
	char out[512], cmd[512];
	size_t n = 0, len = 0;
	va_list ap;

	argv[n++] = prog;
	va_start(ap, prog);
	for (const char *a; n + 1 < GG_ARRAY_LEN(argv) && (a = va_arg(ap, const char *));)
		argv[n++] = a;
	va_end(ap);
	argv[n] = NULL;
	int rc = run_tool(argv, 10, out, sizeof(out));
	if (!rc || rc == -EINTR)
		return rc;
	for (size_t i = 0; i < n && len < sizeof(cmd); i++)
		len += (size_t)snprintf(cmd + len, sizeof(cmd) - len, "%s%s", i ? " " : "", argv[i]);
	if (rc > 0)
		say("cannot %s: `%s` failed: %s", what, cmd, *out ? out : "(no message)");
	else
		say("cannot %s: `%s`: %s", what, cmd, strerror(-rc));
	return -EIO;
}

/* The text of a file, or its last `max` bytes; NULL when unreadable. */
static char *read_text(const char *path, size_t max)
{
	FILE *f = fopen(path, "r");
	char *text = NULL;

	if (!f)
		return NULL;
	if (!fseek(f, 0, SEEK_END)) {
		long end = ftell(f);
		long from = end > (long)max ? end - (long)max : 0;
		if (end >= 0 && !fseek(f, from, SEEK_SET) && (text = malloc((size_t)(end - from) + 1))) {
			size_t n = fread(text, 1, (size_t)(end - from), f);
			text[n] = '\0';
		}
	}
	fclose(f);
	return text;
}

static bool file_has(const char *path, const char *needle)
{
	char *text = read_text(path, WAN_TEXT_MAX);
	bool found = text && strstr(text, needle);

	free(text);
	return found;
}

/* The last `lines` lines of a file, each on a line of its own and
 * indented, for a message. */
static void tail_lines(const char *path, int lines, char *out, size_t size)
{
	char *text = read_text(path, 64 << 10);
	size_t n = text ? strlen(text) : 0, from, used;

	while (n && text[n - 1] == '\n')
		n--;
	for (from = n; from > 0; from--)
		if (text[from - 1] == '\n' && --lines == 0)
			break;
	if (!n) {
		snprintf(out, size, " (nothing)");
		free(text);
		return;
	}
	used = (size_t)snprintf(out, size, "\n    ");
	for (size_t i = from; i < n && used + 5 < size; i++) {
		out[used++] = text[i];
		if (text[i] == '\n') {
			memcpy(out + used, "    ", 4);
			used += 4;
		}
	}
	out[used] = '\0';
	free(text);
}

/* ---- the children of one run ---- */

/* Starts a child of the current run; its output goes to DIR/TAG.out and
 * DIR/TAG.err. */
static struct child *child_start(enum role role, const char *name, const char *tag, const char *ns,
				 const char *const argv[], const char *env)
{
	if (W.nkids == WAN_MAX_CHILDREN) {
		say("more than %d processes in one run", WAN_MAX_CHILDREN);
		return NULL;
	}
	struct child *k = &W.kids[W.nkids];
	*k = (struct child){ .role = role };
	snprintf(k->name, sizeof(k->name), "%s", name);
	snprintf(k->out, sizeof(k->out), "%s/%s.out", W.dir, tag);
	snprintf(k->err, sizeof(k->err), "%s/%s.err", W.dir, tag);
	int fo = open_out(k->out), fe = open_out(k->err);
	pid_t pid = fo < 0 || fe < 0 ? -errno : spawn(ns, argv, fo, fe, env);
	if (fo >= 0)
		close(fo);
	if (fe >= 0)
		close(fe);
	if (pid < 0) {
		say("cannot start %s: %s", name, strerror((int)-pid));
		return NULL;
	}
	k->pid = pid;
	W.nkids++;
	return k;
}

/* Reaps the children that exited, without waiting. */
static void reap_exited(void)
{
	for (int i = 0; i < W.nkids; i++) {
		struct child *k = &W.kids[i];
		if (k->pid > 0 && !k->exited && reap(k->pid, &k->status, WNOHANG) == k->pid)
			k->exited = true;
	}
}

/* Signals the children of `role` (-1: all), waits up to grace_s for them
 * to exit, then kills and reaps what is left. Returns how many had to be
 * killed. */
static int stop_children(int role, int sig, double grace_s)
{
	int killed = 0;

	for (int i = 0; i < W.nkids; i++)
		if (W.kids[i].pid > 0 && !W.kids[i].exited && (role < 0 || (int)W.kids[i].role == role))
			kill(-W.kids[i].pid, sig);
	for (double until = now_s() + grace_s;; nap_ms(10)) {
		bool left = false;
		reap_exited();
		for (int i = 0; i < W.nkids; i++)
			left |= W.kids[i].pid > 0 && !W.kids[i].exited && (role < 0 || (int)W.kids[i].role == role);
		if (!left || now_s() > until)
			break;
	}
	for (int i = 0; i < W.nkids; i++) {
		struct child *k = &W.kids[i];
		if (k->pid > 0 && !k->exited && (role < 0 || (int)k->role == role)) {
			kill(-k->pid, SIGKILL);
			reap(k->pid, &k->status, 0);
			k->exited = true;
			killed++;
		}
	}
	return killed;
}

/* Ends the run's children (all of them, at once) and forgets them. */
static void children_end(void)
{
	stop_children(-1, SIGKILL, 5);
	W.nkids = 0;
}

static void report_child(const struct child *k, const char *when)
{
	char how[96], tail[1200];

	describe_status(k->status, how, sizeof(how));
	tail_lines(k->err, 6, tail, sizeof(tail));
	say("%s %s%s%s; the end of its output:%s", k->name, how, *when ? " " : "", when, tail);
}

static void report_no_result(const struct child *k)
{
	char out[1200], err[1200];

	tail_lines(k->out, 3, out, sizeof(out));
	tail_lines(k->err, 6, err, sizeof(err));
	say("%s printed no complete result; its output:%s\n  and its errors:%s", k->name, out, err);
}

/* CPU seconds of all threads of pid so far (the scheduler's, to the
 * nanosecond); 0 when it is gone. */
static double proc_cpu_s(pid_t pid)
{
	char path[64];
	double sum = 0;
	struct dirent *e;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	DIR *d = opendir(path);
	if (!d)
		return 0;
	while ((e = readdir(d))) {
		char stat_path[300];
		unsigned long long ns;
		if (e->d_name[0] == '.')
			continue;
		snprintf(stat_path, sizeof(stat_path), "/proc/%d/task/%s/schedstat", (int)pid, e->d_name);
		FILE *f = fopen(stat_path, "r");
		if (f && fscanf(f, "%llu", &ns) == 1)
			sum += (double)ns * 1e-9;
		if (f)
			fclose(f);
	}
	closedir(d);
	return sum;
}

static void trace_add(struct cpu_trace *tr, bool force)
{
	double t = now_s(), cpu = 0;

	if (!force && tr->n && t - tr->t[tr->n - 1] < tr->every)
		return;
	for (int i = 0; i < W.nkids; i++)
		if (W.kids[i].role == ROLE_GATEWAY && !W.kids[i].exited)
			cpu += proc_cpu_s(W.kids[i].pid);
	if (tr->n == WAN_TRACE_CAP) {
		for (int i = 0; i < WAN_TRACE_CAP / 2; i++) {
			tr->t[i] = tr->t[2 * i];
			tr->cpu[i] = tr->cpu[2 * i];
		}
		tr->n = WAN_TRACE_CAP / 2;
		tr->every *= 2;
	}
	tr->t[tr->n] = t;
	tr->cpu[tr->n++] = cpu;
}

/* The gateways' CPU seconds at time t, between the samples around it. */
static double trace_at(const struct cpu_trace *tr, double t)
{
	if (t <= tr->t[0])
		return tr->cpu[0];
	for (int i = 1; i < tr->n; i++)
		if (t <= tr->t[i])
			return tr->cpu[i - 1] +
			       (tr->cpu[i] - tr->cpu[i - 1]) * (t - tr->t[i - 1]) / GG_MAX(tr->t[i] - tr->t[i - 1], 1e-9);
	return tr->cpu[tr->n - 1];
}

/* Polls, at most bound_s, until every child of `role` is done: printed
 * `needle` (in .out, or .err for gateways, which log there) or, with
 * needle NULL, exited with status 0. Every other exit fails the wait.
 * Samples the gateways' CPU into tr when given. */
static int wait_children(enum role role, const char *needle, double bound_s, struct cpu_trace *tr, const char *when)
{
	bool done[WAN_MAX_CHILDREN] = { false };

	for (double until = now_s() + bound_s;; nap_ms(10)) {
		bool left = false;
		reap_exited();
		for (int i = 0; i < W.nkids; i++) {
			struct child *k = &W.kids[i];
			bool mine = k->role == role;
			if (k->exited && !(mine && !needle && k->status == 0)) {
				report_child(k, when);
				return -EIO;
			}
			if (mine && !done[i])
				left |= !(done[i] = needle ? file_has(role == ROLE_GATEWAY ? k->err : k->out, needle) : k->exited);
		}
		if (tr)
			trace_add(tr, false);
		if (!left)
			return 0;
		if (stop_requested())
			return -EINTR;
		if (now_s() > until) {
			for (int i = 0; i < W.nkids; i++)
				if (W.kids[i].role == role && !done[i])
					say("%s %s%s%s within %.0f s", W.kids[i].name, needle ? "printed no '" : "did not finish",
					    needle ? needle : "", needle ? "'" : "", bound_s);
			return -ETIMEDOUT;
		}
	}
}

/* ---- topology ---- */

/* Sets the TCP congestion control of network namespace `ns` to `name`:
 * a child joins it and writes its /proc/sys/net, which follows the
 * writer's namespace. */
static int netns_congestion(const char *ns, const char *name)
{
	char path[64];
	int status = 0;

	snprintf(path, sizeof(path), "/run/netns/%s", ns);
	pid_t pid = fork();
	if (pid == 0) {
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd >= 0 && !setns(fd, CLONE_NEWNET)) {
			int f = open(CC_CURRENT, O_WRONLY | O_CLOEXEC);
			if (f >= 0 && write(f, name, strlen(name)) == (ssize_t)strlen(name))
				_exit(0);
		}
		_exit(errno > 0 && errno < 125 ? errno : 125); /* its exit status: the errno */
	}
	pid_t got;
	while ((got = pid < 0 ? -1 : waitpid(pid, &status, 0)) < 0 && errno == EINTR)
		; /* the child takes microseconds: a signal is seen after it */
	if (got != pid || !WIFEXITED(status) || WEXITSTATUS(status)) {
		say("cannot set the TCP congestion control of %s to %s: %s", ns, name,
		    got != pid ? strerror(errno) : !WIFEXITED(status) ? "the child died" : strerror(WEXITSTATUS(status)));
		return -EIO;
	}
	return 0;
}

static int topology_up(void)
{
	const struct wan_opts *o = &W.o;
	char rate[32], burst[32], latency[16];

	snprintf(rate, sizeof(rate), "%.0fbit", o->rate_bps);
	snprintf(burst, sizeof(burst), "%llu", (unsigned long long)W.tbf_burst);
	snprintf(latency, sizeof(latency), "%dms", WAN_TBF_LATENCY_MS);
	if (setup_cmd("make the hub's network namespace", W.ip, "netns", "add", W.hub, NULL))
		return -EIO;
	W.hub_made = true;
	if (setup_cmd("bring up loopback in the hub", W.ip, "-n", W.hub, "link", "set", "lo", "up", NULL) ||
	    setup_cmd("make the hub's Linux bridge (CONFIG_BRIDGE)", W.ip, "-n", W.hub, "link", "add", "br0", "type",
		      "bridge", NULL) ||
	    setup_cmd("bring the hub's bridge up", W.ip, "-n", W.hub, "link", "set", "br0", "up", NULL))
		return -EIO;
	for (int i = 0; i < o->sites; i++) {
		char hub_end[16], edge[16], up[16], wan[16], addr[32];
		snprintf(hub_end, sizeof(hub_end), "s%d", i);
		snprintf(edge, sizeof(edge), "e%d", i);
		snprintf(up, sizeof(up), "u%d", i);
		snprintf(wan, sizeof(wan), "w%d", i);
		snprintf(addr, sizeof(addr), "10.77.0.%d/24", i + 1);
		if (setup_cmd("make a site's network namespace", W.ip, "netns", "add", W.site[i], NULL))
			return -EIO;
		W.sites_made = i + 1;
		if (setup_cmd("bring up loopback in a site", W.ip, "-n", W.site[i], "link", "set", "lo", "up", NULL) ||
		    setup_cmd("make a veth pair (CONFIG_VETH)", W.ip, "link", "add", WAN_IFACE, "netns", W.site[i], "type",
			      "veth", "peer", "name", hub_end, "netns", W.hub, NULL) ||
		    (*o->congestion && netns_congestion(W.site[i], o->congestion)) ||
		    setup_cmd("make a site's edge bridge in the hub", W.ip, "-n", W.hub, "link", "add", edge, "type",
			      "bridge", NULL) ||
		    setup_cmd("bring a site's edge bridge up", W.ip, "-n", W.hub, "link", "set", edge, "up", NULL) ||
		    setup_cmd("make a site's uplink veth pair in the hub", W.ip, "-n", W.hub, "link", "add", up, "type",
			      "veth", "peer", "name", wan, NULL) ||
		    setup_cmd("attach a veth to a site's edge bridge", W.ip, "-n", W.hub, "link", "set", hub_end,
			      "master", edge, "up", NULL) ||
		    setup_cmd("attach a veth to a site's edge bridge", W.ip, "-n", W.hub, "link", "set", up, "master",
			      edge, "up", NULL) ||
		    setup_cmd("attach a veth to the hub's bridge", W.ip, "-n", W.hub, "link", "set", wan, "master",
			      "br0", "up", NULL) ||
		    setup_cmd("address a site", W.ip, "-n", W.site[i], "addr", "add", addr, "dev", WAN_IFACE, NULL) ||
		    setup_cmd("bring a site's veth up", W.ip, "-n", W.site[i], "link", "set", WAN_IFACE, "up", NULL) ||
		    setup_cmd("rate-limit a site's uplink with tbf (sch_tbf)", W.tc, "-n", W.hub, "qdisc", "add", "dev",
			      up, "root", "tbf", "rate", rate, "burst", burst, "latency", latency, NULL) ||
		    setup_cmd("rate-limit a site's downlink with tbf (sch_tbf)", W.tc, "-n", W.hub, "qdisc", "add", "dev",
			      hub_end, "root", "tbf", "rate", rate, "burst", burst, "latency", latency, NULL))
			return -EIO;
	}
	return 0;
}

static int netns_delete(const char *ns)
{
	return setup_cmd("remove a network namespace", W.ip, "netns", "delete", ns, NULL);
}

static void topology_down(void)
{
	for (int i = W.sites_made; i-- > 0;)
		netns_delete(W.site[i]);
	W.sites_made = 0;
	if (W.hub_made)
		netns_delete(W.hub);
	W.hub_made = false;
}

/* CPU seconds the host's processes used so far, all cores (user, nice
 * and system time in /proc/stat; interrupts and softirqs left out). */
static double host_busy_s(void)
{
	unsigned long long user = 0, nice = 0, sys = 0;
	FILE *f = fopen("/proc/stat", "r");

	if (f && fscanf(f, "cpu %llu %llu %llu", &user, &nice, &sys) != 3)
		user = nice = sys = 0;
	if (f)
		fclose(f);
	return (double)(user + nice + sys) / (double)sysconf(_SC_CLK_TCK);
}

static double self_cpu_s(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

/* Takes a run's measures at its start or end: what the shaped links
 * counted, and the host's CPU next to this bench's own. */
static int snapshot(struct snapshot *sn)
{
	sn->drops = 0;
	for (int d = 0; d < 2 * W.o.sites; d++) {
		char dev[16], out[2048];
		int site = d % W.o.sites;
		snprintf(dev, sizeof(dev), d < W.o.sites ? "u%d" : "s%d", site);
		const char *argv[] = { W.tc, "-s", "-n", W.hub, "qdisc", "show", "dev", dev, NULL };
		int rc = run_tool(argv, 10, out, sizeof(out));
		const char *sent = strstr(out, " Sent ");
		unsigned long long bytes, packets, drops;
		if (rc || !sent || sscanf(sent, " Sent %llu bytes %llu pkt (dropped %llu", &bytes, &packets, &drops) != 3) {
			if (rc != -EINTR)
				say("cannot read the tbf counters of %s in %s: %s", argv[7], argv[3], rc ? "tc failed" : out);
			return rc == -EINTR ? rc : -EIO;
		}
		sn->bytes[d] = bytes;
		sn->drops += drops;
	}
	sn->t = now_s();
	sn->host_busy_s = host_busy_s();
	sn->ours_s = W.children_cpu_s + self_cpu_s();
	return 0;
}

/* The link measures of a sample, from a run's snapshots around `steps`. */
static void link_measures(const struct snapshot *a, const struct snapshot *b, double steps, struct sample *out)
{
	uint64_t most = 0;
	long cores = sysconf(_SC_NPROCESSORS_ONLN);

	for (int d = 0; d < 2 * W.o.sites; d++)
		most = GG_MAX(most, b->bytes[d] - a->bytes[d]);
	out->link_bytes = (double)most / steps;
	out->drops = (double)(b->drops - a->drops) / steps;
	out->other_cpu = GG_MAX(0.0, (b->host_busy_s - a->host_busy_s) - (b->ours_s - a->ours_s)) /
			 ((b->t - a->t) * (double)GG_MAX(cores, 1));
}

/* ---- one run of a mode ---- */

static int write_config(const struct mode *m, uint64_t size, int i)
{
	const struct wan_opts *o = &W.o;
	char path[320];

	snprintf(path, sizeof(path), "%s/site-%d.toml", W.dir, i);
	/* 0600 whatever the umask: a gateway refuses a config others may write. */
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
	if (!f) {
		const int e = errno;
		if (fd >= 0)
			close(fd);
		say("cannot write %s: %s", path, strerror(e));
		return -e;
	}
	fprintf(f,
		"[site]\nname = \"site-%d\"\nlisten = \"10.77.0.%d:%d\"\ncontrol = \"unix:%s/site-%d.sock\"\n\n"
		"[tls]\nca = \"certs/ca.pem\"\ncert = \"certs/site-%d.pem\"\nkey = \"certs/site-%d.key\"\n\n",
		i, i + 1, WAN_GW_PORT, W.dir, i, i, i);
	for (int j = 0; j < o->sites; j++) {
		if (j == i)
			continue;
		/* The site that sorts first dials, and the one with the delay reaches
		 * the other through its linkem: every stream crosses it. */
		fprintf(f, "[[peers]]\nsite = \"site-%d\"\nidentity = \"dns:site-%d.gradgate.test\"\ndial = \"%s\"\n", j, j,
			i < j ? "out" : "in");
		if (i < j && o->delay_ms > 0)
			fprintf(f, "address = \"127.0.0.1:%d\"\n\n", WAN_LINK_PORT + j);
		else
			fprintf(f, "address = \"10.77.0.%d:%d\"\n\n", j + 1, WAN_GW_PORT);
	}
	fprintf(f,
		"[transport]\nstreams_per_peer = %d\nchunk_size = %llu\nstep_timeout = \"%ds\"\n"
		"heartbeat_timeout = \"30s\"\nreconnect_max = \"1s\"\n\n"
		"[compression]\ncodec = \"%s\"\nzstd_level = %d\n\n[allreduce]\nalgorithm = \"%s\"\n\n"
		"[limits]\nmemory = %llu\nmax_message = %llu\n",
		o->streams, (unsigned long long)o->chunk_bytes, W.step_timeout_s, gg_codec_name(m->codec), m->zstd,
		m->algo, (unsigned long long)((4ull << 30) + 8 * size), (unsigned long long)GG_MAX(size, 2ull << 30));
	if (fclose(f)) {
		say("cannot write %s: %s", path, strerror(errno));
		return -EIO;
	}
	return 0;
}

static bool json_number(const char *js, const char *key, double *v)
{
	char pat[64];
	snprintf(pat, sizeof(pat), "\"%s\":", key);
	const char *p = strstr(js, pat);
	char *end;

	if (!p)
		return false;
	*v = strtod(p + strlen(pat), &end);
	return end != p + strlen(pat);
}

/* The numbers of "key":[...]; -1 when absent or longer than max. */
static int json_numbers(const char *js, const char *key, double *v, int max)
{
	char pat[64];
	snprintf(pat, sizeof(pat), "\"%s\":[", key);
	const char *p = strstr(js, pat);
	int n = 0;

	if (!p)
		return -1;
	for (p += strlen(pat); *p != ']'; n++) {
		char *end;
		if (n == max)
			return -1;
		v[n] = strtod(p, &end);
		if (end == p)
			return -1;
		p = end + (*end == ',');
	}
	return n;
}

static int parse_stopped(const struct child *k, double *wire_per_step, double *hedged, double *steps)
{
	char *log = read_text(k->err, WAN_TEXT_MAX), tail[1200];
	const char *line = log ? strstr(log, "event=stopped ") : NULL;
	const char *st = line ? strstr(line, " steps_done=") : NULL, *wb = line ? strstr(line, " wire_bytes_out=") : NULL;
	const char *hf = line ? strstr(line, " hedged_frames=") : NULL;
	unsigned long long done = 0, wire = 0, copies = 0;
	bool ok = st && wb && hf && sscanf(st, " steps_done=%llu", &done) == 1 &&
		  sscanf(wb, " wire_bytes_out=%llu", &wire) == 1 && sscanf(hf, " hedged_frames=%llu", &copies) == 1 &&
		  done > 0;

	free(log);
	if (!ok) {
		tail_lines(k->err, 4, tail, sizeof(tail));
		say("%s logged no 'stopped' line with steps_done, wire_bytes_out and hedged_frames; the end of its log:%s",
		    k->name, tail);
		return -EIO;
	}
	*wire_per_step = (double)wire / (double)done;
	*hedged = (double)copies / (double)done;
	*steps = (double)done;
	return 0;
}

/* Reads the ranks' JSON: each must have passed its check of the first
 * step with the same digest. A step lasts from the moment the last rank
 * started it (its data is ready everywhere, as after gloo's barrier) to
 * the moment the last rank has the result. */
static int collect_ranks(double *step_ms, double *cpu_s, double *t0, double *t1)
{
	const struct wan_opts *o = &W.o;
	double *mine = malloc((size_t)o->steps * 3 * sizeof(double)), *start = mine + o->steps, *end = start + o->steps;
	double *last_start = calloc((size_t)o->steps * 2, sizeof(double)), *last_end = last_start + o->steps;
	char first[32] = "", digest[32];
	const struct child *first_k = NULL;
	int rc = mine && last_start ? 0 : -ENOMEM;

	*cpu_s = 0;
	*t0 = INFINITY;
	*t1 = -INFINITY;
	for (int t = 0; t < o->steps; t++)
		step_ms[t] = 0;
	for (int i = 0; i < W.nkids && !rc; i++) {
		const struct child *k = &W.kids[i];
		if (k->role != ROLE_RANK)
			continue;
		char *js = read_text(k->out, WAN_TEXT_MAX);
		const char *d = js ? strstr(js, "\"digest\":\"") : NULL;
		double wrong = -1, checked = 0, cpu = 0, a = 0, b = 0;
		if (!js || !d || sscanf(d, "\"digest\":\"%16[0-9a-f]\"", digest) != 1 || !json_number(js, "wrong", &wrong) ||
		    !json_number(js, "checked", &checked) || !json_number(js, "cpu_s", &cpu) ||
		    !json_number(js, "t_timed_start", &a) || !json_number(js, "t_timed_end", &b) ||
		    json_numbers(js, "step_ms", mine, o->steps) != o->steps ||
		    json_numbers(js, "step_start", start, o->steps) != o->steps ||
		    json_numbers(js, "step_end", end, o->steps) != o->steps) {
			report_no_result(k);
			rc = -EIO;
		} else if (wrong != 0 || checked != 1) {
			say("%s: its first result was %s", k->name, wrong ? "out of bound" : "not checked");
			rc = -EIO;
		} else if (first_k && strcmp(digest, first)) {
			say("%s's first result differs from %s's (digest %s, not %s)", k->name, first_k->name, digest, first);
			rc = -EIO;
		} else {
			if (!first_k) {
				first_k = k;
				snprintf(first, sizeof(first), "%s", digest);
			}
			for (int t = 0; t < o->steps; t++) {
				last_start[t] = GG_MAX(last_start[t], start[t]);
				last_end[t] = GG_MAX(last_end[t], end[t]);
			}
			*cpu_s += cpu;
			*t0 = GG_MIN(*t0, a);
			*t1 = GG_MAX(*t1, b);
		}
		free(js);
	}
	for (int t = 0; t < o->steps && !rc; t++)
		step_ms[t] = (last_end[t] - last_start[t]) * 1e3;
	free(last_start);
	free(mine);
	return rc;
}

static int run_gradgate(const struct mode *m, uint64_t size, struct sample *out)
{
	const struct wan_opts *o = &W.o;
	const int K = o->sites, R = o->ranks;
	struct snapshot before, after;
	char name[48], tag[32], cfg[320], ep[320];
	int rc;

	if ((rc = snapshot(&before)))
		return rc;
	for (int i = 0; i < K; i++)
		if ((rc = write_config(m, size, i)))
			return rc;
	if (o->delay_ms > 0) {
		/* Enough buffer for one stream to fill the link for the whole delay. */
		double buffer = GG_MIN(GG_MAX(1.5 * o->rate_bps / 8 * o->delay_ms / 1e3, 4 << 20), 256 << 20);
		char listen[32], target[32], delay[32], buffer_s[32];
		snprintf(delay, sizeof(delay), "%g", o->delay_ms);
		snprintf(buffer_s, sizeof(buffer_s), "%.0f", buffer);
		for (int i = 0; i < K; i++)
			for (int j = i + 1; j < K; j++) {
				snprintf(listen, sizeof(listen), "127.0.0.1:%d", WAN_LINK_PORT + j);
				snprintf(target, sizeof(target), "10.77.0.%d:%d", j + 1, WAN_GW_PORT);
				snprintf(name, sizeof(name), "linkem site-%d -> site-%d", i, j);
				snprintf(tag, sizeof(tag), "link-%d-%d", i, j);
				const char *argv[] = { o->linkem, "--listen", listen, "--target", target, "--delay-ms", delay,
						       "--buffer", buffer_s, NULL };
				if (!child_start(ROLE_LINK, name, tag, W.site[i], argv, NULL))
					return -EIO;
			}
		if ((rc = wait_children(ROLE_LINK, "listening on ", 10, NULL, "at start")))
			return rc;
	}
	for (int i = 0; i < K; i++) {
		snprintf(cfg, sizeof(cfg), "%s/site-%d.toml", W.dir, i);
		snprintf(name, sizeof(name), "gateway site-%d", i);
		snprintf(tag, sizeof(tag), "gw-%d", i);
		const char *argv[] = { o->gradgate, "--config", cfg, NULL };
		if (!child_start(ROLE_GATEWAY, name, tag, W.site[i], argv, NULL))
			return -EIO;
	}
	if ((rc = wait_children(ROLE_GATEWAY, "event=mesh_up", 30, NULL, "before every gateway logged mesh_up")))
		return rc;

	W.trace.n = 0;
	W.trace.every = 0.01;
	trace_add(&W.trace, true);
	char ranks[16], sites[16], count[32], steps_s[16], warmup[16], rank[16], site[16];
	snprintf(ranks, sizeof(ranks), "%d", R);
	snprintf(sites, sizeof(sites), "%d", K);
	snprintf(count, sizeof(count), "%llu", (unsigned long long)(size / 4));
	snprintf(steps_s, sizeof(steps_s), "%d", o->steps);
	snprintf(warmup, sizeof(warmup), "%d", o->warmup);
	for (int i = 0; i < K; i++)
		for (int r = 0; r < R; r++) {
			snprintf(ep, sizeof(ep), "unix:%s/site-%d.sock", W.dir, i);
			snprintf(rank, sizeof(rank), "%d", r);
			snprintf(site, sizeof(site), "%d", i);
			snprintf(name, sizeof(name), "rank %d of site-%d", r, i);
			snprintf(tag, sizeof(tag), "rank-%d-%d", i, r);
			const char *argv[] = { W.self, "allreduce", "--endpoint", ep, "--job", WAN_JOB, "--rank", rank,
					       "--ranks", ranks, "--site", site, "--sites", sites, "--count", count,
					       "--steps", steps_s, "--warmup", warmup, "--data", "gaussian", "--check",
					       "first", "--codec", gg_codec_name(m->codec), "--json",
					       o->copy ? NULL : "--shared", NULL };
			if (!child_start(ROLE_RANK, name, tag, W.site[i], argv, NULL))
				return -EIO;
		}
	rc = wait_children(ROLE_RANK, NULL, 60.0 + (double)(o->warmup + o->steps + 1) * W.step_timeout_s, &W.trace,
			   "while the ranks ran");
	trace_add(&W.trace, true);
	if (rc)
		return rc;

	if (stop_children(ROLE_GATEWAY, SIGTERM, 15)) {
		say("a gateway still ran 15 s after SIGTERM");
		return -EIO;
	}
	for (int i = 0; i < W.nkids; i++)
		if (W.kids[i].role == ROLE_GATEWAY && W.kids[i].status != 0) {
			report_child(&W.kids[i], "on SIGTERM");
			return -EIO;
		}
	stop_children(ROLE_LINK, SIGTERM, 5);
	if ((rc = snapshot(&after)))
		return rc;

	double step_ms[WAN_MAX_STEPS], cpu_ranks, t0, t1, wire = 0, hedged = 0, steps = 0;
	if ((rc = collect_ranks(step_ms, &cpu_ranks, &t0, &t1)))
		return rc;
	for (int i = 0; i < W.nkids; i++) {
		double w, h, s;
		if (W.kids[i].role != ROLE_GATEWAY)
			continue;
		if ((rc = parse_stopped(&W.kids[i], &w, &h, &s)))
			return rc;
		hedged += h;
		if (s != o->warmup + o->steps) {
			say("%s did %.0f steps, not %d", W.kids[i].name, s, o->warmup + o->steps);
			return -EIO;
		}
		wire = GG_MAX(wire, w);
		steps = s;
	}
	double cpu = cpu_ranks + trace_at(&W.trace, t1) - trace_at(&W.trace, t0);
	out->p50_ms = percentile(step_ms, o->steps, 0.5);
	out->p90_ms = percentile(step_ms, o->steps, 0.9);
	out->cpu_s_per_gb = cpu / ((double)o->steps * (double)size / 1e9);
	out->wire_bytes = wire;
	out->hedged = hedged;
	link_measures(&before, &after, steps, out);
	return 0;
}

static int run_gloo(uint64_t size, struct sample *out)
{
	const struct wan_opts *o = &W.o;
	const int N = o->sites * o->ranks;
	struct snapshot before, after;
	char name[48], tag[32], master[32], rank[16], world[16], ranks[16], count[32], steps[16], warmup[16];
	char timeout[16];
	int rc;

	snprintf(master, sizeof(master), "10.77.0.1:%d", WAN_GLOO_PORT + W.gloo_runs++ % 1000);
	snprintf(world, sizeof(world), "%d", N);
	snprintf(ranks, sizeof(ranks), "%d", o->ranks);
	snprintf(count, sizeof(count), "%llu", (unsigned long long)(size / 4));
	snprintf(steps, sizeof(steps), "%d", o->steps);
	snprintf(warmup, sizeof(warmup), "%d", o->warmup);
	snprintf(timeout, sizeof(timeout), "%d", W.step_timeout_s);
	if ((rc = snapshot(&before)))
		return rc;
	for (int r = 0; r < N; r++) {
		snprintf(rank, sizeof(rank), "%d", r);
		snprintf(name, sizeof(name), "gloo rank %d (site-%d)", r, r / o->ranks);
		snprintf(tag, sizeof(tag), "gloo-%d", r);
		const char *argv[] = { o->python, o->gloo_script, "--rank", rank, "--world", world, "--ranks-per-site",
				       ranks, "--master", master, "--count", count, "--steps", steps, "--warmup", warmup,
				       "--timeout-s", timeout, NULL };
		if (!child_start(ROLE_GLOO, name, tag, W.site[r / o->ranks], argv, "GLOO_SOCKET_IFNAME=" WAN_IFACE))
			return -EIO;
	}
	if ((rc = wait_children(ROLE_GLOO, NULL, 120.0 + (double)(o->warmup + o->steps) * W.step_timeout_s, NULL,
				"while the gloo ranks ran")))
		return rc;
	if ((rc = snapshot(&after)))
		return rc;

	double step_ms[WAN_MAX_STEPS], cpu = 0;
	char *js = read_text(W.kids[0].out, WAN_TEXT_MAX);
	if (!js || json_numbers(js, "step_ms", step_ms, o->steps) != o->steps || !json_number(js, "cpu_s", &cpu)) {
		report_no_result(&W.kids[0]);
		free(js);
		return -EIO;
	}
	free(js);
	out->p50_ms = percentile(step_ms, o->steps, 0.5);
	out->p90_ms = percentile(step_ms, o->steps, 0.9);
	out->cpu_s_per_gb = cpu / ((double)o->steps * (double)size / 1e9);
	out->wire_bytes = 2.0 * (N - 1) / N * (double)size;
	link_measures(&before, &after, o->warmup + o->steps, out);
	return 0;
}

/* ---- the link model ---- */

/* DATA message bytes around each chunk's frame: header, fixed fields, the
 * job's name. */
static double message_overhead(void)
{
	return GG_WIRE_HEADER_BYTES + GG_WIRE_DATA_FIXED_BYTES - GG_WIRE_NAME_MAX + (double)strlen(WAN_JOB);
}

static int hops(const struct mode *m)
{
	return !strcmp(m->algo, "ring") ? 2 * (W.o.sites - 1) : 1;
}

/* Bytes on the busiest shaped link per step, as the model counts them. */
static double model_link_bytes(const struct mode *m, double size, double wire)
{
	const int K = W.o.sites, N = K * W.o.ranks;

	if (m->gloo)
		return 2.0 * (N - 1) / N * size * framing_tcp();
	/* A ring moves 2(K-1) shards of a site's encoding per step over a
	 * site's uplink, direct its whole encoding K-1 times; a chunk holds
	 * chunk_size / 4 elements whatever the codec, and the ring cuts its
	 * shards (a K-th of the tensor) into chunks, direct the tensor. */
	double pieces = hops(m) == 1 ? K - 1 : 2.0 * (K - 1);
	double per_piece = hops(m) == 1 ? size : size / K;
	double messages = pieces * ceil(per_piece / (double)W.o.chunk_bytes);
	return (wire + messages * message_overhead()) * framing_tls() * framing_tcp();
}

static double model_s(const struct mode *m, double size, double wire)
{
	/* auto: the better of the two. */
	if (!m->gloo && !strcmp(m->algo, "auto")) {
		struct mode d = *m, r = *m;
		d.algo = "direct";
		r.algo = "ring";
		return fmin(model_s(&d, size, wire), model_s(&r, size, wire));
	}
	double latency = m->gloo ? 0 : (hops(m) + 1) * W.o.delay_ms / 1e3;
	return model_link_bytes(m, size, wire) / (W.o.rate_bps / 8) + latency;
}

/* ---- output ---- */

struct row {
	double p50, p90, p50_min, p50_max, model_ms, cpu, wire, link, drops, hedged, other_max, vs_gloo;
};

static struct row summarize(const struct mode *m, uint64_t size, const struct cell *c, double gloo_p50)
{
	double v[7][WAN_MAX_REPEAT];
	struct row r;

	for (int i = 0; i < c->n; i++) {
		v[0][i] = c->s[i].p50_ms;
		v[1][i] = c->s[i].p90_ms;
		v[2][i] = c->s[i].cpu_s_per_gb;
		v[3][i] = c->s[i].wire_bytes;
		v[4][i] = c->s[i].link_bytes;
		v[5][i] = c->s[i].drops;
		v[6][i] = c->s[i].hedged;
	}
	r.p50 = median(v[0], c->n);
	r.p90 = median(v[1], c->n);
	r.cpu = median(v[2], c->n);
	r.wire = median(v[3], c->n);
	r.link = median(v[4], c->n);
	r.drops = median(v[5], c->n);
	r.hedged = median(v[6], c->n);
	r.other_max = 0;
	for (int i = 0; i < c->n; i++)
		r.other_max = GG_MAX(r.other_max, c->s[i].other_cpu);
	qsort(v[0], (size_t)c->n, sizeof(double), cmp_double);
	r.p50_min = v[0][0];
	r.p50_max = v[0][c->n - 1];
	r.model_ms = model_s(m, (double)size, r.wire) * 1e3;
	r.vs_gloo = gloo_p50 > 0 ? r.p50 / gloo_p50 : NAN;
	return r;
}

static void print_header(void)
{
	const struct wan_opts *o = &W.o;
	char tcp[64];

	snprintf(tcp, sizeof(tcp), "%d/%d", WAN_MSS + WAN_SEGMENT_HDR, WAN_MSS);
	printf("gradgate-bench wan: %d sites x %d ranks; every site's uplink and downlink %.4g Mbit/s (tbf, burst %llu B,"
	       " queue %d ms); %d timed steps after %d warm-up, %d repeat%s, modes alternating\n",
	       o->sites, o->ranks, o->rate_bps / 1e6, (unsigned long long)W.tbf_burst, WAN_TBF_LATENCY_MS, o->steps,
	       o->warmup, o->repeat, o->repeat == 1 ? "" : "s");
	if (o->delay_ms > 0)
		printf("delay: %g ms one way between gateways (linkem); it applies to gradgate only, gloo's traffic "
		       "does not go through linkem\n", o->delay_ms);
	printf("tcp: %s congestion control in every site (%s)\n", W.congestion,
	       *o->congestion ? "--congestion" : "the host's; --congestion picks another");
	if (*W.gloo_skip)
		printf("gloo: skipped, %s\n", W.gloo_skip);
	printf("link model: time = bytes on the busiest link / rate + latency\n"
	       "  gloo      bytes = 2(N-1)/N x size x %s   (ring over N = K*R ranks in site order; tbf counts\n"
	       "            Ethernet 14 + IPv4 20 + TCP 32 bytes per %d-byte segment); latency 0\n"
	       "  gradgate  bytes = (wire + m x %.0f) x %d/%d x %s   (wire: frame bytes the busiest site sends per step,\n"
	       "            from the gateways; m chunk messages of %.0f bytes header each; TLS 1.3 adds %d bytes per\n"
	       "            %d-byte record); latency = (hops + 1) x delay, hops 2(K-1) ring, 1 direct, +1 commit round\n",
	       tcp, WAN_MSS, message_overhead(), WAN_TLS_RECORD + WAN_TLS_OVERHEAD, WAN_TLS_RECORD, tcp,
	       message_overhead(), WAN_TLS_OVERHEAD, WAN_TLS_RECORD);
	printf("columns: step time p50/p90 over the timed steps (per step the slowest rank), median over repeats;\n"
	       "  min-max of the repeats' p50; model and x model: the link model; x gloo: p50 over gloo's at that size;\n"
	       "  CPU s/GB: CPU of the gateways and ranks (gloo: ranks) in the timed steps per GB of fp32 all-reduced;\n"
	       "  wire MB: payload per step on the busiest link; link MB: what its tbf counted per step;\n"
	       "  drops: packets the tbfs dropped per step; other CPU: the most of the host's CPU that processes\n"
	       "  outside this bench used during a repeat (more than a few %% makes the row less trustworthy)\n\n");
	printf("%-30s %6s %8s %8s %15s %8s %7s %6s %8s %8s %8s %6s %6s\n", "mode", "size", "p50 ms", "p90 ms",
	       "p50 min-max", "model ms", "x model", "x gloo", "CPU s/GB", "wire MB", "link MB", "drops", "other");
}

static void print_row(const struct mode *m, uint64_t size, const struct row *r)
{
	const struct wan_opts *o = &W.o;
	char sz[32], span[48], vs[16];

	gg_format_size(size, sz, sizeof(sz));
	if (W.o.json) {
		printf("{\"mode\":\"%s\",\"system\":\"%s\",\"codec\":%s%s%s,\"algorithm\":\"%s\",\"zstd_level\":%d,"
		       "\"size_bytes\":%llu,\"sites\":%d,\"ranks\":%d,\"rate_bps\":%.0f,\"delay_ms\":%g,"
		       "\"congestion\":\"%s\",\"steps\":%d,"
		       "\"warmup\":%d,\"repeats\":%d,\"step_ms_p50\":%.3f,\"step_ms_p90\":%.3f,\"p50_ms_min\":%.3f,"
		       "\"p50_ms_median\":%.3f,\"p50_ms_max\":%.3f,\"model_ms\":%.3f,\"ratio_model\":%.4f,",
		       m->name, m->gloo ? "gloo" : "gradgate", m->gloo ? "" : "\"",
		       m->gloo ? "null" : gg_codec_name(m->codec), m->gloo ? "" : "\"", m->gloo ? "ring" : m->algo,
		       m->zstd, (unsigned long long)size, o->sites, o->ranks, o->rate_bps, m->gloo ? 0 : o->delay_ms,
		       W.congestion, o->steps, o->warmup, o->repeat, r->p50, r->p90, r->p50_min, r->p50, r->p50_max, r->model_ms,
		       r->p50 / r->model_ms);
		if (isnan(r->vs_gloo))
			printf("\"ratio_gloo\":null,");
		else
			printf("\"ratio_gloo\":%.4f,", r->vs_gloo);
		printf("\"cpu_s_per_gb\":%.4f,\"wire_bytes_per_step\":%.0f,\"model_link_bytes_per_step\":%.0f,"
		       "\"link_bytes_per_step\":%.0f,\"drops_per_step\":%.1f,\"hedged_frames_per_step\":%.2f,"
		       "\"other_cpu_share_max\":%.3f}\n",
		       r->cpu, r->wire, model_link_bytes(m, (double)size, r->wire), r->link, r->drops, r->hedged,
		       r->other_max);
		return;
	}
	snprintf(span, sizeof(span), "%.1f-%.1f", r->p50_min, r->p50_max);
	if (isnan(r->vs_gloo))
		snprintf(vs, sizeof(vs), "-");
	else
		snprintf(vs, sizeof(vs), "%.2f", r->vs_gloo);
	printf("%-30s %6s %8.1f %8.1f %15s %8.1f %7.2f %6s %8.2f %8.2f %8.2f %6.0f %5.0f%%\n", m->name, sz, r->p50,
	       r->p90, span, r->model_ms, r->p50 / r->model_ms, vs, r->cpu, r->wire / 1e6, r->link / 1e6, r->drops,
	       100 * r->other_max);
}

/* Step time against size, log-log, one line per mode. */
static int plot(const struct mode *modes, int nmodes, const struct cell *cells)
{
	const struct wan_opts *o = &W.o;
	char path[320], out[1024], delay[64] = "";

	if (o->delay_ms > 0)
		snprintf(delay, sizeof(delay), ", %g ms one way (gradgate only)", o->delay_ms);
	snprintf(path, sizeof(path), "%s/plot.gp", W.dir);
	FILE *f = fopen(path, "w");
	if (!f) {
		say("cannot write %s: %s", path, strerror(errno));
		return -EIO;
	}
	fprintf(f, "set terminal svg size 760,480 noenhanced font 'sans,11' background rgb 'white'\n"
		   "set output '%s'\nset logscale xy\nset grid\nset key top left\n"
		   "set xlabel 'fp32 bytes per all-reduce (MiB)'\nset ylabel 'step time, p50 (ms)'\n"
		   "set title '%d sites x %d ranks, %.4g Mbit/s up and down per site%s'\n",
		o->plot, o->sites, o->ranks, o->rate_bps / 1e6, delay);
	for (int m = 0; m < nmodes; m++) {
		fprintf(f, "$d%d << EOD\n", m);
		for (int s = 0; s < o->nsizes; s++) {
			const struct cell *c = &cells[m * o->nsizes + s];
			double p50[WAN_MAX_REPEAT];
			for (int i = 0; i < c->n; i++)
				p50[i] = c->s[i].p50_ms;
			if (c->n)
				fprintf(f, "%.6g %.6g\n", (double)o->sizes[s] / (1 << 20), median(p50, c->n));
		}
		fprintf(f, "EOD\n");
	}
	fprintf(f, "plot ");
	for (int m = 0; m < nmodes; m++)
		fprintf(f, "%s$d%d using 1:2 with linespoints lw 2 title '%s'", m ? ", " : "", m, modes[m].name);
	fprintf(f, "\n");
	if (fclose(f)) {
		say("cannot write %s: %s", path, strerror(errno));
		return -EIO;
	}
	char gnuplot[256];
	if (!find_tool("gnuplot", gnuplot, sizeof(gnuplot))) {
		say("gnuplot is gone; the plot's script is %s", path);
		return -ENOENT;
	}
	const char *argv[] = { gnuplot, path, NULL };
	int rc = run_tool(argv, 60, out, sizeof(out));
	if (rc)
		say("gnuplot could not draw %s: %s", o->plot, rc > 0 ? out : strerror(-rc));
	return rc ? -EIO : 0;
}

/* ---- set-up, clean-up ---- */

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	remove(path);
	return 0;
}

static void remove_tree(const char *dir)
{
	nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static const char *tmp_dir(void)
{
	const char *t = getenv("TMPDIR");
	return t && *t ? t : "/tmp";
}

/* Whether a name (of a namespace, or the middle of a folder's name) is
 * one this bench made: the --prefix given, or ggw<pid> of a process that
 * is gone. *rest gets what follows the prefix. */
static bool left_behind(const char *name, const char **rest)
{
	const struct wan_opts *o = &W.o;

	if (o->prefix_given) {
		size_t n = strlen(o->prefix);
		*rest = name + n;
		return !strncmp(name, o->prefix, n);
	}
	char *end;
	if (strncmp(name, "ggw", 3) || name[3] < '0' || name[3] > '9')
		return false;
	long pid = strtol(name + 3, &end, 10);
	*rest = end;
	return pid > 0 && pid != getpid() && kill((pid_t)pid, 0) && errno == ESRCH;
}

static int cleanup_leftovers(void)
{
	char list[16384], text[4096];
	const char *list_argv[] = { W.ip, "netns", "list", NULL };
	int found = 0, failed = 0;

	if (run_tool(list_argv, 10, list, sizeof(list))) {
		say("`ip netns list` failed: %s", list);
		return WAN_CANNOT;
	}
	for (char *save, *line = strtok_r(list, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		const char *rest;
		line[strcspn(line, " ")] = '\0';
		if (!left_behind(line, &rest) ||
		    !(!strcmp(rest, "hub") || (rest[0] == 's' && rest[1] && strspn(rest + 1, "0123456789") == strlen(rest + 1))))
			continue;
		found++;
		/* Its processes first: a namespace lives on while one is in it. */
		const char *pids_argv[] = { W.ip, "netns", "pids", line, NULL };
		bool killed = false;
		for (int round = 0; round < 50; round++) { /* 5 s for them to go */
			if (run_tool(pids_argv, 10, text, sizeof(text)) || !*text)
				break;
			for (char *s2, *p = strtok_r(text, "\n", &s2); p; p = strtok_r(NULL, "\n", &s2))
				killed |= atoi(p) > 1 && !kill((pid_t)atoi(p), SIGKILL);
			nap_ms(100);
		}
		if (netns_delete(line))
			failed++;
		else
			printf("removed network namespace %s%s\n", line, killed ? " and killed what ran in it" : "");
	}
	DIR *d = opendir(tmp_dir());
	struct dirent *e;
	while (d && (e = readdir(d))) {
		const char *rest;
		char path[4096];
		if (strncmp(e->d_name, "gradgate-wan-", 13) || !left_behind(e->d_name + 13, &rest) || rest[0] != '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", tmp_dir(), e->d_name);
		found++;
		/* A run's folder is its user's, mode 0700 (mkdtemp): inside one
		 * nobody else can swap a folder for a link while it is removed.
		 * Another user's, however named, is not this one's to remove. */
		struct stat st;
		if (lstat(path, &st) || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077)) {
			printf("left %s alone: not a folder of this user's (uid %u) that only it may enter\n", path,
			       (unsigned)geteuid());
			continue;
		}
		remove_tree(path);
		printf("removed %s\n", path);
	}
	if (d)
		closedir(d);
	if (!found)
		printf("nothing left behind by earlier runs%s%s\n", W.o.prefix_given ? " of prefix " : "",
		       W.o.prefix_given ? W.o.prefix : "");
	return failed ? WAN_FAILED : WAN_OK;
}

/* What this machine must offer before anything is made. */
static int preflight(void)
{
	const struct wan_opts *o = &W.o;
	char line[256], out[2048];
	unsigned long long caps = 0;

	FILE *f = fopen("/proc/self/status", "r");
	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "CapEff: %llx", &caps) == 1)
			break;
	if (f)
		fclose(f);
	bool net_admin = caps & (1ull << 12), sys_admin = caps & (1ull << 21);
	if (!net_admin || !sys_admin) {
		say("needs root, or CAP_NET_ADMIN and CAP_SYS_ADMIN, to make network namespaces, veths and qdiscs; "
		    "this process lacks %s%s%s", net_admin ? "" : "CAP_NET_ADMIN", !net_admin && !sys_admin ? " and " : "",
		    sys_admin ? "" : "CAP_SYS_ADMIN");
		return WAN_CANNOT;
	}
	if (!find_tool("ip", W.ip, sizeof(W.ip)) || !find_tool("tc", W.tc, sizeof(W.tc))) {
		say("'%s' (iproute2) is not in PATH, /usr/sbin or /sbin; install iproute2", *W.ip ? "tc" : "ip");
		return WAN_CANNOT;
	}
	if (o->cleanup)
		return WAN_OK;
	ssize_t n = readlink("/proc/self/exe", W.self, sizeof(W.self) - 1);
	if (n <= 0 || n >= (ssize_t)sizeof(W.self) - 1) {
		say("cannot find this program's own path for the ranks: %s", strerror(errno));
		return WAN_CANNOT;
	}
	W.self[n] = '\0';
	const struct {
		const char *path, *what;
		bool needed;
	} files[] = {
		{ o->gradgate, "the gateway (pass --gradgate)", true },
		{ o->linkem, "linkem, the link emulator --delay-ms needs (pass --linkem)", o->delay_ms > 0 },
		{ o->make_certs, "examples/make-certs.sh (pass --make-certs)", true },
	};
	for (size_t i = 0; i < GG_ARRAY_LEN(files); i++)
		if (files[i].needed && access(files[i].path, X_OK)) {
			say("cannot run %s: %s: %s", files[i].what, files[i].path, strerror(errno));
			return WAN_CANNOT;
		}
	if (!find_tool("openssl", line, sizeof(line))) {
		say("openssl is not installed; make-certs.sh needs it for the throwaway certificates");
		return WAN_CANNOT;
	}
	if (*o->congestion && !congestion_usable(o->congestion))
		return WAN_CANNOT;
	if (o->plot && !find_tool("gnuplot", line, sizeof(line))) {
		say("--plot needs gnuplot, which is not installed (Debian: gnuplot-nox)");
		return WAN_CANNOT;
	}
	if (o->no_gloo) {
		snprintf(W.gloo_skip, sizeof(W.gloo_skip), "as --no-gloo asks");
	} else if (o->python_given && (strchr(o->python, '/') ? access(o->python, X_OK) : !find_tool(o->python, line, sizeof(line)))) {
		say("cannot run the Python that --python names: %s: %s", o->python,
		    strchr(o->python, '/') ? strerror(errno) : "not found in PATH");
		return WAN_CANNOT;
	} else if (access(o->gloo_script, R_OK)) {
		say("cannot read the gloo ranks' script %s (pass --gloo-script, or --no-gloo): %s", o->gloo_script,
		    strerror(errno));
		return WAN_CANNOT;
	} else {
		const char *argv[] = { o->python, "-c",
				       "import torch.distributed as d\n"
				       "assert d.is_available() and d.is_gloo_available(), 'torch.distributed has no gloo'",
				       NULL };
		int rc = run_tool(argv, 120, out, sizeof(out));
		if (rc == -EINTR)
			return 128 + wan_signal;
		if (rc) {
			const char *last = strrchr(out, '\n');
			snprintf(W.gloo_skip, sizeof(W.gloo_skip), "because `%.64s -c 'import torch.distributed'` %s: %.160s",
				 o->python, rc > 0 ? "failed" : "could not run", rc > 0 ? (last ? last + 1 : out) : strerror(-rc));
		}
	}
	if (*W.gloo_skip)
		say("gloo: skipped, %s", W.gloo_skip);

	uint64_t largest = 0;
	unsigned long long avail_kb = 0;
	for (int i = 0; i < o->nsizes; i++)
		largest = GG_MAX(largest, o->sizes[i]);
	/* Ranks: buffer, input, shared memory; gateways: sums, encodings, residuals. */
	double need = (double)largest * GG_MAX(4.0 * o->sites * o->ranks + 8.0 * o->sites, 3.0 * o->sites * o->ranks);
	f = fopen("/proc/meminfo", "r");
	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %llu kB", &avail_kb) == 1)
			break;
	if (f)
		fclose(f);
	if (avail_kb && need > 0.8 * (double)avail_kb * 1024) {
		say("%d sites x %d ranks at %llu MiB need about %.1f GB of memory, and %.1f GB are available; "
		    "use smaller --sizes, or fewer --sites or --ranks",
		    o->sites, o->ranks, (unsigned long long)(largest >> 20), need / 1e9, (double)avail_kb * 1024 / 1e9);
		return WAN_CANNOT;
	}

	/* Generous: 30 times what fp32 direct takes on the link, at least a minute. */
	double worst = model_s(&(struct mode){ .algo = "direct" }, (double)largest, (o->sites - 1) * (double)largest);
	W.step_timeout_s = (int)GG_MIN(GG_MAX(ceil(30 * worst), 60), 3600);
	W.tbf_burst = GG_MAX((uint64_t)(o->rate_bps / 8 / 1000), WAN_TBF_BURST_MIN);
	return WAN_OK;
}

static int setup(void)
{
	const struct wan_opts *o = &W.o;
	char certs[320];

	if ((size_t)snprintf(W.dir, sizeof(W.dir), "%s/gradgate-wan-%s.XXXXXX", tmp_dir(), o->prefix) >= 80) {
		say("the temporary folder's path %s is too long for the gateways' control sockets; set TMPDIR shorter",
		    W.dir);
		W.dir[0] = '\0';
		return -ENAMETOOLONG;
	}
	if (!mkdtemp(W.dir)) {
		say("cannot make a folder for the run's files (%s): %s", W.dir, strerror(errno));
		W.dir[0] = '\0';
		return -errno;
	}
	snprintf(W.hub, sizeof(W.hub), "%shub", o->prefix);
	for (int i = 0; i < o->sites; i++)
		snprintf(W.site[i], sizeof(W.site[i]), "%ss%d", o->prefix, i);
	/* New namespaces start with the host's congestion control. */
	if (*o->congestion)
		snprintf(W.congestion, sizeof(W.congestion), "%s", o->congestion);
	else if (!proc_line(CC_CURRENT, W.congestion, sizeof(W.congestion)))
		snprintf(W.congestion, sizeof(W.congestion), "unknown");
	int rc = topology_up();
	if (rc)
		return rc;
	char names[WAN_MAX_SITES][16];
	const char *argv[WAN_MAX_SITES + 4] = { o->make_certs, "--out", certs };
	snprintf(certs, sizeof(certs), "%s/certs", W.dir);
	for (int i = 0; i < o->sites; i++) {
		snprintf(names[i], sizeof(names[i]), "site-%d", i);
		argv[3 + i] = names[i];
	}
	char out[1024];
	rc = run_tool(argv, 60, out, sizeof(out));
	if (rc && rc != -EINTR)
		say("cannot make throwaway certificates with %s: %s", o->make_certs, rc > 0 ? out : strerror(-rc));
	return rc ? -EIO : 0;
}

static void teardown(void)
{
	W.tearing_down = true;
	children_end();
	topology_down();
	if (*W.dir)
		remove_tree(W.dir);
	W.dir[0] = '\0';
}

/* ---- the runs ---- */

static int make_modes(struct mode *modes)
{
	const struct wan_opts *o = &W.o;
	int n = 0;

	if (!*W.gloo_skip)
		modes[n++] = (struct mode){ .gloo = true, .algo = "ring", .name = "gloo" };
	for (int c = 0; c < o->ncodecs; c++)
		for (int a = 0; a < o->nalgos; a++)
			for (int z = 0; z < o->nzstd; z++) {
				struct mode *m = &modes[n++];
				*m = (struct mode){ .codec = o->codecs[c], .algo = o->algos[a], .zstd = o->zstd[z] };
				int len = snprintf(m->name, sizeof(m->name), "gradgate %s %s", gg_codec_name(m->codec), m->algo);
				if (m->zstd)
					snprintf(m->name + len, sizeof(m->name) - (size_t)len, " zstd%d", m->zstd);
			}
	return n;
}

/* Waits, at most WAN_QUIET_WAIT_S, until the host's CPU over 2 s is busy
 * no more than --max-other-cpu allows (nothing of this run is running).
 * Returns 0, or -EINTR when asked to stop. */
static int wait_quiet(void)
{
	double limit = W.o.max_other_pct / 100.0, share = 0;
	long cores = GG_MAX(sysconf(_SC_NPROCESSORS_ONLN), 1);
	bool told = false;

	for (double until = now_s() + WAN_QUIET_WAIT_S; now_s() < until;) {
		double t0 = now_s(), busy0 = host_busy_s() - self_cpu_s();
		for (int i = 0; i < 200 && !stop_requested(); i++)
			nap_ms(10);
		if (stop_requested())
			return -EINTR;
		share = (host_busy_s() - self_cpu_s() - busy0) / ((now_s() - t0) * (double)cores);
		if (share <= limit)
			return 0;
		if (!told)
			say("other processes use %.0f%% of the host's CPU; waiting for them to use at most %d%%", 100 * share,
			    W.o.max_other_pct);
		told = true;
	}
	say("other processes still use %.0f%% of the host's CPU after %d s; running anyway", 100 * share,
	    WAN_QUIET_WAIT_S);
	return 0;
}

/* One run of a mode at a size. With --max-other-cpu, a run that other
 * processes disturbed more is run again; after WAN_TRIES such runs the
 * least disturbed one stays, and its row shows how much. */
static int run_measured(const struct mode *m, uint64_t size, const char *label, struct sample *out)
{
	const struct wan_opts *o = &W.o;

	for (int try = 1; try <= WAN_TRIES; try++) {
		struct sample smp = { 0 };
		int rc = o->max_other_pct < 100 ? wait_quiet() : 0;
		if (rc)
			return rc;
		rc = m->gloo ? run_gloo(size, &smp) : run_gradgate(m, size, &smp);
		children_end();
		if (rc)
			return rc;
		if (try == 1 || smp.other_cpu < out->other_cpu)
			*out = smp;
		if (o->max_other_pct == 100 || smp.other_cpu * 100 <= o->max_other_pct)
			return 0;
		fprintf(stderr, "%s: other processes used %.1f%% of the CPU, more than %d%%: %s\n", label,
			100 * smp.other_cpu, o->max_other_pct,
			try < WAN_TRIES ? "again" : "keeping the least disturbed run");
	}
	return 0;
}

/* Every size, each repeat running every mode once, in order. */
static int run_all(const struct mode *modes, int nmodes, struct cell *cells)
{
	const struct wan_opts *o = &W.o;
	int total = o->nsizes * o->repeat * nmodes, done = 0;

	for (int s = 0; s < o->nsizes; s++)
		for (int rep = 0; rep < o->repeat; rep++)
			for (int m = 0; m < nmodes; m++) {
				struct sample smp;
				char sz[32], label[128];
				gg_format_size(o->sizes[s], sz, sizeof(sz));
				snprintf(label, sizeof(label), "[%d/%d] %-30s %6s  repeat %d/%d", ++done, total, modes[m].name,
					 sz, rep + 1, o->repeat);
				int rc = run_measured(&modes[m], o->sizes[s], label, &smp);
				if (rc) {
					if (rc != -EINTR)
						say("%s at %s (repeat %d) failed", modes[m].name, sz, rep + 1);
					return rc;
				}
				struct cell *c = &cells[m * o->nsizes + s];
				c->s[c->n++] = smp;
				fprintf(stderr, "%s: p50 %.1f ms, p90 %.1f ms, other CPU %.1f%%\n", label, smp.p50_ms,
					smp.p90_ms, 100 * smp.other_cpu);
			}
	return 0;
}

/* The mode of algorithm `algo` with m's codec and zstd, or -1. */
static int fixed_mode(const struct mode *modes, int nmodes, const struct mode *m, const char *algo)
{
	for (int i = 0; i < nmodes; i++)
		if (!modes[i].gloo && modes[i].codec == m->codec && modes[i].zstd == m->zstd &&
		    !strcmp(modes[i].algo, algo))
			return i;
	return -1;
}

/* auto's model: the better of direct's and ring's, each with the bytes its
 * own steps sent, where both ran at this size; else (model_s()) both
 * formulas on auto's own bytes, a mix of both algorithms'. */
static void auto_model(const struct mode *modes, int nmodes, const struct cell *cells, const struct mode *am, int s,
		       struct row *r)
{
	const struct wan_opts *o = &W.o;
	const int d = fixed_mode(modes, nmodes, am, "direct"), g = fixed_mode(modes, nmodes, am, "ring");

	if (d < 0 || g < 0)
		return;
	double wd = summarize(&modes[d], o->sizes[s], &cells[d * o->nsizes + s], 0).wire;
	double wg = summarize(&modes[g], o->sizes[s], &cells[g * o->nsizes + s], 0).wire;
	const double size = (double)o->sizes[s];
	r->model_ms = fmin(model_s(&modes[d], size, wd), model_s(&modes[g], size, wg)) * 1e3;
}

static void report(const struct mode *modes, int nmodes, const struct cell *cells)
{
	const struct wan_opts *o = &W.o;
	double other = 0;

	if (!o->json)
		print_header();
	for (int s = 0; s < o->nsizes; s++) {
		double gloo_p50 = 0;
		for (int m = 0; m < nmodes; m++)
			if (modes[m].gloo)
				gloo_p50 = summarize(&modes[m], o->sizes[s], &cells[m * o->nsizes + s], 0).p50;
		for (int m = 0; m < nmodes; m++) {
			struct row r = summarize(&modes[m], o->sizes[s], &cells[m * o->nsizes + s], gloo_p50);
			if (!modes[m].gloo && !strcmp(modes[m].algo, "auto"))
				auto_model(modes, nmodes, cells, &modes[m], s, &r);
			print_row(&modes[m], o->sizes[s], &r);
			other = GG_MAX(other, r.other_max);
		}
	}
	if (!o->json && other > 0.05)
		printf("\nOther processes used up to %.0f%% of the host's CPU during some runs (column other); "
		       "--max-other-cpu 5 discards such runs and runs them again once the host is quiet.\n",
		       100 * other);
	fflush(stdout);
}

int gg_bench_wan_main(int argc, char **argv)
{
	struct sigaction sa = { .sa_handler = on_signal }, old[3];
	static const int sigs[] = { SIGINT, SIGTERM, SIGHUP };
	struct mode modes[WAN_MAX_MODES];
	int status = parse_opts(argc, argv, &W.o);

	if (status)
		return status;
	sigemptyset(&sa.sa_mask);
	for (int i = 0; i < 3; i++)
		sigaction(sigs[i], &sa, &old[i]);
	signal(SIGPIPE, SIG_IGN);
	status = preflight();
	if (!status && W.o.cleanup)
		status = cleanup_leftovers();
	else if (!status) {
		int nmodes = make_modes(modes);
		struct cell *cells = calloc((size_t)(nmodes * W.o.nsizes), sizeof(*cells));
		if (!cells) {
			say("out of memory");
			status = WAN_FAILED;
		} else if (setup()) {
			status = WAN_CANNOT;
		} else if (run_all(modes, nmodes, cells)) {
			status = WAN_FAILED;
		} else {
			report(modes, nmodes, cells);
			if (W.o.plot && plot(modes, nmodes, cells))
				status = WAN_FAILED;
		}
		teardown();
		free(cells);
	}
	for (int i = 0; i < 3; i++)
		sigaction(sigs[i], &old[i], NULL);
	if (wan_signal) {
		say("stopped by %s; children, namespaces and files removed", strsignal(wan_signal));
		return 128 + wan_signal;
	}
	return status;
}
