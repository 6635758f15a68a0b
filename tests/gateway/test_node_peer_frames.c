/* DATA from a peer that keeps to the wire format but not to the protocol.
 * The peer is played by the test through streams with no socket behind
 * them (gg_node_test_open_stream); the site under test runs here.
 *
 *   early-flood   s0 sends 2000 DATA messages with empty frames for steps
 *                 of a job that has not started at s1. Each costs s1 the
 *                 bookkeeping of a kept frame whatever its size: s1 holds
 *                 no more than its budget (inflight_per_peer 64 KiB, half
 *                 as much again, one frame per stream) and refuses the
 *                 rest, unacknowledged. Counted by frame bytes alone, the
 *                 budget never filled, and each message held a buffer of
 *                 a whole chunk.
 *   blame         three sites, direct; s2 runs here. s1's frame of chunk 0
 *                 comes first, with a byte of its payload flipped: it is
 *                 kept until s0's frame (which goes first in site order)
 *                 comes, and only then decoded. The step fails naming s1,
 *                 the site whose frame is bad, not s0, whose frame came
 *                 last.
 *   codec         s0 sends its frame in int8 where both sites' HELLOs
 *                 agreed on fp32: the step fails, naming both codecs,
 *                 rather than adding int8's numbers.
 *   lane-flood    two lanes; lane 1 takes no mail meanwhile, as a lane
 *                 busy for long would not. s0's DATA of lane 1's chunks
 *                 on lane 0's stream waits for it within lane 1's budget
 *                 for s0 (early frames': 1.5 x inflight_per_peer and a
 *                 frame a stream), empty frames counted at their own size
 *                 and not a chunk's; past it the stream closes, saying
 *                 why. Then ABORTs for the coordinator, which does not
 *                 turn meanwhile: 16384 wait, and the next closes the
 *                 stream, as does a frame of a run the coordinator
 *                 must hear of first (taken once it took its mail),
 *                 also where another lane's chunk brought it.
 *                 Before, such mail queued without bound.
 *
 *   test_node_peer_frames CERT_DIR  (certificates from examples/make-certs.sh) */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "frame.h"
#include "gg_check.h"
#include "gg_node_check.h"
#include "gg_sites.h"
#include "gradgate.h"
#include "log.h"
#include "log_capture.h"
#include "net_addr.h"
#include "node.h"

#define COUNT 1000u /* elements: one chunk */

enum scenario { EARLY_FLOOD, BLAME, CODEC, LANE_FLOOD };

struct outcome {
	bool done;
	int status;
	char message[GG_NODE_ERROR_MAX];
};

static unsigned acks_sent;

static void on_sent(void *arg, unsigned peer, unsigned stream, const uint8_t *head, size_t head_len,
		    const uint8_t *frame, size_t frame_len)
{
	enum gg_wire_type type;
	size_t payload;
	char err[256];

	(void)arg;
	(void)peer;
	(void)stream;
	(void)frame;
	(void)frame_len;
	if (head_len >= GG_WIRE_HEADER_BYTES && !gg_wire_parse_header(head, SIZE_MAX, &type, &payload, err, sizeof(err)) &&
	    type == GG_WIRE_ACK)
		acks_sent++;
}

static void on_done(void *arg, struct gg_node_step *st, int status, const char *message)
{
	struct outcome *o = arg;

	(void)st;
	o->done = true;
	o->status = status;
	snprintf(o->message, sizeof(o->message), "%s", message ? message : "");
}

static void turns(struct gg_node *node, int n)
{
	for (int i = 0; i < n; i++)
		CHECK(gg_node_run_once(node, 0, NULL, NULL) == 0, "the node's loop failed");
}

/* The DATA message of chunk 0 of step `step` of job `job` (COUNT fp32
 * elements, all `value`) as site `origin` sends it by `algorithm`, in
 * `codec`; `frame_bytes` 0 sends an empty frame. Its length; 0 when it
 * cannot be made. */
static size_t make_data(const struct gg_config *cfg, const char *job, uint64_t step, unsigned origin, uint32_t chunk,
			enum gg_codec codec, bool empty, float value, uint8_t *msg, size_t cap)
{
	struct gg_wire_step ws = { .run = 5, .step = step, .count = COUNT, .tensor_id = 1, .dtype = GG_WIRE_F32 };
	struct gg_ar_chunk_id id = { .phase = GG_AR_DIRECT, .origin = (uint8_t)origin, .chunk = chunk };
	struct gg_frame_config fc = { .codec = gg_codec_defaults(codec), .max_elems = COUNT };
	struct gg_frame_encoder enc;
	static float x[COUNT];
	size_t fb = 0;

