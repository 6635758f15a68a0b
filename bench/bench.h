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
/* gradgate-bench codec: ratio, speed and error of every codec. */
int gg_bench_codec_main(int argc, char **argv);

#endif
