/* gradgate-bench transport: what TLS costs on the gateway's transport.
 *
 * A sender streams data for a fixed time and a receiver counts it, per
 * mode (each TLS 1.3 ciphersuite, and with --plain an unencrypted
 * baseline); then one connection runs 64 KiB round trips. Both ends use
 * the gateway's own stack: gateway/uring_loop + gateway/tls_stream over
 * crypto/tls_engine, one io_uring and one thread per connection and side.
 *
 * Wire protocol, inside TLS or on a plain connection: the client sends a
 * 32-byte hello ("GGBENCH2", kind, round-trip size). Stream: the client
 * sends data, then close_notify (plain: FIN); the server answers with its
 * byte count and CPU time and closes. Echo: the server returns every
 * round-trip message. A plain connection is recognised by its first byte
 * (a TLS connection starts with a handshake record, 0x16) and accepted
 * only by a server started with --allow-plain, which answers its hello
 * with "GGPLAIN1": the client sends no data unencrypted before that. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "identity.h"
#include "net_addr.h"
#include "tls_context.h"
#include "tls_pki.h"
#include "tls_stream.h"
#include "units.h"

#define HELLO_MAGIC "GGBENCH2" /* 2: a plain hello is answered (PLAIN_ACK) */
#define HELLO_BYTES 32
#define PLAIN_ACK "GGPLAIN1" /* 8 bytes */
#define RESULT_BYTES 24
#define KIND_STREAM 1u
#define KIND_ECHO 2u
#define TLS_RECORD_TYPE_HANDSHAKE 0x16
#define IO_TIMEOUT_US 20000000u
#define MAX_STREAMS 32
#define MAX_MODES 8
#define MAX_SERVER_CONNS 128
#define RTT_WARMUP 20
#define PACED_WRITE_BYTES (64u << 10)
#define DEFAULT_SERVER_IDENTITY "dns:bench-server.gradgate.test"
#define DEFAULT_CLIENT_IDENTITY "dns:bench-client.gradgate.test"

struct options {
	bool serve, json, plain, allow_plain;
	const char *connect;
	const char *listen;
	const char *modes;
	double seconds;
	int streams;
	int rtt_count;
	uint64_t rtt_bytes;
	uint64_t write_bytes;
	uint64_t ring_bytes;
	uint64_t rate_bps;
	uint64_t socket_buffer_bytes;
	const char *ca, *cert, *key, *peer_identity;
};

struct mode {
	const char *name; /* "plain" or the IANA ciphersuite name */
	bool plain;
};

/* Credentials: files, or a throwaway CA and two certificates made here. */
struct creds {
	char *ca_pem, *server_cert_pem, *server_key_pem, *client_cert_pem, *client_key_pem;
	struct gg_tls_options server, client;
	struct gg_tls_site server_site; /* what a client expects of the server */
	struct gg_tls_site client_site; /* what the server admits */
	struct gg_tls_context *server_ctx;
};

struct server {
	const struct options *opt;
	struct creds *creds;
	int listen_fd;
	atomic_bool stop;
	bool accept_armed; /* acceptor thread only */
	pthread_t acceptor;
	pthread_mutex_t lock;
	pthread_cond_t idle;
	int live_workers; /* detached, one per connection */
};

/* One connection and the loop of the thread that drives it, in the
 * blocking style a benchmark thread wants: each call runs the loop until
 * it can return. */
struct conn {
	struct gg_loop loop;
	const struct options *opt;
	bool tls;
	struct gg_tls_stream stream;
	unsigned events;
	/* plain */
	int fd;
	bool op_done;
	int op_res;
	uint64_t plain_out_bytes;
	char error[GG_TLS_ERROR_MAX];
};

