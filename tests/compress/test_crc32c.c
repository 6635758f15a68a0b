/* CRC-32C: published check values, the hardware path against the table
 * path on every length up to 1 KiB and random splits (continuation). */
#include "crc32c.h"
#include "test_util.h"

int main(void)
{
	CHECK(gg_crc32c(0, "123456789", 9) == 0xe3069283u, "check value 0x%08x", gg_crc32c(0, "123456789", 9));
	CHECK(gg_crc32c_ref(0, "123456789", 9) == 0xe3069283u, "table check value");
	CHECK(gg_crc32c(0, NULL, 0) == 0, "empty");

	/* RFC 3720 B.4: 32 bytes of zeros, of 0xff, and ascending */
	uint8_t buf[32];
	memset(buf, 0, sizeof(buf));
	CHECK(gg_crc32c(0, buf, 32) == 0x8a9136aau, "zeros 0x%08x", gg_crc32c(0, buf, 32));
	memset(buf, 0xff, sizeof(buf));
	CHECK(gg_crc32c(0, buf, 32) == 0x62a8ab43u, "ones");
	for (int i = 0; i < 32; i++)
		buf[i] = (uint8_t)i;
	CHECK(gg_crc32c(0, buf, 32) == 0x46dd794eu, "ascending");

	struct rng r = { 7 };
	uint8_t data[1024 + 8];
	for (size_t i = 0; i < sizeof(data); i++)
		data[i] = (uint8_t)rng_next(&r);
	for (size_t len = 0; len <= 1024; len++) {
		for (size_t off = 0; off < 8; off += 3) {
			uint32_t a = gg_crc32c(0, data + off, len), b = gg_crc32c_ref(0, data + off, len);
			CHECK(a == b, "len %zu off %zu: 0x%08x vs table 0x%08x", len, off, a, b);
			size_t cut = len ? rng_next(&r) % len : 0;
			uint32_t c = gg_crc32c(gg_crc32c(0, data + off, cut), data + off + cut, len - cut);
			CHECK(c == a, "len %zu split at %zu: 0x%08x vs 0x%08x", len, cut, c, a);
		}
	}
	printf("crc32c: check values and hardware/table agreement hold\n");
	return 0;
}
