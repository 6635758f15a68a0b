/* gg_allreduce_nccl() of the client library, end to end on every machine:
 * the ranks' NCCL is nccl_api_double.h and their CUDA driver
 * fake_cuda_driver.h, the gateway the host backend with the stand-in
 * communicator (nccl_double.h). Results must be the rank-order sum bit
 * for bit; refusals, failures and their messages as gradgate.h says; and
 * no communicator, connection or descriptor left behind. */
#include <dlfcn.h>
#include <errno.h>
#include <time.h>
#include <unistd.h>

#include "fake_cuda_driver.h"
#include "host_harness.h"
#include "nccl_api_double.h"
#include "nccl_double.h"

#define STEP_TIMEOUT_MS 2000
#define MAX_RANKS 3

static struct harness h;

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* `n` floats of "device memory" of `device` (host memory the stand-in
 * driver calls so). */
static float *dev_alloc(size_t n, int device)
{
	float *p = malloc(n * sizeof(float));

	CHECK(p);
	fcd_add(p, n * sizeof(float), FCD_DEVICE, device);
	return p;
}

static void dev_free(float *p)
{
	fcd_remove(p);
	free(p);
}

static struct gg_session *open_rank(const char *job, int rank, int nranks)
{
	struct gg_session *s = NULL;
	struct gg_error err;

	if (gg_session_open(h.endpoint, job, rank, nranks, &s, &err)) {
		fprintf(stderr, "gg_session_open(%s, rank %d): %s\n", job, rank, err.message);
		exit(1);
	}
	return s;
}

/* The rank-order sum of the ranks' inputs of `seed`. */
static float *want_sum(size_t n, unsigned nranks, uint32_t seed)
{
	float *in[MAX_RANKS] = { 0 }, *want = malloc(n * sizeof(float));

	CHECK(want);
	for (unsigned r = 0; r < nranks; r++) {
		CHECK((in[r] = malloc(n * sizeof(float))));
		fill_input_f32(in[r], n, seed, r);
	}
	reference_f32(want, in, nranks, n);
	for (unsigned r = 0; r < nranks; r++)
		free(in[r]);
	return want;
}

/* A job whose ranks run on threads of their own, each with its own
 * stream (any distinct pointer stands for one). */
struct job {
	const char *name;
	unsigned nranks;
	struct gg_session *s[MAX_RANKS];
	char stream[MAX_RANKS];
};

static const uint64_t sizes[] = { 1000, 1, 4097, 100000 };

/* Steps of several sizes, in place on the rank's device memory. */
static void sum_rank(unsigned rank, void *arg)
{
	struct job *j = arg;
	struct gg_error err;

	fcd_set_current(0);
	j->s[rank] = open_rank(j->name, (int)rank, (int)j->nranks);
	for (unsigned k = 0; k < GG_ARRAY_LEN(sizes); k++) {
		const size_t n = sizes[k];
		float *buf = dev_alloc(n, 0), *want = want_sum(n, j->nranks, 60 + k);
		fill_input_f32(buf, n, 60 + k, rank);
		int rc = gg_allreduce_nccl(j->s[rank], buf, n, GG_DTYPE_F32, 7, &j->stream[rank], STEP_TIMEOUT_MS, &err);
		if (rc) {
			fprintf(stderr, "rank %u step %u: %s\n", rank, k + 1, err.message);
			exit(1);
		}
		check_same_bytes(buf, want, n, sizeof(float), "NCCL step result");
		free(want);
		dev_free(buf);
	}
}

static void close_job(struct job *j)
{
	for (unsigned r = 0; r < j->nranks; r++) {
		gg_session_close(j->s[r]);
		j->s[r] = NULL;
	}
	harness_wait_connections(&h, 0);
}

/* Every rank ends with the rank-order sum; a clean close flushes and
 * frees each communicator, aborting none. */
static void test_sums(void)
{
	struct job j = { .name = "cn-sum", .nranks = 3 };
	unsigned aborts, finalizes, aborts0, finalizes0;

	nad_counts(&aborts0, &finalizes0);
	run_ranks(j.nranks, sum_rank, &j);
	CHECK(nad_last_nonblocking());
	CHECK_EQ_INT(nad_live(), j.nranks);
	close_job(&j);
	nad_counts(&aborts, &finalizes);
	CHECK_EQ_INT(nad_live(), 0);
	CHECK_EQ_INT(finalizes - finalizes0, j.nranks);
	CHECK_EQ_INT(aborts - aborts0, 0);
	printf("client nccl: %zu steps of 3 ranks exact, communicators flushed at close\n", GG_ARRAY_LEN(sizes));
}

