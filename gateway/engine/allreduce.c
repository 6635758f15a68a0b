#include "allreduce.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct gg_ar_step {
	struct gg_ar_config cfg;
	const struct gg_ar_ops *ops;
	void *ctx;
	const float *input;
	float *result;
	float *scratch;          /* one chunk: input + received partial */
	uint64_t frame_cap;      /* largest frame of one chunk */
	uint64_t shard_lo[GG_AR_MAX_SITES + 1];
	uint32_t shard_chunks[GG_AR_MAX_SITES];
	uint32_t chunk_base[GG_AR_MAX_SITES + 1]; /* prefix sums of shard_chunks */
	uint32_t nchunks;        /* direct: chunks of the tensor; ring: of all shards */
	uint32_t own_chunks;     /* chunks of its own input the site encodes first: */
	uint64_t next_own;       /* all of them for direct, its starting shard's for ring;
				    of those, the part's: part, part + parts, ... */
	uint64_t part_chunks;    /* the chunks of the step's part, when all are done */
	float *fb_scratch;       /* one chunk: the input compensated by error feedback */
	/* Input and result are one memory and the site's own frames decode to
	 * exactly its input (fp32, no error feedback): where its frame of a
	 * chunk is the first to reduce, the chunk already holds what storing
	 * that frame would write. */
	bool own_in_place;
	/* Frames without zstd, on the host: the frames of the first sites of
	 * a chunk that are at hand are decoded in one sweep
	 * (gg_frame_decode_sum), site 0's kept until site 1's is at hand where
	 * it is in pending already. */
	bool sweep;
	/* direct */
	uint8_t *next_site;      /* per chunk: the site whose frame is reduced next */
	struct gg_buf **pending; /* [site * nchunks + chunk]: frames awaiting their turn */
	/* ring */
	uint8_t *got;            /* per chunk: bit 0 scatter received, bit 1 gather received */
	uint64_t chunks_done;
	uint64_t bytes_out;
	/* Sites any frame of the step came from (bit per site): every site
	 * sends frames of its own input as soon as it starts a step. */
	uint32_t heard;
	/* The site whose frame failed the step (gg_ar_step_fault_site()). */
	unsigned fault_site;
	bool failed;
};

static unsigned ring_next(const struct gg_ar_step *s)
{
	return gg_ar_ring_next(s->cfg.self, s->cfg.sites);
}

static unsigned ring_prev(const struct gg_ar_step *s)
{
	return (s->cfg.self + s->cfg.sites - 1) % s->cfg.sites;
}

/* Ring: the predecessor sends reduce-scatter frames for every shard but
 * the one this site starts, and all-gather frames for every shard but this
 * site's own. */
static bool ring_expects(const struct gg_ar_step *s, unsigned phase, unsigned shard)
{
	unsigned start = (s->cfg.self + s->cfg.sites - 1) % s->cfg.sites;
	return phase == GG_AR_SCATTER ? shard != start : shard != s->cfg.self;
}

const char *gg_ar_phase_name(unsigned phase)
{
	switch (phase) {
	case GG_AR_DIRECT:
		return "direct";
	case GG_AR_SCATTER:
		return "reduce-scatter";
	case GG_AR_GATHER:
		return "all-gather";
	}
	return "unknown phase";
}

static bool in_part(const struct gg_ar_step *s, uint32_t chunk)
{
	return chunk % s->cfg.parts == s->cfg.part;
}

/* How many of chunks 0..n-1 are the part's. */
static uint64_t part_count(const struct gg_ar_step *s, uint64_t n)
{
	return n > s->cfg.part ? (n - s->cfg.part + s->cfg.parts - 1) / s->cfg.parts : 0;
}

static bool range_of(const struct gg_ar_config *cfg, const uint64_t *shard_lo, const struct gg_ar_chunk_id *id,
		     uint64_t *offset, uint64_t *n)
{
	uint64_t lo = 0, hi = cfg->count;

	if (id->phase == GG_AR_DIRECT) {
		if (id->origin >= cfg->sites || cfg->algo != GG_ALLREDUCE_DIRECT)
			return false;
	} else if (id->phase == GG_AR_SCATTER || id->phase == GG_AR_GATHER) {
		if (id->origin >= cfg->sites || cfg->algo != GG_ALLREDUCE_RING)
			return false;
		lo = shard_lo[id->origin];
		hi = shard_lo[id->origin + 1];
	} else {
		return false;
	}
	uint64_t start = lo + (uint64_t)id->chunk * cfg->chunk_elems;
	if (start >= hi)
		return false;
	*offset = start;
	*n = GG_MIN(hi - start, (uint64_t)cfg->chunk_elems);
	return true;
}

