#include "host_backend.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/un.h>
#include <unistd.h>

#include "acceptor.h"
#include "control_proto.h"
#include "fileio.h"
#include "gg_build_config.h"
#include "host_sum.h"
#include "log.h"
#include "site_nccl.h"
#if HAVE_CUDA
#include "dev_mem.h"
#include "site_cuda.h"
#endif
#include "units.h"
#include "uring_msg.h"

enum { K_ACCEPT, K_RECV, K_SEND, K_CANCEL };

#define OUTQ (GG_CTRL_MAX_INFLIGHT + 3u) /* every request's DONE, ACCEPT, NCCL_ID, the last ERROR */
#define FAILED_KEPT 8 /* failed steps a job remembers for its late ranks */
#define RECV_FDS 4                       /* descriptors one packet may bring before MSG_CTRUNC */
#define CLOSE_TIMEOUT_US 1000000u        /* for the last answer to leave before the socket is shut */
#define WAITING_MAX 16                   /* connections waiting for the slots of an idle job */
#define SILENT_MIN_US 100000             /* silent this long, a connection has sent no HELLO */
#define NCCL_POLL_SLOW_US 1000           /* between looks at a communicator being joined, */
#define NCCL_POLL_US 100                 /* between looks at a reduce or broadcast under way, */
#define NCCL_POLL_FAST_US 5000           /* for its first 5 ms; then NCCL_POLL_SLOW_US */
#define MAX_MESSAGE_LIMIT (1ull << 40)
#define TEXT GG_CTRL_TEXT_SIZE

struct hb_region {
	unsigned char *base; /* NULL: not mapped */
	uint64_t size;
	unsigned users;      /* requests queued with their data here */
	bool device;         /* a CUDA allocation opened by IPC handle (MAP_CUDA), not a memfd */
};

struct hb_req {
	uint64_t seq;
	uint64_t count;
	uint64_t offset;
	uint64_t deadline_us;
	uint32_t tensor_id;
	uint32_t dtype;
	uint32_t region;
	uint32_t timeout_ms;
};

enum conn_state { C_FREE, C_HELLO, C_ACTIVE, C_CLOSING };

struct hb_conn {
	enum conn_state state;
	int fd;
	uint32_t index;
	uint32_t gen;
	uint64_t deadline_us; /* C_HELLO: for the HELLO; C_CLOSING: for the last answer */
	struct hb_job *job;   /* C_ACTIVE only */
	/* C_CLOSING: the job this last rank left while its step was with the
	 * core; the socket stays open until the job is gone (or deadline_us),
	 * so a rank that waits for its end to close may start the job's name
	 * again at once. */
	struct hb_job *linger;
	unsigned rank;
	bool nccl_joined; /* sent NCCL_JOIN (and got NCCL_ID) */
	uint64_t next_seq;
	struct hb_req reqs[GG_CTRL_MAX_INFLIGHT];
	unsigned req_head, req_count;
	unsigned dones_queued; /* DONEs not yet sent: they count against the window */
	struct hb_region regions[GG_CTRL_MAX_REGIONS];

	union gg_ctrl_msg out[OUTQ];
	size_t out_len[OUTQ];
	unsigned out_head, out_count;
	bool send_busy, recv_busy, shut;
	int io_error;  /* a send could not be queued: dropped at the next tick */
	uid_t uid;     /* of the peer process, from SO_PEERCRED */
	pid_t pid;

	/* Took one of the STATUS_SLOTS past max_clients: it may ask for
	 * status; a HELLO must find a place among max_clients first. */
	bool spare;
	/* A status answer: sent a message at a time through out[]. */
	union gg_ctrl_msg *status;
	unsigned status_count, status_next;

	union gg_ctrl_msg in;
	struct iovec iov;
	struct msghdr mh;
	_Alignas(size_t) char cbuf[CMSG_SPACE(RECV_FDS * sizeof(int))];
};

/* A step that failed before all of its job's ranks had announced it. */
struct hb_failed {
	uint64_t seq; /* 0: none */
	int code;
	char msg[TEXT];
};

struct hb_job {
	struct hb_job *next;
	char name[GG_CTRL_NAME_SIZE];
	unsigned nranks;
	unsigned first_rank; /* the rank whose HELLO created the job */
	uid_t uid;           /* every rank runs as the user that created the job */
	unsigned connected;
	struct hb_conn **ranks;
	void **mem;           /* per rank: its tensor in shared memory, for the step with the core */
	void **gpu_out;       /* room for nranks pointers: the GPU tensors a result goes to */
	unsigned *mem_region; /* per rank: the region mem[] lies in */
	/* Regions of ranks that left while the core held the step, which may
	 * still read and write them: unmapped once the core gives it back. */
	struct hb_region *orphans;
	uint64_t active_us;   /* when a rank last sent something, or a step ended */
	uint64_t seq;         /* the step being gathered or with the core; earlier ones are over */
	uint64_t deadline_us; /* of step `seq` while gathering; 0: no rank has announced it */
	uint32_t deadline_ms; /* the timeout that set deadline_us, for messages */

	bool with_core;
	bool sum_owned;  /* the step's sum is a buffer of the job's (bfloat16), not rank 0's memory */
	bool on_gpu;     /* the step's ranks hold it in device memory: sum_owned, on the gateway's GPU */
	uint64_t sum_cap; /* bytes of the step's own sum buffer (sum_owned), counted in sum_bytes */
	bool abandoned;  /* the step with the core was already failed at its ranks */
	bool in_submit;
	bool sync_done;  /* completed from inside submit() */
	int sync_status;
	char sync_msg[TEXT];
	struct gg_site_step step;
	/* The last step's sum buffer, kept for the next step of the same size:
	 * a fresh one is a fresh mapping, and faulting in its pages cost more
	 * than summing into it. Counted in the stats' spare_bytes. */
	float *spare;
	uint64_t spare_bytes;
	bool spare_on_gpu; /* device memory (gg_dev_alloc), for device steps */
	bool spare_nccl;   /* memory of the NCCL ops (opts.nccl->alloc), for NCCL steps */

	/* GPU mode with NCCL: the job's communicator, of which the gateway is
	 * the last rank, joined at the job's first NCCL_JOIN. */
	enum { NCCL_NONE, NCCL_JOINING, NCCL_UP, NCCL_ABORTED } nccl_state;
	void *nccl_comm;
	unsigned char nccl_id[GG_SITE_NCCL_ID_SIZE];
	uint64_t nccl_deadline_us; /* NCCL_JOINING: by when it must be up */
	uint32_t nccl_timeout_ms;  /* that deadline's timeout, for messages */
	int nccl_code;             /* NCCL_ABORTED: why, for the steps that needed it */
	char nccl_why[TEXT];
	bool nccl_never_up;        /* NCCL_ABORTED: while joining, so ranks may wait in their join */
	bool step_nccl;            /* the step's sum came by the ranks' reduce; its result goes by broadcast */
	/* An NCCL step's collective under way, which the tick polls until it
	 * is done or nccl_until_us passes: the ranks' reduce to the gateway
	 * before the core gets the step, the broadcast of its result after
	 * (the core's outcome, for the DONEs, kept meanwhile). */
	enum { PHASE_NONE, PHASE_REDUCE, PHASE_BROADCAST } nccl_phase;
	uint64_t nccl_since_us;
	uint64_t nccl_until_us;
	int nccl_outcome;
	char nccl_outcome_msg[TEXT];

	int broken; /* a rank left or broke the protocol: every request fails with broken_msg */
	char broken_msg[TEXT];
	uint64_t aborted_to; /* the core was told that steps up to this one failed here */
	/* The last steps failed before all ranks had announced them, for the
	 * ranks still to come: ranks that were told may run some steps ahead
	 * of a late one (each failed at its deadline). */
	struct hb_failed failed[FAILED_KEPT];
	unsigned failed_next;
};

struct gg_host_backend {
	struct gg_site_backend base;
	struct gg_host_backend_options opts;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	char site[GG_CTRL_NAME_SIZE];
	const struct gg_core_ops *core_ops;
	void *core;
	struct gg_loop *loop;
	uint64_t max_region_bytes;

	int listen_fd;
	dev_t listen_dev;
	ino_t listen_ino;
	struct gg_acceptor accept;
	unsigned cancels;
	bool stopping;

	struct hb_conn *conns; /* slots(): opts.max_clients + STATUS_SLOTS */
	struct hb_job *jobs;
	struct gg_log_limit refusal_log; /* REFUSALS_LOGGED a second */
	struct gg_log_limit session_log; /* ranks coming and going: session_log_now() */
	/* New connections that found every slot taken while an idle job's
	 * sessions close: they get the first slots that free, in order, or
	 * are refused at their deadline. */
	struct {
		int fd;
		uint64_t until_us;
	} waiting[WAITING_MAX];
	unsigned waiting_count;
	/* One connection given the spare slot of a silent one, which it takes
	 * once that is closed (-1: none); it holds no place in max_clients. */
	int spare_wait_fd;
	uint64_t spare_wait_until_us;
	/* GPU memory given back while an NCCL call of the gateway's may run:
	 * freeing it waits for every kernel on the GPU (cudaFree), as does
	 * unmapping a rank's allocation (cudaIpcCloseMemHandle), and a reduce
	 * waiting for a rank ends only by this loop's own abort. It is freed
	 * or unmapped once no such call runs. (A rank may map an allocation
	 * again meanwhile: CUDA counts the opens of a handle, each close
	 * takes one back, and the pointer stays the same.) */
	struct hb_deferred {
		void *ptr;
		uint64_t bytes; /* of a sum, counted in deferred_bytes; 0 for a rank's allocation */
		enum { DEFER_DEV_SUM, DEFER_NCCL_SUM, DEFER_IPC } kind;
	} *deferred;
	unsigned deferred_count, deferred_cap, deferred_ipc; /* of them, ranks' allocations */
	uint64_t deferred_bytes; /* still taken: counted against opts.memory_bytes */
	bool core_frees_held;    /* the core was told not to free GPU memory (gpu_frees) */
	struct gg_host_backend_stats stats;
};

static void job_advance(struct gg_host_backend *b, struct hb_job *j);
static bool defer(struct gg_host_backend *b, void *ptr, uint64_t bytes, int kind);
static unsigned slots(const struct gg_host_backend *b);
static bool step_submit(struct gg_host_backend *b, struct hb_job *j);
static bool step_uses_nccl(struct hb_job *j);
static bool nccl_progress(struct gg_host_backend *b, struct hb_job *j, uint64_t now_us, uint64_t *next);

GG_PRINTF(2, 3) static void hb_log(struct gg_host_backend *b, const char *fmt, ...)
{
	char line[512];
	va_list ap;

	if (!b->opts.log)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	b->opts.log(b->opts.log_arg, line);
}

static uint64_t ud(const struct gg_host_backend *b, unsigned kind, const struct hb_conn *c)
{
	return gg_loop_ud(b->opts.kind_base + kind, c ? c->index : 0, c ? c->gen : 0);
}

static uint64_t min_deadline(uint64_t a, uint64_t b)
{
	return !a ? b : !b ? a : GG_MIN(a, b);
}

static struct hb_req *head(const struct hb_conn *c)
{
	return c->req_count ? (struct hb_req *)&c->reqs[c->req_head] : NULL;
}

static void req_pop(struct hb_conn *c)
{
	uint32_t region = c->reqs[c->req_head].region;

	if (region != GG_CTRL_REGION_NCCL)
		c->regions[region].users--;
	c->req_head = (c->req_head + 1) % GG_CTRL_MAX_INFLIGHT;
	c->req_count--;
}

/* ---- sending ------------------------------------------------------------ */

/* Moves what is left of a status answer into the answer queue. */
static void status_feed(struct hb_conn *c)
{
	while (c->status && c->status_next < c->status_count && c->out_count < OUTQ) {
		unsigned i = (c->out_head + c->out_count++) % OUTQ;
		c->out[i] = c->status[c->status_next];
		c->out_len[i] = c->status[c->status_next++].hdr.length;
	}
}

static void out_kick(struct gg_host_backend *b, struct hb_conn *c)
{
	status_feed(c);
	if (c->send_busy || !c->out_count || c->shut)
		return;
	int rc = gg_loop_send(b->loop, c->fd, &c->out[c->out_head], c->out_len[c->out_head], ud(b, K_SEND, c));
	if (rc) {
		/* Callers may be walking a job's ranks: the connection is
		 * dropped in the next tick, not under their feet. */
		hb_log(b, "control connection %u: cannot queue a send: %s", c->index, strerror(-rc));
		c->io_error = rc;
		return;
	}
	c->send_busy = true;
}

static union gg_ctrl_msg *out_push(struct hb_conn *c, enum gg_ctrl_type type)
{
	/* The window check in on_allreduce keeps this from overflowing. */
	if (c->out_count == OUTQ)
		return NULL;
	unsigned i = (c->out_head + c->out_count++) % OUTQ;
	c->out_len[i] = gg_ctrl_init(&c->out[i], type);
	return &c->out[i];
}

/* Answers the connection's oldest request with DONE. */
GG_PRINTF(4, 5) static void answer(struct gg_host_backend *b, struct hb_conn *c, int status, const char *fmt, ...)
{
	struct hb_req *h = head(c);
	union gg_ctrl_msg *m = out_push(c, GG_CTRL_DONE);
	va_list ap;

	m->done.seq = h->seq;
	m->done.status = status;
	/* The rank's own calls on the communicator may wait forever now: it
	 * aborts them. */
	if (c->nccl_joined && c->job && c->job->nccl_state == NCCL_ABORTED)
		m->done.flags = GG_CTRL_DONE_NCCL_ABORTED;
	if (status) {
		char text[TEXT + 64];
		va_start(ap, fmt);
		vsnprintf(text, sizeof(text), fmt, ap);
		va_end(ap);
		gg_ctrl_set_text(m->done.message, sizeof(m->done.message), text);
	}
	c->dones_queued++;
	req_pop(c);
	out_kick(b, c);
}

/* ---- connections -------------------------------------------------------- */

/* Lets go of a mapped region: shared memory or a rank's CUDA allocation. */
static void region_unmap(struct gg_host_backend *b, struct hb_region *r)
{
	if (!r->base)
		return;
#if HAVE_CUDA
	if (r->device) {
		if (!defer(b, r->base, 0, DEFER_IPC))
			gg_site_cuda_close(r->base);
	} else
#endif
		munmap(r->base, r->size);
	*r = (struct hb_region){ 0 };
	b->stats.regions--;
}

static void conn_free(struct gg_host_backend *b, struct hb_conn *c)
{
	for (unsigned i = 0; i < GG_CTRL_MAX_REGIONS; i++)
		region_unmap(b, &c->regions[i]);
	close(c->fd);
	free(c->status);
	uint32_t gen = (c->gen + 1) & GG_LOOP_AUX_MAX;
	uint32_t index = c->index;
	memset(c, 0, sizeof(*c));
	c->state = C_FREE;
	c->fd = -1;
	c->gen = gen;
	c->index = index;
	b->stats.connections--;
}

/* Moves a closing connection on: the socket is shut once its last answer
 * left (or the close deadline passed), and freed once nothing is in
 * flight on it. */
static void conn_settle(struct gg_host_backend *b, struct hb_conn *c, uint64_t now_us)
{
	if (c->state != C_CLOSING)
		return;
	if (c->linger && now_us < c->deadline_us)
		return;
	c->linger = NULL;
	if (!c->send_busy && !c->recv_busy && (!c->out_count || c->shut)) {
		conn_free(b, c);
		return;
	}
	if (!c->shut && ((!c->out_count && !c->send_busy) || now_us >= c->deadline_us)) {
		shutdown(c->fd, SHUT_RDWR);
		c->shut = true;
	}
}

static bool step_in_progress(const struct hb_job *j)
{
	if (j->with_core || j->nccl_phase)
		return true;
	for (unsigned r = 0; r < j->nranks; r++) {
		struct hb_conn *c = j->ranks[r];
		if (c && c->req_count && c->reqs[c->req_head].seq == j->seq)
			return true;
	}
	return false;
}

/* The job's kept sum buffer, which it no longer keeps, or NULL. */
static float *take_spare(struct gg_host_backend *b, struct hb_job *j)
{
	float *spare = j->spare;

	b->stats.spare_bytes -= j->spare_bytes;
	j->spare = NULL;
	j->spare_bytes = 0;
	return spare;
}