static void expect_refused(struct gg_session *s, void *buf, size_t n, enum gg_dtype dtype, const char *text)
{
	struct gg_error err;

	CHECK_EQ_INT(gg_allreduce_nccl(s, buf, n, dtype, 1, NULL, STEP_TIMEOUT_MS, &err), GG_ERR_INVALID);
	CHECK_ERR(err, GG_ERR_INVALID, text);
}

/* What gradgate.h says is refused, before anything is sent: the session
 * goes on and its next step works. */
static void test_refusals(void)
{
	enum { N = 64 };
	struct gg_session *s = open_rank("cn-refuse", 0, 1);
	float host[N], *dev0 = dev_alloc(N, 0), *dev1 = dev_alloc(N, 1);
	float *pinned = malloc(N * sizeof(float)), *managed = malloc(N * sizeof(float)),
	      *split = malloc(2 * N * sizeof(float)), *shortr = malloc(N * sizeof(float));
	struct gg_error err;

	CHECK(pinned && managed && split && shortr);
	fcd_add(pinned, N * sizeof(float), FCD_PINNED, 0);
	fcd_add(managed, N * sizeof(float), FCD_MANAGED, 0);
	fcd_add(split, N * sizeof(float), FCD_DEVICE, 0);
	fcd_add(split + N, N * sizeof(float), FCD_DEVICE, 1);
	fcd_add(shortr, N * sizeof(float) - 4, FCD_DEVICE, 0);

	fcd_set_current(0);
	expect_refused(s, dev0, N, GG_DTYPE_BF16, "NCCL steps take float32 only");
	expect_refused(s, host, N, GG_DTYPE_F32, "is not CUDA device memory (host memory goes through gg_allreduce)");
	expect_refused(s, pinned, N, GG_DTYPE_F32, "pinned host memory goes through gg_allreduce");
	expect_refused(s, managed, N, GG_DTYPE_F32, "is CUDA managed memory");
	expect_refused(s, split, 2 * N, GG_DTYPE_F32, "start in memory of GPU 0 and end in memory of GPU 1");
	expect_refused(s, shortr, N, GG_DTYPE_F32, "the last of the 256 bytes at devbuf");
	expect_refused(s, dev1, N, GG_DTYPE_F32, "the calling thread's current CUDA device, on which the rank joins the "
		       "job's NCCL communicator, is GPU 0");
	fcd_set_current(-1);
	expect_refused(s, dev1, N, GG_DTYPE_F32, "call cudaSetDevice(1) first");
	CHECK_EQ_INT(nad_live(), 0); /* nothing joined yet */

	/* With no current device, NCCL joins on GPU 0: its memory will do. */
	float want[N];
	fill_input_f32(dev0, N, 5, 0);
	fill_input_f32(want, N, 5, 0);
	CHECK_EQ_INT(gg_allreduce_nccl(s, dev0, N, GG_DTYPE_F32, 1, NULL, STEP_TIMEOUT_MS, &err), GG_OK);
	for (unsigned i = 0; i < N; i++)
		want[i] += -0.0f; /* the rank-order sum of one rank */
	check_same_bytes(dev0, want, N, sizeof(float), "one rank's NCCL step");
	fcd_set_current(1);
	expect_refused(s, dev1, N, GG_DTYPE_F32, "is memory of GPU 1, but the session's NCCL communicator is on GPU 0");
	CHECK_EQ_INT(gg_allreduce_nccl(s, dev0, N, GG_DTYPE_F32, 1, NULL, STEP_TIMEOUT_MS, &err), GG_OK);

	gg_session_close(s);
	harness_wait_connections(&h, 0);
	CHECK_EQ_INT(nad_live(), 0);
	fcd_set_current(0);
	dev_free(dev0);
	dev_free(dev1);
	fcd_remove(pinned);
	fcd_remove(managed);
	fcd_remove(split);
	fcd_remove(split + N);
	fcd_remove(shortr);
	free(pinned);
	free(managed);
	free(split);
	free(shortr);
	printf("client nccl: refusals before the step, the session unharmed\n");
}

