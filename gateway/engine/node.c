#include "node.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "allreduce.h"
#include "log.h"
#include "net_addr.h"
#include "tls_stream.h"
#include "units.h"

#define MAX_CONNS 192        /* streams to all peers plus handshakes in progress */
#define MAX_JOBS 32
#define CTRL_MSG_MAX 1024    /* every message but DATA fits */
#define CONN_TXQ 512         /* messages queued on one stream */
#define POOL_IDLE_US 5000000 /* an idle node gives its cached frames back after this */

/* An outgoing message: a small head and, for DATA, a frame. */
struct out {
	struct out *next;
	uint8_t head[GG_WIRE_HEADER_BYTES + GG_WIRE_DATA_FIXED_BYTES + GG_WIRE_REASON_MAX + 8];
	size_t head_len;
	struct gg_buf *frame; /* NULL unless DATA */
	size_t off;                /* bytes of head + frame written */
	/* DATA only: what the ACK names, and where the message is. */
	unsigned job;
	uint64_t seq;
	struct gg_ar_chunk_id id;
	int conn;                  /* stream it was written to; -1: waiting */
	bool acked_wait;
};

struct conn {
	struct gg_tls_stream ts;
	bool used;
	bool ready;         /* HELLOs exchanged */
	bool lost;          /* conn_lost() ran */
	bool dialer;
	int peer;           /* site index, -1 until known */
	int stream;         /* stream number, -1 until known */
	uint8_t *rx;
	size_t rx_len, rx_cap;
	struct out *txq_head, *txq_tail; /* being written */
	unsigned txq_count;
	uint64_t last_rx_us, ping_sent_us;
};

struct peer {
	int conn[64];              /* per stream number: conn index or -1 */
	uint64_t next_dial_us[64];
	uint64_t backoff_us[64];
	uint64_t instance_id;      /* 0 until the first HELLO */
	struct out *unacked;       /* DATA written or waiting, until ACKed */
	uint64_t unacked_bytes;
	struct out *waiting;       /* DATA held back by the in-flight bound */
	struct gg_tls_site tls_site;
	char address[GG_NET_ADDR_TEXT_MAX + 256];
};

