/* The host backend: the ranks' connections (host_internal.h). */
#include "host_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#if HAVE_CUDA
#include "site_cuda.h"
#endif
#include "units.h"
#include "uring_msg.h"

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

void hb_out_kick(struct gg_host_backend *b, struct hb_conn *c)
{
	status_feed(c);
	if (c->send_busy || !c->out_count || c->shut)
		return;
	int rc = gg_loop_send(b->loop, c->fd, &c->out[c->out_head], c->out_len[c->out_head], hb_ud(b, K_SEND, c));
	if (rc) {
		/* Callers may be walking a job's ranks: the connection is
		 * dropped in the next tick, not under their feet. */
		hb_warn(b, "control connection %u: cannot queue a send: %s", c->index, strerror(-rc));
		c->io_error = rc;
		return;
	}
	c->send_busy = true;
}

union gg_ctrl_msg *hb_out_push(struct hb_conn *c, enum gg_ctrl_type type)
{
	/* The window check in on_allreduce keeps this from overflowing. */
	if (c->out_count == OUTQ)
		return NULL;
	unsigned i = (c->out_head + c->out_count++) % OUTQ;
	c->out_len[i] = gg_ctrl_init(&c->out[i], type);
	return &c->out[i];
}

/* Answers the connection's oldest request with DONE. */
GG_PRINTF(4, 5) void hb_answer(struct gg_host_backend *b, struct hb_conn *c, int status, const char *fmt, ...)
{
	struct hb_req *h = hb_req_head(c);
	union gg_ctrl_msg *m = hb_out_push(c, GG_CTRL_DONE);
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
	hb_req_pop(c);
	hb_out_kick(b, c);
}

/* ---- connections -------------------------------------------------------- */

/* Lets go of a mapped region: shared memory or a rank's CUDA allocation.
 * Returns true when the allocation stays open a while yet (hb_defer()). */
bool hb_region_unmap(struct gg_host_backend *b, struct hb_region *r)
{
	bool deferred = false;

	if (!r->base)
		return false;
#if HAVE_CUDA
	if (r->device) {
		deferred = hb_defer(b, r->base, 0, DEFER_IPC);
		if (!deferred)
			gg_site_cuda_close(r->base);
	} else
#endif
		munmap(r->base, r->size);
	*r = (struct hb_region){ 0 };
	b->stats.regions--;
	return deferred;
}

/* Closes a control socket, reading first what the client sent that was
 * not read (a HELLO a refusal answered unread, say): a Unix socket closed
 * with messages unread resets the connection, and the client would get
 * ECONNRESET before the REFUSE or ERROR queued for it. Bounded: a client
 * that keeps sending gets the reset. Descriptors passed with them go
 * with them. */
static void drain_close(int fd)
{
	char sink[512];

	for (int i = 0; i < 64 && recv(fd, sink, sizeof(sink), MSG_DONTWAIT) > 0; i++)
		;
	close(fd);
}

