#include "node.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "allreduce.h"
#include "gg_build_config.h"
#include "gradgate.h"
#include "log.h"
#include "mailbox.h"
#include "mesh.h"
#include "net_addr.h"
#include "resolver.h"
#include "units.h"
#if HAVE_CUDA
#include "mem_cuda.h"
#endif

#define MAX_JOBS 32
#define LANE_JOBS GG_NODE_LANE_JOBS
_Static_assert(LANE_JOBS >= 2 * MAX_JOBS, "a lane holds the jobs that run and as many that ended");
#define TIMED_KEPT 4 /* algorithm auto: the latest steps of each algorithm timed */
#define CTRL_MSG_MAX 1024    /* every message but DATA fits */
#define POOL_IDLE_US 5000000 /* an idle node gives its cached buffers back after this */
#define TICK_US 100000       /* lanes look at their timers at least this often */
#define ENDS_KEPT 16         /* jobs ended here whose END goes again to a peer that comes back */
#define NAME_RUNS_KEPT 64    /* job names with no ranks here whose peers' runs the coordinator tracks */
#define ABORTS_KEPT 8        /* steps a job remembers that peers aborted before they ran here */
#define FAILURES_KEPT 16     /* recent step failures, for the status */
#define RERUN_TELL_US 100000 /* a lane tells of step-1 DATA of a job that ran there at most this often */
/* A reason escaped for a log value: step failure reasons may quote a
 * peer's words, quotes included. */
#define LOG_VALUE_MAX GG_ESCAPED_SIZE(GG_NODE_ERROR_MAX)

/* Lines a peer can cause at will with its messages once it holds a site's
 * key (an ABORT or END for each of many names, DATA for many jobs): per
 * peer and kind, twice what the jobs a gateway runs make in a second (an
 * abort and an end each); the rest are counted and said at the second's
 * end (peer_logs_flush()). The coordinator logs the first five kinds,
 * the lanes the other two, each in a table of its own. The slot of this
 * site counts what no peer caused: job_forgotten whatever made the new
 * job, job_ended (local users may open and close sessions at will),
 * early_data_dropped for a step that starts here. */
enum peer_log { LOG_ABORT_RECORDED, LOG_PEER_JOB_ENDED, LOG_RERUN_REFUSED, LOG_JOB_FORGOTTEN, LOG_JOB_ENDED,
		LOG_EARLY_DATA_DROPPED, LOG_DATA_DROPPED, PEER_LOGS };
static const char *const peer_log_events[PEER_LOGS] = { "abort_recorded", "peer_job_ended",     "rerun_refused",
							"job_forgotten",  "job_ended",          "early_data_dropped",
							"data_dropped" };
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
	M_PEER_RESET,   /* coordinator -> lane: a peer restarted; forget its runs */
	M_STREAM_READY, /* lane -> coordinator: a stream to a peer is up */
	M_STREAM_DOWN,  /* lane -> coordinator: a stream to a peer went down, and why */
	M_FORGET_JOB,   /* coordinator -> lane: the job ended here, or at a site where it never ran here; forget it */
	M_DATA,         /* lane -> lane: DATA for a chunk of the receiver's */
	M_ACK,          /* lane -> lane: an ACK for DATA the receiver may hold */
	M_ACK_SEND,     /* lane -> lane: acknowledge DATA that came on the receiver's stream */
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
	unsigned via_lane;    /* M_DATA, M_ACK_SEND: the lane whose stream the DATA came on */
	struct gg_mesh_via via;
	int code;
	bool forget;          /* M_END: the step failed; unsent DATA of it goes */
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
		uint64_t instance_id;           /* M_RESTARTED */
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

/* A frame for a step that has not started here yet: the received message,
 * kept as it arrived. */
struct early {
	struct early *next;
	unsigned from;
	struct early_via vias[EARLY_VIAS]; /* the oldest first */
	unsigned nvias;
	uint64_t seq;
	struct gg_wire_step wstep;
	struct gg_ar_chunk_id id;
	struct gg_buf *msg;   /* the DATA payload the frame lies in */
	const uint8_t *frame;
	size_t frame_len;
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
	bool shutting_down;
	struct lane_stats stats;
	atomic_bool flushed, idle;
	/* published by the lane's thread for the coordinator */
	atomic_uint_fast64_t resent, hedged, tls_ns, rtt_us[GG_AR_MAX_SITES], rtt_min_us[GG_AR_MAX_SITES];
	atomic_uint_fast64_t uplink_bps, uplink_at_us; /* the mesh's share of the uplink */
	atomic_uint_fast64_t heard_us[GG_AR_MAX_SITES]; /* last receive from each peer */
	/* Bytes of early frames this lane holds from each peer (written by
	 * the lane only), and frames it let go past its budget. */
	atomic_uint_fast64_t early_bytes[GG_AR_MAX_SITES], early_refused;
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
	uint32_t ended_by;      /* sites where the job is over (END), by bit */
	uint64_t ended_done;    /* the last step done there: later ones fail */
	uint64_t ended_last;    /* the last step started there */
	int ended_code;         /* how steps ended_done+1..ended_last failed there */
	char ended_reason[GG_NODE_ERROR_MAX];
	char end_reason[GG_NODE_ERROR_MAX]; /* for steps after ended_last */
	bool rerun_refused;     /* a peer's new run of the name was refused since its last END */
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
	char down_reason[GG_AR_MAX_SITES][GG_NODE_ERROR_MAX / 2]; /* why a peer's last stream went down */
	atomic_bool ever_up[GG_AR_MAX_SITES]; /* a stream to the peer was ready once (for the metrics' readers) */
	/* Error feedback, one slot per (job, tensor), each allocated on its own
	 * (steps hold pointers to them); residuals bounded by [limits] memory. */
	struct feedback_slot **feedback;
	unsigned feedback_count, feedback_cap;
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
	pthread_cond_t started;
	unsigned lanes_starting;
};

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void count(atomic_uint_fast64_t *c, uint64_t v)
{
	atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}

const char *gg_node_site_name(const struct gg_node *n, unsigned index)
{
	return index < n->sites ? n->names[index] : "?";
}

unsigned gg_node_self(const struct gg_node *n)
{
	return n->self;
}

unsigned gg_node_lanes(const struct gg_node *n)
{
	return n->nlanes;
}

struct gg_loop *gg_node_loop(struct gg_node *n)
{
	return &n->lanes[0].loop;
}

static struct mail *mail_new(enum mail_type type)
{
	struct mail *m = calloc(1, sizeof(*m));

	if (m)
		m->base.type = type;
	return m;
}

static void post(struct gg_mailbox *box, struct mail *m)
{
	gg_mailbox_post(box, &m->base);
}

static uint64_t all_lanes(const struct gg_node *n)
{
	return n->nlanes >= 64 ? UINT64_MAX : ((uint64_t)1 << n->nlanes) - 1;
}

/* Posts a copy of `proto` to every lane not in `told` (by bit) and returns
 * the lanes told now or before. Mail a step cannot end without (its start
 * and end, a part's report and its end's answer) is posted again until it
 * goes: a step never waits for mail that memory ran out for. Losing other
 * mail costs a resend or a deadline, and is logged. */
static uint64_t post_lanes(struct gg_node *n, const struct mail *proto, uint64_t told)
{
	for (unsigned l = 0; l < n->nlanes; l++) {
		if (told & ((uint64_t)1 << l))
			continue;
		struct mail *m = mail_new(proto->base.type);
		if (!m) {
			gg_log(GG_LOG_ERROR, "out_of_memory", "what=\"a message to lane %u\"", l);
			continue;
		}
		*m = *proto;
		post(&n->lanes[l].inbox, m);
		told |= (uint64_t)1 << l;
	}
	return told;
}

static void tell_coordinator(struct lane *ln, struct mail *m)
{
	post(&ln->node->inbox, m);
}

static unsigned chunk_lane(const struct gg_node *n, const struct gg_ar_chunk_id *id)
{
	return id->chunk % n->nlanes;
}

/* ---- a lane's parts of steps ---------------------------------------------- */

static void early_free(struct lane *ln, struct early *e)
{
	atomic_fetch_sub_explicit(&ln->early_bytes[e->from], e->frame_len, memory_order_relaxed);
	gg_buf_put(e->msg);
	free(e);
}

/* Lets go of a never-started job's early frames without acknowledging
 * them: their sender keeps them, counted in its window. */
static void lane_job_clear(struct lane_job *lj)
{
	while (lj->early) {
		struct early *e = lj->early;
		lj->early = e->next;
		early_free(lj->lane, e);
	}
	memset(lj, 0, sizeof(*lj));
}

/* True when every early frame of lj came from `from`. */
static bool early_only_from(const struct lane_job *lj, unsigned from)
{
	for (const struct early *e = lj->early; e; e = e->next)
		if (e->from != from)
			return false;
	return true;
}

/* lane_job_find()'s `from` for an entry that takes only a free or idle
 * slot, never one holding early frames; and for one that takes only a
 * free slot. */
#define LANE_JOB_NO_EVICT (-2)
#define LANE_JOB_FREE_ONLY (-3)

/* An entry kept only to let go of an ended job's frames (ended_by). */
static bool tombstone(const struct lane_job *lj)
{
	return lj->ended_by && !lj->ar && !lj->early;
}

/* One whose job's frames may still be on the way. */
static bool tombstone_young(const struct lane_job *lj)
{
	return tombstone(lj) && lj->lane->loop.now_us - lj->ended_us < lj->lane->node->cfg->transport.heartbeat_timeout_us;
}

static bool peer_log_now(peer_logs logs, unsigned site, enum peer_log kind, uint64_t now_us)
{
	return gg_log_limit_now(&logs[site][kind], now_us, PEER_LINES);
}

/* Says what a table held back, once its second is over; returns when to
 * look again. */
static uint64_t peer_logs_flush(const struct gg_node *n, peer_logs logs, uint64_t now_us)
{
	uint64_t next = UINT64_MAX;

	for (unsigned p = 0; p < n->sites; p++) {
		char about[GG_WIRE_NAME_MAX + 8] = "";
		if (p != n->self)
			snprintf(about, sizeof(about), "site=%s", n->names[p]);
		for (unsigned k = 0; k < PEER_LOGS; k++)
			next = GG_MIN(next,
				      gg_log_limit_flush(&logs[p][k], now_us, GG_LOG_WARN, peer_log_events[k], about));
	}
	return next;
}

/* The entry of job `name`, or with `create` a new one for it. `from` is the
 * peer whose DATA asks for it, -1 for a step that starts here, or
 * LANE_JOB_NO_EVICT or LANE_JOB_FREE_ONLY. */
static struct lane_job *lane_job_find(struct lane *ln, const char *name, bool create, int from)
{
	struct lane_job *free_slot = NULL;

	for (unsigned i = 0; i < LANE_JOBS; i++) {
		struct lane_job *lj = &ln->jobs[i];
		if (lj->used && !strcmp(lj->name, name))
			return lj;
		if (!lj->used && !free_slot)
			free_slot = lj;
	}
	if (!create)
		return NULL;
	if (!free_slot) {
		/* An ended job's entry first, the oldest, once the frames still
		 * on the way had heartbeat_timeout to come (a stream that holds
		 * them longer is lost, and they with it). */
		for (unsigned i = 0; i < LANE_JOBS; i++) {
			struct lane_job *lj = &ln->jobs[i];
			if (tombstone(lj) && !tombstone_young(lj) && (!free_slot || lj->touched < free_slot->touched))
				free_slot = lj;
		}
	}
	if (!free_slot && from == LANE_JOB_FREE_ONLY)
		return NULL;
	if (!free_slot) {
		/* A lane learns of no job's end: it takes back the entry idle
		 * longest, which holds no part and no early frames; an ended
		 * job's whose frames may still come only for a step starting
		 * here, not for a peer's DATA (a burst of other jobs' frames
		 * would otherwise make room for the ended job's), unless ended
		 * jobs hold more than their half of the entries: a peer's DATA
		 * of a job about to start here must not be dropped for them. */
		unsigned ended = 0;
		for (unsigned i = 0; i < LANE_JOBS && from >= 0; i++)
			ended += tombstone(&ln->jobs[i]);
		const bool take_young = from == -1 || ended > LANE_JOBS - MAX_JOBS;
		for (unsigned i = 0; i < LANE_JOBS; i++) {
			struct lane_job *lj = &ln->jobs[i];
			if (!lj->ar && !lj->early && (take_young || !tombstone_young(lj)) &&
			    (!free_slot || lj->touched < free_slot->touched))
				free_slot = lj;
		}
		/* Then a job that never started here and holds only early
		 * frames: a peer could otherwise fill the table with jobs that
		 * never come, and lock every real one out. A step starting here
		 * takes the one whose DATA stopped longest ago; a peer's DATA
		 * only such a one of its own. */
		for (unsigned i = 0; i < LANE_JOBS && !free_slot && from != LANE_JOB_NO_EVICT; i++) {
			struct lane_job *lj = &ln->jobs[i];
			if (lj->ar || lj->last_seq || (from >= 0 && !early_only_from(lj, (unsigned)from)))
				continue;
			if (!free_slot || lj->touched < free_slot->touched)
				free_slot = lj;
		}
		if (!free_slot)
			return NULL;
		if (free_slot->early && peer_log_now(ln->logs, from >= 0 ? (unsigned)from : ln->node->self,
						     LOG_EARLY_DATA_DROPPED, ln->loop.now_us))
			gg_log(GG_LOG_WARN, "early_data_dropped", "job=%s reason=\"its slot went to job %s: it never "
			       "started here\"", free_slot->name, name);
		lane_job_clear(free_slot);
	}
	memset(free_slot, 0, sizeof(*free_slot));
	free_slot->lane = ln;
	free_slot->used = true;
	free_slot->touched = ++ln->touches;
	snprintf(free_slot->name, sizeof(free_slot->name), "%s", name);
	return free_slot;
}

/* The part's one report: the first made, sent as soon as there is memory
 * for it (lane_timers tries again). */
static void part_report(struct lane_job *lj, enum mail_type type, int code, const char *text)
{
	struct mail *m;

	if (lj->reported)
		return;
	if (!lj->owed) {
		lj->owed = true;
		lj->owed_type = type;
		lj->owed_code = code;
		snprintf(lj->owed_text, sizeof(lj->owed_text), "%s", text ? text : "");
	}
	if (!(m = mail_new(lj->owed_type)))
		return;
	lj->reported = true;
	lj->owed = false;
	m->slot = lj->slot;
	m->seq = lj->seq;
	m->code = lj->owed_code;
	memcpy(m->u.text, lj->owed_text, sizeof(m->u.text));
	tell_coordinator(lj->lane, m);
}

/* Mail for the coordinator about step `seq` in its slot `slot`; false
 * when there was no memory for it. */
static bool tell_slot(struct lane *ln, enum mail_type type, unsigned slot, uint64_t seq, int code, const char *text)
{
	struct mail *m = mail_new(type);

	if (!m) {
		gg_log(GG_LOG_ERROR, "out_of_memory", "what=\"a message from lane %u\" retry=true", ln->index);
		return false;
	}
	m->slot = slot;
	m->seq = seq;
	m->code = code;
	if (text)
		snprintf(m->u.text, sizeof(m->u.text), "%s", text);
	tell_coordinator(ln, m);
	return true;
}

/* A lane refuses a step when it has no room for the job. */
static void lane_refuse(struct lane *ln, unsigned slot, uint64_t seq, const char *job)
{
	char text[GG_NODE_ERROR_MAX];

	if (job != ln->refused_job[slot])
		snprintf(ln->refused_job[slot], sizeof(ln->refused_job[slot]), "%s", job);
	snprintf(text, sizeof(text), "step %llu of job '%s': lane %u holds %d jobs already (running, or with frames "
		 "of their next step)", (unsigned long long)seq, job, ln->index, LANE_JOBS);
	ln->refused_owed[slot] = tell_slot(ln, M_PART_FAILED, slot, seq, GG_ERR_LIMIT, text) ? 0 : seq;
}

GG_PRINTF(3, 4) static void part_fail(struct lane_job *lj, int code, const char *fmt, ...)
{
	char text[GG_NODE_ERROR_MAX];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	part_report(lj, M_PART_FAILED, code, text);
}

static void part_check_done(struct lane_job *lj)
{
	if (lj->ar && gg_ar_step_done(lj->ar))
		part_report(lj, M_PART_DONE, 0, NULL);
}

/* The element count in a frame's header (frame.h: bytes 8-15,
 * little-endian), of a frame made here or decoded already. */
static uint64_t frame_elems(const uint8_t *frame)
{
	uint64_t elems = 0;

	for (int b = 7; b >= 0; b--)
		elems = elems << 8 | frame[8 + b];
	return elems;
}

/* What the part's codecs spent since the last call, counted for the lane. */
static void part_count_times(struct lane_job *lj)
{
	struct lane_stats *st = &lj->lane->stats;

	count(&st->encode_ns, lj->times.encode_ns - lj->times_counted.encode_ns);
	count(&st->decode_ns, lj->times.decode_ns - lj->times_counted.decode_ns);
	lj->times_counted = lj->times;
}

/* The part is over: the time it was in progress and not at work on its
 * chunks went to waiting (frames, DONEs, TLS, the kernel). */
static void part_free(struct lane_job *lj)
{
	if (!lj->ar)
		return;
	part_count_times(lj);
	uint64_t busy = lj->times.encode_ns + lj->times.decode_ns + lj->gather_ns + lj->deliver_ns;
	uint64_t spent = now_ns() - lj->start_ns;
	count(&lj->lane->stats.wait_ns, spent > busy ? spent - busy : 0);
	gg_ar_step_free(lj->ar);
	lj->ar = NULL;
}

/* The step engine's send: DATA for one peer, queued behind the window. */
static int ar_send(void *ctx, unsigned to, const struct gg_ar_chunk_id *id, struct gg_buf *frame)
{
	struct lane_job *lj = ctx;
	struct lane *ln = lj->lane;

	return gg_mesh_send_data(ln->mesh, to, &lj->wstep, id, frame, frame_elems(frame->data) * sizeof(float));
}

/* A part may encode another chunk of its own while no peer has more than
 * two chunks per stream of the lane queued ahead of its sockets: enough to
 * keep every stream busy, few enough that encoding keeps pace with the
 * network and few frames are alive at once. */
static bool ar_may_encode(void *ctx)
{
	const struct lane_job *lj = ctx;
	const struct lane *ln = lj->lane;
	const struct gg_node *n = ln->node;
	const unsigned S = (unsigned)n->cfg->transport.streams_per_peer;
	const unsigned own = (S + n->nlanes - 1 - ln->index) / n->nlanes;
	const unsigned limit = 2u * GG_MAX(own, 1u);

	for (unsigned p = 0; p < n->sites; p++)
		if (p != n->self && gg_mesh_queued(ln->mesh, p, limit) >= limit)
			return false;
	return true;
}

/* Calls the owner's gather or deliver, adding its time to the part's and
 * the lane's. */
static void timed_call(void (*fn)(void *, uint64_t, uint64_t), void *arg, uint64_t offset, uint64_t n,
		       uint64_t *part_ns, atomic_uint_fast64_t *lane_ns)
{
	if (!fn)
		return;
	uint64_t t0 = now_ns();
	fn(arg, offset, n);
	uint64_t dt = now_ns() - t0;
	*part_ns += dt;
	count(lane_ns, dt);
}

static void ar_gather(void *ctx, uint64_t offset, uint64_t n)
{
	struct lane_job *lj = ctx;

	timed_call(lj->gather, lj->arg, offset, n, &lj->gather_ns, &lj->lane->stats.gather_ns);
}

static void ar_deliver(void *ctx, uint64_t offset, uint64_t n)
{
	struct lane_job *lj = ctx;

	timed_call(lj->deliver, lj->arg, offset, n, &lj->deliver_ns, &lj->lane->stats.deliver_ns);
}

static const struct gg_ar_ops ar_ops = { ar_send, ar_may_encode, ar_gather, ar_deliver };

/* Acknowledges DATA on the stream it came on, which may be another lane's. */
static void lane_ack(struct lane *ln, unsigned via_lane, struct gg_mesh_via via, const char *job, uint64_t run,
		     uint64_t seq, const struct gg_ar_chunk_id *id)
{
	struct mail *m;

	if (via_lane == ln->index) {
		gg_mesh_ack(ln->mesh, via, job, run, seq, id);
		return;
	}
	if (!(m = mail_new(M_ACK_SEND)))
		return; /* unacknowledged: the peer sends it again after its next reconnect */
	m->via = via;
	m->seq = seq;
	snprintf(m->u.ack.job, sizeof(m->u.ack.job), "%s", job);
	m->u.ack.run = run;
	m->u.ack.id = *id;
	post(&ln->node->lanes[via_lane].inbox, m);
}

static const char *wire_dtype_name(uint8_t dtype)
{
	return dtype == GG_WIRE_F32 ? "float32" : dtype == GG_WIRE_BF16 ? "bfloat16" : "unknown";
}

