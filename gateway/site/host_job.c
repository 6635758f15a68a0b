/* The host backend: jobs and their steps (host_internal.h). */
#include "host_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host_sum.h"
#if HAVE_CUDA
#include "dev_mem.h"
#include "site_cuda.h"
#endif

static bool step_uses_nccl(struct hb_job *j);

/* ---- jobs: their memory, their end ------------------------------------- */

bool hb_step_in_progress(const struct hb_job *j)
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
bool hb_nccl_running(const struct gg_host_backend *b)
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
bool hb_defer(struct gg_host_backend *b, void *ptr, uint64_t bytes, int kind)
{
	/* Sums are bounded by the memory limit, which counts them; the ranks'
	 * allocations by as many as every connection's regions at once (a
	 * rank that maps and unmaps in a loop has its unmaps done at once
	 * past that). */
	if (!hb_nccl_running(b) ||
	    (kind == DEFER_IPC && b->deferred_ipc >= hb_slots(b) * GG_CTRL_MAX_REGIONS))
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
	if (sum && (on_gpu || nccl) && hb_defer(b, sum, bytes, nccl ? DEFER_NCCL_SUM : DEFER_DEV_SUM))
		return;
	sum_free_now(b, sum, on_gpu, nccl);
}

/* Tells the core whether it may free GPU memory, when that changed. */
static void core_gpu_frees(struct gg_host_backend *b)
{
	bool held = hb_nccl_running(b);

	if (held == b->core_frees_held)
		return;
	b->core_frees_held = held;
	if (b->core_ops->gpu_frees)
		b->core_ops->gpu_frees(b->core, !held);
}

/* Sets the NCCL call of job j under way (PHASE_NONE: none any more). The
 * core is told at once that it may not free GPU memory; that it may again
 * only at the end of the loop's turn (hb_deferred_free()), when a call that
 * failed has been aborted: one past its deadline still runs until then. */
void hb_nccl_phase_set(struct gg_host_backend *b, struct hb_job *j, int phase)
{
	j->nccl_phase = phase;
	if (phase != PHASE_NONE)
		core_gpu_frees(b);
}

/* What waited for the gateway's NCCL calls, once none runs. Returns true
 * when it let go of ranks' allocations, whose connections may end now. */
bool hb_deferred_free(struct gg_host_backend *b)
{
	bool ipc = b->deferred_ipc > 0;

	core_gpu_frees(b);
	if (!b->deferred_count || hb_nccl_running(b))
		return false;
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
	if (ipc)
		for (unsigned i = 0; i < hb_slots(b); i++)
			b->conns[i].ipc_deferred = false;
	b->deferred_count = 0;
	b->deferred_ipc = 0;
	b->deferred_bytes = 0;
	return ipc;
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
void hb_nccl_end_id(struct gg_host_backend *b, struct hb_job *j)
{
	if (b->opts.nccl->end_id)
		b->opts.nccl->end_id(j->nccl_id);
}

void hb_job_release(struct hb_job *j)
{
	if (!j)
		return;
	free(j->ranks);
	free(j->mem);
	free(j->gpu_out);
	free(j->mem_region);
	free(j->orphans);
	free(j);
}

void hb_job_free(struct gg_host_backend *b, struct hb_job *j)
{
	for (unsigned i = 0; i < hb_slots(b); i++)
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
		hb_nccl_end_id(b, j);
	hb_job_release(j);
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
void hb_nccl_abort(struct gg_host_backend *b, struct hb_job *j, int code, const char *why)
{
	if (j->nccl_state != NCCL_JOINING && j->nccl_state != NCCL_UP)
		return;
	b->opts.nccl->close(j->nccl_comm);
	j->nccl_comm = NULL;
	hb_nccl_end_id(b, j);
	j->nccl_never_up = j->nccl_state == NCCL_JOINING;
	j->nccl_state = NCCL_ABORTED;
	if (j->spare_nccl)
		drop_spare(b, j); /* no NCCL step of the job can use it now */
	j->nccl_code = code;
	gg_ctrl_set_text(j->nccl_why, sizeof(j->nccl_why), why);
	hb_log(b, "job '%s': its NCCL communicator is aborted: %s", j->name, why);
}

/* Every request of the job fails from now on with `why`. `rank_leaving`:
 * a rank of it, still counted in j->connected, is leaving. */
void hb_job_break(struct gg_host_backend *b, struct hb_job *j, int code, const char *why, bool rank_leaving)
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
		hb_nccl_abort(b, j, b->stopping ? GG_ERR_CLOSED : code, why);
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
	} else if (hb_step_in_progress(j) && j->nccl_phase != PHASE_BROADCAST) {
		tell_core(b, j, j->seq, code, why);
	}
	/* Every step after those fails here as its remaining ranks come to
	 * it: the other sites hear so now, not step by step as they come
	 * (which a late rank here would hold up past their deadline). Where
	 * none remains, the job's end says it; a gateway that stops says so
	 * itself, to every job. */
	if (b->core_ops->abort_from && !b->stopping && j->connected > (rank_leaving ? 1u : 0u))
		b->core_ops->abort_from(b->core, j->name,
					j->with_core ? j->step.seq + 1 : j->seq + hb_step_in_progress(j), code, why);
}

