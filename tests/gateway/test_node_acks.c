/* Where a gateway acknowledges DATA it kept for a step not started yet.
 *
 * A sender keeps each frame until it is acknowledged, and sends it again
 * only when the stream it went on is lost. Copies of one frame can reach
 * the receiver in any order: TCP streams are independent, and a frame
 * read before its stream was cut may be handled after the copy sent
 * again on another stream. The ACK must reach the stream the sender still
 * watches, whichever copy came last; else the sender keeps the frame for
 * good, its window that much shorter, and never finishes flushing.
 *
 * Site s1 runs here (one lane, two streams to s0); s0 is played by the
 * test through streams with no socket behind them:
 *
 *   1. DATA for step 1, chunk 0, on stream 1 (the copy sent again)
 *   2. the same DATA on stream 0 (the first copy, read late)
 *   3. stream 0 ends, as the cut stream does
 *   4. s1 starts step 1: the kept frame is used and acknowledged
 *
 * Checks that the ACK went out on stream 1, and that a frame that came
 * once is acknowledged once, on its own stream.
 *
 * And DATA that comes after the ABORT of its step (sent on another
 * stream, so in any order with it): s1 never starts that step, and holds
 * the frame unacknowledged no longer than the ABORT's own copies take:
 *
 *   1. ABORT of step 1 on stream 0, before s1 has heard of the job
 *   2. DATA for step 1 on stream 1: acknowledged at once, on stream 1
 *
 * The ABORT's reason holds a double quote and words that read like a key:
 * s1's log line for it keeps them inside the reason's value, escaped.
 *
 * And DATA of a job that ended at its sender: s1 never ran the job, and
 * keeps s0's frame of step 2 until s0's END comes, then lets it go. The
 * frames s0 had sent before its END on other streams come after it:
 *
 *   1. DATA for step 2 on stream 0: kept, not acknowledged
 *   2. END of the job on stream 0: the frame is let go and acknowledged
 *   3. DATA for step 3 on stream 1: acknowledged at once, not kept
 *   4. DATA for step 1 of the next run on stream 1: kept
 *   5. DATA for step 1 of the run that ended: acknowledged at once
 *   6. END of the next run: its frame is let go too
 *   7. ENDs of 72 jobs never seen here, more than a lane's job table
 *      holds (GG_NODE_LANE_JOBS), at once: the entry that lets go of the job's frames still
 *      on the way stays, and DATA of step 5 is acknowledged at once
 *   8. once heartbeat_timeout (300 ms here) passed, the END of one more
 *      job and its DATA: acknowledged at once too, the entries of ended
 *      jobs that settled making room for it
 *
 * And runs of a job that follow each other with no END between them: a
 * frame of an earlier run than one seen is acknowledged at once, and a
 * later run's frame lets the one before go. And a run of the job that
 * ended at s0 during its step 1, then a new run
 * at both sites: step 1's frame and DONE of the old run, read after its
 * END, are let go; the new run's step 1 completes with the new run's
 * frame, exact, once the new run's DONE came. Then s0 restarts with its
 * clock set back: its new instance's runs, below the old one's, are new
 * runs all the same.
 *
 * And DATA whose step fingerprint differs from this site's in the chunk
 * size alone (two builds whose auto rules differ): the step fails as a
 * mismatch that says the peer cuts it in other chunks.
 *
 * And a peer's END, or its restart, while the job's ranks here had
 * connected but announced no step (so no job of it was in the node): the
 * job, once made, fails at once, naming it; but not where the ranks here
 * connected only after it (a new run), nor for the job an ABORT of the
 * peer's next run made before that, nor after the ranks here left.
 *
 * And the steps a node refuses, each with its own errno and a message
 * that names the limit: a tensor past [limits] max_message as the ranks
 * hold it (bfloat16 counts 2 bytes an element, float32 4), a job past the
 * job table, a step once the node stops.
 *
 * And a peer that holds a site's key, sending what makes a log line each
 * far faster than jobs do: DATA of 200 jobs that never start here, ENDs
 * of 1000 jobs never seen here, ABORTs of 1000 steps of one job and of
 * 200 jobs (past the job table, each takes an idle job's entry), and 200
 * reconnections of a stream, each as a new instance; and 200 jobs whose
 * ranks came and left here, as any local user may make. Each kind logs at
 * most its limit in a second (64 lines; 16 for a stream's ups and downs
 * with two streams a peer), and once the second is over one line says how
 * many it left out: what was logged and what was left out add up to what
 * was sent.
 *
 *   test_node_acks CERT_DIR  (certificates from examples/make-certs.sh) */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "frame.h"
#include "gg_check.h"
#include "gg_node_check.h"
#include "gradgate.h"
#include "gg_sites.h"
#include "log.h"
#include "log_capture.h"
#include "net_addr.h"
#include "node.h"

#define COUNT 1000u /* elements: one chunk */
#define MAX_ACKS 16

struct sent {
	unsigned pings;
	uint64_t ping_us; /* the last PING's value, on stream 0 */
	unsigned acks;
	struct {
		unsigned stream;
		uint64_t step;
		struct gg_ar_chunk_id id;
	} ack[MAX_ACKS];
};

static void on_sent(void *arg, unsigned peer, unsigned stream, const uint8_t *head, size_t head_len,
		    const uint8_t *frame, size_t frame_len)
{
	struct sent *s = arg;
	enum gg_wire_type type;
	size_t payload;
	struct gg_wire_msg m;
	char err[256];

	(void)peer;
	(void)frame;
	CHECK(head_len >= GG_WIRE_HEADER_BYTES && !gg_wire_parse_header(head, SIZE_MAX, &type, &payload, err, sizeof(err)),
	      "the node wrote a message with a bad header");
	if (head_len >= GG_WIRE_HEADER_BYTES && type == GG_WIRE_PING && stream == 0 &&
	    !gg_wire_decode(type, head + GG_WIRE_HEADER_BYTES, payload, &m, err, sizeof(err))) {
		s->ping_us = m.u.ping_us;
		s->pings++;
	}
	if (head_len < GG_WIRE_HEADER_BYTES || type != GG_WIRE_ACK || frame_len)
		return;
	CHECK(!gg_wire_decode(type, head + GG_WIRE_HEADER_BYTES, payload, &m, err, sizeof(err)), "bad ACK: %s", err);
	if (s->acks < MAX_ACKS) {
		s->ack[s->acks].stream = stream;
		s->ack[s->acks].step = m.u.ack.step;
		s->ack[s->acks].id = m.u.ack.id;
	}
	s->acks++;
}

struct outcome {
	bool done;
	int status;
	char message[GG_NODE_ERROR_MAX];
};

static void on_done(void *arg, struct gg_node_step *st, int status, const char *message)
{
	struct outcome *o = arg;

	(void)st;
	if (!o)
		return;
	o->done = true;
	o->status = status;
	snprintf(o->message, sizeof(o->message), "%s", message ? message : "");
}

/* DATA of step `step` of `job` for chunk 0 of a COUNT-element fp32 tensor,
 * as s0 sends it: *len bytes at the returned buffer (free it). s0 cuts the
 * step in chunks of `chunk_elems` elements (0: as the configuration says,
 * as this site does). */
/* Set: the DATA says tensor 8 under the fingerprint of tensor 7, as no
 * gateway would (the FIELDS scenario). */
static bool data_lies;

static uint8_t *make_run_data(const struct gg_config *cfg, const char *job, uint64_t run, uint64_t step,
			      uint32_t chunk_elems, float scale, size_t *len)
{
	struct gg_wire_step ws = { .run = run, .step = step, .count = COUNT, .tensor_id = 7, .dtype = GG_WIRE_F32 };
	struct gg_ar_chunk_id id = { .phase = GG_AR_DIRECT, .origin = 0, .chunk = 0 };
	struct gg_frame_config fc = { .codec = gg_codec_defaults(cfg->compression.codec), .max_elems = COUNT };
	struct gg_frame_encoder enc;
	size_t cap = GG_WIRE_HEADER_BYTES + GG_WIRE_DATA_FIXED_BYTES + 256 + 8 * COUNT, fb;
	uint8_t *msg = malloc(cap);
	float x[COUNT];

	snprintf(ws.job, sizeof(ws.job), "%s", job);
	if (!chunk_elems)
		chunk_elems = (uint32_t)(cfg->transport.chunk_bytes / sizeof(float)) / GG_CODEC_BLOCK_ALIGN_ELEMS *
			      GG_CODEC_BLOCK_ALIGN_ELEMS;
	ws.fingerprint = gg_node_fingerprint(cfg, &ws, (uint8_t)cfg->allreduce.algorithm, chunk_elems);
	if (data_lies)
		ws.tensor_id = 8;
	for (unsigned i = 0; i < COUNT; i++)
		x[i] = scale * (float)i;
	if (!msg || gg_frame_encoder_init(&enc, &fc)) {
		free(msg);
		return NULL;
	}
	ssize_t hl = gg_wire_encode_data_head(msg, cap, &ws, &id, 0);
	int rc = hl < 0 ? -EINVAL : gg_frame_encode(&enc, x, COUNT, msg + hl, cap - (size_t)hl, &fb);
	gg_frame_encoder_fini(&enc);
	/* The header's length is the whole payload's. */
	if (rc || gg_wire_encode_data_head(msg, cap, &ws, &id, fb) != hl) {
		free(msg);
		return NULL;
	}
	*len = (size_t)hl + fb;
	return msg;
}

