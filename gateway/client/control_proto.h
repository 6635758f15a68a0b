/* The control protocol between the client library and its site's gateway
 * (docs/control-protocol.md tells the whole story).
 *
 * Transport: a Unix SOCK_SEQPACKET socket, one message per packet, in host
 * byte order (both ends share a host). Every message starts with
 * struct gg_ctrl_hdr and has the exact size of its type's struct; strings
 * are NUL-terminated inside their fixed field with zeroes after the NUL.
 * Shared-memory regions travel as memfds in SCM_RIGHTS with GG_CTRL_MAP.
 *
 *   client                          gateway
 *   HELLO(version, job, rank, n) ->
 *                                <- ACCEPT(limits) | REFUSE(code, reason)
 *   MAP(region, size) + memfd    ->
 *   MAP_CUDA(region, size, ipc)  ->   (GPU memory instead of a memfd)
 *   NCCL_JOIN(timeout)           ->   (GPU mode with NCCL, once)
 *                                <- NCCL_ID(id, nranks, root)
 *   ALLREDUCE(seq, tensor, ...)  ->
 *                                <- DONE(seq, status, message)
 *   UNMAP(region)                ->
 *                                <- ERROR(code, message), then close
 */
#ifndef GG_CONTROL_PROTO_H
#define GG_CONTROL_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "gradgate.h"

#define GG_CTRL_MAGIC 0x31434747u /* "GGC1" */
#define GG_CTRL_VERSION 2u

#define GG_CTRL_NAME_SIZE 64  /* job and site names: 63 characters and the NUL */
#define GG_CTRL_TEXT_SIZE GG_ERROR_MESSAGE_MAX
#define GG_CTRL_MAX_INFLIGHT 8u   /* ALLREDUCE requests a session may have unanswered */
#define GG_CTRL_MAX_REGIONS 64u  /* staging (max in flight + 1) and shared buffers */
#define GG_CTRL_ALIGN 64u         /* where the library places staged tensors */
#define GG_CTRL_MAX_RANKS 4096u
#define GG_CTRL_RECV_MAX 512u     /* larger than every message */
#define GG_CTRL_STATUS_VERSION 1u
#define GG_CTRL_ADDRESS_SIZE 272  /* a peer's host:port as configured */
#define GG_CTRL_STATUS_MAX_JOBS 64u     /* jobs one answer lists */
#define GG_CTRL_STATUS_MAX_FAILURES 16u /* recent failures one answer lists */

enum gg_ctrl_type {
	GG_CTRL_HELLO = 1,
	GG_CTRL_ACCEPT = 2,
	GG_CTRL_REFUSE = 3,
	GG_CTRL_MAP = 4,
	GG_CTRL_UNMAP = 5,
	GG_CTRL_ALLREDUCE = 6,
	GG_CTRL_DONE = 7,
	GG_CTRL_ERROR = 8,
	GG_CTRL_STATUS = 9,
	GG_CTRL_STATUS_SITE = 10,
	GG_CTRL_STATUS_PEER = 11,
	GG_CTRL_STATUS_JOB = 12,
	GG_CTRL_STATUS_FAILURE = 13,
	GG_CTRL_MAP_CUDA = 14,
	GG_CTRL_NCCL_JOIN = 15,
	GG_CTRL_NCCL_ID = 16,
};

struct gg_ctrl_hdr {
	uint32_t magic;
	uint16_t type;     /* enum gg_ctrl_type */
	uint16_t flags;    /* 0 */
	uint32_t length;   /* of the whole message, header included */
	uint32_t reserved; /* 0 */
};

/* client -> gateway, first message. The version sits right after the
 * header in every protocol version, so a gateway can refuse one it does
 * not speak before looking at the rest. */
struct gg_ctrl_hello {
	struct gg_ctrl_hdr hdr;
	uint32_t version;
	uint32_t rank;
	uint32_t nranks;
	uint32_t reserved;
	char job[GG_CTRL_NAME_SIZE];
};

