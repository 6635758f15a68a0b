#ifndef GG_FILEIO_H
#define GG_FILEIO_H

#include <stddef.h>

#include "gg_common.h"

/* How long a named pipe may take to be written to. */
#define GG_PIPE_WAIT_MS 10000

/* Reads a whole file of at most max_bytes into a NUL-terminated malloc'd
 * buffer (*len excludes the NUL; the caller frees *text); a pipe too,
 * to its end. Returns 0, -EFBIG when larger, -ETIMEDOUT for a pipe nothing
 * was written to within GG_PIPE_WAIT_MS, or the negative errno of the
 * failure. */
GG_MUST_CHECK int gg_read_small_file(const char *path, size_t max_bytes, char **text, size_t *len);

#endif
