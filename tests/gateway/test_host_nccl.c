/* GPU mode with NCCL at the host backend, with a stand-in communicator
 * (nccl_double.h) so it runs on every machine: ranks join the job's
 * communicator through the gateway, their reduce forms the site sum, the
 * gateway's broadcast hands them the result, bit for bit the rank-order
 * sum; and every failure either still broadcasts (a failed exchange) or
 * aborts the communicator, so that no rank's call waits forever, with each
 * rank told why and told to abort its own. */
#include <errno.h>
#include <poll.h>
#include <time.h>
#include <unistd.h>

#include "host_harness.h"
#include "nccl_double.h"

#define STEP_TIMEOUT_MS 400
#define WAIT_MS 5000
#define TEXT_MAX GG_CTRL_TEXT_SIZE

static struct harness h;

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void send_join_as(int fd, uint32_t timeout_ms, uint32_t nccl_version)
{
	union gg_ctrl_msg m;
	size_t len = gg_ctrl_init(&m, GG_CTRL_NCCL_JOIN);

	m.nccl_join.timeout_ms = timeout_ms;
	m.nccl_join.nccl_version = nccl_version;
	raw_send(fd, &m, len, -1);
}

/* NCCL_JOIN of a rank whose NCCL is the gateway's. */
static void send_join(int fd, uint32_t timeout_ms)
{
	send_join_as(fd, timeout_ms, ND_NCCL_VERSION);
}

/* NCCL_JOIN, NCCL_ID for a job of `nranks`: the id. */
static void join(int fd, unsigned nranks, unsigned char id[GG_SITE_NCCL_ID_SIZE])
{
	union gg_ctrl_msg m;
	char why[160];

	send_join(fd, 0);
	size_t len = raw_recv(fd, &m);
	CHECK_EQ_INT(gg_ctrl_check(&m, len, why, sizeof(why)), GG_CTRL_NCCL_ID);
	CHECK_EQ_INT(m.nccl_id.nranks, nranks + 1);
	CHECK_EQ_INT(m.nccl_id.root, nranks);
	memcpy(id, m.nccl_id.id, GG_SITE_NCCL_ID_SIZE);
}

/* The DONE of step `seq`: its status, its flags, its message. */
static int recv_done(int fd, uint64_t seq, uint32_t *flags, char *message, size_t size)
{
	union gg_ctrl_msg m;
	char why[160];
	size_t len = raw_recv(fd, &m);

	CHECK_EQ_INT(gg_ctrl_check(&m, len, why, sizeof(why)), GG_CTRL_DONE);
	CHECK_EQ_INT(m.done.seq, seq);
	*flags = m.done.flags;
	snprintf(message, size, "%s", m.done.message);
	return m.done.status;
}

/* One rank: its connection, its handle on the communicator, its tensor,
 * and how its last step ended. */
struct rank {
	int fd;
	struct nd_rank *comm;
	float *buf;
	uint64_t count;
	int status;
	uint32_t flags;
	char msg[TEXT_MAX];
	int sync_rc;  /* its stream's wait after the DONE; -ECANCELED: it aborted */
	uint64_t ms;  /* from waiting for the DONE to the end */
};

struct job {
	const char *name;
	unsigned nranks;
	unsigned char id[GG_SITE_NCCL_ID_SIZE];
	uint64_t seq; /* the step the ranks' threads finish */
	struct rank r[4];
};

static void join_rank(unsigned rank, void *arg)
{
	struct job *j = arg;

	j->r[rank].comm = nd_join(j->id, j->nranks + 1, rank, WAIT_MS, NULL);
	CHECK(j->r[rank].comm);
}

/* Every rank connects and asks to join; then all join the stand-in
 * communicator at once (a collective call). */
static void job_open(struct job *j, const char *name, unsigned nranks)
{
	memset(j, 0, sizeof(*j));
	j->name = name;
	j->nranks = nranks;
	j->seq = 1;
	for (unsigned r = 0; r < nranks; r++) {
		j->r[r].fd = raw_connect(&h);
		raw_hello(j->r[r].fd, name, r, nranks);
		unsigned char id[GG_SITE_NCCL_ID_SIZE];
		join(j->r[r].fd, nranks, id);
		CHECK(r == 0 || !memcmp(id, j->id, sizeof(id)));
		memcpy(j->id, id, sizeof(id));
	}
	run_ranks(nranks, join_rank, j);
}

