#include "tls_engine.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "tls_internal.h"

/* Room a record needs beyond its plaintext: header, content type and tag
 * (22 bytes in TLS 1.3), plus a KeyUpdate OpenSSL may send ahead of it. */
#define GG_TLS_RECORD_SLACK 256

struct ring {
	uint8_t *buf;
	size_t size; /* a power of two */
	size_t head; /* free-running: next byte to take */
	size_t tail; /* free-running: next byte to fill */
};

struct gg_tls_engine {
	SSL *ssl;
	struct ring rx, tx;
	bool rx_eof;
	bool established;
	bool peer_closed;
	bool write_retry; /* OpenSSL holds a record that did not fit: repeat the write */
	enum gg_tls_failure failure;
	int fail_rc;
	struct gg_tls_check chk;
	struct gg_tls_site sites[GG_TLS_MAX_SITES];
	char peer_addr[64];
	char error[GG_TLS_ERROR_MAX];
};

static size_t ring_used(const struct ring *r)
{
	return r->tail - r->head;
}

static size_t ring_free(const struct ring *r)
{
	return r->size - ring_used(r);
}

static size_t ring_put(struct ring *r, const uint8_t *src, size_t len)
{
	size_t n = GG_MIN(len, ring_free(r)), off = r->tail & (r->size - 1);
	size_t first = GG_MIN(n, r->size - off);

	memcpy(r->buf + off, src, first);
	memcpy(r->buf, src + first, n - first);
	r->tail += n;
	return n;
}

static size_t ring_get(struct ring *r, uint8_t *dst, size_t len)
{
	size_t n = GG_MIN(len, ring_used(r)), off = r->head & (r->size - 1);
	size_t first = GG_MIN(n, r->size - off);

	memcpy(dst, r->buf + off, first);
	memcpy(dst + first, r->buf, n - first);
	r->head += n;
	return n;
}

static int ring_init(struct ring *r, size_t want)
{
	size_t size = GG_TLS_RING_MIN_BYTES;

	if (!want)
		want = GG_TLS_RING_DEFAULT_BYTES;
	while (size < want && size < ((size_t)1 << 30))
		size <<= 1;
	r->buf = malloc(size);
	r->size = size;
	r->head = r->tail = 0;
	return r->buf ? 0 : -ENOMEM;
}

/* The BIO between OpenSSL and the rings. Reads and writes never block:
 * an empty rx ring or a full tx ring is a retry. */
static int ring_bio_write(BIO *b, const char *data, size_t len, size_t *written)
{
	struct gg_tls_engine *e = BIO_get_data(b);
	size_t n = ring_put(&e->tx, (const uint8_t *)data, len);

	BIO_clear_retry_flags(b);
	if (!n) {
		BIO_set_retry_write(b);
		return 0;
	}
	*written = n;
	return 1;
}

static int ring_bio_read(BIO *b, char *data, size_t len, size_t *readbytes)
{
	struct gg_tls_engine *e = BIO_get_data(b);
	size_t n = ring_get(&e->rx, (uint8_t *)data, len);

	BIO_clear_retry_flags(b);
	if (!n) {
		if (!e->rx_eof)
			BIO_set_retry_read(b);
		return 0;
	}
	*readbytes = n;
	return 1;
}

static long ring_bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
	struct gg_tls_engine *e = BIO_get_data(b);

	switch (cmd) {
	case BIO_CTRL_FLUSH:
		return 1;
	case BIO_CTRL_EOF:
		return e->rx_eof && !ring_used(&e->rx);
	case BIO_CTRL_PENDING:
		return (long)ring_used(&e->rx);
	case BIO_CTRL_WPENDING:
		return (long)ring_used(&e->tx);
	default:
		return 0;
	}
}

static pthread_once_t method_once = PTHREAD_ONCE_INIT;
static BIO_METHOD *ring_method;

static void make_method(void)
{
	BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "gradgate ring");

	if (m && BIO_meth_set_write_ex(m, ring_bio_write) && BIO_meth_set_read_ex(m, ring_bio_read) &&
	    BIO_meth_set_ctrl(m, ring_bio_ctrl)) {
		ring_method = m;
		return;
	}
	BIO_meth_free(m);
}

