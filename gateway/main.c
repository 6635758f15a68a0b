/* gradgate: the per-site gateway. */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "daemon.h"
#include "gg_build_config.h"
#include "gg_common.h"
#include "host_backend.h"
#include "log.h"
#include "net_addr.h"
#include "node.h"
#include "status.h"
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
		"                          problem found; exit 1 if any file has problems\n"
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

static int check_configs(int count, char **paths)
{
	int bad = 0;

	for (int i = 0; i < count; i++) {
		struct gg_config cfg;
		if (gg_config_load_report(paths[i], &cfg, stderr)) {
			bad++;
			continue;
		}
		/* A clean check means the gateway starts (the systemd unit runs
		 * it first): the files must be what they claim, not just
		 * readable. */
		char err[GG_NODE_ERROR_MAX];
		struct sockaddr_storage metrics;
		socklen_t metrics_len;
		struct gg_config_pos at;
		int rc = gg_node_check_host(&cfg, &at, err, sizeof(err));
		if (!rc) {
			at = cfg.at.control;
			rc = gg_host_backend_check_control(cfg.site.control, err, sizeof(err));
		}
		if (!rc && cfg.metrics.listen) {
			at = cfg.at.metrics_listen;
			const char *why;
			rc = gg_daemon_metrics_address(&cfg, &metrics, &metrics_len, err, sizeof(err));
			if (!rc && (rc = gg_net_addr_is_local((struct sockaddr *)&metrics, metrics_len, &why)))
				snprintf(err, sizeof(err), "[metrics] listen %s: %s", cfg.metrics.listen, why);
		}
		if (rc) {
			report(paths[i], at, err);
			gg_config_free(&cfg);
			bad++;
			continue;
		}
		if (i)
			putchar('\n');
		if (gg_config_print(&cfg, stdout)) {
			report(paths[i], (struct gg_config_pos){ 0, 0 }, "out of memory printing its configuration");
			bad++;
		}
		gg_config_free(&cfg);
	}
	return bad ? EXIT_CONFIG : EXIT_OK;
}

static void print_version(void)
{
	printf("gradgate %s\n", GG_VERSION);
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