/* Whether an NCCL call of the gateway's (a reduce, a broadcast, the fill
 * before a reduce) may run on its GPU. */
static bool nccl_running(const struct gg_host_backend *b)
{
	for (const struct hb_job *j = b->jobs; j; j = j->next)
		if (j->nccl_phase != PHASE_NONE)
			return true;
	return false;
}

static void sum_free_now(const struct gg_host_backend *b, float *sum, bool on_gpu, bool nccl)
{
	if (nccl) {
		b->opts.nccl->free(sum);
		return;
	}
#if HAVE_CUDA
	if (on_gpu) {
		gg_dev_free(sum);
		return;
	}
#endif
	(void)on_gpu;
	free(sum);
}

/* Keeps GPU memory to free or unmap (`ptr`, `bytes` of it counted as
 * taken) until no NCCL call of the gateway's runs: true if kept, false if
 * it may go now (or no room was left to keep it). */
static bool defer(struct gg_host_backend *b, void *ptr, uint64_t bytes, int kind)
{
	/* Sums are bounded by the memory limit, which counts them; the ranks'
	 * allocations by as many as every connection's regions at once (a
	 * rank that maps and unmaps in a loop has its unmaps done at once
	 * past that). */
	if (!nccl_running(b) ||
	    (kind == DEFER_IPC && b->deferred_ipc >= slots(b) * GG_CTRL_MAX_REGIONS))
		return false;
	if (b->deferred_count == b->deferred_cap) {
		unsigned cap = b->deferred_cap ? 2 * b->deferred_cap : 8;
		struct hb_deferred *d = realloc(b->deferred, cap * sizeof(*d));
		if (!d)
			return false;
		b->deferred = d;
		b->deferred_cap = cap;
	}
	b->deferred[b->deferred_count++] = (struct hb_deferred){ ptr, bytes, kind };
	b->deferred_bytes += bytes;
	b->deferred_ipc += kind == DEFER_IPC;
	return true;
}

/* Gives back `bytes` of sum buffer. */
static void sum_free(struct gg_host_backend *b, float *sum, uint64_t bytes, bool on_gpu, bool nccl)
{
	if (sum && (on_gpu || nccl) && defer(b, sum, bytes, nccl ? DEFER_NCCL_SUM : DEFER_DEV_SUM))
		return;
	sum_free_now(b, sum, on_gpu, nccl);
}

/* Tells the core whether it may free GPU memory, when that changed. */
static void core_gpu_frees(struct gg_host_backend *b)
{
	bool held = nccl_running(b);

	if (held == b->core_frees_held)
		return;
	b->core_frees_held = held;
	if (b->core_ops->gpu_frees)
		b->core_ops->gpu_frees(b->core, !held);
}

/* Sets the NCCL call of job j under way (PHASE_NONE: none any more). The
 * core is told at once that it may not free GPU memory; that it may again
 * only at the end of the loop's turn (deferred_free()), when a call that
 * failed has been aborted: one past its deadline still runs until then. */
static void nccl_phase_set(struct gg_host_backend *b, struct hb_job *j, int phase)
{
	j->nccl_phase = phase;
	if (phase != PHASE_NONE)
		core_gpu_frees(b);
}

/* What waited for the gateway's NCCL calls, once none runs. */
static void deferred_free(struct gg_host_backend *b)
{
	core_gpu_frees(b);
	if (!b->deferred_count || nccl_running(b))
		return;
	for (unsigned i = 0; i < b->deferred_count; i++) {
		const struct hb_deferred *d = &b->deferred[i];
#if HAVE_CUDA
		if (d->kind == DEFER_IPC) {
			gg_site_cuda_close(d->ptr);
			continue;
		}
#endif
		sum_free_now(b, d->ptr, true, d->kind == DEFER_NCCL_SUM);
	}
	b->deferred_count = 0;
	b->deferred_ipc = 0;
	b->deferred_bytes = 0;
}

/* What the memory limit leaves for a new sum, every spare kept. */
static uint64_t room(const struct gg_host_backend *b)
{
	uint64_t taken = b->stats.sum_bytes + b->stats.spare_bytes + b->deferred_bytes;

	return taken < b->opts.memory_bytes ? b->opts.memory_bytes - taken : 0;
}

static void drop_spare(struct gg_host_backend *b, struct hb_job *j)
{
	bool on_gpu = j->spare_on_gpu, nccl = j->spare_nccl;
	uint64_t bytes = j->spare_bytes;

	sum_free(b, take_spare(b, j), bytes, on_gpu, nccl);
}

/* The job's communicator is up, given up or freed: NCCL's bootstrap root
 * for its id, where it still waits for ranks, stops (a socket and a thread
 * of this process each, else for good). */
static void nccl_end_id(struct gg_host_backend *b, struct hb_job *j)
{
	if (b->opts.nccl->end_id)
		b->opts.nccl->end_id(j->nccl_id);
}

static void job_free(struct gg_host_backend *b, struct hb_job *j)
{
	for (unsigned i = 0; i < slots(b); i++)
		if (b->conns[i].linger == j) {
			b->conns[i].linger = NULL;
			b->conns[i].deadline_us = b->loop->now_us; /* settled at the next tick */
		}
	for (struct hb_job **p = &b->jobs; *p; p = &(*p)->next) {
		if (*p == j) {
			*p = j->next;
			break;
		}
	}
	/* The other sites hear why its ranks went: the gateway stopping, or
	 * what broke the job (a rank that left before the others). */
	if (b->core_ops->end_job) {
		char why[TEXT];
		snprintf(why, sizeof(why), "the gateway of site %s is shutting down", b->site);
		b->core_ops->end_job(b->core, j->name, b->stopping ? why : j->broken ? j->broken_msg : NULL);
	}
	drop_spare(b, j);
	/* Every rank is gone and no call of the gateway's is under way: what
	 * is still on its way to a rank is flushed before the communicator
	 * is freed. One still being joined is aborted. */
	if (j->nccl_comm && j->nccl_state == NCCL_UP)
		b->opts.nccl->finish(j->nccl_comm);
	else if (j->nccl_comm)
		b->opts.nccl->close(j->nccl_comm);
	if (j->nccl_state != NCCL_NONE)
		nccl_end_id(b, j);
	free(j->ranks);
	free(j->mem);
	free(j->gpu_out);
	free(j->mem_region);
	free(j->orphans);
	free(j);
	b->stats.jobs--;
}

/* Step `seq` failed here: the core fails it at the other sites too.
 * -EALREADY: the core holds its whole result and told the other sites,
 * so it completes or fails as they say. */
static int tell_core(struct gg_host_backend *b, struct hb_job *j, uint64_t seq, int code, const char *why)
{
	if (seq <= j->aborted_to)
		return 0;
	j->aborted_to = seq;
	return b->core_ops->abort ? b->core_ops->abort(b->core, j->name, seq, code, why) : 0;
}

/* Aborts the gateway's part of the job's NCCL communicator, and the
 * ranks' DONEs from now on tell them to abort theirs, which ends their
 * calls that wait on the gateway's. Steps that need it fail with `why`. */
static void nccl_abort(struct gg_host_backend *b, struct hb_job *j, int code, const char *why)
{
	if (j->nccl_state != NCCL_JOINING && j->nccl_state != NCCL_UP)
		return;
	b->opts.nccl->close(j->nccl_comm);
	j->nccl_comm = NULL;
	nccl_end_id(b, j);
	j->nccl_never_up = j->nccl_state == NCCL_JOINING;
	j->nccl_state = NCCL_ABORTED;
	if (j->spare_nccl)
		drop_spare(b, j); /* no NCCL step of the job can use it now */
	j->nccl_code = code;
	gg_ctrl_set_text(j->nccl_why, sizeof(j->nccl_why), why);
	hb_log(b, "job '%s': its NCCL communicator is aborted: %s", j->name, why);
}

/* Every request of the job fails from now on with `why`. */
static void job_break(struct gg_host_backend *b, struct hb_job *j, int code, const char *why)
{
	if (j->broken)
		return;
	/* A rank that left or broke the rules no longer takes part in the
	 * communicator's calls: those under way would wait for it forever.
	 * Between steps the communicator stays, to be flushed and freed with
	 * the job (an abort now could cut off a broadcast still forwarded
	 * between the other ranks); a rank that announces another NCCL step
	 * aborts it then. One still coming up has forwarded nothing, and
	 * can serve the job no more. */
	if (j->nccl_phase || step_uses_nccl(j) || j->nccl_state == NCCL_JOINING)
		nccl_abort(b, j, b->stopping ? GG_ERR_CLOSED : code, why);
	j->broken = code;
	gg_ctrl_set_text(j->broken_msg, sizeof(j->broken_msg), why);
	/* The step under way fails everywhere now, unless the other sites may
	 * have completed it already: then its remaining ranks here get its
	 * outcome. Later steps fail as the job's remaining ranks here announce
	 * them, or, once none is left, with the job's end. */
	if (j->with_core) {
		j->abandoned = true;
		if (tell_core(b, j, j->step.seq, code, why) == -EALREADY) {
			j->abandoned = false;
			hb_log(b, "job '%s' step %llu: its result was whole here and the other sites knew; it ends as "
				  "they say, for the ranks still there", j->name, (unsigned long long)j->step.seq);
		}
	} else if (step_in_progress(j) && j->nccl_phase != PHASE_BROADCAST) {
		tell_core(b, j, j->seq, code, why);
	}
}

static bool end_waiting_joiners(struct gg_host_backend *b, struct hb_job *j);

static void job_settle(struct gg_host_backend *b, struct hb_job *j)
{
	uint64_t poll;

	/* What an abort cut short ends now, not at the next tick. */
	if (j->nccl_state == NCCL_ABORTED)
		nccl_progress(b, j, b->loop->now_us, &poll);
	if (j->nccl_never_up && end_waiting_joiners(b, j))
		return;
	if (!j->connected && !j->with_core && !j->nccl_phase)
		job_free(b, j);
	else
		job_advance(b, j);
}

/* The core may still sum from and write into the memory of the step it
 * holds, even once that step failed at the ranks: when the rank lets
 * region `id` go (UNMAP, or leaving) while the step lies in it, the job
 * keeps it mapped until the core gives the step back. Returns true when
 * it did. */
static bool keep_for_core(struct hb_conn *c, unsigned id)
{
	struct hb_job *j = c->job;

	if (!j || !j->with_core || id >= GG_CTRL_MAX_REGIONS || j->mem_region[c->rank] != id || !c->regions[id].base ||
	    j->orphans[c->rank].base)
		return false;
	j->orphans[c->rank] = c->regions[id];
	c->regions[id] = (struct hb_region){ 0 };
	return true;
}

/* Any local user may open and close sessions at will (one process, 4000
 * a second): of the lines that ranks came or left, the log gets twice
 * max_clients and 16 a second, room for every rank of every job to leave
 * and come back, and the rest are counted and told once their second is
 * over (tell_held()). */
static bool session_log_now(struct gg_host_backend *b)
{
	return gg_log_limit_now(&b->session_log, b->loop->now_us, 2 * b->opts.max_clients + 16);
}

/* Says, once its second is over, how many lines a limit held back; returns
 * the earlier of `next` and when to look again. */
static uint64_t tell_held(struct gg_host_backend *b, struct gg_log_limit *l, const char *what, uint64_t next)
{
	uint64_t again = UINT64_MAX;
	unsigned held = gg_log_limit_take(l, b->loop->now_us, &again);

	if (held)
		hb_log(b, "control connections: %u more %s, not logged", held, what);
	return again == UINT64_MAX ? next : min_deadline(next, again);
}

/* Takes the connection out of its job; with `why`, the job cannot go on. */
static void conn_detach(struct gg_host_backend *b, struct hb_conn *c, const char *why)
{
	struct hb_job *j = c->job;

	if (!j)
		return;
	if (why) {
		if (session_log_now(b))
			hb_log(b, "%s", why);
		job_break(b, j, GG_ERR_RANK, why);
	}
	while (c->req_count)
		req_pop(c);
	keep_for_core(c, j->mem_region[c->rank]);
	j->ranks[c->rank] = NULL;
	j->connected--;
	c->job = NULL;
	job_settle(b, j);
}

static void conn_closing(struct gg_host_backend *b, struct hb_conn *c)
{
	c->state = C_CLOSING;
	c->deadline_us = b->loop->now_us + CLOSE_TIMEOUT_US;
}

/* Ends a text that snprintf() cut (`len` is what it returned) with "...". */
static void mark_cut(char *text, size_t size, int len)
{
	if (len >= 0 && (size_t)len >= size && size >= 4)
		memcpy(text + size - 4, "...", 4);
}

/* What to tell the job when rank `c` leaves: which rank, when, and at
 * which site (the other sites' ranks hear it too); a text too long for
 * `why` ends with "...". */
static void leave_reason(const struct gg_host_backend *b, const struct hb_conn *c, const char *what, char *why,
			 size_t size)
{
	const struct hb_job *j = c->job;
	int len;

	if (step_in_progress(j))
		len = snprintf(why, size, "rank %u of job '%s' %s during step %llu at site %s", c->rank, j->name, what,
			       (unsigned long long)j->seq, b->site);
	else if (j->seq > 1)
		len = snprintf(why, size, "rank %u of job '%s' %s after step %llu at site %s", c->rank, j->name, what,
			       (unsigned long long)j->seq - 1, b->site);
	else
		len = snprintf(why, size, "rank %u of job '%s' %s before its first step at site %s", c->rank, j->name,
			       what, b->site);
	mark_cut(why, size, len);
}

static bool job_alive(const struct gg_host_backend *b, const struct hb_job *j)
{
	for (const struct hb_job *o = b->jobs; o; o = o->next)
		if (o == j)
			return true;
	return false;
}

/* The peer went away (err 0: it closed) or a send/recv failed. */
static void conn_lost(struct gg_host_backend *b, struct hb_conn *c, int err)
{
	if (c->state == C_CLOSING || c->state == C_FREE)
		return;
	struct hb_job *stays = NULL;
	if (c->state == C_ACTIVE) {
		char what[96], why[TEXT];
		if (err)
			snprintf(what, sizeof(what), "lost its connection (%s)", strerror(-err));
		else
			snprintf(what, sizeof(what), "disconnected");
		leave_reason(b, c, what, why, sizeof(why));
		/* The last rank leaves a job whose step the core still holds:
		 * the job outlives it, failed, until the core lets go. */
		if (c->job->connected == 1 && (c->job->with_core || c->job->nccl_phase))
			stays = c->job;
		conn_detach(b, c, why);
		/* An abort may have ended its NCCL work, and the job, at once. */
		if (stays && !job_alive(b, stays))
			stays = NULL;
	}
	/* Nothing more can reach the peer; keep only the send in flight. */
	c->out_count = c->send_busy ? 1 : 0;
	conn_closing(b, c);
	c->linger = stays;
	conn_settle(b, c, b->loop->now_us);
}

/* Any local user may connect at will: of their refusals, the log gets at
 * most this many lines a second, and a line once the second is over says
 * how many it left out (tell_held()). */
#define REFUSALS_LOGGED 10

/* Logs the refusal of control connection `index` (-1: one with no slot). */
static void log_refusal(struct gg_host_backend *b, int index, const char *text)
{
	char conn[24] = "";

	if (!gg_log_limit_now(&b->refusal_log, b->loop->now_us, REFUSALS_LOGGED))
		return;
	if (index >= 0)
		snprintf(conn, sizeof(conn), " %d", index);
	hb_log(b, "control connection%s refused: %s", conn, text);
}

/* Refuses a connection that has not been accepted: REFUSE, then close. */
GG_PRINTF(4, 5) static void conn_refuse(struct gg_host_backend *b, struct hb_conn *c, int code, const char *fmt, ...)
{
	union gg_ctrl_msg *m = out_push(c, GG_CTRL_REFUSE);
	char text[TEXT];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	m->error.code = code;
	gg_ctrl_set_text(m->error.message, sizeof(m->error.message), text);
	log_refusal(b, (int)c->index, text);
	b->stats.refused++;
	conn_closing(b, c);
	out_kick(b, c);
}

