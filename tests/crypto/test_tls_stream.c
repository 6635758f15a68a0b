/* Both ends of a TLS connection in one io_uring loop over loopback, the
 * way the gateway's owner code dispatches them: 24 MiB each way through
 * small rings and odd-sized sends and receives, checked byte for byte,
 * then close_notify both ways. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net_addr.h"
#include "tls_pki.h"
#include "tls_stream.h"
#include "tls_test.h"

#define TOTAL_BYTES (24u << 20)
#define RING_BYTES (64u << 10)

struct side {
	struct gg_tls_stream s;
	bool live, open, peer_closed, shut;
	uint64_t sent, got, echoed;
	size_t pending_echo;
	uint8_t echo_buf[9000];
};

struct test {
	struct gg_loop loop;
	struct gg_tls_context *server_ctx;
	struct gg_tls_site client_site;
	int listen_fd;
	struct side side[2]; /* 0: client, 1: server */
	uint8_t *pattern;
};

static uint8_t pattern_at(uint64_t i)
{
	return (uint8_t)((i * 0x9e3779b1u) >> 11);
}

static void check_bytes(const uint8_t *buf, size_t n, uint64_t at)
{
	for (size_t i = 0; i < n; i++)
		if (buf[i] != pattern_at(at + i)) {
			fprintf(stderr, "byte %llu is %u, expected %u\n", (unsigned long long)(at + i), buf[i],
				pattern_at(at + i));
			exit(1);
		}
}

/* Client: sends the pattern and checks the echo. Server: echoes. */
static void pump_side(struct test *t, int i)
{
	struct side *d = &t->side[i];
	uint8_t buf[10007];
	ssize_t n;

	if (!d->open || d->s.state != GG_TLS_STREAM_OPEN)
		return;
	if (i == 0) {
		while (d->sent < TOTAL_BYTES) {
			size_t chunk = GG_MIN((size_t)(TOTAL_BYTES - d->sent), (size_t)77777);
			n = gg_tls_stream_write(&d->s, t->pattern + d->sent, chunk);
			if (n == -EAGAIN)
				break;
			CHECK(n > 0);
			d->sent += (uint64_t)n;
		}
		while ((n = gg_tls_stream_read(&d->s, buf, sizeof(buf))) > 0) {
			check_bytes(buf, (size_t)n, d->got);
			d->got += (uint64_t)n;
		}
		CHECK(n == -EAGAIN || n == 0);
		if (d->sent == TOTAL_BYTES && d->got == TOTAL_BYTES && !d->shut) {
			CHECK_EQ_INT(gg_tls_stream_shutdown(&d->s), 0);
			d->shut = true;
		}
		if (n == 0) {
			CHECK(d->shut);
			d->peer_closed = true;
			gg_tls_stream_close(&d->s);
		}
	} else {
		for (;;) {
			if (d->pending_echo) {
				n = gg_tls_stream_write(&d->s, d->echo_buf, d->pending_echo);
				if (n == -EAGAIN)
					break;
				CHECK(n > 0);
				memmove(d->echo_buf, d->echo_buf + n, d->pending_echo - (size_t)n);
				d->pending_echo -= (size_t)n;
				d->echoed += (uint64_t)n;
				continue;
			}
			n = gg_tls_stream_read(&d->s, d->echo_buf, sizeof(d->echo_buf));
			if (n <= 0)
				break;
			check_bytes(d->echo_buf, (size_t)n, d->got);
			d->got += (uint64_t)n;
			d->pending_echo = (size_t)n;
		}
		if (n == 0 && !d->pending_echo && !d->shut) {
			CHECK_EQ_INT(d->got, TOTAL_BYTES);
			CHECK_EQ_INT(gg_tls_stream_shutdown(&d->s), 0);
			d->shut = true;
			d->peer_closed = true;
			gg_tls_stream_close(&d->s);
		}
	}
	if (d->s.tls)
		CHECK(gg_tls_engine_tx_pending(d->s.tls) <= RING_BYTES);
}

static void on_events(struct test *t, int i, unsigned ev)
{
	struct side *d = &t->side[i];

	if (ev & GG_TLS_STREAM_EV_FAILED) {
		fprintf(stderr, "side %d failed: %s\n", i, gg_tls_stream_error(&d->s));
		exit(1);
	}
	if (ev & GG_TLS_STREAM_EV_OPEN) {
		CHECK_STR(gg_tls_engine_cipher(d->s.tls), "TLS_CHACHA20_POLY1305_SHA256");
		d->open = true;
	}
	if (ev & GG_TLS_STREAM_EV_DONE)
		d->live = false;
}

