#include "crc32c.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void table_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
		table[0][i] = c;
	}
	for (uint32_t i = 0; i < 256; i++)
		for (int t = 1; t < 8; t++)
			table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
}

uint32_t gg_crc32c_ref(uint32_t crc, const void *data, size_t len)
{
	const uint8_t *p = data;

	pthread_once(&table_once, table_init);
	crc = ~crc;
	for (; len >= 8; len -= 8, p += 8) {
		uint64_t w;
		memcpy(&w, p, sizeof(w)); /* little-endian host (see codec_internal.h) */
		w ^= crc;
		crc = table[7][w & 0xff] ^ table[6][(w >> 8) & 0xff] ^ table[5][(w >> 16) & 0xff] ^
		      table[4][(w >> 24) & 0xff] ^ table[3][(w >> 32) & 0xff] ^ table[2][(w >> 40) & 0xff] ^
		      table[1][(w >> 48) & 0xff] ^ table[0][w >> 56];
	}
	while (len--)
		crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff];
	return ~crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const void *data, size_t len)
{
	const uint8_t *p = data;
	uint64_t c = ~crc;

	for (; len >= 8; len -= 8, p += 8) {
		uint64_t w;
		memcpy(&w, p, sizeof(w));
		c = _mm_crc32_u64(c, w);
	}
	uint32_t c32 = (uint32_t)c;
	while (len--)
		c32 = _mm_crc32_u8(c32, *p++);
	return ~c32;
}
#endif

uint32_t gg_crc32c(uint32_t crc, const void *data, size_t len)
{
#if defined(__x86_64__)
	static _Atomic int have_sse42 = -1;
	int have = atomic_load_explicit(&have_sse42, memory_order_relaxed);
	if (have < 0) {
		__builtin_cpu_init();
		have = __builtin_cpu_supports("sse4.2") != 0;
		atomic_store_explicit(&have_sse42, have, memory_order_relaxed);
	}
	if (have)
		return crc32c_sse42(crc, data, len);
#endif
	return gg_crc32c_ref(crc, data, len);
}
