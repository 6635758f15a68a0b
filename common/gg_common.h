/* Small helpers shared by every layer. */
#ifndef GG_COMMON_H
#define GG_COMMON_H

#include <stddef.h>

#define GG_MUST_CHECK __attribute__((warn_unused_result))
#define GG_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#define GG_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define GG_MIN(a, b) ((a) < (b) ? (a) : (b))
#define GG_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif
