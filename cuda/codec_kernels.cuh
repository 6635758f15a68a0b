/* The codec kernels and their dispatch, apart from the CUDA runtime so that
 * tests/compress/test_codec_kernels_emu.cpp can also run them on the CPU.
 * The includer provides the CUDA types (cuda_runtime.h, or the emulation's)
 * and gg_launch(kernel, blocks, threads, stream, args...), which enqueues
 * `kernel` on at most `blocks` blocks of `threads` threads and returns a
 * cudaError_t.
 *
 * Every element goes through the functions of compress/codec_elem.h, the
 * ones the CPU reference runs; what is left here is where each element
 * sits and which thread computes it.
 *
 * fp32, bf16 and bf16-split: UNROLL elements per thread and step of a
 * grid-stride loop. int8 and int4: one warp per block of the codec (any
 * size from 32 elements up), in two passes over the block: the absmax (an
 * integer max over the bits, reduced across the warp by shuffles, which is
 * the reference's value in any order), then the codes. Blocks of up to 256
 * elements stay in registers between the passes; longer ones are read
 * again, from cache when they fit. With error feedback c = in + residual
 * is what both passes see, so the residual is read once, written once, and
 * c is never stored. */
#ifndef GG_CODEC_KERNELS_CUH
#define GG_CODEC_KERNELS_CUH

#include <stddef.h>
#include <stdint.h>

#include "codec.h"
#include "codec_elem.h"

#define THREADS 256u
#define WARP 32u
#define FULL_MASK 0xffffffffu
/* Elements a thread loads before it computes: several loads in flight per
 * thread are what it takes to come near the memory's bandwidth. */
#define UNROLL 4u
/* Blocks up to WARP * REG_ELEMS elements (the default 256) stay in
 * registers between the two passes; longer ones are read twice. */
#define REG_ELEMS 8u

