/* The engine's record layer against OpenSSL's own, over memory BIOs, in
 * both roles and with every suite: data of many sizes read in tiny and
 * huge pieces, KeyUpdate from either side, close_notify both ways; then
 * records built by hand with the peer's traffic key, each of which must
 * be refused with its alert and message while nothing decrypted is handed
 * out; and no traffic secret or key in anything the process prints. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>

#include "log.h"
#include "tls_engine.h"
#include "tls_pki.h"
#include "tls_test.h"

#define CLIENT_ADDR "10.0.0.1:40000" /* as the server engine names its peer */
#define SERVER_ADDR "10.0.0.2:7001"
#define EXPECT_CLIENT " (expected identity dns:site-a.gradgate.test"
#define KEY_UPDATE_RECORD 27 /* 5 + 4 + 1 + 1 + 16 */
#define ALERT_RECORD 24 /* 5 + 2 + 1 + 16, close_notify too */

static struct gg_tls_pki *ca;

static const char *const suite_names[] = {
	"TLS_AES_256_GCM_SHA384", "TLS_AES_128_GCM_SHA256", "TLS_CHACHA20_POLY1305_SHA256",
};

/* What OpenSSL's side of the connection logged: the secrets the test
 * builds its own records with, and looks for in the process's output. */
static struct {
	uint8_t client[EVP_MAX_MD_SIZE], server[EVP_MAX_MD_SIZE];
	size_t len;
} logged;

static void keylog(const SSL *ssl, const char *line)
{
	const char *hex = strrchr(line, ' ') + 1;

	if (!strncmp(line, "CLIENT_TRAFFIC_SECRET_0", 23))
		CHECK(OPENSSL_hexstr2buf_ex(logged.client, sizeof(logged.client), &logged.len, hex, '\0'));
	else if (!strncmp(line, "SERVER_TRAFFIC_SECRET_0", 23))
		CHECK(OPENSSL_hexstr2buf_ex(logged.server, sizeof(logged.server), &logged.len, hex, '\0'));
}

static int select_alpn(SSL *ssl, const unsigned char **out, unsigned char *outlen, const unsigned char *in,
		       unsigned int inlen, void *arg)
{
	static const unsigned char want[] = "\x0agradgate/1";

	return SSL_select_next_proto((unsigned char **)out, outlen, want, sizeof(want) - 1, in, inlen) ==
			       OPENSSL_NPN_NEGOTIATED ? SSL_TLSEXT_ERR_OK : SSL_TLSEXT_ERR_ALERT_FATAL;
}

/* One end of a connection: an engine, or an OpenSSL SSL over two memory
 * BIOs (it reads rbio, writes wbio). */
struct end {
	struct gg_tls_engine *e;
	struct gg_tls_context *ctx;
	SSL_CTX *ssl_ctx;
	SSL *ssl;
	BIO *rbio, *wbio;
	size_t sent, received; /* ciphertext moved, handshake included */
};

enum kind { OURS, OPENSSL };

struct options {
	uint32_t key_update_records; /* engines */
	size_t ring_bytes;           /* engines */
	int tickets;                 /* an OpenSSL server's NewSessionTickets */
};

static void issue(bool server, char **cert, char **key)
{
	struct gg_tls_cert_request req = {
		.identity = server ? "dns:site-b.gradgate.test" : "dns:site-a.gradgate.test", .valid_until_s = 3600,
	};
	CHECK(gg_tls_pki_issue(ca, &req, cert, key) == 0);
}