static void job_close(struct job *j)
{
	for (unsigned r = 0; r < j->nranks; r++) {
		if (j->r[r].fd >= 0)
			close(j->r[r].fd);
		nd_abort(j->r[r].comm);
		free(j->r[r].buf);
	}
}

/* How a rank makes its part of a step once it announced it. */
enum part {
	ENQUEUE,     /* its reduce and broadcast, as gg_allreduce_nccl enqueues them */
	REDUCE_ONLY, /* its stream stalls before the broadcast */
	NOTHING,     /* it dies before it enqueues anything */
};

/* Rank `rank` announces step `seq` of `count` floats through NCCL and
 * makes its part. */
static void announce(struct job *j, unsigned rank, uint64_t seq, uint64_t count, uint32_t seed, enum part part)
{
	struct rank *r = &j->r[rank];

	free(r->buf);
	r->buf = malloc(count * sizeof(float));
	CHECK(r->buf);
	r->count = count;
	fill_input_f32(r->buf, count, seed, rank);
	raw_allreduce(r->fd, seq, 7, GG_DTYPE_F32, count, GG_CTRL_REGION_NCCL, 0);
	if (part != NOTHING)
		nd_enqueue(r->comm, r->buf, count, part == REDUCE_ONLY);
}

/* The rest of a rank's step, as the library does it: the DONE; after a
 * flagged one it aborts its handle, whose calls may never end, else it
 * waits for its stream, which must be done then or soon. */
static void finish_rank(struct job *j, unsigned rank)
{
	struct rank *r = &j->r[rank];
	uint64_t t0 = now_ms();

	r->status = recv_done(r->fd, j->seq, &r->flags, r->msg, sizeof(r->msg));
	if (r->flags & GG_CTRL_DONE_NCCL_ABORTED) {
		nd_abort(r->comm);
		r->comm = NULL;
		r->sync_rc = -ECANCELED;
	} else {
		r->sync_rc = nd_sync(r->comm, WAIT_MS);
	}
	r->ms = now_ms() - t0;
}

static void finish_thread_rank(unsigned rank, void *arg)
{
	finish_rank(arg, rank);
}

/* A rank that finishes its step on a thread of its own. */
struct lone {
	struct job *j;
	unsigned rank;
	pthread_t t;
};

static void *lone_main(void *arg)
{
	struct lone *l = arg;

	finish_rank(l->j, l->rank);
	return NULL;
}

static void lone_start(struct lone *l, struct job *j, unsigned rank)
{
	*l = (struct lone){ .j = j, .rank = rank };
	CHECK(pthread_create(&l->t, NULL, lone_main, l) == 0);
}

/* Opens job `name` of two ranks; its rank 0 announces step 1, makes its
 * part and waits for the step's end on a thread of its own. */
static void lone_begin(struct lone *l, struct job *j, const char *name, uint32_t seed)
{
	job_open(j, name, 2);
	announce(j, 0, 1, 100, seed, ENQUEUE);
	lone_start(l, j, 0);
}

/* The rank's step failed and its DONE, in time, told it to abort. */
static void expect_aborted(const struct rank *r, int code, const char *text)
{
	CHECK_EQ_INT(r->status, code);
	CHECK_CONTAINS(r->msg, text);
	CHECK_EQ_INT(r->flags, GG_CTRL_DONE_NCCL_ABORTED);
	CHECK(r->ms < WAIT_MS - 1000);
}

/* Steps of several sizes: every rank ends with the rank-order sum, the
 * host backend's, bit for bit. */
