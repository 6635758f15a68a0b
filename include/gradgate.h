/* gradgate client library: all-reduce host buffers through the site's
 * gateway.
 *
 * Every training rank of a job opens one session to its site's gateway and
 * calls gg_allreduce() (or gg_allreduce_start() + gg_wait()) for the same
 * tensors in the same order as the job's other ranks. The gateway sums the
 * site's contributions in rank order (rank 0 + rank 1 + ...), exchanges
 * that sum with the other sites and hands every rank the same result bytes.
 *
 * Data moves through shared memory. On memory from gg_buffer_alloc(),
 * which the gateway maps too, an all-reduce copies nothing: the ranks'
 * contributions are summed in place and the result is written straight
 * into each rank's buffer. On any other memory the library copies the
 * tensor into a region it shares with the gateway, and the result back.
 *
 * Errors: every function that can fail returns 0 or a negative code from
 * enum gg_errc, and fills `err` (when not NULL) with the code and a message
 * naming what failed, e.g. "step 12 (tensor 3): step 12 of job 'train':
 * site eu-west is unreachable: ...". On success err->code is 0 and
 * err->message "".
 *
 * Threads: a session and its requests must be used by one thread at a time;
 * separate sessions are independent. The library installs no signal
 * handlers; it sends with MSG_NOSIGNAL, so a lost gateway never raises
 * SIGPIPE. */
#ifndef GRADGATE_H
#define GRADGATE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define GRADGATE_API __attribute__((visibility("default")))
#else
#define GRADGATE_API
#endif

/* Element types. Sums are computed in float32: bfloat16 inputs are widened
 * exactly, and the result is rounded back to bfloat16 once, to nearest
 * even. What crosses between sites is each site's float32 sum as the
 * gateways' [compression] codec encodes it: with codec "fp32" nothing is
 * lost between sites, and the result is the float32 sum of the site sums
 * (in an order the all-reduce algorithm sets); the default,
 * "bf16-split", and the other codecs carry fewer bits of each site sum, so
 * results may differ from it by the codec's bound for each encoding
 * (docs/codecs.md: the site sums, and with the ring algorithm the partial
 * sums at each hop). With [compression] error_feedback (the default) what
 * one step's encoding dropped is added to the next step's input, so one
 * step's result may differ by more than that, while the sum of a tensor's
 * results over the steps stays within one step's error of the exact sum,
 * but for the float32 rounding of each step's input plus what was carried
 * (half an ulp a step at most; docs/codecs.md, "Error feedback").
 * Every rank of every site gets the same bytes whatever the codec. */
enum gg_dtype {
	GG_DTYPE_F32 = 1,
	GG_DTYPE_BF16 = 2
};

enum gg_errc {
	GG_OK = 0,
	GG_ERR_INVALID = -1,   /* a parameter is invalid (NULL, count 0, bad job name, ...) */
	GG_ERR_NOMEM = -2,     /* out of memory, here or at the gateway */
	GG_ERR_SYSTEM = -3,    /* an operating system call failed; the message names it */
	GG_ERR_CONNECT = -4,   /* the gateway's endpoint cannot be reached */
	GG_ERR_REFUSED = -5,   /* the gateway refused the session, or a new run of a job name whose
	                        * old run still has ranks at a site (its step 1, and then each
	                        * later step of that run at once); the message says why */
	GG_ERR_PROTOCOL = -6,  /* a control message broke the protocol */
	GG_ERR_CLOSED = -7,    /* the connection to the gateway is lost, or the session closed */
	GG_ERR_TIMEOUT = -8,   /* the step missed its deadline */
	GG_ERR_TOO_LARGE = -9, /* the tensor exceeds the gateway's max_message */
	GG_ERR_MISMATCH = -10, /* the job's ranks announced different tensors for one step */
	GG_ERR_RANK = -11,     /* another rank of the job failed or left; the message names it */
	GG_ERR_SITE = -12,     /* the exchange with another site failed; the message names it */
	GG_ERR_BUSY = -13,     /* as many requests in flight as the gateway allows */
	GG_ERR_AGAIN = -14,    /* gg_wait: the request is still in progress */
	GG_ERR_LIMIT = -15     /* the gateway is at a configured limit (memory, jobs) */
};