static SSL_CTX *openssl_ctx(bool server, const char *suite, int tickets)
{
	SSL_CTX *sc = SSL_CTX_new(TLS_method());
	char *cert_pem, *key_pem;

	issue(server, &cert_pem, &key_pem);
	BIO *cb = BIO_new_mem_buf(cert_pem, -1), *kb = BIO_new_mem_buf(key_pem, -1);
	BIO *ab = BIO_new_mem_buf(gg_tls_pki_ca_pem(ca), -1);
	X509 *cert = PEM_read_bio_X509(cb, NULL, NULL, NULL), *ca_cert = PEM_read_bio_X509(ab, NULL, NULL, NULL);
	EVP_PKEY *key = PEM_read_bio_PrivateKey(kb, NULL, NULL, NULL);
	CHECK(sc && cert && ca_cert && key);
	CHECK(SSL_CTX_set_min_proto_version(sc, TLS1_3_VERSION) && SSL_CTX_set_ciphersuites(sc, suite) &&
	      SSL_CTX_use_certificate(sc, cert) && SSL_CTX_use_PrivateKey(sc, key) &&
	      X509_STORE_add_cert(SSL_CTX_get_cert_store(sc), ca_cert) && SSL_CTX_set_num_tickets(sc, (size_t)tickets));
	SSL_CTX_set_verify(sc, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
	SSL_CTX_set_keylog_callback(sc, keylog);
	if (server)
		SSL_CTX_set_alpn_select_cb(sc, select_alpn, NULL);
	else
		CHECK(SSL_CTX_set_alpn_protos(sc, (const unsigned char *)"\x0agradgate/1", 11) == 0);
	X509_free(cert);
	X509_free(ca_cert);
	EVP_PKEY_free(key);
	BIO_free(cb);
	BIO_free(kb);
	BIO_free(ab);
	free(cert_pem);
	free(key_pem);
	return sc;
}

static struct gg_tls_context *engine_ctx(bool server, const char *suite)
{
	struct gg_tls_context *ctx = NULL;
	char *cert, *key, err[256] = "";

	issue(server, &cert, &key);
	struct gg_tls_options o = { .ca_pem = gg_tls_pki_ca_pem(ca), .cert_pem = cert, .key_pem = key, .ciphersuites = suite };
	int rc = gg_tls_context_new(&o, &ctx, err, sizeof(err));
	free(cert);
	free(key);
	CHECK_STR(err, "");
	CHECK_EQ_INT(rc, 0);
	return ctx;
}

static struct end end_new(enum kind kind, bool server, const char *suite, const struct options *o)
{
	struct end x = { 0 };
	const char *why;

	if (kind == OURS) {
		struct gg_tls_site site;
		CHECK(gg_tls_site_init(&site, server ? "site-a" : "site-b",
				       server ? "dns:site-a.gradgate.test" : "dns:site-b.gradgate.test", &why) == 0);
		struct gg_tls_engine_config cfg = {
			.role = server ? GG_TLS_SERVER : GG_TLS_CLIENT, .peer_addr = server ? CLIENT_ADDR : SERVER_ADDR,
			.sites = &site, .site_count = 1, .rx_ring_bytes = o->ring_bytes, .tx_ring_bytes = o->ring_bytes,
			.key_update_records = o->key_update_records,
		};
		x.ctx = engine_ctx(server, suite);
		CHECK(gg_tls_engine_new(x.ctx, &cfg, &x.e) == 0);
		return x;
	}
	x.ssl_ctx = openssl_ctx(server, suite, o->tickets);
	CHECK((x.ssl = SSL_new(x.ssl_ctx)) && (x.rbio = BIO_new(BIO_s_mem())) && (x.wbio = BIO_new(BIO_s_mem())));
	BIO_set_mem_eof_return(x.rbio, -1);
	SSL_set_bio(x.ssl, x.rbio, x.wbio);
	if (server)
		SSL_set_accept_state(x.ssl);
	else
		SSL_set_connect_state(x.ssl);
	return x;
}

static void end_free(struct end *x)
{
	gg_tls_engine_free(x->e);
	gg_tls_context_free(x->ctx);
	SSL_free(x->ssl);
	SSL_CTX_free(x->ssl_ctx);
}

static int end_handshake(struct end *x)
{
	if (x->e)
		return gg_tls_engine_handshake(x->e);
	int ret = SSL_do_handshake(x->ssl);
	if (ret == 1)
		return 0;
	return SSL_get_error(x->ssl, ret) == SSL_ERROR_WANT_READ ? -EAGAIN : -EPROTO;
}

static ssize_t end_write(struct end *x, const void *buf, size_t len)
{
	size_t written;

	if (x->e)
		return gg_tls_engine_write(x->e, buf, len);
	CHECK(SSL_write_ex(x->ssl, buf, len, &written) == 1);
	return (ssize_t)written;
}

/* Bytes, 0 at close_notify, -EAGAIN, or -EPROTO (for OpenSSL, the reason
 * is left in its error queue). */
static ssize_t end_read(struct end *x, void *buf, size_t len)
{
	size_t got;

	if (x->e)
		return gg_tls_engine_read(x->e, buf, len);
	if (SSL_read_ex(x->ssl, buf, len, &got))
		return (ssize_t)got;
	switch (SSL_get_error(x->ssl, 0)) {
	case SSL_ERROR_WANT_READ:
		return -EAGAIN;
	case SSL_ERROR_ZERO_RETURN:
		return 0;
	default:
		return -EPROTO;
	}
}

/* Moves all the ciphertext `to` takes from `from`; returns the bytes. */
static size_t move(struct end *from, struct end *to)
{
	size_t moved = 0;

	for (;;) {
		const uint8_t *src;
		uint8_t *dst = NULL;
		size_t n, space = to->e ? gg_tls_engine_rx_space(to->e, &dst) : SIZE_MAX;
		if (from->e) {
			n = GG_MIN(gg_tls_engine_tx_data(from->e, &src), space);
			if (!n)
				break;
			if (to->e)
				memcpy(dst, src, n);
			else
				CHECK(BIO_write(to->rbio, src, (int)n) == (int)n);
			gg_tls_engine_tx_consume(from->e, n);
		} else {
			CHECK(to->e);
			int got = BIO_read(from->wbio, dst, (int)GG_MIN(space, (size_t)INT_MAX));
			if (got <= 0)
				break;
			n = (size_t)got;
		}
		if (to->e)
			gg_tls_engine_rx_commit(to->e, n);
		moved += n;
	}
	from->sent += moved;
	to->received += moved;
	return moved;
}

/* Hands ciphertext made by the test to an engine. */
static void feed(struct end *x, const uint8_t *bytes, size_t len)
{
	while (len) {
		uint8_t *dst;
		size_t n = GG_MIN(gg_tls_engine_rx_space(x->e, &dst), len);
		CHECK(n);
		memcpy(dst, bytes, n);
		gg_tls_engine_rx_commit(x->e, n);
		bytes += n;
		len -= n;
	}
}

/* What OpenSSL wrote and has not been moved yet. */
static size_t take(struct end *x, uint8_t *buf, size_t size)
{
	int n = BIO_read(x->wbio, buf, (int)size);
	return n > 0 ? (size_t)n : 0;
}

struct pair {
	struct end c, s;
};

/* Runs the handshake. With `first`, the client writes it the moment its
 * handshake completes, so that the server gets it with the client's
 * Finished, and the server checks it right after its own handshake. */
static struct pair connect_pair(enum kind client, enum kind server, const char *suite, const struct options *o,
				const char *first)
{
	struct pair p = { end_new(client, false, suite, o), end_new(server, true, suite, o) };
	int crc = -EAGAIN, src = -EAGAIN;
	char buf[64];

	memset(&logged, 0, sizeof(logged));
	for (int round = 0; round < 20 && (crc || src); round++) {
		if (crc == -EAGAIN && !(crc = end_handshake(&p.c)) && first)
			CHECK_EQ_INT(end_write(&p.c, first, strlen(first)), strlen(first));
		move(&p.c, &p.s);
		if (src == -EAGAIN)
			src = end_handshake(&p.s);
		move(&p.s, &p.c);
	}
	CHECK_EQ_INT(crc, 0);
	CHECK_EQ_INT(src, 0);
	if (first) {
		CHECK_EQ_INT(end_read(&p.s, buf, sizeof(buf)), strlen(first));
		CHECK(!memcmp(buf, first, strlen(first)));
	}
	CHECK(logged.len || (client == OURS && server == OURS));
	return p;
}

static void pair_free(struct pair *p)
{
	end_free(&p->c);
	end_free(&p->s);
}

static uint8_t pattern(uint64_t seed, size_t i)
{
	return (uint8_t)((i + seed) * 2654435761u >> 13);
}

/* Sends `total` bytes from a to b in writes of `wchunk` and reads of
 * `rchunk`, moving ciphertext both ways (KeyUpdate answers go back), and
 * checks every byte. Returns the ciphertext bytes a sent. */
static size_t transfer(struct end *a, struct end *b, size_t total, size_t wchunk, size_t rchunk)
{
	static uint64_t seed;
	uint8_t *src = malloc(total + 1), *dst = malloc(total + 1), tail;
	size_t sent = 0, got = 0, wire = 0;
	int stalls = 0;

	CHECK(src && dst);
	seed += 7919;
	for (size_t i = 0; i < total; i++)
		src[i] = pattern(seed, i);
	memset(dst, 0xa5, total + 1);
	while (got < total) {
		size_t progress = 0, moved;
		if (sent < total) {
			ssize_t w = end_write(a, src + sent, GG_MIN(wchunk, total - sent));
			CHECK(w > 0 || w == -EAGAIN);
			if (w > 0) {
				sent += (size_t)w;
				progress += (size_t)w;
			}
		}
		moved = move(a, b);
		wire += moved;
		ssize_t r = end_read(b, dst + got, GG_MIN(rchunk, total - got));
		CHECK(r > 0 || r == -EAGAIN);
		if (r > 0) {
			got += (size_t)r;
			progress += (size_t)r;
		}
		progress += moved + move(b, a);
		stalls = progress ? 0 : stalls + 1;
		CHECK(stalls < 3);
	}
	CHECK(!memcmp(src, dst, total));
	CHECK_EQ_INT(dst[total], 0xa5);
	/* a takes in what b answered; either may have closed its end before */
	ssize_t ra = end_read(a, &tail, 1), rb = end_read(b, &tail, 1);
	CHECK(ra == -EAGAIN || ra == 0);
	CHECK(rb == -EAGAIN || rb == 0);
	free(src);
	free(dst);
	return wire;
}

static void test_interop(void)
{
	static const size_t sizes[] = { 1, 7, 16383, 16384, 16385, (1u << 20) + 7 };
	const struct options o = { .tickets = 2 };

	for (size_t s = 0; s < GG_ARRAY_LEN(suite_names); s++) {
		for (int engine_server = 0; engine_server < 2; engine_server++) {
			struct pair p = connect_pair(engine_server ? OPENSSL : OURS, engine_server ? OURS : OPENSSL,
						     suite_names[s], &o, NULL);
			struct end *engine = engine_server ? &p.s : &p.c, *peer = engine_server ? &p.c : &p.s;
			CHECK_STR(gg_tls_engine_cipher(engine->e), suite_names[s]);
			CHECK_EQ_INT(gg_tls_engine_write(engine->e, "", 0), 0);
			CHECK_EQ_INT(gg_tls_engine_tx_pending(engine->e), 0);
			for (size_t i = 0; i < GG_ARRAY_LEN(sizes); i++) {
				size_t n = sizes[i], tiny = n < 100000 ? 1 : 13;
				transfer(engine, peer, n, n, n);
				transfer(peer, engine, n, n, n);
				transfer(engine, peer, n, 4097, 3 * n);
				transfer(peer, engine, n, 4097, tiny);
				transfer(peer, engine, n, n, 3 * n);
				transfer(peer, engine, n, 16384, 16384);
			}
			pair_free(&p);
		}
	}
}

/* The server gets the client's first bytes with its Finished; the engine
 * client's first bytes go out right after its own. */
static void test_data_right_after_finished(void)
{
	const struct options o = { .tickets = 2 };
	struct pair p = connect_pair(OPENSSL, OURS, suite_names[0], &o, "sent with the Finished");

	transfer(&p.s, &p.c, 100, 100, 100);
	pair_free(&p);
	p = connect_pair(OURS, OPENSSL, suite_names[1], &o, "sent right after the Finished");
	transfer(&p.s, &p.c, 100, 100, 100);
	pair_free(&p);
}

static void test_writev(void)
{
	const struct options o = { 0 };
	struct pair p = connect_pair(OURS, OPENSSL, suite_names[0], &o, NULL);
	static uint8_t body[40000], got[40100], pieces[4000];
	uint8_t head[20];
	struct iovec v[] = { { head, sizeof(head) }, { body, sizeof(body) } };

	for (size_t i = 0; i < sizeof(body); i++)
		body[i] = pattern(1, i);
	memset(head, 'h', sizeof(head));
	/* The head shares the first record with the body: three records. */
	CHECK_EQ_INT(gg_tls_engine_writev(p.c.e, v, 2), sizeof(head) + sizeof(body));
	CHECK_EQ_INT(gg_tls_engine_tx_pending(p.c.e), sizeof(head) + sizeof(body) + 3 * 22);
	move(&p.c, &p.s);
	size_t n = 0;
	for (ssize_t r; n < sizeof(head) + sizeof(body) && (r = end_read(&p.s, got + n, sizeof(got) - n)) > 0;)
		n += (size_t)r;
	CHECK_EQ_INT(n, sizeof(head) + sizeof(body));
	CHECK(!memcmp(got, head, sizeof(head)) && !memcmp(got + sizeof(head), body, sizeof(body)));

	/* Many small buffers, empty ones among them, make one record. */
	struct iovec many[600];
	size_t total = 0;
	for (size_t i = 0; i < GG_ARRAY_LEN(many); i++) {
		size_t len = i % 7 == 3 ? 0 : i % 11;
		many[i] = (struct iovec){ body + total, len };
		total += len;
	}
	CHECK_EQ_INT(gg_tls_engine_writev(p.c.e, many, (int)GG_ARRAY_LEN(many)), total);
	CHECK_EQ_INT(gg_tls_engine_tx_pending(p.c.e), total + 22);
	move(&p.c, &p.s);
	CHECK_EQ_INT(end_read(&p.s, pieces, sizeof(pieces)), total);
	CHECK(!memcmp(pieces, body, total));
	CHECK_EQ_INT(gg_tls_engine_writev(p.c.e, many, -1), -EINVAL);
	pair_free(&p);
}

/* Sends whole records from w to r until the ring whose bytes *count
 * counts is `before_end` bytes short of its end. */
static void fill_ring(struct end *w, struct end *r, const size_t *count, size_t before_end)
{
	const size_t ring = GG_TLS_RING_MIN_BYTES, full = GG_TLS_RECORD_PLAINTEXT_MAX + 22;
	size_t gap = (2 * ring - before_end - *count % ring) % ring;

	if (gap && gap < 22)
		gap += ring;
	while (gap) {
		size_t rec = GG_MIN(gap, full);
		if (gap - rec && gap - rec < 22)
			rec = gap - 22;
		transfer(w, r, rec - 22, rec - 22, rec - 22);
		gap -= rec;
	}
}

/* A record split by the end of a ring anywhere: in its header, content,
 * content type or tag, in the engine's tx ring and in its rx ring. */
static void test_ring_wrap(void)
{
	const struct options o = { .ring_bytes = GG_TLS_RING_MIN_BYTES };

	for (int engine_reads = 0; engine_reads < 2; engine_reads++) {
		struct pair p = connect_pair(OURS, OPENSSL, suite_names[engine_reads], &o, NULL);
		struct end *w = engine_reads ? &p.s : &p.c, *r = engine_reads ? &p.c : &p.s;
		const size_t *count = engine_reads ? &p.c.received : &p.c.sent;
		for (size_t before_end = 1; before_end <= 42; before_end++) {
			fill_ring(w, r, count, before_end);
			CHECK_EQ_INT(*count % GG_TLS_RING_MIN_BYTES, GG_TLS_RING_MIN_BYTES - before_end);
			transfer(w, r, 20, 20, 20);
		}
		pair_free(&p);
	}
}

/* OpenSSL moves its keys on, with and without asking for ours: the
 * engine follows and answers with exactly one KeyUpdate record. */
static void test_key_update_from_openssl(void)
{
	const struct options o = { .tickets = 2 };
	char byte;

	for (int engine_server = 0; engine_server < 2; engine_server++) {
		struct pair p = connect_pair(engine_server ? OPENSSL : OURS, engine_server ? OURS : OPENSSL,
					     suite_names[engine_server ? 2 : 0], &o, NULL);
		struct end *engine = engine_server ? &p.s : &p.c, *peer = engine_server ? &p.c : &p.s;
		for (int i = 0; i < 40; i++) {
			bool requested = i % 2;
			CHECK(SSL_key_update(peer->ssl, requested ? SSL_KEY_UPDATE_REQUESTED : SSL_KEY_UPDATE_NOT_REQUESTED));
			CHECK_EQ_INT(end_write(peer, "k", 1), 1);
			move(peer, engine);
			CHECK_EQ_INT(end_read(engine, &byte, 1), 1);
			CHECK_EQ_INT(byte, 'k');
			CHECK_EQ_INT(gg_tls_engine_tx_pending(engine->e), requested ? KEY_UPDATE_RECORD : 0);
			transfer(peer, engine, 30000 + (size_t)i, 7000, 5000);
			transfer(engine, peer, 20000 + (size_t)i, 9000, 20000);
		}
		pair_free(&p);
	}
}

/* A KeyUpdate the peer asked for waits for room in a full tx ring, and
 * then goes out before the next record. */
static void test_key_update_answer_waits(void)
{
	const struct options o = { .ring_bytes = GG_TLS_RING_MIN_BYTES };
	struct pair p = connect_pair(OPENSSL, OURS, suite_names[0], &o, NULL);
	uint8_t buf[200];
	size_t records = 0;

	while (gg_tls_engine_write(p.s.e, "x", 1) == 1)
		records++;
	size_t pending = gg_tls_engine_tx_pending(p.s.e);
	CHECK_EQ_INT(pending, records * 23);
	CHECK(GG_TLS_RING_MIN_BYTES - pending < KEY_UPDATE_RECORD + ALERT_RECORD);
	CHECK(SSL_key_update(p.c.ssl, SSL_KEY_UPDATE_REQUESTED));
	CHECK_EQ_INT(end_write(&p.c, "k", 1), 1);
	move(&p.c, &p.s);
	CHECK_EQ_INT(end_read(&p.s, buf, 1), 1);
	CHECK_EQ_INT(gg_tls_engine_tx_pending(p.s.e), pending);
	move(&p.s, &p.c);
	for (size_t i = 0; i < records; i++)
		CHECK_EQ_INT(end_read(&p.c, buf, 1), 1);
	memset(buf, 'y', 100);
	CHECK_EQ_INT(gg_tls_engine_write(p.s.e, buf, 100), 100);
	CHECK_EQ_INT(gg_tls_engine_tx_pending(p.s.e), KEY_UPDATE_RECORD + 100 + 22);
	move(&p.s, &p.c);
	CHECK_EQ_INT(end_read(&p.c, buf, sizeof(buf)), 100);
	transfer(&p.c, &p.s, 50000, 50000, 50000);
	pair_free(&p);
}

/* The engine moves its own write key on after key_update_records
 * records: OpenSSL and another engine follow, data intact, and the wire
 * holds exactly one KeyUpdate per that many records. */
static void test_key_update_from_engine(void)
{
	const struct options o = { .key_update_records = 3, .tickets = 2 };
	size_t total = (1u << 20) + 7, records = 65; /* 64 full ones */

	for (size_t s = 0; s < GG_ARRAY_LEN(suite_names); s++) {
		struct pair p = connect_pair(OURS, OPENSSL, suite_names[s], &o, NULL);
		CHECK_EQ_INT(transfer(&p.c, &p.s, total, 65536, 100000), total + records * 22 + (records - 1) / 3 * KEY_UPDATE_RECORD);
		transfer(&p.s, &p.c, total, 65536, 100000);
		pair_free(&p);

		p = connect_pair(OPENSSL, OURS, suite_names[s], &o, NULL);
		transfer(&p.s, &p.c, total, 3000, 777);
		pair_free(&p);
	}
	const struct options both = { .key_update_records = 1 };
	struct pair p = connect_pair(OURS, OURS, suite_names[0], &both, NULL);
	CHECK_EQ_INT(transfer(&p.c, &p.s, total, 65536, 100000), total + records * 22 + (records - 1) * KEY_UPDATE_RECORD);
	transfer(&p.s, &p.c, total, 1 << 20, 333);
	pair_free(&p);
	/* Crossing KeyUpdates: OpenSSL asks while the engine moves on by itself. */
	p = connect_pair(OPENSSL, OURS, suite_names[2], &o, NULL);
	for (int i = 0; i < 10; i++) {
		CHECK(SSL_key_update(p.c.ssl, SSL_KEY_UPDATE_REQUESTED));
		transfer(&p.c, &p.s, 40000, 40000, 40000);
		transfer(&p.s, &p.c, 100000, 100000, 100000);
	}
	pair_free(&p);

	struct gg_tls_context *ctx = engine_ctx(false, NULL);
	struct gg_tls_site site = { "site-b", { GG_TLS_IDENTITY_DNS, "site-b.gradgate.test" }, false };
	struct gg_tls_engine_config cfg = {
		.role = GG_TLS_CLIENT, .sites = &site, .site_count = 1,
		.key_update_records = GG_TLS_KEY_UPDATE_RECORDS_DEFAULT + 1,
	};
	struct gg_tls_engine *e;
	CHECK_EQ_INT(gg_tls_engine_new(ctx, &cfg, &e), -EINVAL);
	gg_tls_context_free(ctx);
}

static void test_close_notify(void)
{
	const struct options o = { .tickets = 2 };
	struct pair p = connect_pair(OURS, OPENSSL, suite_names[1], &o, NULL);
	char buf[16];

	CHECK_EQ_INT(gg_tls_engine_shutdown(p.c.e), 0);
	CHECK_EQ_INT(gg_tls_engine_tx_pending(p.c.e), ALERT_RECORD);
	CHECK_EQ_INT(gg_tls_engine_shutdown(p.c.e), 0);
	CHECK_EQ_INT(gg_tls_engine_tx_pending(p.c.e), ALERT_RECORD);
	CHECK_EQ_INT(gg_tls_engine_write(p.c.e, "late", 4), -EPIPE);
	move(&p.c, &p.s);
	CHECK_EQ_INT(end_read(&p.s, buf, sizeof(buf)), 0);
	/* Each direction closes on its own. */
	transfer(&p.s, &p.c, 70000, 70000, 70000);
	CHECK_EQ_INT(SSL_shutdown(p.s.ssl), 1);
	move(&p.s, &p.c);
	CHECK_EQ_INT(gg_tls_engine_read(p.c.e, buf, sizeof(buf)), 0);
	CHECK_EQ_INT(gg_tls_engine_read(p.c.e, buf, sizeof(buf)), 0);
	CHECK_EQ_INT(gg_tls_engine_failure(p.c.e), GG_TLS_OK);
	pair_free(&p);

	p = connect_pair(OPENSSL, OURS, suite_names[2], &o, NULL);
	CHECK_EQ_INT(SSL_shutdown(p.c.ssl), 0);
	move(&p.c, &p.s);
	CHECK_EQ_INT(gg_tls_engine_read(p.s.e, buf, sizeof(buf)), 0);
	transfer(&p.s, &p.c, 20000, 20000, 20000);
	CHECK_EQ_INT(gg_tls_engine_shutdown(p.s.e), 0);
	move(&p.s, &p.c);
	CHECK_EQ_INT(end_read(&p.c, buf, sizeof(buf)), 0);
	pair_free(&p);
}

/* ---- records built by hand ---------------------------------------- */

struct suite_keys {
	const char *name, *cipher, *digest;
	size_t key_bytes, hash_bytes;
};

static const struct suite_keys suite_keys[] = {
	{ "TLS_AES_256_GCM_SHA384", "AES-256-GCM", "SHA384", 32, 48 },
	{ "TLS_AES_128_GCM_SHA256", "AES-128-GCM", "SHA256", 16, 32 },
	{ "TLS_CHACHA20_POLY1305_SHA256", "ChaCha20-Poly1305", "SHA256", 32, 32 },
};

/* OpenSSL's write side, redone with its TLS13-KDF: the test's own record
 * protection, to send what no TLS stack would. */
struct forger {
	const struct suite_keys *suite;
	uint8_t secret[EVP_MAX_MD_SIZE], key[32], iv[12];
	uint64_t seq;
};

static void tls13_expand(const struct suite_keys *s, const uint8_t *secret, const char *label, uint8_t *out, size_t len)
{
	EVP_KDF *kdf = EVP_KDF_fetch(NULL, OSSL_KDF_NAME_TLS1_3_KDF, NULL);
	EVP_KDF_CTX *kctx = EVP_KDF_CTX_new(kdf);
	int mode = EVP_KDF_HKDF_MODE_EXPAND_ONLY;
	OSSL_PARAM params[] = {
		OSSL_PARAM_construct_int(OSSL_KDF_PARAM_MODE, &mode),
		OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, (char *)s->digest, 0),
		OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, (void *)secret, s->hash_bytes),
		OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_PREFIX, "tls13 ", 6),
		OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_LABEL, (void *)label, strlen(label)),
		OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_DATA, "", 0),
		OSSL_PARAM_construct_end(),
	};
	CHECK(kctx && EVP_KDF_derive(kctx, out, len, params) > 0);
	EVP_KDF_CTX_free(kctx);
	EVP_KDF_free(kdf);
}

