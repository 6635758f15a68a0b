#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "gg_build_config.h"
#include "gg_common.h"

static const struct gg_bench_cmd commands[] = {
	{ "allreduce", "one rank's all-reduce loop through a running gateway, checked", gg_bench_allreduce_main },
	{ "gateway", "gateway-to-gateway all-reduce throughput against the TLS transport's", gg_bench_gateway_main },
	{ "codec", "codec ratio, speed and error on synthetic or given data", gg_bench_codec_main },
	{ "datapath", "each pass a gateway makes over a step's bytes, timed alone, and their sum", gg_bench_datapath_main },
	{ "transport", "TLS 1.3 vs plain: throughput, CPU per GB, round-trip latency", gg_bench_transport_main },
	{ "wan", "all-reduce steps across sites over rate-limited links, gradgate against gloo", gg_bench_wan_main },
};

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
		if (commands[i].name && !strcmp(argv[1], commands[i].name))
			return commands[i].main(argc - 1, argv + 1);
	fprintf(stderr, "gradgate-bench: unknown command '%s'\n", argv[1]);
	usage(stderr);
	return 2;
}
