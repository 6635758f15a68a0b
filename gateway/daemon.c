#include "daemon.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>

#include "gg_build_config.h"
#include "host_backend.h"
#include "http_server.h"
#include "log.h"
#include "mesh.h"
#include "metrics.h"
#include "net_addr.h"
#include "node.h"
#include "units.h"

#define DRAIN_US 2000000u /* at most this long to deliver what peers await */
#define STOP_US 5000000u
/* The metrics endpoint's bounds. */
#define METRICS_CONNS 8
#define METRICS_REQUEST_BYTES 8192
#define METRICS_PAGE_BYTES (1u << 20)
#define METRICS_TIMEOUT_US 5000000u
#define MESH_REPORT_MAX_US 600000000u /* the longest wait between reports of an incomplete mesh */

static volatile sig_atomic_t got_stop, got_hup;

static void on_signal(int sig)
{
	if (sig == SIGHUP)
		got_hup = 1;
	else
		got_stop = 1;
}

/* A backend step on its way through the node. */
struct pending {
	struct daemon *d;
	struct gg_node_step ns;
	struct gg_site_step *ss;
	uint64_t submit_us; /* gg_monotonic_us() when the node took it */
};

/* The site backend shares the loop of the node's lane 0 (and with it the
 * coordinator's thread), so steps go between them by plain calls; the
 * node's other lanes call the step's gather and deliver from their own
 * threads, for disjoint ranges. */
struct daemon {
	const struct gg_config *cfg;
	struct gg_node *node;
	struct gg_host_backend *host;
	struct gg_site_backend *backend;
	struct gg_http_server *metrics;   /* NULL: no [metrics] listen */
	struct gg_node_stats final_stats; /* the node's, as it stopped */
	uint64_t started_us;
	double started_unix_s;
	struct stat config_st; /* cfg->source as the gateway started; st_ino 0: unknown */
};

static double unix_now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A refusal of the node's (a negative errno) as the ranks hear it. */
static int to_errc(int status)
{
	switch (status) {
	case -ETIMEDOUT:
		return GG_ERR_TIMEOUT;
	case -ENOMEM:
		return GG_ERR_NOMEM;
	case -ENOSPC:
		return GG_ERR_LIMIT;
	case -EBUSY:
		return GG_ERR_BUSY;
	case -E2BIG:
		return GG_ERR_TOO_LARGE;
	case -ESHUTDOWN:
		return GG_ERR_CLOSED;
	case -EINVAL:
		return GG_ERR_INVALID;
	default:
		return GG_ERR_SITE;
	}
}

/* The step is over in the core: back to the backend. */
static void finish(struct pending *p, int status, const char *message)
{
	gg_site_step_complete(p->ss, status, message && *message ? message : NULL);
	free(p);
}

static void step_done(void *arg, struct gg_node_step *ns, int status, const char *message)
{
	const struct pending *p = arg;

	/* Failures are logged where they happen (step_failed); --log-level
	 * debug adds a line for every step that completes. */
	if (!status)
		gg_log(GG_LOG_DEBUG, "step_done", "job=%s step=%llu tensor=%u elements=%llu algorithm=%s ms=%.1f",
		       ns->job, (unsigned long long)ns->seq, ns->tensor_id, (unsigned long long)ns->count,
		       gg_allreduce_algo_name(ns->algorithm), (double)(gg_monotonic_us() - p->submit_us) / 1e3);
	finish(arg, status, message);
}

static void step_gather(void *arg, uint64_t offset, uint64_t n)
{
	const struct pending *p = arg;

	p->ss->gather(p->ss, offset, n);
}

static void step_deliver(void *arg, uint64_t offset, uint64_t n)
{
	const struct pending *p = arg;

	p->ss->deliver(p->ss, offset, n);
}

