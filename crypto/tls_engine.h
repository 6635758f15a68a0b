/* The TLS record engine of one connection, with no socket in it.
 *
 * OpenSSL runs the handshake over a BIO made of two bounded byte rings,
 * one per direction. Once the handshake completes, the engine protects
 * application records itself (RFC 8446 sections 5 and 7) with the traffic
 * secrets of the connection, and OpenSSL is done. Whoever owns the socket
 * (gateway/tls_stream.c drives it with io_uring) moves ciphertext between
 * the socket and the rings without copying it anywhere else:
 *
 *   socket --recv--> gg_tls_engine_rx_space()/rx_commit()  -> engine
 *   engine -> gg_tls_engine_tx_data()/tx_consume() --send--> socket
 *
 * and the application reads and writes plaintext with gg_tls_engine_read()
 * and gg_tls_engine_write(). Writes are encrypted in one pass from the
 * caller's buffer into full 16 KiB records in the tx ring; reads decrypt
 * records from the rx ring straight into the caller's buffer, and only the
 * part of a record that does not fit there goes to a one-record staging
 * buffer, handed out by the next reads.
 *
 * Memory per engine is bounded: the two rings (sizes fixed at creation),
 * one staging record, and OpenSSL's buffers while the handshake runs. When
 * the tx ring is full, writes return -EAGAIN; when the rx ring is full, the
 * owner stops receiving, which lets TCP flow control push back on the peer.
 *
 * After the handshake the engine skips NewSessionTicket, follows the
 * peer's KeyUpdate (answering one that asks for it), and moves its own
 * write key on with a KeyUpdate after key_update_records records.
 *
 * An engine is used by one thread at a time. The rx region handed out by
 * gg_tls_engine_rx_space() and the tx region from gg_tls_engine_tx_data()
 * stay valid and untouched by the engine until they are committed or
 * consumed, so a recv and a send may be in flight on them at once. */
#ifndef GG_TLS_ENGINE_H
#define GG_TLS_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "gg_common.h"
#include "tls_context.h"
#include "tls_verify.h"

#define GG_TLS_RECORD_PLAINTEXT_MAX 16384
#define GG_TLS_RING_MIN_BYTES (64u << 10)
#define GG_TLS_RING_DEFAULT_BYTES (256u << 10)
#define GG_TLS_ERROR_MAX 512
/* RFC 8446 5.5: an AES-GCM key protects at most 2^24.5 records. With the
 * KeyUpdate that ends it, a write key protects at most 2^24 records. */
#define GG_TLS_KEY_UPDATE_RECORDS_DEFAULT ((1u << 24) - 1)

enum gg_tls_role {
	GG_TLS_CLIENT, /* we connected: the peer is the server */
	GG_TLS_SERVER, /* we accepted */
};

struct gg_tls_engine_config {
	enum gg_tls_role role;
	const char *peer_addr; /* "10.0.0.2:7001", for messages; copied */
	/* The sites the peer may be (copied): its certificate must name one of
	 * them. A client passes the one site it dials; a server passes every
	 * site allowed to connect. 1..GG_TLS_MAX_SITES entries. */
	const struct gg_tls_site *sites;
	size_t site_count;
	/* Other sites' identities, which the certificate must not name as
	 * well (copied; a site of `sites` by name is left out): one that names
	 * two sites would pass for either. A client passes every peer; a
	 * server's `sites` serve for this already. 0..GG_TLS_MAX_SITES. */
	const struct gg_tls_site *others;
	size_t other_count;
	size_t rx_ring_bytes; /* 0: GG_TLS_RING_DEFAULT_BYTES; rounded up to a power of */
	size_t tx_ring_bytes; /* two, at least GG_TLS_RING_MIN_BYTES */
	/* Application records one write key protects before the engine sends
	 * a KeyUpdate and moves on to the next; 0: the default, which is also
	 * the largest value allowed. */
	uint32_t key_update_records;
};

struct gg_tls_engine;

/* Creates the engine with the context's current credentials. Returns 0
 * and sets *out (free with gg_tls_engine_free), -EINVAL for a bad config
 * (no sites, too many, key_update_records past the default), or -ENOMEM.
 * The engine does not refer to `ctx` after this returns. */
GG_MUST_CHECK int gg_tls_engine_new(struct gg_tls_context *ctx, const struct gg_tls_engine_config *cfg,
				    struct gg_tls_engine **out);
void gg_tls_engine_free(struct gg_tls_engine *e);

/* Ciphertext from the network. rx_space returns how many bytes may be
 * received at *buf (contiguous; 0 when the ring is full). rx_commit makes
 * n of them readable; rx_eof records that the peer closed its end. */
