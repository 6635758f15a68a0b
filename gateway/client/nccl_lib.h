/* What gg_allreduce_nccl() needs of NCCL, which the library loads on first
 * use: the process's own when it has one (PyTorch links its own, and a
 * rank's communicator must be made by the NCCL the rest of the process
 * uses), else libnccl.so.2. So libgradgate links and loads without NCCL
 * or the CUDA runtime, and programs that never make an NCCL step never
 * load them.
 *
 * The communicator is non-blocking (ncclConfig_t.blocking = 0): joining
 * it and enqueueing each call are waited for with a deadline, and it can
 * always be given up by ncclCommAbort(), which is local to this rank.
 *
 * Errors: 0, or a negative enum gg_errc with one line in `err`: the NCCL
 * call that failed and NCCL's message (ncclGetErrorString and
 * ncclGetLastError). A library built without NCCL (HAVE_NCCL 0) fails
 * every call with GG_ERR_INVALID saying so. */
#ifndef GG_NCCL_LIB_H
#define GG_NCCL_LIB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GG_NCCL_ID_SIZE 128 /* bytes of an ncclUniqueId */

/* Loads NCCL, once per process. Returns 0, GG_ERR_INVALID when the
 * library was built without NCCL, or GG_ERR_SYSTEM when no NCCL (2.14 or
 * later, for ncclCommInitRankConfig) can be loaded. */
int gg_nccl_load(char *err, size_t err_size);
/* The loaded NCCL's version as ncclGetVersion() gives it, 0 when unknown
 * (call gg_nccl_load() first). */
int gg_nccl_version(void);

/* What a wait may be given up for: fn(arg) is asked between looks at the
 * call, and a true answer ends the wait. */
struct gg_nccl_stop {
	bool (*fn)(void *arg);
	void *arg;
};

/* Joins communicator `id` of `nranks` ranks as rank `rank` on the calling
 * thread's current CUDA device, and waits until every rank has joined, at
 * most until `deadline_ms` (gg_ctrl_now_ms) or until `stop` (NULL: none)
 * says to give up. Returns 0 with *comm (an ncclComm_t), or
 * GG_ERR_TIMEOUT when it was not up by then, GG_ERR_CLOSED when it was
 * given up, and GG_ERR_SYSTEM when NCCL failed; *comm is then NULL,
 * whatever NCCL had made aborted. */
int gg_nccl_join(void **comm, const unsigned char id[GG_NCCL_ID_SIZE], unsigned nranks, unsigned rank,
		 uint64_t deadline_ms, const struct gg_nccl_stop *stop, char *err, size_t err_size);

/* Enqueues on `stream` (a cudaStream_t of the communicator's device; NULL:
 * the legacy default stream) the reduce (sum) of the `count` floats at
 * `buf` to rank `root`, then the broadcast from `root` into `buf`, each
 * waited for to be enqueued, at most until `deadline_ms`. Returns 0,
 * GG_ERR_TIMEOUT or GG_ERR_SYSTEM: after a failure the communicator must
 * be aborted, since what was enqueued may never finish. */
int gg_nccl_reduce_broadcast(void *comm, void *buf, size_t count, unsigned root, void *stream,
			     uint64_t deadline_ms, char *err, size_t err_size);

/* Aborts communicator `comm` (NULL: nothing): frees it and ends its calls
 * still enqueued, without waiting for the other ranks. */
void gg_nccl_abort(void *comm);

/* Frees communicator `comm` (NULL: nothing) whose calls are all done,
 * once what it still forwards to other ranks is flushed
 * (ncclCommFinalize), waiting for that until `deadline_ms`; aborts it
 * when the flush fails or takes longer. */
void gg_nccl_finish(void *comm, uint64_t deadline_ms);

#endif
