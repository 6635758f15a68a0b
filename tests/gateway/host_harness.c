#include "host_harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "uring_loop.h"

#define MAX_HELD 64

struct loop_ctx {
	struct harness *h;
	struct gg_site_backend *base;
	struct gg_site_step *held[MAX_HELD];
	unsigned nheld;
	unsigned aborts_too_late; /* CORE_PROMISED: aborts answered -EALREADY, not yet acted on */
};

static void on_log(void *arg, bool fault, const char *line)
{
	struct harness *h = arg;
	unsigned held;

	if (getenv("GG_TEST_VERBOSE"))
		fprintf(stderr, "gateway: %s%s\n", fault ? "(fault) " : "", line);
	if (fault)
		atomic_fetch_add(&h->fault_lines, 1);
	if (!strncmp(line, "control connection", 18) && strstr(line, " refused: ")) {
		atomic_fetch_add(&h->refusal_lines, 1);
	} else if (!strncmp(line, "rank ", 5) && strstr(line, " of job '")) {
		atomic_fetch_add(&h->session_lines, 1);
	} else if (sscanf(line, "control connections: %u more", &held) == 1) {
		/* sscanf stops at the first word that differs, and says 1 all the same. */
		if (strstr(line, " more refused, not logged"))
			atomic_fetch_add(&h->refusals_unlogged, held);
		else if (strstr(line, " more ranks came or left, not logged"))
			atomic_fetch_add(&h->sessions_unlogged, held);
	}
}

/* What a core does with a step's memory: forms the site sum and hands the
 * result back a range at a time; here the result is the site sum. Ranges
 * of different sizes for the two, as a core's chunks may differ. */
static void core_sum(struct gg_site_step *st)
{
	for (uint64_t off = 0; off < st->count; off += 1000)
		st->gather(st, off, GG_MIN(st->count - off, (uint64_t)1000));
	for (uint64_t off = 0; off < st->count; off += 777)
		st->deliver(st, off, GG_MIN(st->count - off, (uint64_t)777));
}

static int core_submit(void *core, struct gg_site_step *step)
{
	struct loop_ctx *x = core;
	int mode = atomic_load(&x->h->core_mode);

	atomic_fetch_add(&x->h->steps_submitted, 1);
	/* NCCL steps come in device memory; the stand-in's is the host's. */
	CHECK(step->memory == GG_STEP_MEM_HOST || (x->h->opts.nccl && step->memory == GG_STEP_MEM_CUDA));
	uint64_t from = atomic_load(&x->h->failed_from);
	if (from && step->seq >= from) {
		gg_site_step_complete(step, GG_ERR_SITE, FAILED_ELSEWHERE_TEXT);
		return 0;
	}
	if (mode == CORE_REFUSE)
		return GG_ERR_LIMIT;
	if (mode == CORE_SUM && atomic_load(&x->h->core_sync)) {
		core_sum(step);
		gg_site_step_complete(step, 0, NULL);
		return 0;
	}
	CHECK(x->nheld < MAX_HELD);
	x->held[x->nheld++] = step;
	return 0;
}

static int core_abort(void *core, const char *job, uint64_t seq, int code, const char *message)
{
	struct loop_ctx *x = core;

	(void)job, (void)seq, (void)code, (void)message;
	atomic_fetch_add(&x->h->aborts_told, 1);
	if (atomic_load(&x->h->core_mode) != CORE_PROMISED)
		return 0;
	x->aborts_too_late++;
	return -EALREADY;
}

static int core_fail_unstarted(void *core, const char *job, uint64_t seq, char *message, size_t message_size)
{
	struct loop_ctx *x = core;
	uint64_t from = atomic_load(&x->h->failed_from);

	(void)job;
	if (!from || seq < from)
		return 0;
	snprintf(message, message_size, "%s", FAILED_ELSEWHERE_TEXT);
	return GG_ERR_SITE;
}

