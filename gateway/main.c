/* gradgate: the per-site gateway. */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "control_proto.h"
#include "daemon.h"
#include "gg_build_config.h"
#include "gg_common.h"
#include "host_backend.h"
#include "log.h"
#include "net_addr.h"
#include "node.h"
#include "status.h"
#include "tls_verify.h"
#include "units.h"
#include "wire.h"
#if HAVE_CUDA
#include "cuda_probe.h"
#endif

enum exit_code {
	EXIT_OK = GG_EXIT_OK,
	EXIT_CONFIG = GG_EXIT_CONFIG,
	EXIT_USAGE = GG_EXIT_USAGE,
};

static void usage(FILE *out)
{
	fprintf(out,
		"usage: gradgate --config FILE [--log-level debug|info|warn|error]\n"
		"       gradgate --check-config FILE...\n"
		"       gradgate status (--config FILE | --control unix:/PATH) [--json]\n"
		"       gradgate --version\n"
		"\n"
		"  --config FILE           run this site's gateway until SIGTERM or SIGINT;\n"
		"                          SIGHUP reloads its certificates and key. Exit\n"
		"                          status: 0 stopped cleanly, 1 bad config, 2 usage,\n"
		"                          3 could not start, 4 the event loop failed\n"
		"  --check-config FILE...  load and validate each site config; print the\n"
		"                          resolved settings (defaults included), or every\n"
		"                          problem found; the configs of sites of one mesh\n"
		"                          are checked against each other too; exit 1 if any\n"
		"                          file has problems\n"
		"  status                  ask a running gateway for its status: peers, jobs,\n"
		"                          recent step failures (gradgate status --help)\n"
		"  --version               print the version and what this build supports\n"
		"  --help                  show this help\n");
}

/* One problem of `path` that the loader did not report, at `at` in it
 * (line 0: the file's), and the count, as the loader says them (control
 * characters escaped). */
static void report(const char *path, struct gg_config_pos at, const char *problem)
{
	struct gg_diag diag = { 0 };

	if (at.line)
		gg_diag_add(&diag, "%s:%u:%u: %s", path, at.line, at.col, problem);
	else
		gg_diag_add(&diag, "%s: %s", path, problem);
	gg_diag_add(&diag, "%s: 1 problem found", path);
	gg_diag_print(&diag, stderr);
	gg_diag_free(&diag);
}

