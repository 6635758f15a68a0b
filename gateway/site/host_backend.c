/* The host backend: the seam (site_backend.h), its start, tick and stop
 * (host_internal.h). */
#include "host_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include "fileio.h"

GG_PRINTF(3, 0) static void hb_vlog(struct gg_host_backend *b, bool fault, const char *fmt, va_list ap)
{
	char line[512];

	if (!b->opts.log)
		return;
	vsnprintf(line, sizeof(line), fmt, ap);
	b->opts.log(b->opts.log_arg, fault, line);
}

void hb_log(struct gg_host_backend *b, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	hb_vlog(b, false, fmt, ap);
	va_end(ap);
}

void hb_warn(struct gg_host_backend *b, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	hb_vlog(b, true, fmt, ap);
	va_end(ap);
}

/* ---- the seam ----------------------------------------------------------- */

static struct gg_host_backend *host_of(struct gg_site_backend *base)
{
	return (struct gg_host_backend *)(void *)base;
}

static bool hb_on_cqe(struct gg_site_backend *base, const struct io_uring_cqe *cqe)
{
	struct gg_host_backend *b = host_of(base);
	unsigned kind = gg_loop_ud_kind(cqe->user_data);

	if (kind < b->opts.kind_base || kind >= b->opts.kind_base + GG_HOST_BACKEND_KINDS)
		return false;
	kind -= b->opts.kind_base;
	if (kind == K_ACCEPT) {
		hb_on_accept(b, cqe);
		return true;
	}
	if (kind == K_CANCEL) {
		b->cancels--;
		/* Only check_socket_path()'s, or only hb_stop()'s, is ever in
		 * flight. */
		if (b->old_cancel_queued) {
			close(b->old_listen_fd);
			b->old_listen_fd = -1;
			b->old_cancel_queued = false;
		}
		return true;
	}

	uint32_t index = gg_loop_ud_index(cqe->user_data);
	struct hb_conn *c = index < hb_slots(b) ? &b->conns[index] : NULL;
	if (!c || c->state == C_FREE || c->gen != gg_loop_ud_aux(cqe->user_data)) {
		hb_warn(b, "completion for a control connection that is gone (slot %u)", index);
		return true;
	}
	if (kind == K_RECV)
		hb_on_recv(b, c, cqe->res);
	else
		hb_on_send(b, c, cqe->res);
	hb_conn_settle(b, c, b->loop->now_us);
	return true;
}

static void check_socket_path(struct gg_host_backend *b, uint64_t now_us);

static uint64_t hb_tick(struct gg_site_backend *base, uint64_t now_us)
{
	struct gg_host_backend *b = host_of(base);
	uint64_t next = 0;

	check_socket_path(b, now_us);
	next = gg_acceptor_tick(&b->accept, now_us, b->stopping);
	next = hb_min_deadline(next, hb_serve_waiting(b, now_us));
	for (unsigned i = 0; i < hb_slots(b); i++) {
		struct hb_conn *c = &b->conns[i];
		if (c->io_error && (c->state == C_HELLO || c->state == C_ACTIVE))
			hb_conn_lost(b, c, c->io_error);
		if (c->state == C_HELLO && now_us >= c->deadline_us)
			hb_conn_refuse(b, c, GG_ERR_TIMEOUT, "no HELLO within %llu ms",
				       (unsigned long long)b->opts.hello_timeout_us / 1000);
		hb_conn_settle(b, c, now_us);
		/* A connection held for its GPU allocations waits for the NCCL
		 * calls, whose polls tick. */
		bool held = (c->state == C_CLOSING && hb_conn_holds_gpu(b, c));
		if (c->io_error && c->state != C_FREE && !held)
			next = hb_min_deadline(next, now_us);
		else if (c->state == C_HELLO || (c->state == C_CLOSING && !c->shut && !held))
			next = hb_min_deadline(next, c->deadline_us);
	}
	for (struct hb_job *j = b->jobs, *after; j; j = after) {
		uint64_t poll = 0;
		after = j->next;
		/* A communicator given up while it came up, where nothing settled
		 * the job since (a step failed before its reduce): its waiting
		 * ranks are told now. */
		if (j->nccl_never_up) {
			hb_job_settle(b, j); /* may free it */
			next = hb_min_deadline(next, now_us);
			continue;
		}
		if (hb_nccl_progress(b, j, now_us, &poll)) {
			hb_job_settle(b, j); /* may free it */
			next = hb_min_deadline(next, now_us);
			continue;
		}
		next = hb_min_deadline(next, poll);
		/* News from the other sites came in since the last tick. */
		if (hb_failed_elsewhere(b, j))
			hb_job_advance(b, j);
		if (!j->with_core && !j->nccl_phase && !j->broken && j->deadline_us && now_us >= j->deadline_us) {
			hb_fail_timeout(b, j);
			hb_job_advance(b, j);
		}
		/* Nothing waits for the deadline of a step the core or an NCCL
		 * call holds, or of a broken job's (whose requests are answered
		 * as they come): a past one would spin the loop. */
		next = hb_min_deadline(next, j->with_core || j->nccl_phase || j->broken ? 0 : j->deadline_us);
	}
	/* Lines left out of the log are told once their second is over. */
	next = hb_tell_held(b, &b->refusal_log, false, "refused", next);
	next = hb_tell_held(b, &b->session_log, false, "ranks came or left", next);
	next = hb_tell_held(b, &b->accept_log, true, "failed accepts", next);
	/* Connections held for what was let go of end at the next turn. */
	if (hb_deferred_free(b))
		next = hb_min_deadline(next, now_us);
	return next;
}

