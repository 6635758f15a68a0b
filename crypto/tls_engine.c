#include "tls_engine.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/ssl.h>

#include "tls_internal.h"

/* RFC 8446 5.1 and 5.2: a 5-byte header, then the protected content, its
 * content type, padding and the AEAD tag. */
#define REC_HEADER 5
#define REC_TAG 16
#define REC_IV 12
#define REC_CIPHERTEXT_MAX (GG_TLS_RECORD_PLAINTEXT_MAX + 256)
#define REC_INNER_MAX (GG_TLS_RECORD_PLAINTEXT_MAX + 1) /* content, type and padding */
#define REC_BYTES(content) (REC_HEADER + (content) + 1 + REC_TAG) /* without padding */
#define KEY_UPDATE_BYTES REC_BYTES(5)
#define ALERT_BYTES REC_BYTES(2)

enum {
	CT_CHANGE_CIPHER_SPEC = 20,
	CT_ALERT = 21,
	CT_HANDSHAKE = 22,
	CT_APPLICATION_DATA = 23,
	HS_NEW_SESSION_TICKET = 4,
	HS_CERTIFICATE_REQUEST = 13,
	HS_KEY_UPDATE = 24,
	ALERT_WARNING = 1,
	ALERT_FATAL = 2,
};

/* The suites records are protected with: RFC 8446 B.4. */
struct suite {
	uint16_t id;
	const char *cipher, *digest;
	size_t key_bytes, hash_bytes;
	EVP_CIPHER *evp; /* NULL where the providers lack it */
};

static struct suite suites[] = {
	{ 0x1301, "AES-128-GCM", "SHA256", 16, 32, NULL },
	{ 0x1302, "AES-256-GCM", "SHA384", 32, 48, NULL },
	{ 0x1303, "ChaCha20-Poly1305", "SHA256", 32, 32, NULL },
};

struct ring {
	uint8_t *buf;
	size_t size; /* a power of two */
	size_t head; /* free-running: next byte to take */
	size_t tail; /* free-running: next byte to fill */
};

/* One direction of the record layer. */
struct record_dir {
	EVP_CIPHER_CTX *aead; /* keyed once per traffic secret */
	uint8_t secret[EVP_MAX_MD_SIZE];
	uint8_t iv[REC_IV];
	uint64_t seq; /* records under the current key */
};

