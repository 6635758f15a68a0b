/* The lanes of a node: each a thread with its own io_uring loop, its share
 * of every peer's streams (its mesh) and of every step's chunks (its part
 * of the step), talking to the coordinator and to the other lanes only by
 * mail (node_internal.h). Lane 0's thread also runs the coordinator; the
 * acceptor is one more lane, with streams but no parts. */
#include "node_internal.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "gradgate.h"
#include "units.h"

/* ---- a lane's early frames ------------------------------------------------- */

/* The index grows to at most 2^EARLY_BITS_MAX chains (32 MiB of them);
 * past that they grow longer. */
#define EARLY_BITS_MIN 8
#define EARLY_BITS_MAX 22

static uint64_t early_mix(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* What the index files a frame under: its job's entry (where the lane's
 * memory lies, which no peer knows), site, run, step and chunk. */
static uint64_t early_hash(const struct lane_job *lj, unsigned from, uint64_t run, uint64_t seq,
			   const struct gg_ar_chunk_id *id)
{
	uint64_t h = early_mix((uint64_t)(uintptr_t)lj ^ from);
	h = early_mix(h ^ run);
	h = early_mix(h ^ seq);
	return early_mix(h ^ ((uint64_t)id->phase << 40 | (uint64_t)id->origin << 32 | id->chunk));
}

/* The index's chain for hash h. */
static struct early **early_chain(const struct lane *ln, uint64_t h)
{
	return &ln->early_index[h & (((uint64_t)1 << ln->early_bits) - 1)];
}

static void early_link(struct lane *ln, struct early *e)
{
	struct early **chain = early_chain(ln, e->hash);

	e->hnext = *chain;
	if (*chain)
		(*chain)->hprev = &e->hnext;
	*chain = e;
	e->hprev = chain;
}

/* Files e in the index, which grows to about one chain per frame. Returns
 * 0, or -ENOMEM when there is no index at all (a full one that cannot grow
 * only has longer chains). */
static int early_index_add(struct lane *ln, struct early *e)
{
	if (!ln->early_index || (ln->early_count >= ((size_t)1 << ln->early_bits) && ln->early_bits < EARLY_BITS_MAX)) {
		const unsigned bits = ln->early_index ? ln->early_bits + 1 : EARLY_BITS_MIN;
		struct early **index = calloc((size_t)1 << bits, sizeof(*index));
		if (!index && !ln->early_index)
			return -ENOMEM;
		if (index) {
			struct early **old = ln->early_index;
			const size_t chains = old ? (size_t)1 << ln->early_bits : 0;
			ln->early_index = index;
			ln->early_bits = bits;
			for (size_t i = 0; i < chains; i++) {
				for (struct early *o = old[i], *next; o; o = next) {
					next = o->hnext;
					early_link(ln, o);
				}
			}
			free(old);
		}
	}
	early_link(ln, e);
	ln->early_count++;
	return 0;
}

/* The kept frame of lj that a copy sent again is of, or NULL. */
static struct early *early_find(struct lane *ln, const struct lane_job *lj, unsigned from,
				const struct gg_wire_step *ws, const struct gg_ar_chunk_id *id)
{
	if (!ln->early_index)
		return NULL;
	const uint64_t h = early_hash(lj, from, ws->run, ws->step, id);
	for (struct early *e = *early_chain(ln, h); e; e = e->hnext)
		if (e->hash == h && e->job == lj && e->from == from && e->wstep.run == ws->run && e->seq == ws->step &&
		    e->id.phase == id->phase && e->id.origin == id->origin && e->id.chunk == id->chunk)
			return e;
	return NULL;
}

/* Lets go of e, which its job's list no longer holds. */
static void early_free(struct lane *ln, struct early *e)
{
	*e->hprev = e->hnext;
	if (e->hnext)
		e->hnext->hprev = e->hprev;
	if (!--ln->early_count) { /* an idle lane keeps no index */
		free(ln->early_index);
		ln->early_index = NULL;
		ln->early_bits = 0;
	}
	atomic_fetch_sub_explicit(&ln->early_bytes[e->from], e->charge, memory_order_relaxed);
	gg_buf_put(e->msg);
	free(e);
}

/* ---- a lane's parts of steps ---------------------------------------------- */

/* Lets go of a never-started job's early frames without acknowledging
 * them: their sender keeps them, counted in its window. */
static void lane_job_clear(struct lane_job *lj)
{
	while (lj->early) {
		struct early *e = lj->early;
		lj->early = e->next;
		early_free(lj->lane, e);
	}
	memset(lj, 0, sizeof(*lj));
}

/* True when every early frame of lj came from `from`. */
static bool early_only_from(const struct lane_job *lj, unsigned from)
{
	for (const struct early *e = lj->early; e; e = e->next)
		if (e->from != from)
			return false;
	return true;
}

/* lane_job_find()'s `from` for an entry that takes only a free or idle
 * slot, never one holding early frames; and for one that takes only a
 * free slot. */
#define LANE_JOB_NO_EVICT (-2)
#define LANE_JOB_FREE_ONLY (-3)

/* An entry kept only to let go of an ended job's frames (ended_by). */
static bool tombstone(const struct lane_job *lj)
{
	return lj->ended_by && !lj->ar && !lj->early;
}

/* One whose job's frames may still be on the way. */
static bool tombstone_young(const struct lane_job *lj)
{
	return tombstone(lj) && lj->lane->loop.now_us - lj->ended_us < lj->lane->node->cfg->transport.heartbeat_timeout_us;
}

/* The entry of job `name`, or with `create` a new one for it. `from` is the
 * peer whose DATA asks for it, -1 for a step that starts here, or
 * LANE_JOB_NO_EVICT or LANE_JOB_FREE_ONLY. */
static struct lane_job *lane_job_find(struct lane *ln, const char *name, bool create, int from)
{
	struct lane_job *free_slot = NULL;

	for (unsigned i = 0; i < LANE_JOBS; i++) {
		struct lane_job *lj = &ln->jobs[i];
		if (lj->used && !strcmp(lj->name, name))
			return lj;
		if (!lj->used && !free_slot)
			free_slot = lj;
	}
	if (!create)
		return NULL;
	if (!free_slot) {
		/* An ended job's entry first, the oldest, once the frames still
		 * on the way had heartbeat_timeout to come (a stream that holds
		 * them longer is lost, and they with it). */
		for (unsigned i = 0; i < LANE_JOBS; i++) {
			struct lane_job *lj = &ln->jobs[i];
			if (tombstone(lj) && !tombstone_young(lj) && (!free_slot || lj->touched < free_slot->touched))
				free_slot = lj;
		}
	}
	if (!free_slot && from == LANE_JOB_FREE_ONLY)
		return NULL;
	if (!free_slot) {
		/* A lane learns of no job's end: it takes back the entry idle
		 * longest, which holds no part and no early frames; an ended
		 * job's whose frames may still come only for a step starting
		 * here, not for a peer's DATA (a burst of other jobs' frames
		 * would otherwise make room for the ended job's), unless ended
		 * jobs hold more than their half of the entries: a peer's DATA
		 * of a job about to start here must not be dropped for them. */
		unsigned ended = 0;
		for (unsigned i = 0; i < LANE_JOBS && from >= 0; i++)
			ended += tombstone(&ln->jobs[i]);
		const bool take_young = from == -1 || ended > LANE_JOBS - MAX_JOBS;
		for (unsigned i = 0; i < LANE_JOBS; i++) {
			struct lane_job *lj = &ln->jobs[i];
			if (!lj->ar && !lj->early && (take_young || !tombstone_young(lj)) &&
			    (!free_slot || lj->touched < free_slot->touched))
				free_slot = lj;
		}
		/* Then a job that never started here and holds only early
		 * frames: a peer could otherwise fill the table with jobs that
		 * never come, and lock every real one out. A step starting here
		 * takes the one whose DATA stopped longest ago; a peer's DATA
		 * only such a one of its own. */
		for (unsigned i = 0; i < LANE_JOBS && !free_slot && from != LANE_JOB_NO_EVICT; i++) {
			struct lane_job *lj = &ln->jobs[i];
			if (lj->ar || lj->last_seq || (from >= 0 && !early_only_from(lj, (unsigned)from)))
				continue;
			if (!free_slot || lj->touched < free_slot->touched)
				free_slot = lj;
		}
		if (!free_slot)
			return NULL;
		if (free_slot->early && peer_log_now(ln->logs, from >= 0 ? (unsigned)from : ln->node->self,
						     LOG_EARLY_DATA_DROPPED, ln->loop.now_us))
			gg_log(GG_LOG_WARN, "early_data_dropped", "job=%s reason=\"its slot went to job %s: it never "
			       "started here\"", free_slot->name, name);
		lane_job_clear(free_slot);
	}
	memset(free_slot, 0, sizeof(*free_slot));
	free_slot->lane = ln;
	free_slot->used = true;
	free_slot->touched = ++ln->touches;
	snprintf(free_slot->name, sizeof(free_slot->name), "%s", name);
	return free_slot;
}

