/* The gateway treats every control message as hostile: what it must refuse
 * before a session exists, what ends a session, and that a rank breaking
 * the protocol fails the step of the job's other ranks with its name. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "control_conn.h"
#include "gg_build_config.h"
#include "host_harness.h"

#define MAX_CLIENTS 4

extern char **environ;

static struct harness h;

static void open_ok(const char *job, int rank, int nranks, struct gg_session **s)
{
	struct gg_error err;

	if (gg_session_open(h.endpoint, job, rank, nranks, s, &err)) {
		fprintf(stderr, "gg_session_open(%s, %d of %d): %s\n", job, rank, nranks, err.message);
		exit(1);
	}
}

static void hello_msg(union gg_ctrl_msg *m, const char *job, unsigned rank, unsigned nranks)
{
	gg_ctrl_init(m, GG_CTRL_HELLO);
	m->hello.version = GG_CTRL_VERSION;
	m->hello.rank = rank;
	m->hello.nranks = nranks;
	gg_ctrl_set_text(m->hello.job, sizeof(m->hello.job), job);
}

/* Sends `len` bytes of `msg` as the first packet; expects REFUSE. */
static void refused(const void *msg, size_t len, int pass_fd, int code, const char *text)
{
	int fd = raw_connect(&h);

	raw_send(fd, msg, len, pass_fd);
	raw_expect_close(fd, GG_CTRL_REFUSE, code, text);
}

/* A local user may connect at will: the log gets at most 10 refusal lines
 * a second, and says how many it left out once the second is over, so
 * that every refusal is accounted for. */
static void test_refusal_flood(void)
{
	union gg_ctrl_msg m;
	enum { FLOOD = 40 };

	hello_msg(&m, "bad/job", 0, 1);
	usleep(1100000); /* a second of its own: what earlier tests held back is told by then */
	refused(&m, sizeof(m.hello), -1, GG_ERR_REFUSED, "job name has character 0x2f at 3");
	unsigned lines0 = atomic_load(&h.refusal_lines), unlogged0 = atomic_load(&h.refusals_unlogged);
	uint64_t t0 = gg_ctrl_now_ms();
	for (int i = 0; i < FLOOD; i++)
		refused(&m, sizeof(m.hello), -1, GG_ERR_REFUSED, "job name has character 0x2f at 3");
	uint64_t flood_ms = gg_ctrl_now_ms() - t0;
	unsigned lines = atomic_load(&h.refusal_lines) - lines0;
	CHECK(lines <= 10 * (flood_ms / 1000 + 2));
	/* With no refusal after it, the count comes once its second is over. */
	unsigned unlogged = 0;
	for (int i = 0; i < 300 && lines + unlogged < FLOOD; i++) {
		usleep(10000);
		lines = atomic_load(&h.refusal_lines) - lines0;
		unlogged = atomic_load(&h.refusals_unlogged) - unlogged0;
	}
	CHECK_EQ_INT(lines + unlogged, FLOOD);
	/* A client's refusal is news, not a fault of the gateway's own. */
	CHECK_EQ_INT(atomic_load(&h.fault_lines), 0);
	printf("%d refused connections in %llu ms: %u lines logged, and %u counted as left out\n", FLOOD,
	       (unsigned long long)flood_ms, lines, unlogged);
}

/* Sessions opened and closed in a loop, as any local user may: of the
 * lines that a rank came or left, the log gets 2 x max_clients + 16 a
 * second, and then says how many it left out. */
static void test_session_flood(void)
{
	enum { FLOOD = 150, LIMIT = 2 * MAX_CLIENTS + 16 };
	struct gg_session *s;

	usleep(1100000); /* the second of earlier tests' lines is over */
	unsigned lines0 = atomic_load(&h.session_lines), unlogged0 = atomic_load(&h.sessions_unlogged);
	uint64_t t0 = gg_ctrl_now_ms();
	for (int i = 0; i < FLOOD; i++) {
		open_ok("churn", 0, 1, &s);
		gg_session_close(s);
	}
	uint64_t flood_ms = gg_ctrl_now_ms() - t0;
	unsigned lines = atomic_load(&h.session_lines) - lines0, unlogged = 0;
	CHECK(lines <= LIMIT * (flood_ms / 1000 + 2));
	/* Each session: its rank connected, then left before its first step. */
	for (int i = 0; i < 300 && lines + unlogged < 2 * FLOOD; i++) {
		usleep(10000);
		lines = atomic_load(&h.session_lines) - lines0;
		unlogged = atomic_load(&h.sessions_unlogged) - unlogged0;
	}
	CHECK_EQ_INT(lines + unlogged, 2 * FLOOD);
	printf("%d sessions opened and closed in %llu ms: %u lines logged, and %u counted as left out\n", FLOOD,
	       (unsigned long long)flood_ms, lines, unlogged);
}

static void test_hello_refusals(void)
{
	union gg_ctrl_msg m;
	unsigned char big[1000];

	refused("hello world, some garbage bytes", 31, -1, GG_ERR_PROTOCOL,
		"not a gradgate control message (magic 0x6c6c6568)");
	refused("\x47\x47\x43\x31\x01\0\0\0", 8, -1, GG_ERR_PROTOCOL, "truncated message: 8 bytes, shorter than a header");
	refused("", 0, -1, GG_ERR_PROTOCOL, "truncated message: 0 bytes, shorter than a header");

	hello_msg(&m, "job", 0, 1);
	refused(&m, 50, -1, GG_ERR_PROTOCOL, "truncated HELLO: 50 of 96 bytes");
	m.hdr.length = 50;
	refused(&m, 50, -1, GG_ERR_PROTOCOL, "truncated HELLO: 50 of 96 bytes");
	hello_msg(&m, "job", 0, 1);
	m.hdr.length = UINT32_MAX;
	refused(&m, sizeof(m.hello), -1, GG_ERR_PROTOCOL,
		"HELLO header says 4294967295 bytes, more than any message (512 at most); the packet has 96");

	memset(big, 0, sizeof(big));
	hello_msg(&m, "job", 0, 1);
	memcpy(big, &m, sizeof(m.hello));
	refused(big, sizeof(big), -1, GG_ERR_PROTOCOL, "HELLO message of 1000 bytes; it has 96");

	hello_msg(&m, "job", 0, 1);
	m.hello.version = 1;
	refused(&m, sizeof(m.hello), -1, GG_ERR_REFUSED,
		"protocol version 1 is not supported: the gateway of site test-site speaks version 2");

	hello_msg(&m, "job", 5, 3);
	refused(&m, sizeof(m.hello), -1, GG_ERR_REFUSED, "rank 5 of job 'job' is out of range for nranks 3");
	hello_msg(&m, "job", 0, 0);
	refused(&m, sizeof(m.hello), -1, GG_ERR_REFUSED, "nranks 0 of job 'job' is outside 1..4");
	hello_msg(&m, "job", 0, MAX_CLIENTS + 1);
	refused(&m, sizeof(m.hello), -1, GG_ERR_REFUSED, "nranks 5 of job 'job' is outside 1..4");

	hello_msg(&m, "bad/job", 0, 1);
	refused(&m, sizeof(m.hello), -1, GG_ERR_REFUSED, "job name has character 0x2f at 3");
	hello_msg(&m, "job", 0, 1);
	memset(m.hello.job, 'j', sizeof(m.hello.job));
	refused(&m, sizeof(m.hello), -1, GG_ERR_PROTOCOL, "HELLO: job is not terminated within its 64 bytes");
	hello_msg(&m, "job", 0, 1);
	m.hello.job[1] = '\n';
	refused(&m, sizeof(m.hello), -1, GG_ERR_PROTOCOL, "HELLO: job has control character 0x0a at 1");
	hello_msg(&m, "job", 0, 1);
	m.hello.job[10] = 'x';
	refused(&m, sizeof(m.hello), -1, GG_ERR_PROTOCOL, "HELLO: job has a nonzero byte at 10, after its end at 3");
	hello_msg(&m, "job", 0, 1);
	m.hello.reserved = 2;
	refused(&m, sizeof(m.hello), -1, GG_ERR_PROTOCOL, "HELLO: reserved field is 2, must be 0");
	hello_msg(&m, "job", 0, 1);
	m.hdr.reserved = 1;
	refused(&m, sizeof(m.hello), -1, GG_ERR_PROTOCOL, "HELLO: header reserved field is 1, must be 0");
	hello_msg(&m, "job", 0, 1);
	m.hdr.flags = 4;
	refused(&m, sizeof(m.hello), -1, GG_ERR_PROTOCOL, "HELLO: header flags field is 4, must be 0");

	gg_ctrl_init(&m, GG_CTRL_ALLREDUCE);
	refused(&m, sizeof(m.allreduce), -1, GG_ERR_PROTOCOL, "expected HELLO or STATUS, got ALLREDUCE");
	m.hdr.type = 77;
	refused(&m, sizeof(m.allreduce), -1, GG_ERR_PROTOCOL, "unknown message type 77");

	int memfd = raw_memfd(4096, true);
	hello_msg(&m, "job", 0, 1);
	refused(&m, sizeof(m.hello), memfd, GG_ERR_PROTOCOL, "HELLO must not carry file descriptors");

	/* A status request: checked like a HELLO; this harness has no status
	 * to give (the daemon's is tested with gateways in integration). */
	gg_ctrl_init(&m, GG_CTRL_STATUS);
	m.status.version = GG_CTRL_STATUS_VERSION;
	refused(&m, sizeof(m.status), -1, GG_ERR_REFUSED, "the gateway of site test-site does not answer status requests");
	refused(&m, sizeof(m.status), memfd, GG_ERR_PROTOCOL, "STATUS must not carry file descriptors");
	refused(&m, 20, -1, GG_ERR_PROTOCOL, "truncated STATUS: 20 of 24 bytes");
	m.status.reserved = 1;
	refused(&m, sizeof(m.status), -1, GG_ERR_PROTOCOL, "STATUS: reserved field is 1, must be 0");
	m.status.reserved = 0;
	m.status.version = 2;
	refused(&m, sizeof(m.status), -1, GG_ERR_REFUSED,
		"status version 2 is not supported: the gateway of site test-site speaks version 1");
	gg_ctrl_init(&m, GG_CTRL_STATUS_SITE);
	refused(&m, sizeof(m.status_site), -1, GG_ERR_PROTOCOL, "expected HELLO or STATUS, got STATUS_SITE");
	close(memfd);

	/* Silence is refused too, once the HELLO deadline passes. */
	int fd = raw_connect(&h);
	raw_expect_close(fd, GG_CTRL_REFUSE, GG_ERR_TIMEOUT, "no HELLO within 300 ms");
	harness_wait_connections(&h, 0);
}

