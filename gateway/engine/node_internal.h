/* The step engine's insides, shared by its three files: node.c (the
 * coordinator: jobs and steps, the commit round, the node's life and its
 * public calls), lane.c (the lanes: each a thread with its own loop, a
 * share of the streams and of every step's chunks) and plan.c (algorithm
 * auto: direct or ring per step, from the links and the timed steps).
 * Nothing outside gateway/engine includes it. */
#ifndef GG_NODE_INTERNAL_H
#define GG_NODE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "allreduce.h"
#include "gg_build_config.h"
#include "log.h"
#include "mailbox.h"
#include "mesh.h"
#include "node.h"
#if HAVE_CUDA
#include "mem_cuda.h"
#endif

#define MAX_JOBS GG_NODE_MAX_JOBS
#define LANE_JOBS GG_NODE_LANE_JOBS
_Static_assert(LANE_JOBS >= 2 * MAX_JOBS, "a lane holds the jobs that run and as many that ended");
#define TIMED_KEPT 4 /* algorithm auto: the latest steps of each algorithm timed */
#define CTRL_MSG_MAX GG_WIRE_CONTROL_MAX
#define POOL_IDLE_US 5000000 /* an idle node gives its cached buffers back after this */
#define TICK_US 100000       /* lanes look at their timers at least this often */
#define ENDS_KEPT 16         /* jobs ended here whose END goes again to a peer that comes back */
#define NAME_RUNS_KEPT 64    /* job names with no ranks here whose peers' runs the coordinator tracks */
#define ABORTS_KEPT 8        /* steps a job remembers that peers aborted before they ran here */
#define STEPS_ON UINT64_MAX  /* an ABORT's last step: every step from its first on (gg_node_abort_from()) */
#define FAILURES_KEPT 16     /* recent step failures, for the status */
#define RERUN_TELL_US 100000 /* a lane tells of step-1 DATA of a job that ran there at most this often */
/* A reason escaped for a log value: step failure reasons may quote a
 * peer's words, quotes included. */
#define LOG_VALUE_MAX GG_ESCAPED_SIZE(GG_NODE_ERROR_MAX)

/* Lines a peer can cause at will with its messages once it holds a site's
 * key (an ABORT or END for each of many names, DATA for many jobs): per
 * peer and kind, twice what the jobs a gateway runs make in a second (an
 * abort and an end each); the rest are counted and said at the second's
 * end (gg_node_peer_logs_flush()), at the kind's level. The coordinator
 * logs the first five kinds, the lanes the other three, each in a table of
 * its own. The slot of this
 * site counts what no peer caused: job_forgotten whatever made the new
 * job, job_ended (local users may open and close sessions at will),
 * early_data_dropped for a step that starts here. */
enum peer_log { LOG_ABORT_RECORDED, LOG_PEER_JOB_ENDED, LOG_RERUN_REFUSED, LOG_JOB_FORGOTTEN, LOG_JOB_ENDED,
		LOG_EARLY_DATA_DROPPED, LOG_DATA_DROPPED, LOG_EARLY_DATA_REFUSED, PEER_LOGS };
#define PEER_LINES (2 * MAX_JOBS)
typedef struct gg_log_limit peer_logs[GG_AR_MAX_SITES][PEER_LOGS];

/* user_data kinds of the two mailboxes a lane's loop reads: below
 * GG_OP_USER, above the mesh's kinds. */
#define KIND_LANE_MAIL 16
#define KIND_COORD_MAIL 17

/* ---- messages between the coordinator and the lanes ----------------------
 *
 * The coordinator (on lane 0's thread) owns jobs and steps: their start,
 * the commit round, deadlines of whole steps, error feedback. Each lane
 * owns a share of the streams and of every step's chunks (a part), and
 * runs both on its own thread and io_uring loop; the two sides talk only
 * through these messages. */

