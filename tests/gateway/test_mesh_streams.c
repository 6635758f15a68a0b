/* The peer mesh alone: meshes of K sites (s0, s1, ...) driven by this one
 * thread, each on its own io_uring loop, over loopback TLS. Each case is a
 * way the mesh's streams can go wrong:
 *
 *   dial-setup-fails  dials fail to start (no file descriptors left): the
 *                     mesh still connects once they come back, and
 *                     shuts down to idle
 *   accept-fails       a connection comes while no descriptor is left: the
 *                     listener says so once a second, tries again every
 *                     100 ms, and takes it once descriptors are back
 *   ack-at-full-queue ACKs owed while the stream they go on has a full
 *                     send queue still reach the sender
 *   teardown-in-flight a mesh freed with I/O in flight leaves nothing in
 *                     flight behind it
 *   at-the-limits      eight sites with 64 streams to each peer connect
 *   long-names         eight sites whose names have 63 characters (the
 *                      longest HELLO) connect
 *   dial-pairs         every pair of [[peers]] dial settings that works
 *                      connects, on connections the expected site dialed,
 *                      and carries DATA both ways
 *   one-way            a site the other cannot reach (its address there is
 *                      a closed port) still joins the mesh by dialing
 *   dial-conflicts     both "in" or both "out": no stream ever comes up
 *   duplicates         both sites dial every stream at once: each keeps the
 *                      connection the first site dialed, with no gap, DATA
 *                      sent on the others arrives, and nothing flaps after
 *   redial-converges   after every stream is cut, and after a restart, both
 *                      sites redial and settle on the first site's again
 *   forgotten-not-resent DATA of a job that ended is not sent again when
 *                      the streams it went on are lost; other DATA is
 *
 *   test_mesh_streams CERT_DIR [CASE | --except CASE]  (certificates
 *   from examples/make-certs.sh for sites s0..s7): every case, one, or
 *   every other one */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gg_check.h"
#include "gg_sites.h"
#include "log.h"
#include "log_capture.h"
#include "mesh.h"
#include "net_addr.h"

#define MAX_K 8

struct site {
	unsigned index;
	struct gg_config cfg;
	struct gg_tls_context *tls;
	struct gg_loop loop;
	bool loop_ok;
	struct gg_mesh *mesh;
	struct gg_wire_hello hello;
	unsigned data_in, controls_in;
	unsigned ups, downs;   /* streams that came up or went down, counted each time */
	uint64_t got;          /* bit c: DATA for chunk c arrived */
	bool no_ack;           /* DATA is taken but not acknowledged */
	struct gg_mesh_via via; /* the stream the last DATA came on */
	char first_down[160];  /* why a stream first went down */
	/* Called for each DATA received, before it is acknowledged. */
	void (*before_ack)(struct site *s, unsigned peer);
};

struct mesh_set {
	unsigned K;
	int streams;
	const char *handshake_timeout;
	const char *dial[MAX_K][MAX_K]; /* site k's setting for peer p; NULL: default */
	int peer_ports[MAX_K][MAX_K];   /* the port site k dials peer p on; 0: its own */
	int want_dialer;                /* settled(): the site that dialed every stream */
	struct site sites[MAX_K];
	bool long_names;                /* sites "sK-aaa...", of GG_WIRE_NAME_MAX characters */
	char names[GG_AR_MAX_SITES][GG_WIRE_NAME_MAX + 1];
};

static const char *cert_dir;

static uint64_t now_us(void)
{
	return gg_monotonic_us();
}

static int on_data(void *owner, unsigned peer, struct gg_mesh_via via, const struct gg_wire_msg *m,
		   struct gg_buf *payload)
{
	struct site *s = owner;

	(void)payload;
	s->data_in++;
	if (m->u.data.id.chunk < 64)
		s->got |= (uint64_t)1 << m->u.data.id.chunk;
	s->via = via;
	if (s->before_ack)
		s->before_ack(s, peer);
	if (s->no_ack)
		return 0;
	gg_mesh_ack(s->mesh, via, m->u.data.step.job, m->u.data.step.run, m->u.data.step.step, &m->u.data.id);
	return 0;
}

static int on_control(void *owner, unsigned peer, const struct gg_wire_msg *m)
{
	struct site *s = owner;

	(void)peer;
	(void)m;
	s->controls_in++;
	return 0;
}

static int on_foreign_ack(void *owner, unsigned peer, const struct gg_wire_msg *m)
{
	(void)owner;
	(void)peer;
	(void)m;
	return 0;
}

static void on_peer_restarted(void *owner, unsigned peer, uint64_t instance_id)
{
	(void)owner;
	(void)peer;
	(void)instance_id;
}

static void on_stream_change(void *owner, unsigned peer, unsigned stream, bool ready, const char *why)
{
	struct site *s = owner;

	(void)peer;
	(void)stream;
	s->ups += ready;
	s->downs += !ready;
	if (!ready && why && !s->first_down[0])
		snprintf(s->first_down, sizeof(s->first_down), "%s", why);
}

static void hand_off(void *owner, unsigned lane, struct gg_mesh_handoff *h)
{
	(void)owner;
	(void)lane;
	close(h->fd);
	gg_tls_engine_free(h->tls);
	free(h);
}

static const struct gg_mesh_ops ops = { .on_data = on_data,
					.on_control = on_control,
					.on_foreign_ack = on_foreign_ack,
					.on_peer_restarted = on_peer_restarted,
					.on_stream_change = on_stream_change,
					.hand_off = hand_off };

