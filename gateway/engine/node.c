#include "node.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "allreduce.h"
#include "log.h"
#include "mesh.h"
#include "units.h"

#define MAX_JOBS 32
#define CTRL_MSG_MAX 1024    /* every message but DATA fits */
#define POOL_IDLE_US 5000000 /* an idle node gives its cached buffers back after this */

/* A frame for a step that has not started here yet: the received message,
 * kept as it arrived. */
struct early {
	struct early *next;
	unsigned from;
	uint64_t seq;
	struct gg_wire_step wstep;
	struct gg_ar_chunk_id id;
	struct gg_buf *msg;   /* the DATA payload the frame lies in */
	const uint8_t *frame;
	size_t frame_len;
};

struct job {
	struct gg_node *node;
	bool used;
	char name[GG_WIRE_NAME_MAX + 1];
	uint64_t last_seq;      /* last step started */
	uint64_t active_us;     /* when a step last started or ended */
	struct gg_node_step *step; /* in progress, or NULL */
	struct gg_wire_step wstep;
	struct gg_ar_step *ar;
	uint64_t deadline_us;
	bool has_result;        /* the step's result is whole here (DONE sent) */
	uint32_t done_from;     /* sites that said DONE for the step, by bit */
	uint64_t aborted_seq;   /* a peer aborted this step before it started here */
	char abort_reason[GG_NODE_ERROR_MAX];
	struct early *early;
};

struct feedback_slot {
	char job[GG_WIRE_NAME_MAX + 1];
	uint32_t tensor_id;
	struct gg_feedback fb;
};

struct gg_node {
	const struct gg_config *cfg;
	unsigned sites, self;
	char names[GG_AR_MAX_SITES][GG_WIRE_NAME_MAX + 1];
	struct gg_tls_context *tls;
	struct gg_loop loop;
	struct gg_mesh *mesh;
	struct job jobs[MAX_JOBS];
	/* Error feedback, one slot per (job, tensor), each allocated on its own
	 * (steps hold pointers to them); residuals bounded by [limits] memory. */
	struct feedback_slot **feedback;
	unsigned feedback_count, feedback_cap;
	uint64_t feedback_bytes;
	uint32_t chunk_elems;
	struct gg_frame_encoder enc;
	struct gg_frame_decoder dec;
	struct gg_buf_pool frames; /* frames sent and messages received */
	struct gg_node_stats stats;
	uint64_t next_us;          /* the earliest deadline of the mesh and the steps */
	bool shutting_down;
	bool test_freeze_at_result; /* gg_node_test_freeze_at_result() */
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

const char *gg_node_site_name(const struct gg_node *n, unsigned index)
{
	return index < n->sites ? n->names[index] : "?";
}

unsigned gg_node_self(const struct gg_node *n)
{
	return n->self;
}

struct gg_loop *gg_node_loop(struct gg_node *n)
{
	return &n->loop;
}

/* ---- steps ---------------------------------------------------------------- */

static void send_abort(struct gg_node *n, const struct job *j, uint64_t seq, const char *reason);
static void drop_early(struct gg_node *n, struct job *j, uint64_t from_seq, uint64_t to_seq);

static void early_free(struct early *e)
{
	gg_buf_put(e->msg);
	free(e);
}
/* Ends the job's step: calls done and forgets the step's frames. */
static void finish_step(struct gg_node *n, struct job *j, int status, const char *message)
{
	struct gg_node_step *st = j->step;

	if (!st)
		return;
	j->step = NULL;
	j->active_us = n->loop.now_us;
	gg_ar_step_free(j->ar);
	j->ar = NULL;
	if (status) {
		n->stats.steps_failed++;
		gg_log(GG_LOG_ERROR, "step_failed", "job=%s step=%llu reason=\"%s\"", j->name,
		       (unsigned long long)st->seq, message);
	} else {
		n->stats.steps_done++;
	}
	/* Frames of a finished step that peers never acknowledged are no
	 * longer worth re-sending. */
	if (status)
		gg_mesh_forget_step(n->mesh, j->name, st->seq);
	drop_early(n, j, 0, st->seq);
	st->done(st->arg, st, status, message);
}

static void fail_step_code(struct gg_node *n, struct job *j, int code, const char *fmt, ...) GG_PRINTF(4, 5);
static void fail_step_code(struct gg_node *n, struct job *j, int code, const char *fmt, ...)
{
	char msg[GG_NODE_ERROR_MAX];
	va_list ap;

	if (!j->step)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	send_abort(n, j, j->step->seq, msg);
	finish_step(n, j, code, msg);
}

#define fail_step(n, j, ...) fail_step_code(n, j, -EIO, __VA_ARGS__)

/* True when the job holds nothing: no step, no early frames, no DATA of
 * its own waiting to be sent or acknowledged. */
static bool job_idle(const struct gg_node *n, const struct job *j)
{
	return !j->step && !j->early && !gg_mesh_holds_job(n->mesh, j->name);
}

/* Frees feedback slot i; the last slot takes its place. */
static void feedback_drop(struct gg_node *n, unsigned i)
{
	struct feedback_slot *f = n->feedback[i];

	n->feedback_bytes -= f->fb.elems * sizeof(float);
	gg_feedback_fini(&f->fb);
	free(f);
	n->feedback[i] = n->feedback[--n->feedback_count];
}

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
		/* Nothing tells the node that a job ended, so a slot is taken
		 * back when needed: from the job idle longest. */
		for (unsigned i = 0; i < MAX_JOBS; i++)
			if (job_idle(n, &n->jobs[i]) && (!free_slot || n->jobs[i].active_us < free_slot->active_us))
				free_slot = &n->jobs[i];
		if (!free_slot)
			return NULL;
		gg_log(GG_LOG_INFO, "job_forgotten", "job=%s last_step=%llu reason=\"its slot went to job %s\"",
		       free_slot->name, (unsigned long long)free_slot->last_seq, name);
		for (unsigned i = 0; i < n->feedback_count; i++)
			if (!strcmp(n->feedback[i]->job, free_slot->name))
				feedback_drop(n, i--);
	}
	memset(free_slot, 0, sizeof(*free_slot));
	free_slot->active_us = n->loop.now_us;
	free_slot->node = n;
	free_slot->used = true;
	snprintf(free_slot->name, sizeof(free_slot->name), "%s", name);
	return free_slot;
}

