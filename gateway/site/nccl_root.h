/* NCCL's bootstrap root, which ncclGetUniqueId() starts in the process that
 * calls it: a thread that waits in accept() on a listening socket until
 * every rank of the communicator has checked in, then ends. A communicator
 * given up before every rank joined (ranks that never came, a failed join)
 * leaves it waiting for good: a socket and a thread each time, in a
 * gateway that runs for months. NCCL has no call that ends it.
 *
 * These find that socket among the process's own, by the address the
 * unique id carries (an ncclUniqueId starts with the root's magic and its
 * socket address), and shut it down when the communicator is given up:
 * accept() fails, and NCCL's thread ends and closes the socket. A socket
 * is shut down only while it is the very one found (same inode) and still
 * listens; where none is found (an NCCL whose id says something else),
 * nothing is done. Not thread-safe: one thread calls them. */
#ifndef GG_NCCL_ROOT_H
#define GG_NCCL_ROOT_H

#include <stdbool.h>
#include <sys/types.h>

#define GG_NCCL_ROOT_ID_SIZE 128 /* bytes of an ncclUniqueId */
#define GG_NCCL_ROOTS_MAX 64     /* roots watched at once: the oldest goes first */

struct gg_nccl_roots {
	struct gg_nccl_root {
		bool used;
		unsigned char id[GG_NCCL_ROOT_ID_SIZE];
		int fd;
		dev_t dev;
		ino_t ino;
	} root[GG_NCCL_ROOTS_MAX];
	unsigned next; /* where the next one goes when all are used */
};

/* Finds the listening socket of the root that made `id` and watches it.
 * False when no socket of this process listens at the id's address. */
bool gg_nccl_root_watch(struct gg_nccl_roots *r, const unsigned char id[GG_NCCL_ROOT_ID_SIZE]);

/* The communicator of `id` is given up or up: a root that still waits is
 * made to stop (an ended one's socket is closed, and nothing is done), and
 * `id` is forgotten. Returns true when a waiting root was stopped. */
bool gg_nccl_root_end(struct gg_nccl_roots *r, const unsigned char id[GG_NCCL_ROOT_ID_SIZE]);

#endif