struct gg_tls_engine {
	SSL *ssl; /* the handshake; freed once it completed */
	struct ring rx, tx;
	bool rx_eof;
	bool established;
	bool peer_closed;
	bool write_closed;   /* close_notify sent */
	bool key_update_due; /* a KeyUpdate goes out before the next record */
	const struct suite *suite; /* set once both directions are keyed */
	const char *cipher_name;
	struct record_dir rd, wr;
	uint32_t key_update_records;
	/* Plaintext of the record that did not fit the caller's buffer. */
	uint8_t *stage;
	size_t stage_off, stage_len;
	/* The post-handshake message being read: its header, then its body. */
	uint8_t hs_head[4];
	size_t hs_head_len, hs_body_left;
	struct gg_tls_secrets secrets;
	enum gg_tls_failure failure;
	int fail_rc;
	struct gg_tls_check chk;
	struct gg_tls_site sites[GG_TLS_MAX_SITES];
	struct gg_tls_site others[GG_TLS_MAX_SITES];
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

/* The ring bytes [pos, pos + len) as two contiguous pieces; the second is
 * empty unless they wrap around the end. */
static void ring_span(const struct ring *r, size_t pos, size_t len, struct iovec v[2])
{
	size_t off = pos & (r->size - 1), first = GG_MIN(len, r->size - off);

	v[0] = (struct iovec){ r->buf + off, first };
	v[1] = (struct iovec){ r->buf, len - first };
}

static void ring_copy_in(struct ring *r, size_t pos, const uint8_t *src, size_t len)
{
	struct iovec v[2];

	ring_span(r, pos, len, v);
	memcpy(v[0].iov_base, src, v[0].iov_len);
	memcpy(v[1].iov_base, src + v[0].iov_len, v[1].iov_len);
}

static void ring_copy_out(const struct ring *r, size_t pos, uint8_t *dst, size_t len)
{
	struct iovec v[2];

	ring_span(r, pos, len, v);
	memcpy(dst, v[0].iov_base, v[0].iov_len);
	memcpy(dst + v[0].iov_len, v[1].iov_base, v[1].iov_len);
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

/* The BIO between OpenSSL's handshake and the rings. Reads and writes
 * never block: an empty rx ring or a full tx ring is a retry. */
static int ring_bio_write(BIO *b, const char *data, size_t len, size_t *written)
{
	struct gg_tls_engine *e = BIO_get_data(b);
	size_t n = GG_MIN(len, ring_free(&e->tx));

	BIO_clear_retry_flags(b);
	if (!n) {
		BIO_set_retry_write(b);
		return 0;
	}
	ring_copy_in(&e->tx, e->tx.tail, (const uint8_t *)data, n);
	e->tx.tail += n;
	*written = n;
	return 1;
}

static int ring_bio_read(BIO *b, char *data, size_t len, size_t *readbytes)
{
	struct gg_tls_engine *e = BIO_get_data(b);
	size_t n = GG_MIN(len, ring_used(&e->rx));

	BIO_clear_retry_flags(b);
	if (!n) {
		if (!e->rx_eof)
			BIO_set_retry_read(b);
		return 0;
	}
	ring_copy_out(&e->rx, e->rx.head, (uint8_t *)data, n);
	e->rx.head += n;
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

static pthread_once_t statics_once = PTHREAD_ONCE_INIT;
static BIO_METHOD *ring_method;
static EVP_KDF *hkdf;

static void make_statics(void)
{
	BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "gradgate ring");

	if (m && BIO_meth_set_write_ex(m, ring_bio_write) && BIO_meth_set_read_ex(m, ring_bio_read) &&
	    BIO_meth_set_ctrl(m, ring_bio_ctrl))
		ring_method = m;
	else
		BIO_meth_free(m);
	hkdf = EVP_KDF_fetch(NULL, OSSL_KDF_NAME_HKDF, NULL);
	for (size_t i = 0; i < GG_ARRAY_LEN(suites); i++)
		suites[i].evp = EVP_CIPHER_fetch(NULL, suites[i].cipher, NULL);
	ERR_clear_error();
}

/* HKDF-Expand-Label(secret, label, "", len) of RFC 8446 7.1. */
static bool expand_label(const struct suite *s, const uint8_t *secret, const char *label, uint8_t *out, size_t len)
{
	uint8_t info[2 + 1 + 6 + 12 + 1];
	size_t label_len = strlen(label);
	int mode = EVP_KDF_HKDF_MODE_EXPAND_ONLY;
	EVP_KDF_CTX *kctx;
	bool ok;

	if (label_len > 12)
		return false;
	info[0] = (uint8_t)(len >> 8);
	info[1] = (uint8_t)len;
	info[2] = (uint8_t)(6 + label_len);
	memcpy(info + 3, "tls13 ", 6);
	memcpy(info + 9, label, label_len);
	info[9 + label_len] = 0; /* empty context */
	OSSL_PARAM params[] = {
		OSSL_PARAM_construct_int(OSSL_KDF_PARAM_MODE, &mode),
		OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, (char *)s->digest, 0),
		OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, (void *)secret, s->hash_bytes),
		OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, info, 10 + label_len),
		OSSL_PARAM_construct_end(),
	};
	kctx = EVP_KDF_CTX_new(hkdf);
	ok = kctx && EVP_KDF_derive(kctx, out, len, params) > 0;
	EVP_KDF_CTX_free(kctx);
	return ok;
}

/* Keys d's AEAD from its current secret (RFC 8446 7.3); its record count
 * starts again. */
static bool set_keys(const struct suite *s, struct record_dir *d)
{
	uint8_t key[32];
	bool ok = expand_label(s, d->secret, "key", key, s->key_bytes) && expand_label(s, d->secret, "iv", d->iv, REC_IV) &&
		  EVP_CipherInit_ex(d->aead, NULL, NULL, key, NULL, -1);

	OPENSSL_cleanse(key, sizeof(key));
	d->seq = 0;
	return ok;
}

/* application_traffic_secret_N+1 (RFC 8446 7.2) and its keys. */
static bool next_keys(const struct suite *s, struct record_dir *d)
{
	uint8_t next[EVP_MAX_MD_SIZE];
	bool ok = expand_label(s, d->secret, "traffic upd", next, s->hash_bytes);

	if (ok)
		memcpy(d->secret, next, s->hash_bytes);
	OPENSSL_cleanse(next, sizeof(next));
	return ok && set_keys(s, d);
}

