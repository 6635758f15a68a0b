/* A small TLS peer built on the gateway's io_uring loop and TLS streams,
 * for the shell tests that pit it against `openssl s_client`/`s_server`
 * and against port scanners.
 *
 *   tls_probe serve   --ca F --cert F --key F --allow NAME=IDENTITY...
 *                     [--deny NAME=IDENTITY...] [--crl F] [--handshake-timeout-ms N] [--close-after-greeting]
 *                     [--exit-after N]
 *   tls_probe connect HOST:PORT --ca F --cert F --key F --expect NAME=IDENTITY
 *                     [--send TEXT]
 *
 * serve prints "listening on ADDR", then one line per event: "accepted
 * ...", "refused: MESSAGE", "received: TEXT", "reloaded ..." (SIGHUP
 * reloads the credentials). It greets each accepted peer and echoes what
 * it receives. connect sends TEXT and close_notify, prints "connected ..."
 * and what the server sends, or "failed: MESSAGE" and exits 1. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "net_addr.h"
#include "tls_stream.h"

#define MAX_CONNS 64

struct probe {
	struct gg_loop loop;
	struct gg_tls_context *ctx;
	struct gg_tls_site sites[GG_TLS_MAX_SITES];
	size_t site_count;
	struct gg_tls_stream conns[MAX_CONNS];
	bool used[MAX_CONNS];
	struct gg_tls_stream_options sopts;
	int listen_fd;
	bool server;
	bool close_after_greeting;
	int exit_after;
	int finished;
	const char *send_text;
	int status;
};

static volatile sig_atomic_t got_hup, got_term;

static void on_signal(int sig)
{
	if (sig == SIGHUP)
		got_hup = 1;
	else
		got_term = 1;
}

static void usage(void)
{
	fprintf(stderr, "usage: tls_probe serve|connect [HOST:PORT] --ca F --cert F --key F "
			"(--allow|--expect) NAME=IDENTITY... [--deny NAME=IDENTITY...] [--crl F] [--handshake-timeout-ms N] "
			"[--close-after-greeting] [--exit-after N] [--send TEXT]\n");
	exit(2);
}

static void add_site(struct probe *p, const char *arg, bool denied)
{
	const char *eq = strchr(arg, '=');
	char name[GG_TLS_SITE_NAME_MAX];
	const char *why;

	if (!eq || p->site_count == GG_TLS_MAX_SITES)
		usage();
	snprintf(name, sizeof(name), "%.*s", (int)(eq - arg), arg);
	if (gg_tls_site_init(&p->sites[p->site_count], name, eq + 1, &why)) {
		fprintf(stderr, "tls_probe: %s: %s\n", arg, why);
		exit(2);
	}
	p->sites[p->site_count++].denied = denied;
}

static void on_events(struct probe *p, uint32_t i, unsigned ev)
{
	struct gg_tls_stream *s = &p->conns[i];
	char buf[4096];

	if (ev & GG_TLS_STREAM_EV_FAILED) {
		printf("%s: %s\n", p->server ? "refused" : "failed", gg_tls_stream_error(s));
		p->status = 1;
	}
	if (ev & GG_TLS_STREAM_EV_OPEN) {
		const struct gg_tls_site *site = &p->sites[gg_tls_engine_peer_site(s->tls)];
		char id[GG_TLS_IDENTITY_MAX + 8];
		printf("%s peer %s as site '%s' (%s) with %s\n", p->server ? "accepted" : "connected to",
		       gg_tls_engine_peer_addr(s->tls), site->name, gg_tls_identity_format(&site->identity, id, sizeof(id)),
		       gg_tls_engine_cipher(s->tls));
		const char *text = p->server ? "hello from gradgate probe\n" : p->send_text;
		if (text && gg_tls_stream_write(s, text, strlen(text)) < 0)
			printf("write failed: %s\n", gg_tls_stream_error(s));
		if ((!p->server || p->close_after_greeting) && gg_tls_stream_shutdown(s))
			printf("shutdown failed: %s\n", gg_tls_stream_error(s));
	}
	if (ev & GG_TLS_STREAM_EV_READABLE) {
		ssize_t n;
		while ((n = gg_tls_stream_read(s, buf, sizeof(buf) - 1)) > 0) {
			buf[n] = '\0';
			printf("received: %s%s", buf, buf[n - 1] == '\n' ? "" : "\n");
			if (p->server && !s->write_shut && gg_tls_stream_write(s, buf, (size_t)n) < 0)
				printf("echo failed: %s\n", gg_tls_stream_error(s));
		}
		if (n == 0) {
			printf("peer %s closed the connection\n", gg_tls_engine_peer_addr(s->tls));
			ev |= gg_tls_stream_close(s);
		}
	}
	if (ev & GG_TLS_STREAM_EV_DONE) {
		p->used[i] = false;
		p->finished++;
	}
	fflush(stdout);
}

static void accept_conn(struct probe *p, int fd)
{
	char addr[GG_NET_ADDR_TEXT_MAX];
	struct gg_tls_engine *e;
	uint32_t i = 0;

	while (i < MAX_CONNS && p->used[i])
		i++;
	if (i == MAX_CONNS) {
		printf("dropped a connection: all %d slots busy\n", MAX_CONNS);
		close(fd);
		return;
	}
	struct gg_tls_engine_config cfg = {
		.role = GG_TLS_SERVER, .peer_addr = gg_net_peer_addr(fd, addr, sizeof(addr)),
		.sites = p->sites, .site_count = p->site_count,
	};
	if (gg_tls_engine_new(p->ctx, &cfg, &e)) {
		printf("out of memory for a connection\n");
		close(fd);
		return;
	}
	p->used[i] = true;
	gg_tls_stream_accept(&p->conns[i], &p->loop, i, fd, e, &p->sopts);
	on_events(p, i, gg_tls_stream_tick(&p->conns[i], p->loop.now_us));
}

static void on_cqe(void *arg, const struct io_uring_cqe *cqe)
{
	struct probe *p = arg;
	uint32_t i = gg_loop_ud_index(cqe->user_data);

	switch (gg_loop_ud_kind(cqe->user_data)) {
	case GG_OP_ACCEPT:
		if (cqe->res >= 0)
			accept_conn(p, cqe->res);
		else
			printf("accept failed: %s\n", strerror(-cqe->res));
		if (!(cqe->flags & IORING_CQE_F_MORE) && gg_loop_accept(&p->loop, p->listen_fd, cqe->user_data))
			got_term = 1;
		break;
	case GG_OP_CONNECT:
	case GG_OP_RECV:
	case GG_OP_SEND:
	case GG_OP_CANCEL:
		if (i < MAX_CONNS && p->used[i])
			on_events(p, i, gg_tls_stream_on_cqe(&p->conns[i], cqe));
		break;
	default:
		break;
	}
}

static void run(struct probe *p)
{
	while (!got_term) {
		uint64_t next = 0;
		for (uint32_t i = 0; i < MAX_CONNS; i++) {
			uint64_t d = p->used[i] ? gg_tls_stream_deadline_us(&p->conns[i]) : 0;
			if (d && (!next || d < next))
				next = d;
		}
		uint64_t wait = gg_loop_timeout_us(&p->loop, next);
		int rc = gg_loop_run(&p->loop, GG_MIN(wait, (uint64_t)200000), on_cqe, p);
		if (rc < 0) {
			printf("io_uring failed: %s\n", strerror(-rc));
			p->status = 1;
			return;
		}
		if (got_hup) {
			char err[512];
			got_hup = 0;
			if (gg_tls_context_reload(p->ctx, err, sizeof(err)))
				printf("reload failed: %s\n", err);
			else
				printf("reloaded credentials (generation %u)\n", gg_tls_context_generation(p->ctx));
		}
		bool live = false;
		for (uint32_t i = 0; i < MAX_CONNS; i++) {
			if (!p->used[i])
				continue;
			on_events(p, i, gg_tls_stream_tick(&p->conns[i], p->loop.now_us));
			live |= p->used[i];
		}
		fflush(stdout);
		if (p->server ? p->exit_after && p->finished >= p->exit_after : !live)
			return;
	}
}

int main(int argc, char **argv)
{
	static struct probe p = { .listen_fd = -1 };
	struct gg_tls_options o = { 0 };
	const char *target = NULL;
	char err[512];

	if (argc < 2)
		usage();
	p.server = !strcmp(argv[1], "serve");
	if (!p.server && strcmp(argv[1], "connect"))
		usage();
	int i = 2;
	if (!p.server) {
		if (argc < 3)
			usage();
		target = argv[i++];
	}
	for (; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--close-after-greeting")) {
			p.close_after_greeting = true;
			continue;
		}
		if (!v)
			usage();
		i++;
		if (!strcmp(a, "--ca"))
			o.ca_file = v;
		else if (!strcmp(a, "--cert"))
			o.cert_file = v;
		else if (!strcmp(a, "--key"))
			o.key_file = v;
		else if (!strcmp(a, "--crl"))
			o.crl_file = v;
		else if (!strcmp(a, "--ciphersuites"))
			o.ciphersuites = v;
		else if (!strcmp(a, "--allow") || !strcmp(a, "--expect"))
			add_site(&p, v, false);
		else if (!strcmp(a, "--deny"))
			add_site(&p, v, true);
		else if (!strcmp(a, "--handshake-timeout-ms"))
			p.sopts.handshake_timeout_us = strtoull(v, NULL, 10) * 1000;
		else if (!strcmp(a, "--exit-after"))
			p.exit_after = atoi(v);
		else if (!strcmp(a, "--send"))
			p.send_text = v;
		else
			usage();
	}
	if (!p.site_count)
		usage();
	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGPIPE, SIG_IGN);
	struct sigaction sa = { .sa_handler = on_signal };
	sigaction(SIGHUP, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);

	if (gg_tls_context_new(&o, &p.ctx, err, sizeof(err))) {
		printf("cannot load credentials: %s\n", err);
		return 1;
	}
	int rc = gg_loop_init(&p.loop, 256);
	if (rc) {
		printf("cannot set up io_uring: %s\n", strerror(-rc));
		return 1;
	}
	if (p.server) {
		struct sockaddr_storage ss;
		socklen_t len;
		const char *why;
		char addr[GG_NET_ADDR_TEXT_MAX];
		if (gg_net_addr_parse("127.0.0.1:0", &ss, &len, &why) ||
		    (p.listen_fd = gg_net_listen((struct sockaddr *)&ss, len, 64, 0)) < 0 ||
		    gg_loop_accept(&p.loop, p.listen_fd, gg_loop_ud(GG_OP_ACCEPT, 0, 0))) {
			printf("cannot listen\n");
			return 1;
		}
		printf("listening on %s\n", gg_net_local_addr(p.listen_fd, addr, sizeof(addr)));
	} else {
		struct sockaddr_storage ss;
		socklen_t len;
		const char *why;
		struct gg_tls_engine *e;
		if (gg_net_addr_parse(target, &ss, &len, &why)) {
			fprintf(stderr, "tls_probe: %s: %s\n", target, why);
			return 2;
		}
		struct gg_tls_engine_config cfg = {
			.role = GG_TLS_CLIENT, .peer_addr = target, .sites = p.sites, .site_count = 1,
		};
		if (gg_tls_engine_new(p.ctx, &cfg, &e))
			return 1;
		p.used[0] = true;
		if (gg_tls_stream_connect(&p.conns[0], &p.loop, 0, (struct sockaddr *)&ss, len, e, &p.sopts))
			on_events(&p, 0, gg_tls_stream_tick(&p.conns[0], p.loop.now_us));
	}
	run(&p);

	/* Close what is left and wait until nothing is in flight. */
	for (uint32_t c = 0; c < MAX_CONNS; c++)
		if (p.used[c])
			on_events(&p, c, gg_tls_stream_close(&p.conns[c]));
	for (int spins = 0; spins < 100; spins++) {
		bool live = false;
		for (uint32_t c = 0; c < MAX_CONNS; c++)
			live |= p.used[c];
		if (!live)
			break;
		got_term = 0;
		if (gg_loop_run(&p.loop, 20000, on_cqe, &p) < 0)
			break;
		for (uint32_t c = 0; c < MAX_CONNS; c++)
			if (p.used[c])
				on_events(&p, c, gg_tls_stream_tick(&p.conns[c], p.loop.now_us));
	}
	if (p.listen_fd >= 0)
		close(p.listen_fd);
	gg_loop_fini(&p.loop);
	gg_tls_context_free(p.ctx);
	return p.server ? 0 : p.status;
}