void hb_job_settle(struct gg_host_backend *b, struct hb_job *j)
{
	uint64_t poll;

	/* What an abort cut short ends now, not at the next tick. */
	if (j->nccl_state == NCCL_ABORTED)
		hb_nccl_progress(b, j, b->loop->now_us, &poll);
	if (j->nccl_never_up && hb_end_waiting_joiners(b, j))
		return;
	if (!j->connected && !j->with_core && !j->nccl_phase)
		hb_job_free(b, j);
	else
		hb_job_advance(b, j);
}

/* ---- jobs and steps ----------------------------------------------------- */

/* Whether a rank announced step j->seq through the job's NCCL
 * communicator. */
static bool step_uses_nccl(struct hb_job *j)
{
	for (unsigned r = 0; r < j->nranks; r++) {
		struct hb_conn *c = j->ranks[r];
		struct hb_req *h = c ? hb_req_head(c) : NULL;
		if (h && h->seq == j->seq && h->region == GG_CTRL_REGION_NCCL)
			return true;
	}
	return false;
}

/* Fails step j->seq at the ranks that announced it; those that come later
 * get the same message. */
GG_PRINTF(4, 5) void hb_fail_step(struct gg_host_backend *b, struct hb_job *j, int code, const char *fmt, ...)
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
		hb_nccl_abort(b, j, code, f->msg);
	for (unsigned r = 0; r < j->nranks; r++) {
		struct hb_conn *c = j->ranks[r];
		struct hb_req *h = c ? hb_req_head(c) : NULL;
		if (h && h->seq == j->seq)
			hb_answer(b, c, code, "step %llu (tensor %u): %s", (unsigned long long)h->seq, h->tensor_id,
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
	const struct hb_req *h = c ? hb_req_head(c) : NULL;

	return !h || h->seq != j->seq;
}

/* Which ranks of the job have not asked to join its NCCL communicator:
 * "ranks 1, 3 (not connected) did not ask to join it", or "every rank
 * asked to join it"; into buf (160 bytes or more). */
const char *hb_nccl_joiners(const struct hb_job *j, char *buf, size_t size)
{
	char list[112];
	unsigned missing = rank_list(j, not_joined, list, sizeof(list));

	if (!missing)
		snprintf(buf, size, "every rank asked to join it");
	else
		snprintf(buf, size, "rank%s %s did not ask to join it", missing == 1 ? "" : "s", list);
	return buf;
}

void hb_fail_timeout(struct gg_host_backend *b, struct hb_job *j)
{
	char list[160];
	unsigned missing = rank_list(j, not_announced, list, sizeof(list));

	if (!missing) {
		hb_fail_step(b, j, GG_ERR_TIMEOUT, "timed out after %u ms waiting for the NCCL communicator of job '%s' to "
			     "come up: %s", j->deadline_ms, j->name, hb_nccl_joiners(j, list, sizeof(list)));
		return;
	}
	hb_fail_step(b, j, GG_ERR_TIMEOUT, "timed out after %u ms waiting for rank%s %s of job '%s' at site %s",
		     j->deadline_ms, missing == 1 ? "" : "s", list, j->name, b->site);
}

/* The step's own sum buffer, if it has one, becomes the job's spare (it
 * took the previous one). */
void hb_step_release_sum(struct gg_host_backend *b, struct hb_job *j)
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
void hb_step_deliver(struct gg_host_backend *b, struct hb_job *j, int status, const char *message)
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
			if (j->ranks[r] && hb_req_head(j->ranks[r]))
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
			struct hb_req *h = c ? hb_req_head(c) : NULL;
			if (!h)
				continue; /* a rank that left after the core had the result */
			if (status)
				hb_answer(b, c, status, "step %llu (tensor %u): %s", (unsigned long long)h->seq, h->tensor_id,
					  message);
			else
				hb_answer(b, c, GG_OK, "%s", "");
		}
		if (status) {
			b->stats.steps_failed++;
			hb_log(b, "job '%s' step %llu failed: %s", j->name, (unsigned long long)j->seq, message);
		} else {
			b->stats.steps_done++;
		}
	}
	hb_step_release_sum(b, j);
	for (unsigned r = 0; r < j->nranks; r++)
		hb_region_unmap(b, &j->orphans[r]);
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
		hb_job_break(b, j, GG_ERR_SYSTEM, gpu_msg, false);
}

