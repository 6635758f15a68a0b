/* The peer mesh: TLS streams to every other site, and the delivery of the
 * peer protocol (wire.h) over them.
 *
 * Sites are numbered by their names in sorted order, the same at every
 * site. Each peer's [[peers]] dial setting says who opens its
 * streams_per_peer TLS streams: this site ("out": it refuses the peer's
 * connections, with an access_denied alert once the peer proved its
 * identity), the peer ("in": this site never dials it), or either
 * ("both"). A dialer retries with back-off, so sites may start in any
 * order. The acceptor learns who dialed from the certificate and the
 * stream number from the peer's HELLO, which both sides exchange and
 * check (gg_wire_hello_check) before anything else. Where both dial, two
 * connections for one stream can come up at once: both sites keep the one
 * the site with the lower index dialed (the other side's closes, and what
 * it carried goes out again on the one kept), and that site, while the
 * peer's connection carries a stream, dials its own to replace it.
 * Until then an accepted connection sits in a bounded handshake pool, with
 * a share per source address, apart from the slots of the streams the
 * mesh dials and holds: a flood of connections that never authenticate is
 * refused at once and cannot keep the mesh from its peers.
 * Heartbeats (PING/PONG) measure each stream's round trip and close a
 * stream that stays silent for heartbeat_timeout.
 *
 * Data. DATA messages go out on the stream their chunk index picks (the
 * first ready one from there), and each is kept until the peer
 * acknowledges it: a stream cut mid-transfer is repaired by sending the
 * unacknowledged messages again once a stream to that peer is up (the
 * step engine drops duplicates). Unacknowledged bytes per peer are bounded
 * by `inflight_bytes`; what does not fit waits here.
 *
 * Received messages are read straight into buffers of their exact size
 * and handed to the owner with the buffer, which the owner may keep (a
 * frame for a step that has not started) without a copy.
 *
 * A mesh is driven by one thread: its io_uring loop, and the owner's calls
 * on that thread. Whoever owns the loop passes completions of the mesh's
 * kinds to gg_mesh_on_cqe() and calls gg_mesh_tick() after every turn.
 *
 * Lanes. A gateway may run several meshes, one per thread (lane): lane l
 * of L owns the streams whose number s has s % L == l, to every peer. It
 * dials those of them it dials, and settles their duplicates. A mesh with
 * lane == L, the acceptor, owns no stream: on a thread of its own it
 * listens, runs the TLS handshake and HELLO of every accepted stream, and
 * hands each to the lane that owns it (ops->hand_off, then gg_mesh_adopt()
 * there), so that no handshake, costly or malicious, takes a lane's time
 * from the data. */
#ifndef GG_MESH_H
#define GG_MESH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "config.h"
#include "gg_common.h"
#include "tls_context.h"
#include "tls_engine.h"
#include "uring_loop.h"
#include "wire.h"

#define GG_MESH_ERROR_MAX 512

/* A gap between two turns of a loop past which the loop itself stood
 * still (its process stopped or starved) and could hear nothing: half of
 * heartbeat_timeout, and at least five of the 100 ms turns an idle loop
 * takes, so that a short heartbeat_timeout is not taken for a stall at
 * every turn. Silence is then judged only heartbeat_timeout later. */
#define GG_STALL_US(heartbeat_timeout_us) GG_MAX((uint64_t)(heartbeat_timeout_us) / 2, (uint64_t)500000)
#define GG_MESH_MAX_STREAMS 64

struct gg_mesh;
struct gg_mesh_handoff;
struct gg_resolver;

/* The stream a message arrived on, as long as it lives. An ACK goes back
 * on the stream its DATA came on: when that stream dies, the sender sends
 * the DATA again, so the ACK is never lost on its own. */
struct gg_mesh_via {
	int conn;
	uint32_t gen;
};

