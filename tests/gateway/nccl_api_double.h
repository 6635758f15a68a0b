/* NCCL's own API over the stand-in communicator (nccl_double.h), for the
 * ranks' side of gg_allreduce_nccl() in the client library. Built as a
 * libnccl.so.2 of its own, with nccl_double.c, which the test program
 * links and LD_LIBRARY_PATH puts in place of the real one (that the
 * gateway's code in the program links too): the library's dlopen finds
 * it loaded, and the gateway's side gets nccl_double_ops from it. The calls keep
 * NCCL's rules for a non-blocking communicator: joining goes on in the
 * background until every rank came or the rank aborts; a reduce to the
 * root must be followed by the broadcast from it (gg_allreduce_nccl's one
 * pattern), which together run on the rank's stream; ncclCommAbort() ends
 * this rank's part only. A stream's work is done (cuStreamQuery, through
 * fake_cuda_driver.h's hook) once its rank's last step is. */
#ifndef GG_NCCL_API_DOUBLE_H
#define GG_NCCL_API_DOUBLE_H

#include <stdbool.h>

enum nad_fault {
	NAD_NONE,
	NAD_INIT,      /* ncclCommInitRankConfig fails at once */
	NAD_JOIN,      /* joining fails later, as ncclCommGetAsyncError says */
	NAD_REDUCE,    /* ncclReduce fails */
	NAD_BROADCAST, /* ncclBroadcast fails */
};
/* The next such call, by any rank, fails with ncclUnhandledCudaError and
 * ncclGetLastError() "injected failure". */
void nad_fail_next(enum nad_fault what);

/* Communicators of ranks that have not freed or aborted them. */
unsigned nad_live(void);
/* Whether the last ncclCommInitRankConfig asked for a non-blocking
 * communicator, as the library must. */
bool nad_last_nonblocking(void);
/* Reduces enqueued so far, by every rank. */
unsigned nad_reduces(void);
/* Ranks' calls so far: ncclCommAbort(), ncclCommFinalize(). */
void nad_counts(unsigned *aborts, unsigned *finalizes);

#endif
