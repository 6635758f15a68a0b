#include "node.h" /* first: it compiles on its own */
#include "node_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "gradgate.h"
#include "net_addr.h"
#include "resolver.h"
#include "units.h"

const char *gg_node_site_name(const struct gg_node *n, unsigned index)
{
	return index < n->sites ? n->names[index] : "?";
}

unsigned gg_node_self(const struct gg_node *n)
{
	return n->self;
}

unsigned gg_node_lanes(const struct gg_node *n)
{
	return n->nlanes;
}

struct gg_loop *gg_node_loop(struct gg_node *n)
{
	return &n->lanes[0].loop;
}

static uint64_t all_lanes(const struct gg_node *n)
{
	return n->nlanes >= 64 ? UINT64_MAX : ((uint64_t)1 << n->nlanes) - 1;
}

/* Posts a copy of `proto` to every lane not in `told` (by bit) and returns
 * the lanes told now or before. Mail a step cannot end without (its start
 * and end, a part's report and its end's answer) is posted again until it
 * goes: a step never waits for mail that memory ran out for. Losing other
 * mail costs a resend or a deadline, and is logged. */
static uint64_t post_lanes(struct gg_node *n, const struct mail *proto, uint64_t told)
{
	for (unsigned l = 0; l < n->nlanes; l++) {
		if (told & ((uint64_t)1 << l))
			continue;
		struct mail *m = mail_new(proto->base.type);
		if (!m) {
			gg_log(GG_LOG_ERROR, "out_of_memory", "what=\"a message to lane %u\"", l);
			continue;
		}
		*m = *proto;
		post(&n->lanes[l].inbox, m);
		told |= (uint64_t)1 << l;
	}
	return told;
}

static const char *const peer_log_events[PEER_LOGS] = { "abort_recorded",     "peer_job_ended", "rerun_refused",
							"job_forgotten",      "job_ended",      "early_data_dropped",
							"data_dropped",       "early_data_refused" };
static const enum gg_log_level peer_log_levels[PEER_LOGS] = { GG_LOG_INFO, GG_LOG_INFO, GG_LOG_WARN, GG_LOG_INFO,
							      GG_LOG_INFO, GG_LOG_WARN, GG_LOG_WARN, GG_LOG_WARN };

uint64_t gg_node_peer_logs_flush(const struct gg_node *n, peer_logs logs, uint64_t now_us)
{
	uint64_t next = UINT64_MAX;

	for (unsigned p = 0; p < n->sites; p++) {
		char about[GG_WIRE_NAME_MAX + 8] = "";
		if (p != n->self)
			snprintf(about, sizeof(about), "site=%s", n->names[p]);
		for (unsigned k = 0; k < PEER_LOGS; k++)
			next = GG_MIN(next,
				      gg_log_limit_flush(&logs[p][k], now_us, peer_log_levels[k], peer_log_events[k], about));
	}
	return next;
}


/* ---- the coordinator: jobs and steps -------------------------------------- */

static void send_to_peers(struct gg_node *n, int only, const uint8_t *bytes, ssize_t len, bool every_stream)
{
	struct mail m = { .base.type = M_SEND };

	if (len <= 0 || (size_t)len > sizeof(m.u.send.bytes))
		return;
	memcpy(m.u.send.bytes, bytes, (size_t)len);
	m.u.send.len = (size_t)len;
	m.u.send.every_stream = every_stream;
	for (unsigned p = 0; p < n->sites; p++) {
		if (p == n->self || (only >= 0 && p != (unsigned)only))
			continue;
		m.peer = p;
		post_lanes(n, &m, 0);
	}
}

_Static_assert(GG_WIRE_CODE_MAX == -GG_ERR_LIMIT && GG_WIRE_CODE_CLOSED == -GG_ERR_CLOSED &&
		       GG_WIRE_CODE_AGAIN == -GG_ERR_AGAIN,
	       "wire.h's codes are gradgate.h's negated");

/* A failure's code as the wire carries it: a gateway that shuts down is a
 * lost site to the others; a code no peer takes goes as a lost site too. */
static uint8_t wire_code(int code)
{
	return (uint8_t)(code == GG_ERR_CLOSED || code == GG_ERR_AGAIN || code >= 0 || -code > GG_WIRE_CODE_MAX
				 ? -GG_ERR_SITE
				 : -code);
}

/* ABORT of steps lo..hi with the code they failed with here, to one peer
 * or all (-1). */
static void send_abort(struct gg_node *n, int only, const char *job, uint64_t run, uint64_t lo, uint64_t hi,
		       int code, const char *reason)
{
	uint8_t buf[CTRL_MSG_MAX];

	send_to_peers(n, only, buf, gg_wire_encode_abort(buf, sizeof(buf), job, run, lo, hi, wire_code(code), reason),
		      false);
}

/* DONE for the job's step to peer `only` (every peer when -1), on every
 * ready stream: one cut after the message was queued must not lose it, and
 * a second copy changes nothing. */
static void send_done(struct gg_node *n, const struct job *j, int only)
{
	uint8_t buf[CTRL_MSG_MAX];

	send_to_peers(n, only, buf,
		      gg_wire_encode_done(buf, sizeof(buf), j->name, j->run, j->step->seq, &n->links[n->self], &j->plan),
		      true);
}

/* A site that holds the job's step's result and has waited a heartbeat
 * interval for the others' DONEs asks every peer whether it completed the
 * step (its DONE again, flagged), and again each interval after: with
 * three or more sites, a DONE that a link lost (one way, say) is so
 * replaced by the word of a site that held it, before this site would
 * give the silent one up and fail a step the others completed. With two,
 * the answer would go the way of the DONE it stands for. Returns when to
 * look again. */
static uint64_t ask_completed(struct gg_node *n, struct job *j, uint64_t now)
{
	const uint64_t every = n->cfg->transport.heartbeat_interval_us;
	uint64_t due = GG_MAX(j->has_result_us, j->asked_us) + every;
	uint8_t buf[CTRL_MSG_MAX];

	if (n->sites < 3)
		return UINT64_MAX;
	if (now < due)
		return due;
	send_to_peers(n, -1, buf,
		      gg_wire_encode_done_asking(buf, sizeof(buf), j->name, j->run, j->step->seq, &n->links[n->self],
						 &j->plan),
		      false);
	j->asked_us = now;
	return now + every;
}

/* Answers a peer's ask (ask_completed()) for step `seq` of the job, if it
 * completed here: the last step completed, or the one ending as
 * completed. */
static void answer_completed(struct gg_node *n, const struct job *j, unsigned peer, uint64_t seq)
{
	uint8_t buf[CTRL_MSG_MAX];
	const struct gg_wire_plan *plan;

	if (j->step && j->step->seq == seq && j->ending && !j->end_status)
		plan = &j->plan;
	else if (j->done_seq == seq)
		plan = &j->done_plan;
	else
		return;
	send_to_peers(n, (int)peer, buf,
		      gg_wire_encode_completed(buf, sizeof(buf), j->name, j->run, seq, &n->links[n->self], plan), false);
}

/* Every site said DONE for the job's step: a site told so by one that
 * completed it (its word, or its END) needs no DONE of its own from the
 * others. */
static void all_done(struct gg_node *n, struct job *j)
{
	for (unsigned p = 0; p < n->sites; p++)
		if (p != n->self)
			j->done_from |= 1u << p;
}

/* END of a job ended here, to peer `only` or all (-1). */
static void send_end(struct gg_node *n, int only, const struct ended_job *e)
{
	uint8_t buf[CTRL_MSG_MAX];
	const uint64_t age_ms = (gg_monotonic_us() - e->ended_us) / 1000;

	send_to_peers(n, only, buf,
		      gg_wire_encode_end(buf, sizeof(buf), e->name, e->run, e->last_done, e->last_step,
					 wire_code(e->code), e->reason, (uint32_t)GG_MIN(age_ms, UINT32_MAX)),
		      false);
}

/* Step seq failed here: it joins the run of failed steps kept for peers
 * that come back (ABORT), whose first step's code and reason this site's
 * END gives. */
static void remember_abort(struct gg_node *n, struct job *j, uint64_t seq, int code, const char *reason)
{
	j->failed_us = gg_node_loop(n)->now_us;
	if (j->failed_lo && seq >= j->failed_lo && seq <= j->failed_hi)
		return;
	if (j->failed_hi && seq == j->failed_hi + 1) {
		j->failed_hi = seq;
		return;
	}
	j->failed_lo = j->failed_hi = seq;
	j->failed_code = code < 0 ? code : GG_ERR_SITE;
	snprintf(j->failed_reason, sizeof(j->failed_reason), "%s", reason);
}

const double gg_node_step_bucket_s[GG_NODE_STEP_BUCKETS] = {
	0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300,
};

/* A step failed here: counted by its code, kept for the status, and
 * logged (step_failed), whichever site's cause failed it. */
static void note_failure(struct gg_node *n, const char *job, uint64_t seq, int code, const char *message)
{
	struct gg_node_failure *f = &n->failures[n->failures_total++ % FAILURES_KEPT];
	const char *text = message ? message : "";
	char safe[LOG_VALUE_MAX];
	struct timespec now;

	n->stats.steps_failed++;
	n->failures_by_code[code < 0 && -code < GG_NODE_CODES ? -code : 0]++;
	clock_gettime(CLOCK_REALTIME, &now);
	*f = (struct gg_node_failure){ .step = seq, .code = code, .at_us = gg_node_loop(n)->now_us,
				       .at_unix_ms = (uint64_t)now.tv_sec * 1000u + (uint64_t)now.tv_nsec / 1000000u };
	snprintf(f->job, sizeof(f->job), "%s", job);
	snprintf(f->message, sizeof(f->message), "%s", text);
	gg_log(GG_LOG_ERROR, "step_failed", "job=%s step=%llu reason=\"%s\"", job, (unsigned long long)seq,
	       gg_escape(safe, sizeof(safe), text, strlen(text)));
}

/* The step under way has its whole result here and has not failed (it
 * may be ending): this site's DONE of it stands. */
static bool done_here(const struct job *j)
{
	return j->step && j->has_result && (!j->ending || !j->end_status);
}

/* Tells the lanes not told yet that the job's step is over. */
static void post_end(struct gg_node *n, struct job *j)
{
	/* Frames of a failed step that peers never acknowledged are no longer
	 * worth sending. */
	struct mail m = { .base.type = M_END, .slot = (unsigned)(j - n->jobs), .seq = j->step->seq,
			  .forget = j->end_status != 0 };
	snprintf(m.u.job, sizeof(m.u.job), "%s", j->name);
	j->end_told = post_lanes(n, &m, j->end_told);
}

/* Step `seq` failed here with `status`. Whatever failed it, it joins the
 * run of failed steps that a returning peer hears of, and whose cause this
 * site's END names. */
static void step_failed_here(struct gg_node *n, struct job *j, uint64_t seq, int status, const char *message)
{
	remember_abort(n, j, seq, status, message);
	note_failure(n, j->name, seq, status, message);
	/* Algorithm auto: where a step failed, some sites may have completed
	 * it (a site cut off past the deadline) or a site may have forgotten
	 * the job: their plans may differ. Every site that fails a step drops
	 * its plan, and a step planned differently fails everywhere (a
	 * mismatch), so after at most one more failed step all go direct until
	 * the next completed step plans again. */
	j->using = (struct gg_wire_plan){ 0 };
	j->plan_told = false;
}

/* Ends the job's step: the lanes let go of their parts first (a part may
 * still be reading or writing the step's memory), then done is called. */
static void finish_step(struct gg_node *n, struct job *j, int status, const char *message)
{
	if (!j->step || j->ending)
		return;
	j->ending = true;
	j->ended = 0;
	j->end_status = status;
	snprintf(j->end_message, sizeof(j->end_message), "%s", message ? message : "");
	if (status) {
		step_failed_here(n, j, j->step->seq, status, message ? message : "");
	} else {
		n->stats.steps_done++;
		gg_plan_time_step(n, j);
		/* The plan for the steps after this one: every site that
		 * completes the step heard the first site's DONE. */
		if (j->plan.has_plan)
			j->using = j->plan;
	}
	j->end_told = 0;
	post_end(n, j);
}

static void step_ended(struct gg_node *n, struct job *j)
{
	struct gg_node_step *st = j->step;
	char message[GG_NODE_ERROR_MAX];
	int status = j->end_status;

	snprintf(message, sizeof(message), "%s", j->end_message);
	j->step = NULL;
	j->ending = false;
	j->active_us = gg_node_loop(n)->now_us;
	if (!status) {
		uint64_t us = j->active_us > j->submit_us ? j->active_us - j->submit_us : 0;
		unsigned b = 0;
		while (b < GG_NODE_STEP_BUCKETS && (double)us > gg_node_step_bucket_s[b] * 1e6)
			b++;
		n->step_buckets[b]++;
		n->step_us_sum += us;
		j->done_seq = st->seq;
		j->done_us = j->active_us;
		j->done_plan = j->plan;
		j->failed_lo = j->failed_hi = 0; /* every site is past them */
		st->algorithm = j->run_algo;
	}
	/* done() may submit the job's next step. */
	st->done(st->arg, st, status, status ? message : NULL);
}


static void fail_step_code(struct gg_node *n, struct job *j, int code, const char *fmt, ...) GG_PRINTF(4, 5);
static void fail_step_code(struct gg_node *n, struct job *j, int code, const char *fmt, ...)
{
	char msg[GG_NODE_ERROR_MAX];
	va_list ap;

	if (!j->step || j->ending)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	send_abort(n, -1, j->name, j->run, j->step->seq, j->step->seq, code, msg);
	finish_step(n, j, code, msg);
}

static void feedback_free(struct gg_node *n, struct feedback_slot *f)
{
	n->feedback_bytes -= f->cost;
#if HAVE_CUDA
	if (f->device)
		gg_feedback_fini_cuda(&f->gpu);
#endif
	gg_feedback_fini(&f->fb);
	free(f);
}