/* Hands the part a frame of its step; acknowledged once used. */
static void part_feed(struct lane_job *lj, unsigned from, unsigned via_lane, struct gg_mesh_via via,
		      const struct gg_wire_step *ws, const struct gg_ar_chunk_id *id, const uint8_t *frame, size_t len)
{
	struct lane *ln = lj->lane;
	const struct gg_node *n = ln->node;
	char err[GG_AR_ERROR_MAX];

	lane_ack(ln, via_lane, via, lj->name, ws->run, ws->step, id);
	if (lj->reported && !gg_ar_step_done(lj->ar))
		return; /* failed already */
	if (lj->part_run[from] && ws->run != lj->part_run[from] && lj->part_run[from] == lj->guessed_run[from]) {
		/* lane_data() lets no earlier run's frame through: the one taken
		 * before on the step-1 guess was of a run over at the site, which
		 * this site did not know of when the step started (no word of
		 * that run had come). The sum cannot stand, even where the part
		 * said it was whole. (A later run's frame after frames of a run
		 * known here is a copy to this step: the run it pairs with may
		 * well have completed it there.) */
		char text[GG_NODE_ERROR_MAX];
		snprintf(text, sizeof(text),
			 "step %llu of job '%s': site %s's frames of it came from two of its runs of the job (the "
			 "earlier one ended there; its frame came late)",
			 (unsigned long long)lj->wstep.step, lj->name, n->names[from]);
		lj->part_run[from] = ws->run;
		if (lj->reported)
			(void)tell_slot(ln, M_PART_FAILED, lj->slot, lj->seq, GG_ERR_SITE, text);
		else
			part_fail(lj, GG_ERR_SITE, "%s", text);
		return;
	}
	if (!lj->part_run[from] && (lj->guess & (1u << from)))
		lj->guessed_run[from] = ws->run;
	lj->part_run[from] = ws->run;
	if (ws->fingerprint != lj->wstep.fingerprint && ws->tensor_id == lj->wstep.tensor_id &&
	    ws->count == lj->wstep.count && ws->dtype == lj->wstep.dtype) {
		/* All else alike: the algorithm differs (auto, plans apart), or
		 * with the same one the chunks (auto's rule differs there). */
		const bool peer_direct = id->phase == GG_AR_DIRECT;
		if (peer_direct == (lj->algo == GG_ALLREDUCE_DIRECT))
			part_fail(lj, GG_ERR_MISMATCH,
				  "step %llu of job '%s': site %s cuts it in other chunks than site %s "
				  "(auto's rule differs there: another version of gradgate?)",
				  (unsigned long long)lj->wstep.step, lj->name, n->names[from], n->names[n->self]);
		else
			part_fail(lj, GG_ERR_MISMATCH, "step %llu of job '%s': site %s runs it %s, site %s %s",
				  (unsigned long long)lj->wstep.step, lj->name, n->names[from],
				  peer_direct ? "direct" : "by ring", n->names[n->self], peer_direct ? "by ring" : "direct");
		return;
	}
	if (ws->fingerprint != lj->wstep.fingerprint) {
		/* Named as the ranks named them: the message travels to every
		 * site, where "this site" would name another. */
		part_fail(lj, GG_ERR_MISMATCH,
			  "step %llu of job '%s': site %s announced tensor %u with %llu elements of %s, "
			  "site %s tensor %u with %llu elements of %s",
			  (unsigned long long)lj->wstep.step, lj->name, n->names[from], ws->tensor_id,
			  (unsigned long long)ws->count, wire_dtype_name(ws->dtype), n->names[n->self],
			  lj->wstep.tensor_id, (unsigned long long)lj->wstep.count, wire_dtype_name(lj->wstep.dtype));
		return;
	}
	int rc = gg_ar_step_on_frame(lj->ar, from, id, frame, len, err, sizeof(err));
	part_count_times(lj);
	if (rc < 0) {
		part_fail(lj, rc == -ENOMEM ? GG_ERR_NOMEM : GG_ERR_SITE, "step %llu of job '%s': %s (site index %u is %s)",
			  (unsigned long long)lj->wstep.step, lj->name, err, from, n->names[from]);
		return;
	}
	if (rc == 0) { /* taken, not a copy already received */
		count(&ln->stats.peers[from].data_in, len);
		count(&ln->stats.peers[from].raw_in, frame_elems(frame) * sizeof(float));
	}
	part_check_done(lj);
}

/* Acknowledges a kept frame on the streams its copies came on, from the
 * `from`th on. */
static void early_ack(struct lane_job *lj, const struct early *e, unsigned from)
{
	for (unsigned i = from; i < e->nvias; i++)
		lane_ack(lj->lane, e->vias[i].lane, e->vias[i].via, lj->name, e->wstep.run, e->seq, &e->id);
}

/* A copy of a kept frame came again, on lane via_lane's stream `via`. */
static void early_again(struct early *e, unsigned via_lane, struct gg_mesh_via via)
{
	for (unsigned i = 0; i < e->nvias; i++)
		if (e->vias[i].lane == via_lane && e->vias[i].via.conn == via.conn && e->vias[i].via.gen == via.gen)
			return;
	if (e->nvias == EARLY_VIAS) /* the oldest stream is the likeliest gone */
		memmove(&e->vias[0], &e->vias[1], (EARLY_VIAS - 1) * sizeof(e->vias[0]));
	else
		e->nvias++;
	e->vias[e->nvias - 1] = (struct early_via){ via_lane, via };
}

/* Frames that waited for steps from_seq..to_seq, which are over without
 * them (aborted, or refused): acknowledged, so their senders stop keeping
 * them. */
static void drop_early(struct lane_job *lj, uint64_t from_seq, uint64_t to_seq, uint32_t senders)
{
	struct early **pp = &lj->early;

	while (*pp) {
		struct early *e = *pp;
		if (e->seq < from_seq || e->seq > to_seq || !(senders & (1u << e->from))) {
			pp = &e->next;
			continue;
		}
		*pp = e->next;
		early_ack(lj, e, 0);
		early_free(lj->lane, e);
	}
}

/* Whether run a of a site's comes after its run b (wrapping, as run ids
 * count up from the sender's clock). */
static bool run_is_later(uint64_t a, uint64_t b)
{
	return (int64_t)(a - b) > 0;
}

/* Whether run is `upto` or an earlier one (upto 0: none known). */
static bool run_within(uint64_t run, uint64_t upto)
{
	return upto && !run_is_later(run, upto);
}

/* Raises *known to run, as run ids of a site only grow; whether it did. */
static bool run_raise(uint64_t *known, uint64_t run)
{
	if (!run || run_within(run, *known))
		return false;
	*known = run;
	return true;
}

/* Peer `peer` restarted: its new instance's runs count from its clock at
 * the new start, which a clock set back would put behind the old ones;
 * what this lane knew of the old instance's runs would refuse the new
 * one's frames. */
static void forget_runs_of(struct lane *ln, unsigned peer)
{
	for (unsigned i = 0; i < LANE_JOBS; i++)
		ln->jobs[i].run_seen[peer] = ln->jobs[i].run_over[peer] = 0;
}

/* Lets go of the early frames of runs that are over: of `sites` (by bit),
 * every frame but those of a run later than the one known over there; of
 * the others, every frame of a site not in `keep` (a job over at one site
 * cannot complete anywhere, but a site that began a new run of it since
 * keeps that run's frames), and those of runs known over. */
static void drop_runs_over(struct lane_job *lj, uint32_t sites, uint32_t keep)
{
	struct early **pp = &lj->early;

	while (*pp) {
		struct early *e = *pp;
		const uint32_t bit = 1u << e->from;
		const uint64_t over = lj->run_over[e->from];
		const bool later = !run_within(e->wstep.run, over);
		if ((sites & bit) ? over && later : (keep & bit) && later) {
			pp = &e->next;
			continue;
		}
		*pp = e->next;
		early_ack(lj, e, 0);
		early_free(lj->lane, e);
	}
}

/* A frame of step `seq` of lj that a peer may well send ahead of this site:
 * the next step of a job that ran here. Any other early frame is a guess:
 * a job that has not started here (yet), or steps further ahead, which a
 * peer keeping to the protocol does not send. */
static bool early_expected(const struct lane_job *lj, uint64_t seq)
{
	return lj->last_seq && seq == lj->last_seq + 1;
}

/* The early frames of `from` on this lane stay within what a peer with our
 * inflight_per_peer may have unacknowledged (its lanes share the window,
 * each may pass its share by one frame), whatever the peer's own window
 * says. Past it, frames this site does not expect make room for one it
 * does; they, and an unexpected frame that finds no room, are let go
 * unacknowledged: the sender keeps them counted in its window, which stays
 * shut to new DATA until this site catches up. Returns whether a frame of
 * `len` bytes for step `seq` of lj may be kept. */
static bool early_room(struct lane *ln, struct lane_job *lj, unsigned from, uint64_t seq, uint64_t len)
{
	struct gg_node *n = ln->node;
	uint64_t limit = n->cfg->limits.inflight_bytes_per_peer +
			 (uint64_t)n->cfg->transport.streams_per_peer * n->max_payload;
	uint64_t held = atomic_load_explicit(&ln->early_bytes[from], memory_order_relaxed);
	unsigned dropped = 0;

	for (unsigned i = 0; i < LANE_JOBS && held + len > limit && early_expected(lj, seq); i++) {
		struct lane_job *o = &ln->jobs[i];
		for (struct early **pp = &o->early; *pp && held + len > limit;) {
			struct early *e = *pp;
			if (e->from != from || early_expected(o, e->seq)) {
				pp = &e->next;
				continue;
			}
			*pp = e->next;
			held -= e->frame_len;
			early_free(ln, e);
			dropped++;
		}
	}
	if (held + len <= limit && !dropped)
		return true;
	uint64_t refused = atomic_fetch_add_explicit(&ln->early_refused, dropped + (held + len > limit),
						     memory_order_relaxed);
	if (refused < 8 || refused % 1024 == 0)
		gg_log(GG_LOG_WARN, "early_data_refused",
		       "site=%s job=%s step=%llu held=%llu limit=%llu reason=\"DATA for steps not started here "
		       "beyond inflight_per_peer; frames this site does not expect are not kept and not "
		       "acknowledged (is inflight_per_peer alike at every site?)\"", n->names[from], lj->name,
		       (unsigned long long)seq, (unsigned long long)held, (unsigned long long)limit);
	return held + len <= limit;
}

/* DATA for a chunk of this lane's, which came on lane via_lane's stream
 * `via`. Returns 0, or -ENOMEM when it could not be kept. */
static int lane_data(struct lane *ln, unsigned from, unsigned via_lane, struct gg_mesh_via via,
		     const struct gg_wire_msg *m, struct gg_buf *payload)
{
	const struct gg_wire_step *ws = &m->u.data.step;
	struct lane_job *lj = lane_job_find(ln, ws->job, true, (int)from);

	if (!lj) {
		if (peer_log_now(ln->logs, from, LOG_DATA_DROPPED, ln->loop.now_us))
			gg_log(GG_LOG_WARN, "data_dropped", "site=%s job=%s reason=\"too many jobs\"",
			       ln->node->names[from], ws->job);
		return 0;
	}
	/* Of a run over at its sender: nobody needs it, and kept it would hold
	 * memory and the sender's window for good, or pass for a frame of the
	 * run after it. */
	if (run_within(ws->run, lj->run_over[from])) {
		lane_ack(ln, via_lane, via, ws->job, ws->run, ws->step, &m->u.data.id);
		return 0;
	}
	if (lj->ended_by & (1u << from)) {
		/* No run of the site known over: all but step 1 are of the old
		 * one, and step 1 is taken for a new run's on a guess. */
		if (!lj->run_over[from] && ws->step != 1) {
			lane_ack(ln, via_lane, via, ws->job, ws->run, ws->step, &m->u.data.id);
			return 0;
		}
		if (!lj->run_over[from])
			lj->guessed_run[from] = ws->run;
		lj->ended_by &= ~(1u << from);
		lj->rerun_by |= 1u << from;
	}
	/* A site starts a run of a name only once its run before ended: the
	 * runs before this one are over there, and their frames go. */
	if (run_raise(&lj->run_over[from], ws->run - 1))
		drop_runs_over(lj, 1u << from, ~0u);
	if (run_raise(&lj->run_seen[from], ws->run)) {
		/* The coordinator judges the peer's DONE, ABORT and END by it. */
		struct mail *r = mail_new(M_PEER_RUN);
		if (r) {
			r->peer = from;
			r->run = ws->run;
			snprintf(r->u.job, sizeof(r->u.job), "%s", ws->job);
			tell_coordinator(ln, r);
		}
	}
	if (lj->ar && ws->step == lj->seq) {
		part_feed(lj, from, via_lane, via, ws, &m->u.data.id, m->u.data.frame, m->u.data.frame_bytes);
		return 0;
	}
	if (ws->step <= lj->last_seq || (ws->step >= lj->forgot_lo && ws->step <= lj->forgot_hi)) {
		/* A step already finished or failed here: a re-send, or data of a
		 * step a site aborted. Acknowledge so the peer lets it go. */
		lane_ack(ln, via_lane, via, ws->job, ws->run, ws->step, &m->u.data.id);
		/* Step 1 again, once steps ran here: a new run of the name at
		 * `from` (the old run's frames are not sent again once it ended
		 * there), unless this is the run's own step 1 still. The
		 * coordinator knows which (rerun_seen). */
		uint64_t now = ln->loop.now_us;
		if (ws->step == 1 && (!lj->rerun_us || now - lj->rerun_us >= RERUN_TELL_US)) {
			struct mail *r = mail_new(M_RERUN);
			if (r) {
				lj->rerun_us = now;
				r->peer = from;
				snprintf(r->u.job, sizeof(r->u.job), "%s", ws->job);
				tell_coordinator(ln, r);
			}
		}
		return 0;
	}
	/* Not started here yet: keep it unacknowledged, so the peer's window
	 * bounds how much waits. A copy sent again came on another stream,
	 * which its ACK takes too. */
	for (struct early *e = lj->early; e; e = e->next) {
		if (e->seq == ws->step && e->from == from && e->wstep.run == ws->run && e->id.phase == m->u.data.id.phase &&
		    e->id.origin == m->u.data.id.origin && e->id.chunk == m->u.data.id.chunk) {
			early_again(e, via_lane, via);
			return 0;
		}
	}
	if (!early_room(ln, lj, from, ws->step, m->u.data.frame_bytes))
		return 0; /* refused on purpose: left unacknowledged, not resent at once */
	struct early *e = malloc(sizeof(*e));
	if (!e)
		return -ENOMEM;
	atomic_fetch_add_explicit(&ln->early_bytes[from], m->u.data.frame_bytes, memory_order_relaxed);
	gg_buf_get(payload);
	*e = (struct early){ .from = from, .vias = { { via_lane, via } }, .nvias = 1, .seq = ws->step, .wstep = *ws,
			     .id = m->u.data.id, .msg = payload, .frame = m->u.data.frame,
			     .frame_len = m->u.data.frame_bytes };
	e->next = lj->early;
	lj->early = e;
	lj->touched = ++ln->touches; /* a job whose DATA keeps coming is not the one let go */
	return 0;
}

static void lane_start(struct lane *ln, const struct mail *m)
{
	struct gg_node *n = ln->node;
	struct lane_job *lj = lane_job_find(ln, m->u.start.wstep.job, true, -1);
	char why[GG_AR_ERROR_MAX];

	if (!lj) {
		lane_refuse(ln, m->slot, m->seq, m->u.start.wstep.job);
		return;
	}
	part_free(lj);
	lj->ended_by = lj->rerun_by = 0;
	memset(lj->part_run, 0, sizeof(lj->part_run));
	lj->guess = m->u.start.guess;
	for (unsigned p = 0; p < GG_AR_MAX_SITES; p++)
		if (lj->guess & (1u << p))
			lj->guessed_run[p] = 0; /* the part's first frame from p says (part_feed()) */
	lj->slot = m->slot;
	lj->seq = m->seq;
	lj->wstep = m->u.start.wstep;
	lj->algo = m->u.start.algo;
	lj->deadline_us = m->u.start.deadline_us;
	lj->timeout_us = m->u.start.timeout_us;
	lj->gather = m->u.start.gather;
	lj->deliver = m->u.start.deliver;
	lj->arg = m->u.start.arg;
	lj->reported = false;
	lj->owed = false;
	lj->last_seq = m->seq;
	lj->touched = ++ln->touches;
	lj->times = lj->times_counted = (struct gg_ar_times){ 0 };
	lj->gather_ns = lj->deliver_ns = 0;
	lj->start_ns = now_ns();
	/* What the coordinator knows of runs over, which this entry may not
	 * (made anew once an ended job's entry went to another job). */
	uint32_t raised = 0;
	for (unsigned p = 0; p < n->sites; p++)
		if (p != n->self && run_raise(&lj->run_over[p], m->runs[p]))
			raised |= 1u << p;
	if (raised)
		drop_runs_over(lj, raised, ~0u);

	struct feedback_slot *fb = m->u.start.feedback;
	struct gg_ar_config ac = { .sites = n->sites, .self = n->self, .algo = m->u.start.algo,
				   .count = lj->wstep.count, .chunk_elems = m->u.start.chunk_elems, .enc = &ln->enc,
				   .dec = &ln->dec, .feedback = fb && !fb->device ? &fb->fb : NULL, .pool = &n->frames,
				   .times = &lj->times, .part = ln->index, .parts = n->nlanes };
	int rc = 0;
#if HAVE_CUDA
	if (m->u.start.device) {
		if (!ln->gpu_ready && !(rc = gg_ar_mem_cuda_init(&ln->gpu, n->frame_limits.max_raw_bytes, NULL, why,
								  sizeof(why)))) {
			ln->gpu.frees_held = &n->gpu_frees_held;
			ln->gpu_ready = true;
		}
		if (rc) {
			part_fail(lj, rc == -ENOMEM ? GG_ERR_NOMEM : GG_ERR_SYSTEM,
				  "step %llu of job '%s': the GPU of the gateway of site %s: %s", (unsigned long long)m->seq,
				  lj->name, n->names[n->self], why);
			return;
		}
		gg_ar_mem_cuda_view(&lj->gpu, &ln->gpu, fb ? &fb->gpu : NULL);
		ac.mem = &lj->gpu.mem;
	}
#endif
	rc = gg_ar_step_start(&lj->ar, &ac, m->u.start.input, m->u.start.result, &ar_ops, lj, why, sizeof(why));
	part_count_times(lj);
	if (rc) {
		part_fail(lj, rc == -ENOMEM ? GG_ERR_NOMEM : GG_ERR_SITE, "step %llu of job '%s': %s",
			  (unsigned long long)m->seq, lj->name, why);
		return;
	}
	/* Frames that arrived before this lane started the step. */
	struct early **pp = &lj->early;
	while (*pp) {
		struct early *e = *pp;
		if (e->seq != lj->seq) {
			pp = &e->next;
			continue;
		}
		*pp = e->next;
		early_ack(lj, e, 1);
		part_feed(lj, e->from, e->vias[0].lane, e->vias[0].via, &e->wstep, &e->id, e->frame, e->frame_len);
		early_free(ln, e);
	}
	part_check_done(lj);
}

static void lane_end(struct lane *ln, const struct mail *m)
{
	struct lane_job *lj = NULL;

	for (unsigned i = 0; i < LANE_JOBS && !lj; i++)
		if (ln->jobs[i].used && ln->jobs[i].ar && ln->jobs[i].slot == m->slot && ln->jobs[i].seq == m->seq)
			lj = &ln->jobs[i];
	if (!lj)
		lj = lane_job_find(ln, m->u.job, false, -1);
	if (lj) {
		if (lj->ar && lj->seq == m->seq)
			part_free(lj);
		if (m->seq > lj->last_seq)
			lj->last_seq = m->seq;
		lj->touched = ++ln->touches;
		drop_early(lj, 0, m->seq, UINT32_MAX);
		if (m->forget)
			gg_mesh_forget(ln->mesh, lj->name, m->seq, m->seq);
	}
	ln->refused_owed[m->slot] = 0; /* the step is over: the refusal is moot */
	ln->ended_owed[m->slot] = tell_slot(ln, M_ENDED, m->slot, m->seq, 0, NULL) ? 0 : m->seq;
}

/* Step m->seq failed before it started here: the frames kept for it go,
 * and those still on their way will when they come. The steps forgotten
 * are one run (on_abort() posts them in order); a step apart from it
 * starts a new one. */
static void lane_forget(struct lane *ln, const struct mail *m)
{
	struct lane_job *lj = lane_job_find(ln, m->u.job, true, LANE_JOB_NO_EVICT);

	if (!lj || m->seq <= lj->last_seq)
		return;
	drop_early(lj, m->seq, m->seq, UINT32_MAX);
	if (lj->forgot_lo && m->seq >= lj->forgot_lo && m->seq <= lj->forgot_hi + 1) {
		lj->forgot_hi = GG_MAX(lj->forgot_hi, m->seq);
	} else {
		lj->forgot_lo = m->seq;
		lj->forgot_hi = m->seq;
	}
}

/* The job is over: its early frames are acknowledged and let go, and its
 * name may start a new run. It ended at `sites` (by bit): at one peer, in
 * its run `run`, or here (run 0), ending the runs of every site that took
 * part: runs[] as the coordinator heard of them, else as seen here. */
static void lane_forget_job(struct lane *ln, const char *job, uint32_t sites, uint64_t run, const uint64_t *runs)
{
	/* Its entry stays to let go what `sites` sent of it that is still on
	 * the way (other streams than the END's). A lane that holds none
	 * takes a free one for that, or the oldest entry of an ended job
	 * whose frames had their time to come, never a live job's. */
	struct lane_job *lj = lane_job_find(ln, job, sites != 0, LANE_JOB_FREE_ONLY);

	/* Its frames that no stream has taken yet would only be dropped by
	 * the peers. */
	gg_mesh_forget(ln->mesh, job, 0, UINT64_MAX);
	if (!lj || lj->ar)
		return;
	for (unsigned p = 0; p < GG_AR_MAX_SITES; p++) {
		if (!(sites & (1u << p)))
			continue;
		run_raise(&lj->run_over[p], run ? run : lj->run_seen[p]);
		if (!run)
			run_raise(&lj->run_over[p], runs[p]);
	}
	/* A peer's END lets go of that peer's frames of the run it ended (those
	 * of a later run stay): the other sites' may be of their next run of
	 * the name, and go when their own END or a later run says so. An end
	 * here lets go of everything but a new run's that a site began since
	 * it ended the old one. */
	const uint32_t keep = run ? ~sites : lj->rerun_by & ~sites;
	drop_runs_over(lj, sites, keep);
	if (keep || lj->early) {
		lj->ended_by |= sites;
		lj->rerun_by = keep;
		lj->ended_us = ln->loop.now_us;
		lj->touched = ++ln->touches;
		return;
	}
	const uint32_t ended_by = lj->ended_by | sites;
	uint64_t run_seen[GG_AR_MAX_SITES], run_over[GG_AR_MAX_SITES];
	memcpy(run_seen, lj->run_seen, sizeof(run_seen));
	memcpy(run_over, lj->run_over, sizeof(run_over));
	memset(lj, 0, sizeof(*lj));
	if (!ended_by)
		return;
	lj->lane = ln;
	lj->used = true;
	lj->touched = ++ln->touches;
	lj->ended_by = ended_by;
	lj->ended_us = ln->loop.now_us;
	memcpy(lj->run_seen, run_seen, sizeof(run_seen));
	memcpy(lj->run_over, run_over, sizeof(run_over));
	snprintf(lj->name, sizeof(lj->name), "%s", job);
}

