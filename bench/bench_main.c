#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "bench.h"
#include "gg_build_config.h"
#include "gg_common.h"
#include "units.h"

static const struct gg_bench_cmd commands[] = {
	{ "allreduce", "one rank's all-reduce loop through a running gateway, checked", gg_bench_allreduce_main },
	{ "gateway", "gateway-to-gateway all-reduce throughput against the TLS transport's", gg_bench_gateway_main },
	{ "codec", "codec ratio, speed and error on synthetic or given data", gg_bench_codec_main },
	{ "datapath", "each pass a gateway makes over a step's bytes, timed alone, and their sum", gg_bench_datapath_main },
	{ "transport", "TLS 1.3 vs plain: throughput, CPU per GB, round-trip latency", gg_bench_transport_main },
	{ "wan", "all-reduce steps across sites over rate-limited links, gradgate against gloo", gg_bench_wan_main },
};

int gg_bench_number(const char *cmd, const char *opt, const char *arg, long long lo, long long hi, long long *out)
{
	char *end;

	errno = 0;
	long long v = strtoll(arg, &end, 10);
	/* strtoll takes leading blanks and a sign; a number here is digits. */
	bool digits = (arg[0] >= '0' && arg[0] <= '9') || (arg[0] == '-' && arg[1] >= '0' && arg[1] <= '9');
	if (!digits || *end || errno || v < lo || v > hi) {
		fprintf(stderr, "gradgate-bench %s: %s must be %lld to %lld, not '%s'\n", cmd, opt, lo, hi, arg);
		return 2;
	}
	*out = v;
	return 0;
}

int gg_bench_size(const char *cmd, const char *opt, const char *arg, uint64_t lo, uint64_t hi, uint64_t multiple,
		  uint64_t *out)
{
	const char *why = NULL;
	uint64_t v;

	if (gg_parse_size(arg, &v, &why) || v < lo || v > hi || v % multiple) {
		char l[32], h[32], m[48] = "";
		if (multiple == sizeof(float))
			snprintf(m, sizeof(m), ", whole fp32 elements (a multiple of 4 bytes)");
		else if (multiple > 1)
			snprintf(m, sizeof(m), ", a multiple of %llu bytes", (unsigned long long)multiple);
		fprintf(stderr, "gradgate-bench %s: %s must be %s to %s%s, not '%s'%s%s%s\n", cmd, opt,
			gg_format_size(lo, l, sizeof(l)), gg_format_size(hi, h, sizeof(h)), m, arg, why ? " (" : "",
			why ? why : "", why ? ")" : "");
		return 2;
	}
	*out = v;
	return 0;
}

int gg_bench_parse_rate(const char *text, double *bps)
{
	static const struct {
		char prefix;
		double mult;
	} prefixes[] = { { 'k', 1e3 }, { 'm', 1e6 }, { 'g', 1e9 }, { 't', 1e12 } };
	static const char *const units[] = { "", "bit", "bit/s", "bps" };
	char *end;
	double v = strtod(text, &end), mult = 1;

	if (end == text || !(v > 0) || !isfinite(v))
		return -EINVAL;
	for (size_t i = 0; i < GG_ARRAY_LEN(prefixes); i++)
		if (tolower((unsigned char)*end) == prefixes[i].prefix) {
			mult = prefixes[i].mult;
			end++;
			break;
		}
	for (size_t i = 0; i < GG_ARRAY_LEN(units); i++)
		if (!strcasecmp(end, units[i])) {
			*bps = v * mult;
			return 0;
		}
	return -EINVAL;
}

int gg_bench_no_operands(const char *cmd, int argc, char **argv, int optind_after)
{
	if (optind_after >= argc)
		return 0;
	fprintf(stderr, "gradgate-bench %s: unexpected argument '%s' (see --help)\n", cmd, argv[optind_after]);
	return 2;
}

int gg_bench_bad_option(const char *cmd, int c, char **argv)
{
	char shortopt[3] = { '-', (char)optopt, '\0' };
	/* A short option is optopt; a long one, or one that took its value's
	 * place, the argument getopt_long() stepped over. */
	const char *a = c == '?' && optopt ? shortopt : argv[optind - 1];

	if (c == ':')
		fprintf(stderr, "gradgate-bench %s: %s needs a value (see --help)\n", cmd, a);
	else
		fprintf(stderr, "gradgate-bench %s: unknown option '%s' (see --help)\n", cmd, a);
	return 2;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: gradgate-bench COMMAND [options]\n\ncommands:\n");
	for (size_t i = 0; i < GG_ARRAY_LEN(commands); i++)
		if (commands[i].name)
			fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
	fprintf(f, "\n'gradgate-bench COMMAND --help' describes each command's options.\n");
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "--version")) {
		printf("gradgate-bench %s\n", GG_VERSION);
		return 0;
	}
	for (size_t i = 0; i < GG_ARRAY_LEN(commands); i++)
		if (commands[i].name && !strcmp(argv[1], commands[i].name)) {
			/* getopt names the program in its messages */
			static char name[64];
			snprintf(name, sizeof(name), "gradgate-bench %s", commands[i].name);
			argv[1] = name;
			return commands[i].main(argc - 1, argv + 1);
		}
	fprintf(stderr, "gradgate-bench: unknown command '%s'\n", argv[1]);
	usage(stderr);
	return 2;
}
