#include "mesh.h"

#include <arpa/inet.h>
#include <errno.h>
#include <linux/tcp.h> /* struct tcp_info with the delivery rate; glibc's stops short */
#include <linux/sockios.h> /* SIOCOUTQ */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "acceptor.h"
#include "log.h"
#include "net_addr.h"
#include "resolver.h"
#include "tls_stream.h"
#include "units.h"

#define CTRL_MSG_MAX GG_WIRE_CONTROL_MAX
/* Entries queued on one stream; control messages queued back to back
 * share an entry (queue_ctrl()), so each holds ten ACKs or more. */
#define CONN_TXQ 512
#define CONN_TXQ_ACKS 6144 /* ... and entries of ACKs past that: see gg_mesh_ack() */
/* DATA frames one stream holds unwritten (the one being written among
 * them). A frame goes to a stream that holds fewer, and waits in its
 * peer's list while every stream holds this many; a stream takes the next
 * one as it writes the last bytes of its frame into its TLS records, which
 * keep its socket busy meanwhile. So a stream that the network slows stops
 * taking frames once its socket backs up, and the others carry the rest. */
#define STREAM_FRAMES 1
/* A frame goes once more on a stream with nothing to write when its own
 * stream moves HEDGE_FACTOR times slower, and what it holds ahead of the
 * frame would take HEDGE_FACTOR times longer, and HEDGE_MIN_US longer,
 * than the copy (hedge()); "moves" as measured over the last
 * HEDGE_WATCH_RTTS round trips, and at least HEDGE_WATCH_MIN_US, while
 * the other stream stood idle. */
#define HEDGE_FACTOR 2
#define HEDGE_MIN_US 20000
#define HEDGE_WATCH_RTTS 4
#define HEDGE_WATCH_MIN_US 20000
#define TEARDOWN_US 1000000 /* gg_mesh_free() waits this long for the kernel */
#define LISTENER_INDEX UINT32_MAX /* user_data index of the listener's cancel */
#define RATE_WINDOW_US 1000000 /* delivery rate: over this much time with DATA in flight */
#define RTT_MIN_WINDOW_US 10000000 /* the shortest round trip: of this window and the one before */
#define TUNE_US 250000 /* a stream's unsent bound and buffers are looked at this often */
/* A stream that goes down within STEADY_US of coming up flapped; after
 * FLAPS_BEFORE_BACKOFF flaps in a row its coming up no longer starts the
 * back-off again (retry_later()): a link that resets each connection once
 * data flows (a middlebox; frames re-sent that fail again) is dialed ever
 * less often, up to reconnect_max apart, not every reconnect_min. */
#define STEADY_US 1000000
#define FLAPS_BEFORE_BACKOFF 3

/* An outgoing message: a head and, for DATA, a frame. A control entry's
 * head holds any control message (a HELLO of eight sites with long names
 * takes up to 557 bytes), or several back to back; a DATA entry's, its
 * header. */
#define DATA_HEAD_MAX (GG_WIRE_HEADER_BYTES + GG_WIRE_DATA_FIXED_BYTES)
struct out {
	struct out *next;
	size_t head_len, head_cap;
	struct gg_buf *frame; /* NULL unless DATA */
	size_t off;           /* bytes of head + frame written */
	/* DATA only: what the ACK names, and where the message is. */
	bool hedged;          /* unacked: a second copy went on another stream */
	bool forgotten;       /* unacked: its step failed or its job ended here (gg_mesh_forget()) */
	char job[GG_WIRE_NAME_MAX + 1];
	uint64_t run, seq;
	struct gg_ar_chunk_id id;
	int conn;             /* stream it was written to; -1: waiting */
	uint64_t raw_bytes;   /* the float32 bytes the frame carries */
	bool counted;         /* a stream took it once (gg_mesh_peer_stats) */
	uint8_t head[];       /* head_cap bytes: CTRL_MSG_MAX, or DATA_HEAD_MAX for DATA */
};

static struct out *out_new(size_t head_cap)
{
	struct out *o = calloc(1, sizeof(*o) + head_cap);

	if (o)
		o->head_cap = head_cap;
	return o;
}

/* A second entry for the same DATA (its frame referenced once more). */
static struct out *out_copy(const struct out *o)
{
	struct out *c = malloc(sizeof(*c) + o->head_cap);

	if (c) {
		memcpy(c, o, sizeof(*c) + o->head_cap);
		gg_buf_get(c->frame);
	}
	return c;
}

struct conn {
	struct gg_tls_stream ts;
	bool used;
	bool ready;  /* HELLOs exchanged */
	bool lost;   /* conn_lost() ran */
	bool duplicate; /* closed as the one of two connections for a stream that is not kept */
	bool peer_closed; /* the peer ended it in order (close_notify, or end of file) */
	bool dialer;
	bool handshake; /* accepted, HELLO not yet taken: in the handshake pool */
	uint8_t ip[16]; /* handshake: the peer's address (IPv4 mapped into IPv6) */
	uint64_t since_us; /* handshake: when it was accepted */
	uint64_t ready_us; /* when it became ready */
	int peer;    /* site index, -1 until known */
	int stream;  /* stream number, -1 until known */
	struct gg_mesh_handoff *moving; /* being handed to the lane that owns it */
	/* The message being read: its header, then its payload into `msg`
	 * (DATA) or `small`. */
	uint8_t hdr[GG_WIRE_HEADER_BYTES];
	size_t hdr_len;
	enum gg_wire_type type;
	size_t need, have;   /* payload bytes in all and so far; need 0: reading the header */
	bool in_payload;
	struct gg_buf *msg;
	uint8_t *small;      /* CTRL_MSG_MAX bytes */
	struct out *txq_head, *txq_tail; /* being written */
	unsigned txq_count;
	unsigned txq_frames; /* DATA among them (STREAM_FRAMES) */
	uint64_t last_rx_us, ping_sent_us, last_ping_us;
	uint64_t tune_next_us;      /* the next look at its TCP state (tune_stream()) */
	uint32_t lowat;             /* its TCP_NOTSENT_LOWAT; 0: GG_NET_NOTSENT_LOWAT_MIN, as set at start */
	uint64_t bytes_acked;       /* tcpi_bytes_acked at the last look */
	uint64_t rate;              /* bytes/s acked over a look's span, or half the last figure if more */
	/* hedge(): tcpi_bytes_acked at watch_us, since when the stream's
	 * delivery is watched while another stream to its peer idles; 0:
	 * not watched. */
	uint64_t watch_us, watch_acked;
	uint64_t acked_us;          /* when bytes_acked was read */
	bool carried;               /* DATA was written or read since the last look */
	uint64_t sndbuf_limited_us; /* tcpi_sndbuf_limited then */
	uint64_t wire_in_seen, wire_out_seen; /* the stream's wire bytes counted for its peer so far */
	uint32_t gen;        /* counts the slot's uses: a via names one of them */
	bool flush_pending;  /* messages were queued during this turn */
	/* Tests (gg_mesh_test_open): no socket; writes go to test_sent, reads
	 * come from test_in. */
	gg_mesh_test_sent_fn *test_sent;
	void *test_arg;
	const uint8_t *test_in;
	size_t test_left;
	bool test_eof;
};

/* Bytes acknowledged over time with DATA in flight (rate_window_turn()). */
struct rate_window {
	uint64_t since_us; /* 0: nothing in flight */
	uint64_t busy_us, bytes;
};

/* Lines about a peer's streams, which it can cause at will by connecting
 * again and again once it holds a site's key: each kind has a second's
 * worth of every stream coming and going twice, and the rest are counted
 * (gg_mesh_tick() says how many). */
enum peer_log { PEER_LOG_UP, PEER_LOG_DOWN, PEER_LOG_RESTARTED, PEER_LOG_MISMATCH, PEER_LOGS };
static const char *const peer_log_events[PEER_LOGS] = { "stream_up", "stream_down", "peer_restarted",
							"peer_mismatch" };
static const enum gg_log_level peer_log_levels[PEER_LOGS] = { GG_LOG_INFO, GG_LOG_WARN, GG_LOG_WARN, GG_LOG_ERROR };
/* Connections that never proved a site's identity, which anyone who
 * reaches the port can make: this many lines a second. */
#define UNAUTH_LINES 10

struct peer {
	int conn[GG_MESH_MAX_STREAMS]; /* per stream number: conn index or -1 */
	/* Per stream number: a dial of ours still being set up while conn[]
	 * holds the peer's connection for it (which it replaces once up), or
	 * -1. Only where both sites dial and this one's name sorts first. */
	int dialing[GG_MESH_MAX_STREAMS];
	uint64_t next_dial_us[GG_MESH_MAX_STREAMS];
	uint64_t backoff_us[GG_MESH_MAX_STREAMS];
	uint8_t flaps[GG_MESH_MAX_STREAMS]; /* the stream went down this often in a row within STEADY_US of up */
	uint64_t instance_id;          /* 0 until the first HELLO */
	uint64_t inflight_bytes;       /* the peer's inflight_per_peer, from its HELLO; 0 until then */
	uint64_t held_us;              /* DATA kept over a restart waits for gg_mesh_release_peer() since; 0: none */
	struct out *unacked;           /* DATA written or waiting, until ACKed */
	uint64_t unacked_bytes;
	struct out *waiting;           /* DATA held back by the in-flight bound */
	/* The delivery rate's window: time with DATA unacknowledged, and the
	 * frame bytes acknowledged meanwhile. */
	struct rate_window delivery;
	/* The shortest round trip of the current window and the one before. */
	uint64_t rtt_window_us, rtt_min_now, rtt_min_before;
	struct gg_tls_site tls_site;
	char address[GG_NET_ADDR_TEXT_MAX + 256];
	enum gg_peer_dial dial; /* [[peers]] dial: who opens the streams */
	bool denied;            /* it refused a dial of ours with access_denied (its dial for us is "out") */
	struct gg_log_limit dial_warn, accept_warn; /* our dials it refused, its connections we refused */
	struct gg_log_limit log[PEER_LOGS];         /* lines a peer causes by reconnecting (peer_log_now()) */
};

struct gg_mesh {
	const struct gg_config *cfg;
	const struct gg_mesh_ops *ops;
	void *owner;
	unsigned sites, self;
	char names[GG_AR_MAX_SITES][GG_WIRE_NAME_MAX + 1];
	struct peer peers[GG_AR_MAX_SITES];
	struct rate_window uplink; /* over all peers: time with DATA in flight to any */
	struct gg_tls_site accept_sites[GG_AR_MAX_SITES]; /* every peer; those we refuse are denied */
	int accept_map[GG_AR_MAX_SITES];                  /* accept_sites index -> site */
	size_t accept_count;
	struct gg_tls_context *tls;
	struct gg_resolver *resolver;
	bool own_resolver;
	struct gg_tls_stream_options sopts;
	struct gg_loop *loop;
	struct gg_buf_pool *pool;
	struct gg_acceptor accept; /* the listening socket (fd -1: none) and its accept */
	struct gg_log_limit accept_log; /* failed accepts: a line a second */
	/* The table: stream_slots for streams this lane dials or holds, the
	 * rest for the handshake pool (see size_table()). */
	struct conn *conns;
	int conn_cap;
	int stream_slots, streams;
	int handshake_slots, handshakes, handshakes_per_address;
	/* A connection accepted while the pool was full, whose address held
	 * fewer of its slots than another: it gets the slot of the other's
	 * oldest handshake, closed for it, once that is free (-1: none). */
	int admit_fd;
	uint8_t admit_ip[16];
	uint64_t admit_until_us;
	struct gg_log_limit slot_warn, refusal_warn, evict_warn;
	struct gg_log_limit unauth_log; /* stream_down of connections no site's identity was proved on */
	struct gg_wire_hello hello;
	struct gg_net_buffer_limits buffer_limits;
	bool buffer_warned[2]; /* socket_buffer_capped logged: receive, send */
	bool test_own_window;  /* gg_mesh_test_own_window() */
	size_t max_payload;
	struct gg_mesh_stats stats;
	uint64_t heard[GG_AR_MAX_SITES]; /* last receive from each peer */
	/* After this lane's own loop stood still (the process was stopped,
	 * or starved): no stream is judged silent before stall_grace_us,
	 * since nothing could be heard meanwhile. */
	uint64_t tick_last_us, stall_grace_us;
	uint64_t hedge_due_us; /* the first watch of hedge() that ends; 0: none */
	unsigned flush_count; /* streams with flush_pending */
	unsigned lane, lanes;
	bool listen;
	bool acceptor; /* owns no stream: accepts, and hands every stream to its lane */
	bool shutting_down;
};

/* Whether to log now a warning that can come in floods: one line a second
 * at most; log_limits_flush() tells what it held back. */
static bool warn_now(struct gg_log_limit *w, uint64_t now_us)
{
	return gg_log_limit_now(w, now_us, 1);
}

/* Whether to log now a line of `kind` about `peer` (-1: a connection whose
 * peer never proved who it is, whose lines are stream_down). */
static bool peer_log_now(struct gg_mesh *m, int peer, enum peer_log kind)
{
	if (peer < 0)
		return gg_log_limit_now(&m->unauth_log, m->loop->now_us, UNAUTH_LINES);
	return gg_log_limit_now(&m->peers[peer].log[kind], m->loop->now_us,
				4 * (unsigned)m->cfg->transport.streams_per_peer + 8);
}

/* Says what the limits held back, once their second is over; returns when
 * to look again. */