/* ---- a lane's mesh -------------------------------------------------------- */

static int on_data(void *owner, unsigned from, struct gg_mesh_via via, const struct gg_wire_msg *m,
		   struct gg_buf *payload)
{
	struct lane *ln = owner;
	unsigned to = chunk_lane(ln->node, &m->u.data.id);

	if (to == ln->index)
		return lane_data(ln, from, ln->index, via, m, payload);
	struct mail *f = mail_new(M_DATA);
	if (!f)
		return -ENOMEM;
	f->peer = from;
	f->via_lane = ln->index;
	f->via = via;
	f->u.data.msg = *m;
	gg_buf_get(payload);
	f->u.data.payload = payload;
	post(&ln->node->lanes[to].inbox, f);
	return 0;
}

static int on_foreign_ack(void *owner, unsigned peer, const struct gg_wire_msg *m)
{
	struct lane *ln = owner;
	unsigned to = chunk_lane(ln->node, &m->u.ack.id);
	struct mail *f;

	if (to == ln->index)
		return 0; /* a stale copy */
	if (!(f = mail_new(M_ACK)))
		return -ENOMEM;
	f->peer = peer;
	f->u.msg = *m;
	post(&ln->node->lanes[to].inbox, f);
	return 0;
}

static int on_control(void *owner, unsigned from, const struct gg_wire_msg *m)
{
	struct lane *ln = owner;
	struct mail *f = mail_new(M_CONTROL);

	if (!f)
		return -ENOMEM;
	f->peer = from;
	f->u.msg = *m;
	tell_coordinator(ln, f);
	return 0;
}

static void on_peer_restarted(void *owner, unsigned peer, uint64_t instance_id)
{
	struct lane *ln = owner;
	struct mail *f = mail_new(M_RESTARTED);

	/* At once here; the other lanes hear of it from the coordinator. */
	forget_runs_of(ln, peer);
	if (!f)
		return;
	f->peer = peer;
	f->u.instance_id = instance_id;
	tell_coordinator(ln, f);
}

static void on_stream_change(void *owner, unsigned peer, unsigned stream, bool up, const char *why)
{
	struct lane *ln = owner;
	struct gg_node *n = ln->node;
	uint64_t bit = (uint64_t)1 << stream;

	if (up)
		atomic_fetch_or(&n->ready[peer], bit);
	else
		atomic_fetch_and(&n->ready[peer], ~bit);
	struct mail *f = mail_new(up ? M_STREAM_READY : M_STREAM_DOWN);
	if (!f)
		return;
	f->peer = peer;
	if (why)
		snprintf(f->u.text, sizeof(f->u.text), "%s", why);
	tell_coordinator(ln, f);
}

static void hand_off(void *owner, unsigned lane, struct gg_mesh_handoff *h)
{
	struct lane *ln = owner;
	struct mail *f = mail_new(M_CONN);

	if (!f) {
		close(h->fd);
		gg_tls_engine_free(h->tls);
		free(h);
		return;
	}
	f->u.conn = h;
	post(&ln->node->lanes[lane].inbox, f);
}

static bool peer_denied(void *owner, unsigned peer)
{
	const struct lane *ln = owner;
	const struct gg_node *n = ln->node;

	for (unsigned l = 0; l < n->nlanes; l++)
		if (atomic_load_explicit(&n->lanes[l].denied[peer], memory_order_relaxed))
			return true;
	return false;
}

static const struct gg_mesh_ops mesh_ops = {
	.on_data = on_data,
	.on_control = on_control,
	.on_foreign_ack = on_foreign_ack,
	.on_peer_restarted = on_peer_restarted,
	.on_stream_change = on_stream_change,
	.hand_off = hand_off,
	.peer_denied = peer_denied,
};

/* ---- a lane's turn -------------------------------------------------------- */

static void lane_mail(struct lane *ln)
{
	for (struct gg_mail *g = gg_mailbox_take(&ln->inbox), *next; g; g = next) {
		struct mail *m = (struct mail *)g;
		next = g->next;
		switch ((enum mail_type)g->type) {
		case M_START:
			lane_start(ln, m);
			break;
		case M_END:
			lane_end(ln, m);
			break;
		case M_FORGET:
			lane_forget(ln, m);
			break;
		case M_FORGET_JOB:
			lane_forget_job(ln, m->u.job, m->sites, m->run, m->runs);
			break;
		case M_PEER_RESET:
			forget_runs_of(ln, m->peer);
			break;
		case M_SEND:
			gg_mesh_send_control(ln->mesh, m->peer, m->u.send.bytes, m->u.send.len, m->u.send.every_stream);
			break;
		case M_DATA:
			/* Not kept for want of memory, it stays unacknowledged: the
			 * peer sends it again once a stream to it is cut. */
			(void)lane_data(ln, m->peer, m->via_lane, m->via, &m->u.data.msg, m->u.data.payload);
			gg_buf_put(m->u.data.payload);
			break;
		case M_ACK_SEND:
			gg_mesh_ack(ln->mesh, m->via, m->u.ack.job, m->u.ack.run, m->seq, &m->u.ack.id);
			break;
		case M_ACK:
			gg_mesh_take_ack(ln->mesh, m->peer, &m->u.msg);
			break;
		case M_CONN:
			gg_mesh_adopt(ln->mesh, m->u.conn);
			break;
		case M_SHUTDOWN:
			ln->shutting_down = true;
			gg_mesh_shutdown(ln->mesh);
			break;
		case M_CUT:
			if (gg_mesh_test_cut_stream(ln->mesh, m->peer, m->u.stream))
				gg_log(GG_LOG_WARN, "test_cut_failed", "site=%s stream=%d", ln->node->names[m->peer],
				       m->u.stream);
			break;
		default:
			break;
		}
		free(m);
	}
	gg_mesh_flush(ln->mesh);
}

/* " (no connection to site X, site Y)" for peers with no stream up, or "":
 * when a site is gone, what a step waits for may be held up by it rather
 * than by the site the step waits on. A peer only it may dial (dial =
 * "in" here) is marked so: if it never dials, no stream ever comes. */
static void unreachable_peers(const struct gg_node *n, char *buf, size_t size)
{
	size_t len = 0;

	buf[0] = '\0';
	for (unsigned p = 0; p < n->sites && len < size; p++) {
		if (p == n->self || atomic_load(&n->ready[p]))
			continue;
		const struct gg_peer_config *pc = gg_config_peer(n->cfg, n->names[p]);
		len += (size_t)snprintf(buf + len, size - len, "%s site %s%s", len ? "," : " (no connection to",
					n->names[p], pc && pc->dial == GG_DIAL_IN ? ", whose dial it waits for (dial = \"in\")" : "");
	}
	if (len && len < size)
		snprintf(buf + len, size - len, ")");
}

/* A part that missed its step's deadline fails it, naming what it waits for. */
static void part_missed_deadline(struct lane_job *lj)
{
	const struct gg_node *n = lj->lane->node;
	unsigned from;
	struct gg_ar_chunk_id id;
	char buf[32], down[GG_AR_MAX_SITES * (GG_WIRE_NAME_MAX + 48) + 32];

	unreachable_peers(n, down, sizeof(down));
	gg_format_duration(lj->timeout_us, buf, sizeof(buf));
	if (gg_ar_step_first_missing(lj->ar, &from, &id))
		part_fail(lj, GG_ERR_TIMEOUT,
			  "step %llu of job '%s' missed its %s deadline: site %s never sent %s data for shard %u chunk "
			  "%u%s%s", (unsigned long long)lj->seq, lj->name, buf, n->names[from],
			  id.phase == GG_AR_DIRECT ? "direct" : id.phase == GG_AR_SCATTER ? "reduce-scatter" : "all-gather",
			  id.origin, id.chunk,
			  gg_ar_step_heard_from(lj->ar, from)
				  ? ""
				  : " (no frame of the step came from it: has it started the step?)",
			  down);
	else
		part_fail(lj, GG_ERR_TIMEOUT, "step %llu of job '%s' missed its %s deadline%s",
			  (unsigned long long)lj->seq, lj->name, buf, down);
}

static uint64_t load(const atomic_uint_fast64_t *c)
{
	return atomic_load_explicit(c, memory_order_relaxed);
}

static void publish(atomic_uint_fast64_t *dst, uint64_t v)
{
	atomic_store_explicit(dst, v, memory_order_relaxed);
}

#define TCP_INFO_EVERY_US 250000

/* Its streams' TCP figures, a few times a second. */
static void publish_stream_tcp(struct lane *ln)
{
	struct gg_node *n = ln->node;
	struct gg_mesh_stream_tcp t;

	if (ln->index >= n->nlanes || ln->loop.now_us < ln->tcp_next_us)
		return;
	ln->tcp_next_us = ln->loop.now_us + TCP_INFO_EVERY_US;
	for (unsigned p = 0; p < n->sites; p++) {
		if (p == n->self)
			continue;
		for (unsigned s = ln->index; s < (unsigned)n->cfg->transport.streams_per_peer; s += n->nlanes) {
			struct stream_tcp *st = &n->tcp[p][s];
			bool up = !gg_mesh_stream_tcp(ln->mesh, p, s, &t);
			if (up) {
				publish(&st->rtt_us, t.rtt_us);
				publish(&st->rttvar_us, t.rttvar_us);
				publish(&st->cwnd_bytes, t.cwnd_bytes);
				publish(&st->delivery_bytes_per_s, t.delivery_bytes_per_s);
				if (t.connection != st->connection) {
					st->retransmits_before += st->retransmits_now;
					st->connection = t.connection;
				}
				st->retransmits_now = t.retransmits;
				publish(&st->retransmits, st->retransmits_before + st->retransmits_now);
				publish(&st->unsent_bytes, t.unsent_bytes);
				publish(&st->send_buffer_bytes, t.send_buffer_bytes);
				publish(&st->receive_buffer_bytes, t.receive_buffer_bytes);
			}
			atomic_store_explicit(&st->up, up, memory_order_release);
		}
	}
}

/* What the lane's mesh counted, for the coordinator's thread to read. */
static void publish_mesh_stats(struct lane *ln)
{
	const struct gg_mesh_stats *ms = gg_mesh_stats(ln->mesh);

	uint64_t hedged = 0;
	for (unsigned p = 0; p < ln->node->sites; p++)
		hedged += ms->peers[p].hedged_frames;
	publish(&ln->resent, ms->resent_messages);
	publish(&ln->hedged, hedged);
	publish(&ln->tls_ns, (uint64_t)(ms->tls_s * 1e9));
	for (unsigned p = 0; p < ln->node->sites; p++) {
		const struct gg_mesh_peer_stats *mp = &ms->peers[p];
		struct lane_peer_stats *lp = &ln->stats.peers[p];
		if (ms->rtt_us[p])
			publish(&ln->rtt_us[p], ms->rtt_us[p]);
		publish(&ln->rtt_min_us[p], ms->rtt_min_us[p]);
		publish(&ln->heard_us[p], gg_mesh_last_heard(ln->mesh, p));
		atomic_store_explicit(&ln->denied[p], gg_mesh_peer_denied(ln->mesh, p), memory_order_relaxed);
		publish(&lp->data_out, mp->data_bytes_out);
		publish(&lp->raw_out, mp->raw_bytes_out);
		publish(&lp->wire_out, mp->wire_bytes_out);
		publish(&lp->wire_in, mp->wire_bytes_in);
		publish(&lp->stream_ups, mp->stream_ups);
		publish(&lp->stream_downs, mp->stream_downs);
		publish(&lp->delivery_bps, mp->delivery_bytes_per_s);
	}
	publish(&ln->uplink_bps, ms->uplink_bytes_per_s);
	publish(&ln->uplink_at_us, ms->uplink_at_us);
	for (unsigned f = 0; f < GG_MESH_FAILURES; f++)
		publish(&ln->stats.stream_failures[f], ms->stream_failures[f]);
	publish_stream_tcp(ln);
}

/* Parts' deadlines, and own chunks that wait for room on the streams. */
static uint64_t lane_timers(struct lane *ln)
{
	char why[GG_AR_ERROR_MAX];
	uint64_t next = GG_MIN(gg_mesh_tick(ln->mesh), peer_logs_flush(ln->node, ln->logs, ln->loop.now_us));

	for (unsigned slot = 0; slot < MAX_JOBS; slot++) {
		if (ln->ended_owed[slot] && tell_slot(ln, M_ENDED, slot, ln->ended_owed[slot], 0, NULL))
			ln->ended_owed[slot] = 0;
		if (ln->refused_owed[slot])
			lane_refuse(ln, slot, ln->refused_owed[slot], ln->refused_job[slot]);
	}
	for (unsigned i = 0; i < LANE_JOBS; i++) {
		struct lane_job *lj = &ln->jobs[i];
		if (lj->used && lj->ar && lj->owed)
			part_report(lj, lj->owed_type, 0, NULL);
		if (!lj->used || !lj->ar || lj->reported)
			continue;
		if (ln->loop.now_us >= lj->deadline_us) {
			part_missed_deadline(lj);
			continue;
		}
		if (lj->deadline_us < next)
			next = lj->deadline_us;
		if (!gg_ar_step_wants_resume(lj->ar))
			continue;
		int rc = gg_ar_step_resume(lj->ar, why, sizeof(why));
		part_count_times(lj);
		if (rc)
			part_fail(lj, rc == -ENOMEM ? GG_ERR_NOMEM : GG_ERR_SITE, "step %llu of job '%s': %s",
				  (unsigned long long)lj->seq, lj->name, why);
		else
			part_check_done(lj);
	}
	publish_mesh_stats(ln);
	atomic_store(&ln->flushed, gg_mesh_flushed(ln->mesh));
	atomic_store(&ln->idle, gg_mesh_idle(ln->mesh));
	return next;
}

struct cqe_ctx {
	struct lane *ln;
	gg_node_cqe_fn *other;
	void *arg;
	bool lane_mail, coord_mail;
};

static void on_cqe(void *arg, const struct io_uring_cqe *cqe)
{
	struct cqe_ctx *x = arg;
	unsigned kind = gg_loop_ud_kind(cqe->user_data);

	if (kind >= GG_OP_USER) {
		if (x->other)
			x->other(x->arg, cqe);
	} else if (kind == KIND_LANE_MAIL) {
		x->lane_mail = true;
	} else if (kind == KIND_COORD_MAIL) {
		x->coord_mail = true;
	} else {
		gg_mesh_on_cqe(x->ln->mesh, cqe);
	}
}

/* One turn of a lane's loop. Returns 0 or a negative errno (the ring broke). */
static int lane_turn(struct lane *ln, uint64_t max_wait_us, struct cqe_ctx *x)
{
	uint64_t wait = GG_MIN(max_wait_us, gg_loop_timeout_us(&ln->loop, ln->next_us));
	int rc = gg_loop_run(&ln->loop, wait, on_cqe, x);

	if (rc < 0)
		return rc;
	if (x->lane_mail && (rc = gg_mailbox_arm(&ln->inbox, &ln->loop, gg_loop_ud(KIND_LANE_MAIL, 0, 0))))
		return rc;
	lane_mail(ln);
	ln->next_us = lane_timers(ln);
	return 0;
}

static void *lane_main(void *arg);

/* ---- the coordinator: jobs and steps -------------------------------------- */

static void send_to_peers(struct gg_node *n, int only, const uint8_t *bytes, ssize_t len, bool every_stream)
{
	struct mail m = { .base.type = M_SEND };

	if (len <= 0 || (size_t)len > sizeof(m.u.send.bytes))
		return;
	memcpy(m.u.send.bytes, bytes, (size_t)len);
	m.u.send.len = (size_t)len;
	m.u.send.every_stream = every_stream;
	for (unsigned p = 0; p < n->sites; p++) {
		if (p == n->self || (only >= 0 && p != (unsigned)only))
			continue;
		m.peer = p;
		post_lanes(n, &m, 0);
	}
}

_Static_assert(GG_WIRE_CODE_MAX == -GG_ERR_LIMIT && GG_WIRE_CODE_CLOSED == -GG_ERR_CLOSED &&
		       GG_WIRE_CODE_AGAIN == -GG_ERR_AGAIN,
	       "wire.h's codes are gradgate.h's negated");

/* A failure's code as the wire carries it: a gateway that shuts down is a
 * lost site to the others; a code no peer takes goes as a lost site too. */
static uint8_t wire_code(int code)
{
	return (uint8_t)(code == GG_ERR_CLOSED || code == GG_ERR_AGAIN || code >= 0 || -code > GG_WIRE_CODE_MAX
				 ? -GG_ERR_SITE
				 : -code);
}

/* ABORT of steps lo..hi with the code they failed with here, to one peer
 * or all (-1). */
static void send_abort(struct gg_node *n, int only, const char *job, uint64_t run, uint64_t lo, uint64_t hi,
		       int code, const char *reason)
{
	uint8_t buf[CTRL_MSG_MAX];

	send_to_peers(n, only, buf, gg_wire_encode_abort(buf, sizeof(buf), job, run, lo, hi, wire_code(code), reason),
		      false);
}

/* DONE for the job's step to peer `only` (every peer when -1), on every
 * ready stream: one cut after the message was queued must not lose it, and
 * a second copy changes nothing. */
static void send_done(struct gg_node *n, const struct job *j, int only)
{
	uint8_t buf[CTRL_MSG_MAX];

	send_to_peers(n, only, buf,
		      gg_wire_encode_done(buf, sizeof(buf), j->name, j->run, j->step->seq, &n->links[n->self], &j->plan),
		      true);
}

/* A site that holds the job's step's result and has waited a heartbeat
 * interval for the others' DONEs asks every peer whether it completed the
 * step (its DONE again, flagged), and again each interval after: with
 * three or more sites, a DONE that a link lost (one way, say) is so
 * replaced by the word of a site that held it, before this site would
 * give the silent one up and fail a step the others completed. With two,
 * the answer would go the way of the DONE it stands for. Returns when to
 * look again. */
static uint64_t ask_completed(struct gg_node *n, struct job *j, uint64_t now)
{
	const uint64_t every = n->cfg->transport.heartbeat_interval_us;
	uint64_t due = GG_MAX(j->has_result_us, j->asked_us) + every;
	uint8_t buf[CTRL_MSG_MAX];

	if (n->sites < 3)
		return UINT64_MAX;
	if (now < due)
		return due;
	send_to_peers(n, -1, buf,
		      gg_wire_encode_done_asking(buf, sizeof(buf), j->name, j->run, j->step->seq, &n->links[n->self],
						 &j->plan),
		      false);
	j->asked_us = now;
	return now + every;
}

/* Answers a peer's ask (ask_completed()) for step `seq` of the job, if it
 * completed here: the last step completed, or the one ending as
 * completed. */
static void answer_completed(struct gg_node *n, const struct job *j, unsigned peer, uint64_t seq)
{
	uint8_t buf[CTRL_MSG_MAX];
	const struct gg_wire_plan *plan;

	if (j->step && j->step->seq == seq && j->ending && !j->end_status)
		plan = &j->plan;
	else if (j->done_seq == seq)
		plan = &j->done_plan;
	else
		return;
	send_to_peers(n, (int)peer, buf,
		      gg_wire_encode_completed(buf, sizeof(buf), j->name, j->run, seq, &n->links[n->self], plan), false);
}

/* Every site said DONE for the job's step: a site told so by one that
 * completed it (its word, or its END) needs no DONE of its own from the
 * others. */
static void all_done(struct gg_node *n, struct job *j)
{
	for (unsigned p = 0; p < n->sites; p++)
		if (p != n->self)
			j->done_from |= 1u << p;
}

/* END of a job ended here, to peer `only` or all (-1). */
static void send_end(struct gg_node *n, int only, const struct ended_job *e)
{
	uint8_t buf[CTRL_MSG_MAX];
	const uint64_t age_ms = (gg_monotonic_us() - e->ended_us) / 1000;

	send_to_peers(n, only, buf,
		      gg_wire_encode_end(buf, sizeof(buf), e->name, e->run, e->last_done, e->last_step,
					 wire_code(e->code), e->reason, (uint32_t)GG_MIN(age_ms, UINT32_MAX)),
		      false);
}

/* Step seq failed here: it joins the run of failed steps kept for peers
 * that come back (ABORT), whose first step's code and reason this site's
 * END gives. */
static void remember_abort(struct gg_node *n, struct job *j, uint64_t seq, int code, const char *reason)
{
	j->failed_us = gg_node_loop(n)->now_us;
	if (j->failed_lo && seq >= j->failed_lo && seq <= j->failed_hi)
		return;
	if (j->failed_hi && seq == j->failed_hi + 1) {
		j->failed_hi = seq;
		return;
	}
	j->failed_lo = j->failed_hi = seq;
	j->failed_code = code < 0 ? code : GG_ERR_SITE;
	snprintf(j->failed_reason, sizeof(j->failed_reason), "%s", reason);
}

const double gg_node_step_bucket_s[GG_NODE_STEP_BUCKETS] = {
	0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300,
};

/* A step failed here: counted by its code, and kept for the status. */
static void note_failure(struct gg_node *n, const char *job, uint64_t seq, int code, const char *message)
{
	struct gg_node_failure *f = &n->failures[n->failures_total++ % FAILURES_KEPT];
	struct timespec now;

	n->stats.steps_failed++;
	n->failures_by_code[code < 0 && -code < GG_NODE_CODES ? -code : 0]++;
	clock_gettime(CLOCK_REALTIME, &now);
	*f = (struct gg_node_failure){ .step = seq, .code = code, .at_us = gg_node_loop(n)->now_us,
				       .at_unix_ms = (uint64_t)now.tv_sec * 1000u + (uint64_t)now.tv_nsec / 1000000u };
	snprintf(f->job, sizeof(f->job), "%s", job);
	snprintf(f->message, sizeof(f->message), "%s", message ? message : "");
}

