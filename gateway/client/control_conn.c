#include "control_conn.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int gg_ctrl_error(struct gg_error *err, int code, const char *fmt, ...)
{
	if (err) {
		va_list ap;
		va_start(ap, fmt);
		err->code = code;
		vsnprintf(err->message, sizeof(err->message), fmt, ap);
		va_end(ap);
		/* One line, as gradgate.h promises, whatever the caller's
		 * endpoint or environment held: control bytes become '?'. */
		for (char *c = err->message; *c; c++)
			if ((unsigned char)*c < 0x20 || *c == 0x7f)
				*c = '?';
	}
	return code;
}

uint64_t gg_ctrl_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int poll_ms(uint64_t deadline_ms)
{
	uint64_t now = gg_ctrl_now_ms();

	if (deadline_ms == UINT64_MAX)
		return -1;
	return now >= deadline_ms ? 0 : (int)GG_MIN(deadline_ms - now, (uint64_t)INT32_MAX);
}

/* Waits for `events` on fd until the deadline: 0 (or an interruption:
 * try again), -ETIMEDOUT, or a negative errno. */
static int wait_for(int fd, short events, uint64_t deadline_ms)
{
	struct pollfd p = { .fd = fd, .events = events };
	int rc = poll(&p, 1, poll_ms(deadline_ms));

	if (rc == 0)
		return -ETIMEDOUT;
	return rc < 0 && errno != EINTR ? -errno : 0;
}

int gg_ctrl_send(int fd, const void *msg, size_t len, int pass_fd, uint64_t deadline_ms)
{
	_Alignas(struct cmsghdr) char cbuf[GG_CTRL_CMSG_BYTES];
	struct iovec iov = { .iov_base = (void *)msg, .iov_len = len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

	if (pass_fd >= 0)
		gg_ctrl_attach_fd(&mh, cbuf, pass_fd);
	for (;;) {
		ssize_t n = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n == (ssize_t)len)
			return 0;
		if (n >= 0)
			return -EMSGSIZE;
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN)
			return -errno;
		int rc = wait_for(fd, POLLOUT, deadline_ms);
		if (rc)
			return rc;
	}
}

ssize_t gg_ctrl_recv(int fd, union gg_ctrl_msg *msg, uint64_t deadline_ms)
{
	_Alignas(size_t) char cbuf[CMSG_SPACE(4 * sizeof(int))];
	bool reset = false;

	for (;;) {
		struct iovec iov = { .iov_base = msg, .iov_len = sizeof(*msg) };
		struct msghdr mh = {
			.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf),
		};
		ssize_t n = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_TRUNC | MSG_CMSG_CLOEXEC);
		if (n >= 0) {
			bool fds = false;
			for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
				if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
					continue;
				size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
				for (size_t i = 0; i < nfd; i++) {
					int x;
					memcpy(&x, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
					close(x);
				}
				fds = true;
			}
			return fds || (mh.msg_flags & MSG_CTRUNC) ? -EPROTO : n;
		}
		if (errno == EINTR)
			continue;
		/* A gateway that closes with our messages unread resets the
		 * connection, which recv reports before the answers it sent
		 * last (why it closed); those are still there to read. */
		if (errno == ECONNRESET && !reset) {
			reset = true;
			continue;
		}
		if (errno != EAGAIN)
			return -errno;
		int rc = wait_for(fd, POLLIN, deadline_ms);
		if (rc)
			return rc == -ETIMEDOUT ? -EAGAIN : rc;
	}
}

