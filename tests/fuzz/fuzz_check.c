#include "fuzz_check.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

void fuzz_fail(const char *target, const char *what)
{
	fprintf(stderr, "%s: %s\n", target, what);
	abort();
}

unsigned fuzz_open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	unsigned n = 0;

	if (!d)
		fuzz_fail("fuzz", "cannot list /proc/self/fd");
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

long fuzz_send_fds(int fd, const void *msg, size_t len, const int *fds, unsigned nfds)
{
	_Alignas(struct cmsghdr) char cbuf[CMSG_SPACE(FUZZ_MAX_PASSED_FDS * sizeof(int))];
	struct iovec iov = { .iov_base = (void *)msg, .iov_len = len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

	if (nfds > FUZZ_MAX_PASSED_FDS)
		nfds = FUZZ_MAX_PASSED_FDS;
	if (nfds) {
		memset(cbuf, 0, sizeof(cbuf));
		mh.msg_control = cbuf;
		mh.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
		struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(nfds * sizeof(int));
		memcpy(CMSG_DATA(cm), fds, nfds * sizeof(int));
	}
	return sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
}