static void core_gpu_frees(void *core, bool allowed)
{
	struct loop_ctx *x = core;

	/* Told on each change only, and let free only once no call runs. */
	CHECK(atomic_exchange(&x->h->gpu_frees_held, !allowed) == allowed);
	if (allowed && x->h->opts.nccl_busy)
		CHECK(!x->h->opts.nccl_busy());
	if (!allowed)
		atomic_fetch_add(&x->h->gpu_holds, 1);
}

/* The fake core's own turn of the loop: completes what is due. */
static void core_tick(struct loop_ctx *x, uint64_t now_us, bool stopping)
{
	for (unsigned i = 0; i < x->nheld;) {
		struct gg_site_step *st = x->held[i];
		int mode = atomic_load(&x->h->core_mode);
		if ((mode == CORE_HOLD || (mode == CORE_PROMISED && !x->aborts_too_late)) && !stopping &&
		    now_us < st->deadline_us) {
			i++;
			continue;
		}
		x->held[i] = x->held[--x->nheld];
		if (stopping)
			gg_site_step_complete(st, GG_ERR_CLOSED, "the core is shutting down");
		else if (mode == CORE_SUM || (mode == CORE_PROMISED && x->aborts_too_late)) {
			if (mode == CORE_PROMISED)
				x->aborts_too_late--;
			core_sum(st);
			gg_site_step_complete(st, 0, NULL);
		}
		else if (mode == CORE_HOLD)
			gg_site_step_complete(st, GG_ERR_TIMEOUT, CORE_HOLD_TEXT);
		else
			gg_site_step_complete(st, GG_ERR_SITE, CORE_ERROR_TEXT);
	}
}

static void on_cqe(void *arg, const struct io_uring_cqe *cqe)
{
	struct loop_ctx *x = arg;

	CHECK(x->base->ops->on_cqe(x->base, cqe));
}

static void publish(struct harness *h, struct gg_host_backend *b, int state)
{
	pthread_mutex_lock(&h->lock);
	if (b)
		gg_host_backend_get_stats(b, &h->stats);
	if (state)
		h->state = state;
	pthread_cond_broadcast(&h->cond);
	pthread_mutex_unlock(&h->lock);
}

static void *gateway_thread(void *arg)
{
	struct harness *h = arg;
	struct loop_ctx x = { .h = h };
	static const struct gg_core_ops core_ops = { .submit = core_submit, .abort = core_abort,
						     .fail_unstarted = core_fail_unstarted,
						     .gpu_frees = core_gpu_frees };
	struct gg_host_backend_options o = {
		.control = h->endpoint,
		.site = "test-site",
		.max_clients = h->opts.max_clients,
		.max_message_bytes = h->opts.max_message_bytes,
		.memory_bytes = h->opts.memory_bytes,
		.step_timeout_us = h->opts.step_timeout_us,
		.hello_timeout_us = h->opts.hello_timeout_us,
		.session_idle_us = h->opts.session_idle_us,
		.user_shares = h->opts.user_shares,
		.max_jobs = h->opts.max_jobs,
		.kind_base = GG_OP_USER,
		.log = on_log,
		.log_arg = h,
		.nccl = h->opts.nccl,
	};
	struct gg_host_backend *b = NULL;
	struct gg_loop loop;
	int rc = gg_loop_init(&loop, 256);

	if (rc) {
		snprintf(h->start_err, sizeof(h->start_err), "gg_loop_init: %s", strerror(-rc));
	} else {
		rc = gg_host_backend_create(&o, &core_ops, &x, &b, h->start_err, sizeof(h->start_err));
		if (!rc) {
			x.base = gg_host_backend_base(b);
			rc = x.base->ops->start(x.base, &loop, h->start_err, sizeof(h->start_err));
			if (rc)
				x.base->ops->destroy(x.base);
		}
		if (rc)
			gg_loop_fini(&loop);
	}
	pthread_mutex_lock(&h->lock);
	h->start_rc = rc;
	h->state = 1;
	pthread_cond_broadcast(&h->cond);
	pthread_mutex_unlock(&h->lock);
	if (rc)
		return NULL;

	uint64_t next = 0;
	while (!atomic_load(&h->stop)) {
		uint64_t wait = GG_MIN(gg_loop_timeout_us(&loop, next), 10000u);
		CHECK(gg_loop_run(&loop, wait, on_cqe, &x) >= 0);
		core_tick(&x, loop.now_us, false);
		next = x.base->ops->tick(x.base, loop.now_us);
		for (unsigned i = 0; i < x.nheld; i++)
			next = next ? GG_MIN(next, x.held[i]->deadline_us) : x.held[i]->deadline_us;
		publish(h, b, 0);
	}
	/* The core goes first: it hands back every step it holds. */
	core_tick(&x, loop.now_us, true);
	while (!x.base->ops->stop(x.base)) {
		CHECK(gg_loop_run(&loop, 10000, on_cqe, &x) >= 0);
		x.base->ops->tick(x.base, loop.now_us);
	}
	gg_host_backend_get_stats(b, &h->final);
	x.base->ops->destroy(x.base);
	gg_loop_fini(&loop);
	publish(h, NULL, 2);
	return NULL;
}