/* RFC 8446 5.3: the IV XOR the record's 64-bit sequence number. */
static void record_nonce(const struct record_dir *d, uint8_t nonce[REC_IV])
{
	memcpy(nonce, d->iv, REC_IV);
	for (int i = 0; i < 8; i++)
		nonce[REC_IV - 1 - i] ^= (uint8_t)(d->seq >> (8 * i));
}

/* A position in a sequence of buffers. */
struct cursor {
	const struct iovec *iov;
	size_t off;
};

/* Runs `len` bytes from `in` through the AEAD into `out`, advancing both;
 * either may hold at least `len` more bytes split anywhere. */
static bool aead_update(EVP_CIPHER_CTX *aead, struct cursor *in, struct cursor *out, size_t len)
{
	while (len) {
		while (in->off == in->iov->iov_len) {
			in->iov++;
			in->off = 0;
		}
		while (out->off == out->iov->iov_len) {
			out->iov++;
			out->off = 0;
		}
		size_t n = GG_MIN(len, GG_MIN(in->iov->iov_len - in->off, out->iov->iov_len - out->off));
		int outl;
		if (!EVP_CipherUpdate(aead, (uint8_t *)out->iov->iov_base + out->off, &outl,
				      (const uint8_t *)in->iov->iov_base + in->off, (int)n) ||
		    (size_t)outl != n)
			return false;
		in->off += n;
		out->off += n;
		len -= n;
	}
	return true;
}

/* Protects `len` bytes of content from `in` as one record of `type` at
 * the tail of the tx ring, which has room for it: one pass from the
 * caller's bytes to the ring, wherever the record wraps. */
static bool seal(struct gg_tls_engine *e, uint8_t type, struct cursor *in, size_t len)
{
	struct record_dir *w = &e->wr;
	size_t pos = e->tx.tail, body = len + 1 + REC_TAG;
	uint8_t head[REC_HEADER] = { CT_APPLICATION_DATA, 3, 3, (uint8_t)(body >> 8), (uint8_t)body };
	uint8_t nonce[REC_IV], tag[REC_TAG];
	struct iovec out_v[2], type_v = { &type, 1 };
	struct cursor out = { out_v, 0 }, type_in = { &type_v, 0 };
	int outl;

	record_nonce(w, nonce);
	ring_span(&e->tx, pos + REC_HEADER, len + 1, out_v);
	bool ok = EVP_EncryptInit_ex(w->aead, NULL, NULL, NULL, nonce) &&
		  EVP_EncryptUpdate(w->aead, NULL, &outl, head, REC_HEADER) && aead_update(w->aead, in, &out, len) &&
		  aead_update(w->aead, &type_in, &out, 1) && EVP_EncryptFinal_ex(w->aead, tag, &outl) &&
		  EVP_CIPHER_CTX_ctrl(w->aead, EVP_CTRL_AEAD_GET_TAG, REC_TAG, tag);
	OPENSSL_cleanse(nonce, sizeof(nonce));
	if (!ok)
		return false;
	ring_copy_in(&e->tx, pos, head, REC_HEADER);
	ring_copy_in(&e->tx, pos + REC_HEADER + len + 1, tag, REC_TAG);
	e->tx.tail += REC_HEADER + body;
	w->seq++;
	return true;
}

static bool seal_bytes(struct gg_tls_engine *e, uint8_t type, const uint8_t *content, size_t len)
{
	struct iovec v = { (void *)content, len };
	struct cursor in = { &v, 0 };

	return seal(e, type, &in, len);
}

/* A failure of the record layer: tells the peer with `alert` (-1: no
 * alert) while the write side is open and keyed, and words the message
 * with gg_tls_explain(). `reason` is the SSL_R_* code OpenSSL's own record
 * layer would have raised. */
GG_PRINTF(4, 5)
static int fail_records(struct gg_tls_engine *e, int alert, int reason, const char *fmt, ...)
{
	char text[200];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	if (alert >= 0 && e->suite && !e->write_closed && ring_free(&e->tx) >= ALERT_BYTES &&
	    seal_bytes(e, CT_ALERT, (const uint8_t[]){ ALERT_FATAL, (uint8_t)alert }, 2) && e->chk.alert_sent < 0)
		e->chk.alert_sent = alert;
	e->failure = gg_tls_explain(&e->chk, reason, text, e->error, sizeof(e->error));
	e->fail_rc = e->failure == GG_TLS_FAIL_CLOSED ? -ECONNRESET : -EPROTO;
	ERR_clear_error();
	return e->fail_rc;
}

