/* The client library (include/gradgate.h): one control connection per
 * session, shared-memory regions for the data (or the caller's GPU
 * memory, or the job's NCCL communicator). */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "control_conn.h"
#include "control_proto.h"
#include "cuda_driver.h"
#include "gg_build_config.h"
#include "gg_common.h"
#include "nccl_lib.h"

#define OPEN_TIMEOUT_MS 10000
#define GRACE_MS 2000           /* past a step's deadline and the gateway's own grace: the gateway is lost */
#define FINISH_MS 1000          /* for a closing session's NCCL communicator to flush */
#define MIN_REGION_BYTES (4u << 20)
#define CLOSE_WAIT_MS 2000      /* for the gateway to let go of a closing session */

struct region {
	unsigned char *base; /* NULL: slot free */
	uint64_t size;
	unsigned users;      /* requests in flight with their data here */
	bool retired;        /* unmapped once users drops to 0 */
	bool shared;         /* the caller's (gg_buffer_alloc, or device), not the library's staging */
	bool device;         /* a CUDA allocation (gg_allreduce_cuda): base is its device address */
	uint64_t buffer_id;  /* device: the allocation's unique id */
	uint64_t last_used;  /* device: the session's step count when last used */
};

struct gg_request {
	struct gg_session *s; /* NULL once finished or the session is gone */
	struct gg_request *next;
	uint64_t seq;
	uint32_t tensor_id;
	enum gg_dtype dtype;
	uint64_t bytes;
	void *buf;            /* NULL once detached by gg_request_free, and for NCCL steps */
	unsigned region;      /* GG_CTRL_REGION_NCCL: the step goes through the communicator */
	uint64_t offset;
	uint64_t deadline_ms; /* the step's deadline plus grace_ms */
	uint64_t grace_ms;    /* how long past its deadline the gateway may answer */
	bool done;
	bool freed;           /* the caller let go; the session frees it */
	int status;
	uint32_t flags;       /* its DONE's GG_CTRL_DONE_* */
	char message[GG_ERROR_MESSAGE_MAX];
};

/* Where the session stands with the job's NCCL communicator. */
enum nccl_state {
	NCCL_NONE,    /* no gg_allreduce_nccl yet */
	NCCL_ASKED,   /* NCCL_JOIN sent; its NCCL_ID awaited */
	NCCL_GOT_ID,  /* NCCL_ID here; joining the communicator */
	NCCL_UP,      /* NCCL steps go through nccl_comm */
	NCCL_ABORTED, /* no more NCCL steps: nccl_code and nccl_why say why */
};

struct gg_session {
	int fd;
	char job[GG_CTRL_NAME_SIZE];
	int rank;
	int nranks;
	struct gg_session_info info;
	uint64_t max_region_bytes;
	uint64_t answer_grace_ms;       /* the gateway's, past a step's deadline */
	unsigned max_regions;
	unsigned buffers;               /* shared buffers held */
	bool handed_gpu;                /* the gateway was given a GPU allocation (MAP_CUDA) */
	uint64_t next_seq;
	struct gg_request *head, *tail; /* in flight, oldest first */
	unsigned inflight;
	struct region regions[GG_CTRL_MAX_REGIONS];
	int current;                    /* region new requests go to; -1: none yet */
	int failed;                     /* 0, or the error that ended the session */
	char failed_msg[GG_ERROR_MESSAGE_MAX];
	/* GPU mode with NCCL (gg_allreduce_nccl): the job's communicator, in
	 * which this rank is rank `rank` and the gateway the last rank. */
	enum nccl_state nccl_state;
	struct gg_ctrl_nccl_id nccl_id; /* NCCL_GOT_ID, NCCL_UP: the gateway's answer to NCCL_JOIN */
	void *nccl_comm;                /* the ncclComm_t while it is being joined or up; else NULL */
	int nccl_device;                /* NCCL_UP: the CUDA device it was made on */
	int nccl_code;                  /* NCCL_ABORTED: the error NCCL steps fail with */
	char nccl_why[GG_ERROR_MESSAGE_MAX];
};

static int set_ok(struct gg_error *err)
{
	if (err) {
		err->code = GG_OK;
		err->message[0] = '\0';
	}
	return GG_OK;
}

static const char *site_of(const struct gg_session *s)
{
	return s->info.site[0] ? s->info.site : "?";
}

/* A failure a gateway may report: a code of enum gg_errc (GG_ERR_LIMIT is
 * the last) other than GG_OK and GG_ERR_AGAIN, which gg_wait() returns for
 * a request still in progress: a step that "failed" with it would look in
 * progress for ever. Only these reach the caller. */
static bool failure_code_ok(int code)
{
	return code < 0 && code >= GG_ERR_LIMIT && code != GG_ERR_AGAIN;
}

static void region_release(struct gg_session *s, unsigned id, bool tell_gateway)
{
	struct region *r = &s->regions[id];

	if (tell_gateway && s->fd >= 0) {
		union gg_ctrl_msg m;
		size_t len = gg_ctrl_init(&m, GG_CTRL_UNMAP);
		m.unmap.region = id;
		/* A lost UNMAP surfaces as a lost connection on the next read. */
		(void)gg_ctrl_send(s->fd, &m, len, -1, gg_ctrl_now_ms() + OPEN_TIMEOUT_MS);
	}
	if (!r->device)
		munmap(r->base, r->size);
	memset(r, 0, sizeof(*r));
	if (s->current == (int)id)
		s->current = -1;
}

static void request_finish(struct gg_request *r, int status, const char *message)
{
	r->done = true;
	r->status = status;
	gg_ctrl_set_text(r->message, sizeof(r->message), message);
	r->s = NULL;
	if (r->freed)
		free(r);
}

/* The session's communicator is given up: ncclCommAbort() ends this
 * rank's calls still enqueued on the caller's stream, which may never
 * finish otherwise (a rank or the gateway gone), and the session's NCCL
 * steps fail from now on with `code` and the message. The first reason
 * stays. */
GG_PRINTF(3, 4) static void nccl_abort(struct gg_session *s, int code, const char *fmt, ...)
{
	va_list ap;

	gg_nccl_abort(s->nccl_comm);
	s->nccl_comm = NULL;
	if (s->nccl_state == NCCL_ABORTED)
		return;
	s->nccl_state = NCCL_ABORTED;
	s->nccl_code = code;
	va_start(ap, fmt);
	vsnprintf(s->nccl_why, sizeof(s->nccl_why), fmt, ap);
	va_end(ap);
}

/* Ends the session: every request in flight fails with `code`; later calls
 * return it. */
