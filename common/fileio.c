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
	char todo[PATH_MAX], done[PATH_MAX] = "", entry[PATH_MAX], target[PATH_MAX];
	struct stat st;
	unsigned hops = 0;
	int rc;

	/* Walked from /, a component at a time, each link followed where it
	 * is met: so every folder the walk passes through is judged, those a
	 * link leads to as well as those that hold a link. */
	if (path[0] == '/')
		rc = snprintf(todo, sizeof(todo), "%s", path);
	else if (getcwd(entry, sizeof(entry)))
		rc = snprintf(todo, sizeof(todo), "%s/%s", entry, path);
	else
		rc = -1;
	if (rc < 0 || (size_t)rc >= sizeof(todo))
		return gg_errf(why, why_size, -ENAMETOOLONG, "%s: the path is too long", path);
	if (stat("/", &st))
		return gg_errf(why, why_size, -errno, "/: %s", strerror(errno));
	if ((rc = judge_path_entry("/", &st, consequence, why, why_size)))
		return rc;
	for (char *p = todo;;) {
		while (*p == '/')
			p++;
		if (!*p)
			return 0;
		char *end = strchrnul(p, '/');
		const size_t len = (size_t)(end - p);
		char *rest = end;
		while (*rest == '/')
			rest++;
		if (len == 1 && p[0] == '.') {
			p = rest;
			continue;
		}
		if (len == 2 && p[0] == '.' && p[1] == '.') {
			char *up = strrchr(done, '/');
			if (up)
				*up = '\0';
			p = rest;
			continue;
		}
		if (snprintf(entry, sizeof(entry), "%s/%.*s", done, (int)len, p) >= (int)sizeof(entry))
			return gg_errf(why, why_size, -ENAMETOOLONG, "%s: the path is too long", path);
		if (lstat(entry, &st))
			/* Not made yet: what exists above stands for the rest. */
			return errno == ENOENT ? 0 : gg_errf(why, why_size, -errno, "%s: %s", entry, strerror(errno));
		if (S_ISLNK(st.st_mode)) {
			if ((rc = judge_path_entry(entry, &st, consequence, why, why_size)))
				return rc;
			if (++hops > 40)
				return gg_errf(why, why_size, -ELOOP, "%s: too many links", path);
			ssize_t n = readlink(entry, target, sizeof(target) - 1);
			if (n < 0)
				return gg_errf(why, why_size, -errno, "%s: %s", entry, strerror(errno));
			target[n] = '\0';
			if (target[0] == '/')
				done[0] = '\0';
			/* The link's target, then what came after the link. */
			char next[PATH_MAX];
			if (snprintf(next, sizeof(next), "%s%s%s", target, *rest ? "/" : "", rest) >= (int)sizeof(next))
				return gg_errf(why, why_size, -ENAMETOOLONG, "%s: the path is too long", path);
			memcpy(todo, next, strlen(next) + 1);
			p = todo;
			continue;
		}
		if (!*rest)
			return 0; /* the entry itself: the caller's to judge */
		if (!S_ISDIR(st.st_mode))
			return gg_errf(why, why_size, -ENOTDIR, "%s is not a folder", entry);
		if ((rc = judge_path_entry(entry, &st, consequence, why, why_size)))
			return rc;
		memcpy(done, entry, strlen(entry) + 1);
		p = rest;
	}
}