/* Frees feedback slot i (one on the GPU later, while GPU frees are held);
 * the last slot takes its place. */
static void feedback_drop(struct gg_node *n, unsigned i)
{
	struct feedback_slot *f = n->feedback[i];

	n->feedback[i] = n->feedback[--n->feedback_count];
	if (f->device && atomic_load(&n->gpu_frees_held)) {
		f->held_next = n->gpu_held;
		n->gpu_held = f;
		return;
	}
	feedback_free(n, f);
}

void gg_node_gpu_frees(struct gg_node *n, bool allowed)
{
	atomic_store_explicit(&n->gpu_frees_held, !allowed, memory_order_release);
	while (allowed && n->gpu_held) {
		struct feedback_slot *f = n->gpu_held;
		n->gpu_held = f->held_next;
		feedback_free(n, f);
	}
}

/* A run id for a job starting here: never 0, and each larger than the
 * one before, across restarts too (they start from the clock), so that a
 * peer tells a later run of a job from one that ended (run_is_later()). */
static uint64_t new_run(struct gg_node *n)
{
	return n->next_run++;
}

static struct name_runs *name_runs(struct gg_node *n, const char *job, bool create);
static void job_ended_at(struct gg_node *n, struct job *j, unsigned from, bool said, uint64_t last_done,
			 uint64_t last, int code, const char *failed, const char *gone);
static void restart_reason(const struct gg_node *n, unsigned peer, const char *job, uint64_t last, char *why,
			   size_t size);
static void ended_there(struct gg_node *n, struct job *j, unsigned from, const struct gg_wire_steps *end);
static void aborted_there(struct gg_node *n, struct job *j, unsigned from, const struct gg_wire_steps *abort);

/* Whether ranks of the job name are connected here (gg_node_job_opened()). */
static bool name_open(struct gg_node *n, const char *job)
{
	const struct name_runs *r = name_runs(n, job, false);

	return r && r->open;
}

/* The job's entry; made when `create` and missing, in a free slot or the
 * one of the job idle longest of those whose ranks are not here (made by
 * peers' words, or by steps of a core whose site tells it of no ranks):
 * the entry of a job whose ranks are connected holds its residuals and
 * plan, which they count on between steps. NULL when there is none. */
static struct job *find_job(struct gg_node *n, const char *name, bool create)
{
	struct job *free_slot = NULL;

	for (unsigned i = 0; i < MAX_JOBS; i++) {
		if (n->jobs[i].used && !strcmp(n->jobs[i].name, name))
			return &n->jobs[i];
		if (!n->jobs[i].used && !free_slot)
			free_slot = &n->jobs[i];
	}
	if (!create)
		return NULL;
	if (!free_slot) {
		for (unsigned i = 0; i < MAX_JOBS; i++)
			if (!n->jobs[i].step && (!free_slot || n->jobs[i].active_us < free_slot->active_us) &&
			    !name_open(n, n->jobs[i].name))
				free_slot = &n->jobs[i];
		if (!free_slot)
			return NULL;
		if (peer_log_now(n->logs, n->self, LOG_JOB_FORGOTTEN, gg_node_loop(n)->now_us))
			gg_log(GG_LOG_INFO, "job_forgotten", "job=%s last_step=%llu reason=\"its slot went to job %s\"",
			       free_slot->name, (unsigned long long)free_slot->last_seq, name);
		for (unsigned i = 0; i < n->feedback_count; i++)
			if (!strcmp(n->feedback[i]->job, free_slot->name))
				feedback_drop(n, i--);
	}
	/* A job of that name starts again here: what ended before is over. */
	for (unsigned e = 0; e < ENDS_KEPT; e++)
		if (!strcmp(n->ended[e].name, name))
			n->ended[e].name[0] = '\0';
	memset(free_slot, 0, sizeof(*free_slot));
	free_slot->run = new_run(n);
	free_slot->active_us = gg_node_loop(n)->now_us;
	free_slot->used = true;
	snprintf(free_slot->name, sizeof(free_slot->name), "%s", name);
	/* A site restarted while its run of the name went on, or its ranks
	 * of it went, before the job was here (on_peer_restart(), on_end()):
	 * it is over there. */
	struct name_runs *r = name_runs(n, name, false);
	if (!r)
		return free_slot;
	for (unsigned p = 0; p < n->sites; p++) {
		if (!(r->lost_by & (1u << p)))
			continue;
		char why[GG_NODE_ERROR_MAX];
		restart_reason(n, p, name, 0, why, sizeof(why));
		job_ended_at(n, free_slot, p, false, 0, UINT64_MAX, GG_ERR_SITE, why, why);
	}
	if (r->end_from)
		ended_there(n, free_slot, r->end_from - 1, &r->end);
	if (r->abort_from)
		aborted_there(n, free_slot, r->abort_from - 1, &r->abort);
	r->lost_by = 0;
	r->end_from = 0;
	r->abort_from = 0;
	return free_slot;
}

/* Tensors whose error feedback a gateway keeps at once, of all its jobs:
 * hundreds make a model's buckets; a rank that names a new tensor at each
 * step (each looked for, at every step, among those kept) stops here. */
#define FEEDBACK_TENSORS_MAX 65536u

/* What a tensor's error feedback holds: its residuals (a float32 per
 * element), on the host also the scratch of a chunk, and the slot. */
static uint64_t feedback_cost(const struct gg_node *n, uint64_t count, bool device)
{
	return count * sizeof(float) + (device ? 0 : GG_MIN(count, (uint64_t)n->chunk_elems) * sizeof(float)) +
	       sizeof(struct feedback_slot) + 64;
}

/* The error feedback of one tensor of a job, made on its first step, in
 * the memory the tensor is in (device: the gateway's GPU). Returns 0 with
 * *out, or a negative errno with err saying why. */
static int feedback_for(struct gg_node *n, const char *job, uint32_t tensor, uint64_t count, bool device,
			struct feedback_slot **out, char *err, size_t err_size)
{
	const uint64_t limit = n->cfg->limits.memory_bytes, cost = feedback_cost(n, count, device);

	for (unsigned i = 0; i < n->feedback_count; i++) {
		struct feedback_slot *f = n->feedback[i];
		if (f->tensor_id != tensor || strcmp(f->job, job))
			continue;
		if (f->elems == count && f->device == device) {
			*out = f;
			return 0;
		}
		feedback_drop(n, i); /* the tensor changed size or memory: start afresh */
		break;
	}
	if (n->feedback_count >= n->feedback_max)
		return gg_errf(err, err_size, -ENOSPC,
			       "error feedback for tensor %u of job '%s' does not fit: the gateway keeps it for %u "
			       "tensors at most, and holds it for as many (each job's until it ends)",
			       tensor, job, n->feedback_max);
	if (cost > limit - GG_MIN(limit, n->feedback_bytes)) {
		char a[32], b[32], held[96] = "";
		unsigned nheld = 0;
		for (const struct feedback_slot *f = n->gpu_held; f; f = f->held_next)
			nheld++;
		if (nheld)
			snprintf(held, sizeof(held), " (%u of them given up, on the GPU, freed once no NCCL call of the "
				 "gateway's runs)", nheld);
		return gg_errf(err, err_size, -ENOSPC,
			       "error feedback for tensor %u (%llu elements) does not fit: the error feedback of %u "
			       "tensor%s%s takes %s of [limits] memory = %s; raise it, or set [compression] "
			       "error_feedback = false",
			       tensor, (unsigned long long)count, n->feedback_count + nheld,
			       n->feedback_count + nheld == 1 ? "" : "s", held,
			       gg_format_size(n->feedback_bytes, a, sizeof(a)), gg_format_size(limit, b, sizeof(b)));
	}
	if (n->feedback_count == n->feedback_cap) {
		unsigned cap = n->feedback_cap ? 2 * n->feedback_cap : 16;
		struct feedback_slot **grown = realloc(n->feedback, cap * sizeof(*grown));
		if (!grown)
			return gg_errf(err, err_size, -ENOMEM, "no memory for the error feedback of tensor %u", tensor);
		n->feedback = grown;
		n->feedback_cap = cap;
	}
	struct feedback_slot *f = calloc(1, sizeof(*f));
	if (!f)
		return gg_errf(err, err_size, -ENOMEM, "no memory for the error feedback of tensor %u", tensor);
#if HAVE_CUDA
	if (device) {
		char why[GG_NODE_ERROR_MAX / 2];
		int rc = gg_feedback_init_cuda(&f->gpu, count, why, sizeof(why));
		if (rc) {
			free(f);
			return gg_errf(err, err_size, rc, "the error feedback of tensor %u (%llu elements) on the GPU: %s",
				       tensor, (unsigned long long)count, why);
		}
	}
#endif
	if (!device && gg_feedback_init(&f->fb, count, GG_MIN(count, (uint64_t)n->chunk_elems))) {
		free(f);
		return gg_errf(err, err_size, -ENOMEM, "no memory for the error feedback of tensor %u (%llu elements)",
			       tensor, (unsigned long long)count);
	}
	f->elems = count;
	f->cost = cost;
	f->device = device;
	f->tensor_id = tensor;
	snprintf(f->job, sizeof(f->job), "%s", job);
	n->feedback[n->feedback_count++] = f;
	n->feedback_bytes += cost;
	*out = f;
	return 0;
}

/* Completes the step once its result is whole here and every other site
 * said DONE: a step completes at every site or, when a site fails it
 * first (ABORT), at none. */
static void maybe_complete(struct gg_node *n, struct job *j)
{
	if (!j->step || j->ending || !j->has_result)
		return;
	for (unsigned p = 0; p < n->sites; p++)
		if (p != n->self && !(j->done_from & (1u << p)))
			return;
	finish_step(n, j, 0, NULL);
}

/* How long this site stood still (a frozen process, a suspended host)
 * since the coordinator's last turn ended, when that is over GG_STALL_US;
 * else 0. That is the time passed (CLOCK_BOOTTIME, which counts a
 * suspended host's sleep) less what the coordinator's thread worked
 * meanwhile: a long turn is not standing still, a wait for the loop is at
 * most a tick. Called on the coordinator's thread. */
static uint64_t stood_still_now(const struct gg_node *n)
{
	if (!n->coord_done_boot_us)
		return 0;
	uint64_t passed = gg_boottime_us() - n->coord_done_boot_us, worked = gg_thread_cpu_us() - n->coord_done_cpu_us;
	uint64_t still = passed > worked ? passed - worked : 0;

	return still > GG_STALL_US(n->cfg->transport.heartbeat_timeout_us) ? still : 0;
}

/* How long this site stood still since the step started here (this turn
 * included: its timers, which note it, run after the mail); 0 when it
 * did not. */
static uint64_t stood_still_in_step(const struct gg_node *n, const struct job *j)
{
	uint64_t still = stood_still_now(n);

	return still ? still : n->stall_end_us > j->submit_us ? n->stall_us : 0;
}

/* The others may have taken a site that stood still for lost and failed
 * the step meanwhile: a DONE now, or a result completed on DONEs that
 * waited for it to run again, could split the sites. Failed instead, the
 * step fails everywhere: no site can complete it without this site's
 * DONE. */
static void fail_stood_still(struct gg_node *n, struct job *j, uint64_t still)
{
	char hb[32];

	fail_step_code(n, j, GG_ERR_SITE, "step %llu of job '%s': site %s stood still for %.1f s "
		       "(heartbeat_timeout %s) before it had the result: the other sites may have "
		       "taken it for lost and failed the step", (unsigned long long)j->step->seq,
		       j->name, n->names[n->self], (double)still / 1e6,
		       gg_format_duration(n->cfg->transport.heartbeat_timeout_us, hb, sizeof(hb)));
}

static void step_has_result(struct gg_node *n, struct job *j)
{
	if (n->test_freeze_at_result)
		return;
	if (!j->has_result) {
		uint64_t still = stood_still_in_step(n, j);
		if (still) {
			fail_stood_still(n, j, still);
			return;
		}
		j->has_result = true;
		j->has_result_us = gg_node_loop(n)->now_us;
		if (n->cfg->allreduce.algorithm == GG_ALLREDUCE_AUTO) {
			gg_plan_measure_links(n);
			if (n->self == 0)
				gg_plan_make(n, j);
		}
		for (unsigned p = 0; p < n->sites; p++)
			if (p != n->self && atomic_load(&n->ready[p]))
				j->done_may_reach |= 1u << p;
		if (n->test_drop_done) {
			for (unsigned p = 0; p < n->sites; p++)
				if (p != n->self && p + 1 != n->test_drop_done)
					send_done(n, j, (int)p);
			n->test_drop_done = 0;
		} else {
			send_done(n, j, -1);
		}
	}
	maybe_complete(n, j);
}

/* The lanes acknowledge and let go what peers sent of step `seq` of `job`,
 * which will not run here. */
static void forget_step(struct gg_node *n, const char *job, uint64_t seq)
{
	struct mail f = { .base.type = M_FORGET, .seq = seq };

	snprintf(f.u.job, sizeof(f.u.job), "%s", job);
	post_lanes(n, &f, 0);
}

/* Step 1 of this run was refused, for `why`: its ranks number their
 * steps on, so none of them can run, and each fails at once rather than
 * at its deadline, waiting for sites that run the old run. */
static void run_refused(struct job *j, const char *why)
{
	if (j->refused)
		return;
	j->refused = true;
	/* Cut short where the reason is long: its start says the most. */
	(void)gg_errf(j->refused_reason, sizeof(j->refused_reason), 0, "step 1 of this run was refused: %s", why);
}

/* Whether step `seq` of the job, not started here, failed already at
 * another site, which said so (ABORT) or whose ranks of the job are gone
 * (END): its enum gg_errc code and *reason; 0 when not. */
