#include "nccl_lib.h"

#include <stdio.h>

#include "gg_build_config.h"
#include "gradgate.h"

#if HAVE_NCCL

#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>

/* The types and values only: the calls go through `lib`, so nothing here
 * links against libnccl or the CUDA runtime. */
#include <nccl.h>

#include "control_conn.h"

_Static_assert(sizeof(ncclUniqueId) == GG_NCCL_ID_SIZE, "ncclUniqueId size");

struct nccl_lib {
	ncclResult_t (*comm_init_rank_config)(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
					      ncclConfig_t *config);
	ncclResult_t (*comm_get_async_error)(ncclComm_t comm, ncclResult_t *async_error);
	ncclResult_t (*reduce)(const void *sendbuf, void *recvbuf, size_t count, ncclDataType_t dtype,
			       ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);
	ncclResult_t (*broadcast)(const void *sendbuf, void *recvbuf, size_t count, ncclDataType_t dtype, int root,
				  ncclComm_t comm, cudaStream_t stream);
	ncclResult_t (*comm_abort)(ncclComm_t comm);
	ncclResult_t (*comm_finalize)(ncclComm_t comm);
	ncclResult_t (*comm_destroy)(ncclComm_t comm);
	const char *(*get_error_string)(ncclResult_t result);
	const char *(*get_last_error)(ncclComm_t comm);
	ncclResult_t (*get_version)(int *version);
	char error[240]; /* why loading failed; "" when it worked */
};
static struct nccl_lib lib;
static pthread_once_t lib_once = PTHREAD_ONCE_INIT;

static void lib_load(void)
{
	static const struct {
		const char *name;
		size_t offset;
	} syms[] = {
		/* First: the one the process's own NCCL is looked up by. */
		{ "ncclCommInitRankConfig", offsetof(struct nccl_lib, comm_init_rank_config) },
		{ "ncclCommGetAsyncError", offsetof(struct nccl_lib, comm_get_async_error) },
		{ "ncclReduce", offsetof(struct nccl_lib, reduce) },
		{ "ncclBroadcast", offsetof(struct nccl_lib, broadcast) },
		{ "ncclCommAbort", offsetof(struct nccl_lib, comm_abort) },
		{ "ncclCommFinalize", offsetof(struct nccl_lib, comm_finalize) },
		{ "ncclCommDestroy", offsetof(struct nccl_lib, comm_destroy) },
		{ "ncclGetErrorString", offsetof(struct nccl_lib, get_error_string) },
		{ "ncclGetLastError", offsetof(struct nccl_lib, get_last_error) },
		{ "ncclGetVersion", offsetof(struct nccl_lib, get_version) },
	};
	/* A process that has NCCL already (PyTorch's) keeps to it: a second
	 * NCCL in one process would be a second set of threads, network
	 * plugins and environment settings, maybe of another version. Python
	 * loads extension modules, and the libnccl.so.2 they need, with
	 * RTLD_LOCAL: the global scope misses it, but its soname finds it. */
	void *handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
	const char *from = "the process's own NCCL";

	if (!handle && dlsym(RTLD_DEFAULT, syms[0].name))
		handle = RTLD_DEFAULT; /* linked in statically */
	if (!handle) {
		handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
		if (!handle) {
			const char *why = dlerror();
			snprintf(lib.error, sizeof(lib.error), "NCCL cannot be loaded: %s",
				 why ? why : "libnccl.so.2 not found");
			return;
		}
		from = "libnccl.so.2";
	}
	for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
		void *fn = dlsym(handle, syms[i].name);
		if (!fn) {
			snprintf(lib.error, sizeof(lib.error), "%s has no %s (gg_allreduce_nccl needs NCCL 2.14 or "
				 "later)", from, syms[i].name);
			return;
		}
		memcpy((char *)&lib + syms[i].offset, &fn, sizeof(fn));
	}
}

int gg_nccl_load(char *err, size_t err_size)
{
	pthread_once(&lib_once, lib_load);
	if (lib.error[0]) {
		snprintf(err, err_size, "%s", lib.error);
		return GG_ERR_SYSTEM;
	}
	return 0;
}

int gg_nccl_version(void)
{
	int v = 0;

	pthread_once(&lib_once, lib_load);
	return !lib.error[0] && lib.get_version(&v) == ncclSuccess ? v : 0;
}

/* `what`, called at file:line, failed with `r`: NCCL's name for it, and
 * the last error NCCL recorded for `comm` (NULL: for the thread), which
 * says more. */
static int nccl_fail(ncclResult_t r, ncclComm_t comm, const char *what, const char *file, int line, char *err,
		     size_t err_size)
{
	const char *name = lib.get_error_string(r);
	const char *last = lib.get_last_error(comm);
	bool more = last && *last;

	snprintf(err, err_size, "%s:%d: %s: %s (NCCL error %d%s%s)", gg_source_path(file), line, what,
		 name ? name : "unknown NCCL error", (int)r, more ? ": " : "", more ? last : "");
	return GG_ERR_SYSTEM;
}

/* Between two looks at a call still in progress: a yield at first, for
 * what takes microseconds (enqueueing), then naps of up to a millisecond
 * (joining takes the other ranks' time). */
static void nap(unsigned looks)
{
	if (looks < 64) {
		sched_yield();
		return;
	}
	struct timespec ts = { 0, looks < 1024 ? 50000 : 1000000 };
	nanosleep(&ts, NULL);
}

