/* A running gateway: its peer mesh, the steps in progress and the io_uring
 * loop that drives them.
 *
 * Mesh. Sites are numbered by their names in sorted order, the same at
 * every site. For each pair, the site with the lower index dials the other
 * on streams_per_peer TLS streams (so either may start first: the dialer
 * retries with back-off); the acceptor learns who dialed from the
 * certificate and the stream number from the peer's HELLO, which both
 * sides exchange and check (gg_wire_hello_check) before any data.
 *
 * Data. A step's frames are striped over a peer's streams by chunk index.
 * Every DATA message is acknowledged once the receiver has used it; the
 * sender keeps it until then, so a stream cut mid-step is repaired by
 * sending the unacknowledged messages again once a stream to that peer is
 * up (the step engine drops duplicates). Unacknowledged bytes per peer are
 * bounded by limits.inflight_per_peer, and frames for a step a site has
 * not started yet wait unacknowledged, so a fast site cannot flood a slow
 * one. A peer that comes back with a new instance id has lost its steps:
 * every step in progress fails at once, naming it.
 *
 * Commit. A site whose result is whole sends DONE to every peer and hands
 * the result over only once every peer said DONE too; a site that fails
 * the step first sends ABORT instead. So a step completes at every site or
 * at none, short of a site dying between its DONE messages.
 *
 * Failure. A step fails at every site, with the code and message of the
 * site where it failed first: that site sends ABORT to every peer. A step
 * fails when it is not complete by its deadline (the ranks' earliest,
 * naming the site, phase, shard and chunk it still waits for; a site whose
 * ranks are all in gives the others GG_NODE_DEADLINE_GRACE_US and twice
 * the longest round trip first, so that a site still waiting for a rank
 * of its own, whose deadline comes at the same time when every rank gave
 * the same timeout, names that rank everywhere), when a site
 * it needs has not been heard from for heartbeat_timeout, when a peer
 * restarted, or when this site's ranks failed it (gg_node_abort). Once a
 * site holds the result and said DONE, it waits for the other DONEs past
 * the deadline, up to heartbeat_timeout more: the others may have
 * completed, and failing here would split the outcome; it fails with
 * GG_ERR_SITE when a site it waits for was not heard from meanwhile. But
 * while no stream to any peer was up since its DONE went out, none can
 * have completed, and a lost site fails the step at once. */
#ifndef GG_NODE_H
#define GG_NODE_H

#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "gg_common.h"
#include "mesh.h"
#include "uring_loop.h"
#include "wire.h"

/* What a site whose ranks are all in adds to a step's deadline, with twice
 * its longest round trip (see "Failure" above): enough for the ranks of
 * the sites, which give their deadlines as they enter the step, to enter
 * it apart by a busy host's scheduling. */
#define GG_NODE_DEADLINE_GRACE_US 100000

/* Jobs a gateway runs at once: each keeps its place from its first step
 * until its ranks are gone. */
#define GG_NODE_MAX_JOBS 32

#define GG_NODE_ERROR_MAX 512

struct gg_node;

/* One all-reduce step of one job at this site, handed to the node. The
 * node reads `input` and writes `result` (count fp32 elements each) until
 * it calls done; both stay owned by the caller. */
struct gg_node_step {
	char job[GG_WIRE_NAME_MAX + 1];
	uint64_t seq;       /* 1, 2, ... per job: steps of a job run in order */
	uint32_t tensor_id;
	uint64_t count;
	uint8_t dtype;      /* what the ranks hold (GG_WIRE_F32 / GG_WIRE_BF16); sums are fp32 */
	const float *input;
	float *result;
	/* input and result are device memory of the gateway's GPU: the lanes
	 * encode and decode them there (gateway/engine/mem_cuda.h), and the
	 * host moves only frames. Refused by a gateway built without CUDA. */
	bool device;
	uint64_t deadline_us; /* gg_monotonic_us() by which the step fails; 0: step_timeout from now */
	uint64_t timeout_us;  /* the time the ranks gave it, which set deadline_us (for messages) */
	/* Called once, from the node's thread: status 0 with result final, or
	 * an enum gg_errc code (include/gradgate.h) and a message naming the
	 * site, step and shard: GG_ERR_TIMEOUT for a deadline, GG_ERR_MISMATCH
	 * when sites or ranks announced different tensors, GG_ERR_RANK when a
	 * rank left, GG_ERR_SITE for a site lost, restarted or broken, the
	 * code an aborting site gave otherwise. */
	void (*done)(void *arg, struct gg_node_step *step, int status, const char *message);
	/* Set by the node before done() when the step completed: the
	 * algorithm it went by (ring or direct; auto's plan or probe). */
	enum gg_allreduce_algo algorithm;
	/* Optional (NULL): called before the node first reads input elements
	 * [offset, offset + n), and once result elements [offset, offset + n)
	 * are final; each element once (gg_ar_ops.gather and .deliver). */
	void (*gather)(void *arg, uint64_t offset, uint64_t n);
	void (*deliver)(void *arg, uint64_t offset, uint64_t n);
	void *arg;
};