size_t gg_tls_engine_rx_space(struct gg_tls_engine *e, uint8_t **buf);
void gg_tls_engine_rx_commit(struct gg_tls_engine *e, size_t n);
void gg_tls_engine_rx_eof(struct gg_tls_engine *e);

/* Ciphertext for the network: tx_data returns how many bytes wait at *buf
 * (contiguous; there may be more after those are consumed); tx_consume
 * releases n of them once they are sent. */
size_t gg_tls_engine_tx_data(struct gg_tls_engine *e, const uint8_t **buf);
void gg_tls_engine_tx_consume(struct gg_tls_engine *e, size_t n);
size_t gg_tls_engine_tx_pending(const struct gg_tls_engine *e);

/* Advances the handshake with the ciphertext received so far. Returns 0
 * once it is complete (then gg_tls_engine_peer_site() tells which site the
 * peer is), -EAGAIN while it waits for the peer's bytes (send tx_data
 * first), or a failure: -EPROTO (refused: see gg_tls_engine_failure() and
 * gg_tls_engine_error()) or -ECONNRESET (the peer closed the connection).
 * After a failure, tx_data may still hold the alert telling the peer why:
 * send it before closing the socket. */
GG_MUST_CHECK int gg_tls_engine_handshake(struct gg_tls_engine *e);
bool gg_tls_engine_established(const struct gg_tls_engine *e);

/* Encrypts up to `len` bytes of plaintext into records in the tx ring.
 * Returns the number of bytes taken (> 0; 0 for len 0), -EAGAIN when the tx ring has no
 * room for a record (send tx_data, then call again with the same bytes),
 * -EPIPE after gg_tls_engine_shutdown(), or a failure as for
 * gg_tls_engine_handshake(). Records are full (16 KiB of plaintext) but
 * for the last one of a call. */
GG_MUST_CHECK ssize_t gg_tls_engine_write(struct gg_tls_engine *e, const void *buf, size_t len);

/* gg_tls_engine_write() of the iovcnt buffers one after the other, as one
 * stream: records span buffer boundaries, so a small message head and its
 * body share records. Returns as gg_tls_engine_write() does (bytes taken
 * from the start of the sequence), or -EINVAL for a negative iovcnt or a
 * total past SSIZE_MAX. */
GG_MUST_CHECK ssize_t gg_tls_engine_writev(struct gg_tls_engine *e, const struct iovec *iov, int iovcnt);

/* Decrypts up to `len` bytes of plaintext. Returns the number of bytes
 * (> 0), 0 when the peer closed the connection cleanly (close_notify),
 * -EAGAIN when more ciphertext is needed, or a failure as for
 * gg_tls_engine_handshake(): -EPROTO for a record that fails its checks
 * (the alert telling the peer why is then queued in tx_data) or a fatal
 * alert from the peer (in TLS 1.3 a server refuses a client's certificate
 * after the client's handshake completed: the client learns it here), and
 * -ECONNRESET when the connection ended without close_notify. Plaintext
 * is handed out only once its record's tag is verified. A read may queue
 * the KeyUpdate the peer asked for: send tx_data after reading. */
GG_MUST_CHECK ssize_t gg_tls_engine_read(struct gg_tls_engine *e, void *buf, size_t len);

/* Queues close_notify: the peer sees a clean end of data. Returns 0
 * (again 0 for a second call), -EAGAIN when the tx ring is full, or the
 * failure. The engine may still read: TLS 1.3 closes each direction on
 * its own. */
GG_MUST_CHECK int gg_tls_engine_shutdown(struct gg_tls_engine *e);

/* Marks the handshake as failed because its deadline passed, with the
 * central message ("handshake not completed within 200 ms"). */
void gg_tls_engine_fail_timeout(struct gg_tls_engine *e, uint64_t timeout_ms);

/* GG_TLS_OK until something failed; then why, and the message naming the
 * peer address, the expected identity and the reason, e.g.
 * "peer 127.0.0.1:7001: certificate does not name site 'site-b' (expected
 * identity dns:site-b.gradgate.test; certificate names
 * dns:site-c.gradgate.test)". */
enum gg_tls_failure gg_tls_engine_failure(const struct gg_tls_engine *e);
const char *gg_tls_engine_error(const struct gg_tls_engine *e);

/* After the handshake: the index (into the config's sites) of the site the
 * peer proved to be, and the negotiated ciphersuite's IANA name. */
size_t gg_tls_engine_peer_site(const struct gg_tls_engine *e);
const char *gg_tls_engine_cipher(const struct gg_tls_engine *e);
const char *gg_tls_engine_peer_addr(const struct gg_tls_engine *e);

#endif