static void conn_free(struct gg_host_backend *b, struct hb_conn *c)
{
	for (unsigned i = 0; i < GG_CTRL_MAX_REGIONS; i++)
		hb_region_unmap(b, &c->regions[i]);
	drain_close(c->fd);
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

/* Whether closing connection c stays open for the rank's GPU allocations
 * the gateway has open: the rank may free them once its session's end
 * reaches it (gradgate.h, gg_session_close()), and CUDA leaves freeing
 * memory that another process has open undefined, but while an NCCL call
 * of the gateway's runs, letting go of them waits (hb_defer()), those the
 * rank unmapped already (as it does on close) included. The wait is
 * bounded: every such call ends by its deadline. */
bool hb_conn_holds_gpu(const struct gg_host_backend *b, const struct hb_conn *c)
{
	/* Put off until the end of a loop's turn (hb_deferred_free()), even
	 * where the call ended meanwhile. */
	if (c->ipc_deferred)
		return true;
	if (!hb_nccl_running(b))
		return false;
	for (unsigned i = 0; i < GG_CTRL_MAX_REGIONS; i++)
		if (c->regions[i].base && c->regions[i].device)
			return true;
	return false;
}

/* Moves a closing connection on: the socket is shut once its last answer
 * left (or the close deadline passed) and the rank's GPU allocations may
 * go, and freed once nothing is in flight on it. */
void hb_conn_settle(struct gg_host_backend *b, struct hb_conn *c, uint64_t now_us)
{
	if (c->state != C_CLOSING)
		return;
	if (c->linger && now_us < c->deadline_us)
		return;
	c->linger = NULL;
	if (hb_conn_holds_gpu(b, c))
		return;
	if (!c->send_busy && !c->recv_busy && (!c->out_count || c->shut)) {
		conn_free(b, c);
		return;
	}
	if (!c->shut && ((!c->out_count && !c->send_busy) || now_us >= c->deadline_us)) {
		shutdown(c->fd, SHUT_RDWR);
		c->shut = true;
	}
}

/* The core may still sum from and write into the memory of the step it
 * holds, even once that step failed at the ranks: when the rank lets
 * region `id` go (UNMAP, or leaving) while the step lies in it, the job
 * keeps it mapped until the core gives the step back. Returns true when
 * it did. */
bool hb_keep_for_core(struct hb_conn *c, unsigned id)
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
 * over (hb_tell_held()). */
bool hb_session_log_now(struct gg_host_backend *b)
{
	return gg_log_limit_now(&b->session_log, b->loop->now_us, 2 * b->opts.max_clients + 16);
}

/* Says, once its second is over, how many lines a limit held back (a
 * warning where they were: `fault`); returns
 * the earlier of `next` and when to look again. */
uint64_t hb_tell_held(struct gg_host_backend *b, struct gg_log_limit *l, bool fault, const char *what, uint64_t next)
{
	uint64_t again = UINT64_MAX;
	unsigned held = gg_log_limit_take(l, b->loop->now_us, &again);

	if (held)
		(fault ? hb_warn : hb_log)(b, "control connections: %u more %s, not logged", held, what);
	return again == UINT64_MAX ? next : hb_min_deadline(next, again);
}

/* Takes the connection out of its job; with `why`, the job cannot go on. */
static void conn_detach(struct gg_host_backend *b, struct hb_conn *c, const char *why)
{
	struct hb_job *j = c->job;

	if (!j)
		return;
	if (why) {
		if (hb_session_log_now(b))
			hb_log(b, "%s", why);
		hb_job_break(b, j, GG_ERR_RANK, why, true);
	}
	while (c->req_count)
		hb_req_pop(c);
	hb_keep_for_core(c, j->mem_region[c->rank]);
	j->ranks[c->rank] = NULL;
	j->connected--;
	c->job = NULL;
	hb_job_settle(b, j);
}

void hb_conn_closing(struct gg_host_backend *b, struct hb_conn *c)
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

	if (hb_step_in_progress(j))
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
void hb_conn_lost(struct gg_host_backend *b, struct hb_conn *c, int err)
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
	hb_conn_closing(b, c);
	c->linger = stays;
	hb_conn_settle(b, c, b->loop->now_us);
}

/* Any local user may connect at will: of their refusals, the log gets at
 * most this many lines a second, and a line once the second is over says
 * how many it left out (hb_tell_held()). */
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
GG_PRINTF(4, 5) void hb_conn_refuse(struct gg_host_backend *b, struct hb_conn *c, int code, const char *fmt, ...)
{
	union gg_ctrl_msg *m = hb_out_push(c, GG_CTRL_REFUSE);
	char text[TEXT];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	m->error.code = code;
	gg_ctrl_set_text(m->error.message, sizeof(m->error.message), text);
	log_refusal(b, (int)c->index, text);
	b->stats.refused++;
	hb_conn_closing(b, c);
	hb_out_kick(b, c);
}

