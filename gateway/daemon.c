#include "daemon.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "host_backend.h"
#include "log.h"
#include "mesh.h"
#include "node.h"
#include "units.h"

#define DRAIN_US 2000000u /* at most this long to deliver what peers await */
#define STOP_US 5000000u
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
	struct gg_node_stats final_stats; /* the node's, as it stopped */
};

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
	(void)ns;
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
	p->ns.deadline_us = ss->deadline_us;
	p->ns.timeout_us = (uint64_t)ss->timeout_ms * 1000;
	p->ns.done = step_done;
	p->ns.gather = step_gather;
	p->ns.deliver = step_deliver;
	p->ns.arg = p;
	int rc = gg_node_submit(d->node, &p->ns, err, sizeof(err));
	if (rc) {
		char msg[GG_NODE_ERROR_MAX + 64];
		gg_log(GG_LOG_WARN, "step_refused", "job=%s step=%llu reason=\"%s\"", ss->job,
		       (unsigned long long)ss->seq, err);
		/* Completing rather than returning the code tells the ranks why,
		 * not just "invalid argument". */
		snprintf(msg, sizeof(msg), "the gateway of site %s refused the step: %s",
			 gg_node_site_name(d->node, gg_node_self(d->node)), err);
		finish(p, to_errc(rc), msg);
	}
}

/* The backend's submit, on the backend's thread. */
static int core_submit(void *core, struct gg_site_step *ss)
{
	struct daemon *d = core;
	struct pending *p;

	if (ss->memory != GG_STEP_MEM_HOST)
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

static void core_end_job(void *core, const char *job)
{
	struct daemon *d = core;

	gg_node_end_job(d->node, job);
}

static const struct gg_core_ops core_ops = { core_submit, core_abort, core_end_job };

static void backend_log(void *arg, const char *line)
{
	(void)arg;
	gg_log(GG_LOG_INFO, "control", "msg=\"%s\"", line);
}

/* Whether every stream to every peer is up, as last logged. */
struct mesh_watch {
	bool connected;
	uint64_t next_us;     /* when to say again that it is not */
	uint64_t interval_us; /* doubles from heartbeat_timeout up to MESH_REPORT_MAX_US */
};

/* mesh_up once every stream is up; mesh_degraded when one goes, and again
 * while the mesh stays incomplete (first heartbeat_timeout after the start
 * or the loss, then at longer and longer intervals), naming the peers that
 * have no stream up and why: a pair of sites whose dial settings leave
 * neither to dial can tell nothing from the network. */
static void log_mesh(struct daemon *d, struct mesh_watch *w)
{
	const uint64_t now = gg_monotonic_us();
	char why[1024], safe[2 * sizeof(why)];

	if (w->connected != gg_node_connected(d->node)) {
		w->connected = !w->connected;
		w->interval_us = d->cfg->transport.heartbeat_timeout_us;
		w->next_us = now + w->interval_us;
		if (w->connected) {
			gg_log(GG_LOG_INFO, "mesh_up", "site=%s", d->cfg->site.name);
			return;
		}
	} else if (w->connected || now < w->next_us) {
		return;
	} else {
		w->interval_us = GG_MIN(2 * w->interval_us, MESH_REPORT_MAX_US);
		w->next_us = now + w->interval_us;
	}
	unsigned n = gg_node_unreachable(d->node, why, sizeof(why));
	if (n)
		gg_log(GG_LOG_WARN, "mesh_degraded", "site=%s unreachable=%u reason=\"%s\"", d->cfg->site.name, n,
		       gg_escape(safe, sizeof(safe), why, strlen(why)));
	else
		gg_log(GG_LOG_WARN, "mesh_degraded", "site=%s", d->cfg->site.name);
}

static void reload(struct daemon *d)
{
	char err[GG_NODE_ERROR_MAX];

	if (gg_node_reload(d->node, err, sizeof(err)))
		gg_log(GG_LOG_ERROR, "reload_failed", "reason=\"%s\" kept=previous credentials", err);
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
		if (stopped || turn(d, 20000))
			break;
	}
	if (stopped)
		d->backend->ops->destroy(d->backend);
	else
		gg_log(GG_LOG_WARN, "stop_incomplete", "site=%s reason=\"operations still in flight\"", d->cfg->site.name);
}

