#include "tls_stream.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net_addr.h"

static uint64_t ud(const struct gg_tls_stream *s, unsigned kind)
{
	return gg_loop_ud(kind, s->index, 0);
}

static void set_error(struct gg_tls_stream *s, int err, const char *text)
{
	if (s->error)
		return;
	s->error = err;
	snprintf(s->error_text, sizeof(s->error_text), "%s", text);
	if (s->tls) {
		s->tls_failure = gg_tls_engine_failure(s->tls);
		s->peer_site = gg_tls_engine_peer_site(s->tls);
	}
	s->pending_ev |= GG_TLS_STREAM_EV_FAILED;
}

static int arm_recv(struct gg_tls_stream *s)
{
	uint8_t *buf;
	size_t n;
	int rc;

	if (s->recv_busy || s->peer_eof || !(n = gg_tls_engine_rx_space(s->tls, &buf)))
		return 0;
	rc = gg_loop_recv(s->loop, s->fd, buf, GG_MIN(n, s->opts.recv_max_bytes), 0, ud(s, GG_OP_RECV));
	s->recv_busy = rc == 0;
	return rc;
}

static int arm_send(struct gg_tls_stream *s)
{
	const uint8_t *buf;
	size_t n;
	int rc;

	if (s->send_busy || !s->connected || s->io_failed || !(n = gg_tls_engine_tx_data(s->tls, &buf)))
		return 0;
	rc = gg_loop_send(s->loop, s->fd, buf, GG_MIN(n, s->opts.send_max_bytes), ud(s, GG_OP_SEND));
	s->send_busy = rc == 0;
	return rc;
}

static bool flushed(const struct gg_tls_stream *s)
{
	return !s->send_busy && (s->io_failed || !s->connected || !gg_tls_engine_tx_pending(s->tls));
}

/* Arms what the state allows and moves a closing stream along; the one
 * place that changes state after the handshake. */
static void advance(struct gg_tls_stream *s)
{
	int rc = 0;

	switch (s->state) {
	case GG_TLS_STREAM_HANDSHAKE:
	case GG_TLS_STREAM_OPEN:
		if ((rc = arm_send(s)) || (rc = arm_recv(s)))
			break;
		if (s->write_shut && !s->fin_sent && flushed(s)) {
			shutdown(s->fd, SHUT_WR);
			s->fin_sent = true;
		}
		return;
	case GG_TLS_STREAM_DETACHING:
		if (s->recv_busy || s->send_busy) {
			if (!s->cancel_busy && gg_loop_cancel_fd(s->loop, s->fd, ud(s, GG_OP_CANCEL)) == 0)
				s->cancel_busy = true;
			return;
		}
		if (s->cancel_busy)
			return;
		s->state = GG_TLS_STREAM_DETACHED;
		s->pending_ev |= GG_TLS_STREAM_EV_DETACHED;
		return;
	case GG_TLS_STREAM_CLOSING:
		/* close_notify goes after what is queued; a full tx ring defers
		 * it to the next send completion, the close timeout bounds both. */
		if (s->notify_pending && gg_tls_engine_shutdown(s->tls) != -EAGAIN)
			s->notify_pending = false;
		if ((rc = arm_send(s)))
			break;
		if (!flushed(s) || (s->notify_pending && !s->io_failed))
			return;
		if (s->connected && !s->fin_sent && !s->io_failed)
			shutdown(s->fd, SHUT_WR);
		s->fin_sent = true;
		s->state = GG_TLS_STREAM_DRAINING;
		break;
	default:
		break;
	}
	if (rc) {
		set_error(s, rc, "io_uring submission failed");
		s->state = GG_TLS_STREAM_DRAINING;
	}
	if (s->state != GG_TLS_STREAM_DRAINING)
		return;
	if (s->recv_busy || s->send_busy || s->connect_busy) {
		if (!s->cancel_busy && gg_loop_cancel_fd(s->loop, s->fd, ud(s, GG_OP_CANCEL)) == 0)
			s->cancel_busy = true;
		return;
	}
	if (s->cancel_busy)
		return;
	close(s->fd);
	s->fd = -1;
	gg_tls_engine_free(s->tls);
	s->tls = NULL;
	s->deadline_us = 0;
	s->state = GG_TLS_STREAM_DONE;
	s->pending_ev |= GG_TLS_STREAM_EV_DONE;
}

/* A failure: with `flush`, the bytes queued (the alert telling the peer
 * why) are sent before the socket closes. */
