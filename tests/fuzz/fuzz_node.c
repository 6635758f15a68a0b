/* libFuzzer target: the step engine of one gateway (node.c, lane.c, plan.c, allreduce.c)
 * and the mesh's handling of what arrives (mesh.c, wire.c), driven by a
 * script (fuzz_script.h) in which the input plays the peer gateways and
 * the local side: steps submitted, aborted and ended here, streams opened
 * and closed, DATA, ACK, DONE, ABORT, END, PING and HELLO from peers in any
 * order, and the clock jumping ahead. Streams have no socket behind them
 * (gg_node_test_open_stream), so a turn of the node runs everything a
 * message causes.
 *
 * Checks: every message the node sends is well formed (its frames too);
 * every step submitted ends exactly once, with a valid code and a message
 * when it failed, and having gathered and delivered every element when it
 * completed; once the steps are stopped they all end within a few turns;
 * and nothing leaks. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "allreduce.h"
#include "frame.h"
#include "fuzz_check.h"
#include "fuzz_script.h"
#include "gradgate.h"
#include "log.h"
#include "node.h"
#include "tls_pki.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define JOBS 3
#define MAX_STEPS 8
#define MAX_COUNT 6000u  /* elements: a few 4 KiB chunks */
#define MAX_OPS 200
#define SENT_KEPT 32

struct config_variant {
	unsigned sites, streams;
	const char *algo, *codec;
	int zstd_level;
	bool feedback;
};

static const struct config_variant variants[] = {
	{ 2, 1, "direct", "fp32", 0, false },
	{ 3, 2, "ring", "fp32", 0, false },
	{ 3, 1, "direct", "int8", 1, true },
	{ 2, 2, "ring", "bf16-split", 1, false },
	{ 3, 1, "ring", "int4", 0, true },
	{ 2, 1, "direct", "bf16", 0, false },
};
#define VARIANTS (sizeof(variants) / sizeof(variants[0]))

struct variant_state {
	struct gg_config cfg;
	struct gg_frame_encoder enc; /* frames as a peer would make them */
	struct gg_frame_decoder dec; /* to check the node's */
	uint32_t chunk_elems;
};

static struct variant_state vstate[VARIANTS];
static char dir[64];
static bool verbose; /* GG_FUZZ_VERBOSE set: how each step ended */

struct step {
	struct gg_node_step st;
	bool live, done;
	float *input, *result;
	uint64_t gathered, delivered;
};

struct sent_data {
	unsigned peer;
	char job[GG_WIRE_NAME_MAX + 1];
	uint64_t run, step;
	struct gg_ar_chunk_id id;
};

/* One input's run. */
struct run {
	const struct config_variant *v;
	struct variant_state *vs;
	struct gg_node *node;
	struct step steps[MAX_STEPS];
	struct job_state {
		uint64_t seq; /* the last step submitted */
		uint32_t tensor;
		uint64_t count;
		uint8_t dtype;
	} jobs[JOBS];
	struct sent_data sent[SENT_KEPT];
	unsigned nsent;
	uint64_t last_ping;
	uint64_t ends[JOBS]; /* ENDs the peers sent of each job: their run is 1 + that */
};

static const char *const job_names[JOBS] = { "j0", "j1", "train.run-2" };

static _Noreturn void die(const char *what)
{
	fuzz_fail("fuzz_node", what);
}

/* ---- set-up, once per process --------------------------------------------- */

static void remove_dir(void)
{
	static const char *const files[] = { "ca.pem", "cert.pem", "key.pem" };
	char path[128];

	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
		unlink(path);
	}
	rmdir(dir);
}

static void write_file(const char *name, const char *text, mode_t mode)
{
	char path[128];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	if (!(f = fopen(path, "w")) || fputs(text, f) < 0 || fclose(f) || chmod(path, mode))
		die("cannot write the certificates");
}

static void make_certs(const char *self)
{
	struct gg_tls_pki *pki;
	char identity[64], *cert = NULL, *key = NULL;

	snprintf(dir, sizeof(dir), "/tmp/gg-fuzz-node.XXXXXX");
	if (!mkdtemp(dir))
		die("mkdtemp");
	atexit(remove_dir);
	snprintf(identity, sizeof(identity), "dns:%s.gradgate.test", self);
	struct gg_tls_cert_request req = { .identity = identity };
	if (gg_tls_pki_new("fuzz CA", &pki) || gg_tls_pki_issue(pki, &req, &cert, &key))
		die("cannot make certificates");
	write_file("ca.pem", gg_tls_pki_ca_pem(pki), 0644);
	write_file("cert.pem", cert, 0644);
	write_file("key.pem", key, 0600);
	free(cert);
	free(key);
	gg_tls_pki_free(pki);
}