/* A frame for a step that has not started here yet. */
struct early {
	struct early *next;
	unsigned from;
	uint64_t seq;
	struct gg_wire_step wstep;
	struct gg_ar_chunk_id id;
	struct gg_buf *frame; /* from the node's pool */
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
	struct peer peers[GG_AR_MAX_SITES];
	struct gg_tls_site accept_sites[GG_AR_MAX_SITES]; /* who may dial us */
	int accept_map[GG_AR_MAX_SITES];                  /* accept_sites index -> site */
	size_t accept_count;
	struct gg_tls_context *tls;
	struct gg_tls_stream_options sopts;
	struct gg_loop loop;
	int listen_fd;
	struct conn conns[MAX_CONNS];
	struct job jobs[MAX_JOBS];
	/* Error feedback, one slot per (job, tensor), each allocated on its own
	 * (steps hold pointers to them); residuals bounded by [limits] memory. */
	struct feedback_slot **feedback;
	unsigned feedback_count, feedback_cap;
	uint64_t feedback_bytes;
	struct gg_wire_hello hello;
	uint32_t chunk_elems;
	size_t rx_max;          /* largest message accepted */
	struct gg_frame_encoder enc;
	struct gg_frame_decoder dec;
	struct gg_buf_pool frames;
	struct gg_node_stats stats;
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

const struct gg_node_stats *gg_node_stats(const struct gg_node *n)
{
	return &n->stats;
}

/* ---- steps ---------------------------------------------------------------- */

static bool same_chunk(const struct gg_ar_chunk_id *a, const struct gg_ar_chunk_id *b)
{
	return a->phase == b->phase && a->origin == b->origin && a->chunk == b->chunk;
}

static void free_out(struct out *o)
{
	gg_buf_put(o->frame);
	free(o);
}

static void send_abort(struct gg_node *n, const struct job *j, uint64_t seq, const char *reason);
static void drop_early(struct gg_node *n, struct job *j, uint64_t from_seq, uint64_t to_seq);

static void early_free(struct early *e)
{
	gg_buf_put(e->frame);
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
	for (unsigned p = 0; p < n->sites && status; p++) {
		struct out **pp = &n->peers[p].waiting;
		while (*pp) {
			struct out *o = *pp;
			if (o->job == (unsigned)(j - n->jobs) && o->seq == st->seq) {
				*pp = o->next;
				free_out(o);
			} else {
				pp = &o->next;
			}
		}
	}
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
 * its own waiting to be sent or acknowledged (those name it by slot). */
static bool job_idle(const struct gg_node *n, const struct job *j)
{
	const unsigned slot = (unsigned)(j - n->jobs);

	if (j->step || j->early)
		return false;
	for (unsigned p = 0; p < n->sites; p++) {
		for (const struct out *o = n->peers[p].unacked; o; o = o->next)
			if (o->job == slot)
				return false;
		for (const struct out *o = n->peers[p].waiting; o; o = o->next)
			if (o->job == slot)
				return false;
	}
	return true;
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

static void conn_flush(struct gg_node *n, int ci);

static void conn_enqueue(struct gg_node *n, int ci, struct out *o)
{
	struct conn *c = &n->conns[ci];

	o->next = NULL;
	o->off = 0;
	if (c->txq_tail)
		c->txq_tail->next = o;
	else
		c->txq_head = o;
	c->txq_tail = o;
	c->txq_count++;
	conn_flush(n, ci);
}

/* A control message to one stream; dropped when the stream is gone. */
static void send_ctrl(struct gg_node *n, int ci, const uint8_t *buf, size_t len)
{
	struct out *o;

	if (ci < 0 || !n->conns[ci].used || n->conns[ci].txq_count >= CONN_TXQ || len > sizeof(o->head))
		return;
	o = calloc(1, sizeof(*o));
	if (!o)
		return;
	memcpy(o->head, buf, len);
	o->head_len = len;
	o->conn = ci;
	conn_enqueue(n, ci, o);
}

/* A ready stream to `peer` for chunk `chunk`, or -1. */
static int pick_stream(struct gg_node *n, unsigned peer, uint32_t chunk)
{
	const int S = n->cfg->transport.streams_per_peer;

	for (int k = 0; k < S; k++) {
		int ci = n->peers[peer].conn[(chunk + (uint32_t)k) % (uint32_t)S];
		if (ci >= 0 && n->conns[ci].ready && n->conns[ci].txq_count < CONN_TXQ)
			return ci;
	}
	return -1;
}

/* Moves DATA from the waiting list onto streams while the peer's window
 * has room. */
static void pump_peer(struct gg_node *n, unsigned p)
{
	struct peer *pe = &n->peers[p];

	while (pe->waiting) {
		struct out *o = pe->waiting;
		size_t bytes = o->head_len + o->frame->len;
		if (pe->unacked_bytes && pe->unacked_bytes + bytes > n->cfg->limits.inflight_bytes_per_peer)
			return;
		int ci = pick_stream(n, p, o->id.chunk);
		if (ci < 0)
			return;
		pe->waiting = o->next;
		pe->unacked_bytes += bytes;
		/* Written and kept: the unacked list owns a second reference. */
		struct out *keep = malloc(sizeof(*keep));
		if (!keep) {
			pe->unacked_bytes -= bytes;
			o->next = pe->waiting;
			pe->waiting = o;
			return;
		}
		*keep = *o;
		gg_buf_get(keep->frame);
		keep->conn = ci;
		keep->next = pe->unacked;
		pe->unacked = keep;
		o->conn = ci;
		conn_enqueue(n, ci, o);
	}
}

/* The step engine's send: DATA for one peer, queued behind the window. */
static int ar_send(void *ctx, unsigned to, const struct gg_ar_chunk_id *id, struct gg_buf *frame)
{
	struct job *j = ctx;
	struct gg_node *n = j->node;
	struct peer *pe = &n->peers[to];
	struct out *o = calloc(1, sizeof(*o));

	if (!o)
		return -ENOMEM;
	ssize_t len = gg_wire_encode_data_head(o->head, sizeof(o->head), &j->wstep, id, frame->len);
	if (len < 0) {
		free(o);
		return (int)len;
	}
	o->head_len = (size_t)len;
	gg_buf_get(frame);
	o->frame = frame;
	o->job = (unsigned)(j - n->jobs);
	o->seq = j->wstep.step;
	o->id = *id;
	o->conn = -1;
	struct out **tail = &pe->waiting;
	while (*tail)
		tail = &(*tail)->next;
	*tail = o;
	n->stats.data_bytes_out += frame->len;
	uint64_t elems = 0; /* the frame header's element count (frame.h: bytes 8-15, little-endian) */
	for (int b = 7; b >= 0; b--)
		elems = elems << 8 | frame->data[8 + b];
	n->stats.raw_bytes_out += elems * sizeof(float);
	pump_peer(n, to);
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

	for (unsigned p = 0; p < n->sites; p++) {
		if (p == n->self)
			continue;
		const struct peer *pe = &n->peers[p];
		unsigned queued = 0;
		for (const struct out *o = pe->waiting; o && queued < limit; o = o->next)
			queued++;
		for (int k = 0; k < S; k++)
			if (pe->conn[k] >= 0)
				queued += n->conns[pe->conn[k]].txq_count;
		if (queued >= limit)
			return false;
	}
	return true;
}

static const struct gg_ar_ops ar_ops = { ar_send, ar_may_encode };

static void send_ack(struct gg_node *n, int ci, const char *job, uint64_t seq, const struct gg_ar_chunk_id *id);

static void send_abort(struct gg_node *n, const struct job *j, uint64_t seq, const char *reason)
{
	uint8_t buf[CTRL_MSG_MAX];
	ssize_t len = gg_wire_encode_abort(buf, sizeof(buf), j->name, seq, reason);

	for (unsigned p = 0; p < n->sites && len > 0; p++) {
		if (p == n->self)
			continue;
		for (int s = 0; s < n->cfg->transport.streams_per_peer; s++) {
			int ci = n->peers[p].conn[s];
			if (ci >= 0 && n->conns[ci].ready) {
				send_ctrl(n, ci, buf, (size_t)len);
				break;
			}
		}
	}
}

/* DONE for the job's step to peer `only` (every peer when -1), on every
 * ready stream: one cut after the message was queued must not lose it, and
 * a second copy changes nothing. */
static void send_done(struct gg_node *n, const struct job *j, int only)
{
	uint8_t buf[CTRL_MSG_MAX];
	ssize_t len = gg_wire_encode_done(buf, sizeof(buf), j->name, j->step->seq);

	for (unsigned p = 0; p < n->sites && len > 0; p++) {
		if (p == n->self || (only >= 0 && p != (unsigned)only))
			continue;
		for (int k = 0; k < n->cfg->transport.streams_per_peer; k++) {
			int ci = n->peers[p].conn[k];
			if (ci >= 0 && n->conns[ci].ready)
				send_ctrl(n, ci, buf, (size_t)len);
		}
	}
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
		feed_frame(n, j, e->from, &e->wstep, &e->id, e->frame->data, e->frame->len);
		send_ack(n, pick_stream(n, e->from, e->id.chunk), j->name, e->seq, &e->id);
		early_free(e);
		pp = &j->early;
	}
	if (j->step && j->step->seq == seq && gg_ar_step_done(j->ar))
		step_has_result(n, j);
	return 0;
}

/* ---- receiving ------------------------------------------------------------ */

static void send_ack(struct gg_node *n, int ci, const char *job, uint64_t seq, const struct gg_ar_chunk_id *id)
{
	uint8_t buf[CTRL_MSG_MAX];
	ssize_t len = gg_wire_encode_ack(buf, sizeof(buf), job, seq, id);
	if (len > 0)
		send_ctrl(n, ci, buf, (size_t)len);
}

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
		send_ack(n, pick_stream(n, e->from, e->id.chunk), j->name, e->seq, &e->id);
		early_free(e);
	}
}

