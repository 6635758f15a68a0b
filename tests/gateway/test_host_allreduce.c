/* Host mode end to end: 1, 2 and 3 ranks through the client library, fp32
 * and bf16, results bit for bit equal to the sum in rank order, from
 * ordinary memory and from shared buffers; requests in flight together,
 * and one polled with gg_wait(req, 0); the library's own argument checks. */
#include <unistd.h>

#include "host_harness.h"

#define CHECK_OK(rc, err)                                                                              \
	do {                                                                                           \
		if ((rc) != 0) {                                                                       \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, gg_strerror(rc), (err).message); \
			exit(1);                                                                       \
		}                                                                                      \
	} while (0)

static struct harness h;

/* Each rank's input for (tensor, dtype, count) and the expected result. */
static void *make_input(unsigned tensor, enum gg_dtype dtype, size_t count, unsigned rank)
{
	void *buf = malloc(count * gg_dtype_size(dtype));

	CHECK(buf);
	if (dtype == GG_DTYPE_F32)
		fill_input_f32(buf, count, tensor, rank);
	else
		fill_input_bf16(buf, count, tensor, rank);
	return buf;
}

static void *make_expected(unsigned tensor, enum gg_dtype dtype, size_t count, unsigned nranks)
{
	void *in[3], *out = malloc(count * gg_dtype_size(dtype));

	CHECK(out && nranks <= 3);
	for (unsigned r = 0; r < nranks; r++)
		in[r] = make_input(tensor, dtype, count, r);
	if (dtype == GG_DTYPE_F32)
		reference_f32(out, (float *const *)in, nranks, count);
	else
		reference_bf16(out, (uint16_t *const *)in, nranks, count);
	for (unsigned r = 0; r < nranks; r++)
		free(in[r]);
	return out;
}

static void check_result(const void *got, unsigned tensor, enum gg_dtype dtype, size_t count, unsigned nranks,
			 unsigned rank)
{
	char what[96];
	void *want = make_expected(tensor, dtype, count, nranks);

	snprintf(what, sizeof(what), "rank %u of %u, tensor %u, %zu %s", rank, nranks, tensor, count,
		 dtype == GG_DTYPE_F32 ? "float32" : "bfloat16");
	check_same_bytes(got, want, count, gg_dtype_size(dtype), what);
	free(want);
}

/* ---- blocking all-reduce over ranks, sizes and types --------------------- */

struct sum_case {
	unsigned nranks;
	char job[32];
};

static void sum_rank(unsigned rank, void *arg)
{
	const struct sum_case *c = arg;
	static const size_t counts[] = { 1, 1000003 };
	static const enum gg_dtype dtypes[] = { GG_DTYPE_F32, GG_DTYPE_BF16 };
	struct gg_session *s;
	struct gg_error err;
	unsigned tensor = 0;

	CHECK_OK(gg_session_open(h.endpoint, c->job, (int)rank, (int)c->nranks, &s, &err), err);
	for (size_t d = 0; d < GG_ARRAY_LEN(dtypes); d++) {
		for (size_t k = 0; k < GG_ARRAY_LEN(counts); k++, tensor++) {
			void *buf = make_input(tensor, dtypes[d], counts[k], rank);
			int rc = gg_allreduce(s, buf, counts[k], dtypes[d], tensor, 10000, &err);
			CHECK_OK(rc, err);
			CHECK_EQ_INT(err.code, 0);
			CHECK_EQ_INT(err.message[0], 0);
			check_result(buf, tensor, dtypes[d], counts[k], c->nranks, rank);
			free(buf);
		}
	}
	gg_session_close(s);
}

static void test_sums(void)
{
	for (unsigned n = 1; n <= 3; n++) {
		struct sum_case c = { .nranks = n };
		snprintf(c.job, sizeof(c.job), "sum-%u", n);
		/* The core answers from inside submit() for 2 ranks, later otherwise. */
		atomic_store(&h.core_sync, n == 2);
		run_ranks(n, sum_rank, &c);
	}
	atomic_store(&h.core_sync, false);
}

