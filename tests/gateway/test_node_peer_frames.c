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
 *
 *   test_node_peer_frames CERT_DIR  (certificates from examples/make-certs.sh) */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "gg_check.h"
#include "gg_node_check.h"
#include "gg_sites.h"
#include "gradgate.h"
#include "log.h"
#include "net_addr.h"
#include "node.h"

#define COUNT 1000u /* elements: one chunk */

enum scenario { EARLY_FLOOD, BLAME, CODEC };

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
static size_t make_data(const struct gg_config *cfg, const char *job, uint64_t step, unsigned origin,
			enum gg_codec codec, bool empty, float value, uint8_t *msg, size_t cap)
{
	struct gg_wire_step ws = { .run = 5, .step = step, .count = COUNT, .tensor_id = 1, .dtype = GG_WIRE_F32 };
	struct gg_ar_chunk_id id = { .phase = GG_AR_DIRECT, .origin = (uint8_t)origin, .chunk = 0 };
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
	const struct gg_node_stats *st = gg_node_stats(node);
	const uint64_t window = cfg->limits.inflight_bytes_per_peer;
	uint64_t most = 0;

	for (uint64_t step = 2; step < 2002; step++) {
		size_t len = make_data(cfg, "flood", step, 0, GG_CODEC_FP32, true, 0, msg, sizeof(msg));
		CHECK(len && gg_node_test_receive(node, 0, 0, msg, len) == 0, "DATA of step %llu",
		      (unsigned long long)step);
		turns(node, 1);
		most = GG_MAX(most, st->early_bytes);
	}
	turns(node, 3);
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
	size_t len = make_data(cfg, "b", 1, 1, GG_CODEC_FP32, false, 2, msg, sizeof(b.msg));
	CHECK(len > 200, "cannot make s1's DATA");
	msg[len - 100] ^= 1; /* a byte of the payload: its checksum no longer holds */
	CHECK(gg_node_test_receive(node, 1, 0, msg, len) == 0, "s1's DATA");
	turns(node, 3);
	CHECK(!o->done, "the step ended before s0's frame came: %s", o->message);
	len = make_data(cfg, "b", 1, 0, GG_CODEC_FP32, false, 3, msg, sizeof(b.msg));
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
	size_t len = make_data(cfg, "b", 1, 0, GG_CODEC_INT8, false, 2, msg, sizeof(b.msg));
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
	};
	const unsigned sites = what == BLAME ? 3 : 2, self = sites - 1;
	char text[4096];
	int ports[3];
	struct gg_config cfg;
	struct gg_node *node;

	printf("%s\n", title[what]);
	acks_sent = 0;
	CHECK(gg_net_free_loopback_ports(ports, sites) == 0, "no free loopback ports");
	size_t n = gg_test_site_toml(text, sizeof(text), self, sites, ports, 1, cert_dir);
	snprintf(text + n, sizeof(text) - n,
		 "[transport]\nstreams_per_peer = 1\nchunk_size = \"%s\"\nstep_timeout = \"5s\"\n"
		 "[compression]\ncodec = \"fp32\"\n[allreduce]\nalgorithm = \"direct\"\n"
		 "[limits]\ninflight_per_peer = \"64KiB\"\nmax_message = \"1MiB\"\n",
		 what == EARLY_FLOOD ? "4KiB" : "64KiB");
	if (!(node = gg_check_node_new(text, "peer-frames.toml", &cfg)))
		return;
	for (unsigned p = 0; p < self; p++)
		CHECK(gg_node_test_open_stream(node, p, 0, 42 + p, on_sent, NULL) == 0, "open a stream to s%u", p);
	turns(node, 3);
	if (what == EARLY_FLOOD)
		early_flood(node, &cfg);
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
	printf("node peer frames: %d failure(s)\n", failures);
	return failures ? 1 : 0;
}