static void test_job_refusals(void)
{
	struct gg_session *a, *b, *c[MAX_CLIENTS], *s;
	struct gg_error err;

	open_ok("dup", 0, 2, &a);
	CHECK_EQ_INT(gg_session_open(h.endpoint, "dup", 0, 2, &b, &err), GG_ERR_REFUSED);
	CHECK_ERR(err, GG_ERR_REFUSED, "rank 0 of job 'dup' is already connected");
	CHECK(b == NULL);
	CHECK_EQ_INT(gg_session_open(h.endpoint, "dup", 1, 3, &b, &err), GG_ERR_REFUSED);
	CHECK_ERR(err, GG_ERR_REFUSED, "rank 1 of job 'dup' says nranks 3, but rank 0 said nranks 2");
	open_ok("dup", 1, 2, &b);
	float x = 1;
	CHECK_EQ_INT(gg_allreduce(a, &x, 1, GG_DTYPE_F32, 0, 50, &err), GG_ERR_TIMEOUT);
	gg_session_close(a);
	gg_session_close(b);
	harness_wait_connections(&h, 0);

	/* max_clients connections, and one more. */
	for (int r = 0; r < MAX_CLIENTS; r++)
		open_ok("full", r, MAX_CLIENTS, &c[r]);
	CHECK_EQ_INT(gg_session_open(h.endpoint, "other", 0, 1, &s, &err), GG_ERR_REFUSED);
	CHECK_ERR(err, GG_ERR_REFUSED, "the gateway of site test-site already serves max_clients = 4 connections");
	CHECK(harness_stats(&h).refused > 0);
	/* A refusal that left the HELLO unread reads it before it closes: the
	 * REFUSE comes first, not a reset of the connection. Connections
	 * made and HELLOs sent all at once, mostly before the gateway accepts
	 * them. */
	int burst[8];
	for (int i = 0; i < 8; i++) {
		union gg_ctrl_msg m;
		size_t len = gg_ctrl_init(&m, GG_CTRL_HELLO);
		burst[i] = raw_connect(&h);
		m.hello.version = GG_CTRL_VERSION;
		m.hello.nranks = 1;
		gg_ctrl_set_text(m.hello.job, sizeof(m.hello.job), "other");
		/* Refused and closed already (EPIPE): then nothing was unread. */
		if (send(burst[i], &m, len, MSG_NOSIGNAL) != (ssize_t)len)
			CHECK(errno == EPIPE || errno == ECONNRESET);
	}
	for (int i = 0; i < 8; i++) {
		struct pollfd p = { .fd = burst[i], .events = POLLIN };
		union gg_ctrl_msg m;
		char why[160];
		CHECK(poll(&p, 1, 5000) == 1);
		ssize_t n = recv(burst[i], &m, sizeof(m), 0);
		if (n < 0)
			fprintf(stderr, "refused connection %d: %s before the REFUSE\n", i, strerror(errno));
		CHECK(n > 0);
		CHECK_EQ_INT(gg_ctrl_check(&m, (size_t)n, why, sizeof(why)), GG_CTRL_REFUSE);
		close(burst[i]);
	}
	gg_session_close(c[0]);
	harness_wait_connections(&h, MAX_CLIENTS - 1);
	/* The job lost a rank: its others learn it at their next step. */
	CHECK_EQ_INT(gg_allreduce(c[1], &x, 1, GG_DTYPE_F32, 0, 0, &err), GG_ERR_RANK);
	CHECK_ERR(err, GG_ERR_RANK, "step 1 (tensor 0): rank 0 of job 'full' disconnected before its first step");
	CHECK_EQ_INT(gg_session_open(h.endpoint, "full", 0, MAX_CLIENTS, &a, &err), GG_ERR_REFUSED);
	CHECK_ERR(err, GG_ERR_REFUSED, "job 'full' has failed (rank 0 of job 'full' disconnected",
		  "once all its ranks have disconnected");
	open_ok("other", 0, 1, &s);
	gg_session_close(s);
	for (int r = 1; r < MAX_CLIENTS; r++)
		gg_session_close(c[r]);
	harness_wait_connections(&h, 0);
}

/* gg_session_close() returns once the gateway is done with the session:
 * the rank may open again at once and, when it was its job's last, a new
 * run of the name may start, even while the core still held a step of the
 * old one; and answers that arrived before the close complete their
 * requests. */
static void test_close_reopen(void)
{
	struct gg_session *s;
	struct gg_request *req;
	struct gg_error err;
	float x[4] = { 1, 2, 3, 4 };

	for (int i = 0; i < 20; i++) {
		open_ok("again", 0, 1, &s);
		gg_session_close(s);
	}

	/* The core holds the step until its 300 ms deadline. */
	atomic_store(&h.core_mode, CORE_HOLD);
	unsigned submitted = atomic_load(&h.steps_submitted);
	open_ok("held", 0, 1, &s);
	CHECK_EQ_INT(gg_allreduce_start(s, x, 4, GG_DTYPE_F32, 0, 300, &req, &err), 0);
	for (int i = 0; i < 500 && atomic_load(&h.steps_submitted) == submitted; i++)
		usleep(10000);
	CHECK(atomic_load(&h.steps_submitted) > submitted);
	gg_session_close(s);
	CHECK_EQ_INT(gg_wait(req, 0, &err), GG_ERR_CLOSED);
	gg_request_free(req);
	open_ok("held", 0, 1, &s);
	gg_session_close(s);
	atomic_store(&h.core_mode, CORE_SUM);

	/* The DONE is in the socket when the session closes. */
	uint64_t done = harness_stats(&h).steps_done;
	open_ok("late", 0, 1, &s);
	CHECK_EQ_INT(gg_allreduce_start(s, x, 4, GG_DTYPE_F32, 0, 0, &req, &err), 0);
	memset(x, 0, sizeof(x)); /* the input was copied at the start; the result comes back into x */
	for (int i = 0; i < 500 && harness_stats(&h).steps_done == done; i++)
		usleep(10000);
	usleep(50000);
	gg_session_close(s);
	CHECK_EQ_INT(gg_wait(req, 0, &err), 0);
	CHECK(x[0] == 1 && x[1] == 2 && x[2] == 3 && x[3] == 4);
	gg_request_free(req);
	harness_wait_connections(&h, 0);
}

/* The child: rank 1 of job 'uid' as user nobody; exits 0 when refused
 * as it should be. busy: rank 0 waits in step 1, which the refusal names
 * rather than when the ranks last sent something. */
static int other_user_main(const char *endpoint, bool busy)
{
	struct gg_session *s;
	struct gg_error err;

	if (setgid(65534) || setuid(65534))
		return 2;
	if (gg_session_open(endpoint, "uid", 1, 2, &s, &err) != GG_ERR_REFUSED ||
	    !strstr(err.message, busy ? "job 'uid' belongs to uid 0, which has step 1 under way (a job idle"
				      : "job 'uid' belongs to uid 0, whose ranks sent something ") ||
	    !strstr(err.message, " (a job idle for session_idle = 1m gives its name up); rank 1 connects as uid 65534")) {
		fprintf(stderr, "other user: %s\n", err.message);
		return 1;
	}
	if (busy)
		return 0;
	/* The status names every job and its user: root's and the gateway's. */
	struct sockaddr_un addr;
	union gg_ctrl_msg m;
	char why[160];
	uint64_t deadline = gg_ctrl_now_ms() + 5000;
	int fd = gg_ctrl_parse_endpoint(endpoint, &addr, &err) ? -1 : gg_ctrl_connect(&addr, deadline, &err);
	size_t len = gg_ctrl_init(&m, GG_CTRL_STATUS);
	m.status.version = GG_CTRL_STATUS_VERSION;
	ssize_t n = fd >= 0 && !gg_ctrl_send(fd, &m, len, -1, deadline) ? gg_ctrl_recv(fd, &m, deadline) : -1;
	if (n <= 0 || gg_ctrl_check(&m, (size_t)n, why, sizeof(why)) != GG_CTRL_REFUSE ||
	    !strstr(m.error.message, "the status of site test-site is for root and the gateway's user (uid 0); "
				     "uid 65534 asked")) {
		fprintf(stderr, "other user's status: %s\n", n > 0 ? m.error.message : err.message);
		return 1;
	}
	close(fd);
	return 0;
}