/* Starts the step in the node, on the node's thread. */
static void core_start(struct daemon *d, struct pending *p)
{
	char err[GG_NODE_ERROR_MAX];
	const struct gg_site_step *ss = p->ss;

	snprintf(p->ns.job, sizeof(p->ns.job), "%s", ss->job);
	p->ns.seq = ss->seq;
	p->ns.tensor_id = ss->tensor_id;
	p->ns.count = ss->count;
	p->ns.dtype = ss->dtype == GG_DTYPE_BF16 ? GG_WIRE_BF16 : GG_WIRE_F32;
	p->ns.input = ss->sum; /* gathered a range at a time; each read before it is written */
	p->ns.result = ss->sum;
	p->ns.device = ss->memory == GG_STEP_MEM_CUDA;
	p->ns.deadline_us = ss->deadline_us;
	p->ns.timeout_us = (uint64_t)ss->timeout_ms * 1000;
	p->ns.done = step_done;
	p->ns.gather = step_gather;
	p->ns.deliver = step_deliver;
	p->ns.arg = p;
	p->submit_us = gg_monotonic_us();
	int rc = gg_node_submit(d->node, &p->ns, err, sizeof(err));
	if (rc) {
		char msg[GG_NODE_ERROR_MAX + 64], safe[GG_ESCAPED_SIZE(GG_NODE_ERROR_MAX)];
		gg_log(GG_LOG_WARN, "step_refused", "job=%s step=%llu reason=\"%s\"", ss->job,
		       (unsigned long long)ss->seq, gg_escape(safe, sizeof(safe), err, strlen(err)));
		/* Completing rather than returning the code tells the ranks why,
		 * not just "invalid argument". */
		snprintf(msg, sizeof(msg), "the gateway of site %s refused the step: %s",
			 gg_node_site_name(d->node, gg_node_self(d->node)), err);
		/* The step fails at the other sites too, with this cause, rather
		 * than wait there for this site's part until their deadline.
		 * Not for a step of the job in progress here (-EBUSY): that
		 * one's number is the step in progress's business. */
		if (rc == -EBUSY || gg_node_abort(d->node, ss->job, ss->seq, to_errc(rc), msg))
			gg_node_note_failure(d->node, ss->job, ss->seq, to_errc(rc), msg);
		finish(p, to_errc(rc), msg);
	}
}

/* The backend's submit, on the backend's thread. */
static int core_submit(void *core, struct gg_site_step *ss)
{
	struct daemon *d = core;
	struct pending *p;

	if (ss->memory != GG_STEP_MEM_HOST && ss->memory != GG_STEP_MEM_CUDA)
		return GG_ERR_INVALID;
	p = calloc(1, sizeof(*p));
	if (!p)
		return GG_ERR_NOMEM;
	p->d = d;
	p->ss = ss;
	core_start(d, p);
	return 0;
}

static int core_abort(void *core, const char *job, uint64_t seq, int code, const char *message)
{
	struct daemon *d = core;

	return gg_node_abort(d->node, job, seq, code, message);
}

static void core_end_job(void *core, const char *job, const char *why)
{
	struct daemon *d = core;

	gg_node_end_job_why(d->node, job, why);
}

static int core_fail_unstarted(void *core, const char *job, uint64_t seq, char *message, size_t message_size)
{
	struct daemon *d = core;

	return gg_node_fail_unstarted(d->node, job, seq, message, message_size);
}

static void core_job_opened(void *core, const char *job)
{
	struct daemon *d = core;

	gg_node_job_opened(d->node, job);
}

static void core_gpu_frees(void *core, bool allowed)
{
	struct daemon *d = core;

	gg_node_gpu_frees(d->node, allowed);
}

static bool core_lost_site(void *core, char *why, size_t why_size)
{
	struct daemon *d = core;

	return gg_node_lost_site(d->node, why, why_size);
}

static bool core_job_failed(void *core, const char *job)
{
	struct daemon *d = core;

	return gg_node_job_failed(d->node, job);
}

static void core_abort_from(void *core, const char *job, uint64_t seq, int code, const char *message)
{
	struct daemon *d = core;

	gg_node_abort_from(d->node, job, seq, code, message);
}

static const struct gg_core_ops core_ops = { core_submit,     core_abort,	  core_end_job,
					     core_fail_unstarted, core_job_opened, core_gpu_frees,
					     core_lost_site,  core_job_failed, core_abort_from };

static void backend_log(void *arg, bool fault, const char *line)
{
	char safe[GG_ESCAPED_SIZE(512)];

	(void)arg;
	gg_log(fault ? GG_LOG_WARN : GG_LOG_INFO, "control", "msg=\"%s\"", gg_escape(safe, sizeof(safe), line, strlen(line)));
}