__device__ static inline size_t first_index(void)
{
	return (size_t)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ static inline size_t index_stride(void)
{
	return (size_t)gridDim.x * blockDim.x;
}

/* How many of base + u * stride, u < UNROLL, are below n (base is). */
__device__ static inline uint32_t step_elems(size_t base, size_t stride, size_t n)
{
	uint32_t k = 1;

#pragma unroll
	for (uint32_t u = 1; u < UNROLL; u++)
		k += base + u * stride < n;
	return k;
}

/* fp32, bf16, bf16-split element i: c = x (with FB: x + residual r) is
 * encoded, and with FB the residual becomes c - decode(code). */
template <int CODEC, bool FB>
__device__ static inline void encode_elem(float x, float r, size_t i, size_t n, uint8_t *__restrict__ dst,
					  float *__restrict__ res)
{
	float c = FB ? gg_feedback_compensate_elem(x, r) : x;
	float d = c;

	if constexpr (CODEC == GG_CODEC_FP32) {
		reinterpret_cast<float *>(dst)[i] = c;
	} else {
		uint16_t b = gg_bf16_from_f32(c);
		if constexpr (CODEC == GG_CODEC_BF16) {
			reinterpret_cast<uint16_t *>(dst)[i] = b;
		} else {
			dst[i] = (uint8_t)b;
			dst[n + i] = (uint8_t)(b >> 8);
		}
		d = gg_bf16_to_f32(b);
	}
	if constexpr (FB)
		res[i] = gg_feedback_residual_elem(c, d);
}

template <int CODEC>
__device__ static inline float decode_elem(const uint8_t *__restrict__ src, size_t i, size_t n)
{
	if constexpr (CODEC == GG_CODEC_FP32)
		return reinterpret_cast<const float *>(src)[i];
	else if constexpr (CODEC == GG_CODEC_BF16)
		return gg_bf16_to_f32(reinterpret_cast<const uint16_t *>(src)[i]);
	else
		return gg_bf16_to_f32((uint16_t)(src[i] | src[n + i] << 8));
}

/* Two floats an element step loads: input and residual, or decoded value
 * and accumulator. */
struct elem_pair {
	float a, b;
};

/* A thread takes elements base + u * stride, u < UNROLL, per step of a
 * grid-stride loop: load(i) for all of them first, so the loads are in
 * flight together, then store(i, what load(i) returned). */
template <typename Load, typename Store>
__device__ static inline void for_each_elem(size_t n, Load load, Store store)
{
	const size_t stride = index_stride();

	for (size_t base = first_index(); base < n; base += UNROLL * stride) {
		uint32_t k = step_elems(base, stride, n);
		elem_pair v[UNROLL] = {};
#pragma unroll
		for (uint32_t u = 0; u < UNROLL; u++)
			if (u < k)
				v[u] = load(base + u * stride);
#pragma unroll
		for (uint32_t u = 0; u < UNROLL; u++)
			if (u < k)
				store(base + u * stride, v[u]);
	}
}

template <int CODEC, bool FB>
__global__ static void __launch_bounds__(THREADS)
	encode_elems(const float *__restrict__ src, float *__restrict__ res, size_t n, uint8_t *__restrict__ dst)
{
	for_each_elem(
		n, [=](size_t i) { return elem_pair{ src[i], FB ? res[i] : 0.0f }; },
		[=](size_t i, elem_pair v) { encode_elem<CODEC, FB>(v.a, v.b, i, n, dst, res); });
}

template <int CODEC, bool ACC>
__global__ static void __launch_bounds__(THREADS)
	decode_elems(const uint8_t *__restrict__ src, size_t n, float *__restrict__ out)
{
	for_each_elem(
		n, [=](size_t i) { return elem_pair{ decode_elem<CODEC>(src, i, n), ACC ? out[i] : 0.0f }; },
		[=](size_t i, elem_pair v) { out[i] = ACC ? gg_fadd(v.b, v.a) : v.a; });
}

/* int8 and int4 blocks: G elements make one code byte (1 for int8, 2 for
 * int4), and lane l of a warp takes bytes l, l + 32, ... of its block, so
 * that its elements are G * (l + 32 u) + g. */
template <int QMAX>
struct int_codec {
	static constexpr uint32_t G = QMAX == GG_INT8_QMAX ? 1 : 2;
	static constexpr uint32_t SLOTS = REG_ELEMS / G; /* bytes per lane held in registers */
};

/* Element e of block x (with FB: x + residual), 0 past the block's end:
 * 0 does not change an absmax, and no code is made of it. */
template <bool FB>
__device__ static inline float block_input(const float *__restrict__ x, const float *__restrict__ r, uint32_t e,
					   uint32_t len)
{
	if (e >= len)
		return 0.0f;
	return FB ? gg_feedback_compensate_elem(x[e], r[e]) : x[e];
}

__device__ static inline uint32_t warp_max(uint32_t m)
{
	for (uint32_t o = WARP / 2; o > 0; o /= 2)
		m = max(m, __shfl_xor_sync(FULL_MASK, m, o));
	return m;
}

/* Code byte j of a block from its elements v[0..G) (those at len and
 * beyond are not coded; int4's last high nibble is then 0), and with FB
 * their residuals. */
template <int QMAX, bool FB>
__device__ static inline uint8_t code_byte(const float *v, uint32_t j, uint32_t len, float s, float *r)
{
	if constexpr (QMAX == GG_INT8_QMAX) {
		int q = gg_quantize(v[0], s, QMAX);
		if constexpr (FB)
			r[j] = gg_feedback_residual_elem(v[0], gg_dequantize(q, s, QMAX));
		return (uint8_t)(int8_t)q;
	} else {
		int q0 = gg_quantize(v[0], s, QMAX), q1 = 0;
		if constexpr (FB)
			r[2 * j] = gg_feedback_residual_elem(v[0], gg_dequantize(q0, s, QMAX));
		if (2 * j + 1 < len) {
			q1 = gg_quantize(v[1], s, QMAX);
			if constexpr (FB)
				r[2 * j + 1] = gg_feedback_residual_elem(v[1], gg_dequantize(q1, s, QMAX));
		}
		return gg_int4_pack(q0, q1);
	}
}

/* int8 (QMAX 127) and int4 (QMAX 7): warp w encodes blocks w, w + warps,
 * ... in two passes, absmax then codes. Layout: nb scales, then the codes;
 * a block starts at element off, a multiple of 32, so its codes start at
 * byte off / G of the codes. */
template <int QMAX, bool FB>
__global__ static void __launch_bounds__(THREADS)
	encode_blocks(const float *__restrict__ src, float *__restrict__ res, size_t n, uint32_t block_elems,
		      bool f16, size_t nb, uint8_t *__restrict__ dst)
{
	constexpr uint32_t G = int_codec<QMAX>::G, SLOTS = int_codec<QMAX>::SLOTS;
	const uint32_t lane = threadIdx.x % WARP;
	uint8_t *codes = dst + nb * (f16 ? 2 : 4);

	/* k is the same for the whole warp, so every lane reaches the shuffles. */
	for (size_t k = first_index() / WARP; k < nb; k += index_stride() / WARP) {
		size_t off = k * block_elems;
		uint32_t len = (uint32_t)(n - off < block_elems ? n - off : block_elems);
		uint32_t nbytes = (len + G - 1) / G;
		const float *x = src + off;
		float *r = FB ? res + off : nullptr;
		uint8_t *bytes = codes + off / G;
		uint32_t m = 0, stored = 0;

		if (len <= WARP * REG_ELEMS) {
			float v[SLOTS][G];
#pragma unroll
			for (uint32_t u = 0; u < SLOTS; u++) {
#pragma unroll
				for (uint32_t g = 0; g < G; g++) {
					v[u][g] = block_input<FB>(x, r, G * (lane + WARP * u) + g, len);
					m = max(m, gg_abs_bits_finite(v[u][g]));
				}
			}
			float s = gg_block_scale(gg_f32_from_bits(warp_max(m)), QMAX, f16, &stored);
#pragma unroll
			for (uint32_t u = 0; u < SLOTS; u++) {
				uint32_t j = lane + WARP * u;
				if (j < nbytes)
					bytes[j] = code_byte<QMAX, FB>(v[u], j, len, s, r);
			}
		} else {
#pragma unroll 4
			for (uint32_t j = lane; j < nbytes; j += WARP)
				for (uint32_t g = 0; g < G; g++)
					m = max(m, gg_abs_bits_finite(block_input<FB>(x, r, G * j + g, len)));
			float s = gg_block_scale(gg_f32_from_bits(warp_max(m)), QMAX, f16, &stored);
#pragma unroll 4
			for (uint32_t j = lane; j < nbytes; j += WARP) {
				float v[G];
				for (uint32_t g = 0; g < G; g++)
					v[g] = block_input<FB>(x, r, G * j + g, len);
				bytes[j] = code_byte<QMAX, FB>(v, j, len, s, r);
			}
		}
		if (lane == 0) {
			if (f16)
				reinterpret_cast<uint16_t *>(dst)[k] = (uint16_t)stored;
			else
				reinterpret_cast<uint32_t *>(dst)[k] = stored;
		}
	}
}

/* Element e of a block from its codes and scale s. */
template <int QMAX>
__device__ static inline float block_value(const uint8_t *__restrict__ bytes, uint32_t e, float s)
{
	int c = QMAX == GG_INT8_QMAX ? (int)(int8_t)bytes[e] : gg_int4_unpack(bytes[e / 2], e & 1);

	return gg_dequantize(c, s, QMAX);
}

template <int QMAX, bool ACC>
__global__ static void __launch_bounds__(THREADS)
	decode_blocks(const uint8_t *__restrict__ src, size_t n, uint32_t block_elems, bool f16, size_t nb,
		      float *__restrict__ out)
{
	constexpr uint32_t G = int_codec<QMAX>::G;
	const uint32_t lane = threadIdx.x % WARP;
	const uint8_t *codes = src + nb * (f16 ? 2 : 4);

	for (size_t k = first_index() / WARP; k < nb; k += index_stride() / WARP) {
		size_t off = k * block_elems;
		uint32_t len = (uint32_t)(n - off < block_elems ? n - off : block_elems);
		uint32_t stored = f16 ? reinterpret_cast<const uint16_t *>(src)[k]
				      : reinterpret_cast<const uint32_t *>(src)[k];
		float s = gg_block_scale_from_bits(stored, f16);
		const uint8_t *bytes = codes + off / G;
		float *o = out + off;

		if (len <= WARP * REG_ELEMS) {
			/* Zeroed only so that -O3 hosts (the emulation) see no
			 * read of a lane past len: none is read. */
			float v[REG_ELEMS] = {}, a[REG_ELEMS] = {};
#pragma unroll
			for (uint32_t u = 0; u < REG_ELEMS; u++) {
				uint32_t e = lane + WARP * u;
				if (e < len) {
					v[u] = block_value<QMAX>(bytes, e, s);
					if constexpr (ACC)
						a[u] = o[e];
				}
			}
#pragma unroll
			for (uint32_t u = 0; u < REG_ELEMS; u++) {
				uint32_t e = lane + WARP * u;
				if (e < len)
					o[e] = ACC ? gg_fadd(a[u], v[u]) : v[u];
			}
		} else {
#pragma unroll 4
			for (uint32_t e = lane; e < len; e += WARP) {
				float v = block_value<QMAX>(bytes, e, s);
				o[e] = ACC ? gg_fadd(o[e], v) : v;
			}
		}
	}
}

static size_t block_count(size_t n, uint32_t block_elems)
{
	return n / block_elems + (n % block_elems != 0);
}

/* Blocks of THREADS for one thread per work item (an element, or a lane
 * of a warp per block of the codec); gg_launch() caps them at what the
 * device runs at once, and the grid-stride loops do the rest. */
static unsigned blocks_for(const struct gg_codec_params *p, size_t n)
{
	size_t items = gg_codec_has_blocks(p->codec) ? block_count(n, p->block_elems) * WARP : n;
	size_t blocks = items / THREADS + (items % THREADS != 0);

	return (unsigned)(blocks == 0 ? 1 : blocks < (1u << 30) ? blocks : (1u << 30));
}

/* Enqueues the encoder of p->codec; res is NULL without error feedback. */
template <bool FB>
static cudaError_t enqueue_encode(const struct gg_codec_params *p, unsigned blocks, cudaStream_t st,
				  const float *src, float *res, size_t n, uint8_t *dst)
{
	bool f16 = p->scale == GG_SCALE_F16;
	size_t nb = gg_codec_has_blocks(p->codec) ? block_count(n, p->block_elems) : 0;

	switch (p->codec) {
	case GG_CODEC_FP32:
		return gg_launch(encode_elems<GG_CODEC_FP32, FB>, blocks, THREADS, st, src, res, n, dst);
	case GG_CODEC_BF16:
		return gg_launch(encode_elems<GG_CODEC_BF16, FB>, blocks, THREADS, st, src, res, n, dst);
	case GG_CODEC_BF16_SPLIT:
		return gg_launch(encode_elems<GG_CODEC_BF16_SPLIT, FB>, blocks, THREADS, st, src, res, n, dst);
	case GG_CODEC_INT8:
		return gg_launch(encode_blocks<GG_INT8_QMAX, FB>, blocks, THREADS, st, src, res, n, p->block_elems, f16, nb,
				 dst);
	case GG_CODEC_INT4:
		return gg_launch(encode_blocks<GG_INT4_QMAX, FB>, blocks, THREADS, st, src, res, n, p->block_elems, f16, nb,
				 dst);
	}
	return cudaErrorInvalidValue;
}

template <bool ACC>
static cudaError_t enqueue_decode(const struct gg_codec_params *p, unsigned blocks, cudaStream_t st,
				  const uint8_t *src, size_t n, float *out)
{
	bool f16 = p->scale == GG_SCALE_F16;
	size_t nb = gg_codec_has_blocks(p->codec) ? block_count(n, p->block_elems) : 0;

	switch (p->codec) {
	case GG_CODEC_FP32:
		return gg_launch(decode_elems<GG_CODEC_FP32, ACC>, blocks, THREADS, st, src, n, out);
	case GG_CODEC_BF16:
		return gg_launch(decode_elems<GG_CODEC_BF16, ACC>, blocks, THREADS, st, src, n, out);
	case GG_CODEC_BF16_SPLIT:
		return gg_launch(decode_elems<GG_CODEC_BF16_SPLIT, ACC>, blocks, THREADS, st, src, n, out);
	case GG_CODEC_INT8:
		return gg_launch(decode_blocks<GG_INT8_QMAX, ACC>, blocks, THREADS, st, src, n, p->block_elems, f16, nb, out);
	case GG_CODEC_INT4:
		return gg_launch(decode_blocks<GG_INT4_QMAX, ACC>, blocks, THREADS, st, src, n, p->block_elems, f16, nb, out);
	}
	return cudaErrorInvalidValue;
}

#endif
