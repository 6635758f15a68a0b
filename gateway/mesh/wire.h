/* The gateway-to-gateway protocol, spoken inside each TLS stream (ALPN
 * gradgate/1). docs/wire-protocol.md describes it for people; this header
 * is the definition.
 *
 * Every message is a 12-byte header and a payload, all integers
 * little-endian:
 *   0  4  magic 0x31574747 ("GGW1")
 *   4  1  type (enum gg_wire_type)
 *   5  1  protocol version, GG_WIRE_VERSION
 *   6  2  reserved, 0
 *   8  4  payload length, at most the receiver's limit
 *
 * Payloads (str = u8 length + that many bytes, no NUL; run = u64, not 0:
 * the sender's run of the job, an id it draws, larger each time, whenever
 * it makes an entry for the job's name, which tells a frame or word of a
 * run that ended from one of the next run under the same name):
 *   HELLO   u16 stream index, u16 streams per peer, u64 instance id (random
 *           per gateway start: a change means the peer restarted),
 *           u8 site count, str site names in index order (sorted),
 *           u8 codec, u8 scale, u32 block elems, u8 algorithm,
 *           u32 chunk elems, u8 zstd on, u64 inflight bytes (the
 *           sender's inflight_per_peer)
 *   DATA    str job, run, u64 step, u64 count, u32 tensor id, u8 dtype,
 *           u64 collective fingerprint, u8 phase, u8 origin, u32 chunk,
 *           then the payload frame (compress/frame.h) to the end
 *   ACK     str job, run (the DATA's), u64 step, u8 phase, u8 origin,
 *           u32 chunk
 *   PING    u64 sender's clock in microseconds
 *   PONG    u64 the PING's value, echoed
 *   ABORT   str job, run, u64 step, u64 last step (>= step), u8 code (what
 *           failed: the client library's error code, negated: 8 timeout,
 *           10 mismatch, 11 rank, 12 site, ...), str reason (steps step to
 *           last step failed at the sender; usually one, a run of them for
 *           a site that was cut off meanwhile)
 *   DONE    str job, run, u64 step (the sender holds the step's whole result;
 *           a site hands a result to its ranks only once every site said
 *           DONE, so a step completes at every site or at none), then the
 *           sender's links and, from the first site under algorithm auto,
 *           the plan for the job's next steps (struct gg_wire_plan):
 *           u64 uplink bytes/s, u32 round trip us (0: not measured yet),
 *           u8 flags (bit 0: has a plan, bit 1: the next step is a
 *           probe of the other algorithm, bit 2: the sender completed the
 *           step, so every site said DONE for it, bit 3: the sender still
 *           waits for DONEs and asks a peer that completed to say so), u64
 *           direct up to this many
 *           elements, u64 uplink bytes/s and u32 round trip us the plan
 *           was made with
 *   END     str job, run, u64 last done step (0: none), u64 last step (>= last
 *           done), u8 code, str reason, u32 age (the job is over at the
 *           sender: its ranks there are gone after the last step; the steps
 *           after the last done one failed there, the first of them with
 *           that code and reason; age: milliseconds from the job's end at
 *           the sender to this message, as its clock counts, so that a
 *           receiver can tell an END sent again from before its ranks came)
 *
 * A receiver treats every field as hostile: lengths are checked against
 * the message and the limits before anything is read, names are checked
 * for their character set, enums for their range. */
#ifndef GG_WIRE_H
#define GG_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "gg_common.h"

#define GG_WIRE_MAGIC 0x31574747u
#define GG_WIRE_VERSION 10
#define GG_WIRE_HEADER_BYTES 12
#define GG_WIRE_NAME_MAX 63
#define GG_WIRE_REASON_MAX 255
#define GG_WIRE_DATA_FIXED_BYTES (1 + GG_WIRE_NAME_MAX + 8 + 8 + 8 + 4 + 1 + 8 + 1 + 1 + 4)

#define GG_AR_MAX_SITES 8

/* What a DATA frame carries, and an ACK names: one chunk of one phase. */
enum gg_ar_phase {
	GG_AR_DIRECT = 1,  /* origin: the site whose input this is */
	GG_AR_SCATTER = 2, /* origin: the shard */
	GG_AR_GATHER = 3,  /* origin: the shard */
};