/* A stream that goes down is told of only if the mesh is still incomplete
 * this much later: where both sites dial, one closes its own connection of
 * a pair for the other's, which may come up an instant after. */
#define MESH_SWAP_US 250000

/* Whether every stream to every peer is up, and whether its lack was told. */
struct mesh_watch {
	bool connected;
	bool told;            /* mesh_degraded logged since the mesh was last up */
	uint64_t next_us;     /* when to say (again) that it is not */
	uint64_t interval_us; /* doubles from heartbeat_timeout up to MESH_REPORT_MAX_US */
};

/* mesh_up once every stream is up; mesh_degraded when one goes, and again
 * while the mesh stays incomplete (first heartbeat_timeout after the start
 * or the loss, then at longer and longer intervals), naming the peers that
 * have no stream up and why: a pair of sites whose dial settings leave
 * neither to dial can tell nothing from the network. A stream back within
 * MESH_SWAP_US makes neither line: with one stream per peer, the pair's
 * swap leaves that peer with none for a moment. */
static void log_mesh(struct daemon *d, struct mesh_watch *w)
{
	const uint64_t now = gg_monotonic_us();
	char why[1024], safe[2 * sizeof(why)];
	unsigned n;

	if (gg_node_connected(d->node)) {
		if (!w->connected && w->told)
			gg_log(GG_LOG_INFO, "mesh_up", "site=%s", d->cfg->site.name);
		w->connected = true;
		w->told = false;
		return;
	}
	if (w->connected) {
		w->connected = false;
		w->interval_us = d->cfg->transport.heartbeat_timeout_us;
		w->next_us = now + MESH_SWAP_US;
		return;
	}
	if (now < w->next_us)
		return;
	n = gg_node_unreachable(d->node, why, sizeof(why));
	if (w->told)
		w->interval_us = GG_MIN(2 * w->interval_us, MESH_REPORT_MAX_US);
	w->next_us = now + w->interval_us;
	w->told = true;
	if (why[0])
		gg_log(GG_LOG_WARN, "mesh_degraded", "site=%s unreachable=%u reason=\"%s\"", d->cfg->site.name, n,
		       gg_escape(safe, sizeof(safe), why, strlen(why)));
	else
		gg_log(GG_LOG_WARN, "mesh_degraded", "site=%s", d->cfg->site.name);
}

/* Logs why the gateway could not start (the reason may quote the
 * configuration: escaped, so the line stays one key=value line). */
static int startup_failed(const struct gg_config *cfg, const char *err)
{
	char safe[GG_ESCAPED_SIZE(GG_NODE_ERROR_MAX)];

	gg_log(GG_LOG_ERROR, "startup_failed", "site=%s reason=\"%s\"", cfg->site.name,
	       gg_escape(safe, sizeof(safe), err, strlen(err)));
	return GG_EXIT_STARTUP;
}

/* Whether the config file is another, or another version of it, than the
 * one the gateway started with (a file written anew, edited in place). */
static bool config_changed(const struct daemon *d)
{
	struct stat now;
	const struct stat *was = &d->config_st;

	if (!was->st_ino)
		return false;
	return stat(d->cfg->source, &now) || now.st_ino != was->st_ino || now.st_dev != was->st_dev ||
	       now.st_size != was->st_size || now.st_mtim.tv_sec != was->st_mtim.tv_sec ||
	       now.st_mtim.tv_nsec != was->st_mtim.tv_nsec;
}

static void reload(struct daemon *d)
{
	char err[GG_NODE_ERROR_MAX], safe[GG_ESCAPED_SIZE(GG_NODE_ERROR_MAX)];

	/* Settings are read at start only; the files they name are read
	 * again. An operator who edited the file and sent SIGHUP hears it. */
	if (config_changed(d))
		gg_log(GG_LOG_WARN, "config_changed", "path=\"%s\" reason=\"the config file changed since the gateway "
		       "started: SIGHUP reads again only the files [tls] names, as named at the start; restart the "
		       "gateway to apply the rest\"", gg_escape(safe, sizeof(safe), d->cfg->source, strlen(d->cfg->source)));

	if (gg_node_reload(d->node, err, sizeof(err)))
		gg_log(GG_LOG_ERROR, "reload_failed", "reason=\"%s\" kept=\"previous credentials\"",
		       gg_escape(safe, sizeof(safe), err, strlen(err)));
	else
		gg_log(GG_LOG_INFO, "reloaded", "what=certificates");
}