struct gg_node_stats {
	uint64_t steps_done;   /* completed at every site */
	uint64_t steps_failed; /* failed here: those the node ran, and those this site's ranks failed
				  before they reached it (gg_node_abort) */
	uint64_t data_bytes_out, data_bytes_in; /* frames as sent, and as taken (duplicates left out) */
	uint64_t raw_bytes_out;                 /* fp32 bytes those frames carry */
	uint64_t resent_messages;
	uint64_t hedged_frames;                 /* frames sent once more on a faster stream than their own */
	uint64_t rtt_us[GG_AR_MAX_SITES];       /* last heartbeat round trip per site */
	double encode_s, decode_s;              /* time in the codecs (error feedback included) */
	double tls_s;                           /* time in TLS record encryption and decryption */
	uint64_t early_bytes;                   /* frames held for steps not started here, now */
	uint64_t early_refused;                 /* frames past the early budget, not kept */
};

/* Upper bounds of the step duration histogram, in seconds. */
#define GG_NODE_STEP_BUCKETS 14
extern const double gg_node_step_bucket_s[GG_NODE_STEP_BUCKETS];
/* Failure counts are kept per enum gg_errc code: index -code, 1 to 15. */
#define GG_NODE_CODES 16

/* One peer as this site sees it. Bytes count from the node's start. */
struct gg_node_peer_metrics {
	uint64_t raw_bytes_out, raw_bytes_in;   /* fp32 bytes the frames carry */
	uint64_t data_bytes_out, data_bytes_in; /* frames (after codec and zstd), as sent and taken */
	uint64_t wire_bytes_out, wire_bytes_in; /* what the TCP streams carried: TLS records, handshakes */
	uint64_t stream_ups, stream_downs;      /* streams that came up, and ready ones lost */
	unsigned streams_up, streams;           /* ready now, of streams_per_peer */
	uint64_t rtt_us;                        /* last heartbeat round trip; 0: none yet */
	uint64_t delivery_bytes_per_s;          /* see gg_mesh_peer_stats; summed over the lanes */
	uint64_t heard_us;                      /* gg_monotonic_us of the last receive; 0: never */
};

/* Everything the node measures, for an operator's dashboard. Times are
 * the lanes' (summed over them), in seconds. */
struct gg_node_metrics {
	struct gg_node_stats stats;
	unsigned sites, self;
	struct gg_node_peer_metrics peers[GG_AR_MAX_SITES]; /* by site index; self's is zero */
	/* Where the steps' time went, per lane part: the site sum, the codecs,
	 * the results into the ranks' memory, and the rest of the time the
	 * part was in progress (waiting for frames and DONEs, TLS, the
	 * kernel), counted when it ends. */
	double gather_s, encode_s, decode_s, deliver_s, wait_s;
	uint64_t stream_failures[GG_MESH_FAILURES];       /* gg_mesh_failure_name() */
	uint64_t step_buckets[GG_NODE_STEP_BUCKETS + 1];  /* completed steps by duration, not cumulative */
	double step_s_sum;
	uint64_t failures_by_code[GG_NODE_CODES];
	uint64_t feedback_bytes;                          /* error-feedback residuals held */
	/* Each stream's TCP connection as the kernel last told its lane (at
	 * most a quarter second ago), by site index and stream number; but
	 * tcp.retransmits counts every connection the stream had. */
	struct gg_node_stream_metrics {
		bool up;
		struct gg_mesh_stream_tcp tcp;
	} streams[GG_AR_MAX_SITES][GG_MESH_MAX_STREAMS];
};

