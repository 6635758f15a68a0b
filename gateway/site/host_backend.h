/* The host-mode site backend: local ranks connect to the control socket
 * with the client library (include/gradgate.h), hand their buffers over in
 * shared memory, and get the job's result back in the same place. The
 * protocol is in control_proto.h and docs/control-protocol.md.
 *
 * Per job, one step is in flight at a time: a step starts when every rank
 * of the job has announced it with the same tensor, count and dtype; it
 * fails at the ranks present when the others do not arrive by the step's
 * deadline, when they disagree, or when a rank leaves or breaks the
 * protocol. Each session may have GG_CTRL_MAX_INFLIGHT requests queued.
 *
 * A float32 step is summed in place in rank 0's shared memory and its
 * result goes straight into every rank's memory, a range at a time as the
 * core finishes it (site_backend.h); a bfloat16 step needs a float32 sum
 * of its own. Ranks may hand over CUDA allocations instead
 * (gg_allreduce_cuda, MAP_CUDA): such a step is summed whole on the
 * gateway's GPU into device memory before the core gets it (the core
 * encodes and decodes it there: memory GG_STEP_MEM_CUDA), and its result
 * written back whole by the GPU once the core is done (cuda/site_cuda.h).
 * Or ranks all-reduce through the job's NCCL communicator, of which the
 * gateway is the last rank (gg_allreduce_nccl, NCCL_JOIN): their reduce to
 * the gateway forms the site sum in its device memory, and its broadcast
 * hands them the result (site_nccl.h); the loop polls both, never waiting
 * for the ranks (only a job's end waits, up to 200 ms, for the flush of
 * its communicator). A step that fails before the
 * gateway's reduce, or a rank that leaves, aborts the communicator, for
 * the ranks' calls would otherwise wait for the gateway's forever.
 *
 * Bounds: max_clients connections (and so jobs); per connection a fixed
 * receive buffer, GG_CTRL_MAX_INFLIGHT + 3 queued answers and at most
 * GG_CTRL_MAX_REGIONS mapped regions of at most 2 * max_message bytes
 * each (a CUDA allocation: its own size, on the GPU); memory_bytes for
 * the float32 sums of bfloat16 and GPU steps held at once. */
#ifndef GG_HOST_BACKEND_H
#define GG_HOST_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "control_proto.h"
#include "gg_common.h"
#include "site_backend.h"
#include "site_nccl.h"

#define GG_HOST_BACKEND_KINDS 4u /* user_data kinds used from kind_base on */

struct gg_host_backend_options {
	const char *control;        /* "unix:/absolute/path"; copied */
	const char *site;           /* this site's name, for messages; copied */
	unsigned max_clients;       /* connections at once, 1..4096 (as the config allows) */
	uint64_t max_message_bytes; /* largest tensor a rank may submit */
	uint64_t memory_bytes;      /* float32 sums held at once */
	uint64_t step_timeout_us;   /* longest a step may take; also the default */
	uint64_t answer_grace_us;   /* past a step's deadline, the longest the core may take to end it */
	uint64_t hello_timeout_us;  /* a new connection must say HELLO within this */
	/* A job none of whose ranks sent anything for this long, with no step
	 * under way, is idle: when max_clients are taken, a new connection
	 * waits while the idle job idle longest is closed (its ranks get
	 * GG_ERR_CLOSED saying so), and a rank of another user asking for an
	 * idle job's name takes it the same way. 0: never. */
	uint64_t session_idle_us;
	/* A user other than root and the gateway's own holds at most half of
	 * max_clients sessions and starts at most half of max_jobs jobs (the
	 * core's, 0: unbounded here) at once, and all such users together
	 * three quarters of each, so that no one user can keep the others
	 * out, and no two keep root and the gateway's user out. */
	bool user_shares;
	unsigned max_jobs;
	unsigned kind_base;         /* >= GG_OP_USER; kinds kind_base..+GG_HOST_BACKEND_KINDS-1 */
	/* Called for refusals, protocol errors and failed steps, and with
	 * `fault` for failures of the gateway's own (its socket, its ring);
	 * NULL: quiet. */
	void (*log)(void *arg, bool fault, const char *line);
	void *log_arg;
	/* Answers a STATUS request (control_proto.h): writes STATUS_SITE and
	 * the messages it announces, at most `max`, into `out` and returns how
	 * many. Runs on the loop's thread. NULL: status requests are refused. */
	unsigned (*status)(void *arg, union gg_ctrl_msg *out, unsigned max);
	void *status_arg;
	/* GPU mode with NCCL (gg_allreduce_nccl): the calls of a job's NCCL
	 * communicator. NULL: NCCL_JOIN is refused, the gateway being built
	 * without NCCL. */
	const struct gg_site_nccl_ops *nccl;
};

