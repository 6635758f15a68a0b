/* A TLS connection driven by io_uring: a socket, a gg_tls_engine, and the
 * state machine between them (connect, handshake with a deadline, data,
 * flushing the last alert or close_notify, closing).
 *
 * The stream never blocks and never calls read/write on its socket: it
 * keeps at most one recv and one send in flight on its loop, receiving
 * straight into the engine's rx ring and sending straight from its tx
 * ring. The owner keeps streams in a table and routes completions to them
 * by the index packed in user_data:
 *
 *   case GG_OP_CONNECT: case GG_OP_RECV: case GG_OP_SEND: case GG_OP_CANCEL:
 *           ev = gg_tls_stream_on_cqe(&streams[gg_loop_ud_index(ud)], cqe);
 *
 * and acts on the events returned (bits of GG_TLS_STREAM_EV_*). After each
 * gg_loop_run it calls gg_tls_stream_tick() so deadlines fire; the
 * earliest is gg_tls_stream_deadline_us().
 *
 * Life of a stream: gg_tls_stream_accept() or gg_tls_stream_connect() ->
 * EV_OPEN (or EV_FAILED) -> reads and writes -> gg_tls_stream_close(), or
 * a failure -> EV_DONE: the socket is closed, the engine freed, nothing is
 * in flight, and the slot may be reused. gg_tls_stream_error() stays
 * readable until then. */
#ifndef GG_TLS_STREAM_H
#define GG_TLS_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "gg_common.h"
#include "tls_engine.h"
#include "uring_loop.h"

#define GG_TLS_STREAM_HANDSHAKE_TIMEOUT_US 10000000u
#define GG_TLS_STREAM_CLOSE_TIMEOUT_US 1000000u
#define GG_TLS_STREAM_IO_MAX_BYTES (256u << 10)

struct gg_tls_stream_options {
	uint64_t connect_timeout_us;   /* a dialed stream's TCP connect; 0: handshake_timeout_us */
	uint64_t handshake_timeout_us; /* the TLS handshake once connected; 0: 10 s */
	uint64_t close_timeout_us;     /* flushing the last bytes before closing; 0: 1 s */
	size_t send_max_bytes;         /* largest single send; 0: 256 KiB */
	size_t recv_max_bytes;         /* largest single recv; 0: 256 KiB */
	int socket_buffer_bytes;       /* SO_SNDBUF/SO_RCVBUF; 0: kernel autotuning */
	const char *congestion;        /* TCP_CONGESTION; NULL: the system's default */
};

enum gg_tls_stream_state {
	GG_TLS_STREAM_FREE = 0,
	GG_TLS_STREAM_CONNECTING,
	GG_TLS_STREAM_HANDSHAKE,
	GG_TLS_STREAM_OPEN,
	GG_TLS_STREAM_CLOSING,  /* flushing the last bytes (alert, close_notify) */
	GG_TLS_STREAM_DRAINING, /* waiting for the operations in flight */
	GG_TLS_STREAM_DONE,
	GG_TLS_STREAM_DETACHING, /* open, waiting for its operations before it moves to another loop */
	GG_TLS_STREAM_DETACHED,  /* nothing in flight: gg_tls_stream_take() hands over socket and engine */
};

#define GG_TLS_STREAM_EV_OPEN 1u     /* handshake complete: the peer is proven */
#define GG_TLS_STREAM_EV_READABLE 2u /* call gg_tls_stream_read */
#define GG_TLS_STREAM_EV_WRITABLE 4u /* tx room freed: a write that returned -EAGAIN may go on */
#define GG_TLS_STREAM_EV_FAILED 8u   /* see gg_tls_stream_error(); the stream closes itself */
#define GG_TLS_STREAM_EV_DONE 16u    /* closed and idle: the slot may be reused */
#define GG_TLS_STREAM_EV_DETACHED 32u /* gg_tls_stream_detach() finished: call gg_tls_stream_take() */

struct gg_tls_stream {
	struct gg_loop *loop;
	struct gg_tls_engine *tls;
	struct gg_tls_stream_options opts;
	enum gg_tls_stream_state state;
	int fd;
	uint32_t index;
	bool recv_busy, send_busy, connect_busy, cancel_busy;
	bool connected;
	bool io_failed;    /* a send failed: nothing more can be sent */
	bool peer_eof;     /* the socket reached end of file */
	bool write_shut;   /* close_notify queued: no more writes */
	bool notify_pending; /* closing: close_notify still to be queued */
	bool fin_sent;
	uint64_t deadline_us; /* 0: none */
	uint64_t wire_in_bytes, wire_out_bytes; /* what the socket carried, TLS records and handshake */
	enum gg_tls_failure handshake_failure;  /* why the handshake failed; GG_TLS_OK: it did not */
	unsigned pending_ev; /* events not yet returned to the owner */
	int error;         /* 0, or the negative errno the stream failed with */
	char error_text[GG_TLS_ERROR_MAX];
	/* Once it failed: the engine's account of why (GG_TLS_OK when TLS had
	 * no part in it), and the site the peer proved (SIZE_MAX: none), kept
	 * here since the engine is freed with the socket. */
	enum gg_tls_failure tls_failure;
	size_t peer_site;
	struct sockaddr_storage addr; /* the connect target */
	socklen_t addr_len;
};