/* The step under way has its whole result here and has not failed (it
 * may be ending): this site's DONE of it stands. */
static bool done_here(const struct job *j)
{
	return j->step && j->has_result && (!j->ending || !j->end_status);
}

/* Tells the lanes not told yet that the job's step is over. */
static void post_end(struct gg_node *n, struct job *j)
{
	/* Frames of a failed step that peers never acknowledged are no longer
	 * worth sending. */
	struct mail m = { .base.type = M_END, .slot = (unsigned)(j - n->jobs), .seq = j->step->seq,
			  .forget = j->end_status != 0 };
	snprintf(m.u.job, sizeof(m.u.job), "%s", j->name);
	j->end_told = post_lanes(n, &m, j->end_told);
}

/* Ends the job's step: the lanes let go of their parts first (a part may
 * still be reading or writing the step's memory), then done is called. */
static void time_step(struct gg_node *n, struct job *j);

/* Step `seq` failed here with `status`. Whatever failed it, it joins the
 * run of failed steps that a returning peer hears of, and whose cause this
 * site's END names. */
static void step_failed_here(struct gg_node *n, struct job *j, uint64_t seq, int status, const char *message)
{
	remember_abort(n, j, seq, status, message);
	note_failure(n, j->name, seq, status, message);
	/* Algorithm auto: where a step failed, some sites may have completed
	 * it (a site cut off past the deadline) or a site may have forgotten
	 * the job: their plans may differ. Every site that fails a step drops
	 * its plan, and a step planned differently fails everywhere (a
	 * mismatch), so after at most one more failed step all go direct until
	 * the next completed step plans again. */
	j->using = (struct gg_wire_plan){ 0 };
	j->plan_told = false;
	char safe[LOG_VALUE_MAX];
	gg_log(GG_LOG_ERROR, "step_failed", "job=%s step=%llu reason=\"%s\"", j->name, (unsigned long long)seq,
	       gg_escape(safe, sizeof(safe), message, strlen(message)));
}

static void finish_step(struct gg_node *n, struct job *j, int status, const char *message)
{
	if (!j->step || j->ending)
		return;
	j->ending = true;
	j->ended = 0;
	j->end_status = status;
	snprintf(j->end_message, sizeof(j->end_message), "%s", message ? message : "");
	if (status) {
		step_failed_here(n, j, j->step->seq, status, message ? message : "");
	} else {
		n->stats.steps_done++;
		time_step(n, j);
		/* The plan for the steps after this one: every site that
		 * completes the step heard the first site's DONE. */
		if (j->plan.has_plan)
			j->using = j->plan;
	}
	j->end_told = 0;
	post_end(n, j);
}

static void step_ended(struct gg_node *n, struct job *j)
{
	struct gg_node_step *st = j->step;
	char message[GG_NODE_ERROR_MAX];
	int status = j->end_status;

	snprintf(message, sizeof(message), "%s", j->end_message);
	j->step = NULL;
	j->ending = false;
	j->active_us = gg_node_loop(n)->now_us;
	if (!status) {
		uint64_t us = j->active_us > j->submit_us ? j->active_us - j->submit_us : 0;
		unsigned b = 0;
		while (b < GG_NODE_STEP_BUCKETS && (double)us > gg_node_step_bucket_s[b] * 1e6)
			b++;
		n->step_buckets[b]++;
		n->step_us_sum += us;
		j->done_seq = st->seq;
		j->done_us = j->active_us;
		j->done_plan = j->plan;
		j->failed_lo = j->failed_hi = 0; /* every site is past them */
		st->algorithm = j->run_algo;
	}
	/* done() may submit the job's next step. */
	st->done(st->arg, st, status, status ? message : NULL);
}


static void fail_step_code(struct gg_node *n, struct job *j, int code, const char *fmt, ...) GG_PRINTF(4, 5);
static void fail_step_code(struct gg_node *n, struct job *j, int code, const char *fmt, ...)
{
	char msg[GG_NODE_ERROR_MAX];
	va_list ap;

	if (!j->step || j->ending)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	send_abort(n, -1, j->name, j->run, j->step->seq, j->step->seq, code, msg);
	finish_step(n, j, code, msg);
}

static void feedback_free(struct gg_node *n, struct feedback_slot *f)
{
	n->feedback_bytes -= f->elems * sizeof(float);
#if HAVE_CUDA
	if (f->device)
		gg_feedback_fini_cuda(&f->gpu);
#endif
	gg_feedback_fini(&f->fb);
	free(f);
}

/* Frees feedback slot i (one on the GPU later, while GPU frees are held);
 * the last slot takes its place. */
static void feedback_drop(struct gg_node *n, unsigned i)
{
	struct feedback_slot *f = n->feedback[i];

	n->feedback[i] = n->feedback[--n->feedback_count];
	if (f->device && atomic_load(&n->gpu_frees_held)) {
		f->held_next = n->gpu_held;
		n->gpu_held = f;
		return;
	}
	feedback_free(n, f);
}

void gg_node_gpu_frees(struct gg_node *n, bool allowed)
{
	atomic_store_explicit(&n->gpu_frees_held, !allowed, memory_order_release);
	while (allowed && n->gpu_held) {
		struct feedback_slot *f = n->gpu_held;
		n->gpu_held = f->held_next;
		feedback_free(n, f);
	}
}

/* A run id for a job starting here: never 0, and each larger than the
 * one before, across restarts too (they start from the clock), so that a
 * peer tells a later run of a job from one that ended (run_is_later()). */
static uint64_t new_run(struct gg_node *n)
{
	return n->next_run++;
}

static struct name_runs *name_runs(struct gg_node *n, const char *job, bool create);
static void job_ended_at(struct gg_node *n, struct job *j, unsigned from, bool said, uint64_t last_done,
			 uint64_t last, int code, const char *failed, const char *gone);
static void restart_reason(const struct gg_node *n, unsigned peer, const char *job, uint64_t last, char *why,
			   size_t size);
static void ended_there(struct gg_node *n, struct job *j, unsigned from, const struct gg_wire_steps *end);
static void aborted_there(struct gg_node *n, struct job *j, unsigned from, const struct gg_wire_steps *abort);

/* Whether ranks of the job name are connected here (gg_node_job_opened()). */
static bool name_open(struct gg_node *n, const char *job)
{
	const struct name_runs *r = name_runs(n, job, false);

	return r && r->open;
}

/* The job's entry; made when `create` and missing, in a free slot or the
 * one of the job idle longest of those whose ranks are not here (made by
 * peers' words, or by steps of a core whose site tells it of no ranks):
 * the entry of a job whose ranks are connected holds its residuals and
 * plan, which they count on between steps. NULL when there is none. */
static struct job *find_job(struct gg_node *n, const char *name, bool create)
{
	struct job *free_slot = NULL;

	for (unsigned i = 0; i < MAX_JOBS; i++) {
		if (n->jobs[i].used && !strcmp(n->jobs[i].name, name))
			return &n->jobs[i];
		if (!n->jobs[i].used && !free_slot)
			free_slot = &n->jobs[i];
	}
	if (!create)
		return NULL;
	if (!free_slot) {
		for (unsigned i = 0; i < MAX_JOBS; i++)
			if (!n->jobs[i].step && (!free_slot || n->jobs[i].active_us < free_slot->active_us) &&
			    !name_open(n, n->jobs[i].name))
				free_slot = &n->jobs[i];
		if (!free_slot)
			return NULL;
		if (peer_log_now(n->logs, n->self, LOG_JOB_FORGOTTEN, gg_node_loop(n)->now_us))
			gg_log(GG_LOG_INFO, "job_forgotten", "job=%s last_step=%llu reason=\"its slot went to job %s\"",
			       free_slot->name, (unsigned long long)free_slot->last_seq, name);
		for (unsigned i = 0; i < n->feedback_count; i++)
			if (!strcmp(n->feedback[i]->job, free_slot->name))
				feedback_drop(n, i--);
	}
	/* A job of that name starts again here: what ended before is over. */
	for (unsigned e = 0; e < ENDS_KEPT; e++)
		if (!strcmp(n->ended[e].name, name))
			n->ended[e].name[0] = '\0';
	memset(free_slot, 0, sizeof(*free_slot));
	free_slot->run = new_run(n);
	free_slot->active_us = gg_node_loop(n)->now_us;
	free_slot->used = true;
	snprintf(free_slot->name, sizeof(free_slot->name), "%s", name);
	/* A site restarted while its run of the name went on, or its ranks
	 * of it went, before the job was here (on_peer_restart(), on_end()):
	 * it is over there. */
	struct name_runs *r = name_runs(n, name, false);
	if (!r)
		return free_slot;
	for (unsigned p = 0; p < n->sites; p++) {
		if (!(r->lost_by & (1u << p)))
			continue;
		char why[GG_NODE_ERROR_MAX];
		restart_reason(n, p, name, 0, why, sizeof(why));
		job_ended_at(n, free_slot, p, false, 0, UINT64_MAX, GG_ERR_SITE, why, why);
	}
	if (r->end_from)
		ended_there(n, free_slot, r->end_from - 1, &r->end);
	if (r->abort_from)
		aborted_there(n, free_slot, r->abort_from - 1, &r->abort);
	r->lost_by = 0;
	r->end_from = 0;
	r->abort_from = 0;
	return free_slot;
}

/* The error feedback of one tensor of a job, made on its first step, in
 * the memory the tensor is in (device: the gateway's GPU). Returns 0 with
 * *out, or a negative errno with err saying why. */
static int feedback_for(struct gg_node *n, const char *job, uint32_t tensor, uint64_t count, bool device,
			struct feedback_slot **out, char *err, size_t err_size)
{
	const uint64_t limit = n->cfg->limits.memory_bytes;

	for (unsigned i = 0; i < n->feedback_count; i++) {
		struct feedback_slot *f = n->feedback[i];
		if (f->tensor_id != tensor || strcmp(f->job, job))
			continue;
		if (f->elems == count && f->device == device) {
			*out = f;
			return 0;
		}
		feedback_drop(n, i); /* the tensor changed size or memory: start afresh */
		break;
	}
	if (count * sizeof(float) > limit - n->feedback_bytes) {
		char a[32], b[32], held[96] = "";
		unsigned nheld = 0;
		for (const struct feedback_slot *f = n->gpu_held; f; f = f->held_next)
			nheld++;
		if (nheld)
			snprintf(held, sizeof(held), " (%u of them given up, on the GPU, freed once no NCCL call of the "
				 "gateway's runs)", nheld);
		return gg_errf(err, err_size, -ENOSPC,
			       "error feedback for tensor %u (%llu elements) does not fit: residuals of %u "
			       "tensors%s take %s of [limits] memory = %s; raise it, or set [compression] "
			       "error_feedback = false",
			       tensor, (unsigned long long)count, n->feedback_count + nheld, held,
			       gg_format_size(n->feedback_bytes, a, sizeof(a)), gg_format_size(limit, b, sizeof(b)));
	}
	if (n->feedback_count == n->feedback_cap) {
		unsigned cap = n->feedback_cap ? 2 * n->feedback_cap : 16;
		struct feedback_slot **grown = realloc(n->feedback, cap * sizeof(*grown));
		if (!grown)
			return gg_errf(err, err_size, -ENOMEM, "no memory for the error feedback of tensor %u", tensor);
		n->feedback = grown;
		n->feedback_cap = cap;
	}
	struct feedback_slot *f = calloc(1, sizeof(*f));
	if (!f)
		return gg_errf(err, err_size, -ENOMEM, "no memory for the error feedback of tensor %u", tensor);
#if HAVE_CUDA
	if (device) {
		char why[GG_NODE_ERROR_MAX / 2];
		int rc = gg_feedback_init_cuda(&f->gpu, count, why, sizeof(why));
		if (rc) {
			free(f);
			return gg_errf(err, err_size, rc, "the error feedback of tensor %u (%llu elements) on the GPU: %s",
				       tensor, (unsigned long long)count, why);
		}
	}
#endif
	if (!device && gg_feedback_init(&f->fb, count, GG_MIN(count, (uint64_t)n->chunk_elems))) {
		free(f);
		return gg_errf(err, err_size, -ENOMEM, "no memory for the error feedback of tensor %u (%llu elements)",
			       tensor, (unsigned long long)count);
	}
	f->elems = count;
	f->device = device;
	f->tensor_id = tensor;
	snprintf(f->job, sizeof(f->job), "%s", job);
	n->feedback[n->feedback_count++] = f;
	n->feedback_bytes += count * sizeof(float);
	*out = f;
	return 0;
}

/* Completes the step once its result is whole here and every other site
 * said DONE: a step completes at every site or, when a site fails it
 * first (ABORT), at none. */
static void maybe_complete(struct gg_node *n, struct job *j)
{
	if (!j->step || j->ending || !j->has_result)
		return;
	for (unsigned p = 0; p < n->sites; p++)
		if (p != n->self && !(j->done_from & (1u << p)))
			return;
	finish_step(n, j, 0, NULL);
}

/* ---- algorithm auto ------------------------------------------------------- */

/* A lane whose uplink figure is older than this before the newest one
 * carried none of the latest steps: it is left out. */
#define LINK_FRESH_US 2000000u

/* This site's links, for its DONEs: the uplink rates of the lanes that
 * carried the latest steps, added up (they share the uplink), and the
 * longest of the shortest recent round trips to a peer. A figure not
 * measured again keeps its last value. */
static void measure_links(struct gg_node *n)
{
	struct gg_wire_links *own = &n->links[n->self];
	uint64_t newest = 0, sum = 0, rtt = 0;

	for (unsigned l = 0; l < n->nlanes; l++)
		newest = GG_MAX(newest, (uint64_t)load(&n->lanes[l].uplink_at_us));
	for (unsigned l = 0; l < n->nlanes; l++) {
		uint64_t at = load(&n->lanes[l].uplink_at_us);
		if (at && at + LINK_FRESH_US >= newest)
			sum += load(&n->lanes[l].uplink_bps);
	}
	for (unsigned p = 0; p < n->sites; p++) {
		uint64_t best = 0;
		for (unsigned l = 0; l < n->nlanes; l++) {
			uint64_t r = load(&n->lanes[l].rtt_min_us[p]);
			if (r && (!best || r < best))
				best = r;
		}
		rtt = GG_MAX(rtt, best);
	}
	if (sum)
		own->uplink_bytes_per_s = sum;
	if (rtt)
		own->rtt_us = (uint32_t)GG_MIN(rtt, (uint64_t)UINT32_MAX);
}

/* Bytes on the wire per element: as the frames sent so far had them
 * (zstd included, like the uplink figure), else the codec's own. */
static double elem_bytes(const struct gg_node *n)
{
	const struct gg_codec_params cp = n->frame_cfg.codec;
	uint64_t bytes = 0, raw = 0;
	const uint64_t elems = 1u << 20;

	for (unsigned l = 0; l < n->nlanes; l++)
		for (unsigned p = 0; p < n->sites; p++) {
			bytes += load(&n->lanes[l].stats.peers[p].data_out);
			raw += load(&n->lanes[l].stats.peers[p].raw_out);
		}
	if (raw >= elems * sizeof(float))
		return (double)bytes * sizeof(float) / (double)raw;
	if (gg_codec_encoded_bytes(&cp, elems, &bytes))
		return 4;
	return (double)bytes / (double)elems;
}

/* A job's first steps go direct, over every link, until the links were
 * measured and this many more steps ran: a window opens over round trips,
 * and where a step's bytes are a fraction of the bandwidth-delay product
 * that takes steps (at 5 Gbit/s and 300 ms, 64 MiB steps direct took 1.3
 * s for the first eight, 0.6 s after). Compared on cold links, direct
 * looks slower than it is, and ring, which leaves half of them idle,
 * keeps them cold. The last PROBE_FIRST of them are direct's first timed
 * steps. */
#define WARM_STEPS 8u
/* Steps of the algorithm not chosen for a job's size run now and then (at
 * 3 sites or more), to time it again: the links change, and its windows
 * may have been cold when it ran. PROBE_SOON steps after it ran or was
 * dropped, while each of its probes is more than PROBE_GAIN faster than
 * the ones before (against the model), beyond what steps vary by; twice
 * as many steps after each that is not, up to PROBE_EVERY, or more where
 * the other algorithm is so much slower that probing it that often would
 * cost more than PROBE_BUDGET of the job's time (probe_interval()). A
 * probe runs PROBE_FIRST steps, and more while each step gains
 * PROBE_STEP_GAIN (probe_goes_on()), up to PROBE_RUN. */
#define PROBE_SOON 4u
#define PROBE_EVERY 32u
#define PROBE_BUDGET 0.01
#define PROBE_EVERY_MAX 256u
#define PROBE_GAIN 0.2
#define PROBE_STEP_GAIN 0.1
#define PROBE_RUN 8u
#define PROBE_CLOSE 1.25
/* An algorithm is timed this many steps in a row before its factor is
 * trusted: the first step of one that did not run lately meets streams
 * whose congestion windows went cold. */
#define PROBE_FIRST 2u
/* Steps the model gives less time than this are set by what the model
 * leaves out (a step's fixed costs): they neither time an algorithm nor
 * probe one. */
#define MODEL_MIN_S 0.005
/* A job keeps its algorithm for a size unless the other is predicted this
 * much faster: times that close swap places with every measurement. */
#define SWITCH_GAIN 0.05

/* The slowest uplink and the longest round trip any site reported; false
 * while either is unknown. */
static bool worst_links(const struct gg_node *n, struct gg_wire_links *worst)
{
	*worst = (struct gg_wire_links){ 0 };
	for (unsigned s = 0; s < n->sites; s++) {
		const struct gg_wire_links *l = &n->links[s];
		if (l->uplink_bytes_per_s &&
		    (!worst->uplink_bytes_per_s || l->uplink_bytes_per_s < worst->uplink_bytes_per_s))
			worst->uplink_bytes_per_s = l->uplink_bytes_per_s;
		worst->rtt_us = GG_MAX(worst->rtt_us, l->rtt_us);
	}
	return worst->uplink_bytes_per_s && worst->rtt_us;
}

/* model_factor() over the steps after `after` up to `last`; 0 where none. */
static double factor_between(const struct gg_node *n, const struct job *j, enum gg_allreduce_algo a, double eb,
			     double up, double one_way, uint64_t after, uint64_t last)
{
	double f = 0;

	for (unsigned i = 0; i < j->timed_n[a]; i++) {
		const struct timed_step *t = &j->timed[a][i];
		double model = gg_ar_model_seconds(a, n->sites, t->count, eb, up, one_way);
		if (t->seq > after && t->seq <= last && model > 0 && (!f || t->seconds / model < f))
			f = t->seconds / model;
	}
	return f;
}

/* At the first site: the factor by which algorithm a's model time is
 * scaled, the least over its latest timed steps of measured time over
 * what the model says for the step's size on the links as measured now
 * (a slow step was slowed by something, a fast one was not). What the
 * model leaves out (losses when a site sends to all its peers at once, the
 * CPU, ring's pipelining, latency in the uplink figure) shows in the
 * factors. Both algorithms' factors come from the same figures, so where
 * both ran steps of a size, comparing them compares those steps' times,
 * however the figures moved since. 1 when none was timed. */
static double model_factor(const struct gg_node *n, const struct job *j, enum gg_allreduce_algo a, double eb,
			   double up, double one_way)
{
	double f = factor_between(n, j, a, eb, up, one_way, 0, UINT64_MAX);

	return f ? f : 1;
}

/* How long j's step took at the first site, from its submission to its
 * result there: what a probe's steps are compared by while the plan for
 * the next one is made. time_step() keeps the time to completion, once
 * every site has its result (by ring, the others have it later). */
static double result_seconds(const struct job *j)
{
	return j->has_result_us > j->submit_us ? (double)(j->has_result_us - j->submit_us) / 1e6 : 0;
}

/* At the first site, once j's step completed: how long it took, kept with
 * the latest of its algorithm. The steps before the job's first plan are
 * not, but for the last PROBE_FIRST (WARM_STEPS): they ran while the links
 * were being measured and warmed, on cold streams and into memory touched
 * for the first time, and would make direct, which they all go by, look
 * slower than it is for many steps to come. */
static void time_step(struct gg_node *n, struct job *j)
{
	struct gg_wire_links w;
	const enum gg_allreduce_algo a = j->run_algo;

	if (n->self != 0 || n->cfg->allreduce.algorithm != GG_ALLREDUCE_AUTO || n->sites <= 2 ||
	    (!j->using.has_plan && j->warm_steps + PROBE_FIRST < WARM_STEPS) || !worst_links(n, &w))
		return;
	double model = gg_ar_model_seconds(a, n->sites, j->wstep.count, elem_bytes(n), (double)w.uplink_bytes_per_s,
					   w.rtt_us / 2e6);
	const uint64_t now = gg_node_loop(n)->now_us;
	if (model < MODEL_MIN_S || now <= j->submit_us)
		return;
	const double seconds = (double)(now - j->submit_us) / 1e6;
	if (j->timed_n[a] == TIMED_KEPT)
		memmove(j->timed[a], j->timed[a] + 1, (TIMED_KEPT - 1) * sizeof(j->timed[a][0]));
	else
		j->timed_n[a]++;
	j->timed[a][j->timed_n[a] - 1] = (struct timed_step){ j->step->seq, j->wstep.count, seconds };
	j->timed_seq[a] = j->step->seq;
}

/* At the first site, as j's step has its result: whether it is a probe of
 * algorithm a to be followed by another, `chosen` the time predicted for
 * the algorithm chosen. A probe meets windows that went cold while a did
 * not run, and each step warms them for the next: after PROBE_FIRST steps
 * a probe goes on while each step is more than PROBE_STEP_GAIN faster than
 * the probe's best before it and within PROBE_CLOSE of `chosen`, up to
 * PROBE_RUN steps. */