/* The error feedback of one tensor of a job, made on its first step.
 * Returns 0 with *out, or a negative errno with err saying why. */
static int feedback_for(struct gg_node *n, const char *job, uint32_t tensor, uint64_t count,
			struct gg_feedback **out, char *err, size_t err_size)
{
	const uint64_t limit = n->cfg->limits.memory_bytes;

	for (unsigned i = 0; i < n->feedback_count; i++) {
		struct feedback_slot *f = n->feedback[i];
		if (f->tensor_id != tensor || strcmp(f->job, job))
			continue;
		if (f->fb.elems == count) {
			*out = &f->fb;
			return 0;
		}
		feedback_drop(n, i); /* the tensor changed size: start afresh */
		break;
	}
	if (count * sizeof(float) > limit - n->feedback_bytes) {
		char a[32], b[32];
		return gg_errf(err, err_size, -ENOSPC,
			       "error feedback for tensor %u (%llu elements) does not fit: the residuals of %u "
			       "tensors take %s of [limits] memory = %s; raise it, or set [compression] "
			       "error_feedback = false",
			       tensor, (unsigned long long)count, n->feedback_count,
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
	if (!f || gg_feedback_init(&f->fb, count, GG_MIN(count, (uint64_t)n->chunk_elems))) {
		free(f);
		return gg_errf(err, err_size, -ENOMEM, "no memory for the error feedback of tensor %u (%llu elements)",
			       tensor, (unsigned long long)count);
	}
	f->tensor_id = tensor;
	snprintf(f->job, sizeof(f->job), "%s", job);
	n->feedback[n->feedback_count++] = f;
	n->feedback_bytes += count * sizeof(float);
	*out = &f->fb;
	return 0;
}

/* ---- sending -------------------------------------------------------------- */

/* The step engine's send: DATA for one peer, queued behind the window. */
static int ar_send(void *ctx, unsigned to, const struct gg_ar_chunk_id *id, struct gg_buf *frame)
{
	struct job *j = ctx;
	struct gg_node *n = j->node;
	int rc = gg_mesh_send_data(n->mesh, to, &j->wstep, id, frame);

	if (rc)
		return rc;
	n->stats.data_bytes_out += frame->len;
	uint64_t elems = 0; /* the frame header's element count (frame.h: bytes 8-15, little-endian) */
	for (int b = 7; b >= 0; b--)
		elems = elems << 8 | frame->data[8 + b];
	n->stats.raw_bytes_out += elems * sizeof(float);
	return 0;
}

/* The step engine may encode another chunk of its own while no peer has
 * more than two chunks per stream queued ahead of its sockets: enough to
 * keep every stream busy, few enough that encoding keeps pace with the
 * network and few frames are alive at once. */
static bool ar_may_encode(void *ctx)
{
	const struct job *j = ctx;
	const struct gg_node *n = j->node;
	const int S = n->cfg->transport.streams_per_peer;
	const unsigned limit = 2u * (unsigned)S;

	for (unsigned p = 0; p < n->sites; p++)
		if (p != n->self && gg_mesh_queued(n->mesh, p, limit) >= limit)
			return false;
	return true;
}

static void ar_gather(void *ctx, uint64_t offset, uint64_t n)
{
	const struct job *j = ctx;

	if (j->step->gather)
		j->step->gather(j->step->arg, offset, n);
}

static void ar_deliver(void *ctx, uint64_t offset, uint64_t n)
{
	const struct job *j = ctx;

	if (j->step->deliver)
		j->step->deliver(j->step->arg, offset, n);
}

static const struct gg_ar_ops ar_ops = { ar_send, ar_may_encode, ar_gather, ar_deliver };

static void send_abort(struct gg_node *n, const struct job *j, uint64_t seq, const char *reason)
{
	uint8_t buf[CTRL_MSG_MAX];
	ssize_t len = gg_wire_encode_abort(buf, sizeof(buf), j->name, seq, reason);

	for (unsigned p = 0; p < n->sites && len > 0; p++)
		if (p != n->self)
			gg_mesh_send_control(n->mesh, p, buf, (size_t)len, false);
}

/* DONE for the job's step to peer `only` (every peer when -1), on every
 * ready stream: one cut after the message was queued must not lose it, and
 * a second copy changes nothing. */
static void send_done(struct gg_node *n, const struct job *j, int only)
{
	uint8_t buf[CTRL_MSG_MAX];
	ssize_t len = gg_wire_encode_done(buf, sizeof(buf), j->name, j->step->seq);

	for (unsigned p = 0; p < n->sites && len > 0; p++)
		if (p != n->self && (only < 0 || p == (unsigned)only))
			gg_mesh_send_control(n->mesh, p, buf, (size_t)len, true);
}

/* Completes the step once its result is whole here and every other site
 * said DONE: a step completes at every site or, when a site fails it
 * first (ABORT), at none. */
static void maybe_complete(struct gg_node *n, struct job *j)
{
	if (!j->step || !j->has_result)
		return;
	for (unsigned p = 0; p < n->sites; p++)
		if (p != n->self && !(j->done_from & (1u << p)))
			return;
	finish_step(n, j, 0, NULL);
}

static void step_has_result(struct gg_node *n, struct job *j)
{
	if (n->test_freeze_at_result)
		return;
	if (!j->has_result) {
		j->has_result = true;
		send_done(n, j, -1);
	}
	maybe_complete(n, j);
}

static void feed_frame(struct gg_node *n, struct job *j, unsigned from, const struct gg_wire_step *ws,
		       const struct gg_ar_chunk_id *id, const uint8_t *frame, size_t len)
{
	char err[GG_AR_ERROR_MAX];

	if (ws->fingerprint != j->wstep.fingerprint) {
		fail_step(n, j,
			  "step %llu of job '%s': site %s announced tensor %u with %llu elements (dtype %u), "
			  "this site tensor %u with %llu elements (dtype %u)",
			  (unsigned long long)j->wstep.step, j->name, n->names[from], ws->tensor_id,
			  (unsigned long long)ws->count, ws->dtype, j->wstep.tensor_id,
			  (unsigned long long)j->wstep.count, j->wstep.dtype);
		return;
	}
	double t0 = now_s();
	int rc = gg_ar_step_on_frame(j->ar, from, id, frame, len, err, sizeof(err));
	n->stats.decode_s += now_s() - t0;
	if (rc < 0) {
		fail_step(n, j, "step %llu of job '%s': %s (site index %u is %s)", (unsigned long long)j->wstep.step,
			  j->name, err, from, n->names[from]);
		return;
	}
	n->stats.data_bytes_in += len;
	if (gg_ar_step_done(j->ar))
		step_has_result(n, j);
}

int gg_node_submit(struct gg_node *n, struct gg_node_step *st, char *err, size_t err_size)
{
	char why[GG_AR_ERROR_MAX];
	struct job *j;

	if (n->shutting_down)
		return gg_errf(err, err_size, -EINVAL, "the gateway is shutting down");
	if (!st->job[0] || st->count == 0)
		return gg_errf(err, err_size, -EINVAL, "a step needs a job name and at least one element");
	if (st->count * sizeof(float) > n->cfg->limits.max_message_bytes)
		return gg_errf(err, err_size, -EINVAL, "%llu elements exceed [limits] max_message", (unsigned long long)st->count);
	j = find_job(n, st->job, true);
	if (!j)
		return gg_errf(err, err_size, -EINVAL, "too many jobs (at most %d)", MAX_JOBS);
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

	struct gg_wire_step ws = { .step = st->seq, .count = st->count, .tensor_id = st->tensor_id, .dtype = st->dtype };
	snprintf(ws.job, sizeof(ws.job), "%s", st->job);
	ws.fingerprint = gg_wire_fingerprint(&ws, (uint8_t)n->cfg->compression.codec,
					     (uint32_t)n->cfg->compression.block_size);
	struct gg_feedback *fb = NULL;
	if (n->cfg->compression.error_feedback && gg_codec_is_lossy(n->cfg->compression.codec)) {
		char fwhy[GG_NODE_ERROR_MAX - 64];
		int rc = feedback_for(n, st->job, st->tensor_id, st->count, &fb, fwhy, sizeof(fwhy));
		if (rc)
			return gg_errf(err, err_size, rc, "step %llu of job '%s': %s", (unsigned long long)st->seq,
				       st->job, fwhy);
	}
	j->step = st;
	j->has_result = false;
	j->done_from = 0;
	j->wstep = ws;
	j->last_seq = st->seq;
	j->active_us = n->loop.now_us;
	j->deadline_us = n->loop.now_us + n->cfg->transport.step_timeout_us;

	struct gg_ar_config ac = { .sites = n->sites, .self = n->self, .algo = n->cfg->allreduce.algorithm,
				   .count = st->count, .chunk_elems = n->chunk_elems, .enc = &n->enc, .dec = &n->dec,
				   .feedback = fb, .pool = &n->frames };
	double t0 = now_s();
	int rc = gg_ar_step_start(&j->ar, &ac, st->input, st->result, &ar_ops, j, why, sizeof(why));
	n->stats.encode_s += now_s() - t0;
	if (rc) {
		j->step = NULL;
		drop_early(n, j, 0, st->seq);
		return gg_errf(err, err_size, -EINVAL, "step %llu of job '%s': %s", (unsigned long long)st->seq, j->name,
			       why);
	}
	if (j->aborted_seq == st->seq) {
		char reason[GG_NODE_ERROR_MAX];
		snprintf(reason, sizeof(reason), "%s", j->abort_reason);
		finish_step(n, j, -EIO, reason);
		return 0;
	}
	/* Frames that arrived before this site started the step. Feeding one
	 * may finish the step, whose done() may free st and even submit the
	 * job's next step, and drop_early() may free entries: so check by
	 * step number, and scan again from the head after each frame. */
	const uint64_t seq = st->seq;
	struct early **pp = &j->early;
	while (j->step && j->step->seq == seq && *pp) {
		struct early *e = *pp;
		if (e->seq != seq) {
			pp = &e->next;
			continue;
		}
		*pp = e->next;
		feed_frame(n, j, e->from, &e->wstep, &e->id, e->frame, e->frame_len);
		gg_mesh_ack(n->mesh, e->from, j->name, e->seq, &e->id);
		early_free(e);
		pp = &j->early;
	}
	if (j->step && j->step->seq == seq && gg_ar_step_done(j->ar))
		step_has_result(n, j);
	return 0;
}

/* ---- receiving ------------------------------------------------------------ */

/* Frames that waited for steps from_seq..to_seq, which are over without
 * them (aborted, or refused): acknowledged, so their senders stop keeping
 * them. */
static void drop_early(struct gg_node *n, struct job *j, uint64_t from_seq, uint64_t to_seq)
{
	struct early **pp = &j->early;

	while (*pp) {
		struct early *e = *pp;
		if (e->seq < from_seq || e->seq > to_seq) {
			pp = &e->next;
			continue;
		}
		*pp = e->next;
		gg_mesh_ack(n->mesh, e->from, j->name, e->seq, &e->id);
		early_free(e);
	}
}

static bool same_chunk(const struct gg_ar_chunk_id *a, const struct gg_ar_chunk_id *b)
{
	return a->phase == b->phase && a->origin == b->origin && a->chunk == b->chunk;
}

static void on_data(void *owner, unsigned from, const struct gg_wire_msg *m, struct gg_buf *payload)
{
	struct gg_node *n = owner;
	const struct gg_wire_step *ws = &m->u.data.step;
	struct job *j = find_job(n, ws->job, true);

	if (!j) {
		gg_log(GG_LOG_WARN, "data_dropped", "site=%s job=%s reason=\"too many jobs\"", n->names[from], ws->job);
		return;
	}
	if (j->step && ws->step == j->step->seq) {
		feed_frame(n, j, from, ws, &m->u.data.id, m->u.data.frame, m->u.data.frame_bytes);
		gg_mesh_ack(n->mesh, from, ws->job, ws->step, &m->u.data.id);
		return;
	}
	if (ws->step <= j->last_seq) {
		/* A step already finished or failed here: a re-send, or data of a
		 * step this site aborted. Acknowledge so the peer lets it go. */
		gg_mesh_ack(n->mesh, from, ws->job, ws->step, &m->u.data.id);
		return;
	}
	/* Not started here yet: keep it unacknowledged, so the peer's window
	 * bounds how much waits. */
	for (struct early *e = j->early; e; e = e->next)
		if (e->seq == ws->step && e->from == from && same_chunk(&e->id, &m->u.data.id))
			return;
	struct early *e = malloc(sizeof(*e));
	if (!e)
		return;
	gg_buf_get(payload);
	*e = (struct early){ .from = from, .seq = ws->step, .wstep = *ws, .id = m->u.data.id, .msg = payload,
			     .frame = m->u.data.frame, .frame_len = m->u.data.frame_bytes };
	e->next = j->early;
	j->early = e;
	/* The ACK goes out when the step consumes it. */
}

static void on_abort(struct gg_node *n, unsigned from, const struct gg_wire_msg *m)
{
	const char *site = n->names[from];
	struct job *j = find_job(n, m->u.abort.job, true);

	if (!j)
		return;
	if (j->step && j->step->seq == m->u.abort.step) {
		char msg[GG_NODE_ERROR_MAX];
		snprintf(msg, sizeof(msg), "site %s aborted step %llu of job '%s': %s", site,
			 (unsigned long long)m->u.abort.step, j->name, m->u.abort.reason);
		finish_step(n, j, -EIO, msg);
	} else if (m->u.abort.step > j->last_seq) {
		/* This site may never run that step: the frames it holds for it
		 * would pin the peer's window for good. */
		drop_early(n, j, m->u.abort.step, m->u.abort.step);
		j->aborted_seq = m->u.abort.step;
		snprintf(j->abort_reason, sizeof(j->abort_reason), "site %s aborted step %llu of job '%s': %s", site,
			 (unsigned long long)m->u.abort.step, j->name, m->u.abort.reason);
	}
}

static void on_done(struct gg_node *n, unsigned from, const struct gg_wire_msg *m)
{
	struct job *j = find_job(n, m->u.done.job, false);

	/* A DONE for a step not in progress here is stale: this site failed
	 * or completed it (which needed this DONE, so it was a copy). */
	if (!j || !j->step || j->step->seq != m->u.done.step)
		return;
	j->done_from |= 1u << from;
	maybe_complete(n, j);
}

static void on_control(void *owner, unsigned from, const struct gg_wire_msg *m)
{
	if (m->type == GG_WIRE_ABORT)
		on_abort(owner, from, m);
	else
		on_done(owner, from, m);
}

/* Every step in progress fails: `p` restarted and lost them. */
static void on_peer_restarted(void *owner, unsigned p)
{
	struct gg_node *n = owner;

	for (unsigned i = 0; i < MAX_JOBS; i++) {
		struct job *j = &n->jobs[i];
		if (j->used && j->step)
			fail_step(n, j, "step %llu of job '%s': site %s restarted and lost the step",
				  (unsigned long long)j->step->seq, j->name, n->names[p]);
	}
}

/* A new stream may carry a DONE a lost one did not. */
static void on_stream_ready(void *owner, unsigned p)
{
	struct gg_node *n = owner;

	for (unsigned i = 0; i < MAX_JOBS; i++)
		if (n->jobs[i].used && n->jobs[i].step && n->jobs[i].has_result)
			send_done(n, &n->jobs[i], (int)p);
}

static const struct gg_mesh_ops mesh_ops = { on_data, on_control, on_peer_restarted, on_stream_ready };

/* ---- the loop ------------------------------------------------------------- */

struct cqe_ctx {
	struct gg_node *n;
	gg_node_cqe_fn *other;
	void *arg;
};

static void on_cqe(void *arg, const struct io_uring_cqe *cqe)
{
	struct cqe_ctx *x = arg;

	if (gg_loop_ud_kind(cqe->user_data) >= GG_OP_USER) {
		if (x->other)
			x->other(x->arg, cqe);
		return;
	}
	gg_mesh_on_cqe(x->n->mesh, cqe);
}

/* " (no connection to site X, site Y)" for peers with no stream up, or "":
 * when a site is gone, what a step waits for may be held up by it rather
 * than by the site the step waits on. */
static void unreachable_peers(const struct gg_node *n, char *buf, size_t size)
{
	size_t len = 0;

	buf[0] = '\0';
	for (unsigned p = 0; p < n->sites && len < size; p++)
		if (!gg_mesh_peer_up(n->mesh, p))
			len += (size_t)snprintf(buf + len, size - len, "%s site %s", len ? "," : " (no connection to",
						n->names[p]);
	if (len && len < size)
		snprintf(buf + len, size - len, ")");
}

/* Fails the job's step, which missed its deadline, naming what it waits for. */
static void step_missed_deadline(struct gg_node *n, struct job *j)
{
	const struct gg_config *cfg = n->cfg;
	unsigned from;
	struct gg_ar_chunk_id id;
	char buf[32], down[GG_AR_MAX_SITES * (GG_WIRE_NAME_MAX + 8) + 32];

	unreachable_peers(n, down, sizeof(down));
	if (j->has_result) {
		char waiting[GG_AR_MAX_SITES * (GG_WIRE_NAME_MAX + 2) + 1] = "";
		size_t len = 0;
		for (unsigned p = 0; p < n->sites; p++)
			if (p != n->self && !(j->done_from & (1u << p)))
				len += (size_t)snprintf(waiting + len, sizeof(waiting) - len, "%s%s", len ? ", " : "",
							n->names[p]);
		fail_step_code(n, j, -ETIMEDOUT,
			       "step %llu of job '%s' missed its %s deadline: this site had the result, but "
			       "site%s %s never said so too%s",
			       (unsigned long long)j->step->seq, j->name,
			       gg_format_duration(cfg->transport.step_timeout_us, buf, sizeof(buf)),
			       strchr(waiting, ',') ? "s" : "", waiting, down);
	} else if (gg_ar_step_first_missing(j->ar, &from, &id)) {
		fail_step_code(n, j, -ETIMEDOUT,
			       "step %llu of job '%s' missed its %s deadline: site %s never sent %s data for "
			       "shard %u chunk %u%s",
			       (unsigned long long)j->step->seq, j->name,
			       gg_format_duration(cfg->transport.step_timeout_us, buf, sizeof(buf)), n->names[from],
			       id.phase == GG_AR_DIRECT ? "direct" : id.phase == GG_AR_SCATTER ? "reduce-scatter" : "all-gather",
			       id.origin, id.chunk, down);
	} else {
		fail_step_code(n, j, -ETIMEDOUT, "step %llu of job '%s' missed its deadline%s",
			       (unsigned long long)j->step->seq, j->name, down);
	}
}

/* Deadlines of steps, and the buffer pool of an idle node. Returns the
 * next deadline. */
static uint64_t timers(struct gg_node *n)
{
	const uint64_t now = n->loop.now_us;
	uint64_t next = gg_mesh_tick(n->mesh);

	if (gg_buf_pool_count(&n->frames)) {
		bool idle = true;
		for (unsigned i = 0; i < MAX_JOBS && idle; i++)
			idle = !n->jobs[i].used || (!n->jobs[i].step && now - n->jobs[i].active_us > POOL_IDLE_US);
		if (idle)
			gg_buf_pool_trim(&n->frames);
	}
	for (unsigned i = 0; i < MAX_JOBS; i++) {
		struct job *j = &n->jobs[i];
		if (!j->used || !j->step)
			continue;
		if (now >= j->deadline_us)
			step_missed_deadline(n, j);
		else if (j->deadline_us < next)
			next = j->deadline_us;
	}
	return next;
}

/* Steps whose own chunks wait for room on the streams go on encoding. */
static void resume_steps(struct gg_node *n)
{
	char why[GG_AR_ERROR_MAX];

	for (unsigned i = 0; i < MAX_JOBS; i++) {
		struct job *j = &n->jobs[i];
		if (!j->used || !j->step || !gg_ar_step_wants_resume(j->ar))
			continue;
		double t0 = now_s();
		int rc = gg_ar_step_resume(j->ar, why, sizeof(why));
		n->stats.encode_s += now_s() - t0;
		if (rc)
			fail_step(n, j, "step %llu of job '%s': %s", (unsigned long long)j->step->seq, j->name, why);
		else if (gg_ar_step_done(j->ar))
			step_has_result(n, j);
	}
}

int gg_node_run_once(struct gg_node *n, uint64_t timeout_us, gg_node_cqe_fn *other, void *arg)
{
	struct cqe_ctx x = { n, other, arg };
	uint64_t wait = GG_MIN(timeout_us, gg_loop_timeout_us(&n->loop, n->next_us));
	int rc = gg_loop_run(&n->loop, wait, on_cqe, &x);

	if (rc < 0)
		return rc;
	n->next_us = timers(n);
	resume_steps(n);
	const struct gg_mesh_stats *ms = gg_mesh_stats(n->mesh);
	n->stats.resent_messages = ms->resent_messages;
	n->stats.tls_s = ms->tls_s;
	memcpy(n->stats.rtt_us, ms->rtt_us, sizeof(n->stats.rtt_us));
	return 0;
}

int gg_node_test_cut_stream(struct gg_node *n, unsigned peer, int stream)
{
	return gg_mesh_test_cut_stream(n->mesh, peer, stream);
}

void gg_node_test_freeze_at_result(struct gg_node *n)
{
	n->test_freeze_at_result = true;
}

bool gg_node_connected(const struct gg_node *n)
{
	return gg_mesh_connected(n->mesh);
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
			fail_step(n, &n->jobs[i], "step %llu of job '%s': the gateway of site %s is shutting down",
				  (unsigned long long)n->jobs[i].step->seq, n->jobs[i].name, n->names[n->self]);
}

void gg_node_shutdown(struct gg_node *n)
{
	gg_node_stop_steps(n);
	gg_mesh_shutdown(n->mesh);
}

bool gg_node_flushed(const struct gg_node *n)
{
	return gg_mesh_flushed(n->mesh);
}

bool gg_node_idle(const struct gg_node *n)
{
	return gg_mesh_idle(n->mesh);
}

const struct gg_node_stats *gg_node_stats(const struct gg_node *n)
{
	return &n->stats;
}

static int by_name(const void *a, const void *b)
{
	return strcmp(a, b);
}

int gg_node_new(const struct gg_config *cfg, struct gg_node **out, char *err, size_t err_size)
{
	struct gg_node *n = calloc(1, sizeof(*n));
	struct gg_wire_hello hello;
	int rc;

	*out = NULL;
	if (!n)
		return -ENOMEM;
	n->cfg = cfg;
	n->sites = (unsigned)cfg->peer_count + 1;
	snprintf(n->names[0], sizeof(n->names[0]), "%s", cfg->site.name);
	for (size_t i = 0; i < cfg->peer_count; i++)
		snprintf(n->names[i + 1], sizeof(n->names[0]), "%s", cfg->peers[i].site);
	qsort(n->names, n->sites, sizeof(n->names[0]), by_name);
	for (unsigned i = 0; i < n->sites; i++)
		if (!strcmp(n->names[i], cfg->site.name))
			n->self = i;

	n->chunk_elems = (uint32_t)GG_MIN(cfg->transport.chunk_bytes / sizeof(float), (uint64_t)UINT32_MAX) /
			 GG_CODEC_BLOCK_ALIGN_ELEMS * GG_CODEC_BLOCK_ALIGN_ELEMS;
	struct gg_frame_config fc = { .codec = gg_codec_defaults(cfg->compression.codec),
				      .zstd = cfg->compression.zstd_level > 0,
				      .zstd_level = cfg->compression.zstd_level > 0 ? cfg->compression.zstd_level : 1,
				      .max_elems = n->chunk_elems };
	if (gg_codec_has_blocks(cfg->compression.codec)) {
		fc.codec.block_elems = (uint32_t)cfg->compression.block_size;
		fc.codec.scale = cfg->compression.scale;
	}
	uint64_t bound;
	if ((rc = gg_frame_bound(&fc.codec, n->chunk_elems, &bound)) || (rc = gg_frame_encoder_init(&n->enc, &fc))) {
		gg_errf(err, err_size, -EINVAL, "codec %s with block size %d: %s", gg_codec_name(cfg->compression.codec),
			cfg->compression.block_size, strerror(-rc));
		goto fail;
	}
	struct gg_frame_limits lim = { .max_elems = n->chunk_elems, .max_raw_bytes = bound };
	if ((rc = gg_frame_decoder_init(&n->dec, &lim))) {
		gg_errf(err, err_size, -EINVAL, "frame decoder: %s", strerror(-rc));
		goto fail;
	}
	/* One pool for the frames a site sends and the DATA it receives (a
	 * frame and its message head): enough for what the streams keep
	 * queued (ar_may_encode), in flight and early, a few dozen megabytes
	 * at the default chunk size and at most a sixteenth of [limits]
	 * memory; an idle node lets them go. */
	const size_t max_payload = GG_WIRE_DATA_FIXED_BYTES + bound;
	unsigned pool_max = (unsigned)GG_MIN((uint64_t)64, cfg->limits.memory_bytes / 16 / max_payload);
	gg_buf_pool_init(&n->frames, max_payload, pool_max);

	hello = (struct gg_wire_hello){ .streams = (uint16_t)cfg->transport.streams_per_peer,
					 .sites = (uint8_t)n->sites,
					 .codec = (uint8_t)cfg->compression.codec,
					 .scale = (uint8_t)fc.codec.scale,
					 .block_elems = fc.codec.block_elems,
					 .algorithm = (uint8_t)cfg->allreduce.algorithm,
					 .chunk_elems = n->chunk_elems,
					 .zstd = cfg->compression.zstd_level > 0 };
	memcpy(hello.site_names, n->names, sizeof(n->names));
	int urandom = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
	if (urandom < 0 || read(urandom, &hello.instance_id, sizeof(hello.instance_id)) != 8) {
		if (urandom >= 0)
			close(urandom);
		rc = gg_errf(err, err_size, -EINVAL, "cannot read /dev/urandom for the instance id");
		goto fail;
	}
	close(urandom);
	hello.instance_id |= 1; /* never 0, which means "not seen yet" */

	struct gg_tls_options to = { .ca_file = cfg->tls.ca, .cert_file = cfg->tls.cert, .key_file = cfg->tls.key,
				     .crl_file = cfg->tls.crl, .ciphersuites = cfg->tls.ciphersuites };
	if ((rc = gg_tls_context_new(&to, &n->tls, err, err_size)))
		goto fail;
	if ((rc = gg_loop_init(&n->loop, 1024))) {
		gg_errf(err, err_size, -EINVAL, "cannot set up io_uring: %s", strerror(-rc));
		goto fail;
	}
	n->loop.now_us = gg_monotonic_us();
	struct gg_mesh_config mc = { .cfg = cfg, .sites = n->sites, .self = n->self, .names = n->names,
				     .hello = &hello, .tls = n->tls, .loop = &n->loop, .pool = &n->frames,
				     .max_payload_bytes = max_payload, .ops = &mesh_ops, .owner = n };
	if ((rc = gg_mesh_new(&mc, &n->mesh, err, err_size)))
		goto fail;
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
	for (unsigned i = 0; i < MAX_JOBS; i++) {
		struct job *j = &n->jobs[i];
		gg_ar_step_free(j->ar);
		while (j->early) {
			struct early *e = j->early;
			j->early = e->next;
			early_free(e);
		}
	}
	gg_mesh_free(n->mesh);
	while (n->feedback_count)
		feedback_drop(n, n->feedback_count - 1);
	free(n->feedback);
	if (n->loop.ring.ring_fd > 0)
		gg_loop_fini(&n->loop);
	gg_frame_encoder_fini(&n->enc);
	gg_frame_decoder_fini(&n->dec);
	gg_buf_pool_fini(&n->frames);
	gg_tls_context_free(n->tls);
	free(n);
}
