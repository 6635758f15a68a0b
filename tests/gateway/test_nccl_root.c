/* gateway/site/nccl_root.c: NCCL's bootstrap root, found by the address its
 * unique id carries and stopped when its communicator is given up.
 *
 *   test_nccl_root          a root of the test's own: a thread waiting in
 *                           accept() on a listening socket, as NCCL's does
 *   test_nccl_root --nccl   the root ncclGetUniqueId() starts (no GPU
 *                           needed): found from the id of the NCCL the
 *                           gateway builds with, and its thread and socket
 *                           gone once stopped; 77 without NCCL or where
 *                           NCCL makes no id (no network interface) */
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "gg_build_config.h"
#include "gg_require.h"
#include "nccl_root.h"
#if HAVE_NCCL
#include <nccl.h>
#endif

static struct gg_nccl_roots roots;

struct waiter {
	int fd;
	pthread_t thread;
	int accept_errno; /* what ended the wait */
};

static void *wait_in_accept(void *arg)
{
	struct waiter *w = arg;
	int fd = accept(w->fd, NULL, NULL);

	w->accept_errno = fd < 0 ? errno : 0;
	if (fd >= 0)
		close(fd);
	return NULL;
}

/* A listening socket on loopback, and an id that names it as NCCL's do:
 * 8 bytes of magic, then the socket address. */
static int listener(unsigned char id[GG_NCCL_ROOT_ID_SIZE])
{
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(sin);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	CHECK(fd >= 0);
	CHECK(!bind(fd, (struct sockaddr *)&sin, sizeof(sin)));
	CHECK(!listen(fd, 4));
	CHECK(!getsockname(fd, (struct sockaddr *)&sin, &len));
	memset(id, 0, GG_NCCL_ROOT_ID_SIZE);
	memset(id, 0x5a, 8);
	memcpy(id + 8, &sin, sizeof(sin));
	return fd;
}

static bool still_listens(int fd)
{
	int on = 0;
	socklen_t len = sizeof(on);

	return !getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &on, &len) && on;
}

static void test_own_root(void)
{
	unsigned char id[GG_NCCL_ROOT_ID_SIZE];
	struct waiter w = { .fd = listener(id) };

	CHECK(!pthread_create(&w.thread, NULL, wait_in_accept, &w));
	CHECK(gg_nccl_root_watch(&roots, id));
	CHECK(!gg_nccl_root_watch(&roots, id)); /* once */
	CHECK(gg_nccl_root_end(&roots, id));
	CHECK(!pthread_join(w.thread, NULL));
	CHECK_EQ_INT(w.accept_errno, EINVAL);
	/* Forgotten once ended. */
	CHECK(!gg_nccl_root_end(&roots, id));
	close(w.fd);
	printf("nccl root: a waiting root is stopped, and forgotten\n");

	/* A root that ended by itself and closed its socket, whose number
	 * another listening socket took since: that one is left alone. */
	unsigned char other[GG_NCCL_ROOT_ID_SIZE];
	int fd = listener(id);
	CHECK(gg_nccl_root_watch(&roots, id));
	close(fd);
	int again = listener(other);
	CHECK_EQ_INT(again, fd);
	(void)gg_nccl_root_end(&roots, id);
	CHECK(still_listens(again));
	printf("nccl root: an ended root's socket number, taken by another, is left alone\n");

	/* Ids that name nothing here, or whose root NCCL puts elsewhere. */
	close(again);
	CHECK(!gg_nccl_root_watch(&roots, other)); /* closed: nobody listens there */
	fd = listener(other);
	CHECK(!setenv("NCCL_COMM_ID", "127.0.0.1:1", 1));
	CHECK(!gg_nccl_root_watch(&roots, other));
	CHECK(!unsetenv("NCCL_COMM_ID"));
	close(fd);
	memset(other + 8, 0, 16); /* no address family */
	CHECK(!gg_nccl_root_watch(&roots, other));
	CHECK(!gg_nccl_root_end(&roots, other));
	printf("nccl root: an id with no listener or no address, or with NCCL_COMM_ID set, is not watched\n");

	/* As many roots as communicators being joined. */
	enum { MANY = 100 };
	int fds[MANY];
	unsigned char ids[MANY][GG_NCCL_ROOT_ID_SIZE];
	for (int i = 0; i < MANY; i++) {
		fds[i] = listener(ids[i]);
		CHECK(gg_nccl_root_watch(&roots, ids[i]));
	}
	for (int i = 0; i < MANY; i++) {
		CHECK(gg_nccl_root_end(&roots, ids[i]));
		CHECK(!still_listens(fds[i]));
		close(fds[i]);
	}
	CHECK_EQ_INT(roots.count, 0);
	gg_nccl_roots_free(&roots);
	printf("nccl root: %d roots at once, each stopped\n", MANY);
}

#if HAVE_NCCL
static int count_entries(const char *dir)
{
	int n = 0;
	DIR *d = opendir(dir);

	CHECK(d);
	for (struct dirent *e; (e = readdir(d));)
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

static int test_real_root(void)
{
	ncclUniqueId u;

	_Static_assert(sizeof(u.internal) == GG_NCCL_ROOT_ID_SIZE, "ncclUniqueId size");
	/* NCCL starts itself up on the first call (threads of its own): the
	 * figures are taken after it. */
	int v = 0;
	CHECK(ncclGetVersion(&v) == ncclSuccess);
	ncclResult_t r = ncclGetUniqueId(&u);
	if (r != ncclSuccess) {
		printf("SKIP: ncclGetUniqueId: %s (no network interface for NCCL's bootstrap?)\n",
		       ncclGetErrorString(r));
		return 77;
	}
	int threads = count_entries("/proc/self/task"), fds = count_entries("/proc/self/fd");
	CHECK(gg_nccl_root_watch(&roots, (const unsigned char *)u.internal));
	CHECK(gg_nccl_root_end(&roots, (const unsigned char *)u.internal));
	/* NCCL's root thread sees accept() fail, ends and closes its socket. */
	struct timespec nap = { 0, 10000000 };
	for (int i = 0; i < 300 && (count_entries("/proc/self/task") >= threads || count_entries("/proc/self/fd") >= fds);
	     i++)
		nanosleep(&nap, NULL);
	CHECK_EQ_INT(count_entries("/proc/self/task"), threads - 1);
	CHECK_EQ_INT(count_entries("/proc/self/fd"), fds - 1);
	gg_nccl_roots_free(&roots);
	printf("nccl root: NCCL %d's root for a fresh id found and stopped: its thread and socket are gone\n", v);
	return 0;
}
#endif

int main(int argc, char **argv)
{
	if (argc > 1 && !strcmp(argv[1], "--nccl")) {
#if HAVE_NCCL
		return test_real_root();
#else
		printf("SKIP: built without NCCL\n");
		return 77;
#endif
	}
	test_own_root();
	return 0;
}
