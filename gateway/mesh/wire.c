#include "wire.h"

#include "codec.h"
#include "config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ---- little-endian cursor --------------------------------------------- */

struct writer {
	uint8_t *p, *end;
	bool overflow;
};

static void put(struct writer *w, const void *src, size_t n)
{
	if ((size_t)(w->end - w->p) < n) {
		w->overflow = true;
		return;
	}
	memcpy(w->p, src, n);
	w->p += n;
}

static void put_u8(struct writer *w, uint8_t v)
{
	put(w, &v, 1);
}

static void put_le(struct writer *w, uint64_t v, unsigned bytes)
{
	uint8_t b[8];
	for (unsigned i = 0; i < bytes; i++)
		b[i] = (uint8_t)(v >> (8 * i));
	put(w, b, bytes);
}

/* Control bytes go out as '?': a reason may quote what a rank or a peer
 * said, and the receiver refuses a string that holds them (get_str). */
static void put_str(struct writer *w, const char *s)
{
	size_t n = strnlen(s, GG_WIRE_REASON_MAX);
	put_u8(w, (uint8_t)n);
	for (size_t i = 0; i < n; i++)
		put_u8(w, (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? '?' : (uint8_t)s[i]);
}

struct reader {
	const uint8_t *p, *end;
	const char *field; /* the first field that did not fit */
};

static bool get(struct reader *r, void *dst, size_t n, const char *field)
{
	if (r->field)
		return false;
	if ((size_t)(r->end - r->p) < n) {
		r->field = field;
		return false;
	}
	memcpy(dst, r->p, n);
	r->p += n;
	return true;
}

static uint64_t get_le(struct reader *r, unsigned bytes, const char *field)
{
	uint8_t b[8] = { 0 };
	uint64_t v = 0;
	if (!get(r, b, bytes, field))
		return 0;
	for (unsigned i = 0; i < bytes; i++)
		v |= (uint64_t)b[i] << (8 * i);
	return v;
}

/* A length-prefixed string of at most `max` bytes, no NUL or control bytes. */
static bool get_str(struct reader *r, char *dst, size_t max, const char *field)
{
	uint8_t n = (uint8_t)get_le(r, 1, field);
	if (r->field)
		return false;
	if (n > max || !get(r, dst, n, field)) {
		r->field = field;
		return false;
	}
	dst[n] = '\0';
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)dst[i] < 0x20 || dst[i] == 0x7f) {
			r->field = field;
			return false;
		}
	return true;
}

/* ---- encoding ----------------------------------------------------------- */

static void put_header(struct writer *w, enum gg_wire_type type, size_t payload)
{
	put_le(w, GG_WIRE_MAGIC, 4);
	put_u8(w, (uint8_t)type);
	put_u8(w, GG_WIRE_VERSION);
	put_le(w, 0, 2);
	put_le(w, payload, 4);
}

/* Writes the payload after room for the header, then the header, whose
 * length counts `extra_` bytes the caller sends right after (DATA's frame). */
#define ENCODE(buf, cap, type, body)                                         \
	do {                                                                 \
		if ((cap) < GG_WIRE_HEADER_BYTES)                            \
			return -ENOBUFS;                                     \
		struct writer w = { buf + GG_WIRE_HEADER_BYTES, buf + cap, false }; \
		body;                                                        \
		if (w.overflow)                                              \
			return -ENOBUFS;                                     \
		size_t n_ = (size_t)(w.p - buf);                             \
		if (n_ - GG_WIRE_HEADER_BYTES + extra_ > UINT32_MAX)         \
			return -EMSGSIZE;                                    \
		struct writer h = { buf, buf + GG_WIRE_HEADER_BYTES, false }; \
		put_header(&h, type, n_ - GG_WIRE_HEADER_BYTES + extra_);    \
		return (ssize_t)n_;                                          \
	} while (0)

ssize_t gg_wire_encode_hello(uint8_t *buf, size_t cap, const struct gg_wire_hello *hl)
{
	size_t extra_ = 0;
	ENCODE(buf, cap, GG_WIRE_HELLO, {
		put_le(&w, hl->stream_index, 2);
		put_le(&w, hl->streams, 2);
		put_le(&w, hl->instance_id, 8);
		put_u8(&w, hl->sites);
		for (unsigned i = 0; i < hl->sites && i < GG_AR_MAX_SITES; i++)
			put_str(&w, hl->site_names[i]);
		put_u8(&w, hl->codec);
		put_u8(&w, hl->scale);
		put_le(&w, hl->block_elems, 4);
		put_u8(&w, hl->algorithm);
		put_le(&w, hl->chunk_elems, 4);
		put_u8(&w, hl->zstd);
		put_le(&w, hl->inflight_bytes, 8);
	});
}

