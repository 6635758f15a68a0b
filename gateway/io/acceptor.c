#include "acceptor.h"

#include <errno.h>

int gg_acceptor_arm(struct gg_acceptor *a)
{
	int rc = gg_loop_accept(a->loop, a->fd, a->ud);

	if (rc) {
		a->retry_us = a->loop->now_us + GG_ACCEPT_RETRY_US;
		return rc;
	}
	a->armed = true;
	a->retry_us = 0;
	return 0;
}

int gg_acceptor_on_cqe(struct gg_acceptor *a, const struct io_uring_cqe *cqe, bool stopping)
{
	if (!(cqe->flags & IORING_CQE_F_MORE))
		a->armed = false;
	if (cqe->res < 0 && cqe->res != -ECANCELED && !a->armed) {
		a->retry_us = a->loop->now_us + GG_ACCEPT_RETRY_US;
		return cqe->res;
	}
	if (!a->armed && !stopping)
		(void)gg_acceptor_arm(a);
	return cqe->res;
}

uint64_t gg_acceptor_tick(struct gg_acceptor *a, uint64_t now_us, bool stopping)
{
	if (stopping || a->armed || !a->retry_us)
		return 0;
	if (now_us >= a->retry_us && !gg_acceptor_arm(a))
		return 0;
	return a->retry_us;
}
