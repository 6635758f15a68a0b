/* libFuzzer target: the client library (client.c) against a gateway that
 * answers with whatever a script (fuzz_script.h) says: ACCEPTs with any
 * limits, DONEs for any step with any status, ERROR, REFUSE, raw packets
 * with or without descriptors, a closed connection; meanwhile the library
 * opens sessions, starts all-reduces on private memory and in shared
 * buffers, waits (without blocking), frees requests and buffers, and
 * closes. The target is linked with -Wl,--wrap=connect: the library's
 * connect() gets one end of a socketpair whose other end this file plays,
 * on one thread, so a run is the same every time.
 *
 * Checks: every call returns a code of enum gg_errc that agrees with its
 * gg_error (a message for a failure, none for success); what the library
 * sends is well formed (MAP with exactly one sealed memfd of the size it
 * names, ALLREDUCE steps numbered 1, 2, 3, ...); a request completes only
 * after the gateway answered its step; and nothing leaks: memory, mappings
 * or descriptors. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "control_proto.h"
#include "fuzz_check.h"
#include "fuzz_script.h"
#include "gradgate.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int __real_connect(int fd, const struct sockaddr *addr, socklen_t len);
int __wrap_connect(int fd, const struct sockaddr *addr, socklen_t len);

#define MAX_OPS 200
#define MAX_REQUESTS 16
#define MAX_BUFFERS 8
#define MAX_COUNT 4096u
#define EARLY_MAX 16

struct request {
	struct gg_request *req;
	void *mem;         /* private memory, or NULL for a shared buffer */
	uint64_t heard_at; /* what the gateway had sent when it started */
};

struct run {
	struct gg_session *s;
	int gw;                  /* the gateway's end, -1: none */
	struct request reqs[MAX_REQUESTS];
	void *buffers[MAX_BUFFERS];
	size_t buffer_bytes[MAX_BUFFERS];
	uint64_t announced;      /* the last ALLREDUCE seq read from the library */
	uint64_t answered_to;    /* DONE sent for steps up to here */
	uint64_t sent;           /* packets the gateway sent */
	/* What the gateway sends before the library connects. */
	union gg_ctrl_msg early[EARLY_MAX];
	size_t early_len[EARLY_MAX];
	unsigned nearly;
};

static struct run *current; /* for __wrap_connect */
static int verbose = -1;    /* GG_FUZZ_VERBOSE set: every call's outcome */

static _Noreturn void die(const char *what)
{
	fuzz_fail("fuzz_client", what);
}