/* A job's ranks all run as the user that started it. */
static void test_other_user(void)
{
	char *argv[] = { "test_host_protocol", "--other-user", h.endpoint, NULL };
	char *busy_argv[] = { "test_host_protocol", "--other-user-busy", h.endpoint, NULL };
	struct gg_session *s;
	struct gg_request *req;
	struct gg_error err;
	float x = 1;
	pid_t pid;
	int status;

	if (getuid() != 0) {
		printf("other-user check skipped: needs root to become another user\n");
		return;
	}
	open_ok("uid", 0, 2, &s);
	CHECK(chmod(h.dir, 0711) == 0); /* the socket itself lets every user in */
	CHECK(posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, environ) == 0);
	CHECK(waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	CHECK_EQ_INT(gg_allreduce_start(s, &x, 1, GG_DTYPE_F32, 0, 10000, &req, &err), 0);
	CHECK(posix_spawn(&pid, "/proc/self/exe", NULL, NULL, busy_argv, environ) == 0);
	CHECK(waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	gg_request_free(req);
	gg_session_close(s);
	harness_wait_connections(&h, 0);
}

/* ---- idle jobs ------------------------------------------------------------ */

#define IDLE_US 500000 /* session_idle of the second harness */

static void sleep_us(uint64_t us)
{
	struct timespec ts = { .tv_sec = (time_t)(us / 1000000), .tv_nsec = (long)(us % 1000000) * 1000 };
	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

/* With every slot taken, a new connection is refused while the jobs are
 * busy or fresh, and takes the slots of the job idle past session_idle;
 * that job's ranks hear why at their next call. */
static void test_idle_slots(void)
{
	struct gg_session *a, *b, *s;
	struct gg_request *req;
	struct gg_error err;
	float x = 3, y = 4;

	open_ok("idle", 0, 2, &a);
	open_ok("idle", 1, 2, &b);
	CHECK_EQ_INT(gg_session_open(h.endpoint, "new", 0, 1, &s, &err), GG_ERR_REFUSED);
	CHECK_ERR(err, GG_ERR_REFUSED, "the gateway of site test-site already serves max_clients = 2 connections; "
		  "the job idle longest has been for ", "a job gives its sessions up after session_idle = 500ms");

	/* A step under way is not idle, however long it waits. */
	CHECK_EQ_INT(gg_allreduce_start(a, &x, 1, GG_DTYPE_F32, 0, 10000, &req, &err), 0);
	sleep_us(2 * IDLE_US);
	CHECK_EQ_INT(gg_session_open(h.endpoint, "new", 0, 1, &s, &err), GG_ERR_REFUSED);
	CHECK_ERR(err, GG_ERR_REFUSED, "already serves max_clients = 2 connections; every job has a step under way");
	CHECK_EQ_INT(gg_allreduce(b, &y, 1, GG_DTYPE_F32, 0, 10000, &err), 0);
	CHECK_EQ_INT(gg_wait(req, 10000, &err), 0);
	gg_request_free(req);
	CHECK(x == 7 && y == 7);

	/* Idle past session_idle: a status request, which takes no session,
	 * still finds a slot, and the idle job keeps its sessions; two at
	 * once do too, and a HELLO that comes the same way is held to
	 * max_clients. This harness gives no status: its refusal, not the
	 * max_clients one, says the request was read. */
	sleep_us(2 * IDLE_US);
	union gg_ctrl_msg m;
	gg_ctrl_init(&m, GG_CTRL_STATUS);
	m.status.version = GG_CTRL_STATUS_VERSION;
	int st1 = raw_connect(&h), st2 = raw_connect(&h);
	raw_send(st1, &m, sizeof(m.status), -1);
	raw_send(st2, &m, sizeof(m.status), -1);
	raw_expect_close(st1, GG_CTRL_REFUSE, GG_ERR_REFUSED, "the gateway of site test-site does not answer status");
	raw_expect_close(st2, GG_CTRL_REFUSE, GG_ERR_REFUSED, "the gateway of site test-site does not answer status");
	CHECK(harness_stats(&h).evicted == 0);
	CHECK_EQ_INT(gg_allreduce_start(a, &x, 1, GG_DTYPE_F32, 0, 10000, &req, &err), 0);
	CHECK_EQ_INT(gg_allreduce(b, &y, 1, GG_DTYPE_F32, 0, 10000, &err), 0);
	CHECK_EQ_INT(gg_wait(req, 10000, &err), 0);
	gg_request_free(req);
	CHECK(x == 14 && y == 14);

	/* Idle again: the new connection takes the idle job's slots. */
	sleep_us(2 * IDLE_US);
	open_ok("new", 0, 1, &s);
	CHECK(harness_stats(&h).evicted == 2);
	float z = 5;
	CHECK_EQ_INT(gg_allreduce(s, &z, 1, GG_DTYPE_F32, 0, 10000, &err), 0);
	CHECK(z == 5);
	CHECK_EQ_INT(gg_allreduce(a, &x, 1, GG_DTYPE_F32, 0, 10000, &err), GG_ERR_CLOSED);
	CHECK_ERR(err, GG_ERR_CLOSED, "gateway of site test-site: job 'idle' sent nothing for ",
		  "(session_idle = 500ms), and a new connection needs a slot (max_clients are taken): its sessions are "
		  "closed");
	CHECK_EQ_INT(gg_allreduce(b, &y, 1, GG_DTYPE_F32, 0, 10000, &err), GG_ERR_CLOSED);
	CHECK_ERR(err, GG_ERR_CLOSED, "job 'idle' sent nothing for ");
	gg_session_close(a);
	gg_session_close(b);
	gg_session_close(s);
	harness_wait_connections(&h, 0);
}

/* Connections that say nothing hold every slot, within max_clients and
 * the spare ones: a rank's HELLO, and then a status request, each take
 * the place of the one silent longest at once, rather than being refused
 * or waiting for the HELLO timeout. */
static void test_silent_slots(void)
{
	struct gg_session *a, *b;
	struct gg_request *req;
	struct gg_error err;
	union gg_ctrl_msg m;
	uint64_t evicted = harness_stats(&h).evicted, refused = harness_stats(&h).refused;
	float x = 1, y = 2;
	int silent[4];

	/* Two ranks connect and say HELLO, and three silent connections come
	 * right behind them, before the gateway reads the HELLOs: the ranks
	 * are not taken for silent ones. */
	for (int round = 0; round < 20; round++) {
		int r[2], quiet[3];
		union gg_ctrl_msg hm;
		size_t len = gg_ctrl_init(&hm, GG_CTRL_HELLO);
		hm.hello.version = GG_CTRL_VERSION;
		hm.hello.nranks = 2;
		gg_ctrl_set_text(hm.hello.job, sizeof(hm.hello.job), "race");
		for (int k = 0; k < 2; k++) {
			r[k] = raw_connect(&h);
			hm.hello.rank = (uint32_t)k;
			raw_send(r[k], &hm, len, -1);
		}
		for (int k = 0; k < 3; k++)
			quiet[k] = raw_connect(&h);
		for (int k = 0; k < 2; k++) {
			char why[160];
			size_t n = raw_recv(r[k], &hm);
			CHECK_EQ_INT(gg_ctrl_check(&hm, n, why, sizeof(why)), GG_CTRL_ACCEPT);
			if (hm.hdr.type != GG_CTRL_ACCEPT)
				fprintf(stderr, "round %d, rank %d: %s\n", round, k, hm.error.message);
		}
		for (int k = 0; k < 3; k++)
			close(quiet[k]);
		close(r[0]);
		close(r[1]);
		harness_wait_connections(&h, 0);
	}

	for (int i = 0; i < 4; i++) {
		silent[i] = raw_connect(&h);
		sleep_us(20000); /* the gateway takes them in this order */
	}
	open_ok("busy", 0, 2, &a);
	raw_expect_close(silent[0], GG_CTRL_REFUSE, GG_ERR_REFUSED,
			 "while a new connection needed its slot (max_clients = 2 are taken)");
	open_ok("busy", 1, 2, &b);
	raw_expect_close(silent[1], GG_CTRL_REFUSE, GG_ERR_REFUSED, "sent nothing for ");

	/* Both places are a job's, which has a step under way: a status
	 * request takes the spare slot of the one silent longest. */
	CHECK_EQ_INT(gg_allreduce_start(a, &x, 1, GG_DTYPE_F32, 0, 10000, &req, &err), 0);
	gg_ctrl_init(&m, GG_CTRL_STATUS);
	m.status.version = GG_CTRL_STATUS_VERSION;
	int st = raw_connect(&h);
	raw_send(st, &m, sizeof(m.status), -1);
	raw_expect_close(st, GG_CTRL_REFUSE, GG_ERR_REFUSED, "the gateway of site test-site does not answer status");
	raw_expect_close(silent[2], GG_CTRL_REFUSE, GG_ERR_REFUSED, "sent nothing for ");
	/* Three refused (and the status request), not counted as idle jobs'
	 * sessions given up. */
	CHECK(harness_stats(&h).refused == refused + 4);
	CHECK(harness_stats(&h).evicted == evicted);

	CHECK_EQ_INT(gg_allreduce(b, &y, 1, GG_DTYPE_F32, 0, 10000, &err), 0);
	CHECK_EQ_INT(gg_wait(req, 10000, &err), 0);
	gg_request_free(req);
	CHECK(x == 3 && y == 3);
	close(silent[3]);
	gg_session_close(a);
	gg_session_close(b);
	harness_wait_connections(&h, 0);
}

/* A rank's HELLO gets in behind silent connections: two that took every
 * place within max_clients moments before (its HELLO, read on a spare
 * slot, takes a place from one), or five that hold every slot and the
 * place in the queue that one of them will give up. */
static void test_silent_flood(void)
{
	const int counts[] = { 2, 5 };
	union gg_ctrl_msg m;
	char why[160];

	for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
		int quiet[5], r;
		for (int i = 0; i < counts[k]; i++)
			quiet[i] = raw_connect(&h);
		sleep_us(10000);
		r = raw_connect(&h);
		hello_msg(&m, "flooded", 0, 1);
		raw_send(r, &m, sizeof(m.hello), -1);
		size_t n = raw_recv(r, &m);
		int type = gg_ctrl_check(&m, n, why, sizeof(why));
		if (type != GG_CTRL_ACCEPT)
			fprintf(stderr, "a rank behind %d silent connections: %s\n", counts[k], m.error.message);
		CHECK_EQ_INT(type, GG_CTRL_ACCEPT);
		close(r);
		for (int i = 0; i < counts[k]; i++)
			close(quiet[i]);
		harness_wait_connections(&h, 0);
	}
}

/* An idle job holds one place; rank 0 of a new job takes the other and
 * says HELLO a few milliseconds late; rank 1 comes on a spare slot and
 * says HELLO at once. Rank 1 takes the idle job's place, not rank 0's:
 * both ranks get in. */
static void test_idle_before_young(void)
{
	struct gg_session *a;
	union gg_ctrl_msg m;
	char why[160];
	uint64_t evicted = harness_stats(&h).evicted;

	open_ok("idle1", 0, 1, &a);
	sleep_us(2 * IDLE_US);
	int r0 = raw_connect(&h);
	sleep_us(3000);
	int r1 = raw_connect(&h);
	hello_msg(&m, "new1", 1, 2);
	raw_send(r1, &m, sizeof(m.hello), -1);
	sleep_us(5000);
	hello_msg(&m, "new1", 0, 2);
	raw_send(r0, &m, sizeof(m.hello), -1);
	for (int k = 0; k < 2; k++) {
		size_t n = raw_recv(k ? r0 : r1, &m);
		int type = gg_ctrl_check(&m, n, why, sizeof(why));
		if (type != GG_CTRL_ACCEPT)
			fprintf(stderr, "rank %d: %s\n", k ? 0 : 1, m.error.message);
		CHECK_EQ_INT(type, GG_CTRL_ACCEPT);
	}
	CHECK(harness_stats(&h).evicted == evicted + 1);
	close(r0);
	close(r1);
	gg_session_close(a);
	harness_wait_connections(&h, 0);
}

/* Two ranks of a new job connect while an idle job holds every place:
 * both wait on spare slots, and their HELLOs, sent together, both get in
 * once the idle job gives its places up (the second must not count the
 * first job's sessions, closing, against max_clients). */
static void test_idle_slots_pair(void)
{
	struct gg_session *a, *b;
	struct gg_error err;
	union gg_ctrl_msg m[2];
	char why[160];
	float x = 1;

	open_ok("old", 0, 2, &a);
	open_ok("old", 1, 2, &b);
	sleep_us(2 * IDLE_US);
	uint64_t evicted = harness_stats(&h).evicted;
	int fd[2] = { raw_connect(&h), raw_connect(&h) };
	for (unsigned r = 0; r < 2; r++) {
		hello_msg(&m[r], "pair", r, 2);
		raw_send(fd[r], &m[r], sizeof(m[r].hello), -1);
	}
	for (unsigned r = 0; r < 2; r++) {
		size_t len = raw_recv(fd[r], &m[r]);
		int type = gg_ctrl_check(&m[r], len, why, sizeof(why));
		if (type == GG_CTRL_REFUSE)
			fprintf(stderr, "rank %u of the new job refused: %s\n", r, m[r].error.message);
		CHECK_EQ_INT(type, GG_CTRL_ACCEPT);
	}
	CHECK(harness_stats(&h).evicted == evicted + 2);
	CHECK_EQ_INT(gg_allreduce(a, &x, 1, GG_DTYPE_F32, 0, 10000, &err), GG_ERR_CLOSED);
	close(fd[0]);
	close(fd[1]);
	gg_session_close(a);
	gg_session_close(b);
	harness_wait_connections(&h, 0);
}

/* The child: takes job 'taken' as user nobody, and runs a step of it. */
static int take_name_main(const char *endpoint)
{
	struct gg_session *s;
	struct gg_error err;
	float x = 9;

	if (setgid(65534) || setuid(65534))
		return 2;
	if (gg_session_open(endpoint, "taken", 0, 1, &s, &err) ||
	    gg_allreduce(s, &x, 1, GG_DTYPE_F32, 0, 10000, &err) || x != 9) {
		fprintf(stderr, "taking the name: %s\n", err.message);
		return 1;
	}
	gg_session_close(s);
	return 0;
}

/* A job name another user's idle job holds is taken over. */
static void test_idle_name(void)
{
	char *argv[] = { "test_host_protocol", "--take-name", h.endpoint, NULL };
	struct gg_session *s;
	struct gg_error err;
	pid_t pid;
	int status;
	float x = 1;

	if (getuid() != 0) {
		printf("idle-name check skipped: needs root to become another user\n");
		return;
	}
	open_ok("taken", 0, 2, &s);
	CHECK(chmod(h.dir, 0711) == 0); /* the socket itself lets every user in */
	sleep_us(2 * IDLE_US);
	CHECK(posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, environ) == 0);
	CHECK(waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	CHECK_EQ_INT(gg_allreduce(s, &x, 1, GG_DTYPE_F32, 0, 10000, &err), GG_ERR_CLOSED);
	CHECK_ERR(err, GG_ERR_CLOSED, "job 'taken' sent nothing for ", "and a rank of uid 65534 asks for its name");
	gg_session_close(s);
	harness_wait_connections(&h, 0);
}

/* The child: as user nobody, takes half of the sessions (max_clients 8)
 * and half of the jobs (max_jobs 4), and is refused the next. */
static int user_shares_main(const char *endpoint)
{
	struct gg_session *s[5] = { 0 };
	struct gg_error err;
	int rc = 0;

	if (setgid(65534) || setuid(65534))
		return 2;
	for (int r = 0; r < 4 && !rc; r++)
		if (gg_session_open(endpoint, "big", r, 5, &s[r], &err)) {
			fprintf(stderr, "rank %d of 'big': %s\n", r, err.message);
			rc = 1;
		}
	if (!rc && (gg_session_open(endpoint, "big", 4, 5, &s[4], &err) != GG_ERR_REFUSED ||
		    strcmp(err.message, "uid 65534 holds 4 sessions at the gateway of site test-site, half of its "
					"max_clients = 8: a user other than root and the gateway's own (uid 0) may hold "
					"no more, so that others find room"))) {
		fprintf(stderr, "a fifth session: %s\n", err.message);
		rc = 1;
	}
	for (int r = 0; r < 5; r++)
		gg_session_close(s[r]);
	memset(s, 0, sizeof(s));
	for (int i = 0; i < 2 && !rc; i++) {
		char job[8];
		snprintf(job, sizeof(job), "j%d", i);
		if (gg_session_open(endpoint, job, 0, 1, &s[i], &err)) {
			fprintf(stderr, "job %s: %s\n", job, err.message);
			rc = 1;
		}
	}
	if (!rc && (gg_session_open(endpoint, "j2", 0, 1, &s[2], &err) != GG_ERR_REFUSED ||
		    strcmp(err.message, "uid 65534 runs 2 jobs at the gateway of site test-site, half of the 4 it runs "
					"at once: a user other than root and the gateway's own (uid 0) may start no more, "
					"so that others find room"))) {
		fprintf(stderr, "a third job: %s\n", err.message);
		rc = 1;
	}
	for (int i = 0; i < 3; i++)
		gg_session_close(s[i]);
	return rc;
}

/* Opens rank `rank` of `nranks` of `job` as user `uid` (effective, which
 * the gateway reads off the socket), expecting `want` and, for a
 * refusal, the message `says`. */
static bool open_as(uid_t uid, const char *endpoint, const char *job, int rank, int nranks, struct gg_session **s,
		    int want, const char *says)
{
	struct gg_error err;

	if (seteuid(0) || seteuid(uid))
		return false;
	int rc = gg_session_open(endpoint, job, rank, nranks, s, &err);
	if (rc != want || (want && strcmp(err.message, says))) {
		fprintf(stderr, "uid %u, rank %d of '%s': %d, %s\n", (unsigned)uid, rank, job, rc, rc ? err.message : "");
		return false;
	}
	return true;
}

#define SHARES_IDLE_US 2000000 /* session_idle of the user-shares harness */

/* The child, as root: user nobody takes its half of the sessions (4 of
 * max_clients 8), user daemon 2 more, and together they are refused the
 * seventh; root opens the last two. The same for the jobs (max_jobs 4):
 * nobody 2, daemon 1, daemon's second refused, root's fourth not. Then
 * 6 sessions of bin, nobody and daemon, left idle for session_idle: a
 * HELLO of bin's that is refused takes nobody's place; one that is let in
 * takes the place of daemon's job (nobody's ran a step meanwhile), whose
 * rank is told why, and all users' share holds. */
static int users_together_main(const char *endpoint)
{
	struct gg_session *s[12] = { 0 };
	unsigned n = 0;
	bool ok = true;

	for (int r = 0; r < 4 && ok; r++)
		ok = open_as(65534, endpoint, "nb", r, 4, &s[n++], 0, NULL);
	for (int r = 0; r < 2 && ok; r++)
		ok = open_as(1, endpoint, "dm", r, 3, &s[n++], 0, NULL);
	ok = ok && open_as(1, endpoint, "dm", 2, 3, &s[n++], GG_ERR_REFUSED,
			   "users other than root and the gateway's own (uid 0) hold 6 sessions at the gateway of "
			   "site test-site, three quarters of its max_clients = 8: they may hold no more, so that "
			   "root and the gateway's user find room");
	for (int r = 0; r < 2 && ok; r++)
		ok = open_as(0, endpoint, "rt", r, 2, &s[n++], 0, NULL);
	(void)seteuid(0);
	for (unsigned i = 0; i < n; i++)
		gg_session_close(s[i]);
	n = 0;
	/* The sessions closed, the jobs are gone: one session a job now. */
	ok = ok && open_as(65534, endpoint, "n1", 0, 1, &s[n++], 0, NULL) &&
	     open_as(65534, endpoint, "n2", 0, 1, &s[n++], 0, NULL) &&
	     open_as(1, endpoint, "d1", 0, 1, &s[n++], 0, NULL) &&
	     open_as(1, endpoint, "d2", 0, 1, &s[n++], GG_ERR_REFUSED,
		     "users other than root and the gateway's own (uid 0) run 3 jobs at the gateway of site "
		     "test-site, three quarters of the 4 it runs at once: they may start no more, so that root and "
		     "the gateway's user find room") &&
	     open_as(0, endpoint, "r1", 0, 1, &s[n++], 0, NULL);
	(void)seteuid(0);
	for (unsigned i = 0; i < n; i++)
		gg_session_close(s[i]);
	n = 0;
	ok = ok && open_as(2, endpoint, "bi", 0, 2, &s[n++], 0, NULL);
	for (int r = 0; r < 4 && ok; r++)
		ok = open_as(65534, endpoint, "ni", r, 4, &s[n++], 0, NULL);
	ok = ok && open_as(1, endpoint, "di", 0, 3, &s[n++], 0, NULL);
	usleep(SHARES_IDLE_US + 500000);
	/* A HELLO refused for what it says takes no place: nobody's job
	 * stays, and a step of it runs (to its deadline: its other ranks do
	 * not come), which ends its idleness. */
	ok = ok && open_as(2, endpoint, "bi", 0, 2, &s[n], GG_ERR_REFUSED, "rank 0 of job 'bi' is already connected");
	(void)seteuid(0);
	float x = 1;
	struct gg_error err;
	if (ok && gg_allreduce(s[1], &x, 1, GG_DTYPE_F32, 1, 100, &err) != GG_ERR_TIMEOUT) {
		fprintf(stderr, "nobody's idle rank after bin's refused HELLO: %s\n", err.message);
		ok = false;
	}
	/* Bin's next rank is let in: daemon's job, idle longest of the
	 * others', gives its place up, and its rank is told why. */
	ok = ok && open_as(2, endpoint, "bi", 1, 2, &s[n++], 0, NULL);
	(void)seteuid(0);
	if (ok && (gg_allreduce(s[5], &x, 1, GG_DTYPE_F32, 1, 0, &err) != GG_ERR_CLOSED ||
		   !strstr(err.message, "job 'di' sent nothing for ") ||
		   !strstr(err.message, "a rank of another user needs a place within the share of users other than "
					"root and the gateway's own: its sessions are closed"))) {
		fprintf(stderr, "daemon's idle rank after bin came: %s\n", err.message);
		ok = false;
	}
	for (unsigned i = 0; i < n; i++)
		gg_session_close(s[i]);
	return ok ? 0 : 1;
}

/* One user other than root and the gateway's own cannot take every
 * session or job: root can, and the others find room past that user;
 * and two such users together leave root a quarter. */
static void test_user_shares(void)
{
	char *argv[] = { "test_host_protocol", "--user-shares", h.endpoint, NULL };
	struct gg_session *s[6];
	pid_t pid;
	int status;

	if (getuid() != 0) {
		printf("user-shares check skipped: needs root to become another user\n");
		return;
	}
	CHECK(chmod(h.dir, 0711) == 0);
	for (int r = 0; r < 6; r++)
		open_ok("root", r, 6, &s[r]); /* past half of max_clients */
	for (int r = 0; r < 6; r++)
		gg_session_close(s[r]);
	harness_wait_connections(&h, 0);
	CHECK(posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, environ) == 0);
	CHECK(waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	harness_wait_connections(&h, 0);
	argv[1] = "--users-together";
	CHECK(posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, environ) == 0);
	CHECK(waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	harness_wait_connections(&h, 0);
}

/* ---- a raw rank next to a library rank ----------------------------------- */

struct raw_rank {
	int fd;
	int memfd;
	float *mem;
};

static void raw_rank_open(struct raw_rank *rr, const char *job, unsigned rank, unsigned nranks)
{
	rr->fd = raw_connect(&h);
	raw_hello(rr->fd, job, rank, nranks);
	rr->memfd = raw_memfd(4096, true);
	rr->mem = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, rr->memfd, 0);
	CHECK(rr->mem != MAP_FAILED);
	raw_map(rr->fd, 0, 4096, rr->memfd);
}