static void load_variant(const struct config_variant *v, struct variant_state *vs)
{
	char text[2048];
	size_t n = 0;
	struct gg_diag diag = { 0 };

	n += (size_t)snprintf(text + n, sizeof(text) - n,
			      "[site]\nname = \"s%u\"\nlisten = \"127.0.0.1:1\"\nthreads = 1\n"
			      "[tls]\nca = \"%s/ca.pem\"\ncert = \"%s/cert.pem\"\nkey = \"%s/key.pem\"\n",
			      v->sites - 1, dir, dir, dir);
	for (unsigned p = 0; p + 1 < v->sites; p++)
		n += (size_t)snprintf(text + n, sizeof(text) - n,
				      "[[peers]]\nsite = \"s%u\"\naddress = \"127.0.0.1:%u\"\n"
				      "identity = \"dns:s%u.gradgate.test\"\n", p, 9 + p, p);
	snprintf(text + n, sizeof(text) - n,
		 "[transport]\nstreams_per_peer = %u\nchunk_size = \"4KiB\"\nstep_timeout = \"2s\"\n"
		 "[compression]\ncodec = \"%s\"\nblock_size = 64\nzstd_level = %d\nerror_feedback = %s\n"
		 "[allreduce]\nalgorithm = \"%s\"\n"
		 "[limits]\nmax_message = \"64KiB\"\ninflight_per_peer = \"64KiB\"\nmemory = \"64MiB\"\n",
		 v->streams, v->codec, v->zstd_level, v->feedback ? "true" : "false", v->algo);
	if (gg_config_load_text(text, strlen(text), "fuzz-node.toml", NULL, &vs->cfg, &diag)) {
		gg_diag_print(&diag, stderr);
		die("bad configuration");
	}
	/* Port 0: every run listens on a port of its own. */
	free(vs->cfg.site.listen);
	if (!(vs->cfg.site.listen = strdup("127.0.0.1:0")))
		die("out of memory");

	/* The frame settings a node derives from the configuration. */
	const struct gg_config *cfg = &vs->cfg;
	vs->chunk_elems = (uint32_t)(cfg->transport.chunk_bytes / sizeof(float)) / GG_CODEC_BLOCK_ALIGN_ELEMS *
			  GG_CODEC_BLOCK_ALIGN_ELEMS;
	struct gg_frame_config fc = { .codec = gg_codec_defaults(cfg->compression.codec),
				      .zstd = cfg->compression.zstd_level > 0,
				      .zstd_level = cfg->compression.zstd_level > 0 ? cfg->compression.zstd_level : 1,
				      .max_elems = vs->chunk_elems };
	if (gg_codec_has_blocks(cfg->compression.codec)) {
		fc.codec.block_elems = (uint32_t)cfg->compression.block_size;
		fc.codec.scale = cfg->compression.scale;
	}
	uint64_t bound;
	if (gg_frame_bound(&fc.codec, vs->chunk_elems, &bound) || gg_frame_encoder_init(&vs->enc, &fc))
		die("frame encoder");
	struct gg_frame_limits lim = { .max_elems = vs->chunk_elems, .max_raw_bytes = bound };
	if (gg_frame_decoder_init(&vs->dec, &lim))
		die("frame decoder");
}

static void setup(void)
{
	static bool ready;

	if (ready)
		return;
	/* Formatting log lines runs; writing them would drown the output. */
	verbose = getenv("GG_FUZZ_VERBOSE");
	gg_log_set_level(verbose ? GG_LOG_DEBUG : GG_LOG_NONE);
	make_certs("node");
	for (size_t i = 0; i < VARIANTS; i++)
		load_variant(&variants[i], &vstate[i]);
	ready = true;
}

/* ---- what the node does ----------------------------------------------------- */

static void on_step_done(void *arg, struct gg_node_step *st, int status, const char *message)
{
	struct step *s = arg;

	if (&s->st != st || !s->live || s->done)
		die("done called for a step that is not in progress");
	if (status > 0 || status < GG_ERR_LIMIT)
		die("a step ended with a code outside enum gg_errc");
	if (status && (!message || !*message || strchr(message, '\n')))
		die("a failed step has no one-line message");
	if (!status && (s->gathered != st->count || (s->delivered != st->count)))
		die("a step completed without gathering and delivering every element");
	s->done = true;
	if (verbose)
		fprintf(stderr, "step %llu of job %s: %d %s\n", (unsigned long long)st->seq, st->job, status,
			message ? message : "");
}