static int site_config(struct mesh_set *ms, unsigned k, const int *ports)
{
	char text[8192], source[32];
	size_t n = 0;
	struct gg_diag diag = { 0 };
	int peer_ports[MAX_K];

	for (unsigned p = 0; p < ms->K; p++)
		peer_ports[p] = ms->peer_ports[k][p] ? ms->peer_ports[k][p] : ports[p];
	n += gg_test_site_toml_dial(text, sizeof(text), k, ms->K, ports, 1, cert_dir, ms->dial[k], peer_ports);
	n += (size_t)snprintf(text + n, sizeof(text) - n,
			      "[transport]\nstreams_per_peer = %d\nsocket_buffer = \"64KiB\"\n"
			      "handshake_timeout = \"%s\"\nreconnect_min = \"20ms\"\nreconnect_max = \"100ms\"\n"
			      "[limits]\nmemory = \"64MiB\"\ninflight_per_peer = \"4MiB\"\n",
			      ms->streams, ms->handshake_timeout);
	/* Long names: each quoted "sP" (a site's name, not its certificate's
	 * or identity's) becomes the name in ms->names. */
	for (unsigned p = 0; ms->long_names && p < ms->K; p++) {
		char from[16], to[GG_WIRE_NAME_MAX + 3], *at;
		snprintf(from, sizeof(from), "\"s%u\"", p);
		snprintf(to, sizeof(to), "\"%s\"", ms->names[p]);
		while ((at = strstr(text, from)) && n + strlen(to) - strlen(from) < sizeof(text)) {
			memmove(at + strlen(to), at + strlen(from), n - (size_t)(at - text) - strlen(from) + 1);
			memcpy(at, to, strlen(to));
			n += strlen(to) - strlen(from);
		}
	}
	snprintf(source, sizeof(source), "s%u.toml", k);
	int rc = gg_config_load_text(text, n, source, NULL, &ms->sites[k].cfg, &diag);
	if (rc)
		gg_diag_print(&diag, stdout);
	gg_diag_free(&diag);
	return rc;
}

static int site_start(struct mesh_set *ms, unsigned k)
{
	struct site *s = &ms->sites[k];
	char err[GG_MESH_ERROR_MAX];
	int rc;

	struct gg_tls_options to = { .ca_file = s->cfg.tls.ca, .cert_file = s->cfg.tls.cert, .key_file = s->cfg.tls.key,
				     .ciphersuites = s->cfg.tls.ciphersuites, .groups = s->cfg.tls.groups };
	if (!s->tls && (rc = gg_tls_context_new(&to, &s->tls, err, sizeof(err)))) {
		printf("site %u: %s\n", k, err);
		return rc;
	}
	if (!s->loop_ok) {
		if ((rc = gg_loop_init(&s->loop, 256)))
			return rc;
		s->loop_ok = true;
	}
	s->hello.instance_id = ((uint64_t)rand() << 32 | (uint64_t)rand()) | 1;
	struct gg_mesh_config mc = { .cfg = &s->cfg, .sites = ms->K, .self = k, .names = ms->names,
				     .hello = &s->hello, .tls = s->tls, .loop = &s->loop,
				     .max_payload_bytes = 1 << 20, .ops = &ops, .owner = s, .listen = true };
	if ((rc = gg_mesh_new(&mc, &s->mesh, err, sizeof(err))))
		printf("site %u: %s\n", k, err);
	return rc;
}

/* Sets up K sites; `dial`, when given, is the pairs' dial settings as
 * dial[k][p], and `closed_port`, when set, the port site k dials p on
 * where closed[k][p] (a port nothing listens on). */
static int mesh_set_init_dial(struct mesh_set *ms, unsigned K, int streams, const char *handshake_timeout,
			      const char *(*dial)[MAX_K], const bool (*closed)[MAX_K], bool long_names)
{
	int ports[MAX_K + 1];
	int rc;

	memset(ms, 0, sizeof(*ms));
	ms->long_names = long_names;
	ms->K = K;
	ms->streams = streams;
	ms->handshake_timeout = handshake_timeout;
	/* One more port than sites: free now, and nothing will listen on it. */
	if ((rc = gg_net_free_loopback_ports(ports, K + 1)))
		return rc;
	for (unsigned k = 0; k < K; k++)
		for (unsigned p = 0; p < K; p++) {
			ms->dial[k][p] = dial ? dial[k][p] : NULL;
			ms->peer_ports[k][p] = closed && closed[k][p] ? ports[K] : 0;
		}
	for (unsigned k = 0; k < K; k++) {
		int len = snprintf(ms->names[k], sizeof(ms->names[k]), long_names ? "s%u-" : "s%u", k);
		while (long_names && len < GG_WIRE_NAME_MAX)
			ms->names[k][len++] = 'a';
	}
	for (unsigned k = 0; k < K; k++) {
		struct site *s = &ms->sites[k];
		s->index = k;
		s->hello = (struct gg_wire_hello){ .streams = (uint16_t)streams, .sites = (uint8_t)K, .codec = 1,
						   .block_elems = 256, .chunk_elems = 1024, .inflight_bytes = 64u << 20 };
		memcpy(s->hello.site_names, ms->names, sizeof(ms->names));
		if ((rc = site_config(ms, k, ports)))
			return rc;
	}
	return 0;
}

static int mesh_set_init(struct mesh_set *ms, unsigned K, int streams, const char *handshake_timeout)
{
	return mesh_set_init_dial(ms, K, streams, handshake_timeout, NULL, NULL, false);
}

static void on_cqe(void *arg, const struct io_uring_cqe *cqe)
{
	struct site *s = arg;

	if (s->mesh)
		gg_mesh_on_cqe(s->mesh, cqe);
}

/* One turn of every site's loop, without blocking on any. */
static void turn(struct mesh_set *ms)
{
	int handled = 0;

	for (unsigned k = 0; k < ms->K; k++) {
		struct site *s = &ms->sites[k];
		if (!s->mesh)
			continue;
		int rc = gg_loop_run(&s->loop, 0, on_cqe, s);
		CHECK(rc >= 0, "site %u: loop: %s", k, strerror(-rc));
		handled += rc > 0 ? rc : 0;
		gg_mesh_tick(s->mesh);
	}
	if (!handled)
		usleep(500);
}