void gg_host_backend_complete(struct gg_host_backend *b, struct gg_site_step *step, int status,
			      const char *message)
{
	struct hb_job *j = (struct hb_job *)(void *)((char *)step - offsetof(struct hb_job, step));

	if (!message || !*message)
		message = gg_strerror(status);
	if (step->backend != &b->base || !j->with_core) {
		hb_warn(b, "the core completed step %llu of job '%s', which it does not hold",
		       (unsigned long long)step->seq, step->job);
		return;
	}
	j->active_us = b->loop->now_us;
	if (j->in_submit) {
		if (!j->sync_done) {
			j->sync_done = true;
			j->sync_status = status;
			gg_ctrl_set_text(j->sync_msg, sizeof(j->sync_msg), message);
		}
		return;
	}
	hb_finish_step(b, j, status, message);
	hb_job_settle(b, j);
}

static void hb_complete(struct gg_site_backend *base, struct gg_site_step *step, int status, const char *message)
{
	gg_host_backend_complete(host_of(base), step, status, message);
}

/* How long a socket that refused is given to start listening. */
#define STALE_RECHECK_US 50000

/* Connects a new socket (*probe) to addr: 0, or connect()'s negative
 * errno with *probe open, or socket()'s with *probe -1 and err set. */
static int probe_connect(const char *path, const struct sockaddr_un *addr, int *probe, char *err, size_t err_size)
{
	if ((*probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0)) < 0) {
		snprintf(err, err_size, "control socket %s: socket: %s", path, strerror(errno));
		return -errno;
	}
	return connect(*probe, (const struct sockaddr *)addr, sizeof(*addr)) ? -errno : 0;
}

/* A control socket path that is in the way: refused when a live gateway
 * still listens on it or it is not a socket; unlinked when stale (its
 * gateway died). Returns 0 once unlinked, or a negative errno with err. */
static int clear_stale_socket(const char *path, const struct sockaddr_un *addr, char *err, size_t err_size)
{
	struct stat st;

	if (lstat(path, &st) || !S_ISSOCK(st.st_mode)) {
		snprintf(err, err_size, "control socket %s: the path exists and is not a socket", path);
		return -EADDRINUSE;
	}
	int probe = -1, rc;
	/* A listener whose process is gone is a killed gateway's, whose ring
	 * holds the socket a few milliseconds more (as its TCP port): asked
	 * again every 10 ms for up to a second until it lets go. */
	for (unsigned waited_ms = 0;; waited_ms += 10) {
		if ((rc = probe_connect(path, addr, &probe, err, err_size)) && probe < 0)
			return rc;
		struct ucred was = { .pid = 0 };
		socklen_t was_len = sizeof(was);
		if (rc || waited_ms >= 1000 || getsockopt(probe, SOL_SOCKET, SO_PEERCRED, &was, &was_len) || !was.pid ||
		    !kill(was.pid, 0) || errno != ESRCH)
			break;
		close(probe);
		usleep(10000);
	}
	/* A socket that refuses may be one a gateway starting this moment has
	 * bound and is about to listen on (two started at once with the same
	 * path): asked again a little later, before it is taken for stale. */
	if (rc == -ECONNREFUSED) {
		usleep(STALE_RECHECK_US);
		close(probe);
		if ((rc = probe_connect(path, addr, &probe, err, err_size)) && probe < 0)
			return rc;
	}
	struct ucred peer = { .pid = 0 };
	socklen_t peer_len = sizeof(peer);
	bool known = rc == 0 && !getsockopt(probe, SOL_SOCKET, SO_PEERCRED, &peer, &peer_len);
	close(probe);
	const uid_t self = geteuid();
	char pid[24] = "";
	if (known && peer.pid) /* 0 from another PID namespace */
		snprintf(pid, sizeof(pid), " (pid %d)", (int)peer.pid);
	/* Another user's listener, or another user's socket that is not a
	 * stale one of ours: not a second gateway of this user's, but a
	 * squatter perhaps. */
	if (known && peer.uid != self) {
		snprintf(err, err_size, "control socket %s: a process of uid %u%s, not this gateway's user (uid %u), is "
			 "listening on it", path, (unsigned)peer.uid, pid, (unsigned)self);
		return -EADDRINUSE;
	}
	if (rc == 0) {
		snprintf(err, err_size, "control socket %s: another gateway is listening on it%s", path, pid);
		return -EADDRINUSE;
	}
	if (rc != -ECONNREFUSED && st.st_uid != self) {
		snprintf(err, err_size, "control socket %s: a socket of uid %u, not this gateway's user (uid %u), is "
			 "there, and cannot be told unused: %s", path, (unsigned)st.st_uid, (unsigned)self,
			 strerror(-rc));
		return -EADDRINUSE;
	}
	if (rc != -ECONNREFUSED) {
		snprintf(err, err_size, "control socket %s: cannot tell whether it is in use: %s", path,
			 strerror(-rc));
		return rc;
	}
	if (unlink(path)) {
		snprintf(err, err_size, "control socket %s: removing the stale socket: %s", path, strerror(errno));
		return -errno;
	}
	return 0;
}

