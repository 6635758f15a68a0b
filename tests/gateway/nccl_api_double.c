/* nccl_api_double.h: ncclCommInitRankConfig() and the rest of what
 * gateway/client/nccl_lib.c calls, over nccl_double.h. */
#include "nccl_api_double.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nccl.h>

#include "fake_cuda_driver.h"
#include "nccl_double.h"

#define API __attribute__((visibility("default")))
/* How long a rank waits for the others to join: longer than any test
 * waits, as NCCL waits for ever; an abort ends it. */
#define JOIN_WAIT_MS 60000

struct ncclComm {
	struct ncclComm *next;
	unsigned char id[GG_SITE_NCCL_ID_SIZE];
	int nranks, rank;
	pthread_t joiner;
	bool has_joiner;
	bool cancel;             /* nd_cancel()'s flag: the rank aborts its join */
	bool failing;            /* NAD_JOIN was drawn for it */
	ncclResult_t state;      /* ncclCommGetAsyncError's: ncclInProgress while joining */
	struct nd_rank *r;       /* once joined */
	bool reduced;            /* a reduce waits for its broadcast */
	void *reduce_buf;
	size_t reduce_count;
	void *stream;            /* of the last step enqueued */
	char last[160];          /* ncclGetLastError() */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct ncclComm *comms;
static enum nad_fault fault;
static bool nonblocking;
static unsigned aborts, finalizes, reduces;
static char last_global[160];

void nad_fail_next(enum nad_fault what)
{
	pthread_mutex_lock(&lock);
	fault = what;
	pthread_mutex_unlock(&lock);
}

unsigned nad_live(void)
{
	unsigned n = 0;

	pthread_mutex_lock(&lock);
	for (const struct ncclComm *c = comms; c; c = c->next)
		n++;
	pthread_mutex_unlock(&lock);
	return n;
}

bool nad_last_nonblocking(void)
{
	pthread_mutex_lock(&lock);
	bool nb = nonblocking;
	pthread_mutex_unlock(&lock);
	return nb;
}

unsigned nad_reduces(void)
{
	pthread_mutex_lock(&lock);
	unsigned n = reduces;
	pthread_mutex_unlock(&lock);
	return n;
}

void nad_counts(unsigned *aborts_out, unsigned *finalizes_out)
{
	pthread_mutex_lock(&lock);
	*aborts_out = aborts;
	*finalizes_out = finalizes;
	pthread_mutex_unlock(&lock);
}

/* Under the lock. */
static bool drawn(enum nad_fault what, struct ncclComm *c)
{
	if (fault != what)
		return false;
	fault = NAD_NONE;
	snprintf(c ? c->last : last_global, sizeof(last_global), "injected failure");
	return true;
}

/* A call the library must never make. Under the lock. */
static ncclResult_t misuse(struct ncclComm *c, const char *what)
{
	snprintf(c->last, sizeof(c->last), "nccl_api_double: %s", what);
	fprintf(stderr, "nccl_api_double: rank %d: %s\n", c->rank, what);
	return ncclInvalidUsage;
}

/* The stream's work is done once its rank's step is (fake_cuda_driver.h's
 * hook). Streams no communicator used are idle. */
static bool stream_done(void *stream)
{
	bool done = true;

	pthread_mutex_lock(&lock);
	for (struct ncclComm *c = comms; c; c = c->next)
		if (c->stream == stream && c->r && nd_sync(c->r, 0))
			done = false;
	pthread_mutex_unlock(&lock);
	return done;
}

static void *join_main(void *arg)
{
	struct ncclComm *c = arg;
	struct nd_rank *r = NULL;

	if (!c->failing)
		r = nd_join(c->id, (unsigned)c->nranks, (unsigned)c->rank, JOIN_WAIT_MS, &c->cancel);
	pthread_mutex_lock(&lock);
	c->r = r;
	if (r)
		c->state = ncclSuccess;
	else if (c->failing)
		c->state = ncclUnhandledCudaError;
	else
		c->state = ncclSystemError;
	if (!r && !c->failing)
		snprintf(c->last, sizeof(c->last), "aborted while joining, or the other ranks never came");
	pthread_mutex_unlock(&lock);
	return NULL;
}

API ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
					ncclConfig_t *config)
{
	struct ncclComm *c = calloc(1, sizeof(*c));

	*comm = NULL;
	if (!c)
		return ncclSystemError;
	fcd_set_stream_hook(stream_done);
	pthread_mutex_lock(&lock);
	nonblocking = config && config->blocking == 0;
	if (drawn(NAD_INIT, NULL)) {
		pthread_mutex_unlock(&lock);
		free(c);
		return ncclUnhandledCudaError;
	}
	memcpy(c->id, id.internal, sizeof(c->id));
	c->nranks = nranks;
	c->rank = rank;
	c->state = ncclInProgress;
	c->failing = drawn(NAD_JOIN, c);
	c->next = comms;
	comms = c;
	pthread_mutex_unlock(&lock);
	bool started = !pthread_create(&c->joiner, NULL, join_main, c);
	pthread_mutex_lock(&lock);
	c->has_joiner = started;
	if (!started)
		c->state = ncclSystemError;
	pthread_mutex_unlock(&lock);
	*comm = c;
	return nonblocking ? ncclInProgress : ncclSuccess;
}