static int failed_elsewhere(const struct job *j, uint64_t seq, const char **reason)
{
	if (j->refused && seq > 1) {
		*reason = j->refused_reason;
		return GG_ERR_REFUSED;
	}
	/* Open-ended ranges last: a site's END, which may follow such an
	 * ABORT at once (its last ranks left one after the other), says more. */
	for (int open_ended = 0; open_ended < 2; open_ended++) {
		for (unsigned a = 0; a < ABORTS_KEPT; a++) {
			if (j->aborted[a].lo && j->aborted[a].lo <= seq && seq <= j->aborted[a].hi &&
			    (j->aborted[a].hi == STEPS_ON) == open_ended) {
				*reason = j->aborted[a].reason;
				return j->aborted[a].code;
			}
		}
		if (!open_ended && j->ended_by && seq > j->ended_done) {
			*reason = seq <= j->ended_last ? j->ended_reason : j->end_reason;
			return seq <= j->ended_last ? j->ended_code : GG_ERR_RANK;
		}
	}
	return 0;
}

int gg_node_fail_unstarted(struct gg_node *n, const char *job, uint64_t seq, char *reason, size_t reason_size)
{
	struct job *j = find_job(n, job, false);
	const char *why;
	int code;

	/* Not here yet, but over at a site that restarted or whose ranks of
	 * it went: made, it is ended. */
	const struct name_runs *r = j ? NULL : name_runs(n, job, false);
	if (r && (r->lost_by || r->end_from || r->abort_from))
		j = find_job(n, job, true);
	if (!j || j->step || seq <= j->last_seq || !(code = failed_elsewhere(j, seq, &why)))
		return 0;
	snprintf(reason, reason_size, "%s", why);
	/* As gg_node_submit() would have it; and what the lanes hold of it
	 * from peers that started it is acknowledged and let go. */
	j->last_seq = seq;
	j->active_us = gg_node_loop(n)->now_us;
	step_failed_here(n, j, seq, code, reason);
	forget_step(n, j->name, seq);
	return code;
}

/* A new run of a name whose run ended here: a peer that still runs the
 * old one refuses it once the new run's step-1 frames reach it
 * (rerun_seen()), but by ring only the next site gets this site's, and
 * only when the shard this site starts has elements (under 32 elements a
 * site, shards may be empty): it sends nothing else before that site's
 * frames come. A peer this site sends none to, whose run that took part in
 * the one that ended here is not known over there (no END from it), is
 * returned (-1: none), so that the step is refused here. */
static int old_run_unheard(struct gg_node *n, const struct job *j, enum gg_allreduce_algo algo, uint64_t count,
			   uint32_t chunk)
{
	const struct name_runs *r = name_runs(n, j->name, false);

	if (!r || !r->ended_here || algo != GG_ALLREDUCE_RING)
		return -1;
	const struct gg_ar_config ring = { .sites = n->sites, .self = n->self, .algo = GG_ALLREDUCE_RING,
					   .count = count, .chunk_elems = chunk };
	const struct gg_ar_chunk_id first = { GG_AR_SCATTER, (uint8_t)gg_ar_ring_start(n->self, n->sites), 0 };
	uint64_t offset, elems;
	const unsigned reached = gg_ar_chunk_range(&ring, &first, &offset, &elems) ? gg_ar_ring_next(n->self, n->sites)
										   : n->self;
	for (unsigned p = 0; p < n->sites; p++)
		if (p != n->self && p != reached && r->left[p] && !run_within(r->left[p], r->over[p]))
			return (int)p;
	return -1;
}

int gg_node_submit(struct gg_node *n, struct gg_node_step *st, char *err, size_t err_size)
{
	struct job *j;

	if (n->shutting_down)
		return gg_errf(err, err_size, -ESHUTDOWN, "the gateway is shutting down");
	if (!st->job[0] || st->count == 0)
		return gg_errf(err, err_size, -EINVAL, "a step needs a job name and at least one element");
	if (st->device && !HAVE_CUDA)
		return gg_errf(err, err_size, -EINVAL, "the gateway was built without CUDA: a step in GPU memory");
	/* max_message bounds the tensor as the ranks hold it (gradgate.h). */
	uint64_t esize = st->dtype == GG_WIRE_BF16 ? 2 : 4;
	if (st->count > n->cfg->limits.max_message_bytes / esize)
		return gg_errf(err, err_size, -E2BIG, "%llu elements of %llu bytes exceed [limits] max_message (%llu bytes)",
			       (unsigned long long)st->count, (unsigned long long)esize,
			       (unsigned long long)n->cfg->limits.max_message_bytes);
	if ((st->count + n->chunk_elems - 1) / n->chunk_elems > UINT32_MAX)
		return gg_errf(err, err_size, -EINVAL, "%llu elements make too many chunks for one step",
			       (unsigned long long)st->count);
	j = find_job(n, st->job, true);
	if (!j)
		return gg_errf(err, err_size, -ENOSPC,
			       "too many jobs (at most %d): each has ranks connected here or a step in progress",
			       MAX_JOBS);
	if (j->step) {
		gg_errf(err, err_size, -EINVAL, "job '%s' already has step %llu in progress", j->name,
		     (unsigned long long)j->step->seq);
		return -EBUSY;
	}
	if (st->seq <= j->last_seq)
		return gg_errf(err, err_size, -EINVAL,
			       "job '%s': step %llu comes after step %llu (a job name is one training run; "
			       "start a new run under a new job name)", j->name,
			    (unsigned long long)st->seq, (unsigned long long)j->last_seq);

	const enum gg_allreduce_algo algo = gg_plan_step_algo(n, j, st->count);
	const uint32_t chunk = gg_plan_step_chunk(n, algo, st->count);
	struct gg_wire_step ws = { .run = j->run, .step = st->seq, .count = st->count, .tensor_id = st->tensor_id,
				   .dtype = st->dtype };
	snprintf(ws.job, sizeof(ws.job), "%s", st->job);
	ws.fingerprint = gg_node_fingerprint(n->cfg, &ws, (uint8_t)algo, chunk);
	struct feedback_slot *fb = NULL;
	if (n->cfg->compression.error_feedback && gg_codec_is_lossy(n->cfg->compression.codec)) {
		/* Its message does not say "step N of job J": what the ranks read
		 * names them, and the remedy must fit in their message. */
		int rc = feedback_for(n, st->job, st->tensor_id, st->count, st->device, &fb, err, err_size);
		if (rc)
			return rc;
	}
	gg_plan_note_algo(n, j, st, algo, chunk);
	j->run_chunk = chunk;
	const uint64_t now = gg_node_loop(n)->now_us;
	j->step = st;
	j->has_result = false;
	j->done_may_reach = 0;
	j->plan = (struct gg_wire_plan){ 0 };
	j->parts_done = 0;
	j->done_from = 0;
	j->asked_us = 0;
	j->wstep = ws;
	j->last_seq = st->seq;
	j->active_us = now;
	j->submit_us = now;
	j->deadline_us = now + n->cfg->transport.step_timeout_us;
	j->timeout_us = n->cfg->transport.step_timeout_us;
	if (st->deadline_us && st->deadline_us < j->deadline_us) {
		j->deadline_us = st->deadline_us;
		j->timeout_us = st->timeout_us ? st->timeout_us : st->deadline_us - now;
	}
	const char *reason;
	int code = failed_elsewhere(j, st->seq, &reason);
	if (code) {
		finish_step(n, j, code, reason);
		return 0;
	}
	int old = st->seq == 1 ? old_run_unheard(n, j, algo, st->count, chunk) : -1;
	if (old >= 0) {
		char why[GG_NODE_ERROR_MAX];
		/* Short, the advice before the detail: with the ranks' prefix it
		 * fits their 256 bytes where the job's and both sites' names
		 * together take up to about 80 characters. */
		snprintf(why, sizeof(why), "a job name is one training run, and site %s still runs the old one (as "
			 "far as site %s heard): use a new name, or wait until its ranks are all gone", n->names[old],
			 n->names[n->self]);
		fail_step_code(n, j, GG_ERR_REFUSED, "step 1 of job '%s': %s", j->name, why);
		run_refused(j, why);
		return 0;
	}
	struct mail m = { .base.type = M_START, .slot = (unsigned)(j - n->jobs), .seq = st->seq,
			  .u.start = { .wstep = ws, .input = st->input, .result = st->result, .device = st->device,
				       .feedback = fb, .algo = algo,
				       .chunk_elems = chunk, .deadline_us = j->deadline_us, .timeout_us = j->timeout_us,
				       .gather = st->gather, .deliver = st->deliver, .arg = st->arg } };
	/* The peers' runs over, or that took part in a run of the name that
	 * ended here: a frame of theirs that comes late is of no step here. */
	const struct name_runs *r = name_runs(n, j->name, false);
	for (unsigned p = 0; r && p < n->sites; p++) {
		m.runs[p] = r->over[p];
		run_raise(&m.runs[p], r->left[p]);
		if (st->seq == 1 && r->ended_here && !m.runs[p] && p != n->self)
			m.u.start.guess |= 1u << p;
	}
	/* A lane that never starts its part would leave the step without a
	 * deadline: without memory for every start, the step fails now. */
	if (post_lanes(n, &m, 0) != all_lanes(n))
		fail_step_code(n, j, GG_ERR_NOMEM, "step %llu of job '%s': the gateway of site %s is out of memory",
			       (unsigned long long)st->seq, j->name, n->names[n->self]);
	return 0;
}

static struct job *job_of(struct gg_node *n, unsigned slot, uint64_t seq)
{
	struct job *j = slot < MAX_JOBS ? &n->jobs[slot] : NULL;

	return j && j->used && j->step && j->step->seq == seq ? j : NULL;
}

/* True when job `name` ended here recently (its END is kept for peers
 * that come back). */
static bool ended_here(const struct gg_node *n, const char *name)
{
	for (unsigned e = 0; e < ENDS_KEPT; e++)
		if (n->ended[e].name[0] && !strcmp(n->ended[e].name, name))
			return true;
	return false;
}

/* How dear a record of name_runs is to keep: free, of a name with no
 * ranks here, of one whose ranks are here. */
static int name_runs_worth(const struct name_runs *e)
{
	return !e->job[0] ? 0 : e->open ? 2 : 1;
}

/* The coordinator's record of a job name's runs; made when `create`,
 * taking the free entry, or the one used longest ago of the names with no
 * ranks here (never one of a name with ranks here: there is room for all
 * of those besides NAME_RUNS_KEPT others). */
static struct name_runs *name_runs(struct gg_node *n, const char *job, bool create)
{
	struct name_runs *r = NULL;

	for (unsigned i = 0; i < n->name_runs_cap; i++) {
		struct name_runs *e = &n->name_runs[i];
		if (e->job[0] && !strcmp(e->job, job)) {
			e->used_us = gg_node_loop(n)->now_us;
			return e;
		}
		if (!r || name_runs_worth(e) < name_runs_worth(r) ||
		    (name_runs_worth(e) == name_runs_worth(r) && e->used_us < r->used_us))
			r = e;
	}
	if (!create || r->open)
		return NULL;
	memset(r, 0, sizeof(*r));
	snprintf(r->job, sizeof(r->job), "%s", job);
	r->used_us = gg_node_loop(n)->now_us;
	return r;
}

/* Peer `peer` spoke of `job` in its run `run` (a DONE, ABORT or END, or its
 * frames, as a lane saw them): a site starts a run of a name only once its
 * run before ended, so the runs before this one are over there. */
static void peer_run_heard(struct gg_node *n, const char *job, unsigned peer, uint64_t run)
{
	struct name_runs *r = name_runs(n, job, true);

	if (!r)
		return;
	run_raise(&r->seen[peer], run);
	run_raise(&r->over[peer], run - 1);
}

/* The name's ranks here are gone, or come: what was kept of the peers'
 * runs that ended meanwhile is of no job here. */
static void name_set_open(struct gg_node *n, const char *job, bool open)
{
	struct name_runs *r = name_runs(n, job, open);

	if (r) {
		if (open && !r->open)
			r->opened_us = gg_monotonic_us();
		r->open = open;
		r->lost_by = 0;
		r->end_from = 0;
		r->abort_from = 0;
	}
}

void gg_node_job_opened(struct gg_node *n, const char *job)
{
	name_set_open(n, job, true);
}

/* Whether a word of run `run` of `job` from `peer` comes after that run is
 * over here: a run here must not take an old run's DONE or END for its
 * own, nor an ABORT once the old run ended there (its END said how its
 * steps ended). An ABORT of a peer's run still going there passes, though
 * that run's part in a run here ended: it may refuse a new run here
 * (rerun_seen()). */
static bool peer_run_stale(struct gg_node *n, const char *job, unsigned peer, uint64_t run, bool abort)
{
	const struct name_runs *r = name_runs(n, job, false);

	return r && (run_within(run, r->over[peer]) || (!abort && run_within(run, r->left[peer])));
}

/* Peer `peer` restarted: its new instance's runs count on from its own
 * clock, and what was known of the old one's says nothing of them. */
static void forget_peer_runs(struct gg_node *n, unsigned peer)
{
	for (unsigned i = 0; i < n->name_runs_cap; i++)
		n->name_runs[i].seen[peer] = n->name_runs[i].over[peer] = n->name_runs[i].left[peer] = 0;
	struct mail f = { .base.type = M_PEER_RESET, .peer = peer };
	post_lanes(n, &f, 0);
}