/* Ends a registered rank's session: it leaves its job (which fails with
 * `why`, unless NULL), gets ERROR with `code` and `text`, and is closed. */
static void conn_end(struct gg_host_backend *b, struct hb_conn *c, int code, const char *text, const char *why)
{
	conn_detach(b, c, why);
	union gg_ctrl_msg *m = out_push(c, GG_CTRL_ERROR);
	if (m) {
		m->error.code = code;
		m->error.seq = c->next_seq;
		gg_ctrl_set_text(m->error.message, sizeof(m->error.message), text);
	}
	conn_closing(b, c);
	out_kick(b, c);
}

/* Ends a rank's session with ERROR `code` and the formatted text; its job
 * fails, saying the rank `how` (the text). */
GG_PRINTF(5, 0) static void conn_end_with(struct gg_host_backend *b, struct hb_conn *c, int code, const char *how,
					  const char *fmt, va_list ap)
{
	char text[TEXT], what[TEXT + 32], why[TEXT], msg[2 * TEXT];

	vsnprintf(text, sizeof(text), fmt, ap);
	snprintf(what, sizeof(what), "%s (%s)", how, text);
	leave_reason(b, c, what, why, sizeof(why));
	snprintf(msg, sizeof(msg), "gateway of site %s: %s", b->site, text);
	conn_end(b, c, code, msg, why);
}

/* A registered rank broke the protocol: it gets ERROR and is closed; its
 * job fails, naming it. */
GG_PRINTF(4, 5) static void conn_fatal(struct gg_host_backend *b, struct hb_conn *c, int code, const char *fmt, ...)
{
	va_list ap;

	b->stats.violations++;
	va_start(ap, fmt);
	conn_end_with(b, c, code, "broke the control protocol", fmt, ap);
	va_end(ap);
}

/* The gateway cannot do what a rank asked for (take its GPU memory without
 * a usable GPU): the rank gets ERROR and is closed, and its job fails,
 * naming it; but it broke no rule. */
GG_PRINTF(4, 5) static void conn_unserved(struct gg_host_backend *b, struct hb_conn *c, int code, const char *fmt,
					  ...)
{
	va_list ap;

	va_start(ap, fmt);
	conn_end_with(b, c, code, "could not be served", fmt, ap);
	va_end(ap);
}

/* The job failed while the rank waited for it, as end_waiting_joiners()
 * tells: it gets ERROR and is closed. */
GG_PRINTF(4, 5) static void conn_gone_with(struct gg_host_backend *b, struct hb_conn *c, int code, const char *fmt,
					   ...)
{
	va_list ap;

	va_start(ap, fmt);
	conn_end_with(b, c, code, "was waiting for the job's NCCL communicator to come up", fmt, ap);
	va_end(ap);
}

/* The job's NCCL communicator was given up before it came up: its ranks
 * that asked to join it and announced no step since wait in their first
 * gg_allreduce_nccl for it to come up, and would until their timeout.
 * Their sessions end now, with the job's failure or the communicator's,
 * as would a rank's that asked to join it only now. Returns true when
 * one ended: the job may be gone then. */
static bool end_waiting_joiners(struct gg_host_backend *b, struct hb_job *j)
{
	char why[TEXT];
	bool ended = false;

	j->nccl_never_up = false;
	/* A stopping gateway ends every session itself, with GG_ERR_CLOSED. */
	if (b->stopping)
		return false;
	/* The job fails with the communicator's cause (its join failed or
	 * timed out here), not with the ranks that are told of it. */
	if (!j->broken)
		job_break(b, j, j->nccl_code, j->nccl_why);
	const int code = j->broken;
	gg_ctrl_set_text(why, sizeof(why), j->broken_msg);
	/* Each end settles the job, which the last one frees. */
	for (unsigned r = 0; job_alive(b, j) && r < j->nranks; r++) {
		struct hb_conn *c = j->ranks[r];
		if (c && c->nccl_joined && !c->req_count) {
			conn_gone_with(b, c, code, "%s", why);
			ended = true;
		}
	}
	return ended;
}

/* ---- idle jobs ------------------------------------------------------------ */

/* A job none of whose ranks sent anything for session_idle, with no step
 * under way. */
static bool job_idle(const struct gg_host_backend *b, const struct hb_job *j)
{
	return b->opts.session_idle_us && j->connected && !step_in_progress(j) &&
	       b->loop->now_us - j->active_us >= b->opts.session_idle_us;
}

/* Connections past max_clients that may stay while they have not said
 * what they are: a `gradgate status` finds room on a full gateway without
 * making an idle job give its sessions up, and a session that comes this
 * way is held to max_clients once its HELLO says it is one. */
#define STATUS_SLOTS 2u

static unsigned slots(const struct gg_host_backend *b)
{
	return b->opts.max_clients + STATUS_SLOTS;
}

/* The idle job idle longest, or NULL. */
static struct hb_job *idlest_job(const struct gg_host_backend *b)
{
	struct hb_job *best = NULL;

	for (struct hb_job *j = b->jobs; j; j = j->next)
		if (job_idle(b, j) && (!best || j->active_us < best->active_us))
			best = j;
	return best;
}

/* Closes the sessions of idle job `j` (which is then gone) for a
 * connection that needs them: `needed` says what for. */
static void job_evict(struct gg_host_backend *b, struct hb_job *j, const char *needed)
{
	char idle[32], limit[32], text[TEXT];

	snprintf(text, sizeof(text), "gateway of site %s: job '%s' sent nothing for %s (session_idle = %s), and %s: "
		 "its sessions are closed", b->site, j->name, gg_format_elapsed(b->loop->now_us - j->active_us, idle,
		 sizeof(idle)), gg_format_duration(b->opts.session_idle_us, limit, sizeof(limit)), needed);
	hb_log(b, "%s", text);
	for (unsigned i = 0; i < slots(b); i++) {
		struct hb_conn *c = &b->conns[i];
		if (c->state != C_ACTIVE || c->job != j)
			continue;
		bool last = j->connected == 1;
		b->stats.evicted++;
		conn_end(b, c, GG_ERR_CLOSED, text, NULL);
		if (last)
			break;
	}
}

/* " (job 'x' of uid U idle longest, for T of session_idle = L)" or "". */
static void idle_hint(const struct gg_host_backend *b, char *buf, size_t size)
{
	const struct hb_job *best = NULL;
	char idle[32], limit[32];

	bool jobs = false;

	buf[0] = '\0';
	for (const struct hb_job *j = b->jobs; j; j = j->next) {
		jobs |= j->connected > 0;
		if (j->connected && !step_in_progress(j) && (!best || j->active_us < best->active_us))
			best = j;
	}
	if (!b->opts.session_idle_us)
		return;
	if (!best) {
		snprintf(buf, size, jobs ? "; every job has a step under way" : "; none of them has joined a job yet");
		return;
	}
	snprintf(buf, size, "; the job idle longest has been for %s, and a job gives its sessions up after "
		 "session_idle = %s", gg_format_elapsed(b->loop->now_us - best->active_us, idle, sizeof(idle)),
		 gg_format_duration(b->opts.session_idle_us, limit, sizeof(limit)));
}

static void arm_recv(struct gg_host_backend *b, struct hb_conn *c)
{
	c->iov.iov_base = &c->in;
	c->iov.iov_len = sizeof(c->in);
	memset(&c->mh, 0, sizeof(c->mh));
	c->mh.msg_iov = &c->iov;
	c->mh.msg_iovlen = 1;
	c->mh.msg_control = c->cbuf;
	c->mh.msg_controllen = sizeof(c->cbuf);
	int rc = gg_loop_recvmsg(b->loop, c->fd, &c->mh, MSG_TRUNC | MSG_CMSG_CLOEXEC, ud(b, K_RECV, c));
	if (rc) {
		hb_log(b, "control connection %u: cannot queue a receive: %s", c->index, strerror(-rc));
		conn_lost(b, c, rc);
		return;
	}
	c->recv_busy = true;
}

static struct hb_conn *first_free(struct gg_host_backend *b)
{
	for (unsigned i = 0; i < slots(b); i++)
		if (b->conns[i].state == C_FREE)
			return &b->conns[i];
	return NULL;
}

/* Slots taken: those that count against max_clients, or the spare ones. */
static unsigned taken(const struct gg_host_backend *b, bool spare)
{
	unsigned n = 0;

	for (unsigned i = 0; i < slots(b); i++)
		n += b->conns[i].state != C_FREE && b->conns[i].spare == spare;
	return n;
}

/* A free slot within max_clients, or NULL. */
static struct hb_conn *free_slot(struct gg_host_backend *b)
{
	return taken(b, false) < b->opts.max_clients ? first_free(b) : NULL;
}

/* Places within max_clients that connections keep: taken, not spare and
 * not closing. max_clients less this, less the connections waiting, is
 * what is free now or once those closing are gone. */
static unsigned held(const struct gg_host_backend *b)
{
	unsigned n = 0;

	for (unsigned i = 0; i < slots(b); i++) {
		const struct hb_conn *c = &b->conns[i];
		n += c->state != C_FREE && c->state != C_CLOSING && !c->spare;
	}
	return n;
}

/* How long `c` has waited for its first message. */
static uint64_t silent_for(const struct gg_host_backend *b, const struct hb_conn *c)
{
	return b->loop->now_us + b->opts.hello_timeout_us - c->deadline_us;
}

/* The connection on a spare slot (spare) or one within max_clients that
 * has waited longest for its first message, other than `except`; or NULL.
 * Only one silent for SILENT_MIN_US (any, with `young`): the client
 * library sends its HELLO as it connects, but one that came in the same
 * turn as a later connection may not be read yet. */
static struct hb_conn *oldest_silent(struct gg_host_backend *b, bool spare, bool young, const struct hb_conn *except)
{
	struct hb_conn *best = NULL;

	for (unsigned i = 0; i < slots(b); i++) {
		struct hb_conn *c = &b->conns[i];
		if (c != except && c->state == C_HELLO && c->spare == spare && (young || silent_for(b, c) >= SILENT_MIN_US) &&
		    (!best || c->deadline_us < best->deadline_us))
			best = c;
	}
	return best;
}

/* Gives the slot of `c`, which has sent nothing yet, to a new connection:
 * connections that say nothing cannot keep ranks or a status request out
 * until the HELLO timeout. */
static void silent_evict(struct gg_host_backend *b, struct hb_conn *c)
{
	char waited[32];

	conn_refuse(b, c, GG_ERR_REFUSED, "sent nothing for %s while a new connection needed its slot (max_clients = "
		    "%u are taken)", gg_format_elapsed(silent_for(b, c), waited, sizeof(waited)), b->opts.max_clients);
}

/* Connections within max_clients (spare: on the spare slots) that have
 * sent nothing yet, however briefly. */
static unsigned count_silent(const struct gg_host_backend *b, bool spare)
{
	unsigned n = 0;

	for (unsigned i = 0; i < slots(b); i++)
		n += b->conns[i].state == C_HELLO && b->conns[i].spare == spare;
	return n;
}

/* When the next connection that has sent nothing will have been silent for
 * SILENT_MIN_US, or 0. */
static uint64_t silent_due(const struct gg_host_backend *b)
{
	uint64_t due = 0;

	for (unsigned i = 0; i < slots(b); i++) {
		const struct hb_conn *c = &b->conns[i];
		if (c->state == C_HELLO && silent_for(b, c) < SILENT_MIN_US)
			due = min_deadline(due, b->loop->now_us + SILENT_MIN_US - silent_for(b, c));
	}
	return due;
}

/* Makes room for `more` connections besides those held (and `except`,
 * which is not to go): connections silent since they came (for
 * SILENT_MIN_US at least, but with `young`), the longest first, then the
 * idle jobs idle longest give their places up, as many as it takes. True
 * when there is room. */
static bool make_room(struct gg_host_backend *b, unsigned more, const struct hb_conn *except, bool young)
{
	struct hb_job *idle;
	struct hb_conn *silent;

	while (held(b) + more > b->opts.max_clients) {
		if ((silent = oldest_silent(b, false, young, except)))
			silent_evict(b, silent);
		else if ((idle = idlest_job(b)))
			job_evict(b, idle, "a new connection needs a slot (max_clients are taken)");
		else
			return false;
	}
	return true;
}

/* Refuses a connection that has no slot: REFUSE, then close. */
static void refuse_unslotted(struct gg_host_backend *b, int fd, int code, const char *text)
{
	union gg_ctrl_msg m;
	size_t len = gg_ctrl_init(&m, GG_CTRL_REFUSE);

	m.error.code = code;
	gg_ctrl_set_text(m.error.message, sizeof(m.error.message), text);
	/* Nothing was ever sent on the socket: this cannot block. */
	(void)send(fd, &m, len, MSG_DONTWAIT | MSG_NOSIGNAL);
	close(fd);
	log_refusal(b, -1, text);
	b->stats.refused++;
}

static void conn_start(struct gg_host_backend *b, struct hb_conn *c, int fd);
static uint64_t serve_waiting(struct gg_host_backend *b, uint64_t now_us);

/* A new connection: it takes a free slot; or a spare one, until its first
 * message says what it is; or, with every slot taken, waits for one that
 * is being freed (that of the connection silent longest, or an idle
 * job's, closed now if need be); or is refused. Those already waiting go
 * first. */
static void conn_new(struct gg_host_backend *b, int fd)
{
	struct hb_conn *c = b->waiting_count ? NULL : free_slot(b);
	char text[2 * TEXT], hint[TEXT];

	if (c) {
		conn_start(b, c, fd);
		return;
	}
	if (b->spare_wait_fd < 0 && taken(b, true) < STATUS_SLOTS && (c = first_free(b))) {
		c->spare = true;
		conn_start(b, c, fd);
		return;
	}
	/* It queues behind those waiting when a slot is free or being freed:
	 * a silent connection's or an idle job's, closed now if no other is,
	 * or that of a connection silent yet for too short a while (closed
	 * once it has been), one for each connection waiting. */
	if (b->waiting_count < WAITING_MAX &&
	    (make_room(b, b->waiting_count + 1, NULL, false) ||
	     held(b) + b->waiting_count + 1 <= b->opts.max_clients + count_silent(b, false))) {
		b->waiting[b->waiting_count].fd = fd;
		b->waiting[b->waiting_count++].until_us = b->loop->now_us + b->opts.hello_timeout_us;
		serve_waiting(b, b->loop->now_us);
		return;
	}
	if (b->spare_wait_fd < 0 && oldest_silent(b, true, true, NULL)) {
		/* Every place is held by a session, and silent connections hold
		 * the spare slots: the one silent longest goes (once it has been
		 * for SILENT_MIN_US), and this one takes its slot. */
		b->spare_wait_fd = fd;
		b->spare_wait_until_us = b->loop->now_us + b->opts.hello_timeout_us;
		serve_waiting(b, b->loop->now_us);
		return;
	}
	if (b->waiting_count < WAITING_MAX)
		idle_hint(b, hint, sizeof(hint));
	else
		snprintf(hint, sizeof(hint), ", and %u more wait for slots being freed", WAITING_MAX);
	snprintf(text, sizeof(text), "the gateway of site %s already serves max_clients = %u connections%s", b->site,
		 b->opts.max_clients, hint);
	refuse_unslotted(b, fd, GG_ERR_REFUSED, text);
}

/* Refuses a connection that waited for a slot until its deadline, or
 * until the gateway began to stop, or came after that. */
static void refuse_waited(struct gg_host_backend *b, int fd)
{
	char text[TEXT];

	snprintf(text, sizeof(text), "the gateway of site %s %s", b->site,
		 b->stopping ? "is shutting down" : "had no slot free in time (max_clients are taken)");
	refuse_unslotted(b, fd, b->stopping ? GG_ERR_CLOSED : GG_ERR_REFUSED, text);
}

/* Connections waiting for a slot take those freed since, in order; those
 * past their deadline are refused. Returns the next deadline (0: none). */