static bool all_connected(const struct mesh_set *ms)
{
	for (unsigned k = 0; k < ms->K; k++)
		if (ms->sites[k].mesh && !gg_mesh_connected(ms->sites[k].mesh))
			return false;
	return true;
}

/* Turns the loops until cond(ms) holds or `seconds` passed; whether it holds. */
static bool turn_until(struct mesh_set *ms, bool (*cond)(const struct mesh_set *), double seconds)
{
	uint64_t until = now_us() + (uint64_t)(seconds * 1e6);

	while (!cond(ms) && now_us() < until)
		turn(ms);
	return cond(ms);
}

static bool all_idle(const struct mesh_set *ms)
{
	for (unsigned k = 0; k < ms->K; k++)
		if (ms->sites[k].mesh && !gg_mesh_idle(ms->sites[k].mesh))
			return false;
	return true;
}

/* Shuts every mesh down, waits until each is idle, and frees everything. */
static void mesh_set_fini(struct mesh_set *ms)
{
	for (unsigned k = 0; k < ms->K; k++)
		if (ms->sites[k].mesh)
			gg_mesh_shutdown(ms->sites[k].mesh);
	/* 3 s, and a second more per 500 streams: closing the 7168 stream
	 * ends of the largest set takes longer than that under a sanitizer. */
	const double limit = 3 + (double)(ms->K * (ms->K - 1) * (unsigned)ms->streams) / 500;
	CHECK(turn_until(ms, all_idle, limit), "a mesh still has streams %.0f s after its shutdown", limit);
	for (unsigned k = 0; k < ms->K; k++) {
		struct site *s = &ms->sites[k];
		gg_mesh_free(s->mesh);
		s->mesh = NULL;
		if (s->loop_ok)
			gg_loop_fini(&s->loop);
		gg_tls_context_free(s->tls);
		gg_config_free(&s->cfg);
	}
}

/* ---- cases ---------------------------------------------------------------- */

/* s0 dials while no file descriptor is left, so no socket can be made:
 * each failed dial must give its slot back. Once descriptors are back the
 * mesh connects, and it shuts down to idle. */
static void dial_setup_fails(void)
{
	struct mesh_set ms;
	struct rlimit old, low;

	CHECK(mesh_set_init(&ms, 2, 2, "2s") == 0, "set-up");
	CHECK(site_start(&ms, 1) == 0 && site_start(&ms, 0) == 0, "start");
	int lowest = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (lowest < 0 || getrlimit(RLIMIT_NOFILE, &old)) {
		CHECK(0, "file limits: %s", strerror(errno));
		mesh_set_fini(&ms);
		return;
	}
	close(lowest);
	low = old;
	low.rlim_cur = (rlim_t)lowest;
	CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0, "lowering the file limit: %s", strerror(errno));
	uint64_t until = now_us() + 300000;
	while (now_us() < until) {
		gg_mesh_tick(ms.sites[0].mesh);
		usleep(5000);
	}
	CHECK(setrlimit(RLIMIT_NOFILE, &old) == 0, "restoring the file limit: %s", strerror(errno));
	CHECK(!gg_mesh_connected(ms.sites[0].mesh), "s0 connected without file descriptors");
	CHECK(turn_until(&ms, all_connected, 5), "the mesh did not connect once descriptors were back");
	mesh_set_fini(&ms);
}

/* A connection to `listen` from a process of its own, which sends bytes
 * that are no ClientHello: exits 0 once the listener's side closed it
 * (accepted, then refused), 1 when nothing came for 10 s. */
static pid_t connect_elsewhere(const char *listen, const int *fds, int nfds)
{
	struct sockaddr_storage ss;
	socklen_t len;
	const char *why;

	if (gg_net_addr_parse(listen, &ss, &len, &why))
		return -1;
	pid_t pid = fork();
	if (pid)
		return pid;
	for (int i = 0; i < nfds; i++)
		close(fds[i]);
	int fd = socket(ss.ss_family, SOCK_STREAM, 0);
	struct timeval tv = { .tv_sec = 10 };
	char buf[4096];
	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) ||
	    connect(fd, (struct sockaddr *)&ss, len) || send(fd, "hello\r\n", 7, MSG_NOSIGNAL) != 7)
		_exit(2);
	ssize_t n;
	while ((n = recv(fd, buf, sizeof(buf), 0)) > 0)
		;
	_exit(n == 0 || errno == ECONNRESET ? 0 : 1);
}

/* s1 listens while no file descriptor is left, so a connection that comes
 * cannot be accepted (EMFILE): s1 says so, once a second, and tries again
 * every 100 ms, where it re-armed the accept at once before, without a
 * word, to fail again as fast as the kernel answered. Once descriptors
 * are back, the connection that waited is taken. */
