/* Small helpers shared by every layer. */
#ifndef GG_COMMON_H
#define GG_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" { /* cuda/ includes this from C++ */
#endif

#define GG_MUST_CHECK __attribute__((warn_unused_result))
#define GG_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#define GG_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define GG_MIN(a, b) ((a) < (b) ? (a) : (b))
#define GG_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Formats a one-line message into err (when err_size > 0) and returns
 * `code`, so error paths read: return gg_errf(err, size, -EINVAL, "...", ...). */
GG_PRINTF(4, 5) int gg_errf(char *err, size_t err_size, int code, const char *fmt, ...);

/* __FILE__ as the build gives it, relative to the build folder: for a
 * build folder inside the source tree (build/, as quickstart.sh makes),
 * the file's path in the source tree, for messages that name file:line. */
static inline const char *gg_source_path(const char *file)
{
	while (file[0] == '.' && file[1] == '.' && file[2] == '/')
		file += 3;
	return file;
}

/* A character a job name may hold (A-Z a-z 0-9 . _ -): ranks name jobs,
 * and gateways pass the names on to each other and into their logs. */
static inline bool gg_job_name_char_ok(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
	       c == '-';
}

/* 64-bit FNV-1a of n bytes, going on from h (GG_FNV1A_START to begin):
 * a hash both ends of a link compute alike, not one an attacker cannot
 * steer. */
#define GG_FNV1A_START 0xcbf29ce484222325ull
static inline uint64_t gg_fnv1a(uint64_t h, const void *p, size_t n)
{
	for (const unsigned char *c = (const unsigned char *)p; n--; c++)
		h = (h ^ *c) * 0x100000001b3ull;
	return h;
}

#ifdef __cplusplus
}
#endif

#endif