/* OpenSSL could not derive or apply a key: nothing the peer did. */
static int fail_crypto(struct gg_tls_engine *e)
{
	const char *why = ERR_reason_error_string(ERR_peek_error());

	return fail_records(e, SSL_AD_INTERNAL_ERROR, ERR_R_INTERNAL_ERROR, "cannot protect records: %s",
			    why ? why : "unknown OpenSSL error");
}

/* RFC 8446 4.6.3: the last record under the current write key. */
static int send_key_update(struct gg_tls_engine *e)
{
	static const uint8_t msg[] = { HS_KEY_UPDATE, 0, 0, 1, 0 }; /* update_not_requested */

	if (!seal_bytes(e, CT_HANDSHAKE, msg, sizeof(msg)) || !next_keys(e->suite, &e->wr))
		return fail_crypto(e);
	e->key_update_due = false;
	return 0;
}

/* Whatever the owner does next, room for an alert stays in the tx ring. */
static bool tx_room(const struct gg_tls_engine *e, size_t content)
{
	size_t need = REC_BYTES(content) + ALERT_BYTES + (e->key_update_due ? KEY_UPDATE_BYTES : 0);

	return ring_free(&e->tx) >= need;
}

ssize_t gg_tls_engine_writev(struct gg_tls_engine *e, const struct iovec *iov, int iovcnt)
{
	struct cursor in = { iov, 0 };
	size_t total = 0, done = 0;

	if (e->failure)
		return e->fail_rc;
	if (!e->established)
		return -ENOTCONN;
	if (iovcnt < 0)
		return -EINVAL;
	for (int i = 0; i < iovcnt; i++) {
		if (iov[i].iov_len > SSIZE_MAX - total)
			return -EINVAL;
		total += iov[i].iov_len;
	}
	if (!total)
		return 0;
	if (e->write_closed)
		return -EPIPE;
	while (done < total) {
		size_t n = GG_MIN(total - done, (size_t)GG_TLS_RECORD_PLAINTEXT_MAX);
		if (!tx_room(e, n))
			break;
		int rc = e->key_update_due ? send_key_update(e) : 0;
		if (!rc && !seal(e, CT_APPLICATION_DATA, &in, n))
			rc = fail_crypto(e);
		if (rc)
			return done ? (ssize_t)done : rc;
		done += n;
		if (e->wr.seq >= e->key_update_records)
			e->key_update_due = true;
	}
	return done ? (ssize_t)done : -EAGAIN;
}

ssize_t gg_tls_engine_write(struct gg_tls_engine *e, const void *buf, size_t len)
{
	struct iovec v = { (void *)buf, len };

	return gg_tls_engine_writev(e, &v, 1);
}

static const char *content_type_name(unsigned type)
{
	switch (type) {
	case CT_CHANGE_CIPHER_SPEC: return "change_cipher_spec";
	case CT_ALERT: return "alert";
	case CT_HANDSHAKE: return "handshake";
	case CT_APPLICATION_DATA: return "application_data";
	default: return "unknown";
	}
}

static const char *handshake_name(unsigned type)
{
	switch (type) {
	case 1: return "ClientHello";
	case 2: return "ServerHello";
	case HS_NEW_SESSION_TICKET: return "NewSessionTicket";
	case 5: return "EndOfEarlyData";
	case 8: return "EncryptedExtensions";
	case 11: return "Certificate";
	case HS_CERTIFICATE_REQUEST: return "CertificateRequest";
	case 15: return "CertificateVerify";
	case 20: return "Finished";
	case HS_KEY_UPDATE: return "KeyUpdate";
	default: return "unknown";
	}
}

/* The plaintext of the record being opened: its first n1 bytes in the
 * caller's buffer, the rest in the staging buffer. */
struct opened {
	uint8_t *buf;
	size_t n1;
	const uint8_t *stage;
};

static uint8_t opened_at(const struct opened *o, size_t i)
{
	return i < o->n1 ? o->buf[i] : o->stage[i - o->n1];
}