static void accept_fails(void)
{
	struct mesh_set ms;
	struct rlimit old, low;
	struct capture cap;
	static char text[1 << 16];
	int fill[256], nfill = 0, status = -1;

	if (mesh_set_init(&ms, 2, 1, "2s")) {
		CHECK(0, "set-up");
		return;
	}
	int lowest = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (lowest < 0 || getrlimit(RLIMIT_NOFILE, &old) || !capture_start(&cap)) {
		CHECK(0, "file limits: %s", strerror(errno));
		return;
	}
	close(lowest);
	/* The kernel keeps the limit an accept was armed under: room for
	 * s1's start, then what is left is taken. */
	low = old;
	low.rlim_cur = (rlim_t)lowest + 64;
	CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0, "lowering the file limit: %s", strerror(errno));
	if (site_start(&ms, 1)) {
		CHECK(setrlimit(RLIMIT_NOFILE, &old) == 0, "restoring the file limit: %s", strerror(errno));
		capture_end(&cap, text, sizeof(text));
		CHECK(0, "s1 starts: %.500s", text);
		return;
	}
	for (int fd; nfill < (int)GG_ARRAY_LEN(fill) && (fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;)
		fill[nfill++] = fd;
	pid_t child = connect_elsewhere(ms.sites[1].cfg.site.listen, fill, nfill);
	CHECK(child > 0, "cannot start the connecting process");
	uint64_t start = now_us();
	while (now_us() - start < 1500000)
		turn(&ms);
	uint64_t out_us = now_us() - start;
	while (nfill)
		close(fill[--nfill]);
	CHECK(setrlimit(RLIMIT_NOFILE, &old) == 0, "restoring the file limit: %s", strerror(errno));
	/* Taken once descriptors are back: the child hears the refusal. */
	for (start = now_us(); child > 0 && now_us() - start < 5000000;) {
		turn(&ms);
		if (waitpid(child, &status, WNOHANG) == child)
			child = 0;
	}
	if (child > 0) {
		kill(child, SIGKILL);
		waitpid(child, NULL, 0);
	}
	capture_end(&cap, text, sizeof(text));
	unsigned lines = 0;
	for (const char *p = text; (p = strstr(p, " event=accept_failed ")); p++)
		lines++;
	printf("  %u accept_failed lines in %.1f s out of descriptors\n", lines, (double)out_us / 1e6);
	CHECK(strstr(text, "level=warn event=accept_failed listen=127.0.0.1:") &&
		      strstr(text, "reason=\"Too many open files: peers cannot connect until it works again\""),
	      "no accept_failed warning naming the cause: %.500s", text);
	CHECK(lines >= 1 && lines <= out_us / 1000000 + 1, "%u accept_failed lines in %llu ms", lines,
	      (unsigned long long)out_us / 1000);
	CHECK(child == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "the connection that waited was not taken once descriptors were back (status %d)", status);
	mesh_set_fini(&ms);
}

static bool s0_flushed(const struct mesh_set *ms)
{
	return gg_mesh_flushed(ms->sites[0].mesh);
}

/* Fills the stream back to s0 with more small messages than a stream
 * queues, in the turn that acknowledges DATA from s0. */
static void flood_controls(struct site *s, unsigned peer)
{
	uint8_t msg[128];
	ssize_t len = gg_wire_encode_done(msg, sizeof(msg), "flood", 1, 1, NULL, NULL);

	/* Control messages share the queue's 512 entries, up to 1024 bytes
	 * each: that many DONEs fill it whatever their size. */
	for (int i = 0; len > 0 && i < 512 * 1024 / 20; i++)
		gg_mesh_send_control(s->mesh, peer, msg, (size_t)len, false);
}

/* Queues DATA of job `job`'s chunks first.. first+chunks-1 (4 KiB each,
 * said to carry RAW_BYTES float32 bytes) from site `from` to `to`. */
#define RAW_BYTES 12345
static void send_job_chunks(struct mesh_set *ms, unsigned from, unsigned to, const char *job, unsigned first,
			    unsigned chunks)
{
	struct gg_wire_step step = { .run = 1, .step = 1, .count = 1000, .tensor_id = 1, .dtype = GG_WIRE_F32 };

	snprintf(step.job, sizeof(step.job), "%s", job);
	for (unsigned c = first; c < first + chunks; c++) {
		struct gg_buf *frame = gg_buf_new(NULL, 4096);
		CHECK(frame, "no memory");
		if (!frame)
			break;
		memset(frame->data, (int)c, 4096);
		frame->len = 4096;
		struct gg_ar_chunk_id id = { .phase = GG_AR_DIRECT, .origin = from, .chunk = c };
		CHECK(gg_mesh_send_data(ms->sites[from].mesh, to, &step, &id, frame, RAW_BYTES) == 0, "send");
		gg_buf_put(frame);
	}
	gg_mesh_flush(ms->sites[from].mesh);
}

static void send_chunks(struct mesh_set *ms, unsigned from, unsigned to, unsigned chunks)
{
	send_job_chunks(ms, from, to, "acks", 0, chunks);
}

/* s1 acknowledges s0's DATA while its one stream to s0 holds a full send
 * queue: the ACKs must still arrive, so that s0's window is whole again. */
static void ack_at_full_queue(void)
{
	struct mesh_set ms;
	const unsigned chunks = 8;

	CHECK(mesh_set_init(&ms, 2, 1, "2s") == 0, "set-up");
	CHECK(site_start(&ms, 1) == 0 && site_start(&ms, 0) == 0, "start");
	CHECK(turn_until(&ms, all_connected, 5), "the mesh did not connect");
	ms.sites[1].before_ack = flood_controls;
	send_chunks(&ms, 0, 1, chunks);
	bool acked = turn_until(&ms, s0_flushed, 5);
	CHECK(ms.sites[1].data_in == chunks, "s1 received %u of %u DATA", ms.sites[1].data_in, chunks);
	CHECK(acked, "s0 still waits for ACKs 5 s after s1 received every DATA: its window stays short");
	CHECK(ms.sites[0].controls_in > 0, "s0 received none of s1's messages");
	mesh_set_fini(&ms);
}

/* In the turn that takes s0's first DATA, s1 acknowledges it more often
 * than a stream queues ACKs for a peer that does not read them (6144
 * entries of ten or more): once. */
static void flood_acks(struct site *s, unsigned peer)
{
	const struct gg_ar_chunk_id id = { .phase = GG_AR_DIRECT, .origin = 0, .chunk = 0 };
	char job[GG_WIRE_NAME_MAX + 1];

	(void)peer;
	s->before_ack = NULL;
	memset(job, 'j', sizeof(job) - 1);
	job[sizeof(job) - 1] = '\0';
	for (int i = 0; i < 7000 * 10; i++)
		gg_mesh_ack(s->mesh, s->via, job, 1, 1, &id);
}

