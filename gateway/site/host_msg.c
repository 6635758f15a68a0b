/* The host backend: the control messages of the ranks (host_internal.h). */
#include "host_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#if HAVE_CUDA
#include "site_cuda.h"
#endif
#include "units.h"

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
	if (hb_make_room(b, 0, c, false) || hb_make_room(b, 0, c, true))
		return true;
	c->spare = true; /* closing on the spare slot it came on */
	hb_idle_hint(b, hint, sizeof(hint));
	hb_conn_refuse(b, c, GG_ERR_REFUSED, "the gateway of site %s already serves max_clients = %u connections%s",
		       b->site, b->opts.max_clients, hint);
	return false;
}

/* Whether `have` sessions (or jobs) leave c room within `max` (0: no
 * bound): else refuses c, naming the share, and returns false. together:
 * the share of all users other than root and the gateway's own; else
 * that of c's user. */
static bool share_left(struct gg_host_backend *b, struct hb_conn *c, unsigned have, unsigned max, bool together,
		       bool jobs)
{
	const unsigned self = (unsigned)geteuid();
	char subject[96], limit[64], whom[96];

	if (!max || have < max)
		return true;
	if (together)
		snprintf(subject, sizeof(subject), "users other than root and the gateway's own (uid %u)", self);
	else
		snprintf(subject, sizeof(subject), "uid %u", (unsigned)c->uid);
	if (jobs)
		snprintf(limit, sizeof(limit), "of the %u it runs at once", b->opts.max_jobs);
	else
		snprintf(limit, sizeof(limit), "of its max_clients = %u", b->opts.max_clients);
	snprintf(whom, sizeof(whom), "a user other than root and the gateway's own (uid %u)", self);
	hb_conn_refuse(b, c, GG_ERR_REFUSED, "%s %s%s %u %s%s at the gateway of site %s, %s %s: %s may %s no more, so that "
		       "%s find room", subject, jobs ? "run" : "hold", together ? "" : "s", have, jobs ? "job" : "session",
		       have == 1 ? "" : "s",
		       b->site, together ? "three quarters" : "half", limit, together ? "they" : whom,
		       jobs ? "start" : "hold", together ? "root and the gateway's user" : "others");
	return false;
}

/* A user other than root and the gateway's own: one the shares hold. */
static bool other_user(uid_t uid)
{
	return uid != 0 && uid != geteuid();
}

/* Sessions and jobs of other users (other_user()): all of theirs, those
 * of them that jobs idle for session_idle hold (but `keep`'s), and those
 * of `uid`. */
struct user_counts {
	unsigned others_sessions, others_idle, sessions, others_jobs, jobs;
};

static struct user_counts count_users(const struct gg_host_backend *b, uid_t uid, const struct hb_job *keep)
{
	struct user_counts n = { 0 };

	for (unsigned i = 0; i < hb_slots(b); i++) {
		const struct hb_conn *o = &b->conns[i];
		if (o->state == C_ACTIVE && other_user(o->uid)) {
			n.others_sessions++;
			n.others_idle += o->job && o->job != keep && hb_job_idle(b, o->job);
			n.sessions += o->uid == uid;
		}
	}
	for (const struct hb_job *j = b->jobs; j; j = j->next) {
		if (other_user(j->uid)) {
			n.others_jobs++;
			n.jobs += j->uid == uid;
		}
	}
	return n;
}

/* The job of another user (other_user()) idle longest, but `keep`; or
 * NULL. */
static struct hb_job *others_idlest(const struct gg_host_backend *b, const struct hb_job *keep)
{
	struct hb_job *best = NULL;

	for (struct hb_job *j = b->jobs; j; j = j->next)
		if (j != keep && other_user(j->uid) && hb_job_idle(b, j) && (!best || j->active_us < best->active_us))
			best = j;
	return best;
}

/* Sessions all other users (other_user()) may hold together. */
static unsigned others_share(const struct gg_host_backend *b)
{
	return GG_MAX(b->opts.max_clients * 3 / 4, 1u);
}

/* A user other than root and the gateway's own gets half of the sessions
 * (rounded down, at least one) and half of the jobs at most, and all such
 * users together three quarters of each (opts.user_shares): else refuses
 * c and returns false. Where all users' sessions are at their share, the
 * sessions of their jobs idle for session_idle count as room (but those
 * of `keep`, a job of c's user that c joins): make_others_room() frees
 * them once c is accepted. new_job: c's HELLO would start a job. */
