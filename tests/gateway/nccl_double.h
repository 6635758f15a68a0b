/* A stand-in for an NCCL communicator inside one process, so that the host
 * backend's GPU mode with NCCL (gateway/site/site_nccl.h) runs on every
 * machine: the gateway's side through nccl_double_ops, each rank's from a
 * test thread. It keeps NCCL's rules where a mistake would hang or
 * corrupt: a communicator is up only once all its ranks joined; every
 * rank's reduce must be matched by the root's, and its broadcast by the
 * root's, in the same order; the root's calls are enqueued and done only
 * once their partners came (poll() says when); a rank's calls run on its
 * own thread, its stream, and wait for the root's for ever; an abort ends
 * the calls of the handle that aborts, and no other's. Memory is host
 * memory. */
#ifndef GG_NCCL_DOUBLE_H
#define GG_NCCL_DOUBLE_H

#include <stdbool.h>
#include <stdint.h>

#include "site_nccl.h"

extern const struct gg_site_nccl_ops nccl_double_ops;
/* The NCCL version the stand-in says it is (2.28.9). */
#define ND_NCCL_VERSION 22809

enum nd_fault { ND_NONE, ND_UNIQUE_ID, ND_OPEN, ND_REDUCE, ND_BROADCAST, ND_POLL_REDUCE, ND_POLL_BROADCAST };
/* The next call of that kind by the gateway fails with -EIO, "injected"
 * (ND_POLL_*: the next poll while a reduce or broadcast is enqueued). */
void nd_fail_next(enum nd_fault what);

struct nd_rank;
/* Joins communicator `id` as `rank` of `nranks` and waits until all have
 * joined. NULL when timeout_ms passed first, or *cancel (NULL: no such
 * flag) was set by nd_cancel() (the gateway's giving up does not end the
 * wait, as with NCCL). */
struct nd_rank *nd_join(const unsigned char id[GG_SITE_NCCL_ID_SIZE], unsigned nranks, unsigned rank,
			int timeout_ms, const bool *cancel);
/* Sets *cancel, ending the nd_join() that watches it. */
void nd_cancel(bool *cancel);
/* Enqueues a rank's step on its stream, as gg_allreduce_nccl enqueues its
 * ncclReduce and ncclBroadcast: its part of `count` floats of buf goes to
 * the root, and the root's broadcast comes back into buf; reduce_only: the
 * rank stalls before the broadcast. It waits for its partners for ever,
 * until done or the rank aborts. */
void nd_enqueue(struct nd_rank *r, float *buf, uint64_t count, bool reduce_only);
/* Waits up to timeout_ms for what the rank enqueued: 0 once done,
 * -ETIMEDOUT. */
int nd_sync(struct nd_rank *r, int timeout_ms);
/* Aborts the rank's handle (NULL: nothing): its enqueued step ends, done
 * or not, and the handle is freed. Only its own: a rank that aborts leaves
 * the others' calls, the root's too, waiting, as with NCCL. */
void nd_abort(struct nd_rank *r);
/* Communicators still alive (not yet let go by every rank): 0 at the end
 * of a clean test. */
unsigned nd_live(void);
/* Ids of unique_id() whose bootstrap root still waits: not every rank of
 * the communicator checked in, and end_id() did not stop it (as NCCL's
 * root thread and socket would stay in the gateway): 0 once a test's
 * communicators are all up or given up. */
unsigned nd_roots_waiting(void);
/* Ids of unique_id() for which end_id() never came: the gateway's table of
 * roots keeps an entry for each (0 once every communicator is up, given
 * up or freed). */
unsigned nd_ids_unended(void);
/* How many communicators the gateway freed with finish(), not aborted. */
unsigned nd_finishes(void);
/* Buffers the gateway freed, and those of them freed while a reduce or
 * broadcast it enqueued was not done (as cudaFree would wait for it). */
void nd_frees(unsigned *all, unsigned *busy);
/* Whether a root call is enqueued and not done (a free would wait for it). */
bool nd_busy(void);

#endif