ssize_t gg_wire_encode_data_head(uint8_t *buf, size_t cap, const struct gg_wire_step *st,
				 const struct gg_ar_chunk_id *id, size_t frame_bytes)
{
	size_t extra_ = frame_bytes;
	ENCODE(buf, cap, GG_WIRE_DATA, {
		put_str(&w, st->job);
		put_le(&w, st->run, 8);
		put_le(&w, st->step, 8);
		put_le(&w, st->count, 8);
		put_le(&w, st->tensor_id, 4);
		put_u8(&w, st->dtype);
		put_le(&w, st->fingerprint, 8);
		put_u8(&w, id->phase);
		put_u8(&w, id->origin);
		put_le(&w, id->chunk, 4);
	});
}

ssize_t gg_wire_encode_ack(uint8_t *buf, size_t cap, const char *job, uint64_t run, uint64_t step,
			   const struct gg_ar_chunk_id *id)
{
	size_t extra_ = 0;
	ENCODE(buf, cap, GG_WIRE_ACK, {
		put_str(&w, job);
		put_le(&w, run, 8);
		put_le(&w, step, 8);
		put_u8(&w, id->phase);
		put_u8(&w, id->origin);
		put_le(&w, id->chunk, 4);
	});
}

ssize_t gg_wire_encode_ping(uint8_t *buf, size_t cap, enum gg_wire_type type, uint64_t value)
{
	size_t extra_ = 0;
	ENCODE(buf, cap, type, { put_le(&w, value, 8); });
}

/* ABORT, and END, which adds its age. */
static ssize_t encode_steps(uint8_t *buf, size_t cap, enum gg_wire_type type, const char *job, uint64_t run,
			    uint64_t first, uint64_t last, uint8_t code, const char *reason, uint32_t age_ms)
{
	size_t extra_ = 0;
	ENCODE(buf, cap, type, {
		put_str(&w, job);
		put_le(&w, run, 8);
		put_le(&w, first, 8);
		put_le(&w, last, 8);
		put_le(&w, code, 1);
		put_str(&w, reason);
		if (type == GG_WIRE_END)
			put_le(&w, age_ms, 4);
	});
}

ssize_t gg_wire_encode_abort(uint8_t *buf, size_t cap, const char *job, uint64_t run, uint64_t step,
			     uint64_t last_step, uint8_t code, const char *reason)
{
	return encode_steps(buf, cap, GG_WIRE_ABORT, job, run, step, last_step, code, reason, 0);
}

static void put_links(struct writer *w, const struct gg_wire_links *l)
{
	put_le(w, l ? l->uplink_bytes_per_s : 0, 8);
	put_le(w, l ? l->rtt_us : 0, 4);
}

/* DONE's flags (wire.h). */
enum {
	DONE_PLAN = 1,
	DONE_PROBE = 2, /* needs DONE_PLAN */
	DONE_COMPLETED = 4,
	DONE_ASKS = 8, /* not with DONE_COMPLETED */
	DONE_FLAGS = 15,
};

static ssize_t encode_done(uint8_t *buf, size_t cap, const char *job, uint64_t run, uint64_t step,
			   const struct gg_wire_links *links, const struct gg_wire_plan *plan, uint8_t more_flags)
{
	size_t extra_ = 0;
	const bool has_plan = plan && plan->has_plan;
	ENCODE(buf, cap, GG_WIRE_DONE, {
		put_str(&w, job);
		put_le(&w, run, 8);
		put_le(&w, step, 8);
		put_links(&w, links);
		put_u8(&w, (uint8_t)((has_plan ? DONE_PLAN : 0) | (has_plan && plan->probe ? DONE_PROBE : 0) | more_flags));
		put_le(&w, has_plan ? plan->direct_max : 0, 8);
		put_links(&w, has_plan ? &plan->links : NULL);
	});
}

ssize_t gg_wire_encode_done(uint8_t *buf, size_t cap, const char *job, uint64_t run, uint64_t step,
			    const struct gg_wire_links *links, const struct gg_wire_plan *plan)
{
	return encode_done(buf, cap, job, run, step, links, plan, 0);
}

