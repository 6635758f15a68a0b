#include "daemon.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host_backend.h"
#include "log.h"
#include "node.h"
#include "units.h"

#define DRAIN_US 2000000u /* at most this long to deliver what peers await */
#define STOP_US 5000000u

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
	struct gg_node_step ns;
	struct gg_site_step *ss;
};

struct daemon {
	struct gg_node *node;
	struct gg_host_backend *host;
	struct gg_site_backend *backend;
};

static int to_errc(int status)
{
	switch (status) {
	case -ETIMEDOUT:
		return GG_ERR_TIMEOUT;
	case -ENOMEM:
		return GG_ERR_NOMEM;
	case -EBUSY:
		return GG_ERR_BUSY;
	case -EINVAL:
		return GG_ERR_INVALID;
	default:
		return GG_ERR_SITE;
	}
}

static void step_done(void *arg, struct gg_node_step *ns, int status, const char *message)
{
	struct pending *p = arg;

	(void)ns;
	gg_site_step_complete(p->ss, status ? to_errc(status) : 0, message);
	free(p);
}

static int core_submit(void *core, struct gg_site_step *ss)
{
	struct daemon *d = core;
	char err[GG_NODE_ERROR_MAX];
	struct pending *p;

	if (ss->memory != GG_STEP_MEM_HOST)
		return GG_ERR_INVALID;
	p = calloc(1, sizeof(*p));
	if (!p)
		return GG_ERR_NOMEM;
	p->ss = ss;
	snprintf(p->ns.job, sizeof(p->ns.job), "%s", ss->job);
	p->ns.seq = ss->seq;
	p->ns.tensor_id = ss->tensor_id;
	p->ns.count = ss->count;
	p->ns.dtype = ss->dtype == GG_DTYPE_BF16 ? GG_WIRE_BF16 : GG_WIRE_F32;
	p->ns.input = ss->sum; /* the engine reads each element before it writes it */
	p->ns.result = ss->sum;
	p->ns.done = step_done;
	p->ns.arg = p;
	int rc = gg_node_submit(d->node, &p->ns, err, sizeof(err));
	if (rc) {
		char msg[GG_NODE_ERROR_MAX + 64];
		gg_log(GG_LOG_WARN, "step_refused", "job=%s step=%llu reason=\"%s\"", ss->job,
		       (unsigned long long)ss->seq, err);
		free(p);
		/* Completing here rather than returning the code tells the ranks
		 * why, not just "invalid argument". */
		snprintf(msg, sizeof(msg), "the gateway of site %s refused the step: %s",
			 gg_node_site_name(d->node, gg_node_self(d->node)), err);
		gg_site_step_complete(ss, to_errc(rc), msg);
	}
	return 0;
}

static const struct gg_core_ops core_ops = { core_submit };

static void backend_cqe(void *arg, const struct io_uring_cqe *cqe)
{
	struct gg_site_backend *b = arg;
	b->ops->on_cqe(b, cqe);
}

static void backend_log(void *arg, const char *line)
{
	(void)arg;
	gg_log(GG_LOG_INFO, "control", "msg=\"%s\"", line);
}

/* Runs the loop once, waiting at most until the backend's next deadline. */
static int turn(struct daemon *d, uint64_t max_wait_us)
{
	struct gg_loop *loop = gg_node_loop(d->node);
	uint64_t next = d->backend->ops->tick(d->backend, loop->now_us);
	uint64_t wait = GG_MIN(max_wait_us, next ? gg_loop_timeout_us(loop, next) : max_wait_us);

	return gg_node_run_once(d->node, wait, backend_cqe, d->backend);
}