enum mail_type {
	M_START,        /* coordinator -> lane: start your part of a step */
	M_END,          /* coordinator -> lane: the step is over; drop your part */
	M_ENDED,        /* lane -> coordinator: the part is gone, its memory untouched from now on */
	M_PART_DONE,    /* lane -> coordinator: every element of the part is final */
	M_PART_FAILED,  /* lane -> coordinator: the part cannot finish */
	M_SEND,         /* coordinator -> lane: a control message for a peer on the lane's streams */
	M_FORGET,       /* coordinator -> lane: a peer aborted a step that never ran here */
	M_CONTROL,      /* lane -> coordinator: ABORT or DONE from a peer */
	M_RESTARTED,    /* lane -> coordinator: a peer came back with a new instance */
	M_PEER_RUN,     /* lane -> coordinator: a peer's frames of a job came from a later run */
	M_PEER_RESET,   /* coordinator -> lane: a peer restarted; forget its runs, send the DATA held for it */
	M_PEER_RELEASE, /* coordinator -> lane: send the DATA held for a restarted peer (a restart told twice) */
	M_STREAM_READY, /* lane -> coordinator: a stream to a peer is up */
	M_STREAM_DOWN,  /* lane -> coordinator: a stream to a peer went down, and why */
	M_FORGET_JOB,   /* coordinator -> lane: the job ended here, or at a site where it never ran here; forget it */
	M_DATA,         /* lane -> lane: DATA for a chunk of the receiver's */
	M_ACK,          /* lane -> lane: an ACK for DATA the receiver may hold */
	M_ACK_SEND,     /* lane -> lane: acknowledge DATA that came on the receiver's stream */
	M_CLOSE_VIA,    /* lane -> lane: close the receiver's stream the DATA came on (past the peer's budget) */
	M_CONN,         /* acceptor -> lane: an accepted stream of the receiver's */
	M_SHUTDOWN,     /* coordinator -> lane: close every stream */
	M_CUT,          /* tests: cut a stream */
	M_RERUN,        /* lane -> coordinator: a peer sent step 1 of a job whose steps ran here */
};

struct mail {
	struct gg_mail base;
	unsigned slot;        /* the coordinator's job */
	uint64_t seq;
	unsigned peer;
	unsigned via_lane;    /* M_DATA, M_ACK_SEND, M_CLOSE_VIA: the lane whose stream the DATA came on; M_RESTARTED: the lane
			       * that tells */
	struct gg_mesh_via via;
	int code;
	bool forget;          /* M_END: the step failed; unsent DATA of it goes */
	bool charged;         /* posted for a peer's message: counted against its budget until taken
			       * (lane_forward(), coordinator_hears()) */
	uint32_t sites;       /* M_FORGET_JOB: the sites, by bit, whose frames of the job still on the way are
			       * let go when they come (the job ended there or here) */
	uint64_t run;         /* M_FORGET_JOB: the run that ended at the one site in `sites`; 0: it ended
			       * here, and runs[] says which run of each site took part (0: none heard of);
			       * M_PEER_RUN: the peer's run */
	uint64_t runs[GG_AR_MAX_SITES]; /* M_START: each site's runs known over, whose frames the part
					 * never takes (the lane's entry of an ended job may be gone) */
	union {
		struct {      /* M_START */
			struct gg_wire_step wstep;
			const float *input;
			float *result;
			bool device;                 /* input and result on the gateway's GPU */
			struct feedback_slot *feedback; /* NULL: none */
			enum gg_allreduce_algo algo; /* direct or ring */
			uint32_t chunk_elems;        /* the step's chunk */
			uint64_t deadline_us, timeout_us;
			void (*gather)(void *arg, uint64_t offset, uint64_t n);
			void (*deliver)(void *arg, uint64_t offset, uint64_t n);
			void *arg;
			/* Sites, by bit, whose run of the name was never heard of here
			 * when a run of it ended here: their frames of a new run's step
			 * 1 may be of that old run (lane_job.guess). */
			uint32_t guess;
		} start;
		char job[GG_WIRE_NAME_MAX + 1]; /* M_END, M_FORGET, M_FORGET_JOB, M_RERUN */
		struct {      /* M_SEND */
			uint8_t bytes[CTRL_MSG_MAX];
			size_t len;
			bool every_stream;
		} send;
		struct gg_wire_msg msg;         /* M_CONTROL, M_ACK */
		struct {      /* M_DATA */
			struct gg_wire_msg msg;
			struct gg_buf *payload;
		} data;
		struct {      /* M_ACK_SEND */
			char job[GG_WIRE_NAME_MAX + 1];
			uint64_t run;
			struct gg_ar_chunk_id id;
		} ack;
		struct gg_mesh_handoff *conn;   /* M_CONN */
		struct {      /* M_RESTARTED */
			uint64_t instance_id;
			/* Since when no stream to the old instance was up, as the
			 * lane that met the new one saw it (0: one was). */
			uint64_t down_since_us;
		} restarted;
		char text[GG_NODE_ERROR_MAX];   /* M_PART_FAILED, M_STREAM_DOWN */
		int stream;                     /* M_CUT */
	} u;
};

/* ---- lanes ---------------------------------------------------------------- */

/* Streams a kept frame came on, which its ACK takes: copies sent again
 * after a stream was cut may reach this lane out of order (through other
 * lanes' inboxes), so the last to arrive need not be on the stream the
 * sender still watches. Each copy's stream is answered; a dead one drops
 * its ACK. */
