/* Peer addresses looked up off the event loops. A host name's lookup takes
 * as long as the system's resolver lets it: seconds when a name server does
 * not answer. A loop that waited for it would send no heartbeat and move
 * no data meanwhile, to any peer, and the other sites would give this one
 * up. So a dial asks here: a numeric address is parsed at once, and a
 * name is looked up on a thread of its own while the dial waits its turn.
 *
 * Answers are kept per address text. An address found is used for
 * GG_RESOLVE_KEEP_US, and after that while a new lookup runs, which
 * replaces it if it finds one (so a peer that moved is dialed at its new
 * address from then on) and leaves it if it fails. A name not found is
 * reported for GG_RESOLVE_FAIL_KEEP_US, so that every stream dialing that
 * peer learns of it, and the next ask after that looks again. At most one
 * lookup per address runs at a time, and the table holds
 * GG_RESOLVE_ENTRIES addresses, so the threads are bounded too.
 * Thread-safe: the lanes of a gateway share one. */
#ifndef GG_RESOLVER_H
#define GG_RESOLVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "gg_common.h"

#define GG_RESOLVE_KEEP_US 30000000u
#define GG_RESOLVE_FAIL_KEEP_US 1000000u
#define GG_RESOLVE_ENTRIES 16u
/* How soon a dial whose address is being looked up asks again. */
#define GG_RESOLVE_POLL_US 20000u

struct gg_resolver;

/* Returns 0, or -ENOMEM. */
GG_MUST_CHECK int gg_resolver_new(struct gg_resolver **out);
/* Frees it at once; lookups still running end on their own and drop
 * their answers. NULL is fine. */
void gg_resolver_free(struct gg_resolver *r);

/* The socket address of "host:port" or "[v6addr]:port" now. Returns 0 with
 * *out and *len set; -EAGAIN while the name's lookup runs, or while every
 * entry of the table has one running (ask again later:
 * GG_RESOLVE_POLL_US); -EINVAL for text that is not an address, or a name
 * the latest lookup did not find; or the negative errno of a lookup that
 * could not start. Every error but -EAGAIN comes with a sentence in `why`,
 * and *first says whether this is the first call given it (a lookup's
 * failure reaches every caller for a while, and is worth one log line). */
GG_MUST_CHECK int gg_resolver_get(struct gg_resolver *r, const char *text, struct sockaddr_storage *out,
				  socklen_t *len, char *why, size_t why_size, bool *first);

/* Lookups started and still running, since the resolver was made (tests). */
void gg_resolver_counts(struct gg_resolver *r, uint64_t *started, unsigned *running);

#endif
