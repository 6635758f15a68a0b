/* Steps that fail: ranks that disagree, ranks that do not come, ranks that
 * die, a core that fails or holds a step, limits, shutdown, and a gateway
 * that misbehaves towards the library. Each failure reaches every rank
 * with a message that names its cause, and the gateway serves on. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "host_harness.h"
#include "uring_loop.h"

#define STEP_TIMEOUT_MS 1000

extern char **environ;

static struct harness h;

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static struct gg_session *open_rank(const char *endpoint, const char *job, int rank, int nranks)
{
	struct gg_session *s;
	struct gg_error err;

	if (gg_session_open(endpoint, job, rank, nranks, &s, &err)) {
		fprintf(stderr, "gg_session_open(%s, %d of %d): %s\n", job, rank, nranks, err.message);
		exit(1);
	}
	return s;
}

/* One all-reduce step of several ranks, each in its own thread. */
struct step_case {
	const char *job;
	unsigned nranks;
	struct gg_session *sessions[4];
	uint32_t tensor[4];
	size_t count[4];
	enum gg_dtype dtype[4];
	int timeout_ms;
	unsigned skip_rank;     /* this rank does not take part; 4: none */
	struct gg_error err[4];
	uint64_t elapsed_ms[4];
};

static void step_rank(unsigned rank, void *arg)
{
	struct step_case *c = arg;
	float buf[256] = { 0 };

	if (rank == c->skip_rank)
		return;
	uint64_t t0 = now_ms();
	size_t count = c->count[rank] ? c->count[rank] : 100;
	enum gg_dtype dt = c->dtype[rank] ? c->dtype[rank] : GG_DTYPE_F32;
	for (size_t i = 0; i < count && i < 256; i++)
		buf[i] = (float)(rank + 1);
	gg_allreduce(c->sessions[rank], buf, count, dt, c->tensor[rank], c->timeout_ms, &c->err[rank]);
	c->elapsed_ms[rank] = now_ms() - t0;
}

static void open_case(struct step_case *c, const char *job, unsigned nranks)
{
	memset(c, 0, sizeof(*c));
	c->job = job;
	c->nranks = nranks;
	c->skip_rank = 4;
	for (unsigned r = 0; r < nranks; r++)
		c->sessions[r] = open_rank(h.endpoint, job, (int)r, (int)nranks);
}

static void run_case(struct step_case *c)
{
	run_ranks(c->nranks, step_rank, c);
}

static void close_case(struct step_case *c)
{
	for (unsigned r = 0; r < c->nranks; r++)
		gg_session_close(c->sessions[r]);
	harness_wait_connections(&h, 0);
}

/* The same tensor at every rank again: the job goes on after a failure. */
static void check_recovers(struct step_case *c, uint32_t tensor)
{
	for (unsigned r = 0; r < c->nranks; r++) {
		c->tensor[r] = tensor;
		c->count[r] = 0;
		c->dtype[r] = 0;
	}
	c->skip_rank = 4;
	run_case(c);
	for (unsigned r = 0; r < c->nranks; r++)
		CHECK_ERR(c->err[r], GG_OK, "");
}

/* A caller that looks for its answer only long after the step's deadline
 * (start, compute, wait) gets the answer the gateway sent in time: what
 * came counts before the deadline is judged. */
static void test_late_wait(void)
{
	struct gg_session *s = open_rank(h.endpoint, "late-wait", 0, 1);
	struct gg_request *r = NULL;
	struct gg_error err;
	float x[64];

	atomic_store(&h.core_mode, CORE_SUM);
	for (unsigned i = 0; i < 64; i++)
		x[i] = (float)i - 20.5f;
	gg_allreduce_start(s, x, 64, GG_DTYPE_F32, 1, 200, &r, &err);
	CHECK_ERR(err, GG_OK, "");
	/* Past the deadline (200 ms), the answer grace and the 2 s after it. */
	usleep(200000 + 2000000 + 400000);
	gg_wait(r, 0, &err);
	CHECK_ERR(err, GG_OK, "");
	for (unsigned i = 0; i < 64; i++)
		if (x[i] != (float)i - 20.5f) {
			fprintf(stderr, "late wait: element %u is %g, expected %g\n", i, x[i], (float)i - 20.5f);
			exit(1);
		}
	gg_request_free(r);
	/* The session goes on. */
	gg_allreduce(s, x, 64, GG_DTYPE_F32, 1, 0, &err);
	CHECK_ERR(err, GG_OK, "");
	gg_session_close(s);
	harness_wait_connections(&h, 0);
}

static void test_mismatch(void)
{
	struct step_case c;

	open_case(&c, "mm", 3);
	c.tensor[0] = c.tensor[1] = 1;
	c.tensor[2] = 2;
	run_case(&c);
	for (unsigned r = 0; r < 3; r++)
		CHECK_ERR(c.err[r], GG_ERR_MISMATCH, "step 1 (tensor ", "): ranks of site test-site disagree: rank ",
			  "announced tensor 1 (100 float32) but rank 2 announced tensor 2 (100 float32)");
	check_recovers(&c, 9);
	close_case(&c);

	open_case(&c, "mm-count", 2);
	c.tensor[0] = c.tensor[1] = 3;
	c.count[1] = 101;
	run_case(&c);
	for (unsigned r = 0; r < 2; r++)
		CHECK_ERR(c.err[r], GG_ERR_MISMATCH, "step 1 (tensor 3): ranks of site test-site disagree: rank 0 announced tensor 3 "
			  "(100 float32) but rank 1 announced tensor 3 (101 float32)");
	c.dtype[1] = GG_DTYPE_BF16;
	c.count[1] = 0;
	run_case(&c);
	for (unsigned r = 0; r < 2; r++)
		CHECK_ERR(c.err[r], GG_ERR_MISMATCH, "step 2 (tensor 3): ranks of site test-site disagree: rank 0 announced tensor 3 "
			  "(100 float32) but rank 1 announced tensor 3 (100 bfloat16)");
	check_recovers(&c, 4);
	close_case(&c);
}