#define EARLY_VIAS 4
struct early_via {
	unsigned lane;
	struct gg_mesh_via via;
};

/* What a kept early frame costs besides its bytes (struct early, its
 * share of the lane's index and the allocator's: about 370 bytes a frame
 * in the resident memory of a gateway holding 200,000 empty ones), as the
 * lane's budget counts it: a peer sending empty frames runs into the
 * budget as surely as one sending full ones. */
#define EARLY_ENTRY_BYTES 384u

/* A frame for a step that has not started here yet: the received message,
 * kept as it arrived, or the frame copied where that holds far more
 * memory than the frame. */
struct early {
	struct early *next;
	/* The lane's index of kept frames (early_find()). */
	struct early *hnext, **hprev;
	uint64_t hash;
	uint64_t charge; /* frame_len + EARLY_ENTRY_BYTES, in the lane's early_bytes */
	const struct lane_job *job;
	unsigned from;
	struct early_via vias[EARLY_VIAS]; /* the oldest first */
	unsigned nvias;
	uint64_t seq;
	struct gg_wire_step wstep;
	struct gg_ar_chunk_id id;
	struct gg_buf *msg;   /* the DATA payload the frame lies in, or NULL */
	const uint8_t *frame; /* in msg, or in copy */
	size_t frame_len;
	uint8_t copy[];       /* a small frame, copied out of its message */
};

/* A lane's view of a job: the part of its step in progress, and frames of
 * steps that have not started here. */
struct lane_job {
	struct lane *lane;
	bool used;
	char name[GG_WIRE_NAME_MAX + 1];
	uint64_t last_seq;   /* the last step started or ended here */
	/* Steps after last_seq that a site aborted before they started here:
	 * their DATA, sent on a stream other than the ABORT's and so maybe
	 * after it, is acknowledged and let go at once. */
	uint64_t forgot_lo, forgot_hi;
	/* Sites, by bit, where the job ended (END), or every site when it ended
	 * here, since it last ran here: frames of it they sent before that
	 * and that come after are acknowledged and let go, all but those of
	 * step 1 (a new run there), which also clears the site's bit. A step
	 * starting here clears them all. An entry that holds nothing else is
	 * the first to go when the lane needs one, once the job's frames had
	 * heartbeat_timeout to come (lane_job_find). */
	uint32_t ended_by;
	uint32_t rerun_by;   /* of those, the sites whose step 1 came since: a new run there, whose frames stay */
	/* Each site's runs of the job (their DATA and END say which): the
	 * latest whose frames came, and the latest known over there, that and
	 * every run before it (its END came, or a later run's frames did). A
	 * frame of a run over is acknowledged and let go, whatever its step,
	 * even once a later run started here; where no run is known over,
	 * ended_by's rule stands. */
	uint64_t run_seen[GG_AR_MAX_SITES], run_over[GG_AR_MAX_SITES];
	uint64_t part_run[GG_AR_MAX_SITES]; /* the run each site's frames of the part in progress came from */
	uint64_t guessed_run[GG_AR_MAX_SITES]; /* a run taken for a new one on the step-1 guess (lane_data()) */
	uint32_t guess; /* sites whose first frame of the part is such a guess (the step's start says) */
	uint64_t ended_us;   /* when ended_by was last set (the lane's loop clock) */
	uint64_t rerun_us;   /* when the coordinator last heard of a step 1 again (M_RERUN) */
	/* When a step last started or ended here, or early DATA last came:
	 * the lane's `touches` then, so no two entries tie. */
	uint64_t touched;
	struct early *early;
	/* the part in progress, when ar */
	struct gg_ar_step *ar;
	enum gg_allreduce_algo algo; /* and how it goes */
	unsigned slot;
	uint64_t seq;
	struct gg_wire_step wstep;
	uint64_t deadline_us;
	uint64_t timeout_us; /* the time the step had, for messages */
	bool reported;       /* PART_DONE or PART_FAILED sent */
	bool owed;           /* that report is made, but no memory was left to send it */
	enum mail_type owed_type;
	int owed_code;
	char owed_text[GG_NODE_ERROR_MAX];
	void (*gather)(void *arg, uint64_t offset, uint64_t n);
	void (*deliver)(void *arg, uint64_t offset, uint64_t n);
	void *arg;
	/* Where the part's time goes: the codecs (the step adds to times),
	 * the site sum and the results, and since when it runs; counted for
	 * the lane as they grow (times_counted). */
	struct gg_ar_times times, times_counted;
	uint64_t gather_ns, deliver_ns, start_ns;
#if HAVE_CUDA
	struct gg_ar_mem_cuda gpu; /* a step on the GPU: the lane's stream and staging, the job's residuals */
#endif
};