/* What the mesh tells its owner, on the mesh's thread. The three that hand
 * over a message return 0, or -ENOMEM when the owner could not take it,
 * or -ENOBUFS when the peer's messages already wait past the owner's
 * bound for them: the mesh then closes the stream (saying which), and the
 * peer sends again, on the next one, what it had not seen acknowledged or
 * answered (DATA, DONE, ABORT, END), as it does after any cut. */
struct gg_mesh_ops {
	/* DATA from `peer` on stream `via`: `m` points into `payload`, which the
	 * owner may keep with gg_buf_get(). The owner acknowledges it
	 * (gg_mesh_ack, on this mesh's thread, with `via`) once it used it;
	 * until then it counts against the sender's window. */
	int (*on_data)(void *owner, unsigned peer, struct gg_mesh_via via, const struct gg_wire_msg *m,
		       struct gg_buf *payload);
	/* ABORT, DONE or END from `peer`. */
	int (*on_control)(void *owner, unsigned peer, const struct gg_wire_msg *m);
	/* An ACK for DATA this mesh does not hold (another lane may). */
	int (*on_foreign_ack)(void *owner, unsigned peer, const struct gg_wire_msg *m);
	/* `peer` came back with a new instance id: it restarted, and every step
	 * in progress with it is lost, but for one that began after the last
	 * stream to the old instance went down. DATA to it that a stream took
	 * (unacknowledged, or waiting to go again) is dropped before this is
	 * called; DATA no stream took is held until gg_mesh_release_peer(),
	 * once the owner let go of the steps it fails (gg_mesh_forget()), and
	 * then goes to the new instance. */
	void (*on_peer_restarted)(void *owner, unsigned peer, uint64_t instance_id);
	/* Stream `stream` to `peer` became ready (HELLOs exchanged), or stopped
	 * being ready, or, not ready, was refused by settings that leave the
	 * pair with no streams, or had a dial fail while no stream to the peer
	 * is up (`why` says why). One connection replacing another for a
	 * stream is no change. `stream` GG_MESH_MAX_STREAMS: no stream changed,
	 * but a connection of the peer was refused (another release, other
	 * settings) for `why`, the cause to name while no stream is up (a mesh
	 * cannot tell: another lane may hold them). */
	void (*on_stream_change)(void *owner, unsigned peer, unsigned stream, bool ready, const char *why);
	/* An accepted stream that lane `lane` owns, ready for gg_mesh_adopt()
	 * there; the owner takes `h` (malloc'd). */
	void (*hand_off)(void *owner, unsigned lane, struct gg_mesh_handoff *h);
	/* Whether `peer` refused a stream another mesh of this gateway dialed
	 * (access_denied), for the acceptor, which dials none; may be NULL. */
	bool (*peer_denied)(void *owner, unsigned peer);
};

/* An accepted stream on its way to the lane that owns it: handshake done,
 * the peer's HELLO received and checked, ours not sent yet. */
struct gg_mesh_handoff {
	int fd;
	struct gg_tls_engine *tls;
	unsigned peer, stream;
	struct gg_wire_hello hello; /* the peer's */
};

struct gg_mesh_config {
	const struct gg_config *cfg;    /* must outlive the mesh */
	unsigned sites, self;
	char (*names)[GG_WIRE_NAME_MAX + 1]; /* site names by index; copied */
	const struct gg_wire_hello *hello;         /* ours, without stream_index; copied */
	struct gg_tls_context *tls;     /* shared; must outlive the mesh */
	/* Looks up the peers' host names off this loop: shared by a gateway's
	 * lanes, and must outlive the mesh; NULL: the mesh makes its own. */
	struct gg_resolver *resolver;
	struct gg_loop *loop;           /* the thread's loop; must outlive the mesh */
	struct gg_buf_pool *pool;       /* for received DATA; may be NULL */
	size_t max_payload_bytes;       /* largest message payload accepted */
	const struct gg_mesh_ops *ops;
	void *owner;
	/* This mesh owns streams s with s % lanes == lane; 0, 0: all (and it
	 * listens); lane == lanes: none (the acceptor, which listens). */
	unsigned lane, lanes;
	bool listen;                    /* accepts peers' streams */
};