/* The part's one report: the first made, sent as soon as there is memory
 * for it (lane_timers tries again). */
static void part_report(struct lane_job *lj, enum mail_type type, int code, const char *text)
{
	struct mail *m;

	if (lj->reported)
		return;
	if (!lj->owed) {
		lj->owed = true;
		lj->owed_type = type;
		lj->owed_code = code;
		snprintf(lj->owed_text, sizeof(lj->owed_text), "%s", text ? text : "");
	}
	if (!(m = mail_new(lj->owed_type)))
		return;
	lj->reported = true;
	lj->owed = false;
	m->slot = lj->slot;
	m->seq = lj->seq;
	m->code = lj->owed_code;
	memcpy(m->u.text, lj->owed_text, sizeof(m->u.text));
	tell_coordinator(lj->lane, m);
}

/* Mail for the coordinator about step `seq` in its slot `slot`; false
 * when there was no memory for it. */
static bool tell_slot(struct lane *ln, enum mail_type type, unsigned slot, uint64_t seq, int code, const char *text)
{
	struct mail *m = mail_new(type);

	if (!m) {
		gg_log(GG_LOG_ERROR, "out_of_memory", "what=\"a message from lane %u\" retry=true", ln->index);
		return false;
	}
	m->slot = slot;
	m->seq = seq;
	m->code = code;
	if (text)
		snprintf(m->u.text, sizeof(m->u.text), "%s", text);
	tell_coordinator(ln, m);
	return true;
}

/* A lane refuses a step when it has no room for the job. */
static void lane_refuse(struct lane *ln, unsigned slot, uint64_t seq, const char *job)
{
	char text[GG_NODE_ERROR_MAX];

	if (job != ln->refused_job[slot])
		snprintf(ln->refused_job[slot], sizeof(ln->refused_job[slot]), "%s", job);
	snprintf(text, sizeof(text), "step %llu of job '%s': lane %u holds %d jobs already (running, or with frames "
		 "of their next step)", (unsigned long long)seq, job, ln->index, LANE_JOBS);
	ln->refused_owed[slot] = tell_slot(ln, M_PART_FAILED, slot, seq, GG_ERR_LIMIT, text) ? 0 : seq;
}

GG_PRINTF(3, 4) static void part_fail(struct lane_job *lj, int code, const char *fmt, ...)
{
	char text[GG_NODE_ERROR_MAX];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	part_report(lj, M_PART_FAILED, code, text);
}

static void part_check_done(struct lane_job *lj)
{
	if (lj->ar && gg_ar_step_done(lj->ar))
		part_report(lj, M_PART_DONE, 0, NULL);
}

/* The element count in a frame's header (frame.h: bytes 8-15,
 * little-endian), of a frame made here or decoded already. */
static uint64_t frame_elems(const uint8_t *frame)
{
	uint64_t elems = 0;

	for (int b = 7; b >= 0; b--)
		elems = elems << 8 | frame[8 + b];
	return elems;
}

/* What the part's codecs spent since the last call, counted for the lane. */
static void part_count_times(struct lane_job *lj)
{
	struct lane_stats *st = &lj->lane->stats;

	count(&st->encode_ns, lj->times.encode_ns - lj->times_counted.encode_ns);
	count(&st->decode_ns, lj->times.decode_ns - lj->times_counted.decode_ns);
	lj->times_counted = lj->times;
}

/* The part is over: the time it was in progress and not at work on its
 * chunks went to waiting (frames, DONEs, TLS, the kernel). */
static void part_free(struct lane_job *lj)
{
	if (!lj->ar)
		return;
	part_count_times(lj);
	uint64_t busy = lj->times.encode_ns + lj->times.decode_ns + lj->gather_ns + lj->deliver_ns;
	uint64_t spent = now_ns() - lj->start_ns;
	count(&lj->lane->stats.wait_ns, spent > busy ? spent - busy : 0);
	gg_ar_step_free(lj->ar);
	lj->ar = NULL;
}

/* The step engine's send: DATA for one peer, queued behind the window. */
static int ar_send(void *ctx, unsigned to, const struct gg_ar_chunk_id *id, struct gg_buf *frame)
{
	struct lane_job *lj = ctx;
	struct lane *ln = lj->lane;

	return gg_mesh_send_data(ln->mesh, to, &lj->wstep, id, frame, frame_elems(frame->data) * sizeof(float));
}

/* A part may encode another chunk of its own while no peer has more than
 * two chunks per stream of the lane queued ahead of its sockets: enough to
 * keep every stream busy, few enough that encoding keeps pace with the
 * network and few frames are alive at once. */
static bool ar_may_encode(void *ctx)
{
	const struct lane_job *lj = ctx;
	const struct lane *ln = lj->lane;
	const struct gg_node *n = ln->node;
	const unsigned S = (unsigned)n->cfg->transport.streams_per_peer;
	const unsigned own = (S + n->nlanes - 1 - ln->index) / n->nlanes;
	const unsigned limit = 2u * GG_MAX(own, 1u);

	for (unsigned p = 0; p < n->sites; p++)
		if (p != n->self && gg_mesh_queued(ln->mesh, p, limit) >= limit)
			return false;
	return true;
}

/* Calls the owner's gather or deliver, adding its time to the part's and
 * the lane's. */
static void timed_call(void (*fn)(void *, uint64_t, uint64_t), void *arg, uint64_t offset, uint64_t n,
		       uint64_t *part_ns, atomic_uint_fast64_t *lane_ns)
{
	if (!fn)
		return;
	uint64_t t0 = now_ns();
	fn(arg, offset, n);
	uint64_t dt = now_ns() - t0;
	*part_ns += dt;
	count(lane_ns, dt);
}

static void ar_gather(void *ctx, uint64_t offset, uint64_t n)
{
	struct lane_job *lj = ctx;

	timed_call(lj->gather, lj->arg, offset, n, &lj->gather_ns, &lj->lane->stats.gather_ns);
}

static void ar_deliver(void *ctx, uint64_t offset, uint64_t n)
{
	struct lane_job *lj = ctx;

	timed_call(lj->deliver, lj->arg, offset, n, &lj->deliver_ns, &lj->lane->stats.deliver_ns);
}

static const struct gg_ar_ops ar_ops = { ar_send, ar_may_encode, ar_gather, ar_deliver };

/* Acknowledges DATA on the stream it came on, which may be another lane's. */
static void lane_ack(struct lane *ln, unsigned via_lane, struct gg_mesh_via via, const char *job, uint64_t run,
		     uint64_t seq, const struct gg_ar_chunk_id *id)
{
	struct mail *m;

	if (via_lane == ln->index) {
		gg_mesh_ack(ln->mesh, via, job, run, seq, id);
		return;
	}
	if (!(m = mail_new(M_ACK_SEND)))
		return; /* unacknowledged: the peer sends it again after its next reconnect */
	m->via = via;
	m->seq = seq;
	snprintf(m->u.ack.job, sizeof(m->u.ack.job), "%s", job);
	m->u.ack.run = run;
	m->u.ack.id = *id;
	post(&ln->node->lanes[via_lane].inbox, m);
}

static const char *wire_dtype_name(uint8_t dtype)
{
	return dtype == GG_WIRE_F32 ? "float32" : dtype == GG_WIRE_BF16 ? "bfloat16" : "unknown";
}

/* The part's step failed with rc and err (gg_ar_step_on_frame() or
 * gg_ar_step_resume()). The message names the peer at fault, if any, by
 * its index: named here, as it travels to every site. */
static void part_step_failed(struct lane_job *lj, int rc, const char *err)
{
	const struct gg_node *n = lj->lane->node;
	const unsigned bad = gg_ar_step_fault_site(lj->ar);
	const int code = rc == -ENOMEM ? GG_ERR_NOMEM : GG_ERR_SITE;

	if (bad < n->sites)
		part_fail(lj, code, "step %llu of job '%s': %s (site index %u is %s)", (unsigned long long)lj->seq,
			  lj->name, err, bad, n->names[bad]);
	else
		part_fail(lj, code, "step %llu of job '%s': %s", (unsigned long long)lj->seq, lj->name, err);
}

/* "fp32", or "int8 (blocks of 64, fp16 scales)": codec settings as a
 * frame's header carries them. */
