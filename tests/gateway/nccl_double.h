/* A stand-in for an NCCL communicator inside one process, so that the host
 * backend's GPU mode with NCCL (gateway/site/site_nccl.h) runs on every
 * machine: the gateway's side through nccl_double_ops, each rank's from a
 * test thread. It keeps NCCL's rules where a mistake would hang or
 * corrupt: a communicator is up only once all its ranks joined; every
 * rank's reduce must be matched by the root's, and its broadcast by the
 * root's, in the same order; the root's calls are enqueued and done only
 * once their partners came (poll() says when); a rank's call waits for
 * the root's until it comes or the communicator is aborted; an abort by
 * any rank frees every call that waits. Memory is host memory. */
#ifndef GG_NCCL_DOUBLE_H
#define GG_NCCL_DOUBLE_H

#include <stdint.h>

#include "site_nccl.h"

extern const struct gg_site_nccl_ops nccl_double_ops;

enum nd_fault { ND_NONE, ND_UNIQUE_ID, ND_OPEN, ND_REDUCE, ND_BROADCAST, ND_POLL_REDUCE, ND_POLL_BROADCAST };
/* The next call of that kind by the gateway fails with -EIO, "injected"
 * (ND_POLL_*: the next poll while a reduce or broadcast is enqueued). */
void nd_fail_next(enum nd_fault what);

struct nd_rank;
/* Joins communicator `id` as `rank` of `nranks` and waits until all have
 * joined. NULL when it was aborted or timeout_ms passed. */
struct nd_rank *nd_join(const unsigned char id[GG_SITE_NCCL_ID_SIZE], unsigned nranks, unsigned rank,
			int timeout_ms);
/* A rank's step: reduce `count` floats of buf to the root, then receive
 * the root's broadcast into buf. 0, -ECANCELED when the communicator was
 * aborted, -ETIMEDOUT after timeout_ms (the rank then aborts it, as the
 * library does). */
int nd_step(struct nd_rank *r, float *buf, uint64_t count, int timeout_ms);
/* Its two halves, for a rank held between them: its part of the reduce,
 * and its receipt of the broadcast. */
int nd_post(struct nd_rank *r, float *buf, uint64_t count, int timeout_ms);
int nd_take(struct nd_rank *r, float *buf, uint64_t count, int timeout_ms);
/* Aborts the communicator (NULL: nothing) and lets the handle go. */
void nd_abort(struct nd_rank *r);
/* Communicators still alive (not yet let go by every rank): 0 at the end
 * of a clean test. */
unsigned nd_live(void);
/* How many communicators the gateway freed with finish(), not aborted. */
unsigned nd_finishes(void);

#endif
