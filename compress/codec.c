#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"
#include "log.h"

static const char *const codec_names[GG_CODEC_LAST + 1] = {
	[GG_CODEC_FP32] = "fp32",
	[GG_CODEC_BF16] = "bf16",
	[GG_CODEC_BF16_SPLIT] = "bf16-split",
	[GG_CODEC_INT8] = "int8",
	[GG_CODEC_INT4] = "int4",
};

int gg_codec_from_name(const char *name, enum gg_codec *out)
{
	for (int c = GG_CODEC_FIRST; c <= GG_CODEC_LAST; c++) {
		if (!strcmp(name, codec_names[c])) {
			*out = (enum gg_codec)c;
			return 0;
		}
	}
	return -EINVAL;
}

const char *gg_codec_name(enum gg_codec codec)
{
	if ((int)codec < GG_CODEC_FIRST || (int)codec > GG_CODEC_LAST)
		return NULL;
	return codec_names[codec];
}

const char *gg_codec_names(void)
{
	return "fp32, bf16, bf16-split, int8, int4";
}

bool gg_codec_is_lossy(enum gg_codec codec)
{
	return codec != GG_CODEC_FP32;
}

bool gg_codec_has_blocks(enum gg_codec codec)
{
	return codec == GG_CODEC_INT8 || codec == GG_CODEC_INT4;
}

struct gg_codec_params gg_codec_defaults(enum gg_codec codec)
{
	struct gg_codec_params p = { .codec = codec, .block_elems = 0, .scale = GG_SCALE_F32 };

	if (gg_codec_has_blocks(codec))
		p.block_elems = GG_CODEC_DEFAULT_BLOCK_ELEMS;
	return p;
}

int gg_codec_params_check(const struct gg_codec_params *p, const char **why)
{
	const char *dummy;

	if (!why)
		why = &dummy;
	if (!gg_codec_name(p->codec)) {
		*why = "unknown codec";
		return -EINVAL;
	}
	if (p->scale != GG_SCALE_F32 && p->scale != GG_SCALE_F16) {
		*why = "unknown scale kind";
		return -EINVAL;
	}
	if (!gg_codec_has_blocks(p->codec)) {
		if (p->block_elems != 0 || p->scale != GG_SCALE_F32) {
			*why = "block size and scale kind apply to int8 and int4 only";
			return -EINVAL;
		}
		return 0;
	}
	if (p->block_elems < GG_CODEC_MIN_BLOCK_ELEMS || p->block_elems > GG_CODEC_MAX_BLOCK_ELEMS ||
	    p->block_elems % GG_CODEC_BLOCK_ALIGN_ELEMS) {
		*why = "block size must be a multiple of 32 in [32, 65536]";
		return -EINVAL;
	}
	return 0;
}

int gg_codec_encoded_bytes(const struct gg_codec_params *p, uint64_t elems, uint64_t *bytes)
{
	if (gg_codec_params_check(p, NULL))
		return -EINVAL;
	switch (p->codec) {
	case GG_CODEC_FP32:
		if (elems > UINT64_MAX / 4)
			return -EOVERFLOW;
		*bytes = elems * 4;
		return 0;
	case GG_CODEC_BF16:
	case GG_CODEC_BF16_SPLIT:
		if (elems > UINT64_MAX / 2)
			return -EOVERFLOW;
		*bytes = elems * 2;
		return 0;
	case GG_CODEC_INT8:
	case GG_CODEC_INT4: {
		/* No overflow below: blocks and codes are each at most elems bytes. */
		if (elems > UINT64_MAX / 4)
			return -EOVERFLOW;
		uint64_t nb = elems / p->block_elems + (elems % p->block_elems != 0);
		uint64_t codes = p->codec == GG_CODEC_INT8 ? elems : elems / 2 + (elems & 1);
		*bytes = nb * gg_scale_bytes(p->scale) + codes;
		return 0;
	}
	}
	return -EINVAL;
}

static int check_sizes(const struct gg_codec_params *p, size_t n, size_t have_bytes, bool exact)
{
	uint64_t need;
	int rc = gg_codec_encoded_bytes(p, n, &need);

	if (rc)
		return rc;
	if (exact ? have_bytes != need : have_bytes < need)
		return exact ? -EBADMSG : -ENOBUFS;
	return 0;
}

int gg_codec_encode(const struct gg_codec_params *p, const float *src, size_t n, void *dst,
		    size_t dst_bytes)
{
	int rc = check_sizes(p, n, dst_bytes, false);

	if (rc)
		return rc;
	gg_encode_whole(gg_codec_kernels_active()->encode[p->codec], p->codec, src, n, p->block_elems, p->scale, dst);
	return 0;
}

int gg_codec_encode_bf16(const struct gg_codec_params *p, const uint16_t *src, size_t n,
			 void *dst, size_t dst_bytes)
{
	int rc = check_sizes(p, n, dst_bytes, false);

	if (rc)
		return rc;
	gg_codec_encode_bf16_ref(p->codec, src, n, p->block_elems, p->scale, dst);
	return 0;
}

int gg_codec_decode(const struct gg_codec_params *p, const void *src, size_t src_bytes,
		    size_t n, float *dst)
{
	int rc = check_sizes(p, n, src_bytes, true);

	if (rc)
		return rc;
	gg_decode_whole(gg_codec_kernels_active()->decode[p->codec], p->codec, src, n, p->block_elems, p->scale, dst);
	return 0;
}