static const char *codec_text(const struct gg_codec_params *p, char *buf, size_t size)
{
	if (p->codec != GG_CODEC_INT8 && p->codec != GG_CODEC_INT4 && !p->block_elems && p->scale == GG_SCALE_F32)
		snprintf(buf, size, "%s", gg_codec_name(p->codec));
	else
		snprintf(buf, size, "%s (blocks of %u, %s scales)", gg_codec_name(p->codec), p->block_elems,
			 p->scale == GG_SCALE_F16 ? "fp16" : "fp32");
	return buf;
}

/* Hands the part a frame of its step; acknowledged once used. */
static void part_feed(struct lane_job *lj, unsigned from, unsigned via_lane, struct gg_mesh_via via,
		      const struct gg_wire_step *ws, const struct gg_ar_chunk_id *id, const uint8_t *frame, size_t len)
{
	struct lane *ln = lj->lane;
	const struct gg_node *n = ln->node;
	char err[GG_AR_ERROR_MAX];

	lane_ack(ln, via_lane, via, lj->name, ws->run, ws->step, id);
	if (lj->reported && !gg_ar_step_done(lj->ar))
		return; /* failed already */
	if (lj->part_run[from] && ws->run != lj->part_run[from] && lj->part_run[from] == lj->guessed_run[from]) {
		/* lane_data() lets no earlier run's frame through: the one taken
		 * before on the step-1 guess was of a run over at the site, which
		 * this site did not know of when the step started (no word of
		 * that run had come). The sum cannot stand, even where the part
		 * said it was whole. (A later run's frame after frames of a run
		 * known here is a copy to this step: the run it pairs with may
		 * well have completed it there.) */
		char text[GG_NODE_ERROR_MAX];
		snprintf(text, sizeof(text),
			 "step %llu of job '%s': site %s's frames of it came from two of its runs of the job (the "
			 "earlier one ended there; its frame came late)",
			 (unsigned long long)lj->wstep.step, lj->name, n->names[from]);
		lj->part_run[from] = ws->run;
		if (lj->reported)
			(void)tell_slot(ln, M_PART_FAILED, lj->slot, lj->seq, GG_ERR_SITE, text);
		else
			part_fail(lj, GG_ERR_SITE, "%s", text);
		return;
	}
	if (!lj->part_run[from] && (lj->guess & (1u << from)))
		lj->guessed_run[from] = ws->run;
	lj->part_run[from] = ws->run;
	/* Each field the fingerprint covers, then the fingerprint: a frame
	 * whose fields disagree with it is refused all the same. */
	if (ws->tensor_id != lj->wstep.tensor_id || ws->count != lj->wstep.count || ws->dtype != lj->wstep.dtype) {
		/* Named as the ranks named them: the message travels to every
		 * site, where "this site" would name another. */
		part_fail(lj, GG_ERR_MISMATCH,
			  "step %llu of job '%s': site %s announced tensor %u with %llu elements of %s, "
			  "site %s tensor %u with %llu elements of %s",
			  (unsigned long long)lj->wstep.step, lj->name, n->names[from], ws->tensor_id,
			  (unsigned long long)ws->count, wire_dtype_name(ws->dtype), n->names[n->self],
			  lj->wstep.tensor_id, (unsigned long long)lj->wstep.count, wire_dtype_name(lj->wstep.dtype));
		return;
	}
	if (ws->fingerprint != lj->wstep.fingerprint) {
		/* All else alike: the algorithm differs (auto, plans apart), or
		 * with the same one the chunks (auto's rule differs there). */
		const bool peer_direct = id->phase == GG_AR_DIRECT;
		if (peer_direct == (lj->algo == GG_ALLREDUCE_DIRECT))
			part_fail(lj, GG_ERR_MISMATCH,
				  "step %llu of job '%s': site %s cuts it in other chunks than site %s (step "
				  "fingerprints %016llx and %016llx: auto's rule differs there, another version of "
				  "gradgate?)",
				  (unsigned long long)lj->wstep.step, lj->name, n->names[from], n->names[n->self],
				  (unsigned long long)ws->fingerprint, (unsigned long long)lj->wstep.fingerprint);
		else
			part_fail(lj, GG_ERR_MISMATCH, "step %llu of job '%s': site %s runs it %s, site %s %s",
				  (unsigned long long)lj->wstep.step, lj->name, n->names[from],
				  peer_direct ? "direct" : "by ring", n->names[n->self], peer_direct ? "by ring" : "direct");
		return;
	}
	/* The frame's header names its codec: one other than the codec both
	 * sites' HELLOs agreed on is refused rather than decoded (the sums of
	 * the sites would part). A header that does not parse is left to the
	 * step, whose decoder names what is wrong. */
	struct gg_frame_info info;
	const struct gg_codec_params *want = &n->frame_cfg.codec;
	bool parsed = !gg_frame_parse_header(frame, len, &n->frame_limits, &info, err, sizeof(err));
	if (parsed && (info.params.codec != want->codec || info.params.block_elems != want->block_elems ||
		       info.params.scale != want->scale)) {
		char theirs[64], ours[64];
		part_fail(lj, GG_ERR_SITE, "step %llu of job '%s': site %s sent %s chunk %u of %u in codec %s, where "
			  "the sites agreed on %s", (unsigned long long)lj->wstep.step, lj->name, n->names[from],
			  gg_ar_phase_name(id->phase), id->chunk, id->origin,
			  codec_text(&info.params, theirs, sizeof(theirs)), codec_text(want, ours, sizeof(ours)));
		return;
	}
	int rc = gg_ar_step_on_frame(lj->ar, from, id, frame, len, err, sizeof(err));
	part_count_times(lj);
	if (rc < 0) {
		part_step_failed(lj, rc, err);
		return;
	}
	if (rc == 0) { /* taken, not a copy already received */
		count(&ln->stats.peers[from].data_in, len);
		count(&ln->stats.peers[from].raw_in, parsed ? info.elems * sizeof(float) : 0);
	}
	part_check_done(lj);
}

/* Acknowledges a kept frame on the streams its copies came on, from the
 * `from`th on. */
static void early_ack(struct lane_job *lj, const struct early *e, unsigned from)
{
	for (unsigned i = from; i < e->nvias; i++)
		lane_ack(lj->lane, e->vias[i].lane, e->vias[i].via, lj->name, e->wstep.run, e->seq, &e->id);
}

/* A copy of a kept frame came again, on lane via_lane's stream `via`. */
static void early_again(struct early *e, unsigned via_lane, struct gg_mesh_via via)
{
	for (unsigned i = 0; i < e->nvias; i++)
		if (e->vias[i].lane == via_lane && e->vias[i].via.conn == via.conn && e->vias[i].via.gen == via.gen)
			return;
	if (e->nvias == EARLY_VIAS) /* the oldest stream is the likeliest gone */
		memmove(&e->vias[0], &e->vias[1], (EARLY_VIAS - 1) * sizeof(e->vias[0]));
	else
		e->nvias++;
	e->vias[e->nvias - 1] = (struct early_via){ via_lane, via };
}

/* Frames that waited for steps from_seq..to_seq, which are over without
 * them (aborted, or refused): acknowledged, so their senders stop keeping
 * them. */
static void drop_early(struct lane_job *lj, uint64_t from_seq, uint64_t to_seq, uint32_t senders)
{
	struct early **pp = &lj->early;

	while (*pp) {
		struct early *e = *pp;
		if (e->seq < from_seq || e->seq > to_seq || !(senders & (1u << e->from))) {
			pp = &e->next;
			continue;
		}
		*pp = e->next;
		early_ack(lj, e, 0);
		early_free(lj->lane, e);
	}
}

/* Peer `peer` restarted: its new instance's runs count from its clock at
 * the new start, which a clock set back would put behind the old ones;
 * what this lane knew of the old instance's runs would refuse the new
 * one's frames. */
static void forget_runs_of(struct lane *ln, unsigned peer)
{
	for (unsigned i = 0; i < LANE_JOBS; i++)
		ln->jobs[i].run_seen[peer] = ln->jobs[i].run_over[peer] = 0;
}

/* Lets go of the early frames of runs that are over: of `sites` (by bit),
 * every frame but those of a run later than the one known over there; of
 * the others, every frame of a site not in `keep` (a job over at one site
 * cannot complete anywhere, but a site that began a new run of it since
 * keeps that run's frames), and those of runs known over. */