static void raw_rank_close(struct raw_rank *rr)
{
	munmap(rr->mem, 4096);
	close(rr->memfd);
	if (rr->fd >= 0)
		close(rr->fd);
}

/* Rank 0 of 2 of a job through the library, with step 1 (x, `tensor`)
 * under way, and rank 1 raw beside it. */
struct pair {
	struct gg_session *s;
	struct gg_request *req;
	struct raw_rank rr;
	float x[4];
};

static void pair_start(struct pair *p, const char *job, uint32_t tensor)
{
	struct gg_error err;

	*p = (struct pair){ .x = { 1, 2, 3, 4 } };
	open_ok(job, 0, 2, &p->s);
	CHECK_EQ_INT(gg_allreduce_start(p->s, p->x, 4, GG_DTYPE_F32, tensor, 0, &p->req, &err), 0);
	raw_rank_open(&p->rr, job, 1, 2);
}

static void test_raw_allreduce(void)
{
	struct pair p;
	struct gg_error err;
	union gg_ctrl_msg m;
	char why[160];

	pair_start(&p, "raw", 9);
	for (int i = 0; i < 4; i++)
		p.rr.mem[16 + i] = 0.5f * (float)i;
	raw_allreduce(p.rr.fd, 1, 9, GG_DTYPE_F32, 4, 0, 64);
	size_t len = raw_recv(p.rr.fd, &m);
	CHECK_EQ_INT(gg_ctrl_check(&m, len, why, sizeof(why)), GG_CTRL_DONE);
	CHECK_EQ_INT(m.done.seq, 1);
	CHECK_EQ_INT(m.done.status, 0);
	CHECK(p.rr.mem[16] == 1.0f && p.rr.mem[17] == 2.5f && p.rr.mem[18] == 4.0f && p.rr.mem[19] == 5.5f);
	CHECK_EQ_INT(gg_wait(p.req, -1, &err), 0);
	CHECK(p.x[0] == 1.0f && p.x[1] == 2.5f && p.x[2] == 4.0f && p.x[3] == 5.5f);
	gg_request_free(p.req);
	gg_session_close(p.s);
	raw_rank_close(&p.rr);
	harness_wait_connections(&h, 0);
}