/* The peer asked for our KeyUpdate: it goes out now when there is room,
 * else before our next record. Nothing goes out after close_notify. */
static int answer_key_update(struct gg_tls_engine *e)
{
	if (e->write_closed)
		return 0;
	e->key_update_due = true;
	return ring_free(&e->tx) >= KEY_UPDATE_BYTES + ALERT_BYTES ? send_key_update(e) : 0;
}

/* Post-handshake messages, which may be split across records or share
 * one: NewSessionTicket is skipped, KeyUpdate is followed, the rest is
 * refused. */
static int handshake_content(struct gg_tls_engine *e, const struct opened *o, size_t len)
{
	for (size_t i = 0; i < len;) {
		if (e->hs_head_len < sizeof(e->hs_head)) {
			e->hs_head[e->hs_head_len++] = opened_at(o, i++);
			if (e->hs_head_len < sizeof(e->hs_head))
				continue;
			unsigned type = e->hs_head[0];
			size_t body = (size_t)e->hs_head[1] << 16 | (size_t)e->hs_head[2] << 8 | e->hs_head[3];
			if (type == HS_KEY_UPDATE && body != 1)
				return fail_records(e, SSL_AD_DECODE_ERROR, SSL_R_BAD_LENGTH,
						    "KeyUpdate of %zu bytes (it has 1)", body);
			if (type != HS_KEY_UPDATE && (type != HS_NEW_SESSION_TICKET || e->chk.is_server))
				return fail_records(e, SSL_AD_UNEXPECTED_MESSAGE, SSL_R_UNEXPECTED_MESSAGE,
						    "unexpected %s (handshake message %u) after the handshake",
						    handshake_name(type), type);
			e->hs_body_left = body;
			e->hs_head_len = body ? e->hs_head_len : 0;
			continue;
		}
		if (e->hs_head[0] == HS_KEY_UPDATE) {
			uint8_t request = opened_at(o, i++);
			e->hs_head_len = 0;
			if (request > 1)
				return fail_records(e, SSL_AD_ILLEGAL_PARAMETER, SSL_R_BAD_KEY_UPDATE,
						    "KeyUpdate with request_update %u", request);
			/* RFC 8446 5.1: the bytes after it would be under the old key. */
			if (i != len)
				return fail_records(e, SSL_AD_UNEXPECTED_MESSAGE, SSL_R_NOT_ON_RECORD_BOUNDARY,
						    "KeyUpdate not at the end of its record");
			if (!next_keys(e->suite, &e->rd))
				return fail_crypto(e);
			return request ? answer_key_update(e) : 0;
		}
		size_t n = GG_MIN(e->hs_body_left, len - i);
		i += n;
		e->hs_body_left -= n;
		if (!e->hs_body_left)
			e->hs_head_len = 0;
	}
	return 0;
}

static ssize_t alert_content(struct gg_tls_engine *e, const struct opened *o, size_t len)
{
	if (len != 2)
		return fail_records(e, SSL_AD_DECODE_ERROR, SSL_R_BAD_LENGTH, "alert record of %zu bytes", len);
	unsigned desc = opened_at(o, 1);
	if (desc == SSL_AD_CLOSE_NOTIFY) {
		e->peer_closed = true;
		return 0;
	}
	if (desc == SSL_AD_USER_CANCELLED) /* RFC 8446 6.1: close_notify follows */
		return 0;
	e->chk.alert_received = (int)desc; /* gg_tls_explain words the failure from it */
	return fail_records(e, -1, SSL_R_UNEXPECTED_RECORD, "alert %u", desc);
}

/* The record at the head of the rx ring is not all there yet. */
static ssize_t record_incomplete(struct gg_tls_engine *e)
{
	if (e->rx_eof)
		return fail_records(e, -1, SSL_R_UNEXPECTED_EOF_WHILE_READING, "unexpected eof while reading");
	return -EAGAIN;
}

/* Opens the record at the head of the rx ring, decrypting its first
 * `avail` bytes into buf and the rest into the staging buffer. Returns the
 * application bytes it put in buf (0 for a record carrying none),
 * -EAGAIN while the record is incomplete, or the failure. */