static void test_sums(void)
{
	static const uint64_t sizes[] = { 1000, 1, 4097, 100000 };
	struct job j;

	job_open(&j, "nccl-sum", 3);
	for (unsigned s = 0; s < GG_ARRAY_LEN(sizes); s++) {
		uint64_t n = sizes[s];
		j.seq = s + 1;
		for (unsigned r = 0; r < j.nranks; r++)
			announce(&j, r, s + 1, n, 40 + s, ENQUEUE);
		run_ranks(j.nranks, finish_thread_rank, &j);

		float *in[3], *want = malloc(n * sizeof(float));
		for (unsigned r = 0; r < j.nranks; r++) {
			in[r] = malloc(n * sizeof(float));
			fill_input_f32(in[r], n, 40 + s, r);
		}
		reference_f32(want, in, j.nranks, n);
		for (unsigned r = 0; r < j.nranks; r++) {
			CHECK_EQ_INT(j.r[r].status, GG_OK);
			CHECK_EQ_INT(j.r[r].flags, 0);
			CHECK_EQ_INT(j.r[r].sync_rc, 0);
			check_same_bytes(j.r[r].buf, want, n, sizeof(float), "NCCL step result");
			free(in[r]);
		}
		free(want);
	}
	struct gg_host_backend_stats st = harness_stats(&h);
	CHECK_EQ_INT(st.sum_bytes, 0);
	CHECK_EQ_INT(st.spare_bytes, 100000 * sizeof(float)); /* kept for the next step */
	/* Up, the communicator's root is done, and the gateway holds no
	 * entry for it while the job goes on. */
	CHECK_EQ_INT(nd_ids_unended(), 0);
	unsigned finished = nd_finishes();
	job_close(&j);
	/* The job's end flushes its communicator, not aborts it. */
	harness_wait_connections(&h, 0);
	CHECK_EQ_INT(nd_finishes(), finished + 1);
	CHECK_EQ_INT(harness_stats(&h).spare_bytes, 0);
	printf("nccl: %zu steps of 3 ranks exact\n", GG_ARRAY_LEN(sizes));
}

/* A failed exchange is still broadcast: the communicator lives on. */
static void test_core_error(void)
{
	struct job j;

	job_open(&j, "nccl-core-error", 2);
	atomic_store(&h.core_mode, CORE_ERROR);
	for (unsigned r = 0; r < 2; r++)
		announce(&j, r, 1, 500, 1, ENQUEUE);
	run_ranks(2, finish_thread_rank, &j);
	for (unsigned r = 0; r < 2; r++) {
		CHECK_EQ_INT(j.r[r].status, GG_ERR_SITE);
		CHECK_CONTAINS(j.r[r].msg, CORE_ERROR_TEXT);
		CHECK_EQ_INT(j.r[r].flags, 0);
		CHECK_EQ_INT(j.r[r].sync_rc, 0);
	}
	atomic_store(&h.core_mode, CORE_SUM);
	j.seq = 2;
	for (unsigned r = 0; r < 2; r++)
		announce(&j, r, 2, 500, 2, ENQUEUE);
	run_ranks(2, finish_thread_rank, &j);
	for (unsigned r = 0; r < 2; r++) {
		CHECK_EQ_INT(j.r[r].status, GG_OK);
		CHECK_EQ_INT(j.r[r].flags, 0);
		CHECK_EQ_INT(j.r[r].sync_rc, 0);
	}
	job_close(&j);
	printf("nccl: a failed exchange is broadcast, the next step completes\n");
}

/* Rank 1 never announces the step: it fails at its deadline, and rank 0,
 * whose reduce waits for the gateway's, is told to abort. */
static void test_rank_missing(void)
{
	struct job j;
	struct lone l;

	lone_begin(&l, &j, "nccl-missing", 3);
	pthread_join(l.t, NULL);
	expect_aborted(&j.r[0], GG_ERR_TIMEOUT, "waiting for rank 1 of job 'nccl-missing'");

	/* The late rank hears the same, and to abort too. */
	announce(&j, 1, 1, 100, 3, ENQUEUE);
	finish_rank(&j, 1);
	expect_aborted(&j.r[1], GG_ERR_TIMEOUT, "waiting for rank 1 of job 'nccl-missing'");
	job_close(&j);
	printf("nccl: a missing rank: step failed in %llu ms, communicator aborted\n",
	       (unsigned long long)j.r[0].ms);
}

/* Rank 1 leaves while rank 0 waits in its reduce. */
static void test_rank_leaves(void)
{
	struct job j;
	struct lone l;

	lone_begin(&l, &j, "nccl-leaves", 4);
	usleep(50000);
	close(j.r[1].fd);
	j.r[1].fd = -1;
	pthread_join(l.t, NULL);
	expect_aborted(&j.r[0], GG_ERR_RANK, "rank 1 of job 'nccl-leaves' disconnected");
	job_close(&j);
	printf("nccl: a rank that leaves aborts the communicator\n");
}

/* Ranks that hand one step over in different ways. */
static void test_mixed(void)
{
	struct job j;
	struct lone l;
	uint32_t flags;
	char msg[TEXT_MAX];

	lone_begin(&l, &j, "nccl-mixed", 5);
	int mfd = raw_memfd(4096, true);
	raw_map(j.r[1].fd, 0, 4096, mfd);
	close(mfd);
	raw_allreduce(j.r[1].fd, 1, 7, GG_DTYPE_F32, 100, 0, 0);
	pthread_join(l.t, NULL);
	expect_aborted(&j.r[0], GG_ERR_MISMATCH, "rank 0 through NCCL, rank 1 in host memory");
	CHECK_EQ_INT(recv_done(j.r[1].fd, 1, &flags, msg, sizeof(msg)), GG_ERR_MISMATCH);
	job_close(&j);
	printf("nccl: ranks that mix NCCL and host memory are refused\n");
}