#define GG_ERROR_MESSAGE_MAX 256

struct gg_error {
	int code;                              /* enum gg_errc */
	char message[GG_ERROR_MESSAGE_MAX];    /* NUL-terminated, one line */
};

struct gg_session;
struct gg_request;

/* The endpoint gg_session_open() uses when given NULL. */
#define GG_ENDPOINT_ENV "GRADGATE_ENDPOINT"

/* The user, besides root, this process's own user and the owner of the
 * control socket's folder (where nobody else can have made it, see
 * gg_session_open()), whose process gg_session_open() accepts as the
 * gateway: a number or a user name. A value that is neither (an empty
 * one too) fails gg_session_open() with GG_ERR_INVALID whoever listens: a
 * typo there is not taken for "trust nobody more". */
#define GG_GATEWAY_UID_ENV "GRADGATE_GATEWAY_UID"

/* Opens a session for rank `rank` of the `nranks` ranks of job `job`.
 *
 * endpoint  "unix:/absolute/path" of the gateway's control socket (the
 *           site config's `control`). NULL: the value of the environment
 *           variable GRADGATE_ENDPOINT; when that is unset or empty, the call
 *           fails with GG_ERR_INVALID (gateways name their socket after
 *           their site, so there is no useful fixed default). Read during
 *           the call only. An empty string is refused (GG_ERR_INVALID),
 *           not read as NULL.
 * job       1 to 63 characters of A-Z a-z 0-9 . _ -; the same for every
 *           rank of the job. Read during the call only.
 * rank      0 <= rank < nranks; each rank of a job opens exactly one
 *           session at a time.
 * out       on success receives the session, which the caller owns and
 *           frees with gg_session_close(); on failure set to NULL.
 * err       may be NULL.
 *
 * Before it sends anything, it checks who listens on the socket
 * (SO_PEERCRED): a process running as root, as this process's user, as the
 * owner of the socket's folder (when that folder is not writable by group
 * or others, and nobody else can have put it there: every folder and link
 * on its path belongs to root, or to that user and sits in a folder of
 * root's or that user's that is not writable by group or others, the
 * sticky bit not excepted, as /run/gradgate in /run) or as the user
 * GRADGATE_GATEWAY_UID names. Any other listener may have taken the
 * path before the gateway (a folder of its own in a shared /tmp), and is
 * refused with GG_ERR_CONNECT naming its uid.
 *
 * The call itself refuses (GG_ERR_INVALID) a bad job name, nranks outside
 * 1..4096 and a rank outside 0..nranks-1, before it connects.
 *
 * Blocks until the gateway accepts or refuses, at most 10 seconds from the
 * call, connecting included: GG_ERR_CONNECT when there is no gateway to
 * connect to or the connection cannot be made by then (a full backlog),
 * GG_ERR_TIMEOUT when it was made but the gateway has not answered by
 * then (one too busy to accept it from its backlog, too),
 * GG_ERR_CLOSED when it closed the connection without an answer or is
 * shutting down (it says so). The gateway refuses (GG_ERR_REFUSED, with
 * its reason) a protocol version it does not speak, a rank already
 * connected, an nranks different from what the job's first rank said or
 * above its max_clients, a process running as another user than the
 * job's first rank, a job that failed and still has ranks connected,
 * connections beyond its max_clients, and, from a user other than root
 * and the gateway's own, sessions past half of max_clients or a new job
 * past half of the 32 jobs a gateway runs, or past three quarters of
 * either held by all such users together (so that no one user keeps the
 * others out, nor two root and the gateway's user); GG_ERR_NOMEM when it is out of memory for the session. */
GRADGATE_API int gg_session_open(const char *endpoint, const char *job, int rank, int nranks,
				 struct gg_session **out, struct gg_error *err);

/* What the gateway announced when it accepted the session. The struct
 * may grow at its end in later versions: the caller sets `size`, and the
 * library fills only what fits, so a program built against an older
 * header keeps working with a newer library. */
struct gg_session_info {
	size_t size;                /* set by the caller: sizeof(struct gg_session_info) */
	char site[64];              /* the gateway's site name */
	uint64_t max_message_bytes; /* largest tensor (count * element size) */
	uint32_t max_inflight;      /* requests a session may have in flight */
	uint32_t step_timeout_ms;   /* the gateway's deadline for a step, and the upper bound */
	uint32_t max_buffers;       /* shared buffers (gg_buffer_alloc) a session may hold at once */
};