static uint64_t now_ns(clockid_t clock)
{
	struct timespec ts;

	clock_gettime(clock, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 0; i < 8; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

static void conn_on_cqe(void *arg, const struct io_uring_cqe *cqe)
{
	struct conn *c = arg;

	if (c->tls) {
		c->events |= gg_tls_stream_on_cqe(&c->stream, cqe);
		return;
	}
	c->op_done = true;
	c->op_res = cqe->res;
}

static int conn_init(struct conn *c, const struct options *opt)
{
	memset(c, 0, sizeof(*c));
	c->opt = opt;
	c->fd = -1;
	int rc = gg_loop_init(&c->loop, 64);
	if (rc)
		snprintf(c->error, sizeof(c->error), "cannot set up io_uring: %s", strerror(-rc));
	return rc;
}

/* Runs the loop once; a TLS failure lands in c->error. */
static int conn_pump(struct conn *c, uint64_t timeout_us)
{
	int rc = gg_loop_run(&c->loop, timeout_us, conn_on_cqe, c);

	if (rc < 0) {
		snprintf(c->error, sizeof(c->error), "io_uring failed: %s", strerror(-rc));
		return rc;
	}
	if (c->tls) {
		c->events |= gg_tls_stream_tick(&c->stream, c->loop.now_us);
		if ((c->events & GG_TLS_STREAM_EV_FAILED) && !c->error[0])
			snprintf(c->error, sizeof(c->error), "%s", gg_tls_stream_error(&c->stream));
	}
	return 0;
}

/* Waits for the one plain operation in flight. */
static int plain_wait(struct conn *c)
{
	uint64_t start = gg_monotonic_us();

	while (!c->op_done) {
		if (conn_pump(c, IO_TIMEOUT_US))
			return -EIO;
		if (gg_monotonic_us() - start > IO_TIMEOUT_US) {
			snprintf(c->error, sizeof(c->error), "no progress for %u s", IO_TIMEOUT_US / 1000000u);
			return -ETIMEDOUT;
		}
	}
	c->op_done = false;
	return c->op_res;
}

static int tls_wait(struct conn *c)
{
	uint64_t start = c->loop.now_us;

	c->events = 0;
	while (!c->events) {
		if (conn_pump(c, GG_MIN(gg_loop_timeout_us(&c->loop, gg_tls_stream_deadline_us(&c->stream)),
					(uint64_t)IO_TIMEOUT_US)))
			return -EIO;
		if (c->events & GG_TLS_STREAM_EV_FAILED)
			return c->stream.error ? c->stream.error : -EPROTO;
		if (c->loop.now_us - start > IO_TIMEOUT_US) {
			snprintf(c->error, sizeof(c->error), "no progress for %u s", IO_TIMEOUT_US / 1000000u);
			return -ETIMEDOUT;
		}
	}
	return 0;
}

static struct gg_tls_stream_options stream_options(const struct options *opt)
{
	return (struct gg_tls_stream_options){
		.socket_buffer_bytes = (int)opt->socket_buffer_bytes,
	};
}

static int tls_open(struct conn *c)
{
	while (c->stream.state < GG_TLS_STREAM_OPEN) {
		int rc = tls_wait(c);
		if (rc)
			return rc;
	}
	if (c->stream.state != GG_TLS_STREAM_OPEN) {
		if (!c->error[0])
			snprintf(c->error, sizeof(c->error), "%s", gg_tls_stream_error(&c->stream));
		return -EPROTO;
	}
	return 0;
}

static int conn_connect(struct conn *c, const struct sockaddr *sa, socklen_t len, const char *addr_text,
			struct gg_tls_context *ctx, const struct gg_tls_site *server_site)
{
	int rc;

	if (!ctx) {
		c->fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (c->fd < 0 || (rc = gg_net_tune(c->fd, (int)c->opt->socket_buffer_bytes, NULL)) ||
		    (rc = gg_loop_connect(&c->loop, c->fd, sa, len, gg_loop_ud(GG_OP_CONNECT, 0, 0))) ||
		    (rc = plain_wait(c)) < 0) {
			rc = c->fd < 0 ? -errno : rc;
			if (!c->error[0])
				snprintf(c->error, sizeof(c->error), "peer %s: connect failed: %s", addr_text, strerror(-rc));
			return rc;
		}
		return 0;
	}
	struct gg_tls_engine *e;
	struct gg_tls_engine_config cfg = {
		.role = GG_TLS_CLIENT, .peer_addr = addr_text, .sites = server_site, .site_count = 1,
		.rx_ring_bytes = c->opt->ring_bytes, .tx_ring_bytes = c->opt->ring_bytes,
	};
	struct gg_tls_stream_options so = stream_options(c->opt);
	if ((rc = gg_tls_engine_new(ctx, &cfg, &e))) {
		snprintf(c->error, sizeof(c->error), "cannot create a TLS engine: %s", strerror(-rc));
		return rc;
	}
	c->tls = true;
	if (gg_tls_stream_connect(&c->stream, &c->loop, 0, sa, len, e, &so)) {
		snprintf(c->error, sizeof(c->error), "%s", gg_tls_stream_error(&c->stream));
		return -EIO;
	}
	return tls_open(c);
}

static int conn_write(struct conn *c, const uint8_t *buf, size_t len)
{
	size_t off = 0;

	while (off < len) {
		if (!c->tls) {
			int rc = gg_loop_send(&c->loop, c->fd, buf + off, len - off, gg_loop_ud(GG_OP_SEND, 0, 0));
			if (!rc)
				rc = plain_wait(c);
			if (rc <= 0) {
				if (!c->error[0])
					snprintf(c->error, sizeof(c->error), "send failed: %s%s", strerror(rc ? -rc : EPIPE),
						 rc == -ECONNRESET || rc == -EPIPE || !rc
							 ? " (a server started without --allow-plain closes plain "
							   "connections; its log says so)"
							 : "");
				return rc ? rc : -EPIPE;
			}
			off += (size_t)rc;
			c->plain_out_bytes += (uint64_t)rc;
			continue;
		}
		ssize_t n = gg_tls_stream_write(&c->stream, buf + off, len - off);
		if (n > 0) {
			off += (size_t)n;
			continue;
		}
		if (n != -EAGAIN) {
			snprintf(c->error, sizeof(c->error), "%s", gg_tls_stream_error(&c->stream));
			return (int)n;
		}
		int rc = tls_wait(c);
		if (rc)
			return rc;
	}
	return 0;
}

/* Bytes, 0 at the peer's clean end, or a negative errno. */
static ssize_t conn_read(struct conn *c, uint8_t *buf, size_t len)
{
	if (!c->tls) {
		int rc = gg_loop_recv(&c->loop, c->fd, buf, len, 0, gg_loop_ud(GG_OP_RECV, 0, 0));
		if (!rc)
			rc = plain_wait(c);
		if (rc < 0 && !c->error[0])
			snprintf(c->error, sizeof(c->error), "recv failed: %s", strerror(-rc));
		return rc;
	}
	for (;;) {
		ssize_t n = gg_tls_stream_read(&c->stream, buf, len);
		if (n != -EAGAIN) {
			if (n < 0 && !c->error[0])
				snprintf(c->error, sizeof(c->error), "%s", gg_tls_stream_error(&c->stream));
			return n;
		}
		int rc = tls_wait(c);
		if (rc)
			return rc;
	}
}

/* 0 with len bytes read; -ENODATA when the peer ended cleanly before the
 * first byte (a message boundary); else a negative errno. */
static int conn_read_full(struct conn *c, uint8_t *buf, size_t len)
{
	for (size_t off = 0; off < len;) {
		ssize_t n = conn_read(c, buf + off, len - off);
		if (n == 0 && off == 0)
			return -ENODATA;
		if (n <= 0) {
			if (n == 0)
				snprintf(c->error, sizeof(c->error), "the peer closed the connection inside a message");
			return n ? (int)n : -ECONNRESET;
		}
		off += (size_t)n;
	}
	return 0;
}

/* close_notify (plain: FIN) once everything before it is sent. */
static int conn_shutdown(struct conn *c)
{
	if (!c->tls)
		return shutdown(c->fd, SHUT_WR) ? -errno : 0;
	for (;;) {
		int rc = gg_tls_stream_shutdown(&c->stream);
		if (rc != -EAGAIN)
			return rc;
		if ((rc = tls_wait(c)))
			return rc;
	}
}

static void conn_close(struct conn *c)
{
	if (c->tls) {
		c->events = gg_tls_stream_close(&c->stream);
		while (c->stream.state != GG_TLS_STREAM_DONE && !conn_pump(c, 100000))
			;
	} else if (c->fd >= 0) {
		close(c->fd);
		c->fd = -1;
	}
	gg_loop_fini(&c->loop);
}

static void fill_pattern(uint8_t *buf, size_t len)
{
	uint64_t x = 0x9e3779b97f4a7c15u;

	for (size_t i = 0; i < len; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		buf[i] = (uint8_t)x;
	}
}

/* ---- server ---- */

struct worker_job {
	struct server *srv;
	int fd;
};

static void serve_stream(struct conn *c, uint8_t *buf, size_t size)
{
	uint64_t bytes = 0, cpu0 = now_ns(CLOCK_THREAD_CPUTIME_ID), t0 = now_ns(CLOCK_MONOTONIC);
	uint8_t result[RESULT_BYTES];
	ssize_t n;

	while ((n = conn_read(c, buf, size)) > 0)
		bytes += (uint64_t)n;
	if (n < 0)
		return;
	put64(result, bytes);
	put64(result + 8, now_ns(CLOCK_THREAD_CPUTIME_ID) - cpu0);
	put64(result + 16, now_ns(CLOCK_MONOTONIC) - t0);
	if (conn_write(c, result, sizeof(result)) == 0)
		(void)conn_shutdown(c);
}

static void serve_echo(struct conn *c, uint8_t *buf, uint64_t msg_bytes)
{
	while (conn_read_full(c, buf, msg_bytes) == 0)
		if (conn_write(c, buf, msg_bytes))
			return;
	(void)conn_shutdown(c);
}

static void *server_worker(void *arg)
{
	struct worker_job *job = arg;
	struct server *srv = job->srv;
	const struct options *opt = srv->opt;
	char addr[GG_NET_ADDR_TEXT_MAX];
	uint8_t hello[HELLO_BYTES], first = 0;
	size_t size = GG_MAX(opt->write_bytes, opt->rtt_bytes);
	uint8_t *buf = NULL;
	struct conn c;
	int fd = job->fd, rc;

	free(job);
	gg_net_peer_addr(fd, addr, sizeof(addr));
	if (conn_init(&c, opt)) {
		close(fd);
		return NULL;
	}
	c.fd = fd;
	/* A TLS client speaks first with a handshake record. */
	rc = gg_loop_recv(&c.loop, fd, &first, 1, MSG_PEEK, gg_loop_ud(GG_OP_RECV, 0, 0));
	if (!rc)
		rc = plain_wait(&c);
	if (rc <= 0)
		goto out;
	if (first == TLS_RECORD_TYPE_HANDSHAKE) {
		struct gg_tls_engine *e;
		struct gg_tls_engine_config cfg = {
			.role = GG_TLS_SERVER, .peer_addr = addr, .sites = &srv->creds->client_site, .site_count = 1,
			.rx_ring_bytes = opt->ring_bytes, .tx_ring_bytes = opt->ring_bytes,
		};
		struct gg_tls_stream_options so = stream_options(opt);
		if (gg_tls_engine_new(srv->creds->server_ctx, &cfg, &e))
			goto out;
		c.tls = true;
		c.fd = -1;
		gg_tls_stream_accept(&c.stream, &c.loop, 0, fd, e, &so);
		if (tls_open(&c)) {
			fprintf(stderr, "gradgate-bench transport: refused: %s\n", c.error);
			c.error[0] = '\0';
			goto out;
		}
	} else if (!opt->allow_plain) {
		fprintf(stderr, "gradgate-bench transport: refused an unencrypted connection from %s "
				"(start the server with --allow-plain to measure plain mode)\n", addr);
		goto out;
	}
	if (!(buf = malloc(size)) || conn_read_full(&c, hello, sizeof(hello)) || memcmp(hello, HELLO_MAGIC, 8) ||
	    (!c.tls && conn_write(&c, (const uint8_t *)PLAIN_ACK, 8)))
		goto out;
	if (get64(hello + 8) == KIND_STREAM)
		serve_stream(&c, buf, size);
	else if (get64(hello + 8) == KIND_ECHO && get64(hello + 16) && get64(hello + 16) <= size)
		serve_echo(&c, buf, get64(hello + 16));
	/* Wait for the client to finish reading and close. */
	while (conn_read(&c, hello, sizeof(hello)) > 0)
		;
out:
	if (c.error[0])
		fprintf(stderr, "gradgate-bench transport: connection from %s: %s\n", addr, c.error);
	conn_close(&c);
	free(buf);
	pthread_mutex_lock(&srv->lock);
	if (--srv->live_workers == 0)
		pthread_cond_broadcast(&srv->idle);
	pthread_mutex_unlock(&srv->lock);
	return NULL;
}

static void on_accept(void *arg, const struct io_uring_cqe *cqe)
{
	struct server *srv = arg;
	struct worker_job *job;

	if (gg_loop_ud_kind(cqe->user_data) != GG_OP_ACCEPT)
		return;
	if (!(cqe->flags & IORING_CQE_F_MORE))
		srv->accept_armed = false;
	if (cqe->res < 0) {
		if (cqe->res != -ECANCELED)
			fprintf(stderr, "gradgate-bench transport: accept failed: %s\n", strerror(-cqe->res));
		return;
	}
	pthread_mutex_lock(&srv->lock);
	if (srv->live_workers == MAX_SERVER_CONNS || !(job = malloc(sizeof(*job)))) {
		pthread_mutex_unlock(&srv->lock);
		fprintf(stderr, "gradgate-bench transport: dropped a connection: %d open already\n", MAX_SERVER_CONNS);
		close(cqe->res);
		return;
	}
	*job = (struct worker_job){ srv, cqe->res };
	pthread_t t;
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&t, &attr, server_worker, job)) {
		close(job->fd);
		free(job);
	} else {
		srv->live_workers++;
	}
	pthread_attr_destroy(&attr);
	pthread_mutex_unlock(&srv->lock);
}

