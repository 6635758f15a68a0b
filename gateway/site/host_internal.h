/* The host backend's parts (host_backend.c, host_conn.c, host_job.c,
 * host_msg.c): what they share. Not for anything outside gateway/site/.
 *
 *   host_conn.c     the ranks' connections: answers, admission to the
 *                   slots, idle jobs giving theirs up, ends and refusals
 *   host_job.c      jobs and their steps: gathering the ranks' requests,
 *                   the site sum, the step with the core, results, and
 *                   the memory the sums take
 *   host_msg.c      the control messages a rank sends, NCCL joins, the
 *                   socket's receive and send completions
 *   host_backend.c  the seam (site_backend.h): start, tick, stop, stats
 */
#ifndef GG_HOST_INTERNAL_H
#define GG_HOST_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

#include "acceptor.h"
#include "control_proto.h"
#include "gg_build_config.h"
#include "host_backend.h"
#include "log.h"
#include "site_nccl.h"

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

/* Connections past max_clients that may stay while they have not said
 * what they are: a `gradgate status` finds room on a full gateway without
 * making an idle job give its sessions up, and a session that comes this
 * way is held to max_clients once its HELLO says it is one. */
#define STATUS_SLOTS 2u

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
	/* An allocation of the rank's it let go of (UNMAP) while an NCCL call
	 * of the gateway's ran: the gateway still has it open (hb_defer()). */
	bool ipc_deferred;
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
	uint64_t ended_seq;   /* the last step ranks were told failed without seq moving on (a broken job's) */
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
	int lock_fd; /* PATH.lock, held while listening (take_lock()) */
	dev_t listen_dev;
	ino_t listen_ino;
	struct gg_acceptor accept;
	unsigned cancels;
	bool stopping;
	/* The socket's path, looked at now and then (check_socket_path()). */
	uint64_t path_check_us;
	int old_listen_fd;       /* a socket replaced by a new one, until its accept is cancelled; -1: none */
	bool old_cancel_queued;  /* and the cancel is on its way (one of `cancels`) */
	bool path_taken_said;    /* another file took the path: said once */
	bool path_remake_said; /* the path could not be made again: said once */

	struct hb_conn *conns; /* hb_slots(): opts.max_clients + STATUS_SLOTS */
	struct hb_job *jobs;
	struct gg_log_limit refusal_log; /* REFUSALS_LOGGED a second */
	struct gg_log_limit session_log; /* ranks coming and going: hb_session_log_now() */
	struct gg_log_limit accept_log;  /* failed accepts: a line a second */
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

GG_PRINTF(2, 3) void hb_log(struct gg_host_backend *b, const char *fmt, ...);
/* The same for a fault of the gateway's own (its socket, its ring): a
 * warning, where hb_log()'s lines (ranks, refusals, steps) are news. */
GG_PRINTF(2, 3) void hb_warn(struct gg_host_backend *b, const char *fmt, ...);

static inline uint64_t hb_ud(const struct gg_host_backend *b, unsigned kind, const struct hb_conn *c)
{
	return gg_loop_ud(b->opts.kind_base + kind, c ? c->index : 0, c ? c->gen : 0);
}

static inline uint64_t hb_min_deadline(uint64_t a, uint64_t b)
{
	return !a ? b : !b ? a : GG_MIN(a, b);
}

static inline struct hb_req *hb_req_head(const struct hb_conn *c)
{
	return c->req_count ? (struct hb_req *)&c->reqs[c->req_head] : NULL;
}

static inline void hb_req_pop(struct hb_conn *c)
{
	uint32_t region = c->reqs[c->req_head].region;

	if (region != GG_CTRL_REGION_NCCL)
		c->regions[region].users--;
	c->req_head = (c->req_head + 1) % GG_CTRL_MAX_INFLIGHT;
	c->req_count--;
}

