#include "fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

bool gg_user_name(uid_t uid, char *buf, size_t size)
{
	struct passwd pw, *found = NULL;
	char store[1024];

	if (!getpwuid_r(uid, &pw, store, sizeof(store), &found) && found) {
		snprintf(buf, size, "%s", pw.pw_name);
		return true;
	}
	snprintf(buf, size, "%u", (unsigned)uid);
	return false;
}

/* "user NAME (uid N)", or "uid N" for a uid with no name; the bare name
 * (or number) in `name`. */
static void describe_user(uid_t uid, char *who, size_t who_size, char *name, size_t name_size)
{
	if (gg_user_name(uid, name, name_size))
		snprintf(who, who_size, "user %s (uid %u)", name, (unsigned)uid);
	else
		snprintf(who, who_size, "uid %u", (unsigned)uid);
}

const char *gg_owner_refusal(uid_t owner, const char *path, char *buf, size_t size)
{
	const uid_t me = geteuid();
	char them[320], their_name[256], us[320], our_name[256], run_as[340] = "";

	if (owner == me || owner == 0)
		return NULL;
	describe_user(owner, them, sizeof(them), their_name, sizeof(their_name));
	if (me == 0) {
		if (strncmp(them, "uid ", 4))
			snprintf(run_as, sizeof(run_as),
				 "run the gateway as that user (runuser -u %s -- gradgate ...), or ", their_name);
		snprintf(buf, size,
			 "belongs to %s, who could replace it, and the gateway runs as root: %srun: chown root: '%s'",
			 them, run_as, path);
	} else {
		describe_user(me, us, sizeof(us), our_name, sizeof(our_name));
		snprintf(buf, size,
			 "belongs to %s, who could replace it, not to the gateway's %s or root; run: chown %s: '%s'",
			 them, us, our_name, path);
	}
	return buf;
}
