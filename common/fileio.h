#ifndef GG_FILEIO_H
#define GG_FILEIO_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "gg_common.h"

/* How long a named pipe may take to be written to. */
#define GG_PIPE_WAIT_MS 10000

/* Reads a whole file of at most max_bytes into a NUL-terminated malloc'd
 * buffer (*len excludes the NUL; the caller frees *text); a pipe too,
 * to its end. Returns 0, -EFBIG when larger, -ETIMEDOUT for a pipe nothing
 * was written to within GG_PIPE_WAIT_MS, or the negative errno of the
 * failure. */
GG_MUST_CHECK int gg_read_small_file(const char *path, size_t max_bytes, char **text, size_t *len);

/* The name of user `uid` in buf, true; or where it has none, its number,
 * false. */
bool gg_user_name(uid_t uid, char *buf, size_t size);

/* A file of the gateway's key, CA or CRL says how it proves itself or whom
 * it trusts, and whoever owns it may replace it: only root or the user the
 * process runs as may. For one that `owner` owns, NULL where that may be;
 * else why not and what to do, as the rest of a sentence that starts with
 * the file ("... belongs to user gradgate (uid 999), ..."), in buf. */
const char *gg_owner_refusal(uid_t owner, const char *path, char *buf, size_t size);

#endif