/* Fills `info` (owned by the caller, with info->size set) from the open
 * session `s`: the fields that lie within info->size bytes; info->size
 * then says how many were written. Returns 0, or GG_ERR_INVALID when `s`
 * or `info` is NULL or info->size is smaller than this struct's sizeof
 * in its first version (which ended with max_buffers; padding included). */
GRADGATE_API int gg_session_get_info(const struct gg_session *s, struct gg_session_info *info);

/* Allocates `bytes` of memory that the gateway maps too (a shared
 * buffer), so that all-reduces on tensors inside it move no bytes between
 * the caller and the gateway. Page-aligned, zero-filled, readable and
 * writable like any memory.
 *
 * s      an open session; the buffer belongs to it.
 * bytes  1 to gg_session_info.max_message_bytes, rounded up to whole
 *        pages: the buffer is that rounded size, all of it usable.
 * out    on success receives the buffer, owned by the caller until
 *        gg_buffer_free() or gg_session_close(), which unmap it; on failure
 *        set to NULL.
 *
 * Fails with GG_ERR_LIMIT when the session holds max_buffers already,
 * GG_ERR_TOO_LARGE above max_message_bytes, GG_ERR_NOMEM / GG_ERR_SYSTEM
 * when the memory cannot be had here, or the session's error once it
 * failed. The gateway maps the buffer without an answer; should it fail
 * to (out of memory there), it ends the session with GG_ERR_NOMEM, which
 * the session's next call returns. */
GRADGATE_API int gg_buffer_alloc(struct gg_session *s, size_t bytes, void **out, struct gg_error *err);

/* Gives a shared buffer back. `buf` is what gg_buffer_alloc() returned
 * (NULL is allowed and does nothing). When requests in flight still use
 * it, it goes once they finish; either way the caller must not touch it
 * after this call. Returns 0, or GG_ERR_INVALID when `buf` is not a shared
 * buffer of this session. */
GRADGATE_API int gg_buffer_free(struct gg_session *s, void *buf, struct gg_error *err);

/* All-reduces `count` elements of `dtype` at `buf`, in place, and blocks
 * until the result is there or the step failed.
 *
 * buf        count elements, read and overwritten with the result; owned
 *            by the caller. When it lies inside a shared buffer
 *            (gg_buffer_alloc) nothing is copied, and `buf` must be
 *            aligned to the element size and end inside that buffer. On
 *            failure the contents of ordinary memory are unchanged; those
 *            of a shared buffer are unspecified (the gateway may have
 *            summed into it or written part of a result).
 * tensor_id  the caller's name for the tensor; every rank of every site
 *            must announce the same (tensor_id, count, dtype) for the same
 *            step, otherwise the step fails at every rank of every site
 *            with GG_ERR_MISMATCH.
 * timeout_ms the step's deadline from this call: > 0 milliseconds, capped
 *            by the gateway's step_timeout; <= 0 the gateway's step_timeout.
 *            It is the deadline of the whole step, at every site: the
 *            earliest deadline of any rank of any site wins, and the step
 *            fails everywhere with GG_ERR_TIMEOUT naming what it waited
 *            for. A site whose ranks are all in waits up to 100 ms and
 *            twice its longest round trip to another site (that part at
 *            most 1 s) past the deadline, for the word of a site still
 *            waiting for a rank of its own, which names that rank where
 *            that site's deadline is no later (where every rank gave the
 *            same timeout); else the message names the data it waited for.
 *            The step may still complete meanwhile. A site that already
 *            holds the result may answer later, by its answer grace (the
 *            peers' heartbeat_timeout): the other
 *            sites may have completed the step, and it completes here too
 *            rather than split the outcome. Steps end in order: one behind
 *            earlier steps of the session still in flight
 *            (gg_allreduce_start) ends no sooner than they do: when its
 *            deadline passed meanwhile, it fails with GG_ERR_TIMEOUT as
 *            its turn comes. A timed-out step leaves the session usable.
 *            Should the gateway itself not answer within the deadline,
 *            its grace and 2 seconds more, the session fails
 *            (GG_ERR_TIMEOUT) and must be closed.
 *
 * Steps are numbered per session from 1 in call order; a call the library
 * refuses before anything is sent (GG_ERR_INVALID for its arguments,
 * GG_ERR_TOO_LARGE, GG_ERR_BUSY) uses no number, so the ranks stay in
 * step, and its message says so ("step 9 (tensor 3), not sent: ..."); a
 * step the gateways refuse or fail has its number, at every rank of the
 * job. A failed step does not break
 * the session unless the connection is lost (GG_ERR_CLOSED,
 * GG_ERR_PROTOCOL, or the timeout above) or the gateway ends the session
 * (it could not map a buffer: GG_ERR_NOMEM): later calls then return that
 * same error. */