static void forger_keys(struct forger *f)
{
	tls13_expand(f->suite, f->secret, "key", f->key, f->suite->key_bytes);
	tls13_expand(f->suite, f->secret, "iv", f->iv, sizeof(f->iv));
	f->seq = 0;
}

static void forger_update(struct forger *f)
{
	uint8_t next[EVP_MAX_MD_SIZE];

	tls13_expand(f->suite, f->secret, "traffic upd", next, f->suite->hash_bytes);
	memcpy(f->secret, next, f->suite->hash_bytes);
	forger_keys(f);
}

/* Protects `inner` (content, type, padding) as one record into out;
 * returns its size. */
static size_t forge(struct forger *f, const uint8_t *inner, size_t len, uint8_t *out)
{
	EVP_CIPHER *cipher = EVP_CIPHER_fetch(NULL, f->suite->cipher, NULL);
	EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
	uint8_t nonce[12];
	int outl;

	memcpy(nonce, f->iv, sizeof(nonce));
	for (int i = 0; i < 8; i++)
		nonce[11 - i] ^= (uint8_t)(f->seq >> (8 * i));
	out[0] = 23;
	out[1] = out[2] = 3;
	out[3] = (uint8_t)((len + 16) >> 8);
	out[4] = (uint8_t)(len + 16);
	CHECK(c && cipher && EVP_EncryptInit_ex(c, cipher, NULL, f->key, nonce) &&
	      EVP_EncryptUpdate(c, NULL, &outl, out, 5) && EVP_EncryptUpdate(c, out + 5, &outl, inner, (int)len) &&
	      EVP_EncryptFinal_ex(c, out + 5 + len, &outl) &&
	      EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_GET_TAG, 16, out + 5 + len));
	EVP_CIPHER_CTX_free(c);
	EVP_CIPHER_free(cipher);
	f->seq++;
	return 5 + len + 16;
}