static uint64_t log_limits_flush(struct gg_mesh *m)
{
	const uint64_t now = m->loop->now_us;
	uint64_t next = gg_log_limit_flush(&m->unauth_log, now, GG_LOG_INFO, "stream_down", "site=?");

	next = GG_MIN(next, gg_log_limit_flush(&m->slot_warn, now, GG_LOG_WARN, "dial_deferred", ""));
	next = GG_MIN(next, gg_log_limit_flush(&m->refusal_warn, now, GG_LOG_WARN, "handshake_refused", ""));
	next = GG_MIN(next, gg_log_limit_flush(&m->evict_warn, now, GG_LOG_INFO, "handshake_evicted", ""));
	next = GG_MIN(next, gg_log_limit_flush(&m->accept_log, now, GG_LOG_WARN, "accept_failed", ""));
	for (unsigned p = 0; p < m->sites; p++) {
		struct peer *pe = &m->peers[p];
		char about[GG_WIRE_NAME_MAX + 8];
		if (p == m->self)
			continue;
		snprintf(about, sizeof(about), "site=%s", m->names[p]);
		next = GG_MIN(next, gg_log_limit_flush(&pe->dial_warn, now, GG_LOG_WARN, "dial_refused", about));
		next = GG_MIN(next, gg_log_limit_flush(&pe->accept_warn, now, GG_LOG_WARN, "stream_refused", about));
		for (unsigned k = 0; k < PEER_LOGS; k++)
			next = GG_MIN(next, gg_log_limit_flush(&pe->log[k], now, peer_log_levels[k], peer_log_events[k],
							       about));
	}
	return next;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static bool same_chunk(const struct gg_ar_chunk_id *a, const struct gg_ar_chunk_id *b)
{
	return a->phase == b->phase && a->origin == b->origin && a->chunk == b->chunk;
}

static void free_out(struct out *o)
{
	gg_buf_put(o->frame);
	free(o);
}

static void free_list(struct out *o)
{
	while (o) {
		struct out *next = o->next;
		free_out(o);
		o = next;
	}
}

const struct gg_mesh_stats *gg_mesh_stats(const struct gg_mesh *m)
{
	return &m->stats;
}

const char *gg_mesh_failure_name(unsigned failure)
{
	return failure == GG_MESH_FAIL_MISMATCH ? "mismatch" : gg_tls_failure_name((enum gg_tls_failure)failure);
}

/* The bytes a stream's socket carried since the last call, counted for its
 * peer once the peer is known (an accepted stream's handshake included). */
static void count_wire(struct gg_mesh *m, struct conn *c)
{
	if (c->peer < 0)
		return;
	struct gg_mesh_peer_stats *ps = &m->stats.peers[c->peer];
	ps->wire_bytes_in += c->ts.wire_in_bytes - c->wire_in_seen;
	ps->wire_bytes_out += c->ts.wire_out_bytes - c->wire_out_seen;
	c->wire_in_seen = c->ts.wire_in_bytes;
	c->wire_out_seen = c->ts.wire_out_bytes;
}

/* Closes the time the window was busy up to `now` and opens it again if
 * `busy`. Once it holds `span_us` of busy time, *rate gets the bytes
 * acknowledged per second of it, a new window starts, and it returns
 * true. */
static bool rate_window_turn(struct rate_window *w, uint64_t now, bool busy, uint64_t span_us, uint64_t *rate)
{
	bool measured = false;

	if (w->since_us) {
		w->busy_us += now > w->since_us ? now - w->since_us : 0;
		w->since_us = 0;
	}
	if (w->busy_us >= span_us) {
		*rate = w->bytes * 1000000u / w->busy_us;
		w->busy_us = w->bytes = 0;
		measured = true;
	}
	if (busy)
		w->since_us = now ? now : 1;
	return measured;
}

/* Keeps the delivery rate's window of peer `p`, and the uplink's over all
 * peers: called whenever DATA to `p` becomes unacknowledged or
 * acknowledged, and at every tick. The uplink's first figure comes after
 * a quarter of the span: algorithm auto waits for it. */
static void peer_busy(struct gg_mesh *m, unsigned p)
{
	const uint64_t now = m->loop->now_us;
	bool any = false;

	rate_window_turn(&m->peers[p].delivery, now, m->peers[p].unacked_bytes != 0, RATE_WINDOW_US,
			 &m->stats.peers[p].delivery_bytes_per_s);
	for (unsigned q = 0; q < m->sites && !any; q++)
		any = m->peers[q].unacked_bytes != 0;
	if (rate_window_turn(&m->uplink, now, any, m->stats.uplink_at_us ? RATE_WINDOW_US : RATE_WINDOW_US / 4,
			     &m->stats.uplink_bytes_per_s))
		m->stats.uplink_at_us = now ? now : 1;
}

/* A heartbeat's round trip to peer `p`: the last one, and the shortest of
 * the last RTT_MIN_WINDOW_US or two. */
static void note_rtt(struct gg_mesh *m, unsigned p, uint64_t rtt)
{
	struct peer *pe = &m->peers[p];
	const uint64_t now = m->loop->now_us;

	rtt = GG_MAX(rtt, 1u);
	if (now - pe->rtt_window_us >= RTT_MIN_WINDOW_US) {
		pe->rtt_min_before = pe->rtt_min_now;
		pe->rtt_min_now = 0;
		pe->rtt_window_us = now;
	}
	if (!pe->rtt_min_now || rtt < pe->rtt_min_now)
		pe->rtt_min_now = rtt;
	m->stats.rtt_us[p] = rtt;
	m->stats.rtt_min_us[p] = pe->rtt_min_before ? GG_MIN(pe->rtt_min_now, pe->rtt_min_before) : pe->rtt_min_now;
}

/* ---- sending -------------------------------------------------------------- */

static void conn_flush(struct gg_mesh *m, int ci);
static void conn_close(struct gg_mesh *m, int ci, const char *why);
void gg_mesh_flush(struct gg_mesh *m);

static void conn_enqueue(struct gg_mesh *m, int ci, struct out *o)
{
	struct conn *c = &m->conns[ci];

	o->next = NULL;
	o->off = 0;
	if (c->txq_tail)
		c->txq_tail->next = o;
	else
		c->txq_head = o;
	c->txq_tail = o;
	c->txq_count++;
	c->txq_frames += o->frame != NULL;
	/* Written at the end of the turn, with whatever else was queued by
	 * then: small messages share records. */
	if (!c->flush_pending) {
		c->flush_pending = true;
		m->flush_count++;
	}
}

void gg_mesh_flush(struct gg_mesh *m)
{
	/* A stream that writes a frame may queue the next on another one
	 * (pump_peer()): passes until none is left pending. */
	bool flushed = true;
	while (flushed && m->flush_count) {
		flushed = false;
		for (int ci = 0; ci < m->conn_cap && m->flush_count; ci++) {
			struct conn *c = &m->conns[ci];
			if (!c->flush_pending)
				continue;
			c->flush_pending = false;
			m->flush_count--;
			flushed = true;
			if (c->used)
				conn_flush(m, ci);
		}
	}
}

/* Queues a control message on a stream: after the last one queued there,
 * in its entry where that has room, else in a new entry where the stream
 * holds fewer than `limit`; whether it did. Sharing entries keeps what a
 * stream holds near the messages' own bytes, ACKs above all (36 to 98
 * bytes each, against an entry's 1.2 KB). */
static bool queue_ctrl(struct gg_mesh *m, int ci, const uint8_t *buf, size_t len, unsigned limit)
{
	struct out *o;

	/* (Every control message is encoded into CTRL_MSG_MAX bytes.) */
	if (ci < 0 || !m->conns[ci].used || len > CTRL_MSG_MAX)
		return false;
	o = m->conns[ci].txq_tail;
	if (o && !o->frame && o->head_cap - o->head_len >= len) {
		memcpy(o->head + o->head_len, buf, len);
		o->head_len += len;
		return true;
	}
	if (m->conns[ci].txq_count >= limit)
		return false;
	o = out_new(CTRL_MSG_MAX);
	if (!o)
		return false;
	memcpy(o->head, buf, len);
	o->head_len = len;
	o->conn = ci;
	conn_enqueue(m, ci, o);
	return true;
}

/* A control message to one stream; dropped when the stream is gone or
 * its queue is full. */
static void send_ctrl(struct gg_mesh *m, int ci, const uint8_t *buf, size_t len)
{
	queue_ctrl(m, ci, buf, len, CONN_TXQ);
}

static bool conn_ready(const struct gg_mesh *m, int ci)
{
	return ci >= 0 && m->conns[ci].ready;
}

static bool owned(const struct gg_mesh *m, unsigned stream)
{
	return stream % m->lanes == m->lane;
}

/* The ready stream to `peer` that holds the fewest unwritten frames, and
 * fewer than STREAM_FRAMES; of equals the first from chunk % streams on,
 * which spreads the chunks when every stream keeps up. -1: none. */
static int pick_stream(const struct gg_mesh *m, unsigned peer, uint32_t chunk)
{
	const int S = m->cfg->transport.streams_per_peer;
	int best = -1;

	for (int k = 0; k < S; k++) {
		uint32_t s = (chunk + (uint32_t)k) % (uint32_t)S;
		int ci = m->peers[peer].conn[s];
		if (!owned(m, s) || !conn_ready(m, ci) || m->conns[ci].txq_count >= CONN_TXQ ||
		    m->conns[ci].txq_frames >= STREAM_FRAMES)
			continue;
		if (best < 0 || m->conns[ci].txq_frames < m->conns[best].txq_frames)
			best = ci;
	}
	return best;
}

/* The unwritten copy of frame f on stream c, or NULL once c wrote it all. */
static const struct out *unwritten(const struct conn *c, const struct gg_buf *f)
{
	for (const struct out *o = c->txq_head; o; o = o->next)
		if (o->frame == f)
			return o;
	return NULL;
}

/* Bytes each stream to a peer holds unacknowledged in its socket
 * (SIOCOUTQ), read once per hedge() call: system calls for every frame at
 * every ACK would add up at a step's end. -1: unreadable; -2: not read. */
struct stream_unacked {
	int bytes[GG_MESH_MAX_STREAMS];
};

static int unacked_bytes(const struct gg_mesh *m, struct stream_unacked *u, uint32_t s, int ci)
{
	int q = 0;

	if (u->bytes[s] == -2)
		u->bytes[s] = m->conns[ci].ts.fd >= 0 && !ioctl(m->conns[ci].ts.fd, SIOCOUTQ, &q) && q >= 0 ? q : -1;
	return u->bytes[s];
}

/* A stream to `p` other than `except` that is idle on the wire: no frame
 * to write, and its socket holds at most `bytes` unacknowledged (room for
 * the ACKs and other small messages it carries). -1: none. */
static int idle_stream(const struct gg_mesh *m, struct stream_unacked *u, unsigned p, uint32_t chunk, int except,
		       uint64_t bytes)
{
	const int S = m->cfg->transport.streams_per_peer;

	for (int k = 0; k < S; k++) {
		uint32_t s = (chunk + (uint32_t)k) % (uint32_t)S;
		int ci = m->peers[p].conn[s];
		if (ci == except || !owned(m, s) || !conn_ready(m, ci) || m->conns[ci].txq_frames ||
		    m->conns[ci].txq_count >= CONN_TXQ)
			continue;
		int q = unacked_bytes(m, u, s, ci);
		if (q >= 0 && (uint64_t)q <= bytes)
			return ci;
	}
	return -1;
}

/* Whether a stream that delivers `rate` bytes/s (0: none) would take
 * HEDGE_FACTOR times longer, and HEDGE_MIN_US longer, over the `ahead`
 * bytes before a frame's end than a copy of `len` bytes at `fast` would
 * take to reach peer `p`. */
static bool too_slow(const struct gg_mesh *m, unsigned p, uint64_t rate, uint64_t fast, uint64_t ahead, uint64_t len)
{
	if (fast < HEDGE_FACTOR * rate)
		return false;
	return !rate || ahead * 1000000u / rate >=
				HEDGE_FACTOR * (m->stats.rtt_min_us[p] + len * 1000000u / fast) + HEDGE_MIN_US;
}

/* The bytes/s stream `ci` to peer `p` delivered since its watch began,
 * at an earlier call: true once the watch has lasted HEDGE_WATCH_RTTS
 * round trips (at least HEDGE_WATCH_MIN_US), so that every frame the
 * stream holds is judged by it. A first call, or one whose watch lasted
 * twice that (the streams may have done other work since), begins a
 * watch. */
static void hedge_due(struct gg_mesh *m, uint64_t at)
{
	m->hedge_due_us = m->hedge_due_us ? GG_MIN(m->hedge_due_us, at) : at;
}

static bool watched_rate(struct gg_mesh *m, unsigned p, int ci, uint64_t *rate)
{
	struct conn *c = &m->conns[ci];
	const uint64_t now = m->loop->now_us;
	const uint64_t span = GG_MAX(HEDGE_WATCH_RTTS * m->stats.rtt_min_us[p], (uint64_t)HEDGE_WATCH_MIN_US);
	struct tcp_info ti;
	socklen_t len = sizeof(ti);

	if (c->watch_us && now - c->watch_us < span) {
		hedge_due(m, c->watch_us + span);
		return false;
	}
	memset(&ti, 0, sizeof(ti));
	if (c->ts.fd < 0 || getsockopt(c->ts.fd, IPPROTO_TCP, TCP_INFO, &ti, &len))
		return false;
	if (!c->watch_us || now - c->watch_us >= 2 * span) {
		c->watch_us = now ? now : 1;
		c->watch_acked = ti.tcpi_bytes_acked;
		hedge_due(m, c->watch_us + span);
		return false;
	}
	*rate = (ti.tcpi_bytes_acked - GG_MIN(c->watch_acked, ti.tcpi_bytes_acked)) * 1000000u / (now - c->watch_us);
	return true;
}

/* Once `p` has no frame waiting (a step's last ones are on their way), a
 * frame whose stream is slow (its path, a loss) goes once more on a
 * stream idle on the wire that moved much faster (tune_stream()), where
 * it would arrive well before its own stream delivered what it holds
 * ahead of it: the bytes its socket holds unacknowledged (SIOCOUTQ), its
 * TLS records and the frame if unwritten. Streams alike never hedge:
 * where they share one bottleneck a copy would only take its place.
 * Streams that share one but moved unequally (TCP shares a queue
 * unevenly, and a loss can hold one back for a while) seldom do: the
 * slow one must stay slow over a watch of a few round trips with the
 * other idle, and one that shares a bottleneck mostly takes the idle
 * one's share within that time (a look at its TCP state before and
 * after, watched_rate()). The peer takes whichever copy comes first and
 * acknowledges both, so the step waits for the faster stream. */
static void hedge(struct gg_mesh *m, unsigned p)
{
	struct peer *pe = &m->peers[p];
	struct stream_unacked u;

	if (pe->waiting)
		return;
	for (int s = 0; s < m->cfg->transport.streams_per_peer; s++)
		u.bytes[s] = -2;
	for (struct out *k = pe->unacked; k; k = k->next) {
		if (k->hedged || k->forgotten || !conn_ready(m, k->conn))
			continue;
		const struct conn *c = &m->conns[k->conn];
		const uint64_t len = k->head_len + k->frame->len;
		int ci = idle_stream(m, &u, p, k->id.chunk, k->conn, len / 8);
		if (ci < 0)
			continue; /* none but its own, or none for a frame this small */
		const uint64_t fast = m->conns[ci].rate;
		if (c->stream < 0 || !c->rate || fast < HEDGE_FACTOR * c->rate)
			continue;
		int queued = unacked_bytes(m, &u, (uint32_t)c->stream, k->conn);
		if (queued <= 0)
			continue;
		const struct out *o = unwritten(c, k->frame);
		uint64_t ahead = (uint64_t)queued + GG_TLS_RING_DEFAULT_BYTES + (o ? len - o->off : 0), rate;
		if (!too_slow(m, p, c->rate, fast, ahead, len) || !watched_rate(m, p, k->conn, &rate) ||
		    !too_slow(m, p, rate, fast, ahead, len))
			continue;
		struct out *copy = out_copy(k);
		if (!copy)
			return;
		copy->conn = ci;
		conn_enqueue(m, ci, copy);
		k->hedged = true;
		m->stats.peers[p].hedged_frames++;
	}
}

/* Moves DATA from the waiting list onto streams while the peer's window
 * has room and a stream takes it (pick_stream()); runs again when a
 * stream has written a frame. The window is the smaller of the two sites'
 * inflight_per_peer (the peer's from its HELLO), so that what is sent
 * stays within what the peer keeps of early frames, whatever each site
 * set; each lane's mesh has its share of it. */
static void pump_peer(struct gg_mesh *m, unsigned p)
{
	struct peer *pe = &m->peers[p];
	if (pe->held_us)
		return;
	uint64_t window = m->cfg->limits.inflight_bytes_per_peer;
	if (pe->inflight_bytes && pe->inflight_bytes < window && !m->test_own_window)
		window = pe->inflight_bytes;
	window /= m->lanes;

	while (pe->waiting) {
		struct out *o = pe->waiting;
		size_t bytes = o->head_len + o->frame->len;
		if (pe->unacked_bytes && pe->unacked_bytes + bytes > window)
			return;
		int ci = pick_stream(m, p, o->id.chunk);
		if (ci < 0)
			return;
		/* Written and kept: the unacked list owns a second reference. */
		struct out *keep = out_copy(o);
		if (!keep)
			return;
		pe->waiting = o->next;
		pe->unacked_bytes += bytes;
		if (!o->counted) {
			o->counted = true;
			m->stats.peers[p].data_bytes_out += o->frame->len;
			m->stats.peers[p].raw_bytes_out += o->raw_bytes;
		}
		keep->counted = true;
		keep->conn = ci;
		keep->hedged = false;
		keep->next = pe->unacked;
		pe->unacked = keep;
		o->conn = ci;
		conn_enqueue(m, ci, o);
		/* A watch of the stream's delivery (hedge()) may hold time it
		 * had nothing to send: it starts again with the new frame. */
		m->conns[ci].watch_us = 0;
		if (pe->unacked_bytes == bytes)
			peer_busy(m, p); /* the first DATA in flight: the peer is busy from now */
	}
	hedge(m, p);
}

int gg_mesh_send_data(struct gg_mesh *m, unsigned peer, const struct gg_wire_step *step,
		      const struct gg_ar_chunk_id *id, struct gg_buf *frame, uint64_t raw_bytes)
{
	struct peer *pe = &m->peers[peer];
	struct out *o = out_new(DATA_HEAD_MAX);

	if (!o)
		return -ENOMEM;
	ssize_t len = gg_wire_encode_data_head(o->head, o->head_cap, step, id, frame->len);
	if (len < 0) {
		free(o);
		return (int)len;
	}
	o->head_len = (size_t)len;
	gg_buf_get(frame);
	o->frame = frame;
	snprintf(o->job, sizeof(o->job), "%s", step->job);
	o->run = step->run;
	o->seq = step->step;
	o->id = *id;
	o->conn = -1;
	o->raw_bytes = raw_bytes;
	struct out **tail = &pe->waiting;
	while (*tail)
		tail = &(*tail)->next;
	*tail = o;
	pump_peer(m, peer);
	return 0;
}

void gg_mesh_send_control(struct gg_mesh *m, unsigned peer, const uint8_t *msg, size_t len, bool every_stream)
{
	for (int s = 0; s < m->cfg->transport.streams_per_peer; s++) {
		int ci = m->peers[peer].conn[s];
		if (!conn_ready(m, ci))
			continue;
		send_ctrl(m, ci, msg, len);
		if (!every_stream)
			return;
	}
}

/* The connection `via` names, while it is the same one: its index, or -1. */
static int via_conn(const struct gg_mesh *m, struct gg_mesh_via via)
{
	return via.conn >= 0 && via.conn < m->conn_cap && m->conns[via.conn].used && m->conns[via.conn].gen == via.gen
		       ? via.conn
		       : -1;
}

void gg_mesh_ack(struct gg_mesh *m, struct gg_mesh_via via, const char *job, uint64_t run, uint64_t step,
		 const struct gg_ar_chunk_id *id)
{
	uint8_t buf[CTRL_MSG_MAX];

	if (via_conn(m, via) < 0 || !m->conns[via.conn].ready)
		return;
	ssize_t len = gg_wire_encode_ack(buf, sizeof(buf), job, run, step, id);
	/* Never dropped while the stream lives: the sender would keep the DATA
	 * it names, and its window would stay that much shorter for good. A
	 * stream that cannot take it (a peer that sends but does not read,
	 * no memory) is closed instead, and its peer sends the DATA again on
	 * another stream, where it is acknowledged. */
	if (len > 0 && !queue_ctrl(m, via.conn, buf, (size_t)len, CONN_TXQ + CONN_TXQ_ACKS))
		conn_close(m, via.conn, "cannot queue an ACK: the peer leaves too much unread");
}

void gg_mesh_close_via(struct gg_mesh *m, struct gg_mesh_via via, const char *why)
{
	if (via_conn(m, via) >= 0)
		conn_close(m, via.conn, why);
}

unsigned gg_mesh_queued(const struct gg_mesh *m, unsigned peer, unsigned limit)
{
	const struct peer *pe = &m->peers[peer];
	unsigned queued = 0;

	for (const struct out *o = pe->waiting; o && queued < limit; o = o->next)
		queued++;
	for (int s = 0; s < m->cfg->transport.streams_per_peer; s++)
		if (pe->conn[s] >= 0)
			queued += m->conns[pe->conn[s]].txq_count;
	return queued;
}

static bool out_of(const struct out *o, const char *job, uint64_t lo, uint64_t hi)
{
	return o->seq >= lo && o->seq <= hi && !strcmp(o->job, job);
}

void gg_mesh_forget(struct gg_mesh *m, const char *job, uint64_t lo, uint64_t hi)
{
	for (unsigned p = 0; p < m->sites; p++) {
		for (struct out *o = m->peers[p].unacked; o; o = o->next)
			o->forgotten |= out_of(o, job, lo, hi);
		struct out **pp = &m->peers[p].waiting;
		while (*pp) {
			struct out *o = *pp;
			if (out_of(o, job, lo, hi)) {
				*pp = o->next;
				free_out(o);
			} else {
				pp = &o->next;
			}
		}
	}
}

bool gg_mesh_holds_job(const struct gg_mesh *m, const char *job)
{
	for (unsigned p = 0; p < m->sites; p++) {
		for (const struct out *o = m->peers[p].unacked; o; o = o->next)
			if (!strcmp(o->job, job))
				return true;
		for (const struct out *o = m->peers[p].waiting; o; o = o->next)
			if (!strcmp(o->job, job))
				return true;
	}
	return false;
}

/* A test stream writes everything at once. */
static void test_flush(struct conn *c)
{
	while (c->txq_head) {
		struct out *o = c->txq_head;
		c->txq_head = o->next;
		c->txq_count--;
		c->txq_frames -= o->frame != NULL;
		if (o->frame)
			c->test_sent(c->test_arg, (unsigned)c->peer, (unsigned)c->stream, o->head, o->head_len,
				     o->frame->data, o->frame->len);
		else /* one call for each control message the entry holds */
			for (size_t at = 0, len; at < o->head_len; at += len) {
				enum gg_wire_type type;
				size_t payload;
				char err[256];
				if (gg_wire_parse_header(o->head + at, SIZE_MAX, &type, &payload, err, sizeof(err)))
					abort(); /* this mesh encoded it */
				len = GG_WIRE_HEADER_BYTES + payload;
				c->test_sent(c->test_arg, (unsigned)c->peer, (unsigned)c->stream, o->head + at, len, NULL,
					     0);
			}
		free_out(o);
	}
	c->txq_tail = NULL;
}

/* Writes queued messages until the stream pushes back, several at a time
 * so that small ones share records. */
static void conn_flush(struct gg_mesh *m, int ci)
{
	struct conn *c = &m->conns[ci];

	if (c->used && c->test_sent) {
		test_flush(c);
		if (c->ready && c->peer >= 0)
			pump_peer(m, (unsigned)c->peer);
		return;
	}
	while (c->used && c->txq_head && c->ts.state == GG_TLS_STREAM_OPEN) {
		struct iovec iov[32];
		int n = 0;
		for (struct out *o = c->txq_head; o && n + 2 <= (int)GG_ARRAY_LEN(iov); o = o->next) {
			if (o->off < o->head_len)
				iov[n++] = (struct iovec){ o->head + o->off, o->head_len - o->off };
			if (o->frame) {
				size_t done = o->off > o->head_len ? o->off - o->head_len : 0;
				iov[n++] = (struct iovec){ o->frame->data + done, o->frame->len - done };
				break; /* a frame fills records on its own */
			}
		}
		double t0 = now_s();
		ssize_t w = gg_tls_stream_writev(&c->ts, iov, n);
		m->stats.tls_s += now_s() - t0;
		if (w == -EAGAIN)
			return;
		if (w < 0) {
			/* From conn_close() itself (c->lost): it goes on closing. */
			if (!c->lost)
				conn_close(m, ci, gg_tls_stream_error(&c->ts));
			return;
		}
		size_t left = (size_t)w;
		bool wrote_frame = false;
		while (left && c->txq_head) {
			struct out *o = c->txq_head;
			size_t total = o->head_len + (o->frame ? o->frame->len : 0), take = GG_MIN(left, total - o->off);
			o->off += take;
			left -= take;
			if (o->off < total)
				break;
			c->txq_head = o->next;
			if (!c->txq_head)
				c->txq_tail = NULL;
			c->txq_count--;
			wrote_frame |= o->frame != NULL;
			c->carried |= o->frame != NULL;
			c->txq_frames -= o->frame != NULL;
			free_out(o);
		}
		/* Room for the next frame, which may come to this stream. */
		if (wrote_frame && c->ready && c->peer >= 0)
			pump_peer(m, (unsigned)c->peer);
	}
}

/* ---- receiving ------------------------------------------------------------ */

static bool on_ack(struct gg_mesh *m, unsigned peer, const struct gg_wire_msg *msg)
{
	struct peer *pe = &m->peers[peer];

	for (struct out **pp = &pe->unacked; *pp; pp = &(*pp)->next) {
		struct out *o = *pp;
		if (o->seq == msg->u.ack.step && o->run == msg->u.ack.run && same_chunk(&o->id, &msg->u.ack.id) &&
		    !strcmp(o->job, msg->u.ack.job)) {
			*pp = o->next;
			pe->unacked_bytes -= o->head_len + o->frame->len;
			pe->delivery.bytes += o->frame->len;
			m->uplink.bytes += o->frame->len;
			m->stats.peers[peer].acked_bytes += o->frame->len;
			free_out(o);
			peer_busy(m, peer);
			pump_peer(m, peer);
			return true;
		}
	}
	return false;
}

void gg_mesh_take_ack(struct gg_mesh *m, unsigned peer, const struct gg_wire_msg *msg)
{
	on_ack(m, peer, msg);
}

/* `p` restarted: nothing it was sent or owed survives. DATA no stream
 * ever took stays, for the new gateway: a step that began here after the
 * old one was gone goes on with the new one. It is held back until the
 * owner decided which steps the restart failed and let their DATA go
 * (gg_mesh_forget(), then gg_mesh_release_peer()): the new gateway would
 * keep theirs as frames of a job it does not run. */
static void peer_lost_state(struct gg_mesh *m, unsigned p)
{
	struct peer *pe = &m->peers[p];

	free_list(pe->unacked);
	pe->unacked = NULL;
	pe->unacked_bytes = 0;
	peer_busy(m, p);
	for (struct out **pp = &pe->waiting; *pp;) {
		struct out *o = *pp;
		if (!o->counted) {
			pp = &o->next;
			continue;
		}
		*pp = o->next;
		free_out(o);
	}
	pe->held_us = pe->waiting ? GG_MAX(m->loop->now_us, (uint64_t)1) : 0;
	m->ops->on_peer_restarted(m->owner, p, pe->instance_id);
}

void gg_mesh_release_peer(struct gg_mesh *m, unsigned peer)
{
	if (peer >= m->sites || !m->peers[peer].held_us)
		return;
	m->peers[peer].held_us = 0;
	pump_peer(m, peer);
}

/* The owner's release comes within a turn or two of its loops; past this,
 * its word was lost (no memory for it) and the DATA goes as it is. */
#define HELD_MAX_US 2000000u

static void send_hello(struct gg_mesh *m, int ci, uint16_t stream)
{
	uint8_t buf[CTRL_MSG_MAX];
	struct gg_wire_hello h = m->hello;

	h.stream_index = stream;
	ssize_t len = gg_wire_encode_hello(buf, sizeof(buf), &h);
	if (len > 0)
		send_ctrl(m, ci, buf, (size_t)len);
}

/* Sends again what `p` never acknowledged on streams that are gone. */
static void resend_lost(struct gg_mesh *m, unsigned p)
{
	struct peer *pe = &m->peers[p];
	struct out **pp = &pe->unacked;

	while (*pp) {
		struct out *o = *pp;
		if (o->conn >= 0 && conn_ready(m, o->conn)) {
			pp = &o->next;
			continue;
		}
		*pp = o->next;
		pe->unacked_bytes -= o->head_len + o->frame->len;
		if (o->forgotten) {
			/* Nobody waits for it: a peer that kept it lets it go
			 * with the step or job, one that did not would keep a
			 * copy sent again for a job it no longer knows. */
			free_out(o);
			continue;
		}
		/* Back to the front of the waiting list. */
		o->conn = -1;
		o->next = pe->waiting;
		pe->waiting = o;
		m->stats.resent_messages++;
	}
	peer_busy(m, p);
	pump_peer(m, p);
}

/* A stream's buffer is smaller than it should be (`want`, as the kernel
 * counts): once per direction and lane (a mesh is a lane's), the line says which limit to raise. */
static void buffer_capped(struct gg_mesh *m, const struct conn *c, bool send, uint64_t want, uint64_t got)
{
	char a[32], b[32], value[48] = " (not readable here)";
	const char *knob = send ? "wmem_max" : "rmem_max";
	uint64_t limit = send ? m->buffer_limits.wmem_max : m->buffer_limits.rmem_max;

	if (m->buffer_warned[send])
		return;
	m->buffer_warned[send] = true;
	if (limit)
		snprintf(value, sizeof(value), " = %llu", (unsigned long long)(limit / 2));
	gg_log(GG_LOG_WARN, "socket_buffer_capped",
	       "site=%s stream=%d direction=%s wanted=%s got=%s reason=\"the stream's %s buffer is capped by "
	       "net.core.%s%s, which binds a process without CAP_NET_ADMIN: raise it (sysctl -w net.core.%s=%llu) "
	       "or give the gateway CAP_NET_ADMIN\"",
	       m->names[c->peer], c->stream, send ? "send" : "receive", gg_format_size(want / 2, a, sizeof(a)),
	       gg_format_size(got / 2, b, sizeof(b)), send ? "send" : "receive", knob, value, knob,
	       (unsigned long long)(want / 2));
}

/* Every TUNE_US: the unsent bound follows the stream's delivery rate
 * (gg_net_notsent_lowat()), and with socket_buffer = "auto", past what the
 * kernel's autotuning gives, its buffers follow what it measures
 * (gg_net_buffer_targets()). */
static void tune_stream(struct gg_mesh *m, int ci)
{
	struct conn *c = &m->conns[ci];
	struct tcp_info ti;
	socklen_t len = sizeof(ti), il = sizeof(int);
	int rcv = 0, snd = 0;

	c->tune_next_us = m->loop->now_us + TUNE_US;
	/* Only what carried DATA: a mesh of many idle streams costs no
	 * system calls for them. */
	if (!c->carried) {
		c->rate /= 2;
		return;
	}
	c->carried = false;
	memset(&ti, 0, sizeof(ti));
	if (c->ts.fd < 0 || getsockopt(c->ts.fd, IPPROTO_TCP, TCP_INFO, &ti, &len) ||
	    getsockopt(c->ts.fd, SOL_SOCKET, SO_RCVBUF, &rcv, &il) ||
	    getsockopt(c->ts.fd, SOL_SOCKET, SO_SNDBUF, &snd, &il))
		return;
	struct gg_net_buffer_state st = { .rcv_now = (uint64_t)rcv,
					  .snd_now = (uint64_t)snd,
					  .rcv_space = ti.tcpi_rcv_space,
					  .cwnd_bytes = (uint64_t)ti.tcpi_snd_cwnd * ti.tcpi_snd_mss,
					  .snd_limited = ti.tcpi_sndbuf_limited > c->sndbuf_limited_us,
					  .rcv_wscale = ti.tcpi_rcv_wscale };
	c->sndbuf_limited_us = ti.tcpi_sndbuf_limited;
	/* What the stream moved, not the kernel's rate of its latest
	 * sample: a stream slowed past its first hop starts at that hop's
	 * speed. A busy span sets it, an idle one lets it fade. */
	uint64_t moved = ti.tcpi_bytes_acked - GG_MIN(c->bytes_acked, ti.tcpi_bytes_acked);
	uint64_t span = c->acked_us ? GG_MAX(m->loop->now_us - c->acked_us, (uint64_t)1) : TUNE_US;
	c->bytes_acked = ti.tcpi_bytes_acked;
	c->acked_us = m->loop->now_us;
	c->rate = GG_MAX(moved * 1000000u / span, c->rate / 2);
	uint32_t lowat = (uint32_t)gg_net_notsent_lowat(c->rate);
	uint32_t cur = c->lowat ? c->lowat : GG_NET_NOTSENT_LOWAT_MIN;
	if ((lowat > cur + cur / 4 || lowat < cur - cur / 4) &&
	    !setsockopt(c->ts.fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &lowat, sizeof(lowat)))
		c->lowat = lowat;
	if (m->cfg->transport.socket_buffer_bytes)
		return;
	uint64_t want[2], now[2] = { st.rcv_now, st.snd_now };
	gg_net_buffer_targets(&st, &m->buffer_limits, m->cfg->transport.socket_buffer_max_bytes, &want[0], &want[1]);
	for (int send = 0; send < 2; send++) {
		if (!want[send])
			continue;
		uint64_t set = gg_net_buffer_allowed(&m->buffer_limits, send, want[send], now[send]), got = now[send];
		if (set && gg_net_set_buffer(c->ts.fd, send, set / 2, &got))
			continue;
		/* A receive buffer raised past where autotuning stopped opens
		 * the window only with the kernel's clamp on it. */
		if (set && !send)
			(void)gg_net_open_window(c->ts.fd, got);
		if (got < want[send] / 10 * 9)
			buffer_capped(m, c, send, want[send], got);
	}
}

/* A fixed socket_buffer the kernel did not give in full (net.core.*mem_max). */
static void check_buffers(struct gg_mesh *m, const struct conn *c)
{
	uint64_t want = 2 * m->cfg->transport.socket_buffer_bytes;
	socklen_t il = sizeof(int);

	for (int send = 0; send < 2 && want && c->ts.fd >= 0; send++) {
		int have = 0;
		if (!getsockopt(c->ts.fd, SOL_SOCKET, send ? SO_SNDBUF : SO_RCVBUF, &have, &il) &&
		    (uint64_t)have < want / 10 * 9)
			buffer_capped(m, c, send, want, (uint64_t)have);
	}
}

/* The stream to a peer is ready: it carries what lost streams did. */
static void stream_ready(struct gg_mesh *m, int ci)
{
	struct conn *c = &m->conns[ci];

	c->ready = true;
	c->ready_us = m->loop->now_us;
	check_buffers(m, c);
	if (m->peers[c->peer].flaps[c->stream] < FLAPS_BEFORE_BACKOFF)
		m->peers[c->peer].backoff_us[c->stream] = 0;
	m->stats.peers[c->peer].stream_ups++;
	if (c->dialer)
		m->peers[c->peer].denied = false;
	if (peer_log_now(m, c->peer, PEER_LOG_UP))
		gg_log(GG_LOG_INFO, "stream_up", "site=%s stream=%d dialed_by=%s cipher=%s", m->names[c->peer], c->stream,
	       m->names[c->dialer ? m->self : (unsigned)c->peer], c->ts.tls ? gg_tls_engine_cipher(c->ts.tls) : "none");
	resend_lost(m, (unsigned)c->peer);
	m->ops->on_stream_change(m->owner, (unsigned)c->peer, (unsigned)c->stream, true, NULL);
}

/* `ci` becomes the peer's connection for its stream, and `old` (if any)
 * closes. conn_lost() then finds `old` no longer the peer's stream: the
 * owner sees no gap, and what `old` carried goes out again once `ci` is
 * ready (stream_ready(), which the caller runs next). */
static void supersede(struct gg_mesh *m, int old, int ci, const char *why, bool duplicate)
{
	struct conn *c = &m->conns[ci];

	m->peers[c->peer].conn[c->stream] = ci;
	if (old < 0 || old == ci)
		return;
	m->conns[old].duplicate = duplicate;
	m->stats.duplicate_streams += duplicate;
	conn_close(m, old, why);
}

/* An accepted connection `ci` whose HELLO named its stream: it takes the
 * stream's place among the peer's, unless a connection this site dialed
 * is kept instead. When both sites dial, two connections for one stream
 * can come up at once; both sites keep the one the site whose name sorts
 * first dialed, so they agree without a word. Returns false when `ci`
 * was closed. */
static bool take_stream(struct gg_mesh *m, int ci, const struct gg_wire_hello *h)
{
	struct conn *c = &m->conns[ci];
	struct peer *pe = &m->peers[c->peer];
	int old = pe->conn[c->stream];
	char why[360];

	if (old >= 0 && old != ci && m->conns[old].dialer && m->conns[old].ready &&
	    pe->instance_id == h->instance_id && m->self < (unsigned)c->peer) {
		c->duplicate = true;
		m->stats.duplicate_streams++;
		conn_close(m, ci, "duplicate stream: this site's own connection for it is up (of two for one "
				  "stream, the one the site whose name sorts first dialed is kept)");
		return false;
	}
	/* Our answer goes out before the close of what it replaces: the peer
	 * then has it when it sees that close (both may replace one stream). */
	send_hello(m, ci, (uint16_t)c->stream);
	conn_flush(m, ci);
	if (old < 0 || old == ci || !m->conns[old].dialer) {
		/* A second connection the peer dialed: its first is gone there. */
		supersede(m, old, ci, "replaced by a new connection", false);
	} else if (m->conns[old].ready && pe->instance_id != h->instance_id) {
		supersede(m, old, ci, "the peer restarted: replaced by its new connection", false);
	} else if (m->self > (unsigned)c->peer) {
		snprintf(why, sizeof(why), "duplicate stream: replaced by the connection site %s dialed (%s)",
			 m->names[c->peer], "of two for one stream, the one the site whose name sorts first dialed is kept");
		supersede(m, old, ci, why, true);
	} else {
		/* Ours is still being set up: the peer's carries the stream until it is. */
		pe->dialing[c->stream] = old;
		pe->conn[c->stream] = ci;
	}
	return true;
}

/* A stream whose HELLO checked out: it takes its place among the peer's
 * streams (the acceptor answers HELLO), and carries data from now on. */
static void stream_accepted(struct gg_mesh *m, int ci, const struct gg_wire_hello *h)
{
	struct conn *c = &m->conns[ci];
	struct peer *pe = &m->peers[c->peer];

	if (c->handshake) {
		/* Authenticated: from the handshake pool to a stream slot. */
		if (m->streams >= m->stream_slots) {
			conn_close(m, ci, "no free stream slot");
			return;
		}
		c->handshake = false;
		m->handshakes--;
		m->streams++;
	}
	if (!c->dialer) {
		c->stream = h->stream_index;
		if (!take_stream(m, ci, h))
			return;
	} else if (pe->dialing[c->stream] == ci) {
		/* Our dial is up while the peer's connection carried the stream. */
		int old = pe->conn[c->stream];
		pe->dialing[c->stream] = -1;
		supersede(m, old, ci, "duplicate stream: replaced by the connection this site dialed (of two for one "
				      "stream, the one the site whose name sorts first dialed is kept)", true);
	}
	if (pe->instance_id && pe->instance_id != h->instance_id) {
		if (peer_log_now(m, c->peer, PEER_LOG_RESTARTED))
			gg_log(GG_LOG_WARN, "peer_restarted", "site=%s", m->names[c->peer]);
		pe->instance_id = h->instance_id;
		pe->denied = false; /* it may have come back with other settings */
		peer_lost_state(m, (unsigned)c->peer);
	}
	pe->instance_id = h->instance_id;
	pe->inflight_bytes = h->inflight_bytes;
	stream_ready(m, ci);
}

/* A connection of a known peer whose HELLO, or its first header, shows
 * the two sites cannot work together (another release, other settings):
 * said at error level and counted as a mismatch. An accepted one answers
 * with this site's HELLO first, so that the dialer reads the cause too
 * rather than a closed stream; and it is the cause that steps waiting for
 * the peer, and mesh_degraded, name while no stream to it is up, which
 * the owner judges (accepted connections come to the handshake pool's
 * mesh, which holds no stream; a dialer's refusal becomes that in
 * conn_lost()). */
static void refused(struct gg_mesh *m, int ci, const char *why, uint16_t stream)
{
	const struct conn *c = &m->conns[ci];

	if (peer_log_now(m, c->peer, PEER_LOG_MISMATCH))
		gg_log(GG_LOG_ERROR, "peer_mismatch", "site=%s reason=\"%s\"", m->names[c->peer], why);
	m->stats.stream_failures[GG_MESH_FAIL_MISMATCH]++;
	if (!c->dialer) {
		send_hello(m, ci, stream); /* the close flushes it */
		m->ops->on_stream_change(m->owner, (unsigned)c->peer, GG_MESH_MAX_STREAMS, false, why);
	}
	conn_close(m, ci, why);
}

static void on_hello(struct gg_mesh *m, int ci, const struct gg_wire_msg *msg)
{
	struct conn *c = &m->conns[ci];
	const struct gg_wire_hello *h = &msg->u.hello;
	char err[GG_MESH_ERROR_MAX];

	if (c->ready) {
		conn_close(m, ci, "a second HELLO on a stream");
		return;
	}
	if (gg_wire_hello_check(&m->hello, h, m->names[c->peer], err, sizeof(err))) {
		refused(m, ci, err, h->stream_index);
		return;
	}
	if (c->dialer && h->stream_index != c->stream) {
		conn_close(m, ci, "the peer answered for another stream");
		return;
	}
	if (!c->dialer && !owned(m, h->stream_index)) {
		/* Another lane's: it answers HELLO once it holds the stream. */
		struct gg_mesh_handoff *ho = malloc(sizeof(*ho));
		if (!ho || gg_tls_stream_detach(&c->ts)) {
			free(ho);
			conn_close(m, ci, "cannot hand the stream to its lane");
			return;
		}
		*ho = (struct gg_mesh_handoff){ .fd = -1, .peer = (unsigned)c->peer, .stream = h->stream_index,
						.hello = *h };
		c->moving = ho;
		return;
	}
	stream_accepted(m, ci, h);
}

static void dispatch(struct gg_mesh *m, int ci, const uint8_t *payload, size_t len, struct gg_buf *buf)
{
	struct conn *c = &m->conns[ci];
	struct gg_wire_msg msg;
	char err[256];
	int rc = 0;

	if (gg_wire_decode(c->type, payload, len, &msg, err, sizeof(err))) {
		char why[300];
		snprintf(why, sizeof(why), "bad message from site %s: %s", m->names[c->peer], err);
		conn_close(m, ci, why);
		return;
	}
	if (!c->ready && c->type != GG_WIRE_HELLO) {
		conn_close(m, ci, "data before HELLO");
		return;
	}
	switch (c->type) {
	case GG_WIRE_HELLO:
		on_hello(m, ci, &msg);
		break;
	case GG_WIRE_DATA:
		m->stats.data_bytes_in += len;
		c->carried = true;
		rc = m->ops->on_data(m->owner, (unsigned)c->peer, (struct gg_mesh_via){ ci, c->gen }, &msg, buf);
		break;
	case GG_WIRE_ACK:
		if (!on_ack(m, (unsigned)c->peer, &msg) && m->lanes > 1)
			rc = m->ops->on_foreign_ack(m->owner, (unsigned)c->peer, &msg);
		break;
	case GG_WIRE_PING: {
		uint8_t out[64];
		ssize_t l = gg_wire_encode_ping(out, sizeof(out), GG_WIRE_PONG, msg.u.ping_us);
		if (l > 0)
			send_ctrl(m, ci, out, (size_t)l);
		break;
	}
	case GG_WIRE_PONG:
		if (c->ping_sent_us && msg.u.ping_us == c->ping_sent_us) {
			note_rtt(m, (unsigned)c->peer, m->loop->now_us - c->ping_sent_us);
			c->ping_sent_us = 0;
		}
		break;
	case GG_WIRE_ABORT:
	case GG_WIRE_DONE:
	case GG_WIRE_END:
		rc = m->ops->on_control(m->owner, (unsigned)c->peer, &msg);
		break;
	}
	if (rc == -ENOBUFS)
		conn_close(m, ci, GG_MESH_OVER_BUDGET);
	else if (rc)
		conn_close(m, ci, "no memory for a received message");
}

/* Starts reading the payload of the message whose header is complete.
 * Returns false when the connection was closed. */
static bool begin_payload(struct gg_mesh *m, int ci)
{
	struct conn *c = &m->conns[ci];
	char err[256];

	int rc = gg_wire_parse_header(c->hdr, m->max_payload, &c->type, &c->need, err, sizeof(err));
	if (rc == -EPROTO && !c->ready && c->peer >= 0) {
		/* Another release at the peer: its first message says so. */
		char why[400];
		snprintf(why, sizeof(why), "site %s runs another gradgate release (%s): every site must run the "
			 "same one; upgrade them together", m->names[c->peer], err);
		refused(m, ci, why, 0);
		return false;
	}
	if (rc) {
		char why[300];
		snprintf(why, sizeof(why), "bad message from site %s: %s", c->peer >= 0 ? m->names[c->peer] : "?", err);
		conn_close(m, ci, why);
		return false;
	}
	c->have = 0;
	c->in_payload = true;
	if (c->type != GG_WIRE_DATA)
		return true; /* GG_WIRE_CONTROL_MAX at most */
	if (!(c->msg = gg_buf_new(m->pool, c->need))) {
		conn_close(m, ci, "no memory for a received message");
		return false;
	}
	return true;
}

/* A test stream's read: what gg_mesh_test_receive() hands it. */
static ssize_t test_read(struct conn *c, uint8_t *dst, size_t want)
{
	if (c->test_eof)
		return 0;
	if (!c->test_left)
		return -EAGAIN;
	size_t n = GG_MIN(want, c->test_left);
	memcpy(dst, c->test_in, n);
	c->test_in += n;
	c->test_left -= n;
	return (ssize_t)n;
}

/* Reads what the stream has and dispatches every whole message: the
 * header first, then the payload straight into a buffer of its size. */
static void conn_read(struct gg_mesh *m, int ci)
{
	struct conn *c = &m->conns[ci];

	while (c->used && !c->lost && !c->moving) {
		uint8_t *dst;
		size_t want;
		if (!c->in_payload) {
			dst = c->hdr + c->hdr_len;
			want = GG_WIRE_HEADER_BYTES - c->hdr_len;
		} else {
			dst = (c->msg ? c->msg->data : c->small) + c->have;
			want = c->need - c->have;
		}
		if (want) {
			double t0 = now_s();
			ssize_t got = c->test_sent ? test_read(c, dst, want) : gg_tls_stream_read(&c->ts, dst, want);
			m->stats.tls_s += now_s() - t0;
			if (got == -EAGAIN)
				return;
			if (got <= 0) {
				c->peer_closed = got == 0;
				conn_close(m, ci, got == 0 ? "the peer closed the stream" : gg_tls_stream_error(&c->ts));
				return;
			}
			c->last_rx_us = m->loop->now_us;
			if (!c->in_payload) {
				c->hdr_len += (size_t)got;
				if (c->hdr_len < GG_WIRE_HEADER_BYTES)
					continue;
				if (!begin_payload(m, ci))
					return;
			} else {
				c->have += (size_t)got;
			}
			if (c->have < c->need)
				continue;
		}
		/* A whole message. */
		struct gg_buf *buf = c->msg;
		c->msg = NULL;
		c->in_payload = false;
		c->hdr_len = 0;
		if (buf)
			buf->len = c->need;
		dispatch(m, ci, buf ? buf->data : c->small, c->need, buf);
		gg_buf_put(buf);
	}
}

/* ---- connections ---------------------------------------------------------- */

static void conn_free_slot(struct gg_mesh *m, int ci)
{
	struct conn *c = &m->conns[ci];

	count_wire(m, c);
	if (c->flush_pending)
		m->flush_count--;
	free_list(c->txq_head);
	gg_buf_put(c->msg);
	free(c->small);
	free(c->moving);
	if (c->peer >= 0 && c->stream >= 0 && m->peers[c->peer].conn[c->stream] == ci)
		m->peers[c->peer].conn[c->stream] = -1;
	if (c->peer >= 0 && c->stream >= 0 && m->peers[c->peer].dialing[c->stream] == ci)
		m->peers[c->peer].dialing[c->stream] = -1;
	if (c->handshake)
		m->handshakes--;
	else
		m->streams--;
	uint32_t gen = c->gen + 1;
	memset(c, 0, sizeof(*c));
	c->gen = gen;
}

uint64_t gg_mesh_backoff_wait(uint64_t backoff_us, uint64_t min_us, const char *site_a, const char *site_b,
			      unsigned stream)
{
	if (backoff_us <= min_us)
		return backoff_us;
	const char *lo = strcmp(site_a, site_b) < 0 ? site_a : site_b, *hi = lo == site_a ? site_b : site_a;
	uint8_t nums[12];
	for (int i = 0; i < 8; i++)
		nums[i] = (uint8_t)(backoff_us >> (8 * i));
	for (int i = 0; i < 4; i++)
		nums[8 + i] = (uint8_t)(stream >> (8 * i));
	uint64_t h = gg_fnv1a(GG_FNV1A_START, lo, strlen(lo) + 1); /* with its NUL: "ab","c" is not "a","bc" */
	h = gg_fnv1a(gg_fnv1a(h, hi, strlen(hi) + 1), nums, sizeof(nums));
	h ^= h >> 32; /* FNV's low bits alone mix poorly */
	return backoff_us - (backoff_us - min_us) / 4 * (h % 1024) / 1024;
}

/* The next dial of stream s to `p` waits out the stream's back-off, which
 * doubles with each loss up to reconnect_max and starts again from
 * reconnect_min once a connection for it is up (once one stayed up for
 * STEADY_US, after FLAPS_BEFORE_BACKOFF that did not), less a spread
 * (gg_mesh_backoff_wait()) that sites which lost one peer at once do not
 * all dial it again in the same instant. Where both sites dial, the one
 * whose name sorts second waits reconnect_min longer, so that the first
 * one's dial, which both keep, usually comes first (the spread is the same
 * at both ends of a pair). */
static void retry_later(struct gg_mesh *m, unsigned p, int s)
{
	const struct gg_config *cfg = m->cfg;
	struct peer *pe = &m->peers[p];
	uint64_t *b = &pe->backoff_us[s];

	*b = *b ? GG_MIN(*b * 2, cfg->transport.reconnect_max_us) : cfg->transport.reconnect_min_us;
	pe->next_dial_us[s] = m->loop->now_us +
			      gg_mesh_backoff_wait(*b, cfg->transport.reconnect_min_us, m->names[m->self], m->names[p],
						   (unsigned)s) +
			      (pe->dial == GG_DIAL_BOTH && m->self > p ? cfg->transport.reconnect_min_us : 0);
}

/* Bookkeeping when a stream stops carrying data, once per stream: a dial
 * is due again after the back-off, and what the stream carried goes out
 * again on another stream of that peer (or when one comes up). */
static void conn_lost(struct gg_mesh *m, int ci, const char *why)
{
	struct conn *c = &m->conns[ci];

	if (c->lost)
		return;
	c->lost = true;
	/* Of two connections for one stream, the peer (whose name sorts
	 * second) closed the one it dialed, in order, which carried the stream
	 * while this site's own was set up to take over: a duplicate gone, no
	 * news. (A reset, a heartbeat timeout, is news whatever is dialing.) */
	if (c->peer_closed && !c->duplicate && !c->dialer && c->peer >= 0 && c->stream >= 0 &&
	    m->self < (unsigned)c->peer &&
	    m->peers[c->peer].conn[c->stream] == ci && m->peers[c->peer].dialing[c->stream] >= 0) {
		c->duplicate = true;
		m->stats.duplicate_streams++;
	}
	/* A stream lost is news; so is a dial of ours whose handshake failed
	 * at what the two sites present (a certificate either refuses, a
	 * protocol, groups, an alert from the peer): no retry mends that. A
	 * dial that found the peer down, or slow, is not news: it is tried
	 * again and again (and one refused for the dial setting says so in a
	 * line of its own). */
	const enum gg_tls_failure tf = c->ts.tls_failure;
	const bool settled = c->dialer && tf != GG_TLS_OK && tf != GG_TLS_FAIL_TIMEOUT && tf != GG_TLS_FAIL_CLOSED &&
			     tf != GG_TLS_FAIL_DENIED && tf != GG_TLS_FAIL_PROTOCOL;
	if (peer_log_now(m, c->peer, PEER_LOG_DOWN))
		gg_log((c->ready && !c->duplicate && !m->shutting_down) || settled ? GG_LOG_WARN : GG_LOG_INFO,
		       "stream_down", "site=%s stream=%d reason=\"%s\"", c->peer >= 0 ? m->names[c->peer] : "?",
		       c->stream, why);
	bool was_ready = c->ready;
	c->ready = false;
	if (was_ready && c->peer >= 0)
		m->stats.peers[c->peer].stream_downs++;
	/* What it carried is lost with it. Forget the slot now: once freed it
	 * may carry a new stream, which would pass for the one these went on. */
	if (c->peer >= 0)
		for (struct out *o = m->peers[c->peer].unacked; o; o = o->next)
			if (o->conn == ci)
				o->conn = -1;
	if (c->peer < 0 || c->stream < 0)
		return;
	struct peer *pe = &m->peers[c->peer];
	bool current = pe->conn[c->stream] == ci;
	/* A connection that stayed up clears the stream's flaps (whether it
	 * still carried the stream, or one the peer made took its place); the
	 * stream's own that goes down early adds one. */
	if (was_ready && !c->duplicate) {
		uint8_t *flaps = &pe->flaps[c->stream];
		if (m->loop->now_us - c->ready_us >= STEADY_US) {
			*flaps = 0;
			pe->backoff_us[c->stream] = 0;
		} else if (current && *flaps < UINT8_MAX) {
			++*flaps;
		}
	}
	if (c->dialer || (current && was_ready))
		retry_later(m, (unsigned)c->peer, c->stream);
	if (pe->dialing[c->stream] == ci)
		pe->dialing[c->stream] = -1;
	/* A dial that failed while no stream to the peer is up (refused,
	 * timed out, a certificate either side refused), and that no other
	 * connection replaced: what a step that waits for the peer, and
	 * mesh_degraded, name as the cause. A refusal for the dial setting
	 * says so itself (dial_refused). */
	if (c->dialer && !was_ready && !c->duplicate && (current || pe->conn[c->stream] < 0) &&
	    c->ts.tls_failure != GG_TLS_FAIL_DENIED && !gg_mesh_peer_up(m, (unsigned)c->peer))
		m->ops->on_stream_change(m->owner, (unsigned)c->peer, (unsigned)c->stream, false, why);
	if (!current)
		return;
	/* A dial of ours still being set up takes the stream's place. */
	pe->conn[c->stream] = pe->dialing[c->stream];
	pe->dialing[c->stream] = -1;
	if (was_ready)
		m->ops->on_stream_change(m->owner, (unsigned)c->peer, (unsigned)c->stream, false, why);
	if (was_ready && gg_mesh_peer_up(m, (unsigned)c->peer))
		resend_lost(m, (unsigned)c->peer);
}

static void conn_close(struct gg_mesh *m, int ci, const char *why)
{
	struct conn *c = &m->conns[ci];

	if (!c->used)
		return;
	conn_lost(m, ci, why);
	if (c->ts.state >= GG_TLS_STREAM_CLOSING)
		return;
	/* What is queued (a HELLO telling the peer why) goes out first. */
	conn_flush(m, ci);
	if (!c->used || c->ts.state >= GG_TLS_STREAM_CLOSING)
		return;
	if (c->test_sent) {
		conn_free_slot(m, ci);
		return;
	}
	unsigned ev = gg_tls_stream_close(&c->ts);
	if (ev & GG_TLS_STREAM_EV_DONE)
		conn_free_slot(m, ci);
}

/* A connection refused with access_denied, by this site or by the peer:
 * the two sites' dial settings may leave the pair with no streams at all,
 * so the log names them. */
static void note_refusal(struct gg_mesh *m, int ci)
{
	struct conn *c = &m->conns[ci];
	char why[600], safe[2 * sizeof(why)];

	if (c->ts.tls_failure != GG_TLS_FAIL_DENIED)
		return;
	int p = c->dialer ? c->peer : c->ts.peer_site < m->accept_count ? m->accept_map[c->ts.peer_site] : -1;
	if (p < 0)
		return;
	struct peer *pe = &m->peers[p];
	const char *them = m->names[p], *us = m->names[m->self];
	bool conflict;
	if (c->dialer) {
		/* Only a site whose dial for us is "out" says access_denied. */
		pe->denied = true;
		conflict = pe->dial == GG_DIAL_OUT;
		if (conflict)
			snprintf(why, sizeof(why),
				 "site %s refuses the streams this site dials (access_denied: its [[peers]] dial for %s is "
				 "\"out\"), and this site's dial for %s is \"out\" too, so it refuses the streams %s dials: "
				 "neither site takes the other's; set dial = \"in\" or \"both\" for the other at one of them",
				 them, us, them, them);
		else
			snprintf(why, sizeof(why),
				 "site %s refuses the streams this site dials (access_denied: its [[peers]] dial for %s is "
				 "\"out\"); the streams it dials carry the pair (dial = \"%s\" here)",
				 them, us, gg_peer_dial_name(pe->dial));
		/* A step that waits for the peer says why it never came. */
		if (conflict && !gg_mesh_peer_up(m, (unsigned)p))
			m->ops->on_stream_change(m->owner, (unsigned)p, (unsigned)c->stream, false,
						 "dial conflict: each site's [[peers]] dial for the other is \"out\", so "
						 "neither takes the other's streams");
	} else {
		/* The peer dials: its dial for us is "out" or "both". With "both" it
		 * takes our streams, and the pair works; with "out" it refuses
		 * ours too, and then we know. */
		conflict = pe->denied || (m->ops->peer_denied && m->ops->peer_denied(m->owner, (unsigned)p));
		snprintf(why, sizeof(why),
			 "site %s dialed this site, whose [[peers]] dial for it is \"out\": this site dials %s and refuses "
			 "its streams (it was told access_denied); if %s's dial for %s is \"out\" too, neither site takes "
			 "the other's streams: set dial = \"in\" or \"both\" for the other at one of them",
			 them, them, them, us);
	}
	struct gg_log_limit *w = c->dialer ? &pe->dial_warn : &pe->accept_warn;
	if (!warn_now(w, m->loop->now_us))
		return;
	gg_log(conflict ? c->dialer ? GG_LOG_ERROR : GG_LOG_WARN : GG_LOG_INFO, c->dialer ? "dial_refused" : "stream_refused",
	       "site=%s dial=%s reason=\"%s\"", them, gg_peer_dial_name(pe->dial),
	       gg_escape(safe, sizeof(safe), why, strlen(why)));
}

static void on_stream_events(struct gg_mesh *m, int ci, unsigned ev)
{
	struct conn *c = &m->conns[ci];

	if (!c->used)
		return;
	if ((ev & GG_TLS_STREAM_EV_FAILED) && c->ts.handshake_failure && c->ts.handshake_failure < GG_MESH_FAILURES)
		m->stats.stream_failures[c->ts.handshake_failure]++;
	if (ev & GG_TLS_STREAM_EV_FAILED) {
		note_refusal(m, ci);
		conn_lost(m, ci, gg_tls_stream_error(&c->ts));
	}
	if (ev & GG_TLS_STREAM_EV_OPEN) {
		if (!c->dialer) {
			size_t idx = gg_tls_engine_peer_site(c->ts.tls);
			c->peer = idx < m->accept_count ? m->accept_map[idx] : -1;
		}
		count_wire(m, c);
		c->last_rx_us = m->loop->now_us;
		if (c->dialer)
			send_hello(m, ci, (uint16_t)c->stream);
	}
	if (ev & GG_TLS_STREAM_EV_READABLE)
		conn_read(m, ci);
	if (c->used && (ev & (GG_TLS_STREAM_EV_WRITABLE | GG_TLS_STREAM_EV_OPEN)))
		conn_flush(m, ci);
	if (c->used && (ev & GG_TLS_STREAM_EV_DONE)) {
		conn_lost(m, ci, gg_tls_stream_error(&c->ts)[0] ? gg_tls_stream_error(&c->ts) : "closed");
		conn_free_slot(m, ci);
	}
	if (c->used && (ev & GG_TLS_STREAM_EV_DETACHED)) {
		struct gg_mesh_handoff *ho = c->moving;
		c->moving = NULL;
		gg_tls_stream_take(&c->ts, &ho->fd, &ho->tls);
		conn_free_slot(m, ci);
		m->ops->hand_off(m->owner, ho->stream % m->lanes, ho);
	}
}

static int free_conn_slot(const struct gg_mesh *m)
{
	for (int i = 0; i < m->conn_cap; i++)
		if (!m->conns[i].used)
			return i;
	return -1;
}

/* Takes slot ci for a stream (handshake: for the handshake pool). */
static int conn_init(struct gg_mesh *m, int ci, bool dialer, int peer, int stream, bool handshake)
{
	struct conn *c = &m->conns[ci];
	uint32_t gen = c->gen;

	memset(c, 0, sizeof(*c));
	c->gen = gen;
	c->small = malloc(CTRL_MSG_MAX);
	if (!c->small)
		return -ENOMEM;
	c->used = true;
	c->dialer = dialer;
	c->peer = peer;
	c->stream = stream;
	c->handshake = handshake;
	if (handshake)
		m->handshakes++;
	else
		m->streams++;
	return 0;
}

static void dial(struct gg_mesh *m, unsigned p, int s)
{
	struct peer *pe = &m->peers[p];
	struct sockaddr_storage ss;
	socklen_t len;
	char why[360];
	struct gg_tls_engine *e;
	int ci = m->streams < m->stream_slots ? free_conn_slot(m) : -1;

	if (ci < 0) {
		/* size_table() leaves room for every stream: say so loudly
		 * rather than leave a mesh that never comes up, and try again. */
		if (warn_now(&m->slot_warn, m->loop->now_us))
			gg_log(GG_LOG_WARN, "dial_deferred", "site=%s stream=%d reason=\"all %d stream slots busy\"",
			       m->names[p], s, m->stream_slots);
		return;
	}
	bool first;
	int rc = gg_resolver_get(m->resolver, pe->address, &ss, &len, why, sizeof(why), &first);
	if (rc == -EAGAIN) { /* its host name is being looked up */
		pe->next_dial_us[s] = m->loop->now_us + GG_RESOLVE_POLL_US;
		return;
	}
	if (rc) {
		if (first) /* once per lookup, whichever lane asks first */
			gg_log(GG_LOG_WARN, "dial_failed", "site=%s address=%s reason=\"%s\"", m->names[p],
			       pe->address, why);
		retry_later(m, p, s);
		return;
	}
	struct gg_tls_engine_config ec = { .role = GG_TLS_CLIENT, .peer_addr = pe->address, .sites = &pe->tls_site,
					   .site_count = 1, .others = m->accept_sites, .other_count = m->accept_count };
	if (gg_tls_engine_new(m->tls, &ec, &e))
		return;
	if (conn_init(m, ci, true, (int)p, s, false)) {
		gg_tls_engine_free(e);
		return;
	}
	/* Next to the peer's connection, it waits to replace it. */
	if (pe->conn[s] >= 0)
		pe->dialing[s] = ci;
	else
		pe->conn[s] = ci;
	pe->next_dial_us[s] = UINT64_MAX;
	if (gg_tls_stream_connect(&m->conns[ci].ts, m->loop, (uint32_t)ci, (struct sockaddr *)&ss, len, e, &m->sopts))
		on_stream_events(m, ci, gg_tls_stream_tick(&m->conns[ci].ts, m->loop->now_us));
}

/* The peer's address without its port, IPv4 mapped into IPv6. */
static void peer_ip(int fd, uint8_t ip[16])
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);

	memset(ip, 0, 16);
	if (getpeername(fd, (struct sockaddr *)&ss, &len))
		return;
	if (ss.ss_family == AF_INET6) {
		memcpy(ip, &((struct sockaddr_in6 *)&ss)->sin6_addr, 16);
	} else if (ss.ss_family == AF_INET) {
		ip[10] = ip[11] = 0xff;
		memcpy(ip + 12, &((struct sockaddr_in *)&ss)->sin_addr, 4);
	}
}