int gg_daemon_run(const struct gg_config *cfg)
{
	struct daemon d = { 0 };
	struct gg_host_backend_options hopts;
	char err[GG_NODE_ERROR_MAX];
	int status = GG_EXIT_OK;

	struct sigaction sa = { .sa_handler = on_signal };
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	if (gg_node_new(cfg, &d.node, err, sizeof(err))) {
		gg_log(GG_LOG_ERROR, "startup_failed", "site=%s reason=\"%s\"", cfg->site.name, err);
		return GG_EXIT_STARTUP;
	}
	gg_host_backend_options_from_config(cfg, &hopts);
	hopts.log = backend_log;
	if (gg_host_backend_create(&hopts, &core_ops, &d, &d.host, err, sizeof(err))) {
		gg_log(GG_LOG_ERROR, "startup_failed", "site=%s reason=\"%s\"", cfg->site.name, err);
		gg_node_free(d.node);
		return GG_EXIT_STARTUP;
	}
	d.backend = gg_host_backend_base(d.host);
	if (d.backend->ops->start(d.backend, gg_node_loop(d.node), err, sizeof(err))) {
		gg_log(GG_LOG_ERROR, "startup_failed", "site=%s reason=\"%s\"", cfg->site.name, err);
		d.backend->ops->destroy(d.backend);
		gg_node_free(d.node);
		return GG_EXIT_STARTUP;
	}
	char chunk[32];
	gg_log(GG_LOG_INFO, "started",
	       "site=%s listen=%s control=%s sites=%zu codec=%s algorithm=%s streams_per_peer=%d chunk=%s",
	       cfg->site.name, cfg->site.listen, cfg->site.control, cfg->peer_count + 1,
	       gg_codec_name(cfg->compression.codec), gg_allreduce_algo_name(cfg->allreduce.algorithm),
	       cfg->transport.streams_per_peer, gg_format_size(cfg->transport.chunk_bytes, chunk, sizeof(chunk)));

	bool connected = false;
	uint64_t started_us = gg_monotonic_us();
	while (!got_stop) {
		if (turn(&d, 100000)) {
			gg_log(GG_LOG_ERROR, "loop_failed", "site=%s", cfg->site.name);
			status = GG_EXIT_RUNTIME;
			break;
		}
		if (got_hup) {
			got_hup = 0;
			if (gg_node_reload(d.node, err, sizeof(err)))
				gg_log(GG_LOG_ERROR, "reload_failed", "reason=\"%s\" kept=previous credentials", err);
			else
				gg_log(GG_LOG_INFO, "reloaded", "what=certificates");
		}
		if (connected != gg_node_connected(d.node)) {
			connected = !connected;
			gg_log(connected ? GG_LOG_INFO : GG_LOG_WARN, connected ? "mesh_up" : "mesh_degraded",
			       "site=%s", cfg->site.name);
		}
	}

	/* Deliver what peers still wait for, then stop the core (it fails the
	 * steps it holds, which the backend reports to their ranks), then the
	 * backend. */
	gg_log(GG_LOG_INFO, "stopping", "site=%s", cfg->site.name);
	uint64_t until = gg_monotonic_us() + DRAIN_US;
	while (status == GG_EXIT_OK && !gg_node_flushed(d.node) && gg_monotonic_us() < until)
		if (turn(&d, 20000))
			break;
	gg_node_shutdown(d.node);
	until = gg_monotonic_us() + STOP_US;
	bool stopped = false;
	while (gg_monotonic_us() < until) {
		stopped = d.backend->ops->stop(d.backend) && gg_node_idle(d.node);
		if (stopped || turn(&d, 20000))
			break;
	}
	if (stopped)
		d.backend->ops->destroy(d.backend);
	else
		gg_log(GG_LOG_WARN, "stop_incomplete", "site=%s reason=\"operations still in flight\"", cfg->site.name);
	const struct gg_node_stats *st = gg_node_stats(d.node);
	gg_log(GG_LOG_INFO, "stopped",
	       "site=%s steps_done=%llu steps_failed=%llu raw_bytes_out=%llu wire_bytes_out=%llu resent_messages=%llu "
	       "encode_s=%.3f decode_s=%.3f tls_s=%.3f uptime_s=%.3f",
	       cfg->site.name, (unsigned long long)st->steps_done, (unsigned long long)st->steps_failed,
	       (unsigned long long)st->raw_bytes_out, (unsigned long long)st->data_bytes_out,
	       (unsigned long long)st->resent_messages, st->encode_s, st->decode_s, st->tls_s,
	       (double)(gg_monotonic_us() - started_us) / 1e6);
	gg_node_free(d.node);
	return status;
}