	snprintf(ws.job, sizeof(ws.job), "%s", job);
	ws.fingerprint = gg_node_fingerprint(cfg, &ws, (uint8_t)cfg->allreduce.algorithm,
					     (uint32_t)(cfg->transport.chunk_bytes / sizeof(float)));
	for (unsigned i = 0; i < COUNT; i++)
		x[i] = value;
	ssize_t hl = gg_wire_encode_data_head(msg, cap, &ws, &id, 0);
	if (hl < 0)
		return 0;
	if (!empty) {
		if (gg_frame_encoder_init(&enc, &fc))
			return 0;
		int rc = gg_frame_encode(&enc, x, COUNT, msg + hl, cap - (size_t)hl, &fb);
		gg_frame_encoder_fini(&enc);
		/* The header's length is the whole payload's. */
		if (rc || gg_wire_encode_data_head(msg, cap, &ws, &id, fb) != hl)
			return 0;
	}
	return (size_t)hl + fb;
}

static void early_flood(struct gg_node *node, const struct gg_config *cfg)
{
	static uint8_t msg[1024];
	static char text[1 << 18];
	const struct gg_node_stats *st = gg_node_stats(node);
	const uint64_t window = cfg->limits.inflight_bytes_per_peer;
	uint64_t most = 0;
	struct capture cap;

	if (!capture_start(&cap))
		return;
	const uint64_t start_us = gg_monotonic_us();
	for (uint64_t step = 2; step < 2002; step++) {
		size_t len = make_data(cfg, "flood", step, 0, 0, GG_CODEC_FP32, true, 0, msg, sizeof(msg));
		CHECK(len && gg_node_test_receive(node, 0, 0, msg, len) == 0, "DATA of step %llu",
		      (unsigned long long)step);
		turns(node, 1);
		most = GG_MAX(most, st->early_bytes);
	}
	turns(node, 3);
	/* The refusals are logged as the peer's other lines are: 64 a second
	 * (each second that began while a slow machine sent them lets 64
	 * out), and how many more once the second is over. */
	const unsigned seconds = (unsigned)((gg_monotonic_us() - start_us) / 1000000) + 2;
	for (int i = 0; i < 130; i++) {
		usleep(10000);
		turns(node, 1);
	}
	capture_end(&cap, text, sizeof(text));
	unsigned lines = 0;
	for (const char *p = text; (p = strstr(p, " event=early_data_refused site=s0 ")); p++)
		lines++;
	const char *rest = strstr(text, "level=warn event=lines_unlogged of=early_data_refused site=s0 count=");
	printf("  %u early_data_refused lines, then: %.*s\n", lines, rest ? (int)strcspn(rest, "\n") : 7,
	       rest ? rest : "nothing");
	CHECK(lines >= 32 && lines <= 64 * seconds && rest,
	      "%u early_data_refused lines of %llu refusals in %u seconds, and no count of the rest", lines,
	      (unsigned long long)st->early_refused, seconds);
	/* The budget as the docs give it: half as much again as the window,
	 * and a frame (of 4 KiB of fp32 here, under 8 KiB with its message
	 * head) with its bookkeeping for the one stream. */
	const uint64_t budget = window + window / 2 + 8192 + 384;
	printf("  held at most %llu bytes of 2000 empty early frames (window %llu), refused %llu, acknowledged %u\n",
	       (unsigned long long)most, (unsigned long long)window, (unsigned long long)st->early_refused, acks_sent);
	CHECK(most >= window && most <= budget, "held %llu bytes of early frames: not within [%llu, %llu]",
	      (unsigned long long)most, (unsigned long long)window, (unsigned long long)budget);
	CHECK(st->early_refused > 0, "none of 2000 empty frames was refused: they cost nothing of the budget");
	CHECK(acks_sent == 0, "%u ACKs of frames for steps not started here", acks_sent);
}

/* Sends s0's messages made by make(i) on stream 0 until the stream closes
 * (or `most` went); how many it took before the one it closed on. */