static void test_step_timeout(void)
{
	struct step_case c;
	struct gg_error err;
	float x = 1;

	/* Rank 2 is connected but does not come: the others give up at the
	 * gateway's step timeout, and rank 2 learns it when it comes. */
	open_case(&c, "slow", 3);
	c.tensor[0] = c.tensor[1] = 4;
	c.skip_rank = 2;
	run_case(&c);
	for (unsigned r = 0; r < 2; r++) {
		CHECK_ERR(c.err[r], GG_ERR_TIMEOUT,
			  "step 1 (tensor 4): timed out after 1000 ms waiting for rank 2 of job 'slow'");
		CHECK(c.elapsed_ms[r] >= STEP_TIMEOUT_MS - 20 && c.elapsed_ms[r] < STEP_TIMEOUT_MS + 1000);
	}
	CHECK_EQ_INT(gg_allreduce(c.sessions[2], &x, 1, GG_DTYPE_F32, 4, 0, &err), GG_ERR_TIMEOUT);
	CHECK_ERR(err, GG_ERR_TIMEOUT, "step 1 (tensor 4): timed out after 1000 ms waiting for rank 2 of job 'slow'");
	check_recovers(&c, 5);
	close_case(&c);

	/* The caller's own, shorter deadline; ranks that never connected. */
	struct gg_session *s = open_rank(h.endpoint, "lonely", 0, 3);
	uint64_t t0 = now_ms();
	CHECK_EQ_INT(gg_allreduce(s, &x, 1, GG_DTYPE_F32, 6, 200, &err), GG_ERR_TIMEOUT);
	CHECK(now_ms() - t0 < 1200);
	CHECK_ERR(err, GG_ERR_TIMEOUT, "step 1 (tensor 6): timed out after 200 ms waiting for ranks 1 (not connected), "
		  "2 (not connected) of job 'lonely'");
	gg_session_close(s);
	harness_wait_connections(&h, 0);
}

/* Rank 0 starts step 1, and gives step 2 a deadline of 200 ms; rank 1
 * comes to step 1 only after 600 ms. Steps end in order: step 2 fails
 * once step 1 completed, not before, for its deadline, which passed
 * while rank 1 had not announced it. */
struct queued_case {
	struct gg_session *s[2];
	struct gg_error err[2];
	uint64_t step2_ms;
};

static void queued_rank(unsigned rank, void *arg)
{
	struct queued_case *c = arg;
	float one = 1, two = 2;
	struct gg_request *req = NULL;
	struct gg_error err;

	if (rank == 1) {
		usleep(600 * 1000);
		CHECK_EQ_INT(gg_allreduce(c->s[1], &one, 1, GG_DTYPE_F32, 1, 0, &err), GG_OK);
		gg_allreduce(c->s[1], &two, 1, GG_DTYPE_F32, 2, 0, &c->err[1]);
		return;
	}
	CHECK_EQ_INT(gg_allreduce_start(c->s[0], &one, 1, GG_DTYPE_F32, 1, 0, &req, &err), GG_OK);
	uint64_t t0 = now_ms();
	gg_allreduce(c->s[0], &two, 1, GG_DTYPE_F32, 2, 200, &c->err[0]);
	c->step2_ms = now_ms() - t0;
	CHECK_EQ_INT(gg_wait(req, -1, &err), GG_OK);
	CHECK(one == 2);
	gg_request_free(req);
}

static void test_deadline_behind_steps(void)
{
	struct queued_case c = { .s = { open_rank(h.endpoint, "queued", 0, 2), open_rank(h.endpoint, "queued", 1, 2) } };

	run_ranks(2, queued_rank, &c);
	for (unsigned r = 0; r < 2; r++)
		CHECK_ERR(c.err[r], GG_ERR_TIMEOUT,
			  "step 2 (tensor 2): timed out after 200 ms waiting for rank 1 of job 'queued'");
	CHECK(c.step2_ms >= 500 && c.step2_ms < STEP_TIMEOUT_MS);
	printf("a step behind a late one, 200 ms deadline: failed after %llu ms\n", (unsigned long long)c.step2_ms);
	for (unsigned r = 0; r < 2; r++)
		gg_session_close(c.s[r]);
	harness_wait_connections(&h, 0);
}

/* A step that failed at another site (so the core says) fails at once at
 * the rank that announced it and waits for a late one, with the outcome
 * the core would give; the late rank gets the same when it comes. The
 * rank told early runs at most one step ahead: its next step fails early
 * only once the late rank has caught up, and may leave after its last
 * step without changing the late rank's outcomes. The core is not told
 * of steps it failed itself. */
static void test_failed_elsewhere(void)
{
	struct gg_session *s0 = open_rank(h.endpoint, "elsewhere", 0, 2), *s1 = open_rank(h.endpoint, "elsewhere", 1, 2);
	struct gg_request *r2, *r3, *r1;
	struct gg_error err;
	float x0[16] = { 1 }, x1[16] = { 2 };
	const unsigned aborts = atomic_load(&h.aborts_told);

	atomic_store(&h.core_mode, CORE_SUM);
	CHECK_EQ_INT(gg_allreduce_start(s0, x0, 16, GG_DTYPE_F32, 1, 0, &r1, &err), 0);
	CHECK_EQ_INT(gg_allreduce(s1, x1, 16, GG_DTYPE_F32, 1, 0, &err), 0);
	CHECK_EQ_INT(gg_wait(r1, 2000, &err), 0);
	gg_request_free(r1);

	/* Rank 0 waits in step 2 for rank 1; then the news comes. */
	CHECK_EQ_INT(gg_allreduce_start(s0, x0, 16, GG_DTYPE_F32, 2, 0, &r2, &err), 0);
	CHECK_EQ_INT(gg_wait(r2, 100, &err), GG_ERR_AGAIN);
	atomic_store(&h.failed_from, 2);
	uint64_t t0 = now_ms();
	CHECK_EQ_INT(gg_wait(r2, 2000, &err), GG_ERR_SITE);
	CHECK_ERR(err, GG_ERR_SITE, "step 2 (tensor 2): " FAILED_ELSEWHERE_TEXT);
	CHECK(now_ms() - t0 < STEP_TIMEOUT_MS / 2);
	gg_request_free(r2);

	/* Its step 3 waits for rank 1 to catch up with step 2. */
	CHECK_EQ_INT(gg_allreduce_start(s0, x0, 16, GG_DTYPE_F32, 3, 0, &r3, &err), 0);
	CHECK_EQ_INT(gg_wait(r3, 300, &err), GG_ERR_AGAIN);
	CHECK_EQ_INT(gg_allreduce(s1, x1, 16, GG_DTYPE_F32, 2, 0, &err), GG_ERR_SITE);
	CHECK_ERR(err, GG_ERR_SITE, "step 2 (tensor 2): " FAILED_ELSEWHERE_TEXT);
	t0 = now_ms();
	CHECK_EQ_INT(gg_wait(r3, 2000, &err), GG_ERR_SITE);
	CHECK_ERR(err, GG_ERR_SITE, "step 3 (tensor 3): " FAILED_ELSEWHERE_TEXT);
	CHECK(now_ms() - t0 < STEP_TIMEOUT_MS / 2);
	gg_request_free(r3);

	/* Rank 0 is done and leaves: rank 1's step 3 failed before, and keeps
	 * its own outcome; the next one fails for the rank that left. */
	gg_session_close(s0);
	CHECK_EQ_INT(gg_allreduce(s1, x1, 16, GG_DTYPE_F32, 3, 0, &err), GG_ERR_SITE);
	CHECK_ERR(err, GG_ERR_SITE, "step 3 (tensor 3): " FAILED_ELSEWHERE_TEXT);
	CHECK_EQ_INT(gg_allreduce(s1, x1, 16, GG_DTYPE_F32, 4, 0, &err), GG_ERR_RANK);
	CHECK_ERR(err, GG_ERR_RANK, "step 4 (tensor 4): rank 0 of job 'elsewhere'");
	gg_session_close(s1);
	harness_wait_connections(&h, 0);
	atomic_store(&h.failed_from, 0);
	CHECK_EQ_INT(atomic_load(&h.aborts_told), aborts + 1); /* rank 0's leaving, in step 4 */

	/* A rank not connected yet will announce step 1: rank 0 hears of
	 * step 1's failure at once, and its step 2 waits for the other. */
	atomic_store(&h.failed_from, 1);
	s0 = open_rank(h.endpoint, "elsewhere-first", 0, 2);
	CHECK_EQ_INT(gg_allreduce(s0, x0, 16, GG_DTYPE_F32, 1, 0, &err), GG_ERR_SITE);
	CHECK_EQ_INT(gg_allreduce_start(s0, x0, 16, GG_DTYPE_F32, 2, 0, &r2, &err), 0);
	CHECK_EQ_INT(gg_wait(r2, 300, &err), GG_ERR_AGAIN);
	s1 = open_rank(h.endpoint, "elsewhere-first", 1, 2);
	CHECK_EQ_INT(gg_allreduce(s1, x1, 16, GG_DTYPE_F32, 1, 0, &err), GG_ERR_SITE);
	CHECK_ERR(err, GG_ERR_SITE, "step 1 (tensor 1): " FAILED_ELSEWHERE_TEXT);
	CHECK_EQ_INT(gg_wait(r2, 2000, &err), GG_ERR_SITE);
	gg_request_free(r2);
	CHECK_EQ_INT(gg_allreduce(s1, x1, 16, GG_DTYPE_F32, 2, 0, &err), GG_ERR_SITE);
	atomic_store(&h.failed_from, 0);
	gg_session_close(s0);
	gg_session_close(s1);
	harness_wait_connections(&h, 0);
}