static uint64_t serve_waiting(struct gg_host_backend *b, uint64_t now_us)
{
	uint64_t next = 0;

	if (b->spare_wait_fd >= 0) {
		struct hb_conn *c = b->stopping || taken(b, true) >= STATUS_SLOTS ? NULL : first_free(b);
		if (c) {
			c->spare = true;
			conn_start(b, c, b->spare_wait_fd);
			b->spare_wait_fd = -1;
		} else if (now_us >= b->spare_wait_until_us || b->stopping) {
			refuse_waited(b, b->spare_wait_fd);
			b->spare_wait_fd = -1;
		} else {
			/* A spare slot being freed is this one's; else the one
			 * silent longest goes, once it has been long enough. */
			bool freeing = false;
			for (unsigned i = 0; i < slots(b); i++)
				freeing |= b->conns[i].spare && b->conns[i].state == C_CLOSING;
			struct hb_conn *silent = freeing ? NULL : oldest_silent(b, true, false, NULL);
			if (silent)
				silent_evict(b, silent);
			next = min_deadline(b->spare_wait_until_us, freeing || silent ? 0 : silent_due(b));
		}
	}
	/* Places for those waiting: silent connections that have been so
	 * long enough now, or idle jobs, give theirs up. */
	if (b->waiting_count && !b->stopping)
		make_room(b, b->waiting_count, NULL, false);
	while (b->waiting_count) {
		struct hb_conn *c = b->stopping ? NULL : free_slot(b);
		int fd = b->waiting[0].fd;
		if (!c && now_us < b->waiting[0].until_us && !b->stopping) {
			/* and when a connection silent now has been long enough */
			return min_deadline(min_deadline(next, b->waiting[0].until_us), silent_due(b));
		}
		memmove(&b->waiting[0], &b->waiting[1], --b->waiting_count * sizeof(b->waiting[0]));
		if (c)
			conn_start(b, c, fd);
		else
			refuse_waited(b, fd);
	}
	return next;
}

static void conn_start(struct gg_host_backend *b, struct hb_conn *c, int fd)
{
	struct ucred cred;
	socklen_t cred_len = sizeof(cred);
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len))
		cred = (struct ucred){ .pid = 0, .uid = (uid_t)-1 };
	c->state = C_HELLO;
	c->fd = fd;
	c->uid = cred.uid;
	c->pid = cred.pid;
	c->deadline_us = b->loop->now_us + b->opts.hello_timeout_us;
	b->stats.connections++;
	arm_recv(b, c);
}

/* ---- jobs and steps ----------------------------------------------------- */

/* Whether a rank announced step j->seq through the job's NCCL
 * communicator. */
static bool step_uses_nccl(struct hb_job *j)
{
	for (unsigned r = 0; r < j->nranks; r++) {
		struct hb_conn *c = j->ranks[r];
		struct hb_req *h = c ? head(c) : NULL;
		if (h && h->seq == j->seq && h->region == GG_CTRL_REGION_NCCL)
			return true;
	}
	return false;
}

/* Fails step j->seq at the ranks that announced it; those that come later
 * get the same message. */
GG_PRINTF(4, 5) static void fail_step(struct gg_host_backend *b, struct hb_job *j, int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	struct hb_failed *f = &j->failed[j->failed_next++ % FAILED_KEPT];
	vsnprintf(f->msg, sizeof(f->msg), fmt, ap);
	va_end(ap);
	f->seq = j->seq;
	f->code = code;
	hb_log(b, "job '%s' step %llu failed: %s", j->name, (unsigned long long)j->seq, f->msg);
	tell_core(b, j, j->seq, code, f->msg);
	/* Ranks that announced it through NCCL wait in a reduce the gateway
	 * will not join. */
	if (step_uses_nccl(j))
		nccl_abort(b, j, code, f->msg);
	for (unsigned r = 0; r < j->nranks; r++) {
		struct hb_conn *c = j->ranks[r];
		struct hb_req *h = c ? head(c) : NULL;
		if (h && h->seq == j->seq)
			answer(b, c, code, "step %llu (tensor %u): %s", (unsigned long long)h->seq, h->tensor_id,
			       f->msg);
	}
	j->seq++;
	j->deadline_us = 0;
	b->stats.steps_failed++;
}

/* The ranks of the job that `lacks` says lack something, as "1, 3 (not
 * connected) and 2 more" into buf; returns how many there are. */
static unsigned rank_list(const struct hb_job *j, bool (*lacks)(const struct hb_job *, const struct hb_conn *),
			  char *buf, size_t size)
{
	size_t len = 0;
	unsigned missing = 0, shown = 0;

	buf[0] = 0;
	for (unsigned r = 0; r < j->nranks; r++) {
		const struct hb_conn *c = j->ranks[r];
		if (!lacks(j, c))
			continue;
		missing++;
		if (shown < 8 && len < size - 40) {
			len += (size_t)snprintf(buf + len, size - len, "%s%u%s", shown ? ", " : "", r,
						c ? "" : " (not connected)");
			shown++;
		}
	}
	if (missing > shown)
		snprintf(buf + len, size - len, " and %u more", missing - shown);
	return missing;
}

static bool not_joined(const struct hb_job *j, const struct hb_conn *c)
{
	(void)j;
	return !c || !c->nccl_joined;
}

static bool not_announced(const struct hb_job *j, const struct hb_conn *c)
{
	const struct hb_req *h = c ? head(c) : NULL;

	return !h || h->seq != j->seq;
}

/* Which ranks of the job have not asked to join its NCCL communicator:
 * "ranks 1, 3 (not connected) did not ask to join it", or "every rank
 * asked to join it"; into buf (160 bytes or more). */
static const char *nccl_joiners(const struct hb_job *j, char *buf, size_t size)
{
	char list[112];
	unsigned missing = rank_list(j, not_joined, list, sizeof(list));

	if (!missing)
		snprintf(buf, size, "every rank asked to join it");
	else
		snprintf(buf, size, "rank%s %s did not ask to join it", missing == 1 ? "" : "s", list);
	return buf;
}

static void fail_timeout(struct gg_host_backend *b, struct hb_job *j)
{
	char list[160];
	unsigned missing = rank_list(j, not_announced, list, sizeof(list));

	if (!missing) {
		fail_step(b, j, GG_ERR_TIMEOUT, "timed out after %u ms waiting for the NCCL communicator of job '%s' to "
			  "come up: %s", j->deadline_ms, j->name, nccl_joiners(j, list, sizeof(list)));
		return;
	}
	fail_step(b, j, GG_ERR_TIMEOUT, "timed out after %u ms waiting for rank%s %s of job '%s'", j->deadline_ms,
		  missing == 1 ? "" : "s", list, j->name);
}

/* The step's own sum buffer, if it has one, becomes the job's spare (it
 * took the previous one). */
static void step_release_sum(struct gg_host_backend *b, struct hb_job *j)
{
	if (j->sum_owned && j->step_nccl && j->nccl_state != NCCL_UP) {
		/* No NCCL step of the job can use it any more. */
		b->stats.sum_bytes -= j->sum_cap;
		sum_free(b, j->step.sum, j->sum_cap, true, true);
	} else if (j->sum_owned) {
		b->stats.sum_bytes -= j->sum_cap;
		j->spare = j->step.sum;
		j->spare_bytes = j->sum_cap;
		j->spare_on_gpu = j->on_gpu;
		j->spare_nccl = j->step_nccl;
		b->stats.spare_bytes += j->spare_bytes;
	}
	j->step.sum = NULL;
	j->sum_owned = false;
	j->on_gpu = false;
	j->step_nccl = false;
}

/* The core is done with the step (or refused it): every rank learns the
 * outcome (the results are in place already), and the job moves to its
 * next step. */
static void deliver(struct gg_host_backend *b, struct hb_job *j, int status, const char *message)
{
	struct gg_site_step *st = &j->step;
	char gpu_msg[2 * TEXT];
	bool gpu_failed = false;

	if (status > 0)
		status = GG_ERR_SITE;
	/* The communicator was aborted while the core held the step (a rank
	 * left after the other sites were told the result was whole): the
	 * result cannot reach the ranks. */
	if (j->step_nccl && j->nccl_state != NCCL_UP && !status && !j->abandoned) {
		status = j->nccl_code;
		message = j->nccl_why;
	}
#if HAVE_CUDA
	if (!status && j->on_gpu && !j->abandoned && !j->step_nccl) {
		/* Only to the ranks still here: one that left was told the step
		 * failed, and its memory stays as it was. */
		unsigned n = 0;
		for (unsigned r = 0; r < j->nranks; r++)
			if (j->ranks[r] && head(j->ranks[r]))
				j->gpu_out[n++] = j->mem[r];
		char why[TEXT - 96];
		if (n && gg_site_cuda_store(j->gpu_out, n, st->dtype == GG_DTYPE_BF16, st->sum, st->count, why,
					    sizeof(why))) {
			snprintf(gpu_msg, sizeof(gpu_msg), "site %s: writing the result into the ranks' GPU memory: %s",
				 b->site, why);
			status = GG_ERR_SYSTEM;
			message = gpu_msg;
			gpu_failed = true;
		}
	}
#else
	(void)gpu_msg, (void)st;
#endif
	if (!j->abandoned) {
		for (unsigned r = 0; r < j->nranks; r++) {
			struct hb_conn *c = j->ranks[r];
			struct hb_req *h = c ? head(c) : NULL;
			if (!h)
				continue; /* a rank that left after the core had the result */
			if (status)
				answer(b, c, status, "step %llu (tensor %u): %s", (unsigned long long)h->seq, h->tensor_id,
				       message);
			else
				answer(b, c, GG_OK, "%s", "");
		}
		if (status) {
			b->stats.steps_failed++;
			hb_log(b, "job '%s' step %llu failed: %s", j->name, (unsigned long long)j->seq, message);
		} else {
			b->stats.steps_done++;
		}
	}
	step_release_sum(b, j);
	for (unsigned r = 0; r < j->nranks; r++)
		region_unmap(b, &j->orphans[r]);
	if (j->with_core) { /* not after an NCCL step's broadcast */
		j->with_core = false;
		b->stats.core_steps--;
	}
	j->abandoned = false;
	j->seq++;
	j->deadline_us = 0;
	/* The other sites completed the step and this one could not: the job
	 * cannot go on as one (and the GPU may be unusable). */
	if (gpu_failed)
		job_break(b, j, GG_ERR_SYSTEM, gpu_msg);
}

/* An NCCL step's broadcast could not be made: the ranks are told with
 * the core's outcome, or, when the step completed elsewhere, with `text`;
 * then the job cannot go on as one. */
static void broadcast_failed(struct gg_host_backend *b, struct hb_job *j, int status, const char *message, int code,
			     const char *text)
{
	nccl_abort(b, j, code, text);
	deliver(b, j, status ? status : code, status ? message : text);
	if (!status)
		job_break(b, j, code, text);
}

/* The core is done with the step. An NCCL step's result goes to the ranks
 * by the gateway's broadcast first, whatever the outcome: the ranks wait
 * in theirs, and the communicator would hang. The tick sees it finish. */
static void finish_step(struct gg_host_backend *b, struct hb_job *j, int status, const char *message)
{
	char why[TEXT - 96], text[2 * TEXT];

	if (!j->step_nccl || j->abandoned || j->nccl_state != NCCL_UP) {
		deliver(b, j, status, message);
		return;
	}
	if (b->opts.nccl->broadcast(j->nccl_comm, j->step.sum, j->step.count, why, sizeof(why))) {
		snprintf(text, sizeof(text), "site %s: handing the result to the ranks: %s", b->site, why);
		broadcast_failed(b, j, status, message, GG_ERR_SYSTEM, text);
		return;
	}
	/* The core is done with it: only the broadcast holds the step now. */
	j->with_core = false;
	b->stats.core_steps--;
	nccl_phase_set(b, j, PHASE_BROADCAST);
	j->nccl_since_us = b->loop->now_us;
	j->nccl_until_us = GG_MAX(j->step.deadline_us, b->loop->now_us) + b->opts.answer_grace_us;
	j->nccl_outcome = status;
	gg_ctrl_set_text(j->nccl_outcome_msg, sizeof(j->nccl_outcome_msg), message ? message : "");
}

/* The site sum of a range, in rank order: in place in rank 0's memory for
 * float32, into the job's own buffer for bfloat16. */
static void hb_gather(const struct gg_site_step *st, uint64_t offset, uint64_t n)
{
	const struct hb_job *j = st->backend_data;

	if (st->dtype == GG_DTYPE_F32)
		gg_host_sum_f32(st->sum, (const float *const *)j->mem, j->nranks, offset, n);
	else
		gg_host_sum_bf16(st->sum, (const uint16_t *const *)j->mem, j->nranks, offset, n);
}

/* The result of a range into every rank's memory but the one it is in. */
static void hb_deliver(const struct gg_site_step *st, uint64_t offset, uint64_t n)
{
	const struct hb_job *j = st->backend_data;

	for (unsigned r = 0; r < j->nranks; r++) {
		if (st->dtype == GG_DTYPE_BF16)
			gg_host_store_bf16((uint16_t *)j->mem[r] + offset, st->sum + offset, n);
		else if (j->mem[r] != st->sum)
			memcpy((float *)j->mem[r] + offset, st->sum + offset, n * sizeof(float));
	}
}

/* A step in the ranks' GPU memory is summed whole on the gateway's GPU
 * before the core gets it, and its result written back whole once the
 * core is done (deliver()): a CUDA failure then fails the step cleanly,
 * here or at this site's ranks, where one in the core's ranges could not. */
static void range_ready(const struct gg_site_step *st, uint64_t offset, uint64_t n)
{
	(void)st, (void)offset, (void)n;
}

/* The site sum of a step in GPU memory into device memory of the
 * gateway's GPU (*sum: a spare of the job's, or NULL for a new one), where
 * the core encodes and decodes it. Returns false when the step failed,
 * the sum freed. */
static bool gpu_sum(struct gg_host_backend *b, struct hb_job *j, const struct hb_req *ref, float **sum, uint64_t cap)
{
#if HAVE_CUDA
	char why[TEXT - 96];
	int rc = 0;

	if (!*sum)
		rc = gg_dev_alloc((void **)sum, ref->count * sizeof(float), why, sizeof(why));
	if (!rc)
		rc = gg_site_cuda_sum(*sum, (const void *const *)j->mem, j->nranks, ref->dtype == GG_DTYPE_BF16,
				      ref->count, why, sizeof(why));
	if (!rc)
		return true;
	sum_free(b, *sum, cap, true, false);
	*sum = NULL;
	fail_step(b, j, rc == -ENOMEM ? GG_ERR_NOMEM : GG_ERR_SYSTEM, "summing on the gateway's GPU: %s", why);
	return false;
#else
	/* No region is a device one without CUDA: MAP_CUDA is refused. */
	(void)ref, (void)sum, (void)cap;
	fail_step(b, j, GG_ERR_INVALID, "the gateway was built without CUDA");
	return false;
#endif
}

/* Hands the step to the core. Returns true when the core holds it; false
 * when it is already over (failed, or completed from inside submit) and the
 * job should look at its next step. */
enum mem_kind { MEM_HOST, MEM_GPU, MEM_NCCL };

static enum mem_kind mem_kind(const struct hb_conn *c, const struct hb_req *h)
{
	if (h->region == GG_CTRL_REGION_NCCL)
		return MEM_NCCL;
	return c->regions[h->region].device ? MEM_GPU : MEM_HOST;
}