/* Bytes a lane moved with one peer: counted as frames are sent and taken
 * (raw: the fp32 bytes they carry), and published from its mesh. */
struct lane_peer_stats {
	atomic_uint_fast64_t raw_out, raw_in, data_out, data_in;
	atomic_uint_fast64_t wire_out, wire_in, stream_ups, stream_downs, delivery_bps;
};

struct lane_stats {
	struct lane_peer_stats peers[GG_AR_MAX_SITES];
	atomic_uint_fast64_t gather_ns, encode_ns, decode_ns, deliver_ns, wait_ns;
	atomic_uint_fast64_t stream_failures[GG_MESH_FAILURES];
};

struct lane {
	struct gg_node *node;
	unsigned index;
	pthread_t thread;
	bool has_thread;
	struct gg_loop loop;
	bool loop_ok;
	struct gg_mesh *mesh;
	struct gg_mailbox inbox;
	struct gg_frame_encoder enc;
	struct gg_frame_decoder dec;
#if HAVE_CUDA
	/* Its stream and staging on the gateway's GPU, made by the first
	 * step there. */
	struct gg_ar_mem_cuda gpu;
	bool gpu_ready;
#endif
	struct lane_job jobs[LANE_JOBS];
	uint64_t touches;       /* lane_job.touched so far */
	/* Per coordinator slot, mail the coordinator waits for that no memory
	 * was left to send (lane_timers tries again): the end of step
	 * ended_owed, and the refusal of step refused_owed; 0: none. */
	uint64_t ended_owed[MAX_JOBS];
	uint64_t refused_owed[MAX_JOBS];
	char refused_job[MAX_JOBS][GG_WIRE_NAME_MAX + 1];
	uint64_t next_us;
	uint64_t tcp_next_us; /* when to read its streams' TCP_INFO next */
	uint64_t tcp_ups;     /* its streams' ups at that reading: one more reads at once */
	bool shutting_down;
	struct lane_stats stats;
	atomic_bool flushed, idle;
	/* published by the lane's thread for the coordinator */
	atomic_uint_fast64_t resent, hedged, tls_ns, rtt_us[GG_AR_MAX_SITES], rtt_min_us[GG_AR_MAX_SITES];
	atomic_uint_fast64_t uplink_bps, uplink_at_us; /* the mesh's share of the uplink */
	atomic_uint_fast64_t heard_us[GG_AR_MAX_SITES]; /* last receive from each peer */
	/* Bytes of early frames this lane holds from each peer, each with
	 * EARLY_ENTRY_BYTES (written by the lane only), and frames it let go
	 * past its budget. */
	atomic_uint_fast64_t early_bytes[GG_AR_MAX_SITES], early_refused;
	/* What the mail other lanes posted here for each peer's messages
	 * (DATA and ACKs of this lane's chunks) counts until it is taken
	 * (lane.c's mail_charge()): within early_limit(), like the early
	 * frames. */
	atomic_uint_fast64_t fwd_bytes[GG_AR_MAX_SITES];
	atomic_bool test_hold_mail; /* gg_node_test_hold_mail() */
	/* Its early frames by (job, site, run, step, chunk), to find the copy
	 * of one sent again without a walk of a list that a peer may make
	 * long: 2^early_bits chains, grown with the frames it keeps. */
	struct early **early_index;
	unsigned early_bits;
	size_t early_count;
	atomic_bool denied[GG_AR_MAX_SITES]; /* the peer refused this lane's dial */
	peer_logs logs;
	/* start-up of lanes 1..: made on their own thread */
	int start_rc;
	char start_err[GG_NODE_ERROR_MAX];
};

/* ---- the coordinator ------------------------------------------------------ */