static void on_abort(struct gg_node *n, unsigned from, const struct gg_wire_msg *m)
{
	struct job *j = find_job(n, m->u.abort.job, false);

	/* A run over at the peer said how its steps ended in its END. An
	 * open-ended range of a peer's run that took part in a run of the
	 * name that ended here is of none here either (a new run here must
	 * not take it for its own). */
	if (peer_run_stale(n, m->u.abort.job, from, m->u.abort.run, m->u.abort.last != STEPS_ON))
		return;
	/* A job over here stays over: recording the abort would make it anew
	 * and drop the END that a peer cut off while it ended still needs.
	 * But where new ranks of the name are connected, yet to announce
	 * their first step, a refusal of step 1 is of the new run they take
	 * part in (a site still runs the old one): kept for their job while
	 * they are connected, which fails its step 1 when it is made. An
	 * old run's ABORTs, sent again once a stream came back, are not. */
	if (!j && ended_here(n, m->u.abort.job)) {
		struct name_runs *r = name_runs(n, m->u.abort.job, false);
		if (r && r->open && m->u.abort.first == 1 && -(int)m->u.abort.code == GG_ERR_REFUSED) {
			r->abort_from = from + 1;
			r->abort = m->u.abort;
			run_raise(&r->seen[from], m->u.abort.run);
		}
		return;
	}
	/* A site's steps from one on (gg_node_abort_from()) fail the steps
	 * that wait for it here; with none here, its END says the rest. */
	if (!j && m->u.abort.last == STEPS_ON)
		return;
	if (!j && !(j = find_job(n, m->u.abort.job, true)))
		return;
	aborted_there(n, j, from, &m->u.abort);
}

/* `reason` past a leading "step LO of job 'JOB': ", which a site's own
 * message of the step starts with and the message made of it here names
 * already. */
static const char *reason_past_step(const char *reason, uint64_t lo, const char *job)
{
	char head[GG_NODE_ERROR_MAX];
	int len = snprintf(head, sizeof(head), "step %llu of job '%s': ", (unsigned long long)lo, job);

	if (len > 0 && (size_t)len < sizeof(head) && strncmp(reason, head, (size_t)len) == 0)
		return reason + len;
	return reason;
}

/* Site `from`'s ABORT (`abort`) of steps of job j. */
static void aborted_there(struct gg_node *n, struct job *j, unsigned from, const struct gg_wire_steps *abort)
{
	const char *site = n->names[from];
	const uint64_t lo = abort->first, hi = abort->last;
	const char *reason = reason_past_step(abort->reason, lo, j->name);
	char msg[GG_NODE_ERROR_MAX];

	peer_run_heard(n, j->name, from, abort->run);
	if (lo == hi)
		snprintf(msg, sizeof(msg), "site %s aborted step %llu of job '%s': %s", site, (unsigned long long)lo,
			 j->name, reason);
	else if (hi == STEPS_ON)
		snprintf(msg, sizeof(msg), "site %s aborted job '%s' from step %llu on: %s", site, j->name,
			 (unsigned long long)lo, reason);
	else
		snprintf(msg, sizeof(msg), "site %s aborted steps %llu to %llu of job '%s': %s", site,
			 (unsigned long long)lo, (unsigned long long)hi, j->name, reason);
	/* A refusal of step 1 is of the new run, where the job here is one
	 * whose step 1 is to come or under way: the sites that run the old
	 * one, whose step 1 ended, hear it too. */
	const bool first_step = !j->last_seq || (j->step && j->step->seq == 1);
	if (j->step && !j->ending && lo <= j->step->seq && j->step->seq <= hi)
		finish_step(n, j, -(int)abort->code, msg);
	if (lo == 1 && -(int)abort->code == GG_ERR_REFUSED && first_step)
		run_refused(j, reason);
	/* Steps of the run that have not started here fail when they do. The
	 * frames the lanes hold for them would pin the peer's window for
	 * good: they go now. */
	uint64_t from_seq = GG_MAX(lo, j->last_seq + 1);
	if (from_seq > hi)
		return;
	unsigned a = 0;
	for (unsigned k = 0; k < ABORTS_KEPT; k++) {
		if (j->aborted[k].lo && j->aborted[k].lo <= from_seq && j->aborted[k].hi >= hi)
			return; /* a copy (each lane sends it), or within a range that fails them already */
		if (j->aborted[k].lo < j->aborted[a].lo)
			a = k;
	}
	j->aborted[a].lo = from_seq;
	j->aborted[a].hi = hi;
	j->aborted[a].code = -(int)abort->code;
	snprintf(j->aborted[a].reason, sizeof(j->aborted[a].reason), "%s", msg);
	for (uint64_t seq = from_seq; seq <= hi && seq < from_seq + 64; seq++)
		forget_step(n, j->name, seq);
	char safe[LOG_VALUE_MAX];
	if (peer_log_now(n->logs, from, LOG_ABORT_RECORDED, gg_node_loop(n)->now_us)) {
		char last[24] = "open"; /* an open-ended range: every later step */
		if (hi != STEPS_ON)
			snprintf(last, sizeof(last), "%llu", (unsigned long long)hi);
		gg_log(GG_LOG_INFO, "abort_recorded", "job=%s step=%llu last_step=%s reason=\"%s\"", j->name,
		       (unsigned long long)from_seq, last, gg_escape(safe, sizeof(safe), msg, strlen(msg)));
	}
}

/* The job is over at site `from`: steps up to last_done completed there,
 * so they complete here too; those after it up to `last` failed there with
 * `code` and `failed`; later ones cannot complete (GG_ERR_RANK, `gone`).
 * `said`: the site said so (its END), rather than this site judging so
 * (a restart, with this site's own progress as last_done). */
static void job_ended_at(struct gg_node *n, struct job *j, unsigned from, bool said, uint64_t last_done,
			 uint64_t last, int code, const char *failed, const char *gone)
{
	/* By its END it completed the step in progress here, so it held
	 * every site's DONE (its own may be lost, or not sent again once it
	 * forgot the job). A restarted site's old gateway is gone for good:
	 * its DONE is taken as given, but no other site's (on_peer_restart()). */
	if (j->step && !j->ending && j->step->seq <= last_done) {
		if (said)
			all_done(n, j);
		else
			j->done_from |= 1u << from;
		maybe_complete(n, j);
	}
	/* A second END from a site whose run ended there already, with fewer
	 * steps done (copies of one END say the same): a new run of the name
	 * there ended, which this site refused (rerun_seen). How the old run
	 * ended there stays as its own END said, and a next new run there is
	 * refused again. */
	if ((j->ended_by & (1u << from)) && last_done < j->ended_done) {
		j->rerun_refused = false;
		return;
	}
	if (j->ended_by && last_done >= j->ended_done) {
		/* A copy, or a site that ended later than one before: how the
		 * steps ended stays, but its run is over there too, so that
		 * its step 1 of a new run is refused (rerun_seen()) whichever
		 * site's END came first. */
		j->ended_by |= 1u << from;
		return;
	}
	j->ended_by |= 1u << from;
	j->ended_done = last_done;
	j->ended_last = GG_MAX(last, last_done);
	j->ended_code = code;
	snprintf(j->ended_reason, sizeof(j->ended_reason), "%s", failed);
	snprintf(j->end_reason, sizeof(j->end_reason), "%s", gone);
	if (!j->step || j->ending || j->step->seq <= j->ended_done)
		return;
	if (j->step->seq <= j->ended_last)
		fail_step_code(n, j, j->ended_code, "step %llu of job '%s': %s", (unsigned long long)j->step->seq,
			       j->name, j->ended_reason);
	else
		fail_step_code(n, j, GG_ERR_RANK, "step %llu of job '%s': %s", (unsigned long long)j->step->seq, j->name,
			       j->end_reason);
}

/* END: the job is over at site `from`, its ranks there are gone. */
static void on_end(struct gg_node *n, unsigned from, const struct gg_wire_msg *m)
{
	/* A job unknown here has no step to fail: its ranks here are gone
	 * (and this site forgot it), not come yet, or yet to announce their
	 * first step. */
	struct job *j = find_job(n, m->u.end.job, false);

	/* An END of a run that is over here already (its END came, or this
	 * site's run it took part in ended) says nothing of the run here now,
	 * which may be a new one: an END sent again once a stream came back
	 * must not end it, nor stand for its DONE. */
	const bool stale = peer_run_stale(n, m->u.end.job, from, m->u.end.run, false);
	struct name_runs *r = name_runs(n, m->u.end.job, true);
	/* Nor may an END of a run never heard of here that ended before this
	 * site's ranks of the name came (by its age, which leaves out its
	 * time on the way, so it is never taken for older than it is): one
	 * sent again once a stream came back, of the run before theirs. */
	const bool before_ranks =
		r && r->open && !run_within(m->u.end.run, r->seen[from]) &&
		m->u.end.age_ms > (gg_monotonic_us() - r->opened_us) / 1000 + 1;
	if (r) {
		run_raise(&r->seen[from], m->u.end.run);
		run_raise(&r->over[from], m->u.end.run);
	}
	if (!stale && peer_log_now(n->logs, from, LOG_PEER_JOB_ENDED, gg_node_loop(n)->now_us))
		gg_log(GG_LOG_INFO, "peer_job_ended", "site=%s job=%s steps_done=%llu last_step=%llu age_ms=%u here=%s",
		       n->names[from], m->u.end.job, (unsigned long long)m->u.end.first,
		       (unsigned long long)m->u.end.last, m->u.end.age_ms,
		       before_ranks ? "later_ranks" : j ? "running" : r && r->open ? "ranks" : "none");
	if ((stale || before_ranks) && j)
		return;
	if (!j) {
		/* None of its steps can complete anywhere now: the frames peers
		 * sent ahead for it are let go (and acknowledged). */
		struct mail f = { .base.type = M_FORGET_JOB, .sites = 1u << from, .run = m->u.end.run };
		snprintf(f.u.job, sizeof(f.u.job), "%s", m->u.end.job);
		post_lanes(n, &f, 0);
		/* Its ranks here, connected but with no step announced, would
		 * wait out their first step's deadline: kept, their step fails
		 * at once. The END with the fewest steps done says most. */
		if (r && r->open && !stale && !before_ranks && (!r->end_from || m->u.end.first < r->end.first)) {
			r->end_from = from + 1;
			r->end = m->u.end;
		}
		return;
	}
	ended_there(n, j, from, &m->u.end);
}

/* Site `from`'s END of the job (`end`), as job_ended_at() takes it. */
static void ended_there(struct gg_node *n, struct job *j, unsigned from, const struct gg_wire_steps *end)
{
	char failed[GG_NODE_ERROR_MAX], gone[GG_NODE_ERROR_MAX];

	snprintf(failed, sizeof(failed), "site %s failed it and ended job '%s': %s", n->names[from], j->name,
		 end->reason);
	/* An END with no failed steps says why the ranks went (a gateway
	 * shutting down, a rank that left), or just that they did. */
	const char *why = -(int)end->code == GG_ERR_RANK ? end->reason : "its ranks there are gone";
	if (end->last)
		snprintf(gone, sizeof(gone), "site %s ended job '%s' after step %llu: %s", n->names[from], j->name,
			 (unsigned long long)end->last, why);
	else
		snprintf(gone, sizeof(gone), "site %s ended job '%s' before its first step: %s", n->names[from],
			 j->name, why);
	job_ended_at(n, j, from, true, end->first, end->last, -(int)end->code, failed, gone);
}

/* A gateway's instance id is drawn at random at its start, so one that
 * comes back after another replaced it is of a gateway still running, or
 * a dead one's word come late: a stream whose HELLO a lane read late
 * (through the acceptor, after the new instance's came on a stream of its
 * own, and until its own stream of the new one is back), or one lane's
 * report of a restart coming after another's of the next one. Those are
 * a few returns around a restart. Two gateways that run as one site at
 * once (a second started with its certificate and key) take each other's
 * streams for as long as both run: TWIN_RETURNS returns or more, each
 * within TWIN_GAP_US of the one before, over TWIN_SPAN_US or more. Each
 * switch reads as a restart: said as what it is, in the log and in the
 * steps' errors, for TWIN_US after it was last seen. */
#define TWIN_US 60000000u
#define TWIN_RETURNS 4u
#define TWIN_GAP_US 10000000u
#define TWIN_SPAN_US 2000000u
#define TWIN_LOG_US 10000000u /* site_claimed_twice at most this often */
/* The cause, with the site's name, as the log and the steps' errors say it. */
#define TWIN_CAUSE "two gateways run as site %s at once, each taking the other's streams"

static bool site_twinned(const struct gg_node *n, unsigned peer)
{
	return n->twin_us[peer] && gg_monotonic_us() - n->twin_us[peer] < TWIN_US;
}

static void peer_instance_changed(struct gg_node *n, unsigned peer, uint64_t id)
{
	const uint64_t now = gg_monotonic_us(), old = n->instance_id[peer];
	uint64_t *r = n->replaced[peer];

	n->instance_id[peer] = id;
	if (!old)
		return;
	if (r[0] != old && r[1] != old) {
		r[1] = r[0];
		r[0] = old;
	}
	if (r[0] != id && r[1] != id)
		return;
	if (!n->returns[peer] || now - n->return_last_us[peer] > TWIN_GAP_US) {
		n->returns[peer] = 0;
		n->return_first_us[peer] = now;
	}
	n->returns[peer]++;
	n->return_last_us[peer] = now;
	if (n->returns[peer] >= TWIN_RETURNS && now - n->return_first_us[peer] >= TWIN_SPAN_US) {
		n->twin_us[peer] = now ? now : 1;
		if (!n->twin_logged_us[peer] || now - n->twin_logged_us[peer] >= TWIN_LOG_US) {
			n->twin_logged_us[peer] = now ? now : 1;
			gg_log(GG_LOG_ERROR, "site_claimed_twice",
			       "site=%s instances=%016llx,%016llx reason=\"" TWIN_CAUSE
			       ": was a second one started with its certificate and key?\"",
			       n->names[peer], (unsigned long long)old, (unsigned long long)id, n->names[peer]);
		}
	}
}

/* Why a peer's restart ended a job here: after `last` steps done here
 * (0: none). */
static void restart_reason(const struct gg_node *n, unsigned peer, const char *job, uint64_t last, char *why,
			   size_t size)
{
	if (site_twinned(n, peer))
		snprintf(why, size, TWIN_CAUSE " (a second one started with its certificate and key?): the ranks of "
			 "job '%s' there lost their sessions",
			 n->names[peer], job);
	else if (last)
		snprintf(why, size, "site %s restarted after step %llu of job '%s': its ranks there lost their sessions",
			 n->names[peer], (unsigned long long)last, job);
	else
		snprintf(why, size, "site %s restarted before any step of job '%s' completed: its ranks there lost "
			 "their sessions", n->names[peer], job);
}