static void backend_cqe(void *arg, const struct io_uring_cqe *cqe)
{
	struct gg_site_backend *b = arg;
	b->ops->on_cqe(b, cqe);
}

/* Runs the loop once, waiting at most until the backend's next deadline. */
static int turn(struct daemon *d, uint64_t max_wait_us)
{
	struct gg_loop *loop = gg_node_loop(d->node);
	uint64_t next = d->backend->ops->tick(d->backend, loop->now_us);
	uint64_t wait = GG_MIN(max_wait_us, next ? gg_loop_timeout_us(loop, next) : max_wait_us);

	return gg_node_run_once(d->node, wait, backend_cqe, d->backend);
}

static int run(struct daemon *d)
{
	int status = GG_EXIT_OK;
	struct mesh_watch watch = { .next_us = gg_monotonic_us() + d->cfg->transport.heartbeat_timeout_us,
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

	/* Fail the steps in progress (the backend reports them to their ranks),
	 * deliver what peers still wait for of finished steps, close the
	 * streams, then stop the backend. */
	gg_log(GG_LOG_INFO, "stopping", "site=%s", d->cfg->site.name);
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

/* Every stream, handshake and client is a descriptor. The soft limit is
 * often 1024, below what the largest configurations hold: it is raised as
 * far as needed and allowed, and a shortfall is said at start rather than
 * found as failed dials and accepts later. */
static void raise_file_limit(const struct gg_config *cfg)
{
	rlim_t need = (rlim_t)gg_mesh_conn_max(cfg) + (rlim_t)cfg->limits.max_clients + 64;
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

	if (gg_node_new(cfg, &d.node, err, sizeof(err))) {
		gg_log(GG_LOG_ERROR, "startup_failed", "site=%s reason=\"%s\"", cfg->site.name, err);
		status = GG_EXIT_STARTUP;
		goto out;
	}
	gg_host_backend_options_from_config(cfg, &hopts);
	hopts.log = backend_log;
	if (gg_host_backend_create(&hopts, &core_ops, &d, &d.host, err, sizeof(err))) {
		gg_log(GG_LOG_ERROR, "startup_failed", "site=%s reason=\"%s\"", cfg->site.name, err);
		status = GG_EXIT_STARTUP;
		goto out;
	}
	d.backend = gg_host_backend_base(d.host);
	if (d.backend->ops->start(d.backend, gg_node_loop(d.node), err, sizeof(err))) {
		gg_log(GG_LOG_ERROR, "startup_failed", "site=%s reason=\"%s\"", cfg->site.name, err);
		d.backend->ops->destroy(d.backend);
		status = GG_EXIT_STARTUP;
		goto out;
	}
	char chunk[32];
	gg_log(GG_LOG_INFO, "started",
	       "site=%s listen=%s control=%s sites=%zu codec=%s algorithm=%s streams_per_peer=%d chunk=%s threads=%d",
	       cfg->site.name, cfg->site.listen, cfg->site.control, cfg->peer_count + 1,
	       gg_codec_name(cfg->compression.codec), gg_allreduce_algo_name(cfg->allreduce.algorithm),
	       cfg->transport.streams_per_peer, gg_format_size(cfg->transport.chunk_bytes, chunk, sizeof(chunk)),
	       cfg->site.threads);

	uint64_t started_us = gg_monotonic_us();
	status = run(&d);
	const struct gg_node_stats *st = &d.final_stats;
	gg_log(GG_LOG_INFO, "stopped",
	       "site=%s steps_done=%llu steps_failed=%llu raw_bytes_out=%llu wire_bytes_out=%llu resent_messages=%llu "
	       "encode_s=%.3f decode_s=%.3f tls_s=%.3f uptime_s=%.3f",
	       cfg->site.name, (unsigned long long)st->steps_done, (unsigned long long)st->steps_failed,
	       (unsigned long long)st->raw_bytes_out, (unsigned long long)st->data_bytes_out,
	       (unsigned long long)st->resent_messages, st->encode_s, st->decode_s, st->tls_s,
	       (double)(gg_monotonic_us() - started_us) / 1e6);
out:
	gg_node_free(d.node);
	return status;
}
