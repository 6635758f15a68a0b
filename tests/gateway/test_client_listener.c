/* gg_session_open() sends nothing to a control socket that another user may
 * have bound before the gateway. A child running as `nobody` listens where
 * a rank looks for its gateway; the library must refuse it unless that user
 * owns the socket's folder (nobody else may write there, and nobody else
 * can have put it there: every folder and link on its path is root's, or
 * that user's in a folder nobody else may write in) or
 * GRADGATE_GATEWAY_UID names it.
 * Needs root (to become nobody); skips (77) without. And a message that
 * quotes the caller's endpoint is one line whatever bytes the endpoint
 * held. */
#include <errno.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gg_check.h"
#include "gradgate.h"

static char base[48], dir[64], sock[96];
static uid_t nobody;

/* A listener as `nobody` at `sock` that accepts and closes each
 * connection: a squatter, or a gateway that refuses at once. */
static pid_t squat(void)
{
	int ready[2];
	char c = 0;

	if (pipe(ready))
		return -1;
	pid_t pid = fork();
	if (pid == 0) {
		struct sockaddr_un a = { .sun_family = AF_UNIX };
		snprintf(a.sun_path, sizeof(a.sun_path), "%s", sock);
		if (setgid(65534) || setuid(nobody))
			_exit(2);
		int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
		if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) || listen(fd, 8))
			_exit(3);
		if (write(ready[1], "r", 1) != 1)
			_exit(4);
		for (int i = 0; i < 16; i++) {
			int c2 = accept(fd, NULL, NULL);
			if (c2 >= 0)
				close(c2);
		}
		_exit(0);
	}
	close(ready[1]);
	if (pid < 0 || read(ready[0], &c, 1) != 1) {
		close(ready[0]);
		return -1;
	}
	close(ready[0]);
	return pid;
}

static void stop(pid_t pid)
{
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	unlink(sock);
}

/* Opens a session at the squatter; returns the code, message in `msg`. */
static int open_at(char *msg, size_t size)
{
	char endpoint[160];
	struct gg_session *s = NULL;
	struct gg_error err;

	snprintf(endpoint, sizeof(endpoint), "unix:%s", sock);
	int rc = gg_session_open(endpoint, "job", 0, 1, &s, &err);
	snprintf(msg, size, "%s", err.message);
	if (s)
		gg_session_close(s);
	return rc;
}

/* A squatter at `sock` is refused, the message saying whose folder `dir`
 * is ("the owner of" or "not the owner of") and why it vouches for
 * nothing. */
static void expect_refused(const char *what, const char *owner, const char *why)
{
	char msg[512], want[512];
	pid_t pid = squat();

	CHECK(pid > 0, "cannot start the listener");
	CHECK(open_at(msg, sizeof(msg)) == GG_ERR_CONNECT, "%s: squatter accepted: %s", what, msg);
	snprintf(want, sizeof(want),
		 "unix:%s is held by uid %u: not root, not us (uid 0), %s %s, which others may %s; nothing sent to "
		 "it (set GRADGATE_GATEWAY_UID to trust the gateway's user)",
		 sock, (unsigned)nobody, owner, dir, why);
	CHECK(!strcmp(msg, want), "%s: got:  %s\nwant: %s", what, msg, want);
	stop(pid);
}