/* Whether the peer's run of the name was going on there: heard of (its
 * data, or an ABORT), and not a run of the name over before. */
static bool run_going_on(const struct name_runs *r, unsigned peer)
{
	return r && r->seen[peer] && !run_within(r->seen[peer], r->over[peer]) &&
	       !run_within(r->seen[peer], r->left[peer]);
}

/* A restarted gateway closed its ranks' sessions: the jobs it took part in
 * are over there, and their later steps fail at once rather than each wait
 * out its deadline.
 *
 * The step in progress completes here if its result is whole here: the
 * old gateway is gone for good, so it can neither fail the step nor need
 * its result any more, and every other site that holds the result decides
 * the same (one that does not fails the step, and since this site said
 * DONE only with the result whole, no site can complete without the
 * others' DONE). Failing it instead would split the sites when the old
 * gateway's DONE reached some of them before it died and not others. */
static void on_peer_restart(struct gg_node *n, unsigned peer, uint64_t down_since_us)
{
	char why[GG_NODE_ERROR_MAX];

	for (unsigned i = 0; i < MAX_JOBS; i++) {
		struct job *j = &n->jobs[i];
		if (!j->used)
			continue;
		uint64_t last = done_here(j) ? j->step->seq : j->done_seq;
		/* With no step done here, the job ran there only if its old run
		 * was going on: otherwise its ranks there may still come, to the
		 * new gateway, for their first step. (By ring a site hears only
		 * the one before it: where that one's ranks are late, nothing of
		 * the run there came here, and the job goes on; its step in
		 * progress fails below.) */
		if (!last && !run_going_on(name_runs(n, j->name, false), peer))
			continue;
		restart_reason(n, peer, j->name, last, why, sizeof(why));
		job_ended_at(n, j, peer, false, last, UINT64_MAX, GG_ERR_SITE, why, why);
	}
	/* A name whose run went on there with no job of it here yet, though
	 * its ranks here are connected (yet to announce their first step):
	 * the job is ended as it is made. */
	for (unsigned i = 0; i < n->name_runs_cap; i++) {
		struct name_runs *r = &n->name_runs[i];
		if (r->job[0] && r->open && run_going_on(r, peer) && !find_job(n, r->job, false))
			r->lost_by |= 1u << peer;
	}
	/* A step with no result here (a first step, too) needed the old
	 * gateway's part: lost with it. But not a step handed over here once
	 * no stream to the old gateway was up any more, of a run none of whose
	 * frames came from it: nothing of the step went there (its DATA waits,
	 * never sent, for the new gateway: gg_mesh's peer_lost_state()) or
	 * came from there. It goes on with the new gateway, as with a site
	 * whose gateway starts late. */
	for (unsigned i = 0; i < MAX_JOBS; i++) {
		struct job *j = &n->jobs[i];
		if (j->used && j->step && !j->has_result &&
		    !(down_since_us && j->submit_us > down_since_us && !run_going_on(name_runs(n, j->name, false), peer)))
			fail_step_code(n, j, GG_ERR_SITE,
				       site_twinned(n, peer) ? "step %llu of job '%s': " TWIN_CAUSE ", and lost the step"
							     : "step %llu of job '%s': site %s restarted and lost the step",
				       (unsigned long long)j->step->seq, j->name, n->names[peer]);
	}
}

static void on_done(struct gg_node *n, unsigned from, const struct gg_wire_msg *m)
{
	struct job *j = find_job(n, m->u.done.job, false);

	if (peer_run_stale(n, m->u.done.job, from, m->u.done.run, false))
		return;
	if (j)
		peer_run_heard(n, j->name, from, m->u.done.run);
	if (m->u.done.links.uplink_bytes_per_s)
		n->links[from].uplink_bytes_per_s = m->u.done.links.uplink_bytes_per_s;
	if (m->u.done.links.rtt_us)
		n->links[from].rtt_us = m->u.done.links.rtt_us;

	if (j && m->u.done.asks)
		answer_completed(n, j, from, m->u.done.step);
	/* A DONE for a step not in progress here is stale: this site failed
	 * or completed it (which needed this DONE, so it was a copy). */
	if (!j || !j->step || j->step->seq != m->u.done.step)
		return;
	j->done_from |= 1u << from;
	if (m->u.done.completed)
		all_done(n, j);
	/* The first site's plan, from its DONE, or as a site that completed
	 * the step (and so heard that DONE) passes it on. */
	if ((from == 0 || m->u.done.completed) && n->self != 0 && n->cfg->allreduce.algorithm == GG_ALLREDUCE_AUTO)
		j->plan = m->u.done.plan;
	maybe_complete(n, j);
}

/* A new stream to `peer` may carry a DONE or ABORT a lost one did not: of
 * a step in progress, or of one this site completed or failed while the
 * peer may still wait for it. */
static void resend_done(struct gg_node *n, unsigned peer)
{
	const uint64_t now = gg_node_loop(n)->now_us;

	for (unsigned i = 0; i < MAX_JOBS; i++) {
		struct job *j = &n->jobs[i];
		uint8_t buf[CTRL_MSG_MAX];
		if (!j->used)
			continue;
		/* The last step completed here may still be in progress there,
		 * even with a later one in progress here. */
		if (j->done_seq && now - j->done_us < n->cfg->transport.step_timeout_us)
			send_to_peers(n, (int)peer, buf,
				      gg_wire_encode_completed(buf, sizeof(buf), j->name, j->run, j->done_seq,
							       &n->links[n->self], &j->done_plan),
				      true);
		/* Also while a step completed here ends (its lanes letting go):
		 * done_seq says so only once they have, and a stream that came
		 * back meanwhile may have lost the DONE, with no other chance. */
		if (done_here(j)) {
			if (j->ending) /* completed, its lanes letting go: say so */
				answer_completed(n, j, peer, j->step->seq);
			else
				send_done(n, j, (int)peer);
			j->done_may_reach |= 1u << peer;
		}
		if (j->failed_lo && now - j->failed_us < n->cfg->transport.step_timeout_us)
			send_abort(n, (int)peer, j->name, j->run, j->failed_lo, j->failed_hi, j->failed_code,
				   j->failed_reason);
		if (j->fail_from)
			send_abort(n, (int)peer, j->name, j->run, j->fail_from, STEPS_ON, j->fail_from_code,
				   j->fail_from_reason);
	}
	for (unsigned e = 0; e < ENDS_KEPT; e++)
		if (n->ended[e].name[0] && now - n->ended[e].us < n->cfg->transport.step_timeout_us)
			send_end(n, (int)peer, &n->ended[e]);
}

/* A lane took step-1 DATA of `name` from `peer` for a re-send, as steps of
 * the job ran here. Where the peer said the job ended there (END), it is
 * a new run of the name while this site's run goes on: README and
 * gradgate.h promise it is refused, saying so, rather than left to wait
 * out its deadline. Every site fails its step 1 (an ABORT of step 1 is
 * moot where the old run is past it). */
static void rerun_seen(struct gg_node *n, unsigned peer, const char *name)
{
	struct job *j = find_job(n, name, false);
	char reason[GG_NODE_ERROR_MAX];

	if (!j || !(j->ended_by & (1u << peer)) || j->rerun_refused || !j->last_seq)
		return;
	j->rerun_refused = true;
	/* Its peers name the job as they pass it on: the advice at the end
	 * must fit the ranks' 256 bytes with long names too. */
	snprintf(reason, sizeof(reason),
		 "a job name is one training run, and site %s still runs the old one (at step %llu): use a new name, "
		 "or wait until its ranks are all gone", n->names[n->self], (unsigned long long)j->last_seq);
	if (peer_log_now(n->logs, peer, LOG_RERUN_REFUSED, gg_node_loop(n)->now_us))
		gg_log(GG_LOG_WARN, "rerun_refused", "site=%s job=%s reason=\"%s\"", n->names[peer], j->name, reason);
	send_abort(n, -1, j->name, j->run, 1, 1, GG_ERR_REFUSED, reason);
}

static void coordinator_mail(struct gg_node *n)
{
	for (struct gg_mail *g = gg_mailbox_take(&n->inbox), *next; g; g = next) {
		struct mail *m = (struct mail *)g;
		struct job *j;
		next = g->next;
		if (m->charged) /* a peer's message, within PEER_MAILS_MAX */
			atomic_fetch_sub_explicit(&n->peer_mails[m->peer], 1, memory_order_relaxed);
		switch ((enum mail_type)g->type) {
		case M_PART_DONE:
			if ((j = job_of(n, m->slot, m->seq)) && !j->ending && ++j->parts_done == n->nlanes)
				step_has_result(n, j);
			break;
		case M_PART_FAILED:
			if ((j = job_of(n, m->slot, m->seq)))
				fail_step_code(n, j, m->code, "%s", m->u.text);
			break;
		case M_ENDED:
			if ((j = job_of(n, m->slot, m->seq)) && j->ending && ++j->ended == n->nlanes)
				step_ended(n, j);
			break;
		case M_CONTROL:
			if (m->u.msg.type == GG_WIRE_ABORT)
				on_abort(n, m->peer, &m->u.msg);
			else if (m->u.msg.type == GG_WIRE_END)
				on_end(n, m->peer, &m->u.msg);
			else
				on_done(n, m->peer, &m->u.msg);
			break;
		case M_RESTARTED:
			/* Every lane that had streams to it tells; the first says it.
			 * A later one's held DATA goes once its word is in: the
			 * M_PEER_RESET that released the others may have come to it
			 * before it met the new instance. */
			if (n->instance_id[m->peer] == m->u.restarted.instance_id) {
				struct mail *r = m->via_lane < n->nlanes ? mail_new(M_PEER_RELEASE) : NULL;
				if (r) {
					r->peer = m->peer;
					post(&n->lanes[m->via_lane].inbox, r);
				}
				break;
			}
			peer_instance_changed(n, m->peer, m->u.restarted.instance_id);
			on_peer_restart(n, m->peer, m->u.restarted.down_since_us);
			forget_peer_runs(n, m->peer);
			break;
		case M_PEER_RUN:
			peer_run_heard(n, m->u.job, m->peer, m->run);
			break;
		case M_STREAM_READY:
			atomic_store_explicit(&n->ever_up[m->peer], true, memory_order_relaxed);
			resend_done(n, m->peer);
			break;
		case M_STREAM_DOWN:
			pthread_mutex_lock(&n->down_lock);
			snprintf(n->down_reason[m->peer], sizeof(n->down_reason[m->peer]), "%.250s", m->u.text);
			pthread_mutex_unlock(&n->down_lock);
			break;
		case M_RERUN:
			rerun_seen(n, m->peer, m->u.job);
			break;
		default:
			break;
		}
		free(m);
	}
}

/* " (no connection to site X, site Y)" for peers with no stream up, or "":
 * when a site is gone, what a step waits for may be held up by it rather
 * than by the site the step waits on. A peer only it may dial (dial =
 * "in" here) is marked so: if it never dials, no stream ever comes. */
void gg_node_unreachable_note(const struct gg_node *n, unsigned except, char *buf, size_t size)
{
	size_t len = 0;

	buf[0] = '\0';
	for (unsigned p = 0; p < n->sites && len < size; p++) {
		if (p == n->self || p == except || atomic_load(&n->ready[p]))
			continue;
		const struct gg_peer_config *pc = gg_config_peer(n->cfg, n->names[p]);
		len += (size_t)snprintf(buf + len, size - len, "%s site %s%s", len ? "," : " (no connection to",
					n->names[p], pc && pc->dial == GG_DIAL_IN ? ", whose dial it waits for (dial = \"in\")" : "");
	}
	if (len && len < size)
		snprintf(buf + len, size - len, ")");
}

/* Why `peer` has no stream up: its last stream's reason or, when none ever
 * came up, what this site's dial setting leaves to the peer. A peer that
 * refuses this site's dials (its dial for this site is "out") is reached,
 * so any failure of a dial said before is old news: what keeps the pair
 * apart is that the peer's own dials do not come (unless this site refuses
 * them too: the conflict, which the mesh says). */
const char *gg_node_down_reason(const struct gg_node *n, unsigned peer, char *buf, size_t size)
{
	const struct gg_peer_config *pc = gg_config_peer(n->cfg, n->names[peer]);

	if (!(pc && pc->dial == GG_DIAL_OUT) && peer_refuses_dials(n, peer)) {
		/* Short: a rank's message has 255 bytes for all of it. */
		snprintf(buf, size, "%s: site %s refuses our dials (dial \"out\" there) and its own do not arrive (its "
			 "address for %s?)",
			 atomic_load_explicit(&n->ever_up[peer], memory_order_relaxed) ? "no stream up" : "never connected",
			 n->names[peer], n->names[n->self]);
		return buf;
	}
	/* (The lock is no part of the node's state this reads: taking it
	 * leaves a const node as it was. Nodes are never const objects.) */
	pthread_mutex_lock((pthread_mutex_t *)&n->down_lock);
	const bool known = n->down_reason[peer][0];
	if (known)
		snprintf(buf, size, "%s", n->down_reason[peer]);
	pthread_mutex_unlock((pthread_mutex_t *)&n->down_lock);
	if (known)
		return buf;
	if (pc && pc->dial == GG_DIAL_IN)
		/* Named: the step's message reaches other sites too. */
		snprintf(buf, size, "never connected: site %s's [[peers]] dial for %s is \"in\", so %s must dial it "
			 "(dial = \"out\" or \"both\" there)", n->names[n->self], n->names[peer], n->names[peer]);
	else
		snprintf(buf, size, "never connected");
	return buf;
}