/* ---- a rank that dies ---------------------------------------------------- */

/* The child: rank 1 of `job`; with "announce" it starts step 1 first. Says
 * so on stdout, then waits to be killed. */
static int child_main(char **argv)
{
	/* Never outlive a test that failed. */
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) || getppid() == 1)
		return 1;
	struct gg_session *s = open_rank(argv[2], argv[3], 1, 2);
	struct gg_request *r;
	struct gg_error err;
	static float buf[100];

	if (!strcmp(argv[4], "announce") && gg_allreduce_start(s, buf, 100, GG_DTYPE_F32, 8, 0, &r, &err)) {
		fprintf(stderr, "child: %s\n", err.message);
		return 1;
	}
	CHECK(write(1, "r", 1) == 1);
	for (;;)
		pause();
}

static pid_t spawn_child(const char *job, const char *mode)
{
	char *argv[] = { "test_host_failures", "--rank-that-dies", h.endpoint, (char *)job, (char *)mode, NULL };
	posix_spawn_file_actions_t fa;
	int p[2];
	pid_t pid;
	char c;

	CHECK(pipe(p) == 0);
	CHECK(posix_spawn_file_actions_init(&fa) == 0);
	CHECK(posix_spawn_file_actions_adddup2(&fa, p[1], 1) == 0);
	CHECK(posix_spawn_file_actions_addclose(&fa, p[0]) == 0);
	CHECK(posix_spawn(&pid, "/proc/self/exe", &fa, NULL, argv, environ) == 0);
	posix_spawn_file_actions_destroy(&fa);
	close(p[1]);
	CHECK(read(p[0], &c, 1) == 1);
	close(p[0]);
	return pid;
}

static void kill_child(pid_t pid)
{
	int status;

	CHECK(kill(pid, SIGKILL) == 0);
	CHECK(waitpid(pid, &status, 0) == pid);
	CHECK(WIFSIGNALED(status));
}