struct job {
	bool used;
	char name[GG_WIRE_NAME_MAX + 1];
	uint64_t run;           /* this site's run of the name (new_run()) */
	uint64_t last_seq;      /* last step started */
	uint64_t active_us;     /* when a step last started or ended */
	uint64_t submit_us;     /* when the step in progress was handed over */
	struct gg_node_step *step; /* in progress, or NULL */
	struct gg_wire_step wstep;
	uint64_t deadline_us;
	uint64_t timeout_us;    /* what set the deadline, for messages */
	unsigned parts_done;
	bool has_result;        /* the step's result is whole here (DONE sent) */
	uint32_t done_from;     /* sites that said DONE for the step, by bit */
	uint64_t has_result_us; /* when it did */
	uint64_t asked_us;      /* when it last asked whether the others completed (ask_completed()) */
	/* Peers this site's DONE of the step may have reached: a stream to
	 * them was up when it went out, or came up (and carried it again)
	 * since. While none is, no other site can have completed the step. */
	uint32_t done_may_reach;
	/* Steps peers aborted before they started here, as runs of steps (a
	 * job broken at a site aborts each step its ranks there announce; a
	 * site back from being cut off hears of every step that failed). */
	struct {
		uint64_t lo, hi; /* lo 0: free */
		int code;
		char reason[GG_NODE_ERROR_MAX];
	} aborted[ABORTS_KEPT];
	/* Algorithm auto: a step of at most using.direct_max elements goes
	 * direct, a larger one by ring, as the first site's DONE of the last
	 * step completed here planned (`using`; direct for all until one did). A
	 * step completes everywhere or nowhere, so every site has the same
	 * plan for every step. `plan`: the one the step in progress brought
	 * (made here at the first site, else from its DONE); `done_plan`: the
	 * one done_seq's DONE carries again. */
	struct gg_wire_plan using, plan, done_plan;
	enum gg_allreduce_algo run_algo; /* of the step in progress or the last one */
	uint32_t run_chunk;              /* and its chunk (elements) */
	enum gg_allreduce_algo algo; /* the last one not a probe, and its elements */
	uint64_t algo_count;
	/* At the first site: each algorithm's latest steps, their sizes and
	 * how long they took, and the step it last ran. */
	struct timed_step {
		uint64_t seq, count;
		double seconds;
	} timed[2][TIMED_KEPT]; /* the latest, oldest first */
	uint64_t timed_seq[2];
	unsigned timed_n[2];    /* steps timed, up to TIMED_KEPT */
	/* At the first site, of each algorithm when it is not the one chosen:
	 * steps from one probe of it to the next (0: PROBE_SOON), and the last
	 * step of it whose time was judged. */
	unsigned probe_every[2];
	uint64_t judged_seq[2];
	uint64_t chosen_seq; /* the first step of the latest choice */
	unsigned warm_steps; /* before the first plan, with the links measured */
	unsigned probe_len; /* steps of the probe in progress */
	double probe_best;  /* and the shortest of them */
	bool algo_told, plan_told; /* a choice was logged, one by a plan */
	uint64_t done_seq;      /* the last step completed here, and when: its DONE */
	uint64_t done_us;       /* goes again to a peer whose stream comes back */
	/* The run of steps that failed here last, one after another (nothing
	 * completed since): a peer whose streams were down when their ABORTs
	 * went out hears of them all once one is back. */
	uint64_t failed_lo, failed_hi, failed_us;
	int failed_code;
	char failed_reason[GG_NODE_ERROR_MAX];
	/* Every step from fail_from on fails here (gg_node_abort_from(), 0:
	 * not so): told again to a peer whose stream comes back. */
	uint64_t fail_from;
	int fail_from_code;
	char fail_from_reason[GG_NODE_ERROR_MAX];
	uint32_t ended_by;      /* sites where the job is over (END), by bit */
	uint64_t ended_done;    /* the last step done there: later ones fail */
	uint64_t ended_last;    /* the last step started there */
	int ended_code;         /* how steps ended_done+1..ended_last failed there */
	char ended_reason[GG_NODE_ERROR_MAX];
	char end_reason[GG_NODE_ERROR_MAX]; /* for steps after ended_last */
	bool rerun_refused;     /* a peer's new run of the name was refused since its last END */
	/* This run's step 1 was refused (a site still runs the old run of
	 * the name): no later step of it can run either, and each fails at
	 * once with this reason. */
	bool refused;
	char refused_reason[GG_NODE_ERROR_MAX];
	/* The step is over and its lanes let go of it. */
	bool ending;
	uint64_t end_told;      /* lanes posted M_END, by bit */
	unsigned ended;
	int end_status;
	char end_message[GG_NODE_ERROR_MAX];
};

/* A job ended here, as its END said it: a peer whose streams were down
 * when it went out may still wait in one of its steps. */
struct ended_job {
	char name[GG_WIRE_NAME_MAX + 1]; /* "": free */
	uint64_t run;
	uint64_t last_step, last_done, us;
	uint64_t ended_us; /* the clock's time at the end itself (us is the loop's turn's), for END's age */
	int code;
	char reason[GG_NODE_ERROR_MAX]; /* the wire carries its first GG_WIRE_REASON_MAX bytes */
};

/* A tensor's residuals: in host memory, or on the gateway's GPU for a
 * tensor the ranks hold there. */
struct feedback_slot {
	char job[GG_WIRE_NAME_MAX + 1];
	uint32_t tensor_id;
	uint64_t elems;
	uint64_t cost; /* what it counts in feedback_bytes: feedback_cost() */
	bool device;
	struct gg_feedback fb;
#if HAVE_CUDA
	struct gg_feedback_cuda gpu;
#endif
	struct feedback_slot *held_next; /* in gg_node.gpu_held */
};