GG_PRINTF(3, 4) static void session_fail(struct gg_session *s, int code, const char *fmt, ...)
{
	va_list ap;

	if (s->failed)
		return;
	va_start(ap, fmt);
	vsnprintf(s->failed_msg, sizeof(s->failed_msg), fmt, ap);
	va_end(ap);
	s->failed = code;
	if (s->fd >= 0)
		close(s->fd);
	s->fd = -1;
	/* Without the gateway the communicator's calls may wait for ever. */
	if (s->nccl_comm)
		nccl_abort(s, code, "%s", s->failed_msg);
	while (s->head) {
		struct gg_request *r = s->head;
		char msg[GG_ERROR_MESSAGE_MAX + 64];
		s->head = r->next;
		snprintf(msg, sizeof(msg), "step %llu (tensor %u): %s", (unsigned long long)r->seq, r->tensor_id,
			 s->failed_msg);
		request_finish(r, code, msg);
	}
	s->tail = NULL;
	s->inflight = 0;
	/* Shared buffers are the caller's memory: they stay readable until
	 * gg_buffer_free() or gg_session_close(). */
	for (unsigned i = 0; i < GG_ARRAY_LEN(s->regions); i++) {
		struct region *reg = &s->regions[i];
		if (!reg->base)
			continue;
		reg->users = 0;
		/* Device regions are the gateway's views of the caller's memory. */
		if (!reg->shared || reg->retired || reg->device) {
			s->buffers -= reg->shared;
			region_release(s, i, false);
		}
	}
}

static void on_done(struct gg_session *s, const struct gg_ctrl_done *d)
{
	struct gg_request *r = s->head;
	const bool aborted = d->flags & GG_CTRL_DONE_NCCL_ABORTED;

	if (!r || d->seq != r->seq) {
		session_fail(s, GG_ERR_PROTOCOL, "the gateway of site %s answered step %llu, but step %llu was next",
			     site_of(s), (unsigned long long)d->seq, r ? (unsigned long long)r->seq : 0ull);
		return;
	}
	if (d->status && !failure_code_ok(d->status)) {
		session_fail(s, GG_ERR_PROTOCOL, "the gateway of site %s answered step %llu with status %d",
			     site_of(s), (unsigned long long)d->seq, (int)d->status);
		return;
	}
	/* The gateway flags the DONEs of ranks that have its NCCL_ID. */
	if (aborted && s->nccl_state != NCCL_GOT_ID && s->nccl_state != NCCL_UP && s->nccl_state != NCCL_ABORTED) {
		session_fail(s, GG_ERR_PROTOCOL, "the gateway of site %s answered step %llu saying it aborted an NCCL "
			     "communicator this session has not joined", site_of(s), (unsigned long long)d->seq);
		return;
	}
	s->head = r->next;
	if (!s->head)
		s->tail = NULL;
	s->inflight--;
	r->flags = d->flags;

	/* An NCCL step's result is on the caller's stream: nothing to copy. */
	if (r->region != GG_CTRL_REGION_NCCL) {
		struct region *reg = &s->regions[r->region];
		if (d->status == GG_OK && r->buf && !reg->shared)
			memcpy(r->buf, reg->base + r->offset, r->bytes);
		if (--reg->users == 0 && reg->retired) {
			s->buffers -= reg->shared;
			region_release(s, r->region, true);
		}
	}
	if (aborted) {
		if (d->status && d->message[0])
			nccl_abort(s, d->status, "%s", d->message);
		else
			nccl_abort(s, d->status ? d->status : GG_ERR_SYSTEM, "the gateway of site %s aborted the NCCL "
				   "communicator of job '%s' (as step %llu ended)", site_of(s), s->job,
				   (unsigned long long)d->seq);
	}
	if (d->status && !d->message[0]) {
		char msg[GG_ERROR_MESSAGE_MAX];
		snprintf(msg, sizeof(msg), "step %llu (tensor %u): %s (the gateway of site %s gave no reason)",
			 (unsigned long long)r->seq, r->tensor_id, gg_strerror(d->status), site_of(s));
		request_finish(r, d->status, msg);
		return;
	}
	request_finish(r, d->status, d->message);
}

/* Handles what the gateway sent until `deadline_ms` passes or nothing more
 * is waiting after at least one message. */
static void pump(struct gg_session *s, uint64_t deadline_ms)
{
	union gg_ctrl_msg m;
	char why[160];

	while (!s->failed) {
		ssize_t n = gg_ctrl_recv(s->fd, &m, deadline_ms);
		if (n == -EAGAIN)
			return;
		if (n == 0) {
			session_fail(s, GG_ERR_CLOSED, "the gateway of site %s closed the connection", site_of(s));
			return;
		}
		if (n == -EPROTO) {
			session_fail(s, GG_ERR_PROTOCOL, "the gateway of site %s sent file descriptors", site_of(s));
			return;
		}
		if (n < 0) {
			session_fail(s, GG_ERR_CLOSED, "connection to the gateway of site %s lost: %s", site_of(s),
				     strerror((int)-n));
			return;
		}
		int type = gg_ctrl_check(&m, (size_t)n, why, sizeof(why));
		if (type == GG_CTRL_DONE) {
			on_done(s, &m.done);
		} else if (type == GG_CTRL_NCCL_ID && s->nccl_state == NCCL_ASKED) {
			s->nccl_id = m.nccl_id;
			s->nccl_state = NCCL_GOT_ID;
		} else if (type == GG_CTRL_ERROR) {
			session_fail(s, failure_code_ok(m.error.code) ? m.error.code : GG_ERR_PROTOCOL, "%s",
				     m.error.message[0] ? m.error.message : "the gateway ended the session without a reason");
		} else if (type < 0) {
			session_fail(s, GG_ERR_PROTOCOL, "the gateway of site %s sent a bad message: %s", site_of(s),
				     why);
		} else {
			session_fail(s, GG_ERR_PROTOCOL, "the gateway of site %s sent an unexpected %s", site_of(s),
				     gg_ctrl_type_name((unsigned)type));
		}
		deadline_ms = 0; /* drain what is already there, then return */
	}
}

/* A send failed: the gateway's own last words (ERROR) say more than the
 * errno, so read what it sent before the session ends. */
static void send_failed(struct gg_session *s, int rc, const char *what)
{
	if (rc == -EPIPE || rc == -ECONNRESET)
		pump(s, 0);
	if (!s->failed)
		session_fail(s, GG_ERR_CLOSED, "%s to the gateway of site %s: %s", what, site_of(s), strerror(-rc));
}