/* Counts a range gathered or delivered: inside the tensor, each element once. */
static void count_range(const struct step *s, uint64_t *total, uint64_t offset, uint64_t n)
{
	if (s->done || offset > s->st.count || n > s->st.count - offset)
		die("a range gathered or delivered is out of range, or after the end");
	*total += n;
	if (*total > s->st.count)
		die("an element gathered or delivered twice");
}

static void on_gather(void *arg, uint64_t offset, uint64_t n)
{
	struct step *s = arg;

	count_range(s, &s->gathered, offset, n);
}

static void on_deliver(void *arg, uint64_t offset, uint64_t n)
{
	struct step *s = arg;

	count_range(s, &s->delivered, offset, n);
}

/* Every message the node writes must be one a peer accepts. */
static void on_sent(void *arg, unsigned peer, unsigned stream, const uint8_t *head, size_t head_len,
		    const uint8_t *frame, size_t frame_len)
{
	struct run *r = arg;
	uint8_t *msg = malloc(head_len + frame_len + 1);
	enum gg_wire_type type;
	size_t payload;
	struct gg_wire_msg m;
	char err[256] = "the node sent a message its peers refuse";

	(void)stream;
	if (!msg)
		return;
	memcpy(msg, head, head_len);
	if (frame_len)
		memcpy(msg + head_len, frame, frame_len);
	if (head_len < GG_WIRE_HEADER_BYTES || gg_wire_parse_header(msg, SIZE_MAX, &type, &payload, err, sizeof(err)) ||
	    payload != head_len + frame_len - GG_WIRE_HEADER_BYTES ||
	    gg_wire_decode(type, msg + GG_WIRE_HEADER_BYTES, payload, &m, err, sizeof(err)))
		die(err);
	if (type == GG_WIRE_DATA) {
		struct gg_frame_info info;
		const uint8_t *raw;
		if (gg_frame_unwrap(&r->vs->dec, m.u.data.frame, m.u.data.frame_bytes, &info, &raw, err, sizeof(err)))
			die(err);
		struct sent_data *d = &r->sent[r->nsent++ % SENT_KEPT];
		d->peer = peer;
		snprintf(d->job, sizeof(d->job), "%s", m.u.data.step.job);
		d->run = m.u.data.step.run;
		d->step = m.u.data.step.step;
		d->id = m.u.data.id;
	} else if (type == GG_WIRE_PING) {
		r->last_ping = m.u.ping_us;
	}
	free(msg);
}

/* ---- the script ------------------------------------------------------------- */

static void turn(struct run *r)
{
	if (gg_node_run_once(r->node, 0, NULL, NULL))
		die("the node's ring broke");
}

static unsigned pick_peer(struct run *r, struct script *s)
{
	return script_u8(s) % (r->v->sites - 1);
}

static unsigned pick_stream(struct run *r, struct script *s)
{
	return script_u8(s) % r->v->streams;
}

static unsigned pick_job(struct script *s)
{
	return script_u8(s) % JOBS;
}

static uint64_t pick_seq(struct run *r, unsigned job, struct script *s)
{
	return r->jobs[job].seq + (uint64_t)(int64_t)(int8_t)script_u8(s);
}

/* Error codes as the wire carries them: mostly valid, sometimes not. */
static uint8_t pick_code(struct script *s)
{
	uint8_t c = script_u8(s);

	return c < 0xf0 ? (uint8_t)(1 + c % GG_WIRE_CODE_MAX) : c;
}

static void receive(struct run *r, unsigned peer, unsigned stream, const uint8_t *bytes, size_t len)
{
	/* -ENOTCONN when the stream is not open: what a peer sends then is lost. */
	(void)!gg_node_test_receive(r->node, peer, stream, bytes, len);
}