/* Why a stream never came up: the TLS handshake's failures (enum
 * gg_tls_failure, GG_TLS_OK unused), and a peer whose HELLO disagrees
 * with this site's settings. */
#define GG_MESH_FAIL_MISMATCH (GG_TLS_FAIL_PROTOCOL + 1)
#define GG_MESH_FAILURES (GG_MESH_FAIL_MISMATCH + 1)

/* "timeout", "unknown-ca", ... as gg_tls_failure_name(); "mismatch". */
const char *gg_mesh_failure_name(unsigned failure);

struct gg_mesh_peer_stats {
	uint64_t wire_bytes_in, wire_bytes_out; /* the peer's TCP streams: TLS records, handshakes */
	uint64_t stream_ups, stream_downs;      /* streams that became ready, and ready ones lost */
	uint64_t acked_bytes;                   /* DATA frame bytes the peer acknowledged */
	uint64_t hedged_frames;                 /* DATA sent once more on a faster stream (hedge()) */
	/* DATA a stream took for the peer, each frame once (not its copies
	 * sent again or hedged; not what waited for a stream that never came
	 * up): frame bytes, and the float32 bytes they carry. */
	uint64_t data_bytes_out, raw_bytes_out;
	/* Frame bytes the peer acknowledged per second of time with DATA in
	 * flight to it, over the last second of such time; 0 until then. */
	uint64_t delivery_bytes_per_s;
};

struct gg_mesh_stats {
	uint64_t data_bytes_in;   /* DATA payload bytes received */
	uint64_t resent_messages;
	uint64_t duplicate_streams; /* connections closed as the one of two for a stream that is not kept */
	uint64_t rtt_us[GG_AR_MAX_SITES]; /* last heartbeat round trip per site */
	/* The shortest heartbeat round trip per site over the last 10 to 20
	 * s (0: none yet): queueing behind DATA only ever adds to one. */
	uint64_t rtt_min_us[GG_AR_MAX_SITES];
	/* Frame bytes all peers acknowledged per second of time with DATA in
	 * flight to any of them, over the last second of such time (0 until
	 * then), and when it was measured (gg_monotonic_us): what this mesh's
	 * streams get of the site's uplink. */
	uint64_t uplink_bytes_per_s, uplink_at_us;
	double tls_s;             /* time in TLS record encryption and decryption */
	struct gg_mesh_peer_stats peers[GG_AR_MAX_SITES];
	uint64_t stream_failures[GG_MESH_FAILURES]; /* streams that never came up, by why */
};

/* The most connections the meshes of a gateway with this configuration
 * hold at once, over all its lanes: what its file limit must allow. Each
 * mesh sizes its table from the configuration, so that every stream it
 * dials or accepts has a slot. */
unsigned gg_mesh_conn_max(const struct gg_config *cfg);

/* Makes the mesh and listens on the site's address. Returns 0, or a
 * negative errno with a message in err. */
GG_MUST_CHECK int gg_mesh_new(const struct gg_mesh_config *mc, struct gg_mesh **out, char *err, size_t err_size);
/* Cancels what the mesh has in flight and turns its loop until the kernel
 * is done with the buffers involved (a second at most; completions of
 * other kinds that come meanwhile are dropped, so call it when the loop
 * is being torn down too), then frees it. A stream still busy after that
 * is logged and left allocated, never freed under the kernel. */
void gg_mesh_free(struct gg_mesh *m);

/* Handles a completion of the mesh's kinds (GG_OP_ACCEPT .. GG_OP_CANCEL);
 * false for any other kind. */
bool gg_mesh_on_cqe(struct gg_mesh *m, const struct io_uring_cqe *cqe);
/* Stream deadlines, heartbeats and dials; call after every loop turn.
 * Returns the next deadline (gg_monotonic_us). */
uint64_t gg_mesh_tick(struct gg_mesh *m);