GRADGATE_API int gg_allreduce(struct gg_session *s, void *buf, size_t count, enum gg_dtype dtype,
			      uint32_t tensor_id, int timeout_ms, struct gg_error *err);

/* Starts the same all-reduce without waiting: the input is copied out of
 * `buf` before this returns, and the result is copied into it when it
 * arrives, which may happen during any later call on the same session.
 * So `buf` stays owned by the caller but must stay valid, and must be
 * neither read nor written, until gg_wait() reports the request finished
 * or the request is freed. Inside a shared buffer the gateway reads and
 * writes `buf` itself until the step ends, even after gg_request_free();
 * requests in flight must not overlap there.
 *
 * Up to gg_session_info.max_inflight requests may be in flight per
 * session; one more fails with GG_ERR_BUSY and changes nothing. Requests
 * complete in the order they were started.
 *
 * out   on success receives the request, owned by the caller until
 *       gg_request_free(); on failure set to NULL. */
GRADGATE_API int gg_allreduce_start(struct gg_session *s, void *buf, size_t count, enum gg_dtype dtype,
				    uint32_t tensor_id, int timeout_ms, struct gg_request **out,
				    struct gg_error *err);

/* Waits up to `timeout_ms` (-1: until the request finishes; 0: only look)
 * for `req`. Returns 0 when the result is in the request's buffer, the
 * step's error when it failed, or GG_ERR_AGAIN when the request is still
 * in progress after timeout_ms (wait again later). A finished request
 * keeps returning its outcome. */
GRADGATE_API int gg_wait(struct gg_request *req, int timeout_ms, struct gg_error *err);

/* All-reduces `count` elements of `dtype` in GPU memory, in place, as
 * gg_allreduce() does for host memory, and blocks until the result is in
 * `devbuf` or the step failed. The result bytes are the same as a host
 * all-reduce of the same inputs gives (but for which NaN a NaN is).
 *
 * devbuf     count elements in memory from cudaMalloc (or an allocator
 *            built on it, as PyTorch's is) of the calling thread's current
 *            CUDA context, aligned to the element size. The gateway reaches
 *            it by CUDA IPC: it opens the allocation once per session on its
 *            own GPU (the first one it sees) and sums, and later writes the
 *            result, there with kernels of its own. So its GPU must be this
 *            one or a peer of it. Each allocation used takes one of the
 *            session's max_buffers shared regions until the session closes;
 *            when none is free, one no request uses is given back first.
 *            So free such an allocation (cudaFree) only once the session
 *            is closed: CUDA leaves freeing memory that another process
 *            has open undefined, and gg_session_close() returns once the
 *            gateway let go of them, when no step of the session is still
 *            in flight (see there). (PyTorch's allocator keeps what it
 *            frees cached; torch.cuda.empty_cache() is what gives it back.)
 *            Managed memory, stream-ordered pools (cudaMallocAsync) and
 *            host memory are refused with GG_ERR_INVALID.
 * stream     a cudaStream_t (NULL: the legacy default stream) whose work
 *            must be done before the tensor is read: the call synchronizes
 *            it first. Work queued after the call returns sees the result.
 * tensor_id, timeout_ms  as for gg_allreduce(), but the deadline runs
 *            from when the stream's work is done and the tensor is handed
 *            over. Every rank of a step at one site must use the same
 *            kind of memory (all device, all host, or all through NCCL by
 *            gg_allreduce_nccl), otherwise the step fails with
 *            GG_ERR_MISMATCH; sites may differ, since what
 *            crosses between them is each site's sum either way.
 *
 * The library reaches CUDA through the driver (libcuda.so.1, loaded on
 * first use), so it needs no CUDA library to link or load. Errors besides
 * gg_allreduce()'s: GG_ERR_SYSTEM when no CUDA driver can be loaded (the
 * kind of memory `devbuf` is cannot be told without one, so host memory
 * too gets this answer then) or a CUDA call fails (the message names the
 * call and CUDA's error). A gateway
 * built without CUDA, or without a GPU, fails the session (GG_ERR_INVALID)
 * when it is first handed device memory; a CUDA error while it opens the
 * memory fails it with GG_ERR_SYSTEM, and one while it writes the result
 * fails the step with GG_ERR_SYSTEM. On failure the contents of `devbuf`
 * are unchanged, except after that last error. */