/* HELLO and its answer, by `deadline` (gg_ctrl_now_ms), the open's. */
static int handshake(struct gg_session *s, const char *path, int nranks, uint64_t deadline, struct gg_error *err)
{
	union gg_ctrl_msg m;
	char why[160];
	size_t len = gg_ctrl_init(&m, GG_CTRL_HELLO);

	m.hello.version = GG_CTRL_VERSION;
	m.hello.rank = (uint32_t)s->rank;
	m.hello.nranks = (uint32_t)nranks;
	gg_ctrl_set_text(m.hello.job, sizeof(m.hello.job), s->job);
	int rc = gg_ctrl_send(s->fd, &m, len, -1, deadline);
	/* A gateway that refuses at once has closed already; its REFUSE waits. */
	if (rc && rc != -EPIPE && rc != -ECONNRESET)
		return gg_ctrl_error(err, GG_ERR_CONNECT, "sending HELLO to unix:%s: %s", path, strerror(-rc));

	ssize_t n = gg_ctrl_recv(s->fd, &m, deadline);
	if (n == -EAGAIN)
		return gg_ctrl_error(err, GG_ERR_TIMEOUT, "the gateway at unix:%s did not answer HELLO within %d ms of "
			       "the open", path, OPEN_TIMEOUT_MS);
	if (n == 0 || n == -ECONNRESET)
		return gg_ctrl_error(err, GG_ERR_CLOSED, "the gateway at unix:%s closed the connection without an answer",
			       path);
	if (n < 0)
		return gg_ctrl_error(err, n == -EPROTO ? GG_ERR_PROTOCOL : GG_ERR_CONNECT,
			       "receiving the answer to HELLO from unix:%s: %s", path,
			       n == -EPROTO ? "it carried file descriptors" : strerror((int)-n));
	int type = gg_ctrl_check(&m, (size_t)n, why, sizeof(why));
	if (type == GG_CTRL_REFUSE) {
		/* The gateway's code where it says more than a refusal: out of
		 * memory, shutting down. */
		int code = m.error.code == GG_ERR_NOMEM || m.error.code == GG_ERR_CLOSED ? m.error.code : GG_ERR_REFUSED;
		return gg_ctrl_error(err, code, "%s",
			       m.error.message[0] ? m.error.message : "the gateway refused the session without a reason");
	}
	if (type != GG_CTRL_ACCEPT)
		return gg_ctrl_error(err, GG_ERR_PROTOCOL, "the gateway at unix:%s answered HELLO with %s", path,
			       type < 0 ? why : gg_ctrl_type_name((unsigned)type));

	const struct gg_ctrl_accept *a = &m.accept;
	if (a->version != GG_CTRL_VERSION || a->max_inflight < 1 || a->max_inflight > GG_CTRL_MAX_INFLIGHT ||
	    a->max_regions < 2 || a->max_message_bytes == 0 ||
	    a->max_region_bytes < a->max_message_bytes + GG_CTRL_ALIGN || a->step_timeout_ms == 0)
		return gg_ctrl_error(err, GG_ERR_PROTOCOL,
			       "the gateway at unix:%s accepted with limits this library cannot use (version %u, "
			       "%u in flight, %u regions)", path, (unsigned)a->version, (unsigned)a->max_inflight,
			       (unsigned)a->max_regions);
	memcpy(s->info.site, a->site, sizeof(s->info.site));
	s->info.max_message_bytes = a->max_message_bytes;
	s->info.max_inflight = GG_MIN(a->max_inflight, a->max_regions - 1);
	s->info.step_timeout_ms = a->step_timeout_ms;
	s->max_region_bytes = a->max_region_bytes;
	s->answer_grace_ms = a->answer_grace_ms;
	s->max_regions = GG_MIN(a->max_regions, GG_CTRL_MAX_REGIONS);
	/* Staging needs a region per request in flight and one to grow into. */
	s->info.max_buffers = s->max_regions > s->info.max_inflight + 1 ? s->max_regions - s->info.max_inflight - 1 : 0;
	return 0;
}

GRADGATE_API int gg_session_open(const char *endpoint, const char *job, int rank, int nranks,
				 struct gg_session **out, struct gg_error *err)
{
	struct sockaddr_un addr;
	char why[160];
	int rc;

	if (!out)
		return gg_ctrl_error(err, GG_ERR_INVALID, "gg_session_open: out is NULL");
	*out = NULL;
	if (!job)
		return gg_ctrl_error(err, GG_ERR_INVALID, "gg_session_open: job is NULL");
	if (!gg_ctrl_job_name_ok(job, why, sizeof(why)))
		return gg_ctrl_error(err, GG_ERR_INVALID, "%s", why);
	if (nranks < 1 || nranks > (int)GG_CTRL_MAX_RANKS)
		return gg_ctrl_error(err, GG_ERR_INVALID, "nranks %d is outside 1..%u", nranks, GG_CTRL_MAX_RANKS);
	if (rank < 0 || rank >= nranks)
		return gg_ctrl_error(err, GG_ERR_INVALID, "rank %d is outside 0..%d", rank, nranks - 1);
	if ((rc = gg_ctrl_parse_endpoint(endpoint, &addr, err)))
		return rc;

	struct gg_session *s = calloc(1, sizeof(*s));
	if (!s)
		return gg_ctrl_error(err, GG_ERR_NOMEM, "out of memory for a session");
	snprintf(s->job, sizeof(s->job), "%s", job);
	s->rank = rank;
	s->nranks = nranks;
	s->next_seq = 1;
	s->current = -1;
	/* One deadline for the connect and the handshake: at most 10 s in all. */
	const uint64_t deadline = gg_ctrl_now_ms() + OPEN_TIMEOUT_MS;
	s->fd = gg_ctrl_connect(&addr, deadline, err);
	if (s->fd < 0) {
		rc = s->fd;
		free(s);
		return rc;
	}
	if ((rc = handshake(s, addr.sun_path, nranks, deadline, err))) {
		close(s->fd);
		free(s);
		return rc;
	}
	*out = s;
	return set_ok(err);
}

/* The first version of struct gg_session_info ended with max_buffers: its
 * sizeof, padding included, is what a program built against it passes. */
#define SESSION_INFO_ALIGN _Alignof(struct gg_session_info)
#define SESSION_INFO_V1_SIZE                                                                                  \
	((offsetof(struct gg_session_info, max_buffers) + sizeof(uint32_t) + SESSION_INFO_ALIGN - 1) /          \
	 SESSION_INFO_ALIGN * SESSION_INFO_ALIGN)

GRADGATE_API int gg_session_get_info(const struct gg_session *s, struct gg_session_info *info)
{
	if (!s || !info || info->size < SESSION_INFO_V1_SIZE)
		return GG_ERR_INVALID;
	struct gg_session_info full = s->info;
	full.size = GG_MIN(info->size, sizeof(full));
	memcpy(info, &full, full.size);
	return 0;
}

GRADGATE_API const char *gg_version(void)
{
	return GG_VERSION;
}

/* Finds room for `len` bytes in region `id` after the requests in flight
 * there, which were placed in FIFO order around it like a ring. */
static bool region_fit(const struct gg_session *s, unsigned id, uint64_t len, uint64_t *offset)
{
	const struct region *reg = &s->regions[id];
	const struct gg_request *oldest = NULL, *newest = NULL;

	for (const struct gg_request *r = s->head; r; r = r->next) {
		if (r->region != id)
			continue;
		if (!oldest)
			oldest = r;
		newest = r;
	}
	if (!oldest) {
		*offset = 0;
		return len <= reg->size;
	}
	uint64_t lo = oldest->offset;
	uint64_t hi = newest->offset + ((newest->bytes + GG_CTRL_ALIGN - 1) & ~(uint64_t)(GG_CTRL_ALIGN - 1));
	if (newest->offset >= lo) {
		if (reg->size - hi >= len) {
			*offset = hi;
			return true;
		}
		*offset = 0;
		return lo >= len;
	}
	*offset = hi;
	return lo - hi >= len;
}

