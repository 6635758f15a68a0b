#include "uring_msg.h"

#include <errno.h>

int gg_loop_recvmsg(struct gg_loop *loop, int fd, struct msghdr *msg, unsigned flags, uint64_t ud)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&loop->ring);

	if (!sqe) {
		int rc = io_uring_submit(&loop->ring);
		if (rc < 0)
			return rc;
		sqe = io_uring_get_sqe(&loop->ring);
		if (!sqe)
			return -EBUSY;
	}
	io_uring_prep_recvmsg(sqe, fd, msg, flags);
	io_uring_sqe_set_data64(sqe, ud);
	return 0;
}
