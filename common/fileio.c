#include "fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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

/* A link or folder on a guarded path (gg_path_guarded()). */
static int judge_path_entry(const char *entry, const struct stat *st, const char *consequence, char *why,
			    size_t why_size)
{
	const uid_t me = geteuid();
	const char *what = S_ISLNK(st->st_mode) ? "link" : S_ISDIR(st->st_mode) ? "folder" : "path";

	if (st->st_uid != 0 && st->st_uid != me)
		return gg_errf(why, why_size, -EPERM,
			       "%s %s belongs to uid %u, not to root or the gateway's user (uid %u): its owner %s", what,
			       entry, (unsigned)st->st_uid, (unsigned)me, consequence);
	if (S_ISDIR(st->st_mode) && (st->st_mode & (S_IWGRP | S_IWOTH)) && !(st->st_mode & S_ISVTX))
		return gg_errf(why, why_size, -EPERM,
			       "folder %s (mode %04o) may be written by %s, without the sticky bit: they %s (run chmod "
			       "go-w on it)",
			       entry, (unsigned)(st->st_mode & 07777), (st->st_mode & S_IWOTH) ? "every user" : "its group",
			       consequence);
	return 0;
}

int gg_path_guarded(const char *path, const char *consequence, char *why, size_t why_size)
{
	char dir[PATH_MAX], abs[PATH_MAX];
	struct stat st;
	int rc = 0;

	if (path[0] != '/') { /* relative: to the working folder, as the process opens it */
		if (!getcwd(dir, sizeof(dir)) || snprintf(abs, sizeof(abs), "%s/%s", dir, path) >= (int)sizeof(abs))
			return gg_errf(why, why_size, -ENAMETOOLONG, "%s: the path is too long", path);
		path = abs;
	}
	if (strlen(path) >= sizeof(dir))
		return gg_errf(why, why_size, -ENAMETOOLONG, "%s: the path is too long", path);
	const char *slash = strrchr(path, '/');
	const size_t folder_len = (size_t)(slash - path); /* 0: the entry is in / */
	/* The links on the path as written, as far as it exists. */
	for (size_t i = 1; i <= folder_len; i++) {
		if (i < folder_len && path[i] != '/')
			continue;
		snprintf(dir, sizeof(dir), "%.*s", (int)i, path);
		if (lstat(dir, &st)) {
			if (errno == ENOENT)
				break;
			return gg_errf(why, why_size, -errno, "%s: %s", dir, strerror(errno));
		}
		if (S_ISLNK(st.st_mode) && (rc = judge_path_entry(dir, &st, consequence, why, why_size)))
			return rc;
	}
	if (!lstat(path, &st) && S_ISLNK(st.st_mode) && (rc = judge_path_entry(path, &st, consequence, why, why_size)))
		return rc;
	/* The folders, links resolved, from the deepest that exists up: the
	 * one of the entry a link leads to, where it exists. */
	char *real = realpath(path, NULL);
	if (real) {
		char *up = strrchr(real, '/');
		*(up == real ? up + 1 : up) = '\0';
	}
	for (size_t len = folder_len ? folder_len : 1; !real;) {
		snprintf(dir, sizeof(dir), "%.*s", (int)len, path);
		if ((real = realpath(dir, NULL)) || errno != ENOENT || len == 1)
			break;
		len = (size_t)(strrchr(dir, '/') - dir);
		len = len ? len : 1;
	}
	if (!real)
		return gg_errf(why, why_size, -errno, "folder %s: %s", dir, strerror(errno));
	for (size_t len = strlen(real);;) {
		real[len] = '\0';
		if (stat(real, &st)) {
			rc = gg_errf(why, why_size, -errno, "folder %s: %s", real, strerror(errno));
			break;
		}
		if ((rc = judge_path_entry(real, &st, consequence, why, why_size)) || len == 1)
			break;
		char *up = strrchr(real, '/');
		len = up == real ? 1 : (size_t)(up - real);
	}
	free(real);
	return rc;
}