static void *acceptor_main(void *arg)
{
	struct server *srv = arg;
	struct gg_loop loop;

	if (gg_loop_init(&loop, 64))
		return NULL;
	while (!atomic_load(&srv->stop)) {
		if (!srv->accept_armed && gg_loop_accept(&loop, srv->listen_fd, gg_loop_ud(GG_OP_ACCEPT, 0, 0)) == 0)
			srv->accept_armed = true;
		if (gg_loop_run(&loop, 50000, on_accept, srv) < 0)
			break;
	}
	gg_loop_fini(&loop);
	return NULL;
}

static int server_start(struct server *srv, const struct options *opt, struct creds *creds, const char *listen_addr)
{
	struct sockaddr_storage ss;
	socklen_t len;
	const char *why;

	memset(srv, 0, sizeof(*srv));
	srv->opt = opt;
	srv->creds = creds;
	pthread_mutex_init(&srv->lock, NULL);
	pthread_cond_init(&srv->idle, NULL);
	if (gg_net_addr_parse(listen_addr, &ss, &len, &why)) {
		fprintf(stderr, "gradgate-bench transport: --listen %s: %s\n", listen_addr, why);
		return -EINVAL;
	}
	srv->listen_fd = gg_net_listen((struct sockaddr *)&ss, len, 128, (int)opt->socket_buffer_bytes);
	if (srv->listen_fd < 0) {
		fprintf(stderr, "gradgate-bench transport: cannot listen on %s: %s\n", listen_addr, strerror(-srv->listen_fd));
		return srv->listen_fd;
	}
	if (pthread_create(&srv->acceptor, NULL, acceptor_main, srv)) {
		close(srv->listen_fd);
		return -EAGAIN;
	}
	return 0;
}

static void server_stop(struct server *srv)
{
	atomic_store(&srv->stop, true);
	pthread_join(srv->acceptor, NULL);
	close(srv->listen_fd);
	pthread_mutex_lock(&srv->lock);
	while (srv->live_workers)
		pthread_cond_wait(&srv->idle, &srv->lock);
	pthread_mutex_unlock(&srv->lock);
	pthread_cond_destroy(&srv->idle);
	pthread_mutex_destroy(&srv->lock);
}

/* ---- client ---- */