static const char *ip_text(const uint8_t ip[16], char *buf, size_t size)
{
	static const uint8_t v4_prefix[12] = { [10] = 0xff, [11] = 0xff };

	if (!memcmp(ip, v4_prefix, sizeof(v4_prefix)))
		return inet_ntop(AF_INET, ip + 12, buf, (socklen_t)size) ? buf : "?";
	return inet_ntop(AF_INET6, ip, buf, (socklen_t)size) ? buf : "?";
}

/* Why a new connection from `ip` finds no room in the handshake pool, or
 * NULL. The pool is apart from the stream slots, so that connections
 * nobody authenticated yet can never take a slot our own dials need; and
 * one address may hold only its share of it. */
static const char *pool_full(const struct gg_mesh *m, const uint8_t ip[16], char *why, size_t size)
{
	int from = 0;

	if (m->handshakes + (m->admit_fd >= 0) >= m->handshake_slots) {
		snprintf(why, size, "all %d handshake slots are busy", m->handshake_slots);
		return why;
	}
	for (int ci = 0; ci < m->conn_cap; ci++)
		from += m->conns[ci].used && m->conns[ci].handshake && !memcmp(m->conns[ci].ip, ip, 16);
	if (from < m->handshakes_per_address)
		return NULL;
	snprintf(why, size, "%d handshakes from this address in progress, the most one address may have", from);
	return why;
}