static unsigned until_closed(struct gg_node *node, size_t (*make)(const struct gg_config *, unsigned, uint8_t *, size_t),
			     const struct gg_config *cfg, unsigned most)
{
	static uint8_t msg[8192];

	for (unsigned i = 0; i < most; i++) {
		size_t len = make(cfg, i, msg, sizeof(msg));
		if (!len) {
			CHECK(0, "cannot make message %u", i);
			return i;
		}
		if (gg_node_test_receive(node, 0, 0, msg, len))
			return i - 1;
	}
	return most;
}

static size_t full_frame(const struct gg_config *cfg, unsigned i, uint8_t *msg, size_t cap)
{
	return make_data(cfg, "lanes", 2 + i, 0, 1, GG_CODEC_FP32, false, 1, msg, cap); /* chunk 1: lane 1's */
}

static size_t empty_frame(const struct gg_config *cfg, unsigned i, uint8_t *msg, size_t cap)
{
	return make_data(cfg, "lanes", 2 + i, 0, 1, GG_CODEC_FP32, true, 0, msg, cap);
}

static size_t fresh_frame(const struct gg_config *cfg, unsigned i, uint8_t *msg, size_t cap)
{
	(void)i; /* the same frame again: the second taken is a duplicate */
	return make_data(cfg, "fresh", 1, 0, 0, GG_CODEC_FP32, false, 1, msg, cap); /* chunk 0: lane 0's */
}

#define PEER_MAILS 16384u /* PEER_MAILS_MAX: what waits for the coordinator from one peer */

static size_t abort_msg(const struct gg_config *cfg, unsigned i, uint8_t *msg, size_t cap)
{
	char job[16];
	(void)cfg;
	snprintf(job, sizeof(job), "a%u", i % 64);
	ssize_t len = gg_wire_encode_abort(msg, cap, job, 1, i + 1, i + 1, (uint8_t)-GG_ERR_SITE, "flood");
	return len > 0 ? (size_t)len : 0;
}

/* Lets lane 1 take its mail again (at its next wake-up, a tick at most
 * away), and turns until it and the coordinator took all of s0's. */
static void let_go(struct gg_node *node)
{
	gg_node_test_hold_mail(node, 1, false);
	for (int i = 0; i < 5000 && gg_node_test_mail_waiting(node, 0); i++) {
		turns(node, 1);
		usleep(1000);
	}
	CHECK(gg_node_test_mail_waiting(node, 0) == 0, "%llu of s0's mail still waits",
	      (unsigned long long)gg_node_test_mail_waiting(node, 0));
}