static void on_data(struct gg_node *n, int ci, const struct gg_wire_msg *m)
{
	unsigned from = (unsigned)n->conns[ci].peer;
	const struct gg_wire_step *ws = &m->u.data.step;
	struct job *j = find_job(n, ws->job, true);

	if (!j) {
		gg_log(GG_LOG_WARN, "data_dropped", "site=%s job=%s reason=\"too many jobs\"", n->names[from], ws->job);
		return;
	}
	if (j->step && ws->step == j->step->seq) {
		feed_frame(n, j, from, ws, &m->u.data.id, m->u.data.frame, m->u.data.frame_bytes);
		send_ack(n, ci, ws->job, ws->step, &m->u.data.id);
		return;
	}
	if (ws->step <= j->last_seq) {
		/* A step already finished or failed here: a re-send, or data of a
		 * step this site aborted. Acknowledge so the peer lets it go. */
		send_ack(n, ci, ws->job, ws->step, &m->u.data.id);
		return;
	}
	/* Not started here yet: keep it unacknowledged, so the peer's window
	 * bounds how much waits. */
	for (struct early *e = j->early; e; e = e->next)
		if (e->seq == ws->step && e->from == from && same_chunk(&e->id, &m->u.data.id))
			return;
	struct early *e = malloc(sizeof(*e));
	if (!e || !(e->frame = gg_buf_new(&n->frames, m->u.data.frame_bytes))) {
		free(e);
		return;
	}
	e->from = from;
	e->seq = ws->step;
	e->wstep = *ws;
	e->id = m->u.data.id;
	e->frame->len = m->u.data.frame_bytes;
	memcpy(e->frame->data, m->u.data.frame, e->frame->len);
	e->next = j->early;
	j->early = e;
	/* The ACK goes out when the step consumes it. */
}

static void on_ack(struct gg_node *n, int ci, const struct gg_wire_msg *m)
{
	struct peer *pe = &n->peers[n->conns[ci].peer];
	struct job *j = find_job(n, m->u.ack.job, false);

	if (!j)
		return;
	for (struct out **pp = &pe->unacked; *pp; pp = &(*pp)->next) {
		struct out *o = *pp;
		if (o->job == (unsigned)(j - n->jobs) && o->seq == m->u.ack.step &&
		    same_chunk(&o->id, &m->u.ack.id)) {
			*pp = o->next;
			pe->unacked_bytes -= o->head_len + o->frame->len;
			free_out(o);
			break;
		}
	}
	pump_peer(n, (unsigned)n->conns[ci].peer);
}