unsigned count_open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	unsigned n = 0;

	CHECK(d);
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

void harness_start(struct harness *h, const struct harness_options *opts)
{
	memset(h, 0, sizeof(*h));
	h->fds_before = count_open_fds();
	if (opts)
		h->opts = *opts;
	if (!h->opts.max_clients)
		h->opts.max_clients = 16;
	if (!h->opts.max_message_bytes)
		h->opts.max_message_bytes = 1ull << 30;
	if (!h->opts.memory_bytes)
		h->opts.memory_bytes = 4ull << 30;
	if (!h->opts.step_timeout_us)
		h->opts.step_timeout_us = 20000000;
	if (!h->opts.hello_timeout_us)
		h->opts.hello_timeout_us = 5000000;
	snprintf(h->dir, sizeof(h->dir), "/tmp/gg-host-XXXXXX");
	CHECK(mkdtemp(h->dir));
	/* The socket's folder does not exist yet: the gateway makes it, as it
	 * makes /run/gradgate after a reboot. */
	snprintf(h->path, sizeof(h->path), "%s/run/control.sock", h->dir);
	snprintf(h->endpoint, sizeof(h->endpoint), "unix:%s", h->path);
	atomic_store(&h->core_mode, CORE_SUM);
	pthread_mutex_init(&h->lock, NULL);
	pthread_cond_init(&h->cond, NULL);
	CHECK(pthread_create(&h->thread, NULL, gateway_thread, h) == 0);
	pthread_mutex_lock(&h->lock);
	while (h->state == 0)
		pthread_cond_wait(&h->cond, &h->lock);
	pthread_mutex_unlock(&h->lock);
	if (h->start_rc) {
		fprintf(stderr, "gateway did not start: %s\n", h->start_err);
		exit(1);
	}
	char run[sizeof(h->dir) + 8];
	struct stat st;
	snprintf(run, sizeof(run), "%s/run", h->dir);
	CHECK(stat(run, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 07777) == 0755);
}

void harness_stop_begin(struct harness *h)
{
	atomic_store(&h->stop, true);
}

void harness_stop(struct harness *h)
{
	atomic_store(&h->stop, true);
	CHECK(pthread_join(h->thread, NULL) == 0);
	CHECK_EQ_INT(h->final.connections, 0);
	CHECK_EQ_INT(h->final.jobs, 0);
	CHECK_EQ_INT(h->final.regions, 0);
	CHECK_EQ_INT(h->final.sum_bytes, 0);
	CHECK_EQ_INT(h->final.spare_bytes, 0);
	CHECK(access(h->path, F_OK) != 0); /* the socket is gone */
	char run[sizeof(h->dir) + 8];
	snprintf(run, sizeof(run), "%s/run", h->dir);
	CHECK(rmdir(run) == 0);
	CHECK(rmdir(h->dir) == 0);
	CHECK_EQ_INT(count_open_fds(), h->fds_before);
	pthread_mutex_destroy(&h->lock);
	pthread_cond_destroy(&h->cond);
}

struct gg_host_backend_stats harness_stats(struct harness *h)
{
	struct gg_host_backend_stats s;