ssize_t gg_wire_encode_completed(uint8_t *buf, size_t cap, const char *job, uint64_t run, uint64_t step,
				 const struct gg_wire_links *links, const struct gg_wire_plan *plan)
{
	return encode_done(buf, cap, job, run, step, links, plan, DONE_COMPLETED);
}

ssize_t gg_wire_encode_done_asking(uint8_t *buf, size_t cap, const char *job, uint64_t run, uint64_t step,
				   const struct gg_wire_links *links, const struct gg_wire_plan *plan)
{
	return encode_done(buf, cap, job, run, step, links, plan, DONE_ASKS);
}

ssize_t gg_wire_encode_end(uint8_t *buf, size_t cap, const char *job, uint64_t run, uint64_t last_done,
			   uint64_t last_step, uint8_t code, const char *reason, uint32_t age_ms)
{
	return encode_steps(buf, cap, GG_WIRE_END, job, run, last_done, last_step, code, reason, age_ms);
}

/* ---- decoding ----------------------------------------------------------- */

const char *gg_wire_type_name(unsigned type)
{
	static const char *const names[] = { [GG_WIRE_HELLO] = "HELLO", [GG_WIRE_DATA] = "DATA",
					     [GG_WIRE_ACK] = "ACK",     [GG_WIRE_PING] = "PING",
					     [GG_WIRE_PONG] = "PONG",   [GG_WIRE_ABORT] = "ABORT",
					     [GG_WIRE_DONE] = "DONE",   [GG_WIRE_END] = "END" };
	return type < sizeof(names) / sizeof(names[0]) && names[type] ? names[type] : "unknown";
}

int gg_wire_parse_header(const uint8_t hdr[GG_WIRE_HEADER_BYTES], size_t max_payload_bytes,
			 enum gg_wire_type *type, size_t *payload_bytes, char *err, size_t err_size)
{
	struct reader r = { hdr, hdr + GG_WIRE_HEADER_BYTES, NULL };
	uint32_t magic = (uint32_t)get_le(&r, 4, "magic");
	uint8_t t = (uint8_t)get_le(&r, 1, "type");
	uint8_t version = (uint8_t)get_le(&r, 1, "version");
	uint16_t reserved = (uint16_t)get_le(&r, 2, "reserved");
	uint32_t len = (uint32_t)get_le(&r, 4, "length");

	if (magic != GG_WIRE_MAGIC)
		return gg_errf(err, err_size, -EBADMSG, "not a gradgate message (magic %08x)", magic);
	if (version != GG_WIRE_VERSION)
		return gg_errf(err, err_size, -EPROTO, "protocol version %u, this gateway speaks %u", version,
			    GG_WIRE_VERSION);
	if (t < GG_WIRE_HELLO || t > GG_WIRE_END)
		return gg_errf(err, err_size, -EBADMSG, "unknown message type %u", t);
	if (reserved)
		return gg_errf(err, err_size, -EBADMSG, "reserved header bits set (%#x)", reserved);
	const size_t limit = t == GG_WIRE_DATA ? max_payload_bytes : GG_WIRE_CONTROL_MAX;
	if (len > limit)
		return gg_errf(err, err_size, -E2BIG, "%s message of %u bytes exceeds the limit of %zu",
			       gg_wire_type_name(t), len, limit);
	*type = (enum gg_wire_type)t;
	*payload_bytes = len;
	return 0;
}

static bool site_name_ok(const char *s)
{
	if (!*s || *s == '-')
		return false;
	for (; *s; s++)
		if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '-'))
			return false;
	return true;
}

static int check_chunk_id(const struct gg_ar_chunk_id *id, char *err, size_t err_size)
{
	if (id->phase < GG_AR_DIRECT || id->phase > GG_AR_GATHER)
		return gg_errf(err, err_size, -EBADMSG, "unknown phase %u", id->phase);
	if (id->origin >= GG_AR_MAX_SITES)
		return gg_errf(err, err_size, -EBADMSG, "origin %u is not a site index", id->origin);
	return 0;
}