/* Waits until the communicator's last call, which returned `r`, is done:
 * non-blocking, the call may have returned ncclInProgress and go on in
 * NCCL's threads, and the communicator takes no other call until then.
 * `stop` (NULL: none), asked between looks, ends the wait with
 * GG_ERR_CLOSED. A failure names `what` and the file:line of settle(). */
static int settle_at(ncclComm_t comm, ncclResult_t r, const char *what, const char *file, int line,
		     uint64_t deadline_ms, const struct gg_nccl_stop *stop, char *err, size_t err_size)
{
	if (r != ncclSuccess && r != ncclInProgress)
		return nccl_fail(r, comm, what, file, line, err, err_size);
	for (unsigned looks = 0;; looks++) {
		ncclResult_t state = ncclInProgress;
		if ((r = lib.comm_get_async_error(comm, &state)) != ncclSuccess)
			return nccl_fail(r, comm, "ncclCommGetAsyncError", __FILE__, __LINE__, err, err_size);
		if (state == ncclSuccess)
			return 0;
		if (state != ncclInProgress)
			return nccl_fail(state, comm, what, file, line, err, err_size);
		if (gg_ctrl_now_ms() >= deadline_ms) {
			snprintf(err, err_size, "%s was still in progress at its deadline", what);
			return GG_ERR_TIMEOUT;
		}
		if (stop && stop->fn(stop->arg)) {
			snprintf(err, err_size, "%s was given up", what);
			return GG_ERR_CLOSED;
		}
		nap(looks);
	}
}
#define settle(comm, r, what, deadline_ms, stop, err, err_size) \
	settle_at(comm, r, what, __FILE__, __LINE__, deadline_ms, stop, err, err_size)

int gg_nccl_join(void **comm, const unsigned char id[GG_NCCL_ID_SIZE], unsigned nranks, unsigned rank,
		 uint64_t deadline_ms, const struct gg_nccl_stop *stop, char *err, size_t err_size)
{
	ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
	ncclUniqueId uid;
	ncclComm_t c = NULL;
	int rc;

	*comm = NULL;
	if ((rc = gg_nccl_load(err, err_size)))
		return rc;
	memcpy(uid.internal, id, sizeof(uid.internal));
	/* Non-blocking, so that the wait for the other ranks has a deadline
	 * and a rank that never comes does not hang this one. */
	config.blocking = 0;
	ncclResult_t r = lib.comm_init_rank_config(&c, (int)nranks, uid, (int)rank, &config);
	if ((rc = settle(c, r, "ncclCommInitRankConfig", deadline_ms, stop, err, err_size))) {
		if (c)
			(void)lib.comm_abort(c);
		return rc;
	}
	*comm = c;
	return 0;
}

int gg_nccl_reduce_broadcast(void *comm, void *buf, size_t count, unsigned root, void *stream,
			     uint64_t deadline_ms, char *err, size_t err_size)
{
	ncclComm_t c = comm;
	int rc;

	ncclResult_t r = lib.reduce(buf, buf, count, ncclFloat32, ncclSum, (int)root, c, (cudaStream_t)stream);
	if ((rc = settle(c, r, "ncclReduce of the tensor to the gateway", deadline_ms, NULL, err, err_size)))
		return rc;
	r = lib.broadcast(buf, buf, count, ncclFloat32, (int)root, c, (cudaStream_t)stream);
	return settle(c, r, "ncclBroadcast of the result from the gateway", deadline_ms, NULL, err, err_size);
}

void gg_nccl_abort(void *comm)
{
	/* A communicator exists only once NCCL was loaded. */
	if (comm)
		(void)lib.comm_abort((ncclComm_t)comm);
}

void gg_nccl_finish(void *comm, uint64_t deadline_ms)
{
	ncclComm_t c = comm;
	char err[GG_ERROR_MESSAGE_MAX];

	if (!c)
		return;
	if (!settle(c, lib.comm_finalize(c), "ncclCommFinalize", deadline_ms, NULL, err, sizeof(err))) {
		ncclResult_t r = lib.comm_destroy(c);
		if (r == ncclSuccess || r == ncclInProgress)
			return; /* freed, or being freed by NCCL */
	}
	(void)lib.comm_abort(c);
}

#else /* !HAVE_NCCL */

#define NO_NCCL                                                                                            \
	"libgradgate was built without NCCL, so it cannot make NCCL steps (gg_allreduce_nccl); use "         \
	"gg_allreduce_cuda"

int gg_nccl_load(char *err, size_t err_size)
{
	snprintf(err, err_size, "%s", NO_NCCL);
	return GG_ERR_INVALID;
}

int gg_nccl_version(void)
{
	return 0;
}

int gg_nccl_join(void **comm, const unsigned char id[GG_NCCL_ID_SIZE], unsigned nranks, unsigned rank,
		 uint64_t deadline_ms, const struct gg_nccl_stop *stop, char *err, size_t err_size)
{
	*comm = NULL;
	return gg_nccl_load(err, err_size);
}

int gg_nccl_reduce_broadcast(void *comm, void *buf, size_t count, unsigned root, void *stream,
			     uint64_t deadline_ms, char *err, size_t err_size)
{
	return gg_nccl_load(err, err_size);
}

void gg_nccl_abort(void *comm)
{
	/* gg_nccl_join never made one. */
}

void gg_nccl_finish(void *comm, uint64_t deadline_ms)
{
	/* gg_nccl_join never made one. */
}

#endif