/* The same for run 1 of `job`, x[i] = i. */
static uint8_t *make_job_data(const struct gg_config *cfg, const char *job, uint64_t step, uint32_t chunk_elems,
			      size_t *len)
{
	return make_run_data(cfg, job, 1, step, chunk_elems, 1.0f, len);
}

/* The same for job "acks". */
static uint8_t *make_data(const struct gg_config *cfg, uint64_t step, uint32_t chunk_elems, size_t *len)
{
	return make_job_data(cfg, "acks", step, chunk_elems, len);
}

static void turns(struct gg_node *node, int n)
{
	for (int i = 0; i < n; i++)
		CHECK(gg_node_run_once(node, 0, NULL, NULL) == 0, "the node's loop failed");
}

/* s0 aborted step 1 of job "acks" before s1 started it; its DATA comes
 * after the ABORT. */
static void run_after_abort(struct gg_node *node, const struct gg_config *cfg, struct sent *sent)
{
	uint8_t abort_msg[512];
	size_t len = 0;
	uint8_t *data = make_data(cfg, 1, 0, &len);
	ssize_t al = gg_wire_encode_abort(abort_msg, sizeof(abort_msg), "acks", 1, 1, 1, (uint8_t)-GG_ERR_SITE,
					  "the gateway of site s0 is \"shutting down\" event=forged site=s9");
	struct capture cap;
	char text[4096] = "";

	CHECK(data && al > 0, "cannot make DATA and ABORT");
	if (!data || al <= 0 || !capture_start(&cap)) {
		free(data);
		return;
	}
	CHECK(gg_node_test_receive(node, 0, 0, abort_msg, (size_t)al) == 0, "ABORT on stream 0");
	turns(node, 3);
	capture_end(&cap, text, sizeof(text));
	CHECK(strstr(text, "event=abort_recorded job=acks step=1 last_step=1 reason=\"site s0 aborted step 1 of job "
			   "'acks': the gateway of site s0 is \\\"shutting down\\\" event=forged site=s9\"\n"),
	      "the ABORT's reason was not logged escaped inside its value:\n%s", text);
	CHECK(gg_node_test_receive(node, 0, 1, data, len) == 0, "DATA on stream 1");
	turns(node, 3);
	CHECK(sent->acks == 1, "%u ACKs of DATA for a step aborted before it started here, not 1: the sender would "
	      "wait for it until its drain gives up", sent->acks);
	if (sent->acks >= 1)
		CHECK(sent->ack[0].stream == 1 && sent->ack[0].step == 1,
		      "the ACK went on stream %u for step %llu, not on stream 1 for step 1", sent->ack[0].stream,
		      (unsigned long long)sent->ack[0].step);
	free(data);
}

/* s0's message `msg` (NULL: one that could not be made) on stream
 * `stream`; then s1 must have sent `acks` ACKs in all and hold early
 * frames (`kept`) or none. */
static void receive_expect(struct gg_node *node, const struct sent *sent, unsigned stream, const uint8_t *msg,
			   size_t len, unsigned acks, bool kept, const char *what)
{
	CHECK(msg && gg_node_test_receive(node, 0, stream, msg, len) == 0, "%s on stream %u", what, stream);
	turns(node, 5);
	const uint64_t held = gg_node_stats(node)->early_bytes;
	CHECK(sent->acks == acks && (held > 0) == kept, "%s: %u ACKs, %llu bytes kept; want %u ACKs and %s", what,
	      sent->acks, (unsigned long long)held, acks, kept ? "the frame kept" : "nothing kept");
}

/* The END of run `run` of `job` as s0 sends it, into buf; its length. */
static size_t end_of(const char *job, uint64_t run, uint8_t *buf, size_t cap)
{
	ssize_t l = gg_wire_encode_end(buf, cap, job, run, 1, 1, (uint8_t)-GG_ERR_RANK, "its ranks at site s0 are gone", 0);
	CHECK(l > 0, "cannot make the END of %s", job);
	return l > 0 ? (size_t)l : 0;
}

/* s0 ended job "acks", which never ran here, with frames on the way. */
static void run_after_end(struct gg_node *node, const struct gg_config *cfg, struct sent *sent)
{
	uint8_t end_msg[512], end2_msg[512];
	size_t len[6] = { 0 };
	uint8_t *data[6] = { make_data(cfg, 2, 0, &len[0]), make_data(cfg, 3, 0, &len[1]), make_run_data(cfg, "acks", 2, 1, 0, 1.0f, &len[2]),
			     make_data(cfg, 5, 0, &len[3]), make_job_data(cfg, "late", 4, 0, &len[4]),
			     make_data(cfg, 1, 0, &len[5]) };
	size_t el = end_of("acks", 1, end_msg, sizeof(end_msg)), el2 = end_of("acks", 2, end2_msg, sizeof(end2_msg));

	receive_expect(node, sent, 0, data[0], len[0], 0, true, "DATA of step 2, which has not started here");
	receive_expect(node, sent, 0, end_msg, el, 1, false, "the END: the frame let go and acknowledged");
	/* Else it holds memory and the sender's window for good. */
	receive_expect(node, sent, 1, data[1], len[1], 2, false, "DATA of the ended job after its END");
	if (sent->acks == 2)
		CHECK(sent->ack[1].stream == 1 && sent->ack[1].step == 3,
		      "the ACK went on stream %u for step %llu, not on stream 1 for step 3", sent->ack[1].stream,
		      (unsigned long long)sent->ack[1].step);
	receive_expect(node, sent, 1, data[2], len[2], 2, true, "step 1 of a new run of the job");
	receive_expect(node, sent, 1, data[5], len[5], 3, true, "step 1 of the run that ended, read late");
	receive_expect(node, sent, 0, end2_msg, el2, 4, false, "the END of the new run");
	for (unsigned j = 0; j < GG_NODE_LANE_JOBS + 8; j++) {
		char job[16];
		snprintf(job, sizeof(job), "gone-%u", j);
		size_t l = end_of(job, 1, end_msg, sizeof(end_msg));
		CHECK(l && gg_node_test_receive(node, 0, j % 2, end_msg, l) == 0, "END of %s", job);
		turns(node, 2);
	}
	receive_expect(node, sent, 1, data[3], len[3], 5, false, "DATA after its job's END, past 72 other ENDs at once");
	/* The test's streams send no heartbeats: past the timeout the node
	 * drops them, and they come back. */
	usleep(350000);
	turns(node, 3);
	CHECK(gg_node_test_open_stream(node, 0, 0, 42, on_sent, sent) == 0 &&
		      gg_node_test_open_stream(node, 0, 1, 42, on_sent, sent) == 0,
	      "streams again");
	turns(node, 3);
	receive_expect(node, sent, 0, end_msg, end_of("late", 1, end_msg, sizeof(end_msg)), 5, false,
		       "the END of one more job, once the 72 before settled");
	receive_expect(node, sent, 1, data[4], len[4], 6, false, "DATA of that job after its END");
	for (int i = 0; i < 6; i++)
		free(data[i]);
}

/* Submits step 1 of `job` here: COUNT floats of zeros, the sum into
 * result[], the outcome into *outcome; *st lives until the step ends. */
static void submit_step1(struct gg_node *node, struct gg_node_step *st, const char *job, struct outcome *outcome,
			 float *result)
{
	static float input[COUNT];
	char err[GG_NODE_ERROR_MAX];

	*outcome = (struct outcome){ 0 };
	*st = (struct gg_node_step){ .seq = 1, .tensor_id = 7, .count = COUNT, .dtype = GG_WIRE_F32, .input = input,
				     .result = result, .done = on_done, .arg = outcome };
	snprintf(st->job, sizeof(st->job), "%s", job);
	CHECK(gg_node_submit(node, st, err, sizeof(err)) == 0, "step 1 of job %s: %s", job, err);
}

