/* CRC-32C (Castagnoli, reflected polynomial 0x82f63b78), the checksum of
 * payload frames. SSE4.2 crc32 when the CPU has it, slicing-by-8 otherwise;
 * both give the same value. */
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

#endif
