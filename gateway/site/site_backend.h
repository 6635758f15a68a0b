/* The site backend: the seam between how a site's ranks reach the gateway
 * and the cross-site engine (the "core").
 *
 * A backend gathers one step of a job from all of the job's local ranks
 * and lends it to the core as a struct gg_site_step, which forms the site
 * sum in float32 (summed in rank order) and hands the result back to the
 * ranks' memory range by range as the core computes it. The core exchanges
 * the sum with the other sites and ends the step with
 * gg_site_step_complete(); the backend then tells every rank of the job
 * the outcome.
 *
 * Host mode (host_*.c): ranks hand over host buffers in shared
 * memory; the sum is computed on the CPU, in place in rank 0's buffer for
 * float32. The same backend takes ranks' CUDA allocations by IPC handle
 * (gg_allreduce_cuda): the sum is then formed on the gateway's GPU, in its
 * device memory (memory = GG_STEP_MEM_CUDA), where the core encodes and
 * decodes it; and it joins a job's NCCL communicator (gg_allreduce_nccl),
 * whose reduce to the gateway forms the sum in the same place. A backend implements struct gg_site_backend_ops; the daemon
 * drives every backend the same way:
 *
 *   b->ops->start(b, &loop, err, sizeof(err));
 *   while (running) {
 *           gg_loop_run(&loop, gg_loop_timeout_us(&loop, next), on_cqe, ...);
 *                   on_cqe: if (!b->ops->on_cqe(b, cqe)) ...other owners...
 *           next = b->ops->tick(b, loop.now_us);
 *   }
 *   stop the core first (it completes every step it holds), then
 *   while (!b->ops->stop(b)) gg_loop_run(...);
 *   b->ops->destroy(b);
 *
 * Everything here runs on the thread of the backend's loop: the core calls
 * gg_site_step_complete() on that thread (from inside submit() too). */
#ifndef GG_SITE_BACKEND_H
#define GG_SITE_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <liburing.h>

#include "gg_common.h"
#include "gradgate.h"
#include "uring_loop.h"

struct gg_site_backend;

enum gg_step_memory {
	GG_STEP_MEM_HOST = 0, /* sum is host memory */
	GG_STEP_MEM_CUDA = 1, /* sum is device memory of the gateway's GPU */
};

/* One step of one job, lent to the core between submit() and
 * gg_site_step_complete(). Every field is owned by the backend and stays
 * valid and unchanged until the step is complete.
 *
 * The site sum is formed, and the result handed out, a range at a time as
 * the core gets to it, so each byte is touched while it is in cache and no
 * pass over the whole tensor waits for another: the core calls gather()
 * for a range before it first reads that range of `sum`, and deliver()
 * once that range of `sum` holds the final result. Each element is in
 * exactly one range of each kind, gathered before it is delivered. Both
 * may be called from any of the core's threads, for disjoint ranges at
 * once. */
struct gg_site_step {
	struct gg_site_backend *backend;
	const char *job;            /* the job's name */
	uint64_t seq;               /* the job's step number, 1, 2, 3, ... */
	uint32_t tensor_id;
	uint64_t count;             /* elements */
	enum gg_dtype dtype;        /* what the ranks hold; sum is float32 regardless */
	enum gg_step_memory memory; /* where sum lives */
	unsigned nranks;            /* local ranks that contributed */
	float *sum;                 /* count floats: the site sum, then the final result */
	uint64_t deadline_us;       /* CLOCK_MONOTONIC (gg_monotonic_us) by which to complete */
	uint32_t timeout_ms;        /* the ranks' shortest timeout, which set deadline_us (for messages) */
	/* Writes the site sum of elements [offset, offset + n) into sum[]. */
	void (*gather)(const struct gg_site_step *step, uint64_t offset, uint64_t n);
	/* Hands elements [offset, offset + n) of the final sum[] to the ranks. */
	void (*deliver)(const struct gg_site_step *step, uint64_t offset, uint64_t n);
	void *backend_data;         /* for gather and deliver */
};