/* Starts the server side of a connection accepted on `fd`. The stream
 * takes ownership of fd and tls; a failure to start (a broken ring) is
 * reported as EV_FAILED by the next tick. */
void gg_tls_stream_accept(struct gg_tls_stream *s, struct gg_loop *loop, uint32_t index, int fd,
			  struct gg_tls_engine *tls, const struct gg_tls_stream_options *opts);

/* Connects to `addr` and runs the client handshake. Takes ownership of
 * tls in every case. Returns 0 or a negative errno (socket creation
 * failed; the stream is then DONE, and the next tick reports EV_FAILED
 * and EV_DONE). */
GG_MUST_CHECK int gg_tls_stream_connect(struct gg_tls_stream *s, struct gg_loop *loop, uint32_t index,
					const struct sockaddr *addr, socklen_t addr_len, struct gg_tls_engine *tls,
					const struct gg_tls_stream_options *opts);

/* Handles a completion whose user_data names this stream. Returns events. */
unsigned gg_tls_stream_on_cqe(struct gg_tls_stream *s, const struct io_uring_cqe *cqe);

/* Fires the stream's deadline when `now_us` passed it. Returns events,
 * including those caused by read, write or shutdown calls since the last
 * on_cqe or tick (a failure found by a read, say): call it for every live
 * stream after each gg_loop_run. */
unsigned gg_tls_stream_tick(struct gg_tls_stream *s, uint64_t now_us);
static inline uint64_t gg_tls_stream_deadline_us(const struct gg_tls_stream *s)
{
	return s->deadline_us;
}

/* Plaintext, once open. read: bytes (> 0), 0 at the peer's close_notify,
 * -EAGAIN (wait for EV_READABLE), or the failure. write: bytes taken
 * (> 0), -EAGAIN (wait for EV_WRITABLE, then repeat with the same bytes),
 * or the failure. Both return -ENOTCONN before EV_OPEN. */
GG_MUST_CHECK ssize_t gg_tls_stream_read(struct gg_tls_stream *s, void *buf, size_t len);
GG_MUST_CHECK ssize_t gg_tls_stream_write(struct gg_tls_stream *s, const void *buf, size_t len);
/* write() of several buffers as one: a small head shares records with
 * the body after it. */
GG_MUST_CHECK ssize_t gg_tls_stream_writev(struct gg_tls_stream *s, const struct iovec *iov, int iovcnt);

/* Sends close_notify and then FIN once everything before it is sent; the
 * stream may still read (TLS 1.3 half-close). Returns 0 or -ENOTCONN. */
GG_MUST_CHECK int gg_tls_stream_shutdown(struct gg_tls_stream *s);

/* Stops reading, sends what is queued and then close_notify (an open
 * stream's; within the close timeout, never waiting beyond it), and
 * closes. Returns events (EV_DONE when that finished at once). */
unsigned gg_tls_stream_close(struct gg_tls_stream *s);

/* Closes at once, sending nothing more: cancels what is in flight, and
 * reports EV_DONE (maybe at once) when the kernel is done with the
 * stream's buffers. For teardown. */
unsigned gg_tls_stream_abort(struct gg_tls_stream *s);
/* Whether an operation of the stream is in flight on its loop: until it
 * completes, neither the engine nor the stream may be freed. */
bool gg_tls_stream_busy(const struct gg_tls_stream *s);

const char *gg_tls_stream_error(const struct gg_tls_stream *s);

/* Moving an open stream to another thread's loop: detach() stops reading
 * and cancels what is in flight on this loop (the engine keeps every byte
 * received so far); once EV_DETACHED comes (maybe at once), take() hands
 * over the socket and the engine and leaves the slot free. The other
 * thread then calls adopt(), which goes on where the stream stopped.
 * Writes queued in the engine's tx ring go out after adopt(). detach()
 * returns -ENOTCONN unless the stream is open. */
GG_MUST_CHECK int gg_tls_stream_detach(struct gg_tls_stream *s);
void gg_tls_stream_take(struct gg_tls_stream *s, int *fd, struct gg_tls_engine **tls);
/* Takes over an open connection: fd and tls from gg_tls_stream_take(). The
 * stream is OPEN and reports EV_READABLE from its first tick. */
void gg_tls_stream_adopt(struct gg_tls_stream *s, struct gg_loop *loop, uint32_t index, int fd,
			 struct gg_tls_engine *tls, const struct gg_tls_stream_options *opts);

#endif