/* Maps a new region of `size` bytes (a multiple of the page size) and
 * hands it to the gateway. Returns its id, or a negative gg_errc with err. */
static int region_map(struct gg_session *s, uint64_t size, bool shared, uint64_t deadline_ms, const char *what,
		      struct gg_error *err)
{
	unsigned id;

	for (id = 0; id < s->max_regions; id++)
		if (!s->regions[id].base)
			break;
	if (id == s->max_regions)
		return gg_ctrl_error(err, GG_ERR_BUSY, "%s: all %u shared regions are in use", what, s->max_regions);

	int fd = memfd_create("gradgate", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return gg_ctrl_error(err, GG_ERR_SYSTEM, "%s: memfd_create: %s", what, strerror(errno));
	if (ftruncate(fd, (off_t)size) || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) {
		int e = errno;
		close(fd);
		return gg_ctrl_error(err, GG_ERR_SYSTEM, "%s: preparing a %llu-byte shared region: %s", what,
			       (unsigned long long)size, strerror(e));
	}
	void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (base == MAP_FAILED) {
		int e = errno;
		close(fd);
		return gg_ctrl_error(err, e == ENOMEM ? GG_ERR_NOMEM : GG_ERR_SYSTEM,
			       "%s: mapping a %llu-byte shared region: %s", what, (unsigned long long)size,
			       strerror(e));
	}

	union gg_ctrl_msg m;
	size_t mlen = gg_ctrl_init(&m, GG_CTRL_MAP);
	m.map.region = id;
	m.map.size_bytes = size;
	int rc = gg_ctrl_send(s->fd, &m, mlen, fd, deadline_ms);
	close(fd);
	if (rc) {
		munmap(base, size);
		send_failed(s, rc, "sending a shared region");
		return gg_ctrl_error(err, s->failed, "%s: %s", what, s->failed_msg);
	}
	s->regions[id] = (struct region){ .base = base, .size = size, .shared = shared };
	return (int)id;
}

static uint64_t page_round(uint64_t bytes)
{
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);

	return (bytes + page - 1) / page * page;
}

/* Maps a new staging region of at least `len` bytes and makes it current;
 * the old current region goes once its requests are done. */
static int region_grow(struct gg_session *s, uint64_t len, uint64_t deadline_ms, const char *step,
		       struct gg_error *err)
{
	uint64_t size = s->current >= 0 ? 2 * s->regions[s->current].size : MIN_REGION_BYTES;

	size = GG_MIN(page_round(GG_MAX(size, len)), s->max_region_bytes);
	int id = region_map(s, size, false, deadline_ms, step, err);
	if (id < 0)
		return id;
	if (s->current >= 0) {
		struct region *old = &s->regions[s->current];
		if (old->users)
			old->retired = true;
		else
			region_release(s, (unsigned)s->current, true);
	}
	s->current = id;
	return 0;
}

/* Gives back the GPU allocation no request uses that was used longest
 * ago, to make room for another shared buffer or allocation; false when
 * there is none. */
static bool evict_device_region(struct gg_session *s)
{
	int lru = -1;

	for (unsigned id = 0; id < s->max_regions; id++) {
		const struct region *r = &s->regions[id];
		if (r->device && !r->users && (lru < 0 || r->last_used < s->regions[lru].last_used))
			lru = (int)id;
	}
	if (lru < 0)
		return false;
	s->buffers--;
	region_release(s, (unsigned)lru, true);
	return true;
}

GRADGATE_API int gg_buffer_alloc(struct gg_session *s, size_t bytes, void **out, struct gg_error *err)
{
	if (!out)
		return gg_ctrl_error(err, GG_ERR_INVALID, "gg_buffer_alloc: out is NULL");
	*out = NULL;
	if (!s)
		return gg_ctrl_error(err, GG_ERR_INVALID, "gg_buffer_alloc: session is NULL");
	if (!bytes)
		return gg_ctrl_error(err, GG_ERR_INVALID, "gg_buffer_alloc: bytes is 0");
	if (s->failed)
		return gg_ctrl_error(err, s->failed, "gg_buffer_alloc: session failed earlier: %s", s->failed_msg);
	if (bytes > s->info.max_message_bytes)
		return gg_ctrl_error(err, GG_ERR_TOO_LARGE,
			       "gg_buffer_alloc: %zu bytes exceed the max_message of %llu bytes of the gateway of "
			       "site %s", bytes, (unsigned long long)s->info.max_message_bytes, site_of(s));
	pump(s, 0);
	if (s->failed)
		return gg_ctrl_error(err, s->failed, "gg_buffer_alloc: %s", s->failed_msg);
	if (s->buffers >= s->info.max_buffers && !evict_device_region(s))
		return gg_ctrl_error(err, GG_ERR_LIMIT, "gg_buffer_alloc: the session holds %u shared buffers, as many as "
			       "the gateway of site %s allows", s->buffers, site_of(s));
	int id = region_map(s, page_round(bytes), true, gg_ctrl_now_ms() + OPEN_TIMEOUT_MS, "gg_buffer_alloc", err);
	if (id < 0)
		return id;
	s->buffers++;
	*out = s->regions[id].base;
	return set_ok(err);
}

GRADGATE_API int gg_buffer_free(struct gg_session *s, void *buf, struct gg_error *err)
{
	if (!buf)
		return set_ok(err);
	if (!s)
		return gg_ctrl_error(err, GG_ERR_INVALID, "gg_buffer_free: session is NULL");
	for (unsigned id = 0; id < GG_ARRAY_LEN(s->regions); id++) {
		struct region *r = &s->regions[id];
		if (!r->shared || r->device || r->base != buf || r->retired)
			continue;
		if (r->users) {
			r->retired = true; /* released with its last request */
		} else {
			s->buffers--;
			region_release(s, id, !s->failed);
		}
		return set_ok(err);
	}
	return gg_ctrl_error(err, GG_ERR_INVALID, "gg_buffer_free: %p is not a shared buffer of this session", buf);
}

/* The shared buffer `buf` lies in: its id, -1 when none, or -2 when the
 * tensor starts in one but does not end there. */
static int shared_region_of(const struct gg_session *s, const void *buf, uint64_t bytes)
{
	const unsigned char *p = buf;

	for (unsigned id = 0; id < GG_ARRAY_LEN(s->regions); id++) {
		const struct region *r = &s->regions[id];
		if (!r->shared || r->device || r->retired || p < r->base || p >= r->base + r->size)
			continue;
		return bytes <= r->size - (uint64_t)(p - r->base) ? (int)id : -2;
	}
	return -1;
}