static void op_submit(struct run *r, struct script *s)
{
	unsigned job = pick_job(s);
	uint64_t seq = r->jobs[job].seq + script_u8(s);
	uint32_t tensor = script_u8(s) % 4;
	uint64_t count = 1 + script_u16(s) % MAX_COUNT;
	uint8_t dtype = 1 + script_u8(s) % 2;
	uint16_t timeout_ms = script_u16(s);
	struct step *st = NULL;
	char err[GG_NODE_ERROR_MAX];

	for (unsigned i = 0; i < MAX_STEPS && !st; i++) {
		if (r->steps[i].live && r->steps[i].done) {
			free(r->steps[i].input);
			free(r->steps[i].result);
			memset(&r->steps[i], 0, sizeof(r->steps[i]));
		}
		if (!r->steps[i].live)
			st = &r->steps[i];
	}
	if (!st)
		return;
	st->input = malloc(count * sizeof(float));
	st->result = malloc(count * sizeof(float));
	if (!st->input || !st->result) {
		free(st->input);
		free(st->result);
		st->input = st->result = NULL;
		return;
	}
	for (uint64_t i = 0; i < count; i++)
		st->input[i] = (float)((int)(i % 13) - 6) * 0.5f;
	st->st = (struct gg_node_step){ .seq = seq, .tensor_id = tensor, .count = count, .dtype = dtype,
					.input = st->input, .result = st->result, .done = on_step_done,
					.gather = on_gather, .deliver = on_deliver, .arg = st };
	snprintf(st->st.job, sizeof(st->st.job), "%s", job_names[job]);
	if (timeout_ms) {
		st->st.deadline_us = gg_node_loop(r->node)->now_us + timeout_ms * 1000ull;
		st->st.timeout_us = timeout_ms * 1000ull;
	}
	st->live = true;
	r->jobs[job].seq = seq;
	r->jobs[job].tensor = tensor;
	r->jobs[job].count = count;
	r->jobs[job].dtype = dtype;
	if (gg_node_submit(r->node, &st->st, err, sizeof(err))) {
		if (st->done)
			die("done called for a step that submit refused");
		free(st->input);
		free(st->result);
		memset(st, 0, sizeof(*st));
	}
}

static void op_data(struct run *r, struct script *s)
{
	unsigned peer = pick_peer(r, s), stream = pick_stream(r, s), job = pick_job(s);
	uint64_t seq = pick_seq(r, job, s);
	uint8_t flags = script_u8(s);
	struct gg_ar_chunk_id id = { .phase = script_u8(s) % 4, .origin = script_u8(s) % r->v->sites,
				     .chunk = script_u8(s) % 8 };
	unsigned values = script_u8(s);
	struct gg_wire_step ws = { .run = 1 + r->ends[job], .step = seq, .count = r->jobs[job].count,
				   .tensor_id = r->jobs[job].tensor, .dtype = r->jobs[job].dtype };
	const struct gg_config *cfg = &r->vs->cfg;

	snprintf(ws.job, sizeof(ws.job), "%s", job_names[job]);
	if (flags & NODE_DATA_COUNT)
		ws.count = 1 + script_u16(s) % MAX_COUNT;
	ws.fingerprint = gg_node_fingerprint(cfg, &ws, (uint8_t)cfg->allreduce.algorithm, r->vs->chunk_elems);
	if (flags & NODE_DATA_FINGERPRINT)
		ws.fingerprint = script_u64(s);

	/* A frame of the chunk's size when the chunk exists, of any size else. */
	struct gg_ar_config ac = { .sites = r->v->sites, .self = r->v->sites - 1, .algo = cfg->allreduce.algorithm,
				   .count = ws.count ? ws.count : 1, .chunk_elems = r->vs->chunk_elems };
	uint64_t offset, n;
	if (!gg_ar_chunk_range(&ac, &id, &offset, &n))
		n = values % (r->vs->chunk_elems + 1);
	float *x = malloc((n ? n : 1) * sizeof(float));
	size_t cap = GG_WIRE_HEADER_BYTES + GG_WIRE_DATA_FIXED_BYTES + 64 + 8 * n + 4096, head, fb;
	uint8_t *msg = malloc(cap);
	if (!x || !msg)
		goto out;
	for (uint64_t i = 0; i < n; i++)
		x[i] = (float)((int)((i * (values | 1)) % 29) - 14) * 0.125f;
	if ((flags & NODE_DATA_SPECIAL) && n) {
		x[0] = 1.0f / 0.0f;
		x[n / 2] = -x[0];
		x[n - 1] = x[0] - x[0];
	}
	ssize_t hl = gg_wire_encode_data_head(msg, cap, &ws, &id, 0);
	if (hl < 0 || gg_frame_encode(&r->vs->enc, x, (size_t)n, msg + hl, cap - (size_t)hl, &fb))
		goto out;
	head = (size_t)hl;
	/* The header's length is the whole payload's. */
	if (gg_wire_encode_data_head(msg, cap, &ws, &id, fb) != hl)
		goto out;
	uint16_t corrupt = flags & NODE_DATA_CORRUPT ? script_u16(s) : 0;
	uint16_t split = flags & NODE_DATA_SPLIT ? script_u16(s) : 0;
	if (flags & NODE_DATA_CORRUPT)
		msg[head + corrupt % fb] ^= (uint8_t)(1u << (corrupt >> 13));
	size_t first = split % (head + fb + 1);
	receive(r, peer, stream, msg, first);
	receive(r, peer, stream, msg + first, head + fb - first);
out:
	free(x);
	free(msg);
}