/* Whoever may rename or remove the entries of a folder on the socket's
 * path could move the gateway's socket aside and put their own in its
 * place, and take the ranks' sessions (the library trusts the folder's
 * owner), or a link, which the gateway's chmod would follow; and whoever
 * owns a link on it could point it elsewhere (gg_path_guarded()). A folder
 * not made yet is judged by the one it will be made in (and the whole path
 * again once the socket is there). Returns 0, or a negative errno with
 * err. */
static int check_socket_folders(const char *path, char *err, size_t err_size)
{
	char why[PATH_MAX + 256];
	int rc = gg_path_guarded(path, "could put another socket in the gateway's place", why, sizeof(why));

	if (rc)
		snprintf(err, err_size, "control socket %s: %s", path, why);
	return rc;
}

/* The socket's folder `dir` does not exist and the gateway's user may not
 * make it (`why`): as /run/gradgate, which only root may make in /run,
 * and the systemd unit makes at each start. */
static int folder_unmakeable(const char *path, const char *dir, const char *why, char *err, size_t err_size)
{
	char who[256];

	gg_user_name(geteuid(), who, sizeof(who));
	snprintf(err, err_size, "control socket %s: folder %s does not exist, and the gateway's user may not make it "
		 "(%s)%s make it first: install -d -m 0755 -o %s '%s'", path, dir, why,
		 strcmp(dir, "/run/gradgate") ? ";" : ": the systemd unit makes it at each start (RuntimeDirectory); "
						     "to run the gateway otherwise,", who, dir);
	return -EACCES;
}

/* `dir`, a folder that does not exist, cut to the first folder on its
 * path that does not. */
static void first_missing_folder(char *dir)
{
	for (char *p = strchr(dir + 1, '/'); p; p = strchr(p + 1, '/')) {
		*p = '\0';
		if (access(dir, F_OK))
			return;
		*p = '/';
	}
}

/* Makes the socket's own folder where it is missing. The default folder
 * (/run/gradgate) lives in a tmpfs that a reboot empties. Made here, it
 * belongs to the gateway's user and only that user may add a socket to
 * it, which the client library takes as proof of who listens. Only that
 * folder is made: a missing one above it is a path mistyped more likely
 * than one to make. Returns 0, or a negative errno with err. */
static int make_socket_folder(const char *path, char *err, size_t err_size)
{
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
	struct stat st;

	snprintf(dir, sizeof(dir), "%s", path);
	char *slash = strrchr(dir, '/');
	if (!slash || slash == dir)
		return 0;
	*slash = '\0';
	if (!stat(dir, &st))
		return 0; /* bind() says what else may be wrong */
	if (!mkdir(dir, 0755)) {
		(void)!chmod(dir, 0755); /* whatever the umask: ranks of every user reach it */
		return 0;
	}
	int rc = -errno;
	if (rc == -EEXIST)
		return 0;
	if (rc == -EACCES || rc == -EPERM || rc == -EROFS)
		return folder_unmakeable(path, dir, strerror(-rc), err, err_size);
	if (rc == -ENOENT) {
		first_missing_folder(dir);
		snprintf(err, err_size, "control socket %s: folder %s does not exist (the gateway makes only the "
			 "socket's own folder): make it first, or check the path", path, dir);
		return rc;
	}
	snprintf(err, err_size, "control socket %s: folder %s: %s", path, dir, strerror(-rc));
	return rc;
}

