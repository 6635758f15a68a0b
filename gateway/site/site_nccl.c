/* The gateway's calls of a job's NCCL communicator (site_nccl.h), on its
 * GPU: the first one it sees, as for site_cuda.h. The communicator is
 * non-blocking (ncclConfig_t.blocking = 0) and its calls go on a stream
 * of its own, so nothing here waits for the other ranks: poll() looks at
 * both, and ncclCommAbort() gives up the gateway's own calls (each rank
 * ends its own by aborting its part, when its DONE tells it to). */
#include "site_nccl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "cuda_check.h"
#include "dev_mem.h"
#include "log.h"
#include "nccl_root.h"
#include "site_cuda.h"

_Static_assert(sizeof(ncclUniqueId) == GG_SITE_NCCL_ID_SIZE, "ncclUniqueId size");
_Static_assert(GG_NCCL_ROOT_ID_SIZE == GG_SITE_NCCL_ID_SIZE, "ncclUniqueId size");

#define NEG_ZERO_BITS 0x80000000u /* -0.0f: x + -0.0f == x for every x, -0.0 included */

struct comm {
	ncclComm_t nc;
	void *stream;
	unsigned root;
};

static int nccl_fail(ncclResult_t r, ncclComm_t nc, const char *what, const char *file, int line, char *err,
		     size_t err_size)
{
	const char *last = ncclGetLastError(nc);

	snprintf(err, err_size, "%s:%d: %s: %s%s%s%s", gg_source_path(file), line, what, ncclGetErrorString(r),
		 last && *last ? " (" : "", last && *last ? last : "", last && *last ? ")" : "");
	return r == ncclInvalidArgument || r == ncclInvalidUsage ? -EINVAL : -EIO;
}