static void op_ack(struct run *r, struct script *s)
{
	unsigned peer = pick_peer(r, s), stream = pick_stream(r, s);
	unsigned index = script_u8(s);
	uint8_t flags = script_u8(s);
	uint8_t buf[256];
	struct sent_data d = { 0 };

	if (r->nsent)
		d = r->sent[(r->nsent - 1 - index % GG_MIN(r->nsent, SENT_KEPT)) % SENT_KEPT];
	if (flags & NODE_ACK_FIELDS) {
		unsigned job = pick_job(s);
		snprintf(d.job, sizeof(d.job), "%s", job_names[job]);
		d.step = pick_seq(r, job, s);
		d.id = (struct gg_ar_chunk_id){ .phase = script_u8(s), .origin = script_u8(s), .chunk = script_u8(s) };
	}
	if (!d.job[0])
		snprintf(d.job, sizeof(d.job), "%s", job_names[0]);
	if (!d.run)
		d.run = 1;
	ssize_t len = gg_wire_encode_ack(buf, sizeof(buf), d.job, d.run, d.step, &d.id);
	if (len > 0)
		receive(r, peer, stream, buf, (size_t)len);
}

static void op_steps_message(struct run *r, struct script *s, enum node_op op)
{
	unsigned peer = pick_peer(r, s), stream = pick_stream(r, s), job = pick_job(s);
	uint64_t seq = pick_seq(r, job, s);
	uint8_t buf[512];
	ssize_t len;

	if (op == NODE_DONE) {
		/* A plan from whichever site, for whichever size; the script's
		 * bytes read one statement at a time, in a fixed order. */
		struct gg_wire_links links = { 0 };
		struct gg_wire_plan plan = { 0 };
		links.uplink_bytes_per_s = (uint64_t)script_u8(s) << 20;
		links.rtt_us = (uint32_t)script_u8(s) << 10;
		uint8_t flags = script_u8(s);
		plan.has_plan = flags & 1;
		plan.probe = flags >> 1 & 1;
		plan.direct_max = (uint64_t)script_u8(s) << 12;
		plan.links = links;
		/* Bit 2: the word of a site that completed the step; bit 3: a
		 * site that asks for it. */
		len = (flags & 4 ? gg_wire_encode_completed
			: flags & 8 ? gg_wire_encode_done_asking
				    : gg_wire_encode_done)(buf, sizeof(buf), job_names[job], 1 + r->ends[job], seq, &links,
							   &plan);
	} else {
		uint64_t last = seq + script_u8(s);
		const uint8_t code_byte = script_peek(s);
		uint8_t code = pick_code(s);
		char reason[256];
		script_text(s, reason, sizeof(reason));
		if (op == NODE_ABORT) {
			len = gg_wire_encode_abort(buf, sizeof(buf), job_names[job], 1 + r->ends[job], seq, last, code,
						   reason);
		} else {
			/* The peers' next words of the job are of a new run. */
			len = gg_wire_encode_end(buf, sizeof(buf), job_names[job], 1 + r->ends[job]++, seq, last, code,
						 reason, (code_byte >> 4) * 1500u);
		}
	}
	if (len > 0)
		receive(r, peer, stream, buf, (size_t)len);
}

static void op_ping(struct run *r, struct script *s)
{
	unsigned peer = pick_peer(r, s), stream = pick_stream(r, s);
	bool pong = script_u8(s) & 1;
	uint64_t value = script_u64(s);
	uint8_t buf[64];

	if (pong && !value)
		value = r->last_ping;
	ssize_t len = gg_wire_encode_ping(buf, sizeof(buf), pong ? GG_WIRE_PONG : GG_WIRE_PING, value);
	if (len > 0)
		receive(r, peer, stream, buf, (size_t)len);
}

