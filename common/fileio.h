#ifndef GG_FILEIO_H
#define GG_FILEIO_H

#include <stddef.h>

#include "gg_common.h"

/* Reads a whole regular file of at most max_bytes into a NUL-terminated
 * malloc'd buffer (*len excludes the NUL; the caller frees *text).
 * Returns 0, -EFBIG when larger, or the negative errno of the failure. */
GG_MUST_CHECK int gg_read_small_file(const char *path, size_t max_bytes, char **text, size_t *len);

#endif