/* A stream that cannot queue one more ACK is closed rather than drop it
 * (its sender would hold that DATA for good); the DATA goes again on the
 * stream dialed next and is acknowledged there. */
static void ack_bound_closes(void)
{
	struct mesh_set ms;

	CHECK(mesh_set_init(&ms, 2, 1, "2s") == 0, "set-up");
	CHECK(site_start(&ms, 1) == 0 && site_start(&ms, 0) == 0, "start");
	CHECK(turn_until(&ms, all_connected, 5), "the mesh did not connect");
	ms.sites[1].before_ack = flood_acks;
	send_chunks(&ms, 0, 1, 1);
	bool acked = turn_until(&ms, s0_flushed, 5);
	CHECK(strstr(ms.sites[1].first_down, "cannot queue an ACK: the peer leaves too much unread"),
	      "s1's stream went down first with \"%s\"", ms.sites[1].first_down);
	/* Both sites redial: a duplicate connection may take the stream over
	 * once more. What came up and did not go down is the one stream. */
	CHECK(ms.sites[1].downs >= 1 && ms.sites[1].ups == ms.sites[1].downs + 1,
	      "s1's stream went down %u times and up %u", ms.sites[1].downs, ms.sites[1].ups);
	CHECK(acked && ms.sites[1].data_in >= 2,
	      "s0 acknowledged: %d, after s1 received DATA %u times (want it again after the close)", acked,
	      ms.sites[1].data_in);
	mesh_set_fini(&ms);
}

static void count_cqe(void *arg, const struct io_uring_cqe *cqe)
{
	unsigned *seen = arg;

	if (!*seen)
		printf("  after the free: kind %u index %u res %d\n", gg_loop_ud_kind(cqe->user_data),
		       gg_loop_ud_index(cqe->user_data), cqe->res);
	if (gg_loop_ud_kind(cqe->user_data) == GG_OP_ACCEPT && cqe->res >= 0)
		close(cqe->res);
	(*seen)++;
}

/* s1's mesh is freed while its streams have receives in flight and its
 * listener an accept; then s0 sends on every stream and dials again. No
 * operation of the freed mesh may complete after the free: the kernel
 * would write into buffers that are gone. */
static void teardown_in_flight(void)
{
	struct mesh_set ms;
	uint8_t msg[128];
	unsigned seen = 0;

	CHECK(mesh_set_init(&ms, 2, 2, "2s") == 0, "set-up");
	CHECK(site_start(&ms, 1) == 0 && site_start(&ms, 0) == 0, "start");
	CHECK(turn_until(&ms, all_connected, 5), "the mesh did not connect");
	gg_mesh_free(ms.sites[1].mesh);
	ms.sites[1].mesh = NULL;
	ssize_t len = gg_wire_encode_done(msg, sizeof(msg), "late", 1, 1, NULL, NULL);
	CHECK(len > 0, "encode");
	gg_mesh_send_control(ms.sites[0].mesh, 1, msg, (size_t)len, true);
	uint64_t until = now_us() + 300000;
	while (now_us() < until)
		turn(&ms);
	for (int i = 0; i < 10; i++) {
		int rc = gg_loop_run(&ms.sites[1].loop, 10000, count_cqe, &seen);
		CHECK(rc >= 0, "loop: %s", strerror(-rc));
	}
	CHECK(seen == 0, "%u operations of s1's freed mesh completed after it was freed", seen);
	mesh_set_fini(&ms);
}

/* The most a configuration allows: eight sites, 64 streams to each peer,
 * one lane, and both sites of every pair dialing (the default). Every
 * site holds 448 streams, and all of them come up. All 3584 handshakes,
 * every stream dialed from both ends, start at once on this one thread
 * (slow under a sanitizer, a minute under ThreadSanitizer): the handshake
 * timeout leaves them time. */
static void at_the_limits(void)
{
	struct mesh_set ms;
	uint64_t t0 = now_us();

	CHECK(mesh_set_init(&ms, GG_MAX_PEERS + 1, GG_MESH_MAX_STREAMS, "150s") == 0, "set-up");
	/* One thread turns all 8 meshes and their 7168 stream ends: under a
	 * sanitizer, heartbeats every second would time streams out faster
	 * than they come up. The test is about connecting, not liveness. */
	for (unsigned k = 0; k < ms.K; k++) {
		ms.sites[k].cfg.transport.heartbeat_interval_us = 10000000;
		ms.sites[k].cfg.transport.heartbeat_timeout_us = 150000000;
	}
	for (unsigned k = 0; k < ms.K; k++)
		CHECK(site_start(&ms, k) == 0, "start s%u", k);
	if (turn_until(&ms, all_connected, 150))
		printf("  %u sites x %d streams up in %.1f s\n", ms.K, ms.streams, (double)(now_us() - t0) / 1e6);
	else
		CHECK(0, "the mesh did not connect within 150 s");
	mesh_set_fini(&ms);
}

/* Eight sites whose names have 63 characters: their HELLO, the longest
 * control message, once did not fit a send-queue entry, and no stream
 * ever came up, with nothing logged. */
static void long_names(void)
{
	struct mesh_set ms;
	uint8_t buf[GG_WIRE_CONTROL_MAX];

	CHECK(mesh_set_init_dial(&ms, GG_MAX_PEERS + 1, 1, "10s", NULL, NULL, true) == 0, "set-up");
	ssize_t len = gg_wire_encode_hello(buf, sizeof(buf), &ms.sites[0].hello);
	CHECK(len > 382, "a HELLO of %zd bytes: the names are not long", len); /* 382: the entry's head once */
	for (unsigned k = 0; k < ms.K; k++)
		CHECK(site_start(&ms, k) == 0, "start %s", ms.names[k]);
	bool up = turn_until(&ms, all_connected, 20);
	CHECK(up, "%u sites whose HELLO takes %zd bytes did not connect within 20 s", ms.K, len);
	if (up)
		printf("  %u sites named like %s (a HELLO of %zd bytes) connected\n", ms.K, ms.names[0], len);
	mesh_set_fini(&ms);
}