/* ABORT and END: a field that ran short is reported by the caller. */
static int decode_steps(struct reader *r, struct gg_wire_steps *st, const char *what, const char *first,
			const char *last, char *err, size_t err_size)
{
	get_str(r, st->job, GG_WIRE_NAME_MAX, "job");
	st->run = get_le(r, 8, "run");
	st->first = get_le(r, 8, first);
	st->last = get_le(r, 8, last);
	st->code = (uint8_t)get_le(r, 1, "code");
	get_str(r, st->reason, GG_WIRE_REASON_MAX, "reason");
	if (r->field)
		return 0;
	if (st->code < 1 || st->code > GG_WIRE_CODE_MAX)
		return gg_errf(err, err_size, -EBADMSG, "%s: code %u, must be 1 to %d", what, st->code,
			       GG_WIRE_CODE_MAX);
	/* A shutdown travels as a lost site, and "in progress" is no failure:
	 * either would reach the ranks as a code their library must refuse. */
	if (st->code == GG_WIRE_CODE_CLOSED || st->code == GG_WIRE_CODE_AGAIN)
		return gg_errf(err, err_size, -EBADMSG, "%s: code %u, which no step fails with between sites", what,
			       st->code);
	if (st->last < st->first)
		return gg_errf(err, err_size, -EBADMSG, "%s: %s %llu after the %s %llu", what, first,
			       (unsigned long long)st->first, last, (unsigned long long)st->last);
	return 0;
}