#define NCCL_CHECK(call, nc, err, err_size)                                                               \
	do {                                                                                               \
		ncclResult_t r_ = (call);                                                                  \
		if (r_ != ncclSuccess && r_ != ncclInProgress)                                             \
			return nccl_fail(r_, (nc), #call, __FILE__, __LINE__, (err), (err_size));          \
	} while (0)

/* The communicator's state: 0, -EINPROGRESS (joining, or a call being
 * enqueued), or what failed it. */
static int comm_state(struct comm *c, char *err, size_t err_size)
{
	ncclResult_t st = ncclSuccess;

	NCCL_CHECK(ncclCommGetAsyncError(c->nc, &st), c->nc, err, err_size);
	if (st == ncclInProgress)
		return -EINPROGRESS;
	if (st != ncclSuccess)
		return nccl_fail(st, c->nc, "the job's NCCL communicator", __FILE__, __LINE__, err, err_size);
	return 0;
}

/* The bootstrap roots of the ids made here (on the backend's thread). */
static struct gg_nccl_roots roots;

static int real_unique_id(unsigned char id[GG_SITE_NCCL_ID_SIZE], char *err, size_t err_size)
{
	ncclUniqueId u;
	int rc;

	/* Before the root starts: a gateway that cannot join would leave it. */
	if ((rc = gg_cuda_use_gpu(err, err_size)))
		return rc;
	NCCL_CHECK(ncclGetUniqueId(&u), NULL, err, err_size);
	memcpy(id, u.internal, GG_SITE_NCCL_ID_SIZE);
	static bool told;
	if (!gg_nccl_root_watch(&roots, id) && !getenv("NCCL_COMM_ID") && !told) {
		told = true;
		gg_log(GG_LOG_WARN, "nccl_root_unwatched",
		       "reason=\"the gateway cannot hold NCCL's bootstrap root for its ids (no socket of it listens "
		       "at the address an id names, or memory or descriptors ran out): a communicator given up before "
		       "every rank joined leaves the root (a socket and a thread) in the gateway\"");
	}
	return 0;
}

static void real_end_id(const unsigned char id[GG_SITE_NCCL_ID_SIZE])
{
	(void)gg_nccl_root_end(&roots, id);
}

/* How long finish() waits for the flush; a peer that is gone takes no
 * longer to give up on. */
#define FINISH_WAIT_NS 200000000L

static void real_close(void *comm)
{
	struct comm *c = comm;

	if (!c)
		return;
	if (c->nc)
		(void)ncclCommAbort(c->nc);
	gg_dev_stream_free(c->stream);
	free(c);
}

static void real_finish(void *comm)
{
	struct comm *c = comm;
	struct timespec start, now, nap = { 0, 100000 };
	ncclResult_t st = ncclInProgress;

	if (!c)
		return;
	clock_gettime(CLOCK_MONOTONIC, &start);
	ncclResult_t r = ncclCommFinalize(c->nc);
	while ((r == ncclSuccess || r == ncclInProgress) && ncclCommGetAsyncError(c->nc, &st) == ncclSuccess &&
	       st == ncclInProgress) {
		clock_gettime(CLOCK_MONOTONIC, &now);
		if ((now.tv_sec - start.tv_sec) * 1000000000L + (now.tv_nsec - start.tv_nsec) > FINISH_WAIT_NS)
			break;
		nanosleep(&nap, NULL);
	}
	if ((r == ncclSuccess || r == ncclInProgress) && st == ncclSuccess) {
		r = ncclCommDestroy(c->nc);
		if (r == ncclSuccess || r == ncclInProgress)
			c->nc = NULL; /* freed, or being freed by NCCL */
	}
	real_close(c); /* aborts what is left */
}

static int real_open(void **comm, const unsigned char id[GG_SITE_NCCL_ID_SIZE], unsigned nranks, unsigned rank,
		     char *err, size_t err_size)
{
	struct comm *c = calloc(1, sizeof(*c));
	ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
	ncclUniqueId u;
	int rc;

	*comm = NULL;
	if (!c) {
		snprintf(err, err_size, "out of memory for an NCCL communicator");
		return -ENOMEM;
	}
	if ((rc = gg_cuda_use_gpu(err, err_size)) || (rc = gg_dev_stream_new(&c->stream, err, err_size))) {
		free(c);
		return rc;
	}
	memcpy(u.internal, id, GG_SITE_NCCL_ID_SIZE);
	config.blocking = 0;
	c->root = rank;
	ncclResult_t r = ncclCommInitRankConfig(&c->nc, (int)nranks, u, (int)rank, &config);
	if (r != ncclSuccess && r != ncclInProgress) {
		rc = nccl_fail(r, c->nc, "ncclCommInitRankConfig", __FILE__, __LINE__, err, err_size);
		real_close(c);
		return rc;
	}
	*comm = c;
	return 0;
}

static int real_poll(void *comm, char *err, size_t err_size)
{
	struct comm *c = comm;
	int rc = comm_state(c, err, err_size);

	if (rc)
		return rc;
	cudaError_t e = cudaStreamQuery((cudaStream_t)c->stream);
	if (e == cudaErrorNotReady) {
		/* Not an error, but a runtime may keep it as the thread's last
		 * one, which the next kernel launch's check would then report. */
		(void)cudaGetLastError();
		return -EINPROGRESS;
	}
	if (e != cudaSuccess)
		return gg_cuda_fail(e, "cudaStreamQuery (the communicator's stream)", __FILE__, __LINE__, err, err_size);
	return 0;
}

static int real_alloc(float **sum, uint64_t count, char *err, size_t err_size)
{
	return gg_dev_alloc((void **)sum, count * sizeof(float), err, err_size);
}

static void real_free(float *sum)
{
	gg_dev_free(sum);
}

static int real_reduce(void *comm, float *sum, uint64_t count, char *err, size_t err_size)
{
	struct comm *c = comm;
	int rc;

	if ((rc = gg_site_cuda_fill_async((uint32_t *)sum, NEG_ZERO_BITS, count, c->stream, err, err_size)))
		return rc;
	NCCL_CHECK(ncclReduce(sum, sum, count, ncclFloat32, ncclSum, (int)c->root, c->nc, (cudaStream_t)c->stream),
		   c->nc, err, err_size);
	return 0;
}

static int real_broadcast(void *comm, const float *sum, uint64_t count, char *err, size_t err_size)
{
	struct comm *c = comm;

	NCCL_CHECK(ncclBroadcast(sum, (void *)sum, count, ncclFloat32, (int)c->root, c->nc, (cudaStream_t)c->stream),
		   c->nc, err, err_size);
	return 0;
}

static int real_version(void)
{
	int v = 0;

	return ncclGetVersion(&v) == ncclSuccess ? v : 0;
}

const struct gg_site_nccl_ops gg_site_nccl_real = {
	.version = real_version,
	.unique_id = real_unique_id,
	.end_id = real_end_id,
	.open = real_open,
	.poll = real_poll,
	.alloc = real_alloc,
	.free = real_free,
	.reduce = real_reduce,
	.broadcast = real_broadcast,
	.close = real_close,
	.finish = real_finish,
};