/* A step that failed here, as its ranks were told. */
struct gg_node_failure {
	char job[GG_WIRE_NAME_MAX + 1];
	uint64_t step;
	int code;                 /* enum gg_errc */
	uint64_t at_us;           /* gg_monotonic_us */
	uint64_t at_unix_ms;      /* wall clock */
	char message[GG_NODE_ERROR_MAX];
};

/* The jobs a lane keeps entries of: room for the 32 a gateway runs, or
 * that are about to start (a peer's frames came first), and as many that
 * ended here, kept while their frames may still come; beyond those, an
 * ended job's entry goes to a peer's DATA of a new one (lane_job_find()). */
#define GG_NODE_LANE_JOBS 64

/* Builds the node from a validated config: TLS context, listening socket,
 * the loop, the lanes' threads. Returns 0, or a negative errno with a
 * message in err. Nothing is dialed or accepted before the first
 * gg_node_run_once(), so that what the caller still sets up (the site's
 * control socket, metrics) may fail without peers having seen the site. */
GG_MUST_CHECK int gg_node_new(const struct gg_config *cfg, struct gg_node **out, char *err, size_t err_size);

/* What gg_node_new() needs of this host beyond the file, without starting
 * anything: the credentials load (PEM, the key matches the certificate, the
 * certificate passes its peers' checks), the congestion control exists and
 * the listen address is one of this host's. Returns 0, or a negative errno
 * with err naming the file or setting and the problem, and *at the place of
 * that setting in the file (line 0: a file's problem, or a default's)
 * (gradgate --check-config). */
GG_MUST_CHECK int gg_node_check_host(const struct gg_config *cfg, struct gg_config_pos *at, char *err,
				     size_t err_size);
void gg_node_free(struct gg_node *n);
/* The elements of a chunk under cfg's chunk_size, as its HELLO gives them
 * and peers compare them: chunk_size / 4, down to a multiple of the codecs'
 * block alignment. */
uint32_t gg_node_chunk_elems(const struct gg_config *cfg);

/* The fingerprint that a step's DATA carries (gg_wire_fingerprint()) for
 * ws's identity under cfg's codec settings, sent by `algorithm` in chunks
 * of `chunk_elems`: the block size only of a codec that has blocks, as
 * HELLO and the frames carry it. */
uint64_t gg_node_fingerprint(const struct gg_config *cfg, const struct gg_wire_step *ws, uint8_t algorithm,
			     uint32_t chunk_elems);

/* The node's loop, for other users of it (the site backend). */
struct gg_loop *gg_node_loop(struct gg_node *n);

/* Runs the loop once: waits up to timeout_us for completions, handles
 * them, then timers (reconnects, heartbeats, deadlines). `other` receives
 * completions whose kind is GG_OP_USER or above. Returns 0 or a negative
 * errno when the ring broke. */
typedef void gg_node_cqe_fn(void *arg, const struct io_uring_cqe *cqe);
GG_MUST_CHECK int gg_node_run_once(struct gg_node *n, uint64_t timeout_us, gg_node_cqe_fn *other, void *arg);

/* Starts a step. Returns 0 (done will be called), or a negative errno
 * with err set (done will not be called): -EBUSY when the job already has
 * a step in progress, -EINVAL for a bad step (one of an earlier run of the
 * job's name too), -E2BIG past [limits] max_message, -ENOSPC when every job
 * slot is taken, -ESHUTDOWN once gg_node_stop_steps() was called, -ENOMEM. */
GG_MUST_CHECK int gg_node_submit(struct gg_node *n, struct gg_node_step *step, char *err, size_t err_size);

/* Step `seq` of `job`, not submitted here: when it failed already at
 * another site (which aborted it, or whose ranks of the job are gone), so
 * that gg_node_submit() would fail it at once, it fails here as it would
 * there (counted, logged, and part of the run of failed steps this site's
 * END names), and this returns its enum gg_errc code with the reason the
 * step fails with in `reason`. Otherwise 0, and nothing changes; also
 * while another step of the job is in progress here. */