/* Both ranks of a new job announce step 1 and finish it on threads. */
static void both_begin(struct lone l[2], struct job *j, const char *name, uint32_t seed, enum part part1)
{
	job_open(j, name, 2);
	announce(j, 0, 1, 100, seed, ENQUEUE);
	announce(j, 1, 1, 100, seed, part1);
	lone_start(&l[0], j, 0);
	lone_start(&l[1], j, 1);
}

/* The gateway's own reduce or broadcast cannot be enqueued. */
static void test_gateway_faults(void)
{
	static const char *const want[] = { "site test-site: summing the ranks' tensors: nccl_double: injected",
					    "handing the result to the ranks: nccl_double: injected" };
	struct job j;
	struct lone l[2];

	for (unsigned k = 0; k < 2; k++) {
		nd_fail_next(k ? ND_BROADCAST : ND_REDUCE);
		both_begin(l, &j, k ? "nccl-broadcast-fails" : "nccl-reduce-fails", 6 + k, ENQUEUE);
		for (unsigned r = 0; r < 2; r++) {
			pthread_join(l[r].t, NULL);
			expect_aborted(&j.r[r], GG_ERR_SYSTEM, want[k]);
		}
		if (k) {
			/* The other sites completed the step; this one could not:
			 * the job cannot go on as one. */
			uint32_t flags;
			char msg[TEXT_MAX];
			raw_allreduce(j.r[0].fd, 2, 7, GG_DTYPE_F32, 100, GG_CTRL_REGION_NCCL, 0);
			CHECK_EQ_INT(recv_done(j.r[0].fd, 2, &flags, msg, sizeof(msg)), GG_ERR_SYSTEM);
			CHECK_CONTAINS(msg, want[k]);
		}
		job_close(&j);
	}
	printf("nccl: the gateway's failed reduce or broadcast aborts the communicator\n");
}

/* Both ranks announce the step but rank 1 never makes its reduce (it died
 * in between): the gateway's reduce is not done by the deadline, and the
 * communicator is aborted. Meanwhile the gateway's loop, which does not
 * wait for NCCL, serves another job's steps. */
static void test_reduce_timeout(void)
{
	struct job j;
	struct lone l;
	uint32_t flags;
	char msg[TEXT_MAX];

	uint64_t t0 = now_ms();
	lone_begin(&l, &j, "nccl-reduce-timeout", 8);
	announce(&j, 1, 1, 100, 8, NOTHING);

	int fd = raw_connect(&h), mfd = raw_memfd(4096, true);
	raw_hello(fd, "host-beside", 0, 1);
	raw_map(fd, 0, 4096, mfd);
	close(mfd);
	for (unsigned k = 1; k <= 3; k++) {
		raw_allreduce(fd, k, 1, GG_DTYPE_F32, 100, 0, 0);
		CHECK_EQ_INT(recv_done(fd, k, &flags, msg, sizeof(msg)), GG_OK);
	}
	uint64_t beside_ms = now_ms() - t0;
	close(fd);
	CHECK(beside_ms < STEP_TIMEOUT_MS);
	/* The core may not free GPU memory either (the node's residuals). */
	if (now_ms() - t0 < STEP_TIMEOUT_MS - 50)
		CHECK(atomic_load(&h.gpu_frees_held));
	/* An NCCL job beside it ends meanwhile: its buffer's free, which on a
	 * GPU would wait for the stuck reduce, waits for that reduce's end. */
	unsigned frees, busy, frees_beside, busy_beside;
	struct job other;
	job_open(&other, "nccl-beside", 1);
	announce(&other, 0, 1, 100, 9, ENQUEUE);
	finish_rank(&other, 0);
	CHECK_EQ_INT(other.r[0].status, GG_OK);
	nd_frees(&frees, &busy);
	job_close(&other);
	while (harness_stats(&h).jobs > 1)
		usleep(1000);
	nd_frees(&frees_beside, &busy_beside);
	uint64_t ended_ms = now_ms() - t0;
	if (ended_ms < STEP_TIMEOUT_MS - 50)
		CHECK_EQ_INT(frees_beside, frees); /* the reduce still runs: not freed yet */
	else
		printf("nccl: the job beside ended %llu ms in, too late to see its free held\n",
		       (unsigned long long)ended_ms);
	pthread_join(l.t, NULL);
	static const char want[] = "site test-site: the ranks' reduce to the gateway was not done within 400 ms (a "
				   "rank did not take part)";
	expect_aborted(&j.r[0], GG_ERR_TIMEOUT, want);
	CHECK(j.r[0].ms >= STEP_TIMEOUT_MS - 150);
	finish_rank(&j, 1);
	expect_aborted(&j.r[1], GG_ERR_TIMEOUT, want);
	job_close(&j);
	harness_wait_connections(&h, 0);
	nd_frees(&frees_beside, &busy_beside);
	CHECK(frees_beside > frees);
	CHECK_EQ_INT(busy_beside, busy); /* nothing freed while a reduce or broadcast ran */
	CHECK(!atomic_load(&h.gpu_frees_held));
	CHECK(atomic_load(&h.gpu_holds) > 0);
	printf("nccl: a reduce not done by the deadline: failed in %llu ms, another job's 3 steps done meanwhile in "
	       "%llu ms, and its buffer freed after the reduce's end\n", (unsigned long long)j.r[0].ms,
	       (unsigned long long)beside_ms);
}