/* Takes over an accepted stream another lane's mesh handed off; frees `h`. */
void gg_mesh_adopt(struct gg_mesh *m, struct gg_mesh_handoff *h);
/* An ACK another lane received for DATA this mesh may hold. */
void gg_mesh_take_ack(struct gg_mesh *m, unsigned peer, const struct gg_wire_msg *msg);

/* DATA of step `step` for chunk `id` to `peer`: queued behind the peer's
 * window, sent and kept until acknowledged. Takes a reference to `frame`.
 * `raw_bytes`: the float32 bytes the frame carries, counted with it once
 * a stream takes it (gg_mesh_peer_stats). Returns 0 or -ENOMEM. */
GG_MUST_CHECK int gg_mesh_send_data(struct gg_mesh *m, unsigned peer, const struct gg_wire_step *step,
				    const struct gg_ar_chunk_id *id, struct gg_buf *frame, uint64_t raw_bytes);
/* A small message (ABORT, DONE: anything but DATA) to `peer`: on one ready
 * stream, or on every ready stream with `every_stream` (so one cut after
 * it was queued cannot lose it). Dropped when no stream is ready. */
void gg_mesh_send_control(struct gg_mesh *m, unsigned peer, const uint8_t *msg, size_t len, bool every_stream);
/* Why a stream is closed whose peer's messages wait past this site's
 * budget for them (the owner's on_data/on_control returned -ENOBUFS, or
 * gg_mesh_close_via()). */
#define GG_MESH_OVER_BUDGET                                                                                      \
	"the peer's messages wait here past this site's budget for them: it sends faster than this site takes " \
	"them, beyond its window"
/* Closes the stream `via` names, for `why`, where it still is that one. */
void gg_mesh_close_via(struct gg_mesh *m, struct gg_mesh_via via, const char *why);
/* Acknowledges DATA for (job, run, step, id) on the stream it came on;
 * nothing when that stream is gone (the peer sends the DATA again). A full
 * send queue does not drop it: a stream that cannot take it is closed. */
void gg_mesh_ack(struct gg_mesh *m, struct gg_mesh_via via, const char *job, uint64_t run, uint64_t step,
		 const struct gg_ar_chunk_id *id);

/* Messages are queued by every call above and written, several to a
 * record, at the end of each completion and tick, or by this. */
void gg_mesh_flush(struct gg_mesh *m);

/* DATA messages waiting for or on `peer`'s streams but not yet written to
 * a socket, counted up to `limit`. */
unsigned gg_mesh_queued(const struct gg_mesh *m, unsigned peer, unsigned limit);
/* Forgets DATA of `job`'s steps lo..hi: the step failed (lo == hi), or
 * the job ended (0..UINT64_MAX). What no stream took yet goes now; what
 * a stream took stays counted until the peer acknowledges it or the
 * stream is lost, and is never sent again (not hedged, not resent). */
void gg_mesh_forget(struct gg_mesh *m, const char *job, uint64_t lo, uint64_t hi);
/* Whether DATA of `job` waits to be sent or acknowledged. */
bool gg_mesh_holds_job(const struct gg_mesh *m, const char *job);

/* When this mesh last received anything from `peer` on a stream whose
 * HELLOs were exchanged (gg_monotonic_us; the mesh's start until then), as
 * of the last gg_mesh_tick(). */
uint64_t gg_mesh_last_heard(const struct gg_mesh *m, unsigned peer);

/* Whether `peer` has a ready stream of this mesh's; whether every peer has
 * all this mesh's streams up. */
bool gg_mesh_peer_up(const struct gg_mesh *m, unsigned peer);
/* What the kernel says of a stream's TCP connection (TCP_INFO). */
struct gg_mesh_stream_tcp {
	uint64_t rtt_us, rttvar_us;     /* smoothed round trip, and its mean deviation */
	uint64_t cwnd_bytes;            /* congestion window: segments x MSS */
	uint64_t delivery_bytes_per_s;  /* the kernel's delivery rate estimate */
	uint64_t retransmits;           /* segments sent again on this connection */
	uint64_t connection;            /* which connection: another once the stream reconnects */
	uint64_t unsent_bytes;          /* written, not yet sent */
	uint64_t send_buffer_bytes, receive_buffer_bytes; /* SO_SNDBUF, SO_RCVBUF as the kernel counts them */
};

