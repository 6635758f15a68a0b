/* libFuzzer target: the control protocol (control_proto.c) and the host
 * site backend that serves it (host_*.c), driven by a script
 * (fuzz_script.h) in which the input plays up to CONTROL_CLIENTS local
 * clients, the clock and the site core. Clients are real sockets on the
 * backend's control socket and MAP hands it real memfds (or what is not
 * one); the backend runs on an io_uring loop of this thread, turned until
 * it has nothing left to do after every operation, so a run is the same
 * every time.
 *
 * Checks: gg_ctrl_check() keeps its promises on every packet a client
 * sends; every answer the backend sends is a well-formed gateway message
 * in order (ACCEPT or REFUSE first, DONE in step order, nothing after
 * REFUSE or ERROR); steps lent to the core are sane; and after the clients
 * leave and the core hands back what it holds, the backend stops, with no
 * memory or file descriptor left behind. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "control_proto.h"
#include "fuzz_check.h"
#include "fuzz_script.h"
#include "host_backend.h"
#include "uring_loop.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_OPS 300
#define MAX_HELD 16
#define PAGE 4096u

enum core_manner { CORE_SYNC, CORE_HOLD, CORE_REFUSE };

struct client {
	int fd;                /* -1: none */
	bool answered;         /* ACCEPT or REFUSE came */
	bool over;             /* REFUSE, ERROR or the end of the stream came */
	uint64_t next_seq;     /* of the next ALLREDUCE */
	uint64_t last_done;
};

struct run {
	struct gg_host_backend *b;
	struct gg_site_backend *base;
	struct client clients[CONTROL_CLIENTS];
	struct gg_site_step *held[MAX_HELD];
	unsigned nheld;
	enum core_manner manner;
	bool abort_late; /* abort() of a held step answers -EALREADY */
	bool stopping;
};

static struct gg_loop loop;
static char dir[64], path[96], endpoint[112];
static unsigned fds_before;
static bool verbose; /* GG_FUZZ_VERBOSE set: the backend's log and every answer */

static _Noreturn void die(const char *what)
{
	fuzz_fail("fuzz_control", what);
}

static void remove_dir(void)
{
	unlink(path);
	rmdir(dir);
}

static void setup(void)
{
	static bool ready;

	if (ready)
		return;
	snprintf(dir, sizeof(dir), "/tmp/gg-fuzz-control.XXXXXX");
	if (!mkdtemp(dir))
		die("mkdtemp");
	atexit(remove_dir);
	snprintf(path, sizeof(path), "%s/control.sock", dir);
	snprintf(endpoint, sizeof(endpoint), "unix:%s", path);
	if (gg_loop_init(&loop, 256))
		die("no io_uring");
	verbose = getenv("GG_FUZZ_VERBOSE");
	ready = true;
}

/* ---- the fake core -------------------------------------------------------- */

/* What a core does with a step that completes: the site sum of every
 * element, then the result, in ranges of different sizes. */
static void core_sum(struct gg_site_step *st)
{
	for (uint64_t off = 0; off < st->count; off += 100)
		st->gather(st, off, GG_MIN(st->count - off, (uint64_t)100));
	for (uint64_t off = 0; off < st->count; off += 77)
		st->deliver(st, off, GG_MIN(st->count - off, (uint64_t)77));
}

static int core_submit(void *core, struct gg_site_step *st)
{
	struct run *r = core;

	if (!st->backend || !st->job || !st->count || !st->nranks || !st->sum || !st->gather || !st->deliver ||
	    st->memory != GG_STEP_MEM_HOST || (st->dtype != GG_DTYPE_F32 && st->dtype != GG_DTYPE_BF16) ||
	    !st->deadline_us)
		die("the backend lent the core a step that makes no sense");
	for (unsigned i = 0; i < r->nheld; i++)
		if (r->held[i] == st || !strcmp(r->held[i]->job, st->job))
			die("the backend lent the core a second step of one job");
	if (r->manner == CORE_REFUSE)
		return GG_ERR_LIMIT;
	if (r->manner == CORE_SYNC) {
		core_sum(st);
		gg_site_step_complete(st, 0, NULL);
		return 0;
	}
	if (r->nheld == MAX_HELD)
		return GG_ERR_LIMIT;
	r->held[r->nheld++] = st;
	return 0;
}