int gg_node_fail_unstarted(struct gg_node *n, const char *job, uint64_t seq, char *reason, size_t reason_size);
/* Whether a site is lost (nothing heard from it for heartbeat_timeout,
 * this site not just back from standing still): true with `why` saying
 * "site X is unreachable: nothing heard from it for N s (...)". */
bool gg_node_lost_site(struct gg_node *n, char *why, size_t why_size);
/* Whether every later step of `job` fails here for what happened at
 * another site: its run ended there (its ranks left, its gateway
 * restarted or stopped) or refused this one as a new run of the name. */
bool gg_node_job_failed(struct gg_node *n, const char *job);
/* Every step of `job` from `seq` on fails at this site (its ranks here
 * fail them as they come to them): the other sites fail them now, with
 * `code` and `reason`, in their step in progress too, where they have
 * the job (the rest hear the job's END). Only once a step of the run was
 * submitted here; before that the other sites wait for this one's step 1
 * in any case. */
void gg_node_abort_from(struct gg_node *n, const char *job, uint64_t seq, int code, const char *reason);

/* The first rank of `job` connected at this site: a peer's END of a run
 * of the name, or its restart during one, heard before now ends a run the
 * job's ranks here were not part of, and so not this job (once made). */
void gg_node_job_opened(struct gg_node *n, const char *job);

/* Whether the node may free GPU memory (error-feedback residuals, and the
 * lanes' ring scratch beyond their spares) on this thread and the lanes':
 * not while an NCCL call of the gateway's may run on its GPU (cudaFree
 * would wait for it, and a reduce that waits for a rank that left ends
 * only by this thread's abort). What it gives up meanwhile it frees when
 * allowed again (a lane at its next step), or at gg_node_free(). Allowed
 * at the start. */
void gg_node_gpu_frees(struct gg_node *n, bool allowed);

/* This site failed step `seq` of `job` (its ranks disagreed, missed their
 * deadline, or one left) with an enum gg_errc `code`: the step fails at
 * every other site too, with `reason` (in one line: control bytes become
 * '?', as on the wire). The step in progress here, if it is
 * that one, fails now. Returns 0, or -EALREADY when that step's result is
 * whole here and the other sites were told (DONE): they may have completed
 * on it, so it completes or fails as they say, not by this call. */
GG_MUST_CHECK int gg_node_abort(struct gg_node *n, const char *job, uint64_t seq, int code, const char *reason);

/* The job's ranks at this site are gone: the job is over everywhere. The
 * other sites fail its steps (GG_ERR_RANK), and every site forgets it, its
 * error-feedback residuals with it, so the name may start a new run once
 * every site's ranks of the old one are gone. */
void gg_node_end_job(struct gg_node *n, const char *job);
/* The same, saying what took the ranks when it was not their own doing
 * (NULL: nothing more): the other sites' steps of the job then fail
 * naming it. */
void gg_node_end_job_why(struct gg_node *n, const char *job, const char *why);

/* True when every peer has all its streams up. */
bool gg_node_connected(const struct gg_node *n);
/* Peers with no stream up, each as "site X: why" (why its last stream went
 * down, or that it never connected and what this site's [[peers]] dial
 * setting for it leaves to the peer), then those with some streams up but
 * not all ("site X: 1 of 2 streams up": the stream_down lines say why),
 * joined by "; " into buf. Returns how many have no stream up. On lane
 * 0's thread. */
unsigned gg_node_unreachable(const struct gg_node *n, char *buf, size_t size);

/* Reloads certificates and key (SIGHUP); established streams keep theirs. */
GG_MUST_CHECK int gg_node_reload(struct gg_node *n, char *err, size_t err_size);

/* True when every frame sent was acknowledged: a site may finish a step
 * before its own frames reached the others, so a clean stop waits for this
 * (bounded) before gg_node_shutdown(). */
bool gg_node_flushed(const struct gg_node *n);

/* Refuses new steps and fails those in progress, telling the peers (their
 * frames for those steps are then acknowledged at once, so a stop need not
 * wait for them). */
void gg_node_stop_steps(struct gg_node *n);
/* gg_node_stop_steps(), then closes every stream (close_notify). */
void gg_node_shutdown(struct gg_node *n);
/* True once shutdown finished: nothing in flight. */
bool gg_node_idle(const struct gg_node *n);