/* What every all-reduce call checks before it uses a step number; it also
 * takes in what the gateway sent, so a finished request frees its slot.
 * `name`: the buffer's, as the caller's documentation calls it; `step`:
 * the label of a call not sent (step_labels()). */
static int request_check(struct gg_session *s, const void *buf, const char *name, size_t count,
			 enum gg_dtype dtype, const char *step, struct gg_error *err)
{
	size_t esize = gg_dtype_size(dtype);

	if (!buf || !count)
		return buf ? gg_ctrl_error(err, GG_ERR_INVALID, "%s: count is 0", step)
			   : gg_ctrl_error(err, GG_ERR_INVALID, "%s: %s is NULL", step, name);
	if (!esize)
		return gg_ctrl_error(err, GG_ERR_INVALID, "%s: unknown dtype %d", step, (int)dtype);
	if (s->failed)
		return gg_ctrl_error(err, s->failed, "%s: session failed earlier: %s", step, s->failed_msg);
	if (count > s->info.max_message_bytes / esize)
		return gg_ctrl_error(err, GG_ERR_TOO_LARGE,
			       "%s: %zu %s elements exceed the max_message of %llu bytes of the gateway of site %s",
			       step, count, gg_dtype_name(dtype), (unsigned long long)s->info.max_message_bytes,
			       site_of(s));

	pump(s, 0);
	if (s->failed)
		return gg_ctrl_error(err, s->failed, "%s: %s", step, s->failed_msg);
	if (s->inflight >= s->info.max_inflight)
		return gg_ctrl_error(err, GG_ERR_BUSY, "%s: %u requests already in flight, as many as the gateway allows",
			       step, s->inflight);
	return 0;
}

/* The labels of a call's messages: `step` ("step 9 (tensor 3)") once the
 * step is sent, `unsent` ("step 9 (tensor 3), not sent") for what fails
 * before: such a call takes no step number (gradgate.h), and says so. */
static void step_labels(const struct gg_session *s, uint32_t tensor_id, char *step, size_t step_size, char *unsent,
			size_t unsent_size)
{
	snprintf(step, step_size, "step %llu (tensor %u)", (unsigned long long)s->next_seq, tensor_id);
	snprintf(unsent, unsent_size, "%s, not sent", step);
}

/* The step's timeout as the gateway will apply it. */
static uint64_t step_timeout_ms(const struct gg_session *s, int timeout_ms)
{
	return timeout_ms > 0 ? GG_MIN((uint64_t)timeout_ms, s->info.step_timeout_ms) : s->info.step_timeout_ms;
}

/* Announces step s->next_seq, whose tensor lies at `offset` in region
 * `id`, and queues its request, given up on `grace` ms past its deadline
 * (`deadline` includes it). For id GG_CTRL_REGION_NCCL the tensor
 * travels through the job's NCCL communicator: `buf` is device memory,
 * never touched here, and offset is 0. */
static int request_send(struct gg_session *s, void *buf, size_t count, enum gg_dtype dtype, uint32_t tensor_id,
			uint64_t timeout, uint64_t deadline, uint64_t grace, unsigned id, uint64_t offset,
			const char *step, struct gg_request **out, struct gg_error *err)
{
	uint64_t bytes = (uint64_t)count * gg_dtype_size(dtype);
	struct gg_request *r = calloc(1, sizeof(*r));
	int rc;

	if (!r)
		return gg_ctrl_error(err, GG_ERR_NOMEM, "%s: out of memory for a request", step);
	struct region *reg = id == GG_CTRL_REGION_NCCL ? NULL : &s->regions[id];
	if (reg && !reg->shared)
		memcpy(reg->base + offset, buf, bytes);

	union gg_ctrl_msg m;
	size_t mlen = gg_ctrl_init(&m, GG_CTRL_ALLREDUCE);
	m.allreduce.seq = s->next_seq;
	m.allreduce.tensor_id = tensor_id;
	m.allreduce.dtype = (uint32_t)dtype;
	m.allreduce.count = count;
	m.allreduce.offset = offset;
	m.allreduce.region = id;
	m.allreduce.timeout_ms = (uint32_t)timeout;
	if ((rc = gg_ctrl_send(s->fd, &m, mlen, -1, deadline))) {
		free(r);
		send_failed(s, rc, "sending the request");
		return gg_ctrl_error(err, s->failed, "%s: %s", step, s->failed_msg);
	}

	*r = (struct gg_request){
		.s = s, .seq = s->next_seq++, .tensor_id = tensor_id, .dtype = dtype, .bytes = bytes,
		.buf = reg ? buf : NULL, .region = id, .offset = offset, .deadline_ms = deadline, .grace_ms = grace,
	};
	if (reg)
		reg->users++;
	if (s->tail)
		s->tail->next = r;
	else
		s->head = r;
	s->tail = r;
	s->inflight++;
	*out = r;
	return set_ok(err);
}

GRADGATE_API int gg_allreduce_start(struct gg_session *s, void *buf, size_t count, enum gg_dtype dtype,
				    uint32_t tensor_id, int timeout_ms, struct gg_request **out,
				    struct gg_error *err)
{
	char step[64], unsent[80];
	size_t esize = gg_dtype_size(dtype);
	int rc;

	if (!out)
		return gg_ctrl_error(err, GG_ERR_INVALID, "gg_allreduce_start: out is NULL");
	*out = NULL;
	if (!s)
		return gg_ctrl_error(err, GG_ERR_INVALID, "gg_allreduce_start: session is NULL");
	step_labels(s, tensor_id, step, sizeof(step), unsent, sizeof(unsent));
	if ((rc = request_check(s, buf, "buf", count, dtype, unsent, err)))
		return rc;

	uint64_t bytes = (uint64_t)count * esize;
	uint64_t timeout = step_timeout_ms(s, timeout_ms);
	uint64_t deadline = gg_ctrl_now_ms() + timeout + s->answer_grace_ms + GRACE_MS;
	uint64_t offset;
	int id = shared_region_of(s, buf, bytes);

	if (id == -2)
		return gg_ctrl_error(err, GG_ERR_INVALID, "%s: %llu bytes at %p run past the end of the shared buffer "
			       "they start in", unsent, (unsigned long long)bytes, buf);
	if (id >= 0) {
		offset = (uint64_t)((unsigned char *)buf - s->regions[id].base);
		if (offset % esize)
			return gg_ctrl_error(err, GG_ERR_INVALID, "%s: %p in a shared buffer is not aligned to the %zu-byte "
				       "%s elements", unsent, buf, esize, gg_dtype_name(dtype));
	} else if (s->current < 0 || !region_fit(s, (unsigned)s->current, bytes, &offset)) {
		if ((rc = region_grow(s, bytes, deadline, unsent, err)))
			return rc;
		offset = 0;
	}
	if (id < 0)
		id = s->current;
	return request_send(s, buf, count, dtype, tensor_id, timeout, deadline, s->answer_grace_ms + GRACE_MS,
			    (unsigned)id, offset, step, out, err);
}