/* With the pool full, a connection from `ip` takes a slot from the address
 * that holds the most, when that holds at least two more than `ip` does:
 * that address's oldest handshake is closed, and true returned. So floods
 * from a few addresses, which fill the pool between them, cannot keep a
 * peer from another address out; each address keeps a fair share. */
static bool evict_for(struct gg_mesh *m, const uint8_t ip[16])
{
	struct holder {
		const uint8_t *ip;
		int count, oldest; /* oldest: of those still in their TLS handshake, -1: none */
	} addrs[32];
	int n = 0, mine = 0, best = -1;

	for (int ci = 0; ci < m->conn_cap; ci++) {
		const struct conn *c = &m->conns[ci];
		if (!c->used || !c->handshake || c->lost || c->moving)
			continue;
		if (!memcmp(c->ip, ip, 16)) {
			mine++;
			continue;
		}
		int a = 0;
		while (a < n && memcmp(addrs[a].ip, c->ip, 16))
			a++;
		if (a == n) {
			if (n == (int)GG_ARRAY_LEN(addrs))
				continue; /* so many addresses: each holds little */
			addrs[n++] = (struct holder){ c->ip, 0, -1 };
		}
		addrs[a].count++;
		/* One that proved a site's identity is not given up: it says
		 * HELLO within a round trip, or times out as usual. */
		if (c->ts.state == GG_TLS_STREAM_HANDSHAKE &&
		    (addrs[a].oldest < 0 || c->since_us < m->conns[addrs[a].oldest].since_us))
			addrs[a].oldest = ci;
	}
	/* The address that holds the most; of those that hold as many, the
	 * one whose handshake waited longest: a flood's stall, a peer's
	 * complete within round trips. */
	for (int a = 0; a < n; a++)
		if (addrs[a].oldest >= 0 &&
		    (best < 0 || addrs[a].count > addrs[best].count ||
		     (addrs[a].count == addrs[best].count &&
		      m->conns[addrs[a].oldest].since_us < m->conns[addrs[best].oldest].since_us)))
			best = a;
	if (best < 0 || addrs[best].count < mine + 2)
		return false;
	if (warn_now(&m->evict_warn, m->loop->now_us)) {
		char addr[GG_NET_ADDR_TEXT_MAX];
		gg_log(GG_LOG_INFO, "handshake_evicted", "addr=%s held=%d reason=\"the handshake pool is full: its slot "
		       "goes to an address that holds %d\"", ip_text(addrs[best].ip, addr, sizeof(addr)),
		       addrs[best].count, mine);
	}
	conn_close(m, addrs[best].oldest, "handshake slot given to an address that holds fewer");
	return true;
}