static void drop_runs_over(struct lane_job *lj, uint32_t sites, uint32_t keep)
{
	struct early **pp = &lj->early;

	while (*pp) {
		struct early *e = *pp;
		const uint32_t bit = 1u << e->from;
		const uint64_t over = lj->run_over[e->from];
		const bool later = !run_within(e->wstep.run, over);
		if ((sites & bit) ? over && later : (keep & bit) && later) {
			pp = &e->next;
			continue;
		}
		*pp = e->next;
		early_ack(lj, e, 0);
		early_free(lj->lane, e);
	}
}

/* A frame of step `seq` of lj that a peer may well send ahead of this site:
 * the next step of a job that ran here. Any other early frame is a guess:
 * a job that has not started here (yet), or steps further ahead, which a
 * peer keeping to the protocol does not send. */
static bool early_expected(const struct lane_job *lj, uint64_t seq)
{
	return lj->last_seq && seq == lj->last_seq + 1;
}

/* What mail posted for a peer's message counts in the lane it goes to:
 * DATA as the early frames count, its bytes and EARLY_ENTRY_BYTES (the
 * window counts the bytes; frames down to 1 KiB fit the budget), an ACK
 * its mail, which only a peer that makes ACKs up sends in numbers. */
static uint64_t mail_charge(const struct mail *f)
{
	return f->base.type == M_DATA ? f->u.data.payload->len + EARLY_ENTRY_BYTES : sizeof(*f);
}

/* Posts mail for peer f->peer's message to lane `to`, within the lane's
 * budget for that peer (early_limit()): a peer that sends faster than the
 * lane takes its messages, beyond its window, cannot queue them without
 * bound. -ENOBUFS (f freed) past it. */
static int lane_forward(struct lane *ln, unsigned to, struct mail *f)
{
	struct lane *t = &ln->node->lanes[to];
	const uint64_t charge = mail_charge(f);

	if (atomic_fetch_add_explicit(&t->fwd_bytes[f->peer], charge, memory_order_relaxed) + charge >
	    early_limit(ln->node)) {
		atomic_fetch_sub_explicit(&t->fwd_bytes[f->peer], charge, memory_order_relaxed);
		if (f->base.type == M_DATA)
			gg_buf_put(f->u.data.payload);
		free(f);
		return -ENOBUFS;
	}
	f->charged = true;
	post(&t->inbox, f);
	return 0;
}

/* Mail taken by this lane gives its charge back (mail no other lane
 * posted for a peer carries none). */
static void lane_forward_taken(struct lane *ln, const struct mail *f)
{
	if (f->charged)
		atomic_fetch_sub_explicit(&ln->fwd_bytes[f->peer], mail_charge(f), memory_order_relaxed);
}

/* Posts mail for a peer's message to the coordinator, within
 * PEER_MAILS_MAX of that peer's; -ENOBUFS (f freed) past it. */
static int coordinator_hears(struct lane *ln, struct mail *f)
{
	atomic_uint_fast32_t *count = &ln->node->peer_mails[f->peer];

	if (atomic_fetch_add_explicit(count, 1, memory_order_relaxed) >= PEER_MAILS_MAX) {
		atomic_fetch_sub_explicit(count, 1, memory_order_relaxed);
		free(f);
		return -ENOBUFS;
	}
	f->charged = true;
	tell_coordinator(ln, f);
	return 0;
}

/* A walk of the lists to make room for an expected frame looks at no more
 * frames than this: a peer's own expected frames, which it does not let
 * go, cannot make each of its frames cost a walk of all of them. */
#define EARLY_ROOM_WALK 4096

/* The early frames of `from` on this lane stay within what a peer may have
 * unacknowledged, no more than our inflight_per_peer (each site keeps to
 * the smaller of the two sites' windows; the peer's lanes share it, each
 * may pass its share by one frame), whatever the peer's own window says,
 * each counted with its bookkeeping (EARLY_ENTRY_BYTES), which the window
 * does not count: half as much again as the window leaves room for
 * that down to frames of 1 KiB. Past it, frames this site does not
 * expect make room for one it does; they, and an unexpected frame that
 * finds no room, are let go unacknowledged: the sender keeps them counted
 * in its window, which stays shut to new DATA until this site catches up.
 * Returns whether a frame that costs `charge` for step `seq` of lj may be
 * kept. */
static bool early_room(struct lane *ln, struct lane_job *lj, unsigned from, uint64_t seq, uint64_t charge)
{
	struct gg_node *n = ln->node;
	const uint64_t limit = early_limit(n);
	uint64_t held = atomic_load_explicit(&ln->early_bytes[from], memory_order_relaxed);
	unsigned dropped = 0, walked = 0;

	for (unsigned i = 0; i < LANE_JOBS && held + charge > limit && early_expected(lj, seq); i++) {
		struct lane_job *o = &ln->jobs[i];
		for (struct early **pp = &o->early; *pp && held + charge > limit && walked < EARLY_ROOM_WALK;
		     walked++) {
			struct early *e = *pp;
			if (e->from != from || early_expected(o, e->seq)) {
				pp = &e->next;
				continue;
			}
			*pp = e->next;
			held -= e->charge;
			early_free(ln, e);
			dropped++;
		}
	}
	if (held + charge <= limit && !dropped)
		return true;
	atomic_fetch_add_explicit(&ln->early_refused, dropped + (held + charge > limit), memory_order_relaxed);
	if (peer_log_now(ln->logs, from, LOG_EARLY_DATA_REFUSED, ln->loop.now_us))
		gg_log(GG_LOG_WARN, "early_data_refused",
		       "site=%s job=%s step=%llu held=%llu limit=%llu reason=\"DATA for steps not started here "
		       "beyond this site's inflight_per_peer, which the peer should keep to; frames this site "
		       "does not expect are not kept and not acknowledged\"", n->names[from], lj->name,
		       (unsigned long long)seq, (unsigned long long)held, (unsigned long long)limit);
	return held + charge <= limit;
}

/* DATA for a chunk of this lane's, which came on lane via_lane's stream
 * `via`. Returns 0, or -ENOMEM when it could not be kept. */
static int lane_data(struct lane *ln, unsigned from, unsigned via_lane, struct gg_mesh_via via,
		     const struct gg_wire_msg *m, struct gg_buf *payload)
{
	const struct gg_wire_step *ws = &m->u.data.step;
	struct lane_job *lj = lane_job_find(ln, ws->job, true, (int)from);

	if (!lj) {
		if (peer_log_now(ln->logs, from, LOG_DATA_DROPPED, ln->loop.now_us))
			gg_log(GG_LOG_WARN, "data_dropped", "site=%s job=%s reason=\"too many jobs\"",
			       ln->node->names[from], ws->job);
		return 0;
	}
	/* Of a run over at its sender: nobody needs it, and kept it would hold
	 * memory and the sender's window for good, or pass for a frame of the
	 * run after it. */
	if (run_within(ws->run, lj->run_over[from])) {
		lane_ack(ln, via_lane, via, ws->job, ws->run, ws->step, &m->u.data.id);
		return 0;
	}
	if (lj->ended_by & (1u << from)) {
		/* No run of the site known over: all but step 1 are of the old
		 * one, and step 1 is taken for a new run's on a guess. */
		if (!lj->run_over[from] && ws->step != 1) {
			lane_ack(ln, via_lane, via, ws->job, ws->run, ws->step, &m->u.data.id);
			return 0;
		}
		if (!lj->run_over[from])
			lj->guessed_run[from] = ws->run;
		lj->ended_by &= ~(1u << from);
		lj->rerun_by |= 1u << from;
	}
	/* A site starts a run of a name only once its run before ended: the
	 * runs before this one are over there, and their frames go. */
	if (run_raise(&lj->run_over[from], ws->run - 1))
		drop_runs_over(lj, 1u << from, ~0u);
	if (ws->run && !run_within(ws->run, lj->run_seen[from])) {
		/* The coordinator judges the peer's DONE, ABORT and END by it:
		 * the frame is taken only once it is told. */
		struct mail *r = mail_new(M_PEER_RUN);
		if (!r)
			return -ENOMEM;
		r->peer = from;
		r->run = ws->run;
		snprintf(r->u.job, sizeof(r->u.job), "%s", ws->job);
		int rc = coordinator_hears(ln, r);
		if (rc)
			return rc;
		lj->run_seen[from] = ws->run;
	}
	if (lj->ar && ws->step == lj->seq) {
		part_feed(lj, from, via_lane, via, ws, &m->u.data.id, m->u.data.frame, m->u.data.frame_bytes);
		return 0;
	}
	if (ws->step <= lj->last_seq || (ws->step >= lj->forgot_lo && ws->step <= lj->forgot_hi)) {
		/* A step already finished or failed here: a re-send, or data of a
		 * step a site aborted. Acknowledge so the peer lets it go. */
		lane_ack(ln, via_lane, via, ws->job, ws->run, ws->step, &m->u.data.id);
		/* Step 1 again, once steps ran here: a new run of the name at
		 * `from` (the old run's frames are not sent again once it ended
		 * there), unless this is the run's own step 1 still. The
		 * coordinator knows which (rerun_seen). */
		uint64_t now = ln->loop.now_us;
		if (ws->step == 1 && (!lj->rerun_us || now - lj->rerun_us >= RERUN_TELL_US)) {
			struct mail *r = mail_new(M_RERUN);
			if (r) {
				lj->rerun_us = now;
				r->peer = from;
				snprintf(r->u.job, sizeof(r->u.job), "%s", ws->job);
				tell_coordinator(ln, r);
			}
		}
		return 0;
	}
	/* Not started here yet: keep it unacknowledged, so the peer's window
	 * bounds how much waits. A copy sent again came on another stream,
	 * which its ACK takes too. */
	struct early *e = early_find(ln, lj, from, ws, &m->u.data.id);
	if (e) {
		early_again(e, via_lane, via);
		return 0;
	}
	const size_t len = m->u.data.frame_bytes;
	const uint64_t charge = len + EARLY_ENTRY_BYTES;
	if (!early_room(ln, lj, from, ws->step, charge))
		return 0; /* refused on purpose: left unacknowledged, not resent at once */
	/* A small frame is copied out of its message's buffer, which has room
	 * for a whole chunk: what is kept is then about what is counted. */
	const bool copy = payload->cap > 2 * charge;
	if (!(e = malloc(sizeof(*e) + (copy ? len : 0))))
		return -ENOMEM;
	*e = (struct early){ .charge = charge, .job = lj, .from = from, .vias = { { via_lane, via } }, .nvias = 1,
			     .seq = ws->step, .wstep = *ws, .id = m->u.data.id, .msg = copy ? NULL : payload,
			     .frame = copy ? e->copy : m->u.data.frame, .frame_len = len,
			     .hash = early_hash(lj, from, ws->run, ws->step, &m->u.data.id) };
	if (copy)
		memcpy(e->copy, m->u.data.frame, len); /* after the assignment, which may write where copy starts */
	if (early_index_add(ln, e)) {
		free(e);
		return -ENOMEM;
	}
	if (!copy)
		gg_buf_get(payload);
	atomic_fetch_add_explicit(&ln->early_bytes[from], charge, memory_order_relaxed);
	e->next = lj->early;
	lj->early = e;
	lj->touched = ++ln->touches; /* a job whose DATA keeps coming is not the one let go */
	return 0;
}