/* Ends a registered rank's session: it leaves its job (which fails with
 * `why`, unless NULL), gets ERROR with `code` and `text`, and is closed. */
void hb_conn_end(struct gg_host_backend *b, struct hb_conn *c, int code, const char *text, const char *why)
{
	conn_detach(b, c, why);
	union gg_ctrl_msg *m = hb_out_push(c, GG_CTRL_ERROR);
	if (m) {
		m->error.code = code;
		m->error.seq = c->next_seq;
		gg_ctrl_set_text(m->error.message, sizeof(m->error.message), text);
	}
	hb_conn_closing(b, c);
	hb_out_kick(b, c);
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
	hb_conn_end(b, c, code, msg, why);
}

/* A registered rank broke the protocol: it gets ERROR and is closed; its
 * job fails, naming it. */
GG_PRINTF(4, 5) void hb_conn_fatal(struct gg_host_backend *b, struct hb_conn *c, int code, const char *fmt, ...)
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
GG_PRINTF(4, 5) void hb_conn_unserved(struct gg_host_backend *b, struct hb_conn *c, int code, const char *fmt,
				      ...)
{
	va_list ap;

	va_start(ap, fmt);
	conn_end_with(b, c, code, "could not be served", fmt, ap);
	va_end(ap);
}

/* The job failed while the rank waited for it, as hb_end_waiting_joiners()
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
bool hb_end_waiting_joiners(struct gg_host_backend *b, struct hb_job *j)
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
		hb_job_break(b, j, j->nccl_code, j->nccl_why, false);
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
bool hb_job_idle(const struct gg_host_backend *b, const struct hb_job *j)
{
	return b->opts.session_idle_us && j->connected && !hb_step_in_progress(j) &&
	       b->loop->now_us - j->active_us >= b->opts.session_idle_us;
}

unsigned hb_slots(const struct gg_host_backend *b)
{
	return b->opts.max_clients + STATUS_SLOTS;
}

/* The idle job idle longest, or NULL. */
static struct hb_job *idlest_job(const struct gg_host_backend *b)
{
	struct hb_job *best = NULL;

	for (struct hb_job *j = b->jobs; j; j = j->next)
		if (hb_job_idle(b, j) && (!best || j->active_us < best->active_us))
			best = j;
	return best;
}

/* Closes the sessions of idle job `j` (which is then gone) for a
 * connection that needs them: `needed` says what for. */
void hb_job_evict(struct gg_host_backend *b, struct hb_job *j, const char *needed)
{
	char idle[32], limit[32], text[TEXT];

	snprintf(text, sizeof(text), "gateway of site %s: job '%s' sent nothing for %s (session_idle = %s), and %s: "
		 "its sessions are closed", b->site, j->name, gg_format_elapsed(b->loop->now_us - j->active_us, idle,
		 sizeof(idle)), gg_format_duration(b->opts.session_idle_us, limit, sizeof(limit)), needed);
	hb_log(b, "%s", text);
	for (unsigned i = 0; i < hb_slots(b); i++) {
		struct hb_conn *c = &b->conns[i];
		if (c->state != C_ACTIVE || c->job != j)
			continue;
		bool last = j->connected == 1;
		b->stats.evicted++;
		hb_conn_end(b, c, GG_ERR_CLOSED, text, NULL);
		if (last)
			break;
	}
}

