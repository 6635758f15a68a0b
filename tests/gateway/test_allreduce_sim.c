/* The all-reduce step engine with K simulated sites in one process: frames
 * are delivered in a shuffled order, some twice, and every site must end
 * with the same bytes, equal to the fixed-order sum for fp32 and within
 * the codec's bound for the lossy codecs. Sites split their steps into 1
 * to 3 parts (as a gateway's lanes do), each site its own number.
 *
 * Every other site keeps its tensors in other memory, through the engine's
 * memory ops (struct gg_ar_mem), and must end with the host sites' bytes.
 * Here that memory is "fenced", as a GPU's would be to the host: the step
 * sees it at addresses mapped without access, and the test's ops reach the
 * same pages through a second mapping, so a step that touched it itself
 * would fault. Built with GG_SIM_CUDA (tests/gpu), it is the GPU's memory
 * with the ops of gateway/engine/mem_cuda.h, and the test exits 77 where
 * there is no GPU. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <stdatomic.h>
#include <unistd.h>

#include "fence_map.h"
#include "gg_check.h"
#include "allreduce.h"


#define MAX_PARTS 3

struct site;
/* Other memory: sets up site s's tensors of count elements (and its error
 * feedback when fb) there; puts the host's view of input and result there
 * before a step, and fetches the result after. */
static int other_init(struct site *s, size_t count, uint32_t chunk, bool fb);
static void other_fini(struct site *s);
static int other_upload(struct site *s, size_t count);
static int other_download(struct site *s, size_t count);

#ifndef GG_SIM_CUDA
#define FENCED_MAX 8

/* Memory the step may reach only through the memory ops: each allocation
 * is one memfd mapped twice, PROT_NONE where the step sees it (`fence`)
 * and read-write where the ops and the test touch it (`alias`). */
struct fenced {
	struct {
		uint8_t *fence, *alias;
		size_t size;
	} a[FENCED_MAX];
	struct gg_feedback fb;
	bool use_fb;
};

static float *fenced_alloc(struct fenced *z, uint64_t n)
{
	for (int i = 0; i < FENCED_MAX; i++) {
		if (z->a[i].fence)
			continue;
		void *fence, *alias;
		size_t size;
		if (fence_map(n * sizeof(float), &fence, &alias, &size))
			return NULL;
		z->a[i].fence = fence;
		z->a[i].alias = alias;
		z->a[i].size = size;
		return fence;
	}
	return NULL;
}

/* Where the ops reach fenced memory the step names by `p` (fenced[0..n)). */
static void *fenced_at(struct fenced *z, const void *p, uint64_t n)
{
	for (int i = 0; i < FENCED_MAX; i++) {
		const uint8_t *b = p;
		if (z->a[i].fence && b >= z->a[i].fence && n * sizeof(float) <= z->a[i].size &&
		    (size_t)(b - z->a[i].fence) <= z->a[i].size - n * sizeof(float))
			return z->a[i].alias + (b - z->a[i].fence);
	}
	CHECK(false, "the step passed %p (%llu elements) as fenced memory, which it is not", p,
	      (unsigned long long)n);
	abort();
}

/* The alias of what fenced_alloc() returned. */
static float *fenced_alias(struct fenced *z, float *fence)
{
	return fenced_at(z, fence, 0);
}

static void fenced_free(void *ctx, float *p, uint64_t n)
{
	struct fenced *z = ctx;

	(void)n;
	for (int i = 0; p && i < FENCED_MAX; i++) {
		if (z->a[i].fence != (uint8_t *)p)
			continue;
		fence_unmap(z->a[i].fence, z->a[i].alias, z->a[i].size);
		z->a[i].fence = z->a[i].alias = NULL;
		return;
	}
}

static int fenced_encode(void *ctx, struct gg_frame_encoder *enc, uint64_t offset, const float *src, uint64_t n,
			 uint8_t *frame, uint64_t cap, size_t *len, char *err, size_t err_size)
{
	struct fenced *z = ctx;
	const float *in = fenced_at(z, src, n);
	uint64_t raw;
	int rc;

	if (!z->use_fb) {
		rc = gg_frame_encode(enc, in, n, frame, cap, len);
	} else {
		rc = gg_codec_encoded_bytes(&enc->cfg.codec, n, &raw);
		if (!rc)
			rc = gg_feedback_encode(&z->fb, &enc->cfg.codec, offset, in, n, frame + GG_FRAME_HEADER_BYTES, raw,
						z->fb.scratch);
		if (!rc)
			rc = gg_frame_wrap(enc, frame + GG_FRAME_HEADER_BYTES, raw, n, frame, cap, len);
	}
	if (rc)
		snprintf(err, err_size, "fenced encode: %s", strerror(-rc));
	return rc;
}

static int fenced_decode(void *ctx, struct gg_frame_decoder *dec, const void *frame, size_t len, float *out,
			 uint64_t n, enum gg_frame_op op, char *err, size_t err_size)
{
	return gg_frame_decode(dec, frame, len, fenced_at(ctx, out, n), n, op, NULL, err, err_size);
}

static int fenced_copy(void *ctx, float *dst, const float *src, uint64_t n, char *err, size_t err_size)
{
	(void)err, (void)err_size;
	memcpy(fenced_at(ctx, dst, n), fenced_at(ctx, src, n), n * sizeof(float));
	return 0;
}

static int fenced_scratch(void *ctx, uint64_t n, float **out, char *err, size_t err_size)
{
	*out = fenced_alloc(ctx, n);
	return *out ? 0 : gg_errf(err, err_size, -ENOMEM, "no memory for %llu fenced floats", (unsigned long long)n);
}

static const struct gg_ar_mem_ops fenced_ops = { .encode = fenced_encode, .decode = fenced_decode,
						 .copy = fenced_copy, .alloc = fenced_scratch,
						 .free = fenced_free };

struct other {
	struct fenced z;
	struct gg_ar_mem mem;
};
#else
#include "dev_mem.h"
#include "dev_skip.h"
#include "mem_cuda.h"

struct other {
	struct gg_ar_mem_cuda m;
	struct gg_feedback_cuda fb;
	bool use_fb;
};
#endif