static ssize_t open_record(struct gg_tls_engine *e, uint8_t *buf, size_t avail)
{
	struct record_dir *r = &e->rd;
	size_t used = ring_used(&e->rx);
	uint8_t head[REC_HEADER], nonce[REC_IV], tag[REC_TAG];
	struct iovec in_v[2];
	int outl;

	if (used < REC_HEADER)
		return record_incomplete(e);
	ring_copy_out(&e->rx, e->rx.head, head, REC_HEADER);
	size_t body = (size_t)head[3] << 8 | head[4];
	if (head[0] != CT_APPLICATION_DATA)
		return fail_records(e, SSL_AD_UNEXPECTED_MESSAGE, SSL_R_BAD_RECORD_TYPE,
				    "unprotected %s record (type %u) after the handshake", content_type_name(head[0]),
				    head[0]);
	if (body > REC_CIPHERTEXT_MAX)
		return fail_records(e, SSL_AD_RECORD_OVERFLOW, SSL_R_ENCRYPTED_LENGTH_TOO_LONG,
				    "record of %zu bytes, more than 2^14 + 256", body);
	if (body > REC_TAG + REC_INNER_MAX)
		return fail_records(e, SSL_AD_RECORD_OVERFLOW, SSL_R_DATA_LENGTH_TOO_LONG,
				    "record of %zu bytes holds more than 2^14 + 1 bytes of plaintext", body);
	if (used < REC_HEADER + body)
		return record_incomplete(e);
	if (body < REC_TAG)
		return fail_records(e, SSL_AD_BAD_RECORD_MAC, SSL_R_DECRYPTION_FAILED_OR_BAD_RECORD_MAC,
				    "decryption failed or bad record mac");
	if (r->seq == UINT64_MAX)
		return fail_records(e, SSL_AD_INTERNAL_ERROR, SSL_R_INVALID_SEQUENCE_NUMBER,
				    "the peer's record sequence numbers are used up");

	size_t inner = body - REC_TAG, n1 = GG_MIN(inner, avail);
	struct iovec out_v[2] = { { buf, n1 }, { e->stage, inner - n1 } };
	struct cursor in = { in_v, 0 }, out = { out_v, 0 };
	ring_span(&e->rx, e->rx.head + REC_HEADER, inner, in_v);
	ring_copy_out(&e->rx, e->rx.head + REC_HEADER + inner, tag, REC_TAG);
	record_nonce(r, nonce);
	bool ok = EVP_DecryptInit_ex(r->aead, NULL, NULL, NULL, nonce) &&
		  EVP_DecryptUpdate(r->aead, NULL, &outl, head, REC_HEADER) && aead_update(r->aead, &in, &out, inner) &&
		  EVP_CIPHER_CTX_ctrl(r->aead, EVP_CTRL_AEAD_SET_TAG, REC_TAG, tag) &&
		  EVP_DecryptFinal_ex(r->aead, tag, &outl) > 0;
	OPENSSL_cleanse(nonce, sizeof(nonce));
	if (!ok) {
		OPENSSL_cleanse(buf, n1);
		OPENSSL_cleanse(e->stage, inner - n1);
		return fail_records(e, SSL_AD_BAD_RECORD_MAC, SSL_R_DECRYPTION_FAILED_OR_BAD_RECORD_MAC,
				    "decryption failed or bad record mac");
	}
	e->rx.head += REC_HEADER + body;
	r->seq++;

	/* RFC 8446 5.4: the content type is the last non-zero byte. */
	struct opened o = { buf, n1, e->stage };
	size_t len = inner;
	while (len && !opened_at(&o, len - 1))
		len--;
	unsigned type = len ? opened_at(&o, --len) : 0;
	if (type == CT_APPLICATION_DATA && !e->hs_head_len) {
		e->stage_off = 0;
		e->stage_len = len > n1 ? len - n1 : 0;
		return (ssize_t)GG_MIN(len, n1);
	}
	ssize_t rc;
	if (e->hs_head_len && type != CT_HANDSHAKE)
		rc = fail_records(e, SSL_AD_UNEXPECTED_MESSAGE, SSL_R_UNEXPECTED_RECORD,
				  "%s record inside a handshake message", content_type_name(type));
	else if (type == CT_HANDSHAKE)
		rc = handshake_content(e, &o, len);
	else if (type == CT_ALERT)
		rc = alert_content(e, &o, len);
	else if (!type)
		rc = fail_records(e, SSL_AD_UNEXPECTED_MESSAGE, SSL_R_BAD_RECORD_TYPE, "record without a content type");
	else
		rc = fail_records(e, SSL_AD_UNEXPECTED_MESSAGE, SSL_R_UNEXPECTED_RECORD,
				  "protected %s record (type %u) after the handshake", content_type_name(type), type);
	OPENSSL_cleanse(buf, n1);
	return rc;
}