int gg_wire_decode(enum gg_wire_type type, const uint8_t *payload, size_t len, struct gg_wire_msg *msg,
		   char *err, size_t err_size)
{
	struct reader r = { payload, payload + len, NULL };

	memset(msg, 0, sizeof(*msg));
	msg->type = type;
	switch (type) {
	case GG_WIRE_HELLO: {
		struct gg_wire_hello *h = &msg->u.hello;
		h->stream_index = (uint16_t)get_le(&r, 2, "stream index");
		h->streams = (uint16_t)get_le(&r, 2, "streams");
		h->instance_id = get_le(&r, 8, "instance id");
		h->sites = (uint8_t)get_le(&r, 1, "site count");
		if (!r.field && (h->sites < 2 || h->sites > GG_AR_MAX_SITES))
			return gg_errf(err, err_size, -EBADMSG, "hello: %u sites, must be 2 to %d", h->sites, GG_AR_MAX_SITES);
		for (unsigned i = 0; i < h->sites && !r.field; i++)
			if (get_str(&r, h->site_names[i], GG_WIRE_NAME_MAX, "site name") &&
			    !site_name_ok(h->site_names[i]))
				return gg_errf(err, err_size, -EBADMSG, "hello: site name %u is not a site name", i);
		h->codec = (uint8_t)get_le(&r, 1, "codec");
		h->scale = (uint8_t)get_le(&r, 1, "scale");
		h->block_elems = (uint32_t)get_le(&r, 4, "block size");
		h->algorithm = (uint8_t)get_le(&r, 1, "algorithm");
		h->chunk_elems = (uint32_t)get_le(&r, 4, "chunk size");
		h->zstd = (uint8_t)get_le(&r, 1, "zstd");
		h->inflight_bytes = get_le(&r, 8, "inflight bytes");
		/* A site's window holds a chunk at least (its config says so):
		 * less would let the peer keep each lane to a frame at a time. */
		if (!r.field && h->inflight_bytes < (uint64_t)h->chunk_elems * 4)
			return gg_errf(err, err_size, -EBADMSG, "hello: inflight bytes %llu, less than a chunk of %u elements",
				       (unsigned long long)h->inflight_bytes, h->chunk_elems);
		if (!r.field && (h->streams == 0 || h->stream_index >= h->streams))
			return gg_errf(err, err_size, -EBADMSG, "hello: stream %u of %u", h->stream_index, h->streams);
		/* 0 stands for "no HELLO seen yet", and would hide a restart. */
		if (!r.field && !h->instance_id)
			return gg_errf(err, err_size, -EBADMSG, "hello: instance id 0");
		break;
	}
	case GG_WIRE_DATA: {
		struct gg_wire_step *st = &msg->u.data.step;
		get_str(&r, st->job, GG_WIRE_NAME_MAX, "job");
		st->run = get_le(&r, 8, "run");
		st->step = get_le(&r, 8, "step");
		st->count = get_le(&r, 8, "count");
		st->tensor_id = (uint32_t)get_le(&r, 4, "tensor id");
		st->dtype = (uint8_t)get_le(&r, 1, "dtype");
		st->fingerprint = get_le(&r, 8, "fingerprint");
		msg->u.data.id.phase = (uint8_t)get_le(&r, 1, "phase");
		msg->u.data.id.origin = (uint8_t)get_le(&r, 1, "origin");
		msg->u.data.id.chunk = (uint32_t)get_le(&r, 4, "chunk");
		if (r.field)
			break;
		if (st->dtype != GG_WIRE_F32 && st->dtype != GG_WIRE_BF16)
			return gg_errf(err, err_size, -EBADMSG, "data: unknown dtype %u", st->dtype);
		if (check_chunk_id(&msg->u.data.id, err, err_size))
			return -EBADMSG;
		msg->u.data.frame = r.p;
		msg->u.data.frame_bytes = (size_t)(r.end - r.p);
		r.p = r.end;
		break;
	}
	case GG_WIRE_ACK:
		get_str(&r, msg->u.ack.job, GG_WIRE_NAME_MAX, "job");
		msg->u.ack.run = get_le(&r, 8, "run");
		msg->u.ack.step = get_le(&r, 8, "step");
		msg->u.ack.id.phase = (uint8_t)get_le(&r, 1, "phase");
		msg->u.ack.id.origin = (uint8_t)get_le(&r, 1, "origin");
		msg->u.ack.id.chunk = (uint32_t)get_le(&r, 4, "chunk");
		if (!r.field && check_chunk_id(&msg->u.ack.id, err, err_size))
			return -EBADMSG;
		break;
	case GG_WIRE_PING:
	case GG_WIRE_PONG:
		msg->u.ping_us = get_le(&r, 8, "clock");
		break;
	case GG_WIRE_ABORT:
		if (decode_steps(&r, &msg->u.abort, "abort", "step", "last step", err, err_size))
			return -EBADMSG;
		break;
	case GG_WIRE_DONE:
		get_str(&r, msg->u.done.job, GG_WIRE_NAME_MAX, "job");
		msg->u.done.run = get_le(&r, 8, "run");
		msg->u.done.step = get_le(&r, 8, "step");
		msg->u.done.links.uplink_bytes_per_s = get_le(&r, 8, "uplink rate");
		msg->u.done.links.rtt_us = (uint32_t)get_le(&r, 4, "round trip");
		uint64_t flags = get_le(&r, 1, "flags");
		msg->u.done.plan.has_plan = flags & DONE_PLAN;
		msg->u.done.plan.probe = flags & DONE_PROBE;
		msg->u.done.completed = flags & DONE_COMPLETED;
		msg->u.done.asks = flags & DONE_ASKS;
		msg->u.done.plan.direct_max = get_le(&r, 8, "direct up to");
		msg->u.done.plan.links.uplink_bytes_per_s = get_le(&r, 8, "plan's uplink rate");
		msg->u.done.plan.links.rtt_us = (uint32_t)get_le(&r, 4, "plan's round trip");
		if (!r.field && (flags > DONE_FLAGS || (flags & (DONE_PLAN | DONE_PROBE)) == DONE_PROBE ||
				 (flags & (DONE_COMPLETED | DONE_ASKS)) == (DONE_COMPLETED | DONE_ASKS)))
			return gg_errf(err, err_size, -EBADMSG,
				       "done: flags 0x%02llx (bit 0 plan, bit 1 probe, which needs a plan, bit 2 completed, "
				       "bit 3 asks, not both)",
				       (unsigned long long)flags);
		break;
	case GG_WIRE_END:
		if (decode_steps(&r, &msg->u.end, "end", "last done step", "last step", err, err_size))
			return -EBADMSG;
		msg->u.end.age_ms = (uint32_t)get_le(&r, 4, "age");
		break;
	default:
		return gg_errf(err, err_size, -EBADMSG, "unknown message type %u", (unsigned)type);
	}
	if (r.field)
		return gg_errf(err, err_size, -EBADMSG, "%s message: field '%s' is truncated or malformed",
			       gg_wire_type_name(type), r.field);
	if (r.p != r.end)
		return gg_errf(err, err_size, -EBADMSG, "%s message: %zu byte%s after the last field",
			       gg_wire_type_name(type), (size_t)(r.end - r.p), r.end - r.p == 1 ? "" : "s");
	const char *job = type == GG_WIRE_DATA    ? msg->u.data.step.job
			  : type == GG_WIRE_ACK   ? msg->u.ack.job
			  : type == GG_WIRE_ABORT ? msg->u.abort.job
			  : type == GG_WIRE_DONE  ? msg->u.done.job
			  : type == GG_WIRE_END   ? msg->u.end.job
						  : NULL;
	if (job && !*job)
		return gg_errf(err, err_size, -EBADMSG, "%s message: empty job name", gg_wire_type_name(type));
	const uint64_t run = type == GG_WIRE_DATA    ? msg->u.data.step.run
			     : type == GG_WIRE_ACK   ? msg->u.ack.run
			     : type == GG_WIRE_ABORT ? msg->u.abort.run
			     : type == GG_WIRE_DONE  ? msg->u.done.run
			     : type == GG_WIRE_END   ? msg->u.end.run
						     : 1;
	if (!run)
		return gg_errf(err, err_size, -EBADMSG, "%s message: run 0", gg_wire_type_name(type));
	for (size_t i = 0; job && job[i]; i++)
		if (!gg_job_name_char_ok((unsigned char)job[i]))
			return gg_errf(err, err_size, -EBADMSG, "%s message: job name has character 0x%02x at %zu",
				       gg_wire_type_name(type), (unsigned char)job[i], i);
	return 0;
}

