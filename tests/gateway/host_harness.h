/* Test harness for host mode: the host backend on its own io_uring loop in
 * a thread, a fake core, raw protocol clients, reference sums and checks. */
#ifndef GG_HOST_HARNESS_H
#define GG_HOST_HARNESS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "control_proto.h"
#include "gradgate.h"
#include "host_backend.h"

#include "gg_require.h"

#define CHECK_CONTAINS(got, want)                                                                                     \
	do {                                                                                                          \
		const char *g_ = (got), *w_ = (want);                                                                 \
		if (!strstr(g_, w_)) {                                                                                \
			fprintf(stderr, "%s:%d: %s is\n  \"%s\"\nwhich lacks\n  \"%s\"\n", __FILE__, __LINE__, #got, g_, w_); \
			exit(1);                                                                                      \
		}                                                                                                     \
	} while (0)

/* An error with its code and the pieces its message must contain. */
#define CHECK_ERR(err, want_code, ...)                                                                         \
	do {                                                                                                   \
		const char *parts_[] = { __VA_ARGS__ };                                                        \
		if ((err).code != (want_code)) {                                                               \
			fprintf(stderr, "%s:%d: error code %d (%s), expected %d; message \"%s\"\n", __FILE__,  \
				__LINE__, (err).code, gg_strerror((err).code), (want_code), (err).message);    \
			exit(1);                                                                       \
		}                                                                                      \
		for (size_t i_ = 0; i_ < sizeof(parts_) / sizeof(parts_[0]); i_++)                     \
			CHECK_CONTAINS((err).message, parts_[i_]);                                     \
	} while (0)

enum core_mode {
	CORE_SUM,    /* the result is the site sum: a single site */
	CORE_ERROR,  /* fails every step as a lost peer site would */
	CORE_HOLD,   /* holds every step until its deadline, then fails it */
	CORE_REFUSE, /* submit() refuses */
	CORE_PROMISED, /* holds every step until the backend aborts it, which is too
			* late (the peers were told the result is whole): then
			* completes it with the site sum */
};

#define CORE_ERROR_TEXT "site eu-west: peer gateway closed the connection"
#define CORE_HOLD_TEXT "site eu-west: no data from the peer before the step deadline"
#define FAILED_ELSEWHERE_TEXT "site eu-west aborted steps 2 to 9 of the job: its ranks there are gone"

struct harness_options {
	unsigned max_clients;       /* 0: 16 */
	uint64_t max_message_bytes; /* 0: 1 GiB */
	uint64_t memory_bytes;      /* 0: 4 GiB */
	uint64_t step_timeout_us;   /* 0: 20 s */
	uint64_t hello_timeout_us;  /* 0: 5 s */
	uint64_t session_idle_us;   /* 0: jobs never give their sessions up */
	bool user_shares;           /* other users get half the sessions and of max_jobs */
	unsigned max_jobs;
	const struct gg_site_nccl_ops *nccl; /* NULL: a gateway built without NCCL */
	/* Whether a call of `nccl` is under way (cudaFree would wait for it):
	 * the core must not be let free GPU memory then. NULL: not checked. */
	bool (*nccl_busy)(void);
};

struct harness {
	char dir[64];
	char path[96];
	char endpoint[112];
	struct harness_options opts;
	pthread_t thread;
	atomic_bool stop;
	atomic_int core_mode;      /* enum core_mode */
	atomic_bool core_sync;     /* complete from inside submit() */
	atomic_uint steps_submitted;
	atomic_uint aborts_told;   /* abort() calls of the backend on the core */
	atomic_bool gpu_frees_held; /* the backend told the core not to free GPU memory */
	atomic_uint gpu_holds;      /* how often */
	atomic_uint refusal_lines;  /* "control connection ... refused" lines logged */
	atomic_uint refusals_unlogged; /* refusals those lines say were left out */
	atomic_uint session_lines;     /* "rank R of job 'J' ..." lines: a rank came or left */
	atomic_uint sessions_unlogged; /* such lines the backend says it left out */
	atomic_uint fault_lines;       /* lines of faults of the gateway's own (warnings) */
	/* Steps from this one on failed at another site, as the core says
	 * (fail_unstarted) and fails them when submitted; 0: none. */
	atomic_ullong failed_from;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int state;                 /* 0 starting, 1 serving or failed, 2 stopped */
	int start_rc;
	char start_err[256];
	struct gg_host_backend_stats stats; /* published by the loop thread */
	struct gg_host_backend_stats final; /* after stop */
	unsigned fds_before;
};

/* Starts a gateway on a fresh socket in a fresh folder under /tmp. */
void harness_start(struct harness *h, const struct harness_options *opts);
/* Tells the gateway to stop without waiting for it. */
void harness_stop_begin(struct harness *h);
/* Stops it and checks that nothing is left: connections, jobs, regions,
 * sums, file descriptors (all sessions must be closed by then). */
void harness_stop(struct harness *h);
/* The backend's counters as of the loop's last turn. */
struct gg_host_backend_stats harness_stats(struct harness *h);
/* Waits up to 5 s until the gateway has `n` connections open. */
void harness_wait_connections(struct harness *h, unsigned n);

unsigned count_open_fds(void);

/* Raw protocol clients, for what the library would never send. */
int raw_connect(const struct harness *h);
void raw_send(int fd, const void *msg, size_t len, int pass_fd);
/* Returns the packet's length, 0 at end of stream; fails the test after
 * 5 s without one. */
size_t raw_recv(int fd, union gg_ctrl_msg *m);
/* HELLO as rank/nranks of job; checks the answer is ACCEPT. */
void raw_hello(int fd, const char *job, unsigned rank, unsigned nranks);
/* Expects an ERROR or REFUSE (type) containing `text`, then the end of
 * the stream; closes fd. */
void raw_expect_close(int fd, enum gg_ctrl_type type, int code, const char *text);
/* A sealed memfd of `size` bytes, and a MAP of it as region `id`. */
int raw_memfd(uint64_t size, bool seal);
void raw_map(int fd, unsigned id, uint64_t size, int memfd);
void raw_allreduce(int fd, uint64_t seq, uint32_t tensor, uint32_t dtype, uint64_t count, unsigned region,
		   uint64_t offset);

/* Inputs and reference results. Every rank's input is a function of
 * (seed, rank) with varied magnitudes, signed zeros, infinities and NaN. */
void fill_input_f32(float *x, size_t n, uint32_t seed, unsigned rank);
void fill_input_bf16(uint16_t *x, size_t n, uint32_t seed, unsigned rank);
/* out = in[0] + in[1] + ... left to right in float32; bf16 widened first,
 * rounded to nearest even at the end. */
void reference_f32(float *out, float *const *in, unsigned nranks, size_t n);
void reference_bf16(uint16_t *out, uint16_t *const *in, unsigned nranks, size_t n);
/* Bit-for-bit comparison, naming the first element that differs. */
void check_same_bytes(const void *got, const void *want, size_t n, size_t esize, const char *what);

/* Runs fn(rank, arg) for ranks 0..n-1, each in its own thread, and joins. */
void run_ranks(unsigned n, void (*fn)(unsigned rank, void *arg), void *arg);

#endif