/* gateway -> client: the session is registered; these bound the session. */
struct gg_ctrl_accept {
	struct gg_ctrl_hdr hdr;
	uint32_t version;
	uint32_t max_inflight;      /* <= GG_CTRL_MAX_INFLIGHT */
	uint64_t max_message_bytes; /* count * element size of one ALLREDUCE */
	uint64_t max_region_bytes;  /* size of one MAP region */
	uint32_t max_regions;       /* regions mapped at once, <= GG_CTRL_MAX_REGIONS */
	uint32_t step_timeout_ms;
	/* Past a step's deadline, how long the gateway may still take to
	 * answer it: a site that said DONE waits that long for the others'. */
	uint32_t answer_grace_ms;
	uint32_t reserved;
	char site[GG_CTRL_NAME_SIZE];
};

/* gateway -> client: REFUSE answers a HELLO; ERROR reports a fatal
 * problem at any time. Both are followed by the gateway closing the
 * connection. `seq`: in an ERROR, the next step the gateway expected
 * from the rank; 0 in a REFUSE. The library reads neither. */
struct gg_ctrl_error {
	struct gg_ctrl_hdr hdr;
	int32_t code; /* enum gg_errc */
	uint32_t reserved;
	uint64_t seq;
	char message[GG_CTRL_TEXT_SIZE];
};

/* client -> gateway with one memfd in SCM_RIGHTS: sealed against
 * shrinking, `size_bytes` long, mapped by the gateway as region `region`
 * (a free id below max_regions) until UNMAP. */
struct gg_ctrl_map {
	struct gg_ctrl_hdr hdr;
	uint32_t region;
	uint32_t reserved;
	uint64_t size_bytes;
};

/* client -> gateway, no descriptor: region `region` (a free id below
 * max_regions) is the CUDA allocation of `size_bytes` whose cudaIpcMemHandle_t
 * (cuIpcGetMemHandle) is `ipc`, until UNMAP. The gateway opens it on its
 * own GPU; requests in it are summed and answered there. */
#define GG_CTRL_IPC_HANDLE_SIZE 64
struct gg_ctrl_map_cuda {
	struct gg_ctrl_hdr hdr;
	uint32_t region;
	uint32_t reserved;
	uint64_t size_bytes;
	unsigned char ipc[GG_CTRL_IPC_HANDLE_SIZE];
};

/* client -> gateway, once per session: the rank will all-reduce through
 * the job's NCCL communicator (gg_allreduce_nccl), of which the gateway is
 * the last rank. The gateway answers NCCL_ID and joins the communicator
 * itself; if the job's ranks have not all joined it within `timeout_ms`
 * (0: the step timeout) of the job's first NCCL_JOIN, the job fails.
 * `nccl_version`: the rank's NCCL as ncclGetVersion() gives it (22809 for
 * 2.28.9; 0: not known), which must be the gateway's: NCCL makes a
 * communicator only of ranks of one version. */
struct gg_ctrl_nccl_join {
	struct gg_ctrl_hdr hdr;
	uint32_t timeout_ms;
	uint32_t nccl_version;
};

/* gateway -> client: the ncclUniqueId of the job's communicator, which has
 * `nranks` ranks (the job's, and the gateway as rank `root` = nranks - 1). */
#define GG_CTRL_NCCL_ID_SIZE 128
struct gg_ctrl_nccl_id {
	struct gg_ctrl_hdr hdr;
	uint32_t nranks;
	uint32_t root;
	unsigned char id[GG_CTRL_NCCL_ID_SIZE];
};

/* ALLREDUCE's region for a step that travels through the job's NCCL
 * communicator: the rank ncclReduce()s its tensor to the gateway (root)
 * and receives the result by the gateway's ncclBroadcast(); offset 0. */
#define GG_CTRL_REGION_NCCL UINT32_MAX

/* client -> gateway: no request in flight uses `region` any more. */
struct gg_ctrl_unmap {
	struct gg_ctrl_hdr hdr;
	uint32_t region;
	uint32_t reserved;
};

/* client -> gateway: this rank's contribution to step `seq` (1, 2, 3, ...
 * per session) lies at `offset` (a multiple of the element size) in
 * `region`, count * element size bytes; the result is written back to the
 * same place before DONE. */
struct gg_ctrl_allreduce {
	struct gg_ctrl_hdr hdr;
	uint64_t seq;
	uint32_t tensor_id;
	uint32_t dtype; /* enum gg_dtype */
	uint64_t count;
	uint64_t offset;
	uint32_t region;
	uint32_t timeout_ms; /* 0: the gateway's step timeout */
};