static void on_cqe(void *arg, const struct io_uring_cqe *cqe)
{
	struct test *t = arg;
	uint32_t i = gg_loop_ud_index(cqe->user_data);

	if (gg_loop_ud_kind(cqe->user_data) == GG_OP_ACCEPT) {
		char addr[GG_NET_ADDR_TEXT_MAX];
		struct gg_tls_engine *e;
		CHECK(cqe->res >= 0);
		struct gg_tls_engine_config cfg = {
			.role = GG_TLS_SERVER, .peer_addr = gg_net_peer_addr(cqe->res, addr, sizeof(addr)),
			.sites = &t->client_site, .site_count = 1, .rx_ring_bytes = RING_BYTES, .tx_ring_bytes = RING_BYTES,
		};
		struct gg_tls_stream_options so = { .send_max_bytes = 7001, .recv_max_bytes = 5003 };
		CHECK(gg_tls_engine_new(t->server_ctx, &cfg, &e) == 0);
		t->side[1].live = true;
		gg_tls_stream_accept(&t->side[1].s, &t->loop, 1, cqe->res, e, &so);
		return;
	}
	CHECK(i < 2 && t->side[i].live);
	on_events(t, (int)i, gg_tls_stream_on_cqe(&t->side[i].s, cqe));
}

static struct gg_tls_context *context(struct gg_tls_pki *pki, const char *identity, const char *suites)
{
	struct gg_tls_cert_request req = { .identity = identity, .valid_until_s = 3600 };
	struct gg_tls_context *ctx;
	char *cert, *key, err[256];

	CHECK(gg_tls_pki_issue(pki, &req, &cert, &key) == 0);
	struct gg_tls_options o = { .ca_pem = gg_tls_pki_ca_pem(pki), .cert_pem = cert, .key_pem = key, .ciphersuites = suites };
	if (gg_tls_context_new(&o, &ctx, err, sizeof(err))) {
		fprintf(stderr, "%s\n", err);
		exit(1);
	}
	free(cert);
	free(key);
	return ctx;
}

struct lone {
	struct gg_tls_stream s;
	unsigned ev;
};

static void on_lone_cqe(void *arg, const struct io_uring_cqe *cqe)
{
	struct lone *l = arg;

	l->ev |= gg_tls_stream_on_cqe(&l->s, cqe);
}

/* A dialed stream gets connect_timeout for its TCP connect, then
 * handshake_timeout for the handshake: the one it is in when it runs out
 * fails it, naming that deadline. `hang`: the listener's accept queue is
 * full, and Linux drops SYNs to a full queue (whatever syncookies and
 * tcp_abort_on_overflow say), so the connect never completes; else the
 * connect completes and nobody speaks TLS. */