/* An engine server whose OpenSSL client has sent nothing since its
 * Finished, and a forger with that client's write key. */
struct forged {
	struct pair p;
	struct forger f;
};

static struct forged forged_pair(size_t suite)
{
	const struct options o = { 0 };
	struct forged x = { connect_pair(OPENSSL, OURS, suite_keys[suite].name, &o, NULL), { .suite = &suite_keys[suite] } };

	memcpy(x.f.secret, logged.client, suite_keys[suite].hash_bytes);
	forger_keys(&x.f);
	return x;
}

static void send_forged(struct forged *x, const void *inner, size_t len)
{
	static uint8_t rec[20000];

	feed(&x->p.s, rec, forge(&x->f, inner, len, rec));
}

/* The engine refuses what it was fed: the read fails with `msg`, leaves
 * nothing but its sentinel or zeros in the caller's buffer, fails again
 * after, and OpenSSL gets `alert` (-1: nothing is sent). */
static void expect_refused(struct forged *x, int rc, enum gg_tls_failure failure, const char *msg, int alert)
{
	static uint8_t buf[40000];
	struct gg_tls_engine *e = x->p.s.e;

	memset(buf, 0xa5, sizeof(buf));
	CHECK_EQ_INT(gg_tls_engine_read(e, buf, sizeof(buf)), rc);
	CHECK_EQ_INT(gg_tls_engine_failure(e), failure);
	CHECK_STR(gg_tls_engine_error(e), msg);
	for (size_t i = 0; i < sizeof(buf); i++)
		CHECK(buf[i] == 0xa5 || buf[i] == 0);
	CHECK_EQ_INT(gg_tls_engine_read(e, buf, 1), rc);
	CHECK_EQ_INT(gg_tls_engine_write(e, "x", 1), rc);
	if (alert < 0) {
		CHECK_EQ_INT(gg_tls_engine_tx_pending(e), 0);
	} else {
		CHECK_EQ_INT(gg_tls_engine_tx_pending(e), ALERT_RECORD);
		move(&x->p.s, &x->p.c);
		ERR_clear_error();
		CHECK_EQ_INT(end_read(&x->p.c, buf, 1), -EPROTO);
		CHECK_EQ_INT(ERR_GET_REASON(ERR_peek_error()), SSL_AD_REASON_OFFSET + alert);
		ERR_clear_error();
	}
	pair_free(&x->p);
}