static void test_rank_dies(void)
{
	struct gg_session *s;
	struct gg_request *req;
	struct gg_error err;
	float x[100] = { 0 };

	/* Rank 0 waits in step 1; rank 1 connects and dies before it comes. */
	s = open_rank(h.endpoint, "die", 0, 2);
	CHECK_EQ_INT(gg_allreduce_start(s, x, 100, GG_DTYPE_F32, 8, 0, &req, &err), 0);
	pid_t pid = spawn_child("die", "connect");
	uint64_t t0 = now_ms();
	kill_child(pid);
	CHECK_EQ_INT(gg_wait(req, -1, &err), GG_ERR_RANK);
	CHECK(now_ms() - t0 < STEP_TIMEOUT_MS); /* not the step timeout */
	CHECK_ERR(err, GG_ERR_RANK, "step 1 (tensor 8): rank 1 of job 'die' disconnected during step 1 at site test-site");
	gg_request_free(req);
	/* Its later steps fail at once, with the same cause. */
	CHECK_EQ_INT(gg_allreduce(s, x, 100, GG_DTYPE_F32, 8, 0, &err), GG_ERR_RANK);
	CHECK_ERR(err, GG_ERR_RANK, "step 2 (tensor 8): rank 1 of job 'die' disconnected during step 1");
	gg_session_close(s);
	harness_wait_connections(&h, 0);

	/* Both announced, the core holds the step, and rank 1 dies: rank 0
	 * hears at once; the core's late answer goes nowhere. */
	atomic_store(&h.core_mode, CORE_HOLD);
	s = open_rank(h.endpoint, "die", 0, 2);
	unsigned submitted = atomic_load(&h.steps_submitted);
	pid = spawn_child("die", "announce");
	CHECK_EQ_INT(gg_allreduce_start(s, x, 100, GG_DTYPE_F32, 8, 0, &req, &err), 0);
	for (int i = 0; i < 500 && atomic_load(&h.steps_submitted) == submitted; i++)
		usleep(2000);
	CHECK(atomic_load(&h.steps_submitted) == submitted + 1);
	t0 = now_ms();
	kill_child(pid);
	CHECK_EQ_INT(gg_wait(req, -1, &err), GG_ERR_RANK);
	CHECK(now_ms() - t0 < STEP_TIMEOUT_MS); /* not the step timeout */
	CHECK_ERR(err, GG_ERR_RANK, "step 1 (tensor 8): rank 1 of job 'die' disconnected during step 1");
	gg_request_free(req);
	gg_session_close(s);
	harness_wait_connections(&h, 0);
	for (int i = 0; i < 500 && harness_stats(&h).core_steps; i++)
		usleep(10000);
	CHECK_EQ_INT(harness_stats(&h).core_steps, 0);
	CHECK_EQ_INT(harness_stats(&h).regions, 0); /* the dead rank's too, once the core let go */
	CHECK_EQ_INT(harness_stats(&h).jobs, 0);
	atomic_store(&h.core_mode, CORE_SUM);

	/* Rank 1 dies once the core holds the step's whole result and told the
	 * other sites, which may have completed on it: the step completes for
	 * rank 0 with the site sum, bit for bit, and the next one fails. */
	atomic_store(&h.core_mode, CORE_PROMISED);
	s = open_rank(h.endpoint, "promised", 0, 2);
	submitted = atomic_load(&h.steps_submitted);
	pid = spawn_child("promised", "announce");
	float want[100];
	for (int i = 0; i < 100; i++)
		want[i] = x[i] = (float)i * 0.75f - 20.0f;
	CHECK_EQ_INT(gg_allreduce_start(s, x, 100, GG_DTYPE_F32, 8, 0, &req, &err), 0);
	for (int i = 0; i < 500 && atomic_load(&h.steps_submitted) == submitted; i++)
		usleep(2000);
	CHECK(atomic_load(&h.steps_submitted) == submitted + 1);
	kill_child(pid);
	CHECK_EQ_INT(gg_wait(req, -1, &err), GG_OK);
	CHECK(!memcmp(x, want, sizeof(x))); /* the child's input is zeros */
	gg_request_free(req);
	CHECK_EQ_INT(gg_allreduce(s, x, 100, GG_DTYPE_F32, 8, 0, &err), GG_ERR_RANK);
	CHECK_ERR(err, GG_ERR_RANK, "step 2 (tensor 8): rank 1 of job 'promised' disconnected during step 1");
	gg_session_close(s);
	harness_wait_connections(&h, 0);
	for (int i = 0; i < 500 && harness_stats(&h).jobs; i++)
		usleep(10000);
	CHECK_EQ_INT(harness_stats(&h).regions, 0);
	CHECK_EQ_INT(harness_stats(&h).jobs, 0);
	atomic_store(&h.core_mode, CORE_SUM);

	/* The gateway serves the job again. */
	struct step_case c;
	open_case(&c, "die", 2);
	check_recovers(&c, 1);
	close_case(&c);
}

static void test_close_in_flight(void)
{
	struct gg_session *a = open_rank(h.endpoint, "leave", 0, 2);
	struct gg_session *b = open_rank(h.endpoint, "leave", 1, 2);
	struct gg_request *ra, *rb;
	struct gg_error err;
	float x[4] = { 0 }, y[4] = { 0 };

	CHECK_EQ_INT(gg_allreduce_start(a, x, 4, GG_DTYPE_F32, 1, 0, &ra, &err), 0);
	gg_session_close(a);
	CHECK_EQ_INT(gg_wait(ra, 0, &err), GG_ERR_CLOSED);
	CHECK_ERR(err, GG_ERR_CLOSED, "step 1 (tensor 1): the session was closed");
	gg_request_free(ra);
	/* Had rank 1 come before the gateway saw rank 0 go, the step would
	 * have run: rank 0's data was all there. */
	harness_wait_connections(&h, 1);
	CHECK_EQ_INT(gg_allreduce_start(b, y, 4, GG_DTYPE_F32, 1, 0, &rb, &err), 0);
	CHECK_EQ_INT(gg_wait(rb, -1, &err), GG_ERR_RANK);
	CHECK_ERR(err, GG_ERR_RANK, "step 1 (tensor 1): rank 0 of job 'leave' disconnected during step 1");
	gg_request_free(rb);
	gg_session_close(b);
	harness_wait_connections(&h, 0);
}

/* ---- the core ------------------------------------------------------------ */

static void test_core_failures(void)
{
	struct step_case c;

	open_case(&c, "core", 2);
	c.tensor[0] = c.tensor[1] = 7;
	atomic_store(&h.core_mode, CORE_ERROR);
	run_case(&c);
	for (unsigned r = 0; r < 2; r++)
		CHECK_ERR(c.err[r], GG_ERR_SITE, "step 1 (tensor 7): " CORE_ERROR_TEXT);

	atomic_store(&h.core_mode, CORE_HOLD);
	c.timeout_ms = 200;
	run_case(&c);
	for (unsigned r = 0; r < 2; r++) {
		CHECK_ERR(c.err[r], GG_ERR_TIMEOUT, "step 2 (tensor 7): " CORE_HOLD_TEXT);
		CHECK(c.elapsed_ms[r] >= 180 && c.elapsed_ms[r] < 1200);
	}

	atomic_store(&h.core_mode, CORE_REFUSE);
	c.timeout_ms = 0;
	run_case(&c);
	for (unsigned r = 0; r < 2; r++)
		CHECK_ERR(c.err[r], GG_ERR_LIMIT, "step 3 (tensor 7): site core refused the step: gateway limit reached");

	atomic_store(&h.core_mode, CORE_SUM);
	check_recovers(&c, 7);
	close_case(&c);
}

/* ---- shutdown, limits, the socket ---------------------------------------- */