static int core_abort(void *core, const char *job, uint64_t seq, int code, const char *message)
{
	struct run *r = core;

	if (code >= 0 || code < GG_ERR_LIMIT || !message)
		die("the backend aborted a step with no code or message");
	/* Too late only for a step the core holds, as if its result were whole. */
	for (unsigned i = 0; i < r->nheld; i++)
		if (r->abort_late && !strcmp(r->held[i]->job, job) && r->held[i]->seq == seq)
			return -EALREADY;
	return 0;
}

static const struct gg_core_ops core_ops = { .submit = core_submit, .abort = core_abort };

static void log_line(void *arg, bool fault, const char *line)
{
	(void)arg;
	fprintf(stderr, "gateway: %s%s\n", fault ? "(fault) " : "", line);
}

/* Completes held step i: with the sum, or failed as a lost peer would. */
static void core_complete(struct run *r, unsigned i, bool ok)
{
	struct gg_site_step *st = r->held[i];

	r->held[i] = r->held[--r->nheld];
	if (ok) {
		core_sum(st);
		gg_site_step_complete(st, 0, NULL);
	} else {
		gg_site_step_complete(st, GG_ERR_SITE, "site eu-west: peer gateway closed the connection");
	}
}

/* ---- clients ---------------------------------------------------------------- */

/* Reads and checks what the backend sent a client. */
static void client_drain(struct client *c)
{
	union gg_ctrl_msg m;
	char why[160];

	while (c->fd >= 0) {
		ssize_t n = recv(c->fd, &m, sizeof(m), MSG_DONTWAIT | MSG_TRUNC);
		if (n < 0 && errno == ECONNRESET)
			continue; /* reported before the answers still queued */
		if (n < 0)
			return;
		if (n == 0) {
			c->over = true;
			return;
		}
		if (c->over)
			die("the backend sent more after REFUSE or ERROR");
		int type = gg_ctrl_check(&m, (size_t)n, why, sizeof(why));
		if (verbose)
			fprintf(stderr, "client %d: %s %s\n", c->fd, gg_ctrl_type_name((unsigned)type),
				type == GG_CTRL_DONE ? m.done.message : type < 0 ? why : m.error.message);
		switch (type) {
		case GG_CTRL_ACCEPT:
		case GG_CTRL_REFUSE:
			if (c->answered)
				die("a second answer to HELLO");
			c->answered = true;
			c->over = type == GG_CTRL_REFUSE;
			if (type == GG_CTRL_REFUSE && (m.error.code >= 0 || !m.error.message[0]))
				die("REFUSE without a code or reason");
			break;
		case GG_CTRL_DONE:
			if (!c->answered || c->over || m.done.seq <= c->last_done || m.done.seq >= c->next_seq)
				die("DONE out of order, or for a step never announced");
			if (m.done.status > 0 || m.done.status < GG_ERR_LIMIT || (m.done.status && !m.done.message[0]))
				die("DONE with a bad status or no message");
			c->last_done = m.done.seq;
			break;
		case GG_CTRL_ERROR:
			if (m.error.code >= 0 || !m.error.message[0])
				die("ERROR without a code or message");
			c->over = true;
			break;
		default:
			die("the backend sent what a gateway never sends");
		}
	}
}

static struct client *pick_client(struct run *r, struct script *s)
{
	struct client *c = &r->clients[script_u8(s) % CONTROL_CLIENTS];

	return c->fd >= 0 ? c : NULL;
}

