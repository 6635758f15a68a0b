/* The hot path allocates nothing: after a warm-up, encoding and decoding
 * frames of every codec (zstd stage on, sizes and compressibility varying)
 * must not call malloc, calloc or realloc, zstd included. Counts calls by
 * interposing the allocator; skipped under sanitizers, which own it. */
#include "test_util.h"

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer) || __has_feature(thread_sanitizer)
#define UNDER_SANITIZER 1
#endif
#endif

#ifdef UNDER_SANITIZER
int main(void)
{
	printf("allocator interposition does not mix with sanitizers: skipped\n");
	return SKIP_EXIT;
}
#else
#include <dlfcn.h>

#include "frame.h"

void *malloc(size_t n);
void *calloc(size_t n, size_t size);
void *realloc(void *p, size_t n);

/* POSIX guarantees dlsym's object pointer converts to a function pointer;
 * memcpy says so without a pedantic warning. */
static void resolve(void *fn_ptr, size_t size, const char *name)
{
	void *sym = dlsym(RTLD_NEXT, name);
	CHECK(sym, "dlsym %s", name);
	memcpy(fn_ptr, &sym, size);
}

static long allocs;
static int armed;
static void *(*real_malloc)(size_t);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);

void *malloc(size_t n)
{
	if (!real_malloc)
		resolve(&real_malloc, sizeof(real_malloc), "malloc");
	allocs += armed;
	return real_malloc(n);
}

void *calloc(size_t n, size_t size)
{
	static _Alignas(16) char early[1024]; /* dlsym itself may calloc */
	static size_t used;
	static int resolving;
	if (!real_calloc) {
		if (resolving) {
			void *p = early + used;
			used += (n * size + 15) & ~(size_t)15;
			CHECK(used <= sizeof(early), "early calloc pool exhausted");
			return p;
		}
		resolving = 1;
		resolve(&real_calloc, sizeof(real_calloc), "calloc");
	}
	allocs += armed;
	return real_calloc(n, size);
}

void *realloc(void *p, size_t n)
{
	if (!real_realloc)
		resolve(&real_realloc, sizeof(real_realloc), "realloc");
	allocs += armed;
	return real_realloc(p, n);
}

#define N (256u << 10)

int main(void)
{
	static float x[N], out[N];
	static uint8_t frame[4 * N + GG_FRAME_HEADER_BYTES];
	struct rng r = { 8 };
	char err[256];

	for (int c = GG_CODEC_FIRST; c <= GG_CODEC_LAST; c++) {
		struct gg_frame_config cfg = { .codec = gg_codec_defaults((enum gg_codec)c), .zstd = true,
					       .zstd_level = 1, .max_elems = N };
		struct gg_frame_limits lim = { .max_elems = N, .max_raw_bytes = 4 * N };
		struct gg_frame_encoder enc;
		struct gg_frame_decoder dec;
		long before = 0;
		CHECK(gg_frame_encoder_init(&enc, &cfg) == 0 && gg_frame_decoder_init(&dec, &lim) == 0, "init");
		for (int it = 0; it < 120; it++) {
			size_t n = it % 7 == 0 ? N / 3 : N;
			fill_data(x, n, it % 3 ? DATA_GAUSSIAN : DATA_OUTLIERS, &r);
			if (it % 5 == 0) /* compressible for every codec */
				for (size_t i = 0; i < n; i++)
					x[i] = (float)(i % 16) * 0.125f;
			if (it == 20) {
				before = allocs;
				armed = 1;
			}
			size_t fb;
			CHECK(gg_frame_encode(&enc, x, n, frame, sizeof(frame), &fb) == 0, "encode");
			CHECK(gg_frame_decode(&dec, frame, fb, out, n, GG_FRAME_ACCUMULATE, NULL, err, sizeof(err)) == 0,
			      "%s", err);
		}
		armed = 0;
		CHECK(allocs == before, "%s: %ld allocations in 100 warm rounds", gg_codec_name(cfg.codec.codec),
		      allocs - before);
		gg_frame_encoder_fini(&enc);
		gg_frame_decoder_fini(&dec);
	}
	printf("no allocation on the frame hot path (5 codecs x 100 rounds)\n");
	return 0;
}
#endif