static int turn(struct daemon *d, uint64_t max_wait_us);

/* Stops the backend once the node is down: turns the loop until nothing is
 * in flight (STOP_US at most), and destroys it. */
static void stop_backend(struct daemon *d)
{
	uint64_t until = gg_monotonic_us() + STOP_US;
	bool stopped = false;

	while (gg_monotonic_us() < until) {
		stopped = d->backend->ops->stop(d->backend) && gg_node_idle(d->node);
		if (d->metrics)
			stopped = gg_http_server_stop(d->metrics) && stopped;
		if (stopped || turn(d, 20000))
			break;
	}
	if (stopped) {
		d->backend->ops->destroy(d->backend);
		gg_http_server_free(d->metrics);
		d->metrics = NULL;
	}
	else
		gg_log(GG_LOG_WARN, "stop_incomplete", "site=%s reason=\"operations still in flight\"", d->cfg->site.name);
}

/* Completions of the loop's other users: the site backend, the metrics
 * endpoint. */
static void user_cqe(void *arg, const struct io_uring_cqe *cqe)
{
	struct daemon *d = arg;

	if (!d->backend->ops->on_cqe(d->backend, cqe) && d->metrics)
		gg_http_server_on_cqe(d->metrics, cqe);
}

/* Runs the loop once, waiting at most until the next deadline of the
 * backend or the metrics endpoint. */
static int turn(struct daemon *d, uint64_t max_wait_us)
{
	struct gg_loop *loop = gg_node_loop(d->node);
	uint64_t next = d->backend->ops->tick(d->backend, loop->now_us);
	uint64_t wait = GG_MIN(max_wait_us, next ? gg_loop_timeout_us(loop, next) : max_wait_us);

	if (d->metrics && (next = gg_http_server_tick(d->metrics, loop->now_us)))
		wait = GG_MIN(wait, gg_loop_timeout_us(loop, next));
	return gg_node_run_once(d->node, wait, user_cqe, d);
}

/* The metrics page, on the daemon's thread: snapshots of the node's and
 * the backend's figures. */
static int render_metrics(void *arg, struct gg_strbuf *out)
{
	struct daemon *d = arg;
	struct gg_node_metrics nm;
	struct gg_host_backend_stats hs;
	if (!d->host)
		return -EAGAIN;
	struct gg_metrics_input in = { .site = d->cfg->site.name, .version = GG_VERSION, .node = &nm, .host = &hs,
				       .memory_limit_bytes = d->cfg->limits.memory_bytes,
				       .start_unix_s = d->started_unix_s, .now_unix_s = unix_now_s(),
				       .now_us = gg_monotonic_us() };

	gg_node_get_metrics(d->node, &nm);
	gg_host_backend_get_stats(d->host, &hs);
	for (unsigned p = 0; p < nm.sites; p++)
		in.peer_names[p] = p == nm.self ? NULL : gg_node_site_name(d->node, p);
	gg_metrics_render(&in, out);
	return 0;
}

/* The answer to a status request (control_proto.h), on the daemon's
 * thread: the site, its peers, the backend's jobs and the last failures. */