/* What gg_ctrl_check() promises about a packet it accepts or refuses. */
static void check_parse(const union gg_ctrl_msg *m, size_t len)
{
	char why[160] = "";
	int type = gg_ctrl_check(m, len, why, sizeof(why));

	if (type < 0) {
		if (type != GG_ERR_PROTOCOL || !why[0] || strchr(why, '\n'))
			die("gg_ctrl_check refused without saying why");
		return;
	}
	union gg_ctrl_msg fresh;
	if (m->hdr.magic != GG_CTRL_MAGIC || m->hdr.type != type || len != m->hdr.length ||
	    (type != GG_CTRL_HELLO && len != gg_ctrl_init(&fresh, (enum gg_ctrl_type)type)))
		die("gg_ctrl_check accepted a packet of the wrong shape");
	if (type == GG_CTRL_HELLO && m->hello.version == GG_CTRL_VERSION &&
	    (len != sizeof(m->hello) || !memchr(m->hello.job, 0, sizeof(m->hello.job))))
		die("gg_ctrl_check accepted a HELLO of the wrong shape");
}

static int make_memfd(uint64_t size, bool seal)
{
	int fd = memfd_create("gg-fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	if (fd < 0)
		return -1;
	if (ftruncate(fd, (off_t)size) || (seal && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW))) {
		close(fd);
		return -1;
	}
	return fd;
}

static const char *const job_names[] = { "j0", "j1", "train.run-2" };

static void op_hello(struct client *c, struct script *s)
{
	union gg_ctrl_msg m;
	size_t len = gg_ctrl_init(&m, GG_CTRL_HELLO);
	uint8_t version = script_u8(s);
	char name[GG_CTRL_NAME_SIZE + 8];

	m.hello.version = version ? version : GG_CTRL_VERSION;
	m.hello.rank = script_u8(s);
	m.hello.nranks = script_u8(s);
	uint8_t job = script_u8(s) % 4;
	if (job < 3)
		gg_ctrl_set_text(m.hello.job, sizeof(m.hello.job), job_names[job]);
	else
		gg_ctrl_set_text(m.hello.job, sizeof(m.hello.job), script_text(s, name, sizeof(name)));
	(void)fuzz_send_fds(c->fd, &m, len, NULL, 0);
}