/* The region through which the gateway reaches CUDA allocation `a`: the
 * one it already has, or a new one (MAP_CUDA). When the session holds
 * max_buffers already, the device region unused longest that no request
 * uses goes first. Returns its id, or a negative gg_errc with err. */
static int device_region(struct gg_session *s, const struct gg_cudrv_alloc *a, uint64_t deadline_ms,
			 const char *step, struct gg_error *err)
{
	char why[200];
	unsigned id;
	int rc;

	for (id = 0; id < s->max_regions; id++) {
		struct region *r = &s->regions[id];
		if (r->device && r->base == (unsigned char *)(uintptr_t)a->base && r->buffer_id == a->buffer_id &&
		    r->size == a->size) {
			r->last_used = s->next_seq;
			return (int)id;
		}
	}
	if (s->buffers >= s->info.max_buffers && !evict_device_region(s))
		return gg_ctrl_error(err, GG_ERR_LIMIT, "%s: the session holds %u shared buffers and GPU allocations "
			       "in use, as many as the gateway of site %s allows", step, s->buffers, site_of(s));
	for (id = 0; id < s->max_regions; id++)
		if (!s->regions[id].base)
			break;
	if (id == s->max_regions)
		return gg_ctrl_error(err, GG_ERR_BUSY, "%s: all %u shared regions are in use", step, s->max_regions);

	union gg_ctrl_msg m;
	size_t mlen = gg_ctrl_init(&m, GG_CTRL_MAP_CUDA);
	m.map_cuda.region = id;
	m.map_cuda.size_bytes = a->size;
	if ((rc = gg_cudrv_ipc_handle(a, m.map_cuda.ipc, why, sizeof(why))))
		return gg_ctrl_error(err, rc, "%s: %s", step, why);
	if ((rc = gg_ctrl_send(s->fd, &m, mlen, -1, deadline_ms))) {
		send_failed(s, rc, "sending a GPU allocation");
		return gg_ctrl_error(err, s->failed, "%s: %s", step, s->failed_msg);
	}
	s->regions[id] = (struct region){
		.base = (unsigned char *)(uintptr_t)a->base, .size = a->size, .shared = true, .device = true,
		.buffer_id = a->buffer_id, .last_used = s->next_seq,
	};
	s->buffers++;
	s->handed_gpu = true;
	return (int)id;
}

GRADGATE_API int gg_allreduce_cuda(struct gg_session *s, void *devbuf, size_t count, enum gg_dtype dtype,
				   uint32_t tensor_id, void *stream, int timeout_ms, struct gg_error *err)
{
	char step[64], unsent[80], why[200];
	struct gg_cudrv_alloc a;
	struct gg_request *r;
	size_t esize = gg_dtype_size(dtype);
	int rc;

	if (!s)
		return gg_ctrl_error(err, GG_ERR_INVALID, "gg_allreduce_cuda: session is NULL");
	step_labels(s, tensor_id, step, sizeof(step), unsent, sizeof(unsent));
	if ((rc = request_check(s, devbuf, "devbuf", count, dtype, unsent, err)))
		return rc;
	if ((rc = gg_cudrv_locate(devbuf, &a, why, sizeof(why))))
		return gg_ctrl_error(err, rc, "%s: %s", unsent, why);

	uint64_t bytes = (uint64_t)count * esize;
	uint64_t offset = (uint64_t)(uintptr_t)devbuf - a.base;
	if (offset % esize)
		return gg_ctrl_error(err, GG_ERR_INVALID, "%s: device pointer %p is not aligned to the %zu-byte %s "
			       "elements", unsent, devbuf, esize, gg_dtype_name(dtype));
	if (offset > a.size || bytes > a.size - offset)
		return gg_ctrl_error(err, GG_ERR_INVALID, "%s: %llu bytes at %p run past the end of their CUDA "
			       "allocation (%llu bytes from 0x%llx)", unsent, (unsigned long long)bytes, devbuf,
			       (unsigned long long)a.size, (unsigned long long)a.base);

	uint64_t timeout = step_timeout_ms(s, timeout_ms);
	int id = device_region(s, &a, gg_ctrl_now_ms() + OPEN_TIMEOUT_MS, unsent, err);
	if (id < 0)
		return id;
	/* The tensor is read once the caller's work on it is done; the step's
	 * deadline runs from then on, as the gateway's does. */
	if ((rc = gg_cudrv_sync(&a, stream, why, sizeof(why))))
		return gg_ctrl_error(err, rc, "%s: %s", unsent, why);
	uint64_t deadline = gg_ctrl_now_ms() + timeout + s->answer_grace_ms + GRACE_MS;
	if ((rc = request_send(s, devbuf, count, dtype, tensor_id, timeout, deadline, s->answer_grace_ms + GRACE_MS,
			       (unsigned)id, offset, step, &r, err)))
		return rc;
	rc = gg_wait(r, -1, err);
	gg_request_free(r);
	return rc;
}

/* While this rank joins the communicator: whether the gateway ended the
 * session (the job failed, or the gateway gave the communicator up, so it
 * will not come up), the connection is gone, or a DONE of a step in
 * flight said the communicator was aborted. */
static bool join_given_up(void *arg)
{
	struct gg_session *s = arg;

	pump(s, 0);
	return s->failed || s->nccl_state == NCCL_ABORTED;
}

/* The session's first NCCL step: NCCL_JOIN, the gateway's NCCL_ID, and
 * this rank's part in making the job's communicator on the calling
 * thread's current CUDA device (`device`), all by `deadline`. Collective:
 * the communicator comes up once every rank of the job and the gateway
 * have joined it. Returns 0 with the session's communicator up, or the
 * error with the session failed (the gateway's answer is missing or
 * wrong: the connection is out of step) or its communicator aborted. */
static int nccl_join(struct gg_session *s, uint64_t timeout, uint64_t deadline, int device, const char *step,
		     struct gg_error *err)
{
	char why[GG_ERROR_MESSAGE_MAX];
	union gg_ctrl_msg m;
	size_t len = gg_ctrl_init(&m, GG_CTRL_NCCL_JOIN);
	int rc;