/* s0's DONE of step 1 of run 2 of `job`, whose frame held x[i] = 2i: the
 * step completes here with that sum (this site's input is zeros), exact. */
static void complete_new_run(struct gg_node *node, const char *job, const struct outcome *outcome,
			     const float *result)
{
	uint8_t msg[512];
	ssize_t dl = gg_wire_encode_done(msg, sizeof(msg), job, 2, 1, NULL, NULL);

	CHECK(dl > 0 && gg_node_test_receive(node, 0, 0, msg, (size_t)dl) == 0, "run 2's DONE of step 1");
	for (int i = 0; i < 50 && !outcome->done; i++)
		turns(node, 1);
	CHECK(outcome->done && outcome->status == 0, "step 1 of the new run: done %d, status %d: %s", outcome->done,
	      outcome->status, outcome->message);
	unsigned bad = 0;
	for (unsigned i = 0; i < COUNT && bad < 3; i++)
		if (result[i] != 2.0f * (float)i)
			CHECK(++bad == 0, "element %u: %g, not %g: the old run's words took the new one's place", i,
			      result[i], 2.0f * (float)i);
}

/* s0's run of job "acks" ended during its step 1, with a frame of it
 * still on the way; then a new run starts at both sites. The old frame,
 * read after the END, must not pass for the new run's. */
static void run_stale_run(struct gg_node *node, const struct gg_config *cfg, struct sent *sent)
{
	uint8_t msg[512];
	size_t len[2] = { 0 };
	uint8_t *data[2] = { make_run_data(cfg, "acks", 1, 1, 0, 1.0f, &len[0]),
			     make_run_data(cfg, "acks", 2, 1, 0, 2.0f, &len[1]) };

	/* Runs of another job, with no END between them: a site starts a run
	 * of a name only once its run before ended, so a frame of an earlier
	 * run than one seen is over, and a later run's frame ends the one
	 * before. */
	size_t olen[3] = { 0 };
	uint8_t *order[3] = { make_run_data(cfg, "order", 3, 1, 0, 1.0f, &olen[0]),
			      make_run_data(cfg, "order", 2, 1, 0, 1.0f, &olen[1]),
			      make_run_data(cfg, "order", 4, 1, 0, 1.0f, &olen[2]) };
	receive_expect(node, sent, 0, order[0], olen[0], 0, true, "run 3's DATA of step 1");
	receive_expect(node, sent, 1, order[1], olen[1], 1, true, "run 2's DATA of step 1, read after run 3's");
	receive_expect(node, sent, 1, order[2], olen[2], 2, true, "run 4's DATA of step 1, which lets run 3's go");
	receive_expect(node, sent, 0, msg, end_of("order", 4, msg, sizeof(msg)), 3, false, "the END of run 4");
	for (int i = 0; i < 3; i++)
		free(order[i]);

	size_t el = end_of("acks", 1, msg, sizeof(msg));
	receive_expect(node, sent, 0, msg, el, 3, false, "the END of run 1, during its step 1");
	receive_expect(node, sent, 1, data[0], len[0], 4, false, "run 1's DATA of step 1, after its END");

	static float result[COUNT];
	struct outcome outcome;
	struct gg_node_step st;
	submit_step1(node, &st, "acks", &outcome, result);
	turns(node, 5);
	/* Run 1's DONE of step 1, sent before its END and read late, is not
	 * run 2's: the step waits for run 2's own. */
	ssize_t dl = gg_wire_encode_done(msg, sizeof(msg), "acks", 1, 1, NULL, NULL);
	CHECK(dl > 0 && gg_node_test_receive(node, 0, 0, msg, (size_t)dl) == 0, "run 1's DONE of step 1");
	receive_expect(node, sent, 1, data[1], len[1], 5, false, "run 2's DATA of step 1, used at once");
	turns(node, 5);
	CHECK(!outcome.done, "step 1 of the new run completed on the old run's DONE: %d %s", outcome.status,
	      outcome.message);
	complete_new_run(node, "acks", &outcome, result);
	for (int i = 0; i < 2; i++)
		free(data[i]);

	/* s0 restarts with its clock set back: the new instance's runs count
	 * from below the old one's, and are new runs all the same. */
	size_t rlen[2] = { 0 };
	uint8_t *rdata[2] = { make_run_data(cfg, "restart", 10, 2, 0, 1.0f, &rlen[0]),
			      make_run_data(cfg, "restart", 5, 1, 0, 1.0f, &rlen[1]) };
	const unsigned acks = sent->acks;
	receive_expect(node, sent, 0, rdata[0], rlen[0], acks, true, "run 10's DATA of step 2");
	receive_expect(node, sent, 0, msg, end_of("restart", 10, msg, sizeof(msg)), acks + 1, false, "run 10's END");
	CHECK(gg_node_test_open_stream(node, 0, 0, 43, on_sent, sent) == 0 &&
		      gg_node_test_open_stream(node, 0, 1, 43, on_sent, sent) == 0,
	      "streams of s0's new instance");
	turns(node, 3);
	receive_expect(node, sent, 1, rdata[1], rlen[1], acks + 1, true, "the new instance's run 5, DATA of step 1");
	receive_expect(node, sent, 0, msg, end_of("restart", 5, msg, sizeof(msg)), acks + 2, false, "run 5's END");
	for (int i = 0; i < 2; i++)
		free(rdata[i]);
}

/* Step 1 of `job` here, with s0's DATA and DONE of run `run` (x[i] =
 * scale * i). Returns the outcome; result[] holds the sum once it
 * completed. */
static struct outcome step_with(struct gg_node *node, const struct gg_config *cfg, struct sent *sent, const char *job,
				uint64_t run, float scale, float *result)
{
	struct outcome outcome;
	struct gg_node_step st;
	uint8_t msg[512];
	size_t len = 0;
	uint8_t *data = make_run_data(cfg, job, run, 1, 0, scale, &len);

	submit_step1(node, &st, job, &outcome, result);
	turns(node, 5);
	const unsigned acks = sent->acks;
	receive_expect(node, sent, 1, data, len, acks + 1, false, "DATA of step 1, used at once");
	free(data);
	ssize_t dl = gg_wire_encode_done(msg, sizeof(msg), job, run, 1, NULL, NULL);
	CHECK(dl > 0 && gg_node_test_receive(node, 0, 0, msg, (size_t)dl) == 0, "DONE of step 1");
	for (int i = 0; i < 20 && !outcome.done; i++)
		turns(node, 1);
	return outcome;
}

/* A run of job "again" ends here after step 1; a new run of it starts at
 * both sites. s0's END of its old run, sent again when a stream came
 * back, reaches this site in the new run's step 1: it must not stand for
 * s0's DONE of the new run. */
/* The job ended here; its new run starts, and s0's END of its run 1 comes
 * again (sent once a stream came back): it must not end the new run nor
 * stand for s0's DONE of it. The new run completes with s0's run 2. */
static void new_run_after_end(struct gg_node *node, const struct gg_config *cfg, struct sent *sent, const char *job)
{
	static float result[COUNT];
	struct outcome outcome;
	struct gg_node_step st;
	uint8_t msg[512];
	size_t len = 0;

	submit_step1(node, &st, job, &outcome, result);
	turns(node, 3);
	receive_expect(node, sent, 0, msg, end_of(job, 1, msg, sizeof(msg)), sent->acks, false,
		       "s0's END of its old run, sent again");
	uint8_t *data = make_run_data(cfg, job, 2, 1, 0, 2.0f, &len);
	receive_expect(node, sent, 1, data, len, sent->acks + 1, false, "the new run's DATA of step 1");
	free(data);
	turns(node, 5);
	CHECK(!outcome.done, "step 1 of the new run of %s ended on the old run's END: status %d: %s", job,
	      outcome.status, outcome.message);
	complete_new_run(node, job, &outcome, result);
}

