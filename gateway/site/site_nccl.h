/* GPU mode with NCCL (gg_allreduce_nccl): what the host backend needs of
 * a job's NCCL communicator, of which the gateway is the last rank (the
 * root). The gateway builds with the real calls (site_nccl.c, when NCCL
 * and CUDA are found); tests hand the backend a stand-in that keeps the
 * same rules on the host.
 *
 * A step: every rank ncclReduce()s its float32 tensor to the root and then
 * waits in ncclBroadcast() from the root. The root contributes the
 * additive identity (-0.0), so the sum it receives is the ranks' sum, then
 * it hands that to the cross-site core and broadcasts the result, or,
 * when the exchange failed, whatever the buffer holds: the ranks' calls
 * must be matched for the communicator to live on.
 *
 * No call waits for the other ranks: the backend polls, on its loop's
 * thread, from which all calls come. Errors: 0 or a negative
 * errno with one line in `err` naming the call that failed, its file:line
 * and NCCL's or CUDA's message. */
#ifndef GG_SITE_NCCL_H
#define GG_SITE_NCCL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gg_build_config.h"
#include "gg_common.h"

#define GG_SITE_NCCL_ID_SIZE 128 /* bytes of an ncclUniqueId */

struct gg_site_nccl_ops {
	/* The NCCL version, as ncclGetVersion() gives it (22809 for 2.28.9),
	 * or 0 when unknown. */
	int (*version)(void);
	/* A fresh ncclUniqueId (ncclGetUniqueId), once a GPU is found that
	 * the communicator can use (-ENODEV: none). */
	int (*unique_id)(unsigned char id[GG_SITE_NCCL_ID_SIZE], char *err, size_t err_size);
	/* The communicator of `id` is up, given up or freed: NCCL's bootstrap
	 * root for it, if it still waits for ranks that will not come, is made
	 * to stop (nccl_root.h). NULL: nothing. */
	void (*end_id)(const unsigned char id[GG_SITE_NCCL_ID_SIZE]);
	/* Starts joining communicator `id` of `nranks` ranks as rank `rank`,
	 * without waiting for the others: *comm is the communicator. */
	int (*open)(void **comm, const unsigned char id[GG_SITE_NCCL_ID_SIZE], unsigned nranks, unsigned rank,
		    char *err, size_t err_size);
	/* Without waiting: 0 once every rank has joined and everything
	 * enqueued on the communicator is done, -EINPROGRESS before, or the
	 * error that ended it (the communicator must then be closed). */
	int (*poll)(void *comm, char *err, size_t err_size);
	/* `count` floats of memory the communicator reaches (device memory of
	 * the gateway's GPU) into *sum; free() gives them back (NULL:
	 * nothing). */
	int (*alloc)(float **sum, uint64_t count, char *err, size_t err_size);
	void (*free)(float *sum);
	/* Enqueues sum[0..count) = the ranks' sum, by a reduce to this rank,
	 * the root; poll() says when it is done. */
	int (*reduce)(void *comm, float *sum, uint64_t count, char *err, size_t err_size);
	/* Enqueues the broadcast of sum[0..count) from this rank to every
	 * rank; poll() says when it is done. */
	int (*broadcast)(void *comm, const float *sum, uint64_t count, char *err, size_t err_size);
	/* Aborts the gateway's part of the communicator (ncclCommAbort),
	 * ending its calls; the other ranks' end when they abort theirs.
	 * NULL: nothing. */
	void (*close)(void *comm);
	/* Frees a communicator whose calls are all done, once what it still
	 * forwards between the other ranks is flushed (ncclCommFinalize),
	 * waiting a little for that; or aborts it when that takes longer. */
	void (*finish)(void *comm);
};

#if HAVE_NCCL
/* The real calls, on the gateway's GPU (the first it sees). */
extern const struct gg_site_nccl_ops gg_site_nccl_real;
#endif

#endif