/* Rank 0 (the library) waits in step 1 while raw rank 1 sends `bad`; rank
 * 1 gets ERROR(code, text) and is closed, rank 0's step fails naming it. */
struct violation {
	const char *name;
	void (*bad)(struct raw_rank *rr);
	int code;
	const char *text;
	bool step1_runs; /* rank 1 completes step 1 before it breaks the rules */
};

static void bad_too_large(struct raw_rank *rr)
{
	raw_allreduce(rr->fd, 1, 5, GG_DTYPE_F32, (1u << 20) + 1, 0, 0);
}

static void bad_past_region(struct raw_rank *rr)
{
	raw_allreduce(rr->fd, 1, 5, GG_DTYPE_F32, 1000, 0, 128);
}

static void bad_region(struct raw_rank *rr)
{
	raw_allreduce(rr->fd, 1, 5, GG_DTYPE_F32, 4, 3, 0);
}

static void bad_seq(struct raw_rank *rr)
{
	raw_allreduce(rr->fd, 2, 5, GG_DTYPE_F32, 4, 0, 0);
}

static void bad_dtype(struct raw_rank *rr)
{
	raw_allreduce(rr->fd, 1, 5, 7, 4, 0, 0);
}

static void bad_offset(struct raw_rank *rr)
{
	raw_allreduce(rr->fd, 1, 5, GG_DTYPE_F32, 4, 0, 6);
}