static void admit_conn(struct gg_mesh *m, int fd, const uint8_t ip[16]);

static void accept_conn(struct gg_mesh *m, int fd)
{
	char addr[GG_NET_ADDR_TEXT_MAX], why[128];
	uint8_t ip[16];

	if (m->accept_count == 0 || m->shutting_down) {
		close(fd);
		return;
	}
	peer_ip(fd, ip);
	if (pool_full(m, ip, why, sizeof(why))) {
		/* One waits at a time for the slot it was given; it comes free
		 * once the closed handshake's socket is (a loop turn). */
		if (m->admit_fd < 0 && m->handshakes >= m->handshake_slots && evict_for(m, ip)) {
			m->admit_fd = fd;
			memcpy(m->admit_ip, ip, sizeof(m->admit_ip));
			m->admit_until_us = m->loop->now_us + m->cfg->transport.handshake_timeout_us;
			return;
		}
		if (warn_now(&m->refusal_warn, m->loop->now_us)) {
			gg_log(GG_LOG_WARN, "handshake_refused", "addr=%s reason=\"%s\"", ip_text(ip, addr, sizeof(addr)),
			       why);
		}
		close(fd);
		return;
	}
	admit_conn(m, fd, ip);
}

/* Starts the TLS handshake of an accepted connection in the pool. */
static void admit_conn(struct gg_mesh *m, int fd, const uint8_t ip[16])
{
	char addr[GG_NET_ADDR_TEXT_MAX];
	struct gg_tls_engine *e;

	int ci = free_conn_slot(m);
	if (ci < 0) { /* cannot be: the pool and the stream slots add up to the table */
		close(fd);
		return;
	}
	/* gg_tls_stream_accept tunes the socket (buffers, congestion control). */
	struct gg_tls_engine_config ec = { .role = GG_TLS_SERVER, .peer_addr = gg_net_peer_addr(fd, addr, sizeof(addr)),
					   .sites = m->accept_sites, .site_count = m->accept_count };
	if (gg_tls_engine_new(m->tls, &ec, &e)) {
		close(fd);
		return;
	}
	if (conn_init(m, ci, false, -1, -1, true)) {
		gg_tls_engine_free(e);
		close(fd);
		return;
	}
	memcpy(m->conns[ci].ip, ip, sizeof(m->conns[ci].ip));
	m->conns[ci].since_us = m->loop->now_us;
	gg_tls_stream_accept(&m->conns[ci].ts, m->loop, (uint32_t)ci, fd, e, &m->sopts);
	on_stream_events(m, ci, gg_tls_stream_tick(&m->conns[ci].ts, m->loop->now_us));
}