static void run_delayed_end(struct gg_node *node, const struct gg_config *cfg, struct sent *sent)
{
	static float result[COUNT];

	/* The old run completed a step here: s0's DONE told its run. */
	struct outcome o = step_with(node, cfg, sent, "again", 1, 1.0f, result);
	CHECK(o.done && o.status == 0, "step 1 of the old run: done %d, status %d: %s", o.done, o.status, o.message);
	gg_node_end_job(node, "again");
	turns(node, 3);
	new_run_after_end(node, cfg, sent, "again");

	/* The old run ended here before its step 1: only s0's frame, kept for
	 * it and let go at the end, told s0's run. */
	size_t len = 0;
	uint8_t *data = make_run_data(cfg, "early", 1, 1, 0, 1.0f, &len);
	const unsigned acks = sent->acks;
	receive_expect(node, sent, 1, data, len, acks, true, "run 1's DATA of step 1, before the step here");
	free(data);
	gg_node_end_job(node, "early");
	turns(node, 3);
	CHECK(sent->acks == acks + 1, "the kept frame was not let go when the job ended here");
	new_run_after_end(node, cfg, sent, "early");

	/* The old run ended here before any word of it came; its frame of
	 * step 1, read after that, passes for the new run's. The new run's own
	 * frame then shows s0's two runs: the step fails rather than complete
	 * with the old run's numbers, though this site's part was whole. */
	gg_node_end_job(node, "narrow");
	turns(node, 3);
	size_t l[2] = { 0 };
	uint8_t *d[2] = { make_run_data(cfg, "narrow", 1, 1, 0, 1.0f, &l[0]),
			  make_run_data(cfg, "narrow", 2, 1, 0, 2.0f, &l[1]) };
	const unsigned before = sent->acks;
	receive_expect(node, sent, 1, d[0], l[0], before, true, "run 1's DATA of step 1, after the job ended here");
	struct outcome outcome;
	struct gg_node_step st;
	uint8_t msg[512];
	submit_step1(node, &st, "narrow", &outcome, result);
	turns(node, 5);
	receive_expect(node, sent, 1, d[1], l[1], before + 2, false, "run 2's DATA of step 1");
	ssize_t dl = gg_wire_encode_done(msg, sizeof(msg), "narrow", 2, 1, NULL, NULL);
	CHECK(dl > 0 && gg_node_test_receive(node, 0, 0, msg, (size_t)dl) == 0, "run 2's DONE of step 1");
	for (int i = 0; i < 20 && !outcome.done; i++)
		turns(node, 1);
	CHECK(outcome.done && outcome.status == GG_ERR_SITE &&
		      strstr(outcome.message, "step 1 of job 'narrow': site s0's frames of it came from two of its runs"),
	      "a step fed a frame of an old run: done %d, status %d: %s", outcome.done, outcome.status,
	      outcome.message);
	printf("  %s\n", outcome.message);
	for (int i = 0; i < 2; i++)
		free(d[i]);

	/* A later run's frame to a step whose frames of that peer came from a
	 * run known here, not guessed, is a copy to it: the run it pairs with
	 * may have completed it there. The step does not fail on it (it is
	 * left in progress; the node's shutdown ends it). */
	static struct outcome known;
	static struct gg_node_step known_st;
	static float known_result[COUNT];
	uint8_t *k[2] = { make_run_data(cfg, "known", 1, 1, 0, 1.0f, &l[0]),
			  make_run_data(cfg, "known", 2, 1, 0, 2.0f, &l[1]) };
	submit_step1(node, &known_st, "known", &known, known_result);
	turns(node, 3);
	const unsigned at = sent->acks;
	receive_expect(node, sent, 1, k[0], l[0], at + 1, false, "run 1's DATA of step 1, used at once");
	receive_expect(node, sent, 1, k[1], l[1], at + 2, false, "run 2's DATA of step 1, a copy to the step");
	CHECK(!known.done, "a step of a known run failed on a later run's frame: %d %s", known.status, known.message);
	for (int i = 0; i < 2; i++)
		free(k[i]);
}

/* Submits step 1 of `job`; returns what gg_node_submit() did. */
static int submit(struct gg_node *node, struct gg_node_step *st, const char *job, uint64_t count, uint8_t dtype,
		  float *mem, char *err, size_t err_size)
{
	*st = (struct gg_node_step){ .seq = 1, .tensor_id = 7, .count = count, .dtype = dtype, .input = mem,
				     .result = mem, .done = on_done };
	snprintf(st->job, sizeof(st->job), "%s", job);
	return gg_node_submit(node, st, err, err_size);
}

/* max_message is 1 MiB here. */
static void run_refusals(struct gg_node *node, const struct gg_config *cfg, struct sent *sent)
{
	enum { JOBS_TRIED = 64, BF16_MAX = 1 << 19 };
	static struct gg_node_step steps[JOBS_TRIED];
	static float mem[JOBS_TRIED][BF16_MAX];
	char err[GG_NODE_ERROR_MAX], job[16];
	int rc;

	(void)cfg;
	(void)sent;
	rc = submit(node, &steps[0], "big", BF16_MAX + 1, GG_WIRE_BF16, mem[0], err, sizeof(err));
	CHECK(rc == -E2BIG && strstr(err, "524289 elements of 2 bytes exceed [limits] max_message (1048576 bytes)"),
	      "bfloat16, 1 element past max_message: %d %s", rc, err);
	rc = submit(node, &steps[0], "big", BF16_MAX / 2 + 1, GG_WIRE_F32, mem[0], err, sizeof(err));
	CHECK(rc == -E2BIG && strstr(err, "262145 elements of 4 bytes exceed"), "float32, 1 element past max_message: "
	      "%d %s", rc, err);
	/* Exactly max_message of bfloat16 (its sum is twice that in float32). */
	rc = submit(node, &steps[0], "big", BF16_MAX, GG_WIRE_BF16, mem[0], err, sizeof(err));
	CHECK(rc == 0, "bfloat16 at max_message refused: %s", err);

	unsigned taken = 1;
	for (; taken < JOBS_TRIED; taken++) {
		snprintf(job, sizeof(job), "j%u", taken);
		if ((rc = submit(node, &steps[taken], job, 1, GG_WIRE_F32, mem[taken], err, sizeof(err))))
			break;
		turns(node, 1);
	}
	CHECK(taken == 32 && rc == -ENOSPC && strstr(err, "too many jobs (at most 32)"),
	      "job %u of steps in progress: %d %s", taken + 1, rc, err);

	gg_node_stop_steps(node);
	turns(node, 3);
	rc = submit(node, &steps[JOBS_TRIED - 1], "late", 1, GG_WIRE_F32, mem[JOBS_TRIED - 1], err, sizeof(err));
	CHECK(rc == -ESHUTDOWN && strstr(err, "the gateway is shutting down"), "a step after the stop: %d %s", rc,
	      err);
}

/* The job table holds 32 jobs. An idle job whose ranks are connected
 * keeps its entry (and with it its residuals and plan): a step of a 33rd
 * job is refused rather than take it; an idle one with no ranks here
 * gives its entry up. */
static void run_job_table(struct gg_node *node, const struct gg_config *cfg, struct sent *sent)
{
	enum { JOBS = 34 };
	static struct gg_node_step steps[JOBS];
	static float mem[JOBS];
	char err[GG_NODE_ERROR_MAX], job[16];
	int rc;

	(void)cfg;
	(void)sent;
	for (unsigned i = 0; i < 32; i++) {
		snprintf(job, sizeof(job), i < 31 ? "open%u" : "gone", i);
		if (i < 31)
			gg_node_job_opened(node, job);
		rc = submit(node, &steps[i], job, 1, GG_WIRE_F32, &mem[i], err, sizeof(err));
		CHECK(rc == 0, "step 1 of %s: %d %s", job, rc, err);
		turns(node, 1);
		rc = gg_node_abort(node, job, 1, GG_ERR_MISMATCH, "the ranks disagree");
		CHECK(rc == 0, "abort of %s's step 1: %d", job, rc);
		turns(node, 1);
	}
	/* "gone" was made by steps of ranks the node was not told of. */
	gg_node_job_opened(node, "late");
	rc = submit(node, &steps[32], "late", 1, GG_WIRE_F32, &mem[32], err, sizeof(err));
	CHECK(rc == 0, "a 33rd job, with a job of no ranks idle: %d %s", rc, err);
	turns(node, 1);
	CHECK(gg_node_abort(node, "late", 1, GG_ERR_MISMATCH, "the ranks disagree") == 0, "abort of late's step 1");
	turns(node, 1);
	/* As many names as max_clients (64) have ranks here, and peers speak
	 * of many more: none of that makes the node forget whose ranks are
	 * here. */
	for (unsigned i = 0; i < 31; i++) {
		snprintf(job, sizeof(job), "waiting%u", i);
		gg_node_job_opened(node, job);
	}
	gg_node_job_opened(node, "crowd");
	for (unsigned i = 0; i < 200; i++) {
		uint8_t msg[512];
		snprintf(job, sizeof(job), "elsewhere%u", i);
		ssize_t l = gg_wire_encode_end(msg, sizeof(msg), job, 1, 0, 0, (uint8_t)-GG_ERR_RANK, "gone", 0);
		CHECK(l > 0 && gg_node_test_receive(node, 0, 0, msg, (size_t)l) == 0, "END of %s", job);
		if (i % 20 == 0)
			turns(node, 1);
	}
	turns(node, 3);
	rc = submit(node, &steps[33], "crowd", 1, GG_WIRE_F32, &mem[33], err, sizeof(err));
	CHECK(rc == -ENOSPC &&
		      strstr(err, "too many jobs (at most 32): each has ranks connected here or a step in progress"),
	      "a 33rd job while 32 idle ones have ranks here: %d %s", rc, err);
	/* The ranks of one leave: its entry is free. */
	gg_node_end_job(node, "open0");
	turns(node, 1);
	rc = submit(node, &steps[33], "crowd", 1, GG_WIRE_F32, &mem[33], err, sizeof(err));
	CHECK(rc == 0, "a 33rd job once a job's ranks left: %d %s", rc, err);
	turns(node, 1);
}