/* gateway -> client: step `seq` finished; status 0 or an enum gg_errc code
 * with `message`. DONEs come in seq order. */
#define GG_CTRL_DONE_NCCL_ABORTED 1u /* the gateway aborted the job's NCCL communicator */
struct gg_ctrl_done {
	struct gg_ctrl_hdr hdr;
	uint64_t seq;
	int32_t status;
	uint32_t flags; /* GG_CTRL_DONE_* */
	char message[GG_CTRL_TEXT_SIZE];
};

/* client -> gateway, the first and only message of a connection that asks
 * for the gateway's status instead of opening a session. The answer is
 * STATUS_SITE, then the STATUS_PEER, STATUS_JOB and STATUS_FAILURE
 * messages it announces, in that order; or REFUSE. Then the gateway
 * closes the connection. */
struct gg_ctrl_status {
	struct gg_ctrl_hdr hdr;
	uint32_t version; /* GG_CTRL_STATUS_VERSION */
	uint32_t reserved;
};

struct gg_ctrl_status_site {
	struct gg_ctrl_hdr hdr;
	uint32_t version;        /* GG_CTRL_STATUS_VERSION */
	uint32_t peers;          /* STATUS_PEER messages that follow, <= 7 */
	uint32_t jobs;           /* STATUS_JOB messages that follow, <= GG_CTRL_STATUS_MAX_JOBS */
	uint32_t failures;       /* STATUS_FAILURE messages that follow, <= GG_CTRL_STATUS_MAX_FAILURES */
	uint64_t uptime_ms;
	uint64_t jobs_total;     /* jobs at the gateway: more than `jobs` when some are left out */
	uint64_t steps_done;     /* steps completed since the start */
	uint64_t steps_failed;   /* steps failed here since the start */
	char site[GG_CTRL_NAME_SIZE];
	char gateway_version[32];
};

/* One peer site, as this gateway sees it. */
struct gg_ctrl_status_peer {
	struct gg_ctrl_hdr hdr;
	uint32_t streams_up;
	uint32_t streams;        /* streams_per_peer */
	uint64_t rtt_us;         /* the last heartbeat round trip; 0: none measured yet */
	uint64_t bytes_in;       /* what its TCP streams carried, TLS included */
	uint64_t bytes_out;
	uint64_t heard_ms_ago;   /* since anything came from it; UINT64_MAX: never */
	char site[GG_CTRL_NAME_SIZE];
	char address[GG_CTRL_ADDRESS_SIZE];
};

enum gg_ctrl_job_state {
	GG_CTRL_JOB_IDLE = 1,      /* no rank announced the next step yet */
	GG_CTRL_JOB_GATHERING = 2, /* some ranks announced it; the gateway waits for the others */
	GG_CTRL_JOB_RUNNING = 3,   /* the step is with the other sites */
	GG_CTRL_JOB_FAILED = 4,    /* a rank left or broke the protocol: steps fail until all have left */
};

struct gg_ctrl_status_job {
	struct gg_ctrl_hdr hdr;
	uint32_t nranks;
	uint32_t connected;      /* ranks connected now */
	uint64_t last_step;      /* the last step that ended, completed or failed; 0: none */
	uint32_t state;          /* enum gg_ctrl_job_state */
	uint32_t uid;            /* the user its ranks run as */
	char job[GG_CTRL_NAME_SIZE];
};

/* A step that failed at this site, newest first. */
struct gg_ctrl_status_failure {
	struct gg_ctrl_hdr hdr;
	uint64_t step;
	int32_t code;            /* enum gg_errc */
	uint32_t reserved;
	uint64_t age_ms;         /* how long ago */
	uint64_t unix_ms;        /* when, by the gateway's clock */
	char job[GG_CTRL_NAME_SIZE];
	char message[GG_CTRL_TEXT_SIZE];
};