struct gg_node {
	const struct gg_config *cfg;
	unsigned sites, self;
	char names[GG_AR_MAX_SITES][GG_WIRE_NAME_MAX + 1];
	struct gg_wire_hello hello;
	struct gg_tls_context *tls;
	struct gg_resolver *resolver; /* the lanes' dials look up host names here */
	uint32_t chunk_elems;
	struct gg_frame_config frame_cfg;
	struct gg_frame_limits frame_limits;
	size_t max_payload;
	struct gg_buf_pool frames; /* frames sent and messages received, shared by the lanes */
	/* Algorithm auto: the frames of chunks it cuts smaller (powers of two
	 * from GG_AR_AUTO_CHUNK_MIN up to below chunk_elems, largest first),
	 * linked from `frames` as its smaller pools: 2^17..2^23 elements
	 * below the largest chunk_size (64 MiB, 2^24 elements). */
	struct gg_buf_pool frame_classes[7];
	/* lanes[0..nlanes-1] carry the data; lanes[nlanes] is the acceptor,
	 * whose thread runs the handshakes of accepted connections. */
	unsigned nlanes;
	struct lane *lanes;
	/* Streams ready, per peer, by bit: written by the lanes that own them. */
	atomic_uint_fast64_t ready[GG_AR_MAX_SITES];
	/* Mail the lanes posted to the coordinator for each peer's messages
	 * (ABORT, DONE, END, a new run), until it is taken: PEER_MAILS_MAX. */
	atomic_uint_fast32_t peer_mails[GG_AR_MAX_SITES];
	/* Since when (gg_monotonic_us()) no stream to the peer was up; 0 while
	 * one is, or none ever was. Under down_lock, with the change of ready
	 * that makes it so: lanes' streams go up and down in any order. */
	pthread_mutex_t down_lock;
	uint64_t down_since_us[GG_AR_MAX_SITES];
	/* Each stream's TCP figures, written by the lane that owns it. */
	struct stream_tcp {
		atomic_bool up;
		atomic_uint_fast64_t rtt_us, rttvar_us, cwnd_bytes, delivery_bytes_per_s, retransmits, unsent_bytes,
			send_buffer_bytes, receive_buffer_bytes;
		/* The owning lane's: retransmits counts every connection the
		 * stream had, the last seen up to its last sample. */
		uint64_t connection, retransmits_before, retransmits_now;
	} tcp[GG_AR_MAX_SITES][GG_MESH_MAX_STREAMS];
	uint64_t all_streams;
	/* coordinator, on lane 0's thread */
	struct gg_mailbox inbox;
	struct job jobs[MAX_JOBS];
	/* Every site's links as its last DONE said (this site's own as sent). */
	struct gg_wire_links links[GG_AR_MAX_SITES];
	struct ended_job ended[ENDS_KEPT];
	unsigned ended_next;
	/* What the coordinator knows of the peers' runs of each job name, for
	 * their DONE, ABORT and END (peer_run_stale()), over the runs here. */
	struct name_runs {
		char job[GG_WIRE_NAME_MAX + 1]; /* "": free */
		uint64_t used_us;
		uint64_t seen[GG_AR_MAX_SITES]; /* the latest run heard of (0: none) */
		uint64_t over[GG_AR_MAX_SITES]; /* runs up to this one are over there: its END, or a later run came */
		uint64_t left[GG_AR_MAX_SITES]; /* runs up to this one took part in a run that ended here */
		bool ended_here; /* a run of the name ended here (left[] says which peers' runs were known) */
		/* Ranks of the name are connected here (gg_node_job_opened(),
		 * until gg_node_end_job_why()). What ended a peer's run of it
		 * meanwhile while no job of it was in the core (none of them had
		 * announced a step): the sites whose gateway restarted during
		 * their run (lost_by), and the END of a site's run with the
		 * fewest steps done (end_from: that site + 1, 0: none). The job,
		 * once made here, is over there as if they came after it was
		 * made. Ranks that connect after such an END or restart are of a
		 * new run: nothing is kept for them while the name is not open. */
		bool open;
		uint64_t opened_us; /* since when, by the clock (not a loop's turn's time) */
		uint32_t lost_by;
		unsigned end_from;
		struct gg_wire_steps end;
		/* The same for an ABORT of a peer's run of the name not over
		 * here, while the name's job here is over and its new ranks are
		 * yet to announce their first step (the site that sent it + 1,
		 * 0: none): the job, once made, fails those steps. */
		unsigned abort_from;
		struct gg_wire_steps abort;
	} *name_runs;
	/* NAME_RUNS_KEPT, and one for each name whose ranks may be here (at
	 * most max_clients): a record of those is never taken for another. */
	unsigned name_runs_cap;
	uint64_t next_run; /* the run id the next job started here gets */
	uint64_t instance_id[GG_AR_MAX_SITES]; /* the peers' as last reported */
	/* The last two instances of each peer that others replaced, and the
	 * returns of such ones: how many since the first of a run of them,
	 * and when that one and the last came (peer_instance_changed()). */
	uint64_t replaced[GG_AR_MAX_SITES][2];
	unsigned returns[GG_AR_MAX_SITES];
	uint64_t return_first_us[GG_AR_MAX_SITES], return_last_us[GG_AR_MAX_SITES];
	uint64_t twin_us[GG_AR_MAX_SITES], twin_logged_us[GG_AR_MAX_SITES];
	/* Why a peer's last stream went down: written by the coordinator,
	 * read by any lane (gg_node_down_reason()), under down_lock. */
	char down_reason[GG_AR_MAX_SITES][GG_NODE_ERROR_MAX / 2];
	atomic_bool ever_up[GG_AR_MAX_SITES]; /* a stream to the peer was ready once (for the metrics' readers) */
	/* Error feedback, one slot per (job, tensor), each allocated on its own
	 * (steps hold pointers to them); residuals bounded by [limits] memory. */
	struct feedback_slot **feedback;
	unsigned feedback_count, feedback_cap;
	unsigned feedback_max;   /* slots at most: FEEDBACK_TENSORS_MAX but in tests */
	uint64_t feedback_bytes; /* those of gpu_held too */
	/* Slots with residuals on the GPU, dropped while the backend holds GPU
	 * frees back (an NCCL call of the gateway's may run there): freed once
	 * it lets them go (gg_node_gpu_frees()). */
	struct feedback_slot *gpu_held;
	atomic_bool gpu_frees_held; /* the lanes' ring scratch waits too (gg_ar_mem_cuda.frees_held) */
	struct gg_node_stats stats;
	/* The coordinator's figures: completed steps' durations and the
	 * failures, counted and the last FAILURES_KEPT kept. */
	uint64_t step_buckets[GG_NODE_STEP_BUCKETS + 1]; /* the last: above every bound */
	uint64_t step_us_sum;
	uint64_t failures_by_code[GG_NODE_CODES];
	struct gg_node_failure failures[FAILURES_KEPT];
	uint64_t failures_total;
	peer_logs logs;            /* the coordinator's */
	uint64_t coord_next_us;    /* the coordinator's next deadline */
	uint64_t coord_done_boot_us; /* when it last finished a turn, by CLOCK_BOOTTIME, */
	uint64_t coord_done_cpu_us;  /* and its thread's CPU time then */
	/* When this site last found it had stood still, and for how long: no
	 * site counts as lost for heartbeat_timeout after. */
	uint64_t stall_end_us, stall_us;
	bool shutting_down;
	bool closing;               /* gg_node_shutdown(): lanes close their streams */
	uint64_t close_told;        /* lanes posted M_SHUTDOWN, by bit */
	bool acceptor_told;         /* and the acceptor */
	bool test_freeze_at_result; /* gg_node_test_freeze_at_result() */
	unsigned test_drop_done;    /* gg_node_test_drop_done(): that peer + 1, or 0 */
	atomic_bool lanes_stop, acceptor_stop;
	atomic_int acceptor_failed; /* the acceptor's loop broke: its negative errno */
	pthread_mutex_t start_lock;
	pthread_cond_t started;  /* a lane's thread made its ring, or failed to */
	pthread_cond_t let_go;   /* released or a stop flag was set */
	unsigned lanes_starting;
	bool released;           /* under start_lock: the lanes may dial and accept */
};