static void op_map(struct client *c, struct script *s)
{
	union gg_ctrl_msg m;
	size_t len = gg_ctrl_init(&m, GG_CTRL_MAP);
	int fds[2] = { -1, -1 }, pipe_fds[2] = { -1, -1 };
	unsigned nfds = 1;

	m.map.region = script_u8(s) % (GG_CTRL_MAX_REGIONS + 2);
	m.map.size_bytes = (uint64_t)(script_u8(s) % 40) * PAGE;
	switch ((enum control_fd)(script_u8(s) % CONTROL_FD_KINDS)) {
	case CONTROL_FD_SEALED:
		fds[0] = make_memfd(m.map.size_bytes, true);
		break;
	case CONTROL_FD_UNSEALED:
		fds[0] = make_memfd(m.map.size_bytes, false);
		break;
	case CONTROL_FD_SHORT:
		fds[0] = make_memfd(m.map.size_bytes ? m.map.size_bytes - PAGE : 0, true);
		break;
	case CONTROL_FD_NONE:
		nfds = 0;
		break;
	case CONTROL_FD_TWO:
		fds[0] = make_memfd(m.map.size_bytes, true);
		fds[1] = make_memfd(m.map.size_bytes, true);
		nfds = 2;
		break;
	case CONTROL_FD_PIPE:
		if (!pipe2(pipe_fds, O_CLOEXEC))
			fds[0] = pipe_fds[0];
		break;
	case CONTROL_FD_KINDS:
		break;
	}
	if (nfds && (fds[0] < 0 || (nfds == 2 && fds[1] < 0)))
		nfds = 0;
	(void)fuzz_send_fds(c->fd, &m, len, fds, nfds);
	for (unsigned i = 0; i < 2; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	if (pipe_fds[1] >= 0)
		close(pipe_fds[1]);
}

static void op_allreduce(struct client *c, struct script *s)
{
	union gg_ctrl_msg m;
	size_t len = gg_ctrl_init(&m, GG_CTRL_ALLREDUCE);
	uint8_t seq = script_u8(s);

	m.allreduce.seq = seq ? seq : c->next_seq;
	m.allreduce.tensor_id = script_u8(s) % 4;
	m.allreduce.dtype = script_u8(s) % 4;
	m.allreduce.count = script_u16(s);
	m.allreduce.offset = script_u32(s);
	m.allreduce.region = script_u8(s) % (GG_CTRL_MAX_REGIONS + 2);
	m.allreduce.timeout_ms = script_u16(s);
	if (m.allreduce.seq == c->next_seq)
		c->next_seq++;
	(void)fuzz_send_fds(c->fd, &m, len, NULL, 0);
}

/* ---- the loop --------------------------------------------------------------- */

static void on_cqe(void *arg, const struct io_uring_cqe *cqe)
{
	struct run *r = arg;

	if (!r->base || !r->base->ops->on_cqe(r->base, cqe))
		die("a completion nobody owns");
}

static void ignore_cqe(void *arg, const struct io_uring_cqe *cqe)
{
	(void)arg, (void)cqe;
}

/* Submits what a backend that is gone left queued, so that the next run
 * starts from an empty ring. */
static void drain_ring(void)
{
	for (unsigned idle = 0; idle < 2;)
		idle = gg_loop_run(&loop, 0, ignore_cqe, NULL) > 0 ? 0 : idle + 1;
}

/* Turns the loop until nothing is left to do, then lets the clients read. */
static void settle(struct run *r)
{
	for (unsigned idle = 0, turns = 0; idle < 2; turns++) {
		if (turns == 1000)
			die("the backend never settles");
		int n = gg_loop_run(&loop, 0, on_cqe, r);
		if (n < 0)
			die("the ring broke");
		idle = n ? 0 : idle + 1;
		r->base->ops->tick(r->base, loop.now_us);
	}
	for (unsigned i = 0; i < CONTROL_CLIENTS; i++)
		client_drain(&r->clients[i]);
}

static void op(struct run *r, struct script *s)
{
	enum control_op what = (enum control_op)(script_u8(s) % CONTROL_OPS);
	struct client *c = NULL;
	size_t len;
	const uint8_t *bytes;
	union gg_ctrl_msg m;

	if (what >= CONTROL_HELLO && what <= CONTROL_CLOSE)
		c = pick_client(r, s);
	switch (what) {
	case CONTROL_CONNECT:
		c = &r->clients[script_u8(s) % CONTROL_CLIENTS];
		if (c->fd >= 0)
			break;
		*c = (struct client){ .fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0), .next_seq = 1 };
		struct sockaddr_un addr = { .sun_family = AF_UNIX };
		memcpy(addr.sun_path, path, strlen(path) + 1);
		if (c->fd >= 0 && connect(c->fd, (struct sockaddr *)&addr, sizeof(addr))) {
			close(c->fd);
			c->fd = -1;
		}
		break;
	case CONTROL_HELLO:
		if (c)
			op_hello(c, s);
		break;
	case CONTROL_MAP:
		if (c)
			op_map(c, s);
		break;
	case CONTROL_UNMAP:
		len = gg_ctrl_init(&m, GG_CTRL_UNMAP);
		m.unmap.region = script_u8(s) % (GG_CTRL_MAX_REGIONS + 2);
		if (c)
			(void)fuzz_send_fds(c->fd, &m, len, NULL, 0);
		break;
	case CONTROL_ALLREDUCE:
		if (c)
			op_allreduce(c, s);
		break;
	case CONTROL_RAW:
		bytes = script_bytes(s, script_u16(s) % (sizeof(m) + 64), &len);
		memset(&m, 0, sizeof(m));
		memcpy(&m, bytes, GG_MIN(len, sizeof(m)));
		check_parse(&m, len > sizeof(m) ? sizeof(m) + 1 : len);
		if (c)
			(void)fuzz_send_fds(c->fd, bytes, len, NULL, 0);
		break;
	case CONTROL_CLOSE:
		if (c) {
			close(c->fd);
			c->fd = -1;
		}
		break;
	case CONTROL_RUN:
		for (unsigned i = script_u8(s) % 4; i > 0; i--)
			settle(r);
		break;
	case CONTROL_TIME:
		loop.test_skew_us += script_u16(s) * 1000ull;
		break;
	case CONTROL_CORE: {
		uint8_t v = script_u8(s);
		r->abort_late = v & 0x80;
		switch (v % 6) {
		case 0:
		case 1:
			if (r->nheld)
				core_complete(r, 0, v % 6 == 0);
			break;
		case 2:
			while (r->nheld)
				core_complete(r, 0, true);
			break;
		default:
			r->manner = (enum core_manner)(v % 6 - 3);
			break;
		}
		break;
	}
	case CONTROL_STOP:
		r->stopping = true;
		(void)r->base->ops->stop(r->base);
		break;
	case CONTROL_OPS:
		break;
	}
	settle(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct script s = { data, size };
	static struct run r;
	char err[256];

	setup();
	fds_before = fuzz_open_fds();
	memset(&r, 0, sizeof(r));
	for (unsigned i = 0; i < CONTROL_CLIENTS; i++)
		r.clients[i].fd = -1;
	struct gg_host_backend_options o = {
		.control = endpoint,
		.site = "fuzz-site",
		.max_clients = 1 + script_u8(&s) % 4,
		.max_message_bytes = (1 + script_u8(&s) % 32) * 1024ull,
		.memory_bytes = (1 + script_u8(&s) % 16) * 2048ull,
		.step_timeout_us = (1 + script_u8(&s)) * 10000ull,
		.hello_timeout_us = (1 + script_u8(&s)) * 10000ull,
		.answer_grace_us = 1000000,
		.kind_base = GG_OP_USER,
		.log = verbose ? log_line : NULL,
	};
	uint8_t manner = script_u8(&s);
	r.manner = (enum core_manner)(manner % 3);
	r.abort_late = manner & 4;
	/* Idle jobs give their slots and names up: 0 (never), 50, 100, 150 ms. */
	o.session_idle_us = ((manner >> 3) & 3) * 50000ull;
	if (gg_host_backend_create(&o, &core_ops, &r, &r.b, err, sizeof(err)))
		return 0; /* out of memory */
	r.base = gg_host_backend_base(r.b);
	if (r.base->ops->start(r.base, &loop, err, sizeof(err))) {
		r.base->ops->destroy(r.base);
		drain_ring();
		return 0;
	}
	for (unsigned i = 0; i < MAX_OPS && script_more(&s); i++)
		op(&r, &s);

	/* The clients leave, the core hands back what it holds, the backend
	 * stops: with nothing in flight and nothing left over. */
	for (unsigned i = 0; i < CONTROL_CLIENTS; i++) {
		if (r.clients[i].fd >= 0)
			close(r.clients[i].fd);
		r.clients[i].fd = -1;
	}
	while (r.nheld)
		core_complete(&r, 0, false);
	for (unsigned turns = 0; !r.base->ops->stop(r.base); turns++) {
		if (turns == 600)
			die("the backend did not stop within a minute");
		settle(&r);
		loop.test_skew_us += 100000; /* for a peer that does not read its answers */
	}
	struct gg_host_backend_stats st;
	gg_host_backend_get_stats(r.b, &st);
	if (st.connections || st.jobs || st.regions || st.core_steps || st.sum_bytes)
		die("the backend stopped with something left");
	r.base->ops->destroy(r.base);
	drain_ring();
	if (fuzz_open_fds() != fds_before)
		die("a file descriptor leaked");
	return 0;
}