_Static_assert(sizeof(struct gg_ctrl_hdr) == 16, "wire layout");
_Static_assert(sizeof(struct gg_ctrl_hello) == 96, "wire layout");
_Static_assert(sizeof(struct gg_ctrl_accept) == 120, "wire layout");
_Static_assert(sizeof(struct gg_ctrl_error) == 288, "wire layout");
_Static_assert(sizeof(struct gg_ctrl_map) == 32, "wire layout");
_Static_assert(sizeof(struct gg_ctrl_unmap) == 24, "wire layout");
_Static_assert(sizeof(struct gg_ctrl_map_cuda) == 96, "wire layout");
_Static_assert(sizeof(struct gg_ctrl_nccl_join) == 24, "wire layout");
_Static_assert(sizeof(struct gg_ctrl_nccl_id) == 152, "wire layout");
_Static_assert(sizeof(struct gg_ctrl_allreduce) == 56, "wire layout");
_Static_assert(sizeof(struct gg_ctrl_done) == 288, "wire layout");
_Static_assert(sizeof(struct gg_ctrl_status) == 24, "wire layout");
_Static_assert(sizeof(struct gg_ctrl_status_site) == 160, "wire layout");
_Static_assert(sizeof(struct gg_ctrl_status_peer) == 392, "wire layout");
_Static_assert(sizeof(struct gg_ctrl_status_job) == 104, "wire layout");
_Static_assert(sizeof(struct gg_ctrl_status_failure) == 368, "wire layout");

/* Any message, for receiving into. */
union gg_ctrl_msg {
	struct gg_ctrl_hdr hdr;
	struct gg_ctrl_hello hello;
	struct gg_ctrl_accept accept;
	struct gg_ctrl_error error;
	struct gg_ctrl_map map;
	struct gg_ctrl_map_cuda map_cuda;
	struct gg_ctrl_nccl_join nccl_join;
	struct gg_ctrl_nccl_id nccl_id;
	struct gg_ctrl_unmap unmap;
	struct gg_ctrl_allreduce allreduce;
	struct gg_ctrl_done done;
	struct gg_ctrl_status status;
	struct gg_ctrl_status_site status_site;
	struct gg_ctrl_status_peer status_peer;
	struct gg_ctrl_status_job status_job;
	struct gg_ctrl_status_failure status_failure;
	unsigned char bytes[GG_CTRL_RECV_MAX];
};

/* Zeroes `msg` and fills its header for `type`; returns its wire size. */
size_t gg_ctrl_init(union gg_ctrl_msg *msg, enum gg_ctrl_type type);

/* "HELLO", "DONE", ...; "unknown" for anything else. */
const char *gg_ctrl_type_name(unsigned type);

/* Checks the header and size of a received packet of `len` bytes (the
 * whole packet: a longer one must be reported with a len above
 * GG_CTRL_RECV_MAX) and the fixed fields every message of its type must
 * hold: reserved fields zero, strings terminated and free of control
 * characters. Returns the type, or
 * GG_ERR_PROTOCOL with `why` ("truncated DONE: 40 of 288 bytes"). A HELLO
 * of another protocol version is returned as GG_CTRL_HELLO when its
 * version field is readable, for the caller to refuse it by version. */
int gg_ctrl_check(const union gg_ctrl_msg *msg, size_t len, char *why, size_t why_size);

/* Whether a packet of `len` bytes is whole as a message the gateway sends
 * (magic, type, header length and the type's size), whatever its fields
 * hold: a gateway refuses it from a client for its direction alone. */
bool gg_ctrl_from_gateway(const union gg_ctrl_msg *msg, size_t len);

/* Copies `text` into a fixed string field, cut at size - 1 characters
 * (never inside a UTF-8 sequence) and zero-padded. */
void gg_ctrl_set_text(char *field, size_t size, const char *text);

/* Whether `job` is a valid job name (1-63 of A-Z a-z 0-9 . _ -); when not,
 * `why` says what is wrong. */
bool gg_ctrl_job_name_ok(const char *job, char *why, size_t why_size);

/* "GG_ERR_TIMEOUT", ...: the name of an enum gg_errc code; NULL for a
 * code the library does not have. */
const char *gg_errc_name(int code);

/* "float32", "bfloat16"; NULL for an unknown type. */
const char *gg_dtype_name(uint32_t dtype);

/* Room for one passed descriptor in a msghdr's control data. */
#define GG_CTRL_CMSG_BYTES CMSG_SPACE(sizeof(int))

/* Makes `mh` carry `fd` with SCM_RIGHTS, using `cbuf` (GG_CTRL_CMSG_BYTES,
 * aligned for struct cmsghdr) as its control data. */
void gg_ctrl_attach_fd(struct msghdr *mh, void *cbuf, int fd);

#endif