static unsigned status_answer(void *arg, union gg_ctrl_msg *out, unsigned max)
{
	struct daemon *d = arg;
	const struct gg_config *cfg = d->cfg;
	struct gg_node_metrics nm;
	struct gg_host_job_info jobs[GG_CTRL_STATUS_MAX_JOBS];
	struct gg_node_failure failures[GG_CTRL_STATUS_MAX_FAILURES];
	const uint64_t now = gg_monotonic_us();
	const double now_unix = unix_now_s();
	unsigned n = 0;

	if (max < GG_HOST_STATUS_MAX_MESSAGES)
		return 0;
	gg_node_get_metrics(d->node, &nm);
	unsigned jobs_total = gg_host_backend_list_jobs(d->host, jobs, GG_CTRL_STATUS_MAX_JOBS);
	unsigned njobs = GG_MIN(jobs_total, GG_CTRL_STATUS_MAX_JOBS);
	unsigned nfail = gg_node_recent_failures(d->node, failures, GG_CTRL_STATUS_MAX_FAILURES);

	struct gg_ctrl_status_site *site = &out[n].status_site;
	gg_ctrl_init(&out[n++], GG_CTRL_STATUS_SITE);
	site->version = GG_CTRL_STATUS_VERSION;
	site->peers = nm.sites - 1;
	site->jobs = njobs;
	site->failures = nfail;
	site->uptime_ms = (now - d->started_us) / 1000;
	site->jobs_total = jobs_total;
	site->steps_done = nm.stats.steps_done;
	site->steps_failed = nm.stats.steps_failed;
	gg_ctrl_set_text(site->site, sizeof(site->site), cfg->site.name);
	gg_ctrl_set_text(site->gateway_version, sizeof(site->gateway_version), GG_VERSION);

	for (unsigned p = 0; p < nm.sites; p++) {
		if (p == nm.self)
			continue;
		const struct gg_node_peer_metrics *pm = &nm.peers[p];
		const char *name = gg_node_site_name(d->node, p);
		const struct gg_peer_config *pc = gg_config_peer(cfg, name);
		const char *address = pc && pc->address ? pc->address : "";
		struct gg_ctrl_status_peer *sp = &out[n].status_peer;
		gg_ctrl_init(&out[n++], GG_CTRL_STATUS_PEER);
		sp->streams_up = pm->streams_up;
		sp->streams = pm->streams;
		sp->rtt_us = pm->rtt_us;
		sp->bytes_in = pm->wire_bytes_in;
		sp->bytes_out = pm->wire_bytes_out;
		sp->heard_ms_ago = pm->heard_us && pm->heard_us <= now ? (now - pm->heard_us) / 1000 : UINT64_MAX;
		gg_ctrl_set_text(sp->site, sizeof(sp->site), name);
		gg_ctrl_set_text(sp->address, sizeof(sp->address), address);
	}
	for (unsigned i = 0; i < njobs; i++) {
		struct gg_ctrl_status_job *sj = &out[n].status_job;
		gg_ctrl_init(&out[n++], GG_CTRL_STATUS_JOB);
		sj->nranks = jobs[i].nranks;
		sj->connected = jobs[i].connected;
		sj->last_step = jobs[i].last_step;
		sj->state = jobs[i].state;
		sj->uid = jobs[i].uid;
		gg_ctrl_set_text(sj->job, sizeof(sj->job), jobs[i].name);
	}
	for (unsigned i = 0; i < nfail; i++) {
		const struct gg_node_failure *f = &failures[i];
		struct gg_ctrl_status_failure *sf = &out[n].status_failure;
		char message[GG_CTRL_TEXT_SIZE];
		gg_ctrl_init(&out[n++], GG_CTRL_STATUS_FAILURE);
		sf->step = f->step;
		sf->code = f->code;
		sf->age_ms = f->at_us <= now ? (now - f->at_us) / 1000 : 0;
		sf->unix_ms = f->at_unix_ms ? f->at_unix_ms : (uint64_t)(now_unix * 1000);
		/* Messages quote peers too: never a control character in a status. */
		snprintf(message, sizeof(message), "%s", f->message);
		for (char *c = message; *c; c++)
			if ((unsigned char)*c < 0x20 || *c == 0x7f)
				*c = ' ';
		gg_ctrl_set_text(sf->job, sizeof(sf->job), f->job);
		gg_ctrl_set_text(sf->message, sizeof(sf->message), message);
	}
	return n;
}

int gg_daemon_metrics_address(const struct gg_config *cfg, struct sockaddr_storage *ss, socklen_t *len, char *err,
			       size_t err_size)
{
	const char *why;

	if (gg_net_addr_parse(cfg->metrics.listen, ss, len, &why))
		return gg_errf(err, err_size, -EINVAL, "[metrics] listen %s: %s", cfg->metrics.listen, why);
	/* The config allowed the name; what it resolves to must be loopback too. */
	if (!cfg->metrics.allow_remote && !gg_net_addr_is_loopback((struct sockaddr *)ss)) {
		char addr[GG_NET_ADDR_TEXT_MAX];
		return gg_errf(err, err_size, -EINVAL, "[metrics] listen %s resolves to %s, not a loopback address "
			       "(set allow_remote = true to serve it there)", cfg->metrics.listen,
			       gg_net_addr_format((struct sockaddr *)ss, addr, sizeof(addr)));
	}
	return 0;
}