static bool probe_goes_on(struct job *j, enum gg_allreduce_algo a, double chosen)
{
	const double t = result_seconds(j);

	if (!j->using.probe || j->run_algo != a) {
		j->probe_len = 0;
		return false;
	}
	const bool better = !j->probe_len || t < j->probe_best * (1 - PROBE_STEP_GAIN);
	j->probe_best = !j->probe_len ? t : GG_MIN(j->probe_best, t);
	j->probe_len++;
	return j->probe_len < PROBE_FIRST ||
	       (j->probe_len < PROBE_RUN && better && t > 0 && t < chosen * PROBE_CLOSE);
}

/* Steps until the next probe of an algorithm whose last probe did not
 * show it faster than before: twice as many as last time, up to
 * PROBE_EVERY; and at least as many as keep the probes' cost within
 * PROBE_BUDGET of the job's time, where `slower` is how many times the
 * chosen algorithm's time the probed one takes (its PROBE_FIRST steps
 * then cost that much more each), up to PROBE_EVERY_MAX. */
static unsigned probe_interval(unsigned last, double slower)
{
	unsigned every = GG_MIN(2 * GG_MAX(last, PROBE_SOON), PROBE_EVERY);
	double affordable = slower > 1 ? PROBE_FIRST * (slower - 1) / PROBE_BUDGET : 0;

	return affordable > every ? (unsigned)GG_MIN(affordable, (double)PROBE_EVERY_MAX) : every;
}

/* At the first site: the plan its DONE of j's step carries, from the
 * slowest uplink and the longest round trip any site reported, each
 * algorithm's model time scaled by its factor. Now and then the plan is a
 * probe: one step of the algorithm not chosen for the step's size. */
static void make_plan(struct gg_node *n, struct job *j)
{
	struct gg_wire_links worst;

	if (!worst_links(n, &worst) && n->sites > 2)
		return; /* not measured yet: the plan stays */
	if (n->sites > 2 && j->warm_steps < WARM_STEPS && ++j->warm_steps < WARM_STEPS)
		return;
	const double eb = elem_bytes(n), up = (double)worst.uplink_bytes_per_s, one_way = worst.rtt_us / 2e6;
	const double fd = model_factor(n, j, GG_ALLREDUCE_DIRECT, eb, up, one_way),
		     fr = model_factor(n, j, GG_ALLREDUCE_RING, eb, up, one_way);
	const uint64_t count = j->wstep.count, seq = j->step->seq;
	j->plan = (struct gg_wire_plan){
		.has_plan = true,
		.direct_max = gg_ar_direct_max_scaled(n->sites, eb, up, one_way, fd, fr),
		.links = worst,
	};
	if (n->sites <= 2)
		return;
	/* The size of this step keeps its algorithm unless the other gains. */
	const double td = fd * gg_ar_model_seconds(GG_ALLREDUCE_DIRECT, n->sites, count, eb, up, one_way);
	const double tr = fr * gg_ar_model_seconds(GG_ALLREDUCE_RING, n->sites, count, eb, up, one_way);
	if (j->using.has_plan && j->algo_count == count) {
		if (j->algo == GG_ALLREDUCE_DIRECT && tr > td * (1 - SWITCH_GAIN))
			j->plan.direct_max = GG_MAX(j->plan.direct_max, count);
		else if (j->algo == GG_ALLREDUCE_RING && td > tr * (1 - SWITCH_GAIN))
			j->plan.direct_max = GG_MIN(j->plan.direct_max, count - 1);
	}
	const enum gg_allreduce_algo other = count <= j->plan.direct_max ? GG_ALLREDUCE_RING : GG_ALLREDUCE_DIRECT;
	/* A probe of the other that ended (the step now is not one): was it
	 * faster than its steps before? */
	if (j->run_algo != other && j->timed_seq[other] > j->judged_seq[other]) {
		const double before = factor_between(n, j, other, eb, up, one_way, 0, j->judged_seq[other]),
			     now = factor_between(n, j, other, eb, up, one_way, j->judged_seq[other], UINT64_MAX);
		const double slower = other == GG_ALLREDUCE_DIRECT ? td / tr : tr / td;
		j->probe_every[other] = !before || now < before * (1 - PROBE_GAIN) ?
						PROBE_SOON :
						probe_interval(j->probe_every[other], slower);
		j->judged_seq[other] = j->timed_seq[other];
	}
	const unsigned every = j->probe_every[other] ? j->probe_every[other] : PROBE_SOON;
	const bool goes_on = probe_goes_on(j, other, other == GG_ALLREDUCE_DIRECT ? tr : td);
	if (GG_MIN(td, tr) >= MODEL_MIN_S && (goes_on || j->timed_n[other] < PROBE_FIRST ||
					      seq >= GG_MAX(j->timed_seq[other], j->chosen_seq) + every)) {
		j->plan.direct_max = other == GG_ALLREDUCE_DIRECT ? count : count - 1;
		j->plan.probe = true;
	}
}

/* The algorithm of a step of `count` elements of job j. */
static enum gg_allreduce_algo step_algo(const struct gg_node *n, const struct job *j, uint64_t count)
{
	if (n->cfg->allreduce.algorithm != GG_ALLREDUCE_AUTO)
		return n->cfg->allreduce.algorithm;
	return !j->using.has_plan || count <= j->using.direct_max ? GG_ALLREDUCE_DIRECT : GG_ALLREDUCE_RING;
}

/* The chunk of a step of `count` elements by `algo`: auto's choice
 * (gg_ar_auto_chunk()), else the configured one. */
static uint32_t step_chunk(const struct gg_node *n, enum gg_allreduce_algo algo, uint64_t count)
{
	if (n->cfg->allreduce.algorithm != GG_ALLREDUCE_AUTO)
		return n->chunk_elems;
	return gg_ar_auto_chunk(algo, n->sites, count, n->chunk_elems);
}

/* A chunk of `elems` elements in KiB of float32, as chunk_size counts it. */
static unsigned chunk_kib(uint32_t elems)
{
	return (unsigned)((uint64_t)elems * sizeof(float) / 1024);
}

/* Step st of job j goes by `algo` in chunks of `chunk` elements: logged for the job's first step, its
 * first step by a plan, and when a step of the same size as the one
 * before goes otherwise (the plan changed; steps of sizes either side of
 * the threshold alternating are no news, nor a probe). */
static void note_algo(struct gg_node *n, struct job *j, const struct gg_node_step *st, enum gg_allreduce_algo algo,
		      uint32_t chunk)
{
	const bool tell = !j->algo_told || (j->using.has_plan && !j->plan_told) ||
			  (algo != j->algo && st->count == j->algo_count);

	j->run_algo = algo;
	if (n->cfg->allreduce.algorithm != GG_ALLREDUCE_AUTO || j->using.probe)
		return; /* a probe is no news, nor the step after it going back */
	if (algo != j->algo || st->count != j->algo_count)
		j->chosen_seq = st->seq;
	j->algo = algo;
	j->algo_count = st->count;
	if (!tell)
		return;
	j->algo_told = true;
	j->plan_told = j->using.has_plan;
	if (!j->using.has_plan) {
		gg_log(GG_LOG_INFO, "algorithm", "job=%s step=%llu algorithm=%s count=%llu chunk_kib=%u reason=\"%s\"",
		       j->name, (unsigned long long)st->seq, gg_allreduce_algo_name(algo), (unsigned long long)st->count,
		       chunk_kib(chunk), "no plan yet: the links are measured as steps go direct");
		return;
	}
	const struct gg_wire_links *l = &j->using.links;
	const double eb = elem_bytes(n), up = (double)l->uplink_bytes_per_s, one_way = l->rtt_us / 2e6;
	/* The factors are the first site's, which made the plan. */
	char factors[64] = "";
	if (n->self == 0 && n->sites > 2)
		snprintf(factors, sizeof(factors), " factor_direct=%.3f factor_ring=%.3f",
			 model_factor(n, j, GG_ALLREDUCE_DIRECT, eb, up, one_way),
			 model_factor(n, j, GG_ALLREDUCE_RING, eb, up, one_way));
	/* direct at every size: "any", not the largest count there is */
	char up_to[24] = "any";
	if (j->using.direct_max != UINT64_MAX)
		snprintf(up_to, sizeof(up_to), "%llu", (unsigned long long)j->using.direct_max);
	gg_log(GG_LOG_INFO, "algorithm",
	       "job=%s step=%llu algorithm=%s count=%llu chunk_kib=%u direct_up_to=%s uplink_mbit=%.1f rtt_ms=%.3f "
	       "model_direct_ms=%.3f model_ring_ms=%.3f%s",
	       j->name, (unsigned long long)st->seq, gg_allreduce_algo_name(algo), (unsigned long long)st->count,
	       chunk_kib(chunk), up_to, up * 8 / 1e6, l->rtt_us / 1e3,
	       gg_ar_model_seconds(GG_ALLREDUCE_DIRECT, n->sites, st->count, eb, up, one_way) * 1e3,
	       gg_ar_model_seconds(GG_ALLREDUCE_RING, n->sites, st->count, eb, up, one_way) * 1e3, factors);
}

/* How long this site stood still (a frozen process, a suspended host)
 * since the coordinator's last turn ended, when that is over GG_STALL_US;
 * else 0. That is the time passed (CLOCK_BOOTTIME, which counts a
 * suspended host's sleep) less what the coordinator's thread worked
 * meanwhile: a long turn is not standing still, a wait for the loop is at
 * most a tick. Called on the coordinator's thread. */
static uint64_t stood_still_now(const struct gg_node *n)
{
	if (!n->coord_done_boot_us)
		return 0;
	uint64_t passed = gg_boottime_us() - n->coord_done_boot_us, worked = gg_thread_cpu_us() - n->coord_done_cpu_us;
	uint64_t still = passed > worked ? passed - worked : 0;

	return still > GG_STALL_US(n->cfg->transport.heartbeat_timeout_us) ? still : 0;
}

/* How long this site stood still since the step started here (this turn
 * included: its timers, which note it, run after the mail); 0 when it
 * did not. */
static uint64_t stood_still_in_step(const struct gg_node *n, const struct job *j)
{
	uint64_t still = stood_still_now(n);

	return still ? still : n->stall_end_us > j->submit_us ? n->stall_us : 0;
}

static void step_has_result(struct gg_node *n, struct job *j)
{
	if (n->test_freeze_at_result)
		return;
	if (!j->has_result) {
		/* The others may have taken a site that stood still for lost
		 * and failed the step meanwhile: a DONE now, or a result
		 * completed on DONEs that waited for it to run again, could
		 * split the sites. Failed instead, the step fails everywhere:
		 * no site can complete it without this site's DONE. */
		uint64_t still = stood_still_in_step(n, j);
		if (still) {
			char hb[32];
			fail_step_code(n, j, GG_ERR_SITE, "step %llu of job '%s': site %s stood still for %.1f s "
				       "(heartbeat_timeout %s) before it had the result: the other sites may have "
				       "taken it for lost and failed the step", (unsigned long long)j->step->seq,
				       j->name, n->names[n->self], (double)still / 1e6,
				       gg_format_duration(n->cfg->transport.heartbeat_timeout_us, hb, sizeof(hb)));
			return;
		}
		j->has_result = true;
		j->has_result_us = gg_node_loop(n)->now_us;
		if (n->cfg->allreduce.algorithm == GG_ALLREDUCE_AUTO) {
			measure_links(n);
			if (n->self == 0)
				make_plan(n, j);
		}
		for (unsigned p = 0; p < n->sites; p++)
			if (p != n->self && atomic_load(&n->ready[p]))
				j->done_may_reach |= 1u << p;
		if (n->test_drop_done) {
			for (unsigned p = 0; p < n->sites; p++)
				if (p != n->self && p + 1 != n->test_drop_done)
					send_done(n, j, (int)p);
			n->test_drop_done = 0;
		} else {
			send_done(n, j, -1);
		}
	}
	maybe_complete(n, j);
}

/* The lanes acknowledge and let go what peers sent of step `seq` of `job`,
 * which will not run here. */
static void forget_step(struct gg_node *n, const char *job, uint64_t seq)
{
	struct mail f = { .base.type = M_FORGET, .seq = seq };

	snprintf(f.u.job, sizeof(f.u.job), "%s", job);
	post_lanes(n, &f, 0);
}

/* Whether step `seq` of the job, not started here, failed already at
 * another site, which said so (ABORT) or whose ranks of the job are gone
 * (END): its enum gg_errc code and *reason; 0 when not. */
static int failed_elsewhere(const struct job *j, uint64_t seq, const char **reason)
{
	for (unsigned a = 0; a < ABORTS_KEPT; a++) {
		if (j->aborted[a].lo && j->aborted[a].lo <= seq && seq <= j->aborted[a].hi) {
			*reason = j->aborted[a].reason;
			return j->aborted[a].code;
		}
	}
	if (j->ended_by && seq > j->ended_done) {
		*reason = seq <= j->ended_last ? j->ended_reason : j->end_reason;
		return seq <= j->ended_last ? j->ended_code : GG_ERR_RANK;
	}
	return 0;
}

int gg_node_fail_unstarted(struct gg_node *n, const char *job, uint64_t seq, char *reason, size_t reason_size)
{
	struct job *j = find_job(n, job, false);
	const char *why;
	int code;

	/* Not here yet, but over at a site that restarted or whose ranks of
	 * it went: made, it is ended. */
	const struct name_runs *r = j ? NULL : name_runs(n, job, false);
	if (r && (r->lost_by || r->end_from || r->abort_from))
		j = find_job(n, job, true);
	if (!j || j->step || seq <= j->last_seq || !(code = failed_elsewhere(j, seq, &why)))
		return 0;
	snprintf(reason, reason_size, "%s", why);
	/* As gg_node_submit() would have it; and what the lanes hold of it
	 * from peers that started it is acknowledged and let go. */
	j->last_seq = seq;
	j->active_us = gg_node_loop(n)->now_us;
	step_failed_here(n, j, seq, code, reason);
	forget_step(n, j->name, seq);
	return code;
}

/* A new run of a name whose run ended here: a peer that still runs the
 * old one refuses it once the new run's step-1 frames reach it
 * (rerun_seen()), but by ring only the next site gets this site's, and
 * only when the shard this site starts has elements (under 32 elements a
 * site, shards may be empty): it sends nothing else before that site's
 * frames come. A peer this site sends none to, whose run that took part in
 * the one that ended here is not known over there (no END from it), is
 * returned (-1: none), so that the step is refused here. */
static int old_run_unheard(struct gg_node *n, const struct job *j, enum gg_allreduce_algo algo, uint64_t count,
			   uint32_t chunk)
{
	const struct name_runs *r = name_runs(n, j->name, false);

	if (!r || !r->ended_here || algo != GG_ALLREDUCE_RING)
		return -1;
	const struct gg_ar_config ring = { .sites = n->sites, .self = n->self, .algo = GG_ALLREDUCE_RING,
					   .count = count, .chunk_elems = chunk };
	const struct gg_ar_chunk_id first = { GG_AR_SCATTER, (uint8_t)gg_ar_ring_start(n->self, n->sites), 0 };
	uint64_t offset, elems;
	const unsigned reached = gg_ar_chunk_range(&ring, &first, &offset, &elems) ? gg_ar_ring_next(n->self, n->sites)
										   : n->self;
	for (unsigned p = 0; p < n->sites; p++)
		if (p != n->self && p != reached && r->left[p] && !run_within(r->left[p], r->over[p]))
			return (int)p;
	return -1;
}

int gg_node_submit(struct gg_node *n, struct gg_node_step *st, char *err, size_t err_size)
{
	struct job *j;

	if (n->shutting_down)
		return gg_errf(err, err_size, -ESHUTDOWN, "the gateway is shutting down");
	if (!st->job[0] || st->count == 0)
		return gg_errf(err, err_size, -EINVAL, "a step needs a job name and at least one element");
	if (st->device && !HAVE_CUDA)
		return gg_errf(err, err_size, -EINVAL, "the gateway was built without CUDA: a step in GPU memory");
	/* max_message bounds the tensor as the ranks hold it (gradgate.h). */
	uint64_t esize = st->dtype == GG_WIRE_BF16 ? 2 : 4;
	if (st->count > n->cfg->limits.max_message_bytes / esize)
		return gg_errf(err, err_size, -E2BIG, "%llu elements of %llu bytes exceed [limits] max_message (%llu bytes)",
			       (unsigned long long)st->count, (unsigned long long)esize,
			       (unsigned long long)n->cfg->limits.max_message_bytes);
	if ((st->count + n->chunk_elems - 1) / n->chunk_elems > UINT32_MAX)
		return gg_errf(err, err_size, -EINVAL, "%llu elements make too many chunks for one step",
			       (unsigned long long)st->count);
	j = find_job(n, st->job, true);
	if (!j)
		return gg_errf(err, err_size, -ENOSPC,
			       "too many jobs (at most %d): each has ranks connected here or a step in progress",
			       MAX_JOBS);
	if (j->step) {
		gg_errf(err, err_size, -EINVAL, "job '%s' already has step %llu in progress", j->name,
		     (unsigned long long)j->step->seq);
		return -EBUSY;
	}
	if (st->seq <= j->last_seq)
		return gg_errf(err, err_size, -EINVAL,
			       "job '%s': step %llu comes after step %llu (a job name is one training run; "
			       "start a new run under a new job name)", j->name,
			    (unsigned long long)st->seq, (unsigned long long)j->last_seq);

	const enum gg_allreduce_algo algo = step_algo(n, j, st->count);
	const uint32_t chunk = step_chunk(n, algo, st->count);
	struct gg_wire_step ws = { .run = j->run, .step = st->seq, .count = st->count, .tensor_id = st->tensor_id,
				   .dtype = st->dtype };
	snprintf(ws.job, sizeof(ws.job), "%s", st->job);
	ws.fingerprint = gg_node_fingerprint(n->cfg, &ws, (uint8_t)algo, chunk);
	struct feedback_slot *fb = NULL;
	if (n->cfg->compression.error_feedback && gg_codec_is_lossy(n->cfg->compression.codec)) {
		/* Its message does not say "step N of job J": what the ranks read
		 * names them, and the remedy must fit in their message. */
		int rc = feedback_for(n, st->job, st->tensor_id, st->count, st->device, &fb, err, err_size);
		if (rc)
			return rc;
	}
	note_algo(n, j, st, algo, chunk);
	j->run_chunk = chunk;
	const uint64_t now = gg_node_loop(n)->now_us;
	j->step = st;
	j->has_result = false;
	j->done_may_reach = 0;
	j->plan = (struct gg_wire_plan){ 0 };
	j->parts_done = 0;
	j->done_from = 0;
	j->asked_us = 0;
	j->wstep = ws;
	j->last_seq = st->seq;
	j->active_us = now;
	j->submit_us = now;
	j->deadline_us = now + n->cfg->transport.step_timeout_us;
	j->timeout_us = n->cfg->transport.step_timeout_us;
	if (st->deadline_us && st->deadline_us < j->deadline_us) {
		j->deadline_us = st->deadline_us;
		j->timeout_us = st->timeout_us ? st->timeout_us : st->deadline_us - now;
	}
	const char *reason;
	int code = failed_elsewhere(j, st->seq, &reason);
	if (code) {
		finish_step(n, j, code, reason);
		return 0;
	}
	int old = st->seq == 1 ? old_run_unheard(n, j, algo, st->count, chunk) : -1;
	if (old >= 0) {
		fail_step_code(n, j, GG_ERR_REFUSED, "step 1 of job '%s': site %s still runs it, as far as site %s "
			       "heard (the END of its run that took part in the one that ended here has not come): a job "
			       "name is one training run; use a new name, or wait until the old run's ranks are all gone",
			       j->name, n->names[old], n->names[n->self]);
		return 0;
	}
	struct mail m = { .base.type = M_START, .slot = (unsigned)(j - n->jobs), .seq = st->seq,
			  .u.start = { .wstep = ws, .input = st->input, .result = st->result, .device = st->device,
				       .feedback = fb, .algo = algo,
				       .chunk_elems = chunk, .deadline_us = j->deadline_us, .timeout_us = j->timeout_us,
				       .gather = st->gather, .deliver = st->deliver, .arg = st->arg } };
	/* The peers' runs over, or that took part in a run of the name that
	 * ended here: a frame of theirs that comes late is of no step here. */
	const struct name_runs *r = name_runs(n, j->name, false);
	for (unsigned p = 0; r && p < n->sites; p++) {
		m.runs[p] = r->over[p];
		run_raise(&m.runs[p], r->left[p]);
		if (st->seq == 1 && r->ended_here && !m.runs[p] && p != n->self)
			m.u.start.guess |= 1u << p;
	}
	/* A lane that never starts its part would leave the step without a
	 * deadline: without memory for every start, the step fails now. */
	if (post_lanes(n, &m, 0) != all_lanes(n))
		fail_step_code(n, j, GG_ERR_NOMEM, "step %llu of job '%s': the gateway of site %s is out of memory",
			       (unsigned long long)st->seq, j->name, n->names[n->self]);
	return 0;
}

static struct job *job_of(struct gg_node *n, unsigned slot, uint64_t seq)
{
	struct job *j = slot < MAX_JOBS ? &n->jobs[slot] : NULL;

	return j && j->used && j->step && j->step->seq == seq ? j : NULL;
}

/* True when job `name` ended here recently (its END is kept for peers
 * that come back). */
static bool ended_here(const struct gg_node *n, const char *name)
{
	for (unsigned e = 0; e < ENDS_KEPT; e++)
		if (n->ended[e].name[0] && !strcmp(n->ended[e].name, name))
			return true;
	return false;
}

/* How dear a record of name_runs is to keep: free, of a name with no
 * ranks here, of one whose ranks are here. */
static int name_runs_worth(const struct name_runs *e)
{
	return !e->job[0] ? 0 : e->open ? 2 : 1;
}