/* What the backend needs from the core. */
struct gg_core_ops {
	/* Takes `step`: returns 0 and calls gg_site_step_complete() exactly once
	 * later (or before returning), or returns a negative enum gg_errc code
	 * without keeping the step, which then fails at its ranks with
	 * "site core refused the step: " and gg_strerror(code). */
	int (*submit)(void *core, struct gg_site_step *step);
	/* The backend failed step `seq` of `job` at this site (ranks that
	 * disagree or miss their deadline, a rank that left): the core fails
	 * it at the other sites too, with the enum gg_errc `code` and
	 * `message`, and fails it here if it holds it (completing it as
	 * usual), and returns 0. Or it returns -EALREADY: it holds the step's
	 * whole result and told the other sites so, which may have completed
	 * on its word; the step then completes (or fails) as usual and the
	 * backend hands the result to the ranks still there. Strings are read
	 * during the call only. NULL: a core of one site. */
	int (*abort)(void *core, const char *job, uint64_t seq, int code, const char *message);
	/* Every rank of `job` is gone; no step of it is with the core. `why`:
	 * what took them, when it is not their own doing (the gateway is
	 * shutting down), or NULL. NULL as for abort. */
	void (*end_job)(void *core, const char *job, const char *why);
	/* Step `seq` of `job`, which the backend has not submitted: when it
	 * failed at another site already, so that submit() would fail it at
	 * once, the core fails it as submit() would and returns that enum
	 * gg_errc code, with the message the step fails with in `message`;
	 * the backend then fails it at the ranks that announced it, without
	 * waiting for the others, and does not submit it. Otherwise 0, and
	 * nothing changes. NULL as for abort. */
	int (*fail_unstarted)(void *core, const char *job, uint64_t seq, char *message, size_t message_size);
	/* The first rank of `job` connected here (the job is new at this
	 * site): what the other sites said of the name's runs before now (a
	 * run whose ranks went, a gateway that restarted) is not of this job.
	 * NULL as for abort. */
	void (*job_opened)(void *core, const char *job);
	/* Whether the core may free GPU memory on this thread: false from the
	 * moment an NCCL call of the gateway's may run on its GPU until none
	 * does (cudaFree waits for every kernel on the GPU, and a reduce that
	 * waits for a rank that left ends only by this thread's abort). The
	 * core keeps what it gives up meanwhile and frees it once told true.
	 * Told on each change only; true until told otherwise. NULL as for
	 * abort. */
	void (*gpu_frees)(void *core, bool allowed);
	/* Whether another site is lost now: nothing heard from it for
	 * heartbeat_timeout. True with `why` naming it and why ("site X is
	 * unreachable: ..."), so that a step that fails here for want of it
	 * fails with GG_ERR_SITE, as at the sites that find it the cause.
	 * NULL as for abort. */
	bool (*lost_site)(void *core, char *why, size_t why_size);
	/* Whether every later step of `job` fails for what happened at
	 * another site (gg_node_job_failed()): `gradgate status` then shows
	 * the job failed, as for a rank that left here. NULL as for abort. */
	bool (*job_failed)(void *core, const char *job);
	/* Every step of `job` from `seq` on fails at this site (a rank of it
	 * left or broke the protocol, and others are still connected): the
	 * core fails them at the other sites now, with `code` and `message`,
	 * rather than as the ranks here come to them. Strings are read during
	 * the call only. NULL as for abort. */
	void (*abort_from)(void *core, const char *job, uint64_t seq, int code, const char *message);
};

struct gg_site_backend_ops {
	const char *name;
	/* Starts serving; `loop` belongs to the calling thread, which runs it
	 * from now on. Returns 0, or a negative errno with `err` saying why. */
	int (*start)(struct gg_site_backend *b, struct gg_loop *loop, char *err, size_t err_size);
	/* Handles a completion of one of the backend's operations; false when
	 * the completion's kind is not the backend's. */
	bool (*on_cqe)(struct gg_site_backend *b, const struct io_uring_cqe *cqe);
	/* Fires what is due at `now_us`; returns the next deadline
	 * (gg_monotonic_us), 0 when none. */
	uint64_t (*tick)(struct gg_site_backend *b, uint64_t now_us);
	/* The core is done with `step`: status 0 with every range delivered, or a
	 * negative enum gg_errc code with `message` (may be NULL) naming the
	 * site and what failed, e.g. "site eu-west: peer gateway closed the
	 * connection". Read during the call only. */
	void (*complete)(struct gg_site_backend *b, struct gg_site_step *step, int status, const char *message);
	/* Stops accepting work and closes the ranks' connections (idempotent).
	 * Returns true once nothing is in flight on the loop and no step is
	 * with the core; destroy() may then be called. */
	bool (*stop)(struct gg_site_backend *b);
	void (*destroy)(struct gg_site_backend *b);
};

struct gg_site_backend {
	const struct gg_site_backend_ops *ops;
};

static inline void gg_site_step_complete(struct gg_site_step *step, int status, const char *message)
{
	step->backend->ops->complete(step->backend, step, status, message);
}

#endif