static void bad_count_zero(struct raw_rank *rr)
{
	raw_allreduce(rr->fd, 1, 5, GG_DTYPE_F32, 0, 0, 0);
}

static void bad_garbage(struct raw_rank *rr)
{
	raw_send(rr->fd, "\xde\xad\xbe\xef and more garbage bytes", 28, -1);
}

static void bad_truncated(struct raw_rank *rr)
{
	union gg_ctrl_msg m;

	gg_ctrl_init(&m, GG_CTRL_ALLREDUCE);
	raw_send(rr->fd, &m, 30, -1);
}

/* An empty packet reads as 0 bytes, as a hang-up does: the rank is still
 * there, so it broke the protocol. */
static void bad_empty(struct raw_rank *rr)
{
	raw_send(rr->fd, "", 0, -1);
}

static void bad_done(struct raw_rank *rr)
{
	union gg_ctrl_msg m;

	raw_send(rr->fd, &m, gg_ctrl_init(&m, GG_CTRL_DONE), -1);
}

/* Fields a gateway's NCCL_ID may not hold (root 0 of 0 ranks): refused for
 * its direction all the same. */
static void bad_nccl_id(struct raw_rank *rr)
{
	union gg_ctrl_msg m;

	raw_send(rr->fd, &m, gg_ctrl_init(&m, GG_CTRL_NCCL_ID), -1);
}

static void bad_hello_again(struct raw_rank *rr)
{
	union gg_ctrl_msg m;

	hello_msg(&m, "v", 1, 2);
	raw_send(rr->fd, &m, sizeof(m.hello), -1);
}

static void bad_status_in_session(struct raw_rank *rr)
{
	union gg_ctrl_msg m;
	size_t len = gg_ctrl_init(&m, GG_CTRL_STATUS);

	m.status.version = GG_CTRL_STATUS_VERSION;
	raw_send(rr->fd, &m, len, -1);
}

static void bad_unsealed(struct raw_rank *rr)
{
	int fd = raw_memfd(4096, false);

	raw_map(rr->fd, 1, 4096, fd);
	close(fd);
}

/* What a tmpfs file opened by path has too: seals, F_SEAL_SEAL only. */
static void bad_no_sealing(struct raw_rank *rr)
{
	int fd = memfd_create("gg-test-no-sealing", MFD_CLOEXEC);

	CHECK(fd >= 0 && ftruncate(fd, 4096) == 0);
	raw_map(rr->fd, 1, 4096, fd);
	close(fd);
}

static void bad_not_memfd(struct raw_rank *rr)
{
	int p[2];

	CHECK(pipe(p) == 0);
	raw_map(rr->fd, 1, 4096, p[0]);
	close(p[0]);
	close(p[1]);
}

static void bad_map_size(struct raw_rank *rr)
{
	int fd = raw_memfd(4096, true);

	raw_map(rr->fd, 1, 8192, fd);
	close(fd);
}

static void bad_map_no_fd(struct raw_rank *rr)
{
	raw_map(rr->fd, 1, 4096, -1);
}

/* MAP with n copies of the rank's memfd attached. */
static void map_with_fds(struct raw_rank *rr, unsigned n)
{
	_Alignas(size_t) char cbuf[CMSG_SPACE(8 * sizeof(int))];
	union gg_ctrl_msg m;
	size_t len = gg_ctrl_init(&m, GG_CTRL_MAP);
	struct iovec iov = { .iov_base = &m, .iov_len = len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
			     .msg_controllen = CMSG_SPACE(n * sizeof(int)) };

	CHECK(n <= 8);
	m.map.region = 1;
	m.map.size_bytes = 4096;
	memset(cbuf, 0, sizeof(cbuf));
	struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(n * sizeof(int));
	for (unsigned i = 0; i < n; i++)
		memcpy(CMSG_DATA(c) + i * sizeof(int), &rr->memfd, sizeof(int));
	CHECK_EQ_INT(sendmsg(rr->fd, &mh, 0), (ssize_t)len);
}

static void bad_map_two_fds(struct raw_rank *rr)
{
	map_with_fds(rr, 2);
}

static void bad_map_many_fds(struct raw_rank *rr)
{
	map_with_fds(rr, 8);
}

static void bad_map_twice(struct raw_rank *rr)
{
	raw_map(rr->fd, 0, 4096, rr->memfd);
}

static void bad_map_id(struct raw_rank *rr)
{
	raw_map(rr->fd, 99, 4096, rr->memfd);
}

static void bad_map_huge(struct raw_rank *rr)
{
	raw_map(rr->fd, 1, 1ull << 40, rr->memfd);
}

static void bad_map_zero(struct raw_rank *rr)
{
	raw_map(rr->fd, 1, 0, rr->memfd);
}

static void bad_write_sealed(struct raw_rank *rr)
{
	int fd = raw_memfd(4096, true);

	CHECK(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE) == 0);
	raw_map(rr->fd, 1, 4096, fd);
	close(fd);
}

/* A sealed memfd of huge pages: a hole punched in it later would leave the
 * gateway a SIGBUS once the huge-page pool is empty. */
static void bad_hugetlb(struct raw_rank *rr)
{
	int fd = memfd_create("gg-test-huge", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB);

	CHECK(fd >= 0); /* hugetlbfs exists even with no huge pages reserved */
	CHECK(ftruncate(fd, 2 << 20) == 0);
	CHECK(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0);
	raw_map(rr->fd, 1, 2 << 20, fd);
	close(fd);
}

static void bad_unmap_busy(struct raw_rank *rr)
{
	union gg_ctrl_msg m;
	char why[160];

	/* Step 1 runs with rank 0's; step 2 stays queued in region 0. */
	raw_allreduce(rr->fd, 1, 5, GG_DTYPE_F32, 4, 0, 0);
	size_t len = raw_recv(rr->fd, &m);
	CHECK_EQ_INT(gg_ctrl_check(&m, len, why, sizeof(why)), GG_CTRL_DONE);
	CHECK_EQ_INT(m.done.status, 0);
	raw_allreduce(rr->fd, 2, 5, GG_DTYPE_F32, 4, 0, 0);
	len = gg_ctrl_init(&m, GG_CTRL_UNMAP);
	m.unmap.region = 0;
	raw_send(rr->fd, &m, len, -1);
}

static void bad_unmap_unknown(struct raw_rank *rr)
{
	union gg_ctrl_msg m;
	size_t len = gg_ctrl_init(&m, GG_CTRL_UNMAP);

	m.unmap.region = 2;
	raw_send(rr->fd, &m, len, -1);
}

static void bad_fd_on_allreduce(struct raw_rank *rr)
{
	union gg_ctrl_msg m;
	size_t len = gg_ctrl_init(&m, GG_CTRL_ALLREDUCE);

	raw_send(rr->fd, &m, len, rr->memfd);
}

static void bad_window(struct raw_rank *rr)
{
	union gg_ctrl_msg m;
	char why[160];

	/* Step 1 runs with rank 0's; steps 2 to 9 queue up, 10 is too many. */
	raw_allreduce(rr->fd, 1, 5, GG_DTYPE_F32, 4, 0, 0);
	size_t len = raw_recv(rr->fd, &m);
	CHECK_EQ_INT(gg_ctrl_check(&m, len, why, sizeof(why)), GG_CTRL_DONE);
	for (uint64_t seq = 2; seq <= GG_CTRL_MAX_INFLIGHT + 2; seq++)
		raw_allreduce(rr->fd, seq, 5, GG_DTYPE_F32, 4, 0, 0);
}