/* Holds PATH.lock for as long as the gateway listens at PATH: of two
 * gateways started with one control path, however close together, the
 * second is refused, where otherwise it could take the first's socket,
 * bound and not listening yet, for a dead gateway's and replace it. The
 * gateway removes the file as it stops (release_lock()); one that died
 * leaves it, unlocked, for the next. Returns 0, or a negative errno with
 * err. */
#define LOCK_PATH_MAX (sizeof(((struct gg_host_backend *)0)->path) + 8)

/* The lock file of the control socket at `path` (at most the backend's
 * path's size). */
static const char *lock_path(const char *path, char lock[LOCK_PATH_MAX])
{
	snprintf(lock, LOCK_PATH_MAX, "%s.lock", path);
	return lock;
}

bool gg_host_backend_held(const char *control, char *pid, size_t size)
{
	char lock[LOCK_PATH_MAX], line[256];
	struct stat st;
	bool held = false;

	pid[0] = '\0';
	if (!control || strncmp(control, "unix:/", 6) ||
	    strlen(control + 5) >= sizeof(((struct gg_host_backend *)0)->path) ||
	    lstat(lock_path(control + 5, lock), &st) || !S_ISREG(st.st_mode))
		return false;
	/* Read, not tried: a lock taken here, however briefly, could refuse a
	 * gateway that starts in that instant. */
	FILE *f = fopen("/proc/locks", "re");
	if (!f)
		return false;
	while (!held && fgets(line, sizeof(line), f)) {
		char kind[16];
		long holder;
		unsigned maj, min;
		unsigned long ino;
		if (!strstr(line, "->") &&
		    sscanf(line, "%*d: %15s %*s %*s %ld %x:%x:%lu", kind, &holder, &maj, &min, &ino) == 5 &&
		    !strcmp(kind, "FLOCK") && ino == st.st_ino && maj == major(st.st_dev) && min == minor(st.st_dev)) {
			held = true;
			if (holder > 0)
				snprintf(pid, size, "%ld", holder);
		}
	}
	fclose(f);
	return held;
}

static int take_lock(struct gg_host_backend *b, char *err, size_t err_size)
{
	char lock[LOCK_PATH_MAX], pid[24] = "";
	int fd = open(lock_path(b->path, lock), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);

	if (fd < 0) {
		snprintf(err, err_size, "control socket %s: its lock file %s: %s", b->path, lock, strerror(errno));
		return -errno;
	}
	if (flock(fd, LOCK_EX | LOCK_NB)) {
		const int e = errno;
		ssize_t n = pread(fd, pid, sizeof(pid) - 1, 0);
		pid[n > 0 ? n : 0] = '\0';
		pid[strcspn(pid, "\n")] = '\0';
		close(fd);
		if (e == EWOULDBLOCK) {
			snprintf(err, err_size, "control socket %s: another gateway holds it%s%s%s (its lock file %s)", b->path,
				 *pid ? " (pid " : "", pid, *pid ? ")" : "", lock);
			return -EADDRINUSE;
		}
		snprintf(err, err_size, "control socket %s: its lock file %s: %s", b->path, lock, strerror(e));
		return -e;
	}
	/* For the message of a gateway this one refuses (poorer without). */
	int len = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
	if (!ftruncate(fd, 0))
		(void)!pwrite(fd, pid, (size_t)len, 0);
	b->lock_fd = fd;
	return 0;
}

/* Removed while still held, so that no gateway starting now locks the
 * file that goes; one that opened it before has its lock refused until
 * this close, and may then lock a file that is gone: a third gateway
 * starting in the same instant could lock a new one beside it. */
static void release_lock(struct gg_host_backend *b)
{
	char lock[LOCK_PATH_MAX];

	if (b->lock_fd < 0)
		return;
	unlink(lock_path(b->path, lock));
	close(b->lock_fd);
	b->lock_fd = -1;
}