static void test_deadline(struct gg_tls_context *ctx, const struct gg_tls_site *site, bool hang)
{
	struct gg_loop loop;
	struct lone l = { .ev = 0 };
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	const char *why;
	char addr[GG_NET_ADDR_TEXT_MAX];
	int fill[3], lfd;

	CHECK(gg_loop_init(&loop, 8) == 0);
	CHECK(gg_net_addr_parse("127.0.0.1:0", &ss, &len, &why) == 0);
	CHECK((lfd = gg_net_listen((struct sockaddr *)&ss, len, hang ? 0 : 8, 0)) >= 0);
	len = sizeof(ss);
	CHECK(getsockname(lfd, (struct sockaddr *)&ss, &len) == 0);
	/* A connection nobody accepts fills a queue of backlog 0; the others
	 * wait with the stream's. */
	for (int i = 0; i < 3; i++) {
		fill[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		CHECK(fill[i] >= 0);
		if (hang)
			(void)connect(fill[i], (struct sockaddr *)&ss, len);
		if (hang && i == 0) {
			struct pollfd p = { .fd = fill[0], .events = POLLOUT };
			CHECK(poll(&p, 1, 5000) == 1); /* connected: the queue is full */
		}
	}

	struct gg_tls_engine *e;
	struct gg_tls_engine_config cfg = {
		.role = GG_TLS_CLIENT, .peer_addr = gg_net_addr_format((struct sockaddr *)&ss, addr, sizeof(addr)),
		.sites = site, .site_count = 1, .rx_ring_bytes = RING_BYTES, .tx_ring_bytes = RING_BYTES,
	};
	struct gg_tls_stream_options so = { .connect_timeout_us = hang ? 200000 : 5000000,
					    .handshake_timeout_us = hang ? 5000000 : 300000 };
	CHECK(gg_tls_engine_new(ctx, &cfg, &e) == 0);
	uint64_t start = gg_monotonic_us();
	CHECK(gg_tls_stream_connect(&l.s, &loop, 0, (struct sockaddr *)&ss, len, e, &so) == 0);
	while (!(l.ev & GG_TLS_STREAM_EV_DONE)) {
		CHECK(gg_loop_run(&loop, 20000, on_lone_cqe, &l) >= 0);
		l.ev |= gg_tls_stream_tick(&l.s, gg_monotonic_us());
		CHECK(gg_monotonic_us() - start < 4000000u);
	}
	uint64_t ms = (gg_monotonic_us() - start) / 1000;
	printf("%s: failed after %llu ms: %s\n", hang ? "a connect that never completes" : "a peer that never speaks TLS",
	       (unsigned long long)ms, gg_tls_stream_error(&l.s));
	CHECK(ms >= (hang ? 190 : 290) && ms < 2000);
	if (hang)
		CHECK_CONTAINS(gg_tls_stream_error(&l.s), "connection not established within 200 ms");
	else
		CHECK_CONTAINS(gg_tls_stream_error(&l.s), "300 ms");
	for (int i = 0; i < 3; i++)
		close(fill[i]);
	close(lfd);
	gg_loop_fini(&loop);
}

int main(void)
{
	static struct test t;
	struct gg_tls_pki *pki;
	struct gg_tls_context *client_ctx;
	struct gg_tls_site server_site;
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	const char *why;
	char addr[GG_NET_ADDR_TEXT_MAX];

	CHECK(gg_tls_pki_new("Test CA", &pki) == 0);
	t.server_ctx = context(pki, "dns:site-b.gradgate.test", NULL);
	client_ctx = context(pki, "uri:spiffe://gradgate/site-a", "TLS_CHACHA20_POLY1305_SHA256");
	CHECK(gg_tls_site_init(&t.client_site, "site-a", "uri:spiffe://gradgate/site-a", &why) == 0);
	CHECK(gg_tls_site_init(&server_site, "site-b", "dns:site-b.gradgate.test", &why) == 0);
	CHECK((t.pattern = malloc(TOTAL_BYTES)));
	for (uint64_t i = 0; i < TOTAL_BYTES; i++)
		t.pattern[i] = pattern_at(i);

	CHECK(gg_loop_init(&t.loop, 32) == 0);
	CHECK(gg_net_addr_parse("127.0.0.1:0", &ss, &len, &why) == 0);
	CHECK((t.listen_fd = gg_net_listen((struct sockaddr *)&ss, len, 8, 0)) >= 0);
	len = sizeof(ss);
	CHECK(getsockname(t.listen_fd, (struct sockaddr *)&ss, &len) == 0);
	CHECK(gg_loop_accept(&t.loop, t.listen_fd, gg_loop_ud(GG_OP_ACCEPT, 0, 0)) == 0);

	struct gg_tls_engine *e;
	struct gg_tls_engine_config cfg = {
		.role = GG_TLS_CLIENT, .peer_addr = gg_net_addr_format((struct sockaddr *)&ss, addr, sizeof(addr)),
		.sites = &server_site, .site_count = 1, .rx_ring_bytes = RING_BYTES, .tx_ring_bytes = RING_BYTES,
	};
	struct gg_tls_stream_options so = { .send_max_bytes = 6007, .recv_max_bytes = 3001 };
	CHECK(gg_tls_engine_new(client_ctx, &cfg, &e) == 0);
	t.side[0].live = true;
	CHECK(gg_tls_stream_connect(&t.side[0].s, &t.loop, 0, (struct sockaddr *)&ss, len, e, &so) == 0);

	uint64_t start = gg_monotonic_us();
	while (t.side[0].live || t.side[1].live) {
		CHECK(gg_loop_run(&t.loop, 100000, on_cqe, &t) >= 0);
		for (int i = 0; i < 2; i++) {
			if (!t.side[i].live)
				continue;
			on_events(&t, i, gg_tls_stream_tick(&t.side[i].s, t.loop.now_us));
			pump_side(&t, i);
			on_events(&t, i, gg_tls_stream_tick(&t.side[i].s, t.loop.now_us));
		}
		CHECK(gg_monotonic_us() - start < 30000000u);
	}
	CHECK_EQ_INT(t.side[0].got, TOTAL_BYTES);
	CHECK_EQ_INT(t.side[1].echoed, TOTAL_BYTES);
	CHECK(t.side[0].peer_closed && t.side[1].peer_closed);
	CHECK_EQ_INT(t.side[0].s.wire_out_bytes, t.side[1].s.wire_in_bytes);
	CHECK_EQ_INT(t.side[1].s.wire_out_bytes, t.side[0].s.wire_in_bytes);
	CHECK(t.side[0].s.fd == -1 && t.side[1].s.fd == -1);

	close(t.listen_fd);
	gg_loop_fini(&t.loop);
	test_deadline(client_ctx, &server_site, true);
	test_deadline(client_ctx, &server_site, false);
	gg_tls_context_free(client_ctx);
	gg_tls_context_free(t.server_ctx);
	gg_tls_pki_free(pki);
	free(t.pattern);
	printf("test_tls_stream: ok\n");
	return 0;
}