static const struct violation violations[] = {
	{ "too-large", bad_too_large, GG_ERR_TOO_LARGE, "step 1: 1048577 float32 elements; max_message allows 1 to 1048576", false },
	{ "past-region", bad_past_region, GG_ERR_PROTOCOL, "step 1: 4000 bytes at offset 128 do not fit region 0 of 4096 bytes", false },
	{ "no-region", bad_region, GG_ERR_PROTOCOL, "step 1: region 3 is not mapped", false },
	{ "seq", bad_seq, GG_ERR_PROTOCOL, "ALLREDUCE with seq 2, expected 1", false },
	{ "dtype", bad_dtype, GG_ERR_PROTOCOL, "step 1: unknown dtype 7", false },
	{ "offset", bad_offset, GG_ERR_PROTOCOL, "step 1: offset 6 in region 0 is not a multiple of the element size, 4", false },
	{ "count-zero", bad_count_zero, GG_ERR_PROTOCOL, "step 1: 0 float32 elements; max_message allows 1 to 1048576", false },
	{ "garbage", bad_garbage, GG_ERR_PROTOCOL, "not a gradgate control message (magic 0xefbeadde)", false },
	{ "truncated", bad_truncated, GG_ERR_PROTOCOL, "truncated ALLREDUCE: 30 of 56 bytes", false },
	{ "empty", bad_empty, GG_ERR_PROTOCOL, "truncated message: 0 bytes, shorter than a header", false },
	{ "done", bad_done, GG_ERR_PROTOCOL, "unexpected DONE from a client", false },
	{ "nccl-id", bad_nccl_id, GG_ERR_PROTOCOL, "unexpected NCCL_ID from a client", false },
	{ "hello-again", bad_hello_again, GG_ERR_PROTOCOL, "unexpected HELLO from a client", false },
	{ "status-in-session", bad_status_in_session, GG_ERR_PROTOCOL, "unexpected STATUS from a client", false },
	{ "unsealed", bad_unsealed, GG_ERR_PROTOCOL, "MAP of region 1: the descriptor is not a memfd sealed against shrinking (F_SEAL_SHRINK)", false },
	{ "no-sealing", bad_no_sealing, GG_ERR_PROTOCOL, "MAP of region 1: the descriptor is not a memfd sealed against shrinking (F_SEAL_SHRINK)", false },
	{ "not-memfd", bad_not_memfd, GG_ERR_PROTOCOL, "MAP of region 1: the descriptor is not a memfd (Invalid argument)", false },
	{ "hugetlb", bad_hugetlb, GG_ERR_PROTOCOL, "MAP of region 1: the memfd is not plain shared memory (filesystem 0x958458f6, not tmpfs; MFD_HUGETLB is not accepted)", false },
	{ "map-size", bad_map_size, GG_ERR_PROTOCOL, "MAP of region 1 says 8192 bytes, the memfd has 4096", false },
	{ "map-no-fd", bad_map_no_fd, GG_ERR_PROTOCOL, "MAP must carry exactly one file descriptor, not 0", false },
	{ "map-two-fds", bad_map_two_fds, GG_ERR_PROTOCOL, "MAP must carry exactly one file descriptor, not 2", false },
	{ "map-many-fds", bad_map_many_fds, GG_ERR_PROTOCOL, "MAP must carry exactly one file descriptor, not more than 4", false },
	{ "map-twice", bad_map_twice, GG_ERR_PROTOCOL, "MAP of region 0, which is mapped already", false },
	{ "map-id", bad_map_id, GG_ERR_PROTOCOL, "MAP of region 99; regions are 0..63", false },
	{ "map-huge", bad_map_huge, GG_ERR_TOO_LARGE, "MAP of region 1 with 1099511627776 bytes; regions hold 1 to 8392704 bytes", false },
	{ "map-zero", bad_map_zero, GG_ERR_PROTOCOL, "MAP of region 1 with 0 bytes; regions hold 1 to 8392704 bytes", false },
	{ "write-sealed", bad_write_sealed, GG_ERR_PROTOCOL, "MAP of region 1: mmap: Operation not permitted", false },
	{ "unmap-busy", bad_unmap_busy, GG_ERR_PROTOCOL, "UNMAP of region 0 while it holds 1 request in flight", true },
	{ "unmap-unknown", bad_unmap_unknown, GG_ERR_PROTOCOL, "UNMAP of region 2, which is not mapped", false },
	{ "fd-on-allreduce", bad_fd_on_allreduce, GG_ERR_PROTOCOL, "ALLREDUCE must not carry file descriptors", false },
	{ "window", bad_window, GG_ERR_PROTOCOL, "step 10: more than 8 requests in flight", true },
};

static void test_violations(void)
{
	for (size_t i = 0; i < GG_ARRAY_LEN(violations); i++) {
		const struct violation *v = &violations[i];
		struct pair p;
		struct gg_error err;
		char job[32], gw_text[320], rank_text[320];

		snprintf(job, sizeof(job), "v-%s", v->name);
		pair_start(&p, job, 5);
		v->bad(&p.rr);
		snprintf(gw_text, sizeof(gw_text), "gateway of site test-site: %s", v->text);
		raw_expect_close(p.rr.fd, GG_CTRL_ERROR, v->code, gw_text);
		p.rr.fd = -1;

		unsigned step = 1;
		if (v->step1_runs) {
			CHECK_EQ_INT(gg_wait(p.req, -1, &err), 0);
			gg_request_free(p.req);
			CHECK_EQ_INT(gg_allreduce_start(p.s, p.x, 4, GG_DTYPE_F32, 5, 0, &p.req, &err), 0);
			step = 2;
		}
		snprintf(rank_text, sizeof(rank_text),
			 "step %u (tensor 5): rank 1 of job '%s' broke the control protocol (%s) ", step, job, v->text);
		CHECK_EQ_INT(gg_wait(p.req, -1, &err), GG_ERR_RANK);
		CHECK_ERR(err, GG_ERR_RANK, rank_text);
		gg_request_free(p.req);
		gg_session_close(p.s);
		raw_rank_close(&p.rr);
		harness_wait_connections(&h, 0);
	}
	CHECK_EQ_INT(harness_stats(&h).violations, GG_ARRAY_LEN(violations));
}

/* GPU memory a gateway cannot take: without CUDA, or without a GPU (the
 * handle here is no real one either). The rank's session ends with the
 * reason, and so does the step of the job's other rank; no violation. */
static void test_map_cuda_refused(void)
{
	const unsigned long long before = harness_stats(&h).violations;
	struct pair p;
	struct gg_error err;
	union gg_ctrl_msg m;
	char why[160];

	pair_start(&p, "map-cuda", 5);
	size_t len = gg_ctrl_init(&m, GG_CTRL_MAP_CUDA);
	m.map_cuda.region = 1;
	m.map_cuda.size_bytes = 4096;
	memset(m.map_cuda.ipc, 0x5a, sizeof(m.map_cuda.ipc));
	raw_send(p.rr.fd, &m, len, -1);

	len = raw_recv(p.rr.fd, &m);
	CHECK_EQ_INT(gg_ctrl_check(&m, len, why, sizeof(why)), GG_CTRL_ERROR);
	printf("MAP_CUDA refused: %s (%s)\n", m.error.message, gg_strerror(m.error.code));
#if HAVE_CUDA
	/* No GPU (GG_ERR_INVALID), or one that finds the handle bad. */
	CHECK(m.error.code == GG_ERR_INVALID || m.error.code == GG_ERR_SYSTEM);
	CHECK_CONTAINS(m.error.message, m.error.code == GG_ERR_INVALID
						? "gateway of site test-site: cannot open the rank's GPU memory (it has no usable GPU): "
						: "gateway of site test-site: cannot open the rank's GPU memory: ");
#else
	CHECK_EQ_INT(m.error.code, GG_ERR_INVALID);
	CHECK_CONTAINS(m.error.message, "gateway of site test-site: this gateway was built without CUDA, so it "
					"cannot take GPU memory (gg_allreduce_cuda); use host memory");
#endif
	CHECK_EQ_INT(raw_recv(p.rr.fd, &m), 0);
	close(p.rr.fd);
	p.rr.fd = -1;
	CHECK_EQ_INT(gg_wait(p.req, -1, &err), GG_ERR_RANK);
	CHECK_CONTAINS(err.message, "step 1 (tensor 5): rank 1 of job 'map-cuda' could not be served (");
	gg_request_free(p.req);
	gg_session_close(p.s);
	raw_rank_close(&p.rr);
	harness_wait_connections(&h, 0);
	CHECK_EQ_INT(harness_stats(&h).violations, before);
}

/* gg_allreduce_cuda() refuses what it can tell is wrong before it sends
 * anything, and such a refusal uses no step number. */
