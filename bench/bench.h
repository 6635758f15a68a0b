/* gradgate-bench subcommands. Each takes the arguments after its name and
 * returns the process exit status. */
#ifndef GG_BENCH_H
#define GG_BENCH_H

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
/* Arguments left after the options: 0 when there are none, else 2 after
 * naming the first on stderr. */
int gg_bench_no_operands(const char *cmd, int argc, char **argv, int optind_after);

#endif