struct client_job {
	const struct options *opt;
	const struct sockaddr *addr;
	socklen_t addr_len;
	const char *addr_text;
	struct gg_tls_context *ctx; /* NULL: plain */
	const struct gg_tls_site *server_site;
	unsigned kind;
	uint64_t rate_bytes_per_s; /* wire bytes, this stream's share; 0: unpaced */
	pthread_barrier_t *barrier;

	uint64_t bytes, wall_ns, cpu_ns, peer_cpu_ns, peer_wall_ns;
	uint64_t *rtt_ns;
	size_t rtt_n;
	const char *cipher;
	int rc;
	char error[GG_TLS_ERROR_MAX];
};

static uint64_t wire_queued(const struct conn *c)
{
	if (!c->tls)
		return c->plain_out_bytes;
	return c->stream.wire_out_bytes + gg_tls_engine_tx_pending(c->stream.tls);
}

/* Token bucket on the bytes put on the wire: what a link of that rate
 * would let through, with one write of burst. */
static int pace(struct conn *c, uint64_t rate, uint64_t t0_ns, uint64_t burst)
{
	for (;;) {
		uint64_t elapsed = now_ns(CLOCK_MONOTONIC) - t0_ns;
		double allowed = (double)rate * (double)elapsed / 1e9 + (double)burst;
		double queued = (double)wire_queued(c);
		if (queued <= allowed)
			return 0;
		uint64_t wait_us = (uint64_t)((queued - allowed) * 1e6 / (double)rate) + 1;
		if (conn_pump(c, wait_us))
			return -EIO;
	}
}

static int run_stream(struct client_job *j, struct conn *c)
{
	size_t chunk = j->rate_bytes_per_s ? GG_MIN(j->opt->write_bytes, (uint64_t)PACED_WRITE_BYTES) : j->opt->write_bytes;
	uint8_t *buf = malloc(chunk), result[RESULT_BYTES];
	uint64_t deadline, t0, cpu0;
	int rc = -ENOMEM;

	if (!buf)
		return rc;
	fill_pattern(buf, chunk);
	pthread_barrier_wait(j->barrier);
	t0 = now_ns(CLOCK_MONOTONIC);
	cpu0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
	deadline = t0 + (uint64_t)(j->opt->seconds * 1e9);
	while (now_ns(CLOCK_MONOTONIC) < deadline) {
		if (j->rate_bytes_per_s && (rc = pace(c, j->rate_bytes_per_s, t0, chunk)))
			goto out;
		if ((rc = conn_write(c, buf, chunk)))
			goto out;
		j->bytes += chunk;
	}
	if ((rc = conn_shutdown(c)) || (rc = conn_read_full(c, result, sizeof(result)))) {
		if (rc == -ENODATA)
			snprintf(c->error, sizeof(c->error), "the server closed the connection without a result");
		goto out;
	}
	j->wall_ns = now_ns(CLOCK_MONOTONIC) - t0;
	j->cpu_ns = now_ns(CLOCK_THREAD_CPUTIME_ID) - cpu0;
	j->peer_cpu_ns = get64(result + 8);
	j->peer_wall_ns = get64(result + 16);
	if (get64(result) != j->bytes) {
		snprintf(c->error, sizeof(c->error), "the server counted %" PRIu64 " bytes of %" PRIu64, get64(result),
			 j->bytes);
		rc = -EIO;
	}
out:
	free(buf);
	return rc;
}

static int run_echo(struct client_job *j, struct conn *c)
{
	size_t msg = j->opt->rtt_bytes;
	uint8_t *out = malloc(msg), *in = malloc(msg);
	int rc = -ENOMEM;

	j->rtt_ns = calloc((size_t)j->opt->rtt_count, sizeof(*j->rtt_ns));
	if (!out || !in || !j->rtt_ns)
		goto out;
	fill_pattern(out, msg);
	for (int i = -RTT_WARMUP; i < j->opt->rtt_count; i++) {
		uint64_t t = now_ns(CLOCK_MONOTONIC);
		if ((rc = conn_write(c, out, msg)) || (rc = conn_read_full(c, in, msg))) {
			if (rc == -ENODATA)
				snprintf(c->error, sizeof(c->error), "the server closed the connection without an echo");
			goto out;
		}
		if (i >= 0)
			j->rtt_ns[j->rtt_n++] = now_ns(CLOCK_MONOTONIC) - t;
	}
	rc = memcmp(in, out, msg) ? -EIO : conn_shutdown(c);
	if (rc == -EIO)
		snprintf(c->error, sizeof(c->error), "the echo came back changed");
out:
	free(out);
	free(in);
	return rc;
}

/* Unencrypted benchmark data goes only to a server that said it takes it
 * (--allow-plain); one without closes the connection after the hello. */
static int plain_accepted(struct conn *c)
{
	uint8_t ack[8];
	char why[sizeof(c->error)];
	int rc = conn_read_full(c, ack, sizeof(ack));

	if (!rc && !memcmp(ack, PLAIN_ACK, sizeof(ack)))
		return 0;
	if (rc == -ENODATA || rc == -ECONNRESET) {
		snprintf(c->error, sizeof(c->error), "the server refused unencrypted transport (start it with "
			 "--allow-plain to measure plain mode)");
		return rc;
	}
	if (!rc) {
		snprintf(c->error, sizeof(c->error), "the server answered the plain hello with something else: not a "
			 "gradgate-bench transport receiver of this version");
		return -EPROTO;
	}
	snprintf(why, sizeof(why), "%s", c->error[0] ? c->error : strerror(-rc));
	snprintf(c->error, sizeof(c->error), "no answer to the plain hello: %.400s", why);
	return rc;
}

static void *client_main(void *arg)
{
	struct client_job *j = arg;
	uint8_t hello[HELLO_BYTES] = { 0 };
	struct conn c;

	if ((j->rc = conn_init(&c, j->opt))) {
		snprintf(j->error, sizeof(j->error), "%s", c.error);
		if (j->barrier)
			pthread_barrier_wait(j->barrier);
		return NULL;
	}
	memcpy(hello, HELLO_MAGIC, 8);
	put64(hello + 8, j->kind);
	put64(hello + 16, j->opt->rtt_bytes);
	j->rc = conn_connect(&c, j->addr, j->addr_len, j->addr_text, j->ctx, j->server_site);
	if (!j->rc)
		j->rc = conn_write(&c, hello, sizeof(hello));
	if (!j->rc && !c.tls)
		j->rc = plain_accepted(&c);
	if (!j->rc && c.tls)
		j->cipher = gg_tls_engine_cipher(c.stream.tls);
	if (j->rc) {
		if (j->barrier)
			pthread_barrier_wait(j->barrier);
	} else {
		j->rc = j->kind == KIND_STREAM ? run_stream(j, &c) : run_echo(j, &c);
	}
	if (!j->rc) {
		uint8_t rest[64];
		while (conn_read(&c, rest, sizeof(rest)) > 0)
			;
	}
	snprintf(j->error, sizeof(j->error), "%s", c.error);
	conn_close(&c);
	return NULL;
}