/* listen_on() once the lock is held. */
static int listen_locked(struct gg_host_backend *b, char *err, size_t err_size)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	struct stat st;
	int rc;

	memcpy(addr.sun_path, b->path, strlen(b->path) + 1);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		snprintf(err, err_size, "control socket %s: socket: %s", b->path, strerror(errno));
		return -errno;
	}
	rc = bind(fd, (struct sockaddr *)&addr, sizeof(addr)) ? -errno : 0;
	if (rc == -EADDRINUSE) {
		if ((rc = clear_stale_socket(b->path, &addr, err, err_size))) {
			close(fd);
			return rc;
		}
		rc = bind(fd, (struct sockaddr *)&addr, sizeof(addr)) ? -errno : 0;
	}
	/* Every folder is there now, some maybe made by another since they
	 * were checked: checked again before the chmod follows the path.
	 * The callers checked them before bind too: failing now, another user
	 * changed them since, and what is at the path is unlinked only if it
	 * is still the file bind made (left, it would hold the path). */
	struct stat made;
	const bool have_made = !rc && !stat(b->path, &made);
	if (!rc && (rc = check_socket_folders(b->path, err, err_size))) {
		if (have_made && !stat(b->path, &st) && st.st_dev == made.st_dev && st.st_ino == made.st_ino)
			unlink(b->path);
		close(fd);
		return rc;
	}
	const bool bound = !rc;
	/* Whatever the umask: ranks of every user connect (what each may do
	 * is the protocol's to decide: a job belongs to its first rank's user). */
	if (!rc)
		rc = chmod(b->path, 0666) ? -errno : 0;
	if (!rc)
		rc = listen(fd, SOMAXCONN) ? -errno : 0;
	if (!rc)
		rc = stat(b->path, &st) ? -errno : 0;
	if (rc) {
		if (bound) /* the socket bind made, in folders just found safe */
			unlink(b->path);
		close(fd);
		snprintf(err, err_size, "control socket %s: %s", b->path, strerror(-rc));
		return rc;
	}
	b->listen_fd = fd;
	b->accept.fd = fd;
	b->listen_dev = st.st_dev;
	b->listen_ino = st.st_ino;
	return 0;
}

/* How often the control socket's path is looked at. */
#define PATH_CHECK_US 1000000u

/* Cancels the accept of the socket check_socket_path() replaced, which is
 * closed once that is done (the cancel names it by its descriptor); tried
 * again at the next tick where the ring has no room. */
static void cancel_old_accept(struct gg_host_backend *b)
{
	if (b->old_listen_fd < 0 || b->old_cancel_queued)
		return;
	if (gg_loop_cancel_fd(b->loop, b->old_listen_fd, hb_ud(b, K_CANCEL, NULL)) == 0) {
		b->cancels++;
		b->old_cancel_queued = true;
	}
}

/* The control socket's path removed while the gateway runs (a clean-up of
 * its folder, an rm) leaves ranks nothing to connect to, and no word of
 * why: it is made again, with a new socket (the lock is still held). The
 * old socket's accept is cancelled, and the acceptor arms again, on the new
 * one. One that cannot be made is said once, and tried again at each look;
 * a path another file took is left to it, and said once. */
static void check_socket_path(struct gg_host_backend *b, uint64_t now_us)
{
	char err[TEXT];
	struct stat st;

	cancel_old_accept(b);
	if (b->stopping || b->listen_fd < 0 || b->old_listen_fd >= 0 || now_us < b->path_check_us)
		return;
	b->path_check_us = now_us + PATH_CHECK_US;
	if (!stat(b->path, &st)) {
		if ((st.st_dev != b->listen_dev || st.st_ino != b->listen_ino) && !b->path_taken_said) {
			b->path_taken_said = true;
			hb_warn(b, "control socket %s: another file took its path: ranks that connect there do not "
			       "reach this gateway", b->path);
		}
		return;
	}
	if (errno != ENOENT)
		return;
	const int old = b->listen_fd;
	/* Checked before bind too: a socket made in a folder that is not safe
	 * would stay there, holding the path, once found so. */
	if (check_socket_folders(b->path, err, sizeof(err)) || listen_locked(b, err, sizeof(err))) {
		if (!b->path_remake_said)
			hb_warn(b, "control socket %s was removed, and cannot be made again (%s): ranks cannot connect "
			       "until it is (tried each second)", b->path, err);
		b->path_remake_said = true;
		return;
	}
	b->path_taken_said = b->path_remake_said = false;
	if (b->accept.armed) {
		b->old_listen_fd = old;
		cancel_old_accept(b);
	} else {
		close(old); /* nothing in flight on it: its accept waits to be armed again, on the new one */
	}
	hb_log(b, "control socket %s was removed while the gateway ran: made again", b->path);
}

static int listen_on(struct gg_host_backend *b, char *err, size_t err_size)
{
	int rc;

	if ((rc = check_socket_folders(b->path, err, err_size)) || (rc = make_socket_folder(b->path, err, err_size)) ||
	    (rc = take_lock(b, err, err_size)))
		return rc;
	if ((rc = listen_locked(b, err, err_size)))
		release_lock(b);
	return rc;
}