ssize_t gg_tls_engine_read(struct gg_tls_engine *e, void *buf, size_t len)
{
	uint8_t *p = buf;
	size_t done = 0;

	if (e->failure)
		return e->fail_rc;
	if (!e->established)
		return -ENOTCONN;
	if (e->stage_len) {
		done = GG_MIN(len, e->stage_len);
		memcpy(p, e->stage + e->stage_off, done);
		e->stage_off += done;
		e->stage_len -= done;
	}
	while (done < len && !e->peer_closed) {
		ssize_t n = open_record(e, p + done, len - done);
		if (n < 0) {
			if (n == -EAGAIN || done)
				break;
			return n;
		}
		done += (size_t)n;
	}
	if (done)
		return (ssize_t)done;
	return e->peer_closed ? 0 : -EAGAIN;
}

int gg_tls_engine_new(struct gg_tls_context *ctx, const struct gg_tls_engine_config *cfg, struct gg_tls_engine **out)
{
	struct gg_tls_engine *e = NULL;
	SSL_CTX *sc = NULL;
	BIO *bio = NULL;
	int rc = -EINVAL;

	*out = NULL;
	if (!cfg->sites || !cfg->site_count || cfg->site_count > GG_TLS_MAX_SITES ||
	    cfg->other_count > GG_TLS_MAX_SITES || (cfg->other_count && !cfg->others) ||
	    cfg->key_update_records > GG_TLS_KEY_UPDATE_RECORDS_DEFAULT)
		goto out;
	rc = -ENOMEM;
	pthread_once(&statics_once, make_statics);
	e = calloc(1, sizeof(*e));
	if (!ring_method || !hkdf || !e || ring_init(&e->rx, cfg->rx_ring_bytes) || ring_init(&e->tx, cfg->tx_ring_bytes) ||
	    !(e->stage = malloc(REC_INNER_MAX)))
		goto out;
	memcpy(e->sites, cfg->sites, cfg->site_count * sizeof(*cfg->sites));
	if (cfg->other_count)
		memcpy(e->others, cfg->others, cfg->other_count * sizeof(*cfg->others));
	snprintf(e->peer_addr, sizeof(e->peer_addr), "%s", cfg->peer_addr ? cfg->peer_addr : "?");
	e->key_update_records = cfg->key_update_records ? cfg->key_update_records : GG_TLS_KEY_UPDATE_RECORDS_DEFAULT;
	e->chk = (struct gg_tls_check){
		.sites = e->sites,
		.site_count = cfg->site_count,
		.others = e->others,
		.other_count = cfg->other_count,
		.peer_addr = e->peer_addr,
		.is_server = cfg->role == GG_TLS_SERVER,
		.matched_site = SIZE_MAX,
		.alert_sent = -1,
		.alert_received = -1,
		.secrets = &e->secrets,
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

static void record_dir_free(struct record_dir *d)
{
	EVP_CIPHER_CTX_free(d->aead);
	OPENSSL_cleanse(d, sizeof(*d));
}

void gg_tls_engine_free(struct gg_tls_engine *e)
{
	if (!e)
		return;
	SSL_free(e->ssl);
	record_dir_free(&e->rd);
	record_dir_free(&e->wr);
	OPENSSL_cleanse(&e->secrets, sizeof(e->secrets));
	free(e->stage);
	free(e->rx.buf);
	free(e->tx.buf);
	free(e);
}

void gg_tls_keylog_cb(const SSL *ssl, const char *line)
{
	static const char client[] = "CLIENT_TRAFFIC_SECRET_0 ", server[] = "SERVER_TRAFFIC_SECRET_0 ";
	struct gg_tls_check *chk = SSL_get_ex_data(ssl, gg_tls_check_index());
	struct gg_tls_secrets *s = chk ? chk->secrets : NULL;
	uint8_t *dst;
	size_t *len;

	if (!s)
		return;
	if (!strncmp(line, client, sizeof(client) - 1)) {
		dst = s->client;
		len = &s->client_len;
	} else if (!strncmp(line, server, sizeof(server) - 1)) {
		dst = s->server;
		len = &s->server_len;
	} else {
		return;
	}
	/* "LABEL CLIENT_RANDOM SECRET", in hex */
	const char *hex = strrchr(line, ' ') + 1;
	if (!OPENSSL_hexstr2buf_ex(dst, EVP_MAX_MD_SIZE, len, hex, '\0')) {
		OPENSSL_cleanse(dst, EVP_MAX_MD_SIZE);
		*len = 0;
	}
	ERR_clear_error();
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

/* The handshake is complete: the engine protects records from here on,
 * with the traffic secrets the keylog callback caught, each direction
 * starting at sequence number 0. OpenSSL must not have read past the
 * handshake's last record: those bytes would be lost. */
static int start_records(struct gg_tls_engine *e)
{
	const SSL_CIPHER *c = SSL_get_current_cipher(e->ssl);
	const struct suite *s = NULL;
	bool server = e->chk.is_server;

	e->cipher_name = c ? SSL_CIPHER_standard_name(c) : "none";
	for (size_t i = 0; c && i < GG_ARRAY_LEN(suites); i++)
		if (suites[i].id == SSL_CIPHER_get_protocol_id(c) && suites[i].evp)
			s = &suites[i];
	if (!s)
		return fail_records(e, -1, SSL_R_UNKNOWN_CIPHER_TYPE, "no record protection for ciphersuite %s",
				    e->cipher_name);
	if (e->secrets.client_len != s->hash_bytes || e->secrets.server_len != s->hash_bytes)
		return fail_records(e, -1, ERR_R_INTERNAL_ERROR, "the handshake gave no traffic secrets");
	memcpy(e->rd.secret, server ? e->secrets.client : e->secrets.server, s->hash_bytes);
	memcpy(e->wr.secret, server ? e->secrets.server : e->secrets.client, s->hash_bytes);
	OPENSSL_cleanse(&e->secrets, sizeof(e->secrets));
	if (!(e->rd.aead = EVP_CIPHER_CTX_new()) || !(e->wr.aead = EVP_CIPHER_CTX_new()) ||
	    !EVP_DecryptInit_ex(e->rd.aead, s->evp, NULL, NULL, NULL) ||
	    !EVP_EncryptInit_ex(e->wr.aead, s->evp, NULL, NULL, NULL) || !set_keys(s, &e->rd) || !set_keys(s, &e->wr))
		return fail_crypto(e);
	e->suite = s;
	if (SSL_has_pending(e->ssl))
		return fail_records(e, SSL_AD_UNEXPECTED_MESSAGE, SSL_R_NOT_ON_RECORD_BOUNDARY,
				    "OpenSSL read past the handshake's last record");
	SSL_free(e->ssl);
	e->ssl = NULL;
	return 0;
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
	e->chk.established = true;
	int rc = start_records(e);
	if (rc)
		return rc;
	if (e->chk.is_server && e->chk.matched_site < e->chk.site_count && e->sites[e->chk.matched_site].denied) {
		/* Proven, and not wanted: it hears why before anything it sent is read. */
		e->chk.denied = true;
		return fail_records(e, SSL_AD_ACCESS_DENIED, 0, "access denied");
	}
	e->established = true;
	return 0;
}

bool gg_tls_engine_established(const struct gg_tls_engine *e)
{
	return e->established && !e->failure;
}

int gg_tls_engine_shutdown(struct gg_tls_engine *e)
{
	static const uint8_t close_notify[] = { ALERT_WARNING, SSL_AD_CLOSE_NOTIFY };

	if (e->failure)
		return e->fail_rc;
	if (!e->established)
		return -ENOTCONN;
	if (e->write_closed)
		return 0;
	if (ring_free(&e->tx) < ALERT_BYTES)
		return -EAGAIN;
	if (!seal_bytes(e, CT_ALERT, close_notify, sizeof(close_notify)))
		return fail_crypto(e);
	e->write_closed = true;
	return 0;
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
	const SSL_CIPHER *c = e->ssl ? SSL_get_current_cipher(e->ssl) : NULL;

	if (e->cipher_name)
		return e->cipher_name;
	return c ? SSL_CIPHER_standard_name(c) : "none";
}

const char *gg_tls_engine_peer_addr(const struct gg_tls_engine *e)
{
	return e->peer_addr;
}
