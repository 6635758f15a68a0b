/* The peer protocol decoder on hostile bytes: a stream of messages as a
 * peer would send them, each header checked, each payload decoded. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[256];

	while (size >= GG_WIRE_HEADER_BYTES) {
		enum gg_wire_type type;
		size_t payload;
		if (gg_wire_parse_header(data, 1 << 20, &type, &payload, err, sizeof(err))) {
			if (!err[0] || strchr(err, '\n'))
				abort();
			return 0;
		}
		data += GG_WIRE_HEADER_BYTES;
		size -= GG_WIRE_HEADER_BYTES;
		if (payload > size)
			return 0;
		/* A copy of exactly the payload's size, so reading past it is caught. */
		uint8_t *copy = malloc(payload ? payload : 1);
		if (!copy)
			return 0;
		memcpy(copy, data, payload);
		struct gg_wire_msg msg;
		err[0] = '\0';
		if (gg_wire_decode(type, copy, payload, &msg, err, sizeof(err)) == 0) {
			if (type == GG_WIRE_DATA && (msg.u.data.frame < copy || msg.u.data.frame + msg.u.data.frame_bytes != copy + payload))
				abort();
			if (type == GG_WIRE_HELLO && (msg.u.hello.sites < 2 || msg.u.hello.sites > GG_AR_MAX_SITES))
				abort();
		} else if (!err[0] || strchr(err, '\n')) {
			abort();
		}
		free(copy);
		data += payload;
		size -= payload;
	}
	return 0;
}