static void fail(struct gg_tls_stream *s, int err, const char *text, bool flush)
{
	/* The engine names what went wrong in a handshake; a socket that
	 * failed under it means the peer went away. */
	if (s->state == GG_TLS_STREAM_HANDSHAKE && !s->error) {
		enum gg_tls_failure f = s->tls ? gg_tls_engine_failure(s->tls) : GG_TLS_OK;
		s->handshake_failure = f ? f : err == -EPIPE || err == -ECONNRESET ? GG_TLS_FAIL_CLOSED : GG_TLS_FAIL_PROTOCOL;
	}
	set_error(s, err, text);
	if (s->state >= GG_TLS_STREAM_CLOSING)
		return;
	s->state = flush ? GG_TLS_STREAM_CLOSING : GG_TLS_STREAM_DRAINING;
	s->deadline_us = gg_monotonic_us() + s->opts.close_timeout_us;
}

static void step_handshake(struct gg_tls_stream *s)
{
	int rc = gg_tls_engine_handshake(s->tls);

	if (rc == -EAGAIN)
		return;
	if (rc) {
		fail(s, rc, gg_tls_engine_error(s->tls), true);
		return;
	}
	s->state = GG_TLS_STREAM_OPEN;
	s->deadline_us = 0;
	s->pending_ev |= GG_TLS_STREAM_EV_OPEN | GG_TLS_STREAM_EV_READABLE;
}

static unsigned take_events(struct gg_tls_stream *s)
{
	unsigned ev = s->pending_ev;

	s->pending_ev = 0;
	return ev;
}

static void init(struct gg_tls_stream *s, struct gg_loop *loop, uint32_t index, struct gg_tls_engine *tls,
		 const struct gg_tls_stream_options *opts)
{
	memset(s, 0, sizeof(*s));
	s->loop = loop;
	s->index = index;
	s->tls = tls;
	s->fd = -1;
	s->peer_site = SIZE_MAX;
	if (opts)
		s->opts = *opts;
	if (!s->opts.handshake_timeout_us)
		s->opts.handshake_timeout_us = GG_TLS_STREAM_HANDSHAKE_TIMEOUT_US;
	if (!s->opts.connect_timeout_us)
		s->opts.connect_timeout_us = s->opts.handshake_timeout_us;
	if (!s->opts.close_timeout_us)
		s->opts.close_timeout_us = GG_TLS_STREAM_CLOSE_TIMEOUT_US;
	if (!s->opts.send_max_bytes)
		s->opts.send_max_bytes = GG_TLS_STREAM_IO_MAX_BYTES;
	if (!s->opts.recv_max_bytes)
		s->opts.recv_max_bytes = GG_TLS_STREAM_IO_MAX_BYTES;
	s->deadline_us = gg_monotonic_us() + s->opts.handshake_timeout_us;
}

void gg_tls_stream_accept(struct gg_tls_stream *s, struct gg_loop *loop, uint32_t index, int fd,
			  struct gg_tls_engine *tls, const struct gg_tls_stream_options *opts)
{
	init(s, loop, index, tls, opts);
	s->fd = fd;
	s->connected = true;
	s->state = GG_TLS_STREAM_HANDSHAKE;
	int rc = gg_net_tune(fd, s->opts.socket_buffer_bytes, s->opts.congestion);
	if (rc)
		fail(s, rc, "cannot set socket options", false);
	advance(s);
}

int gg_tls_stream_connect(struct gg_tls_stream *s, struct gg_loop *loop, uint32_t index, const struct sockaddr *addr,
			  socklen_t addr_len, struct gg_tls_engine *tls, const struct gg_tls_stream_options *opts)
{
	char text[GG_TLS_ERROR_MAX];
	int rc;

	init(s, loop, index, tls, opts);
	if (addr_len > sizeof(s->addr))
		addr_len = sizeof(s->addr);
	memcpy(&s->addr, addr, addr_len);
	s->state = GG_TLS_STREAM_CONNECTING;
	s->deadline_us = gg_monotonic_us() + s->opts.connect_timeout_us;
	s->fd = socket(addr->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s->fd < 0) {
		rc = -errno;
		snprintf(text, sizeof(text), "peer %s: cannot create a socket: %s", gg_tls_engine_peer_addr(tls),
			 strerror(-rc));
		gg_tls_engine_free(tls);
		s->tls = NULL;
		s->state = GG_TLS_STREAM_DONE;
		set_error(s, rc, text);
		/* Nothing is in flight: the owner may reuse the slot at once. */
		s->pending_ev |= GG_TLS_STREAM_EV_DONE;
		return rc;
	}
	rc = gg_net_tune(s->fd, s->opts.socket_buffer_bytes, s->opts.congestion);
	if (!rc)
		rc = gg_loop_connect(loop, s->fd, (struct sockaddr *)&s->addr, addr_len, ud(s, GG_OP_CONNECT));
	s->connect_busy = rc == 0;
	if (rc) {
		snprintf(text, sizeof(text), "peer %s: cannot start connecting: %s", gg_tls_engine_peer_addr(tls),
			 strerror(-rc));
		fail(s, rc, text, false);
		advance(s);
	}
	return 0;
}