static void lane_start(struct lane *ln, const struct mail *m)
{
	struct gg_node *n = ln->node;
	struct lane_job *lj = lane_job_find(ln, m->u.start.wstep.job, true, -1);
	char why[GG_AR_ERROR_MAX];

	if (!lj) {
		lane_refuse(ln, m->slot, m->seq, m->u.start.wstep.job);
		return;
	}
	part_free(lj);
	lj->ended_by = lj->rerun_by = 0;
	memset(lj->part_run, 0, sizeof(lj->part_run));
	lj->guess = m->u.start.guess;
	for (unsigned p = 0; p < GG_AR_MAX_SITES; p++)
		if (lj->guess & (1u << p))
			lj->guessed_run[p] = 0; /* the part's first frame from p says (part_feed()) */
	lj->slot = m->slot;
	lj->seq = m->seq;
	lj->wstep = m->u.start.wstep;
	lj->algo = m->u.start.algo;
	lj->deadline_us = m->u.start.deadline_us;
	lj->timeout_us = m->u.start.timeout_us;
	lj->gather = m->u.start.gather;
	lj->deliver = m->u.start.deliver;
	lj->arg = m->u.start.arg;
	lj->reported = false;
	lj->owed = false;
	lj->last_seq = m->seq;
	lj->touched = ++ln->touches;
	lj->times = lj->times_counted = (struct gg_ar_times){ 0 };
	lj->gather_ns = lj->deliver_ns = 0;
	lj->start_ns = now_ns();
	/* What the coordinator knows of runs over, which this entry may not
	 * (made anew once an ended job's entry went to another job). */
	uint32_t raised = 0;
	for (unsigned p = 0; p < n->sites; p++)
		if (p != n->self && run_raise(&lj->run_over[p], m->runs[p]))
			raised |= 1u << p;
	if (raised)
		drop_runs_over(lj, raised, ~0u);

	struct feedback_slot *fb = m->u.start.feedback;
	struct gg_ar_config ac = { .sites = n->sites, .self = n->self, .algo = m->u.start.algo,
				   .count = lj->wstep.count, .chunk_elems = m->u.start.chunk_elems, .enc = &ln->enc,
				   .dec = &ln->dec, .feedback = fb && !fb->device ? &fb->fb : NULL, .pool = &n->frames,
				   .times = &lj->times, .part = ln->index, .parts = n->nlanes };
	int rc = 0;
#if HAVE_CUDA
	if (m->u.start.device) {
		if (!ln->gpu_ready && !(rc = gg_ar_mem_cuda_init(&ln->gpu, n->frame_limits.max_raw_bytes, NULL, why,
								  sizeof(why)))) {
			ln->gpu.frees_held = &n->gpu_frees_held;
			ln->gpu_ready = true;
		}
		if (rc) {
			part_fail(lj, rc == -ENOMEM ? GG_ERR_NOMEM : GG_ERR_SYSTEM,
				  "step %llu of job '%s': the GPU of the gateway of site %s: %s", (unsigned long long)m->seq,
				  lj->name, n->names[n->self], why);
			return;
		}
		gg_ar_mem_cuda_view(&lj->gpu, &ln->gpu, fb ? &fb->gpu : NULL);
		ac.mem = &lj->gpu.mem;
	}
#endif
	rc = gg_ar_step_start(&lj->ar, &ac, m->u.start.input, m->u.start.result, &ar_ops, lj, why, sizeof(why));
	part_count_times(lj);
	if (rc) {
		part_fail(lj, rc == -ENOMEM ? GG_ERR_NOMEM : GG_ERR_SITE, "step %llu of job '%s': %s",
			  (unsigned long long)m->seq, lj->name, why);
		return;
	}
	/* Frames that arrived before this lane started the step. */
	struct early **pp = &lj->early;
	while (*pp) {
		struct early *e = *pp;
		if (e->seq != lj->seq) {
			pp = &e->next;
			continue;
		}
		*pp = e->next;
		early_ack(lj, e, 1);
		part_feed(lj, e->from, e->vias[0].lane, e->vias[0].via, &e->wstep, &e->id, e->frame, e->frame_len);
		early_free(ln, e);
	}
	part_check_done(lj);
}

static void lane_end(struct lane *ln, const struct mail *m)
{
	struct lane_job *lj = NULL;

	for (unsigned i = 0; i < LANE_JOBS && !lj; i++)
		if (ln->jobs[i].used && ln->jobs[i].ar && ln->jobs[i].slot == m->slot && ln->jobs[i].seq == m->seq)
			lj = &ln->jobs[i];
	if (!lj)
		lj = lane_job_find(ln, m->u.job, false, -1);
	if (lj) {
		if (lj->ar && lj->seq == m->seq)
			part_free(lj);
		if (m->seq > lj->last_seq)
			lj->last_seq = m->seq;
		lj->touched = ++ln->touches;
		drop_early(lj, 0, m->seq, UINT32_MAX);
		if (m->forget)
			gg_mesh_forget(ln->mesh, lj->name, m->seq, m->seq);
	}
	ln->refused_owed[m->slot] = 0; /* the step is over: the refusal is moot */
	ln->ended_owed[m->slot] = tell_slot(ln, M_ENDED, m->slot, m->seq, 0, NULL) ? 0 : m->seq;
}

/* Step m->seq failed before it started here: the frames kept for it go,
 * and those still on their way will when they come. The steps forgotten
 * are one run (on_abort() posts them in order); a step apart from it
 * starts a new one. */
static void lane_forget(struct lane *ln, const struct mail *m)
{
	struct lane_job *lj = lane_job_find(ln, m->u.job, true, LANE_JOB_NO_EVICT);

	if (!lj || m->seq <= lj->last_seq)
		return;
	drop_early(lj, m->seq, m->seq, UINT32_MAX);
	if (lj->forgot_lo && m->seq >= lj->forgot_lo && m->seq <= lj->forgot_hi + 1) {
		lj->forgot_hi = GG_MAX(lj->forgot_hi, m->seq);
	} else {
		lj->forgot_lo = m->seq;
		lj->forgot_hi = m->seq;
	}
}