int main(void)
{
	struct passwd *pw = getpwnam("nobody");
	char msg[512], want[512];

	if (geteuid() != 0 || !pw) {
		printf("SKIP: needs root and a 'nobody' user\n");
		return 77;
	}
	nobody = pw->pw_uid;
	/* The socket's folder sits in one of root's, as /run/gradgate in /run. */
	snprintf(base, sizeof(base), "/tmp/gg-listener-XXXXXX");
	CHECK(mkdtemp(base), "mkdtemp: %s", strerror(errno));
	CHECK(chmod(base, 0755) == 0, "chmod");
	snprintf(dir, sizeof(dir), "%s/run", base);
	CHECK(mkdir(dir, 0700) == 0, "mkdir: %s", strerror(errno));
	snprintf(sock, sizeof(sock), "%s/site.sock", dir);
	unsetenv("GRADGATE_GATEWAY_UID");

	/* Nobody listens at a path with a newline in it. */
	struct gg_session *none = NULL;
	struct gg_error err;
	char endpoint[160];
	snprintf(endpoint, sizeof(endpoint), "unix:%s/no\nsuch\x1b.sock", dir);
	CHECK(gg_session_open(endpoint, "job", 0, 1, &none, &err) == GG_ERR_CONNECT && !none, "no listener: %d %s",
	      err.code, err.message);
	CHECK(!strpbrk(err.message, "\n\x1b") && strstr(err.message, "no?such?.sock"),
	      "the message is not one line: %s", err.message);

	/* A folder anyone may write to, as /tmp: the squatter is refused. */
	CHECK(chmod(dir, 01777) == 0, "chmod");
	expect_refused("a shared folder", "not the owner of", "write to");
	pid_t pid = squat();
	CHECK(pid > 0, "cannot start the listener");

	/* Named as the gateway's user, by name or number: the session goes on
	 * (and this listener closes at once). */
	setenv("GRADGATE_GATEWAY_UID", "nobody", 1);
	CHECK(open_at(msg, sizeof(msg)) == GG_ERR_CLOSED, "trusted listener not reached: %s", msg);
	snprintf(want, sizeof(want), "%u", (unsigned)nobody);
	setenv("GRADGATE_GATEWAY_UID", want, 1);
	CHECK(open_at(msg, sizeof(msg)) == GG_ERR_CLOSED, "trusted listener not reached: %s", msg);
	setenv("GRADGATE_GATEWAY_UID", "no-such-user-gg", 1);
	CHECK(open_at(msg, sizeof(msg)) == GG_ERR_INVALID, "bad GRADGATE_GATEWAY_UID accepted: %s", msg);
	CHECK(!strcmp(msg, "GRADGATE_GATEWAY_UID='no-such-user-gg' is neither a uid nor a known user name"), "got %s",
	      msg);
	/* A uid is digits alone. */
	snprintf(want, sizeof(want), " %u", (unsigned)nobody);
	setenv("GRADGATE_GATEWAY_UID", want, 1);
	CHECK(open_at(msg, sizeof(msg)) == GG_ERR_INVALID, "GRADGATE_GATEWAY_UID with a blank accepted: %s", msg);
	setenv("GRADGATE_GATEWAY_UID", "+0", 1);
	CHECK(open_at(msg, sizeof(msg)) == GG_ERR_INVALID, "GRADGATE_GATEWAY_UID with a sign accepted: %s", msg);
	/* Empty, as from GRADGATE_GATEWAY_UID=$VAR with VAR unset. */
	setenv("GRADGATE_GATEWAY_UID", "", 1);
	CHECK(open_at(msg, sizeof(msg)) == GG_ERR_INVALID, "an empty GRADGATE_GATEWAY_UID accepted: %s", msg);
	CHECK(!strcmp(msg, "GRADGATE_GATEWAY_UID is set but empty: unset it, or set it to a uid or a user name"),
	      "got %s", msg);
	stop(pid);
	/* ... and a bad value fails the open whoever listens: nobody, here. */
	setenv("GRADGATE_GATEWAY_UID", "no-such-user-gg", 1);
	CHECK(open_at(msg, sizeof(msg)) == GG_ERR_INVALID, "bad GRADGATE_GATEWAY_UID with no listener: %s", msg);
	unsetenv("GRADGATE_GATEWAY_UID");

	/* The folder belongs to the listener's user, as /run/gradgate belongs
	 * to the gateway's: only that user could have made the socket. */
	CHECK(chown(dir, nobody, 65534) == 0 && chmod(dir, 0755) == 0, "chown");
	pid = squat();
	CHECK(pid > 0, "cannot start the listener");
	CHECK(open_at(msg, sizeof(msg)) == GG_ERR_CLOSED, "folder owner not trusted: %s", msg);
	stop(pid);

	/* The same folder made in one others may write to, as /tmp, sticky
	 * or not: anyone could have made it, and the socket in it. */
	for (int i = 0; i < 2; i++) {
		CHECK(chmod(base, i ? 0777 : 01777) == 0, "chmod");
		expect_refused(i ? "its own folder in a 0777 one" : "its own folder in a 01777 one", "the owner of",
			       "have made");
	}
	/* ... and in a folder of its own user's in one of root's: trusted. */
	char mid[sizeof(base) + 8];
	snprintf(mid, sizeof(mid), "%s/mid", base);
	CHECK(chmod(base, 0755) == 0 && mkdir(mid, 0755) == 0 && chown(mid, nobody, 65534) == 0, "mkdir");
	char moved[sizeof(dir)];
	snprintf(moved, sizeof(moved), "%s/run", mid);
	CHECK(rename(dir, moved) == 0, "rename: %s", strerror(errno));
	snprintf(sock, sizeof(sock), "%s/site.sock", moved);
	pid = squat();
	CHECK(pid > 0, "cannot start the listener");
	CHECK(open_at(msg, sizeof(msg)) == GG_ERR_CLOSED, "folder owner under its own folder not trusted: %s", msg);
	stop(pid);
	CHECK(chmod(mid, 0775) == 0, "chmod");
	pid = squat();
	CHECK(pid > 0, "cannot start the listener");
	CHECK(open_at(msg, sizeof(msg)) == GG_ERR_CONNECT, "folder owner under a group-writable folder trusted: %s", msg);
	stop(pid);
	/* A link to that folder (../mid/run), put in a folder anyone may write
	 * in by the squatter, vouches for nothing; one of root's is root's
	 * word. */
	char shared[sizeof(base) + 8], link_path[sizeof(base) + 16], real_sock[sizeof(sock)];
	snprintf(shared, sizeof(shared), "%s/shared", base);
	snprintf(link_path, sizeof(link_path), "%s/gg", shared);
	CHECK(chmod(mid, 0755) == 0 && mkdir(shared, 0777) == 0 && chmod(shared, 0777) == 0 &&
		      symlink("../mid/run", link_path) == 0,
	      "symlink");
	snprintf(real_sock, sizeof(real_sock), "%s", sock);
	for (int root_link = 0; root_link < 2; root_link++) {
		CHECK(lchown(link_path, root_link ? 0 : nobody, 0) == 0, "lchown");
		pid = squat();
		CHECK(pid > 0, "cannot start the listener");
		snprintf(sock, sizeof(sock), "%s/site.sock", link_path);
		int rc = open_at(msg, sizeof(msg));
		CHECK(rc == (root_link ? GG_ERR_CLOSED : GG_ERR_CONNECT), "%s link in a shared folder: %s",
		      root_link ? "root's" : "the squatter's", msg);
		CHECK(root_link || strstr(msg, "which others may have made"), "got %s", msg);
		snprintf(sock, sizeof(sock), "%s", real_sock);
		stop(pid);
	}
	CHECK(unlink(link_path) == 0 && rmdir(shared) == 0, "unlink");

	CHECK(rename(moved, dir) == 0 && rmdir(mid) == 0, "rename back");
	snprintf(sock, sizeof(sock), "%s/site.sock", dir);

	/* Same folder, but others may write to it: refused again. */
	CHECK(chmod(dir, 0777) == 0, "chmod");
	expect_refused("its own folder, shared", "the owner of", "write to");

	rmdir(dir);
	rmdir(base);
	if (!failures)
		printf("test_client_listener: ok\n");
	return failures ? 1 : 0;
}