static bool user_share_ok(struct gg_host_backend *b, struct hb_conn *c, bool new_job, const struct hb_job *keep)
{
	const unsigned max_clients = b->opts.max_clients, max_jobs = b->opts.max_jobs;

	if (!b->opts.user_shares || !other_user(c->uid))
		return true;
	const struct user_counts n = count_users(b, c->uid, keep);
	return share_left(b, c, n.sessions, GG_MAX(max_clients / 2, 1u), false, false) &&
	       (!new_job || share_left(b, c, n.jobs, max_jobs / 2, false, true)) &&
	       share_left(b, c, n.others_sessions - n.others_idle, others_share(b), true, false) &&
	       (!new_job || share_left(b, c, n.others_jobs, max_jobs * 3 / 4, true, true));
}

/* Once c is accepted: the idle jobs of other users that user_share_ok()
 * counted as room give their sessions up, the idlest first (but `keep`,
 * the job c joins). */
static void make_others_room(struct gg_host_backend *b, const struct hb_conn *c, const struct hb_job *keep)
{
	struct hb_job *idle;

	if (!b->opts.user_shares || !other_user(c->uid))
		return;
	while (count_users(b, c->uid, keep).others_sessions >= others_share(b) && (idle = others_idlest(b, keep)))
		hb_job_evict(b, idle, "a rank of another user needs a place within the share of users other than "
			     "root and the gateway's own");
}