unsigned gg_node_unreachable(const struct gg_node *n, char *buf, size_t size)
{
	char why[GG_NODE_ERROR_MAX];
	unsigned count = 0;
	size_t len = 0;

	buf[0] = '\0';
	for (unsigned p = 0; p < n->sites; p++) {
		if (p == n->self || atomic_load(&n->ready[p]))
			continue;
		if (len < size)
			len += (size_t)snprintf(buf + len, size - len, "%ssite %s: %s", count ? "; " : "", n->names[p],
						gg_node_down_reason(n, p, why, sizeof(why)));
		count++;
	}
	/* Then the peers some streams reach, but not all. */
	for (unsigned p = 0; p < n->sites; p++) {
		uint64_t up = atomic_load(&n->ready[p]);
		if (p == n->self || !up || up == n->all_streams || len >= size)
			continue;
		len += (size_t)snprintf(buf + len, size - len, "%ssite %s: %d of %d streams up", len ? "; " : "",
					n->names[p], __builtin_popcountll(up), n->cfg->transport.streams_per_peer);
	}
	return count;
}

/* When anything was last heard from `peer`, on any lane. */
static uint64_t last_heard(const struct gg_node *n, unsigned peer)
{
	uint64_t t = 0;

	for (unsigned l = 0; l < n->nlanes; l++)
		t = GG_MAX(t, (uint64_t)atomic_load_explicit(&n->lanes[l].heard_us[peer], memory_order_relaxed));
	return t;
}

/* A site not heard from for heartbeat_timeout, unless this site itself
 * stood still meanwhile (it heard nothing from anyone, which says nothing
 * about them): true with `why` naming it. */
static bool lost_site(struct gg_node *n, uint64_t now, char *why, size_t why_size)
{
	const uint64_t limit = n->cfg->transport.heartbeat_timeout_us;

	if (n->stall_end_us && now < n->stall_end_us + limit)
		return false;
	for (unsigned p = 0; p < n->sites; p++) {
		uint64_t heard = last_heard(n, p); /* by a lane's clock, which may be ahead of this one */
		if (p == n->self || heard >= now || now - heard <= limit)
			continue;
		bool up = atomic_load(&n->ready[p]) != 0;
		char down[GG_NODE_ERROR_MAX];
		snprintf(why, why_size, "site %s is unreachable: nothing heard from it for %.1f s (%s%s)", n->names[p],
			 (double)(now - heard) / 1e6, up ? "its streams are up but silent" : "its streams are down: ",
			 up ? "" : gg_node_down_reason(n, p, down, sizeof(down)));
		return true;
	}
	return false;
}

bool gg_node_job_failed(struct gg_node *n, const char *job)
{
	const struct job *j = find_job(n, job, false);

	if (j) {
		for (unsigned a = 0; a < ABORTS_KEPT; a++)
			if (j->aborted[a].lo && j->aborted[a].lo <= j->last_seq + 1 && j->aborted[a].hi == STEPS_ON)
				return true; /* a peer's steps from then on */
		return j->refused || (j->ended_by && j->last_seq >= j->ended_done);
	}
	/* Its ranks here have announced no step yet: what the name's record
	 * keeps for them ends the job once it is made. */
	const struct name_runs *r = name_runs(n, job, false);
	return r && r->open && (r->lost_by || r->end_from || r->abort_from);
}

bool gg_node_lost_site(struct gg_node *n, char *why, size_t why_size)
{
	return lost_site(n, gg_node_loop(n)->now_us, why, why_size);
}

/* A step needs every site: one not heard from for heartbeat_timeout fails
 * it now, rather than at its deadline. Returns true when it did. */
static bool fail_if_peer_lost(struct gg_node *n, struct job *j, uint64_t now)
{
	char why[GG_NODE_ERROR_MAX];

	/* A site that said DONE waits for the others' word instead (they may
	 * have completed on it), unless its DONE reached nobody: then no site
	 * can have. */
	if ((j->has_result && j->done_may_reach) || !lost_site(n, now, why, sizeof(why)))
		return false;
	fail_step_code(n, j, GG_ERR_SITE, "step %llu of job '%s': %s%s%s%s", (unsigned long long)j->step->seq, j->name,
		       why, j->has_result ? "; site " : "", j->has_result ? n->names[n->self] : "",
		       j->has_result ? " had the result, but no stream carried its DONE to any site" : "");
	return true;
}

static void post_shutdown(struct gg_node *n)
{
	struct mail m = { .base.type = M_SHUTDOWN };
	struct mail *a;

	n->close_told = post_lanes(n, &m, n->close_told);
	if (!n->acceptor_told && (a = mail_new(M_SHUTDOWN))) {
		post(&n->lanes[n->nlanes].inbox, a);
		n->acceptor_told = true;
	}
}

/* Whole steps: sites lost, and steps whose parts are done but whose commit
 * round is not. */
static uint64_t coordinator_timers(struct gg_node *n)
{
	const uint64_t now = gg_node_loop(n)->now_us;
	uint64_t next = now + TICK_US;

	uint64_t still = stood_still_now(n);
	if (still) {
		n->stall_end_us = now;
		n->stall_us = still;
		/* A step that was here without its result fails now, as it
		 * would once the result came: its ranks, and the other sites,
		 * need not wait for that (a late rank, the deadline). */
		for (unsigned i = 0; i < MAX_JOBS; i++) {
			struct job *j = &n->jobs[i];
			if (j->used && j->step && !j->ending && !j->has_result && j->submit_us < now)
				fail_stood_still(n, j, still);
		}
	}
	next = GG_MIN(next, gg_node_peer_logs_flush(n, n->logs, now));

	/* Mail that memory ran out for, again. */
	if (n->closing && (n->close_told != all_lanes(n) || !n->acceptor_told))
		post_shutdown(n);
	for (unsigned i = 0; i < MAX_JOBS; i++)
		if (n->jobs[i].used && n->jobs[i].ending && n->jobs[i].end_told != all_lanes(n))
			post_end(n, &n->jobs[i]);

	if (gg_buf_pool_count(&n->frames)) {
		bool idle = true;
		for (unsigned i = 0; i < MAX_JOBS && idle; i++)
			idle = !n->jobs[i].used || (!n->jobs[i].step && now - n->jobs[i].active_us > POOL_IDLE_US);
		if (idle)
			gg_buf_pool_trim(&n->frames);
	}
	for (unsigned i = 0; i < MAX_JOBS; i++) {
		struct job *j = &n->jobs[i];
		if (!j->used || !j->step || j->ending || fail_if_peer_lost(n, j, now) || !j->has_result)
			continue;
		next = GG_MIN(next, ask_completed(n, j, now));
		/* Said DONE: the others may complete on it, so this site waits
		 * for their DONE past the deadline, for as long as it takes to
		 * find a site lost. */
		uint64_t until = GG_MAX(j->deadline_us, j->has_result_us) + n->cfg->transport.heartbeat_timeout_us;
		if (now < until) {
			next = GG_MIN(next, until);
			continue;
		}
		char buf[32], down[GG_AR_MAX_SITES * (GG_WIRE_NAME_MAX + 48) + 32];
		char waiting[GG_AR_MAX_SITES * (GG_WIRE_NAME_MAX + 2) + 1] = "";
		char silent[GG_AR_MAX_SITES * (GG_WIRE_NAME_MAX + 40) + 1] = "";
		size_t len = 0, slen = 0;
		gg_node_unreachable_note(n, n->sites, down, sizeof(down));
		for (unsigned p = 0; p < n->sites; p++) {
			if (p == n->self || (j->done_from & (1u << p)))
				continue;
			len += (size_t)snprintf(waiting + len, sizeof(waiting) - len, "%s%s", len ? ", " : "",
						n->names[p]);
			/* Lost, not slow: the cause is the site, as where it
			 * failed without the result. */
			uint64_t heard = last_heard(n, p);
			if (heard < now && now - heard > n->cfg->transport.heartbeat_timeout_us)
				slen += (size_t)snprintf(silent + slen, sizeof(silent) - slen,
							 "; site %s is unreachable: nothing heard from it for %.1f s",
							 n->names[p], (double)(now - heard) / 1e6);
		}
		fail_step_code(n, j, silent[0] ? GG_ERR_SITE : GG_ERR_TIMEOUT,
			       "step %llu of job '%s' missed its %s deadline: site %s had the result, but "
			       "site%s %s never said so too%s%s",
			       (unsigned long long)j->step->seq, j->name,
			       gg_format_duration(j->timeout_us, buf, sizeof(buf)), n->names[n->self],
			       strchr(waiting, ',') ? "s" : "", waiting, silent, down);
	}
	return next;
}

static double load_s(const atomic_uint_fast64_t *ns)
{
	return (double)load(ns) * 1e-9;
}

static void gather_stats(struct gg_node *n)
{
	struct gg_node_stats *st = &n->stats;

	st->data_bytes_out = st->raw_bytes_out = st->data_bytes_in = st->resent_messages = st->hedged_frames = 0;
	st->encode_s = st->decode_s = st->tls_s = 0;
	st->early_bytes = st->early_refused = 0;
	for (unsigned l = 0; l <= n->nlanes; l++) {
		struct lane *ln = &n->lanes[l];
		for (unsigned p = 0; p < n->sites; p++) {
			const struct lane_peer_stats *lp = &ln->stats.peers[p];
			st->data_bytes_out += load(&lp->data_out);
			st->raw_bytes_out += load(&lp->raw_out);
			st->data_bytes_in += load(&lp->data_in);
			st->early_bytes += load(&ln->early_bytes[p]);
			uint64_t rtt = load(&ln->rtt_us[p]);
			if (rtt)
				st->rtt_us[p] = rtt;
		}
		st->encode_s += load_s(&ln->stats.encode_ns);
		st->decode_s += load_s(&ln->stats.decode_ns);
		st->tls_s += load_s(&ln->tls_ns);
		st->resent_messages += load(&ln->resent);
		st->hedged_frames += load(&ln->hedged);
		st->early_refused += load(&ln->early_refused);
	}
}

void gg_node_get_metrics(const struct gg_node *n, struct gg_node_metrics *out)
{
	memset(out, 0, sizeof(*out));
	out->stats = n->stats;
	out->sites = n->sites;
	out->self = n->self;
	for (unsigned l = 0; l <= n->nlanes; l++) {
		const struct lane *ln = &n->lanes[l];
		const struct lane_stats *ls = &ln->stats;
		for (unsigned p = 0; p < n->sites; p++) {
			const struct lane_peer_stats *lp = &ls->peers[p];
			struct gg_node_peer_metrics *pm = &out->peers[p];
			pm->raw_bytes_out += load(&lp->raw_out);
			pm->raw_bytes_in += load(&lp->raw_in);
			pm->data_bytes_out += load(&lp->data_out);
			pm->data_bytes_in += load(&lp->data_in);
			pm->wire_bytes_out += load(&lp->wire_out);
			pm->wire_bytes_in += load(&lp->wire_in);
			pm->stream_ups += load(&lp->stream_ups);
			pm->stream_downs += load(&lp->stream_downs);
			pm->delivery_bytes_per_s += load(&lp->delivery_bps);
		}
		out->gather_s += load_s(&ls->gather_ns);
		out->encode_s += load_s(&ls->encode_ns);
		out->decode_s += load_s(&ls->decode_ns);
		out->deliver_s += load_s(&ls->deliver_ns);
		out->wait_s += load_s(&ls->wait_ns);
		for (unsigned f = 0; f < GG_MESH_FAILURES; f++)
			out->stream_failures[f] += load(&ls->stream_failures[f]);
	}
	for (unsigned p = 0; p < n->sites; p++) {
		struct gg_node_peer_metrics *pm = &out->peers[p];
		if (p == n->self) {
			memset(pm, 0, sizeof(*pm));
			continue;
		}
		uint64_t ready = atomic_load(&n->ready[p]);
		pm->streams_up = (unsigned)__builtin_popcountll(ready);
		pm->streams = (unsigned)n->cfg->transport.streams_per_peer;
		pm->rtt_us = n->stats.rtt_us[p];
		/* The lanes count silence from their start; what was heard is
		 * what came over a stream, and a peer never up had none. */
		pm->heard_us = atomic_load_explicit(&n->ever_up[p], memory_order_relaxed) ? last_heard(n, p) : 0;
		for (unsigned s = 0; s < pm->streams && s < GG_MESH_MAX_STREAMS; s++) {
			const struct stream_tcp *st = &n->tcp[p][s];
			struct gg_node_stream_metrics *sm = &out->streams[p][s];
			sm->up = atomic_load_explicit(&st->up, memory_order_acquire);
			if (!sm->up)
				continue;
			sm->tcp = (struct gg_mesh_stream_tcp){ .rtt_us = load(&st->rtt_us),
							       .rttvar_us = load(&st->rttvar_us),
							       .cwnd_bytes = load(&st->cwnd_bytes),
							       .delivery_bytes_per_s = load(&st->delivery_bytes_per_s),
							       .retransmits = load(&st->retransmits),
							       .unsent_bytes = load(&st->unsent_bytes),
							       .send_buffer_bytes = load(&st->send_buffer_bytes),
							       .receive_buffer_bytes = load(&st->receive_buffer_bytes) };
		}
	}
	memcpy(out->step_buckets, n->step_buckets, sizeof(out->step_buckets));
	out->step_s_sum = (double)n->step_us_sum * 1e-6;
	memcpy(out->failures_by_code, n->failures_by_code, sizeof(out->failures_by_code));
	out->feedback_bytes = n->feedback_bytes;
}

unsigned gg_node_recent_failures(const struct gg_node *n, struct gg_node_failure *out, unsigned max)
{
	unsigned have = (unsigned)GG_MIN(n->failures_total, (uint64_t)FAILURES_KEPT), i;

	for (i = 0; i < have && i < max; i++)
		out[i] = n->failures[(n->failures_total - 1 - i) % FAILURES_KEPT];
	return i;
}

void gg_node_note_failure(struct gg_node *n, const char *job, uint64_t seq, int code, const char *message)
{
	note_failure(n, job, seq, code, message);
}

uint64_t gg_node_failure_count(const struct gg_node *n)
{
	return n->failures_total;
}