int gg_tls_engine_new(struct gg_tls_context *ctx, const struct gg_tls_engine_config *cfg, struct gg_tls_engine **out)
{
	struct gg_tls_engine *e = NULL;
	SSL_CTX *sc = NULL;
	BIO *bio = NULL;
	int rc = -EINVAL;

	*out = NULL;
	if (!cfg->sites || !cfg->site_count || cfg->site_count > GG_TLS_MAX_SITES)
		goto out;
	rc = -ENOMEM;
	pthread_once(&method_once, make_method);
	e = calloc(1, sizeof(*e));
	if (!ring_method || !e || ring_init(&e->rx, cfg->rx_ring_bytes) || ring_init(&e->tx, cfg->tx_ring_bytes))
		goto out;
	memcpy(e->sites, cfg->sites, cfg->site_count * sizeof(*cfg->sites));
	snprintf(e->peer_addr, sizeof(e->peer_addr), "%s", cfg->peer_addr ? cfg->peer_addr : "?");
	e->chk = (struct gg_tls_check){
		.sites = e->sites,
		.site_count = cfg->site_count,
		.peer_addr = e->peer_addr,
		.is_server = cfg->role == GG_TLS_SERVER,
		.matched_site = SIZE_MAX,
		.alert_sent = -1,
		.alert_received = -1,
	};

	sc = gg_tls_context_get_ssl_ctx(ctx);
	if (!sc || !(e->ssl = SSL_new(sc)) || !(bio = BIO_new(ring_method)))
		goto out;
	BIO_set_data(bio, e);
	BIO_set_init(bio, 1);
	SSL_set_bio(e->ssl, bio, bio);
	bio = NULL;
	if (!SSL_set_ex_data(e->ssl, gg_tls_check_index(), &e->chk))
		goto out;
	if (cfg->role == GG_TLS_SERVER) {
		SSL_set_accept_state(e->ssl);
	} else {
		SSL_set_connect_state(e->ssl);
		if (cfg->site_count == 1 && e->sites[0].identity.kind == GG_TLS_IDENTITY_DNS &&
		    !SSL_set_tlsext_host_name(e->ssl, e->sites[0].identity.name))
			goto out;
	}
	*out = e;
	e = NULL;
	rc = 0;
out:
	BIO_free(bio);
	SSL_CTX_free(sc);
	gg_tls_engine_free(e);
	ERR_clear_error();
	return rc;
}

void gg_tls_engine_free(struct gg_tls_engine *e)
{
	if (!e)
		return;
	SSL_free(e->ssl);
	free(e->rx.buf);
	free(e->tx.buf);
	free(e);
}

size_t gg_tls_engine_rx_space(struct gg_tls_engine *e, uint8_t **buf)
{
	size_t off = e->rx.tail & (e->rx.size - 1);

	*buf = e->rx.buf + off;
	return GG_MIN(ring_free(&e->rx), e->rx.size - off);
}

void gg_tls_engine_rx_commit(struct gg_tls_engine *e, size_t n)
{
	e->rx.tail += GG_MIN(n, ring_free(&e->rx));
	if (n)
		e->chk.saw_bytes = true;
}

void gg_tls_engine_rx_eof(struct gg_tls_engine *e)
{
	e->rx_eof = true;
	e->chk.eof = true;
}

size_t gg_tls_engine_tx_data(struct gg_tls_engine *e, const uint8_t **buf)
{
	size_t off = e->tx.head & (e->tx.size - 1);

	*buf = e->tx.buf + off;
	return GG_MIN(ring_used(&e->tx), e->tx.size - off);
}

void gg_tls_engine_tx_consume(struct gg_tls_engine *e, size_t n)
{
	e->tx.head += GG_MIN(n, ring_used(&e->tx));
}

size_t gg_tls_engine_tx_pending(const struct gg_tls_engine *e)
{
	return ring_used(&e->tx);
}

static int record_failure(struct gg_tls_engine *e)
{
	unsigned long code = ERR_peek_error();
	int reason = ERR_GET_LIB(code) == ERR_LIB_SSL ? ERR_GET_REASON(code) : 0;

	e->failure = gg_tls_explain(&e->chk, reason, ERR_reason_error_string(code), e->error, sizeof(e->error));
	e->fail_rc = e->failure == GG_TLS_FAIL_CLOSED ? -ECONNRESET : -EPROTO;
	ERR_clear_error();
	return e->fail_rc;
}