int gg_ctrl_parse_endpoint(const char *endpoint, struct sockaddr_un *addr, struct gg_error *err)
{
	const bool given = endpoint;

	if (!endpoint)
		endpoint = getenv(GG_ENDPOINT_ENV);
	if (!endpoint || !*endpoint)
		return gg_ctrl_error(err, GG_ERR_INVALID, "%s: pass one or set " GG_ENDPOINT_ENV
			       " to the site's control socket (unix:/run/gradgate/SITE.sock by default)",
			       given ? "the gateway endpoint given is empty (giving none reads " GG_ENDPOINT_ENV ")"
			       : endpoint ? GG_ENDPOINT_ENV " is empty" : "no gateway endpoint");
	if (strncmp(endpoint, "unix:", 5)) {
		if (!strncmp(endpoint, "tcp:", 4))
			return gg_ctrl_error(err, GG_ERR_INVALID,
				       "endpoint '%.200s': a gateway is reached by its unix: control socket, on its own "
				       "host (its ranks share memory with it)", endpoint);
		return gg_ctrl_error(err, GG_ERR_INVALID, "endpoint '%.200s' is not unix:/absolute/path", endpoint);
	}
	const char *path = endpoint + 5;
	memset(addr, 0, sizeof(*addr));
	addr->sun_family = AF_UNIX;
	if (path[0] != '/')
		return gg_ctrl_error(err, GG_ERR_INVALID, "endpoint '%.200s': the socket path must be absolute", endpoint);
	if (strlen(path) >= sizeof(addr->sun_path))
		return gg_ctrl_error(err, GG_ERR_INVALID, "endpoint '%.200s': the socket path is longer than %zu bytes",
			       endpoint, sizeof(addr->sun_path) - 1);
	memcpy(addr->sun_path, path, strlen(path) + 1);
	return 0;
}

/* The uid GRADGATE_GATEWAY_UID names (a number or a user name), or -1. */
static long trusted_env_uid(struct gg_error *err, int *rc)
{
	const char *v = getenv(GG_GATEWAY_UID_ENV);
	char *end;

	*rc = 0;
	if (!v)
		return -1;
	/* As from GRADGATE_GATEWAY_UID=$VAR with VAR unset: a slip too. */
	if (!*v) {
		*rc = gg_ctrl_error(err, GG_ERR_INVALID, GG_GATEWAY_UID_ENV " is set but empty: unset it, or set it to a "
				    "uid or a user name");
		return -1;
	}
	errno = 0;
	long uid = strtol(v, &end, 10);
	/* A uid is digits only: no blank, no sign, as a user name cannot be. */
	if (v[0] >= '0' && v[0] <= '9' && !*end && !errno && uid < (long)UINT32_MAX)
		return uid;
	struct passwd pw, *found = NULL;
	char buf[1024];
	if (!getpwnam_r(v, &pw, buf, sizeof(buf), &found) && found)
		return (long)found->pw_uid;
	*rc = gg_ctrl_error(err, GG_ERR_INVALID, GG_GATEWAY_UID_ENV "='%.64s' is neither a uid nor a known user name", v);
	return -1;
}

/* Whether only root or `uid` can have put folder `dir` (absolute) where it
 * is: resolving its path from / crosses only entries (folders and links)
 * that root owns, or that uid owns in folders that root or uid owns and
 * nobody else may write in, the sticky bit not excepted (in /tmp anyone
 * may make a folder, or a link to one, of their own). */
static bool made_by_root_or(const char *dir, uid_t uid)
{
	char cur[PATH_MAX] = "/", rest[PATH_MAX], next[PATH_MAX], target[PATH_MAX];
	struct stat in, st; /* the folder cur; its entry looked at */
	unsigned links = 0;
	const char *p = rest;

	if (snprintf(rest, sizeof(rest), "%s", dir) >= (int)sizeof(rest) || lstat("/", &in))
		return false;
	while (*p) {
		const char *name = p;
		const size_t len = strcspn(p, "/");
		p += len + (p[len] == '/');
		if (len == 0 || (len == 1 && name[0] == '.'))
			continue;
		if (len == 2 && name[0] == '.' && name[1] == '.') {
			char *slash = strrchr(cur, '/');
			slash[slash == cur ? 1 : 0] = '\0';
			if (lstat(cur, &in))
				return false;
			continue;
		}
		if (snprintf(next, sizeof(next), "%s/%.*s", strcmp(cur, "/") ? cur : "", (int)len, name) >=
			    (int)sizeof(next) ||
		    lstat(next, &st))
			return false;
		const bool in_safe = !(in.st_mode & (S_IWGRP | S_IWOTH)) && (in.st_uid == 0 || in.st_uid == uid);
		if (st.st_uid != 0 && !(st.st_uid == uid && in_safe))
			return false;
		if (S_ISLNK(st.st_mode)) {
			/* The rest of the path now goes from the link's target. */
			ssize_t n = readlink(next, target, sizeof(target) - 1);
			if (++links > 16 || n <= 0 ||
			    snprintf(target + n, sizeof(target) - (size_t)n, "/%s", p) >= (int)(sizeof(target) - (size_t)n))
				return false;
			memcpy(rest, target, strlen(target) + 1);
			p = rest;
			if (rest[0] == '/') {
				strcpy(cur, "/");
				if (lstat(cur, &in))
					return false;
			}
			continue;
		}
		if (!S_ISDIR(st.st_mode))
			return false;
		memcpy(cur, next, strlen(next) + 1);
		in = st;
	}
	return true;
}