static int by_name(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

#define SITE_SET_MAX ((GG_MAX_PEERS + 1) * (GG_SITE_NAME_MAX + 1))

/* The sites a config knows (its own and its peers), sorted: "a,b,c". */
static const char *site_set(const struct gg_config *c, char *buf, size_t size)
{
	const char *names[GG_MAX_PEERS + 1];
	size_t n = 0, len = 0;

	names[n++] = c->site.name;
	for (size_t i = 0; i < c->peer_count && n < GG_ARRAY_LEN(names); i++)
		names[n++] = c->peers[i].site;
	qsort(names, n, sizeof(*names), by_name);
	buf[0] = '\0';
	for (size_t i = 0; i < n && len < size; i++)
		len += (size_t)snprintf(buf + len, size - len, "%s%s", i ? "," : "", names[i]);
	return buf;
}

/* A setting two sites must share that differs: i's value x, j's y. */
static void differ(struct gg_diag *diag, char **paths, int i, int j, const char *what, const char *x, const char *y)
{
	gg_diag_add(diag, "%s: %s is %s, %s's is %s: the two sites refuse each other's streams", paths[j], what, y,
		    paths[i], x);
}

/* Whether `a`'s [[peers]] identity for b's site is in b's certificate; a
 * problem in diag where it is not, or where b's certificate does not
 * parse. Another site's certificate need not be on this host: where it
 * cannot be read, a note on stdout says what was not checked. */
static void check_identity(struct gg_diag *diag, const char *a_path, const struct gg_config *a,
			   const struct gg_config *b)
{
	const struct gg_peer_config *p = gg_config_peer(a, b->site.name);
	struct gg_tls_identity id;
	const char *why;
	char err[GG_NODE_ERROR_MAX];
	bool names;

	if (!p || gg_tls_identity_parse(p->identity, &id, &why))
		return; /* the file's own check said so */
	/* Read only where a file is there to read: a pipe at the path would
	 * hold the check up for good. */
	struct stat st;
	const char *unread = NULL;
	if (stat(b->tls.cert, &st) || (S_ISREG(st.st_mode) && access(b->tls.cert, R_OK)))
		unread = strerror(errno);
	else if (!S_ISREG(st.st_mode))
		unread = "not a regular file";
	if (unread)
		printf("# %s: its certificate %s cannot be read here (%s): whether it names %s, as %s expects, is "
		       "not checked\n", b->source, b->tls.cert, unread, p->identity, a_path);
	else if (gg_tls_cert_file_names(b->tls.cert, &id, &names, err, sizeof(err)))
		gg_diag_add(diag, "%s: %s", b->source, err);
	else if (!names)
		gg_diag_add(diag, "%s: its [[peers]] identity for site %s, %s, is not in that site's certificate %s "
			    "(%s): site %s would refuse site %s", a_path, b->site.name, p->identity, b->tls.cert,
			    b->source, a->site.name, b->site.name);
}

/* What the gateways of two sites of one mesh (a, b: files i, j) would
 * refuse of each other when they meet, into diag. */
static void pair_problems(struct gg_diag *diag, char **paths, int i, int j, const struct gg_config *a,
			  const struct gg_config *b, const char *sa, const char *sb)
{
	const struct gg_peer_config *ab = gg_config_peer(a, b->site.name), *ba = gg_config_peer(b, a->site.name);

	if (strcmp(sa, sb))
		gg_diag_add(diag, "%s: knows the sites [%s], %s knows [%s]: the two refuse each other's streams",
			    paths[j], sb, paths[i], sa);
	/* What both must share, as HELLO compares it. */
	const bool blocks = gg_codec_has_blocks(a->compression.codec);
	char x[32], y[32];
	if (a->compression.codec != b->compression.codec)
		differ(diag, paths, i, j, "[compression] codec", gg_codec_name(a->compression.codec),
		       gg_codec_name(b->compression.codec));
	if (blocks && a->compression.block_size != b->compression.block_size) {
		snprintf(x, sizeof(x), "%d", a->compression.block_size);
		snprintf(y, sizeof(y), "%d", b->compression.block_size);
		differ(diag, paths, i, j, "[compression] block_size", x, y);
	}
	if (blocks && a->compression.scale != b->compression.scale)
		differ(diag, paths, i, j, "[compression] scale", a->compression.scale == GG_SCALE_F16 ? "fp16" : "fp32",
		       b->compression.scale == GG_SCALE_F16 ? "fp16" : "fp32");
	if ((a->compression.zstd_level > 0) != (b->compression.zstd_level > 0))
		differ(diag, paths, i, j, "the zstd stage ([compression] zstd_level)",
		       a->compression.zstd_level > 0 ? "on" : "off", b->compression.zstd_level > 0 ? "on" : "off");
	if (a->allreduce.algorithm != b->allreduce.algorithm)
		differ(diag, paths, i, j, "[allreduce] algorithm", gg_allreduce_algo_name(a->allreduce.algorithm),
		       gg_allreduce_algo_name(b->allreduce.algorithm));
	/* Chunks in elements, as HELLO gives them: two sizes that round to
	 * the same elements agree. */
	if (gg_node_chunk_elems(a) != gg_node_chunk_elems(b))
		differ(diag, paths, i, j, "[transport] chunk_size", gg_format_size(a->transport.chunk_bytes, x, sizeof(x)),
		       gg_format_size(b->transport.chunk_bytes, y, sizeof(y)));
	if (a->transport.streams_per_peer != b->transport.streams_per_peer) {
		snprintf(x, sizeof(x), "%d", a->transport.streams_per_peer);
		snprintf(y, sizeof(y), "%d", b->transport.streams_per_peer);
		differ(diag, paths, i, j, "[transport] streams_per_peer", x, y);
	}
	if (ab && ba && ab->dial == GG_DIAL_OUT && ba->dial == GG_DIAL_OUT)
		gg_diag_add(diag, "%s:%u:%u: dial = \"out\" for site %s, as %s's for site %s (%s:%u:%u): each refuses "
			    "the other's streams; set \"in\" or \"both\" at one of them", paths[j], ba->dial_at.line,
			    ba->dial_at.col, a->site.name, paths[i], b->site.name, paths[i], ab->dial_at.line,
			    ab->dial_at.col);
	if (ab && ba && ab->dial == GG_DIAL_IN && ba->dial == GG_DIAL_IN)
		gg_diag_add(diag, "%s:%u:%u: dial = \"in\" for site %s, as %s's for site %s (%s:%u:%u): neither dials; "
			    "set \"out\" or \"both\" at one of them", paths[j], ba->dial_at.line, ba->dial_at.col,
			    a->site.name, paths[i], b->site.name, paths[i], ab->dial_at.line, ab->dial_at.col);
	if (!ab)
		gg_diag_add(diag, "%s: no [[peers]] entry for site %s, which %s knows as a peer", paths[i],
			    b->site.name, paths[j]);
	if (!ba)
		gg_diag_add(diag, "%s: no [[peers]] entry for site %s, which %s knows as a peer", paths[j],
			    a->site.name, paths[i]);
	check_identity(diag, paths[i], a, b);
	check_identity(diag, paths[j], b, a);
}

/* The configs of sites of one mesh, checked together (each pair of files
 * of which one lists the other's site as a peer): what their gateways
 * would refuse of each other when they meet. Returns the problems found,
 * printed. */
static size_t cross_check(struct gg_config *cfgs, const bool *ok, char **paths, int count)
{
	size_t problems = 0;

	for (int i = 0; i < count; i++) {
		for (int j = i + 1; j < count; j++) {
			const struct gg_config *a = &cfgs[i], *b = &cfgs[j];
			if (!ok[i] || !ok[j])
				continue;
			const bool same_site = !strcmp(a->site.name, b->site.name);
			char sa[SITE_SET_MAX], sb[SITE_SET_MAX];
			const bool same_sites = !strcmp(site_set(a, sa, sizeof(sa)), site_set(b, sb, sizeof(sb)));
			/* Two files of one site: of one mesh where they know the
			 * same peers (the configs of two gateways for one site). */
			if (!gg_config_peer(a, b->site.name) && !gg_config_peer(b, a->site.name) &&
			    (!same_site || !same_sites))
				continue; /* not of one mesh */
			struct gg_diag diag = { 0 };
			if (same_site)
				gg_diag_add(&diag, "%s: site %s, as %s: two gateways of one site would take each other's "
					    "streams", paths[j], b->site.name, paths[i]);
			else
				pair_problems(&diag, paths, i, j, a, b, sa, sb);
			if (diag.count) {
				problems += diag.count;
				gg_diag_add(&diag, "%s and %s: %zu problem%s found between the two", paths[i], paths[j],
					    diag.count, diag.count == 1 ? "" : "s");
				gg_diag_print(&diag, stderr);
			}
			gg_diag_free(&diag);
		}
	}
	return problems;
}

/* The checks of the host a config's gateway starts on (its key and
 * certificate, congestion control, listen, control, [metrics] listen):
 * 0, or the first that fails in err with the setting's place in *at. */
static int check_host(const struct gg_config *cfg, struct gg_config_pos *at, char *err, size_t size)
{
	struct sockaddr_storage metrics;
	socklen_t metrics_len;
	int rc = gg_node_check_host(cfg, at, err, size);

	if (!rc) {
		*at = cfg->at.control;
		rc = gg_host_backend_check_control(cfg->site.control, err, size);
	}
	if (!rc && cfg->metrics.listen) {
		*at = cfg->at.metrics_listen;
		const char *why;
		rc = gg_daemon_metrics_address(cfg, &metrics, &metrics_len, err, size);
		if (!rc && (rc = gg_net_addr_is_local((struct sockaddr *)&metrics, metrics_len, &why)))
			snprintf(err, size, "[metrics] listen %s: %s", cfg->metrics.listen, why);
	}
	return rc;
}

static int check_configs(int count, char **paths)
{
	struct gg_config *cfgs = calloc((size_t)count, sizeof(*cfgs));
	bool *ok = calloc((size_t)count, sizeof(*ok));
	int bad = 0;

	if (!cfgs || !ok) {
		free(cfgs);
		free(ok);
		fprintf(stderr, "gradgate: out of memory for %d configs\n", count);
		return EXIT_CONFIG;
	}
	for (int i = 0; i < count; i++) {
		struct gg_config cfg;
		/* The first file is this host's; the others are other sites',
		 * whose files and host are checked there: here, their settings,
		 * and how they agree with the first and each other. */
		int rc = i ? gg_config_load_settings_report(paths[i], &cfg, stderr)
			   : gg_config_load_report(paths[i], &cfg, stderr);
		if (rc) {
			bad++;
			continue;
		}
		if (i) {
			printf("\n# %s: its settings (its files and host are checked on its own host)\n", paths[i]);
		} else {
			/* A clean check means the gateway starts (the systemd unit
			 * runs it first): the files must be what they claim, not
			 * just readable. */
			char err[GG_NODE_ERROR_MAX];
			struct gg_config_pos at;
			if (check_host(&cfg, &at, err, sizeof(err))) {
				report(paths[i], at, err);
				gg_config_free(&cfg);
				bad++;
				continue;
			}
		}
		if (gg_config_print(&cfg, stdout)) {
			report(paths[i], (struct gg_config_pos){ 0, 0 }, "out of memory printing its configuration");
			bad++;
		}
		cfgs[i] = cfg;
		ok[i] = true;
	}
	fflush(stdout);
	if (cross_check(cfgs, ok, paths, count))
		bad++;
	for (int i = 0; i < count; i++)
		if (ok[i])
			gg_config_free(&cfgs[i]);
	free(cfgs);
	free(ok);
	return bad ? EXIT_CONFIG : EXIT_OK;
}

static void print_version(void)
{
	printf("gradgate %s\n", GG_VERSION);
	/* Gateways of different releases work together only where these agree. */
	printf("protocols: between sites %u, with ranks %u\n", (unsigned)GG_WIRE_VERSION, (unsigned)GG_CTRL_VERSION);
#if HAVE_CUDA
	struct gg_cuda_info info;
	gg_cuda_probe(&info);
	printf("cuda: runtime %d.%d", info.runtime_version / 1000, info.runtime_version % 1000 / 10);
	if (info.device_count > 0)
		printf(", %d device%s (%s, sm_%d%d)\n", info.device_count, info.device_count == 1 ? "" : "s",
		       info.device_name, info.cc_major, info.cc_minor);
	else
		printf(", no usable device (%s)\n", info.error);
	if (info.nccl_version)
		printf("nccl: %d.%d.%d\n", info.nccl_version / 10000, info.nccl_version / 100 % 100,
		       info.nccl_version % 100);
	else
		printf("nccl: not built\n");
#else
	printf("cuda: not built\nnccl: not built\n");
#endif
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "check-config", no_argument, NULL, 'c' },
		{ "config", required_argument, NULL, 'f' },
		{ "log-level", required_argument, NULL, 'l' },
		{ "version", no_argument, NULL, 'V' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	bool check = false;
	const char *config = NULL;
	const char *alone = NULL; /* --version or --help: nothing else may come with it */
	int c;

	if (argc > 1 && !strcmp(argv[1], "status"))
		return gg_status_main(argc - 1, argv + 1);
#if HAVE_CUDA
	/* Every kernel loaded when CUDA starts, not at its first launch: a
	 * lazy load waits for the kernels running on the GPU, and one job's
	 * NCCL reduce, waiting on a slow rank, would then hold up another
	 * job's first codec kernel. Set before any thread starts or CUDA is
	 * touched; an operator's own setting stays. */
	setenv("CUDA_MODULE_LOADING", "EAGER", 0);
	/* A CUDA stream per lane and NCCL's own share the device's hardware
	 * queues, 8 by default: work queued behind an NCCL kernel that waits
	 * on a slow rank would wait with it, one lane's codec kernels behind
	 * another job's reduce. 32 is the most CUDA gives. */
	setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
#endif
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'c':
			check = true;
			break;
		case 'f':
			if (config) { /* one gateway, one file: the last would win unseen */
				fprintf(stderr, "gradgate: --config is given twice ('%s', then '%s')\n", config, optarg);
				return EXIT_USAGE;
			}
			config = optarg;
			break;
		case 'l':
			if (!strcmp(optarg, "debug"))
				gg_log_set_level(GG_LOG_DEBUG);
			else if (!strcmp(optarg, "info"))
				gg_log_set_level(GG_LOG_INFO);
			else if (!strcmp(optarg, "warn"))
				gg_log_set_level(GG_LOG_WARN);
			else if (!strcmp(optarg, "error"))
				gg_log_set_level(GG_LOG_ERROR);
			else {
				fprintf(stderr, "gradgate: --log-level must be debug, info, warn or error\n");
				return EXIT_USAGE;
			}
			break;
		case 'V':
			alone = "--version";
			break;
		case 'h':
			alone = "--help";
			break;
		default:
			usage(stderr);
			return EXIT_USAGE;
		}
	}
	if (alone) {
		/* Else `--check-config FILE --version` would check nothing and
		 * exit 0. */
		if (argc != 2) {
			fprintf(stderr, "gradgate: %s takes no other options or arguments\n", alone);
			return EXIT_USAGE;
		}
		if (!strcmp(alone, "--version"))
			print_version();
		else
			usage(stdout);
		return EXIT_OK;
	}
	if (config && !check) {
		if (optind != argc) {
			fprintf(stderr, "gradgate: unexpected argument '%s'\n", argv[optind]);
			return EXIT_USAGE;
		}
		struct gg_config cfg;
		if (gg_config_load_report(config, &cfg, stderr))
			return EXIT_CONFIG;
		int rc = gg_daemon_run(&cfg);
		gg_config_free(&cfg);
		return rc;
	}
	if (check && config) {
		fprintf(stderr, "gradgate: --check-config takes the files to check as its arguments, not --config "
				"(gradgate --check-config FILE...)\n");
		return EXIT_USAGE;
	}
	if (!check) {
		usage(stderr);
		return EXIT_USAGE;
	}
	if (optind == argc) {
		fprintf(stderr, "gradgate: --check-config needs at least one FILE\n");
		return EXIT_USAGE;
	}
	return check_configs(argc - optind, argv + optind);
}