/* ---- measurement and report ---- */

struct cpu_sample {
	int n;
	uint64_t busy[64], total[64];
};

static void sample_cpus(struct cpu_sample *s)
{
	FILE *f = fopen("/proc/stat", "r");
	char line[512];

	s->n = 0;
	while (f && fgets(line, sizeof(line), f) && s->n < 64) {
		unsigned long long v[8] = { 0 };
		int cpu;
		if (strncmp(line, "cpu", 3) || line[3] < '0' || line[3] > '9' ||
		    sscanf(line, "cpu%d %llu %llu %llu %llu %llu %llu %llu %llu", &cpu, &v[0], &v[1], &v[2], &v[3],
			   &v[4], &v[5], &v[6], &v[7]) < 5)
			continue;
		uint64_t total = 0;
		for (int i = 0; i < 8; i++)
			total += v[i];
		s->busy[s->n] = total - v[3] - v[4];
		s->total[s->n] = total;
		s->n++;
	}
	if (f)
		fclose(f);
}

struct result {
	const char *mode;
	bool plain;
	double gbps, cpu_send, cpu_recv, p50_us, p99_us, ratio;
	bool has_ratio;
	int cores;
	double core_busy[64];
	uint64_t bytes;
};

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static double percentile_us(uint64_t *v, size_t n, double p)
{
	if (!n)
		return NAN;
	size_t i = (size_t)ceil(p * (double)n) - 1;
	return (double)v[GG_MIN(i, n - 1)] / 1000.0;
}

static int run_mode(const struct options *opt, const struct mode *m, struct creds *creds, const struct sockaddr *addr,
		    socklen_t addr_len, const char *addr_text, struct result *r)
{
	struct client_job jobs[MAX_STREAMS], echo;
	pthread_t threads[MAX_STREAMS];
	pthread_barrier_t barrier;
	struct gg_tls_context *ctx = NULL;
	struct cpu_sample before, after;
	char err[512];
	int rc = 0;

	memset(r, 0, sizeof(*r));
	r->mode = m->name;
	r->plain = m->plain;
	r->p50_us = r->p99_us = NAN; /* no round trips (--rtt-count 0): none measured */
	if (!m->plain) {
		struct gg_tls_options o = creds->client;
		o.ciphersuites = m->name;
		if (gg_tls_context_new(&o, &ctx, err, sizeof(err))) {
			fprintf(stderr, "gradgate-bench transport: %s: %s\n", m->name, err);
			return -EINVAL;
		}
	}
	pthread_barrier_init(&barrier, NULL, (unsigned)opt->streams + 1);
	for (int i = 0; i < opt->streams; i++) {
		jobs[i] = (struct client_job){
			.opt = opt, .addr = addr, .addr_len = addr_len, .addr_text = addr_text, .ctx = ctx,
			.server_site = &creds->server_site, .kind = KIND_STREAM, .barrier = &barrier,
			.rate_bytes_per_s = opt->rate_bps / 8 / (uint64_t)opt->streams,
		};
		if (pthread_create(&threads[i], NULL, client_main, &jobs[i])) {
			fprintf(stderr, "gradgate-bench transport: cannot start a thread\n");
			exit(1);
		}
	}
	pthread_barrier_wait(&barrier); /* every stream connected */
	sample_cpus(&before);
	for (int i = 0; i < opt->streams; i++)
		pthread_join(threads[i], NULL);
	sample_cpus(&after);
	pthread_barrier_destroy(&barrier);

	uint64_t bytes = 0, wall = 0, cpu = 0, peer_cpu = 0;
	for (int i = 0; i < opt->streams; i++) {
		if (jobs[i].rc) {
			fprintf(stderr, "gradgate-bench transport: %s: stream %d: %s\n", m->name, i,
				jobs[i].error[0] ? jobs[i].error : strerror(-jobs[i].rc));
			rc = jobs[i].rc;
			continue;
		}
		bytes += jobs[i].bytes;
		wall = GG_MAX(wall, jobs[i].wall_ns);
		cpu += jobs[i].cpu_ns;
		peer_cpu += jobs[i].peer_cpu_ns;
		if (jobs[i].cipher && strcmp(jobs[i].cipher, m->name)) {
			fprintf(stderr, "gradgate-bench transport: asked for %s, negotiated %s\n", m->name, jobs[i].cipher);
			rc = -EPROTO;
		}
	}
	if (!rc && bytes) {
		r->bytes = bytes;
		r->gbps = (double)bytes * 8 / (double)wall;
		r->cpu_send = (double)cpu / 1e9 / ((double)bytes / 1e9);
		r->cpu_recv = (double)peer_cpu / 1e9 / ((double)bytes / 1e9);
	}
	r->cores = GG_MIN(before.n, after.n);
	for (int i = 0; i < r->cores; i++) {
		uint64_t dt = after.total[i] - before.total[i];
		r->core_busy[i] = dt ? (double)(after.busy[i] - before.busy[i]) / (double)dt : 0;
	}

	if (!rc && opt->rtt_count > 0) {
		echo = (struct client_job){
			.opt = opt, .addr = addr, .addr_len = addr_len, .addr_text = addr_text, .ctx = ctx,
			.server_site = &creds->server_site, .kind = KIND_ECHO,
		};
		client_main(&echo);
		if (echo.rc) {
			fprintf(stderr, "gradgate-bench transport: %s: round trips: %s\n", m->name,
				echo.error[0] ? echo.error : strerror(-echo.rc));
			rc = echo.rc;
		} else {
			qsort(echo.rtt_ns, echo.rtt_n, sizeof(*echo.rtt_ns), cmp_u64);
			r->p50_us = percentile_us(echo.rtt_ns, echo.rtt_n, 0.50);
			r->p99_us = percentile_us(echo.rtt_ns, echo.rtt_n, 0.99);
		}
		free(echo.rtt_ns);
	}
	gg_tls_context_free(ctx);
	return rc;
}

static void print_header(const struct options *opt, const char *where, FILE *f)
{
	char size[32], rate[64] = "";

	if (opt->rate_bps)
		snprintf(rate, sizeof(rate), ", paced to %.4g Gbit/s", (double)opt->rate_bps / 1e9);
	fprintf(f, "gradgate-bench transport: %s, %d stream%s, %.1f s per mode%s, %s round trips x %d\n", where,
		opt->streams, opt->streams == 1 ? "" : "s", opt->seconds, rate,
		gg_format_size(opt->rtt_bytes, size, sizeof(size)), opt->rtt_count);
	fprintf(f, "%-30s %8s %14s %14s %11s %11s %9s  %s\n", "mode", "Gbit/s", "CPU s/GB send", "CPU s/GB recv",
		"RTT p50 us", "RTT p99 us", "vs plain", "core busy");
}