/* Submits step `seq` of `job` (COUNT zeros) and turns the loop up to 20
 * times or until it ends: its outcome, done false while it waits (for
 * s0's part, which never comes: the node's stop ends it). */
static const struct outcome *step_outcome(struct gg_node *node, const char *job, uint64_t seq)
{
	enum { STEPS = 16 };
	static float input[COUNT], result[STEPS][COUNT];
	static struct gg_node_step st[STEPS];
	static struct outcome outcome[STEPS];
	static unsigned next;
	char err[GG_NODE_ERROR_MAX];
	const unsigned k = next++ % STEPS;

	outcome[k] = (struct outcome){ 0 };
	st[k] = (struct gg_node_step){ .seq = seq, .tensor_id = 7, .count = COUNT, .dtype = GG_WIRE_F32, .input = input,
				       .result = result[k], .done = on_done, .arg = &outcome[k] };
	snprintf(st[k].job, sizeof(st[k].job), "%s", job);
	CHECK(gg_node_submit(node, &st[k], err, sizeof(err)) == 0, "step %llu of job %s: %s", (unsigned long long)seq,
	      job, err);
	for (int i = 0; i < 20 && !outcome[k].done; i++)
		turns(node, 1);
	return &outcome[k];
}

/* s0 says `msg` (len bytes) on stream 0. */
static void from_s0(struct gg_node *node, const uint8_t *msg, ssize_t len, const char *what)
{
	CHECK(len > 0 && gg_node_test_receive(node, 0, 0, msg, (size_t)len) == 0, "%s", what);
	turns(node, 3);
}

static void expect_waits(const struct outcome *o, const char *what)
{
	CHECK(!o->done, "%s: the step ended (%d: %s) where it should wait for s0's new run", what, o->status,
	      o->message);
}

/* What ended s0's run of a job while this site's ranks of it had not
 * announced a step: the job, once made, fails at once; unless its ranks
 * here connected only after (gg_node_job_opened()), making it a new run. */
static void run_marks(struct gg_node *node, const struct gg_config *cfg, struct sent *sent)
{
	uint8_t msg[512];
	const char *gone = "its ranks there are gone: rank 0 of job 'x' disconnected before its first step at site s0";
	const struct outcome *o;

	gg_node_job_opened(node, "mk-open");
	from_s0(node, msg, gg_wire_encode_end(msg, sizeof(msg), "mk-open", 1, 0, 0, (uint8_t)-GG_ERR_RANK, gone, 0),
		"END with this site's ranks connected");
	o = step_outcome(node, "mk-open", 1);
	CHECK(o->done && o->status == GG_ERR_RANK &&
		      strstr(o->message, "site s0 ended job 'mk-open' before its first step: its ranks there are gone: "
					 "rank 0 of job 'x' disconnected"),
	      "step 1 after s0's END, ranks here connected: done %d, %d: %s", o->done, o->status, o->message);
	o = step_outcome(node, "mk-open", 2);
	CHECK(o->done && o->status == GG_ERR_RANK, "step 2 after s0's END: done %d, %d: %s", o->done, o->status,
	      o->message);

	from_s0(node, msg, gg_wire_encode_end(msg, sizeof(msg), "mk-later", 1, 0, 0, (uint8_t)-GG_ERR_RANK, gone, 0),
		"END with no rank here");
	gg_node_job_opened(node, "mk-later");
	expect_waits(step_outcome(node, "mk-later", 1), "ranks connected after s0's END");

	/* s0's next run failed its step 1 before any rank here connected:
	 * the job that ABORT makes here is of that run, not of the one that
	 * ended. */
	from_s0(node, msg, gg_wire_encode_end(msg, sizeof(msg), "mk-abort", 1, 0, 0, (uint8_t)-GG_ERR_RANK, gone, 0),
		"END with no rank here");
	from_s0(node, msg,
		gg_wire_encode_abort(msg, sizeof(msg), "mk-abort", 2, 1, 1, (uint8_t)-GG_ERR_MISMATCH, "ranks disagree"),
		"ABORT of the next run's step 1");
	gg_node_job_opened(node, "mk-abort");
	o = step_outcome(node, "mk-abort", 1);
	CHECK(o->done && o->status == GG_ERR_MISMATCH, "step 1 s0 aborted: done %d, %d: %s", o->done, o->status,
	      o->message);
	expect_waits(step_outcome(node, "mk-abort", 2), "step 2 of s0's next run");

	/* Ranks here that came and went before s0's END: the ranks that
	 * come next are of a new run. */
	gg_node_job_opened(node, "mk-closed");
	gg_node_end_job_why(node, "mk-closed", NULL);
	turns(node, 3);
	from_s0(node, msg, gg_wire_encode_end(msg, sizeof(msg), "mk-closed", 1, 0, 0, (uint8_t)-GG_ERR_RANK, gone, 0),
		"END once this site's ranks left");
	gg_node_job_opened(node, "mk-closed");
	expect_waits(step_outcome(node, "mk-closed", 1), "ranks connected after s0's END, others before");

	/* Ranks here connect while a stream to s0 is down; it comes back, and
	 * s0 sends again the END of its run that ended 60 s before (which no
	 * job here heard of): not of the run of the ranks here, whether they
	 * announced a step or not. The END of their run ends it. */
	gg_node_job_opened(node, "mk-old");
	gg_node_job_opened(node, "mk-old-step");
	turns(node, 1);
	const struct outcome *waiting = step_outcome(node, "mk-old-step", 1);
	from_s0(node, msg, gg_wire_encode_end(msg, sizeof(msg), "mk-old", 3, 0, 0, (uint8_t)-GG_ERR_RANK, gone, 60000),
		"END, 60 s old, of a run before the ranks here");
	from_s0(node, msg,
		gg_wire_encode_end(msg, sizeof(msg), "mk-old-step", 3, 0, 0, (uint8_t)-GG_ERR_RANK, gone, 60000),
		"END, 60 s old, of a run before the ranks here, which announced a step");
	expect_waits(step_outcome(node, "mk-old", 1), "an END sent before this site's ranks came");
	expect_waits(waiting, "an END sent before this site's ranks came, step in progress");
	from_s0(node, msg, gg_wire_encode_end(msg, sizeof(msg), "mk-old-step", 4, 0, 0, (uint8_t)-GG_ERR_RANK, gone, 0),
		"END of the run of the ranks here");
	CHECK(waiting->done && waiting->status == GG_ERR_RANK &&
		      strstr(waiting->message, "site s0 ended job 'mk-old-step' before its first step"),
	      "step 1 after the END of s0's run: done %d, %d: %s", waiting->done, waiting->status,
	      waiting->message);

	/* The same END, of a run whose frame came here: a job here may have
	 * taken it, so the END counts whatever its age. */
	size_t l3 = 0;
	uint8_t *d3 = make_run_data(cfg, "mk-old-heard", 5, 1, 0, 1.0f, &l3);
	gg_node_job_opened(node, "mk-old-heard");
	CHECK(d3 && gg_node_test_receive(node, 0, 1, d3, l3) == 0, "DATA of mk-old-heard");
	turns(node, 3);
	from_s0(node, msg,
		gg_wire_encode_end(msg, sizeof(msg), "mk-old-heard", 5, 0, 0, (uint8_t)-GG_ERR_RANK, gone, 60000),
		"END, 60 s old, of a run whose frame came here");
	o = step_outcome(node, "mk-old-heard", 1);
	CHECK(o->done && o->status == GG_ERR_RANK &&
		      strstr(o->message, "site s0 ended job 'mk-old-heard' before its first step"),
	      "step 1 after an old END of a run heard here: done %d, %d: %s", o->done, o->status, o->message);
	free(d3);

	/* s0 restarts during its run of two jobs: one whose ranks here are
	 * connected, one whose ranks come only after s0's new instance's run
	 * of it failed its step 1. */
	size_t l1 = 0, l2 = 0;
	uint8_t *d1 = make_run_data(cfg, "mk-restart", 5, 1, 0, 1.0f, &l1);
	uint8_t *d2 = make_run_data(cfg, "mk-restart-later", 5, 1, 0, 1.0f, &l2);
	gg_node_job_opened(node, "mk-restart");
	CHECK(d1 && gg_node_test_receive(node, 0, 1, d1, l1) == 0, "DATA of mk-restart");
	CHECK(d2 && gg_node_test_receive(node, 0, 1, d2, l2) == 0, "DATA of mk-restart-later");
	turns(node, 3);
	CHECK(gg_node_test_open_stream(node, 0, 0, 43, on_sent, sent) == 0 &&
		      gg_node_test_open_stream(node, 0, 1, 43, on_sent, sent) == 0,
	      "streams of s0's new instance");
	turns(node, 3);
	from_s0(node, msg,
		gg_wire_encode_abort(msg, sizeof(msg), "mk-restart-later", 7, 1, 1, (uint8_t)-GG_ERR_MISMATCH,
				     "ranks disagree"),
		"ABORT of the new instance's step 1");
	gg_node_job_opened(node, "mk-restart-later");
	o = step_outcome(node, "mk-restart", 1);
	CHECK(o->done && o->status == GG_ERR_SITE &&
		      strstr(o->message, "site s0 restarted before any step of job 'mk-restart' completed"),
	      "step 1 after s0's restart, ranks here connected: done %d, %d: %s", o->done, o->status, o->message);
	o = step_outcome(node, "mk-restart-later", 1);
	CHECK(o->done && o->status == GG_ERR_MISMATCH, "mk-restart-later: step 1 s0 aborted: done %d, %d: %s", o->done,
	      o->status, o->message);
	expect_waits(step_outcome(node, "mk-restart-later", 2), "ranks connected after s0's restart");
	free(d1);
	free(d2);
}