/* Hands nothing to a process that may not be the gateway: whoever could
 * bind the path first (a shared /tmp) would get the job's name and every
 * shared buffer of the session. The listener must run as root, as this
 * process's user, as the owner of the socket's folder (only it can create
 * the socket there, unless the folder lets others write, and only it or
 * root can have put the folder there: made_by_root_or()) or as the user
 * GRADGATE_GATEWAY_UID names. */
static int check_listener(int fd, const char *path, long env_uid, struct gg_error *err)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
	struct stat st;

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len))
		return gg_ctrl_error(err, GG_ERR_SYSTEM, "unix:%s: cannot tell who listens (SO_PEERCRED): %s", path,
			       strerror(errno));
	if (cred.uid == 0 || cred.uid == geteuid() || (long)cred.uid == env_uid)
		return 0;
	snprintf(dir, sizeof(dir), "%s", path);
	char *slash = strrchr(dir, '/');
	slash[slash == dir ? 1 : 0] = '\0';
	bool dir_ok = !stat(dir, &st);
	const bool owner = dir_ok && st.st_uid == cred.uid, shared = dir_ok && (st.st_mode & (S_IWGRP | S_IWOTH));
	if (owner && !shared && made_by_root_or(dir, cred.uid))
		return 0;
	/* The owner of a folder others may write to, or may have made, vouches
	 * for nothing. */
	return gg_ctrl_error(err, GG_ERR_CONNECT,
		       "unix:%s is held by uid %u: not root, not us (uid %u)%s%.100s%s; nothing sent to it (set "
		       GG_GATEWAY_UID_ENV " to trust the gateway's user)",
		       path, (unsigned)cred.uid, (unsigned)geteuid(),
		       !dir_ok ? "" : owner ? ", the owner of " : ", not the owner of ", dir_ok ? dir : "",
		       shared ? ", which others may write to" : owner ? ", which others may have made" : "");
}

int gg_ctrl_connect(const struct sockaddr_un *addr, uint64_t deadline_ms, struct gg_error *err)
{
	int rc;
	/* Read before connecting: a bad value fails whoever listens, or nobody. */
	long env_uid = trusted_env_uid(err, &rc);
	if (rc)
		return rc;
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

	if (fd < 0)
		return gg_ctrl_error(err, GG_ERR_SYSTEM, "socket(AF_UNIX, SOCK_SEQPACKET): %s", strerror(errno));
	/* A full listen backlog answers EAGAIN on a non-blocking Unix socket. */
	while (connect(fd, (const struct sockaddr *)addr, sizeof(*addr))) {
		int e = errno;
		if ((e == EAGAIN || e == EINTR) && gg_ctrl_now_ms() < deadline_ms) {
			struct timespec ts = { 0, 10 * 1000 * 1000 };
			nanosleep(&ts, NULL);
			continue;
		}
		close(fd);
		if (e == ENOENT || e == ECONNREFUSED)
			return gg_ctrl_error(err, GG_ERR_CONNECT, "no gateway listens on unix:%s (%s); is gradgate running "
				       "with this control socket?", addr->sun_path, strerror(e));
		return gg_ctrl_error(err, GG_ERR_CONNECT, "cannot connect to unix:%s: %s", addr->sun_path,
			       e == EAGAIN ? "the gateway does not accept connections" : strerror(e));
	}
	rc = check_listener(fd, addr->sun_path, env_uid, err);
	if (rc) {
		close(fd);
		return rc;
	}
	return fd;
}