/* Sends one packet to the library with `nfds` descriptors (of /dev/null). */
static void gw_send(struct run *r, const void *msg, size_t len, unsigned nfds)
{
	int fds[FUZZ_MAX_PASSED_FDS] = { -1, -1 };

	if (r->gw < 0)
		return;
	nfds = nfds > FUZZ_MAX_PASSED_FDS ? FUZZ_MAX_PASSED_FDS : nfds;
	for (unsigned i = 0; i < nfds; i++)
		if ((fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0)
			nfds = i;
	if (fuzz_send_fds(r->gw, msg, len, fds, nfds) >= 0)
		r->sent++;
	for (unsigned i = 0; i < FUZZ_MAX_PASSED_FDS; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

/* A message from the gateway: queued until the library connects. */
static void gw_message(struct run *r, const union gg_ctrl_msg *m, size_t len)
{
	if (r->gw >= 0) {
		gw_send(r, m, len, 0);
	} else if (!r->s && r->nearly < EARLY_MAX) {
		r->early[r->nearly] = *m;
		r->early_len[r->nearly++] = len;
	}
}

int __wrap_connect(int fd, const struct sockaddr *addr, socklen_t len)
{
	struct run *r = current;
	int sv[2];

	if (!r)
		return __real_connect(fd, addr, len);
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv))
		return -1;
	if (dup3(sv[0], fd, O_CLOEXEC) < 0) {
		close(sv[0]);
		close(sv[1]);
		return -1;
	}
	close(sv[0]);
	r->gw = sv[1];
	for (unsigned i = 0; i < r->nearly; i++)
		gw_send(r, &r->early[i], r->early_len[i], 0);
	/* A gateway with nothing to say hangs up, rather than let HELLO wait
	 * out its ten seconds. */
	if (!r->nearly) {
		close(r->gw);
		r->gw = -1;
	}
	r->nearly = 0;
	return 0;
}

/* Reads what the library sent and checks it. */
static void gw_drain(struct run *r)
{
	union gg_ctrl_msg m;
	char why[160];
	_Alignas(struct cmsghdr) char cbuf[CMSG_SPACE(4 * sizeof(int))];

	while (r->gw >= 0) {
		struct iovec iov = { .iov_base = &m, .iov_len = sizeof(m) };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
				     .msg_controllen = sizeof(cbuf) };
		ssize_t n = recvmsg(r->gw, &mh, MSG_DONTWAIT | MSG_TRUNC | MSG_CMSG_CLOEXEC);
		if (n <= 0)
			return;
		int fds[4], nfds = 0;
		for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
			size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			for (size_t i = 0; i < k && nfds < 4; i++)
				memcpy(&fds[nfds++], CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
		}
		int type = gg_ctrl_check(&m, (size_t)n, why, sizeof(why));
		if (type == GG_CTRL_MAP) {
			struct stat st;
			int seals = nfds == 1 ? fcntl(fds[0], F_GET_SEALS) : -1;
			if (nfds != 1 || seals < 0 || !(seals & F_SEAL_SHRINK) || fstat(fds[0], &st) ||
			    (uint64_t)st.st_size != m.map.size_bytes || m.map.region >= GG_CTRL_MAX_REGIONS)
				die("a MAP without one sealed memfd of its size");
		} else if (nfds) {
			die("the library sent descriptors with a message other than MAP");
		} else if (type == GG_CTRL_ALLREDUCE) {
			if (m.allreduce.seq != r->announced + 1 || !m.allreduce.count || !gg_dtype_size(m.allreduce.dtype))
				die("an ALLREDUCE out of order or of no size");
			r->announced = m.allreduce.seq;
		} else if (type != GG_CTRL_HELLO && type != GG_CTRL_UNMAP) {
			die("the library sent what a client never sends");
		}
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
	}
}

/* ---- the gateway's answers ------------------------------------------------- */

static void op_accept(struct run *r, struct script *s)
{
	union gg_ctrl_msg m;
	size_t len = gg_ctrl_init(&m, GG_CTRL_ACCEPT);
	uint8_t version = script_u8(s);
	char site[GG_CTRL_NAME_SIZE + 8];

	m.accept.version = version ? version : GG_CTRL_VERSION;
	m.accept.max_inflight = script_u8(s);
	m.accept.max_message_bytes = script_u32(s);
	m.accept.max_region_bytes = script_u32(s);
	if (!m.accept.max_region_bytes)
		m.accept.max_region_bytes = 2 * m.accept.max_message_bytes + 4096;
	m.accept.max_regions = script_u8(s);
	m.accept.step_timeout_ms = script_u16(s);
	m.accept.answer_grace_ms = script_u16(s);
	gg_ctrl_set_text(m.accept.site, sizeof(m.accept.site), script_text(s, site, sizeof(site)));
	gw_message(r, &m, len);
}

static void op_done(struct run *r, struct script *s)
{
	union gg_ctrl_msg m;
	size_t len = gg_ctrl_init(&m, GG_CTRL_DONE);
	uint8_t seq = script_u8(s);
	char text[GG_CTRL_TEXT_SIZE];

	m.done.seq = seq ? seq : r->answered_to + 1;
	m.done.status = -(int32_t)script_u8(s);
	gg_ctrl_set_text(m.done.message, sizeof(m.done.message), script_text(s, text, sizeof(text)));
	if (m.done.seq == r->answered_to + 1)
		r->answered_to = m.done.seq;
	gw_message(r, &m, len);
}

static void op_error(struct run *r, struct script *s)
{
	union gg_ctrl_msg m;
	size_t len = gg_ctrl_init(&m, script_u8(s) & 1 ? GG_CTRL_REFUSE : GG_CTRL_ERROR);
	char text[GG_CTRL_TEXT_SIZE];

	m.error.code = -(int32_t)script_u8(s);
	m.error.seq = script_u64(s);
	gg_ctrl_set_text(m.error.message, sizeof(m.error.message), script_text(s, text, sizeof(text)));
	gw_message(r, &m, len);
}

