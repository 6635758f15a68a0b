/* A listening socket's multishot accept on an io_uring loop: armed again
 * when the kernel ends it, and tried again shortly when it cannot be
 * queued or fails (EMFILE and the like) rather than spin. */
#ifndef GG_ACCEPTOR_H
#define GG_ACCEPTOR_H

#include <stdbool.h>
#include <stdint.h>

#include "uring_loop.h"

#define GG_ACCEPT_RETRY_US 100000u

struct gg_acceptor {
	struct gg_loop *loop;
	int fd;            /* the listening socket */
	uint64_t ud;       /* the accept's user_data */
	bool armed;        /* the multishot accept is in flight */
	uint64_t retry_us; /* when to try arming again; 0: not waiting */
};

/* Arms the accept. Returns 0, or the negative errno of a failed queueing
 * (tried again after GG_ACCEPT_RETRY_US by gg_acceptor_tick). */
int gg_acceptor_arm(struct gg_acceptor *a);
/* Handles a completion of the accept: returns the new connection's
 * descriptor, or a negative errno (-ECANCELED once cancelled) with
 * nothing to do. Arms again unless `stopping`. */
int gg_acceptor_on_cqe(struct gg_acceptor *a, const struct io_uring_cqe *cqe, bool stopping);
/* Arms again when a retry is due; returns its time (0: none waits). */
uint64_t gg_acceptor_tick(struct gg_acceptor *a, uint64_t now_us, bool stopping);

#endif