static int hb_start(struct gg_site_backend *base, struct gg_loop *loop, char *err, size_t err_size)
{
	struct gg_host_backend *b = host_of(base);
	int rc;

	if (b->loop) {
		snprintf(err, err_size, "host backend already started");
		return -EINVAL;
	}
	if ((rc = listen_on(b, err, err_size)))
		return rc;
	b->loop = loop;
	b->accept = (struct gg_acceptor){ .loop = loop, .fd = b->listen_fd, .ud = hb_ud(b, K_ACCEPT, NULL) };
	hb_arm_accept(b);
	if (!b->accept.armed) {
		snprintf(err, err_size, "control socket %s: cannot queue accept on the loop", b->path);
		return -EIO;
	}
	hb_log(b, "host backend of site %s listening on unix:%s", b->site, b->path);
	return 0;
}

static bool hb_stop(struct gg_site_backend *base)
{
	struct gg_host_backend *b = host_of(base);

	if (!b->loop)
		return true;
	if (!b->stopping) {
		char why[TEXT];
		b->stopping = true;
		snprintf(why, sizeof(why), "the gateway of site %s is shutting down", b->site);
		for (unsigned i = 0; i < hb_slots(b); i++) {
			struct hb_conn *c = &b->conns[i];
			if (c->state == C_HELLO)
				hb_conn_refuse(b, c, GG_ERR_CLOSED, "%s", why);
			if (c->state != C_ACTIVE)
				continue;
			hb_conn_end(b, c, GG_ERR_CLOSED, why, why);
			hb_conn_settle(b, c, b->loop->now_us);
		}
		hb_serve_waiting(b, b->loop->now_us);
	}
	/* Retried on every call should the ring have had no room. The accept
	 * in flight may be a replaced socket's (check_socket_path()), which
	 * its own cancel ends. */
	cancel_old_accept(b);
	if (b->old_listen_fd < 0 && b->accept.armed && !b->cancels &&
	    gg_loop_cancel_fd(b->loop, b->listen_fd, hb_ud(b, K_CANCEL, NULL)) == 0)
		b->cancels++;
	if (b->listen_fd >= 0 && !b->accept.armed && !b->cancels) {
		struct stat st;
		close(b->listen_fd);
		b->listen_fd = -1;
		if (!stat(b->path, &st) && st.st_dev == b->listen_dev && st.st_ino == b->listen_ino)
			unlink(b->path);
		release_lock(b);
	}
	for (struct hb_job *j = b->jobs; j; j = j->next)
		if (j->with_core || j->nccl_phase)
			return false;
	return b->listen_fd < 0 && !b->stats.connections;
}

static void hb_destroy(struct gg_site_backend *base)
{
	struct gg_host_backend *b = host_of(base);

	if (!b)
		return;
	/* Only reached without start() or after stop() returned true. */
	if (b->listen_fd >= 0)
		close(b->listen_fd);
	if (b->old_listen_fd >= 0)
		close(b->old_listen_fd);
	release_lock(b);
	for (unsigned i = 0; i < b->waiting_count; i++)
		close(b->waiting[i].fd);
	if (b->spare_wait_fd >= 0)
		close(b->spare_wait_fd);
	while (b->jobs)
		hb_job_free(b, b->jobs);
	hb_deferred_free(b);
	free(b->deferred);
	free(b->conns);
	free(b);
}

static const struct gg_site_backend_ops host_ops = {
	.name = "host",
	.start = hb_start,
	.on_cqe = hb_on_cqe,
	.tick = hb_tick,
	.complete = hb_complete,
	.stop = hb_stop,
	.destroy = hb_destroy,
};

struct gg_site_backend *gg_host_backend_base(struct gg_host_backend *b)
{
	return &b->base;
}

void gg_host_backend_get_stats(const struct gg_host_backend *b, struct gg_host_backend_stats *stats)
{
	*stats = b->stats;
	stats->sessions = 0;
	for (const struct hb_job *j = b->jobs; j; j = j->next)
		stats->sessions += j->connected;
}