/* Lines of `event` in the log, and what the lines_unlogged lines of it
 * (with `about`, "" for none), at the event's `level`, say were left out. */
static unsigned count_lines(const char *text, const char *event, const char *level, const char *about,
			    unsigned *unlogged)
{
	char key[96], held[160];
	unsigned lines = 0, n;

	snprintf(key, sizeof(key), " event=%s ", event);
	snprintf(held, sizeof(held), " level=%s event=lines_unlogged of=%s %s%scount=", level, event, about,
		 *about ? " " : "");
	*unlogged = 0;
	for (const char *p = text; (p = strstr(p, key)); p++)
		lines++;
	for (const char *p = text; (p = strstr(p, held)); p++)
		if (sscanf(p + strlen(held), "%u", &n) == 1)
			*unlogged += n;
	return lines;
}

static uint64_t now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

/* Turns the node until `us` microseconds passed. */
static void turns_for(struct gg_node *node, uint64_t us)
{
	const uint64_t until = now_us() + us;

	for (;;) {
		turns(node, 1);
		if (now_us() >= until)
			return;
		usleep(10000);
	}
}

static void run_log_flood(struct gg_node *node, const struct gg_config *cfg, struct sent *sent)
{
	enum { NAMES = 200, REPEATS = 1000, RECONNECTS = 200, TEXT = 1 << 20 };
	static const struct {
		const char *event, *level, *about;
		unsigned limit, sent; /* sent: 0 where the node decides how many (evictions) */
	} kinds[] = {
		{ "early_data_dropped", "warn", "site=s0", 64, 0 },
		{ "peer_job_ended", "info", "site=s0", 64, REPEATS },
		{ "abort_recorded", "info", "site=s0", 64, REPEATS + NAMES },
		{ "job_forgotten", "info", "", 64, 0 },
		{ "job_ended", "info", "", 64, NAMES },
		{ "stream_up", "info", "site=s0", 16, RECONNECTS },
		{ "peer_restarted", "warn", "site=s0", 16, RECONNECTS },
	};
	uint8_t msg[512];
	char job[16];
	char *text = malloc(TEXT);
	struct capture cap;

	CHECK(text, "no memory for the log");
	if (!text || !capture_start(&cap)) {
		free(text);
		return;
	}
	const uint64_t start_us = now_us();
	for (unsigned i = 0; i < NAMES; i++) {
		size_t len = 0;
		snprintf(job, sizeof(job), "d%u", i);
		uint8_t *data = make_job_data(cfg, job, 1, 0, &len);
		CHECK(data && gg_node_test_receive(node, 0, 1, data, len) == 0, "DATA of job %s", job);
		free(data);
		turns(node, 1);
	}
	for (unsigned i = 0; i < REPEATS; i++) {
		snprintf(job, sizeof(job), "e%u", i);
		from_s0(node, msg, gg_wire_encode_end(msg, sizeof(msg), job, 1, 1, 1, (uint8_t)-GG_ERR_RANK, "gone", 0),
			"END of a job never seen here");
	}
	for (unsigned i = 0; i < REPEATS + NAMES; i++) {
		snprintf(job, sizeof(job), i < REPEATS ? "flood" : "a%u", i);
		from_s0(node, msg,
			gg_wire_encode_abort(msg, sizeof(msg), job, 1, i < REPEATS ? i + 1 : 1, i < REPEATS ? i + 1 : 1,
					     (uint8_t)-GG_ERR_SITE, "flood"),
			"ABORT");
	}
	for (unsigned i = 0; i < RECONNECTS; i++) {
		CHECK(gg_node_test_open_stream(node, 0, 0, 1000 + i, on_sent, sent) == 0, "stream 0 again");
		turns(node, 1);
	}
	/* And this site's own ranks, as a local user may: 200 jobs whose ranks
	 * came and left. */
	for (unsigned i = 0; i < NAMES; i++) {
		snprintf(job, sizeof(job), "l%u", i);
		gg_node_job_opened(node, job);
		gg_node_end_job(node, job);
		turns(node, 1);
	}
	/* The seconds the floods began in end, and the node says what they left
	 * out. A slow machine (a sanitizer's) may take seconds to send them:
	 * each second that began meanwhile lets a limit's worth out. */
	const unsigned seconds = (unsigned)((now_us() - start_us) / 1000000) + 2;
	turns_for(node, 1300000);
	capture_end(&cap, text, TEXT);
	for (unsigned k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
		unsigned unlogged, lines = count_lines(text, kinds[k].event, kinds[k].level, kinds[k].about, &unlogged);
		printf("  %s: %u logged, %u left out\n", kinds[k].event, lines, unlogged);
		CHECK(lines <= seconds * kinds[k].limit, "%u lines of %s, more than %u a second in %u seconds", lines,
		      kinds[k].event, kinds[k].limit, seconds);
		CHECK(unlogged > 0, "no lines_unlogged line of %s, at %s, said what the limit left out", kinds[k].event,
		      kinds[k].level);
		if (kinds[k].sent)
			CHECK(lines + unlogged == kinds[k].sent, "%s: %u logged and %u left out, not the %u sent",
			      kinds[k].event, lines, unlogged, kinds[k].sent);
		else
			CHECK(lines + unlogged >= NAMES - 64, "%s: %u logged and %u left out, of %u names",
			      kinds[k].event, lines, unlogged, NAMES);
	}
	free(text);
}

/* Jobs come and go in batches, as a sweep's do: 32 ran a step here and
 * ended, so their entries stay while their frames may still come (a
 * heartbeat_timeout); then, twice, s0's DATA of 32 new jobs comes before
 * their ranks here announce the steps, and those jobs end too (the second
 * time, 64 ended jobs' entries are there). Every new job's frame is kept,
 * none dropped for another's, and each step completes with it. */