/* The most messages a status answer may have. */
#define GG_HOST_STATUS_MAX_MESSAGES (1u + 7u + GG_CTRL_STATUS_MAX_JOBS + GG_CTRL_STATUS_MAX_FAILURES)

/* A job as the status shows it. */
struct gg_host_job_info {
	char name[GG_CTRL_NAME_SIZE];
	unsigned nranks, connected;
	uint64_t last_step;            /* the last step that ended; 0: none */
	enum gg_ctrl_job_state state;
	uint32_t uid;
};

struct gg_host_backend_stats {
	unsigned connections;  /* open, including those being closed */
	unsigned jobs;
	unsigned sessions;     /* ranks connected to their jobs */
	unsigned regions;      /* shared regions mapped */
	unsigned core_steps;   /* steps the core holds now */
	uint64_t sum_bytes;    /* float32 sums held for bfloat16 and GPU steps in flight */
	uint64_t spare_bytes;  /* sum buffers jobs keep for their next step */
	uint64_t steps_done;   /* steps delivered to their ranks */
	uint64_t steps_failed; /* steps failed at their ranks */
	uint64_t refused;      /* connections refused */
	uint64_t violations;   /* connections closed for breaking the protocol */
	uint64_t evicted;      /* sessions of idle jobs closed for a connection that needed them */
	uint64_t status_requests; /* status requests answered */
};

struct gg_host_backend;

/* Fills `opts` from the site configuration: control, site name, limits
 * and step timeout; handshake_timeout bounds HELLO. `cfg` must outlive the
 * options. */
void gg_host_backend_options_from_config(const struct gg_config *cfg, struct gg_host_backend_options *opts);

/* Whether a gateway may listen on `control` ("unix:/path", as [site]
 * control says): every folder on the path must belong to root or the
 * gateway's user (this process's) and let nobody else write in it but
 * under the sticky bit. The gateway checks it again as it starts; this is
 * for --check-config. Returns 0, or a negative errno with err. */
GG_MUST_CHECK int gg_host_backend_check_control(const char *control, char *err, size_t err_size);

/* Whether a running gateway holds the lock of control socket `control`
 * ("unix:/path"), with its pid in pid ("" where its lock file says none):
 * for the message of a gateway that cannot start beside it. */
bool gg_host_backend_held(const char *control, char *pid, size_t size);

/* Creates a backend (not yet listening) that hands steps to `core_ops`
 * with `core`, both of which must outlive it. Returns 0 with *out set, or
 * -EINVAL / -ENOMEM with `err` saying why. */
GG_MUST_CHECK int gg_host_backend_create(const struct gg_host_backend_options *opts,
					 const struct gg_core_ops *core_ops, void *core,
					 struct gg_host_backend **out, char *err, size_t err_size);

/* The backend behind the generic seam (site_backend.h). */
struct gg_site_backend *gg_host_backend_base(struct gg_host_backend *b);

/* The core is done with `step` (see gg_site_backend_ops.complete): answers
 * every rank DONE (the result is in its shared memory already, float32 or
 * rounded to bfloat16), or sends every rank the error. */
void gg_host_backend_complete(struct gg_host_backend *b, struct gg_site_step *step, int status,
			      const char *message);

void gg_host_backend_get_stats(const struct gg_host_backend *b, struct gg_host_backend_stats *stats);
/* Up to `max` of the jobs, oldest first; returns how many jobs there are. */
unsigned gg_host_backend_list_jobs(const struct gg_host_backend *b, struct gg_host_job_info *out, unsigned max);

#endif