static bool step_start(struct gg_host_backend *b, struct hb_job *j, const struct hb_req *ref)
{
	static const char *const kind_text[] = { "in host memory", "in GPU memory", "through NCCL" };
	const uint64_t bytes = ref->count * sizeof(float);
	enum mem_kind kind = MEM_HOST;
	float *sum = NULL;

	for (unsigned r = 0; r < j->nranks; r++) {
		struct hb_conn *c = j->ranks[r];
		struct hb_req *h = head(c);
		enum mem_kind k = mem_kind(c, h);
		if (r == 0) {
			kind = k;
		} else if (k != kind) {
			fail_step(b, j, GG_ERR_MISMATCH,
				  "ranks hold the step in different kinds of memory: rank 0 %s, rank %u %s "
				  "(gg_allreduce_cuda takes GPU memory, gg_allreduce_nccl goes through NCCL, the other "
				  "calls take host memory)", kind_text[kind], r, kind_text[k]);
			return false;
		}
		j->mem[r] = k == MEM_NCCL ? NULL : c->regions[h->region].base + h->offset;
		j->mem_region[r] = h->region;
	}
	if (kind == MEM_NCCL && j->nccl_state == NCCL_ABORTED) {
		fail_step(b, j, j->nccl_code, "%s", j->nccl_why);
		return false;
	}
	if (kind == MEM_NCCL && j->nccl_state != NCCL_UP) { /* job_advance waits while it is joined */
		fail_step(b, j, GG_ERR_PROTOCOL, "the NCCL communicator of job '%s' is not up", j->name);
		return false;
	}
	const bool device = kind != MEM_HOST, nccl = kind == MEM_NCCL;
	/* bfloat16 ranks: the float32 sum needs memory of its own; so does a
	 * step in the ranks' GPU memory, on the gateway's GPU. */
	const bool own_sum = ref->dtype != GG_DTYPE_F32 || device;
	void (*gather)(const struct gg_site_step *, uint64_t, uint64_t) = hb_gather;
	void (*deliver_range)(const struct gg_site_step *, uint64_t, uint64_t) = hb_deliver;
	if (own_sum) {
		/* A device buffer is costly to make (and freeing one waits for
		 * the GPU): any large enough will do for a step in GPU memory, so
		 * a job's buckets of different sizes share one. */
		bool fits = j->spare && j->spare_on_gpu == device && j->spare_nccl == nccl &&
			    (device ? j->spare_bytes >= bytes : j->spare_bytes == bytes);
		uint64_t cap = fits ? j->spare_bytes : bytes;
		sum = fits ? take_spare(b, j) : NULL;
		if (!fits) {
			drop_spare(b, j);
			/* Buffers other jobs keep go first, when that makes room;
			 * GPU buffers that wait for an NCCL call to end to be
			 * freed still count (sum_free). */
			fits = b->stats.sum_bytes + b->deferred_bytes + bytes <= b->opts.memory_bytes;
			for (struct hb_job *o = b->jobs; fits && o && bytes > room(b); o = o->next)
				drop_spare(b, o);
			fits = fits && bytes <= room(b);
		}
		if (!fits) {
			fail_step(b, j, GG_ERR_LIMIT,
				  "the gateway's memory limit of %llu bytes leaves no room for a %llu-byte sum (%llu in "
				  "use)", (unsigned long long)b->opts.memory_bytes, (unsigned long long)bytes,
				  (unsigned long long)(b->stats.sum_bytes + b->deferred_bytes));
			return false;
		}
		if (!sum && !device && !(sum = malloc(bytes))) {
			fail_step(b, j, GG_ERR_NOMEM, "the gateway is out of memory for a %llu-byte sum",
				  (unsigned long long)bytes);
			return false;
		}
		if (nccl) {
			char why[TEXT - 96];
			int rc = sum ? 0 : b->opts.nccl->alloc(&sum, ref->count, why, sizeof(why));
			if (rc) {
				fail_step(b, j, rc == -ENOMEM ? GG_ERR_NOMEM : GG_ERR_SYSTEM,
					  "site %s: memory for the site sum on the gateway's GPU: %s", b->site, why);
				return false;
			}
		} else if (device && !gpu_sum(b, j, ref, &sum, cap)) {
			return false;
		}
		b->stats.sum_bytes += cap;
		j->sum_cap = cap;
	} else {
		sum = j->mem[0];
	}

	if (device)
		gather = deliver_range = range_ready;
	j->step = (struct gg_site_step){
		.backend = &b->base,
		.job = j->name,
		.seq = j->seq,
		.tensor_id = ref->tensor_id,
		.count = ref->count,
		.dtype = (enum gg_dtype)ref->dtype,
		.memory = device ? GG_STEP_MEM_CUDA : GG_STEP_MEM_HOST,
		.nranks = j->nranks,
		.sum = sum,
		.deadline_us = j->deadline_us,
		.timeout_ms = j->deadline_ms,
		.gather = gather,
		.deliver = deliver_range,
		.backend_data = j,
	};
	j->sum_owned = own_sum;
	j->on_gpu = device;
	j->step_nccl = nccl;
	if (!nccl)
		return step_submit(b, j);
	/* The site sum comes by the ranks' reduce, which the tick watches. */
	char why[TEXT - 96];
	if (b->opts.nccl->reduce(j->nccl_comm, sum, ref->count, why, sizeof(why))) {
		char text[2 * TEXT];
		snprintf(text, sizeof(text), "site %s: summing the ranks' tensors: %s", b->site, why);
		step_release_sum(b, j);
		nccl_abort(b, j, GG_ERR_SYSTEM, text);
		fail_step(b, j, GG_ERR_SYSTEM, "%s", text);
		return false;
	}
	nccl_phase_set(b, j, PHASE_REDUCE);
	j->nccl_since_us = b->loop->now_us;
	j->nccl_until_us = j->deadline_us;
	return true;
}

/* Hands the step set up in j->step to the core. Returns true while the
 * step is under way; false when it is over (failed, or completed from
 * inside submit) and the job should look at its next step. */
static bool step_submit(struct gg_host_backend *b, struct hb_job *j)
{
	j->with_core = true;
	b->stats.core_steps++;
	j->in_submit = true;
	j->sync_done = false;
	int rc = b->core_ops->submit(b->core, &j->step);
	j->in_submit = false;
	if (j->sync_done) {
		finish_step(b, j, j->sync_status, j->sync_msg);
	} else if (rc) {
		char text[TEXT];
		snprintf(text, sizeof(text), "site core refused the step: %s", gg_strerror(rc));
		finish_step(b, j, rc < 0 ? rc : GG_ERR_SITE, text);
	} else {
		return true;
	}
	return j->nccl_phase != PHASE_NONE;
}

static bool same_tensor(const struct hb_req *a, const struct hb_req *z)
{
	return a->tensor_id == z->tensor_id && a->count == z->count && a->dtype == z->dtype;
}

/* The step with the core outlives the job's break (tell_core said
 * -EALREADY): its ranks wait for its outcome. */
static bool held_for_outcome(const struct hb_job *j, const struct hb_req *h)
{
	/* Complete everywhere, its result on the way to the ranks. */
	if (j->nccl_phase == PHASE_BROADCAST)
		return h->seq == j->step.seq;
	return j->with_core && !j->abandoned && h->seq == j->step.seq;
}

/* How step `seq` failed, when it did before every rank announced it. */
static struct hb_failed *failed_step(struct hb_job *j, uint64_t seq)
{
	for (unsigned i = 0; i < FAILED_KEPT; i++)
		if (j->failed[i].seq == seq)
			return &j->failed[i];
	return NULL;
}

/* A rank that announced the step being gathered, or will announce it
 * next: it announced the one before, or, not connected yet, the step is
 * the first. */
static bool at_step(const struct hb_job *j, const struct hb_conn *c)
{
	return c ? c->next_seq >= j->seq : j->seq == 1;
}

/* The step being gathered failed at another site already: the ranks that
 * announced it hear so now, not when the last one comes or at their
 * deadline, and the others get the same outcome when they announce it
 * (failed_step). Only while every rank is at most that step behind:
 * ranks told early may then run one step ahead of a late one, never so
 * far that its outcomes are no longer kept. Returns true when it failed. */
static bool failed_elsewhere(struct gg_host_backend *b, struct hb_job *j)
{
	char why[TEXT];
	int code;

	/* Not a step announced through NCCL: failing it before the gateway's
	 * reduce would abort the communicator, where the step failed at
	 * submit is still broadcast and the communicator lives on. */
	if (!b->core_ops->fail_unstarted || j->with_core || j->nccl_phase || j->broken || !j->deadline_us ||
	    step_uses_nccl(j))
		return false;
	for (unsigned r = 0; r < j->nranks; r++)
		if (!at_step(j, j->ranks[r]))
			return false;
	if (!(code = b->core_ops->fail_unstarted(b->core, j->name, j->seq, why, sizeof(why))))
		return false;
	j->aborted_to = GG_MAX(j->aborted_to, j->seq); /* the core failed it: nothing to tell it */
	fail_step(b, j, code, "%s", why);
	return true;
}

/* Answers what can no longer run, then starts step j->seq once every rank
 * has announced it. */
static void job_advance(struct gg_host_backend *b, struct hb_job *j)
{
	struct hb_failed *f;

	/* A stopping gateway ends every session, each with GG_ERR_CLOSED:
	 * ending one breaks its job, which must not tell the others first
	 * that a rank left. */
	if (b->stopping && j->broken)
		return;

	for (;;) {
		for (unsigned r = 0; r < j->nranks; r++) {
			struct hb_conn *c = j->ranks[r];
			struct hb_req *h;
			while (c && (h = head(c)) && ((j->broken && !held_for_outcome(j, h)) || h->seq < j->seq)) {
				char gave_up[TEXT];
				const char *text = gave_up;
				int code = GG_ERR_TIMEOUT;
				/* A step that failed before the job broke keeps its
				 * outcome: the ranks told of it may have gone on, and
				 * left after their last step. */
				if (h->seq < j->seq && (f = failed_step(j, h->seq))) {
					code = f->code;
					text = f->msg;
				} else if (j->broken) {
					tell_core(b, j, h->seq, j->broken, j->broken_msg);
					code = j->broken;
					text = j->broken_msg;
				} else {
					snprintf(gave_up, sizeof(gave_up), "the other ranks of job '%s' gave up on this "
						 "step before this rank announced it", j->name);
				}
				/* Its reduce waits for the gateway's, which will not come. */
				if (h->region == GG_CTRL_REGION_NCCL)
					nccl_abort(b, j, code, text);
				answer(b, c, code, "step %llu (tensor %u): %s", (unsigned long long)h->seq, h->tensor_id,
				       text);
			}
		}
		if (j->broken || j->with_core || j->nccl_phase)
			return;

		const struct hb_req *ref = NULL;
		unsigned ref_rank = 0, arrived = 0;
		uint64_t deadline = UINT64_MAX;
		bool mismatch = false;
		for (unsigned r = 0; r < j->nranks && !mismatch; r++) {
			struct hb_conn *c = j->ranks[r];
			struct hb_req *h = c ? head(c) : NULL;
			if (!h || h->seq != j->seq)
				continue;
			if (!ref) {
				ref = h;
				ref_rank = r;
			} else if (!same_tensor(ref, h)) {
				fail_step(b, j, GG_ERR_MISMATCH,
					  "ranks disagree: rank %u announced tensor %u (%llu %s) but rank %u announced "
					  "tensor %u (%llu %s)", ref_rank, ref->tensor_id, (unsigned long long)ref->count,
					  gg_dtype_name(ref->dtype), r, h->tensor_id, (unsigned long long)h->count,
					  gg_dtype_name(h->dtype));
				mismatch = true;
				break;
			}
			arrived++;
			if (h->deadline_us < deadline) {
				deadline = h->deadline_us;
				j->deadline_ms = h->timeout_ms;
			}
		}
		if (mismatch)
			continue;
		if (!arrived) {
			j->deadline_us = 0;
			return;
		}
		j->deadline_us = deadline;
		if (arrived < j->nranks) {
			if (failed_elsewhere(b, j))
				continue;
			return;
		}
		if (b->loop->now_us >= deadline) {
			/* Where the earlier steps waited for a site that is lost,
			 * that is the cause, as the sites that find it say. */
			char lost[TEXT];
			bool site = b->core_ops->lost_site && b->core_ops->lost_site(b->core, lost, sizeof(lost));
			fail_step(b, j, site ? GG_ERR_SITE : GG_ERR_TIMEOUT,
				  "the deadline of %u ms passed before the step could start (earlier steps of job '%s' "
				  "were still running)%s%s", j->deadline_ms, j->name, site ? ": " : "", site ? lost : "");
			continue;
		}
		/* The tick starts it once the communicator is up. */
		if (ref->region == GG_CTRL_REGION_NCCL && j->nccl_state == NCCL_JOINING)
			return;
		if (step_start(b, j, ref))
			return;
	}
}

static struct hb_job *job_find(struct gg_host_backend *b, const char *name)
{
	for (struct hb_job *j = b->jobs; j; j = j->next)
		if (!strcmp(j->name, name))
			return j;
	return NULL;
}

/* ---- messages ----------------------------------------------------------- */

/* A HELLO on a spare slot: the session takes a place within max_clients,
 * one an idle job gives up if need be (closing now), or is refused as a
 * connection with no slot would be. */
static bool spare_to_session(struct gg_host_backend *b, struct hb_conn *c)
{
	char hint[TEXT];

	c->spare = false; /* held from now on, if there is room */
	/* A HELLO in hand goes ahead of those waiting for a slot, which have
	 * not said what they are: waiting here would hold it unread. Its
	 * place is that of a connection silent long enough, or an idle
	 * job's, or else one that has said nothing so far, however briefly
	 * (which may be a rank whose HELLO is not read yet). */
	if (make_room(b, 0, c, false) || make_room(b, 0, c, true))
		return true;
	c->spare = true; /* closing on the spare slot it came on */
	idle_hint(b, hint, sizeof(hint));
	conn_refuse(b, c, GG_ERR_REFUSED, "the gateway of site %s already serves max_clients = %u connections%s",
		    b->site, b->opts.max_clients, hint);
	return false;
}

static void on_hello(struct gg_host_backend *b, struct hb_conn *c)
{
	const struct gg_ctrl_hello *h = &c->in.hello;
	unsigned max_ranks = GG_MIN(b->opts.max_clients, GG_CTRL_MAX_RANKS);
	char why[160];

	if (h->version != GG_CTRL_VERSION) {
		conn_refuse(b, c, GG_ERR_REFUSED,
			    "protocol version %u is not supported: the gateway of site %s speaks version %u",
			    (unsigned)h->version, b->site, GG_CTRL_VERSION);
		return;
	}
	if (!gg_ctrl_job_name_ok(h->job, why, sizeof(why))) {
		conn_refuse(b, c, GG_ERR_REFUSED, "%s", why);
		return;
	}
	if (h->nranks < 1 || h->nranks > max_ranks) {
		conn_refuse(b, c, GG_ERR_REFUSED, "nranks %u of job '%s' is outside 1..%u (the gateway of site %s "
			    "serves at most max_clients = %u)", (unsigned)h->nranks, h->job, max_ranks, b->site,
			    b->opts.max_clients);
		return;
	}
	if (h->rank >= h->nranks) {
		conn_refuse(b, c, GG_ERR_REFUSED, "rank %u of job '%s' is out of range for nranks %u",
			    (unsigned)h->rank, h->job, (unsigned)h->nranks);
		return;
	}
	/* A HELLO that came on a spare slot needs a place first (an idle
	 * job's if need be), once it is sound: a malformed one evicts nobody. */
	if (c->spare && !spare_to_session(b, c))
		return;

	struct hb_job *j = job_find(b, h->job);
	if (j && j->uid != c->uid && job_idle(b, j)) {
		char needed[96];
		snprintf(needed, sizeof(needed), "a rank of uid %u asks for its name", (unsigned)c->uid);
		job_evict(b, j, needed);
		j = job_find(b, h->job);
	}
	if (j && j->broken) {
		conn_refuse(b, c, GG_ERR_REFUSED, "job '%s' has failed (%s); it can start again once all its ranks "
			    "have disconnected", j->name, j->broken_msg);
		return;
	}
	if (j && j->uid != c->uid) {
		char ago[32], limit[32], state[64], rule[96] = "";
		if (b->opts.session_idle_us)
			snprintf(rule, sizeof(rule), " (a job idle for session_idle = %s gives its name up)",
				 gg_format_duration(b->opts.session_idle_us, limit, sizeof(limit)));
		/* A step under way keeps the job however long its ranks wait. */
		if (step_in_progress(j))
			snprintf(state, sizeof(state), "which has step %llu under way", (unsigned long long)j->seq);
		else
			snprintf(state, sizeof(state), "whose ranks sent something %s ago",
				 gg_format_elapsed(b->loop->now_us - j->active_us, ago, sizeof(ago)));
		conn_refuse(b, c, GG_ERR_REFUSED, "job '%s' belongs to uid %u, %s%s; rank %u connects as uid %u", j->name,
			    (unsigned)j->uid, state, rule, (unsigned)h->rank, (unsigned)c->uid);
		return;
	}
	if (j && j->nranks != h->nranks) {
		conn_refuse(b, c, GG_ERR_REFUSED, "rank %u of job '%s' says nranks %u, but rank %u said nranks %u",
			    (unsigned)h->rank, j->name, (unsigned)h->nranks, j->first_rank, j->nranks);
		return;
	}
	if (j && j->ranks[h->rank]) {
		conn_refuse(b, c, GG_ERR_REFUSED, "rank %u of job '%s' is already connected", (unsigned)h->rank,
			    j->name);
		return;
	}
	if (!j) {
		j = calloc(1, sizeof(*j));
		if (j) {
			j->ranks = calloc(h->nranks, sizeof(*j->ranks));
			j->mem = calloc(h->nranks, sizeof(*j->mem));
			j->gpu_out = calloc(h->nranks, sizeof(*j->gpu_out));
			j->mem_region = calloc(h->nranks, sizeof(*j->mem_region));
			j->orphans = calloc(h->nranks, sizeof(*j->orphans));
		}
		if (!j || !j->ranks || !j->mem || !j->gpu_out || !j->mem_region || !j->orphans) {
			if (j) {
				free(j->ranks);
				free(j->mem);
				free(j->gpu_out);
				free(j->mem_region);
				free(j->orphans);
				free(j);
			}
			conn_refuse(b, c, GG_ERR_NOMEM, "the gateway of site %s is out of memory", b->site);
			return;
		}
		memcpy(j->name, h->job, sizeof(j->name));
		j->nranks = h->nranks;
		j->first_rank = h->rank;
		j->uid = c->uid;
		j->seq = 1;
		j->active_us = b->loop->now_us;
		j->next = b->jobs;
		b->jobs = j;
		b->stats.jobs++;
		if (b->core_ops->job_opened)
			b->core_ops->job_opened(b->core, j->name);
	}
	j->ranks[h->rank] = c;
	j->connected++;
	c->job = j;
	c->rank = h->rank;
	c->next_seq = 1;
	c->state = C_ACTIVE;
	if (session_log_now(b))
		hb_log(b, "rank %u of job '%s' connected (pid %d, uid %u)", c->rank, j->name, (int)c->pid,
		       (unsigned)c->uid);

	union gg_ctrl_msg *m = out_push(c, GG_CTRL_ACCEPT);
	m->accept.version = GG_CTRL_VERSION;
	m->accept.max_inflight = GG_CTRL_MAX_INFLIGHT;
	m->accept.max_message_bytes = b->opts.max_message_bytes;
	m->accept.max_region_bytes = b->max_region_bytes;
	m->accept.max_regions = GG_CTRL_MAX_REGIONS;
	m->accept.step_timeout_ms = (uint32_t)GG_MIN(b->opts.step_timeout_us / 1000, UINT32_MAX);
	m->accept.answer_grace_ms = (uint32_t)GG_MIN(b->opts.answer_grace_us / 1000, UINT32_MAX);
	gg_ctrl_set_text(m->accept.site, sizeof(m->accept.site), b->site);
	out_kick(b, c);
}