/* The coordinator's record of a job name's runs; made when `create`,
 * taking the free entry, or the one used longest ago of the names with no
 * ranks here (never one of a name with ranks here: there is room for all
 * of those besides NAME_RUNS_KEPT others). */
static struct name_runs *name_runs(struct gg_node *n, const char *job, bool create)
{
	struct name_runs *r = NULL;

	for (unsigned i = 0; i < n->name_runs_cap; i++) {
		struct name_runs *e = &n->name_runs[i];
		if (e->job[0] && !strcmp(e->job, job)) {
			e->used_us = gg_node_loop(n)->now_us;
			return e;
		}
		if (!r || name_runs_worth(e) < name_runs_worth(r) ||
		    (name_runs_worth(e) == name_runs_worth(r) && e->used_us < r->used_us))
			r = e;
	}
	if (!create || r->open)
		return NULL;
	memset(r, 0, sizeof(*r));
	snprintf(r->job, sizeof(r->job), "%s", job);
	r->used_us = gg_node_loop(n)->now_us;
	return r;
}

/* Peer `peer` spoke of `job` in its run `run` (a DONE, ABORT or END, or its
 * frames, as a lane saw them): a site starts a run of a name only once its
 * run before ended, so the runs before this one are over there. */
static void peer_run_heard(struct gg_node *n, const char *job, unsigned peer, uint64_t run)
{
	struct name_runs *r = name_runs(n, job, true);

	if (!r)
		return;
	run_raise(&r->seen[peer], run);
	run_raise(&r->over[peer], run - 1);
}

/* The name's ranks here are gone, or come: what was kept of the peers'
 * runs that ended meanwhile is of no job here. */
static void name_set_open(struct gg_node *n, const char *job, bool open)
{
	struct name_runs *r = name_runs(n, job, open);

	if (r) {
		if (open && !r->open)
			r->opened_us = gg_monotonic_us();
		r->open = open;
		r->lost_by = 0;
		r->end_from = 0;
		r->abort_from = 0;
	}
}

void gg_node_job_opened(struct gg_node *n, const char *job)
{
	name_set_open(n, job, true);
}

/* Whether a word of run `run` of `job` from `peer` comes after that run is
 * over here: a run here must not take an old run's DONE or END for its
 * own, nor an ABORT once the old run ended there (its END said how its
 * steps ended). An ABORT of a peer's run still going there passes, though
 * that run's part in a run here ended: it may refuse a new run here
 * (rerun_seen()). */
static bool peer_run_stale(struct gg_node *n, const char *job, unsigned peer, uint64_t run, bool abort)
{
	const struct name_runs *r = name_runs(n, job, false);

	return r && (run_within(run, r->over[peer]) || (!abort && run_within(run, r->left[peer])));
}

/* Peer `peer` restarted: its new instance's runs count on from its own
 * clock, and what was known of the old one's says nothing of them. */
static void forget_peer_runs(struct gg_node *n, unsigned peer)
{
	for (unsigned i = 0; i < n->name_runs_cap; i++)
		n->name_runs[i].seen[peer] = n->name_runs[i].over[peer] = n->name_runs[i].left[peer] = 0;
	struct mail f = { .base.type = M_PEER_RESET, .peer = peer };
	post_lanes(n, &f, 0);
}

static void on_abort(struct gg_node *n, unsigned from, const struct gg_wire_msg *m)
{
	struct job *j = find_job(n, m->u.abort.job, false);

	/* A run over at the peer said how its steps ended in its END. */
	if (peer_run_stale(n, m->u.abort.job, from, m->u.abort.run, true))
		return;
	/* A job over here stays over: recording the abort would make it anew
	 * and drop the END that a peer cut off while it ended still needs.
	 * But where new ranks of the name are connected, yet to announce
	 * their first step, a refusal of step 1 is of the new run they take
	 * part in (a site still runs the old one): kept for their job while
	 * they are connected, which fails its step 1 when it is made. An
	 * old run's ABORTs, sent again once a stream came back, are not. */
	if (!j && ended_here(n, m->u.abort.job)) {
		struct name_runs *r = name_runs(n, m->u.abort.job, false);
		if (r && r->open && m->u.abort.first == 1 && -(int)m->u.abort.code == GG_ERR_REFUSED) {
			r->abort_from = from + 1;
			r->abort = m->u.abort;
			run_raise(&r->seen[from], m->u.abort.run);
		}
		return;
	}
	if (!j && !(j = find_job(n, m->u.abort.job, true)))
		return;
	aborted_there(n, j, from, &m->u.abort);
}

/* Site `from`'s ABORT (`abort`) of steps of job j. */
static void aborted_there(struct gg_node *n, struct job *j, unsigned from, const struct gg_wire_steps *abort)
{
	const char *site = n->names[from];
	const uint64_t lo = abort->first, hi = abort->last;
	char msg[GG_NODE_ERROR_MAX];

	peer_run_heard(n, j->name, from, abort->run);
	if (lo == hi)
		snprintf(msg, sizeof(msg), "site %s aborted step %llu of job '%s': %s", site, (unsigned long long)lo,
			 j->name, abort->reason);
	else
		snprintf(msg, sizeof(msg), "site %s aborted steps %llu to %llu of job '%s': %s", site,
			 (unsigned long long)lo, (unsigned long long)hi, j->name, abort->reason);
	if (j->step && !j->ending && lo <= j->step->seq && j->step->seq <= hi)
		finish_step(n, j, -(int)abort->code, msg);
	/* Steps of the run that have not started here fail when they do. The
	 * frames the lanes hold for them would pin the peer's window for
	 * good: they go now. */
	uint64_t from_seq = GG_MAX(lo, j->last_seq + 1);
	if (from_seq > hi)
		return;
	unsigned a = 0;
	for (unsigned k = 0; k < ABORTS_KEPT; k++) {
		if (j->aborted[k].lo == from_seq && j->aborted[k].hi >= hi)
			return; /* a copy: each lane sends it */
		if (j->aborted[k].lo < j->aborted[a].lo)
			a = k;
	}
	j->aborted[a].lo = from_seq;
	j->aborted[a].hi = hi;
	j->aborted[a].code = -(int)abort->code;
	snprintf(j->aborted[a].reason, sizeof(j->aborted[a].reason), "%s", msg);
	for (uint64_t seq = from_seq; seq <= hi && seq < from_seq + 64; seq++)
		forget_step(n, j->name, seq);
	char safe[LOG_VALUE_MAX];
	if (peer_log_now(n->logs, from, LOG_ABORT_RECORDED, gg_node_loop(n)->now_us))
		gg_log(GG_LOG_INFO, "abort_recorded", "job=%s step=%llu last_step=%llu reason=\"%s\"", j->name,
		       (unsigned long long)from_seq, (unsigned long long)hi,
		       gg_escape(safe, sizeof(safe), msg, strlen(msg)));
}

/* The job is over at site `from`: steps up to last_done completed there,
 * so they complete here too; those after it up to `last` failed there with
 * `code` and `failed`; later ones cannot complete (GG_ERR_RANK, `gone`).
 * `said`: the site said so (its END), rather than this site judging so
 * (a restart, with this site's own progress as last_done). */
static void job_ended_at(struct gg_node *n, struct job *j, unsigned from, bool said, uint64_t last_done,
			 uint64_t last, int code, const char *failed, const char *gone)
{
	/* By its END it completed the step in progress here, so it held
	 * every site's DONE (its own may be lost, or not sent again once it
	 * forgot the job). A restarted site's old gateway is gone for good:
	 * its DONE is taken as given, but no other site's (on_peer_restart()). */
	if (j->step && !j->ending && j->step->seq <= last_done) {
		if (said)
			all_done(n, j);
		else
			j->done_from |= 1u << from;
		maybe_complete(n, j);
	}
	/* A second END from a site whose run ended there already, with fewer
	 * steps done (copies of one END say the same): a new run of the name
	 * there ended, which this site refused (rerun_seen). How the old run
	 * ended there stays as its own END said, and a next new run there is
	 * refused again. */
	if ((j->ended_by & (1u << from)) && last_done < j->ended_done) {
		j->rerun_refused = false;
		return;
	}
	if (j->ended_by && last_done >= j->ended_done) {
		/* A copy, or a site that ended later than one before: how the
		 * steps ended stays, but its run is over there too, so that
		 * its step 1 of a new run is refused (rerun_seen()) whichever
		 * site's END came first. */
		j->ended_by |= 1u << from;
		return;
	}
	j->ended_by |= 1u << from;
	j->ended_done = last_done;
	j->ended_last = GG_MAX(last, last_done);
	j->ended_code = code;
	snprintf(j->ended_reason, sizeof(j->ended_reason), "%s", failed);
	snprintf(j->end_reason, sizeof(j->end_reason), "%s", gone);
	if (!j->step || j->ending || j->step->seq <= j->ended_done)
		return;
	if (j->step->seq <= j->ended_last)
		fail_step_code(n, j, j->ended_code, "step %llu of job '%s': %s", (unsigned long long)j->step->seq,
			       j->name, j->ended_reason);
	else
		fail_step_code(n, j, GG_ERR_RANK, "step %llu of job '%s': %s", (unsigned long long)j->step->seq, j->name,
			       j->end_reason);
}

/* END: the job is over at site `from`, its ranks there are gone. */
static void on_end(struct gg_node *n, unsigned from, const struct gg_wire_msg *m)
{
	/* A job unknown here has no step to fail: its ranks here are gone
	 * (and this site forgot it), not come yet, or yet to announce their
	 * first step. */
	struct job *j = find_job(n, m->u.end.job, false);

	/* An END of a run that is over here already (its END came, or this
	 * site's run it took part in ended) says nothing of the run here now,
	 * which may be a new one: an END sent again once a stream came back
	 * must not end it, nor stand for its DONE. */
	const bool stale = peer_run_stale(n, m->u.end.job, from, m->u.end.run, false);
	struct name_runs *r = name_runs(n, m->u.end.job, true);
	/* Nor may an END of a run never heard of here that ended before this
	 * site's ranks of the name came (by its age, which leaves out its
	 * time on the way, so it is never taken for older than it is): one
	 * sent again once a stream came back, of the run before theirs. */
	const bool before_ranks =
		r && r->open && !run_within(m->u.end.run, r->seen[from]) &&
		m->u.end.age_ms > (gg_monotonic_us() - r->opened_us) / 1000 + 1;
	if (r) {
		run_raise(&r->seen[from], m->u.end.run);
		run_raise(&r->over[from], m->u.end.run);
	}
	if (!stale && peer_log_now(n->logs, from, LOG_PEER_JOB_ENDED, gg_node_loop(n)->now_us))
		gg_log(GG_LOG_INFO, "peer_job_ended", "site=%s job=%s steps_done=%llu last_step=%llu age_ms=%u here=%s",
		       n->names[from], m->u.end.job, (unsigned long long)m->u.end.first,
		       (unsigned long long)m->u.end.last, m->u.end.age_ms,
		       before_ranks ? "later_ranks" : j ? "running" : r && r->open ? "ranks" : "none");
	if ((stale || before_ranks) && j)
		return;
	if (!j) {
		/* None of its steps can complete anywhere now: the frames peers
		 * sent ahead for it are let go (and acknowledged). */
		struct mail f = { .base.type = M_FORGET_JOB, .sites = 1u << from, .run = m->u.end.run };
		snprintf(f.u.job, sizeof(f.u.job), "%s", m->u.end.job);
		post_lanes(n, &f, 0);
		/* Its ranks here, connected but with no step announced, would
		 * wait out their first step's deadline: kept, their step fails
		 * at once. The END with the fewest steps done says most. */
		if (r && r->open && !stale && !before_ranks && (!r->end_from || m->u.end.first < r->end.first)) {
			r->end_from = from + 1;
			r->end = m->u.end;
		}
		return;
	}
	ended_there(n, j, from, &m->u.end);
}

/* Site `from`'s END of the job (`end`), as job_ended_at() takes it. */
static void ended_there(struct gg_node *n, struct job *j, unsigned from, const struct gg_wire_steps *end)
{
	char failed[GG_NODE_ERROR_MAX], gone[GG_NODE_ERROR_MAX];

	snprintf(failed, sizeof(failed), "site %s failed it and ended job '%s': %s", n->names[from], j->name,
		 end->reason);
	/* An END with no failed steps says why the ranks went (a gateway
	 * shutting down, a rank that left), or just that they did. */
	const char *why = -(int)end->code == GG_ERR_RANK ? end->reason : "its ranks there are gone";
	if (end->last)
		snprintf(gone, sizeof(gone), "site %s ended job '%s' after step %llu: %s", n->names[from], j->name,
			 (unsigned long long)end->last, why);
	else
		snprintf(gone, sizeof(gone), "site %s ended job '%s' before its first step: %s", n->names[from],
			 j->name, why);
	job_ended_at(n, j, from, true, end->first, end->last, -(int)end->code, failed, gone);
}

/* Why a peer's restart ended a job here: after `last` steps done here
 * (0: none). */
static void restart_reason(const struct gg_node *n, unsigned peer, const char *job, uint64_t last, char *why,
			   size_t size)
{
	if (last)
		snprintf(why, size, "site %s restarted after step %llu of job '%s': its ranks there lost their sessions",
			 n->names[peer], (unsigned long long)last, job);
	else
		snprintf(why, size, "site %s restarted before any step of job '%s' completed: its ranks there lost "
			 "their sessions", n->names[peer], job);
}

/* Whether the peer's run of the name was going on there: heard of (its
 * data, or an ABORT), and not a run of the name over before. */
static bool run_going_on(const struct name_runs *r, unsigned peer)
{
	return r && r->seen[peer] && !run_within(r->seen[peer], r->over[peer]) &&
	       !run_within(r->seen[peer], r->left[peer]);
}

/* A restarted gateway closed its ranks' sessions: the jobs it took part in
 * are over there, and their later steps fail at once rather than each wait
 * out its deadline.
 *
 * The step in progress completes here if its result is whole here: the
 * old gateway is gone for good, so it can neither fail the step nor need
 * its result any more, and every other site that holds the result decides
 * the same (one that does not fails the step, and since this site said
 * DONE only with the result whole, no site can complete without the
 * others' DONE). Failing it instead would split the sites when the old
 * gateway's DONE reached some of them before it died and not others. */
static void on_peer_restart(struct gg_node *n, unsigned peer)
{
	char why[GG_NODE_ERROR_MAX];

	for (unsigned i = 0; i < MAX_JOBS; i++) {
		struct job *j = &n->jobs[i];
		if (!j->used)
			continue;
		uint64_t last = done_here(j) ? j->step->seq : j->done_seq;
		/* With no step done here, the job ran there only if its old run
		 * was going on: otherwise its ranks there may still come, to the
		 * new gateway, for their first step. (By ring a site hears only
		 * the one before it: where that one's ranks are late, nothing of
		 * the run there came here, and the job goes on; its step in
		 * progress fails below.) */
		if (!last && !run_going_on(name_runs(n, j->name, false), peer))
			continue;
		restart_reason(n, peer, j->name, last, why, sizeof(why));
		job_ended_at(n, j, peer, false, last, UINT64_MAX, GG_ERR_SITE, why, why);
	}
	/* A name whose run went on there with no job of it here yet, though
	 * its ranks here are connected (yet to announce their first step):
	 * the job is ended as it is made. */
	for (unsigned i = 0; i < n->name_runs_cap; i++) {
		struct name_runs *r = &n->name_runs[i];
		if (r->job[0] && r->open && run_going_on(r, peer) && !find_job(n, r->job, false))
			r->lost_by |= 1u << peer;
	}
	/* A step with no result here (a first step, too) needed the old
	 * gateway's part: lost with it. */
	for (unsigned i = 0; i < MAX_JOBS; i++) {
		struct job *j = &n->jobs[i];
		if (j->used && j->step && !j->has_result)
			fail_step_code(n, j, GG_ERR_SITE, "step %llu of job '%s': site %s restarted and lost the step",
				       (unsigned long long)j->step->seq, j->name, n->names[peer]);
	}
}

static void on_done(struct gg_node *n, unsigned from, const struct gg_wire_msg *m)
{
	struct job *j = find_job(n, m->u.done.job, false);

	if (peer_run_stale(n, m->u.done.job, from, m->u.done.run, false))
		return;
	if (j)
		peer_run_heard(n, j->name, from, m->u.done.run);
	if (m->u.done.links.uplink_bytes_per_s)
		n->links[from].uplink_bytes_per_s = m->u.done.links.uplink_bytes_per_s;
	if (m->u.done.links.rtt_us)
		n->links[from].rtt_us = m->u.done.links.rtt_us;

	if (j && m->u.done.asks)
		answer_completed(n, j, from, m->u.done.step);
	/* A DONE for a step not in progress here is stale: this site failed
	 * or completed it (which needed this DONE, so it was a copy). */
	if (!j || !j->step || j->step->seq != m->u.done.step)
		return;
	j->done_from |= 1u << from;
	if (m->u.done.completed)
		all_done(n, j);
	/* The first site's plan, from its DONE, or as a site that completed
	 * the step (and so heard that DONE) passes it on. */
	if ((from == 0 || m->u.done.completed) && n->self != 0 && n->cfg->allreduce.algorithm == GG_ALLREDUCE_AUTO)
		j->plan = m->u.done.plan;
	maybe_complete(n, j);
}

/* A new stream to `peer` may carry a DONE or ABORT a lost one did not: of
 * a step in progress, or of one this site completed or failed while the
 * peer may still wait for it. */
static void resend_done(struct gg_node *n, unsigned peer)
{
	const uint64_t now = gg_node_loop(n)->now_us;

	for (unsigned i = 0; i < MAX_JOBS; i++) {
		struct job *j = &n->jobs[i];
		uint8_t buf[CTRL_MSG_MAX];
		if (!j->used)
			continue;
		/* The last step completed here may still be in progress there,
		 * even with a later one in progress here. */
		if (j->done_seq && now - j->done_us < n->cfg->transport.step_timeout_us)
			send_to_peers(n, (int)peer, buf,
				      gg_wire_encode_completed(buf, sizeof(buf), j->name, j->run, j->done_seq,
							       &n->links[n->self], &j->done_plan),
				      true);
		/* Also while a step completed here ends (its lanes letting go):
		 * done_seq says so only once they have, and a stream that came
		 * back meanwhile may have lost the DONE, with no other chance. */
		if (done_here(j)) {
			if (j->ending) /* completed, its lanes letting go: say so */
				answer_completed(n, j, peer, j->step->seq);
			else
				send_done(n, j, (int)peer);
			j->done_may_reach |= 1u << peer;
		}
		if (j->failed_lo && now - j->failed_us < n->cfg->transport.step_timeout_us)
			send_abort(n, (int)peer, j->name, j->run, j->failed_lo, j->failed_hi, j->failed_code,
				   j->failed_reason);
	}
	for (unsigned e = 0; e < ENDS_KEPT; e++)
		if (n->ended[e].name[0] && now - n->ended[e].us < n->cfg->transport.step_timeout_us)
			send_end(n, (int)peer, &n->ended[e]);
}

/* A lane took step-1 DATA of `name` from `peer` for a re-send, as steps of
 * the job ran here. Where the peer said the job ended there (END), it is
 * a new run of the name while this site's run goes on: README and
 * gradgate.h promise it is refused, saying so, rather than left to wait
 * out its deadline. Every site fails its step 1 (an ABORT of step 1 is
 * moot where the old run is past it). */
static void rerun_seen(struct gg_node *n, unsigned peer, const char *name)
{
	struct job *j = find_job(n, name, false);
	char reason[GG_NODE_ERROR_MAX];

	if (!j || !(j->ended_by & (1u << peer)) || j->rerun_refused || !j->last_seq)
		return;
	j->rerun_refused = true;
	/* Its peers name the job as they pass it on: the advice at the end
	 * must fit the ranks' 256 bytes with long names too. */
	snprintf(reason, sizeof(reason),
		 "site %s still runs it (at step %llu): a job name is one training run; use a new name, or wait "
		 "until the old run's ranks are all gone", n->names[n->self], (unsigned long long)j->last_seq);
	if (peer_log_now(n->logs, peer, LOG_RERUN_REFUSED, gg_node_loop(n)->now_us))
		gg_log(GG_LOG_WARN, "rerun_refused", "site=%s job=%s reason=\"%s\"", n->names[peer], j->name, reason);
	send_abort(n, -1, j->name, j->run, 1, 1, GG_ERR_REFUSED, reason);
}

static void coordinator_mail(struct gg_node *n)
{
	for (struct gg_mail *g = gg_mailbox_take(&n->inbox), *next; g; g = next) {
		struct mail *m = (struct mail *)g;
		struct job *j;
		next = g->next;
		switch ((enum mail_type)g->type) {
		case M_PART_DONE:
			if ((j = job_of(n, m->slot, m->seq)) && !j->ending && ++j->parts_done == n->nlanes)
				step_has_result(n, j);
			break;
		case M_PART_FAILED:
			if ((j = job_of(n, m->slot, m->seq)))
				fail_step_code(n, j, m->code, "%s", m->u.text);
			break;
		case M_ENDED:
			if ((j = job_of(n, m->slot, m->seq)) && j->ending && ++j->ended == n->nlanes)
				step_ended(n, j);
			break;
		case M_CONTROL:
			if (m->u.msg.type == GG_WIRE_ABORT)
				on_abort(n, m->peer, &m->u.msg);
			else if (m->u.msg.type == GG_WIRE_END)
				on_end(n, m->peer, &m->u.msg);
			else
				on_done(n, m->peer, &m->u.msg);
			break;
		case M_RESTARTED:
			/* Every lane that had streams to it tells; the first says it. */
			if (n->instance_id[m->peer] == m->u.instance_id)
				break;
			n->instance_id[m->peer] = m->u.instance_id;
			on_peer_restart(n, m->peer);
			forget_peer_runs(n, m->peer);
			break;
		case M_PEER_RUN:
			peer_run_heard(n, m->u.job, m->peer, m->run);
			break;
		case M_STREAM_READY:
			atomic_store_explicit(&n->ever_up[m->peer], true, memory_order_relaxed);
			resend_done(n, m->peer);
			break;
		case M_STREAM_DOWN:
			snprintf(n->down_reason[m->peer], sizeof(n->down_reason[m->peer]), "%.250s", m->u.text);
			break;
		case M_RERUN:
			rerun_seen(n, m->peer, m->u.job);
			break;
		default:
			break;
		}
		free(m);
	}
}

