#include "daemon.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/eventfd.h>

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

/* With threads = 2 the site backend and the peer mesh each run their
 * own thread and io_uring loop, and steps cross between them through two
 * mailboxes: a lock-protected queue, and an eventfd whose read the
 * receiving loop keeps armed. With threads = 1 both share one loop and
 * steps are handed over by plain calls. */
struct mailbox {
	pthread_mutex_t lock;
	struct pending *head, *tail;
	int efd;
	uint64_t sink; /* the armed read's target */
};

/* A backend step on its way through the node. */
struct pending {
	struct pending *next;
	struct daemon *d;
	struct gg_node_step ns;
	struct gg_site_step *ss;
	int status;                          /* when done: 0 or an enum gg_errc code */
	char message[GG_NODE_ERROR_MAX + 64];
};

struct daemon {
	const struct gg_config *cfg;
	struct gg_node *node;
	struct gg_host_backend *host;
	struct gg_site_backend *backend;
	bool threaded;
	/* threaded only */
	struct gg_loop backend_loop;
	struct mailbox to_core, to_backend;
	pthread_t core_thread;
	atomic_bool core_stop, core_reload, core_done;
	pthread_mutex_t start_lock; /* the node's start-up, made on its thread */
	pthread_cond_t started;
	int start_rc;               /* 1 while starting; then 0 or a negative errno */
	char start_err[GG_NODE_ERROR_MAX];
	struct gg_node_stats final_stats; /* the node's, as it stopped */
};

/* user_data kinds of the mailbox reads; the host backend's kinds start at
 * GG_OP_USER and never reach these. */
#define KIND_CORE_MAIL (GG_OP_USER + 16)
#define KIND_BACKEND_MAIL (GG_OP_USER + 17)

static int mailbox_init(struct mailbox *m)
{
	memset(m, 0, sizeof(*m));
	m->efd = eventfd(0, EFD_CLOEXEC);
	if (m->efd < 0)
		return -errno;
	pthread_mutex_init(&m->lock, NULL);
	return 0;
}

static void mailbox_fini(struct mailbox *m)
{
	if (m->efd >= 0) {
		close(m->efd);
		pthread_mutex_destroy(&m->lock);
	}
	m->efd = -1;
}

static int mailbox_arm(struct mailbox *m, struct gg_loop *loop, unsigned kind)
{
	return gg_loop_read(loop, m->efd, &m->sink, sizeof(m->sink), gg_loop_ud(kind, 0, 0));
}

/* Wakes the owner's loop (to look at its flags, or its queue). */
static void mailbox_wake(struct mailbox *m)
{
	uint64_t one = 1;

	/* Cannot fail short of a counter at 2^64 - 1: every read drains it. */
	if (write(m->efd, &one, sizeof(one)) != sizeof(one))
		gg_log(GG_LOG_ERROR, "wakeup_failed", "reason=\"%s\"", strerror(errno));
}

static void mailbox_post(struct mailbox *m, struct pending *p)
{
	p->next = NULL;
	pthread_mutex_lock(&m->lock);
	if (m->tail)
		m->tail->next = p;
	else
		m->head = p;
	m->tail = p;
	pthread_mutex_unlock(&m->lock);
	mailbox_wake(m);
}

/* Everything posted so far, oldest first. */
static struct pending *mailbox_take(struct mailbox *m)
{
	pthread_mutex_lock(&m->lock);
	struct pending *p = m->head;
	m->head = m->tail = NULL;
	pthread_mutex_unlock(&m->lock);
	return p;
}

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

/* The step is over in the core: back to the backend, on its thread. */
static void finish(struct pending *p, int status, const char *message)
{
	if (!p->d->threaded) {
		gg_site_step_complete(p->ss, status, message);
		free(p);
		return;
	}
	p->status = status;
	snprintf(p->message, sizeof(p->message), "%s", message ? message : "");
	mailbox_post(&p->d->to_backend, p);
}