static void run_churn(struct gg_node *node, const struct gg_config *cfg, struct sent *sent)
{
	enum { JOBS = 32, BATCHES = 2 };
	static float result[COUNT];
	char job[16];
	uint8_t msg[512];

	for (unsigned i = 0; i < JOBS; i++) {
		snprintf(job, sizeof(job), "old%u", i);
		struct outcome o = step_with(node, cfg, sent, job, 1, 1.0f, result);
		CHECK(o.done && o.status == 0, "step 1 of %s: done %d, status %d: %s", job, o.done, o.status,
		      o.message);
		gg_node_end_job(node, job);
		turns(node, 2);
	}
	for (unsigned b = 0; b < BATCHES; b++) {
		const unsigned acks = sent->acks;
		for (unsigned i = 0; i < JOBS; i++) {
			size_t len = 0;
			snprintf(job, sizeof(job), "new%u-%u", b, i);
			uint8_t *data = make_job_data(cfg, job, 1, 0, &len);
			CHECK(data && gg_node_test_receive(node, 0, 1, data, len) == 0, "DATA of %s", job);
			free(data);
			turns(node, 1);
		}
		CHECK(sent->acks == acks, "%u of the new jobs' frames acknowledged before their steps started here",
		      sent->acks - acks);
		unsigned completed = 0;
		for (unsigned i = 0; i < JOBS; i++) {
			struct outcome o;
			struct gg_node_step st;
			snprintf(job, sizeof(job), "new%u-%u", b, i);
			submit_step1(node, &st, job, &o, result);
			turns(node, 3);
			ssize_t dl = gg_wire_encode_done(msg, sizeof(msg), job, 1, 1, NULL, NULL);
			CHECK(dl > 0 && gg_node_test_receive(node, 0, 0, msg, (size_t)dl) == 0, "DONE of %s", job);
			for (int t = 0; t < 20 && !o.done; t++)
				turns(node, 1);
			unsigned bad = 0;
			for (unsigned k = 0; k < COUNT && o.done && !o.status; k++)
				bad += result[k] != (float)k;
			completed += o.done && !o.status && !bad;
			if (!o.done) {
				/* Its frame is gone: it would wait for its deadline. */
				CHECK(gg_node_abort(node, job, 1, GG_ERR_TIMEOUT, "the frame never came") == 0,
				      "abort %s", job);
				for (int t = 0; t < 20 && !o.done; t++)
					turns(node, 1);
			}
			gg_node_end_job(node, job);
			turns(node, 2);
		}
		printf("  batch %u: %u of %u new jobs completed with the frame that came before their step\n", b + 1,
		       completed, JOBS);
		CHECK(completed == JOBS, "batch %u: %u of %u new jobs lost their peer's frame to ended jobs' entries",
		      b + 1, JOBS - completed, JOBS);
	}
}

/* More jobs end than a lane keeps entries of ended jobs for: "ghost"
 * ended here before its first step, 40 ran a step here and ended, then
 * s0's DATA of 32 new jobs came, which took the entries of the oldest.
 * - A frame of s0's run 1 of the first of the 40 comes late, and a new run
 *   of that job starts here: the frame is of no step of the new run (the
 *   coordinator knows s0's run 1 took part in a run that ended here), and
 *   the step completes with s0's run 2, exact.
 * - A frame of s0's run 1 of "ghost", of which nothing came before it
 *   ended here, comes late, and a new run of it starts here: the frame
 *   passes for the new run's, but once s0's run 2 frame comes, the step
 *   fails rather than complete with the old run's numbers. */
static void run_late_after_churn(struct gg_node *node, const struct gg_config *cfg, struct sent *sent)
{
	enum { ENDED = 40, NEW = 32 };
	static float result[COUNT];
	struct outcome o;
	struct gg_node_step st;
	char job[16];
	size_t len = 0;

	gg_node_job_opened(node, "ghost");
	gg_node_end_job(node, "ghost");
	turns(node, 2);
	for (unsigned i = 0; i < ENDED; i++) {
		snprintf(job, sizeof(job), "old%u", i);
		o = step_with(node, cfg, sent, job, 1, 1.0f, result);
		CHECK(o.done && o.status == 0, "step 1 of %s: done %d, status %d: %s", job, o.done, o.status,
		      o.message);
		gg_node_end_job(node, job);
		turns(node, 2);
	}
	for (unsigned i = 0; i < NEW; i++) {
		snprintf(job, sizeof(job), "new%u", i);
		uint8_t *data = make_job_data(cfg, job, 1, 0, &len);
		CHECK(data && gg_node_test_receive(node, 0, 1, data, len) == 0, "DATA of %s", job);
		free(data);
		turns(node, 1);
	}
	uint8_t *late = make_run_data(cfg, "old0", 1, 1, 0, 1.0f, &len);
	CHECK(late && gg_node_test_receive(node, 0, 1, late, len) == 0, "the late frame of old0's run 1");
	free(late);
	turns(node, 2);
	submit_step1(node, &st, "old0", &o, result);
	turns(node, 3);
	CHECK(!o.done, "the new run's step 1 ended on the late frame of the old run: status %d: %s", o.status,
	      o.message);
	uint8_t *data = make_run_data(cfg, "old0", 2, 1, 0, 2.0f, &len);
	CHECK(data && gg_node_test_receive(node, 0, 1, data, len) == 0, "run 2's DATA of step 1");
	free(data);
	turns(node, 5);
	complete_new_run(node, "old0", &o, result);

	late = make_run_data(cfg, "ghost", 1, 1, 0, 1.0f, &len);
	CHECK(late && gg_node_test_receive(node, 0, 1, late, len) == 0, "the late frame of ghost's run 1");
	free(late);
	turns(node, 2);
	submit_step1(node, &st, "ghost", &o, result);
	turns(node, 3);
	data = make_run_data(cfg, "ghost", 2, 1, 0, 2.0f, &len);
	CHECK(data && gg_node_test_receive(node, 0, 1, data, len) == 0, "ghost's run 2 DATA of step 1");
	free(data);
	uint8_t msg[512];
	ssize_t dl = gg_wire_encode_done(msg, sizeof(msg), "ghost", 2, 1, NULL, NULL);
	CHECK(dl > 0 && gg_node_test_receive(node, 0, 0, msg, (size_t)dl) == 0, "ghost's run 2 DONE of step 1");
	for (int t = 0; t < 50 && !o.done; t++)
		turns(node, 1);
	printf("  ghost: %s\n", o.message);
	CHECK(o.done && o.status == GG_ERR_SITE && strstr(o.message, "came from two of its runs"),
	      "a new run's step 1 with frames of two runs of s0: done %d, status %d: %s", o.done, o.status, o.message);
}

/* A PONG counts only as the answer to this site's PING: once s0
 * answered the node's PING, PONGs that answer none (value 0, or another)
 * make no round trip. */
static void run_pong(struct gg_node *node, const struct gg_config *cfg, struct sent *sent)
{
	uint8_t msg[64];
	ssize_t l;

	(void)cfg;
	for (const uint64_t until = now_us() + 3000000; !sent->pings && now_us() < until;)
		turns_for(node, 50000);
	CHECK(sent->pings, "no PING on stream 0 in 3 s");
	l = gg_wire_encode_ping(msg, sizeof(msg), GG_WIRE_PONG, sent->ping_us);
	CHECK(l > 0 && gg_node_test_receive(node, 0, 0, msg, (size_t)l) == 0, "the PONG");
	turns(node, 3);
	const uint64_t rtt = gg_node_stats(node)->rtt_us[0];
	CHECK(rtt > 0 && rtt < 3000000, "the PONG made a round trip of %llu us", (unsigned long long)rtt);
	for (uint64_t v = 0; v < 2; v++) {
		l = gg_wire_encode_ping(msg, sizeof(msg), GG_WIRE_PONG, v * 12345);
		CHECK(l > 0 && gg_node_test_receive(node, 0, 0, msg, (size_t)l) == 0, "PONG %llu",
		      (unsigned long long)(v * 12345));
		turns(node, 3);
	}
	CHECK(gg_node_stats(node)->rtt_us[0] == rtt, "unasked PONGs made a round trip of %llu us, not %llu",
	      (unsigned long long)gg_node_stats(node)->rtt_us[0], (unsigned long long)rtt);
}

/* A step whose deadline (and its grace for other sites' word) passed
 * ends in the loop's next turn: the coordinator and lane 0 share a
 * thread, and what they post each other wakes neither, so what they said
 * is heard in the same turn (the step's end waited for the next turn, up
 * to a tick away, when nothing else woke the loop). */
static void run_deadline(struct gg_node *node, const struct gg_config *cfg, struct sent *sent)
{
	static float input[COUNT], result[COUNT];
	struct outcome o = { 0 };
	char err[GG_NODE_ERROR_MAX];
	struct gg_node_step st = { .seq = 1, .tensor_id = 7, .count = COUNT, .dtype = GG_WIRE_F32, .input = input,
				   .result = result, .done = on_done, .arg = &o,
				   .deadline_us = gg_monotonic_us() + 50000, .timeout_us = 50000 };

	(void)cfg;
	(void)sent;
	snprintf(st.job, sizeof(st.job), "late");
	CHECK(gg_node_submit(node, &st, err, sizeof(err)) == 0, "submit: %s", err);
	turns(node, 3);
	CHECK(!o.done, "the step ended before its deadline: %d %s", o.status, o.message);
	while (gg_monotonic_us() < st.deadline_us + GG_NODE_DEADLINE_GRACE_US / 2)
		usleep(5000);
	turns(node, 1);
	CHECK(!o.done, "the step ended within its grace for other sites' word: %d %s", o.status, o.message);
	while (gg_monotonic_us() < st.deadline_us + GG_NODE_DEADLINE_GRACE_US + 5000)
		usleep(5000);
	turns(node, 1);
	CHECK(o.done && o.status == GG_ERR_TIMEOUT, "one turn past its deadline, the step: done %d, status %d: %s",
	      o.done, o.status, o.message);
	for (int t = 0; t < 20 && !o.done; t++)
		turns(node, 1);
}