/* A status request: answered to root and to the gateway's own user only,
 * for it names every job, its user and its failures; then closed. */
static void on_status(struct gg_host_backend *b, struct hb_conn *c)
{
	uid_t self = geteuid();

	if (c->in.status.version != GG_CTRL_STATUS_VERSION) {
		conn_refuse(b, c, GG_ERR_REFUSED, "status version %u is not supported: the gateway of site %s speaks "
			    "version %u", (unsigned)c->in.status.version, b->site, GG_CTRL_STATUS_VERSION);
		return;
	}
	if (c->uid != 0 && c->uid != self) {
		conn_refuse(b, c, GG_ERR_REFUSED, "the status of site %s is for root and the gateway's user (uid %u); "
			    "uid %u asked", b->site, (unsigned)self, (unsigned)c->uid);
		return;
	}
	if (!b->opts.status) {
		conn_refuse(b, c, GG_ERR_REFUSED, "the gateway of site %s does not answer status requests", b->site);
		return;
	}
	c->status = calloc(GG_HOST_STATUS_MAX_MESSAGES, sizeof(*c->status));
	if (!c->status) {
		conn_refuse(b, c, GG_ERR_NOMEM, "the gateway of site %s is out of memory", b->site);
		return;
	}
	c->status_count = b->opts.status(b->opts.status_arg, c->status, GG_HOST_STATUS_MAX_MESSAGES);
	c->status_next = 0;
	b->stats.status_requests++;
	conn_closing(b, c);
	out_kick(b, c);
}

static void on_map(struct gg_host_backend *b, struct hb_conn *c, int *fds, unsigned nfds, bool ctrunc)
{
	const struct gg_ctrl_map *mp = &c->in.map;
	unsigned id = mp->region;
	struct stat st;

	if (ctrunc || nfds != 1) {
		conn_fatal(b, c, GG_ERR_PROTOCOL, "MAP must carry exactly one file descriptor, not %s%u",
			   ctrunc ? "more than " : "", nfds);
		return;
	}
	if (id >= GG_CTRL_MAX_REGIONS) {
		conn_fatal(b, c, GG_ERR_PROTOCOL, "MAP of region %u; regions are 0..%u", id, GG_CTRL_MAX_REGIONS - 1);
		return;
	}
	if (c->regions[id].base) {
		conn_fatal(b, c, GG_ERR_PROTOCOL, "MAP of region %u, which is mapped already", id);
		return;
	}
	if (mp->size_bytes == 0 || mp->size_bytes > b->max_region_bytes) {
		conn_fatal(b, c, mp->size_bytes ? GG_ERR_TOO_LARGE : GG_ERR_PROTOCOL,
			   "MAP of region %u with %llu bytes; regions hold 1 to %llu bytes",
			   id, (unsigned long long)mp->size_bytes, (unsigned long long)b->max_region_bytes);
		return;
	}
	/* Only a memfd sealed against shrinking cannot turn our accesses
	 * into SIGBUS later. */
	int seals = fcntl(fds[0], F_GET_SEALS);
	if (seals < 0) {
		conn_fatal(b, c, GG_ERR_PROTOCOL, "MAP of region %u: the descriptor is not a memfd (%s)", id,
			   strerror(errno));
		return;
	}
	if (!(seals & F_SEAL_SHRINK)) {
		/* A tmpfs file opened by path has seals too (F_SEAL_SEAL), never
		 * that one. */
		conn_fatal(b, c, GG_ERR_PROTOCOL,
			   "MAP of region %u: the descriptor is not a memfd sealed against shrinking (F_SEAL_SHRINK)", id);
		return;
	}
	/* Sealed hugetlbfs memfds still lose a page to a punched hole, and
	 * once the huge-page pool is empty the next read is a SIGBUS. tmpfs
	 * gives a fresh page instead. */
	struct statfs sfs;
	if (fstatfs(fds[0], &sfs) || sfs.f_type != TMPFS_MAGIC) {
		conn_fatal(b, c, GG_ERR_PROTOCOL,
			   "MAP of region %u: the memfd is not plain shared memory (filesystem 0x%lx, not tmpfs; "
			   "MFD_HUGETLB is not accepted)", id, (unsigned long)sfs.f_type);
		return;
	}
	if (fstat(fds[0], &st) || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != mp->size_bytes) {
		conn_fatal(b, c, GG_ERR_PROTOCOL, "MAP of region %u says %llu bytes, the memfd has %lld", id,
			   (unsigned long long)mp->size_bytes, (long long)st.st_size);
		return;
	}
	void *base = mmap(NULL, mp->size_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	if (base == MAP_FAILED) {
		conn_fatal(b, c, errno == ENOMEM ? GG_ERR_NOMEM : GG_ERR_PROTOCOL, "MAP of region %u: mmap: %s", id,
			   strerror(errno));
		return;
	}
	close(fds[0]);
	fds[0] = -1;
	c->regions[id] = (struct hb_region){ .base = base, .size = mp->size_bytes };
	b->stats.regions++;
}

/* A rank's CUDA allocation, by IPC handle (gg_allreduce_cuda). Its size
 * is bounded by the allocation itself, which the gateway checks, not by
 * max_region_bytes: it takes no memory of the gateway's. */
static void on_map_cuda(struct gg_host_backend *b, struct hb_conn *c)
{
	const struct gg_ctrl_map_cuda *mp = &c->in.map_cuda;
	unsigned id = mp->region;

	if (id >= GG_CTRL_MAX_REGIONS) {
		conn_fatal(b, c, GG_ERR_PROTOCOL, "MAP_CUDA of region %u; regions are 0..%u", id,
			   GG_CTRL_MAX_REGIONS - 1);
		return;
	}
	if (c->regions[id].base) {
		conn_fatal(b, c, GG_ERR_PROTOCOL, "MAP_CUDA of region %u, which is mapped already", id);
		return;
	}
	if (mp->size_bytes == 0) {
		conn_fatal(b, c, GG_ERR_PROTOCOL, "MAP_CUDA of region %u with 0 bytes", id);
		return;
	}
#if HAVE_CUDA
	char why[TEXT - 96];
	void *dev = NULL;
	int rc = gg_site_cuda_open(mp->ipc, mp->size_bytes, &dev, why, sizeof(why));
	if (rc) {
		conn_unserved(b, c, rc == -ENODEV ? GG_ERR_INVALID : GG_ERR_SYSTEM,
			      "cannot open the rank's GPU memory%s: %s", rc == -ENODEV ? " (it has no usable GPU)" : "",
			      why);
		return;
	}
	c->regions[id] = (struct hb_region){ .base = dev, .size = mp->size_bytes, .device = true };
	b->stats.regions++;
#else
	conn_unserved(b, c, GG_ERR_INVALID,
		      "this gateway was built without CUDA, so it cannot take GPU memory (gg_allreduce_cuda); use "
		      "host memory");
#endif
}

static void on_unmap(struct gg_host_backend *b, struct hb_conn *c)
{
	unsigned id = c->in.unmap.region;

	if (id >= GG_CTRL_MAX_REGIONS || !c->regions[id].base) {
		conn_fatal(b, c, GG_ERR_PROTOCOL, "UNMAP of region %u, which is not mapped", id);
		return;
	}
	if (c->regions[id].users) {
		conn_fatal(b, c, GG_ERR_PROTOCOL, "UNMAP of region %u while it holds %u request%s in flight", id,
			   c->regions[id].users, c->regions[id].users == 1 ? "" : "s");
		return;
	}
	/* A step that already failed at the rank may still be with the core. */
	if (keep_for_core(c, id))
		return;
	region_unmap(b, &c->regions[id]);
}

static void on_allreduce(struct gg_host_backend *b, struct hb_conn *c)
{
	const struct gg_ctrl_allreduce *a = &c->in.allreduce;
	size_t esize = gg_dtype_size((enum gg_dtype)a->dtype);

	if (a->seq != c->next_seq) {
		conn_fatal(b, c, GG_ERR_PROTOCOL, "ALLREDUCE with seq %llu, expected %llu",
			   (unsigned long long)a->seq, (unsigned long long)c->next_seq);
		return;
	}
	if (c->req_count + c->dones_queued >= GG_CTRL_MAX_INFLIGHT) {
		conn_fatal(b, c, GG_ERR_PROTOCOL, "step %llu: more than %u requests in flight",
			   (unsigned long long)a->seq, GG_CTRL_MAX_INFLIGHT);
		return;
	}
	if (!esize) {
		conn_fatal(b, c, GG_ERR_PROTOCOL, "step %llu: unknown dtype %u", (unsigned long long)a->seq,
			   (unsigned)a->dtype);
		return;
	}
	if (a->count == 0 || a->count > b->opts.max_message_bytes / esize) {
		conn_fatal(b, c, a->count ? GG_ERR_TOO_LARGE : GG_ERR_PROTOCOL,
			   "step %llu: %llu %s elements; max_message allows 1 to %llu",
			   (unsigned long long)a->seq, (unsigned long long)a->count, gg_dtype_name(a->dtype),
			   (unsigned long long)(b->opts.max_message_bytes / esize));
		return;
	}
	uint64_t bytes = a->count * esize;
	const struct hb_region *reg = a->region < GG_CTRL_MAX_REGIONS ? &c->regions[a->region] : NULL;
	if (a->region == GG_CTRL_REGION_NCCL) {
		if (!c->nccl_joined) {
			conn_fatal(b, c, GG_ERR_PROTOCOL, "step %llu: an NCCL step from a rank that has not sent NCCL_JOIN",
				   (unsigned long long)a->seq);
			return;
		}
		if (a->offset || a->dtype != GG_DTYPE_F32) {
			conn_fatal(b, c, GG_ERR_PROTOCOL, "step %llu: an NCCL step must be float32 at offset 0, not %s at "
				   "offset %llu", (unsigned long long)a->seq, gg_dtype_name(a->dtype),
				   (unsigned long long)a->offset);
			return;
		}
	} else if (!reg || !reg->base) {
		conn_fatal(b, c, GG_ERR_PROTOCOL, "step %llu: region %u is not mapped", (unsigned long long)a->seq,
			   (unsigned)a->region);
		return;
	}
	if (reg && a->offset % esize) {
		conn_fatal(b, c, GG_ERR_PROTOCOL, "step %llu: offset %llu in region %u is not a multiple of the element "
			   "size, %zu", (unsigned long long)a->seq, (unsigned long long)a->offset, (unsigned)a->region,
			   esize);
		return;
	}
	if (reg && (a->offset > reg->size || bytes > reg->size - a->offset)) {
		conn_fatal(b, c, GG_ERR_PROTOCOL, "step %llu: %llu bytes at offset %llu do not fit region %u of %llu bytes",
			   (unsigned long long)a->seq, (unsigned long long)bytes, (unsigned long long)a->offset,
			   (unsigned)a->region, (unsigned long long)reg->size);
		return;
	}

	uint64_t timeout_us = b->opts.step_timeout_us;
	if (a->timeout_ms && (uint64_t)a->timeout_ms * 1000 < timeout_us)
		timeout_us = (uint64_t)a->timeout_ms * 1000;
	c->reqs[(c->req_head + c->req_count++) % GG_CTRL_MAX_INFLIGHT] = (struct hb_req){
		.seq = a->seq,
		.count = a->count,
		.offset = a->offset,
		.deadline_us = b->loop->now_us + timeout_us,
		.tensor_id = a->tensor_id,
		.dtype = a->dtype,
		.region = a->region,
		.timeout_ms = (uint32_t)(timeout_us / 1000),
	};
	if (reg)
		c->regions[a->region].users++;
	c->next_seq++;
	job_advance(b, c->job);
}

/* "2.28.9" of NCCL's version code: MAJOR*10000 + MINOR*100 + PATCH since
 * 2.9, MAJOR*1000 + MINOR*100 + PATCH before. */
static const char *nccl_version_name(uint32_t v, char *buf, size_t size)
{
	if (v >= 10000)
		snprintf(buf, size, "%u.%u.%u", v / 10000, v / 100 % 100, v % 100);
	else
		snprintf(buf, size, "%u.%u.%u", v / 1000, v / 100 % 10, v % 100);
	return buf;
}

/* A rank will all-reduce through the job's NCCL communicator: the job's
 * first NCCL_JOIN makes it, and the gateway starts joining it as its last
 * rank; every rank that asks gets its id. */
static void on_nccl_join(struct gg_host_backend *b, struct hb_conn *c)
{
	struct hb_job *j = c->job;
	char why[TEXT - 96];
	int rc;

	if (!b->opts.nccl) {
		conn_unserved(b, c, GG_ERR_INVALID,
			      "this gateway was built without NCCL, so it cannot join the job's NCCL communicator "
			      "(gg_allreduce_nccl); use gg_allreduce_cuda or host memory");
		return;
	}
	if (c->nccl_joined) {
		conn_fatal(b, c, GG_ERR_PROTOCOL, "NCCL_JOIN from rank %u of job '%s', which has joined already", c->rank,
			   j->name);
		return;
	}
	/* NCCL refuses peers of another version when the communicator is
	 * made, and may hang in its bootstrap first: the rank hears why now. */
	const uint32_t theirs = c->in.nccl_join.nccl_version;
	const int ours = b->opts.nccl->version ? b->opts.nccl->version() : 0;
	if (theirs && ours > 0 && theirs != (uint32_t)ours) {
		char tv[16], ov[16];
		conn_unserved(b, c, GG_ERR_INVALID,
			      "rank %u runs NCCL %s and this gateway NCCL %s: NCCL makes a communicator only of ranks "
			      "of one version; give the ranks and the gateway the same NCCL", c->rank,
			      nccl_version_name(theirs, tv, sizeof(tv)), nccl_version_name((uint32_t)ours, ov, sizeof(ov)));
		return;
	}
	if (j->nccl_state == NCCL_ABORTED || j->broken) {
		conn_unserved(b, c, j->nccl_state == NCCL_ABORTED ? j->nccl_code : j->broken,
			      "%s; every rank of the job must close its session and open a new one",
			      j->nccl_state == NCCL_ABORTED ? j->nccl_why : j->broken_msg);
		return;
	}
	if (j->nccl_state == NCCL_NONE) {
		uint64_t timeout_us = b->opts.step_timeout_us;
		const uint32_t ms = c->in.nccl_join.timeout_ms;
		if (ms && (uint64_t)ms * 1000 < timeout_us)
			timeout_us = (uint64_t)ms * 1000;
		rc = b->opts.nccl->unique_id(j->nccl_id, why, sizeof(why));
		if (!rc && (rc = b->opts.nccl->open(&j->nccl_comm, j->nccl_id, j->nranks + 1, j->nranks, why, sizeof(why))))
			nccl_end_id(b, j);
		if (rc) {
			conn_unserved(b, c, rc == -ENODEV ? GG_ERR_INVALID : GG_ERR_SYSTEM,
				      "cannot make the job's NCCL communicator%s: %s",
				      rc == -ENODEV ? " (the gateway has no usable GPU)" : "", why);
			return;
		}
		j->nccl_state = NCCL_JOINING;
		j->nccl_deadline_us = b->loop->now_us + timeout_us;
		j->nccl_timeout_ms = (uint32_t)(timeout_us / 1000);
		hb_log(b, "job '%s': joining its NCCL communicator as rank %u of %u", j->name, j->nranks, j->nranks + 1);
	}
	c->nccl_joined = true;
	union gg_ctrl_msg *m = out_push(c, GG_CTRL_NCCL_ID);
	m->nccl_id.nranks = j->nranks + 1;
	m->nccl_id.root = j->nranks;
	memcpy(m->nccl_id.id, j->nccl_id, sizeof(m->nccl_id.id));
	out_kick(b, c);
}

/* A communicator being joined: the job's NCCL steps start once it is up.
 * Returns true when that changed. */
static bool nccl_join_progress(struct gg_host_backend *b, struct hb_job *j, uint64_t now_us, uint64_t *next)
{
	char why[TEXT - 96], text[2 * TEXT], list[160];
	int rc = b->opts.nccl->poll(j->nccl_comm, why, sizeof(why));

	if (!rc) {
		j->nccl_state = NCCL_UP;
		nccl_end_id(b, j); /* every rank checked in: its root is done */
		hb_log(b, "job '%s': its NCCL communicator is up", j->name);
		return true;
	}
	if (rc == -EINPROGRESS && now_us < j->nccl_deadline_us) {
		*next = GG_MIN(now_us + NCCL_POLL_SLOW_US, j->nccl_deadline_us);
		return false;
	}
	if (rc == -EINPROGRESS) {
		snprintf(text, sizeof(text), "the NCCL communicator of job '%s' was not up within %u ms of its first "
			 "NCCL_JOIN: %s", j->name, j->nccl_timeout_ms, nccl_joiners(j, list, sizeof(list)));
		nccl_abort(b, j, GG_ERR_TIMEOUT, text);
	} else {
		snprintf(text, sizeof(text), "site %s: joining the NCCL communicator of job '%s': %s", b->site, j->name,
			 why);
		nccl_abort(b, j, GG_ERR_SYSTEM, text);
	}
	return true;
}

/* Moves the job's NCCL work on: the communicator being joined, and the
 * reduce or broadcast of a step, done, failed, past its deadline, or cut
 * short by an abort. *next: when to look again (0: no need). Returns true
 * when something changed, and the caller settles the job. */
static bool nccl_progress(struct gg_host_backend *b, struct hb_job *j, uint64_t now_us, uint64_t *next)
{
	char why[TEXT - 96], text[2 * TEXT];
	int rc, code;

	*next = 0;
	if (j->nccl_state == NCCL_JOINING)
		return nccl_join_progress(b, j, now_us, next);
	if (!j->nccl_phase)
		return false;
	if (j->nccl_state != NCCL_UP) {
		rc = -ECONNABORTED;
		code = j->nccl_code;
		snprintf(text, sizeof(text), "%s", j->nccl_why);
	} else {
		rc = b->opts.nccl->poll(j->nccl_comm, why, sizeof(why));
		if (rc == -EINPROGRESS && now_us < j->nccl_until_us) {
			/* Often at first, when the call is about to end, then
			 * less, when it waits for a rank. */
			uint64_t every = now_us - j->nccl_since_us < NCCL_POLL_FAST_US ? NCCL_POLL_US : NCCL_POLL_SLOW_US;
			*next = GG_MIN(now_us + every, j->nccl_until_us);
			return false;
		}
		code = rc == -EINPROGRESS ? GG_ERR_TIMEOUT : GG_ERR_SYSTEM;
		if (rc == -EINPROGRESS && j->nccl_phase == PHASE_REDUCE)
			snprintf(text, sizeof(text), "site %s: the ranks' reduce to the gateway was not done within %u "
				 "ms (a rank did not take part)", b->site, j->deadline_ms);
		else if (rc == -EINPROGRESS)
			snprintf(text, sizeof(text), "site %s: the broadcast of the result to the ranks was not done by "
				 "the step's deadline and %llu ms of grace (a rank did not take part)", b->site,
				 (unsigned long long)b->opts.answer_grace_us / 1000);
		else if (rc)
			snprintf(text, sizeof(text), "site %s: %s: %s", b->site,
				 j->nccl_phase == PHASE_REDUCE ? "summing the ranks' tensors" : "handing the result to the ranks",
				 why);
	}
	const int phase = j->nccl_phase;
	nccl_phase_set(b, j, PHASE_NONE);
	if (phase == PHASE_REDUCE) {
		if (!rc) {
			step_submit(b, j);
			return true;
		}
		step_release_sum(b, j);
		nccl_abort(b, j, code, text);
		fail_step(b, j, code, "%s", text);
		return true;
	}
	/* Done, or cut short by an abort (deliver() then says why, for a step
	 * that succeeded elsewhere). */
	if (!rc || rc == -ECONNABORTED)
		deliver(b, j, j->nccl_outcome, j->nccl_outcome_msg);
	else
		broadcast_failed(b, j, j->nccl_outcome, j->nccl_outcome_msg, code, text);
	return true;
}

static void on_message(struct gg_host_backend *b, struct hb_conn *c, size_t len, int *fds, unsigned nfds,
		       bool ctrunc)
{
	char why[160];
	/* A gateway's message is refused for coming from a client, not for
	 * what its fields hold. */
	int type = gg_ctrl_from_gateway(&c->in, len) ? (int)c->in.hdr.type : gg_ctrl_check(&c->in, len, why, sizeof(why));

	if (c->state == C_HELLO) {
		if (type < 0)
			conn_refuse(b, c, GG_ERR_PROTOCOL, "%s", why);
		else if (type != GG_CTRL_HELLO && type != GG_CTRL_STATUS)
			conn_refuse(b, c, GG_ERR_PROTOCOL, "expected HELLO or STATUS, got %s",
				    gg_ctrl_type_name((unsigned)type));
		else if (nfds || ctrunc)
			conn_refuse(b, c, GG_ERR_PROTOCOL, "%s must not carry file descriptors",
				    gg_ctrl_type_name((unsigned)type));
		else if (type == GG_CTRL_STATUS)
			on_status(b, c);
		else
			on_hello(b, c);
		return;
	}
	if (c->job)
		c->job->active_us = b->loop->now_us;
	if (type < 0) {
		conn_fatal(b, c, GG_ERR_PROTOCOL, "%s", why);
		return;
	}
	if ((nfds || ctrunc) && type != GG_CTRL_MAP) {
		conn_fatal(b, c, GG_ERR_PROTOCOL, "%s must not carry file descriptors",
			   gg_ctrl_type_name((unsigned)type));
		return;
	}
	switch (type) {
	case GG_CTRL_MAP:
		on_map(b, c, fds, nfds, ctrunc);
		break;
	case GG_CTRL_MAP_CUDA:
		on_map_cuda(b, c);
		break;
	case GG_CTRL_UNMAP:
		on_unmap(b, c);
		break;
	case GG_CTRL_ALLREDUCE:
		on_allreduce(b, c);
		break;
	case GG_CTRL_NCCL_JOIN:
		on_nccl_join(b, c);
		break;
	default:
		conn_fatal(b, c, GG_ERR_PROTOCOL, "unexpected %s from a client", gg_ctrl_type_name((unsigned)type));
		break;
	}
}

/* Whether a read of 0 bytes was the peer hanging up rather than an empty
 * packet (SOCK_SEQPACKET has both). */
static bool peer_hung_up(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLRDHUP };
	int n = poll(&p, 1, 0);

	return n < 0 || (n > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)));
}

