/* NCCL's bootstrap root, which ncclGetUniqueId() starts in the process that
 * calls it: a thread that waits in accept() on a listening socket until
 * every rank of the communicator has checked in, then ends. A communicator
 * given up before every rank joined (ranks that never came, a failed join)
 * leaves it waiting for good: a socket and a thread each time, in a
 * gateway that runs for months. NCCL has no call that ends it.
 *
 * These find that socket among the process's own, by the address the
 * unique id carries (an ncclUniqueId starts with the root's magic and its
 * socket address), right after the id is made, and hold a duplicate of
 * it: shutting the duplicate down when the communicator is given up makes
 * NCCL's accept() fail, and its thread ends and closes its own. Holding
 * the socket itself, not its number, nothing else is ever shut down. Where
 * none is found (NCCL_COMM_ID set, which puts the root in rank 0, or an
 * NCCL whose id says something else), nothing is watched. Not
 * thread-safe: one thread calls them. */
#ifndef GG_NCCL_ROOT_H
#define GG_NCCL_ROOT_H

#include <stdbool.h>

#define GG_NCCL_ROOT_ID_SIZE 128 /* bytes of an ncclUniqueId */

struct gg_nccl_roots {
	struct gg_nccl_root {
		unsigned char id[GG_NCCL_ROOT_ID_SIZE];
		int fd; /* our duplicate of the root's listening socket */
	} *root;
	unsigned count, cap;
};

/* Finds the listening socket of the root that just made `id` and watches
 * it (one entry per communicator being joined). False when NCCL_COMM_ID is
 * set, no socket of this process listens at the id's address, or memory
 * or descriptors ran out. */
bool gg_nccl_root_watch(struct gg_nccl_roots *r, const unsigned char id[GG_NCCL_ROOT_ID_SIZE]);

/* The communicator of `id` is up (its root ended by itself) or given up:
 * a root's socket that still listens is shut down, which ends a root that
 * still waits, and `id` is forgotten. Returns true when a listening socket
 * was shut down. */
bool gg_nccl_root_end(struct gg_nccl_roots *r, const unsigned char id[GG_NCCL_ROOT_ID_SIZE]);

/* Forgets every root (their sockets left as they are) and frees the table. */
void gg_nccl_roots_free(struct gg_nccl_roots *r);

#endif
