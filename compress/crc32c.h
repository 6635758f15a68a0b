/* CRC-32C (Castagnoli, reflected polynomial 0x82f63b78), the checksum of
 * payload frames. On x86-64 the fastest of: AVX-512 VPCLMULQDQ folding,
 * three interleaved SSE4.2 crc32 streams joined by PCLMULQDQ, a single
 * SSE4.2 crc32 chain; slicing-by-8 tables otherwise. All give the same
 * value. */
#ifndef GG_CRC32C_H
#define GG_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Standard CRC-32C of data (init and final xor 0xffffffff) continued from
 * `crc`: pass 0 to start, the previous result to continue. gg_crc32c(0,
 * "123456789", 9) == 0xe3069283. */
uint32_t gg_crc32c(uint32_t crc, const void *data, size_t len);
/* The table implementation, for tests. */
uint32_t gg_crc32c_ref(uint32_t crc, const void *data, size_t len);

/* One implementation of gg_crc32c (same contract), for tests and benchmarks. */
struct gg_crc32c_impl {
	const char *name;
	uint32_t (*fn)(uint32_t crc, const void *data, size_t len);
};

/* The implementations this CPU can run, slowest first (the table one is
 * always there); gg_crc32c uses the last. Points *impls at them and returns
 * how many there are. */
size_t gg_crc32c_impls(const struct gg_crc32c_impl **impls);

#endif