/* " (job 'x' of uid U idle longest, for T of session_idle = L)" or "". */
void hb_idle_hint(const struct gg_host_backend *b, char *buf, size_t size)
{
	const struct hb_job *best = NULL;
	char idle[32], limit[32];

	bool jobs = false;

	buf[0] = '\0';
	for (const struct hb_job *j = b->jobs; j; j = j->next) {
		jobs |= j->connected > 0;
		if (j->connected && !hb_step_in_progress(j) && (!best || j->active_us < best->active_us))
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

void hb_arm_recv(struct gg_host_backend *b, struct hb_conn *c)
{
	c->iov.iov_base = &c->in;
	c->iov.iov_len = sizeof(c->in);
	memset(&c->mh, 0, sizeof(c->mh));
	c->mh.msg_iov = &c->iov;
	c->mh.msg_iovlen = 1;
	c->mh.msg_control = c->cbuf;
	c->mh.msg_controllen = sizeof(c->cbuf);
	int rc = gg_loop_recvmsg(b->loop, c->fd, &c->mh, MSG_TRUNC | MSG_CMSG_CLOEXEC, hb_ud(b, K_RECV, c));
	if (rc) {
		hb_warn(b, "control connection %u: cannot queue a receive: %s", c->index, strerror(-rc));
		hb_conn_lost(b, c, rc);
		return;
	}
	c->recv_busy = true;
}

static struct hb_conn *first_free(struct gg_host_backend *b)
{
	for (unsigned i = 0; i < hb_slots(b); i++)
		if (b->conns[i].state == C_FREE)
			return &b->conns[i];
	return NULL;
}

/* Slots taken: those that count against max_clients, or the spare ones. */
static unsigned taken(const struct gg_host_backend *b, bool spare)
{
	unsigned n = 0;

	for (unsigned i = 0; i < hb_slots(b); i++)
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

	for (unsigned i = 0; i < hb_slots(b); i++) {
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

	for (unsigned i = 0; i < hb_slots(b); i++) {
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

	hb_conn_refuse(b, c, GG_ERR_REFUSED, "sent nothing for %s while a new connection needed its slot (max_clients = "
		       "%u are taken)", gg_format_elapsed(silent_for(b, c), waited, sizeof(waited)), b->opts.max_clients);
}

/* Connections within max_clients (spare: on the spare slots) that have
 * sent nothing yet, however briefly. */
static unsigned count_silent(const struct gg_host_backend *b, bool spare)
{
	unsigned n = 0;

	for (unsigned i = 0; i < hb_slots(b); i++)
		n += b->conns[i].state == C_HELLO && b->conns[i].spare == spare;
	return n;
}

/* When the next connection that has sent nothing will have been silent for
 * SILENT_MIN_US, or 0. */
static uint64_t silent_due(const struct gg_host_backend *b)
{
	uint64_t due = 0;

	for (unsigned i = 0; i < hb_slots(b); i++) {
		const struct hb_conn *c = &b->conns[i];
		if (c->state == C_HELLO && silent_for(b, c) < SILENT_MIN_US)
			due = hb_min_deadline(due, b->loop->now_us + SILENT_MIN_US - silent_for(b, c));
	}
	return due;
}

/* Makes room for `more` connections besides those held (and `except`,
 * which is not to go): connections silent since they came (for
 * SILENT_MIN_US at least, but with `young`), the longest first, then the
 * idle jobs idle longest give their places up, as many as it takes. True
 * when there is room. */
bool hb_make_room(struct gg_host_backend *b, unsigned more, const struct hb_conn *except, bool young)
{
	struct hb_job *idle;
	struct hb_conn *silent;

	while (held(b) + more > b->opts.max_clients) {
		if ((silent = oldest_silent(b, false, young, except)))
			silent_evict(b, silent);
		else if ((idle = idlest_job(b)))
			hb_job_evict(b, idle, "a new connection needs a slot (max_clients are taken)");
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
	drain_close(fd);
	log_refusal(b, -1, text);
	b->stats.refused++;
}

static void conn_start(struct gg_host_backend *b, struct hb_conn *c, int fd);

/* A new connection: it takes a free slot; or a spare one, until its first
 * message says what it is; or, with every slot taken, waits for one that
 * is being freed (that of the connection silent longest, or an idle
 * job's, closed now if need be); or is refused. Those already waiting go
 * first. */
void hb_conn_new(struct gg_host_backend *b, int fd)
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
	    (hb_make_room(b, b->waiting_count + 1, NULL, false) ||
	     held(b) + b->waiting_count + 1 <= b->opts.max_clients + count_silent(b, false))) {
		b->waiting[b->waiting_count].fd = fd;
		b->waiting[b->waiting_count++].until_us = b->loop->now_us + b->opts.hello_timeout_us;
		hb_serve_waiting(b, b->loop->now_us);
		return;
	}
	if (b->spare_wait_fd < 0 && oldest_silent(b, true, true, NULL)) {
		/* Every place is held by a session, and silent connections hold
		 * the spare slots: the one silent longest goes (once it has been
		 * for SILENT_MIN_US), and this one takes its slot. */
		b->spare_wait_fd = fd;
		b->spare_wait_until_us = b->loop->now_us + b->opts.hello_timeout_us;
		hb_serve_waiting(b, b->loop->now_us);
		return;
	}
	if (b->waiting_count < WAITING_MAX)
		hb_idle_hint(b, hint, sizeof(hint));
	else
		snprintf(hint, sizeof(hint), ", and %u more wait for slots being freed", WAITING_MAX);
	snprintf(text, sizeof(text), "the gateway of site %s already serves max_clients = %u connections%s", b->site,
		 b->opts.max_clients, hint);
	refuse_unslotted(b, fd, GG_ERR_REFUSED, text);
}

/* Refuses a connection that waited for a slot until its deadline, or
 * until the gateway began to stop, or came after that. */
void hb_refuse_waited(struct gg_host_backend *b, int fd)
{
	char text[TEXT];

	snprintf(text, sizeof(text), "the gateway of site %s %s", b->site,
		 b->stopping ? "is shutting down" : "had no slot free in time (max_clients are taken)");
	refuse_unslotted(b, fd, b->stopping ? GG_ERR_CLOSED : GG_ERR_REFUSED, text);
}

/* Connections waiting for a slot take those freed since, in order; those
 * past their deadline are refused. Returns the next deadline (0: none). */
uint64_t hb_serve_waiting(struct gg_host_backend *b, uint64_t now_us)
{
	uint64_t next = 0;

	if (b->spare_wait_fd >= 0) {
		struct hb_conn *c = b->stopping || taken(b, true) >= STATUS_SLOTS ? NULL : first_free(b);
		if (c) {
			c->spare = true;
			conn_start(b, c, b->spare_wait_fd);
			b->spare_wait_fd = -1;
		} else if (now_us >= b->spare_wait_until_us || b->stopping) {
			hb_refuse_waited(b, b->spare_wait_fd);
			b->spare_wait_fd = -1;
		} else {
			/* A spare slot being freed is this one's; else the one
			 * silent longest goes, once it has been long enough. */
			bool freeing = false;
			for (unsigned i = 0; i < hb_slots(b); i++)
				freeing |= b->conns[i].spare && b->conns[i].state == C_CLOSING;
			struct hb_conn *silent = freeing ? NULL : oldest_silent(b, true, false, NULL);
			if (silent)
				silent_evict(b, silent);
			next = hb_min_deadline(b->spare_wait_until_us, freeing || silent ? 0 : silent_due(b));
		}
	}
	/* Places for those waiting: silent connections that have been so
	 * long enough now, or idle jobs, give theirs up. */
	if (b->waiting_count && !b->stopping)
		hb_make_room(b, b->waiting_count, NULL, false);
	while (b->waiting_count) {
		struct hb_conn *c = b->stopping ? NULL : free_slot(b);
		int fd = b->waiting[0].fd;
		if (!c && now_us < b->waiting[0].until_us && !b->stopping) {
			/* and when a connection silent now has been long enough */
			return hb_min_deadline(hb_min_deadline(next, b->waiting[0].until_us), silent_due(b));
		}
		memmove(&b->waiting[0], &b->waiting[1], --b->waiting_count * sizeof(b->waiting[0]));
		if (c)
			conn_start(b, c, fd);
		else
			hb_refuse_waited(b, fd);
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
	hb_arm_recv(b, c);
}