/* One rank's first call, on a thread of its own. */
struct caller {
	struct gg_session *s;
	float *buf;
	size_t n;
	int timeout_ms;
	void *stream;
	int rc;
	struct gg_error err;
	uint64_t ms;
	pthread_t t;
};

static void *caller_main(void *arg)
{
	struct caller *c = arg;
	uint64_t t0 = now_ms();

	c->rc = gg_allreduce_nccl(c->s, c->buf, c->n, GG_DTYPE_F32, 3, c->stream, c->timeout_ms, &c->err);
	c->ms = now_ms() - t0;
	return NULL;
}

/* Two ranks in one process must not share a stream, as two processes do
 * not: each rank's call waits for its stream's work. */
static void caller_start(struct caller *c, struct gg_session *s, int timeout_ms, void *stream)
{
	*c = (struct caller){ .s = s, .n = 16, .timeout_ms = timeout_ms, .stream = stream };
	c->buf = dev_alloc(c->n, 0);
	CHECK(pthread_create(&c->t, NULL, caller_main, c) == 0);
}

static void caller_end(struct caller *c)
{
	CHECK(pthread_join(c->t, NULL) == 0);
	dev_free(c->buf);
}

/* A rank whose partner never makes its first NCCL call: the communicator
 * does not come up within the call's timeout, and the session ends. */
static void test_join_timeout(void)
{
	struct gg_session *s0 = open_rank("cn-join", 0, 2), *s1 = open_rank("cn-join", 1, 2);
	struct caller c;

	fcd_set_current(0);
	caller_start(&c, s0, 300, NULL);
	caller_end(&c);
	CHECK_ERR(c.err, GG_ERR_TIMEOUT, "step 1 (tensor 3), not sent: the NCCL communicator of job 'cn-join' did not come up "
		  "within 300 ms: a rank of the job did not make its first gg_allreduce_nccl in time");
	CHECK(c.ms >= 300 && c.ms < 2000);
	CHECK_EQ_INT(nad_live(), 0); /* aborted */
	float x = 1.0f;
	struct gg_error err;
	CHECK_EQ_INT(gg_allreduce(s0, &x, 1, GG_DTYPE_F32, 1, 100, &err), GG_ERR_TIMEOUT);
	gg_session_close(s0);
	gg_session_close(s1);
	harness_wait_connections(&h, 0);
	printf("client nccl: a partner that never joins: TIMEOUT after %llu ms, session ended\n",
	       (unsigned long long)c.ms);
}

/* Waits up to 5 s until `n` ranks' communicators exist (a rank makes its
 * own once the gateway's NCCL_ID came). */
static void wait_live(unsigned n)
{
	for (unsigned i = 0; nad_live() != n; i++) {
		CHECK(i < 5000);
		usleep(1000);
	}
}

/* A partner that leaves while this rank waits for the communicator to
 * come up fails the job: the gateway ends the waiting rank's session at
 * once, with the reason, not at the call's timeout. */
static void test_partner_leaves_in_join(void)
{
	struct gg_session *s0 = open_rank("cn-leave", 0, 2), *s1 = open_rank("cn-leave", 1, 2);
	struct caller c;

	fcd_set_current(0);
	caller_start(&c, s0, 5000, NULL);
	wait_live(1);
	gg_session_close(s1);
	caller_end(&c);
	CHECK_ERR(c.err, GG_ERR_RANK, "step 1 (tensor 3), not sent: gateway of site test-site: ", "rank 1 of job 'cn-leave'");
	CHECK(c.ms < 2000);
	CHECK_EQ_INT(nad_live(), 0);
	gg_session_close(s0);
	harness_wait_connections(&h, 0);
	printf("client nccl: a partner that leaves while the communicator comes up: failed in %llu ms: %s\n",
	       (unsigned long long)c.ms, c.err.message);
}

/* An NCCL error at one rank while it joins ends its session: it gets the
 * call, where the library made it, and NCCL's words. */