	m.nccl_join.timeout_ms = (uint32_t)timeout;
	m.nccl_join.nccl_version = (uint32_t)gg_nccl_version();
	if ((rc = gg_ctrl_send(s->fd, &m, len, -1, deadline))) {
		send_failed(s, rc, "sending NCCL_JOIN");
		return gg_ctrl_error(err, s->failed, "%s: %s", step, s->failed_msg);
	}
	s->nccl_state = NCCL_ASKED;
	/* The gateway answers at once: NCCL_ID, or ERROR saying why it cannot
	 * (built without NCCL, no GPU), which ends the session. */
	for (;;) {
		pump(s, deadline);
		if (s->failed || s->nccl_state != NCCL_ASKED)
			break;
		if (gg_ctrl_now_ms() >= deadline) {
			session_fail(s, GG_ERR_TIMEOUT, "the gateway of site %s did not answer NCCL_JOIN within "
				     "%llu ms", site_of(s), (unsigned long long)timeout);
			break;
		}
	}
	if (s->failed)
		return gg_ctrl_error(err, s->failed, "%s: %s", step, s->failed_msg);
	/* A DONE read with NCCL_ID may have said the gateway gave it up. */
	if (s->nccl_state == NCCL_ABORTED)
		return gg_ctrl_error(err, s->nccl_code, "%s: %s", step, s->nccl_why);
	/* This rank joins as its rank in the job: the communicator must be the
	 * job's ranks and the gateway. */
	if (s->nccl_id.nranks != (uint32_t)s->nranks + 1) {
		session_fail(s, GG_ERR_PROTOCOL, "the gateway of site %s answered NCCL_JOIN with a communicator of %u "
			     "ranks, not the job's %d and its own", site_of(s), (unsigned)s->nccl_id.nranks, s->nranks);
		return gg_ctrl_error(err, s->failed, "%s: %s", step, s->failed_msg);
	}

	/* The gateway tells a rank waiting here when the communicator cannot
	 * come up any more: it ends the session, saying why. */
	const struct gg_nccl_stop stop = { join_given_up, s };
	rc = gg_nccl_join(&s->nccl_comm, s->nccl_id.id, s->nccl_id.nranks, (unsigned)s->rank, deadline, &stop, why,
			  sizeof(why));
	if (s->failed) {
		nccl_abort(s, s->failed, "%s", s->failed_msg);
		return gg_ctrl_error(err, s->failed, "%s: %s", step, s->failed_msg);
	}
	if (s->nccl_state == NCCL_ABORTED) {
		nccl_abort(s, s->nccl_code, "%s", s->nccl_why); /* what the join made, if it came up */
		return gg_ctrl_error(err, s->nccl_code, "%s: %s", step, s->nccl_why);
	}
	if (rc == GG_ERR_TIMEOUT)
		nccl_abort(s, rc, "the NCCL communicator of job '%s' did not come up within %llu ms: a rank of the job "
			   "did not make its first gg_allreduce_nccl in time, or the gateway of site %s did not join",
			   s->job, (unsigned long long)timeout, site_of(s));
	else if (rc)
		nccl_abort(s, rc, "joining the NCCL communicator of job '%s': %s", s->job, why);
	if (rc) {
		/* The job's communicator cannot come up without this rank: the
		 * session ends, which tells the gateway and fails the job at once
		 * for the other ranks. */
		session_fail(s, rc, "%s", s->nccl_why);
		return gg_ctrl_error(err, rc, "%s: %s", step, s->nccl_why);
	}
	s->nccl_state = NCCL_UP;
	s->nccl_device = device;
	return 0;
}

GRADGATE_API int gg_allreduce_nccl(struct gg_session *s, void *devbuf, size_t count, enum gg_dtype dtype,
				   uint32_t tensor_id, void *stream, int timeout_ms, struct gg_error *err)
{
	char step[64], unsent[80], why[GG_ERROR_MESSAGE_MAX];
	struct gg_request *r;
	int device, current, rc;

	if (!s)
		return gg_ctrl_error(err, GG_ERR_INVALID, "gg_allreduce_nccl: session is NULL");
	step_labels(s, tensor_id, step, sizeof(step), unsent, sizeof(unsent));
	if ((rc = request_check(s, devbuf, "devbuf", count, dtype, unsent, err)))
		return rc;
	/* NCCL sums in the element type: bfloat16 would round at every rank's
	 * addition, where every other call sums in float32 and rounds once. */
	if (dtype != GG_DTYPE_F32)
		return gg_ctrl_error(err, GG_ERR_INVALID, "%s: NCCL steps take float32 only: NCCL would sum %s in %s, "
			       "not in float32 as the other calls do (gg_allreduce_cuda takes it)", unsent,
			       gg_dtype_name(dtype), gg_dtype_name(dtype));
	if (s->nccl_state == NCCL_ABORTED)
		return gg_ctrl_error(err, s->nccl_code, "%s: the session's NCCL communicator was aborted (%s); "
			       "close the session and open a new one", unsent, s->nccl_why);
	if ((rc = gg_nccl_load(why, sizeof(why))))
		return gg_ctrl_error(err, rc, "%s: %s", unsent, why);
	/* NCCL's kernels would fault on memory they cannot reach, and a fault
	 * ends the process's CUDA context: what they would fault on is refused
	 * here. */
	if ((rc = gg_cudrv_device_of(devbuf, (uint64_t)count * sizeof(float), &device, why, sizeof(why))))
		return gg_ctrl_error(err, rc, "%s: %s", unsent, why);
	if (s->nccl_state == NCCL_UP && device != s->nccl_device)
		return gg_ctrl_error(err, GG_ERR_INVALID, "%s: devbuf %p is memory of GPU %d, but the session's NCCL "
			       "communicator is on GPU %d", unsent, devbuf, device, s->nccl_device);
	if (s->nccl_state == NCCL_NONE) {
		if ((rc = gg_cudrv_current_device(&current, why, sizeof(why))))
			return gg_ctrl_error(err, rc, "%s: %s", unsent, why);
		/* NCCL joins on the current device; with none current, on the
		 * runtime's first. */
		if (current < 0 && device != 0)
			return gg_ctrl_error(err, GG_ERR_INVALID, "%s: devbuf %p is memory of GPU %d, but the calling "
				       "thread has no current CUDA device, and the rank would join the job's NCCL "
				       "communicator on GPU 0: call cudaSetDevice(%d) first", unsent, devbuf, device,
				       device);
		if (current >= 0 && current != device)
			return gg_ctrl_error(err, GG_ERR_INVALID, "%s: devbuf %p is memory of GPU %d, but the calling "
				       "thread's current CUDA device, on which the rank joins the job's NCCL "
				       "communicator, is GPU %d", unsent, devbuf, device, current);
	}

	uint64_t timeout = step_timeout_ms(s, timeout_ms);
	if (s->nccl_state == NCCL_NONE && (rc = nccl_join(s, timeout, gg_ctrl_now_ms() + timeout, device, unsent, err)))
		return rc;
	/* The stream's work before the step is done first, as for
	 * gg_allreduce_cuda: then the gateway's reduce, which starts once
	 * every rank announced the unsent, waits for the ranks' only as long as
	 * their enqueueing takes, not for their backward passes. */
	if ((rc = gg_cudrv_stream_wait(devbuf, stream, gg_ctrl_now_ms() + timeout, why, sizeof(why))))
		return gg_ctrl_error(err, rc, "%s: before the step: %s", unsent, why);

	/* The step's deadline runs from its announcement, as the gateway's.
	 * The gateway may take its grace twice: for the core's end, and then
	 * for the broadcast. */
	const uint64_t step_deadline = gg_ctrl_now_ms() + timeout, grace = 2 * s->answer_grace_ms + GRACE_MS;
	if ((rc = request_send(s, devbuf, count, dtype, tensor_id, timeout, step_deadline + grace, grace,
			       GG_CTRL_REGION_NCCL, 0, step, &r, err)))
		return rc;
	rc = gg_nccl_reduce_broadcast(s->nccl_comm, devbuf, count, s->nccl_id.root, stream, step_deadline, why,
				      sizeof(why));
	if (rc) {
		/* What was enqueued may wait for ever: the communicator goes, and
		 * the session with it, which tells the gateway: the step fails at
		 * once for the other ranks, not at its deadline. */
		nccl_abort(s, rc, "%s", why);
		session_fail(s, rc, "%s: this rank could not enqueue its NCCL calls: %s", step, why);
		gg_request_free(r);
		return gg_ctrl_error(err, rc, "%s: %s", step, why);
	}
	rc = gg_wait(r, -1, err);
	const bool aborted = r->flags & GG_CTRL_DONE_NCCL_ABORTED;
	gg_request_free(r);
	/* This rank's broadcast ends a little after the gateway's answer
	 * may come: the call returns once it is done, so that the result is
	 * in devbuf and nothing of the communicator's is still running when
	 * the session closes (and aborts it). */
	if (!aborted && s->nccl_state == NCCL_UP) {
		int wrc = gg_cudrv_stream_wait(devbuf, stream, gg_ctrl_now_ms() + s->answer_grace_ms + GRACE_MS, why,
					       sizeof(why));
		if (wrc) {
			nccl_abort(s, wrc, "this rank's broadcast of step %llu did not end: %s",
				   (unsigned long long)s->next_seq - 1, why);
			if (!rc)
				rc = gg_ctrl_error(err, wrc, "%s: %s", step, s->nccl_why);
		}
	}
	/* A step answered in time whose communicator the gateway aborted
	 * at its end: this rank's broadcast may have been cut short. */
	if (!rc && aborted)
		rc = gg_ctrl_error(err, s->nccl_code, "%s: the gateway aborted the job's NCCL communicator as the step "
				   "ended, so its result may not have reached this rank: %s", step, s->nccl_why);
	return rc;
}