/* ---- requests in flight together ----------------------------------------- */

#define ASYNC_REQS GG_CTRL_MAX_INFLIGHT

/* Sizes that make the session's shared region grow while requests that
 * live in the older regions are still in flight. */
static const size_t async_counts[ASYNC_REQS] = { 1000, 300000, 17, 5u << 20, 64, 1000003, 3, 2048 };

static pthread_barrier_t async_barrier;

static enum gg_dtype async_dtype(unsigned k)
{
	return k % 2 ? GG_DTYPE_BF16 : GG_DTYPE_F32;
}

static void async_rank(unsigned rank, void *arg)
{
	struct gg_session *s;
	struct gg_request *req[ASYNC_REQS], *extra;
	void *buf[ASYNC_REQS];
	struct gg_error err;
	struct gg_session_info info;
	unsigned base = 100;

	(void)arg;
	CHECK_OK(gg_session_open(h.endpoint, "async", (int)rank, 3, &s, &err), err);
	/* The size the caller sets decides what is filled in. */
	info.size = 0;
	CHECK_EQ_INT(gg_session_get_info(s, &info), GG_ERR_INVALID);
	info.size = sizeof(info) - 1; /* short of the first version's struct */
	CHECK_EQ_INT(gg_session_get_info(s, &info), GG_ERR_INVALID);
	CHECK_EQ_INT(gg_session_get_info(s, NULL), GG_ERR_INVALID);
	CHECK_EQ_INT(gg_session_get_info(NULL, &info), GG_ERR_INVALID);
	struct {
		struct gg_session_info info;
		uint32_t later_field; /* a newer header's struct, which this library does not know */
	} newer;
	memset(&newer, 0xee, sizeof(newer));
	newer.info.size = sizeof(newer);
	CHECK_EQ_INT(gg_session_get_info(s, &newer.info), 0);
	CHECK_EQ_INT(newer.info.size, sizeof(struct gg_session_info));
	CHECK_EQ_INT(newer.later_field, 0xeeeeeeeeu);
	CHECK_EQ_INT(newer.info.max_inflight, ASYNC_REQS);
	info.size = sizeof(info);
	CHECK_EQ_INT(gg_session_get_info(s, &info), 0);
	CHECK_EQ_INT(info.max_inflight, ASYNC_REQS);
	CHECK_CONTAINS(info.site, "test-site");
	if (rank != 0)
		pthread_barrier_wait(&async_barrier);
	for (unsigned k = 0; k < ASYNC_REQS; k++) {
		buf[k] = make_input(base + k, async_dtype(k), async_counts[k], rank);
		CHECK_OK(gg_allreduce_start(s, buf[k], async_counts[k], async_dtype(k), base + k, 10000, &req[k], &err),
			 err);
		if (rank == 1 && k == 2) {
			/* Let go of one before its answer can have come: its buffer
			 * must be left alone from here on. */
			gg_request_free(req[k]);
			req[k] = NULL;
		}
	}
	if (rank == 0) {
		/* Nobody else has started: nothing can be finished yet. */
		CHECK_EQ_INT(gg_wait(req[0], 0, &err), GG_ERR_AGAIN);
		CHECK_EQ_INT(gg_wait(req[0], 30, &err), GG_ERR_AGAIN);
		CHECK_ERR(err, GG_ERR_AGAIN, "step 1 (tensor 100) still in progress after 30 ms");
		float one = 1;
		CHECK_EQ_INT(gg_allreduce_start(s, &one, 1, GG_DTYPE_F32, 999, 1000, &extra, &err), GG_ERR_BUSY);
		CHECK_ERR(err, GG_ERR_BUSY, "step 9 (tensor 999), not sent: 8 requests already in flight");
		CHECK(extra == NULL);
		pthread_barrier_wait(&async_barrier);
	}
	/* Waiting for the last one first handles every answer before it. */
	CHECK_OK(gg_wait(req[ASYNC_REQS - 1], -1, &err), err);
	for (unsigned k = 0; k < ASYNC_REQS; k++) {
		if (!req[k]) {
			void *input = make_input(base + k, async_dtype(k), async_counts[k], rank);
			check_same_bytes(buf[k], input, async_counts[k], gg_dtype_size(async_dtype(k)), "freed request's buffer");
			free(input);
		} else {
			CHECK_OK(gg_wait(req[k], 0, &err), err);
			CHECK_OK(gg_wait(req[k], 0, &err), err); /* a finished request keeps its outcome */
			check_result(buf[k], base + k, async_dtype(k), async_counts[k], 3, rank);
			gg_request_free(req[k]);
		}
		free(buf[k]);
	}
	/* The session goes on after all that, in the regions it has now. */
	float x = (float)rank;
	CHECK_OK(gg_allreduce(s, &x, 1, GG_DTYPE_F32, 7, 10000, &err), err);
	CHECK(x == 3.0f);
	gg_session_close(s);
}

