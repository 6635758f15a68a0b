/* The peer mesh alone: meshes of K sites (s0, s1, ...) driven by this one
 * thread, each on its own io_uring loop, over loopback TLS. Each case is a
 * way the mesh's streams can go wrong:
 *
 *   dial-setup-fails  dials fail to start (no file descriptors left): the
 *                     mesh still connects once they come back, and
 *                     shuts down to idle
 *   ack-at-full-queue ACKs owed while the stream they go on has a full
 *                     send queue still reach the sender
 *   teardown-in-flight a mesh freed with I/O in flight leaves nothing in
 *                     flight behind it
 *   at-the-limits      eight sites with 64 streams to each peer connect
 *
 *   test_mesh_streams CERT_DIR [CASE]  (certificates from
 *   examples/make-certs.sh for sites s0..s7) */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "gg_check.h"
#include "gg_sites.h"
#include "log.h"
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
	/* Called for each DATA received, before it is acknowledged. */
	void (*before_ack)(struct site *s, unsigned peer);
};

struct mesh_set {
	unsigned K;
	int streams;
	const char *handshake_timeout;
	struct site sites[MAX_K];
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
	if (s->before_ack)
		s->before_ack(s, peer);
	gg_mesh_ack(s->mesh, via, m->u.data.step.job, m->u.data.step.step, &m->u.data.id);
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
	(void)owner;
	(void)peer;
	(void)stream;
	(void)ready;
	(void)why;
}

static void hand_off(void *owner, unsigned lane, struct gg_mesh_handoff *h)
{
	(void)owner;
	(void)lane;
	close(h->fd);
	gg_tls_engine_free(h->tls);
	free(h);
}

static const struct gg_mesh_ops ops = { on_data, on_control, on_foreign_ack, on_peer_restarted, on_stream_change,
					hand_off };

static int site_config(struct mesh_set *ms, unsigned k, const int *ports)
{
	char text[8192], source[32];
	size_t n = 0;
	struct gg_diag diag = { 0 };

	n += gg_test_site_toml(text, sizeof(text), k, ms->K, ports, 1, cert_dir);
	n += (size_t)snprintf(text + n, sizeof(text) - n,
			      "[transport]\nstreams_per_peer = %d\nsocket_buffer = \"64KiB\"\n"
			      "handshake_timeout = \"%s\"\nreconnect_min = \"20ms\"\nreconnect_max = \"100ms\"\n"
			      "[limits]\nmemory = \"64MiB\"\ninflight_per_peer = \"4MiB\"\n",
			      ms->streams, ms->handshake_timeout);
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

static int mesh_set_init(struct mesh_set *ms, unsigned K, int streams, const char *handshake_timeout)
{
	int ports[MAX_K];
	int rc;

	memset(ms, 0, sizeof(*ms));
	ms->K = K;
	ms->streams = streams;
	ms->handshake_timeout = handshake_timeout;
	if ((rc = gg_net_free_loopback_ports(ports, K)))
		return rc;
	for (unsigned k = 0; k < K; k++)
		snprintf(ms->names[k], sizeof(ms->names[k]), "s%u", k);
	for (unsigned k = 0; k < K; k++) {
		struct site *s = &ms->sites[k];
		s->index = k;
		s->hello = (struct gg_wire_hello){ .streams = (uint16_t)streams, .sites = (uint8_t)K, .codec = 1,
						   .block_elems = 256, .chunk_elems = 1024 };
		memcpy(s->hello.site_names, ms->names, sizeof(ms->names));
		if ((rc = site_config(ms, k, ports)))
			return rc;
	}
	return 0;
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
	CHECK(turn_until(ms, all_idle, 3), "a mesh still has streams 3 s after its shutdown");
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

static bool s0_flushed(const struct mesh_set *ms)
{
	return gg_mesh_flushed(ms->sites[0].mesh);
}

/* Fills the stream back to s0 with more small messages than a stream
 * queues, in the turn that acknowledges DATA from s0. */
static void flood_controls(struct site *s, unsigned peer)
{
	uint8_t msg[128];
	ssize_t len = gg_wire_encode_done(msg, sizeof(msg), "flood", 1);

	for (int i = 0; len > 0 && i < 600; i++)
		gg_mesh_send_control(s->mesh, peer, msg, (size_t)len, false);
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
	struct gg_wire_step step = { .job = "acks", .step = 1, .count = 1000, .tensor_id = 1, .dtype = GG_WIRE_F32 };
	for (unsigned c = 0; c < chunks; c++) {
		struct gg_buf *frame = gg_buf_new(NULL, 4096);
		CHECK(frame, "no memory");
		if (!frame)
			break;
		memset(frame->data, (int)c, 4096);
		frame->len = 4096;
		struct gg_ar_chunk_id id = { .phase = GG_AR_DIRECT, .origin = 0, .chunk = c };
		CHECK(gg_mesh_send_data(ms.sites[0].mesh, 1, &step, &id, frame) == 0, "send");
		gg_buf_put(frame);
	}
	gg_mesh_flush(ms.sites[0].mesh);
	bool acked = turn_until(&ms, s0_flushed, 5);
	CHECK(ms.sites[1].data_in == chunks, "s1 received %u of %u DATA", ms.sites[1].data_in, chunks);
	CHECK(acked, "s0 still waits for ACKs 5 s after s1 received every DATA: its window stays short");
	CHECK(ms.sites[0].controls_in > 0, "s0 received none of s1's messages");
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
	ssize_t len = gg_wire_encode_done(msg, sizeof(msg), "late", 1);
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
 * one lane. Every site holds 448 streams, and all of them come up. All
 * 1792 handshakes start at once on this one thread (slow under a
 * sanitizer): the handshake timeout leaves them time. */
static void at_the_limits(void)
{
	struct mesh_set ms;
	uint64_t t0 = now_us();

	CHECK(mesh_set_init(&ms, GG_MAX_PEERS + 1, GG_MESH_MAX_STREAMS, "60s") == 0, "set-up");
	for (unsigned k = 0; k < ms.K; k++)
		CHECK(site_start(&ms, k) == 0, "start s%u", k);
	if (turn_until(&ms, all_connected, 60))
		printf("  %u sites x %d streams up in %.1f s\n", ms.K, ms.streams, (double)(now_us() - t0) / 1e6);
	else
		CHECK(0, "the mesh did not connect within 60 s");
	mesh_set_fini(&ms);
}

static const struct {
	const char *name;
	void (*run)(void);
} cases[] = {
	{ "dial-setup-fails", dial_setup_fails },
	{ "ack-at-full-queue", ack_at_full_queue },
	{ "teardown-in-flight", teardown_in_flight },
	{ "at-the-limits", at_the_limits },
};

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s CERT_DIR [CASE]\n", argv[0]);
		return 2;
	}
	cert_dir = argv[1];
	srand((unsigned)time(NULL));
	setvbuf(stdout, NULL, _IOLBF, 0);
	gg_log_set_level(getenv("MESH_VERBOSE") ? GG_LOG_DEBUG : GG_LOG_ERROR);
	for (size_t i = 0; i < GG_ARRAY_LEN(cases); i++) {
		if (argc > 2 && strcmp(argv[2], cases[i].name))
			continue;
		int before = failures;
		cases[i].run();
		printf("%s: %s\n", cases[i].name, failures == before ? "ok" : "FAILED");
	}
	printf("mesh streams: %d failure(s)\n", failures);
	return failures ? 1 : 0;
}