static void on_recv(struct gg_host_backend *b, struct hb_conn *c, int res)
{
	int fds[RECV_FDS];
	unsigned nfds = 0;
	bool ctrunc = false;

	c->recv_busy = false;
	if (res >= 0) {
		for (struct cmsghdr *cm = CMSG_FIRSTHDR(&c->mh); cm; cm = CMSG_NXTHDR(&c->mh, cm)) {
			if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
				continue;
			size_t n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			for (size_t i = 0; i < n && nfds < RECV_FDS; i++)
				memcpy(&fds[nfds++], CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
		}
		ctrunc = c->mh.msg_flags & MSG_CTRUNC;
	}
	if (c->state == C_CLOSING) {
		/* Whatever a closing connection still sends is ignored. */
	} else if (res < 0 || (res == 0 && peer_hung_up(c->fd))) {
		conn_lost(b, c, res);
	} else {
		/* An empty packet reads as 0 bytes too: it is a message, too
		 * short for a header, while the peer is still there. */
		size_t len = (size_t)res;
		if ((c->mh.msg_flags & MSG_TRUNC) && len <= sizeof(c->in))
			len = sizeof(c->in) + 1;
		on_message(b, c, len, fds, nfds, ctrunc);
		if (c->state == C_HELLO || c->state == C_ACTIVE)
			arm_recv(b, c);
	}
	for (unsigned i = 0; i < nfds; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

static void on_send(struct gg_host_backend *b, struct hb_conn *c, int res)
{
	size_t len = c->out_len[c->out_head];

	c->send_busy = false;
	if (c->out[c->out_head].hdr.type == GG_CTRL_DONE)
		c->dones_queued--;
	c->out_head = (c->out_head + 1) % OUTQ;
	c->out_count--;
	if (res < 0 || (size_t)res != len) {
		conn_lost(b, c, res < 0 ? res : -EMSGSIZE);
		/* Closing already, it would wait out CLOSE_TIMEOUT_US for
		 * answers that can no longer leave. */
		c->out_count = 0;
	} else {
		out_kick(b, c);
	}
}

static void arm_accept(struct gg_host_backend *b)
{
	int rc = gg_acceptor_arm(&b->accept);

	if (rc)
		hb_log(b, "control socket %s: cannot queue accept: %s", b->path, strerror(-rc));
}

static void on_accept(struct gg_host_backend *b, const struct io_uring_cqe *cqe)
{
	int fd = gg_acceptor_on_cqe(&b->accept, cqe, b->stopping);

	if (fd >= 0 && b->stopping)
		refuse_waited(b, fd); /* says the gateway is shutting down */
	else if (fd >= 0)
		conn_new(b, fd);
	else if (fd != -ECANCELED)
		hb_log(b, "control socket %s: accept: %s", b->path, strerror(-fd));
}

/* ---- the seam ----------------------------------------------------------- */

static struct gg_host_backend *host_of(struct gg_site_backend *base)
{
	return (struct gg_host_backend *)(void *)base;
}

static bool hb_on_cqe(struct gg_site_backend *base, const struct io_uring_cqe *cqe)
{
	struct gg_host_backend *b = host_of(base);
	unsigned kind = gg_loop_ud_kind(cqe->user_data);

	if (kind < b->opts.kind_base || kind >= b->opts.kind_base + GG_HOST_BACKEND_KINDS)
		return false;
	kind -= b->opts.kind_base;
	if (kind == K_ACCEPT) {
		on_accept(b, cqe);
		return true;
	}
	if (kind == K_CANCEL) {
		b->cancels--;
		return true;
	}

	uint32_t index = gg_loop_ud_index(cqe->user_data);
	struct hb_conn *c = index < slots(b) ? &b->conns[index] : NULL;
	if (!c || c->state == C_FREE || c->gen != gg_loop_ud_aux(cqe->user_data)) {
		hb_log(b, "completion for a control connection that is gone (slot %u)", index);
		return true;
	}
	if (kind == K_RECV)
		on_recv(b, c, cqe->res);
	else
		on_send(b, c, cqe->res);
	conn_settle(b, c, b->loop->now_us);
	return true;
}

static uint64_t hb_tick(struct gg_site_backend *base, uint64_t now_us)
{
	struct gg_host_backend *b = host_of(base);
	uint64_t next = 0;

	next = gg_acceptor_tick(&b->accept, now_us, b->stopping);
	next = min_deadline(next, serve_waiting(b, now_us));
	for (unsigned i = 0; i < slots(b); i++) {
		struct hb_conn *c = &b->conns[i];
		if (c->io_error && (c->state == C_HELLO || c->state == C_ACTIVE))
			conn_lost(b, c, c->io_error);
		if (c->state == C_HELLO && now_us >= c->deadline_us)
			conn_refuse(b, c, GG_ERR_TIMEOUT, "no HELLO within %llu ms",
				    (unsigned long long)b->opts.hello_timeout_us / 1000);
		conn_settle(b, c, now_us);
		if (c->io_error && c->state != C_FREE)
			next = min_deadline(next, now_us);
		else if (c->state == C_HELLO || (c->state == C_CLOSING && !c->shut))
			next = min_deadline(next, c->deadline_us);
	}
	for (struct hb_job *j = b->jobs, *after; j; j = after) {
		uint64_t poll = 0;
		after = j->next;
		/* A communicator given up while it came up, where nothing settled
		 * the job since (a step failed before its reduce): its waiting
		 * ranks are told now. */
		if (j->nccl_never_up) {
			job_settle(b, j); /* may free it */
			next = min_deadline(next, now_us);
			continue;
		}
		if (nccl_progress(b, j, now_us, &poll)) {
			job_settle(b, j); /* may free it */
			next = min_deadline(next, now_us);
			continue;
		}
		next = min_deadline(next, poll);
		/* News from the other sites came in since the last tick. */
		if (failed_elsewhere(b, j))
			job_advance(b, j);
		if (!j->with_core && !j->nccl_phase && !j->broken && j->deadline_us && now_us >= j->deadline_us) {
			fail_timeout(b, j);
			job_advance(b, j);
		}
		/* Nothing waits for the deadline of a step the core or an NCCL
		 * call holds, or of a broken job's (whose requests are answered
		 * as they come): a past one would spin the loop. */
		next = min_deadline(next, j->with_core || j->nccl_phase || j->broken ? 0 : j->deadline_us);
	}
	/* Lines left out of the log are told once their second is over. */
	next = tell_held(b, &b->refusal_log, "refused", next);
	next = tell_held(b, &b->session_log, "ranks came or left", next);
	deferred_free(b);
	return next;
}

void gg_host_backend_complete(struct gg_host_backend *b, struct gg_site_step *step, int status,
			      const char *message)
{
	struct hb_job *j = (struct hb_job *)(void *)((char *)step - offsetof(struct hb_job, step));

	if (!message || !*message)
		message = gg_strerror(status);
	if (step->backend != &b->base || !j->with_core) {
		hb_log(b, "the core completed step %llu of job '%s', which it does not hold",
		       (unsigned long long)step->seq, step->job);
		return;
	}
	j->active_us = b->loop->now_us;
	if (j->in_submit) {
		if (!j->sync_done) {
			j->sync_done = true;
			j->sync_status = status;
			gg_ctrl_set_text(j->sync_msg, sizeof(j->sync_msg), message);
		}
		return;
	}
	finish_step(b, j, status, message);
	job_settle(b, j);
}

static void hb_complete(struct gg_site_backend *base, struct gg_site_step *step, int status, const char *message)
{
	gg_host_backend_complete(host_of(base), step, status, message);
}

/* A control socket path that is in the way: refused when a live gateway
 * still listens on it or it is not a socket; unlinked when stale (its
 * gateway died). Returns 0 once unlinked, or a negative errno with err. */
static int clear_stale_socket(const char *path, const struct sockaddr_un *addr, char *err, size_t err_size)
{
	struct stat st;

	if (lstat(path, &st) || !S_ISSOCK(st.st_mode)) {
		snprintf(err, err_size, "control socket %s: the path exists and is not a socket", path);
		return -EADDRINUSE;
	}
	int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (probe < 0) {
		snprintf(err, err_size, "control socket %s: socket: %s", path, strerror(errno));
		return -errno;
	}
	int rc = connect(probe, (const struct sockaddr *)addr, sizeof(*addr)) ? -errno : 0;
	close(probe);
	if (rc == 0) {
		snprintf(err, err_size, "control socket %s: another gateway is listening on it", path);
		return -EADDRINUSE;
	}
	if (rc != -ECONNREFUSED) {
		snprintf(err, err_size, "control socket %s: cannot tell whether it is in use: %s", path,
			 strerror(-rc));
		return rc;
	}
	if (unlink(path)) {
		snprintf(err, err_size, "control socket %s: removing the stale socket: %s", path, strerror(errno));
		return -errno;
	}
	return 0;
}

/* Whoever may rename or remove the entries of a folder on the socket's
 * path could move the gateway's socket aside and put their own in its
 * place, and take the ranks' sessions (the library trusts the folder's
 * owner), or a link, which the gateway's chmod would follow; and whoever
 * owns a link on it could point it elsewhere (gg_path_guarded()). A folder
 * not made yet is judged by the one it will be made in (and the whole path
 * again once the socket is there). Returns 0, or a negative errno with
 * err. */
static int check_socket_folders(const char *path, char *err, size_t err_size)
{
	char why[PATH_MAX + 256];
	int rc = gg_path_guarded(path, "could put another socket in the gateway's place", why, sizeof(why));

	if (rc)
		snprintf(err, err_size, "control socket %s: %s", path, why);
	return rc;
}

/* The socket's folder `dir` does not exist and the gateway's user may not
 * make it (`why`): as /run/gradgate, which only root may make in /run,
 * and the systemd unit makes at each start. */
static int folder_unmakeable(const char *path, const char *dir, const char *why, char *err, size_t err_size)
{
	char who[256];

	gg_user_name(geteuid(), who, sizeof(who));
	snprintf(err, err_size, "control socket %s: folder %s does not exist, and the gateway's user may not make it "
		 "(%s)%s make it first: install -d -m 0755 -o %s '%s'", path, dir, why,
		 strcmp(dir, "/run/gradgate") ? ";" : ": the systemd unit makes it at each start (RuntimeDirectory); "
						     "to run the gateway otherwise,", who, dir);
	return -EACCES;
}

static int listen_on(struct gg_host_backend *b, char *err, size_t err_size)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	struct stat st;
	int rc;

	memcpy(addr.sun_path, b->path, strlen(b->path) + 1);
	if ((rc = check_socket_folders(b->path, err, err_size)))
		return rc;
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		snprintf(err, err_size, "control socket %s: socket: %s", b->path, strerror(errno));
		return -errno;
	}
	rc = bind(fd, (struct sockaddr *)&addr, sizeof(addr)) ? -errno : 0;
	if (rc == -ENOENT) {
		/* The default folder (/run/gradgate) lives in a tmpfs that a
		 * reboot empties. Made here, it belongs to the gateway's user and
		 * only that user may add a socket to it, which the client library
		 * takes as proof of who listens. */
		char dir[sizeof(addr.sun_path)];
		snprintf(dir, sizeof(dir), "%s", b->path);
		char *slash = strrchr(dir, '/');
		if (slash && slash != dir) {
			*slash = '\0';
			bool made = !mkdir(dir, 0755);
			if (made)
				(void)!chmod(dir, 0755); /* whatever the umask: ranks of every user reach it */
			if (made || errno == EEXIST) {
				rc = bind(fd, (struct sockaddr *)&addr, sizeof(addr)) ? -errno : 0;
			} else if (errno == EACCES || errno == EPERM || errno == EROFS) {
				rc = folder_unmakeable(b->path, dir, strerror(errno), err, err_size);
				close(fd);
				return rc;
			} else if (errno != ENOENT) {
				rc = -errno;
				snprintf(err, err_size, "control socket %s: folder %s: %s", b->path, dir, strerror(-rc));
				close(fd);
				return rc;
			}
		}
	}
	if (rc == -EADDRINUSE) {
		if ((rc = clear_stale_socket(b->path, &addr, err, err_size))) {
			close(fd);
			return rc;
		}
		rc = bind(fd, (struct sockaddr *)&addr, sizeof(addr)) ? -errno : 0;
	}
	/* Every folder is there now, some maybe made by another since they
	 * were checked: checked again before the chmod follows the path. */
	if (!rc && (rc = check_socket_folders(b->path, err, err_size))) {
		close(fd);
		return rc;
	}
	/* Whatever the umask: ranks of every user connect (what each may do
	 * is the protocol's to decide: a job belongs to its first rank's user). */
	if (!rc)
		rc = chmod(b->path, 0666) ? -errno : 0;
	if (!rc)
		rc = listen(fd, SOMAXCONN) ? -errno : 0;
	if (!rc)
		rc = stat(b->path, &st) ? -errno : 0;
	if (rc) {
		close(fd);
		snprintf(err, err_size, "control socket %s: %s", b->path, strerror(-rc));
		return rc;
	}
	b->listen_fd = fd;
	b->accept.fd = fd;
	b->listen_dev = st.st_dev;
	b->listen_ino = st.st_ino;
	return 0;
}

static int hb_start(struct gg_site_backend *base, struct gg_loop *loop, char *err, size_t err_size)
{
	struct gg_host_backend *b = host_of(base);
	int rc;

	if (b->loop) {
		snprintf(err, err_size, "host backend already started");
		return -EINVAL;
	}
	if ((rc = listen_on(b, err, err_size)))
		return rc;
	b->loop = loop;
	b->accept = (struct gg_acceptor){ .loop = loop, .fd = b->listen_fd, .ud = ud(b, K_ACCEPT, NULL) };
	arm_accept(b);
	if (!b->accept.armed) {
		snprintf(err, err_size, "control socket %s: cannot queue accept on the loop", b->path);
		return -EIO;
	}
	hb_log(b, "host backend of site %s listening on unix:%s", b->site, b->path);
	return 0;
}

static bool hb_stop(struct gg_site_backend *base)
{
	struct gg_host_backend *b = host_of(base);

	if (!b->loop)
		return true;
	if (!b->stopping) {
		char why[TEXT];
		b->stopping = true;
		snprintf(why, sizeof(why), "the gateway of site %s is shutting down", b->site);
		for (unsigned i = 0; i < slots(b); i++) {
			struct hb_conn *c = &b->conns[i];
			if (c->state == C_HELLO)
				conn_refuse(b, c, GG_ERR_CLOSED, "%s", why);
			if (c->state != C_ACTIVE)
				continue;
			conn_end(b, c, GG_ERR_CLOSED, why, why);
			conn_settle(b, c, b->loop->now_us);
		}
		serve_waiting(b, b->loop->now_us);
	}
	/* Retried on every call should the ring have had no room. */
	if (b->accept.armed && !b->cancels && gg_loop_cancel_fd(b->loop, b->listen_fd, ud(b, K_CANCEL, NULL)) == 0)
		b->cancels++;
	if (b->listen_fd >= 0 && !b->accept.armed && !b->cancels) {
		struct stat st;
		close(b->listen_fd);
		b->listen_fd = -1;
		if (!stat(b->path, &st) && st.st_dev == b->listen_dev && st.st_ino == b->listen_ino)
			unlink(b->path);
	}
	for (struct hb_job *j = b->jobs; j; j = j->next)
		if (j->with_core || j->nccl_phase)
			return false;
	return b->listen_fd < 0 && !b->stats.connections;
}

static void hb_destroy(struct gg_site_backend *base)
{
	struct gg_host_backend *b = host_of(base);

	if (!b)
		return;
	/* Only reached without start() or after stop() returned true. */
	if (b->listen_fd >= 0)
		close(b->listen_fd);
	for (unsigned i = 0; i < b->waiting_count; i++)
		close(b->waiting[i].fd);
	if (b->spare_wait_fd >= 0)
		close(b->spare_wait_fd);
	while (b->jobs)
		job_free(b, b->jobs);
	deferred_free(b);
	free(b->deferred);
	free(b->conns);
	free(b);
}

static const struct gg_site_backend_ops host_ops = {
	.name = "host",
	.start = hb_start,
	.on_cqe = hb_on_cqe,
	.tick = hb_tick,
	.complete = hb_complete,
	.stop = hb_stop,
	.destroy = hb_destroy,
};

struct gg_site_backend *gg_host_backend_base(struct gg_host_backend *b)
{
	return &b->base;
}

void gg_host_backend_get_stats(const struct gg_host_backend *b, struct gg_host_backend_stats *stats)
{
	*stats = b->stats;
	stats->sessions = 0;
	for (const struct hb_job *j = b->jobs; j; j = j->next)
		stats->sessions += j->connected;
}

unsigned gg_host_backend_list_jobs(const struct gg_host_backend *b, struct gg_host_job_info *out, unsigned max)
{
	unsigned n = 0;

	/* New jobs go to the front of the list. */
	for (const struct hb_job *j = b->jobs; j; j = j->next)
		n++;
	unsigned skip = n > max ? n - max : 0, i = 0;
	for (const struct hb_job *j = b->jobs; j; j = j->next, i++) {
		if (i < skip)
			continue;
		bool announced = false;
		for (unsigned r = 0; r < j->nranks && !announced; r++)
			announced = j->ranks[r] && j->ranks[r]->req_count;
		struct gg_host_job_info *o = &out[n - 1 - i];
		memcpy(o->name, j->name, sizeof(o->name));
		o->nranks = j->nranks;
		o->connected = j->connected;
		o->last_step = j->seq - 1;
		o->uid = (uint32_t)j->uid;
		o->state = j->broken ? GG_CTRL_JOB_FAILED : j->with_core || j->nccl_phase ? GG_CTRL_JOB_RUNNING
			   : announced ? GG_CTRL_JOB_GATHERING : GG_CTRL_JOB_IDLE;
	}
	return n;
}

void gg_host_backend_options_from_config(const struct gg_config *cfg, struct gg_host_backend_options *opts)
{
	*opts = (struct gg_host_backend_options){
		.control = cfg->site.control,
		.site = cfg->site.name,
		.max_clients = (unsigned)cfg->limits.max_clients,
		.max_message_bytes = cfg->limits.max_message_bytes,
		.memory_bytes = cfg->limits.memory_bytes,
		.step_timeout_us = cfg->transport.step_timeout_us,
		.answer_grace_us = cfg->transport.heartbeat_timeout_us,
		.hello_timeout_us = cfg->transport.handshake_timeout_us,
		.session_idle_us = cfg->limits.session_idle_us,
		.kind_base = GG_OP_USER,
#if HAVE_NCCL
		.nccl = &gg_site_nccl_real,
#endif
	};
}

int gg_host_backend_check_control(const char *control, char *err, size_t err_size)
{
	/* The rest of the endpoint is the config's to check. */
	if (!control || strncmp(control, "unix:/", 6))
		return 0;
	const char *path = control + 5;
	struct stat st;
	int rc = check_socket_folders(path, err, err_size);
	if (rc)
		return rc;
	/* What listen_on() would refuse: something else at the path (a
	 * socket may be a stale one, or a running gateway's, told at start),
	 * or a folder missing above the socket's own, which it makes. */
	if (!lstat(path, &st) && !S_ISSOCK(st.st_mode)) {
		snprintf(err, err_size, "control socket %s: the path exists and is not a socket", path);
		return -EEXIST;
	}
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
	snprintf(dir, sizeof(dir), "%s", path);
	for (int level = 0; level < 2; level++) {
		/* The folder above: "a//b" is a's, "/a" is "/". */
		char *slash = strrchr(dir, '/');
		while (slash && slash > dir && slash[-1] == '/')
			slash--;
		if (!slash || !strcmp(dir, "/"))
			return 0;
		slash[slash == dir] = '\0';
		if (!stat(dir, &st)) {
			/* The socket's folder is missing: listen_on() makes it
			 * where the gateway's user may. */
			if (S_ISDIR(st.st_mode) && level == 1 && faccessat(AT_FDCWD, dir, W_OK | X_OK, AT_EACCESS) &&
			    (errno == EACCES || errno == EROFS)) {
				char missing[sizeof(dir)];
				snprintf(missing, sizeof(missing), "%.*s", (int)(strrchr(path, '/') - path), path);
				return folder_unmakeable(path, missing, "no write access to its parent folder", err,
							 err_size);
			}
			if (S_ISDIR(st.st_mode))
				return 0;
			snprintf(err, err_size, "control socket %s: %s is not a folder", path, dir);
			return -ENOTDIR;
		}
		if (errno != ENOENT)
			return 0; /* the socket check above said what it could */
	}
	snprintf(err, err_size, "control socket %s: folder %s does not exist (the gateway makes only the socket's "
		 "own folder)", path, dir);
	return -ENOENT;
}

int gg_host_backend_create(const struct gg_host_backend_options *opts, const struct gg_core_ops *core_ops,
			   void *core, struct gg_host_backend **out, char *err, size_t err_size)
{
	const char *ctl = opts->control ? opts->control : "";
	struct gg_host_backend *b;

	*out = NULL;
	if (strncmp(ctl, "unix:/", 6)) {
		snprintf(err, err_size, "control endpoint '%s': host mode shares memory with local ranks, so it "
			 "needs unix:/absolute/path", ctl);
		return -EINVAL;
	}
	if (strlen(ctl + 5) >= sizeof(b->path)) {
		snprintf(err, err_size, "control endpoint '%s': the path is longer than %zu bytes", ctl,
			 sizeof(b->path) - 1);
		return -EINVAL;
	}
	if (!opts->site || !*opts->site || strlen(opts->site) >= sizeof(b->site)) {
		snprintf(err, err_size, "host backend: the site name must have 1 to %zu characters", sizeof(b->site) - 1);
		return -EINVAL;
	}
	if (opts->max_clients < 1 || opts->max_clients > 4096 || !opts->max_message_bytes ||
	    opts->max_message_bytes > MAX_MESSAGE_LIMIT || !opts->memory_bytes || opts->step_timeout_us < 1000 ||
	    opts->hello_timeout_us < 1000 || opts->kind_base < GG_OP_USER ||
	    opts->kind_base + GG_HOST_BACKEND_KINDS > 256 || !core_ops || !core_ops->submit) {
		snprintf(err, err_size, "host backend: options out of range (max_clients 1..4096, max_message 1 "
			 "byte..1 TiB, timeouts >= 1 ms, kind_base >= GG_OP_USER, a core with submit)");
		return -EINVAL;
	}
	b = calloc(1, sizeof(*b));
	if (!b || !(b->conns = calloc(opts->max_clients + STATUS_SLOTS, sizeof(*b->conns)))) {
		free(b);
		snprintf(err, err_size, "host backend: out of memory");
		return -ENOMEM;
	}
	b->base.ops = &host_ops;
	b->opts = *opts;
	b->opts.control = NULL;
	b->opts.site = NULL;
	memcpy(b->path, ctl + 5, strlen(ctl + 5) + 1);
	memcpy(b->site, opts->site, strlen(opts->site) + 1);
	b->core_ops = core_ops;
	b->core = core;
	b->listen_fd = -1;
	b->spare_wait_fd = -1;
	/* Room for a largest message next to requests still in flight. */
	b->max_region_bytes = (2 * opts->max_message_bytes + GG_CTRL_ALIGN + 4095) & ~(uint64_t)4095;
	for (unsigned i = 0; i < slots(b); i++) {
		b->conns[i].index = i;
		b->conns[i].fd = -1;
	}
	*out = b;
	return 0;
}