static void op_hello(struct run *r, struct script *s)
{
	unsigned peer = pick_peer(r, s), stream = pick_stream(r, s);
	struct gg_wire_hello h = { .stream_index = script_u16(s), .streams = (uint16_t)r->v->streams,
				   .instance_id = 1, .sites = (uint8_t)r->v->sites, .inflight_bytes = 256u << 20 };
	uint8_t buf[1024];

	for (unsigned i = 0; i < r->v->sites; i++)
		snprintf(h.site_names[i], sizeof(h.site_names[i]), "s%u", i);
	ssize_t len = gg_wire_encode_hello(buf, sizeof(buf), &h);
	if (len > 0)
		receive(r, peer, stream, buf, (size_t)len);
}

static void op(struct run *r, struct script *s)
{
	unsigned peer, stream, job;
	char reason[256];
	size_t len;
	const uint8_t *bytes;

	enum node_op what = (enum node_op)(script_u8(s) % NODE_OPS);

	switch (what) {
	case NODE_SUBMIT:
		op_submit(r, s);
		break;
	case NODE_OPEN:
		peer = pick_peer(r, s);
		stream = pick_stream(r, s);
		/* -ENOMEM and -EBUSY leave the stream closed, as a failed accept would. */
		(void)!gg_node_test_open_stream(r->node, peer, stream, 1 + script_u8(s), on_sent, r);
		break;
	case NODE_RAW:
		peer = pick_peer(r, s);
		stream = pick_stream(r, s);
		bytes = script_bytes(s, script_u16(s), &len);
		receive(r, peer, stream, bytes, len);
		break;
	case NODE_DATA:
		op_data(r, s);
		break;
	case NODE_ACK:
		op_ack(r, s);
		break;
	case NODE_DONE:
	case NODE_ABORT:
	case NODE_END:
		op_steps_message(r, s, what);
		break;
	case NODE_PING:
		op_ping(r, s);
		break;
	case NODE_HELLO:
		op_hello(r, s);
		break;
	case NODE_CLOSE:
		peer = pick_peer(r, s);
		stream = pick_stream(r, s);
		receive(r, peer, stream, NULL, 0);
		break;
	case NODE_RUN:
		for (unsigned i = script_u8(s) % 8; i > 0; i--)
			turn(r);
		break;
	case NODE_TIME:
		gg_node_loop(r->node)->test_skew_us += script_u16(s) * 1000ull;
		break;
	case NODE_LOCAL_ABORT:
		job = pick_job(s);
		{
			uint64_t seq = pick_seq(r, job, s);
			int code = -(int)(1 + script_u8(s) % 15);
			script_text(s, reason, sizeof(reason));
			/* -EALREADY: the step's outcome is the peers' to say. */
			(void)!gg_node_abort(r->node, job_names[job], seq, code, reason);
		}
		break;
	case NODE_LOCAL_END: {
		/* Opening shares the op, so that inputs from before it keep
		 * their meaning (as NODE_END's age shares the code's byte). */
		const bool open = script_peek(s) >= 0xe0;
		job = pick_job(s);
		if (open)
			gg_node_job_opened(r->node, job_names[job]);
		else
			gg_node_end_job(r->node, job_names[job]);
		break;
	}
	case NODE_STOP:
		gg_node_stop_steps(r->node);
		break;
	case NODE_OPS:
		break;
	}
	turn(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct script s = { data, size };
	static struct run r;
	char err[GG_NODE_ERROR_MAX];

	setup();
	memset(&r, 0, sizeof(r));
	size_t v = script_u8(&s) % VARIANTS;
	r.v = &variants[v];
	r.vs = &vstate[v];
	for (unsigned j = 0; j < JOBS; j++) /* what DATA for a step not submitted yet announces */
		r.jobs[j] = (struct job_state){ .tensor = 7, .count = 1000, .dtype = GG_WIRE_F32 };
	if (gg_node_new(&r.vs->cfg, &r.node, err, sizeof(err)))
		return 0; /* out of memory, or of file descriptors */
	for (unsigned i = 0; i < MAX_OPS && script_more(&s); i++)
		op(&r, &s);

	/* Stopped, every step ends within a few turns. */
	gg_node_stop_steps(r.node);
	for (unsigned i = 0; i < 16; i++)
		turn(&r);
	for (unsigned i = 0; i < MAX_STEPS; i++)
		if (r.steps[i].live && !r.steps[i].done)
			die("a step never ended");
	gg_node_free(r.node);
	for (unsigned i = 0; i < MAX_STEPS; i++) {
		free(r.steps[i].input);
		free(r.steps[i].result);
	}
	return 0;
}