static void shard_bounds(const struct gg_ar_config *cfg, uint64_t *lo)
{
	lo[0] = 0;
	for (unsigned j = 1; j < cfg->sites; j++)
		lo[j] = cfg->count * j / cfg->sites / GG_CODEC_BLOCK_ALIGN_ELEMS * GG_CODEC_BLOCK_ALIGN_ELEMS;
	lo[cfg->sites] = cfg->count;
}

bool gg_ar_chunk_range(const struct gg_ar_config *cfg, const struct gg_ar_chunk_id *id, uint64_t *offset,
		       uint64_t *n)
{
	uint64_t lo[GG_AR_MAX_SITES + 1];

	if (cfg->sites < 2 || cfg->sites > GG_AR_MAX_SITES || cfg->chunk_elems == 0)
		return false;
	shard_bounds(cfg, lo);
	return range_of(cfg, lo, id, offset, n);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int encode_chunk_untimed(struct gg_ar_step *s, const float *src, uint64_t offset, uint64_t n,
				struct gg_buf **out, char *err, size_t err_size)
{
	struct gg_frame_encoder *enc = s->cfg.enc;
	struct gg_buf *f = gg_buf_new(s->cfg.pool, s->frame_cap);
	int rc;

	if (!f)
		return gg_errf(err, err_size, -ENOMEM, "no memory for the frame of %llu elements at offset %llu",
			       (unsigned long long)n, (unsigned long long)offset);
	if (s->cfg.mem) {
		char why[GG_AR_ERROR_MAX];
		rc = s->cfg.mem->ops->encode(s->cfg.mem->ctx, enc, offset, src, n, f->data, s->frame_cap, &f->len, why,
					     sizeof(why));
		if (rc) {
			gg_buf_put(f);
			return gg_errf(err, err_size, rc, "encoding %llu elements at offset %llu failed: %s",
				       (unsigned long long)n, (unsigned long long)offset, why);
		}
		*out = f;
		return 0;
	}
	if (s->cfg.feedback) {
		uint64_t raw_bytes;
		rc = gg_codec_encoded_bytes(&enc->cfg.codec, n, &raw_bytes);
		if (!rc)
			rc = gg_feedback_encode(s->cfg.feedback, &enc->cfg.codec, offset, src, n,
						f->data + GG_FRAME_HEADER_BYTES, raw_bytes, s->fb_scratch);
		if (!rc)
			rc = gg_frame_wrap(enc, f->data + GG_FRAME_HEADER_BYTES, raw_bytes, n, f->data,
					   s->frame_cap, &f->len);
	} else {
		rc = gg_frame_encode(enc, src, n, f->data, s->frame_cap, &f->len);
	}
	if (rc) {
		gg_buf_put(f);
		return gg_errf(err, err_size, rc, "encoding %llu elements at offset %llu failed: %s",
			       (unsigned long long)n, (unsigned long long)offset, strerror(-rc));
	}
	*out = f;
	return 0;
}

/* Adds the time since t0 to the step's encode or decode time, when the
 * step is timed. */
static void timed(const struct gg_ar_step *s, bool encode, uint64_t t0)
{
	if (!s->cfg.times)
		return;
	uint64_t dt = now_ns() - t0;
	if (encode)
		s->cfg.times->encode_ns += dt;
	else
		s->cfg.times->decode_ns += dt;
}

/* Encodes `n` elements at `offset` of the tensor from `src` into a new
 * frame, through error feedback when the step has it. */
static int encode_chunk(struct gg_ar_step *s, const float *src, uint64_t offset, uint64_t n,
			struct gg_buf **out, char *err, size_t err_size)
{
	uint64_t t0 = s->cfg.times ? now_ns() : 0;
	int rc = encode_chunk_untimed(s, src, offset, n, out, err, err_size);

	timed(s, true, t0);
	return rc;
}

static int send_frame(struct gg_ar_step *s, unsigned to, const struct gg_ar_chunk_id *id,
		      struct gg_buf *f, char *err, size_t err_size)
{
	int rc = s->ops->send(s->ctx, to, id, f);
	if (rc) {
		return gg_errf(err, err_size, rc, "sending %s chunk %u of %u to site %u failed: %s",
			       gg_ar_phase_name(id->phase), id->chunk, id->origin, to, strerror(-rc));
	}
	s->bytes_out += f->len;
	return 0;
}

/* Decodes one frame that site `from` made for chunk `id` into result. */
static int decode_into(struct gg_ar_step *s, unsigned from, const struct gg_ar_chunk_id *id, const void *frame,
		       size_t len, float *out, uint64_t n, enum gg_frame_op op, char *err, size_t err_size)
{
	char why[GG_AR_ERROR_MAX];
	uint64_t t0 = s->cfg.times ? now_ns() : 0;
	int rc = s->cfg.mem ? s->cfg.mem->ops->decode(s->cfg.mem->ctx, s->cfg.dec, frame, len, out, n, op, why,
						      sizeof(why))
			    : gg_frame_decode(s->cfg.dec, frame, len, out, n, op, NULL, why, sizeof(why));
	timed(s, false, t0);
	if (rc) {
		/* The frame's own checks failed: its sender's fault (not this
		 * site's, nor a device's or the memory's). */
		if (from != s->cfg.self && (rc == -EBADMSG || rc == -EILSEQ || rc == -E2BIG))
			s->fault_site = from;
		if (err_size)
			snprintf(err, err_size, "site %u, %s chunk %u of %u: %s", from, gg_ar_phase_name(id->phase),
				 id->chunk, id->origin, why);
		return rc;
	}
	return 0;
}

/* Sites 0 to count - 1's frames of direct chunk `id` into result (n
 * elements): the first stored and the others added, as that many
 * decode_into() would. */
_Static_assert(GG_FRAME_SUM_MAX >= GG_AR_MAX_SITES, "a sum's frames in one sweep");
static int decode_sum(struct gg_ar_step *s, const struct gg_ar_chunk_id *id, const void *const *frames,
		      const size_t *lens, unsigned count, float *out, uint64_t n, char *err, size_t err_size)
{
	char why[GG_AR_ERROR_MAX];
	unsigned bad;
	uint64_t t0 = s->cfg.times ? now_ns() : 0;
	int rc = gg_frame_decode_sum(s->cfg.dec, frames, lens, count, out, n, &bad, why, sizeof(why));
	timed(s, false, t0);
	if (bad != s->cfg.self && (rc == -EBADMSG || rc == -EILSEQ || rc == -E2BIG))
		s->fault_site = bad; /* frame i is site i's */
	if (rc && err_size)
		snprintf(err, err_size, "site %u, %s chunk %u of %u: %s", bad, gg_ar_phase_name(id->phase), id->chunk,
			 bad, why);
	return rc;
}

/* scratch[0..n) = input[offset, offset + n). */
static int input_to_scratch(struct gg_ar_step *s, uint64_t offset, uint64_t n, char *err, size_t err_size)
{
	char why[GG_AR_ERROR_MAX];

	if (!s->cfg.mem) {
		memcpy(s->scratch, s->input + offset, n * sizeof(float));
		return 0;
	}
	int rc = s->cfg.mem->ops->copy(s->cfg.mem->ctx, s->scratch, s->input + offset, n, why, sizeof(why));
	if (rc)
		return gg_errf(err, err_size, rc, "copying %llu elements at offset %llu failed: %s",
			       (unsigned long long)n, (unsigned long long)offset, why);
	return 0;
}

/* The owner's site sum of [offset, offset + n) is read next. */
static void gather(struct gg_ar_step *s, uint64_t offset, uint64_t n)
{
	if (s->ops->gather)
		s->ops->gather(s->ctx, offset, n);
}

/* [offset, offset + n) of the result is final. */
static void deliver(struct gg_ar_step *s, uint64_t offset, uint64_t n)
{
	if (s->ops->deliver)
		s->ops->deliver(s->ctx, offset, n);
}

/* Reduces chunk c as far as the frames present allow, in site order.
 * `frame`, when not NULL, is site `from`'s frame of it, at hand rather
 * than in pending: the frame of the site whose turn it is, or site 1's
 * where site 0's waits in pending to be decoded in one sweep with it. */
static int direct_reduce(struct gg_ar_step *s, uint32_t c, unsigned from, const void *frame, size_t len, char *err,
			 size_t err_size)
{
	const unsigned K = s->cfg.sites;
	uint64_t offset = 0, n = 0;
	struct gg_ar_chunk_id id = { GG_AR_DIRECT, 0, c };

	while (s->next_site[c] < K) {
		unsigned site = s->next_site[c];
		struct gg_buf **slot = &s->pending[(size_t)site * s->nchunks + c];
		const void *f = frame && from == site ? frame : *slot ? (*slot)->data : NULL;
		size_t flen = frame && from == site ? len : *slot ? (*slot)->len : 0;
		if (!f)
			return 0;
		id.origin = (uint8_t)site;
		range_of(&s->cfg, s->shard_lo, &id, &offset, &n);
		int rc;
		if (site == 0 && site == s->cfg.self && s->own_in_place) {
			rc = 0;
		} else if (site == 0 && s->sweep && K > 1) {
			/* The frames of the sites after it that are at hand too (this
			 * site's own, ones that came early, the one just received):
			 * all in one sweep over the chunk. Until site 1's is, a frame
			 * of site 0 kept in pending (this site's own) waits for it. */
			const void *fs[GG_AR_MAX_SITES] = { f };
			size_t lens[GG_AR_MAX_SITES] = { flen };
			unsigned count = 1;
			for (; count < K; count++) {
				struct gg_buf *p = s->pending[(size_t)count * s->nchunks + c];
				if (frame && from == count) {
					fs[count] = frame;
					lens[count] = len;
				} else if (p) {
					fs[count] = p->data;
					lens[count] = p->len;
				} else {
					break;
				}
			}
			if (count == 1 && f != frame)
				return 0;
			rc = decode_sum(s, &id, fs, lens, count, s->result + offset, n, err, err_size);
			for (unsigned j = 1; j < count; j++) {
				gg_buf_put(s->pending[(size_t)j * s->nchunks + c]);
				s->pending[(size_t)j * s->nchunks + c] = NULL;
			}
			s->next_site[c] += (uint8_t)(count - 1);
		} else {
			rc = decode_into(s, site, &id, f, flen, s->result + offset, n,
					 site == 0 ? GG_FRAME_STORE : GG_FRAME_ACCUMULATE, err, err_size);
		}
		frame = NULL; /* (used: either its site's turn came, or site 1's with site 0's) */
		gg_buf_put(*slot);
		*slot = NULL;
		if (rc)
			return rc;
		s->next_site[c]++;
	}
	s->chunks_done++;
	deliver(s, offset, n);
	return 0;
}

static bool may_encode(const struct gg_ar_step *s)
{
	return !s->ops->may_encode || s->ops->may_encode(s->ctx);
}

/* Encodes and sends the site's own chunks below `upto` whatever the
 * owner's room, then more while the owner has room. */
static int direct_emit(struct gg_ar_step *s, uint32_t upto, char *err, size_t err_size)
{
	const unsigned K = s->cfg.sites, self = s->cfg.self;

	while (s->next_own < s->own_chunks && (s->next_own < upto || may_encode(s))) {
		uint32_t c = (uint32_t)s->next_own;
		s->next_own += s->cfg.parts;
		struct gg_ar_chunk_id id = { GG_AR_DIRECT, (uint8_t)self, c };
		struct gg_buf *f;
		uint64_t offset = 0, n = 0;
		range_of(&s->cfg, s->shard_lo, &id, &offset, &n);
		gather(s, offset, n);
		int rc = encode_chunk(s, s->input + offset, offset, n, &f, err, err_size);
		if (rc)
			return rc;
		s->pending[(size_t)self * s->nchunks + c] = f;
		for (unsigned to = 0; to < K; to++)
			if (to != self && (rc = send_frame(s, to, &id, f, err, err_size)))
				return rc;
		if ((rc = direct_reduce(s, c, K, NULL, 0, err, err_size)))
			return rc;
	}
	return 0;
}

static uint32_t flat_chunk(const struct gg_ar_step *s, const struct gg_ar_chunk_id *id)
{
	return s->chunk_base[id->origin] + id->chunk;
}

/* This site holds the full sum of its own shard's chunk: encode it once,
 * take the decoded encoding as the result, and start its all-gather. */
static int ring_finish_chunk(struct gg_ar_step *s, const struct gg_ar_chunk_id *sid, uint64_t offset, uint64_t n,
			     char *err, size_t err_size)
{
	struct gg_ar_chunk_id id = { GG_AR_GATHER, sid->origin, sid->chunk };
	struct gg_buf *f;
	int rc = encode_chunk(s, s->scratch, offset, n, &f, err, err_size);

	if (rc)
		return rc;
	rc = decode_into(s, s->cfg.self, &id, f->data, f->len, s->result + offset, n, GG_FRAME_STORE, err,
			 err_size);
	if (!rc) {
		deliver(s, offset, n);
		rc = send_frame(s, ring_next(s), &id, f, err, err_size);
	}
	gg_buf_put(f);
	if (!rc)
		s->chunks_done++;
	return rc;
}

/* The shard this site starts the reduce-scatter of. */
static uint8_t ring_start_shard(const struct gg_ar_step *s)
{
	return (uint8_t)gg_ar_ring_start(s->cfg.self, s->cfg.sites);
}

/* Encodes and sends the chunks of the starting shard while the owner has
 * room. */
static int ring_emit(struct gg_ar_step *s, char *err, size_t err_size)
{
	uint8_t shard = ring_start_shard(s);

	while (s->next_own < s->own_chunks && may_encode(s)) {
		struct gg_ar_chunk_id id = { GG_AR_SCATTER, shard, (uint32_t)s->next_own };
		s->next_own += s->cfg.parts;
		struct gg_buf *f;
		uint64_t offset = 0, n = 0;
		range_of(&s->cfg, s->shard_lo, &id, &offset, &n);
		gather(s, offset, n);
		int rc = encode_chunk(s, s->input + offset, offset, n, &f, err, err_size);
		if (rc)
			return rc;
		rc = send_frame(s, ring_next(s), &id, f, err, err_size);
		gg_buf_put(f);
		if (rc)
			return rc;
	}
	return 0;
}

int gg_ar_step_resume(struct gg_ar_step *s, char *err, size_t err_size)
{
	s->fault_site = s->cfg.sites;
	if (s->failed)
		return gg_errf(err, err_size, -EINVAL, "the step has already failed");
	int rc = s->cfg.algo == GG_ALLREDUCE_DIRECT ? direct_emit(s, 0, err, err_size) : ring_emit(s, err, err_size);
	if (rc < 0)
		s->failed = true;
	return rc;
}

unsigned gg_ar_step_fault_site(const struct gg_ar_step *s)
{
	return s->fault_site;
}

bool gg_ar_step_wants_resume(const struct gg_ar_step *s)
{
	return !s->failed && s->next_own < s->own_chunks;
}

static int ring_on_frame(struct gg_ar_step *s, const struct gg_ar_chunk_id *id, const void *frame, size_t len,
			 uint64_t offset, uint64_t n, char *err, size_t err_size)
{
	const unsigned self = s->cfg.self, from = ring_prev(s);
	uint8_t *got = &s->got[flat_chunk(s, id)];
	int rc;

	if (id->phase == GG_AR_SCATTER) {
		if (*got & 1)
			return 1;
		gather(s, offset, n);
		if ((rc = input_to_scratch(s, offset, n, err, err_size)) ||
		    (rc = decode_into(s, from, id, frame, len, s->scratch, n, GG_FRAME_ACCUMULATE, err, err_size)))
			return rc;
		*got |= 1;
		if (id->origin == self)
			return ring_finish_chunk(s, id, offset, n, err, err_size);
		struct gg_buf *f;
		if ((rc = encode_chunk(s, s->scratch, offset, n, &f, err, err_size)))
			return rc;
		rc = send_frame(s, ring_next(s), id, f, err, err_size);
		gg_buf_put(f);
		return rc;
	}
	if (*got & 2)
		return 1;
	/* A shard's sum holds this site's part only once this site added it
	 * and passed it on: an all-gather frame that comes earlier cannot be
	 * that sum, and this site's input would never be read. */
	bool added = id->origin == ring_start_shard(s) ? id->chunk < s->next_own : (*got & 1);
	if (!added) {
		s->fault_site = from;
		return gg_errf(err, err_size, -EPROTO,
			       "site %u sent all-gather chunk %u of %u before this site added its part to it", from,
			       id->chunk, id->origin);
	}
	if ((rc = decode_into(s, from, id, frame, len, s->result + offset, n, GG_FRAME_STORE, err, err_size)))
		return rc;
	deliver(s, offset, n);
	*got |= 2;
	s->chunks_done++;
	if (ring_next(s) == id->origin)
		return 0;
	struct gg_buf *f = gg_buf_new(s->cfg.pool, len);
	if (!f)
		return gg_errf(err, err_size, -ENOMEM, "no memory to pass on %s chunk %u of %u to site %u",
			       gg_ar_phase_name(id->phase), id->chunk, id->origin, ring_next(s));
	memcpy(f->data, frame, len);
	f->len = len;
	rc = send_frame(s, ring_next(s), id, f, err, err_size);
	gg_buf_put(f);
	return rc;
}

int gg_ar_step_on_frame(struct gg_ar_step *s, unsigned from, const struct gg_ar_chunk_id *id, const void *frame,
			size_t len, char *err, size_t err_size)
{
	const unsigned K = s->cfg.sites, self = s->cfg.self;
	uint64_t offset, n;
	int rc;

	s->fault_site = K;
	if (s->failed)
		return gg_errf(err, err_size, -EINVAL, "the step has already failed");
	/* What the frame's sender did not keep to is its fault. */
	if (from < K && from != self)
		s->fault_site = from;
	if (from >= K || from == self || !range_of(&s->cfg, s->shard_lo, id, &offset, &n)) {
		s->failed = true;
		return gg_errf(err, err_size, -EPROTO, "site %u sent %s chunk %u of %u, which does not exist in this step",
			       from, gg_ar_phase_name(id->phase), id->chunk, id->origin);
	}
	if (!in_part(s, id->chunk)) {
		s->failed = true;
		return gg_errf(err, err_size, -EPROTO, "%s chunk %u of %u from site %u belongs to part %u of %u, not %u",
			       gg_ar_phase_name(id->phase), id->chunk, id->origin, from, id->chunk % s->cfg.parts,
			       s->cfg.parts, s->cfg.part);
	}
	/* Who may send what: direct frames come from their origin; ring
	 * frames from the predecessor, never for a shard it cannot hold. */
	bool expected = id->phase == GG_AR_DIRECT
				? id->origin == from
				: from == ring_prev(s) && ring_expects(s, id->phase, id->origin);
	if (!expected) {
		s->failed = true;
		return gg_errf(err, err_size, -EPROTO,
			       "site %u sent %s chunk %u of %u, which this site never expects from it", from,
			       gg_ar_phase_name(id->phase), id->chunk, id->origin);
	}
	s->heard |= 1u << from;
	s->fault_site = K; /* from here, only a frame that does not decode is */
	if (id->phase == GG_AR_DIRECT) {
		struct gg_buf **slot = &s->pending[(size_t)from * s->nchunks + id->chunk];
		if (s->next_site[id->chunk] > from || *slot)
			return 1;
		/* This site's own frame of the chunk goes first: results are then
		 * written only where the input has been read (the two may be the
		 * same memory), and a peer's pace sets the pace of this site. */
		if (id->chunk >= s->next_own && (rc = direct_emit(s, id->chunk + 1, err, err_size)) < 0) {
			s->failed = true;
			return rc;
		}
		if (s->next_site[id->chunk] == from ||
		    (from == 1 && s->next_site[id->chunk] == 0 && s->sweep && s->pending[id->chunk])) {
			rc = direct_reduce(s, id->chunk, from, frame, len, err, err_size);
		} else {
			if (!(*slot = gg_buf_new(s->cfg.pool, len))) {
				s->failed = true;
				return gg_errf(err, err_size, -ENOMEM, "no memory to keep site %u's %s chunk %u of %u "
					       "until its turn", from, gg_ar_phase_name(id->phase), id->chunk, id->origin);
			}
			memcpy((*slot)->data, frame, len);
			(*slot)->len = len;
			rc = 0;
		}
	} else {
		rc = ring_on_frame(s, id, frame, len, offset, n, err, err_size);
	}
	if (rc < 0)
		s->failed = true;
	return rc;
}

int gg_ar_step_start(struct gg_ar_step **out, const struct gg_ar_config *cfg, const float *input, float *result,
		     const struct gg_ar_ops *ops, void *ctx, char *err, size_t err_size)
{
	struct gg_ar_step *s;
	int rc;

	*out = NULL;
	if (cfg->sites < 2 || cfg->sites > GG_AR_MAX_SITES || cfg->self >= cfg->sites)
		return gg_errf(err, err_size, -EINVAL, "site %u of %u: need 2 to %d sites", cfg->self, cfg->sites,
			    GG_AR_MAX_SITES);
	if (cfg->count == 0)
		return gg_errf(err, err_size, -EINVAL, "an all-reduce needs at least one element");
	if (cfg->chunk_elems == 0 || cfg->chunk_elems % GG_CODEC_BLOCK_ALIGN_ELEMS ||
	    cfg->chunk_elems > cfg->enc->cfg.max_elems)
		return gg_errf(err, err_size, -EINVAL, "chunk of %u elements: must be a multiple of %u and at most %llu",
			    cfg->chunk_elems, GG_CODEC_BLOCK_ALIGN_ELEMS,
			    (unsigned long long)cfg->enc->cfg.max_elems);
	if (cfg->algo != GG_ALLREDUCE_DIRECT && cfg->algo != GG_ALLREDUCE_RING)
		return gg_errf(err, err_size, -EINVAL, "unknown all-reduce algorithm %d", (int)cfg->algo);
	if (cfg->parts ? cfg->part >= cfg->parts : cfg->part != 0)
		return gg_errf(err, err_size, -EINVAL, "part %u of %u", cfg->part, cfg->parts);
	if (cfg->mem && cfg->feedback)
		return gg_errf(err, err_size, -EINVAL, "error feedback in host memory for a step whose tensors are not");
	if (cfg->feedback && cfg->feedback->elems < cfg->count)
		return gg_errf(err, err_size, -EINVAL, "error feedback covers %zu elements, the step has %llu",
			    cfg->feedback->elems, (unsigned long long)cfg->count);

	s = calloc(1, sizeof(*s));
	if (!s)
		return gg_errf(err, err_size, -ENOMEM, "no memory for a step of %llu elements",
			       (unsigned long long)cfg->count);
	s->cfg = *cfg;
	if (!s->cfg.parts)
		s->cfg.parts = 1;
	s->next_own = s->cfg.part;
	s->ops = ops;
	s->ctx = ctx;
	s->input = input;
	s->result = result;
	s->own_in_place = input == result && !cfg->feedback && !(cfg->mem && cfg->mem->feedback) &&
			  cfg->enc->cfg.codec.codec == GG_CODEC_FP32;
	s->sweep = !cfg->enc->cfg.zstd && !cfg->mem;
	shard_bounds(cfg, s->shard_lo);
	rc = gg_frame_bound(&cfg->enc->cfg.codec, cfg->chunk_elems, &s->frame_cap);
	if (rc) {
		gg_errf(err, err_size, rc, "frames of %u elements: %s", cfg->chunk_elems, strerror(-rc));
		goto fail;
	}
	if (cfg->feedback && !(s->fb_scratch = malloc(sizeof(float) * cfg->chunk_elems)))
		goto nomem;
	if (cfg->algo == GG_ALLREDUCE_DIRECT) {
		uint64_t nchunks = (cfg->count + cfg->chunk_elems - 1) / cfg->chunk_elems;
		if (nchunks > UINT32_MAX) {
			rc = gg_errf(err, err_size, -EINVAL, "%llu chunks are too many for one step", (unsigned long long)nchunks);
			goto fail;
		}
		s->nchunks = (uint32_t)nchunks;
		s->next_site = calloc(s->nchunks, 1);
		s->pending = calloc((size_t)cfg->sites * s->nchunks, sizeof(*s->pending));
		if (!s->next_site || !s->pending)
			goto nomem;
		s->own_chunks = s->nchunks;
		s->part_chunks = part_count(s, s->nchunks);
		rc = direct_emit(s, 0, err, err_size);
	} else {
		for (unsigned j = 0; j < cfg->sites; j++) {
			uint64_t len = s->shard_lo[j + 1] - s->shard_lo[j];
			uint64_t chunks = (len + cfg->chunk_elems - 1) / cfg->chunk_elems;
			if (chunks + s->chunk_base[j] > UINT32_MAX) {
				rc = gg_errf(err, err_size, -EINVAL, "too many chunks for one step");
				goto fail;
			}
			s->shard_chunks[j] = (uint32_t)chunks;
			s->chunk_base[j + 1] = s->chunk_base[j] + (uint32_t)chunks;
		}
		s->nchunks = s->chunk_base[cfg->sites];
		s->got = calloc(s->nchunks ? s->nchunks : 1, 1);
		if (!s->got)
			goto nomem;
		if (cfg->mem) {
			char why[GG_AR_ERROR_MAX];
			if ((rc = cfg->mem->ops->alloc(cfg->mem->ctx, cfg->chunk_elems, &s->scratch, why, sizeof(why)))) {
				rc = gg_errf(err, err_size, rc, "the ring's scratch of %u elements: %s", cfg->chunk_elems,
					     why);
				goto fail;
			}
		} else if (!(s->scratch = malloc(sizeof(float) * cfg->chunk_elems))) {
			goto nomem;
		}
		s->own_chunks = s->shard_chunks[ring_start_shard(s)];
		for (unsigned j = 0; j < cfg->sites; j++)
			s->part_chunks += part_count(s, s->shard_chunks[j]);
		rc = ring_emit(s, err, err_size);
	}
	if (rc)
		goto fail;
	*out = s;
	return 0;
nomem:
	rc = gg_errf(err, err_size, -ENOMEM, "no memory for a step of %llu elements", (unsigned long long)cfg->count);
fail:
	gg_ar_step_free(s);
	return rc;
}

bool gg_ar_step_done(const struct gg_ar_step *s)
{
	return !s->failed && s->chunks_done == s->part_chunks;
}

bool gg_ar_step_first_missing(const struct gg_ar_step *s, unsigned *from, struct gg_ar_chunk_id *id)
{
	if (s->cfg.algo == GG_ALLREDUCE_DIRECT) {
		for (uint32_t c = s->cfg.part; c < s->nchunks; c += s->cfg.parts) {
			/* A chunk waiting for this site's own frame, which waits for
			 * room on the streams, names no peer that failed to send. */
			if (s->next_site[c] == s->cfg.self && c >= s->next_own)
				continue;
			/* Site 0's frame, at hand, may wait for site 1's to be
			 * decoded with it (direct_reduce()): site 1's is missing. */
			unsigned site = s->next_site[c];
			if (site == 0 && s->pending[c] && s->cfg.sites > 1)
				site = 1;
			if (site < s->cfg.sites) {
				*from = site;
				*id = (struct gg_ar_chunk_id){ GG_AR_DIRECT, (uint8_t)*from, c };
				return true;
			}
		}
		return false;
	}
	*from = ring_prev(s);
	for (unsigned j = 0; j < s->cfg.sites; j++) {
		for (uint32_t c = s->cfg.part; c < s->shard_chunks[j]; c += s->cfg.parts) {
			uint8_t got = s->got[s->chunk_base[j] + c];
			for (unsigned bit = 0; bit < 2; bit++) {
				unsigned phase = bit ? GG_AR_GATHER : GG_AR_SCATTER;
				if (ring_expects(s, phase, j) && !(got & (1u << bit))) {
					*id = (struct gg_ar_chunk_id){ (uint8_t)phase, (uint8_t)j, c };
					return true;
				}
			}
		}
	}
	return false;
}

bool gg_ar_step_heard_from(const struct gg_ar_step *s, unsigned from)
{
	return from < s->cfg.sites && (s->heard >> from & 1);
}

uint64_t gg_ar_step_expected_from(const struct gg_ar_step *s, unsigned from)
{
	uint64_t total = 0;

	if (from >= s->cfg.sites || from == s->cfg.self)
		return 0;
	if (s->cfg.algo == GG_ALLREDUCE_DIRECT)
		return part_count(s, s->nchunks);
	if (from != ring_prev(s))
		return 0;
	for (unsigned j = 0; j < s->cfg.sites; j++)
		total += part_count(s, s->shard_chunks[j]) *
			 (uint64_t)(ring_expects(s, GG_AR_SCATTER, j) + ring_expects(s, GG_AR_GATHER, j));
	return total;
}

uint64_t gg_ar_step_wire_bytes_out(const struct gg_ar_step *s)
{
	return s->bytes_out;
}

void gg_ar_step_free(struct gg_ar_step *s)
{
	if (!s)
		return;
	if (s->pending)
		for (size_t i = 0; i < (size_t)s->cfg.sites * s->nchunks; i++)
			gg_buf_put(s->pending[i]);
	free(s->pending);
	free(s->next_site);
	free(s->got);
	if (s->cfg.mem)
		s->cfg.mem->ops->free(s->cfg.mem->ctx, s->scratch, s->cfg.chunk_elems);
	else
		free(s->scratch);
	free(s->fb_scratch);
	free(s);
}

double gg_ar_model_seconds(enum gg_allreduce_algo algo, unsigned sites, uint64_t count, double elem_bytes,
			   double uplink, double one_way)
{
	const double K = sites, E = (double)count * elem_bytes;

	if (uplink <= 0)
		return 0;
	if (algo == GG_ALLREDUCE_DIRECT)
		return (K - 1) * E / uplink + one_way;
	return 2 * (K - 1) * E / (K * uplink) + 2 * (K - 1) * one_way;
}

uint64_t gg_ar_direct_max(unsigned sites, double elem_bytes, double uplink, double one_way)
{
	return gg_ar_direct_max_scaled(sites, elem_bytes, uplink, one_way, 1, 1);
}

uint64_t gg_ar_direct_max_scaled(unsigned sites, double elem_bytes, double uplink, double one_way, double f_direct,
				 double f_ring)
{
	const double K = sites;

	if (sites <= 2 && f_direct <= f_ring)
		return UINT64_MAX;
	if (uplink <= 0 || elem_bytes <= 0)
		return 0;
	/* f_d ((K-1) E/U + d) <= f_r (2(K-1) E/(K U) + 2(K-1) d)
	 * <=>  a E <= b  with  a = (K-1)(f_d - 2 f_r/K)/U,  b = d (2(K-1) f_r - f_d) */
	const double a = (K - 1) * (f_direct - 2 * f_ring / K) / uplink, b = one_way * (2 * (K - 1) * f_ring - f_direct);
	if (a <= 0) /* direct's time grows no faster: it wins at every size or, rarely, at large ones only */
		return b >= 0 ? UINT64_MAX : 0;
	if (b < 0)
		return 0;
	double max = b / a / elem_bytes;
	return max >= 0x1p63 ? UINT64_MAX : (uint64_t)max;
}

uint32_t gg_ar_auto_chunk(enum gg_allreduce_algo algo, unsigned sites, uint64_t count, uint32_t max_chunk)
{
	if (algo != GG_ALLREDUCE_RING || sites < 2 || max_chunk <= GG_AR_AUTO_CHUNK_MIN ||
	    count / sites < (uint64_t)GG_AR_AUTO_CHUNKS_LEAST * GG_AR_AUTO_CHUNK_MIN)
		return max_chunk;
	const uint64_t want = count / sites / GG_AR_RING_CHUNKS_PER_SHARD;
	if (want >= max_chunk)
		return max_chunk;
	uint32_t chunk = GG_AR_AUTO_CHUNK_MIN;
	while (2 * (uint64_t)chunk <= want)
		chunk *= 2;
	return chunk;
}

unsigned gg_ar_auto_chunk_sizes(uint32_t max_chunk, uint32_t *sizes, unsigned n)
{
	if (max_chunk <= GG_AR_AUTO_CHUNK_MIN)
		return 0;
	uint32_t chunk = GG_AR_AUTO_CHUNK_MIN;
	while (2 * (uint64_t)chunk < max_chunk)
		chunk *= 2;
	unsigned k = 0;
	for (; k < n && chunk >= GG_AR_AUTO_CHUNK_MIN; chunk /= 2)
		sizes[k++] = chunk;
	return k;
}