/* A round-trip figure, or `none` where none was measured (NaN). */
static const char *us_or(double us, const char *none, char *buf, size_t size)
{
	if (isnan(us))
		return none;
	snprintf(buf, size, "%.1f", us);
	return buf;
}

static void print_result(const struct options *opt, const struct result *r)
{
	char p50_buf[32], p99_buf[32];

	if (opt->json) {
		const char *p50 = us_or(r->p50_us, "null", p50_buf, sizeof(p50_buf));
		const char *p99 = us_or(r->p99_us, "null", p99_buf, sizeof(p99_buf));
		printf("{\"mode\":\"%s\",\"streams\":%d,\"seconds\":%.3f,\"bytes\":%" PRIu64 ",\"gbps\":%.3f,"
		       "\"cpu_s_per_gb_send\":%.4f,\"cpu_s_per_gb_recv\":%.4f,\"rtt_p50_us\":%s,\"rtt_p99_us\":%s,",
		       r->mode, opt->streams, opt->seconds, r->bytes, r->gbps, r->cpu_send, r->cpu_recv, p50, p99);
		if (r->has_ratio)
			printf("\"ratio_vs_plain\":%.4f,", r->ratio);
		else
			printf("\"ratio_vs_plain\":null,");
		if (opt->rate_bps)
			printf("\"rate_gbps\":%.3f,", (double)opt->rate_bps / 1e9);
		else
			printf("\"rate_gbps\":null,");
		printf("\"core_busy\":[");
		for (int i = 0; i < r->cores; i++)
			printf("%s%.3f", i ? "," : "", r->core_busy[i]);
		printf("]}\n");
	} else {
		char ratio[16] = "-", busy[256] = "";
		const char *p50 = us_or(r->p50_us, "-", p50_buf, sizeof(p50_buf));
		const char *p99 = us_or(r->p99_us, "-", p99_buf, sizeof(p99_buf));
		size_t used = 0;
		if (r->has_ratio)
			snprintf(ratio, sizeof(ratio), "%.3f", r->ratio);
		for (int i = 0; i < r->cores && used < sizeof(busy); i++)
			used += (size_t)snprintf(busy + used, sizeof(busy) - used, "%s%.0f%%", i ? " " : "",
						 r->core_busy[i] * 100);
		printf("%-30s %8.2f %14.3f %14.3f %11s %11s %9s  %s\n", r->plain ? "plain (INSECURE)" : r->mode,
		       r->gbps, r->cpu_send, r->cpu_recv, p50, p99, ratio, busy);
	}
	fflush(stdout);
}

/* ---- options and credentials ---- */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: gradgate-bench transport [options]            sender and receiver here, over loopback\n"
		"       gradgate-bench transport --connect HOST:PORT [options]   sender against a remote receiver\n"
		"       gradgate-bench transport serve [--listen ADDR:PORT] [options]   receiver only\n"
		"\n"
		"Streams data for --time seconds per mode, then runs 64 KiB round trips, and reports\n"
		"throughput, CPU seconds per GB on each side, round-trip p50/p99 and the TLS/plain ratio.\n"
		"\n"
		"  --modes LIST           TLS 1.3 ciphersuites, separated by commas or colons (default: %s)\n"
		"  --plain                also measure unencrypted transport, the baseline for the ratio.\n"
		"                         INSECURE: data crosses the network in clear; benchmark only\n"
		"  --allow-plain          (serve) accept unencrypted benchmark connections\n"
		"  --time SECONDS         streaming time per mode, 0.1 to 3600 (default 3)\n"
		"  --streams N            parallel connections, one thread each side (default 1, max %d)\n"
		"  --rate RATE            pace the sender to RATE bits/s on the wire (e.g. 2G, 500M, 2gbit): a link\n"
		"                         slower than the cipher, as WAN links are (split over the streams)\n"
		"  --rtt-count N          round trips per mode (default 2000; 0 skips them)\n"
		"  --rtt-size SIZE        round-trip message size, up to 64MiB (default 64KiB)\n"
		"  --write-size SIZE      application write size, up to 64MiB (default 256KiB)\n"
		"  --ring-size SIZE       TLS ciphertext ring per direction and connection, 64KiB to 256MiB,\n"
		"                         rounded up to a power of two (default 256KiB)\n"
		"  --socket-buffer SIZE   SO_SNDBUF/SO_RCVBUF, 64KiB to 256MiB as the config's socket_buffer\n"
		"                         (default: kernel autotuning)\n"
		"  --listen ADDR:PORT     (serve) where to listen (default 0.0.0.0:7443)\n"
		"  --ca FILE --cert FILE --key FILE   credentials (default: a throwaway CA and two\n"
		"                         certificates made in memory, loopback only)\n"
		"  --peer-identity ID     identity the peer's certificate must carry, dns:NAME or uri:URI\n"
		"                         (required with --ca; a loopback run with files uses one\n"
		"                         certificate at both ends, so give the identity it names)\n"
		"  --json                 one JSON object per mode and line\n"
		"\n"
		"Two hosts: both need files from one CA, e.g. examples/make-certs.sh; on the receiver\n"
		"  gradgate-bench transport serve --ca ca.pem --cert site-b.pem --key site-b.key \\\n"
		"      --peer-identity dns:site-a.gradgate.test [--allow-plain]\n"
		"and on the sender\n"
		"  gradgate-bench transport --connect HOST:7443 --ca ca.pem --cert site-a.pem \\\n"
		"      --key site-a.key --peer-identity dns:site-b.gradgate.test [--plain]\n",
		GG_TLS_DEFAULT_CIPHERSUITES, MAX_STREAMS);
}

/* A size from `lo` to `hi`: 0, or -EBADMSG when it is not one (said). */
static int size_in(const char *flag, const char *v, uint64_t *out, uint64_t lo, uint64_t hi)
{
	return gg_bench_size("transport", flag, v, lo, hi, 1, out) ? -EBADMSG : 0;
}

/* Bits per second, 1 kbit/s to 10 Tbit/s: past that no pacing would be
 * done (and past 2^64 the conversion would be undefined). */
static int parse_rate(const char *v, uint64_t *bps)
{
	double x;

	if (gg_bench_parse_rate(v, &x) || !(x >= 1e3 && x <= 1e13)) {
		fprintf(stderr, "gradgate-bench transport: --rate %s: expected a rate like 2G, 500M or 100k, or 2gbit "
			"(bits per second, 1k to 10000G)\n", v);
		return -EBADMSG; /* told */
	}
	*bps = (uint64_t)x;
	return 0;
}