/* The job is over: its early frames are acknowledged and let go, and its
 * name may start a new run. It ended at `sites` (by bit): at one peer, in
 * its run `run`, or here (run 0), ending the runs of every site that took
 * part: runs[] as the coordinator heard of them, else as seen here. */
static void lane_forget_job(struct lane *ln, const char *job, uint32_t sites, uint64_t run, const uint64_t *runs)
{
	/* Its entry stays to let go what `sites` sent of it that is still on
	 * the way (other streams than the END's). A lane that holds none
	 * takes a free one for that, or the oldest entry of an ended job
	 * whose frames had their time to come, never a live job's. */
	struct lane_job *lj = lane_job_find(ln, job, sites != 0, LANE_JOB_FREE_ONLY);

	/* Its frames that no stream has taken yet would only be dropped by
	 * the peers. */
	gg_mesh_forget(ln->mesh, job, 0, UINT64_MAX);
	if (!lj || lj->ar)
		return;
	for (unsigned p = 0; p < GG_AR_MAX_SITES; p++) {
		if (!(sites & (1u << p)))
			continue;
		run_raise(&lj->run_over[p], run ? run : lj->run_seen[p]);
		if (!run)
			run_raise(&lj->run_over[p], runs[p]);
	}
	/* A peer's END lets go of that peer's frames of the run it ended (those
	 * of a later run stay): the other sites' may be of their next run of
	 * the name, and go when their own END or a later run says so. An end
	 * here lets go of everything but a new run's that a site began since
	 * it ended the old one. */
	const uint32_t keep = run ? ~sites : lj->rerun_by & ~sites;
	drop_runs_over(lj, sites, keep);
	if (keep || lj->early) {
		lj->ended_by |= sites;
		lj->rerun_by = keep;
		lj->ended_us = ln->loop.now_us;
		lj->touched = ++ln->touches;
		return;
	}
	const uint32_t ended_by = lj->ended_by | sites;
	uint64_t run_seen[GG_AR_MAX_SITES], run_over[GG_AR_MAX_SITES];
	memcpy(run_seen, lj->run_seen, sizeof(run_seen));
	memcpy(run_over, lj->run_over, sizeof(run_over));
	memset(lj, 0, sizeof(*lj));
	if (!ended_by)
		return;
	lj->lane = ln;
	lj->used = true;
	lj->touched = ++ln->touches;
	lj->ended_by = ended_by;
	lj->ended_us = ln->loop.now_us;
	memcpy(lj->run_seen, run_seen, sizeof(run_seen));
	memcpy(lj->run_over, run_over, sizeof(run_over));
	snprintf(lj->name, sizeof(lj->name), "%s", job);
}

/* ---- a lane's mesh -------------------------------------------------------- */

static int on_data(void *owner, unsigned from, struct gg_mesh_via via, const struct gg_wire_msg *m,
		   struct gg_buf *payload)
{
	struct lane *ln = owner;
	unsigned to = chunk_lane(ln->node, &m->u.data.id);

	if (to == ln->index)
		return lane_data(ln, from, ln->index, via, m, payload);
	struct mail *f = mail_new(M_DATA);
	if (!f)
		return -ENOMEM;
	f->peer = from;
	f->via_lane = ln->index;
	f->via = via;
	f->u.data.msg = *m;
	/* A small frame in a chunk-sized buffer goes in one of its size, as
	 * early frames do: what waits is then about what is counted. */
	if (2 * payload->len < payload->cap) {
		struct gg_buf *small = gg_buf_new(NULL, GG_MAX(payload->len, (size_t)1));
		if (!small) {
			free(f);
			return -ENOMEM;
		}
		memcpy(small->data, payload->data, payload->len);
		small->len = payload->len;
		f->u.data.payload = small;
		if (m->u.data.frame) /* it points into the message */
			f->u.data.msg.u.data.frame = small->data + (m->u.data.frame - payload->data);
	} else {
		gg_buf_get(payload);
		f->u.data.payload = payload;
	}
	return lane_forward(ln, to, f);
}

static int on_foreign_ack(void *owner, unsigned peer, const struct gg_wire_msg *m)
{
	struct lane *ln = owner;
	unsigned to = chunk_lane(ln->node, &m->u.ack.id);
	struct mail *f;

	if (to == ln->index)
		return 0; /* a stale copy */
	if (!(f = mail_new(M_ACK)))
		return -ENOMEM;
	f->peer = peer;
	f->u.msg = *m;
	return lane_forward(ln, to, f);
}

static int on_control(void *owner, unsigned from, const struct gg_wire_msg *m)
{
	struct lane *ln = owner;
	struct mail *f = mail_new(M_CONTROL);

	if (!f)
		return -ENOMEM;
	f->peer = from;
	f->u.msg = *m;
	return coordinator_hears(ln, f);
}

static void on_peer_restarted(void *owner, unsigned peer, uint64_t instance_id)
{
	struct lane *ln = owner;
	struct mail *f = mail_new(M_RESTARTED);

	/* At once here; the other lanes hear of it from the coordinator. */
	forget_runs_of(ln, peer);
	if (!f) {
		/* Nobody would release the held DATA: it goes now, as it would
		 * have before anything was held. */
		gg_mesh_release_peer(ln->mesh, peer);
		return;
	}
	f->peer = peer;
	f->via_lane = ln->index;
	f->u.restarted.instance_id = instance_id;
	/* The new instance's stream is not up yet (the mesh tells of the
	 * restart first), nor is this lane's stream to the old one, which it
	 * replaced; another lane's may be. */
	pthread_mutex_lock(&ln->node->down_lock);
	f->u.restarted.down_since_us = atomic_load(&ln->node->ready[peer]) ? 0 : ln->node->down_since_us[peer];
	pthread_mutex_unlock(&ln->node->down_lock);
	tell_coordinator(ln, f);
}

static void on_stream_change(void *owner, unsigned peer, unsigned stream, bool up, const char *why)
{
	struct lane *ln = owner;
	struct gg_node *n = ln->node;

	/* GG_MESH_MAX_STREAMS: a refused connection, no stream; its cause
	 * counts only while none is up. */
	const uint64_t bit = stream < GG_MESH_MAX_STREAMS ? (uint64_t)1 << stream : 0;
	pthread_mutex_lock(&n->down_lock);
	const bool quiet = !bit && atomic_load(&n->ready[peer]);
	if (bit && up) {
		atomic_fetch_or(&n->ready[peer], bit);
		n->down_since_us[peer] = 0;
	} else if (bit && atomic_fetch_and(&n->ready[peer], ~bit) == bit) {
		n->down_since_us[peer] = gg_monotonic_us();
	}
	pthread_mutex_unlock(&n->down_lock);
	if (quiet)
		return;
	struct mail *f = mail_new(up ? M_STREAM_READY : M_STREAM_DOWN);
	if (!f)
		return;
	f->peer = peer;
	if (why)
		snprintf(f->u.text, sizeof(f->u.text), "%s", why);
	tell_coordinator(ln, f);
}

static void hand_off(void *owner, unsigned lane, struct gg_mesh_handoff *h)
{
	struct lane *ln = owner;
	struct mail *f = mail_new(M_CONN);

	if (!f) {
		close(h->fd);
		gg_tls_engine_free(h->tls);
		free(h);
		return;
	}
	f->u.conn = h;
	post(&ln->node->lanes[lane].inbox, f);
}

static bool peer_denied(void *owner, unsigned peer)
{
	const struct lane *ln = owner;

	return peer_refuses_dials(ln->node, peer);
}

static const struct gg_mesh_ops mesh_ops = {
	.on_data = on_data,
	.on_control = on_control,
	.on_foreign_ack = on_foreign_ack,
	.on_peer_restarted = on_peer_restarted,
	.on_stream_change = on_stream_change,
	.hand_off = hand_off,
	.peer_denied = peer_denied,
};

/* ---- a lane's turn -------------------------------------------------------- */