	pthread_mutex_lock(&h->lock);
	s = h->stats;
	pthread_mutex_unlock(&h->lock);
	return s;
}

void harness_wait_connections(struct harness *h, unsigned n)
{
	for (int i = 0; i < 500; i++) {
		if (harness_stats(h).connections == n)
			return;
		usleep(10000);
	}
	fprintf(stderr, "gateway has %u connections, expected %u\n", harness_stats(h).connections, n);
	exit(1);
}

/* ---- raw clients -------------------------------------------------------- */

int raw_connect(const struct harness *h)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	CHECK(fd >= 0);
	memcpy(addr.sun_path, h->path, strlen(h->path) + 1);
	CHECK(connect(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0);
	return fd;
}

void raw_send(int fd, const void *msg, size_t len, int pass_fd)
{
	_Alignas(struct cmsghdr) char cbuf[GG_CTRL_CMSG_BYTES];
	struct iovec iov = { .iov_base = (void *)msg, .iov_len = len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

	if (pass_fd >= 0)
		gg_ctrl_attach_fd(&mh, cbuf, pass_fd);
	CHECK_EQ_INT(sendmsg(fd, &mh, MSG_NOSIGNAL), (ssize_t)len);
}

size_t raw_recv(int fd, union gg_ctrl_msg *m)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	CHECK(poll(&p, 1, 5000) == 1);
	ssize_t n = recv(fd, m, sizeof(*m), 0);
	if (n < 0 && errno == ECONNRESET) /* reported before what is still queued */
		n = recv(fd, m, sizeof(*m), 0);
	CHECK(n >= 0);
	return (size_t)n;
}

void raw_hello(int fd, const char *job, unsigned rank, unsigned nranks)
{
	union gg_ctrl_msg m;
	char why[160];
	size_t len = gg_ctrl_init(&m, GG_CTRL_HELLO);

	m.hello.version = GG_CTRL_VERSION;
	m.hello.rank = rank;
	m.hello.nranks = nranks;
	gg_ctrl_set_text(m.hello.job, sizeof(m.hello.job), job);
	raw_send(fd, &m, len, -1);
	len = raw_recv(fd, &m);
	CHECK_EQ_INT(gg_ctrl_check(&m, len, why, sizeof(why)), GG_CTRL_ACCEPT);
}

void raw_expect_close(int fd, enum gg_ctrl_type type, int code, const char *text)
{
	union gg_ctrl_msg m;
	char why[160];
	size_t len = raw_recv(fd, &m);

	CHECK_EQ_INT(gg_ctrl_check(&m, len, why, sizeof(why)), type);
	CHECK_EQ_INT(m.error.code, code);
	CHECK_CONTAINS(m.error.message, text);
	CHECK_EQ_INT(raw_recv(fd, &m), 0);
	close(fd);
}

int raw_memfd(uint64_t size, bool seal)
{
	int fd = memfd_create("gg-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	CHECK(fd >= 0);
	CHECK(ftruncate(fd, (off_t)size) == 0);
	if (seal)
		CHECK(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0);
	return fd;
}

void raw_map(int fd, unsigned id, uint64_t size, int memfd)
{
	union gg_ctrl_msg m;
	size_t len = gg_ctrl_init(&m, GG_CTRL_MAP);

	m.map.region = id;
	m.map.size_bytes = size;
	raw_send(fd, &m, len, memfd);
}

void raw_allreduce(int fd, uint64_t seq, uint32_t tensor, uint32_t dtype, uint64_t count, unsigned region,
		   uint64_t offset)
{
	union gg_ctrl_msg m;
	size_t len = gg_ctrl_init(&m, GG_CTRL_ALLREDUCE);

	m.allreduce.seq = seq;
	m.allreduce.tensor_id = tensor;
	m.allreduce.dtype = dtype;
	m.allreduce.count = count;
	m.allreduce.region = region;
	m.allreduce.offset = offset;
	raw_send(fd, &m, len, -1);
}

/* ---- data --------------------------------------------------------------- */

static uint32_t mix(uint32_t x)
{
	x ^= x >> 16;
	x *= 0x7feb352du;
	x ^= x >> 15;
	x *= 0x846ca68bu;
	x ^= x >> 16;
	return x;
}

static float bits_f32(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
}

static uint32_t f32_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof(u));
	return u;
}