API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async_error)
{
	pthread_mutex_lock(&lock);
	*async_error = comm->state;
	pthread_mutex_unlock(&lock);
	return ncclSuccess;
}

API ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
			    ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
	ncclResult_t rc = ncclSuccess;

	(void)stream;
	pthread_mutex_lock(&lock);
	if (comm->state != ncclSuccess || !comm->r)
		rc = misuse(comm, "ncclReduce on a communicator that is not up");
	else if (sendbuff != recvbuff || datatype != ncclFloat32 || op != ncclSum || root != comm->nranks - 1)
		rc = misuse(comm, "ncclReduce other than in place, float32, sum, to the last rank");
	else if (comm->reduced)
		rc = misuse(comm, "two ncclReduce without a broadcast");
	else if (drawn(NAD_REDUCE, comm))
		rc = ncclUnhandledCudaError;
	else {
		reduces++;
		comm->reduced = true;
		comm->reduce_buf = recvbuff;
		comm->reduce_count = count;
	}
	pthread_mutex_unlock(&lock);
	return rc;
}

API ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
			       ncclComm_t comm, cudaStream_t stream)
{
	ncclResult_t rc = ncclSuccess;

	pthread_mutex_lock(&lock);
	if (!comm->reduced || recvbuff != comm->reduce_buf || count != comm->reduce_count)
		rc = misuse(comm, "ncclBroadcast that is not of the reduce before it");
	else if (sendbuff != recvbuff || datatype != ncclFloat32 || root != comm->nranks - 1)
		rc = misuse(comm, "ncclBroadcast other than in place, float32, from the last rank");
	else if (drawn(NAD_BROADCAST, comm))
		rc = ncclUnhandledCudaError;
	else {
		comm->reduced = false;
		comm->stream = stream;
		nd_enqueue(comm->r, recvbuff, count, false);
	}
	pthread_mutex_unlock(&lock);
	return rc;
}

/* Ends the rank's part: its join, its step on its stream. */
static void comm_free(ncclComm_t comm, bool abort)
{
	nd_cancel(&comm->cancel);
	if (comm->has_joiner)
		pthread_join(comm->joiner, NULL);
	pthread_mutex_lock(&lock);
	for (struct ncclComm **p = &comms; *p; p = &(*p)->next)
		if (*p == comm) {
			*p = comm->next;
			break;
		}
	aborts += abort;
	pthread_mutex_unlock(&lock);
	nd_abort(comm->r);
	free(comm);
}

API ncclResult_t ncclCommAbort(ncclComm_t comm)
{
	if (comm)
		comm_free(comm, true);
	return ncclSuccess;
}

API ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
	pthread_mutex_lock(&lock);
	ncclResult_t rc = comm->state == ncclSuccess ? ncclSuccess : misuse(comm, "ncclCommFinalize of a failed communicator");
	finalizes += rc == ncclSuccess;
	pthread_mutex_unlock(&lock);
	return rc;
}

API ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
	if (comm)
		comm_free(comm, false);
	return ncclSuccess;
}

API const char *ncclGetErrorString(ncclResult_t result)
{
	switch (result) {
	case ncclSuccess:
		return "no error";
	case ncclUnhandledCudaError:
		return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
	case ncclSystemError:
		return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
	case ncclInvalidUsage:
		return "invalid usage (run with NCCL_DEBUG=WARN for details)";
	case ncclInProgress:
		return "NCCL operation in progress";
	default:
		return "unknown result code";
	}
}

API const char *ncclGetLastError(ncclComm_t comm)
{
	return comm ? comm->last : last_global;
}

API ncclResult_t ncclGetVersion(int *version)
{
	*version = ND_NCCL_VERSION;
	return ncclSuccess;
}

/* The gateway's call (gateway/site/site_nccl.c, linked but not used: the
 * gateway of the test has nccl_double_ops). */
API ncclResult_t ncclGetUniqueId(ncclUniqueId *unique_id)
{
	(void)unique_id;
	return ncclInvalidUsage;
}