void gg_lane_mail(struct lane *ln)
{
	if (atomic_load_explicit(&ln->test_hold_mail, memory_order_relaxed))
		return;
	for (struct gg_mail *g = gg_mailbox_take(&ln->inbox), *next; g; g = next) {
		struct mail *m = (struct mail *)g;
		next = g->next;
		lane_forward_taken(ln, m);
		switch ((enum mail_type)g->type) {
		case M_START:
			lane_start(ln, m);
			break;
		case M_END:
			lane_end(ln, m);
			break;
		case M_FORGET:
			lane_forget(ln, m);
			break;
		case M_FORGET_JOB:
			lane_forget_job(ln, m->u.job, m->sites, m->run, m->runs);
			break;
		case M_PEER_RESET:
			/* After the M_ENDs of the steps the restart failed, whose
			 * held DATA they let go. */
			forget_runs_of(ln, m->peer);
			gg_mesh_release_peer(ln->mesh, m->peer);
			break;
		case M_PEER_RELEASE:
			gg_mesh_release_peer(ln->mesh, m->peer);
			break;
		case M_SEND:
			gg_mesh_send_control(ln->mesh, m->peer, m->u.send.bytes, m->u.send.len, m->u.send.every_stream);
			break;
		case M_DATA: {
			/* Not kept for want of memory, it stays unacknowledged: the
			 * peer sends it again once a stream to it is cut. Past the
			 * peer's budget, the stream it came on is closed, as it would
			 * be had this lane read it there. */
			int rc = lane_data(ln, m->peer, m->via_lane, m->via, &m->u.data.msg, m->u.data.payload);
			struct mail *c;
			gg_buf_put(m->u.data.payload);
			if (rc == -ENOBUFS && (c = mail_new(M_CLOSE_VIA))) {
				c->via = m->via;
				post(&ln->node->lanes[m->via_lane].inbox, c);
			}
			break;
		}
		case M_CLOSE_VIA:
			gg_mesh_close_via(ln->mesh, m->via, GG_MESH_OVER_BUDGET);
			break;
		case M_ACK_SEND:
			gg_mesh_ack(ln->mesh, m->via, m->u.ack.job, m->u.ack.run, m->seq, &m->u.ack.id);
			break;
		case M_ACK:
			gg_mesh_take_ack(ln->mesh, m->peer, &m->u.msg);
			break;
		case M_CONN:
			gg_mesh_adopt(ln->mesh, m->u.conn);
			break;
		case M_SHUTDOWN:
			ln->shutting_down = true;
			gg_mesh_shutdown(ln->mesh);
			break;
		case M_CUT:
			if (gg_mesh_test_cut_stream(ln->mesh, m->peer, m->u.stream))
				gg_log(GG_LOG_WARN, "test_cut_failed", "site=%s stream=%d", ln->node->names[m->peer],
				       m->u.stream);
			break;
		default:
			break;
		}
		free(m);
	}
	gg_mesh_flush(ln->mesh);
}

/* A part that missed its step's deadline fails it, naming what it waits for. */
static void part_missed_deadline(struct lane_job *lj)
{
	const struct gg_node *n = lj->lane->node;
	unsigned from;
	struct gg_ar_chunk_id id;
	char buf[32], down[GG_AR_MAX_SITES * (GG_WIRE_NAME_MAX + 48) + 32], hint[GG_NODE_ERROR_MAX];

	gg_format_duration(lj->timeout_us, buf, sizeof(buf));
	if (gg_ar_step_first_missing(lj->ar, &from, &id)) {
		/* A site this one has no stream to did not start late: say why
		 * there is none (a peer of other settings, a refused dial). */
		char why[GG_NODE_ERROR_MAX];
		if (!atomic_load(&n->ready[from]))
			snprintf(hint, sizeof(hint), " (no connection to it: %s)",
				 gg_node_down_reason(n, from, why, sizeof(why)));
		else
			snprintf(hint, sizeof(hint), "%s",
				 gg_ar_step_heard_from(lj->ar, from)
					 ? ""
					 : " (no frame of the step came from it: has it started the step?)");
		gg_node_unreachable_note(n, from, down, sizeof(down));
		part_fail(lj, GG_ERR_TIMEOUT,
			  "step %llu of job '%s' missed its %s deadline: site %s never sent %s data for shard %u chunk "
			  "%u%s%s", (unsigned long long)lj->seq, lj->name, buf, n->names[from],
			  gg_ar_phase_name(id.phase), id.origin, id.chunk, hint, down);
	} else {
		gg_node_unreachable_note(n, n->sites, down, sizeof(down));
		part_fail(lj, GG_ERR_TIMEOUT, "step %llu of job '%s' missed its %s deadline%s",
			  (unsigned long long)lj->seq, lj->name, buf, down);
	}
}

#define TCP_INFO_EVERY_US 250000

/* Its streams' TCP figures, a few times a second, and at once when one
 * came up (`ups`: streams that came up so far), so that a stream that is
 * up has its figures on the metrics page as soon as it counts as up. */
static void publish_stream_tcp(struct lane *ln, uint64_t ups)
{
	struct gg_node *n = ln->node;
	struct gg_mesh_stream_tcp t;

	if (ln->index >= n->nlanes || (ln->loop.now_us < ln->tcp_next_us && ups == ln->tcp_ups))
		return;
	ln->tcp_next_us = ln->loop.now_us + TCP_INFO_EVERY_US;
	ln->tcp_ups = ups;
	for (unsigned p = 0; p < n->sites; p++) {
		if (p == n->self)
			continue;
		for (unsigned s = ln->index; s < (unsigned)n->cfg->transport.streams_per_peer; s += n->nlanes) {
			struct stream_tcp *st = &n->tcp[p][s];
			bool up = !gg_mesh_stream_tcp(ln->mesh, p, s, &t);
			if (up) {
				publish(&st->rtt_us, t.rtt_us);
				publish(&st->rttvar_us, t.rttvar_us);
				publish(&st->cwnd_bytes, t.cwnd_bytes);
				publish(&st->delivery_bytes_per_s, t.delivery_bytes_per_s);
				if (t.connection != st->connection) {
					st->retransmits_before += st->retransmits_now;
					st->connection = t.connection;
				}
				st->retransmits_now = t.retransmits;
				publish(&st->retransmits, st->retransmits_before + st->retransmits_now);
				publish(&st->unsent_bytes, t.unsent_bytes);
				publish(&st->send_buffer_bytes, t.send_buffer_bytes);
				publish(&st->receive_buffer_bytes, t.receive_buffer_bytes);
			}
			atomic_store_explicit(&st->up, up, memory_order_release);
		}
	}
}

/* What the lane's mesh counted, for the coordinator's thread to read. */
static void publish_mesh_stats(struct lane *ln)
{
	const struct gg_mesh_stats *ms = gg_mesh_stats(ln->mesh);

	uint64_t hedged = 0, ups = 0;
	for (unsigned p = 0; p < ln->node->sites; p++) {
		hedged += ms->peers[p].hedged_frames;
		ups += ms->peers[p].stream_ups;
	}
	publish(&ln->resent, ms->resent_messages);
	publish(&ln->hedged, hedged);
	publish(&ln->tls_ns, (uint64_t)(ms->tls_s * 1e9));
	for (unsigned p = 0; p < ln->node->sites; p++) {
		const struct gg_mesh_peer_stats *mp = &ms->peers[p];
		struct lane_peer_stats *lp = &ln->stats.peers[p];
		if (ms->rtt_us[p])
			publish(&ln->rtt_us[p], ms->rtt_us[p]);
		publish(&ln->rtt_min_us[p], ms->rtt_min_us[p]);
		publish(&ln->heard_us[p], gg_mesh_last_heard(ln->mesh, p));
		atomic_store_explicit(&ln->denied[p], gg_mesh_peer_denied(ln->mesh, p), memory_order_relaxed);
		publish(&lp->data_out, mp->data_bytes_out);
		publish(&lp->raw_out, mp->raw_bytes_out);
		publish(&lp->wire_out, mp->wire_bytes_out);
		publish(&lp->wire_in, mp->wire_bytes_in);
		publish(&lp->stream_ups, mp->stream_ups);
		publish(&lp->stream_downs, mp->stream_downs);
		publish(&lp->delivery_bps, mp->delivery_bytes_per_s);
	}
	publish(&ln->uplink_bps, ms->uplink_bytes_per_s);
	publish(&ln->uplink_at_us, ms->uplink_at_us);
	for (unsigned f = 0; f < GG_MESH_FAILURES; f++)
		publish(&ln->stats.stream_failures[f], ms->stream_failures[f]);
	publish_stream_tcp(ln, ups);
}

/* A part here has every rank of its site in and waits for other sites'
 * data; a site that waits for a rank of its own names the real cause, and
 * its deadline comes at about the same time when every rank gave the same
 * timeout. Its word is given time to come first: twice the longest round
 * trip to a peer and GG_NODE_DEADLINE_GRACE_US (node.h). */
static uint64_t deadline_grace(const struct lane *ln)
{
	uint64_t rtt = 0;

	for (unsigned p = 0; p < ln->node->sites; p++)
		rtt = GG_MAX(rtt, (uint64_t)atomic_load_explicit(&ln->rtt_us[p], memory_order_relaxed));
	return GG_MIN(2 * rtt, 1000000) + GG_NODE_DEADLINE_GRACE_US;
}