#define TLS_FAILURE(what, alert) "peer " CLIENT_ADDR ": TLS failure: " what EXPECT_CLIENT "; sent alert " alert ")"

static void test_tampered(void)
{
	static uint8_t rec[20000];
	uint8_t secret[] = "decrypted bytes never handed out";
	size_t n;

	for (size_t s = 0; s < GG_ARRAY_LEN(suite_keys); s++) {
		/* A flipped ciphertext bit, in a record OpenSSL made. */
		struct forged x = forged_pair(s);
		CHECK_EQ_INT(end_write(&x.p.c, secret, sizeof(secret)), sizeof(secret));
		n = take(&x.p.c, rec, sizeof(rec));
		CHECK_EQ_INT(n, 5 + sizeof(secret) + 17);
		rec[5 + sizeof(secret) / 2] ^= 0x10;
		feed(&x.p.s, rec, n);
		expect_refused(&x, -EPROTO, GG_TLS_FAIL_PROTOCOL,
			       TLS_FAILURE("decryption failed or bad record mac", "bad_record_mac"), SSL_AD_BAD_RECORD_MAC);
	}

	/* A header byte: its type, then its version (covered by the tag). */
	struct forged x = forged_pair(0);
	CHECK_EQ_INT(end_write(&x.p.c, secret, sizeof(secret)), sizeof(secret));
	n = take(&x.p.c, rec, sizeof(rec));
	rec[0] = 22;
	feed(&x.p.s, rec, n);
	expect_refused(&x, -EPROTO, GG_TLS_FAIL_PROTOCOL,
		       TLS_FAILURE("unprotected handshake record (type 22) after the handshake", "unexpected_message"),
		       SSL_AD_UNEXPECTED_MESSAGE);
	x = forged_pair(1);
	CHECK_EQ_INT(end_write(&x.p.c, secret, sizeof(secret)), sizeof(secret));
	n = take(&x.p.c, rec, sizeof(rec));
	rec[2] = 1;
	feed(&x.p.s, rec, n);
	expect_refused(&x, -EPROTO, GG_TLS_FAIL_PROTOCOL,
		       TLS_FAILURE("decryption failed or bad record mac", "bad_record_mac"), SSL_AD_BAD_RECORD_MAC);

	/* A replayed record: the first copy is read, the second refused. */
	x = forged_pair(2);
	CHECK_EQ_INT(end_write(&x.p.c, secret, sizeof(secret)), sizeof(secret));
	n = take(&x.p.c, rec, sizeof(rec));
	feed(&x.p.s, rec, n);
	feed(&x.p.s, rec, n);
	uint8_t got[100];
	CHECK_EQ_INT(gg_tls_engine_read(x.p.s.e, got, sizeof(secret)), sizeof(secret));
	CHECK(!memcmp(got, secret, sizeof(secret)));
	expect_refused(&x, -EPROTO, GG_TLS_FAIL_PROTOCOL,
		       TLS_FAILURE("decryption failed or bad record mac", "bad_record_mac"), SSL_AD_BAD_RECORD_MAC);

	/* A truncated record: a wait, then at the end of the stream no data. */
	x = forged_pair(0);
	CHECK_EQ_INT(end_write(&x.p.c, secret, sizeof(secret)), sizeof(secret));
	n = take(&x.p.c, rec, sizeof(rec));
	feed(&x.p.s, rec, n - 1);
	CHECK_EQ_INT(gg_tls_engine_read(x.p.s.e, got, sizeof(got)), -EAGAIN);
	gg_tls_engine_rx_eof(x.p.s.e);
	expect_refused(&x, -ECONNRESET, GG_TLS_FAIL_CLOSED,
		       "peer " CLIENT_ADDR ": connection closed without close_notify (data may be truncated) (site site-a, "
		       "dns:site-a.gradgate.test)",
		       -1);

	/* A record cut short and followed by the next: the tag is wrong. */
	x = forged_pair(1);
	CHECK_EQ_INT(end_write(&x.p.c, secret, sizeof(secret)), sizeof(secret));
	CHECK_EQ_INT(end_write(&x.p.c, secret, sizeof(secret)), sizeof(secret));
	n = take(&x.p.c, rec, sizeof(rec));
	feed(&x.p.s, rec, n / 2 - 3);
	feed(&x.p.s, rec + n / 2, n / 2);
	expect_refused(&x, -EPROTO, GG_TLS_FAIL_PROTOCOL,
		       TLS_FAILURE("decryption failed or bad record mac", "bad_record_mac"), SSL_AD_BAD_RECORD_MAC);
}