/* Starts the metrics endpoint when [metrics] listen is set. Returns 0, or
 * a negative errno with err saying why. */
static int start_metrics(struct daemon *d, char *err, size_t err_size)
{
	const struct gg_config *cfg = d->cfg;
	struct sockaddr_storage ss;
	socklen_t len;
	int rc;

	if (!cfg->metrics.listen)
		return 0;
	if ((rc = gg_daemon_metrics_address(cfg, &ss, &len, err, err_size)))
		return rc;
	struct gg_http_options o = {
		.addr = (struct sockaddr *)&ss, .addr_len = len, .path = "/metrics",
		.content_type = GG_METRICS_CONTENT_TYPE, .render = render_metrics, .arg = d,
		.max_conns = METRICS_CONNS, .max_request_bytes = METRICS_REQUEST_BYTES,
		.max_response_bytes = METRICS_PAGE_BYTES, .request_timeout_us = METRICS_TIMEOUT_US,
		.kind_base = GG_OP_USER + GG_HOST_BACKEND_KINDS,
	};
	char why_http[GG_HTTP_ERROR_MAX];
	if (gg_http_server_start(&o, gg_node_loop(d->node), &d->metrics, why_http, sizeof(why_http)))
		return gg_errf(err, err_size, -EADDRINUSE, "[metrics] listen %s: %s", cfg->metrics.listen, why_http);
	return 0;
}

static int run(struct daemon *d)
{
	int status = GG_EXIT_OK;
	/* At the start the mesh is incomplete as if told: mesh_up comes once it is whole. */
	struct mesh_watch watch = { .told = true,
				    .next_us = gg_monotonic_us() + d->cfg->transport.heartbeat_timeout_us,
				    .interval_us = d->cfg->transport.heartbeat_timeout_us };

	while (!got_stop) {
		if (turn(d, 100000)) {
			gg_log(GG_LOG_ERROR, "loop_failed", "site=%s", d->cfg->site.name);
			status = GG_EXIT_RUNTIME;
			break;
		}
		if (got_hup) {
			got_hup = 0;
			reload(d);
		}
		log_mesh(d, &watch);
	}

	/* End the ranks' sessions first, while the streams are up: the steps
	 * they were still gathering fail at the peers too (ABORT), and so do
	 * the steps of their jobs the peers started (END), at once rather
	 * than at heartbeat_timeout. Then fail the steps in progress (the
	 * backend reports them to their ranks), deliver what peers still wait
	 * for of finished steps, close the streams, and stop the backend. */
	gg_log(GG_LOG_INFO, "stopping", "site=%s", d->cfg->site.name);
	(void)d->backend->ops->stop(d->backend);
	gg_node_stop_steps(d->node);
	uint64_t until = gg_monotonic_us() + DRAIN_US;
	while (status == GG_EXIT_OK && !gg_node_flushed(d->node) && gg_monotonic_us() < until)
		if (turn(d, 20000))
			break;
	gg_node_shutdown(d->node);
	stop_backend(d);
	d->final_stats = *gg_node_stats(d->node);
	return status;
}

/* Every stream, handshake and client is a descriptor, and each thread has
 * a ring and a mailbox (the lanes, at most one per stream, and the
 * acceptor). The soft limit is often 1024, below what the largest
 * configurations hold: it is raised as far as needed and allowed, and a
 * shortfall is said at start rather than found as failed dials and
 * accepts later. */
static void raise_file_limit(const struct gg_config *cfg)
{
	rlim_t threads = (rlim_t)cfg->transport.streams_per_peer + 1;
	rlim_t need = (rlim_t)gg_mesh_conn_max(cfg) + (rlim_t)cfg->limits.max_clients + 2 * threads + 64;
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur >= need)
		return;
	rl.rlim_cur = rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need ? rl.rlim_max : need;
	if (!setrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur >= need)
		return;
	if (!getrlimit(RLIMIT_NOFILE, &rl))
		gg_log(GG_LOG_WARN, "file_limit", "site=%s limit=%llu need=%llu reason=\"the open file limit is below "
		       "what %zu peers x %d streams and %d clients may hold\"", cfg->site.name,
		       (unsigned long long)rl.rlim_cur, (unsigned long long)need, cfg->peer_count,
		       cfg->transport.streams_per_peer, cfg->limits.max_clients);
}