struct gg_ar_chunk_id {
	uint8_t phase;  /* enum gg_ar_phase */
	uint8_t origin;
	uint32_t chunk; /* within the tensor (direct) or the shard (ring) */
};

enum gg_wire_type {
	GG_WIRE_HELLO = 1,
	GG_WIRE_DATA = 2,
	GG_WIRE_ACK = 3,
	GG_WIRE_PING = 4,
	GG_WIRE_PONG = 5,
	GG_WIRE_ABORT = 6,
	GG_WIRE_DONE = 7,
	GG_WIRE_END = 8,
};

/* "HELLO", "DATA", ...; "unknown" for a number outside the enum. */
const char *gg_wire_type_name(unsigned type);

/* ABORT codes: a gg_errc (include/gradgate.h) negated. */
#define GG_WIRE_CODE_MAX 15
/* Codes no step fails with between sites, and refused: a gateway that
 * shuts down is a lost site to the others (GG_ERR_CLOSED goes as
 * GG_ERR_SITE), and GG_ERR_AGAIN means in progress. */
#define GG_WIRE_CODE_CLOSED 7
#define GG_WIRE_CODE_AGAIN 14

enum gg_dtype_wire {
	GG_WIRE_F32 = 1,
	GG_WIRE_BF16 = 2,
};

/* The settings every site must share, and the sites themselves. */
struct gg_wire_hello {
	uint16_t stream_index;
	uint16_t streams;
	uint64_t instance_id;
	uint8_t sites;
	char site_names[GG_AR_MAX_SITES][GG_WIRE_NAME_MAX + 1];
	uint8_t codec;
	uint8_t scale;
	uint32_t block_elems;
	uint8_t algorithm;
	uint32_t chunk_elems;
	uint8_t zstd;
	/* The sender's [limits] inflight_per_peer, which need not match: each
	 * site keeps what it sends a peer within the smaller of the two, so
	 * that the peer's budget for early frames holds it. */
	uint64_t inflight_bytes;
};

/* What identifies one step of one job across sites. */
struct gg_wire_step {
	char job[GG_WIRE_NAME_MAX + 1];
	uint64_t run; /* the sender's, not in the fingerprint: runs are per site */
	uint64_t step;
	uint64_t count;
	uint32_t tensor_id;
	uint8_t dtype;
	uint64_t fingerprint; /* gg_wire_fingerprint() of the fields above, the codec, algorithm and chunk */
};

/* A site's links as it measured them: what its streams delivered per
 * second of sending, over all peers at once, and the longest of its
 * shortest recent round trips to a peer; 0 where not measured yet. */
struct gg_wire_links {
	uint64_t uplink_bytes_per_s;
	uint32_t rtt_us;
};

/* Algorithm auto: the first site's choice for a job's steps after the one
 * a DONE is of. A step of at most direct_max elements goes direct, a
 * larger one by ring; `links` are the figures the choice was made from. */
struct gg_wire_plan {
	bool has_plan;
	bool probe; /* the plan tries the algorithm not chosen, to time it */
	uint64_t direct_max;
	struct gg_wire_links links;
};

/* ABORT and END: a job, a run of its steps, and how they failed. */
struct gg_wire_steps {
	char job[GG_WIRE_NAME_MAX + 1];
	uint64_t run;
	uint64_t first, last; /* first <= last */
	uint8_t code;         /* 1..GG_WIRE_CODE_MAX */
	char reason[GG_WIRE_REASON_MAX + 1];
	uint32_t age_ms;      /* END only: ms since the job ended at the sender */
};

struct gg_wire_msg {
	enum gg_wire_type type;
	union {
		struct gg_wire_hello hello;
		struct {
			struct gg_wire_step step;
			struct gg_ar_chunk_id id;
			const uint8_t *frame; /* points into the message buffer */
			size_t frame_bytes;
		} data;
		struct {
			char job[GG_WIRE_NAME_MAX + 1];
			uint64_t run;
			uint64_t step;
			struct gg_ar_chunk_id id;
		} ack;
		uint64_t ping_us;
		struct gg_wire_steps abort; /* steps first..last failed */
		struct {
			char job[GG_WIRE_NAME_MAX + 1];
			uint64_t run;
			uint64_t step;
			struct gg_wire_links links;
			struct gg_wire_plan plan;
			bool completed; /* the sender holds every site's DONE */
			bool asks;      /* it waits for DONEs: a site that completed, say so */
		} done;
		struct gg_wire_steps end; /* steps up to first done, first+1..last failed */
	} u;
};