GRADGATE_API int gg_wait(struct gg_request *req, int timeout_ms, struct gg_error *err)
{
	if (!req)
		return gg_ctrl_error(err, GG_ERR_INVALID, "gg_wait: request is NULL");

	uint64_t until = timeout_ms < 0 ? UINT64_MAX : gg_ctrl_now_ms() + (uint64_t)timeout_ms;
	for (bool looked = false; !req->done; looked = true) {
		struct gg_session *s = req->s;
		struct gg_request *head = s->head;
		uint64_t now = gg_ctrl_now_ms();

		if (now >= head->deadline_ms) {
			/* Answers that came in time count, however late the
			 * caller looks for them. */
			pump(s, 0);
			if (req->done || s->head != head)
				continue;
			session_fail(s, GG_ERR_TIMEOUT, "the gateway of site %s did not answer step %llu within its "
				     "deadline and %llu ms more", site_of(s), (unsigned long long)head->seq,
				     (unsigned long long)head->grace_ms);
			break;
		}
		/* What the gateway sent already counts, however short the wait:
		 * a caller polling with 0 would otherwise never see its answer. */
		if (looked && now >= until)
			return gg_ctrl_error(err, GG_ERR_AGAIN, "step %llu (tensor %u) still in progress after %d ms",
				       (unsigned long long)req->seq, req->tensor_id, timeout_ms);
		pump(s, GG_MIN(until, head->deadline_ms));
	}
	if (req->status)
		return gg_ctrl_error(err, req->status, "%s", req->message);
	return set_ok(err);
}

GRADGATE_API int gg_allreduce(struct gg_session *s, void *buf, size_t count, enum gg_dtype dtype,
			      uint32_t tensor_id, int timeout_ms, struct gg_error *err)
{
	struct gg_request *r;
	int rc;

	if (!s)
		return gg_ctrl_error(err, GG_ERR_INVALID, "gg_allreduce: session is NULL");
	if ((rc = gg_allreduce_start(s, buf, count, dtype, tensor_id, timeout_ms, &r, err)))
		return rc;
	rc = gg_wait(r, -1, err);
	gg_request_free(r);
	return rc;
}

GRADGATE_API void gg_request_free(struct gg_request *req)
{
	if (!req)
		return;
	if (req->done) {
		free(req);
		return;
	}
	req->freed = true;
	req->buf = NULL;
}

/* Before a session closes: the gateway lets go of the GPU allocations no
 * request uses (UNMAP); then the close waits, at most CLOSE_WAIT_MS, for
 * the gateway's end of the connection, which comes once the gateway is done
 * with this rank: the caller may then free those allocations, and open the
 * same rank of the job (or, as its last rank, a new run of its name) at
 * once. Letting go of GPU allocations waits for any NCCL call the gateway
 * makes meanwhile, which ends by its step's deadline and the gateway's
 * grace: a session that handed it any waits that much longer. */
static void release_session(struct gg_session *s)
{
	for (unsigned id = 0; id < s->max_regions && !s->failed; id++) {
		if (s->regions[id].device && !s->regions[id].users) {
			s->buffers--;
			region_release(s, id, true);
		}
	}
	if (s->failed || shutdown(s->fd, SHUT_WR))
		return;
	uint64_t wait = CLOSE_WAIT_MS + (s->handed_gpu ? s->info.step_timeout_ms + s->answer_grace_ms : 0);
	uint64_t until = gg_ctrl_now_ms() + wait;
	union gg_ctrl_msg m;
	ssize_t n;
	do /* what comes now goes unread: its requests had not finished at the close */
		n = gg_ctrl_recv(s->fd, &m, until);
	while (n > 0 || n == -EPROTO);
}

GRADGATE_API void gg_session_close(struct gg_session *s)
{
	if (!s)
		return;
	if (!s->failed && s->fd >= 0)
		pump(s, 0); /* answers already here complete their requests */
	/* A communicator in order is flushed first: this rank may still be
	 * forwarding the last broadcast to another. Anything else is aborted,
	 * which is this rank's alone and never waits. */
	if (s->nccl_comm && s->nccl_state == NCCL_UP) {
		gg_nccl_finish(s->nccl_comm, gg_ctrl_now_ms() + FINISH_MS);
		s->nccl_comm = NULL;
	}
	if (s->nccl_comm)
		nccl_abort(s, GG_ERR_CLOSED, "the session was closed");
	if (!s->failed && s->fd >= 0)
		release_session(s);
	session_fail(s, GG_ERR_CLOSED, "the session was closed");
	for (unsigned i = 0; i < GG_ARRAY_LEN(s->regions); i++)
		if (s->regions[i].base)
			region_release(s, i, false);
	free(s);
}