/* Records forged with the peer's key, one or two in a row, and what the
 * engine makes of them. */
static const struct {
	uint8_t inner[2][9]; /* content, type, padding */
	size_t len[2];
	int records;
	enum gg_tls_failure failure;
	const char *msg;
	int alert; /* what the engine sends back; -1: nothing */
} forged_cases[] = {
	{ { { 0 } }, { 9 }, 1, GG_TLS_FAIL_PROTOCOL,
	  TLS_FAILURE("record without a content type", "unexpected_message"), SSL_AD_UNEXPECTED_MESSAGE },
	{ { { 0 } }, { 0 }, 1, GG_TLS_FAIL_PROTOCOL,
	  TLS_FAILURE("record without a content type", "unexpected_message"), SSL_AD_UNEXPECTED_MESSAGE },
	{ { { 1, 20 } }, { 2 }, 1, GG_TLS_FAIL_PROTOCOL,
	  TLS_FAILURE("protected change_cipher_spec record (type 20) after the handshake", "unexpected_message"),
	  SSL_AD_UNEXPECTED_MESSAGE },
	{ { { 'x', 99, 0, 0 } }, { 4 }, 1, GG_TLS_FAIL_PROTOCOL,
	  TLS_FAILURE("protected unknown record (type 99) after the handshake", "unexpected_message"),
	  SSL_AD_UNEXPECTED_MESSAGE },
	{ { { 13, 0, 0, 4, 0, 0, 0, 0, 22 } }, { 9 }, 1, GG_TLS_FAIL_PROTOCOL,
	  TLS_FAILURE("unexpected CertificateRequest (handshake message 13) after the handshake", "unexpected_message"),
	  SSL_AD_UNEXPECTED_MESSAGE },
	/* the engine is the server: a client sends no tickets */
	{ { { 4, 0, 0, 0, 22 } }, { 5 }, 1, GG_TLS_FAIL_PROTOCOL,
	  TLS_FAILURE("unexpected NewSessionTicket (handshake message 4) after the handshake", "unexpected_message"),
	  SSL_AD_UNEXPECTED_MESSAGE },
	{ { { 24, 0, 0, 1, 0, 'd', 23, 22 } }, { 8 }, 1, GG_TLS_FAIL_PROTOCOL,
	  TLS_FAILURE("KeyUpdate not at the end of its record", "unexpected_message"), SSL_AD_UNEXPECTED_MESSAGE },
	{ { { 24, 0, 0, 1, 2, 22 } }, { 6 }, 1, GG_TLS_FAIL_PROTOCOL,
	  TLS_FAILURE("KeyUpdate with request_update 2", "illegal_parameter"), SSL_AD_ILLEGAL_PARAMETER },
	{ { { 24, 0, 0, 2, 0, 0, 22 } }, { 7 }, 1, GG_TLS_FAIL_PROTOCOL,
	  TLS_FAILURE("KeyUpdate of 2 bytes (it has 1)", "decode_error"), SSL_AD_DECODE_ERROR },
	{ { { 24, 0, 22 }, { 'd', 23 } }, { 3, 2 }, 2, GG_TLS_FAIL_PROTOCOL,
	  TLS_FAILURE("application_data record inside a handshake message", "unexpected_message"),
	  SSL_AD_UNEXPECTED_MESSAGE },
	{ { { 2, 40, 0, 21 } }, { 4 }, 1, GG_TLS_FAIL_PROTOCOL,
	  TLS_FAILURE("alert record of 3 bytes", "decode_error"), SSL_AD_DECODE_ERROR },
	{ { { 2, 116, 21 } }, { 3 }, 1, GG_TLS_FAIL_REFUSED,
	  "peer " CLIENT_ADDR ": peer requires a client certificate and we presented none" EXPECT_CLIENT
	  "; alert certificate_required)", -1 },
	{ { { 1, 22, 21 } }, { 3 }, 1, GG_TLS_FAIL_REFUSED,
	  "peer " CLIENT_ADDR ": peer ended the connection with an alert" EXPECT_CLIENT "; alert record_overflow)", -1 },
};