unsigned gg_host_backend_list_jobs(const struct gg_host_backend *b, struct gg_host_job_info *out, unsigned max)
{
	unsigned n = 0;

	/* New jobs go to the front of the list. */
	for (const struct hb_job *j = b->jobs; j; j = j->next)
		n++;
	unsigned skip = n > max ? n - max : 0, i = 0;
	for (const struct hb_job *j = b->jobs; j; j = j->next, i++) {
		if (i < skip)
			continue;
		bool announced = false;
		for (unsigned r = 0; r < j->nranks && !announced; r++)
			announced = j->ranks[r] && j->ranks[r]->req_count;
		struct gg_host_job_info *o = &out[n - 1 - i];
		memcpy(o->name, j->name, sizeof(o->name));
		o->nranks = j->nranks;
		o->connected = j->connected;
		o->last_step = GG_MAX(j->seq - 1, j->ended_seq);
		o->uid = (uint32_t)j->uid;
		const bool failed = j->broken || (b->core_ops->job_failed && b->core_ops->job_failed(b->core, j->name));
		o->state = failed ? GG_CTRL_JOB_FAILED : j->with_core || j->nccl_phase ? GG_CTRL_JOB_RUNNING
			   : announced ? GG_CTRL_JOB_GATHERING : GG_CTRL_JOB_IDLE;
	}
	return n;
}

void gg_host_backend_options_from_config(const struct gg_config *cfg, struct gg_host_backend_options *opts)
{
	*opts = (struct gg_host_backend_options){
		.control = cfg->site.control,
		.site = cfg->site.name,
		.max_clients = (unsigned)cfg->limits.max_clients,
		.max_message_bytes = cfg->limits.max_message_bytes,
		.memory_bytes = cfg->limits.memory_bytes,
		.step_timeout_us = cfg->transport.step_timeout_us,
		.answer_grace_us = cfg->transport.heartbeat_timeout_us,
		.hello_timeout_us = cfg->transport.handshake_timeout_us,
		.session_idle_us = cfg->limits.session_idle_us,
		.user_shares = true,
		.kind_base = GG_OP_USER,
#if HAVE_NCCL
		.nccl = &gg_site_nccl_real,
#endif
	};
}

/* Whether a socket can be made in folder `dir`: a file system may refuse
 * one where the permissions allow it (/proc, sysfs). Tried with a name of
 * its own, gone again at once; 0 where that name would not fit. */
static int try_socket_in(const char *dir)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	int n = snprintf(addr.sun_path, sizeof(addr.sun_path), "%s/.gradgate-check.%ld", dir, (long)getpid());
	if (n < 0 || (size_t)n >= sizeof(addr.sun_path))
		return 0;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return 0; /* nothing learnt of the folder */
	int rc = bind(fd, (const struct sockaddr *)&addr, sizeof(addr)) ? -errno : 0;
	if (!rc)
		unlink(addr.sun_path);
	close(fd);
	return rc == -EADDRINUSE ? 0 : rc; /* a name taken: a socket could be made */
}

int gg_host_backend_check_control(const char *control, char *err, size_t err_size)
{
	/* The rest of the endpoint is the config's to check. */
	if (!control || strncmp(control, "unix:/", 6))
		return 0;
	const char *path = control + 5;
	struct stat st;
	int rc = check_socket_folders(path, err, err_size);
	if (rc)
		return rc;
	/* What listen_on() would refuse: something else at the path (a
	 * socket may be a stale one, or a running gateway's, told at start),
	 * or a folder missing above the socket's own, which it makes. */
	if (!lstat(path, &st) && !S_ISSOCK(st.st_mode)) {
		snprintf(err, err_size, "control socket %s: the path exists and is not a socket", path);
		return -EEXIST;
	}
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
	snprintf(dir, sizeof(dir), "%s", path);
	for (int level = 0; level < 2; level++) {
		/* The folder above: "a//b" is a's, "/a" is "/". */
		char *slash = strrchr(dir, '/');
		while (slash && slash > dir && slash[-1] == '/')
			slash--;
		if (!slash || !strcmp(dir, "/"))
			return 0;
		slash[slash == dir] = '\0';
		if (!stat(dir, &st)) {
			/* The socket's folder is missing: listen_on() makes it
			 * where the gateway's user may. */
			if (S_ISDIR(st.st_mode) && level == 1 && faccessat(AT_FDCWD, dir, W_OK | X_OK, AT_EACCESS) &&
			    (errno == EACCES || errno == EROFS)) {
				char missing[sizeof(dir)];
				snprintf(missing, sizeof(missing), "%.*s", (int)(strrchr(path, '/') - path), path);
				return folder_unmakeable(path, missing, "no write access to its parent folder", err,
							 err_size);
			}
			/* The socket's own folder: the gateway's user makes (and
			 * replaces a stale) socket in it. */
			if (S_ISDIR(st.st_mode) && level == 0 && faccessat(AT_FDCWD, dir, W_OK | X_OK, AT_EACCESS) &&
			    (errno == EACCES || errno == EROFS)) {
				const bool read_only = errno == EROFS;
				char who[256];
				gg_user_name(geteuid(), who, sizeof(who));
				char advice[sizeof(dir) + 600];
				if (read_only)
					snprintf(advice, sizeof(advice), "a read-only file system): choose a folder on one "
						 "it may write in, as /run/gradgate");
				else if (st.st_uid == 0) /* /run, /etc: no folder to give away */
					snprintf(advice, sizeof(advice), "no write access): use a folder of its own, as "
						 "/run/gradgate (install -d -m 0755 -o %s /run/gradgate)", who);
				else
					snprintf(advice, sizeof(advice), "no write access): give it the folder (chown %s "
						 "'%s'), or choose one it may write in", who, dir);
				snprintf(err, err_size, "control socket %s: the gateway's user (%s) may not make it in %s (%s",
					 path, who, dir, advice);
				return -EACCES;
			}
			if (S_ISDIR(st.st_mode) && level == 0 && (rc = try_socket_in(dir))) {
				snprintf(err, err_size, "control socket %s: no socket can be made in %s: %s", path, dir,
					 strerror(-rc));
				return rc;
			}
			if (S_ISDIR(st.st_mode))
				return 0;
			snprintf(err, err_size, "control socket %s: %s is not a folder", path, dir);
			return -ENOTDIR;
		}
		if (errno != ENOENT)
			return 0; /* the socket check above said what it could */
	}
	snprintf(dir, sizeof(dir), "%s", path);
	*strrchr(dir, '/') = '\0';
	first_missing_folder(dir);
	snprintf(err, err_size, "control socket %s: folder %s does not exist (the gateway makes only the socket's "
		 "own folder): make it first, or check the path", path, dir);
	return -ENOENT;
}