/* ---- small helpers of both sides ------------------------------------------ */

static inline uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void count(atomic_uint_fast64_t *c, uint64_t v)
{
	atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}

static inline uint64_t load(const atomic_uint_fast64_t *c)
{
	return atomic_load_explicit(c, memory_order_relaxed);
}

static inline void publish(atomic_uint_fast64_t *dst, uint64_t v)
{
	atomic_store_explicit(dst, v, memory_order_relaxed);
}

/* Whether `peer` refused the last dial of any lane with access_denied (its
 * dial for this site is "out"). */
static inline bool peer_refuses_dials(const struct gg_node *n, unsigned peer)
{
	for (unsigned l = 0; l < n->nlanes; l++)
		if (atomic_load_explicit(&n->lanes[l].denied[peer], memory_order_relaxed))
			return true;
	return false;
}

static inline struct mail *mail_new(enum mail_type type)
{
	struct mail *m = calloc(1, sizeof(*m));

	if (m)
		m->base.type = type;
	return m;
}

static inline void post(struct gg_mailbox *box, struct mail *m)
{
	gg_mailbox_post(box, &m->base);
}

static inline void tell_coordinator(struct lane *ln, struct mail *m)
{
	post(&ln->node->inbox, m);
}

static inline unsigned chunk_lane(const struct gg_node *n, const struct gg_ar_chunk_id *id)
{
	return id->chunk % n->nlanes;
}