static void test_forged(void)
{
	static uint8_t inner[20000];

	for (size_t i = 0; i < GG_ARRAY_LEN(forged_cases); i++) {
		struct forged x = forged_pair(i % GG_ARRAY_LEN(suite_keys));
		for (int r = 0; r < forged_cases[i].records; r++)
			send_forged(&x, forged_cases[i].inner[r], forged_cases[i].len[r]);
		expect_refused(&x, -EPROTO, forged_cases[i].failure, forged_cases[i].msg, forged_cases[i].alert);
	}

	/* Over the limits: of the ciphertext (seen in the header), then of
	 * the plaintext, padding included. */
	static const uint8_t long_header[] = { 23, 3, 3, 0x41, 0x01 };
	struct forged x = forged_pair(0);
	feed(&x.p.s, long_header, sizeof(long_header));
	expect_refused(&x, -EPROTO, GG_TLS_FAIL_PROTOCOL,
		       TLS_FAILURE("record of 16641 bytes, more than 2^14 + 256", "record_overflow"), SSL_AD_RECORD_OVERFLOW);
	for (int padded = 0; padded < 2; padded++) {
		x = forged_pair(1 + (size_t)padded);
		memset(inner, padded ? 0 : 'p', 16385);
		inner[padded ? 6 : 16385] = 23;
		send_forged(&x, inner, 16386);
		expect_refused(&x, -EPROTO, GG_TLS_FAIL_PROTOCOL,
			       TLS_FAILURE("record of 16402 bytes holds more than 2^14 + 1 bytes of plaintext", "record_overflow"),
			       SSL_AD_RECORD_OVERFLOW);
	}

	/* An alert without protection. */
	static const uint8_t plain_alert[] = { 21, 3, 3, 0, 2, 2, 40 };
	x = forged_pair(2);
	feed(&x.p.s, plain_alert, sizeof(plain_alert));
	expect_refused(&x, -EPROTO, GG_TLS_FAIL_PROTOCOL,
		       TLS_FAILURE("unprotected alert record (type 21) after the handshake", "unexpected_message"),
		       SSL_AD_UNEXPECTED_MESSAGE);
}

/* A record OpenSSL refuses: its alert comes back and names what it saw. */
static void test_alert_from_openssl(void)
{
	static uint8_t buf[100];
	const struct options o = { .tickets = 2 };
	struct pair p = connect_pair(OURS, OPENSSL, suite_names[0], &o, NULL);
	const uint8_t *rec;

	CHECK_EQ_INT(gg_tls_engine_write(p.c.e, "abcdef", 6), 6);
	CHECK(gg_tls_engine_tx_data(p.c.e, &rec) == 6 + 22);
	((uint8_t *)rec)[8] ^= 1;
	move(&p.c, &p.s);
	CHECK_EQ_INT(end_read(&p.s, buf, sizeof(buf)), -EPROTO);
	move(&p.s, &p.c);
	CHECK_EQ_INT(gg_tls_engine_read(p.c.e, buf, sizeof(buf)), -EPROTO);
	CHECK_EQ_INT(gg_tls_engine_failure(p.c.e), GG_TLS_FAIL_REFUSED);
	CHECK_STR(gg_tls_engine_error(p.c.e), "peer " SERVER_ADDR ": peer ended the connection with an alert (expected "
					      "identity dns:site-b.gradgate.test; alert bad_record_mac)");
	pair_free(&p);
}

/* What is legal but unusual: padding, empty records, fragmented and
 * coalesced post-handshake messages, user_canceled, a KeyUpdate split
 * over two records. Small reads put the rest of a record in staging. */
static void test_forged_accepted(void)
{
	static uint8_t inner[20000], rec[20000];
	uint8_t got[64];
	struct forged x = forged_pair(0);

	memcpy(inner, "padded", 6);
	inner[6] = 23;
	memset(inner + 7, 0, 3000);
	send_forged(&x, inner, 3007);
	send_forged(&x, (const uint8_t[]){ 23 }, 1); /* empty application data */
	send_forged(&x, (const uint8_t[]){ 23, 0, 0 }, 3);
	CHECK_EQ_INT(gg_tls_engine_read(x.p.s.e, got, 2), 2);
	CHECK_EQ_INT(gg_tls_engine_read(x.p.s.e, got + 2, sizeof(got) - 2), 4);
	CHECK(!memcmp(got, "padded", 6));
	CHECK_EQ_INT(gg_tls_engine_read(x.p.s.e, got, sizeof(got)), -EAGAIN);

	/* A KeyUpdate asking for ours, its header and body in two records. */
	send_forged(&x, (const uint8_t[]){ 24, 0, 22 }, 3);
	send_forged(&x, (const uint8_t[]){ 0, 1, 1, 22 }, 4);
	forger_update(&x.f);
	send_forged(&x, (const uint8_t[]){ 'n', 'e', 'w', 23 }, 4);
	CHECK_EQ_INT(gg_tls_engine_read(x.p.s.e, got, sizeof(got)), 3);
	CHECK(!memcmp(got, "new", 3));
	CHECK_EQ_INT(gg_tls_engine_tx_pending(x.p.s.e), KEY_UPDATE_RECORD);
	transfer(&x.p.s, &x.p.c, 5000, 5000, 5000);

	/* user_canceled, then close_notify. */
	send_forged(&x, (const uint8_t[]){ 1, 90, 21 }, 3);
	send_forged(&x, (const uint8_t[]){ 1, 0, 21 }, 3);
	CHECK_EQ_INT(gg_tls_engine_read(x.p.s.e, got, sizeof(got)), 0);
	CHECK_EQ_INT(gg_tls_engine_failure(x.p.s.e), GG_TLS_OK);
	pair_free(&x.p);

	/* Tickets to a client: two in one record, one over three records. */
	const struct options o = { 0 };
	struct pair p = connect_pair(OURS, OPENSSL, suite_keys[1].name, &o, NULL);
	struct forger f = { .suite = &suite_keys[1] };
	memcpy(f.secret, logged.server, f.suite->hash_bytes);
	forger_keys(&f);
	static const uint8_t two[] = { 4, 0, 0, 2, 'a', 'b', 4, 0, 0, 1, 'c', 22 };
	feed(&p.c, rec, forge(&f, two, sizeof(two), rec));
	memset(inner, 't', sizeof(inner));
	memcpy(inner, (const uint8_t[]){ 4, 0, 0x4e, 0x20 }, 4); /* 20000 bytes of ticket */
	inner[16000] = 22;
	feed(&p.c, rec, forge(&f, inner, 16001, rec)); /* 15996 of them */
	memset(inner, 't', 3000);
	inner[3000] = 22;
	feed(&p.c, rec, forge(&f, inner, 3001, rec));
	inner[1004] = 22;
	feed(&p.c, rec, forge(&f, inner, 1005, rec));
	feed(&p.c, rec, forge(&f, (const uint8_t[]){ 'o', 'k', 23 }, 3, rec));
	CHECK_EQ_INT(gg_tls_engine_read(p.c.e, got, sizeof(got)), 2);
	CHECK(!memcmp(got, "ok", 2));
	pair_free(&p);
}