/* Fills *out for stream `stream` to `peer` when this mesh holds it ready:
 * 0, or -ENOENT (not ready here) or the errno of getsockopt. */
int gg_mesh_stream_tcp(const struct gg_mesh *m, unsigned peer, unsigned stream, struct gg_mesh_stream_tcp *out);

/* Sends again to `peer` the DATA held since it restarted (on_peer_restarted). */
void gg_mesh_release_peer(struct gg_mesh *m, unsigned peer);
/* Whether `peer` refused this mesh's last dial with access_denied. */
bool gg_mesh_peer_denied(const struct gg_mesh *m, unsigned peer);
bool gg_mesh_connected(const struct gg_mesh *m);
/* True when every DATA sent was acknowledged and nothing waits. */
bool gg_mesh_flushed(const struct gg_mesh *m);
/* Refuses new connections and closes every stream (what is queued, then
 * close_notify). */
void gg_mesh_shutdown(struct gg_mesh *m);
/* True once shutdown finished: nothing in flight. */
bool gg_mesh_idle(const struct gg_mesh *m);

const struct gg_mesh_stats *gg_mesh_stats(const struct gg_mesh *m);

/* How long a dial waits after a back-off of `backoff_us` (at least min_us,
 * reconnect_min): the back-off less up to a quarter of what it grew past
 * min_us, by a hash of the two sites' names (in either order), the stream
 * and the back-off. Never more than the back-off nor less than min_us; the
 * first retry waits min_us exactly. */
uint64_t gg_mesh_backoff_wait(uint64_t backoff_us, uint64_t min_us, const char *site_a, const char *site_b,
			      unsigned stream);

/* Tests: DATA goes to peers within this site's own inflight_per_peer,
 * whatever the peers' (a peer that ignores their budgets). */
void gg_mesh_test_own_window(struct gg_mesh *m);
/* Tests: cuts one stream's TCP connection as a network fault would. */
GG_MUST_CHECK int gg_mesh_test_cut_stream(struct gg_mesh *m, unsigned peer, int stream);
/* Tests: the site that dialed the connection `stream` to `peer` is up on
 * (this site's index or the peer's), or -1 when it is not up. */
int gg_mesh_test_dialed_by(const struct gg_mesh *m, unsigned peer, int stream);

/* Tests: what a stream of gg_mesh_test_open() writes, one message at a
 * time: its head (header and fixed part) and, for DATA, its frame. */
typedef void gg_mesh_test_sent_fn(void *arg, unsigned peer, unsigned stream, const uint8_t *head, size_t head_len,
				  const uint8_t *frame, size_t frame_len);

/* Tests: a stream to `peer` with no socket or TLS behind it, ready at once
 * as an accepted stream number `stream` whose HELLO carried `instance_id`
 * would be (it replaces a stream open on that number as such a stream
 * would, or is refused when this site sorts first and its own connection
 * for the number is up; a new instance id means the peer restarted). What
 * the mesh writes to it goes to `sent` at once; what it reads comes from
 * gg_mesh_test_receive(). Returns 0, -EINVAL (the stream is not this
 * mesh's, or `peer` is this site), -EBUSY (no free slot) or -ENOMEM. */
GG_MUST_CHECK int gg_mesh_test_open(struct gg_mesh *m, unsigned peer, unsigned stream, uint64_t instance_id,
				    gg_mesh_test_sent_fn *sent, void *arg);
/* Tests: `len` bytes from the peer on such a stream, as the TLS stream
 * would hand them over: whole messages or pieces of them. NULL: the peer
 * closed the stream. Returns 0, or -ENOTCONN when that stream is not open
 * (a bad message closes it). */
GG_MUST_CHECK int gg_mesh_test_receive(struct gg_mesh *m, unsigned peer, unsigned stream, const uint8_t *bytes,
				       size_t len);

#endif
