/* gg_net_listen() on a port another socket listens on: it waits for the
 * port (a gateway restarted on it may find it held a moment by the one it
 * replaces, whose io_uring keeps its socket open after the process is
 * gone), taking it once it is let go within GG_NET_LISTEN_WAIT_MS, and
 * refusing it with EADDRINUSE when it is not. */
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "gg_check.h"
#include "net_addr.h"

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A socket that listens on a port the system picks: its fd; *sa its
 * address. */
static int hold_port(struct sockaddr_in *sa)
{
	socklen_t len = sizeof(*sa);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	memset(sa, 0, sizeof(*sa));
	sa->sin_family = AF_INET;
	sa->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0 || bind(fd, (struct sockaddr *)sa, sizeof(*sa)) || listen(fd, 1) ||
	    getsockname(fd, (struct sockaddr *)sa, &len))
		return -1;
	return fd;
}

static void *let_go(void *arg)
{
	usleep(200000);
	close(*(int *)arg);
	return NULL;
}

int main(void)
{
	struct sockaddr_in sa;
	pthread_t t;

	/* Let go 200 ms after the call: taken then. */
	int held = hold_port(&sa);
	CHECK(held >= 0, "cannot hold a port");
	double t0 = now_s();
	CHECK(pthread_create(&t, NULL, let_go, &held) == 0, "thread");
	int fd = gg_net_listen((struct sockaddr *)&sa, sizeof(sa), 8, 0);
	double took = now_s() - t0;
	pthread_join(t, NULL);
	printf("a port let go 200 ms later: %s after %.0f ms\n", fd >= 0 ? "taken" : strerror(-fd), took * 1e3);
	CHECK(fd >= 0, "the port was let go 200 ms later, and still: %s", strerror(-fd));
	CHECK(took >= 0.15, "taken after %.0f ms, while another socket still listened there", took * 1e3);
	if (fd >= 0)
		close(fd);

	/* Held throughout: refused, once the wait is over. */
	held = hold_port(&sa);
	CHECK(held >= 0, "cannot hold a port");
	t0 = now_s();
	fd = gg_net_listen((struct sockaddr *)&sa, sizeof(sa), 8, 0);
	took = now_s() - t0;
	printf("a port held throughout: %s after %.0f ms\n", fd >= 0 ? "taken" : strerror(-fd), took * 1e3);
	CHECK(fd == -EADDRINUSE, "a port another socket listens on: %d (%s)", fd, fd < 0 ? strerror(-fd) : "taken");
	CHECK(took >= GG_NET_LISTEN_WAIT_MS / 1e3 * 0.9, "refused after %.0f ms, before the wait was over", took * 1e3);
	if (fd >= 0)
		close(fd);
	close(held);
	printf("net listen: %d failure(s)\n", failures);
	return failures ? 1 : 0;
}