unsigned gg_tls_stream_on_cqe(struct gg_tls_stream *s, const struct io_uring_cqe *cqe)
{
	char text[GG_TLS_ERROR_MAX];
	int res = cqe->res;

	switch (gg_loop_ud_kind(cqe->user_data)) {
	case GG_OP_CONNECT:
		s->connect_busy = false;
		if (s->state != GG_TLS_STREAM_CONNECTING)
			break;
		if (res < 0) {
			snprintf(text, sizeof(text), "peer %s: connect failed: %s", gg_tls_engine_peer_addr(s->tls),
				 strerror(-res));
			fail(s, res, text, false);
			break;
		}
		/* Dialing a port on this host that nothing listens on, TCP may
		 * give the socket that very port as its own and join it to
		 * itself: it would hold the port from the gateway meant to
		 * listen there (one that restarts) until the handshake failed. */
		if (gg_net_local_addr_is(s->fd, &s->addr)) {
			snprintf(text, sizeof(text), "peer %s: connect failed: nothing listens there (the connection "
				 "was joined to itself)", gg_tls_engine_peer_addr(s->tls));
			fail(s, -ECONNREFUSED, text, false);
			break;
		}
		s->connected = true;
		s->state = GG_TLS_STREAM_HANDSHAKE;
		s->deadline_us = gg_monotonic_us() + s->opts.handshake_timeout_us;
		step_handshake(s);
		break;
	case GG_OP_RECV:
		s->recv_busy = false;
		if (res > 0) {
			gg_tls_engine_rx_commit(s->tls, (size_t)res);
			s->wire_in_bytes += (uint64_t)res;
		} else if (s->state < GG_TLS_STREAM_CLOSING) {
			s->peer_eof = true; /* end of file, or a reset: the engine tells which it was */
			gg_tls_engine_rx_eof(s->tls);
		}
		if (s->state == GG_TLS_STREAM_HANDSHAKE)
			step_handshake(s);
		else if (s->state == GG_TLS_STREAM_OPEN)
			s->pending_ev |= GG_TLS_STREAM_EV_READABLE;
		break;
	case GG_OP_SEND:
		s->send_busy = false;
		if (res > 0) {
			gg_tls_engine_tx_consume(s->tls, (size_t)res);
			s->wire_out_bytes += (uint64_t)res;
			if (s->state == GG_TLS_STREAM_OPEN)
				s->pending_ev |= GG_TLS_STREAM_EV_WRITABLE;
			break;
		}
		s->io_failed = true;
		if (s->state < GG_TLS_STREAM_CLOSING) {
			snprintf(text, sizeof(text), "peer %s: send failed: %s", gg_tls_engine_peer_addr(s->tls),
				 strerror(res ? -res : EPIPE));
			fail(s, res ? res : -EPIPE, text, false);
		}
		break;
	case GG_OP_CANCEL:
		s->cancel_busy = false;
		break;
	default:
		break;
	}
	advance(s);
	return take_events(s);
}

unsigned gg_tls_stream_tick(struct gg_tls_stream *s, uint64_t now_us)
{
	char text[GG_TLS_ERROR_MAX];

	if (s->deadline_us && now_us >= s->deadline_us) {
		s->deadline_us = 0;
		switch (s->state) {
		case GG_TLS_STREAM_CONNECTING:
			snprintf(text, sizeof(text), "peer %s: connection not established within %llu ms",
				 gg_tls_engine_peer_addr(s->tls), (unsigned long long)(s->opts.connect_timeout_us / 1000));
			fail(s, -ETIMEDOUT, text, false);
			break;
		case GG_TLS_STREAM_HANDSHAKE:
			gg_tls_engine_fail_timeout(s->tls, s->opts.handshake_timeout_us / 1000);
			fail(s, -ETIMEDOUT, gg_tls_engine_error(s->tls), false);
			break;
		case GG_TLS_STREAM_CLOSING:
			s->state = GG_TLS_STREAM_DRAINING;
			break;
		default:
			break;
		}
		advance(s);
	}
	return take_events(s);
}