static void lane_flood(struct gg_node *node, const struct gg_config *cfg)
{
	const uint64_t window = cfg->limits.inflight_bytes_per_peer;
	static uint8_t msg[8192];
	static char text[1 << 16];
	struct capture cap;

	size_t full = full_frame(cfg, 0, msg, sizeof(msg)), empty = empty_frame(cfg, 0, msg, sizeof(msg));
	if (!full || !empty || !capture_start(&cap)) {
		CHECK(0, "cannot make a frame or capture the log");
		return;
	}
	gg_node_test_hold_mail(node, 1, true);
	unsigned fulls = until_closed(node, full_frame, cfg, 1000);
	/* Lane 1 takes what waits; stream 0 comes back. */
	let_go(node);
	gg_node_test_hold_mail(node, 1, true);
	CHECK(gg_node_test_open_stream(node, 0, 0, 42, on_sent, NULL) == 0, "open stream 0 again");
	unsigned empties = until_closed(node, empty_frame, cfg, 5000);
	let_go(node);
	CHECK(gg_node_test_open_stream(node, 0, 0, 42, on_sent, NULL) == 0, "open stream 0 again");
	unsigned aborts = until_closed(node, abort_msg, cfg, 20000);
	/* The first frame of a run the coordinator has not heard of is taken
	 * only once it is told, and now cannot be: it is refused, and the
	 * stream closes; once the coordinator took its mail, it is taken. */
	CHECK(gg_node_test_open_stream(node, 0, 0, 42, on_sent, NULL) == 0, "open stream 0 again");
	/* (A stream closed by a message refuses the next.) */
	bool refused = until_closed(node, fresh_frame, cfg, 2) == 0;
	/* ... as is one for another lane's chunk, which that lane refuses:
	 * the stream it came on closes all the same. */
	CHECK(gg_node_test_open_stream(node, 0, 0, 42, on_sent, NULL) == 0, "open stream 0 again");
	size_t len = make_data(cfg, "fresh2", 1, 0, 1, GG_CODEC_FP32, false, 1, msg, sizeof(msg)); /* lane 1's */
	CHECK(len && gg_node_test_receive(node, 0, 0, msg, len) == 0, "lane 1's frame on stream 0");
	for (int i = 0; i < 5000 && gg_node_test_mail_waiting(node, 0) > PEER_MAILS; i++)
		usleep(1000); /* lane 1 takes it, and tells lane 0 to close the stream */
	turns(node, 2);
	bool forwarded_refused = gg_node_test_receive(node, 0, 0, msg, len) != 0;
	let_go(node);
	CHECK(gg_node_test_open_stream(node, 0, 0, 42, on_sent, NULL) == 0, "open stream 0 again");
	bool taken = until_closed(node, fresh_frame, cfg, 2) == 2;
	CHECK(refused && taken, "a new run's frame was %s while the coordinator's mail from s0 was full, and %s after",
	      refused ? "refused" : "taken", taken ? "taken" : "refused");
	CHECK(forwarded_refused, "a new run's frame for lane 1 was taken while the coordinator's mail from s0 was "
	      "full: the stream it came on stayed open");
	capture_end(&cap, text, sizeof(text));
	printf("  waited for lane 1: %u DATA of %zu bytes (window %llu), %u of %zu; for the coordinator: %u ABORTs\n",
	       fulls, full, (unsigned long long)window, empties, empty, aborts);
	/* A peer within its window never meets the bound: 1.5 windows and a
	 * frame per stream, each frame counted with 384 bytes, as the early
	 * frames are. Empty ones count as what they are, not as the chunk-
	 * sized buffer they came in. */
	const uint64_t budget = window + window / 2 + 2 * (2 * full + 384);
	CHECK(fulls * full >= window && fulls * (full + 384) <= budget,
	      "%u frames of %zu bytes waited for lane 1: not within a window and the budget", fulls, full);
	CHECK(empties * (empty + 384) >= window && empties * (empty + 384) <= budget,
	      "%u frames of %zu bytes waited for lane 1: not counted at their size, or past the budget", empties,
	      empty);
	CHECK(aborts == PEER_MAILS, "%u ABORTs waited for the coordinator, not %u", aborts, PEER_MAILS);
	const char *why = "reason=\"the peer's messages wait here past this site's budget for them: it sends faster "
			  "than this site takes them, beyond its window\"";
	unsigned closes = 0;
	for (const char *p = text; (p = strstr(p, why)); p++)
		closes++;
	CHECK(closes == 5, "%u stream_down lines saying why, not 5: %.600s", closes, text);
}

/* Step 1 of job "b" here (the node holds st until the step ends), and
 * the peers' messages of it. */
static struct {
	uint8_t msg[16384];
	float input[COUNT], result[COUNT];
	struct gg_node_step st;
	struct outcome o;
} b;

static void start_b(struct gg_node *node)
{
	char err[GG_NODE_ERROR_MAX];

	for (unsigned i = 0; i < COUNT; i++)
		b.input[i] = 1;
	b.o = (struct outcome){ 0 };
	b.st = (struct gg_node_step){ .seq = 1, .tensor_id = 1, .count = COUNT, .dtype = GG_WIRE_F32, .input = b.input,
				      .result = b.result, .done = on_done, .arg = &b.o };
	snprintf(b.st.job, sizeof(b.st.job), "b");
	CHECK(gg_node_submit(node, &b.st, err, sizeof(err)) == 0, "submit: %s", err);
	turns(node, 3);
}

static void blame(struct gg_node *node, const struct gg_config *cfg)
{
	uint8_t *msg = b.msg;
	const struct outcome *o = &b.o;

	start_b(node);
	size_t len = make_data(cfg, "b", 1, 1, 0, GG_CODEC_FP32, false, 2, msg, sizeof(b.msg));
	CHECK(len > 200, "cannot make s1's DATA");
	msg[len - 100] ^= 1; /* a byte of the payload: its checksum no longer holds */
	CHECK(gg_node_test_receive(node, 1, 0, msg, len) == 0, "s1's DATA");
	turns(node, 3);
	CHECK(!o->done, "the step ended before s0's frame came: %s", o->message);
	len = make_data(cfg, "b", 1, 0, 0, GG_CODEC_FP32, false, 3, msg, sizeof(b.msg));
	CHECK(len && gg_node_test_receive(node, 0, 0, msg, len) == 0, "s0's DATA");
	turns(node, 5);
	printf("  %s\n", o->message);
	CHECK(o->done && o->status == GG_ERR_SITE && strstr(o->message, "site 1, direct chunk 0 of 1: ") &&
		      strstr(o->message, "checksum") && strstr(o->message, "(site index 1 is s1)") &&
		      !strstr(o->message, "s0"),
	      "s1's bad frame, decoded when s0's came: done %d, status %d: %s", o->done, o->status, o->message);
}