static void step_done(void *arg, struct gg_node_step *ns, int status, const char *message)
{
	(void)ns;
	finish(arg, status ? to_errc(status) : 0, message);
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
	if (d->threaded)
		mailbox_post(&d->to_core, p);
	else
		core_start(d, p);
	return 0;
}

static const struct gg_core_ops core_ops = { core_submit };

static void backend_log(void *arg, const char *line)
{
	(void)arg;
	gg_log(GG_LOG_INFO, "control", "msg=\"%s\"", line);
}

static void log_mesh(struct daemon *d, bool *connected)
{
	if (*connected != gg_node_connected(d->node)) {
		*connected = !*connected;
		gg_log(*connected ? GG_LOG_INFO : GG_LOG_WARN, *connected ? "mesh_up" : "mesh_degraded", "site=%s",
		       d->cfg->site.name);
	}
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
static int main_turn(struct daemon *d, uint64_t max_wait_us);

/* Stops the backend once the node is down: turns the loop until nothing is
 * in flight (STOP_US at most), failing steps handed over after the node's
 * thread had stopped, and destroys it. */
static void stop_backend(struct daemon *d)
{
	uint64_t until = gg_monotonic_us() + STOP_US;
	bool stopped = false;

	while (gg_monotonic_us() < until) {
		for (struct pending *p = d->threaded ? mailbox_take(&d->to_core) : NULL, *next; p; p = next) {
			next = p->next;
			gg_site_step_complete(p->ss, GG_ERR_CLOSED, "the gateway is shutting down");
			free(p);
		}
		stopped = d->backend->ops->stop(d->backend) && (d->threaded || gg_node_idle(d->node));
		if (stopped || (d->threaded ? main_turn(d, 20000) : turn(d, 20000)))
			break;
	}
	if (stopped)
		d->backend->ops->destroy(d->backend);
	else
		gg_log(GG_LOG_WARN, "stop_incomplete", "site=%s reason=\"operations still in flight\"", d->cfg->site.name);
}

/* ---- threads = 1: one loop carries the backend and the node ------------- */

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

static int run_single(struct daemon *d)
{
	int status = GG_EXIT_OK;
	bool connected = false;

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
		log_mesh(d, &connected);
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
	return status;
}

/* ---- threads = 2: the node on a thread of its own ----------------------- */

static void core_cqe(void *arg, const struct io_uring_cqe *cqe)
{
	struct daemon *d = arg;

	if (gg_loop_ud_kind(cqe->user_data) != KIND_CORE_MAIL)
		return;
	for (struct pending *p = mailbox_take(&d->to_core), *next; p; p = next) {
		next = p->next;
		core_start(d, p);
	}
	if (mailbox_arm(&d->to_core, gg_node_loop(d->node), KIND_CORE_MAIL))
		atomic_store(&d->core_stop, true); /* the ring is broken: the loop's next run says so */
}

/* The node's thread: runs the mesh until told to stop, then drains and
 * closes it, failing the steps it holds (they go back to the backend). */
static void *core_main(void *arg)
{
	struct daemon *d = arg;
	int status = GG_EXIT_OK;
	bool connected = false;
	sigset_t all;

	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL); /* signals are the main thread's */
	/* The node's ring accepts submissions from the thread that made it
	 * only: it is made here. */
	int rc = gg_node_new(d->cfg, &d->node, d->start_err, sizeof(d->start_err));
	if (!rc && (rc = mailbox_arm(&d->to_core, gg_node_loop(d->node), KIND_CORE_MAIL)))
		snprintf(d->start_err, sizeof(d->start_err), "cannot arm the mesh thread's mailbox: %s", strerror(-rc));
	pthread_mutex_lock(&d->start_lock);
	d->start_rc = rc;
	pthread_cond_signal(&d->started);
	pthread_mutex_unlock(&d->start_lock);
	if (rc) {
		gg_node_free(d->node);
		d->node = NULL;
		return (void *)(intptr_t)GG_EXIT_STARTUP;
	}
	while (status == GG_EXIT_OK && !atomic_load(&d->core_stop)) {
		if (gg_node_run_once(d->node, 100000, core_cqe, d)) {
			gg_log(GG_LOG_ERROR, "loop_failed", "site=%s", d->cfg->site.name);
			status = GG_EXIT_RUNTIME;
			break;
		}
		if (atomic_exchange(&d->core_reload, false))
			reload(d);
		log_mesh(d, &connected);
	}
	gg_node_stop_steps(d->node);
	uint64_t until = gg_monotonic_us() + DRAIN_US;
	while (status == GG_EXIT_OK && !gg_node_flushed(d->node) && gg_monotonic_us() < until)
		if (gg_node_run_once(d->node, 20000, core_cqe, d))
			break;
	gg_node_shutdown(d->node);
	until = gg_monotonic_us() + STOP_US;
	while (!gg_node_idle(d->node) && gg_monotonic_us() < until)
		if (gg_node_run_once(d->node, 20000, core_cqe, d))
			break;
	d->final_stats = *gg_node_stats(d->node);
	gg_node_free(d->node);
	d->node = NULL;
	atomic_store(&d->core_done, true);
	mailbox_wake(&d->to_backend);
	return (void *)(intptr_t)status;
}