/* Magnitudes from 2^-20 to 2^20 so that the order of the additions shows
 * in the low bits; every 4099th element -0, every 8191st +inf at rank 0
 * and -inf at rank 1 (NaN once summed), every 12289th a quiet NaN at rank 2. */
static float input_value(size_t i, uint32_t seed, unsigned rank)
{
	uint32_t r = mix((uint32_t)i * 2654435761u ^ mix(seed * 31u + rank));

	if (i % 4099 == 17)
		return -0.0f;
	if (i % 8191 == 5 && rank < 2)
		return rank == 0 ? bits_f32(0x7f800000u) : bits_f32(0xff800000u);
	if (i % 12289 == 7 && rank == 2)
		return bits_f32(0x7fc00000u);
	uint32_t exp = 127 - 20 + (r >> 24) % 41;
	return bits_f32((r & 0x80000000u) | exp << 23 | (mix(r) & 0x7fffffu));
}

void fill_input_f32(float *x, size_t n, uint32_t seed, unsigned rank)
{
	for (size_t i = 0; i < n; i++)
		x[i] = input_value(i, seed, rank);
}

static uint16_t to_bf16(float f)
{
	uint32_t u = f32_bits(f);

	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)(u >> 16 | 0x40u);
	uint32_t lsb = (u >> 16) & 1u;
	return (uint16_t)((u + 0x7fffu + lsb) >> 16);
}

void fill_input_bf16(uint16_t *x, size_t n, uint32_t seed, unsigned rank)
{
	for (size_t i = 0; i < n; i++)
		x[i] = to_bf16(input_value(i, seed, rank));
}

void reference_f32(float *out, float *const *in, unsigned nranks, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		float acc = in[0][i];
		for (unsigned r = 1; r < nranks; r++)
			acc = acc + in[r][i];
		out[i] = acc;
	}
}

void reference_bf16(uint16_t *out, uint16_t *const *in, unsigned nranks, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		float acc = bits_f32((uint32_t)in[0][i] << 16);
		for (unsigned r = 1; r < nranks; r++)
			acc = acc + bits_f32((uint32_t)in[r][i] << 16);
		out[i] = to_bf16(acc);
	}
}

void check_same_bytes(const void *got, const void *want, size_t n, size_t esize, const char *what)
{
	if (!memcmp(got, want, n * esize))
		return;
	for (size_t i = 0; i < n; i++) {
		const unsigned char *g = (const unsigned char *)got + i * esize;
		const unsigned char *w = (const unsigned char *)want + i * esize;
		if (memcmp(g, w, esize)) {
			uint32_t gv = 0, wv = 0;
			memcpy(&gv, g, esize);
			memcpy(&wv, w, esize);
			fprintf(stderr, "%s: element %zu of %zu is 0x%0*x, expected 0x%0*x\n", what, i, n,
				(int)esize * 2, gv, (int)esize * 2, wv);
			exit(1);
		}
	}
}

/* ---- ranks -------------------------------------------------------------- */

struct rank_thread {
	pthread_t t;
	unsigned rank;
	void (*fn)(unsigned rank, void *arg);
	void *arg;
};

static void *rank_main(void *p)
{
	struct rank_thread *rt = p;

	rt->fn(rt->rank, rt->arg);
	return NULL;
}

void run_ranks(unsigned n, void (*fn)(unsigned rank, void *arg), void *arg)
{
	struct rank_thread *t = calloc(n, sizeof(*t));

	CHECK(t);
	for (unsigned r = 0; r < n; r++) {
		t[r] = (struct rank_thread){ .rank = r, .fn = fn, .arg = arg };
		CHECK(pthread_create(&t[r].t, NULL, rank_main, &t[r]) == 0);
	}
	for (unsigned r = 0; r < n; r++)
		CHECK(pthread_join(t[r].t, NULL) == 0);
	free(t);
}
