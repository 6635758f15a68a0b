#include "fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

int gg_read_small_file(const char *path, size_t max_bytes, char **text, size_t *len)
{
	struct stat st;
	char *buf = NULL;
	size_t used = 0;
	int rc = 0;
	/* Opened without blocking: a named pipe nobody opens for writing
	 * would hold the open for good. It gets GG_PIPE_WAIT_MS for its first
	 * bytes (or its writer's end); then it is read blocking, as all is. */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);

	if (fd < 0)
		return -errno;
	if (fstat(fd, &st)) {
		rc = -errno;
		goto out;
	}
	if (S_ISDIR(st.st_mode)) {
		rc = -EISDIR;
		goto out;
	}
	if (S_ISFIFO(st.st_mode)) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int n;
		while ((n = poll(&p, 1, GG_PIPE_WAIT_MS)) < 0 && errno == EINTR)
			;
		if (n <= 0) {
			rc = n ? -errno : -ETIMEDOUT;
			goto out;
		}
	}
	if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK)) {
		rc = -errno;
		goto out;
	}
	/* Read to EOF rather than trusting st_size: /dev/stdin and pipes have none. */
	size_t cap = S_ISREG(st.st_mode) && (size_t)st.st_size <= max_bytes ? (size_t)st.st_size + 1 : 4096;
	buf = malloc(cap);
	if (!buf) {
		rc = -ENOMEM;
		goto out;
	}
	for (;;) {
		if (used + 1 >= cap) {
			if (cap > max_bytes + 1) {
				rc = -EFBIG;
				goto out;
			}
			char *nb = realloc(buf, cap * 2);
			if (!nb) {
				rc = -ENOMEM;
				goto out;
			}
			buf = nb;
			cap *= 2;
		}
		ssize_t n = read(fd, buf + used, cap - used - 1);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			rc = -errno;
			goto out;
		}
		if (n == 0)
			break;
		used += (size_t)n;
	}
	if (used > max_bytes) {
		rc = -EFBIG;
		goto out;
	}
	buf[used] = '\0';
	*text = buf;
	*len = used;
	buf = NULL;
out:
	free(buf);
	close(fd);
	return rc;
}