void gg_mesh_adopt(struct gg_mesh *m, struct gg_mesh_handoff *h)
{
	int ci = m->shutting_down || m->streams >= m->stream_slots ? -1 : free_conn_slot(m);

	if (ci < 0 || conn_init(m, ci, false, (int)h->peer, -1, false)) {
		gg_log(GG_LOG_WARN, "stream_dropped", "site=%s stream=%u reason=\"%s\"", m->names[h->peer], h->stream,
		       ci < 0 ? "no free stream slot" : "out of memory");
		close(h->fd);
		gg_tls_engine_free(h->tls);
		free(h);
		return;
	}
	struct conn *c = &m->conns[ci];
	gg_tls_stream_adopt(&c->ts, m->loop, (uint32_t)ci, h->fd, h->tls, &m->sopts);
	c->last_rx_us = m->loop->now_us;
	stream_accepted(m, ci, &h->hello);
	free(h);
	gg_mesh_flush(m);
	on_stream_events(m, ci, gg_tls_stream_tick(&c->ts, m->loop->now_us));
}

/* A multishot accept keeps its listening socket open past close(): it is
 * cancelled first, and the socket closed once the accept has ended. */
static void stop_listening(struct gg_mesh *m)
{
	if (m->accept.fd < 0)
		return;
	if (m->accept.armed && !gg_loop_cancel_fd(m->loop, m->accept.fd, gg_loop_ud(GG_OP_CANCEL, LISTENER_INDEX, 0)))
		return;
	close(m->accept.fd);
	m->accept.fd = -1;
}