static void test_async(void)
{
	CHECK(pthread_barrier_init(&async_barrier, NULL, 3) == 0);
	run_ranks(3, async_rank, NULL);
	pthread_barrier_destroy(&async_barrier);
}

/* A caller that polls with gg_wait(req, 0) sees the answer once it came:
 * the look reads what the gateway sent, it does not only check. */
static void test_poll(void)
{
	struct gg_session *s;
	struct gg_request *req;
	struct gg_error err;
	float x[64] = { 1 };
	int rc = GG_ERR_AGAIN;

	CHECK_OK(gg_session_open(h.endpoint, "poll", 0, 1, &s, &err), err);
	CHECK_OK(gg_allreduce_start(s, x, 64, GG_DTYPE_F32, 1, 5000, &req, &err), err);
	for (int i = 0; i < 500 && rc == GG_ERR_AGAIN; i++) {
		usleep(10000);
		rc = gg_wait(req, 0, &err);
	}
	CHECK_OK(rc, err);
	CHECK(x[0] == 1 && x[1] == 0);
	gg_request_free(req);
	gg_session_close(s);
}

/* ---- shared buffers ------------------------------------------------------ */

/* Tensors inside shared buffers, at odd element offsets, for some ranks
 * (even ranks) while the others copy: the same bytes as the copying path,
 * and the result in place. */
static void shared_rank(unsigned rank, void *arg)
{
	const struct sum_case *c = arg;
	static const size_t counts[] = { 1, 1000003 };
	static const enum gg_dtype dtypes[] = { GG_DTYPE_F32, GG_DTYPE_BF16 };
	struct gg_session *s;
	struct gg_session_info info;
	struct gg_error err;
	unsigned tensor = 100;
	void *shared;

	CHECK_OK(gg_session_open(h.endpoint, c->job, (int)rank, (int)c->nranks, &s, &err), err);
	info.size = sizeof(info);
	CHECK_EQ_INT(gg_session_get_info(s, &info), 0);
	CHECK(info.max_buffers >= 8);
	CHECK_OK(gg_buffer_alloc(s, 1000003 * sizeof(float) + 64, &shared, &err), err);
	CHECK(((uintptr_t)shared & 4095) == 0);
	for (size_t d = 0; d < GG_ARRAY_LEN(dtypes); d++) {
		for (size_t k = 0; k < GG_ARRAY_LEN(counts); k++, tensor++) {
			size_t esize = gg_dtype_size(dtypes[d]), bytes = counts[k] * esize;
			void *in = make_input(tensor, dtypes[d], counts[k], rank);
			void *buf = rank % 2 ? in : (char *)shared + 3 * esize;
			if (buf != in)
				memcpy(buf, in, bytes);
			CHECK_OK(gg_allreduce(s, buf, counts[k], dtypes[d], tensor, 10000, &err), err);
			check_result(buf, tensor, dtypes[d], counts[k], c->nranks, rank);
			free(in);
		}
	}
	CHECK_OK(gg_buffer_free(s, shared, &err), err);
	gg_session_close(s);
}