ssize_t gg_tls_stream_read(struct gg_tls_stream *s, void *buf, size_t len)
{
	if (s->error)
		return s->error;
	if (s->state != GG_TLS_STREAM_OPEN)
		return -ENOTCONN;
	ssize_t n = gg_tls_engine_read(s->tls, buf, len);
	if (n < 0 && n != -EAGAIN)
		fail(s, (int)n, gg_tls_engine_error(s->tls), true);
	advance(s);
	return n;
}

ssize_t gg_tls_stream_writev(struct gg_tls_stream *s, const struct iovec *iov, int iovcnt)
{
	if (s->error)
		return s->error;
	if (s->state != GG_TLS_STREAM_OPEN)
		return -ENOTCONN;
	if (s->write_shut)
		return -EPIPE;
	ssize_t n = gg_tls_engine_writev(s->tls, iov, iovcnt);
	if (n < 0 && n != -EAGAIN)
		fail(s, (int)n, gg_tls_engine_error(s->tls), true);
	advance(s);
	return n;
}

ssize_t gg_tls_stream_write(struct gg_tls_stream *s, const void *buf, size_t len)
{
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };

	return gg_tls_stream_writev(s, &iov, 1);
}

int gg_tls_stream_shutdown(struct gg_tls_stream *s)
{
	if (s->state != GG_TLS_STREAM_OPEN)
		return -ENOTCONN;
	if (s->write_shut)
		return 0;
	int rc = gg_tls_engine_shutdown(s->tls);
	if (rc == -EAGAIN)
		return rc;
	if (rc)
		fail(s, rc, gg_tls_engine_error(s->tls), false);
	else
		s->write_shut = true;
	advance(s);
	return rc;
}

unsigned gg_tls_stream_close(struct gg_tls_stream *s)
{
	if (s->state >= GG_TLS_STREAM_CONNECTING && s->state < GG_TLS_STREAM_CLOSING) {
		/* Lets the peer tell a close from a cut or a truncation. */
		s->notify_pending = s->state == GG_TLS_STREAM_OPEN && !s->write_shut && !s->error;
		s->state = GG_TLS_STREAM_CLOSING;
		s->deadline_us = gg_monotonic_us() + s->opts.close_timeout_us;
	}
	advance(s);
	return take_events(s);
}

unsigned gg_tls_stream_abort(struct gg_tls_stream *s)
{
	if ((s->state >= GG_TLS_STREAM_CONNECTING && s->state < GG_TLS_STREAM_DRAINING) ||
	    s->state == GG_TLS_STREAM_DETACHING)
		s->state = GG_TLS_STREAM_DRAINING;
	advance(s);
	return take_events(s);
}

bool gg_tls_stream_busy(const struct gg_tls_stream *s)
{
	return s->recv_busy || s->send_busy || s->connect_busy || s->cancel_busy;
}

const char *gg_tls_stream_error(const struct gg_tls_stream *s)
{
	return s->error_text;
}

int gg_tls_stream_detach(struct gg_tls_stream *s)
{
	if (s->state != GG_TLS_STREAM_OPEN || s->error)
		return -ENOTCONN;
	s->state = GG_TLS_STREAM_DETACHING;
	advance(s);
	return 0;
}

void gg_tls_stream_take(struct gg_tls_stream *s, int *fd, struct gg_tls_engine **tls)
{
	*fd = s->fd;
	*tls = s->tls;
	s->fd = -1;
	s->tls = NULL;
	s->state = GG_TLS_STREAM_FREE;
}

void gg_tls_stream_adopt(struct gg_tls_stream *s, struct gg_loop *loop, uint32_t index, int fd,
			 struct gg_tls_engine *tls, const struct gg_tls_stream_options *opts)
{
	init(s, loop, index, tls, opts);
	s->fd = fd;
	s->connected = true;
	s->state = GG_TLS_STREAM_OPEN;
	s->deadline_us = 0;
	s->pending_ev |= GG_TLS_STREAM_EV_READABLE | GG_TLS_STREAM_EV_WRITABLE;
	advance(s);
}
