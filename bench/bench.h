/* gradgate-bench subcommands. Each takes the arguments after its name and
 * returns the process exit status. */
#ifndef GG_BENCH_H
#define GG_BENCH_H

#include <stdint.h>

struct gg_bench_cmd {
	const char *name;
	const char *summary;
	int (*main)(int argc, char **argv);
};

/* gradgate-bench allreduce: one rank's checked all-reduce loop through a gateway. */
int gg_bench_allreduce_main(int argc, char **argv);
/* gradgate-bench transport: TLS vs plain throughput, CPU and latency. */
int gg_bench_transport_main(int argc, char **argv);
/* One loopback run of the transport benchmark, for other benchmarks'
 * same-run baselines: `streams` TLS streams of ciphersuite `suite` (IANA
 * name) for `seconds`, throwaway certificates. Returns 0 with *gbps set, or
 * a negative errno (the reason is on stderr). */
int gg_bench_transport_loopback(const char *suite, int streams, double seconds, double *gbps);
/* gradgate-bench gateway: gateway-to-gateway all-reduce throughput against
 * the transport's, measured in the same run. */
int gg_bench_gateway_main(int argc, char **argv);
/* gradgate-bench codec: ratio, speed and error of every codec. */
int gg_bench_codec_main(int argc, char **argv);
/* gradgate-bench wan: an all-reduce step across sites over rate-limited
 * links in network namespaces, gradgate against gloo. */
int gg_bench_wan_main(int argc, char **argv);
/* gradgate-bench datapath: each pass over a step's bytes, timed alone. */
int gg_bench_datapath_main(int argc, char **argv);

/* The whole of `arg` as a decimal integer from lo to hi into *out: 0, or
 * 2 (the usage exit status) after "gradgate-bench CMD: OPT must be LO to
 * HI, not 'ARG'" on stderr. */
int gg_bench_number(const char *cmd, const char *opt, const char *arg, long long lo, long long hi, long long *out);
/* The whole of `arg` as a size (a number with an optional unit, as the
 * config's sizes) from lo to hi bytes and a multiple of `multiple` (at
 * least 1) into
 * *out: 0, or 2 after "gradgate-bench CMD: OPT must be LO to HI[, whole
 * fp32 elements (a multiple of 4 bytes)], not 'ARG'" on stderr. */
int gg_bench_size(const char *cmd, const char *opt, const char *arg, uint64_t lo, uint64_t hi, uint64_t multiple,
		  uint64_t *out);
/* A rate in bits per second: a number, then k, M, G or T (any case) or
 * none, then bit, bit/s, bps or nothing: 2G, 2gbit, 2.5Gbit/s, 500M and
 * 500mbit all read. 0 with *bps set, or -EINVAL. */
int gg_bench_parse_rate(const char *text, double *bps);
/* Arguments left after the options: 0 when there are none, else 2 after
 * naming the first on stderr. */
int gg_bench_no_operands(const char *cmd, int argc, char **argv, int optind_after);
/* For getopt_long() with an option string that starts with ':' (so that
 * it prints nothing itself), once it returned c, '?' or ':': names the
 * unknown option, or the one missing its value, in one line on stderr.
 * Returns 2. */
int gg_bench_bad_option(const char *cmd, int c, char **argv);

#endif