static void on_abort(struct gg_node *n, int ci, const struct gg_wire_msg *m)
{
	const char *site = n->names[n->conns[ci].peer];
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

static void on_done(struct gg_node *n, int ci, const struct gg_wire_msg *m)
{
	struct job *j = find_job(n, m->u.done.job, false);

	/* A DONE for a step not in progress here is stale: this site failed
	 * or completed it (which needed this DONE, so it was a copy). */
	if (!j || !j->step || j->step->seq != m->u.done.step)
		return;
	j->done_from |= 1u << n->conns[ci].peer;
	maybe_complete(n, j);
}

/* Every step in progress with `p` fails: it restarted and lost them. */
static void peer_lost_state(struct gg_node *n, unsigned p, const char *why)
{
	struct peer *pe = &n->peers[p];

	for (unsigned i = 0; i < MAX_JOBS; i++) {
		struct job *j = &n->jobs[i];
		if (j->used && j->step)
			fail_step(n, j, "step %llu of job '%s': site %s %s", (unsigned long long)j->step->seq, j->name,
				  n->names[p], why);
	}
	while (pe->unacked) {
		struct out *o = pe->unacked;
		pe->unacked = o->next;
		free_out(o);
	}
	pe->unacked_bytes = 0;
	while (pe->waiting) {
		struct out *o = pe->waiting;
		pe->waiting = o->next;
		free_out(o);
	}
}

static void send_hello(struct gg_node *n, int ci, uint16_t stream)
{
	uint8_t buf[CTRL_MSG_MAX];
	struct gg_wire_hello h = n->hello;

	h.stream_index = stream;
	ssize_t len = gg_wire_encode_hello(buf, sizeof(buf), &h);
	if (len > 0)
		send_ctrl(n, ci, buf, (size_t)len);
}

static void conn_close(struct gg_node *n, int ci, const char *why);

/* Sends again what `p` never acknowledged on streams that are gone. */
static void resend_lost(struct gg_node *n, unsigned p)
{
	struct peer *pe = &n->peers[p];
	struct out **pp = &pe->unacked;
	while (*pp) {
		struct out *o = *pp;
		if (o->conn >= 0 && n->conns[o->conn].used && n->conns[o->conn].ready) {
			pp = &o->next;
			continue;
		}
		/* Move it back to the front of the waiting list. */
		*pp = o->next;
		pe->unacked_bytes -= o->head_len + o->frame->len;
		o->conn = -1;
		o->next = pe->waiting;
		pe->waiting = o;
		n->stats.resent_messages++;
	}
	pump_peer(n, p);
}

/* The stream to a peer is ready: it carries what lost streams did. */
static void stream_ready(struct gg_node *n, int ci)
{
	struct conn *c = &n->conns[ci];

	c->ready = true;
	n->peers[c->peer].backoff_us[c->stream] = 0;
	gg_log(GG_LOG_INFO, "stream_up", "site=%s stream=%d cipher=%s", n->names[c->peer], c->stream,
	       gg_tls_engine_cipher(c->ts.tls));
	resend_lost(n, (unsigned)c->peer);
	for (unsigned i = 0; i < MAX_JOBS; i++)
		if (n->jobs[i].used && n->jobs[i].step && n->jobs[i].has_result)
			send_done(n, &n->jobs[i], c->peer);
}

static void on_hello(struct gg_node *n, int ci, const struct gg_wire_msg *m)
{
	struct conn *c = &n->conns[ci];
	const struct gg_wire_hello *h = &m->u.hello;
	char err[GG_NODE_ERROR_MAX];

	if (c->ready) {
		conn_close(n, ci, "a second HELLO on a stream");
		return;
	}
	if (gg_wire_hello_check(&n->hello, h, n->names[c->peer], err, sizeof(err))) {
		gg_log(GG_LOG_ERROR, "peer_mismatch", "site=%s reason=\"%s\"", n->names[c->peer], err);
		/* Our HELLO lets the dialer see the mismatch too, rather than
		 * only a closed stream; the close flushes it. */
		if (!c->dialer)
			send_hello(n, ci, h->stream_index);
		conn_close(n, ci, err);
		return;
	}
	if (c->dialer ? h->stream_index != c->stream : false) {
		conn_close(n, ci, "the peer answered for another stream");
		return;
	}
	struct peer *pe = &n->peers[c->peer];
	if (!c->dialer) {
		c->stream = h->stream_index;
		int old = pe->conn[c->stream];
		if (old >= 0 && old != ci)
			conn_close(n, old, "replaced by a new connection");
		pe->conn[c->stream] = ci;
		send_hello(n, ci, (uint16_t)c->stream);
	}
	if (pe->instance_id && pe->instance_id != h->instance_id) {
		gg_log(GG_LOG_WARN, "peer_restarted", "site=%s", n->names[c->peer]);
		peer_lost_state(n, (unsigned)c->peer, "restarted and lost the step");
	}
	pe->instance_id = h->instance_id;
	stream_ready(n, ci);
}

static void dispatch(struct gg_node *n, int ci, enum gg_wire_type type, const uint8_t *payload, size_t len)
{
	struct conn *c = &n->conns[ci];
	struct gg_wire_msg m;
	char err[256];

	if (gg_wire_decode(type, payload, len, &m, err, sizeof(err))) {
		char why[300];
		snprintf(why, sizeof(why), "bad message from site %s: %s", n->names[c->peer], err);
		conn_close(n, ci, why);
		return;
	}
	if (!c->ready && type != GG_WIRE_HELLO) {
		conn_close(n, ci, "data before HELLO");
		return;
	}
	switch (type) {
	case GG_WIRE_HELLO:
		on_hello(n, ci, &m);
		break;
	case GG_WIRE_DATA:
		on_data(n, ci, &m);
		break;
	case GG_WIRE_ACK:
		on_ack(n, ci, &m);
		break;
	case GG_WIRE_PING: {
		uint8_t buf[64];
		ssize_t l = gg_wire_encode_ping(buf, sizeof(buf), GG_WIRE_PONG, m.u.ping_us);
		if (l > 0)
			send_ctrl(n, ci, buf, (size_t)l);
		break;
	}
	case GG_WIRE_PONG:
		if (m.u.ping_us == c->ping_sent_us) {
			n->stats.rtt_us[c->peer] = n->loop.now_us - c->ping_sent_us;
			c->ping_sent_us = 0;
		}
		break;
	case GG_WIRE_ABORT:
		on_abort(n, ci, &m);
		break;
	case GG_WIRE_DONE:
		on_done(n, ci, &m);
		break;
	}
}

/* Reads what the stream has and dispatches every whole message. */
static void conn_read(struct gg_node *n, int ci)
{
	struct conn *c = &n->conns[ci];

	for (;;) {
		if (c->rx_len == c->rx_cap)
			break;
		double t0 = now_s();
		ssize_t got = gg_tls_stream_read(&c->ts, c->rx + c->rx_len, c->rx_cap - c->rx_len);
		n->stats.tls_s += now_s() - t0;
		if (got == -EAGAIN)
			break;
		if (got <= 0) {
			conn_close(n, ci, got == 0 ? "the peer closed the stream" : gg_tls_stream_error(&c->ts));
			return;
		}
		c->rx_len += (size_t)got;
		c->last_rx_us = n->loop.now_us;
		size_t off = 0;
		while (c->used && c->rx_len - off >= GG_WIRE_HEADER_BYTES) {
			enum gg_wire_type type;
			size_t payload;
			char err[256];
			if (gg_wire_parse_header(c->rx + off, n->rx_max, &type, &payload, err, sizeof(err))) {
				char why[300];
				snprintf(why, sizeof(why), "bad message from site %s: %s",
					 c->peer >= 0 ? n->names[c->peer] : "?", err);
				conn_close(n, ci, why);
				return;
			}
			if (c->rx_len - off - GG_WIRE_HEADER_BYTES < payload)
				break;
			dispatch(n, ci, type, c->rx + off + GG_WIRE_HEADER_BYTES, payload);
			off += GG_WIRE_HEADER_BYTES + payload;
		}
		if (!c->used)
			return;
		if (off) {
			memmove(c->rx, c->rx + off, c->rx_len - off);
			c->rx_len -= off;
		}
	}
}

/* Writes queued messages until the stream pushes back. */
static void conn_flush(struct gg_node *n, int ci)
{
	struct conn *c = &n->conns[ci];

	while (c->used && c->txq_head && c->ts.state == GG_TLS_STREAM_OPEN) {
		struct out *o = c->txq_head;
		size_t total = o->head_len + (o->frame ? o->frame->len : 0);
		const uint8_t *src = o->off < o->head_len ? o->head + o->off : o->frame->data + (o->off - o->head_len);
		size_t len = o->off < o->head_len ? o->head_len - o->off : total - o->off;
		double t0 = now_s();
		ssize_t w = gg_tls_stream_write(&c->ts, src, len);
		n->stats.tls_s += now_s() - t0;
		if (w == -EAGAIN)
			return;
		if (w < 0) {
			conn_close(n, ci, gg_tls_stream_error(&c->ts));
			return;
		}
		o->off += (size_t)w;
		if (o->off < total)
			continue;
		c->txq_head = o->next;
		if (!c->txq_head)
			c->txq_tail = NULL;
		c->txq_count--;
		free_out(o);
	}
}

static void conn_free_slot(struct gg_node *n, int ci)
{
	struct conn *c = &n->conns[ci];

	while (c->txq_head) {
		struct out *o = c->txq_head;
		c->txq_head = o->next;
		free_out(o);
	}
	free(c->rx);
	if (c->peer >= 0 && c->stream >= 0 && n->peers[c->peer].conn[c->stream] == ci)
		n->peers[c->peer].conn[c->stream] = -1;
	memset(c, 0, sizeof(*c));
}

/* Bookkeeping when a stream stops carrying data, once per stream: the
 * dialer schedules a reconnect, and what the stream carried goes out again
 * on another stream of that peer (or when one comes up). */
static void conn_lost(struct gg_node *n, int ci, const char *why)
{
	struct conn *c = &n->conns[ci];

	if (c->lost)
		return;
	c->lost = true;
	gg_log(c->ready ? GG_LOG_WARN : GG_LOG_INFO, "stream_down", "site=%s stream=%d reason=\"%s\"",
	       c->peer >= 0 ? n->names[c->peer] : "?", c->stream, why);
	bool was_ready = c->ready;
	c->ready = false;
	/* What it carried is lost with it. Forget the slot now: once freed it
	 * may carry a new stream, which would pass for the one these went on. */
	if (c->peer >= 0)
		for (struct out *o = n->peers[c->peer].unacked; o; o = o->next)
			if (o->conn == ci)
				o->conn = -1;
	if (c->peer < 0 || c->stream < 0 || n->peers[c->peer].conn[c->stream] != ci)
		return;
	struct peer *pe = &n->peers[c->peer];
	pe->conn[c->stream] = -1;
	if (c->dialer) {
		uint64_t *b = &pe->backoff_us[c->stream];
		*b = *b ? GG_MIN(*b * 2, n->cfg->transport.reconnect_max_us) : n->cfg->transport.reconnect_min_us;
		pe->next_dial_us[c->stream] = n->loop.now_us + *b;
	}
	if (!was_ready)
		return;
	for (int s = 0; s < n->cfg->transport.streams_per_peer; s++) {
		int other = pe->conn[s];
		if (other >= 0 && n->conns[other].ready) {
			resend_lost(n, (unsigned)c->peer);
			break;
		}
	}
}

static void conn_close(struct gg_node *n, int ci, const char *why)
{
	struct conn *c = &n->conns[ci];

	if (!c->used)
		return;
	conn_lost(n, ci, why);
	if (c->ts.state >= GG_TLS_STREAM_CLOSING)
		return;
	unsigned ev = gg_tls_stream_close(&c->ts);
	if (ev & GG_TLS_STREAM_EV_DONE)
		conn_free_slot(n, ci);
}

static void on_stream_events(struct gg_node *n, int ci, unsigned ev)
{
	struct conn *c = &n->conns[ci];

	if (!c->used)
		return;
	if (ev & GG_TLS_STREAM_EV_FAILED)
		conn_lost(n, ci, gg_tls_stream_error(&c->ts));
	if (ev & GG_TLS_STREAM_EV_OPEN) {
		if (!c->dialer) {
			size_t idx = gg_tls_engine_peer_site(c->ts.tls);
			c->peer = idx < n->accept_count ? n->accept_map[idx] : -1;
		}
		c->last_rx_us = n->loop.now_us;
		if (c->dialer)
			send_hello(n, ci, (uint16_t)c->stream);
	}
	if (ev & GG_TLS_STREAM_EV_READABLE)
		conn_read(n, ci);
	if (c->used && (ev & (GG_TLS_STREAM_EV_WRITABLE | GG_TLS_STREAM_EV_OPEN)))
		conn_flush(n, ci);
	if (c->used && (ev & GG_TLS_STREAM_EV_DONE)) {
		conn_lost(n, ci, gg_tls_stream_error(&c->ts)[0] ? gg_tls_stream_error(&c->ts) : "closed");
		conn_free_slot(n, ci);
	}
}

static int free_conn_slot(struct gg_node *n)
{
	for (int i = 0; i < MAX_CONNS; i++)
		if (!n->conns[i].used)
			return i;
	return -1;
}

static int conn_init(struct gg_node *n, int ci, bool dialer, int peer, int stream)
{
	struct conn *c = &n->conns[ci];

	memset(c, 0, sizeof(*c));
	c->rx = malloc(n->rx_max + GG_WIRE_HEADER_BYTES);
	if (!c->rx)
		return -ENOMEM;
	c->rx_cap = n->rx_max + GG_WIRE_HEADER_BYTES;
	c->used = true;
	c->dialer = dialer;
	c->peer = peer;
	c->stream = stream;
	return 0;
}

static void dial(struct gg_node *n, unsigned p, int s)
{
	struct peer *pe = &n->peers[p];
	struct sockaddr_storage ss;
	socklen_t len;
	const char *why;
	struct gg_tls_engine *e;
	int ci = free_conn_slot(n);

	if (ci < 0)
		return;
	if (gg_net_addr_parse(pe->address, &ss, &len, &why)) {
		gg_log(GG_LOG_WARN, "dial_failed", "site=%s address=%s reason=\"%s\"", n->names[p], pe->address, why);
		pe->next_dial_us[s] = n->loop.now_us + n->cfg->transport.reconnect_max_us;
		return;
	}
	struct gg_tls_engine_config ec = { .role = GG_TLS_CLIENT, .peer_addr = pe->address, .sites = &pe->tls_site,
					   .site_count = 1 };
	if (gg_tls_engine_new(n->tls, &ec, &e) || conn_init(n, ci, true, (int)p, s))
		return;
	pe->conn[s] = ci;
	pe->next_dial_us[s] = UINT64_MAX;
	if (gg_tls_stream_connect(&n->conns[ci].ts, &n->loop, (uint32_t)ci, (struct sockaddr *)&ss, len, e, &n->sopts))
		on_stream_events(n, ci, gg_tls_stream_tick(&n->conns[ci].ts, n->loop.now_us));
}

static void accept_conn(struct gg_node *n, int fd)
{
	char addr[GG_NET_ADDR_TEXT_MAX];
	struct gg_tls_engine *e;
	int ci = free_conn_slot(n);

	if (ci < 0 || n->accept_count == 0 || n->shutting_down) {
		close(fd);
		return;
	}
	if (gg_net_tune(fd, (int)n->cfg->transport.socket_buffer_bytes)) {
		close(fd);
		return;
	}
	struct gg_tls_engine_config ec = { .role = GG_TLS_SERVER, .peer_addr = gg_net_peer_addr(fd, addr, sizeof(addr)),
					   .sites = n->accept_sites, .site_count = n->accept_count };
	if (gg_tls_engine_new(n->tls, &ec, &e)) {
		close(fd);
		return;
	}
	if (conn_init(n, ci, false, -1, -1)) {
		gg_tls_engine_free(e);
		close(fd);
		return;
	}
	gg_tls_stream_accept(&n->conns[ci].ts, &n->loop, (uint32_t)ci, fd, e, &n->sopts);
	on_stream_events(n, ci, gg_tls_stream_tick(&n->conns[ci].ts, n->loop.now_us));
}

/* ---- the loop ------------------------------------------------------------- */

struct cqe_ctx {
	struct gg_node *n;
	gg_node_cqe_fn *other;
	void *arg;
};

static void on_cqe(void *arg, const struct io_uring_cqe *cqe)
{
	struct cqe_ctx *x = arg;
	struct gg_node *n = x->n;
	unsigned kind = gg_loop_ud_kind(cqe->user_data);
	uint32_t i = gg_loop_ud_index(cqe->user_data);

	if (kind >= GG_OP_USER) {
		if (x->other)
			x->other(x->arg, cqe);
		return;
	}
	switch (kind) {
	case GG_OP_ACCEPT:
		if (cqe->res >= 0)
			accept_conn(n, cqe->res);
		if (!(cqe->flags & IORING_CQE_F_MORE) && !n->shutting_down &&
		    gg_loop_accept(&n->loop, n->listen_fd, cqe->user_data))
			gg_log(GG_LOG_ERROR, "accept_failed", "reason=\"cannot re-arm accept\"");
		break;
	case GG_OP_CONNECT:
	case GG_OP_RECV:
	case GG_OP_SEND:
	case GG_OP_CANCEL:
		if (i < MAX_CONNS && n->conns[i].used)
			on_stream_events(n, (int)i, gg_tls_stream_on_cqe(&n->conns[i].ts, cqe));
		break;
	default:
		break;
	}
}

/* " (no connection to site X, site Y)" for peers with no stream up, or "":
 * when a site is gone, what a step waits for may be held up by it rather
 * than by the site the step waits on. */
static void unreachable_peers(const struct gg_node *n, char *buf, size_t size)
{
	size_t len = 0;

	buf[0] = '\0';
	for (unsigned p = 0; p < n->sites && len < size; p++) {
		bool up = p == n->self;
		for (int s = 0; s < n->cfg->transport.streams_per_peer && !up; s++)
			up = n->peers[p].conn[s] >= 0 && n->conns[n->peers[p].conn[s]].ready;
		if (!up)
			len += (size_t)snprintf(buf + len, size - len, "%s site %s", len ? "," : " (no connection to",
						n->names[p]);
	}
	if (len && len < size)
		snprintf(buf + len, size - len, ")");
}

static void timers(struct gg_node *n)
{
	const uint64_t now = n->loop.now_us;
	const struct gg_config *cfg = n->cfg;

	if (gg_buf_pool_count(&n->frames)) {
		bool idle = true;
		for (unsigned i = 0; i < MAX_JOBS && idle; i++)
			idle = !n->jobs[i].used || (!n->jobs[i].step && now - n->jobs[i].active_us > POOL_IDLE_US);
		if (idle)
			gg_buf_pool_trim(&n->frames);
	}

	for (int ci = 0; ci < MAX_CONNS; ci++) {
		struct conn *c = &n->conns[ci];
		if (!c->used)
			continue;
		on_stream_events(n, ci, gg_tls_stream_tick(&c->ts, now));
		if (!c->used || !c->ready)
			continue;
		if (now - c->last_rx_us > cfg->transport.heartbeat_timeout_us) {
			conn_close(n, ci, "heartbeat timeout");
			continue;
		}
		if (!c->ping_sent_us && now - c->last_rx_us >= cfg->transport.heartbeat_interval_us) {
			uint8_t buf[64];
			ssize_t l = gg_wire_encode_ping(buf, sizeof(buf), GG_WIRE_PING, now);
			c->ping_sent_us = now;
			if (l > 0)
				send_ctrl(n, ci, buf, (size_t)l);
		} else if (c->ping_sent_us && now - c->ping_sent_us > cfg->transport.heartbeat_interval_us) {
			c->ping_sent_us = 0; /* lost with a stream; probe again */
		}
	}
	for (unsigned p = 0; p < n->sites && !n->shutting_down; p++) {
		if (p <= n->self)
			continue;
		for (int s = 0; s < cfg->transport.streams_per_peer; s++)
			if (n->peers[p].conn[s] < 0 && now >= n->peers[p].next_dial_us[s])
				dial(n, p, s);
	}
	for (unsigned i = 0; i < MAX_JOBS; i++) {
		struct job *j = &n->jobs[i];
		if (!j->used || !j->step || now < j->deadline_us)
			continue;
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
		} else if (gg_ar_step_first_missing(j->ar, &from, &id))
			fail_step_code(n, j, -ETIMEDOUT,
				  "step %llu of job '%s' missed its %s deadline: site %s never sent %s data for "
				  "shard %u chunk %u%s",
				  (unsigned long long)j->step->seq, j->name,
				  gg_format_duration(cfg->transport.step_timeout_us, buf, sizeof(buf)), n->names[from],
				  id.phase == GG_AR_DIRECT ? "direct" : id.phase == GG_AR_SCATTER ? "reduce-scatter" : "all-gather",
				  id.origin, id.chunk, down);
		else
			fail_step_code(n, j, -ETIMEDOUT, "step %llu of job '%s' missed its deadline%s",
				       (unsigned long long)j->step->seq, j->name, down);
	}
}