/* Turns the loops for `seconds`. */
static void turn_for(struct mesh_set *ms, double seconds)
{
	uint64_t until = now_us() + (uint64_t)(seconds * 1e6);

	while (now_us() < until)
		turn(ms);
}

static bool all_flushed(const struct mesh_set *ms)
{
	for (unsigned k = 0; k < ms->K; k++)
		if (ms->sites[k].mesh && !gg_mesh_flushed(ms->sites[k].mesh))
			return false;
	return true;
}

/* Two sites, every stream up on a connection ms->want_dialer dialed (as
 * both see it), and every DATA acknowledged. */
static bool settled(const struct mesh_set *ms)
{
	if (!all_connected(ms) || !all_flushed(ms))
		return false;
	for (int s = 0; s < ms->streams; s++)
		if (gg_mesh_test_dialed_by(ms->sites[0].mesh, 1, s) != ms->want_dialer ||
		    gg_mesh_test_dialed_by(ms->sites[1].mesh, 0, s) != ms->want_dialer)
			return false;
	return true;
}

/* Sends `chunks` chunks each way between s0 and s1 and turns the loops
 * until the pair settled on the streams ms->want_dialer dialed (5 s at
 * most): every chunk must arrive, with at most two stream_up per stream
 * at each site since `ups`; then nothing may change for half a second,
 * several times reconnect_max. seen[k]: the stream_up of site k since ups[k]. */
static void exchange_settles(struct mesh_set *ms, const char *what, unsigned chunks, const unsigned ups[2],
			     unsigned seen[2])
{
	const uint64_t all = chunks < 64 ? ((uint64_t)1 << chunks) - 1 : UINT64_MAX;

	ms->sites[0].got = ms->sites[1].got = 0;
	send_chunks(ms, 0, 1, chunks);
	send_chunks(ms, 1, 0, chunks);
	CHECK(turn_until(ms, settled, 5), "%s: not settled on streams s%d dialed within 5 s (connected %d)", what,
	      ms->want_dialer, all_connected(ms));
	CHECK(ms->sites[0].got == all && ms->sites[1].got == all, "%s: chunks received: s0 %#llx, s1 %#llx", what,
	      (unsigned long long)ms->sites[0].got, (unsigned long long)ms->sites[1].got);
	for (int k = 0; k < 2; k++) {
		seen[k] = ms->sites[k].ups - ups[k];
		CHECK(seen[k] <= 2u * (unsigned)ms->streams, "%s: s%d brought up %u streams for %d", what, k, seen[k],
		      ms->streams);
	}
	turn_for(ms, 0.5);
	CHECK(settled(ms) && ms->sites[0].ups - ups[0] == seen[0] && ms->sites[1].ups - ups[1] == seen[1],
	      "%s: streams changed after they settled (stream_up %u -> %u, %u -> %u)", what, seen[0],
	      ms->sites[0].ups - ups[0], seen[1], ms->sites[1].ups - ups[1]);
}

/* Two sites with these dial settings (closed[k][p]: site k dials p on a
 * port nothing listens on) exchange 8 chunks each way, and settle on the
 * connections `dialer` dialed. */
static void pair_settles(const char *what, const char *(*dial)[MAX_K], const bool (*closed)[MAX_K], int dialer)
{
	struct mesh_set ms;

	const unsigned none[2] = { 0, 0 };
	unsigned ups[2];

	CHECK(mesh_set_init_dial(&ms, 2, 2, "2s", dial, closed, false) == 0, "%s: set-up", what);
	CHECK(site_start(&ms, 0) == 0 && site_start(&ms, 1) == 0, "%s: start", what);
	ms.want_dialer = dialer;
	exchange_settles(&ms, what, 8, none, ups);
	printf("  %s: streams dialed by s%d; stream_up s0 %u, s1 %u\n", what, dialer, ups[0], ups[1]);
	mesh_set_fini(&ms);
}

/* Every pair of settings that lets one site dial the other works, on the
 * connections of the site expected. */
static void dial_pairs(void)
{
	static const struct {
		const char *d0, *d1; /* s0's setting for s1, s1's for s0 */
		int dialer;
	} pairs[] = {
		{ "out", "in", 0 },   { "in", "out", 1 },  { "both", "both", 0 }, { "both", "in", 0 },
		{ "both", "out", 1 }, { "out", "both", 0 }, { "in", "both", 1 },
	};

	for (size_t i = 0; i < GG_ARRAY_LEN(pairs); i++) {
		const char *dial[MAX_K][MAX_K] = { [0][1] = pairs[i].d0, [1][0] = pairs[i].d1 };
		char what[32];
		snprintf(what, sizeof(what), "%s/%s", pairs[i].d0, pairs[i].d1);
		pair_settles(what, dial, NULL, pairs[i].dialer);
	}
}

/* A one-way network: one site cannot reach the other (its address there
 * is a closed port); the mesh comes up on the other's dials, and the
 * failing ones change nothing once it is up. */
static void one_way(void)
{
	const char *out_in[MAX_K][MAX_K] = { [0][1] = "in", [1][0] = "out" };
	const char *in_out[MAX_K][MAX_K] = { [0][1] = "out", [1][0] = "in" };
	const char *both_out[MAX_K][MAX_K] = { [0][1] = "both", [1][0] = "out" };
	const char *both_both[MAX_K][MAX_K] = { [0][1] = "both", [1][0] = "both" };
	const bool s0_blind[MAX_K][MAX_K] = { [0][1] = true }, s1_blind[MAX_K][MAX_K] = { [1][0] = true };

	pair_settles("in/out, s1 unreachable", out_in, s0_blind, 1);
	pair_settles("out/in, s0 unreachable", in_out, s1_blind, 0);
	pair_settles("both/out, s1 unreachable", both_out, s0_blind, 1);
	pair_settles("both/both, s1 unreachable", both_both, s0_blind, 1);
}