uint64_t gg_wire_fingerprint(const struct gg_wire_step *st, uint8_t codec, uint32_t block_elems, uint8_t algorithm,
			     uint32_t chunk_elems)
{
	uint8_t buf[GG_WIRE_NAME_MAX + 64];
	struct writer w = { buf, buf + sizeof(buf), false };

	put_str(&w, st->job);
	put_le(&w, st->step, 8);
	put_le(&w, st->count, 8);
	put_le(&w, st->tensor_id, 4);
	put_u8(&w, st->dtype);
	put_u8(&w, codec);
	put_le(&w, block_elems, 4);
	put_u8(&w, algorithm);
	put_le(&w, chunk_elems, 4);
	return gg_fnv1a(GG_FNV1A_START, buf, (size_t)(w.p - buf));
}

int gg_wire_hello_check(const struct gg_wire_hello *a, const struct gg_wire_hello *b, const char *peer,
			char *err, size_t err_size)
{
	char ours[GG_AR_MAX_SITES * (GG_WIRE_NAME_MAX + 2)], theirs[sizeof(ours)];
	const struct {
		const char *what;
		uint64_t mine, peer;
	} nums[] = {
		{ "codec", a->codec, b->codec },
		{ "block scales", a->scale, b->scale },
		{ "block size", a->block_elems, b->block_elems },
		{ "all-reduce algorithm", a->algorithm, b->algorithm },
		{ "chunk size (elements)", a->chunk_elems, b->chunk_elems },
		{ "zstd stage", a->zstd, b->zstd },
		{ "streams per peer", a->streams, b->streams },
	};

	ours[0] = theirs[0] = '\0';
	for (unsigned i = 0; i < a->sites; i++)
		snprintf(ours + strlen(ours), sizeof(ours) - strlen(ours), "%s%s", i ? "," : "", a->site_names[i]);
	for (unsigned i = 0; i < b->sites; i++)
		snprintf(theirs + strlen(theirs), sizeof(theirs) - strlen(theirs), "%s%s", i ? "," : "",
			 b->site_names[i]);
	if (strcmp(ours, theirs)) {
		snprintf(err, err_size, "peer %s knows the sites [%s], this site knows [%s]", peer, theirs, ours);
		return -EPROTO;
	}
	for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++) {
		if (nums[i].mine == nums[i].peer)
			continue;
		const char *pv = NULL, *mv = NULL;
		if (!strcmp(nums[i].what, "codec")) {
			pv = gg_codec_name((enum gg_codec)nums[i].peer);
			mv = gg_codec_name((enum gg_codec)nums[i].mine);
		} else if (!strcmp(nums[i].what, "block scales") && nums[i].mine <= GG_SCALE_F16 &&
			   nums[i].peer <= GG_SCALE_F16) {
			pv = nums[i].peer == GG_SCALE_F16 ? "fp16" : "fp32";
			mv = nums[i].mine == GG_SCALE_F16 ? "fp16" : "fp32";
		} else if (!strcmp(nums[i].what, "all-reduce algorithm") && nums[i].peer <= GG_ALLREDUCE_AUTO &&
			   nums[i].mine <= GG_ALLREDUCE_AUTO) {
			pv = gg_allreduce_algo_name((enum gg_allreduce_algo)nums[i].peer);
			mv = gg_allreduce_algo_name((enum gg_allreduce_algo)nums[i].mine);
		}
		if (pv && mv)
			snprintf(err, err_size, "peer %s uses %s %s, this site uses %s", peer, nums[i].what, pv, mv);
		else
			snprintf(err, err_size, "peer %s uses %s %llu, this site uses %llu", peer, nums[i].what,
				 (unsigned long long)nums[i].peer, (unsigned long long)nums[i].mine);
		return -EPROTO;
	}
	return 0;
}