/* The communicator fails while the gateway's reduce or broadcast runs. */
static void test_poll_faults(void)
{
	static const char *const want[] = { "summing the ranks' tensors: nccl_double: injected",
					    "handing the result to the ranks: nccl_double: injected" };
	struct job j;
	struct lone l[2];

	for (unsigned k = 0; k < 2; k++) {
		nd_fail_next(k ? ND_POLL_BROADCAST : ND_POLL_REDUCE);
		both_begin(l, &j, k ? "nccl-poll-broadcast" : "nccl-poll-reduce", 9, ENQUEUE);
		for (unsigned r = 0; r < 2; r++) {
			pthread_join(l[r].t, NULL);
			expect_aborted(&j.r[r], GG_ERR_SYSTEM, want[k]);
		}
		job_close(&j);
	}
	printf("nccl: a communicator that fails under the reduce or the broadcast is aborted\n");
}

/* Rank 0 has the result, rank 1 not yet, when rank 1 leaves: the step,
 * complete at every site, is not reported to the core as failed, and rank
 * 0 hears why the communicator went. */
static void test_broadcast_leave(void)
{
	struct job j;
	struct lone l;

	job_open(&j, "nccl-bcast-leave", 2);
	unsigned told = atomic_load(&h.aborts_told);
	announce(&j, 0, 1, 100, 10, ENQUEUE);
	announce(&j, 1, 1, 100, 10, REDUCE_ONLY);
	lone_start(&l, &j, 0);
	usleep(50000);
	close(j.r[1].fd);
	j.r[1].fd = -1;
	pthread_join(l.t, NULL);
	expect_aborted(&j.r[0], GG_ERR_RANK, "rank 1 of job 'nccl-bcast-leave' disconnected during step 1");
	CHECK_EQ_INT(atomic_load(&h.aborts_told), told);
	CHECK_EQ_INT(harness_stats(&h).core_steps, 0);
	job_close(&j);
	printf("nccl: a rank that leaves during the broadcast fails it here only\n");
}

/* Rank 1 never takes the broadcast: it is given up at the step's deadline
 * (and the peers' grace, none here), and the job with it, for the other
 * sites completed the step. */
static void test_broadcast_timeout(void)
{
	struct job j;
	struct lone l[2];
	uint32_t flags;
	char msg[TEXT_MAX];
	static const char want[] = "site test-site: the broadcast of the result to the ranks was not done by the "
				   "step's deadline and 0 ms of grace";

	both_begin(l, &j, "nccl-bcast-timeout", 11, REDUCE_ONLY);
	for (unsigned r = 0; r < 2; r++) {
		pthread_join(l[r].t, NULL);
		expect_aborted(&j.r[r], GG_ERR_TIMEOUT, want);
	}
	raw_allreduce(j.r[0].fd, 2, 7, GG_DTYPE_F32, 100, GG_CTRL_REGION_NCCL, 0);
	CHECK_EQ_INT(recv_done(j.r[0].fd, 2, &flags, msg, sizeof(msg)), GG_ERR_TIMEOUT);
	CHECK_CONTAINS(msg, want);
	job_close(&j);
	printf("nccl: a broadcast not done in time fails the step and the job\n");
}