/* Settings that leave nobody to dial, or nobody to accept: no stream ever
 * comes up (the logs say why; the integration test reads them). */
static void dial_conflicts(void)
{
	static const char *const settings[] = { "in", "out" };

	for (size_t i = 0; i < GG_ARRAY_LEN(settings); i++) {
		const char *dial[MAX_K][MAX_K] = { [0][1] = settings[i], [1][0] = settings[i] };
		struct mesh_set ms;
		CHECK(mesh_set_init_dial(&ms, 2, 2, "2s", dial, NULL, false) == 0, "set-up");
		CHECK(site_start(&ms, 0) == 0 && site_start(&ms, 1) == 0, "start");
		send_chunks(&ms, 0, 1, 4);
		turn_for(&ms, 1);
		CHECK(!gg_mesh_peer_up(ms.sites[0].mesh, 1) && !gg_mesh_peer_up(ms.sites[1].mesh, 0) &&
			      ms.sites[0].ups + ms.sites[1].ups == 0,
		      "%s/%s: a stream came up", settings[i], settings[i]);
		/* What waits for a stream was not sent. */
		const struct gg_mesh_peer_stats *ps = &gg_mesh_stats(ms.sites[0].mesh)->peers[1];
		CHECK(ps->data_bytes_out == 0 && ps->raw_bytes_out == 0,
		      "%s/%s: %llu frame bytes (%llu raw) counted as sent with no stream up", settings[i], settings[i],
		      (unsigned long long)ps->data_bytes_out, (unsigned long long)ps->raw_bytes_out);
		printf("  %s/%s: no stream in 1 s\n", settings[i], settings[i]);
		mesh_set_fini(&ms);
	}
}

/* Both sites dial every stream at once: s1 first (its connections wait
 * in s0's accept queue until s0's loop turns), then s0 as its loop
 * starts. Each stream gets two connections; both sites keep the one s0
 * dialed, DATA sent on the other comes again on it, and once settled no
 * stream comes or goes. */
static void duplicates(void)
{
	struct mesh_set ms;
	const int S = 4;

	const unsigned none[2] = { 0, 0 };
	unsigned ups[2];

	CHECK(mesh_set_init(&ms, 2, S, "2s") == 0, "set-up");
	CHECK(site_start(&ms, 0) == 0 && site_start(&ms, 1) == 0, "start");
	for (int i = 0; i < 20; i++) {
		gg_mesh_tick(ms.sites[1].mesh);
		int rc = gg_loop_run(&ms.sites[1].loop, 1000, on_cqe, &ms.sites[1]);
		CHECK(rc >= 0, "loop: %s", strerror(-rc));
	}
	ms.want_dialer = 0;
	exchange_settles(&ms, "both dial at once", 16, none, ups);
	const struct gg_mesh_stats *st0 = gg_mesh_stats(ms.sites[0].mesh), *st1 = gg_mesh_stats(ms.sites[1].mesh);
	CHECK(st0->duplicate_streams + st1->duplicate_streams >= (uint64_t)S,
	      "%llu duplicate connections closed; each of %d streams had one",
	      (unsigned long long)(st0->duplicate_streams + st1->duplicate_streams), S);
	/* The one kept takes over with no gap the owner would see. */
	CHECK(ms.sites[0].downs + ms.sites[1].downs == 0, "streams went down: s0 %u, s1 %u", ms.sites[0].downs,
	      ms.sites[1].downs);
	printf("  duplicates closed: s0 %llu, s1 %llu; stream_up s0 %u, s1 %u; down s0 %u, s1 %u; re-sent s0 %llu, "
	       "s1 %llu\n", (unsigned long long)st0->duplicate_streams, (unsigned long long)st1->duplicate_streams, ups[0],
	       ups[1], ms.sites[0].downs, ms.sites[1].downs,
	       (unsigned long long)st0->resent_messages, (unsigned long long)st1->resent_messages);
	mesh_set_fini(&ms);
}

/* Cuts every stream, then restarts s1: both sites redial each time, and
 * settle on s0's connections again with at most two stream_up per stream
 * at each site, and DATA sent meanwhile arrives. */
static void redial_converges(void)
{
	struct mesh_set ms;
	const int S = 4;

	CHECK(mesh_set_init(&ms, 2, S, "2s") == 0, "set-up");
	CHECK(site_start(&ms, 0) == 0 && site_start(&ms, 1) == 0, "start");
	ms.want_dialer = 0;
	CHECK(turn_until(&ms, settled, 5), "not settled within 5 s");
	for (int round = 0; round < 2; round++) {
		unsigned ups[2] = { ms.sites[0].ups, ms.sites[1].ups };
		if (round == 0) {
			for (int s = 0; s < S; s++)
				CHECK(gg_mesh_test_cut_stream(ms.sites[0].mesh, 1, s) == 0, "cut stream %d", s);
		} else {
			/* DATA queued to s1 before s0 learns of the restart is let
			 * go with the steps it was for: send once it knows. */
			gg_mesh_free(ms.sites[1].mesh);
			ms.sites[1].mesh = NULL;
			ups[1] = ms.sites[1].ups = 0;
			CHECK(site_start(&ms, 1) == 0, "restart s1");
			CHECK(turn_until(&ms, settled, 5), "after s1 restarted: not settled within 5 s");
		}
		const char *what = round ? "after s1 restarted" : "after every stream was cut";
		unsigned seen[2];
		exchange_settles(&ms, what, 16, ups, seen);
		printf("  %s: stream_up s0 %u, s1 %u\n", what, seen[0], seen[1]);
	}
	mesh_set_fini(&ms);
}