GRADGATE_API int gg_allreduce_cuda(struct gg_session *s, void *devbuf, size_t count, enum gg_dtype dtype,
				   uint32_t tensor_id, void *stream, int timeout_ms, struct gg_error *err);

/* All-reduces `count` float32 elements in GPU memory, in place, through
 * the job's NCCL communicator, and returns once the result is in devbuf
 * or the step failed. The job's ranks at this site and their
 * gateway form that communicator: the ranks are its ranks 0..nranks-1 (as
 * in gg_session_open), the gateway, on its own GPU, its last rank,
 * nranks. Each step, every rank reduces (sums) its tensor to the gateway
 * (ncclReduce), which sums across sites on its GPU as for
 * gg_allreduce_cuda() and broadcasts the result into the ranks' tensors
 * (ncclBroadcast). NCCL moves the data between the GPUs, so the gateway
 * needs no CUDA IPC of the ranks' memory.
 *
 * The session's first call makes the communicator, collectively: every
 * rank of the job must make its first gg_allreduce_nccl() (for whichever
 * step), and the call waits up to its timeout_ms for them all and the
 * gateway to join (the step's own deadline runs after that); otherwise it
 * fails with GG_ERR_TIMEOUT saying the job's communicator did not come
 * up. The gateway gives the communicator the timeout of the job's first
 * call, from that call on. When the communicator can no longer come up
 * while the call waits (another rank of the job left or failed, the
 * gateway gave the communicator up or is shutting down), the gateway ends
 * the session at once and the call returns its reason and code
 * (GG_ERR_RANK, GG_ERR_CLOSED, ...), not at the timeout.
 *
 * devbuf     count float32 elements in CUDA device memory of the calling
 *            thread's current CUDA device at the session's first call: the
 *            rank joins the communicator on that device, and every call
 *            must pass memory of it. Any allocator's memory will do
 *            (cudaMalloc, cudaMallocAsync, PyTorch's); managed memory,
 *            host memory and memory of another GPU are refused with
 *            GG_ERR_INVALID.
 * dtype      GG_DTYPE_F32 only: NCCL sums in the element type, so bfloat16
 *            would be summed in bfloat16, not in float32 as the other calls
 *            do; it is refused with GG_ERR_INVALID (gg_allreduce_cuda takes
 *            it).
 * stream     a cudaStream_t of that device (NULL: the legacy default
 *            stream) on which the reduce and broadcast are queued: they
 *            read the tensor. The call first waits for the work queued on
 *            the stream before it, and returns once the reduce and the
 *            broadcast are done: the stream's work so far is done then.
 * tensor_id, timeout_ms  as for gg_allreduce(); the step's deadline runs
 *            from when the stream's work before the call is done and the
 *            step is announced, once the communicator is up. Every
 *            rank of a step at one site must use the same kind of call (all
 *            gg_allreduce_nccl, all gg_allreduce_cuda, or all host memory),
 *            otherwise the step fails with GG_ERR_MISMATCH.
 *
 * NCCL is loaded on first use: the process's own when it has one
 * (PyTorch's), else libnccl.so.2 (2.14 or later); libgradgate links no
 * NCCL or CUDA library. It must be the gateway's NCCL version: NCCL makes
 * a communicator only of ranks of one version. Errors besides
 * gg_allreduce()'s: GG_ERR_INVALID when libgradgate was built without
 * NCCL, or the gateway was (or has no GPU it can use), or the versions
 * differ (the message names both); when the gateway cannot serve the
 * first call (that, or the job's communicator was aborted or the job
 * failed before it), the session ends, with the gateway's reason;
 * GG_ERR_SYSTEM when no CUDA driver or no NCCL can be loaded (without a
 * driver, host memory too gets this answer, as for gg_allreduce_cuda) or
 * an NCCL call fails, here or at the gateway (the message names the call
 * and NCCL's error);
 * GG_ERR_TIMEOUT as above.
 *
 * An NCCL error at this rank (joining, or enqueueing the reduce and
 * broadcast) ends the session, which fails the step or the job at once for
 * the other ranks. A failure that leaves the ranks' NCCL calls unmatched (an
 * NCCL error, a step that failed before the gateway took the ranks'
 * reduce, such as a mismatch or a rank that left or missed the deadline, a
 * communicator that did not come up) aborts the communicator: this rank's part is
 * aborted too (ncclCommAbort), ending its reduce and broadcast still
 * queued on `stream`, and the session can make no more NCCL steps: they
 * fail with that error. Close the session and open a new one (the job's
 * other ranks too: their communicator is gone as well). A step that fails
 * later, as in the exchange with another site, leaves the communicator
 * usable. After a failed step the contents of `devbuf` are unspecified.
 * gg_session_close() flushes the session's communicator (ncclCommFinalize:
 * this rank may still be forwarding the last result to another) and
 * frees it, waiting 1 second at most for that, or aborts it after a
 * failure; it never waits for the other ranks to close. */
