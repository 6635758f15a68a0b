/* One cross-site all-reduce step at one site.
 *
 * The step is a state machine that owns no socket and never blocks: the
 * owner hands it the frames peers sent (gg_ar_step_on_frame) and ships the
 * frames it emits (ops->send). Encoding, decoding and reducing happen
 * inside those calls, chunk by chunk, so they overlap with the transfers of
 * the other chunks.
 *
 * Every site ends with the same result bytes because each sum is computed
 * in an order fixed by site index, never by arrival order:
 *
 * direct  Every site encodes its input (its site sum) chunk by chunk and
 *         sends each chunk to every other site. Chunk c of the result is
 *         decode(site 0) + decode(site 1) + ... + decode(site K-1), the
 *         site's own chunk decoded from its own encoding like the others.
 *         Frames that arrive before their turn wait, bounded by the step.
 *
 * ring    The tensor is cut into K shards, shard j = [b(j), b(j+1)) with
 *         b(0) = 0, b(K) = N and b(j) = floor(jN/K) rounded down to a
 *         multiple of 32 (so codec blocks stay aligned). Reduce-scatter: shard j is summed along the
 *         ring j+1, j+2, ..., j (mod K); each site adds its input to the
 *         decoded partial it received from its predecessor (partial +
 *         input, one fp32 add) and sends the encoded new partial to its
 *         successor. Site j, last, holds the full sum of shard j, encodes it
 *         once and uses the decoded encoding as its own result. All-gather:
 *         that encoding travels on around the ring byte for byte, and every
 *         site decodes the same bytes.
 *
 * With error feedback, what an encoding drops is added to the input of the
 * same site's encoding of the same elements in the next step; each site
 * encodes each element exactly once per step in both algorithms. */
#ifndef GG_ALLREDUCE_H
#define GG_ALLREDUCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "feedback.h"
#include "frame.h"
#include "buf.h"
#include "gg_common.h"
#include "wire.h"

#define GG_AR_ERROR_MAX 256

struct gg_ar_ops {
	/* Takes a reference to `frame` for as long as it needs the bytes
	 * (gg_buf_get / gg_buf_put). Returns 0 or a negative errno,
	 * which fails the step. */
	int (*send)(void *ctx, unsigned to_site, const struct gg_ar_chunk_id *id, struct gg_buf *frame);
	/* May the step encode another chunk of its own input now? A step
	 * emits its own chunks (every chunk for direct, its starting shard for
	 * ring) only while this says yes, so encoding keeps pace with the
	 * network instead of running ahead of it; the owner calls
	 * gg_ar_step_resume() when room comes. NULL: always. */
	bool (*may_encode)(void *ctx);
	/* The input's elements [offset, offset + n) are read next: the owner
	 * makes them ready (forms the site sum). Each element's range is
	 * gathered once, before the step reads it. NULL: the input is ready. */
	void (*gather)(void *ctx, uint64_t offset, uint64_t n);
	/* The result's elements [offset, offset + n) are final, once each.
	 * NULL: nobody needs to know before the step is done. */
	void (*deliver)(void *ctx, uint64_t offset, uint64_t n);
};

/* Where a step's tensors live, when not in host memory: the passes over
 * input, result and scratch memory that the step cannot make itself. The
 * step never reads or writes that memory but through these; frames stay in
 * host memory (the owner sends and receives them there). Each call returns
 * 0 or a negative errno with one line in err, and is done when it returns.
 * docs/design.md, "Tensors on a GPU". */
struct gg_ar_mem_ops {
	/* The frame of src[0..n), elements [offset, offset + n) of the tensor,
	 * into frame[0..cap) in host memory: exactly the bytes gg_frame_encode()
	 * (or, when the memory applies error feedback, gg_feedback_encode()
	 * and gg_frame_wrap()) would make of the same elements in host memory,
	 * with enc's settings; *len its size. */
	int (*encode)(void *ctx, struct gg_frame_encoder *enc, uint64_t offset, const float *src, uint64_t n,
		      uint8_t *frame, uint64_t cap, size_t *len, char *err, size_t err_size);
	/* What gg_frame_decode() writes into host memory, written into
	 * out[0..n); refused as gg_frame_decode() refuses, with its messages,
	 * and then out is not touched. */
	int (*decode)(void *ctx, struct gg_frame_decoder *dec, const void *frame, size_t len, float *out, uint64_t n,
		      enum gg_frame_op op, char *err, size_t err_size);
	/* dst[0..n) = src[0..n); they do not overlap. */
	int (*copy)(void *ctx, float *dst, const float *src, uint64_t n, char *err, size_t err_size);
	/* Scratch memory for n floats into *out; and its release, with the
	 * same n (p NULL: nothing). */
	int (*alloc)(void *ctx, uint64_t n, float **out, char *err, size_t err_size);
	void (*free)(void *ctx, float *p, uint64_t n);
};