/* Wakes the lanes that wait before their first turn (gg_lane_main()):
 * to run (stop NULL: the node's loop turns), or to stop (*stop set). */
static void let_lanes_go(struct gg_node *n, atomic_bool *stop)
{
	pthread_mutex_lock(&n->start_lock);
	if (stop)
		atomic_store(stop, true);
	else
		n->released = true;
	pthread_cond_broadcast(&n->let_go);
	pthread_mutex_unlock(&n->start_lock);
}

int gg_node_run_once(struct gg_node *n, uint64_t timeout_us, gg_node_cqe_fn *other, void *arg)
{
	struct lane *ln = &n->lanes[0];
	struct cqe_ctx x = { .ln = ln, .other = other, .arg = arg };

	if (!n->released)
		let_lanes_go(n, NULL);
	int rc = gg_lane_turn(ln, GG_MIN(timeout_us, gg_loop_timeout_us(&ln->loop, n->coord_next_us)), &x);

	if (rc)
		return rc;
	if ((rc = atomic_load(&n->acceptor_failed)))
		return rc;
	if (x.coord_mail && (rc = gg_mailbox_arm(&n->inbox, &ln->loop, gg_loop_ud(KIND_COORD_MAIL, 0, 0))))
		return rc;
	/* What the coordinator and lane 0, both on this thread, post each
	 * other wakes neither: it is handled in this turn, not the next, which
	 * may be a tick away (the end of a step that failed at its deadline
	 * with no stream up to wake the loop waited 100 ms). */
	for (unsigned round = 0; round < 4; round++) {
		coordinator_mail(n);
		gg_lane_mail(ln);
		if (gg_mailbox_empty(&n->inbox))
			break;
	}
	n->coord_next_us = coordinator_timers(n);
	n->coord_done_boot_us = gg_boottime_us();
	n->coord_done_cpu_us = gg_thread_cpu_us();
	/* Mail still there (a step's done() started the next, and so on):
	 * the next turn does not wait. */
	if (!gg_mailbox_empty(&n->inbox) || !gg_mailbox_empty(&ln->inbox))
		n->coord_next_us = ln->loop.now_us;
	gather_stats(n);
	return 0;
}

uint32_t gg_node_chunk_elems(const struct gg_config *cfg)
{
	return (uint32_t)GG_MIN(cfg->transport.chunk_bytes / sizeof(float), (uint64_t)UINT32_MAX) /
	       GG_CODEC_BLOCK_ALIGN_ELEMS * GG_CODEC_BLOCK_ALIGN_ELEMS;
}

void gg_node_test_own_window(struct gg_node *n)
{
	gg_mesh_test_own_window(n->lanes[0].mesh);
}

int gg_node_test_cut_stream(struct gg_node *n, unsigned peer, int stream)
{
	if (peer >= n->sites || stream < 0 || stream >= n->cfg->transport.streams_per_peer)
		return -EINVAL;
	struct lane *ln = &n->lanes[(unsigned)stream % n->nlanes];
	if (ln->index == 0)
		return gg_mesh_test_cut_stream(ln->mesh, peer, stream);
	if (!(atomic_load(&n->ready[peer]) & ((uint64_t)1 << stream)))
		return -ENOTCONN;
	struct mail *m = mail_new(M_CUT);
	if (!m)
		return -ENOMEM;
	m->peer = peer;
	m->u.stream = stream;
	post(&ln->inbox, m);
	return 0;
}

int gg_node_test_send_data(struct gg_node *n, unsigned peer, const char *job, uint64_t step, uint32_t chunk,
			   size_t bytes)
{
	struct gg_wire_step ws = { .run = 1, .step = step, .count = 1, .dtype = GG_WIRE_F32 };
	struct gg_ar_chunk_id id = { .phase = GG_AR_DIRECT, .origin = (uint8_t)n->self, .chunk = chunk };

	if (peer >= n->sites || peer == n->self || bytes > n->max_payload - GG_WIRE_DATA_FIXED_BYTES)
		return -EINVAL;
	snprintf(ws.job, sizeof(ws.job), "%s", job);
	struct gg_buf *frame = gg_buf_new(&n->frames, n->max_payload);
	if (!frame)
		return -ENOMEM;
	memset(frame->data, 0x5a, bytes);
	frame->len = bytes;
	int rc = gg_mesh_send_data(n->lanes[0].mesh, peer, &ws, &id, frame, 0);
	gg_buf_put(frame);
	return rc;
}

void gg_node_test_set_plan(struct gg_node *n, const char *job, uint64_t direct_max)
{
	struct job *j = find_job(n, job, false);

	if (j)
		j->using = (struct gg_wire_plan){ .has_plan = true, .direct_max = direct_max };
}

uint32_t gg_node_test_step_chunk(struct gg_node *n, const char *job, enum gg_allreduce_algo *algo)
{
	struct job *j = find_job(n, job, false);

	if (!j)
		return 0;
	*algo = j->run_algo;
	return j->run_chunk;
}

void gg_node_test_drop_done(struct gg_node *n, unsigned peer)
{
	n->test_drop_done = peer + 1;
}

int gg_node_test_open_stream(struct gg_node *n, unsigned peer, unsigned stream, uint64_t instance_id,
			     gg_mesh_test_sent_fn *sent, void *arg)
{
	if (stream % n->nlanes)
		return -EINVAL;
	return gg_mesh_test_open(n->lanes[0].mesh, peer, stream, instance_id, sent, arg);
}

int gg_node_test_receive(struct gg_node *n, unsigned peer, unsigned stream, const uint8_t *bytes, size_t len)
{
	if (stream % n->nlanes)
		return -EINVAL;
	return gg_mesh_test_receive(n->lanes[0].mesh, peer, stream, bytes, len);
}

void gg_node_test_hold_mail(struct gg_node *n, unsigned lane, bool hold)
{
	if (lane < n->nlanes)
		atomic_store_explicit(&n->lanes[lane].test_hold_mail, hold, memory_order_relaxed);
}

uint64_t gg_node_test_mail_waiting(const struct gg_node *n, unsigned peer)
{
	uint64_t waiting = atomic_load(&n->peer_mails[peer]);

	for (unsigned l = 0; l < n->nlanes; l++)
		waiting += atomic_load(&n->lanes[l].fwd_bytes[peer]);
	return waiting;
}

void gg_node_test_feedback_max(struct gg_node *n, unsigned tensors)
{
	n->feedback_max = tensors;
}

void gg_node_test_freeze_at_result(struct gg_node *n)
{
	n->test_freeze_at_result = true;
}

bool gg_node_connected(const struct gg_node *n)
{
	for (unsigned p = 0; p < n->sites; p++)
		if (p != n->self && atomic_load(&n->ready[p]) != n->all_streams)
			return false;
	return true;
}

int gg_node_reload(struct gg_node *n, char *err, size_t err_size)
{
	return gg_tls_context_reload(n->tls, err, err_size);
}

void gg_node_stop_steps(struct gg_node *n)
{
	n->shutting_down = true;
	for (unsigned i = 0; i < MAX_JOBS; i++)
		if (n->jobs[i].used && n->jobs[i].step)
			fail_step_code(n, &n->jobs[i], GG_ERR_CLOSED,
				       "step %llu of job '%s': the gateway of site %s is shutting down",
				       (unsigned long long)n->jobs[i].step->seq, n->jobs[i].name, n->names[n->self]);
}

int gg_node_abort(struct gg_node *n, const char *job, uint64_t seq, int code, const char *reason)
{
	struct job *j = find_job(n, job, true);
	char text[GG_NODE_ERROR_MAX];

	/* A failed step always says what failed, here and at the peers, in
	 * one line: control bytes become '?', as on the wire. */
	if (!reason || !*reason) {
		snprintf(text, sizeof(text), "step %llu of job '%s' failed at site %s (no reason given)",
			 (unsigned long long)seq, job, n->names[n->self]);
	} else {
		size_t i = 0;
		for (; reason[i] && i + 1 < sizeof(text); i++)
			text[i] = (unsigned char)reason[i] < 0x20 || reason[i] == 0x7f ? '?' : reason[i];
		text[i] = '\0';
	}
	reason = text;

	if (j && j->step && j->step->seq == seq) {
		if (j->ending)
			return j->end_status ? 0 : -EALREADY;
		if (j->has_result) {
			char safe[LOG_VALUE_MAX];
			gg_log(GG_LOG_INFO, "abort_too_late", "job=%s step=%llu reason=\"%s\" outcome=\"as the peers say\"",
			       j->name, (unsigned long long)seq, gg_escape(safe, sizeof(safe), reason, strlen(reason)));
			return -EALREADY;
		}
		fail_step_code(n, j, code, "%s", reason);
		return 0;
	}
	send_abort(n, -1, job, j ? j->run : new_run(n), seq, seq, code, reason);
	note_failure(n, job, seq, code, reason);
	if (j)
		remember_abort(n, j, seq, code, reason);
	/* Frames the lanes keep for the step are let go. */
	forget_step(n, job, seq);
	if (j && seq > j->last_seq)
		j->last_seq = seq;
	return 0;
}

void gg_node_abort_from(struct gg_node *n, const char *job, uint64_t seq, int code, const char *reason)
{
	struct job *j = find_job(n, job, false);

	/* Only of a run under way here: before its first step the other
	 * sites' steps wait for this one's ranks' step 1 in any case. */
	if (!j || !j->last_seq || n->shutting_down || (j->fail_from && j->fail_from <= seq))
		return;
	j->fail_from = seq;
	j->fail_from_code = code;
	snprintf(j->fail_from_reason, sizeof(j->fail_from_reason), "%s", reason);
	send_abort(n, -1, job, j->run, seq, STEPS_ON, code, reason);
}

void gg_node_end_job(struct gg_node *n, const char *job)
{
	gg_node_end_job_why(n, job, NULL);
}

void gg_node_end_job_why(struct gg_node *n, const char *job, const char *why)
{
	struct job *j = find_job(n, job, false);

	if (j && j->step)
		return; /* the site backend ends a job once none of its steps is here */
	struct ended_job *e = &n->ended[n->ended_next++ % ENDS_KEPT];
	snprintf(e->name, sizeof(e->name), "%s", job);
	e->run = j ? j->run : new_run(n);
	e->last_step = j ? GG_MAX(j->last_seq, j->done_seq) : 0;
	e->last_done = j ? j->done_seq : 0;
	e->us = gg_node_loop(n)->now_us;
	e->ended_us = gg_monotonic_us();
	if (j && j->failed_lo && j->failed_lo <= e->last_done + 1 && e->last_done < j->failed_hi) {
		e->code = j->failed_code;
		snprintf(e->reason, sizeof(e->reason), "%s", j->failed_reason);
	} else {
		e->code = GG_ERR_RANK;
		char reason[sizeof(e->reason)];
		snprintf(reason, sizeof(reason), "its ranks there are gone%s%s", why ? ": " : "", why ? why : "");
		memcpy(e->reason, reason, sizeof(reason));
	}
	send_end(n, -1, e);
	/* The peers' runs this one paired with are over here: what comes of
	 * them later (an END sent again) is not of a new run of the name. The
	 * lanes learn which they are too. */
	struct mail f = { .base.type = M_FORGET_JOB, .sites = (uint32_t)((1ull << n->sites) - 1) };
	struct name_runs *r = name_runs(n, job, true);
	for (unsigned p = 0; r && p < n->sites; p++) {
		run_raise(&r->left[p], r->seen[p]);
		f.runs[p] = r->seen[p];
	}
	if (r)
		r->ended_here = true;
	for (unsigned i = 0; i < n->feedback_count; i++)
		if (!strcmp(n->feedback[i]->job, job))
			feedback_drop(n, i--);
	snprintf(f.u.job, sizeof(f.u.job), "%s", job);
	post_lanes(n, &f, 0);
	if (j)
		memset(j, 0, sizeof(*j));
	name_set_open(n, job, false);
	if (peer_log_now(n->logs, n->self, LOG_JOB_ENDED, gg_node_loop(n)->now_us))
		gg_log(GG_LOG_INFO, "job_ended", "job=%s", job);
}

void gg_node_shutdown(struct gg_node *n)
{
	gg_node_stop_steps(n);
	n->closing = true;
	post_shutdown(n);
	gg_lane_mail(&n->lanes[0]);
}

bool gg_node_flushed(const struct gg_node *n)
{
	for (unsigned l = 0; l <= n->nlanes; l++)
		if (!atomic_load(&n->lanes[l].flushed))
			return false;
	for (unsigned i = 0; i < MAX_JOBS; i++)
		if (n->jobs[i].ending)
			return false;
	return true;
}

bool gg_node_idle(const struct gg_node *n)
{
	for (unsigned l = 0; l <= n->nlanes; l++)
		if (!atomic_load(&n->lanes[l].idle))
			return false;
	for (unsigned i = 0; i < MAX_JOBS; i++)
		if (n->jobs[i].step)
			return false;
	return true;
}

const struct gg_node_stats *gg_node_stats(const struct gg_node *n)
{
	return &n->stats;
}

static int by_name(const void *a, const void *b)
{
	return strcmp(a, b);
}

/* The lanes a node runs: [site] threads, but no more than there are
 * streams to each peer, for a lane sends only on streams of its own. */
static unsigned lane_count(const struct gg_config *cfg)
{
	unsigned w = cfg->site.threads > 0 ? (unsigned)cfg->site.threads : 1;

	return GG_MIN(w, (unsigned)cfg->transport.streams_per_peer);
}

/* The TLS options of the gateway. Its peers' identities, which its own
 * certificate may not carry, go into `peers` (GG_MAX_PEERS). */