static void test_cuda_call_refusals(void)
{
	struct gg_session *s;
	struct gg_error err;
	float x[4] = { 1, 2, 3, 4 };
	void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);

	CHECK_EQ_INT(gg_allreduce_cuda(NULL, x, 4, GG_DTYPE_F32, 3, NULL, 0, &err), GG_ERR_INVALID);
	CHECK_ERR(err, GG_ERR_INVALID, "gg_allreduce_cuda: session is NULL");
	CHECK_EQ_INT(gg_allreduce(NULL, x, 4, GG_DTYPE_F32, 3, 0, &err), GG_ERR_INVALID);
	CHECK_ERR(err, GG_ERR_INVALID, "gg_allreduce: session is NULL");
	open_ok("cuda-calls", 0, 1, &s);
	CHECK_EQ_INT(gg_allreduce_cuda(s, NULL, 4, GG_DTYPE_F32, 3, NULL, 0, &err), GG_ERR_INVALID);
	CHECK_ERR(err, GG_ERR_INVALID, "step 1 (tensor 3), not sent: devbuf is NULL");
	CHECK_EQ_INT(gg_allreduce_cuda(s, x, 0, GG_DTYPE_F32, 3, NULL, 0, &err), GG_ERR_INVALID);
	CHECK_ERR(err, GG_ERR_INVALID, "step 1 (tensor 3), not sent: count is 0");
	CHECK_EQ_INT(gg_allreduce_cuda(s, x, 4, (enum gg_dtype)99, 3, NULL, 0, &err), GG_ERR_INVALID);
	CHECK_ERR(err, GG_ERR_INVALID, "step 1 (tensor 3), not sent: unknown dtype 99");
	CHECK_EQ_INT(gg_allreduce_cuda(s, x, (size_t)1 << 40, GG_DTYPE_F32, 3, NULL, 0, &err), GG_ERR_TOO_LARGE);
	/* Host memory: refused by the driver's word, or for want of one. */
	int rc = gg_allreduce_cuda(s, x, 4, GG_DTYPE_F32, 3, NULL, 0, &err);
	printf("gg_allreduce_cuda on host memory: %s\n", err.message);
	if (driver && rc == GG_ERR_SYSTEM) {
		/* A driver without a GPU it can use (a container without one,
		 * CUDA_VISIBLE_DEVICES=""): it says so by name. */
		CHECK_ERR(err, GG_ERR_SYSTEM, "step 1 (tensor 3): ", "gateway/client/cuda_driver.c:",
			  ": cuInit failed: CUDA_ERROR_");
		dlclose(driver);
	} else if (driver) {
		CHECK_ERR(err, GG_ERR_INVALID, "step 1 (tensor 3): buf ");
		CHECK_CONTAINS(err.message, " is not CUDA device memory (host memory goes through gg_allreduce)");
		dlclose(driver);
	} else {
		CHECK_EQ_INT(rc, GG_ERR_SYSTEM);
		CHECK_ERR(err, GG_ERR_SYSTEM, "step 1 (tensor 3), not sent: the CUDA driver cannot be loaded: ");
	}
	/* None of that took a step: the next one is still step 1. */
	CHECK_EQ_INT(gg_allreduce(s, x, 4, GG_DTYPE_F32, 3, 0, &err), 0);
	CHECK(x[0] == 1 && x[3] == 4);
	CHECK_EQ_INT(gg_allreduce_cuda(s, NULL, 4, GG_DTYPE_F32, 3, NULL, 0, &err), GG_ERR_INVALID);
	CHECK_ERR(err, GG_ERR_INVALID, "step 2 (tensor 3), not sent: devbuf is NULL");
	gg_session_close(s);
	harness_wait_connections(&h, 0);
}

/* gg_allreduce_nccl() refuses what it can tell is wrong before it sends
 * anything, bfloat16 above all, and such a refusal uses no step number. */
static void test_nccl_call_refusals(void)
{
	struct gg_session *s;
	struct gg_error err;
	float x[4] = { 1, 2, 3, 4 };

	CHECK_EQ_INT(gg_allreduce_nccl(NULL, x, 4, GG_DTYPE_F32, 3, NULL, 0, &err), GG_ERR_INVALID);
	CHECK_ERR(err, GG_ERR_INVALID, "gg_allreduce_nccl: session is NULL");
	open_ok("nccl-calls", 0, 1, &s);
	CHECK_EQ_INT(gg_allreduce_nccl(s, NULL, 4, GG_DTYPE_F32, 3, NULL, 0, &err), GG_ERR_INVALID);
	CHECK_ERR(err, GG_ERR_INVALID, "step 1 (tensor 3), not sent: devbuf is NULL");
	CHECK_EQ_INT(gg_allreduce_nccl(s, x, 0, GG_DTYPE_F32, 3, NULL, 0, &err), GG_ERR_INVALID);
	CHECK_ERR(err, GG_ERR_INVALID, "step 1 (tensor 3), not sent: count is 0");
	CHECK_EQ_INT(gg_allreduce_nccl(s, x, 4, GG_DTYPE_BF16, 3, NULL, 0, &err), GG_ERR_INVALID);
	CHECK_ERR(err, GG_ERR_INVALID, "step 1 (tensor 3), not sent: NCCL steps take float32 only: NCCL would sum bfloat16 in "
		  "bfloat16");
	/* Host memory: refused as not device memory, or for want of NCCL or
	 * of a CUDA driver that works. */
	int rc = gg_allreduce_nccl(s, x, 4, GG_DTYPE_F32, 3, NULL, 0, &err);
	printf("gg_allreduce_nccl on host memory: %s\n", err.message);
	CHECK(rc == GG_ERR_INVALID || rc == GG_ERR_SYSTEM);
	CHECK(strstr(err.message, "is not CUDA device memory (host memory goes through gg_allreduce)") ||
	      strstr(err.message, "built without NCCL") || strstr(err.message, "NCCL cannot be loaded") ||
	      strstr(err.message, "CUDA driver") || strstr(err.message, "cuInit failed"));
	/* Nothing reached the gateway: the next step is still step 1. */
	CHECK_EQ_INT(gg_allreduce(s, x, 4, GG_DTYPE_F32, 3, 0, &err), 0);
	CHECK(x[0] == 1 && x[3] == 4);
	gg_session_close(s);
	harness_wait_connections(&h, 0);
}

/* After all that the gateway still serves. */
static void test_still_serving(void)
{
	struct gg_session *s;
	struct gg_error err;
	float x = 7;

	open_ok("after", 0, 1, &s);
	CHECK_EQ_INT(gg_allreduce(s, &x, 1, GG_DTYPE_F32, 0, 0, &err), 0);
	CHECK(x == 7);
	gg_session_close(s);
	harness_wait_connections(&h, 0);
}

/* Connections waiting for a slot when the gateway begins to stop: a job
 * idle past session_idle holds every place, two silent connections the
 * spare slots; of two more, one waits for a spare slot and the other for
 * the idle job's places, which their sessions, not reading, have not yet
 * given back. The stop refuses both as it does connections in a slot:
 * GG_ERR_CLOSED, the gateway shutting down, not "no slot free in time".
 * (Should the machine take longer than a silent connection may, one of
 * the first two is refused for its silence; the rest still must say the
 * gateway is shutting down.) Ends the harness. */
static void test_waiting_at_stop(void)
{
	struct gg_session *a, *b;
	int fd[4];

	uint64_t evicted = harness_stats(&h).evicted;

	open_ok("idle-at-stop", 0, 2, &a);
	open_ok("idle-at-stop", 1, 2, &b);
	sleep_us(2 * IDLE_US);
	for (int i = 0; i < 4; i++)
		fd[i] = raw_connect(&h);
	/* The gateway took all four (in order) once the last made the idle
	 * job give its places up, its two sessions; or, should the machine be
	 * slower than a silent connection may be silent, within half a
	 * second anyway. */
	for (int i = 0; i < 500 && harness_stats(&h).evicted < evicted + 2; i++)
		sleep_us(1000);
	harness_stop_begin(&h);
	for (int i = 0; i < 4; i++) {
		union gg_ctrl_msg m;
		char why[160];
		size_t n = raw_recv(fd[i], &m);
		CHECK_EQ_INT(gg_ctrl_check(&m, n, why, sizeof(why)), GG_CTRL_REFUSE);
		if (i < 2 && m.error.code == GG_ERR_REFUSED && strstr(m.error.message, "sent nothing for ")) {
			close(fd[i]);
			continue;
		}
		if (m.error.code != GG_ERR_CLOSED)
			fprintf(stderr, "connection %d: %s\n", i, m.error.message);
		CHECK_EQ_INT(m.error.code, GG_ERR_CLOSED);
		CHECK(!strcmp(m.error.message, "the gateway of site test-site is shutting down"));
		close(fd[i]);
	}
	gg_session_close(a);
	gg_session_close(b);
	harness_stop(&h);
}

int main(int argc, char **argv)
{
	if (argc == 3 && (!strcmp(argv[1], "--other-user") || !strcmp(argv[1], "--other-user-busy")))
		return other_user_main(argv[2], !strcmp(argv[1], "--other-user-busy"));
	if (argc == 3 && !strcmp(argv[1], "--take-name"))
		return take_name_main(argv[2]);
	if (argc == 3 && !strcmp(argv[1], "--user-shares"))
		return user_shares_main(argv[2]);
	if (argc == 3 && !strcmp(argv[1], "--users-together"))
		return users_together_main(argv[2]);

	struct harness_options o = {
		.max_clients = MAX_CLIENTS,
		.max_message_bytes = 4u << 20,
		.hello_timeout_us = 300000,
		.session_idle_us = 60000000,
	};

	harness_start(&h, &o);
	test_hello_refusals();
	test_refusal_flood();
	test_session_flood();
	test_job_refusals();
	test_close_reopen();
	test_other_user();
	test_raw_allreduce();
	test_violations();
	test_map_cuda_refused();
	test_cuda_call_refusals();
	test_nccl_call_refusals();
	test_still_serving();
	harness_stop(&h);

	/* Idle jobs, with a session_idle a test can wait out. */
	o = (struct harness_options){ .max_clients = 2, .hello_timeout_us = 2000000, .session_idle_us = IDLE_US };
	harness_start(&h, &o);
	test_idle_slots();
	test_idle_slots_pair();
	test_idle_name();
	test_silent_slots();
	test_silent_flood();
	test_idle_before_young();
	test_waiting_at_stop(); /* stops the harness */

	/* Other users' shares of the sessions and the jobs. */
	o = (struct harness_options){ .max_clients = 8, .user_shares = true, .max_jobs = 4, .session_idle_us = SHARES_IDLE_US };
	harness_start(&h, &o);
	test_user_shares();
	harness_stop(&h);
	printf("host protocol: ok\n");
	return 0;
}