#if !defined(GG_SIM_CUDA) || defined(GG_SIM_CUDA_DOUBLE)
/* Code that reads or writes fenced memory itself (the step here, or the
 * GPU ops with the CUDA double's device memory) faults: say so. */
static void on_fault(int sig, siginfo_t *si, void *uc)
{
	static const char msg[] = "FAIL: fenced memory touched directly, not through the memory ops\n";

	(void)sig, (void)si, (void)uc;
	if (write(STDERR_FILENO, msg, sizeof(msg) - 1) < 0)
		_exit(2);
	_exit(1);
}
#endif

struct msg {
	unsigned from, to;
	struct gg_ar_chunk_id id;
	struct gg_buf *frame;
};

struct net {
	struct msg *q;
	size_t len, cap;
	uint64_t rng;
};

struct site {
	struct net *net;
	unsigned index;
	struct gg_frame_encoder enc;
	struct gg_frame_decoder dec;
	struct gg_feedback fb;
	bool use_fb;
	struct gg_ar_step *step[MAX_PARTS];
	unsigned parts;
	struct gg_buf_pool pool; /* small, so frames both come back and overflow it */
	float *input, *result;   /* as the test reads and writes them */
	struct other *other;     /* NULL: host memory; else input and result are there */
	const struct gg_ar_mem *mem;
	float *step_input, *step_result; /* as the step sees them */
	uint8_t *seen;           /* per element: 1 gathered, 2 delivered too */
};