static void test_shared_sums(void)
{
	for (unsigned n = 1; n <= 3; n++) {
		struct sum_case c = { .nranks = n };
		snprintf(c.job, sizeof(c.job), "shared-%u", n);
		atomic_store(&h.core_sync, n == 2);
		run_ranks(n, shared_rank, &c);
	}
	atomic_store(&h.core_sync, false);
}

static void test_shared_arguments(void)
{
	struct gg_session *s, *other;
	struct gg_session_info info;
	struct gg_request *r;
	struct gg_error err;
	void *buf, *bufs[64];
	float local[4] = { 1, 2, 3, 4 };

	CHECK_OK(gg_session_open(h.endpoint, "shared-args", 0, 1, &s, &err), err);
	CHECK_OK(gg_session_open(h.endpoint, "shared-other", 0, 1, &other, &err), err);
	info.size = sizeof(info);
	CHECK_EQ_INT(gg_session_get_info(s, &info), 0);
	CHECK_EQ_INT(gg_buffer_alloc(s, 0, &buf, &err), GG_ERR_INVALID);
	CHECK_ERR(err, GG_ERR_INVALID, "gg_buffer_alloc: bytes is 0");
	CHECK(buf == NULL);
	CHECK_EQ_INT(gg_buffer_alloc(s, info.max_message_bytes + 1, &buf, &err), GG_ERR_TOO_LARGE);
	CHECK_ERR(err, GG_ERR_TOO_LARGE, "exceed the max_message", "site test-site");
	CHECK_EQ_INT(gg_buffer_alloc(s, 64, NULL, &err), GG_ERR_INVALID);

	CHECK_OK(gg_buffer_alloc(s, 4096, &buf, &err), err);
	float *f = buf;
	/* Past its end, not aligned to the element, or someone else's. */
	CHECK_EQ_INT(gg_allreduce(s, f + 1000, 100, GG_DTYPE_F32, 1, 0, &err), GG_ERR_INVALID);
	CHECK_ERR(err, GG_ERR_INVALID, "step 1 (tensor 1)", "run past the end of the shared buffer");
	CHECK_EQ_INT(gg_allreduce(s, (char *)buf + 2, 4, GG_DTYPE_F32, 1, 0, &err), GG_ERR_INVALID);
	CHECK_ERR(err, GG_ERR_INVALID, "is not aligned to the 4-byte float32 elements");
	CHECK_EQ_INT(gg_buffer_free(other, buf, &err), GG_ERR_INVALID);
	CHECK_ERR(err, GG_ERR_INVALID, "is not a shared buffer of this session");
	CHECK_EQ_INT(gg_buffer_free(s, local, &err), GG_ERR_INVALID);
	CHECK_EQ_INT(gg_buffer_free(s, f + 1, &err), GG_ERR_INVALID);
	CHECK_OK(gg_buffer_free(s, NULL, &err), err);
	/* bfloat16 at an odd 2-byte offset is aligned. */
	uint16_t *b = (uint16_t *)buf + 1;
	b[0] = 0x3f80;
	CHECK_OK(gg_allreduce(s, b, 1, GG_DTYPE_BF16, 1, 0, &err), err);
	CHECK_EQ_INT(b[0], 0x3f80);

	/* Freed while a request uses it: it goes once the request finished. */
	f[0] = 5;
	CHECK_OK(gg_allreduce_start(s, f, 1, GG_DTYPE_F32, 2, 0, &r, &err), err);
	CHECK_OK(gg_buffer_free(s, buf, &err), err);
	CHECK_EQ_INT(gg_buffer_free(s, buf, &err), GG_ERR_INVALID); /* once only */
	CHECK_OK(gg_wait(r, -1, &err), err);
	gg_request_free(r);

	/* As many as the session may hold, then one more is refused. */
	unsigned n = 0;
	for (; n < info.max_buffers; n++)
		CHECK_OK(gg_buffer_alloc(s, 64, &bufs[n], &err), err);
	CHECK_EQ_INT(gg_buffer_alloc(s, 64, &buf, &err), GG_ERR_LIMIT);
	CHECK_ERR(err, GG_ERR_LIMIT, "holds", "shared buffers, as many as the gateway of site test-site allows");
	/* Staged requests still work with every buffer taken. */
	CHECK_OK(gg_allreduce(s, local, 4, GG_DTYPE_F32, 3, 0, &err), err);
	CHECK(local[0] == 1 && local[3] == 4);
	CHECK_OK(gg_buffer_free(s, bufs[0], &err), err);
	CHECK_OK(gg_buffer_alloc(s, 64, &bufs[0], &err), err);
	gg_session_close(other);
	gg_session_close(s); /* frees the rest */
}