/* Why `peer` has no stream up: its last stream's reason or, when none ever
 * came up, what this site's dial setting leaves to the peer. */
static const char *down_reason(const struct gg_node *n, unsigned peer, char *buf, size_t size)
{
	const struct gg_peer_config *pc = gg_config_peer(n->cfg, n->names[peer]);

	if (n->down_reason[peer][0])
		return n->down_reason[peer];
	if (pc && pc->dial == GG_DIAL_IN)
		snprintf(buf, size, "never connected: this site's [[peers]] dial for %s is \"in\", so %s must dial it "
			 "(dial = \"out\" or \"both\" there)", n->names[peer], n->names[peer]);
	else
		snprintf(buf, size, "never connected");
	return buf;
}

unsigned gg_node_unreachable(const struct gg_node *n, char *buf, size_t size)
{
	char why[GG_NODE_ERROR_MAX];
	unsigned count = 0;
	size_t len = 0;

	buf[0] = '\0';
	for (unsigned p = 0; p < n->sites; p++) {
		if (p == n->self || atomic_load(&n->ready[p]))
			continue;
		if (len < size)
			len += (size_t)snprintf(buf + len, size - len, "%ssite %s: %s", count ? "; " : "", n->names[p],
						down_reason(n, p, why, sizeof(why)));
		count++;
	}
	return count;
}

/* When anything was last heard from `peer`, on any lane. */
static uint64_t last_heard(const struct gg_node *n, unsigned peer)
{
	uint64_t t = 0;

	for (unsigned l = 0; l < n->nlanes; l++)
		t = GG_MAX(t, (uint64_t)atomic_load_explicit(&n->lanes[l].heard_us[peer], memory_order_relaxed));
	return t;
}

/* A site not heard from for heartbeat_timeout, unless this site itself
 * stood still meanwhile (it heard nothing from anyone, which says nothing
 * about them): true with `why` naming it. */
static bool lost_site(struct gg_node *n, uint64_t now, char *why, size_t why_size)
{
	const uint64_t limit = n->cfg->transport.heartbeat_timeout_us;

	if (n->stall_end_us && now < n->stall_end_us + limit)
		return false;
	for (unsigned p = 0; p < n->sites; p++) {
		uint64_t heard = last_heard(n, p); /* by a lane's clock, which may be ahead of this one */
		if (p == n->self || heard >= now || now - heard <= limit)
			continue;
		bool up = atomic_load(&n->ready[p]) != 0;
		char down[GG_NODE_ERROR_MAX];
		snprintf(why, why_size, "site %s is unreachable: nothing heard from it for %.1f s (%s%s)", n->names[p],
			 (double)(now - heard) / 1e6, up ? "its streams are up but silent" : "its streams are down: ",
			 up ? "" : down_reason(n, p, down, sizeof(down)));
		return true;
	}
	return false;
}

bool gg_node_lost_site(struct gg_node *n, char *why, size_t why_size)
{
	return lost_site(n, gg_node_loop(n)->now_us, why, why_size);
}

/* A step needs every site: one not heard from for heartbeat_timeout fails
 * it now, rather than at its deadline. Returns true when it did. */
static bool fail_if_peer_lost(struct gg_node *n, struct job *j, uint64_t now)
{
	char why[GG_NODE_ERROR_MAX];

	/* A site that said DONE waits for the others' word instead (they may
	 * have completed on it), unless its DONE reached nobody: then no site
	 * can have. */
	if ((j->has_result && j->done_may_reach) || !lost_site(n, now, why, sizeof(why)))
		return false;
	fail_step_code(n, j, GG_ERR_SITE, "step %llu of job '%s': %s%s%s%s", (unsigned long long)j->step->seq, j->name,
		       why, j->has_result ? "; site " : "", j->has_result ? n->names[n->self] : "",
		       j->has_result ? " had the result, but no stream carried its DONE to any site" : "");
	return true;
}

static void post_shutdown(struct gg_node *n)
{
	struct mail m = { .base.type = M_SHUTDOWN };
	struct mail *a;

	n->close_told = post_lanes(n, &m, n->close_told);
	if (!n->acceptor_told && (a = mail_new(M_SHUTDOWN))) {
		post(&n->lanes[n->nlanes].inbox, a);
		n->acceptor_told = true;
	}
}

/* Whole steps: sites lost, and steps whose parts are done but whose commit
 * round is not. */
static uint64_t coordinator_timers(struct gg_node *n)
{
	const uint64_t now = gg_node_loop(n)->now_us;
	uint64_t next = now + TICK_US;

	uint64_t still = stood_still_now(n);
	if (still) {
		n->stall_end_us = now;
		n->stall_us = still;
	}
	next = GG_MIN(next, peer_logs_flush(n, n->logs, now));

	/* Mail that memory ran out for, again. */
	if (n->closing && (n->close_told != all_lanes(n) || !n->acceptor_told))
		post_shutdown(n);
	for (unsigned i = 0; i < MAX_JOBS; i++)
		if (n->jobs[i].used && n->jobs[i].ending && n->jobs[i].end_told != all_lanes(n))
			post_end(n, &n->jobs[i]);

	if (gg_buf_pool_count(&n->frames)) {
		bool idle = true;
		for (unsigned i = 0; i < MAX_JOBS && idle; i++)
			idle = !n->jobs[i].used || (!n->jobs[i].step && now - n->jobs[i].active_us > POOL_IDLE_US);
		if (idle)
			gg_buf_pool_trim(&n->frames);
	}
	for (unsigned i = 0; i < MAX_JOBS; i++) {
		struct job *j = &n->jobs[i];
		if (!j->used || !j->step || j->ending || fail_if_peer_lost(n, j, now) || !j->has_result)
			continue;
		next = GG_MIN(next, ask_completed(n, j, now));
		/* Said DONE: the others may complete on it, so this site waits
		 * for their DONE past the deadline, for as long as it takes to
		 * find a site lost. */
		uint64_t until = GG_MAX(j->deadline_us, j->has_result_us) + n->cfg->transport.heartbeat_timeout_us;
		if (now < until) {
			next = GG_MIN(next, until);
			continue;
		}
		char buf[32], down[GG_AR_MAX_SITES * (GG_WIRE_NAME_MAX + 48) + 32];
		char waiting[GG_AR_MAX_SITES * (GG_WIRE_NAME_MAX + 2) + 1] = "";
		char silent[GG_AR_MAX_SITES * (GG_WIRE_NAME_MAX + 40) + 1] = "";
		size_t len = 0, slen = 0;
		unreachable_peers(n, down, sizeof(down));
		for (unsigned p = 0; p < n->sites; p++) {
			if (p == n->self || (j->done_from & (1u << p)))
				continue;
			len += (size_t)snprintf(waiting + len, sizeof(waiting) - len, "%s%s", len ? ", " : "",
						n->names[p]);
			/* Lost, not slow: the cause is the site, as where it
			 * failed without the result. */
			uint64_t heard = last_heard(n, p);
			if (heard < now && now - heard > n->cfg->transport.heartbeat_timeout_us)
				slen += (size_t)snprintf(silent + slen, sizeof(silent) - slen,
							 "; site %s is unreachable: nothing heard from it for %.1f s",
							 n->names[p], (double)(now - heard) / 1e6);
		}
		fail_step_code(n, j, silent[0] ? GG_ERR_SITE : GG_ERR_TIMEOUT,
			       "step %llu of job '%s' missed its %s deadline: site %s had the result, but "
			       "site%s %s never said so too%s%s",
			       (unsigned long long)j->step->seq, j->name,
			       gg_format_duration(j->timeout_us, buf, sizeof(buf)), n->names[n->self],
			       strchr(waiting, ',') ? "s" : "", waiting, silent, down);
	}
	return next;
}

static double load_s(const atomic_uint_fast64_t *ns)
{
	return (double)load(ns) * 1e-9;
}

static void gather_stats(struct gg_node *n)
{
	struct gg_node_stats *st = &n->stats;

	st->data_bytes_out = st->raw_bytes_out = st->data_bytes_in = st->resent_messages = st->hedged_frames = 0;
	st->encode_s = st->decode_s = st->tls_s = 0;
	st->early_bytes = st->early_refused = 0;
	for (unsigned l = 0; l <= n->nlanes; l++) {
		struct lane *ln = &n->lanes[l];
		for (unsigned p = 0; p < n->sites; p++) {
			const struct lane_peer_stats *lp = &ln->stats.peers[p];
			st->data_bytes_out += load(&lp->data_out);
			st->raw_bytes_out += load(&lp->raw_out);
			st->data_bytes_in += load(&lp->data_in);
			st->early_bytes += load(&ln->early_bytes[p]);
			uint64_t rtt = load(&ln->rtt_us[p]);
			if (rtt)
				st->rtt_us[p] = rtt;
		}
		st->encode_s += load_s(&ln->stats.encode_ns);
		st->decode_s += load_s(&ln->stats.decode_ns);
		st->tls_s += load_s(&ln->tls_ns);
		st->resent_messages += load(&ln->resent);
		st->hedged_frames += load(&ln->hedged);
		st->early_refused += load(&ln->early_refused);
	}
}

void gg_node_get_metrics(const struct gg_node *n, struct gg_node_metrics *out)
{
	memset(out, 0, sizeof(*out));
	out->stats = n->stats;
	out->sites = n->sites;
	out->self = n->self;
	for (unsigned l = 0; l <= n->nlanes; l++) {
		const struct lane *ln = &n->lanes[l];
		const struct lane_stats *ls = &ln->stats;
		for (unsigned p = 0; p < n->sites; p++) {
			const struct lane_peer_stats *lp = &ls->peers[p];
			struct gg_node_peer_metrics *pm = &out->peers[p];
			pm->raw_bytes_out += load(&lp->raw_out);
			pm->raw_bytes_in += load(&lp->raw_in);
			pm->data_bytes_out += load(&lp->data_out);
			pm->data_bytes_in += load(&lp->data_in);
			pm->wire_bytes_out += load(&lp->wire_out);
			pm->wire_bytes_in += load(&lp->wire_in);
			pm->stream_ups += load(&lp->stream_ups);
			pm->stream_downs += load(&lp->stream_downs);
			pm->delivery_bytes_per_s += load(&lp->delivery_bps);
		}
		out->gather_s += load_s(&ls->gather_ns);
		out->encode_s += load_s(&ls->encode_ns);
		out->decode_s += load_s(&ls->decode_ns);
		out->deliver_s += load_s(&ls->deliver_ns);
		out->wait_s += load_s(&ls->wait_ns);
		for (unsigned f = 0; f < GG_MESH_FAILURES; f++)
			out->stream_failures[f] += load(&ls->stream_failures[f]);
	}
	for (unsigned p = 0; p < n->sites; p++) {
		struct gg_node_peer_metrics *pm = &out->peers[p];
		if (p == n->self) {
			memset(pm, 0, sizeof(*pm));
			continue;
		}
		uint64_t ready = atomic_load(&n->ready[p]);
		pm->streams_up = (unsigned)__builtin_popcountll(ready);
		pm->streams = (unsigned)n->cfg->transport.streams_per_peer;
		pm->rtt_us = n->stats.rtt_us[p];
		/* The lanes count silence from their start; what was heard is
		 * what came over a stream, and a peer never up had none. */
		pm->heard_us = atomic_load_explicit(&n->ever_up[p], memory_order_relaxed) ? last_heard(n, p) : 0;
		for (unsigned s = 0; s < pm->streams && s < GG_MESH_MAX_STREAMS; s++) {
			const struct stream_tcp *st = &n->tcp[p][s];
			struct gg_node_stream_metrics *sm = &out->streams[p][s];
			sm->up = atomic_load_explicit(&st->up, memory_order_acquire);
			if (!sm->up)
				continue;
			sm->tcp = (struct gg_mesh_stream_tcp){ .rtt_us = load(&st->rtt_us),
							       .rttvar_us = load(&st->rttvar_us),
							       .cwnd_bytes = load(&st->cwnd_bytes),
							       .delivery_bytes_per_s = load(&st->delivery_bytes_per_s),
							       .retransmits = load(&st->retransmits),
							       .unsent_bytes = load(&st->unsent_bytes),
							       .send_buffer_bytes = load(&st->send_buffer_bytes),
							       .receive_buffer_bytes = load(&st->receive_buffer_bytes) };
		}
	}
	memcpy(out->step_buckets, n->step_buckets, sizeof(out->step_buckets));
	out->step_s_sum = (double)n->step_us_sum * 1e-6;
	memcpy(out->failures_by_code, n->failures_by_code, sizeof(out->failures_by_code));
	out->feedback_bytes = n->feedback_bytes;
}

unsigned gg_node_recent_failures(const struct gg_node *n, struct gg_node_failure *out, unsigned max)
{
	unsigned have = (unsigned)GG_MIN(n->failures_total, (uint64_t)FAILURES_KEPT), i;

	for (i = 0; i < have && i < max; i++)
		out[i] = n->failures[(n->failures_total - 1 - i) % FAILURES_KEPT];
	return i;
}

void gg_node_note_failure(struct gg_node *n, const char *job, uint64_t seq, int code, const char *message)
{
	note_failure(n, job, seq, code, message);
}

uint64_t gg_node_failure_count(const struct gg_node *n)
{
	return n->failures_total;
}

int gg_node_run_once(struct gg_node *n, uint64_t timeout_us, gg_node_cqe_fn *other, void *arg)
{
	struct lane *ln = &n->lanes[0];
	struct cqe_ctx x = { .ln = ln, .other = other, .arg = arg };
	int rc = lane_turn(ln, GG_MIN(timeout_us, gg_loop_timeout_us(&ln->loop, n->coord_next_us)), &x);

	if (rc)
		return rc;
	if ((rc = atomic_load(&n->acceptor_failed)))
		return rc;
	if (x.coord_mail && (rc = gg_mailbox_arm(&n->inbox, &ln->loop, gg_loop_ud(KIND_COORD_MAIL, 0, 0))))
		return rc;
	/* What the coordinator and lane 0, both on this thread, post each
	 * other wakes neither: it is handled in this turn, not the next, which
	 * may be a tick away (the end of a step that failed at its deadline
	 * with no stream up to wake the loop waited 100 ms). */
	for (unsigned round = 0; round < 4; round++) {
		coordinator_mail(n);
		lane_mail(ln);
		if (gg_mailbox_empty(&n->inbox))
			break;
	}
	n->coord_next_us = coordinator_timers(n);
	n->coord_done_boot_us = gg_boottime_us();
	n->coord_done_cpu_us = gg_thread_cpu_us();
	/* Mail still there (a step's done() started the next, and so on):
	 * the next turn does not wait. */
	if (!gg_mailbox_empty(&n->inbox) || !gg_mailbox_empty(&ln->inbox))
		n->coord_next_us = ln->loop.now_us;
	gather_stats(n);
	return 0;
}

int gg_node_test_cut_stream(struct gg_node *n, unsigned peer, int stream)
{
	if (peer >= n->sites || stream < 0 || stream >= n->cfg->transport.streams_per_peer)
		return -EINVAL;
	struct lane *ln = &n->lanes[(unsigned)stream % n->nlanes];
	if (ln->index == 0)
		return gg_mesh_test_cut_stream(ln->mesh, peer, stream);
	if (!(atomic_load(&n->ready[peer]) & ((uint64_t)1 << stream)))
		return -ENOTCONN;
	struct mail *m = mail_new(M_CUT);
	if (!m)
		return -ENOMEM;
	m->peer = peer;
	m->u.stream = stream;
	post(&ln->inbox, m);
	return 0;
}

int gg_node_test_send_data(struct gg_node *n, unsigned peer, const char *job, uint64_t step, uint32_t chunk,
			   size_t bytes)
{
	struct gg_wire_step ws = { .run = 1, .step = step, .count = 1, .dtype = GG_WIRE_F32 };
	struct gg_ar_chunk_id id = { .phase = GG_AR_DIRECT, .origin = (uint8_t)n->self, .chunk = chunk };

	if (peer >= n->sites || peer == n->self || bytes > n->max_payload - GG_WIRE_DATA_FIXED_BYTES)
		return -EINVAL;
	snprintf(ws.job, sizeof(ws.job), "%s", job);
	struct gg_buf *frame = gg_buf_new(&n->frames, n->max_payload);
	if (!frame)
		return -ENOMEM;
	memset(frame->data, 0x5a, bytes);
	frame->len = bytes;
	int rc = gg_mesh_send_data(n->lanes[0].mesh, peer, &ws, &id, frame, 0);
	gg_buf_put(frame);
	return rc;
}

void gg_node_test_set_plan(struct gg_node *n, const char *job, uint64_t direct_max)
{
	struct job *j = find_job(n, job, false);

	if (j)
		j->using = (struct gg_wire_plan){ .has_plan = true, .direct_max = direct_max };
}

uint32_t gg_node_test_step_chunk(struct gg_node *n, const char *job, enum gg_allreduce_algo *algo)
{
	struct job *j = find_job(n, job, false);

	if (!j)
		return 0;
	*algo = j->run_algo;
	return j->run_chunk;
}

void gg_node_test_drop_done(struct gg_node *n, unsigned peer)
{
	n->test_drop_done = peer + 1;
}

int gg_node_test_open_stream(struct gg_node *n, unsigned peer, unsigned stream, uint64_t instance_id,
			     gg_mesh_test_sent_fn *sent, void *arg)
{
	if (stream % n->nlanes)
		return -EINVAL;
	return gg_mesh_test_open(n->lanes[0].mesh, peer, stream, instance_id, sent, arg);
}

int gg_node_test_receive(struct gg_node *n, unsigned peer, unsigned stream, const uint8_t *bytes, size_t len)
{
	if (stream % n->nlanes)
		return -EINVAL;
	return gg_mesh_test_receive(n->lanes[0].mesh, peer, stream, bytes, len);
}

void gg_node_test_freeze_at_result(struct gg_node *n)
{
	n->test_freeze_at_result = true;
}

bool gg_node_connected(const struct gg_node *n)
{
	for (unsigned p = 0; p < n->sites; p++)
		if (p != n->self && atomic_load(&n->ready[p]) != n->all_streams)
			return false;
	return true;
}

int gg_node_reload(struct gg_node *n, char *err, size_t err_size)
{
	return gg_tls_context_reload(n->tls, err, err_size);
}

void gg_node_stop_steps(struct gg_node *n)
{
	n->shutting_down = true;
	for (unsigned i = 0; i < MAX_JOBS; i++)
		if (n->jobs[i].used && n->jobs[i].step)
			fail_step_code(n, &n->jobs[i], GG_ERR_CLOSED,
				       "step %llu of job '%s': the gateway of site %s is shutting down",
				       (unsigned long long)n->jobs[i].step->seq, n->jobs[i].name, n->names[n->self]);
}

int gg_node_abort(struct gg_node *n, const char *job, uint64_t seq, int code, const char *reason)
{
	struct job *j = find_job(n, job, true);
	char text[GG_NODE_ERROR_MAX];

	/* A failed step always says what failed, here and at the peers, in
	 * one line: control bytes become '?', as on the wire. */
	if (!reason || !*reason) {
		snprintf(text, sizeof(text), "step %llu of job '%s' failed at site %s (no reason given)",
			 (unsigned long long)seq, job, n->names[n->self]);
	} else {
		size_t i = 0;
		for (; reason[i] && i + 1 < sizeof(text); i++)
			text[i] = (unsigned char)reason[i] < 0x20 || reason[i] == 0x7f ? '?' : reason[i];
		text[i] = '\0';
	}
	reason = text;

	if (j && j->step && j->step->seq == seq) {
		if (j->ending)
			return j->end_status ? 0 : -EALREADY;
		if (j->has_result) {
			char safe[LOG_VALUE_MAX];
			gg_log(GG_LOG_INFO, "abort_too_late", "job=%s step=%llu reason=\"%s\" outcome=\"as the peers say\"",
			       j->name, (unsigned long long)seq, gg_escape(safe, sizeof(safe), reason, strlen(reason)));
			return -EALREADY;
		}
		fail_step_code(n, j, code, "%s", reason);
		return 0;
	}
	send_abort(n, -1, job, j ? j->run : new_run(n), seq, seq, code, reason);
	note_failure(n, job, seq, code, reason);
	if (j)
		remember_abort(n, j, seq, code, reason);
	/* Frames the lanes keep for the step are let go. */
	forget_step(n, job, seq);
	if (j && seq > j->last_seq)
		j->last_seq = seq;
	return 0;
}

void gg_node_end_job(struct gg_node *n, const char *job)
{
	gg_node_end_job_why(n, job, NULL);
}

void gg_node_end_job_why(struct gg_node *n, const char *job, const char *why)
{
	struct job *j = find_job(n, job, false);

	if (j && j->step)
		return; /* the site backend ends a job once none of its steps is here */
	struct ended_job *e = &n->ended[n->ended_next++ % ENDS_KEPT];
	snprintf(e->name, sizeof(e->name), "%s", job);
	e->run = j ? j->run : new_run(n);
	e->last_step = j ? GG_MAX(j->last_seq, j->done_seq) : 0;
	e->last_done = j ? j->done_seq : 0;
	e->us = gg_node_loop(n)->now_us;
	e->ended_us = gg_monotonic_us();
	if (j && j->failed_lo && j->failed_lo <= e->last_done + 1 && e->last_done < j->failed_hi) {
		e->code = j->failed_code;
		snprintf(e->reason, sizeof(e->reason), "%s", j->failed_reason);
	} else {
		e->code = GG_ERR_RANK;
		char reason[sizeof(e->reason)];
		snprintf(reason, sizeof(reason), "its ranks there are gone%s%s", why ? ": " : "", why ? why : "");
		memcpy(e->reason, reason, sizeof(reason));
	}
	send_end(n, -1, e);
	/* The peers' runs this one paired with are over here: what comes of
	 * them later (an END sent again) is not of a new run of the name. The
	 * lanes learn which they are too. */
	struct mail f = { .base.type = M_FORGET_JOB, .sites = (uint32_t)((1ull << n->sites) - 1) };
	struct name_runs *r = name_runs(n, job, true);
	for (unsigned p = 0; r && p < n->sites; p++) {
		run_raise(&r->left[p], r->seen[p]);
		f.runs[p] = r->seen[p];
	}
	if (r)
		r->ended_here = true;
	for (unsigned i = 0; i < n->feedback_count; i++)
		if (!strcmp(n->feedback[i]->job, job))
			feedback_drop(n, i--);
	snprintf(f.u.job, sizeof(f.u.job), "%s", job);
	post_lanes(n, &f, 0);
	if (j)
		memset(j, 0, sizeof(*j));
	name_set_open(n, job, false);
	if (peer_log_now(n->logs, n->self, LOG_JOB_ENDED, gg_node_loop(n)->now_us))
		gg_log(GG_LOG_INFO, "job_ended", "job=%s", job);
}