static void test_join_error(void)
{
	struct gg_session *s0 = open_rank("cn-joinerr", 0, 1);
	struct gg_error err;
	float *buf = dev_alloc(8, 0);

	fcd_set_current(0);
	fill_input_f32(buf, 8, 1, 0);
	nad_fail_next(NAD_INIT);
	CHECK_EQ_INT(gg_allreduce_nccl(s0, buf, 8, GG_DTYPE_F32, 1, NULL, STEP_TIMEOUT_MS, &err), GG_ERR_SYSTEM);
	CHECK_ERR(err, GG_ERR_SYSTEM, "joining the NCCL communicator of job 'cn-joinerr': ", "gateway/client/nccl_lib.c:",
		  ": ncclCommInitRankConfig: unhandled cuda error", "(NCCL error 1: injected failure)");
	gg_session_close(s0);
	harness_wait_connections(&h, 0);

	s0 = open_rank("cn-joinerr", 0, 1);
	nad_fail_next(NAD_JOIN);
	CHECK_EQ_INT(gg_allreduce_nccl(s0, buf, 8, GG_DTYPE_F32, 1, NULL, STEP_TIMEOUT_MS, &err), GG_ERR_SYSTEM);
	CHECK_ERR(err, GG_ERR_SYSTEM, "joining the NCCL communicator of job 'cn-joinerr': ", "gateway/client/nccl_lib.c:",
		  ": ncclCommInitRankConfig: unhandled cuda error", "(NCCL error 1: injected failure)");
	CHECK_EQ_INT(nad_live(), 0);
	gg_session_close(s0);
	harness_wait_connections(&h, 0);
	dev_free(buf);
	printf("client nccl: NCCL errors while joining name the call and NCCL's words\n");
}

/* A rank whose reduce cannot be enqueued ends its session; its partner's
 * step fails at once (not at its deadline) and its communicator is
 * aborted: its later NCCL steps fail, saying to open a new session. */
static void test_enqueue_error(void)
{
	struct job j = { .name = "cn-enq", .nranks = 2 };
	struct gg_error err;

	j.s[0] = open_rank(j.name, 0, 2);
	j.s[1] = open_rank(j.name, 1, 2);
	/* Both up, one step done. */
	struct caller c;
	fcd_set_current(0);
	caller_start(&c, j.s[1], STEP_TIMEOUT_MS, &j.stream[1]);
	float *buf = dev_alloc(16, 0);
	CHECK_EQ_INT(gg_allreduce_nccl(j.s[0], buf, 16, GG_DTYPE_F32, 3, &j.stream[0], STEP_TIMEOUT_MS, &err), GG_OK);
	caller_end(&c);
	CHECK_EQ_INT(c.rc, GG_OK);

	/* Rank 1's reduce is enqueued first, and rank 0's fails. */
	const unsigned reduced = nad_reduces();
	caller_start(&c, j.s[1], STEP_TIMEOUT_MS, &j.stream[1]);
	for (unsigned i = 0; nad_reduces() == reduced; i++) {
		CHECK(i < 5000);
		usleep(1000);
	}
	nad_fail_next(NAD_REDUCE);
	uint64_t t0 = now_ms();
	CHECK_EQ_INT(gg_allreduce_nccl(j.s[0], buf, 16, GG_DTYPE_F32, 3, &j.stream[0], STEP_TIMEOUT_MS, &err),
		     GG_ERR_SYSTEM);
	CHECK_ERR(err, GG_ERR_SYSTEM, "step 2 (tensor 3): ", "gateway/client/nccl_lib.c:",
		  ": ncclReduce of the tensor to the gateway: unhandled cuda error", "(NCCL error 1: injected failure)");
	caller_end(&c);
	CHECK(c.rc != GG_OK);
	CHECK(now_ms() - t0 < STEP_TIMEOUT_MS / 2);
	CHECK_CONTAINS(c.err.message, "rank 0");
	CHECK_EQ_INT(gg_allreduce_nccl(j.s[1], buf, 16, GG_DTYPE_F32, 3, &j.stream[1], STEP_TIMEOUT_MS, &err), c.rc);
	CHECK_ERR(err, c.rc, "the session's NCCL communicator was aborted", "close the session and open a new one");
	close_job(&j);
	CHECK_EQ_INT(nad_live(), 0);
	dev_free(buf);
	printf("client nccl: an enqueue error ends that rank's session; its partner fails at once (%d, %llu ms)\n",
	       c.rc, (unsigned long long)c.ms);
}