GRADGATE_API int gg_allreduce_nccl(struct gg_session *s, void *devbuf, size_t count, enum gg_dtype dtype,
				   uint32_t tensor_id, void *stream, int timeout_ms, struct gg_error *err);

/* Frees `req` (NULL is allowed). A request still in flight is detached:
 * its step goes on at the gateway, but its result is no longer written to
 * the caller's buffer, which the caller owns again from here on. */
GRADGATE_API void gg_request_free(struct gg_request *req);

/* Closes the connection and frees the session (NULL is allowed), its
 * shared buffers included. Answers that had already arrived complete their
 * requests first. It then waits, at most 2 seconds (longer for GPU
 * allocations, below), until the gateway is done with the session. A session is its rank's part in the job: closing
 * it, between steps too, fails the job at its other ranks (their steps
 * from then on fail with GG_ERR_RANK), and the gateway refuses new
 * sessions of the job (GG_ERR_REFUSED) until every rank has closed its
 * own. Once the job's last rank has, a new run of the job's name may
 * start, even after a step that was in flight. When the
 * session handed the gateway GPU allocations (gg_allreduce_cuda), the
 * gateway has let go of them by then, but for one that a step still in
 * flight there uses, which it lets go when that step ends. While an NCCL
 * call of the gateway's runs (any job's, gg_allreduce_nccl), it lets go
 * of them only once that call ends, by its step's deadline, and ends the
 * session then: so the close of a session that handed it any waits up
 * to the gateway's step_timeout and its grace (heartbeat_timeout) more
 * than 2 seconds. Free the allocations only once the session's steps are
 * done and its close has returned (a gateway that did not answer by then
 * may still have them open). Requests
 * the caller has not freed yet stay valid for gg_wait() (which then
 * returns GG_ERR_CLOSED if they had not finished) and gg_request_free().
 * Closing with a step in flight fails that step at the job's other ranks.
 * A session that failed keeps its shared buffers mapped until it is
 * closed, so their contents stay readable. */
GRADGATE_API void gg_session_close(struct gg_session *s);

/* A static, one-line description of `code` ("unknown error" for codes
 * outside enum gg_errc). */
GRADGATE_API const char *gg_strerror(int code);

/* Bytes per element of `dtype`; 0 for an unknown type. */
GRADGATE_API size_t gg_dtype_size(enum gg_dtype dtype);

/* The library's version, "MAJOR.MINOR.PATCH" (static). Programs linked
 * against libgradgate.so.MAJOR work with any later MINOR.PATCH of it. */
GRADGATE_API const char *gg_version(void);

#ifdef __cplusplus
}
#endif

#endif