struct gg_ar_mem {
	const struct gg_ar_mem_ops *ops;
	void *ctx;
	/* encode() applies error feedback (its residuals are the memory's):
	 * a site's own frames then do not decode to its input. */
	bool feedback;
};

struct gg_ar_times {
	uint64_t encode_ns, decode_ns;
};

struct gg_ar_config {
	unsigned sites;       /* K, 2..GG_AR_MAX_SITES */
	unsigned self;        /* this site's index, 0..K-1 */
	enum gg_allreduce_algo algo;
	uint64_t count;       /* elements */
	uint32_t chunk_elems; /* elements per chunk, a multiple of 32 */
	/* Owned by the caller and reused across steps; one of each per thread. */
	struct gg_frame_encoder *enc; /* its cfg.max_elems >= chunk_elems */
	struct gg_frame_decoder *dec;
	struct gg_feedback *feedback; /* NULL: none; else covers count elements */
	/* NULL: input and result are host memory. Else where they live (with
	 * their error feedback, if any: feedback must then be NULL). */
	const struct gg_ar_mem *mem;
	struct gg_buf_pool *pool; /* NULL: frames are malloc'd */
	/* NULL, or where the step adds the time it spends encoding (error
	 * feedback included) and decoding, in nanoseconds. */
	struct gg_ar_times *times;
	/* This step handles the chunks c with c % parts == part only (chunk
	 * numbers as in struct gg_ar_chunk_id), so `parts` steps, one per
	 * thread, may share input and result and split the work. 0 and 0:
	 * every chunk. */
	unsigned part, parts;
};

struct gg_ar_step;

/* The site `self` sends its ring frames to: the next one, in site order. */
static inline unsigned gg_ar_ring_next(unsigned self, unsigned sites)
{
	return (self + 1) % sites;
}

/* The shard whose reduce-scatter the site `self` starts: the one before
 * its own, which it sends to gg_ar_ring_next() before any frame comes. */
static inline unsigned gg_ar_ring_start(unsigned self, unsigned sites)
{
	return (self + sites - 1) % sites;
}

/* Starts a step: `input` (count elements, this site's contribution) must
 * stay valid and unchanged but for the step's own writes, and `result`
 * (count elements) untouched by others, until the step is freed. They may
 * be the same memory (the step then sums in place): every element of the
 * input is read before the result is written there. Emits the step's
 * first frames (as many as ops->may_encode allows). Returns 0, -EINVAL
 * (bad config: err says what), -ENOMEM, or what ops->send returned. */
GG_MUST_CHECK int gg_ar_step_start(struct gg_ar_step **out, const struct gg_ar_config *cfg,
				   const float *input, float *result, const struct gg_ar_ops *ops,
				   void *ctx, char *err, size_t err_size);

/* Emits more of the step's own chunks while ops->may_encode allows.
 * Returns 0 or a negative errno with err set (the step is then failed). */
GG_MUST_CHECK int gg_ar_step_resume(struct gg_ar_step *s, char *err, size_t err_size);
/* True while own chunks wait for gg_ar_step_resume(). */
bool gg_ar_step_wants_resume(const struct gg_ar_step *s);

/* Hands the step a frame that site `from` sent for chunk `id`. The step
 * copies what it must keep: only a frame that arrives before its turn in
 * the site order; one in turn is decoded in place. A chunk already
 * received is ignored (a re-send after a reconnect): returns 1. Returns 0 when taken, or a negative errno
 * with err naming the site, the chunk and what is wrong: -EPROTO (a chunk
 * this site never expects from `from`), -EBADMSG / -EILSEQ / -E2BIG (the
 * frame's own checks), -ENOMEM. The step is then failed. */
GG_MUST_CHECK int gg_ar_step_on_frame(struct gg_ar_step *s, unsigned from, const struct gg_ar_chunk_id *id,
				      const void *frame, size_t len, char *err, size_t err_size);

/* "direct", "reduce-scatter" or "all-gather": a chunk id's phase as
 * messages name it. */
const char *gg_ar_phase_name(unsigned phase);

/* After gg_ar_step_on_frame() or gg_ar_step_resume() failed: the peer
 * whose frame is at fault (it broke the protocol, or does not pass its
 * own checks), which need not be `from` (a frame kept until its turn is
 * decoded when the frame before it comes, or when this site's own chunk
 * is made), or the number of sites where none is (no memory, a device's
 * error, this site's own frames, a step failed before). */