/* A failed exchange is still broadcast: the communicator lives on. */
static void test_exchange_error(void)
{
	struct job j = { .name = "cn-core", .nranks = 2 };
	struct gg_error err;
	struct caller c;
	float *buf = dev_alloc(16, 0);

	j.s[0] = open_rank(j.name, 0, 2);
	j.s[1] = open_rank(j.name, 1, 2);
	fcd_set_current(0);
	atomic_store(&h.core_mode, CORE_ERROR);
	caller_start(&c, j.s[1], STEP_TIMEOUT_MS, &j.stream[1]);
	CHECK_EQ_INT(gg_allreduce_nccl(j.s[0], buf, 16, GG_DTYPE_F32, 3, &j.stream[0], STEP_TIMEOUT_MS, &err),
		     GG_ERR_SITE);
	CHECK_ERR(err, GG_ERR_SITE, CORE_ERROR_TEXT);
	caller_end(&c);
	CHECK_ERR(c.err, GG_ERR_SITE, CORE_ERROR_TEXT);
	atomic_store(&h.core_mode, CORE_SUM);

	float *want = want_sum(16, 2, 9);
	caller_start(&c, j.s[1], STEP_TIMEOUT_MS, &j.stream[1]);
	fill_input_f32(c.buf, 16, 9, 1);
	fill_input_f32(buf, 16, 9, 0);
	CHECK_EQ_INT(gg_allreduce_nccl(j.s[0], buf, 16, GG_DTYPE_F32, 3, &j.stream[0], STEP_TIMEOUT_MS, &err), GG_OK);
	check_same_bytes(buf, want, 16, sizeof(float), "the step after a failed exchange");
	caller_end(&c);
	CHECK_EQ_INT(c.rc, GG_OK);
	free(want);
	close_job(&j);
	dev_free(buf);
	printf("client nccl: a failed exchange leaves the communicator usable\n");
}

/* A gateway that stops while ranks wait for the communicator to come up
 * tells each at once that it is shutting down (GG_ERR_CLOSED), whichever
 * it ends first. Stops the harness. */
static void test_stop_in_join(void)
{
	struct gg_session *s[3];
	struct caller c[2];

	for (int r = 0; r < 3; r++)
		s[r] = open_rank("cn-stop", r, 3);
	fcd_set_current(0);
	caller_start(&c[0], s[0], 5000, &c[0]);
	caller_start(&c[1], s[1], 5000, &c[1]);
	wait_live(2);
	harness_stop_begin(&h);
	for (int r = 0; r < 2; r++) {
		caller_end(&c[r]);
		CHECK_ERR(c[r].err, GG_ERR_CLOSED, "step 1 (tensor 3), not sent: the gateway of site test-site is shutting down");
		CHECK(c[r].ms < 2000);
	}
	CHECK_EQ_INT(nad_live(), 0);
	for (int r = 0; r < 3; r++)
		gg_session_close(s[r]);
	harness_stop(&h);
	printf("client nccl: a gateway stopping while the communicator comes up: both waiting ranks told in %llu "
	       "and %llu ms: %s\n", (unsigned long long)c[0].ms, (unsigned long long)c[1].ms, c[0].err.message);
}

int main(void)
{
	void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);

	/* The build puts them in place: anything else is a broken set-up,
	 * which would test the real libraries (or none). */
	if (!cuda || !dlsym(cuda, "fcd_is_stand_in")) {
		fprintf(stderr, "the stand-in libcuda.so.1 is not the one loaded\n");
		return 1;
	}
	void *nccl = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
	if (!nccl || !dlsym(nccl, "nad_live")) {
		fprintf(stderr, "the stand-in libnccl.so.2 is not the one loaded (LD_LIBRARY_PATH)\n");
		return 1;
	}
	struct harness_options o = { .step_timeout_us = STEP_TIMEOUT_MS * 1000, .nccl = &nccl_double_ops };
	harness_start(&h, &o);
	test_sums();
	test_refusals();
	test_join_timeout();
	test_partner_leaves_in_join();
	test_join_error();
	test_enqueue_error();
	test_exchange_error();
	test_stop_in_join();
	CHECK_EQ_INT(nad_live(), 0);
	CHECK_EQ_INT(nd_live(), 0);
	printf("client nccl: ok\n");
	return 0;
}