/* Completions back from the node, and the backend's own. */
static void main_cqe(void *arg, const struct io_uring_cqe *cqe)
{
	struct daemon *d = arg;

	if (gg_loop_ud_kind(cqe->user_data) != KIND_BACKEND_MAIL) {
		d->backend->ops->on_cqe(d->backend, cqe);
		return;
	}
	for (struct pending *p = mailbox_take(&d->to_backend), *next; p; p = next) {
		next = p->next;
		gg_site_step_complete(p->ss, p->status, p->message[0] ? p->message : NULL);
		free(p);
	}
	if (mailbox_arm(&d->to_backend, &d->backend_loop, KIND_BACKEND_MAIL))
		gg_log(GG_LOG_ERROR, "loop_failed", "site=%s what=backend", d->cfg->site.name);
}

static int main_turn(struct daemon *d, uint64_t max_wait_us)
{
	struct gg_loop *loop = &d->backend_loop;
	uint64_t next = d->backend->ops->tick(d->backend, loop->now_us);
	uint64_t wait = GG_MIN(max_wait_us, next ? gg_loop_timeout_us(loop, next) : max_wait_us);
	int rc = gg_loop_run(loop, wait, main_cqe, d);

	return rc < 0 ? rc : 0;
}

static int run_threaded(struct daemon *d)
{
	int status = GG_EXIT_OK;
	void *core_status = NULL;

	while (!got_stop && !atomic_load(&d->core_done)) {
		if (main_turn(d, 100000)) {
			gg_log(GG_LOG_ERROR, "loop_failed", "site=%s what=backend", d->cfg->site.name);
			status = GG_EXIT_RUNTIME;
			break;
		}
		if (got_hup) {
			got_hup = 0;
			atomic_store(&d->core_reload, true);
			mailbox_wake(&d->to_core);
		}
	}

	/* The node drains, closes and fails what it holds; the backend keeps
	 * serving meanwhile so those failures reach the ranks. */
	gg_log(GG_LOG_INFO, "stopping", "site=%s", d->cfg->site.name);
	atomic_store(&d->core_stop, true);
	mailbox_wake(&d->to_core);
	while (status == GG_EXIT_OK && !atomic_load(&d->core_done))
		if (main_turn(d, 20000))
			status = GG_EXIT_RUNTIME;
	pthread_join(d->core_thread, &core_status);
	if (status == GG_EXIT_OK)
		status = (int)(intptr_t)core_status;
	stop_backend(d);
	return status;
}

/* Starts the node's thread, which makes the node, and waits for it to be
 * up. Returns 0, or a negative errno with d->start_err set. */