int gg_host_backend_create(const struct gg_host_backend_options *opts, const struct gg_core_ops *core_ops,
			   void *core, struct gg_host_backend **out, char *err, size_t err_size)
{
	const char *ctl = opts->control ? opts->control : "";
	struct gg_host_backend *b;

	*out = NULL;
	if (strncmp(ctl, "unix:/", 6)) {
		snprintf(err, err_size, "control endpoint '%s': host mode shares memory with local ranks, so it "
			 "needs unix:/absolute/path", ctl);
		return -EINVAL;
	}
	if (strlen(ctl + 5) >= sizeof(b->path)) {
		snprintf(err, err_size, "control endpoint '%s': the path is longer than %zu bytes", ctl,
			 sizeof(b->path) - 1);
		return -EINVAL;
	}
	if (!opts->site || !*opts->site || strlen(opts->site) >= sizeof(b->site)) {
		snprintf(err, err_size, "host backend: the site name must have 1 to %zu characters", sizeof(b->site) - 1);
		return -EINVAL;
	}
	if (opts->max_clients < 1 || opts->max_clients > 4096 || !opts->max_message_bytes ||
	    opts->max_message_bytes > MAX_MESSAGE_LIMIT || !opts->memory_bytes || opts->step_timeout_us < 1000 ||
	    opts->hello_timeout_us < 1000 || opts->kind_base < GG_OP_USER ||
	    opts->kind_base + GG_HOST_BACKEND_KINDS > 256 || !core_ops || !core_ops->submit) {
		snprintf(err, err_size, "host backend: options out of range (max_clients 1..4096, max_message 1 "
			 "byte..1 TiB, timeouts >= 1 ms, kind_base >= GG_OP_USER, a core with submit)");
		return -EINVAL;
	}
	b = calloc(1, sizeof(*b));
	if (!b || !(b->conns = calloc(opts->max_clients + STATUS_SLOTS, sizeof(*b->conns)))) {
		free(b);
		snprintf(err, err_size, "host backend: out of memory");
		return -ENOMEM;
	}
	b->base.ops = &host_ops;
	b->opts = *opts;
	b->opts.control = NULL;
	b->opts.site = NULL;
	memcpy(b->path, ctl + 5, strlen(ctl + 5) + 1);
	memcpy(b->site, opts->site, strlen(opts->site) + 1);
	b->core_ops = core_ops;
	b->core = core;
	b->listen_fd = -1;
	b->old_listen_fd = -1;
	b->lock_fd = -1;
	b->spare_wait_fd = -1;
	/* Room for a largest message next to requests still in flight. */
	b->max_region_bytes = (2 * opts->max_message_bytes + GG_CTRL_ALIGN + 4095) & ~(uint64_t)4095;
	for (unsigned i = 0; i < hb_slots(b); i++) {
		b->conns[i].index = i;
		b->conns[i].fd = -1;
	}
	*out = b;
	return 0;
}
