/* Writes one seed per message type for the wire fuzz target:
 * gen-wire-corpus DIR */
#include <stdio.h>
#include <string.h>

#include "wire.h"

static int failed;

static void put(const char *dir, const char *name, const uint8_t *buf, size_t len)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "wb");
	if (!f || fwrite(buf, 1, len, f) != len || fclose(f)) {
		perror(path);
		failed = 1;
	}
}

int main(int argc, char **argv)
{
	uint8_t buf[4096];
	ssize_t n;

	if (argc != 2) {
		fprintf(stderr, "usage: %s DIR\n", argv[0]);
		return 2;
	}
	struct gg_wire_hello h = { .stream_index = 1, .streams = 2, .instance_id = 99, .sites = 3, .codec = 3,
				   .block_elems = 0, .algorithm = 1, .chunk_elems = 262144, .zstd = 1,
				   .inflight_bytes = 256u << 20 };
	strcpy(h.site_names[0], "site-a");
	strcpy(h.site_names[1], "site-b");
	strcpy(h.site_names[2], "site-c");
	if ((n = gg_wire_encode_hello(buf, sizeof(buf), &h)) > 0)
		put(argv[1], "hello", buf, (size_t)n);
	struct gg_wire_step st = { .job = "train", .run = 17, .step = 3, .count = 1000, .tensor_id = 1, .dtype = GG_WIRE_F32 };
	struct gg_ar_chunk_id id = { GG_AR_SCATTER, 1, 2 };
	if ((n = gg_wire_encode_data_head(buf, sizeof(buf), &st, &id, 8)) > 0) {
		memcpy(buf + n, "GGF1data", 8);
		put(argv[1], "data", buf, (size_t)n + 8);
	}
	if ((n = gg_wire_encode_ack(buf, sizeof(buf), "train", 17, 3, &id)) > 0)
		put(argv[1], "ack", buf, (size_t)n);
	if ((n = gg_wire_encode_ping(buf, sizeof(buf), GG_WIRE_PING, 12345)) > 0)
		put(argv[1], "ping", buf, (size_t)n);
	if ((n = gg_wire_encode_abort(buf, sizeof(buf), "train", 17, 3, 3, 11, "site site-b: rank 1 left")) > 0)
		put(argv[1], "abort", buf, (size_t)n);
	if ((n = gg_wire_encode_done(buf, sizeof(buf), "train", 17, 3, &(struct gg_wire_links){ .uplink_bytes_per_s = 125000000, .rtt_us = 20000 },
				       &(struct gg_wire_plan){ .has_plan = true, .direct_max = 4194304,
							       .links = { .uplink_bytes_per_s = 110000000, .rtt_us = 40000 } })) > 0)
		put(argv[1], "done", buf, (size_t)n);
	if ((n = gg_wire_encode_completed(buf, sizeof(buf), "train", 17, 3, NULL, NULL)) > 0)
		put(argv[1], "completed", buf, (size_t)n);
	if ((n = gg_wire_encode_done_asking(buf, sizeof(buf), "train", 17, 3, NULL, NULL)) > 0)
		put(argv[1], "asking", buf, (size_t)n);
	if ((n = gg_wire_encode_end(buf, sizeof(buf), "train", 17, 3, 5, 12, "site site-c is unreachable", 1500)) > 0)
		put(argv[1], "end", buf, (size_t)n);
	return failed;
}