/* ---- the endpoint and the library's own checks --------------------------- */

static void test_endpoint_env(void)
{
	struct gg_session *s;
	struct gg_error err;
	float x = 2.5f;

	CHECK(setenv(GG_ENDPOINT_ENV, h.endpoint, 1) == 0);
	CHECK_OK(gg_session_open(NULL, "env", 0, 1, &s, &err), err);
	CHECK_OK(gg_allreduce(s, &x, 1, GG_DTYPE_F32, 1, 0, &err), err);
	CHECK(x == 2.5f);
	gg_session_close(s);
	CHECK(unsetenv(GG_ENDPOINT_ENV) == 0);
	CHECK_EQ_INT(gg_session_open(NULL, "env", 0, 1, &s, &err), GG_ERR_INVALID);
	CHECK_ERR(err, GG_ERR_INVALID, "no gateway endpoint", GG_ENDPOINT_ENV);
	CHECK(s == NULL);
	/* An empty one, given or set, is named as such. */
	CHECK(setenv(GG_ENDPOINT_ENV, "", 1) == 0);
	CHECK_EQ_INT(gg_session_open(NULL, "env", 0, 1, &s, &err), GG_ERR_INVALID);
	CHECK_ERR(err, GG_ERR_INVALID, GG_ENDPOINT_ENV " is empty: pass one or set");
	CHECK(setenv(GG_ENDPOINT_ENV, h.endpoint, 1) == 0);
	CHECK_EQ_INT(gg_session_open("", "env", 0, 1, &s, &err), GG_ERR_INVALID);
	CHECK_ERR(err, GG_ERR_INVALID, "the gateway endpoint given is empty (giving none reads " GG_ENDPOINT_ENV ")");
	CHECK(s == NULL);
	CHECK(unsetenv(GG_ENDPOINT_ENV) == 0);
}