/* A 64-bit FNV-1a over the step's identity, the codec settings and how
 * the step is cut and sent: equal at two sites exactly when they announce
 * the same collective and would exchange the same chunks. */
uint64_t gg_wire_fingerprint(const struct gg_wire_step *step, uint8_t codec, uint32_t block_elems,
			     uint8_t algorithm, uint32_t chunk_elems);

/* Every message but DATA has at most this many payload bytes. */
#define GG_WIRE_CONTROL_MAX 1024

/* Reads a message header: 0 and *payload_bytes, or -EPROTO (another
 * protocol version: another gradgate release), -EBADMSG (bad magic or
 * type) / -E2BIG (a DATA longer than max_payload_bytes, another message
 * longer than GG_WIRE_CONTROL_MAX) with err set. */
GG_MUST_CHECK int gg_wire_parse_header(const uint8_t hdr[GG_WIRE_HEADER_BYTES], size_t max_payload_bytes,
				       enum gg_wire_type *type, size_t *payload_bytes, char *err,
				       size_t err_size);

/* Decodes one payload of a known type. Returns 0 or -EBADMSG with err
 * naming the field. DATA's frame points into `payload`. */
GG_MUST_CHECK int gg_wire_decode(enum gg_wire_type type, const uint8_t *payload, size_t len,
				 struct gg_wire_msg *msg, char *err, size_t err_size);

/* Encoders write header + payload into buf and return the bytes written,
 * or -ENOBUFS when cap is too small. DATA writes its fixed part only
 * (header length counts the frame that the caller sends right after). */
GG_MUST_CHECK ssize_t gg_wire_encode_hello(uint8_t *buf, size_t cap, const struct gg_wire_hello *h);
GG_MUST_CHECK ssize_t gg_wire_encode_data_head(uint8_t *buf, size_t cap, const struct gg_wire_step *step,
					       const struct gg_ar_chunk_id *id, size_t frame_bytes);
GG_MUST_CHECK ssize_t gg_wire_encode_ack(uint8_t *buf, size_t cap, const char *job, uint64_t run, uint64_t step,
					 const struct gg_ar_chunk_id *id);
GG_MUST_CHECK ssize_t gg_wire_encode_ping(uint8_t *buf, size_t cap, enum gg_wire_type type, uint64_t value);
GG_MUST_CHECK ssize_t gg_wire_encode_abort(uint8_t *buf, size_t cap, const char *job, uint64_t run, uint64_t step,
					   uint64_t last_step, uint8_t code, const char *reason);
GG_MUST_CHECK ssize_t gg_wire_encode_done(uint8_t *buf, size_t cap, const char *job, uint64_t run, uint64_t step,
					  const struct gg_wire_links *links, const struct gg_wire_plan *plan);
/* DONE of a step the sender completed: it held every site's DONE, so a
 * site that holds the result may complete without the ones it missed. */
GG_MUST_CHECK ssize_t gg_wire_encode_completed(uint8_t *buf, size_t cap, const char *job, uint64_t run,
					       uint64_t step, const struct gg_wire_links *links,
					       const struct gg_wire_plan *plan);
/* DONE again, from a site that has waited a while for others' DONEs: a
 * peer that completed the step answers with its completed DONE. */
GG_MUST_CHECK ssize_t gg_wire_encode_done_asking(uint8_t *buf, size_t cap, const char *job, uint64_t run,
						 uint64_t step, const struct gg_wire_links *links,
						 const struct gg_wire_plan *plan);
GG_MUST_CHECK ssize_t gg_wire_encode_end(uint8_t *buf, size_t cap, const char *job, uint64_t run,
					 uint64_t last_done, uint64_t last_step, uint8_t code, const char *reason,
					 uint32_t age_ms);

/* Compares a peer's HELLO with ours; 0, or -EPROTO with err naming the
 * first setting that differs and both values ("peer site-b uses codec
 * int8, this site uses bf16-split"). */
GG_MUST_CHECK int gg_wire_hello_check(const struct gg_wire_hello *ours, const struct gg_wire_hello *theirs,
				      const char *peer, char *err, size_t err_size);

#endif
