/* recvmsg through the io_uring loop, for the control sockets that carry
 * file descriptors (SCM_RIGHTS). Kept apart from uring_loop.c, which has
 * no msghdr operations. */
#ifndef GG_URING_MSG_H
#define GG_URING_MSG_H

#include <stdint.h>
#include <sys/socket.h>

#include "gg_common.h"
#include "uring_loop.h"

/* Queues one recvmsg on `fd`; `msg` and everything it points to must stay
 * valid until the completion arrives. `flags` as for recvmsg(2); with
 * MSG_TRUNC the result is the packet's full length even when it did not
 * fit. Returns 0 or a negative errno (the ring is broken). */
GG_MUST_CHECK int gg_loop_recvmsg(struct gg_loop *loop, int fd, struct msghdr *msg, unsigned flags, uint64_t ud);

#endif