static void on_hello(struct gg_host_backend *b, struct hb_conn *c)
{
	const struct gg_ctrl_hello *h = &c->in.hello;
	unsigned max_ranks = GG_MIN(b->opts.max_clients, GG_CTRL_MAX_RANKS);
	char why[160];

	if (h->version != GG_CTRL_VERSION) {
		hb_conn_refuse(b, c, GG_ERR_REFUSED,
			       "protocol version %u is not supported: the gateway of site %s speaks version %u",
			       (unsigned)h->version, b->site, GG_CTRL_VERSION);
		return;
	}
	if (!gg_ctrl_job_name_ok(h->job, why, sizeof(why))) {
		hb_conn_refuse(b, c, GG_ERR_REFUSED, "%s", why);
		return;
	}
	if (h->nranks < 1 || h->nranks > max_ranks) {
		hb_conn_refuse(b, c, GG_ERR_REFUSED, "nranks %u of job '%s' is outside 1..%u (the gateway of site %s "
			       "serves at most max_clients = %u)", (unsigned)h->nranks, h->job, max_ranks, b->site,
			       b->opts.max_clients);
		return;
	}
	if (h->rank >= h->nranks) {
		hb_conn_refuse(b, c, GG_ERR_REFUSED, "rank %u of job '%s' is out of range for nranks %u",
			       (unsigned)h->rank, h->job, (unsigned)h->nranks);
		return;
	}
	/* A user past its share takes no slot or name from anyone. */
	struct hb_job *j = hb_job_find(b, h->job);
	if (!user_share_ok(b, c, !j || j->uid != c->uid, j && j->uid == c->uid ? j : NULL))
		return;
	/* A HELLO that came on a spare slot needs a place first (an idle
	 * job's if need be), once it is sound: a malformed one evicts nobody. */
	if (c->spare && !spare_to_session(b, c))
		return;

	j = hb_job_find(b, h->job);
	if (j && j->uid != c->uid && hb_job_idle(b, j)) {
		char needed[96];
		snprintf(needed, sizeof(needed), "a rank of uid %u asks for its name", (unsigned)c->uid);
		hb_job_evict(b, j, needed);
		j = hb_job_find(b, h->job);
	}
	if (j && j->broken) {
		hb_conn_refuse(b, c, GG_ERR_REFUSED, "job '%s' has failed (%s); it can start again once all its ranks "
			       "have disconnected", j->name, j->broken_msg);
		return;
	}
	if (j && j->uid != c->uid) {
		char ago[32], limit[32], state[64], rule[96] = "";
		if (b->opts.session_idle_us)
			snprintf(rule, sizeof(rule), " (a job idle for session_idle = %s gives its name up)",
				 gg_format_duration(b->opts.session_idle_us, limit, sizeof(limit)));
		/* A step under way keeps the job however long its ranks wait. */
		if (hb_step_in_progress(j))
			snprintf(state, sizeof(state), "which has step %llu under way", (unsigned long long)j->seq);
		else
			snprintf(state, sizeof(state), "whose ranks sent something %s ago",
				 gg_format_elapsed(b->loop->now_us - j->active_us, ago, sizeof(ago)));
		hb_conn_refuse(b, c, GG_ERR_REFUSED, "job '%s' belongs to uid %u, %s%s; rank %u connects as uid %u", j->name,
			       (unsigned)j->uid, state, rule, (unsigned)h->rank, (unsigned)c->uid);
		return;
	}
	if (j && j->nranks != h->nranks) {
		hb_conn_refuse(b, c, GG_ERR_REFUSED, "rank %u of job '%s' says nranks %u, but rank %u said nranks %u",
			       (unsigned)h->rank, j->name, (unsigned)h->nranks, j->first_rank, j->nranks);
		return;
	}
	if (j && j->ranks[h->rank]) {
		hb_conn_refuse(b, c, GG_ERR_REFUSED, "rank %u of job '%s' is already connected", (unsigned)h->rank,
			       j->name);
		return;
	}
	/* Sound and allowed: what user_share_ok() counted as room is made. */
	make_others_room(b, c, j);
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
			hb_job_release(j);
			hb_conn_refuse(b, c, GG_ERR_NOMEM, "the gateway of site %s is out of memory", b->site);
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
	if (hb_session_log_now(b))
		hb_log(b, "rank %u of job '%s' connected (pid %d, uid %u)", c->rank, j->name, (int)c->pid,
		       (unsigned)c->uid);

	union gg_ctrl_msg *m = hb_out_push(c, GG_CTRL_ACCEPT);
	m->accept.version = GG_CTRL_VERSION;
	m->accept.max_inflight = GG_CTRL_MAX_INFLIGHT;
	m->accept.max_message_bytes = b->opts.max_message_bytes;
	m->accept.max_region_bytes = b->max_region_bytes;
	m->accept.max_regions = GG_CTRL_MAX_REGIONS;
	m->accept.step_timeout_ms = (uint32_t)GG_MIN(b->opts.step_timeout_us / 1000, UINT32_MAX);
	m->accept.answer_grace_ms = (uint32_t)GG_MIN(b->opts.answer_grace_us / 1000, UINT32_MAX);
	gg_ctrl_set_text(m->accept.site, sizeof(m->accept.site), b->site);
	hb_out_kick(b, c);
}

/* A status request: answered to root and to the gateway's own user only,
 * for it names every job, its user and its failures; then closed. */
static void on_status(struct gg_host_backend *b, struct hb_conn *c)
{
	uid_t self = geteuid();

	if (c->in.status.version != GG_CTRL_STATUS_VERSION) {
		hb_conn_refuse(b, c, GG_ERR_REFUSED, "status version %u is not supported: the gateway of site %s speaks "
			       "version %u", (unsigned)c->in.status.version, b->site, GG_CTRL_STATUS_VERSION);
		return;
	}
	if (c->uid != 0 && c->uid != self) {
		hb_conn_refuse(b, c, GG_ERR_REFUSED, "the status of site %s is for root and the gateway's user (uid %u); "
			       "uid %u asked", b->site, (unsigned)self, (unsigned)c->uid);
		return;
	}
	if (!b->opts.status) {
		hb_conn_refuse(b, c, GG_ERR_REFUSED, "the gateway of site %s does not answer status requests", b->site);
		return;
	}
	c->status = calloc(GG_HOST_STATUS_MAX_MESSAGES, sizeof(*c->status));
	if (!c->status) {
		hb_conn_refuse(b, c, GG_ERR_NOMEM, "the gateway of site %s is out of memory", b->site);
		return;
	}
	c->status_count = b->opts.status(b->opts.status_arg, c->status, GG_HOST_STATUS_MAX_MESSAGES);
	c->status_next = 0;
	b->stats.status_requests++;
	hb_conn_closing(b, c);
	hb_out_kick(b, c);
}