static uint64_t next_rand(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static float gauss(uint64_t *s)
{
	double u1 = ((double)(next_rand(s) >> 11) + 1.0) / 9007199254740993.0;
	double u2 = (double)(next_rand(s) >> 11) / 9007199254740992.0;
	return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static int net_send(void *ctx, unsigned to, const struct gg_ar_chunk_id *id, struct gg_buf *f)
{
	struct site *from = ctx;
	struct net *n = from->net;

	if (n->len == n->cap) {
		n->cap = n->cap ? n->cap * 2 : 256;
		n->q = realloc(n->q, n->cap * sizeof(*n->q));
		if (!n->q)
			return -ENOMEM;
	}
	gg_buf_get(f);
	n->q[n->len++] = (struct msg){ from->index, to, *id, f };
	return 0;
}

/* Refuses about one time in three: steps must stop encoding their own
 * chunks and go on when resumed, with the same results. */
static bool net_may_encode(void *ctx)
{
	struct site *from = ctx;
	return next_rand(&from->net->rng) % 3 != 0;
}

/* Every element is gathered once, before it is first read, and delivered
 * once, after it was gathered. */
static void net_gather(void *ctx, uint64_t offset, uint64_t n)
{
	struct site *s = ctx;

	for (uint64_t i = offset; i < offset + n; i++) {
		CHECK(s->seen[i] == 0, "site %u: element %llu gathered twice", s->index, (unsigned long long)i);
		s->seen[i] = 1;
	}
}

static void net_deliver(void *ctx, uint64_t offset, uint64_t n)
{
	struct site *s = ctx;

	for (uint64_t i = offset; i < offset + n; i++) {
		CHECK(s->seen[i] == 1, "site %u: element %llu delivered %s", s->index, (unsigned long long)i,
		      s->seen[i] ? "twice" : "before it was gathered");
		s->seen[i] = 2;
	}
}

static const struct gg_ar_ops net_ops = { .send = net_send, .may_encode = net_may_encode, .gather = net_gather,
					  .deliver = net_deliver };

/* Frames of the lossy codecs with zstd (true), or not, as a gateway's by
 * default: the first two sites' frames of a chunk are then decoded in one
 * sweep at the host sites, one after the other at the others. */
static bool lossy_zstd = true;

static int site_init(struct site *s, struct net *net, unsigned index, enum gg_codec codec, uint32_t chunk,
		     size_t count, bool fb, bool other)
{
	struct gg_frame_config fc = { .codec = gg_codec_defaults(codec), .zstd = codec != GG_CODEC_FP32 && lossy_zstd,
				      .zstd_level = 1, .max_elems = chunk };
	struct gg_frame_limits lim = { .max_elems = chunk };
	uint64_t bound;

	memset(s, 0, sizeof(*s));
	s->net = net;
	s->index = index;
	s->use_fb = fb;
	if (gg_frame_bound(&fc.codec, chunk, &bound) || gg_frame_encoder_init(&s->enc, &fc))
		return -1;
	lim.max_raw_bytes = bound;
	if (gg_frame_decoder_init(&s->dec, &lim))
		return -1;
	gg_buf_pool_init(&s->pool, bound, 4);
	s->seen = calloc(count, 1);
	if (!s->seen)
		return -1;
	if (other)
		return other_init(s, count, chunk, fb);
	if (fb && gg_feedback_init(&s->fb, count, chunk))
		return -1;
	s->input = s->step_input = malloc(count * sizeof(float));
	s->result = s->step_result = malloc(count * sizeof(float));
	return s->input && s->result ? 0 : -1;
}

#ifndef GG_SIM_CUDA
static int other_init(struct site *s, size_t count, uint32_t chunk, bool fb)
{
	if (!(s->other = calloc(1, sizeof(*s->other))))
		return -1;
	struct fenced *z = &s->other->z;
	z->use_fb = fb;
	if (fb && gg_feedback_init(&z->fb, count, chunk))
		return -1;
	s->other->mem = (struct gg_ar_mem){ .ops = &fenced_ops, .ctx = z, .feedback = fb };
	s->mem = &s->other->mem;
	s->step_input = fenced_alloc(z, count);
	s->step_result = fenced_alloc(z, count);
	if (!s->step_input || !s->step_result)
		return -1;
	s->input = fenced_alias(z, s->step_input);
	s->result = fenced_alias(z, s->step_result);
	return 0;
}

static void other_fini(struct site *s)
{
	struct fenced *z = &s->other->z;

	if (z->use_fb)
		gg_feedback_fini(&z->fb);
	fenced_free(z, s->step_input, 0);
	fenced_free(z, s->step_result, 0);
	for (int i = 0; i < FENCED_MAX; i++)
		CHECK(!z->a[i].fence, "site %u: the step left fenced memory allocated", s->index);
	free(s->other);
}

/* The test reads and writes fenced memory through its aliases. */
static int other_upload(struct site *s, size_t count)
{
	(void)s, (void)count;
	return 0;
}

static int other_download(struct site *s, size_t count)
{
	(void)s, (void)count;
	return 0;
}
#else
static int other_init(struct site *s, size_t count, uint32_t chunk, bool fb)
{
	char err[256] = "no frame bound for the chunk";
	uint64_t bound;

	(void)chunk;
	if (!(s->other = calloc(1, sizeof(*s->other))))
		return -1;
	s->other->use_fb = fb;
	if (gg_frame_bound(&s->enc.cfg.codec, s->enc.cfg.max_elems, &bound) ||
	    (fb && gg_feedback_init_cuda(&s->other->fb, count, err, sizeof(err))) ||
	    gg_ar_mem_cuda_init(&s->other->m, bound, fb ? &s->other->fb : NULL, err, sizeof(err)) ||
	    gg_dev_alloc((void **)&s->step_input, count * sizeof(float), err, sizeof(err)) ||
	    gg_dev_alloc((void **)&s->step_result, count * sizeof(float), err, sizeof(err))) {
		printf("site %u: %s\n", s->index, err);
		return -1;
	}
	s->mem = &s->other->m.mem;
	s->input = malloc(count * sizeof(float));
	s->result = malloc(count * sizeof(float));
	return s->input && s->result ? 0 : -1;
}

static void other_fini(struct site *s)
{
	gg_ar_mem_cuda_fini(&s->other->m);
	if (s->other->use_fb)
		gg_feedback_fini_cuda(&s->other->fb);
	gg_dev_free(s->step_input);
	gg_dev_free(s->step_result);
	free(s->input);
	free(s->result);
	free(s->other);
}

static int other_upload(struct site *s, size_t count)
{
	char err[256];
	void *st = s->other->m.stream;

	if (gg_dev_copy(s->step_input, s->input, count * sizeof(float), st, err, sizeof(err)) ||
	    gg_dev_copy(s->step_result, s->result, count * sizeof(float), st, err, sizeof(err)) ||
	    gg_dev_sync(st, err, sizeof(err))) {
		printf("site %u: %s\n", s->index, err);
		return -1;
	}
	return 0;
}

static int other_download(struct site *s, size_t count)
{
	char err[256];
	void *st = s->other->m.stream;

	if (gg_dev_copy(s->result, s->step_result, count * sizeof(float), st, err, sizeof(err)) ||
	    gg_dev_sync(st, err, sizeof(err))) {
		printf("site %u: %s\n", s->index, err);
		return -1;
	}
	return 0;
}
#endif

static void free_steps(struct site *s)
{
	for (unsigned p = 0; p < MAX_PARTS; p++) {
		gg_ar_step_free(s->step[p]);
		s->step[p] = NULL;
	}
}

static void site_fini(struct site *s)
{
	free_steps(s);
	gg_buf_pool_fini(&s->pool);
	gg_frame_encoder_fini(&s->enc);
	gg_frame_decoder_fini(&s->dec);
	free(s->seen);
	if (s->other) {
		other_fini(s);
		return;
	}
	if (s->use_fb)
		gg_feedback_fini(&s->fb);
	free(s->input);
	free(s->result);
}

/* Runs one step on every site, delivering frames in random order and
 * re-delivering about one in eight. Returns 0 when every site finished. */
static int run_step(struct site *sites, unsigned K, enum gg_allreduce_algo algo, size_t count, uint32_t chunk,
		    struct net *net)
{
	char err[GG_AR_ERROR_MAX];

	for (unsigned k = 0; k < K; k++) {
		free_steps(&sites[k]);
		/* Every other site sums in place, as the gateway's backends do:
		 * input and result are then the same memory. */
		bool in_place = (k + count) % 2 == 0;
		if (in_place)
			memcpy(sites[k].result, sites[k].input, count * sizeof(float));
		else
			memset(sites[k].result, 0xa5, count * sizeof(float)); /* sentinel */
		sites[k].parts = 1 + (unsigned)((k + count / 7) % MAX_PARTS);
		memset(sites[k].seen, 0, count);
		if (sites[k].other && other_upload(&sites[k], count))
			return -1;
		for (unsigned p = 0; p < sites[k].parts; p++) {
			struct gg_ar_config cfg = { .sites = K, .self = k, .algo = algo, .count = count,
						    .chunk_elems = chunk, .enc = &sites[k].enc, .dec = &sites[k].dec,
						    .feedback = sites[k].use_fb && !sites[k].other ? &sites[k].fb : NULL,
						    .mem = sites[k].mem,
						    .pool = k % 2 ? &sites[k].pool : NULL, .part = p,
						    .parts = sites[k].parts };
			if (gg_ar_step_start(&sites[k].step[p], &cfg,
					     in_place ? sites[k].step_result : sites[k].step_input,
					     sites[k].step_result, &net_ops, &sites[k], err, sizeof(err))) {
				printf("start at site %u part %u: %s\n", k, p, err);
				return -1;
			}
		}
	}
	for (;;) {
		/* Own chunks held back go on at random moments, and surely once
		 * nothing else is left to deliver. */
		bool held = false;
		for (unsigned k = 0; k < K; k++) {
			for (unsigned p = 0; p < sites[k].parts; p++) {
				if (!gg_ar_step_wants_resume(sites[k].step[p]))
					continue;
				held = true;
				if (!net->len || next_rand(&net->rng) % 4 == 0)
					CHECK(gg_ar_step_resume(sites[k].step[p], err, sizeof(err)) == 0, "resume: %s", err);
			}
		}
		if (!net->len && !held)
			break;
		if (!net->len)
			continue;
		size_t pick = next_rand(&net->rng) % net->len;
		struct msg m = net->q[pick];
		bool again = next_rand(&net->rng) % 8 == 0;
		if (!again)
			net->q[pick] = net->q[--net->len];
		struct gg_ar_step *to = sites[m.to].step[m.id.chunk % sites[m.to].parts];
		int rc = gg_ar_step_on_frame(to, m.from, &m.id, m.frame->data, m.frame->len, err, sizeof(err));
		if (again)
			CHECK(rc == 0 || rc == 1, "rc %d", rc);
		if (rc < 0) {
			printf("site %u: %s\n", m.to, err);
			return -1;
		}
		if (!again)
			gg_buf_put(m.frame);
		/* A frame delivered twice must be a no-op the second time. */
		if (again) {
			rc = gg_ar_step_on_frame(to, m.from, &m.id, m.frame->data, m.frame->len, err, sizeof(err));
			CHECK(rc == 1, "second delivery of a frame returned %d", rc);
			net->q[pick] = net->q[--net->len];
			gg_buf_put(m.frame);
		}
	}
	for (unsigned k = 0; k < K; k++) {
		if (sites[k].other && other_download(&sites[k], count))
			return -1;
		for (unsigned p = 0; p < sites[k].parts; p++) {
			if (gg_ar_step_done(sites[k].step[p]))
				continue;
			unsigned from = 0;
			struct gg_ar_chunk_id id = { 0 };
			gg_ar_step_first_missing(sites[k].step[p], &from, &id);
			printf("site %u part %u not done: missing phase %u origin %u chunk %u from %u\n", k, p,
			       id.phase, id.origin, id.chunk, from);
			return -1;
		}
		for (size_t i = 0; i < count; i++)
			CHECK(sites[k].seen[i] == 2, "site %u: element %zu was never delivered", k, i);
	}
	return 0;
}

/* Bit for bit; on a GPU, a NaN may come out as another NaN: its sign and
 * payload are not part of the codecs' contract (cuda/codec_cuda.h). */
static bool results_equal(const float *a, const float *b, size_t n)
{
#if defined(GG_SIM_CUDA) && !defined(GG_SIM_CUDA_DOUBLE)
	for (size_t i = 0; i < n; i++)
		if (memcmp(&a[i], &b[i], sizeof(float)) && !(isnan(a[i]) && isnan(b[i])))
			return false;
	return true;
#else
	return !memcmp(a, b, n * sizeof(float));
#endif
}

/* The sum in the order the algorithm fixes (fp32, one rounding per add). */
static float ref_sum(struct site *sites, unsigned K, enum gg_allreduce_algo algo, size_t count, size_t i)
{
	if (algo == GG_ALLREDUCE_DIRECT) {
		float acc = sites[0].input[i];
		for (unsigned k = 1; k < K; k++)
			acc = acc + sites[k].input[i];
		return acc;
	}
	unsigned j = 0;
	while (j + 1 < K && (uint64_t)count * (j + 1) / K / 32 * 32 <= i)
		j++;
	float acc = sites[(j + 1) % K].input[i];
	for (unsigned m = 2; m <= K; m++)
		acc = acc + sites[(j + m) % K].input[i];
	return acc;
}

static void check_case(enum gg_codec codec, enum gg_allreduce_algo algo, unsigned K, size_t count, uint32_t chunk,
		       uint64_t seed)
{
	struct site sites[GG_AR_MAX_SITES];
	struct net net = { .rng = seed * 2654435761u + 1 };
	const char *name = gg_codec_name(codec);
	const char *aname = gg_allreduce_algo_name(algo);
	uint64_t rng = seed + 7;

	for (unsigned k = 0; k < K; k++)
		if (site_init(&sites[k], &net, k, codec, chunk, count, false, (k + seed) % 2 == 1)) {
			CHECK(0, "site init");
			return;
		}
	for (unsigned k = 0; k < K; k++)
		for (size_t i = 0; i < count; i++)
			sites[k].input[i] = gauss(&rng) * (i % 97 == 0 ? 100.0f : 1.0f);
	/* Non-finite values must come out non-finite wherever they were. */
	size_t inf_at = count / 3, nan_at = count - 1;
	if (count > 2) {
		sites[K - 1].input[inf_at] = INFINITY;
		sites[0].input[nan_at] = NAN;
	}
	int rc = run_step(sites, K, algo, count, chunk, &net);
	CHECK(rc == 0, "%s %s K=%u n=%zu: step failed", name, aname, K, count);
	/* Largest finite magnitude per 32-element group and site: codec blocks
	 * are 256 elements aligned to 32, so the block of element i lies within
	 * 255 elements of it. */
	size_t groups = (count + 31) / 32;
	float *gmax = calloc(groups * K, sizeof(float));
	for (unsigned k = 0; k < K; k++)
		for (size_t i = 0; i < count; i++)
			if (isfinite(sites[k].input[i]))
				gmax[k * groups + i / 32] = fmaxf(gmax[k * groups + i / 32], fabsf(sites[k].input[i]));
	if (rc == 0) {
		for (unsigned k = 1; k < K; k++)
			CHECK(results_equal(sites[0].result, sites[k].result, count),
			      "%s %s K=%u n=%zu: site %u's result differs from site 0's", name, aname, K, count, k);
		size_t bad = 0;
		for (size_t i = 0; i < count && bad < 3; i++) {
			float got = sites[0].result[i];
			if (count > 2 && (i == inf_at || i == nan_at)) {
				if (isfinite(got)) {
					bad++;
					CHECK(0, "%s %s K=%u: element %zu is %g, must stay non-finite", name, aname, K, i,
					      got);
				}
				continue;
			}
			float want = ref_sum(sites, K, algo, count, i);
			if (codec == GG_CODEC_FP32) {
				if (memcmp(&got, &want, sizeof(got))) {
					bad++;
					CHECK(0, "%s %s K=%u n=%zu: element %zu is %a, fixed-order sum is %a", name, aname,
					      K, count, i, got, want);
				}
				continue;
			}
			/* Each site encodes once per element; every encoding errs by at
			 * most half a step of its block's scale (int) or 2^-9 relative
			 * (bf16), and a ring partial is at most the sum of magnitudes. */
			double mag = 0, blockmax = 0;
			size_t g0 = i >= 255 ? (i - 255) / 32 : 0, g1 = GG_MIN(groups - 1, (i + 255) / 32);
			for (unsigned k = 0; k < K; k++) {
				mag += fabs(sites[k].input[i]);
				double m = 0;
				for (size_t g = g0; g <= g1; g++)
					m = fmax(m, gmax[k * groups + g]);
				blockmax += m;
			}
			double q = codec == GG_CODEC_INT8 ? 127 : codec == GG_CODEC_INT4 ? 7 : 0;
			double tol = q ? K * blockmax / q : K * mag / 256.0;
			if (fabs((double)got - (double)want) > tol + 1e-30) {
				bad++;
				CHECK(0, "%s %s K=%u n=%zu: element %zu is %g, sum %g, error above bound %g", name,
				      aname, K, count, i, got, want, tol);
			}
		}
	}
	free(gmax);
	for (unsigned k = 0; k < K; k++)
		site_fini(&sites[k]);
	for (size_t i = 0; i < net.len; i++)
		gg_buf_put(net.q[i].frame);
	free(net.q);
}

/* With a constant input the codec drops the same amount every step: without
 * feedback the error of the running sum grows linearly; with it, it stays
 * within about one step's error. */
static void check_feedback(enum gg_allreduce_algo algo)
{
	enum { K = 3, N = 5000, STEPS = 120, CHUNK = 1024 };
	struct site sites[K];
	double err_end[2];

	for (int fb = 0; fb <= 1; fb++) {
		struct net net = { .rng = 99 };
		uint64_t rng = 5;
		double *acc = calloc(N, sizeof(double)), max_step_err = 0;
		for (unsigned k = 0; k < K; k++)
			if (site_init(&sites[k], &net, k, GG_CODEC_INT4, CHUNK, N, fb, k == 1)) {
				CHECK(0, "site init");
				return;
			}
		for (unsigned k = 0; k < K; k++)
			for (size_t i = 0; i < N; i++)
				sites[k].input[i] = gauss(&rng);
		for (int t = 1; t <= STEPS; t++) {
			if (run_step(sites, K, algo, N, CHUNK, &net)) {
				CHECK(0, "feedback step %d failed", t);
				break;
			}
			double worst = 0;
			for (size_t i = 0; i < N; i++) {
				double exact = 0;
				for (unsigned k = 0; k < K; k++)
					exact += sites[k].input[i];
				acc[i] += sites[0].result[i];
				worst = fmax(worst, fabs(acc[i] - exact * t));
				if (t == 1)
					max_step_err = fmax(max_step_err, fabs(sites[0].result[i] - exact));
			}
			err_end[fb] = worst;
		}
		if (fb)
			CHECK(err_end[1] <= 3 * max_step_err,
			      "%s: with feedback the running sum's error is %g after %d steps, one step errs %g",
			      gg_allreduce_algo_name(algo), err_end[1], STEPS, max_step_err);
		for (unsigned k = 0; k < K; k++)
			site_fini(&sites[k]);
		free(acc);
		free(net.q);
	}
	CHECK(err_end[0] > 20 * err_end[1], "%s: error without feedback %g is not far above with it %g",
	      gg_allreduce_algo_name(algo), err_end[0], err_end[1]);
	printf("feedback (%s, int4, %d steps): running-sum error %.3g without, %.3g with\n",
	       gg_allreduce_algo_name(algo), STEPS, err_end[0], err_end[1]);
}

/* Frames the protocol never produces are refused with a message, whether
 * site 1's tensors are in host memory or other memory. */
static void check_refusals(bool other)
{
	enum { K = 3, N = 10000, CHUNK = 1024 };
	struct site sites[K];
	struct net net = { .rng = 3 };
	char err[GG_AR_ERROR_MAX];
	struct gg_ar_step *step;

	for (unsigned k = 0; k < K; k++)
		if (site_init(&sites[k], &net, k, GG_CODEC_BF16, CHUNK, N, false, other && k == 1))
			return;
	struct gg_ar_config cfg = { .sites = K, .self = 1, .algo = GG_ALLREDUCE_RING, .count = N,
				    .chunk_elems = CHUNK, .enc = &sites[1].enc, .dec = &sites[1].dec,
				    .mem = sites[1].mem };
	struct gg_ar_config bad = cfg;
	bad.count = 0;
	CHECK(gg_ar_step_start(&step, &bad, sites[1].step_input, sites[1].step_result, &net_ops, &sites[1], err,
			       sizeof(err)) == -EINVAL &&
		      !strcmp(err, "an all-reduce needs at least one element"),
	      "count 0: %s", err);
	bad = cfg;
	bad.chunk_elems = 1000;
	CHECK(gg_ar_step_start(&step, &bad, sites[1].step_input, sites[1].step_result, &net_ops, &sites[1], err,
			       sizeof(err)) == -EINVAL &&
		      !strcmp(err, "chunk of 1000 elements: must be a multiple of 32 and at most 1024"),
	      "chunk 1000: %s", err);
	if (other) {
		bad = cfg;
		bad.feedback = &sites[0].fb;
		CHECK(gg_ar_step_start(&step, &bad, sites[1].step_input, sites[1].step_result, &net_ops, &sites[1],
				       err, sizeof(err)) == -EINVAL &&
			      !strcmp(err, "error feedback in host memory for a step whose tensors are not"),
		      "host feedback with tensors in other memory: %s", err);
	}

	memset(sites[0].input, 0, N * sizeof(float));
	struct gg_buf *f;
	uint64_t fbound;
	CHECK(gg_frame_bound(&sites[0].enc.cfg.codec, CHUNK, &fbound) == 0, "bound");
	f = malloc(sizeof(*f) + fbound);
	f->refs = 1;
	CHECK(gg_frame_encode(&sites[0].enc, sites[0].input, CHUNK, f->data, fbound, &f->len) == 0, "encode");

	struct {
		unsigned from;
		struct gg_ar_chunk_id id;
		int rc;
		const char *msg;
	} cases[] = {
		{ 1, { GG_AR_SCATTER, 0, 0 }, -EPROTO,
		  "site 1 sent reduce-scatter chunk 0 of 0, which does not exist in this step" },
		{ 2, { GG_AR_SCATTER, 2, 0 }, -EPROTO,
		  "site 2 sent reduce-scatter chunk 0 of 2, which this site never expects from it" },
		{ 0, { GG_AR_SCATTER, 0, 0 }, -EPROTO,
		  "site 0 sent reduce-scatter chunk 0 of 0, which this site never expects from it" },
		{ 0, { GG_AR_GATHER, 1, 0 }, -EPROTO,
		  "site 0 sent all-gather chunk 0 of 1, which this site never expects from it" },
		{ 0, { GG_AR_SCATTER, 2, 9 }, -EPROTO,
		  "site 0 sent reduce-scatter chunk 9 of 2, which does not exist in this step" },
		{ 0, { GG_AR_DIRECT, 0, 0 }, -EPROTO,
		  "site 0 sent direct chunk 0 of 0, which does not exist in this step" },
		{ 0, { GG_AR_SCATTER, 2, 0 }, -EBADMSG, NULL }, /* wrong element count: shard 2 chunk 0 is 1024 */
	};
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		memset(sites[1].seen, 0, N); /* a fresh step gathers afresh */
		CHECK(gg_ar_step_start(&step, &cfg, sites[1].step_input, sites[1].step_result, &net_ops, &sites[1], err,
				       sizeof(err)) == 0,
		      "start: %s", err);
		size_t len = f->len;
		uint8_t *data = f->data;
		uint8_t *copy = NULL;
		if (!cases[c].msg) {
			/* A flipped payload byte fails the checksum. */
			copy = malloc(len);
			memcpy(copy, data, len);
			copy[len - 1] ^= 1;
			data = copy;
		}
		int rc = gg_ar_step_on_frame(step, cases[c].from, &cases[c].id, data, len, err, sizeof(err));
		if (cases[c].msg)
			CHECK(rc == cases[c].rc && !strcmp(err, cases[c].msg), "case %zu: rc %d, %s", c, rc, err);
		else
			CHECK((rc == -EILSEQ || rc == -EBADMSG) &&
				      !strncmp(err, "site 0, reduce-scatter chunk 0 of 2: frame: ", 44),
			      "corrupt frame: rc %d, %s", rc, err);
		CHECK(!gg_ar_step_done(step), "a failed step is not done");
		/* Each case is the sender's doing, but for a frame that claims to
		 * come from this site itself: no peer's. */
		const unsigned fault = gg_ar_step_fault_site(step),
			       want = cases[c].from == cfg.self ? cfg.sites : cases[c].from;
		CHECK(fault == want, "case %zu: the fault is put on site %u, not %u", c, fault, want);
		free(copy);
		gg_ar_step_free(step);
	}
	free(f);
	for (size_t i = 0; i < net.len; i++)
		gg_buf_put(net.q[i].frame);
	free(net.q);
	for (unsigned k = 0; k < K; k++)
		site_fini(&sites[k]);
}

/* The site a waiting direct step names as missing: the first whose frame
 * of a chunk is not at hand, site 1 where site 0 keeps its own frame for
 * site 1's (a lossy codec without zstd: the two are decoded in one sweep). */
static void check_missing(void)
{
	enum { K = 3, N = 4096, CHUNK = 1024 };
	static const struct gg_ar_ops send_only = { .send = net_send };
	struct site sites[K];
	struct net net = { .rng = 5 };
	struct gg_ar_step *step[K];
	char err[GG_AR_ERROR_MAX];

	lossy_zstd = false;
	for (unsigned k = 0; k < K; k++)
		if (site_init(&sites[k], &net, k, GG_CODEC_INT8, CHUNK, N, false, false)) {
			lossy_zstd = true;
			CHECK(false, "site %u: no memory", k);
			return;
		}
	lossy_zstd = true;
	for (unsigned k = 0; k < K; k++) {
		struct gg_ar_config cfg = { .sites = K, .self = k, .algo = GG_ALLREDUCE_DIRECT, .count = N,
					    .chunk_elems = CHUNK, .enc = &sites[k].enc, .dec = &sites[k].dec };
		memset(sites[k].step_input, 0, N * sizeof(float));
		CHECK(gg_ar_step_start(&step[k], &cfg, sites[k].step_input, sites[k].step_result, &send_only, &sites[k],
				       err, sizeof(err)) == 0 &&
			      gg_ar_step_resume(step[k], err, sizeof(err)) == 0,
		      "site %u: %s", k, err);
	}
	/* expect_missing SITE FROM: SITE's step names FROM, chunk 0. */
	unsigned from;
	struct gg_ar_chunk_id id;
#define EXPECT_MISSING(k, want)                                                                               \
	CHECK(gg_ar_step_first_missing(step[k], &from, &id) && from == (want) && id.origin == (want) && !id.chunk, \
	      "site %u names site %u chunk %u as missing, not site %u chunk 0", k, from, id.chunk, want)
	EXPECT_MISSING(0, 1); /* its own frame waits for site 1's */
	EXPECT_MISSING(1, 0);
	EXPECT_MISSING(2, 0);
	/* Site 1's frames come: site 0 decodes them with its own and waits
	 * for site 2's; site 2 keeps them and still waits for site 0's. */
	for (size_t i = 0; i < net.len; i++)
		if (net.q[i].from == 1 && net.q[i].to != 1)
			CHECK(gg_ar_step_on_frame(step[net.q[i].to], 1, &net.q[i].id, net.q[i].frame->data,
						  net.q[i].frame->len, err, sizeof(err)) == 0,
			      "site %u: %s", net.q[i].to, err);
	EXPECT_MISSING(0, 2);
	EXPECT_MISSING(2, 0);
#undef EXPECT_MISSING
	for (unsigned k = 0; k < K; k++)
		gg_ar_step_free(step[k]);
	for (size_t i = 0; i < net.len; i++)
		gg_buf_put(net.q[i].frame);
	free(net.q);
	for (unsigned k = 0; k < K; k++)
		site_fini(&sites[k]);
}

/* The link model algorithm auto decides by: its times, and the crossover
 * at which both are equal. */
static void check_model(void)
{
	const double up = 125e6, one_way = 0.05; /* 1 Gbit/s, 100 ms round trip */
	/* 3 sites, 64 MiB of fp32: direct sends 2 x 64 MiB (1.074 s + 0.05),
	 * ring 4/3 x 64 MiB (0.716 s) and waits 4 x 0.05. */
	double d = gg_ar_model_seconds(GG_ALLREDUCE_DIRECT, 3, 16u << 20, 4, up, one_way);
	double r = gg_ar_model_seconds(GG_ALLREDUCE_RING, 3, 16u << 20, 4, up, one_way);
	CHECK(fabs(d - (2 * 67108864 / up + 0.05)) < 1e-9, "direct model %.6f s", d);
	CHECK(fabs(r - (4.0 / 3 * 67108864 / up + 0.2)) < 1e-9, "ring model %.6f s", r);
	/* Crossover for 3 sites: 4.5 x one_way x uplink bytes. */
	uint64_t max = gg_ar_direct_max(3, 4, up, one_way);
	CHECK(max == (uint64_t)(4.5 * one_way * up / 4), "3-site crossover %llu elements", (unsigned long long)max);
	double at_d = gg_ar_model_seconds(GG_ALLREDUCE_DIRECT, 3, max, 4, up, one_way);
	double at_r = gg_ar_model_seconds(GG_ALLREDUCE_RING, 3, max, 4, up, one_way);
	CHECK(fabs(at_d - at_r) < 1e-6, "at the crossover direct %.6f s, ring %.6f s", at_d, at_r);
	CHECK(gg_ar_model_seconds(GG_ALLREDUCE_DIRECT, 3, max + 1000, 4, up, one_way) >
		      gg_ar_model_seconds(GG_ALLREDUCE_RING, 3, max + 1000, 4, up, one_way),
	      "past the crossover ring is faster");
	/* A smaller encoding moves it up by as much; 4 sites: 10/3 x one_way x uplink. */
	CHECK(gg_ar_direct_max(3, 1, up, one_way) == (uint64_t)(4.5 * one_way * up), "int8-sized crossover");
	CHECK(gg_ar_direct_max(4, 4, up, one_way) == (uint64_t)(10.0 / 3 * one_way * up / 4), "4-site crossover");
	/* Two sites: direct always; nothing measured: ring for everything. */
	CHECK(gg_ar_direct_max(2, 4, up, one_way) == UINT64_MAX, "2 sites: always direct");
	CHECK(gg_ar_direct_max(3, 4, 0, one_way) == 0, "no uplink figure");
	CHECK(gg_ar_direct_max(3, 4, up, 0) == 0, "no delay: ring for every size");
	CHECK(gg_ar_direct_max(3, 4, 1e30, 1e6) == UINT64_MAX, "no overflow");
}

/* auto's chunk: ring steps whose shards hold fewer than 16 configured
 * chunks go in smaller ones, never below 512 KiB of float32; direct, large
 * steps and steps whose shards hold fewer than four 512 KiB chunks keep
 * the configured chunk. */
static void check_auto_chunk(void)
{
	const uint32_t mib = 262144; /* 1 MiB of float32 */

	CHECK(gg_ar_auto_chunk(GG_ALLREDUCE_RING, 3, 16u << 20, mib) == mib, "64 MiB by ring: 1 MiB chunks");
	CHECK(gg_ar_auto_chunk(GG_ALLREDUCE_RING, 3, 4u << 20, mib) == mib / 2, "16 MiB by ring: 512 KiB chunks");
	CHECK(gg_ar_auto_chunk(GG_ALLREDUCE_RING, 3, 2u << 20, mib) == mib / 2, "8 MiB by ring: 512 KiB, the least");
	CHECK(gg_ar_auto_chunk(GG_ALLREDUCE_RING, 3, 1u << 20, mib) == mib,
	      "4 MiB by ring: shards too small for four 512 KiB chunks keep 1 MiB");
	CHECK(gg_ar_auto_chunk(GG_ALLREDUCE_RING, 3, 1, mib) == mib, "one element: as configured");
	CHECK(gg_ar_auto_chunk(GG_ALLREDUCE_DIRECT, 3, 1u << 20, mib) == mib, "direct keeps the chunk");
	CHECK(gg_ar_auto_chunk(GG_ALLREDUCE_RING, 3, 16u << 20, 4 * mib) == mib, "4 MiB configured, 64 MiB step: 1 MiB");
	CHECK(gg_ar_auto_chunk(GG_ALLREDUCE_RING, 2, 16u << 20, 4 * mib) == 2 * mib, "2 sites, 64 MiB step: 2 MiB");
	CHECK(gg_ar_auto_chunk(GG_ALLREDUCE_RING, 3, 1u << 20, mib / 2) == mib / 2, "512 KiB configured: kept");
	CHECK(gg_ar_auto_chunk(GG_ALLREDUCE_RING, 3, 1u << 20, 1024) == 1024, "a chunk below the least: kept");
	CHECK(gg_ar_auto_chunk(GG_ALLREDUCE_RING, 3, 1u << 30, 250000) == 250000, "not a power of two, large step: kept");
	CHECK(gg_ar_auto_chunk(GG_ALLREDUCE_RING, 3, 4u << 20, 250000) == mib / 2, "not a power of two, small step");
	CHECK(gg_ar_auto_chunk(GG_ALLREDUCE_RING, 8, UINT64_MAX, mib) == mib, "the largest step");
	/* The chunks below the configured one, for the pools a node keeps. */
	uint32_t sizes[8];
	CHECK(gg_ar_auto_chunk_sizes(mib, sizes, 8) == 1 && sizes[0] == mib / 2, "below 1 MiB: 512 KiB alone");
	CHECK(gg_ar_auto_chunk_sizes(16 * mib, sizes, 8) == 5 && sizes[0] == 8 * mib && sizes[4] == mib / 2,
	      "below 16 MiB: 8 MiB down to 512 KiB");
	CHECK(gg_ar_auto_chunk_sizes(200000, sizes, 8) == 1 && sizes[0] == mib / 2, "below 200000: 512 KiB");
	CHECK(gg_ar_auto_chunk_sizes(mib / 2, sizes, 8) == 0, "512 KiB: nothing below");
	CHECK(gg_ar_auto_chunk_sizes(64 * mib, sizes, 2) == 2 && sizes[0] == 32 * mib && sizes[1] == 16 * mib,
	      "at most n, the largest first");
	/* Over every size: the configured chunk where a shard holds 16 of
	 * them, or fewer than four of the least (or the configured one is no
	 * larger than the least), else a power of two that
	 * gives a shard 16 chunks where twice it would not, or the least;
	 * aligned. */
	const uint32_t maxes[] = { 32, 1024, mib / 2, 200000, mib, 16 * mib };
	for (size_t m = 0; m < sizeof(maxes) / sizeof(maxes[0]); m++)
		for (unsigned K = 2; K <= GG_AR_MAX_SITES; K++) {
			const uint32_t max = maxes[m];
			for (uint64_t count = 1; count <= (1ull << 34); count += count / 3 + 1) {
				const uint32_t c = gg_ar_auto_chunk(GG_ALLREDUCE_RING, K, count, max);
				const uint64_t want = count / K / GG_AR_RING_CHUNKS_PER_SHARD;
				const bool as_configured =
					max <= GG_AR_AUTO_CHUNK_MIN || want >= max ||
					count / K < (uint64_t)GG_AR_AUTO_CHUNKS_LEAST * GG_AR_AUTO_CHUNK_MIN;
				const bool rule = as_configured ? c == max
								: (c & (c - 1)) == 0 && c >= GG_AR_AUTO_CHUNK_MIN && c < max &&
									  (c == GG_AR_AUTO_CHUNK_MIN || want >= c) && want < 2 * (uint64_t)c;
				uint32_t listed_sizes[32];
				const unsigned classes = gg_ar_auto_chunk_sizes(max, listed_sizes, 32);
				bool listed = c == max;
				for (unsigned i = 0; i < classes; i++)
					listed |= listed_sizes[i] == c;
				if (!rule || !listed || c % GG_CODEC_BLOCK_ALIGN_ELEMS) {
					CHECK(false, "max %u, %u sites, %llu elements: chunk %u", max, K,
					      (unsigned long long)count, c);
					return;
				}
			}
		}
}

#ifdef GG_SIM_CUDA_DOUBLE
#include "cuda_double.h"

/* Ring scratch a lane gives back while frees are held (an NCCL call of
 * the gateway's may run, which cudaFree would wait for) is kept beyond the
 * spares, and freed once they are let go. */
static void check_scratch_hold(void)
{
	enum { N = GG_MEM_CUDA_SPARES + 3 };
	struct gg_ar_mem_cuda m;
	atomic_bool held = true;
	char err[256];
	float *p[N], *big;

	CHECK(gg_ar_mem_cuda_init(&m, 4096, NULL, err, sizeof(err)) == 0, "%s", err);
	m.frees_held = &held;
	for (int i = 0; i < N; i++)
		CHECK(m.mem.ops->alloc(m.mem.ctx, 100 + i, &p[i], err, sizeof(err)) == 0, "%s", err);
	unsigned before = cuda_double_device_frees();
	for (int i = 0; i < N; i++)
		m.mem.ops->free(m.mem.ctx, p[i], 100 + i);
	CHECK(cuda_double_device_frees() == before, "%u buffers freed while frees were held",
	      cuda_double_device_frees() - before);
	/* Held scratch serves the next steps as the spares do. */
	CHECK(m.mem.ops->alloc(m.mem.ctx, 100, &p[0], err, sizeof(err)) == 0, "%s", err);
	CHECK(m.mem.ops->alloc(m.mem.ctx, 106, &p[1], err, sizeof(err)) == 0, "%s", err);
	m.mem.ops->free(m.mem.ctx, p[0], 100);
	m.mem.ops->free(m.mem.ctx, p[1], 106);
	CHECK(cuda_double_device_frees() == before, "a buffer freed while frees were held");
	atomic_store(&held, false);
	CHECK(m.mem.ops->alloc(m.mem.ctx, 1000, &big, err, sizeof(err)) == 0, "%s", err);
	CHECK(cuda_double_device_frees() == before + N - GG_MEM_CUDA_SPARES,
	      "%u of the %d held buffers freed once frees were let go", cuda_double_device_frees() - before,
	      N - GG_MEM_CUDA_SPARES);
	m.mem.ops->free(m.mem.ctx, big, 1000);
	/* What is kept while frees are held is bounded: past that, freed. */
	enum { MORE = GG_MEM_CUDA_KEPT + 1 };
	float *q[MORE];
	atomic_store(&held, true);
	for (int i = 0; i < MORE; i++)
		CHECK(m.mem.ops->alloc(m.mem.ctx, 2000 + i, &q[i], err, sizeof(err)) == 0, "%s", err);
	before = cuda_double_device_frees();
	for (int i = 0; i < MORE; i++)
		m.mem.ops->free(m.mem.ctx, q[i], 2000 + i);
	CHECK(cuda_double_device_frees() == before + MORE - (GG_MEM_CUDA_KEPT - GG_MEM_CUDA_SPARES),
	      "%u of %d buffers freed while held, past the %d kept", cuda_double_device_frees() - before, MORE,
	      GG_MEM_CUDA_KEPT);
	gg_ar_mem_cuda_fini(&m);
}
#endif

int main(void)
{
	const enum gg_codec codecs[] = { GG_CODEC_FP32, GG_CODEC_BF16, GG_CODEC_BF16_SPLIT, GG_CODEC_INT8,
					 GG_CODEC_INT4 };
	unsigned cases = 0;
#if !defined(GG_SIM_CUDA) || defined(GG_SIM_CUDA_DOUBLE)
	struct sigaction sa = { .sa_sigaction = on_fault, .sa_flags = SA_SIGINFO };

	sigaction(SIGSEGV, &sa, NULL);
#endif
#ifdef GG_SIM_CUDA
	dev_require_gpu();
#endif

	for (int z = 0; z < 2; z++) {
		lossy_zstd = !z;
		for (size_t c = z; c < sizeof(codecs) / sizeof(codecs[0]); c++)
			for (int algo = GG_ALLREDUCE_DIRECT; algo <= GG_ALLREDUCE_RING; algo++)
				for (unsigned K = 2; K <= 4; K++) {
					const size_t sizes[] = { 1, 2, 37, 5000 };
					for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++, cases++)
						check_case(codecs[c], (enum gg_allreduce_algo)algo, K, sizes[s], 1024,
							   cases);
					if (K == 3) {
						check_case(codecs[c], (enum gg_allreduce_algo)algo, K, 1000003, 65536,
							   cases);
						cases++;
					}
				}
	}
	lossy_zstd = true;
	check_feedback(GG_ALLREDUCE_DIRECT);
	check_feedback(GG_ALLREDUCE_RING);
	check_refusals(false);
	check_refusals(true);
	check_missing();
	check_model();
	check_auto_chunk();
#ifdef GG_SIM_CUDA_DOUBLE
	check_scratch_hold();
#endif
	printf("%u all-reduce cases; %d failure(s)\n", cases, failures);
	return failures ? 1 : 0;
}