/* -EAGAIN when OpenSSL waits for the rings, else records the failure. */
static int ssl_failed(struct gg_tls_engine *e, int ret)
{
	int err = SSL_get_error(e->ssl, ret);

	if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE)
		return -EAGAIN;
	return record_failure(e);
}

int gg_tls_engine_handshake(struct gg_tls_engine *e)
{
	if (e->failure)
		return e->fail_rc;
	if (e->established)
		return 0;
	ERR_clear_error();
	int ret = SSL_do_handshake(e->ssl);
	if (ret != 1)
		return ssl_failed(e, ret);
	if (!e->chk.is_server && !gg_tls_check_alpn_selected(e->ssl, &e->chk))
		return record_failure(e);
	e->established = e->chk.established = true;
	return 0;
}

bool gg_tls_engine_established(const struct gg_tls_engine *e)
{
	return e->established && !e->failure;
}

ssize_t gg_tls_engine_write(struct gg_tls_engine *e, const void *buf, size_t len)
{
	const uint8_t *p = buf;
	size_t done = 0;

	if (e->failure)
		return e->fail_rc;
	if (!e->established)
		return -ENOTCONN;
	if (!len)
		return 0;
	ERR_clear_error();
	while (done < len) {
		size_t chunk = GG_MIN(len - done, (size_t)GG_TLS_RECORD_PLAINTEXT_MAX), written;
		if (!e->write_retry && ring_free(&e->tx) < chunk + GG_TLS_RECORD_SLACK)
			break;
		int ret = SSL_write_ex(e->ssl, p + done, chunk, &written);
		if (ret <= 0) {
			int rc = ssl_failed(e, ret);
			e->write_retry = rc == -EAGAIN;
			if (done)
				break;
			return rc;
		}
		e->write_retry = false;
		done += written;
	}
	return done ? (ssize_t)done : -EAGAIN;
}

ssize_t gg_tls_engine_read(struct gg_tls_engine *e, void *buf, size_t len)
{
	uint8_t *p = buf;
	size_t done = 0;

	if (e->failure)
		return e->fail_rc;
	if (!e->established)
		return -ENOTCONN;
	ERR_clear_error();
	while (done < len && !e->peer_closed) {
		size_t got;
		int ret = SSL_read_ex(e->ssl, p + done, len - done, &got);
		if (ret > 0) {
			done += got;
			continue;
		}
		if (SSL_get_error(e->ssl, ret) == SSL_ERROR_ZERO_RETURN) {
			e->peer_closed = true;
			break;
		}
		if (ssl_failed(e, ret) != -EAGAIN && !done)
			return e->fail_rc;
		break;
	}
	if (done)
		return (ssize_t)done;
	return e->peer_closed ? 0 : -EAGAIN;
}

int gg_tls_engine_shutdown(struct gg_tls_engine *e)
{
	if (e->failure)
		return e->fail_rc;
	if (!e->established)
		return -ENOTCONN;
	ERR_clear_error();
	int ret = SSL_shutdown(e->ssl);
	if (ret >= 0)
		return 0;
	return ssl_failed(e, ret);
}

void gg_tls_engine_fail_timeout(struct gg_tls_engine *e, uint64_t timeout_ms)
{
	if (e->failure)
		return;
	e->chk.timed_out = true;
	e->chk.timeout_ms = timeout_ms;
	e->failure = gg_tls_explain(&e->chk, 0, NULL, e->error, sizeof(e->error));
	e->fail_rc = -ETIMEDOUT;
}

enum gg_tls_failure gg_tls_engine_failure(const struct gg_tls_engine *e)
{
	return e->failure;
}

const char *gg_tls_engine_error(const struct gg_tls_engine *e)
{
	return e->failure ? e->error : "";
}

size_t gg_tls_engine_peer_site(const struct gg_tls_engine *e)
{
	return e->chk.matched_site;
}

const char *gg_tls_engine_cipher(const struct gg_tls_engine *e)
{
	const SSL_CIPHER *c = SSL_get_current_cipher(e->ssl);
	return c ? SSL_CIPHER_standard_name(c) : "none";
}

const char *gg_tls_engine_peer_addr(const struct gg_tls_engine *e)
{
	return e->peer_addr;
}