/* The job's last rank leaves while the gateway's reduce waits for it: the
 * abort ends the step and the job at once, and the connection is gone at
 * once too, not a close timeout later. */
static void test_last_rank_leaves(void)
{
	unsigned char id[GG_SITE_NCCL_ID_SIZE];
	int fd = raw_connect(&h);

	raw_hello(fd, "nccl-last", 0, 1);
	join(fd, 1, id);
	struct nd_rank *r = nd_join(id, 2, 0, WAIT_MS, NULL);
	CHECK(r);
	raw_allreduce(fd, 1, 7, GG_DTYPE_F32, 100, GG_CTRL_REGION_NCCL, 0);
	usleep(20000);
	uint64_t t0 = now_ms();
	close(fd);
	harness_wait_connections(&h, 0);
	uint64_t ms = now_ms() - t0;
	CHECK(ms < 500);
	CHECK_EQ_INT(harness_stats(&h).jobs, 0);
	nd_abort(r);
	printf("nccl: the last rank leaving mid-reduce: connection and job gone in %llu ms\n", (unsigned long long)ms);
}

/* A rank that never asks to join: the communicator is given up at the
 * join's deadline, the rank that joined and waits for it is told so at
 * once (its session ends), and a rank that asks later is refused, naming
 * it. */
static void test_join_timeout(void)
{
	int fd0 = raw_connect(&h), fd1 = raw_connect(&h);
	unsigned char id[GG_SITE_NCCL_ID_SIZE];

	raw_hello(fd0, "nccl-join", 0, 2);
	raw_hello(fd1, "nccl-join", 1, 2);
	join(fd0, 2, id);
	uint64_t t0 = now_ms();
	raw_expect_close(fd0, GG_CTRL_ERROR, GG_ERR_TIMEOUT,
			 "the NCCL communicator of job 'nccl-join' was not up within 400 ms of its first NCCL_JOIN: "
			 "rank 1 did not ask to join it");
	CHECK(now_ms() - t0 < STEP_TIMEOUT_MS + 300);
	/* Given up, while the job still has rank 1: its root is stopped now. */
	CHECK_EQ_INT(nd_roots_waiting(), 0);
	send_join(fd1, 0);
	raw_expect_close(fd1, GG_CTRL_ERROR, GG_ERR_TIMEOUT,
			 "the NCCL communicator of job 'nccl-join' was not up within 400 ms of its first NCCL_JOIN: "
			 "rank 1 did not ask to join it");
	printf("nccl: a rank that never joins: communicator given up, its root stopped, a late one refused\n");
}