static bool s1_got_all(const struct mesh_set *ms)
{
	return ms->sites[1].got == 0xff;
}

static bool s1_got_kept(const struct mesh_set *ms)
{
	return ms->sites[1].got == 0xf0 && !gg_mesh_holds_job(ms->sites[0].mesh, "kept");
}

/* s0 sends chunks 0-3 of job "gone" and 4-7 of job "kept"; s1 takes them
 * all but acknowledges none. "gone" ends at s0, then every stream is
 * cut: what s0 sends again on the new streams is "kept" alone, and once
 * s1 acknowledges it s0 holds neither job's DATA. */
static void forgotten_not_resent(void)
{
	struct mesh_set ms;
	const int S = 2;

	CHECK(mesh_set_init(&ms, 2, S, "2s") == 0, "set-up");
	CHECK(site_start(&ms, 0) == 0 && site_start(&ms, 1) == 0, "start");
	CHECK(turn_until(&ms, all_connected, 5), "not connected within 5 s");
	ms.sites[1].no_ack = true;
	send_job_chunks(&ms, 0, 1, "gone", 0, 4);
	send_job_chunks(&ms, 0, 1, "kept", 4, 4);
	CHECK(turn_until(&ms, s1_got_all, 5), "s1 got chunks %#llx, not all 8", (unsigned long long)ms.sites[1].got);
	gg_mesh_forget(ms.sites[0].mesh, "gone", 0, UINT64_MAX);
	CHECK(gg_mesh_holds_job(ms.sites[0].mesh, "gone"), "s0 let unacknowledged DATA go before its stream did");
	const uint64_t resent = gg_mesh_stats(ms.sites[0].mesh)->resent_messages;
	ms.sites[1].got = 0;
	ms.sites[1].no_ack = false;
	for (int s = 0; s < S; s++)
		CHECK(gg_mesh_test_cut_stream(ms.sites[0].mesh, 1, s) == 0, "cut stream %d", s);
	CHECK(turn_until(&ms, s1_got_kept, 5), "after the cut s1 got chunks %#llx (want 0xf0), s0 %s \"kept\"",
	      (unsigned long long)ms.sites[1].got, gg_mesh_holds_job(ms.sites[0].mesh, "kept") ? "holds" : "let go");
	turn_for(&ms, 0.3);
	const uint64_t again = gg_mesh_stats(ms.sites[0].mesh)->resent_messages - resent;
	/* Each frame counts as sent once, whatever went again. */
	const struct gg_mesh_peer_stats *ps = &gg_mesh_stats(ms.sites[0].mesh)->peers[1];
	CHECK(ps->data_bytes_out == 8 * 4096 && ps->raw_bytes_out == 8 * RAW_BYTES,
	      "s0 counted %llu frame bytes (%llu raw) as sent, want %u (%u)", (unsigned long long)ps->data_bytes_out,
	      (unsigned long long)ps->raw_bytes_out, 8 * 4096, 8 * RAW_BYTES);
	/* Each cut sends "kept" again on the stream left: 4 or 8 in all. */
	CHECK(ms.sites[1].got == 0xf0 && again >= 4 && again <= 8,
	      "s1 got chunks %#llx again, s0 re-sent %llu (want 0xf0, 4-8)", (unsigned long long)ms.sites[1].got,
	      (unsigned long long)again);
	CHECK(!gg_mesh_holds_job(ms.sites[0].mesh, "gone"), "s0 still holds DATA of the ended job");
	printf("  after the cut: re-sent %llu, chunks %#llx\n", (unsigned long long)again,
	       (unsigned long long)ms.sites[1].got);
	mesh_set_fini(&ms);
}

static const struct {
	const char *name;
	void (*run)(void);
} cases[] = {
	{ "dial-setup-fails", dial_setup_fails },
	{ "accept-fails", accept_fails },
	{ "ack-at-full-queue", ack_at_full_queue },
	{ "ack-bound-closes", ack_bound_closes },
	{ "teardown-in-flight", teardown_in_flight },
	{ "at-the-limits", at_the_limits },
	{ "long-names", long_names },
	{ "dial-pairs", dial_pairs },
	{ "one-way", one_way },
	{ "dial-conflicts", dial_conflicts },
	{ "duplicates", duplicates },
	{ "redial-converges", redial_converges },
	{ "forgotten-not-resent", forgotten_not_resent },
};

int main(int argc, char **argv)
{
	bool except = argc == 4 && !strcmp(argv[2], "--except");
	const char *only = except ? argv[3] : argc == 3 ? argv[2] : NULL;
	bool known = !only;

	if (argc < 2 || argc > 4 || (argc == 4 && !except)) {
		fprintf(stderr, "usage: %s CERT_DIR [CASE | --except CASE]\n", argv[0]);
		return 2;
	}
	for (size_t i = 0; i < GG_ARRAY_LEN(cases) && !known; i++)
		known = !strcmp(only, cases[i].name);
	if (!known) {
		fprintf(stderr, "%s: no case '%s'\n", argv[0], only);
		return 2;
	}
	cert_dir = argv[1];
	srand((unsigned)time(NULL));
	setvbuf(stdout, NULL, _IOLBF, 0);
	gg_log_set_level(getenv("MESH_VERBOSE") ? GG_LOG_DEBUG : GG_LOG_ERROR);
	for (size_t i = 0; i < GG_ARRAY_LEN(cases); i++) {
		if (only && !strcmp(only, cases[i].name) == except)
			continue;
		int before = failures;
		cases[i].run();
		printf("%s: %s\n", cases[i].name, failures == before ? "ok" : "FAILED");
	}
	printf("mesh streams: %d failure(s)\n", failures);
	return failures ? 1 : 0;
}