static void gw_close(struct run *r)
{
	if (r->gw >= 0)
		close(r->gw);
	r->gw = -1;
}

/* ---- the library's calls ---------------------------------------------------- */

/* What every call promises about its result and its gg_error. */
static void check_result(int rc, const struct gg_error *err)
{
	if (verbose)
		fprintf(stderr, "%d %s\n", rc, err->message);
	if (rc > 0 || rc < GG_ERR_LIMIT || err->code != rc)
		die("a call returned a code outside enum gg_errc, or not the one in its gg_error");
	if (rc ? !err->message[0] || strchr(err->message, '\n') : err->message[0] != '\0')
		die("a failure without a one-line message, or a success with one");
}

static void op_open(struct run *r, struct script *s)
{
	struct gg_error err;
	int rank = script_u8(s), nranks = script_u8(s);

	if (r->s)
		return;
	current = r;
	int rc = gg_session_open("unix:/gradgate-fuzz/control.sock", "fuzz-job", rank, nranks, &r->s, &err);
	current = NULL;
	check_result(rc, &err);
	if (rc ? r->s != NULL : r->s == NULL)
		die("gg_session_open returned a session and an error, or neither");
	if (rc)
		gw_close(r);
	r->nearly = 0;
	r->announced = r->answered_to = 0;
	if (!rc) {
		struct gg_session_info info = { .size = sizeof(info) };
		if (gg_session_get_info(r->s, &info) || !info.max_inflight || info.max_inflight > GG_CTRL_MAX_INFLIGHT || !info.max_message_bytes)
			die("a session with limits it cannot use");
	}
}

static void op_allreduce(struct run *r, struct script *s)
{
	unsigned which = script_u8(s) % (MAX_BUFFERS + 1);
	uint32_t offset = script_u32(s);
	size_t count = 1 + script_u16(s) % MAX_COUNT;
	enum gg_dtype dtype = (enum gg_dtype)(script_u8(s) % 4);
	uint32_t tensor = script_u8(s);
	int timeout_ms = script_u16(s);
	struct request *q = NULL;
	struct gg_error err;
	void *buf;

	for (unsigned i = 0; i < MAX_REQUESTS && !q; i++)
		if (!r->reqs[i].req)
			q = &r->reqs[i];
	if (!q)
		return;
	if (which == 0) {
		/* Private memory, of the size the call will read. */
		size_t esize = gg_dtype_size(dtype) ? gg_dtype_size(dtype) : 4;
		if (!(q->mem = malloc(count * esize)))
			return;
		memset(q->mem, 0x3c, count * esize);
		buf = q->mem;
	} else if (r->buffers[which - 1]) {
		/* Anywhere in a shared buffer (its pages), running past its end
		 * or not. */
		size_t page = (size_t)sysconf(_SC_PAGESIZE);
		buf = (char *)r->buffers[which - 1] + offset % ((r->buffer_bytes[which - 1] + page - 1) / page * page);
	} else {
		return;
	}
	int rc = gg_allreduce_start(r->s, buf, count, dtype, tensor, timeout_ms, &q->req, &err);
	check_result(rc, &err);
	if (rc ? q->req != NULL : q->req == NULL)
		die("gg_allreduce_start returned a request and an error, or neither");
	if (rc) {
		free(q->mem);
		q->mem = NULL;
		return;
	}
	q->heard_at = r->sent;
}

static void request_free(struct request *q)
{
	gg_request_free(q->req);
	free(q->mem);
	*q = (struct request){ 0 };
}

static void op_wait(struct run *r, struct script *s)
{
	struct request *q = &r->reqs[script_u8(s) % MAX_REQUESTS];
	struct gg_error err;

	if (!q->req)
		return;
	int rc = gg_wait(q->req, 0, &err);
	check_result(rc, &err);
	if (rc != GG_ERR_AGAIN && q->heard_at == r->sent && r->s && r->gw >= 0)
		die("a request finished though the gateway said nothing since it started");
}

