#include "uring_loop.h"

#include <errno.h>
#include <string.h>
#include <time.h>

static uint64_t clock_us(clockid_t clock)
{
	struct timespec ts;

	clock_gettime(clock, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

uint64_t gg_monotonic_us(void)
{
	return clock_us(CLOCK_MONOTONIC);
}

uint64_t gg_boottime_us(void)
{
	return clock_us(CLOCK_BOOTTIME);
}

uint64_t gg_thread_cpu_us(void)
{
	return clock_us(CLOCK_THREAD_CPUTIME_ID);
}

int gg_loop_init(struct gg_loop *loop, unsigned entries)
{
	struct io_uring_params p;
	int rc;

	memset(loop, 0, sizeof(*loop));
	if (entries < 8)
		entries = 8;
	memset(&p, 0, sizeof(p));
	p.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN;
	rc = io_uring_queue_init_params(entries, &loop->ring, &p);
	if (rc == -EINVAL) {
		memset(&p, 0, sizeof(p));
		rc = io_uring_queue_init_params(entries, &loop->ring, &p);
	} else if (rc == 0) {
		loop->single_issuer = true;
	}
	if (rc)
		return rc;
	loop->now_us = gg_monotonic_us();
	return 0;
}

void gg_loop_fini(struct gg_loop *loop)
{
	io_uring_queue_exit(&loop->ring);
}

uint64_t gg_loop_timeout_us(const struct gg_loop *loop, uint64_t deadline_us)
{
	if (!deadline_us)
		return UINT64_MAX;
	return deadline_us > loop->now_us ? deadline_us - loop->now_us : 0;
}

static struct io_uring_sqe *get_sqe(struct gg_loop *loop, int *rc)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&loop->ring);

	if (!sqe) {
		*rc = io_uring_submit(&loop->ring);
		if (*rc < 0)
			return NULL;
		sqe = io_uring_get_sqe(&loop->ring);
	}
	*rc = sqe ? 0 : -EBUSY;
	return sqe;
}

int gg_loop_accept(struct gg_loop *loop, int fd, uint64_t ud)
{
	int rc;
	struct io_uring_sqe *sqe = get_sqe(loop, &rc);

	if (sqe) {
		io_uring_prep_multishot_accept(sqe, fd, NULL, NULL, SOCK_CLOEXEC);
		io_uring_sqe_set_data64(sqe, ud);
	}
	return rc;
}

int gg_loop_connect(struct gg_loop *loop, int fd, const struct sockaddr *addr, socklen_t len, uint64_t ud)
{
	int rc;
	struct io_uring_sqe *sqe = get_sqe(loop, &rc);

	if (sqe) {
		io_uring_prep_connect(sqe, fd, addr, len);
		io_uring_sqe_set_data64(sqe, ud);
	}
	return rc;
}

int gg_loop_recv(struct gg_loop *loop, int fd, void *buf, size_t len, int flags, uint64_t ud)
{
	int rc;
	struct io_uring_sqe *sqe = get_sqe(loop, &rc);

	if (sqe) {
		io_uring_prep_recv(sqe, fd, buf, len, flags);
		io_uring_sqe_set_data64(sqe, ud);
	}
	return rc;
}

int gg_loop_send(struct gg_loop *loop, int fd, const void *buf, size_t len, uint64_t ud)
{
	int rc;
	struct io_uring_sqe *sqe = get_sqe(loop, &rc);

	if (sqe) {
		io_uring_prep_send(sqe, fd, buf, len, MSG_NOSIGNAL);
		io_uring_sqe_set_data64(sqe, ud);
	}
	return rc;
}

int gg_loop_read(struct gg_loop *loop, int fd, void *buf, size_t len, uint64_t ud)
{
	int rc;
	struct io_uring_sqe *sqe = get_sqe(loop, &rc);

	if (sqe) {
		io_uring_prep_read(sqe, fd, buf, (unsigned)GG_MIN(len, (size_t)UINT32_MAX), 0);
		io_uring_sqe_set_data64(sqe, ud);
	}
	return rc;
}

int gg_loop_cancel_fd(struct gg_loop *loop, int fd, uint64_t ud)
{
	int rc;
	struct io_uring_sqe *sqe = get_sqe(loop, &rc);

	if (sqe) {
		io_uring_prep_cancel_fd(sqe, fd, IORING_ASYNC_CANCEL_ALL);
		io_uring_sqe_set_data64(sqe, ud);
	}
	return rc;
}

int gg_loop_run(struct gg_loop *loop, uint64_t timeout_us, gg_loop_cqe_fn *fn, void *arg)
{
	struct io_uring_cqe *cqe;
	unsigned head, count = 0;
	int rc;

	if (timeout_us == 0) {
		rc = io_uring_submit_and_get_events(&loop->ring);
	} else if (timeout_us == UINT64_MAX) {
		rc = io_uring_submit_and_wait(&loop->ring, 1);
	} else {
		struct __kernel_timespec ts = {
			.tv_sec = (long long)(timeout_us / 1000000u),
			.tv_nsec = (long long)(timeout_us % 1000000u) * 1000,
		};
		rc = io_uring_submit_and_wait_timeout(&loop->ring, &cqe, 1, &ts, NULL);
	}
	loop->now_us = gg_monotonic_us() + loop->test_skew_us;
	if (rc < 0 && rc != -ETIME && rc != -EINTR && rc != -EBUSY && rc != -EAGAIN)
		return rc;
	io_uring_for_each_cqe(&loop->ring, head, cqe) {
		fn(arg, cqe);
		count++;
	}
	io_uring_cq_advance(&loop->ring, count);
	loop->cqes_total += count;
	return (int)count;
}
