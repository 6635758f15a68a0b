/* The io_uring event loop: one ring per thread.
 *
 * Every socket accept, connect, recv and send of the gateway goes through
 * it. Each submission carries a 64-bit user_data packing the operation
 * kind, an index into the owner's table of connections and 24 bits the
 * owner may use (a generation, a stream number):
 *
 *   63      56 55             32 31                0
 *   |  kind   |       aux       |      index       |
 *
 * The owner dispatches completions with a switch on the kind:
 *
 *   static void on_cqe(void *arg, const struct io_uring_cqe *cqe)
 *   {
 *           switch (gg_loop_ud_kind(cqe->user_data)) {
 *           case GG_OP_RECV: ...
 *           }
 *   }
 *   while (running) {
 *           gg_loop_run(&loop, gg_loop_timeout_us(&loop, next_deadline_us), on_cqe, arg);
 *           ... housekeeping: deadlines, shutdown, stats ...
 *   }
 *
 * gg_loop_run submits what was queued, waits for completions or the
 * timeout, hands each completion to the callback and advances the
 * completion queue once. A loop must be used by the thread that created it
 * only (the ring is set up single-issuer where the kernel allows it). */
#ifndef GG_URING_LOOP_H
#define GG_URING_LOOP_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include <liburing.h>

#include "gg_common.h"

/* Operation kinds of the gateway's submissions. Kinds from GG_OP_USER on
 * belong to the owner of the loop. */
enum gg_loop_op {
	GG_OP_NONE = 0,
	GG_OP_ACCEPT,
	GG_OP_CONNECT,
	GG_OP_RECV,
	GG_OP_SEND,
	GG_OP_CANCEL,
	GG_OP_USER = 32,
};

#define GG_LOOP_AUX_MAX ((1u << 24) - 1)

static inline uint64_t gg_loop_ud(unsigned kind, uint32_t index, uint32_t aux)
{
	return (uint64_t)(kind & 0xff) << 56 | (uint64_t)(aux & GG_LOOP_AUX_MAX) << 32 | index;
}

static inline unsigned gg_loop_ud_kind(uint64_t ud)
{
	return (unsigned)(ud >> 56);
}

static inline uint32_t gg_loop_ud_index(uint64_t ud)
{
	return (uint32_t)ud;
}

static inline uint32_t gg_loop_ud_aux(uint64_t ud)
{
	return (uint32_t)(ud >> 32) & GG_LOOP_AUX_MAX;
}

struct gg_loop {
	struct io_uring ring;
	bool single_issuer;   /* SINGLE_ISSUER|DEFER_TASKRUN accepted by the kernel */
	uint64_t now_us;      /* CLOCK_MONOTONIC, refreshed by every gg_loop_run */
	uint64_t cqes_total;  /* completions dispatched so far */
	/* Tests: added to now_us from the next gg_loop_run on, so that
	 * deadlines and timeouts come without waiting for them. Only grows. */
	uint64_t test_skew_us;
};

/* Sets up a ring of `entries` submission slots (at least 8). Tries
 * SINGLE_ISSUER|DEFER_TASKRUN first and falls back to a plain ring when
 * the kernel refuses them (-EINVAL). Returns 0 or a negative errno. */
GG_MUST_CHECK int gg_loop_init(struct gg_loop *loop, unsigned entries);
void gg_loop_fini(struct gg_loop *loop);

/* CLOCK_MONOTONIC in microseconds. */
uint64_t gg_monotonic_us(void);
/* CLOCK_BOOTTIME in microseconds: as monotonic, but it goes on while the
 * host is suspended. */
uint64_t gg_boottime_us(void);
/* The calling thread's CPU time in microseconds. */
uint64_t gg_thread_cpu_us(void);

/* Microseconds from the loop's clock until `deadline_us` (0 when it has
 * passed); UINT64_MAX when deadline_us is 0, meaning no deadline. */
uint64_t gg_loop_timeout_us(const struct gg_loop *loop, uint64_t deadline_us);

/* Queues one operation; the submission happens in the next gg_loop_run.
 * When the submission queue is full, what is queued is submitted first.
 * Each returns 0 or a negative errno (the ring is broken). */
GG_MUST_CHECK int gg_loop_accept(struct gg_loop *loop, int fd, uint64_t ud); /* multishot */
GG_MUST_CHECK int gg_loop_connect(struct gg_loop *loop, int fd, const struct sockaddr *addr, socklen_t len,
				  uint64_t ud);
GG_MUST_CHECK int gg_loop_recv(struct gg_loop *loop, int fd, void *buf, size_t len, int flags, uint64_t ud);
GG_MUST_CHECK int gg_loop_send(struct gg_loop *loop, int fd, const void *buf, size_t len, uint64_t ud);
GG_MUST_CHECK int gg_loop_read(struct gg_loop *loop, int fd, void *buf, size_t len, uint64_t ud);
/* Cancels every operation in flight on fd; they complete with -ECANCELED
 * (or their own result when they finished first). */
GG_MUST_CHECK int gg_loop_cancel_fd(struct gg_loop *loop, int fd, uint64_t ud);

typedef void gg_loop_cqe_fn(void *arg, const struct io_uring_cqe *cqe);

/* Submits what is queued and waits up to timeout_us (0: do not wait,
 * UINT64_MAX: wait without limit) for at least one completion, then calls
 * fn for every completion available. Callbacks may queue new operations.
 * Returns the number of completions handled (0 on timeout) or a negative
 * errno. */
GG_MUST_CHECK int gg_loop_run(struct gg_loop *loop, uint64_t timeout_us, gg_loop_cqe_fn *fn, void *arg);

#endif