/* What a lane keeps of a peer's frames for steps not started here, each
 * with EARLY_ENTRY_BYTES, and of the mail other lanes post it for that
 * peer's messages (each its own budget): half as much again as the
 * window, and a frame on every stream. A peer that keeps to the window
 * stays within both. */
static inline uint64_t early_limit(const struct gg_node *n)
{
	const uint64_t window = n->cfg->limits.inflight_bytes_per_peer;

	return window + window / 2 + (uint64_t)n->cfg->transport.streams_per_peer * (n->max_payload + EARLY_ENTRY_BYTES);
}

/* A peer's ABORT, DONE and END (up to one a stream for every step of every
 * job) and new runs that wait for the coordinator, about 20 MB of mail:
 * far past what jobs make, and a bound for a peer that sends them faster
 * than the coordinator takes them. */
#define PEER_MAILS_MAX 16384u

static inline bool peer_log_now(peer_logs logs, unsigned site, enum peer_log kind, uint64_t now_us)
{
	return gg_log_limit_now(&logs[site][kind], now_us, PEER_LINES);
}

/* Whether run a of a site's comes after its run b (wrapping, as run ids
 * count up from the sender's clock). */
static inline bool run_is_later(uint64_t a, uint64_t b)
{
	return (int64_t)(a - b) > 0;
}

/* Whether run is `upto` or an earlier one (upto 0: none known). */
static inline bool run_within(uint64_t run, uint64_t upto)
{
	return upto && !run_is_later(run, upto);
}

/* Raises *known to run, as run ids of a site only grow; whether it did. */
static inline bool run_raise(uint64_t *known, uint64_t run)
{
	if (!run || run_within(run, *known))
		return false;
	*known = run;
	return true;
}

/* ---- node.c: the coordinator's, for the lanes ----------------------------- */

/* Says what a table of peer_logs held back, once its second is over;
 * returns when to look again. */
uint64_t gg_node_peer_logs_flush(const struct gg_node *n, peer_logs logs, uint64_t now_us);
/* " (no connection to site X, site Y)" for peers with no stream up but
 * `except` (n->sites: none), or "". */
void gg_node_unreachable_note(const struct gg_node *n, unsigned except, char *buf, size_t size);
/* Why `peer` has no stream up (the last stream's or dial's reason, or what
 * the dial settings leave to it), in buf, which it returns; from any
 * thread. */
const char *gg_node_down_reason(const struct gg_node *n, unsigned peer, char *buf, size_t size);

/* ---- lane.c --------------------------------------------------------------- */

/* What a turn of a lane's loop saw besides the mesh's completions. */
struct cqe_ctx {
	struct lane *ln;
	gg_node_cqe_fn *other;
	void *arg;
	bool lane_mail, coord_mail;
};

/* A lane's thread name, as ps -T and /proc/PID/task/TID/comm show it. */
const char *gg_lane_name(const struct gg_node *n, unsigned l, char name[16]);
/* Makes the lane's loop, mesh and codecs, on the thread that runs it.
 * Returns 0 or a negative errno with ln->start_err set. */
int gg_lane_init(struct lane *ln);
void gg_lane_fini(struct lane *ln);
/* The thread of lanes 1.. and of the acceptor. */
void *gg_lane_main(void *arg);
/* One turn of a lane's loop. Returns 0 or a negative errno (the ring broke). */
int gg_lane_turn(struct lane *ln, uint64_t max_wait_us, struct cqe_ctx *x);
/* Handles the mail in the lane's inbox. */
void gg_lane_mail(struct lane *ln);

/* ---- plan.c: algorithm auto ------------------------------------------------ */

void gg_plan_measure_links(struct gg_node *n);
void gg_plan_time_step(struct gg_node *n, struct job *j);
void gg_plan_make(struct gg_node *n, struct job *j);
enum gg_allreduce_algo gg_plan_step_algo(const struct gg_node *n, const struct job *j, uint64_t count);
uint32_t gg_plan_step_chunk(const struct gg_node *n, enum gg_allreduce_algo algo, uint64_t count);
void gg_plan_note_algo(struct gg_node *n, struct job *j, const struct gg_node_step *st, enum gg_allreduce_algo algo,
		       uint32_t chunk);

#endif