static uint64_t cpu_ms(void)
{
	struct rusage ru;

	CHECK(getrusage(RUSAGE_SELF, &ru) == 0);
	return (uint64_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000u +
	       (uint64_t)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1000u;
}

/* A job that failed while a step was being gathered holds its ranks' step
 * deadline no more: once it passes, the gateway's loop sleeps until the
 * ranks still there do something, rather than spinning. */
static void test_broken_job_sleeps(void)
{
	int fd[3];
	union gg_ctrl_msg m;
	char why[160];

	for (unsigned r = 0; r < 3; r++) {
		fd[r] = raw_connect(&h);
		raw_hello(fd[r], "broken-sleeps", r, 3);
	}
	int mfd = raw_memfd(4096, true);
	raw_map(fd[0], 0, 4096, mfd);
	close(mfd);
	raw_allreduce(fd[0], 1, 1, GG_DTYPE_F32, 100, 0, 0);
	usleep(50000); /* the gateway has rank 0's step, and its deadline, first */
	raw_allreduce(fd[1], 5, 1, GG_DTYPE_F32, 100, 0, 0); /* out of sequence: the job fails */
	raw_expect_close(fd[1], GG_CTRL_ERROR, GG_ERR_PROTOCOL, "ALLREDUCE with seq 5, expected 1");
	size_t len = raw_recv(fd[0], &m);
	CHECK_EQ_INT(gg_ctrl_check(&m, len, why, sizeof(why)), GG_CTRL_DONE);
	CHECK_EQ_INT(m.done.status, GG_ERR_RANK);
	usleep((STEP_TIMEOUT_MS + 100) * 1000);
	uint64_t cpu0 = cpu_ms(), t0 = now_ms();
	usleep(500000);
	uint64_t cpu = cpu_ms() - cpu0, wall = now_ms() - t0;
	printf("a failed job past its step's deadline: %llu ms of CPU in %llu ms\n", (unsigned long long)cpu,
	       (unsigned long long)wall);
	CHECK(cpu < wall / 2);
	close(fd[0]);
	close(fd[2]);
	harness_wait_connections(&h, 0);
}

static void test_shutdown(void)
{
	struct gg_session *s = open_rank(h.endpoint, "shut", 0, 2);
	struct gg_error err;
	float x = 1, y[2] = { 1, 1 };
	int quiet = raw_connect(&h); /* has not said HELLO yet */
	/* Two ranks of a job wait in step 1 for a third: ending the first's
	 * session must not tell the second that a rank left. */
	struct gg_session *w[2] = { open_rank(h.endpoint, "shut-waiting", 0, 3),
				    open_rank(h.endpoint, "shut-waiting", 1, 3) };
	struct gg_request *r[2];
	for (unsigned i = 0; i < 2; i++) {
		CHECK_EQ_INT(gg_allreduce_start(w[i], &y[i], 1, GG_DTYPE_F32, 1, 0, &r[i], &err), 0);
		CHECK_EQ_INT(gg_wait(r[i], 50, &err), GG_ERR_AGAIN);
	}

	harness_wait_connections(&h, 4);
	harness_stop_begin(&h);
	for (unsigned i = 0; i < 2; i++) {
		CHECK_EQ_INT(gg_wait(r[i], 5000, &err), GG_ERR_CLOSED);
		CHECK_ERR(err, GG_ERR_CLOSED, "step 1 (tensor 1): the gateway of site test-site is shutting down");
		gg_request_free(r[i]);
		gg_session_close(w[i]);
	}
	raw_expect_close(quiet, GG_CTRL_REFUSE, GG_ERR_CLOSED, "the gateway of site test-site is shutting down");
	CHECK_EQ_INT(gg_allreduce(s, &x, 1, GG_DTYPE_F32, 1, 0, &err), GG_ERR_CLOSED);
	CHECK_ERR(err, GG_ERR_CLOSED, "step 1 (tensor 1), not sent: the gateway of site test-site is shutting down");
	/* Step 2, or step 1 again when the first call had not sent it yet. */
	CHECK_EQ_INT(gg_allreduce(s, &x, 1, GG_DTYPE_F32, 1, 0, &err), GG_ERR_CLOSED);
	CHECK_ERR(err, GG_ERR_CLOSED, " (tensor 1), not sent: session failed earlier: the gateway of site test-site is "
		  "shutting down");
	gg_session_close(s);
}

/* float32 steps are summed in place in rank 0's shared memory: they need
 * no gateway memory, whatever their size. bfloat16 steps need a float32
 * sum, and [limits] memory bounds those. */
static void test_memory_limit(void)
{
	struct harness_options o = { .memory_bytes = 1u << 20 };
	struct step_case c;
	struct gg_request *req[2];

	harness_start(&h, &o);
	open_case(&c, "mem", 2);
	c.tensor[0] = c.tensor[1] = 2;
	float *big[2];
	for (unsigned r = 0; r < 2; r++) {
		big[r] = calloc(300000, sizeof(float));
		CHECK(big[r]);
		for (size_t i = 0; i < 300000; i++)
			big[r][i] = (float)(r + 1);
	}
	for (unsigned r = 0; r < 2; r++)
		CHECK_EQ_INT(gg_allreduce_start(c.sessions[r], big[r], 300000, GG_DTYPE_F32, 2, 0, &req[r], &c.err[r]), 0);
	for (unsigned r = 0; r < 2; r++) {
		CHECK_EQ_INT(gg_wait(req[r], -1, &c.err[r]), GG_OK);
		CHECK(big[r][0] == 3.0f && big[r][299999] == 3.0f);
		gg_request_free(req[r]);
	}
	for (unsigned r = 0; r < 2; r++)
		CHECK_EQ_INT(gg_allreduce_start(c.sessions[r], big[r], 300000, GG_DTYPE_BF16, 2, 0, &req[r], &c.err[r]), 0);
	for (unsigned r = 0; r < 2; r++) {
		CHECK_EQ_INT(gg_wait(req[r], -1, &c.err[r]), GG_ERR_LIMIT);
		CHECK_ERR(c.err[r], GG_ERR_LIMIT, "step 2 (tensor 2): the gateway's memory limit of 1048576 bytes leaves no "
			  "room for a 1200000-byte sum (0 in use)");
		gg_request_free(req[r]);
		free(big[r]);
	}
	check_recovers(&c, 3);
	close_case(&c);
	harness_stop(&h);
}

/* A job keeps its bfloat16 sum buffer for its next step, but never at the
 * cost of another job's step: under a 1 MiB limit, two one-rank jobs of
 * 600 KB sums take turns, each step finding the other job's kept buffer
 * gone. */
static void test_memory_kept_between_steps(void)
{
	struct harness_options o = { .memory_bytes = 1u << 20 };
	struct gg_error err;
	const size_t n = 150000;
	uint16_t *buf = calloc(n, sizeof(uint16_t));

	CHECK(buf);
	harness_start(&h, &o);
	struct gg_session *a = open_rank(h.endpoint, "keep-a", 0, 1), *b = open_rank(h.endpoint, "keep-b", 0, 1);
	for (int round = 0; round < 3; round++) {
		const uint16_t v = (uint16_t)(0x3f80 + round); /* 1.0, 1.0078125, ... exact in bfloat16 */
		for (size_t i = 0; i < n; i++)
			buf[i] = v;
		CHECK_EQ_INT(gg_allreduce(a, buf, n, GG_DTYPE_BF16, 1, 0, &err), GG_OK);
		CHECK(buf[0] == v && buf[n - 1] == v);
		CHECK_EQ_INT(gg_allreduce(b, buf, n, GG_DTYPE_BF16, 1, 0, &err), GG_OK);
		CHECK(buf[n - 1] == v);
		/* Job b keeps its buffer; job a's went to make room for it (the
		 * stats are published after the loop's turn). */
		for (int i = 0; i < 500 && harness_stats(&h).spare_bytes != n * sizeof(float); i++)
			usleep(10000);
		CHECK_EQ_INT(harness_stats(&h).spare_bytes, n * sizeof(float));
	}
	gg_session_close(a);
	gg_session_close(b);
	harness_wait_connections(&h, 0);
	harness_stop(&h);
	free(buf);
}

static int never_submit(void *core, struct gg_site_step *step)
{
	(void)core;
	(void)step;
	abort();
}

static void second_on_cqe(void *arg, const struct io_uring_cqe *cqe)
{
	struct gg_site_backend *base = arg;

	CHECK(base->ops->on_cqe(base, cqe));
}

/* Starts and stops a second backend on its own loop in this thread. */
static int try_start(const char *control, char *err, size_t err_size)
{
	static const struct gg_core_ops core = { .submit = never_submit };
	struct gg_host_backend_options o = {
		.control = control, .site = "second", .max_clients = 1, .max_message_bytes = 1024,
		.memory_bytes = 1 << 20, .step_timeout_us = 1000000, .hello_timeout_us = 1000000,
		.kind_base = GG_OP_USER,
	};
	struct gg_host_backend *b;
	struct gg_loop loop;

	CHECK(gg_loop_init(&loop, 8) == 0);
	int rc = gg_host_backend_create(&o, &core, NULL, &b, err, err_size);
	if (!rc) {
		struct gg_site_backend *base = gg_host_backend_base(b);
		rc = base->ops->start(base, &loop, err, err_size);
		if (!rc)
			while (!base->ops->stop(base))
				CHECK(gg_loop_run(&loop, 10000, second_on_cqe, base) >= 0);
		base->ops->destroy(base);
	}
	gg_loop_fini(&loop);
	return rc;
}

/* A process of user nobody listening at DIR/squat.sock on a socket of
 * `type`, which it owns: try_start() there (its rc and err), then the
 * process is gone. Returns its pid. */
static pid_t squat(int type, int *rc, char *err, size_t err_size)
{
	char path[128], endpoint[160], c;
	int ready[2];

	snprintf(path, sizeof(path), "%s/squat.sock", h.dir);
	struct sockaddr_un at = { .sun_family = AF_UNIX };
	memcpy(at.sun_path, path, strlen(path) + 1);
	CHECK(pipe(ready) == 0);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		/* The listener's credentials are those of its listen(). */
		int s = socket(AF_UNIX, type, 0);
		if (s < 0 || bind(s, (struct sockaddr *)&at, sizeof(at)) || chown(path, 65534, 65534) ||
		    setresuid(65534, 65534, 65534) || listen(s, 1) || write(ready[1], "x", 1) != 1)
			_exit(1);
		pause();
		_exit(0);
	}
	close(ready[1]);
	CHECK(read(ready[0], &c, 1) == 1);
	close(ready[0]);
	snprintf(endpoint, sizeof(endpoint), "unix:%s", path);
	*rc = try_start(endpoint, err, err_size);
	CHECK(kill(pid, SIGKILL) == 0 && waitpid(pid, NULL, 0) == pid);
	CHECK(unlink(path) == 0);
	return pid;
}