int gg_codec_decode_acc(const struct gg_codec_params *p, const void *src, size_t src_bytes,
			size_t n, float *acc)
{
	int rc = check_sizes(p, n, src_bytes, true);

	if (rc)
		return rc;
	gg_decode_whole(gg_codec_kernels_active()->decode_acc[p->codec], p->codec, src, n, p->block_elems, p->scale,
			acc);
	return 0;
}

/* A chunk's payload of payload_bytes for n elements (exactly, or at least
 * where `exact` is false), and a span [first, first + m) of it as
 * gg_codec_span_align() says; the span's two parts' offsets. */
static int span_parts(const struct gg_codec_params *p, size_t payload_bytes, bool exact, size_t n, size_t first,
		      size_t m, size_t *a, size_t *b)
{
	int rc = check_sizes(p, n, payload_bytes, exact);

	if (rc)
		return rc;
	size_t align = gg_codec_span_align(p);
	if (first > n || m > n - first || first % align || (m % align && first + m != n))
		return -EINVAL;
	gg_payload_parts(p->codec, n, first, p->block_elems, p->scale, a, b);
	return 0;
}

int gg_codec_decode_span(const struct gg_codec_params *p, const void *src, size_t src_bytes, size_t n, size_t first,
			 size_t m, float *out, bool acc)
{
	size_t a, b;
	int rc = span_parts(p, src_bytes, true, n, first, m, &a, &b);

	if (rc)
		return rc;
	const struct gg_codec_kernels *k = gg_codec_kernels_active();
	(acc ? k->decode_acc : k->decode)[p->codec]((const uint8_t *)src + a, (const uint8_t *)src + b, m,
						   p->block_elems, p->scale, out);
	return 0;
}

int gg_codec_encode_span(const struct gg_codec_params *p, const float *src, size_t n, size_t first, size_t m,
			 void *dst, size_t dst_bytes)
{
	size_t a, b;
	int rc = span_parts(p, dst_bytes, false, n, first, m, &a, &b);

	if (rc)
		return rc == -EBADMSG ? -ENOBUFS : rc;
	gg_codec_kernels_active()->encode[p->codec](src, m, p->block_elems, p->scale, (uint8_t *)dst + a,
						    (uint8_t *)dst + b);
	return 0;
}

static const char *const isa_names[GG_ISA_COUNT] = { "scalar", "avx2", "avx512" };

const char *gg_isa_name(enum gg_isa isa)
{
	return (unsigned)isa < GG_ISA_COUNT ? isa_names[isa] : NULL;
}

bool gg_isa_available(enum gg_isa isa)
{
	return gg_codec_kernels_for(isa) != NULL;
}

const struct gg_codec_kernels *gg_codec_kernels_for(enum gg_isa isa)
{
	switch (isa) {
	case GG_ISA_SCALAR:
		return &gg_codec_kernels_ref;
	case GG_ISA_AVX2:
#ifdef GG_HAVE_AVX2
		__builtin_cpu_init();
		if (__builtin_cpu_supports("avx2"))
			return &gg_codec_kernels_avx2;
#endif
		return NULL;
	case GG_ISA_AVX512:
#ifdef GG_HAVE_AVX512
		__builtin_cpu_init();
		if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
		    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
			return &gg_codec_kernels_avx512;
#endif
		return NULL;
	}
	return NULL;
}

static _Atomic(const struct gg_codec_kernels *) active_kernels;

static const struct gg_codec_kernels *pick_kernels(void)
{
	int cap = GG_ISA_COUNT - 1;
	const char *env = getenv("GG_CODEC_ISA");

	if (env && *env) {
		int named = -1;
		for (int i = 0; i < GG_ISA_COUNT; i++)
			if (!strcmp(env, isa_names[i]))
				named = i;
		char safe[GG_ESCAPED_SIZE(32)];
		if (named < 0)
			gg_log(GG_LOG_WARN, "codec_isa_ignored",
			       "variable=GG_CODEC_ISA value=\"%s\" reason=\"not scalar, avx2 or avx512: the best "
			       "kernels this CPU has are used\"",
			       gg_escape(safe, sizeof(safe), env, strnlen(env, 32)));
		else
			cap = named;
	}
	for (int i = cap; i > GG_ISA_SCALAR; i--) {
		const struct gg_codec_kernels *k = gg_codec_kernels_for((enum gg_isa)i);
		if (k)
			return k;
	}
	return &gg_codec_kernels_ref;
}

const struct gg_codec_kernels *gg_codec_kernels_active(void)
{
	const struct gg_codec_kernels *k = atomic_load_explicit(&active_kernels, memory_order_acquire);

	if (!k) {
		k = pick_kernels();
		atomic_store_explicit(&active_kernels, k, memory_order_release);
	}
	return k;
}

void gg_f32_add(const float *a, const float *b, size_t n, float *out)
{
	gg_codec_kernels_active()->add(a, b, n, out);
}

int gg_codec_set_isa(enum gg_isa isa)
{
	const struct gg_codec_kernels *k = gg_codec_kernels_for(isa);

	if (!k)
		return -ENOTSUP;
	atomic_store_explicit(&active_kernels, k, memory_order_release);
	return 0;
}

enum gg_isa gg_codec_isa(void)
{
	return gg_codec_kernels_active()->isa;
}