static void test_arguments(void)
{
	struct gg_session *s;
	struct gg_request *r;
	struct gg_error err;
	char nowhere[128];
	float x[4] = { 1, 2, 3, 4 };

	CHECK_EQ_INT(gg_session_open(h.endpoint, "", 0, 1, &s, &err), GG_ERR_INVALID);
	CHECK_ERR(err, GG_ERR_INVALID, "1 to 63 characters");
	CHECK_EQ_INT(gg_session_open(h.endpoint, "bad name", 0, 1, &s, &err), GG_ERR_INVALID);
	CHECK_ERR(err, GG_ERR_INVALID, "character 0x20 at 3");
	CHECK_EQ_INT(gg_session_open(h.endpoint, "job", 3, 3, &s, &err), GG_ERR_INVALID);
	CHECK_ERR(err, GG_ERR_INVALID, "rank 3 is outside 0..2");
	CHECK_EQ_INT(gg_session_open(h.endpoint, "job", 0, 0, &s, &err), GG_ERR_INVALID);
	CHECK_ERR(err, GG_ERR_INVALID, "nranks 0");
	CHECK_EQ_INT(gg_session_open("tcp:127.0.0.1:7000", "job", 0, 1, &s, &err), GG_ERR_INVALID);
	CHECK_ERR(err, GG_ERR_INVALID, "a gateway is reached by its unix: control socket, on its own host");
	CHECK_EQ_INT(gg_session_open("unix:relative.sock", "job", 0, 1, &s, &err), GG_ERR_INVALID);
	CHECK_ERR(err, GG_ERR_INVALID, "must be absolute");
	snprintf(nowhere, sizeof(nowhere), "unix:%s/nobody.sock", h.dir);
	CHECK_EQ_INT(gg_session_open(nowhere, "job", 0, 1, &s, &err), GG_ERR_CONNECT);
	CHECK_ERR(err, GG_ERR_CONNECT, "no gateway listens on", "nobody.sock");
	CHECK(s == NULL);

	CHECK_OK(gg_session_open(h.endpoint, "args", 0, 1, &s, &err), err);
	CHECK_EQ_INT(gg_allreduce(s, x, 0, GG_DTYPE_F32, 1, 0, &err), GG_ERR_INVALID);
	CHECK_ERR(err, GG_ERR_INVALID, "step 1 (tensor 1), not sent: count is 0");
	CHECK_EQ_INT(gg_allreduce(s, NULL, 4, GG_DTYPE_F32, 1, 0, &err), GG_ERR_INVALID);
	CHECK_EQ_INT(gg_allreduce(s, x, 4, (enum gg_dtype)9, 1, 0, &err), GG_ERR_INVALID);
	CHECK_ERR(err, GG_ERR_INVALID, "unknown dtype 9");
	/* Larger than the gateway's max_message: refused here, nothing sent. */
	CHECK_EQ_INT(gg_allreduce(s, x, (1u << 28) + 1, GG_DTYPE_F32, 2, 0, &err), GG_ERR_TOO_LARGE);
	CHECK_ERR(err, GG_ERR_TOO_LARGE, "step 1 (tensor 2), not sent: 268435457 float32 elements exceed the max_message",
		  "site test-site");
	CHECK_EQ_INT(gg_allreduce_start(s, x, 4, GG_DTYPE_F32, 3, 0, NULL, &err), GG_ERR_INVALID);
	/* None of that used up a step or hurt the session. */
	CHECK_OK(gg_allreduce_start(s, x, 4, GG_DTYPE_F32, 3, 0, &r, &err), err);
	CHECK_OK(gg_wait(r, -1, &err), err);
	gg_request_free(r);
	CHECK(x[0] == 1 && x[3] == 4);
	gg_session_close(s);

	gg_request_free(NULL);
	gg_session_close(NULL);
	CHECK_EQ_INT(gg_wait(NULL, 0, NULL), GG_ERR_INVALID);
	CHECK(strcmp(gg_strerror(GG_ERR_RANK), "another rank of the job failed") == 0);
	CHECK(strcmp(gg_strerror(12345), "unknown error") == 0);
}

int main(void)
{
	harness_start(&h, NULL);
	test_arguments();
	test_endpoint_env();
	test_sums();
	test_shared_arguments();
	test_shared_sums();
	test_async();
	test_poll();
	harness_wait_connections(&h, 0);
	struct gg_host_backend_stats st = harness_stats(&h);
	CHECK_EQ_INT(st.steps_done, 2 + 3 * 4 + 3 + 3 * 4 + ASYNC_REQS + 1 + 1);
	CHECK_EQ_INT(st.steps_failed, 0);
	CHECK_EQ_INT(st.violations, 0);
	harness_stop(&h);
	printf("host allreduce: ok\n");
	return 0;
}