int gg_daemon_run(const struct gg_config *cfg)
{
	struct daemon d = { .cfg = cfg };
	struct gg_host_backend_options hopts;
	char err[GG_NODE_ERROR_MAX];
	int status = GG_EXIT_OK;

	struct sigaction sa = { .sa_handler = on_signal };
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	raise_file_limit(cfg);
	if (!cfg->source || stat(cfg->source, &d.config_st))
		d.config_st.st_ino = 0;

	int rc = gg_node_new(cfg, &d.node, err, sizeof(err));
	if (rc) {
		/* Its port taken: by a gateway of this very config, most likely,
		 * which its control socket's lock names. */
		char pid[24];
		size_t len = strlen(err);
		if (rc == -EADDRINUSE && gg_host_backend_held(cfg->site.control, pid, sizeof(pid)))
			snprintf(err + len, sizeof(err) - len, "; a gateway with this config's control socket runs%s%s%s: "
				 "stop it first", *pid ? " (pid " : "", pid, *pid ? ")" : "");
		status = startup_failed(cfg, err);
		goto out;
	}
	d.started_us = gg_monotonic_us();
	d.started_unix_s = unix_now_s();
	if (start_metrics(&d, err, sizeof(err))) {
		status = startup_failed(cfg, err);
		goto out;
	}
	gg_host_backend_options_from_config(cfg, &hopts);
	hopts.max_jobs = GG_NODE_MAX_JOBS;
	hopts.log = backend_log;
	hopts.status = status_answer;
	hopts.status_arg = &d;
	if (gg_host_backend_create(&hopts, &core_ops, &d, &d.host, err, sizeof(err))) {
		status = startup_failed(cfg, err);
		goto out;
	}
	d.backend = gg_host_backend_base(d.host);
	if (d.backend->ops->start(d.backend, gg_node_loop(d.node), err, sizeof(err))) {
		status = startup_failed(cfg, err);
		d.backend->ops->destroy(d.backend);
		goto out;
	}
	char chunk[32], metrics[GG_NET_ADDR_TEXT_MAX + 16] = "off";
	if (d.metrics) {
		char addr[GG_NET_ADDR_TEXT_MAX];
		snprintf(metrics, sizeof(metrics), "http://%s/metrics", gg_http_server_address(d.metrics, addr, sizeof(addr)));
	}
	char control[GG_ESCAPED_SIZE(256)];
	gg_escape(control, sizeof(control), cfg->site.control, strnlen(cfg->site.control, 256));
	gg_log(GG_LOG_INFO, "started",
	       "site=%s listen=%s control=\"%s\" sites=%zu codec=%s algorithm=%s streams_per_peer=%d chunk=%s threads=%u "
	       "metrics=%s",
	       cfg->site.name, cfg->site.listen, control, cfg->peer_count + 1,
	       gg_codec_name(cfg->compression.codec), gg_allreduce_algo_name(cfg->allreduce.algorithm),
	       cfg->transport.streams_per_peer, gg_format_size(cfg->transport.chunk_bytes, chunk, sizeof(chunk)),
	       gg_node_lanes(d.node), metrics);

	status = run(&d);
	const struct gg_node_stats *st = &d.final_stats;
	gg_log(GG_LOG_INFO, "stopped",
	       "site=%s steps_done=%llu steps_failed=%llu raw_bytes_out=%llu wire_bytes_out=%llu resent_messages=%llu "
	       "hedged_frames=%llu encode_s=%.3f decode_s=%.3f tls_s=%.3f uptime_s=%.3f",
	       cfg->site.name, (unsigned long long)st->steps_done, (unsigned long long)st->steps_failed,
	       (unsigned long long)st->raw_bytes_out, (unsigned long long)st->data_bytes_out,
	       (unsigned long long)st->resent_messages, (unsigned long long)st->hedged_frames, st->encode_s, st->decode_s, st->tls_s,
	       (double)(gg_monotonic_us() - d.started_us) / 1e6);
out:
	/* The ring goes first: nothing of the endpoint's is in flight after. */
	gg_node_free(d.node);
	gg_http_server_free(d.metrics);
	return status;
}