_Static_assert(GG_MAX_PEERS <= GG_TLS_MAX_SITES, "a TLS context takes every peer");
static int tls_options(const struct gg_config *cfg, struct gg_tls_site *peers, struct gg_tls_options *o, char *err,
		       size_t err_size)
{
	const char *why;

	for (size_t i = 0; i < cfg->peer_count; i++)
		if (gg_tls_site_init(&peers[i], cfg->peers[i].site, cfg->peers[i].identity, &why))
			return gg_errf(err, err_size, -EINVAL, "peer %s: identity %s: %s", cfg->peers[i].site,
				       cfg->peers[i].identity, why);
	*o = (struct gg_tls_options){ .ca_file = cfg->tls.ca, .cert_file = cfg->tls.cert, .key_file = cfg->tls.key,
				      .crl_file = cfg->tls.crl, .ciphersuites = cfg->tls.ciphersuites,
				      .groups = cfg->tls.groups, .peers = peers, .peer_count = cfg->peer_count };
	return 0;
}

uint64_t gg_node_fingerprint(const struct gg_config *cfg, const struct gg_wire_step *ws, uint8_t algorithm,
			     uint32_t chunk_elems)
{
	const enum gg_codec codec = cfg->compression.codec;
	const uint32_t block = gg_codec_has_blocks(codec) ? (uint32_t)cfg->compression.block_size : 0;

	return gg_wire_fingerprint(ws, (uint8_t)codec, block, algorithm, chunk_elems);
}

/* The listen address resolves and is one of this host's. */
static int check_listen(const struct gg_config *cfg, char *err, size_t err_size)
{
	struct sockaddr_storage ss;
	socklen_t len;
	const char *why;

	if (gg_net_addr_parse(cfg->site.listen, &ss, &len, &why))
		return gg_errf(err, err_size, -EINVAL, "[site] listen \"%s\": %s", cfg->site.listen, why);
	int rc = gg_net_addr_is_local((struct sockaddr *)&ss, len, &why);
	return rc ? gg_errf(err, err_size, rc, "[site] listen \"%s\": %s", cfg->site.listen, why) : 0;
}

int gg_node_check_host(const struct gg_config *cfg, struct gg_config_pos *at, char *err, size_t err_size)
{
	struct gg_tls_site peers[GG_MAX_PEERS];
	struct gg_tls_options to;
	struct gg_tls_context *tls;
	int rc;

	*at = (struct gg_config_pos){ 0, 0 };
	if ((rc = tls_options(cfg, peers, &to, err, err_size)) || (rc = gg_tls_context_new(&to, &tls, err, err_size)))
		return rc;
	gg_tls_context_free(tls);
	*at = cfg->at.congestion_control;
	if (cfg->transport.congestion_control &&
	    (rc = gg_net_check_congestion(cfg->transport.congestion_control, err, err_size)))
		return rc;
	*at = cfg->at.listen;
	return check_listen(cfg, err, err_size);
}

int gg_node_new(const struct gg_config *cfg, struct gg_node **out, char *err, size_t err_size)
{
	struct gg_node *n = calloc(1, sizeof(*n));
	char name[16];
	int rc;

	*out = NULL;
	if (!n)
		return -ENOMEM;
	n->cfg = cfg;
	n->inbox.efd = -1;
	pthread_mutex_init(&n->start_lock, NULL);
	pthread_mutex_init(&n->down_lock, NULL);
	pthread_cond_init(&n->started, NULL);
	pthread_cond_init(&n->let_go, NULL);
	n->sites = (unsigned)cfg->peer_count + 1;
	snprintf(n->names[0], sizeof(n->names[0]), "%s", cfg->site.name);
	for (size_t i = 0; i < cfg->peer_count; i++)
		snprintf(n->names[i + 1], sizeof(n->names[0]), "%s", cfg->peers[i].site);
	qsort(n->names, n->sites, sizeof(n->names[0]), by_name);
	for (unsigned i = 0; i < n->sites; i++)
		if (!strcmp(n->names[i], cfg->site.name))
			n->self = i;
	n->name_runs_cap = NAME_RUNS_KEPT + (unsigned)GG_MAX(cfg->limits.max_clients, 0);
	if (!(n->name_runs = calloc(n->name_runs_cap, sizeof(*n->name_runs)))) {
		rc = gg_errf(err, err_size, -ENOMEM, "out of memory for the job names' records");
		goto fail;
	}
	n->all_streams = cfg->transport.streams_per_peer >= 64 ? UINT64_MAX
							      : ((uint64_t)1 << cfg->transport.streams_per_peer) - 1;

	n->chunk_elems = gg_node_chunk_elems(cfg);
	n->feedback_max = FEEDBACK_TENSORS_MAX;
	n->frame_cfg = (struct gg_frame_config){ .codec = gg_codec_defaults(cfg->compression.codec),
						 .zstd = cfg->compression.zstd_level > 0,
						 .zstd_level = cfg->compression.zstd_level > 0 ? cfg->compression.zstd_level : 1,
						 .max_elems = n->chunk_elems };
	if (gg_codec_has_blocks(cfg->compression.codec)) {
		n->frame_cfg.codec.block_elems = (uint32_t)cfg->compression.block_size;
		n->frame_cfg.codec.scale = cfg->compression.scale;
	}
	uint64_t bound;
	if ((rc = gg_frame_bound(&n->frame_cfg.codec, n->chunk_elems, &bound))) {
		gg_errf(err, err_size, -EINVAL, "codec %s with block size %d: %s", gg_codec_name(cfg->compression.codec),
			cfg->compression.block_size, strerror(-rc));
		goto fail;
	}
	n->frame_limits = (struct gg_frame_limits){ .max_elems = n->chunk_elems, .max_raw_bytes = bound };
	/* One pool for the frames a site sends and the DATA it receives (a
	 * frame and its message head): enough for what the streams keep
	 * queued (ar_may_encode), in flight and early, a few dozen megabytes
	 * at the default chunk size and at most a sixteenth of [limits]
	 * memory; an idle node lets them go. Under auto, the pools of the
	 * smaller chunks hang off it, each kept to half the budget of the one
	 * above, so that all of them keep less than an eighth. */
	n->max_payload = GG_WIRE_DATA_FIXED_BYTES + bound;
	unsigned pool_max = (unsigned)GG_MIN((uint64_t)64, cfg->limits.memory_bytes / 16 / n->max_payload);
	gg_buf_pool_init(&n->frames, n->max_payload, pool_max);
	if (cfg->allreduce.algorithm == GG_ALLREDUCE_AUTO) {
		uint32_t sizes[GG_ARRAY_LEN(n->frame_classes)];
		unsigned classes = gg_ar_auto_chunk_sizes(n->chunk_elems, sizes, GG_ARRAY_LEN(sizes));
		struct gg_buf_pool *larger = &n->frames;
		for (unsigned i = 0; i < classes; i++) {
			const uint32_t c = sizes[i];
			struct gg_buf_pool *p = &n->frame_classes[i];
			if ((rc = gg_frame_bound(&n->frame_cfg.codec, c, &bound))) {
				gg_errf(err, err_size, -EINVAL, "frames of %u elements: %s", c, strerror(-rc));
				goto fail;
			}
			gg_buf_pool_init(p, GG_WIRE_DATA_FIXED_BYTES + bound,
					 (unsigned)GG_MIN((uint64_t)64, (cfg->limits.memory_bytes / 16 >> (i + 1)) /
									(GG_WIRE_DATA_FIXED_BYTES + bound)));
			larger->smaller = p;
			larger = p;
		}
	}

	n->hello = (struct gg_wire_hello){ .streams = (uint16_t)cfg->transport.streams_per_peer,
					   .sites = (uint8_t)n->sites,
					   .codec = (uint8_t)cfg->compression.codec,
					   .scale = (uint8_t)n->frame_cfg.codec.scale,
					   .block_elems = n->frame_cfg.codec.block_elems,
					   .algorithm = (uint8_t)cfg->allreduce.algorithm,
					   .chunk_elems = n->chunk_elems,
					   .zstd = cfg->compression.zstd_level > 0,
					   .inflight_bytes = cfg->limits.inflight_bytes_per_peer };
	memcpy(n->hello.site_names, n->names, sizeof(n->names));
	int urandom = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
	if (urandom < 0 || read(urandom, &n->hello.instance_id, sizeof(n->hello.instance_id)) != 8) {
		if (urandom >= 0)
			close(urandom);
		rc = gg_errf(err, err_size, -EINVAL, "cannot read /dev/urandom for the instance id");
		goto fail;
	}
	close(urandom);
	n->hello.instance_id |= 1; /* never 0, which means "not seen yet" */
	/* Lane 0 and the coordinator run on the thread that turns the node,
	 * which is the one that makes it. */
	gg_log_set_thread_site(n->names[n->self]);
	struct timespec wall;
	clock_gettime(CLOCK_REALTIME, &wall);
	n->next_run = (uint64_t)wall.tv_sec * 1000000u + (uint64_t)wall.tv_nsec / 1000u + 1;

	struct gg_tls_site peers[GG_MAX_PEERS];
	struct gg_tls_options to;
	if ((rc = tls_options(cfg, peers, &to, err, err_size)) || (rc = gg_tls_context_new(&to, &n->tls, err, err_size)))
		goto fail;
	if ((rc = gg_resolver_new(&n->resolver))) {
		gg_errf(err, err_size, rc, "out of memory for the host name resolver");
		goto fail;
	}
	if (cfg->transport.congestion_control &&
	    (rc = gg_net_check_congestion(cfg->transport.congestion_control, err, err_size)))
		goto fail;

	n->nlanes = lane_count(cfg);
	n->lanes = calloc(n->nlanes + 1, sizeof(*n->lanes));
	if (!n->lanes) {
		rc = gg_errf(err, err_size, -ENOMEM, "no memory for %u lanes", n->nlanes);
		goto fail;
	}
	for (unsigned l = 0; l <= n->nlanes; l++) {
		n->lanes[l].node = n;
		n->lanes[l].index = l;
		n->lanes[l].inbox.efd = -1;
		atomic_init(&n->lanes[l].flushed, true);
		atomic_init(&n->lanes[l].idle, false);
		if ((rc = gg_mailbox_init(&n->lanes[l].inbox))) {
			gg_errf(err, err_size, rc, "cannot make the mailbox of lane %u: %s", l, strerror(-rc));
			goto fail;
		}
	}
	/* The coordinator and lane 0 run on the caller's thread. */
	if ((rc = gg_mailbox_init(&n->inbox))) {
		gg_errf(err, err_size, rc, "cannot make the coordinator's mailbox: %s", strerror(-rc));
		goto fail;
	}
	if ((rc = gg_lane_init(&n->lanes[0]))) {
		gg_errf(err, err_size, rc, "%s", n->lanes[0].start_err);
		goto fail;
	}
	if ((rc = gg_mailbox_arm(&n->inbox, &n->lanes[0].loop, gg_loop_ud(KIND_COORD_MAIL, 0, 0)))) {
		gg_errf(err, err_size, rc, "cannot arm the coordinator's mailbox: %s", strerror(-rc));
		goto fail;
	}
	/* Lanes 1.. and the acceptor: each makes its own ring, which only its
	 * thread may use. */
	for (unsigned l = 1; l <= n->nlanes; l++) {
		pthread_mutex_lock(&n->start_lock);
		n->lanes_starting++;
		pthread_mutex_unlock(&n->start_lock);
		if ((rc = -pthread_create(&n->lanes[l].thread, NULL, gg_lane_main, &n->lanes[l]))) {
			pthread_mutex_lock(&n->start_lock);
			n->lanes_starting--;
			pthread_mutex_unlock(&n->start_lock);
			gg_errf(err, err_size, rc, "cannot start the thread of %s: %s", gg_lane_name(n, l, name),
				strerror(-rc));
			goto fail;
		}
		n->lanes[l].has_thread = true;
		pthread_setname_np(n->lanes[l].thread, gg_lane_name(n, l, name));
	}
	pthread_mutex_lock(&n->start_lock);
	while (n->lanes_starting)
		pthread_cond_wait(&n->started, &n->start_lock);
	pthread_mutex_unlock(&n->start_lock);
	for (unsigned l = 1; l <= n->nlanes; l++) {
		if ((rc = n->lanes[l].start_rc)) {
			gg_errf(err, err_size, rc, "%s", n->lanes[l].start_err);
			goto fail;
		}
	}
	*out = n;
	return 0;
fail:
	gg_node_free(n);
	return rc ? rc : -EINVAL;
}

void gg_node_free(struct gg_node *n)
{
	if (!n)
		return;
	/* The acceptor stops first: a stream it hands over until then reaches
	 * a lane that still runs, and is freed with that lane's mail. */
	let_lanes_go(n, &n->acceptor_stop);
	if (n->lanes && n->lanes[n->nlanes].has_thread) {
		gg_mailbox_wake(&n->lanes[n->nlanes].inbox);
		pthread_join(n->lanes[n->nlanes].thread, NULL);
	}
	let_lanes_go(n, &n->lanes_stop);
	for (unsigned l = 1; l < n->nlanes && n->lanes; l++) {
		if (!n->lanes[l].has_thread)
			continue;
		gg_mailbox_wake(&n->lanes[l].inbox);
		pthread_join(n->lanes[l].thread, NULL);
	}
	if (n->lanes) {
		gg_lane_fini(&n->lanes[0]);
		for (unsigned l = 0; l <= n->nlanes; l++)
			gg_mailbox_fini(&n->lanes[l].inbox);
	}
	free(n->lanes);
	for (struct gg_mail *g = gg_mailbox_take(&n->inbox), *next; g; g = next) {
		next = g->next;
		free(g);
	}
	gg_mailbox_fini(&n->inbox);
	while (n->feedback_count)
		feedback_drop(n, n->feedback_count - 1);
	gg_node_gpu_frees(n, true);
	free(n->feedback);
	free(n->name_runs);
	gg_buf_pool_fini(&n->frames);
	gg_tls_context_free(n->tls);
	gg_resolver_free(n->resolver);
	pthread_mutex_destroy(&n->start_lock);
	pthread_mutex_destroy(&n->down_lock);
	pthread_cond_destroy(&n->started);
	pthread_cond_destroy(&n->let_go);
	free(n);
}