/* What the protocol refuses. */
static void test_protocol(void)
{
	unsigned char id[GG_SITE_NCCL_ID_SIZE];
	int fd = raw_connect(&h);

	raw_hello(fd, "nccl-proto-a", 0, 1);
	raw_allreduce(fd, 1, 7, GG_DTYPE_F32, 10, GG_CTRL_REGION_NCCL, 0);
	raw_expect_close(fd, GG_CTRL_ERROR, GG_ERR_PROTOCOL, "an NCCL step from a rank that has not sent NCCL_JOIN");

	fd = raw_connect(&h);
	raw_hello(fd, "nccl-proto-b", 0, 1);
	join(fd, 1, id);
	raw_allreduce(fd, 1, 7, GG_DTYPE_BF16, 10, GG_CTRL_REGION_NCCL, 0);
	raw_expect_close(fd, GG_CTRL_ERROR, GG_ERR_PROTOCOL, "an NCCL step must be float32 at offset 0, not bfloat16");

	fd = raw_connect(&h);
	raw_hello(fd, "nccl-proto-c", 0, 1);
	join(fd, 1, id);
	send_join(fd, 0);
	raw_expect_close(fd, GG_CTRL_ERROR, GG_ERR_PROTOCOL, "which has joined already");

	/* A job that failed (its other rank broke the rules) makes no
	 * communicator: the join is refused with the failure's cause. */
	int fd0 = raw_connect(&h), fd1 = raw_connect(&h);
	raw_hello(fd0, "nccl-proto-broken", 0, 2);
	raw_hello(fd1, "nccl-proto-broken", 1, 2);
	raw_allreduce(fd1, 5, 7, GG_DTYPE_F32, 10, GG_CTRL_REGION_NCCL, 0);
	raw_expect_close(fd1, GG_CTRL_ERROR, GG_ERR_PROTOCOL, "ALLREDUCE with seq 5, expected 1");
	send_join(fd0, 0);
	raw_expect_close(fd0, GG_CTRL_ERROR, GG_ERR_RANK,
			 "rank 1 of job 'nccl-proto-broken' broke the control protocol");

	/* A rank of another NCCL could never join: it is told why, and the
	 * job's other rank, which joined and waits for the communicator to
	 * come up, hears at once that it could not be served: its session
	 * ends, as that communicator is given up. */
	fd0 = raw_connect(&h);
	fd1 = raw_connect(&h);
	raw_hello(fd0, "nccl-proto-version", 0, 2);
	raw_hello(fd1, "nccl-proto-version", 1, 2);
	join(fd0, 2, id);
	send_join_as(fd1, 0, 22105);
	raw_expect_close(fd1, GG_CTRL_ERROR, GG_ERR_INVALID,
			 "rank 1 runs NCCL 2.21.5 and this gateway NCCL 2.28.9: NCCL makes a communicator only of "
			 "ranks of one version");
	raw_expect_close(fd0, GG_CTRL_ERROR, GG_ERR_RANK, "rank 1 of job 'nccl-proto-version' could not be served");

	/* A rank that had announced its first step by then gets its DONE,
	 * which tells it to abort its part. */
	fd0 = raw_connect(&h);
	fd1 = raw_connect(&h);
	raw_hello(fd0, "nccl-proto-version2", 0, 2);
	raw_hello(fd1, "nccl-proto-version2", 1, 2);
	join(fd0, 2, id);
	raw_allreduce(fd0, 1, 7, GG_DTYPE_F32, 10, GG_CTRL_REGION_NCCL, 0);
	send_join_as(fd1, 0, 22105);
	raw_expect_close(fd1, GG_CTRL_ERROR, GG_ERR_INVALID, "rank 1 runs NCCL 2.21.5");
	char msg[GG_CTRL_TEXT_SIZE];
	uint32_t flags;
	CHECK_EQ_INT(recv_done(fd0, 1, &flags, msg, sizeof(msg)), GG_ERR_RANK);
	CHECK_CONTAINS(msg, "rank 1 of job 'nccl-proto-version2' could not be served");
	CHECK_EQ_INT(flags, GG_CTRL_DONE_NCCL_ABORTED);
	close(fd0);

	nd_fail_next(ND_OPEN);
	fd = raw_connect(&h);
	raw_hello(fd, "nccl-proto-d", 0, 1);
	send_join(fd, 0);
	raw_expect_close(fd, GG_CTRL_ERROR, GG_ERR_SYSTEM,
			 "cannot make the job's NCCL communicator: nccl_double: injected failure");
	/* The id was made before the gateway's own join failed: its root goes. */
	CHECK_EQ_INT(nd_roots_waiting(), 0);
	printf("nccl: protocol violations refused\n");
}

/* A step another site failed, which a rank announces while the other is
 * still to come: it waits for that rank and the gateway's reduce, as a
 * step failed at submit does, and is broadcast: failing it at once would
 * abort the communicator. The job goes on. */
static void test_failed_elsewhere(void)
{
	struct job j;

	job_open(&j, "nccl-elsewhere", 2);
	atomic_store(&h.failed_from, 1);
	announce(&j, 0, 1, 100, 12, ENQUEUE);
	usleep(30000);
	announce(&j, 1, 1, 100, 12, ENQUEUE);
	run_ranks(j.nranks, finish_thread_rank, &j);
	for (unsigned r = 0; r < j.nranks; r++) {
		CHECK_EQ_INT(j.r[r].status, GG_ERR_SITE);
		CHECK_CONTAINS(j.r[r].msg, FAILED_ELSEWHERE_TEXT);
		CHECK_EQ_INT(j.r[r].flags, 0);
		CHECK_EQ_INT(j.r[r].sync_rc, 0);
	}
	atomic_store(&h.failed_from, 0);
	j.seq = 2;
	for (unsigned r = 0; r < j.nranks; r++)
		announce(&j, r, 2, 100, 13, ENQUEUE);
	run_ranks(j.nranks, finish_thread_rank, &j);
	for (unsigned r = 0; r < j.nranks; r++)
		CHECK_EQ_INT(j.r[r].status, GG_OK);
	job_close(&j);
	printf("nccl: a step failed elsewhere is still reduced and broadcast; the next one completes\n");
}

/* The gateway stops while a job's reduce waits for a rank: every rank of
 * the job hears GG_ERR_CLOSED, by its DONE or its session's end. */