static int parse_options(int argc, char **argv, struct options *o)
{
	*o = (struct options){
		.listen = "0.0.0.0:7443", .modes = GG_TLS_DEFAULT_CIPHERSUITES, .seconds = 3, .streams = 1,
		.rtt_count = 2000, .rtt_bytes = 64 << 10, .write_bytes = 256 << 10, .ring_bytes = 256 << 10,
	};
	int i = 1;
	bool listen_given = false;
	if (i < argc && !strcmp(argv[i], "serve")) {
		o->serve = true;
		i++;
	}
	for (; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			usage(stdout);
			exit(0);
		}
		if (!strcmp(a, "--json")) {
			o->json = true;
			continue;
		}
		if (!strcmp(a, "--plain")) {
			o->plain = true;
			continue;
		}
		if (!strcmp(a, "--allow-plain")) {
			o->allow_plain = true;
			continue;
		}
		static const char *const valued[] = { "--connect", "--listen", "--modes", "--time", "--streams",
						      "--rtt-count", "--rtt-size", "--write-size", "--ring-size",
						      "--socket-buffer", "--rate", "--ca", "--cert", "--key",
						      "--peer-identity" };
		bool known = false;
		for (size_t k = 0; k < GG_ARRAY_LEN(valued); k++)
			known |= !strcmp(a, valued[k]);
		if (!known) {
			fprintf(stderr, "gradgate-bench transport: unknown %s '%s' (see --help)\n", a[0] == '-' ? "option" : "argument",
				a);
			return -EINVAL;
		}
		if (!v) {
			fprintf(stderr, "gradgate-bench transport: %s needs a value (see --help)\n", a);
			return -EINVAL;
		}
		i++;
		int rc = 0;
		long long n;
		char *end;
		if (!strcmp(a, "--connect"))
			o->connect = v;
		else if (!strcmp(a, "--listen"))
			o->listen = v, listen_given = true;
		else if (!strcmp(a, "--modes"))
			o->modes = v;
		else if (!strcmp(a, "--time")) {
			o->seconds = strtod(v, &end);
			/* Shorter than a tenth of a second, a mode measures its
			 * handshake and a few records: nothing to compare. */
			if (end == v || *end || !(o->seconds >= 0.1 && o->seconds <= 3600)) {
				fprintf(stderr, "gradgate-bench transport: --time must be 0.1 to 3600 seconds, not '%s'\n", v);
				return -EINVAL;
			}
		}
		else if (!strcmp(a, "--streams")) {
			if (gg_bench_number("transport", a, v, 1, MAX_STREAMS, &n))
				return -EINVAL;
			o->streams = (int)n;
		} else if (!strcmp(a, "--rtt-count")) {
			if (gg_bench_number("transport", a, v, 0, 10000000, &n))
				return -EINVAL;
			o->rtt_count = (int)n;
		}
		else if (!strcmp(a, "--rtt-size"))
			rc = size_in(a, v, &o->rtt_bytes, 1, 64u << 20);
		else if (!strcmp(a, "--write-size"))
			rc = size_in(a, v, &o->write_bytes, 1, 64u << 20);
		else if (!strcmp(a, "--ring-size"))
			rc = size_in(a, v, &o->ring_bytes, GG_TLS_RING_MIN_BYTES, 256u << 20);
		else if (!strcmp(a, "--socket-buffer"))
			rc = size_in(a, v, &o->socket_buffer_bytes, 64u << 10, 256u << 20);
		else if (!strcmp(a, "--rate"))
			rc = parse_rate(v, &o->rate_bps);
		else if (!strcmp(a, "--ca"))
			o->ca = v;
		else if (!strcmp(a, "--cert"))
			o->cert = v;
		else if (!strcmp(a, "--key"))
			o->key = v;
		else if (!strcmp(a, "--peer-identity"))
			o->peer_identity = v;
		if (rc) /* the parser said what it wants */
			return -EINVAL;
	}
	const char *receiver_only = listen_given ? "--listen" : o->allow_plain ? "--allow-plain" : NULL;
	if (!o->serve && receiver_only) {
		fprintf(stderr, "gradgate-bench transport: %s is an option of the receiver (transport serve)\n",
			receiver_only);
		return -EINVAL;
	}
	if ((o->ca || o->cert || o->key) && !(o->ca && o->cert && o->key)) {
		fprintf(stderr, "gradgate-bench transport: --ca, --cert and --key go together\n");
		return -EINVAL;
	}
	if ((o->connect || o->serve) && !o->ca) {
		fprintf(stderr, "gradgate-bench transport: across hosts both ends need certificates from one CA: "
				"--ca, --cert, --key and --peer-identity\n");
		return -EINVAL;
	}
	if (o->ca && !o->peer_identity) {
		fprintf(stderr, "gradgate-bench transport: with --cert, say which identity the peer must carry: --peer-identity\n");
		return -EINVAL;
	}
	const char *why;
	if (o->peer_identity && gg_identity_check(o->peer_identity, &why)) {
		fprintf(stderr, "gradgate-bench transport: --peer-identity %s: %s\n", o->peer_identity, why);
		return -EINVAL;
	}
	const char *addr_opts[] = { "--listen", "--connect" }, *addrs[] = { o->listen, o->connect };
	for (size_t k = 0; k < GG_ARRAY_LEN(addrs); k++) {
		struct sockaddr_storage ss;
		socklen_t len;
		if (addrs[k] && gg_net_addr_parse(addrs[k], &ss, &len, &why)) {
			fprintf(stderr, "gradgate-bench transport: %s %s: %s\n", addr_opts[k], addrs[k], why);
			return -EINVAL;
		}
	}
	return 0;
}

static int parse_modes(const struct options *o, struct mode *modes, int *count)
{
	static char list[512];
	char *save, *tok;

	*count = 0;
	if (o->plain)
		modes[(*count)++] = (struct mode){ "plain", true };
	snprintf(list, sizeof(list), "%s", o->modes);
	for (tok = strtok_r(list, ",:", &save); tok; tok = strtok_r(NULL, ",:", &save)) {
		if (!strcmp(tok, "plain")) {
			fprintf(stderr, "gradgate-bench transport: --modes lists TLS 1.3 ciphersuites only: plain "
					"(unencrypted) is asked for with --plain, and runs first\n");
			return -EINVAL;
		}
		if (*count == MAX_MODES) {
			fprintf(stderr, "gradgate-bench transport: at most %d modes per run\n", MAX_MODES);
			return -EINVAL;
		}
		char why[512];
		if (gg_tls_check_ciphersuites(tok, why, sizeof(why))) {
			fprintf(stderr, "gradgate-bench transport: --modes: %s\n", why);
			return -EINVAL;
		}
		modes[(*count)++] = (struct mode){ tok, false };
	}
	if (!*count) {
		fprintf(stderr, "gradgate-bench transport: --modes names no ciphersuite\n");
		return -EINVAL;
	}
	return 0;
}