/* A SEQPACKET socket bound (not listening) at dir/name, whose path goes
 * in path; -1 when it cannot be made. */
static int bound_socket(const char *dir, const char *name, char *path, size_t size)
{
	struct sockaddr_un at = { .sun_family = AF_UNIX };

	snprintf(path, size, "%s/%s", dir, name);
	memcpy(at.sun_path, path, strlen(path) + 1);
	int s = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	if (s >= 0 && bind(s, (struct sockaddr *)&at, sizeof(at))) {
		close(s);
		s = -1;
	}
	return s;
}

static void test_control_socket(void)
{
	char err[256], endpoint[160];
	int rc;

	harness_start(&h, NULL);
	/* A live gateway's socket is never taken over: its lock says so,
	 * with its pid (this process runs it). */
	char want_lock[1024];
	rc = try_start(h.endpoint, err, sizeof(err));
	CHECK_EQ_INT(rc, -EADDRINUSE);
	snprintf(want_lock, sizeof(want_lock), "another gateway holds it (pid %ld) (its lock file %s.lock)",
		 (long)getpid(), h.endpoint + 5);
	CHECK_CONTAINS(err, want_lock);
	/* Nor one another user's process listens on, which is named as such:
	 * a squatter, not a second gateway; one whose socket is of another
	 * type is told by the socket's owner. */
	if (geteuid() == 0) {
		char want[192];
		pid_t pid = squat(SOCK_SEQPACKET, &rc, err, sizeof(err));
		CHECK_EQ_INT(rc, -EADDRINUSE);
		snprintf(want, sizeof(want),
			 "a process of uid 65534 (pid %d), not this gateway's user (uid 0), is listening on it", (int)pid);
		CHECK_CONTAINS(err, want);
		squat(SOCK_STREAM, &rc, err, sizeof(err));
		CHECK_EQ_INT(rc, -EADDRINUSE);
		CHECK_CONTAINS(err, "squat.sock: a socket of uid 65534, not this gateway's user (uid 0), is there, and "
				    "cannot be told unused: Protocol wrong type for socket");
	}
	CHECK_EQ_INT(try_start("tcp:127.0.0.1:9000", err, sizeof(err)), -EINVAL);
	CHECK_CONTAINS(err, "needs unix:/absolute/path");

	/* One bound but not listening yet, as a gateway that starts this
	 * very moment holds it: not taken for stale, once it listens 20 ms on. */
	{
		char starting[128];
		int s = bound_socket(h.dir, "starting.sock", starting, sizeof(starting));
		CHECK(s >= 0);
		pid_t pid = fork();
		if (pid == 0) {
			usleep(20000);
			_exit(listen(s, 1) ? 1 : (sleep(30), 0)); /* bounded, should the test stop early */
		}
		snprintf(endpoint, sizeof(endpoint), "unix:%s", starting);
		CHECK_EQ_INT(try_start(endpoint, err, sizeof(err)), -EADDRINUSE);
		CHECK_CONTAINS(err, "another gateway is listening on it");
		CHECK(kill(pid, SIGKILL) == 0 && waitpid(pid, NULL, 0) == pid);
		close(s);
		CHECK(unlink(starting) == 0);
	}

	/* One whose listening process is gone, held a moment longer (as a
	 * killed gateway's ring holds its socket): waited for, then taken
	 * over. The process that listened exits at once; its child keeps the
	 * socket 300 ms. */
	{
		char dying[128];
		snprintf(dying, sizeof(dying), "%s/dying.sock", h.dir);
		pid_t pid = fork();
		if (pid == 0) {
			char at[128];
			int s = bound_socket(h.dir, "dying.sock", at, sizeof(at));
			if (s < 0 || listen(s, 1))
				_exit(1);
			if (fork() == 0) {
				usleep(300000);
				_exit(0);
			}
			_exit(0);
		}
		int status = -1;
		CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
		snprintf(endpoint, sizeof(endpoint), "unix:%s", dying);
		uint64_t t0 = gg_monotonic_us();
		CHECK_EQ_INT(try_start(endpoint, err, sizeof(err)), 0);
		uint64_t waited_ms = (gg_monotonic_us() - t0) / 1000;
		CHECK(waited_ms >= 250 && waited_ms < 1000);
		printf("  a dying listener's socket was taken over after %llu ms\n", (unsigned long long)waited_ms);
	}

	/* A stale one, left by a gateway that died, is replaced. */
	char stale[128];
	int fd = bound_socket(h.dir, "stale.sock", stale, sizeof(stale));
	CHECK(fd >= 0);
	close(fd);
	snprintf(endpoint, sizeof(endpoint), "unix:%s", stale);
	/* With the lock file it left, unlocked: taken, and gone at the stop. */
	char stale_lock[160];
	snprintf(stale_lock, sizeof(stale_lock), "%s.lock", stale);
	fd = open(stale_lock, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
	CHECK(fd >= 0 && write(fd, "1\n", 2) == 2);
	close(fd);
	CHECK_EQ_INT(try_start(endpoint, err, sizeof(err)), 0);
	CHECK(access(stale, F_OK) != 0);
	CHECK(access(stale_lock, F_OK) != 0);

	/* A socket three folders down from one that exists: its own folder
	 * is made, not those above it, the first of which is named. */
	char deep[160], deep_endpoint[192], want_deep[256];
	snprintf(deep_endpoint, sizeof(deep_endpoint), "unix:%s/m1/m2/m3/x.sock", h.dir);
	snprintf(deep, sizeof(deep), "%s/m1", h.dir);
	CHECK_EQ_INT(try_start(deep_endpoint, err, sizeof(err)), -ENOENT);
	snprintf(want_deep, sizeof(want_deep), "folder %s does not exist (the gateway makes only the socket's own folder)",
		 deep);
	CHECK_CONTAINS(err, want_deep);
	CHECK(access(deep, F_OK) != 0);

	/* Something else at the path is left alone. */
	fd = open(stale, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
	CHECK(fd >= 0);
	close(fd);
	CHECK_EQ_INT(try_start(endpoint, err, sizeof(err)), -EADDRINUSE);
	CHECK_CONTAINS(err, "the path exists and is not a socket");
	CHECK(unlink(stale) == 0);

	/* Nobody else may move the socket aside: a folder on its path that
	 * another user owns, or that others may write in without the sticky
	 * bit, is refused, however deep. */
	char dir[96], sub[112];
	snprintf(dir, sizeof(dir), "%s/shared", h.dir);
	snprintf(sub, sizeof(sub), "%s/gw", dir);
	snprintf(endpoint, sizeof(endpoint), "unix:%s/site.sock", sub);
	CHECK(mkdir(dir, 0755) == 0 && mkdir(sub, 0755) == 0);
	CHECK(chmod(dir, 0777) == 0);
	CHECK_EQ_INT(try_start(endpoint, err, sizeof(err)), -EPERM);
	CHECK_CONTAINS(err, "folder ");
	CHECK_CONTAINS(err, "/shared (mode 0777) may be written by every user, without the sticky bit");
	CHECK(chmod(dir, 0775) == 0);
	CHECK_EQ_INT(try_start(endpoint, err, sizeof(err)), -EPERM);
	CHECK_CONTAINS(err, "/shared (mode 0775) may be written by its group");
	CHECK(chmod(dir, 01777) == 0); /* as /tmp */
	CHECK_EQ_INT(try_start(endpoint, err, sizeof(err)), 0);
	/* A folder still to be made is judged by the one it goes in. */
	CHECK(rmdir(sub) == 0 && chmod(dir, 0777) == 0);
	CHECK_EQ_INT(try_start(endpoint, err, sizeof(err)), -EPERM);
	CHECK(access(sub, F_OK) != 0);
	CHECK(chmod(dir, 0755) == 0);
	if (geteuid() == 0) {
		CHECK(mkdir(sub, 0755) == 0 && chown(sub, 4242, 4242) == 0);
		CHECK_EQ_INT(try_start(endpoint, err, sizeof(err)), -EPERM);
		CHECK_CONTAINS(err, "folder ");
		CHECK_CONTAINS(err, "/shared/gw belongs to uid 4242, not to root or the gateway's user (uid 0)");
		CHECK(rmdir(sub) == 0);
		/* A link on the path is its owner's to point elsewhere later. */
		char link[112];
		snprintf(link, sizeof(link), "%s/link", h.dir);
		snprintf(endpoint, sizeof(endpoint), "unix:%s/site.sock", link);
		CHECK(symlink(dir, link) == 0 && lchown(link, 4242, 4242) == 0);
		CHECK_EQ_INT(try_start(endpoint, err, sizeof(err)), -EPERM);
		CHECK_CONTAINS(err, "link ");
		CHECK_CONTAINS(err, "/link belongs to uid 4242");
		CHECK(lchown(link, 0, 0) == 0);
		CHECK_EQ_INT(try_start(endpoint, err, sizeof(err)), 0);
		CHECK(unlink(link) == 0);
		snprintf(endpoint, sizeof(endpoint), "unix:%s/site.sock", sub);
	}
	CHECK_EQ_INT(try_start(endpoint, err, sizeof(err)), 0);
	CHECK(rmdir(sub) == 0);
	/* A file where a folder should be is named. */
	fd = open(sub, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
	CHECK(fd >= 0);
	close(fd);
	snprintf(endpoint, sizeof(endpoint), "unix:%s/x/site.sock", sub);
	CHECK_EQ_INT(try_start(endpoint, err, sizeof(err)), -ENOTDIR);
	CHECK_CONTAINS(err, "/shared/gw is not a folder");
	CHECK(unlink(sub) == 0 && rmdir(dir) == 0);
	harness_stop(&h);
}

/* ---- a gateway that misbehaves towards the library ------------------------ */

struct fake_gateway {
	char dir[64];
	char endpoint[112];
	int listen_fd;
	pthread_t thread;
	const char *mode;
};

/* Accepts one session, answers its HELLO and then its first request as
 * `mode` says. */
static void *fake_gateway_main(void *arg)
{
	struct fake_gateway *g = arg;
	union gg_ctrl_msg m;
	int fd = accept(g->listen_fd, NULL, NULL);

	CHECK(fd >= 0);
	CHECK(raw_recv(fd, &m) == sizeof(m.hello));
	if (!strncmp(g->mode, "refuse-", 7)) {
		size_t len = gg_ctrl_init(&m, GG_CTRL_REFUSE);
		m.error.code = !strcmp(g->mode, "refuse-nomem") ? GG_ERR_NOMEM
			     : !strcmp(g->mode, "refuse-closed") ? GG_ERR_CLOSED : GG_ERR_PROTOCOL;
		gg_ctrl_set_text(m.error.message, sizeof(m.error.message), g->mode);
		raw_send(fd, &m, len, -1);
		close(fd);
		return NULL;
	}
	size_t len = gg_ctrl_init(&m, GG_CTRL_ACCEPT);
	m.accept.version = GG_CTRL_VERSION;
	m.accept.max_inflight = 2;
	m.accept.max_message_bytes = 1 << 20;
	m.accept.max_region_bytes = 4 << 20;
	m.accept.max_regions = 3;
	m.accept.step_timeout_ms = 100;
	gg_ctrl_set_text(m.accept.site, sizeof(m.accept.site), "fake");
	if (!strcmp(g->mode, "bad-accept"))
		m.accept.max_inflight = 100;
	raw_send(fd, &m, len, -1);
	if (strcmp(g->mode, "bad-accept")) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		/* MAP, then ALLREDUCE. */
		CHECK(raw_recv(fd, &m) == sizeof(m.map));
		CHECK(raw_recv(fd, &m) == sizeof(m.allreduce));
		if (!strcmp(g->mode, "wrong-seq")) {
			len = gg_ctrl_init(&m, GG_CTRL_DONE);
			m.done.seq = 7;
			raw_send(fd, &m, len, -1);
		} else if (!strcmp(g->mode, "garbage")) {
			raw_send(fd, "garbage from the gateway", 24, -1);
		} else if (!strcmp(g->mode, "fd")) {
			len = gg_ctrl_init(&m, GG_CTRL_DONE);
			m.done.seq = 1;
			raw_send(fd, &m, len, fd);
		}
		/* "silent": says nothing; the library must give up by itself. */
		CHECK(poll(&p, 1, 5000) == 1);
	}
	close(fd);
	return NULL;
}

static void fake_gateway_check(const char *mode, int code, const char *text)
{
	struct fake_gateway g = { .mode = mode };
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	struct gg_session *s;
	struct gg_error err;
	float x = 1;

	snprintf(g.dir, sizeof(g.dir), "/tmp/gg-fake-XXXXXX");
	CHECK(mkdtemp(g.dir));
	snprintf(addr.sun_path, sizeof(addr.sun_path), "%s/gw.sock", g.dir);
	snprintf(g.endpoint, sizeof(g.endpoint), "unix:%s", addr.sun_path);
	g.listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	CHECK(g.listen_fd >= 0);
	CHECK(bind(g.listen_fd, (struct sockaddr *)&addr, sizeof(addr)) == 0);
	CHECK(listen(g.listen_fd, 4) == 0);
	CHECK(pthread_create(&g.thread, NULL, fake_gateway_main, &g) == 0);

	if (!strcmp(mode, "bad-accept") || !strncmp(mode, "refuse-", 7)) {
		CHECK_EQ_INT(gg_session_open(g.endpoint, "fake", 0, 1, &s, &err), code);
		CHECK_ERR(err, code, text);
	} else {
		s = open_rank(g.endpoint, "fake", 0, 1);
		uint64_t t0 = now_ms();
		CHECK_EQ_INT(gg_allreduce(s, &x, 1, GG_DTYPE_F32, 3, 0, &err), code);
		CHECK_ERR(err, code, text);
		if (!strcmp(mode, "silent"))
			CHECK(now_ms() - t0 >= 2000 && now_ms() - t0 < 3000);
		CHECK(x == 1);
		gg_session_close(s);
	}
	CHECK(pthread_join(g.thread, NULL) == 0);
	close(g.listen_fd);
	unlink(addr.sun_path);
	CHECK(rmdir(g.dir) == 0);
}

static void test_fake_gateway(void)
{
	unsigned fds = count_open_fds();

	fake_gateway_check("bad-accept", GG_ERR_PROTOCOL, "accepted with limits this library cannot use");
	/* A refusal carries the gateway's code where it says more than that. */
	fake_gateway_check("refuse-nomem", GG_ERR_NOMEM, "refuse-nomem");
	fake_gateway_check("refuse-closed", GG_ERR_CLOSED, "refuse-closed");
	fake_gateway_check("refuse-other", GG_ERR_REFUSED, "refuse-other");
	fake_gateway_check("wrong-seq", GG_ERR_PROTOCOL,
			   "step 1 (tensor 3): the gateway of site fake answered step 7, but step 1 was next");
	fake_gateway_check("garbage", GG_ERR_PROTOCOL,
			   "step 1 (tensor 3): the gateway of site fake sent a bad message: not a gradgate control message");
	fake_gateway_check("fd", GG_ERR_PROTOCOL, "step 1 (tensor 3): the gateway of site fake sent file descriptors");
	fake_gateway_check("silent", GG_ERR_TIMEOUT,
			   "step 1 (tensor 3): the gateway of site fake did not answer step 1 within its deadline and 2000 ms more");
	CHECK_EQ_INT(count_open_fds(), fds);
}

int main(int argc, char **argv)
{
	if (argc == 5 && !strcmp(argv[1], "--rank-that-dies"))
		return child_main(argv);

	struct harness_options o = { .step_timeout_us = STEP_TIMEOUT_MS * 1000 };
	harness_start(&h, &o);
	test_late_wait();
	test_mismatch();
	test_step_timeout();
	test_deadline_behind_steps();
	test_failed_elsewhere();
	test_rank_dies();
	test_close_in_flight();
	test_core_failures();
	test_broken_job_sleeps();
	test_shutdown();
	harness_stop(&h);

	test_memory_limit();
	test_memory_kept_between_steps();
	test_control_socket();
	test_fake_gateway();
	printf("host failures: ok\n");
	return 0;
}
