/* Human units for sizes ("4MiB", "64 KiB", "1500") and durations ("500ms",
 * "2s", "1m30s"). Sizes are bytes, binary (KiB = 1024) and decimal (kB =
 * 1000) suffixes both accepted; durations are stored as microseconds. */
#ifndef GG_UNITS_H
#define GG_UNITS_H

#include <stddef.h>
#include <stdint.h>

#include "gg_common.h"

/* Return 0, or -EINVAL (malformed: `why` says what) or -ERANGE (overflow). */
GG_MUST_CHECK int gg_parse_size(const char *text, uint64_t *bytes, const char **why);
GG_MUST_CHECK int gg_parse_duration(const char *text, uint64_t *usec, const char **why);

/* Shortest exact rendering that gg_parse_* reads back: "4MiB", "1500B",
 * "500ms", "2s". Returns `buf`. */
char *gg_format_size(uint64_t bytes, char *buf, size_t size);
char *gg_format_duration(uint64_t usec, char *buf, size_t size);
/* A time that went by, rounded down for people to read: "850us", "3ms",
 * "2.4s", "40s", "6m", "6m12s", "2h5m". Returns `buf`. */
char *gg_format_elapsed(uint64_t usec, char *buf, size_t size);

#endif