/* An NCCL step's broadcast could not be made: the ranks are told with
 * the core's outcome, or, when the step completed elsewhere, with `text`;
 * then the job cannot go on as one. */
void hb_broadcast_failed(struct gg_host_backend *b, struct hb_job *j, int status, const char *message, int code,
			 const char *text)
{
	hb_nccl_abort(b, j, code, text);
	hb_step_deliver(b, j, status ? status : code, status ? message : text);
	if (!status)
		hb_job_break(b, j, code, text, false);
}

/* The core is done with the step. An NCCL step's result goes to the ranks
 * by the gateway's broadcast first, whatever the outcome: the ranks wait
 * in theirs, and the communicator would hang. The tick sees it finish. */
void hb_finish_step(struct gg_host_backend *b, struct hb_job *j, int status, const char *message)
{
	char why[TEXT - 96], text[2 * TEXT];

	if (!j->step_nccl || j->abandoned || j->nccl_state != NCCL_UP) {
		hb_step_deliver(b, j, status, message);
		return;
	}
	if (b->opts.nccl->broadcast(j->nccl_comm, j->step.sum, j->step.count, why, sizeof(why))) {
		snprintf(text, sizeof(text), "site %s: handing the result to the ranks: %s", b->site, why);
		hb_broadcast_failed(b, j, status, message, GG_ERR_SYSTEM, text);
		return;
	}
	/* The core is done with it: only the broadcast holds the step now. */
	j->with_core = false;
	b->stats.core_steps--;
	hb_nccl_phase_set(b, j, PHASE_BROADCAST);
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
 * core is done (hb_step_deliver()): a CUDA failure then fails the step cleanly,
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
	hb_fail_step(b, j, rc == -ENOMEM ? GG_ERR_NOMEM : GG_ERR_SYSTEM, "summing on the gateway's GPU: %s", why);
	return false;
#else
	/* No region is a device one without CUDA: MAP_CUDA is refused. */
	(void)ref, (void)sum, (void)cap;
	hb_fail_step(b, j, GG_ERR_INVALID, "the gateway was built without CUDA");
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
		struct hb_req *h = hb_req_head(c);
		enum mem_kind k = mem_kind(c, h);
		if (r == 0) {
			kind = k;
		} else if (k != kind) {
			hb_fail_step(b, j, GG_ERR_MISMATCH,
				     "ranks hold the step in different kinds of memory: rank 0 %s, rank %u %s "
				     "(gg_allreduce_cuda takes GPU memory, gg_allreduce_nccl goes through NCCL, the other "
				     "calls take host memory)", kind_text[kind], r, kind_text[k]);
			return false;
		}
		j->mem[r] = k == MEM_NCCL ? NULL : c->regions[h->region].base + h->offset;
		j->mem_region[r] = h->region;
	}
	if (kind == MEM_NCCL && j->nccl_state == NCCL_ABORTED) {
		hb_fail_step(b, j, j->nccl_code, "%s", j->nccl_why);
		return false;
	}
	if (kind == MEM_NCCL && j->nccl_state != NCCL_UP) { /* hb_job_advance waits while it is joined */
		hb_fail_step(b, j, GG_ERR_PROTOCOL, "the NCCL communicator of job '%s' is not up", j->name);
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
			hb_fail_step(b, j, GG_ERR_LIMIT,
				     "the gateway's memory limit of %llu bytes leaves no room for a %llu-byte sum (%llu in "
				     "use)", (unsigned long long)b->opts.memory_bytes, (unsigned long long)bytes,
				     (unsigned long long)(b->stats.sum_bytes + b->deferred_bytes));
			return false;
		}
		if (!sum && !device && !(sum = malloc(bytes))) {
			hb_fail_step(b, j, GG_ERR_NOMEM, "the gateway is out of memory for a %llu-byte sum",
				     (unsigned long long)bytes);
			return false;
		}
		if (nccl) {
			char why[TEXT - 96];
			int rc = sum ? 0 : b->opts.nccl->alloc(&sum, ref->count, why, sizeof(why));
			if (rc) {
				hb_fail_step(b, j, rc == -ENOMEM ? GG_ERR_NOMEM : GG_ERR_SYSTEM,
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
		return hb_step_submit(b, j);
	/* The site sum comes by the ranks' reduce, which the tick watches. */
	char why[TEXT - 96];
	if (b->opts.nccl->reduce(j->nccl_comm, sum, ref->count, why, sizeof(why))) {
		char text[2 * TEXT];
		snprintf(text, sizeof(text), "site %s: summing the ranks' tensors: %s", b->site, why);
		hb_step_release_sum(b, j);
		hb_nccl_abort(b, j, GG_ERR_SYSTEM, text);
		hb_fail_step(b, j, GG_ERR_SYSTEM, "%s", text);
		return false;
	}
	hb_nccl_phase_set(b, j, PHASE_REDUCE);
	j->nccl_since_us = b->loop->now_us;
	j->nccl_until_us = j->deadline_us;
	return true;
}

/* Hands the step set up in j->step to the core. Returns true while the
 * step is under way; false when it is over (failed, or completed from
 * inside submit) and the job should look at its next step. */
bool hb_step_submit(struct gg_host_backend *b, struct hb_job *j)
{
	j->with_core = true;
	b->stats.core_steps++;
	j->in_submit = true;
	j->sync_done = false;
	int rc = b->core_ops->submit(b->core, &j->step);
	j->in_submit = false;
	if (j->sync_done) {
		hb_finish_step(b, j, j->sync_status, j->sync_msg);
	} else if (rc) {
		char text[TEXT];
		snprintf(text, sizeof(text), "site core refused the step: %s", gg_strerror(rc));
		hb_finish_step(b, j, rc < 0 ? rc : GG_ERR_SITE, text);
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
bool hb_failed_elsewhere(struct gg_host_backend *b, struct hb_job *j)
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
	hb_fail_step(b, j, code, "%s", why);
	return true;
}

/* Answers what can no longer run, then starts step j->seq once every rank
 * has announced it. */
void hb_job_advance(struct gg_host_backend *b, struct hb_job *j)
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
			while (c && (h = hb_req_head(c)) && ((j->broken && !held_for_outcome(j, h)) || h->seq < j->seq)) {
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
					hb_nccl_abort(b, j, code, text);
				j->ended_seq = GG_MAX(j->ended_seq, h->seq);
				hb_answer(b, c, code, "step %llu (tensor %u): %s", (unsigned long long)h->seq, h->tensor_id,
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
			struct hb_req *h = c ? hb_req_head(c) : NULL;
			if (!h || h->seq != j->seq)
				continue;
			if (!ref) {
				ref = h;
				ref_rank = r;
			} else if (!same_tensor(ref, h)) {
				hb_fail_step(b, j, GG_ERR_MISMATCH,
					     "ranks of site %s disagree: rank %u announced tensor %u (%llu %s) but rank "
					     "%u announced tensor %u (%llu %s)", b->site, ref_rank, ref->tensor_id,
					     (unsigned long long)ref->count, gg_dtype_name(ref->dtype), r, h->tensor_id,
					     (unsigned long long)h->count, gg_dtype_name(h->dtype));
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
			if (hb_failed_elsewhere(b, j))
				continue;
			return;
		}
		if (b->loop->now_us >= deadline) {
			/* Where the earlier steps waited for a site that is lost,
			 * that is the cause, as the sites that find it say. */
			char lost[TEXT];
			bool site = b->core_ops->lost_site && b->core_ops->lost_site(b->core, lost, sizeof(lost));
			hb_fail_step(b, j, site ? GG_ERR_SITE : GG_ERR_TIMEOUT,
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

struct hb_job *hb_job_find(struct gg_host_backend *b, const char *name)
{
	for (struct hb_job *j = b->jobs; j; j = j->next)
		if (!strcmp(j->name, name))
			return j;
	return NULL;
}