/* host_conn.c */
void hb_out_kick(struct gg_host_backend *b, struct hb_conn *c);
union gg_ctrl_msg *hb_out_push(struct hb_conn *c, enum gg_ctrl_type type);
GG_PRINTF(4, 5) void hb_answer(struct gg_host_backend *b, struct hb_conn *c, int status, const char *fmt, ...);
bool hb_region_unmap(struct gg_host_backend *b, struct hb_region *r);
bool hb_conn_holds_gpu(const struct gg_host_backend *b, const struct hb_conn *c);
void hb_conn_settle(struct gg_host_backend *b, struct hb_conn *c, uint64_t now_us);
bool hb_keep_for_core(struct hb_conn *c, unsigned id);
bool hb_session_log_now(struct gg_host_backend *b);
uint64_t hb_tell_held(struct gg_host_backend *b, struct gg_log_limit *l, bool fault, const char *what, uint64_t next);
void hb_conn_closing(struct gg_host_backend *b, struct hb_conn *c);
void hb_conn_lost(struct gg_host_backend *b, struct hb_conn *c, int err);
GG_PRINTF(4, 5) void hb_conn_refuse(struct gg_host_backend *b, struct hb_conn *c, int code, const char *fmt, ...);
void hb_conn_end(struct gg_host_backend *b, struct hb_conn *c, int code, const char *text, const char *why);
GG_PRINTF(4, 5) void hb_conn_fatal(struct gg_host_backend *b, struct hb_conn *c, int code, const char *fmt, ...);
GG_PRINTF(4, 5) void hb_conn_unserved(struct gg_host_backend *b, struct hb_conn *c, int code, const char *fmt,
				      ...);
bool hb_end_waiting_joiners(struct gg_host_backend *b, struct hb_job *j);
bool hb_job_idle(const struct gg_host_backend *b, const struct hb_job *j);
unsigned hb_slots(const struct gg_host_backend *b);
void hb_job_evict(struct gg_host_backend *b, struct hb_job *j, const char *needed);
void hb_idle_hint(const struct gg_host_backend *b, char *buf, size_t size);
void hb_arm_recv(struct gg_host_backend *b, struct hb_conn *c);
bool hb_make_room(struct gg_host_backend *b, unsigned more, const struct hb_conn *except, bool young);
void hb_conn_new(struct gg_host_backend *b, int fd);
void hb_refuse_waited(struct gg_host_backend *b, int fd);
uint64_t hb_serve_waiting(struct gg_host_backend *b, uint64_t now_us);

/* host_job.c */
bool hb_step_in_progress(const struct hb_job *j);
bool hb_nccl_running(const struct gg_host_backend *b);
bool hb_defer(struct gg_host_backend *b, void *ptr, uint64_t bytes, int kind);
void hb_nccl_phase_set(struct gg_host_backend *b, struct hb_job *j, int phase);
bool hb_deferred_free(struct gg_host_backend *b);
void hb_nccl_end_id(struct gg_host_backend *b, struct hb_job *j);
/* Frees a job's arrays and the job (NULL is allowed); hb_job_free() first
 * lets go of what the job holds. */
void hb_job_release(struct hb_job *j);
void hb_job_free(struct gg_host_backend *b, struct hb_job *j);
void hb_nccl_abort(struct gg_host_backend *b, struct hb_job *j, int code, const char *why);
void hb_job_break(struct gg_host_backend *b, struct hb_job *j, int code, const char *why, bool rank_leaving);
void hb_job_settle(struct gg_host_backend *b, struct hb_job *j);
GG_PRINTF(4, 5) void hb_fail_step(struct gg_host_backend *b, struct hb_job *j, int code, const char *fmt, ...);
const char *hb_nccl_joiners(const struct hb_job *j, char *buf, size_t size);
void hb_fail_timeout(struct gg_host_backend *b, struct hb_job *j);
void hb_step_release_sum(struct gg_host_backend *b, struct hb_job *j);
void hb_step_deliver(struct gg_host_backend *b, struct hb_job *j, int status, const char *message);
void hb_broadcast_failed(struct gg_host_backend *b, struct hb_job *j, int status, const char *message, int code,
			 const char *text);
void hb_finish_step(struct gg_host_backend *b, struct hb_job *j, int status, const char *message);
bool hb_step_submit(struct gg_host_backend *b, struct hb_job *j);
bool hb_failed_elsewhere(struct gg_host_backend *b, struct hb_job *j);
void hb_job_advance(struct gg_host_backend *b, struct hb_job *j);
struct hb_job *hb_job_find(struct gg_host_backend *b, const char *name);

/* host_msg.c */
bool hb_nccl_progress(struct gg_host_backend *b, struct hb_job *j, uint64_t now_us, uint64_t *next);
void hb_on_recv(struct gg_host_backend *b, struct hb_conn *c, int res);
void hb_on_send(struct gg_host_backend *b, struct hb_conn *c, int res);
void hb_arm_accept(struct gg_host_backend *b);
void hb_on_accept(struct gg_host_backend *b, const struct io_uring_cqe *cqe);

#endif