static bool holds(const uint8_t *hay, size_t hay_len, const void *needle, size_t len)
{
	return len && memmem(hay, hay_len, needle, len);
}

static bool holds_hex(const uint8_t *hay, size_t hay_len, const uint8_t *bytes, size_t len)
{
	char lower[2 * EVP_MAX_MD_SIZE + 1], upper[2 * EVP_MAX_MD_SIZE + 1];

	for (size_t i = 0; i < len; i++) {
		snprintf(lower + 2 * i, 3, "%02x", bytes[i]);
		snprintf(upper + 2 * i, 3, "%02X", bytes[i]);
	}
	return holds(hay, hay_len, lower, 2 * len) || holds(hay, hay_len, upper, 2 * len) ||
	       holds(hay, hay_len, bytes, len);
}

/* Everything printed during sessions with key updates and failures, at
 * debug level, holds none of the traffic secrets, keys or IVs. */
static void test_secrets_not_logged(void)
{
	char path[] = "/tmp/gg-tls-record-XXXXXX";
	int fd = mkstemp(path), saved_out = dup(1), saved_err = dup(2);
	struct forger secrets[8];
	size_t count = 0;

	CHECK(fd >= 0 && saved_out >= 0 && saved_err >= 0);
	unlink(path);
	fflush(stdout);
	fflush(stderr);
	CHECK(dup2(fd, 1) == 1 && dup2(fd, 2) == 2);
	gg_log_set_level(GG_LOG_DEBUG);
	for (size_t s = 0; s < GG_ARRAY_LEN(suite_keys); s++) {
		const struct options o = { .key_update_records = 2, .tickets = 2 };
		struct pair p = connect_pair(OPENSSL, OURS, suite_keys[s].name, &o, NULL);
		for (int side = 0; side < 2; side++) {
			struct forger *f = &secrets[count++];
			*f = (struct forger){ .suite = &suite_keys[s] };
			memcpy(f->secret, side ? logged.server : logged.client, f->suite->hash_bytes);
			forger_keys(f);
		}
		CHECK(SSL_key_update(p.c.ssl, SSL_KEY_UPDATE_REQUESTED));
		transfer(&p.c, &p.s, 100000, 100000, 100000);
		transfer(&p.s, &p.c, 100000, 100000, 100000);
		gg_log(GG_LOG_DEBUG, "tls_session", "cipher=%s", gg_tls_engine_cipher(p.s.e));
		CHECK_EQ_INT(end_write(&p.c, "tail", 4), 4);
		uint8_t rec[64], buf[64];
		size_t n = take(&p.c, rec, sizeof(rec));
		rec[n - 1] ^= 1;
		feed(&p.s, rec, n);
		CHECK_EQ_INT(gg_tls_engine_read(p.s.e, buf, sizeof(buf)), -EPROTO);
		gg_log(GG_LOG_ERROR, "tls_failed", "error=\"%s\"", gg_tls_engine_error(p.s.e));
		fprintf(stderr, "%s\n", gg_tls_engine_error(p.s.e));
		pair_free(&p);
	}
	fflush(stdout);
	fflush(stderr);
	CHECK(dup2(saved_out, 1) == 1 && dup2(saved_err, 2) == 2);
	close(saved_out);
	close(saved_err);

	static uint8_t out[1 << 16];
	ssize_t len = pread(fd, out, sizeof(out), 0);
	close(fd);
	CHECK(len > 0 && len < (ssize_t)sizeof(out));
	CHECK(holds(out, (size_t)len, "decryption failed or bad record mac", 35));
	CHECK(holds(out, (size_t)len, "event=tls_session", 17));
	for (size_t i = 0; i < count; i++) {
		const struct forger *f = &secrets[i];
		CHECK(!holds_hex(out, (size_t)len, f->secret, f->suite->hash_bytes));
		CHECK(!holds_hex(out, (size_t)len, f->key, f->suite->key_bytes));
		CHECK(!holds_hex(out, (size_t)len, f->iv, sizeof(f->iv)));
	}
}

static void test_unsupported_suite(void)
{
	struct gg_tls_context *ctx;
	struct gg_tls_options o = { .ciphersuites = "TLS_AES_128_GCM_SHA256:TLS_AES_128_CCM_SHA256" };
	char err[300];

	CHECK_EQ_INT(gg_tls_context_new(&o, &ctx, err, sizeof(err)), -EINVAL);
	CHECK_STR(err, "TLS 1.3 ciphersuite 'TLS_AES_128_CCM_SHA256' is not supported: records are protected with "
		       "AES-GCM or ChaCha20-Poly1305 (supported: TLS_AES_256_GCM_SHA384:TLS_AES_128_GCM_SHA256:"
		       "TLS_CHACHA20_POLY1305_SHA256)");
}

int main(void)
{
	CHECK(gg_tls_pki_new("Test CA", &ca) == 0);

	test_interop();
	test_data_right_after_finished();
	test_writev();
	test_ring_wrap();
	test_key_update_from_openssl();
	test_key_update_answer_waits();
	test_key_update_from_engine();
	test_close_notify();
	test_tampered();
	test_forged();
	test_alert_from_openssl();
	test_forged_accepted();
	test_secrets_not_logged();
	test_unsupported_suite();

	gg_tls_pki_free(ca);
	printf("test_tls_record: ok\n");
	return 0;
}