static void op_buffer_alloc(struct run *r, struct script *s)
{
	size_t bytes = script_u16(s);
	struct gg_error err;
	void *buf;

	for (unsigned i = 0; i < MAX_BUFFERS; i++) {
		if (r->buffers[i])
			continue;
		int rc = gg_buffer_alloc(r->s, bytes, &buf, &err);
		check_result(rc, &err);
		if (rc ? buf != NULL : buf == NULL)
			die("gg_buffer_alloc returned a buffer and an error, or neither");
		if (!rc) {
			memset(buf, 0x5a, bytes);
			r->buffers[i] = buf;
			r->buffer_bytes[i] = bytes;
		}
		return;
	}
}

static void op_buffer_free(struct run *r, struct script *s)
{
	void **b = &r->buffers[script_u8(s) % MAX_BUFFERS];
	struct gg_error err;

	if (!*b)
		return;
	int rc = gg_buffer_free(r->s, *b, &err);
	check_result(rc, &err);
	if (rc)
		die("gg_buffer_free refused a buffer of the session");
	*b = NULL;
}

static void session_close(struct run *r)
{
	/* gg_session_close() waits for the gateway's end of the connection,
	 * which a gateway sends once it is done with the session; this one
	 * runs on the caller's thread, so it ends its side first. */
	if (r->gw >= 0)
		shutdown(r->gw, SHUT_WR);
	gg_session_close(r->s);
	r->s = NULL;
	memset(r->buffers, 0, sizeof(r->buffers)); /* unmapped with the session */
	for (unsigned i = 0; i < MAX_REQUESTS; i++) {
		struct gg_error err;
		if (r->reqs[i].req && gg_wait(r->reqs[i].req, 0, &err) == GG_ERR_AGAIN)
			die("a request still in progress after its session closed");
	}
	gw_close(r);
}

static void op(struct run *r, struct script *s)
{
	enum client_op what = (enum client_op)(script_u8(s) % CLIENT_OPS);
	const uint8_t *bytes;
	size_t len;

	switch (what) {
	case CLIENT_OPEN:
		op_open(r, s);
		break;
	case CLIENT_GW_ACCEPT:
		op_accept(r, s);
		break;
	case CLIENT_GW_DONE:
		op_done(r, s);
		break;
	case CLIENT_GW_ERROR:
		op_error(r, s);
		break;
	case CLIENT_GW_RAW: {
		union gg_ctrl_msg m;
		bytes = script_bytes(s, script_u16(s) % (sizeof(m) + 64), &len);
		uint8_t nfds = script_u8(s) % 3;
		if (len <= sizeof(m) && !nfds) {
			memset(&m, 0, sizeof(m));
			memcpy(&m, bytes, len);
			gw_message(r, &m, len);
		} else {
			gw_send(r, bytes, len, nfds);
		}
		break;
	}
	case CLIENT_GW_CLOSE:
		gw_close(r);
		break;
	case CLIENT_ALLREDUCE:
		if (r->s)
			op_allreduce(r, s);
		break;
	case CLIENT_WAIT:
		op_wait(r, s);
		break;
	case CLIENT_FREE_REQUEST:
		request_free(&r->reqs[script_u8(s) % MAX_REQUESTS]);
		break;
	case CLIENT_BUFFER_ALLOC:
		if (r->s)
			op_buffer_alloc(r, s);
		break;
	case CLIENT_BUFFER_FREE:
		if (r->s)
			op_buffer_free(r, s);
		break;
	case CLIENT_CLOSE:
		if (r->s)
			session_close(r);
		break;
	case CLIENT_OPS:
		break;
	}
	gw_drain(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct script s = { data, size };
	static struct run r;
	unsigned fds_before = fuzz_open_fds();

	if (verbose < 0)
		verbose = getenv("GG_FUZZ_VERBOSE") != NULL;
	memset(&r, 0, sizeof(r));
	r.gw = -1;
	for (unsigned i = 0; i < MAX_OPS && script_more(&s); i++)
		op(&r, &s);
	if (r.s)
		session_close(&r);
	for (unsigned i = 0; i < MAX_REQUESTS; i++)
		request_free(&r.reqs[i]);
	gw_close(&r);
	if (fuzz_open_fds() != fds_before)
		die("a file descriptor leaked");
	return 0;
}