/* Parts' deadlines, and own chunks that wait for room on the streams. */
static uint64_t lane_timers(struct lane *ln)
{
	char why[GG_AR_ERROR_MAX];
	uint64_t next = GG_MIN(gg_mesh_tick(ln->mesh), gg_node_peer_logs_flush(ln->node, ln->logs, ln->loop.now_us));

	for (unsigned slot = 0; slot < MAX_JOBS; slot++) {
		if (ln->ended_owed[slot] && tell_slot(ln, M_ENDED, slot, ln->ended_owed[slot], 0, NULL))
			ln->ended_owed[slot] = 0;
		if (ln->refused_owed[slot])
			lane_refuse(ln, slot, ln->refused_owed[slot], ln->refused_job[slot]);
	}
	const uint64_t grace = deadline_grace(ln);
	for (unsigned i = 0; i < LANE_JOBS; i++) {
		struct lane_job *lj = &ln->jobs[i];
		if (lj->used && lj->ar && lj->owed)
			part_report(lj, lj->owed_type, 0, NULL);
		if (!lj->used || !lj->ar || lj->reported)
			continue;
		const uint64_t due = lj->deadline_us > UINT64_MAX - grace ? UINT64_MAX : lj->deadline_us + grace;
		if (ln->loop.now_us >= due) {
			part_missed_deadline(lj);
			continue;
		}
		if (due < next)
			next = due;
		if (!gg_ar_step_wants_resume(lj->ar))
			continue;
		int rc = gg_ar_step_resume(lj->ar, why, sizeof(why));
		part_count_times(lj);
		if (rc)
			part_step_failed(lj, rc, why);
		else
			part_check_done(lj);
	}
	publish_mesh_stats(ln);
	atomic_store(&ln->flushed, gg_mesh_flushed(ln->mesh));
	atomic_store(&ln->idle, gg_mesh_idle(ln->mesh));
	return next;
}

static void on_cqe(void *arg, const struct io_uring_cqe *cqe)
{
	struct cqe_ctx *x = arg;
	unsigned kind = gg_loop_ud_kind(cqe->user_data);

	if (kind >= GG_OP_USER) {
		if (x->other)
			x->other(x->arg, cqe);
	} else if (kind == KIND_LANE_MAIL) {
		x->lane_mail = true;
	} else if (kind == KIND_COORD_MAIL) {
		x->coord_mail = true;
	} else {
		gg_mesh_on_cqe(x->ln->mesh, cqe);
	}
}

/* One turn of a lane's loop. Returns 0 or a negative errno (the ring broke). */
int gg_lane_turn(struct lane *ln, uint64_t max_wait_us, struct cqe_ctx *x)
{
	uint64_t wait = GG_MIN(max_wait_us, gg_loop_timeout_us(&ln->loop, ln->next_us));
	int rc = gg_loop_run(&ln->loop, wait, on_cqe, x);

	if (rc < 0)
		return rc;
	if (x->lane_mail && (rc = gg_mailbox_arm(&ln->inbox, &ln->loop, gg_loop_ud(KIND_LANE_MAIL, 0, 0))))
		return rc;
	gg_lane_mail(ln);
	ln->next_us = lane_timers(ln);
	return 0;
}

/* ---- making and freeing lanes --------------------------------------------- */

/* A lane's thread name, as ps -T and /proc/PID/task/TID/comm show it. */
const char *gg_lane_name(const struct gg_node *n, unsigned l, char name[16])
{
	if (l == n->nlanes)
		snprintf(name, 16, "gg-accept");
	else
		snprintf(name, 16, "gg-lane%u", l);
	return name;
}

/* Makes the lane's loop, mesh and codecs, on the thread that runs it.
 * Returns 0 or a negative errno with ln->start_err set. */
int gg_lane_init(struct lane *ln)
{
	struct gg_node *n = ln->node;
	char name[16];
	int rc;

	gg_lane_name(n, ln->index, name);
	if ((rc = gg_loop_init(&ln->loop, 1024)))
		return gg_errf(ln->start_err, sizeof(ln->start_err), rc, "cannot set up io_uring for %s: %s", name,
			       strerror(-rc));
	ln->loop_ok = true;
	ln->loop.now_us = gg_monotonic_us();
	gg_mailbox_claim(&ln->inbox);
	if (ln->index < n->nlanes && ((rc = gg_frame_encoder_init(&ln->enc, &n->frame_cfg)) ||
				      (rc = gg_frame_decoder_init(&ln->dec, &n->frame_limits))))
		return gg_errf(ln->start_err, sizeof(ln->start_err), rc, "codec %s for %s: %s",
			       gg_codec_name(n->cfg->compression.codec), name, strerror(-rc));
	struct gg_mesh_config mc = { .cfg = n->cfg, .sites = n->sites, .self = n->self, .names = n->names,
				     .hello = &n->hello, .tls = n->tls, .resolver = n->resolver, .loop = &ln->loop,
				     .pool = &n->frames,
				     .max_payload_bytes = n->max_payload, .ops = &mesh_ops, .owner = ln,
				     .lane = ln->index, .lanes = n->nlanes, .listen = ln->index == n->nlanes };
	if ((rc = gg_mesh_new(&mc, &ln->mesh, ln->start_err, sizeof(ln->start_err))))
		return rc;
	if ((rc = gg_mailbox_arm(&ln->inbox, &ln->loop, gg_loop_ud(KIND_LANE_MAIL, 0, 0))))
		return gg_errf(ln->start_err, sizeof(ln->start_err), rc, "cannot arm the mailbox of %s: %s", name,
			       strerror(-rc));
	ln->next_us = ln->loop.now_us;
	return 0;
}

void gg_lane_fini(struct lane *ln)
{
	for (unsigned i = 0; i < LANE_JOBS; i++) {
		struct lane_job *lj = &ln->jobs[i];
		gg_ar_step_free(lj->ar);
		lj->ar = NULL;
		lane_job_clear(lj);
	}
	gg_mesh_free(ln->mesh);
	ln->mesh = NULL;
	for (struct gg_mail *g = gg_mailbox_take(&ln->inbox), *next; g; g = next) {
		struct mail *m = (struct mail *)g;
		next = g->next;
		if (g->type == M_DATA)
			gg_buf_put(m->u.data.payload);
		if (g->type == M_CONN) {
			close(m->u.conn->fd);
			gg_tls_engine_free(m->u.conn->tls);
			free(m->u.conn);
		}
		free(m);
	}
	if (ln->loop_ok)
		gg_loop_fini(&ln->loop);
	ln->loop_ok = false;
	gg_frame_encoder_fini(&ln->enc);
	gg_frame_decoder_fini(&ln->dec);
#if HAVE_CUDA
	if (ln->gpu_ready)
		gg_ar_mem_cuda_fini(&ln->gpu);
	ln->gpu_ready = false;
#endif
}

void *gg_lane_main(void *arg)
{
	struct lane *ln = arg;
	struct gg_node *n = ln->node;
	sigset_t all;

	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL); /* signals are the process's main thread's */
	gg_log_set_thread_site(n->names[n->self]);
	int rc = gg_lane_init(ln);
	atomic_bool *stop = ln->index == n->nlanes ? &n->acceptor_stop : &n->lanes_stop;
	pthread_mutex_lock(&n->start_lock);
	ln->start_rc = rc;
	n->lanes_starting--;
	pthread_cond_broadcast(&n->started);
	/* Nothing is dialed or answered before the node's owner first turns
	 * its loop (gg_node_run_once()): a gateway that fails the rest of its
	 * start (its control socket, its metrics port) has not spoken to its
	 * peers as its site, which would read as a restart of the one that
	 * runs. */
	while (!rc && !n->released && !atomic_load(stop))
		pthread_cond_wait(&n->let_go, &n->start_lock);
	pthread_mutex_unlock(&n->start_lock);
	struct cqe_ctx x = { .ln = ln };
	while (!rc && !atomic_load(stop)) {
		x.lane_mail = false;
		if ((rc = gg_lane_turn(ln, TICK_US, &x))) {
			char name[16];
			gg_log(GG_LOG_ERROR, "loop_failed", "site=%s thread=%s reason=\"%s\"", n->cfg->site.name,
			       gg_lane_name(n, ln->index, name), strerror(-rc));
			atomic_store(&ln->idle, true);
			atomic_store(&ln->flushed, true);
			/* Without its acceptor the gateway takes no stream a peer
			 * dials: the node fails, as it does when lane 0 fails. */
			if (ln->index == n->nlanes)
				atomic_store(&n->acceptor_failed, rc);
		}
	}
	gg_lane_fini(ln);
	return NULL;
}