static uint64_t next_deadline(const struct gg_node *n)
{
	uint64_t next = n->loop.now_us + 100000; /* timers and dials at least every 100 ms */

	for (int ci = 0; ci < MAX_CONNS; ci++) {
		uint64_t d = n->conns[ci].used ? gg_tls_stream_deadline_us(&n->conns[ci].ts) : 0;
		if (d && d < next)
			next = d;
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
	uint64_t wait = GG_MIN(timeout_us, gg_loop_timeout_us(&n->loop, next_deadline(n)));
	int rc = gg_loop_run(&n->loop, wait, on_cqe, &x);

	if (rc < 0)
		return rc;
	timers(n);
	resume_steps(n);
	return 0;
}

int gg_node_test_cut_stream(struct gg_node *n, unsigned peer, int stream)
{
	int ci = peer < n->sites ? n->peers[peer].conn[stream] : -1;

	if (ci < 0 || !n->conns[ci].used)
		return -ENOTCONN;
	return shutdown(n->conns[ci].ts.fd, SHUT_RDWR) ? -errno : 0;
}

void gg_node_test_freeze_at_result(struct gg_node *n)
{
	n->test_freeze_at_result = true;
}

bool gg_node_connected(const struct gg_node *n)
{
	for (unsigned p = 0; p < n->sites; p++) {
		if (p == n->self)
			continue;
		for (int s = 0; s < n->cfg->transport.streams_per_peer; s++) {
			int ci = n->peers[p].conn[s];
			if (ci < 0 || !n->conns[ci].ready)
				return false;
		}
	}
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
			fail_step(n, &n->jobs[i], "step %llu of job '%s': the gateway of site %s is shutting down",
				  (unsigned long long)n->jobs[i].step->seq, n->jobs[i].name, n->names[n->self]);
}

void gg_node_shutdown(struct gg_node *n)
{
	gg_node_stop_steps(n);
	for (int ci = 0; ci < MAX_CONNS; ci++) {
		if (!n->conns[ci].used)
			continue;
		/* close_notify first, so the peer can tell a clean stop from a
		 * cut; the close then flushes it. */
		if (n->conns[ci].ts.state == GG_TLS_STREAM_OPEN && gg_tls_stream_shutdown(&n->conns[ci].ts) < 0)
			gg_log(GG_LOG_DEBUG, "close_notify_failed", "site=%s stream=%d",
			       n->conns[ci].peer >= 0 ? n->names[n->conns[ci].peer] : "?", n->conns[ci].stream);
		conn_close(n, ci, "shutting down");
	}
	if (n->listen_fd >= 0) {
		close(n->listen_fd);
		n->listen_fd = -1;
	}
}

bool gg_node_flushed(const struct gg_node *n)
{
	for (unsigned p = 0; p < n->sites; p++)
		if (n->peers[p].unacked || n->peers[p].waiting)
			return false;
	for (int ci = 0; ci < MAX_CONNS; ci++)
		if (n->conns[ci].used && n->conns[ci].ready && n->conns[ci].txq_head)
			return false;
	return true;
}

bool gg_node_idle(const struct gg_node *n)
{
	for (int ci = 0; ci < MAX_CONNS; ci++)
		if (n->conns[ci].used)
			return false;
	return true;
}

static int by_name(const void *a, const void *b)
{
	return strcmp(a, b);
}

int gg_node_new(const struct gg_config *cfg, struct gg_node **out, char *err, size_t err_size)
{
	struct gg_node *n = calloc(1, sizeof(*n));
	const char *why;
	int rc;

	*out = NULL;
	if (!n)
		return -ENOMEM;
	n->cfg = cfg;
	n->listen_fd = -1;
	n->sites = (unsigned)cfg->peer_count + 1;
	snprintf(n->names[0], sizeof(n->names[0]), "%s", cfg->site.name);
	for (size_t i = 0; i < cfg->peer_count; i++)
		snprintf(n->names[i + 1], sizeof(n->names[0]), "%s", cfg->peers[i].site);
	qsort(n->names, n->sites, sizeof(n->names[0]), by_name);
	for (unsigned i = 0; i < n->sites; i++) {
		for (int s = 0; s < 64; s++)
			n->peers[i].conn[s] = -1;
		if (!strcmp(n->names[i], cfg->site.name)) {
			n->self = i;
			continue;
		}
		const struct gg_peer_config *pc = NULL;
		for (size_t k = 0; k < cfg->peer_count; k++)
			if (!strcmp(cfg->peers[k].site, n->names[i]))
				pc = &cfg->peers[k];
		snprintf(n->peers[i].address, sizeof(n->peers[i].address), "%s", pc->address);
		if (gg_tls_site_init(&n->peers[i].tls_site, pc->site, pc->identity, &why)) {
			rc = gg_errf(err, err_size, -EINVAL, "peer %s: identity %s: %s", pc->site, pc->identity, why);
			goto fail;
		}
	}
	for (unsigned i = 0; i < n->self; i++) {
		n->accept_sites[n->accept_count] = n->peers[i].tls_site;
		n->accept_map[n->accept_count++] = (int)i;
	}

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
	n->rx_max = GG_WIRE_DATA_FIXED_BYTES + bound;
	/* Enough frames for what the streams keep queued (ar_may_encode), in
	 * flight and early, a few dozen megabytes at the default chunk size
	 * and at most a sixteenth of [limits] memory; an idle node lets them go. */
	unsigned pool_max = 64;
	pool_max = (unsigned)GG_MIN((uint64_t)pool_max, cfg->limits.memory_bytes / 16 / bound);
	gg_buf_pool_init(&n->frames, bound, pool_max);

	n->hello = (struct gg_wire_hello){ .streams = (uint16_t)cfg->transport.streams_per_peer,
					   .sites = (uint8_t)n->sites,
					   .codec = (uint8_t)cfg->compression.codec,
					   .scale = (uint8_t)fc.codec.scale,
					   .block_elems = fc.codec.block_elems,
					   .algorithm = (uint8_t)cfg->allreduce.algorithm,
					   .chunk_elems = n->chunk_elems,
					   .zstd = cfg->compression.zstd_level > 0 };
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

	struct gg_tls_options to = { .ca_file = cfg->tls.ca, .cert_file = cfg->tls.cert, .key_file = cfg->tls.key,
				     .crl_file = cfg->tls.crl, .ciphersuites = cfg->tls.ciphersuites };
	if ((rc = gg_tls_context_new(&to, &n->tls, err, err_size)))
		goto fail;
	n->sopts = (struct gg_tls_stream_options){ .handshake_timeout_us = cfg->transport.handshake_timeout_us,
						   .socket_buffer_bytes = (int)cfg->transport.socket_buffer_bytes };
	if ((rc = gg_loop_init(&n->loop, 1024))) {
		gg_errf(err, err_size, -EINVAL, "cannot set up io_uring: %s", strerror(-rc));
		goto fail;
	}
	n->loop.now_us = gg_monotonic_us();
	struct sockaddr_storage ss;
	socklen_t len;
	if (gg_net_addr_parse(cfg->site.listen, &ss, &len, &why)) {
		rc = gg_errf(err, err_size, -EINVAL, "listen address %s: %s", cfg->site.listen, why);
		goto fail;
	}
	n->listen_fd = gg_net_listen((struct sockaddr *)&ss, len, 128);
	if (n->listen_fd < 0) {
		rc = n->listen_fd;
		gg_errf(err, err_size, -EINVAL, "cannot listen on %s: %s", cfg->site.listen, strerror(-rc));
		goto fail;
	}
	if ((rc = gg_loop_accept(&n->loop, n->listen_fd, gg_loop_ud(GG_OP_ACCEPT, 0, 0)))) {
		gg_errf(err, err_size, -EINVAL, "cannot accept on %s: %s", cfg->site.listen, strerror(-rc));
		goto fail;
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
	for (unsigned i = 0; i < MAX_JOBS; i++) {
		struct job *j = &n->jobs[i];
		gg_ar_step_free(j->ar);
		while (j->early) {
			struct early *e = j->early;
			j->early = e->next;
			early_free(e);
		}
	}
	for (int ci = 0; ci < MAX_CONNS; ci++)
		if (n->conns[ci].used) {
			if (n->conns[ci].ts.fd > 0)
				close(n->conns[ci].ts.fd);
			gg_tls_engine_free(n->conns[ci].ts.tls);
			conn_free_slot(n, ci);
		}
	for (unsigned p = 0; p < GG_AR_MAX_SITES; p++) {
		struct peer *pe = &n->peers[p];
		for (struct out *o = pe->unacked, *next; o; o = next) {
			next = o->next;
			free_out(o);
		}
		for (struct out *o = pe->waiting, *next; o; o = next) {
			next = o->next;
			free_out(o);
		}
	}
	while (n->feedback_count)
		feedback_drop(n, n->feedback_count - 1);
	free(n->feedback);
	if (n->listen_fd >= 0)
		close(n->listen_fd);
	if (n->loop.ring.ring_fd > 0)
		gg_loop_fini(&n->loop);
	gg_frame_encoder_fini(&n->enc);
	gg_frame_decoder_fini(&n->dec);
	gg_buf_pool_fini(&n->frames);
	gg_tls_context_free(n->tls);
	free(n);
}