bool gg_mesh_on_cqe(struct gg_mesh *m, const struct io_uring_cqe *cqe)
{
	unsigned kind = gg_loop_ud_kind(cqe->user_data);
	uint32_t i = gg_loop_ud_index(cqe->user_data);

	switch (kind) {
	case GG_OP_ACCEPT: {
		/* Armed again at once, or, where accepting fails (out of
		 * descriptors), a little later: peers cannot connect meanwhile,
		 * which the log says once a second. */
		int fd = gg_acceptor_on_cqe(&m->accept, cqe, m->shutting_down);
		if (fd >= 0)
			accept_conn(m, fd);
		else if (fd != -ECANCELED && !m->shutting_down && gg_log_limit_now(&m->accept_log, m->loop->now_us, 1))
			gg_log(GG_LOG_WARN, "accept_failed", "listen=%s reason=\"%s: peers cannot connect until it "
			       "works again\"", m->cfg->site.listen, strerror(-fd));
		if (m->shutting_down && !m->accept.armed)
			stop_listening(m);
		return true;
	}
	case GG_OP_CONNECT:
	case GG_OP_RECV:
	case GG_OP_SEND:
	case GG_OP_CANCEL:
		if (i < (uint32_t)m->conn_cap && m->conns[i].used)
			on_stream_events(m, (int)i, gg_tls_stream_on_cqe(&m->conns[i].ts, cqe));
		gg_mesh_flush(m);
		return true;
	default:
		return false;
	}
}

/* Where both sites dial, the site whose name sorts first keeps its own
 * connection: while the peer's carries a stream, it dials one to replace
 * it (unless the peer refuses our dials). */
static bool wants_own_dial(const struct gg_mesh *m, unsigned p, int s)
{
	const struct peer *pe = &m->peers[p];

	return m->self < p && pe->dial == GG_DIAL_BOTH && !pe->denied && pe->dialing[s] < 0 && pe->conn[s] >= 0 &&
	       !m->conns[pe->conn[s]].dialer;
}

/* The connection given an evicted handshake's slot takes it once it is
 * free; it waits no longer than a handshake may take. */
static void admit_waiting(struct gg_mesh *m)
{
	int fd = m->admit_fd;

	if (fd < 0 || (m->handshakes >= m->handshake_slots && m->loop->now_us < m->admit_until_us &&
		       !m->shutting_down))
		return;
	m->admit_fd = -1;
	if (m->handshakes >= m->handshake_slots || m->shutting_down)
		close(fd);
	else
		admit_conn(m, fd, m->admit_ip);
}

uint64_t gg_mesh_tick(struct gg_mesh *m)
{
	const uint64_t now = m->loop->now_us;
	const struct gg_config *cfg = m->cfg;
	uint64_t next = now + 100000; /* heartbeats and dials at least every 100 ms */

	if (m->tick_last_us && now - m->tick_last_us > GG_STALL_US(cfg->transport.heartbeat_timeout_us))
		m->stall_grace_us = now + cfg->transport.heartbeat_timeout_us;
	m->tick_last_us = now;
	admit_waiting(m);
	uint64_t rearm = gg_acceptor_tick(&m->accept, now, m->shutting_down);
	if (rearm)
		next = GG_MIN(next, rearm);
	for (unsigned p = 0; p < m->sites; p++)
		if (m->peers[p].held_us && now - m->peers[p].held_us > HELD_MAX_US)
			gg_mesh_release_peer(m, p);
	next = GG_MIN(next, log_limits_flush(m));
	for (int ci = 0; ci < m->conn_cap; ci++) {
		struct conn *c = &m->conns[ci];
		if (!c->used)
			continue;
		on_stream_events(m, ci, gg_tls_stream_tick(&c->ts, now));
		if (!c->used)
			continue;
		/* Heard from: over a stream. A handshake the peer completes only to
		 * refuse the stream says nothing about whether it can carry a step. */
		if (c->peer >= 0 && c->ready && c->last_rx_us > m->heard[c->peer])
			m->heard[c->peer] = c->last_rx_us;
		uint64_t d = gg_tls_stream_deadline_us(&c->ts);
		if (d && d < next)
			next = d;
		/* The handshake pool holds a connection until its HELLO, and no
		 * longer than a handshake may take (the stream times out one
		 * that is still in its TLS handshake). */
		count_wire(m, c);
		if (c->handshake && !c->moving && c->ts.state == GG_TLS_STREAM_OPEN &&
		    now - c->since_us > cfg->transport.handshake_timeout_us) {
			m->stats.stream_failures[GG_TLS_FAIL_TIMEOUT]++;
			conn_close(m, ci, "no HELLO within the handshake timeout");
			continue;
		}
		if (!c->ready)
			continue;
		if (now - c->last_rx_us > cfg->transport.heartbeat_timeout_us && now >= m->stall_grace_us) {
			conn_close(m, ci, "heartbeat timeout");
			continue;
		}
		if (now >= c->tune_next_us)
			tune_stream(m, ci);
		/* A quiet stream is probed to tell it is alive; a busy one too,
		 * less often, for its round trip (algorithm auto's figures). */
		if (!c->ping_sent_us && (now - c->last_rx_us >= cfg->transport.heartbeat_interval_us ||
					 now - c->last_ping_us >= 2 * cfg->transport.heartbeat_interval_us)) {
			uint8_t buf[64];
			ssize_t l = gg_wire_encode_ping(buf, sizeof(buf), GG_WIRE_PING, now);
			c->ping_sent_us = c->last_ping_us = now;
			if (l > 0)
				send_ctrl(m, ci, buf, (size_t)l);
		} else if (c->ping_sent_us && now - c->ping_sent_us > cfg->transport.heartbeat_interval_us) {
			c->ping_sent_us = 0; /* lost with a stream; probe again */
		}
	}
	m->hedge_due_us = 0;
	for (unsigned p = 0; p < m->sites; p++)
		if (p != m->self) {
			peer_busy(m, p);
			hedge(m, p); /* at a step's end no ACK may come for a while */
		}
	if (m->hedge_due_us)
		next = GG_MIN(next, m->hedge_due_us);
	for (unsigned p = 0; p < m->sites && !m->shutting_down && !m->acceptor; p++) {
		if (p == m->self || m->peers[p].dial == GG_DIAL_IN)
			continue;
		for (int s = (int)m->lane; s < cfg->transport.streams_per_peer; s += (int)m->lanes) {
			if (m->peers[p].conn[s] >= 0 && !wants_own_dial(m, p, s))
				continue;
			if (now >= m->peers[p].next_dial_us[s])
				dial(m, p, s);
			else /* on time, not at the next tick: who redials first decides which connection stays */
				next = GG_MIN(next, m->peers[p].next_dial_us[s]);
		}
	}
	gg_mesh_flush(m);
	return next;
}

void gg_mesh_test_own_window(struct gg_mesh *m)
{
	m->test_own_window = true;
}

int gg_mesh_test_cut_stream(struct gg_mesh *m, unsigned peer, int stream)
{
	int ci = peer < m->sites && stream >= 0 && stream < GG_MESH_MAX_STREAMS ? m->peers[peer].conn[stream] : -1;

	if (ci < 0 || !m->conns[ci].used)
		return -ENOTCONN;
	return shutdown(m->conns[ci].ts.fd, SHUT_RDWR) ? -errno : 0;
}

int gg_mesh_test_dialed_by(const struct gg_mesh *m, unsigned peer, int stream)
{
	int ci = peer < m->sites && stream >= 0 && stream < GG_MESH_MAX_STREAMS ? m->peers[peer].conn[stream] : -1;

	if (!conn_ready(m, ci))
		return -1;
	return m->conns[ci].dialer ? (int)m->self : (int)peer;
}