static int load_creds(const struct options *o, struct creds *c)
{
	struct gg_tls_pki *pki = NULL;
	const char *why, *server_id = DEFAULT_SERVER_IDENTITY, *client_id = DEFAULT_CLIENT_IDENTITY;
	char err[512];
	int rc;

	memset(c, 0, sizeof(*c));
	if (o->ca) {
		c->server = c->client = (struct gg_tls_options){ .ca_file = o->ca, .cert_file = o->cert, .key_file = o->key };
		server_id = client_id = o->peer_identity;
	} else {
		struct gg_tls_cert_request server_req = { .identity = server_id, .valid_from_s = -3600, .valid_until_s = 86400 };
		struct gg_tls_cert_request client_req = { .identity = client_id, .valid_from_s = -3600, .valid_until_s = 86400 };
		if ((rc = gg_tls_pki_new("gradgate-bench throwaway CA", &pki)) ||
		    (rc = gg_tls_pki_issue(pki, &server_req, &c->server_cert_pem, &c->server_key_pem)) ||
		    (rc = gg_tls_pki_issue(pki, &client_req, &c->client_cert_pem, &c->client_key_pem)) ||
		    !(c->ca_pem = strdup(gg_tls_pki_ca_pem(pki)))) {
			fprintf(stderr, "gradgate-bench transport: cannot make throwaway certificates\n");
			gg_tls_pki_free(pki);
			return rc ? rc : -ENOMEM;
		}
		gg_tls_pki_free(pki);
		c->server = (struct gg_tls_options){ .ca_pem = c->ca_pem, .cert_pem = c->server_cert_pem, .key_pem = c->server_key_pem };
		c->client = (struct gg_tls_options){ .ca_pem = c->ca_pem, .cert_pem = c->client_cert_pem, .key_pem = c->client_key_pem };
	}
	if (gg_tls_site_init(&c->server_site, NULL, server_id, &why) ||
	    gg_tls_site_init(&c->client_site, NULL, client_id, &why)) {
		fprintf(stderr, "gradgate-bench transport: --peer-identity %s: %s\n", o->peer_identity, why);
		return -EINVAL;
	}
	if (!o->connect && (rc = gg_tls_context_new(&c->server, &c->server_ctx, err, sizeof(err)))) {
		fprintf(stderr, "gradgate-bench transport: %s\n", err);
		return rc;
	}
	return 0;
}

static void free_creds(struct creds *c)
{
	gg_tls_context_free(c->server_ctx);
	free(c->ca_pem);
	free(c->server_cert_pem);
	free(c->server_key_pem);
	free(c->client_cert_pem);
	free(c->client_key_pem);
}

static volatile sig_atomic_t stop_serving;

static void on_stop_signal(int sig)
{
	stop_serving = 1;
}

static int serve_forever(const struct options *opt, struct creds *creds)
{
	struct server srv;
	char addr[GG_NET_ADDR_TEXT_MAX];

	if (opt->allow_plain)
		fprintf(stderr, "gradgate-bench transport: WARNING: --allow-plain: this server accepts UNENCRYPTED benchmark "
				"connections; never let it face an untrusted network\n");
	if (server_start(&srv, opt, creds, opt->listen))
		return 1;
	fprintf(stderr, "gradgate-bench transport: transport receiver listening on %s (Ctrl-C stops)\n",
		gg_net_local_addr(srv.listen_fd, addr, sizeof(addr)));
	struct sigaction sa = { .sa_handler = on_stop_signal };
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	while (!stop_serving)
		pause();
	server_stop(&srv);
	return 0;
}

int gg_bench_transport_loopback(const char *suite, int streams, double seconds, double *gbps)
{
	struct options opt = {
		.modes = suite, .seconds = seconds, .streams = streams, .write_bytes = 256 << 10,
		.ring_bytes = 256 << 10,
	};
	struct mode mode = { .name = suite };
	struct creds creds;
	struct server srv;
	struct result r;
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	char addr[GG_NET_ADDR_TEXT_MAX];
	int rc;

	if (streams < 1 || streams > MAX_STREAMS)
		return -EINVAL;
	signal(SIGPIPE, SIG_IGN);
	if ((rc = load_creds(&opt, &creds))) {
		free_creds(&creds);
		return rc;
	}
	if (server_start(&srv, &opt, &creds, "127.0.0.1:0")) {
		free_creds(&creds);
		return -EIO;
	}
	getsockname(srv.listen_fd, (struct sockaddr *)&ss, &len);
	gg_net_addr_format((struct sockaddr *)&ss, addr, sizeof(addr));
	rc = run_mode(&opt, &mode, &creds, (struct sockaddr *)&ss, len, addr, &r);
	server_stop(&srv);
	free_creds(&creds);
	if (!rc)
		*gbps = r.gbps;
	return rc;
}

int gg_bench_transport_main(int argc, char **argv)
{
	struct options opt;
	struct mode modes[MAX_MODES];
	struct result results[MAX_MODES];
	struct creds creds;
	struct server srv;
	struct sockaddr_storage ss;
	socklen_t len;
	char addr[GG_NET_ADDR_TEXT_MAX];
	const char *why;
	int count, status = 0;

	if (parse_options(argc, argv, &opt) || parse_modes(&opt, modes, &count))
		return 2;
	signal(SIGPIPE, SIG_IGN);
	if (load_creds(&opt, &creds)) {
		free_creds(&creds);
		return 1;
	}
	if (opt.serve) {
		status = serve_forever(&opt, &creds);
		free_creds(&creds);
		return status;
	}
	if (opt.plain)
		fprintf(stderr, "gradgate-bench transport: WARNING: --plain: mode 'plain' sends benchmark data UNENCRYPTED, "
				"without TLS; it is a baseline for measurements, never a way to run the gateway\n");
	if (opt.connect) {
		if (gg_net_addr_parse(opt.connect, &ss, &len, &why)) {
			fprintf(stderr, "gradgate-bench transport: --connect %s: %s\n", opt.connect, why);
			free_creds(&creds);
			return 2;
		}
		snprintf(addr, sizeof(addr), "%s", opt.connect);
	} else {
		opt.allow_plain = opt.plain;
		if (server_start(&srv, &opt, &creds, "127.0.0.1:0")) {
			free_creds(&creds);
			return 1;
		}
		len = sizeof(ss);
		getsockname(srv.listen_fd, (struct sockaddr *)&ss, &len);
		gg_net_addr_format((struct sockaddr *)&ss, addr, sizeof(addr));
	}
	if (!opt.json)
		print_header(&opt, opt.connect ? opt.connect : "loopback", stdout);
	double plain_gbps = 0;
	for (int i = 0; i < count; i++) {
		if (run_mode(&opt, &modes[i], &creds, (struct sockaddr *)&ss, len, addr, &results[i])) {
			status = 1;
			continue;
		}
		if (modes[i].plain)
			plain_gbps = results[i].gbps;
		if (plain_gbps > 0) {
			results[i].ratio = results[i].gbps / plain_gbps;
			results[i].has_ratio = true;
		}
		print_result(&opt, &results[i]);
	}
	if (!opt.connect)
		server_stop(&srv);
	free_creds(&creds);
	return status;
}