/* Tests: cuts one stream's TCP connection as a network fault would. */
GG_MUST_CHECK int gg_node_test_cut_stream(struct gg_node *n, unsigned peer, int stream);
/* Tests: lane 0 sends DATA within this site's own inflight_per_peer,
 * whatever the peers' (gg_node_test_send_data() as a peer that ignores
 * their budgets). On lane 0's thread. */
void gg_node_test_own_window(struct gg_node *n);
/* Tests: lane `lane` takes no mail while `hold`, as a lane busy for long
 * would not: what is posted to it waits. Let go before the node stops. */
void gg_node_test_hold_mail(struct gg_node *n, unsigned lane, bool hold);
/* Tests: what waits of `peer`'s messages for other lanes (bytes) and for
 * the coordinator (mails): 0 once every lane and the coordinator took it. */
uint64_t gg_node_test_mail_waiting(const struct gg_node *n, unsigned peer);
/* Tests: the node keeps error feedback for `tensors` tensors at most, not
 * 65536. On the thread that submits steps. */
void gg_node_test_feedback_max(struct gg_node *n, unsigned tensors);
/* Tests: from now on the node stops where a step's result is whole, as a
 * gateway that died at that moment would: no DONE, no completion. */
void gg_node_test_freeze_at_result(struct gg_node *n);
/* Tests: the next DONE this node sends reaches every peer but `peer`, as if
 * every stream to it broke right after it was queued: the peer hears of it
 * only once a stream to it comes back. */
void gg_node_test_drop_done(struct gg_node *n, unsigned peer);
/* Tests: algorithm auto's plan for `job` here becomes "direct up to
 * direct_max elements" (the job must exist here), as a site that forgot the job, or completed a
 * step the others failed, could hold a plan of its own. */
void gg_node_test_set_plan(struct gg_node *n, const char *job, uint64_t direct_max);
/* The chunk (elements) job's latest step here was cut in, and its
 * algorithm; 0: no such job. */
uint32_t gg_node_test_step_chunk(struct gg_node *n, const char *job, enum gg_allreduce_algo *algo);
/* Tests: sends `peer` DATA of `bytes` arbitrary frame bytes for chunk
 * `chunk` of step `step` of `job` (1 float32 element), through lane 0's
 * window, as a peer ahead of this one or one that makes steps up would.
 * On lane 0's thread (the caller of gg_node_run_once). */
GG_MUST_CHECK int gg_node_test_send_data(struct gg_node *n, unsigned peer, const char *job, uint64_t step,
					 uint32_t chunk, size_t bytes);
/* Tests: a stream to `peer` with no socket behind it, on lane 0's mesh
 * (gg_mesh_test_open): the node writes to it through `sent`, and
 * gg_node_test_receive() hands it what the peer sends, which the node
 * handles then and in its next turns. Only for streams lane 0 owns
 * (stream % lanes == 0): -EINVAL for others. */
GG_MUST_CHECK int gg_node_test_open_stream(struct gg_node *n, unsigned peer, unsigned stream, uint64_t instance_id,
					   gg_mesh_test_sent_fn *sent, void *arg);
GG_MUST_CHECK int gg_node_test_receive(struct gg_node *n, unsigned peer, unsigned stream, const uint8_t *bytes,
				       size_t len);

const struct gg_node_stats *gg_node_stats(const struct gg_node *n);
/* A snapshot of every figure, on the node's thread (the caller of
 * gg_node_run_once): counters the lanes publish are read, not locked. */
void gg_node_get_metrics(const struct gg_node *n, struct gg_node_metrics *out);
/* A step this site failed without handing it to the node (the node
 * refused it): counted, kept with those the node failed, and logged
 * (step_failed). */
void gg_node_note_failure(struct gg_node *n, const char *job, uint64_t seq, int code, const char *message);
/* The last failures (at most `max`), newest first; returns how many. */
unsigned gg_node_recent_failures(const struct gg_node *n, struct gg_node_failure *out, unsigned max);
/* Steps failed here since the start. */
uint64_t gg_node_failure_count(const struct gg_node *n);
const char *gg_node_site_name(const struct gg_node *n, unsigned index);
unsigned gg_node_self(const struct gg_node *n);
/* The lanes (threads with a loop each) the node runs: [site] threads, but
 * no more than streams_per_peer. */
unsigned gg_node_lanes(const struct gg_node *n);

#endif