int gg_mesh_test_open(struct gg_mesh *m, unsigned peer, unsigned stream, uint64_t instance_id,
		      gg_mesh_test_sent_fn *sent, void *arg)
{
	int ci = free_conn_slot(m);

	if (peer >= m->sites || peer == m->self || stream >= (unsigned)m->cfg->transport.streams_per_peer ||
	    !owned(m, stream) || !sent)
		return -EINVAL;
	if (ci < 0)
		return -EBUSY;
	if (conn_init(m, ci, false, (int)peer, -1, false))
		return -ENOMEM;
	struct conn *c = &m->conns[ci];
	c->ts.fd = -1;
	c->test_sent = sent;
	c->test_arg = arg;
	c->last_rx_us = m->loop->now_us;
	struct gg_wire_hello h = m->hello;
	h.stream_index = (uint16_t)stream;
	h.instance_id = instance_id;
	stream_accepted(m, ci, &h);
	gg_mesh_flush(m);
	return 0;
}

int gg_mesh_test_receive(struct gg_mesh *m, unsigned peer, unsigned stream, const uint8_t *bytes, size_t len)
{
	int ci = peer < m->sites && stream < GG_MESH_MAX_STREAMS ? m->peers[peer].conn[stream] : -1;

	if (ci < 0 || !m->conns[ci].test_sent)
		return -ENOTCONN;
	struct conn *c = &m->conns[ci];
	c->test_in = bytes;
	c->test_left = bytes ? len : 0;
	c->test_eof = !bytes;
	conn_read(m, ci);
	if (c->used) {
		c->test_in = NULL;
		c->test_left = 0;
	}
	gg_mesh_flush(m);
	return 0;
}

uint64_t gg_mesh_last_heard(const struct gg_mesh *m, unsigned peer)
{
	return peer < m->sites ? m->heard[peer] : 0;
}

bool gg_mesh_peer_up(const struct gg_mesh *m, unsigned peer)
{
	if (peer == m->self)
		return true;
	for (int s = 0; s < m->cfg->transport.streams_per_peer; s++)
		if (conn_ready(m, m->peers[peer].conn[s]))
			return true;
	return false;
}

int gg_mesh_stream_tcp(const struct gg_mesh *m, unsigned peer, unsigned stream, struct gg_mesh_stream_tcp *out)
{
	struct tcp_info ti;
	socklen_t len = sizeof(ti);

	if (peer >= m->sites || stream >= GG_MESH_MAX_STREAMS || !owned(m, stream) ||
	    !conn_ready(m, m->peers[peer].conn[stream]))
		return -ENOENT;
	const int ci = m->peers[peer].conn[stream];
	const int fd = m->conns[ci].ts.fd;
	socklen_t il = sizeof(int);
	int rcv = 0, snd = 0;
	memset(&ti, 0, sizeof(ti));
	if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) || getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, &il) ||
	    getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &snd, &il))
		return -errno;
	*out = (struct gg_mesh_stream_tcp){ .rtt_us = ti.tcpi_rtt,
					    .send_buffer_bytes = (uint64_t)snd,
					    .receive_buffer_bytes = (uint64_t)rcv,
					    .rttvar_us = ti.tcpi_rttvar,
					    .cwnd_bytes = (uint64_t)ti.tcpi_snd_cwnd * ti.tcpi_snd_mss,
					    .delivery_bytes_per_s = ti.tcpi_delivery_rate,
					    .retransmits = ti.tcpi_total_retrans,
					    .connection = (uint64_t)m->conns[ci].gen << 32 | (uint32_t)ci,
					    .unsent_bytes = ti.tcpi_notsent_bytes };
	return 0;
}

bool gg_mesh_peer_denied(const struct gg_mesh *m, unsigned peer)
{
	return m->peers[peer].denied;
}

bool gg_mesh_connected(const struct gg_mesh *m)
{
	for (unsigned p = 0; p < m->sites && !m->acceptor; p++) {
		if (p == m->self)
			continue;
		for (int s = (int)m->lane; s < m->cfg->transport.streams_per_peer; s += (int)m->lanes)
			if (!conn_ready(m, m->peers[p].conn[s]))
				return false;
	}
	return true;
}

void gg_mesh_shutdown(struct gg_mesh *m)
{
	gg_mesh_flush(m);
	m->shutting_down = true;
	for (int ci = 0; ci < m->conn_cap; ci++)
		if (m->conns[ci].used)
			conn_close(m, ci, "shutting down");
	stop_listening(m);
}

bool gg_mesh_flushed(const struct gg_mesh *m)
{
	for (unsigned p = 0; p < m->sites; p++)
		if (m->peers[p].unacked || m->peers[p].waiting)
			return false;
	for (int ci = 0; ci < m->conn_cap; ci++)
		if (m->conns[ci].used && m->conns[ci].ready && m->conns[ci].txq_head)
			return false;
	return true;
}

bool gg_mesh_idle(const struct gg_mesh *m)
{
	if (m->accept.armed)
		return false;
	for (int ci = 0; ci < m->conn_cap; ci++)
		if (m->conns[ci].used)
			return false;
	return true;
}

/* Stream slots: every stream this lane holds, a dial of its own next to
 * the peer's connection (where both dial), and one more closing while
 * its replacement comes up. The listening lane also has the handshake
 * pool, for accepted connections until their HELLO (when it keeps them or
 * hands them to their lane): room for all the streams the peers open at
 * once, from one address (as on loopback, or behind one NAT), and as much
 * again, so that one address flooding the listener leaves the peers
 * theirs. */
static void size_table(struct gg_mesh *m)
{
	int S = m->cfg->transport.streams_per_peer;
	int owned = m->acceptor ? 0 : (S - (int)m->lane + (int)m->lanes - 1) / (int)m->lanes;

	m->stream_slots = 3 * (int)(m->sites - 1) * owned;
	m->handshakes_per_address = GG_MAX(1, (int)m->sites - 1) * S;
	m->handshake_slots = m->listen ? 2 * m->handshakes_per_address : 0;
}

unsigned gg_mesh_conn_max(const struct gg_config *cfg)
{
	/* Over all lanes: 3 stream slots and 2 of the handshake pool per stream. */
	return 5 * (unsigned)GG_MAX((size_t)1, cfg->peer_count) * (unsigned)cfg->transport.streams_per_peer;
}

int gg_mesh_new(const struct gg_mesh_config *mc, struct gg_mesh **out, char *err, size_t err_size)
{
	const struct gg_config *cfg = mc->cfg;
	struct gg_mesh *m = calloc(1, sizeof(*m));
	const char *why;
	int rc;

	*out = NULL;
	if (!m)
		return gg_errf(err, err_size, -ENOMEM, "no memory for the peer mesh");
	m->cfg = cfg;
	m->ops = mc->ops;
	m->owner = mc->owner;
	m->sites = mc->sites;
	m->self = mc->self;
	m->tls = mc->tls;
	m->resolver = mc->resolver;
	m->loop = mc->loop;
	m->pool = mc->pool;
	m->max_payload = mc->max_payload_bytes;
	m->hello = *mc->hello;
	m->accept = (struct gg_acceptor){ .loop = m->loop, .fd = -1, .ud = gg_loop_ud(GG_OP_ACCEPT, 0, 0) };
	m->admit_fd = -1;
	gg_net_buffer_limits(&m->buffer_limits);
	m->lanes = mc->lanes ? mc->lanes : 1;
	for (unsigned p = 0; p < GG_AR_MAX_SITES; p++)
		m->heard[p] = m->loop->now_us;
	m->lane = mc->lane;
	m->acceptor = mc->lanes && mc->lane >= mc->lanes;
	m->listen = mc->listen || !mc->lanes || m->acceptor;
	memcpy(m->names, mc->names, sizeof(m->names[0]) * mc->sites);
	for (unsigned i = 0; i < m->sites; i++) {
		for (int s = 0; s < GG_MESH_MAX_STREAMS; s++)
			m->peers[i].conn[s] = m->peers[i].dialing[s] = -1;
		if (i == m->self)
			continue;
		const struct gg_peer_config *pc = gg_config_peer(cfg, m->names[i]);
		if (!pc) {
			rc = gg_errf(err, err_size, -EINVAL, "site %s is not among the configured peers", m->names[i]);
			goto fail;
		}
		snprintf(m->peers[i].address, sizeof(m->peers[i].address), "%s", pc->address ? pc->address : "");
		m->peers[i].dial = pc->dial;
		if (gg_tls_site_init(&m->peers[i].tls_site, pc->site, pc->identity, &why)) {
			rc = gg_errf(err, err_size, -EINVAL, "peer %s: identity %s: %s", pc->site, pc->identity, why);
			goto fail;
		}
		/* Every peer may present itself; those we only dial are told no. */
		m->accept_sites[m->accept_count] = m->peers[i].tls_site;
		m->accept_sites[m->accept_count].denied = pc->dial == GG_DIAL_OUT;
		m->accept_map[m->accept_count++] = (int)i;
	}
	if (!m->resolver && !m->acceptor) {
		if ((rc = gg_resolver_new(&m->resolver))) {
			rc = gg_errf(err, err_size, rc, "no memory for the peer mesh's resolver");
			goto fail;
		}
		m->own_resolver = true;
	}
	size_table(m);
	int cap = GG_MAX(1, m->stream_slots + m->handshake_slots);
	if (!(m->conns = calloc((size_t)cap, sizeof(*m->conns)))) {
		rc = gg_errf(err, err_size, -ENOMEM, "no memory for %d connection slots", cap);
		goto fail;
	}
	m->conn_cap = cap;
	m->sopts = (struct gg_tls_stream_options){ .connect_timeout_us = cfg->transport.connect_timeout_us,
						   .handshake_timeout_us = cfg->transport.handshake_timeout_us,
						   .socket_buffer_bytes = (int)cfg->transport.socket_buffer_bytes,
						   .congestion = cfg->transport.congestion_control };

	if (!m->listen) {
		*out = m;
		return 0;
	}
	struct sockaddr_storage ss;
	socklen_t len;
	if (gg_net_addr_parse(cfg->site.listen, &ss, &len, &why)) {
		rc = gg_errf(err, err_size, -EINVAL, "listen address %s: %s", cfg->site.listen, why);
		goto fail;
	}
	m->accept.fd = gg_net_listen((struct sockaddr *)&ss, len, 128, (int)cfg->transport.socket_buffer_bytes);
	if (m->accept.fd < 0) {
		rc = gg_errf(err, err_size, m->accept.fd, "cannot listen on %s: %s", cfg->site.listen,
			     strerror(-m->accept.fd));
		goto fail;
	}
	if ((rc = gg_acceptor_arm(&m->accept))) {
		gg_errf(err, err_size, rc, "cannot accept on %s: %s", cfg->site.listen, strerror(-rc));
		goto fail;
	}
	*out = m;
	return 0;
fail:
	gg_mesh_free(m);
	return rc ? rc : -EINVAL;
}

static bool in_flight(const struct gg_mesh *m)
{
	if (m->accept.armed)
		return true;
	for (int ci = 0; ci < m->conn_cap; ci++)
		if (m->conns[ci].used && gg_tls_stream_busy(&m->conns[ci].ts))
			return true;
	return false;
}

/* Completions while the mesh is torn down: they only tell the streams
 * that their operations ended. */
static void teardown_cqe(void *arg, const struct io_uring_cqe *cqe)
{
	struct gg_mesh *m = arg;
	uint32_t i = gg_loop_ud_index(cqe->user_data);

	switch (gg_loop_ud_kind(cqe->user_data)) {
	case GG_OP_ACCEPT:
		if (cqe->res >= 0)
			close(cqe->res);
		if (!(cqe->flags & IORING_CQE_F_MORE))
			m->accept.armed = false;
		break;
	case GG_OP_CONNECT:
	case GG_OP_RECV:
	case GG_OP_SEND:
	case GG_OP_CANCEL:
		if (i < (uint32_t)m->conn_cap && m->conns[i].used)
			gg_tls_stream_on_cqe(&m->conns[i].ts, cqe);
		break;
	default:
		break;
	}
}

/* Stops the listener and every stream at once, and turns the loop until
 * the kernel is done with their buffers, TEARDOWN_US at most: a receive
 * left in flight would write into an engine's ring after it was freed. */
static void teardown(struct gg_mesh *m)
{
	m->shutting_down = true;
	stop_listening(m);
	for (int ci = 0; ci < m->conn_cap; ci++)
		if (m->conns[ci].used)
			gg_tls_stream_abort(&m->conns[ci].ts);
	uint64_t until = gg_monotonic_us() + TEARDOWN_US;
	while (in_flight(m) && gg_monotonic_us() < until)
		if (gg_loop_run(m->loop, 10000, teardown_cqe, m) < 0)
			break;
}

void gg_mesh_free(struct gg_mesh *m)
{
	if (!m)
		return;
	teardown(m);
	for (int ci = 0; ci < m->conn_cap; ci++) {
		struct conn *c = &m->conns[ci];
		if (!c->used)
			continue;
		if (gg_tls_stream_busy(&c->ts)) {
			/* Left allocated: the kernel may still write into its rings. */
			gg_log(GG_LOG_WARN, "stream_abandoned", "site=%s stream=%d reason=\"I/O still in flight at teardown\"",
			       c->peer >= 0 ? m->names[c->peer] : "?", c->stream);
		} else {
			if (c->ts.fd >= 0)
				close(c->ts.fd);
			gg_tls_engine_free(c->ts.tls);
		}
		conn_free_slot(m, ci);
	}
	for (unsigned p = 0; p < GG_AR_MAX_SITES; p++) {
		free_list(m->peers[p].unacked);
		free_list(m->peers[p].waiting);
	}
	if (m->accept.fd >= 0)
		close(m->accept.fd);
	if (m->admit_fd >= 0)
		close(m->admit_fd);
	if (m->own_resolver)
		gg_resolver_free(m->resolver);
	free(m->conns);
	free(m);
}
