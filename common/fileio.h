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

/* Whether only root and the user the process runs as can put something
 * else where `path` leads (a relative one from the working folder): every link on the path as written
 * must belong to one of them (its owner could point it elsewhere), and
 * every folder the path's entry is in, links resolved, up to /, must too,
 * and let nobody else write in it unless its sticky bit keeps them off
 * entries not their own (as /tmp's). The entry itself is the caller's to
 * judge; where the path does not exist yet, the deepest folder on it that
 * does stands for the rest. `consequence` ends the sentence ("could put
 * another socket in the gateway's place"). Returns 0, or a negative errno
 * (-EPERM: someone else could) with a sentence in `why` that names the
 * folder or link, and what to do. */
/* The consequence for a CA or CRL file: both its checks say it. */
#define GG_TRUST_PATH_CONSEQUENCE "could put another file in its place, and so choose whom this gateway trusts"
GG_MUST_CHECK int gg_path_guarded(const char *path, const char *consequence, char *why, size_t why_size);

#endif