static int start_core_thread(struct daemon *d)
{
	int rc = mailbox_init(&d->to_core);
	if (!rc)
		rc = mailbox_init(&d->to_backend);
	if (!rc)
		rc = gg_loop_init(&d->backend_loop, 256);
	if (!rc)
		rc = mailbox_arm(&d->to_backend, &d->backend_loop, KIND_BACKEND_MAIL);
	if (rc) {
		snprintf(d->start_err, sizeof(d->start_err), "cannot set up the backend's loop: %s", strerror(-rc));
		return rc;
	}
	pthread_mutex_init(&d->start_lock, NULL);
	pthread_cond_init(&d->started, NULL);
	d->start_rc = 1;
	if ((rc = -pthread_create(&d->core_thread, NULL, core_main, d))) {
		snprintf(d->start_err, sizeof(d->start_err), "cannot start the mesh thread: %s", strerror(-rc));
		return rc;
	}
	pthread_mutex_lock(&d->start_lock);
	while (d->start_rc == 1)
		pthread_cond_wait(&d->started, &d->start_lock);
	rc = d->start_rc;
	pthread_mutex_unlock(&d->start_lock);
	if (rc)
		pthread_join(d->core_thread, NULL);
	return rc;
}

/* Tells the node's thread to stop (when it runs) and waits for it. */
static void stop_core_thread(struct daemon *d)
{
	atomic_store(&d->core_stop, true);
	mailbox_wake(&d->to_core);
	pthread_join(d->core_thread, NULL);
}

int gg_daemon_run(const struct gg_config *cfg)
{
	struct daemon d = { .cfg = cfg, .threaded = cfg->site.threads >= 2 };
	struct gg_host_backend_options hopts;
	char err[GG_NODE_ERROR_MAX];
	int status = GG_EXIT_OK;
	bool core_running = false;

	struct sigaction sa = { .sa_handler = on_signal };
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	d.to_core.efd = d.to_backend.efd = -1;

	int rc = d.threaded ? start_core_thread(&d) : gg_node_new(cfg, &d.node, d.start_err, sizeof(d.start_err));
	if (rc) {
		gg_log(GG_LOG_ERROR, "startup_failed", "site=%s reason=\"%s\"", cfg->site.name, d.start_err);
		status = GG_EXIT_STARTUP;
		goto out;
	}
	core_running = d.threaded;
	gg_host_backend_options_from_config(cfg, &hopts);
	hopts.log = backend_log;
	if (gg_host_backend_create(&hopts, &core_ops, &d, &d.host, err, sizeof(err))) {
		gg_log(GG_LOG_ERROR, "startup_failed", "site=%s reason=\"%s\"", cfg->site.name, err);
		status = GG_EXIT_STARTUP;
		goto out;
	}
	d.backend = gg_host_backend_base(d.host);
	if (d.backend->ops->start(d.backend, d.threaded ? &d.backend_loop : gg_node_loop(d.node), err, sizeof(err))) {
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
	       d.threaded ? 2 : 1);

	uint64_t started_us = gg_monotonic_us();
	if (d.threaded) {
		status = run_threaded(&d);
		core_running = false;
	} else {
		status = run_single(&d);
		d.final_stats = *gg_node_stats(d.node);
	}
	const struct gg_node_stats *st = &d.final_stats;
	gg_log(GG_LOG_INFO, "stopped",
	       "site=%s steps_done=%llu steps_failed=%llu raw_bytes_out=%llu wire_bytes_out=%llu resent_messages=%llu "
	       "encode_s=%.3f decode_s=%.3f tls_s=%.3f uptime_s=%.3f",
	       cfg->site.name, (unsigned long long)st->steps_done, (unsigned long long)st->steps_failed,
	       (unsigned long long)st->raw_bytes_out, (unsigned long long)st->data_bytes_out,
	       (unsigned long long)st->resent_messages, st->encode_s, st->decode_s, st->tls_s,
	       (double)(gg_monotonic_us() - started_us) / 1e6);
out:
	if (core_running)
		stop_core_thread(&d);
	gg_node_free(d.node);
	if (d.threaded && d.backend_loop.ring.ring_fd > 0)
		gg_loop_fini(&d.backend_loop);
	mailbox_fini(&d.to_core);
	mailbox_fini(&d.to_backend);
	return status;
}