enum scenario { ONE_COPY, LATE_COPY, AFTER_ABORT, AFTER_END, STALE_RUN, DELAYED_END, CHUNKS, FIELDS, REFUSALS, MARKS,
		JOB_TABLE, LOG_FLOOD, CHURN, LATE_AFTER_CHURN, DEADLINE, PONG, SCENARIOS };

/* Runs one of the sequences above. */
static void run(const char *cert_dir, enum scenario what)
{
	int ports[2];
	char text[4096], err[GG_NODE_ERROR_MAX];
	struct gg_config cfg;
	struct gg_node *node;
	struct sent sent = { 0 };
	size_t len = 0;

	static const char *const title[] = {
		[ONE_COPY] = "one copy on one stream",
		[LATE_COPY] = "the copy sent again comes first, the first copy late on a stream then cut",
		[AFTER_ABORT] = "DATA after the ABORT of its step",
		[AFTER_END] = "DATA of a job that ended at its sender, after its END",
		[STALE_RUN] = "a frame of a run that ended, read after its END, and a new run of the job",
		[DELAYED_END] = "the END of a peer's old run, sent again during a new run's step 1",
		[CHUNKS] = "DATA of a site that cuts the step in other chunks",
		[FIELDS] = "DATA whose tensor is not the one its fingerprint stands for",
		[REFUSALS] = "steps refused, each saying why",
		[MARKS] = "a peer's END or restart before this site's ranks announced a step",
		[JOB_TABLE] = "a full job table: idle jobs with ranks here keep their entries",
		[LOG_FLOOD] = "a peer's messages that make a log line each, far faster than jobs do",
		[CHURN] = "32 jobs ended here, then a peer's DATA of 32 new ones before their steps start here",
		[LATE_AFTER_CHURN] = "40 jobs ended, 32 came, then a late frame of an ended run and a new run of its job",
		[DEADLINE] = "a step past its deadline ends in the loop's next turn",
		[PONG] = "PONGs that answer no PING",
	};
	/* The scenarios with a sequence of their own; the others run below. */
	static void (*const sequences[SCENARIOS])(struct gg_node *, const struct gg_config *, struct sent *) = {
		[AFTER_ABORT] = run_after_abort,
		[REFUSALS] = run_refusals,
		[MARKS] = run_marks,
		[JOB_TABLE] = run_job_table,
		[LOG_FLOOD] = run_log_flood,
		[CHURN] = run_churn,
		[LATE_AFTER_CHURN] = run_late_after_churn,
		[PONG] = run_pong,
		[DEADLINE] = run_deadline,
		[AFTER_END] = run_after_end,
		[STALE_RUN] = run_stale_run,
		[DELAYED_END] = run_delayed_end,
	};
	printf("%s\n", title[what]);
	CHECK(gg_net_free_loopback_ports(ports, 2) == 0, "no free loopback ports");
	size_t n = gg_test_site_toml(text, sizeof(text), 1, 2, ports, 1, cert_dir);
	snprintf(text + n, sizeof(text) - n,
		 "[transport]\nstreams_per_peer = 2\nchunk_size = \"64KiB\"\nstep_timeout = \"5s\"\n"
		 "heartbeat_interval = \"%s\"\nheartbeat_timeout = \"%s\"\n"
		 "[compression]\ncodec = \"fp32\"\n[allreduce]\nalgorithm = \"direct\"\n"
		 "[limits]\nmax_message = \"1MiB\"\n",
		 what == AFTER_END ? "100ms" : "1s", what == AFTER_END ? "300ms" : "10s");
	if (!(node = gg_check_node_new(text, "acks.toml", &cfg)))
		return;
	/* Under CHUNKS s0 cuts the step in half the chunks this site does. */
	data_lies = what == FIELDS;
	uint8_t *data = make_data(&cfg, 1, what == CHUNKS ? (uint32_t)(cfg.transport.chunk_bytes / sizeof(float) / 2) : 0,
				  &len);
	data_lies = false;
	CHECK(data, "cannot make DATA");
	CHECK(gg_node_test_open_stream(node, 0, 0, 42, on_sent, &sent) == 0, "open stream 0");
	CHECK(gg_node_test_open_stream(node, 0, 1, 42, on_sent, &sent) == 0, "open stream 1");
	turns(node, 3);
	if (sequences[what]) {
		sequences[what](node, &cfg, &sent);
		goto out;
	}
	if (data) {
		CHECK(gg_node_test_receive(node, 0, 1, data, len) == 0, "DATA on stream 1");
		turns(node, 3);
		if (what == LATE_COPY) {
			CHECK(gg_node_test_receive(node, 0, 0, data, len) == 0, "DATA on stream 0");
			turns(node, 3);
			CHECK(gg_node_test_receive(node, 0, 0, NULL, 0) == 0, "end of stream 0");
			turns(node, 3);
		}
	}
	CHECK(sent.acks == 0, "%u ACKs before step 1 started here: a frame kept early is not acknowledged",
	      sent.acks);

	float input[COUNT] = { 0 }, result[COUNT];
	struct outcome outcome = { 0 };
	struct gg_node_step st = { .seq = 1, .tensor_id = 7, .count = COUNT, .dtype = GG_WIRE_F32, .input = input,
				   .result = result, .done = on_done, .arg = &outcome };
	snprintf(st.job, sizeof(st.job), "acks");
	CHECK(gg_node_submit(node, &st, err, sizeof(err)) == 0, "submit: %s", err);
	turns(node, 10);
	if (what == CHUNKS) {
		printf("  %s\n", outcome.message);
		CHECK(outcome.done && outcome.status == GG_ERR_MISMATCH &&
			      strstr(outcome.message, "step 1 of job 'acks': site s0 cuts it in other chunks than site "
						      "s1 "),
		      "a step cut in other chunks by the peer: done %d, status %d: %s", outcome.done, outcome.status,
		      outcome.message);
	} else if (what == FIELDS) {
		printf("  %s\n", outcome.message);
		CHECK(outcome.done && outcome.status == GG_ERR_MISMATCH &&
			      strstr(outcome.message, "step 1 of job 'acks': site s0 announced tensor 8 with 1000 "
						      "elements of float32, site s1 tensor 7 with 1000 elements of float32"),
		      "DATA whose fields disagree with its fingerprint: done %d, status %d: %s", outcome.done,
		      outcome.status, outcome.message);
	} else {
		CHECK(!outcome.done, "step 1 ended with s0's frame alone: %d %s", outcome.status, outcome.message);
	}
	CHECK(sent.acks == 1, "%u ACKs of the kept frame, not 1", sent.acks);
	if (sent.acks >= 1)
		CHECK(sent.ack[0].stream == 1 && sent.ack[0].step == 1 && sent.ack[0].id.origin == 0 &&
			      sent.ack[0].id.chunk == 0,
		      "the ACK went on stream %u (step %llu, origin %u, chunk %u), not on stream 1 where the sender "
		      "still waits for it",
		      sent.ack[0].stream, (unsigned long long)sent.ack[0].step, sent.ack[0].id.origin,
		      sent.ack[0].id.chunk);
out:
	gg_node_shutdown(node);
	for (int spins = 0; spins < 100 && !gg_node_idle(node); spins++)
		turns(node, 1);
	gg_node_free(node);
	gg_config_free(&cfg);
	free(data);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s CERT_DIR\n", argv[0]);
		return 2;
	}
	gg_log_set_level(GG_LOG_ERROR);
	setvbuf(stdout, NULL, _IOLBF, 0);
	run(argv[1], ONE_COPY);
	run(argv[1], LATE_COPY);
	run(argv[1], AFTER_ABORT);
	run(argv[1], AFTER_END);
	run(argv[1], STALE_RUN);
	run(argv[1], DELAYED_END);
	run(argv[1], CHUNKS);
	run(argv[1], FIELDS);
	run(argv[1], REFUSALS);
	run(argv[1], MARKS);
	run(argv[1], JOB_TABLE);
	run(argv[1], LOG_FLOOD);
	run(argv[1], CHURN);
	run(argv[1], LATE_AFTER_CHURN);
	run(argv[1], DEADLINE);
	run(argv[1], PONG);
	printf("node acks: %d failure(s)\n", failures);
	return failures ? 1 : 0;
}