unsigned gg_ar_step_fault_site(const struct gg_ar_step *s);

/* True once every element of `result` in the step's part is final. */
bool gg_ar_step_done(const struct gg_ar_step *s);

/* The first chunk still awaited and the site it must come from (for the
 * message of a step that missed its deadline); false when none is. */
bool gg_ar_step_first_missing(const struct gg_ar_step *s, unsigned *from, struct gg_ar_chunk_id *id);

/* Whether any frame of the step came from site `from`. A site sends frames
 * of its own input as soon as it starts a step: none means it has not (or
 * they are still on their way). */
bool gg_ar_step_heard_from(const struct gg_ar_step *s, unsigned from);

/* Frames this step expects from `from` in all, and payload bytes it sent. */
uint64_t gg_ar_step_expected_from(const struct gg_ar_step *s, unsigned from);
uint64_t gg_ar_step_wire_bytes_out(const struct gg_ar_step *s);

void gg_ar_step_free(struct gg_ar_step *s);

/* The slice of the tensor a chunk covers: [*offset, *offset + *n). Shard
 * bounds for ring; the whole tensor for direct. False when id is out of
 * range for this config. */
bool gg_ar_chunk_range(const struct gg_ar_config *cfg, const struct gg_ar_chunk_id *id, uint64_t *offset,
		       uint64_t *n);

/* The link model behind algorithm auto (docs/design.md): every site sends
 * through an uplink of `uplink` bytes/s, `one_way` seconds from every
 * other site. A step of E encoded bytes then takes
 *   direct: (K-1) E / uplink + one_way         (its frame to every peer)
 *   ring:   2 (K-1) E / (K uplink) + 2 (K-1) one_way   (2 (K-1) hops of E/K)
 * Seconds one step of `count` elements at `elem_bytes` encoded bytes
 * each takes by `algo` (direct or ring). */
double gg_ar_model_seconds(enum gg_allreduce_algo algo, unsigned sites, uint64_t count, double elem_bytes,
			   double uplink, double one_way);
/* The largest step (elements) that direct does no slower than ring in the
 * model: UINT64_MAX for 2 sites (both move the same bytes, ring waits
 * twice), 0 when the link's figures are 0. */
uint64_t gg_ar_direct_max(unsigned sites, double elem_bytes, double uplink, double one_way);
/* The same with each algorithm's model time multiplied by its factor (what
 * its steps took over what the model said): 0 when ring is the faster at
 * every size, UINT64_MAX when direct is. */
uint64_t gg_ar_direct_max_scaled(unsigned sites, double elem_bytes, double uplink, double one_way, double f_direct,
				 double f_ring);

/* Algorithm auto: the chunk (elements) of a step of `count` elements by
 * `algo` where the configured chunk is `max_chunk`. Ring forwards a chunk
 * once it is whole, so each of its 2(K-1) hops holds a chunk back for the
 * time it takes to cross a link; a shard of fewer than
 * GG_AR_RING_CHUNKS_PER_SHARD chunks waits that much longer. A ring step
 * then gets `max_chunk` where that cuts its shards into at least that many
 * chunks, else the largest power of two that does, but never less than
 * GG_AR_AUTO_CHUNK_MIN (below it a chunk's own costs outweigh the
 * pipelining). A shard too small for GG_AR_AUTO_CHUNKS_LEAST chunks of
 * the least size keeps `max_chunk`: cutting it gained nothing at 1 Gbit/s
 * and lost a third of the step at 100 Mbit/s (docs/design.md).
 * Direct, which sends every chunk to its final site at once, keeps
 * `max_chunk`. The result depends only on settings every site shares, so
 * every site cuts a step alike. Changing any of these constants changes how
 * steps are cut: it needs a new GG_WIRE_VERSION. */
#define GG_AR_RING_CHUNKS_PER_SHARD 16u
#define GG_AR_AUTO_CHUNK_MIN (128u * 1024) /* elements: 512 KiB of float32 */
#define GG_AR_AUTO_CHUNKS_LEAST 4u
uint32_t gg_ar_auto_chunk(enum gg_allreduce_algo algo, unsigned sites, uint64_t count, uint32_t max_chunk);
/* The chunks other than `max_chunk` that gg_ar_auto_chunk() may pick,
 * largest first: writes up to `n` of them into sizes[] and returns how
 * many it wrote (0 when it never cuts below max_chunk). A node keeps a
 * buffer pool for each. */
unsigned gg_ar_auto_chunk_sizes(uint32_t max_chunk, uint32_t *sizes, unsigned n);

#endif