static void codec(struct gg_node *node, const struct gg_config *cfg)
{
	uint8_t *msg = b.msg;
	const struct outcome *o = &b.o;

	start_b(node);
	size_t len = make_data(cfg, "b", 1, 0, 0, GG_CODEC_INT8, false, 2, msg, sizeof(b.msg));
	CHECK(len && gg_node_test_receive(node, 0, 0, msg, len) == 0, "s0's DATA");
	turns(node, 5);
	printf("  %s\n", o->message);
	CHECK(o->done && o->status == GG_ERR_SITE &&
		      strstr(o->message, "step 1 of job 'b': site s0 sent direct chunk 0 of 0 in codec int8 (blocks "
					"of ") &&
		      strstr(o->message, "where the sites agreed on fp32"),
	      "an int8 frame where the sites agreed on fp32: done %d, status %d: %s", o->done, o->status, o->message);
}

static void run(const char *cert_dir, enum scenario what)
{
	static const char *const title[] = {
		[EARLY_FLOOD] = "early-flood: empty frames for steps not started here, within the budget",
		[BLAME] = "blame: a kept frame that does not decode names its own site",
		[CODEC] = "codec: a frame in another codec than the sites agreed on",
		[LANE_FLOOD] = "lane-flood: what waits for another lane, or the coordinator, is bounded",
	};
	const unsigned sites = what == BLAME ? 3 : 2, self = sites - 1;
	char text[4096];
	int ports[3];
	struct gg_config cfg;
	struct gg_node *node;

	printf("%s\n", title[what]);
	acks_sent = 0;
	CHECK(gg_net_free_loopback_ports(ports, sites) == 0, "no free loopback ports");
	const unsigned lanes = what == LANE_FLOOD ? 2 : 1;
	size_t n = gg_test_site_toml(text, sizeof(text), self, sites, ports, lanes, cert_dir);
	snprintf(text + n, sizeof(text) - n,
		 "[transport]\nstreams_per_peer = %u\nchunk_size = \"%s\"\nstep_timeout = \"5s\"\n"
		 "[compression]\ncodec = \"fp32\"\n[allreduce]\nalgorithm = \"direct\"\n"
		 "[limits]\ninflight_per_peer = \"64KiB\"\nmax_message = \"1MiB\"\n",
		 lanes, what == EARLY_FLOOD || what == LANE_FLOOD ? "4KiB" : "64KiB");
	if (!(node = gg_check_node_new(text, "peer-frames.toml", &cfg)))
		return;
	for (unsigned p = 0; p < self; p++)
		CHECK(gg_node_test_open_stream(node, p, 0, 42 + p, on_sent, NULL) == 0, "open a stream to s%u", p);
	turns(node, 3);
	if (what == EARLY_FLOOD)
		early_flood(node, &cfg);
	else if (what == LANE_FLOOD)
		lane_flood(node, &cfg);
	else if (what == BLAME)
		blame(node, &cfg);
	else
		codec(node, &cfg);
	gg_node_shutdown(node);
	for (int spins = 0; spins < 100 && !gg_node_idle(node); spins++)
		turns(node, 1);
	gg_node_free(node);
	gg_config_free(&cfg);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s CERT_DIR\n", argv[0]);
		return 2;
	}
	gg_log_set_level(getenv("V") ? GG_LOG_DEBUG : GG_LOG_NONE);
	setvbuf(stdout, NULL, _IOLBF, 0);
	run(argv[1], EARLY_FLOOD);
	run(argv[1], BLAME);
	run(argv[1], CODEC);
	run(argv[1], LANE_FLOOD);
	printf("node peer frames: %d failure(s)\n", failures);
	return failures ? 1 : 0;
}