void gg_node_shutdown(struct gg_node *n)
{
	gg_node_stop_steps(n);
	n->closing = true;
	post_shutdown(n);
	lane_mail(&n->lanes[0]);
}

bool gg_node_flushed(const struct gg_node *n)
{
	for (unsigned l = 0; l <= n->nlanes; l++)
		if (!atomic_load(&n->lanes[l].flushed))
			return false;
	for (unsigned i = 0; i < MAX_JOBS; i++)
		if (n->jobs[i].ending)
			return false;
	return true;
}

bool gg_node_idle(const struct gg_node *n)
{
	for (unsigned l = 0; l <= n->nlanes; l++)
		if (!atomic_load(&n->lanes[l].idle))
			return false;
	for (unsigned i = 0; i < MAX_JOBS; i++)
		if (n->jobs[i].step)
			return false;
	return true;
}

const struct gg_node_stats *gg_node_stats(const struct gg_node *n)
{
	return &n->stats;
}

/* ---- making and freeing lanes --------------------------------------------- */

/* A lane's thread name, as ps -T and /proc/PID/task/TID/comm show it. */
static const char *lane_name(const struct gg_node *n, unsigned l, char name[16])
{
	if (l == n->nlanes)
		snprintf(name, 16, "gg-accept");
	else
		snprintf(name, 16, "gg-lane%u", l);
	return name;
}

/* Makes the lane's loop, mesh and codecs, on the thread that runs it.
 * Returns 0 or a negative errno with ln->start_err set. */
static int lane_init(struct lane *ln)
{
	struct gg_node *n = ln->node;
	char name[16];
	int rc;

	lane_name(n, ln->index, name);
	if ((rc = gg_loop_init(&ln->loop, 1024)))
		return gg_errf(ln->start_err, sizeof(ln->start_err), rc, "cannot set up io_uring for %s: %s", name,
			       strerror(-rc));
	ln->loop_ok = true;
	ln->loop.now_us = gg_monotonic_us();
	gg_mailbox_claim(&ln->inbox);
	if (ln->index < n->nlanes && ((rc = gg_frame_encoder_init(&ln->enc, &n->frame_cfg)) ||
				      (rc = gg_frame_decoder_init(&ln->dec, &n->frame_limits))))
		return gg_errf(ln->start_err, sizeof(ln->start_err), rc, "codec %s for %s: %s",
			       gg_codec_name(n->cfg->compression.codec), name, strerror(-rc));
	struct gg_mesh_config mc = { .cfg = n->cfg, .sites = n->sites, .self = n->self, .names = n->names,
				     .hello = &n->hello, .tls = n->tls, .resolver = n->resolver, .loop = &ln->loop,
				     .pool = &n->frames,
				     .max_payload_bytes = n->max_payload, .ops = &mesh_ops, .owner = ln,
				     .lane = ln->index, .lanes = n->nlanes, .listen = ln->index == n->nlanes };
	if ((rc = gg_mesh_new(&mc, &ln->mesh, ln->start_err, sizeof(ln->start_err))))
		return rc;
	if ((rc = gg_mailbox_arm(&ln->inbox, &ln->loop, gg_loop_ud(KIND_LANE_MAIL, 0, 0))))
		return gg_errf(ln->start_err, sizeof(ln->start_err), rc, "cannot arm the mailbox of %s: %s", name,
			       strerror(-rc));
	ln->next_us = ln->loop.now_us;
	return 0;
}

static void lane_fini(struct lane *ln)
{
	for (unsigned i = 0; i < LANE_JOBS; i++) {
		struct lane_job *lj = &ln->jobs[i];
		gg_ar_step_free(lj->ar);
		lj->ar = NULL;
		lane_job_clear(lj);
	}
	gg_mesh_free(ln->mesh);
	ln->mesh = NULL;
	for (struct gg_mail *g = gg_mailbox_take(&ln->inbox), *next; g; g = next) {
		struct mail *m = (struct mail *)g;
		next = g->next;
		if (g->type == M_DATA)
			gg_buf_put(m->u.data.payload);
		if (g->type == M_CONN) {
			close(m->u.conn->fd);
			gg_tls_engine_free(m->u.conn->tls);
			free(m->u.conn);
		}
		free(m);
	}
	if (ln->loop_ok)
		gg_loop_fini(&ln->loop);
	ln->loop_ok = false;
	gg_frame_encoder_fini(&ln->enc);
	gg_frame_decoder_fini(&ln->dec);
#if HAVE_CUDA
	if (ln->gpu_ready)
		gg_ar_mem_cuda_fini(&ln->gpu);
	ln->gpu_ready = false;
#endif
}

static void *lane_main(void *arg)
{
	struct lane *ln = arg;
	struct gg_node *n = ln->node;
	sigset_t all;

	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL); /* signals are the process's main thread's */
	gg_log_set_thread_site(n->names[n->self]);
	int rc = lane_init(ln);
	pthread_mutex_lock(&n->start_lock);
	ln->start_rc = rc;
	n->lanes_starting--;
	pthread_cond_broadcast(&n->started);
	pthread_mutex_unlock(&n->start_lock);
	struct cqe_ctx x = { .ln = ln };
	atomic_bool *stop = ln->index == n->nlanes ? &n->acceptor_stop : &n->lanes_stop;
	while (!rc && !atomic_load(stop)) {
		x.lane_mail = false;
		if ((rc = lane_turn(ln, TICK_US, &x))) {
			char name[16];
			gg_log(GG_LOG_ERROR, "loop_failed", "site=%s thread=%s reason=\"%s\"", n->cfg->site.name,
			       lane_name(n, ln->index, name), strerror(-rc));
			atomic_store(&ln->idle, true);
			atomic_store(&ln->flushed, true);
			/* Without its acceptor the gateway takes no stream a peer
			 * dials: the node fails, as it does when lane 0 fails. */
			if (ln->index == n->nlanes)
				atomic_store(&n->acceptor_failed, rc);
		}
	}
	lane_fini(ln);
	return NULL;
}

static int by_name(const void *a, const void *b)
{
	return strcmp(a, b);
}

/* The lanes a node runs: [site] threads, but no more than there are
 * streams to each peer, for a lane sends only on streams of its own. */
static unsigned lane_count(const struct gg_config *cfg)
{
	unsigned w = cfg->site.threads > 0 ? (unsigned)cfg->site.threads : 1;

	return GG_MIN(w, (unsigned)cfg->transport.streams_per_peer);
}

/* The TLS options of the gateway. Its peers' identities, which its own
 * certificate may not carry, go into `peers` (GG_MAX_PEERS). */
_Static_assert(GG_MAX_PEERS <= GG_TLS_MAX_SITES, "a TLS context takes every peer");
static int tls_options(const struct gg_config *cfg, struct gg_tls_site *peers, struct gg_tls_options *o, char *err,
		       size_t err_size)
{
	const char *why;

	for (size_t i = 0; i < cfg->peer_count; i++)
		if (gg_tls_site_init(&peers[i], cfg->peers[i].site, cfg->peers[i].identity, &why))
			return gg_errf(err, err_size, -EINVAL, "peer %s: identity %s: %s", cfg->peers[i].site,
				       cfg->peers[i].identity, why);
	*o = (struct gg_tls_options){ .ca_file = cfg->tls.ca, .cert_file = cfg->tls.cert, .key_file = cfg->tls.key,
				      .crl_file = cfg->tls.crl, .ciphersuites = cfg->tls.ciphersuites,
				      .groups = cfg->tls.groups, .peers = peers, .peer_count = cfg->peer_count };
	return 0;
}

uint64_t gg_node_fingerprint(const struct gg_config *cfg, const struct gg_wire_step *ws, uint8_t algorithm,
			     uint32_t chunk_elems)
{
	const enum gg_codec codec = cfg->compression.codec;
	const uint32_t block = gg_codec_has_blocks(codec) ? (uint32_t)cfg->compression.block_size : 0;

	return gg_wire_fingerprint(ws, (uint8_t)codec, block, algorithm, chunk_elems);
}

/* The listen address resolves and is one of this host's: listening on
 * it with port 0 tells, without the port, which a running gateway holds. */
static int check_listen(const struct gg_config *cfg, char *err, size_t err_size)
{
	struct sockaddr_storage ss;
	socklen_t len;
	const char *why;

	if (gg_net_addr_parse(cfg->site.listen, &ss, &len, &why))
		return gg_errf(err, err_size, -EINVAL, "[site] listen \"%s\": %s", cfg->site.listen, why);
	if (ss.ss_family == AF_INET)
		((struct sockaddr_in *)&ss)->sin_port = 0;
	else
		((struct sockaddr_in6 *)&ss)->sin6_port = 0;
	int rc = gg_net_listen((struct sockaddr *)&ss, len, 1);
	if (rc >= 0) {
		close(rc);
		return 0;
	}
	if (rc == -EADDRNOTAVAIL)
		return gg_errf(err, err_size, rc, "[site] listen \"%s\": no interface of this host has that address",
			       cfg->site.listen);
	return gg_errf(err, err_size, rc, "[site] listen \"%s\": %s", cfg->site.listen, strerror(-rc));
}

int gg_node_check_host(const struct gg_config *cfg, struct gg_config_pos *at, char *err, size_t err_size)
{
	struct gg_tls_site peers[GG_MAX_PEERS];
	struct gg_tls_options to;
	struct gg_tls_context *tls;
	int rc;

	*at = (struct gg_config_pos){ 0, 0 };
	if ((rc = tls_options(cfg, peers, &to, err, err_size)) || (rc = gg_tls_context_new(&to, &tls, err, err_size)))
		return rc;
	gg_tls_context_free(tls);
	*at = cfg->at.congestion_control;
	if (cfg->transport.congestion_control &&
	    (rc = gg_net_check_congestion(cfg->transport.congestion_control, err, err_size)))
		return rc;
	*at = cfg->at.listen;
	return check_listen(cfg, err, err_size);
}

int gg_node_new(const struct gg_config *cfg, struct gg_node **out, char *err, size_t err_size)
{
	struct gg_node *n = calloc(1, sizeof(*n));
	char name[16];
	int rc;

	*out = NULL;
	if (!n)
		return -ENOMEM;
	n->cfg = cfg;
	n->inbox.efd = -1;
	pthread_mutex_init(&n->start_lock, NULL);
	pthread_cond_init(&n->started, NULL);
	n->sites = (unsigned)cfg->peer_count + 1;
	snprintf(n->names[0], sizeof(n->names[0]), "%s", cfg->site.name);
	for (size_t i = 0; i < cfg->peer_count; i++)
		snprintf(n->names[i + 1], sizeof(n->names[0]), "%s", cfg->peers[i].site);
	qsort(n->names, n->sites, sizeof(n->names[0]), by_name);
	for (unsigned i = 0; i < n->sites; i++)
		if (!strcmp(n->names[i], cfg->site.name))
			n->self = i;
	n->name_runs_cap = NAME_RUNS_KEPT + (unsigned)GG_MAX(cfg->limits.max_clients, 0);
	if (!(n->name_runs = calloc(n->name_runs_cap, sizeof(*n->name_runs)))) {
		rc = gg_errf(err, err_size, -ENOMEM, "out of memory for the job names' records");
		goto fail;
	}
	n->all_streams = cfg->transport.streams_per_peer >= 64 ? UINT64_MAX
							      : ((uint64_t)1 << cfg->transport.streams_per_peer) - 1;

	n->chunk_elems = (uint32_t)GG_MIN(cfg->transport.chunk_bytes / sizeof(float), (uint64_t)UINT32_MAX) /
			 GG_CODEC_BLOCK_ALIGN_ELEMS * GG_CODEC_BLOCK_ALIGN_ELEMS;
	n->frame_cfg = (struct gg_frame_config){ .codec = gg_codec_defaults(cfg->compression.codec),
						 .zstd = cfg->compression.zstd_level > 0,
						 .zstd_level = cfg->compression.zstd_level > 0 ? cfg->compression.zstd_level : 1,
						 .max_elems = n->chunk_elems };
	if (gg_codec_has_blocks(cfg->compression.codec)) {
		n->frame_cfg.codec.block_elems = (uint32_t)cfg->compression.block_size;
		n->frame_cfg.codec.scale = cfg->compression.scale;
	}
	uint64_t bound;
	if ((rc = gg_frame_bound(&n->frame_cfg.codec, n->chunk_elems, &bound))) {
		gg_errf(err, err_size, -EINVAL, "codec %s with block size %d: %s", gg_codec_name(cfg->compression.codec),
			cfg->compression.block_size, strerror(-rc));
		goto fail;
	}
	n->frame_limits = (struct gg_frame_limits){ .max_elems = n->chunk_elems, .max_raw_bytes = bound };
	/* One pool for the frames a site sends and the DATA it receives (a
	 * frame and its message head): enough for what the streams keep
	 * queued (ar_may_encode), in flight and early, a few dozen megabytes
	 * at the default chunk size and at most a sixteenth of [limits]
	 * memory; an idle node lets them go. Under auto, the pools of the
	 * smaller chunks hang off it, each kept to half the budget of the one
	 * above, so that all of them keep less than an eighth. */
	n->max_payload = GG_WIRE_DATA_FIXED_BYTES + bound;
	unsigned pool_max = (unsigned)GG_MIN((uint64_t)64, cfg->limits.memory_bytes / 16 / n->max_payload);
	gg_buf_pool_init(&n->frames, n->max_payload, pool_max);
	if (cfg->allreduce.algorithm == GG_ALLREDUCE_AUTO) {
		uint32_t sizes[GG_ARRAY_LEN(n->frame_classes)];
		unsigned classes = gg_ar_auto_chunk_sizes(n->chunk_elems, sizes, GG_ARRAY_LEN(sizes));
		struct gg_buf_pool *larger = &n->frames;
		for (unsigned i = 0; i < classes; i++) {
			const uint32_t c = sizes[i];
			struct gg_buf_pool *p = &n->frame_classes[i];
			if ((rc = gg_frame_bound(&n->frame_cfg.codec, c, &bound))) {
				gg_errf(err, err_size, -EINVAL, "frames of %u elements: %s", c, strerror(-rc));
				goto fail;
			}
			gg_buf_pool_init(p, GG_WIRE_DATA_FIXED_BYTES + bound,
					 (unsigned)GG_MIN((uint64_t)64, (cfg->limits.memory_bytes / 16 >> (i + 1)) /
									(GG_WIRE_DATA_FIXED_BYTES + bound)));
			larger->smaller = p;
			larger = p;
		}
	}

	n->hello = (struct gg_wire_hello){ .streams = (uint16_t)cfg->transport.streams_per_peer,
					   .sites = (uint8_t)n->sites,
					   .codec = (uint8_t)cfg->compression.codec,
					   .scale = (uint8_t)n->frame_cfg.codec.scale,
					   .block_elems = n->frame_cfg.codec.block_elems,
					   .algorithm = (uint8_t)cfg->allreduce.algorithm,
					   .chunk_elems = n->chunk_elems,
					   .zstd = cfg->compression.zstd_level > 0 };
	memcpy(n->hello.site_names, n->names, sizeof(n->names));
	int urandom = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
	if (urandom < 0 || read(urandom, &n->hello.instance_id, sizeof(n->hello.instance_id)) != 8) {
		if (urandom >= 0)
			close(urandom);
		rc = gg_errf(err, err_size, -EINVAL, "cannot read /dev/urandom for the instance id");
		goto fail;
	}
	close(urandom);
	n->hello.instance_id |= 1; /* never 0, which means "not seen yet" */
	/* Lane 0 and the coordinator run on the thread that turns the node,
	 * which is the one that makes it. */
	gg_log_set_thread_site(n->names[n->self]);
	struct timespec wall;
	clock_gettime(CLOCK_REALTIME, &wall);
	n->next_run = (uint64_t)wall.tv_sec * 1000000u + (uint64_t)wall.tv_nsec / 1000u + 1;

	struct gg_tls_site peers[GG_MAX_PEERS];
	struct gg_tls_options to;
	if ((rc = tls_options(cfg, peers, &to, err, err_size)) || (rc = gg_tls_context_new(&to, &n->tls, err, err_size)))
		goto fail;
	if ((rc = gg_resolver_new(&n->resolver))) {
		gg_errf(err, err_size, rc, "out of memory for the host name resolver");
		goto fail;
	}
	if (cfg->transport.congestion_control &&
	    (rc = gg_net_check_congestion(cfg->transport.congestion_control, err, err_size)))
		goto fail;

	n->nlanes = lane_count(cfg);
	n->lanes = calloc(n->nlanes + 1, sizeof(*n->lanes));
	if (!n->lanes) {
		rc = gg_errf(err, err_size, -ENOMEM, "no memory for %u lanes", n->nlanes);
		goto fail;
	}
	for (unsigned l = 0; l <= n->nlanes; l++) {
		n->lanes[l].node = n;
		n->lanes[l].index = l;
		n->lanes[l].inbox.efd = -1;
		atomic_init(&n->lanes[l].flushed, true);
		atomic_init(&n->lanes[l].idle, false);
		if ((rc = gg_mailbox_init(&n->lanes[l].inbox))) {
			gg_errf(err, err_size, rc, "cannot make the mailbox of lane %u: %s", l, strerror(-rc));
			goto fail;
		}
	}
	/* The coordinator and lane 0 run on the caller's thread. */
	if ((rc = gg_mailbox_init(&n->inbox))) {
		gg_errf(err, err_size, rc, "cannot make the coordinator's mailbox: %s", strerror(-rc));
		goto fail;
	}
	if ((rc = lane_init(&n->lanes[0]))) {
		gg_errf(err, err_size, rc, "%s", n->lanes[0].start_err);
		goto fail;
	}
	if ((rc = gg_mailbox_arm(&n->inbox, &n->lanes[0].loop, gg_loop_ud(KIND_COORD_MAIL, 0, 0)))) {
		gg_errf(err, err_size, rc, "cannot arm the coordinator's mailbox: %s", strerror(-rc));
		goto fail;
	}
	/* Lanes 1.. and the acceptor: each makes its own ring, which only its
	 * thread may use. */
	for (unsigned l = 1; l <= n->nlanes; l++) {
		pthread_mutex_lock(&n->start_lock);
		n->lanes_starting++;
		pthread_mutex_unlock(&n->start_lock);
		if ((rc = -pthread_create(&n->lanes[l].thread, NULL, lane_main, &n->lanes[l]))) {
			pthread_mutex_lock(&n->start_lock);
			n->lanes_starting--;
			pthread_mutex_unlock(&n->start_lock);
			gg_errf(err, err_size, rc, "cannot start the thread of %s: %s", lane_name(n, l, name),
				strerror(-rc));
			goto fail;
		}
		n->lanes[l].has_thread = true;
		pthread_setname_np(n->lanes[l].thread, lane_name(n, l, name));
	}
	pthread_mutex_lock(&n->start_lock);
	while (n->lanes_starting)
		pthread_cond_wait(&n->started, &n->start_lock);
	pthread_mutex_unlock(&n->start_lock);
	for (unsigned l = 1; l <= n->nlanes; l++) {
		if ((rc = n->lanes[l].start_rc)) {
			gg_errf(err, err_size, rc, "%s", n->lanes[l].start_err);
			goto fail;
		}
	}
	*out = n;
	return 0;
fail:
	gg_node_free(n);
	return rc ? rc : -EINVAL;
}

void gg_node_free(struct gg_node *n)
{
	if (!n)
		return;
	/* The acceptor stops first: a stream it hands over until then reaches
	 * a lane that still runs, and is freed with that lane's mail. */
	atomic_store(&n->acceptor_stop, true);
	if (n->lanes && n->lanes[n->nlanes].has_thread) {
		gg_mailbox_wake(&n->lanes[n->nlanes].inbox);
		pthread_join(n->lanes[n->nlanes].thread, NULL);
	}
	atomic_store(&n->lanes_stop, true);
	for (unsigned l = 1; l < n->nlanes && n->lanes; l++) {
		if (!n->lanes[l].has_thread)
			continue;
		gg_mailbox_wake(&n->lanes[l].inbox);
		pthread_join(n->lanes[l].thread, NULL);
	}
	if (n->lanes) {
		lane_fini(&n->lanes[0]);
		for (unsigned l = 0; l <= n->nlanes; l++)
			gg_mailbox_fini(&n->lanes[l].inbox);
	}
	free(n->lanes);
	for (struct gg_mail *g = gg_mailbox_take(&n->inbox), *next; g; g = next) {
		next = g->next;
		free(g);
	}
	gg_mailbox_fini(&n->inbox);
	while (n->feedback_count)
		feedback_drop(n, n->feedback_count - 1);
	gg_node_gpu_frees(n, true);
	free(n->feedback);
	free(n->name_runs);
	gg_buf_pool_fini(&n->frames);
	gg_tls_context_free(n->tls);
	gg_resolver_free(n->resolver);
	pthread_mutex_destroy(&n->start_lock);
	pthread_cond_destroy(&n->started);
	free(n);
}