static void test_shutdown(void)
{
	struct job j;

	job_open(&j, "nccl-shutdown", 2);
	announce(&j, 0, 1, 100, 14, ENQUEUE);
	announce(&j, 1, 1, 100, 14, NOTHING);
	usleep(50000);
	harness_stop_begin(&h);
	for (unsigned r = 0; r < j.nranks; r++) {
		union gg_ctrl_msg m;
		char why[160];
		size_t len = raw_recv(j.r[r].fd, &m);
		int type = gg_ctrl_check(&m, len, why, sizeof(why));
		CHECK(type == GG_CTRL_DONE || type == GG_CTRL_ERROR);
		CHECK_EQ_INT(type == GG_CTRL_DONE ? m.done.status : m.error.code, GG_ERR_CLOSED);
		CHECK_CONTAINS(type == GG_CTRL_DONE ? m.done.message : m.error.message,
			       "the gateway of site test-site is shutting down");
	}
	job_close(&j);
	harness_stop(&h);
	printf("nccl: a stopping gateway ends a waiting NCCL step with GG_ERR_CLOSED at every rank\n");
}

/* Under a 1 MiB limit: a GPU buffer given back while another job's reduce
 * runs, whose free waits for it, still counts against the limit: a sum
 * that would take the GPU past it is refused, not made. */
static void test_memory_deferred(void)
{
	struct job a, b;
	struct lone l;

	job_open(&b, "nccl-mem-b", 1);
	announce(&b, 0, 1, 100000, 15, ENQUEUE); /* 400000 bytes, kept as its spare */
	finish_rank(&b, 0);
	CHECK_EQ_INT(b.r[0].status, GG_OK);

	lone_begin(&l, &a, "nccl-mem-a", 16); /* rank 0 of 2, 100 floats */
	announce(&a, 1, 1, 100, 16, NOTHING);
	usleep(20000);
	/* Its reduce waits for rank 1: job b's spare, too small for its next
	 * step, waits to be freed, and 680000 bytes more would pass 1 MiB. */
	b.seq = 2;
	announce(&b, 0, 2, 170000, 17, ENQUEUE);
	finish_rank(&b, 0);
	expect_aborted(&b.r[0], GG_ERR_LIMIT, "leaves no room for a 680000-byte sum (400400 in use)");

	pthread_join(l.t, NULL);
	expect_aborted(&a.r[0], GG_ERR_TIMEOUT, "the ranks' reduce to the gateway was not done");
	finish_rank(&a, 1);
	job_close(&a);
	job_close(&b);
	harness_wait_connections(&h, 0);
	printf("nccl: a GPU buffer whose free waits for a reduce still counts against the memory limit\n");
}

/* A gateway without NCCL says so. */
static void test_without_nccl(void)
{
	struct harness plain;
	struct harness_options o = { .step_timeout_us = STEP_TIMEOUT_MS * 1000 };

	harness_start(&plain, &o);
	int fd = raw_connect(&plain);
	raw_hello(fd, "nccl-none", 0, 1);
	send_join(fd, 0);
	raw_expect_close(fd, GG_CTRL_ERROR, GG_ERR_INVALID,
			 "this gateway was built without NCCL, so it cannot join the job's NCCL communicator");
	harness_stop(&plain);
	printf("nccl: a gateway without NCCL refuses NCCL_JOIN\n");
}

int main(void)
{
	struct harness_options o = { .step_timeout_us = STEP_TIMEOUT_MS * 1000, .nccl = &nccl_double_ops,
				     .nccl_busy = nd_busy };
	struct harness_options small = o;

	small.memory_bytes = 1u << 20;
	harness_start(&h, &small);
	test_memory_deferred();
	harness_stop(&h);
	harness_start(&h, &o);
	test_sums();
	test_core_error();
	test_rank_missing();
	test_rank_leaves();
	test_mixed();
	test_gateway_faults();
	test_reduce_timeout();
	test_poll_faults();
	test_broadcast_leave();
	test_broadcast_timeout();
	test_last_rank_leaves();
	test_join_timeout();
	test_protocol();
	test_failed_elsewhere();
	test_shutdown();
	test_without_nccl();
	CHECK_EQ_INT(nd_live(), 0);
	CHECK_EQ_INT(nd_roots_waiting(), 0);
	CHECK_EQ_INT(nd_ids_unended(), 0);
	printf("host nccl: ok\n");
	return 0;
}