static void on_map(struct gg_host_backend *b, struct hb_conn *c, int *fds, unsigned nfds, bool ctrunc)
{
	const struct gg_ctrl_map *mp = &c->in.map;
	unsigned id = mp->region;
	struct stat st;

	if (ctrunc || nfds != 1) {
		hb_conn_fatal(b, c, GG_ERR_PROTOCOL, "MAP must carry exactly one file descriptor, not %s%u",
			      ctrunc ? "more than " : "", nfds);
		return;
	}
	if (id >= GG_CTRL_MAX_REGIONS) {
		hb_conn_fatal(b, c, GG_ERR_PROTOCOL, "MAP of region %u; regions are 0..%u", id, GG_CTRL_MAX_REGIONS - 1);
		return;
	}
	if (c->regions[id].base) {
		hb_conn_fatal(b, c, GG_ERR_PROTOCOL, "MAP of region %u, which is mapped already", id);
		return;
	}
	if (mp->size_bytes == 0 || mp->size_bytes > b->max_region_bytes) {
		hb_conn_fatal(b, c, mp->size_bytes ? GG_ERR_TOO_LARGE : GG_ERR_PROTOCOL,
			      "MAP of region %u with %llu bytes; regions hold 1 to %llu bytes",
			      id, (unsigned long long)mp->size_bytes, (unsigned long long)b->max_region_bytes);
		return;
	}
	/* Only a memfd sealed against shrinking cannot turn our accesses
	 * into SIGBUS later. */
	int seals = fcntl(fds[0], F_GET_SEALS);
	if (seals < 0) {
		hb_conn_fatal(b, c, GG_ERR_PROTOCOL, "MAP of region %u: the descriptor is not a memfd (%s)", id,
			      strerror(errno));
		return;
	}
	if (!(seals & F_SEAL_SHRINK)) {
		/* A tmpfs file opened by path has seals too (F_SEAL_SEAL), never
		 * that one. */
		hb_conn_fatal(b, c, GG_ERR_PROTOCOL,
			      "MAP of region %u: the descriptor is not a memfd sealed against shrinking (F_SEAL_SHRINK)", id);
		return;
	}
	/* Sealed hugetlbfs memfds still lose a page to a punched hole, and
	 * once the huge-page pool is empty the next read is a SIGBUS. tmpfs
	 * gives a fresh page instead. */
	struct statfs sfs;
	if (fstatfs(fds[0], &sfs) || sfs.f_type != TMPFS_MAGIC) {
		hb_conn_fatal(b, c, GG_ERR_PROTOCOL,
			      "MAP of region %u: the memfd is not plain shared memory (filesystem 0x%lx, not tmpfs; "
			      "MFD_HUGETLB is not accepted)", id, (unsigned long)sfs.f_type);
		return;
	}
	if (fstat(fds[0], &st) || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != mp->size_bytes) {
		hb_conn_fatal(b, c, GG_ERR_PROTOCOL, "MAP of region %u says %llu bytes, the memfd has %lld", id,
			      (unsigned long long)mp->size_bytes, (long long)st.st_size);
		return;
	}
	void *base = mmap(NULL, mp->size_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	if (base == MAP_FAILED) {
		hb_conn_fatal(b, c, errno == ENOMEM ? GG_ERR_NOMEM : GG_ERR_PROTOCOL, "MAP of region %u: mmap: %s", id,
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
		hb_conn_fatal(b, c, GG_ERR_PROTOCOL, "MAP_CUDA of region %u; regions are 0..%u", id,
			      GG_CTRL_MAX_REGIONS - 1);
		return;
	}
	if (c->regions[id].base) {
		hb_conn_fatal(b, c, GG_ERR_PROTOCOL, "MAP_CUDA of region %u, which is mapped already", id);
		return;
	}
	if (mp->size_bytes == 0) {
		hb_conn_fatal(b, c, GG_ERR_PROTOCOL, "MAP_CUDA of region %u with 0 bytes", id);
		return;
	}
#if HAVE_CUDA
	char why[TEXT - 96];
	void *dev = NULL;
	int rc = gg_site_cuda_open(mp->ipc, mp->size_bytes, &dev, why, sizeof(why));
	if (rc) {
		hb_conn_unserved(b, c, rc == -ENODEV ? GG_ERR_INVALID : GG_ERR_SYSTEM,
				 "cannot open the rank's GPU memory%s: %s", rc == -ENODEV ? " (it has no usable GPU)" : "",
				 why);
		return;
	}
	c->regions[id] = (struct hb_region){ .base = dev, .size = mp->size_bytes, .device = true };
	b->stats.regions++;
#else
	hb_conn_unserved(b, c, GG_ERR_INVALID,
			 "this gateway was built without CUDA, so it cannot take GPU memory (gg_allreduce_cuda); use "
			 "host memory");
#endif
}

static void on_unmap(struct gg_host_backend *b, struct hb_conn *c)
{
	unsigned id = c->in.unmap.region;

	if (id >= GG_CTRL_MAX_REGIONS || !c->regions[id].base) {
		hb_conn_fatal(b, c, GG_ERR_PROTOCOL, "UNMAP of region %u, which is not mapped", id);
		return;
	}
	if (c->regions[id].users) {
		hb_conn_fatal(b, c, GG_ERR_PROTOCOL, "UNMAP of region %u while it holds %u request%s in flight", id,
			      c->regions[id].users, c->regions[id].users == 1 ? "" : "s");
		return;
	}
	/* A step that already failed at the rank may still be with the core. */
	if (hb_keep_for_core(c, id))
		return;
	if (hb_region_unmap(b, &c->regions[id]))
		c->ipc_deferred = true;
}

static void on_allreduce(struct gg_host_backend *b, struct hb_conn *c)
{
	const struct gg_ctrl_allreduce *a = &c->in.allreduce;
	size_t esize = gg_dtype_size((enum gg_dtype)a->dtype);

	if (a->seq != c->next_seq) {
		hb_conn_fatal(b, c, GG_ERR_PROTOCOL, "ALLREDUCE with seq %llu, expected %llu",
			      (unsigned long long)a->seq, (unsigned long long)c->next_seq);
		return;
	}
	if (c->req_count + c->dones_queued >= GG_CTRL_MAX_INFLIGHT) {
		hb_conn_fatal(b, c, GG_ERR_PROTOCOL, "step %llu: more than %u requests in flight",
			      (unsigned long long)a->seq, GG_CTRL_MAX_INFLIGHT);
		return;
	}
	if (!esize) {
		hb_conn_fatal(b, c, GG_ERR_PROTOCOL, "step %llu: unknown dtype %u", (unsigned long long)a->seq,
			      (unsigned)a->dtype);
		return;
	}
	if (a->count == 0 || a->count > b->opts.max_message_bytes / esize) {
		hb_conn_fatal(b, c, a->count ? GG_ERR_TOO_LARGE : GG_ERR_PROTOCOL,
			      "step %llu: %llu %s elements; max_message allows 1 to %llu",
			      (unsigned long long)a->seq, (unsigned long long)a->count, gg_dtype_name(a->dtype),
			      (unsigned long long)(b->opts.max_message_bytes / esize));
		return;
	}
	uint64_t bytes = a->count * esize;
	const struct hb_region *reg = a->region < GG_CTRL_MAX_REGIONS ? &c->regions[a->region] : NULL;
	if (a->region == GG_CTRL_REGION_NCCL) {
		if (!c->nccl_joined) {
			hb_conn_fatal(b, c, GG_ERR_PROTOCOL, "step %llu: an NCCL step from a rank that has not sent NCCL_JOIN",
				      (unsigned long long)a->seq);
			return;
		}
		if (a->offset || a->dtype != GG_DTYPE_F32) {
			hb_conn_fatal(b, c, GG_ERR_PROTOCOL, "step %llu: an NCCL step must be float32 at offset 0, not %s at "
				      "offset %llu", (unsigned long long)a->seq, gg_dtype_name(a->dtype),
				      (unsigned long long)a->offset);
			return;
		}
	} else if (!reg || !reg->base) {
		hb_conn_fatal(b, c, GG_ERR_PROTOCOL, "step %llu: region %u is not mapped", (unsigned long long)a->seq,
			      (unsigned)a->region);
		return;
	}
	if (reg && a->offset % esize) {
		hb_conn_fatal(b, c, GG_ERR_PROTOCOL, "step %llu: offset %llu in region %u is not a multiple of the element "
			      "size, %zu", (unsigned long long)a->seq, (unsigned long long)a->offset, (unsigned)a->region,
			      esize);
		return;
	}
	if (reg && (a->offset > reg->size || bytes > reg->size - a->offset)) {
		hb_conn_fatal(b, c, GG_ERR_PROTOCOL, "step %llu: %llu bytes at offset %llu do not fit region %u of %llu bytes",
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
	hb_job_advance(b, c->job);
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
		hb_conn_unserved(b, c, GG_ERR_INVALID,
				 "this gateway was built without NCCL, so it cannot join the job's NCCL communicator "
				 "(gg_allreduce_nccl); use gg_allreduce_cuda or host memory");
		return;
	}
	if (c->nccl_joined) {
		hb_conn_fatal(b, c, GG_ERR_PROTOCOL, "NCCL_JOIN from rank %u of job '%s', which has joined already", c->rank,
			      j->name);
		return;
	}
	/* NCCL refuses peers of another version when the communicator is
	 * made, and may hang in its bootstrap first: the rank hears why now. */
	const uint32_t theirs = c->in.nccl_join.nccl_version;
	const int ours = b->opts.nccl->version ? b->opts.nccl->version() : 0;
	if (theirs && ours > 0 && theirs != (uint32_t)ours) {
		char tv[16], ov[16];
		hb_conn_unserved(b, c, GG_ERR_INVALID,
				 "rank %u runs NCCL %s and this gateway NCCL %s: NCCL makes a communicator only of ranks "
				 "of one version; give the ranks and the gateway the same NCCL", c->rank,
				 nccl_version_name(theirs, tv, sizeof(tv)), nccl_version_name((uint32_t)ours, ov, sizeof(ov)));
		return;
	}
	if (j->nccl_state == NCCL_ABORTED || j->broken) {
		hb_conn_unserved(b, c, j->nccl_state == NCCL_ABORTED ? j->nccl_code : j->broken,
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
			hb_nccl_end_id(b, j);
		if (rc) {
			hb_conn_unserved(b, c, rc == -ENODEV ? GG_ERR_INVALID : GG_ERR_SYSTEM,
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
	union gg_ctrl_msg *m = hb_out_push(c, GG_CTRL_NCCL_ID);
	m->nccl_id.nranks = j->nranks + 1;
	m->nccl_id.root = j->nranks;
	memcpy(m->nccl_id.id, j->nccl_id, sizeof(m->nccl_id.id));
	hb_out_kick(b, c);
}

/* A communicator being joined: the job's NCCL steps start once it is up.
 * Returns true when that changed. */
static bool nccl_join_progress(struct gg_host_backend *b, struct hb_job *j, uint64_t now_us, uint64_t *next)
{
	char why[TEXT - 96], text[2 * TEXT], list[160];
	int rc = b->opts.nccl->poll(j->nccl_comm, why, sizeof(why));

	if (!rc) {
		j->nccl_state = NCCL_UP;
		hb_nccl_end_id(b, j); /* every rank checked in: its root is done */
		hb_log(b, "job '%s': its NCCL communicator is up", j->name);
		return true;
	}
	if (rc == -EINPROGRESS && now_us < j->nccl_deadline_us) {
		*next = GG_MIN(now_us + NCCL_POLL_SLOW_US, j->nccl_deadline_us);
		return false;
	}
	if (rc == -EINPROGRESS) {
		snprintf(text, sizeof(text), "the NCCL communicator of job '%s' was not up within %u ms of its first "
			 "NCCL_JOIN: %s", j->name, j->nccl_timeout_ms, hb_nccl_joiners(j, list, sizeof(list)));
		hb_nccl_abort(b, j, GG_ERR_TIMEOUT, text);
	} else {
		snprintf(text, sizeof(text), "site %s: joining the NCCL communicator of job '%s': %s", b->site, j->name,
			 why);
		hb_nccl_abort(b, j, GG_ERR_SYSTEM, text);
	}
	return true;
}

/* Moves the job's NCCL work on: the communicator being joined, and the
 * reduce or broadcast of a step, done, failed, past its deadline, or cut
 * short by an abort. *next: when to look again (0: no need). Returns true
 * when something changed, and the caller settles the job. */
bool hb_nccl_progress(struct gg_host_backend *b, struct hb_job *j, uint64_t now_us, uint64_t *next)
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
	hb_nccl_phase_set(b, j, PHASE_NONE);
	if (phase == PHASE_REDUCE) {
		if (!rc) {
			hb_step_submit(b, j);
			return true;
		}
		hb_step_release_sum(b, j);
		hb_nccl_abort(b, j, code, text);
		hb_fail_step(b, j, code, "%s", text);
		return true;
	}
	/* Done, or cut short by an abort (hb_step_deliver() then says why, for a step
	 * that succeeded elsewhere). */
	if (!rc || rc == -ECONNABORTED)
		hb_step_deliver(b, j, j->nccl_outcome, j->nccl_outcome_msg);
	else
		hb_broadcast_failed(b, j, j->nccl_outcome, j->nccl_outcome_msg, code, text);
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
			hb_conn_refuse(b, c, GG_ERR_PROTOCOL, "%s", why);
		else if (type != GG_CTRL_HELLO && type != GG_CTRL_STATUS)
			hb_conn_refuse(b, c, GG_ERR_PROTOCOL, "expected HELLO or STATUS, got %s",
				       gg_ctrl_type_name((unsigned)type));
		else if (nfds || ctrunc)
			hb_conn_refuse(b, c, GG_ERR_PROTOCOL, "%s must not carry file descriptors",
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
		hb_conn_fatal(b, c, GG_ERR_PROTOCOL, "%s", why);
		return;
	}
	if ((nfds || ctrunc) && type != GG_CTRL_MAP) {
		hb_conn_fatal(b, c, GG_ERR_PROTOCOL, "%s must not carry file descriptors",
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
		hb_conn_fatal(b, c, GG_ERR_PROTOCOL, "unexpected %s from a client", gg_ctrl_type_name((unsigned)type));
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

void hb_on_recv(struct gg_host_backend *b, struct hb_conn *c, int res)
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
		hb_conn_lost(b, c, res);
	} else {
		/* An empty packet reads as 0 bytes too: it is a message, too
		 * short for a header, while the peer is still there. */
		size_t len = (size_t)res;
		if ((c->mh.msg_flags & MSG_TRUNC) && len <= sizeof(c->in))
			len = sizeof(c->in) + 1;
		on_message(b, c, len, fds, nfds, ctrunc);
		if (c->state == C_HELLO || c->state == C_ACTIVE)
			hb_arm_recv(b, c);
	}
	for (unsigned i = 0; i < nfds; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

void hb_on_send(struct gg_host_backend *b, struct hb_conn *c, int res)
{
	size_t len = c->out_len[c->out_head];

	c->send_busy = false;
	if (c->out[c->out_head].hdr.type == GG_CTRL_DONE)
		c->dones_queued--;
	c->out_head = (c->out_head + 1) % OUTQ;
	c->out_count--;
	if (res < 0 || (size_t)res != len) {
		hb_conn_lost(b, c, res < 0 ? res : -EMSGSIZE);
		/* Closing already, it would wait out CLOSE_TIMEOUT_US for
		 * answers that can no longer leave. */
		c->out_count = 0;
	} else {
		hb_out_kick(b, c);
	}
}

void hb_arm_accept(struct gg_host_backend *b)
{
	int rc = gg_acceptor_arm(&b->accept);

	if (rc)
		hb_warn(b, "control socket %s: cannot queue accept: %s", b->path, strerror(-rc));
}

void hb_on_accept(struct gg_host_backend *b, const struct io_uring_cqe *cqe)
{
	int fd = gg_acceptor_on_cqe(&b->accept, cqe, b->stopping);

	if (fd >= 0 && b->stopping)
		hb_refuse_waited(b, fd); /* says the gateway is shutting down */
	else if (fd >= 0)
		hb_conn_new(b, fd);
	else if (fd != -ECANCELED && gg_log_limit_now(&b->accept_log, b->loop->now_us, 1))
		/* Tried again every GG_ACCEPT_RETRY_US while it fails (out of
		 * descriptors): a line a second, and how many more. */
		hb_warn(b, "control socket %s: accept: %s", b->path, strerror(-fd));
}
